//! Turning a model path (an mlx-lm / Hugging Face directory or a `.gguf` file) into a runnable
//! model, its tokenizer and its generation defaults.

pub mod gguf_affine;
pub mod gguf_dequant;
mod gguf_model;
mod safetensors_dir;

use std::path::{Path, PathBuf};

use mlx_rs::{Array, Dtype};

use crate::constrain::ConstraintFactoryCell;
use crate::kernels::{CpuActivations, CpuKernels};
use crate::models::{self, LanguageModel};
use crate::nn::{GatedDeltaKernel, LayerOptions, Parallel};
use crate::tokenizer::Tokenizer;
use crate::{Error, Result};

/// Sampling defaults a checkpoint ships in `generation_config.json`.
#[derive(Debug, Clone, Default)]
pub struct GenerationDefaults {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i32>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
}

pub struct LoadedModel {
    pub model: Box<dyn LanguageModel>,
    /// `None` for checkpoints without tokenizer files (e.g. the tiny parity models).
    pub tokenizer: Option<Tokenizer>,
    /// Constrained decoding's token trie and grammar compiler for `tokenizer`, built on the
    /// first constrained request and shared by the engine started from this model.
    pub constraints: ConstraintFactoryCell,
    /// End-of-sequence ids from config.json, generation_config.json and the tokenizer.
    pub eos_token_ids: Vec<u32>,
    pub defaults: GenerationDefaults,
    pub source: PathBuf,
    /// The load options that change the numbers computed ([`crate::nn::LayerOptions::numerics`]).
    pub numerics: String,
    /// The options it was loaded with, less the group split: a draft model loads with the same
    /// kernels as the model it drafts for.
    pub options: LoadOptions,
}

impl std::fmt::Debug for LoadedModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedModel").field("source", &self.source).finish_non_exhaustive()
    }
}

/// How a GGUF file holding block types MLX's reader lacks (K-quants, Q5_0, ...) is loaded.
/// Files of F32/F16/Q4_0/Q4_1/Q8_0 only are read as MLX's reader reads them either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GgufWeights {
    /// Types with a lossless MLX affine form (Q4_0/1, Q5_0/1, Q8_0, Q4_K, Q5_K) stay quantized
    /// ([`gguf_affine`]); Q6_K is rounded to 8-bit group 32 when the fast CPU kernels are on
    /// (lossy, [`gguf_affine::requantize_q6_k`]); the rest are expanded to float32.
    #[default]
    Native,
    /// Every tensor expanded to float32: the weights the mlx-lm goldens run (mlx-lm cannot read
    /// these types), so this is the exact mode.
    Dequantize,
}

impl std::str::FromStr for GgufWeights {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "native" => Ok(GgufWeights::Native),
            "dequantize" => Ok(GgufWeights::Dequantize),
            other => Err(Error::Unsupported(format!("GGUF weights {other:?}: expected \"native\" or \"dequantize\""))),
        }
    }
}

/// A GGUF file's tensors as [`load`] reads them (opened read-only), under their GGUF names;
/// quantized matrices as MLX triples (`name`, `name.scales`, `name.biases`). For a file of
/// F32/F16/Q4_0/Q4_1/Q8_0 tensors, the values MLX's own GGUF reader gives.
pub fn gguf_tensors(path: &Path, weights: GgufWeights) -> Result<Vec<(String, Array)>> {
    gguf_model::tensors(path, weights)
}

/// How a model is loaded and how its layers compute: passed to [`load_with`] and carried by
/// the weights to every layer constructor ([`crate::nn::LayerOptions`]), so models loaded with
/// different options coexist in one process. Nothing here is read from the environment (the
/// CLI and the faces map their own settings to it; see [`crate::env`]).
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// Quantized matmuls and the CPU primitives: Weft's fast kernels (default) or MLX's own,
    /// bit for bit what mlx-lm computes ([`CpuKernels`]).
    pub cpu_kernels: CpuKernels,
    /// The fast CPU kernel's activations below 16 rows of x (decode): float32 or int8
    /// ([`CpuActivations`]); `None` is the default, int8. Exact mode ignores it.
    pub cpu_activations: Option<CpuActivations>,
    /// GGUF block types MLX's reader lacks: kept quantized (default) or expanded to float32.
    pub gguf_weights: GgufWeights,
    /// Rows of input from which quantized layers dequantize and multiply densely; `None` is the
    /// device's default ([`crate::nn::GPU_DEQUANTIZE_ROWS`] on a GPU, never on the CPU),
    /// `Some(0)` never.
    pub dequantize_rows: Option<i32>,
    /// Fuse q/k/v and gate/up projections into one matmul; `None` fuses with the fast kernels
    /// on the CPU only.
    pub fuse_projections: Option<bool>,
    /// How gated DeltaNet layers run their recurrence; `None` is the device's default
    /// ([`crate::nn::GatedDeltaKernel`]: MLX's fused op on Metal, Weft's kernel on CUDA and in
    /// the fast CPU mode, the ops path in the exact mode).
    pub gated_delta: Option<GatedDeltaKernel>,
    /// Run the decode step's elementwise chains (SwiGLU, GeGLU) as MLX-compiled fused kernels;
    /// `None` compiles on a GPU only (on the CPU MLX builds them with the system's C++ compiler
    /// at run time). Outputs are the same either way.
    pub compile: Option<bool>,
    /// Few-row quantized matmuls (decode steps) by Weft's CUDA kernel instead of MLX's;
    /// `None` is on on MLX's CUDA backend (the only place it runs).
    pub cuda_qmv: Option<bool>,
    /// Load this rank's part of a model split over a group (tensor or pipeline parallel); an
    /// architecture without that split is refused rather than loaded whole.
    pub parallel: Option<Parallel>,
}

impl LoadOptions {
    /// The defaults with `mode` for the CPU kernels.
    pub fn with_cpu_kernels(mut self, mode: CpuKernels) -> Self {
        self.cpu_kernels = mode;
        self
    }

    /// These options with `act` for the fast CPU kernel's activations.
    pub fn with_cpu_activations(mut self, act: CpuActivations) -> Self {
        self.cpu_activations = Some(act);
        self
    }

    /// The defaults with `gguf` for GGUF weight handling.
    pub fn with_gguf_weights(mut self, gguf: GgufWeights) -> Self {
        self.gguf_weights = gguf;
        self
    }

    /// Exact mode: MLX's kernels, GGUF weights expanded as the mlx-lm goldens run them.
    pub fn exact() -> Self {
        LoadOptions { cpu_kernels: CpuKernels::Exact, gguf_weights: GgufWeights::Dequantize, ..Default::default() }
    }

    /// The layer options these resolve to on MLX's current device.
    pub fn layer_options(&self) -> Result<LayerOptions> {
        Ok(LayerOptions::new(self.cpu_kernels, self.dequantize_rows, self.fuse_projections, self.parallel.clone())?
            .with_gated_delta(self.gated_delta)?
            .with_compile(self.compile)
            .with_cpu_activations(self.cpu_activations)
            .with_cuda_qmv(self.cuda_qmv)?)
    }
}

/// Loads a model from a directory (config.json + safetensors) or a `.gguf` file with the
/// default [`LoadOptions`].
pub fn load(path: &Path) -> Result<LoadedModel> {
    load_with(path, &LoadOptions::default())
}

/// [`load`] with the options given.
pub fn load_with(path: &Path, options: &LoadOptions) -> Result<LoadedModel> {
    let layers = options.layer_options()?;
    let meta = std::fs::metadata(path)
        .map_err(|e| Error::ModelLoad(format!("cannot open model path {}: {e}", path.display())))?;
    let mut loaded = if meta.is_dir() {
        safetensors_dir::load(path, &layers)?
    } else if path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf")) {
        gguf_model::load(path, options.gguf_weights, &layers)?
    } else {
        return Err(Error::ModelLoad(format!(
            "{} is neither a model directory nor a .gguf file",
            path.display()
        )));
    };
    layers.check_parallel_taken()?;
    loaded.numerics = layers.numerics();
    loaded.options = LoadOptions { parallel: None, ..options.clone() };
    Ok(loaded)
}

/// Token ids listed under `key` in a JSON object: an integer or a list of integers.
pub(crate) fn ids_from_json(v: Option<&serde_json::Value>) -> Vec<u32> {
    match v {
        Some(serde_json::Value::Number(n)) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
        Some(serde_json::Value::Array(a)) => a.iter().filter_map(|x| x.as_u64()).map(|x| x as u32).collect(),
        _ => Vec::new(),
    }
}

fn push_unique(into: &mut Vec<u32>, ids: impl IntoIterator<Item = u32>) {
    for id in ids {
        if !into.contains(&id) {
            into.push(id);
        }
    }
}

/// The dtype activations run in: that of the embedding table (its scales when quantized).
fn activation_dtype(weights: &std::collections::HashMap<String, Array>) -> Dtype {
    for name in [
        "model.embed_tokens.scales",
        "model.embed_tokens.weight",
        // Multimodal / hybrid checkpoints (gemma3, qwen3_5) keep the text model under `language_model.`.
        "language_model.model.embed_tokens.scales",
        "language_model.model.embed_tokens.weight",
    ] {
        if let Some(a) = weights.get(name) {
            return a.dtype();
        }
    }
    Dtype::Float32
}

fn build_model(
    config: &serde_json::Value,
    tensors: std::collections::HashMap<String, Array>,
    layers: &LayerOptions,
) -> Result<Box<dyn LanguageModel>> {
    let quant = match config.get("quantization").or_else(|| config.get("quantization_config")) {
        Some(q) if !q.is_null() => Some(crate::nn::QuantConfig::from_json(q)?),
        _ => None,
    };
    let dtype = activation_dtype(&tensors);
    // Materialize now (casts, un-permutations, mmapped reads) so no forward pass redoes them.
    mlx_rs::transforms::eval(tensors.values())?;
    let model = models::build(config, crate::nn::Weights::new(tensors, quant).with_options(layers.clone()), dtype)?;
    warm_up(model.as_ref())?;
    Ok(model)
}

/// One throwaway single-token forward at load: it evaluates what building the model left
/// lazy (derived weights such as `1 + w` norms, RoPE tables, backend kernel set-up) and
/// touches every weight, so the first request after load does not pay for any of it.
fn warm_up(model: &dyn LanguageModel) -> Result<()> {
    let mut caches = model.make_caches();
    let logits = model.forward(&Array::from_slice(&[0i32], &[1, 1]), &mut caches)?;
    logits.eval()?;
    Ok(())
}
