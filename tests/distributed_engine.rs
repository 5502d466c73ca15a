//! The continuous-batching engine across 2 ranks (tensor parallel, MLX's `ring` backend on
//! localhost; this test binary started twice with the variables `mlx.launch` sets): rank 0
//! drives a step-exact join/leave schedule through a `LockstepCore` (mlx-lm's BatchGenerator
//! schedule of the llama-fp32 goldens, chunked prefill, max_batch 2 so rows queue, plus a
//! seeded sampled row and a row cancelled mid-decode); rank 1 follows its plans. Both ranks'
//! rows must equal each other, the single-process engine's run of the same schedule, and
//! (greedy rows) mlx-lm's tokens. The same schedule runs pipelined over qwen2's layers too
//! (the split changes no arithmetic, so it equals the single-process engine exactly), and over
//! qwen3_5's hybrid layers (recurrent state in both stages). Qwen3-MoE
//! (experts sharded, and pipelined) replays mlx-lm's own 2-rank BatchGenerator schedules
//! (goldens/distributed.json) and must equal their tokens. Every wait is bounded; the ranks are
//! killed on failure.

mod support;

use std::collections::BTreeMap;
use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::*;
use weft::distributed::Group;
use weft::engine::{follow, EngineConfig, EngineCore, Event, LockstepCore, LockstepOptions, Preparer, Step, Submission};
use weft::nn::Parallel;
use weft::sampling::SamplingParams;

const RANK_ENV: &str = "WEFT_TEST_DISTRIBUTED_ENGINE_RANK";
const RESULT_PREFIX: &str = "WEFT_RANK_RESULT ";
const RANKS_DEADLINE: Duration = Duration::from_secs(240);
/// The schedule's source (mlx-lm's BatchGenerator run of this model).
const MODEL: &str = "llama-fp32";
/// (model, how it is split across the ranks). qwen3_5: the hybrid stack (gated DeltaNet
/// recurrent state and KV caches in each stage), its prompts' ids taken modulo its vocabulary.
const RUNS: [(&str, &str); 3] = [(MODEL, "tp"), ("qwen2", "pipeline"), ("qwen3_5", "pipeline")];
/// Qwen3-MoE, split both ways: replays of mlx-lm's 2-rank schedules (`{mode}_schedule`).
const MOE_RUNS: [(&str, &str); 2] = [("qwen3_moe", "tp"), ("qwen3_moe", "pipeline")];
/// The long row is cancelled once it has this many tokens.
const CANCEL_AFTER_TOKENS: usize = 3;

/// A row of the schedule: submitted before decode step `at_step` (or when idle).
struct Row {
    at_step: u64,
    prompt: Vec<u32>,
    max_tokens: usize,
    sampling: SamplingParams,
}

fn config() -> EngineConfig {
    let g = golden(MODEL);
    let prefill = g["schedule_chunked"]["prefill_step_size"].as_u64().unwrap() as usize;
    EngineConfig { max_batch: 2, prompt_concurrency: 2, prefill_step_size: prefill, ..Default::default() }
}

/// mlx-lm's 2-rank schedule of `model` split by `mode`.
fn moe_schedule(model: &str, mode: &str) -> Value {
    golden("distributed")["models"][model][format!("{mode}_schedule")].clone()
}

/// BatchGenerator's own limits (prefill_batch_size 8, completion_batch_size 32, at least the
/// 5 rows) and the schedule's prefill step, so rows join as in mlx-lm's run.
fn moe_config(schedule: &Value) -> EngineConfig {
    let prefill = schedule["prefill_step_size"].as_u64().unwrap() as usize;
    EngineConfig { max_batch: 8, prompt_concurrency: 8, prefill_step_size: prefill, ..Default::default() }
}

/// The rows of a golden schedule, greedy.
fn golden_rows(schedule: &Value) -> Vec<Row> {
    schedule["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| Row {
            at_step: r["at_step"].as_u64().unwrap(),
            prompt: ids(&r["prompt_ids"]),
            max_tokens: r["max_tokens"].as_u64().unwrap() as usize,
            sampling: SamplingParams::greedy(),
        })
        .collect()
}

/// mlx-lm's chunked schedule, then a seeded sampled row and a long row that is cancelled.
fn schedule() -> Vec<Row> {
    let g = golden(MODEL);
    let mut rows: Vec<Row> = g["schedule_chunked"]["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| Row {
            at_step: r["at_step"].as_u64().unwrap(),
            prompt: ids(&r["prompt_ids"]),
            max_tokens: r["max_tokens"].as_u64().unwrap() as usize,
            sampling: SamplingParams::greedy(),
        })
        .collect();
    let sampled = SamplingParams { temperature: 0.8, top_p: 0.9, seed: Some(7), ..SamplingParams::greedy() };
    rows.push(Row { at_step: 2, prompt: rows[0].prompt.clone(), max_tokens: 10, sampling: sampled });
    rows.push(Row { at_step: 1, prompt: rows[2].prompt.clone(), max_tokens: 40, sampling: SamplingParams::greedy() });
    rows
}

/// What a driver of the schedule needs: the plain core or a rank group's leader.
trait Driver {
    fn core(&self) -> &EngineCore;
    fn is_idle(&self) -> bool;
    fn enqueue(&mut self, sub: Submission);
    fn cancel(&mut self, id: u64);
    fn iterate(&mut self);
}

impl Driver for EngineCore {
    fn core(&self) -> &EngineCore {
        self
    }
    fn is_idle(&self) -> bool {
        EngineCore::is_idle(self)
    }
    fn enqueue(&mut self, sub: Submission) {
        EngineCore::enqueue(self, sub)
    }
    fn cancel(&mut self, id: u64) {
        EngineCore::cancel(self, id)
    }
    fn iterate(&mut self) {
        EngineCore::iterate(self)
    }
}

impl Driver for LockstepCore {
    fn core(&self) -> &EngineCore {
        LockstepCore::core(self)
    }
    fn is_idle(&self) -> bool {
        LockstepCore::is_idle(self)
    }
    fn enqueue(&mut self, sub: Submission) {
        LockstepCore::enqueue(self, sub)
    }
    fn cancel(&mut self, id: u64) {
        LockstepCore::cancel(self, id)
    }
    fn iterate(&mut self) {
        self.step(Step::Iterate).expect("a lockstep iteration");
    }
}

type Outcomes = Arc<Mutex<BTreeMap<u64, Outcome>>>;

fn recorder(outs: &Outcomes, id: u64) -> weft::engine::Sink {
    let outs = Arc::clone(outs);
    Box::new(move |ev: &Event| {
        outs.lock().unwrap().entry(id).or_default().record(ev);
        true
    })
}

/// Runs the schedule step by step (row ids 1..); returns every row's outcome.
fn run_schedule(d: &mut dyn Driver, prep: &Preparer) -> Outcomes {
    let vocab = prep.model_info().vocab_size as u32;
    let mut rows = schedule();
    for r in &mut rows {
        r.prompt.iter_mut().for_each(|t| *t %= vocab);
    }
    run_rows(d, prep, rows, true)
}

/// Runs `rows` step by step (row ids 1..), cancelling the last row mid-decode if `cancel`.
fn run_rows(d: &mut dyn Driver, prep: &Preparer, rows: Vec<Row>, cancel: bool) -> Outcomes {
    let outs: Outcomes = Arc::default();
    let cancelled = if cancel { rows.len() as u64 } else { 0 };
    let mut next = 0;
    let mut cancel_sent = false;
    for _ in 0..10_000 {
        while next < rows.len() && (rows[next].at_step <= d.core().decode_steps() || d.is_idle()) {
            let id = next as u64 + 1;
            let mut req = greedy(rows[next].prompt.clone(), rows[next].max_tokens);
            req.sampling = rows[next].sampling.clone();
            d.enqueue(prep.submission(id, req, recorder(&outs, id)).unwrap());
            next += 1;
        }
        let progress = outs.lock().unwrap().get(&cancelled).map(|o| (o.tokens.len(), o.finals));
        if progress.is_some_and(|(n, finals)| n >= CANCEL_AFTER_TOKENS && finals == 0) && !cancel_sent {
            d.cancel(cancelled);
            cancel_sent = true;
        }
        if next == rows.len() && d.is_idle() {
            return outs;
        }
        d.iterate();
    }
    panic!("the schedule did not finish");
}

fn outcomes_json(outs: &Outcomes) -> Value {
    let outs = outs.lock().unwrap();
    json!(outs
        .iter()
        .map(|(id, o)| json!({"id": id, "tokens": o.tokens, "finish": format!("{:?}", o.finish), "error": o.error, "finals": o.finals}))
        .collect::<Vec<_>>())
}

#[test]
#[ignore = "one rank of the 2-process run; started by engine_across_2_ranks_equals_the_single_process_engine"]
fn engine_rank_entry() {
    assert!(std::env::var_os(RANK_ENV).is_some(), "run as a rank by the other test of this file, not by hand");
    let group = weft::env::distributed_group().expect("join the group");
    for (model, mode) in RUNS {
        let loaded = load_split(&group, model, mode);
        let outs = if group.rank() == 0 {
            let prep = Preparer::new(&loaded, config()).with_eos_token_ids(Vec::new());
            let mut ls = LockstepCore::new(EngineCore::new(loaded, config()), group.clone());
            ls.step(Step::Idle).expect("the first exchange");
            let outs = run_schedule(&mut ls, &prep);
            ls.step(Step::Shutdown).expect("shut the group down");
            outs
        } else {
            follow_with(loaded, config(), &group)
        };
        println!("{RESULT_PREFIX}{}", json!({"rank": group.rank(), "model": model, "mode": mode, "rows": outcomes_json(&outs)}));
    }
    for (model, mode) in MOE_RUNS {
        let schedule = moe_schedule(model, mode);
        let config = moe_config(&schedule);
        let loaded = load_split(&group, model, mode);
        let outs = if group.rank() == 0 {
            let prep = Preparer::new(&loaded, config.clone()).with_eos_token_ids(Vec::new());
            let mut ls = LockstepCore::new(EngineCore::new(loaded, config.clone()), group.clone());
            ls.step(Step::Idle).expect("the first exchange");
            let outs = run_rows(&mut ls, &prep, golden_rows(&schedule), false);
            ls.step(Step::Shutdown).expect("shut the group down");
            outs
        } else {
            follow_with(loaded, config, &group)
        };
        println!("{RESULT_PREFIX}{}", json!({"rank": group.rank(), "model": model, "mode": mode, "rows": outcomes_json(&outs)}));
    }
}

fn load_split(group: &Group, model: &str, mode: &str) -> weft::loading::LoadedModel {
    let dir = tiny_model_dir(model);
    match mode {
        "tp" => weft::loading::load_with(&dir, &weft::loading::LoadOptions { parallel: Some(Parallel::Tensor(group.clone())), ..exact_options() }),
        _ => weft::loading::load_with(&dir, &weft::loading::LoadOptions { parallel: Some(Parallel::Pipeline(group.clone())), ..exact_options() }),
    }
    .unwrap()
}

/// A follower's run: its rows' outcomes once rank 0 shut the group down.
fn follow_with(loaded: weft::loading::LoadedModel, config: EngineConfig, group: &Group) -> Outcomes {
    let outs: Outcomes = Arc::default();
    let sinks = {
        let outs = Arc::clone(&outs);
        Box::new(move |id| recorder(&outs, id)) as weft::engine::FollowerSinks
    };
    let opts = LockstepOptions { rank_timeout: Duration::from_secs(60), startup_timeout: Duration::from_secs(120) };
    follow(loaded, config, group.clone(), opts, Some(sinks)).expect("follow rank 0");
    outs
}

/// The single-process engine's rows for the schedule on `model`.
fn single_process(model: &str) -> Value {
    let loaded = load_exact(&tiny_model_dir(model)).unwrap();
    let prep = Preparer::new(&loaded, config()).with_eos_token_ids(Vec::new());
    let mut single = EngineCore::new(loaded, config());
    outcomes_json(&run_schedule(&mut single, &prep))
}

#[test]
fn engine_across_2_ranks_equals_the_single_process_engine() {
    let want: Vec<Value> = RUNS.iter().map(|(model, _)| single_process(model)).collect();
    let rows = want[0].as_array().unwrap();
    assert_eq!(rows.len(), schedule().len());
    // The greedy rows of mlx-lm's schedule: the single-process engine equals mlx-lm.
    let g = golden(MODEL);
    for (r, w) in g["schedule_chunked"]["rows"].as_array().unwrap().iter().zip(rows) {
        assert_eq!(ids(&w["tokens"]), ids(&r["tokens"]), "single-process row {} vs mlx-lm", w["id"]);
    }
    for w in &want {
        let rows = w.as_array().unwrap();
        let cancelled = &rows[rows.len() - 1];
        assert_eq!(cancelled["finish"], "Some(Cancelled)", "the long row is cancelled mid-decode");
        let n = ids(&cancelled["tokens"]).len();
        assert!(n > 0 && n < 40, "cancelled after {n} tokens");
    }

    let outputs = run_ranks(2);
    for (rank, out) in outputs.iter().enumerate() {
        let lines: Vec<Value> = out
            .lines()
            .filter_map(|l| l.find(RESULT_PREFIX).map(|i| serde_json::from_str(&l[i + RESULT_PREFIX.len()..]).unwrap()))
            .collect();
        assert_eq!(lines.len(), RUNS.len() + MOE_RUNS.len(), "rank {rank}: one result per run:\n{out}");
        for ((got, (model, mode)), want) in lines.iter().zip(RUNS).zip(&want) {
            assert_eq!((got["rank"].as_u64(), got["model"].as_str(), got["mode"].as_str()), (Some(rank as u64), Some(model), Some(mode)));
            assert_eq!(&got["rows"], want, "{model} {mode}: rank {rank}'s rows vs the single-process engine's");
        }
        for (got, (model, mode)) in lines[RUNS.len()..].iter().zip(MOE_RUNS) {
            assert_eq!((got["rank"].as_u64(), got["model"].as_str(), got["mode"].as_str()), (Some(rank as u64), Some(model), Some(mode)));
            let golden_rows = moe_schedule(model, mode)["rows"].as_array().unwrap().clone();
            let rows = got["rows"].as_array().unwrap();
            assert_eq!(rows.len(), golden_rows.len(), "{model} {mode}: rank {rank}: every row of mlx-lm's schedule");
            for (r, w) in rows.iter().zip(&golden_rows) {
                let what = format!("{model} {mode}: rank {rank}, row {} of mlx-lm's 2-rank schedule", w["id"]);
                assert_eq!((&r["error"], &r["finals"], &r["finish"]), (&Value::Null, &json!(1), &json!("Some(Length)")), "{what}");
                assert_eq!(ids(&r["tokens"]), ids(&w["tokens"]), "{what}: tokens");
            }
        }
    }
}

struct Ranks(Vec<Child>);

impl Drop for Ranks {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Starts `n` ranks of `engine_rank_entry` as `mlx.launch --backend ring` would, waits for all
/// within the deadline (killing them all once one fails or time runs out), returns their stdout.
fn run_ranks(n: usize) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let listeners: Vec<_> = (0..n).map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    let hosts: Vec<Vec<String>> = listeners.iter().map(|l| vec![format!("127.0.0.1:{}", l.local_addr().unwrap().port())]).collect();
    drop(listeners);
    let hostfile = dir.path().join("hostfile.json");
    std::fs::write(&hostfile, serde_json::to_string(&hosts).unwrap()).unwrap();
    let mut ranks = Ranks(Vec::new());
    let mut readers = Vec::new();
    for r in 0..n {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["engine_rank_entry", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
            .env(RANK_ENV, "1")
            .env("MLX_RANK", r.to_string())
            .env("MLX_HOSTFILE", &hostfile)
            .env("WEFT_DISTRIBUTED_BACKEND", "ring")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        for pipe in [Box::new(child.stdout.take().unwrap()) as Box<dyn Read + Send>, Box::new(child.stderr.take().unwrap())] {
            let mut pipe = pipe;
            readers.push(std::thread::spawn(move || {
                let mut s = String::new();
                let _ = pipe.read_to_string(&mut s);
                s
            }));
        }
        ranks.0.push(child);
    }
    let start = Instant::now();
    let failure = loop {
        let status: Vec<_> = ranks.0.iter_mut().map(|c| c.try_wait().unwrap()).collect();
        if let Some(r) = status.iter().position(|s| s.is_some_and(|s| !s.success())) {
            break Some(format!("rank {r} failed ({:?})", status[r]));
        }
        if status.iter().all(|s| s.is_some()) {
            break None;
        }
        if start.elapsed() > RANKS_DEADLINE {
            break Some(format!("ranks still running after {RANKS_DEADLINE:?}"));
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    drop(ranks);
    let logs: Vec<String> = readers.into_iter().map(|h| h.join().unwrap()).collect();
    if let Some(why) = failure {
        panic!("{why}\n{}", logs.join("\n---\n"));
    }
    logs.chunks(2).map(|c| c[0].clone()).collect()
}
