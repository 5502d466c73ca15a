//! Running several requests through the engine core on this thread and collecting each one's
//! events: used by `generate` with several `--prompt-ids`, `replay` and `bench`.

use std::sync::mpsc::{self, Receiver};
use std::time::Instant;

use weft::engine::{EngineConfig, EngineCore, Event, Preparer, Request, RequestId};
use weft::generate::FinishReason;
use weft::loading::LoadedModel;
use weft::Result;

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
}

impl RowResult {
    pub fn finish_str(&self) -> &'static str {
        match (&self.error, self.finish_reason) {
            (Some(_), _) => "error",
            (None, Some(r)) => r.as_str(),
            (None, None) => "none",
        }
    }
}

pub struct Collector {
    pub core: EngineCore,
    rows: Vec<(RequestId, Receiver<(Event, Instant)>, Instant)>,
    preparer: Preparer,
    next_id: RequestId,
}

impl Collector {
    pub fn new(model: LoadedModel, config: EngineConfig) -> Result<Self> {
        config.validate_for(model.model.info())?;
        let drafter = weft::engine::Drafter::from_config(&config, &model)?;
        let preparer = Preparer::new(&model, config.clone());
        Ok(Collector { core: EngineCore::new(model, config).with_drafter(drafter), rows: Vec::new(), preparer, next_id: 1 })
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

    /// Results in submission order.
    pub fn results(&mut self) -> Vec<(RequestId, RowResult)> {
        self.rows
            .drain(..)
            .map(|(id, rx, submitted)| {
                let mut r = RowResult::default();
                for (ev, at) in rx.try_iter() {
                    match ev {
                        Event::Token { token_id, text, .. } => {
                            if r.ttft_s.is_none() {
                                r.ttft_s = Some(at.duration_since(submitted).as_secs_f64());
                            }
                            r.tokens.push(token_id);
                            r.text.push_str(&text);
                        }
                        Event::Done { finish_reason, usage, first_logits, text, .. } => {
                            r.finish_reason = Some(finish_reason);
                            r.first_logits = first_logits;
                            r.prompt_tokens = usage.prompt_tokens;
                            r.text.push_str(&text);
                        }
                        Event::Started { .. } => {}
                        Event::Error { message } => r.error = Some(message),
                    }
                }
                (id, r)
            })
            .collect()
    }
}
