//! Incremental detokenization for streaming generation.
//!
//! Decoding token by token and concatenating is wrong in two ways: a character can be split
//! across tokens (byte-level BPE and byte-fallback tokens carry raw UTF-8 bytes), and decoders
//! treat the first token of a sequence specially (sentencepiece's leading-space strip). So each
//! step decodes a small window — the tokens of the previous chunk as context, then the pending
//! ones — and emits the text past the context's own decoding, once that text does not end in
//! U+FFFD (the mark of an incomplete character).
//!
//! Every window starts where a previous chunk ended, on a complete character, so the chunks
//! concatenate to the decoding of the whole sequence whenever it is valid UTF-8 (and, with
//! byte-level BPE, always).

use std::sync::Arc;

use super::Tokenizer;
use crate::{Error, Result};

const REPLACEMENT: char = '\u{FFFD}';

/// Turns a stream of token ids into text chunks; see the module docs.
#[derive(Debug, Clone)]
pub struct StreamDecoder {
    /// Shared, so a decoder can live as long as the request it serves.
    tokenizer: Arc<tokenizers::Tokenizer>,
    skip_special_tokens: bool,
    /// The context tokens (`..context_len`, already emitted) then the pending ones.
    window: Vec<u32>,
    context_len: usize,
    /// `decode(window[..context_len])`, which the decoding of the whole window starts with.
    context_text: String,
}

impl StreamDecoder {
    /// `skip_special_tokens` as in [`Tokenizer::decode`].
    pub fn new(tokenizer: &Tokenizer, skip_special_tokens: bool) -> Self {
        Self {
            tokenizer: tokenizer.shared_inner(),
            skip_special_tokens,
            window: Vec::new(),
            context_len: 0,
            context_text: String::new(),
        }
    }

    /// Adds one token; returns the text it completes, or `None` while a character is still
    /// incomplete (or the token decodes to nothing, e.g. a skipped special token).
    pub fn step(&mut self, id: u32) -> Result<Option<String>> {
        self.window.push(id);
        let text = self.decode(&self.window)?;
        if text.len() <= self.context_text.len() || text.ends_with(REPLACEMENT) {
            return Ok(None);
        }
        let new_text = self.emit(&text)?;
        Ok(Some(new_text).filter(|t| !t.is_empty()))
    }

    /// Returns whatever is still pending at the end of the stream (possibly nothing), with
    /// invalid or incomplete trailing bytes shown as U+FFFD.
    pub fn flush(&mut self) -> Result<String> {
        let text = self.decode(&self.window)?;
        if text.len() <= self.context_text.len() {
            return Ok(String::new());
        }
        self.emit(&text)
    }

    /// Cuts the new text off `window_text` (the decoding of the whole window) and makes the
    /// tokens just emitted the context for the next chunk.
    fn emit(&mut self, window_text: &str) -> Result<String> {
        let new_text = match window_text.strip_prefix(self.context_text.as_str()) {
            Some(new_text) => new_text.to_string(),
            // Only invalid UTF-8 gets here: `ByteFallback` turns a whole run of byte tokens into
            // U+FFFD once a later byte makes the run invalid, rewriting text already emitted.
            // That cannot be taken back; skip as many characters as were emitted.
            None => window_text.chars().skip(self.context_text.chars().count()).collect(),
        };
        self.window.drain(..self.context_len);
        self.context_len = self.window.len();
        self.context_text = self.decode(&self.window)?;
        Ok(new_text)
    }

    fn decode(&self, ids: &[u32]) -> Result<String> {
        self.tokenizer
            .decode(ids, self.skip_special_tokens)
            .map_err(|e| Error::Tokenizer(format!("decoding {ids:?}: {e}")))
    }
}
