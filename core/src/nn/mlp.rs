//! The gated feed-forward block: `down(act(gate(x)) * up(x))` with SiLU (SwiGLU, the Llama
//! family) or tanh-approximated GELU (GeGLU, Gemma).

use mlx_rs::Array;

use super::{Linear, Weights};
use crate::Result;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MlpActivation {
    Silu,
    /// mlx `nn.gelu_approx` (`gelu_pytorch_tanh`).
    GeluApprox,
}

enum GateUp {
    Separate { gate_proj: Linear, up_proj: Linear },
    /// Phi-3's `gate_up_proj`, or separate projections stacked at load
    /// ([`super::LayerOptions::fuse_projections`]): gate then up halves (`mx.split(x, 2, axis=-1)`).
    Fused(Linear),
}

pub struct Mlp {
    gate_up: GateUp,
    down_proj: Linear,
    activation: MlpActivation,
    /// The activation runs as one compiled kernel ([`super::compiled`]).
    compile: bool,
}

impl MlpActivation {
    /// `act(gate) * up`, as one compiled kernel when `compile` (same values).
    pub fn gated(self, gate: &Array, up: &Array, compile: bool) -> Result<Array> {
        match (self, compile) {
            (MlpActivation::Silu, false) => super::swiglu(gate, up),
            (MlpActivation::Silu, true) => super::compiled::swiglu(gate, up),
            (MlpActivation::GeluApprox, false) => Ok(super::gelu_approx(gate)?.multiply(up)?),
            (MlpActivation::GeluApprox, true) => super::compiled::geglu(gate, up),
        }
    }
}

impl Mlp {
    pub fn load(w: &mut Weights, prefix: &str, hidden: i32, intermediate: i32, bias: bool) -> Result<Self> {
        Self::load_with(w, prefix, hidden, intermediate, bias, MlpActivation::Silu)
    }

    pub fn load_with(
        w: &mut Weights,
        prefix: &str,
        hidden: i32,
        intermediate: i32,
        bias: bool,
        activation: MlpActivation,
    ) -> Result<Self> {
        let gate_proj = Linear::load(w, &format!("{prefix}.gate_proj"), hidden, intermediate, bias)?;
        let up_proj = Linear::load(w, &format!("{prefix}.up_proj"), hidden, intermediate, bias)?;
        let gate_up = if w.options().fuse_projections() {
            match Linear::concat_outputs(vec![gate_proj, up_proj])? {
                Ok(fused) => GateUp::Fused(fused),
                Err(mut parts) => {
                    let up_proj = parts.pop().expect("two parts");
                    GateUp::Separate { gate_proj: parts.pop().expect("two parts"), up_proj }
                }
            }
        } else {
            GateUp::Separate { gate_proj, up_proj }
        };
        Ok(Mlp {
            gate_up,
            down_proj: Linear::load(w, &format!("{prefix}.down_proj"), intermediate, hidden, bias)?,
            activation,
            compile: w.options().compile(),
        })
    }

    /// Phi-3's fused `gate_up_proj` (SwiGLU, no biases).
    pub fn load_fused(w: &mut Weights, prefix: &str, hidden: i32, intermediate: i32) -> Result<Self> {
        Ok(Mlp {
            gate_up: GateUp::Fused(Linear::load(w, &format!("{prefix}.gate_up_proj"), hidden, 2 * intermediate, false)?),
            down_proj: Linear::load(w, &format!("{prefix}.down_proj"), intermediate, hidden, false)?,
            activation: MlpActivation::Silu,
            compile: w.options().compile(),
        })
    }

    /// The down projection, for tensor parallel's sharding pass.
    pub(crate) fn down_proj_mut(&mut self) -> &mut Linear {
        &mut self.down_proj
    }

    pub fn forward(&self, x: &Array) -> Result<Array> {
        let (gate, up) = match &self.gate_up {
            GateUp::Separate { gate_proj, up_proj } => (gate_proj.forward(x)?, up_proj.forward(x)?),
            GateUp::Fused(proj) => {
                let gate_up = proj.forward(x)?;
                // Fast CPU path: the down projection applies SwiGLU as it reads its input.
                if self.activation == MlpActivation::Silu {
                    if let Some(y) = self.down_proj.forward_swiglu(&gate_up)? {
                        return Ok(y);
                    }
                }
                let mut halves = mlx_rs::ops::split_equal(&gate_up, 2, -1)?.into_iter();
                (halves.next().unwrap(), halves.next().unwrap())
            }
        };
        let h = self.activation.gated(&gate, &up, self.compile)?;
        self.down_proj.forward(&h)
    }
}
