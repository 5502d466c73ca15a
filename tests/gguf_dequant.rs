//! GGUF block dequantization against gguf-py's reference (goldens/gguf/dequant, made by
//! goldens/make_gguf_dequant_goldens.py): every type Weft expands itself, bit for bit; and the
//! 5-bit types, repacked to MLX's 5-bit affine form, through Weft's fast CPU kernel.

use std::path::PathBuf;

use weft::gguf::GgmlType;
use weft::loading::gguf_affine::{repack, GROUP_SIZE};
use weft::loading::gguf_dequant::{block_geometry, dequantize};

fn goldens() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../goldens/gguf/dequant")
}

fn reference_values(name: &str) -> Vec<f32> {
    std::fs::read(goldens().join(format!("{name}.f32")))
        .unwrap()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

#[test]
fn every_block_type_matches_gguf_py_bit_for_bit() {
    let types = [
        ("Q4_0", GgmlType::Q4_0),
        ("Q4_1", GgmlType::Q4_1),
        ("Q5_0", GgmlType::Q5_0),
        ("Q5_1", GgmlType::Q5_1),
        ("Q8_0", GgmlType::Q8_0),
        ("Q4_K", GgmlType::Q4_K),
        ("Q5_K", GgmlType::Q5_K),
        ("Q6_K", GgmlType::Q6_K),
    ];
    for (name, t) in types {
        let raw = std::fs::read(goldens().join(format!("{name}.bin"))).unwrap();
        let want = reference_values(name);
        let (elems, bytes) = block_geometry(t).unwrap();
        assert_eq!(raw.len() / bytes * elems, want.len(), "{name}: golden sizes");
        let got = dequantize(t, &raw, want.len()).unwrap();
        let mismatches = got.iter().zip(&want).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
        assert_eq!(mismatches, 0, "{name}: {mismatches} of {} values differ from gguf-py", want.len());
    }
}

#[test]
fn sizes_that_are_not_whole_blocks_are_errors_not_panics() {
    let err = dequantize(GgmlType::Q4_K, &[0u8; 100], 256).unwrap_err();
    assert!(err.to_string().contains("does not hold 256 elements"), "{err}");
    let err = dequantize(GgmlType::Q6_K, &[0u8; 210], 200).unwrap_err();
    assert!(err.to_string().contains("210 bytes"), "{err}");
    let err = dequantize(GgmlType::Q2_K, &[], 0).unwrap_err();
    assert!(err.to_string().contains("Q2_K"), "{err}");
}

/// Q5_0 / Q5_1 / Q5_K stay 5-bit in fast mode: their repacked codes (MLX's 5-bit bit stream)
/// through Weft's kernel give MLX's quantized matmul on the same arrays within the float32
/// reordering bound (K eps32 sum |x w|), and both give x times gguf-py's values.
#[test]
fn five_bit_blocks_run_through_the_fast_kernel_as_mlx_quantized_matmul() {
    use mlx_rs::ops::{abs, quantized_matmul};
    use mlx_rs::Array;
    let cols = 256usize;
    for (name, t) in [("Q5_0", GgmlType::Q5_0), ("Q5_1", GgmlType::Q5_1), ("Q5_K", GgmlType::Q5_K)] {
        let raw = std::fs::read(goldens().join(format!("{name}.bin"))).unwrap();
        let values = reference_values(name);
        let rows = (values.len() / cols) as i32;
        let a = repack(t, &raw, cols).unwrap();
        assert_eq!(a.bits, 5, "{name}");
        assert_eq!(a.packed.len(), values.len() * 5 / 32, "{name}: five bits a weight");
        let groups = (cols / GROUP_SIZE) as i32;
        let w = Array::from_slice(&a.packed, &[rows, (cols * 5 / 32) as i32]);
        let s = Array::from_slice(&a.scales, &[rows, groups]);
        let b = Array::from_slice(&a.biases, &[rows, groups]);
        let key = mlx_rs::random::key(7).unwrap();
        for m in [1, 6] {
            let x = mlx_rs::random::normal::<f32>(&[m, cols as i32], None, None, &key).unwrap();
            let fast = weft::kernels::quantized_matmul(&x, &w, &s, &b, GROUP_SIZE as i32, 5).unwrap();
            let mlx = quantized_matmul(&x, &w, &s, &b, true, GROUP_SIZE as i32, 5).unwrap();
            let dense = Array::from_slice(&values, &[rows, cols as i32]);
            let mag = abs(&x).unwrap().matmul(abs(&dense).unwrap().t()).unwrap();
            let expanded = x.matmul(dense.t()).unwrap();
            let v = |a: &Array| {
                a.eval().unwrap();
                a.as_slice::<f32>().to_vec()
            };
            let (fast, mlx, mag, expanded) = (v(&fast), v(&mlx), v(&mag), v(&expanded));
            for i in 0..fast.len() {
                let tol = cols as f32 * f32::EPSILON * mag[i] + 1e-6;
                assert!((fast[i] - mlx[i]).abs() <= tol, "{name} m={m}: [{i}] fast {} vs mlx {}", fast[i], mlx[i]);
                assert!((fast[i] - expanded[i]).abs() <= tol, "{name} m={m}: [{i}] fast {} vs x w {}", fast[i], expanded[i]);
            }
        }
    }
}
