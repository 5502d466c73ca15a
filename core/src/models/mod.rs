//! Architectures, one file each, over the shared layers in [`crate::nn`].

mod config;
pub mod llama;
pub mod qwen2;
pub mod qwen3;
pub mod qwen3_5;
pub mod qwen3_next;
pub mod qwen3_moe;

pub use config::ConfigReader;

use mlx_rs::{Array, Dtype};

use crate::cache::KvCache;
use crate::nn::Weights;
use crate::{Error, Result};

/// Shape facts the engine needs without knowing the architecture (KV sizing, validation).
#[derive(Debug, Clone)]
pub struct ModelInfo {
    pub model_type: String,
    pub vocab_size: i32,
    pub hidden_size: i32,
    pub num_layers: usize,
    pub kv_heads: i32,
    pub head_dim: i32,
    /// Longest context the model was trained for, if the config says.
    pub max_position_embeddings: Option<usize>,
    /// Dtype of activations / KV entries.
    pub activation_dtype: Dtype,
}

impl ModelInfo {
    /// KV-cache bytes one token occupies across all layers.
    pub fn kv_bytes_per_token(&self) -> usize {
        let elem = match self.activation_dtype {
            Dtype::Float32 => 4,
            _ => 2,
        };
        2 * self.num_layers * (self.kv_heads * self.head_dim) as usize * elem
    }

    /// KV-cache bytes one token occupies across all layers, stored as `kv` says (quantized:
    /// packed weights plus a scale and a bias, in the activation dtype, per group).
    pub fn kv_bytes_per_token_with(&self, kv: Option<&crate::cache::KvQuantization>) -> usize {
        let Some(q) = kv else { return self.kv_bytes_per_token() };
        let elem = match self.activation_dtype {
            Dtype::Float32 => 4,
            _ => 2,
        };
        2 * self.num_layers * self.kv_heads as usize * q.vector_bytes(self.head_dim, elem)
    }
}

pub trait LanguageModel: Send {
    /// `tokens`: `[B, L]` int32 → logits `[B, L, vocab]`, extending `caches` by `L` positions.
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array>;
    /// Fresh per-layer caches for one sequence.
    fn make_caches(&self) -> Vec<Box<dyn KvCache>>;
    fn info(&self) -> &ModelInfo;
}

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
        other => {
            return Err(Error::Unsupported(format!(
                "model_type {other:?} (supported: llama, mistral, qwen2, qwen3, qwen3_moe, qwen3_next, qwen3_5, qwen3_5_moe)"
            )))
        }
    })
}
