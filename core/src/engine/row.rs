//! One request's row from admission to its final event: the state machine that turns sampled
//! tokens into events (stop ids, streamed text and stop strings, the length limit, the
//! consumer's verdict) and ends with exactly one `Done` or `Error`.

use mlx_rs::{Array, Dtype};

use super::media::RowMedia;
use super::thinking::RowReasoning;
use super::{Event, EventSink, RequestId, RowFlow, StopCause, Submission, TokenLogprobs, Usage};
use crate::cache::KvCache;
use crate::constrain::RowConstraint;
use crate::prefill::as_f32_slice;
use crate::stop::FinishReason;
use crate::sampling::Sampler;
use crate::stop::{StopMatcher, TextStream};
use crate::tokenizer::Tokenizer;
use crate::reasoning::Split;
use crate::tools::{ToolCallParser, ToolDelta};
use crate::Result;

/// The chosen token's log-probability and the `k` best alternatives (first index on ties).
pub(super) fn token_logprobs(row: &[f32], token: u32, k: usize) -> TokenLogprobs {
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
pub(super) fn leading_values(row: &Array, n: usize) -> Vec<f32> {
    let Ok(row) = row.as_dtype(Dtype::Float32) else { return Vec::new() };
    if row.eval().is_err() {
        return Vec::new();
    }
    as_f32_slice(&row).map(|v| v[..n.min(v.len())].to_vec()).unwrap_or_default()
}

/// One request from admission to its final event.
pub(super) struct Row {
    pub id: RequestId,
    pub(super) prompt: Vec<u32>,
    pub(super) generated: Vec<u32>,
    pub(super) max_tokens: usize,
    pub(super) stop_token_ids: Vec<u32>,
    pub(super) sampler: Sampler,
    pub(super) text: TextStream,
    pub(super) sink: EventSink,
    pub(super) flow: Option<RowFlow>,
    pub(super) cached_tokens: usize,
    pub(super) capture_first_logits: usize,
    pub(super) first_logits: Vec<f32>,
    /// Top alternatives to report with each token's log-probability, if requested.
    pub(super) logprobs: Option<usize>,
    pub projected_kv_bytes: u64,
    /// The last token, not yet forwarded (host-known rows only; in-flight rows have it on device).
    pub(super) next_input: Option<u32>,
    /// Tokens of `prompt ++ generated` the draft model's cache holds (speculative decoding).
    pub(super) draft_fed: usize,
    pub(super) finish: Option<FinishReason>,
    /// What ended a `Stop` finish.
    pub(super) stop: Option<StopCause>,
    /// Set when the row failed (reported instead of `Done`).
    pub(super) error: Option<String>,
    /// Finds tool calls in the streamed text (requests with tools).
    pub(super) tool_parser: Option<ToolCallParser>,
    /// Generation ends after this many complete calls ([`crate::tools::Tools::call_limit`]).
    pub(super) tool_call_limit: Option<usize>,
    /// Deltas of the call being written, held until it is complete: a call the output never
    /// finishes (cut by `max_tokens`) is never delivered, not even in part.
    pub(super) held_deltas: Vec<ToolDelta>,
    /// The model's reasoning block, for a template that marks one.
    pub(super) reasoning: Option<RowReasoning>,
    /// The request's compiled constraint (`None`: free text). Taken out of the row while its
    /// next mask is computed ([`super::constrained`]).
    pub(super) constraint: Option<RowConstraint>,
    /// Soft tokens of the prompt's images (empty: a text row).
    pub(super) media: RowMedia,
    /// The prompt as the prompt cache names it, when it has images ([`super::media::cache_key`]).
    pub(super) cache_key: Option<Vec<u32>>,
    /// The request's draft length for speculative decoding (`None`: the engine's).
    pub(super) num_draft_tokens: Option<usize>,
    /// Prompt positions to snapshot into the prompt cache while prefilling, ascending
    /// ([`Submission::checkpoints`]).
    pub(super) checkpoints: Vec<usize>,
}

impl Row {
    /// The consumer asked this row to wait (and it has not finished).
    pub(super) fn paused(&self) -> bool {
        self.finish.is_none() && self.flow.as_ref().is_some_and(|f| f.is_paused())
    }

    /// Applies a sampled token: stop checks, text streaming, the consumer's verdict.
    /// `logprobs` is the step's log-probability row when the request asked for them.
    pub(super) fn accept(&mut self, token: u32, context_left: usize, logprobs: Option<&[f32]>) -> Result<()> {
        if self.stop_token_ids.contains(&token) {
            self.finish = Some(FinishReason::Stop);
            self.stop = Some(StopCause::Eos { token_id: token });
            return Ok(());
        }
        self.generated.push(token);
        self.sampler.observe(&[token]);
        self.next_input = Some(token);
        // The reasoning block is not the answer: a constraint starts after it.
        let in_reasoning = self.reasoning.as_mut().is_some_and(|r| r.observe(token));
        let complete = match self.constraint.as_mut() {
            Some(c) if !in_reasoning => {
                c.commit(token)?;
                c.is_finished()
            }
            _ => false,
        };
        let (text, hit_stop) = self.text.push(token)?;
        if let Some(stop) = hit_stop {
            self.finish = Some(FinishReason::Stop);
            self.stop = Some(StopCause::StopString { stop });
        } else if complete {
            self.finish = Some(FinishReason::Stop);
            self.stop = Some(StopCause::Constraint);
        } else if self.generated.len() >= self.max_tokens || context_left == 0 {
            self.finish = Some(FinishReason::Length);
        }
        let logprobs = self.logprobs_for(token, logprobs);
        let Split { reasoning, content } = self.split(&text);
        let (text, tool_calls) = match &mut self.tool_parser {
            Some(parser) => {
                let parsed = parser.push(&content);
                if self.finish.is_none() && self.tool_call_limit.is_some_and(|n| parser.completed_calls() >= n) {
                    self.finish = Some(FinishReason::Stop);
                    self.stop = Some(StopCause::ToolCallLimit);
                }
                (parsed.text, self.release_complete_calls(parsed.deltas))
            }
            None => (content, Vec::new()),
        };
        if !self.sink.token(&Event::Token { token_id: token, text, reasoning, logprobs, tool_calls }) {
            self.finish = Some(FinishReason::Cancelled);
            self.stop = None;
        }
        Ok(())
    }

    /// Sends the final `Done`, with the text still held back (a possible stop-string prefix,
    /// an incomplete character) unless a stop string cut the output or the row was cancelled.
    pub(super) fn finish(mut self, reason: FinishReason) {
        let text = match (reason, &self.stop) {
            (FinishReason::Cancelled, _) | (_, Some(StopCause::StopString { .. })) => Ok(String::new()),
            _ => self.text.finish(),
        };
        let text = match text {
            Ok(text) => text,
            Err(e) => return self.fail(format!("decoding the final text failed: {e}")),
        };
        let Split { reasoning, content: mut text } = match (&mut self.reasoning, reason) {
            (Some(r), reason) if reason != FinishReason::Cancelled => {
                let mut split = r.push(&text);
                split.append(r.finish());
                split
            }
            _ => Split { reasoning: String::new(), content: text },
        };
        // The parser's own tail: the pieces it releases here go out with `Done`, so the
        // streamed deltas always assemble to the final calls. Only complete calls count: one
        // the output cut short is dropped with its held deltas.
        let (tool_deltas, tool_calls) = match &mut self.tool_parser {
            Some(parser) if reason != FinishReason::Cancelled => {
                let pushed = parser.push(&text);
                let tail = parser.finish();
                text = pushed.text + &tail.text;
                let complete = parser.completed_calls();
                let calls = parser.calls()[..complete.min(parser.calls().len())].to_vec();
                let mut deltas = pushed.deltas;
                deltas.extend(tail.deltas);
                (self.release_complete_calls(deltas), calls)
            }
            _ => (Vec::new(), Vec::new()),
        };
        // A request with tools that stopped after making calls: a `tool_calls` finish.
        let reason = match reason {
            FinishReason::Stop if !tool_calls.is_empty() => FinishReason::ToolCalls,
            other => other,
        };
        let usage = Usage {
            prompt_tokens: self.prompt.len(),
            completion_tokens: self.generated.len(),
            cached_tokens: self.cached_tokens,
            reasoning_tokens: self.reasoning.as_ref().map_or(0, |r| r.tokens),
        };
        let first_logits = std::mem::take(&mut self.first_logits);
        let stop = if matches!(reason, FinishReason::Stop | FinishReason::ToolCalls) { self.stop.take() } else { None };
        self.sink.close(Event::Done { finish_reason: reason, stop, text, reasoning, usage, first_logits, tool_deltas, tool_calls });
    }

    /// `text` split into reasoning and answer (all answer for a model without reasoning).
    fn split(&mut self, text: &str) -> Split {
        match &mut self.reasoning {
            Some(r) => r.push(text),
            None => Split { reasoning: String::new(), content: text.to_string() },
        }
    }

    /// Holds `deltas` with those already held and gives back the ones of complete calls.
    fn release_complete_calls(&mut self, deltas: Vec<ToolDelta>) -> Vec<ToolDelta> {
        self.held_deltas.extend(deltas);
        let complete = self.tool_parser.as_ref().map_or(0, ToolCallParser::completed_calls);
        let index = |d: &ToolDelta| match d {
            ToolDelta::Start { index, .. } | ToolDelta::Arguments { index, .. } => *index,
        };
        let (ready, held): (Vec<ToolDelta>, Vec<ToolDelta>) =
            std::mem::take(&mut self.held_deltas).into_iter().partition(|d| index(d) < complete);
        self.held_deltas = held;
        ready
    }

    /// The step must choose this row's next token on the host after reading its last one: a
    /// grammar, or a reasoning budget that may force the block's end.
    pub(super) fn needs_host_choice(&self) -> bool {
        self.constraint.is_some() || self.reasoning.as_ref().is_some_and(RowReasoning::needs_host_choice)
    }

    /// Whether this row may take a speculative draft: its tokens depend only on the logits
    /// (no grammar, reasoning budget, history-dependent processors or media), and it reports
    /// no log-probabilities (a rejected position's would be wrong to report).
    pub(super) fn speculates(&self) -> bool {
        self.finish.is_none()
            && self.logprobs.is_none()
            && !self.needs_host_choice()
            && !self.sampler.params().has_processors()
            && self.media.is_empty()
    }

    /// The request's constraint is in force for the next token (not waiting out the reasoning).
    pub(super) fn constraint_active(&self) -> bool {
        self.constraint.is_some() && !self.reasoning.as_ref().is_some_and(RowReasoning::is_open)
    }

    /// Sends the final event this row has earned: its error if it failed, else `Done`.
    pub(super) fn close(self) {
        match (self.error.clone(), self.finish) {
            (Some(message), _) => self.fail(message),
            (None, Some(reason)) => self.finish(reason),
            (None, None) => self.fail("the row ended without a finish reason".into()),
        }
    }

    pub(super) fn fail(mut self, message: String) {
        self.sink.close(Event::Error { message });
    }

    /// The tokens whose KV a cache of `len` positions holds for this row: a cache one
    /// position longer than prompt and output holds the end-of-sequence token that stopped
    /// the row (the pipelined step forwarded it), which the next turn's history has too.
    pub(super) fn cached_sequence(&self, len: usize) -> Vec<u32> {
        let eos = match self.stop {
            Some(StopCause::Eos { token_id }) => Some(token_id),
            _ => None,
        };
        self.cache_prompt().iter().chain(&self.generated).chain(eos.iter()).take(len).copied().collect()
    }

    /// The prompt as prompt-cache keys name it.
    pub(super) fn cache_prompt(&self) -> &[u32] {
        self.cache_key.as_deref().unwrap_or(&self.prompt)
    }
}

impl Row {
    /// The row of an admitted request.
    pub(super) fn new(sub: Submission, tokenizer: Option<&Tokenizer>, projected_kv_bytes: u64) -> Row {
        let Submission { id, prompt, request, stop_token_ids, sink, flow, constraint, reasoning, checkpoints, .. } = sub;
        let reasoning = reasoning.map(|plan| RowReasoning::new(plan, tokenizer));
        let tool_parser = request.tools.as_ref().and_then(|t| t.parser());
        let tool_call_limit = request.tools.as_ref().and_then(|t| t.call_limit());
        let mut sampler = Sampler::new(request.sampling.clone());
        sampler.observe(&prompt);
        Row {
            id,
            generated: Vec::new(),
            max_tokens: request.max_tokens,
            stop_token_ids,
            sampler,
            text: TextStream::new(tokenizer, StopMatcher::new(&request.stop)),
            sink,
            flow,
            cached_tokens: 0,
            capture_first_logits: request.capture_first_logits,
            logprobs: request.logprobs,
            first_logits: Vec::new(),
            projected_kv_bytes,
            next_input: None,
            draft_fed: 0,
            finish: None,
            stop: None,
            error: None,
            tool_parser,
            tool_call_limit,
            held_deltas: Vec::new(),
            reasoning,
            constraint,
            prompt,
            media: RowMedia::default(),
            cache_key: None,
            num_draft_tokens: request.num_draft_tokens,
            checkpoints,
        }
    }

    /// Marks the row failed by `e` (it is reported when the row closes).
    pub(super) fn fail_later(&mut self, e: &crate::Error) {
        self.error = Some(e.to_string());
        self.finish = Some(FinishReason::Stop);
    }

    /// The log-probabilities requested for `token`, from the step's row.
    pub(super) fn logprobs_for(&self, token: u32, row: Option<&[f32]>) -> Option<TokenLogprobs> {
        match (self.logprobs, row) {
            (Some(k), Some(row)) => Some(token_logprobs(row, token, k)),
            _ => None,
        }
    }

    /// Keeps the first `capture_first_logits` raw logits of the first step (parity tooling).
    pub(super) fn capture_first(&mut self, logits: &Array) {
        if self.capture_first_logits > 0 {
            self.first_logits = leading_values(logits, self.capture_first_logits);
        }
    }
}

/// A decoding row set aside while its consumer catches up, with its KV as single-sequence
/// caches (what `extract_row` gives); it rejoins like a newly prefilled row.
pub(super) struct Parked {
    pub(super) row: Row,
    pub(super) caches: Vec<Box<dyn KvCache>>,
}

pub(super) struct Prefilling {
    pub(super) row: Row,
    pub(super) caches: Vec<Box<dyn KvCache>>,
    /// Prompt positions already in `caches`.
    pub(super) done: usize,
}
