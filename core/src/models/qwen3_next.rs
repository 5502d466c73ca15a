//! Qwen3-Next: the hybrid stack ([`crate::nn::HybridDecoder`]) with gated DeltaNet layers
//! projecting through interleaved `in_proj_qkvz` / `in_proj_ba`, output-gated attention with
//! partial RoPE every `full_attention_interval`-th layer, and shared-expert MoE feed-forwards
//! (dense MLP on `mlp_only_layers` and off the `decoder_sparse_step`). Mirrors mlx-lm
//! `models/qwen3_next.py` for checkpoints in mlx-lm's layout.

use mlx_rs::Dtype;

use super::{ConfigReader, ModelInfo};
use crate::nn::{
    FeedForwardSpec, GatedAttentionOptions, GatedDeltaOptions, HybridDecoder, HybridDecoderSpec, ProjectionLayout,
    SharedExpertMoeOptions, Weights,
};
use crate::{Error, Result};

/// A non-negative integer (`num_experts` may be 0), or `default` when absent.
pub(crate) fn count_or(cfg: &ConfigReader, key: &str, default: i32) -> Result<i32> {
    match cfg.get(key) {
        None => Ok(default),
        Some(v) => v
            .as_i64()
            .filter(|n| (0..i32::MAX as i64).contains(n))
            .map(|n| n as i32)
            .ok_or_else(|| Error::ModelLoad(format!("config.json: {key:?} must be a non-negative integer, got {v}"))),
    }
}

/// `int(head_dim * partial_rotary_factor)`, as mlx-lm sizes the rotated part of each head.
pub(crate) fn rotary_dims(head_dim: i32, factor: f32) -> Result<i32> {
    let dims = (head_dim as f64 * factor as f64) as i32;
    if dims <= 0 || dims > head_dim || dims % 2 != 0 {
        return Err(Error::ModelLoad(format!(
            "config.json: partial_rotary_factor {factor} gives {dims} rotary dims of head_dim {head_dim}"
        )));
    }
    Ok(dims)
}

pub fn load(cfg: &ConfigReader, weights: Weights, dtype: Dtype) -> Result<HybridDecoder> {
    let hidden = cfg.req_i32("hidden_size")?;
    let layers = cfg.req_i32("num_hidden_layers")? as usize;
    let heads = cfg.req_i32("num_attention_heads")?;
    let kv_heads = cfg.req_i32("num_key_value_heads")?;
    let head_dim = cfg.req_i32("head_dim")?;
    let eps = cfg.req_f32("rms_norm_eps")?;
    let tied = cfg.bool_or("tie_word_embeddings", false)?;
    let rope_dims = rotary_dims(head_dim, cfg.req_f32("partial_rotary_factor")?)?;

    let num_experts = count_or(cfg, "num_experts", 0)?;
    let sparse_step = count_or(cfg, "decoder_sparse_step", 1)?.max(1) as usize;
    let mlp_only: Vec<usize> = match cfg.get("mlp_only_layers") {
        None => Vec::new(),
        Some(v) => v
            .as_array()
            .and_then(|a| a.iter().map(|x| x.as_u64().map(|n| n as usize)).collect::<Option<Vec<_>>>())
            .ok_or_else(|| Error::ModelLoad(format!("config.json: \"mlp_only_layers\" must be a list of layer indices, got {v}")))?,
    };
    let intermediate = cfg.req_i32("intermediate_size")?;
    let moe = if num_experts > 0 {
        Some(SharedExpertMoeOptions {
            hidden,
            num_experts,
            top_k: cfg.req_i32("num_experts_per_tok")?,
            moe_intermediate: cfg.req_i32("moe_intermediate_size")?,
            shared_intermediate: cfg.req_i32("shared_expert_intermediate_size")?,
            norm_topk_prob: cfg.bool_or("norm_topk_prob", false)?,
        })
    } else {
        None
    };
    let feed_forward = (0..layers)
        .map(|i| match &moe {
            Some(m) if !mlp_only.contains(&i) && (i + 1) % sparse_step == 0 => FeedForwardSpec::Moe(m.clone()),
            _ => FeedForwardSpec::Dense { intermediate },
        })
        .collect();

    let spec = HybridDecoderSpec {
        info: ModelInfo {
            model_type: "qwen3_next".into(),
            vocab_size: cfg.req_i32("vocab_size")?,
            hidden_size: hidden,
            num_layers: layers,
            kv_heads,
            head_dim,
            max_position_embeddings: cfg.opt_i32("max_position_embeddings")?.map(|n| n as usize),
            activation_dtype: dtype,
            sliding_window: None,
        },
        prefix: "model".into(),
        lm_head: (!tied).then(|| "lm_head".to_string()),
        tied_head_name: "lm_head".into(),
        rms_norm_eps: eps,
        full_attention_interval: count_or(cfg, "full_attention_interval", 4)? as usize,
        linear: GatedDeltaOptions {
            hidden,
            num_k_heads: cfg.req_i32("linear_num_key_heads")?,
            num_v_heads: cfg.req_i32("linear_num_value_heads")?,
            head_k_dim: cfg.req_i32("linear_key_head_dim")?,
            head_v_dim: cfg.req_i32("linear_value_head_dim")?,
            conv_kernel: cfg.req_i32("linear_conv_kernel_dim")?,
            rms_norm_eps: eps,
            layout: ProjectionLayout::Interleaved,
        },
        attention: GatedAttentionOptions {
            hidden,
            heads,
            kv_heads,
            head_dim,
            bias: cfg.bool_or("attention_bias", false)?,
            rms_norm_eps: eps,
            rope: cfg.rope(rope_dims, None, false)?,
        },
        feed_forward,
    };
    HybridDecoder::load(weights, spec)
}
