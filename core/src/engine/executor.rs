//! MLX execution for the engine, orchestrating rows ([`super::row`]) through the running batch
//! ([`super::batch`]): waiting rows prefill together in right-padded chunks (mlx-lm's
//! `PromptProcessingBatch`; kinds that cannot, alone in their own single-sequence caches),
//! produce their first token from the last prompt token in a joining batch, then join the
//! running batch (`into_batched` + `extend_rows`). The batch
//! decodes one token per row per step; finished rows leave through `filter_rows`, their KV
//! going to the prompt cache ([`Executor::retire`], the one place rows end).
//!
//! Pipelining: every decode step is built from the previous step's unread token array and
//! evaluated asynchronously before those tokens are read, whatever the rows want. Tokens are
//! chosen on the device ([`choose`]): greedy argmax, mlx-lm's logits processors (the penalty
//! window takes the in-flight token from the device array), mlx-lm's filters and a seeded
//! Gumbel-max draw ([`Sampler::choose`]); rows wanting log-probabilities get their float32 row
//! computed in the same graph and read with the token one step later. Constrained rows need
//! the previous token on the host for their mask, so their steps run forward first (submitted
//! from the device token), then read the previous tokens, advance the grammars and compute the
//! masks while the forward runs, then mask and choose. Joins append rows after the in-flight
//! ones and evictions filter the in-flight arrays too, so neither needs a flush.
//! [`DecodeMode::Synchronous`] reads every step's tokens at once (the synchronous reference).
//! With speculative decoding on ([`super::speculative`]), a step where some row has a
//! prompt-lookup draft reads the step in flight and verifies every row's draft in one
//! `[B, 1 + k]` forward instead ([`Executor::speculative_step`]).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::transforms::{async_eval, eval};
use mlx_rs::{Array, Dtype};

use super::batch::{InFlight, Removed, RunningBatch};
use mlx_rs::ops::concatenate;
use super::constrained::{self, PendingMasks};
use super::faults::Faults;
use super::media::{self, RowMedia};
use super::prompt_cache::PromptCache;
use super::row::{Parked, Prefilling, Row};
use super::speculative;
use super::{Event, RequestId, Submission};
use crate::cache::{self, KvCache, KvQuantization};
use crate::prefill::{as_f32_slice, prefill};
use crate::stop::FinishReason;
use crate::models::LanguageModel;
use crate::nn::last_position;
use crate::sampling::{draw_rows, Sampler};
use crate::tokenizer::Tokenizer;
use crate::{Error, Result};

/// Where decode steps spent their time (cumulative).
#[derive(Debug, Clone, Copy, Default)]
pub struct StepTiming {
    /// Building the step's graph on the host (model forward calls, sampling ops).
    pub graph_build: Duration,
    /// Submitting the step (`async_eval`) and waiting for its tokens. On MLX's CPU backend the
    /// submission itself runs most of the computation, so this is where compute time shows up.
    pub eval_wait: Duration,
    /// Reading tokens, sampling on the host, detokenizing, stop checks, callbacks, evictions.
    pub host: Duration,
    /// Constrained rows: computing next-token masks on the worker (all rows), and the part of
    /// that the step waited for after its forward was submitted (what did not overlap).
    pub mask_compute: Duration,
    pub mask_wait: Duration,
}

/// How decode steps are scheduled ([`super::EngineConfig::decode`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DecodeMode {
    /// Each step is built from the previous step's unread tokens and evaluated asynchronously.
    #[default]
    Pipelined,
    /// Every decode step is read before the next one is built (the reference the pipelined
    /// schedule is checked against; slower, same tokens).
    Synchronous,
}

/// How an executor holds its model: owned, on an engine's driver thread, or borrowed by
/// `generate`, which runs one sequence on its caller's thread.
pub(super) trait ModelHandle {
    fn get(&self) -> &dyn LanguageModel;
}

impl ModelHandle for Box<dyn LanguageModel> {
    fn get(&self) -> &dyn LanguageModel {
        self.as_ref()
    }
}

impl ModelHandle for &dyn LanguageModel {
    fn get(&self) -> &dyn LanguageModel {
        *self
    }
}

pub(super) struct Executor<M: ModelHandle = Box<dyn LanguageModel>> {
    model: M,
    tokenizer: Option<Tokenizer>,
    prefill_step_size: usize,
    /// Every cache kind of the model takes batched right-padded prefill chunks (and KV is not
    /// quantized), so waiting rows prefill together; otherwise each prefills alone.
    prefill_together: bool,
    prefilling: VecDeque<Prefilling>,
    batch: RunningBatch,
    parked: Vec<Parked>,
    /// KV quantization applied after every forward (None = full precision).
    kv: Option<KvQuantization>,
    /// Injected failures still to fire.
    faults: Faults,
    /// Read every step's tokens before the next step is built ([`DecodeMode::Synchronous`]).
    synchronous: bool,
    pub prompt_cache: PromptCache,
    /// Rows are snapshot into the prompt cache at their checkpoints while prefilling: the
    /// model has caches that cannot be cut back to an earlier position (recurrent state, a
    /// sliding-window ring), so a finished row's entry alone would not serve the next turn.
    checkpointing: bool,
    pub decode_steps: u64,
    pub prefill_forwards: u64,
    pub prefill_tokens: u64,
    pub timing: StepTiming,
    pub tokens_generated: u64,
    pub finished: u64,
    /// Draft length for rows whose request names none (0: no speculation).
    num_draft_tokens: usize,
    /// Why this model cannot speculate (`None`: it can).
    pub speculation_off: Option<String>,
    pub speculative_steps: u64,
    pub draft_tokens: u64,
    pub draft_tokens_accepted: u64,
    /// Drafts come from this model instead of prompt lookup.
    drafter: Option<speculative::Drafter>,
}

impl<M: ModelHandle> Executor<M> {
    pub fn new(
        model: M,
        tokenizer: Option<Tokenizer>,
        prefill_step_size: usize,
        prompt_cache_bytes: u64,
    ) -> Self {
        let fresh = model.get().make_caches();
        let prefill_together = model.get().batched_prefill() && fresh.iter().all(|c| c.batched_prefill());
        let checkpointing = prompt_cache_bytes > 0 && fresh.iter().any(|c| !c.always_trims());
        let speculation_off = (!cache::trims_rows(fresh)).then(|| {
            "its caches cannot drop rejected draft positions (recurrent or sliding-window layers)".to_string()
        });
        Executor {
            model,
            tokenizer,
            prefill_step_size,
            prefill_together,
            prefilling: VecDeque::new(),
            batch: RunningBatch::default(),
            parked: Vec::new(),
            kv: None,
            faults: Faults::default(),
            synchronous: false,
            prompt_cache: PromptCache::new(prompt_cache_bytes),
            checkpointing,
            decode_steps: 0,
            prefill_forwards: 0,
            prefill_tokens: 0,
            timing: StepTiming::default(),
            tokens_generated: 0,
            finished: 0,
            num_draft_tokens: 0,
            speculation_off,
            speculative_steps: 0,
            draft_tokens: 0,
            draft_tokens_accepted: 0,
            drafter: None,
        }
    }

    /// Rows' KV caches quantize themselves as `kv` says (`cache::quantizing`: mlx-lm's
    /// `maybe_quantize_kv_cache` after every forward, solo prefill caches and the batch alike).
    pub fn with_kv_quantization(mut self, kv: Option<KvQuantization>) -> Self {
        // Quantized caches have no right-padded batched prefill (mlx-lm does not batch kv_bits).
        self.prefill_together &= kv.is_none();
        if kv.is_some() {
            self.speculation_off = Some("quantized KV caches cannot drop rejected draft positions".into());
        }
        self.kv = kv;
        self
    }

    /// Turns the prompt cache off (ranks in lockstep without an explicit size).
    pub fn disable_prompt_cache(&mut self) {
        self.prompt_cache = PromptCache::new(0);
        self.checkpointing = false;
    }

    /// Schedules decode steps as `mode` says.
    pub fn with_decode_mode(mut self, mode: DecodeMode) -> Self {
        self.synchronous = mode == DecodeMode::Synchronous;
        self
    }

    /// Rows whose request names no draft length draft up to `n` tokens a step (0: none).
    pub fn with_speculation(mut self, n: usize) -> Self {
        self.num_draft_tokens = n;
        self
    }

    /// Rows draft with `drafter` (a draft model) instead of prompt lookup.
    pub fn set_drafter(&mut self, drafter: Option<speculative::Drafter>) {
        self.drafter = drafter;
    }

    /// Fail or panic at the decode steps `faults` names (fault-injection tests).
    pub fn with_faults(mut self, faults: Faults) -> Self {
        self.faults = faults;
        self
    }

    pub(super) fn tokenizer(&self) -> Option<&Tokenizer> {
        self.tokenizer.as_ref()
    }

    pub fn model(&self) -> &dyn LanguageModel {
        self.model.get()
    }

    pub fn decoding(&self) -> usize {
        self.batch.len()
    }

    pub fn prefilling(&self) -> usize {
        self.prefilling.len()
    }

    /// Rows parked by their consumer.
    pub fn parked(&self) -> usize {
        self.parked.len()
    }

    /// A parked row whose consumer resumed it, or that was cancelled meanwhile.
    pub fn has_resumable(&self) -> bool {
        self.parked.iter().any(|p| !p.row.paused())
    }

    pub fn projected_kv_bytes(&self) -> u64 {
        self.batch.rows.iter().map(|r| r.projected_kv_bytes).sum::<u64>()
            + self.prefilling.iter().map(|p| p.row.projected_kv_bytes).sum::<u64>()
            + self.parked.iter().map(|p| p.row.projected_kv_bytes).sum::<u64>()
    }

    /// Bytes the KV caches really hold now (allocated capacity, left padding and recurrent
    /// state included), across the batch, prefilling rows and parked rows.
    pub fn kv_bytes_in_use(&self) -> u64 {
        let solo: usize = self.prefilling.iter().flat_map(|p| &p.caches).map(|c| c.nbytes()).sum();
        let parked: usize = self.parked.iter().flat_map(|p| &p.caches).map(|c| c.nbytes()).sum();
        (self.batch.nbytes() + solo + parked) as u64
    }

    /// Starts a request: reuses a cached prefix if there is one, then queues its prefill.
    pub fn admit(&mut self, mut sub: Submission, projected_kv_bytes: u64) {
        let images = std::mem::take(&mut sub.images);
        let clips = std::mem::take(&mut sub.audio);
        // Media reach rows only through `Preparer::prepare`; a submission built by hand
        // (EngineCore users) must not have them dropped silently.
        let unprepared = (images.is_empty() && !sub.request.images.is_empty())
            || (clips.is_empty() && !sub.request.audio.is_empty());
        let mut row = Row::new(sub, self.tokenizer.as_ref(), projected_kv_bytes);
        if unprepared {
            return self.fail_row(row, "media: the request's images or audio were not prepared (engine::Preparer::prepare)".into());
        }
        if !images.is_empty() {
            // The tower runs here, once per request, before the row's first chunk.
            match RowMedia::encode(self.model.get(), &images) {
                Ok(media) => row.media = media,
                Err(e) => return self.fail_row(row, format!("encoding the images failed: {e}")),
            }
            if let Some(spec) = self.model.get().vision().map(|v| v.spec()) {
                row.cache_key = Some(media::cache_key(&row.prompt, &images, spec.zeroed_token_id));
            }
        }
        if !clips.is_empty() {
            match std::mem::take(&mut row.media).encode_audio(self.model.get(), &clips) {
                Ok(media) => row.media = media,
                Err(e) => return self.fail_row(row, format!("encoding the audio failed: {e}")),
            }
            let key = row.cache_key.take().unwrap_or_else(|| row.prompt.clone());
            row.cache_key = Some(media::audio_cache_key(key, &clips, &images));
        }
        let reuse = if self.prompt_cache.enabled() {
            self.prompt_cache.lookup(row.cache_prompt(), row.prompt.len() - 1)
        } else {
            None
        };
        // Reused KV that ends inside a bidirectional image span would have seen only part of it.
        let reuse = reuse.filter(|(_, n)| !self.whole_spans() || row.media.whole_spans_end(*n) == *n);
        let (caches, done) = match reuse {
            Some((caches, n)) => (caches, n),
            None => (cache::quantizing(self.model.get().make_caches(), self.kv.as_ref()), 0),
        };
        row.cached_tokens = done;
        // Where this row is snapshot for the next turn: its chat boundaries past the reused
        // prefix, and the end of its prefill (the same prompt again reuses all of it).
        let target = row.prompt.len() - 1;
        if self.checkpointing && row.cache_key.is_none() {
            row.checkpoints.push(target);
            row.checkpoints.retain(|&b| b > done && b <= target);
            row.checkpoints.sort_unstable();
            row.checkpoints.dedup();
        } else {
            row.checkpoints.clear();
        }
        // What the face reports before the first token; a consumer already gone is seen at the
        // row's first token.
        let _ = row.sink.token(&Event::Started { prompt_tokens: row.prompt.len(), cached_tokens: done });
        self.prefilling.push_back(Prefilling { row, caches, done });
    }

    /// Ends a row: its KV (when given) goes to the prompt cache, then its final event.
    fn retire(&mut self, Removed { row, caches }: Removed) {
        if let (true, Some(caches)) = (self.prompt_cache.enabled(), caches) {
            let len = caches.first().map_or(0, |c| c.len());
            self.prompt_cache.insert(row.cached_sequence(len), caches);
        }
        self.finished += 1;
        row.close();
    }

    /// Ends a row that never reached (or was taken out of) the batch with an error.
    fn fail_row(&mut self, row: Row, message: String) {
        self.finished += 1;
        row.fail(message);
    }

    /// Cancels a request that is prefilling or decoding. Returns false if it is not here.
    pub fn cancel(&mut self, id: RequestId) -> bool {
        if let Some(pos) = self.prefilling.iter().position(|p| p.row.id == id) {
            let p = self.prefilling.remove(pos).unwrap();
            self.finished += 1;
            p.row.finish(FinishReason::Cancelled);
            return true;
        }
        if let Some(pos) = self.parked.iter().position(|p| p.row.id == id) {
            let p = self.parked.remove(pos);
            self.finished += 1;
            p.row.finish(FinishReason::Cancelled);
            return true;
        }
        if let Some(row) = self.batch.rows.iter_mut().find(|r| r.id == id) {
            row.finish = Some(FinishReason::Cancelled);
            if let Err(e) = self.evict_finished() {
                self.fail_batch(&e);
            }
            return true;
        }
        false
    }

    pub fn cancel_all(&mut self) {
        let ids: Vec<RequestId> = self
            .prefilling
            .iter()
            .map(|p| p.row.id)
            .chain(self.parked.iter().map(|p| p.row.id))
            .chain(self.batch.rows.iter().map(|r| r.id))
            .collect();
        for id in ids {
            self.cancel(id);
        }
    }

    /// Whether the model attends bidirectionally within image spans (chunks keep them whole).
    fn whole_spans(&self) -> bool {
        self.model.get().vision().is_some_and(|v| v.spec().bidirectional)
    }

    /// Prefills one chunk of the waiting prompts, so decoding rows stall at most one chunk;
    /// rows whose prompt (minus its last token) is then in take their first step together and
    /// join the batch.
    pub fn prefill_step(&mut self) {
        let ready = if self.prefill_together {
            self.prefill_chunk_together()
        } else {
            self.prefill_chunk_solo()
        };
        if !ready.is_empty() {
            self.first_tokens(ready);
        }
    }

    /// Solo prefill (caches that cannot take right-padded batched chunks, or quantized KV):
    /// up to `prefill_step_size` tokens in all, oldest row first, each row with its own
    /// single-sequence caches.
    fn prefill_chunk_solo(&mut self) -> RunningBatch {
        let mut budget = self.prefill_step_size;
        let mut ready = Vec::new();
        while let Some(mut p) = self.prefilling.pop_front() {
            let target = p.row.prompt.len() - 1;
            if p.done < target {
                if budget == 0 {
                    self.prefilling.push_front(p);
                    break;
                }
                let mut end = (p.done + budget).min(target);
                if self.whole_spans() {
                    end = p.row.media.whole_spans_end(end);
                }
                // A chunk ends at the next checkpoint, where the row's caches are snapshot.
                let at_checkpoint = p.row.checkpoints.first().is_some_and(|&b| b <= end);
                if at_checkpoint {
                    end = p.row.checkpoints[0];
                }
                let chunk = &p.row.prompt[p.done..end];
                let done = if p.row.media.is_empty() {
                    prefill(self.model.get(), &mut p.caches, chunk, end - p.done)
                } else {
                    self.prefill_media_chunk(&mut p, end)
                };
                if let Err(e) = done {
                    self.fail_row(p.row, format!("prefill failed: {e}"));
                    continue;
                }
                budget = budget.saturating_sub(end - p.done);
                self.prefill_forwards += 1;
                self.prefill_tokens += (end - p.done) as u64;
                p.done = end;
                if at_checkpoint {
                    self.checkpoint(&mut p.row, &p.caches);
                }
                if p.done < target {
                    self.prefilling.push_front(p);
                    // A chunk cut short at a checkpoint leaves budget for the same row.
                    if at_checkpoint && budget > 0 {
                        continue;
                    }
                    break;
                }
            }
            ready.push(p);
        }
        self.joining_batch(ready.into_iter().map(|p| (p.row, p.caches)).collect())
    }

    /// One solo prefill chunk of a row with images: positions `p.done..end`, soft tokens spliced.
    fn prefill_media_chunk(&self, p: &mut Prefilling, end: usize) -> Result<()> {
        let ids: Vec<i32> = p.row.prompt[p.done..end].iter().map(|&t| t as i32).collect();
        let tokens = Array::from_slice(&ids, &[1, ids.len() as i32]);
        let m = media::forward_media(&[&p.row.media], &[(p.done, end)]).expect("a row with media");
        self.model.get().forward_with_media(&tokens, &m, &mut p.caches)?;
        let state: Vec<Array> = p.caches.iter().flat_map(|c| c.state()).collect();
        Ok(eval(&state)?)
    }

    /// Batched prefill (mlx-lm `PromptProcessingBatch.prompt`): every waiting row (at most
    /// `prompt_concurrency`, the scheduler's cap) takes its next chunk of up to
    /// `prefill_step_size` tokens, counted from its own start so chunk boundaries are mlx-lm's;
    /// the chunks are right-padded into one `[B, L]` forward over the rows' merged caches, then
    /// the padding becomes left padding. Rows with their prompt in leave as one batch (their
    /// caches stay batched); the others go back to single-sequence caches and wait.
    fn prefill_chunk_together(&mut self) -> RunningBatch {
        let (todo, ready): (Vec<Prefilling>, Vec<Prefilling>) =
            self.prefilling.drain(..).partition(|p| p.done + 1 < p.row.prompt.len());
        let mut joining = self.joining_batch(ready.into_iter().map(|p| (p.row, p.caches)).collect());
        if todo.is_empty() {
            return joining;
        }
        let step = self.prefill_step_size;
        let whole = self.whole_spans();
        let ends: Vec<usize> = todo
            .iter()
            .map(|p| {
                let end = (p.done + step).min(p.row.prompt.len() - 1);
                let end = if whole { p.row.media.whole_spans_end(end) } else { end };
                // A chunk ends at the row's next checkpoint, where its caches are snapshot.
                p.row.checkpoints.first().map_or(end, |&b| b.min(end))
            })
            .collect();
        let mut rows = Vec::with_capacity(todo.len());
        let mut row_caches = Vec::with_capacity(todo.len());
        let mut chunks = Vec::with_capacity(todo.len());
        let ranges: Vec<(usize, usize)> = todo.iter().zip(&ends).map(|(p, &end)| (p.done, end)).collect();
        for (p, &end) in todo.into_iter().zip(&ends) {
            chunks.push(p.row.prompt[p.done..end].to_vec());
            rows.push(p.row);
            row_caches.push(p.caches);
        }
        let width = chunks.iter().map(Vec::len).max().unwrap_or(0);
        let result = (|| -> Result<Vec<Box<dyn KvCache>>> {
            let mut caches: Vec<Box<dyn KvCache>> = Vec::new();
            for (i, per_layer) in row_caches.into_iter().enumerate() {
                for (l, c) in per_layer.into_iter().enumerate() {
                    let c = c.into_batched()?;
                    if i == 0 {
                        caches.push(c);
                    } else {
                        cache::extend_rows(caches[l].as_mut(), c)?;
                    }
                }
            }
            let right_padding: Vec<i32> = chunks.iter().map(|c| (width - c.len()) as i32).collect();
            let mut ids = vec![0i32; chunks.len() * width];
            for (b, c) in chunks.iter().enumerate() {
                for (j, &t) in c.iter().enumerate() {
                    ids[b * width + j] = t as i32;
                }
            }
            let tokens = Array::from_slice(&ids, &[chunks.len() as i32, width as i32]);
            cache::prepare_right_padding(&mut caches, &right_padding)?;
            let row_media: Vec<&RowMedia> = rows.iter().map(|r| &r.media).collect();
            match media::forward_media(&row_media, &ranges) {
                None => self.model.get().forward(&tokens, &mut caches)?,
                Some(m) => self.model.get().forward_with_media(&tokens, &m, &mut caches)?,
            };
            self.prefill_forwards += 1;
            self.prefill_tokens += chunks.iter().map(|c| c.len() as u64).sum::<u64>();
            cache::finalize_padding(&mut caches)?;
            let state: Vec<Array> = caches.iter().flat_map(|c| c.state()).collect();
            eval(&state)?;
            Ok(caches)
        })();
        let mut caches = match result {
            Ok(c) => c,
            Err(e) => {
                for r in rows {
                    self.fail_row(r, format!("prefill failed: {e}"));
                }
                return joining;
            }
        };
        // Rows still prefilling return to single-sequence caches (their KV columns copied out).
        let prefilled: Vec<usize> = (0..rows.len()).filter(|&b| ends[b] + 1 == rows[b].prompt.len()).collect();
        let mut waiting = Vec::new();
        let mut finished_rows = Vec::new();
        for (b, mut row) in rows.into_iter().enumerate() {
            let at_checkpoint = row.checkpoints.first() == Some(&ends[b]);
            if prefilled.binary_search(&b).is_ok() {
                if at_checkpoint {
                    // The row stays in the batch: its snapshot is a copy of its columns.
                    if let Ok(single) = cache::extract_row(&caches, b) {
                        self.checkpoint(&mut row, &single);
                    }
                }
                finished_rows.push(row);
                continue;
            }
            match cache::extract_row(&caches, b) {
                Ok(single) => {
                    if at_checkpoint {
                        self.checkpoint(&mut row, &single);
                    }
                    waiting.push(Prefilling { row, caches: single, done: ends[b] })
                }
                Err(e) => self.fail_row(row, format!("prefill failed: {e}")),
            }
        }
        self.prefilling.extend(waiting);
        if finished_rows.is_empty() {
            return joining;
        }
        if prefilled.len() < ends.len() {
            if let Err(e) = cache::filter_rows(&mut caches, &prefilled) {
                for r in finished_rows {
                    self.fail_row(r, format!("prefill failed: {e}"));
                }
                return joining;
            }
        }
        if let Err((e, rows)) = joining.append(RunningBatch::new(finished_rows, caches)) {
            for r in rows.into_iter().chain(joining.clear()) {
                self.fail_row(r, format!("joining the batch failed: {e}"));
            }
        }
        joining
    }

    /// Snapshots `caches` (a row's single-sequence caches, holding exactly the prompt up to
    /// its first checkpoint) into the prompt cache and moves on to the next checkpoint.
    fn checkpoint(&mut self, row: &mut Row, caches: &[Box<dyn KvCache>]) {
        let at = row.checkpoints.remove(0);
        if caches.iter().all(|c| c.len() == at) {
            let copy = caches.iter().map(|c| c.duplicate()).collect();
            self.prompt_cache.insert(row.prompt[..at].to_vec(), copy);
        }
    }

    /// Puts rows with single-sequence caches into one new batch (each cache `into_batched`,
    /// then joined row by row). Rows whose caches cannot join fail alone.
    fn joining_batch(&mut self, rows: Vec<(Row, Vec<Box<dyn KvCache>>)>) -> RunningBatch {
        let mut joined = RunningBatch::default();
        for (row, caches) in rows {
            let caches = match caches.into_iter().map(|c| c.into_batched()).collect::<Result<Vec<_>>>() {
                Ok(caches) => caches,
                Err(e) => {
                    self.fail_row(row, format!("joining the batch failed: {e}"));
                    continue;
                }
            };
            if let Err((e, rows)) = joined.append(RunningBatch::new(vec![row], caches)) {
                for r in rows.into_iter().chain(joined.clear()) {
                    self.fail_row(r, format!("joining the batch failed: {e}"));
                }
            }
        }
        joined
    }

    /// Appends `joining` to the running batch; if that fails, both fail.
    fn join(&mut self, joining: RunningBatch) {
        if let Err((e, rows)) = self.batch.append(joining) {
            for r in rows {
                self.fail_row(r, format!("joining the batch failed: {e}"));
            }
            self.fail_batch(&e);
        }
    }

    /// Forwards each ready row's last prompt token (mlx-lm's convention) in one batched step,
    /// samples first tokens, and moves the rows that continue into the running batch.
    fn first_tokens(&mut self, mut joining: RunningBatch) {
        let result = (|| -> Result<(Vec<u32>, Vec<Option<Vec<f32>>>, Array)> {
            let last: Vec<u32> = joining.rows.iter().map(|r| *r.prompt.last().unwrap()).collect();
            let input = Array::from_slice(&last, &[last.len() as i32, 1]);
            // Rows with images embed their last prompt token by the same rules as the rest.
            let with_media = joining.rows.iter().any(|r| !r.media.is_empty());
            let rows: Vec<bool> = joining.rows.iter().map(|r| !r.media.is_empty()).collect();
            let audio_rows: Vec<bool> = joining.rows.iter().map(|r| r.media.has_audio()).collect();
            let caches = joining.caches_mut()?;
            let logits = if with_media {
                let m = crate::language_model::PromptMedia { rows, audio_rows, soft: Vec::new() };
                last_position(&self.model.get().forward_with_media(&input, &m, caches)?)?
            } else {
                last_position(&self.model.get().forward(&input, caches)?)?
            };
            let (tokens, logprobs) = choose(&mut joining.rows, &logits, None, self.model.get().fast_cpu_kernels())?;
            eval(std::iter::once(&tokens).chain(logprobs.iter().flatten()))?;
            let tokens = tokens.try_as_slice::<u32>().map_err(|e| Error::Mlx(format!("reading tokens: {e}")))?.to_vec();
            let logprobs = logprobs
                .iter()
                .map(|lp| lp.as_ref().map(|a| as_f32_slice(a).map(<[f32]>::to_vec)).transpose())
                .collect::<Result<_>>()?;
            Ok((tokens, logprobs, logits))
        })();
        let (tokens, logprobs, logits) = match result {
            Ok(c) => c,
            Err(e) => {
                for r in joining.clear() {
                    self.fail_row(r, format!("generation failed: {e}"));
                }
                return;
            }
        };
        for (b, (token, lp)) in tokens.into_iter().zip(logprobs).enumerate() {
            joining.rows[b].capture_first(&logits.index(b as i32..b as i32 + 1));
            if joining.rows[b].error.is_some() {
                continue; // failed by its constraint
            }
            self.accept_at(&mut joining, b, token, lp.as_deref());
        }
        // Rows done after one token leave now; the rest join the running batch.
        if self.evict_from(&mut joining).is_ok() {
            self.join(joining);
        }
    }

    fn context_left(&self, row: &Row) -> usize {
        match self.model.get().info().max_position_embeddings {
            Some(ctx) => ctx.saturating_sub(row.prompt.len() + row.generated.len() + 1),
            None => usize::MAX,
        }
    }

    /// One batched decode step (after parking paused rows and returning resumed ones).
    pub fn decode_step(&mut self) {
        if let Err(e) = self.resume_parked().and_then(|()| self.park_paused()) {
            self.fail_batch(&e);
        }
        if self.batch.is_empty() {
            return;
        }
        if let Err(e) = self.try_decode_step() {
            self.fail_batch(&e);
        }
    }

    fn try_decode_step(&mut self) -> Result<()> {
        if self.synchronous {
            self.read_in_flight()?;
            if self.batch.is_empty() {
                return Ok(());
            }
        }
        let step = self.decode_steps + 1;
        if Faults::fire(&mut self.faults.forward_error_at_step, step) {
            return Err(Error::Mlx(format!("injected fault: forward-error at decode step {step}")));
        }
        if Faults::fire(&mut self.faults.step_panic_at_step, step) {
            panic!("injected fault: step-panic at decode step {step}");
        }
        if self.batch.rows.iter().any(|r| self.draft_budget(r) > 0) {
            // Drafts come from the rows' last tokens: read the step in flight first.
            self.read_in_flight()?;
            if self.drafter.is_some() && !self.batch.is_empty() {
                return self.draft_model_step();
            }
            let drafts: Vec<Vec<u32>> = self
                .batch
                .rows
                .iter()
                .map(|r| speculative::lookup(&r.prompt, &r.generated, self.draft_budget(r)))
                .collect();
            if drafts.iter().any(|d| !d.is_empty()) {
                let none = vec![None; drafts.len()];
                return self.speculative_step(drafts, none).map(|_| ());
            }
            if self.batch.is_empty() {
                return Ok(());
            }
        }
        let started = Instant::now();
        let constrained = self.batch.rows.iter().any(Row::needs_host_choice);
        // With every last token on the host, constrained rows' masks start now, on a worker,
        // overlapping the forward's graph build.
        let early = (constrained && self.batch.in_flight.is_none()).then(|| PendingMasks::start(&mut self.batch.rows));
        let inputs = self.batch.step_inputs()?;
        let caches = self.batch.caches_mut()?;
        let logits = last_position(&self.model.get().forward(&inputs, caches)?)?;
        self.decode_steps += 1;
        for r in &mut self.batch.rows {
            r.next_input = None;
        }
        let mut previous = self.batch.in_flight.take();
        let mut off_build = Duration::ZERO;
        if constrained {
            // Masks follow the previous token: start the forward, read that token and advance
            // the grammars while it runs, then mask and choose. Rows finished by that token
            // stay until the new step is in flight (its arrays are filtered with them).
            let submit = Instant::now();
            async_eval([&logits])?;
            self.timing.eval_wait += submit.elapsed();
            let masks = match (early, previous.take()) {
                (Some(masks), _) => masks,
                (None, prev) => {
                    if let Some(prev) = prev {
                        self.accept_flight(&prev)?;
                    }
                    PendingMasks::start(&mut self.batch.rows)
                }
            };
            let join = Instant::now();
            self.timing.mask_compute += masks.join(&mut self.batch.rows)?;
            self.timing.mask_wait += join.elapsed();
            off_build = submit.elapsed();
        }
        let (tokens, logprobs) = choose(&mut self.batch.rows, &logits, previous.as_ref(), self.model.get().fast_cpu_kernels())?;
        self.timing.graph_build += started.elapsed().saturating_sub(off_build);
        let submit = Instant::now();
        async_eval(std::iter::once(&tokens).chain(logprobs.iter().flatten()))?;
        self.timing.eval_wait += submit.elapsed();
        self.batch.in_flight = Some(InFlight { tokens, rows: self.batch.len(), logprobs });
        match previous {
            Some(prev) => self.deliver(&prev)?,
            None => self.evict_finished()?,
        }
        if self.synchronous {
            self.read_in_flight()?;
        }
        Ok(())
    }

    /// How many draft tokens row `r` may verify this step: its (or the engine's) draft length,
    /// within what `max_tokens` and the context leave after the step's own token.
    fn draft_budget(&self, r: &Row) -> usize {
        if self.speculation_off.is_some() || !r.speculates() {
            return 0;
        }
        let k = r.num_draft_tokens.unwrap_or(self.num_draft_tokens);
        k.min(r.max_tokens.saturating_sub(r.generated.len() + 1)).min(self.context_left(r))
    }

    /// One speculative step (every row's last token on the host): the rows' inputs then drafts,
    /// right-padded to the longest, in one `[B, 1 + k]` forward. Rows without a draft take
    /// their token from position 0 as a plain step would ([`choose`]: constraints, processors,
    /// log-probabilities); rows with one keep the verified prefix of their draft and the token
    /// after it ([`speculative`]). Each row's tokens go through `accept` one by one, so a stop
    /// (id, string, `max_tokens`) inside a draft ends it exactly where plain decoding would;
    /// positions past what a row kept leave its KV cache.
    /// A speculative step whose drafts come from the draft model: it drafts as many tokens as
    /// the widest budget for every row (rows keep their own budget's worth, rows without one
    /// none), the target verifies, and the draft caches keep what was accepted.
    fn draft_model_step(&mut self) -> Result<()> {
        let budgets: Vec<usize> = self.batch.rows.iter().map(|r| self.draft_budget(r)).collect();
        let k = budgets.iter().copied().max().unwrap_or(0);
        let drafter = self.drafter.as_ref().expect("checked by the caller");
        let batch = &mut self.batch;
        let drafted = drafter.draft(&mut batch.draft_caches, &mut batch.draft_rows, &mut batch.rows, k)?;
        let (drafts, qs): (Vec<Vec<u32>>, Vec<Option<Vec<Vec<f32>>>>) = drafted
            .into_iter()
            .zip(&budgets)
            .map(|((mut d, q), &n)| {
                d.truncate(n);
                (d, q.map(|mut q| {
                    q.truncate(n);
                    q
                }))
            })
            .collect();
        let accepted = self.speculative_step(drafts, qs)?;
        // Rows finished by this step left; `accepted` covers the rows of the step, in order.
        let batch = &mut self.batch;
        if batch.draft_rows > 0 && accepted.len() == batch.rows.len() {
            speculative::Drafter::keep(&mut batch.draft_caches, &mut batch.rows, &accepted, k)?;
        }
        Ok(())
    }

    /// Returns how many draft tokens each row of the step accepted, for the rows still in the
    /// batch (rows that finished are left out).
    fn speculative_step(&mut self, drafts: Vec<Vec<u32>>, qs: Vec<Option<Vec<Vec<f32>>>>) -> Result<Vec<usize>> {
        let started = Instant::now();
        let rows = self.batch.len();
        let k = drafts.iter().map(Vec::len).max().unwrap_or(0);
        let width = k + 1;
        let mut input = Vec::with_capacity(rows * width);
        for (r, d) in self.batch.rows.iter().zip(&drafts) {
            input.push(r.next_input.ok_or_else(|| Error::Mlx("a decoding row has no input token".into()))?);
            input.extend(d);
            input.extend(std::iter::repeat_n(0, k - d.len()));
        }
        let inputs = Array::from_slice(&input, &[rows as i32, width as i32]);
        let masks = self.batch.rows.iter().any(Row::needs_host_choice).then(|| PendingMasks::start(&mut self.batch.rows));
        let caches = self.batch.caches_mut()?;
        let logits = self.model.get().forward(&inputs, caches)?;
        self.decode_steps += 1;
        self.speculative_steps += 1;
        for r in &mut self.batch.rows {
            r.next_input = None;
        }
        if let Some(masks) = masks {
            self.timing.mask_compute += masks.join(&mut self.batch.rows)?;
        }
        let (tokens, logprobs) = choose(&mut self.batch.rows, &logits.index((.., 0, ..)), None, self.model.get().fast_cpu_kernels())?;
        let argmax = Sampler::argmax(&logits)?.as_dtype(Dtype::Uint32)?;
        let sampled: Vec<usize> =
            (0..rows).filter(|&b| !drafts[b].is_empty() && self.batch.rows[b].sampler.params().temperature > 0.0).collect();
        let sampled_lp = match sampled.is_empty() {
            true => None,
            false => {
                let idx: Vec<i32> = sampled.iter().map(|&b| b as i32).collect();
                let sub = logits.take_axis(&Array::from_slice(&idx, &[idx.len() as i32]), 0)?;
                Some(Sampler::logprobs(&sub.as_dtype(Dtype::Float32)?)?)
            }
        };
        self.timing.graph_build += started.elapsed();
        let wait = Instant::now();
        eval([&tokens, &argmax].into_iter().chain(logprobs.iter().flatten()).chain(sampled_lp.iter()))?;
        self.timing.eval_wait += wait.elapsed();
        let host = Instant::now();
        let read = |a: &Array| a.try_as_slice::<u32>().map(<[u32]>::to_vec).map_err(|e| Error::Mlx(format!("reading tokens: {e}")));
        let (tokens, argmax) = (read(&tokens)?, read(&argmax)?);
        let sampled_lp = sampled_lp.as_ref().map(as_f32_slice).transpose()?;
        let vocab = *logits.shape().last().unwrap_or(&0) as usize;
        let mut batch = std::mem::take(&mut self.batch);
        let mut trims = vec![0usize; rows];
        let mut accepted_rows = vec![0usize; rows];
        let mut result = Ok(());
        for b in 0..rows {
            let draft = &drafts[b];
            let (accepted, next) = if draft.is_empty() {
                (0, tokens[b])
            } else if let Some(s) = sampled.iter().position(|&x| x == b) {
                let lp = sampled_lp.as_ref().expect("read with the sampled rows");
                let row = &lp[s * width * vocab..(s + 1) * width * vocab];
                let params = batch.rows[b].sampler.params().clone();
                let probs: Vec<Vec<f32>> =
                    (0..=draft.len()).map(|i| speculative::target_probs(&row[i * vocab..(i + 1) * vocab], &params)).collect();
                speculative::accept_sampled(&probs, qs[b].as_deref(), draft, batch.rows[b].sampler.rng())
            } else {
                let a = speculative::accept_greedy(&argmax[b * width..(b + 1) * width], draft);
                (a, argmax[b * width + a])
            };
            self.draft_tokens += draft.len() as u64;
            self.draft_tokens_accepted += accepted as u64;
            accepted_rows[b] = accepted;
            let lp = match logprobs.get(b).and_then(Option::as_ref).map(as_f32_slice).transpose() {
                Ok(lp) => lp,
                Err(e) => {
                    result = Err(e);
                    break;
                }
            };
            let mut taken = 0;
            for token in draft[..accepted].iter().copied().chain([next]) {
                if batch.rows[b].finish.is_some() {
                    break;
                }
                self.accept_at(&mut batch, b, token, lp);
                taken += 1;
            }
            // The KV keeps the row's input and the accepted drafts it went on past (the last
            // token taken is the next input, not yet forwarded).
            trims[b] = width - (accepted + 1).min(taken.max(1));
        }
        let trimmed = result.and_then(|()| cache::trim_rows(batch.caches_mut()?, &trims));
        self.batch = batch;
        self.timing.host += host.elapsed();
        trimmed?;
        let leaving: Vec<bool> = self.batch.rows.iter().map(|r| r.finish.is_some()).collect();
        self.evict_finished()?;
        Ok(accepted_rows.into_iter().zip(leaving).filter(|(_, gone)| !gone).map(|(a, _)| a).collect())
    }

    /// Gives row `b` of `batch` its token; a row whose text handling fails is failed alone.
    fn accept_at(&mut self, batch: &mut RunningBatch, b: usize, token: u32, logprobs: Option<&[f32]>) {
        let left = self.context_left(&batch.rows[b]);
        self.tokens_generated += 1;
        let row = &mut batch.rows[b];
        if let Err(e) = row.accept(token, left, logprobs) {
            row.fail_later(&e);
        }
    }

    /// Reads an in-flight step's tokens (and log-probability rows) and hands them to their
    /// rows; rows it finishes stay in the batch.
    fn accept_flight(&mut self, flight: &InFlight) -> Result<()> {
        let wait = Instant::now();
        flight.tokens.eval()?;
        for lp in flight.logprobs.iter().flatten() {
            lp.eval()?;
        }
        self.timing.eval_wait += wait.elapsed();
        let host = Instant::now();
        let tokens = flight
            .tokens
            .try_as_slice::<u32>()
            .map_err(|e| Error::Mlx(format!("reading tokens: {e}")))?
            .to_vec();
        let mut batch = std::mem::take(&mut self.batch);
        let mut result = Ok(());
        for (b, token) in tokens.into_iter().enumerate().take(flight.rows) {
            if batch.rows[b].finish.is_some() {
                continue;
            }
            let lp = match flight.logprobs.get(b).and_then(Option::as_ref).map(as_f32_slice).transpose() {
                Ok(lp) => lp,
                Err(e) => {
                    result = Err(e);
                    break;
                }
            };
            self.accept_at(&mut batch, b, token, lp);
        }
        self.batch = batch;
        self.timing.host += host.elapsed();
        result
    }

    /// Reads an in-flight step's tokens, hands them to their rows and evicts finished rows.
    fn deliver(&mut self, flight: &InFlight) -> Result<()> {
        self.accept_flight(flight)?;
        let host = Instant::now();
        let evicted = self.evict_finished();
        self.timing.host += host.elapsed();
        evicted
    }

    /// Reads the pending step (if any) so every row's last token is known on the host.
    fn read_in_flight(&mut self) -> Result<()> {
        if let Some(f) = self.batch.in_flight.take() {
            self.deliver(&f)?;
            // The rows it covered now hold their input on the host (set by `accept`).
        }
        Ok(())
    }

    /// Removes the running batch's finished rows and retires them.
    fn evict_finished(&mut self) -> Result<()> {
        let mut batch = std::mem::take(&mut self.batch);
        let evicted = self.evict_from(&mut batch);
        self.batch = batch;
        evicted
    }

    /// Removes `batch`'s finished rows (their KV extracted for the prompt cache when it is on)
    /// and retires them.
    fn evict_from(&mut self, batch: &mut RunningBatch) -> Result<()> {
        let save = self.prompt_cache.enabled();
        let removed = batch.remove(|r| r.finish.is_some(), |_| save);
        match removed {
            Ok(removed) => {
                removed.into_iter().for_each(|r| self.retire(r));
                Ok(())
            }
            Err(e) => {
                for r in batch.clear() {
                    self.retire_or_fail(r, &e);
                }
                Err(e)
            }
        }
    }

    /// Takes rows whose consumer paused them out of the batch. The pending pipelined step is
    /// read first so every row's last token is known on the host when it rejoins.
    fn park_paused(&mut self) -> Result<()> {
        if !self.batch.rows.iter().any(Row::paused) {
            return Ok(());
        }
        self.read_in_flight()?;
        for Removed { row, caches } in self.batch.remove(Row::paused, |_| true)? {
            match caches {
                Some(caches) => self.parked.push(Parked { row, caches }),
                None => self.fail_row(row, "parking the row failed: its KV cache could not be extracted".into()),
            }
        }
        Ok(())
    }

    /// Puts rows whose consumer resumed them back into the batch, after the rows there.
    fn resume_parked(&mut self) -> Result<()> {
        if !self.has_resumable() {
            return Ok(());
        }
        let (resumed, still): (Vec<Parked>, Vec<Parked>) = std::mem::take(&mut self.parked).into_iter().partition(|p| !p.row.paused());
        self.parked = still;
        let joining = self.joining_batch(resumed.into_iter().map(|p| (p.row, p.caches)).collect());
        self.join(joining);
        Ok(())
    }

    /// Fails every prefilling, parked and decoding row.
    pub fn fail_all(&mut self, message: &str) {
        for p in std::mem::take(&mut self.prefilling) {
            self.fail_row(p.row, message.to_string());
        }
        for p in std::mem::take(&mut self.parked) {
            self.fail_row(p.row, message.to_string());
        }
        self.fail_batch(&Error::Mlx(message.to_string()));
    }

    /// A failed batched step fails every row in it (each gets an error event, rows that had
    /// already finished get their own final event); the engine keeps serving the queue.
    fn fail_batch(&mut self, e: &Error) {
        for r in self.batch.clear() {
            self.retire_or_fail(r, e);
        }
    }

    fn retire_or_fail(&mut self, row: Row, e: &Error) {
        if row.finish.is_some() {
            self.retire(Removed { row, caches: None });
        } else {
            self.fail_row(row, format!("generation failed: {e}"));
        }
    }
}

/// Builds the step's token choice for every row of `rows` from the batch's last-position
/// `logits` (`[B, V]`), on the device: `[B]` uint32 tokens and, for rows that asked, their
/// float32 log-probability rows. `pending` is the unread step that produced this step's inputs
/// (its tokens are the newest history of the rows it covers, for the penalties). Batched
/// wherever the rows allow, so the op count grows with the kinds of rows, not their number:
/// one `[B, V]` mask bias (zeros leave unconstrained rows bit-identical), mlx-lm's processors
/// row by row for the rows that have them, one logprobs and argmax over the batch, one
/// [`draw_rows`] over the sampled rows. Rows already finished get a throwaway argmax.
fn choose(rows: &mut [Row], logits: &Array, pending: Option<&InFlight>, fast: bool) -> Result<(Array, Vec<Option<Array>>)> {
    let live = |r: &Row| r.finish.is_none();
    let mut logits = logits.clone();
    if rows.iter().any(|r| live(r) && r.needs_host_choice()) {
        let width = *logits.shape().last().unwrap_or(&0) as usize;
        logits = logits.add(&constrained::batch_bias(rows, width, logits.dtype())?)?;
    }
    let processed: Vec<usize> = (0..rows.len()).filter(|&b| live(&rows[b]) && rows[b].sampler.params().has_processors()).collect();
    if !processed.is_empty() {
        let new_rows: Vec<Array> = processed
            .iter()
            .map(|&b| {
                let newest = pending.filter(|f| b < f.rows).map(|f| f.tokens.index(b as i32..b as i32 + 1));
                rows[b].sampler.process_logits_pending(&logits.index(b as i32..b as i32 + 1), newest.as_ref())
            })
            .collect::<Result<_>>()?;
        logits = replace_rows(&logits, &processed, &concatenate(&new_rows, 0)?)?;
    }
    let lp = Sampler::logprobs_with(&logits, fast)?;
    let mut tokens = Sampler::argmax(&lp)?;
    let sampled: Vec<usize> = (0..rows.len()).filter(|&b| live(&rows[b]) && rows[b].sampler.params().temperature > 0.0).collect();
    if !sampled.is_empty() {
        let idx: Vec<i32> = sampled.iter().map(|&b| b as i32).collect();
        let sub = lp.take_axis(&Array::from_slice(&idx, &[idx.len() as i32]), 0)?.as_dtype(Dtype::Float32)?;
        let mut samplers: Vec<&mut Sampler> =
            rows.iter_mut().enumerate().filter(|(b, _)| sampled.binary_search(b).is_ok()).map(|(_, r)| &mut r.sampler).collect();
        tokens = replace_rows(&tokens, &sampled, &draw_rows(&sub, &mut samplers)?)?;
    }
    let logprobs = rows
        .iter()
        .enumerate()
        .map(|(b, r)| (live(r) && r.logprobs.is_some()).then(|| lp.index(b as i32..b as i32 + 1).as_dtype(Dtype::Float32)).transpose())
        .collect::<std::result::Result<_, _>>()?;
    Ok((tokens, logprobs))
}

/// `base` (`[B, ...]`) with rows `at` (ascending) replaced by the rows of `new`, in order.
fn replace_rows(base: &Array, at: &[usize], new: &Array) -> Result<Array> {
    let b = base.shape()[0] as usize;
    let mut map: Vec<i32> = (0..b as i32).collect();
    for (j, &row) in at.iter().enumerate() {
        map[row] = (b + j) as i32;
    }
    let both = concatenate(&[base.clone(), new.clone()], 0)?;
    Ok(both.take_axis(&Array::from_slice(&map, &[b as i32]), 0)?)
}

impl<M: ModelHandle> Drop for Executor<M> {
    fn drop(&mut self) {
        // An unread pipelined step may still be computing into the batch caches.
        self.batch.in_flight = None;
        crate::nn::synchronize();
    }
}
