//! Ministral 3 (`ministral3`) and the text path of Mistral 3 (`mistral3`, a multimodal
//! checkpoint whose `text_config` is a ministral3 or Llama model). Mirrors mlx-lm
//! `models/ministral3.py` / `mistral3.py`:
//! - the Llama stack without biases, RoPE from `rope_parameters` (its `rope_theta` and any
//!   `nn::Rope` kind, e.g. yarn);
//! - queries scaled after RoPE by `1 + llama_4_scaling_beta * ln(1 + floor(pos /
//!   original_max_position_embeddings))` (both from `rope_parameters`);
//! - `mistral3` drops `vision_tower` / `multi_modal_projector` tensors and reads the language
//!   model under `language_model.` (mlx-lm's layout) or `model.language_model.` (Hugging
//!   Face's); its text part is untied unless `text_config` says otherwise. Images are not
//!   supported. Sliding-window `layer_types` fail at load.

use mlx_rs::Dtype;
use serde_json::Value;

use super::{llama, ConfigReader};
use crate::nn::{DecoderScaling, DenseDecoder, Rope, RopeContext, Weights};
use crate::{Error, Result};

pub fn load_mistral3(cfg: &ConfigReader, mut w: Weights, dtype: Dtype) -> Result<DenseDecoder> {
    let mut text = cfg
        .get("text_config")
        .filter(|t| t.is_object())
        .cloned()
        .ok_or_else(|| Error::ModelLoad("config.json: mistral3 needs an object \"text_config\"".into()))?;
    text.as_object_mut().unwrap().entry("tie_word_embeddings").or_insert(Value::Bool(false));
    for prefix in ["vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector."] {
        w.remove_prefix(prefix);
    }
    w.rename_prefix("model.language_model.", "model.");
    w.strip_prefix("language_model.");
    let tcfg = ConfigReader::new(&text);
    match text.get("model_type").and_then(|t| t.as_str()) {
        Some("ministral3") => load(&tcfg, w, dtype),
        Some("llama") | Some("mistral") | None => DenseDecoder::load(w, llama::spec(&tcfg, dtype, "llama")?),
        Some(other) => Err(Error::Unsupported(format!(
            "mistral3 with a {other:?} text model (supported: ministral3, llama, mistral)"
        ))),
    }
}

pub fn load(cfg: &ConfigReader, weights: Weights, dtype: Dtype) -> Result<DenseDecoder> {
    let hidden = cfg.req_i32("hidden_size")?;
    let heads = cfg.req_i32("num_attention_heads")?;
    let kv_heads = cfg.opt_i32("num_key_value_heads")?.unwrap_or(heads);
    let head_dim = cfg.opt_i32("head_dim")?.unwrap_or(hidden / heads);
    llama::full_attention_only(cfg, "ministral3")?;
    let params = cfg
        .get("rope_parameters")
        .ok_or_else(|| Error::ModelLoad("config.json: ministral3 needs \"rope_parameters\"".into()))?;
    let param = |key: &str| {
        params.get(key).and_then(|v| v.as_f64()).ok_or_else(|| {
            Error::ModelLoad(format!("config.json: rope_parameters needs a numeric {key:?}"))
        })
    };
    let theta = param("rope_theta")?;
    let beta = param("llama_4_scaling_beta")? as f32;
    let original_max = param("original_max_position_embeddings")?;
    if original_max < 1.0 || original_max.fract() != 0.0 {
        return Err(Error::ModelLoad(format!(
            "config.json: rope_parameters original_max_position_embeddings must be a positive integer, got {original_max}"
        )));
    }
    let max_positions = cfg.opt_i32("max_position_embeddings")?;
    let rope = Rope::from_scaling(head_dim, theta, false, Some(params), RopeContext { max_position_embeddings: max_positions })?;
    let max_positions = if rope.extends_context() { None } else { max_positions.map(|n| n as usize) };
    let dims = llama::Dims { hidden, heads, kv_heads, head_dim };
    let mut spec = llama::base_spec(cfg, dtype, "ministral3", dims, rope, max_positions, true)?;
    spec.scaling = DecoderScaling { query_position_scaling: Some((beta, original_max as i32)), ..DecoderScaling::default() };
    DenseDecoder::load(weights, spec)
}
