//! Images and audio clips in engine rows: their soft tokens (from the model's tower, at
//! admission), the slices of them each prefill chunk splices, and the prompt-cache key that
//! names each image or clip by a hash of its pixels or samples, so cached KV is reused only for
//! the same media at the same places.

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::Array;

use super::{check_prompt, Input, Limits, Request, Submission};
use crate::language_model::{LanguageModel, PromptMedia, SoftTokens};
use crate::models::ModelInfo;
use crate::tokenizer::Tokenizer;
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

/// One audio clip of a request: decoded, resampled and turned into log-mel features on the
/// caller's thread; the tower runs at admission.
#[derive(Debug, Clone)]
pub struct PreparedAudio {
    /// First audio position in the prompt (just after its begin-of-audio token).
    pub start: usize,
    pub mel: crate::audio::MelFeatures,
    /// Audio positions the clip fills (`min(ceil(ms / 40), 750)` for Gemma 4).
    pub soft_tokens: usize,
    /// Hash of the 16 kHz samples.
    pub hash: u64,
}

/// A row's soft tokens, by prompt position.
#[derive(Default)]
pub(super) struct RowMedia {
    spans: Vec<(usize, Array)>,
    /// Whether any span is an audio clip's.
    audio: bool,
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
        Ok(RowMedia { spans, audio: false })
    }

    /// Runs the model's audio tower over a request's clips, one clip at a time (each its own
    /// length, so no padding enters a clip's frames).
    pub(super) fn encode_audio(mut self, model: &dyn LanguageModel, clips: &[PreparedAudio]) -> Result<RowMedia> {
        if clips.is_empty() {
            return Ok(self);
        }
        let tower = model.audio().ok_or_else(|| Error::InvalidRequest("this model takes no audio".into()))?;
        for c in clips {
            let soft = tower.encode(&c.mel, c.soft_tokens)?;
            soft.eval()?;
            self.spans.push((c.start, soft));
        }
        self.audio = true;
        self.spans.sort_by_key(|(s, _)| *s);
        Ok(self)
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

    pub(super) fn has_audio(&self) -> bool {
        self.audio
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
    Some(PromptMedia {
        rows: rows.iter().map(|m| !m.is_empty()).collect(),
        audio_rows: rows.iter().map(|m| m.has_audio()).collect(),
        soft,
    })
}

/// The prompt-cache key of a prompt with images: each placeholder id becomes a value derived
/// from its image's pixel hash and offset, and pad ids (embedded as zeros in such prompts)
/// a marker, all with the top bit set so no token id equals them.
pub(super) fn cache_key(prompt: &[u32], images: &[PreparedImage], pad: Option<u32>) -> Vec<u32> {
    let spans: Vec<(usize, usize, u64)> = images.iter().map(|im| (im.start, im.tokens, im.hash)).collect();
    let key: Vec<u32> = prompt
        .iter()
        .map(|&t| if Some(t) == pad { u32::MAX } else { t })
        .collect();
    keyed(key, &spans)
}

/// The prompt-cache key of a prompt with audio clips: as [`cache_key`], each clip's audio
/// positions named by its samples' hash. The images' positions (`key` names them already) are
/// named again, differently: a row with audio attends its image spans causally (as mlx-vlm
/// runs such prompts), so their KV must not be reused for an image-only row, nor the reverse.
pub(super) fn audio_cache_key(key: Vec<u32>, clips: &[PreparedAudio], images: &[PreparedImage]) -> Vec<u32> {
    const WITH_AUDIO: u64 = 0x6a09_e667_f3bc_c908;
    let mut spans: Vec<(usize, usize, u64)> = images.iter().map(|im| (im.start, im.tokens, im.hash ^ WITH_AUDIO)).collect();
    spans.extend(clips.iter().map(|c| (c.start, c.soft_tokens, c.hash)));
    keyed(key, &spans)
}

/// `key` with positions `start..start + len` of each span replaced by values derived from the
/// span's hash and offset.
fn keyed(mut key: Vec<u32>, spans: &[(usize, usize, u64)]) -> Vec<u32> {
    for &(start, len, hash) in spans {
        for j in 0..len {
            let h = hash.wrapping_add((j as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
            let h = (h ^ (h >> 29)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            key[start + j] = 0x8000_0000 | ((h >> 33) as u32 & 0x7fff_fffe);
        }
    }
    key
}

/// Checks a prepared request's images against the model and preprocesses them (on the
/// caller's thread): one placeholder run per view (an image, or with pan-and-scan the image
/// and its crops), at most `max_images` images, decodable files.
pub(super) fn attach_images(
    sub: &mut Submission,
    vision: Option<&crate::vision::ImageSpec>,
    tokenizer: Option<&Tokenizer>,
    info: &ModelInfo,
) -> Result<()> {
    if sub.request.images.is_empty() {
        return Ok(());
    }
    let spec = vision.ok_or_else(|| {
        Error::InvalidRequest("images: this model has no vision tower (it takes text only)".into())
    })?;
    let n = sub.request.images.len();
    if n > spec.max_images {
        return Err(Error::InvalidRequest(format!("images: {n} images, at most {} per request", spec.max_images)));
    }
    // Preprocess first: the prompt's expansion depends on each image's size (Gemma 4's
    // per-image soft-token counts) and shape (Gemma 3's pan-and-scan crops).
    let p = &spec.processor;
    let views: Vec<Vec<crate::vision::Pixels>> = sub
        .request
        .images
        .iter()
        .enumerate()
        .map(|(i, bytes)| {
            p.process_views(bytes, None)
                .map_err(|e| Error::InvalidRequest(format!("images[{i}]: {e}")))
        })
        .collect::<Result<_>>()?;
    let counts: Vec<Vec<usize>> =
        views.iter().map(|v| v.iter().map(|px| spec.tokens_for(px.height, px.width)).collect()).collect();
    if let Some(prompt) = expanded_text_prompt(&sub.request, sub.rendered.as_deref(), spec, &counts, tokenizer)? {
        crate::prefill::validate_prompt_ids(info, &prompt)?;
        sub.prompt = prompt;
    }
    let flat: Vec<usize> = counts.concat();
    let starts = crate::vision::image_spans(&sub.prompt, spec, &flat)?;
    sub.images = views
        .into_iter()
        .flatten()
        .zip(starts)
        .zip(flat)
        .map(|((px, start), tokens)| {
            let hash = crate::vision::pixels_hash(&px.data);
            PreparedImage { start, pixels: px.data, height: px.height, width: px.width, tokens, hash }
        })
        .collect();
    Ok(())
}

/// Checks a prepared request's audio clips against the model and prepares them (on the
/// caller's thread): decode, downmix, resample to 16 kHz (at most 30 s), log-mel features; then
/// expands the prompt's audio tokens (one per clip) to `boa + audio x n + eoa` and checks the
/// longer prompt (images attached before keep their spans: their starts move with the
/// expansion). The tower runs when the engine admits the row.
pub(super) fn attach_audio(sub: &mut Submission, audio: Option<&crate::audio::AudioSpec>, limits: Limits<'_>) -> Result<()> {
    if sub.request.audio.is_empty() {
        return Ok(());
    }
    let spec = audio.ok_or_else(|| {
        Error::InvalidRequest("audio: this model has no audio tower (it takes no audio)".into())
    })?;
    let n = sub.request.audio.len();
    if n > spec.max_clips {
        return Err(Error::InvalidRequest(format!("audio: {n} clips, at most {} per request", spec.max_clips)));
    }
    let t = &spec.tokens;
    let placeholders = sub.prompt.iter().filter(|&&id| id == t.audio_token_id).count();
    if placeholders != n {
        return Err(Error::InvalidRequest(format!(
            "audio: the prompt has {placeholders} audio token(s) (id {}) but {n} clip(s) were given; \
             put the audio token once where each clip goes",
            t.audio_token_id
        )));
    }
    let mut clips = Vec::with_capacity(n);
    for (i, bytes) in sub.request.audio.iter().enumerate() {
        let at = |e: Error| {
            let e = e.to_string();
            let why = e.trim_start_matches("invalid request: ").trim_start_matches("audio: ");
            Error::InvalidRequest(format!("audio[{i}]: {why}"))
        };
        let samples = crate::audio::load_clip(bytes, None).map_err(at)?;
        let mel = spec.features(&samples).map_err(at)?;
        let soft_tokens = t.soft_token_count(samples.len(), crate::audio::SAMPLE_RATE);
        clips.push(PreparedAudio { start: 0, mel, soft_tokens, hash: crate::audio::samples_hash(&samples) });
    }
    let counts: Vec<usize> = clips.iter().map(|c| c.soft_tokens).collect();
    let prompt = crate::audio::expand_audio_placeholders(&sub.prompt, &counts, t)?;
    check_prompt(&sub.request, &prompt, limits)?;
    // Each placeholder became n + 2 tokens: clip k's span starts after its begin-of-audio
    // token, and everything after a placeholder (later clips, images) moves by n + 1.
    let placeholders: Vec<usize> =
        sub.prompt.iter().enumerate().filter(|(_, &id)| id == t.audio_token_id).map(|(p, _)| p).collect();
    let moved = |pos: usize| -> usize {
        pos + placeholders.iter().zip(&counts).filter(|(&p, _)| p < pos).map(|(_, n)| n + 1).sum::<usize>()
    };
    for image in &mut sub.images {
        image.start = moved(image.start);
    }
    for (clip, &p) in clips.iter_mut().zip(&placeholders) {
        clip.start = moved(p) + 1;
    }
    sub.prompt = prompt;
    sub.audio = clips;
    Ok(())
}

/// A text prompt or conversation with images, re-tokenized the way the reference processor
/// does it: each marker in the rendered text is expanded by the spec's [`ImageMarker`] rule,
/// image `i`'s views with `counts[i][v]` image tokens each (mlx-vlm Gemma3Processor, incl. its
/// pan-and-scan sentence; mlx-vlm Gemma4Processor). `None` for token-id prompts (they carry
/// their placeholder runs already).
///
/// [`ImageMarker`]: crate::vision::ImageMarker
fn expanded_text_prompt(
    request: &Request,
    rendered: Option<&str>,
    spec: &crate::vision::ImageSpec,
    counts: &[Vec<usize>],
    tokenizer: Option<&Tokenizer>,
) -> Result<Option<Vec<u32>>> {
    let (text, add_special) = match &request.input {
        Input::Tokens(_) => return Ok(None),
        Input::Prompt(text) => (text.clone(), true),
        // The conversation as the preparer rendered it (template, variables, tools).
        Input::Messages(_) => {
            let text = rendered.ok_or_else(|| Error::InvalidRequest("images: the conversation was not rendered".into()))?;
            (text.to_string(), false)
        }
    };
    let tok = tokenizer.ok_or_else(|| Error::InvalidRequest("a text prompt with images needs a tokenizer".into()))?;
    let name = |id: Option<u32>, what: &str| {
        id.and_then(|i| tok.id_to_token(i))
            .ok_or_else(|| Error::Unsupported(format!("images: the tokenizer has no {what} token")))
    };
    let begin = name(spec.begin_token_id, "begin-of-image")?;
    let end = name(spec.end_token_id, "end-of-image")?;
    let image = name(Some(spec.image_token_id), "image")?;
    let (marker, blank) = match spec.marker {
        crate::vision::ImageMarker::BeginOfImage => (&begin, "\n\n"),
        crate::vision::ImageMarker::ImageToken => (&image, ""),
    };
    let pieces: Vec<&str> = text.split(marker.as_str()).collect();
    let markers = pieces.len() - 1;
    if markers != request.images.len() {
        return Err(Error::InvalidRequest(format!(
            "images: the prompt has {markers} image marker(s) ({marker}) but {} image(s) were given",
            request.images.len()
        )));
    }
    let sequence = |n: usize| format!("{blank}{begin}{}{end}{blank}", image.repeat(n));
    let mut expanded = pieces[0].to_string();
    for (piece, views) in pieces[1..].iter().zip(counts) {
        match views.as_slice() {
            [n] => expanded.push_str(&sequence(*n)),
            [n, crops @ ..] => {
                // Gemma3Processor's text for an image with pan-and-scan crops.
                let crops: Vec<String> = crops.iter().map(|&c| sequence(c)).collect();
                expanded.push_str(&format!(
                    "Here is the original image {} and here are some crops to help you see better {}",
                    sequence(*n),
                    crops.join(" ")
                ));
            }
            [] => unreachable!("an image has at least its own view"),
        }
        expanded.push_str(piece);
    }
    Ok(Some(tok.encode(&expanded, add_special)?))
}
