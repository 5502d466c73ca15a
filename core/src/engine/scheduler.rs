//! Scheduling policy, free of MLX: the FIFO of waiting requests and the admission decision
//! (row cap, prompt concurrency, KV budget). The executor carries the decisions out.

use std::collections::VecDeque;

use super::{EngineConfig, Submission};
use crate::cache::KvQuantization;
use crate::models::ModelInfo;

/// Positions KV storage grows by at a time (the caches' allocation step, as mlx-lm's).
pub const KV_ALLOCATION_STEP: usize = 256;

/// KV bytes a request may grow to: every prompt and generated position, rounded up to the
/// caches' allocation step (storage is allocated in steps, so that is what it really takes), all
/// layers (sliding-window layers capped at their window). Under KV quantization `kv`, the larger
/// of the full-precision cache before it converts (`start` positions) and the quantized cache of
/// every position.
pub fn projected_kv_bytes_for(info: &ModelInfo, kv: Option<&KvQuantization>, prompt_len: usize, max_tokens: usize) -> u64 {
    let wanted = prompt_len.saturating_add(max_tokens);
    let allocated = wanted.div_ceil(KV_ALLOCATION_STEP).saturating_mul(KV_ALLOCATION_STEP);
    let positions = match info.max_position_embeddings {
        Some(ctx) => allocated.min(ctx.div_ceil(KV_ALLOCATION_STEP).saturating_mul(KV_ALLOCATION_STEP)),
        None => allocated,
    };
    let full = info.kv_bytes_for(positions);
    match kv {
        None => full,
        Some(q) => {
            let before = info.kv_bytes_for(positions.min(q.start));
            let (quantized, plain) = (info.kv_bytes_per_token_with(Some(q)) as u128, info.kv_bytes_per_token().max(1) as u128);
            let after = u64::try_from(full as u128 * quantized / plain).unwrap_or(u64::MAX);
            before.max(after)
        }
    }
}

/// What is running now, as admission sees it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Load {
    /// Rows in the batch plus parked rows (both hold KV and a batch slot).
    pub decoding: usize,
    pub prefilling: usize,
    pub projected_kv_bytes: u64,
}

pub struct Scheduler {
    config: EngineConfig,
    waiting: VecDeque<Submission>,
}

impl Scheduler {
    pub fn new(config: EngineConfig) -> Self {
        Scheduler { config, waiting: VecDeque::new() }
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    pub(crate) fn config_mut(&mut self) -> &mut EngineConfig {
        &mut self.config
    }

    pub fn push(&mut self, sub: Submission) {
        self.waiting.push_back(sub);
    }

    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Removes a waiting request (cancellation before admission).
    pub fn remove(&mut self, id: super::RequestId) -> Option<Submission> {
        let pos = self.waiting.iter().position(|s| s.id == id)?;
        self.waiting.remove(pos)
    }

    pub fn drain(&mut self) -> impl Iterator<Item = Submission> + '_ {
        self.waiting.drain(..)
    }

    /// KV bytes `sub` may grow to under this engine's KV mode.
    fn projected(&self, info: &ModelInfo, sub: &Submission) -> u64 {
        let kv = self.config.kv_quantization();
        projected_kv_bytes_for(info, kv.as_ref(), sub.prompt.len(), sub.request.max_tokens)
    }

    /// KV bytes the head of the queue may grow to, if a request waits.
    pub fn head_projected(&self, info: &ModelInfo) -> Option<u64> {
        self.waiting.front().map(|next| self.projected(info, next))
    }

    /// Whether the head of the queue may start under `load`.
    pub fn head_fits(&self, info: &ModelInfo, load: &Load) -> bool {
        let Some(next) = self.waiting.front() else { return false };
        if load.decoding + load.prefilling >= self.config.max_batch
            || load.prefilling >= self.config.prompt_concurrency
        {
            return false;
        }
        let need = self.projected(info, next);
        self.config.kv_budget_bytes.is_none_or(|budget| load.projected_kv_bytes + need <= budget)
    }

    /// Pops the requests that may start now, in FIFO order. The head of the queue blocks the
    /// rest: a large request waiting for KV budget is not overtaken by smaller ones.
    pub fn admit(&mut self, info: &ModelInfo, mut load: Load) -> Vec<Submission> {
        let mut admitted = Vec::new();
        while self.head_fits(info, &load) {
            let next = self.waiting.pop_front().unwrap();
            load.prefilling += 1;
            load.projected_kv_bytes += self.projected(info, &next);
            admitted.push(next);
        }
        admitted
    }
}
