//! Qwen3: the Llama stack with per-head RMSNorm on queries and keys before RoPE, an explicit
//! `head_dim`, and no projection biases. Mirrors mlx-lm `models/qwen3.py`.

use mlx_rs::Dtype;

use super::llama::{base_spec, Dims};
use super::ConfigReader;
use crate::nn::{DenseDecoder, Weights};
use crate::Result;

pub fn load(cfg: &ConfigReader, weights: Weights, dtype: Dtype) -> Result<DenseDecoder> {
    let hidden = cfg.req_i32("hidden_size")?;
    let heads = cfg.req_i32("num_attention_heads")?;
    let kv_heads = cfg.req_i32("num_key_value_heads")?;
    let head_dim = cfg.req_i32("head_dim")?;
    let rope = cfg.rope(head_dim, None, false)?;
    let max_positions = cfg.opt_i32("max_position_embeddings")?.map(|n| n as usize);
    let mut spec = base_spec(cfg, dtype, "qwen3", Dims { hidden, heads, kv_heads, head_dim }, rope, max_positions, true)?;
    spec.attention.qk_norm_eps = Some(spec.rms_norm_eps);
    DenseDecoder::load(weights, spec)
}
