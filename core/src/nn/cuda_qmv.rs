//! Weft's CUDA kernel for an affine-quantized matmul with few rows of x (`kernels/qmv_cuda.h`):
//! a decode step's projections on MLX's CUDA backend, where MLX's own kernel streams the
//! weights at about a quarter of the memory roof (benches/gpu/qmv_roof.py).

use mlx_rs::{Array, Dtype};

use super::weights::QuantSpec;
use crate::{Error, Result};

/// Most rows of x (all leading dimensions together) the kernel takes.
pub const MAX_ROWS: i32 = mlx_sys::WEFT_QMV_MAX_ROWS as i32;

/// Rows of x up to which a layer's decode matmul takes the kernel by default: one. From two rows
/// on MLX's kernel reads each weight once for all rows and this one does not (0.2-0.4x at 8
/// rows on an H100; benches/gpu/qmv_check.py).
pub const DEFAULT_MAX_ROWS: i32 = 1;

/// Whether the kernel is faster than MLX's for an `[n, k]` weight: measured on an H100 at one
/// row, 1.1-2.3x on the Llama-8B shape's matrices (k 4096 or 14336 with n from 4096) and its
/// LM head, 0.5-0.8x on smaller ones (k 2048 and below, or n 1024), where a launch's fixed
/// cost (~20 us through MLX's custom-kernel path vs ~8 us for its own kernel) dominates.
pub fn worth_it(n: i32, k: i32) -> bool {
    (n >= 4096 && k >= 4096) || (n as i64 * k as i64) >= 64 << 20
}

/// Whether the kernel computes `x @ w^T` for this layer: 4- or 8-bit codes in whole 16-byte
/// chunks per lane, each chunk inside one group, a float x of at most [`MAX_ROWS`] rows.
pub fn supports(x: &Array, spec: QuantSpec, max_rows: i32) -> bool {
    let k = x.dim(-1);
    if k <= 0 || !matches!(spec.bits, 4 | 8) || !matches!(x.dtype(), Dtype::Float32 | Dtype::Float16 | Dtype::Bfloat16) {
        return false;
    }
    let rows = x.size() as i64 / k as i64;
    let chunk = 4 * (32 / spec.bits);
    rows >= 1 && rows <= max_rows.min(MAX_ROWS) as i64 && k % chunk == 0 && spec.group_size % chunk == 0 && k % spec.group_size == 0
}

/// `x @ w^T` by the kernel (compiled by MLX at evaluation); `x [..., K]` → `[..., N]`.
pub fn quantized_matmul(x: &Array, w: &Array, scales: &Array, biases: &Array, spec: QuantSpec) -> Result<Array> {
    let stream = mlx_rs::Stream::thread_local_or_default();
    unsafe {
        let mut y = mlx_sys::mlx_array_new();
        let status = mlx_sys::weft_qmv_cuda(
            &mut y,
            x.as_ptr(),
            w.as_ptr(),
            scales.as_ptr(),
            biases.as_ptr(),
            spec.group_size,
            spec.bits,
            0,
            stream.as_ptr(),
        );
        if status != 0 {
            mlx_sys::mlx_array_free(y);
            let msg = std::ffi::CStr::from_ptr(mlx_sys::weft_qmv_last_error()).to_string_lossy().into_owned();
            return Err(Error::Mlx(format!("quantized matmul CUDA kernel: {msg}")));
        }
        Ok(Array::from_ptr(y))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::CpuKernels;
    use crate::nn::{LayerOptions, QmmPath};

    fn q4() -> QuantSpec {
        QuantSpec { group_size: 64, bits: 4 }
    }

    #[test]
    fn supports_decode_shapes_only() {
        let x = |rows: i32, k: i32, dtype: Dtype| Array::zeros::<f32>(&[rows, 1, k]).unwrap().as_dtype(dtype).unwrap();
        assert!(supports(&x(1, 4096, Dtype::Bfloat16), q4(), MAX_ROWS));
        assert!(supports(&x(8, 576, Dtype::Float32), QuantSpec { group_size: 32, bits: 4 }, MAX_ROWS));
        assert!(supports(&x(2, 1536, Dtype::Float16), QuantSpec { group_size: 64, bits: 8 }, MAX_ROWS));
        // Too many rows (a prefill chunk), or fewer allowed by the path.
        assert!(!supports(&x(9, 4096, Dtype::Bfloat16), q4(), MAX_ROWS));
        assert!(!supports(&x(4, 4096, Dtype::Bfloat16), q4(), 2));
        // K not whole 16-byte chunks; groups smaller than a chunk; other widths and dtypes.
        assert!(!supports(&x(1, 48, Dtype::Bfloat16), QuantSpec { group_size: 16, bits: 4 }, MAX_ROWS));
        assert!(!supports(&x(1, 4096, Dtype::Bfloat16), QuantSpec { group_size: 16, bits: 4 }, MAX_ROWS));
        assert!(!supports(&x(1, 4096, Dtype::Bfloat16), QuantSpec { group_size: 64, bits: 5 }, MAX_ROWS));
        assert!(!supports(&x(1, 4096, Dtype::Int32), q4(), MAX_ROWS));
    }

    #[test]
    fn only_large_matrices_are_worth_it() {
        // Llama-8B's projections and LM head, not its k/v nor the 1B's or SmolLM2's matrices.
        assert!(worth_it(4096, 4096) && worth_it(14336, 4096) && worth_it(4096, 14336) && worth_it(128256, 4096));
        assert!(!worth_it(1024, 4096) && !worth_it(8192, 2048) && !worth_it(2048, 8192) && !worth_it(576, 576));
        assert!(worth_it(128256, 2048));
    }

    #[test]
    fn refused_off_cuda_with_a_clear_error() {
        // This machine computes on MLX's CPU backend: the kernel is never chosen by default, asking
        // for it is refused when the model loads, and a direct call says why instead of crashing.
        let cpu = LayerOptions::new(CpuKernels::Fast, None, None, None).unwrap();
        assert_ne!(crate::default_device(), "gpu");
        assert!(!matches!(cpu.qmm_path(), QmmPath::WeftCuda { .. }));
        let err = LayerOptions::new(CpuKernels::Fast, None, None, None).unwrap().with_cuda_qmv(Some(true)).unwrap_err();
        assert!(err.to_string().contains("CUDA backend"), "{err}");
        assert!(cpu.clone().with_cuda_qmv(Some(false)).is_ok());

        let x = Array::zeros::<f32>(&[1, 64]).unwrap();
        let (w, s, b) = {
            let wf = Array::zeros::<f32>(&[32, 64]).unwrap();
            let q = mlx_rs::ops::quantize(&wf, 64, 4).unwrap();
            (q.0, q.1, q.2)
        };
        let err = quantized_matmul(&x, &w, &s, &b, q4()).unwrap_err();
        assert!(err.to_string().contains("not a GPU stream"), "{err}");
    }
}
