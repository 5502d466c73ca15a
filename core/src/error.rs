//! One error type for the whole engine. Every failure a user can cause (bad model files, bad
//! requests) is a variant with a message that names the offending thing.

use std::path::PathBuf;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Model directory / file missing, unreadable, malformed or inconsistent.
    #[error("model load error: {0}")]
    ModelLoad(String),
    /// `model_type` or a config option this engine does not implement.
    #[error("unsupported model: {0}")]
    Unsupported(String),
    /// Tokenizer or chat-template problem.
    #[error("tokenizer error: {0}")]
    Tokenizer(String),
    /// A request that can never be served as given (bad ids, prompt too long, bad params).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// A request that can never fit the engine's limits (e.g. more KV than the whole budget).
    #[error("over capacity: {0}")]
    Capacity(String),
    /// The engine has shut down and takes no more requests.
    #[error("the engine has shut down")]
    Shutdown,
    /// Downloading or verifying the default model.
    #[error("model download error: {0}")]
    Download(String),
    #[error("I/O error on {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    /// An MLX operation failed (shape errors inside a forward pass, out of memory...).
    #[error("MLX error: {0}")]
    Mlx(String),
}

impl Error {
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io { path: path.into(), source }
    }
}

impl From<mlx_rs::error::Exception> for Error {
    fn from(e: mlx_rs::error::Exception) -> Self {
        Error::Mlx(e.to_string())
    }
}
