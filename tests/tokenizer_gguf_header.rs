//! GGUF header reader on synthetic files: every value type, tensor infos, the tensor-type check,
//! and corrupt input (truncation, garbage lengths) failing cleanly.

mod tokenizer_support;

use tokenizer_support::{write_str, GgufWriter, Meta, TempDir};
use weft::gguf::{GgmlType, GgufArray, GgufHeader, GgufValue};
use weft::Error;

fn every_value_type() -> GgufWriter {
    GgufWriter::default()
        .kv("general.architecture", Meta::str("llama"))
        .kv("v.u8", Meta::U8(200))
        .kv("v.i8", Meta::I8(-100))
        .kv("v.u16", Meta::U16(60000))
        .kv("v.i16", Meta::I16(-30000))
        .kv("v.u32", Meta::U32(4_000_000_000))
        .kv("v.i32", Meta::I32(-2_000_000_000))
        .kv("v.f32", Meta::F32(1.5))
        .kv("v.bool", Meta::Bool(true))
        .kv("v.str", Meta::str("héllo 世界"))
        .kv("v.u64", Meta::U64(u64::MAX))
        .kv("v.i64", Meta::I64(i64::MIN))
        .kv("v.f64", Meta::F64(-0.25))
        .kv("v.strs", Meta::strs(&["a", "", "<|im_start|>"]))
        .kv("v.ints", Meta::i32s(&[3, -1, 7]))
        .kv("v.u8s", Meta::Array(0, vec![Meta::U8(1), Meta::U8(255)]))
        .kv("v.floats", Meta::Array(6, vec![Meta::F32(0.5), Meta::F32(-2.0)]))
        .kv("v.bools", Meta::Array(7, vec![Meta::Bool(false), Meta::Bool(true)]))
        .kv("v.nested", Meta::Array(9, vec![Meta::Array(4, vec![Meta::U32(1)]), Meta::Array(4, vec![])]))
        .kv("v.empty", Meta::Array(8, vec![]))
        .tensor("token_embd.weight", &[576, 49152], 8)
        .tensor("blk.0.attn_norm.weight", &[576], 0)
        .tensor("blk.0.attn_q.weight", &[576, 576], 3)
}

fn read(writer: &GgufWriter, dir: &TempDir, name: &str) -> weft::Result<GgufHeader> {
    GgufHeader::read(writer.write(&dir.path(name)))
}

fn read_bytes(bytes: &[u8], dir: &TempDir, name: &str) -> weft::Result<GgufHeader> {
    let path = dir.path(name);
    std::fs::write(&path, bytes).unwrap();
    GgufHeader::read(path)
}

fn model_load_message(result: weft::Result<GgufHeader>) -> String {
    match result {
        Err(Error::ModelLoad(message)) => message,
        other => panic!("expected Error::ModelLoad, got {other:?}"),
    }
}

#[test]
fn reads_every_value_type() {
    let dir = TempDir::new("gguf-values");
    let h = read(&every_value_type(), &dir, "values.gguf").unwrap();
    assert_eq!(h.version, 3);
    assert_eq!(h.architecture(), Some("llama"));
    assert_eq!(h.get("v.u8"), Some(&GgufValue::U8(200)));
    assert_eq!(h.get("v.i8"), Some(&GgufValue::I8(-100)));
    assert_eq!(h.get("v.u16"), Some(&GgufValue::U16(60000)));
    assert_eq!(h.get("v.i16"), Some(&GgufValue::I16(-30000)));
    assert_eq!(h.get("v.u32"), Some(&GgufValue::U32(4_000_000_000)));
    assert_eq!(h.get("v.i32"), Some(&GgufValue::I32(-2_000_000_000)));
    assert_eq!(h.get("v.f32"), Some(&GgufValue::F32(1.5)));
    assert_eq!(h.get("v.bool"), Some(&GgufValue::Bool(true)));
    assert_eq!(h.get_str("v.str"), Some("héllo 世界"));
    assert_eq!(h.get("v.u64"), Some(&GgufValue::U64(u64::MAX)));
    assert_eq!(h.get("v.i64"), Some(&GgufValue::I64(i64::MIN)));
    assert_eq!(h.get("v.f64"), Some(&GgufValue::F64(-0.25)));
    assert_eq!(h.get_str_array("v.strs"), Some(vec!["a", "", "<|im_start|>"]));
    assert_eq!(h.get_i64_array("v.ints"), Some(vec![3, -1, 7]));
    assert_eq!(h.get_i64_array("v.u8s"), Some(vec![1, 255]));
    assert_eq!(h.get_f64_array("v.floats"), Some(vec![0.5, -2.0]));
    assert_eq!(h.get("v.bools"), Some(&GgufValue::Array(GgufArray::Bool(vec![false, true]))));
    assert_eq!(h.get("v.u8s"), Some(&GgufValue::Array(GgufArray::U8(vec![1, 255]))));
    assert_eq!(h.get("v.floats").and_then(GgufValue::as_array), Some(&GgufArray::F32(vec![0.5, -2.0])));
    assert_eq!(
        h.get("v.nested"),
        Some(&GgufValue::Array(GgufArray::Array(vec![GgufArray::U32(vec![1]), GgufArray::U32(vec![])])))
    );
    assert_eq!(h.get_str_array("v.empty"), Some(vec![]));
}

#[test]
fn getters_convert_between_numeric_types_and_reject_others() {
    let dir = TempDir::new("gguf-getters");
    let h = read(&every_value_type(), &dir, "getters.gguf").unwrap();
    // Any integer type serves get_u64 / get_i64 when the value fits.
    assert_eq!(h.get_u64("v.u8"), Some(200));
    assert_eq!(h.get_u64("v.u32"), Some(4_000_000_000));
    assert_eq!(h.get_u64("v.u64"), Some(u64::MAX));
    assert_eq!(h.get_u64("v.i8"), None, "negative");
    assert_eq!(h.get_i64("v.i16"), Some(-30000));
    assert_eq!(h.get_i64("v.u64"), None, "does not fit i64");
    assert_eq!(h.get_f64("v.f32"), Some(1.5));
    assert_eq!(h.get_f64("v.i32"), Some(-2_000_000_000.0));
    assert_eq!(h.get_bool("v.bool"), Some(true));
    // Wrong type or missing key: None, never a panic.
    assert_eq!(h.get_str("v.u8"), None);
    assert_eq!(h.get_u64("v.str"), None);
    assert_eq!(h.get_str_array("v.ints"), None);
    assert_eq!(h.get_i64_array("v.strs"), None);
    assert_eq!(h.get_u64("no.such.key"), None);
}

#[test]
fn reads_tensor_infos_and_data_offset() {
    let dir = TempDir::new("gguf-tensors");
    let writer = every_value_type();
    let h = read(&writer, &dir, "tensors.gguf").unwrap();
    let names: Vec<&str> = h.tensors.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["token_embd.weight", "blk.0.attn_norm.weight", "blk.0.attn_q.weight"]);
    assert_eq!(h.tensors[0].dims, [576, 49152]);
    assert_eq!(h.tensors[0].ggml_type, 8);
    assert_eq!(h.tensors[0].type_name(), "Q8_0");
    assert_eq!(h.tensors[1].type_name(), "F32");
    assert_eq!(h.tensors[2].ggml_type(), GgmlType::Q4_1);
    assert_eq!(h.tensors[2].offset, 128);
    // Tensor data starts after the header, at the default 32-byte alignment.
    let file_len = writer.bytes().len() as u64;
    assert_eq!(h.data_offset % 32, 0);
    assert_eq!(h.data_offset, file_len - 64 * 3);
    h.check_supported_tensor_types().unwrap();
}

#[test]
fn honours_general_alignment() {
    let dir = TempDir::new("gguf-alignment");
    let writer = GgufWriter::default().kv("general.alignment", Meta::U32(256)).tensor("t", &[4], 0);
    let h = read(&writer, &dir, "aligned.gguf").unwrap();
    assert_eq!(h.data_offset, 256);
}

#[test]
fn type_names_cover_ggml_types() {
    let names: Vec<(u32, &str)> = vec![
        (0, "F32"),
        (1, "F16"),
        (2, "Q4_0"),
        (3, "Q4_1"),
        (6, "Q5_0"),
        (7, "Q5_1"),
        (8, "Q8_0"),
        (9, "Q8_1"),
        (10, "Q2_K"),
        (11, "Q3_K"),
        (12, "Q4_K"),
        (13, "Q5_K"),
        (14, "Q6_K"),
        (15, "Q8_K"),
        (16, "IQ2_XXS"),
        (17, "IQ2_XS"),
        (18, "IQ3_XXS"),
        (19, "IQ1_S"),
        (20, "IQ4_NL"),
        (21, "IQ3_S"),
        (22, "IQ2_S"),
        (23, "IQ4_XS"),
        (24, "I8"),
        (25, "I16"),
        (26, "I32"),
        (27, "I64"),
        (28, "F64"),
        (29, "IQ1_M"),
        (30, "BF16"),
        (34, "TQ1_0"),
        (35, "TQ2_0"),
        (39, "MXFP4"),
    ];
    for (id, name) in names {
        assert_eq!(GgmlType(id).name(), Some(name));
    }
    assert_eq!(GgmlType(4).name(), None, "Q4_2 was removed from ggml");
    assert_eq!(GgmlType(1000).to_string(), "unknown type id 1000");
}

#[test]
fn unsupported_tensor_type_names_tensor_and_type() {
    let dir = TempDir::new("gguf-unsupported");
    let writer = GgufWriter::default()
        .tensor("token_embd.weight", &[64, 32], 2)
        .tensor("blk.0.attn_q.weight", &[64, 64], 12)
        .tensor("blk.0.attn_k.weight", &[64, 64], 10);
    let h = read(&writer, &dir, "q2k.gguf").unwrap();
    match h.check_supported_tensor_types() {
        Err(Error::Unsupported(message)) => assert_eq!(
            message,
            "GGUF tensor 'blk.0.attn_k.weight' has type Q2_K, which Weft does not support \
             (supported: F32, F16, Q4_0, Q4_1, Q8_0, BF16, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K)"
        ),
        other => panic!("expected Unsupported, got {other:?}"),
    }

    for (ggml_type, shown) in [(20, "type IQ4_NL"), (77, "type unknown type id 77")] {
        let writer = GgufWriter::default().tensor("output.weight", &[8], ggml_type);
        let h = read(&writer, &dir, "other.gguf").unwrap();
        let message = h.check_supported_tensor_types().unwrap_err().to_string();
        assert!(message.contains("'output.weight'") && message.contains(shown), "{message}");
    }
}

#[test]
fn every_truncation_is_a_model_load_error() {
    let dir = TempDir::new("gguf-truncated");
    let bytes = every_value_type().bytes();
    let header_len = read_bytes(&bytes, &dir, "full.gguf").unwrap().data_offset as usize;
    // Cutting anywhere inside the header (but past the magic) must fail cleanly.
    for len in 4..header_len - 32 {
        let message = model_load_message(read_bytes(&bytes[..len], &dir, "cut.gguf"));
        assert!(message.contains("truncated") || message.contains("cannot fit"), "cut at {len}: {message}");
    }
}

#[test]
fn not_a_gguf_file() {
    let dir = TempDir::new("gguf-magic");
    for bytes in [&b""[..], b"GG", b"{\"tokenizer\": 1}"] {
        let message = model_load_message(read_bytes(bytes, &dir, "x.gguf"));
        assert!(message.contains("is not a GGUF file"), "{message}");
    }
    match GgufHeader::read(dir.path("missing.gguf")) {
        Err(Error::Io { path, .. }) => assert!(path.ends_with("missing.gguf")),
        other => panic!("expected Io, got {other:?}"),
    }
}

#[test]
fn unsupported_versions() {
    let dir = TempDir::new("gguf-version");
    for (version, expected) in [(1, "GGUF version 1 is not supported"), (0x0300_0000, "big-endian")] {
        let writer = GgufWriter { version: Some(version), ..Default::default() };
        match read(&writer, &dir, "v.gguf") {
            Err(Error::Unsupported(message)) => assert!(message.contains(expected), "{message}"),
            other => panic!("expected Unsupported, got {other:?}"),
        }
    }
    let v2 = GgufWriter { version: Some(2), ..every_value_type() };
    assert_eq!(read(&v2, &dir, "v2.gguf").unwrap().version, 2);
}

/// A header with one key whose value is written by `write_value` (type id first).
fn one_key(write_value: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut bytes = b"GGUF".to_vec();
    bytes.extend(3u32.to_le_bytes());
    bytes.extend(0u64.to_le_bytes());
    bytes.extend(1u64.to_le_bytes());
    write_str(&mut bytes, "key");
    write_value(&mut bytes);
    bytes.extend([0u8; 64]);
    bytes
}

#[test]
fn garbage_lengths_and_counts_fail_without_allocating() {
    let dir = TempDir::new("gguf-garbage");
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "huge string",
            one_key(|b| {
                b.extend(8u32.to_le_bytes());
                b.extend(u64::MAX.to_le_bytes());
            }),
            "cannot fit",
        ),
        (
            "huge array",
            one_key(|b| {
                b.extend(9u32.to_le_bytes());
                b.extend(8u32.to_le_bytes());
                b.extend((1u64 << 60).to_le_bytes());
            }),
            "cannot fit",
        ),
        ("unknown value type", one_key(|b| b.extend(13u32.to_le_bytes())), "unknown value type 13"),
        (
            "unknown array element type",
            one_key(|b| {
                b.extend(9u32.to_le_bytes());
                b.extend(99u32.to_le_bytes());
                b.extend(1u64.to_le_bytes());
            }),
            "unknown array element type 99",
        ),
        (
            "bad bool",
            one_key(|b| {
                b.extend(7u32.to_le_bytes());
                b.push(2);
            }),
            "bool byte is 2",
        ),
        (
            "invalid utf-8",
            one_key(|b| {
                b.extend(8u32.to_le_bytes());
                write_str(b, "ok");
                let n = b.len();
                b[n - 1] = 0xFF;
            }),
            "not valid UTF-8",
        ),
        (
            "deep nesting",
            one_key(|b| {
                b.extend(9u32.to_le_bytes());
                for _ in 0..20 {
                    b.extend(9u32.to_le_bytes());
                    b.extend(1u64.to_le_bytes());
                }
            }),
            "nested deeper",
        ),
    ];
    for (name, bytes, expected) in cases {
        let message = model_load_message(read_bytes(&bytes, &dir, "garbage.gguf"));
        assert!(message.contains(expected), "{name}: {message}");
    }

    let mut huge_counts = b"GGUF".to_vec();
    huge_counts.extend(3u32.to_le_bytes());
    huge_counts.extend(u64::MAX.to_le_bytes());
    huge_counts.extend(0u64.to_le_bytes());
    assert!(model_load_message(read_bytes(&huge_counts, &dir, "counts.gguf")).contains("tensor count"));

    let too_many_dims = GgufWriter::default().tensor("t", &[1, 2, 3, 4, 5], 0);
    assert!(model_load_message(read(&too_many_dims, &dir, "dims.gguf")).contains("5 dimensions"));

    let zero_alignment = GgufWriter::default().kv("general.alignment", Meta::U32(0));
    assert!(model_load_message(read(&zero_alignment, &dir, "align.gguf")).contains("general.alignment"));
}
