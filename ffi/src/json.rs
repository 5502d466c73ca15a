//! The JSON documents the C ABI accepts: engine options and requests. Parsing is strict: unknown
//! fields, wrong types and out-of-range values are errors whose message names the field. A JSON
//! `null` for an optional field means "not given".

use std::path::PathBuf;

use serde_json::{Map, Value};
use weft::engine::{EngineConfig, Input, Request};
use weft::tokenizer::ChatMessage;

use crate::status::{Failure, FfiResult};

/// Parses a whole document that must be a JSON object.
fn parse_object(what: &str, text: &str) -> FfiResult<Map<String, Value>> {
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(other) => Err(Failure::invalid(format!("{what}: expected a JSON object, got {}", kind(&other)))),
        Err(e) => Err(Failure::invalid(format!("{what}: malformed JSON: {e}"))),
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Typed access to an object's fields, with errors naming `<what>.<field>`.
struct Fields<'a> {
    what: &'a str,
    map: Map<String, Value>,
}

impl<'a> Fields<'a> {
    fn new(what: &'a str, map: Map<String, Value>, known: &[&str]) -> FfiResult<Self> {
        if let Some(bad) = map.keys().find(|k| !known.contains(&k.as_str())) {
            return Err(Failure::invalid(format!(
                "{what}: unknown field \"{bad}\" (known fields: {})",
                known.join(", ")
            )));
        }
        Ok(Fields { what, map })
    }

    fn err(&self, field: &str, expected: &str, got: &Value) -> Failure {
        Failure::invalid(format!("{}: \"{field}\" must be {expected}, got {}", self.what, show(got)))
    }

    /// The field's value, `None` when absent or null.
    fn take(&mut self, field: &str) -> Option<Value> {
        self.map.remove(field).filter(|v| !v.is_null())
    }

    fn u64_in(&mut self, field: &str, min: u64, max: u64) -> FfiResult<Option<u64>> {
        let Some(v) = self.take(field) else { return Ok(None) };
        match v.as_u64() {
            Some(n) if (min..=max).contains(&n) => Ok(Some(n)),
            _ if max == u64::MAX => Err(self.err(field, &format!("an integer >= {min}"), &v)),
            _ => Err(self.err(field, &format!("an integer in [{min}, {max}]"), &v)),
        }
    }

    fn usize_min(&mut self, field: &str, min: u64) -> FfiResult<Option<usize>> {
        Ok(self.u64_in(field, min, usize::MAX as u64)?.map(|n| n as usize))
    }

    fn f32(&mut self, field: &str) -> FfiResult<Option<f32>> {
        let Some(v) = self.take(field) else { return Ok(None) };
        match v.as_f64() {
            Some(x) if (x as f32).is_finite() => Ok(Some(x as f32)),
            _ => Err(self.err(field, "a finite number", &v)),
        }
    }

    fn bool(&mut self, field: &str) -> FfiResult<Option<bool>> {
        let Some(v) = self.take(field) else { return Ok(None) };
        v.as_bool().map(Some).ok_or_else(|| self.err(field, "true or false", &v))
    }

    fn string(&mut self, field: &str) -> FfiResult<Option<String>> {
        let Some(v) = self.take(field) else { return Ok(None) };
        match v {
            Value::String(s) => Ok(Some(s)),
            other => Err(self.err(field, "a string", &other)),
        }
    }
}

/// A short rendering of an offending value for error messages.
fn show(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() > 40 {
        format!("{}… ({})", s.chars().take(40).collect::<String>(), kind(v))
    } else {
        s
    }
}

/// Engine options (`weft_engine_new`).
pub(crate) struct Options {
    /// `None`: the default model (downloaded on first use).
    pub model: Option<PathBuf>,
    pub config: EngineConfig,
}

pub(crate) const OPTION_FIELDS: &[&str] = &[
    "model",
    "max_batch",
    "prompt_concurrency",
    "prefill_step_size",
    "kv_budget_bytes",
    "prompt_cache_bytes",
    "kv_bits",
    "kv_group_size",
    "quantized_kv_start",
];

pub(crate) fn parse_options(text: &str) -> FfiResult<Options> {
    let mut f = Fields::new("options", parse_object("options", text)?, OPTION_FIELDS)?;
    let mut config = EngineConfig::default();
    let model = f.string("model")?.map(PathBuf::from);
    if let Some(n) = f.usize_min("max_batch", 1)? {
        config.max_batch = n;
    }
    if let Some(n) = f.usize_min("prompt_concurrency", 1)? {
        config.prompt_concurrency = n;
    }
    if let Some(n) = f.usize_min("prefill_step_size", 1)? {
        config.prefill_step_size = n;
    }
    config.kv_budget_bytes = f.u64_in("kv_budget_bytes", 1, u64::MAX)?;
    if let Some(n) = f.u64_in("prompt_cache_bytes", 0, u64::MAX)? {
        config.prompt_cache_bytes = n;
    }
    // Which bit widths MLX quantizes to is the engine's check (EngineConfig::validate).
    config.kv_bits = f.u64_in("kv_bits", 1, 16)?.map(|b| b as i32);
    if let Some(n) = f.u64_in("kv_group_size", 1, 1 << 20)? {
        config.kv_group_size = n as i32;
    }
    if let Some(n) = f.usize_min("quantized_kv_start", 0)? {
        config.quantized_kv_start = n;
    }
    Ok(Options { model, config })
}

pub(crate) const REQUEST_FIELDS: &[&str] = &[
    "prompt",
    "messages",
    "prompt_ids",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "penalty_context",
    "logit_bias",
    "stop",
    "ignore_eos",
    "logprobs",
    "top_logprobs",
];

/// The most top alternatives a request may ask for (the engine's limit, as OpenAI's).
const MAX_TOP_LOGPROBS: u64 = 20;

pub(crate) fn parse_request(text: &str) -> FfiResult<Request> {
    let mut f = Fields::new("request", parse_object("request", text)?, REQUEST_FIELDS)?;

    let prompt = f.take("prompt");
    let messages = f.take("messages");
    let prompt_ids = f.take("prompt_ids");
    let given = [&prompt, &messages, &prompt_ids].iter().filter(|v| v.is_some()).count();
    if given != 1 {
        return Err(Failure::invalid(format!(
            "request: exactly one of \"prompt\", \"messages\" or \"prompt_ids\" is required, got {given}"
        )));
    }
    let input = if let Some(v) = prompt {
        match v {
            Value::String(s) => Input::Prompt(s),
            other => return Err(f.err("prompt", "a string", &other)),
        }
    } else if let Some(v) = messages {
        Input::Messages(parse_messages(&v)?)
    } else {
        let v = prompt_ids.unwrap();
        let Value::Array(items) = &v else { return Err(f.err("prompt_ids", "an array of token ids", &v)) };
        let mut ids = Vec::with_capacity(items.len());
        for (i, x) in items.iter().enumerate() {
            match x.as_u64().filter(|&n| n <= u32::MAX as u64) {
                Some(n) => ids.push(n as u32),
                None => {
                    return Err(Failure::invalid(format!(
                        "request: \"prompt_ids\"[{i}] must be an integer in [0, 4294967295], got {}",
                        show(x)
                    )))
                }
            }
        }
        Input::Tokens(ids)
    };

    let mut req = Request::new(input);
    // Capped so the engine's KV projection (prompt + max_tokens) cannot overflow.
    if let Some(n) = f.u64_in("max_tokens", 1, u32::MAX as u64)? {
        req.max_tokens = n as usize;
    }
    let s = &mut req.sampling;
    if let Some(x) = f.f32("temperature")? {
        s.temperature = x;
    }
    if let Some(x) = f.f32("top_p")? {
        s.top_p = x;
    }
    if let Some(n) = f.u64_in("top_k", 0, u32::MAX as u64)? {
        s.top_k = n as u32;
    }
    if let Some(x) = f.f32("min_p")? {
        s.min_p = x;
    }
    s.seed = f.u64_in("seed", 0, u64::MAX)?;
    s.repetition_penalty = f.f32("repetition_penalty")?;
    s.presence_penalty = f.f32("presence_penalty")?;
    s.frequency_penalty = f.f32("frequency_penalty")?;
    if let Some(n) = f.u64_in("penalty_context", 0, u32::MAX as u64)? {
        s.penalty_context = n as usize;
    }
    if let Some(v) = f.take("logit_bias") {
        s.logit_bias = parse_logit_bias(&v)?;
    }
    if let Some(v) = f.take("stop") {
        req.stop = match v {
            Value::String(s) => vec![s],
            Value::Array(items) => {
                let mut out = Vec::with_capacity(items.len());
                for (i, x) in items.into_iter().enumerate() {
                    match x {
                        Value::String(s) => out.push(s),
                        other => {
                            return Err(Failure::invalid(format!(
                                "request: \"stop\"[{i}] must be a string, got {}",
                                show(&other)
                            )))
                        }
                    }
                }
                out
            }
            other => return Err(f.err("stop", "a string or an array of strings", &other)),
        };
        if let Some(i) = req.stop.iter().position(|s| s.is_empty()) {
            return Err(Failure::invalid(format!("request: \"stop\"[{i}] must not be empty")));
        }
    }
    if let Some(b) = f.bool("ignore_eos")? {
        req.ignore_eos = b;
    }
    let logprobs = f.bool("logprobs")?.unwrap_or(false);
    let top = f.u64_in("top_logprobs", 0, MAX_TOP_LOGPROBS)?;
    req.logprobs = match (logprobs, top) {
        (true, top) => Some(top.unwrap_or(0) as usize),
        (false, None) => None,
        (false, Some(_)) => {
            return Err(Failure::invalid("request: \"top_logprobs\" needs \"logprobs\": true"));
        }
    };
    Ok(req)
}

fn parse_messages(v: &Value) -> FfiResult<Vec<ChatMessage>> {
    let Value::Array(items) = v else {
        return Err(Failure::invalid(format!(
            "request: \"messages\" must be an array of {{\"role\", \"content\"}} objects, got {}",
            show(v)
        )));
    };
    if items.is_empty() {
        return Err(Failure::invalid("request: \"messages\" must not be empty"));
    }
    let mut out = Vec::with_capacity(items.len());
    for (i, m) in items.iter().enumerate() {
        let what = format!("request: \"messages\"[{i}]");
        let Value::Object(map) = m else {
            return Err(Failure::invalid(format!("{what} must be an object, got {}", show(m))));
        };
        if let Some(bad) = map.keys().find(|k| *k != "role" && *k != "content") {
            return Err(Failure::invalid(format!("{what}: unknown field \"{bad}\" (known fields: role, content)")));
        }
        let field = |name: &str| match map.get(name) {
            Some(Value::String(s)) => Ok(s.clone()),
            Some(other) => Err(Failure::invalid(format!("{what}.{name} must be a string, got {}", show(other)))),
            None => Err(Failure::invalid(format!("{what}.{name} is required"))),
        };
        out.push(ChatMessage { role: field("role")?, content: field("content")? });
    }
    Ok(out)
}

/// `{"<token id>": bias, ...}` (OpenAI's shape).
fn parse_logit_bias(v: &Value) -> FfiResult<Vec<(u32, f32)>> {
    let Value::Object(map) = v else {
        return Err(Failure::invalid(format!(
            "request: \"logit_bias\" must be an object mapping token ids to numbers, got {}",
            show(v)
        )));
    };
    let mut out = Vec::with_capacity(map.len());
    for (k, b) in map {
        let id: u32 = k.parse().map_err(|_| {
            Failure::invalid(format!("request: \"logit_bias\" key \"{k}\" must be a token id (a decimal integer)"))
        })?;
        let bias = b.as_f64().map(|x| x as f32).filter(|x| x.is_finite()).ok_or_else(|| {
            Failure::invalid(format!("request: \"logit_bias\"[\"{k}\"] must be a finite number, got {}", show(b)))
        })?;
        out.push((id, bias));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        parse_request(text).expect_err("expected an error").message
    }

    #[test]
    fn request_fields_and_errors() {
        let r = parse_request(
            r#"{"prompt_ids":[1,2,3],"max_tokens":4,"temperature":0.5,"top_k":3,"seed":7,
                "stop":"x","logit_bias":{"5":-100},"ignore_eos":true,"logprobs":true,"top_logprobs":2,
                "top_p":null}"#,
        )
        .unwrap();
        assert!(matches!(r.input, Input::Tokens(ref v) if v == &[1, 2, 3]));
        assert_eq!(r.max_tokens, 4);
        assert_eq!(r.sampling.temperature, 0.5);
        assert_eq!(r.sampling.top_k, 3);
        assert_eq!(r.sampling.seed, Some(7));
        assert_eq!(r.sampling.top_p, 1.0);
        assert_eq!(r.stop, vec!["x".to_string()]);
        assert_eq!(r.sampling.logit_bias, vec![(5, -100.0)]);
        assert!(r.ignore_eos);
        assert_eq!(r.logprobs, Some(2));

        assert!(err("{").contains("malformed JSON"));
        assert!(err("[]").contains("expected a JSON object"));
        assert!(err(r#"{"prompt":"a","bogus":1}"#).contains("unknown field \"bogus\""));
        assert!(err(r#"{"prompt":"a","max_tokens":"7"}"#).contains("\"max_tokens\" must be an integer"));
        assert!(err(r#"{"prompt":"a","max_tokens":99999999999}"#).contains("[1, 4294967295]"));
        assert!(err(r#"{"prompt":"a","max_tokens":0}"#).contains("\"max_tokens\""));
        assert!(err(r#"{"prompt":"a","temperature":"hot"}"#).contains("\"temperature\" must be a finite number"));
        assert!(err(r#"{"prompt_ids":[1,-2]}"#).contains("\"prompt_ids\"[1]"));
        assert!(err(r#"{"prompt":"a","prompt_ids":[1]}"#).contains("exactly one of"));
        assert!(err(r#"{}"#).contains("exactly one of"));
        assert!(err(r#"{"messages":[{"role":"user"}]}"#).contains("\"messages\"[0].content is required"));
        assert!(err(r#"{"prompt":"a","logit_bias":{"x":1}}"#).contains("\"logit_bias\" key \"x\""));
        assert!(err(r#"{"prompt":"a","top_logprobs":2}"#).contains("needs \"logprobs\""));
        assert!(err(r#"{"prompt":"a","top_logprobs":21,"logprobs":true}"#).contains("[0, 20]"));
        assert!(err(r#"{"prompt":"a","stop":[1]}"#).contains("\"stop\"[0]"));
    }

    #[test]
    fn options_fields_and_errors() {
        let o = parse_options(r#"{"model":"m","max_batch":2,"kv_budget_bytes":null,"prompt_cache_bytes":5}"#).unwrap();
        assert_eq!(o.model, Some(PathBuf::from("m")));
        assert_eq!(o.config.max_batch, 2);
        assert_eq!(o.config.kv_budget_bytes, None);
        assert_eq!(o.config.prompt_cache_bytes, 5);
        assert!(parse_options("{}").unwrap().model.is_none());
        let o = parse_options(r#"{"kv_bits":4,"kv_group_size":32,"quantized_kv_start":100}"#).unwrap();
        assert_eq!((o.config.kv_bits, o.config.kv_group_size, o.config.quantized_kv_start), (Some(4), 32, 100));
        assert_eq!(parse_options("{}").unwrap().config.kv_bits, None);
        let e = parse_options(r#"{"kv_bits":0}"#).err().unwrap().message;
        assert!(e.contains("\"kv_bits\""), "{e}");
        let e = parse_options(r#"{"max_batchh":2}"#).err().unwrap().message;
        assert!(e.contains("unknown field \"max_batchh\""), "{e}");
        let e = parse_options(r#"{"max_batch":0}"#).err().unwrap().message;
        assert!(e.contains("\"max_batch\" must be an integer >= 1"), "{e}");
        let e = parse_options(r#"{"model":3}"#).err().unwrap().message;
        assert!(e.contains("\"model\" must be a string"), "{e}");
    }
}
