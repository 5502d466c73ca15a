//! Phi-3 / Phi-3.5 / Phi-4-mini: the Llama stack with fused `qkv_proj` and `gate_up_proj`,
//! partial rotary (`partial_rotary_factor`) and longrope. Mirrors mlx-lm `models/phi3.py`:
//! `rope_scaling` needs `type` and `long_factor`; `longrope` / `su` build `SuScaledRoPE` from
//! the top-level `max_position_embeddings` (default 131072) and
//! `original_max_position_embeddings` (default 4096); `linear` scales positions. mlx-lm drops
//! any other type with a warning; Weft refuses it at load.

use mlx_rs::Dtype;

use super::llama::{base_spec, Dims};
use super::ConfigReader;
use crate::nn::{DenseDecoder, Rope, Weights};
use crate::{Error, Result};

pub fn load(cfg: &ConfigReader, weights: Weights, dtype: Dtype) -> Result<DenseDecoder> {
    let hidden = cfg.req_i32("hidden_size")?;
    let heads = cfg.req_i32("num_attention_heads")?;
    let kv_heads = cfg.opt_i32("num_key_value_heads")?.unwrap_or(heads);
    let head_dim = hidden / heads;
    let partial = cfg.f32_or("partial_rotary_factor", 1.0)? as f64;
    let rope_dims = (head_dim as f64 * partial) as i32;
    if rope_dims <= 0 || rope_dims > head_dim || rope_dims % 2 != 0 {
        return Err(Error::ModelLoad(format!(
            "config.json: partial_rotary_factor {partial} gives {rope_dims} rotary dims of head_dim {head_dim}"
        )));
    }
    let max_positions = cfg.opt_i32("max_position_embeddings")?.unwrap_or(131_072);
    let theta = cfg.f32_or("rope_theta", 10000.0)? as f64;
    let rope = match cfg.get("rope_scaling") {
        None => Rope::plain(rope_dims, theta as f32, 1.0, cfg.bool_or("rope_traditional", false)?),
        Some(s) => {
            if s.get("long_factor").is_none() || s.get("type").is_none() {
                return Err(Error::ModelLoad(
                    "config.json: phi3 rope_scaling must contain \"long_factor\" and \"type\"".into(),
                ));
            }
            match s["type"].as_str().unwrap_or_default() {
                "longrope" | "su" => {
                    let original = cfg.opt_i32("original_max_position_embeddings")?.unwrap_or(4096);
                    Rope::su_scaled(rope_dims, theta, max_positions as f64, original as f64, s)?
                }
                "linear" => {
                    let factor = s.get("factor").and_then(|f| f.as_f64()).ok_or_else(|| {
                        Error::ModelLoad("config.json: linear rope_scaling needs a numeric \"factor\"".into())
                    })?;
                    Rope::plain(rope_dims, theta as f32, (1.0 / factor) as f32, cfg.bool_or("rope_traditional", false)?)
                }
                other => {
                    return Err(Error::Unsupported(format!(
                        "phi3: rope_scaling type {:?} is not implemented (supported: longrope, su, linear)",
                        other
                    )))
                }
            }
        }
    };
    let dims = Dims { hidden, heads, kv_heads, head_dim };
    let mut spec = base_spec(cfg, dtype, "phi3", dims, rope, Some(max_positions as usize), false)?;
    spec.fused_projections = true;
    DenseDecoder::load(weights, spec)
}
