//! The Anthropic Messages protocol: `POST /v1/messages` (streaming event grammar and not) and
//! `POST /v1/messages/count_tokens`.
//!
//! Text content only: the system prompt (a string or text blocks) becomes the first message
//! with role `system`, then the turns go through the model's chat template. Stream grammar:
//! `message_start`, `content_block_start`, `ping`, `content_block_delta`*, `content_block_stop`,
//! `message_delta` (stop reason, usage), `message_stop`; a failure after the headers is an
//! `error` event.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use weft::engine::{Event, Input, Request, StopCause, Usage};
use weft::generate::FinishReason;
use weft::tokenizer::ChatMessage;

use super::errors::{json_response, ApiError, ErrorKind, Protocol};
use super::params::{self, get, opt_bool, opt_count, opt_ranged, Object};
use super::state::{sse_event, AppState, EventStream, Generation, StreamEncoder};
use super::BODY_LIMIT;

pub async fn messages(State(state): State<Arc<AppState>>, req: axum::extract::Request) -> Response {
    let arrived = Instant::now();
    match messages_inner(&state, req.into_body(), arrived).await {
        Ok(r) => r,
        Err(e) => e.into_response(Protocol::Anthropic),
    }
}

pub async fn count_tokens(State(state): State<Arc<AppState>>, req: axum::extract::Request) -> Response {
    let result = async {
        let body = params::read_body(req.into_body(), BODY_LIMIT).await?;
        state.check_model(body.get("model"))?;
        let prompt = state.tokenize_messages(&conversation(&body)?)?;
        Ok::<_, ApiError>(json_response(StatusCode::OK, &json!({"input_tokens": prompt.len()})))
    }
    .await;
    result.unwrap_or_else(|e| e.into_response(Protocol::Anthropic))
}

/// Text of a `content` (or `system`) value: a string or an array of text blocks.
fn blocks_text(v: &Value, param: &str) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut text = String::new();
            for b in blocks {
                match (b.get("type").and_then(Value::as_str), b.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(t)) => text.push_str(t),
                    (Some("text"), None) => {
                        return Err(ApiError::field(param, format!("`{param}`: a text block needs a string `text`")))
                    }
                    (Some(other), _) => {
                        return Err(ApiError::field(
                            param,
                            format!("`{param}`: only text content blocks are supported, got {other:?}"),
                        ))
                    }
                    (None, _) => {
                        return Err(ApiError::field(param, format!("`{param}`: a content block needs a `type`")))
                    }
                }
            }
            Ok(text)
        }
        _ => Err(ApiError::field(param, format!("`{param}` must be a string or an array of content blocks"))),
    }
}

/// `system` first (as a system message), then `messages` (user / assistant turns).
fn conversation(body: &Object) -> Result<Vec<ChatMessage>, ApiError> {
    let mut out = Vec::new();
    if let Some(system) = get(body, "system") {
        let text = blocks_text(system, "system")?;
        if !text.is_empty() {
            out.push(ChatMessage::new("system", text));
        }
    }
    let list = match get(body, "messages") {
        Some(Value::Array(a)) if !a.is_empty() => a,
        Some(Value::Array(_)) => return Err(ApiError::field("messages", "`messages` must not be empty")),
        None => return Err(ApiError::field("messages", "`messages` is required")),
        Some(_) => return Err(ApiError::field("messages", "`messages` must be an array")),
    };
    for (i, m) in list.iter().enumerate() {
        let param = format!("messages.{i}");
        let m = m.as_object().ok_or_else(|| ApiError::field(&param, format!("`{param}` must be an object")))?;
        let role = match get(m, "role").and_then(Value::as_str) {
            Some(r @ ("user" | "assistant")) => r,
            Some(other) => {
                return Err(ApiError::field(&param, format!("`{param}.role` must be user or assistant, got {other:?}")))
            }
            None => return Err(ApiError::field(&param, format!("`{param}.role` is required"))),
        };
        let content =
            get(m, "content").ok_or_else(|| ApiError::field(&param, format!("`{param}.content` is required")))?;
        out.push(ChatMessage::new(role, blocks_text(content, &format!("{param}.content"))?));
    }
    Ok(out)
}

async fn messages_inner(state: &Arc<AppState>, body: Body, arrived: Instant) -> Result<Response, ApiError> {
    state.check_open()?;
    let body = params::read_body(body, BODY_LIMIT).await?;
    state.check_model(body.get("model"))?;
    params::no_tools(&body)?;
    let max_tokens =
        opt_count(&body, "max_tokens", 1)?.ok_or_else(|| ApiError::field("max_tokens", "`max_tokens` is required"))?;
    let stream = opt_bool(&body, "stream")?.unwrap_or(false);
    let messages = conversation(&body)?;
    let prompt = state.tokenize_messages(&messages)?;
    let prompt_len = prompt.len();

    // Anthropic has temperature, top_p and top_k; the rest keep the server defaults.
    let mut sampling_fields = Object::new();
    for key in ["temperature", "top_p", "top_k"] {
        if let Some(v) = get(&body, key) {
            sampling_fields.insert(key.into(), v.clone());
        }
    }
    opt_ranged(&body, "temperature", 0.0, f64::MAX)?;
    let vocab = state.engine.model_info().vocab_size as usize;
    let mut request = Request::new(Input::Tokens(prompt));
    request.max_tokens = max_tokens;
    request.sampling = params::sampling(&sampling_fields, &state.defaults, vocab)?;
    request.stop = params::stop_strings(&body, "stop_sequences")?;
    request.ignore_eos = opt_bool(&body, "ignore_eos")?.unwrap_or(false);
    let generation = state.start(request, arrived)?;
    let id = state.new_id("msg_");

    if stream {
        let encoder = MessageEncoder { state: Arc::clone(state), id, prompt_tokens: prompt_len };
        return Ok((
            StatusCode::OK,
            [(header::CONTENT_TYPE, "text/event-stream"), (header::CACHE_CONTROL, "no-cache")],
            Body::from_stream(EventStream::new(generation, encoder)),
        )
            .into_response());
    }

    let (text, finish_reason, stop, usage) = collect(generation).await?;
    let (stop_reason, stop_sequence) = stop_reason(finish_reason, stop.as_ref());
    Ok(json_response(
        StatusCode::OK,
        &json!({
            "id": id,
            "type": "message",
            "role": "assistant",
            "model": state.model_id,
            "content": [{"type": "text", "text": text}],
            "stop_reason": stop_reason,
            "stop_sequence": stop_sequence,
            "usage": usage_json(&usage),
        }),
    ))
}

fn usage_json(u: &Usage) -> Value {
    json!({
        "input_tokens": u.prompt_tokens - u.cached_tokens.min(u.prompt_tokens),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": u.cached_tokens,
        "output_tokens": u.completion_tokens,
    })
}

fn cancelled_error() -> ApiError {
    ApiError::new(ErrorKind::Unavailable, "the request was cancelled: the server is shutting down")
}

fn engine_error(message: &str) -> ApiError {
    ApiError::new(ErrorKind::Internal, format!("generation failed: {message}"))
}

async fn collect(mut g: Generation) -> Result<(String, FinishReason, Option<StopCause>, Usage), ApiError> {
    let mut text = String::new();
    loop {
        match g.next().await {
            Some(Event::Token { text: t, .. }) => text.push_str(&t),
            Some(Event::Done { finish_reason: FinishReason::Cancelled, .. }) => return Err(cancelled_error()),
            Some(Event::Done { finish_reason, stop, text: tail, usage, .. }) => {
                text.push_str(&tail);
                return Ok((text, finish_reason, stop, usage));
            }
            Some(Event::Error { message }) => return Err(engine_error(&message)),
            None => return Err(engine_error("the engine stopped")),
        }
    }
}

/// Anthropic's `(stop_reason, stop_sequence)` for how the engine finished.
fn stop_reason(reason: FinishReason, stop: Option<&StopCause>) -> (&'static str, Value) {
    match (reason, stop) {
        (FinishReason::Length, _) => ("max_tokens", Value::Null),
        (_, Some(StopCause::StopString { stop })) => ("stop_sequence", json!(stop)),
        _ => ("end_turn", Value::Null),
    }
}

struct MessageEncoder {
    state: Arc<AppState>,
    id: String,
    prompt_tokens: usize,
}

/// A `content_block_delta` with `text` ("" for no text).
fn text_delta(text: &str) -> String {
    if text.is_empty() {
        return String::new();
    }
    sse_event("content_block_delta", &json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}))
}

fn stream_error(e: &ApiError) -> String {
    sse_event("error", &e.body(Protocol::Anthropic))
}

impl StreamEncoder for MessageEncoder {
    fn start(&mut self) -> String {
        let message = json!({
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.state.model_id,
            "content": [],
            "stop_reason": null,
            "stop_sequence": null,
            "usage": {"input_tokens": self.prompt_tokens, "output_tokens": 0},
        });
        sse_event("message_start", &json!({"type": "message_start", "message": message}))
            + &sse_event(
                "content_block_start",
                &json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            )
            + &sse_event("ping", &json!({"type": "ping"}))
    }

    fn event(&mut self, ev: &Event) -> String {
        match ev {
            Event::Token { text, .. } => text_delta(text),
            Event::Done { finish_reason: FinishReason::Cancelled, .. } => stream_error(&cancelled_error()),
            Event::Done { finish_reason, stop, text, usage, .. } => {
                let (stop_reason, stop_sequence) = stop_reason(*finish_reason, stop.as_ref());
                text_delta(text)
                    + &sse_event("content_block_stop", &json!({"type": "content_block_stop", "index": 0}))
                    + &sse_event(
                        "message_delta",
                        &json!({
                            "type": "message_delta",
                            "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                            "usage": usage_json(usage),
                        }),
                    )
                    + &sse_event("message_stop", &json!({"type": "message_stop"}))
            }
            Event::Error { message } => stream_error(&engine_error(message)),
        }
    }

    fn lost(&mut self) -> String {
        stream_error(&engine_error("the engine stopped"))
    }
}
