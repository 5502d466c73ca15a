//! Shared layers every architecture builds on. Each mirrors the MLX / mlx-lm layer of the same
//! name op-for-op, because parity with mlx-lm is judged bit-for-bit on first-step logits.

mod attention;
pub mod cuda_qmv;
pub mod compiled;
mod decoder;
mod gated_attention;
mod gated_delta;
mod hybrid;
mod linear;
mod mlp;
mod options;
mod moe_shared;
pub mod pipeline;
mod rope;
pub mod siglip;
mod switch;
pub mod tensor_parallel;
mod weights;

pub use attention::{Attention, AttentionOptions};
pub use decoder::{DecoderScaling, DenseDecoder, DenseDecoderSpec};
pub use gated_attention::{GatedAttention, GatedAttentionOptions};
pub use gated_delta::{
    gated_delta_recurrence, GatedDeltaKernel, GatedDeltaNet, GatedDeltaOptions, ProjectionLayout, RmsNormGated,
};
pub use hybrid::{FeedForwardSpec, HybridDecoder, HybridDecoderSpec};
pub use moe_shared::{SharedExpertMoe, SharedExpertMoeOptions};
pub use linear::{Embedding, Linear, QmmPath, RmsNorm};
pub use options::{LayerOptions, Parallel, GPU_DEQUANTIZE_ROWS};
pub use rope::{scaling_kind, Rope, RopeContext};
pub use mlp::{Mlp, MlpActivation};
pub use switch::{stack_expert_weights, SparseMoe, SwitchGlu, SwitchLinear};
pub use weights::{QuantConfig, QuantSpec, Weights};

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{Array, Dtype};

pub use crate::cache::sdpa;
use crate::Result;

/// `silu(gate) * up`, as mlx-lm's `swiglu`.
pub fn swiglu(gate: &Array, up: &Array) -> Result<Array> {
    let silu = gate.multiply(mlx_rs::ops::sigmoid(gate)?)?;
    Ok(silu.multiply(up)?)
}

/// mlx `nn.gelu_approx`: `0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))`, op for op
/// (the constant is rounded from f64 as Python does; unfused equals mlx's compiled form).
pub fn gelu_approx(x: &Array) -> Result<Array> {
    let dt = x.dtype();
    let c = |v: f64| Array::from_f32(v as f32).as_dtype(dt);
    let cube = x.power(&c(3.0)?)?;
    let inner = x.add(&c(0.044715)?.multiply(&cube)?)?;
    let t = mlx_rs::ops::tanh(&c((2.0 / std::f64::consts::PI).sqrt())?.multiply(&inner)?)?;
    Ok(c(0.5)?.multiply(x)?.multiply(&c(1.0)?.add(&t)?)?)
}

/// Waits for all work queued on the default stream. Needed before tearing down state that
/// asynchronous evaluations may still be computing (e.g. an unread pipelined step at exit):
/// MLX's worker must not outlive what it writes into.
pub fn synchronize() {
    // SAFETY: no arguments; only blocks until the default stream is idle.
    unsafe {
        mlx_sys::mlx_synchronize_default();
    }
}

/// The logits of the last position: `[B, L, V] -> [B, V]`.
pub fn last_position(logits: &Array) -> Result<Array> {
    let l = logits.dim(1);
    Ok(logits.index((.., l - 1, ..)))
}

/// A float dtype name for messages.
pub fn dtype_name(d: Dtype) -> &'static str {
    match d {
        Dtype::Float32 => "float32",
        Dtype::Float16 => "float16",
        Dtype::Bfloat16 => "bfloat16",
        Dtype::Uint32 => "uint32",
        Dtype::Int32 => "int32",
        Dtype::Uint8 => "uint8",
        _ => "other",
    }
}
