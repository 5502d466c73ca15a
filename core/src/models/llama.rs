//! Llama (also SmolLM2, Mistral-style configs): GQA attention with optional biases, SwiGLU MLP.
//! Mirrors mlx-lm `models/llama.py` (full-attention layers; sliding `layer_types` are rejected).

use mlx_rs::Dtype;

use super::{ConfigReader, ModelInfo};
use crate::nn::{AttentionOptions, DecoderScaling, DenseDecoder, DenseDecoderSpec, Rope, Weights};
use crate::{Error, Result};

pub fn load(cfg: &ConfigReader, weights: Weights, dtype: Dtype) -> Result<DenseDecoder> {
    DenseDecoder::load(weights, spec(cfg, dtype, "llama")?)
}

/// The attention shape of a dense config, as each architecture reads it.
pub(crate) struct Dims {
    pub hidden: i32,
    pub heads: i32,
    pub kv_heads: i32,
    pub head_dim: i32,
}

/// The dense Llama stack with the keys every dense config shares read from `cfg` (vocabulary,
/// layers, MLP width, norm epsilon, tied head), no biases and the plain scaling: the base each
/// dense architecture changes, as mlx-lm's model files are deltas of `llama.py`.
/// `max_position_embeddings` is the context the architecture reports; `tie_default` its
/// default for `tie_word_embeddings`.
pub(crate) fn base_spec(
    cfg: &ConfigReader,
    dtype: Dtype,
    model_type: &str,
    dims: Dims,
    rope: Rope,
    max_position_embeddings: Option<usize>,
    tie_default: bool,
) -> Result<DenseDecoderSpec> {
    let Dims { hidden, heads, kv_heads, head_dim } = dims;
    Ok(DenseDecoderSpec {
        info: ModelInfo {
            model_type: model_type.into(),
            vocab_size: cfg.req_i32("vocab_size")?,
            hidden_size: hidden,
            num_layers: cfg.req_i32("num_hidden_layers")? as usize,
            kv_heads,
            head_dim,
            max_position_embeddings,
            activation_dtype: dtype,
            sliding_window: None,
        },
        intermediate: cfg.req_i32("intermediate_size")?,
        rms_norm_eps: cfg.req_f32("rms_norm_eps")?,
        mlp_bias: false,
        tie_word_embeddings: cfg.bool_or("tie_word_embeddings", tie_default)?,
        attention: AttentionOptions {
            hidden,
            heads,
            kv_heads,
            head_dim,
            qkv_bias: false,
            o_bias: false,
            qk_norm_eps: None,
            rope,
        },
        nope_layers: Vec::new(),
        fused_projections: false,
        scaling: DecoderScaling::default(),
    })
}

/// Refuses sliding-window `layer_types` (the Llama-family stacks here are full attention).
pub(crate) fn full_attention_only(cfg: &ConfigReader, model_type: &str) -> Result<()> {
    if let Some(types) = cfg.get("layer_types").and_then(|t| t.as_array()) {
        if types.iter().any(|t| t.as_str() != Some("full_attention")) {
            return Err(Error::Unsupported(format!("{model_type} with sliding-window layer_types")));
        }
    }
    Ok(())
}

/// The Llama stack as mlx-lm's `llama.ModelArgs` reads `cfg` (SmolLM3 and others build on it).
pub(crate) fn spec(cfg: &ConfigReader, dtype: Dtype, model_type: &str) -> Result<DenseDecoderSpec> {
    let hidden = cfg.req_i32("hidden_size")?;
    let heads = cfg.req_i32("num_attention_heads")?;
    let kv_heads = cfg.opt_i32("num_key_value_heads")?.unwrap_or(heads);
    let head_dim = cfg.opt_i32("head_dim")?.unwrap_or(hidden / heads);
    full_attention_only(cfg, model_type)?;
    let attention_bias = cfg.bool_or("attention_bias", false)?;
    let rope = cfg.rope(head_dim, Some(10000.0), cfg.bool_or("rope_traditional", false)?)?;
    let max_positions = cfg.opt_i32("max_position_embeddings")?.map(|n| n as usize);
    let max_positions = if rope.extends_context() { None } else { max_positions };
    let mut spec = base_spec(cfg, dtype, model_type, Dims { hidden, heads, kv_heads, head_dim }, rope, max_positions, true)?;
    spec.mlp_bias = cfg.bool_or("mlp_bias", false)?;
    spec.attention.qkv_bias = attention_bias;
    spec.attention.o_bias = attention_bias;
    Ok(spec)
}
