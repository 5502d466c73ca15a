//! Qwen2: the Llama stack with biases on the q/k/v projections (not on o_proj).
//! Mirrors mlx-lm `models/qwen2.py`.

use mlx_rs::Dtype;

use super::llama::{base_spec, Dims};
use super::ConfigReader;
use crate::nn::{DenseDecoder, Weights};
use crate::Result;

pub fn load(cfg: &ConfigReader, weights: Weights, dtype: Dtype) -> Result<DenseDecoder> {
    let hidden = cfg.req_i32("hidden_size")?;
    let heads = cfg.req_i32("num_attention_heads")?;
    let kv_heads = cfg.req_i32("num_key_value_heads")?;
    let head_dim = hidden / heads;
    let rope = cfg.rope(head_dim, Some(1_000_000.0), cfg.bool_or("rope_traditional", false)?)?;
    let max_positions = Some(cfg.opt_i32("max_position_embeddings")?.unwrap_or(32768) as usize);
    let mut spec = base_spec(cfg, dtype, "qwen2", Dims { hidden, heads, kv_heads, head_dim }, rope, max_positions, true)?;
    spec.attention.qkv_bias = true;
    DenseDecoder::load(weights, spec)
}
