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

use mlx_rs::Array;
use serde_json::Value;
use support::*;
use weft::engine::{Engine, EngineConfig, EngineCore, EngineStats, Event, Preparer, Request};
use weft::generate::{generate, FinishReason, GenerateOptions};
use weft::loading::LoadedModel;
use weft::nn::{gated_delta_recurrence, GatedDeltaKernel, LayerOptions};

const GDN_MODELS: &[&str] =
    &["qwen3_next", "qwen3_5", "qwen3_5-bf16", "qwen3_5-4bit", "qwen3_5_moe", "qwen3_next-4bit", "qwen3_5_moe-4bit"];

fn load(name: &str) -> LoadedModel {
    support::load_exact(&tiny_model_dir(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// [`load`] with the recurrence run by `kernel`.
fn load_gdn(name: &str, kernel: GatedDeltaKernel) -> LoadedModel {
    let options = weft::loading::LoadOptions { gated_delta: Some(kernel), ..exact_options() };
    weft::loading::load_with(&tiny_model_dir(name), &options).unwrap_or_else(|e| panic!("{name}: {e}"))
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
    assert_bursts_exact(GDN_MODELS, load);
}

/// Every burst golden of `models`, each loaded by `load`: mlx-lm's tokens, and first-step logits
/// bit-equal to each row alone and to mlx-lm's batched logprobs.
fn assert_bursts_exact(models: &[&str], load: impl Fn(&str) -> LoadedModel) {
    use weft::generate::{generate, GenerateOptions};
    for name in models {
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

/// The goldens whose activations are float32: there MLX's fused `gated_delta_update` (its
/// fallback graph on the CPU) computes the ops path's numbers bit for bit. (In bfloat16 the
/// fallback rounds the decay to bfloat16 first; see the recurrence test below.)
const FLOAT32_GDN_MODELS: &[&str] =
    &["qwen3_next", "qwen3_5", "qwen3_5-4bit", "qwen3_5_moe", "qwen3_next-4bit", "qwen3_5_moe-4bit"];

/// The Metal path's wiring (MLX's fused op, run here through its CPU fallback): the models'
/// single-sequence goldens and the padded bursts stay bit-exact with mlx-lm.
#[test]
fn fused_recurrence_keeps_the_goldens_exact() {
    let fused = |name: &str| load_gdn(name, GatedDeltaKernel::Fused);
    for name in FLOAT32_GDN_MODELS {
        let loaded = fused(name);
        assert_single_cases_exact(name, loaded.model.as_ref(), &golden(name));
    }
    assert_bursts_exact(FLOAT32_GDN_MODELS, fused);
}

/// Deterministic values in [lo, hi) (a 64-bit LCG; no RNG state shared with other tests).
fn uniform(seed: u64, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            lo + (hi - lo) * ((x >> 40) as f32 / (1u64 << 24) as f32)
        })
        .collect()
}

struct RecurrenceCase {
    b: i32,
    t: i32,
    hk: i32,
    hv: i32,
    dk: i32,
    dv: i32,
    /// Real tokens per row (right padding after), or no mask.
    lengths: Option<Vec<i32>>,
    initial_state: bool,
}

/// `(q, k, v, g, beta, state, mask)` for `c` in float32 (q and k L2-normalized per head as the
/// layer feeds them, the decay in (0.5, 1)).
fn recurrence_inputs(c: &RecurrenceCase, seed: u64) -> (Array, Array, Array, Array, Array, Option<Array>, Option<Array>) {
    let qk_shape = [c.b, c.t, c.hk, c.dk];
    let n_qk = (c.b * c.t * c.hk * c.dk) as usize;
    let unit = |a: Array| {
        let norm = a.square().unwrap().sum_axis(-1, true).unwrap().sqrt().unwrap();
        a.divide(&norm).unwrap()
    };
    let q = unit(Array::from_slice(&uniform(seed, n_qk, -1.0, 1.0), &qk_shape));
    let k = unit(Array::from_slice(&uniform(seed + 1, n_qk, -1.0, 1.0), &qk_shape));
    let v = Array::from_slice(&uniform(seed + 2, (c.b * c.t * c.hv * c.dv) as usize, -1.0, 1.0), &[c.b, c.t, c.hv, c.dv]);
    let gates = (c.b * c.t * c.hv) as usize;
    let g = Array::from_slice(&uniform(seed + 3, gates, 0.5, 1.0), &[c.b, c.t, c.hv]);
    let beta = Array::from_slice(&uniform(seed + 4, gates, 0.0, 1.0), &[c.b, c.t, c.hv]);
    let state = c.initial_state.then(|| {
        Array::from_slice(&uniform(seed + 5, (c.b * c.hv * c.dv * c.dk) as usize, -0.3, 0.3), &[c.b, c.hv, c.dv, c.dk])
    });
    let mask = c.lengths.as_ref().map(|lens| {
        let m: Vec<bool> = lens.iter().flat_map(|&l| (0..c.t).map(move |t| t < l)).collect();
        Array::from_slice(&m, &[c.b, c.t])
    });
    (q, k, v, g, beta, state, mask)
}

/// `y` with the masked steps zeroed (the paths differ only there: the fused op writes 0, the
/// ops path mlx-lm's unmasked value; no caller reads them).
fn masked_y(y: &Array, mask: Option<&Array>) -> Array {
    match mask {
        Some(m) => {
            let keep = m.expand_dims_axes(&[2, 3]).unwrap();
            mlx_rs::ops::select(&keep, y, &Array::from_f32(0.0).as_dtype(y.dtype()).unwrap()).unwrap()
        }
        None => y.clone(),
    }
}

/// How many elements of `a` and `b` (same shape) differ in their bits (as float32, which holds
/// bfloat16 values exactly).
fn bits_differing(a: &Array, b: &Array) -> usize {
    assert_eq!(a.shape(), b.shape());
    let f = |x: &Array| {
        let x = x.as_dtype(mlx_rs::Dtype::Float32).unwrap();
        x.eval().unwrap();
        x.as_slice::<f32>().to_vec()
    };
    bit_diffs(&f(a), &f(b))
}

fn max_abs_diff(a: &Array, b: &Array) -> f32 {
    let d = a.as_dtype(mlx_rs::Dtype::Float32).unwrap().subtract(b.as_dtype(mlx_rs::Dtype::Float32).unwrap()).unwrap();
    d.abs().unwrap().max(None).unwrap().item_cast::<f32>()
}

/// MLX's fused `gated_delta_update` (its CPU fallback) against Weft's ops path: the same
/// conventions (decay in linear space, `[B,T,H,D]` inputs, value heads grouped over key heads
/// as `hv / (Hv/Hk)`, state `[B,Hv,Dv,Dk]`, mask false = the state holds) for T = 1 and T > 1,
/// batch > 1, Hv > Hk, padding masks, with and without an initial state. Float32: bit-equal.
/// Bfloat16 q/k/v/beta: the fallback rounds the float32 decay to bfloat16 first, so it is
/// bit-equal to the ops path given that rounded decay, and within 1e-2 of the unrounded one.
#[test]
fn fused_recurrence_equals_the_ops_path() {
    use mlx_rs::Dtype;
    let cases = [
        RecurrenceCase { b: 1, t: 1, hk: 2, hv: 2, dk: 16, dv: 16, lengths: None, initial_state: true },
        RecurrenceCase { b: 2, t: 1, hk: 1, hv: 3, dk: 32, dv: 8, lengths: Some(vec![1, 0]), initial_state: true },
        RecurrenceCase { b: 3, t: 9, hk: 2, hv: 4, dk: 16, dv: 24, lengths: Some(vec![9, 4, 1]), initial_state: true },
        RecurrenceCase { b: 2, t: 6, hk: 2, hv: 6, dk: 32, dv: 16, lengths: None, initial_state: false },
        RecurrenceCase { b: 4, t: 5, hk: 4, hv: 4, dk: 64, dv: 32, lengths: Some(vec![5, 5, 2, 3]), initial_state: false },
    ];
    for (i, c) in cases.iter().enumerate() {
        let what = format!("case {i} (B={} T={} Hk={} Hv={} Dk={} Dv={})", c.b, c.t, c.hk, c.hv, c.dk, c.dv);
        let (q, k, v, g, beta, state, mask) = recurrence_inputs(c, 100 + i as u64);
        let run = |kernel, q: &Array, k: &Array, v: &Array, g: &Array, beta: &Array| {
            let (y, s) = gated_delta_recurrence(kernel, q, k, v, g, beta, state.clone(), mask.as_ref()).unwrap();
            let y = masked_y(&y, mask.as_ref());
            mlx_rs::transforms::eval([&y, &s]).unwrap();
            (y, s)
        };
        let (y_ops, s_ops) = run(GatedDeltaKernel::Ops, &q, &k, &v, &g, &beta);
        let (y_fused, s_fused) = run(GatedDeltaKernel::Fused, &q, &k, &v, &g, &beta);
        assert_eq!(y_fused.shape(), &[c.b, c.t, c.hv, c.dv], "{what}");
        assert_eq!((s_fused.shape(), s_fused.dtype()), (&[c.b, c.hv, c.dv, c.dk][..], Dtype::Float32), "{what}");
        assert_eq!(bits_differing(&y_fused, &y_ops), 0, "{what}: float32 y");
        assert_eq!(bits_differing(&s_fused, &s_ops), 0, "{what}: float32 state");

        let bf = |a: &Array| a.as_dtype(Dtype::Bfloat16).unwrap();
        let (qb, kb, vb, betab) = (bf(&q), bf(&k), bf(&v), bf(&beta));
        let (y_fused, s_fused) = run(GatedDeltaKernel::Fused, &qb, &kb, &vb, &g, &betab);
        assert_eq!(y_fused.dtype(), Dtype::Bfloat16, "{what}");
        let (y_rounded, s_rounded) = run(GatedDeltaKernel::Ops, &qb, &kb, &vb, &bf(&g), &betab);
        assert_eq!(bits_differing(&y_fused, &y_rounded), 0, "{what}: bfloat16 y, decay rounded");
        assert_eq!(bits_differing(&s_fused, &s_rounded), 0, "{what}: bfloat16 state, decay rounded");
        let (y_ops, s_ops) = run(GatedDeltaKernel::Ops, &qb, &kb, &vb, &g, &betab);
        assert!(max_abs_diff(&y_fused, &y_ops) < 1e-2, "{what}: bfloat16 y {}", max_abs_diff(&y_fused, &y_ops));
        assert!(max_abs_diff(&s_fused, &s_ops) < 1e-2, "{what}: bfloat16 state {}", max_abs_diff(&s_fused, &s_ops));
    }
}

/// Weft's CPU primitive (the fast mode's recurrence) against the ops path on the same random
/// inputs: float32 within 1e-5 (the sums' order differs), bfloat16 y within one bfloat16 step.
#[test]
fn cpu_recurrence_matches_the_ops_path() {
    use mlx_rs::Dtype;
    let cases = [
        RecurrenceCase { b: 1, t: 1, hk: 2, hv: 2, dk: 16, dv: 16, lengths: None, initial_state: true },
        RecurrenceCase { b: 3, t: 9, hk: 2, hv: 4, dk: 16, dv: 24, lengths: Some(vec![9, 4, 0]), initial_state: true },
        RecurrenceCase { b: 2, t: 33, hk: 2, hv: 6, dk: 36, dv: 40, lengths: None, initial_state: false },
        RecurrenceCase { b: 2, t: 64, hk: 4, hv: 8, dk: 128, dv: 128, lengths: Some(vec![64, 17]), initial_state: true },
    ];
    for (i, c) in cases.iter().enumerate() {
        let what = format!("case {i} (B={} T={} Hk={} Hv={} Dk={} Dv={})", c.b, c.t, c.hk, c.hv, c.dk, c.dv);
        let (q, k, v, g, beta, state, mask) = recurrence_inputs(c, 200 + i as u64);
        let run = |kernel, q: &Array, k: &Array, v: &Array, beta: &Array| {
            let (y, s) = gated_delta_recurrence(kernel, q, k, v, &g, beta, state.clone(), mask.as_ref()).unwrap();
            let y = masked_y(&y, mask.as_ref());
            mlx_rs::transforms::eval([&y, &s]).unwrap();
            (y, s)
        };
        for dtype in [Dtype::Float32, Dtype::Bfloat16] {
            let cast = |a: &Array| a.as_dtype(dtype).unwrap();
            let (q, k, v, beta) = (cast(&q), cast(&k), cast(&v), cast(&beta));
            let (y_ops, s_ops) = run(GatedDeltaKernel::Ops, &q, &k, &v, &beta);
            let (y_cpu, s_cpu) = run(GatedDeltaKernel::Cpu, &q, &k, &v, &beta);
            assert_eq!((y_cpu.shape(), y_cpu.dtype()), (y_ops.shape(), dtype), "{what}");
            assert_eq!((s_cpu.shape(), s_cpu.dtype()), (s_ops.shape(), Dtype::Float32), "{what}");
            let (dy, ds) = (max_abs_diff(&y_cpu, &y_ops), max_abs_diff(&s_cpu, &s_ops));
            let tol_y = if dtype == Dtype::Float32 { 1e-5 } else { 1.6e-2 };
            assert!(dy <= tol_y && ds <= 1e-5, "{what} {dtype:?}: max |dy| {dy}, max |dstate| {ds}");
        }
    }
}

/// A model whose recurrence runs on the CPU primitive (every other kernel exact) keeps the
/// goldens' greedy tokens, single and in padded bursts, with first logits within 1e-4.
#[test]
fn cpu_recurrence_keeps_the_goldens_tokens() {
    for name in ["qwen3_5", "qwen3_next", "qwen3_5-4bit"] {
        let g = golden(name);
        let loaded = load_gdn(name, GatedDeltaKernel::Cpu);
        let exact = load(name);
        let vocab = loaded.model.info().vocab_size as usize;
        for case in g["single"].as_array().unwrap() {
            let prompt = ids(&case["prompt_ids"]);
            let opts = GenerateOptions {
                max_tokens: ids(&case["tokens"]).len(),
                prefill_step_size: case["prefill_step_size"].as_u64().unwrap() as usize,
                capture_first_logits: vocab,
                ..GenerateOptions::default()
            };
            let got = generate(loaded.model.as_ref(), None, &prompt, &opts, |_| true).unwrap();
            let want = generate(exact.model.as_ref(), None, &prompt, &opts, |_| true).unwrap();
            assert_eq!(got.tokens, ids(&case["tokens"]), "{name}: {} prompt tokens", prompt.len());
            let d = got.first_logits.iter().zip(&want.first_logits).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(d < 1e-4, "{name}: first logits differ by {d}");
        }
        let burst = &g["burst"];
        let step = burst["prefill_step_size"].as_u64().unwrap() as usize;
        let rows = burst["rows"].as_array().unwrap();
        let config = EngineConfig { max_batch: 32, prompt_concurrency: 8, prefill_step_size: step, ..Default::default() };
        let (outs, _) = run_burst(load_gdn(name, GatedDeltaKernel::Cpu), rows, config);
        for (r, out) in rows.iter().zip(&outs) {
            assert_eq!(out.tokens, expected(r), "{name}: burst row {}", r["id"]);
        }
    }
}

/// The recurrence's implementation is a load option: on the CPU Weft's primitive in the fast
/// mode and the ops path in the exact mode by default; the CUDA kernel refused without a CUDA GPU.
#[test]
fn gated_delta_kernel_option_resolves_per_device() {
    use weft::kernels::CpuKernels;
    assert_eq!(LayerOptions::default().gated_delta(), GatedDeltaKernel::Cpu);
    let exact = LayerOptions::new(CpuKernels::Exact, None, None, None).unwrap();
    assert_eq!(exact.gated_delta(), GatedDeltaKernel::Ops);
    let fused = exact.clone().with_gated_delta(Some(GatedDeltaKernel::Fused)).unwrap();
    assert_eq!(fused.gated_delta(), GatedDeltaKernel::Fused);
    let err = exact.with_gated_delta(Some(GatedDeltaKernel::Cuda)).err().expect("no CUDA GPU here");
    assert!(err.to_string().contains("CUDA"), "{err}");
    let cuda_load = weft::loading::LoadOptions { gated_delta: Some(GatedDeltaKernel::Cuda), ..exact_options() };
    assert!(weft::loading::load_with(&tiny_model_dir("qwen3_5"), &cuda_load).is_err());
    for k in [GatedDeltaKernel::Ops, GatedDeltaKernel::Fused, GatedDeltaKernel::Cuda, GatedDeltaKernel::Cpu] {
        assert_eq!(k.as_str().parse::<GatedDeltaKernel>().unwrap(), k);
    }
    assert!("metal".parse::<GatedDeltaKernel>().is_err());
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
