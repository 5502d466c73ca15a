//! Bad model files and bad prompts give clear errors that name the problem — never a panic.

mod support;

use serde_json::json;
use support::*;
use weft::generate::{generate, GenerateOptions};
use weft::{loading, Error};

fn load_err(dir: &std::path::Path) -> Error {
    match support::load_exact(dir) {
        Ok(_) => panic!("{} loaded but should not have", dir.display()),
        Err(e) => e,
    }
}

#[test]
fn missing_path_is_reported() {
    let e = load_err(std::path::Path::new("/nonexistent/weft-model"));
    assert!(matches!(e, Error::ModelLoad(_)), "{e}");
    assert!(e.to_string().contains("/nonexistent/weft-model"), "{e}");
}

#[test]
fn directory_without_config_is_reported() {
    let tmp = tempfile::tempdir().unwrap();
    let e = load_err(tmp.path());
    assert!(e.to_string().contains("config.json"), "{e}");
}

#[test]
fn malformed_config_is_reported() {
    let tmp = copy_model("llama-fp32");
    std::fs::write(tmp.path().join("config.json"), "{ \"model_type\": \"llama\", ").unwrap();
    let e = load_err(tmp.path());
    assert!(e.to_string().contains("config.json is not valid JSON"), "{e}");
}

#[test]
fn unknown_model_type_names_it() {
    let tmp = copy_model("llama-fp32");
    edit_config(tmp.path(), |c| c["model_type"] = json!("transmogrifier"));
    let e = load_err(tmp.path());
    assert!(matches!(e, Error::Unsupported(_)), "{e}");
    assert!(e.to_string().contains("transmogrifier"), "{e}");
}

#[test]
fn wrong_typed_config_value_names_the_key() {
    let tmp = copy_model("llama-fp32");
    edit_config(tmp.path(), |c| c["hidden_size"] = json!("big"));
    let e = load_err(tmp.path());
    assert!(e.to_string().contains("hidden_size"), "{e}");
}

#[test]
fn unsupported_rope_scaling_names_the_kind() {
    let tmp = copy_model("llama-fp32");
    // (longrope and the other mlx-lm kinds load: tests/rope_scaling.rs.)
    edit_config(tmp.path(), |c| c["rope_scaling"] = json!({"rope_type": "ntk-by-parts", "factor": 2.0}));
    let e = load_err(tmp.path());
    assert!(matches!(e, Error::Unsupported(_)), "{e}");
    assert!(e.to_string().contains("ntk-by-parts"), "{e}");
}

#[test]
fn missing_tensor_is_named() {
    let tmp = copy_model("llama-fp32");
    let layers = golden("llama-fp32")["config"]["num_hidden_layers"].as_u64().unwrap();
    edit_config(tmp.path(), |c| c["num_hidden_layers"] = json!(layers + 1));
    let e = load_err(tmp.path());
    assert!(e.to_string().contains(&format!("model.layers.{layers}.")), "{e}");
    assert!(e.to_string().contains("missing tensor"), "{e}");
}

#[test]
fn unexpected_tensors_are_reported() {
    let tmp = copy_model("llama-fp32");
    edit_config(tmp.path(), |c| {
        let n = c["num_hidden_layers"].as_u64().unwrap();
        c["num_hidden_layers"] = json!(n - 1);
    });
    let e = load_err(tmp.path());
    assert!(e.to_string().contains("unexpected tensor"), "{e}");
}

#[test]
fn shape_mismatch_names_tensor_and_shapes() {
    let tmp = copy_model("llama-fp32");
    edit_config(tmp.path(), |c| {
        let n = c["intermediate_size"].as_u64().unwrap();
        c["intermediate_size"] = json!(n * 2);
    });
    let e = load_err(tmp.path());
    let msg = e.to_string();
    assert!(msg.contains("mlp.gate_proj.weight") && msg.contains("shape"), "{msg}");
}

#[test]
fn quantized_weights_without_quantization_config_are_reported() {
    let tmp = copy_model("llama-4bit");
    edit_config(tmp.path(), |c| {
        let o = c.as_object_mut().unwrap();
        o.remove("quantization");
        o.remove("quantization_config");
    });
    let e = load_err(tmp.path());
    assert!(e.to_string().contains("quantization"), "{e}");
}

#[test]
fn corrupt_safetensors_is_reported() {
    let tmp = copy_model("llama-fp32");
    let file = tmp.path().join("model.safetensors");
    let bytes = std::fs::read(&file).unwrap();
    std::fs::write(&file, &bytes[..bytes.len() / 2]).unwrap();
    let e = load_err(tmp.path());
    assert!(e.to_string().contains("model.safetensors"), "{e}");

    std::fs::write(&file, b"garbage that is not a safetensors header").unwrap();
    let e = load_err(tmp.path());
    assert!(e.to_string().contains("not a valid safetensors file"), "{e}");
}

#[test]
fn missing_shard_is_reported() {
    let tmp = copy_model("qwen3");
    std::fs::remove_file(tmp.path().join("model-00002-of-00004.safetensors")).unwrap();
    let e = load_err(tmp.path());
    assert!(e.to_string().contains("model-00002-of-00004.safetensors"), "{e}");
}

#[test]
fn bad_prompts_are_rejected_before_any_work() {
    let loaded = support::load_exact(&tiny_model_dir("llama-fp32")).unwrap();
    let model = loaded.model.as_ref();
    let vocab = model.info().vocab_size as u32;
    let opts = GenerateOptions { max_tokens: 4, ..GenerateOptions::default() };
    let run = |prompt: &[u32]| generate(model, None, prompt, &opts, |_| true).unwrap_err().to_string();
    assert!(run(&[]).contains("empty"));
    assert!(run(&[1, vocab]).contains(&format!("token id {vocab} is outside the vocabulary")));
}

#[test]
fn prompt_longer_than_the_context_is_rejected() {
    let tmp = copy_model("llama-fp32");
    edit_config(tmp.path(), |c| c["max_position_embeddings"] = json!(8));
    let loaded = support::load_exact(tmp.path()).unwrap();
    let opts = GenerateOptions { max_tokens: 4, ..GenerateOptions::default() };
    let e = generate(loaded.model.as_ref(), None, &[1; 9], &opts, |_| true).unwrap_err();
    assert!(e.to_string().contains("context of 8"), "{e}");
    // A prompt exactly at the context leaves no room for a token (issue 27).
    let e = generate(loaded.model.as_ref(), None, &[1; 8], &opts, |_| true).unwrap_err();
    assert!(matches!(e, Error::InvalidRequest(_)) && e.to_string().contains("context of 8 leaves no room"), "{e}");
    // Within the context, generation stops at the limit with "length".
    let out = generate(loaded.model.as_ref(), None, &[1; 6], &opts, |_| true).unwrap();
    assert_eq!(out.tokens.len(), 2);
    let out = generate(loaded.model.as_ref(), None, &[1; 7], &opts, |_| true).unwrap();
    assert_eq!(out.tokens.len(), 1);
}

/// issue 27: through the engine, a prompt at the context is refused at submit and one a token
/// shorter ends with "length" after one token: prompt + completion never pass the context.
#[test]
fn engine_prompts_never_run_past_the_context() {
    use weft::engine::{Engine, EngineConfig};
    use weft::generate::FinishReason;
    let tmp = copy_model("llama-fp32");
    edit_config(tmp.path(), |c| c["max_position_embeddings"] = json!(8));
    let engine = Engine::start(loading::load(tmp.path()).unwrap(), EngineConfig::default()).unwrap();
    match engine.submit_channel(greedy(vec![1; 8], 4)) {
        Err(Error::InvalidRequest(m)) => assert!(m.contains("context of 8"), "{m}"),
        other => panic!("{:?}", other.map(|_| ())),
    }
    for len in 1..8 {
        let out = collect(&engine.submit_channel(greedy(vec![1; len], 16)).unwrap().1);
        assert_eq!(out.error, None);
        assert_eq!(out.finish, Some(FinishReason::Length), "{len}-token prompt");
        assert_eq!(out.usage.prompt_tokens + out.usage.completion_tokens, 8, "{len}-token prompt: total tokens");
    }
}

#[test]
fn stop_strings_without_a_tokenizer_are_rejected() {
    let loaded = support::load_exact(&tiny_model_dir("llama-fp32")).unwrap();
    let opts = GenerateOptions { stop_strings: vec!["x".into()], ..GenerateOptions::default() };
    let e = generate(loaded.model.as_ref(), None, &[1, 2], &opts, |_| true).unwrap_err();
    assert!(e.to_string().contains("tokenizer"), "{e}");
}
