//! Byte-capped LRU of per-layer KV caches keyed by the token prefix they hold. A new request
//! reuses the longest cached prefix of its prompt and prefills only the rest; reuse is exact
//! because chunked prefill is (mlx-lm's goldens show chunk boundaries don't change logits).
//!
//! Entries come from finished rows (their whole sequence) and from checkpoints taken while a
//! row prefills ([`super::executor`]): at the chat boundaries the next turns share (end of
//! the system prompt, of the latest earlier messages and of the last message) and at the end
//! of the prefill. Caches that
//! cannot drop positions (recurrent state of linear-attention layers, a sliding-window ring
//! that has wrapped) are reused only when the whole entry is a prefix of the new prompt, never
//! trimmed to a shorter one: the checkpoints give such models entries that are.

use crate::cache::KvCache;

struct Entry {
    tokens: Vec<u32>,
    caches: Vec<Box<dyn KvCache>>,
    bytes: u64,
    last_used: u64,
}

impl Entry {
    /// Whether copies of this entry's caches can be cut back to the first `n` tokens.
    fn trims_to(&self, n: usize) -> bool {
        trims_to(&self.caches, n)
    }
}

fn trims_to(caches: &[Box<dyn KvCache>], n: usize) -> bool {
    caches.iter().all(|c| {
        let extra = c.len().saturating_sub(n);
        extra == 0 || c.duplicate().trim(extra) == extra
    })
}

pub struct PromptCache {
    capacity_bytes: u64,
    entries: Vec<Entry>,
    bytes: u64,
    clock: u64,
    /// Lookups that reused a cached prefix, and the prompt tokens they reused.
    pub hits: u64,
    pub cached_tokens: u64,
    /// Entries dropped to stay under the capacity or to make room for admitted rows.
    pub evictions: u64,
}

impl PromptCache {
    pub fn new(capacity_bytes: u64) -> Self {
        PromptCache { capacity_bytes, entries: Vec::new(), bytes: 0, clock: 0, hits: 0, cached_tokens: 0, evictions: 0 }
    }

    pub fn enabled(&self) -> bool {
        self.capacity_bytes > 0
    }

    pub fn capacity(&self) -> u64 {
        self.capacity_bytes
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
    /// these is replaced when these caches can be cut back to it (a recurrent checkpoint stays:
    /// it serves prompts that diverge later); a new entry that an existing one already covers
    /// that way is not stored. Entries are evicted least-recently-used first to stay under the
    /// cap. Returns whether the cache now holds these tokens (stored or already covered).
    pub fn insert(&mut self, tokens: Vec<u32>, mut caches: Vec<Box<dyn KvCache>>) -> bool {
        if !self.enabled() || tokens.is_empty() {
            return false;
        }
        // A cache may hold one position more than the known tokens (a stop token that was
        // already forwarded by the pipelined step): keep exactly the positions we can name.
        let mut tokens = tokens;
        for c in &mut caches {
            if c.len() > tokens.len() {
                let extra = c.len() - tokens.len();
                if c.trim(extra) != extra {
                    // A wrapped sliding-window ring cannot drop positions: not reusable.
                    return false;
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
            return false;
        }
        self.clock += 1;
        if let Some(e) = self.entries.iter_mut().find(|e| e.tokens.starts_with(&tokens) && e.trims_to(tokens.len())) {
            e.last_used = self.clock;
            return true;
        }
        let bytes: u64 = caches.iter().map(|c| (c.nbytes()) as u64).sum();
        if bytes > self.capacity_bytes {
            return false;
        }
        let before = self.entries.len();
        self.entries.retain(|e| !(tokens.starts_with(&e.tokens) && trims_to(&caches, e.tokens.len())));
        if self.entries.len() != before {
            self.bytes = self.entries.iter().map(|e| e.bytes).sum();
        }
        self.bytes += bytes;
        self.entries.push(Entry { tokens, caches, bytes, last_used: self.clock });
        self.evict_to(self.capacity_bytes);
        true
    }

    /// Every entry: the tokens it holds and its caches.
    pub fn entries(&self) -> impl Iterator<Item = (&[u32], &[Box<dyn KvCache>])> {
        self.entries.iter().map(|e| (e.tokens.as_slice(), e.caches.as_slice()))
    }

    /// Evicts least-recently-used entries until the cache holds at most `bytes`; returns the
    /// bytes freed.
    pub fn evict_to(&mut self, bytes: u64) -> u64 {
        let before = self.bytes;
        while self.bytes > bytes && !self.entries.is_empty() {
            let lru = (0..self.entries.len()).min_by_key(|&i| self.entries[i].last_used).unwrap();
            let e = self.entries.swap_remove(lru);
            self.bytes -= e.bytes;
            self.evictions += 1;
        }
        before - self.bytes
    }

    /// Copies of the caches for the longest cached prefix of `prompt` not longer than
    /// `max_len`, trimmed to the shared length; `None` when nothing useful is cached. An entry
    /// whose caches cannot be trimmed (recurrent state) is only used when all of it is a
    /// prefix of the prompt.
    pub fn lookup(&mut self, prompt: &[u32], max_len: usize) -> Option<(Vec<Box<dyn KvCache>>, usize)> {
        let (best, caches, shared) = self.longest_prefix(prompt, max_len)?;
        self.clock += 1;
        self.hits += 1;
        self.cached_tokens += shared as u64;
        self.entries[best].last_used = self.clock;
        Some((caches, shared))
    }

    /// What saving an entry for `prompt` writes ([`crate::engine::Engine::save_prompt_cache_entry`]):
    /// the tokens and copies of the caches a request with this prompt would reuse, or without
    /// a prompt the most recently used entry whole. Counts no hit.
    pub fn entry_for(&self, prompt: Option<&[u32]>) -> Option<(Vec<u32>, Vec<Box<dyn KvCache>>)> {
        match prompt {
            Some(prompt) => {
                let (_, caches, shared) = self.longest_prefix(prompt, prompt.len())?;
                Some((prompt[..shared].to_vec(), caches))
            }
            None => {
                let e = self.entries.iter().max_by_key(|e| e.last_used)?;
                Some((e.tokens.clone(), e.caches.iter().map(|c| c.duplicate()).collect()))
            }
        }
    }

    /// The entry sharing the longest prefix with `prompt` (at most `max_len`) whose caches cut
    /// back to it: its index, trimmed copies of its caches and the shared length.
    fn longest_prefix(&self, prompt: &[u32], max_len: usize) -> Option<(usize, Vec<Box<dyn KvCache>>, usize)> {
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
            if trimmed {
                return Some((best, caches, shared));
            }
        }
        None
    }
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Earlier messages (before the last) whose ends are checkpointed, the latest first: an agent
/// that retries or edits its last turns resumes from one of these. Each checkpoint holds a copy
/// of the row's caches and cuts a prefill chunk, so a long conversation sent whole gets only
/// the latest few; all of them are entries under the prompt cache's one byte ceiling.
pub(super) const EARLIER_MESSAGE_CHECKPOINTS: usize = 4;

/// Prompt positions a conversation's next turns share with this one, where the prompt cache
/// checkpoints the row while it prefills: the end of the system prompt (with its tools), the
/// ends of the latest [`EARLIER_MESSAGE_CHECKPOINTS`] earlier messages (a next turn that edits
/// or drops the last messages) and the end of the last message (before the generation prompt,
/// which the next turn replaces with the answer as its template renders it: a thinking
/// template that drops the reasoning from history still shares this much). Each is found by
/// rendering the conversation up to that message without the generation prompt and keeping it
/// only if its tokens are a prefix of `prompt` (a template that renders a shorter conversation
/// differently gives none).
pub(super) fn chat_checkpoints(
    template: &crate::tokenizer::ChatTemplate,
    messages: &[crate::tokenizer::ChatMessage],
    tools: Option<&crate::tools::Tools>,
    kwargs: &serde_json::Map<String, serde_json::Value>,
    tokenizer: &crate::tokenizer::Tokenizer,
    prompt: &[u32],
) -> Vec<usize> {
    use crate::tools::TemplateTools;
    let raw: Option<Vec<serde_json::Value>> = match tools {
        None => None,
        // Weft's fallback rewrites the conversation: its boundaries are not the messages'.
        Some(t) => match TemplateTools::detect(template.source()) {
            TemplateTools::Native(_) => Some(t.specs.iter().map(|s| s.raw.clone()).collect()),
            _ => return Vec::new(),
        },
    };
    let mut cuts: Vec<usize> = (1..=messages.len()).rev().take(EARLIER_MESSAGE_CHECKPOINTS + 1).collect();
    if messages.len() > 1 && matches!(messages[0].role.as_str(), "system" | "developer") && !cuts.contains(&1) {
        cuts.push(1);
    }
    let mut found: Vec<usize> = cuts
        .into_iter()
        .filter_map(|k| {
            let text = template.render_with_kwargs(&messages[..k], raw.as_deref(), false, kwargs).ok()?;
            let ids = tokenizer.encode(&text, false).ok()?;
            (!ids.is_empty() && ids.len() < prompt.len() && prompt.starts_with(&ids)).then_some(ids.len())
        })
        .collect();
    found.sort_unstable();
    found.dedup();
    found
}
