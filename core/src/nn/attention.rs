//! Multi-head attention with grouped KV heads, optional q/k RMS norms (Qwen3) and projection
//! biases (Qwen2), separate or fused (Phi-3's `qkv_proj`) projections, RoPE at the cache's
//! offset, and the cache's mask; with `logit_softcap` (Gemma 2) the scores are soft-capped,
//! which the fused kernel cannot do, so that path attends op by op as mlx-lm does.

use mlx_rs::ops::{split_at_indices, tanh};
use mlx_rs::{Array, Dtype};

use super::{Linear, Rope, RmsNorm, Weights};
use crate::cache::{causal_mask, AttentionCache, AttentionMask};
use crate::{Error, Result};

#[derive(Debug, Clone)]
pub struct AttentionOptions {
    pub hidden: i32,
    pub heads: i32,
    pub kv_heads: i32,
    pub head_dim: i32,
    pub qkv_bias: bool,
    pub o_bias: bool,
    /// Per-head RMSNorm on queries and keys before RoPE (Qwen3), with this epsilon.
    pub qk_norm_eps: Option<f32>,
    pub rope: Rope,
}

enum Projections {
    Separate { q_proj: Linear, k_proj: Linear, v_proj: Linear },
    /// One `qkv_proj` whose output splits at `[q, q + kv]` (mlx `mx.split`): Phi-3's layout, or
    /// separate projections stacked at load ([`super::LayerOptions::fuse_projections`]).
    Fused { qkv_proj: Linear, q: i32, kv: i32 },
}

pub struct Attention {
    proj: Projections,
    o_proj: Linear,
    logit_softcap: Option<f32>,
    /// Llama 4-style query scaling by position: `(beta, original_max_position_embeddings)`.
    query_scaling: Option<(f32, i32)>,
    q_norm: Option<RmsNorm>,
    k_norm: Option<RmsNorm>,
    opts: AttentionOptions,
    scale: f32,
    /// Weft's attention primitive instead of MLX's op (fast mode on the CPU at load).
    fast: bool,
}

impl Attention {
    pub fn rope(&self) -> &Rope {
        &self.opts.rope
    }

    /// The output projection, for tensor parallel's sharding pass.
    pub(crate) fn o_proj_mut(&mut self) -> &mut Linear {
        &mut self.o_proj
    }

    pub fn load(w: &mut Weights, prefix: &str, opts: AttentionOptions) -> Result<Self> {
        let (h, hd) = (opts.hidden, opts.head_dim);
        let q_proj = Linear::load(w, &format!("{prefix}.q_proj"), h, opts.heads * hd, opts.qkv_bias)?;
        let k_proj = Linear::load(w, &format!("{prefix}.k_proj"), h, opts.kv_heads * hd, opts.qkv_bias)?;
        let v_proj = Linear::load(w, &format!("{prefix}.v_proj"), h, opts.kv_heads * hd, opts.qkv_bias)?;
        let proj = if w.options().fuse_projections() {
            match Linear::concat_outputs(vec![q_proj, k_proj, v_proj])? {
                Ok(qkv_proj) => Projections::Fused { qkv_proj, q: opts.heads * hd, kv: opts.kv_heads * hd },
                Err(parts) => {
                    let mut parts = parts.into_iter();
                    let (q_proj, k_proj, v_proj) = (parts.next().expect("q"), parts.next().expect("k"), parts.next().expect("v"));
                    Projections::Separate { q_proj, k_proj, v_proj }
                }
            }
        } else {
            Projections::Separate { q_proj, k_proj, v_proj }
        };
        Self::with_projections(w, prefix, opts, proj)
    }

    /// Phi-3's layout: one fused `qkv_proj` (no biases).
    pub fn load_fused(w: &mut Weights, prefix: &str, opts: AttentionOptions) -> Result<Self> {
        let (q, kv) = (opts.heads * opts.head_dim, opts.kv_heads * opts.head_dim);
        let qkv_proj = Linear::load(w, &format!("{prefix}.qkv_proj"), opts.hidden, q + 2 * kv, opts.qkv_bias)?;
        Self::with_projections(w, prefix, opts, Projections::Fused { qkv_proj, q, kv })
    }

    fn with_projections(w: &mut Weights, prefix: &str, opts: AttentionOptions, proj: Projections) -> Result<Self> {
        let (h, hd) = (opts.hidden, opts.head_dim);
        let o_proj = Linear::load(w, &format!("{prefix}.o_proj"), opts.heads * hd, h, opts.o_bias)?;
        let (q_norm, k_norm) = match opts.qk_norm_eps {
            Some(eps) => (
                Some(RmsNorm::load(w, &format!("{prefix}.q_norm"), hd, eps)?),
                Some(RmsNorm::load(w, &format!("{prefix}.k_norm"), hd, eps)?),
            ),
            None => (None, None),
        };
        let scale = (hd as f32).powf(-0.5);
        let fast = w.options().fast_on_cpu();
        let mut opts = opts;
        opts.rope.set_fast(fast);
        Ok(Attention { proj, o_proj, logit_softcap: None, query_scaling: None, q_norm, k_norm, opts, scale, fast })
    }

    /// Scales queries (after RoPE) by `1 + beta * ln(1 + floor(pos / original_max))`
    /// (mlx-lm ministral3 `_get_llama_4_attn_scale`).
    pub fn with_query_scaling(mut self, beta: f32, original_max: i32) -> Self {
        self.query_scaling = Some((beta, original_max));
        self
    }

    /// Soft-caps the attention scores: `tanh(s / cap) * cap` before the mask (Gemma 2).
    pub fn with_logit_softcap(mut self, cap: f32) -> Self {
        self.logit_softcap = Some(cap);
        self
    }

    /// Overrides the softmax scale (default `head_dim^-0.5`; Gemma uses
    /// `query_pre_attn_scalar^-0.5`).
    pub fn with_scale(mut self, scale: f32) -> Self {
        self.scale = scale;
        self
    }

    /// Sets per-head query/key norms built by the caller (e.g. Gemma's `1 + w` RMSNorm).
    pub fn with_qk_norms(mut self, q_norm: RmsNorm, k_norm: RmsNorm) -> Self {
        self.q_norm = Some(q_norm);
        self.k_norm = Some(k_norm);
        self
    }

    /// `x`: `[B, L, hidden]` → `[B, L, hidden]`; appends this step's keys/values to `cache`.
    pub fn forward(&self, x: &Array, mask: &AttentionMask, cache: &mut dyn AttentionCache) -> Result<Array> {
        let (b, l) = (x.dim(0), x.dim(1));
        // `[B, L, n*D]` → `[B, n, L, D]`; one position (a decode step) needs no transpose.
        let heads = |t: Array, n: i32, norm: &Option<RmsNorm>| -> Result<Array> {
            let t = if l == 1 { t.reshape(&[b, n, 1, -1])? } else { t.reshape(&[b, l, n, -1])? };
            let t = match norm {
                Some(norm) => norm.forward(&t)?,
                None => t,
            };
            Ok(if l == 1 { t } else { t.transpose_axes(&[0, 2, 1, 3])? })
        };
        let (q, k, v) = match &self.proj {
            // Fast mode on the CPU, one position: the fused output viewed as heads `[B, q + 2kv
            // heads, 1, D]` and split by head: two view ops instead of a split and three
            // reshapes, and no copy of a batch's strided rows (Weft's primitives take any
            // strides). The same values; the GPU keeps the graph below.
            Projections::Fused { qkv_proj, q, kv } if self.fast && l == 1 => {
                let hd = self.opts.head_dim;
                let t = qkv_proj.forward(x)?.reshape(&[b, -1, 1, hd])?;
                let mut parts = split_at_indices(&t, &[q / hd, (q + kv) / hd], 1)?.into_iter();
                let (q, k, v) = (parts.next().unwrap(), parts.next().unwrap(), parts.next().unwrap());
                let norm = |t: Array, norm: &Option<RmsNorm>| match norm {
                    Some(norm) => norm.forward(&t),
                    None => Ok(t),
                };
                (norm(q, &self.q_norm)?, norm(k, &self.k_norm)?, v)
            }
            Projections::Separate { q_proj, k_proj, v_proj } => {
                let (q, k, v) = (q_proj.forward(x)?, k_proj.forward(x)?, v_proj.forward(x)?);
                (heads(q, self.opts.heads, &self.q_norm)?, heads(k, self.opts.kv_heads, &self.k_norm)?, heads(v, self.opts.kv_heads, &None)?)
            }
            Projections::Fused { qkv_proj, q, kv } => {
                let mut parts = split_at_indices(&qkv_proj.forward(x)?, &[*q, q + kv], -1)?.into_iter();
                let (q, k, v) = (parts.next().unwrap(), parts.next().unwrap(), parts.next().unwrap());
                (heads(q, self.opts.heads, &self.q_norm)?, heads(k, self.opts.kv_heads, &self.k_norm)?, heads(v, self.opts.kv_heads, &None)?)
            }
        };

        let offset = cache.rope_offset();
        let q = self.opts.rope.apply(&q, &offset)?;
        let k = self.opts.rope.apply(&k, &offset)?;
        let q = match self.query_scaling {
            Some((beta, original_max)) => q.multiply(&llama4_query_scale(l, &offset, beta, original_max, q.dtype())?)?,
            None => q,
        };
        let out = match self.logit_softcap {
            Some(cap) => {
                let (keys, values) = cache.update_and_fetch(&k, &v)?;
                softcapped_attention(&q, &keys, &values, self.scale, cap, mask)?
            }
            // The cache attends: full-precision caches use the fused kernel, quantized ones
            // their packed keys/values.
            None => cache.update_and_attend(&q, &k, &v, self.scale, mask, self.fast)?,
        };
        let out = if l == 1 { out.reshape(&[b, 1, -1])? } else { out.transpose_axes(&[0, 2, 1, 3])?.reshape(&[b, l, -1])? };
        self.o_proj.forward(&out)
    }
}

/// `1 + beta * log(1 + floor((arange(L) + offset) / original_max))` in float32 then cast, as
/// `[L, 1]` (one sequence) or `[B, 1, L, 1]` (per-row offsets).
fn llama4_query_scale(l: i32, offset: &crate::cache::RopeOffset, beta: f32, original_max: i32, dt: Dtype) -> Result<Array> {
    use crate::cache::RopeOffset;
    let positions = Array::arange::<_, i32>(0, l, 1)?;
    let positions = match offset {
        RopeOffset::Scalar(o) => positions.add(Array::from_int(*o))?,
        RopeOffset::PerRow(offsets) => positions.add(offsets.reshape(&[-1, 1])?)?,
    };
    let one = Array::from_f32(1.0);
    let steps = mlx_rs::ops::floor(&positions.divide(Array::from_int(original_max))?)?;
    let scale = one.add(Array::from_f32(beta).multiply(mlx_rs::ops::log(&one.add(&steps)?)?)?)?;
    let scale = match offset {
        RopeOffset::Scalar(_) => scale.reshape(&[l, 1])?,
        RopeOffset::PerRow(_) => scale.reshape(&[-1, 1, l, 1])?,
    };
    Ok(scale.as_dtype(dt)?)
}

/// mlx-lm gemma2 `Attention.__call__` after the cache update: `q * scale`, grouped heads as
/// `[B, kv, repeats, L, D]`, `tanh(q k^T / cap) * cap`, boolean mask as `where(mask, s,
/// finfo.min)`, precise softmax, `scores @ v`. The mask is broadcast over the head groups
/// (mlx-lm lines a batch mask up with the kv-head axis instead, which only works for B=1).
fn softcapped_attention(q: &Array, k: &Array, v: &Array, scale: f32, cap: f32, mask: &AttentionMask) -> Result<Array> {
    let (b, heads, l, d) = (q.dim(0), q.dim(1), q.dim(2), q.dim(3));
    let kv_heads = k.dim(1);
    let repeats = heads / kv_heads;
    let dt = q.dtype();
    let scalar = |x: f32| Array::from_f32(x).as_dtype(dt);
    let mut q = q.multiply(scalar(scale)?)?;
    let (mut k, mut v) = (k.clone(), v.clone());
    if repeats > 1 {
        q = q.reshape(&[b, kv_heads, repeats, l, d])?;
        k = mlx_rs::ops::expand_dims(&k, 2)?;
        v = mlx_rs::ops::expand_dims(&v, 2)?;
    }
    let kt = k.swap_axes(-1, -2)?;
    let scores = q.matmul(&kt)?;
    let cap_a = scalar(cap)?;
    let scores = tanh(scores.divide(&cap_a)?)?.multiply(&cap_a)?;
    let s = k.dim(-2);
    let mask = match mask {
        AttentionMask::None => None,
        AttentionMask::Causal => Some(causal_mask(l, s - l, None)?),
        AttentionMask::Array(m) => Some(if repeats > 1 && m.ndim() == 4 { mlx_rs::ops::expand_dims(m, 2)? } else { m.clone() }),
    };
    let scores = match mask {
        None => scores,
        Some(m) if m.dtype() == Dtype::Bool => {
            let min = Array::from_f32(finfo_min(dt)?).as_dtype(dt)?;
            mlx_rs::ops::select(&m, &scores, &min)?
        }
        Some(m) => scores.add(&m)?,
    };
    let scores = mlx_rs::ops::softmax_axis(&scores, -1, true)?;
    let out = scores.matmul(&v)?;
    Ok(if repeats > 1 { out.reshape(&[b, heads, l, d])? } else { out })
}

/// `mx.finfo(dtype).min`.
fn finfo_min(dt: Dtype) -> Result<f32> {
    Ok(match dt {
        Dtype::Float32 => f32::MIN,
        Dtype::Float16 => -65504.0,
        Dtype::Bfloat16 => -3.389_531_4e38,
        other => return Err(Error::Mlx(format!("soft-capped attention in {other:?}"))),
    })
}
