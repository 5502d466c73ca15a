//! Qwen3.5 (text): the Qwen3-Next hybrid stack with separate gated DeltaNet projections
//! (`in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`), RoPE from `rope_parameters`
//! (a quarter of each head rotated by default), and a dense MLP (or shared-expert MoE on every
//! layer when `num_experts > 0`, as `qwen3_5_moe` checkpoints have). The config may nest the
//! text model under `text_config` and mlx-lm checkpoints keep it under `language_model.`.
//! Mirrors mlx-lm `models/qwen3_5.py` (and `qwen3_5_moe.py`, which reuses it).

use mlx_rs::Dtype;

use super::qwen3_next::{count_or, rotary_dims};
use super::{ConfigReader, ModelInfo};
use crate::nn::{
    FeedForwardSpec, GatedAttentionOptions, GatedDeltaOptions, HybridDecoder, HybridDecoderSpec, ProjectionLayout,
    SharedExpertMoeOptions, Weights,
};
use crate::{Error, Result};

pub fn load(config: &serde_json::Value, weights: Weights, dtype: Dtype) -> Result<HybridDecoder> {
    let cfg = match config.get("text_config").filter(|t| !t.is_null()) {
        Some(t) if t.is_object() => ConfigReader::new(t),
        Some(t) => return Err(Error::ModelLoad(format!("config.json: \"text_config\" must be an object, got {t}"))),
        None => ConfigReader::new(config),
    };
    let hidden = cfg.req_i32("hidden_size")?;
    let layers = cfg.req_i32("num_hidden_layers")? as usize;
    let heads = cfg.req_i32("num_attention_heads")?;
    let kv_heads = cfg.req_i32("num_key_value_heads")?;
    let head_dim = cfg.opt_i32("head_dim")?.unwrap_or(hidden / heads);
    let eps = cfg.f32_or("rms_norm_eps", 1e-6)?;
    let tied = cfg.bool_or("tie_word_embeddings", false)?;

    // mlx-lm: without rope_parameters its defaults apply (theta 1e5, a quarter rotated).
    let (theta, factor, scaling) = match cfg.get("rope_parameters") {
        Some(p) => (
            p.get("rope_theta").and_then(|t| t.as_f64()).unwrap_or(100000.0),
            p.get("partial_rotary_factor").and_then(|f| f.as_f64()).unwrap_or(0.25),
            p.clone(),
        ),
        None => (100000.0, 0.25, serde_json::json!({"type": "default"})),
    };
    let rope_dims = rotary_dims(head_dim, factor as f32)?;
    let rope_cfg = serde_json::json!({"rope_theta": theta, "rope_scaling": scaling});
    let rope = ConfigReader::new(&rope_cfg).rope(rope_dims, None, false)?;

    let num_experts = count_or(&cfg, "num_experts", 0)?;
    let ffn = if num_experts > 0 {
        FeedForwardSpec::Moe(SharedExpertMoeOptions {
            hidden,
            num_experts,
            top_k: cfg.req_i32("num_experts_per_tok")?,
            moe_intermediate: cfg.req_i32("moe_intermediate_size")?,
            shared_intermediate: cfg.req_i32("shared_expert_intermediate_size")?,
            norm_topk_prob: cfg.bool_or("norm_topk_prob", true)?,
        })
    } else {
        FeedForwardSpec::Dense { intermediate: cfg.req_i32("intermediate_size")? }
    };

    // mlx-lm saves the text model under `language_model.`; a text-only dir may not.
    let nested = ["weight", "scales"].iter().any(|s| weights.contains(&format!("language_model.model.embed_tokens.{s}")));
    let (prefix, head) = if nested { ("language_model.model", "language_model.lm_head") } else { ("model", "lm_head") };

    let spec = HybridDecoderSpec {
        info: ModelInfo {
            model_type: ConfigReader::new(config).req_str("model_type")?,
            vocab_size: cfg.req_i32("vocab_size")?,
            hidden_size: hidden,
            num_layers: layers,
            kv_heads,
            head_dim,
            max_position_embeddings: cfg.opt_i32("max_position_embeddings")?.map(|n| n as usize),
            activation_dtype: dtype,
            sliding_window: None,
        },
        prefix: prefix.into(),
        lm_head: (!tied).then(|| head.to_string()),
        tied_head_name: head.into(),
        rms_norm_eps: eps,
        full_attention_interval: count_or(&cfg, "full_attention_interval", 4)? as usize,
        linear: GatedDeltaOptions {
            hidden,
            num_k_heads: cfg.req_i32("linear_num_key_heads")?,
            num_v_heads: cfg.req_i32("linear_num_value_heads")?,
            head_k_dim: cfg.req_i32("linear_key_head_dim")?,
            head_v_dim: cfg.req_i32("linear_value_head_dim")?,
            conv_kernel: cfg.opt_i32("linear_conv_kernel_dim")?.unwrap_or(4),
            rms_norm_eps: eps,
            layout: ProjectionLayout::Separate,
        },
        attention: GatedAttentionOptions {
            hidden,
            heads,
            kv_heads,
            head_dim,
            bias: cfg.bool_or("attention_bias", false)?,
            rms_norm_eps: eps,
            rope,
        },
        feed_forward: vec![ffn; layers],
    };
    HybridDecoder::load(weights, spec)
}
