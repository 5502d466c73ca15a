//! Gemma 3 text models against mlx-lm 0.32.2 (goldens/gemma3.json, made by
//! goldens/make_gemma3_goldens.py): single-sequence trajectories and first-step logits, the
//! `gemma3` (multimodal-form) checkpoint, batch_generate and BatchGenerator continuous
//! schedules through the engine while sliding-window rings wrap, the batched ring cache's
//! bookkeeping, prefix reuse, KV budgeting and config errors.

mod support;


use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::Array;
use serde_json::Value;
use support::*;
use weft::cache::{AttentionCache, AttentionMask, KvCache, RotatingKvCache};
use weft::engine::{Engine, EngineConfig};
use weft::loading::LoadedModel;

const TEXT: &str = "gemma3-text";
const WRAPPED: &str = "gemma3-wrapped";

fn load(name: &str) -> LoadedModel {
    support::load_exact(&tiny_model_dir(name)).unwrap()
}

fn single_cases_match(name: &str) {
    let g = golden("gemma3");
    let loaded = load(name);
    let cases = g["single"].as_array().unwrap();
    // Prompts longer than the window of 8, prefilled in chunks smaller than it.
    assert!(cases.iter().any(|c| c["prompt_ids"].as_array().unwrap().len() > 8 && c["prefill_step_size"] == 5));
    assert_single_cases_exact(name, loaded.model.as_ref(), &g);
}

#[test]
fn single_sequence_tokens_and_first_logits_are_exact() {
    single_cases_match(TEXT);
}

#[test]
fn multimodal_form_checkpoint_loads_the_text_model() {
    // `gemma3`: text_config + language_model.* tensors + a vision tensor sanitize drops.
    single_cases_match(WRAPPED);
}

#[test]
fn batch_generate_goldens_match_through_the_engine() {
    let g = golden("gemma3");
    let single = load(TEXT);
    let engine = Engine::start(load(TEXT), EngineConfig::default()).unwrap();
    // Not bit-equal (unlike full attention): in the batch a row's ring slots sit in another
    // order and behind padding, so attention sums its keys in another order.
    assert_batch_goldens("gemma3", &engine, single.model.as_ref(), &g, |r| ids(&r["tokens"]), 1e-5);
}

#[test]
fn continuous_schedules_match_batch_generator() {
    let g = golden("gemma3");
    for key in ["schedule", "schedule_chunked", "schedule_chunked5"] {
        let schedule = &g[key];
        for max_batch in [8, 2] {
            let outs = replay(load(TEXT), schedule, max_batch);
            for (r, out) in schedule["rows"].as_array().unwrap().iter().zip(&outs) {
                assert_eq!(out.finals, 1, "{key}: exactly one final event");
                assert_eq!(out.error, None, "{key}");
                assert_eq!(out.tokens, ids(&r["tokens"]), "{key} (max_batch {max_batch}): row {}", r["id"]);
            }
        }
    }
}

#[test]
fn prefix_reuse_never_changes_tokens() {
    // A finished row's caches go to the prompt cache; a wrapped ring cannot be cut back to a
    // shorter prefix, so such entries are only reused when they match exactly or not at all.
    let g = golden("gemma3");
    let engine = Engine::start(load(TEXT), EngineConfig { prompt_cache_bytes: 64 << 20, ..Default::default() }).unwrap();
    for case in g["single"].as_array().unwrap().iter().take(4) {
        let prompt = ids(&case["prompt_ids"]);
        let want = ids(&case["tokens"]);
        let a = collect(&engine.submit_channel(greedy(prompt.clone(), 8)).unwrap().1);
        assert_eq!(a.tokens, want[..8]);
        let mut extended = prompt.clone();
        extended.extend_from_slice(&want[..8]);
        let b = collect(&engine.submit_channel(greedy(extended, 8)).unwrap().1);
        assert_eq!(b.tokens, want[8..16], "{}-token prompt continued (cached {})", prompt.len(), b.usage.cached_tokens);
        // And the same prompt again.
        let c = collect(&engine.submit_channel(greedy(prompt.clone(), 8)).unwrap().1);
        assert_eq!(c.tokens, want[..8]);
    }
    // Before the ring wraps, entries are trimmed and reused like full-attention ones.
    let case = &g["single"][0];
    let (prompt, want) = (ids(&case["prompt_ids"]), ids(&case["tokens"]));
    let engine = Engine::start(load(TEXT), EngineConfig { prompt_cache_bytes: 64 << 20, ..Default::default() }).unwrap();
    let a = collect(&engine.submit_channel(greedy(prompt.clone(), 3)).unwrap().1);
    assert_eq!(a.tokens, want[..3]);
    let mut extended = prompt.clone();
    extended.extend_from_slice(&want[..3]);
    let b = collect(&engine.submit_channel(greedy(extended.clone(), 10)).unwrap().1);
    assert!(b.usage.cached_tokens > 0, "an unwrapped ring is reused");
    assert_eq!(b.tokens, want[3..13]);
}

fn column(rows: i32, row_values: &[f32]) -> Array {
    Array::from_slice(row_values, &[rows, 1, 1, 1])
}

/// Key values visible to row `b` under `mask` (`[B, 1, 1, S]`) for keys `[B, 1, S, 1]`.
fn visible(mask: &AttentionMask, keys: &Array, b: i32) -> Vec<f32> {
    let k = keys.index((b, 0, .., 0));
    k.eval().unwrap();
    let k = k.as_slice::<f32>().to_vec();
    let m: Vec<bool> = match mask {
        AttentionMask::Array(m) => {
            let m = m.index((b, 0, 0, ..));
            m.eval().unwrap();
            m.as_slice::<bool>().to_vec()
        }
        _ => vec![true; k.len()],
    };
    assert_eq!(m.len(), k.len());
    let mut v: Vec<f32> = k.iter().zip(m).filter(|(_, m)| *m).map(|(k, _)| *k).collect();
    v.sort_by(f32::total_cmp);
    v
}

#[test]
fn batched_ring_wraps_and_masks_exactly_the_window() {
    // Keys carry their (row, position) so the mask can be checked by value: after every
    // decode step each row sees exactly its own last `window` positions.
    let window = 4;
    let key = |row: usize, pos: i32| (row as f32) * 1000.0 + pos as f32;
    let prefill = |row: usize, n: i32| {
        let mut c = RotatingKvCache::new(window);
        let k: Vec<f32> = (0..n).map(|p| key(row, p)).collect();
        let k = Array::from_slice(&k, &[1, 1, n, 1]);
        c.update_and_fetch(&k, &k).unwrap();
        c
    };
    // Row 0 has wrapped during prefill (6 > 4), row 1 has not (2 < 4).
    let mut batch: Box<dyn KvCache> = Box::new(prefill(0, 6)).into_batched().unwrap();
    batch.batch_rows().unwrap().extend_rows(Box::new(prefill(1, 2)).into_batched().unwrap()).unwrap();
    // (row id, next position) per batch row.
    let mut rows: Vec<(usize, i32)> = vec![(0, 6), (1, 2)];
    for step in 0..9 {
        let mask = batch.attention_ref().unwrap().make_mask(1, Some(window)).unwrap();
        let vals: Vec<f32> = rows.iter().map(|&(id, p)| key(id, p)).collect();
        let k = column(rows.len() as i32, &vals);
        let (keys, _) = batch.attention().unwrap().update_and_fetch(&k, &k).unwrap();
        for (b, (id, p)) in rows.iter_mut().enumerate() {
            let want: Vec<f32> = ((*p - window + 1).max(0)..=*p).map(|q| key(*id, q)).collect();
            assert_eq!(visible(&mask, &keys, b as i32), want, "step {step} row {id}");
            *p += 1;
        }
        if step == 3 {
            // A third row joins while the others' rings are wrapped, later the first leaves.
            batch.batch_rows().unwrap().extend_rows(Box::new(prefill(2, 3)).into_batched().unwrap()).unwrap();
            rows.push((2, 3));
        }
        if step == 6 {
            batch.batch_rows().unwrap().filter_rows(&[1, 2]).unwrap();
            rows.remove(0);
        }
    }
    let pos: Vec<i32> = rows.iter().map(|r| r.1).collect();
    assert!(batch.batch_rows_ref().unwrap().rows() == 2);
    // Extracting a wrapped row gives its last `window` keys in temporal order.
    let single = batch.batch_rows_ref().unwrap().extract_row(0).unwrap();
    assert_eq!(single.len(), pos[0] as usize);
    let mut single = single;
    let probe = Array::from_slice(&[0.5f32], &[1, 1, 1, 1]);
    let (k, _) = single.attention().unwrap().update_and_fetch(&probe, &probe).unwrap();
    k.eval().unwrap();
    assert_eq!(k.dim(2), window);
    // A wrapped ring cannot be trimmed; an unwrapped one can.
    assert_eq!(single.trim(1), 0);
    let mut fresh = prefill(0, 3);
    assert_eq!(fresh.trim(1), 1);
    assert_eq!(fresh.len(), 2);
}

#[test]
fn kv_budget_counts_sliding_layers_at_most_their_window() {
    let loaded = load(TEXT);
    let info = loaded.model.info();
    let sw = info.sliding_window.expect("gemma3 has sliding layers");
    assert_eq!((sw.layers, sw.window), (4, 8));
    let per_layer_token = (info.kv_bytes_per_token() / info.num_layers) as u64;
    assert_eq!(info.kv_bytes_for(4), 4 * 6 * per_layer_token);
    assert_eq!(info.kv_bytes_for(100), (100 * 2 + 8 * 4) * per_layer_token);
}

#[test]
fn unsupported_config_options_fail_at_load_naming_them() {
    let cases: Vec<(&str, Box<dyn Fn(&mut Value)>)> = vec![
        ("\"ntk-by-parts\"", Box::new(|v: &mut Value| v["rope_scaling"] = serde_json::json!({"rope_type": "ntk-by-parts", "factor": 4.0}))),
        ("attn_logit_softcapping", Box::new(|v: &mut Value| v["attn_logit_softcapping"] = serde_json::json!(50.0))),
        ("hidden_activation", Box::new(|v: &mut Value| v["hidden_activation"] = serde_json::json!("relu"))),
        ("layer_types", Box::new(|v: &mut Value| v["layer_types"] = serde_json::json!(vec!["full_attention"; 6]))),
    ];
    for (needle, edit) in cases {
        let dir = copy_model(TEXT);
        edit_config(dir.path(), |v| edit(v));
        let err = support::load_exact(dir.path()).err().unwrap_or_else(|| panic!("{needle}: loaded"));
        assert!(err.to_string().contains(needle), "{needle}: {err}");
    }
}

