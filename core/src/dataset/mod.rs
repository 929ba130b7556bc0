//! Datasets: the tasks a run trains and evaluates on, and the conversations a
//! warm-up imitates.
//!
//! - [`mix`]: the seed's task mix, generated for a seed.
//! - [`task_file`]: the user's tasks from a JSONL or Parquet file, one row a
//!   task, with `[tasks.columns]` mapping TRL-, verl- and verifiers-shaped
//!   files onto rlmesh's fields, and a held-out split.
//! - [`conversation`]: chat messages in the OpenAI format (`tool_calls`,
//!   `tool` messages), checked; a warm-up's `sft.jsonl` (TRL's SFT format).
//! - [`rows`]: reading a file's rows (JSONL lines, Parquet rows) as JSON
//!   objects, with a cap on a line's length.
//!
//! Every error names the file, the line (Parquet: the row) and the field, and
//! loading is all or nothing: a bad row fails the whole file.
//!
//! ```
//! let err = rlmesh_core::dataset::parse_jsonl("{\"prompt\": \"hi\", \"requires_tool\": \"no\"}", "tasks.jsonl").unwrap_err();
//! assert_eq!(err.to_string(), "tasks.jsonl:1: field \"requires_tool\": expected a boolean, got a string (\"no\")");
//! ```
use std::collections::HashMap;
use std::fmt;
use std::path::Path;

pub mod conversation;
pub mod mix;
pub mod rows;
pub mod task_file;

pub use conversation::{load_sft_file, Conversation};
pub use mix::{generate, split_holdout, task_key, MixConfig, DRILL_WORDS, WORDS};
pub use task_file::{
    load_task_file, load_tasks, parse_jsonl, task_row, to_jsonl, validate_task, Columns, TaskFiles, TaskSplit,
};

/// Where in a file a problem is: a JSONL line or a Parquet row (both 1-based).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Location {
    /// A line of a JSONL file.
    Line(usize),
    /// A row of a Parquet file.
    Row(usize),
}

impl Location {
    /// What a field is called at this location: a JSONL line's `field`, a Parquet row's `column`.
    pub fn noun(self) -> &'static str {
        match self {
            Location::Line(_) => "field",
            Location::Row(_) => "column",
        }
    }
    /// The 1-based line or row number.
    pub fn number(self) -> usize {
        match self {
            Location::Line(n) | Location::Row(n) => n,
        }
    }
}

impl fmt::Display for Location {
    /// `17` for a line, `row 17` for a row, as in `train.jsonl:17` and `train.parquet:row 17`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Line(n) => write!(f, "{n}"),
            Location::Row(n) => write!(f, "row {n}"),
        }
    }
}

/// Errors of task generation and of loading task and conversation files.
#[derive(Debug, thiserror::Error)]
pub enum DatasetError {
    /// The file could not be read.
    #[error("{path}: {error}")]
    Io {
        /// The file.
        path: String,
        /// The OS error.
        error: std::io::Error,
    },
    /// A line of a JSONL file is not valid.
    #[error("{file}:{line}: {message}")]
    Line {
        /// The file (as given).
        file: String,
        /// 1-based line number.
        line: usize,
        /// The field and what was expected.
        message: String,
    },
    /// A row of a Parquet file is not valid.
    #[error("{file}:row {row}: {message}")]
    Row {
        /// The file (as given).
        file: String,
        /// 1-based row number.
        row: usize,
        /// The column and what was expected.
        message: String,
    },
    /// The file as a whole is not valid (empty, not Parquet, …).
    #[error("{file}: {message}")]
    File {
        /// The file (as given).
        file: String,
        /// What is wrong.
        message: String,
    },
    /// The mix configuration is impossible.
    #[error("task mix: {0}")]
    Config(String),
    /// The `[tasks]` settings are impossible (`[tasks.columns]`, a held-out size).
    #[error("{0}")]
    Spec(String),
}

impl DatasetError {
    /// An error at `at` in `file`.
    pub fn at(file: &str, at: Location, message: impl Into<String>) -> Self {
        match at {
            Location::Line(line) => DatasetError::Line { file: file.to_string(), line, message: message.into() },
            Location::Row(row) => DatasetError::Row { file: file.to_string(), row, message: message.into() },
        }
    }
}

/// Levenshtein distance, for "did you mean" hints on misspelt field names.
pub(crate) fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            cur.push((prev[j] + usize::from(ca != *cb)).min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

/// The known name `key` is probably a misspelling of (distance 1 or 2), among `known`.
pub(crate) fn misspelling_of<'a>(key: &str, known: &[&'a str]) -> Option<&'a str> {
    known.iter().copied().find(|k| *k != key && edit_distance(key, k) <= 2)
}

/// The ids a file used so far, for "already used" errors.
#[derive(Default)]
pub(crate) struct Ids(HashMap<String, Location>);

impl Ids {
    /// Takes `id` for the row at `at`; an error when an earlier row has it.
    pub(crate) fn claim(&mut self, id: &str, at: Location) -> Result<(), String> {
        match self.0.get(id) {
            Some(Location::Line(n)) => Err(format!("{} \"id\": \"{id}\" is already used on line {n}", at.noun())),
            Some(Location::Row(n)) => Err(format!("{} \"id\": \"{id}\" is already used on row {n}", at.noun())),
            None => {
                self.0.insert(id.to_string(), at);
                Ok(())
            }
        }
    }
}

/// The last component of a path, for ids (`data/train.jsonl` → `train.jsonl`).
pub(crate) fn file_name(file: &str) -> String {
    Path::new(file).file_name().map_or_else(|| file.to_string(), |n| n.to_string_lossy().into_owned())
}
