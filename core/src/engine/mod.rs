//! The continuous-batching engine.
//!
//! - [`Engine`]: the thread-safe handle apps use. One driver thread owns the model and MLX;
//!   requests cross into it through a channel and events leave through per-request sinks.
//! - [`EngineCore`]: the single-threaded heart (scheduler + executor), also driven directly by
//!   tools that need step-exact control (`weft replay`).
//! - [`scheduler`]: policy (queue, admission by rows / prompt concurrency / KV budget).
//! - [`executor`]: MLX execution (batched chunked prefill, join, batched decode, evict).
//! - [`prompt_cache`]: reuse of KV for shared token prefixes.

mod batch;
mod constrained;
mod core;
mod count;
mod events;
mod executor;
mod faults;
mod lockstep;
mod media;
mod memory;
mod prompt_cache;
mod prompt_cache_file;
mod queue;
mod row;
mod scheduler;
mod single;
mod speculative;
mod thinking;
pub use single::{run_single, SingleRow};

pub use self::core::EngineCore;
pub use speculative::Drafter;
pub use events::EventSink;
pub use executor::DecodeMode;
#[cfg(feature = "faults")]
pub use faults::Faults;
pub use lockstep::{follow, FollowerSinks, LockstepCore, LockstepOptions, RankStats, Step};
pub use media::{attach_audio, attach_images, PreparedAudio, PreparedImage};
pub use memory::{prompt_cache_capacity, release_free_heap, use_single_heap_arena, MemoryPolicy, PROMPT_CACHE_AUTO};
pub use prompt_cache::PromptCache;
pub use prompt_cache_file::{entry_file, load_entry, save_entry, CacheIdentity, SavedEntry};
pub use queue::{EventQueue, FlowQueue, Next, PAUSE_AT, RESUME_AT};
pub use scheduler::Scheduler;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::Mutex;

use crate::cache::KvQuantization;
pub use crate::constrain::Constraint;
use crate::constrain::{ConstraintFactoryCell, RowConstraint};
pub use crate::stop::FinishReason;
use crate::loading::LoadedModel;
use crate::models::ModelInfo;
use crate::reasoning::ReasoningPlan;
use crate::sampling::SamplingParams;
use crate::tokenizer::{ChatMessage, ChatTemplate, Tokenizer};
use crate::tools::{ToolCall, ToolDelta, Tools};
use crate::{Error, Result};

pub type RequestId = u64;

use crate::limits::{MAX_DRAFT_TOKENS, MAX_TOP_LOGPROBS};

/// The one rule (and message) for a requested number of top alternatives; `key` names the
/// field as the caller wrote it.
pub fn check_top_logprobs(k: usize, key: &str) -> Result<()> {
    if k > MAX_TOP_LOGPROBS {
        return Err(Error::field(key, format!("{key} must be an integer in [0, {MAX_TOP_LOGPROBS}], got {k}")));
    }
    Ok(())
}


fn check_draft_tokens(n: usize) -> Result<()> {
    if n > MAX_DRAFT_TOKENS {
        return Err(Error::field("num_draft_tokens", format!("num_draft_tokens must be an integer in [0, {MAX_DRAFT_TOKENS}], got {n}")));
    }
    Ok(())
}

/// What to generate from.
#[derive(Debug, Clone)]
pub enum Input {
    /// Raw text, tokenized as-is (special tokens added per the tokenizer's config).
    Prompt(String),
    /// A conversation rendered with the model's chat template (generation prompt added).
    Messages(Vec<ChatMessage>),
    /// Token ids.
    Tokens(Vec<u32>),
}

#[derive(Debug, Clone)]
pub struct Request {
    pub input: Input,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Stop strings (cut from the output).
    pub stop: Vec<String>,
    /// Do not stop at the model's end-of-sequence tokens.
    pub ignore_eos: bool,
    /// Report this many leading raw logits of the first step in `Done` (parity tooling).
    pub capture_first_logits: usize,
    /// Report each token's log-probability and this many top alternatives (OpenAI `logprobs`
    /// / `top_logprobs`); `None` = no log-probabilities.
    pub logprobs: Option<usize>,
    /// Tools the model may call (needs `Input::Messages`): they are rendered into the prompt
    /// and the output is parsed for calls ([`crate::tools`]).
    pub tools: Option<Tools>,
    /// What the output must match (JSON schema, regex, grammar, choice); `None` = free text.
    /// Checked at submit: a bad schema or grammar is refused there, naming the field.
    pub constraint: Option<Constraint>,
    /// Encoded images (PNG / JPEG / WebP files), in prompt order, for a model with a vision
    /// tower. Token-id prompts hold the model's image placeholder run for each
    /// ([`crate::vision::ImageSpec`]); text prompts and messages hold its begin-of-image
    /// marker, expanded here as the reference processor does.
    pub images: Vec<Vec<u8>>,
    /// Encoded audio clips (WAV / MP3 / FLAC / Ogg Vorbis files, at most 30 s each), in prompt
    /// order, for a model with an audio tower. The prompt (token ids, text or the rendered
    /// conversation) holds the model's audio token once per clip, where the chat template puts
    /// it; [`attach_audio`] expands each to `boa + audio x n + eoa` as the reference processor does.
    pub audio: Vec<Vec<u8>>,
    /// Renders `Input::Messages` with this template instead of the engine's override
    /// ([`EngineConfig::chat_template`]) or the model's own.
    pub chat_template: Option<Arc<ChatTemplate>>,
    /// Variables for the chat template (OpenAI-compatible servers' `chat_template_kwargs`:
    /// `enable_thinking` foremost, any key the template reads), over the engine's defaults
    /// ([`EngineConfig::chat_template_kwargs`]).
    pub chat_template_kwargs: serde_json::Map<String, serde_json::Value>,
    /// Reasoning tokens the model may spend before Weft closes its reasoning block itself and
    /// the answer begins ([`crate::reasoning`]); `None`: the engine's default
    /// ([`EngineConfig::reasoning_budget`]).
    pub reasoning_budget: Option<usize>,
    /// Prompt-lookup speculative decoding: draft up to this many tokens per step
    /// (mlx_lm.server's `num_draft_tokens`; 0 turns it off); `None`: the engine's default
    /// ([`EngineConfig::num_draft_tokens`]).
    pub num_draft_tokens: Option<usize>,
}

impl Request {
    pub fn new(input: Input) -> Self {
        Request {
            input,
            max_tokens: 256,
            sampling: SamplingParams::default(),
            stop: Vec::new(),
            ignore_eos: false,
            capture_first_logits: 0,
            logprobs: None,
            tools: None,
            constraint: None,
            images: Vec::new(),
            audio: Vec::new(),
            chat_template: None,
            chat_template_kwargs: serde_json::Map::new(),
            reasoning_budget: None,
            num_draft_tokens: None,
        }
    }
}

/// Log-probabilities of a generated token (after logits processors, before temperature).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TokenLogprobs {
    pub logprob: f32,
    /// The most likely tokens at this step, best first.
    pub top: Vec<(u32, f32)>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens whose KV came from the prompt cache instead of being prefilled.
    pub cached_tokens: usize,
    /// Completion tokens spent reasoning (inside the reasoning block, its markers included).
    pub reasoning_tokens: usize,
}

/// What ended a request that finished with [`FinishReason::Stop`] or [`FinishReason::ToolCalls`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopCause {
    /// One of the model's end-of-sequence tokens (not part of the output, not counted).
    Eos { token_id: u32 },
    /// One of the request's stop strings (cut from the output, with everything after it).
    StopString { stop: String },
    /// The request's constraint is complete: its grammar allows nothing more.
    Constraint,
    /// The request's tool-call limit was reached (a named or required `tool_choice`, or
    /// `parallel_tool_calls: false`, ends after the first complete call).
    ToolCallLimit,
}

/// A request's stream: `Started` once admitted, tokens, then exactly one `Done` or `Error`, on
/// every path (normal end, cancellation, a consumer that went away or panicked, a failed step,
/// shutdown, a dead engine thread). A request that fails or is cancelled before admission gets
/// no `Started`.
#[derive(Debug, Clone)]
pub enum Event {
    /// The request was admitted: its prompt (rendered, tokenized, media expanded) has
    /// `prompt_tokens` tokens, `cached_tokens` of them served from the prompt cache. What a face
    /// reports before the first token (Anthropic's `message_start` usage) comes from here.
    Started { prompt_tokens: usize, cached_tokens: usize },
    /// One generated token and the text it releases (possibly empty: text that may still turn
    /// out to be part of a stop string, or half a character, is held back). `logprobs` is set
    /// when the request asked for them. With tools, text that is part of a tool call is not in
    /// `text`: it arrives as `tool_calls` deltas (a call's start, then argument fragments).
    /// `reasoning` is the part of the released text that is the model's reasoning ("thinking",
    /// [`crate::reasoning`]): a model whose template marks reasoning has its output split into
    /// `reasoning` and `text`, markers removed; for other models `reasoning` is always empty.
    Token { token_id: u32, text: String, reasoning: String, logprobs: Option<TokenLogprobs>, tool_calls: Vec<ToolDelta> },
    /// The request finished. Everything the end released is here, so a face forwards it as
    /// the last delta and derives nothing: `text` is the output text still held back when it
    /// ended (empty when cancelled or cut by a stop string; the full output is every `Token`'s
    /// text and this), `tool_deltas` the tool-call pieces the end released (every `Token`'s
    /// `tool_calls` and these assemble to `tool_calls`). `finish_reason` is
    /// [`FinishReason::ToolCalls`] when a request with tools stopped after making calls;
    /// `stop` says which stop ended a `Stop` or `ToolCalls` finish. `tool_calls`: every call
    /// the output made, complete.
    Done {
        finish_reason: FinishReason,
        stop: Option<StopCause>,
        text: String,
        /// Reasoning text still held back when the row ended (as `text` is for the answer).
        reasoning: String,
        usage: Usage,
        first_logits: Vec<f32>,
        tool_deltas: Vec<ToolDelta>,
        tool_calls: Vec<ToolCall>,
    },
    Error { message: String },
}

impl Event {
    pub fn is_final(&self) -> bool {
        !matches!(self, Event::Token { .. } | Event::Started { .. })
    }
}

/// Receives a request's events on the engine's driver thread. Returning `false` means the
/// consumer is gone or failed: the request is cancelled (its row alone is evicted).
pub type Sink = Box<dyn FnMut(&Event) -> bool + Send>;

/// Per-request flow control, for consumers that take events off the driver thread and may fall
/// behind. While paused, the request's row is parked: its KV is set aside outside the batch and
/// it generates nothing, while every other row keeps decoding. Resuming puts the row back into
/// the batch (exactly as a joining row enters it). A sink never blocks the engine; it pauses
/// instead, so a slow consumer back-pressures only its own row.
#[derive(Clone, Default)]
pub struct RowFlow {
    inner: Arc<FlowInner>,
}

#[derive(Default)]
struct FlowInner {
    paused: AtomicBool,
    /// Wakes an idle driver when a parked row may continue.
    wake: Mutex<Option<Sender<Command>>>,
}

impl RowFlow {
    pub fn new() -> Self {
        Self::default()
    }

    /// Stops the row after the step in progress (events already produced are still delivered).
    pub fn pause(&self) {
        self.inner.paused.store(true, Ordering::SeqCst);
    }

    /// Lets a paused row continue.
    pub fn resume(&self) {
        if self.inner.paused.swap(false, Ordering::SeqCst) {
            if let Some(tx) = self.inner.wake.lock().as_ref() {
                let _ = tx.send(Command::Wake);
            }
        }
    }

    pub fn is_paused(&self) -> bool {
        self.inner.paused.load(Ordering::SeqCst)
    }
}

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
    /// left after loading ([`prompt_cache_capacity`]). It shares one ceiling with the rows' KV
    /// (the KV budget; for `auto` without one, the memory MLX could allocate at start): entries
    /// are evicted, least recently used first, before a row would wait.
    pub prompt_cache_bytes: u64,
    /// A directory the prompt cache is loaded from at start and saved to at shutdown (one file
    /// per entry, [`save_entry`]): entries survive a restart. Files saved for another model,
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
    /// [`Request::chat_template`] still wins); `None` keeps the model's.
    pub chat_template: Option<Arc<ChatTemplate>>,
    /// Chat-template variables every request starts from (`weft serve --chat-template-args`);
    /// a request's own [`Request::chat_template_kwargs`] override them key by key.
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
    /// Rows parked because their consumer paused them ([`RowFlow`]).
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

/// A validated, tokenized request ready for the core.
pub struct Submission {
    pub id: RequestId,
    pub prompt: Vec<u32>,
    pub request: Request,
    pub stop_token_ids: Vec<u32>,
    pub sink: EventSink,
    /// Set by [`Engine::submit_with_flow`].
    pub flow: Option<RowFlow>,
    /// The request's constraint, compiled for this model (from `request.constraint`).
    pub constraint: Option<RowConstraint>,
    /// The request's images, preprocessed ([`attach_images`]).
    pub images: Vec<PreparedImage>,
    /// The request's audio clips, as log-mel features ([`attach_audio`]).
    pub audio: Vec<PreparedAudio>,
    /// The model's reasoning for this row: set for a conversation whose template marks
    /// reasoning ([`crate::reasoning`]).
    pub reasoning: Option<ReasoningPlan>,
    /// The conversation as its template rendered it (what media expansion re-tokenizes).
    pub rendered: Option<String>,
    /// Prompt positions where the prompt cache snapshots the row while it prefills (chat
    /// boundaries the next turn shares; [`prompt_cache`]), ascending.
    pub checkpoints: Vec<usize>,
}

enum Command {
    Submit(Submission),
    Cancel(RequestId),
    /// A paused row was resumed; an idle driver re-checks its parked rows.
    Wake,
    Shutdown,
}

/// Whether the driver thread is alive. Once it has died (a panic outside any step, which
/// only a bug causes) the engine takes no more requests and says why.
#[derive(Default)]
struct Health {
    failure: Mutex<Option<String>>,
    /// The driver is stuck where it cannot be interrupted (a collective of a rank group that
    /// stopped answering): shutting down leaves it instead of joining it.
    abandoned: AtomicBool,
}

impl Health {
    fn check(&self) -> Result<()> {
        match self.failure.lock().as_ref() {
            Some(why) => Err(Error::EngineFailed(why.clone())),
            None => Ok(()),
        }
    }

    fn mark_dead(&self, why: String) {
        self.failure.lock().get_or_insert(why);
    }
}

/// Thread-safe handle to a running engine. Dropping it cancels outstanding requests (each gets
/// its final event) and joins the driver thread.
pub struct Engine {
    front: Arc<Front>,
    stats: Arc<Mutex<EngineStats>>,
    driver: Option<JoinHandle<()>>,
}

/// What submitting needs, shared by the [`Engine`] and its [`Submitter`]s.
struct Front {
    tx: Sender<Command>,
    health: Arc<Health>,
    tokenizer: Option<Tokenizer>,
    /// The grammar compiler of `tokenizer`, shared with the model it came from.
    constraints: ConstraintFactoryCell,
    info: ModelInfo,
    eos_token_ids: Vec<u32>,
    /// The model's image contract, when it has a vision tower.
    vision: Option<crate::vision::ImageSpec>,
    /// The model's audio contract, when it has an audio tower.
    audio: Option<crate::audio::AudioSpec>,
    config: EngineConfig,
    next_id: AtomicU64,
    /// Steps run across ranks: refuse at submit what the ranks cannot reproduce.
    lockstep: bool,
}

impl Front {
    fn check(&self, request: Request) -> Result<CheckedRequest> {
        self.health.check()?;
        if self.lockstep {
            lockstep::check_request(&request)?;
        }
        check_request(request, self.tokenizer.as_ref(), &self.constraints, &self.info, &self.config)
    }

    fn submit(&self, checked: CheckedRequest, sink: Sink, flow: Option<RowFlow>) -> Result<RequestId> {
        self.health.check()?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut sub =
            finish_prepare(id, checked, sink, self.tokenizer.as_ref(), &self.constraints, &self.info, &self.eos_token_ids, &self.config)?;
        attach_images(&mut sub, self.vision.as_ref(), self.tokenizer.as_ref(), &self.info)?;
        attach_audio(&mut sub, self.audio.as_ref(), &self.info, &self.config)?;
        if self.lockstep {
            // Followers prefill in the same chunks as rank 0 and never learn its boundaries.
            sub.checkpoints.clear();
        }
        if let Some(flow) = &flow {
            *flow.inner.wake.lock() = Some(self.tx.clone());
        }
        sub.flow = flow;
        if let Err(mpsc::SendError(Command::Submit(mut sub))) = self.tx.send(Command::Submit(sub)) {
            // The driver is gone: no event will ever come, so the caller gets the error instead.
            sub.sink.discard();
            return Err(self.health.check().err().unwrap_or(Error::Shutdown));
        }
        Ok(id)
    }
}

/// A cloneable handle that submits [`CheckedRequest`]s and cancels requests from any thread,
/// for a face that checks requests on its caller's thread ([`Engine::check`]) and tokenizes
/// them on another. Once the engine is shut down its submits fail with [`Error::Shutdown`].
#[derive(Clone)]
pub struct Submitter {
    front: Arc<Front>,
}

impl Submitter {
    /// Tokenizes (or renders the chat template of) a checked request, checks its prompt, and
    /// queues it, as [`Engine::submit_with_flow`] does.
    pub fn submit_checked(&self, checked: CheckedRequest, sink: Sink, flow: Option<RowFlow>) -> Result<RequestId> {
        self.front.submit(checked, sink, flow)
    }

    /// As [`Engine::cancel`].
    pub fn cancel(&self, id: RequestId) {
        let _ = self.front.tx.send(Command::Cancel(id));
    }
}

impl Engine {
    pub fn start(model: LoadedModel, config: EngineConfig) -> Result<Engine> {
        Engine::start_with(model, config, false, drive)
    }

    /// [`Engine::start`] with `driver` as the driver thread's body (one rank process or a
    /// group of them: [`lockstep`]).
    fn start_with(
        model: LoadedModel,
        config: EngineConfig,
        lockstep: bool,
        driver: impl FnOnce(EngineCore, Receiver<Command>, Arc<Mutex<EngineStats>>, Arc<Health>) + Send + 'static,
    ) -> Result<Engine> {
        let config = lockstep_prompt_cache(config, lockstep);
        config.validate_for(model.model.info())?;
        if let (Some(_), Some(why)) = (config.kv_quantization(), model.model.kv_quantization_unsupported()) {
            return Err(Error::Unsupported(why));
        }
        config.memory.apply()?;
        let stats = Arc::new(Mutex::new(EngineStats {
            kv_budget_bytes: config.kv_budget_bytes,
            ..EngineStats::default()
        }));
        let health = Arc::new(Health::default());
        let (tx, rx) = mpsc::channel();
        let tokenizer = model.tokenizer.clone();
        let constraints = model.constraints.clone();
        let info = model.model.info().clone();
        let eos_token_ids = model.eos_token_ids.clone();
        let vision = model.model.vision().map(|v| v.spec().clone());
        let audio = model.model.audio().map(|a| a.spec().clone());
        let core_config = config.clone();
        let drafter = speculative::Drafter::from_config(&config, info.vocab_size)?;
        let (shared_stats, shared_health) = (Arc::clone(&stats), Arc::clone(&health));
        let driver = std::thread::Builder::new()
            .name("weft-engine".into())
            .spawn(move || driver(EngineCore::new(model, core_config).with_drafter(drafter), rx, shared_stats, shared_health))
            .map_err(|e| Error::Mlx(format!("cannot start the engine thread: {e}")))?;
        let front = Front { tx, health, tokenizer, constraints, info, eos_token_ids, vision, audio, config, next_id: AtomicU64::new(1), lockstep };
        Ok(Engine { front: Arc::new(front), stats, driver: Some(driver) })
    }

    pub fn tokenizer(&self) -> Option<&Tokenizer> {
        self.front.tokenizer.as_ref()
    }

    pub fn model_info(&self) -> &ModelInfo {
        &self.front.info
    }

    /// The model's image contract (`None`: a text-only model).
    pub fn vision(&self) -> Option<&crate::vision::ImageSpec> {
        self.front.vision.as_ref()
    }

    /// The model's audio contract (`None`: a model without an audio tower).
    pub fn audio(&self) -> Option<&crate::audio::AudioSpec> {
        self.front.audio.as_ref()
    }

    pub fn config(&self) -> &EngineConfig {
        &self.front.config
    }

    /// `Ok` while the engine serves requests; [`Error::EngineFailed`] once its driver thread
    /// has died (every outstanding request then got an `Error` event).
    pub fn health(&self) -> Result<()> {
        self.front.health.check()
    }

    /// Validates and tokenizes `request` on the caller's thread (so bad requests fail here,
    /// synchronously), then queues it. Events go to `sink` on the engine thread.
    pub fn submit(&self, request: Request, sink: Sink) -> Result<RequestId> {
        self.submit_flow(request, sink, None)
    }

    /// Like [`Engine::submit`], with flow control: while `flow` is paused the request's row is
    /// parked and the rest of the batch goes on without it.
    pub fn submit_with_flow(&self, request: Request, sink: Sink, flow: RowFlow) -> Result<RequestId> {
        self.submit_flow(request, sink, Some(flow))
    }

    fn submit_flow(&self, request: Request, sink: Sink, flow: Option<RowFlow>) -> Result<RequestId> {
        let checked = self.front.check(request)?;
        self.front.submit(checked, sink, flow)
    }

    /// The checks of [`Engine::submit`] that need no tokenization ([`check_request`]); the
    /// result goes to a [`Submitter`], which tokenizes and queues it.
    pub fn check(&self, request: Request) -> Result<CheckedRequest> {
        self.front.check(request)
    }

    /// A handle that submits checked requests from another thread.
    pub fn submitter(&self) -> Submitter {
        Submitter { front: Arc::clone(&self.front) }
    }

    /// Like [`Engine::submit`], delivering events through a channel. Dropping the receiver
    /// cancels the request.
    pub fn submit_channel(&self, request: Request) -> Result<(RequestId, Receiver<Event>)> {
        let (tx, rx) = mpsc::channel();
        let id = self.submit(request, Box::new(move |ev: &Event| tx.send(ev.clone()).is_ok()))?;
        Ok((id, rx))
    }

    /// Cancels a queued, prefilling or decoding request; its sink gets `Done(cancelled)`.
    /// Unknown or finished ids are ignored.
    pub fn cancel(&self, id: RequestId) {
        let _ = self.front.tx.send(Command::Cancel(id));
    }

    pub fn stats(&self) -> EngineStats {
        self.stats.lock().clone()
    }

    /// Cancels everything outstanding, delivers final events and joins the driver thread.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        let _ = self.front.tx.send(Command::Shutdown);
        if let Some(driver) = self.driver.take() {
            if !self.front.health.abandoned.load(Ordering::SeqCst) {
                let _ = driver.join();
            }
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.stop();
    }
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

/// A request that passed every check that needs no tokenization ([`check_request`]): what is
/// left is rendering / tokenizing its prompt and the checks on the prompt's length
/// ([`finish_prepare`]).
pub struct CheckedRequest {
    request: Request,
    /// The prompt's ids, already checked, when the request gave token ids.
    prompt: Option<Vec<u32>>,
    /// The request's own constraint, compiled for this model.
    constraint: Option<RowConstraint>,
}

impl CheckedRequest {
    /// Whether [`finish_prepare`] still has a prompt to render or tokenize (text or messages);
    /// a token-id prompt is ready to queue.
    pub fn needs_tokenizing(&self) -> bool {
        self.prompt.is_none()
    }
}

/// The cheap half of [`prepare`]: field ranges, what needs a tokenizer or a chat template,
/// tool history, token-id prompts against the vocabulary, context and KV budget, and the
/// constraint (compiled here, so a bad schema is refused at once). A face may run this on its
/// caller's thread and leave [`finish_prepare`] (tokenization, chat-template rendering) to
/// another.
pub fn check_request(
    request: Request,
    tokenizer: Option<&Tokenizer>,
    constraints: &ConstraintFactoryCell,
    info: &ModelInfo,
    config: &EngineConfig,
) -> Result<CheckedRequest> {
    if let Some(n) = request.num_draft_tokens {
        check_draft_tokens(n)?;
    }
    let need_tokenizer = || {
        tokenizer.ok_or_else(|| Error::InvalidRequest("this model has no tokenizer; send token ids".into()))
    };
    let prompt = match (&request.input, &request.tools) {
        (Input::Messages(messages), tools) => {
            crate::tools::check_history(messages)?;
            let tokenizer = need_tokenizer()?;
            let template = request.chat_template.as_deref().or(config.chat_template.as_deref()).or(tokenizer.chat_template());
            match (tools, template) {
                (Some(_), None) => {
                    return Err(crate::tools::ToolsError::new("tools", "tools need a model with a chat template; this model has none").into())
                }
                (None, None) => return Err(Error::Tokenizer("this model has no chat template; pass a raw prompt".into())),
                _ => {}
            }
            None
        }
        // A caller that rendered the prompt itself (the server) has set the call syntax.
        (Input::Tokens(ids), Some(tools)) if tools.format.is_some() => Some(ids.clone()),
        (_, Some(_)) => {
            return Err(Error::InvalidRequest("tools need a conversation (messages), not a raw prompt or token ids".into()))
        }
        (Input::Tokens(ids), None) => Some(ids.clone()),
        (Input::Prompt(_), None) => {
            need_tokenizer()?;
            None
        }
    };
    if let Some(k) = request.logprobs {
        check_top_logprobs(k, "top_logprobs")?;
    }
    if request.max_tokens == 0 {
        return Err(Error::InvalidRequest("max_tokens must be at least 1".into()));
    }
    if !request.stop.is_empty() && tokenizer.is_none() {
        return Err(Error::InvalidRequest("stop strings need a model with a tokenizer".into()));
    }
    if let Some(prompt) = &prompt {
        check_prompt(&request, prompt, info, config)?;
    }
    request.sampling.validate(info.vocab_size as usize)?;
    let constraint = match &request.constraint {
        Some(c) => Some(compile_constraint(c, tokenizer, constraints)?),
        None => None,
    };
    Ok(CheckedRequest { request, prompt, constraint })
}

/// The prompt against the vocabulary, the context and the engine's whole KV budget.
pub(super) fn check_prompt(request: &Request, prompt: &[u32], info: &ModelInfo, config: &EngineConfig) -> Result<()> {
    crate::prefill::validate_prompt_ids(info, prompt)?;
    if let Some(budget) = config.kv_budget_bytes {
        let need = scheduler::projected_kv_bytes_for(info, config.kv_quantization().as_ref(), prompt.len(), request.max_tokens);
        if need > budget {
            return Err(Error::Capacity(format!(
                "this request needs {need} bytes of KV cache ({} prompt + {} max tokens), more than the \
                 engine's whole KV budget of {budget} bytes",
                prompt.len(),
                request.max_tokens
            )));
        }
    }
    Ok(())
}

fn compile_constraint(c: &Constraint, tokenizer: Option<&Tokenizer>, constraints: &ConstraintFactoryCell) -> Result<RowConstraint> {
    let tokenizer = tokenizer.ok_or_else(|| {
        Error::field(c.field(), format!("{}: constrained output needs a model with a tokenizer", c.field()))
    })?;
    // The constraint's own field names what a schema or grammar that does not compile is about.
    constraints.compile(c, tokenizer).map_err(|e| match e {
        Error::InvalidRequest(message) => Error::Field { key: c.field().to_string(), message },
        // A vocabulary the grammar engine cannot read refuses this request, not the model.
        Error::Unsupported(why) => Error::field(c.field(), format!("{}: this model's tokenizer cannot constrain output ({why})", c.field())),
        other => other,
    })
}

/// The costly half of [`prepare`]: renders the chat template (with tools) or tokenizes the
/// text, checks the prompt's length, and compiles a forced tool choice's grammar.
pub fn finish_prepare(
    id: RequestId,
    checked: CheckedRequest,
    sink: Sink,
    tokenizer: Option<&Tokenizer>,
    constraints: &ConstraintFactoryCell,
    info: &ModelInfo,
    eos_token_ids: &[u32],
    config: &EngineConfig,
) -> Result<Submission> {
    let CheckedRequest { mut request, prompt, mut constraint } = checked;
    let need_tokenizer = || {
        tokenizer.ok_or_else(|| Error::InvalidRequest("this model has no tokenizer; send token ids".into()))
    };
    let mut reasoning = None;
    let mut rendered = None;
    let mut checkpoints = Vec::new();
    let prompt = match prompt {
        Some(ids) => ids,
        None => {
            // The template: the request's override, the engine's, else the model's own.
            let override_template = request.chat_template.clone().or_else(|| config.chat_template.clone());
            request.chat_template = override_template.clone();
            let prompt = match &request.input {
                Input::Messages(messages) => {
                    let tokenizer = need_tokenizer()?;
                    let template = override_template.as_deref().or(tokenizer.chat_template()).ok_or_else(|| match request.tools {
                        Some(_) => Error::from(crate::tools::ToolsError::new(
                            "tools",
                            "tools need a model with a chat template; this model has none",
                        )),
                        None => Error::Tokenizer("this model has no chat template; pass a raw prompt".into()),
                    })?;
                    // The engine's template variables, then the request's, key by key.
                    let mut kwargs = config.chat_template_kwargs.clone();
                    kwargs.extend(request.chat_template_kwargs.iter().map(|(k, v)| (k.clone(), v.clone())));
                    let text = match &mut request.tools {
                        Some(tools) => crate::tools::render_with_tools(template, messages, tools, &kwargs)?,
                        None => template.render_with_kwargs(messages, None, true, &kwargs)?,
                    };
                    let budget = request.reasoning_budget.or(config.reasoning_budget);
                    reasoning = ReasoningPlan::for_prompt(template.source(), &text, budget);
                    let ids = tokenizer.encode(&text, false)?;
                    // Media expand the prompt later (positions move): no checkpoints then.
                    if config.prompt_cache_bytes > 0 && request.images.is_empty() && request.audio.is_empty() {
                        checkpoints = prompt_cache::chat_checkpoints(template, messages, request.tools.as_ref(), &kwargs, tokenizer, &ids);
                    }
                    rendered = Some(text);
                    ids
                }
                Input::Prompt(text) => need_tokenizer()?.encode(text, true)?,
                Input::Tokens(ids) => ids.clone(),
            };
            check_prompt(&request, &prompt, info, config)?;
            prompt
        }
    };
    // Tool calls are enforced with their grammar (known once the call syntax is): forced from
    // the start for required / named, from the call opener on for auto (which gives way to
    // the caller's own constraint).
    let factory = || tokenizer.and_then(|t| constraints.get_or_build(t).ok());
    let special = |text: &str| factory().and_then(|f| f.special_token(text));
    if let Some(grammar) = request.tools.as_ref().and_then(|t| t.grammar(&special)) {
        match (&request.constraint, &grammar) {
            (None, _) => {
                constraint = Some(compile_constraint(&grammar, tokenizer, constraints)?);
                request.constraint = Some(grammar);
            }
            (Some(_), Constraint::Triggered(_)) => {}
            (Some(other), _) => {
                return Err(Error::InvalidRequest(format!(
                    "tool_choice: a required or named tool call cannot be combined with {}",
                    other.field()
                )))
            }
        }
    }
    let stop_token_ids = if request.ignore_eos { Vec::new() } else { eos_token_ids.to_vec() };
    Ok(Submission {
        id,
        prompt,
        request,
        stop_token_ids,
        sink: EventSink::new(sink),
        flow: None,
        constraint,
        images: Vec::new(),
        audio: Vec::new(),
        reasoning,
        rendered,
        checkpoints,
    })
}

/// Turns a request into token ids and checks it against the model and the engine's limits
/// ([`check_request`], then [`finish_prepare`]).
pub fn prepare(
    id: RequestId,
    request: Request,
    sink: Sink,
    tokenizer: Option<&Tokenizer>,
    constraints: &ConstraintFactoryCell,
    info: &ModelInfo,
    eos_token_ids: &[u32],
    config: &EngineConfig,
) -> Result<Submission> {
    let checked = check_request(request, tokenizer, constraints, info, config)?;
    finish_prepare(id, checked, sink, tokenizer, constraints, info, eos_token_ids, config)
}

/// The driver thread: runs the core until shutdown. A panic inside a step fails the rows in
/// flight and the engine goes on; a panic anywhere else kills the engine, which then fails
/// every outstanding request and reports itself dead.
fn drive(core: EngineCore, rx: Receiver<Command>, stats: Arc<Mutex<EngineStats>>, health: Arc<Health>) {
    let mut core = Some(core);
    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| serve(&mut core, &rx, &stats)));
    if let Err(panic) = run {
        let why = format!("the engine thread failed: {}", events::panic_message(panic.as_ref()));
        health.mark_dead(why.clone());
        if let Some(mut core) = core.take() {
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| core.fail_all(&why)));
            // Whatever is left (a row the failure stranded) gets its final event when dropped.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(core)));
        }
        // Requests submitted before the handle saw the failure.
        for cmd in rx.try_iter() {
            if let Command::Submit(mut sub) = cmd {
                sub.sink.close(Event::Error { message: why.clone() });
            }
        }
        stats.lock().active_rows = 0;
    }
}

fn serve(core: &mut Option<EngineCore>, rx: &Receiver<Command>, stats: &Mutex<EngineStats>) {
    let Some(core) = core.as_mut() else { return };
    let mut shutting_down = false;
    loop {
        // Block only when there is nothing to compute (parked rows wait for a Wake).
        let first = if core.is_idle() && !shutting_down {
            core.on_idle();
            *stats.lock() = core.stats(); // what an idle engine holds, after the release
            match rx.recv() {
                Ok(c) => Some(c),
                Err(_) => break,
            }
        } else {
            None
        };
        for cmd in first.into_iter().chain(std::iter::from_fn(|| rx.try_recv().ok())) {
            match cmd {
                Command::Submit(mut sub) => {
                    if shutting_down {
                        sub.sink.close(Event::Error { message: "the engine is shutting down".into() });
                    } else {
                        core.enqueue(sub);
                    }
                }
                Command::Cancel(id) => core.cancel(id),
                Command::Wake => {}
                Command::Shutdown => shutting_down = true,
            }
        }
        if shutting_down {
            core.cancel_all();
            core.save_prompt_cache();
            *stats.lock() = core.stats();
            break;
        }
        // A bug in a step must not leave requests hanging: the rows in flight get an error
        // event (rows the unwinding dropped get theirs from their EventSink) and the engine
        // keeps serving the queue.
        let step = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| core.iterate()));
        if let Err(panic) = step {
            let what = events::panic_message(panic.as_ref());
            core.fail_running(&format!("internal error: {what}"));
        }
        core.after_step();
        *stats.lock() = core.stats();
    }
}
