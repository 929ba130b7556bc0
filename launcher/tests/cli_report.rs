//! `launcher report`: the table and PNG plots of a synthetic run directory, two runs side by side, and bad directories.
mod common;

use common::*;
use serde_json::json;
use std::path::Path;

/// A run directory with `steps` lines of metrics whose rates climb from 0.1 to 0.9 (`running`: no summary.json and a torn last line).
fn synthetic_run(dir: &Path, steps: usize, running: bool) {
    std::fs::create_dir_all(dir).unwrap();
    let mut metrics = String::new();
    for s in 1..=steps {
        let p = 0.1 + 0.8 * (s - 1) as f64 / (steps - 1) as f64;
        let mut m = json!({
            "step": s, "version": s, "reward_mean": p, "trajectory_success": p, "final_answer_accuracy": p,
            "tool_call_rate": 0.5, "unnecessary_tool_rate": 1.0 - p, "reward/format_ok": 1.0, "reward/final_correct": p,
            "loss": 1.0 / s as f64, "kl": 0.01, "tokens_per_s": 1000.0, "seconds": 0.5
        });
        if s % 2 == 0 {
            m.as_object_mut().unwrap().remove("kl"); // missing keys are tolerated
        }
        metrics.push_str(&format!("{m}\n"));
    }
    if running {
        metrics.push_str("{\"step\": 99, \"rew");
    }
    std::fs::write(dir.join("metrics.jsonl"), metrics).unwrap();
    let row = |id: &str, task_type: &str, calls: usize, total: f64| {
        json!({
            "prompt_id": id, "task_type": task_type, "rendered_prompt": "p", "completion": "c",
            "tool_name": if calls > 0 { json!("calculator") } else { json!(null) }, "arguments": null, "tool_result": null,
            "call_count": calls, "format_reward": 1.0, "selection_reward": 0.0, "argument_reward": null,
            "execution_reward": null, "final_reward": 1.0, "total_reward": total, "verifier_error": null, "human_note": null
        })
    };
    let rows = [row("a", "tool_required", 1, 1.0), row("b", "no_tool", 2, 0.5), row("c", "no_tool", 0, 1.0)];
    std::fs::write(dir.join("rollouts.jsonl"), rows.iter().map(|r| format!("{r}\n")).collect::<String>()).unwrap();
    if !running {
        let summary = json!({"trajectory_success": 0.9712, "final_answer_accuracy": 0.98, "unnecessary_tool_rate": 0.01,
                             "repeated_call_rate": 0.0, "eval_tasks": 100, "steps": steps, "wall_seconds": 321.5, "recipe": "calculator-process"});
        std::fs::write(dir.join("summary.json"), summary.to_string()).unwrap();
    }
}

fn row<'a>(table: &'a str, label: &str) -> &'a str {
    table.lines().find(|l| l.trim_start().starts_with(&format!("{label} "))).unwrap_or_else(|| panic!("no row {label}:\n{table}"))
}

fn assert_png(path: &Path) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n") && bytes.len() > 2000, "{}: not a drawn PNG", path.display());
}

#[test]
fn report_prints_the_summary_and_first_last_steps_and_draws_three_plots() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    synthetic_run(&run, 5, false);
    let o = launcher(&["report", run.to_str().unwrap()]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let table = stdout(&o);
    assert!(row(&table, "trajectory_success").ends_with("97.12%"), "{table}");
    assert!(row(&table, "eval_tasks").ends_with(" 100"), "{table}");
    assert!(row(&table, "recipe").ends_with("calculator-process"), "{table}");
    assert!(row(&table, "state").ends_with("finished"), "{table}");
    // Training rows: first → last step; kl only on odd steps (1, 3, 5).
    let training = &table[table.find("training").unwrap()..];
    assert!(row(training, "trajectory_success").ends_with("10.00% → 90.00%"), "{table}");
    assert!(row(training, "reward/final_correct").ends_with("0.1000 → 0.9000"), "{table}");
    assert!(row(training, "kl").ends_with("0.0100 → 0.0100"), "{table}");
    assert!(row(&table, "rows").ends_with(" 3"), "{table}");
    assert!(row(&table, "tools_on_no_tool_tasks").ends_with(" 1"), "{table}");
    for png in ["rewards.png", "success.png", "tool_use.png"] {
        assert_png(&run.join("report").join(png));
    }
}

#[test]
fn report_compares_two_runs_side_by_side_and_reads_a_running_run() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("final-only"), dir.path().join("process"));
    synthetic_run(&a, 3, true);
    synthetic_run(&b, 4, false);
    let o = launcher(&["report", a.to_str().unwrap(), b.to_str().unwrap()]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let table = stdout(&o);
    let header = row(&table, "run");
    assert!(header.find("final-only").unwrap() < header.find("process").unwrap(), "{header}");
    let state = row(&table, "state");
    assert!(state.contains("running (no summary.json yet; 3 steps logged)") && state.ends_with("finished"), "{state}");
    let success = row(&table, "trajectory_success");
    assert!(success.contains(" — ") && success.ends_with("97.12%"), "held-out figures of the running run are blank: {success}");
    for run in [&a, &b] {
        assert_png(&run.join("report/success.png"));
    }
}

#[test]
fn report_rejects_what_is_not_a_run_directory() {
    let dir = tempfile::tempdir().unwrap();
    let o = launcher(&["report", dir.path().to_str().unwrap()]);
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).contains("no summary.json or metrics.jsonl"), "{}", stderr(&o));

    std::fs::write(dir.path().join("metrics.jsonl"), "{\"step\": 1}\nnot json\n{\"step\": 3}\n").unwrap();
    let o = launcher(&["report", dir.path().to_str().unwrap()]);
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).contains("metrics.jsonl:2: expected a JSON object of step metrics"), "{}", stderr(&o));
}

#[test]
fn extreme_metrics_are_left_out_of_the_plots_with_a_note_instead_of_hanging() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    std::fs::create_dir_all(&run).unwrap();
    let lines = [
        json!({"step": 1, "reward_mean": 0.5, "trajectory_success": 0.5}),
        json!({"step": 2, "reward_mean": 1e308, "trajectory_success": 0.6}),
        json!({"step": 3, "reward_mean": -1e308, "trajectory_success": 0.7}),
        json!({"step": 1e300, "reward_mean": 0.7, "trajectory_success": 0.8}),
        json!({"step": 5, "reward_mean": 0.9, "trajectory_success": 0.9}),
    ];
    std::fs::write(run.join("metrics.jsonl"), lines.iter().map(|l| format!("{l}\n")).collect::<String>()).unwrap();
    // Before: plotters' key points looped forever at 100% CPU on the overflowing range.
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_launcher"))
        .args(["report", run.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            panic!("launcher report still running after 60 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let o = child.wait_with_output().unwrap();
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("note: ") && out.contains("3 of 5 points of reward_mean left out of rewards.png: the step or value is beyond ±1e15"), "{out}");
    assert!(out.contains("1 of 5 points of trajectory_success left out of success.png"), "{out}");
    assert!(row(&out, "reward_mean").contains("0.5000 → 0.9000"), "{out}");
    assert_png(&run.join("report/rewards.png"));
    assert_png(&run.join("report/success.png"));
}

/// A finished run of `recipe` whose held-out success is `success` (training success climbs to it over 4 steps).
fn seed_run(dir: &Path, recipe: &str, success: f64, wall: f64) {
    std::fs::create_dir_all(dir).unwrap();
    let metrics: String =
        (1..=4).map(|s| format!("{}\n", json!({"step": s, "trajectory_success": success * s as f64 / 4.0, "reward_mean": s, "seconds": wall - 10.0 * (4 - s) as f64}))).collect();
    std::fs::write(dir.join("metrics.jsonl"), metrics).unwrap();
    let summary = json!({"recipe": recipe, "trajectory_success": success, "step_call_accuracy": success / 2.0, "summary_score": 0.25,
                         "final_answer_accuracy": 0.5, "steps": 4, "wall_seconds": wall, "after_warmup": {"trajectory_success": 0.4}});
    std::fs::write(dir.join("summary.json"), summary.to_string()).unwrap();
}

#[test]
fn report_compares_recipes_over_seeds_with_mean_and_spread() {
    let dir = tempfile::tempdir().unwrap();
    let runs = dir.path().join("runs");
    seed_run(&runs.join("a-0"), "multistep-grpo", 0.5, 100.0);
    seed_run(&runs.join("a-1"), "multistep-grpo", 0.7, 120.0);
    seed_run(&runs.join("b-0"), "multistep-slca", 0.8, 90.0);
    let dirs: Vec<String> = ["a-0", "a-1", "b-0"].iter().map(|d| runs.join(d).display().to_string()).collect();
    let mut args = vec!["report"];
    args.extend(dirs.iter().map(String::as_str));
    let o = launcher(&args);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let table = stdout(&o);
    let cells = |label: &str| row(&table, label)[label.len()..].split("  ").map(str::trim).filter(|c| !c.is_empty()).map(String::from).collect::<Vec<_>>();
    assert_eq!(cells("recipe"), ["multistep-grpo", "multistep-slca"], "{table}");
    assert_eq!(cells("runs (finished)"), ["2 (2)", "1 (1)"], "{table}");
    // mean 0.6, sample std sqrt((0.01 + 0.01)/1) = 0.1414 → 60.0% ± 14.1; one run: no spread.
    assert_eq!(cells("held-out trajectory success"), ["60.0% ± 14.1", "80.0%"], "{table}");
    assert_eq!(cells("held-out per-step call accuracy"), ["30.0% ± 7.1", "40.0%"], "{table}");
    assert_eq!(cells("after warm-up: trajectory success"), ["40.0% ± 0.0", "40.0%"], "{table}");
    assert_eq!(cells("wall seconds"), ["110.0 ± 14.1", "90.000"], "{table}");
    // Step 1 at wall − 30 s, step 4 at wall: 30 s of RL in every run.
    assert_eq!(cells("RL seconds (first → last step)"), ["30.000 ± 0.000", "30.000"], "{table}");
    for png in ["compare-success.png", "compare-reward.png"] {
        assert_png(&runs.join("report").join(png));
    }
    // Two seeds of one recipe are a comparison too.
    let o = launcher(&["report", &dirs[0], &dirs[1], "--out", dir.path().join("out").to_str().unwrap()]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(row(&stdout(&o), "recipe").split_whitespace().collect::<Vec<_>>(), ["recipe", "multistep-grpo"]);
    assert_png(&dir.path().join("out/compare-success.png"));
}
