//! The plain pre-norm decoder stack shared by the Llama family (llama, mistral, qwen2, qwen3):
//! embed → N × (x + attn(norm(x)); h + mlp(norm(h))) → norm → lm_head (or tied embedding).
//! Architectures differ only in their attention options, which their own files decide.

use mlx_rs::Array;

use super::{Attention, AttentionOptions, Embedding, Linear, Mlp, RmsNorm, Weights};
use crate::cache::{KvCache, KvCacheSingle};
use crate::language_model::{LanguageModel, ModelInfo};
use crate::{Error, Result};

pub struct DecoderBlock {
    self_attn: Attention,
    mlp: Mlp,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
}

pub struct DenseDecoderSpec {
    pub info: ModelInfo,
    pub intermediate: i32,
    pub rms_norm_eps: f32,
    pub mlp_bias: bool,
    pub tie_word_embeddings: bool,
    pub attention: AttentionOptions,
}

pub struct DenseDecoder {
    embed_tokens: Embedding,
    layers: Vec<DecoderBlock>,
    norm: RmsNorm,
    lm_head: Option<Linear>,
    info: ModelInfo,
}

impl DenseDecoder {
    pub fn load(mut w: Weights, spec: DenseDecoderSpec) -> Result<Self> {
        let info = spec.info;
        let (hidden, vocab, eps) = (info.hidden_size, info.vocab_size, spec.rms_norm_eps);
        w.ignore_suffix("self_attn.rotary_emb.inv_freq");
        if spec.tie_word_embeddings {
            // Some checkpoints carry a copy of the tied head; mlx-lm drops it too.
            w.remove("lm_head.weight");
            w.remove("lm_head.scales");
            w.remove("lm_head.biases");
        }
        let embed_tokens = Embedding::load(&mut w, "model.embed_tokens", vocab, hidden)?;
        let mut layers = Vec::with_capacity(info.num_layers);
        for i in 0..info.num_layers {
            let p = format!("model.layers.{i}");
            layers.push(DecoderBlock {
                self_attn: Attention::load(&mut w, &format!("{p}.self_attn"), spec.attention.clone())?,
                mlp: Mlp::load(&mut w, &format!("{p}.mlp"), hidden, spec.intermediate, spec.mlp_bias)?,
                input_layernorm: RmsNorm::load(&mut w, &format!("{p}.input_layernorm"), hidden, eps)?,
                post_attention_layernorm: RmsNorm::load(
                    &mut w,
                    &format!("{p}.post_attention_layernorm"),
                    hidden,
                    eps,
                )?,
            });
        }
        let norm = RmsNorm::load(&mut w, "model.norm", hidden, eps)?;
        let lm_head = if spec.tie_word_embeddings {
            None
        } else {
            Some(Linear::load(&mut w, "lm_head", hidden, vocab, false)?)
        };
        w.finish()?;
        Ok(DenseDecoder { embed_tokens, layers, norm, lm_head, info })
    }
}

impl LanguageModel for DenseDecoder {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        if caches.len() != self.layers.len() {
            return Err(Error::InvalidRequest(format!(
                "{} caches for {} layers",
                caches.len(),
                self.layers.len()
            )));
        }
        let mut h = self.embed_tokens.forward(tokens)?;
        let mask = caches[0].make_mask(h.dim(1), None)?;
        for (layer, cache) in self.layers.iter().zip(caches.iter_mut()) {
            let r = layer.self_attn.forward(&layer.input_layernorm.forward(&h)?, &mask, cache.as_mut())?;
            let h1 = h.add(&r)?;
            let r = layer.mlp.forward(&layer.post_attention_layernorm.forward(&h1)?)?;
            h = h1.add(&r)?;
        }
        let h = self.norm.forward(&h)?;
        match &self.lm_head {
            Some(head) => head.forward(&h),
            None => self.embed_tokens.as_linear(&h),
        }
    }

    fn make_caches(&self) -> Vec<Box<dyn KvCache>> {
        (0..self.layers.len()).map(|_| Box::new(KvCacheSingle::new()) as Box<dyn KvCache>).collect()
    }

    fn info(&self) -> &ModelInfo {
        &self.info
    }
}
