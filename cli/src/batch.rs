//! Running requests through the engine core on this thread and collecting each one's events:
//! used by `generate` (one prompt streamed, or several `--prompt-ids`), `run` / `chat`,
//! `replay` and `bench`.

use std::sync::mpsc::{self, Receiver};
use std::time::Instant;

use serde_json::{json, Value};
use weft::engine::{EngineConfig, EngineCore, Event, Preparer, Request, RequestId};
use weft::generate::FinishReason;
use weft::loading::LoadedModel;
use weft::tokenizer::Tokenizer;
use weft::{Error, Result};

/// What one request produced.
#[derive(Debug, Clone, Default)]
pub struct RowResult {
    pub tokens: Vec<u32>,
    pub text: String,
    pub first_logits: Vec<f32>,
    pub finish_reason: Option<FinishReason>,
    pub error: Option<String>,
    pub prompt_tokens: usize,
    /// Seconds from submission to the first token.
    pub ttft_s: Option<f64>,
    /// Seconds from submission to the final event.
    pub done_s: Option<f64>,
}

impl RowResult {
    pub fn finish_str(&self) -> &'static str {
        match (&self.error, self.finish_reason) {
            (Some(_), _) => "error",
            (None, Some(r)) => r.as_str(),
            (None, None) => "none",
        }
    }

    /// The stderr summary line `weft generate`, `run` and `chat` print after a reply, with the
    /// speculation counters when the engine speculated.
    pub fn summary(&self, speculation: Option<&Speculation>) -> String {
        let spec = speculation.map(|s| format!(", speculation: {}", s.describe(self.tokens.len()))).unwrap_or_default();
        format!(
            "[{} prompt tokens, {} generated, {:.1} tok/s, finish: {}{spec}]",
            self.prompt_tokens,
            self.tokens.len(),
            self.tokens_per_second(),
            self.finish_str()
        )
    }

    /// Decode speed: the tokens after the first over the time from the first to the end.
    pub fn tokens_per_second(&self) -> f64 {
        match (self.ttft_s, self.done_s) {
            (Some(first), Some(done)) if self.tokens.len() > 1 && done > first => {
                (self.tokens.len() - 1) as f64 / (done - first)
            }
            _ => 0.0,
        }
    }

    /// Adds `ev` (arrived at `at`, for a request submitted at `submitted`).
    fn add(&mut self, ev: Event, at: Instant, submitted: Instant) {
        let secs = at.duration_since(submitted).as_secs_f64();
        match ev {
            Event::Token { token_id, text, .. } => {
                if self.ttft_s.is_none() {
                    self.ttft_s = Some(secs);
                }
                self.tokens.push(token_id);
                self.text.push_str(&text);
            }
            Event::Done { finish_reason, usage, first_logits, text, .. } => {
                self.finish_reason = Some(finish_reason);
                self.first_logits = first_logits;
                self.prompt_tokens = usage.prompt_tokens;
                self.text.push_str(&text);
                self.done_s = Some(secs);
            }
            Event::Started { .. } => {}
            Event::Error { message } => {
                self.error = Some(message);
                self.done_s = Some(secs);
            }
        }
    }
}

/// The engine's speculative-decoding counters ([`weft::engine::EngineStats`]) over a run: read
/// before and after it, [`Speculation::since`] gives the run's share.
#[derive(Debug, Clone, Copy, Default)]
pub struct Speculation {
    pub speculative_steps: u64,
    pub draft_tokens: u64,
    pub draft_tokens_accepted: u64,
    pub decode_steps: u64,
}

impl Speculation {
    pub fn read(core: &EngineCore) -> Speculation {
        let s = core.stats();
        Speculation {
            speculative_steps: s.speculative_steps,
            draft_tokens: s.draft_tokens,
            draft_tokens_accepted: s.draft_tokens_accepted,
            decode_steps: s.decode_steps,
        }
    }

    /// The counts from `before` to `self`.
    pub fn since(self, before: Speculation) -> Speculation {
        Speculation {
            speculative_steps: self.speculative_steps - before.speculative_steps,
            draft_tokens: self.draft_tokens - before.draft_tokens,
            draft_tokens_accepted: self.draft_tokens_accepted - before.draft_tokens_accepted,
            decode_steps: self.decode_steps - before.decode_steps,
        }
    }

    /// Accepted / drafted (0 before any draft), as the engine's `draft_acceptance_rate`.
    pub fn acceptance_rate(&self) -> f64 {
        match self.draft_tokens {
            0 => 0.0,
            n => self.draft_tokens_accepted as f64 / n as f64,
        }
    }

    /// Tokens per decode step for one row that generated `generated` tokens (its first comes
    /// from the prefill), as `weft bench` reports it: about 1 without speculation (a pipelined
    /// step may run past the last token).
    pub fn tokens_per_step(&self, generated: usize) -> f64 {
        generated.saturating_sub(1) as f64 / self.decode_steps.max(1) as f64
    }

    /// The JSON object `weft generate --json` reports, under the engine's names.
    pub fn json(&self, generated: usize) -> Value {
        json!({"speculative_steps": self.speculative_steps, "draft_tokens": self.draft_tokens,
               "draft_tokens_accepted": self.draft_tokens_accepted,
               "draft_acceptance_rate": self.acceptance_rate(), "decode_steps": self.decode_steps,
               "tokens_per_step": self.tokens_per_step(generated)})
    }

    /// "24 drafted, 20 accepted (83%), 2.9 tokens/step" for the stderr summary line.
    pub fn describe(&self, generated: usize) -> String {
        format!(
            "{} drafted, {} accepted ({:.0}%), {:.2} tokens/step",
            self.draft_tokens,
            self.draft_tokens_accepted,
            self.acceptance_rate() * 100.0,
            self.tokens_per_step(generated)
        )
    }
}

pub struct Collector {
    pub core: EngineCore,
    rows: Vec<(RequestId, Receiver<(Event, Instant)>, Instant)>,
    preparer: Preparer,
    next_id: RequestId,
}

impl Collector {
    /// An engine core over `model`, with the draft model `config` names loaded (as
    /// `weft::engine::Engine::start` checks and loads them).
    pub fn new(model: LoadedModel, config: EngineConfig) -> Result<Self> {
        config.validate_for(model.model.info())?;
        if let (Some(_), Some(why)) = (config.kv_quantization(), model.model.kv_quantization_unsupported()) {
            return Err(Error::Unsupported(why));
        }
        let drafter = weft::engine::Drafter::from_config(&config, &model).map_err(|e| draft_model_error(&config, e))?;
        let preparer = Preparer::new(&model, config.clone());
        Ok(Collector { core: EngineCore::new(model, config).with_drafter(drafter), rows: Vec::new(), preparer, next_id: 1 })
    }

    pub fn tokenizer(&self) -> Option<&Tokenizer> {
        self.preparer.tokenizer()
    }

    /// Why this engine's model does not speculate (`None`: it can), as its stats say.
    pub fn speculation_off(&self) -> Option<String> {
        self.core.stats().speculation_off
    }

    /// Validates and queues a request; its events are collected.
    pub fn submit(&mut self, request: Request) -> Result<RequestId> {
        let (tx, rx) = mpsc::channel();
        let id = self.next_id;
        self.next_id += 1;
        let sink = Box::new(move |ev: &Event| tx.send((ev.clone(), Instant::now())).is_ok());
        let sub = self.preparer.submission(id, request, sink)?;
        self.core.enqueue(sub);
        self.rows.push((id, rx, Instant::now()));
        Ok(id)
    }

    /// Iterates until every submitted request has finished.
    pub fn run_to_completion(&mut self) {
        while !self.core.is_idle() {
            self.core.iterate();
        }
    }

    /// Iterates until request `id` has ended, handing each of its token texts to `on_text` as
    /// the step that made it returns; then its result (its events, as [`Collector::results`]
    /// gathers them). Other requests' events stay collected for `results`.
    pub fn stream(&mut self, id: RequestId, mut on_text: impl FnMut(&str)) -> RowResult {
        let mut r = RowResult::default();
        let Some(at) = self.rows.iter().position(|(row, ..)| *row == id) else {
            r.error = Some(format!("no request {id}"));
            return r;
        };
        let (_, rx, submitted) = self.rows.remove(at);
        loop {
            let idle = self.core.is_idle();
            if !idle {
                self.core.iterate();
            }
            for (ev, at) in rx.try_iter() {
                if let Event::Token { text, .. } = &ev {
                    on_text(text);
                }
                let last = ev.is_final();
                r.add(ev, at, submitted);
                if last {
                    return r;
                }
            }
            if idle {
                // Every request ends with `Done` or `Error`; an idle engine cannot send one now.
                r.error = Some("the request ended without a final event".into());
                return r;
            }
        }
    }

    /// Results in submission order.
    pub fn results(&mut self) -> Vec<(RequestId, RowResult)> {
        self.rows
            .drain(..)
            .map(|(id, rx, submitted)| {
                let mut r = RowResult::default();
                for (ev, at) in rx.try_iter() {
                    r.add(ev, at, submitted);
                }
                (id, r)
            })
            .collect()
    }
}

/// A draft model that would not load says so, naming the flag and the path.
fn draft_model_error(config: &EngineConfig, e: Error) -> Error {
    let path = config.draft_model.as_deref().map(|p| p.display().to_string()).unwrap_or_default();
    let why = match e {
        Error::Field { message, .. } | Error::InvalidRequest(message) => message,
        other => other.to_string(),
    };
    Error::field("draft_model", format!("--draft-model {path}: {why}"))
}
