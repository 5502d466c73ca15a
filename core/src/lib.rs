//! Weft: an embeddable LLM inference engine on MLX.
//!
//! Layers, bottom-up: [`loading`] (configs, weights, GGUF) → [`nn`] shared layers →
//! [`models`] one file per architecture → [`cache`] KV caches behind one trait →
//! [`sampling`] → [`prefill`] prompt checks, chunked prefill and host reads → [`engine`]
//! continuous batching → [`generate`] single-sequence generation on the engine's executor (the
//! API bindings and the server wrap the engine). Tokenization and chat templates live in
//! [`tokenizer`]; the default model is fetched by [`model_store`]. [`contract`] is the one
//! schema and validation of requests and engine options that every face parses with.

pub mod audio;
pub mod cache;
pub mod constrain;
pub mod contract;
pub mod distributed;
pub mod error;
pub mod engine;
pub mod env;
pub mod generate;
pub mod gguf;
pub mod language_model;
pub mod limits;
pub mod kernels;
pub mod loading;
pub mod model_store;
pub mod models;
pub mod nn;
pub mod prefill;
pub mod reasoning;
pub mod sampling;
pub mod stop;
pub mod tokenizer;
pub mod tools;
pub mod vision;

pub use error::{Error, ErrorCode, Result};

/// The device MLX computes on by default in this process: `"gpu"` when the libmlx loaded at
/// run time has a GPU backend that found a device (Metal on a Mac, CUDA with the `mlx-cuda-*`
/// wheels, see docs/building.md), else `"cpu"`.
pub fn default_device() -> &'static str {
    match mlx_rs::Device::try_default().and_then(|d| d.get_type()) {
        Ok(mlx_rs::DeviceType::Gpu) => "gpu",
        _ => "cpu",
    }
}
