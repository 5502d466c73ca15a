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
fn models_lists_known_and_installed_models_with_what_their_files_say() {
    let store = tempfile::tempdir().unwrap();
    let root = store.path();
    // The default model "installed" as a file of its pinned size that is not a GGUF: listed as
    // installed, with the reason it cannot be inspected.
    let default_dir = root.join("smollm2-135m-instruct-q4_1");
    std::fs::create_dir_all(&default_dir).unwrap();
    std::fs::File::create(default_dir.join("SmolLM2-135M-Instruct.Q4_1.gguf")).unwrap().set_len(98_362_432).unwrap();
    // A quantized mlx-lm directory, a GGUF file, and a multimodal checkpoint whose chat
    // template renders tools.
    let mlx = root.join("tiny-llama-4bit");
    std::fs::create_dir_all(&mlx).unwrap();
    for f in std::fs::read_dir(tiny_model_dir("llama-4bit")).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, mlx.join(f.file_name().unwrap())).unwrap();
    }
    std::fs::copy(goldens_dir().join("gguf/llama-q4_0.gguf"), root.join("tiny.gguf")).unwrap();
    let vl = root.join("vision-chat");
    std::fs::create_dir_all(&vl).unwrap();
    std::fs::write(vl.join("config.json"), r#"{"model_type": "gemma3", "vision_config": {"hidden_size": 8}, "text_config": {"torch_dtype": "bfloat16"}}"#).unwrap();
    std::fs::write(vl.join("tokenizer_config.json"), r#"{"chat_template": "{% if tools %}{{ tools | tojson }}{% endif %}"}"#).unwrap();
    std::fs::create_dir_all(root.join("not-a-model")).unwrap();

    let hf_cache = root.join("no-hf-cache");
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_weft")).args(args).env("WEFT_MODELS_DIR", root).env("HF_HUB_CACHE", &hf_cache).output().unwrap()
    };
    let v = json_of(&run(&["models", "--json"]));
    assert_eq!(v["store"].as_str(), root.to_str());
    let models = v["models"].as_array().unwrap();
    let by_name = |n: &str| models.iter().find(|m| m["name"] == n).unwrap_or_else(|| panic!("{n} not listed: {v}"));
    let names: Vec<&str> = models.iter().map(|m| m["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["smollm2-135m-instruct-q4_1", "gemma-3-270m", "tiny-llama-4bit", "tiny.gguf", "vision-chat"]);

    let d = by_name("smollm2-135m-instruct-q4_1");
    assert_eq!((d["default"].as_bool(), d["known"].as_bool(), d["installed"].as_bool()), (Some(true), Some(true), Some(true)));
    assert_eq!(d["size_bytes"], 98_362_432);
    assert!(d["error"].as_str().is_some_and(|e| !e.is_empty()), "{d}");
    let g = by_name("gemma-3-270m");
    assert_eq!((g["installed"].as_bool(), g["size_bytes"].as_u64()), (Some(false), Some(253_113_024)));
    assert!(g["architecture"].is_null() && g["path"].is_null());

    let m = by_name("tiny-llama-4bit");
    assert_eq!((m["architecture"].as_str(), m["quantization"].as_str()), (Some("llama"), Some("4-bit g64")));
    assert_eq!(m["capabilities"], serde_json::json!({"chat_template": false, "tools": false, "vision": false, "audio": false}));
    assert!(m["size_bytes"].as_u64().unwrap() > 100_000);
    assert_eq!(m["known"].as_bool(), Some(false));
    let f = by_name("tiny.gguf");
    assert_eq!((f["architecture"].as_str(), f["quantization"].as_str()), (Some("llama"), Some("Q4_0")));
    assert_eq!(f["size_bytes"].as_u64(), Some(std::fs::metadata(root.join("tiny.gguf")).unwrap().len()));
    let vc = by_name("vision-chat");
    assert_eq!(vc["quantization"].as_str(), Some("bfloat16"));
    assert_eq!(vc["capabilities"], serde_json::json!({"chat_template": true, "tools": true, "vision": true, "audio": false}));

    // The alias prints the table.
    let out = run(&["ls"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("NAME") && lines[0].contains("QUANT") && lines[0].contains("VISION"), "{text}");
    assert!(lines[1].starts_with("smollm2-135m-instruct-q4_1 (default)") && lines[1].contains("unreadable"), "{text}");
    assert!(lines[2].starts_with("gemma-3-270m") && lines[2].contains("available") && lines[2].contains("253.1 MB"), "{text}");
    assert!(lines.iter().any(|l| l.starts_with("tiny.gguf") && l.contains("Q4_0")), "{text}");
    assert!(text.contains(&format!("store: {}", root.display())), "{text}");
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

/// `weft bench --copy --num-draft-tokens`: copy-heavy prompts (their last n-gram occurred
/// earlier, so the first step already drafts) and the speculation figures in the JSON.
#[test]
fn bench_reports_speculative_decoding() {
    let m = tiny_model_dir("qwen2");
    let v = json_of(&weft(&[
        "bench", "-m", m.to_str().unwrap(), "--batch", "1,2", "--gen", "16", "--runs", "1", "--prompt-len", "16", "--copy",
        "--num-draft-tokens", "4", "--json",
    ]));
    assert_eq!((v["num_draft_tokens"].as_u64(), v["copy"].as_bool()), (Some(4), Some(true)), "{v}");
    for r in v["results"].as_array().unwrap() {
        assert!(r["draft_tokens"].as_f64().unwrap() > 0.0, "{r}");
        assert!((0.0..=1.0).contains(&r["draft_acceptance_rate"].as_f64().unwrap()), "{r}");
        // Plain decoding takes ~1 step per token (a pipelined step may run past the last).
        assert!(r["tokens_per_step"].as_f64().unwrap() > 0.9, "{r}");
    }
}

/// `weft generate` with one prompt speculates through the engine: prompt lookup, a draft
/// model drafting for itself and a sibling sharing the vocabulary all give mlx-lm's greedy
/// tokens exactly, and the JSON carries the engine's speculation counters.
#[test]
fn generate_speculates_token_for_token_with_a_draft_model_or_prompt_lookup() {
    let g = golden("qwen2");
    let case = &g["single"][1];
    let (qwen2, qwen3) = (tiny_model_dir("qwen2"), tiny_model_dir("qwen3"));
    let prompt = id_list(&case["prompt_ids"]);
    let base = ["generate", "-m", qwen2.to_str().unwrap(), "--prompt-ids", &prompt, "--max-tokens", "24", "--temp", "0", "--no-eos", "--json"];
    let plain = json_of(&weft(&base));
    assert_eq!(ids(&plain["tokens"]), ids(&case["tokens"]));
    assert!(plain.get("speculation").is_none(), "{plain}");
    for extra in [
        vec!["--num-draft-tokens", "4"],
        vec!["--draft-model", qwen2.to_str().unwrap()],
        vec!["--draft-model", qwen2.to_str().unwrap(), "--num-draft-tokens", "2"],
        vec!["--draft-model", qwen3.to_str().unwrap()],
    ] {
        let v = json_of(&weft(&[&base[..], &extra[..]].concat()));
        assert_eq!(ids(&v["tokens"]), ids(&case["tokens"]), "{extra:?}");
        assert_eq!((&v["first_logits"], &v["finish_reason"]), (&plain["first_logits"], &plain["finish_reason"]), "{extra:?}");
        let s = &v["speculation"];
        assert!(s["draft_tokens"].as_u64().unwrap() > 0 && s["speculative_steps"].as_u64().unwrap() > 0, "{extra:?}: {s}");
        if extra[1] == qwen2.to_str().unwrap() {
            // A model drafting for itself is accepted: several tokens per step.
            assert!(s["draft_acceptance_rate"].as_f64().unwrap() > 0.9, "{extra:?}: {s}");
            assert!(s["tokens_per_step"].as_f64().unwrap() > 1.5, "{extra:?}: {s}");
        }
    }
    // The draft model's default length is mlx_lm.server's 3.
    let draft = ["--draft-model", qwen2.to_str().unwrap()];
    let default = json_of(&weft(&[&base[..], &draft].concat()));
    let three = json_of(&weft(&[&base[..], &draft, &["--num-draft-tokens", "3"]].concat()));
    assert_eq!(default["speculation"], three["speculation"]);
}

/// `weft OPTIONS...` with `input` on stdin.
fn weft_stdin(args: &[&str], input: &str) -> Output {
    use std::io::Write;
    use std::process::Stdio;
    let mut child = Command::new(env!("CARGO_BIN_EXE_weft"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run weft");
    // A command that fails before reading stdin (a bad flag) may have exited already: its
    // output and status are what the callers check, not the write.
    match child.stdin.take().unwrap().write_all(input.as_bytes()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        other => other.unwrap(),
    }
    child.wait_with_output().unwrap()
}

/// `weft generate PROMPT`, `weft run PROMPT` and `weft chat` (two turns on stdin) on the
/// default model print the same greedy text with prompt lookup and with the model drafting for
/// itself as without speculation; `--verbose` reports the drafts.
#[test]
fn generate_run_and_chat_speculate_token_for_token_on_the_default_model() {
    let Some(model) = default_model() else { return };
    let m = model.to_str().unwrap();
    let ok = |out: Output| {
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        (String::from_utf8(out.stdout).unwrap(), String::from_utf8(out.stderr).unwrap())
    };
    let speculating: [&[&str]; 2] = [&["--num-draft-tokens", "4"], &["--draft-model", m]];
    let question = "Write a short poem about the sea.";
    let cases: [(&[&str], &str); 3] = [
        (&["generate", "-m", m, question, "--max-tokens", "24", "--temp", "0"], ""),
        (&["run", "-m", m, question, "--max-tokens", "24", "--temp", "0", "-v"], ""),
        (&["chat", "-m", m, "--max-tokens", "16", "--temp", "0", "-v"], "What is the capital of France?\nAnd of Italy?\n"),
    ];
    for (args, input) in cases {
        let (want, _) = ok(weft_stdin(args, input));
        assert!(!want.trim().is_empty(), "{args:?}");
        for extra in speculating {
            let (got, err) = ok(weft_stdin(&[args, extra].concat(), input));
            assert_eq!(got, want, "{args:?} {extra:?}");
            // The summary line of each reply: what was drafted and accepted.
            assert!(err.contains(" drafted, ") && err.contains(" accepted (") && err.contains("tokens/step"), "{err}");
            if extra[0] == "--draft-model" {
                assert!(!err.contains(" 0 drafted"), "{err}");
            }
        }
    }
}

/// A draft model that cannot draft (missing, another vocabulary, caches that cannot drop
/// rejected positions) is one clear error naming `--draft-model`, exit 1, on every command.
#[test]
fn bad_draft_models_are_clean_errors() {
    let (qwen2, mistral, qwen35) = (tiny_model_dir("qwen2"), tiny_model_dir("mistral-fp32"), tiny_model_dir("qwen3_5"));
    let (qwen2, mistral, qwen35) = (qwen2.to_str().unwrap(), mistral.to_str().unwrap(), qwen35.to_str().unwrap());
    for cmd in ["generate", "run", "chat"] {
        let mut args = vec![cmd, "-m", qwen2, "--draft-model", "/no/such/draft"];
        if cmd == "generate" {
            args.extend(["--prompt-ids", "1,2,3"]);
        }
        if cmd == "run" {
            args.push("hello");
        }
        assert_clean_error(&weft_stdin(&args, "hello\n"), 1, "--draft-model /no/such/draft");
    }
    let ids = ["--prompt-ids", "1,2,3"];
    let out = weft(&[&["generate", "-m", qwen2, "--draft-model", mistral][..], &ids].concat());
    assert_clean_error(&out, 1, "must share the tokenizer");
    let out = weft(&[&["generate", "-m", mistral, "--draft-model", qwen35][..], &ids].concat());
    assert_clean_error(&out, 1, "cannot drop rejected draft positions");
}

// ---------------------------------------------------------------------------------------------
// Models by Hugging Face repo id, against a local Hub (tests/support/hub.rs).

#[path = "support/hub.rs"]
mod hub_fixture;

use hub_fixture::{tiny_repo, Hub};

/// `weft ARGS` with the Hub at `endpoint` and the cache in `cache`, nothing else of HF_* set.
fn weft_hub(endpoint: &str, cache: &std::path::Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_weft"));
    for v in ["HF_TOKEN", "HF_HUB_OFFLINE", "HF_HOME", "HF_TOKEN_PATH", "HUGGING_FACE_HUB_TOKEN", "WEFT_MODEL"] {
        cmd.env_remove(v);
    }
    cmd.args(args).env("HF_ENDPOINT", endpoint).env("HF_HUB_CACHE", cache).envs(env.iter().copied()).output().unwrap()
}

#[test]
fn hub_repo_ids_download_once_then_run_from_the_cache_and_offline() {
    let hub = Hub::start(vec![tiny_repo("org/tiny")]);
    let commit = hub.state.lock().unwrap().repos[0].main_commit();
    let cache = tempfile::tempdir().unwrap();
    let out = weft_hub(&hub.url, cache.path(), &["pull", "org/tiny"], &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let snapshot = cache.path().join("models--org--tiny/snapshots").join(&commit);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), snapshot.to_str().unwrap());
    assert!(String::from_utf8_lossy(&out.stderr).contains("downloading"), "progress is drawn on stderr");

    // A second process downloads nothing: one API call.
    hub.clear_requests();
    let gen = ["generate", "--model", "org/tiny", "--prompt-ids", "5,17,3", "--max-tokens", "3", "--temp", "0", "--json"];
    let v = json_of(&weft_hub(&hub.url, cache.path(), &gen, &[]));
    assert_eq!(ids(&v["tokens"]).len(), 3);
    assert_eq!(hub.requests().len(), 1, "{:?}", hub.requests());
    assert!(hub.downloads().is_empty());

    // Offline: the cache alone, no request; an empty cache is a clear error.
    hub.clear_requests();
    let v2 = json_of(&weft_hub(&hub.url, cache.path(), &gen, &[("HF_HUB_OFFLINE", "1")]));
    assert_eq!(v2["tokens"], v["tokens"]);
    assert!(hub.requests().is_empty(), "{:?}", hub.requests());
    let empty = tempfile::tempdir().unwrap();
    let out = weft_hub(&hub.url, empty.path(), &gen, &[("HF_HUB_OFFLINE", "1")]);
    assert_clean_error(&out, 1, "HF_HUB_OFFLINE is set");
    assert!(hub.requests().is_empty());

    // `weft ls` lists it from the cache, by the name --model takes.
    let v = json_of(&weft_hub(&hub.url, cache.path(), &["ls", "--json"], &[("WEFT_MODELS_DIR", empty.path().to_str().unwrap())]));
    assert_eq!(v["hf_cache"].as_str(), cache.path().to_str());
    let m = v["models"].as_array().unwrap().iter().find(|m| m["name"] == "org/tiny").unwrap_or_else(|| panic!("{v}"));
    assert_eq!((m["source"].as_str(), m["architecture"].as_str()), (Some("huggingface"), Some("qwen3")));
    assert_eq!(m["path"].as_str(), snapshot.to_str());
    assert!(m["size_bytes"].as_u64().unwrap() > 1_000_000, "blob sizes through the links: {m}");
    let v = json_of(&weft_hub(&hub.url, cache.path(), &["ls", "--json", "--max-size", "1GB"], &[("WEFT_MODELS_DIR", empty.path().to_str().unwrap())]));
    assert!(v["models"].as_array().unwrap().iter().any(|m| m["name"] == "org/tiny"));
    let out = weft_hub(&hub.url, cache.path(), &["ls", "--vision"], &[("WEFT_MODELS_DIR", empty.path().to_str().unwrap())]);
    assert_clean_error(&out, 1, "no model matches");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("org/tiny"));
}

#[test]
fn hub_errors_exit_1_with_what_went_wrong() {
    let mut gated = tiny_repo("org/gated");
    gated.gated_token = Some("hf_test".into());
    let hub = Hub::start(vec![tiny_repo("org/tiny"), gated]);
    let cache = tempfile::tempdir().unwrap();
    // A gated repo: refused without a token, fetched with HF_TOKEN or with the token file in
    // HF_HOME (what `hf auth login` writes).
    let out = weft_hub(&hub.url, cache.path(), &["pull", "org/gated"], &[]);
    assert_clean_error(&out, 1, "access to org/gated is restricted");
    assert!(String::from_utf8_lossy(&out.stderr).contains("HF_TOKEN"));
    let out = weft_hub(&hub.url, cache.path(), &["pull", "org/gated"], &[("HF_TOKEN", "hf_test")]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let home = tempfile::tempdir().unwrap();
    std::fs::write(home.path().join("token"), "hf_test\n").unwrap();
    let other = tempfile::tempdir().unwrap();
    let out = weft_hub(&hub.url, other.path(), &["pull", "org/gated"], &[("HF_HOME", home.path().to_str().unwrap())]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    let out = weft_hub(&hub.url, cache.path(), &["pull", "org/missing"], &[]);
    assert_clean_error(&out, 1, "no repository org/missing");
    let out = weft_hub(&hub.url, cache.path(), &["generate", "-m", "org/tiny@v9", "--prompt-ids", "1"], &[]);
    assert_clean_error(&out, 1, "revision \"v9\" not found in org/tiny");
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let out = weft_hub(&format!("http://127.0.0.1:{port}"), cache.path(), &["pull", "org/tiny"], &[]);
    assert_clean_error(&out, 1, "cannot reach the Hugging Face Hub");
    let out = weft_hub(&hub.url, cache.path(), &["pull", "no-such-name"], &[]);
    assert_clean_error(&out, 1, "no model named \"no-such-name\"");
}

/// A pull cut off mid-file keeps its bytes; the next process resumes them with `Range`.
#[test]
fn hub_interrupted_pull_is_resumed_by_the_next_process() {
    let hub = Hub::start(vec![tiny_repo("org/tiny")]);
    let cache = tempfile::tempdir().unwrap();
    hub.set_cut(Some(4096));
    let out = weft_hub(&hub.url, cache.path(), &["pull", "org/tiny"], &[]);
    assert_clean_error(&out, 1, "kept for resuming");
    let blobs = cache.path().join("models--org--tiny/blobs");
    let partial: Vec<(String, u64)> = std::fs::read_dir(&blobs)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".incomplete"))
        .map(|e| (e.file_name().to_string_lossy().trim_end_matches(".incomplete").to_string(), e.metadata().unwrap().len()))
        .collect();
    assert_eq!(partial.len(), 1, "{partial:?}");
    let (sha, kept) = &partial[0];
    hub.set_cut(None);
    hub.clear_requests();
    let out = weft_hub(&hub.url, cache.path(), &["pull", "org/tiny"], &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let gets: Vec<String> = hub.requests().into_iter().filter(|r| r.contains(&format!("/cdn/{sha}"))).collect();
    assert_eq!(gets.len(), 1, "{gets:?}");
    assert!(gets[0].contains(&format!("range=Some({kept})")), "{gets:?}");
}
