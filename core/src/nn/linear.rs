//! Linear / embedding / RMSNorm layers, dense or affine-quantized.

use mlx_rs::ops::{addmm, dequantize, quantized_matmul};
use mlx_rs::Array;

use super::weights::{QuantSpec, Weights};
use crate::kernels::{self, CpuKernels};
use crate::Result;

/// `y = x W^T (+ b)`; quantized weights use `quantized_matmul(transpose=true)` as mlx's
/// `QuantizedLinear`, through Weft's fast CPU kernel when the layer was loaded in fast mode.
pub enum Linear {
    Dense { weight: Array, bias: Option<Array> },
    Quantized { weight: Array, scales: Array, biases: Array, bias: Option<Array>, spec: QuantSpec, fast: bool },
}

/// `x @ w^T` for an affine-quantized `w` with the kernel the layer was loaded with.
fn qmm(x: &Array, weight: &Array, scales: &Array, biases: &Array, spec: QuantSpec, fast: bool) -> Result<Array> {
    if fast {
        kernels::quantized_matmul(x, weight, scales, biases, spec.group_size, spec.bits)
    } else {
        Ok(quantized_matmul(x, weight, scales, biases, true, spec.group_size, spec.bits)?)
    }
}

/// Whether a quantized layer loaded now takes the fast kernel (see [`kernels`]).
fn load_fast() -> Result<bool> {
    Ok(kernels::cpu_kernels()? == CpuKernels::Fast)
}

impl Linear {
    pub fn load(w: &mut Weights, prefix: &str, in_dim: i32, out_dim: i32, bias: bool) -> Result<Self> {
        let bias = if bias {
            Some(w.take(&format!("{prefix}.bias"), &[out_dim])?)
        } else {
            None
        };
        Ok(match w.quant_spec(prefix)? {
            Some(spec) => {
                let (weight, scales, biases) = w.take_quantized(prefix, out_dim, in_dim, spec)?;
                Linear::Quantized { weight, scales, biases, bias, spec, fast: load_fast()? }
            }
            None => {
                Linear::Dense { weight: w.take(&format!("{prefix}.weight"), &[out_dim, in_dim])?, bias }
            }
        })
    }

    pub fn forward(&self, x: &Array) -> Result<Array> {
        Ok(match self {
            Linear::Dense { weight, bias: None } => x.matmul(weight.t())?,
            Linear::Dense { weight, bias: Some(b) } => addmm(b, x, weight.t(), None, None)?,
            Linear::Quantized { weight, scales, biases, bias, spec, fast } => {
                let y = qmm(x, weight, scales, biases, *spec, *fast)?;
                match bias {
                    Some(b) => y.add(b)?,
                    None => y,
                }
            }
        })
    }
}

/// Token embedding table; `as_linear` is the tied output projection.
pub enum Embedding {
    Dense { weight: Array },
    Quantized { weight: Array, scales: Array, biases: Array, spec: QuantSpec, fast: bool },
}

impl Embedding {
    pub fn load(w: &mut Weights, prefix: &str, vocab: i32, dim: i32) -> Result<Self> {
        Ok(match w.quant_spec(prefix)? {
            Some(spec) => {
                let (weight, scales, biases) = w.take_quantized(prefix, vocab, dim, spec)?;
                Embedding::Quantized { weight, scales, biases, spec, fast: load_fast()? }
            }
            None => Embedding::Dense { weight: w.take(&format!("{prefix}.weight"), &[vocab, dim])? },
        })
    }

    pub fn forward(&self, ids: &Array) -> Result<Array> {
        Ok(match self {
            Embedding::Dense { weight } => weight.take_axis(ids, 0)?,
            Embedding::Quantized { weight, scales, biases, spec, .. } => dequantize(
                weight.take_axis(ids, 0)?,
                scales.take_axis(ids, 0)?,
                &biases.take_axis(ids, 0)?,
                spec.group_size,
                spec.bits,
            )?,
        })
    }

    pub fn as_linear(&self, x: &Array) -> Result<Array> {
        Ok(match self {
            Embedding::Dense { weight } => x.matmul(weight.t())?,
            Embedding::Quantized { weight, scales, biases, spec, fast } => {
                qmm(x, weight, scales, biases, *spec, *fast)?
            }
        })
    }
}

/// `mx.fast.rms_norm` with a learned scale.
pub struct RmsNorm {
    pub weight: Array,
    pub eps: f32,
}

impl RmsNorm {
    pub fn load(w: &mut Weights, prefix: &str, dim: i32, eps: f32) -> Result<Self> {
        Ok(RmsNorm { weight: w.take(&format!("{prefix}.weight"), &[dim])?, eps })
    }

    /// Gemma's RMSNorm: the stored weight is an offset from 1 (`rms_norm(x, 1 + w)`). The sum
    /// is taken once here, in the weight's dtype, as mlx-lm computes it on every call.
    pub fn load_gemma(w: &mut Weights, prefix: &str, dim: i32, eps: f32) -> Result<Self> {
        let weight = w.take(&format!("{prefix}.weight"), &[dim])?;
        let one = Array::from_f32(1.0).as_dtype(weight.dtype())?;
        let weight = one.add(&weight)?;
        // Materialize now: a lazy op would belong to this thread's stream, and the model may
        // run on another thread (the engine's driver).
        weight.eval()?;
        Ok(RmsNorm { weight, eps })
    }

    pub fn forward(&self, x: &Array) -> Result<Array> {
        Ok(mlx_rs::fast::rms_norm(x, Some(&self.weight), self.eps)?)
    }
}
