//! Topology and recipe files: the committed ones parse and plan as intended;
//! bad ones give errors naming the file, line and field.
use rlmesh_actors::controller::plan::{plan, Backend, Plan, WeightTransport};
use rlmesh_actors::controller::recipe::{EstimatorKind, Recipe, RewardKind};
use rlmesh_actors::controller::staleness::Mode;
use rlmesh_actors::controller::topology::{Device, Role, Topology};
use std::collections::HashSet;
use std::path::PathBuf;

fn repo(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo(path)).unwrap()
}

/// 1-based line of the first line containing `needle`.
fn line(text: &str, needle: &str) -> usize {
    text.lines().position(|l| l.contains(needle)).unwrap_or_else(|| panic!("{needle:?} not in text")) + 1
}

/// Replaces `from` (which must occur) by `to`.
fn edit(text: &str, from: &str, to: &str) -> String {
    assert!(text.contains(from), "{from:?} not in text");
    text.replacen(from, to, 1)
}

fn topology_error(text: &str) -> String {
    Topology::parse("deploy/bad.toml", text).unwrap_err().to_string()
}

fn recipe_error(text: &str) -> String {
    Recipe::parse("configs/bad.toml", text).unwrap_err().to_string()
}

fn env<'a>(plan: &'a Plan, process: &str, key: &str) -> &'a str {
    let p = plan.processes.iter().find(|p| p.name == process).unwrap_or_else(|| panic!("no process {process}"));
    p.env.get(key).unwrap_or_else(|| panic!("{process} has no {key}"))
}

#[test]
fn local_topology_puts_every_actor_in_one_cpu_process() {
    let t = Topology::load(&repo("deploy/local.toml")).unwrap();
    let p = plan(&t);
    assert_eq!(p.processes.len(), 1);
    let main = &p.processes[0];
    assert_eq!(main.name, "local/main");
    let roles: Vec<Role> = main.actors.iter().map(|a| a.role).collect();
    assert_eq!(roles, [Role::Controller, Role::Rollout, Role::Reward, Role::Learner, Role::WeightSync]);
    assert!(main.actors.iter().all(|a| a.device == Device::Cpu));
    assert_eq!((main.ports.control, main.ports.data, main.ports.metrics), (29500, 29600, 9100));
    assert_eq!(p.learner_backend, Backend::Cpu);
    assert_eq!(p.weight_transport, WeightTransport::DataPlane);
    assert_eq!(env(&p, "local/main", "CUDA_VISIBLE_DEVICES"), "");
    assert_eq!(env(&p, "local/main", "RLMESH_RANK"), "0");
    assert_eq!(env(&p, "local/main", "RLMESH_WORLD_SIZE"), "1");
    assert_eq!(env(&p, "local/main", "RLMESH_MASTER_ADDR"), "127.0.0.1");
    assert_eq!(env(&p, "local/main", "RLMESH_CONTROLLER_ADDR"), "127.0.0.1:29500");
}

#[test]
fn dev_2gpu_topology_generates_on_gpu0_and_trains_on_gpu1() {
    let t = Topology::load(&repo("deploy/dev-2gpu.toml")).unwrap();
    let p = plan(&t);
    let names: Vec<&str> = p.processes.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["dev/main", "dev/rollout-0", "dev/learner-0"]);
    let rollout = &p.processes[1];
    assert_eq!(rollout.actors.len(), 1);
    assert_eq!((rollout.actors[0].role, rollout.actors[0].device), (Role::Rollout, Device::Gpu(0)));
    let learner = &p.processes[2];
    assert_eq!((learner.actors[0].role, learner.actors[0].device), (Role::Learner, Device::Gpu(1)));
    assert_eq!(env(&p, "dev/rollout-0", "CUDA_VISIBLE_DEVICES"), "0");
    assert_eq!(env(&p, "dev/learner-0", "CUDA_VISIBLE_DEVICES"), "1");
    assert_eq!(env(&p, "dev/main", "CUDA_VISIBLE_DEVICES"), "");
    assert!(!p.processes[1].env.contains_key("RLMESH_RANK"), "only learners get a data-parallel rank");
    // Reward actors run on the CPU inside the controller's process.
    assert_eq!(p.processes[0].actors.iter().filter(|a| a.role == Role::Reward && a.device == Device::Cpu).count(), 2);
    let controls: Vec<u16> = p.processes.iter().map(|p| p.ports.control).collect();
    assert_eq!(controls, [29500, 29501, 29502]);
    // Learner rank 0 and the rollout actor on GPUs, each in its own process: weights go by NCCL.
    assert_eq!((p.learner_backend, p.weight_transport), (Backend::Nccl, WeightTransport::Nccl));
    assert!(p.processes.iter().all(|pr| !pr.env.contains_key("NCCL_HOSTID")), "one GPU per process: NCCL sees the real host");
    // With --device cpu (the topology moved to the CPU) both are the CPU's.
    let cpu = plan(&t.on_cpu());
    assert_eq!((cpu.learner_backend, cpu.weight_transport), (Backend::Cpu, WeightTransport::DataPlane));
}

#[test]
fn h100x32_topology_places_16_rollout_gpus_16_learner_ranks_and_cpu_rewards() {
    let t = Topology::load(&repo("deploy/h100x32.toml")).unwrap();
    let p = plan(&t);
    assert_eq!(p.processes.len(), 1 + 16 + 2 + 16);
    let actors: Vec<(&str, &rlmesh_actors::controller::plan::Actor)> =
        p.processes.iter().flat_map(|pr| pr.actors.iter().map(move |a| (pr.node.as_str(), a))).collect();
    let of = |role: Role| actors.iter().filter(move |(_, a)| a.role == role);

    let rollout_gpus: HashSet<(&str, Device)> = of(Role::Rollout).map(|(n, a)| (*n, a.device)).collect();
    assert_eq!(rollout_gpus.len(), 16);
    assert!(rollout_gpus.iter().all(|(n, d)| ["n0", "n1"].contains(n) && *d != Device::Cpu));

    let learner_gpus: HashSet<(&str, Device)> = of(Role::Learner).map(|(n, a)| (*n, a.device)).collect();
    assert_eq!(learner_gpus.len(), 16);
    assert!(learner_gpus.iter().all(|(n, _)| ["n2", "n3"].contains(n)));
    let mut ranks: Vec<u32> = of(Role::Learner).map(|(_, a)| a.rank).collect();
    ranks.sort_unstable();
    assert_eq!(ranks, (0..16).collect::<Vec<_>>());
    assert_eq!(p.world_size, 16);

    assert_eq!(of(Role::Reward).count(), 16);
    assert!(of(Role::Reward).all(|(_, a)| a.device == Device::Cpu));

    // One GPU and one rank per learner process, rank 0 on n2 is the master.
    for pr in p.processes_with(Role::Learner) {
        let a = &pr.actors[0];
        assert_eq!(pr.actors.len(), 1);
        let Device::Gpu(g) = a.device else { panic!("learner on CPU") };
        assert_eq!(pr.env["CUDA_VISIBLE_DEVICES"], g.to_string());
        assert_eq!(pr.env["RLMESH_RANK"], a.rank.to_string());
        assert_eq!(pr.env["RLMESH_WORLD_SIZE"], "16");
        assert_eq!(pr.env["RLMESH_MASTER_ADDR"], "10.0.0.12");
        assert_eq!(pr.env["RLMESH_MASTER_PORT"], "29400");
        assert_eq!(pr.env["RLMESH_DIST_BACKEND"], "nccl");
    }
    assert_eq!(p.master, "10.0.0.12:29400");
    assert_eq!(p.weight_transport, WeightTransport::Nccl);
    assert_eq!(p.controller, "10.0.0.10:29500");

    // Ports are unique per host.
    let mut seen = HashSet::new();
    for pr in &p.processes {
        for port in [pr.ports.control, pr.ports.data, pr.ports.metrics] {
            assert!(seen.insert((pr.host.clone(), port)), "{} reuses port {port}", pr.name);
        }
    }

    // JSON round trip and table.
    let json = serde_json::to_string(&p).unwrap();
    assert_eq!(serde_json::from_str::<Plan>(&json).unwrap(), p);
    let table = p.table();
    assert!(table.starts_with("topology h100x32: 4 node(s), 35 process(es), learner world size 16 (nccl backend"), "{table}");
    assert_eq!(table.lines().count(), 2 + 1 + 16 + 16 + 16 + 1, "summary, header, one row per actor");
    assert!(table.lines().any(|l| l.split_whitespace().collect::<Vec<_>>() == ["n2/learner-0", "10.0.0.12", "learner", "0", "gpu:0", "29500", "29600", "9100"]), "{table}");
}

#[test]
fn topology_ranks_that_do_not_match_the_devices_are_refused_at_the_ranks_line() {
    let text = edit(&read("deploy/h100x32.toml"), "ranks = 16", "ranks = 20");
    assert_eq!(
        topology_error(&text),
        format!(
            "deploy/bad.toml:{}: field \"learner.ranks\": 20 ranks need 20 learner devices, the placement gives 16 (node \"n2\": 8, node \"n3\": 8)",
            line(&text, "ranks = 20")
        )
    );
}

#[test]
fn topology_gpu_beyond_the_node_is_refused_with_its_placement_field() {
    let text = edit(&read("deploy/dev-2gpu.toml"), "gpus = [1] }", "gpus = [2] }");
    assert_eq!(
        topology_error(&text),
        format!(
            "deploy/bad.toml:{}: field \"learner.placement[0].gpus\": GPU 2 is beyond node \"dev\", which has 2 (0..=1)",
            line(&text, "gpus = [2]")
        )
    );
    let text = edit(&read("deploy/local.toml"), "actors = 1, process = \"main\" }]\n\n[reward]", "gpus = [0] }]\n\n[reward]");
    assert!(topology_error(&text).ends_with("field \"rollout.placement[0].gpus\": GPU 0 is beyond node \"local\", which has no GPUs"));
}

#[test]
fn topology_gpu_used_by_two_actors_is_refused() {
    let text = edit(&read("deploy/dev-2gpu.toml"), "gpus = [1] }", "gpus = [0] }");
    assert_eq!(
        topology_error(&text),
        format!(
            "deploy/bad.toml:{}: field \"learner.placement[0].gpus\": GPU 0 of node \"dev\" is already used by rollout.placement[0] \
             (set share_gpus = true on the node to let a rollout and a learner share it)",
            line(&text, "ranks = 1") + 1
        )
    );
}

#[test]
fn share_gpus_lets_roles_share_a_gpu_but_not_two_learner_ranks() {
    // deploy/dev-1gpu.toml: the rollout process and the learner on GPU 0, each in its own process.
    let t = Topology::load(&repo("deploy/dev-1gpu.toml")).unwrap();
    let p = plan(&t);
    let (rollout, learner) = (p.processes_with(Role::Rollout).next().unwrap(), p.processes_with(Role::Learner).next().unwrap());
    assert_ne!(rollout.name, learner.name);
    for (pr, role) in [(rollout, Role::Rollout), (learner, Role::Learner)] {
        assert_eq!(pr.env["CUDA_VISIBLE_DEVICES"], "0");
        assert_eq!(pr.cuda_ordinal(role), Some(0));
    }
    let main = p.processes.iter().find(|pr| pr.name == "dev/main").unwrap();
    assert_eq!((main.cuda_ordinal(Role::Reward), main.env["CUDA_VISIBLE_DEVICES"].as_str()), (None, ""));
    // Weights by NCCL between the two GPU processes, each with its own NCCL host id
    // (NCCL refuses two ranks of one communicator on one GPU of one host); not the CPU process.
    assert_eq!(p.weight_transport, WeightTransport::Nccl);
    assert_eq!((rollout.env["NCCL_HOSTID"].as_str(), learner.env["NCCL_HOSTID"].as_str()), (rollout.name.as_str(), learner.name.as_str()));
    assert!(!main.env.contains_key("NCCL_HOSTID"));
    // Two learner ranks may not share a GPU, even with share_gpus: NCCL refuses two ranks on one device.
    let text = edit(&read("deploy/dev-1gpu.toml"), "ranks = 1\nplacement = [{ node = \"dev\", gpus = [0] }]", "ranks = 2\nplacement = [{ node = \"dev\", gpus = [0] }, { node = \"dev\", gpus = [0] }]");
    assert!(
        topology_error(&text).ends_with("field \"learner.placement[1].gpus\": GPU 0 of node \"dev\" is already used by learner.placement[0] (share_gpus lets different roles share a GPU, not two actors of one role)"),
        "{}",
        topology_error(&text)
    );
}

#[test]
fn a_gpu_actor_s_cuda_ordinal_is_its_place_in_the_process_s_visible_devices() {
    // h100x32: every GPU process sees its own GPU as device 0.
    let t = Topology::load(&repo("deploy/h100x32.toml")).unwrap();
    let p = plan(&t);
    for pr in p.processes_with(Role::Learner).chain(p.processes_with(Role::Rollout)) {
        let role = if pr.roles.contains(&Role::Learner) { Role::Learner } else { Role::Rollout };
        assert_eq!(pr.cuda_ordinal(role), Some(0), "{}", pr.name);
        assert_eq!(pr.env["CUDA_VISIBLE_DEVICES"].split(',').count(), 1, "{}", pr.name);
    }
}

#[test]
fn topology_overlapping_ports_are_refused() {
    // Three processes on the host: control uses 29500..=29502, so data at 29502 collides.
    let text = edit(&read("deploy/dev-2gpu.toml"), "data = 29600", "data = 29502");
    assert_eq!(
        topology_error(&text),
        format!(
            "deploy/bad.toml:{}: field \"ports.data\": ports 29502..=29504 on host \"127.0.0.1\" overlap ports.control (29500..=29502)",
            line(&text, "data = 29502")
        )
    );
    let text = edit(&read("deploy/dev-2gpu.toml"), "master = 29400", "master = 9101");
    assert!(topology_error(&text).contains("field \"ports.master\": ports 9101..=9102 on host \"127.0.0.1\" overlap ports.metrics (9100..=9102)"));
}

#[test]
fn topology_unknown_fields_nodes_types_and_syntax_are_located() {
    let base = read("deploy/dev-2gpu.toml");

    let text = edit(&base, "ranks = 1", "rank = 1");
    let err = topology_error(&text);
    assert!(err.starts_with(&format!("deploy/bad.toml:{}: field \"learner.rank\": unknown field `rank`", line(&text, "rank = 1"))), "{err}");

    let text = edit(&base, "[controller]\nnode = \"dev\"", "[controller]\nnode = \"dev9\"");
    assert_eq!(
        topology_error(&text),
        format!("deploy/bad.toml:{}: field \"controller.node\": unknown node \"dev9\" (nodes: dev)", line(&text, "\"dev9\""))
    );

    let text = edit(&base, "gpus = 2", "gpus = \"two\"");
    let err = topology_error(&text);
    assert!(err.starts_with(&format!("deploy/bad.toml:{}: field \"nodes[0].gpus\": invalid type: string \"two\"", line(&text, "\"two\""))), "{err}");

    let text = edit(&base, "host = \"127.0.0.1\"\n", "");
    let err = topology_error(&text);
    assert_eq!(err, format!("deploy/bad.toml:{}: field \"nodes[0].host\": required field is missing", line(&text, "[[nodes]]")));

    let text = edit(&base, "placement = [{ node = \"dev\", gpus = [0] }]", "placement = [{ node = \"dev\", gpus = [0], tp = 2 }]");
    let err = topology_error(&text);
    assert!(err.starts_with(&format!("deploy/bad.toml:{}: field \"rollout.placement[0].tp\": unknown field `tp`", line(&text, "tp = 2"))), "{err}");

    let text = edit(&base, "metrics = 9100", "metrics = ");
    let err = topology_error(&text);
    assert!(err.starts_with(&format!("deploy/bad.toml:{}: ", line(&text, "metrics = "))), "{err}");
}

#[test]
fn topology_missing_file_names_the_file() {
    let err = Topology::load(&repo("deploy/no-such.toml")).unwrap_err().to_string();
    assert!(err.contains("deploy/no-such.toml: "), "{err}");
}

#[test]
fn recipes_differ_only_in_the_reward() {
    let process = Recipe::load(&repo("configs/calculator-process.toml")).unwrap();
    let final_only = Recipe::load(&repo("configs/calculator-final-only.toml")).unwrap();
    assert_eq!(process.name, "calculator-process");
    assert_eq!(final_only.name, "calculator-final-only");
    assert_eq!((process.reward, final_only.reward), (RewardKind::Process, RewardKind::FinalOnly));
    let same = Recipe { name: process.name.clone(), reward: process.reward, ..final_only.clone() };
    assert_eq!(same, process);

    assert!(process.tiny_model());
    assert_eq!(process.estimator.name, EstimatorKind::Grpo);
    assert_eq!(process.mode(), Mode::OneStepOff);
    assert!(process.tasks.held_out_count() >= 100);
    let (train, held_out) = process.tasks().unwrap();
    assert_eq!((train.len(), held_out.len()), (process.tasks.size(), process.tasks.held_out_count()));
    let train_prompts: HashSet<&str> = train.iter().map(|t| t.prompt.as_str()).collect();
    assert!(held_out.iter().all(|t| !train_prompts.contains(t.prompt.as_str())), "held-out tasks are never trained on");
    assert!(held_out.iter().any(|t| t.requires_tool) && held_out.iter().any(|t| !t.requires_tool));

    // Drill words change the warm-up's pool only: the RL and held-out tasks stay
    // the same, and the pool copies words in the one-word template that the
    // held-out set never shows it.
    assert!(process.sft.drill_words);
    let plain = Recipe { sft: rlmesh_actors::controller::recipe::Sft { drill_words: false, ..process.sft.clone() }, ..process.clone() };
    assert_eq!(plain.tasks().unwrap(), (train.clone(), held_out.clone()));
    let one_word = |pool: &[rlmesh_core::Task]| -> HashSet<String> {
        pool.iter().filter(|t| t.prompt.starts_with("Repeat this word back")).map(|t| t.prompt.clone()).collect()
    };
    let (pool, plain_pool) = (process.sft_tasks(&held_out).unwrap(), plain.sft_tasks(&held_out).unwrap());
    let held: HashSet<&str> = held_out.iter().map(|t| t.prompt.as_str()).collect();
    assert!(pool.iter().all(|t| !held.contains(t.prompt.as_str())), "the pool never holds a held-out task");
    assert!(one_word(&plain_pool).len() <= 30 && one_word(&pool).len() > 250, "{} and {}", one_word(&plain_pool).len(), one_word(&pool).len());
}

#[test]
fn recipe_defaults_fill_everything_but_the_reward_and_task_count() {
    let r = Recipe::parse("configs/mini.toml", "reward = \"process\"\n[tasks]\nsize = 10\n").unwrap();
    assert_eq!(r.name, "mini");
    assert_eq!(r.tools, ["calculator"]);
    assert_eq!(r.model.path, "tiny");
    assert_eq!((r.tasks.held_out_count(), r.tasks.tool_fraction), (200, 0.5));
    assert_eq!((r.rl.group_size, r.rl.groups_per_step, r.rl.max_turns), (8, 8, 4));
    assert_eq!(r.mode(), Mode::OneStepOff);
    assert_eq!(r.sft.steps, 0);
    let r = Recipe::parse("x.toml", "reward = \"final_only\"\n[tasks]\nsize = 10\n[rl]\nmode = \"async\"\nmax_staleness = 3\n").unwrap();
    assert_eq!(r.mode(), Mode::Async { max_staleness: 3 });
    let r = Recipe::parse("x.toml", "reward = \"process\"\n[tasks]\nsize = 10\n[rl]\nmode = \"sync\"\n").unwrap();
    assert_eq!(r.mode(), Mode::Sync);
}

#[test]
fn recipe_errors_name_the_file_line_and_field() {
    let base = read("configs/calculator-process.toml");
    let cases: [(&str, &str, &str, &str); 10] = [
        ("held_out = 200", "held_out = 50", "held_out = 50", "field \"tasks.held_out\": must be at least 100, got 50"),
        ("temperature = 1.0", "temprature = 1.0", "temprature", "field \"rl.temprature\": unknown field `temprature`"),
        ("mode = \"one_step_off\"", "mode = \"sync\"\nmax_staleness = 2", "max_staleness = 2", "field \"rl.max_staleness\": mode \"sync\" means 0, got 2"),
        ("reward = \"process\"", "reward = \"final\"", "reward = \"final\"", "field \"reward\": unknown variant `final`"),
        ("correct = 0.5", "correct = 0.4", "[sft.mix]", "field \"sft.mix\": shares must sum to 1, they sum to 0.9"),
        ("name = \"grpo\"", "name = \"dr_grpo\"", "scale_rewards", "field \"estimator.scale_rewards\": dr_grpo does not scale rewards: only \"none\""),
        ("tools = [\"calculator\"]", "tools = [\"calculator\", \"abacus\"]", "abacus", "field \"tools[1]\": unknown tool \"abacus\" (known: calculator, inventory)"),
        ("group_size = 8", "group_size = 1", "group_size = 1", "field \"rl.group_size\": must be at least 2, got 1"),
        ("group_size = 8", "group_size = 8\nmax_draws = 4", "max_draws", "field \"rl.max_draws\": only dynamic_sampling = true uses it; set that or remove this"),
        ("group_size = 8", "group_size = 8\ndynamic_sampling = true\nmax_draws = 65", "max_draws", "field \"rl.max_draws\": must be at most 64"),
    ];
    for (from, to, at, expected) in cases {
        let text = edit(&base, from, to);
        let err = recipe_error(&text);
        let want = format!("configs/bad.toml:{}: {expected}", line(&text, at));
        assert!(err.starts_with(&want), "edit {from:?} → {to:?}:\n got  {err}\n want {want}");
    }
    let text = edit(&base, "reward = \"process\"", "");
    let err = recipe_error(&text);
    assert!(err.starts_with("configs/bad.toml:1: field \"reward\": required field is missing"), "{err}");
    let text = edit(&base, "tokenizer = \"task\"", "tokenizer = \"gpt2\"");
    let err = recipe_error(&text);
    assert!(err.contains("field \"model.tokenizer\""), "{err}");
    let text = edit(&base, "hidden = 128", "hidden = 100");
    let err = recipe_error(&text);
    assert!(err.contains("field \"model.hidden\": must split into 8 heads of even width (a multiple of 16), got 100"), "{err}");
    let text = edit(&base, "kv_heads = 4", "kv_heads = 3");
    let err = recipe_error(&text);
    assert!(err.starts_with(&format!("configs/bad.toml:{}: field \"model.kv_heads\": must divide model.heads (8), got 3", line(&text, "kv_heads = 3"))), "{err}");
    let text = edit(&base, "lr = 1e-4", "lr = \"fast\"");
    let err = recipe_error(&text);
    assert!(err.starts_with(&format!("configs/bad.toml:{}: field \"rl.lr\": invalid type: string \"fast\"", line(&text, "\"fast\""))), "{err}");
}

#[test]
fn multistep_recipes_differ_only_in_the_estimator_and_check_its_fields() {
    let base = Recipe::load(&repo("configs/multistep-grpo.toml")).unwrap();
    for name in ["slca", "steptool", "steptool-critic-free"] {
        let mut r = Recipe::load(&repo(&format!("configs/multistep-{name}.toml"))).unwrap();
        assert_ne!(r.estimator, base.estimator);
        r.estimator = base.estimator.clone();
        r.name = base.name.clone();
        assert_eq!(r, base, "multistep-{name}.toml differs from multistep-grpo.toml outside [estimator]");
    }
    assert!(base.sft.share && base.tasks.three_step_fraction > 0.0 && base.rl.max_turns >= 4);
    // A field of another estimator, a bad range: named with file, line and field.
    let slca = read("configs/multistep-slca.toml");
    let cases: [(&str, &str, &str, &str); 4] = [
        ("w_process = 1.0", "w_process = 1.0\ngamma = 0.9", "gamma = 0.9", "field \"estimator.gamma\": only steptool and steptool_critic_free use it, and this recipe's estimator is slca; remove it"),
        ("w_summary = 1.0", "w_summary = -1.0", "w_summary = -1.0", "field \"estimator.w_summary\": must be ≥ 0, got -1"),
        ("name = \"slca\"", "name = \"steptool\"", "w_process", "field \"estimator.w_process\": only slca uses it, and this recipe's estimator is steptool; remove it"),
        ("norm_by_std = true", "norm_by_std = \"yes\"", "\"yes\"", "field \"estimator.norm_by_std\": invalid type: string \"yes\""),
    ];
    for (from, to, at, expected) in cases {
        let text = edit(&slca, from, to);
        let err = recipe_error(&text);
        let want = format!("configs/bad.toml:{}: {expected}", line(&text, at));
        assert!(err.starts_with(&want), "edit {from:?} → {to:?}:\n got  {err}\n want {want}");
    }
    let steptool = read("configs/multistep-steptool.toml");
    for (from, to, at, expected) in [
        ("lam = 0.95", "lam = 1.5", "lam = 1.5", "field \"estimator.lam\": must be in [0, 1], got 1.5"),
        ("kl_target = 6.0", "kl_target = 0.0", "kl_target = 0.0", "field \"estimator.kl_target\": must be > 0, got 0"),
    ] {
        let text = edit(&steptool, from, to);
        let err = recipe_error(&text);
        let want = format!("configs/bad.toml:{}: {expected}", line(&text, at));
        assert!(err.starts_with(&want), "edit {from:?} → {to:?}:\n got  {err}\n want {want}");
    }
}

#[test]
fn network_and_env_tables_reach_each_process_by_role_and_cannot_override_the_plan() {
    let base = read("deploy/local-procs.toml");
    let text = format!(
        "{base}\n[network]\nsocket_ifname = \"ib0\"\nib_hca = \"mlx5_0\"\n[env.all]\nNCCL_DEBUG = \"WARN\"\nSHARED = \"all\"\n[env.learner]\nSHARED = \"learner\"\n"
    );
    let p = plan(&Topology::parse("deploy/x.toml", &text).unwrap());
    for proc in ["local/control", "local/rollout-0", "local/learner-0"] {
        assert_eq!(env(&p, proc, "NCCL_SOCKET_IFNAME"), "ib0");
        assert_eq!(env(&p, proc, "GLOO_SOCKET_IFNAME"), "ib0");
        assert_eq!(env(&p, proc, "NCCL_IB_HCA"), "mlx5_0");
        assert_eq!(env(&p, proc, "NCCL_DEBUG"), "WARN");
    }
    // Listeners bind each process's host unless the topology asks for every interface.
    assert!(!p.listen_all && p.processes.iter().all(|x| !x.env.contains_key("RLMESH_LISTEN_ALL")));
    let all = plan(&Topology::parse("deploy/x.toml", &format!("{base}\n[network]\nlisten_all = true\n")).unwrap());
    assert!(all.listen_all && all.processes.iter().all(|x| x.env.get("RLMESH_LISTEN_ALL").map(String::as_str) == Some("1")));
    // `[faults]` reaches every process only where it changes the defaults, and is checked.
    assert!(p.processes.iter().all(|x| !x.env.contains_key("RLMESH_DEADLINE_S")));
    let f = plan(&Topology::parse("deploy/x.toml", &format!("{base}\n[faults]\ndeadline_s = 2.5\ncall_timeout_s = 60\n")).unwrap());
    assert!(f.processes.iter().all(|x| x.env.get("RLMESH_DEADLINE_S").map(String::as_str) == Some("2.5") && !x.env.contains_key("RLMESH_HEARTBEAT_S")));
    assert_eq!(f.faults.call_timeout_s, 60.0);
    for (extra, field) in [("[faults]\ndeadline_s = 1.0\n", "faults.deadline_s"), ("[faults]\ncall_timeout_s = 0\n", "faults.call_timeout_s"), ("[faults]\nheartbeat = 1\n", "heartbeat")] {
        let e = topology_error(&format!("{base}\n{extra}"));
        assert!(e.contains(field), "{extra:?}: {e}");
    }
    // A role's table wins over `all`, for that role's processes only.
    assert_eq!(env(&p, "local/learner-1", "SHARED"), "learner");
    assert_eq!(env(&p, "local/rollout-1", "SHARED"), "all");
    // Roles and commands are in the plan.
    let learner = p.processes.iter().find(|x| x.name == "local/learner-0").unwrap();
    assert_eq!((learner.roles.as_slice(), learner.command.as_slice()), (&[Role::Learner][..], &["launcher".to_string(), "node".to_string()][..]));

    for (extra, field) in [
        ("[env.rollout]\nRLMESH_HOST = \"x\"\n", "env.rollout.RLMESH_HOST"),
        ("[env.all]\nCUDA_VISIBLE_DEVICES = \"0\"\n", "env.all.CUDA_VISIBLE_DEVICES"),
        ("[env.gpu]\nX = \"1\"\n", "env.gpu"),
        ("[env.all]\n\"BAD-NAME\" = \"1\"\n", "env.all.BAD-NAME"),
    ] {
        let e = topology_error(&format!("{base}\n{extra}"));
        assert!(e.contains(field), "{extra:?}: {e}");
    }
}

#[test]
fn a_topology_maps_onto_an_allocations_hosts_with_the_controller_first() {
    let t = Topology::load(&repo("deploy/h100x32.toml")).unwrap();
    let hosts: Vec<String> = ["g3", "g1", "g2", "g4"].map(String::from).to_vec();
    // `up` runs on g2: the controller's node (n0) goes there, the rest in file order.
    let m = t.on_hosts(&hosts, "g2").unwrap();
    let placed: Vec<(&str, &str)> = m.nodes.iter().map(|n| (n.name.as_str(), n.host.as_str())).collect();
    assert_eq!(placed, [("n0", "g2"), ("n1", "g3"), ("n2", "g1"), ("n3", "g4")]);
    let p = plan(&m);
    assert!(p.controller.starts_with("g2:"), "{}", p.controller);
    assert!(t.on_hosts(&hosts[..3], "g2").unwrap_err().contains("has 4 nodes but the allocation has 3"));
    assert!(t.on_hosts(&hosts, "elsewhere").unwrap_err().contains("not one of the allocation's hosts"));
}
