//! Parquet task files, written by pyarrow (the project's Python at
//! `$RLMESH_PYTHON`) in verl's shape: `prompt` a list of messages,
//! `reward_model.ground_truth`, `extra_info`; errors name the row and column.
use rlmesh_core::dataset::rows::MAX_LINE_BYTES;
use rlmesh_core::dataset::task_file::load_task_file_with;
use rlmesh_core::dataset::{load_sft_file, load_tasks, Columns, TaskFiles};
use serde_json::json;
use std::path::Path;
use std::process::Command;

/// Writes `rows` (JSON) to `path` with pyarrow's `Table.from_pylist`.
fn write_parquet(path: &Path, rows: serde_json::Value) {
    let python = std::env::var("RLMESH_PYTHON").expect("RLMESH_PYTHON (source scripts/env.sh): pyarrow writes the test's Parquet files");
    let script = "import json, sys, pyarrow as pa, pyarrow.parquet as pq\n\
                  rows = json.loads(sys.argv[2])\n\
                  table = pa.Table.from_pylist(rows) if rows else pa.table({'prompt': pa.array([], pa.string())})\n\
                  pq.write_table(table, sys.argv[1])\n";
    let out = Command::new(python).arg("-c").arg(script).arg(path).arg(rows.to_string()).output().unwrap();
    assert!(out.status.success(), "pyarrow: {}", String::from_utf8_lossy(&out.stderr));
}

fn verl_rows() -> serde_json::Value {
    json!([
        {"data_source": "openai/gsm8k", "ability": "math",
         "prompt": [{"role": "system", "content": "Think step by step."}, {"role": "user", "content": "Natalia sold 48 clips in April and half as many in May. How many in total?"}],
         "reward_model": {"style": "rule", "ground_truth": "72"},
         "extra_info": {"split": "train", "index": 0, "question": "Natalia sold 48 clips…"}},
        {"data_source": "openai/gsm8k", "ability": "math",
         "prompt": [{"role": "system", "content": "Think step by step."}, {"role": "user", "content": "Weng earns $12 an hour. How much for 50 minutes?"}],
         "reward_model": {"style": "rule", "ground_truth": "10"},
         "extra_info": {"split": "train", "index": 1, "question": "Weng earns…"}},
        {"data_source": "openai/gsm8k", "ability": "math",
         "prompt": [{"role": "system", "content": "Think step by step."}, {"role": "user", "content": "Betty needs $100 and has half. How much more?"}],
         "reward_model": {"style": "rule", "ground_truth": "5"},
         "extra_info": {"split": "train", "index": 2, "question": "Betty needs…"}},
    ])
}

#[test]
fn a_verl_shaped_parquet_file_loads_with_columns() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("gsm8k.parquet");
    write_parquet(&p, verl_rows());
    let columns = Columns::new([("answer", "reward_model.ground_truth"), ("info", "extra_info")]).unwrap();
    let tasks = load_task_file_with(&p, &columns, MAX_LINE_BYTES).unwrap();
    assert_eq!(tasks.len(), 3);
    let t = &tasks[0];
    assert_eq!(t.id, "gsm8k.parquet:1");
    assert_eq!(t.prompt, "Natalia sold 48 clips in April and half as many in May. How many in total?");
    assert_eq!(t.messages[0].role, "system");
    assert_eq!(t.expected_answer.as_deref(), Some("72"));
    assert_eq!(t.info.as_ref().unwrap()["index"], 0);
    assert_eq!(t.info.as_ref().unwrap()["split"], "train");
    assert!(t.requires_tool, "tools absent: every tool, and a tool task by the documented rule");
    // The held-out split works the same on Parquet rows.
    let split = load_tasks(&TaskFiles { held_out: 1, columns, ..TaskFiles::new(&p) }, 3).unwrap();
    assert_eq!((split.train.len(), split.held_out.len()), (2, 1));
}

#[test]
fn parquet_errors_name_the_row_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("gsm8k.parquet");
    write_parquet(&p, verl_rows());
    // Without [tasks.columns], verl's nested answer is an unknown column (ignored), so this loads…
    let columns = Columns::new([("answer", "reward_model.answer")]).unwrap();
    // …but a mapped column that is not there is an error at the first row.
    let e = load_task_file_with(&p, &columns, MAX_LINE_BYTES).unwrap_err().to_string();
    assert_eq!(
        e,
        format!("{}:row 1: missing column \"reward_model.answer\" (answer, from [tasks.columns]); the row has: data_source, ability, prompt, reward_model, extra_info", p.display())
    );
    // A wrong type in row 2.
    let mut rows = verl_rows();
    for r in rows.as_array_mut().unwrap() {
        r["requires_tool"] = json!("no");
    }
    rows[0]["requires_tool"] = json!(null);
    write_parquet(&p, rows);
    let e = load_task_file_with(&p, &Columns::default(), MAX_LINE_BYTES).unwrap_err().to_string();
    assert_eq!(e, format!("{}:row 2: column \"requires_tool\": expected a boolean, got a string (\"no\")", p.display()));
    // No rows.
    let empty = dir.path().join("empty.parquet");
    write_parquet(&empty, json!([]));
    let e = load_task_file_with(&empty, &Columns::default(), MAX_LINE_BYTES).unwrap_err().to_string();
    assert_eq!(e, format!("{}: no rows (the file is empty)", empty.display()));
}

#[test]
fn a_warm_up_file_may_be_parquet_too() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("sft.parquet");
    write_parquet(&p, json!([{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}]));
    let c = load_sft_file(&p).unwrap();
    assert_eq!((c[0].id.as_str(), c[0].messages[1].content.as_str()), ("sft.parquet:1", "hello"));
}
