//! Shared by the model tests: golden files, tiny-model paths and the default model.
#![allow(dead_code)] // each test crate uses its own subset

use std::path::{Path, PathBuf};

use serde_json::Value;
use weft::model_store::{DefaultModel, ModelStore};

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

pub fn goldens_dir() -> PathBuf {
    repo_root().join("goldens")
}

/// The golden JSON recorded by goldens/make_goldens.py for `name`.
pub fn golden(name: &str) -> Value {
    let path = goldens_dir().join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

pub fn tiny_model_dir(name: &str) -> PathBuf {
    goldens_dir().join("models").join(name)
}

/// The tiny random-weight models with single-sequence goldens.
pub const TINY_MODELS: &[&str] = &["llama-fp32", "llama-bf16", "llama-4bit", "qwen3", "qwen2", "mistral-fp32"];

pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

pub fn floats(v: &Value) -> Vec<f32> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
}

/// The default model (SmolLM2 GGUF) if it is installed in the model store (`weft pull`), or
/// `$WEFT_TEST_SMOLLM2_GGUF`. With `WEFT_REQUIRE_DEFAULT_MODEL=1` (CI) its absence fails.
pub fn default_model() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("WEFT_TEST_SMOLLM2_GGUF").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    if let Some(p) = ModelStore::from_env().cached(&DefaultModel::smollm2()) {
        return Some(p);
    }
    let message = "the default model is not installed (run `weft pull`)";
    if std::env::var("WEFT_REQUIRE_DEFAULT_MODEL").as_deref() == Ok("1") {
        panic!("{message}; required because WEFT_REQUIRE_DEFAULT_MODEL=1");
    }
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "\n!!!!!!!! SKIPPING: {message} !!!!!!!!\n");
    None
}

/// The Gemma 3 270M GGUF if the model store has it (`weft pull gemma-3-270m`). With
/// `WEFT_REQUIRE_DEFAULT_MODEL=1` (CI) its absence fails.
pub fn gemma3_270m() -> Option<PathBuf> {
    let spec = weft::model_store::SplitModel::gemma3_270m();
    if let Some(p) = ModelStore::from_env().cached_split(&spec) {
        return Some(p);
    }
    let message = "gemma-3-270m is not installed (run `weft pull gemma-3-270m`)";
    if std::env::var("WEFT_REQUIRE_DEFAULT_MODEL").as_deref() == Ok("1") {
        panic!("{message}; required because WEFT_REQUIRE_DEFAULT_MODEL=1");
    }
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "\n!!!!!!!! SKIPPING: {message} !!!!!!!!\n");
    None
}

/// A copy of a tiny model directory in a fresh temp dir, to break in a test.
pub fn copy_model(name: &str) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(tiny_model_dir(name)).unwrap() {
        let p = entry.unwrap().path();
        std::fs::copy(&p, tmp.path().join(p.file_name().unwrap())).unwrap();
    }
    tmp
}

/// Rewrites `config.json` in `dir` through `edit`.
pub fn edit_config(dir: &Path, edit: impl FnOnce(&mut Value)) {
    let path = dir.join("config.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(&path, serde_json::to_string_pretty(&v).unwrap()).unwrap();
}
