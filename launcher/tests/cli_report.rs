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
