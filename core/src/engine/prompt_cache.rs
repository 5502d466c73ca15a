//! Byte-capped LRU of per-layer KV caches keyed by the token prefix they hold. A new request
//! reuses the longest cached prefix of its prompt and prefills only the rest; reuse is exact
//! because chunked prefill is (mlx-lm's goldens show chunk boundaries don't change logits).
//! Caches that cannot drop positions (recurrent state of linear-attention layers) are reused
//! only when the whole entry is a prefix of the new prompt, never trimmed to a shorter one.

use crate::cache::KvCache;

struct Entry {
    tokens: Vec<u32>,
    caches: Vec<Box<dyn KvCache>>,
    bytes: u64,
    last_used: u64,
}

pub struct PromptCache {
    capacity_bytes: u64,
    entries: Vec<Entry>,
    bytes: u64,
    clock: u64,
    pub hits: u64,
}

impl PromptCache {
    pub fn new(capacity_bytes: u64) -> Self {
        PromptCache { capacity_bytes, entries: Vec::new(), bytes: 0, clock: 0, hits: 0 }
    }

    pub fn enabled(&self) -> bool {
        self.capacity_bytes > 0
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Stores caches holding KV for exactly `tokens`. An entry whose tokens are a prefix of
    /// these is replaced; entries are evicted least-recently-used first to stay under the cap.
    pub fn insert(&mut self, tokens: Vec<u32>, mut caches: Vec<Box<dyn KvCache>>) {
        if !self.enabled() || tokens.is_empty() {
            return;
        }
        // A cache may hold one position more than the known tokens (a stop token that was
        // already forwarded by the pipelined step): keep exactly the positions we can name.
        let mut tokens = tokens;
        for c in &mut caches {
            if c.len() > tokens.len() {
                let extra = c.len() - tokens.len();
                if c.trim(extra) != extra {
                    // A wrapped sliding-window ring cannot drop positions: not reusable.
                    return;
                }
            }
        }
        let held = caches.iter().map(|c| c.len()).min().unwrap_or(0);
        tokens.truncate(held);
        for c in &mut caches {
            if c.len() > held {
                let extra = c.len() - held;
                c.trim(extra);
            }
        }
        // A cache that cannot forget positions (recurrent state) still covering more than
        // the named tokens would be reused for the wrong sequence: don't keep it.
        if tokens.is_empty() || caches.iter().any(|c| c.len() != held) {
            return;
        }
        let bytes: u64 = caches.iter().map(|c| (c.nbytes()) as u64).sum();
        if bytes > self.capacity_bytes {
            return;
        }
        let before = self.entries.len();
        self.entries.retain(|e| !tokens.starts_with(&e.tokens));
        if self.entries.len() != before {
            self.bytes = self.entries.iter().map(|e| e.bytes).sum();
        }
        self.clock += 1;
        self.bytes += bytes;
        self.entries.push(Entry { tokens, caches, bytes, last_used: self.clock });
        while self.bytes > self.capacity_bytes {
            let lru = (0..self.entries.len()).min_by_key(|&i| self.entries[i].last_used).unwrap();
            let e = self.entries.swap_remove(lru);
            self.bytes -= e.bytes;
        }
    }

    /// Copies of the caches for the longest cached prefix of `prompt` not longer than
    /// `max_len`, trimmed to the shared length; `None` when nothing useful is cached. An entry
    /// whose caches cannot be trimmed (recurrent state) is only used when all of it is a
    /// prefix of the prompt.
    pub fn lookup(&mut self, prompt: &[u32], max_len: usize) -> Option<(Vec<Box<dyn KvCache>>, usize)> {
        let mut candidates: Vec<(usize, usize)> = self
            .entries
            .iter()
            .enumerate()
            .map(|(i, e)| (i, common_prefix(&e.tokens, prompt).min(max_len)))
            .filter(|&(_, n)| n > 0)
            .collect();
        // Longest first; among equals the latest entry (as `max_by_key` picked before).
        candidates.sort_by(|a, b| b.1.cmp(&a.1).then(b.0.cmp(&a.0)));
        for (best, shared) in candidates {
            let entry = &self.entries[best];
            let mut caches: Vec<Box<dyn KvCache>> = entry.caches.iter().map(|c| c.duplicate()).collect();
            let trimmed = caches.iter_mut().all(|c| {
                let extra = c.len() - shared;
                c.trim(extra) == extra
            });
            if !trimmed {
                continue;
            }
            self.clock += 1;
            self.hits += 1;
            self.entries[best].last_used = self.clock;
            return Some((caches, shared));
        }
        None
    }
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}
