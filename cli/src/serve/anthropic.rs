//! The Anthropic Messages protocol: `POST /v1/messages` (streaming event grammar and not) and
//! `POST /v1/messages/count_tokens`.
//!
//! Text and tool content: the system prompt (a string or text blocks) becomes the first message
//! with role `system`, then the turns go through the model's chat template; `tool_use` blocks
//! become the assistant's tool calls and `tool_result` blocks `tool` messages. Stream grammar:
//! `message_start`, then per content block (text, or `tool_use` with `input_json_delta`s)
//! `content_block_start`, `content_block_delta`*, `content_block_stop` (a `ping` after the
//! first start), then `message_delta` (stop reason, usage), `message_stop`; a failure after the
//! headers is an `error` event.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use weft::engine::{Event, Input, Request, StopCause, Usage};
use weft::generate::FinishReason;
use weft::tokenizer::{ChatMessage, ToolCall};
use weft::tools::{ToolChoice, ToolDelta, ToolSpec, Tools};

use super::errors::{json_response, ApiError, ErrorKind, Protocol};
use super::openai::MessageImages;
use super::params::{self, get, opt_bool, Object};
use super::state::{sse_event, AppState, EventStream, Generation, StreamEncoder};

pub async fn messages(State(state): State<Arc<AppState>>, req: axum::extract::Request) -> Response {
    let arrived = Instant::now();
    match messages_inner(&state, req, arrived).await {
        Ok(r) => r,
        Err(e) => e.into_response(Protocol::Anthropic),
    }
}

pub async fn count_tokens(State(state): State<Arc<AppState>>, req: axum::extract::Request) -> Response {
    let result = async {
        let body = params::read_body(req, state.limits.body_bytes).await?;
        state.check_model(body.get("model"))?;
        let messages = conversation(&state, &body, None)?;
        // As /v1/messages: text that cannot fit the context is refused before it is tokenized,
        // and one count at a time takes a blocking thread from request preparation.
        state.check_prompt_bytes(messages.iter().map(|m| m.content.len()).sum())?;
        static COUNTING: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);
        let _turn = COUNTING.acquire().await.map_err(|_| ApiError::new(ErrorKind::Unavailable, "shutting down"))?;
        let prompt = state.blocking(move |state| state.tokenize_messages(&messages)).await?;
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
fn conversation(state: &AppState, body: &Object, mut images: Option<&mut MessageImages>) -> Result<Vec<ChatMessage>, ApiError> {
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
    state.limits.check_messages(list.len(), "messages")?;
    for (i, m) in list.iter().enumerate() {
        let param = format!("messages.{i}");
        let m = m.as_object().ok_or_else(|| ApiError::field(&param, format!("`{param}` must be an object")))?;
        let role = match get(m, "role").and_then(Value::as_str) {
            // The engine's one rule and message for roles (the same as /v1/chat/completions).
            Some(r) => {
                weft::tools::check_role(r, &format!("messages[{i}].role")).map_err(|e| ApiError::field(&e.param, e.message))?;
                // Anthropic's protocol: the system prompt is the `system` field, tool results
                // are user blocks.
                if !matches!(r, "user" | "assistant") {
                    return Err(ApiError::field(
                        &param,
                        format!("`{param}.role` {r:?} is not a turn role on /v1/messages (user or assistant; the system prompt goes in `system`)"),
                    ));
                }
                r
            }
            None => return Err(ApiError::field(&param, format!("`{param}.role` is required"))),
        };
        let content =
            get(m, "content").ok_or_else(|| ApiError::field(&param, format!("`{param}.content` is required")))?;
        turn_messages(role, content, &format!("{param}.content"), &mut out, images.as_deref_mut())?;
    }
    Ok(out)
}

/// One turn's content: text, plus `tool_use` blocks (assistant) as tool calls and
/// `tool_result` blocks (user) as `tool` messages, which come before the turn's text.
fn turn_messages(
    role: &str,
    content: &Value,
    param: &str,
    out: &mut Vec<ChatMessage>,
    mut images: Option<&mut MessageImages>,
) -> Result<(), ApiError> {
    let Value::Array(blocks) = content else {
        out.push(ChatMessage::new(role, blocks_text(content, param)?));
        return Ok(());
    };
    // With images, each text block is trimmed (Gemma 3's template trims list parts) and an
    // image block becomes the model's begin-of-image marker where it stands.
    let has_images = blocks.iter().any(|b| b.get("type").and_then(Value::as_str) == Some("image"));
    let mut text_blocks = Vec::new();
    let mut calls = Vec::new();
    for (j, b) in blocks.iter().enumerate() {
        let at = format!("{param}.{j}");
        let bad = |what: &str| ApiError::field(&at, format!("`{at}` {what}"));
        match (role, b.get("type").and_then(Value::as_str)) {
            ("assistant", Some("tool_use")) => {
                let id = b.get("id").and_then(Value::as_str).ok_or_else(|| bad("(tool_use) needs a string `id`"))?;
                let name = b.get("name").and_then(Value::as_str).ok_or_else(|| bad("(tool_use) needs a string `name`"))?;
                let input = b.get("input").filter(|v| v.is_object()).ok_or_else(|| bad("(tool_use) needs an object `input`"))?;
                calls.push(ToolCall { id: id.into(), name: name.into(), arguments: input.to_string() });
            }
            ("user", Some("tool_result")) => {
                let id = b
                    .get("tool_use_id")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad("(tool_result) needs a string `tool_use_id`"))?;
                let result = match b.get("content") {
                    None | Some(Value::Null) => String::new(),
                    Some(c) => blocks_text(c, &format!("{at}.content"))?,
                };
                let is_error = b.get("is_error").and_then(Value::as_bool).unwrap_or(false);
                let result = if is_error { format!("Error: {result}") } else { result };
                out.push(ChatMessage { tool_call_id: Some(id.into()), ..ChatMessage::new("tool", result) });
            }
            (_, Some(kind @ ("audio" | "input_audio" | "audio_url"))) => {
                return Err(ApiError::field(
                    &at,
                    format!(
                        "`{at}`: {kind} blocks are not accepted on /v1/messages (the Anthropic API has no audio input); \
                         send audio to /v1/chat/completions as an OpenAI `input_audio` part"
                    ),
                ));
            }
            ("user", Some("image")) => {
                let Some(images) = images.as_deref_mut() else {
                    return Err(ApiError::field(&at, "this model takes no images (it has no vision tower)".to_string()));
                };
                let source = b.get("source").ok_or_else(|| bad("(image) needs a `source`"))?;
                let url = match (source.get("type").and_then(Value::as_str), source.get("data"), source.get("url")) {
                    (Some("base64"), Some(Value::String(data)), _) => {
                        let media = source.get("media_type").and_then(Value::as_str).unwrap_or("image/png");
                        format!("data:{media};base64,{data}")
                    }
                    (Some("url"), _, Some(Value::String(url))) => url.clone(),
                    _ => return Err(bad("(image) `source` must be {type: base64, media_type, data} or {type: url, url}")),
                };
                images.add(&url, &at)?;
                text_blocks.push(serde_json::json!({"type": "text", "text": images.marker}));
            }
            _ if has_images && b.get("type").and_then(Value::as_str) == Some("text") => {
                let mut b = b.clone();
                if let Some(t) = b.get("text").and_then(Value::as_str).map(|t| t.trim().to_string()) {
                    b["text"] = Value::String(t);
                }
                text_blocks.push(b);
            }
            _ => text_blocks.push(b.clone()),
        }
    }
    let text = blocks_text(&Value::Array(text_blocks), param)?;
    if !text.is_empty() || !calls.is_empty() || out.last().is_none_or(|m| m.role != "tool") {
        out.push(ChatMessage { tool_calls: calls, ..ChatMessage::new(role, text) });
    }
    Ok(())
}

/// Anthropic `tools` (`[{"name", "description"?, "input_schema"}]`) and `tool_choice`
/// (`auto` / `any` / `tool` + name / `none`, `disable_parallel_tool_use`).
fn request_tools(body: &Object) -> Result<Option<Tools>, ApiError> {
    let specs = match get(body, "tools") {
        None => Vec::new(),
        Some(Value::Array(list)) => list
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let param = format!("tools.{i}");
                let schema = t.get("input_schema").ok_or_else(|| {
                    ApiError::field(&param, format!("`{param}.input_schema` is required (a JSON Schema object)"))
                })?;
                // The OpenAI function shape, which is what templates are given.
                let mut function = json!({"name": t.get("name").cloned().unwrap_or(Value::Null)});
                if let Some(d) = t.get("description") {
                    function["description"] = d.clone();
                }
                function["parameters"] = schema.clone();
                ToolSpec::parse(&json!({"type": "function", "function": function}), &param)
                    .map_err(|e| ApiError::field(&param, e.message.replace(&format!("{param}.function.parameters"), &format!("{param}.input_schema")).replace(&format!("{param}.function."), &format!("{param}."))))
            })
            .collect::<Result<Vec<_>, _>>()?,
        Some(_) => return Err(ApiError::field("tools", "`tools` must be an array")),
    };
    let (choice, parallel) = match get(body, "tool_choice") {
        None => (ToolChoice::Auto, true),
        Some(c) => {
            let parallel = !c.get("disable_parallel_tool_use").and_then(Value::as_bool).unwrap_or(false);
            let choice = match c.get("type").and_then(Value::as_str) {
                Some("auto") => ToolChoice::Auto,
                Some("any") => ToolChoice::Required,
                Some("none") => ToolChoice::None,
                Some("tool") => match c.get("name").and_then(Value::as_str) {
                    Some(name) => ToolChoice::Function(name.into()),
                    None => return Err(ApiError::field("tool_choice", "`tool_choice` of type tool needs a `name`")),
                },
                _ => {
                    return Err(ApiError::field(
                        "tool_choice",
                        "`tool_choice.type` must be auto, any, tool or none",
                    ))
                }
            };
            (choice, parallel)
        }
    };
    Tools::from_parts(specs, choice, parallel).map_err(|e| {
        ApiError::field(&e.param, e.message.replace("\"required\"", "\"any\""))
    })
}

/// A tool call's `input`: its arguments as a JSON object (`{}` when they do not parse, e.g.
/// cut short by `max_tokens`).
fn tool_input(arguments: &str) -> Value {
    serde_json::from_str::<Value>(arguments).ok().filter(Value::is_object).unwrap_or_else(|| json!({}))
}

async fn messages_inner(
    state: &Arc<AppState>,
    req: axum::extract::Request,
    arrived: Instant,
) -> Result<Response, ApiError> {
    state.check_open()?;
    let body = params::read_body(req, state.limits.body_bytes).await?;
    state.check_model(body.get("model"))?;
    let tools = request_tools(&body)?;
    if get(&body, "max_tokens").is_none() {
        return Err(ApiError::field("max_tokens", "`max_tokens` is required"));
    }
    // Anthropic has temperature, top_p, top_k and stop_sequences; the rest keep the server
    // defaults.
    let mut request = Request::new(Input::Messages(Vec::new()));
    params::generation(&body, &params::ANTHROPIC, "max_tokens", &state.defaults, &mut request)?;
    state.limits.check_max_tokens(request.max_tokens, "max_tokens")?;
    let stream = opt_bool(&body, "stream")?.unwrap_or(false);
    let mut images = MessageImages::for_model(state);
    let messages = conversation(state, &body, images.as_mut())?;
    let images = images.map(|i| i.bytes).unwrap_or_default();
    if !images.is_empty() && tools.is_some() {
        return Err(ApiError::field("tools", "`tools` together with images is not supported yet".to_string()));
    }
    state.check_prompt_bytes(messages.iter().map(|m| m.content.len()).sum())?;
    // The engine renders the conversation (with the server's --chat-template, tools and image
    // markers), tokenizes it and checks it: one request path for every face.
    let chat_template = state.chat_template.clone();
    let generation = state
        .blocking(move |state| {
            state.start(Request { input: Input::Messages(messages), tools, images, chat_template, ..request }, arrived)
        })
        .await?;
    let id = state.new_id("msg_");

    if stream {
        let encoder = MessageEncoder {
            state: Arc::clone(state),
            id,
            block: 0,
            in_text: true,
        };
        return Ok((
            StatusCode::OK,
            [(header::CONTENT_TYPE, "text/event-stream"), (header::CACHE_CONTROL, "no-cache")],
            Body::from_stream(EventStream::new(generation, encoder)),
        )
            .into_response());
    }

    let (text, finish_reason, stop, usage, calls) = collect(generation).await?;
    let (stop_reason, stop_sequence) = stop_reason(finish_reason, stop.as_ref());
    let mut content = Vec::new();
    if !text.is_empty() || calls.is_empty() {
        content.push(json!({"type": "text", "text": text}));
    }
    for c in &calls {
        content.push(json!({"type": "tool_use", "id": c.id, "name": c.name, "input": tool_input(&c.arguments)}));
    }
    Ok(json_response(
        StatusCode::OK,
        &json!({
            "id": id,
            "type": "message",
            "role": "assistant",
            "model": state.model_id,
            "content": content,
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

type Collected = (String, FinishReason, Option<StopCause>, Usage, Vec<ToolCall>);

async fn collect(mut g: Generation) -> Result<Collected, ApiError> {
    let mut text = String::new();
    loop {
        match g.next().await {
            Some(Event::Token { text: t, .. }) => text.push_str(&t),
            Some(Event::Done { finish_reason: FinishReason::Cancelled, .. }) => return Err(cancelled_error()),
            Some(Event::Done { finish_reason, stop, text: tail, usage, tool_calls, .. }) => {
                text.push_str(&tail);
                return Ok((text, finish_reason, stop, usage, tool_calls));
            }
            Some(Event::Started { .. }) => {}
            Some(Event::Error { message }) => return Err(engine_error(&message)),
            None => return Err(engine_error("the engine stopped")),
        }
    }
}

/// Anthropic's `(stop_reason, stop_sequence)` for how the engine finished.
fn stop_reason(reason: FinishReason, stop: Option<&StopCause>) -> (&'static str, Value) {
    match (reason, stop) {
        (FinishReason::Length, _) => ("max_tokens", Value::Null),
        (FinishReason::ToolCalls, _) => ("tool_use", Value::Null),
        (_, Some(StopCause::StopString { stop })) => ("stop_sequence", json!(stop)),
        _ => ("end_turn", Value::Null),
    }
}

struct MessageEncoder {
    state: Arc<AppState>,
    id: String,
    /// The open content block's index, and whether it is text (else a tool_use).
    block: usize,
    in_text: bool,
}

impl MessageEncoder {
    /// A `content_block_delta` with `text` ("" for no text), in a text block (opened if the
    /// open block is a tool call).
    fn text_delta(&mut self, text: &str) -> String {
        if text.is_empty() {
            return String::new();
        }
        let mut out = String::new();
        if !self.in_text {
            out += &self.stop_block();
            self.block += 1;
            self.in_text = true;
            out += &sse_event(
                "content_block_start",
                &json!({"type": "content_block_start", "index": self.block, "content_block": {"type": "text", "text": ""}}),
            );
        }
        out + &sse_event(
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": self.block, "delta": {"type": "text_delta", "text": text}}),
        )
    }

    fn stop_block(&self) -> String {
        sse_event("content_block_stop", &json!({"type": "content_block_stop", "index": self.block}))
    }

    /// Tool calls as blocks: a call's start closes the open block and opens a `tool_use`
    /// block; argument fragments are `input_json_delta`s.
    fn tool_deltas(&mut self, deltas: &[ToolDelta]) -> String {
        let mut out = String::new();
        for d in deltas {
            match d {
                ToolDelta::Start { id, name, .. } => {
                    out += &self.stop_block();
                    self.block += 1;
                    self.in_text = false;
                    out += &sse_event(
                        "content_block_start",
                        &json!({"type": "content_block_start", "index": self.block,
                                "content_block": {"type": "tool_use", "id": id, "name": name, "input": {}}}),
                    );
                }
                ToolDelta::Arguments { fragment, .. } => {
                    out += &sse_event(
                        "content_block_delta",
                        &json!({"type": "content_block_delta", "index": self.block,
                                "delta": {"type": "input_json_delta", "partial_json": fragment}}),
                    );
                }
            }
        }
        out
    }
}

fn stream_error(e: &ApiError) -> String {
    sse_event("error", &e.body(Protocol::Anthropic))
}

impl StreamEncoder for MessageEncoder {
    /// `message_start` waits for the engine's `Started`: its usage is the prompt as the engine
    /// rendered and tokenized it (images and audio expanded).
    fn start(&mut self) -> String {
        String::new()
    }

    fn event(&mut self, ev: &Event) -> String {
        match ev {
            Event::Started { prompt_tokens, cached_tokens } => {
                let usage = Usage { prompt_tokens: *prompt_tokens, cached_tokens: *cached_tokens, ..Usage::default() };
                let message = json!({
                    "id": self.id,
                    "type": "message",
                    "role": "assistant",
                    "model": self.state.model_id,
                    "content": [],
                    "stop_reason": null,
                    "stop_sequence": null,
                    "usage": usage_json(&usage),
                });
                sse_event("message_start", &json!({"type": "message_start", "message": message}))
                    + &sse_event(
                        "content_block_start",
                        &json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
                    )
                    + &sse_event("ping", &json!({"type": "ping"}))
            }
            Event::Token { text, tool_calls, .. } => self.text_delta(text) + &self.tool_deltas(tool_calls),
            Event::Done { finish_reason: FinishReason::Cancelled, .. } => stream_error(&cancelled_error()),
            Event::Done { finish_reason, stop, text, usage, tool_deltas, .. } => {
                let (stop_reason, stop_sequence) = stop_reason(*finish_reason, stop.as_ref());
                self.text_delta(text)
                    + &self.tool_deltas(tool_deltas)
                    + &self.stop_block()
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
