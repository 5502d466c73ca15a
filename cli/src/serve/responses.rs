//! The OpenAI Responses protocol: `POST /v1/responses` (streaming as server-sent events and
//! not), `GET` and `DELETE /v1/responses/{id}`.
//!
//! A request's `input` (a string, or items: messages with text / image / audio parts, earlier
//! `function_call`s and their `function_call_output`s, `reasoning` items) becomes one
//! conversation for the engine, after `instructions` (a system message) and the history of
//! `previous_response_id` (from the in-memory [`Store`]). The answer is forwarded from the
//! engine's events, nothing derived: reasoning text becomes a `reasoning` item, answer text a
//! `message` item, each tool call a `function_call` item, in the order the events bring them.
//! One [`ResponseBuilder`] turns events into the stream's events and the final response object,
//! so the streamed and the non-streamed answers are the same.
//!
//! Tools: `function` tools, and the functions inside `namespace` tools (passed through under
//! their own names, their calls tagged with the namespace); hosted tools (`web_search`,
//! `file_search`, `code_interpreter`, `computer_use_preview`, `image_generation`, `mcp`,
//! `local_shell`, `custom`, ...) are accepted and left out: Weft cannot run them.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use weft::engine::{Event, Input, Request, Usage};
use weft::generate::FinishReason;
use weft::tokenizer::{ChatMessage, ToolCall};
use weft::tools::{ToolDelta, Tools};

use super::errors::{json_response, ApiError, ErrorKind, Protocol};
use super::openai::{MessageAudio, MessageImages};
use super::params::{self, get, opt_bool, opt_str, Object};
use super::state::{sse_event, AppState, EventStream, StreamEncoder};

// ---------------------------------------------------------------- the store

/// Stored responses (`store`, the default, as OpenAI's): what `previous_response_id` continues
/// and `GET /v1/responses/{id}` returns. In memory, bounded by bytes (oldest evicted first) and
/// by age (`--response-ttl`); lost on restart.
pub struct Store {
    inner: Mutex<StoreInner>,
    cap_bytes: usize,
    ttl: Duration,
}

#[derive(Default)]
struct StoreInner {
    map: HashMap<String, Arc<Stored>>,
    /// Ids oldest first.
    order: VecDeque<String>,
    bytes: usize,
}

/// One stored response and the conversation it ended (for `previous_response_id`).
pub struct Stored {
    response: Value,
    kept: Keep,
    at: Instant,
    bytes: usize,
}

impl Store {
    /// `cap_bytes` 0 stores nothing.
    pub fn new(cap_bytes: usize, ttl: Duration) -> Self {
        Store { inner: Mutex::new(StoreInner::default()), cap_bytes, ttl }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, StoreInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps `id` unless it alone is over the cap; evicts the expired, then the oldest, to fit.
    fn put(&self, id: String, response: Value, kept: Keep) {
        let Keep { history, images, audio, input_items } = &kept;
        let text: usize = history.iter().map(|m| m.content.len() + m.reasoning_content.as_ref().map_or(0, String::len)).sum();
        let calls: usize = history.iter().flat_map(|m| &m.tool_calls).map(|c| c.arguments.len() + c.name.len() + c.id.len()).sum();
        let media: usize = images.iter().chain(audio).map(Vec::len).sum();
        let items: usize = input_items.iter().map(|i| i.to_string().len()).sum();
        let bytes = response.to_string().len() + text + calls + media + items + 64 * history.len();
        if bytes > self.cap_bytes {
            return;
        }
        let mut s = self.lock();
        let now = Instant::now();
        while let Some(oldest) = s.order.front().cloned() {
            let expired = s.map.get(&oldest).is_none_or(|r| now.duration_since(r.at) > self.ttl);
            if !expired && s.bytes + bytes <= self.cap_bytes {
                break;
            }
            s.order.pop_front();
            if let Some(r) = s.map.remove(&oldest) {
                s.bytes -= r.bytes;
            }
        }
        s.bytes += bytes;
        s.order.push_back(id.clone());
        s.map.insert(id, Arc::new(Stored { response, kept, at: now, bytes }));
    }

    fn get(&self, id: &str) -> Option<Arc<Stored>> {
        let s = self.lock();
        s.map.get(id).filter(|r| r.at.elapsed() <= self.ttl).cloned()
    }

    fn delete(&self, id: &str) -> bool {
        let mut s = self.lock();
        match s.map.remove(id) {
            Some(r) => {
                s.bytes -= r.bytes;
                s.order.retain(|k| k != id);
                true
            }
            None => false,
        }
    }
}

fn not_found(id: &str) -> ApiError {
    ApiError::new(ErrorKind::NotFound, format!("Response with id '{id}' not found."))
}

pub async fn retrieve(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    match state.responses.get(&id) {
        Some(r) => json_response(StatusCode::OK, &r.response),
        None => not_found(&id).into_response(Protocol::OpenAi),
    }
}

/// `GET /v1/responses/{id}/input_items`: the items the response was asked with (a string
/// `input` as one user message), newest first unless `order=asc`, paged by `limit` (1–100,
/// default 20) and `after` (an item id).
pub async fn input_items(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    uri: axum::http::Uri,
) -> Response {
    let query = query_pairs(uri.query().unwrap_or(""));
    let Some(stored) = state.responses.get(&id) else { return not_found(&id).into_response(Protocol::OpenAi) };
    match page_items(&stored.kept.input_items, &query) {
        Ok(page) => json_response(StatusCode::OK, &page),
        Err(e) => e.into_response(Protocol::OpenAi),
    }
}

/// `a=1&b=x%20y` as a map (`+` as a space, `%XX` decoded; a later key wins).
fn query_pairs(query: &str) -> HashMap<String, String> {
    let decode = |s: &str| {
        let b = s.as_bytes();
        let mut out = Vec::with_capacity(b.len());
        let mut i = 0;
        while i < b.len() {
            match (b[i], b.get(i + 1..i + 3).and_then(|h| u8::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok())) {
                (b'%', Some(byte)) => {
                    out.push(byte);
                    i += 3;
                    continue;
                }
                (b'+', _) => out.push(b' '),
                (c, _) => out.push(c),
            }
            i += 1;
        }
        String::from_utf8_lossy(&out).into_owned()
    };
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| p.split_once('=').unwrap_or((p, "")))
        .map(|(k, v)| (decode(k), decode(v)))
        .collect()
}

fn page_items(items: &[Value], query: &HashMap<String, String>) -> Result<Value, ApiError> {
    let limit = match query.get("limit") {
        None => 20,
        Some(l) => l.parse::<usize>().ok().filter(|n| (1..=100).contains(n)).ok_or_else(|| {
            ApiError::field("limit", format!("`limit` must be an integer from 1 to 100, got '{l}'"))
        })?,
    };
    let mut ordered: Vec<&Value> = items.iter().collect();
    match query.get("order").map(String::as_str) {
        None | Some("desc") => ordered.reverse(),
        Some("asc") => {}
        Some(o) => return Err(ApiError::field("order", format!("`order` must be 'asc' or 'desc', got '{o}'"))),
    }
    let start = match query.get("after") {
        None => 0,
        Some(after) => {
            ordered.iter().position(|i| i["id"].as_str() == Some(after.as_str())).ok_or_else(|| {
                ApiError::field("after", format!("no input item with id '{after}' in this response"))
            })? + 1
        }
    };
    let page: Vec<&Value> = ordered.iter().skip(start).take(limit).copied().collect();
    Ok(json!({
        "object": "list",
        "data": page,
        "first_id": page.first().map(|i| &i["id"]),
        "last_id": page.last().map(|i| &i["id"]),
        "has_more": start + page.len() < ordered.len(),
    }))
}

/// The request's `input` as the items `input_items` lists: a string is one user message; each
/// item keeps the fields it came with and gets an id when it had none.
fn listed_items(input: &Value, response_id: &str) -> Vec<Value> {
    let items = match input {
        Value::String(s) => vec![json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": s}]})],
        Value::Array(items) => items.clone(),
        _ => Vec::new(),
    };
    items
        .into_iter()
        .enumerate()
        .map(|(i, mut item)| {
            if let Some(o) = item.as_object_mut() {
                o.entry("type").or_insert_with(|| json!("message"));
                o.entry("id").or_insert_with(|| json!(format!("item_{}_{i}", response_id.trim_start_matches("resp_"))));
            }
            item
        })
        .collect()
}

pub async fn delete(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    if state.responses.delete(&id) {
        json_response(StatusCode::OK, &json!({"id": id, "object": "response", "deleted": true}))
    } else {
        not_found(&id).into_response(Protocol::OpenAi)
    }
}

// ---------------------------------------------------------------- the request

pub async fn create(State(state): State<Arc<AppState>>, req: axum::extract::Request) -> Response {
    create_inner(&state, req, Instant::now()).await.unwrap_or_else(|e| e.into_response(Protocol::OpenAi))
}

/// A Responses body read into an engine request, and what the response echoes and keeps.
struct Parsed {
    request: Request,
    /// The request fields the response object repeats (`instructions`, `tools`, ...).
    echo: Value,
    /// The conversation without `instructions`, for the store.
    history: Vec<ChatMessage>,
    store: bool,
    /// `reasoning.summary` was asked for: reasoning is also sent as a summary.
    summary: bool,
    /// Function name → the `namespace` tool it came in.
    namespaces: HashMap<String, String>,
}

/// The conversation being built from `input` items.
struct Conversation {
    messages: Vec<ChatMessage>,
    /// Reasoning items waiting for the assistant turn they belong to.
    reasoning: Option<String>,
    images: Option<MessageImages>,
    audio: Option<MessageAudio>,
}

impl Conversation {
    fn push(&mut self, message: ChatMessage) {
        self.messages.push(message);
    }

    /// The assistant turn an output item belongs to: the last message when it is an assistant
    /// turn (text then calls are one turn), else a new one (taking pending reasoning).
    fn assistant(&mut self) -> &mut ChatMessage {
        if self.messages.last().is_none_or(|m| m.role != "assistant") || self.reasoning.is_some() {
            let mut m = ChatMessage::new("assistant", "");
            m.reasoning_content = self.reasoning.take();
            self.messages.push(m);
        }
        self.messages.last_mut().expect("just pushed")
    }

    /// One `input` item (`at` names it: `input[3]`).
    fn item(&mut self, item: &Value, at: &str) -> Result<(), ApiError> {
        let o = item.as_object().ok_or_else(|| ApiError::field(at, format!("`{at}` must be an object")))?;
        let kind = o.get("type").and_then(Value::as_str).unwrap_or("message");
        let bad = |what: &str| ApiError::field(at, format!("`{at}` ({kind}) {what}"));
        match kind {
            "message" => {
                let role = match o.get("role").and_then(Value::as_str) {
                    Some("developer") => "system",
                    Some(r @ ("user" | "system" | "assistant")) => r,
                    Some(r) => return Err(bad(&format!("has role {r:?}; roles are user, system, developer and assistant"))),
                    None => return Err(bad("needs a `role`")),
                };
                let content = self.content(o.get("content"), &format!("{at}.content"))?;
                if role == "assistant" {
                    let m = self.assistant();
                    m.content.push_str(&content);
                } else {
                    self.push(ChatMessage::new(role, content));
                }
            }
            "function_call" | "custom_tool_call" => {
                let call_id = o.get("call_id").and_then(Value::as_str).ok_or_else(|| bad("needs a string `call_id`"))?;
                let name = o.get("name").and_then(Value::as_str).ok_or_else(|| bad("needs a string `name`"))?;
                let arguments = match (kind, o.get("arguments"), o.get("input")) {
                    ("function_call", Some(Value::String(a)), _) => a.clone(),
                    ("function_call", Some(a @ Value::Object(_)), _) => a.to_string(),
                    ("function_call", None | Some(Value::Null), _) => "{}".into(),
                    ("custom_tool_call", _, Some(Value::String(input))) => json!({"input": input}).to_string(),
                    _ => return Err(bad("needs `arguments` as a JSON string (function_call) or an `input` string (custom_tool_call)")),
                };
                let call = ToolCall { id: call_id.into(), name: name.into(), arguments };
                self.assistant().tool_calls.push(call);
            }
            "function_call_output" | "custom_tool_call_output" => {
                let call_id = o.get("call_id").and_then(Value::as_str).ok_or_else(|| bad("needs a string `call_id`"))?;
                let output = self.content(o.get("output"), &format!("{at}.output"))?;
                let name = self
                    .messages
                    .iter()
                    .flat_map(|m| &m.tool_calls)
                    .find(|c| c.id == call_id)
                    .map(|c| c.name.clone());
                self.push(ChatMessage { tool_call_id: Some(call_id.into()), name, ..ChatMessage::new("tool", output) });
            }
            "reasoning" => {
                // The reasoning text when the item carries it, else its summary (Weft's own
                // reasoning items carry both; `encrypted_content` is for OpenAI's servers).
                let texts = |key: &str| -> String {
                    o.get(key)
                        .and_then(Value::as_array)
                        .map(|parts| parts.iter().filter_map(|p| p.get("text").and_then(Value::as_str)).collect::<Vec<_>>().join("\n\n"))
                        .unwrap_or_default()
                };
                let text = Some(texts("content")).filter(|t| !t.is_empty()).unwrap_or_else(|| texts("summary"));
                self.reasoning.get_or_insert_with(String::new).push_str(&text);
            }
            "item_reference" => {
                return Err(bad("is not supported: send the item itself, or continue with `previous_response_id`"))
            }
            // Hosted tools' calls and results (web_search_call, file_search_call, mcp_call,
            // image_generation_call, ...): Weft runs none of them, and the model is not shown them.
            _ => {}
        }
        Ok(())
    }

    /// A message's `content` (or a call output's `output`): a string or parts (`input_text`,
    /// `output_text`, `text`, `refusal`, `input_image`, `input_audio`).
    fn content(&mut self, v: Option<&Value>, at: &str) -> Result<String, ApiError> {
        let parts = match v {
            None | Some(Value::Null) => return Ok(String::new()),
            Some(Value::String(s)) => return Ok(s.clone()),
            Some(Value::Array(parts)) => parts,
            Some(_) => return Err(ApiError::field(at, format!("`{at}` must be a string or an array of content parts"))),
        };
        let media = parts.iter().any(|p| matches!(p.get("type").and_then(Value::as_str), Some("input_image" | "input_audio")));
        let mut text = String::new();
        for (j, p) in parts.iter().enumerate() {
            let at = format!("{at}[{j}]");
            match p.get("type").and_then(Value::as_str) {
                Some("input_text" | "output_text" | "text" | "summary_text" | "reasoning_text") => {
                    let t = p.get("text").and_then(Value::as_str).ok_or_else(|| ApiError::field(&at, format!("`{at}.text` must be a string")))?;
                    text.push_str(if media { t.trim() } else { t });
                }
                Some("refusal") => text.push_str(p.get("refusal").and_then(Value::as_str).unwrap_or("")),
                Some("input_image") => {
                    let Some(images) = self.images.as_mut() else {
                        return Err(ApiError::field(&at, "this model takes no images (it has no vision tower)".to_string()));
                    };
                    // (`file_id` images would need OpenAI's file store: a 400 like a missing URL.)
                    images.add_part(p.get("image_url"), &at)?;
                    text.push_str(&images.marker);
                }
                Some("input_audio") => {
                    let Some(audio) = self.audio.as_mut() else {
                        return Err(ApiError::field(&at, "this model takes no audio (it has no audio tower)".to_string()));
                    };
                    audio.add_part("input_audio", p.get("input_audio"), &at)?;
                    text.push_str(&audio.marker);
                }
                Some(other) => {
                    return Err(ApiError::field(
                        &at,
                        format!("`{at}`: {other:?} parts are not supported (input_text, input_image and input_audio are)"),
                    ))
                }
                None => return Err(ApiError::field(&at, format!("`{at}` needs a `type`"))),
            }
        }
        Ok(text)
    }
}

/// Responses `tools` as the chat shape the engine takes, and the namespace of each function
/// that came inside a `namespace` tool. Hosted tools are left out.
fn request_tools(body: &Object) -> Result<(Option<Tools>, HashMap<String, String>), ApiError> {
    let mut functions = Vec::new();
    let mut namespaces = HashMap::new();
    let function = |t: &Value| {
        let mut f = json!({"name": t.get("name").cloned().unwrap_or(Value::Null)});
        for key in ["description", "parameters"] {
            if let Some(v) = t.get(key).filter(|v| !v.is_null()) {
                f[key] = v.clone();
            }
        }
        json!({"type": "function", "function": f})
    };
    match get(body, "tools") {
        None => {}
        Some(Value::Array(list)) => {
            for (i, t) in list.iter().enumerate() {
                match t.get("type").and_then(Value::as_str) {
                    Some("function") => functions.push(function(t)),
                    Some("namespace") => {
                        let ns = t.get("name").and_then(Value::as_str).unwrap_or_default();
                        for inner in t.get("tools").and_then(Value::as_array).into_iter().flatten() {
                            if inner.get("type").and_then(Value::as_str).is_none_or(|k| k == "function") {
                                if let Some(name) = inner.get("name").and_then(Value::as_str) {
                                    namespaces.insert(name.to_string(), ns.to_string());
                                }
                                functions.push(function(inner));
                            }
                        }
                    }
                    Some(_) => {}
                    None => return Err(ApiError::field(&format!("tools[{i}]"), format!("`tools[{i}].type` is required"))),
                }
            }
        }
        Some(_) => return Err(ApiError::field("tools", "`tools` must be an array")),
    }
    let choice = match get(body, "tool_choice") {
        None => None,
        Some(c @ Value::String(_)) => Some(c.clone()),
        Some(Value::Object(o)) => match o.get("type").and_then(Value::as_str) {
            Some("function") => Some(json!({"type": "function", "function": {"name": o.get("name").cloned().unwrap_or(Value::Null)}})),
            Some("allowed_tools") => Some(json!(if o.get("mode").and_then(Value::as_str) == Some("required") { "required" } else { "auto" })),
            // A hosted tool (left out): the model decides.
            _ => None,
        },
        Some(_) => return Err(ApiError::field("tool_choice", "`tool_choice` must be a string or an object")),
    };
    let parallel = opt_bool(body, "parallel_tool_calls")?;
    let tools = Tools::parse(Some(&Value::Array(functions)), choice.as_ref(), parallel)
        .map_err(|e| ApiError::field(&e.param, e.message))?;
    Ok((tools, namespaces))
}

/// `text.format` as the constraint it asks for (`json_schema`, `json_object`; `text` = none).
fn text_format(body: &Object) -> Result<Option<weft::engine::Constraint>, ApiError> {
    let Some(format) = get(body, "text").and_then(|t| t.get("format")).filter(|f| !f.is_null()) else { return Ok(None) };
    let bad = |m: String| ApiError::field("text.format", m);
    let response_format = match format.get("type").and_then(Value::as_str) {
        Some("text") => return Ok(None),
        Some("json_object") => json!({"type": "json_object"}),
        Some("json_schema") => {
            let mut schema = json!({"schema": format.get("schema").cloned().unwrap_or(Value::Null)});
            for key in ["name", "strict", "description"] {
                if let Some(v) = format.get(key) {
                    schema[key] = v.clone();
                }
            }
            json!({"type": "json_schema", "json_schema": schema})
        }
        _ => return Err(bad("`text.format.type` must be text, json_object or json_schema".into())),
    };
    weft::contract::parse_constraint(&json!({"response_format": response_format}), weft::contract::Spelling::Snake)
        .map_err(|e| bad(format!("`text.format`: {}", e.message())))
}

fn parse(state: &AppState, body: &Object) -> Result<Parsed, ApiError> {
    if opt_bool(body, "background")?.unwrap_or(false) {
        return Err(ApiError::field("background", "`background` responses are not supported"));
    }
    if get(body, "conversation").is_some() {
        return Err(ApiError::field("conversation", "`conversation` is not supported: continue with `previous_response_id`"));
    }
    let mut request = Request::new(Input::Messages(Vec::new()));
    params::generation(body, &params::RESPONSES, "max_output_tokens", &state.defaults, &mut request)?;
    state.limits.check_max_tokens(request.max_tokens, "max_output_tokens")?;
    params::check_sampling(&request, state.engine.model_info().vocab_size as usize)?;
    let reasoning = get(body, "reasoning").and_then(Value::as_object);
    params::reasoning_effort(reasoning.and_then(|r| get(r, "effort")), "reasoning.effort", &mut request)?;
    let summary = reasoning
        .and_then(|r| get(r, "summary").or_else(|| get(r, "generate_summary")))
        .is_some_and(|s| s.as_str() != Some("none"));
    request.constraint = text_format(body)?;
    let (tools, namespaces) = request_tools(body)?;
    request.tools = tools;

    let previous = match opt_str(body, "previous_response_id")? {
        Some(id) => Some(state.responses.get(id).ok_or_else(|| {
            ApiError::field("previous_response_id", format!("Previous response with id '{id}' not found."))
        })?),
        None => None,
    };
    let mut images = MessageImages::for_model(state);
    let mut audio = MessageAudio::for_model(state);
    if let Some(p) = &previous {
        // The earlier turns' media come first, as their markers do.
        if !p.kept.images.is_empty() {
            let i = images.as_mut().ok_or_else(|| ApiError::invalid("the previous response has images; this model takes none"))?;
            i.bytes.extend(p.kept.images.iter().cloned());
        }
        if !p.kept.audio.is_empty() {
            let a = audio.as_mut().ok_or_else(|| ApiError::invalid("the previous response has audio; this model takes none"))?;
            a.bytes.extend(p.kept.audio.iter().cloned());
        }
    }
    let mut c = Conversation {
        messages: previous.as_ref().map(|p| p.kept.history.clone()).unwrap_or_default(),
        reasoning: None,
        images,
        audio,
    };
    match get(body, "input") {
        None => return Err(ApiError::field("input", "`input` is required")),
        Some(Value::String(s)) => c.push(ChatMessage::new("user", s.clone())),
        Some(Value::Array(items)) => {
            state.limits.check_messages(items.len() + c.messages.len(), "input")?;
            for (i, item) in items.iter().enumerate() {
                c.item(item, &format!("input[{i}]"))?;
            }
        }
        Some(_) => return Err(ApiError::field("input", "`input` must be a string or an array of items")),
    }
    if c.messages.is_empty() {
        return Err(ApiError::field("input", "`input` has no messages"));
    }
    let history = c.messages;
    let instructions = opt_str(body, "instructions")?.filter(|s| !s.is_empty());
    let mut messages = Vec::with_capacity(history.len() + 1);
    if let Some(i) = instructions {
        messages.push(ChatMessage::new("system", i));
    }
    messages.extend(history.iter().cloned());
    state.check_prompt_bytes(messages.iter().map(|m| m.content.len()).sum())?;

    let echo = json!({
        "instructions": instructions,
        "max_output_tokens": get(body, "max_output_tokens"),
        "metadata": get(body, "metadata").cloned().unwrap_or_else(|| json!({})),
        "parallel_tool_calls": request.tools.as_ref().map_or(true, |t| t.parallel),
        "previous_response_id": get(body, "previous_response_id"),
        "reasoning": {"effort": reasoning.and_then(|r| get(r, "effort")), "summary": reasoning.and_then(|r| get(r, "summary"))},
        "store": opt_bool(body, "store")?.unwrap_or(true),
        "temperature": request.sampling.temperature,
        "text": {"format": get(body, "text").and_then(|t| t.get("format")).cloned().unwrap_or_else(|| json!({"type": "text"}))},
        "tool_choice": get(body, "tool_choice").cloned().unwrap_or_else(|| json!("auto")),
        "tools": get(body, "tools").cloned().unwrap_or_else(|| json!([])),
        "top_p": request.sampling.top_p,
        "truncation": "disabled",
        "user": get(body, "user"),
    });
    let store = opt_bool(body, "store")?.unwrap_or(true);
    let (images, audio) = (c.images.map(|i| i.bytes).unwrap_or_default(), c.audio.map(|a| a.bytes).unwrap_or_default());
    let request = Request {
        input: Input::Messages(messages),
        images,
        audio,
        chat_template: state.chat_template.clone(),
        ..request
    };
    Ok(Parsed { request, echo, history, store, summary, namespaces })
}

async fn create_inner(state: &Arc<AppState>, req: axum::extract::Request, arrived: Instant) -> Result<Response, ApiError> {
    state.check_open()?;
    let body = params::read_body(req, state.limits.body_bytes).await?;
    state.check_model(body.get("model"))?;
    let stream = opt_bool(&body, "stream")?.unwrap_or(false);
    let Parsed { request, echo, history, store, summary, namespaces } = parse(state, &body)?;
    let id = state.new_id("resp_");
    let mut builder = ResponseBuilder::new(&id, &state.model_id, unix_now(), echo, summary, namespaces);
    // What the store keeps when the response is done (the request's media are moved into it).
    let keep = store.then(|| Keep {
        history,
        images: request.images.clone(),
        audio: request.audio.clone(),
        input_items: listed_items(body.get("input").unwrap_or(&Value::Null), &id),
    });
    // A schema the engine refuses is named by the field the request gave it in.
    let constraint = get(&body, "text").and_then(|t| t.get("format")).is_some().then_some("text.format");
    let generation = state
        .blocking(move |state| state.start(request, arrived).map_err(|e| params::constraint_param(e, constraint)))
        .await?;
    if stream {
        let encoder = ResponseEncoder { builder, state: Arc::clone(state), keep };
        return Ok((
            StatusCode::OK,
            [(header::CONTENT_TYPE, "text/event-stream"), (header::CACHE_CONTROL, "no-cache")],
            Body::from_stream(EventStream::new(generation, encoder)),
        )
            .into_response());
    }
    let mut generation = generation;
    loop {
        let ev = generation.next().await;
        match &ev {
            Some(Event::Done { finish_reason: FinishReason::Cancelled, .. }) => {
                return Err(ApiError::new(ErrorKind::Unavailable, "the request was cancelled: the server is shutting down"))
            }
            Some(Event::Error { message }) => {
                return Err(ApiError::new(ErrorKind::Internal, format!("generation failed: {message}")))
            }
            None => return Err(ApiError::new(ErrorKind::Internal, "generation failed: the engine stopped")),
            Some(ev) => {
                builder.event(ev);
                if ev.is_final() {
                    break;
                }
            }
        }
    }
    let response = builder.response();
    if let Some(keep) = keep {
        keep.store(state, &builder, &response);
    }
    Ok(json_response(StatusCode::OK, &response))
}

fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// The request's conversation and media, kept until the response is done, then stored.
struct Keep {
    /// The conversation without `instructions` (those are not carried over, as OpenAI's); once
    /// stored, the answer included as an assistant turn.
    history: Vec<ChatMessage>,
    /// The history's images and audio clips, in prompt order.
    images: Vec<Vec<u8>>,
    audio: Vec<Vec<u8>>,
    /// This request's own `input`, as `GET /v1/responses/{id}/input_items` lists it.
    input_items: Vec<Value>,
}

impl Keep {
    /// Stores the response with its conversation, the answer appended as an assistant turn.
    fn store(mut self, state: &AppState, builder: &ResponseBuilder, response: &Value) {
        self.history.push(builder.answer());
        state.responses.put(builder.id.clone(), response.clone(), self);
    }
}

// ---------------------------------------------------------------- events → the response

/// The output item being streamed.
enum Open {
    None,
    Reasoning,
    Message,
    Call { call_id: String, name: String },
}

/// Turns a generation's events into the Responses stream (each event numbered) and the final
/// response object.
pub struct ResponseBuilder {
    id: String,
    /// The response object so far (`output` is filled in at the end).
    response: Value,
    sequence: u64,
    /// Finished output items.
    output: Vec<Value>,
    open: Open,
    /// The open item's id and text (reasoning, answer text or call arguments).
    item_id: String,
    text: String,
    summary: bool,
    namespaces: HashMap<String, String>,
    /// The answer as an assistant turn (for the store).
    answer_text: String,
    answer_reasoning: String,
    answer_calls: Vec<ToolCall>,
}

impl ResponseBuilder {
    pub fn new(id: &str, model: &str, created_at: u64, echo: Value, summary: bool, namespaces: HashMap<String, String>) -> Self {
        let mut response = json!({
            "id": id,
            "object": "response",
            "created_at": created_at,
            "status": "in_progress",
            "background": false,
            "error": null,
            "incomplete_details": null,
            "model": model,
            "output": [],
            "service_tier": "default",
            "usage": null,
        });
        if let (Value::Object(r), Value::Object(e)) = (&mut response, echo) {
            r.extend(e);
        }
        ResponseBuilder {
            id: id.to_string(),
            response,
            sequence: 0,
            output: Vec::new(),
            open: Open::None,
            item_id: String::new(),
            text: String::new(),
            summary,
            namespaces,
            answer_text: String::new(),
            answer_reasoning: String::new(),
            answer_calls: Vec::new(),
        }
    }

    /// One stream event: `type` and its fields, numbered.
    fn frame(&mut self, kind: &str, mut v: Value) -> String {
        v["type"] = json!(kind);
        v["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        sse_event(kind, &v)
    }

    fn output_index(&self) -> usize {
        self.output.len()
    }

    /// `response.created` and `response.in_progress`.
    pub fn begin(&mut self) -> String {
        let r = self.response.clone();
        self.frame("response.created", json!({"response": r.clone()})) + &self.frame("response.in_progress", json!({"response": r}))
    }

    fn new_item_id(&self, prefix: &str) -> String {
        format!("{prefix}_{}_{}", self.id.trim_start_matches("resp_"), self.output.len())
    }

    fn open_item(&mut self, open: Open, item: Value) -> String {
        let mut out = self.close("completed");
        self.item_id = item["id"].as_str().unwrap_or_default().to_string();
        self.text.clear();
        self.open = open;
        let index = self.output_index();
        out += &self.frame("response.output_item.added", json!({"output_index": index, "item": item}));
        out
    }

    /// An event about the open item: `fields` with its `item_id` and `output_index`.
    fn item_event(&mut self, kind: &str, mut fields: Value) -> String {
        fields["item_id"] = json!(self.item_id);
        fields["output_index"] = json!(self.output_index());
        self.frame(kind, fields)
    }

    fn reasoning(&mut self, delta: &str) -> String {
        if delta.is_empty() {
            return String::new();
        }
        let mut out = String::new();
        if !matches!(self.open, Open::Reasoning) {
            let id = self.new_item_id("rs");
            let item = json!({"type": "reasoning", "id": id, "summary": [], "content": [], "status": "in_progress"});
            out += &self.open_item(Open::Reasoning, item);
            let part = json!({"type": "reasoning_text", "text": ""});
            out += &self.item_event("response.content_part.added", json!({"content_index": 0, "part": part}));
            if self.summary {
                let part = json!({"type": "summary_text", "text": ""});
                out += &self.item_event("response.reasoning_summary_part.added", json!({"summary_index": 0, "part": part}));
            }
        }
        self.text.push_str(delta);
        self.answer_reasoning.push_str(delta);
        out += &self.item_event("response.reasoning_text.delta", json!({"content_index": 0, "delta": delta}));
        if self.summary {
            out += &self.item_event("response.reasoning_summary_text.delta", json!({"summary_index": 0, "delta": delta}));
        }
        out
    }

    fn message(&mut self, delta: &str) -> String {
        if delta.is_empty() {
            return String::new();
        }
        let mut out = String::new();
        if !matches!(self.open, Open::Message) {
            let id = self.new_item_id("msg");
            let item = json!({"type": "message", "id": id, "status": "in_progress", "role": "assistant", "content": []});
            out += &self.open_item(Open::Message, item);
            let part = json!({"type": "output_text", "text": "", "annotations": [], "logprobs": []});
            out += &self.item_event("response.content_part.added", json!({"content_index": 0, "part": part}));
        }
        self.text.push_str(delta);
        self.answer_text.push_str(delta);
        out + &self.item_event("response.output_text.delta", json!({"content_index": 0, "delta": delta, "logprobs": []}))
    }

    fn tool_deltas(&mut self, deltas: &[ToolDelta]) -> String {
        let mut out = String::new();
        for d in deltas {
            match d {
                ToolDelta::Start { id, name, .. } => {
                    let item_id = self.new_item_id("fc");
                    let item = self.call_item(&item_id, id, name, "", "in_progress");
                    out += &self.open_item(Open::Call { call_id: id.clone(), name: name.clone() }, item);
                }
                ToolDelta::Arguments { fragment, .. } => {
                    self.text.push_str(fragment);
                    out += &self.item_event("response.function_call_arguments.delta", json!({"delta": fragment}));
                }
            }
        }
        out
    }

    /// A `function_call` item (tagged with its namespace, if it came in one).
    fn call_item(&self, item_id: &str, call_id: &str, name: &str, arguments: &str, status: &str) -> Value {
        let mut item = json!({"type": "function_call", "id": item_id, "call_id": call_id, "name": name,
                              "arguments": arguments, "status": status});
        if let Some(ns) = self.namespaces.get(name) {
            item["namespace"] = json!(ns);
        }
        item
    }

    /// Closes the open item (its `.done` events and `response.output_item.done`) with `status`.
    fn close(&mut self, status: &str) -> String {
        let open = std::mem::replace(&mut self.open, Open::None);
        let text = std::mem::take(&mut self.text);
        let mut out = String::new();
        let item = match open {
            Open::None => return out,
            Open::Reasoning => {
                out += &self.item_event("response.reasoning_text.done", json!({"content_index": 0, "text": text}));
                let part = json!({"type": "reasoning_text", "text": text});
                out += &self.item_event("response.content_part.done", json!({"content_index": 0, "part": part}));
                let mut summary = json!([]);
                if self.summary {
                    out += &self.item_event("response.reasoning_summary_text.done", json!({"summary_index": 0, "text": text}));
                    let part = json!({"type": "summary_text", "text": text});
                    out += &self.item_event("response.reasoning_summary_part.done", json!({"summary_index": 0, "part": part}));
                    summary = json!([part]);
                }
                json!({"type": "reasoning", "id": self.item_id, "summary": summary,
                       "content": [{"type": "reasoning_text", "text": text}], "status": status})
            }
            Open::Message => {
                out += &self.item_event("response.output_text.done", json!({"content_index": 0, "text": text, "logprobs": []}));
                let part = json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []});
                out += &self.item_event("response.content_part.done", json!({"content_index": 0, "part": part}));
                json!({"type": "message", "id": self.item_id, "status": status, "role": "assistant", "content": [part]})
            }
            Open::Call { call_id, name } => {
                out += &self.item_event("response.function_call_arguments.done", json!({"name": name, "arguments": text}));
                self.answer_calls.push(ToolCall { id: call_id.clone(), name: name.clone(), arguments: text.clone() });
                self.call_item(&self.item_id, &call_id, &name, &text, status)
            }
        };
        let index = self.output_index();
        out += &self.frame("response.output_item.done", json!({"output_index": index, "item": item.clone()}));
        self.output.push(item);
        out
    }

    /// The stream events for one engine event; a final event ends the response
    /// (`response.completed`, `.incomplete` or `.failed`).
    pub fn event(&mut self, ev: &Event) -> String {
        match ev {
            Event::Started { .. } => String::new(),
            Event::Token { text, reasoning, tool_calls, .. } => {
                self.reasoning(reasoning) + &self.message(text) + &self.tool_deltas(tool_calls)
            }
            Event::Done { finish_reason: FinishReason::Cancelled, .. } => {
                self.fail("the request was cancelled: the server is shutting down")
            }
            Event::Done { finish_reason, text, reasoning, usage, tool_deltas, tool_calls, .. } => {
                let mut out = self.reasoning(reasoning) + &self.message(text) + &self.tool_deltas(tool_deltas);
                let status = if *finish_reason == FinishReason::Length { "incomplete" } else { "completed" };
                // The last item is cut when the length ran out, unless it is a call the engine
                // reports complete.
                let item_status = match &self.open {
                    Open::Call { call_id, .. } if tool_calls.iter().any(|c| &c.id == call_id) => "completed",
                    _ => status,
                };
                out += &self.close(item_status);
                self.response["status"] = json!(status);
                if status == "incomplete" {
                    self.response["incomplete_details"] = json!({"reason": "max_output_tokens"});
                }
                self.response["usage"] = usage_json(usage);
                self.response["output"] = json!(self.output);
                let r = self.response.clone();
                out + &self.frame(&format!("response.{status}"), json!({"response": r}))
            }
            Event::Error { message } => self.fail(&format!("generation failed: {message}")),
        }
    }

    fn fail(&mut self, message: &str) -> String {
        let mut out = self.close("incomplete");
        self.response["status"] = json!("failed");
        self.response["error"] = json!({"code": "server_error", "message": message});
        self.response["output"] = json!(self.output);
        let r = self.response.clone();
        out += &self.frame("response.failed", json!({"response": r}));
        out
    }

    /// The response object as it stands (complete after a final event).
    pub fn response(&self) -> Value {
        self.response.clone()
    }

    /// The answer as an assistant turn of a conversation.
    fn answer(&self) -> ChatMessage {
        let mut m = ChatMessage::new("assistant", self.answer_text.clone());
        m.tool_calls = self.answer_calls.clone();
        m.reasoning_content = Some(self.answer_reasoning.clone()).filter(|r| !r.is_empty());
        m
    }
}

/// Responses usage: input (with cached) and output (with reasoning) tokens.
fn usage_json(u: &Usage) -> Value {
    json!({
        "input_tokens": u.prompt_tokens,
        "input_tokens_details": {"cached_tokens": u.cached_tokens},
        "output_tokens": u.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
        "total_tokens": u.prompt_tokens + u.completion_tokens,
    })
}

struct ResponseEncoder {
    builder: ResponseBuilder,
    state: Arc<AppState>,
    keep: Option<Keep>,
}

impl StreamEncoder for ResponseEncoder {
    fn start(&mut self) -> String {
        self.builder.begin()
    }

    fn event(&mut self, ev: &Event) -> String {
        let out = self.builder.event(ev);
        let done = matches!(ev, Event::Done { finish_reason, .. } if *finish_reason != FinishReason::Cancelled);
        if let (true, Some(keep)) = (done, self.keep.take()) {
            keep.store(&self.state, &self.builder, &self.builder.response());
        }
        out
    }

    fn lost(&mut self) -> String {
        self.builder.fail("generation failed: the engine stopped")
    }
}

#[cfg(test)]
mod tests {
    use super::super::state::test_events::{done, token};
    use super::*;

    /// `(type, data)` of each SSE frame; checks each names its type and the numbering.
    fn frames(sse: &str) -> Vec<(String, Value)> {
        let out: Vec<(String, Value)> = sse
            .split("\n\n")
            .filter(|f| !f.is_empty())
            .map(|f| {
                let (name, data) = f.split_once('\n').unwrap();
                let name = name.trim_start_matches("event: ").to_string();
                let data: Value = serde_json::from_str(data.trim_start_matches("data: ")).unwrap();
                assert_eq!(data["type"], json!(name));
                (name, data)
            })
            .collect();
        for (i, (_, d)) in out.iter().enumerate() {
            assert_eq!(d["sequence_number"], json!(i), "{d}");
        }
        out
    }

    /// Synthetic engine events with reasoning, text and a tool call map to a reasoning item
    /// (text and summary events), a message item and a function_call item, in order, and the
    /// final response carries them with reasoning tokens in its usage.
    #[test]
    fn events_map_to_reasoning_message_and_call_items() {
        let ns = HashMap::from([("get_weather".to_string(), "weather".to_string())]);
        let mut b = ResponseBuilder::new("resp_1", "m", 7, json!({"store": true}), true, ns);
        let mut sse = b.begin();
        sse += &b.event(&Event::Started { prompt_tokens: 9, cached_tokens: 4 });
        sse += &b.event(&token("Think", "", vec![]));
        sse += &b.event(&token("ing.", "It is", vec![]));
        sse += &b.event(&token("", " sunny.", vec![ToolDelta::Start { index: 0, id: "call_a".into(), name: "get_weather".into() }]));
        sse += &b.event(&token("", "", vec![ToolDelta::Arguments { index: 0, fragment: "{\"city\":".into() }]));
        sse += &b.event(&token("", "", vec![ToolDelta::Arguments { index: 0, fragment: "\"Paris\"}".into() }]));
        let usage = Usage { prompt_tokens: 9, completion_tokens: 12, cached_tokens: 4, reasoning_tokens: 3 };
        sse += &b.event(&done(FinishReason::ToolCalls, usage));
        let f = frames(&sse);
        let names: Vec<&str> = f.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.reasoning_summary_part.added",
                "response.reasoning_text.delta",
                "response.reasoning_summary_text.delta",
                "response.reasoning_text.delta",
                "response.reasoning_summary_text.delta",
                "response.reasoning_text.done",
                "response.content_part.done",
                "response.reasoning_summary_text.done",
                "response.reasoning_summary_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        let r = b.response();
        assert_eq!(r["status"], "completed");
        assert_eq!(r["output"][0]["type"], "reasoning");
        assert_eq!(r["output"][0]["content"][0]["text"], "Thinking.");
        assert_eq!(r["output"][0]["summary"][0]["text"], "Thinking.");
        assert_eq!(r["output"][1]["content"][0]["text"], "It is sunny.");
        assert_eq!(r["output"][2]["type"], "function_call");
        assert_eq!(r["output"][2]["call_id"], "call_a");
        assert_eq!(r["output"][2]["namespace"], "weather");
        assert_eq!(r["output"][2]["arguments"], "{\"city\":\"Paris\"}");
        assert_eq!(r["usage"]["output_tokens_details"]["reasoning_tokens"], 3);
        assert_eq!(r["usage"]["input_tokens_details"]["cached_tokens"], 4);
        assert_eq!(r["usage"]["total_tokens"], 21);
        assert_eq!(f.last().unwrap().1["response"], r);
        // Each item's output_index is its place in `output`.
        for (name, d) in &f {
            if name == "response.output_item.done" {
                let i = d["output_index"].as_u64().unwrap() as usize;
                assert_eq!(d["item"], r["output"][i]);
            }
        }
        // The stored turn: text, reasoning and the call.
        let a = b.answer();
        assert_eq!((a.content.as_str(), a.reasoning_content.as_deref()), ("It is sunny.", Some("Thinking.")));
        assert_eq!(a.tool_calls[0].arguments, "{\"city\":\"Paris\"}");
    }

    /// Without a summary request, reasoning has text events only; a length finish is
    /// `response.incomplete` with the open item incomplete.
    #[test]
    fn length_finish_is_incomplete() {
        let mut b = ResponseBuilder::new("resp_2", "m", 7, json!({}), false, HashMap::new());
        let mut sse = b.begin();
        sse += &b.event(&token("hm", "Hello", vec![]));
        sse += &b.event(&done(FinishReason::Length, Usage::default()));
        let f = frames(&sse);
        assert!(!f.iter().any(|(n, _)| n.contains("summary")));
        assert_eq!(f.last().unwrap().0, "response.incomplete");
        let r = b.response();
        assert_eq!(r["incomplete_details"]["reason"], "max_output_tokens");
        assert_eq!(r["output"][1]["status"], "incomplete");
        assert_eq!(r["output"][0]["summary"], json!([]));
    }

    /// A call the engine reports complete stays `completed` when the length runs out after it.
    #[test]
    fn a_complete_call_at_a_length_finish_is_completed() {
        let mut b = ResponseBuilder::new("resp_4", "m", 7, json!({}), false, HashMap::new());
        b.event(&token("", "", vec![ToolDelta::Start { index: 0, id: "call_a".into(), name: "f".into() }]));
        b.event(&token("", "", vec![ToolDelta::Arguments { index: 0, fragment: "{}".into() }]));
        let call = ToolCall { id: "call_a".into(), name: "f".into(), arguments: "{}".into() };
        let mut end = done(FinishReason::Length, Usage::default());
        if let Event::Done { tool_calls, .. } = &mut end {
            tool_calls.push(call);
        }
        b.event(&end);
        let r = b.response();
        assert_eq!((r["status"].as_str(), r["output"][0]["status"].as_str()), (Some("incomplete"), Some("completed")));
        let mut cut = ResponseBuilder::new("resp_5", "m", 7, json!({}), false, HashMap::new());
        cut.event(&token("", "", vec![ToolDelta::Start { index: 0, id: "call_b".into(), name: "f".into() }]));
        cut.event(&done(FinishReason::Length, Usage::default()));
        assert_eq!(cut.response()["output"][0]["status"], "incomplete");
    }

    #[test]
    fn errors_fail_the_response() {
        let mut b = ResponseBuilder::new("resp_3", "m", 7, json!({}), false, HashMap::new());
        let sse = b.begin() + &b.event(&token("", "Hi", vec![])) + &b.event(&Event::Error { message: "boom".into() });
        // created, in_progress; the message's added, part added, delta; its done events; failed.
        assert_eq!(frames(&sse).len(), 2 + 3 + 3 + 1);
        assert_eq!(b.response()["status"], "failed");
        assert!(b.response()["error"]["message"].as_str().unwrap().contains("boom"));
    }

    #[test]
    fn input_items_become_one_conversation() {
        let mut c = Conversation { messages: vec![], reasoning: None, images: None, audio: None };
        let items = json!([
            {"role": "developer", "content": "Be brief."},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
            {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Need a tool."}]},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            {"type": "web_search_call", "id": "ws_1", "status": "completed"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Sunny."}]}
        ]);
        for (i, item) in items.as_array().unwrap().iter().enumerate() {
            c.item(item, &format!("input[{i}]")).unwrap();
        }
        let roles: Vec<&str> = c.messages.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool", "assistant"]);
        assert_eq!(c.messages[2].reasoning_content.as_deref(), Some("Need a tool."));
        assert_eq!(c.messages[2].tool_calls[0].name, "get_weather");
        assert_eq!((c.messages[3].tool_call_id.as_deref(), c.messages[3].name.as_deref()), (Some("c1"), Some("get_weather")));
        assert_eq!(c.messages[4].content, "Sunny.");
        assert!(c.item(&json!({"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": "data:x"}]}), "input[9]").is_err());
    }

    #[test]
    fn hosted_tools_are_left_out_and_namespaces_flattened() {
        let body = json!({"tools": [
            {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}},
            {"type": "web_search"},
            {"type": "custom", "name": "apply_patch"},
            {"type": "namespace", "name": "mcp", "tools": [{"type": "function", "name": "g", "description": "G"}]}
        ], "tool_choice": {"type": "function", "name": "g"}, "parallel_tool_calls": false});
        let (tools, ns) = request_tools(body.as_object().unwrap()).unwrap();
        let tools = tools.unwrap();
        let names: Vec<&str> = tools.specs.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["f", "g"]);
        assert_eq!(ns.get("g").map(String::as_str), Some("mcp"));
        assert!(!tools.parallel);
        assert_eq!(tools.choice, weft::tools::ToolChoice::Function("g".into()));
    }

    #[test]
    fn the_store_is_bounded_and_expires() {
        let store = Store::new(2000, Duration::from_secs(3600));
        let big = |n: usize| Keep { history: vec![ChatMessage::new("user", "x".repeat(n))], images: vec![], audio: vec![], input_items: vec![] };
        store.put("a".into(), json!({}), big(1200));
        store.put("b".into(), json!({}), big(1200));
        assert!(store.get("a").is_none() && store.get("b").is_some(), "the oldest is evicted to fit");
        store.put("huge".into(), json!({}), big(5000));
        assert!(store.get("huge").is_none() && store.get("b").is_some());
        assert!(store.delete("b") && !store.delete("b"));
        let short = Store::new(10_000, Duration::from_millis(0));
        short.put("c".into(), json!({}), big(1));
        std::thread::sleep(Duration::from_millis(5));
        assert!(short.get("c").is_none());
    }
}
