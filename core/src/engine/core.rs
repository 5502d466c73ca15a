//! The engine's single-threaded loop body: admission (policy) then execution.

use super::executor::Executor;
use crate::constrain::ConstraintFactoryCell;
use super::faults::Faults;
use super::memory::{mlx_memory, release_cached_memory};
use super::scheduler::{projected_kv_bytes_for, Load, Scheduler};
use super::prompt_cache_file::{entry_file, is_entry_file, load_entry, save_entry, CacheIdentity};
use super::{EngineConfig, EngineStats, Event, RequestId, SavedEntryInfo, Submission};
use crate::{Error, Result};
use std::path::{Path, PathBuf};
use crate::stop::FinishReason;
use crate::loading::LoadedModel;

pub struct EngineCore {
    scheduler: Scheduler,
    executor: Executor,
    /// The model's grammar compiler (built on a follower's first constrained row).
    constraints: ConstraintFactoryCell,
    /// Faults still to fire (tests of the final-event guarantee).
    faults: Faults,
    /// The decode step after which MLX's buffer cache was last returned (periodic release).
    released_at_step: u64,
    /// The work done when the engine last went idle (see [`EngineCore::work_mark`]).
    idle_mark: Option<(u64, u64, u64)>,
    /// Where the prompt cache is saved at shutdown, for which model; the files it was loaded
    /// from, and those it refused (with why).
    persist: Option<(PathBuf, CacheIdentity)>,
    /// What the prompt cache and the rows' KV share ([`super::memory::prompt_cache_capacity`]).
    prompt_cache_ceiling: Option<u64>,
    loaded_files: Vec<PathBuf>,
    refused_files: Vec<String>,
    /// The model's source and numerics and the KV quantization, which name the entries it
    /// saves ([`CacheIdentity::of`]).
    identity_of: (PathBuf, String, Option<crate::cache::KvQuantization>),
}

impl EngineCore {
    pub fn new(model: LoadedModel, config: EngineConfig) -> Self {
        // Faults can be injected only in builds with the `faults` feature (tests).
        #[cfg(feature = "faults")]
        let faults = config.faults;
        #[cfg(not(feature = "faults"))]
        let faults = Faults::default();
        let constraints = model.constraints;
        let (prompt_cache_bytes, prompt_cache_ceiling) = super::memory::prompt_cache_capacity(&config);
        let kv = config.kv_quantization();
        let persist = config
            .prompt_cache_dir
            .clone()
            .map(|dir| (dir, CacheIdentity::of(&model.source, &model.numerics).with_kv_quantization(kv.as_ref())));
        let identity_of = (model.source.clone(), model.numerics.clone(), kv);
        let executor = Executor::new(model.model, model.tokenizer, config.prefill_step_size, prompt_cache_bytes)
            .with_kv_quantization(config.kv_quantization())
            .with_decode_mode(config.decode)
            .with_speculation(config.num_draft_tokens)
            .with_faults(faults);
        let mut core = EngineCore {
            scheduler: Scheduler::new(config),
            executor,
            constraints,
            faults,
            released_at_step: 0,
            idle_mark: None,
            persist,
            prompt_cache_ceiling,
            loaded_files: Vec::new(),
            refused_files: Vec::new(),
            identity_of,
        };
        core.load_prompt_cache();
        core
    }

    /// Drafts with `drafter` (a draft model) instead of prompt lookup.
    pub fn with_drafter(mut self, drafter: Option<super::speculative::Drafter>) -> Self {
        self.executor.set_drafter(drafter);
        self
    }

    /// Settings every rank of a lockstep group applies alike ([`super::lockstep_prompt_cache`]):
    /// a prompt cache sized from each rank's own memory is off, and no rank reads cache files.
    pub(crate) fn for_lockstep(&mut self) {
        let config = self.scheduler.config_mut();
        if config.prompt_cache_bytes == super::PROMPT_CACHE_AUTO {
            config.prompt_cache_bytes = 0;
            self.executor.disable_prompt_cache();
            self.prompt_cache_ceiling = None;
        }
        config.prompt_cache_dir = None;
        if self.persist.take().is_some() {
            // What this rank alone read from files goes.
            self.executor.prompt_cache = super::PromptCache::new(self.executor.prompt_cache.capacity());
            self.loaded_files.clear();
            self.refused_files.clear();
        }
    }

    /// Fills the prompt cache from its directory's files (entries of this model only).
    fn load_prompt_cache(&mut self) {
        let Some((dir, id)) = &self.persist else { return };
        if !self.executor.prompt_cache.enabled() {
            return;
        }
        let mut files: Vec<PathBuf> = match std::fs::read_dir(dir) {
            Ok(d) => d.flatten().map(|e| e.path()).filter(|p| is_entry_file(p)).collect(),
            Err(e) => {
                self.refused_files.push(format!("prompt-cache directory {}: {e}", dir.display()));
                return;
            }
        };
        files.sort();
        for f in files {
            match load_entry(&f, id) {
                Ok((tokens, caches)) => {
                    self.executor.prompt_cache.insert(tokens, caches);
                    self.loaded_files.push(f);
                }
                Err(e) => self.refused_files.push(e.to_string()),
            }
        }
    }

    /// Writes the prompt cache's entries to its directory and removes the files of entries it loaded and since evicted.
    pub fn save_prompt_cache(&mut self) {
        let Some((dir, id)) = &self.persist else { return };
        if std::fs::create_dir_all(dir).is_err() {
            return;
        }
        let mut kept = Vec::new();
        for (tokens, caches) in self.executor.prompt_cache.entries() {
            let file = entry_file(dir, tokens);
            if save_entry(&file, tokens, caches, id).is_ok() {
                kept.push(file);
            }
        }
        for f in &self.loaded_files {
            // Only files the cache named itself go: one saved under a caller's name stays.
            if !kept.contains(f) && auto_named(f) {
                let _ = std::fs::remove_file(f);
            }
        }
        self.loaded_files = kept;
    }

    fn identity(&self) -> CacheIdentity {
        match &self.persist {
            Some((_, id)) => id.clone(),
            None => CacheIdentity::of(&self.identity_of.0, &self.identity_of.1).with_kv_quantization(self.identity_of.2.as_ref()),
        }
    }

    fn cache_on(&self) -> Result<()> {
        if self.executor.prompt_cache.enabled() {
            return Ok(());
        }
        Err(Error::Unsupported("the prompt cache is off (prompt_cache_bytes is 0)".into()))
    }

    /// Writes the entry a request with `prompt` would reuse (the most recently used entry
    /// without one) to `path`; `None` when the cache holds nothing for it.
    pub(super) fn save_cache_entry(&mut self, prompt: Option<&[u32]>, path: &Path) -> Result<Option<SavedEntryInfo>> {
        self.cache_on()?;
        let Some((tokens, caches)) = self.executor.prompt_cache.entry_for(prompt) else { return Ok(None) };
        save_entry(path, &tokens, &caches, &self.identity())?;
        let bytes = std::fs::metadata(path).map_err(|e| Error::io(path, e))?.len();
        Ok(Some(SavedEntryInfo { tokens: tokens.len(), bytes }))
    }

    /// Reads an entry [`EngineCore::save_cache_entry`] wrote (refusing another model's, a
    /// truncated or a corrupt file) into the prompt cache, under its capacity.
    pub(super) fn load_cache_entry(&mut self, path: &Path) -> Result<SavedEntryInfo> {
        self.cache_on()?;
        let (tokens, caches) = load_entry(path, &self.identity())?;
        let bytes = std::fs::metadata(path).map_err(|e| Error::io(path, e))?.len();
        let held: u64 = caches.iter().map(|c| c.nbytes() as u64).sum();
        let n = tokens.len();
        if !self.executor.prompt_cache.insert(tokens, caches) {
            return Err(Error::Capacity(format!(
                "the entry in {} needs {held} bytes; the prompt cache holds at most {}",
                path.display(),
                self.executor.prompt_cache.capacity()
            )));
        }
        Ok(SavedEntryInfo { tokens: n, bytes })
    }

    pub fn config(&self) -> &EngineConfig {
        self.scheduler.config()
    }

    pub fn model_info(&self) -> &crate::models::ModelInfo {
        self.executor.model().info()
    }

    /// The model's tokenizer (a follower rank compiles rank 0's grammars with it).
    pub(crate) fn tokenizer(&self) -> Option<&crate::tokenizer::Tokenizer> {
        self.executor.tokenizer()
    }

    /// The grammar compiler of [`EngineCore::tokenizer`].
    pub(crate) fn constraints(&self) -> &ConstraintFactoryCell {
        &self.constraints
    }

    pub fn enqueue(&mut self, sub: Submission) {
        self.scheduler.push(sub);
    }

    /// Nothing to compute: no row prefilling, decoding or ready to leave its parking, and no
    /// queued request that could start. (Parked rows and a queue they block may remain.)
    pub fn is_idle(&self) -> bool {
        self.executor.prefilling() == 0
            && self.executor.decoding() == 0
            && !self.executor.has_resumable()
            && !self.scheduler.head_fits(self.executor.model().info(), &self.load())
    }

    fn load(&self) -> Load {
        Load {
            decoding: self.executor.decoding() + self.executor.parked(),
            prefilling: self.executor.prefilling(),
            // The rows' projections, or what their caches really hold if that is more (left
            // padding in the batch, recurrent state, growth beyond a projection).
            projected_kv_bytes: self.executor.projected_kv_bytes().max(self.executor.kv_bytes_in_use()),
        }
    }

    /// Decode steps run so far.
    pub fn decode_steps(&self) -> u64 {
        self.executor.decode_steps
    }

    pub fn cancel(&mut self, id: RequestId) {
        if let Some(sub) = self.scheduler.remove(id) {
            self.cancel_queued(sub);
            return;
        }
        self.executor.cancel(id);
    }

    /// A request cancelled before it was admitted: `Done(cancelled)`, nothing generated.
    fn cancel_queued(&mut self, mut sub: Submission) {
        let usage = super::Usage { prompt_tokens: sub.prompt.len(), ..Default::default() };
        sub.sink.close(Event::Done {
            finish_reason: FinishReason::Cancelled,
            stop: None,
            text: String::new(),
            reasoning: String::new(),
            usage,
            first_logits: Vec::new(),
            tool_deltas: Vec::new(),
            tool_calls: Vec::new(),
        });
        self.executor.finished += 1;
    }

    pub fn cancel_all(&mut self) {
        let queued: Vec<Submission> = self.scheduler.drain().collect();
        for sub in queued {
            self.cancel_queued(sub);
        }
        self.executor.cancel_all();
    }

    /// Fails every admitted request (prefilling or decoding) with `message`; queued requests
    /// stay queued. Used after an unexpected failure left the running state unusable.
    pub fn fail_running(&mut self, message: &str) {
        self.executor.fail_all(message);
    }

    /// Fails every request, queued ones included (the engine cannot go on).
    pub fn fail_all(&mut self, message: &str) {
        let queued: Vec<Submission> = self.scheduler.drain().collect();
        for mut sub in queued {
            sub.sink.close(Event::Error { message: message.to_string() });
            self.executor.finished += 1;
        }
        self.executor.fail_all(message);
    }

    /// The driver is about to wait for work: give MLX's buffer cache and free heap back.
    /// Releases only when work ran since the last idle release: a decode step, a prefill
    /// or a row leaving (a row cancelled after the last step frees its KV into the cache
    /// too), not on every wake of a parked row.
    pub fn on_idle(&mut self) {
        let mark = self.work_mark();
        if self.idle_mark != Some(mark) {
            release_cached_memory();
            self.released_at_step = self.executor.decode_steps;
            self.idle_mark = Some(mark);
        }
    }

    /// (decode steps, prefill forwards, rows finished): grows with every piece of work.
    fn work_mark(&self) -> (u64, u64, u64) {
        (self.executor.decode_steps, self.executor.prefill_forwards, self.executor.finished)
    }

    /// Housekeeping between iterations: the periodic cache release, and the injected
    /// driver fault (which must panic outside the step's guard).
    pub fn after_step(&mut self) {
        let step = self.executor.decode_steps;
        if step != self.released_at_step && self.config().memory.due(step) {
            release_cached_memory();
            self.released_at_step = step;
        }
        if self.faults.driver_panic_after_step.is_some_and(|n| step >= n) {
            self.faults.driver_panic_after_step = None;
            panic!("injected fault: driver-panic after decode step {step}");
        }
    }

    /// One scheduling iteration: admit what fits, run one prefill chunk (so decoding rows stall
    /// at most one chunk), park paused rows and return resumed ones, then one decode step of
    /// the running batch.
    pub fn iterate(&mut self) {
        let info = self.executor.model().info().clone();
        self.make_room(&info);
        let load = self.load();
        for sub in self.scheduler.admit(&info, load) {
            let kv = self.config().kv_quantization();
            let need = projected_kv_bytes_for(&info, kv.as_ref(), sub.prompt.len(), sub.request.max_tokens);
            self.executor.admit(sub, need);
        }
        self.executor.prefill_step();
        self.executor.decode_step();
    }

    /// The prompt cache and the rows' KV share one ceiling (the KV budget, else for a cache
    /// sized from memory all MLX could allocate at start): cached entries give way, least
    /// recently used first, to the rows running and the request at the head of the queue,
    /// before admission would refuse it.
    fn make_room(&mut self, info: &crate::models::ModelInfo) {
        let Some(ceiling) = self.prompt_cache_ceiling else { return };
        if self.executor.prompt_cache.is_empty() {
            return;
        }
        let head = self.scheduler.head_projected(info).unwrap_or(0);
        let rows = self.load().projected_kv_bytes;
        self.executor.prompt_cache.evict_to(ceiling.saturating_sub(rows.saturating_add(head)));
    }

    /// Rows whose events have not ended yet: queued, prefilling, parked and decoding.
    pub fn outstanding(&self) -> usize {
        self.scheduler.waiting() + self.executor.prefilling() + self.executor.parked() + self.executor.decoding()
    }

    pub fn stats(&self) -> EngineStats {
        let (mlx_active_bytes, mlx_cache_bytes) = mlx_memory();
        EngineStats {
            active_rows: self.executor.decoding(),
            queued_rows: self.scheduler.waiting(),
            prefilling_rows: self.executor.prefilling(),
            kv_bytes_in_use: self.executor.kv_bytes_in_use(),
            kv_budget_bytes: self.config().kv_budget_bytes,
            prompt_cache_bytes: self.executor.prompt_cache.bytes(),
            prompt_cache_entries: self.executor.prompt_cache.len(),
            prompt_cache_hits: self.executor.prompt_cache.hits,
            prompt_cache_cached_tokens: self.executor.prompt_cache.cached_tokens,
            prompt_cache_capacity_bytes: self.executor.prompt_cache.capacity(),
            prompt_cache_evictions: self.executor.prompt_cache.evictions,
            prompt_cache_files_refused: self.refused_files.clone(),
            tokens_generated: self.executor.tokens_generated,
            paused_rows: self.executor.parked(),
            decode_steps: self.executor.decode_steps,
            prefill_forwards: self.executor.prefill_forwards,
            prefill_tokens: self.executor.prefill_tokens,
            requests_finished: self.executor.finished,
            decode_graph_build_s: self.executor.timing.graph_build.as_secs_f64(),
            decode_eval_wait_s: self.executor.timing.eval_wait.as_secs_f64(),
            decode_host_s: self.executor.timing.host.as_secs_f64(),
            decode_mask_compute_s: self.executor.timing.mask_compute.as_secs_f64(),
            decode_mask_wait_s: self.executor.timing.mask_wait.as_secs_f64(),
            speculative_steps: self.executor.speculative_steps,
            draft_tokens: self.executor.draft_tokens,
            draft_tokens_accepted: self.executor.draft_tokens_accepted,
            draft_acceptance_rate: match self.executor.draft_tokens {
                0 => 0.0,
                n => self.executor.draft_tokens_accepted as f64 / n as f64,
            },
            speculation_off: self.executor.speculation_off.clone(),
            mlx_active_bytes,
            mlx_cache_bytes,
            ranks: Vec::new(),
        }
    }
}

/// Whether `path` has the name [`entry_file`] gives (a hash of the tokens).
fn auto_named(path: &Path) -> bool {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    name.strip_suffix(".safetensors").is_some_and(|h| h.len() == 32 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}
