//! The engine's settings and the statistics it publishes.

use std::sync::Arc;

#[cfg(feature = "faults")]
use super::Faults;
use super::request::check_draft_tokens;
use super::{DecodeMode, MemoryPolicy, RankStats, PROMPT_CACHE_AUTO};
use crate::cache::KvQuantization;
use crate::models::ModelInfo;
use crate::tokenizer::ChatTemplate;
use crate::{Error, Result};

#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Rows decoding together (mlx_lm.server's `--decode-concurrency`).
    pub max_batch: usize,
    /// Requests admitted to prefill at once.
    pub prompt_concurrency: usize,
    /// Prompt tokens per prefill chunk; decode steps interleave between chunks.
    pub prefill_step_size: usize,
    /// Projected KV bytes (prompt + max_tokens) allowed across admitted rows; `None` = no limit.
    pub kv_budget_bytes: Option<u64>,
    /// Bytes of KV kept for prefix reuse (finished rows and their chat-boundary checkpoints);
    /// 0 disables the prompt cache. The default, [`PROMPT_CACHE_AUTO`], sizes it from the memory
    /// left after loading ([`super::prompt_cache_capacity`]). It shares one ceiling with the rows' KV
    /// (the KV budget; for `auto` without one, the memory MLX could allocate at start): entries
    /// are evicted, least recently used first, before a row would wait.
    pub prompt_cache_bytes: u64,
    /// A directory the prompt cache is loaded from at start and saved to at shutdown (one file
    /// per entry, [`super::save_entry`]): entries survive a restart. Files saved for another model,
    /// tokenizer or kernel mode, or damaged, are refused ([`EngineStats::prompt_cache_files_refused`]).
    pub prompt_cache_dir: Option<std::path::PathBuf>,
    /// Quantize the KV cache to this many bits (mlx-lm's `kv_bits`); `None` (the default)
    /// keeps it in full precision, which is the mode that matches mlx-lm token for token.
    pub kv_bits: Option<i32>,
    /// Elements sharing one scale and bias in the quantized KV cache (`kv_group_size`).
    pub kv_group_size: i32,
    /// Rows' caches turn quantized once they hold this many positions (`quantized_kv_start`).
    pub quantized_kv_start: usize,
    /// How MLX's memory is bounded and when its buffer cache is returned.
    pub memory: MemoryPolicy,
    /// Pipelined decode steps (the default) or the synchronous reference schedule.
    pub decode: DecodeMode,
    /// Deliberate failures, for tests of the final-event guarantee (only in builds with the
    /// `faults` cargo feature, which release builds do not enable).
    #[cfg(feature = "faults")]
    pub faults: Faults,
    /// Renders every conversation with this template instead of the model's own (a request's
    /// [`super::Request::chat_template`] still wins); `None` keeps the model's.
    pub chat_template: Option<Arc<ChatTemplate>>,
    /// Chat-template variables every request starts from (`weft serve --chat-template-args`);
    /// a request's own [`super::Request::chat_template_kwargs`] override them key by key.
    pub chat_template_kwargs: serde_json::Map<String, serde_json::Value>,
    /// Reasoning tokens allowed when a request names no budget; `None`: unbounded.
    pub reasoning_budget: Option<usize>,
    /// Which local files requests may name as images / audio (default: any readable file).
    pub local_media: crate::vision::source::LocalMedia,
    /// Prompt-lookup speculative decoding for requests that name no count: draft up to this
    /// many tokens per step (0, the default, turns it off). Models whose caches cannot drop
    /// rejected positions (recurrent layers, sliding-window rings, quantized KV) never
    /// speculate ([`EngineStats::speculation_off`] says why).
    pub num_draft_tokens: usize,
    /// A draft model (mlx_lm.server's `--draft-model`: a local model directory or file sharing
    /// the tokenizer) drafts the `num_draft_tokens` instead of prompt lookup.
    pub draft_model: Option<std::path::PathBuf>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            max_batch: 8,
            prompt_concurrency: 8,
            prefill_step_size: 2048,
            kv_budget_bytes: None,
            prompt_cache_bytes: PROMPT_CACHE_AUTO,
            prompt_cache_dir: None,
            kv_bits: None,
            kv_group_size: KvQuantization::DEFAULT_GROUP_SIZE,
            quantized_kv_start: 0,
            memory: MemoryPolicy::default(),
            decode: DecodeMode::default(),
            #[cfg(feature = "faults")]
            faults: Faults::default(),
            chat_template: None,
            chat_template_kwargs: serde_json::Map::new(),
            reasoning_budget: None,
            local_media: Default::default(),
            num_draft_tokens: 0,
            draft_model: None,
        }
    }
}

impl EngineConfig {
    pub fn validate(&self) -> Result<()> {
        if self.max_batch == 0 || self.prompt_concurrency == 0 || self.prefill_step_size == 0 {
            return Err(Error::InvalidRequest(
                "max_batch, prompt_concurrency and prefill_step_size must be at least 1".into(),
            ));
        }
        if self.kv_budget_bytes == Some(0) {
            return Err(Error::InvalidRequest("kv_budget_bytes must be positive when set".into()));
        }
        check_draft_tokens(self.num_draft_tokens)?;
        if let Some(q) = self.kv_quantization() {
            q.validate(None)?;
        }
        self.memory.validate()
    }

    /// [`EngineConfig::validate`], plus the checks that need the model (the KV group size must
    /// divide its head dimension).
    pub fn validate_for(&self, info: &ModelInfo) -> Result<()> {
        self.validate()?;
        if let Some(q) = self.kv_quantization() {
            q.validate(Some(info.head_dim))?;
        }
        Ok(())
    }

    /// The KV quantization these settings ask for (`None` = full precision).
    pub fn kv_quantization(&self) -> Option<KvQuantization> {
        KvQuantization::from_options(self.kv_bits, self.kv_group_size, self.quantized_kv_start)
    }
}

#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct EngineStats {
    pub active_rows: usize,
    pub queued_rows: usize,
    pub prefilling_rows: usize,
    pub kv_bytes_in_use: u64,
    pub kv_budget_bytes: Option<u64>,
    pub prompt_cache_bytes: u64,
    pub prompt_cache_entries: usize,
    pub prompt_cache_hits: u64,
    /// Prompt tokens served from the prompt cache (summed over hits), the cache's capacity
    /// and the entries it dropped (least recently used first) to stay under it or to admit rows.
    pub prompt_cache_cached_tokens: u64,
    pub prompt_cache_capacity_bytes: u64,
    pub prompt_cache_evictions: u64,
    /// Files of [`EngineConfig::prompt_cache_dir`] refused at start, each with why.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub prompt_cache_files_refused: Vec<String>,
    pub tokens_generated: u64,
    /// Rows parked because their consumer paused them ([`super::RowFlow`]).
    pub paused_rows: usize,
    pub decode_steps: u64,
    /// Prefill forward passes run (one per chunk; rows prefilling together share one) and the
    /// prompt tokens they covered (padding not counted).
    pub prefill_forwards: u64,
    pub prefill_tokens: u64,
    pub requests_finished: u64,
    /// Cumulative seconds decode steps spent building graphs, waiting on MLX, and on host work
    /// (sampling, detokenizing, callbacks).
    pub decode_graph_build_s: f64,
    pub decode_eval_wait_s: f64,
    pub decode_host_s: f64,
    /// Cumulative seconds constrained rows' masks took on their worker thread, and how long
    /// decode steps waited for them after submitting the forward (the part not overlapped).
    pub decode_mask_compute_s: f64,
    pub decode_mask_wait_s: f64,
    /// Speculative decoding: verification steps run, draft tokens proposed and accepted, and
    /// the acceptance rate (accepted / drafted, 0 before any draft).
    pub speculative_steps: u64,
    pub draft_tokens: u64,
    pub draft_tokens_accepted: u64,
    pub draft_acceptance_rate: f64,
    /// Why this engine's model does not speculate (`None`: it can).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub speculation_off: Option<String>,
    /// Bytes MLX has allocated now (weights, KV, activations) and holds in its buffer cache.
    pub mlx_active_bytes: u64,
    pub mlx_cache_bytes: u64,
    /// Across ranks (rank 0's engine): every rank's device and MLX memory, as of the last step
    /// plan exchange; empty in a single process.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ranks: Vec<RankStats>,
}

/// Ranks in lockstep must evict alike, so a prompt cache sized from each rank's own memory
/// ([`PROMPT_CACHE_AUTO`]) is off there; a size given explicitly applies on every rank.
pub(crate) fn lockstep_prompt_cache(mut config: EngineConfig, lockstep: bool) -> EngineConfig {
    if lockstep && config.prompt_cache_bytes == PROMPT_CACHE_AUTO {
        config.prompt_cache_bytes = 0;
    }
    if lockstep {
        // Only rank 0 would read the files: the ranks' caches would differ.
        config.prompt_cache_dir = None;
    }
    config
}
