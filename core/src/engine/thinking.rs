//! The reasoning side of a row: the streamed text split into reasoning and answer, and a
//! token-level view of the reasoning block that the scheduler acts on: reasoning tokens are
//! counted, the request's constraint waits until the block has closed (constraints apply to
//! the answer), and a spent budget forces the closing marker.
//!
//! Harmony (gpt-oss) opens its reasoning with a header of several tokens
//! (`<|channel|>analysis<|message|>`), read here token by token; its analysis messages stay the
//! constraint's (a harmony call grammar describes them), the budget still closes them (`<|end|>`).

use std::collections::VecDeque;

use crate::reasoning::{ReasoningPlan, ReasoningSplitter, ReasoningSyntax, Split};
use crate::tokenizer::Tokenizer;

pub(super) struct RowReasoning {
    splitter: ReasoningSplitter,
    /// The block's opening and closing markers as single tokens, when the vocabulary has them
    /// (what the token-level view needs; without them only the text is split).
    open_id: Option<u32>,
    close_id: Option<u32>,
    /// Token level: inside the block now / the block has been closed.
    open: bool,
    closed: bool,
    /// Tokens spent in the block, its markers included.
    pub(super) tokens: usize,
    budget: Option<usize>,
    /// What a spent budget forces: the closing marker's tokens, computed up front.
    close_tokens: Vec<u32>,
    /// The forced tokens still to come.
    forced: VecDeque<u32>,
    harmony: Option<HarmonyHeader>,
}

/// Harmony's analysis header at the token level.
struct HarmonyHeader {
    channel: u32,
    message: u32,
    /// The tokens of `analysis`, the channel name.
    analysis: Vec<u32>,
    /// Inside a header: the tokens after `<|channel|>` so far.
    reading: Option<Vec<u32>>,
}

impl RowReasoning {
    pub(super) fn new(plan: ReasoningPlan, tokenizer: Option<&Tokenizer>) -> Self {
        let (open, close) = plan.syntax.markers();
        let id = |marker: &str| tokenizer.and_then(|t| t.token_to_id(marker));
        let close_id = id(close);
        let close_tokens = match (tokenizer, plan.budget, close_id) {
            (Some(t), Some(_), Some(close_id)) => {
                let mut ids = t.encode(plan.forced_close(), false).unwrap_or_default();
                // Through the closing marker: the answer after it is the model's.
                if let Some(at) = ids.iter().position(|&i| i == close_id) {
                    ids.truncate(at + 1);
                }
                ids
            }
            _ => Vec::new(),
        };
        // A budget of 0 with the prompt inside the block: the block closes at once.
        let forced = match plan.budget {
            Some(0) if plan.starts_open => close_tokens.iter().copied().collect(),
            _ => VecDeque::new(),
        };
        let harmony = match (plan.syntax, tokenizer) {
            (ReasoningSyntax::Harmony, Some(t)) => match (t.token_to_id("<|channel|>"), t.token_to_id("<|message|>")) {
                (Some(channel), Some(message)) => {
                    Some(HarmonyHeader { channel, message, analysis: t.encode("analysis", false).unwrap_or_default(), reading: None })
                }
                _ => None,
            },
            _ => None,
        };
        Self {
            harmony,
            splitter: ReasoningSplitter::new(plan.syntax, plan.starts_open),
            open_id: id(open),
            close_id,
            open: plan.starts_open,
            closed: false,
            tokens: 0,
            budget: plan.budget,
            close_tokens,
            forced,
        }
    }

    /// Takes the next token at the token level. Returns whether it belongs to the reasoning
    /// block (the block's tokens and markers are not the answer's: a constraint skips them).
    pub(super) fn observe(&mut self, token: u32) -> bool {
        if self.forced.front() == Some(&token) {
            self.forced.pop_front();
        } else {
            self.forced.clear();
        }
        if self.harmony.is_some() {
            self.observe_harmony(token);
            return false;
        }
        let in_block = if self.open {
            if Some(token) == self.close_id {
                self.open = false;
                self.closed = true;
                self.forced.clear();
            }
            true
        } else if !self.closed && Some(token) == self.open_id {
            self.open = true;
            true
        } else {
            false
        };
        if in_block {
            self.tokens += 1;
            if self.open && self.forced.is_empty() && self.budget.is_some_and(|b| self.tokens >= b) {
                self.forced = self.close_tokens.iter().copied().collect();
            }
        }
        in_block
    }

    /// Harmony: an analysis message opens after its header and closes at `<|end|>` (the
    /// model may write several); a spent budget forces `<|end|>` in each.
    fn observe_harmony(&mut self, token: u32) {
        let Some(h) = self.harmony.as_mut() else { return };
        if !self.open {
            if token == h.channel {
                h.reading = Some(Vec::new());
            } else if let Some(header) = h.reading.as_mut() {
                if token == h.message {
                    self.open = *header == h.analysis;
                    h.reading = None;
                } else {
                    header.push(token);
                }
            }
            if !self.open {
                return;
            }
        } else if Some(token) == self.close_id {
            self.open = false;
            self.forced.clear();
            self.tokens += 1;
            return;
        }
        self.tokens += 1;
        if self.forced.is_empty() && self.budget.is_some_and(|b| self.tokens >= b) {
            self.forced = self.close_tokens.iter().copied().collect();
        }
    }

    /// Inside the block: the answer's constraint is not in force yet.
    pub(super) fn is_open(&self) -> bool {
        self.open && self.harmony.is_none()
    }

    /// The token the next step must produce (a spent budget closing the block).
    pub(super) fn forced(&self) -> Option<u32> {
        self.forced.front().copied()
    }

    /// Whether the next step's choice depends on this step's token on the host (a budget
    /// that may run out): such a row is stepped synchronously, as constrained rows are.
    pub(super) fn needs_host_choice(&self) -> bool {
        self.open && self.budget.is_some() && !self.close_tokens.is_empty()
    }

    pub(super) fn push(&mut self, text: &str) -> Split {
        self.splitter.push(text)
    }

    pub(super) fn finish(&mut self) -> Split {
        self.splitter.finish()
    }
}
