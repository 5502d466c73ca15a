//! `weft models` (alias `weft ls`): the models the store knows (installed or not), every other
//! model installed under the store root, and the models in the Hugging Face cache (by the repo
//! id `--model` takes), with size, architecture, quantization and capabilities read from the
//! files themselves (GGUF header, or an mlx-lm / Hugging Face directory's config and tokenizer
//! files). `--json` prints the same as one JSON object; `--vision`, `--tools`, `--audio` and
//! `--max-size` filter the list.

use std::fs;
use std::path::{Path, PathBuf};

use clap::Args;
use serde::Serialize;
use serde_json::Value;
use weft::gguf::GgufHeader;
use weft::model_store::{hub, named_model, named_models, DefaultModel, ModelStore};
use weft::{Error, Result};

#[derive(Args, Debug, Clone)]
pub struct ModelsArgs {
    /// Print one JSON object (`{"store": ..., "hf_cache": ..., "models": [...]}`) instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Only installed models that take images.
    #[arg(long)]
    pub vision: bool,
    /// Only installed models whose chat template renders tools.
    #[arg(long)]
    pub tools: bool,
    /// Only installed models that take audio.
    #[arg(long)]
    pub audio: bool,
    /// Only models at most this large: bytes, or a number with kB, MB, GB (powers of 1000).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub max_size: Option<u64>,
}

/// `1500000`, `500MB`, `4.5GB`, `900 kB` → bytes.
fn parse_size(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().map_err(|_| format!("expected a size like 500MB or 4GB, got {s:?}"))?;
    let scale = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "m" | "mb" => 1e6,
        "g" | "gb" => 1e9,
        "t" | "tb" => 1e12,
        other => return Err(format!("unknown size unit {other:?} in {s:?} (use kB, MB or GB)")),
    };
    Ok((n * scale) as u64)
}

#[derive(Debug, Serialize, Default)]
struct Capabilities {
    /// The model ships a chat template.
    chat_template: bool,
    /// Its chat template renders tool definitions (it mentions `tools`).
    tools: bool,
    /// The checkpoint carries a vision tower Weft runs (Gemma 3's, sized by `vision_config`).
    vision: bool,
    /// The checkpoint carries an audio tower Weft runs (Gemma 4's, from a non-null `audio_config`).
    audio: bool,
}

#[derive(Debug, Serialize)]
struct Entry {
    /// What `--model` takes: a store name or path, or a Hugging Face repo id.
    name: String,
    /// `store` (Weft's model store) or `huggingface` (the Hugging Face cache).
    source: &'static str,
    /// The store can install it by name (`weft pull NAME`).
    known: bool,
    /// The model used when no --model is given.
    default: bool,
    installed: bool,
    path: Option<PathBuf>,
    /// Bytes on disk when installed, else the pinned size of what `weft pull` installs.
    size_bytes: u64,
    /// `None` until installed (it is read from the files).
    architecture: Option<String>,
    quantization: Option<String>,
    capabilities: Option<Capabilities>,
    /// Why the files could not be inspected, if they could not.
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

/// What the files say about an installed model.
struct Inspected {
    architecture: String,
    quantization: String,
    capabilities: Capabilities,
}

pub fn run(args: ModelsArgs) -> Result<()> {
    let store = ModelStore::from_env();
    let hf_cache = weft::model_store::HubOptions::from_env()?.cache_dir;
    let mut entries = list(&store);
    for m in hub::cached_models(&hf_cache) {
        let mut e = entry(&m.name, false, false, Some(m.path), 0);
        e.source = "huggingface";
        entries.push(e);
    }
    entries.retain(|e| args.keeps(e));
    if args.json {
        let doc = serde_json::json!({ "store": store.root(), "hf_cache": hf_cache, "models": entries });
        // A tree of plain values: serializing cannot fail.
        println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
    } else {
        print_table(&store, &hf_cache, &entries);
    }
    if entries.is_empty() && (args.vision || args.tools || args.audio || args.max_size.is_some()) {
        return Err(Error::InvalidRequest("no model matches the filters".into()));
    }
    Ok(())
}

impl ModelsArgs {
    /// Whether `e` passes the filters (a capability filter needs the files: installed only).
    fn keeps(&self, e: &Entry) -> bool {
        let caps = e.capabilities.as_ref();
        let has = |wanted: bool, f: fn(&Capabilities) -> bool| !wanted || caps.is_some_and(f);
        has(self.vision, |c| c.vision)
            && has(self.tools, |c| c.tools)
            && has(self.audio, |c| c.audio)
            && self.max_size.is_none_or(|max| e.size_bytes <= max)
    }
}

fn list(store: &ModelStore) -> Vec<Entry> {
    let default = DefaultModel::smollm2();
    let mut entries = vec![entry(&default.name, true, true, store.cached(&default), default.gguf_size)];
    for name in named_models() {
        if let Some(spec) = named_model(&name) {
            entries.push(entry(&spec.name, true, false, store.cached_split(&spec), spec.size));
        }
    }
    // Anything else under the root: a model directory or a .gguf file, one level down (a
    // known model's directory holds its own file, already listed).
    let known_dirs: Vec<String> = entries.iter().map(|e| e.name.clone()).collect();
    let known_files: Vec<PathBuf> = entries.iter().filter_map(|e| e.path.clone()).collect();
    let mut others: Vec<PathBuf> = fs::read_dir(store.root())
        .map(|rd| rd.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    others.sort();
    for path in others {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if name.starts_with('.') || known_dirs.contains(&name) || known_files.contains(&path) {
            continue;
        }
        let model = if path.is_dir() { model_in_dir(&path) } else { is_gguf(&path).then(|| path.clone()) };
        if let Some(model) = model {
            let size = disk_size(&model);
            entries.push(entry(&name, false, false, Some(model), size));
        }
    }
    entries
}

fn entry(name: &str, known: bool, default: bool, path: Option<PathBuf>, pinned_size: u64) -> Entry {
    let mut e = Entry {
        name: name.to_string(),
        source: "store",
        known,
        default,
        installed: path.is_some(),
        size_bytes: pinned_size,
        path: None,
        architecture: None,
        quantization: None,
        capabilities: None,
        error: None,
    };
    if let Some(path) = path {
        e.size_bytes = disk_size(&path);
        match inspect(&path) {
            Ok(i) => {
                e.architecture = Some(i.architecture);
                e.quantization = Some(i.quantization);
                e.capabilities = Some(i.capabilities);
            }
            Err(err) => e.error = Some(err),
        }
        e.path = Some(path);
    }
    e
}

fn is_gguf(p: &Path) -> bool {
    p.is_file() && p.extension().is_some_and(|x| x.eq_ignore_ascii_case("gguf"))
}

/// The model a directory holds: itself when it has a `config.json`, else its one `.gguf`.
fn model_in_dir(dir: &Path) -> Option<PathBuf> {
    if dir.join("config.json").is_file() {
        return Some(dir.to_path_buf());
    }
    let ggufs: Vec<PathBuf> = fs::read_dir(dir).ok()?.filter_map(|e| e.ok()).map(|e| e.path()).filter(|p| is_gguf(p)).collect();
    (ggufs.len() == 1).then(|| ggufs[0].clone())
}

fn disk_size(p: &Path) -> u64 {
    match fs::metadata(p) {
        Ok(m) if m.is_file() => m.len(),
        Ok(m) if m.is_dir() => fs::read_dir(p)
            .map(|rd| rd.filter_map(|e| e.ok()).map(|e| disk_size(&e.path())).sum())
            .unwrap_or(0),
        _ => 0,
    }
}

fn inspect(path: &Path) -> std::result::Result<Inspected, String> {
    if path.is_dir() {
        inspect_dir(path)
    } else {
        inspect_gguf(path)
    }
}

/// llama.cpp's `general.file_type` names (`LLAMA_FTYPE_MOSTLY_*`) for the common values.
fn file_type_name(t: u64) -> Option<&'static str> {
    Some(match t {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K",
        11 => "Q3_K_S",
        12 => "Q3_K_M",
        13 => "Q3_K_L",
        14 => "Q4_K_S",
        15 => "Q4_K_M",
        16 => "Q5_K_S",
        17 => "Q5_K_M",
        18 => "Q6_K",
        32 => "BF16",
        _ => return None,
    })
}

fn inspect_gguf(path: &Path) -> std::result::Result<Inspected, String> {
    let h = GgufHeader::read(path).map_err(|e| e.to_string())?;
    let architecture = h.architecture().unwrap_or("unknown").to_string();
    let quantization = match h.get_u64("general.file_type").and_then(file_type_name) {
        Some(name) => name.to_string(),
        None => predominant_type(&h),
    };
    let template = h.get_str("tokenizer.chat_template");
    Ok(Inspected {
        architecture,
        quantization,
        capabilities: Capabilities {
            chat_template: template.is_some(),
            tools: template.is_some_and(|t| t.contains("tools")),
            // Vision and audio in GGUF live in a separate projector file, never in the text model.
            vision: false,
            audio: false,
        },
    })
}

/// The tensor type holding the most elements (when the header names no file type).
fn predominant_type(h: &GgufHeader) -> String {
    let mut by_type: std::collections::BTreeMap<&'static str, u64> = Default::default();
    for t in &h.tensors {
        *by_type.entry(t.type_name()).or_default() += t.dims.iter().product::<u64>();
    }
    by_type.into_iter().max_by_key(|(_, n)| *n).map_or_else(|| "unknown".into(), |(name, _)| name.to_string())
}

/// Whether the checkpoint's safetensors (its index, or the single file's header) name `tensor`.
fn has_tensor(dir: &Path, tensor: &str) -> bool {
    if let Some(index) = read_json(&dir.join("model.safetensors.index.json")) {
        return index["weight_map"].get(tensor).is_some();
    }
    let header = || -> Option<Value> {
        use std::io::Read;
        let mut f = fs::File::open(dir.join("model.safetensors")).ok()?;
        let mut len = [0u8; 8];
        f.read_exact(&mut len).ok()?;
        let len = u64::from_le_bytes(len).min(100 << 20) as usize;
        let mut buf = vec![0u8; len];
        f.read_exact(&mut buf).ok()?;
        serde_json::from_slice(&buf).ok()
    };
    header().is_some_and(|h| h.get(tensor).is_some())
}

fn read_json(p: &Path) -> Option<Value> {
    serde_json::from_str(&fs::read_to_string(p).ok()?).ok()
}

fn inspect_dir(dir: &Path) -> std::result::Result<Inspected, String> {
    let config = read_json(&dir.join("config.json")).ok_or_else(|| "config.json is missing or not JSON".to_string())?;
    let text = config.get("text_config").filter(|t| t.is_object());
    let architecture = config["model_type"].as_str().unwrap_or("unknown").to_string();
    let quant = config.get("quantization").or_else(|| config.get("quantization_config"));
    let quantization = match quant {
        Some(q) if q["bits"].is_u64() => {
            format!("{}-bit g{}", q["bits"], q["group_size"].as_u64().map_or("?".into(), |g| g.to_string()))
        }
        _ => config["torch_dtype"]
            .as_str()
            .or_else(|| text.and_then(|t| t["torch_dtype"].as_str()))
            .or_else(|| config["dtype"].as_str())
            .unwrap_or("unquantized")
            .to_string(),
    };
    let template = fs::read_to_string(dir.join("chat_template.jinja"))
        .ok()
        .or_else(|| read_json(&dir.join("chat_template.json")).and_then(|v| v["chat_template"].as_str().map(String::from)))
        .or_else(|| read_json(&dir.join("tokenizer_config.json")).and_then(|v| template_text(&v["chat_template"])));
    Ok(Inspected {
        architecture,
        quantization,
        capabilities: Capabilities {
            chat_template: template.is_some(),
            tools: template.as_deref().is_some_and(|t| t.contains("tools")),
            // Image input Weft serves: a gemma3 checkpoint whose vision_config sizes a tower, or
            // a gemma4 one whose weights hold a vision tower.
            vision: (config["model_type"] == "gemma3"
                && config.get("vision_config").is_some_and(|v| v.get("hidden_size").is_some()))
                || (config["model_type"] == "gemma4" && has_tensor(dir, "vision_tower.patch_embedder.input_proj.weight")),
            // Audio input Weft serves: a gemma4 checkpoint with an audio_config (the larger
            // Gemma 4 checkpoints set it to null: no tower).
            audio: config["model_type"] == "gemma4" && config.get("audio_config").is_some_and(Value::is_object),
        },
    })
}

/// A tokenizer_config `chat_template`: one string, or a list of named templates.
fn template_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Array(list) => {
            let all: Vec<&str> = list.iter().filter_map(|t| t["template"].as_str()).collect();
            (!all.is_empty()).then(|| all.join("\n"))
        }
        _ => None,
    }
}

fn human_size(bytes: u64) -> String {
    let b = bytes as f64;
    if b >= 1e9 {
        format!("{:.1} GB", b / 1e9)
    } else if b >= 1e6 {
        format!("{:.1} MB", b / 1e6)
    } else {
        format!("{:.1} kB", b / 1e3)
    }
}

fn print_table(store: &ModelStore, hf_cache: &Path, entries: &[Entry]) {
    let yes = |b: bool| if b { "yes" } else { "no" };
    let rows: Vec<[String; 9]> = entries
        .iter()
        .map(|e| {
            let caps = e.capabilities.as_ref();
            let cap = |f: fn(&Capabilities) -> bool| caps.map_or("-".to_string(), |c| yes(f(c)).to_string());
            let status = match (e.installed, e.known) {
                (true, _) if e.error.is_some() => "unreadable",
                (true, _) => "installed",
                (false, true) => "available",
                (false, false) => "-",
            };
            [
                if e.default { format!("{} (default)", e.name) } else { e.name.clone() },
                status.to_string(),
                human_size(e.size_bytes),
                e.architecture.clone().unwrap_or_else(|| "-".into()),
                e.quantization.clone().unwrap_or_else(|| "-".into()),
                cap(|c| c.chat_template),
                cap(|c| c.tools),
                cap(|c| c.vision),
                cap(|c| c.audio),
            ]
        })
        .collect();
    let header = ["NAME", "STATUS", "SIZE", "ARCH", "QUANT", "CHAT", "TOOLS", "VISION", "AUDIO"].map(String::from);
    let mut widths = header.clone().map(|h| h.len());
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |r: &[String; 9]| {
        let cells: Vec<String> = r.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
        println!("{}", cells.join("  ").trim_end());
    };
    line(&header);
    for r in &rows {
        line(r);
    }
    println!("store: {}", store.root().display());
    println!("hf cache: {}", hf_cache.display());
    for e in entries.iter().filter(|e| e.error.is_some()) {
        println!("{}: {}", e.name, e.error.as_deref().unwrap_or_default());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn has_tensor_reads_the_index_or_the_single_file_header() {
        let models = Path::new(env!("CARGO_MANIFEST_DIR")).join("../goldens/models");
        let vision = "vision_tower.patch_embedder.input_proj.weight";
        assert!(has_tensor(&models.join("gemma4-vision"), vision));
        assert!(!has_tensor(&models.join("gemma4-vision"), "vision_tower.nothing"));
        // gemma4_text has an index and no tower.
        assert!(has_tensor(&models.join("gemma4_text"), "model.embed_tokens.weight"));
        assert!(!has_tensor(&models.join("gemma4_text"), vision));
        assert!(!has_tensor(&models.join("no-such-model"), vision));
    }
}
