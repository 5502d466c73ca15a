//! MiniCPM (1/2): the Llama stack with depth-scaled residuals. Mirrors mlx-lm
//! `models/minicpm.py`: embeddings × `scale_emb`, both residual branches ×
//! `scale_depth / sqrt(num_hidden_layers)`, and an untied head reads
//! `h / (hidden_size / dim_model_base)` (a checkpoint without `lm_head.weight` uses the
//! embedding there, as mlx-lm's sanitize copies it); a tied head reads `h` unscaled.

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
    let layers = cfg.req_i32("num_hidden_layers")?;
    let rope = cfg.rope(head_dim, Some(1_000_000.0), cfg.bool_or("rope_traditional", false)?)?;
    let max_positions = cfg.opt_i32("max_position_embeddings")?.map(|n| n as usize);
    // Python floats, rounded once to float32 as mlx does with a scalar.
    let depth = cfg.req_f32("scale_depth")? as f64 / (layers as f64).sqrt();
    let head_divisor = hidden as f64 / cfg.req_i32("dim_model_base")? as f64;
    let max_positions = if rope.extends_context() { None } else { max_positions };
    let mut spec = base_spec(cfg, dtype, "minicpm", Dims { hidden, heads, kv_heads, head_dim }, rope, max_positions, false)?;
    spec.scaling = DecoderScaling {
        embedding: Some(cfg.req_f32("scale_emb")?),
        residual: Some(depth as f32),
        head_input_divisor: Some(head_divisor as f32),
        head_falls_back_to_embedding: true,
        ..DecoderScaling::default()
    };
    DenseDecoder::load(weights, spec)
}
