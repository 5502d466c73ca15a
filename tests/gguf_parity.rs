//! GGUF loading: every tensor type Weft reads (F32, F16, Q8_0, Q4_0, Q4_1), with llama.cpp's q/k
//! row permutation (llama) and without it (qwen3), matches mlx-lm token-for-token and bit-exactly
//! on the tiny GGUF goldens of goldens/make_gguf_goldens.py; and malformed GGUF files (an
//! unsupported tensor type, a truncated file, an unknown architecture, a missing tensor or
//! metadata key) fail with an error that names the problem instead of panicking.

mod support;

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use support::*;
use weft::generate::{generate, FinishReason, GenerateOptions};
use weft::gguf::{GgufArray, GgufHeader, GgufValue};
use weft::loading;

/// Every GGUF golden: goldens/gguf/<name>.gguf and goldens/gguf/<name>.json.
const GGUF_GOLDENS: &[&str] =
    &["llama-f32", "llama-f16", "llama-q8_0", "llama-q4_0", "llama-q4_1", "qwen3-q8_0", "mistral-q4_0"];

fn gguf_path(name: &str) -> PathBuf {
    goldens_dir().join("gguf").join(format!("{name}.gguf"))
}

fn check_parity(name: &str) {
    let g = golden(&format!("gguf/{name}"));
    let path = gguf_path(name);
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let sha = format!("{:x}", Sha256::digest(&bytes));
    assert_eq!(sha, g["gguf_sha256"].as_str().unwrap(), "{name}: the .gguf is not the one the golden was made from");

    let loaded = support::load_exact(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
    let info = loaded.model.info();
    let cfg = &g["config"];
    assert_eq!(info.model_type, cfg["model_type"].as_str().unwrap(), "{name}");
    assert_eq!(info.vocab_size as u64, cfg["vocab_size"].as_u64().unwrap(), "{name}");
    assert_eq!(info.hidden_size as u64, cfg["hidden_size"].as_u64().unwrap(), "{name}");
    assert_eq!(info.num_layers as u64, cfg["num_hidden_layers"].as_u64().unwrap(), "{name}");
    assert_eq!(info.kv_heads as u64, cfg["num_key_value_heads"].as_u64().unwrap(), "{name}");
    assert_eq!(info.head_dim as u64, cfg["head_dim"].as_u64().unwrap(), "{name}");
    assert_eq!(loaded.eos_token_ids, vec![cfg["eos_token_id"].as_u64().unwrap() as u32], "{name}: eos");

    let vocab = info.vocab_size as usize;
    for case in g["single"].as_array().unwrap() {
        let prompt = ids(&case["prompt_ids"]);
        let want = ids(&case["tokens"]);
        let opts = GenerateOptions {
            max_tokens: want.len(),
            prefill_step_size: case["prefill_step_size"].as_u64().unwrap() as usize,
            capture_first_logits: vocab,
            ..GenerateOptions::default()
        };
        let out = generate(loaded.model.as_ref(), None, &prompt, &opts, |_| true).unwrap();
        assert_eq!(out.tokens, want, "{name}: tokens for a {}-token prompt", prompt.len());
        assert_eq!(out.finish_reason, FinishReason::Length);
        let logits = floats(&case["first_logits"]);
        assert_eq!(out.first_logits.len(), logits.len(), "{name}");
        let diffs = out.first_logits.iter().zip(&logits).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
        assert_eq!(diffs, 0, "{name}: {diffs} of {vocab} first-step logits differ ({}-token prompt)", prompt.len());
    }
}

#[test]
fn f32_gguf_matches_mlx_lm() {
    check_parity("llama-f32");
}

#[test]
fn f16_gguf_matches_mlx_lm() {
    check_parity("llama-f16");
}

#[test]
fn q8_0_gguf_matches_mlx_lm() {
    check_parity("llama-q8_0");
}

#[test]
fn q4_0_gguf_matches_mlx_lm() {
    check_parity("llama-q4_0");
}

#[test]
fn q4_1_gguf_matches_mlx_lm() {
    check_parity("llama-q4_1");
}

#[test]
fn qwen3_q8_0_gguf_without_qk_permutation_matches_mlx_lm() {
    let g = golden("gguf/qwen3-q8_0");
    assert_eq!(g["qk_permuted"], false);
    check_parity("qwen3-q8_0");
}

#[test]
fn llama_gguf_with_explicit_head_dim_and_one_kv_head_matches_mlx_lm() {
    // head_dim 32 from llama.attention.key_length (hidden 64 / 4 heads would give 16); the k
    // rows are un-permuted over a single KV head.
    let header = GgufHeader::read(gguf_path("mistral-q4_0")).unwrap();
    assert_eq!(header.get_u64("llama.attention.key_length"), Some(32));
    assert_eq!(header.get_u64("llama.attention.head_count_kv"), Some(1));
    check_parity("mistral-q4_0");
}

#[test]
fn goldens_cover_every_supported_tensor_type_with_and_without_permutation() {
    let mut types = std::collections::BTreeSet::new();
    let (mut permuted, mut unpermuted) = (false, false);
    for name in GGUF_GOLDENS {
        let g = golden(&format!("gguf/{name}"));
        let header = GgufHeader::read(gguf_path(name)).unwrap();
        header.check_supported_tensor_types().unwrap();
        for t in &header.tensors {
            types.insert(t.type_name());
            assert_eq!(g["gguf_tensor_types"][&t.name].as_str(), Some(t.type_name()), "{name}: {}", t.name);
        }
        if g["qk_permuted"].as_bool().unwrap() {
            permuted = true;
        } else {
            unpermuted = true;
        }
    }
    let want: std::collections::BTreeSet<&str> =
        weft::gguf::SUPPORTED_TENSOR_TYPES.iter().map(|t| t.name().unwrap()).collect();
    assert_eq!(types, want);
    assert!(permuted && unpermuted);
}

#[test]
fn gguf_tokenizer_metadata_matches_transformers() {
    // llama-q4_1.gguf carries a tiny byte-level BPE (gpt2 / smollm) and a chat template.
    let loaded = support::load_exact(&gguf_path("llama-q4_1")).unwrap();
    let tok = loaded.tokenizer.as_ref().expect("llama-q4_1.gguf has tokenizer metadata");
    assert_eq!(loaded.eos_token_ids, vec![2]);
    let g = golden("gguf/llama-q4_1");
    for case in g["tokenizer"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let got = tok.encode(text, false).unwrap();
        assert_eq!(got, ids(&case["ids"]), "encode {text:?}");
        assert_eq!(tok.decode(&got, false).unwrap(), case["decoded"].as_str().unwrap(), "decode {text:?}");
    }
    for name in ["llama-f32", "qwen3-q8_0"] {
        assert!(support::load_exact(&gguf_path(name)).unwrap().tokenizer.is_none(), "{name}");
    }
}

// ---------------------------------------------------------------------------------------------
// Malformed GGUF files, made by rewriting a valid one.
// ---------------------------------------------------------------------------------------------

/// A parsed GGUF file that can be edited and written back (GGUF v3, alignment 32).
struct Gguf {
    metadata: Vec<(String, GgufValue)>,
    /// (name, ggml dims, ggml type, data)
    tensors: Vec<(String, Vec<u64>, u32, Vec<u8>)>,
}

/// Bytes of `dims` elements of ggml type `ty` (block size, bytes per block).
fn tensor_nbytes(dims: &[u64], ty: u32) -> usize {
    let n: u64 = dims.iter().product();
    let (block, bytes) = match ty {
        0 => (1, 4),     // F32
        1 | 30 => (1, 2), // F16, BF16
        2 => (32, 18),   // Q4_0
        3 => (32, 20),   // Q4_1
        6 => (32, 22),   // Q5_0
        8 => (32, 34),   // Q8_0
        9 => (32, 36),   // Q8_1
        10 => (256, 84), // Q2_K
        11 => (256, 110), // Q3_K
        20 => (32, 18),  // IQ4_NL
        12 => (256, 144), // Q4_K
        14 => (256, 210), // Q6_K
        other => panic!("no size for ggml type {other}"),
    };
    assert_eq!(n % block, 0);
    (n / block * bytes) as usize
}

impl Gguf {
    fn read(path: &Path) -> Self {
        let header = GgufHeader::read(path).unwrap();
        let bytes = std::fs::read(path).unwrap();
        let tensors = header
            .tensors
            .iter()
            .map(|t| {
                let start = (header.data_offset + t.offset) as usize;
                let data = bytes[start..start + tensor_nbytes(&t.dims, t.ggml_type)].to_vec();
                (t.name.clone(), t.dims.clone(), t.ggml_type, data)
            })
            .collect();
        Gguf { metadata: header.metadata.into_iter().collect(), tensors }
    }

    fn set(&mut self, key: &str, value: GgufValue) {
        match self.metadata.iter_mut().find(|(k, _)| k == key) {
            Some(kv) => kv.1 = value,
            None => self.metadata.push((key.to_string(), value)),
        }
    }

    fn remove_key(&mut self, key: &str) {
        let before = self.metadata.len();
        self.metadata.retain(|(k, _)| k != key);
        assert_eq!(self.metadata.len(), before - 1, "no key {key}");
    }

    fn remove_tensor(&mut self, name: &str) {
        let before = self.tensors.len();
        self.tensors.retain(|t| t.0 != name);
        assert_eq!(self.tensors.len(), before - 1, "no tensor {name}");
    }

    /// Re-types tensor `name` as ggml type `ty` with (arbitrary) data of the right size.
    fn retype(&mut self, name: &str, ty: u32) {
        let t = self.tensors.iter_mut().find(|t| t.0 == name).unwrap_or_else(|| panic!("no tensor {name}"));
        t.2 = ty;
        t.3 = (0..tensor_nbytes(&t.1, ty)).map(|i| (i * 7 % 251) as u8).collect();
    }

    fn bytes(&self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(3u32.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend((self.metadata.len() as u64).to_le_bytes());
        for (key, value) in &self.metadata {
            put_str(&mut out, key);
            out.extend(value_type(value).to_le_bytes());
            put_value(&mut out, value);
        }
        let mut offset = 0u64;
        for (name, dims, ty, data) in &self.tensors {
            put_str(&mut out, name);
            out.extend((dims.len() as u32).to_le_bytes());
            for d in dims {
                out.extend(d.to_le_bytes());
            }
            out.extend(ty.to_le_bytes());
            out.extend(offset.to_le_bytes());
            offset += (data.len() as u64).div_ceil(32) * 32;
        }
        for (_, _, _, data) in &self.tensors {
            out.resize(out.len().div_ceil(32) * 32, 0);
            out.extend(data);
        }
        out
    }

    fn write(&self, dir: &TempDir, file: &str) -> PathBuf {
        let path = dir.0.join(file);
        std::fs::write(&path, self.bytes()).unwrap();
        path
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

fn value_type(v: &GgufValue) -> u32 {
    match v {
        GgufValue::U8(_) => 0,
        GgufValue::I8(_) => 1,
        GgufValue::U16(_) => 2,
        GgufValue::I16(_) => 3,
        GgufValue::U32(_) => 4,
        GgufValue::I32(_) => 5,
        GgufValue::F32(_) => 6,
        GgufValue::Bool(_) => 7,
        GgufValue::String(_) => 8,
        GgufValue::Array(_) => 9,
        GgufValue::U64(_) => 10,
        GgufValue::I64(_) => 11,
        GgufValue::F64(_) => 12,
    }
}

fn put_value(out: &mut Vec<u8>, v: &GgufValue) {
    match v {
        GgufValue::U8(x) => out.push(*x),
        GgufValue::I8(x) => out.extend(x.to_le_bytes()),
        GgufValue::U16(x) => out.extend(x.to_le_bytes()),
        GgufValue::I16(x) => out.extend(x.to_le_bytes()),
        GgufValue::U32(x) => out.extend(x.to_le_bytes()),
        GgufValue::I32(x) => out.extend(x.to_le_bytes()),
        GgufValue::F32(x) => out.extend(x.to_le_bytes()),
        GgufValue::Bool(x) => out.push(*x as u8),
        GgufValue::String(s) => put_str(out, s),
        GgufValue::Array(a) => put_array(out, a),
        GgufValue::U64(x) => out.extend(x.to_le_bytes()),
        GgufValue::I64(x) => out.extend(x.to_le_bytes()),
        GgufValue::F64(x) => out.extend(x.to_le_bytes()),
    }
}

fn put_array(out: &mut Vec<u8>, a: &GgufArray) {
    fn each<T>(out: &mut Vec<u8>, ty: u32, v: &[T], mut put: impl FnMut(&mut Vec<u8>, &T)) {
        out.extend(ty.to_le_bytes());
        out.extend((v.len() as u64).to_le_bytes());
        for x in v {
            put(out, x);
        }
    }
    match a {
        GgufArray::U8(v) => each(out, 0, v, |o, x| o.push(*x)),
        GgufArray::I8(v) => each(out, 1, v, |o, x| o.extend(x.to_le_bytes())),
        GgufArray::U16(v) => each(out, 2, v, |o, x| o.extend(x.to_le_bytes())),
        GgufArray::I16(v) => each(out, 3, v, |o, x| o.extend(x.to_le_bytes())),
        GgufArray::U32(v) => each(out, 4, v, |o, x| o.extend(x.to_le_bytes())),
        GgufArray::I32(v) => each(out, 5, v, |o, x| o.extend(x.to_le_bytes())),
        GgufArray::F32(v) => each(out, 6, v, |o, x| o.extend(x.to_le_bytes())),
        GgufArray::Bool(v) => each(out, 7, v, |o, x| o.push(*x as u8)),
        GgufArray::String(v) => each(out, 8, v, |o, x| put_str(o, x)),
        GgufArray::Array(v) => each(out, 9, v, |o, x| put_array(o, x)),
        GgufArray::U64(v) => each(out, 10, v, |o, x| o.extend(x.to_le_bytes())),
        GgufArray::I64(v) => each(out, 11, v, |o, x| o.extend(x.to_le_bytes())),
        GgufArray::F64(v) => each(out, 12, v, |o, x| o.extend(x.to_le_bytes())),
    }
}

/// A fresh directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("weft-gguf-{name}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `loading::load` must fail; returns the error message.
fn load_err(path: &Path) -> String {
    match support::load_exact(path) {
        Ok(_) => panic!("{} loaded, expected an error", path.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn rewritten_gguf_is_still_a_valid_model() {
    // The rewriter itself must be faithful, or the failures below would prove nothing.
    let dir = TempDir::new("rewrite");
    let path = Gguf::read(&gguf_path("qwen3-q8_0")).write(&dir, "copy.gguf");
    let loaded = support::load_exact(&path).unwrap();
    let g = golden("gguf/qwen3-q8_0");
    let case = &g["single"][1];
    let want = ids(&case["tokens"]);
    let opts = GenerateOptions { max_tokens: want.len(), ..GenerateOptions::default() };
    let out = generate(loaded.model.as_ref(), None, &ids(&case["prompt_ids"]), &opts, |_| true).unwrap();
    assert_eq!(out.tokens, want);
}

#[test]
fn unsupported_tensor_type_is_named_with_its_tensor() {
    let dir = TempDir::new("types");
    // ffn_down of llama-q8_0 is [128 rows, 256 columns]: 256 fits the K-quant super-block.
    // (Q4_K, Q6_K, BF16, Q5_0 and friends load dequantized; these do not load at all.)
    for (ty, ty_name) in [(10, "Q2_K"), (11, "Q3_K"), (20, "IQ4_NL"), (9, "Q8_1")] {
        let mut g = Gguf::read(&gguf_path("llama-q8_0"));
        g.retype("blk.1.ffn_down.weight", ty);
        let path = g.write(&dir, &format!("{ty_name}.gguf"));
        let msg = load_err(&path);
        assert!(msg.contains("blk.1.ffn_down.weight") && msg.contains(ty_name), "{ty_name}: {msg}");
    }
}

#[test]
fn truncated_gguf_is_an_error_not_a_crash() {
    let dir = TempDir::new("truncated");
    let src = gguf_path("llama-q4_0");
    let bytes = std::fs::read(&src).unwrap();
    let header = GgufHeader::read(&src).unwrap();
    let data_offset = header.data_offset as usize;
    let last = header.tensors.iter().max_by_key(|t| t.offset).unwrap();
    let cuts = [
        ("half", bytes.len() / 2),
        ("in-the-header", 100),
        ("in-the-tensor-table", data_offset - 40),
        ("tensor-data-start", data_offset),
        ("inside-the-last-tensor", data_offset + last.offset as usize + 10),
        ("one-byte-short", bytes.len() - 1),
    ];
    for (what, len) in cuts {
        let path = dir.0.join(format!("{what}.gguf"));
        std::fs::write(&path, &bytes[..len]).unwrap();
        let msg = load_err(&path);
        eprintln!("truncated ({what}, {len} of {} bytes): {msg}", bytes.len());
        assert!(msg.contains("truncated") || msg.contains("corrupt"), "{what}: {msg}");
        if len >= data_offset {
            // The header is whole: the error names a tensor whose data is cut off.
            assert!(header.tensors.iter().any(|t| msg.contains(&format!("'{}'", t.name))), "{what}: {msg}");
        }
    }
}

#[test]
fn unknown_architecture_is_named() {
    let dir = TempDir::new("arch");
    let mut g = Gguf::read(&gguf_path("qwen3-q8_0"));
    g.set("general.architecture", GgufValue::String("mamba9".into()));
    let msg = load_err(&g.write(&dir, "arch.gguf"));
    assert!(msg.contains("mamba9"), "{msg}");

    let mut g = Gguf::read(&gguf_path("qwen3-q8_0"));
    g.remove_key("general.architecture");
    let msg = load_err(&g.write(&dir, "no-arch.gguf"));
    assert!(msg.contains("general.architecture"), "{msg}");
}

#[test]
fn missing_tensor_is_named() {
    let dir = TempDir::new("missing");
    for (src, name) in [
        ("qwen3-q8_0", "blk.1.ffn_up.weight"),
        ("qwen3-q8_0", "blk.0.attn_k_norm.weight"),
        ("llama-q4_0", "blk.2.attn_q.weight"),
        ("llama-f16", "output_norm.weight"),
        ("llama-f32", "token_embd.weight"),
    ] {
        let mut g = Gguf::read(&gguf_path(src));
        g.remove_tensor(name);
        let msg = load_err(&g.write(&dir, &format!("{src}-{name}.gguf")));
        assert!(msg.contains(name), "{src} without {name}: {msg}");
    }
}

#[test]
fn missing_or_unknown_parts_are_named() {
    let dir = TempDir::new("parts");
    // A required hyperparameter.
    let mut g = Gguf::read(&gguf_path("llama-q8_0"));
    g.remove_key("llama.embedding_length");
    let msg = load_err(&g.write(&dir, "no-hidden.gguf"));
    assert!(msg.contains("llama.embedding_length"), "{msg}");

    // A tensor llama.cpp names but our architectures do not have.
    let mut g = Gguf::read(&gguf_path("qwen3-q8_0"));
    let extra = g.tensors.iter().find(|t| t.0 == "blk.0.ffn_up.weight").unwrap().clone();
    g.tensors.push(("blk.0.ffn_gate_exps.weight".into(), extra.1, extra.2, extra.3));
    let msg = load_err(&g.write(&dir, "extra.gguf"));
    assert!(msg.contains("blk.0.ffn_gate_exps.weight"), "{msg}");

    // A block beyond block_count.
    let mut g = Gguf::read(&gguf_path("qwen3-q8_0"));
    g.set("qwen3.block_count", GgufValue::U32(1));
    let msg = load_err(&g.write(&dir, "fewer-blocks.gguf"));
    assert!(msg.contains("blk.1.") && msg.contains("block_count"), "{msg}");
}

/// Weft reads GGUF tensors itself (read-only); for files of MLX's types they must be what MLX's
/// own reader gives, tensor for tensor: same names, shapes and values (quantized triples
/// included; scale dtypes may differ, values may not).
#[test]
fn gguf_tensors_equal_mlx_readers_tensors() {
    for name in GGUF_GOLDENS {
        let path = gguf_path(name);
        let mlx = mlx_rs::io::GgufFile::load(&path).unwrap().arrays().unwrap();
        let ours: std::collections::HashMap<String, mlx_rs::Array> =
            loading::gguf_tensors(&path, loading::GgufWeights::Native).unwrap().into_iter().collect();
        assert_eq!(ours.len(), mlx.len(), "{name}: tensor count");
        for (tensor, want) in mlx.iter() {
            let got = ours.get(&tensor.to_string()).unwrap_or_else(|| panic!("{name}: no {tensor}"));
            assert_eq!(got.shape(), want.shape(), "{name}: {tensor} shape");
            if want.dtype() == mlx_rs::Dtype::Uint32 {
                assert_eq!(got.dtype(), mlx_rs::Dtype::Uint32, "{name}: {tensor}");
                assert_eq!(got.as_slice::<u32>(), want.as_slice::<u32>(), "{name}: {tensor} codes");
            } else {
                let f = |a: &mlx_rs::Array| a.as_dtype(mlx_rs::Dtype::Float32).unwrap().as_slice::<f32>().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                assert!(f(got) == f(want), "{name}: {tensor} values differ");
            }
        }
    }
}

/// This thread's effective capabilities without CAP_DAC_OVERRIDE / CAP_DAC_READ_SEARCH while
/// alive (Linux capabilities are per thread): as root, permission bits then bind as they do
/// for any user, so a 0444 file cannot be opened for writing.
struct NoDacOverride(Option<[CapData; 2]>);

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

impl NoDacOverride {
    fn new() -> Self {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return NoDacOverride(None);
        }
        const VERSION_3: u32 = 0x2008_0522;
        const DAC: u32 = (1 << 1) | (1 << 2); // CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
        let mut header = CapHeader { version: VERSION_3, pid: 0 };
        let mut saved = [CapData::default(); 2];
        // SAFETY: capget/capset with a v3 header and two data structs, for this thread (pid 0).
        unsafe {
            assert_eq!(libc::syscall(libc::SYS_capget, &mut header, saved.as_mut_ptr()), 0, "capget");
            let mut dropped = saved;
            dropped[0].effective &= !DAC;
            assert_eq!(libc::syscall(libc::SYS_capset, &mut header, dropped.as_ptr()), 0, "capset");
        }
        NoDacOverride(Some(saved))
    }
}

impl Drop for NoDacOverride {
    fn drop(&mut self) {
        if let Some(saved) = self.0 {
            let mut header = CapHeader { version: 0x2008_0522, pid: 0 };
            // SAFETY: as in `new`; restores this thread's effective set.
            unsafe { libc::syscall(libc::SYS_capset, &mut header, saved.as_ptr()) };
        }
    }
}

/// issue 27: a GGUF the process may only read (mode 0444 in a 0555 directory: an app bundle, a
/// read-only mount) loads, and generates exactly what the writable copy does. MLX's GGUF reader
/// opened the file read-write ("gguf_init failed"); as root the test drops this thread's DAC
/// override so the permission bits bind (checked: opening the file for writing fails).
#[test]
fn read_only_gguf_loads_like_a_writable_one() {
    use std::os::unix::fs::PermissionsExt;
    for name in ["llama-q4_0", "llama-f16"] {
        let tmp = TempDir::new(&format!("ro-{name}"));
        let dir = tmp.0.join("bundle");
        std::fs::create_dir(&dir).unwrap();
        let path = dir.join("model.gguf");
        std::fs::copy(gguf_path(name), &path).unwrap();
        let run = |path: &Path| {
            let loaded = loading::load(path).unwrap_or_else(|e| panic!("{name}: {e}"));
            let opts = GenerateOptions { max_tokens: 8, capture_first_logits: 16, ..GenerateOptions::default() };
            let out = generate(loaded.model.as_ref(), None, &[1, 5, 9, 2], &opts, |_| true).unwrap();
            (out.tokens, out.first_logits.iter().map(|v| v.to_bits()).collect::<Vec<_>>())
        };
        let writable = run(&path);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o444)).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o555)).unwrap();
        let read_only = {
            let _dac = NoDacOverride::new();
            let e = std::fs::OpenOptions::new().read(true).write(true).open(&path).expect_err("the copy is writable");
            assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied, "{name}");
            run(&path)
        };
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(read_only, writable, "{name}: the read-only load differs");
    }
}
