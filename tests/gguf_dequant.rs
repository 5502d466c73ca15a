//! GGUF block dequantization against gguf-py's reference (goldens/gguf/dequant, made by
//! goldens/make_gguf_dequant_goldens.py): every type Weft expands itself, bit for bit.

use std::path::PathBuf;

use weft::gguf::GgmlType;
use weft::loading::gguf_dequant::{block_geometry, dequantize};

fn goldens() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../goldens/gguf/dequant")
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
        let want: Vec<f32> = std::fs::read(goldens().join(format!("{name}.f32")))
            .unwrap()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
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
