//! Single-sequence generation with mlx-lm's conventions: the prompt minus its last token is
//! prefilled in chunks of `prefill_step_size` (cache evaluated after each), then the last token
//! produces the first logits, and decode is pipelined one step ahead. The loop itself is the
//! engine's ([`generate`] runs the prompt as the executor's one row, [`run_single`]); this
//! module holds the options and results. The helpers both share (prefill, host reads, prompt
//! checks) live below the engine, in [`crate::prefill`].

use std::time::Instant;

use crate::cache::KvQuantization;
use crate::engine::{run_single, DecodeMode, Event, Input, Request, SingleRow};
use crate::models::LanguageModel;
use crate::sampling::SamplingParams;
use crate::tokenizer::Tokenizer;
use crate::{Error, Result};

// Below the engine (it uses them too); re-exported here, where they were first.
pub use crate::prefill::{as_f32_slice, prefill, read_token, validate_prompt_ids};
pub use crate::stop::FinishReason;

#[derive(Debug, Clone)]
pub struct GenerateOptions {
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Token ids that end generation (not included in the output).
    pub stop_token_ids: Vec<u32>,
    /// Strings that end generation (the text is cut before them).
    pub stop_strings: Vec<String>,
    pub prefill_step_size: usize,
    /// Keep this many leading raw logits of the first step (parity checks).
    pub capture_first_logits: usize,
    /// Quantize the KV cache (mlx-lm's `kv_bits` / `kv_group_size` / `quantized_kv_start`);
    /// `None` keeps it in full precision.
    pub kv_quantization: Option<KvQuantization>,
    /// Pipelined (the default) or synchronous decode steps, as [`crate::engine::EngineConfig::decode`].
    pub decode: DecodeMode,
    /// Prompt-lookup speculative decoding: draft up to this many tokens per step (0: off).
    pub num_draft_tokens: usize,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions {
            max_tokens: 256,
            sampling: SamplingParams::default(),
            stop_token_ids: Vec::new(),
            stop_strings: Vec::new(),
            prefill_step_size: 2048,
            capture_first_logits: 0,
            kv_quantization: None,
            decode: DecodeMode::default(),
            num_draft_tokens: 0,
        }
    }
}

/// One generated token as it streams out.
#[derive(Debug, Clone)]
pub struct TokenEvent<'a> {
    pub token_id: u32,
    /// UTF-8 text this token completes (may be empty; never a partial character).
    pub text: &'a str,
}

#[derive(Debug, Clone)]
pub struct Generation {
    pub tokens: Vec<u32>,
    pub text: String,
    pub finish_reason: FinishReason,
    pub prompt_tokens: usize,
    pub first_logits: Vec<f32>,
    /// Seconds from start to the first token being available.
    pub ttft_s: f64,
    /// Seconds spent producing tokens after the first.
    pub decode_s: f64,
}

impl Generation {
    /// No tokens yet (a length finish until the generation says otherwise).
    fn empty(prompt_tokens: usize) -> Self {
        Generation {
            tokens: Vec::new(),
            text: String::new(),
            finish_reason: FinishReason::Length,
            prompt_tokens,
            first_logits: Vec::new(),
            ttft_s: 0.0,
            decode_s: 0.0,
        }
    }
}

/// Checks prompt ids against the model: non-empty, in-vocabulary, within the context.
pub fn validate_prompt(model: &dyn LanguageModel, prompt: &[u32]) -> Result<()> {
    validate_prompt_ids(model.info(), prompt)
}

/// Generates from `prompt`. `on_token` sees each token as it is produced; returning `false`
/// cancels. The tokenizer, when given, provides streamed text and stop-string matching.
///
/// The prompt runs as the one row of the engine's executor (`engine::run_single`): the same
/// prefill chunks, pipelined decode and row state machine (stop ids, stop strings, the length
/// limit) as every batched request, on the caller's thread and the borrowed model.
pub fn generate(
    model: &dyn LanguageModel,
    tokenizer: Option<&Tokenizer>,
    prompt: &[u32],
    opts: &GenerateOptions,
    on_token: impl FnMut(TokenEvent) -> bool,
) -> Result<Generation> {
    validate_prompt(model, prompt)?;
    opts.sampling.validate(model.info().vocab_size as usize)?;
    if let Some(kv) = &opts.kv_quantization {
        kv.validate(Some(model.info().head_dim))?;
        if let Some(why) = model.kv_quantization_unsupported() {
            return Err(Error::Unsupported(why));
        }
    }
    if !opts.stop_strings.is_empty() && tokenizer.is_none() {
        return Err(Error::InvalidRequest("stop strings need a model with a tokenizer".into()));
    }
    let max_tokens = match model.info().max_position_embeddings {
        Some(ctx) => opts.max_tokens.min(ctx.saturating_sub(prompt.len())),
        None => opts.max_tokens,
    };
    if max_tokens == 0 {
        // Nothing to generate (a row always produces at least one token).
        return Ok(Generation::empty(prompt.len()));
    }
    let start = Instant::now();
    let request = Request {
        max_tokens,
        sampling: opts.sampling.clone(),
        stop: opts.stop_strings.clone(),
        capture_first_logits: opts.capture_first_logits,
        ..Request::new(Input::Tokens(prompt.to_vec()))
    };
    let row = SingleRow {
        prompt,
        request,
        stop_token_ids: opts.stop_token_ids.clone(),
        prefill_step_size: opts.prefill_step_size,
        kv_quantization: opts.kv_quantization,
        decode: opts.decode,
        num_draft_tokens: opts.num_draft_tokens,
    };
    let mut out = Generation::empty(prompt.len());
    let mut first_token_at: Option<Instant> = None;
    let mut on_token = on_token;
    run_single(model, tokenizer, row, |event| {
        if first_token_at.is_none() && !matches!(event, Event::Started { .. }) {
            first_token_at = Some(Instant::now());
            out.ttft_s = start.elapsed().as_secs_f64();
        }
        match event {
            Event::Token { token_id, text, .. } => {
                out.tokens.push(token_id);
                out.text.push_str(&text);
                on_token(TokenEvent { token_id, text: &text })
            }
            Event::Done { finish_reason, text, first_logits, .. } => {
                out.text.push_str(&text);
                out.finish_reason = finish_reason;
                out.first_logits = first_logits;
                if let Some(t) = first_token_at {
                    out.decode_s = t.elapsed().as_secs_f64();
                }
                true
            }
            _ => true,
        }
    })?;
    Ok(out)
}
