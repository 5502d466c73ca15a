//! Sampling: parity of the logits processors and the top-p / min-p / top-k filters (the device
//! ops the engine samples with, and their host statement) with mlx-lm (goldens/sampling/, made
//! by goldens/make_sampling_goldens.py), seeded reproducibility, top-k 1 = greedy,
//! temperature-sampling frequencies of the device sampler, and parameter validation.

mod support;

use std::collections::BTreeSet;

use serde_json::Value;
use support::*;
use weft::generate::{generate, FinishReason, GenerateOptions};
use weft::loading::LoadedModel;
use weft::sampling::{draw_rows, filter_logprobs, first_argmax, keep_mask, Sampler, SamplingParams};
use weft::Error;

fn sampling_golden(name: &str) -> Value {
    let path = goldens_dir().join("sampling").join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

fn opt_f32(v: &Value) -> Option<f32> {
    v.as_f64().map(|x| x as f32)
}

/// The processor settings of a processors.json case.
fn processor_params(p: &Value) -> SamplingParams {
    SamplingParams {
        logit_bias: p["logit_bias"]
            .as_array()
            .unwrap()
            .iter()
            .map(|pair| (pair[0].as_u64().unwrap() as u32, pair[1].as_f64().unwrap() as f32))
            .collect(),
        repetition_penalty: opt_f32(&p["repetition_penalty"]),
        presence_penalty: opt_f32(&p["presence_penalty"]),
        frequency_penalty: opt_f32(&p["frequency_penalty"]),
        penalty_context: p["context_size"].as_u64().unwrap() as usize,
        ..SamplingParams::default()
    }
}

fn run(loaded: &LoadedModel, prompt: &[u32], max_tokens: usize, prefill: usize, sampling: SamplingParams) -> Vec<u32> {
    let opts = GenerateOptions { max_tokens, prefill_step_size: prefill, sampling, ..GenerateOptions::default() };
    let out = generate(loaded.model.as_ref(), None, prompt, &opts, |_| true).unwrap();
    assert_eq!(out.finish_reason, FinishReason::Length);
    out.tokens
}

/// Every processors.json case, as (model dir name, case).
fn processor_cases() -> Vec<(String, Value)> {
    let g = sampling_golden("processors");
    let mut cases = Vec::new();
    for m in g["models"].as_array().unwrap() {
        for c in m["cases"].as_array().unwrap() {
            cases.push((m["model"].as_str().unwrap().to_string(), c.clone()));
        }
    }
    cases
}

#[test]
fn processor_trajectories_match_mlx_lm() {
    let g = sampling_golden("processors");
    let mut failures = Vec::new();
    let mut checked = 0;
    for m in g["models"].as_array().unwrap() {
        let name = m["model"].as_str().unwrap();
        let loaded = support::load_exact(&tiny_model_dir(name)).unwrap();
        let cases = m["cases"].as_array().unwrap();
        let differing = cases.iter().filter(|c| c["differs_from_greedy"].as_bool().unwrap()).count();
        assert!(differing * 4 >= cases.len() * 3, "{name}: the goldens barely exercise the processors");
        for case in cases {
            let want = ids(&case["tokens"]);
            let got = run(
                &loaded,
                &ids(&case["prompt_ids"]),
                want.len(),
                case["prefill_step_size"].as_u64().unwrap() as usize,
                processor_params(&case["params"]),
            );
            checked += 1;
            if got != want {
                let at = got.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(0);
                failures.push(format!(
                    "{name} {}: first difference at step {at}\n  weft   {got:?}\n  mlx-lm {want:?}",
                    case["name"].as_str().unwrap()
                ));
            }
        }
    }
    assert!(checked >= 60, "only {checked} processor cases");
    assert!(failures.is_empty(), "{} of {checked} trajectories differ:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn processors_on_a_synthetic_row() {
    // Small exact values, so the expected row is exact in float32.
    let logits = [1.0f32, -2.0, 0.5, 3.0, -0.25, 2.0, 0.0, -1.0];
    let mut s = Sampler::new(SamplingParams {
        // A repeated id accumulates, like mlx-lm's `logits.at[:, ids].add(values)`.
        logit_bias: vec![(0, 1.0), (0, 0.5), (7, -1.0)],
        repetition_penalty: Some(2.0),
        presence_penalty: Some(0.25),
        frequency_penalty: Some(0.5),
        penalty_context: 5,
        ..SamplingParams::default()
    });
    s.observe(&[1, 1]);
    s.observe(&[3, 1, 5, 3]); // window: [1, 3, 1, 5, 3]
    let row = mlx_rs::Array::from_slice(&logits, &[1, 8]);
    let out = s.process_logits(&row).unwrap();
    out.eval().unwrap();
    // bias → [2.5, -2, .5, 3, -.25, 2, 0, -2]; repetition (×2 if < 0, else ÷2) on {1, 3, 5};
    // presence −0.25 once each; frequency −0.5 per occurrence (1 and 3 twice, 5 once).
    let want = [2.5f32, -5.25, 0.5, 0.25, -0.25, 0.25, 0.0, -2.0];
    assert_eq!(out.as_slice::<f32>(), &want);
    let lp = Sampler::logprobs(&out).unwrap();
    lp.eval().unwrap();
    assert_eq!(weft::generate::read_token(&Sampler::argmax(&lp).unwrap()).unwrap(), 0);
}

/// A filter case's kept set as mlx-lm recorded it.
fn golden_kept(case: &Value, v: usize) -> BTreeSet<usize> {
    if let Some(k) = case.get("kept") {
        ids(k).into_iter().map(|i| i as usize).collect()
    } else {
        let dropped: BTreeSet<usize> = ids(&case["dropped"]).into_iter().map(|i| i as usize).collect();
        (0..v).filter(|i| !dropped.contains(i)).collect()
    }
}

fn vector(v: &Value) -> Vec<f32> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().map_or(f32::NEG_INFINITY, |f| f as f32)).collect()
}

/// The kept set of the device filters ([`keep_mask`], what the engine samples with).
fn device_kept(lp: &[f32], params: &SamplingParams) -> BTreeSet<usize> {
    let row = mlx_rs::Array::from_slice(lp, &[1, lp.len() as i32]);
    let mask = keep_mask(&row, params).unwrap();
    mask.eval().unwrap();
    mask.as_slice::<bool>().iter().enumerate().filter(|(_, &k)| k).map(|(i, _)| i).collect()
}

#[test]
fn filters_match_mlx_lm_kept_sets() {
    let g = sampling_golden("filters");
    let vectors = g["vectors"].as_object().unwrap();
    let mut failures = Vec::new();
    let (mut exact, mut tied) = (0, 0);
    for case in g["cases"].as_array().unwrap() {
        let lp = vector(&vectors[case["vector"].as_str().unwrap()]);
        let params = SamplingParams {
            temperature: 1.0,
            top_p: case["top_p"].as_f64().unwrap() as f32,
            min_p: case["min_p"].as_f64().unwrap() as f32,
            top_k: case["top_k"].as_u64().unwrap() as u32,
            ..SamplingParams::default()
        };
        params.validate(lp.len()).unwrap();
        let mask = filter_logprobs(&lp, &params);
        let got: BTreeSet<usize> = (0..lp.len()).filter(|&i| mask[i]).collect();
        let device = device_kept(&lp, &params);
        let want = golden_kept(case, lp.len());
        assert_eq!(want.len() as u64, case["kept_count"].as_u64().unwrap());
        let label = format!(
            "{} top_p={} min_p={} top_k={}",
            case["vector"], params.top_p, params.min_p, params.top_k
        );
        if case["top_k_boundary_tie"].as_bool().unwrap() {
            // Which of the tied boundary entries survive is argpartition's choice: compare the
            // kept values as a multiset.
            tied += 1;
            let values = |s: &BTreeSet<usize>| {
                let mut v: Vec<u32> = s.iter().map(|&i| lp[i].to_bits()).collect();
                v.sort();
                v
            };
            if values(&got) != values(&want) {
                failures.push(format!("{label}: kept values differ ({} vs mlx-lm {})", got.len(), want.len()));
            }
            if device != got {
                failures.push(format!("{label}: device keep_mask {} vs host {} (tie rule)", device.len(), got.len()));
            }
        } else {
            exact += 1;
            if device != want {
                let extra: Vec<_> = device.difference(&want).take(8).collect();
                let missing: Vec<_> = want.difference(&device).take(8).collect();
                failures.push(format!("{label} (device): kept {} vs mlx-lm {}; extra {extra:?} missing {missing:?}", device.len(), want.len()));
            }
            if got != want {
                let extra: Vec<_> = got.difference(&want).take(8).collect();
                let missing: Vec<_> = want.difference(&got).take(8).collect();
                failures.push(format!(
                    "{label}: kept {} vs mlx-lm {}; extra {extra:?} missing {missing:?}",
                    got.len(),
                    want.len()
                ));
            }
        }
    }
    assert!(exact >= 100 && tied >= 5, "too few filter cases ({exact} exact, {tied} with top-k ties)");
    assert!(failures.is_empty(), "{} filter cases differ from mlx-lm:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn filter_edge_cases() {
    let lp = [-1.0f32, -0.5, -0.5, f32::NEG_INFINITY, -3.0];
    let kept = |p: SamplingParams| -> Vec<usize> {
        let m = filter_logprobs(&lp, &p);
        let host: Vec<usize> = (0..lp.len()).filter(|&i| m[i]).collect();
        assert_eq!(device_kept(&lp, &p).into_iter().collect::<Vec<_>>(), host, "device vs host filters, {p:?}");
        host
    };
    let base = SamplingParams { temperature: 1.0, ..SamplingParams::default() };
    // Nothing enabled: everything finite survives.
    assert_eq!(kept(base.clone()), vec![0, 1, 2, 4]);
    // top_k 1 with a tie at the top keeps the first index, as argmax does.
    assert_eq!(kept(SamplingParams { top_k: 1, ..base.clone() }), vec![1]);
    assert_eq!(first_argmax(&lp), 1);
    // top_k >= V disables (mlx-lm would raise); top_k 2 keeps the tied pair.
    assert_eq!(kept(SamplingParams { top_k: 5, ..base.clone() }), vec![0, 1, 2, 4]);
    assert_eq!(kept(SamplingParams { top_k: 2, ..base.clone() }), vec![1, 2]);
    // min_p 1 keeps exactly the entries equal to the max.
    assert_eq!(kept(SamplingParams { min_p: 1.0, ..base.clone() }), vec![1, 2]);
    // A tiny top_p keeps the top value (both tied entries).
    assert_eq!(kept(SamplingParams { top_p: 1e-6, ..base.clone() }), vec![1, 2]);
}

#[test]
fn seeded_sampling_is_reproducible_and_seed_dependent() {
    let loaded = support::load_exact(&tiny_model_dir("llama-fp32")).unwrap();
    let prompt = [5, 17, 3, 250, 11];
    let params = |seed: u64| SamplingParams { temperature: 1.0, seed: Some(seed), ..SamplingParams::default() };
    let a = run(&loaded, &prompt, 48, 2048, params(7));
    let b = run(&loaded, &prompt, 48, 2048, params(7));
    assert_eq!(a, b, "same seed, same tokens");
    let others: Vec<Vec<u32>> = (8..12).map(|s| run(&loaded, &prompt, 48, 2048, params(s))).collect();
    for (i, o) in others.iter().enumerate() {
        assert_ne!(&a, o, "seeds 7 and {} gave the same 48 tokens", 8 + i);
    }
    let greedy = run(&loaded, &prompt, 48, 2048, SamplingParams::default());
    assert_ne!(a, greedy, "temperature 1 sampled exactly the greedy trajectory");

    // With filters and processors too.
    let filtered = |seed| SamplingParams {
        temperature: 0.8,
        top_p: 0.9,
        min_p: 0.02,
        top_k: 40,
        repetition_penalty: Some(1.1),
        seed: Some(seed),
        ..SamplingParams::default()
    };
    let c = run(&loaded, &prompt, 48, 2048, filtered(3));
    assert_eq!(c, run(&loaded, &prompt, 48, 2048, filtered(3)));
    assert_ne!(c, run(&loaded, &prompt, 48, 2048, filtered(4)));

    // The bare sampler: a long stream of draws is a function of the seed.
    let lp = log_softmax(&[1.0, 0.5, 0.0, -0.5, -1.0, 0.25, 0.75, -0.25]);
    let draws = |seed| {
        let mut s = Sampler::new(SamplingParams { temperature: 1.0, seed: Some(seed), ..SamplingParams::default() });
        let row = mlx_rs::Array::from_slice(&lp, &[1, lp.len() as i32]);
        (0..200).map(|_| weft::generate::read_token(&s.choose(&row).unwrap()).unwrap()).collect::<Vec<u32>>()
    };
    assert_eq!(draws(42), draws(42));
    assert_ne!(draws(42), draws(43));
}

#[test]
fn a_batched_draw_equals_each_row_drawn_alone() {
    // The engine draws all sampled rows of a step at once, each with its own settings and key;
    // each row's tokens must be what the row gets alone (per-row filters, per-row noise).
    let params = [
        SamplingParams { temperature: 0.7, top_p: 0.9, seed: Some(1), ..SamplingParams::default() },
        SamplingParams { temperature: 1.3, top_k: 3, seed: Some(2), ..SamplingParams::default() },
        SamplingParams { temperature: 1.0, min_p: 0.1, seed: Some(3), ..SamplingParams::default() },
        SamplingParams { temperature: 2.0, seed: Some(4), ..SamplingParams::default() },
        SamplingParams { temperature: 0.5, top_p: 0.6, top_k: 5, min_p: 0.05, seed: Some(5), ..SamplingParams::default() },
    ];
    let rows: Vec<Vec<f32>> = (0..params.len())
        .map(|r| log_softmax(&(0..12).map(|i| ((i * 7 + r * 3) % 11) as f64 * 0.4 - 1.0).collect::<Vec<_>>()))
        .collect();
    let flat: Vec<f32> = rows.iter().flatten().copied().collect();
    let batch = mlx_rs::Array::from_slice(&flat, &[rows.len() as i32, 12]);
    let mut together: Vec<Sampler> = params.iter().cloned().map(Sampler::new).collect();
    let mut alone: Vec<Sampler> = params.iter().cloned().map(Sampler::new).collect();
    let mut differs = 0;
    for _ in 0..60 {
        let mut refs: Vec<&mut Sampler> = together.iter_mut().collect();
        let t = draw_rows(&batch, &mut refs).unwrap();
        t.eval().unwrap();
        for (r, s) in alone.iter_mut().enumerate() {
            let one = s.choose(&mlx_rs::Array::from_slice(&rows[r], &[1, 12])).unwrap();
            let one = weft::generate::read_token(&one).unwrap();
            assert_eq!(t.as_slice::<u32>()[r], one, "row {r}");
            differs += (one != first_argmax(&rows[r])) as usize;
        }
    }
    assert!(differs > 30, "the draws barely left the argmax ({differs})");
}

#[test]
fn top_k_1_equals_greedy_at_any_temperature() {
    // Plain greedy goldens (bf16 has exact ties: margin 0, first index wins).
    for name in ["llama-fp32", "llama-bf16"] {
        let loaded = support::load_exact(&tiny_model_dir(name)).unwrap();
        let g = golden(name);
        for (i, case) in g["single"].as_array().unwrap().iter().enumerate().take(4) {
            let want = ids(&case["tokens"]);
            for (temperature, seed) in [(0.3, 1), (1.0, 2), (7.5, 3)] {
                let sampling = SamplingParams { temperature, top_k: 1, seed: Some(seed), ..SamplingParams::default() };
                let got = run(&loaded, &ids(&case["prompt_ids"]), want.len(), 2048, sampling);
                assert_eq!(got, want, "{name} case {i}: top_k 1 at temperature {temperature}");
            }
        }
    }
    // Through the processors: top_k 1 at temperature 2 reproduces mlx-lm's processed greedy.
    let mut models: Vec<(String, LoadedModel)> = Vec::new();
    for (name, case) in processor_cases().into_iter().step_by(3) {
        if !models.iter().any(|(n, _)| *n == name) {
            models.push((name.clone(), support::load_exact(&tiny_model_dir(&name)).unwrap()));
        }
        let loaded = &models.iter().find(|(n, _)| *n == name).unwrap().1;
        let want = ids(&case["tokens"]);
        let sampling = SamplingParams {
            temperature: 2.0,
            top_k: 1,
            seed: Some(9),
            ..processor_params(&case["params"])
        };
        let got = run(loaded, &ids(&case["prompt_ids"]), want.len(), case["prefill_step_size"].as_u64().unwrap() as usize, sampling);
        assert_eq!(got, want, "{name} {}: top_k 1 + processors", case["name"]);
    }
}

fn log_softmax(x: &[f64]) -> Vec<f32> {
    let m = x.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let lse = m + x.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
    x.iter().map(|v| (v - lse) as f32).collect()
}

/// Pearson chi-square of `counts` against probabilities `p` (cells with p = 0 must be empty).
fn chi_square(counts: &[u64], p: &[f64]) -> f64 {
    let n: u64 = counts.iter().sum();
    counts
        .iter()
        .zip(p)
        .map(|(&c, &pi)| {
            if pi == 0.0 {
                assert_eq!(c, 0, "a token with probability 0 was drawn");
                0.0
            } else {
                let e = n as f64 * pi;
                (c as f64 - e).powi(2) / e
            }
        })
        .sum()
}

#[test]
fn temperature_sampling_frequencies_follow_softmax() {
    let logits = [2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0, 0.2, 1.2];
    let lp = log_softmax(&logits);
    let n = 40_000;
    // (params, expected distribution); the bound is the 99.99th percentile of chi-square with
    // (support - 1) degrees of freedom, rounded up: the seed is fixed, so this cannot flake,
    // yet a wrong temperature or filter (e.g. T applied twice) lands far above it.
    let target = |t: f64, keep: &dyn Fn(usize) -> bool| -> Vec<f64> {
        let w: Vec<f64> = (0..lp.len()).map(|i| if keep(i) { (lp[i] as f64 / t).exp() } else { 0.0 }).collect();
        let s: f64 = w.iter().sum();
        w.iter().map(|x| x / s).collect()
    };
    let mut order: Vec<usize> = (0..lp.len()).collect();
    order.sort_by(|&a, &b| lp[b].total_cmp(&lp[a]));
    let top3: Vec<usize> = order[..3].to_vec();
    let base = SamplingParams { temperature: 1.0, ..SamplingParams::default() };
    let cases: Vec<(SamplingParams, Vec<f64>, f64)> = vec![
        (SamplingParams { temperature: 1.0, ..base.clone() }, target(1.0, &|_| true), 34.0),
        (SamplingParams { temperature: 0.5, ..base.clone() }, target(0.5, &|_| true), 34.0),
        (SamplingParams { temperature: 2.5, ..base.clone() }, target(2.5, &|_| true), 34.0),
        (SamplingParams { temperature: 0.8, top_k: 3, ..base.clone() }, target(0.8, &|i| top3.contains(&i)), 19.0),
        // min_p 0.2 at T=1: keep p_i >= 0.2 p_max, i.e. logit >= 2 + ln 0.2 = 0.39.
        (SamplingParams { temperature: 1.3, min_p: 0.2, ..base.clone() }, target(1.3, &|i| logits[i] >= 0.39), 25.0),
    ];
    // `n` draws at once: `n` copies of the row through the device sampler (one key, so the
    // noise of every copy is independent).
    let draw = |params: &SamplingParams, seed: u64| -> Vec<u64> {
        let mut s = Sampler::new(SamplingParams { seed: Some(seed), ..params.clone() });
        let rows: Vec<f32> = (0..n).flat_map(|_| lp.iter().copied()).collect();
        let tokens = s.choose(&mlx_rs::Array::from_slice(&rows, &[n as i32, lp.len() as i32])).unwrap();
        tokens.eval().unwrap();
        let mut counts = vec![0u64; lp.len()];
        for &t in tokens.as_slice::<u32>() {
            counts[t as usize] += 1;
        }
        counts
    };
    for (k, (params, p, bound)) in cases.into_iter().enumerate() {
        let counts = draw(&params, 1000 + k as u64);
        let chi2 = chi_square(&counts, &p);
        assert!(
            chi2 < bound,
            "T={} top_k={} min_p={}: chi-square {chi2:.1} >= {bound} (counts {counts:?}, expected {:?})",
            params.temperature,
            params.top_k,
            params.min_p,
            p.iter().map(|x| (x * n as f64).round()).collect::<Vec<_>>()
        );
    }
    // A wrong temperature must fail the same bound (the test has power).
    let counts = draw(&SamplingParams { temperature: 1.0, ..SamplingParams::default() }, 1000);
    assert!(chi_square(&counts, &target(1.2, &|_| true)) > 34.0);
}

#[test]
fn validate_rejects_bad_values_naming_the_field() {
    let vocab = 1024;
    let base = SamplingParams::default();
    let bad: Vec<(SamplingParams, &str)> = vec![
        (SamplingParams { temperature: -0.5, ..base.clone() }, "temperature"),
        (SamplingParams { temperature: f32::NAN, ..base.clone() }, "temperature"),
        (SamplingParams { temperature: f32::INFINITY, ..base.clone() }, "temperature"),
        (SamplingParams { top_p: 0.0, ..base.clone() }, "top_p"),
        (SamplingParams { top_p: 1.01, ..base.clone() }, "top_p"),
        (SamplingParams { top_p: -0.2, ..base.clone() }, "top_p"),
        (SamplingParams { top_p: f32::NAN, ..base.clone() }, "top_p"),
        (SamplingParams { min_p: 1.5, ..base.clone() }, "min_p"),
        (SamplingParams { min_p: -0.1, ..base.clone() }, "min_p"),
        (SamplingParams { min_p: f32::NAN, ..base.clone() }, "min_p"),
        (SamplingParams { logit_bias: vec![(1024, 1.0)], ..base.clone() }, "logit_bias"),
        (SamplingParams { logit_bias: vec![(3, 1.0), (u32::MAX, 1.0)], ..base.clone() }, "logit_bias"),
        (SamplingParams { logit_bias: vec![(3, f32::NAN)], ..base.clone() }, "logit_bias"),
        (SamplingParams { logit_bias: vec![(3, f32::INFINITY)], ..base.clone() }, "logit_bias"),
        (SamplingParams { repetition_penalty: Some(f32::NAN), ..base.clone() }, "repetition_penalty"),
        (SamplingParams { repetition_penalty: Some(-1.0), ..base.clone() }, "repetition_penalty"),
        (SamplingParams { presence_penalty: Some(f32::NAN), ..base.clone() }, "presence_penalty"),
        (SamplingParams { frequency_penalty: Some(f32::INFINITY), ..base.clone() }, "frequency_penalty"),
        (SamplingParams { repetition_penalty: Some(1.2), penalty_context: 0, ..base.clone() }, "penalty_context"),
    ];
    for (p, field) in &bad {
        match p.validate(vocab) {
            // A structured field error: the key, and a message that names it too.
            Err(Error::Field { key, message }) => {
                assert_eq!(key, *field);
                assert!(message.contains(field), "{field}: message {message:?} does not name it");
            }
            other => panic!("{field}: {p:?} was not rejected ({other:?})"),
        }
    }
    let good = [
        base.clone(),
        SamplingParams { temperature: 0.7, top_p: 1.0, min_p: 1.0, top_k: 5000, ..base.clone() },
        SamplingParams { top_p: 1e-6, min_p: 0.0, ..base.clone() },
        SamplingParams { logit_bias: vec![(1023, -100.0), (0, f32::NEG_INFINITY)], ..base.clone() },
        SamplingParams { presence_penalty: Some(-0.5), frequency_penalty: Some(0.0), ..base.clone() },
        SamplingParams { penalty_context: 0, ..base.clone() }, // no penalty set: irrelevant
    ];
    for p in &good {
        p.validate(vocab).unwrap_or_else(|e| panic!("{p:?} rejected: {e}"));
    }
    // generate() refuses them before running anything.
    let loaded = support::load_exact(&tiny_model_dir("llama-fp32")).unwrap();
    let opts = GenerateOptions { sampling: bad[3].0.clone(), max_tokens: 4, ..GenerateOptions::default() };
    match generate(loaded.model.as_ref(), None, &[1, 2, 3], &opts, |_| true) {
        Err(e @ Error::Field { .. }) => assert_eq!(e.field_key(), Some("top_p"), "{e}"),
        other => panic!("generate accepted top_p 0: {:?}", other.map(|g| g.tokens)),
    }
}
