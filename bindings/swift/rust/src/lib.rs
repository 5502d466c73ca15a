//! The Rust half of the `Weft` Swift package: a thin swift-bridge layer over
//! `weft::engine::Engine`. The idiomatic Swift API (async streams, `WeftError`, `Sendable`) lives
//! in `../Sources/Weft`; this file only moves strings, numbers and opaque handles.
//!
//! The bridge surface is deliberately small (see ARCHITECTURE.md, "Bindings": swift-bridge
//! 0.1.59 miscompiles richer signatures): owned `String`s, integers, floats, opaque Rust types,
//! `Result<Opaque, Opaque>`, and one opaque Swift type, `EventSink`, whose methods the engine
//! calls with a request's events. Engine options and requests cross as one JSON string each
//! (camelCase keys, built by the Swift side) and are parsed by the core's request contract
//! (`weft::contract`), so Swift validates exactly as C and Node do.
//!
//! Threading: the engine's driver thread calls each request's sink. The sink never waits on
//! Swift: `EventSink` appends to the request's own buffer (an `AsyncThrowingStream`), so a slow
//! consumer only delays itself. Cancellation reaches the engine's `cancel`, and the sink answers
//! `false` from then on so the row is evicted at its next token even if the command is late.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use weft::contract::{self, Spelling};
use weft::engine::{Event, Request, RowFlow};
use weft::generate::FinishReason;
use weft::tools::ToolDelta;

#[swift_bridge::bridge]
mod ffi {
    extern "Rust" {
        #[swift_bridge(Sendable)]
        type RustEngine;
        #[swift_bridge(Sendable)]
        type RustRow;
        #[swift_bridge(Sendable)]
        type RustError;
        /// What a prompt-cache save wrote or a load read.
        type RustCacheEntry;
        fn tokens(self: &RustCacheEntry) -> u64;
        fn bytes(self: &RustCacheEntry) -> u64;

        fn load_engine(options_json: String) -> Result<RustEngine, RustError>;
        // The same, reporting a model download to the sink (which can cancel it).
        fn load_engine_reporting(options_json: String, sink: ProgressSink) -> Result<RustEngine, RustError>;
        // The engine's flow-control watermarks (weft::engine::PAUSE_AT / RESUME_AT): unread
        // chunks at which a row is paused, and at which it resumes. (No doc comments in the
        // bridge: swift-bridge's parser refuses them.)
        fn flow_pause_at() -> u64;
        fn flow_resume_at() -> u64;

        fn model_path(self: &RustEngine) -> String;
        fn model_type(self: &RustEngine) -> String;
        fn vocab_size(self: &RustEngine) -> u32;
        fn num_layers(self: &RustEngine) -> u32;
        fn context_length(self: &RustEngine) -> u64;
        fn has_tokenizer(self: &RustEngine) -> bool;
        fn has_vision(self: &RustEngine) -> bool;
        fn has_audio(self: &RustEngine) -> bool;
        fn submit(self: &RustEngine, request_json: String, sink: EventSink) -> Result<RustRow, RustError>;
        fn stat(self: &RustEngine, name: String) -> u64;
        fn save_prompt_cache(self: &RustEngine, path: String, request_json: String) -> Result<RustCacheEntry, RustError>;
        fn load_prompt_cache(self: &RustEngine, path: String) -> Result<RustCacheEntry, RustError>;
        fn is_closed(self: &RustEngine) -> bool;
        fn close(self: &RustEngine);

        fn request_id(self: &RustRow) -> u64;
        fn cancel(self: &RustRow);
        fn pause(self: &RustRow);
        fn resume(self: &RustRow);

        fn code(self: &RustError) -> String;
        fn message(self: &RustError) -> String;
    }

    extern "Swift" {
        type EventSink;
        // logprob: NaN unless the request asked for logprobs; its top alternatives come first,
        // one on_top_logprob call each, best first.
        fn on_top_logprob(&self, token_id: u32, logprob: f64);
        fn on_token(&self, token_id: u32, text: String, logprob: f64);
        // Pieces of tool calls come before the on_token they belong to: a call's start (index,
        // id, name), then fragments of its arguments' JSON text.
        fn on_tool_start(&self, index: u32, id: String, name: String);
        fn on_tool_arguments(&self, index: u32, fragment: String);
        // Reasoning text (a model that thinks first) that belongs to the next on_token.
        fn on_reasoning(&self, text: String);
        // The complete calls, one call each, right before on_done.
        fn on_tool_call(&self, id: String, name: String, arguments: String);
        // finish_reason: 0 stop, 1 length, 2 cancelled, 3 tool calls. (No doc comments in this
        // module: they panic swift-bridge 0.1.59's build script.)
        fn on_done(
            &self,
            finish_reason: u8,
            prompt_tokens: u64,
            completion_tokens: u64,
            cached_tokens: u64,
            reasoning_tokens: u64,
        );
        fn on_error(&self, code: String, message: String);
    }

    extern "Swift" {
        type ProgressSink;
        // phase: 0 waiting, 1 downloading, 2 verifying, 3 extracting, 4 done; total 0 when
        // unknown. Called on the loading thread; returning true cancels the download.
        fn on_progress(&self, phase: u8, downloaded: u64, total: u64) -> bool;
    }
}

use ffi::{EventSink, ProgressSink};

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
    has_vision: bool,
    has_audio: bool,
}

/// A JSON document from the Swift side (which builds it; malformed text is a bug there, still
/// reported as an invalid argument).
fn parse_json(text: &str) -> Result<serde_json::Value, RustError> {
    serde_json::from_str(text).map_err(|e| RustError::arg(format!("malformed JSON from the Swift side: {e}")))
}

/// `options_json`: the engine options, camelCase (`weft::contract::parse_engine_options`).
fn flow_pause_at() -> u64 {
    weft::engine::PAUSE_AT as u64
}

fn flow_resume_at() -> u64 {
    weft::engine::RESUME_AT as u64
}

fn load_engine(options_json: String) -> Result<RustEngine, RustError> {
    load(options_json, &mut |_| {}, &AtomicBool::new(false))
}

fn load_engine_reporting(options_json: String, sink: ProgressSink) -> Result<RustEngine, RustError> {
    use weft::model_store::Phase;
    let cancel = AtomicBool::new(false);
    let mut report = |p: weft::model_store::Progress| {
        if cancel.load(Ordering::SeqCst) {
            return;
        }
        let phase = match p.phase {
            Phase::Waiting => 0,
            Phase::Downloading => 1,
            Phase::Verifying => 2,
            Phase::Extracting => 3,
            Phase::Done => 4,
        };
        if sink.on_progress(phase, p.downloaded, p.total.unwrap_or(0)) {
            cancel.store(true, Ordering::SeqCst);
        }
    };
    load(options_json, &mut report, &cancel)
}

/// Loads the model the options name (a Hugging Face repo id is fetched into the shared cache,
/// reported to `progress`, stopped by `cancel`) and starts its engine.
fn load(
    options_json: String,
    progress: &mut dyn FnMut(weft::model_store::Progress),
    cancel: &AtomicBool,
) -> Result<RustEngine, RustError> {
    let options = contract::parse_engine_options(&parse_json(&options_json)?, Spelling::Camel)?;
    // Options left unset come from the environment (WEFT_CPU_KERNELS, ...): the one documented
    // place, EngineOptions::load_options / engine_config.
    let config = options.engine_config()?;
    let load_options = options.load_options()?;
    let fetched = options.model_path(progress, cancel);
    if cancel.load(Ordering::SeqCst) {
        let why = fetched.err().map(|e| format!(": {e}")).unwrap_or_default();
        return Err(RustError::new("CANCELLED", format!("the model download was cancelled{why}")));
    }
    let path = fetched.map_err(RustError::loading)?;
    let loaded = weft::loading::load_with(&path, &load_options).map_err(RustError::loading)?;
    let engine = weft::engine::Engine::start(loaded, config)?;
    let info = engine.model_info().clone();
    let has_tokenizer = engine.tokenizer().is_some();
    let (has_vision, has_audio) = (engine.vision().is_some(), engine.audio().is_some());
    Ok(RustEngine {
        shared: Arc::new(Shared { engine: Mutex::new(Some(engine)) }),
        path: path.display().to_string(),
        model_type: info.model_type.clone(),
        vocab_size: info.vocab_size.max(0) as u32,
        num_layers: info.num_layers as u32,
        context_length: info.max_position_embeddings.unwrap_or(0) as u64,
        has_tokenizer,
        has_vision,
        has_audio,
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

    fn has_vision(&self) -> bool {
        self.has_vision
    }

    fn has_audio(&self) -> bool {
        self.has_audio
    }

    /// `request_json`: the request, camelCase (`weft::contract::parse_request`).
    fn submit(&self, request_json: String, sink: EventSink) -> Result<RustRow, RustError> {
        // Local media paths are read as the engine's `localMedia` option allows.
        let local = self.shared.engine.lock().as_ref().ok_or_else(RustError::closed)?.config().local_media.clone();
        let request: Request = contract::parse_request_with(&parse_json(&request_json)?, Spelling::Camel, &local)?;
        let row = Arc::new(RowFlag { cancelled: AtomicBool::new(false) });
        let flag = Arc::clone(&row);
        let sink = SendSink(sink);
        let flow = RowFlow::new();
        let id = {
            let guard = self.shared.engine.lock();
            let engine = guard.as_ref().ok_or_else(RustError::closed)?;
            let sink = Box::new(move |ev: &Event| deliver(&sink, &flag, ev));
            engine.submit_with_flow(request, sink, flow.clone())?
        };
        Ok(RustRow { id, flag: row, flow, shared: Arc::clone(&self.shared) })
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
            "pausedRows" => s.paused_rows as u64,
            "kvBytesInUse" => s.kv_bytes_in_use,
            "kvBudgetBytes" => s.kv_budget_bytes.unwrap_or(0),
            "promptCacheBytes" => s.prompt_cache_bytes,
            "promptCacheEntries" => s.prompt_cache_entries as u64,
            "promptCacheHits" => s.prompt_cache_hits,
            "promptCacheCachedTokens" => s.prompt_cache_cached_tokens,
            "promptCacheCapacityBytes" => s.prompt_cache_capacity_bytes,
            "promptCacheEvictions" => s.prompt_cache_evictions,
            "promptCacheFilesRefused" => s.prompt_cache_files_refused.len() as u64,
            "tokensGenerated" => s.tokens_generated,
            "decodeSteps" => s.decode_steps,
            "requestsFinished" => s.requests_finished,
            "speculativeSteps" => s.speculative_steps,
            "draftTokens" => s.draft_tokens,
            "draftTokensAccepted" => s.draft_tokens_accepted,
            _ => 0,
        }
    }

    fn is_closed(&self) -> bool {
        self.shared.engine.lock().is_none()
    }

    /// Saves one prompt-cache entry to `path`: with `request_json` empty the most recently used
    /// entry, else the cached prefix a request with that input would reuse. Runs without the
    /// engine lock (the engine writes it between two steps).
    fn save_prompt_cache(&self, path: String, request_json: String) -> Result<RustCacheEntry, RustError> {
        let (submitter, local) = {
            let guard = self.shared.engine.lock();
            let e = guard.as_ref().ok_or_else(RustError::closed)?;
            (e.submitter(), e.config().local_media.clone())
        };
        let prompt = match request_json.is_empty() {
            true => None,
            false => Some(contract::parse_request_with(&parse_json(&request_json)?, Spelling::Camel, &local)?),
        };
        match submitter.save_prompt_cache_entry(prompt, std::path::Path::new(&path))? {
            Some(info) => Ok(RustCacheEntry(info)),
            None => Err(RustError::new("NOT_FOUND", "the prompt cache holds no entry to save (for this prompt)")),
        }
    }

    /// Loads an entry `save_prompt_cache` wrote into the prompt cache.
    fn load_prompt_cache(&self, path: String) -> Result<RustCacheEntry, RustError> {
        let submitter = self.shared.engine.lock().as_ref().ok_or_else(RustError::closed)?.submitter();
        let path = std::path::Path::new(&path);
        if !path.is_file() {
            return Err(RustError::new("NOT_FOUND", format!("no file {}", path.display())));
        }
        Ok(RustCacheEntry(submitter.load_prompt_cache_entry(path)?))
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

pub struct RustCacheEntry(weft::engine::SavedEntryInfo);

impl RustCacheEntry {
    fn tokens(&self) -> u64 {
        self.0.tokens as u64
    }

    fn bytes(&self) -> u64 {
        self.0.bytes
    }
}

// ---------------------------------------------------------------------------------------------
// Rows

struct RowFlag {
    cancelled: AtomicBool,
}

/// A submitted request: its id and the means to cancel, pause and resume it.
pub struct RustRow {
    id: u64,
    flag: Arc<RowFlag>,
    /// Back-pressure: Swift pauses the row while its consumer lags (Generation.swift).
    flow: RowFlow,
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

    /// The engine stops decoding this row (it leaves the batch, keeping its KV) until resumed;
    /// other rows go on.
    fn pause(&self) {
        self.flow.pause();
    }

    fn resume(&self) {
        self.flow.resume();
    }
}

/// The Swift sink crosses to the engine thread. Its Swift class only appends to a thread-safe
/// stream buffer, so calling it from that thread is sound.
struct SendSink(EventSink);

unsafe impl Send for SendSink {}

/// The token id `on_token` gets for text that is not a token's: what was still held back when
/// the request ended (`RowState.token` in Generation.swift knows it).
const NO_TOKEN: u32 = u32::MAX;

/// Hands tool-call pieces to Swift (they belong to the next `on_token`).
fn send_deltas(sink: &SendSink, deltas: &[ToolDelta]) {
    for d in deltas {
        match d {
            ToolDelta::Start { index, id, name } => sink.0.on_tool_start(*index as u32, id.clone(), name.clone()),
            ToolDelta::Arguments { index, fragment } => sink.0.on_tool_arguments(*index as u32, fragment.clone()),
        }
    }
}

/// The engine's sink: runs on the engine thread and never blocks on Swift.
fn deliver(sink: &SendSink, flag: &RowFlag, ev: &Event) -> bool {
    match ev {
        Event::Token { token_id, text, reasoning, logprobs, tool_calls } => {
            send_deltas(sink, tool_calls);
            if !reasoning.is_empty() {
                sink.0.on_reasoning(reasoning.clone());
            }
            let logprob = match logprobs {
                Some(lp) => {
                    for &(t, l) in &lp.top {
                        sink.0.on_top_logprob(t, l as f64);
                    }
                    lp.logprob as f64
                }
                None => f64::NAN,
            };
            sink.0.on_token(*token_id, text.clone(), logprob)
        }
        Event::Done { finish_reason, usage, text, reasoning, tool_deltas, tool_calls, .. } => {
            send_deltas(sink, tool_deltas);
            if !reasoning.is_empty() {
                sink.0.on_reasoning(reasoning.clone());
            }
            if !text.is_empty() || !tool_deltas.is_empty() || !reasoning.is_empty() {
                sink.0.on_token(NO_TOKEN, text.clone(), f64::NAN);
            }
            for c in tool_calls {
                sink.0.on_tool_call(c.id.clone(), c.name.clone(), c.arguments.clone());
            }
            let reason = match finish_reason {
                FinishReason::ToolCalls => 3,
                FinishReason::Stop => 0,
                FinishReason::Length => 1,
                FinishReason::Cancelled => 2,
            };
            sink.0.on_done(
                reason,
                usage.prompt_tokens as u64,
                usage.completion_tokens as u64,
                usage.cached_tokens as u64,
                usage.reasoning_tokens as u64,
            )
        }
        Event::Started { .. } => {}
        Event::Error { message } => sink.0.on_error("GENERATION_FAILED".into(), message.clone()),
    }
    !flag.cancelled.load(Ordering::Relaxed)
}
