//! The gated feed-forward block: `down(act(gate(x)) * up(x))` with SiLU (SwiGLU, the Llama
//! family) or tanh-approximated GELU (GeGLU, Gemma).

use mlx_rs::Array;

use super::{gelu_approx, swiglu, Linear, Weights};
use crate::Result;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MlpActivation {
    Silu,
    /// mlx `nn.gelu_approx` (`gelu_pytorch_tanh`).
    GeluApprox,
}

pub struct Mlp {
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
    activation: MlpActivation,
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
        Ok(Mlp {
            gate_proj: Linear::load(w, &format!("{prefix}.gate_proj"), hidden, intermediate, bias)?,
            up_proj: Linear::load(w, &format!("{prefix}.up_proj"), hidden, intermediate, bias)?,
            down_proj: Linear::load(w, &format!("{prefix}.down_proj"), intermediate, hidden, bias)?,
            activation,
        })
    }

    pub fn forward(&self, x: &Array) -> Result<Array> {
        let (gate, up) = (self.gate_proj.forward(x)?, self.up_proj.forward(x)?);
        let h = match self.activation {
            MlpActivation::Silu => swiglu(&gate, &up)?,
            MlpActivation::GeluApprox => gelu_approx(&gate)?.multiply(&up)?,
        };
        self.down_proj.forward(&h)
    }
}
