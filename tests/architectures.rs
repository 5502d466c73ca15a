//! Architectures from mlx-lm 0.32.2 built on the shared Llama-family layers (granite,
//! minicpm, smollm3), against goldens/make_arch_goldens.py: single-sequence trajectories with
//! bit-equal first-step logits, batch_generate B=2/B=4 and BatchGenerator join/evict
//! schedules (plain and chunked prefill) through the engine, and config errors.

mod support;

use serde_json::{json, Value};
use support::*;
use weft::engine::{Engine, EngineConfig};
use weft::loading;

/// Golden name = model dir.
const ARCHS: &[&str] = &["granite", "minicpm", "smollm3"];

#[test]
fn single_sequence_tokens_and_first_logits_are_exact() {
    for name in ARCHS {
        let g = golden(name);
        let loaded = loading::load(&tiny_model_dir(name)).unwrap();
        assert_eq!(loaded.model.info().model_type, *name);
        assert_single_cases_exact(name, loaded.model.as_ref(), &g);
    }
}

#[test]
fn batch_generate_goldens_match_through_the_engine() {
    for name in ARCHS {
        let g = golden(name);
        let single = loading::load(&tiny_model_dir(name)).unwrap();
        let engine = Engine::start(loading::load(&tiny_model_dir(name)).unwrap(), EngineConfig::default()).unwrap();
        assert_batch_goldens(name, &engine, single.model.as_ref(), &g, |r| ids(&r["tokens"]), 1e-5);
    }
}

#[test]
fn continuous_schedules_match_batch_generator() {
    for name in ARCHS {
        let g = golden(name);
        for key in ["schedule", "schedule_chunked"] {
            for max_batch in [8, 2] {
                let outs = replay(loading::load(&tiny_model_dir(name)).unwrap(), &g[key], max_batch);
                for (r, out) in g[key]["rows"].as_array().unwrap().iter().zip(&outs) {
                    assert_eq!((out.finals, &out.error), (1, &None), "{name} {key}");
                    assert_eq!(out.tokens, ids(&r["tokens"]), "{name} {key} (max_batch {max_batch}): row {}", r["id"]);
                }
            }
        }
    }
}

/// The first golden case's greedy tokens with `edit` applied to the model's config.
fn tokens_with(dir: &str, edit: impl FnOnce(&mut Value)) -> Result<Vec<u32>, String> {
    use weft::generate::{generate, GenerateOptions};
    let tmp = copy_model(dir);
    edit_config(tmp.path(), edit);
    let loaded = loading::load(tmp.path()).map_err(|e| e.to_string())?;
    let case = &golden(dir)["single"][2];
    let opts = GenerateOptions { max_tokens: ids(&case["tokens"]).len(), ..Default::default() };
    Ok(generate(loaded.model.as_ref(), None, &ids(&case["prompt_ids"]), &opts, |_| true).unwrap().tokens)
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
