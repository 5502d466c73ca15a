//! Single-sequence generation with mlx-lm's conventions: the prompt minus its last token is
//! prefilled in chunks of `prefill_step_size` (cache evaluated after each), then the last token
//! produces the first logits, and decode is pipelined one step ahead. The loop itself is the
//! engine's ([`generate`] runs the prompt as the executor's one row); this module holds the
//! options, results and the helpers both share.

use mlx_rs::transforms::eval;
use mlx_rs::Array;

use crate::cache::{KvCache, KvQuantization};
use crate::models::LanguageModel;
use crate::sampling::SamplingParams;
use crate::tokenizer::Tokenizer;
use crate::{Error, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// EOS / stop token or stop string.
    Stop,
    /// `max_tokens` or the context limit.
    Length,
    Cancelled,
    /// A request with tools stopped (any stop, or its call limit) after making calls: what
    /// OpenAI calls a `tool_calls` finish and Anthropic `tool_use`.
    #[serde(rename = "tool_calls")]
    ToolCalls,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Cancelled => "cancelled",
            FinishReason::ToolCalls => "tool_calls",
        }
    }
}

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

/// Checks prompt ids against the model: non-empty, in-vocabulary, within the context.
pub fn validate_prompt(model: &dyn LanguageModel, prompt: &[u32]) -> Result<()> {
    validate_prompt_ids(model.info(), prompt)
}

/// [`validate_prompt`] from the model's shape facts alone.
pub fn validate_prompt_ids(info: &crate::models::ModelInfo, prompt: &[u32]) -> Result<()> {
    if prompt.is_empty() {
        return Err(Error::InvalidRequest("the prompt is empty".into()));
    }
    if let Some(&bad) = prompt.iter().find(|&&t| t as i64 >= info.vocab_size as i64) {
        return Err(Error::InvalidRequest(format!(
            "prompt token id {bad} is outside the vocabulary (size {})",
            info.vocab_size
        )));
    }
    if let Some(ctx) = info.max_position_embeddings {
        if prompt.len() > ctx {
            return Err(Error::InvalidRequest(format!(
                "the prompt has {} tokens, more than the model's context of {ctx}",
                prompt.len()
            )));
        }
    }
    Ok(())
}

/// Reads a one-element token array (argmax yields uint32).
pub fn read_token(a: &Array) -> Result<u32> {
    a.eval()?;
    a.try_item_cast::<u32>().map_err(|e| Error::Mlx(format!("reading a token: {e}")))
}

/// Host view of an evaluated float32 array.
pub fn as_f32_slice(a: &Array) -> Result<&[f32]> {
    a.try_as_slice::<f32>().map_err(|e| Error::Mlx(format!("reading logits: {e}")))
}

fn tokens_array(ids: &[u32]) -> Array {
    let v: Vec<i32> = ids.iter().map(|&t| t as i32).collect();
    Array::from_slice(&v, &[1, v.len() as i32])
}

/// Runs the prompt through the model except its last token, in chunks, materializing the cache.
/// (Caches made by `cache::quantizing` quantize themselves along the way.)
pub fn prefill(
    model: &dyn LanguageModel,
    caches: &mut [Box<dyn KvCache>],
    prompt_without_last: &[u32],
    step: usize,
) -> Result<()> {
    for chunk in prompt_without_last.chunks(step.max(1)) {
        model.forward(&tokens_array(chunk), caches)?;
        let state: Vec<Array> = caches.iter().flat_map(|c| c.state()).collect();
        eval(&state)?;
    }
    Ok(())
}

/// Generates from `prompt`. `on_token` sees each token as it is produced; returning `false`
/// cancels. The tokenizer, when given, provides streamed text and stop-string matching.
///
/// The prompt runs as the one row of the engine's executor (`engine::generate_one`): the same
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
        return Ok(Generation {
            tokens: Vec::new(),
            text: String::new(),
            finish_reason: FinishReason::Length,
            prompt_tokens: prompt.len(),
            first_logits: Vec::new(),
            ttft_s: 0.0,
            decode_s: 0.0,
        });
    }
    crate::engine::generate_one(model, tokenizer, prompt, max_tokens, opts, on_token)
}
