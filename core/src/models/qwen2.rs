//! Qwen2: the Llama stack with biases on the q/k/v projections (not on o_proj).
//! Mirrors mlx-lm `models/qwen2.py`.

use mlx_rs::Dtype;

use super::{ConfigReader, ModelInfo};
use crate::nn::{AttentionOptions, DecoderScaling, DenseDecoder, DenseDecoderSpec, Weights};
use crate::Result;

pub fn load(cfg: &ConfigReader, weights: Weights, dtype: Dtype) -> Result<DenseDecoder> {
    let hidden = cfg.req_i32("hidden_size")?;
    let heads = cfg.req_i32("num_attention_heads")?;
    let kv_heads = cfg.req_i32("num_key_value_heads")?;
    let head_dim = hidden / heads;
    let spec = DenseDecoderSpec {
        info: ModelInfo {
            model_type: "qwen2".into(),
            vocab_size: cfg.req_i32("vocab_size")?,
            hidden_size: hidden,
            num_layers: cfg.req_i32("num_hidden_layers")? as usize,
            kv_heads,
            head_dim,
            max_position_embeddings: Some(cfg.opt_i32("max_position_embeddings")?.unwrap_or(32768) as usize),
            activation_dtype: dtype,
            sliding_window: None,
        },
        intermediate: cfg.req_i32("intermediate_size")?,
        rms_norm_eps: cfg.req_f32("rms_norm_eps")?,
        mlp_bias: false,
        tie_word_embeddings: cfg.bool_or("tie_word_embeddings", true)?,
        attention: AttentionOptions {
            hidden,
            heads,
            kv_heads,
            head_dim,
            qkv_bias: true,
            o_bias: false,
            qk_norm_eps: None,
            rope: cfg.rope(head_dim, Some(1_000_000.0), cfg.bool_or("rope_traditional", false)?)?,
        },
        nope_layers: Vec::new(),
        fused_projections: false,
        scaling: DecoderScaling::default(),
    };
    DenseDecoder::load(weights, spec)
}
