//! Linear / embedding / RMSNorm layers, dense or affine-quantized.

use mlx_rs::ops::{addmm, dequantize, quantized_matmul};
use mlx_rs::Array;

use super::weights::{QuantSpec, Weights};
use crate::kernels;
use crate::Result;

/// `y = x W^T (+ b)`; quantized weights use `quantized_matmul(transpose=true)` as mlx's
/// `QuantizedLinear`, through Weft's fast CPU kernel when the layer was loaded in fast mode
/// ([`super::LayerOptions::qmm_path`]).
pub enum Linear {
    Dense { weight: Array, bias: Option<Array> },
    Quantized { weight: Array, scales: Array, biases: Array, bias: Option<Array>, spec: QuantSpec, path: QmmPath },
    /// Tensor parallel's sharded-to-all projection ([`super::tensor_parallel`]): this rank's
    /// input columns, the partial products summed over `group`, then the bias.
    ShardedToAll { part: Box<Linear>, bias: Option<Array>, group: crate::distributed::Group },
}

/// How a quantized layer computes `x @ w^T`, chosen when it is loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QmmPath {
    /// MLX's `quantized_matmul` (what mlx-lm runs).
    Mlx,
    /// MLX's `quantized_matmul` over `x` flattened to `[rows, K]`. MLX's CUDA kernel takes a
    /// `[B, 1, K]` input (a batched decode step) as B separate one-row problems, each reading
    /// the whole weight, so its cost grows linearly with B; as `[B, K]` it is one B-row product
    /// with bit-identical outputs, 5-25x faster from 8 rows on (benches/gpu/flat_rows.py).
    MlxFlat,
    /// Weft's fast CPU kernel ([`kernels`]), with float32 or int8 activations.
    WeftCpu(kernels::CpuActivations),
    /// [`QmmPath::MlxFlat`] below `rows` rows of `x`; from there on the weight is dequantized
    /// and multiplied densely (the GPU default from [`super::GPU_DEQUANTIZE_ROWS`] rows: prefill chunks, where a dequantize
    /// plus a tensor-core matmul was measured 2x faster than MLX's batched quantized matmul).
    DequantizeFrom { rows: i32 },
    /// Weft's CUDA kernel ([`super::cuda_qmv`]) up to `max_rows` rows of `x` (a decode step),
    /// where it supports the layer; otherwise [`QmmPath::DequantizeFrom`] `dequantize_rows`
    /// (0: [`QmmPath::MlxFlat`]).
    WeftCuda { max_rows: i32, dequantize_rows: i32 },
}

/// `x @ w^T` for an affine-quantized `w` along `path`.
fn qmm(x: &Array, weight: &Array, scales: &Array, biases: &Array, spec: QuantSpec, path: QmmPath) -> Result<Array> {
    match path {
        QmmPath::WeftCpu(act) => kernels::quantized_matmul_with(x, weight, scales, biases, spec.group_size, spec.bits, act),
        QmmPath::WeftCuda { max_rows, .. }
            if super::cuda_qmv::supports(x, spec, max_rows) && super::cuda_qmv::worth_it(weight.dim(0), x.dim(-1)) =>
        {
            super::cuda_qmv::quantized_matmul(x, weight, scales, biases, spec)
        }
        QmmPath::WeftCuda { dequantize_rows, .. } => {
            let other = if dequantize_rows > 0 { QmmPath::DequantizeFrom { rows: dequantize_rows } } else { QmmPath::MlxFlat };
            qmm(x, weight, scales, biases, spec, other)
        }
        QmmPath::DequantizeFrom { rows } if x.size() as i64 / x.dim(-1) as i64 >= rows as i64 => {
            let w = dequantize(weight, scales, biases, spec.group_size, spec.bits)?;
            Ok(x.matmul(w.as_dtype(x.dtype())?.t())?)
        }
        // One leading batch (a B=1 decode step) is already one product: no reshapes.
        QmmPath::MlxFlat | QmmPath::DequantizeFrom { .. } if x.ndim() > 2 && x.shape()[..x.ndim() - 2].iter().any(|&d| d != 1) => {
            let k = x.dim(-1);
            let mut shape = x.shape().to_vec();
            let y = quantized_matmul(&x.reshape(&[-1, k])?, weight, scales, biases, true, spec.group_size, spec.bits)?;
            *shape.last_mut().expect("ndim > 2") = y.dim(-1);
            Ok(y.reshape(&shape)?)
        }
        _ => Ok(quantized_matmul(x, weight, scales, biases, true, spec.group_size, spec.bits)?),
    }
}

impl Linear {
    /// One layer whose output is the `parts`' outputs concatenated along the last axis, when
    /// they can be stacked: all dense of one dtype, or all quantized with one bits / group size
    /// / path (packed codes, scales and biases stack along the output rows), and all with or
    /// all without a bias. Otherwise the parts come back unchanged.
    pub fn concat_outputs(parts: Vec<Linear>) -> Result<std::result::Result<Linear, Vec<Linear>>> {
        use mlx_rs::ops::concatenate;
        let cat = |arrays: Vec<&Array>| -> Result<Array> {
            let a = concatenate(&arrays, 0)?;
            // Materialize now: a lazy op would belong to this thread's stream, and the model
            // may run on another thread (the engine's driver).
            a.eval()?;
            Ok(a)
        };
        // A sharded-to-all layer all-sums its output across ranks: never stacked.
        if parts.iter().any(|l| matches!(l, Linear::ShardedToAll { .. })) {
            return Ok(Err(parts));
        }
        let bias = |l: &Linear| match l {
            Linear::Dense { bias, .. } | Linear::Quantized { bias, .. } => bias.clone(),
            Linear::ShardedToAll { .. } => None,
        };
        let biases: Vec<Option<Array>> = parts.iter().map(bias).collect();
        if parts.len() < 2 || !(biases.iter().all(Option::is_some) || biases.iter().all(Option::is_none)) {
            return Ok(Err(parts));
        }
        let fused_bias = match biases.iter().map(|b| b.as_ref()).collect::<Option<Vec<_>>>() {
            Some(b) => Some(cat(b)?),
            None => None,
        };
        match &parts[0] {
            Linear::Dense { weight: w0, .. } => {
                let weights: Option<Vec<&Array>> = parts
                    .iter()
                    .map(|l| match l {
                        Linear::Dense { weight, .. } if weight.dtype() == w0.dtype() && weight.dim(-1) == w0.dim(-1) => Some(weight),
                        _ => None,
                    })
                    .collect();
                match weights {
                    Some(weights) => Ok(Ok(Linear::Dense { weight: cat(weights)?, bias: fused_bias })),
                    None => Ok(Err(parts)),
                }
            }
            Linear::Quantized { weight: w0, spec: spec0, path: path0, .. } => {
                let (spec, path) = (*spec0, *path0);
                let triples: Option<Vec<(&Array, &Array, &Array)>> = parts
                    .iter()
                    .map(|l| match l {
                        Linear::Quantized { weight, scales, biases, spec: s, path: p, .. }
                            if *s == spec && *p == path && weight.dim(-1) == w0.dim(-1) =>
                        {
                            Some((weight, scales, biases))
                        }
                        _ => None,
                    })
                    .collect();
                match triples {
                    Some(t) => Ok(Ok(Linear::Quantized {
                        weight: cat(t.iter().map(|x| x.0).collect())?,
                        scales: cat(t.iter().map(|x| x.1).collect())?,
                        biases: cat(t.iter().map(|x| x.2).collect())?,
                        bias: fused_bias,
                        spec,
                        path,
                    })),
                    None => Ok(Err(parts)),
                }
            }
            Linear::ShardedToAll { .. } => Ok(Err(parts)),
        }
    }

    pub fn load(w: &mut Weights, prefix: &str, in_dim: i32, out_dim: i32, bias: bool) -> Result<Self> {
        let bias = if bias {
            Some(w.take(&format!("{prefix}.bias"), &[out_dim])?)
        } else {
            None
        };
        Ok(match w.quant_spec(prefix)? {
            Some(spec) => {
                let (weight, scales, biases) = w.take_quantized(prefix, out_dim, in_dim, spec)?;
                Linear::Quantized { weight, scales, biases, bias, spec, path: w.options().qmm_path() }
            }
            None => {
                Linear::Dense { weight: w.take(&format!("{prefix}.weight"), &[out_dim, in_dim])?, bias }
            }
        })
    }

    /// `self.forward(swiglu(gate, up))` for `gate_up` holding the gate then the up half (a fused
    /// gate/up projection's output) as one op, on the fast CPU path without a bias; `None`
    /// elsewhere (the caller applies the activation itself).
    pub fn forward_swiglu(&self, gate_up: &Array) -> Result<Option<Array>> {
        Ok(match self {
            Linear::Quantized { weight, scales, biases, bias: None, spec, path: QmmPath::WeftCpu(act) } => {
                Some(kernels::swiglu_quantized_matmul_with(gate_up, weight, scales, biases, spec.group_size, spec.bits, *act)?)
            }
            _ => None,
        })
    }

    pub fn forward(&self, x: &Array) -> Result<Array> {
        Ok(match self {
            Linear::Dense { weight, bias: None } => x.matmul(weight.t())?,
            Linear::Dense { weight, bias: Some(b) } => addmm(b, x, weight.t(), None, None)?,
            Linear::Quantized { weight, scales, biases, bias, spec, path } => {
                let y = qmm(x, weight, scales, biases, *spec, *path)?;
                match bias {
                    Some(b) => y.add(b)?,
                    None => y,
                }
            }
            Linear::ShardedToAll { part, bias, group } => super::tensor_parallel::sharded_to_all(part, bias.as_ref(), group, x)?,
        })
    }
}

/// Token embedding table; `as_linear` is the tied output projection.
pub enum Embedding {
    Dense { weight: Array },
    Quantized { weight: Array, scales: Array, biases: Array, spec: QuantSpec, path: QmmPath },
}

impl Embedding {
    pub fn load(w: &mut Weights, prefix: &str, vocab: i32, dim: i32) -> Result<Self> {
        Ok(match w.quant_spec(prefix)? {
            Some(spec) => {
                let (weight, scales, biases) = w.take_quantized(prefix, vocab, dim, spec)?;
                Embedding::Quantized { weight, scales, biases, spec, path: w.options().qmm_path() }
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
            Embedding::Quantized { weight, scales, biases, spec, path } => {
                qmm(x, weight, scales, biases, *spec, *path)?
            }
        })
    }
}

/// `mx.fast.rms_norm` with a learned scale; in fast mode on the CPU Weft's one-op primitive
/// ([`kernels::rms_norm`]) instead of MLX's fallback graph.
pub struct RmsNorm {
    pub weight: Array,
    pub eps: f32,
    fast: bool,
}

impl RmsNorm {
    pub fn load(w: &mut Weights, prefix: &str, dim: i32, eps: f32) -> Result<Self> {
        Ok(RmsNorm { weight: w.take(&format!("{prefix}.weight"), &[dim])?, eps, fast: w.options().fast_on_cpu() })
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
        Ok(RmsNorm { weight, eps, fast: w.options().fast_on_cpu() })
    }

    /// Whether this norm runs Weft's CPU primitive (fast mode on the CPU).
    pub fn is_fast(&self) -> bool {
        self.fast
    }

    /// `h = x + residual` and this norm of `h`: Weft's one primitive in fast mode on the CPU,
    /// MLX's add and [`RmsNorm::forward`] otherwise (the same ops as calling them in turn).
    pub fn forward_after_add(&self, x: &Array, residual: &Array) -> Result<(Array, Array)> {
        if self.fast {
            return kernels::add_rms_norm(x, residual, &self.weight, self.eps);
        }
        let h = x.add(residual)?;
        let normed = self.forward(&h)?;
        Ok((h, normed))
    }

    pub fn forward(&self, x: &Array) -> Result<Array> {
        if self.fast {
            return kernels::rms_norm(x, &self.weight, self.eps);
        }
        Ok(mlx_rs::fast::rms_norm(x, Some(&self.weight), self.eps)?)
    }
}
