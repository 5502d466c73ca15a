//! The hybrid decoder stack of Qwen3-Next / Qwen3.5: pre-norm blocks whose token mixer is a
//! gated DeltaNet (linear attention with recurrent state) except every
//! `full_attention_interval`-th layer, which is output-gated full attention; the feed-forward
//! is a dense SwiGLU MLP or a shared-expert MoE, per layer. Architectures pick the layout in
//! their own files. Loaded as a pipeline stage ([`super::Parallel::Pipeline`]) a rank holds its stage's layers
//! only (mlx-lm's `PipelineMixin` on `Qwen3NextModel` / `Qwen3_5TextModel`).

use mlx_rs::Array;

use super::{
    Embedding, GatedAttention, GatedAttentionOptions, GatedDeltaNet, GatedDeltaOptions, Linear, Mlp, RmsNorm,
    SharedExpertMoe, SharedExpertMoeOptions, Weights,
};
use crate::cache::{self, AttentionMask, KvCache, KvCacheSingle, RecurrentCache};
use crate::language_model::{LanguageModel, ModelInfo};
use crate::{Error, Result};

enum Mixer {
    Linear(GatedDeltaNet),
    Attention(GatedAttention),
}

enum FeedForward {
    Dense(Mlp),
    Moe(Box<SharedExpertMoe>),
}

/// The feed-forward of one layer.
#[derive(Debug, Clone)]
pub enum FeedForwardSpec {
    Dense { intermediate: i32 },
    Moe(SharedExpertMoeOptions),
}

struct HybridBlock {
    mixer: Mixer,
    ffn: FeedForward,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
}

pub struct HybridDecoderSpec {
    pub info: ModelInfo,
    /// Where the stack's tensors live (`model` or, for Qwen3.5, `language_model.model`).
    pub prefix: String,
    /// The output projection's name; `None` when tied to the embedding.
    pub lm_head: Option<String>,
    /// A tied checkpoint may still carry a copy of the head under this name (dropped).
    pub tied_head_name: String,
    pub rms_norm_eps: f32,
    /// Layer `i` is full attention when `(i + 1) % full_attention_interval == 0`.
    pub full_attention_interval: usize,
    pub linear: GatedDeltaOptions,
    pub attention: GatedAttentionOptions,
    /// One entry per layer.
    pub feed_forward: Vec<FeedForwardSpec>,
}

pub struct HybridDecoder {
    embed_tokens: Embedding,
    layers: Vec<HybridBlock>,
    norm: RmsNorm,
    lm_head: Option<Linear>,
    /// The first full-attention layer (its cache provides the attention mask).
    first_attention: Option<usize>,
    /// The first linear-attention layer (its cache provides the padding mask of batched
    /// prefill chunks, mlx-lm's `create_ssm_mask`).
    first_linear: Option<usize>,
    info: ModelInfo,
    /// Under pipeline parallel: this rank's stage (`layers` holds only its layers).
    stage: Option<super::pipeline::Stage>,
}

impl HybridDecoder {
    pub fn load(mut w: Weights, spec: HybridDecoderSpec) -> Result<Self> {
        let mut info = spec.info;
        let (hidden, vocab, eps) = (info.hidden_size, info.vocab_size, spec.rms_norm_eps);
        // Loaded as a pipeline stage: only this rank's layers (mlx-lm's `pipeline()`).
        let stage = match w.options().take_pipeline_group() {
            Some(group) => Some(super::pipeline::Stage::new(group, &info.model_type, info.num_layers)?),
            None => None,
        };
        if spec.full_attention_interval == 0 {
            return Err(Error::ModelLoad("config.json: full_attention_interval must be positive".into()));
        }
        if spec.feed_forward.len() != info.num_layers {
            return Err(Error::ModelLoad(format!(
                "{} feed-forward specs for {} layers",
                spec.feed_forward.len(),
                info.num_layers
            )));
        }
        if spec.lm_head.is_none() {
            for suffix in ["weight", "scales", "biases"] {
                w.remove(&format!("{}.{suffix}", spec.tied_head_name));
            }
        }
        let pre = &spec.prefix;
        let embed_tokens = Embedding::load(&mut w, &format!("{pre}.embed_tokens"), vocab, hidden)?;
        let mut layers = Vec::with_capacity(info.num_layers);
        let mut first_attention = None;
        let mut first_linear = None;
        for (i, ffn) in spec.feed_forward.iter().enumerate() {
            let p = format!("{pre}.layers.{i}");
            if stage.as_ref().is_some_and(|s| !s.layers.contains(&i)) {
                w.remove_prefix(&format!("{p}."));
                continue;
            }
            // Layer numbers stay global (which layers attend); indices into `layers` are the stage's.
            let is_linear = (i + 1) % spec.full_attention_interval != 0;
            let mixer = if is_linear {
                first_linear.get_or_insert(layers.len());
                Mixer::Linear(GatedDeltaNet::load(&mut w, &format!("{p}.linear_attn"), spec.linear.clone())?)
            } else {
                first_attention.get_or_insert(layers.len());
                Mixer::Attention(GatedAttention::load(&mut w, &format!("{p}.self_attn"), spec.attention.clone())?)
            };
            let ffn = match ffn {
                FeedForwardSpec::Dense { intermediate } => {
                    FeedForward::Dense(Mlp::load(&mut w, &format!("{p}.mlp"), hidden, *intermediate, false)?)
                }
                FeedForwardSpec::Moe(opts) => {
                    FeedForward::Moe(Box::new(SharedExpertMoe::load(&mut w, &format!("{p}.mlp"), opts.clone())?))
                }
            };
            layers.push(HybridBlock {
                mixer,
                ffn,
                input_layernorm: RmsNorm::load(&mut w, &format!("{p}.input_layernorm"), hidden, eps)?,
                post_attention_layernorm: RmsNorm::load(&mut w, &format!("{p}.post_attention_layernorm"), hidden, eps)?,
            });
        }
        let norm = RmsNorm::load(&mut w, &format!("{pre}.norm"), hidden, eps)?;
        let lm_head = match &spec.lm_head {
            Some(name) => Some(Linear::load(&mut w, name, hidden, vocab, false)?),
            None => None,
        };
        w.finish()?;
        // Caches (and their memory) are per rank: this stage's layers.
        info.num_layers = layers.len();
        Ok(HybridDecoder { embed_tokens, layers, norm, lm_head, first_attention, first_linear, info, stage })
    }
}

impl LanguageModel for HybridDecoder {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        if caches.len() != self.layers.len() {
            return Err(Error::InvalidRequest(format!(
                "{} caches for {} layers",
                caches.len(),
                self.layers.len()
            )));
        }
        let mut h = self.embed_tokens.forward(tokens)?;
        let mask = match self.first_attention {
            Some(i) => cache::make_mask(caches[i].as_ref(), h.dim(1), None)?,
            None => AttentionMask::None,
        };
        // Right-padded batched prefill chunks: linear-attention layers mask the padding out.
        let ssm_mask = match self.first_linear {
            Some(i) => cache::recurrent(caches[i].as_mut())?.make_mask(h.dim(1))?,
            None => None,
        };
        if let Some(stage) = &self.stage {
            h = stage.receive(h)?;
        }
        for (layer, cache) in self.layers.iter().zip(caches.iter_mut()) {
            let x = layer.input_layernorm.forward(&h)?;
            let r = match &layer.mixer {
                Mixer::Linear(gdn) => gdn.forward(&x, ssm_mask.as_ref(), cache::recurrent(cache.as_mut())?)?,
                Mixer::Attention(attn) => attn.forward(&x, &mask, cache::attention(cache.as_mut())?)?,
            };
            let h1 = h.add(&r)?;
            let x = layer.post_attention_layernorm.forward(&h1)?;
            let r = match &layer.ffn {
                FeedForward::Dense(mlp) => mlp.forward(&x)?,
                FeedForward::Moe(moe) => moe.forward(&x)?,
            };
            h = h1.add(&r)?;
        }
        if let Some(stage) = &self.stage {
            h = stage.hand_on(h)?;
        }
        let h = self.norm.forward(&h)?;
        match &self.lm_head {
            Some(head) => head.forward(&h),
            None => self.embed_tokens.as_linear(&h),
        }
    }

    fn make_caches(&self) -> Vec<Box<dyn KvCache>> {
        self.layers
            .iter()
            .map(|l| match l.mixer {
                Mixer::Linear(_) => Box::new(RecurrentCache::new()) as Box<dyn KvCache>,
                Mixer::Attention(_) => Box::new(KvCacheSingle::new()) as Box<dyn KvCache>,
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
