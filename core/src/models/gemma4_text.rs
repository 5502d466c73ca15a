//! Gemma 4 text models. Mirrors mlx-lm `models/gemma4_text.py` (and `gemma4.py`, whose text
//! part sits in `text_config` with tensors under `language_model.`):
//! - `layer_types` (or `sliding_window_pattern`) picks sliding-window or full attention per
//!   layer; each kind has its own `rope_parameters` entry (any kind `nn::Rope` builds; Gemma 4
//!   uses `proportional` RoPE over part of the full layers' `global_head_dim` heads);
//! - KV sharing: the last `num_kv_shared_layers` layers have no K/V projections or cache;
//!   each attends over the keys/values (and RoPE offset) of the last earlier layer of its
//!   kind, so only the first layers own caches and the engine only ever sees those;
//! - per-layer inputs (`hidden_size_per_layer_input`): a second embedding table plus a
//!   projection of the scaled embeddings, one slice per layer, gated into the stream after
//!   the MLP; KV-shared layers use a double-wide MLP (`use_double_wide_mlp`);
//! - plain RMSNorm (stored weight, not Gemma 3's `1 + w`), q/k norms, a scale-free v norm,
//!   attention scale 1, `layer_scalar` on each block's output, GeGLU, tied head unless the
//!   checkpoint has `lm_head.weight`, `final_logit_softcapping`;
//! - `attention_k_eq_v` (full layers use the raw keys as values, with
//!   `num_global_key_value_heads`).
//! - the MoE block (`enable_moe_block`, 26B-A4B): beside each layer's dense MLP, a router
//!   (RMSNorm with a learned scale, top-k of the projected scores, softmax over the chosen,
//!   times a per-expert scale) picks `top_k_experts` GeGLU experts ([`SwitchGlu`], dense or
//!   quantized); the two branches are normed and summed (mlx-lm `Router` / `Experts`).
//!
//! With KV sharing a quantized KV cache is refused when the engine starts: KV-shared layers
//! read another layer's cached keys and values, which mlx-lm cannot do on quantized caches
//! either.

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{Array, Dtype};
use serde_json::{json, Value};

use super::gemma4_vision::{self, Gemma4Vision};
use crate::vision::VisionTower;
use super::{ConfigReader, LanguageModel, ModelInfo, SlidingWindowLayers};
use crate::cache::{self, sdpa, AttentionMask, KvCache, KvCacheSingle, RopeOffset, RotatingKvCache};
use crate::nn::{gelu_approx, Embedding, Linear, Mlp, MlpActivation, RmsNorm, Rope, RopeContext, SwitchGlu, Weights};
use crate::{Error, Result};

const QUANTIZED_KV: &str =
    "gemma4_text: a quantized KV cache (kv_bits) is not supported: its KV-shared layers attend over other layers' cached keys and values";

/// Keys and values a layer attended over, with the RoPE offset its queries used: what a
/// KV-shared layer borrows from its source layer.
#[derive(Clone)]
struct SharedKv {
    keys: Array,
    values: Array,
    offset: RopeOffset,
}

enum KvSource {
    /// This layer projects keys and values and owns cache `cache`; `shared`: later layers
    /// read them.
    Own { k_proj: Linear, v_proj: Option<Linear>, k_norm: RmsNorm, cache: usize, shared: bool },
    /// This layer reuses layer `layer`'s keys and values.
    Shared { layer: usize },
}

struct Attention {
    q_proj: Linear,
    o_proj: Linear,
    q_norm: RmsNorm,
    kv: KvSource,
    heads: i32,
    kv_heads: i32,
    rope: Rope,
    eps: f32,
    /// Weft's attention primitive (fast mode on the CPU at load).
    fast: bool,
}

/// The per-layer input branch of a block: `h + norm(proj(gelu(gate(h)) * input))`.
struct PerLayerGate {
    input_gate: Linear,
    projection: Linear,
    post_norm: RmsNorm,
}

/// The MoE branch of a 26B-A4B layer (mlx-lm `Router` + `Experts` and their norms).
struct MoeBranch {
    router_proj: Linear,
    /// `[hidden]`; the router's RMSNorm weight is `scale * hidden^-1/2`.
    router_scale: Array,
    /// `[experts]`, multiplies each chosen expert's weight.
    per_expert_scale: Array,
    experts: SwitchGlu,
    top_k: i32,
    eps: f32,
    root_size: f32,
    pre_feedforward_layernorm_2: RmsNorm,
    post_feedforward_layernorm_1: RmsNorm,
    post_feedforward_layernorm_2: RmsNorm,
}

impl MoeBranch {
    fn load(w: &mut Weights, p: &str, hidden: i32, moe: (i32, i32, i32), eps: f32) -> Result<Self> {
        let (experts, top_k, intermediate) = moe;
        // Hugging Face layout (mlx-lm `sanitize`): one `[E, 2I, H]` gate/up tensor.
        if let Some(gate_up) = w.remove(&format!("{p}.experts.gate_up_proj")) {
            let halves = mlx_rs::ops::split_equal(&gate_up, 2, -2)?;
            for (half, name) in halves.iter().zip(["gate_proj", "up_proj"]) {
                w.insert(format!("{p}.experts.switch_glu.{name}.weight"), half.contiguous()?);
            }
        }
        if let Some(down) = w.remove(&format!("{p}.experts.down_proj")) {
            w.insert(format!("{p}.experts.switch_glu.down_proj.weight"), down);
        }
        let norm = |w: &mut Weights, name: &str| RmsNorm::load(w, &format!("{p}.{name}"), hidden, eps);
        Ok(MoeBranch {
            router_proj: Linear::load(w, &format!("{p}.router.proj"), hidden, experts, false)?,
            router_scale: w.take(&format!("{p}.router.scale"), &[hidden])?,
            per_expert_scale: w.take(&format!("{p}.router.per_expert_scale"), &[experts])?,
            experts: SwitchGlu::load_with(
                w,
                &format!("{p}.experts.switch_glu"),
                experts,
                hidden,
                intermediate,
                MlpActivation::GeluApprox,
            )?,
            top_k,
            eps,
            root_size: (hidden as f64).powf(-0.5) as f32,
            pre_feedforward_layernorm_2: norm(w, "pre_feedforward_layernorm_2")?,
            post_feedforward_layernorm_1: norm(w, "post_feedforward_layernorm_1")?,
            post_feedforward_layernorm_2: norm(w, "post_feedforward_layernorm_2")?,
        })
    }

    /// `h`: the residual stream `[B, L, hidden]`; `dense`: the dense MLP's output. Returns
    /// both branches normed and summed (what the block's `post_feedforward_layernorm` takes).
    fn forward(&self, h: &Array, dense: &Array) -> Result<Array> {
        use mlx_rs::ops::{argpartition_axis, softmax_axis};
        let x = mlx_rs::fast::rms_norm(h, Some(&times(&self.router_scale, self.root_size)?), self.eps)?;
        let scores = self.router_proj.forward(&x)?;
        let experts = scores.dim(-1);
        let inds = argpartition_axis(&scores, -self.top_k, -1)?.index((.., .., experts - self.top_k..));
        let weights = softmax_axis(&scores.take_along_axis(&inds, -1)?, -1, false)?;
        let weights = weights.multiply(self.per_expert_scale.take_axis(&inds, 0)?)?;
        let y = self.experts.forward(&self.pre_feedforward_layernorm_2.forward(h)?, &inds)?;
        let y = weights.expand_dims(-1)?.multiply(&y)?.sum_axis(-2, false)?;
        let h1 = self.post_feedforward_layernorm_1.forward(dense)?;
        Ok(h1.add(&self.post_feedforward_layernorm_2.forward(&y)?)?)
    }
}

struct Block {
    self_attn: Attention,
    mlp: Mlp,
    /// 26B-A4B: the experts beside the dense MLP.
    moe: Option<MoeBranch>,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
    pre_feedforward_layernorm: RmsNorm,
    post_feedforward_layernorm: RmsNorm,
    per_layer: Option<PerLayerGate>,
    layer_scalar: Array,
    sliding: bool,
}

/// Model-level per-layer input tables (2B/4B-class models).
struct PerLayerInputs {
    embed: Embedding,
    model_projection: Linear,
    projection_norm: RmsNorm,
    dim: i32,
    embed_scale: f32,
    projection_scale: f32,
}

pub struct Gemma4Text {
    embed_tokens: Embedding,
    per_layer_inputs: Option<PerLayerInputs>,
    layers: Vec<Block>,
    norm: RmsNorm,
    lm_head: Option<Linear>,
    info: ModelInfo,
    window: i32,
    embed_scale: f32,
    final_softcap: Option<f32>,
    /// Layers that own a cache, in order (the first `num_hidden_layers - num_kv_shared_layers`).
    cache_layers: usize,
    /// The audio tower of a `gemma4` checkpoint that ships one (`audio_config` + tensors).
    audio: Option<super::gemma4_audio::Gemma4Audio>,
    /// The vision tower of a `gemma4` checkpoint that has one (mlx-vlm layout).
    vision: Option<Gemma4Vision>,
    /// The image token id when attention is bidirectional within image spans
    /// (`use_bidirectional_attention: "vision"`).
    bidirectional_images: Option<u32>,
}

/// `key` as an integer >= 0, or mlx-lm's default when absent; null reads as 0 (mlx-lm tests
/// these options for truth).
fn count_or(cfg: &ConfigReader, key: &str, default: i64) -> Result<i64> {
    match cfg.raw().get(key) {
        None => Ok(default),
        Some(Value::Null) => Ok(0),
        Some(v) => v
            .as_i64()
            .filter(|x| *x >= 0)
            .ok_or_else(|| Error::ModelLoad(format!("config.json: {key:?} must be a non-negative integer, got {v}"))),
    }
}

fn positive_or(cfg: &ConfigReader, key: &str, default: i32) -> Result<i32> {
    Ok(cfg.opt_i32(key)?.unwrap_or(default))
}

/// The text part of a `gemma4` config: `text_config` with mlx-lm's defaults for vocab size
/// (from the top level) and head counts.
fn text_config(cfg: &ConfigReader) -> Result<Value> {
    let mut text = match cfg.get("text_config") {
        None => json!({}),
        Some(t) if t.is_object() => t.clone(),
        Some(t) => return Err(Error::ModelLoad(format!("config.json: gemma4 \"text_config\" must be an object, got {t}"))),
    };
    let obj = text.as_object_mut().unwrap();
    obj.insert("vocab_size".into(), cfg.get("vocab_size").cloned().unwrap_or(Value::from(262_144)));
    obj.entry("num_attention_heads").or_insert(Value::from(8));
    obj.entry("num_key_value_heads").or_insert(Value::from(1));
    Ok(text)
}

/// mlx-lm gemma4.sanitize: drop the vision/audio towers, and move Hugging Face's
/// `model.language_model.*` and mlx-lm's `language_model.model.*` to `model.*`.
fn text_weights(w: &mut Weights) {
    for tower in ["vision_tower", "multi_modal_projector", "audio_tower", "embed_audio", "embed_vision", "vision_embedder"] {
        w.remove_prefix(&format!("model.{tower}"));
        w.remove_prefix(tower);
    }
    w.rename_prefix("model.language_model.", "model.");
    w.rename_prefix("language_model.model.", "model.");
    w.strip_prefix("language_model.");
}

fn default_rope_parameters() -> Value {
    json!({
        "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0, "rope_type": "proportional"},
        "sliding_attention": {"partial_rotary_factor": 1.0, "rope_theta": 10000.0, "rope_type": "default"},
    })
}

pub fn load(cfg: &ConfigReader, mut w: Weights, dtype: Dtype) -> Result<Gemma4Text> {
    let top = cfg;
    let wrapped = cfg.req_str("model_type")? == "gemma4";
    let text = if wrapped { text_config(cfg)? } else { Value::Null };
    let tcfg = if wrapped { ConfigReader::new(&text) } else { ConfigReader::new(cfg.raw()) };
    let audio = if wrapped { super::gemma4_audio::Gemma4Audio::from_checkpoint(cfg.raw(), &mut w)? } else { None };
    let mut vision_weights = None;
    if wrapped {
        for part in ["vision_tower.", "embed_vision."] {
            w.rename_prefix(&format!("model.{part}"), part);
        }
        if gemma4_vision::present(cfg, &w) {
            vision_weights = Some(w.split_prefixes(&["vision_tower.", "embed_vision."]));
        }
        text_weights(&mut w);
    }
    let cfg = &tcfg;
    let moe = if cfg.bool_or("enable_moe_block", false)? {
        let need = |key: &str| -> Result<i32> {
            cfg.opt_i32(key)?.filter(|&v| v > 0).ok_or_else(|| {
                Error::ModelLoad(format!("config.json: enable_moe_block needs a positive \"{key}\""))
            })
        };
        let (experts, top_k) = (need("num_experts")?, need("top_k_experts")?);
        if top_k > experts {
            return Err(Error::ModelLoad(format!(
                "config.json: enable_moe_block routes to top_k_experts {top_k} of num_experts {experts}"
            )));
        }
        Some((experts, top_k, need("moe_intermediate_size")?))
    } else {
        None
    };
    let hidden = positive_or(cfg, "hidden_size", 1536)?;
    let num_layers = positive_or(cfg, "num_hidden_layers", 35)? as usize;
    let intermediate = positive_or(cfg, "intermediate_size", 6144)?;
    let heads = positive_or(cfg, "num_attention_heads", 8)?;
    let head_dim = positive_or(cfg, "head_dim", 256)?;
    // mlx-lm: full layers use global_head_dim when it is set and non-zero.
    let global_head_dim = match count_or(cfg, "global_head_dim", 512)? {
        0 => head_dim,
        d => d as i32,
    };
    let eps = cfg.f32_or("rms_norm_eps", 1e-6)?;
    let vocab = positive_or(cfg, "vocab_size", 262_144)?;
    let kv_heads = positive_or(cfg, "num_key_value_heads", 1)?;
    let k_eq_v = cfg.bool_or("attention_k_eq_v", false)?;
    let global_kv_heads = cfg.opt_i32("num_global_key_value_heads")?;
    let shared = count_or(cfg, "num_kv_shared_layers", 20)? as usize;
    if shared >= num_layers {
        return Err(Error::ModelLoad(format!(
            "config.json: num_kv_shared_layers {shared} leaves no layer with its own keys and values ({num_layers} layers)"
        )));
    }
    let first_shared = num_layers - shared;
    let per_layer_dim = count_or(cfg, "hidden_size_per_layer_input", 256)? as i32;
    let per_layer_vocab = positive_or(cfg, "vocab_size_per_layer_input", 262_144)?;
    let window = positive_or(cfg, "sliding_window", 512)?;
    let pattern = positive_or(cfg, "sliding_window_pattern", 5)? as usize;
    let double_wide = cfg.bool_or("use_double_wide_mlp", true)?;
    let traditional = cfg.bool_or("rope_traditional", false)?;
    // `ConfigReader::get` reads null as absent; here null (no cap) differs from absent (30).
    let final_softcap = match cfg.raw().get("final_logit_softcapping") {
        None => Some(30.0),
        Some(Value::Null) => None,
        Some(v) => Some(v.as_f64().filter(|x| *x > 0.0).ok_or_else(|| {
            Error::ModelLoad(format!("config.json: \"final_logit_softcapping\" must be a positive number, got {v}"))
        })? as f32),
    };
    if let Some(act) = cfg.get("hidden_activation").or_else(|| cfg.get("hidden_act")) {
        if act.as_str() != Some("gelu_pytorch_tanh") {
            return Err(Error::Unsupported(format!(
                "gemma4_text: hidden_activation {act} is not supported (only \"gelu_pytorch_tanh\")"
            )));
        }
    }

    let sliding: Vec<bool> = match cfg.get("layer_types") {
        None => (0..num_layers).map(|i| (i + 1) % pattern != 0).collect(),
        Some(Value::Array(types)) if types.len() == num_layers => types
            .iter()
            .map(|t| match t.as_str() {
                Some("sliding_attention") => Ok(true),
                Some("full_attention") => Ok(false),
                _ => Err(Error::Unsupported(format!(
                    "gemma4_text: layer type {t} (supported: \"sliding_attention\", \"full_attention\")"
                ))),
            })
            .collect::<Result<_>>()?,
        Some(t) => {
            return Err(Error::ModelLoad(format!("config.json: \"layer_types\" must list {num_layers} layer types, got {t}")))
        }
    };

    let rope_parameters = match cfg.get("rope_parameters") {
        None => default_rope_parameters(),
        Some(p) => p.clone(),
    };
    let max_positions = cfg.opt_i32("max_position_embeddings")?.or(Some(131_072));
    let rope_for = |is_sliding: bool, dims: i32| -> Result<Rope> {
        let key = if is_sliding { "sliding_attention" } else { "full_attention" };
        let empty = json!({});
        let params = rope_parameters.get(key).unwrap_or(&empty);
        let theta = match params.get("rope_theta") {
            None => 10_000.0,
            Some(t) => t.as_f64().ok_or_else(|| {
                Error::ModelLoad(format!("config.json: rope_parameters.{key}.rope_theta must be a number, got {t}"))
            })?,
        };
        Rope::from_scaling(dims, theta, traditional, Some(params), RopeContext { max_position_embeddings: max_positions })
    };

    // mlx-lm: a KV-shared layer reads the last non-shared layer of its kind.
    let source_of = |i: usize| -> Result<usize> {
        (0..first_shared).rev().find(|&j| sliding[j] == sliding[i]).ok_or_else(|| {
            Error::ModelLoad(format!(
                "config.json: KV-shared layer {i} has no earlier {} layer to share with",
                if sliding[i] { "sliding" } else { "full" }
            ))
        })
    };

    w.ignore_suffix("self_attn.rotary_emb.inv_freq");
    for suffix in ["input_max", "input_min", "output_max", "output_min"] {
        w.ignore_suffix(suffix);
    }
    let tied = cfg.bool_or("tie_word_embeddings", true)?;
    let embed_tokens = Embedding::load(&mut w, "model.embed_tokens", vocab, hidden)?;
    let per_layer_inputs = if per_layer_dim > 0 {
        let total = num_layers as i32 * per_layer_dim;
        Some(PerLayerInputs {
            embed: Embedding::load(&mut w, "model.embed_tokens_per_layer", per_layer_vocab, total)?,
            model_projection: Linear::load(&mut w, "model.per_layer_model_projection", hidden, total, false)?,
            projection_norm: RmsNorm::load(&mut w, "model.per_layer_projection_norm", per_layer_dim, eps)?,
            dim: per_layer_dim,
            embed_scale: (per_layer_dim as f64).sqrt() as f32,
            projection_scale: (hidden as f64).powf(-0.5) as f32,
        })
    } else {
        None
    };

    let mut layers = Vec::with_capacity(num_layers);
    for (i, &is_sliding) in sliding.iter().enumerate() {
        let p = format!("model.layers.{i}");
        let a = format!("{p}.self_attn");
        let hd = if is_sliding { head_dim } else { global_head_dim };
        let layer_k_eq_v = k_eq_v && !is_sliding;
        let n_kv = if layer_k_eq_v { global_kv_heads.unwrap_or(kv_heads) } else { kv_heads };
        let kv = if i < first_shared {
            KvSource::Own {
                k_proj: Linear::load(&mut w, &format!("{a}.k_proj"), hidden, n_kv * hd, false)?,
                v_proj: if layer_k_eq_v {
                    None
                } else {
                    Some(Linear::load(&mut w, &format!("{a}.v_proj"), hidden, n_kv * hd, false)?)
                },
                k_norm: RmsNorm::load(&mut w, &format!("{a}.k_norm"), hd, eps)?,
                cache: i,
                shared: (first_shared..num_layers).any(|j| source_of(j).ok() == Some(i)),
            }
        } else {
            // mlx-lm sanitize drops the projections a shared layer never uses.
            for name in ["k_proj", "v_proj", "k_norm"] {
                w.remove_prefix(&format!("{a}.{name}."));
            }
            KvSource::Shared { layer: source_of(i)? }
        };
        let self_attn = Attention {
            q_proj: Linear::load(&mut w, &format!("{a}.q_proj"), hidden, heads * hd, false)?,
            o_proj: Linear::load(&mut w, &format!("{a}.o_proj"), heads * hd, hidden, false)?,
            q_norm: RmsNorm::load(&mut w, &format!("{a}.q_norm"), hd, eps)?,
            kv,
            heads,
            kv_heads: n_kv,
            rope: { let mut r = rope_for(is_sliding, hd)?; r.set_fast(w.options().fast_on_cpu()); r },
            eps,
            fast: w.options().fast_on_cpu(),
        };
        let wide = double_wide && first_shared > 0 && i >= first_shared;
        let inter = if wide { 2 * intermediate } else { intermediate };
        let norm = |w: &mut Weights, name: &str, dim: i32| RmsNorm::load(w, &format!("{p}.{name}"), dim, eps);
        let per_layer = if per_layer_dim > 0 {
            Some(PerLayerGate {
                input_gate: Linear::load(&mut w, &format!("{p}.per_layer_input_gate"), hidden, per_layer_dim, false)?,
                projection: Linear::load(&mut w, &format!("{p}.per_layer_projection"), per_layer_dim, hidden, false)?,
                post_norm: norm(&mut w, "post_per_layer_input_norm", hidden)?,
            })
        } else {
            None
        };
        layers.push(Block {
            self_attn,
            mlp: Mlp::load_with(&mut w, &format!("{p}.mlp"), hidden, inter, false, MlpActivation::GeluApprox)?,
            moe: moe.map(|m| MoeBranch::load(&mut w, &p, hidden, m, eps)).transpose()?,
            input_layernorm: norm(&mut w, "input_layernorm", hidden)?,
            post_attention_layernorm: norm(&mut w, "post_attention_layernorm", hidden)?,
            pre_feedforward_layernorm: norm(&mut w, "pre_feedforward_layernorm", hidden)?,
            post_feedforward_layernorm: norm(&mut w, "post_feedforward_layernorm", hidden)?,
            per_layer,
            layer_scalar: w.take(&format!("{p}.layer_scalar"), &[1])?,
            sliding: is_sliding,
        });
    }
    let norm = RmsNorm::load(&mut w, "model.norm", hidden, eps)?;
    let lm_head = if tied {
        // A stray copy of the tied head is dropped, as mlx-lm's load does.
        for name in ["lm_head.weight", "lm_head.scales", "lm_head.biases"] {
            w.remove(name);
        }
        None
    } else {
        Some(Linear::load(&mut w, "lm_head", hidden, vocab, false)?)
    };
    w.finish()?;

    let cache_layers = first_shared;
    let sliding_caches = sliding[..cache_layers].iter().filter(|s| **s).count();
    // KV sizing: the layers that own caches, each counted at the larger head shape (full
    // layers may have wider heads), so budgets err on the safe side.
    let widest_kv = layers[..cache_layers].iter().map(|l| l.self_attn.kv_heads).max().unwrap_or(kv_heads);
    let info = ModelInfo {
        model_type: "gemma4_text".into(),
        vocab_size: vocab,
        hidden_size: hidden,
        num_layers: cache_layers,
        kv_heads: widest_kv,
        head_dim: head_dim.max(global_head_dim),
        max_position_embeddings: cfg.opt_i32("max_position_embeddings")?.map(|n| n as usize),
        activation_dtype: dtype,
        sliding_window: (sliding_caches > 0)
            .then_some(SlidingWindowLayers { layers: sliding_caches, window: window as usize }),
    };
    let embed_scale = (hidden as f64).sqrt() as f32;
    let vision = match vision_weights {
        None => None,
        Some(mut vw) => {
            let v = gemma4_vision::load(top, &mut vw, hidden, dtype)?;
            vw.finish()?;
            Some(v)
        }
    };
    let bidirectional_images = vision.as_ref().filter(|v| v.spec().bidirectional).map(|v| v.spec().image_token_id);
    Ok(Gemma4Text {
        embed_tokens,
        per_layer_inputs,
        layers,
        norm,
        lm_head,
        info,
        window,
        embed_scale,
        final_softcap,
        cache_layers,
        vision,
        bidirectional_images,
        audio,
    })
}

/// `x * s` with the Python float `s` in `x`'s dtype.
fn times(x: &Array, s: f32) -> Result<Array> {
    Ok(x.multiply(Array::from_f32(s).as_dtype(x.dtype())?)?)
}

impl Attention {
    /// `x`: `[B, L, hidden]`. Returns the output and, when later layers share them, the keys
    /// and values it attended over.
    fn forward(
        &self,
        x: &Array,
        mask: &AttentionMask,
        caches: &mut [Box<dyn KvCache>],
        borrowed: &[Option<SharedKv>],
    ) -> Result<(Array, Option<SharedKv>)> {
        let (b, l) = (x.dim(0), x.dim(1));
        let q = self.q_proj.forward(x)?.reshape(&[b, l, self.heads, -1])?;
        let q = self.q_norm.forward(&q)?.transpose_axes(&[0, 2, 1, 3])?;
        let (out, kept) = match &self.kv {
            KvSource::Shared { layer } => {
                let kv = borrowed[*layer]
                    .as_ref()
                    .ok_or_else(|| Error::Mlx(format!("gemma4_text: layer {layer}'s keys are not computed yet")))?;
                let q = self.rope.apply(&q, &kv.offset)?;
                (sdpa(&q, &kv.keys, &kv.values, 1.0, mask, self.fast)?, None)
            }
            KvSource::Own { k_proj, v_proj, k_norm, cache, shared } => {
                let cache = cache::attention(caches[*cache].as_mut())?;
                let raw_k = k_proj.forward(x)?.reshape(&[b, l, self.kv_heads, -1])?;
                let raw_v = match v_proj {
                    Some(v_proj) => v_proj.forward(x)?.reshape(&[b, l, self.kv_heads, -1])?,
                    None => raw_k.clone(),
                };
                let offset = cache.rope_offset();
                let k = k_norm.forward(&raw_k)?.transpose_axes(&[0, 2, 1, 3])?;
                let k = self.rope.apply(&k, &offset)?;
                let v = mlx_rs::fast::rms_norm(&raw_v, None, self.eps)?.transpose_axes(&[0, 2, 1, 3])?;
                let q = self.rope.apply(&q, &offset)?;
                if *shared {
                    if cache.kv_quantization().is_some() {
                        return Err(Error::Unsupported(QUANTIZED_KV.into()));
                    }
                    let (keys, values) = cache.update_and_fetch(&k, &v)?;
                    let out = sdpa(&q, &keys, &values, 1.0, mask, self.fast)?;
                    (out, Some(SharedKv { keys, values, offset }))
                } else {
                    // The cache attends (quantized caches on their packed form, as mlx-lm).
                    (cache.update_and_attend(&q, &k, &v, 1.0, mask, self.fast)?, None)
                }
            }
        };
        let out = out.transpose_axes(&[0, 2, 1, 3])?.reshape(&[b, l, -1])?;
        Ok((self.o_proj.forward(&out)?, kept))
    }
}

impl Gemma4Text {
    /// mlx-lm `_get_per_layer_inputs` + `_project_per_layer_inputs`: `[B, L, layers, dim]`.
    fn per_layer_inputs(&self, tokens: &Array, h: &Array) -> Result<Option<Array>> {
        let Some(p) = &self.per_layer_inputs else { return Ok(None) };
        let (b, l, n) = (tokens.dim(0), tokens.dim(1), self.layers.len() as i32);
        let from_tokens = times(&p.embed.forward(tokens)?, p.embed_scale)?.reshape(&[b, l, n, p.dim])?;
        let projected = times(&p.model_projection.forward(h)?, p.projection_scale)?.reshape(&[b, l, n, p.dim])?;
        let projected = p.projection_norm.forward(&projected)?;
        Ok(Some(times(&projected.add(&from_tokens)?, std::f64::consts::FRAC_1_SQRT_2 as f32)?))
    }
}

impl Gemma4Text {
    fn forward_media(
        &self,
        tokens: &Array,
        media: Option<&crate::language_model::PromptMedia>,
        caches: &mut [Box<dyn KvCache>],
    ) -> Result<Array> {
        if caches.len() != self.cache_layers {
            return Err(Error::InvalidRequest(format!(
                "{} caches for {} cache-owning layers",
                caches.len(),
                self.cache_layers
            )));
        }
        let h = times(&self.embed_tokens.forward(tokens)?, self.embed_scale)?;
        let (h, layer_ids) = match media {
            Some(m) => splice_media(&h, tokens, m)?,
            None => (h, tokens.clone()),
        };
        let per_layer = self.per_layer_inputs(&layer_ids, &h)?;
        let n = h.dim(1);
        // One mask per layer kind, from the first cache of that kind (as mlx-lm's _make_masks).
        let mask_of = |sliding: bool| -> Result<Option<AttentionMask>> {
            match self.layers[..self.cache_layers].iter().position(|l| l.sliding == sliding) {
                Some(i) => Ok(Some(cache::make_mask(caches[i].as_ref(), n, sliding.then_some(self.window))?)),
                None => Ok(None),
            }
        };
        let (mut full_mask, mut sliding_mask) = (mask_of(false)?, mask_of(true)?);
        if let (Some(m), Some(image)) = (media, self.bidirectional_images) {
            // mlx-vlm 0.7.10 leaves a prompt with both images and audio causal: its processor
            // marks audio tokens (mm_token_type_ids 3), which sends generate_step to chunked
            // prefill, whose chunk masks never match the full-length types the overlay needs
            // (its `_make_masks` says why: keep mixed image+audio prompts causal).
            let rows: Vec<bool> =
                m.rows.iter().enumerate().map(|(r, &has)| has && !m.audio_rows.get(r).copied().unwrap_or(false)).collect();
            if let Some(blocks) = image_blocks(tokens, &rows, image)? {
                let offset_of = |sliding: bool| {
                    self.layers[..self.cache_layers].iter().position(|l| l.sliding == sliding).map_or(0, |i| caches[i].len())
                };
                full_mask = full_mask.map(|mk| with_blocks(mk, &blocks, offset_of(false) as i32)).transpose()?;
                sliding_mask = sliding_mask.map(|mk| with_blocks(mk, &blocks, offset_of(true) as i32)).transpose()?;
            }
        }
        let mut kvs: Vec<Option<SharedKv>> = vec![None; self.layers.len()];
        let mut h = h;
        for (i, layer) in self.layers.iter().enumerate() {
            let mask = if layer.sliding { sliding_mask.as_ref() } else { full_mask.as_ref() };
            let mask = mask.ok_or_else(|| Error::Mlx("gemma4_text: no attention mask for a layer kind".into()))?;
            let (r, kv) = layer.self_attn.forward(&layer.input_layernorm.forward(&h)?, mask, caches, &kvs)?;
            kvs[i] = kv;
            h = h.add(&layer.post_attention_layernorm.forward(&r)?)?;
            let mut r = layer.mlp.forward(&layer.pre_feedforward_layernorm.forward(&h)?)?;
            if let Some(moe) = &layer.moe {
                r = moe.forward(&h, &r)?;
            }
            h = h.add(&layer.post_feedforward_layernorm.forward(&r)?)?;
            if let (Some(gate), Some(inputs)) = (&layer.per_layer, &per_layer) {
                let input = inputs.index((.., .., i as i32, ..));
                let g = gelu_approx(&gate.input_gate.forward(&h)?)?.multiply(&input)?;
                h = h.add(&gate.post_norm.forward(&gate.projection.forward(&g)?)?)?;
            }
            h = h.multiply(&layer.layer_scalar)?;
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

/// mlx-vlm gemma4 `_block_sequence_ids_for_mask` + `_apply_blockwise_bidirectional_overlay`:
/// `[B, 1, L, L]`, true where query and key are image tokens of the same contiguous run (rows
/// with media only). `None` when the forward has one column or no image token (the reference
/// keeps its plain masks then).
fn image_blocks(tokens: &Array, rows: &[bool], image: u32) -> Result<Option<Array>> {
    let (b, l) = (tokens.dim(0) as usize, tokens.dim(1) as usize);
    if l < 2 {
        return Ok(None);
    }
    let ids = tokens.as_dtype(Dtype::Int64)?;
    ids.eval()?;
    let ids = ids.as_slice::<i64>();
    let mut block = vec![-1i64; b * l];
    let mut any = false;
    for r in 0..b {
        if !rows.get(r).copied().unwrap_or(false) {
            continue;
        }
        let mut group = -1i64;
        for j in 0..l {
            if ids[r * l + j] == image as i64 {
                if j == 0 || ids[r * l + j - 1] != image as i64 {
                    group += 1;
                }
                block[r * l + j] = group;
                any = true;
            }
        }
    }
    if !any {
        return Ok(None);
    }
    let mut same = vec![false; b * l * l];
    for r in 0..b {
        for i in 0..l {
            let q = block[r * l + i];
            if q < 0 {
                continue;
            }
            for j in 0..l {
                same[(r * l + i) * l + j] = block[r * l + j] == q;
            }
        }
    }
    Ok(Some(Array::from_slice(&same, &[b as i32, 1, l as i32, l as i32])))
}

/// `mask` OR the image blocks over its last `L` key columns (this forward's own positions);
/// a kernel-side causal mask becomes explicit first, as mlx-vlm materializes it.
fn with_blocks(mask: AttentionMask, blocks: &Array, offset: i32) -> Result<AttentionMask> {
    let l = blocks.dim(-1);
    let base = match mask {
        AttentionMask::Array(m) => m,
        AttentionMask::Causal => crate::cache::causal_mask(l, offset, None)?,
        AttentionMask::None => return Ok(AttentionMask::None),
    };
    let s = base.dim(-1);
    let widths = [(0, 0), (0, 0), (0, 0), (s - l, 0)];
    let blocks = mlx_rs::ops::pad(blocks, &widths, Array::from_bool(false), None)?;
    Ok(AttentionMask::Array(base.logical_or(&blocks)?))
}

/// mlx-vlm gemma4 `get_input_embeddings`: soft tokens (audio) replace the scaled token
/// embeddings at their columns, and those positions take id 0 for the per-layer inputs.
/// Returns the embeddings and the ids the per-layer table reads.
fn splice_media(h: &Array, tokens: &Array, media: &crate::language_model::PromptMedia) -> Result<(Array, Array)> {
    let (b, l, d) = (h.dim(0) as usize, h.dim(1) as usize, h.dim(2));
    let (mut soft_at, mut index, mut parts, mut offset) = (vec![false; b * l], vec![0i32; b * l], Vec::new(), 0i32);
    for s in &media.soft {
        let n = s.embeddings.dim(0) as usize;
        if s.row >= b || s.col + n > l || s.embeddings.ndim() != 2 || s.embeddings.dim(1) != d {
            return Err(Error::InvalidRequest(format!(
                "soft tokens {:?} at row {} column {} do not fit {b} x {l} x {d}",
                s.embeddings.shape(),
                s.row,
                s.col
            )));
        }
        for j in 0..n {
            soft_at[s.row * l + s.col + j] = true;
            index[s.row * l + s.col + j] = offset + j as i32;
        }
        parts.push(s.embeddings.as_dtype(h.dtype())?);
        offset += n as i32;
    }
    if parts.is_empty() {
        return Ok((h.clone(), tokens.clone()));
    }
    let rows = mlx_rs::ops::concatenate(&parts, 0)?;
    let gathered = rows.take_axis(Array::from_slice(&index, &[(b * l) as i32]), 0)?.reshape(&[b as i32, l as i32, d])?;
    let at = Array::from_slice(&soft_at, &[b as i32, l as i32]);
    let h = mlx_rs::ops::select(&at.reshape(&[b as i32, l as i32, 1])?, &gathered, h)?;
    let ids = mlx_rs::ops::select(&at, &Array::from_int(0).as_dtype(tokens.dtype())?, tokens)?;
    Ok((h, ids))
}

impl LanguageModel for Gemma4Text {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        self.forward_media(tokens, None, caches)
    }

    /// Image and audio soft tokens spliced over the token embeddings; with
    /// `use_bidirectional_attention: "vision"` each image span attends both ways unless the row
    /// also carries audio (then all of it is causal; audio spans always are), as mlx-vlm runs it.
    fn forward_with_media(
        &self,
        tokens: &Array,
        media: &crate::language_model::PromptMedia,
        caches: &mut [Box<dyn KvCache>],
    ) -> Result<Array> {
        self.forward_media(tokens, Some(media), caches)
    }

    fn audio(&self) -> Option<&dyn crate::audio::AudioTower> {
        self.audio.as_ref().map(|a| a as &dyn crate::audio::AudioTower)
    }

    fn vision(&self) -> Option<&dyn crate::vision::VisionTower> {
        self.vision.as_ref().map(|v| v as &dyn crate::vision::VisionTower)
    }

    fn make_caches(&self) -> Vec<Box<dyn KvCache>> {
        self.layers[..self.cache_layers]
            .iter()
            .map(|l| {
                if l.sliding {
                    Box::new(RotatingKvCache::new(self.window)) as Box<dyn KvCache>
                } else {
                    Box::new(KvCacheSingle::new()) as Box<dyn KvCache>
                }
            })
            .collect()
    }

    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn kv_quantization_unsupported(&self) -> Option<String> {
        // A quantized cache's keys cannot be handed to a KV-shared layer (mlx-lm fails there
        // too); without KV sharing, caches quantize as in any model.
        let sharing = self.layers.iter().any(|l| matches!(l.self_attn.kv, KvSource::Own { shared: true, .. }));
        sharing.then(|| QUANTIZED_KV.into())
    }
}
