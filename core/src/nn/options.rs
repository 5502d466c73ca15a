//! How the layers of one model compute, decided once when the model loads and carried by
//! [`Weights`](super::Weights) to every layer constructor (as candle's `VarBuilder` carries the
//! device and dtype). Two models loaded in one process with different options keep them: no
//! layer reads a global, a thread-local or the environment.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::{GatedDeltaKernel, QmmPath};
use crate::distributed::Group;
use crate::kernels::{CpuActivations, CpuKernels};
use crate::{Error, Result};

/// Rows from which a GPU layer dequantizes by default (batched decode stays below it).
pub const GPU_DEQUANTIZE_ROWS: i32 = 512;

/// A model split over the ranks of a group while it loads.
#[derive(Debug, Clone)]
pub enum Parallel {
    /// Every layer sharded over the group ([`super::tensor_parallel`]).
    Tensor(Group),
    /// This rank holds its pipeline stage's layers ([`super::pipeline`]).
    Pipeline(Group),
}

/// The resolved per-model layer options (the device-dependent defaults applied).
#[derive(Debug, Clone)]
pub struct LayerOptions {
    cpu_kernels: CpuKernels,
    /// The fast CPU kernel's activations below 16 rows ([`CpuActivations`]).
    cpu_activations: CpuActivations,
    gpu: bool,
    /// Rows of input from which quantized layers dequantize and multiply densely (0 = never).
    dequantize_rows: i32,
    fuse_projections: bool,
    gated_delta: GatedDeltaKernel,
    /// Elementwise chains (SwiGLU, GeGLU) run as MLX-compiled fused kernels
    /// ([`super::compiled`]).
    compile: bool,
    /// Few-row quantized matmuls (decode) by Weft's CUDA kernel ([`super::cuda_qmv`]).
    cuda_qmv: bool,
    parallel: Option<Parallel>,
    /// Set when an architecture's loader took `parallel`: a load no loader split is refused
    /// rather than silently left whole.
    parallel_taken: Arc<AtomicBool>,
}

impl Default for LayerOptions {
    /// Fast kernels, the device's defaults, no split.
    fn default() -> Self {
        LayerOptions::new(CpuKernels::Fast, None, None, None)
            .expect("the defaults are valid on every device")
    }
}

/// The gated delta recurrence by device: MLX's fused op where it has a kernel (Metal: a GPU on
/// macOS), Weft's CUDA kernel on MLX's CUDA backend (a GPU elsewhere), Weft's CPU primitive in
/// the fast CPU mode, mlx-lm's ops path in the exact mode.
fn default_gated_delta(gpu: bool, cpu_kernels: CpuKernels) -> GatedDeltaKernel {
    if gpu && cfg!(target_os = "macos") {
        GatedDeltaKernel::Fused
    } else if gpu {
        GatedDeltaKernel::Cuda
    } else if cpu_kernels == CpuKernels::Fast {
        GatedDeltaKernel::Cpu
    } else {
        GatedDeltaKernel::Ops
    }
}

impl LayerOptions {
    /// Resolves the options for MLX's current default device. `dequantize_rows`: `None` is
    /// [`GPU_DEQUANTIZE_ROWS`] on a GPU and never on the CPU, `Some(0)` never. `fuse_projections`:
    /// `None` fuses q/k/v and gate/up only with the fast kernels on the CPU (fused dense matmuls
    /// are not bit-equal to separate ones, so exact mode keeps them apart); forcing it on on a
    /// GPU is refused (on MLX 0.32's CUDA backend fused quantized projections gave wrong logits
    /// and an illegal memory access; see docs/benchmarks.md).
    pub fn new(
        cpu_kernels: CpuKernels,
        dequantize_rows: Option<i32>,
        fuse_projections: Option<bool>,
        parallel: Option<Parallel>,
    ) -> Result<Self> {
        let gpu = crate::default_device() == "gpu";
        let dequantize_rows = match dequantize_rows {
            Some(rows) if rows < 0 => {
                return Err(Error::Unsupported(format!(
                    "dequantize rows {rows}: expected a row count (0 = never)"
                )))
            }
            Some(rows) => rows,
            None if gpu => GPU_DEQUANTIZE_ROWS,
            None => 0,
        };
        let fuse_projections = match fuse_projections {
            Some(true) if gpu => {
                return Err(Error::Unsupported(
                    "projection fusion is CPU-only (on MLX's CUDA backend fused quantized projections computed wrong \
                     results; see docs/benchmarks.md)"
                        .into(),
                ))
            }
            Some(on) => on,
            None => !gpu && cpu_kernels == CpuKernels::Fast,
        };
        Ok(LayerOptions {
            cpu_kernels,
            cpu_activations: CpuActivations::default(),
            gpu,
            dequantize_rows,
            fuse_projections,
            gated_delta: default_gated_delta(gpu, cpu_kernels),
            compile: gpu,
            cuda_qmv: gpu && !cfg!(target_os = "macos"),
            parallel,
            parallel_taken: Arc::default(),
        })
    }

    /// These options with the gated delta recurrence's implementation `kernel` (`None`: the
    /// device's default). The CUDA kernel is refused on other devices.
    pub fn with_gated_delta(mut self, kernel: Option<GatedDeltaKernel>) -> Result<Self> {
        self.gated_delta = match kernel {
            Some(GatedDeltaKernel::Cuda) if !self.gpu || cfg!(target_os = "macos") => {
                return Err(Error::Unsupported(
                    "the gated delta CUDA kernel needs MLX's CUDA backend (a GPU on Linux)".into(),
                ))
            }
            Some(GatedDeltaKernel::Cpu) if self.gpu => {
                return Err(Error::Unsupported("the gated delta CPU kernel runs on the CPU only".into()))
            }
            Some(k) => k,
            None => default_gated_delta(self.gpu, self.cpu_kernels),
        };
        Ok(self)
    }

    /// These options with the fast CPU kernel's activations `act` (`None`: the default,
    /// [`CpuActivations::default`]). Only the fast kernels on the CPU read them.
    pub fn with_cpu_activations(mut self, act: Option<CpuActivations>) -> Self {
        self.cpu_activations = act.unwrap_or_default();
        self
    }

    /// How gated DeltaNet layers run their recurrence.
    pub fn gated_delta(&self) -> GatedDeltaKernel {
        self.gated_delta
    }

    /// These options with compiled elementwise chains on or off; `None` is the device's
    /// default: on on a GPU, off on the CPU, where MLX builds compiled kernels at run time with
    /// the system's C++ compiler, which a user's machine may lack.
    pub fn with_compile(mut self, compile: Option<bool>) -> Self {
        self.compile = compile.unwrap_or(self.gpu);
        self
    }

    /// These options with Weft's few-row CUDA quantized matmul on or off; `None` is the
    /// device's default (on on MLX's CUDA backend). Refused where there is no CUDA backend.
    pub fn with_cuda_qmv(mut self, on: Option<bool>) -> Result<Self> {
        let cuda = self.gpu && !cfg!(target_os = "macos");
        self.cuda_qmv = match on {
            Some(true) if !cuda => {
                return Err(Error::Unsupported(
                    "the quantized matmul CUDA kernel needs MLX's CUDA backend (a GPU on Linux)".into(),
                ))
            }
            Some(on) => on,
            None => cuda,
        };
        Ok(self)
    }

    /// Whether elementwise chains run compiled ([`super::compiled`]).
    pub fn compile(&self) -> bool {
        self.compile
    }

    pub fn cpu_kernels(&self) -> CpuKernels {
        self.cpu_kernels
    }

    /// What in these options changes the numbers a layer computes (kernels, device, fused
    /// projections, dequantize rows): saved prompt-cache entries are only reused under the same.
    pub fn numerics(&self) -> String {
        // The activations quantized layers compute with: float outside Weft's CPU kernel (exact
        // mode keeps its identity whatever the setting, or its default, is).
        let act = match self.qmm_path() {
            QmmPath::WeftCpu(a) => a,
            _ => CpuActivations::Float,
        };
        format!(
            "{:?} act={} gpu={} fuse={} dequantize_rows={} gated_delta={} compile={} cuda_qmv={}",
            self.cpu_kernels,
            act.as_str(),
            self.gpu,
            self.fuse_projections,
            self.dequantize_rows,
            self.gated_delta.as_str(),
            self.compile,
            self.cuda_qmv
        )
    }

    /// Whether Weft's CPU primitives (RMSNorm, RoPE, attention) replace MLX's ops: fast mode
    /// on the CPU.
    pub fn fast_on_cpu(&self) -> bool {
        !self.gpu && self.cpu_kernels == CpuKernels::Fast
    }

    /// The path a quantized layer takes: the fast CPU kernel when it is selected and MLX
    /// computes on the CPU; on a GPU MLX's kernel over rows flattened; either switching to
    /// dequantize + matmul from the dequantize row count.
    pub fn qmm_path(&self) -> QmmPath {
        if self.cuda_qmv {
            QmmPath::WeftCuda {
                max_rows: super::cuda_qmv::DEFAULT_MAX_ROWS,
                dequantize_rows: self.dequantize_rows,
            }
        } else if self.dequantize_rows > 0 {
            QmmPath::DequantizeFrom {
                rows: self.dequantize_rows,
            }
        } else if self.gpu {
            QmmPath::MlxFlat
        } else if self.cpu_kernels == CpuKernels::Fast {
            QmmPath::WeftCpu(self.cpu_activations)
        } else {
            QmmPath::Mlx
        }
    }

    /// Whether quantized layers may keep float16 scales and biases: only Weft's CPU kernel
    /// reads them at full speed (and exactly: it widens them to float32); MLX's CPU kernel is
    /// far slower with them, and the dequantize path would round `s * q + b` in float16.
    pub fn keeps_half_scales(&self) -> bool {
        matches!(self.qmm_path(), QmmPath::WeftCpu(_))
    }

    /// Whether layers fuse the projections that read one input (q/k/v, gate/up) into one matmul.
    pub fn fuse_projections(&self) -> bool {
        self.fuse_projections
    }

    /// The group to shard every layer over, if the model is loaded tensor-parallel; marks the
    /// split taken (called by the loaders of architectures that shard).
    pub(crate) fn take_tensor_group(&self) -> Option<Group> {
        match &self.parallel {
            Some(Parallel::Tensor(g)) => {
                self.parallel_taken.store(true, Ordering::Relaxed);
                Some(g.clone())
            }
            _ => None,
        }
    }

    /// The group this rank is a pipeline stage of, if any; marks the split taken.
    pub(crate) fn take_pipeline_group(&self) -> Option<Group> {
        match &self.parallel {
            Some(Parallel::Pipeline(g)) => {
                self.parallel_taken.store(true, Ordering::Relaxed);
                Some(g.clone())
            }
            _ => None,
        }
    }

    /// After a model was built: an error if a split was asked for and no loader took it.
    pub(crate) fn check_parallel_taken(&self) -> Result<()> {
        match &self.parallel {
            Some(_) if self.parallel_taken.load(Ordering::Relaxed) => Ok(()),
            Some(Parallel::Tensor(_)) => Err(Error::Unsupported(format!(
                "tensor parallel: this architecture has no sharding (supported: {})",
                super::tensor_parallel::SHARDED_TYPES.join(", ")
            ))),
            Some(Parallel::Pipeline(_)) => Err(Error::Unsupported(format!(
                "pipeline parallel: this architecture has no pipeline split (supported: {})",
                super::pipeline::PIPELINED_TYPES.join(", ")
            ))),
            None => Ok(()),
        }
    }
}
