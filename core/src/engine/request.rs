//! What a caller asks of the engine and what it gets back: requests, their events, the
//! per-request sink and flow control, and the limits every face checks alike.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Arc;

use parking_lot::Mutex;

use super::driver::Command;
use super::Constraint;
use crate::limits::{MAX_DRAFT_TOKENS, MAX_TOP_LOGPROBS};
use crate::sampling::SamplingParams;
use crate::stop::FinishReason;
use crate::tokenizer::{ChatMessage, ChatTemplate};
use crate::tools::{ToolCall, ToolDelta, Tools};
use crate::{Error, Result};

pub type RequestId = u64;

/// The one rule (and message) for a requested number of top alternatives; `key` names the
/// field as the caller wrote it.
pub fn check_top_logprobs(k: usize, key: &str) -> Result<()> {
    if k > MAX_TOP_LOGPROBS {
        return Err(Error::field(key, format!("{key} must be an integer in [0, {MAX_TOP_LOGPROBS}], got {k}")));
    }
    Ok(())
}

pub(super) fn check_draft_tokens(n: usize) -> Result<()> {
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
    /// it; preparation ([`super::Preparer::prepare`]) expands each to `boa + audio x n + eoa` as the
    /// reference processor does.
    pub audio: Vec<Vec<u8>>,
    /// Renders `Input::Messages` with this template instead of the engine's override
    /// ([`super::EngineConfig::chat_template`]) or the model's own.
    pub chat_template: Option<Arc<ChatTemplate>>,
    /// Variables for the chat template (OpenAI-compatible servers' `chat_template_kwargs`:
    /// `enable_thinking` foremost, any key the template reads), over the engine's defaults
    /// ([`super::EngineConfig::chat_template_kwargs`]).
    pub chat_template_kwargs: serde_json::Map<String, serde_json::Value>,
    /// Reasoning tokens the model may spend before Weft closes its reasoning block itself and
    /// the answer begins ([`crate::reasoning`]); `None`: the engine's default
    /// ([`super::EngineConfig::reasoning_budget`]).
    pub reasoning_budget: Option<usize>,
    /// Prompt-lookup speculative decoding: draft up to this many tokens per step
    /// (mlx_lm.server's `num_draft_tokens`; 0 turns it off); `None`: the engine's default
    /// ([`super::EngineConfig::num_draft_tokens`]).
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

    /// Where [`RowFlow::resume`] wakes the driver.
    pub(super) fn wake_through(&self, tx: Sender<Command>) {
        *self.inner.wake.lock() = Some(tx);
    }
}
