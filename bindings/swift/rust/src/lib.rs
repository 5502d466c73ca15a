//! The Rust half of the `Weft` Swift package: a thin swift-bridge layer over
//! `weft::engine::Engine`. The idiomatic Swift API (async streams, `WeftError`, `Sendable`) lives
//! in `../Sources/Weft`; this file only moves strings, numbers and opaque handles.
//!
//! The bridge surface is deliberately small (see ARCHITECTURE.md, "Bindings": swift-bridge
//! 0.1.59 miscompiles richer signatures): owned `String`s, integers, floats, opaque Rust types,
//! `Result<Opaque, Opaque>`, and one opaque Swift type, `EventSink`, whose methods the engine
//! calls with a request's events.
//!
//! Threading: the engine's driver thread calls each request's sink. The sink never waits on
//! Swift: `EventSink` appends to the request's own buffer (an `AsyncThrowingStream`), so a slow
//! consumer only delays itself. Cancellation reaches the engine's `cancel`, and the sink answers
//! `false` from then on so the row is evicted at its next token even if the command is late.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use weft::engine::{EngineConfig, Event, Input, Request};
use weft::generate::FinishReason;
use weft::tokenizer::ChatMessage;

#[swift_bridge::bridge]
mod ffi {
    extern "Rust" {
        #[swift_bridge(Sendable)]
        type RustEngine;
        type RustRequest;
        #[swift_bridge(Sendable)]
        type RustRow;
        #[swift_bridge(Sendable)]
        type RustError;

        fn load_engine(
            model: String,
            max_batch: u32,
            prompt_concurrency: u32,
            prefill_step_size: u32,
            kv_budget_bytes: u64,
            prompt_cache_bytes: u64,
            kv_bits: u32,
            kv_group_size: u32,
            quantized_kv_start: u64,
        ) -> Result<RustEngine, RustError>;

        fn model_path(self: &RustEngine) -> String;
        fn model_type(self: &RustEngine) -> String;
        fn vocab_size(self: &RustEngine) -> u32;
        fn num_layers(self: &RustEngine) -> u32;
        fn context_length(self: &RustEngine) -> u64;
        fn has_tokenizer(self: &RustEngine) -> bool;
        fn submit(self: &RustEngine, request: &RustRequest, sink: EventSink) -> Result<RustRow, RustError>;
        fn stat(self: &RustEngine, name: String) -> u64;
        fn is_closed(self: &RustEngine) -> bool;
        fn close(self: &RustEngine);

        fn new_request() -> RustRequest;
        fn set_prompt(self: &mut RustRequest, text: String);
        fn add_message(self: &mut RustRequest, role: String, content: String);
        fn add_prompt_id(self: &mut RustRequest, id: u32);
        fn set_max_tokens(self: &mut RustRequest, n: u64);
        fn set_temperature(self: &mut RustRequest, x: f64);
        fn set_top_p(self: &mut RustRequest, x: f64);
        fn set_top_k(self: &mut RustRequest, k: u32);
        fn set_min_p(self: &mut RustRequest, x: f64);
        fn set_repetition_penalty(self: &mut RustRequest, x: f64);
        fn set_presence_penalty(self: &mut RustRequest, x: f64);
        fn set_frequency_penalty(self: &mut RustRequest, x: f64);
        fn set_penalty_context(self: &mut RustRequest, n: u64);
        fn set_seed(self: &mut RustRequest, seed: u64);
        fn add_logit_bias(self: &mut RustRequest, token_id: u32, bias: f64);
        fn add_stop(self: &mut RustRequest, text: String);
        fn set_ignore_eos(self: &mut RustRequest, on: bool);

        fn request_id(self: &RustRow) -> u64;
        fn cancel(self: &RustRow);

        fn code(self: &RustError) -> String;
        fn message(self: &RustError) -> String;
    }

    extern "Swift" {
        type EventSink;
        fn on_token(&self, token_id: u32, text: String);
        // finish_reason: 0 stop, 1 length, 2 cancelled. (No doc comments in this module: they
        // panic swift-bridge 0.1.59's build script.)
        fn on_done(&self, finish_reason: u8, prompt_tokens: u64, completion_tokens: u64, cached_tokens: u64);
        fn on_error(&self, code: String, message: String);
    }
}

use ffi::EventSink;

// ---------------------------------------------------------------------------------------------
// Errors

/// A failure reported to Swift as `WeftError(code, message)`. Codes match the Node package's.
pub struct RustError {
    code: &'static str,
    message: String,
}

impl RustError {
    fn new(code: &'static str, message: impl Into<String>) -> Self {
        RustError { code, message: message.into() }
    }

    fn arg(message: impl Into<String>) -> Self {
        RustError::new("INVALID_ARGUMENT", message)
    }

    fn closed() -> Self {
        RustError::new("ENGINE_CLOSED", "the engine is closed")
    }

    /// An error from loading a model (the core's one code mapping, as every face uses).
    fn loading(e: weft::Error) -> Self {
        RustError::new(e.load_code().as_str(), e.to_string())
    }

    fn code(&self) -> String {
        self.code.to_string()
    }

    fn message(&self) -> String {
        self.message.clone()
    }
}

impl From<weft::Error> for RustError {
    /// An error from a running engine (submitting); see [`RustError::loading`] for loading.
    fn from(e: weft::Error) -> Self {
        RustError::new(e.code().as_str(), e.to_string())
    }
}

// ---------------------------------------------------------------------------------------------
// Engine

struct Shared {
    engine: Mutex<Option<weft::engine::Engine>>,
}

impl Shared {
    fn cancel(&self, id: u64) {
        if let Some(e) = self.engine.lock().as_ref() {
            e.cancel(id);
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // The last handle can go away on the engine's own thread (a Swift object released from a
        // sink call); joining the driver from there would deadlock, so shut down elsewhere.
        if let Some(engine) = self.engine.get_mut().take() {
            if std::thread::current().name() == Some("weft-engine") {
                let _ = std::thread::Builder::new().name("weft-engine-drop".into()).spawn(move || engine.shutdown());
            } else {
                engine.shutdown();
            }
        }
    }
}

pub struct RustEngine {
    shared: Arc<Shared>,
    path: String,
    model_type: String,
    vocab_size: u32,
    num_layers: u32,
    context_length: u64,
    has_tokenizer: bool,
}

/// `model` empty: the default model (downloaded and verified on first use). `kv_budget_bytes`
/// 0: no budget. `kv_bits` 0: full-precision KV (the exact mode).
#[allow(clippy::too_many_arguments)]
fn load_engine(
    model: String,
    max_batch: u32,
    prompt_concurrency: u32,
    prefill_step_size: u32,
    kv_budget_bytes: u64,
    prompt_cache_bytes: u64,
    kv_bits: u32,
    kv_group_size: u32,
    quantized_kv_start: u64,
) -> Result<RustEngine, RustError> {
    let config = EngineConfig {
        max_batch: max_batch as usize,
        prompt_concurrency: prompt_concurrency as usize,
        prefill_step_size: prefill_step_size as usize,
        kv_budget_bytes: (kv_budget_bytes > 0).then_some(kv_budget_bytes),
        prompt_cache_bytes,
        kv_bits: (kv_bits > 0).then_some(kv_bits.min(i32::MAX as u32) as i32),
        kv_group_size: kv_group_size.min(i32::MAX as u32) as i32,
        quantized_kv_start: quantized_kv_start as usize,
        ..EngineConfig::default()
    };
    if config.max_batch == 0 || config.prompt_concurrency == 0 || config.prefill_step_size == 0 {
        return Err(RustError::arg("maxBatch, promptConcurrency and prefillStepSize must be at least 1"));
    }
    let path = if model.is_empty() {
        weft::model_store::ModelStore::from_env().default_model_path(&mut |_| {}).map_err(RustError::loading)?
    } else {
        std::path::PathBuf::from(model)
    };
    let loaded = weft::loading::load(&path).map_err(RustError::loading)?;
    let engine = weft::engine::Engine::start(loaded, config)?;
    let info = engine.model_info().clone();
    let has_tokenizer = engine.tokenizer().is_some();
    Ok(RustEngine {
        shared: Arc::new(Shared { engine: Mutex::new(Some(engine)) }),
        path: path.display().to_string(),
        model_type: info.model_type.clone(),
        vocab_size: info.vocab_size.max(0) as u32,
        num_layers: info.num_layers as u32,
        context_length: info.max_position_embeddings.unwrap_or(0) as u64,
        has_tokenizer,
    })
}

impl RustEngine {
    fn model_path(&self) -> String {
        self.path.clone()
    }

    fn model_type(&self) -> String {
        self.model_type.clone()
    }

    fn vocab_size(&self) -> u32 {
        self.vocab_size
    }

    fn num_layers(&self) -> u32 {
        self.num_layers
    }

    /// 0 when the model's config does not say.
    fn context_length(&self) -> u64 {
        self.context_length
    }

    fn has_tokenizer(&self) -> bool {
        self.has_tokenizer
    }

    fn submit(&self, request: &RustRequest, sink: EventSink) -> Result<RustRow, RustError> {
        let request = request.build()?;
        let row = Arc::new(RowFlag { cancelled: AtomicBool::new(false) });
        let flag = Arc::clone(&row);
        let sink = SendSink(sink);
        let id = {
            let guard = self.shared.engine.lock();
            let engine = guard.as_ref().ok_or_else(RustError::closed)?;
            engine.submit(request, Box::new(move |ev: &Event| deliver(&sink, &flag, ev)))?
        };
        Ok(RustRow { id, flag: row, shared: Arc::clone(&self.shared) })
    }

    /// One counter of `EngineStats` by name (keeps the bridge to plain integers).
    fn stat(&self, name: String) -> u64 {
        let guard = self.shared.engine.lock();
        let Some(e) = guard.as_ref() else { return 0 };
        let s = e.stats();
        match name.as_str() {
            "activeRows" => s.active_rows as u64,
            "queuedRows" => s.queued_rows as u64,
            "prefillingRows" => s.prefilling_rows as u64,
            "kvBytesInUse" => s.kv_bytes_in_use,
            "kvBudgetBytes" => s.kv_budget_bytes.unwrap_or(0),
            "promptCacheBytes" => s.prompt_cache_bytes,
            "promptCacheEntries" => s.prompt_cache_entries as u64,
            "promptCacheHits" => s.prompt_cache_hits,
            "tokensGenerated" => s.tokens_generated,
            "decodeSteps" => s.decode_steps,
            "requestsFinished" => s.requests_finished,
            _ => 0,
        }
    }

    fn is_closed(&self) -> bool {
        self.shared.engine.lock().is_none()
    }

    /// Cancels outstanding requests (their streams end as cancelled), stops the engine thread
    /// and frees the model. Blocks until the engine thread has exited.
    fn close(&self) {
        let engine = self.shared.engine.lock().take();
        if let Some(e) = engine {
            e.shutdown();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Requests

enum Prompt {
    None,
    Text(String),
    Messages(Vec<ChatMessage>),
    Ids(Vec<u32>),
}

/// A request under construction: Swift sets fields one by one, then submits it.
pub struct RustRequest {
    prompt: Prompt,
    /// How many of prompt / messages / promptIds were given (exactly one is valid).
    inputs: u32,
    request: Request,
    problem: Option<String>,
}

fn new_request() -> RustRequest {
    RustRequest { prompt: Prompt::None, inputs: 0, request: Request::new(Input::Tokens(Vec::new())), problem: None }
}

impl RustRequest {
    fn reject(&mut self, message: String) {
        self.problem.get_or_insert(message);
    }

    fn finite(&mut self, name: &str, x: f64, ok: bool, rule: &str) -> Option<f32> {
        if x.is_finite() && ok {
            Some(x as f32)
        } else {
            self.reject(format!("{name} must be {rule}, got {x}"));
            None
        }
    }

    fn set_prompt(&mut self, text: String) {
        if text.is_empty() {
            self.reject("prompt must not be empty".into());
        }
        self.inputs += 1;
        self.prompt = Prompt::Text(text);
    }

    fn add_message(&mut self, role: String, content: String) {
        match &mut self.prompt {
            Prompt::Messages(m) => m.push(ChatMessage::new(role, content)),
            _ => {
                self.inputs += 1;
                self.prompt = Prompt::Messages(vec![ChatMessage::new(role, content)]);
            }
        }
    }

    fn add_prompt_id(&mut self, id: u32) {
        match &mut self.prompt {
            Prompt::Ids(ids) => ids.push(id),
            _ => {
                self.inputs += 1;
                self.prompt = Prompt::Ids(vec![id]);
            }
        }
    }

    fn set_max_tokens(&mut self, n: u64) {
        if n == 0 {
            self.reject("maxTokens must be at least 1".into());
        }
        self.request.max_tokens = n.min(usize::MAX as u64) as usize;
    }

    fn set_temperature(&mut self, x: f64) {
        if let Some(t) = self.finite("temperature", x, x >= 0.0, "a finite number >= 0") {
            self.request.sampling.temperature = t;
        }
    }

    fn set_top_p(&mut self, x: f64) {
        if let Some(p) = self.finite("topP", x, x > 0.0 && x <= 1.0, "a number in (0, 1]") {
            self.request.sampling.top_p = p;
        }
    }

    fn set_top_k(&mut self, k: u32) {
        self.request.sampling.top_k = k;
    }

    fn set_min_p(&mut self, x: f64) {
        if let Some(p) = self.finite("minP", x, (0.0..=1.0).contains(&x), "a number in [0, 1]") {
            self.request.sampling.min_p = p;
        }
    }

    fn set_repetition_penalty(&mut self, x: f64) {
        if let Some(p) = self.finite("repetitionPenalty", x, x > 0.0, "a finite number > 0") {
            self.request.sampling.repetition_penalty = Some(p);
        }
    }

    fn set_presence_penalty(&mut self, x: f64) {
        if let Some(p) = self.finite("presencePenalty", x, true, "a finite number") {
            self.request.sampling.presence_penalty = Some(p);
        }
    }

    fn set_frequency_penalty(&mut self, x: f64) {
        if let Some(p) = self.finite("frequencyPenalty", x, true, "a finite number") {
            self.request.sampling.frequency_penalty = Some(p);
        }
    }

    fn set_penalty_context(&mut self, n: u64) {
        if n == 0 {
            self.reject("penaltyContext must be at least 1".into());
        }
        self.request.sampling.penalty_context = n.min(usize::MAX as u64) as usize;
    }

    fn set_seed(&mut self, seed: u64) {
        self.request.sampling.seed = Some(seed);
    }

    fn add_logit_bias(&mut self, token_id: u32, bias: f64) {
        if bias.is_finite() || bias == f64::NEG_INFINITY {
            self.request.sampling.logit_bias.push((token_id, bias as f32));
        } else {
            self.reject(format!("logitBias[{token_id}] must be a finite number or -infinity, got {bias}"));
        }
    }

    fn add_stop(&mut self, text: String) {
        if text.is_empty() {
            self.reject("stop strings must not be empty".into());
        }
        self.request.stop.push(text);
    }

    fn set_ignore_eos(&mut self, on: bool) {
        self.request.ignore_eos = on;
    }

    /// The engine request, or the first problem found while it was built.
    fn build(&self) -> Result<Request, RustError> {
        if let Some(p) = &self.problem {
            return Err(RustError::arg(p.clone()));
        }
        let input = match (&self.prompt, self.inputs) {
            (_, n) if n > 1 => {
                return Err(RustError::arg(format!("pass exactly one of messages, prompt or promptIds (got {n})")))
            }
            (Prompt::None, _) => return Err(RustError::arg("pass messages, a prompt or promptIds")),
            (Prompt::Text(t), _) => Input::Prompt(t.clone()),
            (Prompt::Messages(m), _) => Input::Messages(m.clone()),
            (Prompt::Ids(ids), _) => Input::Tokens(ids.clone()),
        };
        let mut request = self.request.clone();
        request.input = input;
        Ok(request)
    }
}

// ---------------------------------------------------------------------------------------------
// Rows

struct RowFlag {
    cancelled: AtomicBool,
}

/// A submitted request: its id and the means to cancel it.
pub struct RustRow {
    id: u64,
    flag: Arc<RowFlag>,
    shared: Arc<Shared>,
}

impl RustRow {
    fn request_id(&self) -> u64 {
        self.id
    }

    /// Idempotent; finished rows ignore it.
    fn cancel(&self) {
        self.flag.cancelled.store(true, Ordering::Relaxed);
        self.shared.cancel(self.id);
    }
}

/// The Swift sink crosses to the engine thread. Its Swift class only appends to a thread-safe
/// stream buffer, so calling it from that thread is sound.
struct SendSink(EventSink);

unsafe impl Send for SendSink {}

/// The token id `on_token` gets for text that is not a token's: what was still held back when
/// the request ended (`RowState.token` in Generation.swift knows it).
const NO_TOKEN: u32 = u32::MAX;

/// The engine's sink: runs on the engine thread and never blocks on Swift.
fn deliver(sink: &SendSink, flag: &RowFlag, ev: &Event) -> bool {
    match ev {
        Event::Token { token_id, text, .. } => sink.0.on_token(*token_id, text.clone()),
        Event::Done { finish_reason, usage, text, .. } => {
            if !text.is_empty() {
                sink.0.on_token(NO_TOKEN, text.clone());
            }
            let reason = match finish_reason {
                FinishReason::Stop => 0,
                FinishReason::Length => 1,
                FinishReason::Cancelled => 2,
            };
            sink.0.on_done(
                reason,
                usage.prompt_tokens as u64,
                usage.completion_tokens as u64,
                usage.cached_tokens as u64,
            )
        }
        Event::Error { message } => sink.0.on_error("GENERATION_FAILED".into(), message.clone()),
    }
    !flag.cancelled.load(Ordering::Relaxed)
}
