//! MLX execution for the engine: rows prefill alone in chunks (their own single-sequence
//! caches, exactly mlx-lm's single-sequence numerics), produce their first token from the last
//! prompt token, then join the running batch (`into_batched` + `extend_rows`). The batch decodes
//! one token per row per step; finished rows leave through `filter_rows`.
//!
//! Pipelining: when every row is plain greedy, step n+1 is built from step n's unread token
//! array and evaluated asynchronously before step n's tokens are read. Joins append rows after
//! the in-flight ones and evictions filter the in-flight array too, so neither needs a flush; a
//! row with host-side sampling makes the step synchronous.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use mlx_rs::ops::concatenate;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::transforms::{async_eval, eval};
use mlx_rs::{Array, Dtype};

use super::prompt_cache::PromptCache;
use super::faults::Faults;
use super::{Event, EventSink, RequestId, RowFlow, StopCause, Submission, TokenLogprobs, Usage};
use crate::cache::{extend_rows_mixed, maybe_quantize, KvCache, KvQuantization};
use crate::generate::{as_f32_slice, prefill_with, FinishReason};
use crate::models::LanguageModel;
use crate::nn::last_position;
use crate::sampling::{first_argmax, Sampler};
use crate::stop::{StopMatcher, TextStream};
use crate::tokenizer::Tokenizer;
use crate::{Error, Result};

/// The chosen token's log-probability and the `k` best alternatives (first index on ties).
fn token_logprobs(row: &[f32], token: u32, k: usize) -> TokenLogprobs {
    let mut order: Vec<usize> = (0..row.len()).collect();
    let k = k.min(row.len());
    if k > 0 {
        order.select_nth_unstable_by(k - 1, |&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
        order.truncate(k);
        order.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
    } else {
        order.clear();
    }
    TokenLogprobs {
        logprob: row.get(token as usize).copied().unwrap_or(f32::NEG_INFINITY),
        top: order.into_iter().map(|i| (i as u32, row[i])).collect(),
    }
}

/// The first `n` values of a logits row, as float32 (empty if it cannot be read).
fn leading_values(row: &Array, n: usize) -> Vec<f32> {
    let Ok(row) = row.as_dtype(Dtype::Float32) else { return Vec::new() };
    if row.eval().is_err() {
        return Vec::new();
    }
    as_f32_slice(&row).map(|v| v[..n.min(v.len())].to_vec()).unwrap_or_default()
}

/// One request from admission to its final event.
pub(super) struct Row {
    pub id: RequestId,
    prompt: Vec<u32>,
    generated: Vec<u32>,
    max_tokens: usize,
    stop_token_ids: Vec<u32>,
    sampler: Sampler,
    text: TextStream,
    sink: EventSink,
    flow: Option<RowFlow>,
    cached_tokens: usize,
    capture_first_logits: usize,
    first_logits: Vec<f32>,
    /// Top alternatives to report with each token's log-probability, if requested.
    logprobs: Option<usize>,
    pub projected_kv_bytes: u64,
    /// The last token, not yet forwarded (host-known rows only; in-flight rows have it on device).
    next_input: Option<u32>,
    finish: Option<FinishReason>,
    /// What ended a `Stop` finish.
    stop: Option<StopCause>,
    /// Set when the row failed (reported instead of `Done`).
    error: Option<String>,
}

impl Row {
    /// The consumer asked this row to wait (and it has not finished).
    fn paused(&self) -> bool {
        self.finish.is_none() && self.flow.as_ref().is_some_and(|f| f.is_paused())
    }

    /// Applies a sampled token: stop checks, text streaming, the consumer's verdict.
    /// `logprobs` is the step's log-probability row when the request asked for them.
    fn accept(&mut self, token: u32, context_left: usize, logprobs: Option<&[f32]>) -> Result<()> {
        if self.stop_token_ids.contains(&token) {
            self.finish = Some(FinishReason::Stop);
            self.stop = Some(StopCause::Eos { token_id: token });
            return Ok(());
        }
        self.generated.push(token);
        self.sampler.observe(&[token]);
        self.next_input = Some(token);
        let (text, hit_stop) = self.text.push(token)?;
        if let Some(stop) = hit_stop {
            self.finish = Some(FinishReason::Stop);
            self.stop = Some(StopCause::StopString { stop });
        } else if self.generated.len() >= self.max_tokens || context_left == 0 {
            self.finish = Some(FinishReason::Length);
        }
        let logprobs = match (self.logprobs, logprobs) {
            (Some(k), Some(row)) => Some(token_logprobs(row, token, k)),
            _ => None,
        };
        if !self.sink.token(&Event::Token { token_id: token, text, logprobs }) {
            self.finish = Some(FinishReason::Cancelled);
            self.stop = None;
        }
        Ok(())
    }

    /// Sends the final `Done`, with the text still held back (a possible stop-string prefix,
    /// an incomplete character) unless a stop string cut the output or the row was cancelled.
    fn finish(mut self, reason: FinishReason) {
        let text = match (reason, &self.stop) {
            (FinishReason::Cancelled, _) | (_, Some(StopCause::StopString { .. })) => Ok(String::new()),
            _ => self.text.finish(),
        };
        let text = match text {
            Ok(text) => text,
            Err(e) => return self.fail(format!("decoding the final text failed: {e}")),
        };
        let usage = Usage {
            prompt_tokens: self.prompt.len(),
            completion_tokens: self.generated.len(),
            cached_tokens: self.cached_tokens,
        };
        let first_logits = std::mem::take(&mut self.first_logits);
        let stop = if reason == FinishReason::Stop { self.stop.take() } else { None };
        self.sink.close(Event::Done { finish_reason: reason, stop, text, usage, first_logits });
    }

    /// Sends the final event this row has earned: its error if it failed, else `Done`.
    fn close(self) {
        match (self.error.clone(), self.finish) {
            (Some(message), _) => self.fail(message),
            (None, Some(reason)) => self.finish(reason),
            (None, None) => self.fail("the row ended without a finish reason".into()),
        }
    }

    fn fail(mut self, message: String) {
        self.sink.close(Event::Error { message });
    }

    /// The tokens whose KV a cache of `len` positions holds for this row.
    fn cached_sequence(&self, len: usize) -> Vec<u32> {
        self.prompt.iter().chain(&self.generated).take(len).copied().collect()
    }
}

/// A decoding row set aside while its consumer catches up, with its KV as single-sequence
/// caches (what `extract_row` gives); it rejoins like a newly prefilled row.
struct Parked {
    row: Row,
    caches: Vec<Box<dyn KvCache>>,
}

struct Prefilling {
    row: Row,
    caches: Vec<Box<dyn KvCache>>,
    /// Prompt positions already in `caches`.
    done: usize,
}

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
}

/// Tokens of a decode step still being computed, for the first `rows` rows of the batch.
struct InFlight {
    tokens: Array,
    rows: usize,
}

pub(super) struct Executor {
    model: Box<dyn LanguageModel>,
    tokenizer: Option<Tokenizer>,
    prefill_step_size: usize,
    prefilling: VecDeque<Prefilling>,
    rows: Vec<Row>,
    /// Per-layer batched caches of `rows` (None when no row is decoding).
    batch: Option<Vec<Box<dyn KvCache>>>,
    in_flight: Option<InFlight>,
    parked: Vec<Parked>,
    /// KV quantization applied after every forward (None = full precision).
    kv: Option<KvQuantization>,
    /// Injected failures still to fire.
    faults: Faults,
    pub prompt_cache: PromptCache,
    pub decode_steps: u64,
    pub timing: StepTiming,
    pub tokens_generated: u64,
    pub finished: u64,
}

impl Executor {
    pub fn new(
        model: Box<dyn LanguageModel>,
        tokenizer: Option<Tokenizer>,
        prefill_step_size: usize,
        prompt_cache_bytes: u64,
    ) -> Self {
        Executor {
            model,
            tokenizer,
            prefill_step_size,
            prefilling: VecDeque::new(),
            rows: Vec::new(),
            batch: None,
            in_flight: None,
            parked: Vec::new(),
            kv: None,
            faults: Faults::default(),
            prompt_cache: PromptCache::new(prompt_cache_bytes),
            decode_steps: 0,
            timing: StepTiming::default(),
            tokens_generated: 0,
            finished: 0,
        }
    }

    /// Quantize rows' KV caches as `kv` says (mlx-lm's `maybe_quantize_kv_cache` after every
    /// forward, applied to the solo prefill caches and the batch alike).
    pub fn with_kv_quantization(mut self, kv: Option<KvQuantization>) -> Self {
        self.kv = kv;
        self
    }

    /// Fail or panic at the decode steps `faults` names (fault-injection tests).
    pub fn with_faults(mut self, faults: Faults) -> Self {
        self.faults = faults;
        self
    }

    pub fn model(&self) -> &dyn LanguageModel {
        self.model.as_ref()
    }

    pub fn decoding(&self) -> usize {
        self.rows.len()
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
        self.rows.iter().map(|r| r.projected_kv_bytes).sum::<u64>()
            + self.prefilling.iter().map(|p| p.row.projected_kv_bytes).sum::<u64>()
            + self.parked.iter().map(|p| p.row.projected_kv_bytes).sum::<u64>()
    }

    pub fn kv_bytes_in_use(&self) -> u64 {
        let batch: usize = self.batch.iter().flatten().map(|c| c.nbytes()).sum();
        let solo: usize = self.prefilling.iter().flat_map(|p| &p.caches).map(|c| c.nbytes()).sum();
        let parked: usize = self.parked.iter().flat_map(|p| &p.caches).map(|c| c.nbytes()).sum();
        (batch + solo + parked) as u64
    }

    /// Starts a request: reuses a cached prefix if there is one, then queues its prefill.
    pub fn admit(&mut self, sub: Submission, projected_kv_bytes: u64) {
        let Submission { id, prompt, request, stop_token_ids, sink, flow } = sub;
        let mut sampler = Sampler::new(request.sampling.clone());
        sampler.observe(&prompt);
        let row = Row {
            id,
            generated: Vec::new(),
            max_tokens: request.max_tokens,
            stop_token_ids,
            sampler,
            text: TextStream::new(self.tokenizer.as_ref(), StopMatcher::new(&request.stop)),
            sink,
            flow,
            cached_tokens: 0,
            capture_first_logits: request.capture_first_logits,
            logprobs: request.logprobs,
            first_logits: Vec::new(),
            projected_kv_bytes,
            next_input: None,
            finish: None,
            stop: None,
            error: None,
            prompt,
        };
        let reuse = if self.prompt_cache.enabled() {
            self.prompt_cache.lookup(&row.prompt, row.prompt.len() - 1)
        } else {
            None
        };
        let (caches, done) = match reuse {
            Some((caches, n)) => (caches, n),
            None => (self.model.make_caches(), 0),
        };
        let mut p = Prefilling { row, caches, done };
        p.row.cached_tokens = done;
        self.prefilling.push_back(p);
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
        if let Some(pos) = self.rows.iter().position(|r| r.id == id) {
            self.rows[pos].finish = Some(FinishReason::Cancelled);
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
            .chain(self.rows.iter().map(|r| r.id))
            .collect();
        for id in ids {
            self.cancel(id);
        }
    }

    /// Prefills up to one chunk (`prefill_step_size` tokens) of waiting prompts, oldest first,
    /// so decoding rows stall at most one chunk; rows whose prompt is in then take their first
    /// step together and join the batch.
    pub fn prefill_step(&mut self) {
        let mut budget = self.prefill_step_size;
        let mut ready = Vec::new();
        while let Some(mut p) = self.prefilling.pop_front() {
            let target = p.row.prompt.len() - 1;
            if p.done < target {
                if budget == 0 {
                    self.prefilling.push_front(p);
                    break;
                }
                let end = (p.done + budget).min(target);
                let chunk = &p.row.prompt[p.done..end];
                if let Err(e) = prefill_with(self.model.as_ref(), &mut p.caches, chunk, end - p.done, self.kv.as_ref()) {
                    self.finished += 1;
                    p.row.fail(format!("prefill failed: {e}"));
                    continue;
                }
                budget -= end - p.done;
                p.done = end;
                if p.done < target {
                    self.prefilling.push_front(p);
                    break;
                }
            }
            ready.push(p);
        }
        if !ready.is_empty() {
            self.first_tokens(ready);
        }
    }

    /// Forwards each ready row's last prompt token (mlx-lm's convention) in one batched step,
    /// samples first tokens, and moves the rows that continue into the running batch.
    fn first_tokens(&mut self, group: Vec<Prefilling>) {
        let mut rows = Vec::with_capacity(group.len());
        let mut caches: Option<Vec<Box<dyn KvCache>>> = None;
        let mut merge = |row_caches: Vec<Box<dyn KvCache>>| -> Result<()> {
            let batched: Vec<Box<dyn KvCache>> = row_caches.into_iter().map(|c| c.into_batched()).collect::<Result<_>>()?;
            match caches.as_mut() {
                None => caches = Some(batched),
                Some(cs) => cs.iter_mut().zip(batched).try_for_each(|(c, b)| extend_rows_mixed(c, b))?,
            }
            Ok(())
        };
        for p in group {
            match merge(p.caches) {
                Ok(()) => rows.push(p.row),
                Err(e) => {
                    self.finished += 1;
                    p.row.fail(format!("joining the batch failed: {e}"));
                }
            }
        }
        let Some(mut caches) = caches else { return };
        let result = (|| -> Result<Vec<(u32, Array, Array)>> {
            let last: Vec<u32> = rows.iter().map(|r| *r.prompt.last().unwrap()).collect();
            let input = Array::from_slice(&last, &[last.len() as i32, 1]);
            let logits = last_position(&self.model.forward(&input, &mut caches)?)?;
            maybe_quantize(&mut caches, self.kv.as_ref())?;
            let per_row: Vec<(Array, Array)> = rows
                .iter()
                .enumerate()
                .map(|(b, r)| {
                    let row_logits = logits.index(b as i32..b as i32 + 1);
                    let lp = Sampler::logprobs(&r.sampler.process_logits(&row_logits)?)?.as_dtype(Dtype::Float32)?;
                    Ok((lp, row_logits))
                })
                .collect::<Result<_>>()?;
            eval(per_row.iter().map(|(lp, _)| lp))?;
            rows.iter_mut()
                .zip(per_row)
                .map(|(r, (lp, row_logits))| Ok((r.sampler.sample_host(as_f32_slice(&lp)?), lp, row_logits)))
                .collect()
        })();
        let chosen = match result {
            Ok(c) => c,
            Err(e) => {
                for r in rows {
                    self.finished += 1;
                    r.fail(format!("generation failed: {e}"));
                }
                return;
            }
        };
        for (r, (token, lp, row_logits)) in rows.iter_mut().zip(chosen) {
            if r.capture_first_logits > 0 {
                r.first_logits = leading_values(&row_logits, r.capture_first_logits);
            }
            let left = self.context_left(r);
            self.tokens_generated += 1;
            let lp = as_f32_slice(&lp).ok();
            if let Err(e) = r.accept(token, left, lp) {
                r.error = Some(e.to_string());
                r.finish = Some(FinishReason::Stop);
            }
        }
        // Rows done after one token leave now (their KV goes to the prompt cache).
        let keep: Vec<usize> = (0..rows.len()).filter(|&i| rows[i].finish.is_none()).collect();
        for (i, r) in rows.iter().enumerate() {
            if r.finish.is_some() && self.prompt_cache.enabled() {
                if let Ok(row_caches) = caches.iter().map(|c| c.extract_row(i)).collect::<Result<Vec<_>>>() {
                    let len = row_caches.first().map_or(0, |c| c.len());
                    self.prompt_cache.insert(r.cached_sequence(len), row_caches);
                }
            }
        }
        let (staying, leaving): (Vec<Row>, Vec<Row>) = rows.into_iter().partition(|r| r.finish.is_none());
        for r in leaving {
            self.finished += 1;
            r.close();
        }
        if staying.is_empty() {
            return;
        }
        let joined = (|| -> Result<()> {
            if keep.len() < caches.first().map_or(0, |c| c.rows()) {
                caches.iter_mut().try_for_each(|c| c.filter_rows(&keep))?;
            }
            self.append_to_batch(caches)
        })();
        match joined {
            Ok(()) => self.rows.extend(staying),
            Err(e) => {
                for r in staying {
                    self.finished += 1;
                    r.fail(format!("joining the batch failed: {e}"));
                }
                self.fail_batch(&e);
            }
        }
    }

    fn context_left(&self, row: &Row) -> usize {
        match self.model.info().max_position_embeddings {
            Some(ctx) => ctx.saturating_sub(row.prompt.len() + row.generated.len() + 1),
            None => usize::MAX,
        }
    }

    /// One batched decode step (after parking paused rows and returning resumed ones).
    pub fn decode_step(&mut self) {
        if let Err(e) = self.resume_parked().and_then(|()| self.park_paused()) {
            self.fail_batch(&e);
        }
        if self.rows.is_empty() {
            return;
        }
        if let Err(e) = self.try_decode_step() {
            self.fail_batch(&e);
        }
    }

    fn try_decode_step(&mut self) -> Result<()> {
        // Rows wanting log-probabilities need their row on the host, as sampled rows do.
        let pipelined = self.rows.iter().all(|r| r.sampler.params().is_plain_greedy() && r.logprobs.is_none());
        if !pipelined {
            self.read_in_flight()?;
            if self.rows.is_empty() {
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
        let started = Instant::now();
        let inputs = self.step_inputs()?;
        let batch = self.batch.as_mut().ok_or_else(|| Error::Mlx("decoding rows without a batch cache".into()))?;
        let logits = last_position(&self.model.forward(&inputs, batch)?)?;
        maybe_quantize(batch, self.kv.as_ref())?;
        self.decode_steps += 1;
        for r in &mut self.rows {
            r.next_input = None;
        }
        if pipelined {
            let next = Sampler::argmax(&Sampler::logprobs(&logits)?)?;
            self.timing.graph_build += started.elapsed();
            let submit = Instant::now();
            async_eval([&next])?;
            self.timing.eval_wait += submit.elapsed();
            let previous = self.in_flight.replace(InFlight { tokens: next, rows: self.rows.len() });
            if let Some(prev) = previous {
                self.deliver(&prev)?;
            }
        } else {
            let mut chosen = Vec::with_capacity(self.rows.len());
            let lps: Vec<Array> = self
                .rows
                .iter()
                .enumerate()
                .map(|(b, r)| {
                    let row_logits = logits.index(b as i32..b as i32 + 1);
                    Sampler::logprobs(&r.sampler.process_logits(&row_logits)?)?.as_dtype(Dtype::Float32).map_err(Error::from)
                })
                .collect::<Result<_>>()?;
            self.timing.graph_build += started.elapsed();
            let wait = Instant::now();
            eval(&lps)?;
            self.timing.eval_wait += wait.elapsed();
            let host = Instant::now();
            for (r, lp) in self.rows.iter_mut().zip(&lps) {
                let v = as_f32_slice(lp)?;
                chosen.push(if r.sampler.params().temperature == 0.0 { first_argmax(v) } else { r.sampler.sample_host(v) });
            }
            for (b, token) in chosen.into_iter().enumerate() {
                let lp = as_f32_slice(&lps[b]).ok();
                self.accept_at(b, token, lp);
            }
            self.evict_finished()?;
            self.timing.host += host.elapsed();
        }
        Ok(())
    }

    /// Gives batch row `b` its token; a row whose text handling fails is failed alone.
    fn accept_at(&mut self, b: usize, token: u32, logprobs: Option<&[f32]>) {
        let left = self.context_left(&self.rows[b]);
        self.tokens_generated += 1;
        let row = &mut self.rows[b];
        if let Err(e) = row.accept(token, left, logprobs) {
            row.error = Some(e.to_string());
            row.finish = Some(FinishReason::Stop);
        }
    }

    /// `[B, 1]` inputs: the in-flight tokens (on device) for the rows they cover, then the
    /// host-known last tokens of rows that joined after.
    fn step_inputs(&self) -> Result<Array> {
        let covered = self.in_flight.as_ref().map_or(0, |f| f.rows);
        let host: Vec<u32> = self.rows[covered..]
            .iter()
            .map(|r| r.next_input.ok_or_else(|| Error::Mlx("a decoding row has no input token".into())))
            .collect::<Result<_>>()?;
        let host = Array::from_slice(&host, &[host.len() as i32]);
        let tokens = match &self.in_flight {
            Some(f) if host.size() == 0 => f.tokens.clone(),
            Some(f) => concatenate(&[f.tokens.clone(), host], 0)?,
            None => host,
        };
        Ok(tokens.reshape(&[-1, 1])?)
    }

    /// Reads an in-flight step's tokens and hands them to their rows.
    fn deliver(&mut self, flight: &InFlight) -> Result<()> {
        let wait = Instant::now();
        flight.tokens.eval()?;
        self.timing.eval_wait += wait.elapsed();
        let host = Instant::now();
        let tokens = flight
            .tokens
            .try_as_slice::<u32>()
            .map_err(|e| Error::Mlx(format!("reading tokens: {e}")))?
            .to_vec();
        for (b, token) in tokens.into_iter().enumerate().take(flight.rows) {
            if self.rows[b].finish.is_some() {
                continue;
            }
            self.accept_at(b, token, None);
        }
        let evicted = self.evict_finished();
        self.timing.host += host.elapsed();
        evicted
    }

    /// Reads the pending step (if any) so every row's last token is known on the host.
    fn read_in_flight(&mut self) -> Result<()> {
        if let Some(f) = self.in_flight.take() {
            self.deliver(&f)?;
            // The rows it covered now hold their input on the host (set by `accept`).
        }
        Ok(())
    }

    /// Removes finished rows from the batch (caches and in-flight tokens), saving their KV to
    /// the prompt cache and sending their final events.
    fn evict_finished(&mut self) -> Result<()> {
        if self.rows.iter().all(|r| r.finish.is_none()) {
            return Ok(());
        }
        let keep: Vec<usize> = (0..self.rows.len()).filter(|&i| self.rows[i].finish.is_none()).collect();
        if self.prompt_cache.enabled() {
            for i in 0..self.rows.len() {
                if self.rows[i].finish.is_some() {
                    if let Some(batch) = &self.batch {
                        let caches: Result<Vec<_>> = batch.iter().map(|c| c.extract_row(i)).collect();
                        if let Ok(caches) = caches {
                            let len = caches.first().map_or(0, |c| c.len());
                            let tokens = self.rows[i].cached_sequence(len);
                            self.prompt_cache.insert(tokens, caches);
                        }
                    }
                }
            }
        }
        if let Some(f) = self.in_flight.as_mut() {
            let kept: Vec<u32> = keep.iter().filter(|&&i| i < f.rows).map(|&i| i as u32).collect();
            if kept.is_empty() {
                self.in_flight = None;
            } else {
                let idx = Array::from_slice(&kept, &[kept.len() as i32]);
                f.tokens = f.tokens.take_axis(&idx, 0)?;
                f.rows = kept.len();
            }
        }
        let rows = std::mem::take(&mut self.rows);
        let mut finished = Vec::new();
        for r in rows {
            if r.finish.is_some() {
                finished.push(r);
            } else {
                self.rows.push(r);
            }
        }
        if self.rows.is_empty() {
            self.batch = None;
            self.in_flight = None;
        } else if let Some(batch) = self.batch.as_mut() {
            for c in batch.iter_mut() {
                c.filter_rows(&keep)?;
            }
        }
        for r in finished {
            self.finished += 1;
            r.close();
        }
        Ok(())
    }

    /// Appends batched caches' rows after the batch's own (or starts the batch with them).
    fn append_to_batch(&mut self, caches: Vec<Box<dyn KvCache>>) -> Result<()> {
        match self.batch.as_mut() {
            None => self.batch = Some(caches),
            Some(batch) => batch.iter_mut().zip(caches).try_for_each(|(b, c)| extend_rows_mixed(b, c))?,
        }
        Ok(())
    }

    /// Takes rows whose consumer paused them out of the batch. The pending pipelined step is
    /// read first so every row's last token is known on the host when it rejoins.
    fn park_paused(&mut self) -> Result<()> {
        if !self.rows.iter().any(Row::paused) {
            return Ok(());
        }
        self.read_in_flight()?;
        let (park, keep): (Vec<usize>, Vec<usize>) = (0..self.rows.len()).partition(|&i| self.rows[i].paused());
        if park.is_empty() {
            return Ok(());
        }
        let batch = self.batch.as_mut().ok_or_else(|| Error::Mlx("decoding rows without a batch cache".into()))?;
        let mut caches = park
            .iter()
            .map(|&i| batch.iter().map(|c| c.extract_row(i)).collect::<Result<Vec<_>>>())
            .collect::<Result<Vec<_>>>()?;
        if keep.is_empty() {
            self.batch = None;
        } else {
            batch.iter_mut().try_for_each(|c| c.filter_rows(&keep))?;
        }
        let mut parked_rows = Vec::with_capacity(park.len());
        for (i, row) in std::mem::take(&mut self.rows).into_iter().enumerate() {
            if park.contains(&i) {
                parked_rows.push(row);
            } else {
                self.rows.push(row);
            }
        }
        for row in parked_rows.into_iter().rev() {
            self.parked.push(Parked { row, caches: caches.pop().unwrap() });
        }
        Ok(())
    }

    /// Puts rows whose consumer resumed them back into the batch, after the rows there.
    fn resume_parked(&mut self) -> Result<()> {
        let mut i = 0;
        while i < self.parked.len() {
            if self.parked[i].row.paused() {
                i += 1;
                continue;
            }
            let Parked { row, caches } = self.parked.remove(i);
            let joined = caches
                .into_iter()
                .map(|c| c.into_batched())
                .collect::<Result<Vec<_>>>()
                .and_then(|caches| self.append_to_batch(caches));
            match joined {
                Ok(()) => self.rows.push(row),
                Err(e) => {
                    self.finished += 1;
                    row.fail(format!("resuming the row failed: {e}"));
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// Fails every prefilling, parked and decoding row.
    pub fn fail_all(&mut self, message: &str) {
        for p in std::mem::take(&mut self.prefilling) {
            self.finished += 1;
            p.row.fail(message.to_string());
        }
        for p in std::mem::take(&mut self.parked) {
            self.finished += 1;
            p.row.fail(message.to_string());
        }
        self.fail_batch(&Error::Mlx(message.to_string()));
    }

    /// A failed batched step fails every row in it (each gets an error event); the engine
    /// keeps serving the queue.
    fn fail_batch(&mut self, e: &Error) {
        self.batch = None;
        self.in_flight = None;
        for r in std::mem::take(&mut self.rows) {
            self.finished += 1;
            match (r.finish, &r.error) {
                (Some(_), _) => r.close(),
                (None, _) => r.fail(format!("generation failed: {e}")),
            }
        }
    }

}

impl Drop for Executor {
    fn drop(&mut self) {
        // An unread pipelined step may still be computing into the batch caches.
        self.in_flight = None;
        crate::nn::synchronize();
    }
}
