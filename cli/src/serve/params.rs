//! Reading request bodies field by field, so that every wrong type or out-of-range value is a
//! 400 naming the field (serde's derive would report the first problem in its own words and
//! could not tell `null` from absent the way the OpenAI SDKs send them).

use axum::body::BodyDataStream;
use futures_core::Stream as _;
use serde_json::{Map, Value};
use weft::engine::Constraint;
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
    let too_large = || ApiError::new(ErrorKind::TooLarge, format!("the request body is larger than {limit} bytes"));
    let mut stream = req.into_body().into_data_stream();
    if declared.is_some_and(|n| n > limit as u64) {
        drain(&mut stream).await;
        return Err(too_large());
    }
    let mut bytes = Vec::with_capacity(declared.unwrap_or(0) as usize);
    while let Some(chunk) = next_chunk(&mut stream).await {
        let chunk = chunk.map_err(|e| ApiError::invalid(format!("cannot read the request body: {e}")))?;
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

pub fn opt_f64(m: &Object, key: &str) -> Result<Option<f64>, ApiError> {
    match get(m, key) {
        None => Ok(None),
        Some(Value::Number(n)) => Ok(n.as_f64()),
        Some(_) => Err(ApiError::field(key, format!("`{key}` must be a number"))),
    }
}

/// A number within `[lo, hi]`.
pub fn opt_ranged(m: &Object, key: &str, lo: f64, hi: f64) -> Result<Option<f32>, ApiError> {
    match opt_f64(m, key)? {
        None => Ok(None),
        Some(v) if v >= lo && v <= hi => Ok(Some(v as f32)),
        Some(v) => Err(ApiError::field(key, format!("`{key}` must be between {lo} and {hi}, got {v}"))),
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

/// Stop strings: a string or an array of strings (OpenAI `stop`, Anthropic `stop_sequences`).
pub fn stop_strings(m: &Object, key: &str) -> Result<Vec<String>, ApiError> {
    let list = match get(m, key) {
        None => return Ok(Vec::new()),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| v.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| ApiError::field(key, format!("`{key}` must be a string or an array of strings")))?,
        Some(_) => return Err(ApiError::field(key, format!("`{key}` must be a string or an array of strings"))),
    };
    if list.iter().any(String::is_empty) {
        return Err(ApiError::field(key, format!("`{key}` must not contain empty strings")));
    }
    Ok(list)
}

/// `max_tokens` (or the first of several names present), at least 1; the server default when
/// absent.
pub fn max_tokens(m: &Object, keys: &[&str], default: usize) -> Result<usize, ApiError> {
    for key in keys {
        if let Some(n) = opt_count(m, key, 1)? {
            return Ok(n);
        }
    }
    Ok(default)
}

/// Sampling fields shared by the OpenAI endpoints (and the subset Anthropic has): temperature,
/// top_p, top_k, min_p, the penalties (mlx_lm.server's names and meaning), logit_bias, seed.
pub fn sampling(m: &Object, d: &Defaults, vocab_size: usize) -> Result<SamplingParams, ApiError> {
    let temperature = opt_ranged(m, "temperature", 0.0, f64::MAX)?.unwrap_or(d.temperature);
    let top_p = match opt_f64(m, "top_p")? {
        None => d.top_p,
        Some(v) if v > 0.0 && v <= 1.0 => v as f32,
        Some(v) => return Err(ApiError::field("top_p", format!("`top_p` must be in (0, 1], got {v}"))),
    };
    let top_k = match opt_int(m, "top_k")? {
        None => d.top_k,
        // OpenAI-style clients sometimes send -1 for "off".
        Some(-1) => 0,
        Some(v) if (0..=u32::MAX as i64).contains(&v) => v as u32,
        Some(v) => return Err(ApiError::field("top_k", format!("`top_k` must be at least 0, got {v}"))),
    };
    let min_p = opt_ranged(m, "min_p", 0.0, 1.0)?.unwrap_or(d.min_p);
    let nonzero = |v: Option<f32>, off: f32| v.filter(|&p| p != off);
    let repetition_penalty = match opt_f64(m, "repetition_penalty")? {
        // mlx_lm.server: 0 (its default) means off.
        None => None,
        Some(v) if v == 0.0 || v == 1.0 => None,
        Some(v) if v > 0.0 && v.is_finite() => Some(v as f32),
        Some(v) => {
            return Err(ApiError::field("repetition_penalty", format!("`repetition_penalty` must be > 0, got {v}")))
        }
    };
    let presence_penalty = nonzero(opt_ranged(m, "presence_penalty", -1e9, 1e9)?, 0.0);
    let frequency_penalty = nonzero(opt_ranged(m, "frequency_penalty", -1e9, 1e9)?, 0.0);
    let penalty_context = opt_count(m, "repetition_context_size", 1)?.unwrap_or(20);
    let seed = opt_int(m, "seed")?.map(|s| s as u64);
    let logit_bias = match get(m, "logit_bias") {
        None => Vec::new(),
        Some(Value::Object(b)) => {
            let mut out = Vec::with_capacity(b.len());
            for (k, v) in b {
                let id: u32 = k.trim().parse().map_err(|_| {
                    ApiError::field("logit_bias", format!("`logit_bias` keys must be token ids, got {k:?}"))
                })?;
                if id as usize >= vocab_size {
                    return Err(ApiError::field(
                        "logit_bias",
                        format!("`logit_bias` token id {id} is outside the vocabulary (size {vocab_size})"),
                    ));
                }
                let bias = v.as_f64().filter(|b| b.is_finite()).ok_or_else(|| {
                    ApiError::field("logit_bias", format!("`logit_bias` values must be numbers (token {k})"))
                })?;
                out.push((id, bias as f32));
            }
            out
        }
        Some(_) => return Err(ApiError::field("logit_bias", "`logit_bias` must be an object of token id to bias")),
    };
    Ok(SamplingParams {
        temperature,
        top_p,
        top_k,
        min_p,
        repetition_penalty,
        presence_penalty,
        frequency_penalty,
        penalty_context,
        logit_bias,
        seed,
    })
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
        Err(e) => {
            let message = match e {
                weft::Error::InvalidRequest(m) => m,
                other => other.to_string(),
            };
            let param = CONSTRAINT_FIELDS.iter().copied().find(|k| message.starts_with(k)).or(given).unwrap_or("response_format");
            Err(ApiError::field(param, message))
        }
    }
}

/// The constraint field the request gives, if any.
pub fn constraint_field(m: &Object) -> Option<&'static str> {
    CONSTRAINT_FIELDS.iter().copied().find(|k| get(m, k).is_some())
}

/// A refused submit names the constraint field when the engine's message is about it (a schema
/// or grammar that does not compile, or accepts nothing).
pub fn constraint_error(mut e: ApiError, param: Option<&'static str>) -> ApiError {
    let about_constraint = CONSTRAINT_FIELDS.iter().any(|k| e.message.starts_with(k));
    if let (Some(param), None, true) = (param, &e.param, about_constraint) {
        if e.kind == ErrorKind::InvalidRequest {
            e.param = Some(param.to_string());
        }
    }
    e
}

const CONSTRAINT_FIELDS: &[&str] = &["response_format", "json_schema", "regex", "grammar", "choice"];
