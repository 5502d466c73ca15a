//! Tensor and pipeline parallel over MLX's `ring` backend on localhost: two Weft ranks (this
//! test binary started twice, with the variables `mlx.launch` sets) load their shards (or
//! stages) of the tiny golden models and generate greedily; both must equal mlx-lm's own
//! 2-rank sharded (or pipelined) run (goldens/distributed.json, from
//! goldens/make_distributed_goldens.py) token for token and bit for bit on the first step's
//! logits. Every wait is bounded and the ranks are killed on
//! any failure, so a stuck collective fails the test instead of hanging it.

mod support;

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::*;
use weft::distributed::Group;
use weft::generate::{generate, GenerateOptions};
use weft::nn::pipeline::stage_layers;
use weft::nn::Parallel;

/// This rank's part of the model at `dir` split as `parallel`, in exact mode (goldens).
fn load_split(parallel: Parallel, dir: &std::path::Path) -> weft::Result<weft::loading::LoadedModel> {
    weft::loading::load_with(dir, &weft::loading::LoadOptions { parallel: Some(parallel), ..exact_options() })
}

/// Set in a rank's environment: the rank entry point below runs only there.
const RANK_ENV: &str = "WEFT_TEST_DISTRIBUTED_RANK";
const RESULT_PREFIX: &str = "WEFT_RANK_RESULT ";
/// Both ranks together: init, four tiny model loads, 16 short generations (seconds normally;
/// generous for a loaded 2-core CI machine).
const RANKS_DEADLINE: Duration = Duration::from_secs(240);

fn golden_models() -> Value {
    golden("distributed")["models"].clone()
}

/// A rank: joins the group from the environment, and for every golden model loads its shard
/// and runs every case, printing one result line per model.
#[test]
#[ignore = "one rank of the 2-process runs; started by tensor_and_pipeline_parallel_match_mlx_lm_2_rank_runs"]
fn rank_entry() {
    assert!(std::env::var_os(RANK_ENV).is_some(), "run as a rank by the other tests of this file, not by hand");
    let group = weft::env::distributed_group().expect("join the group");
    let models = golden_models();
    for (name, m, mode) in runs(&models) {
        let dir = tiny_model_dir(&name);
        let loaded = match mode {
            "tp" => load_split(Parallel::Tensor(group.clone()), &dir),
            _ => load_split(Parallel::Pipeline(group.clone()), &dir),
        }
        .unwrap();
        let vocab = loaded.model.info().vocab_size as usize;
        let mut cases = Vec::new();
        for case in m[mode].as_array().unwrap() {
            let opts = GenerateOptions {
                max_tokens: ids(&case["tokens"]).len(),
                prefill_step_size: case["prefill_step_size"].as_u64().unwrap() as usize,
                capture_first_logits: vocab,
                ..GenerateOptions::default()
            };
            let out = generate(loaded.model.as_ref(), None, &ids(&case["prompt_ids"]), &opts, |_| true).unwrap();
            cases.push(json!({"tokens": out.tokens, "first_logits": out.first_logits}));
        }
        let line = json!({"rank": group.rank(), "size": group.size(), "model": name, "mode": mode, "cases": cases});
        println!("{RESULT_PREFIX}{line}");
    }
    // 4-bit experts of 64 columns at group size 64 are one quantization group: 2 ranks cannot
    // split them (mlx-lm's shard() fails on them too), so the load is refused, naming them.
    let err = load_split(Parallel::Tensor(group.clone()), &tiny_model_dir("qwen3_moe-4bit")).map(|_| ()).unwrap_err();
    println!("{REFUSED_PREFIX}{}", json!({"model": "qwen3_moe-4bit", "error": err.to_string()}));
}

const REFUSED_PREFIX: &str = "WEFT_RANK_REFUSED ";

/// (model, its goldens, "tp" or "pipeline") for every recorded run.
fn runs(models: &Value) -> Vec<(String, Value, &'static str)> {
    let mut out = Vec::new();
    for (name, m) in models.as_object().unwrap() {
        for mode in ["tp", "pipeline"] {
            if m.get(mode).is_some() {
                out.push((name.clone(), m.clone(), mode));
            }
        }
    }
    out
}

/// Two localhost ports free a moment ago (the ring backend listens on them).
fn free_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<_> = (0..n).map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    listeners.iter().map(|l| l.local_addr().unwrap().port()).collect()
}

struct Ranks {
    children: Vec<Child>,
}

impl Drop for Ranks {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Starts `n` ranks of this binary's `rank_entry` as `mlx.launch --backend ring` would
/// (`MLX_RANK`, `MLX_HOSTFILE` = a JSON list of `["ip:port"]` per rank), waits for all of them
/// within the deadline (killing them all once one fails or time runs out) and returns each
/// rank's stdout.
fn run_ranks(n: usize) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let hosts: Vec<Vec<String>> = free_ports(n).iter().map(|p| vec![format!("127.0.0.1:{p}")]).collect();
    let hostfile = dir.path().join("hostfile.json");
    std::fs::write(&hostfile, serde_json::to_string(&hosts).unwrap()).unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut ranks = Ranks { children: Vec::new() };
    let mut readers = Vec::new();
    for r in 0..n {
        let mut child = Command::new(&exe)
            .args(["rank_entry", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
            .env(RANK_ENV, "1")
            .env("MLX_RANK", r.to_string())
            .env("MLX_HOSTFILE", &hostfile)
            .env("WEFT_DISTRIBUTED_BACKEND", "ring")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (mut out, mut err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
        readers.push((
            std::thread::spawn(move || {
                let mut s = String::new();
                let _ = out.read_to_string(&mut s);
                s
            }),
            std::thread::spawn(move || {
                let mut s = String::new();
                let _ = err.read_to_string(&mut s);
                s
            }),
        ));
        ranks.children.push(child);
    }
    let start = Instant::now();
    let mut status = vec![None; n];
    let failure = loop {
        for (r, c) in ranks.children.iter_mut().enumerate() {
            if status[r].is_none() {
                status[r] = c.try_wait().unwrap();
            }
        }
        if let Some(r) = status.iter().position(|s| s.is_some_and(|s| !s.success())) {
            break Some(format!("rank {r} failed ({:?})", status[r].unwrap()));
        }
        if status.iter().all(|s| s.is_some()) {
            break None;
        }
        if start.elapsed() > RANKS_DEADLINE {
            break Some(format!("ranks still running after {RANKS_DEADLINE:?} (statuses {status:?})"));
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    drop(ranks); // kills whatever still runs, so the readers finish
    let outputs: Vec<(String, String)> =
        readers.into_iter().map(|(o, e)| (o.join().unwrap(), e.join().unwrap())).collect();
    if let Some(why) = failure {
        let logs: Vec<String> =
            outputs.iter().enumerate().map(|(r, (o, e))| format!("--- rank {r} stdout\n{o}\n--- rank {r} stderr\n{e}")).collect();
        panic!("{why}\n{}", logs.join("\n"));
    }
    outputs.into_iter().map(|(o, _)| o).collect()
}

fn results(stdout: &str) -> Vec<Value> {
    BufReader::new(stdout.as_bytes())
        .lines()
        .map(|l| l.unwrap())
        // The harness may print "test rank_entry ... " on the same line first.
        .filter_map(|l| l.find(RESULT_PREFIX).map(|i| serde_json::from_str(&l[i + RESULT_PREFIX.len()..]).unwrap()))
        .collect()
}

#[test]
fn tensor_and_pipeline_parallel_match_mlx_lm_2_rank_runs() {
    let models = golden_models();
    let outputs = run_ranks(2);
    for (rank, out) in outputs.iter().enumerate() {
        let got = results(out);
        assert_eq!(got.len(), runs(&models).len(), "rank {rank}: one result per recorded run");
        for res in got {
            assert_eq!(res["rank"], rank);
            assert_eq!(res["size"], 2);
            let (name, mode) = (res["model"].as_str().unwrap(), res["mode"].as_str().unwrap());
            let want = models[name][mode].as_array().unwrap();
            let cases = res["cases"].as_array().unwrap();
            assert_eq!(cases.len(), want.len());
            for (c, w) in cases.iter().zip(want) {
                let what = format!("{name} {mode} rank {rank}: {}-token prompt, prefill step {}", ids(&w["prompt_ids"]).len(), w["prefill_step_size"]);
                assert_eq!(ids(&c["tokens"]), ids(&w["tokens"]), "{what}: tokens");
                let diffs = bit_diffs(&floats(&c["first_logits"]), &floats(&w["first_logits"]));
                assert_eq!(diffs, 0, "{what}: {diffs} first-step logits differ from mlx-lm's 2-rank run");
            }
        }
        let refused = out.lines().find_map(|l| l.find(REFUSED_PREFIX).map(|i| l[i + REFUSED_PREFIX.len()..].to_string()));
        let refused: Value = serde_json::from_str(&refused.unwrap_or_else(|| panic!("rank {rank}: no refusal line:\n{out}"))).unwrap();
        let why = refused["error"].as_str().unwrap();
        assert!(why.contains("switch_mlp.down_proj.scales") && why.contains("does not divide"), "rank {rank}: {why}");
    }
}

/// One test, in this order: MLX keeps the first group a backend made for the whole process, so
/// the strict (failing) init must come before the one that makes a group of one.
#[test]
fn unlaunched_ranks_bad_backends_and_a_group_of_one() {
    std::env::remove_var("MLX_RANK");
    std::env::remove_var("MLX_HOSTFILE");
    let err = Group::init("tcp", true).unwrap_err();
    assert!(err.to_string().contains("\"tcp\""), "{err}");
    // The ring backend is in the pinned wheel; strict init outside a launch fails with MLX's
    // own message (and does not take the process down, as mlx-c's default handler would).
    let err = Group::init("ring", true).unwrap_err();
    assert!(err.to_string().contains("MLX_HOSTFILE"), "{err}");

    let g = Group::init("ring", false).unwrap();
    assert_eq!((g.rank(), g.size()), (0, 1));
    let x = mlx_rs::Array::from_slice(&[1.5f32, -2.0], &[2]);
    assert_eq!(g.all_sum(&x).unwrap().as_slice::<f32>(), &[1.5, -2.0]);
    assert!(g.send(&x, 0).unwrap_err().to_string().contains("not a peer"));
    // One rank still shards (into one part) and must equal the unsharded model exactly.
    let loaded = load_split(Parallel::Tensor(g.clone()), &tiny_model_dir("qwen3")).unwrap();
    assert_single_cases_exact("qwen3 (1-rank tensor parallel)", loaded.model.as_ref(), &golden("qwen3"));
    // Architectures without a sharding are refused, not loaded whole.
    let err = load_split(Parallel::Tensor(g.clone()), &tiny_model_dir("gemma3-text")).unwrap_err();
    assert!(err.to_string().contains("tensor parallel"), "{err}");
    let loaded = load_split(Parallel::Pipeline(g.clone()), &tiny_model_dir("qwen2")).unwrap();
    assert_single_cases_exact("qwen2 (1-rank pipeline)", loaded.model.as_ref(), &golden("qwen2"));
    let err = load_split(Parallel::Pipeline(g.clone()), &tiny_model_dir("qwen3")).unwrap_err();
    assert!(err.to_string().contains("pipeline parallel"), "{err}");
}

#[test]
fn pipeline_stages_split_layers_as_mlx_lm() {
    // Reverse order, low ranks take the extra layers (mlx-lm PipelineMixin.pipeline).
    assert_eq!((0..2).map(|r| stage_layers(2, r, 2)).collect::<Vec<_>>(), vec![1..2, 0..1]);
    assert_eq!((0..3).map(|r| stage_layers(7, r, 3)).collect::<Vec<_>>(), vec![4..7, 2..4, 0..2]);
    assert_eq!((0..2).map(|r| stage_layers(5, r, 2)).collect::<Vec<_>>(), vec![2..5, 0..2]);
}
