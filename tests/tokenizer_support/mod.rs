//! Shared by the tokenizer_* tests: a small GGUF writer, a tiny synthetic byte-level BPE
//! vocabulary, temporary directories, and where to find the real SmolLM2 GGUF.
#![allow(dead_code)] // each test crate uses its own subset

use std::path::{Path, PathBuf};

/// A metadata value to write; `Array` holds its element type id and elements of that type.
#[derive(Clone, Debug)]
pub enum Meta {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    Str(String),
    Array(u32, Vec<Meta>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl Meta {
    pub fn type_id(&self) -> u32 {
        match self {
            Meta::U8(_) => 0,
            Meta::I8(_) => 1,
            Meta::U16(_) => 2,
            Meta::I16(_) => 3,
            Meta::U32(_) => 4,
            Meta::I32(_) => 5,
            Meta::F32(_) => 6,
            Meta::Bool(_) => 7,
            Meta::Str(_) => 8,
            Meta::Array(..) => 9,
            Meta::U64(_) => 10,
            Meta::I64(_) => 11,
            Meta::F64(_) => 12,
        }
    }

    pub fn str(s: &str) -> Meta {
        Meta::Str(s.to_string())
    }

    pub fn strs<S: AsRef<str>>(items: &[S]) -> Meta {
        Meta::Array(8, items.iter().map(|s| Meta::str(s.as_ref())).collect())
    }

    pub fn i32s(items: &[i32]) -> Meta {
        Meta::Array(5, items.iter().map(|&v| Meta::I32(v)).collect())
    }

    fn write_payload(&self, out: &mut Vec<u8>) {
        match self {
            Meta::U8(v) => out.push(*v),
            Meta::I8(v) => out.extend(v.to_le_bytes()),
            Meta::U16(v) => out.extend(v.to_le_bytes()),
            Meta::I16(v) => out.extend(v.to_le_bytes()),
            Meta::U32(v) => out.extend(v.to_le_bytes()),
            Meta::I32(v) => out.extend(v.to_le_bytes()),
            Meta::F32(v) => out.extend(v.to_le_bytes()),
            Meta::Bool(v) => out.push(u8::from(*v)),
            Meta::Str(s) => write_str(out, s),
            Meta::Array(element_type, items) => {
                out.extend(element_type.to_le_bytes());
                out.extend((items.len() as u64).to_le_bytes());
                for item in items {
                    item.write_payload(out);
                }
            }
            Meta::U64(v) => out.extend(v.to_le_bytes()),
            Meta::I64(v) => out.extend(v.to_le_bytes()),
            Meta::F64(v) => out.extend(v.to_le_bytes()),
        }
    }
}

pub fn write_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

pub struct TensorSpec {
    pub name: String,
    pub dims: Vec<u64>,
    pub ggml_type: u32,
    pub offset: u64,
}

/// Builds GGUF v3 bytes (header plus `data_len` zero bytes of "tensor data" after alignment).
#[derive(Default)]
pub struct GgufWriter {
    pub version: Option<u32>,
    pub metadata: Vec<(String, Meta)>,
    pub tensors: Vec<TensorSpec>,
}

impl GgufWriter {
    pub fn kv(mut self, key: &str, value: Meta) -> Self {
        self.metadata.push((key.to_string(), value));
        self
    }

    pub fn tensor(mut self, name: &str, dims: &[u64], ggml_type: u32) -> Self {
        let offset = self.tensors.len() as u64 * 64;
        self.tensors.push(TensorSpec { name: name.to_string(), dims: dims.to_vec(), ggml_type, offset });
        self
    }

    pub fn bytes(&self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(self.version.unwrap_or(3).to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend((self.metadata.len() as u64).to_le_bytes());
        for (key, value) in &self.metadata {
            write_str(&mut out, key);
            out.extend(value.type_id().to_le_bytes());
            value.write_payload(&mut out);
        }
        for t in &self.tensors {
            write_str(&mut out, &t.name);
            out.extend((t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend(d.to_le_bytes());
            }
            out.extend(t.ggml_type.to_le_bytes());
            out.extend(t.offset.to_le_bytes());
        }
        out.resize(out.len().div_ceil(32) * 32, 0);
        out.extend(vec![0u8; 64 * self.tensors.len()]);
        out
    }

    pub fn write(&self, path: &Path) -> PathBuf {
        std::fs::write(path, self.bytes()).expect("write test GGUF");
        path.to_path_buf()
    }
}

/// A fresh directory under the system temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> Self {
        // Tests run in parallel threads of one process: the counter keeps their directories apart.
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("weft-{name}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create temp dir");
        TempDir(dir)
    }

    pub fn path(&self, file: &str) -> PathBuf {
        self.0.join(file)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// GPT-2's byte → character map, to spell a tiny byte-level vocabulary.
pub fn byte_char(byte: u8) -> char {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    if printable(byte) {
        return char::from(byte);
    }
    let rank = (0..byte).filter(|&b| !printable(b)).count() as u32;
    char::from_u32(0x100 + rank).unwrap()
}

/// A tiny byte-level BPE vocabulary: the 256 byte tokens (ids 0..=255 in byte order), then merged
/// tokens, then special tokens. Returned as (tokens, merges, token types).
pub fn tiny_vocab() -> (Vec<String>, Vec<String>, Vec<i32>) {
    let mut tokens: Vec<String> = (0..=255u8).map(|b| byte_char(b).to_string()).collect();
    let merges: Vec<&str> =
        vec!["h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld", "1 2", "12 3", "Ã ©"];
    for merge in &merges {
        tokens.push(merge.replace(' ', ""));
    }
    let mut types = vec![1; tokens.len()];
    for (special, token_type) in [("<|endoftext|>", 3), ("<|im_start|>", 3), ("<|im_end|>", 3), ("<think>", 4)] {
        tokens.push(special.to_string());
        types.push(token_type);
    }
    (tokens, merges.into_iter().map(str::to_string).collect(), types)
}

pub const TINY_TEMPLATE: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// A GGUF writer holding the tiny vocabulary as `tokenizer.ggml.*` metadata with `pre`.
pub fn tiny_tokenizer_gguf(pre: &str) -> GgufWriter {
    let (tokens, merges, types) = tiny_vocab();
    let id = |t: &str| tokens.iter().position(|x| x == t).unwrap() as u32;
    GgufWriter::default()
        .kv("general.architecture", Meta::str("llama"))
        .kv("tokenizer.ggml.model", Meta::str("gpt2"))
        .kv("tokenizer.ggml.pre", Meta::str(pre))
        .kv("tokenizer.ggml.bos_token_id", Meta::U32(id("<|im_start|>")))
        .kv("tokenizer.ggml.eos_token_id", Meta::U32(id("<|im_end|>")))
        .kv("tokenizer.ggml.eot_token_id", Meta::U32(id("<|endoftext|>")))
        .kv("tokenizer.ggml.padding_token_id", Meta::U32(id("<|endoftext|>")))
        .kv("tokenizer.chat_template", Meta::str(TINY_TEMPLATE))
        .kv("tokenizer.ggml.tokens", Meta::strs(&tokens))
        .kv("tokenizer.ggml.merges", Meta::strs(&merges))
        .kv("tokenizer.ggml.token_type", Meta::i32s(&types))
}

/// The real SmolLM2 GGUF: `$WEFT_TEST_SMOLLM2_GGUF`, else the default model cache. When neither
/// exists the caller skips, unless `WEFT_REQUIRE_DEFAULT_MODEL=1` makes that a failure.
pub fn smollm2_gguf() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("WEFT_TEST_SMOLLM2_GGUF").filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        assert!(path.is_file(), "WEFT_TEST_SMOLLM2_GGUF={} does not exist", path.display());
        return Some(path);
    }
    use weft::model_store::{DefaultModel, ModelStore};
    if let Some(path) = ModelStore::from_env().cached(&DefaultModel::smollm2()) {
        return Some(path);
    }
    let message = "SmolLM2 GGUF not found: run `weft pull` (or set WEFT_TEST_SMOLLM2_GGUF)";
    if std::env::var("WEFT_REQUIRE_DEFAULT_MODEL").as_deref() == Ok("1") {
        panic!("{message} (required because WEFT_REQUIRE_DEFAULT_MODEL=1)");
    }
    // Straight to stderr: the test harness captures eprintln! of passing tests.
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "\n!!!!!!!! SKIPPING: {message} !!!!!!!!\n");
    None
}

/// Deterministic pseudo-random ids below `bound` (xorshift), for property checks.
pub fn random_ids(seed: u64, len: usize, bound: u32) -> Vec<u32> {
    let mut state = seed.max(1);
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % u64::from(bound)) as u32
        })
        .collect()
}

/// Streams `ids` through a [`weft::tokenizer::StreamDecoder`] and checks the streaming
/// invariants against `decode(ids)`: no chunk is empty, none holds U+FFFD unless the full decode
/// does, and when the full decode is valid UTF-8 the chunks concatenate to it. Returns the
/// streamed and the full text.
pub fn check_stream(
    tokenizer: &weft::tokenizer::Tokenizer,
    ids: &[u32],
    skip_special_tokens: bool,
) -> (String, String) {
    let full = tokenizer.decode(ids, skip_special_tokens).unwrap();
    let mut decoder = weft::tokenizer::StreamDecoder::new(tokenizer, skip_special_tokens);
    let mut streamed = String::new();
    for &id in ids {
        if let Some(chunk) = decoder.step(id).unwrap() {
            assert!(!chunk.is_empty());
            assert!(full.contains('\u{FFFD}') || !chunk.contains('\u{FFFD}'), "chunk {chunk:?} of {full:?}");
            streamed += &chunk;
        }
    }
    streamed += &decoder.flush().unwrap();
    if !full.contains('\u{FFFD}') {
        assert_eq!(streamed, full, "ids {ids:?}");
    }
    (streamed, full)
}

/// [`check_stream`] for byte-level BPE, whose lossy decoding never rewrites earlier text: the
/// chunks concatenate to the full decode even when it holds U+FFFD.
pub fn check_stream_exact(tokenizer: &weft::tokenizer::Tokenizer, ids: &[u32], skip_special_tokens: bool) {
    let (streamed, full) = check_stream(tokenizer, ids, skip_special_tokens);
    assert_eq!(streamed, full, "ids {ids:?}");
}

/// tests/fixtures/smollm2_tokenizer.json, written by tests/fixtures/make_tokenizer_fixture.py.
pub fn fixture() -> serde_json::Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/smollm2_tokenizer.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("fixture is JSON")
}
