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
mod cache_io;
mod config;
mod constrained;
mod core;
mod count;
mod driver;
mod events;
mod executor;
mod faults;
mod lockstep;
mod media;
mod memory;
mod prepare;
mod prompt_cache;
mod prompt_cache_file;
mod queue;
mod request;
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
pub use media::{PreparedAudio, PreparedImage};
pub use memory::{prompt_cache_capacity, release_free_heap, use_single_heap_arena, MemoryPolicy, PROMPT_CACHE_AUTO};
pub use cache_io::SavedEntryInfo;
pub use prompt_cache::PromptCache;
pub use prompt_cache_file::{entry_file, load_entry, save_entry, CacheIdentity, SavedEntry};
pub use queue::{EventQueue, FlowQueue, Next, PAUSE_AT, RESUME_AT};
pub use scheduler::Scheduler;
pub use config::{EngineConfig, EngineStats};
pub(crate) use config::lockstep_prompt_cache;
pub use prepare::{CheckedRequest, Preparer, Submission};
use prepare::{check_prompt, Limits};
pub use request::{check_top_logprobs, Event, Input, Request, RequestId, RowFlow, Sink, StopCause, TokenLogprobs, Usage};

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::Mutex;

pub use crate::constrain::Constraint;
pub use crate::stop::FinishReason;
use crate::loading::LoadedModel;
use crate::models::ModelInfo;
use crate::tokenizer::Tokenizer;
use crate::{Error, Result};
use driver::{drive, Command, Health};

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
    preparer: Preparer,
    next_id: AtomicU64,
}

impl Front {
    fn check(&self, request: Request) -> Result<CheckedRequest> {
        self.health.check()?;
        self.preparer.check(request)
    }

    fn submit(&self, checked: CheckedRequest, sink: Sink, flow: Option<RowFlow>) -> Result<RequestId> {
        self.health.check()?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut sub = self.preparer.prepare(id, checked, sink)?;
        if let Some(flow) = &flow {
            flow.wake_through(self.tx.clone());
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
        Engine::start_with(model, config, false, drive::<EngineCore>)
    }

    /// [`Engine::start`] with `driver` as the driver thread's body (one rank process or a
    /// group of them: [`lockstep`]).
    fn start_with(
        model: LoadedModel,
        config: EngineConfig,
        lockstep: bool,
        driver: impl FnOnce(EngineCore, Arc<Mutex<Receiver<Command>>>, Arc<Mutex<EngineStats>>, Arc<Health>) + Send + 'static,
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
        let rx = Arc::new(Mutex::new(rx));
        let core_config = config.clone();
        let drafter = speculative::Drafter::from_config(&config, &model)?;
        let preparer = Preparer::new(&model, config);
        let preparer = if lockstep { preparer.for_lockstep() } else { preparer };
        let (shared_stats, shared_health) = (Arc::clone(&stats), Arc::clone(&health));
        let driver = std::thread::Builder::new()
            .name("weft-engine".into())
            .spawn(move || driver(EngineCore::new(model, core_config).with_drafter(drafter), rx, shared_stats, shared_health))
            .map_err(|e| Error::Mlx(format!("cannot start the engine thread: {e}")))?;
        let front = Front { tx, health, preparer, next_id: AtomicU64::new(1) };
        Ok(Engine { front: Arc::new(front), stats, driver: Some(driver) })
    }

    pub fn tokenizer(&self) -> Option<&Tokenizer> {
        self.front.preparer.tokenizer()
    }

    pub fn model_info(&self) -> &ModelInfo {
        self.front.preparer.model_info()
    }

    /// The model's image contract (`None`: a text-only model).
    pub fn vision(&self) -> Option<&crate::vision::ImageSpec> {
        self.front.preparer.vision()
    }

    /// The model's audio contract (`None`: a model without an audio tower).
    pub fn audio(&self) -> Option<&crate::audio::AudioSpec> {
        self.front.preparer.audio()
    }

    pub fn config(&self) -> &EngineConfig {
        self.front.preparer.config()
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

    /// The checks of [`Engine::submit`] that need no tokenization ([`Preparer::check`]); the
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
