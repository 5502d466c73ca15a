//! mlx-lm / Hugging Face model directories: config.json, one or several safetensors files
//! (sharded via model.safetensors.index.json), tokenizer files, generation_config.json.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use mlx_rs::Array;

use super::{build_model, ids_from_json, push_unique, GenerationDefaults, LoadedModel};
use crate::nn::LayerOptions;
use crate::tokenizer::Tokenizer;
use crate::{Error, Result};

pub fn load(dir: &Path, layers: &LayerOptions) -> Result<LoadedModel> {
    let mut config = read_json(&dir.join("config.json"))?
        .ok_or_else(|| Error::ModelLoad(format!("{} has no config.json", dir.display())))?;
    // The towers' preprocessing settings (pan-and-scan, mel frontend) live beside config.json.
    if let (Some(pc), Some(obj)) = (crate::vision::read_processor_configs(dir)?, config.as_object_mut()) {
        obj.insert(crate::vision::PROCESSOR_CONFIG_KEY.into(), pc);
    }
    let mut tensors = HashMap::new();
    for file in weight_files(dir)? {
        tensors.extend(load_safetensors(&file)?);
    }
    let model = build_model(&config, tensors, layers)?;

    let generation = read_json(&dir.join("generation_config.json"))?;
    let mut eos = ids_from_json(config.get("eos_token_id"));
    if let Some(g) = &generation {
        push_unique(&mut eos, ids_from_json(g.get("eos_token_id")));
    }
    let tokenizer = if dir.join("tokenizer.json").exists() {
        let t = Tokenizer::from_dir(dir)?;
        push_unique(&mut eos, t.eos_token_ids().iter().copied());
        Some(t)
    } else {
        None
    };
    Ok(LoadedModel {
        constraints: Default::default(),
        model,
        tokenizer,
        eos_token_ids: eos,
        defaults: generation.as_ref().map(defaults_from).unwrap_or_default(),
        source: dir.to_path_buf(),
        numerics: String::new(),
        options: Default::default(),
    })
}

fn defaults_from(g: &serde_json::Value) -> GenerationDefaults {
    let f = |k: &str| g.get(k).and_then(|x| x.as_f64()).map(|x| x as f32);
    // `do_sample: false` means greedy whatever temperature says.
    let greedy = g.get("do_sample").and_then(|x| x.as_bool()) == Some(false);
    GenerationDefaults {
        temperature: if greedy { Some(0.0) } else { f("temperature") },
        top_p: f("top_p"),
        top_k: g.get("top_k").and_then(|x| x.as_i64()).map(|x| x as i32),
        min_p: f("min_p"),
        repetition_penalty: f("repetition_penalty"),
    }
}

pub(crate) fn read_json(path: &Path) -> Result<Option<serde_json::Value>> {
    match std::fs::read_to_string(path) {
        Ok(text) => serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| Error::ModelLoad(format!("{} is not valid JSON: {e}", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io(path, e)),
    }
}

/// The safetensors files of a checkpoint: the shards named by the index, else every
/// `*.safetensors` in the directory (as mlx-lm globs `model*.safetensors`).
fn weight_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let index = dir.join("model.safetensors.index.json");
    if let Some(idx) = read_json(&index)? {
        let map = idx.get("weight_map").and_then(|m| m.as_object()).ok_or_else(|| {
            Error::ModelLoad(format!("{} has no \"weight_map\" object", index.display()))
        })?;
        let files: BTreeSet<&str> = map.values().filter_map(|v| v.as_str()).collect();
        let files: Vec<PathBuf> = files.into_iter().map(|f| dir.join(f)).collect();
        if let Some(missing) = files.iter().find(|f| !f.exists()) {
            return Err(Error::ModelLoad(format!(
                "shard {} listed in model.safetensors.index.json is missing",
                missing.display()
            )));
        }
        return Ok(files);
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| Error::io(dir, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(Error::ModelLoad(format!("no .safetensors weights in {}", dir.display())));
    }
    Ok(files)
}

/// Validates the header with the `safetensors` crate (clear errors for corrupt files), then
/// loads the tensors through MLX.
fn load_safetensors(path: &Path) -> Result<HashMap<String, Array>> {
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    // SAFETY: read-only mapping, dropped before MLX reads the file; nothing writes it meanwhile.
    let bytes = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
    safetensors::SafeTensors::deserialize(&bytes)
        .map_err(|e| Error::ModelLoad(format!("{} is not a valid safetensors file: {e}", path.display())))?;
    drop(bytes);
    Array::load_safetensors(path)
        .map_err(|e| Error::ModelLoad(format!("loading {}: {e}", path.display())))
}
