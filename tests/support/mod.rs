//! Shared by the model tests: golden files, tiny-model paths and the default model.
#![allow(dead_code)] // each test crate uses its own subset

use std::path::{Path, PathBuf};

use serde_json::Value;
use weft::model_store::{DefaultModel, ModelStore};

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

pub fn goldens_dir() -> PathBuf {
    repo_root().join("goldens")
}

/// The golden JSON recorded by goldens/make_goldens.py for `name`.
pub fn golden(name: &str) -> Value {
    let path = goldens_dir().join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

pub fn tiny_model_dir(name: &str) -> PathBuf {
    goldens_dir().join("models").join(name)
}

/// The tiny random-weight models with single-sequence goldens.
pub const TINY_MODELS: &[&str] = &["llama-fp32", "llama-bf16", "llama-4bit", "qwen3", "qwen2", "mistral-fp32"];

pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

pub fn floats(v: &Value) -> Vec<f32> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
}

/// Loads a model in the exact CPU kernel mode (MLX's own kernels, no projection fusion): what
/// comparisons with mlx-lm's goldens need. Tests that only compare Weft with itself load with
/// the defaults (`loading::load`, fast kernels) or name their options.
pub fn load_exact(path: &Path) -> weft::Result<weft::loading::LoadedModel> {
    weft::loading::load_with(path, &exact_options())
}

/// The load options of [`load_exact`].
pub fn exact_options() -> weft::loading::LoadOptions {
    weft::loading::LoadOptions::default().with_cpu_kernels(weft::kernels::CpuKernels::Exact)
}

/// The default model (SmolLM2 GGUF) if it is installed in the model store (`weft pull`), or
/// `$WEFT_TEST_SMOLLM2_GGUF`. With `WEFT_REQUIRE_DEFAULT_MODEL=1` (CI) its absence fails.
pub fn default_model() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("WEFT_TEST_SMOLLM2_GGUF").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    if let Some(p) = ModelStore::from_env().cached(&DefaultModel::smollm2()) {
        return Some(p);
    }
    let message = "the default model is not installed (run `weft pull`)";
    if std::env::var("WEFT_REQUIRE_DEFAULT_MODEL").as_deref() == Ok("1") {
        panic!("{message}; required because WEFT_REQUIRE_DEFAULT_MODEL=1");
    }
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "\n!!!!!!!! SKIPPING: {message} !!!!!!!!\n");
    None
}

/// The Gemma 3 270M GGUF if the model store has it (`weft pull gemma-3-270m`). With
/// `WEFT_REQUIRE_DEFAULT_MODEL=1` (CI) its absence fails.
pub fn gemma3_270m() -> Option<PathBuf> {
    let spec = weft::model_store::SplitModel::gemma3_270m();
    if let Some(p) = ModelStore::from_env().cached_split(&spec) {
        return Some(p);
    }
    let message = "gemma-3-270m is not installed (run `weft pull gemma-3-270m`)";
    if std::env::var("WEFT_REQUIRE_DEFAULT_MODEL").as_deref() == Ok("1") {
        panic!("{message}; required because WEFT_REQUIRE_DEFAULT_MODEL=1");
    }
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "\n!!!!!!!! SKIPPING: {message} !!!!!!!!\n");
    None
}

/// A copy of a tiny model directory in a fresh temp dir, to break in a test.
pub fn copy_model(name: &str) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(tiny_model_dir(name)).unwrap() {
        let p = entry.unwrap().path();
        std::fs::copy(&p, tmp.path().join(p.file_name().unwrap())).unwrap();
    }
    tmp
}

/// Rewrites `config.json` in `dir` through `edit`.
pub fn edit_config(dir: &Path, edit: impl FnOnce(&mut Value)) {
    let path = dir.join("config.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(&path, serde_json::to_string_pretty(&v).unwrap()).unwrap();
}

// --- Engine runs shared by the batching tests (engine, moe, gdn, gemma3...).

use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};

use weft::engine::{prepare, EngineConfig, EngineCore, Event, Input, Request, StopCause, Usage};
use weft::generate::FinishReason;
use weft::loading::LoadedModel;
use weft::sampling::SamplingParams;

/// A greedy request for token ids that ignores EOS (as the goldens were made).
pub fn greedy(prompt: Vec<u32>, max_tokens: usize) -> Request {
    Request {
        input: Input::Tokens(prompt),
        max_tokens,
        sampling: SamplingParams::greedy(),
        stop: Vec::new(),
        ignore_eos: true,
        capture_first_logits: 0,
        logprobs: None,
        tools: None,
        constraint: None,
        images: Vec::new(),
        audio: Vec::new(),
        chat_template: None,
        chat_template_kwargs: Default::default(),
        reasoning_budget: None,
    }
}

/// What one request's events amounted to.
#[derive(Debug, Default, Clone)]
pub struct Outcome {
    pub tokens: Vec<u32>,
    pub finish: Option<FinishReason>,
    pub usage: Usage,
    pub first_logits: Vec<f32>,
    pub error: Option<String>,
    /// What ended a `Stop` finish, and the held-back text `Done` carried.
    pub stop: Option<StopCause>,
    pub tail: String,
    /// Every `Token`'s text followed by `Done`'s tail: the whole output.
    pub text: String,
    /// Final events seen (must be exactly 1).
    pub finals: usize,
    /// Events seen after the first final one (must be 0).
    pub after_final: usize,
}

impl Outcome {
    pub fn record(&mut self, ev: &Event) {
        if self.finals > 0 {
            self.after_final += 1;
        }
        match ev {
            Event::Token { token_id, text, .. } => {
                self.tokens.push(*token_id);
                self.text.push_str(text);
            }
            Event::Done { finish_reason, usage, first_logits, stop, text, .. } => {
                self.text.push_str(text);
                self.finish = Some(*finish_reason);
                self.stop = stop.clone();
                self.tail = text.clone();
                self.usage = *usage;
                self.first_logits = first_logits.clone();
                assert_eq!(self.tokens.len(), usage.completion_tokens, "one Token event per generated token");
                self.finals += 1;
            }
            Event::Started { .. } => {}
            Event::Error { message } => {
                self.error = Some(message.clone());
                self.finals += 1;
            }
        }
    }
}

/// Drains a request's channel until its final event (bounded wait: a hang fails the test).
pub fn collect(rx: &Receiver<Event>) -> Outcome {
    collect_into(Outcome::default(), rx)
}

/// [`collect`] for a stream whose first events the caller already took (`seen`).
pub fn collect_after(seen: &[Event], rx: &Receiver<Event>) -> Outcome {
    let mut o = Outcome::default();
    seen.iter().for_each(|ev| o.record(ev));
    if o.finals > 0 {
        return o;
    }
    collect_into(o, rx)
}

fn collect_into(mut o: Outcome, rx: &Receiver<Event>) -> Outcome {
    loop {
        let ev = rx.recv_timeout(std::time::Duration::from_secs(120)).expect("no final event within 120 s");
        o.record(&ev);
        if ev.is_final() {
            return o;
        }
    }
}

/// Drives a `BatchGenerator`-style schedule step by step: row `at_step` k is submitted just
/// before the engine's k-th decode step (or when the engine is idle).
pub fn replay(model: LoadedModel, schedule: &Value, max_batch: usize) -> Vec<Outcome> {
    let prefill = schedule["prefill_step_size"].as_u64().unwrap() as usize;
    let config = EngineConfig { max_batch, prompt_concurrency: max_batch, prefill_step_size: prefill, ..Default::default() };
    let info = model.model.info().clone();
    let mut core = EngineCore::new(model, config.clone());
    let rows = schedule["rows"].as_array().unwrap();
    let mut pending: Vec<(u64, usize)> = rows.iter().enumerate().map(|(i, r)| (r["at_step"].as_u64().unwrap(), i)).collect();
    pending.sort();
    let outs: Vec<Arc<Mutex<Outcome>>> = rows.iter().map(|_| Arc::default()).collect();
    let mut next = 0;
    for _ in 0..10_000 {
        while next < pending.len() && (pending[next].0 <= core.decode_steps() || core.is_idle()) {
            let i = pending[next].1;
            let out = Arc::clone(&outs[i]);
            let sink = Box::new(move |ev: &Event| {
                out.lock().unwrap().record(ev);
                true
            });
            let req = greedy(ids(&rows[i]["prompt_ids"]), rows[i]["max_tokens"].as_u64().unwrap() as usize);
            core.enqueue(prepare(i as u64 + 1, req, sink, None, &Default::default(), &info, &[], &config).unwrap());
            next += 1;
        }
        if next == pending.len() && core.is_idle() {
            return outs.iter().map(|o| o.lock().unwrap().clone()).collect();
        }
        core.iterate();
    }
    panic!("schedule did not finish");
}

/// How many values differ in their bits.
pub fn bit_diffs(a: &[f32], b: &[f32]) -> usize {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).filter(|(x, y)| x.to_bits() != y.to_bits()).count()
}

/// Every `single` case of golden `g` through single-sequence `generate` (greedy, EOS ignored):
/// tokens equal mlx-lm's and the first step's logits equal bit for bit (same ops in the same
/// order on the same libmlx).
pub fn assert_single_cases_exact(name: &str, model: &dyn weft::models::LanguageModel, g: &Value) {
    use weft::generate::{generate, GenerateOptions};
    let vocab = model.info().vocab_size as usize;
    for case in g["single"].as_array().unwrap() {
        let prompt = ids(&case["prompt_ids"]);
        let want = ids(&case["tokens"]);
        let step = case["prefill_step_size"].as_u64().unwrap() as usize;
        let opts = GenerateOptions {
            max_tokens: want.len(),
            prefill_step_size: step,
            capture_first_logits: vocab,
            ..GenerateOptions::default()
        };
        let out = generate(model, None, &prompt, &opts, |_| true).unwrap();
        let what = format!("{name}: {}-token prompt, prefill step {step}", prompt.len());
        assert_eq!(out.tokens, want, "{what}: tokens");
        assert_eq!(out.finish_reason, FinishReason::Length, "{what}");
        let diffs = bit_diffs(&out.first_logits, &floats(&case["first_logits"]));
        assert_eq!(diffs, 0, "{what}: {diffs} of {vocab} first-step logits differ");
    }
}

/// Every `batch` golden of `g` (mlx-lm `batch_generate`: rows submitted together) through
/// `engine`: each row's tokens equal `want(row)`, it ends by length, and its first step's
/// logits are within `tolerance` of `single`'s single-sequence ones (0.0 = equal).
pub fn assert_batch_goldens(
    name: &str,
    engine: &weft::engine::Engine,
    single: &dyn weft::models::LanguageModel,
    g: &Value,
    want: impl Fn(&Value) -> Vec<u32>,
    tolerance: f32,
) {
    use weft::generate::{generate, GenerateOptions};
    let vocab = single.info().vocab_size as usize;
    for batch in g["batch"].as_array().unwrap() {
        let rows = batch["rows"].as_array().unwrap();
        let streams: Vec<_> = rows
            .iter()
            .map(|r| {
                let mut req = greedy(ids(&r["prompt_ids"]), r["max_tokens"].as_u64().unwrap() as usize);
                req.capture_first_logits = vocab;
                engine.submit_channel(req).unwrap().1
            })
            .collect();
        for (r, rx) in rows.iter().zip(&streams) {
            let out = collect(rx);
            let what = format!("{name}: batch of {}", rows.len());
            assert_eq!(out.error, None, "{what}");
            assert_eq!(out.tokens, want(r), "{what}");
            assert_eq!(out.finish, Some(FinishReason::Length), "{what}");
            let opts = GenerateOptions { max_tokens: 1, capture_first_logits: vocab, ..Default::default() };
            let solo = generate(single, None, &ids(&r["prompt_ids"]), &opts, |_| true).unwrap();
            assert_eq!(out.first_logits.len(), vocab, "{what}");
            let worst = solo.first_logits.iter().zip(&out.first_logits).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
            assert!(worst <= tolerance, "{what}: first-step logits differ from single-sequence by {worst}");
        }
    }
}

/// Loads `dir`'s tiny model with `edit` applied to its config and returns its third golden
/// case's greedy single-sequence tokens (or the load error).
pub fn tokens_with(dir: &str, edit: impl FnOnce(&mut Value)) -> Result<Vec<u32>, String> {
    use weft::generate::{generate, GenerateOptions};
    let tmp = copy_model(dir);
    edit_config(tmp.path(), edit);
    let loaded = load_exact(tmp.path()).map_err(|e| e.to_string())?;
    let case = &golden(dir)["single"][2];
    let opts = GenerateOptions { max_tokens: ids(&case["tokens"]).len(), ..Default::default() };
    Ok(generate(loaded.model.as_ref(), None, &ids(&case["prompt_ids"]), &opts, |_| true).unwrap().tokens)
}

/// Replays the BatchGenerator schedule `g[key]` of tiny model `name` at max_batch 8 and 2; every
/// row must end once, without error, with the golden tokens.
pub fn assert_schedule_exact(name: &str, g: &Value, key: &str) {
    for max_batch in [8, 2] {
        let outs = replay(load_exact(&tiny_model_dir(name)).unwrap(), &g[key], max_batch);
        for (r, out) in g[key]["rows"].as_array().unwrap().iter().zip(&outs) {
            assert_eq!((out.finals, &out.error), (1, &None), "{name} {key}");
            assert_eq!(out.tokens, ids(&r["tokens"]), "{name} {key} (max_batch {max_batch}): row {}", r["id"]);
        }
    }
}

/// KL(p || q) of softmax(logits), in nats: how far one mode's next-token distribution is from
/// another's (the gate of every non-exact mode).
pub fn kl(p_logits: &[f32], q_logits: &[f32]) -> f64 {
    let logp = |l: &[f32]| {
        let max = l.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
        let lse = max + l.iter().map(|&v| (v as f64 - max).exp()).sum::<f64>().ln();
        l.iter().map(|&v| v as f64 - lse).collect::<Vec<_>>()
    };
    let (p, q) = (logp(p_logits), logp(q_logits));
    p.iter().zip(&q).map(|(a, b)| a.exp() * (a - b)).sum()
}
