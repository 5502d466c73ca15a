//! The engine across ranks (tensor or pipeline parallel, docs/distributed.md): every rank holds
//! an [`EngineCore`] over its shard and all of them run the same iterations in lockstep.
//!
//! Rank 0 (the leader) takes requests; before each iteration it broadcasts a *step plan*: the
//! requests admitted since the last one (prompt ids, sampling parameters with a concrete seed,
//! stop strings, limits), the cancellations, and the step kind (iterate, idle heartbeat,
//! shutdown). Every rank applies the plan to its core in the same order and iterates, so the
//! scheduler makes the same admissions, prefill chunks, joins and evictions everywhere, which
//! the sharded `all_sum`s need. The engine is deterministic given those inputs: logits are
//! identical on every rank after the last `all_sum` (the head is replicated), greedy argmax and
//! the seeded Gumbel-max draws pick the same tokens, so stop ids, stop strings and `max_tokens`
//! end the same rows. That is why ranks sample themselves instead of receiving rank 0's
//! tokens: it needs no change to the pipelined executor and no extra exchange per step.
//!
//! Each exchange also carries every rank's state digest (steps, tokens, finished rows, row
//! counts), so a rank that diverged is a clear error on all ranks instead of garbage or a hang,
//! and its MLX memory (active, peak, buffer cache; the first exchange also its device name),
//! so rank 0 reports every rank in its stats ([`RankStats`]) without a collective of its own.
//! Only rank 0's sinks see events; a consumer that goes away is cancelled through the next
//! plan (not by the executor mid-step), and flow-control pauses are not used across ranks.
//!
//! Failure: a rank that exits closes its sockets and MLX's ring backend fails the collective,
//! which fails every outstanding request. A rank that stops answering blocks the collective,
//! which MLX cannot interrupt: a watchdog fails every outstanding request after
//! [`LockstepOptions::rank_timeout`], marks the engine failed and abandons the driver thread.

use crate::reasoning::ReasoningPlan;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use mlx_rs::Array;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use super::{events, Command, Engine, EngineConfig, EngineCore, EngineStats, Event, EventSink, Health, Input, Request};
use super::{RequestId, Sink, Submission};
use super::driver::{drive, Halt, Stepper};
use crate::constrain::Constraint;
use crate::distributed::Group;
use crate::loading::LoadedModel;
use crate::sampling::SamplingParams;
use crate::tools::Tools;
use crate::{Error, Result};

/// Timeouts of a rank group.
#[derive(Debug, Clone, Copy)]
pub struct LockstepOptions {
    /// Longest one step (plan exchange + iteration) may take before the group counts as
    /// failed; a follower gives up when no plan came for this long. Longer than the slowest
    /// prefill chunk.
    pub rank_timeout: Duration,
    /// Longest the first exchange may take (every rank loading its shard).
    pub startup_timeout: Duration,
}

impl Default for LockstepOptions {
    fn default() -> Self {
        LockstepOptions { rank_timeout: Duration::from_secs(60), startup_timeout: Duration::from_secs(600) }
    }
}

impl LockstepOptions {
    /// How often an idle leader proves the group alive (a step plan with nothing to do).
    fn heartbeat(&self) -> Duration {
        (self.rank_timeout / 4).clamp(Duration::from_millis(20), Duration::from_secs(1))
    }
}

/// What a request needs on a follower: the rank 0 prompt ids and everything that decides its
/// tokens and its end.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct WireRequest {
    id: RequestId,
    prompt: Vec<u32>,
    max_tokens: usize,
    sampling: SamplingParams,
    stop: Vec<String>,
    ignore_eos: bool,
    stop_token_ids: Vec<u32>,
    capture_first_logits: usize,
    logprobs: Option<usize>,
    /// The row's grammar (its own or its tools'): every rank compiles it and runs the same
    /// matcher over the same tokens, so the masks, and the tokens they allow, agree.
    constraint: Option<Constraint>,
    /// What decides where a row with tools ends (its call parser and call limit); the specs
    /// only matter to rank 0's faces and are left out.
    tools: Option<Tools>,
    /// The row's reasoning: it gates the grammar and forces the block's end, so every rank must
    /// track it alike.
    reasoning: Option<ReasoningPlan>,
    /// The request's speculative draft length (drafts come from its tokens, alike on every rank).
    #[serde(default)]
    num_draft_tokens: Option<usize>,
}

#[derive(Debug, Serialize, Deserialize)]
enum Op {
    Admit(WireRequest),
    Cancel(RequestId),
}

/// What every rank does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Step {
    /// Apply the plan, then one [`EngineCore::iterate`].
    Iterate,
    /// Apply the plan only (an idle heartbeat, or the first exchange).
    Idle,
    /// Cancel everything and stop.
    Shutdown,
}

#[derive(Debug, Serialize, Deserialize)]
struct Plan {
    ops: Vec<Op>,
    step: Step,
    /// The leader's engine settings, in the first plan: followers must run the same.
    settings: Option<String>,
}

/// Values per rank in the exchange's header: the rank's state digest, then its memory.
/// The digest: decode steps, tokens generated, requests finished, active, prefilling and
/// queued rows, each as two 32-bit halves.
const DIGEST: usize = 12;
type Digest = [i32; DIGEST];
/// MLX's active, peak and cache bytes, each as two 32-bit halves.
const MEMORY: usize = 6;
const SLOT: usize = DIGEST + MEMORY;
/// The first exchange also carries each rank's device name, this many bytes (4 per value).
const NAME_BYTES: usize = 64;

/// One rank's device and MLX memory, as of the last step plan exchange (rank 0's
/// [`EngineStats::ranks`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RankStats {
    pub rank: usize,
    /// The rank's MLX device: `cpu` or `gpu`, then MLX's device name when it has one
    /// (`gpu: NVIDIA H200`), cut to 64 bytes.
    pub device: String,
    pub mlx_active_bytes: u64,
    pub mlx_peak_bytes: u64,
    pub mlx_cache_bytes: u64,
}

/// An [`EngineCore`] in a rank group: the leader records what its caller does and broadcasts
/// it as the next step plan; a follower applies the plans it receives.
pub struct LockstepCore {
    core: EngineCore,
    group: Group,
    /// Exchanges done (the plan number both sides expect).
    seq: u64,
    /// Leader: what the next plan carries, in the order the caller did it.
    pending: Vec<(Op, Option<Submission>)>,
    /// Every rank's device and memory from the last exchange.
    ranks: Vec<RankStats>,
}

impl LockstepCore {
    pub fn new(mut core: EngineCore, group: Group) -> Self {
        core.for_lockstep();
        let ranks = (0..group.size()).map(|rank| RankStats { rank, ..RankStats::default() }).collect();
        LockstepCore { core, group, seq: 0, pending: Vec::new(), ranks }
    }

    pub fn core(&self) -> &EngineCore {
        &self.core
    }

    /// Every rank's device and MLX memory, as of the last exchange.
    pub fn rank_stats(&self) -> &[RankStats] {
        &self.ranks
    }

    /// This core's stats with every rank's device and memory ([`EngineStats::ranks`]).
    pub fn stats(&self) -> EngineStats {
        EngineStats { ranks: self.ranks.clone(), ..self.core.stats() }
    }

    /// Nothing to compute and nothing waiting for the next plan.
    pub fn is_idle(&self) -> bool {
        self.pending.is_empty() && self.core.is_idle()
    }

    pub fn group(&self) -> &Group {
        &self.group
    }

    /// Leader: queues `sub` for the next plan. A request the ranks cannot reproduce (images,
    /// audio; `Engine::submit` refuses them already) gets an `Error` event at once and never
    /// reaches them.
    pub fn enqueue(&mut self, mut sub: Submission) {
        match wire(&mut sub) {
            Ok(w) => self.pending.push((Op::Admit(w), Some(sub))),
            Err(e) => sub.sink.close(Event::Error { message: e.to_string() }),
        }
    }

    /// Leader: cancels `id` with the next plan.
    pub fn cancel(&mut self, id: RequestId) {
        self.pending.push((Op::Cancel(id), None));
    }

    /// Leader: broadcasts the pending plan with `step`, then runs it here.
    pub fn step(&mut self, step: Step) -> Result<()> {
        if self.group.rank() != 0 {
            return Err(Error::InvalidRequest("only rank 0 leads a rank group".into()));
        }
        let pending = std::mem::take(&mut self.pending);
        let (ops, subs): (Vec<Op>, Vec<Option<Submission>>) = pending.into_iter().unzip();
        let settings = (self.seq == 0).then(|| settings(&self.core));
        let plan = Plan { ops, step, settings };
        let bytes = serde_json::to_vec(&plan).map_err(|e| Error::Mlx(format!("encoding the step plan: {e}")))?;
        self.exchange(Some(&bytes))?;
        for (op, sub) in plan.ops.into_iter().zip(subs) {
            match (op, sub) {
                (Op::Admit(_), Some(sub)) => self.core.enqueue(sub),
                (Op::Cancel(id), _) => self.core.cancel(id),
                (Op::Admit(_), None) => unreachable!("an admission holds its submission"),
            }
        }
        self.run(step);
        Ok(())
    }

    /// Follower: receives the next plan, applies it (new rows' events go to `sinks`) and runs
    /// its step. Returns the step kind.
    pub fn follow_step(&mut self, sinks: &mut FollowerSinks) -> Result<Step> {
        let bytes = self.exchange(None)?;
        let plan: Plan =
            serde_json::from_slice(&bytes).map_err(|e| Error::EngineFailed(format!("a step plan from rank 0 is unreadable: {e}")))?;
        if let Some(theirs) = &plan.settings {
            let ours = settings(&self.core);
            if *theirs != ours {
                return Err(Error::InvalidRequest(format!(
                    "rank {} runs other engine settings or another model than rank 0 (rank 0: {theirs}; here: {ours})",
                    self.group.rank()
                )));
            }
        }
        for op in plan.ops {
            match op {
                Op::Admit(w) => {
                    let sink = sinks(w.id);
                    let sub = submission(w, sink, self.core.tokenizer(), self.core.constraints())?;
                    self.core.enqueue(sub);
                }
                Op::Cancel(id) => self.core.cancel(id),
            }
        }
        self.run(plan.step);
        Ok(plan.step)
    }

    fn run(&mut self, step: Step) {
        match step {
            Step::Iterate => {
                self.core.iterate();
                self.core.after_step();
            }
            Step::Idle => self.core.on_idle(),
            Step::Shutdown => self.core.cancel_all(),
        }
    }

    /// One exchange: a header `all_sum` (rank 0's plan number and payload length; in its own
    /// slot every rank's state digest and memory, in the first exchange its device name too;
    /// zeros elsewhere), then the payload as a `uint8` `all_sum` with zeros on the followers
    /// (MLX has no broadcast; a sum with one non-zero contribution is one). Returns the payload.
    fn exchange(&mut self, payload: Option<&[u8]>) -> Result<Vec<u8>> {
        let (rank, size) = (self.group.rank(), self.group.size());
        let first = self.seq == 0;
        let names = if first { size * NAME_BYTES / 4 } else { 0 };
        let mut header = vec![0i32; 2 + size * SLOT + names];
        if let Some(p) = payload {
            header[0] = self.seq as i32;
            header[1] = i32::try_from(p.len()).map_err(|_| Error::Mlx("a step plan over 2 GiB".into()))?;
        }
        let slot = 2 + rank * SLOT;
        header[slot..slot + DIGEST].copy_from_slice(&digest(&self.core));
        header[slot + DIGEST..slot + SLOT].copy_from_slice(&memory());
        if first {
            let at = 2 + size * SLOT + rank * NAME_BYTES / 4;
            header[at..at + NAME_BYTES / 4].copy_from_slice(&name_words(&crate::distributed::device_name()));
        }
        let h = self.group.all_sum(&Array::from_slice(&header, &[header.len() as i32]))?;
        h.eval()?;
        let h: Vec<i32> = h.as_slice::<i32>().to_vec();
        if h[0] != self.seq as i32 {
            return Err(Error::EngineFailed(format!(
                "rank {rank} expected step plan {} but rank 0 sent plan {}",
                self.seq as i32, h[0]
            )));
        }
        let lead = &h[2..2 + DIGEST];
        for r in 1..size {
            let theirs = &h[2 + r * SLOT..2 + r * SLOT + DIGEST];
            if theirs != lead {
                return Err(Error::EngineFailed(format!(
                    "rank {r}'s engine state diverged from rank 0's before step plan {} (decode steps, tokens, \
                     finished, active, prefilling and queued rows: {:?} vs {:?})",
                    self.seq,
                    wholes(theirs),
                    wholes(lead)
                )));
            }
        }
        for (r, stats) in self.ranks.iter_mut().enumerate() {
            let m = &h[2 + r * SLOT + DIGEST..2 + (r + 1) * SLOT];
            let bytes = wholes(m);
            (stats.mlx_active_bytes, stats.mlx_peak_bytes, stats.mlx_cache_bytes) = (bytes[0], bytes[1], bytes[2]);
            if first {
                let at = 2 + size * SLOT + r * NAME_BYTES / 4;
                stats.device = words_name(&h[at..at + NAME_BYTES / 4]);
            }
        }
        let n = h[1].max(0) as usize;
        let bytes = match payload {
            Some(p) => p.to_vec(),
            None => vec![0u8; n],
        };
        let p = self.group.all_sum(&Array::from_slice(&bytes, &[n as i32]))?;
        p.eval()?;
        self.seq += 1;
        Ok(p.as_slice::<u8>().to_vec())
    }
}

/// This process's MLX memory (active, peak, cache), each as low and high 32 bits (an
/// `all_sum` with zeros from the other ranks leaves the bits as they are).
fn memory() -> [i32; MEMORY] {
    let (active, cache) = super::memory::mlx_memory();
    let peak = mlx_rs::memory::peak_memory().unwrap_or(0) as u64;
    halves([active, peak, cache])
}

/// The values [`halves`] wrote.
fn wholes(words: &[i32]) -> Vec<u64> {
    words.chunks(2).map(|p| (p[0] as u32 as u64) | ((p[1] as u32 as u64) << 32)).collect()
}

/// Each value as its low and high 32 bits, in order.
fn halves<const N: usize, const W: usize>(values: [u64; N]) -> [i32; W] {
    let mut out = [0i32; W];
    for (i, v) in values.into_iter().enumerate() {
        out[2 * i] = v as u32 as i32;
        out[2 * i + 1] = (v >> 32) as u32 as i32;
    }
    out
}

/// `name`'s first [`NAME_BYTES`] bytes (cut at a character boundary), zero-padded, as values.
fn name_words(name: &str) -> [i32; NAME_BYTES / 4] {
    let mut end = name.len().min(NAME_BYTES);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    let mut bytes = [0u8; NAME_BYTES];
    bytes[..end].copy_from_slice(&name.as_bytes()[..end]);
    let mut out = [0i32; NAME_BYTES / 4];
    for (w, c) in out.iter_mut().zip(bytes.chunks(4)) {
        *w = i32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    }
    out
}

fn words_name(words: &[i32]) -> String {
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).take_while(|&b| b != 0).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The state every rank must share after the same plans, every count at full width.
fn digest(core: &EngineCore) -> Digest {
    let s = core.stats();
    let rows = [s.active_rows, s.prefilling_rows, s.queued_rows].map(|n| n as u64);
    halves([s.decode_steps, s.tokens_generated, s.requests_finished as u64, rows[0], rows[1], rows[2]])
}

/// The settings that decide scheduling and the model's shape: equal on every rank or the
/// ranks would diverge. The layer count is left out unless a byte budget depends on it: a
/// pipeline stage holds its own share of the layers (uneven when the ranks do not divide
/// them), but then its rows' KV bytes differ too, and so would a KV budget's admissions or the
/// prompt cache's evictions.
fn settings(core: &EngineCore) -> String {
    let c = core.config();
    let i = core.model_info();
    let layers = if c.kv_budget_bytes.is_some() || c.prompt_cache_bytes > 0 {
        format!(" layers {} (a KV budget or prompt cache needs equal layer counts on every rank)", i.num_layers)
    } else {
        String::new()
    };
    format!(
        "max_batch {} prompt_concurrency {} prefill_step_size {} kv_budget {:?} prompt_cache {} kv_bits {:?} \
         kv_group {} quantized_kv_start {} num_draft_tokens {}; model vocab {} kv_heads {} head_dim {}{layers}",
        c.max_batch,
        c.prompt_concurrency,
        c.prefill_step_size,
        c.kv_budget_bytes,
        c.prompt_cache_bytes,
        c.kv_bits,
        c.kv_group_size,
        c.quantized_kv_start,
        c.num_draft_tokens,
        i.vocab_size,
        i.kv_heads,
        i.head_dim
    )
}

/// What the ranks cannot reproduce yet: refused at submit (`InvalidRequest`, naming it).
pub(super) fn check_request(r: &Request) -> Result<()> {
    let refuse = |what: &str| Err(Error::InvalidRequest(format!("{what} across ranks (distributed serving) is not supported yet")));
    if !r.images.is_empty() {
        return refuse("image input");
    }
    if !r.audio.is_empty() {
        return refuse("audio input");
    }
    Ok(())
}

/// The part of `sub` the followers need; a sampled request without a seed gets one, so every
/// rank draws the same tokens.
fn wire(sub: &mut Submission) -> Result<WireRequest> {
    check_request(&sub.request)?;
    if !sub.images.is_empty() || !sub.audio.is_empty() {
        return Err(Error::InvalidRequest("images or audio across ranks are not supported yet".into()));
    }
    if sub.constraint.is_some() != sub.request.constraint.is_some() {
        return Err(Error::InvalidRequest("a compiled constraint without its grammar cannot run across ranks".into()));
    }
    if sub.request.sampling.temperature > 0.0 && sub.request.sampling.seed.is_none() {
        sub.request.sampling.seed = Some(rand::random());
    }
    let r = &sub.request;
    Ok(WireRequest {
        id: sub.id,
        prompt: sub.prompt.clone(),
        max_tokens: r.max_tokens,
        sampling: r.sampling.clone(),
        stop: r.stop.clone(),
        ignore_eos: r.ignore_eos,
        stop_token_ids: sub.stop_token_ids.clone(),
        capture_first_logits: r.capture_first_logits,
        logprobs: r.logprobs,
        constraint: r.constraint.clone(),
        tools: r.tools.as_ref().map(|t| Tools { specs: Vec::new(), ..t.clone() }),
        reasoning: sub.reasoning,
        num_draft_tokens: r.num_draft_tokens,
    })
}

/// A follower's row for `w`; its grammar is compiled here, with this rank's tokenizer (the
/// same model's, so the same token trie).
fn submission(
    w: WireRequest,
    sink: Sink,
    tokenizer: Option<&crate::tokenizer::Tokenizer>,
    constraints: &crate::constrain::ConstraintFactoryCell,
) -> Result<Submission> {
    let mut request = Request::new(Input::Tokens(w.prompt.clone()));
    request.max_tokens = w.max_tokens;
    request.sampling = w.sampling;
    request.stop = w.stop;
    request.ignore_eos = w.ignore_eos;
    request.capture_first_logits = w.capture_first_logits;
    request.logprobs = w.logprobs;
    request.num_draft_tokens = w.num_draft_tokens;
    request.tools = w.tools;
    request.constraint = w.constraint;
    let constraint = match &request.constraint {
        Some(c) => {
            let tokenizer = tokenizer.ok_or_else(|| {
                Error::EngineFailed("rank 0 sent a constrained row but this rank's model has no tokenizer".into())
            })?;
            Some(constraints.compile(c, tokenizer).map_err(|e| {
                Error::EngineFailed(format!("this rank cannot compile rank 0's {} constraint: {e}", c.field()))
            })?)
        }
        None => None,
    };
    Ok(Submission {
        id: w.id,
        prompt: w.prompt,
        request,
        stop_token_ids: w.stop_token_ids,
        sink: EventSink::new(sink),
        flow: None,
        constraint,
        images: Vec::new(),
        audio: Vec::new(),
        reasoning: w.reasoning,
        rendered: None,
        checkpoints: Vec::new(),
    })
}

/// Where a follower's rows send their events (by request id); a server's followers drop them.
pub type FollowerSinks = Box<dyn FnMut(RequestId) -> Sink + Send>;

/// A follower rank (rank > 0): builds its core over `model` (its shard), applies rank 0's step
/// plans until rank 0 shuts the group down (`Ok`) or fails: rank 0 gone (MLX's error), no plan
/// within `rank_timeout` (the first within `startup_timeout`), a diverged state or other
/// settings than rank 0's. `config` must equal rank 0's.
pub fn follow(model: LoadedModel, config: EngineConfig, group: Group, opts: LockstepOptions, sinks: Option<FollowerSinks>) -> Result<()> {
    if group.rank() == 0 {
        return Err(Error::InvalidRequest("rank 0 leads (Engine::start_distributed); follow is for the other ranks".into()));
    }
    let config = prepared_config(&model, config)?;
    let mut sinks = sinks.unwrap_or_else(|| Box::new(|_| Box::new(|_: &Event| true)));
    // When the last plan was applied, and how many were.
    let progress = Arc::new(Mutex::new((Instant::now(), 0u64)));
    let (done_tx, done_rx) = mpsc::channel();
    let seen = Arc::clone(&progress);
    std::thread::Builder::new()
        .name("weft-follower".into())
        .spawn(move || {
            let mut ls = LockstepCore::new(EngineCore::new(model, config), group);
            let result = loop {
                match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| ls.follow_step(&mut sinks))) {
                    Ok(Ok(Step::Shutdown)) => break Ok(()),
                    Ok(Ok(_)) => {
                        let mut p = seen.lock();
                        *p = (Instant::now(), p.1 + 1);
                    }
                    Ok(Err(e)) => break Err(e),
                    Err(p) => break Err(Error::EngineFailed(format!("internal error: {}", events::panic_message(p.as_ref())))),
                }
            };
            if result.is_err() {
                std::mem::forget(ls); // its MLX state may be mid-collective
            }
            let _ = done_tx.send(result);
        })
        .map_err(|e| Error::Mlx(format!("cannot start the follower thread: {e}")))?;
    loop {
        match done_rx.recv_timeout(Duration::from_millis(50)) {
            Ok(result) => return result,
            Err(RecvTimeoutError::Disconnected) => return Err(Error::EngineFailed("the follower thread ended".into())),
            Err(RecvTimeoutError::Timeout) => {}
        }
        let (since, plans) = *progress.lock();
        let limit = if plans == 0 { opts.startup_timeout } else { opts.rank_timeout };
        if since.elapsed() > limit {
            return Err(Error::EngineFailed(format!(
                "rank 0 sent no step plan for {:.1} s (it died or hangs)",
                since.elapsed().as_secs_f64()
            )));
        }
    }
}

/// [`Engine::start`]'s checks and setup of `config`, for a core built here.
fn prepared_config(model: &LoadedModel, config: EngineConfig) -> Result<EngineConfig> {
    let config = super::lockstep_prompt_cache(config, true);
    config.validate_for(model.model.info())?;
    if let (Some(_), Some(why)) = (config.kv_quantization(), model.model.kv_quantization_unsupported()) {
        return Err(Error::Unsupported(why));
    }
    config.memory.apply()?;
    Ok(config)
}

impl Engine {
    /// Starts the engine on rank 0 of `group` (every other rank runs [`follow`] with the same
    /// config): the faces submit here as to any engine; steps run in lockstep on every rank.
    /// Returns once every rank answered the first exchange (within `startup_timeout`).
    pub fn start_distributed(model: LoadedModel, config: EngineConfig, group: Group, opts: LockstepOptions) -> Result<Engine> {
        if group.rank() != 0 {
            return Err(Error::InvalidRequest("only rank 0 runs the engine; the other ranks run engine::follow".into()));
        }
        let (ready_tx, ready_rx) = mpsc::channel();
        let engine = Engine::start_with(model, config, true, move |core, rx, stats, health| {
            lead(LockstepCore::new(core, group), rx, stats, health, opts, ready_tx)
        })?;
        loop {
            match ready_rx.recv_timeout(Duration::from_millis(50)) {
                Ok(Ok(())) => return Ok(engine),
                Ok(Err(why)) => return Err(Error::EngineFailed(why)),
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(engine.health().err().unwrap_or(Error::EngineFailed("the rank group did not start".into())))
                }
                Err(RecvTimeoutError::Timeout) => {
                    if let Err(e) = engine.health() {
                        return Err(e);
                    }
                }
            }
        }
    }
}

/// What the leader's driver shares with its watchdog.
struct Shared {
    health: Arc<Health>,
    stats: Arc<Mutex<EngineStats>>,
    /// Rank 0's sinks of every request not finished yet (the watchdog fails them).
    outstanding: Mutex<HashMap<RequestId, Arc<Mutex<EventSink>>>>,
    /// Requests whose consumer went away: cancelled with the next plan.
    gone: Mutex<Vec<RequestId>>,
    rx: Arc<Mutex<Receiver<Command>>>,
    /// When the step in progress started, and how long it may take.
    armed: Mutex<Option<(Instant, Duration)>>,
    fired: Mutex<Option<String>>,
    done: AtomicBool,
}

impl Shared {
    fn arm(&self, limit: Duration) {
        *self.armed.lock() = Some((Instant::now(), limit));
    }

    fn disarm(&self) {
        *self.armed.lock() = None;
    }

    /// Fails every outstanding request and marks the engine failed.
    fn fail(&self, why: &str) {
        self.health.mark_dead(why.to_string());
        let sinks: Vec<_> = self.outstanding.lock().drain().map(|(_, s)| s).collect();
        for s in sinks {
            s.lock().close(Event::Error { message: why.to_string() });
        }
        self.fail_queued(why);
        self.stats.lock().active_rows = 0;
    }

    /// Submissions still in the channel (sent before the handle saw the failure).
    fn fail_queued(&self, why: &str) {
        for cmd in self.rx.lock().try_iter() {
            if let Command::Submit(mut sub) = cmd {
                sub.sink.close(Event::Error { message: why.to_string() });
            }
        }
    }

    /// Gives rank 0's sink of `sub` to the outstanding set; the row gets a sink that forwards
    /// to it, never cancels mid-step (a consumer gone is cancelled through the next plan, so
    /// every rank evicts it at the same step) and stays quiet once the watchdog failed it.
    fn track(self: &Arc<Self>, sub: &mut Submission) {
        let id = sub.id;
        let slot = Arc::new(Mutex::new(std::mem::replace(&mut sub.sink, EventSink::new(Box::new(|_: &Event| true)))));
        self.outstanding.lock().insert(id, Arc::clone(&slot));
        let shared: Weak<Shared> = Arc::downgrade(self);
        let mut told = false;
        let forward = move |ev: &Event| {
            let gone = {
                let mut sink = slot.lock();
                if ev.is_final() {
                    sink.close(ev.clone());
                    false
                } else {
                    !sink.is_closed() && !sink.token(ev)
                }
            };
            if let Some(shared) = shared.upgrade() {
                if ev.is_final() {
                    shared.outstanding.lock().remove(&id);
                } else if gone && !told {
                    told = true;
                    shared.gone.lock().push(id);
                }
            }
            true
        };
        let mut placeholder = std::mem::replace(&mut sub.sink, EventSink::new(Box::new(forward)));
        placeholder.discard();
    }
}

/// The leader's driver thread: the first exchange (every rank loaded and runs the same
/// settings), then the driver loop ([`drive`]) over a [`Leader`], which sends every step to
/// the group first, beats while idle, and runs each step under the watchdog.
fn lead(
    mut ls: LockstepCore,
    rx: Arc<Mutex<Receiver<Command>>>,
    stats: Arc<Mutex<EngineStats>>,
    health: Arc<Health>,
    opts: LockstepOptions,
    ready: mpsc::Sender<std::result::Result<(), String>>,
) {
    let size = ls.group().size();
    let shared = Arc::new(Shared {
        health: Arc::clone(&health),
        stats: Arc::clone(&stats),
        outstanding: Mutex::new(HashMap::new()),
        gone: Mutex::new(Vec::new()),
        rx: Arc::clone(&rx),
        armed: Mutex::new(None),
        fired: Mutex::new(None),
        done: AtomicBool::new(false),
    });
    let dog = Arc::clone(&shared);
    let _ = std::thread::Builder::new().name("weft-rank-watchdog".into()).spawn(move || watch(dog, size));

    // The first exchange: every rank has loaded its shard and runs the same settings.
    shared.arm(opts.startup_timeout);
    let first = run_step(&mut ls, Step::Idle);
    shared.disarm();
    if shared.fired.lock().is_some() {
        return std::mem::forget(ls);
    }
    if let Err(why) = first {
        let why = format!("the rank group did not start: {why}");
        let _ = ready.send(Err(why.clone()));
        shared.fail(&why);
        shared.done.store(true, Ordering::SeqCst);
        return std::mem::forget(ls);
    }
    let _ = ready.send(Ok(()));
    drive(Leader { ls, shared, opts }, rx, stats, health);
}

/// Rank 0 under the driver loop: what it admits and cancels goes to the group with the next
/// step plan.
struct Leader {
    ls: LockstepCore,
    shared: Arc<Shared>,
    opts: LockstepOptions,
}

impl Stepper for Leader {
    fn is_idle(&self) -> bool {
        self.ls.core().is_idle() && self.shared.gone.lock().is_empty()
    }

    /// An idle leader proves the group alive with a plan that has nothing to do.
    fn idle_wait(&self) -> Option<Duration> {
        Some(self.opts.heartbeat())
    }

    /// Memory is returned in the idle step, on every rank alike.
    fn on_wait(&mut self) {}

    fn admit(&mut self, mut sub: Submission) {
        sub.flow = None; // a paused row would leave the batch on rank 0 only
        self.shared.track(&mut sub);
        self.ls.enqueue(sub);
    }

    fn cancel(&mut self, id: RequestId) {
        self.ls.cancel(id);
    }

    /// Refused before sending ([`super::cache_io`]): the ranks' caches must stay alike. The
    /// task dropped unrun ends its caller's wait.
    fn run_task(&mut self, _task: super::cache_io::CoreTask) {}

    fn step(&mut self, step: Step) -> std::result::Result<(), Halt> {
        // Consumers gone since the last step are cancelled with this plan, on every rank.
        for id in std::mem::take(&mut *self.shared.gone.lock()) {
            self.ls.cancel(id);
        }
        self.shared.arm(self.opts.rank_timeout);
        let result = run_step(&mut self.ls, step);
        self.shared.disarm();
        if self.shared.fired.lock().is_some() {
            return Err(Halt); // the watchdog failed everything meanwhile
        }
        if let Err(why) = result {
            self.shared.fail(&format!("the rank group failed: {why}"));
            self.shared.done.store(true, Ordering::SeqCst);
            return Err(Halt);
        }
        Ok(())
    }

    fn stats(&self) -> EngineStats {
        self.ls.stats()
    }

    fn fail_all(&mut self, why: &str) {
        self.shared.fail(why);
    }
}

/// The driver ended (shutdown, or a panic outside a step): the watchdog stops.
impl Drop for Leader {
    fn drop(&mut self) {
        self.shared.done.store(true, Ordering::SeqCst);
    }
}

/// One leader step; a panic inside it is a failure of the group (the ranks may now differ).
fn run_step(ls: &mut LockstepCore, step: Step) -> std::result::Result<(), String> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| ls.step(step))) {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(p) => Err(format!("internal error: {}", events::panic_message(p.as_ref()))),
    }
}

/// The leader's watchdog: a step past its deadline fails every outstanding request, marks the
/// engine failed and abandons the driver thread (blocked in a collective MLX cannot cancel);
/// afterwards it keeps failing submissions that raced the failure.
fn watch(shared: Arc<Shared>, size: usize) {
    loop {
        std::thread::sleep(Duration::from_millis(20));
        if shared.done.load(Ordering::SeqCst) {
            return;
        }
        let fired = shared.fired.lock().clone();
        match fired {
            Some(why) => shared.fail_queued(&why),
            None => {
                let late = shared.armed.lock().filter(|(since, limit)| since.elapsed() > *limit);
                if let Some((_, limit)) = late {
                    let why = format!(
                        "a rank of the group of {size} stopped answering: no step finished within {:.1} s",
                        limit.as_secs_f64()
                    );
                    *shared.fired.lock() = Some(why.clone());
                    shared.health.abandoned.store(true, Ordering::SeqCst);
                    shared.fail(&why);
                }
            }
        }
    }
}
