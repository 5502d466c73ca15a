//! The KV-cache flags of the `weft` binary: `--kv-bits` / `--kv-group-size` /
//! `--quantized-kv-start` reach the single-sequence path (mlx-lm goldens), the batched path, and
//! `bench`'s footprint report; bad settings are clear usage errors.

mod support;

use std::process::{Command, Output};

use serde_json::Value;
use support::*;

fn weft(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_weft")).args(args).output().expect("run weft")
}

fn json_of(out: &Output) -> Value {
    assert!(out.status.success(), "weft failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("one JSON object on stdout")
}

fn id_list(v: &Value) -> String {
    ids(v).iter().map(|t| t.to_string()).collect::<Vec<_>>().join(",")
}

/// The quantized-KV golden case for `model` with these settings.
fn case<'a>(g: &'a Value, model: &str, bits: i64, start: u64) -> &'a Value {
    g["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["model"] == model && c["kv_bits"] == bits && c["quantized_kv_start"] == start)
        .expect("golden case")
}

#[test]
fn generate_with_kv_bits_matches_mlx_lm_single_and_batched() {
    let g = golden("quantized_kv");
    let c = case(&g, "llama-fp32", 4, 20);
    let model = tiny_model_dir("llama-fp32");
    let run = &c["single"][2]; // 17-token prompt: converts to quantized during decode
    let kv = ["--kv-bits", "4", "--kv-group-size", "32", "--quantized-kv-start", "20"];
    let mut args = vec!["generate", "--model", model.to_str().unwrap(), "--max-tokens", "24", "--temp", "0", "--no-eos", "--json"];
    args.extend(kv);
    let prompt = id_list(&run["prompt_ids"]);
    let single = json_of(&weft(&[&args[..], &["--prompt-ids", &prompt]].concat()));
    assert_eq!(ids(&single["tokens"]), ids(&run["tokens"]));
    assert_eq!(floats(&single["first_logits"]), floats(&run["first_logits"])[..8].to_vec());
    assert_ne!(ids(&single["tokens"]), ids(&run["full_precision_tokens"]), "the flags must change the output");

    // The same prompt twice through the engine: each row equals the single-sequence run.
    let rows = json_of(&weft(&[&args[..], &["--prompt-ids", &prompt, "--prompt-ids", &prompt]].concat()));
    for row in rows["rows"].as_array().unwrap() {
        assert_eq!(ids(&row["tokens"]), ids(&run["tokens"]));
    }
}

#[test]
fn bench_reports_kv_footprint_and_bad_kv_settings_are_errors() {
    let model = tiny_model_dir("llama-hd64");
    let m = model.to_str().unwrap();
    let v = json_of(&weft(&["bench", "-m", m, "--gen", "4", "--runs", "1", "--prompt-len", "8", "--kv-bits", "4", "--json"]));
    let kv = &v["kv"];
    // llama-hd64: 2 layers × 1 kv head × head_dim 64, fp32; 12 positions per row.
    assert_eq!(kv["full_precision_bytes_per_row"].as_f64().unwrap(), (12 * 2 * 2 * 64 * 4) as f64);
    assert_eq!(kv["bytes_per_row"].as_f64().unwrap(), (12 * 2 * 2 * (32 + 8)) as f64);
    assert!(v["results"][0]["peak_kv_bytes"].as_f64().unwrap() > 0.0);

    let out = weft(&["generate", "-m", tiny_model_dir("llama-fp32").to_str().unwrap(), "--prompt-ids", "1,2", "--kv-bits", "4"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("head_dim 32"), "{err}");
    let out = weft(&["generate", "-m", m, "--prompt-ids", "1,2", "--kv-bits", "7"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("kv_bits must be"));
}
