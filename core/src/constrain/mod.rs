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
//!
//! A [`Triggered`] constraint (tool calls under `tool_choice: auto`) is compiled at submit
//! like the others but waits: until one of its triggers appears in the output no mask is
//! computed or applied (the text is free, at no cost), and from the trigger on the output
//! must match its grammar. A trigger that is a special token of the tokenizer fires on that
//! token; otherwise on its text, found across token boundaries.

use std::fmt;
use std::sync::{Arc, OnceLock};

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{SimpleVob, TokEnv, TokRxInfo, TokTrie, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;

use crate::tokenizer::Tokenizer;
use crate::{Error, Result};

/// What a request's output must match.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
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
    /// Free text until a trigger appears, then a Lark grammar (tool calls under `auto`).
    Triggered(Triggered),
}

/// A grammar that switches on mid-output.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Triggered {
    /// What switches the grammar on (the first to appear).
    pub triggers: Vec<Trigger>,
    /// The Lark grammar of the output from the trigger on.
    pub lark: String,
}

/// One way a [`Triggered`] grammar switches on.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Trigger {
    /// The text that fires it; a special token of this name fires it too.
    pub text: String,
    /// The grammar's input begins with the trigger's text (else just after it).
    pub included: bool,
    /// Fires only when nothing but whitespace comes before it in the output.
    pub at_start: bool,
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
            Constraint::Triggered(_) => "tools",
        }
    }

    fn grammar(&self) -> Result<TopLevelGrammar> {
        let bad = |why: &str| Error::InvalidRequest(format!("{}: {why}", self.field()));
        Ok(match self {
            Constraint::JsonSchema(schema) => {
                if !schema.is_object() && !schema.is_boolean() {
                    return Err(bad("a JSON schema must be an object"));
                }
                check_schema_patterns(schema).map_err(|why| bad(&why))?;
                TopLevelGrammar::from_json_schema(compact(schema.clone()))
            }
            Constraint::JsonObject => TopLevelGrammar::from_json_schema(compact(serde_json::json!({"type": "object"}))),
            Constraint::Regex(rx) => {
                check_regex_size(rx).map_err(|why| bad(&why))?;
                TopLevelGrammar::from_regex(rx)
            }
            Constraint::Lark(lark) | Constraint::Triggered(Triggered { lark, .. }) => {
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

pub use crate::limits::MAX_REGEX_EXPANSION;

/// Refuses a regex whose counted repetitions multiply out past [`MAX_REGEX_EXPANSION`]
/// (`(a{1000}){1000}` is a million): llguidance compiles it lazily, accepts it, and then spends
/// seconds per token unrolling it until its lexer runs out of fuel mid-generation. The size
/// counts literal bytes and classes as written, times each enclosing `{n}` / `{m,n}` bound
/// (`*` and `+` count once: loops cost nothing to unroll). A regex this parser cannot read is
/// left to llguidance's own error.
fn check_regex_size(rx: &str) -> std::result::Result<(), String> {
    let Ok(hir) = regex_syntax::ParserBuilder::new().build().parse(rx) else { return Ok(()) };
    let size = expansion(&hir);
    if size > MAX_REGEX_EXPANSION {
        return Err(format!(
            "the regular expression expands to about {size} elements through its counted repetitions \
             ({{n}}, {{m,n}}); at most {MAX_REGEX_EXPANSION} are accepted"
        ));
    }
    Ok(())
}

fn expansion(h: &regex_syntax::hir::Hir) -> u64 {
    use regex_syntax::hir::HirKind;
    match h.kind() {
        HirKind::Empty | HirKind::Look(_) | HirKind::Class(_) => 1,
        HirKind::Literal(lit) => lit.0.len() as u64,
        HirKind::Capture(c) => expansion(&c.sub),
        HirKind::Repetition(r) => (r.max.unwrap_or(r.min).max(1) as u64).saturating_mul(expansion(&r.sub)),
        HirKind::Concat(parts) | HirKind::Alternation(parts) => {
            parts.iter().fold(0u64, |n, p| n.saturating_add(expansion(p)))
        }
    }
}

/// [`check_regex_size`] on every `pattern` of a JSON schema.
fn check_schema_patterns(v: &Value) -> std::result::Result<(), String> {
    match v {
        Value::Object(map) => {
            for (k, x) in map {
                match (k.as_str(), x) {
                    ("pattern", Value::String(rx)) => check_regex_size(rx).map_err(|why| format!("pattern {rx:?}: {why}"))?,
                    _ => check_schema_patterns(x)?,
                }
            }
            Ok(())
        }
        Value::Array(items) => items.iter().try_for_each(check_schema_patterns),
        _ => Ok(()),
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
    env: TokEnv,
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
        // The env holds the `tokenizers` tokenizer, not a `Tokenizer`: a `Tokenizer` owns the
        // cell this factory lives in, and holding one here would be a cycle that is never freed.
        let env: TokEnv = Arc::new(TrieEnv { trie, tokenizer: tokenizer.shared_inner() });
        let mut parsers = ParserFactory::new_simple(&env).map_err(|e| unsupported(e.to_string()))?;
        parsers.quiet();
        Ok(ConstraintFactory { parsers, env, trie_eos })
    }

    /// The id of the special token written `text` (a grammar can only produce it as that
    /// token, never as text).
    pub fn special_token(&self, text: &str) -> Option<u32> {
        self.env.tok_trie().get_special_token(text)
    }

    /// Compiles `constraint` for one row and checks that it accepts some output.
    pub fn compile(&self, constraint: &Constraint) -> Result<RowConstraint> {
        let field = constraint.field();
        let grammar = constraint.grammar()?;
        let parser = self
            .parsers
            .create_parser(grammar)
            .map_err(|e| Error::InvalidRequest(format!("{field}: {}", first_line(&e.to_string()))))?;
        let waiting = match constraint {
            Constraint::Triggered(t) => Some(Waiting::new(t, self.env.clone())),
            _ => None,
        };
        let mut row = RowConstraint {
            matcher: Matcher::new(Ok(parser)),
            field,
            next: None,
            trie_eos: self.trie_eos.clone(),
            waiting,
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

/// One model's [`ConstraintFactory`], built on first use from its tokenizer and shared by
/// clones. The tokenizer's owner keeps it beside the tokenizer (`loading::LoadedModel::constraints`,
/// then the engine built from it), not the tokenizer itself: the factory holds the tokenizer
/// (llguidance tokenizes forced text with it), so a tokenizer holding its factory would be a
/// reference cycle, and `tokenizer` importing this module an import cycle.
#[derive(Clone, Default)]
pub struct ConstraintFactoryCell(Arc<OnceLock<std::result::Result<Arc<ConstraintFactory>, String>>>);

impl ConstraintFactoryCell {
    /// The factory for `tokenizer`, built on the first call (later calls return that one:
    /// pass the same model's tokenizer every time).
    pub fn get_or_build(&self, tokenizer: &Tokenizer) -> Result<Arc<ConstraintFactory>> {
        self.0
            .get_or_init(|| ConstraintFactory::new(tokenizer).map(Arc::new).map_err(|e| e.message()))
            .clone()
            .map_err(Error::Unsupported)
    }

    /// Compiles `constraint` against the (lazily built, shared) factory of `tokenizer`.
    pub fn compile(&self, constraint: &Constraint, tokenizer: &Tokenizer) -> Result<RowConstraint> {
        self.get_or_build(tokenizer)?.compile(constraint)
    }
}

impl fmt::Debug for ConstraintFactoryCell {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.get().is_some() { "ConstraintFactoryCell(built)" } else { "ConstraintFactoryCell(empty)" })
    }
}

/// One row's grammar state: the allowed-token mask for its next token, and the token commits.
pub struct RowConstraint {
    matcher: Matcher,
    field: &'static str,
    /// The mask for the next token, computed ahead of the step that needs it.
    next: Option<SimpleVob>,
    trie_eos: Vec<u32>,
    /// A triggered grammar not switched on yet: the output is free.
    waiting: Option<Waiting>,
}

impl fmt::Debug for RowConstraint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RowConstraint")
            .field("field", &self.field)
            .field("waiting", &self.waiting.is_some())
            .field("stopped", &self.matcher.is_stopped())
            .finish()
    }
}

/// A triggered grammar's watch over the free text before its trigger.
struct Waiting {
    /// Each trigger with the special token that fires it, if the tokenizer has one.
    triggers: Vec<(Trigger, Option<u32>)>,
    env: TokEnv,
    /// The end of the output so far, as long as a trigger could straddle (bytes).
    tail: Vec<u8>,
    /// The output before `tail` is whitespace only.
    space_before_tail: bool,
}

impl Waiting {
    fn new(t: &Triggered, env: TokEnv) -> Self {
        let trie = env.tok_trie();
        let triggers = t.triggers.iter().map(|tr| (tr.clone(), trie.get_special_token(&tr.text))).collect();
        Waiting { triggers, env, tail: Vec::new(), space_before_tail: true }
    }

    /// Watches `token`; when it fires a trigger, the bytes the grammar starts with (what of
    /// the output, from the trigger or just after it, is already written).
    fn fire(&mut self, token: u32) -> Option<Vec<u8>> {
        let trie = self.env.tok_trie();
        if trie.is_special_token(token) {
            let at_start = self.space_before_tail && self.tail.iter().all(u8::is_ascii_whitespace);
            let fired = self.triggers.iter().find(|(tr, id)| *id == Some(token) && (!tr.at_start || at_start));
            if let Some((tr, _)) = fired {
                return Some(if tr.included { tr.text.as_bytes().to_vec() } else { Vec::new() });
            }
            // Another special token: text cannot run across it.
            self.tail.clear();
            self.space_before_tail = false;
            return None;
        }
        let mut text = std::mem::take(&mut self.tail);
        text.extend_from_slice(trie.token(token));
        // The earliest trigger in the text (ties: the longest).
        let mut best: Option<(usize, &Trigger)> = None;
        for (tr, _) in &self.triggers {
            let needle = tr.text.as_bytes();
            if needle.is_empty() {
                continue;
            }
            let Some(at) = text.windows(needle.len()).position(|w| w == needle) else { continue };
            if tr.at_start && !(self.space_before_tail && text[..at].iter().all(u8::is_ascii_whitespace)) {
                continue;
            }
            if best.is_none_or(|(b, bt)| at < b || (at == b && needle.len() > bt.text.len())) {
                best = Some((at, tr));
            }
        }
        if let Some((at, tr)) = best {
            let from = if tr.included { at } else { at + tr.text.len() };
            return Some(text[from..].to_vec());
        }
        let keep = self.triggers.iter().map(|(t, _)| t.text.len()).max().unwrap_or(1).saturating_sub(1);
        let cut = text.len().saturating_sub(keep);
        self.space_before_tail &= text[..cut].iter().all(u8::is_ascii_whitespace);
        self.tail = text[cut..].to_vec();
        None
    }
}

impl RowConstraint {
    /// Computes the next token's mask if it is not known yet (the expensive part: run it off
    /// the critical path).
    pub fn prepare_mask(&mut self) -> Result<()> {
        if self.waiting.is_none() && self.next.is_none() && !self.matcher.is_stopped() {
            let mask = self.matcher.compute_mask().map_err(|e| self.error(e))?;
            self.next = Some(mask);
        }
        Ok(())
    }

    /// A mask is still to be computed before the next token can be sampled.
    pub fn needs_mask(&self) -> bool {
        self.waiting.is_none() && self.next.is_none() && !self.matcher.is_stopped()
    }

    /// A triggered grammar still waiting for its trigger: the output is free, no mask applies.
    pub fn is_waiting(&self) -> bool {
        self.waiting.is_some()
    }

    /// The grammar is complete: nothing but end-of-sequence may follow.
    pub fn is_finished(&self) -> bool {
        self.waiting.is_none() && self.matcher.is_stopped()
    }

    /// The output so far is a complete match (end-of-sequence is allowed here); free text
    /// before a trigger is.
    pub fn is_accepting(&mut self) -> bool {
        self.waiting.is_some() || self.matcher.is_accepting().unwrap_or(false)
    }

    /// Whether `token` may come next ([`RowConstraint::prepare_mask`] first); any token may
    /// while a triggered grammar waits.
    pub fn allows(&self, token: u32) -> bool {
        self.waiting.is_some() || self.next.as_ref().is_some_and(|m| m.is_allowed(token))
    }

    /// The additive bias for a logits row of `width`: 0 for allowed tokens, -inf for the rest;
    /// `None` while a triggered grammar waits (no mask: the logits stay as they are).
    /// Call [`RowConstraint::prepare_mask`] first.
    pub fn bias(&mut self, width: usize, stop_ids: &[u32]) -> Result<Option<Vec<f32>>> {
        if self.waiting.is_some() {
            return Ok(None);
        }
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
        Ok(Some(bias))
    }

    /// Advances the grammar by a sampled token (never an end-of-sequence id: the row ends there).
    /// Before its trigger a triggered grammar only watches; the token that fires it hands the
    /// grammar what of the output is already written from the trigger on.
    pub fn commit(&mut self, token: u32) -> Result<()> {
        if let Some(waiting) = self.waiting.as_mut() {
            let Some(written) = waiting.fire(token) else { return Ok(()) };
            let env = waiting.env.clone();
            self.waiting = None;
            if written.is_empty() {
                return Ok(()); // the mask computed at submit is the one for the grammar's start
            }
            self.next = None;
            let tokens = env.tok_trie().greedy_tokenize(&written);
            return self.matcher.consume_tokens(&tokens).map_err(|e| {
                Error::InvalidRequest(format!(
                    "{}: the output after a tool call's opening is not a valid call ({:?}): {}",
                    self.field,
                    String::from_utf8_lossy(&written),
                    first_line(&e.to_string())
                ))
            });
        }
        self.next = None;
        self.matcher.consume_token(token).map_err(|e| self.error(e))
    }

    fn error(&self, e: impl fmt::Display) -> Error {
        Error::InvalidRequest(format!("{}: {}", self.field, first_line(&e.to_string())))
    }
}

/// The tokenizer environment llguidance compiles against: our trie, and the tokenizer for
/// canonical tokenization of forced text.
struct TrieEnv {
    trie: TokTrie,
    tokenizer: Arc<tokenizers::Tokenizer>,
}

impl TokenizerEnv for TrieEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<u32> {
        match std::str::from_utf8(s) {
            Ok(text) => match self.tokenizer.encode(text, false) {
                Ok(encoding) => encoding.get_ids().to_vec(),
                Err(_) => self.trie.greedy_tokenize(s),
            },
            Err(_) => self.trie.greedy_tokenize(s),
        }
    }
}
