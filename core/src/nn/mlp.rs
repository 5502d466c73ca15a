//! The SwiGLU feed-forward block (`down(silu(gate(x)) * up(x))`).

use mlx_rs::Array;

use super::{swiglu, Linear, Weights};
use crate::Result;

pub struct Mlp {
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
}

impl Mlp {
    pub fn load(w: &mut Weights, prefix: &str, hidden: i32, intermediate: i32, bias: bool) -> Result<Self> {
        Ok(Mlp {
            gate_proj: Linear::load(w, &format!("{prefix}.gate_proj"), hidden, intermediate, bias)?,
            up_proj: Linear::load(w, &format!("{prefix}.up_proj"), hidden, intermediate, bias)?,
            down_proj: Linear::load(w, &format!("{prefix}.down_proj"), intermediate, hidden, bias)?,
        })
    }

    pub fn forward(&self, x: &Array) -> Result<Array> {
        self.down_proj.forward(&swiglu(&self.gate_proj.forward(x)?, &self.up_proj.forward(x)?)?)
    }
}
