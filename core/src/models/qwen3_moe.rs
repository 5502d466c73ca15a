//! Qwen3-MoE: Qwen3 attention (per-head q/k RMSNorm, explicit `head_dim`) with a sparse
//! mixture-of-experts feed-forward in the layers `decoder_sparse_step` selects, minus
//! `mlp_only_layers`, which keep a dense SwiGLU MLP. Mirrors mlx-lm `models/qwen3_moe.py`,
//! including its `Model.shard()` (tensor parallel: attention and dense MLPs as the dense
//! families, the experts' `SwitchGLU` split in place, the router replicated, the sparse block's
//! output all-summed) and its `PipelineMixin` split (docs/distributed.md).

use mlx_rs::{Array, Dtype};

use super::{ConfigReader, LanguageModel, ModelInfo};
use crate::cache::{self, KvCache, KvCacheSingle};
use crate::distributed::Group;
use crate::nn::{pipeline, tensor_parallel};
use crate::nn::{stack_expert_weights, Attention, AttentionOptions, Embedding, Linear, Mlp, RmsNorm, SparseMoe, Weights};
use crate::{Error, Result};

enum FeedForward {
    Dense(Mlp),
    Sparse(SparseMoe),
}

struct Block {
    self_attn: Attention,
    mlp: FeedForward,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
}

pub struct Qwen3Moe {
    embed_tokens: Embedding,
    layers: Vec<Block>,
    norm: RmsNorm,
    lm_head: Option<Linear>,
    info: ModelInfo,
    /// Under tensor parallel: the group the sparse blocks sum their experts' output over.
    moe_group: Option<Group>,
    /// Under pipeline parallel: this rank's stage (`layers` holds only its layers).
    stage: Option<pipeline::Stage>,
}

pub fn load(cfg: &ConfigReader, mut w: Weights, dtype: Dtype) -> Result<Qwen3Moe> {
    let hidden = cfg.req_i32("hidden_size")?;
    let mut heads = cfg.req_i32("num_attention_heads")?;
    let mut kv_heads = cfg.req_i32("num_key_value_heads")?;
    let head_dim = cfg.req_i32("head_dim")?;
    let eps = cfg.req_f32("rms_norm_eps")?;
    let vocab = cfg.req_i32("vocab_size")?;
    let num_layers = cfg.req_i32("num_hidden_layers")? as usize;
    let mut intermediate = cfg.req_i32("intermediate_size")?;
    let experts = cfg.get("num_experts").and_then(|v| v.as_i64()).unwrap_or(0) as i32;
    let sparse_step = cfg.req_i32("decoder_sparse_step")? as usize;
    let mlp_only: Vec<usize> = match cfg.get("mlp_only_layers") {
        None => Vec::new(),
        Some(v) => v
            .as_array()
            .and_then(|a| a.iter().map(|x| x.as_u64().map(|n| n as usize)).collect::<Option<Vec<_>>>())
            .ok_or_else(|| Error::ModelLoad("config.json: \"mlp_only_layers\" must be a list of layer indices".into()))?,
    };
    let tie = cfg.bool_or("tie_word_embeddings", false)?;
    let mut moe_intermediate = if experts > 0 { cfg.req_i32("moe_intermediate_size")? } else { 0 };
    // Loaded tensor-parallel: this rank's heads and slices (mlx-lm's `shard()`).
    let tensor_group = w.options().take_tensor_group();
    if let Some(g) = &tensor_group {
        let n = g.size() as i32;
        heads = tensor_parallel::divide("num_attention_heads", heads, n)?;
        kv_heads = tensor_parallel::divide("num_key_value_heads", kv_heads, n)?;
        intermediate = tensor_parallel::divide("intermediate_size", intermediate, n)?;
        moe_intermediate = tensor_parallel::divide("moe_intermediate_size", moe_intermediate, n)?;
    }
    // Loaded as a pipeline stage: only this rank's layers (mlx-lm's `pipeline()`).
    let stage = match w.options().take_pipeline_group() {
        Some(g) => Some(pipeline::Stage::new(g, "qwen3_moe", num_layers)?),
        None => None,
    };
    let mut info = ModelInfo {
        model_type: "qwen3_moe".into(),
        vocab_size: vocab,
        hidden_size: hidden,
        num_layers,
        kv_heads,
        head_dim,
        max_position_embeddings: cfg.opt_i32("max_position_embeddings")?.map(|n| n as usize),
        activation_dtype: dtype,
        sliding_window: None,
    };
    let attention = AttentionOptions {
        hidden,
        heads,
        kv_heads,
        head_dim,
        qkv_bias: false,
        o_bias: false,
        qk_norm_eps: Some(eps),
        rope: cfg.rope(head_dim, None, false)?,
    };

    if tie {
        w.remove("lm_head.weight");
    }
    let embed_tokens = Embedding::load(&mut w, "model.embed_tokens", vocab, hidden)?;
    let mut layers = Vec::with_capacity(num_layers);
    for i in 0..num_layers {
        let p = format!("model.layers.{i}");
        if stage.as_ref().is_some_and(|s| !s.layers.contains(&i)) {
            w.remove_prefix(&format!("{p}."));
            continue;
        }
        let sparse = !mlp_only.contains(&i) && experts > 0 && (i + 1) % sparse_step == 0;
        if sparse {
            stack_expert_weights(&mut w, &format!("{p}.mlp"), experts)?;
        }
        if let Some(g) = &tensor_group {
            tensor_parallel::shard_attention(&mut w, &format!("{p}.self_attn"), g)?;
            // The router (`mlp.gate`) stays whole: every rank routes every token alike.
            let mlp = if sparse { format!("{p}.mlp.switch_mlp") } else { format!("{p}.mlp") };
            tensor_parallel::shard_mlp(&mut w, &mlp, g)?;
        }
        let mut mlp = if sparse {
            FeedForward::Sparse(SparseMoe::load(
                &mut w,
                &format!("{p}.mlp"),
                hidden,
                moe_intermediate,
                experts,
                cfg.req_i32("num_experts_per_tok")?,
                cfg.bool_or("norm_topk_prob", false)?,
            )?)
        } else {
            FeedForward::Dense(Mlp::load(&mut w, &format!("{p}.mlp"), hidden, intermediate, false)?)
        };
        let mut self_attn = Attention::load(&mut w, &format!("{p}.self_attn"), attention.clone())?;
        if let Some(g) = &tensor_group {
            tensor_parallel::sum_output_over(self_attn.o_proj_mut(), g);
            if let FeedForward::Dense(dense) = &mut mlp {
                tensor_parallel::sum_output_over(dense.down_proj_mut(), g);
            }
        }
        layers.push(Block {
            self_attn,
            mlp,
            input_layernorm: RmsNorm::load(&mut w, &format!("{p}.input_layernorm"), hidden, eps)?,
            post_attention_layernorm: RmsNorm::load(&mut w, &format!("{p}.post_attention_layernorm"), hidden, eps)?,
        });
    }
    let norm = RmsNorm::load(&mut w, "model.norm", hidden, eps)?;
    let lm_head = if tie { None } else { Some(Linear::load(&mut w, "lm_head", hidden, vocab, false)?) };
    w.finish()?;
    // Caches (and their memory) are per rank: this rank's KV heads, this stage's layers.
    info.num_layers = layers.len();
    Ok(Qwen3Moe { embed_tokens, layers, norm, lm_head, info, moe_group: tensor_group, stage })
}

impl LanguageModel for Qwen3Moe {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        if caches.len() != self.layers.len() {
            return Err(Error::InvalidRequest(format!("{} caches for {} layers", caches.len(), self.layers.len())));
        }
        let mut h = self.embed_tokens.forward(tokens)?;
        let mask = cache::make_mask(caches[0].as_ref(), h.dim(1), None)?;
        if let Some(stage) = &self.stage {
            h = stage.receive(h)?;
        }
        for (layer, cache) in self.layers.iter().zip(caches.iter_mut()) {
            let r = layer.self_attn.forward(&layer.input_layernorm.forward(&h)?, &mask, cache::attention(cache.as_mut())?)?;
            let h1 = h.add(&r)?;
            let x = layer.post_attention_layernorm.forward(&h1)?;
            let r = match &layer.mlp {
                FeedForward::Dense(mlp) => mlp.forward(&x)?,
                FeedForward::Sparse(moe) => match &self.moe_group {
                    Some(g) => g.all_sum(&moe.forward(&x)?)?,
                    None => moe.forward(&x)?,
                },
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
        (0..self.layers.len()).map(|_| Box::new(KvCacheSingle::new()) as Box<dyn KvCache>).collect()
    }

    fn fast_cpu_kernels(&self) -> bool {
        self.norm.is_fast()
    }

    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn batched_prefill(&self) -> bool {
        !self.layers.iter().any(|l| l.self_attn.rope().depends_on_chunk_length())
    }
}
