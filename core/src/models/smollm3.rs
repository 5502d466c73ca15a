//! SmolLM3: the Llama stack with rotary embeddings switched off on some layers ("NoPE").
//! Mirrors mlx-lm `models/smollm3.py`: `no_rope_layers[i] == 0` disables RoPE on layer i;
//! without the list, every `no_rope_layer_interval`-th layer (1-based) has none.

use mlx_rs::Dtype;

use super::{llama, ConfigReader};
use crate::nn::{DenseDecoder, Weights};
use crate::{Error, Result};

pub fn load(cfg: &ConfigReader, weights: Weights, dtype: Dtype) -> Result<DenseDecoder> {
    let mut spec = llama::spec(cfg, dtype, "smollm3")?;
    let layers = spec.info.num_layers;
    let uses_rope: Vec<bool> = match cfg.get("no_rope_layers") {
        Some(v) => {
            let flags = v.as_array().filter(|a| a.len() == layers).ok_or_else(|| {
                Error::ModelLoad(format!("config.json: \"no_rope_layers\" must list one 0/1 per layer ({layers})"))
            })?;
            flags
                .iter()
                .map(|f| f.as_i64().map(|f| f != 0).or_else(|| f.as_bool()))
                .collect::<Option<_>>()
                .ok_or_else(|| Error::ModelLoad("config.json: \"no_rope_layers\" entries must be 0 or 1".into()))?
        }
        None => {
            let interval = cfg.opt_i32("no_rope_layer_interval")?.unwrap_or(4) as usize;
            (0..layers).map(|i| (i + 1) % interval != 0).collect()
        }
    };
    spec.nope_layers = (0..layers).filter(|i| !uses_rope[*i]).collect();
    DenseDecoder::load(weights, spec)
}
