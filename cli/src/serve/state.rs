//! What every handler shares (the engine, the served model's names, defaults, metrics) and the
//! bridge from the engine's per-request sink (called on the engine thread) to async handlers.
//!
//! A request's events cross into tokio through the engine's [`EventQueue`] (the one every face
//! drains): the sink never blocks the engine thread and wakes the response's task. A
//! [`RowGuard`] cancels the row when its handler or stream is dropped (client disconnect),
//! which also covers a request still queued or prefilling.
//!
//! Back-pressure is the queue's: a response that falls behind has its row paused (parked in
//! the engine while the rest of the batch goes on) until it catches up, so a client that stops
//! reading holds a bounded number of events, and only its own row waits.
//!
//! Tokenization, chat-template rendering and the engine's `submit` run on tokio's blocking
//! pool ([`AppState::blocking`]), never on the workers that serve connections.

use std::collections::{HashSet, VecDeque};
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use weft::engine::{Engine, Event, EventQueue, Next, Request, RequestId};
use weft::generate::FinishReason;
use weft::tokenizer::{ChatTemplate, Tokenizer};

use super::errors::{ApiError, ErrorKind};
use super::limits::{Limits, PromptBound};
use super::metrics::Metrics;
use super::security::{HostPolicy, OriginPolicy};

/// The served model's names and how strictly requests must name it.
#[derive(Debug, Clone)]
pub struct ServedModel {
    /// The short id `/v1/models` lists and responses carry.
    pub id: String,
    /// Other names for it (the `--model` argument, its file name, its absolute path,
    /// mlx_lm.server's `default_model`); with `strict`, the only other names accepted.
    pub aliases: Vec<String>,
    /// Where it was loaded from (absolute when it can be resolved).
    pub path: String,
    /// `--strict-model`: a request naming another model gets 404 (default: any name is
    /// accepted and the served id is echoed, as the official clients always send one).
    pub strict: bool,
}

/// Who may call: the API key, browser origins, `Host` names.
#[derive(Debug, Clone)]
pub struct Access {
    pub api_key: Option<String>,
    pub origins: OriginPolicy,
    pub hosts: HostPolicy,
}

/// Request defaults from the command line (mlx_lm.server's `--temp`, `--top-p`, ...).
#[derive(Debug, Clone)]
pub struct Defaults {
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: u32,
    pub min_p: f32,
    pub max_tokens: usize,
}

pub struct AppState {
    pub engine: Engine,
    /// The id `/v1/models` lists and responses carry (= `model.id`).
    pub model_id: String,
    pub model: ServedModel,
    pub defaults: Defaults,
    /// `--chat-template`, replacing the model's own: every chat request carries it to the
    /// engine, which renders with it (`Request::chat_template`).
    pub chat_template: Option<Arc<ChatTemplate>>,
    pub access: Access,
    pub limits: Limits,
    /// Stored Responses (`/v1/responses` with `store`), for `previous_response_id` and GET.
    pub responses: super::responses::Store,
    prompt_bound: PromptBound,
    pub metrics: Metrics,
    /// Unix seconds at startup (`created` in responses).
    pub created: u64,
    pub verbose: bool,
    pub shutting_down: AtomicBool,
    in_flight: Mutex<HashSet<RequestId>>,
    /// Seed for response ids.
    id_seed: u64,
    id_counter: std::sync::atomic::AtomicU64,
}

impl AppState {
    pub fn new(
        engine: Engine,
        model: ServedModel,
        defaults: Defaults,
        chat_template: Option<ChatTemplate>,
        access: Access,
        limits: Limits,
        responses: super::responses::Store,
        verbose: bool,
    ) -> Self {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        let id_seed = (now.as_nanos() as u64) ^ (u64::from(std::process::id()) << 32);
        let prompt_bound = PromptBound::new(engine.tokenizer(), engine.model_info().max_position_embeddings);
        AppState {
            engine,
            model_id: model.id.clone(),
            model,
            defaults,
            chat_template: chat_template.map(Arc::new),
            access,
            limits,
            responses,
            prompt_bound,
            metrics: Metrics::new(),
            created: now.as_secs(),
            verbose,
            shutting_down: AtomicBool::new(false),
            in_flight: Mutex::new(HashSet::new()),
            id_seed,
            id_counter: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// A fresh response id, `prefix` + 24 hex digits.
    pub fn new_id(&self, prefix: &str) -> String {
        let n = self.id_counter.fetch_add(1, Ordering::Relaxed);
        // splitmix64 of (seed, counter): unique per process, unpredictable enough for an id.
        let mut z = self.id_seed.wrapping_add(n.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        format!("{prefix}{z:016x}{:08x}", n as u32)
    }

    /// Accepts a request's `model` field: any string (the served id is echoed), or with
    /// `--strict-model` only the served id and its aliases.
    pub fn check_model(&self, model: Option<&serde_json::Value>) -> Result<(), ApiError> {
        match model {
            None | Some(serde_json::Value::Null) => Ok(()),
            Some(serde_json::Value::String(m)) if !self.model.strict || self.is_served_name(m) => Ok(()),
            Some(serde_json::Value::String(m)) => Err(self.unknown_model(m)),
            Some(_) => Err(ApiError::field("model", "`model` must be a string")),
        }
    }

    /// The served id or one of its aliases.
    pub fn is_served_name(&self, name: &str) -> bool {
        name == self.model.id || self.model.aliases.iter().any(|a| a == name)
    }

    pub fn unknown_model(&self, name: &str) -> ApiError {
        ApiError {
            param: Some("model".into()),
            ..ApiError::new(
                ErrorKind::NotFound,
                format!("The model `{name}` does not exist; this server serves `{}`", self.model.id),
            )
            .with_code("model_not_found")
        }
    }

    /// Rejects new work once a shutdown has begun.
    pub fn check_open(&self) -> Result<(), ApiError> {
        if self.shutting_down.load(Ordering::SeqCst) {
            return Err(ApiError::new(ErrorKind::Unavailable, "the server is shutting down"));
        }
        Ok(())
    }

    pub fn tokenizer(&self) -> Result<&Tokenizer, ApiError> {
        self.engine.tokenizer().ok_or_else(|| {
            ApiError::invalid("this model has no tokenizer: send the prompt as token ids to /v1/completions")
        })
    }

    /// Runs `f` on tokio's blocking pool (tokenizing, rendering templates, submitting), so
    /// the workers serving connections never wait on it.
    pub async fn blocking<T: Send + 'static>(
        self: &Arc<Self>,
        f: impl FnOnce(&Arc<AppState>) -> Result<T, ApiError> + Send + 'static,
    ) -> Result<T, ApiError> {
        let state = Arc::clone(self);
        tokio::task::spawn_blocking(move || f(&state))
            .await
            .unwrap_or_else(|e| Err(ApiError::new(ErrorKind::Internal, format!("request preparation failed: {e}"))))
    }

    /// Raw text, encoded as the tokenizer encodes a sequence (special tokens added per its config).
    /// Call through [`AppState::blocking`].
    pub fn tokenize_prompt(&self, text: &str) -> Result<Vec<u32>, ApiError> {
        let tokenizer = self.tokenizer()?;
        tokenizer.encode(text, true).map_err(ApiError::from_engine)
    }

    /// Refuses a prompt whose text (`bytes` long) cannot fit the context, before tokenizing it.
    pub fn check_prompt_bytes(&self, bytes: usize) -> Result<(), ApiError> {
        self.prompt_bound.check(bytes)
    }

    /// A token's text for logprobs (decoded alone; special tokens kept).
    pub fn token_text(&self, id: u32) -> String {
        match self.engine.tokenizer() {
            Some(t) => t.decode(&[id], false).unwrap_or_default(),
            None => String::new(),
        }
    }

    /// Cancels every generation still running (shutdown after the grace period).
    pub fn cancel_all(&self) -> usize {
        let ids: Vec<RequestId> = self.in_flight.lock().unwrap_or_else(|p| p.into_inner()).iter().copied().collect();
        for &id in &ids {
            self.engine.cancel(id);
        }
        ids.len()
    }

    pub fn in_flight_count(&self) -> usize {
        self.in_flight.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Submits `request` to the engine. Validation and admission errors come back here (4xx);
    /// events arrive through the returned [`Generation`]. `arrived` is when the HTTP request
    /// came in (the start of its time to first token).
    /// Call through [`AppState::blocking`] (the engine tokenizes stop strings and validates).
    pub fn start(self: &Arc<Self>, request: Request, arrived: Instant) -> Result<Generation, ApiError> {
        self.check_open()?;
        let waker = Arc::new(WakeSlot::default());
        let wake = Arc::clone(&waker);
        let (queue, mut queue_sink) = EventQueue::with_notify(move || wake.wake());
        let state = Arc::clone(self);
        let mut last_token: Option<Instant> = None;
        let sink = Box::new(move |ev: &Event| {
            let now = Instant::now();
            let m = &state.metrics;
            match ev {
                Event::Token { .. } => {
                    match last_token {
                        None => m.ttft.observe(now - arrived),
                        Some(t) => m.inter_token.observe(now - t),
                    }
                    last_token = Some(now);
                }
                Event::Done { finish_reason, usage, .. } => {
                    m.prompt_tokens.fetch_add(usage.prompt_tokens as u64, Ordering::Relaxed);
                    m.cached_prompt_tokens.fetch_add(usage.cached_tokens as u64, Ordering::Relaxed);
                    m.completion_tokens.fetch_add(usage.completion_tokens as u64, Ordering::Relaxed);
                    let counter = match finish_reason {
                        FinishReason::Stop => &m.finished_stop,
                        FinishReason::ToolCalls => &m.finished_tool_calls,
                        FinishReason::Length => &m.finished_length,
                        FinishReason::Cancelled => &m.finished_cancelled,
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                    m.request_duration.observe(now - arrived);
                }
                Event::Started { .. } => {}
                Event::Error { .. } => {
                    m.finished_error.fetch_add(1, Ordering::Relaxed);
                    m.request_duration.observe(now - arrived);
                }
            }
            queue_sink(ev)
        });
        // Kept to count a refused prompt: one over the context is reported with its length
        // (not for requests carrying more media than a body holds: local files, whose copy
        // would cost more than the exact count is worth; those keep the engine's message).
        let media: usize = request.images.iter().chain(&request.audio).map(Vec::len).sum();
        let refused = (self.engine.max_prompt_tokens().is_some() && media <= self.limits.body_bytes).then(|| request.clone());
        let id = self.engine.submit_with_flow(request, sink, queue.flow()).map_err(|e| self.refusal(e, refused))?;
        self.in_flight.lock().unwrap_or_else(|p| p.into_inner()).insert(id);
        self.metrics.in_flight.fetch_add(1, Ordering::Relaxed);
        Ok(Generation { queue, waker, guard: RowGuard { state: Arc::clone(self), id, finished: false } })
    }

    /// The error for a request the engine refused: a prompt longer than the context is an
    /// overflow carrying its token count (counted as the engine would prefill it), so each
    /// protocol can say so in its clients' words.
    fn refusal(&self, e: weft::Error, request: Option<Request>) -> ApiError {
        let (Some(request), Some(maximum)) = (request, self.engine.max_prompt_tokens()) else {
            return ApiError::from_engine(e);
        };
        if e.code() != weft::ErrorCode::InvalidArgument {
            return ApiError::from_engine(e);
        }
        match self.engine.count_prompt_tokens(request) {
            Ok(tokens) if tokens > maximum => ApiError::overflow(tokens, maximum, e.message()),
            _ => ApiError::from_engine(e),
        }
    }
}

/// The waker of the task reading a [`Generation`], woken by the queue's producer.
#[derive(Default)]
struct WakeSlot(Mutex<Option<Waker>>);

impl WakeSlot {
    fn set(&self, w: &Waker) {
        let mut slot = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if !slot.as_ref().is_some_and(|old| old.will_wake(w)) {
            *slot = Some(w.clone());
        }
    }

    fn wake(&self) {
        let w = self.0.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(w) = w {
            w.wake();
        }
    }
}

/// Cancels its row when dropped before the row's final event (the client went away).
struct RowGuard {
    state: Arc<AppState>,
    id: RequestId,
    finished: bool,
}

impl Drop for RowGuard {
    fn drop(&mut self) {
        let s = &self.state;
        if !self.finished {
            s.engine.cancel(self.id);
            if !s.shutting_down.load(Ordering::SeqCst) {
                s.metrics.disconnects.fetch_add(1, Ordering::Relaxed);
            }
            if s.verbose {
                eprintln!("weft serve: request {} cancelled (client gone)", self.id);
            }
        }
        let now_idle = {
            let mut in_flight = s.in_flight.lock().unwrap_or_else(|p| p.into_inner());
            in_flight.remove(&self.id);
            in_flight.is_empty()
        };
        s.metrics.in_flight.fetch_sub(1, Ordering::Relaxed);
        if now_idle {
            release_heap_when_settled(Arc::clone(s));
        }
    }
}

/// The engine returns its memory when it goes idle, but connection buffers are freed after
/// that, on the HTTP threads: once no request has run for a second, return the heap's free
/// pages too (so an idle server's RSS comes back to what it holds).
fn release_heap_when_settled(state: Arc<AppState>) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
    runtime.spawn(async move {
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        if state.in_flight_count() == 0 {
            let _ = tokio::task::spawn_blocking(weft::engine::release_free_heap).await;
        }
    });
}

/// One request's events, in order: tokens, then exactly one `Done` or `Error`.
pub struct Generation {
    queue: EventQueue,
    waker: Arc<WakeSlot>,
    guard: RowGuard,
}

impl Generation {
    /// The next event; `None` after the final one (or if the engine went away without one).
    pub async fn next(&mut self) -> Option<Event> {
        std::future::poll_fn(|cx| self.poll_next(cx)).await
    }

    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Event>> {
        if self.guard.finished {
            return Poll::Ready(None);
        }
        // Registered before looking, so an event queued in between wakes this task.
        self.waker.set(cx.waker());
        match self.queue.try_next() {
            Next::Event(ev) => {
                if ev.is_final() {
                    self.guard.finished = true;
                }
                Poll::Ready(Some(ev))
            }
            Next::Empty => Poll::Pending,
            // The engine dropped the sink without a final event (it is gone): nothing to cancel.
            Next::Closed => {
                self.guard.finished = true;
                Poll::Ready(None)
            }
        }
    }
}

/// Turns a generation's events into a protocol's server-sent events.
pub trait StreamEncoder: Send + 'static {
    /// Frames sent before any event (OpenAI's role chunk, Anthropic's `message_start`).
    fn start(&mut self) -> String;
    /// Frames for one event.
    fn event(&mut self, ev: &Event) -> String;
    /// Frames for one event of generation `index`, when a response streams several (OpenAI's
    /// `n` choices); one generation's encoder takes them as [`StreamEncoder::event`].
    fn event_at(&mut self, _index: usize, ev: &Event) -> String {
        self.event(ev)
    }
    /// Frames when the engine went away without a final event.
    fn lost(&mut self) -> String;
    /// Frames after every generation's final event (OpenAI's `[DONE]` for `n` choices).
    fn finish(&mut self) -> String {
        String::new()
    }
}

/// The SSE response body: the encoder's frames as events arrive, several events coalesced into
/// one write when they are ready together. Dropped by hyper when the client disconnects, which
/// drops the [`Generation`]s and so cancels their rows.
pub struct EventStream<E: StreamEncoder> {
    /// The generations still running (`None` once one has had its final event).
    generations: Vec<Option<Generation>>,
    encoder: E,
    pending: VecDeque<Bytes>,
    done: bool,
}

impl<E: StreamEncoder> EventStream<E> {
    pub fn new(generation: Generation, encoder: E) -> Self {
        Self::many(vec![generation], encoder)
    }

    /// One stream of several generations (each event goes to the encoder with its index).
    pub fn many(generations: Vec<Generation>, mut encoder: E) -> Self {
        let mut pending = VecDeque::new();
        let first = encoder.start();
        if !first.is_empty() {
            pending.push_back(Bytes::from(first));
        }
        EventStream { generations: generations.into_iter().map(Some).collect(), encoder, pending, done: false }
    }
}

impl<E: StreamEncoder + Unpin> futures_core::Stream for EventStream<E> {
    type Item = Result<Bytes, Infallible>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        let mut out = String::new();
        for (i, slot) in this.generations.iter_mut().enumerate() {
            while let Some(generation) = slot.as_mut() {
                match generation.poll_next(cx) {
                    Poll::Ready(Some(ev)) => {
                        out.push_str(&this.encoder.event_at(i, &ev));
                        if ev.is_final() {
                            *slot = None;
                        }
                    }
                    Poll::Ready(None) => {
                        out.push_str(&this.encoder.lost());
                        *slot = None;
                    }
                    Poll::Pending => break,
                }
            }
        }
        if !this.done && this.generations.iter().all(Option::is_none) {
            out.push_str(&this.encoder.finish());
            this.done = true;
        }
        if !out.is_empty() {
            this.pending.push_back(Bytes::from(out));
        }
        match this.pending.pop_front() {
            Some(b) => Poll::Ready(Some(Ok(b))),
            None if this.done => Poll::Ready(None),
            None => Poll::Pending,
        }
    }
}

/// `data: <json>\n\n`
pub fn sse_data(v: &serde_json::Value) -> String {
    format!("data: {v}\n\n")
}

/// `event: <name>\ndata: <json>\n\n`
pub fn sse_event(name: &str, v: &serde_json::Value) -> String {
    format!("event: {name}\ndata: {v}\n\n")
}

/// Synthetic engine events for the protocols' encoder tests.
#[cfg(test)]
pub mod test_events {
    use weft::engine::{Event, Usage};
    use weft::generate::FinishReason;
    use weft::tools::ToolDelta;

    /// A token releasing `reasoning` and `text` (and tool-call pieces).
    pub fn token(reasoning: &str, text: &str, calls: Vec<ToolDelta>) -> Event {
        Event::Token { token_id: 1, text: text.into(), reasoning: reasoning.into(), logprobs: None, tool_calls: calls }
    }

    /// The end of a row that released nothing more.
    pub fn done(finish_reason: FinishReason, usage: Usage) -> Event {
        Event::Done {
            finish_reason,
            stop: None,
            text: String::new(),
            reasoning: String::new(),
            usage,
            first_logits: vec![],
            tool_deltas: vec![],
            tool_calls: vec![],
        }
    }
}
