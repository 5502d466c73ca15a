//! The CLI's one mapping from its environment and global flags to the library's option values
//! ([`options_from_env`]). Nothing below the CLI reads these variables on its own: the engine
//! and the model loader take [`LoadOptions`] and [`EngineConfig`] values.

use weft::engine::EngineConfig;
use weft::kernels::{CpuActivations, CpuKernels};
use weft::loading::LoadOptions;
use weft::Result;

/// What every command loads and runs with.
#[derive(Debug, Clone)]
pub struct Options {
    /// How models are loaded and compute.
    pub load: LoadOptions,
}

/// The options of this run: `--cpu-kernels` when given, else `WEFT_CPU_KERNELS`; the GGUF weight
/// handling from `WEFT_GGUF_WEIGHTS`, the dequantize threshold from `WEFT_DEQUANTIZE_ROWS`, and
/// projection fusion from `WEFT_FUSE_PROJECTIONS` (each variable documented in
/// [`weft::env`] and docs/building.md); `--cpu-activations` when given, else
/// `WEFT_CPU_ACTIVATIONS`. A bad value is an error naming the variable.
pub fn options_from_env(cpu_kernels: Option<CpuKernels>, cpu_activations: Option<CpuActivations>) -> Result<Options> {
    let load = weft::env::load_options(cpu_kernels, cpu_activations, None)?;
    Ok(Options { load })
}

impl Options {
    /// `config` with what the environment sets for engines: the decode mode (`WEFT_DECODE`),
    /// and injected faults (`WEFT_FAULTS`) in builds with weft-core's `faults` feature.
    pub fn engine_config(&self, config: EngineConfig) -> Result<EngineConfig> {
        weft::env::engine_config(config)
    }
}
