//! Mixture-of-experts layers, op-for-op as mlx-lm's `switch_layers.py` (`SwitchLinear`,
//! `QuantizedSwitchLinear`, `SwitchGLU`) and the Qwen3-MoE top-k softmax router. Experts are
//! stacked `[E, out, in]` matrices applied per token with `gather_mm` / `gather_qmm` (quantized
//! experts through Weft's fast CPU kernel when loaded in fast mode on the CPU).

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::ops::{argpartition_axis, argsort, gather_mm, gather_qmm, softmax_axis, unflatten};
use mlx_rs::Array;

use super::{Linear, MlpActivation, QuantSpec, Weights};
use crate::{Error, Result};

/// `SwitchGLU` sorts the (token, expert) pairs by expert once this many pairs are routed.
const SORT_THRESHOLD: usize = 64;

/// One stacked expert projection: `x @ W[e]^T` for the expert `e` of each routed pair.
pub enum SwitchLinear {
    Dense { weight: Array },
    /// `fast`: Weft's CPU kernel ([`crate::kernels::gather_qmm`]) instead of MLX's.
    Quantized { weight: Array, scales: Array, biases: Array, spec: QuantSpec, fast: bool },
}

impl SwitchLinear {
    pub fn load(w: &mut Weights, prefix: &str, experts: i32, in_dim: i32, out_dim: i32) -> Result<Self> {
        Ok(match w.quant_spec(prefix)? {
            Some(spec) => {
                if in_dim % spec.group_size != 0 || (in_dim * spec.bits) % 32 != 0 {
                    return Err(Error::ModelLoad(format!(
                        "{prefix}: {in_dim} columns are not divisible by group size {} / {} bits",
                        spec.group_size, spec.bits
                    )));
                }
                let weight = w.take(&format!("{prefix}.weight"), &[experts, out_dim, in_dim * spec.bits / 32])?;
                let groups = in_dim / spec.group_size;
                let scales = w.take(&format!("{prefix}.scales"), &[experts, out_dim, groups])?;
                let biases = w.take(&format!("{prefix}.biases"), &[experts, out_dim, groups])?;
                let fast = matches!(w.options().qmm_path(), super::QmmPath::WeftCpu(_));
                SwitchLinear::Quantized { weight, scales, biases, spec, fast }
            }
            None => SwitchLinear::Dense { weight: w.take(&format!("{prefix}.weight"), &[experts, out_dim, in_dim])? },
        })
    }

    fn forward(&self, x: &Array, indices: &Array, sorted: bool) -> Result<Array> {
        Ok(match self {
            SwitchLinear::Dense { weight } => gather_mm(x, weight.swap_axes(-1, -2)?, None, indices, sorted)?,
            SwitchLinear::Quantized { weight, scales, biases, spec, fast: true } => {
                crate::kernels::gather_qmm(x, weight, scales, biases, indices, spec.group_size, spec.bits)?
            }
            SwitchLinear::Quantized { weight, scales, biases, spec, fast: false } => gather_qmm(
                x,
                weight,
                scales,
                biases,
                None,
                indices,
                true,
                spec.group_size,
                spec.bits,
                sorted,
            )?,
        })
    }
}

/// `SwitchGLU`: per routed expert `down(act(gate(x)) * up(x))`, `act` SiLU (mlx-lm's default
/// `SwiGLU`) or tanh-approximated GELU (Gemma 4's `GeGLU`).
pub struct SwitchGlu {
    gate_proj: SwitchLinear,
    up_proj: SwitchLinear,
    down_proj: SwitchLinear,
    activation: MlpActivation,
    compile: bool,
}

impl SwitchGlu {
    pub fn load(w: &mut Weights, prefix: &str, experts: i32, hidden: i32, intermediate: i32) -> Result<Self> {
        Self::load_with(w, prefix, experts, hidden, intermediate, MlpActivation::Silu)
    }

    pub fn load_with(
        w: &mut Weights,
        prefix: &str,
        experts: i32,
        hidden: i32,
        intermediate: i32,
        activation: MlpActivation,
    ) -> Result<Self> {
        Ok(SwitchGlu {
            gate_proj: SwitchLinear::load(w, &format!("{prefix}.gate_proj"), experts, hidden, intermediate)?,
            up_proj: SwitchLinear::load(w, &format!("{prefix}.up_proj"), experts, hidden, intermediate)?,
            down_proj: SwitchLinear::load(w, &format!("{prefix}.down_proj"), experts, intermediate, hidden)?,
            activation,
            compile: w.options().compile(),
        })
    }

    /// `x`: `[..., D]`, `indices`: `[..., k]` expert ids → `[..., k, D]`.
    pub fn forward(&self, x: &Array, indices: &Array) -> Result<Array> {
        let x = x.expand_dims_axes(&[-2, -3])?;
        // Many pairs: sort them by expert so each expert's weights are read once (mlx-lm's
        // `_gather_sort` / `_scatter_unsort`); the sort changes which kernel runs, so it is
        // taken at exactly mlx-lm's threshold.
        let sort = indices.size() >= SORT_THRESHOLD;
        let (x, idx, inv_order) = if sort {
            let k = indices.dim(-1);
            let flat = indices.flatten(None, None)?;
            let order = argsort(&flat)?;
            let inv_order = argsort(&order)?;
            let rows = order.floor_divide(Array::from_slice(&[k as u32], &[]))?;
            let x = x.flatten(0, -3)?.take_axis(&rows, 0)?;
            (x, flat.take_axis(&order, 0)?, Some(inv_order))
        } else {
            (x, indices.clone(), None)
        };
        let up = self.up_proj.forward(&x, &idx, sort)?;
        let gate = self.gate_proj.forward(&x, &idx, sort)?;
        let h = self.activation.gated(&gate, &up, self.compile)?;
        let mut y = self.down_proj.forward(&h, &idx, sort)?;
        if let Some(inv) = inv_order {
            y = unflatten(y.take_axis(&inv, 0)?, 0, indices.shape())?;
        }
        Ok(y.squeeze_axes(&[-2])?)
    }
}

/// Qwen3-MoE's sparse block: softmax router, top-k experts (optionally renormalized), the
/// experts' outputs weighted by their router scores.
pub struct SparseMoe {
    gate: Linear,
    switch_mlp: SwitchGlu,
    top_k: i32,
    norm_topk_prob: bool,
}

impl SparseMoe {
    pub fn load(
        w: &mut Weights,
        prefix: &str,
        hidden: i32,
        intermediate: i32,
        experts: i32,
        top_k: i32,
        norm_topk_prob: bool,
    ) -> Result<Self> {
        if top_k < 1 || top_k > experts {
            return Err(Error::ModelLoad(format!("{prefix}: top-{top_k} routing over {experts} experts")));
        }
        Ok(SparseMoe {
            gate: Linear::load(w, &format!("{prefix}.gate"), hidden, experts, false)?,
            switch_mlp: SwitchGlu::load(w, &format!("{prefix}.switch_mlp"), experts, hidden, intermediate)?,
            top_k,
            norm_topk_prob,
        })
    }

    /// `x`: `[B, L, D]` → `[B, L, D]`.
    pub fn forward(&self, x: &Array) -> Result<Array> {
        let gates = softmax_axis(self.gate.forward(x)?, -1, true)?;
        let experts = gates.dim(-1);
        let inds = argpartition_axis(&gates, -self.top_k, -1)?.index((.., .., experts - self.top_k..));
        let mut scores = gates.take_along_axis(&inds, -1)?;
        if self.norm_topk_prob {
            scores = scores.divide(scores.sum_axis(-1, true)?)?;
        }
        let y = self.switch_mlp.forward(x, &inds)?;
        let dtype = y.dtype();
        Ok(y.multiply(scores.expand_dims(-1)?)?.sum_axis(-2, false)?.as_dtype(dtype)?)
    }
}

/// Stacks per-expert Hugging Face weights (`{prefix}.experts.{e}.{proj}.weight`) into the
/// `{prefix}.switch_mlp.{proj}.weight` tensors mlx-lm's `sanitize` builds. No-op when the
/// checkpoint is already stacked.
pub fn stack_expert_weights(w: &mut Weights, prefix: &str, experts: i32) -> Result<()> {
    if !w.contains(&format!("{prefix}.experts.0.up_proj.weight")) {
        return Ok(());
    }
    for proj in ["up_proj", "down_proj", "gate_proj"] {
        let parts: Vec<Array> = (0..experts)
            .map(|e| {
                let name = format!("{prefix}.experts.{e}.{proj}.weight");
                w.remove(&name).ok_or_else(|| Error::ModelLoad(format!("missing tensor {name:?}")))
            })
            .collect::<Result<_>>()?;
        w.insert(format!("{prefix}.switch_mlp.{proj}.weight"), mlx_rs::ops::stack(&parts, 0)?);
    }
    Ok(())
}
