//! Images in engine rows: their soft tokens (from the model's tower, at admission), the slices
//! of them each prefill chunk splices, and the prompt-cache key that names each image by a
//! hash of its pixels, so cached KV is reused only for the same images at the same places.

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::Array;

use crate::language_model::{LanguageModel, PromptMedia, SoftTokens};
use crate::{Error, Result};

/// One image of a request, preprocessed on the caller's thread.
#[derive(Debug, Clone)]
pub struct PreparedImage {
    /// First placeholder position in the prompt.
    pub start: usize,
    /// `[height, width, 3]` pixel values.
    pub pixels: Vec<f32>,
    pub height: usize,
    pub width: usize,
    /// Its soft tokens (placeholder positions from `start`).
    pub tokens: usize,
    pub hash: u64,
}

/// A row's soft tokens, by prompt position.
#[derive(Default)]
pub(super) struct RowMedia {
    spans: Vec<(usize, Array)>,
}

impl RowMedia {
    /// Runs the model's tower over a request's images: one batch when they share a size
    /// (as mlx-vlm stacks them), else one image at a time (as it runs a list).
    pub(super) fn encode(model: &dyn LanguageModel, images: &[PreparedImage]) -> Result<RowMedia> {
        if images.is_empty() {
            return Ok(RowMedia::default());
        }
        let tower = model.vision().ok_or_else(|| Error::InvalidRequest("this model takes no images".into()))?;
        let run = |group: &[PreparedImage]| -> Result<Array> {
            let (h, w) = (group[0].height, group[0].width);
            let mut all = Vec::with_capacity(group.len() * h * w * 3);
            for im in group {
                all.extend_from_slice(&im.pixels);
            }
            let soft = tower.encode(&Array::from_slice(&all, &[group.len() as i32, h as i32, w as i32, 3]))?;
            soft.eval()?;
            Ok(soft)
        };
        let same_size = images.iter().all(|im| (im.height, im.width) == (images[0].height, images[0].width));
        let spans = if same_size {
            let soft = run(images)?;
            images.iter().enumerate().map(|(i, im)| (im.start, soft.index(i as i32))).collect()
        } else {
            images.iter().map(|im| Ok((im.start, run(std::slice::from_ref(im))?.index(0)))).collect::<Result<_>>()?
        };
        Ok(RowMedia { spans })
    }

    /// `end` moved past any image span it would cut (spans attended bidirectionally must sit
    /// whole in one prefill chunk).
    pub(super) fn whole_spans_end(&self, end: usize) -> usize {
        self.spans
            .iter()
            .map(|(s, emb)| (*s, s + emb.dim(0) as usize))
            .filter(|&(s, e)| s < end && end < e)
            .map(|(_, e)| e)
            .max()
            .unwrap_or(end)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// The soft tokens over prompt positions `start..end`, for row `row` of a forward whose
    /// column 0 is position `start`.
    pub(super) fn soft_in(&self, row: usize, start: usize, end: usize) -> Vec<SoftTokens> {
        self.spans
            .iter()
            .filter_map(|(s, emb)| {
                let n = emb.dim(0) as usize;
                let (from, to) = ((*s).max(start), (s + n).min(end));
                (from < to).then(|| SoftTokens {
                    row,
                    col: from - start,
                    embeddings: emb.index((from - s) as i32..(to - s) as i32),
                })
            })
            .collect()
    }
}

/// Media of one forward over rows whose chunks cover `ranges[b]` of their prompts.
pub(super) fn forward_media(rows: &[&RowMedia], ranges: &[(usize, usize)]) -> Option<PromptMedia> {
    if rows.iter().all(|m| m.is_empty()) {
        return None;
    }
    let soft = rows.iter().zip(ranges).enumerate().flat_map(|(b, (m, &(s, e)))| m.soft_in(b, s, e)).collect();
    Some(PromptMedia { rows: rows.iter().map(|m| !m.is_empty()).collect(), soft })
}

/// The prompt-cache key of a prompt with images: each placeholder id becomes a value derived
/// from its image's pixel hash and offset, and pad ids (embedded as zeros in such prompts)
/// a marker, all with the top bit set so no token id equals them.
pub(super) fn cache_key(prompt: &[u32], images: &[PreparedImage], pad: Option<u32>) -> Vec<u32> {
    let mut key: Vec<u32> = prompt
        .iter()
        .map(|&t| if Some(t) == pad { u32::MAX } else { t })
        .collect();
    for im in images {
        for j in 0..im.tokens {
            let h = im.hash.wrapping_add((j as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
            let h = (h ^ (h >> 29)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            key[im.start + j] = 0x8000_0000 | ((h >> 33) as u32 & 0x7fff_fffe);
        }
    }
    key
}
