//! The one request contract: the schema of a generation request and of engine options as JSON
//! values, their validation and their error messages, shared by every face (the C ABI's JSON,
//! Node's and Swift's option objects).
//!
//! A face turns its wire format into a [`serde_json::Value`] and calls [`parse_request`] or
//! [`parse_engine_options`] with the [`Spelling`] its users write keys in, so that messages name
//! fields the way the caller spelled them (`max_tokens` in C, `maxTokens` in Node and Swift).
//!
//! Parsing is strict: unknown keys are rejected (with a "did you mean" suggestion), wrong types
//! and out-of-range values name the field and the value, and `null` means "not given". The
//! range rules of sampling fields are those of [`SamplingParams::validate`], checked here with
//! the caller's field names; what needs the model (token ids against the vocabulary, the KV
//! group size against the head size, supported bit widths) stays with the engine.
//!
//! [`SamplingParams::validate`]: crate::sampling::SamplingParams::validate

use std::borrow::Cow;
use std::path::PathBuf;

use once_cell::sync::Lazy;
use serde_json::{Map, Value};

use crate::engine::{Constraint, EngineConfig, Input, Request};
use crate::kernels::{CpuActivations, CpuKernels};
use crate::loading::{GgufWeights, LoadOptions};
use crate::tokenizer::ChatMessage;
use crate::vision::source::LocalMedia;
use crate::{Error, Result};

/// How a face spells keys, and so how messages name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spelling {
    /// `max_tokens` (the C ABI, HTTP).
    Snake,
    /// `maxTokens` (Node, Swift).
    Camel,
}

impl Spelling {
    /// The key of the field whose snake_case name is `snake`.
    pub fn key(self, snake: &str) -> Cow<'_, str> {
        match self {
            Spelling::Snake => Cow::Borrowed(snake),
            Spelling::Camel => {
                let mut out = String::with_capacity(snake.len());
                let mut upper = false;
                for c in snake.chars() {
                    if c == '_' {
                        upper = true;
                    } else if upper {
                        out.extend(c.to_uppercase());
                        upper = false;
                    } else {
                        out.push(c);
                    }
                }
                Cow::Owned(out)
            }
        }
    }
}

/// Engine options: the model to load, how it computes, and the engine's configuration.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// A model directory or GGUF file, a name the store knows, or a Hugging Face repo id
    /// (`org/repo[@revision][:file]`); `None`: the default model (downloaded on first use).
    /// [`EngineOptions::model_path`] turns it into a local path.
    pub model: Option<PathBuf>,
    /// `cpu_kernels`: `"fast"` (Weft's kernels) or `"exact"` (MLX's, bit for bit mlx-lm);
    /// `None` leaves it to [`EngineOptions::load_options`].
    pub cpu_kernels: Option<CpuKernels>,
    /// `cpu_activations`: `"float"` or `"int8"`, what fast mode's quantized matmul multiplies
    /// the weights with below 16 rows (see [`CpuActivations`]); `None` as above.
    pub cpu_activations: Option<CpuActivations>,
    /// `gguf_weights`: `"native"` or `"dequantize"` (see [`GgufWeights`]); `None` as above.
    pub gguf_weights: Option<GgufWeights>,
    pub config: EngineConfig,
}

impl EngineOptions {
    /// The load options of an engine made from these options: those given, and each one left
    /// unset taken from the environment ([`crate::env::load_options`]: `WEFT_CPU_KERNELS`,
    /// `WEFT_GGUF_WEIGHTS`, ...) or else its default. The library faces (C, Node, Swift) call
    /// this and [`EngineOptions::engine_config`]; it is their one read of the environment.
    pub fn load_options(&self) -> Result<LoadOptions> {
        crate::env::load_options(self.cpu_kernels, self.cpu_activations, self.gguf_weights)
    }

    /// The local path of the model these options name, fetching it first if needed
    /// ([`crate::model_store::resolve_model`]); a Hub model with the Hub options the
    /// environment sets ([`crate::model_store::HubOptions::from_env`]: `HF_ENDPOINT`,
    /// `HF_TOKEN`, `HF_HUB_OFFLINE`, the cache), read only for a repo id. `progress` hears about
    /// downloads; setting `cancel` stops a Hub download.
    pub fn model_path(
        &self,
        progress: &mut dyn FnMut(crate::model_store::Progress),
        cancel: &std::sync::atomic::AtomicBool,
    ) -> Result<PathBuf> {
        use crate::model_store::{resolve_model, HubOptions};
        resolve_model(self.model.as_deref(), HubOptions::from_env, progress, cancel)
    }

    /// The engine configuration with what the environment sets and the contract has no field
    /// for filled in ([`crate::env::engine_config`]: `WEFT_DECODE`, and `WEFT_FAULTS` in builds
    /// with the `faults` feature).
    pub fn engine_config(&self) -> Result<EngineConfig> {
        crate::env::engine_config(self.config.clone())
    }
}

/// Request fields, snake_case (a face spells them with [`Spelling::key`]): the inputs, the
/// [`GENERATION_FIELDS`], then output and constraint options.
pub static REQUEST_FIELDS: Lazy<Vec<&'static str>> = Lazy::new(|| {
    const INPUTS: &[&str] = &["prompt", "messages", "prompt_ids", "images", "audio"];
    const OUTPUT: &[&str] = &[
        "logprobs",
        "top_logprobs",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "response_format",
        "json_schema",
        "regex",
        "grammar",
        "choice",
        "chat_template_kwargs",
        "reasoning_budget",
    ];
    INPUTS.iter().chain(GENERATION_FIELDS).chain(OUTPUT).copied().collect()
});

/// Engine option fields, snake_case.
pub const ENGINE_OPTION_FIELDS: &[&str] = &[
    "model",
    "cpu_kernels",
    "cpu_activations",
    "gguf_weights",
    "max_batch",
    "prompt_concurrency",
    "prefill_step_size",
    "kv_budget_bytes",
    "prompt_cache_bytes",
    "kv_bits",
    "kv_group_size",
    "quantized_kv_start",
    "cache_limit_bytes",
    "clear_cache_every_steps",
    "memory_limit_bytes",
    "wired_limit_bytes",
    "local_media",
    "chat_template_kwargs",
    "reasoning_budget",
    "num_draft_tokens",
    "draft_model",
];

use crate::limits::{MAX_AUDIO_CLIPS, MAX_IMAGES, MAX_TOKEN_ID, MAX_TOP_LOGPROBS};
const MAX_DRAFT_TOKENS: u64 = crate::limits::MAX_DRAFT_TOKENS as u64;

/// The logit-bias value that bans a token (JSON has no infinities).
pub const BAN: &str = "-Infinity";

fn invalid(message: impl Into<String>) -> Error {
    Error::InvalidRequest(message.into())
}

// How messages show a value: below the engine (tools' checks use it too).
pub use crate::error::show;

/// The known key closest to `key` (ignoring case, `_` and `-`), for typos like `max_tokens`
/// in a camelCase face or `temprature`.
fn suggestion<'a>(key: &str, known: &'a [String]) -> Option<&'a str> {
    let norm = |s: &str| s.to_lowercase().replace(['_', '-'], "");
    let k = norm(key);
    known
        .iter()
        .map(|a| (levenshtein(&k, &norm(a)), a.as_str()))
        .filter(|(d, a)| *d <= 2.max(a.len() / 4))
        .min_by_key(|(d, _)| *d)
        .map(|(_, a)| a)
}

fn levenshtein(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            cur.push((prev[j] + (ca != *cb) as usize).min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

/// Rejects keys not in `known` (already spelled), naming the closest one.
fn check_keys(where_: &str, map: &Map<String, Value>, known: &[String]) -> Result<()> {
    if let Some(bad) = map.keys().find(|k| !known.iter().any(|n| n == *k)) {
        let hint = suggestion(bad, known).map(|s| format!(" (did you mean {s}?)")).unwrap_or_default();
        return Err(invalid(format!(
            "{where_}unknown field {}{hint}; the fields are: {}",
            Value::String(bad.clone()),
            known.join(", ")
        )));
    }
    Ok(())
}

/// Typed access to an object's fields by snake_case name, with messages in the face's spelling
/// (or under the face's own name for a field, `aliases`: `(field, key)` pairs).
struct Fields<'a> {
    map: &'a Map<String, Value>,
    spelling: Spelling,
    aliases: &'a [(&'a str, &'a str)],
}

impl<'a> Fields<'a> {
    fn new(v: &'a Value, what: &str, known: &[&str], spelling: Spelling) -> Result<Self> {
        let Value::Object(map) = v else {
            return Err(invalid(format!("{what} must be an object, got {}", show(v))));
        };
        let known: Vec<String> = known.iter().map(|k| spelling.key(k).into_owned()).collect();
        check_keys("", map, &known)?;
        Ok(Fields { map, spelling, aliases: &[] })
    }

    /// The key the caller writes `field` as.
    fn name(&self, field: &str) -> String {
        match self.aliases.iter().find(|(f, _)| *f == field) {
            Some((_, key)) => key.to_string(),
            None => self.spelling.key(field).into_owned(),
        }
    }

    /// The field's value; `None` when absent or null.
    fn get(&self, field: &str) -> Option<&'a Value> {
        self.map.get(&self.name(field)).filter(|v| !v.is_null())
    }

    fn err(&self, field: &str, rule: &str, got: &Value) -> Error {
        invalid(format!("{} must be {rule}, got {}", self.name(field), show(got)))
    }

    fn int(&self, field: &str, min: u64, max: u64) -> Result<Option<u64>> {
        let Some(v) = self.get(field) else { return Ok(None) };
        match v.as_u64() {
            Some(n) if (min..=max).contains(&n) => Ok(Some(n)),
            _ if max == u64::MAX => Err(self.err(field, &format!("an integer >= {min}"), v)),
            _ => Err(self.err(field, &format!("an integer in [{min}, {max}]"), v)),
        }
    }

    fn usize(&self, field: &str, min: u64, max: u64) -> Result<Option<usize>> {
        Ok(self.int(field, min, max.min(usize::MAX as u64))?.map(|n| n as usize))
    }

    /// A number that is finite as an `f32` and passes `ok`; `rule` says what is expected.
    fn number(&self, field: &str, rule: &str, ok: impl Fn(f64) -> bool) -> Result<Option<f32>> {
        let Some(v) = self.get(field) else { return Ok(None) };
        match v.as_f64() {
            Some(x) if (x as f32).is_finite() && ok(x) => Ok(Some(x as f32)),
            _ => Err(self.err(field, rule, v)),
        }
    }

    fn bool(&self, field: &str) -> Result<Option<bool>> {
        let Some(v) = self.get(field) else { return Ok(None) };
        v.as_bool().map(Some).ok_or_else(|| self.err(field, "true or false", v))
    }

    fn string(&self, field: &str) -> Result<Option<&'a str>> {
        let Some(v) = self.get(field) else { return Ok(None) };
        v.as_str().map(Some).ok_or_else(|| self.err(field, "a string", v))
    }
}

/// A generation request. `spelling`: how the caller spells keys (and how messages name them).
/// Local media paths are read as [`LocalMedia::Any`] allows; [`parse_request_with`] takes the
/// engine's policy.
pub fn parse_request(v: &Value, spelling: Spelling) -> Result<Request> {
    parse_request_with(v, spelling, &LocalMedia::Any)
}

/// [`parse_request`], local media paths (`images`, `audio`) read as `local` allows (the
/// engine's [`EngineConfig::local_media`]).
pub fn parse_request_with(v: &Value, spelling: Spelling, local: &LocalMedia) -> Result<Request> {
    let f = Fields::new(v, "the request", &REQUEST_FIELDS, spelling)?;

    let given: Vec<&str> = ["prompt", "messages", "prompt_ids"].into_iter().filter(|k| f.get(k).is_some()).collect();
    if given.len() != 1 {
        return Err(invalid(format!(
            "exactly one of {}, {} or {} is required, got {}",
            f.name("prompt"),
            f.name("messages"),
            f.name("prompt_ids"),
            if given.is_empty() { "none".to_string() } else { given.iter().map(|k| f.name(k)).collect::<Vec<_>>().join(" and ") }
        )));
    }
    let input = match given[0] {
        "prompt" => {
            let p = f.string("prompt")?.unwrap_or_default();
            if p.is_empty() {
                return Err(invalid(format!("{} must not be empty", f.name("prompt"))));
            }
            Input::Prompt(p.to_string())
        }
        "messages" => Input::Messages(parse_messages(&f)?),
        _ => Input::Tokens(parse_prompt_ids(&f)?),
    };

    let mut req = Request::new(input);
    generation_fields(&f).map_err(|e| invalid(e.message))?.apply(&mut req);
    let logprobs = f.bool("logprobs")?.unwrap_or(false);
    let top = f.usize("top_logprobs", 0, MAX_TOP_LOGPROBS as u64)?;
    req.logprobs = match (logprobs, top) {
        (true, top) => Some(top.unwrap_or(0)),
        (false, None) => None,
        (false, Some(_)) => {
            return Err(invalid(format!("{} needs {}: true", f.name("top_logprobs"), f.name("logprobs"))));
        }
    };
    // Tools in OpenAI's shape (docs/tools.md), checked with the caller's field names; every
    // face delivers the parsed calls (C weft_event fields, Node chunks, Swift events).
    let parallel = f.bool("parallel_tool_calls")?;
    let tools = crate::tools::Tools::parse(f.get("tools"), f.get("tool_choice"), parallel).map_err(|e| {
        let mut message = e.message;
        for key in ["tool_choice", "tools"] {
            message = message.replace(&format!("`{key}"), &format!("`{}", f.name(key)));
        }
        invalid(message)
    })?;
    req.tools = tools;
    req.constraint = parse_constraint_fields(&f).map_err(|(_, e)| e)?;
    req.images = parse_images(&f, local)?;
    req.audio = parse_audio(&f, local)?;
    let (kwargs, budget) = reasoning_fields(&f)?;
    req.chat_template_kwargs = kwargs;
    req.reasoning_budget = budget;
    Ok(req)
}

/// `chat_template_kwargs` (an object of template variables: `enable_thinking`, ...) and
/// `reasoning_budget` (tokens), in requests and engine options alike.
fn reasoning_fields(f: &Fields) -> Result<(serde_json::Map<String, Value>, Option<usize>)> {
    let kwargs = match f.get("chat_template_kwargs") {
        None | Some(Value::Null) => serde_json::Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(v) => return Err(f.err("chat_template_kwargs", "an object of template variables", v)),
    };
    Ok((kwargs, f.usize("reasoning_budget", 0, 1 << 30)?))
}

/// `images`: encoded image files in prompt order, each a string (a `data:` URL or a local
/// file path; remote URLs are refused) or `{ "base64": "..." }`.
fn parse_images(f: &Fields, local: &LocalMedia) -> Result<Vec<Vec<u8>>> {
    use crate::vision::source::{base64_bytes, image_from_url_with};
    parse_media(f, "images", "images", MAX_IMAGES, |u| image_from_url_with(u, local), base64_bytes)
}

/// `audio`: encoded audio clips (WAV / MP3 / FLAC / Ogg) in prompt order, spelled as `images`.
fn parse_audio(f: &Fields, local: &LocalMedia) -> Result<Vec<Vec<u8>>> {
    use crate::vision::source::{audio_base64, audio_from_url_with};
    parse_media(f, "audio", "audio clips", MAX_AUDIO_CLIPS, |u| audio_from_url_with(u, local), audio_base64)
}

fn parse_media(
    f: &Fields,
    key: &str,
    what: &str,
    max: usize,
    from_url: impl Fn(&str) -> Result<Vec<u8>>,
    from_base64: fn(&str) -> Result<Vec<u8>>,
) -> Result<Vec<Vec<u8>>> {
    let Some(v) = f.get(key) else { return Ok(Vec::new()) };
    let items = v.as_array().ok_or_else(|| f.err(key, &format!("an array of {what}"), v))?;
    if items.len() > max {
        return Err(invalid(format!("{}: {} {what}, at most {max} per request", f.name(key), items.len())));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let at = format!("{}[{i}]", f.name(key));
            let bytes = match item {
                Value::String(s) => from_url(s),
                Value::Object(m) if m.len() == 1 && m.get("base64").is_some_and(Value::is_string) => {
                    from_base64(m["base64"].as_str().unwrap())
                }
                other => {
                    return Err(invalid(format!(
                        "{at} must be a data: URL or file path string, or {{ \"base64\": string }}, got {}",
                        show(other)
                    )))
                }
            };
            bytes.map_err(|e| invalid(format!("{at}: {}", e.message())))
        })
        .collect()
}

/// The sampling, stop and length fields of a request, read by the contract's rules; each is
/// `None` (`stop`: empty) when not given.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GenerationFields {
    pub max_tokens: Option<usize>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<u32>,
    pub min_p: Option<f32>,
    pub seed: Option<u64>,
    pub repetition_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub penalty_context: Option<usize>,
    pub logit_bias: Option<Vec<(u32, f32)>>,
    pub stop: Vec<String>,
    pub ignore_eos: Option<bool>,
    /// Prompt-lookup speculative decoding's draft length (0: off).
    pub num_draft_tokens: Option<usize>,
}

/// The fields [`GenerationFields`] reads, snake_case.
pub const GENERATION_FIELDS: &[&str] = &[
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
    "num_draft_tokens",
];


impl GenerationFields {
    /// Sets the given fields on `request`, leaving the others as they are (its defaults).
    pub fn apply(self, request: &mut Request) {
        if let Some(n) = self.max_tokens {
            request.max_tokens = n;
        }
        let s = &mut request.sampling;
        if let Some(x) = self.temperature {
            s.temperature = x;
        }
        if let Some(x) = self.top_p {
            s.top_p = x;
        }
        if let Some(n) = self.top_k {
            s.top_k = n;
        }
        if let Some(x) = self.min_p {
            s.min_p = x;
        }
        if self.seed.is_some() {
            s.seed = self.seed;
        }
        if self.repetition_penalty.is_some() {
            s.repetition_penalty = self.repetition_penalty;
        }
        if self.presence_penalty.is_some() {
            s.presence_penalty = self.presence_penalty;
        }
        if self.frequency_penalty.is_some() {
            s.frequency_penalty = self.frequency_penalty;
        }
        if let Some(n) = self.penalty_context {
            s.penalty_context = n;
        }
        if let Some(bias) = self.logit_bias {
            s.logit_bias = bias;
        }
        if !self.stop.is_empty() {
            request.stop = self.stop;
        }
        if let Some(b) = self.ignore_eos {
            request.ignore_eos = b;
        }
        if self.num_draft_tokens.is_some() {
            request.num_draft_tokens = self.num_draft_tokens;
        }
    }
}

/// A field the contract refused: its key as the caller wrote it (HTTP's `param`) and the
/// message, which names it the same way.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldError {
    pub key: String,
    pub message: String,
}

/// The [`GENERATION_FIELDS`] of a request object by the contract's rules, other keys ignored:
/// for a face that reads the rest of its request itself (the HTTP server). `aliases` are
/// `(field, key)` pairs for fields the face names otherwise (`("stop", "stop_sequences")`);
/// messages and [`FieldError::key`] use the face's key.
pub fn parse_generation_fields(
    v: &Value,
    spelling: Spelling,
    aliases: &[(&str, &str)],
) -> std::result::Result<GenerationFields, FieldError> {
    let Value::Object(map) = v else {
        return Err(FieldError { key: String::new(), message: format!("the request must be an object, got {}", show(v)) });
    };
    generation_fields(&Fields { map, spelling, aliases })
}

fn generation_fields(f: &Fields) -> std::result::Result<GenerationFields, FieldError> {
    let at = |field: &'static str| {
        move |e: Error| FieldError {
            key: f.name(field),
            message: e.message(),
        }
    };
    // Capped so the engine's KV projection (prompt + max_tokens) cannot overflow.
    let max_tokens = f.usize("max_tokens", 1, u32::MAX as u64).map_err(at("max_tokens"))?;
    // The rules of SamplingParams::validate, with the caller's names.
    let temperature = f.number("temperature", "a finite number >= 0", |x| x >= 0.0).map_err(at("temperature"))?;
    let top_p = f.number("top_p", "a number in (0, 1]", |x| x > 0.0 && x <= 1.0).map_err(at("top_p"))?;
    let top_k = f.int("top_k", 0, u32::MAX as u64).map_err(at("top_k"))?.map(|n| n as u32);
    let min_p = f.number("min_p", "a number in [0, 1]", |x| (0.0..=1.0).contains(&x)).map_err(at("min_p"))?;
    let seed = f.int("seed", 0, u64::MAX).map_err(at("seed"))?;
    let repetition_penalty =
        f.number("repetition_penalty", "a finite number > 0", |x| x > 0.0).map_err(at("repetition_penalty"))?;
    let presence_penalty = f.number("presence_penalty", "a finite number", |_| true).map_err(at("presence_penalty"))?;
    let frequency_penalty = f.number("frequency_penalty", "a finite number", |_| true).map_err(at("frequency_penalty"))?;
    let penalty_context = f.usize("penalty_context", 1, u32::MAX as u64).map_err(at("penalty_context"))?;
    let logit_bias = match f.get("logit_bias") {
        Some(_) => Some(parse_logit_bias(f).map_err(at("logit_bias"))?),
        None => None,
    };
    let stop = parse_stop(f).map_err(at("stop"))?;
    let ignore_eos = f.bool("ignore_eos").map_err(at("ignore_eos"))?;
    let num_draft_tokens = f.usize("num_draft_tokens", 0, MAX_DRAFT_TOKENS).map_err(at("num_draft_tokens"))?;
    Ok(GenerationFields {
        max_tokens,
        temperature,
        top_p,
        top_k,
        min_p,
        seed,
        repetition_penalty,
        presence_penalty,
        frequency_penalty,
        penalty_context,
        logit_bias,
        stop,
        ignore_eos,
        num_draft_tokens,
    })
}

/// Constraint fields of a request object by the contract's rules, other keys ignored: for
/// faces that parse the rest of the request themselves (the HTTP server).
/// Errors are [`Error::Field`]s naming the field at fault.
pub fn parse_constraint(v: &Value, spelling: Spelling) -> Result<Option<Constraint>> {
    let Value::Object(map) = v else { return Err(invalid(format!("the request must be an object, got {}", show(v)))) };
    parse_constraint_fields(&Fields { map, spelling, aliases: &[] })
        .map_err(|(key, e)| Error::Field { key, message: e.message() })
}

/// The constraint fields; at most one may be given (`response_format` of type `text` counts as
/// none). An error comes with the key of the field at fault.
fn parse_constraint_fields(f: &Fields) -> std::result::Result<Option<Constraint>, (String, Error)> {
    let fields = ["response_format", "json_schema", "regex", "grammar", "choice"];
    let mut found = Vec::new();
    for field in fields {
        if f.get(field).is_none() {
            continue;
        }
        let name = f.name(field);
        let c = parse_one_constraint(f, field, &name).map_err(|e| (name.clone(), e))?;
        if let Some(c) = c {
            found.push((name, c));
        }
    }
    if found.len() > 1 {
        let names: Vec<&str> = found.iter().map(|(n, _)| n.as_str()).collect();
        let all: Vec<String> = fields.iter().map(|k| f.name(k)).collect();
        let e = invalid(format!("at most one of {} may be given, got {}", all.join(", "), names.join(" and ")));
        return Err((found[1].0.clone(), e));
    }
    Ok(found.pop().map(|(_, c)| c))
}

fn parse_one_constraint(f: &Fields, field: &str, name: &str) -> Result<Option<Constraint>> {
    {
        let c = match field {
            "response_format" => parse_response_format(f)?,
            "json_schema" => {
                let v = f.get(field).expect("present");
                if !v.is_object() && !v.is_boolean() {
                    return Err(f.err(field, "a JSON schema (an object)", v));
                }
                Some(Constraint::JsonSchema(v.clone()))
            }
            "regex" | "grammar" => {
                let text = f.string(field)?.unwrap_or_default();
                if text.trim().is_empty() {
                    return Err(invalid(format!("{name} must not be empty")));
                }
                Some(if field == "regex" { Constraint::Regex(text.into()) } else { Constraint::Lark(text.into()) })
            }
            _ => {
                let v = f.get(field).expect("present");
                let Value::Array(items) = v else { return Err(f.err(field, "an array of strings", v)) };
                if items.is_empty() {
                    return Err(invalid(format!("{name} must not be empty")));
                }
                let choices = items
                    .iter()
                    .enumerate()
                    .map(|(i, x)| match x {
                        Value::String(s) if !s.is_empty() => Ok(s.clone()),
                        other => Err(invalid(format!("{name}[{i}] must be a non-empty string, got {}", show(other)))),
                    })
                    .collect::<Result<_>>()?;
                Some(Constraint::Choice(choices))
            }
        };
        Ok(c)
    }
}

/// OpenAI's `response_format`: `{"type": "text"}`, `{"type": "json_object"}` or
/// `{"type": "json_schema", "json_schema": {"name", "schema", "strict", "description"}}`.
fn parse_response_format(f: &Fields) -> Result<Option<Constraint>> {
    let name = f.name("response_format");
    let v = f.get("response_format").expect("present");
    let Value::Object(map) = v else {
        return Err(f.err("response_format", "an object with a type (text, json_object or json_schema)", v));
    };
    // The inner keys are OpenAI's; the camelCase faces may also write jsonSchema.
    let inner_key = if map.contains_key("jsonSchema") { "jsonSchema" } else { "json_schema" };
    let known = ["type".to_string(), inner_key.to_string()];
    check_keys(&format!("{name}: "), map, &known)?;
    match map.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(Constraint::JsonObject)),
        Some("json_schema") => {
            let at = format!("{name}.{inner_key}");
            let Some(Value::Object(js)) = map.get(inner_key) else {
                return Err(invalid(format!("{at} is required for type json_schema (an object with name and schema)")));
            };
            let known: Vec<String> = ["name", "schema", "strict", "description"].iter().map(|k| k.to_string()).collect();
            check_keys(&format!("{at}: "), js, &known)?;
            match js.get("name") {
                Some(Value::String(n)) if !n.is_empty() => {}
                Some(other) => return Err(invalid(format!("{at}.name must be a non-empty string, got {}", show(other)))),
                None => return Err(invalid(format!("{at}.name is required (a string)"))),
            }
            if let Some(strict) = js.get("strict").filter(|s| !s.is_null() && !s.is_boolean()) {
                return Err(invalid(format!("{at}.strict must be true or false, got {}", show(strict))));
            }
            match js.get("schema") {
                Some(schema) if schema.is_object() || schema.is_boolean() => Ok(Some(Constraint::JsonSchema(schema.clone()))),
                Some(other) => Err(invalid(format!("{at}.schema must be a JSON schema (an object), got {}", show(other)))),
                // OpenAI allows leaving it out: any JSON.
                None => Ok(Some(Constraint::JsonSchema(serde_json::json!({})))),
            }
        }
        Some(other) => Err(invalid(format!(
            "{name}.type must be one of text, json_object, json_schema, got {}",
            Value::String(other.to_string())
        ))),
        None => Err(invalid(format!("{name}.type is required (text, json_object or json_schema)"))),
    }
}

fn parse_messages(f: &Fields) -> Result<Vec<ChatMessage>> {
    let name = f.name("messages");
    let v = f.get("messages").expect("present");
    let Value::Array(items) = v else {
        return Err(f.err("messages", "an array of { role, content } objects", v));
    };
    if items.is_empty() {
        return Err(invalid(format!("{name} must not be empty")));
    }
    let keys = ["role", "content", "tool_calls", "tool_call_id", "name", "reasoning_content"];
    let known: Vec<String> = keys.iter().map(|k| f.spelling.key(k).into_owned()).collect();
    let mut out = Vec::with_capacity(items.len());
    for (i, m) in items.iter().enumerate() {
        let at = format!("{name}[{i}]");
        let Value::Object(map) = m else {
            return Err(invalid(format!("{at} must be an object {{ role, content }}, got {}", show(m))));
        };
        check_keys(&format!("{at}: "), map, &known)?;
        let key = |k: &str| f.spelling.key(k).into_owned();
        let field = |k: &str| match map.get(&key(k)).filter(|v| !v.is_null()) {
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(invalid(format!("{at}.{} must be a string, got {}", key(k), show(other)))),
            None => Ok(None),
        };
        let role = field("role")?.ok_or_else(|| invalid(format!("{at}.role is required (a string)")))?;
        let tool_calls = parse_tool_calls(map.get(&key("tool_calls")), &format!("{at}.{}", key("tool_calls")))?;
        // An assistant turn that only calls tools may have no content (OpenAI sends null).
        let content = match field("content")? {
            Some(c) => c,
            None if !tool_calls.is_empty() => String::new(),
            None => return Err(invalid(format!("{at}.content is required (a string)"))),
        };
        out.push(ChatMessage {
            tool_calls,
            tool_call_id: field("tool_call_id")?,
            name: field("name")?,
            // An assistant turn's reasoning, for templates that show it in history.
            reasoning_content: field("reasoning_content")?,
            ..ChatMessage::new(role, content)
        });
    }
    Ok(out)
}

/// An assistant turn's calls: `[{"id", "type": "function", "function": {"name", "arguments"}}]`
/// (arguments a JSON string or object).
fn parse_tool_calls(v: Option<&Value>, at: &str) -> Result<Vec<crate::tools::ToolCall>> {
    let Some(v) = v.filter(|v| !v.is_null()) else { return Ok(Vec::new()) };
    let Value::Array(list) = v else { return Err(invalid(format!("{at} must be an array of tool calls, got {}", show(v)))) };
    list.iter()
        .enumerate()
        .map(|(j, c)| {
            let bad = |what: &str| invalid(format!("{at}[{j}] {what}, got {}", show(c)));
            let id = c.get("id").and_then(Value::as_str).ok_or_else(|| bad("needs a string id"))?;
            let function = c.get("function").ok_or_else(|| bad("needs a function object"))?;
            let name = function.get("name").and_then(Value::as_str).ok_or_else(|| bad("needs a string function.name"))?;
            let arguments = match function.get("arguments") {
                None | Some(Value::Null) => "{}".to_string(),
                Some(Value::String(s)) => s.clone(),
                Some(o @ Value::Object(_)) => o.to_string(),
                Some(_) => return Err(bad("needs function.arguments as a JSON string")),
            };
            Ok(crate::tools::ToolCall { id: id.into(), name: name.into(), arguments })
        })
        .collect()
}

fn parse_prompt_ids(f: &Fields) -> Result<Vec<u32>> {
    let name = f.name("prompt_ids");
    let v = f.get("prompt_ids").expect("present");
    let Value::Array(items) = v else { return Err(f.err("prompt_ids", "an array of token ids", v)) };
    if items.is_empty() {
        return Err(invalid(format!("{name} must not be empty")));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, x)| match x.as_u64() {
            Some(n) if n <= MAX_TOKEN_ID => Ok(n as u32),
            _ => Err(invalid(format!(
                "{name}[{i}] must be a token id (an integer in [0, {MAX_TOKEN_ID}]), got {}",
                show(x)
            ))),
        })
        .collect()
}

/// `{"<token id>": bias, ...}` (OpenAI's shape); the bias `"-Infinity"` bans the token.
fn parse_logit_bias(f: &Fields) -> Result<Vec<(u32, f32)>> {
    let name = f.name("logit_bias");
    let v = f.get("logit_bias").expect("present");
    let Value::Object(map) = v else {
        return Err(f.err("logit_bias", "an object mapping token ids to numbers", v));
    };
    let mut out = Vec::with_capacity(map.len());
    for (k, b) in map {
        let key = Value::String(k.clone());
        let id: u32 = k
            .parse()
            .map_err(|_| invalid(format!("{name} key {key} is not a token id (a decimal integer in [0, {MAX_TOKEN_ID}])")))?;
        let bias = match b {
            Value::String(s) if s == BAN => f32::NEG_INFINITY,
            _ => b.as_f64().map(|x| x as f32).filter(|x| x.is_finite()).ok_or_else(|| {
                invalid(format!("{name}[{key}] must be a finite number or \"{BAN}\", got {}", show(b)))
            })?,
        };
        out.push((id, bias));
    }
    Ok(out)
}

fn parse_stop(f: &Fields) -> Result<Vec<String>> {
    let name = f.name("stop");
    let Some(v) = f.get("stop") else { return Ok(Vec::new()) };
    let stops = match v {
        Value::String(s) if s.is_empty() => return Err(invalid(format!("{name} must not be empty"))),
        Value::String(s) => vec![s.clone()],
        Value::Array(items) => items
            .iter()
            .enumerate()
            .map(|(i, x)| match x {
                Value::String(s) if s.is_empty() => Err(invalid(format!("{name}[{i}] must not be empty"))),
                Value::String(s) => Ok(s.clone()),
                other => Err(invalid(format!("{name}[{i}] must be a string, got {}", show(other)))),
            })
            .collect::<Result<_>>()?,
        other => return Err(f.err("stop", "a string or an array of strings", other)),
    };
    Ok(stops)
}

/// Engine options (model + [`EngineConfig`], including its memory policy). What needs the model
/// or MLX (supported KV bit widths, the group size against the head size) is
/// [`EngineConfig::validate_for`]'s.
pub fn parse_engine_options(v: &Value, spelling: Spelling) -> Result<EngineOptions> {
    let f = Fields::new(v, "the engine options", ENGINE_OPTION_FIELDS, spelling)?;
    let mut config = EngineConfig::default();
    let model = match f.string("model")? {
        Some("") => {
            return Err(invalid(format!("{} must be a non-empty path (omit it for the default model)", f.name("model"))))
        }
        other => other.map(PathBuf::from),
    };
    let choice = |field: &str, allowed: &[&str]| -> Result<Option<&str>> {
        match f.get(field) {
            None => Ok(None),
            Some(Value::String(s)) if allowed.contains(&s.as_str()) => Ok(Some(s.as_str())),
            Some(v) => Err(f.err(field, &format!("one of {}", allowed.iter().map(|a| format!("{a:?}")).collect::<Vec<_>>().join(", ")), v)),
        }
    };
    // Both parse infallibly once `choice` admitted the spelling.
    let cpu_kernels = choice("cpu_kernels", &["fast", "exact"])?.map(str::parse).transpose()?;
    let cpu_activations = choice("cpu_activations", &["float", "int8"])?.map(str::parse).transpose()?;
    let gguf_weights = choice("gguf_weights", &["native", "dequantize"])?.map(str::parse).transpose()?;
    if let Some(n) = f.usize("max_batch", 1, 4096)? {
        config.max_batch = n;
    }
    if let Some(n) = f.usize("prompt_concurrency", 1, 4096)? {
        config.prompt_concurrency = n;
    }
    if let Some(n) = f.usize("prefill_step_size", 1, 1 << 20)? {
        config.prefill_step_size = n;
    }
    config.kv_budget_bytes = f.int("kv_budget_bytes", 1, u64::MAX)?;
    if let Some(n) = f.int("prompt_cache_bytes", 0, u64::MAX)? {
        config.prompt_cache_bytes = n;
    }
    // Which bit widths MLX quantizes to is the engine's check (EngineConfig::validate).
    config.kv_bits = f.int("kv_bits", 1, 16)?.map(|b| b as i32);
    if let Some(n) = f.int("kv_group_size", 1, 4096)? {
        // MLX quantizes in groups of 32, 64 or 128 only; refused here even without kv_bits,
        // so a wrong value never waits to fail until KV quantization is turned on.
        if ![32, 64, 128].contains(&n) {
            return Err(f.err("kv_group_size", "32, 64 or 128", &Value::from(n)));
        }
        config.kv_group_size = n as i32;
    }
    if let Some(n) = f.usize("quantized_kv_start", 0, u64::MAX)? {
        config.quantized_kv_start = n;
    }
    let m = &mut config.memory;
    m.cache_limit_bytes = f.usize("cache_limit_bytes", 0, u64::MAX)?;
    if let Some(n) = f.int("clear_cache_every_steps", 0, u64::MAX)? {
        m.clear_cache_every_steps = n;
    }
    m.memory_limit_bytes = f.usize("memory_limit_bytes", 1, u64::MAX)?;
    m.wired_limit_bytes = f.usize("wired_limit_bytes", 0, u64::MAX)?;
    (config.chat_template_kwargs, config.reasoning_budget) = reasoning_fields(&f)?;
    if let Some(n) = f.usize("num_draft_tokens", 0, MAX_DRAFT_TOKENS)? {
        config.num_draft_tokens = n;
    }
    match f.string("draft_model")? {
        Some("") => return Err(invalid(format!("{} must be a non-empty path", f.name("draft_model")))),
        Some(path) => {
            config.draft_model = Some(PathBuf::from(path));
            // mlx_lm.server drafts 3 tokens a step unless told otherwise.
            if f.get("num_draft_tokens").is_none() {
                config.num_draft_tokens = 3;
            }
        }
        None => {}
    }
    if let Some(v) = f.get("local_media") {
        config.local_media = LocalMedia::from_json(v, &f.name("local_media"))?;
    }
    Ok(EngineOptions { model, cpu_kernels, cpu_activations, gguf_weights, config })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use Spelling::{Camel, Snake};

    fn req(v: Value) -> Request {
        parse_request(&v, Snake).unwrap_or_else(|e| panic!("{v}: {e}"))
    }

    fn req_err(v: Value, spelling: Spelling) -> String {
        match parse_request(&v, spelling) {
            Err(Error::InvalidRequest(m)) => m,
            Err(other) => panic!("{v}: not InvalidRequest: {other}"),
            Ok(_) => panic!("{v}: expected an error"),
        }
    }

    fn opt_err(v: Value, spelling: Spelling) -> String {
        match parse_engine_options(&v, spelling) {
            Err(Error::InvalidRequest(m)) => m,
            Err(other) => panic!("{v}: not InvalidRequest: {other}"),
            Ok(_) => panic!("{v}: expected an error"),
        }
    }

    #[track_caller]
    fn has(message: &str, needle: &str) {
        assert!(message.contains(needle), "{message:?} does not contain {needle:?}");
    }

    #[test]
    fn constraint_fields() {
        let c = |v: Value, sp: Spelling| parse_request(&v, sp).unwrap_or_else(|e| panic!("{v}: {e}")).constraint;
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let openai = json!({"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": true}});
        assert_eq!(c(json!({"prompt": "a", "response_format": openai}), Snake), Some(Constraint::JsonSchema(schema.clone())));
        assert_eq!(c(json!({"prompt": "a", "responseFormat": openai}), Camel), Some(Constraint::JsonSchema(schema.clone())));
        let camel = json!({"type": "json_schema", "jsonSchema": {"name": "x", "schema": schema}});
        assert_eq!(c(json!({"prompt": "a", "responseFormat": camel}), Camel), Some(Constraint::JsonSchema(schema.clone())));
        assert_eq!(c(json!({"prompt": "a", "response_format": {"type": "json_object"}}), Snake), Some(Constraint::JsonObject));
        assert_eq!(c(json!({"prompt": "a", "response_format": {"type": "text"}}), Snake), None);
        assert_eq!(c(json!({"prompt": "a", "jsonSchema": schema}), Camel), Some(Constraint::JsonSchema(schema.clone())));
        assert_eq!(c(json!({"prompt": "a", "regex": "[0-9]+"}), Snake), Some(Constraint::Regex("[0-9]+".into())));
        assert_eq!(c(json!({"prompt": "a", "grammar": "start: \"x\""}), Snake), Some(Constraint::Lark("start: \"x\"".into())));
        assert_eq!(c(json!({"prompt": "a", "choice": ["y", "n"]}), Snake), Some(Constraint::Choice(vec!["y".into(), "n".into()])));
        assert_eq!(c(json!({"prompt": "a", "regex": null}), Snake), None);
        // A text response_format plus a regex is one constraint.
        assert!(c(json!({"prompt": "a", "response_format": {"type": "text"}, "regex": "a"}), Snake).is_some());

        let p = |extra: Value| {
            let mut v = json!({"prompt": "a"});
            v.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            v
        };
        for (v, sp, needle) in [
            (p(json!({"regex": "a", "choice": ["b"]})), Snake, "at most one of response_format, json_schema, regex, grammar, choice may be given, got regex and choice"),
            (p(json!({"jsonSchema": {}, "grammar": "start: \"a\""})), Camel, "got jsonSchema and grammar"),
            (p(json!({"response_format": {"type": "json"}})), Snake, "response_format.type must be one of text, json_object, json_schema"),
            (p(json!({"response_format": {"type": "json_schema"}})), Snake, "response_format.json_schema is required"),
            (p(json!({"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}})), Snake, "response_format.json_schema.name is required"),
            (p(json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": 3}}})), Snake, "response_format.json_schema.schema must be a JSON schema"),
            (p(json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "strict": "yes"}}})), Snake, "strict must be true or false"),
            (p(json!({"response_format": {"type": "json_object", "schema": {}}})), Snake, "response_format: unknown field \"schema\""),
            (p(json!({"response_format": "json"})), Snake, "response_format must be an object"),
            (p(json!({"json_schema": "{}"})), Snake, "json_schema must be a JSON schema"),
            (p(json!({"regex": ""})), Snake, "regex must not be empty"),
            (p(json!({"grammar": 5})), Snake, "grammar must be a string"),
            (p(json!({"choice": []})), Snake, "choice must not be empty"),
            (p(json!({"choice": ["a", 1]})), Snake, "choice[1] must be a non-empty string"),
        ] {
            has(&req_err(v, sp), needle);
        }
    }

    #[test]
    fn camel_case_keys() {
        assert_eq!(Camel.key("max_tokens"), "maxTokens");
        assert_eq!(Camel.key("clear_cache_every_steps"), "clearCacheEverySteps");
        assert_eq!(Camel.key("prompt"), "prompt");
        assert_eq!(Snake.key("max_tokens"), "max_tokens");
    }

    #[test]
    fn every_request_field_is_read() {
        let r = req(json!({
            "prompt_ids": [1, 2, 4294967295u64], "max_tokens": 4, "temperature": 0.5, "top_p": 0.9,
            "top_k": 3, "min_p": 0.05, "seed": 18446744073709551615u64, "repetition_penalty": 1.1,
            "presence_penalty": -0.5, "frequency_penalty": 0.25, "penalty_context": 7,
            "logit_bias": {"5": -100, "6": 2.5, "7": "-Infinity"}, "stop": ["x", "yz"],
            "ignore_eos": true, "logprobs": true, "top_logprobs": 20
        }));
        assert!(matches!(r.input, Input::Tokens(ref v) if v == &[1, 2, u32::MAX]));
        assert_eq!(r.max_tokens, 4);
        let s = &r.sampling;
        assert_eq!((s.temperature, s.top_p, s.top_k, s.min_p), (0.5, 0.9, 3, 0.05));
        assert_eq!(s.seed, Some(u64::MAX));
        assert_eq!((s.repetition_penalty, s.presence_penalty, s.frequency_penalty), (Some(1.1), Some(-0.5), Some(0.25)));
        assert_eq!(s.penalty_context, 7);
        let mut bias = s.logit_bias.clone();
        bias.sort_by_key(|b| b.0);
        assert_eq!(bias, vec![(5, -100.0), (6, 2.5), (7, f32::NEG_INFINITY)]);
        assert_eq!(r.stop, vec!["x".to_string(), "yz".to_string()]);
        assert!(r.ignore_eos);
        assert_eq!(r.logprobs, Some(20));

        // Defaults, nulls = absent, and the other two inputs.
        let d = req(json!({"prompt": "hi", "top_p": null, "stop": null, "logit_bias": null, "seed": null}));
        let base = Request::new(Input::Prompt(String::new()));
        assert!(matches!(d.input, Input::Prompt(ref p) if p == "hi"));
        assert_eq!(d.max_tokens, base.max_tokens);
        assert_eq!(d.sampling.top_p, 1.0);
        assert_eq!(d.sampling.seed, None);
        assert!(d.stop.is_empty() && d.sampling.logit_bias.is_empty() && !d.ignore_eos);
        assert_eq!(d.logprobs, None);
        assert_eq!(req(json!({"prompt": "a", "stop": "\n"})).stop, vec!["\n".to_string()]);
        assert_eq!(req(json!({"prompt": "a", "logprobs": true})).logprobs, Some(0));
        assert_eq!(req(json!({"prompt": "a", "logprobs": false})).logprobs, None);
        let m = req(json!({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""}]}));
        let Input::Messages(m) = m.input else { panic!("not messages") };
        assert_eq!((m[0].role.as_str(), m[0].content.as_str(), m.len()), ("user", "hi", 2));

        // camelCase keys reach the same fields.
        let c = parse_request(
            &json!({"promptIds": [3], "maxTokens": 9, "topP": 0.5, "topK": 2, "minP": 0.1, "repetitionPenalty": 1.2,
                    "presencePenalty": 1, "frequencyPenalty": 2, "penaltyContext": 5, "logitBias": {"1": 1},
                    "ignoreEos": true, "logprobs": true, "topLogprobs": 3}),
            Camel,
        )
        .unwrap();
        assert_eq!((c.max_tokens, c.sampling.top_p, c.sampling.top_k, c.sampling.penalty_context), (9, 0.5, 2, 5));
        assert_eq!((c.sampling.presence_penalty, c.sampling.frequency_penalty), (Some(1.0), Some(2.0)));
        assert_eq!((c.ignore_eos, c.logprobs, c.sampling.logit_bias.clone()), (true, Some(3), vec![(1, 1.0)]));
    }

    #[test]
    fn requests_take_tool_history_and_check_tools() {
        let weather = json!({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}});
        let r = req(json!({
            "messages": [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "rain"}
            ],
        }));
        let Input::Messages(m) = &r.input else { panic!("not messages") };
        assert_eq!(m[1].tool_calls[0].arguments, "{\"city\": \"Oslo\"}");
        assert_eq!(m[2].tool_call_id.as_deref(), Some("c1"));
        assert!(r.tools.is_none());
        let r = req(json!({"messages": [{"role": "user", "content": "q"}], "tools": [weather.clone()], "tool_choice": "required"}));
        assert_eq!(r.tools.as_ref().map(|t| t.specs.len()), Some(1));
        // Camel spelling for Node and Swift, and messages in it.
        let v = json!({"messages": [{"role": "tool", "toolCallId": "c1", "content": "x"}], "tools": [weather], "toolChoice": "sometimes"});
        let e = parse_request(&v, Spelling::Camel).unwrap_err().to_string();
        assert!(e.contains("`toolChoice` must be"), "{e}");
    }

    #[test]
    fn request_errors_name_the_field_and_the_value() {
        let p = |extra: Value| {
            let mut o = json!({"prompt_ids": [1]});
            o.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            o
        };
        let cases: Vec<(Value, &str)> = vec![
            (json!([1]), "the request must be an object, got [1]"),
            (json!({}), "exactly one of prompt, messages or prompt_ids is required, got none"),
            (json!({"prompt": "a", "prompt_ids": [1]}), "got prompt and prompt_ids"),
            (json!({"prompt": ""}), "prompt must not be empty"),
            (json!({"prompt": 5}), "prompt must be a string, got 5"),
            (json!({"prompt_ids": []}), "prompt_ids must not be empty"),
            (json!({"prompt_ids": "1 2"}), "prompt_ids must be an array of token ids, got \"1 2\""),
            (json!({"prompt_ids": [1, -2]}), "prompt_ids[1] must be a token id (an integer in [0, 4294967295]), got -2"),
            (json!({"prompt_ids": [4294967296u64]}), "prompt_ids[0] must be a token id"),
            (json!({"prompt_ids": [1.5]}), "got 1.5"),
            (json!({"messages": []}), "messages must not be empty"),
            (json!({"messages": {"role": "user"}}), "messages must be an array of { role, content } objects"),
            (json!({"messages": [3]}), "messages[0] must be an object { role, content }, got 3"),
            (json!({"messages": [{"role": "user"}]}), "messages[0].content is required"),
            (json!({"messages": [{"role": 1, "content": "x"}]}), "messages[0].role must be a string, got 1"),
            (json!({"messages": [{"role": "u", "content": "x", "extra": "n"}]}), "messages[0]: unknown field \"extra\""),
            (p(json!({"bogus": 1})), "unknown field \"bogus\"; the fields are: prompt, messages"),
            (p(json!({"temprature": 1})), "unknown field \"temprature\" (did you mean temperature?)"),
            (p(json!({"maxTokens": 1})), "(did you mean max_tokens?)"),
            (p(json!({"max_tokens": "7"})), "max_tokens must be an integer in [1, 4294967295], got \"7\""),
            (p(json!({"max_tokens": 0})), "max_tokens must be an integer in [1, 4294967295], got 0"),
            (p(json!({"max_tokens": 2.5})), "got 2.5"),
            (p(json!({"max_tokens": 4294967296u64})), "got 4294967296"),
            (p(json!({"temperature": -1})), "temperature must be a finite number >= 0, got -1"),
            (p(json!({"temperature": "hot"})), "temperature must be a finite number >= 0, got \"hot\""),
            (p(json!({"temperature": 1e300})), "got 1e+300"),
            (p(json!({"top_p": 0})), "top_p must be a number in (0, 1], got 0"),
            (p(json!({"top_p": 1.5})), "top_p must be a number in (0, 1], got 1.5"),
            (p(json!({"top_k": -1})), "top_k must be an integer in [0, 4294967295], got -1"),
            (p(json!({"min_p": 2})), "min_p must be a number in [0, 1], got 2"),
            (p(json!({"seed": -3})), "seed must be an integer >= 0, got -3"),
            (p(json!({"repetition_penalty": 0})), "repetition_penalty must be a finite number > 0, got 0"),
            (p(json!({"presence_penalty": true})), "presence_penalty must be a finite number, got true"),
            (p(json!({"frequency_penalty": [1]})), "frequency_penalty must be a finite number, got [1]"),
            (p(json!({"penalty_context": 0})), "penalty_context must be an integer in [1, 4294967295], got 0"),
            (p(json!({"logit_bias": [1]})), "logit_bias must be an object mapping token ids to numbers, got [1]"),
            (p(json!({"logit_bias": {"x": 1}})), "logit_bias key \"x\" is not a token id"),
            (p(json!({"logit_bias": {"-1": 1}})), "logit_bias key \"-1\" is not a token id"),
            (p(json!({"logit_bias": {"5": "a"}})), "logit_bias[\"5\"] must be a finite number or \"-Infinity\", got \"a\""),
            (p(json!({"logit_bias": {"5": 1e300}})), "logit_bias[\"5\"] must be a finite number"),
            (p(json!({"stop": 5})), "stop must be a string or an array of strings, got 5"),
            (p(json!({"stop": ""})), "stop must not be empty"),
            (p(json!({"stop": ["a", ""]})), "stop[1] must not be empty"),
            (p(json!({"stop": [1]})), "stop[0] must be a string, got 1"),
            (p(json!({"ignore_eos": 1})), "ignore_eos must be true or false, got 1"),
            (p(json!({"logprobs": "yes"})), "logprobs must be true or false, got \"yes\""),
            (p(json!({"top_logprobs": 2})), "top_logprobs needs logprobs: true"),
            (p(json!({"top_logprobs": 2, "logprobs": false})), "top_logprobs needs logprobs: true"),
            (p(json!({"top_logprobs": 21, "logprobs": true})), "top_logprobs must be an integer in [0, 20], got 21"),
            (p(json!({"temperature": "a".repeat(100)})), "… (a string)"),
        ];
        for (v, needle) in cases {
            has(&req_err(v, Snake), needle);
        }
    }

    #[test]
    fn generation_fields_for_a_face_with_its_own_keys() {
        // Other keys are the face's; aliased fields are read and named under the face's key.
        let aliases = [("stop", "stop_sequences"), ("max_tokens", "max_completion_tokens")];
        let g = parse_generation_fields(
            &json!({"model": "x", "messages": [], "stop_sequences": ["\n"], "max_completion_tokens": 7, "max_tokens": 0,
                    "top_k": 4, "presence_penalty": 0.5, "logit_bias": {"3": "-Infinity"}}),
            Snake,
            &aliases,
        )
        .unwrap();
        assert_eq!((g.max_tokens, g.top_k, g.presence_penalty), (Some(7), Some(4), Some(0.5)));
        assert_eq!((g.stop.clone(), g.logit_bias.clone(), g.temperature), (vec!["\n".to_string()], Some(vec![(3, f32::NEG_INFINITY)]), None));
        // apply() sets what was given over the request's defaults, and only that.
        let mut r = Request::new(Input::Tokens(vec![1]));
        r.sampling.temperature = 0.7;
        g.apply(&mut r);
        assert_eq!((r.max_tokens, r.sampling.top_k, r.sampling.temperature), (7, 4, 0.7));
        assert_eq!(r.stop, vec!["\n".to_string()]);

        let err = |v: Value| parse_generation_fields(&v, Snake, &aliases).unwrap_err();
        let e = err(json!({"stop_sequences": [""]}));
        assert_eq!((e.key.as_str(), e.message.as_str()), ("stop_sequences", "stop_sequences[0] must not be empty"));
        let e = err(json!({"max_completion_tokens": 0}));
        assert_eq!(e.key, "max_completion_tokens");
        assert!(e.message.starts_with("max_completion_tokens must be an integer in [1, "), "{}", e.message);
        let e = err(json!({"top_p": 1.5}));
        assert_eq!((e.key.as_str(), e.message.as_str()), ("top_p", "top_p must be a number in (0, 1], got 1.5"));
        let e = err(json!({"logit_bias": {"x": 1}}));
        assert_eq!(e.key, "logit_bias");
        // The same rules as parse_request: the messages are those of every other face.
        for (v, field) in [(json!({"temperature": -1}), "temperature"), (json!({"seed": "s"}), "seed"), (json!({"ignore_eos": 1}), "ignore_eos")] {
            let mut full = v.clone();
            full.as_object_mut().unwrap().insert("prompt_ids".into(), json!([1]));
            let e = err(v);
            assert_eq!(e.key, field);
            assert_eq!(req_err(full, Snake), e.message);
        }
    }

    #[test]
    fn camel_case_messages_name_camel_case_keys() {
        let cases: Vec<(Value, &str)> = vec![
            (json!({"promptIds": [1], "max_tokens": 3}), "unknown field \"max_tokens\" (did you mean maxTokens?)"),
            (json!({"promptIds": [1], "maxToken": 3}), "(did you mean maxTokens?)"),
            (json!({"promptIds": [1], "maxTokens": 0}), "maxTokens must be an integer in [1, 4294967295], got 0"),
            (json!({"promptIds": [1], "topP": 0}), "topP must be a number in (0, 1], got 0"),
            (json!({"promptIds": [1, -2]}), "promptIds[1] must be a token id"),
            (json!({"promptIds": []}), "promptIds must not be empty"),
            (json!({"prompt": "a", "promptIds": [1]}), "exactly one of prompt, messages or promptIds is required, got prompt and promptIds"),
            (json!({"promptIds": [1], "logitBias": {"x": 1}}), "logitBias key \"x\" is not a token id"),
            (json!({"promptIds": [1], "topLogprobs": 1}), "topLogprobs needs logprobs: true"),
            (json!({"promptIds": [1], "penaltyContext": 0}), "penaltyContext must be"),
            (json!({"promptIds": [1], "ignoreEos": "no"}), "ignoreEos must be true or false, got \"no\""),
        ];
        for (v, needle) in cases {
            has(&req_err(v, Camel), needle);
        }
        // A snake_case key is unknown to a camelCase face (and vice versa).
        has(&req_err(json!({"prompt_ids": [1]}), Camel), "unknown field \"prompt_ids\" (did you mean promptIds?)");
        has(&req_err(json!({"promptIds": [1]}), Snake), "unknown field \"promptIds\" (did you mean prompt_ids?)");
    }

    #[test]
    fn every_engine_option_is_read() {
        let o = parse_engine_options(
            &json!({"model": "m", "cpu_kernels": "exact", "cpu_activations": "int8", "gguf_weights": "dequantize", "max_batch": 2, "prompt_concurrency": 3, "prefill_step_size": 64,
                    "kv_budget_bytes": 1000, "prompt_cache_bytes": 5, "kv_bits": 4, "kv_group_size": 32,
                    "quantized_kv_start": 100, "cache_limit_bytes": 0, "clear_cache_every_steps": 16,
                    "memory_limit_bytes": 1000000, "wired_limit_bytes": 7}),
            Snake,
        )
        .unwrap();
        assert_eq!(o.model, Some(PathBuf::from("m")));
        assert_eq!((o.cpu_kernels, o.gguf_weights), (Some(CpuKernels::Exact), Some(GgufWeights::Dequantize)));
        let load = o.load_options().unwrap();
        assert_eq!((load.cpu_kernels, load.gguf_weights), (CpuKernels::Exact, GgufWeights::Dequantize));
        assert_eq!((o.cpu_activations, load.cpu_activations), (Some(CpuActivations::Int8), Some(CpuActivations::Int8)));
        let c = &o.config;
        assert_eq!((c.max_batch, c.prompt_concurrency, c.prefill_step_size), (2, 3, 64));
        assert_eq!((c.kv_budget_bytes, c.prompt_cache_bytes), (Some(1000), 5));
        assert_eq!((c.kv_bits, c.kv_group_size, c.quantized_kv_start), (Some(4), 32, 100));
        let m = &c.memory;
        assert_eq!((m.cache_limit_bytes, m.clear_cache_every_steps), (Some(0), 16));
        assert_eq!((m.memory_limit_bytes, m.wired_limit_bytes), (Some(1000000), Some(7)));

        let d = parse_engine_options(&json!({"model": null, "kv_budget_bytes": null}), Snake).unwrap();
        let base = EngineConfig::default();
        assert!(d.model.is_none() && d.cpu_kernels.is_none() && d.cpu_activations.is_none() && d.gguf_weights.is_none());
        assert_eq!((d.config.max_batch, d.config.kv_budget_bytes, d.config.kv_bits), (base.max_batch, None, None));
        assert_eq!(d.config.memory, base.memory);

        let c = parse_engine_options(&json!({"maxBatch": 5, "clearCacheEverySteps": 0, "wiredLimitBytes": 9}), Camel)
            .unwrap()
            .config;
        assert_eq!((c.max_batch, c.memory.clear_cache_every_steps, c.memory.wired_limit_bytes), (5, 0, Some(9)));
        let o = parse_engine_options(&json!({"cpuKernels": "fast", "cpuActivations": "float", "ggufWeights": "native"}), Camel).unwrap();
        assert_eq!((o.cpu_kernels, o.gguf_weights), (Some(CpuKernels::Fast), Some(GgufWeights::Native)));
        assert_eq!(o.cpu_activations, Some(CpuActivations::Float));
    }

    #[test]
    fn local_media_is_an_engine_option_applied_at_parse() {
        let dir = std::env::temp_dir().join(format!("weft-contract-media-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("a.png");
        std::fs::write(&file, b"png").unwrap();
        let opts = |v: Value, sp| parse_engine_options(&v, sp).map(|o| o.config.local_media);
        assert_eq!(opts(json!({}), Snake).unwrap(), LocalMedia::Any, "the library default");
        assert_eq!(opts(json!({"local_media": "deny"}), Snake).unwrap(), LocalMedia::Deny);
        let dirs = opts(json!({"localMedia": {"dirs": [dir]}}), Camel).unwrap();
        assert_eq!(dirs, LocalMedia::dirs(&[&dir]).unwrap());
        let e = opts(json!({"localMedia": "everything"}), Camel).unwrap_err().to_string();
        assert!(e.contains("localMedia must be \"any\", \"deny\" or"), "{e}");

        let request = json!({"prompt": "x", "images": [file]});
        assert_eq!(parse_request(&request, Snake).unwrap().images, vec![b"png".to_vec()]);
        assert_eq!(parse_request_with(&request, Snake, &dirs).unwrap().images, vec![b"png".to_vec()]);
        let e = parse_request_with(&request, Snake, &LocalMedia::Deny).unwrap_err().to_string();
        assert!(e.contains("images[0]: image: local media paths are not allowed"), "{e}");
        let e = parse_request_with(&json!({"prompt": "x", "audio": ["/etc/passwd"]}), Snake, &dirs).unwrap_err().to_string();
        assert!(e.contains("audio[0]: audio: the local path is not a readable file inside an allowed media dir"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn engine_option_errors_name_the_field_and_the_value() {
        let cases: Vec<(Value, &str)> = vec![
            (json!("x"), "the engine options must be an object, got \"x\""),
            (json!({"max_btach": 2}), "unknown field \"max_btach\" (did you mean max_batch?)"),
            (json!({"model": 3}), "model must be a string, got 3"),
            (json!({"model": ""}), "model must be a non-empty path"),
            (json!({"cpu_kernels": "slow"}), "cpu_kernels must be one of \"fast\", \"exact\", got \"slow\""),
            (json!({"cpu_kernels": 1}), "cpu_kernels must be one of \"fast\", \"exact\", got 1"),
            (json!({"gguf_weights": "f32"}), "gguf_weights must be one of \"native\", \"dequantize\", got \"f32\""),
            (json!({"cpu_activations": "int4"}), "cpu_activations must be one of \"float\", \"int8\", got \"int4\""),
            (json!({"max_batch": 0}), "max_batch must be an integer in [1, 4096], got 0"),
            (json!({"max_batch": "4"}), "max_batch must be an integer in [1, 4096], got \"4\""),
            (json!({"prompt_concurrency": 4097}), "prompt_concurrency must be an integer in [1, 4096], got 4097"),
            (json!({"prefill_step_size": 0}), "prefill_step_size must be an integer in [1, 1048576], got 0"),
            (json!({"kv_budget_bytes": 0}), "kv_budget_bytes must be an integer >= 1, got 0"),
            (json!({"prompt_cache_bytes": -1}), "prompt_cache_bytes must be an integer >= 0, got -1"),
            (json!({"kv_bits": 0}), "kv_bits must be an integer in [1, 16], got 0"),
            (json!({"kv_group_size": 0}), "kv_group_size must be an integer in [1, 4096], got 0"),
            (json!({"kv_group_size": 3}), "kv_group_size must be 32, 64 or 128, got 3"),
            (json!({"quantized_kv_start": 1.5}), "quantized_kv_start must be an integer >= 0, got 1.5"),
            (json!({"cache_limit_bytes": -1}), "cache_limit_bytes must be an integer >= 0, got -1"),
            (json!({"clear_cache_every_steps": "often"}), "clear_cache_every_steps must be an integer >= 0"),
            (json!({"memory_limit_bytes": 0}), "memory_limit_bytes must be an integer >= 1, got 0"),
            (json!({"wired_limit_bytes": true}), "wired_limit_bytes must be an integer >= 0, got true"),
        ];
        for (v, needle) in cases {
            has(&opt_err(v, Snake), needle);
        }
        has(&opt_err(json!({"maxBatch": 0}), Camel), "maxBatch must be an integer in [1, 4096], got 0");
        has(&opt_err(json!({"modle": "m"}), Camel), "unknown field \"modle\" (did you mean model?)");
        has(&opt_err(json!({"cpuKernels": "EXACT"}), Camel), "cpuKernels must be one of \"fast\", \"exact\", got \"EXACT\"");
        has(&opt_err(json!({"memoryLimitBytes": 0}), Camel), "memoryLimitBytes must be an integer >= 1, got 0");
    }

    #[test]
    fn images_are_bytes_paths_or_data_urls() {
        let r = req(json!({"prompt_ids": [1], "images": [{"base64": "iVBORw=="}, "data:image/png;base64,iVBORw=="]}));
        assert_eq!(r.images, vec![vec![0x89, 0x50, 0x4e, 0x47]; 2]);
        assert!(req(json!({"prompt": "a", "images": null})).images.is_empty());
        for (v, needle) in [
            (json!({"prompt": "a", "images": "x.png"}), "images must be an array of images"),
            (json!({"prompt": "a", "images": [3]}), "images[0] must be a data: URL or file path string"),
            (json!({"prompt": "a", "images": ["https://x/y.png"]}), "images[0]: image: remote URLs are not fetched"),
            (json!({"prompt": "a", "images": [{"base64": "%%"}]}), "images[0]: image: invalid base64"),
        ] {
            has(&req_err(v, Spelling::Snake), needle);
        }
        let many: Vec<Value> = (0..17).map(|_| json!({"base64": "iVBORw=="})).collect();
        has(&req_err(json!({"prompt": "a", "images": many}), Spelling::Snake), "at most 16 per request");
    }

    #[test]
    fn audio_clips_are_bytes_paths_or_data_urls() {
        let r = req(json!({"prompt_ids": [1], "audio": [{"base64": "UklGRg=="}, "data:audio/wav;base64,UklGRg=="]}));
        assert_eq!(r.audio, vec![b"RIFF".to_vec(); 2]);
        assert!(req(json!({"prompt": "a", "audio": null})).audio.is_empty());
        for (body, needle) in [
            (json!({"prompt": "a", "audio": "x.wav"}), "audio must be an array of audio clips"),
            (json!({"prompt": "a", "audio": [3]}), "audio[0] must be a data: URL or file path string"),
            (json!({"prompt": "a", "audio": ["https://x/y.wav"]}), "audio[0]: audio: remote URLs are not fetched"),
            (json!({"prompt": "a", "audio": [{"base64": "%%"}]}), "audio[0]: audio: invalid base64"),
        ] {
            has(&req_err(body, Spelling::Snake), needle);
        }
        let many: Vec<Value> = (0..9).map(|_| json!({"base64": "UklGRg=="})).collect();
        has(&req_err(json!({"prompt": "a", "audio": many}), Spelling::Snake), "at most 8 per request");
    }

    #[test]
    fn reasoning_fields_in_requests_and_engine_options() {
        let r = parse_request(
            &json!({"messages": [{"role": "user", "content": "q"}], "chatTemplateKwargs": {"enable_thinking": false}, "reasoningBudget": 64}),
            Spelling::Camel,
        )
        .unwrap();
        assert_eq!(r.chat_template_kwargs.get("enable_thinking"), Some(&json!(false)));
        assert_eq!(r.reasoning_budget, Some(64));
        let e = parse_request(&json!({"prompt": "q", "chat_template_kwargs": [1]}), Spelling::Snake).unwrap_err().to_string();
        assert!(e.contains("chat_template_kwargs must be an object"), "{e}");
        let o = parse_engine_options(&json!({"chat_template_kwargs": {"enable_thinking": true}, "reasoning_budget": 0}), Spelling::Snake).unwrap();
        assert_eq!(o.config.chat_template_kwargs.get("enable_thinking"), Some(&json!(true)));
        assert_eq!(o.config.reasoning_budget, Some(0));
    }

    #[test]
    fn draft_token_counts_in_requests_and_engine_options() {
        let r = parse_request(&json!({"prompt": "q", "numDraftTokens": 5}), Spelling::Camel).unwrap();
        assert_eq!(r.num_draft_tokens, Some(5));
        assert_eq!(parse_request(&json!({"prompt": "q"}), Spelling::Snake).unwrap().num_draft_tokens, None);
        let e = parse_request(&json!({"prompt": "q", "num_draft_tokens": 65}), Spelling::Snake).unwrap_err().to_string();
        assert!(e.contains("num_draft_tokens must be an integer in [0, 64], got 65"), "{e}");
        let o = parse_engine_options(&json!({"num_draft_tokens": 4}), Spelling::Snake).unwrap();
        assert_eq!(o.config.num_draft_tokens, 4);
        assert_eq!(parse_engine_options(&json!({}), Spelling::Snake).unwrap().config.num_draft_tokens, 0);
        assert!(parse_engine_options(&json!({"numDraftTokens": -1}), Spelling::Camel).is_err());
    }
}
