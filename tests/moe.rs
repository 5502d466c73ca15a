//! Mixture-of-experts parity with mlx-lm (`qwen3_moe`, fp32 and 4-bit experts): single-sequence
//! trajectories and bit-exact first-step logits (including the sort-by-expert path of a 39-token
//! prefill), and the continuous-batching engine against batch_generate and BatchGenerator
//! schedules, token for token.

mod support;

use support::*;
use weft::engine::{Engine, EngineConfig};
use weft::generate::{generate, GenerateOptions};

const MOE_MODELS: &[&str] = &["qwen3_moe", "qwen3_moe-4bit"];

#[test]
fn qwen3_moe_single_sequence_matches_mlx_lm_bit_exactly() {
    for name in MOE_MODELS {
        let g = golden(name);
        let loaded = support::load_exact(&tiny_model_dir(name)).unwrap();
        assert_eq!(loaded.model.info().model_type, "qwen3_moe");
        assert_single_cases_exact(name, loaded.model.as_ref(), &g);
    }
}

#[test]
fn qwen3_moe_batch_generate_goldens_through_the_engine() {
    for name in MOE_MODELS {
        let g = golden(name);
        let single = support::load_exact(&tiny_model_dir(name)).unwrap();
        let engine = Engine::start(support::load_exact(&tiny_model_dir(name)).unwrap(), EngineConfig::default()).unwrap();
        // The batched first step equals the single-sequence one bit for bit.
        assert_batch_goldens(name, &engine, single.model.as_ref(), &g, |r| ids(&r["tokens"]), 0.0);
    }
}

#[test]
fn qwen3_moe_continuous_schedules_match_batch_generator() {
    for name in MOE_MODELS {
        let g = golden(name);
        for key in ["schedule", "schedule_chunked"] {
            let schedule = &g[key];
            let outs = replay(support::load_exact(&tiny_model_dir(name)).unwrap(), schedule, 8);
            for (r, out) in schedule["rows"].as_array().unwrap().iter().zip(&outs) {
                assert_eq!(out.finals, 1, "{name}/{key}: exactly one final event");
                assert!(out.error.is_none(), "{name}/{key}: {:?}", out.error);
                assert_eq!(out.tokens, ids(&r["tokens"]), "{name}/{key}: row {}", r["id"]);
            }
        }
    }
}

#[test]
fn many_rows_take_the_sorted_expert_path_and_still_equal_single_sequence() {
    // 40 rows decoding together route 80 (token, expert) pairs per step, past SwitchGLU's
    // sort threshold of 64; every row must still follow its single-sequence trajectory.
    let name = "qwen3_moe";
    let g = golden(name);
    let single = support::load_exact(&tiny_model_dir(name)).unwrap();
    let engine = Engine::start(
        support::load_exact(&tiny_model_dir(name)).unwrap(),
        EngineConfig { max_batch: 40, prompt_concurrency: 40, ..Default::default() },
    )
    .unwrap();
    let base = ids(&g["single"][2]["prompt_ids"]);
    let prompts: Vec<Vec<u32>> = (0..40u32).map(|i| base.iter().map(|t| (t + 37 * i) % 1024).collect()).collect();
    let streams: Vec<_> = prompts.iter().map(|p| engine.submit_channel(greedy(p.clone(), 6)).unwrap().1).collect();
    for (p, rx) in prompts.iter().zip(&streams) {
        let out = collect(rx);
        let solo = generate(single.model.as_ref(), None, p, &GenerateOptions { max_tokens: 6, ..Default::default() }, |_| true).unwrap();
        assert_eq!(out.tokens, solo.tokens);
    }
}
