//! CPU kernel selection: Weft's quantized matmul (a custom MLX primitive in
//! `core/mlx-sys/kernels`: SIMD, multi-threaded) or MLX's own kernels.
//!
//! - [`CpuKernels::Fast`] (the default): quantized linear layers and mixture-of-experts
//!   projections on a CPU stream run Weft's primitives. Its float32 sums are ordered differently from MLX's, so logits differ in the
//!   last bits; `tests/cpu_kernels.rs` bounds the KL divergence against exact mode.
//! - [`CpuKernels::Exact`]: MLX's kernels everywhere, bit-for-bit what mlx-lm computes (the
//!   parity goldens run in this mode).
//!
//! The mode is a load option (`loading::LoadOptions::cpu_kernels`, the engine option
//! `cpu_kernels` of the contract, the CLI's `--cpu-kernels`) kept by the model's layers, so two
//! models in one process may differ and a model stays in its mode on whatever thread runs it.
//! GPU streams always use MLX's kernels.

use std::ffi::CStr;

use mlx_rs::{Array, Stream};

use crate::{Error, Result};

/// Which quantized-matmul kernel CPU layers use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CpuKernels {
    /// MLX's own kernels (matches mlx-lm exactly).
    Exact,
    /// Weft's SIMD multi-threaded quantized matmul.
    #[default]
    Fast,
}

impl CpuKernels {
    pub fn as_str(self) -> &'static str {
        match self {
            CpuKernels::Exact => "exact",
            CpuKernels::Fast => "fast",
        }
    }
}

impl std::str::FromStr for CpuKernels {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "exact" => Ok(CpuKernels::Exact),
            "fast" => Ok(CpuKernels::Fast),
            other => Err(Error::Unsupported(format!(
                "CPU kernels {other:?}: expected \"exact\" or \"fast\""
            ))),
        }
    }
}

/// What fast mode's quantized matmul multiplies the weights with below 16 rows of x (decode,
/// batched decode, speculation's verify steps), on 4- and 8-bit weights.
/// The default is int8: its next-token KL against exact mode is llama.cpp's own on the same
/// GGUF (docs/benchmarks.md, `benches/int8_kl.py`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CpuActivations {
    /// x as float32: every code converted to float and multiplied (next-token KL against exact
    /// mode ~1e-10: the same sums in another order).
    Float,
    /// x quantized to int8 per block of 32 (one float scale per block), multiplied with the
    /// codes in integer arithmetic, as llama.cpp's q8 activations: ~1.3-2x faster per row, at
    /// the cost of the activations' rounding (next-token KL ~4e-3 nats against exact mode, as
    /// llama.cpp's; `tests/cpu_kernels.rs` gates both). Prefill (from 16 rows) and 5-bit
    /// weights keep float activations.
    #[default]
    Int8,
}

impl CpuActivations {
    pub fn as_str(self) -> &'static str {
        match self {
            CpuActivations::Float => "float",
            CpuActivations::Int8 => "int8",
        }
    }
}

impl std::str::FromStr for CpuActivations {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "float" => Ok(CpuActivations::Float),
            "int8" => Ok(CpuActivations::Int8),
            other => Err(Error::Unsupported(format!(
                "CPU activations {other:?}: expected \"float\" or \"int8\""
            ))),
        }
    }
}

/// `x @ w^T` for an affine-quantized `w`, as `mlx_rs::ops::quantized_matmul(.., transpose=true)`,
/// through Weft's primitive on CPU streams (MLX's op elsewhere and for shapes it doesn't cover),
/// with float32 activations ([`quantized_matmul_with`] chooses).
pub fn quantized_matmul(
    x: &Array,
    w: &Array,
    scales: &Array,
    biases: &Array,
    group_size: i32,
    bits: i32,
) -> Result<Array> {
    quantized_matmul_with(x, w, scales, biases, group_size, bits, CpuActivations::Float)
}

/// [`quantized_matmul`] with the activations `act`.
pub fn quantized_matmul_with(
    x: &Array,
    w: &Array,
    scales: &Array,
    biases: &Array,
    group_size: i32,
    bits: i32,
    act: CpuActivations,
) -> Result<Array> {
    call_qmm(mlx_sys::weft_quantized_matmul, "quantized_matmul", x, w, scales, biases, group_size, bits, act)
}

/// The C signature the quantized-matmul entry points share (`weft_kernels.h`).
type QmmEntry = unsafe extern "C" fn(
    *mut mlx_sys::mlx_array,
    mlx_sys::mlx_array,
    mlx_sys::mlx_array,
    mlx_sys::mlx_array,
    mlx_sys::mlx_array,
    std::os::raw::c_int,
    std::os::raw::c_int,
    std::os::raw::c_int,
    mlx_sys::mlx_stream,
) -> std::os::raw::c_int;

#[allow(clippy::too_many_arguments)]
fn call_qmm(entry: QmmEntry, what: &str, x: &Array, w: &Array, scales: &Array, biases: &Array, group_size: i32, bits: i32, act: CpuActivations) -> Result<Array> {
    let stream = Stream::thread_local_or_default();
    let int8 = (act == CpuActivations::Int8) as i32;
    unsafe {
        let mut res = mlx_sys::mlx_array_new();
        let status = entry(&mut res, x.as_ptr(), w.as_ptr(), scales.as_ptr(), biases.as_ptr(), group_size, bits, int8, stream.as_ptr());
        take_result(res, status, what)
    }
}

/// [`quantized_matmul`] of `silu(gate) * up` for `gate_up` `[..., 2K]` holding the gate then the
/// up half: the activation is applied as the kernel reads its input (one op instead of a split,
/// a sigmoid and two products). Float32 on CPU streams; MLX's ops otherwise.
pub fn swiglu_quantized_matmul(
    gate_up: &Array,
    w: &Array,
    scales: &Array,
    biases: &Array,
    group_size: i32,
    bits: i32,
) -> Result<Array> {
    swiglu_quantized_matmul_with(gate_up, w, scales, biases, group_size, bits, CpuActivations::Float)
}

/// [`swiglu_quantized_matmul`] with the activations `act` (the int8 kernel quantizes
/// `silu(gate) * up`).
pub fn swiglu_quantized_matmul_with(
    gate_up: &Array,
    w: &Array,
    scales: &Array,
    biases: &Array,
    group_size: i32,
    bits: i32,
    act: CpuActivations,
) -> Result<Array> {
    call_qmm(mlx_sys::weft_swiglu_quantized_matmul, "swiglu_quantized_matmul", gate_up, w, scales, biases, group_size, bits, act)
}

/// `gather_qmm(x, w, scales, biases, rhs_indices = indices, transpose = true)` for the stacked
/// experts of a mixture-of-experts layer (`w` `[E, N, K * bits / 32]`, `indices` expert ids
/// whose shape broadcasts against `x`'s batch dimensions), through Weft's primitive on CPU
/// streams (MLX's op elsewhere and for shapes it doesn't cover). Whether the pairs are sorted
/// by expert needs no flag: runs of one expert are found either way.
pub fn gather_qmm(
    x: &Array,
    w: &Array,
    scales: &Array,
    biases: &Array,
    indices: &Array,
    group_size: i32,
    bits: i32,
) -> Result<Array> {
    let stream = Stream::thread_local_or_default();
    unsafe {
        let mut res = mlx_sys::mlx_array_new();
        let status = mlx_sys::weft_gather_qmm(
            &mut res,
            x.as_ptr(),
            w.as_ptr(),
            scales.as_ptr(),
            biases.as_ptr(),
            indices.as_ptr(),
            group_size,
            bits,
            stream.as_ptr(),
        );
        take_result(res, status, "gather_qmm")
    }
}

/// `(x + residual, rms_norm(x + residual, weight, eps))`: a decoder layer's residual add and the
/// next norm as one primitive with two outputs for float32 `x` on CPU streams, bit for bit
/// MLX's add followed by [`rms_norm`] (one op fewer); MLX's ops otherwise.
pub fn add_rms_norm(x: &Array, residual: &Array, weight: &Array, eps: f32) -> Result<(Array, Array)> {
    let stream = Stream::thread_local_or_default();
    unsafe {
        let mut sum = mlx_sys::mlx_array_new();
        let mut res = mlx_sys::mlx_array_new();
        let status = mlx_sys::weft_add_rms_norm(&mut sum, &mut res, x.as_ptr(), residual.as_ptr(), weight.as_ptr(), eps, stream.as_ptr());
        let sum = take_result_with(sum, status, "add_rms_norm", mlx_sys::weft_row_ops_last_error)?;
        Ok((sum, take_result_with(res, status, "add_rms_norm", mlx_sys::weft_row_ops_last_error)?))
    }
}

/// `x - logsumexp(x, -1, keepdims)`, the log-probabilities the samplers take: one primitive
/// with a vectorized exp for float32 `x` on CPU streams (MLX's logsumexp there computes a
/// scalar exp per element), MLX's ops otherwise. exp and the sum round differently from
/// MLX's: fast mode only.
pub fn log_softmax(x: &Array) -> Result<Array> {
    let stream = Stream::thread_local_or_default();
    unsafe {
        let mut res = mlx_sys::mlx_array_new();
        let status = mlx_sys::weft_log_softmax(&mut res, x.as_ptr(), stream.as_ptr());
        take_result_with(res, status, "log_softmax", mlx_sys::weft_row_ops_last_error)
    }
}

/// `mlx fast::rms_norm(x, weight, eps)`: one primitive for float32 `x` on CPU streams (MLX runs
/// its fallback graph of ~6 ops there), MLX's op otherwise. Sums in another order than MLX's:
/// fast mode only.
pub fn rms_norm(x: &Array, weight: &Array, eps: f32) -> Result<Array> {
    let stream = Stream::thread_local_or_default();
    unsafe {
        let mut res = mlx_sys::mlx_array_new();
        let status = mlx_sys::weft_rms_norm(&mut res, x.as_ptr(), weight.as_ptr(), eps, stream.as_ptr());
        take_result_with(res, status, "rms_norm", mlx_sys::weft_row_ops_last_error)
    }
}

/// `mlx fast::rope(x, dims, traditional, base, scale, offset, freqs)`, with `offset` an int32
/// scalar or one offset per index of `x`'s first axis: one primitive for float32 `x` on CPU
/// streams (MLX's fallback there is ~20 ops), MLX's op otherwise. cos / sin and the products are
/// rounded differently from MLX's: fast mode only.
pub fn rope(
    x: &Array,
    dims: i32,
    traditional: bool,
    base: Option<f32>,
    scale: f32,
    offset: &Array,
    freqs: Option<&Array>,
) -> Result<Array> {
    let stream = Stream::thread_local_or_default();
    unsafe {
        let none = mlx_sys::mlx_array_new();
        let mut res = mlx_sys::mlx_array_new();
        let status = mlx_sys::weft_rope(
            &mut res,
            x.as_ptr(),
            dims,
            traditional as i32,
            base.unwrap_or(f32::NAN),
            scale,
            offset.as_ptr(),
            freqs.map_or(none, |f| f.as_ptr()),
            stream.as_ptr(),
        );
        take_result_with(res, status, "rope", mlx_sys::weft_row_ops_last_error)
    }
}

/// What the fused attention kernels (MLX's and [`sdpa`]) mask with; the caches make them
/// (`cache::AttentionCache::make_mask`).
#[derive(Debug, Clone)]
pub enum AttentionMask {
    /// A single query position sees every cached key.
    None,
    /// Square causal mask handled inside the kernel.
    Causal,
    /// Explicit boolean mask broadcastable to `[B, 1, L, S]` (true = attend).
    Array(Array),
}

/// `mlx fast::scaled_dot_product_attention(q, k, v, scale, mask)`: one primitive for float32
/// q `[B, Hq, Lq, D]`, k / v `[B, Hkv, Lk, D]` (any strides) on CPU streams, with no mask, the
/// causal mask (`Lq <= Lk`) or a boolean / additive array mask (broadcast to `[B, Hq, Lq, Lk]`);
/// MLX's op otherwise (other dtypes, GPU streams). Online softmax over key blocks with its own
/// vectorized exp, so the last bits differ from MLX's: fast mode only.
pub fn sdpa(q: &Array, k: &Array, v: &Array, scale: f32, mask: &AttentionMask) -> Result<Array> {
    let stream = Stream::thread_local_or_default();
    let (mode, array): (&CStr, Option<&Array>) = match mask {
        AttentionMask::None => (c"", None),
        AttentionMask::Causal => (c"causal", None),
        AttentionMask::Array(m) => (c"array", Some(m)),
    };
    unsafe {
        let none = mlx_sys::mlx_array_new();
        let mut res = mlx_sys::mlx_array_new();
        let status = mlx_sys::weft_sdpa(
            &mut res,
            q.as_ptr(),
            k.as_ptr(),
            v.as_ptr(),
            scale,
            mode.as_ptr(),
            array.map_or(none, |m| m.as_ptr()),
            stream.as_ptr(),
        );
        take_result_with(res, status, "sdpa", mlx_sys::weft_sdpa_last_error)
    }
}

/// The instruction set [`sdpa`]'s kernel uses: "avx512", "avx2" or "generic" (under the
/// [`limit_isa`] cap, which it shares with the quantized matmul).
pub fn sdpa_isa() -> &'static str {
    unsafe { CStr::from_ptr(mlx_sys::weft_sdpa_isa()).to_str().unwrap_or("?") }
}

/// The array a primitive call returned, or the kernels' last error when `status` says it failed
/// (the unused result handle is freed).
///
/// # Safety
/// `res` must be the handle the call wrote, `status` that call's return value.
unsafe fn take_result(res: mlx_sys::mlx_array, status: i32, what: &str) -> Result<Array> {
    take_result_with(res, status, what, mlx_sys::weft_kernels_last_error)
}

/// [`take_result`] with the error message of the C file that made the call.
///
/// # Safety
/// As [`take_result`].
unsafe fn take_result_with(
    res: mlx_sys::mlx_array,
    status: i32,
    what: &str,
    last_error: unsafe extern "C" fn() -> *const std::os::raw::c_char,
) -> Result<Array> {
    if status != 0 {
        mlx_sys::mlx_array_free(res);
        let msg = CStr::from_ptr(last_error()).to_string_lossy().into_owned();
        return Err(Error::Mlx(format!("{what}: {msg}")));
    }
    Ok(Array::from_ptr(res))
}

/// The instruction set the fast kernel uses for inner dimension `k` at `bits` (reported by
/// benchmarks and tests): "avx512", "avx2" or "generic", or "avx512 (decode avx2)" where the
/// per-row (decode, fewer than 16 rows) path runs AVX2 (AMD CPUs with AVX-512).
pub fn isa(k: i32, bits: i32) -> &'static str {
    unsafe { CStr::from_ptr(mlx_sys::weft_kernels_isa(k, bits)).to_str().unwrap_or("?") }
}

/// The instruction set of the int8-activation kernel ([`CpuActivations::Int8`]) under the same
/// cap: "avx512vnni-int8", "avx2-int8" or "generic-int8".
pub fn int8_isa() -> &'static str {
    unsafe { CStr::from_ptr(mlx_sys::weft_kernels_int8_isa()).to_str().unwrap_or("?") }
}

/// Caps the fast kernel's instruction set, process-wide: "avx512" (no cap), "avx2" or "generic"
/// (tests and benchmarks compare them; `WEFT_CPU_ISA` sets it at startup).
pub fn limit_isa(isa: &str) -> Result<()> {
    let name = std::ffi::CString::new(isa).map_err(|_| Error::Unsupported(format!("instruction set {isa:?}")))?;
    match unsafe { mlx_sys::weft_kernels_limit_isa(name.as_ptr()) } {
        0 => Ok(()),
        _ => Err(Error::Unsupported(format!("instruction set {isa:?}: expected avx512, avx2 or generic"))),
    }
}

/// Threads in the fast kernel's pool (`WEFT_CPU_THREADS`, else the CPUs this process may use).
pub fn threads() -> usize {
    unsafe { mlx_sys::weft_kernels_threads() as usize }
}
