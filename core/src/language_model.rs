//! What the engine sees of a model, whatever its architecture: the [`LanguageModel`] trait
//! and the shape facts in [`ModelInfo`]. Below `nn` and `models` (both implement it), above
//! `cache` (a forward pass extends caches), so no module depends on one above it.

use mlx_rs::{Array, Dtype};

use crate::cache::KvCache;
use crate::vision::VisionTower;
use crate::{Error, Result};

/// Soft tokens for one forward (the embeddings seam): row `row` of the `[B, L]` input takes
/// `embeddings` (`[n, hidden]`, as the model's tower returns them) over its token embeddings
/// at columns `col..col + n`.
pub struct SoftTokens {
    pub row: usize,
    pub col: usize,
    pub embeddings: Array,
}

/// The media of one forward over `[B, L]` token ids.
pub struct PromptMedia {
    /// Per row: whether that row's prompt carries media at all (a model may embed the row's
    /// other tokens differently then: Gemma 3 embeds pad ids as zeros, as mlx-vlm does).
    pub rows: Vec<bool>,
    /// Per row: whether that row's prompt carries audio clips (mlx-vlm keeps a Gemma 4 prompt
    /// with both images and audio causal: no bidirectional image spans). Empty: none does.
    pub audio_rows: Vec<bool>,
    /// Soft tokens within this forward's columns.
    pub soft: Vec<SoftTokens>,
}

/// Shape facts the engine needs without knowing the architecture (KV sizing, validation).
#[derive(Debug, Clone)]
pub struct ModelInfo {
    pub model_type: String,
    pub vocab_size: i32,
    pub hidden_size: i32,
    pub num_layers: usize,
    pub kv_heads: i32,
    pub head_dim: i32,
    /// Longest context the model was trained for, if the config says.
    pub max_position_embeddings: Option<usize>,
    /// Dtype of activations / KV entries.
    pub activation_dtype: Dtype,
    /// Layers whose cache is a sliding-window ring, and its size: those hold at most `window`
    /// positions whatever the sequence length (Gemma 3). `None`: every layer keeps all.
    pub sliding_window: Option<SlidingWindowLayers>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlidingWindowLayers {
    pub layers: usize,
    pub window: usize,
}

impl ModelInfo {
    /// KV-cache bytes one token occupies across all layers.
    pub fn kv_bytes_per_token(&self) -> usize {
        let elem = match self.activation_dtype {
            Dtype::Float32 => 4,
            _ => 2,
        };
        2 * self.num_layers * (self.kv_heads * self.head_dim) as usize * elem
    }

    /// KV-cache bytes one token occupies across all layers, stored as `kv` says (quantized:
    /// packed weights plus a scale and a bias, in the activation dtype, per group).
    pub fn kv_bytes_per_token_with(&self, kv: Option<&crate::cache::KvQuantization>) -> usize {
        let Some(q) = kv else { return self.kv_bytes_per_token() };
        let elem = match self.activation_dtype {
            Dtype::Float32 => 4,
            _ => 2,
        };
        2 * self.num_layers * self.kv_heads as usize * q.vector_bytes(self.head_dim, elem)
    }

    /// KV-cache bytes a sequence of `positions` tokens occupies across all layers, counting
    /// sliding-window layers at no more than their window.
    pub fn kv_bytes_for(&self, positions: usize) -> u64 {
        let per_layer = (self.kv_bytes_per_token() / self.num_layers.max(1)) as u64;
        let (sliding, window) = self.sliding_window.map_or((0, 0), |s| (s.layers.min(self.num_layers), s.window));
        let full = (self.num_layers - sliding) as u64;
        let layer_positions = full
            .saturating_mul(positions as u64)
            .saturating_add((sliding as u64).saturating_mul(positions.min(window) as u64));
        per_layer.saturating_mul(layer_positions)
    }
}

pub trait LanguageModel: Send {
    /// `tokens`: `[B, L]` int32 → logits `[B, L, vocab]`, extending `caches` by `L` positions.
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array>;
    /// Fresh per-layer caches for one sequence.
    fn make_caches(&self) -> Vec<Box<dyn KvCache>>;
    fn info(&self) -> &ModelInfo;
    /// Why this model cannot run with a quantized KV cache, when it cannot (checked when an
    /// engine or a generation asks for one).
    fn kv_quantization_unsupported(&self) -> Option<String> {
        None
    }
    /// Whether rows may prefill together in one right-padded `[B, L]` chunk with the numerics
    /// each would get alone. False for a model whose forward depends on the chunk's length
    /// (dynamic NTK RoPE); such rows prefill one by one.
    fn batched_prefill(&self) -> bool {
        true
    }
    /// Whether the model runs Weft's fast CPU kernels (fast mode on the CPU): the engine's
    /// token choice then takes the same licence ([`crate::kernels::log_softmax`]). False keeps
    /// MLX's ops, bit-exact with mlx-lm.
    fn fast_cpu_kernels(&self) -> bool {
        false
    }
    /// The vision tower, for a model that takes images.
    fn vision(&self) -> Option<&dyn VisionTower> {
        None
    }
    /// The audio tower, for a model that takes audio.
    fn audio(&self) -> Option<&dyn crate::audio::AudioTower> {
        None
    }
    /// Like [`LanguageModel::forward`], with `media`'s soft tokens spliced over the token
    /// embeddings (a causal forward like any other: the caches extend by `L`).
    fn forward_with_media(&self, _tokens: &Array, _media: &PromptMedia, _caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        Err(Error::InvalidRequest(format!("this model ({}) takes no images or audio", self.info().model_type)))
    }
}

