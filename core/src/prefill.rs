//! What running a prompt needs below the engine and the single-sequence façade alike: prompt
//! checks against the model's shape, chunked prefill, and host reads of evaluated arrays.

use mlx_rs::transforms::eval;
use mlx_rs::Array;

use crate::cache::KvCache;
use crate::models::LanguageModel;
use crate::{Error, Result};

/// Checks prompt ids against the model's shape facts: non-empty, in-vocabulary, within the
/// context.
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
        // A prompt that fills the context leaves no position for the first generated token.
        if prompt.len() >= ctx {
            return Err(Error::InvalidRequest(format!(
                "the prompt has {} tokens; the model's context of {ctx} leaves no room for output \
                 (at most {} prompt tokens)",
                prompt.len(),
                ctx.saturating_sub(1)
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

pub fn tokens_array(ids: &[u32]) -> Array {
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

