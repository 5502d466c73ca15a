//! Gemma 3 text models. Mirrors mlx-lm `models/gemma3_text.py` (and `gemma3.py`, whose text
//! part sits in `text_config` with tensors under `language_model.`):
//! - layers alternate sliding-window and global attention: layer i is global when
//!   `(i + 1) % sliding_window_pattern == 0`; sliding layers cache a ring of `sliding_window`
//!   positions and use RoPE base `rope_local_base_freq`, global layers a full cache and
//!   `rope_theta` with `rope_scaling` (any kind `nn::Rope` supports);
//! - Gemma RMSNorm (`1 + w`) everywhere, four norms per block (post-attention and
//!   post-feed-forward norms apply to the branch before the residual add), per-head q/k norms;
//! - attention scale `query_pre_attn_scalar^-0.5`, embeddings scaled by `sqrt(hidden)` rounded
//!   to bfloat16 (as mlx-lm does), GeGLU MLP with tanh-approximated GELU, tied embeddings
//!   unless the checkpoint has `lm_head.weight`;
//! - a `gemma3` checkpoint with a vision tower (mlx-vlm layout) loads it
//!   ([`super::gemma3_vision`]); prompts with images then splice its soft tokens over the
//!   image placeholders, embed pad ids as zeros, and attend causally (mlx-vlm generate_step);
//! - `final_logit_softcapping` (`tanh(x / c) * c`) when configured. mlx-lm 0.32.2 ignores this
//!   option; released Gemma 3 configs leave it null, so parity is unaffected.

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{Array, Dtype};
use serde_json::Value;

use super::gemma3_vision::{self, Gemma3Vision};
use super::{ConfigReader, LanguageModel, ModelInfo, PromptMedia, SlidingWindowLayers};
use crate::cache::{self, KvCache, KvCacheSingle, RotatingKvCache};
use crate::nn::{Attention, AttentionOptions, Embedding, Linear, Mlp, MlpActivation, RmsNorm, Rope, RopeContext, Weights};
use crate::{Error, Result};

struct Block {
    self_attn: Attention,
    mlp: Mlp,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
    pre_feedforward_layernorm: RmsNorm,
    post_feedforward_layernorm: RmsNorm,
    global: bool,
}

pub struct Gemma3 {
    embed_tokens: Embedding,
    layers: Vec<Block>,
    norm: RmsNorm,
    lm_head: Option<Linear>,
    info: ModelInfo,
    window: i32,
    embed_scale: f32,
    final_softcap: Option<f32>,
    vision: Option<Gemma3Vision>,
    /// mlx-vlm zeroes this id's embeddings in prompts with images.
    pad_token_id: u32,
}

/// The text part of a `gemma3` config: `text_config` with mlx-lm's defaults for vocab size
/// (taken from the top level) and head counts.
fn text_config(cfg: &ConfigReader) -> Result<Value> {
    let mut text = cfg
        .get("text_config")
        .filter(|t| t.is_object())
        .cloned()
        .ok_or_else(|| Error::ModelLoad("config.json: gemma3 needs an object \"text_config\"".into()))?;
    let obj = text.as_object_mut().unwrap();
    let vocab = cfg.get("vocab_size").cloned().unwrap_or(Value::from(262_208));
    obj.insert("vocab_size".into(), vocab);
    obj.entry("num_attention_heads").or_insert(Value::from(8));
    obj.entry("num_key_value_heads").or_insert(Value::from(4));
    Ok(text)
}

/// `key` as a positive integer, or mlx-lm's default when absent.
fn int_or(cfg: &ConfigReader, key: &str, default: i32) -> Result<i32> {
    Ok(cfg.opt_i32(key)?.unwrap_or(default))
}

pub fn load(cfg: &ConfigReader, mut w: Weights, dtype: Dtype) -> Result<Gemma3> {
    let multimodal = cfg.req_str("model_type")? == "gemma3";
    let text = if multimodal { text_config(cfg)? } else { Value::Null };
    let tcfg = if multimodal { ConfigReader::new(&text) } else { ConfigReader::new(cfg.raw()) };
    let top = cfg;
    let with_vision = multimodal && gemma3_vision::present(cfg, &w);
    let vision_weights = with_vision.then(|| w.split_prefixes(&["vision_tower.", "multi_modal_projector."]));
    if multimodal {
        // mlx-lm gemma3.sanitize: keep the language model, drop the vision parts.
        w.remove_prefix("vision_tower.");
        w.remove_prefix("multi_modal_projector.");
        w.strip_prefix("language_model.");
    }
    let cfg = &tcfg;
    for key in ["attn_logit_softcapping"] {
        if cfg.get(key).is_some() {
            return Err(Error::Unsupported(format!("gemma3: config option {key:?} is not supported")));
        }
    }
    if let Some(act) = cfg.get("hidden_activation").or_else(|| cfg.get("hidden_act")) {
        if act.as_str() != Some("gelu_pytorch_tanh") {
            return Err(Error::Unsupported(format!(
                "gemma3: hidden_activation {act} is not supported (only \"gelu_pytorch_tanh\")"
            )));
        }
    }
    let hidden = int_or(cfg, "hidden_size", 1152)?;
    let num_layers = int_or(cfg, "num_hidden_layers", 26)? as usize;
    let intermediate = int_or(cfg, "intermediate_size", 6912)?;
    let heads = int_or(cfg, "num_attention_heads", 4)?;
    let kv_heads = int_or(cfg, "num_key_value_heads", 1)?;
    let head_dim = int_or(cfg, "head_dim", 256)?;
    let eps = cfg.f32_or("rms_norm_eps", 1e-6)?;
    let vocab = int_or(cfg, "vocab_size", 262_144)?;
    let rope_local = cfg.f32_or("rope_local_base_freq", 10_000.0)?;
    let qpas = match cfg.get("query_pre_attn_scalar") {
        None => 256.0,
        Some(v) => v.as_f64().filter(|x| *x > 0.0).ok_or_else(|| {
            Error::ModelLoad(format!("config.json: \"query_pre_attn_scalar\" must be a positive number, got {v}"))
        })?,
    };
    let window = int_or(cfg, "sliding_window", 512)?;
    let pattern = int_or(cfg, "sliding_window_pattern", 6)? as usize;
    let is_global = |i: usize| (i + 1) % pattern == 0;
    if let Some(types) = cfg.get("layer_types").and_then(|t| t.as_array()) {
        let follows = types.len() == num_layers
            && types.iter().enumerate().all(|(i, t)| {
                t.as_str() == Some(if is_global(i) { "full_attention" } else { "sliding_attention" })
            });
        if !follows {
            return Err(Error::Unsupported(format!(
                "gemma3: layer_types does not follow sliding_window_pattern {pattern} (mlx-lm uses the pattern)"
            )));
        }
    }
    let final_softcap = match cfg.get("final_logit_softcapping") {
        None => None,
        Some(v) => Some(v.as_f64().filter(|x| *x > 0.0).ok_or_else(|| {
            Error::ModelLoad(format!("config.json: \"final_logit_softcapping\" must be a positive number, got {v}"))
        })? as f32),
    };
    // mlx-lm: global layers take rope_scaling (any initialize_rope kind), sliding ones not.
    let global_rope = Rope::from_scaling(
        head_dim,
        cfg.f32_or("rope_theta", 1_000_000.0)? as f64,
        false,
        cfg.get("rope_scaling"),
        RopeContext { max_position_embeddings: cfg.opt_i32("max_position_embeddings")? },
    )?;

    w.ignore_suffix("self_attn.rotary_emb.inv_freq");
    let tied = !w.contains("lm_head.weight");
    let embed_tokens = Embedding::load(&mut w, "model.embed_tokens", vocab, hidden)?;
    let scale = (qpas.powf(-0.5)) as f32;
    let mut layers = Vec::with_capacity(num_layers);
    for i in 0..num_layers {
        let p = format!("model.layers.{i}");
        let global = is_global(i);
        let rope = if global { global_rope.clone() } else { Rope::plain(head_dim, rope_local, 1.0, false) };
        let opts = AttentionOptions {
            hidden,
            heads,
            kv_heads,
            head_dim,
            qkv_bias: false,
            o_bias: false,
            qk_norm_eps: None,
            rope,
        };
        let a = format!("{p}.self_attn");
        let q_norm = RmsNorm::load_gemma(&mut w, &format!("{a}.q_norm"), head_dim, eps)?;
        let k_norm = RmsNorm::load_gemma(&mut w, &format!("{a}.k_norm"), head_dim, eps)?;
        let self_attn = Attention::load(&mut w, &a, opts)?.with_scale(scale).with_qk_norms(q_norm, k_norm);
        let norm = |w: &mut Weights, name: &str| RmsNorm::load_gemma(w, &format!("{p}.{name}"), hidden, eps);
        layers.push(Block {
            self_attn,
            mlp: Mlp::load_with(&mut w, &format!("{p}.mlp"), hidden, intermediate, false, MlpActivation::GeluApprox)?,
            input_layernorm: norm(&mut w, "input_layernorm")?,
            post_attention_layernorm: norm(&mut w, "post_attention_layernorm")?,
            pre_feedforward_layernorm: norm(&mut w, "pre_feedforward_layernorm")?,
            post_feedforward_layernorm: norm(&mut w, "post_feedforward_layernorm")?,
            global,
        });
    }
    let norm = RmsNorm::load_gemma(&mut w, "model.norm", hidden, eps)?;
    let lm_head = if tied { None } else { Some(Linear::load(&mut w, "lm_head", hidden, vocab, false)?) };
    w.finish()?;
    let sliding_layers = layers.iter().filter(|l| !l.global).count();
    let info = ModelInfo {
        model_type: "gemma3_text".into(),
        vocab_size: vocab,
        hidden_size: hidden,
        num_layers,
        kv_heads,
        head_dim,
        max_position_embeddings: cfg.opt_i32("max_position_embeddings")?.map(|n| n as usize),
        activation_dtype: dtype,
        sliding_window: (sliding_layers > 0)
            .then_some(SlidingWindowLayers { layers: sliding_layers, window: window as usize }),
    };
    // mlx-lm: h *= mx.array(hidden ** 0.5, bfloat16).astype(h.dtype)
    let embed_scale = (hidden as f64).sqrt() as f32;
    let vision = match vision_weights {
        Some(mut vw) => {
            let mm_tokens = cfg.opt_i32("mm_tokens_per_image")?.unwrap_or(256);
            let v = gemma3_vision::load(top, &mut vw, hidden, mm_tokens, dtype)?;
            vw.finish()?;
            Some(v)
        }
        None => None,
    };
    let pad_token_id = top.get("pad_token_id").and_then(|v| v.as_u64()).unwrap_or(0) as u32;
    Ok(Gemma3 { embed_tokens, layers, norm, lm_head, info, window, embed_scale, final_softcap, vision, pad_token_id })
}

/// mlx-lm `clip_residual`: float16 sums are formed in float32 and clipped to float16's range.
fn residual(x: &Array, y: &Array) -> Result<Array> {
    if x.dtype() != Dtype::Float16 {
        return Ok(x.add(y)?);
    }
    let bound = Array::from_f32(65504.0);
    let sum = x.as_dtype(Dtype::Float32)?.add(&y.as_dtype(Dtype::Float32)?)?;
    Ok(mlx_rs::ops::clip(&sum, (&bound.negative()?, &bound))?.as_dtype(Dtype::Float16)?)
}

impl Gemma3 {
    /// mlx-vlm `prepare_inputs_for_multimodal`: rows with media embed pad ids as zeros; soft
    /// tokens replace their columns (before the embedding scale, as there).
    fn media_embeddings(&self, tokens: &Array, media: &PromptMedia) -> Result<Array> {
        let h = self.embed_tokens.forward(tokens)?;
        let (b, l, d) = (h.dim(0), h.dim(1), h.dim(2));
        if media.rows.len() != b as usize {
            return Err(Error::InvalidRequest(format!("media for {} rows, input has {b}", media.rows.len())));
        }
        let flags: Vec<bool> = media.rows.clone();
        let rows_with = Array::from_slice(&flags, &[b, 1, 1]);
        let pad = tokens.eq(&Array::from_int(self.pad_token_id as i32).as_dtype(tokens.dtype())?)?.expand_dims(-1)?;
        let zero_pad = rows_with.logical_and(&pad)?;
        let h = mlx_rs::ops::select(&zero_pad, &Array::from_f32(0.0).as_dtype(h.dtype())?, &h)?;
        if media.soft.is_empty() {
            return Ok(h);
        }
        let mut rows = Vec::with_capacity(b as usize);
        for r in 0..b as usize {
            let mut spans: Vec<_> = media.soft.iter().filter(|s| s.row == r).collect();
            if spans.is_empty() {
                rows.push(h.index(r as i32));
                continue;
            }
            spans.sort_by_key(|s| s.col);
            let row = h.index(r as i32);
            let mut parts = Vec::new();
            let mut at = 0i32;
            for s in spans {
                let (col, n) = (s.col as i32, s.embeddings.dim(0));
                if col < at || col + n > l || s.embeddings.ndim() != 2 || s.embeddings.dim(1) != d {
                    return Err(Error::InvalidRequest(format!(
                        "soft tokens {:?} at column {col} do not fit row {r} of {l} x {d}",
                        s.embeddings.shape()
                    )));
                }
                if col > at {
                    parts.push(row.index(at..col));
                }
                parts.push(s.embeddings.as_dtype(h.dtype())?);
                at = col + n;
            }
            if at < l {
                parts.push(row.index(at..l));
            }
            rows.push(mlx_rs::ops::concatenate(&parts, 0)?);
        }
        Ok(mlx_rs::ops::stack(&rows, 0)?)
    }

    /// The text model over token embeddings (not yet scaled).
    fn forward_embeddings(&self, h: Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        if caches.len() != self.layers.len() {
            return Err(Error::InvalidRequest(format!("{} caches for {} layers", caches.len(), self.layers.len())));
        }
        let scale = Array::from_f32(self.embed_scale).as_dtype(Dtype::Bfloat16)?.as_dtype(h.dtype())?;
        let mut h = h.multiply(&scale)?;
        let n = h.dim(1);
        // One mask per layer kind, each from a cache of that kind (mlx-lm takes the global
        // one from the first global layer and the sliding one from layer 0).
        let global_mask = match self.layers.iter().position(|l| l.global) {
            Some(i) => Some(cache::make_mask(caches[i].as_ref(), n, None)?),
            None => None,
        };
        let sliding_mask = match self.layers.iter().position(|l| !l.global) {
            Some(i) => Some(cache::make_mask(caches[i].as_ref(), n, Some(self.window))?),
            None => None,
        };
        for (layer, cache) in self.layers.iter().zip(caches.iter_mut()) {
            let mask = if layer.global { global_mask.as_ref() } else { sliding_mask.as_ref() };
            let mask = mask.ok_or_else(|| Error::Mlx("no attention mask for a layer kind".into()))?;
            let r = layer.self_attn.forward(&layer.input_layernorm.forward(&h)?, mask, cache::attention(cache.as_mut())?)?;
            h = residual(&h, &layer.post_attention_layernorm.forward(&r)?)?;
            let r = layer.mlp.forward(&layer.pre_feedforward_layernorm.forward(&h)?)?;
            h = residual(&h, &layer.post_feedforward_layernorm.forward(&r)?)?;
        }
        let h = self.norm.forward(&h)?;
        let logits = match &self.lm_head {
            Some(head) => head.forward(&h)?,
            None => self.embed_tokens.as_linear(&h)?,
        };
        match self.final_softcap {
            None => Ok(logits),
            Some(c) => {
                let c = Array::from_f32(c).as_dtype(logits.dtype())?;
                Ok(mlx_rs::ops::tanh(&logits.divide(&c)?)?.multiply(&c)?)
            }
        }
    }
}

impl LanguageModel for Gemma3 {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        self.forward_embeddings(self.embed_tokens.forward(tokens)?, caches)
    }

    fn vision(&self) -> Option<&dyn crate::vision::VisionTower> {
        self.vision.as_ref().map(|v| v as &dyn crate::vision::VisionTower)
    }

    fn forward_with_media(&self, tokens: &Array, media: &PromptMedia, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        if self.vision.is_none() {
            return Err(Error::InvalidRequest("this gemma3 checkpoint has no vision tower: it takes no images".into()));
        }
        self.forward_embeddings(self.media_embeddings(tokens, media)?, caches)
    }

    fn make_caches(&self) -> Vec<Box<dyn KvCache>> {
        self.layers
            .iter()
            .map(|l| {
                if l.global {
                    Box::new(KvCacheSingle::new()) as Box<dyn KvCache>
                } else {
                    Box::new(RotatingKvCache::new(self.window)) as Box<dyn KvCache>
                }
            })
            .collect()
    }

    fn fast_cpu_kernels(&self) -> bool {
        self.norm.is_fast()
    }

    fn info(&self) -> &ModelInfo {
        &self.info
    }
}
