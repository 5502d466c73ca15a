//! Rotary position embeddings: every scaling mlx-lm 0.32.2's `rope_utils.initialize_rope`
//! builds, in one place. Frequency tables are computed with the same MLX ops in the same
//! order as mlx-lm (not in Rust floats), so `mx.fast.rope` sees bit-identical inputs.
//!
//! Kinds: `default` / `linear` / `mrope` (text-only: plain RoPE), `llama3`, `yarn` (also
//! `deepseek_yarn`, `telechat3-yarn`), `longrope` / `su` (mlx-lm's `SuScaledRoPE`, which
//! always uses `long_factor`), `dynamic` (NTK-aware base that grows past
//! `max_position_embeddings`) and `proportional`. Partial rotary is `dims < head_dim`: MLX
//! rotates the first `dims` features and passes the rest through.

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::ops::{clip, concatenate, select};
use mlx_rs::Array;
use serde_json::Value;

use crate::cache::RopeOffset;
use crate::{Error, Result};

#[derive(Debug, Clone)]
enum Kind {
    /// No rotation at all (SmolLM3's NoPE layers).
    Identity,
    /// `mx.fast.rope(base, scale)`.
    Base { base: f32, scale: f32 },
    /// Precomputed `freqs` (base and scale unused), optionally with the rotated features of
    /// the input multiplied by `input_scale` first (yarn's and longrope's mscale).
    Freqs { freqs: Array, input_scale: Option<f32> },
    /// mlx-lm `DynamicNTKScalingRoPE`: the base is recomputed from the sequence length seen
    /// so far (`offset + L`), in Python floats.
    DynamicNtk { base: f64, factor: f64, max_positions: f64 },
}

/// Rotary embedding of the first `dims` features of each head, with a scalar offset for a
/// single sequence or a per-row offset array for a batch of left-padded rows.
#[derive(Debug, Clone)]
pub struct Rope {
    dims: i32,
    traditional: bool,
    kind: Kind,
    /// Weft's one-op CPU primitive ([`crate::kernels::rope`]) instead of MLX's fallback graph;
    /// set by the attention layer that owns it, from its load options ([`Rope::set_fast`]).
    fast: bool,
}

/// Options of the model that `rope_scaling` kinds read besides the scaling object itself.
#[derive(Debug, Clone, Copy, Default)]
pub struct RopeContext {
    /// `max_position_embeddings` of the config (longrope, dynamic).
    pub max_position_embeddings: Option<i32>,
}

fn num(s: &Value, key: &str) -> Option<f64> {
    s.get(key).and_then(|v| v.as_f64())
}

fn req_num(s: &Value, kind: &str, key: &str) -> Result<f64> {
    num(s, key).ok_or_else(|| {
        Error::ModelLoad(format!("config.json: rope_scaling of type {kind:?} needs a numeric {key:?}"))
    })
}

/// The scaling kind as mlx-lm reads it: `type`, else `rope_type`, else `default`.
pub fn scaling_kind(scaling: Option<&Value>) -> String {
    let Some(s) = scaling else { return "default".into() };
    let pick = |k: &str| s.get(k).and_then(|v| v.as_str()).filter(|v| !v.is_empty());
    pick("type").or_else(|| pick("rope_type")).unwrap_or("default").to_string()
}

/// `base ** (arange(0, rotated, 2, float32) / dims)` as mlx-lm writes it.
fn base_freqs(base: f64, rotated: i32, dims: i32) -> Result<Array> {
    let exps = Array::arange::<_, f32>(0, rotated, 2)?.divide(Array::from_f32(dims as f32))?;
    Ok(Array::from_f32(base as f32).power(&exps)?)
}

fn f(v: f64) -> Array {
    Array::from_f32(v as f32)
}

impl Rope {
    /// Plain RoPE (`nn.RoPE`): `mx.fast.rope` with `base` and position `scale`.
    pub fn plain(dims: i32, base: f32, scale: f32, traditional: bool) -> Self {
        Rope { dims, traditional, kind: Kind::Base { base, scale }, fast: false }
    }

    /// No positional rotation (mlx-lm smollm3 `NoPE`).
    pub fn none(dims: i32) -> Self {
        Rope { dims, traditional: false, kind: Kind::Identity, fast: false }
    }

    /// mlx-lm `initialize_rope(dims, base, traditional, scaling, max_position_embeddings)`.
    /// A kind mlx-lm does not support, or one missing a required key, fails naming it.
    pub fn from_scaling(
        dims: i32,
        base: f64,
        traditional: bool,
        scaling: Option<&Value>,
        ctx: RopeContext,
    ) -> Result<Self> {
        let kind = scaling_kind(scaling);
        let empty = Value::Null;
        let s = scaling.unwrap_or(&empty);
        let built = match kind.as_str() {
            "default" => Kind::Base { base: base as f32, scale: 1.0 },
            "linear" => Kind::Base { base: base as f32, scale: (1.0 / req_num(s, &kind, "factor")?) as f32 },
            "mrope" => {
                let sections = s.get("mrope_section").and_then(|m| m.as_array()).map_or(0, |m| m.len());
                if sections != 3 {
                    return Err(Error::Unsupported(format!(
                        "rope_scaling mrope with {sections} mrope_section entries (mlx-lm supports 3)"
                    )));
                }
                Kind::Base { base: base as f32, scale: 1.0 }
            }
            "dynamic" => {
                let max = ctx.max_position_embeddings.ok_or_else(|| {
                    Error::ModelLoad("config.json: dynamic rope_scaling needs \"max_position_embeddings\"".into())
                })?;
                if dims <= 2 {
                    return Err(Error::ModelLoad(format!("dynamic rope_scaling with {dims} rotary dims")));
                }
                Kind::DynamicNtk { base, factor: req_num(s, &kind, "factor")?, max_positions: max as f64 }
            }
            "llama3" => Kind::Freqs { freqs: llama3_freqs(dims, base, s)?, input_scale: None },
            "yarn" | "deepseek_yarn" | "telechat3-yarn" => yarn(dims, base, s)?,
            "longrope" | "su" => {
                let orig = req_num(s, &kind, "original_max_position_embeddings")?;
                let max = ctx.max_position_embeddings.ok_or_else(|| {
                    Error::ModelLoad("config.json: longrope rope_scaling needs \"max_position_embeddings\"".into())
                })?;
                let kind = su_scaled(dims, base, max as f64, orig, s.get("long_factor"))?;
                if let Kind::Freqs { freqs, .. } = &kind {
                    freqs.eval()?;
                }
                // SuScaledRoPE is never traditional.
                return Ok(Rope { dims, traditional: false, kind, fast: false });
            }
            "proportional" => {
                let partial = num(s, "partial_rotary_factor").unwrap_or(1.0);
                let rotated = (dims as f64 * partial) as i32;
                if rotated > dims {
                    return Err(Error::ModelLoad("config.json: proportional rope rotates more than its dims".into()));
                }
                let factor = num(s, "factor").unwrap_or(1.0);
                let freqs = f(factor).multiply(base_freqs(base, rotated, dims)?)?;
                let rest = Array::full::<f32>(&[(dims - rotated) / 2], Array::from_f32(f32::INFINITY))?;
                Kind::Freqs { freqs: concatenate(&[freqs, rest], 0)?, input_scale: None }
            }
            other => {
                return Err(Error::Unsupported(format!(
                    "rope_scaling type {other:?} is not implemented (supported: default, linear, llama3, yarn, \
                     longrope, su, dynamic, mrope, proportional)"
                )))
            }
        };
        if let Kind::Freqs { freqs, .. } = &built {
            // Materialize now: the model may run on another thread's stream.
            freqs.eval()?;
        }
        Ok(Rope { dims, traditional, kind: built, fast: false })
    }

    /// mlx-lm `SuScaledRoPE` as phi3 builds it (its own `original_max_position_embeddings`
    /// and `max_position_embeddings` arguments, `traditional` ignored).
    pub fn su_scaled(dims: i32, base: f64, max_positions: f64, original_max: f64, scaling: &Value) -> Result<Self> {
        let kind = su_scaled(dims, base, max_positions, original_max, scaling.get("long_factor"))?;
        if let Kind::Freqs { freqs, .. } = &kind {
            freqs.eval()?;
        }
        Ok(Rope { dims, traditional: false, kind, fast: false })
    }

    /// Whether positions past `max_position_embeddings` are what this kind is for (dynamic
    /// NTK scaling grows its base there), so that value is no context limit.
    /// Runs Weft's CPU primitive when `fast` (the owning layer's load options say fast mode on
    /// the CPU); constructors leave it off.
    pub(crate) fn set_fast(&mut self, fast: bool) {
        self.fast = fast;
    }

    pub fn extends_context(&self) -> bool {
        matches!(self.kind, Kind::DynamicNtk { .. })
    }

    /// Whether the rotation depends on the length of the chunk being run (dynamic NTK: its
    /// base follows `offset + L`), so rows of different lengths cannot share a padded chunk.
    pub fn depends_on_chunk_length(&self) -> bool {
        matches!(self.kind, Kind::DynamicNtk { .. })
    }

    /// Rotary feature count (the rest of each head passes through).
    pub fn dims(&self) -> i32 {
        self.dims
    }

    pub fn apply(&self, x: &Array, offset: &RopeOffset) -> Result<Array> {
        let (dims, trad) = (self.dims, self.traditional);
        match &self.kind {
            Kind::Identity => Ok(x.clone()),
            Kind::Base { base, scale } => rope(x, dims, trad, Some(*base), *scale, offset, None, self.fast),
            Kind::Freqs { freqs, input_scale } => {
                let x = match input_scale {
                    Some(s) => scale_rotated(x, dims, *s)?,
                    None => x.clone(),
                };
                rope(&x, dims, trad, None, 1.0, offset, Some(freqs), self.fast)
            }
            Kind::DynamicNtk { base, factor, max_positions } => {
                let len = x.dim(-2);
                let dynamic_base = |offset: i32| {
                    let seq = ((len + offset) as f64).max(*max_positions);
                    let d = dims as f64;
                    (base * ((factor * seq / max_positions) - (factor - 1.0)).powf(d / (d - 2.0))) as f32
                };
                match offset {
                    RopeOffset::Scalar(o) => rope(x, dims, trad, Some(dynamic_base(*o)), 1.0, offset, None, self.fast),
                    RopeOffset::PerRow(offsets) => {
                        // Each row's base follows its own length, so rows are rotated one by
                        // one (mlx-lm cannot batch this kind at all).
                        offsets.eval()?;
                        let offs = offsets.as_slice::<i32>().to_vec();
                        let rows = offs
                            .iter()
                            .enumerate()
                            .map(|(b, o)| {
                                let row = x.index(b as i32..b as i32 + 1);
                                rope(&row, dims, trad, Some(dynamic_base(*o)), 1.0, &RopeOffset::Scalar(*o), None, self.fast)
                            })
                            .collect::<Result<Vec<_>>>()?;
                        Ok(concatenate(&rows, 0)?)
                    }
                }
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn rope(
    x: &Array,
    dims: i32,
    traditional: bool,
    base: Option<f32>,
    scale: f32,
    offset: &RopeOffset,
    freqs: Option<&Array>,
    fast: bool,
) -> Result<Array> {
    if fast {
        return match offset {
            RopeOffset::Scalar(o) => crate::kernels::rope(x, dims, traditional, base, scale, &Array::from_int(*o), freqs),
            RopeOffset::PerRow(offsets) => crate::kernels::rope(x, dims, traditional, base, scale, offsets, freqs),
        };
    }
    Ok(match offset {
        RopeOffset::Scalar(o) => mlx_rs::fast::rope(x, dims, traditional, base, scale, *o, freqs)?,
        RopeOffset::PerRow(offsets) => mlx_rs::fast::rope_dynamic(x, dims, traditional, base, scale, offsets, freqs)?,
    })
}

/// `x.at[..., :dims].multiply(s)`: the rotated features times `s` (in `x`'s dtype).
fn scale_rotated(x: &Array, dims: i32, s: f32) -> Result<Array> {
    let s = Array::from_f32(s).as_dtype(x.dtype())?;
    let d = x.dim(-1);
    if dims >= d {
        return Ok(x.multiply(&s)?);
    }
    let head = x.index((.., .., .., ..dims)).multiply(&s)?;
    let tail = x.index((.., .., .., dims..));
    Ok(concatenate(&[head, tail], -1)?)
}

/// mlx-lm `Llama3RoPE` frequencies.
fn llama3_freqs(dims: i32, base: f64, s: &Value) -> Result<Array> {
    let factor = req_num(s, "llama3", "factor")?;
    let low = num(s, "low_freq_factor").unwrap_or(1.0);
    let high = num(s, "high_freq_factor").unwrap_or(4.0);
    let old_context = num(s, "original_max_position_embeddings").unwrap_or(8192.0);
    let (low_wavelen, high_wavelen) = (old_context / low, old_context / high);

    let freqs = base_freqs(base, dims, dims)?;
    let wavelens = f(2.0 * std::f64::consts::PI).multiply(&freqs)?;
    let freqs = select(wavelens.gt(f(low_wavelen))?, freqs.multiply(f(factor))?, &freqs)?;
    let medium = wavelens.gt(f(high_wavelen))?.logical_and(wavelens.lt(f(low_wavelen))?)?;
    let smooth = f(old_context).divide(&wavelens)?.subtract(f(low))?.divide(f(high - low))?;
    let denom = f(1.0).subtract(&smooth)?.divide(f(factor))?.add(&smooth)?;
    let smooth_freqs = freqs.divide(&denom)?;
    Ok(select(&medium, &smooth_freqs, &freqs)?)
}

/// mlx-lm `YarnRoPE`.
fn yarn(dims: i32, base: f64, s: &Value) -> Result<Kind> {
    let factor = req_num(s, "yarn", "factor")?;
    let orig = num(s, "original_max_position_embeddings").unwrap_or(4096.0);
    let beta_fast = num(s, "beta_fast").unwrap_or(32.0);
    let beta_slow = num(s, "beta_slow").unwrap_or(1.0);
    let mscale = num(s, "mscale").unwrap_or(1.0);
    let mscale_all_dim = num(s, "mscale_all_dim").unwrap_or(0.0);
    let d = dims as f64;
    let correction_dim = |rot: f64| (d * (orig / (rot * 2.0 * std::f64::consts::PI)).ln()) / (2.0 * base.ln());
    let low = (correction_dim(beta_fast).floor() as i64).max(0);
    let high = (correction_dim(beta_slow).ceil() as i64).min(dims as i64 - 1);
    let get_mscale = |scale: f64, m: f64| if scale <= 1.0 { 1.0 } else { 0.1 * m * scale.ln() + 1.0 };
    let input_scale = get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim);

    let (min_val, max_val) = (low as f64, if low == high { high as f64 + 0.001 } else { high as f64 });
    let ramp = Array::arange::<_, f32>(0, dims / 2, 1)?.subtract(f(min_val))?.divide(f(max_val - min_val))?;
    let ramp = clip(&ramp, (&Array::from_f32(0.0), &Array::from_f32(1.0)))?;
    let mask = f(1.0).subtract(&ramp)?;
    let extra = base_freqs(base, dims, dims)?;
    let inter = f(factor).multiply(&extra)?;
    let num_ = inter.multiply(&extra)?;
    let den = inter.multiply(&mask)?.add(extra.multiply(f(1.0).subtract(&mask)?)?)?;
    let freqs = num_.divide(&den)?;
    Ok(Kind::Freqs { freqs, input_scale: (input_scale != 1.0).then_some(input_scale as f32) })
}

/// mlx-lm `SuScaledRoPE`: `long_factor * base_freqs`, inputs scaled by `long_mscale` or
/// `sqrt(1 + ln(max/orig) / ln(orig))` when the context is extended (mlx-lm's callers never
/// pass `long_mscale`, so neither does Weft).
fn su_scaled(dims: i32, base: f64, max_positions: f64, original_max: f64, long_factor: Option<&Value>) -> Result<Kind> {
    let factor_arr = match long_factor {
        None => Array::from_f32(1.0),
        Some(v) if v.is_number() => f(v.as_f64().unwrap()),
        Some(Value::Array(xs)) => {
            let vals: Option<Vec<f32>> = xs.iter().map(|x| x.as_f64().map(|x| x as f32)).collect();
            let vals = vals.ok_or_else(|| Error::ModelLoad("config.json: rope_scaling long_factor must be numbers".into()))?;
            if vals.len() as i32 != dims / 2 {
                return Err(Error::ModelLoad(format!(
                    "config.json: rope_scaling long_factor has {} entries, {} rotary dims need {}",
                    vals.len(),
                    dims,
                    dims / 2
                )));
            }
            Array::from_slice(&vals, &[dims / 2])
        }
        Some(other) => {
            return Err(Error::ModelLoad(format!("config.json: rope_scaling long_factor must be a list, got {other}")))
        }
    };
    let freqs = factor_arr.multiply(base_freqs(base, dims, dims)?)?;
    let factor = max_positions / original_max;
    let scale = if factor <= 1.0 { 1.0 } else { (1.0 + factor.ln() / original_max.ln()).sqrt() };
    // Multiplying by 1.0 changes nothing, so it is skipped.
    Ok(Kind::Freqs { freqs, input_scale: (scale != 1.0).then_some(scale as f32) })
}
