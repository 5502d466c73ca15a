//! Architectures from mlx-lm 0.32.2 (granite, minicpm, smollm3, phi3, ministral3 and the
//! mistral3 text path on the shared dense decoder; gemma2 with soft-capped attention;
//! gemma4_text with KV-shared layers and per-layer inputs, and the 26B-A4B MoE block with
//! float32 and 4-bit experts), against goldens/make_arch_goldens.py: single-sequence trajectories with
//! bit-equal first-step logits, batch_generate B=2/B=4 and BatchGenerator join/evict
//! schedules (plain and chunked prefill) through the engine, and config errors. gemma2's
//! batch references are single-sequence trajectories (mlx-lm's batched gemma2 mis-broadcasts
//! the mask under grouped-query attention; see the goldens script).

mod support;

use serde_json::{json, Value};
use support::*;
use weft::engine::{Engine, EngineConfig};

/// Golden name = model dir.
const ARCHS: &[&str] = &[
    "granite",
    "minicpm",
    "smollm3",
    "phi3",
    "gemma2",
    "ministral3",
    "mistral3",
    "gemma4_text",
    "gemma4_text-kv",
    "gemma4_text-moe",
    "gemma4_text-moe-4bit",
];

#[test]
fn single_sequence_tokens_and_first_logits_are_exact() {
    for name in ARCHS {
        let g = golden(name);
        let loaded = support::load_exact(&tiny_model_dir(name)).unwrap();
        // mistral3 is a wrapper: its text model is a ministral3.
        let want_type = match *name {
            "mistral3" => "ministral3",
            "gemma4_text-kv" | "gemma4_text-moe" | "gemma4_text-moe-4bit" => "gemma4_text",
            other => other,
        };
        assert_eq!(loaded.model.info().model_type, want_type);
        assert_single_cases_exact(name, loaded.model.as_ref(), &g);
    }
}

#[test]
fn single_sequence_goldens_hold_with_compiled_chains() {
    // SwiGLU / GeGLU (dense and the MoE experts') as MLX-compiled kernels: the same bits.
    for name in ARCHS {
        let opts = weft::loading::LoadOptions { compile: Some(true), ..support::exact_options() };
        let loaded = weft::loading::load_with(&tiny_model_dir(name), &opts).unwrap();
        assert_single_cases_exact(name, loaded.model.as_ref(), &golden(name));
    }
}

#[test]
fn batch_generate_goldens_match_through_the_engine() {
    for name in ARCHS {
        let g = golden(name);
        let single = support::load_exact(&tiny_model_dir(name)).unwrap();
        let engine = Engine::start(support::load_exact(&tiny_model_dir(name)).unwrap(), EngineConfig::default()).unwrap();
        // gemma4_text: mlx-lm's own batched first logprobs differ from its single-sequence
        // ones by up to 1.2e-5 on these prompts (left padding changes the attention sums);
        // gemma4_batch_first_logprobs_equal_mlx_lm_batched checks Weft's against mlx-lm's.
        let tolerance = if name.starts_with("gemma4") { 2e-5 } else { 1e-5 };
        assert_batch_goldens(name, &engine, single.model.as_ref(), &g, |r| ids(&r["tokens"]), tolerance);
    }
}

#[test]
fn continuous_schedules_match_batch_generator() {
    for name in ARCHS {
        let g = golden(name);
        for key in ["schedule", "schedule_chunked"] {
            assert_schedule_exact(name, &g, key);
        }
    }
}


#[test]
fn smollm3_nope_layers_follow_the_explicit_list() {
    let want = ids(&golden("smollm3")["single"][2]["tokens"]);
    // The interval-2 default written out as a list gives the same model...
    assert_eq!(tokens_with("smollm3", |v| v["no_rope_layers"] = json!([1, 0, 1, 0])).unwrap(), want);
    // ...and RoPE on every layer gives another one.
    assert_ne!(tokens_with("smollm3", |v| v["no_rope_layers"] = json!([1, 1, 1, 1])).unwrap(), want);
    let err = tokens_with("smollm3", |v| v["no_rope_layers"] = json!([1, 0])).unwrap_err();
    assert!(err.contains("no_rope_layers"), "{err}");
}

#[test]
fn missing_multipliers_fail_at_load_naming_them() {
    for (dir, key) in [("granite", "logits_scaling"), ("granite", "attention_multiplier"), ("minicpm", "scale_depth"), ("minicpm", "dim_model_base")] {
        let err = tokens_with(dir, |v| {
            v.as_object_mut().unwrap().remove(key);
        })
        .unwrap_err();
        assert!(err.contains(key), "{dir} without {key}: {err}");
    }
}

#[test]
fn gemma2_soft_caps_change_the_model() {
    let want = ids(&golden("gemma2")["single"][2]["tokens"]);
    assert_eq!(tokens_with("gemma2", |_| {}).unwrap(), want);
    assert_ne!(tokens_with("gemma2", |v| v["attn_logit_softcapping"] = json!(1e6)).unwrap(), want);
    // The final cap is monotonic (greedy tokens keep), so look at the logits.
    use weft::generate::{generate, GenerateOptions};
    let case = &golden("gemma2")["single"][2];
    let tmp = copy_model("gemma2");
    edit_config(tmp.path(), |v| v["final_logit_softcapping"] = json!(1e6));
    let loaded = support::load_exact(tmp.path()).unwrap();
    let opts = GenerateOptions { max_tokens: 1, capture_first_logits: 256, ..Default::default() };
    let out = generate(loaded.model.as_ref(), None, &ids(&case["prompt_ids"]), &opts, |_| true).unwrap();
    assert!(bit_diffs(&out.first_logits, &floats(&case["first_logits"])) > 200);
    let err = tokens_with("gemma2", |v| v["hidden_activation"] = json!("relu")).unwrap_err();
    assert!(err.contains("hidden_activation"), "{err}");
}

#[test]
fn phi3_rope_options_are_read_or_refused() {
    let want = ids(&golden("phi3")["single"][2]["tokens"]);
    // longrope is what the trajectory depends on; "su" is its older name.
    assert_eq!(tokens_with("phi3", |v| v["rope_scaling"]["type"] = json!("su")).unwrap(), want);
    assert_ne!(tokens_with("phi3", |v| v["rope_scaling"] = Value::Null).unwrap(), want);
    let cases: Vec<(Box<dyn Fn(&mut Value)>, &str)> = vec![
        (Box::new(|v: &mut Value| v["rope_scaling"]["type"] = json!("yarn")), "\"yarn\""),
        (Box::new(|v: &mut Value| { v["rope_scaling"].as_object_mut().unwrap().remove("long_factor"); }), "long_factor"),
        (Box::new(|v: &mut Value| v["rope_scaling"]["long_factor"] = json!([1.0, 2.0])), "long_factor"),
        (Box::new(|v: &mut Value| v["partial_rotary_factor"] = json!(0.1)), "partial_rotary_factor"),
    ];
    for (edit, needle) in cases {
        let err = tokens_with("phi3", |v| edit(v)).unwrap_err();
        assert!(err.contains(needle), "{needle}: {err}");
    }
}

type Tensors = std::collections::HashMap<String, mlx_rs::Array>;

/// A copy of tiny model `name` whose single safetensors file is rewritten by `edit` (another
/// checkpoint layout of the same weights).
fn relaid_model(name: &str, edit: impl FnOnce(Tensors) -> Tensors) -> tempfile::TempDir {
    let tmp = copy_model(name);
    let _ = std::fs::remove_file(tmp.path().join("model.safetensors.index.json"));
    let path = tmp.path().join("model.safetensors");
    let tensors = edit(mlx_rs::Array::load_safetensors(&path).unwrap());
    // Arrays load lazily from `path`: write elsewhere, then replace it.
    let out = tmp.path().join("renamed.safetensors");
    mlx_rs::Array::save_safetensors(&tensors, None::<&std::collections::HashMap<String, String>>, &out).unwrap();
    drop(tensors);
    std::fs::rename(&out, &path).unwrap();
    tmp
}

#[test]
fn ministral3_query_scaling_and_mistral3_layouts() {
    let want = ids(&golden("ministral3")["single"][2]["tokens"]);
    // beta 0 turns the position scaling off, and the trajectory changes.
    assert_ne!(tokens_with("ministral3", |v| v["rope_parameters"]["llama_4_scaling_beta"] = json!(0.0)).unwrap(), want);
    let err = tokens_with("ministral3", |v| {
        v["rope_parameters"].as_object_mut().unwrap().remove("llama_4_scaling_beta");
    })
    .unwrap_err();
    assert!(err.contains("llama_4_scaling_beta"), "{err}");
    // Hugging Face's layout of a mistral3 checkpoint (model.language_model.*, lm_head.weight,
    // a vision tower) loads the same model as mlx-lm's (language_model.*).
    let tmp = relaid_model("mistral3", |tensors| {
        tensors
            .into_iter()
            .map(|(k, v)| {
                let k = match k.strip_prefix("language_model.model.") {
                    Some(rest) => format!("model.language_model.{rest}"),
                    None => k.strip_prefix("language_model.").unwrap().to_string(),
                };
                (k, v)
            })
            .chain([("model.vision_tower.patch_conv.weight".to_string(), mlx_rs::Array::from_slice(&[0f32; 4], &[2, 2]))])
            .collect()
    });
    let loaded = support::load_exact(tmp.path()).unwrap();
    assert_single_cases_exact("mistral3 (Hugging Face layout)", loaded.model.as_ref(), &golden("mistral3"));
}

#[test]
fn granite_minicpm_phi3_and_gemma2_gguf_files_load_the_same_models() {
    // goldens/make_arch_gguf_goldens.py: llama.cpp's layout of the same F32 weights, so the
    // safetensors goldens (mlx-lm on those weights) apply bit for bit. phi3's longrope factors
    // and partial rotary come from the GGUF (tensors and metadata).
    // gemma2's norms arrive as llama.cpp's 1 + w, its caps and key length from the metadata;
    // its golden model has query_pre_attn_scalar = head_dim, which llama.cpp assumes.
    for (name, golden_name) in [("granite", "granite"), ("minicpm", "minicpm"), ("phi3", "phi3"), ("gemma2", "gemma2-gguf")] {
        let path = goldens_dir().join("gguf").join(format!("{name}-f32.gguf"));
        let loaded = support::load_exact(&path).unwrap();
        assert_eq!(loaded.model.info().model_type, name);
        assert_single_cases_exact(&format!("{name} (GGUF)"), loaded.model.as_ref(), &golden(golden_name));
    }
    // The safetensors form of gemma2-gguf matches its goldens too (it is not in ARCHS).
    let loaded = support::load_exact(&tiny_model_dir("gemma2-gguf")).unwrap();
    assert_single_cases_exact("gemma2-gguf", loaded.model.as_ref(), &golden("gemma2-gguf"));
}

/// The batch goldens' first-step logprobs as mlx-lm's BatchGenerator computed them, against
/// the engine's batched first logits turned into logprobs the same way (MLX ops).
#[test]
fn gemma4_batch_first_logprobs_equal_mlx_lm_batched() {
    for name in ["gemma4_text", "gemma4_text-kv", "gemma4_text-moe", "gemma4_text-moe-4bit"] {
        let g = golden(name);
        let engine = Engine::start(support::load_exact(&tiny_model_dir(name)).unwrap(), EngineConfig::default()).unwrap();
        for batch in g["batch"].as_array().unwrap() {
            let rows = batch["rows"].as_array().unwrap();
            let streams: Vec<_> = rows
                .iter()
                .map(|r| {
                    let mut req = greedy(ids(&r["prompt_ids"]), r["max_tokens"].as_u64().unwrap() as usize);
                    req.capture_first_logits = 256;
                    engine.submit_channel(req).unwrap().1
                })
                .collect();
            for (r, rx) in rows.iter().zip(&streams) {
                let out = collect(rx);
                assert_eq!(out.tokens, ids(&r["tokens"]));
                let logits = mlx_rs::Array::from_slice(&out.first_logits, &[1, 256]);
                let lse = mlx_rs::ops::logsumexp_axis(&logits, -1, true).unwrap();
                let lp = logits.subtract(&lse).unwrap();
                let want = floats(&r["first_logprobs"]);
                let worst = lp.as_slice::<f32>().iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
                assert!(worst <= 1e-6, "{name}, batch of {}: first logprobs differ from mlx-lm's batched ones by {worst}", rows.len());
            }
        }
    }
}

#[test]
fn gemma4_caches_only_the_layers_that_own_keys_and_values() {
    let loaded = support::load_exact(&tiny_model_dir("gemma4_text")).unwrap();
    // Layers [S, S, F | S, S, F]: the last three read layers 1, 1 and 2's keys.
    assert_eq!(loaded.model.make_caches().len(), 3);
    let info = loaded.model.info();
    assert_eq!((info.num_layers, info.head_dim), (3, 32));
    let sw = info.sliding_window.expect("sliding layers");
    assert_eq!((sw.layers, sw.window), (2, 8));
    // Reusing a finished row's caches (exact prefix, and before the rings wrap) keeps tokens.
    let case = &golden("gemma4_text")["single"][1];
    let (prompt, want) = (ids(&case["prompt_ids"]), ids(&case["tokens"]));
    let engine = Engine::start(loaded, EngineConfig { prompt_cache_bytes: 64 << 20, ..Default::default() }).unwrap();
    let a = collect(&engine.submit_channel(greedy(prompt.clone(), 2)).unwrap().1);
    assert_eq!(a.tokens, want[..2]);
    let mut extended = prompt.clone();
    extended.extend_from_slice(&want[..2]);
    let b = collect(&engine.submit_channel(greedy(extended, 12)).unwrap().1);
    assert!(b.usage.cached_tokens > 0, "the prefix is reused");
    assert_eq!(b.tokens, want[2..14]);
    let c = collect(&engine.submit_channel(greedy(prompt, 8)).unwrap().1);
    assert_eq!(c.tokens, want[..8]);
}

#[test]
fn gemma4_refuses_a_quantized_kv_cache_and_unsupported_options() {
    let dir = tiny_model_dir("gemma4_text");
    let config = || EngineConfig { kv_bits: Some(8), kv_group_size: 32, ..Default::default() };
    let err = Engine::start(support::load_exact(&dir).unwrap(), config()).err().expect("kv_bits refused").to_string();
    assert!(err.contains("kv_bits") && err.contains("KV-shared"), "{err}");
    use weft::generate::{generate, GenerateOptions};
    let loaded = support::load_exact(&dir).unwrap();
    let opts = GenerateOptions {
        kv_quantization: weft::cache::KvQuantization::from_options(Some(4), 32, 0),
        ..Default::default()
    };
    let err = generate(loaded.model.as_ref(), None, &[3, 4], &opts, |_| true).unwrap_err().to_string();
    assert!(err.contains("kv_bits"), "{err}");
    // Without KV sharing (the 31B shape) the full layers' caches quantize as in any model.
    let engine = Engine::start(support::load_exact(&tiny_model_dir("gemma4_text-kv")).unwrap(), config()).unwrap();
    let out = collect(&engine.submit_channel(greedy(vec![5; 12], 6)).unwrap().1);
    assert_eq!((out.error, out.tokens.len()), (None, 6));
    let cases: Vec<(Box<dyn Fn(&mut Value)>, &str)> = vec![
        (Box::new(|v: &mut Value| v["enable_moe_block"] = json!(true)), "enable_moe_block"),
        (Box::new(|v: &mut Value| v["layer_types"] = json!(vec!["full_attention"; 2])), "layer_types"),
        (Box::new(|v: &mut Value| v["layer_types"] = json!(vec!["chunked_attention"; 6])), "chunked_attention"),
        (Box::new(|v: &mut Value| v["hidden_activation"] = json!("relu")), "hidden_activation"),
        (Box::new(|v: &mut Value| v["num_kv_shared_layers"] = json!(6)), "num_kv_shared_layers"),
        (Box::new(|v: &mut Value| v["rope_parameters"]["full_attention"]["rope_type"] = json!("ntk")), "\"ntk\""),
    ];
    for (edit, needle) in cases {
        let err = tokens_with("gemma4_text", |v| edit(v)).unwrap_err();
        assert!(err.contains(needle), "{needle}: {err}");
    }
}

#[test]
fn gemma4_options_the_trajectories_depend_on() {
    let want = ids(&golden("gemma4_text")["single"][2]["tokens"]);
    assert_eq!(tokens_with("gemma4_text", |_| {}).unwrap(), want);
    // The full layers' proportional RoPE rotates a quarter of each head; all of it is another model.
    assert_ne!(
        tokens_with("gemma4_text", |v| v["rope_parameters"]["full_attention"]["partial_rotary_factor"] = json!(1.0)).unwrap(),
        want
    );
    // null per-layer input size means none (mlx-lm tests it for truth), as 0 does.
    let want_kv = ids(&golden("gemma4_text-kv")["single"][2]["tokens"]);
    assert_eq!(tokens_with("gemma4_text-kv", |v| v["hidden_size_per_layer_input"] = Value::Null).unwrap(), want_kv);
    // The sliding window of 8 matters on this 17-token prompt.
    assert_ne!(tokens_with("gemma4_text", |v| v["sliding_window"] = json!(64)).unwrap(), want);
    // The softcap (10) is monotonic, so look at the logits without it.
    use weft::generate::{generate, GenerateOptions};
    let case = &golden("gemma4_text")["single"][2];
    let tmp = copy_model("gemma4_text");
    edit_config(tmp.path(), |v| v["final_logit_softcapping"] = Value::Null);
    let loaded = support::load_exact(tmp.path()).unwrap();
    let opts = GenerateOptions { max_tokens: 1, capture_first_logits: 256, ..Default::default() };
    let out = generate(loaded.model.as_ref(), None, &ids(&case["prompt_ids"]), &opts, |_| true).unwrap();
    assert!(bit_diffs(&out.first_logits, &floats(&case["first_logits"])) > 200);
}

#[test]
fn gemma4_multimodal_form_and_hugging_face_layout_load_the_text_model() {
    // A gemma4 checkpoint: the text config under text_config, tensors under
    // model.language_model.* (Hugging Face) beside a vision tower, which is dropped.
    let tmp = relaid_model("gemma4_text", |tensors| {
        tensors
            .into_iter()
            .map(|(k, v)| (format!("model.language_model.{}", k.strip_prefix("model.").unwrap()), v))
            .chain([("model.vision_tower.patch.weight".to_string(), mlx_rs::Array::from_slice(&[0f32; 4], &[2, 2]))])
            .collect()
    });
    edit_config(tmp.path(), |v| {
        let text = v.clone();
        *v = json!({"model_type": "gemma4", "text_config": text, "vocab_size": text["vocab_size"]});
    });
    let loaded = support::load_exact(tmp.path()).unwrap();
    assert_eq!(loaded.model.info().model_type, "gemma4_text");
    assert_single_cases_exact("gemma4 (Hugging Face layout)", loaded.model.as_ref(), &golden("gemma4_text"));
}

#[test]
fn gemma4_moe_experts_in_hugging_face_layout_load_the_same_model() {
    // Hugging Face stores each layer's experts as one `[E, 2I, H]` `experts.gate_up_proj`
    // (gate rows first) and `experts.down_proj`; mlx-lm's sanitize splits and renames them.
    let tmp = relaid_model("gemma4_text-moe", |mut tensors| {
        for i in 0..4 {
            let p = format!("model.layers.{i}.experts");
            let gate = tensors.remove(&format!("{p}.switch_glu.gate_proj.weight")).unwrap();
            let up = tensors.remove(&format!("{p}.switch_glu.up_proj.weight")).unwrap();
            let down = tensors.remove(&format!("{p}.switch_glu.down_proj.weight")).unwrap();
            tensors.insert(format!("{p}.gate_up_proj"), mlx_rs::ops::concatenate(&[gate, up], -2).unwrap());
            tensors.insert(format!("{p}.down_proj"), down);
        }
        tensors
    });
    let loaded = support::load_exact(tmp.path()).unwrap();
    assert_single_cases_exact("gemma4 MoE (Hugging Face expert layout)", loaded.model.as_ref(), &golden("gemma4_text-moe"));
}

#[test]
fn gemma4_bfloat16_single_sequence_is_exact() {
    // Released checkpoints are bfloat16: every Python-float scale rounds as mlx-lm rounds it.
    let loaded = support::load_exact(&tiny_model_dir("gemma4_text-bf16")).unwrap();
    assert_eq!(loaded.model.info().activation_dtype, mlx_rs::Dtype::Bfloat16);
    assert_single_cases_exact("gemma4_text-bf16", loaded.model.as_ref(), &golden("gemma4_text-bf16"));
}
