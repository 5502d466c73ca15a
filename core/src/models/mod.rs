//! Architectures, one file each, over the shared layers in [`crate::nn`].

mod config;
pub mod gemma2;
pub mod gemma3;
pub mod gemma3_vision;
pub mod gemma4_audio;
pub mod gemma4_text;
pub mod gemma4_vision;
pub mod granite;
pub mod llama;
pub mod minicpm;
pub mod ministral3;
pub mod phi3;
pub mod qwen2;
pub mod qwen3;
pub mod qwen3_5;
pub mod qwen3_next;
pub mod qwen3_moe;
pub mod smollm3;

pub use config::ConfigReader;
pub use crate::language_model::{LanguageModel, ModelInfo, PromptMedia, SlidingWindowLayers, SoftTokens};

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
        "gemma2" => Box::new(gemma2::load(&cfg, weights, dtype)?),
        "gemma3_text" | "gemma3" => Box::new(gemma3::load(&cfg, weights, dtype)?),
        "gemma4_text" | "gemma4" => Box::new(gemma4_text::load(&cfg, weights, dtype)?),
        "granite" => Box::new(granite::load(&cfg, weights, dtype)?),
        "minicpm" => Box::new(minicpm::load(&cfg, weights, dtype)?),
        "ministral3" => Box::new(ministral3::load(&cfg, weights, dtype)?),
        "mistral3" => Box::new(ministral3::load_mistral3(&cfg, weights, dtype)?),
        "phi3" => Box::new(phi3::load(&cfg, weights, dtype)?),
        "smollm3" => Box::new(smollm3::load(&cfg, weights, dtype)?),
        other => {
            return Err(Error::Unsupported(format!(
                "model_type {other:?} (supported: llama, mistral, qwen2, qwen3, qwen3_moe, qwen3_next, qwen3_5, qwen3_5_moe, gemma2, gemma3_text, gemma3, gemma4_text, gemma4, granite, minicpm, ministral3, mistral3, phi3, smollm3)"
            )))
        }
    })
}
