//! The one place in `weft` that reads environment variables. Nothing below the faces reads
//! the environment: how a model loads and computes is a [`LoadOptions`] value, how an engine
//! decodes an [`EngineConfig`] field. The CLI (`weft`'s `options_from_env`) and the library
//! faces (the C ABI, Node and Swift constructors, through
//! [`crate::contract::EngineOptions::from_env_defaults`]) call these functions to fill the
//! options their caller left unset, so `WEFT_CPU_KERNELS=exact` keeps working for a host that
//! sets it; a value given explicitly always wins.
//!
//! | Variable | Option |
//! |---|---|
//! | `WEFT_CPU_KERNELS` (`fast`, `exact`) | [`LoadOptions::cpu_kernels`] |
//! | `WEFT_CPU_ACTIVATIONS` (`float`, `int8`) | [`LoadOptions::cpu_activations`] |
//! | `WEFT_GGUF_WEIGHTS` (`native`, `dequantize`) | [`LoadOptions::gguf_weights`] |
//! | `WEFT_DEQUANTIZE_ROWS` (row count, `0` = never) | [`LoadOptions::dequantize_rows`] |
//! | `WEFT_FUSE_PROJECTIONS` (`0`, `1`) | [`LoadOptions::fuse_projections`] |
//! | `WEFT_GATED_DELTA` (`ops`, `fused`, `cuda`, `cpu`) | [`LoadOptions::gated_delta`] |
//! | `WEFT_COMPILE` (`0`, `1`) | [`LoadOptions::compile`] |
//! | `WEFT_CUDA_QMV` (`0`, `1`) | [`LoadOptions::cuda_qmv`] |
//! | `WEFT_DECODE` (`sync`) | [`EngineConfig::decode`] |
//! | `WEFT_FAULTS` (only with the `faults` cargo feature) | `EngineConfig::faults` |
//! | `WEFT_DISTRIBUTED_BACKEND` | the backend of [`distributed_group`] |
//! | `WEFT_MODELS_DIR`, `XDG_CACHE_HOME`, `HOME`, ... | the model store's root ([`crate::model_store::ModelStore::from_env`]) |
//! | `HF_ENDPOINT`, `HF_TOKEN` (else `HF_TOKEN_PATH` / `$HF_HOME/token`), `HF_HUB_OFFLINE`, `HF_HUB_CACHE` (else `$HF_HOME/hub`, `$XDG_CACHE_HOME/huggingface/hub`, `~/.cache/huggingface/hub`) | [`hub_vars`], the model store's `HubOptions::from_env` |

use std::ffi::OsString;

use crate::engine::{DecodeMode, EngineConfig};
use crate::kernels::{CpuActivations, CpuKernels};
use crate::loading::{GgufWeights, LoadOptions};
use crate::{Error, Result};

pub const CPU_KERNELS: &str = "WEFT_CPU_KERNELS";
pub const CPU_ACTIVATIONS: &str = "WEFT_CPU_ACTIVATIONS";
pub const GGUF_WEIGHTS: &str = "WEFT_GGUF_WEIGHTS";
pub const DEQUANTIZE_ROWS: &str = "WEFT_DEQUANTIZE_ROWS";
pub const FUSE_PROJECTIONS: &str = "WEFT_FUSE_PROJECTIONS";
pub const GATED_DELTA: &str = "WEFT_GATED_DELTA";
pub const COMPILE: &str = "WEFT_COMPILE";
pub const CUDA_QMV: &str = "WEFT_CUDA_QMV";
pub const DECODE: &str = "WEFT_DECODE";
pub const FAULTS: &str = "WEFT_FAULTS";
pub const DISTRIBUTED_BACKEND: &str = "WEFT_DISTRIBUTED_BACKEND";

/// `key`'s value, `None` when unset or empty.
pub(crate) fn var_nonempty(key: &str) -> Option<OsString> {
    std::env::var_os(key).filter(|v| !v.is_empty())
}

/// `key`'s value as UTF-8, `None` when unset or empty; an error when not UTF-8.
fn var(key: &str) -> Result<Option<String>> {
    match var_nonempty(key) {
        None => Ok(None),
        Some(v) => v
            .into_string()
            .map(Some)
            .map_err(|v| Error::InvalidRequest(format!("{key}={v:?}: not UTF-8"))),
    }
}

/// The CPU kernel mode `WEFT_CPU_KERNELS` names, if set.
pub fn cpu_kernels() -> Result<Option<CpuKernels>> {
    parsed(CPU_KERNELS, "\"exact\" or \"fast\"")
}

/// The GGUF weight handling `WEFT_GGUF_WEIGHTS` names, if set.
pub fn gguf_weights() -> Result<Option<GgufWeights>> {
    parsed(GGUF_WEIGHTS, "\"native\" or \"dequantize\"")
}

/// Variable `key` parsed as `T`, if set; `expected` names the accepted values.
fn parsed<T: std::str::FromStr>(key: &str, expected: &str) -> Result<Option<T>> {
    var(key)?
        .map(|v| v.parse().map_err(|_| Error::ModelLoad(format!("{key}={v:?}: expected {expected}"))))
        .transpose()
}

/// Load options: `cpu_kernels`, `cpu_activations` and `gguf_weights` as given, each one not given (`None`) and
/// every other option as the environment sets it, else the default. A variable whose option
/// was given is not read (so a bad value there does not matter).
pub fn load_options(
    cpu_kernels: Option<CpuKernels>,
    cpu_activations: Option<CpuActivations>,
    gguf_weights: Option<GgufWeights>,
) -> Result<LoadOptions> {
    let mut o = LoadOptions::default();
    if let Some(mode) = cpu_kernels
        .map(Ok)
        .or_else(|| self::cpu_kernels().transpose())
        .transpose()?
    {
        o.cpu_kernels = mode;
    }
    if let Some(gguf) = gguf_weights
        .map(Ok)
        .or_else(|| self::gguf_weights().transpose())
        .transpose()?
    {
        o.gguf_weights = gguf;
    }
    if let Some(v) = var(DEQUANTIZE_ROWS)? {
        let rows = v.parse::<i32>().ok().filter(|r| *r >= 0);
        o.dequantize_rows = Some(rows.ok_or_else(|| {
            Error::Unsupported(format!(
                "{DEQUANTIZE_ROWS}={v:?}: expected a row count (0 = never)"
            ))
        })?);
    }
    match var(FUSE_PROJECTIONS)?.as_deref() {
        None => {}
        Some("1") => o.fuse_projections = Some(true),
        Some("0") => o.fuse_projections = Some(false),
        Some(v) => {
            return Err(Error::Unsupported(format!(
                "{FUSE_PROJECTIONS}={v:?}: expected 0 or 1"
            )))
        }
    }
    o.gated_delta = parsed(GATED_DELTA, "\"ops\", \"fused\", \"cuda\" or \"cpu\"")?;
    o.cpu_activations = match cpu_activations {
        Some(act) => Some(act),
        None => parsed(CPU_ACTIVATIONS, "\"float\" or \"int8\"")?,
    };
    match var(COMPILE)?.as_deref() {
        None => {}
        Some("1") => o.compile = Some(true),
        Some("0") => o.compile = Some(false),
        Some(v) => return Err(Error::Unsupported(format!("{COMPILE}={v:?}: expected 0 or 1"))),
    }
    match var(CUDA_QMV)?.as_deref() {
        None => {}
        Some("1") => o.cuda_qmv = Some(true),
        Some("0") => o.cuda_qmv = Some(false),
        Some(v) => return Err(Error::Unsupported(format!("{CUDA_QMV}={v:?}: expected 0 or 1"))),
    }
    Ok(o)
}

/// `config` with the decode mode (and, with the `faults` feature, the injected faults) the
/// environment sets.
pub fn engine_config(config: EngineConfig) -> Result<EngineConfig> {
    let mut c = config;
    match var(DECODE)?.as_deref() {
        None => {}
        Some("sync") => c.decode = DecodeMode::Synchronous,
        Some("pipelined") => c.decode = DecodeMode::Pipelined,
        Some(v) => {
            return Err(Error::InvalidRequest(format!(
                "{DECODE}={v:?}: expected \"sync\" or \"pipelined\""
            )))
        }
    }
    #[cfg(feature = "faults")]
    if let Some(spec) = var(FAULTS)? {
        c.faults = crate::engine::Faults::parse(&spec)?;
    }
    Ok(c)
}

/// The distributed backend `WEFT_DISTRIBUTED_BACKEND` names (default `ring`).
pub fn distributed_backend() -> Result<String> {
    Ok(var(DISTRIBUTED_BACKEND)?.unwrap_or_else(|| "ring".to_string()))
}

/// Joins the group of the backend `WEFT_DISTRIBUTED_BACKEND` names, strictly: a rank that was
/// not launched as one is an error, not a group of one.
pub fn distributed_group() -> Result<crate::distributed::Group> {
    crate::distributed::Group::init(&distributed_backend()?, true)
}

/// The Hugging Face variables, as `huggingface_hub` reads them ([`HubVars`]); the model store
/// makes its `HubOptions` of them (`HubOptions::from_env`).
///
/// The endpoint is `HF_ENDPOINT` (without a trailing `/`); the token `HF_TOKEN` (or the older
/// `HUGGING_FACE_HUB_TOKEN`), else the file `HF_TOKEN_PATH` or `$HF_HOME/token` (what
/// `hf auth login` writes); offline when `HF_HUB_OFFLINE` is `1`, `true`, `yes` or `on`; the
/// cache `HF_HUB_CACHE` (or `HUGGINGFACE_HUB_CACHE`), else `$HF_HOME/hub`, else
/// `$XDG_CACHE_HOME/huggingface/hub`, else `~/.cache/huggingface/hub`.
pub fn hub_vars() -> Result<HubVars> {
    use std::path::PathBuf;
    let hf_home = var_nonempty("HF_HOME").map(PathBuf::from).unwrap_or_else(|| {
        let xdg = var_nonempty("XDG_CACHE_HOME").map(PathBuf::from).filter(|p| p.is_absolute());
        let home = var_nonempty("HOME").or_else(|| var_nonempty("USERPROFILE")).map(PathBuf::from);
        match (xdg, home) {
            (Some(x), _) => x.join("huggingface"),
            (None, Some(h)) => h.join(".cache").join("huggingface"),
            (None, None) => temp_dir().join("huggingface"),
        }
    });
    let cache_dir = var_nonempty("HF_HUB_CACHE")
        .or_else(|| var_nonempty("HUGGINGFACE_HUB_CACHE"))
        .map(PathBuf::from)
        .unwrap_or_else(|| hf_home.join("hub"));
    let token = match var("HF_TOKEN")?.or(var("HUGGING_FACE_HUB_TOKEN")?) {
        Some(t) => Some(t),
        None => {
            let path = var_nonempty("HF_TOKEN_PATH").map(PathBuf::from).unwrap_or_else(|| hf_home.join("token"));
            std::fs::read_to_string(path).ok()
        }
    };
    let offline = var("HF_HUB_OFFLINE")?
        .is_some_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on"));
    Ok(HubVars {
        endpoint: var("HF_ENDPOINT")?.map(|e| e.trim_end_matches('/').to_string()),
        token: token.map(|t| t.trim().to_string()).filter(|t| !t.is_empty()),
        offline,
        cache_dir,
    })
}

/// What the Hugging Face variables say ([`hub_vars`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubVars {
    /// `None`: the public Hub.
    pub endpoint: Option<String>,
    pub token: Option<String>,
    pub offline: bool,
    pub cache_dir: std::path::PathBuf,
}

/// The system's temporary directory (the model store's last-resort root).
pub(crate) fn temp_dir() -> std::path::PathBuf {
    std::env::temp_dir()
}
