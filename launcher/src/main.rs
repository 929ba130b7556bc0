//! `launcher` — the rlmesh command line.
//!
//! Running: `up`, `submit`, `k8s`, `plan`, `status`, `down`, `monitor`, `report`. Inspecting (JSON in, JSON
//! out): `score`, `render`, `chat`, `advantages`, `reward`. Serving: `serve`. Measuring: `bench`.
//! Every subcommand prints a clear error and exits non-zero on bad input
//! (2 for usage and config errors).
use clap::{Parser, Subcommand};
use std::process::ExitCode;

mod cmd;
mod error;
mod repo;


#[derive(Parser)]
#[command(name = "launcher", version, about = "rlmesh: distributed RL for tool-calling LLM agents")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start a run on a topology (the embedded CPU default: deploy/local.toml).
    Up(cmd::up::UpArgs),
    /// Write the sbatch script of a run and submit it (`--dry-run`: print it).
    Submit(cmd::submit::SubmitArgs),
    /// Kubernetes manifests of a run: a StatefulSet and headless Service per process kind, the plan in a ConfigMap, the cookie in a Secret.
    K8s(cmd::k8s::K8sArgs),
    /// The placement of a topology file: every process, host, device, role, rank, port and environment.
    Plan(cmd::plan::PlanArgs),
    /// Live state of a run: processes, step, policy version, throughput, staleness.
    Status(cmd::status::RunDirArgs),
    /// Stop a run cleanly: SIGTERM (the job checkpoints), then wait up to 60 s.
    Down(cmd::status::RunDirArgs),
    /// A local Prometheus scraping every process of a run (RUN_DIR/prometheus/prometheus.yml).
    Monitor(cmd::monitor::MonitorArgs),
    /// Summary table and PNG plots of a run; two runs side by side.
    Report(cmd::report::ReportArgs),
    /// Per-token log-probs of token sequences (JSONL in: {"token_ids": [...]}; out: {"logprobs": [...]}).
    Score(cmd::inspect::ScoreArgs),
    /// Render a conversation with the model's chat template (JSON in; out: {"text", "token_ids"}).
    Render(cmd::inspect::RenderArgs),
    /// Chat with a model (runs the tool loop with --tools).
    Chat(cmd::chat::ChatArgs),
    /// Compute advantages offline (JSON in, JSON out).
    Advantages(cmd::inspect::AdvantagesArgs),
    /// Score completions offline (JSONL in, JSONL out).
    Reward(cmd::inspect::RewardArgs),
    /// An OpenAI-compatible endpoint on a model directory (chat and text completions, tools, log-probs, streaming).
    Serve(cmd::serve::ServeArgs),
    /// Benchmarks, each printing the ratio against its peer measured in the same run.
    Bench(cmd::bench::BenchArgs),
    /// One process of a distributed run, started by `up` (its place comes from the plan's RLMESH_* environment).
    Node(cmd::up::NodeArgs),
    /// Internal: one learner rank for `bench learner --shard` (a job file, --rank, --world, --addr).
    #[command(hide = true, disable_help_flag = true)]
    LearnerRank {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Internal: one collective rank for `bench allreduce` (rlmesh_comm's worker flags).
    #[command(hide = true, disable_help_flag = true)]
    CommWorker {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

fn main() -> ExitCode {
    // Like other command-line tools, end quietly when the reader of our output goes
    // away (`launcher report … | head`) instead of panicking on a broken pipe: Rust
    // ignores SIGPIPE by default, so restore the default action.
    // SAFETY: called first thing in main, before any thread exists.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    // Large per-step temporaries stay in the heap instead of being unmapped and faulted in again.
    rlmesh_actors::learner::retain_freed_memory();
    let cli = Cli::parse();
    if let Err(e) = rlmesh_model::isa::check_env() {
        eprintln!("error: {e}");
        return ExitCode::from(2);
    }
    let result = match cli.command {
        Command::Up(a) => cmd::up::up(a),
        Command::Submit(a) => cmd::submit::submit(a),
        Command::K8s(a) => cmd::k8s::run(a),
        Command::Plan(a) => cmd::plan::run(a),
        Command::Status(a) => cmd::status::status(a),
        Command::Down(a) => cmd::status::down(a),
        Command::Monitor(a) => cmd::monitor::run(a),
        Command::Report(a) => cmd::report::run(a),
        Command::Node(a) => cmd::up::node(a),
        Command::CommWorker { args } => return rlmesh_comm::worker_main(args),
        Command::LearnerRank { args } => return rlmesh_actors::learner::rank::rank_main(args),
        Command::Score(a) => cmd::inspect::score(a),
        Command::Render(a) => cmd::inspect::render(a),
        Command::Chat(a) => cmd::chat::run(a),
        Command::Advantages(a) => cmd::inspect::advantages(a),
        Command::Reward(a) => cmd::inspect::reward(a),
        Command::Bench(a) => cmd::bench::run(a),
        Command::Serve(a) => cmd::serve::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(e.exit_code())
        }
    }
}
