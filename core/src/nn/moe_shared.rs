//! Sparse mixture of experts with an always-on, sigmoid-gated shared expert (mlx-lm
//! `Qwen3NextSparseMoeBlock` over `SwitchGLU`): softmax router (precise), top-k experts by
//! `argpartition`, optionally renormalized scores, SwiGLU experts through the shared
//! [`SwitchGlu`] (`gather_mm`, or `gather_qmm` for quantized experts; tokens sorted by expert
//! when there are at least 64 (token, expert) pairs, as mlx-lm does), plus
//! `sigmoid(shared_expert_gate(x)) * shared_expert(x)`.

use mlx_rs::ops::indexing::{take_along_axis, IndexOp};
use mlx_rs::ops::{argpartition_axis, sigmoid, softmax_axis};
use mlx_rs::Array;

use super::switch::SwitchGlu;
use super::{Linear, Mlp, Weights};
use crate::{Error, Result};

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
            switch_mlp: SwitchGlu::load(w, &p("switch_mlp"), e, h, m)?,
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
