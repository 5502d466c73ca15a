//! Single-sequence parity with mlx-lm: greedy trajectories and first-step logits of every tiny
//! golden model, and the default model's chat goldens (tokenization, template, tokens, logits).

mod support;

use support::*;
use weft::generate::{generate, FinishReason, GenerateOptions};

use weft::tokenizer::ChatMessage;

#[test]
fn tiny_models_match_mlx_lm_trajectories_and_first_logits() {
    for name in TINY_MODELS {
        let g = golden(name);
        let loaded = support::load_exact(&tiny_model_dir(name)).unwrap();
        assert_single_cases_exact(name, loaded.model.as_ref(), &g);
    }
}

/// The exact options with the decode step's elementwise chains compiled (SwiGLU / GeGLU as
/// one MLX-compiled kernel each, `LoadOptions::compile`): the same bits as op by op.
pub fn compiled_exact_options() -> weft::loading::LoadOptions {
    weft::loading::LoadOptions { compile: Some(true), ..support::exact_options() }
}

#[test]
fn tiny_models_match_mlx_lm_with_compiled_chains() {
    for name in TINY_MODELS {
        let g = golden(name);
        let loaded = weft::loading::load_with(&tiny_model_dir(name), &compiled_exact_options()).unwrap();
        assert!(loaded.numerics.contains("compile=true"), "{}", loaded.numerics);
        assert_single_cases_exact(name, loaded.model.as_ref(), &g);
    }
}

#[test]
fn batch_goldens_hold_through_the_engine_with_compiled_chains() {
    // The engine's driver thread traces the compiled chains in its own compile cache.
    for name in ["llama-bf16", "llama-4bit", "qwen3"] {
        let load = || weft::loading::load_with(&tiny_model_dir(name), &compiled_exact_options()).unwrap();
        let single = load();
        let engine = weft::engine::Engine::start(load(), weft::engine::EngineConfig::default()).unwrap();
        assert_batch_goldens(name, &engine, single.model.as_ref(), &golden(name), |r| ids(&r["tokens"]), 1e-5);
    }
}

#[test]
fn generation_stops_at_eos_from_generation_config() {
    // llama-fp32's generation_config.json lists eos [2, 5]; config.json says 2.
    let loaded = support::load_exact(&tiny_model_dir("llama-fp32")).unwrap();
    assert_eq!(loaded.eos_token_ids, vec![2, 5]);
    let g = golden("llama-fp32");
    for case in g["single"].as_array().unwrap() {
        let want = ids(&case["tokens"]);
        let Some(cut) = want.iter().position(|t| loaded.eos_token_ids.contains(t)) else { continue };
        let opts = GenerateOptions {
            max_tokens: want.len(),
            stop_token_ids: loaded.eos_token_ids.clone(),
            ..GenerateOptions::default()
        };
        let out = generate(loaded.model.as_ref(), None, &ids(&case["prompt_ids"]), &opts, |_| true).unwrap();
        assert_eq!(out.tokens, want[..cut]);
        assert_eq!(out.finish_reason, FinishReason::Stop);
        return;
    }
    panic!("no llama-fp32 golden trajectory contains an EOS id; the test would be vacuous");
}

#[test]
fn cancelling_from_the_token_callback_stops_generation() {
    let loaded = support::load_exact(&tiny_model_dir("qwen3")).unwrap();
    let opts = GenerateOptions { max_tokens: 20, ..GenerateOptions::default() };
    let mut seen = 0;
    let out = generate(loaded.model.as_ref(), None, &[1, 2, 3], &opts, |_| {
        seen += 1;
        seen < 3
    })
    .unwrap();
    assert_eq!(out.tokens.len(), 3);
    assert_eq!(out.finish_reason, FinishReason::Cancelled);
}

#[test]
fn default_model_chats_match_mlx_lm() {
    let Some(path) = default_model() else { return };
    default_model_chats_match_mlx_lm_with(&support::exact_options(), &path);
}

#[test]
fn default_model_chats_match_mlx_lm_with_compiled_chains() {
    let Some(path) = default_model() else { return };
    default_model_chats_match_mlx_lm_with(&compiled_exact_options(), &path);
}

fn default_model_chats_match_mlx_lm_with(options: &weft::loading::LoadOptions, path: &std::path::Path) {
    let loaded = weft::loading::load_with(path, options).unwrap();
    let tok = loaded.tokenizer.as_ref().expect("the GGUF carries a tokenizer");
    let g = golden("smollm2");
    assert_eq!(loaded.eos_token_ids, vec![2]);
    for chat in g["chats"].as_array().unwrap() {
        let messages: Vec<ChatMessage> = serde_json::from_value(chat["messages"].clone()).unwrap();
        let text = tok.chat_template().unwrap().render(&messages, true).unwrap();
        assert_eq!(text, chat["prompt_text"].as_str().unwrap());
        let prompt = tok.apply_chat_template(&messages, true).unwrap();
        assert_eq!(prompt, ids(&chat["prompt_ids"]));

        let want = ids(&chat["tokens"]);
        let opts = GenerateOptions {
            max_tokens: 48,
            stop_token_ids: loaded.eos_token_ids.clone(),
            capture_first_logits: 64,
            ..GenerateOptions::default()
        };
        let mut streamed = String::new();
        let out = generate(loaded.model.as_ref(), Some(tok), &prompt, &opts, |ev| {
            streamed.push_str(ev.text);
            true
        })
        .unwrap();
        assert_eq!(out.tokens, want, "chat {:?}", messages.last().unwrap().content);
        assert_eq!(out.finish_reason.as_str(), chat["finish_reason"].as_str().unwrap());
        assert_eq!(out.text, chat["text"].as_str().unwrap());
        assert!(out.text.starts_with(&streamed));
        let logits = floats(&chat["first_logits"]);
        assert_eq!(out.first_logits, logits, "first-step logits");
    }
    let first = &g["chats"][0];
    assert!(first["text"].as_str().unwrap().contains("Paris"));
}
