//! Hybrid gated-DeltaNet models against mlx-lm 0.32.2: qwen3_next (GDN + gated attention +
//! shared-expert MoE; float32 and 4-bit experts through `gather_qmm`), qwen3_5 (dense hybrid;
//! float32, bfloat16, 4-bit) and qwen3_5_moe (float32 and 4-bit experts).
//! Single-sequence trajectories and first-step logits bit-exact, batch_generate and
//! BatchGenerator continuous schedules token-exact, bursts of rows of different lengths
//! prefilled together (right-padded chunks, padding masked out of the recurrent layers) with
//! first-step logits bit-equal to each row's single-sequence run and mlx-lm's batched
//! logprobs, and prompt-cache reuse that never trims recurrent state.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use support::*;
use weft::engine::{Engine, EngineConfig, EngineCore, EngineStats, Event, Preparer, Request};
use weft::generate::{generate, FinishReason, GenerateOptions};
use weft::loading::LoadedModel;

const GDN_MODELS: &[&str] =
    &["qwen3_next", "qwen3_5", "qwen3_5-bf16", "qwen3_5-4bit", "qwen3_5_moe", "qwen3_next-4bit", "qwen3_5_moe-4bit"];

fn load(name: &str) -> LoadedModel {
    support::load_exact(&tiny_model_dir(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// What Weft must produce for a batched golden row: mlx-lm's batched tokens where they equal
/// its single-sequence run, else the single-sequence tokens.
fn expected(row: &Value) -> Vec<u32> {
    if row["equals_single"].as_bool().unwrap() {
        assert_eq!(ids(&row["tokens"]), ids(&row["single_tokens"]));
        ids(&row["tokens"])
    } else {
        ids(&row["single_tokens"])
    }
}

#[test]
fn single_sequence_trajectories_and_first_logits_are_bit_exact() {
    for name in GDN_MODELS {
        let g = golden(name);
        let loaded = load(name);
        assert_eq!(loaded.model.info().model_type, g["config"]["model_type"].as_str().unwrap());
        assert_single_cases_exact(name, loaded.model.as_ref(), &g);
    }
}

#[test]
fn batch_generate_goldens_match() {
    for name in GDN_MODELS {
        let g = golden(name);
        let single = load(name);
        let engine = Engine::start(load(name), EngineConfig::default()).unwrap();
        // The first step runs batched; its logits equal the single-sequence ones.
        assert_batch_goldens(name, &engine, single.model.as_ref(), &g, expected, 1e-5);
    }
}

#[test]
fn continuous_schedules_match_batch_generator() {
    for name in GDN_MODELS {
        let g = golden(name);
        for key in ["schedule", "schedule_chunked"] {
            let schedule = &g[key];
            for max_batch in [8, 2] {
                let outs = replay(load(name), schedule, max_batch);
                for (r, out) in schedule["rows"].as_array().unwrap().iter().zip(&outs) {
                    let what = format!("{name}/{key}/max_batch {max_batch}: row {}", r["id"]);
                    assert_eq!(out.finals, 1, "{what}: exactly one final event");
                    assert_eq!(out.error, None, "{what}");
                    assert_eq!(out.tokens, expected(r), "{what}");
                }
            }
        }
    }
}

/// Every row of a burst enqueued before the engine's first iteration (as mlx-lm's
/// `BatchGenerator.insert` of them all), run to the end with first-step logits captured.
fn run_burst(model: weft::loading::LoadedModel, rows: &[Value], config: EngineConfig) -> (Vec<Outcome>, EngineStats) {
    let info = model.model.info().clone();
    let prep = Preparer::new(&model, config.clone()).with_eos_token_ids(Vec::new());
    let mut core = EngineCore::new(model, config);
    let outs: Vec<Arc<Mutex<Outcome>>> = rows.iter().map(|_| Arc::default()).collect();
    for (i, r) in rows.iter().enumerate() {
        let out = Arc::clone(&outs[i]);
        let sink = Box::new(move |ev: &Event| {
            out.lock().unwrap().record(ev);
            true
        });
        let mut req = greedy(ids(&r["prompt_ids"]), r["max_tokens"].as_u64().unwrap() as usize);
        req.capture_first_logits = info.vocab_size as usize;
        core.enqueue(prep.submission(i as u64 + 1, req, sink).unwrap());
    }
    for _ in 0..10_000 {
        if core.is_idle() {
            let outs = outs.iter().map(|o| o.lock().unwrap().clone()).collect();
            return (outs, core.stats());
        }
        core.iterate();
    }
    panic!("the burst did not finish");
}

/// mlx-lm's logprobs (`logits - logsumexp(logits)` in the model's dtype) of captured logits.
fn logprobs(logits: &[f32], dtype: mlx_rs::Dtype) -> Vec<f32> {
    let a = mlx_rs::Array::from_slice(logits, &[1, logits.len() as i32]).as_dtype(dtype).unwrap();
    let lp = weft::sampling::Sampler::logprobs(&a).unwrap().as_dtype(mlx_rs::Dtype::Float32).unwrap();
    lp.eval().unwrap();
    lp.as_slice::<f32>().to_vec()
}

#[test]
fn bursts_of_different_lengths_prefill_together_exactly() {
    use weft::generate::{generate, GenerateOptions};
    for name in GDN_MODELS {
        let g = golden(name);
        let single = load(name);
        let info = single.model.info().clone();
        for key in ["burst", "burst_chunked"] {
            let burst = &g[key];
            let step = burst["prefill_step_size"].as_u64().unwrap() as usize;
            let rows = burst["rows"].as_array().unwrap();
            // mlx-lm's BatchGenerator defaults: 8 rows prefill at a time, 32 decode.
            let config = EngineConfig { max_batch: 32, prompt_concurrency: 8, prefill_step_size: step, ..Default::default() };
            let (outs, stats) = run_burst(load(name), rows, config);
            // Rows prefill together: a chunk forward serves every waiting row, so the forwards
            // are bounded by the longest prompt's chunks (+1 for the rows admitted later), not
            // by the sum over rows as when each row prefilled alone.
            let chunks = |r: &Value| ids(&r["prompt_ids"]).len().saturating_sub(1).div_ceil(step) as u64;
            let longest = rows.iter().map(chunks).max().unwrap();
            let alone: u64 = rows.iter().map(chunks).sum();
            assert!(stats.prefill_forwards <= longest + 1, "{name}/{key}: {} prefill forwards", stats.prefill_forwards);
            assert!(stats.prefill_forwards < alone, "{name}/{key}");
            for (r, out) in rows.iter().zip(&outs) {
                let what = format!("{name}/{key}: row {} ({} tokens)", r["id"], ids(&r["prompt_ids"]).len());
                assert_eq!((out.finals, &out.error), (1, &None), "{what}");
                assert_eq!(out.tokens, expected(r), "{what}");
                let opts = GenerateOptions {
                    max_tokens: 1,
                    prefill_step_size: step,
                    capture_first_logits: info.vocab_size as usize,
                    ..Default::default()
                };
                let solo = generate(single.model.as_ref(), None, &ids(&r["prompt_ids"]), &opts, |_| true).unwrap();
                let diffs = bit_diffs(&out.first_logits, &solo.first_logits);
                assert_eq!(diffs, 0, "{what}: {diffs} first-step logits differ from the row alone");
                let lp = logprobs(&out.first_logits, info.activation_dtype);
                let diffs = bit_diffs(&lp, &floats(&r["first_logprobs"]));
                assert_eq!(diffs, 0, "{what}: {diffs} first-step logprobs differ from mlx-lm's batch");
            }
        }
    }
}

#[test]
fn prompt_cache_reuses_recurrent_state_only_for_whole_prefixes() {
    for name in GDN_MODELS {
        let g = golden(name);
        let case = &g["single"][3];
        let prompt = ids(&case["prompt_ids"]);
        let want = ids(&case["tokens"]);
        let engine = Engine::start(load(name), EngineConfig { prompt_cache_bytes: 64 << 20, ..Default::default() }).unwrap();
        // A companion row makes the cached row's state come out of a multi-row batch.
        let companion = engine.submit_channel(greedy(ids(&g["single"][2]["prompt_ids"]), 12)).unwrap().1;
        let first = collect(&engine.submit_channel(greedy(prompt.clone(), 8)).unwrap().1);
        assert_eq!(collect(&companion).tokens, ids(&g["single"][2]["tokens"])[..12]);
        assert_eq!(first.tokens, want[..8]);

        // The finished row's whole sequence is a prefix of this prompt: its state is reused.
        let mut extended = prompt.clone();
        extended.extend_from_slice(&want[..12]);
        let warm = collect(&engine.submit_channel(greedy(extended, 8)).unwrap().1);
        assert!(warm.usage.cached_tokens >= prompt.len() + 7, "{name}: cached {}", warm.usage.cached_tokens);
        assert_eq!(warm.tokens, want[12..20], "{name}: continuing from reused state");

        // Shorter than anything cached: recurrent state cannot be trimmed, so nothing is
        // reused and the result equals a cold run.
        let short = prompt[..30].to_vec();
        let out = collect(&engine.submit_channel(greedy(short.clone(), 10)).unwrap().1);
        assert_eq!(out.usage.cached_tokens, 0, "{name}: a trimmed recurrent state was reused");
        let solo = load(name);
        let cold = generate(solo.model.as_ref(), None, &short, &GenerateOptions { max_tokens: 10, ..Default::default() }, |_| true).unwrap();
        assert_eq!(out.tokens, cold.tokens, "{name}");

        // The same prompt again (cached entry longer than prompt - 1): no reuse, same tokens.
        for round in 0..2 {
            let again = collect(&engine.submit_channel(greedy(prompt.clone(), 12)).unwrap().1);
            assert_eq!(again.tokens, want[..12], "{name}: round {round}");
        }
    }
}

#[test]
fn a_row_ended_by_eos_leaves_no_state_covering_the_unnamed_token() {
    // The pipelined step has already fed the EOS token when the row ends, so its recurrent
    // state covers one token more than the row's output: its entry names that EOS, and a
    // prompt that continues with another token must not reuse it.
    let g = golden("qwen3_next");
    let loaded = load("qwen3_next");
    let eos = loaded.eos_token_ids.clone();
    let row = &g["schedule"]["rows"][1];
    let (prompt, want) = (ids(&row["prompt_ids"]), ids(&row["single_tokens"]));
    let cut = want.iter().position(|t| eos.contains(t)).expect("the golden trajectory reaches EOS");
    let engine = Engine::start(loaded, EngineConfig { prompt_cache_bytes: 64 << 20, ..Default::default() }).unwrap();
    let stopped = collect(&engine.submit_channel(Request { ignore_eos: false, ..greedy(prompt.clone(), 16) }).unwrap().1);
    assert_eq!(stopped.finish, Some(FinishReason::Stop));
    assert_eq!(stopped.tokens, want[..cut]);

    let mut next = prompt.clone();
    next.extend_from_slice(&want[..cut]);
    next.push(7); // not the EOS the state already saw
    let out = collect(&engine.submit_channel(greedy(next.clone(), 8)).unwrap().1);
    let solo = load("qwen3_next");
    let cold = generate(solo.model.as_ref(), None, &next, &GenerateOptions { max_tokens: 8, ..Default::default() }, |_| true).unwrap();
    assert_eq!(out.tokens, cold.tokens);
    // Only the checkpoint taken at the end of the first prompt's prefill is reused.
    assert_eq!(out.usage.cached_tokens, prompt.len() - 1);
}

#[test]
fn cancelling_a_row_leaves_the_others_exact() {
    let g = golden("qwen3_next");
    let engine = Engine::start(load("qwen3_next"), EngineConfig::default()).unwrap();
    let cases: Vec<&Value> = g["single"].as_array().unwrap().iter().take(4).collect();
    let streams: Vec<_> = cases.iter().map(|c| engine.submit_channel(greedy(ids(&c["prompt_ids"]), 24)).unwrap()).collect();
    let victim = streams[1].0;
    let first = loop {
        match streams[1].1.recv_timeout(Duration::from_secs(60)).unwrap() {
            Event::Started { .. } => {}
            ev => break ev,
        }
    };
    assert!(matches!(first, Event::Token { .. }));
    engine.cancel(victim);
    for (i, ((_, rx), c)) in streams.iter().zip(&cases).enumerate() {
        let out = if i == 1 { collect_after(std::slice::from_ref(&first), rx) } else { collect(rx) };
        let want = ids(&c["tokens"]);
        if i == 1 {
            assert_eq!(out.finish, Some(FinishReason::Cancelled));
            assert!(want.starts_with(&out.tokens));
        } else {
            assert_eq!(out.tokens, want, "row {i}");
        }
    }
}

fn load_error(dir: &std::path::Path, what: &str) -> String {
    match support::load_exact(dir) {
        Ok(_) => panic!("{what}: loading must fail"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn broken_configs_fail_with_clear_errors() {
    let dir = copy_model("qwen3_next");
    edit_config(dir.path(), |v| {
        v["linear_num_value_heads"] = 3.into();
    });
    let err = load_error(dir.path(), "3 value heads over 2 key heads");
    assert!(err.contains("linear_num_value_heads"), "{err}");

    let dir = copy_model("qwen3_5");
    edit_config(dir.path(), |v| {
        v["text_config"]["rope_parameters"]["partial_rotary_factor"] = 0.0.into();
    });
    let err = load_error(dir.path(), "no rotary dims");
    assert!(err.contains("partial_rotary_factor"), "{err}");
}
