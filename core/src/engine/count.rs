//! Counting a request's prompt without running it: the tokens the engine would prefill for it
//! (the chat template rendered with its tools and template variables, the text tokenized, image
//! and audio markers expanded), through the same preparation [`Engine::submit`] uses
//! ([`super::Preparer::count`]), so a count and the `Started { prompt_tokens }` of the same
//! request agree (Anthropic's `count_tokens`).

use super::{Engine, Request};
use crate::Result;

impl Engine {
    /// The number of prompt tokens `request` would prefill, computed as [`Engine::submit`]
    /// prepares it, without queueing anything. A prompt longer than the model's context or the
    /// engine's KV budget is still counted (a count is how a client learns it must shorten
    /// the prompt); every other problem with the request is the error `submit` would give.
    pub fn count_prompt_tokens(&self, request: Request) -> Result<usize> {
        self.front.health.check()?;
        self.front.preparer.count(request)
    }

    /// The most prompt tokens a request may have: the model's context less the one position
    /// the first generated token needs (`None` when the model's config gives no context).
    pub fn max_prompt_tokens(&self) -> Option<usize> {
        self.model_info().max_position_embeddings.map(|ctx| ctx.saturating_sub(1))
    }
}
