//! The model crate's error type.
use std::path::PathBuf;

/// Errors from loading, saving, tokenising and running the model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A file the model needs is not there.
    #[error("{path}: missing ({what})")]
    MissingFile {
        /// The path looked for.
        path: PathBuf,
        /// What the file is for.
        what: &'static str,
    },
    /// A file could not be read or parsed.
    #[error("{path}: {message}")]
    BadFile {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        message: String,
    },
    /// `config.json` names an architecture rlmesh does not implement.
    #[error("{path}: unsupported architecture {found:?} (supported: {supported})")]
    UnsupportedArchitecture {
        /// The config file.
        path: PathBuf,
        /// The architecture found.
        found: String,
        /// The architectures supported.
        supported: &'static str,
    },
    /// The weights lack tensors the config requires.
    #[error("{path}: missing tensors: {names}")]
    MissingTensors {
        /// The weights file (or index).
        path: PathBuf,
        /// Comma-separated names (first few).
        names: String,
    },
    /// A tensor's shape or dtype does not match what the config implies.
    #[error("{path}: tensor {name}: {message}")]
    BadTensor {
        /// The weights file.
        path: PathBuf,
        /// Tensor name.
        name: String,
        /// What was wrong (expected vs found).
        message: String,
    },
    /// Bad input to a model call (empty prompt, token out of range, …).
    #[error("invalid input: {0}")]
    Input(String),
    /// The chat template failed to render.
    #[error("chat template: {0}")]
    Template(String),
    /// The tokenizer failed.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// libtorch reported an error.
    #[error("libtorch: {0}")]
    Torch(#[from] tch::TchError),
    /// I/O error with a path.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}

/// Result alias for the model crate.
pub type Result<T, E = ModelError> = std::result::Result<T, E>;

pub(crate) fn io_err(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> ModelError {
    let path = path.into();
    move |source| ModelError::Io { path, source }
}
