//! Sparse mixture of experts with an always-on, sigmoid-gated shared expert (mlx-lm
//! `Qwen3NextSparseMoeBlock` over `SwitchGLU`): softmax router (precise), top-k experts by
//! `argpartition`, optionally renormalized scores, SwiGLU experts through `gather_mm` (tokens
//! sorted by expert when there are at least 64 (token, expert) pairs, as mlx-lm does), plus
//! `sigmoid(shared_expert_gate(x)) * shared_expert(x)`.
//!
//! Self-contained on purpose; the expert layer may later fold into a shared SwitchGLU.

use mlx_rs::ops::indexing::{take_along_axis, IndexOp};
use mlx_rs::ops::{argpartition_axis, argsort_axis, gather_mm, sigmoid, softmax_axis};
use mlx_rs::Array;

use super::{swiglu, Linear, Mlp, Weights};
use crate::{Error, Result};

/// Experts' stacked weights `[E, out, in]`.
struct SwitchLinear {
    weight: Array,
}

impl SwitchLinear {
    fn load(w: &mut Weights, prefix: &str, experts: i32, in_dim: i32, out_dim: i32) -> Result<Self> {
        if w.contains(&format!("{prefix}.scales")) {
            return Err(Error::Unsupported(format!(
                "{prefix}: quantized expert weights are not implemented yet"
            )));
        }
        let weight = w.take(&format!("{prefix}.weight"), &[experts, out_dim, in_dim])?;
        // Kept as loaded: an op built here would belong to the loading thread's stream, not
        // the engine thread that evaluates it.
        Ok(SwitchLinear { weight })
    }

    fn forward(&self, x: &Array, indices: &Array, sorted: bool) -> Result<Array> {
        Ok(gather_mm(x, self.weight.swap_axes(-1, -2)?, None, indices, sorted)?)
    }
}

/// SwiGLU experts chosen per token (mlx-lm `SwitchGLU`).
struct SwitchGlu {
    gate_proj: SwitchLinear,
    up_proj: SwitchLinear,
    down_proj: SwitchLinear,
}

impl SwitchGlu {
    /// `x`: `[B, L, D]`, `indices`: `[B, L, k]` → `[B, L, k, D]`.
    fn forward(&self, x: &Array, indices: &Array) -> Result<Array> {
        let x = x.expand_dims_axes(&[-2, -3])?;
        let shape = indices.shape().to_vec();
        let k = shape[shape.len() - 1];
        if indices.size() >= 64 {
            // Group the (token, expert) pairs by expert, run, then restore the order.
            let flat = indices.flatten(None, None)?;
            let order = argsort_axis(&flat, -1)?;
            let inv_order = argsort_axis(&order, -1)?;
            let rows = order.floor_divide(Array::from_int(k))?;
            let xs = x.flatten(0, -3)?.take_axis(&rows, 0)?;
            let idx = flat.take_axis(&order, 0)?;
            let up = self.up_proj.forward(&xs, &idx, true)?;
            let gate = self.gate_proj.forward(&xs, &idx, true)?;
            let y = self.down_proj.forward(&swiglu(&gate, &up)?, &idx, true)?;
            let y = y.take_axis(&inv_order, 0)?;
            let mut out_shape = shape.clone();
            out_shape.extend_from_slice(&y.shape()[1..]);
            Ok(y.reshape(&out_shape)?.squeeze_axes(&[-2])?)
        } else {
            let up = self.up_proj.forward(&x, indices, false)?;
            let gate = self.gate_proj.forward(&x, indices, false)?;
            let y = self.down_proj.forward(&swiglu(&gate, &up)?, indices, false)?;
            Ok(y.squeeze_axes(&[-2])?)
        }
    }
}

#[derive(Debug, Clone)]
pub struct SharedExpertMoeOptions {
    pub hidden: i32,
    pub num_experts: i32,
    pub top_k: i32,
    pub moe_intermediate: i32,
    pub shared_intermediate: i32,
    pub norm_topk_prob: bool,
}

pub struct SharedExpertMoe {
    gate: Linear,
    switch_mlp: SwitchGlu,
    shared_expert: Mlp,
    shared_expert_gate: Linear,
    opts: SharedExpertMoeOptions,
}

impl SharedExpertMoe {
    pub fn load(w: &mut Weights, prefix: &str, opts: SharedExpertMoeOptions) -> Result<Self> {
        let (h, e, m) = (opts.hidden, opts.num_experts, opts.moe_intermediate);
        if opts.top_k < 1 || opts.top_k > e {
            return Err(Error::ModelLoad(format!(
                "num_experts_per_tok {} must be between 1 and num_experts {e}",
                opts.top_k
            )));
        }
        let p = |n: &str| format!("{prefix}.{n}");
        Ok(SharedExpertMoe {
            gate: Linear::load(w, &p("gate"), h, e, false)?,
            switch_mlp: SwitchGlu {
                gate_proj: SwitchLinear::load(w, &p("switch_mlp.gate_proj"), e, h, m)?,
                up_proj: SwitchLinear::load(w, &p("switch_mlp.up_proj"), e, h, m)?,
                down_proj: SwitchLinear::load(w, &p("switch_mlp.down_proj"), e, m, h)?,
            },
            shared_expert: Mlp::load(w, &p("shared_expert"), h, opts.shared_intermediate, false)?,
            shared_expert_gate: Linear::load(w, &p("shared_expert_gate"), h, 1, false)?,
            opts,
        })
    }

    /// `x`: `[B, L, hidden]` → `[B, L, hidden]`.
    pub fn forward(&self, x: &Array) -> Result<Array> {
        let (e, k) = (self.opts.num_experts, self.opts.top_k);
        let gates = softmax_axis(self.gate.forward(x)?, -1, true)?;
        let inds = argpartition_axis(&gates, e - k, -1)?.index((.., .., (e - k)..));
        let mut scores = take_along_axis(&gates, &inds, -1)?;
        if self.opts.norm_topk_prob {
            scores = scores.divide(scores.sum_axis(-1, true)?)?;
        }
        let y = self.switch_mlp.forward(x, &inds)?;
        let y = y.multiply(scores.expand_dims(-1)?)?.sum_axis(-2, None)?;
        let shared = sigmoid(self.shared_expert_gate.forward(x)?)?.multiply(self.shared_expert.forward(x)?)?;
        Ok(y.add(&shared)?)
    }
}
