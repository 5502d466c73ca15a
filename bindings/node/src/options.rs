//! The option objects passed to `Engine.load` and `generate` / `complete`: converted to JSON
//! values and parsed by the core's one request contract (`weft::contract`) with camelCase keys,
//! so the checks and messages are those of every other face, naming the JavaScript option
//! (`maxTokens`, not `max_tokens`).
//!
//! `undefined` and `null` mean "not given". Unknown keys are rejected with a suggestion, so a
//! typo such as `max_tokens` fails loudly instead of being ignored. Only `signal` (an
//! AbortSignal, not JSON) is Node's own. A `Uint8Array` / `Buffer` (an image or audio file's
//! bytes) becomes the contract's `{ "base64": ... }`.

use napi::{sys, ValueType};
use serde_json::{Map, Number, Value};

use weft::contract::{self, Spelling};
use weft::engine::{EngineConfig, Request};

use crate::js::{self, Fail, Res};

/// Deeper option objects are surely a mistake (or a cycle).
const MAX_DEPTH: usize = 16;

/// A JS value as JSON. Integral numbers become JSON integers (so integer fields accept them);
/// numbers JSON cannot hold (`Infinity`, `-Infinity`, `NaN`) become those words as strings,
/// which the contract rejects naming them, except `-Infinity` as a logit bias (a ban).
/// `skip` leaves out keys of the top-level object.
fn to_json(env: sys::napi_env, v: sys::napi_value, path: &str, depth: usize, skip: &[&str]) -> Res<Value> {
    if depth > MAX_DEPTH {
        return Err(Fail::arg(format!("{path} is nested too deeply")));
    }
    Ok(match js::type_of(env, v)? {
        ValueType::Undefined | ValueType::Null => Value::Null,
        ValueType::Boolean => Value::Bool(js::as_bool(env, v)?),
        ValueType::String => Value::String(js::as_string(env, v)?),
        ValueType::Number => number(js::as_f64(env, v)?),
        ValueType::Object if js::typed_bytes(env, v, path)?.is_some() => {
            use base64::Engine as _;
            let bytes = js::typed_bytes(env, v, path)?.unwrap_or_default();
            serde_json::json!({"base64": base64::engine::general_purpose::STANDARD.encode(bytes)})
        }
        ValueType::Object if js::is_array(env, v)? => {
            let n = js::array_len(env, v)?;
            let mut items = Vec::with_capacity(n as usize);
            for i in 0..n {
                items.push(to_json(env, js::element(env, v, i)?, &format!("{path}[{i}]"), depth + 1, &[])?);
            }
            Value::Array(items)
        }
        ValueType::Object => {
            let mut map = Map::new();
            for k in js::keys(env, v)? {
                if skip.contains(&k.as_str()) {
                    continue;
                }
                let at = if depth == 0 { k.clone() } else { format!("{path}.{k}") };
                let item = to_json(env, js::get(env, v, &k)?, &at, depth + 1, &[])?;
                map.insert(k, item);
            }
            Value::Object(map)
        }
        _ => {
            return Err(Fail::arg(format!(
                "{path} must be a plain value (a number, string, boolean, array or object), got {}",
                js::describe(env, v)
            )))
        }
    })
}

fn number(x: f64) -> Value {
    if x.is_nan() {
        Value::String("NaN".into())
    } else if x.is_infinite() {
        Value::String(if x > 0.0 { "Infinity" } else { contract::BAN }.into())
    } else if x.fract() == 0.0 && x >= 0.0 && x < u64::MAX as f64 {
        Value::from(x as u64)
    } else if x.fract() == 0.0 && x < 0.0 && x >= i64::MIN as f64 {
        Value::from(x as i64)
    } else {
        Number::from_f64(x).map(Value::Number).unwrap_or(Value::Null)
    }
}

pub struct LoadParams {
    /// The parsed options (their `model` is resolved on the loading thread:
    /// `EngineOptions::model_path` may download).
    pub options: contract::EngineOptions,
    pub load: weft::loading::LoadOptions,
    pub config: EngineConfig,
}

/// `Engine.load`'s JavaScript-only options: the download's `onProgress` function and `signal`.
pub struct LoadHooks {
    pub on_progress: Option<sys::napi_value>,
    pub signal: Option<sys::napi_value>,
}

pub fn load_params(env: sys::napi_env, options: Option<sys::napi_value>) -> Res<(LoadParams, LoadHooks)> {
    let options = options.filter(|&o| !matches!(js::type_of(env, o), Ok(ValueType::Undefined | ValueType::Null)));
    let value = match options {
        None => Value::Object(Map::new()),
        Some(v) => to_json(env, v, "Engine.load options", 0, &["onProgress", "signal"])?,
    };
    let o = contract::parse_engine_options(&value, Spelling::Camel)?;
    // Options left unset come from the environment (WEFT_CPU_KERNELS, ...): the one documented
    // place, EngineOptions::load_options / engine_config.
    let load = o.load_options()?;
    let config = o.engine_config()?;
    let hooks = match options.filter(|&o| is_plain_object(env, o).unwrap_or(false)) {
        None => LoadHooks { on_progress: None, signal: None },
        Some(opts) => {
            let on_progress = present(env, js::get(env, opts, "onProgress")?)?;
            if let Some(f) = on_progress {
                if js::type_of(env, f)? != ValueType::Function {
                    return Err(Fail::arg(format!("onProgress must be a function, got {}", js::describe(env, f))));
                }
            }
            LoadHooks { on_progress, signal: abort_signal(env, opts)? }
        }
    };
    Ok((LoadParams { options: o, load, config }, hooks))
}

fn is_plain_object(env: sys::napi_env, v: sys::napi_value) -> Res<bool> {
    Ok(js::type_of(env, v)? == ValueType::Object && !js::is_array(env, v)?)
}

/// `v` unless it is `undefined` or `null`.
fn present(env: sys::napi_env, v: sys::napi_value) -> Res<Option<sys::napi_value>> {
    Ok((!matches!(js::type_of(env, v)?, ValueType::Undefined | ValueType::Null)).then_some(v))
}

/// The options object's `signal`, checked to look like an AbortSignal.
fn abort_signal(env: sys::napi_env, options: sys::napi_value) -> Res<Option<sys::napi_value>> {
    let Some(sig) = present(env, js::get(env, options, "signal")?)? else { return Ok(None) };
    let looks_right = js::type_of(env, sig)? == ValueType::Object
        && js::type_of(env, js::get(env, sig, "aborted")?)? == ValueType::Boolean
        && js::type_of(env, js::get(env, sig, "addEventListener")?)? == ValueType::Function;
    if !looks_right {
        return Err(Fail::arg(format!("signal must be an AbortSignal, got {}", js::describe(env, sig))));
    }
    Ok(Some(sig))
}

/// A request plus its `signal` (validated to look like an AbortSignal).
pub struct GenerateParams {
    pub request: Request,
    pub signal: Option<sys::napi_value>,
}

pub fn generate_params(
    env: sys::napi_env,
    options: Option<sys::napi_value>,
    local: &weft::vision::source::LocalMedia,
) -> Res<GenerateParams> {
    let Some(options) = options.filter(|&o| !matches!(js::type_of(env, o), Ok(ValueType::Undefined | ValueType::Null)))
    else {
        return Err(Fail::arg("generate options are required: pass { messages }, { prompt } or { promptIds }"));
    };
    let value = to_json(env, options, "generate options", 0, &["signal"])?;
    let request = contract::parse_request_with(&value, Spelling::Camel, local)?;

    let signal = if is_plain_object(env, options)? { abort_signal(env, options)? } else { None };
    Ok(GenerateParams { request, signal })
}
