//! Images in: preprocessing ([`preprocess`]), the SigLIP tower (`crate::nn::siglip`, a stack of
//! shared layers), and the
//! [`VisionTower`] a multimodal model exposes through
//! [`crate::language_model::LanguageModel::vision`]. A tower turns pixel values into soft
//! tokens already in the text model's input-embedding space; the engine splices them over the
//! image placeholder tokens of the prompt (see [`crate::language_model::PromptMedia`]).

pub mod preprocess;
pub mod source;

use mlx_rs::Array;

pub use preprocess::{ImageProcessor, PanAndScan, Pixels, Resample, Rgb8, Sizing};

/// The key under which a model directory's processor configs reach the model builders inside
/// `config.json`'s value: `{file name: contents}` for `preprocessor_config.json` and
/// `processor_config.json`, those present (each family's reference reads them in its own order).
pub const PROCESSOR_CONFIG_KEY: &str = "weft_processor_configs";

/// A model directory's processor configs (see [`PROCESSOR_CONFIG_KEY`]); `None` when it has
/// neither file.
pub fn read_processor_configs(dir: &std::path::Path) -> Result<Option<serde_json::Value>> {
    let mut found = serde_json::Map::new();
    for name in ["preprocessor_config.json", "processor_config.json"] {
        let path = dir.join(name);
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                let v = serde_json::from_str(&text)
                    .map_err(|e| crate::Error::ModelLoad(format!("{} is not valid JSON: {e}", path.display())))?;
                found.insert(name.into(), v);
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(crate::Error::io(&path, e)),
        }
    }
    Ok((!found.is_empty()).then_some(serde_json::Value::Object(found)))
}

/// The image processor's settings among `configs` (a [`PROCESSOR_CONFIG_KEY`] value) as
/// transformers' AutoImageProcessor finds them: `preprocessor_config.json`, else the
/// `image_processor` object of `processor_config.json`.
pub fn image_processor_config(configs: &serde_json::Value) -> Option<&serde_json::Value> {
    configs
        .get("preprocessor_config.json")
        .or_else(|| configs.get("processor_config.json").and_then(|p| p.get("image_processor")))
}

use crate::Result;

/// What a prompt with images must look like for this model, and how images are prepared.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageSpec {
    pub processor: ImageProcessor,
    /// Placeholder id repeated once per soft token of each image in the prompt ids.
    pub image_token_id: u32,
    /// Soft tokens per image: always this many ([`Sizing::Fixed`]), or at most this many
    /// ([`Sizing::PatchBudget`]: [`ImageSpec::tokens_for`] counts them per image size).
    pub tokens_per_image: usize,
    /// Tokens that open / close an image span (Gemma 3 `<start_of_image>` / `<end_of_image>`).
    pub begin_token_id: Option<u32>,
    pub end_token_id: Option<u32>,
    /// A token the model embeds as zeros in prompts with images (Gemma 3's pad id, per
    /// mlx-vlm), so such prompts' KV differs from a text prompt's at that token.
    pub zeroed_token_id: Option<u32>,
    /// Most images one request may carry.
    pub max_images: usize,
    /// Which token's text stands for an image in a text prompt, and how it is expanded.
    pub marker: ImageMarker,
    /// The text model attends bidirectionally within each image span (Gemma 4), so a span is
    /// never split across prefill chunks.
    pub bidirectional: bool,
}

/// How the reference processor expands an image marker in prompt text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageMarker {
    /// Gemma 3: the begin-of-image text becomes `"\n\n" begin + image x n + end "\n\n"`.
    BeginOfImage,
    /// Gemma 4: the image token's text becomes `begin + image x n + end`.
    ImageToken,
}

impl ImageSpec {
    /// Soft tokens of an image preprocessed to `height x width`.
    pub fn tokens_for(&self, height: usize, width: usize) -> usize {
        match self.processor.sizing {
            Sizing::Fixed => self.tokens_per_image,
            Sizing::PatchBudget { patch, pooling, .. } => (height / patch) * (width / patch) / (pooling * pooling),
        }
    }

    /// The token whose text marks an image in a prompt.
    pub fn marker_token_id(&self) -> Option<u32> {
        match self.marker {
            ImageMarker::BeginOfImage => self.begin_token_id,
            ImageMarker::ImageToken => Some(self.image_token_id),
        }
    }
}

/// A model's vision tower (with its projector).
pub trait VisionTower: Send {
    fn spec(&self) -> &ImageSpec;
    /// `pixels`: `[N, height, width, 3]` f32 (channels last) → `[N, tokens_per_image, hidden]`
    /// soft tokens, in the form the text model splices them (before its embedding scale).
    fn encode(&self, pixels: &Array) -> Result<Array>;
}

/// A content hash of preprocessed pixels (FNV-1a over the f32 bits, 64-bit): prompt-cache keys
/// put it in place of an image's placeholder ids, so two images never share cached KV.
pub fn pixels_hash(pixels: &[f32]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for v in pixels {
        for b in v.to_bits().to_le_bytes() {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// Positions of each image's placeholder run in `prompt`: `counts[i]` consecutive
/// `image_token_id`s for image `i`, in order. With a fixed count, one run may hold several
/// images back to back; with per-image counts each run is one image. Errors name what does
/// not match.
pub fn image_spans(prompt: &[u32], spec: &ImageSpec, counts: &[usize]) -> Result<Vec<usize>> {
    let images = counts.len();
    if spec.processor.sizing != Sizing::Fixed {
        let runs = placeholder_runs(prompt, spec.image_token_id);
        if runs.len() != images {
            return Err(crate::Error::InvalidRequest(format!(
                "images: the prompt has placeholders for {} image(s) but {images} were given",
                runs.len()
            )));
        }
        for (i, (&(start, len), &n)) in runs.iter().zip(counts).enumerate() {
            if len != n {
                return Err(crate::Error::InvalidRequest(format!(
                    "images: image {i} takes exactly {n} image tokens, the run at position {start} has {len}"
                )));
            }
        }
        if runs.last().is_some_and(|&(s, n)| s + n >= prompt.len()) {
            return Err(crate::Error::InvalidRequest("images: the prompt must not end with an image".into()));
        }
        return Ok(runs.into_iter().map(|(s, _)| s).collect());
    }
    let mut starts = Vec::new();
    let mut i = 0;
    while i < prompt.len() {
        if prompt[i] != spec.image_token_id {
            i += 1;
            continue;
        }
        let start = i;
        while i < prompt.len() && prompt[i] == spec.image_token_id {
            i += 1;
        }
        let run = i - start;
        if run % spec.tokens_per_image != 0 {
            return Err(crate::Error::InvalidRequest(format!(
                "images: a run of {run} image tokens at position {start} (each image takes exactly {})",
                spec.tokens_per_image
            )));
        }
        starts.extend((0..run / spec.tokens_per_image).map(|k| start + k * spec.tokens_per_image));
    }
    if starts.len() != images {
        return Err(crate::Error::InvalidRequest(format!(
            "images: the prompt has placeholders for {} image(s) but {images} were given",
            starts.len()
        )));
    }
    if starts.last().is_some_and(|&s| s + spec.tokens_per_image >= prompt.len()) {
        return Err(crate::Error::InvalidRequest("images: the prompt must not end with an image".into()));
    }
    Ok(starts)
}

/// `(start, length)` of each maximal run of `id` in `prompt`.
fn placeholder_runs(prompt: &[u32], id: u32) -> Vec<(usize, usize)> {
    let mut runs = Vec::new();
    let mut i = 0;
    while i < prompt.len() {
        if prompt[i] != id {
            i += 1;
            continue;
        }
        let start = i;
        while i < prompt.len() && prompt[i] == id {
            i += 1;
        }
        runs.push((start, i - start));
    }
    runs
}
