//! Where audio soft tokens go in the prompt, per mlx-vlm's Gemma 4 processor and model:
//! each `<|audio|>` placeholder the chat template emits becomes `boa + audio x n + eoa` with
//! `n = min(ceil(duration_ms / ms_per_token), max_soft_tokens)` (40 ms, 750), and the audio
//! positions take the embedder's rows in order (`masked_scatter`). When `n` exceeds the rows
//! the tower produced (it does for about one length in five: `n = rows + 1`), the reference's
//! `masked_scatter` wraps around to row 0; so does [`splice_soft_tokens`].

use mlx_rs::ops::indexing::take_axis;
use mlx_rs::ops::select;
use mlx_rs::Array;

use crate::{Error, Result};

/// The token ids and soft-token rule of an audio-capable Gemma 4 checkpoint (`config.json`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AudioTokens {
    pub audio_token_id: u32,
    pub boa_token_id: u32,
    pub eoa_token_id: u32,
    pub ms_per_token: u32,
    pub max_soft_tokens: usize,
}

impl Default for AudioTokens {
    /// mlx-vlm's `ModelConfig` defaults (the real checkpoints' ids).
    fn default() -> Self {
        AudioTokens { audio_token_id: 258881, boa_token_id: 256000, eoa_token_id: 258883, ms_per_token: 40, max_soft_tokens: 750 }
    }
}

impl AudioTokens {
    /// From a Gemma 4 `config.json` (missing fields keep mlx-vlm's defaults).
    pub fn from_config(cfg: &serde_json::Value) -> Self {
        let d = AudioTokens::default();
        let id = |k: &str, def: u32| cfg.get(k).and_then(|v| v.as_u64()).map_or(def, |v| v as u32);
        AudioTokens {
            audio_token_id: id("audio_token_id", d.audio_token_id),
            boa_token_id: id("boa_token_id", d.boa_token_id),
            eoa_token_id: id("eoa_token_id", d.eoa_token_id),
            ms_per_token: id("audio_ms_per_token", d.ms_per_token),
            // mlx-vlm's processor caps at `audio_seq_length` (750); the model config calls the
            // same number `audio_soft_tokens_per_image`.
            max_soft_tokens: cfg
                .get("audio_soft_tokens_per_image")
                .and_then(|v| v.as_u64())
                .map_or(d.max_soft_tokens, |v| v as usize),
        }
    }

    /// `min(ceil(samples / rate * 1000 / ms_per_token), max_soft_tokens)`, in float64 as the
    /// processor's `_compute_audio_num_tokens`.
    pub fn soft_token_count(&self, samples: usize, sample_rate: u32) -> usize {
        let duration_ms = samples as f64 / sample_rate as f64 * 1000.0;
        ((duration_ms / self.ms_per_token as f64).ceil() as usize).min(self.max_soft_tokens)
    }
}

/// Replaces the k-th `audio_token_id` in `ids` (one per clip, as the chat template writes it)
/// with `boa + audio x counts[k] + eoa`. The number of placeholders must equal the clips.
pub fn expand_audio_placeholders(ids: &[u32], counts: &[usize], t: &AudioTokens) -> Result<Vec<u32>> {
    let placeholders = ids.iter().filter(|&&i| i == t.audio_token_id).count();
    if placeholders != counts.len() {
        return Err(Error::InvalidRequest(format!(
            "audio: the prompt has {placeholders} audio placeholder(s) for {} clip(s)",
            counts.len()
        )));
    }
    let mut out = Vec::with_capacity(ids.len() + counts.iter().sum::<usize>() + 2 * counts.len());
    let mut clip = 0;
    for &id in ids {
        if id == t.audio_token_id {
            out.push(t.boa_token_id);
            out.extend(std::iter::repeat_n(t.audio_token_id, counts[clip]));
            out.push(t.eoa_token_id);
            clip += 1;
        } else {
            out.push(id);
        }
    }
    Ok(out)
}

/// Puts the clips' soft tokens (`clips[k]`: `[rows, hidden]`, clip k's embedder output) into
/// `embeds` (`[len, hidden]`, the prompt's token embeddings): the k-th run of consecutive
/// `audio_token_id`s in `ids` takes clip k's rows in order, wrapping to row 0 past the last row
/// as the reference does for one clip. (For several clips of different lengths in one prompt
/// mlx-vlm's flat `masked_scatter` over the batch-padded tower output shifts later clips onto
/// earlier clips' padding rows; Weft gives each clip its own rows.)
pub fn splice_soft_tokens(embeds: &Array, ids: &[u32], clips: &[Array], t: &AudioTokens) -> Result<Array> {
    let len = embeds.dim(0) as usize;
    if ids.len() != len || embeds.ndim() != 2 {
        return Err(Error::InvalidRequest(format!("audio splice: {} ids for embeddings {:?}", ids.len(), embeds.shape())));
    }
    for c in clips {
        if c.ndim() != 2 || c.dim(1) != embeds.dim(1) || c.dim(0) == 0 {
            return Err(Error::InvalidRequest(format!(
                "audio splice: soft tokens {:?} for embeddings {:?}",
                c.shape(),
                embeds.shape()
            )));
        }
    }
    // Row `index[p]` of the concatenated clips goes to position p.
    let mut offsets = Vec::with_capacity(clips.len());
    let mut total = 0i32;
    for c in clips {
        offsets.push(total);
        total += c.dim(0);
    }
    let (mut clip, mut next, mut in_run) = (0usize, 0i32, false);
    let mut index = Vec::with_capacity(len);
    let mut is_audio = Vec::with_capacity(len);
    for &id in ids {
        let audio = id == t.audio_token_id;
        if audio && !in_run {
            if clip == clips.len() {
                return Err(Error::InvalidRequest(format!("audio splice: more audio spans than the {} clip(s)", clips.len())));
            }
            next = 0;
            clip += 1;
        }
        in_run = audio;
        if audio {
            let c = clip - 1;
            index.push(offsets[c] + next % clips[c].dim(0));
            next += 1;
        } else {
            index.push(0);
        }
        is_audio.push(audio);
    }
    if clip != clips.len() {
        return Err(Error::InvalidRequest(format!("audio splice: {clip} audio span(s) for {} clip(s)", clips.len())));
    }
    if clips.is_empty() {
        return Ok(embeds.clone());
    }
    let rows = mlx_rs::ops::concatenate(clips, 0)?;
    let gathered = take_axis(&rows, &Array::from_slice(&index, &[len as i32]), 0)?;
    let mask = Array::from_slice(&is_audio, &[len as i32, 1]);
    Ok(select(&mask, &gathered.as_dtype(embeds.dtype())?, embeds)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn soft_tokens_follow_ceil_of_40_ms_capped_at_750() {
        let t = AudioTokens::default();
        assert_eq!(t.soft_token_count(640, 16_000), 1);
        assert_eq!(t.soft_token_count(641, 16_000), 2);
        assert_eq!(t.soft_token_count(19_200, 16_000), 30);
        assert_eq!(t.soft_token_count(480_000, 16_000), 750);
        assert_eq!(t.soft_token_count(10_000_000, 16_000), 750);
    }

    #[test]
    fn placeholders_expand_per_clip_and_must_match_the_clips() {
        let t = AudioTokens { audio_token_id: 9, boa_token_id: 7, eoa_token_id: 8, ms_per_token: 40, max_soft_tokens: 750 };
        assert_eq!(expand_audio_placeholders(&[1, 9, 2, 9], &[2, 1], &t).unwrap(), vec![1, 7, 9, 9, 8, 2, 7, 9, 8]);
        assert!(expand_audio_placeholders(&[1, 9, 2], &[2, 1], &t).is_err());
        assert!(expand_audio_placeholders(&[1, 2], &[3], &t).is_err());
    }

    #[test]
    fn each_audio_span_takes_its_own_clip_rows_wrapping_past_the_end() {
        let t = AudioTokens { audio_token_id: 9, boa_token_id: 7, eoa_token_id: 8, ms_per_token: 40, max_soft_tokens: 750 };
        let ids = [1, 7, 9, 9, 9, 8, 7, 9, 8];
        let embeds = Array::zeros::<f32>(&[ids.len() as i32, 1]).unwrap();
        let a = Array::from_slice(&[10f32, 11.0], &[2, 1]);
        let b = Array::from_slice(&[20f32], &[1, 1]);
        let out = splice_soft_tokens(&embeds, &ids, &[a.clone(), b], &t).unwrap();
        assert_eq!(out.as_slice::<f32>(), &[0.0, 0.0, 10.0, 11.0, 10.0, 0.0, 0.0, 20.0, 0.0]);
        assert!(splice_soft_tokens(&embeds, &ids, &[a], &t).is_err());
    }
}
