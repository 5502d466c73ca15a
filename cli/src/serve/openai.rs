//! The OpenAI protocol: `POST /v1/chat/completions`, `POST /v1/completions` (both streaming as
//! server-sent events and not) and `GET /v1/models`.
//!
//! Shapes follow the OpenAI API reference as the official SDKs parse it; request fields are the
//! OpenAI ones plus mlx_lm.server's extensions (`top_k`, `min_p`, `repetition_penalty`,
//! `repetition_context_size`) and `ignore_eos`.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use weft::engine::{Event, Input, Request, TokenLogprobs, Usage};
use weft::generate::FinishReason;
use weft::tokenizer::ChatMessage;
use weft::tools::{ToolCall, ToolDelta, Tools};

use super::errors::{json_response, ApiError, ErrorKind, Protocol};
use super::params::{self, get, opt_bool, opt_count, opt_int, opt_str, Object};
use super::state::{sse_data, AppState, EventStream, Generation, StreamEncoder};

fn system_fingerprint() -> String {
    concat!("weft-", env!("CARGO_PKG_VERSION")).to_string()
}

/// The end of an SSE stream: the chunk carrying the finish reason, the usage-only chunk when
/// `stream_options.include_usage` asked for it, then `[DONE]`.
fn stream_tail(state: &AppState, id: &str, object: &str, last: &Value, usage: Option<&Usage>) -> String {
    let mut out = sse_data(last);
    if let Some(usage) = usage {
        out += &sse_data(&json!({
            "id": id,
            "object": object,
            "created": state.created,
            "model": state.model_id,
            "system_fingerprint": system_fingerprint(),
            "choices": [],
            "usage": usage_json(usage),
        }));
    }
    out + "data: [DONE]\n\n"
}

pub fn usage_json(u: &Usage) -> Value {
    json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
    })
}

fn finish_str(r: FinishReason) -> &'static str {
    r.as_str()
}

/// Why a generation produced no normal ending, as the error a client sees.
fn cancelled_error() -> ApiError {
    ApiError::new(ErrorKind::Unavailable, "the request was cancelled: the server is shutting down")
}

fn engine_error(message: &str) -> ApiError {
    ApiError::new(ErrorKind::Internal, format!("generation failed: {message}"))
}

fn sse_response(body: Body) -> Response {
    (StatusCode::OK, [(header::CONTENT_TYPE, "text/event-stream"), (header::CACHE_CONTROL, "no-cache")], body)
        .into_response()
}

// ---------------------------------------------------------------- /v1/chat/completions

pub async fn chat_completions(State(state): State<Arc<AppState>>, req: axum::extract::Request) -> Response {
    let arrived = Instant::now();
    match chat_inner(&state, req, arrived).await {
        Ok(r) => r,
        Err(e) => e.into_response(Protocol::OpenAi),
    }
}

/// OpenAI `messages`: roles and text content (a string, or an array of text parts joined as
/// mlx_lm.server joins them). `developer` is the newer name for `system`.
fn chat_messages(
    state: &AppState,
    body: &Object,
    mut images: Option<&mut MessageImages>,
    mut audio: Option<&mut MessageAudio>,
) -> Result<Vec<ChatMessage>, ApiError> {
    let list = match get(body, "messages") {
        Some(Value::Array(a)) if !a.is_empty() => a,
        Some(Value::Array(_)) => return Err(ApiError::field("messages", "`messages` must not be empty")),
        None => return Err(ApiError::field("messages", "`messages` is required")),
        Some(_) => return Err(ApiError::field("messages", "`messages` must be an array")),
    };
    state.limits.check_messages(list.len(), "messages")?;
    list.iter()
        .enumerate()
        .map(|(i, m)| {
            let param = format!("messages[{i}]");
            let m = m.as_object().ok_or_else(|| ApiError::field(&param, format!("`{param}` must be an object")))?;
            let role = match get(m, "role") {
                Some(Value::String(r)) => r.as_str(),
                _ => return Err(ApiError::field(&param, format!("`{param}.role` must be a string"))),
            };
            // `developer` is OpenAI's newer name for `system`; the rest is the engine's one rule
            // (the same message as /v1/messages).
            let role = if role == "developer" { "system" } else { role };
            weft::tools::check_role(role, &format!("{param}.role")).map_err(|e| ApiError::field(&e.param, e.message))?;
            let content = content_text(get(m, "content"), &param, images.as_deref_mut(), audio.as_deref_mut())?;
            let mut message = ChatMessage::new(role, content);
            if role == "assistant" {
                message.tool_calls = assistant_tool_calls(get(m, "tool_calls"), &param)?;
                // The turn's reasoning (`reasoning_content`, as this server sends it; some
                // clients name it `reasoning`), for templates that keep or drop it.
                for key in ["reasoning_content", "reasoning"] {
                    if let Some(r) = opt_str(m, key).map_err(|_| ApiError::field(&format!("{param}.{key}"), format!("`{param}.{key}` must be a string")))? {
                        message.reasoning_content = Some(r.to_string());
                        break;
                    }
                }
            }
            if role == "tool" {
                message.tool_call_id = opt_str(m, "tool_call_id")
                    .map_err(|_| ApiError::field(&format!("{param}.tool_call_id"), format!("`{param}.tool_call_id` must be a string")))?
                    .map(str::to_string);
            }
            message.name = opt_str(m, "name")
                .map_err(|_| ApiError::field(&format!("{param}.name"), format!("`{param}.name` must be a string")))?
                .map(str::to_string);
            Ok(message)
        })
        .collect()
}

/// An assistant turn's `tool_calls`: `[{"id", "type": "function", "function": {"name",
/// "arguments": JSON text}}]`.
fn assistant_tool_calls(v: Option<&Value>, param: &str) -> Result<Vec<ToolCall>, ApiError> {
    let Some(v) = v else { return Ok(Vec::new()) };
    let list = v.as_array().ok_or_else(|| ApiError::field(&format!("{param}.tool_calls"), format!("`{param}.tool_calls` must be an array")))?;
    list.iter()
        .enumerate()
        .map(|(j, c)| {
            let at = format!("{param}.tool_calls[{j}]");
            let bad = |what: &str| ApiError::field(&at, format!("`{at}` {what}"));
            let id = c.get("id").and_then(Value::as_str).ok_or_else(|| bad("needs a string `id`"))?;
            let function = c.get("function").ok_or_else(|| bad("needs a `function` object"))?;
            let name = function.get("name").and_then(Value::as_str).ok_or_else(|| bad("needs a string `function.name`"))?;
            let arguments = match function.get("arguments") {
                None | Some(Value::Null) => "{}".to_string(),
                Some(Value::String(s)) => s.clone(),
                // Some clients send the arguments as an object.
                Some(other @ Value::Object(_)) => other.to_string(),
                Some(_) => return Err(bad("`function.arguments` must be a JSON string")),
            };
            Ok(ToolCall { id: id.to_string(), name: name.to_string(), arguments })
        })
        .collect()
}

/// `tools`, `tool_choice` and `parallel_tool_calls`: `None` when the request offers no tools.
pub fn request_tools(body: &Object) -> Result<Option<Tools>, ApiError> {
    let parallel = opt_bool(body, "parallel_tool_calls")?;
    Tools::parse(get(body, "tools"), get(body, "tool_choice"), parallel).map_err(|e| ApiError::field(&e.param, e.message))
}

/// The OpenAI `tool_calls` array of a message.
fn tool_calls_json(calls: &[ToolCall]) -> Value {
    calls.iter().map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}})).collect()
}

/// A streamed piece of a call, as OpenAI streams `delta.tool_calls`: the first chunk of a call
/// has its index, id, type, name and empty arguments; the next ones argument fragments.
fn tool_delta_json(d: &ToolDelta) -> Value {
    match d {
        ToolDelta::Start { index, id, name } => {
            json!({"index": index, "id": id, "type": "function", "function": {"name": name, "arguments": ""}})
        }
        ToolDelta::Arguments { index, fragment } => json!({"index": index, "function": {"arguments": fragment}}),
    }
}

/// Text content, or text parts joined; `image_url` parts (when `images` collects them: a model
/// with a vision tower) become the model's begin-of-image marker in the text and their bytes
/// go to `images`; `input_audio` / `audio_url` parts (when `audio` collects them) become the
/// model's audio token and their bytes go to `audio`. A message with media trims each text
/// part, as Gemma's templates do for a list of parts.
fn content_text(
    content: Option<&Value>,
    param: &str,
    images: Option<&mut MessageImages>,
    audio: Option<&mut MessageAudio>,
) -> Result<String, ApiError> {
    match content {
        None => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let has_images = parts
                .iter()
                .any(|p| matches!(p.get("type").and_then(Value::as_str), Some("image_url" | "input_audio" | "audio_url")));
            let mut images = images;
            let mut audio = audio;
            let mut text = String::new();
            for (j, p) in parts.iter().enumerate() {
                match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(t)) => text.push_str(if has_images { t.trim() } else { t }),
                    (Some("text"), None) => {
                        return Err(ApiError::field(
                            param,
                            format!("`{param}.content` text parts need a string `text`"),
                        ))
                    }
                    (Some("image_url"), _) => {
                        let at = format!("{param}.content[{j}].image_url");
                        let Some(images) = images.as_deref_mut() else {
                            return Err(ApiError::field(&at, "this model takes no images (it has no vision tower)".to_string()));
                        };
                        images.add_part(p.get("image_url"), &at)?;
                        text.push_str(&images.marker);
                    }
                    (Some(kind @ ("input_audio" | "audio_url")), _) => {
                        let at = format!("{param}.content[{j}].{kind}");
                        let Some(audio) = audio.as_deref_mut() else {
                            return Err(ApiError::field(&at, "this model takes no audio (it has no audio tower)".to_string()));
                        };
                        audio.add_part(kind, p.get(kind), &at)?;
                        text.push_str(&audio.marker);
                    }
                    _ => {
                        return Err(ApiError::field(
                            param,
                            format!("`{param}.content`: only text, image_url, input_audio and audio_url content parts are supported"),
                        ))
                    }
                }
            }
            Ok(text)
        }
        Some(_) => Err(ApiError::field(param, format!("`{param}.content` must be a string or an array of parts"))),
    }
}

/// The images of a request's messages, in order, and the marker text each stands for.
pub struct MessageImages {
    pub marker: String,
    pub bytes: Vec<Vec<u8>>,
    pub max: usize,
    /// Which local paths may be read (`--allowed-media-dir`).
    local: weft::vision::source::LocalMedia,
}

impl MessageImages {
    /// For a model with a vision tower and a tokenizer that names its begin-of-image token.
    pub fn for_model(state: &AppState) -> Option<MessageImages> {
        let spec = state.engine.vision()?;
        let marker = spec.marker_token_id().and_then(|id| state.engine.tokenizer()?.id_to_token(id))?;
        let local = state.engine.config().local_media.clone();
        Some(MessageImages { marker, bytes: Vec::new(), max: spec.max_images, local })
    }

    /// Adds the image of an `image_url` value: the URL as a string or `{url}` (OpenAI chat's
    /// part and the Responses `input_image` part both carry one).
    pub fn add_part(&mut self, v: Option<&Value>, at: &str) -> Result<(), ApiError> {
        self.add(part_url(v, at)?, at)
    }

    /// Adds an image from a `data:` URL or local path (a remote URL is a 400).
    pub fn add(&mut self, url: &str, at: &str) -> Result<(), ApiError> {
        if self.bytes.len() >= self.max {
            return Err(ApiError::field(at, format!("at most {} images per request", self.max)));
        }
        let bytes = weft::vision::source::image_from_url_with(url, &self.local)
            .map_err(|e| ApiError::field(at, format!("`{at}`: {}", e.message())))?;
        self.bytes.push(bytes);
        Ok(())
    }
}

/// The URL of an `image_url` / `audio_url` value: the URL as a string or `{url}`.
fn part_url<'a>(v: Option<&'a Value>, at: &str) -> Result<&'a str, ApiError> {
    let url = match v {
        Some(Value::String(u)) => u.as_str(),
        Some(Value::Object(o)) => o.get("url").and_then(Value::as_str).unwrap_or(""),
        _ => "",
    };
    if url.is_empty() {
        return Err(ApiError::field(at, format!("`{at}` needs a string `url` (a data: URL, or a local path)")));
    }
    Ok(url)
}

/// The audio clips of a request's messages, in order, and the audio token text each stands for.
pub struct MessageAudio {
    pub marker: String,
    pub bytes: Vec<Vec<u8>>,
    pub max: usize,
    local: weft::vision::source::LocalMedia,
}

/// Formats `input_audio.format` may name (what the decoder reads).
const AUDIO_FORMATS: [&str; 5] = ["wav", "mp3", "flac", "ogg", "oga"];

impl MessageAudio {
    /// For a model with an audio tower and a tokenizer that names its audio token.
    pub fn for_model(state: &AppState) -> Option<MessageAudio> {
        let spec = state.engine.audio()?;
        let marker = state.engine.tokenizer()?.id_to_token(spec.tokens.audio_token_id)?;
        let local = state.engine.config().local_media.clone();
        Some(MessageAudio { marker, bytes: Vec::new(), max: spec.max_clips, local })
    }

    /// Adds a clip from an OpenAI `input_audio` part (`{data: base64, format}`) or an
    /// `audio_url` part (`{url}` or a string: a `data:` URL or a local path; remote URLs a 400).
    pub(super) fn add_part(&mut self, kind: &str, v: Option<&Value>, at: &str) -> Result<(), ApiError> {
        if self.bytes.len() >= self.max {
            return Err(ApiError::field(at, format!("at most {} audio clips per request", self.max)));
        }
        let bad = |e: weft::Error| ApiError::field(at, format!("`{at}`: {}", e.message()));
        let bytes = if kind == "input_audio" {
            let o = v.and_then(Value::as_object).ok_or_else(|| ApiError::field(at, format!("`{at}` must be an object {{data, format}}")))?;
            let data = o.get("data").and_then(Value::as_str).ok_or_else(|| ApiError::field(at, format!("`{at}.data` must be a base64 string")))?;
            match o.get("format") {
                None | Some(Value::Null) => {}
                Some(Value::String(f)) if AUDIO_FORMATS.contains(&f.to_ascii_lowercase().as_str()) => {}
                Some(f) => {
                    return Err(ApiError::field(at, format!("`{at}.format` {f} is not supported (supported: wav, mp3, flac, ogg)")))
                }
            }
            weft::vision::source::audio_base64(data).map_err(bad)?
        } else {
            weft::vision::source::audio_from_url_with(part_url(v, at)?, &self.local).map_err(bad)?
        };
        self.bytes.push(bytes);
        Ok(())
    }
}

/// `logprobs` (bool) / `top_logprobs` (0..=20) → how many alternatives to report, if any.
fn chat_logprobs(body: &Object) -> Result<Option<usize>, ApiError> {
    let on = opt_bool(body, "logprobs")?.unwrap_or(false);
    let top = opt_count(body, "top_logprobs", 0)?;
    if let Some(k) = top {
        weft::engine::check_top_logprobs(k, "top_logprobs").map_err(ApiError::from_engine)?;
    }
    match (on, top) {
        (true, k) => Ok(Some(k.unwrap_or(0))),
        (false, Some(k)) if k > 0 => {
            Err(ApiError::field("top_logprobs", "`top_logprobs` needs `logprobs` set to true"))
        }
        (false, _) => Ok(None),
    }
}

fn stream_flags(body: &Object) -> Result<(bool, bool), ApiError> {
    let stream = opt_bool(body, "stream")?.unwrap_or(false);
    let include_usage = match get(body, "stream_options") {
        None => false,
        Some(Value::Object(o)) => opt_bool(o, "include_usage")
            .map_err(|_| ApiError::field("stream_options", "`stream_options.include_usage` must be a boolean"))?
            .unwrap_or(false),
        Some(_) => return Err(ApiError::field("stream_options", "`stream_options` must be an object")),
    };
    Ok((stream, include_usage))
}

/// The engine request common to both endpoints.
fn engine_request(
    state: &AppState,
    body: &Object,
    input: Input,
    logprobs: Option<usize>,
) -> Result<Request, ApiError> {
    let vocab = state.engine.model_info().vocab_size as usize;
    let mut r = Request::new(input);
    let max_tokens_key = if get(body, "max_completion_tokens").is_some() { "max_completion_tokens" } else { "max_tokens" };
    params::generation(body, &params::OPENAI, max_tokens_key, &state.defaults, &mut r)?;
    state.limits.check_max_tokens(r.max_tokens, max_tokens_key)?;
    params::check_sampling(&r, vocab)?;
    r.logprobs = logprobs;
    r.constraint = params::constraint(body)?.map(|(_, c)| c);
    Ok(r)
}

/// The chat-only fields about the template and reasoning: `chat_template_kwargs` (any
/// variables the template reads, over `--chat-template-args`), `reasoning_effort` (a budget
/// and `enable_thinking`, see [`params::REASONING_EFFORTS`]) and the extension
/// `reasoning_budget` (reasoning tokens before the engine closes the reasoning block).
fn thinking_fields(body: &Object, r: &mut Request) -> Result<(), ApiError> {
    match get(body, "chat_template_kwargs") {
        None => {}
        Some(Value::Object(kwargs)) => r.chat_template_kwargs = kwargs.clone(),
        Some(_) => return Err(ApiError::field("chat_template_kwargs", "`chat_template_kwargs` must be an object")),
    }
    // An explicit `enable_thinking` in the kwargs wins over what the effort implies.
    let explicit = r.chat_template_kwargs.get("enable_thinking").cloned();
    params::reasoning_effort(get(body, "reasoning_effort"), "reasoning_effort", r)?;
    if let Some(v) = explicit {
        r.chat_template_kwargs.insert("enable_thinking".into(), v);
    }
    if let Some(budget) = opt_count(body, "reasoning_budget", 0)? {
        r.reasoning_budget = Some(budget);
    }
    Ok(())
}

/// `n`: how many choices (rows of one prompt, decoding together in the batch); `best_of`, if
/// given, must equal it.
fn choices(body: &Object, state: &AppState) -> Result<usize, ApiError> {
    let n = opt_int(body, "n")?.unwrap_or(1);
    let max = weft::limits::MAX_CHOICES.min(state.engine.config().max_batch.max(1));
    if n < 1 || n as usize > max {
        return Err(ApiError::field("n", format!("`n` must be between 1 and {max}, got {n}")));
    }
    if let Some(b) = opt_int(body, "best_of")? {
        if b != n {
            return Err(ApiError::field("best_of", format!("`best_of` must equal `n` ({n}), got {b}")));
        }
    }
    Ok(n as usize)
}

async fn chat_inner(state: &Arc<AppState>, req: axum::extract::Request, arrived: Instant) -> Result<Response, ApiError> {
    state.check_open()?;
    let body = params::read_body(req, state.limits.body_bytes).await?;
    state.check_model(body.get("model"))?;
    let n = choices(&body, state)?;
    let (stream, include_usage) = stream_flags(&body)?;
    let logprobs = chat_logprobs(&body)?;
    let mut images = MessageImages::for_model(state);
    let mut audio = MessageAudio::for_model(state);
    let messages = chat_messages(state, &body, images.as_mut(), audio.as_mut())?;
    let images = images.map(|i| i.bytes).unwrap_or_default();
    let audio = audio.map(|a| a.bytes).unwrap_or_default();
    let tools = request_tools(&body)?;
    state.check_prompt_bytes(messages.iter().map(|m| m.content.len()).sum())?;
    // Field checks before tokenizing: a bad request costs no tokenizer time.
    let mut request = engine_request(state, &body, Input::Messages(Vec::new()), logprobs)?;
    thinking_fields(&body, &mut request)?;
    let constraint = params::constraint_field(&body);
    // The engine renders the conversation (with the server's --chat-template, tools, image and
    // audio markers, template variables), tokenizes it and checks it: one request path for
    // every face. `n` choices are `n` rows of the same request (a seed counts up per choice, so
    // seeded choices differ); they decode together.
    let chat_template = state.chat_template.clone();
    let request = Request { input: Input::Messages(messages), tools, images, audio, chat_template, ..request };
    let generations = state
        .blocking(move |state| {
            (0..n)
                .map(|i| {
                    let mut r = request.clone();
                    r.sampling.seed = r.sampling.seed.map(|s| s.wrapping_add(i as u64));
                    state.start(r, arrived).map_err(|e| params::constraint_param(e, constraint))
                })
                .collect::<Result<Vec<_>, _>>()
        })
        .await?;
    let id = state.new_id("chatcmpl-");
    if stream {
        let text_of = Arc::clone(state);
        let encoder = ChatEncoder {
            created: state.created,
            model: state.model_id.clone(),
            token_text: Arc::new(move |t| text_of.token_text(t)),
            id,
            include_usage,
            logprobs: logprobs.is_some(),
            n,
            usage: Usage::default(),
            failed: false,
        };
        return Ok(sse_response(Body::from_stream(EventStream::many(generations, encoder))));
    }
    // Each choice is read on its own task, so no row waits for another's reader.
    let tasks: Vec<_> = generations
        .into_iter()
        .map(|g| {
            let state = Arc::clone(state);
            tokio::spawn(async move { collect(g, &state, logprobs.is_some()).await })
        })
        .collect();
    let mut choices = Vec::with_capacity(n);
    let mut usage = Usage::default();
    for (index, task) in tasks.into_iter().enumerate() {
        let done = task.await.map_err(|e| engine_error(&e.to_string()))??;
        add_usage(&mut usage, &done.usage, index);
        let logprobs_json = logprobs.map(|_| json!({"content": done.chat_logprobs}));
        let mut message = json!({"role": "assistant", "content": done.text});
        if !done.reasoning.is_empty() {
            message["reasoning_content"] = json!(done.reasoning);
        }
        if !done.tool_calls.is_empty() {
            // OpenAI: content is null when the turn is only calls.
            if done.text.is_empty() {
                message["content"] = Value::Null;
            }
            message["tool_calls"] = tool_calls_json(&done.tool_calls);
        }
        choices.push(json!({
            "index": index,
            "message": message,
            "logprobs": logprobs_json,
            "finish_reason": finish_str(done.finish_reason),
        }));
    }
    Ok(json_response(
        StatusCode::OK,
        &json!({
            "id": id,
            "object": "chat.completion",
            "created": state.created,
            "model": state.model_id,
            "system_fingerprint": system_fingerprint(),
            "choices": choices,
            "usage": usage_json(&usage),
        }),
    ))
}

/// The usage of `n` choices of one prompt: the prompt once (the first row's), completion and
/// reasoning tokens summed.
fn add_usage(total: &mut Usage, row: &Usage, index: usize) {
    if index == 0 {
        total.prompt_tokens = row.prompt_tokens;
        total.cached_tokens = row.cached_tokens;
    }
    total.completion_tokens += row.completion_tokens;
    total.reasoning_tokens += row.reasoning_tokens;
}

/// A finished non-streaming generation.
struct Collected {
    text: String,
    /// The reasoning channel's text (empty for models that do not mark reasoning).
    reasoning: String,
    finish_reason: FinishReason,
    usage: Usage,
    /// Chat-format logprob entries, one per generated token.
    chat_logprobs: Vec<Value>,
    /// Completion-format logprobs (token ids and their values) for the legacy endpoint.
    tokens: Vec<(u32, TokenLogprobs)>,
    tool_calls: Vec<ToolCall>,
}

async fn collect(mut g: Generation, state: &AppState, logprobs: bool) -> Result<Collected, ApiError> {
    let mut text = String::new();
    let mut reasoning = String::new();
    let mut chat_logprobs = Vec::new();
    let mut tokens = Vec::new();
    loop {
        match g.next().await {
            Some(Event::Token { token_id, text: t, reasoning: r, logprobs: lp, .. }) => {
                text.push_str(&t);
                reasoning.push_str(&r);
                if let (true, Some(lp)) = (logprobs, lp) {
                    chat_logprobs.push(chat_logprob_entry(&|t| state.token_text(t), token_id, &lp));
                    tokens.push((token_id, lp));
                }
            }
            Some(Event::Done { finish_reason: FinishReason::Cancelled, .. }) => return Err(cancelled_error()),
            Some(Event::Done { finish_reason, usage, text: tail, reasoning: r, tool_calls, .. }) => {
                text.push_str(&tail);
                reasoning.push_str(&r);
                return Ok(Collected { text, reasoning, finish_reason, usage, chat_logprobs, tokens, tool_calls });
            }
            Some(Event::Started { .. }) => {}
            Some(Event::Error { message }) => return Err(engine_error(&message)),
            None => return Err(engine_error("the engine stopped")),
        }
    }
}

/// A token's text for logprobs (the served tokenizer's, [`AppState::token_text`]).
type TokenText<'a> = &'a dyn Fn(u32) -> String;

fn token_entry(text: TokenText, id: u32, logprob: f32) -> Value {
    let token = text(id);
    json!({"token": token, "logprob": logprob, "bytes": token.as_bytes()})
}

fn chat_logprob_entry(text: TokenText, id: u32, lp: &TokenLogprobs) -> Value {
    let mut entry = token_entry(text, id, lp.logprob);
    let top: Vec<Value> = lp.top.iter().map(|&(t, l)| token_entry(text, t, l)).collect();
    entry["top_logprobs"] = Value::Array(top);
    entry
}

struct ChatEncoder {
    /// `created` and `model` of every chunk.
    created: u64,
    model: String,
    token_text: Arc<dyn Fn(u32) -> String + Send + Sync>,
    id: String,
    include_usage: bool,
    logprobs: bool,
    /// Choices streamed together (`n`).
    n: usize,
    /// The choices' usage so far (prompt once, completions summed).
    usage: Usage,
    /// A choice failed: its error was sent, no usage chunk follows.
    failed: bool,
}

impl ChatEncoder {
    fn chunk(&self, index: usize, delta: Value, logprobs: Value, finish_reason: Option<&str>) -> Value {
        let mut c = json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": system_fingerprint(),
            "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}],
        });
        if self.include_usage {
            c["usage"] = Value::Null;
        }
        c
    }

    /// One chunk per call delta (OpenAI sends one tool call piece per chunk).
    fn tool_chunks(&self, index: usize, deltas: &[ToolDelta]) -> String {
        let mut out = String::new();
        for d in deltas {
            out += &sse_data(&self.chunk(index, json!({"tool_calls": [tool_delta_json(d)]}), Value::Null, None));
        }
        out
    }

    /// The reasoning and answer text a token or the end released, as `reasoning_content` and
    /// `content` deltas.
    fn text_chunks(&self, index: usize, reasoning: &str, text: &str, logprobs: Option<Value>) -> String {
        let mut out = String::new();
        if !reasoning.is_empty() {
            out += &sse_data(&self.chunk(index, json!({"reasoning_content": reasoning}), Value::Null, None));
        }
        if !text.is_empty() || logprobs.is_some() {
            out += &sse_data(&self.chunk(index, json!({"content": text}), logprobs.unwrap_or(Value::Null), None));
        }
        out
    }
}

fn stream_error(e: &ApiError) -> String {
    sse_data(&e.body(Protocol::OpenAi)) + "data: [DONE]\n\n"
}

impl StreamEncoder for ChatEncoder {
    fn start(&mut self) -> String {
        (0..self.n).map(|i| sse_data(&self.chunk(i, json!({"role": "assistant", "content": ""}), Value::Null, None))).collect()
    }

    fn event(&mut self, ev: &Event) -> String {
        self.event_at(0, ev)
    }

    fn event_at(&mut self, index: usize, ev: &Event) -> String {
        match ev {
            Event::Token { token_id, text, reasoning, logprobs, tool_calls } => {
                let lp = match (self.logprobs, logprobs) {
                    (true, Some(lp)) => Some(json!({"content": [chat_logprob_entry(&*self.token_text, *token_id, lp)]})),
                    _ => None,
                };
                self.text_chunks(index, reasoning, text, lp) + &self.tool_chunks(index, tool_calls)
            }
            Event::Done { finish_reason: FinishReason::Cancelled, .. } => {
                self.failed = true;
                sse_data(&cancelled_error().body(Protocol::OpenAi))
            }
            Event::Done { finish_reason, usage, text, reasoning, tool_deltas, .. } => {
                add_usage(&mut self.usage, usage, index);
                let tail = self.text_chunks(index, reasoning, text, None) + &self.tool_chunks(index, tool_deltas);
                tail + &sse_data(&self.chunk(index, json!({}), Value::Null, Some(finish_str(*finish_reason))))
            }
            Event::Started { .. } => String::new(),
            Event::Error { message } => {
                self.failed = true;
                sse_data(&engine_error(message).body(Protocol::OpenAi))
            }
        }
    }

    fn lost(&mut self) -> String {
        self.failed = true;
        sse_data(&engine_error("the engine stopped").body(Protocol::OpenAi))
    }

    /// The usage chunk (when asked for and every choice finished), then `[DONE]`.
    fn finish(&mut self) -> String {
        let mut out = String::new();
        if self.include_usage && !self.failed {
            out += &sse_data(&json!({
                "id": self.id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.model,
                "system_fingerprint": system_fingerprint(),
                "choices": [],
                "usage": usage_json(&self.usage),
            }));
        }
        out + "data: [DONE]\n\n"
    }
}

// ---------------------------------------------------------------- /v1/completions

pub async fn completions(State(state): State<Arc<AppState>>, req: axum::extract::Request) -> Response {
    let arrived = Instant::now();
    match completions_inner(&state, req, arrived).await {
        Ok(r) => r,
        Err(e) => e.into_response(Protocol::OpenAi),
    }
}

/// The legacy `prompt`: text to tokenize or token ids.
enum Prompt {
    Text(String),
    Ids(Vec<u32>),
}

/// The legacy `prompt`: a string, token ids, or a one-element array of either.
fn completion_prompt(body: &Object) -> Result<Prompt, ApiError> {
    let bad = || {
        ApiError::field("prompt", "`prompt` must be a string, an array of token ids, or a one-element array of either")
    };
    let ids_of = |a: &Vec<Value>| -> Result<Vec<u32>, ApiError> {
        a.iter().map(|v| v.as_u64().filter(|&t| t <= u32::MAX as u64).map(|t| t as u32).ok_or_else(bad)).collect()
    };
    let mut prompt = get(body, "prompt").ok_or_else(|| ApiError::field("prompt", "`prompt` is required"))?;
    if let Value::Array(a) = prompt {
        if a.len() == 1 && (a[0].is_string() || a[0].is_array()) {
            prompt = &a[0];
        } else if a.iter().any(|v| v.is_string() || v.is_array()) {
            return Err(ApiError::field("prompt", "only one prompt per request is supported"));
        }
    }
    match prompt {
        Value::String(s) => Ok(Prompt::Text(s.clone())),
        Value::Array(a) => Ok(Prompt::Ids(ids_of(a)?)),
        _ => Err(bad()),
    }
}

/// The prompt a prompt-cache save names (`/slots/{id}?action=save`, a Weft extension): the
/// `messages` (with `tools`) of a chat request or the `prompt` of a completion, rendered as
/// those endpoints render them; `None` when the body names neither.
pub(super) fn cache_prompt(state: &AppState, body: &Object) -> Result<Option<Request>, ApiError> {
    let input = if get(body, "messages").is_some() {
        Input::Messages(chat_messages(state, body, None, None)?)
    } else if get(body, "prompt").is_some() {
        match completion_prompt(body)? {
            Prompt::Text(t) => Input::Prompt(t),
            Prompt::Ids(ids) => Input::Tokens(ids),
        }
    } else {
        return Ok(None);
    };
    let tools = request_tools(body)?;
    Ok(Some(Request { tools, chat_template: state.chat_template.clone(), ..Request::new(input) }))
}

/// Legacy `logprobs`: an integer (alternatives per token, OpenAI) or a boolean with
/// `top_logprobs` (mlx_lm.server).
fn completion_logprobs(body: &Object) -> Result<Option<usize>, ApiError> {
    match get(body, "logprobs") {
        None | Some(Value::Bool(false)) => Ok(None),
        Some(Value::Bool(true)) => {
            let k = opt_count(body, "top_logprobs", 0)?.unwrap_or(0);
            weft::engine::check_top_logprobs(k, "top_logprobs").map_err(ApiError::from_engine)?;
            Ok(Some(k))
        }
        Some(_) => match opt_int(body, "logprobs")? {
            Some(k) if k >= 0 => {
                weft::engine::check_top_logprobs(k as usize, "logprobs").map_err(ApiError::from_engine)?;
                Ok(Some(k as usize))
            }
            _ => Err(ApiError::field("logprobs", format!("logprobs must be an integer in [0, {}]", weft::limits::MAX_TOP_LOGPROBS))),
        },
    }
}

async fn completions_inner(
    state: &Arc<AppState>,
    req: axum::extract::Request,
    arrived: Instant,
) -> Result<Response, ApiError> {
    state.check_open()?;
    let body = params::read_body(req, state.limits.body_bytes).await?;
    state.check_model(body.get("model"))?;
    params::single_choice(&body)?;
    let (stream, include_usage) = stream_flags(&body)?;
    let logprobs = completion_logprobs(&body)?;
    let echo = opt_bool(&body, "echo")?.unwrap_or(false);
    if echo && logprobs.is_some() {
        return Err(ApiError::field("echo", "`echo` with `logprobs` is not supported"));
    }
    if opt_str(&body, "suffix")?.is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::field("suffix", "`suffix` is not supported"));
    }
    let prompt = completion_prompt(&body)?;
    if let Prompt::Text(text) = &prompt {
        state.check_prompt_bytes(text.len())?;
    }
    let request = engine_request(state, &body, Input::Tokens(Vec::new()), logprobs)?;
    let constraint = params::constraint_field(&body);
    let (generation, prompt_text) = state
        .blocking(move |state| {
            let (ids, text) = match prompt {
                Prompt::Text(text) => (state.tokenize_prompt(&text)?, text),
                Prompt::Ids(ids) => {
                    let text = match state.engine.tokenizer() {
                        Some(t) => t.decode(&ids, false).unwrap_or_default(),
                        None => String::new(),
                    };
                    (ids, text)
                }
            };
            let generation = state
                .start(Request { input: Input::Tokens(ids), ..request }, arrived)
                .map_err(|e| params::constraint_param(e, constraint))?;
            Ok((generation, text))
        })
        .await?;
    let id = state.new_id("cmpl-");
    let echo_text = if echo { prompt_text } else { String::new() };
    if stream {
        let encoder = CompletionEncoder {
            state: Arc::clone(state),
            id,
            include_usage,
            logprobs: logprobs.is_some(),
            echo: echo_text,
            offset: 0,
        };
        return Ok(sse_response(Body::from_stream(EventStream::new(generation, encoder))));
    }
    let done = collect(generation, state, logprobs.is_some()).await?;
    let logprobs_json = logprobs.map(|_| completion_logprobs_json(state, &done.tokens, 0).0);
    Ok(json_response(
        StatusCode::OK,
        &json!({
            "id": id,
            "object": "text_completion",
            "created": state.created,
            "model": state.model_id,
            "system_fingerprint": system_fingerprint(),
            "choices": [{
                "index": 0,
                "text": echo_text + &done.text,
                "logprobs": logprobs_json,
                "finish_reason": finish_str(done.finish_reason),
            }],
            "usage": usage_json(&done.usage),
        }),
    ))
}

/// Legacy logprobs: parallel arrays plus each step's alternatives as `{token: logprob}`.
/// Returns the object and the text offset after the last token.
fn completion_logprobs_json(state: &AppState, tokens: &[(u32, TokenLogprobs)], mut offset: usize) -> (Value, usize) {
    let mut texts = Vec::new();
    let mut values = Vec::new();
    let mut tops = Vec::new();
    let mut offsets = Vec::new();
    for (id, lp) in tokens {
        let t = state.token_text(*id);
        offsets.push(offset);
        offset += t.len();
        texts.push(t);
        values.push(lp.logprob);
        let top: serde_json::Map<String, Value> =
            lp.top.iter().map(|&(tid, l)| (state.token_text(tid), json!(l))).collect();
        tops.push(Value::Object(top));
    }
    (json!({"tokens": texts, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}), offset)
}

struct CompletionEncoder {
    state: Arc<AppState>,
    id: String,
    include_usage: bool,
    logprobs: bool,
    /// The prompt, sent first when `echo` is set.
    echo: String,
    /// Text offset of the next token (legacy logprobs).
    offset: usize,
}

impl CompletionEncoder {
    fn chunk(&self, text: &str, logprobs: Value, finish_reason: Option<&str>) -> Value {
        let mut c = json!({
            "id": self.id,
            "object": "text_completion",
            "created": self.state.created,
            "model": self.state.model_id,
            "system_fingerprint": system_fingerprint(),
            "choices": [{"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}],
        });
        if self.include_usage {
            c["usage"] = Value::Null;
        }
        c
    }
}

impl StreamEncoder for CompletionEncoder {
    fn start(&mut self) -> String {
        if self.echo.is_empty() {
            return String::new();
        }
        let echo = std::mem::take(&mut self.echo);
        sse_data(&self.chunk(&echo, Value::Null, None))
    }

    fn event(&mut self, ev: &Event) -> String {
        match ev {
            Event::Token { token_id, text, logprobs, .. } => {
                let lp = match (self.logprobs, logprobs) {
                    (true, Some(lp)) => {
                        let (v, next) = completion_logprobs_json(&self.state, &[(*token_id, lp.clone())], self.offset);
                        self.offset = next;
                        Some(v)
                    }
                    _ => None,
                };
                if text.is_empty() && lp.is_none() {
                    return String::new();
                }
                sse_data(&self.chunk(text, lp.unwrap_or(Value::Null), None))
            }
            Event::Done { finish_reason: FinishReason::Cancelled, .. } => stream_error(&cancelled_error()),
            Event::Done { finish_reason, usage, text, .. } => {
                let tail = if text.is_empty() { String::new() } else { sse_data(&self.chunk(text, Value::Null, None)) };
                let last = self.chunk("", Value::Null, Some(finish_str(*finish_reason)));
                tail + &stream_tail(&self.state, &self.id, "text_completion", &last, self.include_usage.then_some(usage))
            }
            Event::Started { .. } => String::new(),
            Event::Error { message } => stream_error(&engine_error(message)),
        }
    }

    fn lost(&mut self) -> String {
        stream_error(&engine_error("the engine stopped"))
    }
}

// ---------------------------------------------------------------- /v1/models

/// The served model, in one shape both SDKs parse: OpenAI's (`id`, `object`, `created`,
/// `owned_by`) and Anthropic's (`type`, `display_name`, `created_at`), plus its context length
/// under the names llama-server / vLLM give it (`context_length`, `max_model_len`; null when
/// the model's config does not say), where it was loaded from (`path`) and what inputs it takes
/// (`capabilities.vision`: image content parts; `capabilities.audio`: input_audio / audio_url
/// parts), Weft extensions.
fn model_json(state: &AppState) -> Value {
    let context = state.engine.model_info().max_position_embeddings;
    json!({
        "id": state.model_id,
        "object": "model",
        "created": state.created,
        "owned_by": "weft",
        "type": "model",
        "display_name": state.model_id,
        "created_at": rfc3339(state.created),
        "context_length": context,
        "max_model_len": context,
        "path": state.model.path,
        "capabilities": {"vision": state.engine.vision().is_some(), "audio": state.engine.audio().is_some()},
    })
}

/// Unix seconds as an RFC 3339 UTC time (`2026-12-02T16:45:00Z`), Anthropic's `created_at`.
fn rfc3339(secs: u64) -> String {
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// The list: OpenAI's `{object: "list", data}` with Anthropic's paging fields (one page).
pub async fn models(State(state): State<Arc<AppState>>) -> Response {
    json_response(
        StatusCode::OK,
        &json!({"object": "list", "data": [model_json(&state)], "has_more": false,
                "first_id": state.model_id, "last_id": state.model_id}),
    )
}

/// A lookup, so only the served model's names are found (whatever `--strict-model` says).
pub async fn model(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    if state.is_served_name(&id) {
        json_response(StatusCode::OK, &model_json(&state))
    } else {
        state.unknown_model(&id).into_response(Protocol::OpenAi)
    }
}

#[cfg(test)]
mod tests {
    use super::super::state::test_events::{done, token};
    use super::*;

    fn chat_encoder(n: usize) -> ChatEncoder {
        ChatEncoder {
            created: 1,
            model: "m".into(),
            token_text: Arc::new(|t| format!("<{t}>")),
            id: "chatcmpl-1".into(),
            include_usage: true,
            logprobs: false,
            n,
            usage: Usage::default(),
            failed: false,
        }
    }

    fn chunks(sse: &str) -> Vec<Value> {
        sse.split("\n\n")
            .filter(|f| !f.is_empty() && *f != "data: [DONE]")
            .map(|f| serde_json::from_str(f.trim_start_matches("data: ")).unwrap())
            .collect()
    }

    /// Synthetic events of two choices: reasoning goes out as `reasoning_content` deltas,
    /// text as `content`, each chunk under its choice's index; one usage chunk (prompt once,
    /// completions and reasoning summed) after both finished, then `[DONE]`.
    #[test]
    fn chat_stream_forwards_reasoning_and_indexes_choices() {
        let mut e = chat_encoder(2);
        let token = |r: &str, t: &str| token(r, t, vec![]);
        let mut sse = e.start();
        sse += &e.event_at(1, &token("Hm.", ""));
        sse += &e.event_at(0, &token("", "Hi"));
        let u = |c, r| Usage { prompt_tokens: 5, completion_tokens: c, cached_tokens: 0, reasoning_tokens: r };
        sse += &e.event_at(0, &done(FinishReason::Stop, u(1, 0)));
        sse += &e.event_at(1, &token("", "Yo"));
        sse += &e.event_at(1, &done(FinishReason::Stop, u(2, 1)));
        sse += &e.finish();
        assert!(sse.ends_with("data: [DONE]\n\n"));
        let c = chunks(&sse);
        let deltas: Vec<(u64, Value)> =
            c.iter().filter(|c| !c["choices"].as_array().unwrap().is_empty()).map(|c| (c["choices"][0]["index"].as_u64().unwrap(), c["choices"][0]["delta"].clone())).collect();
        assert_eq!(
            deltas,
            [
                (0, json!({"role": "assistant", "content": ""})),
                (1, json!({"role": "assistant", "content": ""})),
                (1, json!({"reasoning_content": "Hm."})),
                (0, json!({"content": "Hi"})),
                (0, json!({})),
                (1, json!({"content": "Yo"})),
                (1, json!({})),
            ]
        );
        let usage = &c.last().unwrap()["usage"];
        assert_eq!((usage["prompt_tokens"].as_u64(), usage["completion_tokens"].as_u64()), (Some(5), Some(3)));
        assert_eq!(usage["completion_tokens_details"]["reasoning_tokens"], 1);
    }

    #[test]
    fn created_at_is_rfc3339() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_796_229_900), "2026-12-02T16:45:00Z");
    }
}
