//! Counting a request's prompt without running it: the tokens the engine would prefill for it
//! (the chat template rendered with its tools and template variables, the text tokenized, image
//! and audio markers expanded), through the same steps [`Engine::submit`] takes, so a count and
//! the `Started { prompt_tokens }` of the same request agree (Anthropic's `count_tokens`).

use super::{attach_audio, attach_images, check_request, finish_prepare, Engine, EngineConfig, Event, Request};
use crate::Result;

impl Engine {
    /// The number of prompt tokens `request` would prefill, computed as [`Engine::submit`]
    /// prepares it, without queueing anything. A prompt longer than the model's context or the
    /// engine's KV budget is still counted (a count is how a client learns it must shorten
    /// the prompt); every other problem with the request is the error `submit` would give.
    pub fn count_prompt_tokens(&self, request: Request) -> Result<usize> {
        let front = &self.front;
        front.health.check()?;
        // The length checks are what a count reports, not a reason to refuse one.
        let info = crate::models::ModelInfo { max_position_embeddings: None, ..front.info.clone() };
        let config = EngineConfig { kv_budget_bytes: None, ..front.config.clone() };
        let checked = check_request(request, front.tokenizer.as_ref(), &front.constraints, &info, &config)?;
        let sink: super::Sink = Box::new(|_: &Event| false);
        let mut sub =
            finish_prepare(0, checked, sink, front.tokenizer.as_ref(), &front.constraints, &info, &front.eos_token_ids, &config)?;
        attach_images(&mut sub, front.vision.as_ref(), front.tokenizer.as_ref(), &info)?;
        attach_audio(&mut sub, front.audio.as_ref(), &info, &config)?;
        // Never queued: its sink gets no events.
        sub.sink.discard();
        Ok(sub.prompt.len())
    }

    /// The most prompt tokens a request may have: the model's context less the one position
    /// the first generated token needs (`None` when the model's config gives no context).
    pub fn max_prompt_tokens(&self) -> Option<usize> {
        self.front.info.max_position_embeddings.map(|ctx| ctx.saturating_sub(1))
    }
}
