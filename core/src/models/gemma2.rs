//! Gemma 2. Mirrors mlx-lm `models/gemma2.py`:
//! - Gemma RMSNorm (`1 + w`), four norms per block (post-attention and post-feed-forward
//!   norms apply to the branch before the residual add), GeGLU with tanh GELU;
//! - embeddings × `sqrt(hidden)` (a Python float, unlike Gemma 3's bfloat16-rounded one),
//!   tied output, `final_logit_softcapping` on the logits;
//! - attention scores soft-capped by `attn_logit_softcapping` (op by op: the fused kernel
//!   cannot cap), scale `query_pre_attn_scalar^-0.5`.
//! mlx-lm 0.32.2 runs every layer with full attention and one causal mask (it ignores
//! `sliding_window`); Weft follows the oracle, so positions past the window attend as far
//! back as mlx-lm's do (Gemma 2's window is 4096).

use mlx_rs::{Array, Dtype};

use super::{ConfigReader, LanguageModel, ModelInfo};
use crate::cache::{self, KvCache, KvCacheSingle};
use crate::nn::{Attention, AttentionOptions, Embedding, Mlp, MlpActivation, RmsNorm, Rope, Weights};
use crate::{Error, Result};

struct Block {
    self_attn: Attention,
    mlp: Mlp,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
    pre_feedforward_layernorm: RmsNorm,
    post_feedforward_layernorm: RmsNorm,
}

pub struct Gemma2 {
    embed_tokens: Embedding,
    layers: Vec<Block>,
    norm: RmsNorm,
    info: ModelInfo,
    embed_scale: f32,
    final_softcap: f32,
}

fn positive(cfg: &ConfigReader, key: &str, default: f64) -> Result<f64> {
    match cfg.get(key) {
        None => Ok(default),
        Some(v) => v.as_f64().filter(|x| *x > 0.0).ok_or_else(|| {
            Error::ModelLoad(format!("config.json: {key:?} must be a positive number, got {v}"))
        }),
    }
}

pub fn load(cfg: &ConfigReader, mut w: Weights, dtype: Dtype) -> Result<Gemma2> {
    if let Some(act) = cfg.get("hidden_activation").or_else(|| cfg.get("hidden_act")) {
        if act.as_str() != Some("gelu_pytorch_tanh") {
            return Err(Error::Unsupported(format!(
                "gemma2: hidden_activation {act} is not supported (only \"gelu_pytorch_tanh\")"
            )));
        }
    }
    if cfg.get("rope_scaling").is_some() {
        return Err(Error::Unsupported("gemma2: rope_scaling is not supported (mlx-lm ignores it)".into()));
    }
    let hidden = cfg.req_i32("hidden_size")?;
    let num_layers = cfg.req_i32("num_hidden_layers")? as usize;
    let intermediate = cfg.req_i32("intermediate_size")?;
    let heads = cfg.req_i32("num_attention_heads")?;
    let kv_heads = cfg.req_i32("num_key_value_heads")?;
    let head_dim = cfg.req_i32("head_dim")?;
    let eps = cfg.req_f32("rms_norm_eps")?;
    let vocab = cfg.req_i32("vocab_size")?;
    let theta = cfg.f32_or("rope_theta", 10000.0)?;
    let traditional = cfg.bool_or("rope_traditional", false)?;
    let attn_cap = positive(cfg, "attn_logit_softcapping", 50.0)? as f32;
    let final_softcap = positive(cfg, "final_logit_softcapping", 30.0)? as f32;
    let qpas = positive(cfg, "query_pre_attn_scalar", 144.0)?;
    let scale = (1.0 / qpas.powf(0.5)) as f32;

    w.ignore_suffix("self_attn.rotary_emb.inv_freq");
    let embed_tokens = Embedding::load(&mut w, "model.embed_tokens", vocab, hidden)?;
    let mut layers = Vec::with_capacity(num_layers);
    for i in 0..num_layers {
        let p = format!("model.layers.{i}");
        let opts = AttentionOptions {
            hidden,
            heads,
            kv_heads,
            head_dim,
            qkv_bias: false,
            o_bias: false,
            qk_norm_eps: None,
            rope: Rope::plain(head_dim, theta, 1.0, traditional),
        };
        let self_attn =
            Attention::load(&mut w, &format!("{p}.self_attn"), opts)?.with_scale(scale).with_logit_softcap(attn_cap);
        let norm = |w: &mut Weights, name: &str| RmsNorm::load_gemma(w, &format!("{p}.{name}"), hidden, eps);
        layers.push(Block {
            self_attn,
            mlp: Mlp::load_with(&mut w, &format!("{p}.mlp"), hidden, intermediate, false, MlpActivation::GeluApprox)?,
            input_layernorm: norm(&mut w, "input_layernorm")?,
            post_attention_layernorm: norm(&mut w, "post_attention_layernorm")?,
            pre_feedforward_layernorm: norm(&mut w, "pre_feedforward_layernorm")?,
            post_feedforward_layernorm: norm(&mut w, "post_feedforward_layernorm")?,
        });
    }
    let norm = RmsNorm::load_gemma(&mut w, "model.norm", hidden, eps)?;
    // mlx-lm's gemma2 always ties the head (a stray copy would be reported by finish).
    w.finish()?;
    let info = ModelInfo {
        model_type: "gemma2".into(),
        vocab_size: vocab,
        hidden_size: hidden,
        num_layers,
        kv_heads,
        head_dim,
        max_position_embeddings: cfg.opt_i32("max_position_embeddings")?.map(|n| n as usize),
        activation_dtype: dtype,
        sliding_window: None,
    };
    let embed_scale = (hidden as f64).powf(0.5) as f32;
    Ok(Gemma2 { embed_tokens, layers, norm, info, embed_scale, final_softcap })
}

impl LanguageModel for Gemma2 {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        if caches.len() != self.layers.len() {
            return Err(Error::InvalidRequest(format!("{} caches for {} layers", caches.len(), self.layers.len())));
        }
        let h = self.embed_tokens.forward(tokens)?;
        let mut h = h.multiply(Array::from_f32(self.embed_scale).as_dtype(h.dtype())?)?;
        let mask = cache::make_mask(caches[0].as_ref(), h.dim(1), None)?;
        for (layer, cache) in self.layers.iter().zip(caches.iter_mut()) {
            let r = layer.self_attn.forward(&layer.input_layernorm.forward(&h)?, &mask, cache::attention(cache.as_mut())?)?;
            h = h.add(&layer.post_attention_layernorm.forward(&r)?)?;
            let r = layer.mlp.forward(&layer.pre_feedforward_layernorm.forward(&h)?)?;
            h = h.add(&layer.post_feedforward_layernorm.forward(&r)?)?;
        }
        let logits = self.embed_tokens.as_linear(&self.norm.forward(&h)?)?;
        let c = Array::from_f32(self.final_softcap).as_dtype(logits.dtype())?;
        Ok(mlx_rs::ops::tanh(&logits.divide(&c)?)?.multiply(&c)?)
    }

    fn make_caches(&self) -> Vec<Box<dyn KvCache>> {
        (0..self.layers.len()).map(|_| Box::new(KvCacheSingle::new()) as Box<dyn KvCache>).collect()
    }

    fn fast_cpu_kernels(&self) -> bool {
        self.norm.is_fast()
    }

    fn info(&self) -> &ModelInfo {
        &self.info
    }
}
