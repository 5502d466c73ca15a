//! Errors as each protocol writes them.
//!
//! One [`ApiError`] carries the HTTP status, a kind and a message; the handler that caught it
//! renders it in its protocol's shape:
//! - OpenAI: `{"error": {"message", "type", "param", "code"}}`
//! - Anthropic: `{"type": "error", "error": {"type", "message"}}`

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

/// Which wire format an error (or a whole endpoint) speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    OpenAi,
    Anthropic,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// 400: malformed JSON, wrong types, values out of range, prompt too long, over KV budget.
    InvalidRequest,
    /// 401: missing or wrong API key.
    Authentication,
    /// 403: a foreign browser origin or `Host` name.
    Forbidden,
    /// 404: unknown model or path.
    NotFound,
    /// 405
    MethodNotAllowed,
    /// 413: request body larger than the server accepts.
    TooLarge,
    /// 408: the request body did not arrive within `--read-timeout`.
    Timeout,
    /// 429: more connections open than `--max-connections`.
    TooManyRequests,
    /// 503: the server is shutting down.
    Unavailable,
    /// 500: the engine failed.
    Internal,
}

#[derive(Debug, Clone)]
pub struct ApiError {
    pub kind: ErrorKind,
    pub message: String,
    /// The request field at fault (OpenAI's `param`), when there is one.
    pub param: Option<String>,
    /// OpenAI's machine-readable `code` (`model_not_found`, `invalid_api_key`, ...).
    pub code: Option<&'static str>,
    /// Set when the prompt is longer than the model's context: Anthropic clients recognise
    /// that by Anthropic's own wording (Claude Code's auto-compact looks for "prompt is too
    /// long"), OpenAI clients by the code `context_length_exceeded`.
    pub overflow: Option<Overflow>,
}

/// A prompt over the context: its tokens (or a floor on them) and the most the model takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Overflow {
    pub tokens: usize,
    pub maximum: usize,
}

impl ApiError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        ApiError { kind, message: message.into(), param: None, code: None, overflow: None }
    }

    /// A prompt of `tokens` tokens where the model takes at most `maximum`; `message` says so in
    /// Weft's words (Anthropic's body puts its own wording first).
    pub fn overflow(tokens: usize, maximum: usize, message: impl Into<String>) -> Self {
        ApiError { overflow: Some(Overflow { tokens, maximum }), ..Self::invalid(message).with_code("context_length_exceeded") }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidRequest, message)
    }

    /// A bad value for request field `param`.
    pub fn field(param: &str, message: impl Into<String>) -> Self {
        ApiError { param: Some(param.to_string()), ..Self::invalid(message) }
    }

    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    pub fn status(&self) -> StatusCode {
        match self.kind {
            ErrorKind::InvalidRequest => StatusCode::BAD_REQUEST,
            ErrorKind::Authentication => StatusCode::UNAUTHORIZED,
            ErrorKind::Forbidden => StatusCode::FORBIDDEN,
            ErrorKind::TooManyRequests => StatusCode::TOO_MANY_REQUESTS,
            ErrorKind::NotFound => StatusCode::NOT_FOUND,
            ErrorKind::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ErrorKind::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ErrorKind::Timeout => StatusCode::REQUEST_TIMEOUT,
            ErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The error object alone, in `protocol`'s shape (also what a stream sends when it fails
    /// after the headers are out).
    pub fn body(&self, protocol: Protocol) -> Value {
        match protocol {
            Protocol::OpenAi => {
                let kind = match self.kind {
                    ErrorKind::InvalidRequest | ErrorKind::TooLarge | ErrorKind::MethodNotAllowed | ErrorKind::Timeout => {
                        "invalid_request_error"
                    }
                    ErrorKind::Authentication => "authentication_error",
                    ErrorKind::Forbidden => "permission_error",
                    ErrorKind::TooManyRequests => "rate_limit_error",
                    ErrorKind::NotFound => "not_found_error",
                    ErrorKind::Unavailable => "service_unavailable",
                    ErrorKind::Internal => "server_error",
                };
                json!({"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}})
            }
            Protocol::Anthropic => {
                let kind = match self.kind {
                    ErrorKind::InvalidRequest | ErrorKind::MethodNotAllowed | ErrorKind::Timeout => {
                        "invalid_request_error"
                    }
                    ErrorKind::Authentication => "authentication_error",
                    ErrorKind::Forbidden => "permission_error",
                    ErrorKind::TooManyRequests => "rate_limit_error",
                    ErrorKind::NotFound => "not_found_error",
                    ErrorKind::TooLarge => "request_too_large",
                    ErrorKind::Unavailable => "overloaded_error",
                    ErrorKind::Internal => "api_error",
                };
                let message = match self.overflow {
                    Some(o) => format!("prompt is too long: {} tokens > {} maximum ({})", o.tokens, o.maximum, self.message),
                    None => self.message.clone(),
                };
                json!({"type": "error", "error": {"type": kind, "message": message}})
            }
        }
    }

    pub fn into_response(self, protocol: Protocol) -> Response {
        json_response(self.status(), &self.body(protocol))
    }

    /// An engine error from `submit`: the request's fault (400: bad values, a prompt over the
    /// context, more KV than the whole budget, a template that rejects the conversation), 503
    /// once the engine has shut down, 500 when the engine itself failed.
    pub fn from_engine(e: weft::Error) -> Self {
        use weft::ErrorCode as C;
        match (e.code(), e) {
            // The engine's structured field errors carry the key: no message is parsed.
            (C::InvalidArgument, weft::Error::Field { key, message }) => Self::field(&key, message),
            (C::InvalidArgument | C::Capacity, weft::Error::InvalidRequest(m) | weft::Error::Capacity(m) | weft::Error::Tokenizer(m)) => {
                Self::invalid(m)
            }
            (C::EngineClosed, _) => Self::new(ErrorKind::Unavailable, "the server is shutting down"),
            (C::EngineFailed, e) => Self::new(ErrorKind::Unavailable, e.to_string()),
            (_, other) => Self::new(ErrorKind::Internal, other.to_string()),
        }
    }
}

pub fn json_response(status: StatusCode, body: &Value) -> Response {
    (status, [(axum::http::header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}
