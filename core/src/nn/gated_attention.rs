//! Output-gated attention of the Qwen3-Next / Qwen3.5 full-attention layers (mlx-lm
//! `Qwen3NextAttention`): `q_proj` yields queries and a per-head gate side by side, q/k get
//! per-head RMSNorm, RoPE may cover only part of each head (`partial_rotary_factor`), and the
//! attention output is multiplied by `sigmoid(gate)` before `o_proj`.

use mlx_rs::ops::{sigmoid, split_equal};
use mlx_rs::Array;

use super::{sdpa, Linear, RmsNorm, Rope, Weights};
use crate::cache::{AttentionCache, AttentionMask};
use crate::Result;

#[derive(Debug, Clone)]
pub struct GatedAttentionOptions {
    pub hidden: i32,
    pub heads: i32,
    pub kv_heads: i32,
    pub head_dim: i32,
    pub bias: bool,
    pub rms_norm_eps: f32,
    /// `rope.dims` may be smaller than `head_dim` (the rest of each head is not rotated).
    pub rope: Rope,
}

pub struct GatedAttention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    q_norm: RmsNorm,
    k_norm: RmsNorm,
    opts: GatedAttentionOptions,
    scale: f32,
    /// Weft's attention primitive (fast mode on the CPU at load).
    fast: bool,
}

impl GatedAttention {
    pub fn load(w: &mut Weights, prefix: &str, opts: GatedAttentionOptions) -> Result<Self> {
        let (h, hd, bias) = (opts.hidden, opts.head_dim, opts.bias);
        let p = |n: &str| format!("{prefix}.{n}");
        let fast = w.options().fast_on_cpu();
        let mut opts = opts;
        opts.rope.set_fast(fast);
        Ok(GatedAttention {
            q_proj: Linear::load(w, &p("q_proj"), h, opts.heads * hd * 2, bias)?,
            k_proj: Linear::load(w, &p("k_proj"), h, opts.kv_heads * hd, bias)?,
            v_proj: Linear::load(w, &p("v_proj"), h, opts.kv_heads * hd, bias)?,
            o_proj: Linear::load(w, &p("o_proj"), opts.heads * hd, h, bias)?,
            q_norm: RmsNorm::load(w, &p("q_norm"), hd, opts.rms_norm_eps)?,
            k_norm: RmsNorm::load(w, &p("k_norm"), hd, opts.rms_norm_eps)?,
            scale: (hd as f32).powf(-0.5),
            opts,
            fast,
        })
    }

    /// `x`: `[B, L, hidden]` → `[B, L, hidden]`; appends this step's keys/values to `cache`.
    pub fn forward(&self, x: &Array, mask: &AttentionMask, cache: &mut dyn AttentionCache) -> Result<Array> {
        let (b, l) = (x.dim(0), x.dim(1));
        let o = &self.opts;
        let qg = self.q_proj.forward(x)?.reshape(&[b, l, o.heads, -1])?;
        let halves = split_equal(&qg, 2, -1)?;
        let gate = halves[1].reshape(&[b, l, -1])?;
        let q = self.q_norm.forward(&halves[0])?.transpose_axes(&[0, 2, 1, 3])?;
        let k = self.k_proj.forward(x)?.reshape(&[b, l, o.kv_heads, -1])?;
        let k = self.k_norm.forward(&k)?.transpose_axes(&[0, 2, 1, 3])?;
        let v = self.v_proj.forward(x)?.reshape(&[b, l, o.kv_heads, -1])?.transpose_axes(&[0, 2, 1, 3])?;

        let offset = cache.rope_offset();
        let q = o.rope.apply(&q, &offset)?;
        let k = o.rope.apply(&k, &offset)?;
        let (k, v) = cache.update_and_fetch(&k, &v)?;

        let out = sdpa(&q, &k, &v, self.scale, mask, self.fast)?;
        let out = out.transpose_axes(&[0, 2, 1, 3])?.reshape(&[b, l, -1])?;
        self.o_proj.forward(&out.multiply(sigmoid(&gate)?)?)
    }
}
