//! Reading request bodies field by field, so that every wrong type or out-of-range value is a
//! 400 naming the field (serde's derive would report the first problem in its own words and
//! could not tell `null` from absent the way the OpenAI SDKs send them).

use axum::body::BodyDataStream;
use futures_core::Stream as _;
use serde_json::{Map, Value};
use weft::contract::{parse_generation_fields, GenerationFields, Spelling, GENERATION_FIELDS};
use weft::engine::{Constraint, Request};
use weft::sampling::SamplingParams;

use super::errors::{ApiError, ErrorKind};
use super::state::Defaults;

pub type Object = Map<String, Value>;

/// The body as a JSON object: malformed JSON and non-objects are 400s.
pub fn parse_body(bytes: &[u8]) -> Result<Object, ApiError> {
    match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(ApiError::invalid("the request body must be a JSON object")),
        Err(e) => Err(ApiError::invalid(format!("invalid JSON in request body: {e}"))),
    }
}

/// The request body as a JSON object, at most `limit` bytes. A body declared (Content-Length)
/// or found larger is a 413 before any of it is parsed; what the client is still sending is
/// read and discarded for a moment (bounded) so that it sees the 413 rather than a reset.
pub async fn read_body(req: axum::extract::Request, limit: usize) -> Result<Object, ApiError> {
    let declared = req
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    // A client waiting for `100 Continue` has sent nothing yet: reading the body would send it
    // the go-ahead for a body that is refused anyway.
    let expects_continue = req
        .headers()
        .get(axum::http::header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    let too_large = || ApiError::new(ErrorKind::TooLarge, format!("the request body is larger than {limit} bytes"));
    let mut stream = req.into_body().into_data_stream();
    if declared.is_some_and(|n| n > limit as u64) {
        if !expects_continue {
            drain(&mut stream).await;
        }
        return Err(too_large());
    }
    let mut bytes = Vec::with_capacity(declared.unwrap_or(0).min(limit as u64) as usize);
    while let Some(chunk) = next_chunk(&mut stream).await {
        let chunk = chunk.map_err(|e| {
            use std::error::Error as _;
            if e.source().is_some_and(|s| s.is::<super::conn::BodyTimeout>()) {
                ApiError::new(ErrorKind::Timeout, e.to_string())
            } else {
                ApiError::invalid(format!("cannot read the request body: {e}"))
            }
        })?;
        if bytes.len() + chunk.len() > limit {
            drain(&mut stream).await;
            return Err(too_large());
        }
        bytes.extend_from_slice(&chunk);
    }
    parse_body(&bytes)
}

/// Discards what the client keeps sending, up to [`DRAIN_BYTES`] and while it arrives without
/// a pause of [`DRAIN_IDLE`].
async fn drain(stream: &mut BodyDataStream) {
    let mut seen = 0usize;
    while seen < DRAIN_BYTES {
        match tokio::time::timeout(DRAIN_IDLE, next_chunk(stream)).await {
            Ok(Some(Ok(chunk))) => seen += chunk.len(),
            _ => return,
        }
    }
}

async fn next_chunk(stream: &mut BodyDataStream) -> Option<Result<axum::body::Bytes, axum::Error>> {
    std::future::poll_fn(|cx| std::pin::Pin::new(&mut *stream).poll_next(cx)).await
}

const DRAIN_BYTES: usize = 64 << 20;
const DRAIN_IDLE: std::time::Duration = std::time::Duration::from_millis(500);

/// `m[key]`, with `null` meaning absent.
pub fn get<'a>(m: &'a Object, key: &str) -> Option<&'a Value> {
    m.get(key).filter(|v| !v.is_null())
}

pub fn opt_bool(m: &Object, key: &str) -> Result<Option<bool>, ApiError> {
    match get(m, key) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(ApiError::field(key, format!("`{key}` must be a boolean"))),
    }
}

pub fn opt_int(m: &Object, key: &str) -> Result<Option<i64>, ApiError> {
    match get(m, key) {
        None => Ok(None),
        Some(Value::Number(n)) => match n.as_i64() {
            Some(i) => Ok(Some(i)),
            None => match n.as_u64() {
                Some(u) => Ok(Some(u.min(i64::MAX as u64) as i64)),
                None => Err(ApiError::field(key, format!("`{key}` must be an integer"))),
            },
        },
        Some(_) => Err(ApiError::field(key, format!("`{key}` must be an integer"))),
    }
}

/// An integer `>= min`.
pub fn opt_count(m: &Object, key: &str, min: i64) -> Result<Option<usize>, ApiError> {
    match opt_int(m, key)? {
        None => Ok(None),
        Some(v) if v >= min => Ok(Some(v as usize)),
        Some(v) => Err(ApiError::field(key, format!("`{key}` must be at least {min}, got {v}"))),
    }
}

pub fn opt_str<'a>(m: &'a Object, key: &str) -> Result<Option<&'a str>, ApiError> {
    match get(m, key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(ApiError::field(key, format!("`{key}` must be a string"))),
    }
}

/// Which of the request contract's generation fields a protocol carries, and under which key.
pub struct Dialect {
    /// Contract field names (`weft::contract::GENERATION_FIELDS`) the protocol has.
    pub fields: &'static [&'static str],
    /// `(field, key)` for fields the protocol names otherwise.
    pub aliases: &'static [(&'static str, &'static str)],
}

/// OpenAI's chat and completions (plus mlx_lm.server's extensions: `top_k`, `min_p`,
/// `repetition_penalty`, `repetition_context_size`, and Weft's `ignore_eos`).
pub const OPENAI: Dialect = Dialect { fields: GENERATION_FIELDS, aliases: &[("penalty_context", "repetition_context_size")] };

/// Anthropic's messages: temperature, top_p, top_k, stop_sequences (and `ignore_eos`).
pub const ANTHROPIC: Dialect = Dialect {
    fields: &["max_tokens", "temperature", "top_p", "top_k", "stop", "ignore_eos", "num_draft_tokens"],
    aliases: &[("stop", "stop_sequences")],
};

/// The sampling, stop and length fields of `m`, read by the request contract (the one set of
/// rules and messages every face uses; a bad value is a 400 whose `param` is the body's key),
/// then set on `request` over the server's defaults. `max_tokens_key` is the body key that
/// holds the length limit (OpenAI's chat prefers `max_completion_tokens`).
pub fn generation(
    m: &Object,
    dialect: &Dialect,
    max_tokens_key: &'static str,
    d: &Defaults,
    request: &mut Request,
) -> Result<(), ApiError> {
    let mut aliases: Vec<(&str, &str)> = dialect.aliases.to_vec();
    aliases.push(("max_tokens", max_tokens_key));
    // Only the protocol's fields, so the others (messages, tools...) are not copied.
    let mut fields = Object::new();
    for &field in dialect.fields {
        let key = aliases.iter().find(|(f, _)| *f == field).map_or(field, |(_, k)| *k);
        let Some(v) = get(m, key) else { continue };
        match (field, v) {
            // mlx_lm.server's spellings of "off": top_k -1, repetition_penalty 0 (or 1).
            ("top_k", v) if v.as_i64() == Some(-1) => fields.insert(key.into(), Value::from(0)),
            ("repetition_penalty", v) if matches!(v.as_f64(), Some(x) if x == 0.0 || x == 1.0) => continue,
            _ => fields.insert(key.into(), v.clone()),
        };
    }
    let g = parse_generation_fields(&Value::Object(fields), Spelling::Snake, &aliases)
        .map_err(|e| ApiError::field(&e.key, e.message))?;
    request.max_tokens = d.max_tokens;
    request.sampling = SamplingParams {
        temperature: d.temperature,
        top_p: d.top_p,
        top_k: d.top_k,
        min_p: d.min_p,
        ..SamplingParams::default()
    };
    // Penalties of 0 are off (no logits processor, so greedy steps stay pipelined).
    let off = |p: Option<f32>| p.filter(|&x| x != 0.0);
    let g = GenerationFields { presence_penalty: off(g.presence_penalty), frequency_penalty: off(g.frequency_penalty), ..g };
    g.apply(request);
    Ok(())
}

/// OpenAI's Responses: `max_output_tokens`, temperature, top_p (and the extensions top_k,
/// min_p, seed, ignore_eos, as on chat).
pub const RESPONSES: Dialect =
    Dialect { fields: &["max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "ignore_eos", "num_draft_tokens"], aliases: &[] };

/// Reasoning tokens for each OpenAI `reasoning_effort` / Responses `reasoning.effort` (the
/// budget after which the engine closes the model's reasoning itself); `none` turns thinking
/// off. Documented in docs/server.md.
pub const REASONING_EFFORTS: &[(&str, Option<usize>)] = &[
    ("none", None),
    ("minimal", Some(256)),
    ("low", Some(1024)),
    ("medium", Some(4096)),
    ("high", Some(16384)),
    ("xhigh", Some(32768)),
];

/// A reasoning effort (`key` is the field as the body names it) set on `request`: its budget
/// (`reasoning_budget`) and the template's `enable_thinking` (false for `none`, else true).
/// `null` leaves both to the model and the server's defaults.
pub fn reasoning_effort(v: Option<&Value>, key: &str, request: &mut Request) -> Result<(), ApiError> {
    let effort = match v {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::String(s)) => s.as_str(),
        Some(_) => return Err(ApiError::field(key, format!("`{key}` must be a string"))),
    };
    let Some(&(_, budget)) = REASONING_EFFORTS.iter().find(|(name, _)| *name == effort) else {
        let names: Vec<&str> = REASONING_EFFORTS.iter().map(|(n, _)| *n).collect();
        return Err(ApiError::field(key, format!("`{key}` must be one of {}, got {effort:?}", names.join(", "))));
    };
    request.reasoning_budget = budget;
    request.chat_template_kwargs.insert("enable_thinking".into(), Value::Bool(budget.is_some()));
    Ok(())
}

/// What only the model can decide about the sampling fields (logit-bias ids against the
/// vocabulary), checked before the prompt is tokenized; the engine names the field at fault.
pub fn check_sampling(request: &Request, vocab_size: usize) -> Result<(), ApiError> {
    request.sampling.validate(vocab_size).map_err(ApiError::from_engine)
}

/// `n` (and `best_of`): only one choice per request.
pub fn single_choice(m: &Object) -> Result<(), ApiError> {
    for key in ["n", "best_of"] {
        if let Some(n) = opt_int(m, key)? {
            if n != 1 {
                return Err(ApiError::field(key, format!("`{key}` must be 1 (one choice per request), got {n}")));
            }
        }
    }
    Ok(())
}

/// The constraint fields: OpenAI's `response_format` (`text`, `json_object`, `json_schema`) and
/// the extensions `json_schema`, `regex`, `grammar` (Lark) and `choice`, at most one, by the
/// request contract's rules. Returns the field it came from too, the `param` of later errors.
pub fn constraint(m: &Object) -> Result<Option<(&'static str, Constraint)>, ApiError> {
    let given = constraint_field(m);
    let body = Value::Object(m.clone());
    match weft::contract::parse_constraint(&body, weft::contract::Spelling::Snake) {
        Ok(c) => Ok(c.map(|c| (given.unwrap_or("response_format"), c))),
        Err(e) => Err(constraint_param(ApiError::from_engine(e), given)),
    }
}

/// The constraint field the request gives, if any.
pub fn constraint_field(m: &Object) -> Option<&'static str> {
    CONSTRAINT_FIELDS.iter().copied().find(|k| get(m, k).is_some())
}

/// The engine names a constraint by its kind (`json_schema` for a schema); the request may have
/// given it as `response_format`, which is then the `param` (the key is structured: no message
/// is parsed).
pub fn constraint_param(mut e: ApiError, given: Option<&'static str>) -> ApiError {
    if let (Some(given), Some(param)) = (given, e.param.as_deref()) {
        if param != given && CONSTRAINT_FIELDS.contains(&param) {
            e.param = Some(given.to_string());
        }
    }
    e
}

const CONSTRAINT_FIELDS: &[&str] = &["response_format", "json_schema", "regex", "grammar", "choice"];

