//! Scheduling policy, free of MLX: the FIFO of waiting requests and the admission decision
//! (row cap, prompt concurrency, KV budget). The executor carries the decisions out.

use std::collections::VecDeque;

use super::{EngineConfig, Submission};
use crate::models::ModelInfo;

/// KV bytes a request may grow to: every prompt and generated position, all layers
/// (sliding-window layers capped at their window).
pub fn projected_kv_bytes(info: &ModelInfo, prompt_len: usize, max_tokens: usize) -> u64 {
    let positions = match info.max_position_embeddings {
        Some(ctx) => prompt_len.saturating_add(max_tokens).min(ctx),
        None => prompt_len.saturating_add(max_tokens),
    };
    info.kv_bytes_for(positions)
}

/// What is running now, as admission sees it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Load {
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

    /// Pops the requests that may start now, in FIFO order. The head of the queue blocks the
    /// rest: a large request waiting for KV budget is not overtaken by smaller ones.
    pub fn admit(&mut self, info: &ModelInfo, mut load: Load) -> Vec<Submission> {
        let mut admitted = Vec::new();
        while let Some(next) = self.waiting.front() {
            if load.decoding + load.prefilling >= self.config.max_batch
                || load.prefilling >= self.config.prompt_concurrency
            {
                break;
            }
            let need = projected_kv_bytes(info, next.prompt.len(), next.request.max_tokens);
            if let Some(budget) = self.config.kv_budget_bytes {
                if load.projected_kv_bytes + need > budget {
                    break;
                }
            }
            load.prefilling += 1;
            load.projected_kv_bytes += need;
            admitted.push(self.waiting.pop_front().unwrap());
        }
        admitted
    }
}
