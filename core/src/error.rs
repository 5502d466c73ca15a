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
    /// A request field the caller got wrong: `key` names it as the caller's wire format does
    /// (HTTP's `param`, e.g. `messages[2].role`), `message` says what is wrong, naming it too.
    /// Faces report the key from here; none parses it out of a message.
    #[error("invalid request: {message}")]
    Field { key: String, message: String },
    /// A request that can never fit the engine's limits (e.g. more KV than the whole budget).
    #[error("over capacity: {0}")]
    Capacity(String),
    /// The engine has shut down and takes no more requests.
    #[error("the engine has shut down")]
    Shutdown,
    /// The engine's driver thread died (a bug); it takes no more requests.
    #[error("the engine has failed: {0}")]
    EngineFailed(String),
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

    /// A bad value of request field `key`.
    pub fn field(key: impl Into<String>, message: impl Into<String>) -> Self {
        Error::Field { key: key.into(), message: message.into() }
    }

    /// The request field at fault, when the error is about one.
    pub fn field_key(&self) -> Option<&str> {
        match self {
            Error::Field { key, .. } => Some(key),
            _ => None,
        }
    }

    /// The message without the kind's prefix (what a face shows after its own context).
    pub fn message(&self) -> String {
        match self {
            Error::InvalidRequest(m)
            | Error::Capacity(m)
            | Error::Tokenizer(m)
            | Error::ModelLoad(m)
            | Error::Unsupported(m)
            | Error::Mlx(m)
            | Error::Download(m)
            | Error::EngineFailed(m) => m.clone(),
            Error::Field { message, .. } => message.clone(),
            other => other.to_string(),
        }
    }
}

impl From<mlx_rs::error::Exception> for Error {
    fn from(e: mlx_rs::error::Exception) -> Self {
        Error::Mlx(e.to_string())
    }
}

/// The error codes every face reports, from one mapping: the C ABI's status codes, the `code`
/// of Node's and Swift's `WeftError`, and the server's HTTP statuses are all derived from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// The caller's request or options are wrong (bad values, unknown fields, a prompt the
    /// model cannot take, a conversation its chat template rejects).
    InvalidArgument,
    /// The model could not be found, read, downloaded or parsed.
    ModelLoad,
    /// The model uses an architecture or option this engine does not implement.
    Unsupported,
    /// The request can never fit the engine's limits.
    Capacity,
    /// The engine was shut down (or closed).
    EngineClosed,
    /// The engine's driver thread died; the engine takes no more requests.
    EngineFailed,
    /// A failure inside the engine or MLX.
    Internal,
    /// A request that was accepted failed while generating (an `Error` event).
    GenerationFailed,
}

impl ErrorCode {
    /// The stable spelling (Node's and Swift's `code`).
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidArgument => "INVALID_ARGUMENT",
            ErrorCode::ModelLoad => "MODEL_LOAD",
            ErrorCode::Unsupported => "UNSUPPORTED",
            ErrorCode::Capacity => "CAPACITY",
            ErrorCode::EngineClosed => "ENGINE_CLOSED",
            ErrorCode::EngineFailed => "ENGINE_FAILED",
            ErrorCode::Internal => "INTERNAL",
            ErrorCode::GenerationFailed => "GENERATION_FAILED",
        }
    }

    pub const ALL: [ErrorCode; 8] = [
        ErrorCode::InvalidArgument,
        ErrorCode::ModelLoad,
        ErrorCode::Unsupported,
        ErrorCode::Capacity,
        ErrorCode::EngineClosed,
        ErrorCode::EngineFailed,
        ErrorCode::Internal,
        ErrorCode::GenerationFailed,
    ];
}

impl Error {
    /// The code of an error from submitting a request (or any call on a running engine).
    pub fn code(&self) -> ErrorCode {
        match self {
            Error::ModelLoad(_) | Error::Io { .. } | Error::Download(_) => ErrorCode::ModelLoad,
            Error::Unsupported(_) => ErrorCode::Unsupported,
            Error::Tokenizer(_) | Error::InvalidRequest(_) | Error::Field { .. } => ErrorCode::InvalidArgument,
            Error::Capacity(_) => ErrorCode::Capacity,
            Error::Shutdown => ErrorCode::EngineClosed,
            Error::EngineFailed(_) => ErrorCode::EngineFailed,
            Error::Mlx(_) => ErrorCode::Internal,
        }
    }

    /// The code of an error from loading a model, where tokenizer and MLX failures mean the
    /// model's files are at fault.
    pub fn load_code(&self) -> ErrorCode {
        match self {
            Error::Tokenizer(_) | Error::Mlx(_) => ErrorCode::ModelLoad,
            other => other.code(),
        }
    }
}

/// A JSON value as error messages show it: its JSON text, shortened when long.
pub fn show(v: &serde_json::Value) -> String {
    let s = v.to_string();
    if s.chars().count() > 40 {
        format!("{}… ({})", s.chars().take(40).collect::<String>(), json_kind(v))
    } else {
        s
    }
}

/// What kind of JSON value `v` is, as messages name it ("a string", "an array"...).
pub fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_distinct_and_loading_blames_the_files() {
        let names: std::collections::HashSet<_> = ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(names.len(), ErrorCode::ALL.len());
        assert_eq!(Error::Tokenizer("x".into()).code(), ErrorCode::InvalidArgument);
        assert_eq!(Error::Tokenizer("x".into()).load_code(), ErrorCode::ModelLoad);
        assert_eq!(Error::Mlx("x".into()).code(), ErrorCode::Internal);
        assert_eq!(Error::Mlx("x".into()).load_code(), ErrorCode::ModelLoad);
        assert_eq!(Error::Download("x".into()).code(), ErrorCode::ModelLoad);
        assert_eq!(Error::EngineFailed("x".into()).code(), ErrorCode::EngineFailed);
        assert_eq!(Error::Shutdown.code(), ErrorCode::EngineClosed);
    }
}
