//! IBM Granite (3.x dense): the Llama stack with scalar multipliers. Mirrors mlx-lm
//! `models/granite.py`: embeddings × `embedding_multiplier`, both residual branches ×
//! `residual_multiplier`, softmax scale `attention_multiplier`, logits ÷ `logits_scaling`;
//! `head_dim = hidden / heads`, RoPE never traditional.

use mlx_rs::Dtype;

use super::llama::{base_spec, Dims};
use super::ConfigReader;
use crate::nn::{DecoderScaling, DenseDecoder, Weights};
use crate::Result;

pub fn load(cfg: &ConfigReader, weights: Weights, dtype: Dtype) -> Result<DenseDecoder> {
    let hidden = cfg.req_i32("hidden_size")?;
    let heads = cfg.req_i32("num_attention_heads")?;
    let kv_heads = cfg.req_i32("num_key_value_heads")?;
    let head_dim = hidden / heads;
    // mlx-lm requires every one of these (no defaults).
    let attention_bias = cfg
        .get("attention_bias")
        .is_some()
        .then(|| cfg.bool_or("attention_bias", false))
        .unwrap_or_else(|| Err(crate::Error::ModelLoad("config.json: missing \"attention_bias\"".into())))?;
    let mlp_bias = cfg
        .get("mlp_bias")
        .is_some()
        .then(|| cfg.bool_or("mlp_bias", false))
        .unwrap_or_else(|| Err(crate::Error::ModelLoad("config.json: missing \"mlp_bias\"".into())))?;
    let rope = cfg.rope(head_dim, None, false)?;
    let max_positions =
        if rope.extends_context() { None } else { Some(cfg.req_i32("max_position_embeddings")? as usize) };
    let mut spec = base_spec(cfg, dtype, "granite", Dims { hidden, heads, kv_heads, head_dim }, rope, max_positions, true)?;
    spec.mlp_bias = mlp_bias;
    spec.attention.qkv_bias = attention_bias;
    spec.attention.o_bias = attention_bias;
    spec.scaling = DecoderScaling {
        embedding: Some(cfg.req_f32("embedding_multiplier")?),
        residual: Some(cfg.req_f32("residual_multiplier")?),
        attention: Some(cfg.req_f32("attention_multiplier")?),
        logits_divisor: Some(cfg.req_f32("logits_scaling")?),
        ..DecoderScaling::default()
    };
    DenseDecoder::load(weights, spec)
}
