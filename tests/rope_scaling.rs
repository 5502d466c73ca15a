//! Every RoPE scaling kind of mlx-lm 0.32.2 (`rope_utils.initialize_rope`) on tiny Llama
//! models that differ only in `rope_scaling` (goldens/make_arch_goldens.py): single-sequence
//! trajectories with bit-equal first-step logits, batch_generate B=2/B=4 and BatchGenerator
//! join/evict schedules through the engine, both config spellings, Llama 3.x configs, and
//! clear load errors for what is not supported.

mod support;

use serde_json::{json, Value};
use support::*;
use weft::engine::{Engine, EngineConfig};

/// (golden / model dir, scaling kind recorded in its config).
const KINDS: &[(&str, &str)] = &[
    ("rope-linear", "linear"),
    ("rope-llama3", "llama3"),
    ("rope-yarn", "yarn"),
    ("rope-longrope", "longrope"),
    ("rope-dynamic", "dynamic"),
    ("rope-mrope", "mrope"),
    ("rope-proportional", "proportional"),
];

#[test]
fn single_sequence_tokens_and_first_logits_are_exact_for_every_kind() {
    for (name, kind) in KINDS {
        let g = golden(name);
        let recorded = &g["config"]["rope_scaling"];
        assert_eq!(
            recorded.get("type").or_else(|| recorded.get("rope_type")).and_then(Value::as_str),
            Some(*kind),
            "{name}"
        );
        let loaded = support::load_exact(&tiny_model_dir(name)).unwrap();
        assert_single_cases_exact(name, loaded.model.as_ref(), &g);
    }
}

#[test]
fn batched_rows_match_the_oracle_for_every_kind() {
    for (name, _) in KINDS {
        let g = golden(name);
        let single = support::load_exact(&tiny_model_dir(name)).unwrap();
        let engine = Engine::start(support::load_exact(&tiny_model_dir(name)).unwrap(), EngineConfig::default()).unwrap();
        assert_batch_goldens(name, &engine, single.model.as_ref(), &g, |r| ids(&r["tokens"]), 1e-5);
    }
}

#[test]
fn continuous_schedules_match_the_oracle_for_every_kind() {
    for (name, _) in KINDS {
        let g = golden(name);
        for key in ["schedule", "schedule_chunked"] {
            if g.get(key).is_none() {
                // rope-dynamic: its rotation depends on how prefill is chunked (see the script).
                assert_eq!((*name, key), ("rope-dynamic", "schedule_chunked"));
                continue;
            }
            assert_schedule_exact(name, &g, key);
        }
    }
}


#[test]
fn both_spellings_of_the_kind_read_the_same() {
    // `type` and `rope_type` name the kind; mlx-lm prefers `type`.
    let want = ids(&golden("rope-yarn")["single"][2]["tokens"]);
    let renamed = tokens_with("rope-yarn", |v| {
        let s = v["rope_scaling"].as_object_mut().unwrap();
        let kind = s.remove("rope_type").unwrap();
        s.insert("type".into(), kind);
    });
    assert_eq!(renamed.unwrap(), want);
    // And the scaling really matters: without it the trajectory changes.
    let plain = tokens_with("rope-yarn", |v| v["rope_scaling"] = Value::Null).unwrap();
    assert_ne!(plain, want);
}

#[test]
fn llama3_configs_as_released_load() {
    // Llama 3.1 / 3.2 / 3.3 write rope_scaling like this (factor 8 or 32).
    for factor in [8.0, 32.0] {
        let got = tokens_with("rope-llama3", |v| {
            v["rope_scaling"] = json!({"factor": factor, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                       "original_max_position_embeddings": 8192, "rope_type": "llama3"});
            v["max_position_embeddings"] = json!(131072);
        });
        assert_eq!(got.map(|t| t.len()), Ok(24), "factor {factor}");
    }
}

#[test]
fn unsupported_or_incomplete_scaling_fails_at_load_naming_it() {
    let cases: Vec<(Value, &str)> = vec![
        (json!({"rope_type": "ntk-by-parts", "factor": 2.0}), "\"ntk-by-parts\""),
        (json!({"rope_type": "llama3"}), "\"factor\""),
        (json!({"type": "mrope", "mrope_section": [4, 4]}), "mrope_section"),
        (json!({"type": "longrope", "original_max_position_embeddings": 32, "long_factor": [1.0, 2.0]}), "long_factor"),
    ];
    for (scaling, needle) in cases {
        let err = tokens_with("rope-linear", |v| v["rope_scaling"] = scaling.clone()).unwrap_err();
        assert!(err.contains(needle), "{scaling}: {err}");
    }
}
