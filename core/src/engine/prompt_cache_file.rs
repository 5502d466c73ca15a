//! Prompt-cache entries on disk: one safetensors file per entry, so a fixed preamble is
//! prefilled once, ever, and entries survive a restart (`weft serve --prompt-cache-dir`).
//!
//! Arrays: `tokens` (uint32, what the entry holds) and `layer.{i}.{name}` (each layer's cache,
//! [`KvCache::export`]). Header metadata: `format`, the `model`, `tokenizer` and `numerics`
//! fingerprints ([`CacheIdentity`]: an entry is refused, with the reason, under any other),
//! `layers` (each layer's kind and integer fields) and `checksum` (SHA-256 of the data
//! section: a corrupt file is refused; a truncated one fails the size check first).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use mlx_rs::Array;
use sha2::{Digest, Sha256};

use crate::cache::{self, CacheParts, KvCache};
use crate::{Error, Result};

const FORMAT: &str = "weft-prompt-cache/2";
/// Format 1 had no `kv_quantization` field (it saved no quantized KV): refused, saying so.
const OLD_FORMATS: &[&str] = &["weft-prompt-cache/1"];
/// Written first, then overwritten in place with the data's checksum (same length).
const PLACEHOLDER: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// What a saved entry is valid for: fingerprints of the model's files, of its tokenizer's and
/// of the load options that change its numbers, and the engine's KV quantization (its caches'
/// kind and contents depend on it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheIdentity {
    pub model: String,
    pub tokenizer: String,
    pub numerics: String,
    /// `none`, or `bits=B group_size=G start=S` ([`CacheIdentity::with_kv_quantization`]).
    pub kv_quantization: String,
}

impl CacheIdentity {
    /// The identity of a model loaded from `source` (a model directory or a .gguf file) with
    /// `numerics` ([`crate::loading::LoadedModel::numerics`]): its config and weight files'
    /// names and sizes, its tokenizer files' contents.
    pub fn of(source: &Path, numerics: &str) -> CacheIdentity {
        let mut model = Sha256::new();
        let mut tokenizer = Sha256::new();
        if source.is_dir() {
            let mut files: Vec<PathBuf> = std::fs::read_dir(source).into_iter().flatten().flatten().map(|e| e.path()).collect();
            files.sort();
            for f in files {
                let name = f.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                if name == "config.json" {
                    model.update(std::fs::read(&f).unwrap_or_default());
                } else if name.ends_with(".safetensors") || name.ends_with(".gguf") {
                    model.update(format!("{name}:{}", std::fs::metadata(&f).map(|m| m.len()).unwrap_or(0)));
                } else if name.starts_with("tokenizer") || name.ends_with(".jinja") {
                    tokenizer.update(name.as_bytes());
                    tokenizer.update(std::fs::read(&f).unwrap_or_default());
                }
            }
        } else {
            // A GGUF holds its tokenizer: the file names both.
            let name = source.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            let id = format!("{name}:{}", std::fs::metadata(source).map(|m| m.len()).unwrap_or(0));
            model.update(&id);
            tokenizer.update(&id);
        }
        CacheIdentity {
            model: hex(&model.finalize()),
            tokenizer: hex(&tokenizer.finalize()),
            numerics: numerics.to_string(),
            kv_quantization: "none".into(),
        }
    }

    /// This identity for an engine whose KV caches quantize as `kv` says (`None`: full precision).
    pub fn with_kv_quantization(mut self, kv: Option<&crate::cache::KvQuantization>) -> CacheIdentity {
        self.kv_quantization = match kv {
            None => "none".into(),
            Some(q) => format!("bits={} group_size={} start={}", q.bits, q.group_size, q.start),
        };
        self
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn io(path: &Path, e: impl std::fmt::Display) -> Error {
    Error::InvalidRequest(format!("prompt-cache file {}: {e}", path.display()))
}

/// Writes an entry holding `caches` for exactly `tokens` to `path` (through a temporary file,
/// so a crash leaves no half-written entry under the name).
pub fn save_entry(path: &Path, tokens: &[u32], caches: &[Box<dyn KvCache>], id: &CacheIdentity) -> Result<()> {
    let mut arrays: Vec<(String, Array)> = vec![("tokens".into(), Array::from_slice(tokens, &[tokens.len() as i32]))];
    let mut layers = Vec::with_capacity(caches.len());
    for (i, c) in caches.iter().enumerate() {
        let parts = c.export().ok_or_else(|| Error::Unsupported(format!("layer {i}'s cache kind is not saved to disk")))?;
        if parts.ints.is_empty() && parts.arrays.is_empty() {
            return Err(Error::Unsupported(format!("layer {i}'s cache is empty")));
        }
        arrays.extend(parts.arrays.into_iter().map(|(name, a)| (format!("layer.{i}.{name}"), a)));
        layers.push(serde_json::json!([parts.kind, parts.ints]));
    }
    let metadata: HashMap<String, String> = [
        ("format", FORMAT.to_string()),
        ("model", id.model.clone()),
        ("tokenizer", id.tokenizer.clone()),
        ("numerics", id.numerics.clone()),
        ("kv_quantization", id.kv_quantization.clone()),
        ("layers", serde_json::Value::Array(layers).to_string()),
        ("checksum", PLACEHOLDER.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    // MLX names what it writes `*.safetensors`; loading skips `*.partial.safetensors`.
    let tmp = path.with_extension("partial.safetensors");
    Array::save_safetensors(arrays.iter().map(|(k, v)| (k.as_str(), v)), &metadata, &tmp).map_err(|e| io(&tmp, e))?;
    let mut bytes = std::fs::read(&tmp).map_err(|e| io(&tmp, e))?;
    let data = data_start(&bytes).ok_or_else(|| io(&tmp, "MLX wrote no safetensors header"))?;
    let sum = hex(&Sha256::digest(&bytes[data..]));
    let header = &mut bytes[8..data];
    let at = header.windows(PLACEHOLDER.len()).position(|w| w == PLACEHOLDER.as_bytes()).ok_or_else(|| io(&tmp, "no checksum slot"))?;
    header[at..at + PLACEHOLDER.len()].copy_from_slice(sum.as_bytes());
    std::fs::write(&tmp, &bytes).map_err(|e| io(&tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| io(path, e))
}

/// Where a safetensors file's data starts (after its 8-byte length and JSON header).
fn data_start(bytes: &[u8]) -> Option<usize> {
    let n = u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?) as usize;
    let start = n.checked_add(8)?;
    (start <= bytes.len()).then_some(start)
}

/// An entry as read back: the tokens it holds and each layer's single-sequence cache.
pub type SavedEntry = (Vec<u32>, Vec<Box<dyn KvCache>>);

/// Reads an entry [`save_entry`] wrote: its tokens and single-sequence caches. A file for
/// another model, tokenizer or numerics, or one truncated or corrupt, is refused with why.
pub fn load_entry(path: &Path, id: &CacheIdentity) -> Result<SavedEntry> {
    // Checked through a map of the file: the page cache, not a heap copy (MLX reads it again).
    let file = std::fs::File::open(path).map_err(|e| io(path, e))?;
    // SAFETY: the map is only read and is dropped before this returns; as with mapped model
    // weights, the file must not be truncated meanwhile (other changes fail the checksum).
    let bytes = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| io(path, e))?;
    let data = data_start(&bytes).ok_or_else(|| io(path, "truncated (no complete header)"))?;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..data]).map_err(|e| io(path, format!("corrupt header: {e}")))?;
    let meta = &header["__metadata__"];
    let field = |k: &str| meta[k].as_str().unwrap_or("");
    if OLD_FORMATS.contains(&field("format")) {
        return Err(io(path, format!("an older Weft prompt-cache format ({}; this engine reads {FORMAT}): save the entry again", field("format"))));
    }
    if field("format") != FORMAT {
        return Err(io(path, format!("not a Weft prompt-cache file (format {:?})", field("format"))));
    }
    for (key, ours) in [("model", &id.model), ("tokenizer", &id.tokenizer), ("numerics", &id.numerics)] {
        if field(key) != ours.as_str() {
            return Err(io(path, format!("saved for another {key} ({}), this engine's is {ours}", field(key))));
        }
    }
    if field("kv_quantization") != id.kv_quantization {
        return Err(io(
            path,
            format!("saved with KV quantization {}, this engine's is {}", field("kv_quantization"), id.kv_quantization),
        ));
    }
    let end = header
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(_, t)| t["data_offsets"][1].as_u64())
        .max()
        .unwrap_or(0) as usize;
    if bytes.len() - data != end {
        return Err(io(path, format!("truncated or padded: {} data bytes, the header names {end}", bytes.len() - data)));
    }
    if hex(&Sha256::digest(&bytes[data..])) != field("checksum") {
        return Err(io(path, "corrupt data (checksum mismatch)"));
    }
    let mut arrays = if path.extension().is_some_and(|e| e == "safetensors") {
        drop(bytes);
        Array::load_safetensors_with_metadata(path).map_err(|e| io(path, e))?.0
    } else {
        // mlx-rs reads only `*.safetensors` names (llama-server's slot files are `*.bin`): a
        // link under such a name, gone once the arrays are read.
        let alias = path.with_extension(format!("{}.partial.safetensors", std::process::id()));
        if std::fs::hard_link(path, &alias).is_err() {
            std::fs::write(&alias, &bytes[..]).map_err(|e| io(&alias, e))?;
        }
        drop(bytes);
        let loaded = Array::load_safetensors_with_metadata(&alias).map_err(|e| io(path, e)).and_then(|(arrays, _)| {
            mlx_rs::transforms::eval(arrays.values()).map_err(|e| io(path, e))?;
            Ok(arrays)
        });
        let _ = std::fs::remove_file(&alias);
        loaded?
    };
    let tokens = arrays.remove("tokens").ok_or_else(|| io(path, "no tokens"))?;
    tokens.eval()?;
    let tokens = tokens.try_as_slice::<u32>().map_err(|e| io(path, e))?.to_vec();
    let layers: Vec<(String, Vec<i64>)> =
        serde_json::from_str(field("layers")).map_err(|e| io(path, format!("corrupt layer list: {e}")))?;
    let caches = layers
        .into_iter()
        .enumerate()
        .map(|(i, (kind, ints))| {
            let prefix = format!("layer.{i}.");
            let mine: Vec<String> = arrays.keys().filter(|k| k.starts_with(&prefix)).cloned().collect();
            let arrays = mine.into_iter().map(|k| (k[prefix.len()..].to_string(), arrays.remove(&k).unwrap())).collect();
            cache::import(CacheParts { kind, arrays, ints })
        })
        .collect::<Result<Vec<_>>>()?;
    if caches.iter().any(|c| c.len() != tokens.len()) {
        return Err(io(path, "its caches do not hold its tokens"));
    }
    Ok((tokens, caches))
}

/// Whether `path` is an entry file of a cache directory (not one being written).
pub fn is_entry_file(path: &Path) -> bool {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    name.ends_with(".safetensors") && !name.ends_with(".partial.safetensors")
}

/// The file an entry holding `tokens` is saved under in a cache directory.
pub fn entry_file(dir: &Path, tokens: &[u32]) -> PathBuf {
    let mut h = Sha256::new();
    tokens.iter().for_each(|t| h.update(t.to_le_bytes()));
    dir.join(format!("{}.safetensors", &hex(&h.finalize())[..32]))
}
