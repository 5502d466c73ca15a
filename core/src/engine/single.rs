//! One sequence on the engine's own executor: `generate::generate` runs here, so single-prompt
//! generation shares the batch's decode loop (prefill chunks, pipelined steps, the row state
//! machine's stop ids, stop strings and length limit) instead of keeping a second one.

use std::sync::Arc;

use parking_lot::Mutex;

use super::executor::{DecodeMode, Executor};
use super::{Event, EventSink, Request, Submission};
use crate::cache::KvQuantization;
use crate::models::LanguageModel;
use crate::stop::FinishReason;
use crate::tokenizer::Tokenizer;
use crate::{Error, Result};

/// A prompt to run alone ([`run_single`]): already validated, `request.max_tokens` already
/// clipped to the context and > 0.
pub struct SingleRow<'a> {
    pub prompt: &'a [u32],
    pub request: Request,
    pub stop_token_ids: Vec<u32>,
    pub prefill_step_size: usize,
    pub kv_quantization: Option<KvQuantization>,
    pub decode: DecodeMode,
    /// Prompt-lookup speculative decoding's draft length (0: off).
    pub num_draft_tokens: usize,
}

/// Runs `row` as the only row of an executor over the borrowed model, on the caller's thread.
/// Events are buffered by the row's sink and handed to `on_event` here; `on_event` returning
/// `false` for a token cancels (later tokens are dropped; the `Done` says `Cancelled`). Returns
/// after the final event: `Ok` after `Done`, the error after `Error`.
pub fn run_single(
    model: &dyn LanguageModel,
    tokenizer: Option<&Tokenizer>,
    row: SingleRow,
    mut on_event: impl FnMut(Event) -> bool,
) -> Result<()> {
    const ID: u64 = 1;
    let SingleRow { prompt, request, stop_token_ids, prefill_step_size, kv_quantization, decode, num_draft_tokens } = row;
    let mut executor = Executor::new(model, tokenizer.cloned(), prefill_step_size, 0)
        .with_kv_quantization(kv_quantization)
        .with_decode_mode(decode)
        .with_speculation(num_draft_tokens);
    let events: Arc<Mutex<Vec<Event>>> = Arc::default();
    let sink_events = Arc::clone(&events);
    let sub = Submission {
        id: ID,
        prompt: prompt.to_vec(),
        request,
        stop_token_ids,
        sink: EventSink::new(Box::new(move |e: &Event| {
            sink_events.lock().push(e.clone());
            true
        })),
        flow: None,
        constraint: None,
        images: Vec::new(),
        audio: Vec::new(),
        reasoning: None,
        rendered: None,
        checkpoints: Vec::new(),
    };
    executor.admit(sub, 0);

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
            match event {
                Event::Token { .. } if cancelled => {}
                Event::Token { .. } => {
                    if !on_event(event) {
                        cancelled = true;
                        executor.cancel(ID);
                    }
                }
                Event::Done { finish_reason, stop, text, reasoning, usage, first_logits, tool_deltas, tool_calls } => {
                    let finish_reason = if cancelled { FinishReason::Cancelled } else { finish_reason };
                    on_event(Event::Done { finish_reason, stop, text, reasoning, usage, first_logits, tool_deltas, tool_calls });
                    return Ok(());
                }
                Event::Started { .. } => {}
                Event::Error { message } => return Err(Error::Mlx(message)),
            }
        }
    }
}
