//! Parsing of the option objects passed to `Engine.load` and `generate` / `complete`, with
//! messages that name the JavaScript option (`maxTokens`, not `max_tokens`).
//!
//! `undefined` and `null` mean "not given". Unknown keys are rejected, so a typo such as
//! `max_tokens` fails loudly instead of being ignored.

use napi::{sys, ValueType};

use weft::engine::{EngineConfig, Input, Request};
use weft::tokenizer::ChatMessage;

use crate::js::{self, Fail, Res};

const LOAD_KEYS: &[&str] =
    &[
        "model",
        "maxBatch",
        "promptConcurrency",
        "prefillStepSize",
        "kvBudgetBytes",
        "promptCacheBytes",
        "kvBits",
        "kvGroupSize",
        "quantizedKvStart",
    ];

const GENERATE_KEYS: &[&str] = &[
    "messages",
    "prompt",
    "promptIds",
    "maxTokens",
    "temperature",
    "topP",
    "topK",
    "minP",
    "repetitionPenalty",
    "presencePenalty",
    "frequencyPenalty",
    "penaltyContext",
    "logitBias",
    "seed",
    "stop",
    "ignoreEos",
    "signal",
];

/// Largest integer a JS number holds exactly.
const MAX_SAFE: f64 = 9007199254740991.0;

struct Reader {
    env: sys::napi_env,
    obj: Option<sys::napi_value>,
}

impl Reader {
    /// `what`: how the object is named in messages ("load options").
    fn new(env: sys::napi_env, obj: Option<sys::napi_value>, what: &str, allowed: &[&str]) -> Res<Reader> {
        let obj = match obj {
            None => None,
            Some(v) => match js::type_of(env, v)? {
                ValueType::Undefined | ValueType::Null => None,
                ValueType::Object if !js::is_array(env, v)? => Some(v),
                _ => return Err(Fail::arg(format!("{what} must be an object, got {}", js::describe(env, v)))),
            },
        };
        if let Some(o) = obj {
            for k in js::keys(env, o)? {
                if !allowed.contains(&k.as_str()) {
                    return Err(Fail::arg(format!(
                        "unknown option '{k}' in {what}{}; the options are: {}",
                        suggestion(&k, allowed).map(|s| format!(" (did you mean '{s}'?)")).unwrap_or_default(),
                        allowed.join(", ")
                    )));
                }
            }
        }
        Ok(Reader { env, obj })
    }

    /// The raw value of `key`, or `None` when absent, `undefined` or `null`.
    fn raw(&self, key: &str) -> Res<Option<sys::napi_value>> {
        let Some(o) = self.obj else { return Ok(None) };
        let v = js::get(self.env, o, key)?;
        Ok(match js::type_of(self.env, v)? {
            ValueType::Undefined | ValueType::Null => None,
            _ => Some(v),
        })
    }

    fn number(&self, key: &str, rule: &str, ok: impl Fn(f64) -> bool) -> Res<Option<f64>> {
        let Some(v) = self.raw(key)? else { return Ok(None) };
        if js::type_of(self.env, v)? == ValueType::Number {
            let x = js::as_f64(self.env, v)?;
            if ok(x) {
                return Ok(Some(x));
            }
        }
        Err(Fail::arg(format!("{key} must be {rule}, got {}", js::describe(self.env, v))))
    }

    fn int(&self, key: &str, min: f64, max: f64) -> Res<Option<u64>> {
        let rule = if max >= u32::MAX as f64 {
            format!("an integer >= {min}")
        } else {
            format!("an integer in [{min}, {max}]")
        };
        Ok(self.number(key, &rule, |x| x.fract() == 0.0 && x >= min && x <= max)?.map(|x| x as u64))
    }

    fn string(&self, key: &str) -> Res<Option<String>> {
        let Some(v) = self.raw(key)? else { return Ok(None) };
        if js::type_of(self.env, v)? != ValueType::String {
            return Err(Fail::arg(format!("{key} must be a string, got {}", js::describe(self.env, v))));
        }
        Ok(Some(js::as_string(self.env, v)?))
    }

    fn boolean(&self, key: &str) -> Res<Option<bool>> {
        let Some(v) = self.raw(key)? else { return Ok(None) };
        if js::type_of(self.env, v)? != ValueType::Boolean {
            return Err(Fail::arg(format!("{key} must be a boolean, got {}", js::describe(self.env, v))));
        }
        Ok(Some(js::as_bool(self.env, v)?))
    }

    fn array(&self, key: &str, of: &str) -> Res<Option<Vec<sys::napi_value>>> {
        let Some(v) = self.raw(key)? else { return Ok(None) };
        if !js::is_array(self.env, v)? {
            return Err(Fail::arg(format!("{key} must be an array of {of}, got {}", js::describe(self.env, v))));
        }
        let n = js::array_len(self.env, v)?;
        Ok(Some((0..n).map(|i| js::element(self.env, v, i)).collect::<Res<_>>()?))
    }
}

/// Closest allowed key by edit distance (for typos like `maxToken` or `max_tokens`).
fn suggestion<'a>(key: &str, allowed: &[&'a str]) -> Option<&'a str> {
    let norm = |s: &str| s.to_ascii_lowercase().replace(['_', '-'], "");
    let k = norm(key);
    allowed
        .iter()
        .map(|a| (levenshtein(&k, &norm(a)), *a))
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

pub struct LoadParams {
    pub model: Option<String>,
    pub config: EngineConfig,
}

pub fn load_params(env: sys::napi_env, options: Option<sys::napi_value>) -> Res<LoadParams> {
    let r = Reader::new(env, options, "Engine.load options", LOAD_KEYS)?;
    let mut config = EngineConfig::default();
    let model = r.string("model")?;
    if model.as_deref() == Some("") {
        return Err(Fail::arg("model must be a non-empty path (omit it for the default model)"));
    }
    if let Some(n) = r.int("maxBatch", 1.0, 4096.0)? {
        config.max_batch = n as usize;
    }
    if let Some(n) = r.int("promptConcurrency", 1.0, 4096.0)? {
        config.prompt_concurrency = n as usize;
    }
    if let Some(n) = r.int("prefillStepSize", 1.0, 1048576.0)? {
        config.prefill_step_size = n as usize;
    }
    if let Some(n) = r.int("kvBudgetBytes", 1.0, MAX_SAFE)? {
        config.kv_budget_bytes = Some(n);
    }
    if let Some(n) = r.int("promptCacheBytes", 0.0, MAX_SAFE)? {
        config.prompt_cache_bytes = n;
    }
    // Which widths and group sizes MLX supports is the engine's check (EngineConfig::validate).
    config.kv_bits = r.int("kvBits", 1.0, 16.0)?.map(|b| b as i32);
    if let Some(n) = r.int("kvGroupSize", 1.0, 4096.0)? {
        config.kv_group_size = n as i32;
    }
    if let Some(n) = r.int("quantizedKvStart", 0.0, MAX_SAFE)? {
        config.quantized_kv_start = n as usize;
    }
    Ok(LoadParams { model, config })
}

/// A request plus its `signal` (validated to look like an AbortSignal).
pub struct GenerateParams {
    pub request: Request,
    pub signal: Option<sys::napi_value>,
}

pub fn generate_params(env: sys::napi_env, options: Option<sys::napi_value>) -> Res<GenerateParams> {
    if options.is_none() || matches!(js::type_of(env, options.unwrap())?, ValueType::Undefined | ValueType::Null) {
        return Err(Fail::arg("generate options are required: pass { messages }, { prompt } or { promptIds }"));
    }
    let r = Reader::new(env, options, "generate options", GENERATE_KEYS)?;

    let mut inputs = Vec::new();
    if let Some(items) = r.array("messages", "{ role, content } objects")? {
        let mut messages = Vec::with_capacity(items.len());
        for (i, m) in items.into_iter().enumerate() {
            let bad = || Fail::arg(format!("messages[{i}] must be an object {{ role: string, content: string }}"));
            if js::type_of(env, m)? != ValueType::Object {
                return Err(bad());
            }
            let field = |name: &str| -> Res<String> {
                let v = js::get(env, m, name)?;
                if js::type_of(env, v)? != ValueType::String {
                    return Err(Fail::arg(format!(
                        "messages[{i}].{name} must be a string, got {}",
                        js::describe(env, v)
                    )));
                }
                js::as_string(env, v)
            };
            messages.push(ChatMessage::new(field("role")?, field("content")?));
        }
        if messages.is_empty() {
            return Err(Fail::arg("messages must not be empty"));
        }
        inputs.push(Input::Messages(messages));
    }
    if let Some(p) = r.string("prompt")? {
        if p.is_empty() {
            return Err(Fail::arg("prompt must not be empty"));
        }
        inputs.push(Input::Prompt(p));
    }
    if let Some(items) = r.array("promptIds", "token ids")? {
        let mut ids = Vec::with_capacity(items.len());
        for (i, v) in items.into_iter().enumerate() {
            let ok = js::type_of(env, v)? == ValueType::Number && {
                let x = js::as_f64(env, v)?;
                x.fract() == 0.0 && (0.0..=u32::MAX as f64).contains(&x)
            };
            if !ok {
                return Err(Fail::arg(format!(
                    "promptIds[{i}] must be a token id (an integer >= 0), got {}",
                    js::describe(env, v)
                )));
            }
            ids.push(js::as_f64(env, v)? as u32);
        }
        if ids.is_empty() {
            return Err(Fail::arg("promptIds must not be empty"));
        }
        inputs.push(Input::Tokens(ids));
    }
    if inputs.len() != 1 {
        return Err(Fail::arg(format!(
            "pass exactly one of messages, prompt or promptIds (got {})",
            if inputs.is_empty() { "none".to_string() } else { inputs.len().to_string() }
        )));
    }
    let mut req = Request::new(inputs.pop().unwrap());

    if let Some(n) = r.int("maxTokens", 1.0, u32::MAX as f64)? {
        req.max_tokens = n as usize;
    }
    let s = &mut req.sampling;
    if let Some(t) = r.number("temperature", "a finite number >= 0", |x| x.is_finite() && x >= 0.0)? {
        s.temperature = t as f32;
    }
    if let Some(p) = r.number("topP", "a number in (0, 1]", |x| x > 0.0 && x <= 1.0)? {
        s.top_p = p as f32;
    }
    if let Some(k) = r.int("topK", 0.0, u32::MAX as f64)? {
        s.top_k = k as u32;
    }
    if let Some(p) = r.number("minP", "a number in [0, 1]", |x| (0.0..=1.0).contains(&x))? {
        s.min_p = p as f32;
    }
    if let Some(p) = r.number("repetitionPenalty", "a finite number > 0", |x| x.is_finite() && x > 0.0)? {
        s.repetition_penalty = Some(p as f32);
    }
    if let Some(p) = r.number("presencePenalty", "a finite number", f64::is_finite)? {
        s.presence_penalty = Some(p as f32);
    }
    if let Some(p) = r.number("frequencyPenalty", "a finite number", f64::is_finite)? {
        s.frequency_penalty = Some(p as f32);
    }
    if let Some(n) = r.int("penaltyContext", 1.0, u32::MAX as f64)? {
        s.penalty_context = n as usize;
    }
    if let Some(seed) = r.int("seed", 0.0, MAX_SAFE)? {
        s.seed = Some(seed);
    }
    if let Some(bias) = r.raw("logitBias")? {
        if js::type_of(env, bias)? != ValueType::Object || js::is_array(env, bias)? {
            return Err(Fail::arg(format!(
                "logitBias must be an object mapping token ids to numbers, got {}",
                js::describe(env, bias)
            )));
        }
        for k in js::keys(env, bias)? {
            let id: u32 = k.parse().map_err(|_| Fail::arg(format!("logitBias key '{k}' is not a token id")))?;
            let v = js::get(env, bias, &k)?;
            let b = if js::type_of(env, v)? == ValueType::Number { Some(js::as_f64(env, v)?) } else { None };
            match b {
                Some(b) if b.is_finite() || b == f64::NEG_INFINITY => s.logit_bias.push((id, b as f32)),
                _ => {
                    return Err(Fail::arg(format!(
                        "logitBias[{k}] must be a finite number or -Infinity, got {}",
                        js::describe(env, v)
                    )))
                }
            }
        }
    }

    if let Some(stop) = r.raw("stop")? {
        let items = if js::type_of(env, stop)? == ValueType::String {
            vec![stop]
        } else {
            r.array("stop", "strings")?.unwrap_or_default()
        };
        for (i, v) in items.into_iter().enumerate() {
            if js::type_of(env, v)? != ValueType::String {
                return Err(Fail::arg(format!("stop[{i}] must be a string, got {}", js::describe(env, v))));
            }
            let s = js::as_string(env, v)?;
            if s.is_empty() {
                return Err(Fail::arg("stop strings must not be empty"));
            }
            req.stop.push(s);
        }
    }
    if let Some(b) = r.boolean("ignoreEos")? {
        req.ignore_eos = b;
    }

    let signal = r.raw("signal")?;
    if let Some(sig) = signal {
        let looks_right = js::type_of(env, sig)? == ValueType::Object
            && js::type_of(env, js::get(env, sig, "aborted")?)? == ValueType::Boolean
            && js::type_of(env, js::get(env, sig, "addEventListener")?)? == ValueType::Function;
        if !looks_right {
            return Err(Fail::arg(format!("signal must be an AbortSignal, got {}", js::describe(env, sig))));
        }
    }
    Ok(GenerateParams { request: req, signal })
}
