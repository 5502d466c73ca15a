//! Fast CPU kernels (weft::kernels) against MLX's own.
//!
//! - The primitive against `mlx quantized_matmul` on random shapes: M = 1 and M > 1 (prefill
//!   tiles plus a remainder; from 16 rows the GEMM path with partial tiles and slices), every
//!   bit width / group size / activation dtype, strided x, and inner dimensions that need the
//!   narrower-vector tails (576 = 4.5 AVX-512 blocks at 4 bits);
//!   5-bit codes (MLX's bit stream, fields across word boundaries) on the same shapes.
//! - The gather form (MoE experts) against `mlx gather_qmm`, decode and sorted-prefill shapes.
//! - The attention primitive against `mx.fast.scaled_dot_product_attention`: decode and prefill,
//!   GQA, every mask kind, strided inputs; MLX's op outside its domain.
//! - The row primitives of a decode step: RMSNorm, RoPE, residual add + RMSNorm (bit for bit the
//!   separate ops), and the sampling tail's log-softmax (against MLX's and a float64
//!   reference); the engine's fast tail chooses `generate`'s greedy tokens, alone and batched.
//! - Whole models: the next-token distribution of fast mode against exact mode (KL divergence)
//!   on the tiny quantized models and the default model, and greedy agreement over the goldens'
//!   trajectories (printed; the KL bound is the gate).

mod support;

use mlx_rs::ops::{abs, dequantize, quantize, quantized_matmul};
use mlx_rs::{Array, Dtype};
use support::*;
use weft::generate::{generate, GenerateOptions};
use weft::kernels::{self, CpuKernels};
use weft::loading::LoadOptions;
use weft::loading;

fn random(shape: &[i32], seed: u64) -> Array {
    let key = mlx_rs::random::key(seed).unwrap();
    mlx_rs::random::normal::<f32>(shape, None, None, &key).unwrap()
}

fn to_vec(a: &Array) -> Vec<f32> {
    let a = a.as_dtype(Dtype::Float32).unwrap();
    a.eval().unwrap();
    a.as_slice::<f32>().to_vec()
}

/// Checks the fast kernel on one case against MLX's kernel run in float32 on the same
/// (dtype-rounded) inputs. The two differ by the order of float32 sums, bounded by
/// K * eps32 * sum_k |x_k w_k| (the classic gamma_K bound), plus one rounding of the output to
/// `dtype` (half an ulp: 2^-8 relative for bfloat16, 2^-11 for float16).
fn check(m_shape: &[i32], k: i32, n: i32, bits: i32, group_size: i32, dtype: Dtype, seed: u64) {
    let w = random(&[n, k], seed);
    let (wq, scales, biases) = quantize(&w, group_size, bits).unwrap();
    let mut x_shape = m_shape.to_vec();
    x_shape.push(k);
    let x = random(&x_shape, seed + 1).as_dtype(dtype).unwrap();
    let (scales, biases) = (scales.as_dtype(dtype).unwrap(), biases.as_dtype(dtype).unwrap());
    let fast = kernels::quantized_matmul(&x, &wq, &scales, &biases, group_size, bits).unwrap();
    assert_eq!(fast.shape()[..m_shape.len()], *m_shape);
    assert_eq!(fast.shape()[m_shape.len()], n);
    assert_eq!(fast.dtype(), dtype);
    let f32_ = |a: &Array| a.as_dtype(Dtype::Float32).unwrap();
    let reference =
        quantized_matmul(f32_(&x), &wq, f32_(&scales), &f32_(&biases), true, group_size, bits).unwrap();
    let wd = dequantize(&wq, f32_(&scales), &f32_(&biases), group_size, bits).unwrap();
    let magnitude = abs(f32_(&x)).unwrap().matmul(abs(&wd).unwrap().t()).unwrap();
    let (got, want, mag) = (to_vec(&fast), to_vec(&reference), to_vec(&magnitude));
    let out_rel = match dtype {
        Dtype::Bfloat16 => 1.0 / 256.0,
        Dtype::Float16 => 1.0 / 2048.0,
        _ => 0.0,
    };
    let what = format!("x{x_shape:?} n={n} bits={bits} group={group_size} {dtype:?} ({})", kernels::isa(k, bits));
    let mut worst = 0.0f32;
    for i in 0..got.len() {
        let tol = k as f32 * f32::EPSILON * mag[i] + out_rel * want[i].abs() + 1e-6;
        let err = (got[i] - want[i]).abs();
        assert!(err <= tol, "{what}: element {i}: fast {} vs mlx {} (tolerance {tol})", got[i], want[i]);
        worst = worst.max(err / tol);
    }
    eprintln!("{what}: worst error {worst:.3} of the tolerance");
}

/// The instruction-set cap is process-wide: tests that compare two kernel runs bit for bit hold
/// this lock, so the cap cannot change between their runs.
static ISA_CAP: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn hold_isa() -> std::sync::MutexGuard<'static, ()> {
    ISA_CAP.lock().unwrap_or_else(|e| e.into_inner())
}

/// Every kernel this CPU can run, widest first (the cap is process-wide: one test does this).
#[test]
fn kernel_matches_mlx_quantized_matmul_on_random_shapes() {
    let _cap = hold_isa();
    let mut seen = Vec::new();
    for isa in ["avx512", "avx2", "generic"] {
        kernels::limit_isa(isa).unwrap();
        let got = kernels::isa(1536, 4);
        if seen.contains(&got) {
            continue; // this CPU lacks `isa`; the cap fell through to one already checked
        }
        seen.push(got);
        check_all_shapes();
    }
    kernels::limit_isa("avx512").unwrap();
    assert!(kernels::limit_isa("sse9").is_err());
    eprintln!("kernels checked: {seen:?}");
}

fn check_all_shapes() {
    let mut seed = 10;
    for &bits in &[4, 5, 8] {
        for &group_size in &[32, 64] {
            for &dtype in &[Dtype::Float32, Dtype::Float16, Dtype::Bfloat16] {
                // M = 1 (decode); M = 7 (4 + 2 + 1-row tiles); 2 x 3 rows; M = 15 (8 + 4 + 2 + 1);
                // from GEMM_MIN_ROWS (16) the GEMM path: M = 37 (register tiles of 8 or 6 rows
                // plus remainders), N = 45 (a partial slice), K = 576 over several K chunks;
                // 3 x 7 rows with K = 192. Decode and speculation-verify shapes for the passes of
                // several weight rows: M = 1, 2, 4, 5, 8 with K = 96 or 160 (part of K in the
                // narrower blocks; 128 or 192 with groups of 64) and N = 38 or 39 (a 16-row block
                // ending in 6 or 7 rows: passes of 4, 2 and 1). M = 9: an 8-row tile (AVX2:
                // codes times scale, one vector epilogue) with part of K in 4-lane blocks, then
                // a 1-row tile; M = 8 with K = 1536: past L1 for 8 rows (AVX2: 4-row tiles).
                for (m, k, n) in [
                    (vec![1], 576, 40),
                    (vec![9], 96, 38),
                    (vec![8], 1536, 19),
                    (vec![1], 96, 38),
                    (vec![2], 160, 39),
                    (vec![4], 96, 39),
                    (vec![5], 160, 38),
                    (vec![8], 576, 39),
                    (vec![7], 192, 70),
                    (vec![2, 3], 1536, 19),
                    (vec![15], 256, 33),
                    (vec![37], 576, 45),
                    (vec![3, 7], 192, 70),
                ] {
                    // K = 96 and 160 with groups of 64: 128 and 192.
                    let k = k + k % group_size;
                    check(&m, k, n, bits, group_size, dtype, seed);
                    seed += 2;
                }
            }
        }
    }
}

/// The gather form (mixture-of-experts projections) against `mlx gather_qmm` on the same
/// stacked experts: decode's shape (x `[B, L, 1, 1, K]` broadcast against top-k ids `[B, L, k]`)
/// and the sorted prefill shape (x `[P, 1, K]`, ids in runs of one expert, each run one kernel
/// call; runs from 16 pairs take the GEMM path), every bit width / group size, float32 and
/// bfloat16, within the reordering bound.
#[test]
fn gather_kernel_matches_mlx_gather_qmm() {
    use mlx_rs::ops::gather_qmm;
    let mut seed = 300;
    for &bits in &[4, 5, 8] {
        for &group_size in &[32, 64] {
            for &dtype in &[Dtype::Float32, Dtype::Bfloat16] {
                let (experts, n, k) = (5, 70, 192);
                let w = random(&[experts, n, k], seed);
                let (wq, scales, biases) = quantize(&w, group_size, bits).unwrap();
                let (scales, biases) = (scales.as_dtype(dtype).unwrap(), biases.as_dtype(dtype).unwrap());
                let decode_ids: Vec<u32> = vec![4, 1, 3, 0, 2, 4, 2, 3, 1];
                let sorted_ids: Vec<u32> = vec![0, 0, 0, 1, 3, 3, 3, 3, 3, 4, 4];
                // Runs of 17 and 20 pairs: those calls take the GEMM path, the run of 2 does not.
                let long_runs: Vec<u32> = [vec![1; 17], vec![2; 2], vec![4; 20]].concat();
                let cases = [
                    (vec![1, 3, 1, 1, k], Array::from_slice(&decode_ids, &[1, 3, 3])),
                    (vec![11, 1, k], Array::from_slice(&sorted_ids, &[11])),
                    (vec![39, 1, k], Array::from_slice(&long_runs, &[39])),
                ];
                for (x_shape, ids) in cases {
                    let x = random(&x_shape, seed + 1).as_dtype(dtype).unwrap();
                    let fast = kernels::gather_qmm(&x, &wq, &scales, &biases, &ids, group_size, bits).unwrap();
                    let f32_ = |a: &Array| a.as_dtype(Dtype::Float32).unwrap();
                    let reference = gather_qmm(
                        f32_(&x), &wq, f32_(&scales), &f32_(&biases), None, &ids, true, group_size, bits, false,
                    )
                    .unwrap();
                    assert_eq!(fast.shape(), reference.shape(), "x{x_shape:?}");
                    assert_eq!(fast.dtype(), dtype);
                    let wd = dequantize(&wq, f32_(&scales), &f32_(&biases), group_size, bits).unwrap();
                    let mag = gather_mm_abs(&abs(f32_(&x)).unwrap(), &abs(&wd).unwrap(), &ids);
                    let (got, want, mag) = (to_vec(&fast), to_vec(&reference), to_vec(&mag));
                    let out_rel = if dtype == Dtype::Bfloat16 { 1.0 / 256.0 } else { 0.0 };
                    for i in 0..got.len() {
                        let tol = k as f32 * f32::EPSILON * mag[i] + out_rel * want[i].abs() + 1e-6;
                        assert!(
                            (got[i] - want[i]).abs() <= tol,
                            "x{x_shape:?} bits={bits} group={group_size} {dtype:?}: element {i}: fast {} vs mlx {}",
                            got[i],
                            want[i]
                        );
                    }
                }
                seed += 2;
            }
        }
    }
}

/// `|x| @ |W[e]|^T` per pair, the magnitude the reordering bound scales with.
fn gather_mm_abs(x: &Array, w: &Array, ids: &Array) -> Array {
    mlx_rs::ops::gather_mm(x, w.swap_axes(-1, -2).unwrap(), None, ids, false).unwrap()
}

/// An expert id past the stacked experts gives NaN rows for that pair only (never a read past
/// the weights); the other pairs are computed as usual.
#[test]
fn gather_kernel_gives_nan_rows_for_an_unknown_expert() {
    let (wq, scales, biases) = quantize(&random(&[3, 16, 64], 5), 32, 4).unwrap();
    let x = random(&[4, 1, 64], 6);
    let ids = Array::from_slice(&[0u32, 7, 2, 2], &[4]);
    let y = to_vec(&kernels::gather_qmm(&x, &wq, &scales, &biases, &ids, 32, 4).unwrap());
    let ok = Array::from_slice(&[0u32, 0, 2, 2], &[4]);
    let want = to_vec(&kernels::gather_qmm(&x, &wq, &scales, &biases, &ok, 32, 4).unwrap());
    for (i, (g, w)) in y.iter().zip(&want).enumerate() {
        if i / 16 == 1 {
            assert!(g.is_nan(), "row of the unknown expert: {g}");
        } else {
            assert_eq!(g.to_bits(), w.to_bits(), "element {i}");
        }
    }
}

#[test]
fn kernel_reads_strided_activations() {
    // x^T of a [K, M] array: not row-contiguous when the kernel reads it.
    let (k, n, m) = (128, 24, 5);
    let w = random(&[n, k], 1);
    let (wq, scales, biases) = quantize(&w, 64, 4).unwrap();
    let xt = random(&[k, m], 2);
    let x = xt.t();
    let fast = kernels::quantized_matmul(&x, &wq, &scales, &biases, 64, 4).unwrap();
    let reference = quantized_matmul(&x, &wq, &scales, &biases, true, 64, 4).unwrap();
    let (got, want) = (to_vec(&fast), to_vec(&reference));
    for (g, w) in got.iter().zip(&want) {
        assert!((g - w).abs() <= 1e-4 * (1.0 + w.abs()), "{g} vs {w}");
    }
}

#[test]
fn kernel_rejects_mismatched_shapes_with_an_error() {
    let w = random(&[16, 64], 3);
    let (wq, scales, biases) = quantize(&w, 32, 4).unwrap();
    let x = random(&[2, 96], 4); // K = 96, the weights have 64
    let err = kernels::quantized_matmul(&x, &wq, &scales, &biases, 32, 4)
        .and_then(|y| Ok(y.eval()?))
        .expect_err("a shape mismatch must be an error");
    assert!(!err.to_string().is_empty());
}

/// GGUF Q4_0 / Q4_1 / Q8_0 scales stay float16 in fast mode: the kernel widens them to float32
/// exactly, so its output is bit-equal to the same call with float32 scales (M = 1, a prefill
/// tile shape and GEMM-path shapes, 4 and 8 bits).
#[test]
fn float16_scales_give_the_float32_scales_result_bit_for_bit() {
    let _cap = hold_isa();
    for (bits, m) in [(4, 1), (4, 9), (8, 1), (8, 9), (4, 33), (8, 20)] {
        let (k, n) = (576, 70);
        let (wq, s, b) = quantize(&random(&[n, k], 50 + bits as u64), 32, bits).unwrap();
        let (s16, b16) = (s.as_dtype(Dtype::Float16).unwrap(), b.as_dtype(Dtype::Float16).unwrap());
        let (s32, b32) = (s16.as_dtype(Dtype::Float32).unwrap(), b16.as_dtype(Dtype::Float32).unwrap());
        let x = random(&[m, k], 60 + m as u64);
        let half = kernels::quantized_matmul(&x, &wq, &s16, &b16, 32, bits).unwrap();
        let full = kernels::quantized_matmul(&x, &wq, &s32, &b32, 32, bits).unwrap();
        assert_eq!(half.dtype(), Dtype::Float32);
        let (h, f) = (to_vec(&half), to_vec(&full));
        let differ = h.iter().zip(&f).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
        assert_eq!(differ, 0, "bits {bits}, M {m}: {differ} of {} outputs differ", h.len());
    }
}

/// The down projection that applies SwiGLU as it reads a fused gate/up output against the
/// separate ops (split, `silu(gate) * up`, the kernel): the kernel sums identically, so the
/// outputs differ only by the activations' last-bit differences (exp), a few float32 ulps of
/// the magnitude sum |a| |w|; M = 1, a prefill tile shape and GEMM-path shapes (21, 33 rows), 4, 5
/// and 8 bits; float16 input falls back to MLX's ops.
#[test]
fn swiglu_down_projection_matches_the_separate_ops() {
    use weft::nn::swiglu;
    for (bits, m) in [(4, 1), (4, 9), (8, 3), (4, 21), (5, 33)] {
        let (k, n) = (192, 70);
        let (wq, s, b) = quantize(&random(&[n, k], 80 + bits as u64), 32, bits).unwrap();
        let gate_up = random(&[1, m, 2 * k], 81 + m as u64).multiply(Array::from_f32(3.0)).unwrap();
        let fused = kernels::swiglu_quantized_matmul(&gate_up, &wq, &s, &b, 32, bits).unwrap();
        let halves = mlx_rs::ops::split_equal(&gate_up, 2, -1).unwrap();
        let act = swiglu(&halves[0], &halves[1]).unwrap();
        let separate = kernels::quantized_matmul(&act, &wq, &s, &b, 32, bits).unwrap();
        assert_eq!(fused.shape(), &[1, m, n]);
        let wd = dequantize(&wq, &s, &b, 32, bits).unwrap();
        let mag = to_vec(&abs(&act).unwrap().matmul(abs(&wd).unwrap().t()).unwrap());
        let (f, e) = (to_vec(&fused), to_vec(&separate));
        for i in 0..f.len() {
            let tol = 8.0 * f32::EPSILON * mag[i] + 1e-6;
            assert!((f[i] - e[i]).abs() <= tol, "bits {bits} M {m}: output {i}: fused {} vs separate {} (tolerance {tol})", f[i], e[i]);
        }
        // Outside the kernel's domain (float16 input) the same result comes from MLX's ops.
        let half = gate_up.as_dtype(Dtype::Float16).unwrap();
        let h = mlx_rs::ops::split_equal(&half, 2, -1).unwrap();
        let want = quantized_matmul(swiglu(&h[0], &h[1]).unwrap(), &wq, &s, &b, true, 32, bits).unwrap();
        let got = kernels::swiglu_quantized_matmul(&half, &wq, &s, &b, 32, bits).unwrap();
        assert_eq!(to_vec(&got), to_vec(&want), "bits {bits}: float16 fallback");
    }
}

/// Weft's RMSNorm and RoPE primitives (fast mode's replacements for MLX's CPU fallback graphs)
/// against `mx.fast.rms_norm` / `mx.fast.rope` on contiguous and transposed inputs: plain and
/// traditional RoPE, partial rotary dims, precomputed frequencies, scalar and per-row offsets.
/// Both compute in float32 with the same formulas; sums, cos and sin round differently, so the
/// bound is a few float32 ulps of the inputs' magnitude.
#[test]
fn row_primitives_match_mlx_rms_norm_and_rope() {
    let close = |got: &Array, want: &Array, what: &str, max_angle: f32| {
        assert_eq!(got.shape(), want.shape(), "{what}");
        assert_eq!(got.dtype(), Dtype::Float32, "{what}");
        let (g, w) = (to_vec(got), to_vec(want));
        let scale = w.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let worst = g.iter().zip(&w).fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
        // Angles are float32 products position * frequency: a last-bit difference in a
        // frequency moves the angle by ~position ulps, so the bound grows with the position.
        let bound = scale.max(1.0) * (1e-5 + 8.0 * f32::EPSILON * max_angle);
        assert!(worst <= bound, "{what}: worst |error| {worst:e} (bound {bound:e}, magnitude {scale})");
        eprintln!("{what}: worst |error| {worst:.2e} (magnitude {scale:.2})");
    };
    // RMSNorm: rows of 576 (and a 7-element tail), contiguous and a transposed view.
    let w = random(&[576], 70).add(Array::from_f32(1.0)).unwrap();
    for (x, what) in [
        (random(&[2, 3, 576], 71).multiply(Array::from_f32(3.0)).unwrap(), "rms_norm [2,3,576]"),
        (random(&[3, 576, 2], 72).swap_axes(1, 2).unwrap(), "rms_norm transposed"),
    ] {
        let got = kernels::rms_norm(&x, &w, 1e-5).unwrap();
        close(&got, &mlx_rs::fast::rms_norm(&x, Some(&w), 1e-5).unwrap(), what, 0.0);
    }
    let w7 = random(&[583], 73);
    let x7 = random(&[4, 583], 74);
    close(&kernels::rms_norm(&x7, &w7, 1e-6).unwrap(), &mlx_rs::fast::rms_norm(&x7, Some(&w7), 1e-6).unwrap(), "rms_norm 583", 0.0);

    // RoPE on [B, H, L, D] as attention builds it: a transposed view of [B, L, H, D].
    let x = random(&[3, 5, 4, 64], 75).swap_axes(1, 2).unwrap();
    let one = random(&[1, 4, 1, 64], 76);
    let freqs = Array::from_slice(&(0..16).map(|i| 1.5f32.powi(i) + 0.25).collect::<Vec<_>>(), &[16]);
    for traditional in [false, true] {
        for (dims, base, f) in [(64, Some(10000.0f32), None), (32, Some(500000.0), None), (32, None, Some(&freqs))] {
            let what = |case: &str| format!("rope {case} dims {dims} traditional {traditional} freqs {}", f.is_some());
            for (input, offset) in [(&x, 0), (&x, 37), (&one, 1234)] {
                let got = kernels::rope(input, dims, traditional, base, 0.5, &Array::from_int(offset), f).unwrap();
                let want = mlx_rs::fast::rope(input, dims, traditional, base, 0.5, offset, f).unwrap();
                // Largest angle: the last position times the largest frequency (1 or 1 / 1.25).
                let last = (offset + input.dim(2) - 1) as f32 * 0.5;
                close(&got, &want, &what(&format!("{:?} offset {offset}", input.shape())), last);
            }
            let offsets = Array::from_slice(&[3i32, 0, 250], &[3]);
            let got = kernels::rope(&x, dims, traditional, base, 1.0, &offsets, f).unwrap();
            let want = mlx_rs::fast::rope_dynamic(&x, dims, traditional, base, 1.0, &offsets, f).unwrap();
            close(&got, &want, &what("per-row offsets"), 254.0);
        }
    }
}

/// One attention case for [`sdpa_primitive_matches_mlx_sdpa`].
struct SdpaCase {
    b: i32,
    hq: i32,
    hkv: i32,
    lq: i32,
    lk: i32,
    d: i32,
    mask: &'static str,
}

/// Random q / k / v as the attention layers hand them over: q `[B, Lq, Hq, D]` transposed to
/// `[B, Hq, Lq, D]`, k and v the first Lk rows of a longer cache buffer (with `d == 80` values
/// stored transposed instead: a non-unit last stride), and the case's mask.
fn sdpa_inputs(c: &SdpaCase, seed: u64) -> (Array, Array, Array, weft::cache::AttentionMask) {
    use mlx_rs::ops::indexing::IndexOp;
    use weft::cache::AttentionMask;
    let q = random(&[c.b, c.lq, c.hq, c.d], seed).multiply(Array::from_f32(2.0)).unwrap().swap_axes(1, 2).unwrap();
    let k = random(&[c.b, c.hkv, c.lk + 9, c.d], seed + 1).index((.., .., ..c.lk, ..));
    let v = if c.d == 80 {
        random(&[c.b, c.hkv, c.d, c.lk], seed + 2).swap_axes(2, 3).unwrap()
    } else {
        random(&[c.b, c.hkv, c.lk + 9, c.d], seed + 2).index((.., .., ..c.lk, ..))
    };
    let mask = match c.mask {
        "none" => AttentionMask::None,
        "causal" => AttentionMask::Causal,
        "bool" => {
            // [B, 1, Lq, Lk] as the batch caches build it: random holes, key 0 always seen, and
            // row (b = 1, i = 0) seeing nothing (MLX then averages every value: a finite minimum).
            let r = to_vec(&random(&[c.b, 1, c.lq, c.lk], seed + 3));
            let m: Vec<bool> = (0..r.len())
                .map(|e| {
                    let (b, i, j) = (e / (c.lq * c.lk) as usize, e / c.lk as usize % c.lq as usize, e % c.lk as usize);
                    !(b == 1 && i == 0) && (j == 0 || r[e] > -0.6)
                })
                .collect();
            AttentionMask::Array(Array::from_slice(&m, &[c.b, 1, c.lq, c.lk]))
        }
        "additive" => AttentionMask::Array(random(&[1, c.hq, c.lq, c.lk], seed + 3).multiply(Array::from_f32(2.0)).unwrap()),
        other => unreachable!("{other}"),
    };
    (q, k, v, mask)
}

/// Weft's attention primitive (fast mode's `sdpa`) against `mx.fast.scaled_dot_product_attention`
/// on random inputs: decode (Lq = 1) and prefill, GQA ratios 1 / 3 / 4, head dims 64 / 128 (and
/// 80: a vector tail, values copied), no mask, causal (Lq = Lk, Lq < Lk, Lq = 1), boolean and
/// additive masks, strided q / k / v, B > 1, key counts that end blocks early; every instruction
/// set this CPU has. Both compute in float32; the score sums, the exp and the order of the value
/// sums round differently (online softmax). Bound: |fast - mlx| <= 1e-5 * (softmax . |v|) + 1e-6
/// per output element, the magnitude from MLX's op on |v| (observed: at most 1.3e-6 of it).
#[test]
fn sdpa_primitive_matches_mlx_sdpa() {
    use weft::cache::sdpa;
    let _cap = hold_isa();
    let case = |b, hq, hkv, lq, lk, d, mask| SdpaCase { b, hq, hkv, lq, lk, d, mask };
    let cases = [
        case(1, 9, 3, 1, 37, 64, "none"),
        case(2, 8, 2, 1, 300, 128, "none"),
        case(1, 4, 4, 1, 70, 64, "none"),
        case(1, 9, 3, 1, 20, 64, "causal"),
        case(1, 9, 3, 100, 100, 64, "causal"),
        case(2, 8, 2, 23, 150, 128, "causal"),
        case(1, 4, 4, 40, 40, 80, "causal"),
        case(3, 9, 3, 1, 50, 64, "bool"),
        case(2, 8, 2, 7, 90, 64, "bool"),
        case(1, 8, 2, 5, 66, 128, "additive"),
    ];
    let mut seen = Vec::new();
    for isa in ["avx512", "avx2", "generic"] {
        kernels::limit_isa(isa).unwrap();
        let got = kernels::sdpa_isa();
        if seen.contains(&got) {
            continue;
        }
        seen.push(got);
        for (n, c) in cases.iter().enumerate() {
            let (q, k, v, mask) = sdpa_inputs(c, 300 + 10 * n as u64);
            let scale = 1.0 / (c.d as f32).sqrt();
            let fast = sdpa(&q, &k, &v, scale, &mask, true).unwrap();
            let want = sdpa(&q, &k, &v, scale, &mask, false).unwrap();
            let mag = to_vec(&sdpa(&q, &k, &abs(&v).unwrap(), scale, &mask, false).unwrap());
            assert_eq!(fast.shape(), want.shape());
            assert_eq!(fast.dtype(), Dtype::Float32);
            let (f, w) = (to_vec(&fast), to_vec(&want));
            let what = format!("B={} Hq={} Hkv={} Lq={} Lk={} D={} {} ({got})", c.b, c.hq, c.hkv, c.lq, c.lk, c.d, c.mask);
            let mut worst = 0.0f32;
            for i in 0..f.len() {
                let tol = 1e-5 * mag[i] + 1e-6;
                let err = (f[i] - w[i]).abs();
                assert!(err <= tol, "{what}: element {i}: fast {} vs mlx {} (tolerance {tol})", f[i], w[i]);
                worst = worst.max(err / tol);
            }
            eprintln!("{what}: worst error {worst:.3} of the tolerance");
        }
    }
    kernels::limit_isa("avx512").unwrap();
    eprintln!("attention kernels checked: {seen:?}");
}

/// A short chunk over a long history (a reused prompt's new tokens: 20 queries, 9 heads over 3
/// kv heads, 3,800 keys, the batch cache's boolean mask) is split into more query blocks than
/// kv heads so every pool thread gets work; each query row must come out exactly as when it
/// attends alone (Lq = 1, its own mask row), on every instruction set this CPU has.
#[test]
fn sdpa_short_chunk_over_long_history_matches_rows_alone() {
    use mlx_rs::ops::indexing::IndexOp;
    use weft::cache::{sdpa, AttentionMask};
    let _cap = hold_isa();
    let c = SdpaCase { b: 1, hq: 9, hkv: 3, lq: 20, lk: 3800, d: 64, mask: "bool" };
    let (q, k, v, mask) = sdpa_inputs(&c, 900);
    let AttentionMask::Array(m) = &mask else { unreachable!() };
    let scale = 0.125;
    let mut seen = Vec::new();
    for isa in ["avx512", "avx2", "generic"] {
        kernels::limit_isa(isa).unwrap();
        let got = kernels::sdpa_isa();
        if seen.contains(&got) {
            continue;
        }
        seen.push(got);
        let chunk = sdpa(&q, &k, &v, scale, &mask, true).unwrap();
        for i in 0..c.lq {
            let qi = q.index((.., .., i..i + 1, ..));
            let mi = AttentionMask::Array(m.index((.., .., i..i + 1, ..)));
            let alone = to_vec(&sdpa(&qi, &k, &v, scale, &mi, true).unwrap());
            assert_eq!(to_vec(&chunk.index((.., .., i..i + 1, ..)).contiguous().unwrap()), alone, "query {i} ({got})");
        }
    }
    kernels::limit_isa("avx512").unwrap();
}

/// Outside the primitive's domain fast mode's `sdpa` is MLX's op, bit for bit (float16 inputs;
/// a causal mask with more queries than keys), and inputs MLX rejects are an error, not a panic.
#[test]
fn sdpa_primitive_falls_back_and_reports_bad_input() {
    use weft::cache::{sdpa, AttentionMask};
    let half = |a: Array| a.as_dtype(Dtype::Float16).unwrap();
    let (q, k, v) = (random(&[1, 4, 3, 64], 400), random(&[1, 2, 9, 64], 401), random(&[1, 2, 9, 64], 402));
    let (qh, kh, vh) = (half(q.clone()), half(k.clone()), half(v.clone()));
    let fast = sdpa(&qh, &kh, &vh, 0.125, &AttentionMask::Causal, true).unwrap();
    let mlx = sdpa(&qh, &kh, &vh, 0.125, &AttentionMask::Causal, false).unwrap();
    assert_eq!(fast.dtype(), Dtype::Float16);
    assert_eq!(to_vec(&fast), to_vec(&mlx), "float16: MLX's op");
    let long_q = random(&[1, 4, 12, 64], 403);
    let fast = sdpa(&long_q, &k, &v, 0.125, &AttentionMask::Causal, true).unwrap();
    let mlx = sdpa(&long_q, &k, &v, 0.125, &AttentionMask::Causal, false).unwrap();
    assert_eq!(to_vec(&fast), to_vec(&mlx), "causal Lq > Lk: MLX's op");
    for (q, k, what) in [
        (q.clone(), random(&[1, 2, 9, 32], 404), "head dims differ"),
        (random(&[1, 3, 3, 64], 405), k.clone(), "3 query heads over 2 kv heads"),
    ] {
        let err = sdpa(&q, &k, &v, 0.125, &AttentionMask::None, true).and_then(|o| Ok(o.eval()?));
        assert!(err.is_err(), "{what}: must be an error");
    }
    let bad_mask = AttentionMask::Array(Array::from_slice(&[true; 5], &[5]));
    assert!(sdpa(&q, &k, &v, 0.125, &bad_mask, true).and_then(|o| Ok(o.eval()?)).is_err(), "mask of 5 keys over 9");
}

#[test]
fn mode_parses() {
    assert_eq!("exact".parse::<CpuKernels>().unwrap(), CpuKernels::Exact);
    assert_eq!("fast".parse::<CpuKernels>().unwrap(), CpuKernels::Fast);
    assert!("quick".parse::<CpuKernels>().is_err());
    assert_eq!(CpuKernels::default(), CpuKernels::Fast);
}

/// The mode is a value each model keeps: two engines in one process, one loaded exact and one
/// fast, run side by side (their requests in flight together). The exact one gives mlx-lm's
/// goldens bit for bit; the fast one stays within the KL bound of it and is not bit-equal
/// (its kernels really ran), whatever the other engine was loaded with.
#[test]
fn two_engines_in_one_process_keep_their_kernel_modes() {
    use weft::engine::{Engine, EngineConfig};
    let name = "llama-4bit";
    let path = tiny_model_dir(name);
    // Float activations: the bound is float32 reordering's (int8's: `compare_int8`).
    let load = |mode| {
        let o = loading::LoadOptions::default().with_cpu_kernels(mode).with_cpu_activations(kernels::CpuActivations::Float);
        loading::load_with(&path, &o).unwrap()
    };
    let (exact, fast) = (load(CpuKernels::Exact), load(CpuKernels::Fast));
    let vocab = exact.model.info().vocab_size as usize;
    let g = golden(name);
    let cases = g["single"].as_array().unwrap();
    let step = cases[0]["prefill_step_size"].as_u64().unwrap() as usize;
    let config = EngineConfig { prefill_step_size: step, ..EngineConfig::default() };
    let (exact, fast) = (Engine::start(exact, config.clone()).unwrap(), Engine::start(fast, config).unwrap());
    let request = |case: &serde_json::Value| {
        let want = ids(&case["tokens"]);
        weft::engine::Request { capture_first_logits: vocab, ..greedy(ids(&case["prompt_ids"]), want.len()) }
    };
    let same_step: Vec<_> = cases.iter().filter(|c| c["prefill_step_size"].as_u64() == Some(step as u64)).collect();
    let streams: Vec<_> = same_step
        .iter()
        .map(|c| (exact.submit_channel(request(c)).unwrap().1, fast.submit_channel(request(c)).unwrap().1))
        .collect();
    let mut fast_differs = false;
    for (case, (e, f)) in same_step.iter().zip(&streams) {
        let (e, f) = (collect(e), collect(f));
        let what = format!("{name}: {}-token prompt", ids(&case["prompt_ids"]).len());
        assert_eq!(e.tokens, ids(&case["tokens"]), "{what}: exact engine tokens vs mlx-lm");
        assert_eq!(bit_diffs(&e.first_logits, &floats(&case["first_logits"])), 0, "{what}: exact engine logits");
        let d = kl(&e.first_logits, &f.first_logits);
        assert!(d < KL_BOUND, "{what}: KL(exact || fast) = {d:e}");
        fast_differs |= bit_diffs(&e.first_logits, &f.first_logits) > 0;
    }
    assert!(!same_step.is_empty());
    assert!(fast_differs, "the fast engine computed exactly what the exact one did: its kernels did not run");
}


/// Weft's residual-add + RMSNorm primitive (fast mode's decoder layers) gives what MLX's add
/// followed by Weft's RMSNorm primitive gives, bit for bit, on contiguous inputs, a strided
/// residual, a batch of decode rows and rows with a tail past the sum's eight lanes; and stays
/// within RMSNorm's bound of `mx.fast.rms_norm`. Outside its domain (float16) it is MLX's ops.
#[test]
fn add_rms_norm_primitive_is_the_add_then_the_norm() {
    let w = random(&[576], 90).add(Array::from_f32(1.0)).unwrap();
    let w7 = random(&[583], 91);
    let cases = [
        (random(&[1, 1, 576], 92), random(&[1, 1, 576], 93), &w, "decode row"),
        (random(&[8, 1, 576], 94).multiply(Array::from_f32(4.0)).unwrap(), random(&[8, 1, 576], 95), &w, "8 decode rows"),
        (random(&[2, 3, 576], 96), random(&[2, 576, 3], 97).swap_axes(1, 2).unwrap(), &w, "strided residual"),
        (random(&[4, 583], 98), random(&[4, 583], 99), &w7, "rows of 583"),
    ];
    for (x, r, w, what) in cases {
        let (sum, normed) = kernels::add_rms_norm(&x, &r, w, 1e-5).unwrap();
        let want_sum = x.add(&r).unwrap();
        let want = kernels::rms_norm(&want_sum, w, 1e-5).unwrap();
        assert_eq!(sum.shape(), want_sum.shape(), "{what}");
        assert_eq!(bit_diffs(&to_vec(&sum), &to_vec(&want_sum)), 0, "{what}: sum");
        assert_eq!(bit_diffs(&to_vec(&normed), &to_vec(&want)), 0, "{what}: norm");
        let mlx = to_vec(&mlx_rs::fast::rms_norm(&want_sum, Some(w), 1e-5).unwrap());
        let worst = to_vec(&normed).iter().zip(&mlx).fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
        let scale = mlx.iter().fold(1.0f32, |m, v| m.max(v.abs()));
        assert!(worst <= 1e-5 * scale, "{what}: vs mx.fast.rms_norm |error| {worst:e}");
    }
    let (x, r) = (random(&[2, 576], 100).as_dtype(Dtype::Float16).unwrap(), random(&[2, 576], 101).as_dtype(Dtype::Float16).unwrap());
    let (sum, normed) = kernels::add_rms_norm(&x, &r, &w, 1e-5).unwrap();
    let want_sum = x.add(&r).unwrap();
    assert_eq!(to_vec(&sum), to_vec(&want_sum), "float16 fallback: sum");
    assert_eq!(to_vec(&normed), to_vec(&mlx_rs::fast::rms_norm(&want_sum, Some(&w), 1e-5).unwrap()), "float16 fallback: norm");
}

/// Weft's log-softmax primitive (fast mode's sampling tail) against MLX's `x - logsumexp(x)`:
/// a vocabulary-sized row and batches, rows whose length is no multiple of the vector width, a
/// last-position view of `[B, L, V]` logits, a transposed (strided) view, -inf entries (masked
/// tokens) and a row of -inf only. Both sum tens of thousands of float32 exps, in different
/// orders and with different exp roundings, so each is held to a float64 reference: the
/// primitive's error may not exceed twice MLX's own (or 8 ulps of the magnitude, when MLX's is
/// smaller), and the greedy choice is MLX's token.
#[test]
fn log_softmax_primitive_matches_mlx_logsumexp() {
    use mlx_rs::ops::indexing::IndexOp;
    let want_of = |x: &Array| x.subtract(x.logsumexp_axis(-1, true).unwrap()).unwrap();
    let check = |x: &Array, what: &str| {
        let got = kernels::log_softmax(x).unwrap();
        let want = want_of(x);
        assert_eq!(got.shape(), want.shape(), "{what}");
        let (g, w, xs) = (to_vec(&got), to_vec(&want), to_vec(&x.reshape(&[-1]).unwrap()));
        let width = *x.shape().last().unwrap() as usize;
        for (r, ((gr, wr), xr)) in g.chunks(width).zip(w.chunks(width)).zip(xs.chunks(width)).enumerate() {
            let max = xr.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
            let lse = max + xr.iter().map(|&v| (v as f64 - max).exp()).sum::<f64>().ln();
            let scale = wr.iter().filter(|v| v.is_finite()).fold(1.0f32, |m, v| m.max(v.abs())) as f64;
            let (mut ours, mut mlx) = (0.0f64, 0.0f64);
            for ((&a, &b), &v) in gr.iter().zip(wr).zip(xr) {
                if b.is_finite() {
                    let exact = v as f64 - lse;
                    ours = ours.max((a as f64 - exact).abs());
                    mlx = mlx.max((b as f64 - exact).abs());
                } else {
                    assert!(a == b || (a.is_nan() && b.is_nan()), "{what} row {r}: {a} where MLX gives {b}");
                }
            }
            let bound = 2.0 * mlx.max(8.0 * f32::EPSILON as f64 * scale);
            assert!(ours <= bound, "{what} row {r}: |error| {ours:e} vs MLX's {mlx:e} (magnitude {scale})");
            if r == 0 {
                eprintln!("{what}: |error| vs float64 {ours:.2e}, MLX's {mlx:.2e} (magnitude {scale:.1})");
            }
        }
        let (ga, wa) = (mlx_rs::ops::indexing::argmax_axis(&got, -1, None).unwrap(), mlx_rs::ops::indexing::argmax_axis(&want, -1, None).unwrap());
        assert_eq!(ga.as_dtype(Dtype::Int32).unwrap().as_slice::<i32>(), wa.as_dtype(Dtype::Int32).unwrap().as_slice::<i32>(), "{what}: argmax");
    };
    let logits = random(&[1, 49152], 80).multiply(Array::from_f32(6.0)).unwrap();
    check(&logits, "one vocabulary row");
    check(&random(&[8, 49152], 81).multiply(Array::from_f32(4.0)).unwrap().add(Array::from_f32(20.0)).unwrap(), "8 rows, offset +20");
    check(&random(&[3, 1003], 82).multiply(Array::from_f32(30.0)).unwrap(), "3 rows of 1003");
    check(&random(&[2, 5], 83), "rows shorter than a vector");
    let seq = random(&[2, 3, 1000], 84).multiply(Array::from_f32(5.0)).unwrap();
    check(&seq.index((.., -1, ..)), "last position of [2, 3, 1000]");
    check(&random(&[777, 3], 85).t(), "transposed [3, 777]");
    // Masked tokens (-inf) and a row with nothing left.
    let mut m = to_vec(&random(&[2, 100], 86));
    for v in m.iter_mut().step_by(3) {
        *v = f32::NEG_INFINITY;
    }
    for v in &mut m[100..] {
        *v = f32::NEG_INFINITY;
    }
    check(&Array::from_slice(&m, &[2, 100]), "-inf entries and an all -inf row");
    // Outside the primitive's domain (float16): MLX's ops.
    let half = logits.as_dtype(Dtype::Float16).unwrap();
    assert_eq!(to_vec(&kernels::log_softmax(&half).unwrap()), to_vec(&want_of(&half)), "float16 fallback");
}

/// The engine's token choice in fast mode goes through the log-softmax primitive; the
/// single-sequence path (`generate`) keeps MLX's ops. Greedy tokens agree over whole trajectories
/// (tiny model goldens and the default model), one request at a time and then all together.
#[test]
fn fast_engine_tail_chooses_the_tokens_of_mlx_ops() {
    use weft::engine::{Engine, EngineConfig};
    let tiny = |model: &str, golden: &str| -> (String, std::path::PathBuf, Vec<Vec<u32>>) {
        (model.into(), tiny_model_dir(model), golden_cases(golden).into_iter().map(|(p, _)| p).collect())
    };
    // The dense decoder, Gemma 3, the hybrid (gated DeltaNet) decoder and MoE.
    let mut models =
        vec![tiny("llama-4bit", "llama-4bit"), tiny("gemma3-text", "gemma3"), tiny("qwen3_5-4bit", "qwen3_5-4bit"), tiny("qwen3_moe-4bit", "qwen3_moe-4bit")];
    if let Some(p) = default_model() {
        let g = golden("smollm2");
        let prompts = g["chats"].as_array().unwrap().iter().map(|c| ids(&c["prompt_ids"])).take(3).collect();
        models.push(("smollm2 (Q4_1 GGUF)".into(), p, prompts));
    }
    for (name, path, prompts) in models {
        let loaded = loading::load_with(&path, &LoadOptions::default().with_cpu_kernels(CpuKernels::Fast)).unwrap();
        assert!(loaded.model.fast_cpu_kernels(), "{name}: fast mode on the CPU");
        let opts = GenerateOptions { max_tokens: 16, ..GenerateOptions::default() };
        let alone: Vec<Vec<u32>> = prompts.iter().map(|p| generate(loaded.model.as_ref(), None, p, &opts, |_| true).unwrap().tokens).collect();
        let engine = Engine::start(loaded, EngineConfig::default()).unwrap();
        for (want, p) in alone.iter().zip(&prompts) {
            let rx = engine.submit_channel(greedy(p.clone(), 16)).unwrap().1;
            assert_eq!(&collect(&rx).tokens, want, "{name}: {}-token prompt", p.len());
        }
        // Together: a batch's decode rows are strided views of the fused projection's output
        // (the heads split without a copy); each row's greedy tokens are its tokens alone.
        let streams: Vec<_> = prompts.iter().map(|p| engine.submit_channel(greedy(p.clone(), 16)).unwrap().1).collect();
        for ((rx, want), p) in streams.iter().zip(&alone).zip(&prompts) {
            assert_eq!(&collect(rx).tokens, want, "{name}: {}-token prompt in a batch of {}", p.len(), prompts.len());
        }
    }
}

/// A batch of 8 decode rows in fast mode with float activations (on AVX2 the per-row kernel's
/// 8-row tile: codes times scale, one vector epilogue for the 8 rows; the down projection's
/// SwiGLU read with the vector exp) chooses,
/// row by row, the greedy tokens exact mode (MLX's ops) chooses for each prompt alone: tiny
/// 4-bit llama and the default model, golden prompts repeated to fill the batch.
#[test]
fn fast_engine_batch_of_eight_chooses_the_tokens_of_exact_mode() {
    use weft::engine::{Engine, EngineConfig};
    let _cap = hold_isa();
    let mut models = vec![("llama-4bit".to_string(), tiny_model_dir("llama-4bit"), golden_cases("llama-4bit"))];
    if let Some(p) = default_model() {
        let g = golden("smollm2");
        let cases = g["chats"].as_array().unwrap().iter().map(|c| (ids(&c["prompt_ids"]), ids(&c["tokens"]))).collect();
        models.push(("smollm2 (Q4_1 GGUF)".into(), p, cases));
    }
    for (name, path, mut cases) in models {
        // The shortest prompts (exact mode's prefill is the slow part), cycled to 8 rows.
        cases.sort_by_key(|(p, _)| p.len());
        cases.truncate(3);
        let prompts: Vec<Vec<u32>> = (0..8).map(|i| cases[i % cases.len()].0.clone()).collect();
        let max_tokens = 8;
        let exact = loading::load_with(&path, &LoadOptions::default().with_cpu_kernels(CpuKernels::Exact)).unwrap();
        let opts = GenerateOptions { max_tokens, ..GenerateOptions::default() };
        let want: Vec<Vec<u32>> = cases.iter().map(|(p, _)| generate(exact.model.as_ref(), None, p, &opts, |_| true).unwrap().tokens).collect();
        drop(exact);
        let float = LoadOptions::default().with_cpu_kernels(CpuKernels::Fast).with_cpu_activations(kernels::CpuActivations::Float);
        let fast = loading::load_with(&path, &float).unwrap();
        let engine = Engine::start(fast, EngineConfig::default()).unwrap();
        let streams: Vec<_> = prompts.iter().map(|p| engine.submit_channel(greedy(p.clone(), max_tokens)).unwrap().1).collect();
        for (i, rx) in streams.iter().enumerate() {
            assert_eq!(collect(rx).tokens, want[i % cases.len()], "{name}: row {i} of 8 ({}-token prompt)", prompts[i].len());
        }
        eprintln!("{name}: 8 rows in fast mode chose exact mode's {max_tokens} greedy tokens each");
    }
}

/// Bound on the next-token KL divergence of fast vs exact mode. Both compute the same float32
/// sums in different orders; observed values are ~1e-9 and below, and 1e-4 nats is far below
/// any change a sampler could notice (quantizing activations to 8 bits, as llama.cpp does and
/// the default activations do, costs ~4e-3).
const KL_BOUND: f64 = 1e-4;

/// Runs every golden single case of a model in both modes (fast with float activations; the
/// default int8 ones: `compare_int8`): first-step KL under the bound, and greedy agreement with
/// the golden trajectory reported.
fn compare_modes(name: &str, path: &std::path::Path, cases: &[(Vec<u32>, Vec<u32>)]) {
    let exact = loading::load_with(path, &LoadOptions::default().with_cpu_kernels(CpuKernels::Exact)).unwrap();
    let float = LoadOptions::default().with_cpu_kernels(CpuKernels::Fast).with_cpu_activations(kernels::CpuActivations::Float);
    let fast = loading::load_with(path, &float).unwrap();
    let vocab = exact.model.info().vocab_size as usize;
    let (mut agree, mut total, mut worst) = (0, 0, 0.0f64);
    for (prompt, want) in cases {
        // Exact mode only for the first step (it is the slow one); fast runs the trajectory.
        let first = GenerateOptions { max_tokens: 1, capture_first_logits: vocab, ..GenerateOptions::default() };
        let e = generate(exact.model.as_ref(), None, prompt, &first, |_| true).unwrap();
        let opts = GenerateOptions { max_tokens: want.len(), capture_first_logits: vocab, ..GenerateOptions::default() };
        let f = generate(fast.model.as_ref(), None, prompt, &opts, |_| true).unwrap();
        let d = kl(&e.first_logits, &f.first_logits);
        assert!(d < KL_BOUND, "{name}: {}-token prompt: KL(exact || fast) = {d:e} nats", prompt.len());
        worst = worst.max(d);
        // Greedy agreement: the leading run of fast tokens equal to the golden trajectory.
        agree += f.tokens.iter().zip(want).take_while(|(a, b)| a == b).count();
        total += want.len();
    }
    eprintln!(
        "{name}: fast vs exact: worst first-step KL {worst:.2e} nats (bound {KL_BOUND:e}); \
         greedy agreement with the golden trajectories {agree}/{total} tokens"
    );
}

fn golden_cases(name: &str) -> Vec<(Vec<u32>, Vec<u32>)> {
    golden(name)["single"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (ids(&c["prompt_ids"]), ids(&c["tokens"])))
        .collect()
}

#[test]
fn fast_mode_next_token_distribution_stays_close_on_tiny_quantized_models() {
    for name in ["llama-4bit", "qwen3_5-4bit", "qwen3_moe-4bit", "qwen3_5_moe-4bit"] {
        compare_modes(name, &tiny_model_dir(name), &golden_cases(name));
    }
}

/// Fast mode also stacks q/k/v and gate/up into one matmul each at load: on float models the
/// fused dense matmuls (another BLAS blocking) are held to the same bound against exact mode,
/// with and without projection biases (Qwen2) and q/k norms (Qwen3, Gemma 3).
#[test]
fn fast_mode_with_fused_float_projections_stays_close_on_tiny_float_models() {
    for (model, golden) in [("llama-fp32", "llama-fp32"), ("qwen2", "qwen2"), ("qwen3", "qwen3"), ("gemma3-text", "gemma3")] {
        compare_modes(model, &tiny_model_dir(model), &golden_cases(golden));
    }
}

/// Fused quantized projections are the separate layers' packed rows stacked, and the fast kernel
/// computes each output column alone (bit for bit: `concatenated_linears_compute_the_parts_outputs`).
/// A fused gate/up also lets the down projection apply SwiGLU as it reads its input (its exp is
/// not MLX's), so whole-model logits are held to the KL bound and greedy tokens must agree.
#[test]
fn fused_quantized_projections_give_the_separate_layers_logits() {
    let _cap = hold_isa();
    let mut models: Vec<(String, std::path::PathBuf)> = vec![("llama-4bit".into(), tiny_model_dir("llama-4bit"))];
    if let Some(p) = default_model() {
        models.push(("smollm2 (Q4_1 GGUF)".into(), p));
    }
    for (name, path) in models {
        let float = LoadOptions::default().with_cpu_activations(kernels::CpuActivations::Float);
        let load = |fuse| loading::load_with(&path, &LoadOptions { fuse_projections: Some(fuse), ..float.clone() }).unwrap();
        let (fused, separate) = (load(true), load(false));
        let vocab = fused.model.info().vocab_size as usize;
        for prompt in [vec![1u32, 2, 3, 4, 5, 6, 7], vec![9u32]] {
            let opts = GenerateOptions { max_tokens: 3, capture_first_logits: vocab, ..GenerateOptions::default() };
            let f = generate(fused.model.as_ref(), None, &prompt, &opts, |_| true).unwrap();
            let s = generate(separate.model.as_ref(), None, &prompt, &opts, |_| true).unwrap();
            let d = kl(&s.first_logits, &f.first_logits);
            assert!(d < KL_BOUND, "{name}: KL(separate || fused) = {d:e} nats ({}-token prompt)", prompt.len());
            assert_eq!(f.tokens, s.tokens, "{name}");
            eprintln!("{name}: fused vs separate projections: KL {d:.2e} nats ({}-token prompt)", prompt.len());
        }
    }
}

#[test]
fn fast_mode_next_token_distribution_stays_close_on_the_default_model() {
    let Some(path) = default_model() else { return };
    let g = golden("smollm2");
    let mut cases: Vec<_> = g["chats"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (ids(&c["prompt_ids"]), ids(&c["tokens"])))
        .collect();
    // The two shortest prompts: exact mode's prefill is the slow part of this test.
    cases.sort_by_key(|(p, _)| p.len());
    cases.truncate(2);
    compare_modes("smollm2 (Q4_1 GGUF)", &path, &cases);
}

/// The dequantize + dense matmul path (the GPU default from 512 rows, `LoadOptions::dequantize_rows`),
/// forced from one row here on the CPU: the same weight values summed in another order, so the
/// next-token distribution stays within the same bound of MLX's quantized matmul.
#[test]
fn dequantize_matmul_path_stays_close_to_quantized_matmul() {
    for name in ["llama-4bit", "qwen3_5-4bit"] {
        let path = tiny_model_dir(name);
        let exact = loading::load_with(&path, &exact_options()).unwrap();
        let dense = loading::load_with(&path, &LoadOptions { dequantize_rows: Some(1), ..exact_options() }).unwrap();
        let vocab = exact.model.info().vocab_size as usize;
        for (prompt, want) in golden_cases(name).iter().take(3) {
            let opts = GenerateOptions { max_tokens: want.len(), capture_first_logits: vocab, ..GenerateOptions::default() };
            let e = generate(exact.model.as_ref(), None, prompt, &opts, |_| true).unwrap();
            let d = generate(dense.model.as_ref(), None, prompt, &opts, |_| true).unwrap();
            let div = kl(&e.first_logits, &d.first_logits);
            assert!(div < KL_BOUND, "{name}: KL(quantized matmul || dequantize + matmul) = {div:e} nats");
            assert_eq!(d.tokens, e.tokens, "{name}: greedy tokens");
        }
    }
}

/// The layer takes the path it was loaded with: below the row count MLX's quantized matmul, from
/// it on the dense product of the dequantized weight (each computed here independently).
#[test]
fn quantized_linear_switches_to_dequantize_from_the_row_count() {
    use weft::nn::{LayerOptions, Linear, QmmPath, QuantConfig, Weights};
    let (out_dim, in_dim) = (96, 256);
    let (wq, s, b) = quantize(&random(&[out_dim, in_dim], 11), 64, 4).unwrap();
    let load = || {
        let tensors = [("l.weight", wq.clone()), ("l.scales", s.clone()), ("l.biases", b.clone())]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        let quant = QuantConfig::from_json(&serde_json::json!({"group_size": 64, "bits": 4})).unwrap();
        let options = LayerOptions::new(CpuKernels::Exact, Some(4), None, None).unwrap();
        let mut w = Weights::new(tensors, Some(quant)).with_options(options);
        Linear::load(&mut w, "l", in_dim, out_dim, false).unwrap()
    };
    let layer = load();
    assert!(matches!(&layer, Linear::Quantized { path: QmmPath::DequantizeFrom { rows: 4 }, .. }));
    let dense_w = dequantize(&wq, &s, &b, 64, 4).unwrap();
    for rows in [1, 3, 4, 9] {
        let x = random(&[rows, in_dim], 5 + rows as u64);
        let got = to_vec(&layer.forward(&x).unwrap());
        let qmm = to_vec(&quantized_matmul(&x, &wq, &s, &b, true, 64, 4).unwrap());
        let dense = to_vec(&x.matmul(dense_w.t()).unwrap());
        let want = if rows >= 4 { dense } else { qmm };
        assert_eq!(got, want, "{rows} rows");
    }
}

/// The GPU's path (`QmmPath::MlxFlat`) multiplies `[B, 1, K]` / `[B, L, K]` inputs as one
/// `[rows, K]` product and gives back the input's leading shape; MLX computes every row alone,
/// so the values equal the unflattened product's bit for bit (checked here on the CPU, where
/// the same path can be forced; on the H200 by benches/gpu/flat_rows.py).
#[test]
fn the_flattened_quantized_matmul_equals_the_batched_one() {
    use weft::nn::{Linear, QmmPath, QuantSpec};
    let (out_dim, in_dim) = (96, 256);
    let (wq, s, b) = quantize(&random(&[out_dim, in_dim], 21), 64, 4).unwrap();
    // DequantizeFrom below its row count takes the same flattened product (the GPU default).
    for path in [QmmPath::MlxFlat, QmmPath::DequantizeFrom { rows: 1000 }] {
        let layer = Linear::Quantized {
            weight: wq.clone(),
            scales: s.clone(),
            biases: b.clone(),
            bias: None,
            spec: QuantSpec { group_size: 64, bits: 4 },
            path,
        };
        for shape in [vec![5, 1, in_dim], vec![2, 3, in_dim], vec![2, 2, 2, in_dim], vec![4, in_dim]] {
            let x = random(&shape, 30 + shape.len() as u64);
            let got = layer.forward(&x).unwrap();
            let want = quantized_matmul(&x, &wq, &s, &b, true, 64, 4).unwrap();
            assert_eq!(got.shape(), want.shape(), "{path:?} {shape:?}");
            assert_eq!(to_vec(&got), to_vec(&want), "{path:?} {shape:?}");
        }
    }
}

/// `Linear::concat_outputs` (projection fusion at load): dense and quantized layers of one form
/// stack into one layer whose output is theirs concatenated, bit for bit (the fast kernel and
/// the reference BLAS compute each output column alone, on the GEMM path too: 19 rows); layers of
/// different forms stay apart.
#[test]
fn concatenated_linears_compute_the_parts_outputs() {
    let _cap = hold_isa();
    use weft::nn::{LayerOptions, Linear, QuantConfig, Weights};
    let in_dim = 256;
    let quantized = |seed: u64, out_dim: i32, bits: i32| {
        let (wq, s, b) = quantize(&random(&[out_dim, in_dim], seed), 32, bits).unwrap();
        let tensors = [("l.weight", wq), ("l.scales", s), ("l.biases", b)].into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        let quant = QuantConfig::from_json(&serde_json::json!({"group_size": 32, "bits": bits})).unwrap();
        let fast = LayerOptions::new(CpuKernels::Fast, None, None, None).unwrap();
        Linear::load(&mut Weights::new(tensors, Some(quant)).with_options(fast), "l", in_dim, out_dim, false).unwrap()
    };
    let dense = |seed: u64, out_dim: i32| {
        let tensors = [("l.weight", random(&[out_dim, in_dim], seed)), ("l.bias", random(&[out_dim], seed + 100))]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        Linear::load(&mut Weights::new(tensors, None), "l", in_dim, out_dim, true).unwrap()
    };
    for rows in [1, 5, 19] {
        let x = random(&[rows, in_dim], 40 + rows as u64);
        for parts in [vec![quantized(1, 64, 4), quantized(2, 32, 4), quantized(3, 32, 4)], vec![dense(4, 64), dense(5, 96)]] {
            let want: Vec<Array> = parts.iter().map(|l| l.forward(&x).unwrap()).collect();
            let want = to_vec(&mlx_rs::ops::concatenate(&want, -1).unwrap());
            let fused = Linear::concat_outputs(parts).unwrap().unwrap_or_else(|_| panic!("the parts stack"));
            assert_eq!(to_vec(&fused.forward(&x).unwrap()), want, "{rows} rows");
        }
    }
    let mixed = Linear::concat_outputs(vec![quantized(6, 32, 4), quantized(7, 32, 8)]).unwrap();
    assert!(matches!(mixed, Err(ref p) if p.len() == 2), "4- and 8-bit layers do not stack");
    let mixed = Linear::concat_outputs(vec![quantized(8, 32, 4), dense(9, 32)]).unwrap();
    assert!(mixed.is_err(), "quantized and dense layers do not stack");
}

/// The kernels' aarch64 NEON paths (quantized matmul, attention), cross-compiled and run under
/// qemu against scalar references (scripts/test-kernel-aarch64; ~30 s). Skipped, loudly, only
/// when the cross toolchain is absent (the script exits 77; scripts/setup installs it on x86-64
/// Debian).
#[test]
fn aarch64_neon_kernel_matches_a_scalar_reference_under_qemu() {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/test-kernel-aarch64");
    let out = std::process::Command::new(&script).output().unwrap_or_else(|e| panic!("{}: {e}", script.display()));
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    if out.status.code() == Some(77) {
        eprintln!("\n{stderr}");
        return;
    }
    assert!(out.status.success(), "{}: {}\n{stdout}\n{stderr}", script.display(), out.status);
    // The kernels' programs (quantized matmul, its int8 form, attention) ran clean.
    assert_eq!(stdout.matches(" 0 mismatching outputs").count(), 3, "{stdout}");
    eprintln!("{stdout}");
}

// --- Int8 activations (`CpuActivations::Int8`): the per-row kernel on x quantized per block.

/// The int8 kernels (`core/mlx-sys/kernels/qmm_int8.cpp`) against a scalar reference of the
/// same integer math, bit for bit on integer inputs and within the float32 reordering bound on
/// quantized float inputs (`kernels/tests/qmm_int8_test.cpp`), built with the system C++
/// compiler as build.rs builds each one and run for every instruction set this CPU has
/// (generic, AVX2, AVX-512 VNNI; the NEON build runs under scripts/test-kernel-aarch64).
#[test]
fn int8_kernels_match_a_scalar_reference_of_their_integer_math() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../core/mlx-sys/kernels");
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let mut isas: Vec<(&str, &[&str])> = vec![("generic", &[])];
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") && std::arch::is_x86_feature_detected!("f16c") {
            isas.push(("avx2", &["-mavx2", "-mfma", "-mf16c"]));
        }
        if std::arch::is_x86_feature_detected!("avx512vnni") && std::arch::is_x86_feature_detected!("avx512vl") && std::arch::is_x86_feature_detected!("avx512bw") {
            isas.push(("avx512vnni", &["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-mavx2", "-mfma", "-mf16c"]));
        }
    }
    let tmp = tempfile::tempdir().unwrap();
    for (isa, flags) in isas {
        let exe = tmp.path().join(format!("qmm-int8-{isa}"));
        let status = std::process::Command::new(&cxx)
            .current_dir(&dir)
            .args(["-std=c++20", "-O3", "-ffp-contract=fast", "-I."])
            .args(flags)
            .arg(format!("-DWEFT_QMM_ISA={isa}"))
            .args(["tests/qmm_int8_test.cpp", "qmm_int8.cpp", "-o"])
            .arg(&exe)
            .status()
            .unwrap_or_else(|e| panic!("{cxx}: {e}"));
        assert!(status.success(), "{cxx} could not build the {isa} int8 kernel test");
        let out = std::process::Command::new(&exe).output().unwrap();
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success() && stdout.contains(" 0 mismatching outputs"), "{isa}:\n{stdout}\n{stderr}");
        eprint!("{stdout}");
    }
}

/// The primitive with int8 activations against MLX's float32 `quantized_matmul`, through each
/// int8 kernel this CPU has: per block of 32 activations the rounding moves each x_k by at most
/// half a step d_b = max |x_b| / 127, so |y_int8 - y| <= sum_b d_b / 2 * sum_{k in b} |w_k|,
/// plus the float32 reordering bound; a row's outputs do not depend on the other rows of the
/// call (bit for bit). From 16 rows (the GEMM path) and with 5-bit weights the float kernel
/// runs: bit-equal to the float activations' call.
#[test]
fn int8_activations_stay_within_their_rounding_bound_of_mlx() {
    use kernels::CpuActivations::{Float, Int8};
    let _cap = hold_isa();
    let mut seen = Vec::new();
    for isa in ["avx512", "avx2", "generic"] {
        kernels::limit_isa(isa).unwrap();
        let got = kernels::int8_isa();
        if seen.contains(&got) {
            continue;
        }
        seen.push(got);
        let mut seed = 300;
        for &bits in &[4, 5, 8] {
            for &group_size in &[32, 64] {
                for &dtype in &[Dtype::Float32, Dtype::Float16] {
                    for (m, k, n) in [(1, 576, 40), (1, 96, 38), (2, 160, 39), (3, 1536, 19), (8, 576, 39), (15, 256, 33), (16, 576, 45)] {
                        let k = k + k % group_size;
                        seed += 2;
                        let w = random(&[n, k], seed);
                        let (wq, scales, biases) = quantize(&w, group_size, bits).unwrap();
                        let x = random(&[m, k], seed + 1).multiply(Array::from_f32(2.0)).unwrap();
                        let (scales, biases) = (scales.as_dtype(dtype).unwrap(), biases.as_dtype(dtype).unwrap());
                        let int8 = to_vec(&kernels::quantized_matmul_with(&x, &wq, &scales, &biases, group_size, bits, Int8).unwrap());
                        let float = to_vec(&kernels::quantized_matmul_with(&x, &wq, &scales, &biases, group_size, bits, Float).unwrap());
                        let what = format!("M={m} K={k} N={n} bits={bits} group={group_size} {dtype:?} ({got})");
                        if bits == 5 || m >= 16 {
                            assert!(int8.iter().zip(&float).all(|(a, b)| a.to_bits() == b.to_bits()), "{what}: float kernel expected");
                            continue;
                        }
                        let f32_ = |a: &Array| a.as_dtype(Dtype::Float32).unwrap();
                        let reference = to_vec(&quantized_matmul(&x, &wq, f32_(&scales), &f32_(&biases), true, group_size, bits).unwrap());
                        let wd = to_vec(&dequantize(&wq, f32_(&scales), &f32_(&biases), group_size, bits).unwrap());
                        let xv = to_vec(&x);
                        let (ku, nu) = (k as usize, n as usize);
                        let mut worst = 0.0f32;
                        let mut differs = false;
                        for mi in 0..m as usize {
                            let xr = &xv[mi * ku..(mi + 1) * ku];
                            for ni in 0..nu {
                                let wr = &wd[ni * ku..(ni + 1) * ku];
                                let (mut bound, mut mag) = (0.0f32, 0.0f32);
                                for b in 0..ku / 32 {
                                    let d = xr[b * 32..b * 32 + 32].iter().fold(0.0f32, |a, v| a.max(v.abs())) / 127.0;
                                    bound += d / 2.0 * wr[b * 32..b * 32 + 32].iter().map(|v| v.abs()).sum::<f32>();
                                }
                                for i in 0..ku {
                                    mag += (xr[i] * wr[i]).abs();
                                }
                                let tol = bound * 1.001 + 2.0 * k as f32 * f32::EPSILON * mag + 1e-6;
                                let (got_v, want) = (int8[mi * nu + ni], reference[mi * nu + ni]);
                                let err = (got_v - want).abs();
                                assert!(err <= tol, "{what}: y[{mi}][{ni}] = {got_v}, mlx {want} (bound {tol})");
                                worst = worst.max(err / tol);
                                differs |= got_v.to_bits() != float[mi * nu + ni].to_bits();
                            }
                        }
                        // As llama.cpp's q8 dot: the dequantized weights times the quantized x
                        // (bias term included), up to float32 reordering.
                        let xq = int8_rounded(&xv, ku);
                        let on_xq = to_vec(&quantized_matmul(&Array::from_slice(&xq, &[m, k]), &wq, f32_(&scales), &f32_(&biases), true, group_size, bits).unwrap());
                        for mi in 0..m as usize {
                            for ni in 0..nu {
                                let mag: f32 = (0..ku).map(|i| (xq[mi * ku + i] * wd[ni * ku + i]).abs()).sum();
                                let tol = 2.0 * k as f32 * f32::EPSILON * mag + 1e-6;
                                let (got_v, want) = (int8[mi * nu + ni], on_xq[mi * nu + ni]);
                                assert!((got_v - want).abs() <= tol, "{what}: y[{mi}][{ni}] = {got_v}, dequantized w . quantized x {want} (tolerance {tol})");
                            }
                        }
                        assert!(differs, "{what}: int8 activations gave the float kernel's outputs bit for bit");
                        if m > 1 {
                            // Each row is quantized and summed on its own: batch-invariant.
                            let row0 = mlx_rs::ops::split_equal(&x, m, 0).unwrap().remove(0);
                            let alone = to_vec(&kernels::quantized_matmul_with(&row0, &wq, &scales, &biases, group_size, bits, Int8).unwrap());
                            assert!(alone.iter().zip(&int8[..nu]).all(|(a, b)| a.to_bits() == b.to_bits()), "{what}: row 0 alone differs");
                        }
                        if m == 1 && k == 576 && dtype == Dtype::Float32 && group_size == 32 {
                            eprintln!("{what}: worst error {worst:.3} of the rounding bound");
                        }
                    }
                }
            }
        }
    }
    kernels::limit_isa("avx512").unwrap();
    eprintln!("int8 kernels checked: {seen:?}");
}

/// x rounded as `quantize_x_int8` rounds it, per block of 32 of each row of `k`: d * q with
/// d = max |x| / 127 and q = x * (1 / d) rounded half away from zero.
fn int8_rounded(x: &[f32], k: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(x.len());
    for block in x.chunks(32) {
        assert_eq!(k % 32, 0);
        let d = block.iter().fold(0.0f32, |a, v| a.max(v.abs())) / 127.0;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        out.extend(block.iter().map(|&v| {
            let v = v * id;
            d * ((v + if v >= 0.0 { 0.5 } else { -0.5 }) as i32).clamp(-127, 127) as f32
        }));
    }
    out
}

#[test]
fn activations_parse() {
    use kernels::CpuActivations;
    assert_eq!("float".parse::<CpuActivations>().unwrap(), CpuActivations::Float);
    assert_eq!("int8".parse::<CpuActivations>().unwrap(), CpuActivations::Int8);
    assert!("int4".parse::<CpuActivations>().is_err());
}

/// Bounds for fast mode with int8 activations against exact mode (the doctrine: a mode no
/// ancestor has is gated against the nearest exact mode), per model: (first-step KL(exact ||
/// int8) in nats, the least share of the float activations' leading greedy agreement with the
/// golden trajectories that int8 must keep). Rounding the activations to 8 bits per block of 32
/// moves logits by orders of magnitude more than float32 reordering (float activations: ~1e-10
/// nats here, KL_BOUND). Measured on this suite's prompts (AVX-512 VNNI, AVX2 and generic give
/// the same integer sums), worst KL / leading agreement int8 vs float: llama-4bit 1.1e-3,
/// 83/120 vs 120/120; qwen3_5-4bit 1.2e-2 (its 1-token prompt), 27/120; qwen3_moe-4bit 9.1e-4,
/// 98/120; qwen3_5_moe-4bit 7.8e-3, 83/120; SmolLM2 (the default model) 3.6e-3, 17/62 vs 62/62.
/// (With the bias term summing the float x rather than the quantized one, as before: 3.9e-3,
/// 0.36, 5.3e-3, 2.2e-2 and 2.8e-2.) The bounds are two to three times the measured KL and half
/// the measured agreement.
const INT8_GATES: [(&str, f64, f64); 5] = [
    ("llama-4bit", 2.5e-3, 0.3),
    ("qwen3_5-4bit", 3e-2, 0.1),
    ("qwen3_moe-4bit", 2e-3, 0.4),
    ("qwen3_5_moe-4bit", 1.5e-2, 0.35),
    ("smollm2", 8e-3, 0.13),
];

/// Exact mode's first step against fast mode with float and with int8 activations, on every
/// golden single case: KL(exact || int8) under `bound`, and the greedy agreement of each with
/// the golden trajectory printed beside the float activations' figures; int8's leading
/// agreement must reach `min_agree` of float's.
fn compare_int8(name: &str, path: &std::path::Path, cases: &[(Vec<u32>, Vec<u32>)], bound: f64, min_agree: f64) {
    use kernels::CpuActivations;
    let exact = loading::load_with(path, &LoadOptions::default().with_cpu_kernels(CpuKernels::Exact)).unwrap();
    let load = |act| loading::load_with(path, &LoadOptions::default().with_cpu_activations(act)).unwrap();
    let (float, int8) = (load(CpuActivations::Float), load(CpuActivations::Int8));
    let vocab = exact.model.info().vocab_size as usize;
    let (mut agree_f, mut agree_i, mut total, mut worst_f, mut worst_i) = (0, 0, 0, 0.0f64, 0.0f64);
    for (prompt, want) in cases {
        let first = GenerateOptions { max_tokens: 1, capture_first_logits: vocab, ..GenerateOptions::default() };
        let e = generate(exact.model.as_ref(), None, prompt, &first, |_| true).unwrap();
        let opts = GenerateOptions { max_tokens: want.len(), capture_first_logits: vocab, ..GenerateOptions::default() };
        let f = generate(float.model.as_ref(), None, prompt, &opts, |_| true).unwrap();
        let i = generate(int8.model.as_ref(), None, prompt, &opts, |_| true).unwrap();
        let (df, di) = (kl(&e.first_logits, &f.first_logits), kl(&e.first_logits, &i.first_logits));
        eprintln!("{name}: {}-token prompt: KL(exact || float) {df:.2e}, KL(exact || int8) {di:.2e}", prompt.len());
        assert!(di < bound, "{name}: {}-token prompt: KL(exact || int8) = {di:e} nats", prompt.len());
        assert!(bit_diffs(&f.first_logits, &i.first_logits) > 0, "{name}: int8 activations computed the float ones' logits");
        worst_f = worst_f.max(df);
        worst_i = worst_i.max(di);
        agree_f += f.tokens.iter().zip(want).take_while(|(a, b)| a == b).count();
        agree_i += i.tokens.iter().zip(want).take_while(|(a, b)| a == b).count();
        total += want.len();
    }
    eprintln!(
        "{name}: worst first-step KL vs exact: float activations {worst_f:.2e}, int8 {worst_i:.2e} nats (bound \
         {bound:e}); greedy agreement with the golden trajectories: float {agree_f}/{total}, int8 {agree_i}/{total}"
    );
    assert!(
        agree_i as f64 >= min_agree * agree_f as f64,
        "{name}: int8 activations kept {agree_i} leading golden tokens, float {agree_f}"
    );
}

/// The tiny quantized models' golden cases and the default model's three shortest chats.
#[test]
fn int8_activations_next_token_distribution_stays_close() {
    for (name, bound, min_agree) in &INT8_GATES[..4] {
        compare_int8(name, &tiny_model_dir(name), &golden_cases(name), *bound, *min_agree);
    }
    let Some(path) = default_model() else { return };
    let g = golden("smollm2");
    let mut cases: Vec<_> = g["chats"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (ids(&c["prompt_ids"]), ids(&c["tokens"])))
        .collect();
    cases.sort_by_key(|(p, _)| p.len());
    cases.truncate(3);
    let (_, bound, min_agree) = INT8_GATES[4];
    compare_int8("smollm2 (Q4_1 GGUF)", &path, &cases, bound, min_agree);
}

/// Teacher-forced next-token logits at every position of `seq`, one token a forward step: the
/// decode path, where fast mode's int8 activations apply (below 16 rows).
fn stepped_logits(model: &dyn weft::language_model::LanguageModel, seq: &[u32]) -> Vec<Vec<f32>> {
    let mut caches = model.make_caches();
    seq.iter()
        .map(|&t| {
            let logits = model.forward(&Array::from_slice(&[t as i32], &[1, 1]), &mut caches).unwrap();
            to_vec(&weft::nn::last_position(&logits).unwrap().as_dtype(Dtype::Float32).unwrap())
        })
        .collect()
}

/// Bounds on the default fast mode (int8 activations) against exact mode, teacher-forced over the
/// default model's golden chats (prompt and answer, 233 positions): (mean KL, worst KL, least
/// top-1 agreement). Measured: mean 4.1e-3, worst 4.9e-2 nats, top-1 227/233; llama.cpp on the
/// same GGUF against exact mode: mean 4.2e-3 nats, top-1 95% (`benches/int8_kl.py`, 844
/// positions of real text; docs/benchmarks.md).
const DEFAULT_FAST_GATE: (f64, f64, f64) = (1e-2, 1e-1, 0.9);

/// The default activations are int8 (llama.cpp's q8: its next-token KL against exact mode is
/// llama.cpp's own on the same GGUF). On the default model, every position of the goldens'
/// chats one token a step (as decode runs): the default fast mode stays within
/// [`DEFAULT_FAST_GATE`] of exact mode, float activations within [`KL_BOUND`], and exact mode
/// ignores the activations (bit for bit whichever is set, and the same numerics).
#[test]
fn default_fast_mode_is_int8_and_stays_within_its_bound_of_exact_on_the_default_model() {
    use kernels::CpuActivations;
    assert_eq!(CpuActivations::default(), CpuActivations::Int8);
    let Some(path) = default_model() else { return };
    let load = |o: LoadOptions| loading::load_with(&path, &o).unwrap();
    let exact = load(LoadOptions::default().with_cpu_kernels(CpuKernels::Exact));
    let fast = load(LoadOptions::default());
    let float = load(LoadOptions::default().with_cpu_activations(CpuActivations::Float));
    assert!(fast.numerics.contains("act=int8"), "{}", fast.numerics);
    let g = golden("smollm2");
    let seqs: Vec<Vec<u32>> = g["chats"].as_array().unwrap().iter().map(|c| [ids(&c["prompt_ids"]), ids(&c["tokens"])].concat()).collect();
    let (mut kls, mut top1, mut worst_float) = (Vec::new(), 0, 0.0f64);
    let argmax = |v: &[f32]| v.iter().enumerate().fold((0, f32::NEG_INFINITY), |a, (i, &x)| if x > a.1 { (i, x) } else { a }).0;
    for seq in &seqs {
        let (e, f, fl) = (stepped_logits(exact.model.as_ref(), seq), stepped_logits(fast.model.as_ref(), seq), stepped_logits(float.model.as_ref(), seq));
        for ((e, f), fl) in e.iter().zip(&f).zip(&fl) {
            kls.push(kl(e, f));
            top1 += (argmax(e) == argmax(f)) as usize;
            worst_float = worst_float.max(kl(e, fl));
        }
    }
    let n = kls.len();
    let mean = kls.iter().sum::<f64>() / n as f64;
    let worst = kls.iter().cloned().fold(0.0, f64::max);
    let agree = top1 as f64 / n as f64;
    eprintln!(
        "smollm2 (Q4_1 GGUF), {n} positions one token a step: KL(exact || default fast) mean {mean:.2e}, worst {worst:.2e} nats, \
         top-1 {top1}/{n}; KL(exact || float activations) worst {worst_float:.2e}"
    );
    let (max_mean, max_worst, min_agree) = DEFAULT_FAST_GATE;
    assert!(mean < max_mean && worst < max_worst && agree >= min_agree, "KL mean {mean:e}, worst {worst:e}, top-1 {agree}");
    assert!(worst_float < KL_BOUND, "float activations: KL {worst_float:e}");
    // Exact mode ignores the activations: the same bits with either set, or left to the default.
    let seq = &seqs[0];
    let want = stepped_logits(exact.model.as_ref(), seq);
    for act in [CpuActivations::Int8, CpuActivations::Float] {
        let m = load(LoadOptions::default().with_cpu_kernels(CpuKernels::Exact).with_cpu_activations(act));
        let got = stepped_logits(m.model.as_ref(), seq);
        assert!(got.iter().zip(&want).all(|(a, b)| bit_diffs(a, b) == 0), "exact mode with {act:?} activations");
        // Its numerics (the prompt-cache files' identity) name float activations, as before.
        assert_eq!(m.numerics, exact.numerics);
        assert!(exact.numerics.contains("act=float"), "{}", exact.numerics);
    }
}
