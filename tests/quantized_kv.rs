//! Quantized KV cache (`kv_bits` / `kv_group_size` / `quantized_kv_start`).
//!
//! - Single sequence: token-exact and first-step-logit bit-exact against mlx-lm's
//!   `generate_step(..., kv_bits=...)` (goldens/quantized_kv.json).
//! - Batched quantized KV (which mlx-lm lacks) is gated two ways: a lone row through the
//!   engine's batch path equals the serial quantized run exactly, and over several rows the
//!   KL divergence of batched-quantized from batched-full logits is no worse than the serial
//!   quantized-vs-full KL (within the tolerance stated below).

mod support;

use std::time::Duration;

use mlx_rs::Array;
use serde_json::Value;
use support::*;
use weft::cache::{extend_rows_mixed, maybe_quantize, KvCache, KvQuantization};
use weft::engine::{Engine, EngineConfig, Event, Input, Request};
use weft::generate::{generate, prefill_with, GenerateOptions};
use weft::loading;
use weft::models::LanguageModel;
use weft::sampling::SamplingParams;

fn kv_of(case: &Value) -> KvQuantization {
    KvQuantization {
        bits: case["kv_bits"].as_i64().unwrap() as i32,
        group_size: case["kv_group_size"].as_i64().unwrap() as i32,
        start: case["quantized_kv_start"].as_u64().unwrap() as usize,
    }
}

fn bit_diffs(a: &[f32], b: &[f32]) -> usize {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).filter(|(x, y)| x.to_bits() != y.to_bits()).count()
}

#[test]
fn single_sequence_matches_mlx_lm_generate_step_with_kv_bits() {
    let g = golden("quantized_kv");
    let mut differs_from_full = 0;
    for case in g["cases"].as_array().unwrap() {
        let name = case["model"].as_str().unwrap();
        let kv = kv_of(case);
        let loaded = loading::load(&tiny_model_dir(name)).unwrap();
        let vocab = loaded.model.info().vocab_size as usize;
        for run in case["single"].as_array().unwrap() {
            let prompt = ids(&run["prompt_ids"]);
            let want = ids(&run["tokens"]);
            let opts = GenerateOptions {
                max_tokens: want.len(),
                prefill_step_size: run["prefill_step_size"].as_u64().unwrap() as usize,
                capture_first_logits: vocab,
                kv_quantization: Some(kv),
                ..GenerateOptions::default()
            };
            let out = generate(loaded.model.as_ref(), None, &prompt, &opts, |_| true).unwrap();
            let what = format!("{name} {kv:?}: {}-token prompt, prefill step {}", prompt.len(), opts.prefill_step_size);
            assert_eq!(out.tokens, want, "{what}");
            let diffs = bit_diffs(&out.first_logits, &floats(&run["first_logits"]));
            assert_eq!(diffs, 0, "{what}: {diffs} of {vocab} first-step logits differ");
            if want != ids(&run["full_precision_tokens"]) {
                differs_from_full += 1;
            }
        }
    }
    // The goldens must actually exercise quantization error, not just reproduce full precision.
    assert!(differs_from_full >= 10, "only {differs_from_full} quantized runs differ from full precision");
}
