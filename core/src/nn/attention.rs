//! Multi-head attention with grouped KV heads, optional q/k RMS norms (Qwen3) and projection
//! biases (Qwen2), RoPE at the cache's offset, and the cache's mask.

use mlx_rs::Array;

use super::{Linear, Rope, RmsNorm, Weights};
use crate::cache::{AttentionMask, KvCache};
use crate::Result;

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

pub struct Attention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    q_norm: Option<RmsNorm>,
    k_norm: Option<RmsNorm>,
    opts: AttentionOptions,
    scale: f32,
}

impl Attention {
    pub fn load(w: &mut Weights, prefix: &str, opts: AttentionOptions) -> Result<Self> {
        let (h, hd) = (opts.hidden, opts.head_dim);
        let q_proj = Linear::load(w, &format!("{prefix}.q_proj"), h, opts.heads * hd, opts.qkv_bias)?;
        let k_proj = Linear::load(w, &format!("{prefix}.k_proj"), h, opts.kv_heads * hd, opts.qkv_bias)?;
        let v_proj = Linear::load(w, &format!("{prefix}.v_proj"), h, opts.kv_heads * hd, opts.qkv_bias)?;
        let o_proj = Linear::load(w, &format!("{prefix}.o_proj"), opts.heads * hd, h, opts.o_bias)?;
        let (q_norm, k_norm) = match opts.qk_norm_eps {
            Some(eps) => (
                Some(RmsNorm::load(w, &format!("{prefix}.q_norm"), hd, eps)?),
                Some(RmsNorm::load(w, &format!("{prefix}.k_norm"), hd, eps)?),
            ),
            None => (None, None),
        };
        let scale = (hd as f32).powf(-0.5);
        Ok(Attention { q_proj, k_proj, v_proj, o_proj, q_norm, k_norm, opts, scale })
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
    pub fn forward(&self, x: &Array, mask: &AttentionMask, cache: &mut dyn KvCache) -> Result<Array> {
        let (b, l) = (x.dim(0), x.dim(1));
        let heads = |t: Array, n: i32, norm: &Option<RmsNorm>| -> Result<Array> {
            let t = t.reshape(&[b, l, n, -1])?;
            let t = match norm {
                Some(norm) => norm.forward(&t)?,
                None => t,
            };
            Ok(t.transpose_axes(&[0, 2, 1, 3])?)
        };
        let q = heads(self.q_proj.forward(x)?, self.opts.heads, &self.q_norm)?;
        let k = heads(self.k_proj.forward(x)?, self.opts.kv_heads, &self.k_norm)?;
        let v = heads(self.v_proj.forward(x)?, self.opts.kv_heads, &None)?;

        let offset = cache.rope_offset();
        let q = self.opts.rope.apply(&q, &offset)?;
        let k = self.opts.rope.apply(&k, &offset)?;
        // The cache attends: full-precision caches use the fused kernel, quantized ones their
        // packed keys/values.
        let out = cache.update_and_attend(&q, &k, &v, self.scale, mask)?;
        let out = out.transpose_axes(&[0, 2, 1, 3])?.reshape(&[b, l, -1])?;
        self.o_proj.forward(&out)
    }
}
