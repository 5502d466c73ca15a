//! `weft generate` and `weft replay` on every architecture's tiny model give mlx-lm's tokens:
//! Gemma 3 (sliding-window rings that wrap), qwen3_moe, qwen3_next and qwen3_5 (gated
//! DeltaNet), gemma2, phi3, granite, minicpm, smollm3, ministral3, mistral3, gemma4_text and Llama with llama3 / yarn RoPE, against
//! their goldens.

mod support;

use std::process::{Command, Output};

use serde_json::{json, Value};
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

#[test]
fn generate_matches_the_gemma3_golden_past_the_window() {
    let g = golden("gemma3");
    // The 29-token prompt (window 8) with 32 generated tokens.
    let case = g["single"].as_array().unwrap().iter().find(|c| ids(&c["tokens"]).len() == 32).unwrap();
    let model = tiny_model_dir("gemma3-text");
    let out = weft(&[
        "generate", "--model", model.to_str().unwrap(), "--prompt-ids", &id_list(&case["prompt_ids"]),
        "--max-tokens", "32", "--temp", "0", "--no-eos", "--json",
    ]);
    let v = json_of(&out);
    assert_eq!(ids(&v["tokens"]), ids(&case["tokens"]));
    assert_eq!(floats(&v["first_logits"]), floats(&case["first_logits"])[..8].to_vec());
}

#[test]
fn replay_matches_the_gemma3_batch_generator_schedule() {
    let g = golden("gemma3");
    let s = &g["schedule_chunked5"];
    let rows = s["rows"].as_array().unwrap();
    let inserts: Vec<Value> = rows
        .iter()
        .map(|r| json!({"at_step": r["at_step"], "id": r["id"], "prompt_ids": r["prompt_ids"], "max_tokens": r["max_tokens"]}))
        .collect();
    let plan = json!({"max_batch": 8, "prefill_step_size": s["prefill_step_size"], "inserts": inserts});
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("plan.json");
    std::fs::write(&path, plan.to_string()).unwrap();
    let model = tiny_model_dir("gemma3-text");
    let v = json_of(&weft(&["replay", "--model", model.to_str().unwrap(), "--plan", path.to_str().unwrap()]));
    for r in rows {
        let got = &v["rows"][r["id"].to_string()];
        assert_eq!(got["finish_reason"], "length");
        assert_eq!(ids(&got["tokens"]), ids(&r["tokens"]), "row {}", r["id"]);
    }
}

/// (golden, model dir) of each architecture added after the Llama family.
const ARCHITECTURES: &[(&str, &str)] = &[
    ("gemma3", "gemma3-text"),
    ("qwen3_moe", "qwen3_moe"),
    ("qwen3_next", "qwen3_next"),
    ("qwen3_5", "qwen3_5"),
    ("gemma2", "gemma2"),
    ("phi3", "phi3"),
    ("granite", "granite"),
    ("minicpm", "minicpm"),
    ("smollm3", "smollm3"),
    ("ministral3", "ministral3"),
    ("mistral3", "mistral3"),
    ("gemma4_text", "gemma4_text"),
    ("gemma4_text-kv", "gemma4_text-kv"),
    // Llama 3.x RoPE scaling, and yarn (Qwen2.5 long-context).
    ("rope-llama3", "rope-llama3"),
    ("rope-yarn", "rope-yarn"),
];

#[test]
fn generate_matches_every_architecture_golden() {
    for (golden_name, dir) in ARCHITECTURES {
        let g = golden(golden_name);
        let case = g["single"].as_array().unwrap().iter().max_by_key(|c| ids(&c["prompt_ids"]).len()).unwrap();
        let want = ids(&case["tokens"]);
        let model = tiny_model_dir(dir);
        let out = weft(&[
            "generate", "--model", model.to_str().unwrap(), "--prompt-ids", &id_list(&case["prompt_ids"]),
            "--max-tokens", &want.len().to_string(), "--temp", "0", "--no-eos", "--json",
            "--prefill-step-size", &case["prefill_step_size"].to_string(),
        ]);
        assert_eq!(ids(&json_of(&out)["tokens"]), want, "{golden_name}");
    }
}

#[test]
fn replay_matches_every_architecture_schedule() {
    for (golden_name, dir) in ARCHITECTURES {
        let g = golden(golden_name);
        let s = &g["schedule_chunked"];
        let rows = s["rows"].as_array().unwrap();
        let inserts: Vec<Value> = rows
            .iter()
            .map(|r| json!({"at_step": r["at_step"], "id": r["id"], "prompt_ids": r["prompt_ids"], "max_tokens": r["max_tokens"]}))
            .collect();
        let plan = json!({"max_batch": 8, "prefill_step_size": s["prefill_step_size"], "inserts": inserts});
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("plan.json");
        std::fs::write(&path, plan.to_string()).unwrap();
        let model = tiny_model_dir(dir);
        let v = json_of(&weft(&["replay", "--model", model.to_str().unwrap(), "--plan", path.to_str().unwrap()]));
        for r in rows {
            let got = &v["rows"][r["id"].to_string()];
            assert_eq!(ids(&got["tokens"]), ids(&r["tokens"]), "{golden_name}: row {}", r["id"]);
        }
    }
}

#[test]
fn gemma4_kv_sharing_refuses_kv_bits_with_a_message() {
    let model = tiny_model_dir("gemma4_text");
    for sub in [&["generate", "--prompt-ids", "1,2,3"][..], &["generate", "--prompt-ids", "1,2,3", "--prompt-ids", "4,5"][..]] {
        let mut args: Vec<&str> = sub.to_vec();
        args.extend(["--model", model.to_str().unwrap(), "--max-tokens", "2", "--kv-bits", "8", "--kv-group-size", "32"]);
        let out = weft(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(err.contains("kv_bits") && err.contains("KV-shared") && !err.contains("panicked"), "{err}");
    }
}
