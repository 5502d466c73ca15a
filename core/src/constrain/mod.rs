//! Constrained decoding: a request's [`Constraint`] (JSON schema, JSON object, regular
//! expression, Lark grammar, choice list) becomes a per-row [`RowConstraint`] that says, before
//! each sampling step, which tokens may come next.
//!
//! The engine is [llguidance](https://crates.io/crates/llguidance): its token trie and grammar
//! compiler ([`ConstraintFactory`]) are built once per loaded model from the model's
//! [`Tokenizer`] (Hugging Face `tokenizer.json` or GGUF-embedded alike: both are
//! `tokenizers::Tokenizer`s, serialized to JSON for llguidance's byte mapping), on the first
//! constrained request. Each row then owns a matcher that is compiled and checked on the
//! caller's thread at submit, so a bad schema or a grammar that accepts nothing fails there.
//!
//! End-of-sequence is the row's business, not the grammar's: the row's stop ids are allowed
//! exactly when the grammar is in an accepting state, and never appear as grammar text.

use std::fmt;
use std::sync::{Arc, OnceLock};

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{SimpleVob, TokEnv, TokRxInfo, TokTrie, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;

use crate::tokenizer::Tokenizer;
use crate::{Error, Result};

/// What a request's output must match.
#[derive(Debug, Clone, PartialEq)]
pub enum Constraint {
    /// A JSON Schema (the subset OpenAI's "strict" structured outputs accept, and more:
    /// `$ref`/`$defs`, `anyOf`, `enum`, `const`, string/number/array bounds).
    JsonSchema(Value),
    /// Any JSON object (OpenAI `response_format: {"type": "json_object"}`).
    JsonObject,
    /// A regular expression the whole output must match (anchored at both ends).
    Regex(String),
    /// A grammar in llguidance's Lark syntax; it may embed JSON schemas with `%json {...}`.
    Lark(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
}

impl Constraint {
    /// The request field this constraint came from, as messages name it.
    pub fn field(&self) -> &'static str {
        match self {
            Constraint::JsonSchema(_) => "json_schema",
            Constraint::JsonObject => "response_format",
            Constraint::Regex(_) => "regex",
            Constraint::Lark(_) => "grammar",
            Constraint::Choice(_) => "choice",
        }
    }

    fn grammar(&self) -> Result<TopLevelGrammar> {
        let bad = |why: &str| Error::InvalidRequest(format!("{}: {why}", self.field()));
        Ok(match self {
            Constraint::JsonSchema(schema) => {
                if !schema.is_object() && !schema.is_boolean() {
                    return Err(bad("a JSON schema must be an object"));
                }
                TopLevelGrammar::from_json_schema(compact(schema.clone()))
            }
            Constraint::JsonObject => TopLevelGrammar::from_json_schema(compact(serde_json::json!({"type": "object"}))),
            Constraint::Regex(rx) => TopLevelGrammar::from_regex(rx),
            Constraint::Lark(lark) => {
                if lark.trim().is_empty() {
                    return Err(bad("the grammar is empty"));
                }
                TopLevelGrammar::from_lark(lark.clone())
            }
            Constraint::Choice(items) => {
                if items.is_empty() {
                    return Err(bad("the choice list is empty"));
                }
                let alternatives: Vec<String> = items.iter().map(|s| regex::escape(s)).collect();
                TopLevelGrammar::from_regex(&format!("(?:{})", alternatives.join("|")))
            }
        })
    }
}

/// JSON without optional whitespace (`{"a":1,"b":[2,3]}`), unless the schema asks otherwise
/// through llguidance's `x-guidance` options: small models otherwise tend to spend their token
/// budget on whitespace, which flexible JSON grammars allow without limit.
fn compact(mut schema: Value) -> Value {
    if let Some(obj) = schema.as_object_mut() {
        obj.entry("x-guidance").or_insert_with(|| serde_json::json!({"whitespace_flexible": false}));
    }
    schema
}

/// The model's token trie and grammar compiler, shared by every constrained row.
pub struct ConstraintFactory {
    parsers: ParserFactory,
    /// Tokens llguidance treats as end-of-sequence (masked out of grammar text).
    trie_eos: Vec<u32>,
}

impl ConstraintFactory {
    /// Builds the token trie from `tokenizer`'s vocabulary (byte-level BPE and SentencePiece
    /// byte-fallback vocabularies; special tokens can never be produced by grammar text).
    pub fn new(tokenizer: &Tokenizer) -> Result<Self> {
        let unsupported = |why: String| Error::Unsupported(format!("constrained decoding for this tokenizer: {why}"));
        let json: Value = serde_json::from_str(&tokenizer.inner().to_string(false).map_err(|e| unsupported(e.to_string()))?)
            .map_err(|e| unsupported(e.to_string()))?;
        // llguidance's vocabulary reader asserts on shapes it does not expect; a tokenizer it
        // cannot read is an error for the request, not a panic in the caller.
        let words = std::panic::catch_unwind(|| llguidance::token_bytes_from_tokenizer_json(&json))
            .map_err(|_| unsupported("its vocabulary could not be mapped to bytes".into()))?
            .map_err(|e| unsupported(e.to_string()))?;
        let vocab = words.len().max(tokenizer.vocab_size());
        let mut words = words;
        words.resize(vocab, Vec::new());
        let eos = tokenizer.eos_token_ids().to_vec();
        let info = TokRxInfo::new(vocab as u32, eos.first().copied().unwrap_or(0));
        let mut trie = TokTrie::from(&info, &words);
        if !eos.is_empty() {
            trie = trie.with_eos_tokens(&eos);
        }
        let trie_eos = trie.eos_tokens().to_vec();
        let env: TokEnv = Arc::new(TrieEnv { trie, tokenizer: tokenizer.clone() });
        let mut parsers = ParserFactory::new_simple(&env).map_err(|e| unsupported(e.to_string()))?;
        parsers.quiet();
        Ok(ConstraintFactory { parsers, trie_eos })
    }

    /// Compiles `constraint` for one row and checks that it accepts some output.
    pub fn compile(&self, constraint: &Constraint) -> Result<RowConstraint> {
        let field = constraint.field();
        let grammar = constraint.grammar()?;
        let parser = self
            .parsers
            .create_parser(grammar)
            .map_err(|e| Error::InvalidRequest(format!("{field}: {}", first_line(&e.to_string()))))?;
        let mut row = RowConstraint {
            matcher: Matcher::new(Ok(parser)),
            field,
            next: None,
            trie_eos: self.trie_eos.clone(),
        };
        row.prepare_mask().map_err(|e| match e {
            Error::InvalidRequest(m) => Error::InvalidRequest(format!("{m} (the constraint accepts no output)")),
            other => other,
        })?;
        Ok(row)
    }
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or(s)
}

/// The factory, built once per tokenizer (so once per loaded model) on first use; cloned
/// tokenizers share it.
#[derive(Clone, Default)]
pub(crate) struct FactoryCell(Arc<OnceLock<std::result::Result<Arc<ConstraintFactory>, String>>>);

impl FactoryCell {
    pub(crate) fn get_or_build(&self, tokenizer: &Tokenizer) -> Result<Arc<ConstraintFactory>> {
        self.0
            .get_or_init(|| ConstraintFactory::new(tokenizer).map(Arc::new).map_err(|e| e.to_string()))
            .clone()
            .map_err(Error::Unsupported)
    }
}

impl fmt::Debug for FactoryCell {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.get().is_some() { "FactoryCell(built)" } else { "FactoryCell(empty)" })
    }
}

/// Compiles `constraint` against `tokenizer`'s (lazily built, shared) factory.
pub fn compile(constraint: &Constraint, tokenizer: &Tokenizer) -> Result<RowConstraint> {
    tokenizer.constraint_factory()?.compile(constraint)
}

/// One row's grammar state: the allowed-token mask for its next token, and the token commits.
pub struct RowConstraint {
    matcher: Matcher,
    field: &'static str,
    /// The mask for the next token, computed ahead of the step that needs it.
    next: Option<SimpleVob>,
    trie_eos: Vec<u32>,
}

impl fmt::Debug for RowConstraint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RowConstraint").field("field", &self.field).field("stopped", &self.matcher.is_stopped()).finish()
    }
}

impl RowConstraint {
    /// Computes the next token's mask if it is not known yet (the expensive part: run it off
    /// the critical path).
    pub fn prepare_mask(&mut self) -> Result<()> {
        if self.next.is_none() && !self.matcher.is_stopped() {
            let mask = self.matcher.compute_mask().map_err(|e| self.error(e))?;
            self.next = Some(mask);
        }
        Ok(())
    }

    /// A mask is still to be computed before the next token can be sampled.
    pub fn needs_mask(&self) -> bool {
        self.next.is_none() && !self.matcher.is_stopped()
    }

    /// The grammar is complete: nothing but end-of-sequence may follow.
    pub fn is_finished(&self) -> bool {
        self.matcher.is_stopped()
    }

    /// The output so far is a complete match (end-of-sequence is allowed here).
    pub fn is_accepting(&mut self) -> bool {
        self.matcher.is_accepting().unwrap_or(false)
    }

    /// The additive bias for a logits row of `width`: 0 for allowed tokens, -inf for the rest.
    /// Call [`RowConstraint::prepare_mask`] first.
    pub fn bias(&mut self, width: usize, stop_ids: &[u32]) -> Result<Vec<f32>> {
        self.prepare_mask()?;
        let mut bias = vec![f32::NEG_INFINITY; width];
        if let Some(mask) = &self.next {
            mask.iter_set_entries(|t| {
                if t < width {
                    bias[t] = 0.0;
                }
            });
        }
        for &t in &self.trie_eos {
            if let Some(b) = bias.get_mut(t as usize) {
                *b = f32::NEG_INFINITY;
            }
        }
        let accepting = self.is_accepting();
        for &t in stop_ids {
            if let Some(b) = bias.get_mut(t as usize) {
                *b = if accepting { 0.0 } else { f32::NEG_INFINITY };
            }
        }
        Ok(bias)
    }

    /// Advances the grammar by a sampled token (never an end-of-sequence id: the row ends there).
    pub fn commit(&mut self, token: u32) -> Result<()> {
        self.next = None;
        self.matcher.consume_token(token).map_err(|e| self.error(e))
    }

    fn error(&self, e: impl fmt::Display) -> Error {
        Error::InvalidRequest(format!("{}: {}", self.field, first_line(&e.to_string())))
    }
}

/// The tokenizer environment llguidance compiles against: our trie, and our tokenizer for
/// canonical tokenization of forced text.
struct TrieEnv {
    trie: TokTrie,
    tokenizer: Tokenizer,
}

impl TokenizerEnv for TrieEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<u32> {
        match std::str::from_utf8(s) {
            Ok(text) => self.tokenizer.encode(text, false).unwrap_or_else(|_| self.trie.greedy_tokenize(s)),
            Err(_) => self.trie.greedy_tokenize(s),
        }
    }
}
