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
use weft::cache::{self, KvCache, KvQuantization};
use weft::engine::{Engine, EngineConfig, Event, Input, Request};
use weft::generate::{generate, prefill, GenerateOptions};
use weft::models::LanguageModel;
use weft::sampling::SamplingParams;

fn kv_of(case: &Value) -> KvQuantization {
    KvQuantization {
        bits: case["kv_bits"].as_i64().unwrap() as i32,
        group_size: case["kv_group_size"].as_i64().unwrap() as i32,
        start: case["quantized_kv_start"].as_u64().unwrap() as usize,
    }
}

#[test]
fn single_sequence_matches_mlx_lm_generate_step_with_kv_bits() {
    let g = golden("quantized_kv");
    let mut differs_from_full = 0;
    for case in g["cases"].as_array().unwrap() {
        let name = case["model"].as_str().unwrap();
        let kv = kv_of(case);
        let loaded = support::load_exact(&tiny_model_dir(name)).unwrap();
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

fn kv_config(kv: &KvQuantization) -> EngineConfig {
    EngineConfig {
        kv_bits: Some(kv.bits),
        kv_group_size: kv.group_size,
        quantized_kv_start: kv.start,
        ..EngineConfig::default()
    }
}

fn greedy(prompt: Vec<u32>, max_tokens: usize, capture: usize) -> Request {
    Request {
        max_tokens,
        sampling: SamplingParams::greedy(),
        ignore_eos: true,
        capture_first_logits: capture,
        ..Request::new(Input::Tokens(prompt))
    }
}

/// Tokens and first-step logits of one request's stream.
fn collect(rx: &std::sync::mpsc::Receiver<Event>) -> (Vec<u32>, Vec<f32>) {
    let mut tokens = Vec::new();
    loop {
        match rx.recv_timeout(Duration::from_secs(120)).expect("no final event within 120 s") {
            Event::Token { token_id, .. } => tokens.push(token_id),
            Event::Done { usage, first_logits, .. } => {
                assert_eq!(tokens.len(), usage.completion_tokens);
                return (tokens, first_logits);
            }
            Event::Started { .. } => {}
            Event::Error { message } => panic!("request failed: {message}"),
        }
    }
}

#[test]
fn a_lone_row_on_the_engine_batch_path_equals_serial_quantized_exactly() {
    let g = golden("quantized_kv");
    for case in g["cases"].as_array().unwrap() {
        let name = case["model"].as_str().unwrap();
        let kv = kv_of(case);
        for run in case["single"].as_array().unwrap() {
            let step = run["prefill_step_size"].as_u64().unwrap() as usize;
            let config = EngineConfig { prefill_step_size: step, ..kv_config(&kv) };
            let engine = Engine::start(support::load_exact(&tiny_model_dir(name)).unwrap(), config).unwrap();
            let vocab = engine.model_info().vocab_size as usize;
            let want = ids(&run["tokens"]);
            // One request at a time: it decodes as a one-row batch (batched quantized cache,
            // per-row RoPE offsets, explicit mask).
            let (_, rx) = engine.submit_channel(greedy(ids(&run["prompt_ids"]), want.len(), vocab)).unwrap();
            let (tokens, first_logits) = collect(&rx);
            let what = format!("{name} {kv:?}: {}-token prompt, prefill step {step}", run["prompt_ids"].as_array().unwrap().len());
            assert_eq!(tokens, want, "{what}");
            assert_eq!(bit_diffs(&first_logits, &floats(&run["first_logits"])), 0, "{what}: first logits");
        }
    }
}

type Rows = Vec<Vec<Vec<f32>>>; // [row][step][vocab] log-probabilities

fn logprob_rows(logits: &Array) -> Vec<Vec<f32>> {
    let lp = logits.subtract(mlx_rs::ops::logsumexp_axis(logits, -1, true).unwrap()).unwrap();
    let lp = lp.as_dtype(mlx_rs::Dtype::Float32).unwrap();
    lp.eval().unwrap();
    let v = lp.dim(-1) as usize;
    lp.as_slice::<f32>().chunks(v).map(|c| c.to_vec()).collect()
}

/// Teacher-forced log-probabilities of `forced[r].len()` decode steps for `prompts` decoding
/// together the engine's way: each prefilled alone (quantized after each chunk when `kv` is
/// set), joined into one left-padded batch; the caches (`cache::quantizing`) convert themselves.
/// With `batched = false` each prompt runs alone on single-sequence caches instead.
fn teacher_forced(model: &dyn LanguageModel, prompts: &[Vec<u32>], forced: &[Vec<u32>], kv: Option<&KvQuantization>, batched: bool) -> Rows {
    if !batched {
        return prompts
            .iter()
            .zip(forced)
            .map(|(p, f)| {
                let mut caches = single_prefill(model, p, kv);
                teacher_forced_run(model, &mut caches, std::slice::from_ref(p), std::slice::from_ref(f)).remove(0)
            })
            .collect();
    }
    let mut batch: Option<Vec<Box<dyn KvCache>>> = None;
    for p in prompts {
        let caches: Vec<Box<dyn KvCache>> =
            single_prefill(model, p, kv).into_iter().map(|c| c.into_batched().unwrap()).collect();
        match batch.as_mut() {
            None => batch = Some(caches),
            Some(b) => b.iter_mut().zip(caches).for_each(|(dst, c)| cache::extend_rows(dst.as_mut(), c).unwrap()),
        }
    }
    teacher_forced_run(model, batch.as_mut().unwrap(), prompts, forced)
}

fn single_prefill(model: &dyn LanguageModel, prompt: &[u32], kv: Option<&KvQuantization>) -> Vec<Box<dyn KvCache>> {
    let mut caches = cache::quantizing(model.make_caches(), kv);
    prefill(model, &mut caches, &prompt[..prompt.len() - 1], 2048).unwrap();
    caches
}

/// Decodes with `caches` (holding all rows): step 0 feeds each prompt's last token, step i the
/// forced token i - 1.
fn teacher_forced_run(
    model: &dyn LanguageModel,
    caches: &mut [Box<dyn KvCache>],
    prompts: &[Vec<u32>],
    forced: &[Vec<u32>],
) -> Rows {
    let steps = forced[0].len();
    let mut out: Rows = vec![Vec::new(); prompts.len()];
    for s in 0..steps {
        let input: Vec<u32> =
            (0..prompts.len()).map(|r| if s == 0 { *prompts[r].last().unwrap() } else { forced[r][s - 1] }).collect();
        let input = Array::from_slice(&input, &[input.len() as i32, 1]);
        let logits = model.forward(&input, caches).unwrap();
        let logits = weft::nn::last_position(&logits).unwrap();
        for (r, row) in logprob_rows(&logits).into_iter().enumerate() {
            out[r].push(row);
        }
    }
    out
}

/// Mean over rows and steps of KL(P || Q) from log-probability rows.
fn mean_kl(p: &Rows, q: &Rows) -> f64 {
    let mut total = 0.0;
    let mut n = 0;
    for (pr, qr) in p.iter().zip(q) {
        for (ps, qs) in pr.iter().zip(qr) {
            total += ps.iter().zip(qs).map(|(&a, &b)| (a as f64).exp() * (a as f64 - b as f64)).sum::<f64>();
            n += 1;
        }
    }
    total / n as f64
}

/// Batched-quantized KL may exceed the serial one by at most this factor (plus a floor for
/// float noise). Rows quantize their own positions identically alone or in a batch, so with
/// `quantized_kv_start` 0 the two KLs differ only by reduction order over padded columns.
///
/// With `quantized_kv_start` > 0 a batch holds one representation for all its rows, so it turns
/// quantized when its longest row reaches `start` (and a quantized joiner converts the batch):
/// short rows quantize earlier than they would alone. The gate for that mode is the serial KL
/// of quantizing from the first forward (`start` 0), i.e. never worse than fully quantized.
const KL_RATIO_TOLERANCE: f64 = 1.10;
const KL_FLOOR: f64 = 1e-6;

#[test]
fn batched_quantized_kl_is_no_worse_than_serial_and_a_lone_row_is_exact_every_step() {
    let steps = 16;
    for (name, bits, group, start) in [("llama-fp32", 4, 32, 0), ("qwen3", 8, 32, 0), ("llama-fp32", 4, 32, 12), ("llama-hd64", 4, 64, 0)] {
        let kv = KvQuantization { bits, group_size: group, start };
        let loaded = support::load_exact(&tiny_model_dir(name)).unwrap();
        let model = loaded.model.as_ref();
        let vocab = model.info().vocab_size;
        let mut seed = 17u32 + bits as u32;
        let mut draw = |n: usize| -> Vec<u32> {
            (0..n)
                .map(|_| {
                    seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                    (seed >> 8) % vocab as u32
                })
                .collect()
        };
        let prompts: Vec<Vec<u32>> = [1, 9, 23, 40].iter().map(|&n| draw(n)).collect();
        // Force every run along the full-precision greedy trajectory.
        let forced: Vec<Vec<u32>> = prompts
            .iter()
            .map(|p| generate(model, None, p, &GenerateOptions { max_tokens: steps, ..Default::default() }, |_| true).unwrap().tokens)
            .collect();
        let serial_q = teacher_forced(model, &prompts, &forced, Some(&kv), false);
        let serial_f = teacher_forced(model, &prompts, &forced, None, false);
        let batched_q = teacher_forced(model, &prompts, &forced, Some(&kv), true);
        let batched_f = teacher_forced(model, &prompts, &forced, None, true);
        let kl_serial_same_start = mean_kl(&serial_q, &serial_f);
        let kl_serial = if start == 0 {
            kl_serial_same_start
        } else {
            let from_first = KvQuantization { start: 0, ..kv };
            mean_kl(&teacher_forced(model, &prompts, &forced, Some(&from_first), false), &serial_f)
        };
        let kl_batched = mean_kl(&batched_q, &batched_f);
        eprintln!("{name} {kv:?}: KL serial {kl_serial_same_start:.3e} (start 0: {kl_serial:.3e}), batched {kl_batched:.3e}");
        assert!(kl_serial > 0.0, "quantization should perturb the distribution");
        assert!(
            kl_batched <= kl_serial * KL_RATIO_TOLERANCE + KL_FLOOR,
            "{name} {kv:?}: batched-quantized KL {kl_batched:.3e} vs serial {kl_serial:.3e}"
        );
        // A batch of one row is the serial computation, bit for bit, at every step.
        for (p, f) in prompts.iter().zip(&forced) {
            let lone = teacher_forced(model, std::slice::from_ref(p), std::slice::from_ref(f), Some(&kv), true);
            let serial = teacher_forced(model, std::slice::from_ref(p), std::slice::from_ref(f), Some(&kv), false);
            for (s, (a, b)) in lone[0].iter().zip(&serial[0]).enumerate() {
                assert_eq!(bit_diffs(a, b), 0, "{name} {kv:?}: {}-token prompt, step {s}", p.len());
            }
        }
    }
}


#[test]
fn engine_batches_quantized_rows_through_joins_evictions_and_prefix_reuse() {
    // Rows of different lengths join, finish at different times (filter), and come back as
    // prefix-cache hits (extract): everything runs on quantized KV without errors, and with
    // 8-bit KV the greedy tokens equal the serial quantized run of each prompt.
    let kv = KvQuantization { bits: 8, group_size: 32, start: 0 };
    let name = "llama-fp32";
    let single = support::load_exact(&tiny_model_dir(name)).unwrap();
    let config = EngineConfig { prompt_cache_bytes: 64 << 20, prefill_step_size: 16, ..kv_config(&kv) };
    let engine = Engine::start(support::load_exact(&tiny_model_dir(name)).unwrap(), config).unwrap();
    let g = golden(name);
    let prompts: Vec<Vec<u32>> = g["single"].as_array().unwrap().iter().take(4).map(|c| ids(&c["prompt_ids"])).collect();
    for round in 0..2 {
        let jobs: Vec<(Vec<u32>, usize)> = prompts.iter().enumerate().map(|(i, p)| (p.clone(), 6 + 4 * i)).collect();
        let streams: Vec<_> = jobs.iter().map(|(p, n)| engine.submit_channel(greedy(p.clone(), *n, 0)).unwrap().1).collect();
        for ((p, n), rx) in jobs.iter().zip(&streams) {
            let (tokens, _) = collect(rx);
            assert_eq!(tokens.len(), *n);
            let opts = GenerateOptions { max_tokens: *n, prefill_step_size: 16, kv_quantization: Some(kv), ..Default::default() };
            let solo = generate(single.model.as_ref(), None, p, &opts, |_| true).unwrap();
            assert_eq!(tokens, solo.tokens, "round {round}: {}-token prompt", p.len());
        }
    }
    let stats = engine.stats();
    assert!(stats.prompt_cache_hits > 0, "{stats:?}");
}

#[test]
fn kv_settings_are_validated_and_budget_counts_quantized_bytes() {
    let loaded = support::load_exact(&tiny_model_dir("llama-fp32")).unwrap();
    let info = loaded.model.info().clone();
    // head_dim 32: group size 64 cannot split it.
    let bad = EngineConfig { kv_bits: Some(4), kv_group_size: 64, ..Default::default() };
    let err = bad.validate_for(&info).unwrap_err().to_string();
    assert!(err.contains("head_dim"), "{err}");
    assert!(EngineConfig { kv_bits: Some(7), kv_group_size: 32, ..Default::default() }.validate().is_err());
    assert!(Engine::start(loaded, bad).is_err());

    // 4-bit, group 32, fp32 scales: per vector of 32 elements 16 bytes of codes + 8 of
    // scale/bias = 24 bytes vs 128 in full precision.
    let q = KvQuantization { bits: 4, group_size: 32, start: 0 };
    let full = info.kv_bytes_per_token();
    let quant = info.kv_bytes_per_token_with(Some(&q));
    assert_eq!(full, 2 * 3 * 2 * 32 * 4);
    assert_eq!(quant, 2 * 3 * 2 * 24);
    // A budget for exactly one full-precision request (storage grows 256 positions at a time)
    // admits 5 quantized ones.
    let budget = full as u64 * 256;
    let config = EngineConfig { kv_budget_bytes: Some(budget), kv_bits: Some(4), kv_group_size: 32, ..Default::default() };
    let engine = Engine::start(support::load_exact(&tiny_model_dir("llama-fp32")).unwrap(), config).unwrap();
    let fits = (budget / (quant as u64 * 256)) as usize;
    assert_eq!(fits, 5);
    let streams: Vec<_> = (0..fits).map(|i| engine.submit_channel(greedy(vec![i as u32 + 1; 10], 10, 0)).unwrap().1).collect();
    for rx in &streams {
        assert_eq!(collect(rx).0.len(), 10);
    }
    // A request too large for the whole budget even quantized is refused at submit.
    let too_big = engine.submit_channel(greedy(vec![1; 1000], 400, 0)).unwrap_err().to_string();
    assert!(too_big.contains(&format!("needs {} bytes", quant * 1536)), "{too_big}");
}
