//! Gemma 3 GGUF files (llama.cpp's `gemma3` architecture, e.g. google/gemma-3-270m Q4_K_M).
//! MLX's GGUF reader takes none of K-quant / Q5_0 blocks, so every tensor is read and
//! dequantized to float32 on the host (`gguf_dequant`, bit-equal to gguf-py), then loaded as a
//! dense `gemma3_text` model. goldens/make_gemma3_270m_goldens.py does the same conversion for
//! the mlx-lm reference; the decisions:
//! - llama.cpp folds Gemma's `1 + w` into the norm weights; 1.0 is subtracted again (float32).
//! - Names: see `hf_name`; q/k rows are not permuted for gemma3; no `output.weight` → tied.
//! - Config from `gemma3.*` metadata; `sliding_window_pattern` 6, `rope_local_base_freq` 10000
//!   and `query_pre_attn_scalar` = head_dim are what llama.cpp assumes for gemma3; linear
//!   `rope.scaling` metadata maps to `rope_scaling`.
//! - The tokenizer comes from the file's metadata (`Tokenizer::from_gguf`; Gemma's SentencePiece
//!   vocabulary is built in `tokenizer/gguf_spm.rs`).

use std::collections::HashMap;
use std::path::Path;

use mlx_rs::Array;
use serde_json::json;

use super::{build_model, gguf_dequant, GenerationDefaults, LoadedModel};
use crate::gguf::GgufHeader;
use crate::tokenizer::Tokenizer;
use crate::{Error, Result};

/// GGUF tensor name → mlx-lm gemma3_text name.
fn hf_name(name: &str) -> Option<String> {
    let (base, suffix) = name.rsplit_once('.')?;
    let module = match base {
        "token_embd" => "model.embed_tokens".to_string(),
        "output_norm" => "model.norm".to_string(),
        "output" => "lm_head".to_string(),
        _ => {
            let rest = base.strip_prefix("blk.")?;
            let (layer, part) = rest.split_once('.')?;
            let layer: usize = layer.parse().ok()?;
            let part = match part {
                "attn_q" => "self_attn.q_proj",
                "attn_k" => "self_attn.k_proj",
                "attn_v" => "self_attn.v_proj",
                "attn_output" => "self_attn.o_proj",
                "attn_q_norm" => "self_attn.q_norm",
                "attn_k_norm" => "self_attn.k_norm",
                "ffn_gate" => "mlp.gate_proj",
                "ffn_up" => "mlp.up_proj",
                "ffn_down" => "mlp.down_proj",
                "attn_norm" => "input_layernorm",
                "post_attention_norm" => "post_attention_layernorm",
                "ffn_norm" => "pre_feedforward_layernorm",
                "post_ffw_norm" => "post_feedforward_layernorm",
                _ => return None,
            };
            format!("model.layers.{layer}.{part}")
        }
    };
    Some(format!("{module}.{suffix}"))
}

fn config(h: &GgufHeader) -> Result<serde_json::Value> {
    let int = |k: &str| -> Result<u64> {
        h.get_u64(&format!("gemma3.{k}")).ok_or_else(|| Error::ModelLoad(format!("GGUF metadata is missing gemma3.{k}")))
    };
    let hidden = int("embedding_length")?;
    let heads = int("attention.head_count")?;
    let head_dim = h.get_u64("gemma3.attention.key_length").unwrap_or(hidden / heads.max(1));
    let vocab = match h.get_u64("gemma3.vocab_size") {
        Some(v) => v,
        None => h
            .tensors
            .iter()
            .find(|t| t.name == "token_embd.weight")
            .and_then(|t| t.dims.get(1).copied())
            .ok_or_else(|| Error::ModelLoad("GGUF has no token_embd.weight".into()))?,
    };
    let mut cfg = json!({
        "model_type": "gemma3_text",
        "hidden_size": hidden,
        "num_hidden_layers": int("block_count")?,
        "intermediate_size": int("feed_forward_length")?,
        "num_attention_heads": heads,
        "num_key_value_heads": h.get_u64("gemma3.attention.head_count_kv").unwrap_or(heads),
        "head_dim": head_dim,
        "vocab_size": vocab,
        "rms_norm_eps": h.get_f64("gemma3.attention.layer_norm_rms_epsilon").unwrap_or(1e-6),
        "rope_theta": h.get_f64("gemma3.rope.freq_base").unwrap_or(1_000_000.0),
        "rope_local_base_freq": 10000.0,
        "query_pre_attn_scalar": head_dim,
        "sliding_window": int("attention.sliding_window")?,
        "sliding_window_pattern": 6,
    });
    if let Some(ctx) = h.get_u64("gemma3.context_length") {
        cfg["max_position_embeddings"] = json!(ctx);
    }
    match h.get_str("gemma3.rope.scaling.type") {
        None | Some("none") => {}
        Some(kind) => {
            let factor = h.get_f64("gemma3.rope.scaling.factor").unwrap_or(1.0);
            cfg["rope_scaling"] = json!({ "rope_type": kind, "factor": factor });
        }
    }
    Ok(cfg)
}

pub fn load(path: &Path, header: GgufHeader) -> Result<LoadedModel> {
    let cfg = config(&header)?;
    let mut file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let file_len = file.metadata().map_err(|e| Error::io(path, e))?.len();
    let mut tensors: HashMap<String, Array> = HashMap::with_capacity(header.tensors.len());
    for t in &header.tensors {
        let name = hf_name(&t.name)
            .ok_or_else(|| Error::Unsupported(format!("GGUF tensor '{}' has no known mapping for gemma3", t.name)))?;
        let (block, block_bytes) = gguf_dequant::block_layout(t.ggml_type()).ok_or_else(|| {
            Error::Unsupported(format!("GGUF tensor '{}' has type {}, which Weft cannot read", t.name, t.ggml_type()))
        })?;
        let n: u64 = t.dims.iter().product();
        let end = header.data_offset + t.offset + n / block as u64 * block_bytes as u64;
        if end > file_len {
            return Err(Error::ModelLoad(format!(
                "{}: GGUF tensor '{}' extends past the end of the file; the file is truncated or corrupt",
                path.display(),
                t.name
            )));
        }
        let mut a = gguf_dequant::read_f32(&mut file, path, &header, t)?;
        if name.ends_with("norm.weight") {
            a = a.subtract(Array::from_f32(1.0))?;
        }
        tensors.insert(name, a);
    }
    let model = build_model(&cfg, tensors)?;
    let tokenizer = match header.get_str("tokenizer.ggml.model") {
        Some(_) => Some(Tokenizer::from_gguf(&header)?),
        None => None,
    };
    let eos = match &tokenizer {
        Some(t) => t.eos_token_ids().to_vec(),
        None => header.get_u64("tokenizer.ggml.eos_token_id").map(|id| vec![id as u32]).unwrap_or_default(),
    };
    Ok(LoadedModel { model, tokenizer, eos_token_ids: eos, defaults: GenerationDefaults::default(), source: path.to_path_buf() })
}
