//! One sequence on the engine's own executor: `generate::generate` runs here, so single-prompt
//! generation shares the batch's decode loop (prefill chunks, pipelined steps, the row state
//! machine's stop ids, stop strings and length limit) instead of keeping a second one.

use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

use super::executor::Executor;
use super::{Event, EventSink, Input, Request, Submission};
use crate::generate::{FinishReason, GenerateOptions, Generation, TokenEvent};
use crate::models::LanguageModel;
use crate::tokenizer::Tokenizer;
use crate::{Error, Result};

/// Runs `prompt` (already validated, `max_tokens` already clipped to the context and > 0) as
/// the only row of an executor over the borrowed model. Events are buffered by the row's sink
/// and handed to `on_token` here, on the caller's thread; `on_token` returning `false` cancels.
pub(crate) fn generate_one(
    model: &dyn LanguageModel,
    tokenizer: Option<&Tokenizer>,
    prompt: &[u32],
    max_tokens: usize,
    opts: &GenerateOptions,
    mut on_token: impl FnMut(TokenEvent) -> bool,
) -> Result<Generation> {
    const ID: u64 = 1;
    let start = Instant::now();
    let mut executor = Executor::new(model, tokenizer.cloned(), opts.prefill_step_size, 0)
        .with_kv_quantization(opts.kv_quantization);
    let events: Arc<Mutex<Vec<Event>>> = Arc::default();
    let sink_events = Arc::clone(&events);
    let request = Request {
        max_tokens,
        sampling: opts.sampling.clone(),
        stop: opts.stop_strings.clone(),
        capture_first_logits: opts.capture_first_logits,
        ..Request::new(Input::Tokens(prompt.to_vec()))
    };
    let sub = Submission {
        id: ID,
        prompt: prompt.to_vec(),
        request,
        stop_token_ids: opts.stop_token_ids.clone(),
        sink: EventSink::new(Box::new(move |e: &Event| {
            sink_events.lock().push(e.clone());
            true
        })),
        flow: None,
        constraint: None,
        images: Vec::new(),
        audio: Vec::new(),
    };
    executor.admit(sub, 0);

    let mut out = Generation {
        tokens: Vec::new(),
        text: String::new(),
        finish_reason: FinishReason::Length,
        prompt_tokens: prompt.len(),
        first_logits: Vec::new(),
        ttft_s: 0.0,
        decode_s: 0.0,
    };
    let mut first_token_at: Option<Instant> = None;
    let mut cancelled = false;
    loop {
        executor.prefill_step();
        executor.decode_step();
        // Taken out first: cancelling below delivers `Done` through the same buffer.
        let arrived = std::mem::take(&mut *events.lock());
        if arrived.is_empty() && executor.prefilling() == 0 && executor.decoding() == 0 && executor.parked() == 0 {
            return Err(Error::Mlx("the row ended without a final event".into()));
        }
        for event in arrived {
            if first_token_at.is_none() {
                first_token_at = Some(Instant::now());
                out.ttft_s = start.elapsed().as_secs_f64();
            }
            match event {
                Event::Token { .. } if cancelled => {}
                Event::Token { token_id, text, .. } => {
                    out.tokens.push(token_id);
                    out.text.push_str(&text);
                    if !on_token(TokenEvent { token_id, text: &text }) {
                        cancelled = true;
                        executor.cancel(ID);
                    }
                }
                Event::Done { finish_reason, text, first_logits, .. } => {
                    out.text.push_str(&text);
                    out.finish_reason = if cancelled { FinishReason::Cancelled } else { finish_reason };
                    out.first_logits = first_logits;
                    if let Some(t) = first_token_at {
                        out.decode_s = t.elapsed().as_secs_f64();
                    }
                    return Ok(out);
                }
                Event::Error { message } => return Err(Error::Mlx(message)),
            }
        }
    }
}
