//! Bad task and warm-up files: each is refused with its file, line (Parquet:
//! row) and field, nothing is loaded, and nothing is written beside it.
use rlmesh_core::dataset::rows::MAX_LINE_BYTES;
use rlmesh_core::dataset::task_file::load_task_file_with;
use rlmesh_core::dataset::{load_sft_file, load_task_file, Columns, DatasetError};
use std::io::Write;
use std::path::Path;

/// Loads `path` as tasks and returns the error, checking that the folder holds only what it held before.
fn refused(path: &Path) -> String {
    let before = std::fs::read_dir(path.parent().unwrap()).unwrap().count();
    let e = load_task_file(path).unwrap_err().to_string();
    assert_eq!(std::fs::read_dir(path.parent().unwrap()).unwrap().count(), before, "nothing is created");
    e
}

#[test]
fn an_empty_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in [("empty.jsonl", ""), ("blank.jsonl", "\n  \n\n")] {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        assert_eq!(refused(&p), format!("{}: no rows (the file is empty)", p.display()));
    }
    let p = dir.path().join("empty.jsonl");
    assert!(matches!(load_sft_file(&p), Err(DatasetError::File { .. })));
}

#[test]
fn a_wrong_type_on_line_n_names_the_line_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("train.jsonl");
    let mut text: String = (0..9).map(|i| format!("{{\"prompt\": \"task {i}\"}}\n")).collect();
    text.push_str("{\"prompt\": \"task 9\", \"answer\": [1, 2]}\n");
    std::fs::write(&p, text).unwrap();
    let e = refused(&p);
    assert_eq!(e, format!("{}:10: field \"answer\"[0]: expected a message object, got an integer (1)", p.display()));
}

#[test]
fn a_missing_column_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("q.jsonl");
    std::fs::write(&p, "{\"question\": \"a\"}\n{\"query\": \"b\"}\n").unwrap();
    let columns = Columns::new([("prompt", "question")]).unwrap();
    let e = load_task_file_with(&p, &columns, MAX_LINE_BYTES).unwrap_err().to_string();
    assert_eq!(e, format!("{}:2: missing field \"question\" (prompt, from [tasks.columns]); the row has: query", p.display()));
    let e = refused(&p);
    assert_eq!(e, format!("{}:1: missing field \"prompt\" (the prompt)", p.display()));
}

#[test]
fn non_utf8_bytes_name_the_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("latin1.jsonl");
    let mut bytes = b"{\"prompt\": \"ok\"}\n".to_vec();
    bytes.extend_from_slice(b"{\"prompt\": \"caf\xe9\"}\n");
    std::fs::write(&p, bytes).unwrap();
    assert_eq!(refused(&p), format!("{}:2: not UTF-8: byte 0xe9 at column 16", p.display()));
}

#[test]
fn a_200_mb_line_is_refused_without_reading_it_whole() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("huge.jsonl");
    {
        let mut f = std::io::BufWriter::new(std::fs::File::create(&p).unwrap());
        // Line 1 is a task and a warm-up conversation at once (each loader ignores the other's field).
        f.write_all(br#"{"prompt": "ok", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]}"#).unwrap();
        f.write_all(b"\n{\"prompt\": \"").unwrap();
        let chunk = vec![b'x'; 1 << 20];
        for _ in 0..200 {
            f.write_all(&chunk).unwrap();
        }
        f.write_all(b"\"}\n").unwrap();
    }
    assert!(std::fs::metadata(&p).unwrap().len() > 200 << 20);
    let e = refused(&p);
    assert_eq!(e, format!("{}:2: line longer than {MAX_LINE_BYTES} bytes, the cap on a line (one row per line)", p.display()));
    // The same cap guards warm-up files.
    let e = load_sft_file(&p).unwrap_err();
    assert!(matches!(e, DatasetError::Line { line: 2, .. }), "{e}");
    // A smaller cap, as a recipe may set it.
    let small = dir.path().join("small.jsonl");
    std::fs::write(&small, format!("{{\"prompt\": \"{}\"}}\n", "y".repeat(100))).unwrap();
    let e = load_task_file_with(&small, &Columns::default(), 64).unwrap_err().to_string();
    assert!(e.ends_with(":1: line longer than 64 bytes, the cap on a line (one row per line)"), "{e}");
}

#[test]
fn a_file_that_is_not_parquet_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("fake.parquet");
    std::fs::write(&p, "{\"prompt\": \"x\"}\n").unwrap();
    let e = refused(&p);
    assert!(e.starts_with(&format!("{}: not a Parquet file: ", p.display())), "{e}");
}
