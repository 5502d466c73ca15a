//! The plain pre-norm decoder stack shared by the Llama family (llama, mistral, qwen2, qwen3):
//! embed → N × (x + attn(norm(x)); h + mlp(norm(h))) → norm → lm_head (or tied embedding).
//! Architectures differ only in their attention options and [`DecoderScaling`] (Granite's
//! multipliers, MiniCPM's depth scaling), which their own files decide.

use mlx_rs::Array;

use super::{Attention, AttentionOptions, Embedding, Linear, Mlp, RmsNorm, Rope, Weights};
use crate::cache::{self, KvCache, KvCacheSingle};
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
    /// Layers whose attention applies no rotary embedding (SmolLM3's NoPE layers).
    pub nope_layers: Vec<usize>,
    /// Phi-3's fused `qkv_proj` and `gate_up_proj` instead of separate projections.
    pub fused_projections: bool,
    pub scaling: DecoderScaling,
}

/// Scalar multipliers some Llama-family models put on the stream. `None` = the plain stack.
/// Each is applied as mlx-lm does: a Python float, rounded to the activation dtype.
#[derive(Debug, Clone, Copy, Default)]
pub struct DecoderScaling {
    /// `embed(x) * m` (Granite `embedding_multiplier`, MiniCPM `scale_emb`).
    pub embedding: Option<f32>,
    /// `x + branch * m` for both residual branches (Granite `residual_multiplier`, MiniCPM
    /// `scale_depth / sqrt(layers)`).
    pub residual: Option<f32>,
    /// Softmax scale instead of `head_dim^-0.5` (Granite `attention_multiplier`).
    pub attention: Option<f32>,
    /// `lm_head(h / d)` when the head is untied (MiniCPM `hidden_size / dim_model_base`).
    pub head_input_divisor: Option<f32>,
    /// `logits / d` (Granite `logits_scaling`).
    pub logits_divisor: Option<f32>,
    /// Queries × `1 + beta * ln(1 + floor(pos / original_max))` (Ministral 3's
    /// `llama_4_scaling_beta`, `original_max_position_embeddings`).
    pub query_position_scaling: Option<(f32, i32)>,
    /// Untied, but a checkpoint without `lm_head.weight` uses the embedding (MiniCPM's
    /// sanitize copies it).
    pub head_falls_back_to_embedding: bool,
}

/// `x * m` with `m` in `x`'s dtype (a Python scalar in mlx).
fn times(x: &Array, m: Option<f32>) -> Result<Array> {
    match m {
        None => Ok(x.clone()),
        Some(m) => Ok(x.multiply(Array::from_f32(m).as_dtype(x.dtype())?)?),
    }
}

fn divided(x: &Array, d: Option<f32>) -> Result<Array> {
    match d {
        None => Ok(x.clone()),
        Some(d) => Ok(x.divide(Array::from_f32(d).as_dtype(x.dtype())?)?),
    }
}

pub struct DenseDecoder {
    embed_tokens: Embedding,
    layers: Vec<DecoderBlock>,
    norm: RmsNorm,
    lm_head: Option<Linear>,
    info: ModelInfo,
    scaling: DecoderScaling,
    /// Under pipeline parallel: this rank's stage (`layers` holds only its layers).
    stage: Option<super::pipeline::Stage>,
}

impl DenseDecoder {
    pub fn load(mut w: Weights, mut spec: DenseDecoderSpec) -> Result<Self> {
        // Loaded tensor-parallel: this rank's slices and sizes (mlx-lm's `shard()`).
        let tensor_group = w.options().take_tensor_group();
        if let Some(group) = &tensor_group {
            super::tensor_parallel::shard_dense(&mut w, &mut spec, group)?;
        }
        // Loaded as a pipeline stage: only this rank's layers (mlx-lm's `pipeline()`).
        let stage = match w.options().take_pipeline_group() {
            Some(group) => Some(super::pipeline::Stage::new(group, &spec.info.model_type, spec.info.num_layers)?),
            None => None,
        };
        let mut info = spec.info;
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
            if stage.as_ref().is_some_and(|s| !s.layers.contains(&i)) {
                w.remove_prefix(&format!("{p}."));
                continue;
            }
            let mut opts = spec.attention.clone();
            if spec.nope_layers.contains(&i) {
                opts.rope = Rope::none(opts.rope.dims());
            }
            let mut self_attn = if spec.fused_projections {
                Attention::load_fused(&mut w, &format!("{p}.self_attn"), opts)?
            } else {
                Attention::load(&mut w, &format!("{p}.self_attn"), opts)?
            };
            if let Some(scale) = spec.scaling.attention {
                self_attn = self_attn.with_scale(scale);
            }
            if let Some((beta, original_max)) = spec.scaling.query_position_scaling {
                self_attn = self_attn.with_query_scaling(beta, original_max);
            }
            let mut mlp = if spec.fused_projections {
                Mlp::load_fused(&mut w, &format!("{p}.mlp"), hidden, spec.intermediate)?
            } else {
                Mlp::load(&mut w, &format!("{p}.mlp"), hidden, spec.intermediate, spec.mlp_bias)?
            };
            if let Some(group) = &tensor_group {
                super::tensor_parallel::sum_output_over(self_attn.o_proj_mut(), group);
                super::tensor_parallel::sum_output_over(mlp.down_proj_mut(), group);
            }
            layers.push(DecoderBlock {
                self_attn,
                mlp,
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
        let head_from_embedding = spec.scaling.head_falls_back_to_embedding && !w.contains("lm_head.weight");
        let lm_head = if spec.tie_word_embeddings || head_from_embedding {
            None
        } else {
            Some(Linear::load(&mut w, "lm_head", hidden, vocab, false)?)
        };
        w.finish()?;
        let mut scaling = spec.scaling;
        if spec.tie_word_embeddings {
            scaling.head_input_divisor = None;
        }
        // Caches (and their memory) are per rank: this stage's layers.
        info.num_layers = layers.len();
        Ok(DenseDecoder { embed_tokens, layers, norm, lm_head, info, scaling, stage })
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
        let sc = &self.scaling;
        let mut h = times(&self.embed_tokens.forward(tokens)?, sc.embedding)?;
        let mask = cache::make_mask(caches[0].as_ref(), h.dim(1), None)?;
        if let Some(stage) = &self.stage {
            h = stage.receive(h)?;
        }
        // Each residual add goes with the norm after it (the next layer's input norm, the
        // final norm after the last): one op in fast mode on the CPU, the same two otherwise.
        // A pipeline stage hands the stream on before the final norm, so it adds alone there.
        let mut normed = match self.layers.first() {
            Some(first) => Some(first.input_layernorm.forward(&h)?),
            None => None,
        };
        for (i, (layer, cache)) in self.layers.iter().zip(caches.iter_mut()).enumerate() {
            let x = normed.take().expect("the norm of this layer's input");
            let r = layer.self_attn.forward(&x, &mask, cache::attention(cache.as_mut())?)?;
            let (h1, x) = layer.post_attention_layernorm.forward_after_add(&h, &times(&r, sc.residual)?)?;
            let r = times(&layer.mlp.forward(&x)?, sc.residual)?;
            match (self.layers.get(i + 1), &self.stage) {
                (Some(next), _) => (h, normed) = next.input_layernorm.forward_after_add(&h1, &r).map(|(h, x)| (h, Some(x)))?,
                (None, None) => (h, normed) = self.norm.forward_after_add(&h1, &r).map(|(h, x)| (h, Some(x)))?,
                _ => h = h1.add(&r)?,
            }
        }
        if let Some(stage) = &self.stage {
            h = stage.hand_on(h)?;
        }
        let h = match normed {
            Some(x) => x,
            None => self.norm.forward(&h)?,
        };
        let logits = match &self.lm_head {
            Some(head) => head.forward(&divided(&h, sc.head_input_divisor)?)?,
            None => self.embed_tokens.as_linear(&divided(&h, sc.head_input_divisor)?)?,
        };
        divided(&logits, sc.logits_divisor)
    }

    fn make_caches(&self) -> Vec<Box<dyn KvCache>> {
        (0..self.layers.len()).map(|_| Box::new(KvCacheSingle::new()) as Box<dyn KvCache>).collect()
    }

    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn fast_cpu_kernels(&self) -> bool {
        self.norm.is_fast()
    }

    fn batched_prefill(&self) -> bool {
        !self.layers.iter().any(|l| l.self_attn.rope().depends_on_chunk_length())
    }
}
