//! Gated DeltaNet linear attention (Qwen3-Next / Qwen3.5), op-for-op as mlx-lm's
//! `Qwen3NextGatedDeltaNet` / `qwen3_5.GatedDeltaNet` and `gated_delta.py`'s ops path (the
//! path mlx-lm takes on CPU): projections → causal depthwise conv1d over a `K-1` window kept
//! in the cache → SiLU → L2-normalized q/k → gated delta recurrence → gated RMSNorm → out_proj.
//! The recurrence runs as [`GatedDeltaKernel`] says (chosen per device when the model loads).

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::ops::{concatenate, conv1d, exp, logaddexp, select, sigmoid, split_at_indices, stack, zeros_dtype};
use mlx_rs::{Array, Dtype};

use super::{Linear, Weights};
use crate::cache::RecurrentState;
use crate::{Error, Result};

/// Which implementation runs the gated delta recurrence ([`super::LayerOptions::gated_delta`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GatedDeltaKernel {
    /// mlx-lm's ops path: ~10 MLX ops per token (the CPU default in the exact mode: bit-exact
    /// with mlx-lm there).
    Ops,
    /// MLX's `fast::gated_delta_update`: its Metal kernel (the Metal default); elsewhere MLX's
    /// fallback graph, which rounds the decay to q's dtype (equal to the ops path for float32).
    Fused,
    /// Weft's CUDA kernel: the whole recurrence in one launch (MLX's CUDA backend only; its
    /// default).
    Cuda,
    /// Weft's CPU primitive: the whole recurrence in one op, float32 sums in another order
    /// than MLX's (the CPU default in the fast kernel mode).
    Cpu,
}

impl GatedDeltaKernel {
    pub fn as_str(self) -> &'static str {
        match self {
            GatedDeltaKernel::Ops => "ops",
            GatedDeltaKernel::Fused => "fused",
            GatedDeltaKernel::Cuda => "cuda",
            GatedDeltaKernel::Cpu => "cpu",
        }
    }
}

impl std::str::FromStr for GatedDeltaKernel {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "ops" => Ok(GatedDeltaKernel::Ops),
            "fused" => Ok(GatedDeltaKernel::Fused),
            "cuda" => Ok(GatedDeltaKernel::Cuda),
            "cpu" => Ok(GatedDeltaKernel::Cpu),
            other => Err(Error::Unsupported(format!(
                "gated delta kernel {other:?}: expected \"ops\", \"fused\", \"cuda\" or \"cpu\""
            ))),
        }
    }
}

/// Shapes of a gated DeltaNet layer (config keys `linear_*`).
#[derive(Debug, Clone)]
pub struct GatedDeltaOptions {
    pub hidden: i32,
    pub num_k_heads: i32,
    pub num_v_heads: i32,
    pub head_k_dim: i32,
    pub head_v_dim: i32,
    pub conv_kernel: i32,
    pub rms_norm_eps: f32,
    /// How the input projections are laid out in the checkpoint.
    pub layout: ProjectionLayout,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProjectionLayout {
    /// Qwen3-Next: `in_proj_qkvz` and `in_proj_ba`, interleaved per key head.
    Interleaved,
    /// Qwen3.5: separate `in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`.
    Separate,
}

enum Projections {
    Interleaved { qkvz: Linear, ba: Linear },
    Separate { qkv: Linear, z: Linear, b: Linear, a: Linear },
}

/// `RMSNorm(x) * silu(gate)` computed in float32 (mlx-lm `Qwen3NextRMSNormGated` with
/// `precise_swiglu`), cast back to `x`'s dtype.
pub struct RmsNormGated {
    weight: Array,
    eps: f32,
}

impl RmsNormGated {
    pub fn load(w: &mut Weights, prefix: &str, dim: i32, eps: f32) -> Result<Self> {
        Ok(RmsNormGated { weight: w.take(&format!("{prefix}.weight"), &[dim])?, eps })
    }

    pub fn forward(&self, x: &Array, gate: &Array) -> Result<Array> {
        let normed = mlx_rs::fast::rms_norm(x, Some(&self.weight), self.eps)?;
        let gate = gate.as_dtype(Dtype::Float32)?;
        let silu = gate.multiply(sigmoid(&gate)?)?;
        Ok(silu.multiply(normed.as_dtype(Dtype::Float32)?)?.as_dtype(x.dtype())?)
    }
}

pub struct GatedDeltaNet {
    proj: Projections,
    /// Depthwise conv kernel `[C, K, 1]` (MLX layout).
    conv_weight: Array,
    a_log: Array,
    dt_bias: Array,
    norm: RmsNormGated,
    out_proj: Linear,
    opts: GatedDeltaOptions,
    kernel: GatedDeltaKernel,
    key_dim: i32,
    value_dim: i32,
    conv_dim: i32,
}

impl GatedDeltaNet {
    pub fn load(w: &mut Weights, prefix: &str, opts: GatedDeltaOptions) -> Result<Self> {
        let (nk, nv, dk, dv) = (opts.num_k_heads, opts.num_v_heads, opts.head_k_dim, opts.head_v_dim);
        if nv % nk != 0 {
            return Err(Error::ModelLoad(format!(
                "linear_num_value_heads ({nv}) must be a multiple of linear_num_key_heads ({nk})"
            )));
        }
        let (key_dim, value_dim) = (nk * dk, nv * dv);
        let conv_dim = 2 * key_dim + value_dim;
        let h = opts.hidden;
        let p = |n: &str| format!("{prefix}.{n}");
        let proj = match opts.layout {
            ProjectionLayout::Interleaved => Projections::Interleaved {
                qkvz: Linear::load(w, &p("in_proj_qkvz"), h, 2 * key_dim + 2 * value_dim, false)?,
                ba: Linear::load(w, &p("in_proj_ba"), h, 2 * nv, false)?,
            },
            ProjectionLayout::Separate => Projections::Separate {
                qkv: Linear::load(w, &p("in_proj_qkv"), h, conv_dim, false)?,
                z: Linear::load(w, &p("in_proj_z"), h, value_dim, false)?,
                b: Linear::load(w, &p("in_proj_b"), h, nv, false)?,
                a: Linear::load(w, &p("in_proj_a"), h, nv, false)?,
            },
        };
        // MLX layout `[C, K, 1]`, as mlx-lm saves it. Hugging Face checkpoints (`[C, 1, K]`,
        // norms stored minus one) need `mlx_lm.convert` first, as mlx-lm's loader would.
        let conv_weight = w.take(&p("conv1d.weight"), &[conv_dim, opts.conv_kernel, 1]).map_err(|e| {
            Error::ModelLoad(format!("{e} (Hugging Face checkpoints must be converted with mlx_lm.convert first)"))
        })?;
        Ok(GatedDeltaNet {
            proj,
            conv_weight,
            a_log: w.take(&p("A_log"), &[nv])?,
            dt_bias: w.take(&p("dt_bias"), &[nv])?,
            norm: RmsNormGated::load(w, &p("norm"), dv, opts.rms_norm_eps)?,
            out_proj: Linear::load(w, &p("out_proj"), value_dim, h, false)?,
            kernel: w.options().gated_delta(),
            key_dim,
            value_dim,
            conv_dim,
            opts,
        })
    }

    /// `(mixed qkv [B,S,conv_dim], z [B,S,Hv,Dv], b [B,S,Hv], a [B,S,Hv])`.
    fn project(&self, x: &Array) -> Result<(Array, Array, Array, Array)> {
        let (bsz, s) = (x.dim(0), x.dim(1));
        let o = &self.opts;
        let (nk, nv, dk, dv) = (o.num_k_heads, o.num_v_heads, o.head_k_dim, o.head_v_dim);
        Ok(match &self.proj {
            Projections::Interleaved { qkvz, ba } => {
                // Per key head: [q (dk), k (dk), v (nv/nk·dv), z (nv/nk·dv)] and [b, a].
                let per = nv / nk;
                let qkvz = qkvz.forward(x)?.reshape(&[bsz, s, nk, -1])?;
                let ba = ba.forward(x)?.reshape(&[bsz, s, nk, -1])?;
                let parts = split_at_indices(&qkvz, &[dk, 2 * dk, 2 * dk + per * dv], -1)?;
                let (q, k, v, z) = (&parts[0], &parts[1], &parts[2], &parts[3]);
                let ba = split_at_indices(&ba, &[per], -1)?;
                let mixed = concatenate(
                    &[q.reshape(&[bsz, s, -1])?, k.reshape(&[bsz, s, -1])?, v.reshape(&[bsz, s, -1])?],
                    -1,
                )?;
                (
                    mixed,
                    z.reshape(&[bsz, s, -1, dv])?,
                    ba[0].reshape(&[bsz, s, nv])?,
                    ba[1].reshape(&[bsz, s, nv])?,
                )
            }
            Projections::Separate { qkv, z, b, a } => (
                qkv.forward(x)?,
                z.forward(x)?.reshape(&[bsz, s, nv, dv])?,
                b.forward(x)?,
                a.forward(x)?,
            ),
        })
    }

    /// `x`: `[B, S, hidden]` → `[B, S, hidden]`; reads and replaces the layer's conv window and
    /// recurrent state. `mask` (`[B, S]` bool, from [`RecurrentState::make_mask`] of the
    /// stack's first linear-attention cache) marks each row's real positions in a right-padded
    /// batched chunk, as mlx-lm's `ArraysCache` mask does: padded inputs enter the conv as
    /// zeros, the recurrent state does not move over them, and each row's conv window is taken
    /// at its own end.
    pub fn forward(&self, x: &Array, mask: Option<&Array>, state: &mut RecurrentState) -> Result<Array> {
        let (bsz, s) = (x.dim(0), x.dim(1));
        let o = &self.opts;
        if state.rows() != bsz as usize {
            return Err(Error::Mlx(format!("{bsz} input rows for a {}-row recurrent cache", state.rows())));
        }
        let (mut mixed, z, b, a) = self.project(x)?;
        if let Some(m) = mask {
            mixed = select(m.expand_dims(-1)?, &mixed, scalar(0.0, mixed.dtype())?)?;
        }

        let n_keep = o.conv_kernel - 1;
        let conv_state = match &state.conv {
            Some(c) => c.clone(),
            None => zeros_dtype(&[bsz, n_keep, self.conv_dim], x.dtype())?,
        };
        let conv_input = concatenate(&[conv_state, mixed], 1)?;
        let new_conv = match state.chunk_lengths(s) {
            // mlx-lm: take_along_axis(conv_input, (ends[:, None] + arange(n_keep))[..., None], 1).
            Some(ends) => {
                let positions: Vec<i32> = ends.iter().flat_map(|&e| (0..n_keep).map(move |j| e + j)).collect();
                let positions = Array::from_slice(&positions, &[bsz, n_keep, 1]);
                conv_input.take_along_axis(&positions, 1)?
            }
            None => {
                let total = conv_input.dim(1);
                conv_input.index((.., total - n_keep.., ..)).contiguous()?
            }
        };
        let conv = conv1d(&conv_input, &self.conv_weight, 1, 0, 1, self.conv_dim)?;
        let conv = conv.multiply(sigmoid(&conv)?)?;

        let parts = split_at_indices(&conv, &[self.key_dim, 2 * self.key_dim], -1)?;
        let q = parts[0].reshape(&[bsz, s, o.num_k_heads, o.head_k_dim])?;
        let k = parts[1].reshape(&[bsz, s, o.num_k_heads, o.head_k_dim])?;
        let v = parts[2].reshape(&[bsz, s, o.num_v_heads, o.head_v_dim])?;
        let (q, k) = normalize_qk(&q, &k, o.head_k_dim)?;

        let (out, new_state) = gated_delta_update(
            &q,
            &k,
            &v,
            &a,
            &b,
            &self.a_log,
            &self.dt_bias,
            state.ssm.clone(),
            mask,
            self.kernel,
        )?;
        // The state changes only once the whole step is built.
        state.conv = Some(new_conv);
        state.ssm = Some(new_state);
        state.advance(s);

        let out = self.norm.forward(&out, &z)?;
        self.out_proj.forward(&out.reshape(&[bsz, s, self.value_dim])?)
    }
}

/// L2-normalizes q and k per head and folds the `Dk^-1/2` readout scale into q (mlx-lm
/// `normalize_qk` with eps 1e-6, written as `rms_norm` with the eps rescaled).
pub fn normalize_qk(q: &Array, k: &Array, head_k_dim: i32) -> Result<(Array, Array)> {
    let inv_scale = (head_k_dim as f64).powf(-0.5);
    let rms_eps = (1e-6 * (inv_scale * inv_scale)) as f32;
    let q = scalar(inv_scale * inv_scale, q.dtype())?.multiply(mlx_rs::fast::rms_norm(q, None, rms_eps)?)?;
    let k = scalar(inv_scale, k.dtype())?.multiply(mlx_rs::fast::rms_norm(k, None, rms_eps)?)?;
    Ok((q, k))
}

/// A Python float operand: MLX gives it the other operand's dtype (no promotion).
fn scalar(v: f64, dtype: Dtype) -> Result<Array> {
    Ok(Array::from_f32(v as f32).as_dtype(dtype)?)
}

/// `g = exp(-exp(A_log) * softplus(a + dt_bias))` (mlx-lm `compute_g`).
fn compute_g(a_log: &Array, a: &Array, dt_bias: &Array) -> Result<Array> {
    let x = a.add(dt_bias)?;
    let softplus = logaddexp(&x, scalar(0.0, x.dtype())?)?;
    let decay_rate = exp(a_log.as_dtype(Dtype::Float32)?)?.negative()?;
    Ok(exp(decay_rate.multiply(&softplus)?)?)
}

/// The gated delta rule over `T` steps (mlx-lm `gated_delta_update`): beta and the decay from
/// the projections, then [`gated_delta_recurrence`] by `kernel`.
/// q, k: `[B,T,Hk,Dk]`; v: `[B,T,Hv,Dv]`; a, b: `[B,T,Hv]`; state `[B,Hv,Dv,Dk]` (float32,
/// zeros if `None`); `mask` `[B,T]` bool (false: the row's state stays as it was over that
/// step). Returns `y [B,T,Hv,Dv]` and the new state.
#[allow(clippy::too_many_arguments)]
pub fn gated_delta_update(
    q: &Array,
    k: &Array,
    v: &Array,
    a: &Array,
    b: &Array,
    a_log: &Array,
    dt_bias: &Array,
    state: Option<Array>,
    mask: Option<&Array>,
    kernel: GatedDeltaKernel,
) -> Result<(Array, Array)> {
    let beta = sigmoid(b)?;
    let g = compute_g(a_log, a, dt_bias)?;
    gated_delta_recurrence(kernel, q, k, v, &g, &beta, state, mask)
}

/// The recurrence itself, given the decay `g` (linear space) and `beta` `[B,T,Hv]`, by
/// `kernel`. Where the mask is false, y is 0 on the fused, CUDA and CPU paths and the ops path's
/// unmasked value (mlx-lm's), which no caller reads: masked steps are a batch's padding.
#[allow(clippy::too_many_arguments)]
pub fn gated_delta_recurrence(
    kernel: GatedDeltaKernel,
    q: &Array,
    k: &Array,
    v: &Array,
    g: &Array,
    beta: &Array,
    state: Option<Array>,
    mask: Option<&Array>,
) -> Result<(Array, Array)> {
    match kernel {
        GatedDeltaKernel::Ops => gated_delta_ops(q, k, v, g, beta, state, mask),
        GatedDeltaKernel::Fused => {
            fused_call(mlx_sys::weft_gated_delta_fused, "gated_delta_update", q, k, v, g, beta, state.as_ref(), mask)
        }
        GatedDeltaKernel::Cuda => {
            fused_call(mlx_sys::weft_gated_delta_cuda, "gated delta CUDA kernel", q, k, v, g, beta, state.as_ref(), mask)
        }
        GatedDeltaKernel::Cpu => {
            fused_call(mlx_sys::weft_gated_delta_cpu, "gated delta CPU kernel", q, k, v, g, beta, state.as_ref(), mask)
        }
    }
}

/// The C signature of `kernels/gated_delta.h`'s entry points.
type FusedEntry = unsafe extern "C" fn(
    *mut mlx_sys::mlx_array,
    *mut mlx_sys::mlx_array,
    mlx_sys::mlx_array,
    mlx_sys::mlx_array,
    mlx_sys::mlx_array,
    mlx_sys::mlx_array,
    mlx_sys::mlx_array,
    mlx_sys::mlx_array,
    mlx_sys::mlx_array,
    mlx_sys::mlx_stream,
) -> std::os::raw::c_int;

#[allow(clippy::too_many_arguments)]
fn fused_call(
    entry: FusedEntry,
    what: &str,
    q: &Array,
    k: &Array,
    v: &Array,
    g: &Array,
    beta: &Array,
    state: Option<&Array>,
    mask: Option<&Array>,
) -> Result<(Array, Array)> {
    let stream = mlx_rs::Stream::thread_local_or_default();
    unsafe {
        let none = mlx_sys::mlx_array_new();
        let mut y = mlx_sys::mlx_array_new();
        let mut new_state = mlx_sys::mlx_array_new();
        let status = entry(
            &mut y,
            &mut new_state,
            q.as_ptr(),
            k.as_ptr(),
            v.as_ptr(),
            g.as_ptr(),
            beta.as_ptr(),
            state.map_or(none, |s| s.as_ptr()),
            mask.map_or(none, |m| m.as_ptr()),
            stream.as_ptr(),
        );
        if status != 0 {
            mlx_sys::mlx_array_free(y);
            mlx_sys::mlx_array_free(new_state);
            let msg = std::ffi::CStr::from_ptr(mlx_sys::weft_gated_delta_last_error()).to_string_lossy().into_owned();
            return Err(Error::Mlx(format!("{what}: {msg}")));
        }
        Ok((Array::from_ptr(y), Array::from_ptr(new_state)))
    }
}

/// mlx-lm's `gated_delta_ops`: one [`gated_delta_step`] per token.
fn gated_delta_ops(
    q: &Array,
    k: &Array,
    v: &Array,
    g: &Array,
    beta: &Array,
    state: Option<Array>,
    mask: Option<&Array>,
) -> Result<(Array, Array)> {
    let (bsz, t, hk, dk) = (q.dim(0), q.dim(1), q.dim(2), q.dim(3));
    let (hv, dv) = (v.dim(2), v.dim(3));
    let mut state = match state {
        Some(s) => s,
        None => zeros_dtype(&[bsz, hv, dv, dk], Dtype::Float32)?,
    };
    let (q, k) = if hv / hk > 1 {
        let r = hv / hk;
        (Array::repeat_axis::<f32>(q.clone(), r, -2)?, Array::repeat_axis::<f32>(k.clone(), r, -2)?)
    } else {
        (q.clone(), k.clone())
    };
    let mut ys = Vec::with_capacity(t as usize);
    for i in 0..t {
        let (y, next) = gated_delta_step(
            &q.index((.., i)),
            &k.index((.., i)),
            &v.index((.., i)),
            &g.index((.., i)),
            &beta.index((.., i)),
            &state,
            mask.map(|m| m.index((.., i))).as_ref(),
        )?;
        ys.push(y);
        state = next;
    }
    Ok((stack(&ys, 1)?, state))
}

/// One recurrence step (mlx-lm `_gated_delta_step_ops`, scalar gate):
/// q, k `[B,H,Dk]`, v `[B,H,Dv]`, g, beta `[B,H]`, state `[B,H,Dv,Dk]`, mask `[B]`.
fn gated_delta_step(
    q: &Array,
    k: &Array,
    v: &Array,
    g: &Array,
    beta: &Array,
    old_state: &Array,
    mask: Option<&Array>,
) -> Result<(Array, Array)> {
    let decay = g.expand_dims_axes(&[2, 3])?;
    let state = old_state.multiply(&decay)?;
    let k_row = k.expand_dims(-2)?;
    let kv_mem = state.multiply(&k_row)?.sum_axis(-1, None)?;
    let delta = v.subtract(&kv_mem)?.multiply(beta.expand_dims(-1)?)?;
    let state = state.add(k_row.multiply(delta.expand_dims(-1)?)?)?;
    let y = state.multiply(q.expand_dims(-2)?)?.sum_axis(-1, None)?;
    let state = match mask {
        Some(m) => select(m.expand_dims_axes(&[1, 2, 3])?, &state, old_state)?,
        None => state,
    };
    Ok((y.as_dtype(q.dtype())?, state))
}
