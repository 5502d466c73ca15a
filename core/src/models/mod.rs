//! Architectures, one file each, over the shared layers in [`crate::nn`].

mod config;
pub mod gemma3;
pub mod llama;
pub mod qwen2;
pub mod qwen3;
pub mod qwen3_5;
pub mod qwen3_next;
pub mod qwen3_moe;

pub use config::ConfigReader;
pub use crate::language_model::{LanguageModel, ModelInfo, SlidingWindowLayers};

use mlx_rs::Dtype;

use crate::nn::Weights;
use crate::{Error, Result};

/// Builds the architecture named by `config["model_type"]` from `weights`.
pub fn build(config: &serde_json::Value, weights: Weights, dtype: Dtype) -> Result<Box<dyn LanguageModel>> {
    let cfg = ConfigReader::new(config);
    let model_type = cfg.req_str("model_type")?;
    Ok(match model_type.as_str() {
        "llama" | "mistral" => Box::new(llama::load(&cfg, weights, dtype)?),
        "qwen2" => Box::new(qwen2::load(&cfg, weights, dtype)?),
        "qwen3" => Box::new(qwen3::load(&cfg, weights, dtype)?),
        "qwen3_next" => Box::new(qwen3_next::load(&cfg, weights, dtype)?),
        "qwen3_5" | "qwen3_5_moe" => Box::new(qwen3_5::load(config, weights, dtype)?),
        "qwen3_moe" => Box::new(qwen3_moe::load(&cfg, weights, dtype)?),
        "gemma3_text" | "gemma3" => Box::new(gemma3::load(&cfg, weights, dtype)?),
        other => {
            return Err(Error::Unsupported(format!(
                "model_type {other:?} (supported: llama, mistral, qwen2, qwen3, qwen3_moe, qwen3_next, qwen3_5, qwen3_5_moe, gemma3_text, gemma3)"
            )))
        }
    })
}
