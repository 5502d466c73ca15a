//! The `weft` binary's contract: the parity JSON, several rows, EOS handling, and clear errors
//! with the right exit codes (1 for runtime errors, 2 for usage errors) and no panic output.

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

fn assert_clean_error(out: &Output, code: i32, needle: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "stderr: {err}");
    assert!(err.contains(needle), "expected {needle:?} in: {err}");
    assert!(!err.contains("panicked") && !err.contains("RUST_BACKTRACE"), "panic output: {err}");
}

#[test]
fn generate_json_matches_the_golden_and_the_schema() {
    let g = golden("llama-fp32");
    let case = &g["single"][1];
    let model = tiny_model_dir("llama-fp32");
    let out = weft(&[
        "generate", "--model", model.to_str().unwrap(), "--prompt-ids", &id_list(&case["prompt_ids"]),
        "--max-tokens", "24", "--temp", "0", "--no-eos", "--json",
    ]);
    let v = json_of(&out);
    let mut keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    keys.sort();
    assert_eq!(keys, ["finish_reason", "first_logits", "prompt_tokens", "tokens"]);
    assert_eq!(ids(&v["tokens"]), ids(&case["tokens"]));
    assert_eq!(floats(&v["first_logits"]), floats(&case["first_logits"])[..8].to_vec());
    assert_eq!(v["prompt_tokens"].as_u64().unwrap() as usize, ids(&case["prompt_ids"]).len());
    assert_eq!(v["finish_reason"], "length");
}

#[test]
fn several_prompt_ids_give_rows_in_input_order() {
    let g = golden("qwen3");
    let cases: Vec<&Value> = g["single"].as_array().unwrap().iter().take(3).collect();
    let model = tiny_model_dir("qwen3");
    let mut args = vec!["generate".to_string(), "--model".into(), model.to_str().unwrap().into()];
    for c in &cases {
        args.push("--prompt-ids".into());
        args.push(id_list(&c["prompt_ids"]));
    }
    args.extend(["--max-tokens", "24", "--temp", "0", "--no-eos", "--json"].map(String::from));
    let v = json_of(&weft(&args.iter().map(String::as_str).collect::<Vec<_>>()));
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), cases.len());
    for (row, case) in rows.iter().zip(&cases) {
        assert_eq!(ids(&row["tokens"]), ids(&case["tokens"]));
        assert_eq!(floats(&row["first_logits"]).len(), 8);
        assert_eq!(row["finish_reason"], "length");
    }
}

#[test]
fn eos_stops_unless_no_eos() {
    // llama-fp32 stops on ids 2 and 5 (config.json + generation_config.json).
    let g = golden("llama-fp32");
    let model = tiny_model_dir("llama-fp32");
    let case = g["single"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| ids(&c["tokens"]).iter().any(|t| *t == 2 || *t == 5))
        .expect("a golden trajectory with an EOS id");
    let want = ids(&case["tokens"]);
    let cut = want.iter().position(|t| *t == 2 || *t == 5).unwrap();
    let base = ["generate", "--model", model.to_str().unwrap(), "--max-tokens", "24", "--temp", "0", "--json"];
    let prompt = id_list(&case["prompt_ids"]);
    let mut args = base.to_vec();
    args.extend(["--prompt-ids", &prompt]);
    let v = json_of(&weft(&args));
    assert_eq!(ids(&v["tokens"]), want[..cut]);
    assert_eq!(v["finish_reason"], "stop");
}

#[test]
fn runtime_errors_exit_1_with_a_message() {
    let model = tiny_model_dir("llama-fp32");
    let m = model.to_str().unwrap();
    assert_clean_error(&weft(&["generate", "--model", "/no/such/model", "--prompt-ids", "1,2"]), 1, "/no/such/model");
    assert_clean_error(&weft(&["generate", "--model", m, "--prompt-ids", "1,99999", "--json"]), 1, "outside the vocabulary");
    assert_clean_error(&weft(&["generate", "--model", m, "hello"]), 1, "has no tokenizer");
    assert_clean_error(&weft(&["generate", "--model", m, "--prompt-ids", "1", "--temp=-1"]), 1, "temperature");
    assert_clean_error(&weft(&["generate", "--model", m, "--prompt-ids", "1", "--max-tokens", "0"]), 1, "--max-tokens");

    let tmp = copy_model("llama-fp32");
    edit_config(tmp.path(), |c| c["model_type"] = serde_json::json!("nope"));
    assert_clean_error(&weft(&["generate", "--model", tmp.path().to_str().unwrap(), "--prompt-ids", "1"]), 1, "\"nope\"");
}

#[test]
fn usage_errors_exit_2() {
    let out = weft(&["generate", "--prompt-ids", "5,x"]);
    assert_clean_error(&out, 2, "invalid token id");
    assert_clean_error(&weft(&["frobnicate"]), 2, "unrecognized subcommand");
}

#[test]
fn cpu_kernels_flag_and_env_are_checked() {
    assert_clean_error(&weft(&["--cpu-kernels", "quick", "generate", "--prompt-ids", "1"]), 2, "expected \"exact\" or \"fast\"");
    let model = tiny_model_dir("llama-4bit");
    let out = Command::new(env!("CARGO_BIN_EXE_weft"))
        .args(["generate", "--model", model.to_str().unwrap(), "--prompt-ids", "1,2", "--max-tokens", "2"])
        .env("WEFT_CPU_KERNELS", "quick")
        .output()
        .unwrap();
    assert_clean_error(&out, 1, "WEFT_CPU_KERNELS");
    // The flag overrides the environment.
    let out = Command::new(env!("CARGO_BIN_EXE_weft"))
        .args(["generate", "--cpu-kernels", "fast", "--model", model.to_str().unwrap(), "--prompt-ids", "1,2"])
        .args(["--max-tokens", "2", "--no-eos", "--json"])
        .env("WEFT_CPU_KERNELS", "quick")
        .output()
        .unwrap();
    assert_eq!(json_of(&out)["tokens"].as_array().unwrap().len(), 2);
}

#[test]
fn default_model_answers_the_capital_of_france() {
    if default_model().is_none() {
        return;
    }
    let out = weft(&["generate", "What is the capital of France?", "--max-tokens", "32"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Paris"), "answer: {text}");
}

#[test]
fn bench_measures_every_batch_size_on_one_warm_engine() {
    let m = tiny_model_dir("llama-fp32");
    let v = json_of(&weft(&[
        "bench", "-m", m.to_str().unwrap(), "--batch", "1,3", "--gen", "4", "--runs", "2", "--prompt-len", "8", "--json",
    ]));
    let results = v["results"].as_array().unwrap();
    assert_eq!(results.iter().map(|r| r["batch"].as_u64().unwrap()).collect::<Vec<_>>(), [1, 3]);
    for r in results {
        for key in ["agg_tok_s", "decode_tok_s", "prefill_tok_s", "ttft_p50_ms"] {
            assert!(r[key].as_f64().unwrap() > 0.0, "{key}: {r}");
        }
        // Three 8-token prompts submitted together take one prefill forward, as one does.
        assert_eq!(r["prefill_forwards"].as_f64().unwrap(), 1.0, "{r}");
    }
}
