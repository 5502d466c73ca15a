//! Tokenization, chat templates and streaming detokenization.
//!
//! A [`Tokenizer`] comes either from a Hugging Face model directory (`tokenizer.json` and its
//! companion configs) or from a GGUF file's `tokenizer.ggml.*` metadata. Either way it encodes and
//! decodes like the transformers tokenizer for the same files, knows the model's BOS and its set
//! of end-of-sequence ids, and renders the model's chat template.

mod chat_template;
mod detokenizer;
mod gguf_vocab;

use std::path::Path;
use std::sync::Arc;

use serde_json::Value as Json;
use tokenizers::processors::template::TemplateProcessing;

pub use chat_template::{ChatMessage, ChatTemplate, ToolCall};
pub use detokenizer::StreamDecoder;

use crate::gguf::GgufHeader;
use crate::{Error, Result};

/// A tokenizer plus what generation needs around it. Cloning is cheap (the vocabulary is shared).
#[derive(Debug, Clone)]
pub struct Tokenizer {
    inner: Arc<tokenizers::Tokenizer>,
    bos_token_id: Option<u32>,
    eos_token_ids: Vec<u32>,
    chat_template: Option<ChatTemplate>,
    warnings: Vec<String>,
}

impl Tokenizer {
    /// Loads a Hugging Face model directory:
    /// - `tokenizer.json` (required): vocabulary, normalization, pre-tokenization, decoding;
    /// - `tokenizer_config.json`: `bos_token`, `eos_token`, `chat_template`, and
    ///   `add_bos_token`/`add_eos_token`, which when present decide whether `encode` adds them
    ///   (as transformers does); otherwise `tokenizer.json`'s post-processor decides;
    /// - `chat_template.jinja` (or `chat_template.json`): the chat template, preferred over the
    ///   one in `tokenizer_config.json`, as in transformers;
    /// - `generation_config.json` and `config.json`: `eos_token_id` (an id or a list of ids),
    ///   merged into [`Tokenizer::eos_token_ids`].
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        let tokenizer_path = dir.join("tokenizer.json");
        if !tokenizer_path.is_file() {
            return Err(Error::ModelLoad(format!("{} has no tokenizer.json", dir.display())));
        }
        let mut inner = tokenizers::Tokenizer::from_file(&tokenizer_path)
            .map_err(|e| Error::Tokenizer(format!("{}: {e}", tokenizer_path.display())))?;

        let config = read_json(&dir.join("tokenizer_config.json"))?.unwrap_or(Json::Null);
        let mut warnings = Vec::new();
        let mut special_token = |key: &str| -> Option<(u32, String)> {
            let token = config.get(key).and_then(token_content)?;
            let id = inner.token_to_id(token);
            if id.is_none() {
                warnings.push(format!("tokenizer_config.json: {key} {token:?} is not in tokenizer.json; ignoring it"));
            }
            Some((id?, token.to_string()))
        };
        let bos = special_token("bos_token");
        let eos = special_token("eos_token");

        let add_bos = config.get("add_bos_token").and_then(Json::as_bool);
        let add_eos = config.get("add_eos_token").and_then(Json::as_bool);
        if add_bos.is_some() || add_eos.is_some() {
            let added =
                |flag: Option<bool>, token: &Option<(u32, String)>| token.clone().filter(|_| flag == Some(true));
            inner.with_post_processor(Some(special_tokens_processor(added(add_bos, &bos), added(add_eos, &eos))?));
        }

        let chat_template = match chat_template_source(dir, &config)? {
            Some(source) => Some(ChatTemplate::new(
                &source,
                bos.as_ref().map(|(_, t)| t.clone()),
                eos.as_ref().map(|(_, t)| t.clone()),
            )?),
            None => None,
        };
        let mut tokenizer = Self {
            inner: Arc::new(inner),
            bos_token_id: bos.map(|(id, _)| id),
            eos_token_ids: Vec::new(),
            chat_template,
            warnings,
        };
        tokenizer.add_eos_token_ids(eos.map(|(id, _)| id));
        for file in ["generation_config.json", "config.json"] {
            tokenizer.add_eos_token_ids(configured_eos_ids(&dir.join(file))?);
        }
        Ok(tokenizer)
    }

    /// Builds the tokenizer a GGUF file describes (byte-level BPE vocabularies only, i.e.
    /// `tokenizer.ggml.model = "gpt2"`). Text is split as llama.cpp splits it for the file's
    /// `tokenizer.ggml.pre`; an unknown value falls back to GPT-2's split and leaves a note in
    /// [`Tokenizer::warnings`].
    pub fn from_gguf(header: &GgufHeader) -> Result<Self> {
        let built = gguf_vocab::build(header)?;
        let chat_template = match built.chat_template {
            Some(source) => {
                Some(ChatTemplate::new(&source, built.bos.as_ref().map(|(_, t)| t.clone()), built.eos_token)?)
            }
            None => None,
        };
        let mut tokenizer = Self {
            inner: Arc::new(built.tokenizer),
            bos_token_id: built.bos.map(|(id, _)| id),
            eos_token_ids: Vec::new(),
            chat_template,
            warnings: built.warnings,
        };
        tokenizer.add_eos_token_ids(built.eos_ids);
        Ok(tokenizer)
    }

    /// Adds end-of-sequence ids from elsewhere (e.g. a model config read by the caller);
    /// duplicates are ignored.
    pub fn add_eos_token_ids(&mut self, ids: impl IntoIterator<Item = u32>) {
        for id in ids {
            if !self.eos_token_ids.contains(&id) {
                self.eos_token_ids.push(id);
            }
        }
    }

    /// Token ids for `text`. `add_special_tokens` adds what the tokenizer adds around a
    /// sequence (e.g. BOS), as in transformers' `encode`; special tokens written in the text
    /// (`<|im_start|>`) are always recognized.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let encoding = self
            .inner
            .encode(text, add_special_tokens)
            .map_err(|e| Error::Tokenizer(format!("encoding failed: {e}")))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Text for `ids`; ids outside the vocabulary decode to nothing, as in transformers.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.inner.decode(ids, skip_special_tokens).map_err(|e| Error::Tokenizer(format!("decoding failed: {e}")))
    }

    /// A decoder for streaming generated ids as text, keeping special tokens like
    /// `decode(ids, false)`; see [`StreamDecoder`] (and [`StreamDecoder::new`] to skip them).
    pub fn stream_decoder(&self) -> StreamDecoder {
        StreamDecoder::new(self, false)
    }

    /// Number of ids, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    pub fn bos_token_id(&self) -> Option<u32> {
        self.bos_token_id
    }

    /// Every id that ends generation, without duplicates, the tokenizer's own EOS first.
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.eos_token_ids
    }

    pub fn is_eos(&self, id: u32) -> bool {
        self.eos_token_ids.contains(&id)
    }

    /// The id of a vocabulary entry, spelled as the vocabulary spells it (byte-level
    /// vocabularies write a leading space as `Ġ`).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.chat_template.as_ref()
    }

    /// Renders `messages` with the model's chat template and encodes the result without adding
    /// special tokens again (the template writes them), like transformers'
    /// `apply_chat_template(tokenize=True)`.
    pub fn apply_chat_template(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<Vec<u32>> {
        let template = self
            .chat_template
            .as_ref()
            .ok_or_else(|| Error::Tokenizer("this model has no chat template; pass a raw prompt".into()))?;
        self.encode(&template.render(messages, add_generation_prompt)?, false)
    }

    /// Things about loading that did not fail but may matter (e.g. an unknown GGUF
    /// pre-tokenizer that was replaced by GPT-2's).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// The underlying `tokenizers` tokenizer, e.g. to save it as `tokenizer.json`.
    pub(crate) fn shared_inner(&self) -> Arc<tokenizers::Tokenizer> {
        Arc::clone(&self.inner)
    }

    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}

/// A post-processor that puts `bos` before and `eos` after each sequence (either may be absent),
/// like transformers' `update_post_processor`.
fn special_tokens_processor(bos: Option<(u32, String)>, eos: Option<(u32, String)>) -> Result<TemplateProcessing> {
    let piece = |token: &Option<(u32, String)>, type_id: u8| token.as_ref().map(|(_, t)| format!("{t}:{type_id}"));
    let single: Vec<String> = [piece(&bos, 0), Some("$A:0".into()), piece(&eos, 0)].into_iter().flatten().collect();
    let pair: Vec<String> = single
        .iter()
        .cloned()
        .chain([piece(&bos, 1), Some("$B:1".into()), piece(&eos, 1)].into_iter().flatten())
        .collect();
    let special_tokens: Vec<(String, u32)> = bos.into_iter().chain(eos).map(|(id, t)| (t, id)).collect();
    TemplateProcessing::builder()
        .try_single(single)
        .and_then(|b| b.try_pair(pair))
        .map_err(|e| Error::Tokenizer(format!("special-token template: {e}")))?
        .special_tokens(special_tokens)
        .build()
        .map_err(|e| Error::Tokenizer(format!("special-token template: {e}")))
}

/// A special token in `tokenizer_config.json`: a string or an `AddedToken` object.
fn token_content(value: &Json) -> Option<&str> {
    value.as_str().or_else(|| value.get("content")?.as_str())
}

fn read_json(path: &Path) -> Result<Option<Json>> {
    if !path.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| Error::ModelLoad(format!("{} is not valid JSON: {e}", path.display())))
}

/// `eos_token_id` in a model config file, if the file exists: absent/null, one id, or a list of ids.
fn configured_eos_ids(path: &Path) -> Result<Vec<u32>> {
    let Some(config) = read_json(path)? else { return Ok(Vec::new()) };
    let invalid = |v: &Json| {
        Error::ModelLoad(format!("{}: eos_token_id must be an id or a list of ids, found {v}", path.display()))
    };
    let as_id = |v: &Json| v.as_u64().and_then(|id| u32::try_from(id).ok()).ok_or_else(|| invalid(v));
    match config.get("eos_token_id") {
        None | Some(Json::Null) => Ok(Vec::new()),
        Some(Json::Array(ids)) => ids.iter().map(as_id).collect(),
        Some(id) => Ok(vec![as_id(id)?]),
    }
}

/// The chat template, looked up where transformers looks: `chat_template.jinja`, then
/// `chat_template.json`, then `tokenizer_config.json` (a string, or a list of named templates of
/// which the one named "default" is used).
fn chat_template_source(dir: &Path, config: &Json) -> Result<Option<String>> {
    let jinja = dir.join("chat_template.jinja");
    if jinja.is_file() {
        return std::fs::read_to_string(&jinja).map(Some).map_err(|e| Error::io(&jinja, e));
    }
    let from_json = |json: &Json| -> Option<String> {
        match json.get("chat_template")? {
            Json::String(source) => Some(source.clone()),
            Json::Array(named) => named
                .iter()
                .find(|t| t.get("name").and_then(Json::as_str) == Some("default"))
                .and_then(|t| t.get("template")?.as_str().map(str::to_string)),
            _ => None,
        }
    };
    if let Some(json) = read_json(&dir.join("chat_template.json"))? {
        if let Some(source) = from_json(&json) {
            return Ok(Some(source));
        }
    }
    Ok(from_json(config))
}
