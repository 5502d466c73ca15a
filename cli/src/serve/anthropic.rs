//! The Anthropic Messages protocol: `POST /v1/messages` (streaming event grammar and not) and
//! `POST /v1/messages/count_tokens`.
//!
//! Text and tool content: the system prompt (a string or text blocks, and any `system`-role
//! messages, merged as the Anthropic API merges them) becomes the first message with role
//! `system`, then the turns go through the model's chat template; `tool_use` blocks become the
//! assistant's tool calls, `thinking` blocks its reasoning, and `tool_result` blocks (text and
//! images) `tool` messages. Stream grammar: `message_start`, then per content block (thinking
//! with `thinking_delta`s and a `signature_delta`, text, or `tool_use` with `input_json_delta`s)
//! `content_block_start`, `content_block_delta`*, `content_block_stop` (a `ping` after the
//! first start), then `message_delta` (stop reason, usage), `message_stop`; a failure after the
//! headers is an `error` event. Unknown fields (`metadata`, `cache_control`, `context_management`,
//! ...) and `anthropic-beta` headers are ignored; the `?beta=true` query is accepted.

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
        // The very request /v1/messages would submit (`max_tokens` optional here), counted by
        // the engine as it would prefill it: system, tools, thinking settings, images.
        let request = engine_request(&state, &body, false)?;
        // One count at a time takes a blocking thread from request preparation.
        static COUNTING: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);
        let _turn = COUNTING.acquire().await.map_err(|_| ApiError::new(ErrorKind::Unavailable, "shutting down"))?;
        let tokens =
            state.blocking(move |state| state.engine.count_prompt_tokens(request).map_err(ApiError::from_engine)).await?;
        Ok::<_, ApiError>(json_response(StatusCode::OK, &json!({"input_tokens": tokens})))
    }
    .await;
    result.unwrap_or_else(|e| e.into_response(Protocol::Anthropic))
}

/// The engine request of a Messages body (also what `count_tokens` counts): the conversation
/// with its images, tools, sampling fields and thinking settings, the server's template.
/// `max_tokens` is required unless `for_generation` is false (counting).
fn engine_request(state: &AppState, body: &Object, for_generation: bool) -> Result<Request, ApiError> {
    let tools = request_tools(body)?;
    if for_generation && get(body, "max_tokens").is_none() {
        return Err(ApiError::field("max_tokens", "max_tokens: Field required"));
    }
    // Anthropic has temperature, top_p, top_k and stop_sequences; the rest keep the server
    // defaults.
    let mut request = Request::new(Input::Messages(Vec::new()));
    params::generation(body, &params::ANTHROPIC, "max_tokens", &state.defaults, &mut request)?;
    state.limits.check_max_tokens(request.max_tokens, "max_tokens")?;
    thinking(body, &mut request)?;
    let mut images = MessageImages::for_model(state);
    let messages = conversation(state, body, images.as_mut())?;
    // Text that cannot fit the context is refused before it is tokenized.
    state.check_prompt_bytes(messages.iter().map(|m| m.content.len()).sum())?;
    Ok(Request {
        input: Input::Messages(messages),
        tools,
        images: images.map(|i| i.bytes).unwrap_or_default(),
        chat_template: state.chat_template.clone(),
        ..request
    })
}

/// `thinking`: `{type: "enabled", budget_tokens}` turns the template's thinking on
/// (`enable_thinking`) with that reasoning budget, `{type: "adaptive"}` on without a budget,
/// `{type: "disabled"}` off.
fn thinking(body: &Object, request: &mut Request) -> Result<(), ApiError> {
    let t = match get(body, "thinking") {
        None => return Ok(()),
        Some(Value::Object(t)) => t,
        Some(_) => return Err(ApiError::field("thinking", "thinking: must be an object")),
    };
    let on = match t.get("type").and_then(Value::as_str) {
        Some("enabled") => {
            match t.get("budget_tokens") {
                None | Some(Value::Null) => {}
                Some(b) => match b.as_u64() {
                    Some(n) if n >= 1 => request.reasoning_budget = Some(n as usize),
                    _ => return Err(ApiError::field("thinking", "thinking.budget_tokens: must be a positive integer")),
                },
            }
            true
        }
        Some("adaptive") => true,
        Some("disabled") => false,
        _ => return Err(ApiError::field("thinking", "thinking.type: must be \"enabled\", \"adaptive\" or \"disabled\"")),
    };
    request.chat_template_kwargs.insert("enable_thinking".into(), Value::Bool(on));
    Ok(())
}

/// Text of a `content` value (a string or an array of blocks): `text` blocks joined, and
/// `image` blocks, when `images` collects them (a model with a vision tower), as the model's
/// image marker where they stand (text blocks beside an image are trimmed, as Gemma's
/// templates trim a list of parts).
fn blocks_text(v: &Value, param: &str, mut images: Option<&mut MessageImages>) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let has_images = blocks.iter().any(|b| b.get("type").and_then(Value::as_str) == Some("image"));
            let mut text = String::new();
            for (j, b) in blocks.iter().enumerate() {
                let at = format!("{param}.{j}");
                match (b.get("type").and_then(Value::as_str), b.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(t)) => text.push_str(if has_images { t.trim() } else { t }),
                    (Some("text"), None) => {
                        return Err(ApiError::field(&at, format!("{at}.text: Field required (a string)")))
                    }
                    (Some("image"), _) => text.push_str(&image_block(b, &at, images.as_deref_mut())?),
                    (Some(kind @ ("audio" | "input_audio" | "audio_url")), _) => return Err(audio_block(kind, &at)),
                    (Some(other), _) => {
                        return Err(ApiError::field(
                            &at,
                            format!("{at}: {other:?} content blocks are not supported here (text and image blocks are)"),
                        ))
                    }
                    (None, _) => return Err(ApiError::field(&at, format!("{at}.type: Field required"))),
                }
            }
            Ok(text)
        }
        _ => Err(ApiError::field(param, format!("{param}: must be a string or an array of content blocks"))),
    }
}

/// An `image` block: its bytes go to `images`; the marker text it stands for is returned.
fn image_block(b: &Value, at: &str, images: Option<&mut MessageImages>) -> Result<String, ApiError> {
    let Some(images) = images else {
        return Err(ApiError::field(at, "this model takes no images (it has no vision tower)".to_string()));
    };
    let bad = |what: &str| ApiError::field(at, format!("`{at}` {what}"));
    let source = b.get("source").ok_or_else(|| bad("(image) needs a `source`"))?;
    let url = match (source.get("type").and_then(Value::as_str), source.get("data"), source.get("url")) {
        (Some("base64"), Some(Value::String(data)), _) => {
            let media = source.get("media_type").and_then(Value::as_str).unwrap_or("image/png");
            format!("data:{media};base64,{data}")
        }
        (Some("url"), _, Some(Value::String(url))) => url.clone(),
        _ => return Err(bad("(image) `source` must be {type: base64, media_type, data} or {type: url, url}")),
    };
    images.add(&url, at)?;
    Ok(images.marker.clone())
}

fn audio_block(kind: &str, at: &str) -> ApiError {
    ApiError::field(
        at,
        format!(
            "`{at}`: {kind} blocks are not accepted on /v1/messages (the Anthropic API has no audio input); \
             send audio to /v1/chat/completions as an OpenAI `input_audio` part"
        ),
    )
}

/// The system prompt (`system`, then the text of any `system`-role messages in `messages`,
/// merged as the Anthropic API merges them: Claude Code sends some), then the user /
/// assistant turns.
fn conversation(state: &AppState, body: &Object, mut images: Option<&mut MessageImages>) -> Result<Vec<ChatMessage>, ApiError> {
    let list = match get(body, "messages") {
        Some(Value::Array(a)) if !a.is_empty() => a,
        Some(Value::Array(_)) => return Err(ApiError::field("messages", "messages: must not be empty")),
        None => return Err(ApiError::field("messages", "messages: Field required")),
        Some(_) => return Err(ApiError::field("messages", "messages: must be an array")),
    };
    state.limits.check_messages(list.len(), "messages")?;
    let mut system = Vec::new();
    if let Some(s) = get(body, "system") {
        system.push(blocks_text(s, "system", None)?);
    }
    let mut turns = Vec::new();
    for (i, m) in list.iter().enumerate() {
        let param = format!("messages.{i}");
        let m = m.as_object().ok_or_else(|| ApiError::field(&param, format!("{param}: must be an object")))?;
        let role = match get(m, "role").and_then(Value::as_str) {
            // The engine's one rule and message for roles (the same as /v1/chat/completions).
            Some(r) => {
                weft::tools::check_role(r, &format!("messages[{i}].role")).map_err(|e| ApiError::field(&e.param, e.message))?;
                // Anthropic's protocol: tool results are user blocks.
                if !matches!(r, "user" | "assistant" | "system") {
                    return Err(ApiError::field(
                        &param,
                        format!("{param}.role: Input should be 'user' or 'assistant' (got {r:?}; the system prompt goes in `system`)"),
                    ));
                }
                r
            }
            None => return Err(ApiError::field(&param, format!("{param}.role: Field required"))),
        };
        let content = get(m, "content").ok_or_else(|| ApiError::field(&param, format!("{param}.content: Field required")))?;
        if role == "system" {
            system.push(blocks_text(content, &format!("{param}.content"), None)?);
            continue;
        }
        turn_messages(role, content, &format!("{param}.content"), &mut turns, images.as_deref_mut())?;
    }
    if turns.is_empty() {
        return Err(ApiError::field("messages", "messages: at least one user or assistant message is required"));
    }
    let system: Vec<String> = system.into_iter().filter(|s| !s.is_empty()).collect();
    let mut out = Vec::with_capacity(turns.len() + 1);
    if !system.is_empty() {
        out.push(ChatMessage::new("system", system.join("\n\n")));
    }
    out.extend(turns);
    Ok(out)
}

/// One turn's content: text (and images), plus `tool_use` blocks (assistant) as tool calls,
/// `thinking` blocks (assistant) as the turn's reasoning, and `tool_result` blocks (user) as
/// `tool` messages, which come before the turn's text. `redacted_thinking` blocks are
/// accepted and dropped (nothing a local model can read).
fn turn_messages(
    role: &str,
    content: &Value,
    param: &str,
    out: &mut Vec<ChatMessage>,
    mut images: Option<&mut MessageImages>,
) -> Result<(), ApiError> {
    let Value::Array(blocks) = content else {
        out.push(ChatMessage::new(role, blocks_text(content, param, None)?));
        return Ok(());
    };
    let mut text_blocks = Vec::new();
    let mut calls = Vec::new();
    let mut reasoning: Option<String> = None;
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
            ("assistant", Some("thinking")) => {
                let t = b.get("thinking").and_then(Value::as_str).ok_or_else(|| bad("(thinking) needs a string `thinking`"))?;
                reasoning.get_or_insert_with(String::new).push_str(t);
            }
            ("assistant", Some("redacted_thinking")) => {}
            ("user", Some("tool_result")) => {
                let id = b
                    .get("tool_use_id")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad("(tool_result) needs a string `tool_use_id`"))?;
                let result = match b.get("content") {
                    None | Some(Value::Null) => String::new(),
                    Some(c) => blocks_text(c, &format!("{at}.content"), images.as_deref_mut())?,
                };
                let is_error = b.get("is_error").and_then(Value::as_bool).unwrap_or(false);
                let result = if is_error { format!("Error: {result}") } else { result };
                out.push(ChatMessage { tool_call_id: Some(id.into()), ..ChatMessage::new("tool", result) });
            }
            _ => text_blocks.push(b.clone()),
        }
    }
    let text = blocks_text(&Value::Array(text_blocks), param, images)?;
    if !text.is_empty() || !calls.is_empty() || reasoning.is_some() || out.last().is_none_or(|m| m.role != "tool") {
        out.push(ChatMessage { tool_calls: calls, reasoning_content: reasoning, ..ChatMessage::new(role, text) });
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
            // Anthropic's server and built-in tools (`web_search_…`, `bash_…`, `text_editor_…`:
            // a `type` other than `custom`, no `input_schema`) are run by Anthropic's servers or
            // described by its schemas: nothing a local model can be shown, so they are left out.
            .filter(|(_, t)| {
                t.get("input_schema").is_some() || t.get("type").and_then(Value::as_str).is_none_or(|k| k == "custom")
            })
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
    let stream = opt_bool(&body, "stream")?.unwrap_or(false);
    let request = engine_request(state, &body, true)?;
    // The engine renders the conversation (with the server's --chat-template, tools, thinking
    // settings and image markers), tokenizes it and checks it: one request path for every face.
    let generation = state.blocking(move |state| state.start(request, arrived)).await?;
    let id = state.new_id("msg_");

    if stream {
        let encoder = MessageEncoder { model: state.model_id.clone(), id, next: 0, open: Block::None };
        return Ok((
            StatusCode::OK,
            [(header::CONTENT_TYPE, "text/event-stream"), (header::CACHE_CONTROL, "no-cache")],
            Body::from_stream(EventStream::new(generation, encoder)),
        )
            .into_response());
    }

    let done = collect(generation).await?;
    let (stop_reason, stop_sequence) = stop_reason(done.finish_reason, done.stop.as_ref());
    let mut content = Vec::new();
    if !done.reasoning.is_empty() {
        content.push(json!({"type": "thinking", "thinking": done.reasoning, "signature": SIGNATURE}));
    }
    if !done.text.is_empty() || done.calls.is_empty() {
        content.push(json!({"type": "text", "text": done.text}));
    }
    for c in &done.calls {
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
            "usage": usage_json(&done.usage),
        }),
    ))
}

/// The `signature` of a `thinking` block. Anthropic signs its models' thinking so that it can
/// verify what clients send back; Weft has nothing to verify, and clients only need a string
/// to carry (history `thinking` blocks are accepted whatever their signature).
const SIGNATURE: &str = "weft-unsigned";

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

/// A finished non-streaming generation: the engine's events put together.
struct Collected {
    text: String,
    reasoning: String,
    finish_reason: FinishReason,
    stop: Option<StopCause>,
    usage: Usage,
    calls: Vec<ToolCall>,
}

async fn collect(mut g: Generation) -> Result<Collected, ApiError> {
    let mut text = String::new();
    let mut reasoning = String::new();
    loop {
        match g.next().await {
            Some(Event::Token { text: t, reasoning: r, .. }) => {
                text.push_str(&t);
                reasoning.push_str(&r);
            }
            Some(Event::Done { finish_reason: FinishReason::Cancelled, .. }) => return Err(cancelled_error()),
            Some(Event::Done { finish_reason, stop, text: tail, reasoning: r, usage, tool_calls, .. }) => {
                text.push_str(&tail);
                reasoning.push_str(&r);
                return Ok(Collected { text, reasoning, finish_reason, stop, usage, calls: tool_calls });
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

/// The kind of the open content block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Block {
    None,
    Thinking,
    Text,
    ToolUse,
}

/// The Messages stream: blocks open as the engine's events need them (reasoning → a
/// `thinking` block, text → a `text` block, a call's start → a `tool_use` block), each closed
/// when the next opens.
struct MessageEncoder {
    /// The served model id.
    model: String,
    id: String,
    /// The open block's index (or the next one's, when none is open).
    next: usize,
    open: Block,
}

impl MessageEncoder {
    /// Closes the open block and opens one of `kind`; the first block is followed by a `ping`.
    fn open(&mut self, kind: Block, content_block: Value) -> String {
        let mut out = self.close();
        out += &sse_event(
            "content_block_start",
            &json!({"type": "content_block_start", "index": self.next, "content_block": content_block}),
        );
        if self.next == 0 {
            out += &sse_event("ping", &json!({"type": "ping"}));
        }
        self.open = kind;
        out
    }

    /// Closes the open block (a thinking block gets its signature first).
    fn close(&mut self) -> String {
        let mut out = String::new();
        match self.open {
            Block::None => return out,
            Block::Thinking => out += &self.delta(json!({"type": "signature_delta", "signature": SIGNATURE})),
            Block::Text | Block::ToolUse => {}
        }
        out += &sse_event("content_block_stop", &json!({"type": "content_block_stop", "index": self.next}));
        self.next += 1;
        self.open = Block::None;
        out
    }

    fn delta(&self, delta: Value) -> String {
        sse_event("content_block_delta", &json!({"type": "content_block_delta", "index": self.next, "delta": delta}))
    }

    fn thinking_delta(&mut self, reasoning: &str) -> String {
        if reasoning.is_empty() {
            return String::new();
        }
        let mut out = String::new();
        if self.open != Block::Thinking {
            out += &self.open(Block::Thinking, json!({"type": "thinking", "thinking": "", "signature": ""}));
        }
        out + &self.delta(json!({"type": "thinking_delta", "thinking": reasoning}))
    }

    fn text_delta(&mut self, text: &str) -> String {
        if text.is_empty() {
            return String::new();
        }
        let mut out = String::new();
        if self.open != Block::Text {
            out += &self.open(Block::Text, json!({"type": "text", "text": ""}));
        }
        out + &self.delta(json!({"type": "text_delta", "text": text}))
    }

    /// Tool calls as blocks: a call's start opens a `tool_use` block; argument fragments are
    /// `input_json_delta`s.
    fn tool_deltas(&mut self, deltas: &[ToolDelta]) -> String {
        let mut out = String::new();
        for d in deltas {
            match d {
                ToolDelta::Start { id, name, .. } => {
                    out += &self.open(Block::ToolUse, json!({"type": "tool_use", "id": id, "name": name, "input": {}}));
                }
                ToolDelta::Arguments { fragment, .. } => {
                    out += &self.delta(json!({"type": "input_json_delta", "partial_json": fragment}));
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
                    "model": self.model,
                    "content": [],
                    "stop_reason": null,
                    "stop_sequence": null,
                    "usage": usage_json(&usage),
                });
                sse_event("message_start", &json!({"type": "message_start", "message": message}))
            }
            Event::Token { text, reasoning, tool_calls, .. } => {
                self.thinking_delta(reasoning) + &self.text_delta(text) + &self.tool_deltas(tool_calls)
            }
            Event::Done { finish_reason: FinishReason::Cancelled, .. } => stream_error(&cancelled_error()),
            Event::Done { finish_reason, stop, text, reasoning, usage, tool_deltas, .. } => {
                let (stop_reason, stop_sequence) = stop_reason(*finish_reason, stop.as_ref());
                let mut out = self.thinking_delta(reasoning) + &self.text_delta(text) + &self.tool_deltas(tool_deltas);
                if self.next == 0 && self.open == Block::None {
                    // An empty answer is still one (empty) text block.
                    out += &self.open(Block::Text, json!({"type": "text", "text": ""}));
                }
                out + &self.close()
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

#[cfg(test)]
mod tests {
    use super::super::state::test_events::{done, token};
    use super::*;

    /// The stream's block grammar from synthetic engine events: reasoning opens a signed
    /// `thinking` block, text a `text` block, a call a `tool_use` block, in order.
    #[test]
    fn reasoning_streams_as_a_signed_thinking_block() {
        let mut e = MessageEncoder { model: "m".into(), id: "msg_1".into(), next: 0, open: Block::None };
        let token = |r: &str, t: &str| token(r, t, vec![]);
        let mut out = e.event(&Event::Started { prompt_tokens: 5, cached_tokens: 0 });
        out += &e.event(&token("Let me", ""));
        out += &e.event(&token(" think.", "Hi"));
        let mut end = done(FinishReason::Stop, Usage { prompt_tokens: 5, completion_tokens: 3, cached_tokens: 0, reasoning_tokens: 2 });
        if let Event::Done { text, .. } = &mut end {
            *text = "!".into();
        }
        out += &e.event(&end);
        let events: Vec<(String, Value)> = out
            .split("\n\n")
            .filter(|f| !f.is_empty())
            .map(|f| {
                let (name, data) = f.split_once('\n').unwrap();
                (name.trim_start_matches("event: ").to_string(), serde_json::from_str(data.trim_start_matches("data: ")).unwrap())
            })
            .collect();
        let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "message_start", "content_block_start", "ping", "content_block_delta", "content_block_delta",
                "content_block_delta", "content_block_stop", "content_block_start", "content_block_delta",
                "content_block_delta", "content_block_stop", "message_delta", "message_stop"
            ]
        );
        assert_eq!(events[1].1["content_block"]["type"], "thinking");
        assert_eq!(events[3].1["delta"], json!({"type": "thinking_delta", "thinking": "Let me"}));
        assert_eq!(events[5].1["delta"]["type"], "signature_delta");
        assert_eq!((events[7].1["index"].as_u64(), events[7].1["content_block"]["type"].as_str()), (Some(1), Some("text")));
        assert_eq!(events[9].1["delta"], json!({"type": "text_delta", "text": "!"}));
    }
}
