//! Shared by the model tests: golden files, tiny-model paths and the default model.
#![allow(dead_code)] // each test crate uses its own subset

use std::path::{Path, PathBuf};

use serde_json::Value;
use weft::model_store::{DefaultModel, ModelStore};

/// The repository's root: the nearest folder above the including crate that holds `goldens/`
/// (core, cli and ffi sit one level down, bindings/node two).
pub fn repo_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.ancestors().find(|d| d.join("goldens").is_dir()).unwrap_or(manifest).to_path_buf()
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
    missing(message)
}

/// What a test fixture that is not installed gives: a failure under
/// `WEFT_REQUIRE_DEFAULT_MODEL=1` (CI), else a loud skip.
fn missing(message: &str) -> Option<PathBuf> {
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
    missing(message)
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

use weft::engine::{EngineConfig, EngineCore, Event, Input, Preparer, Request, StopCause, Usage};
use weft::generate::FinishReason;
use weft::loading::LoadedModel;
use weft::sampling::SamplingParams;

/// A greedy request for token ids that ignores EOS (as the goldens were made).
pub fn greedy(prompt: Vec<u32>, max_tokens: usize) -> Request {
    Request { max_tokens, sampling: SamplingParams::greedy(), ignore_eos: true, ..Request::new(Input::Tokens(prompt)) }
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
    let prep = Preparer::new(&model, config.clone()).with_eos_token_ids(Vec::new());
    let mut core = EngineCore::new(model, config);
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
            core.enqueue(prep.submission(i as u64 + 1, req, sink).unwrap());
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

// --- A tiny reasoning model with a real vocabulary and template.

/// The real Qwen3 tokenizer (`scripts/fetch-test-tokenizers`). With
/// `WEFT_REQUIRE_DEFAULT_MODEL=1` (CI) its absence fails.
pub fn qwen3_tokenizer_dir() -> Option<PathBuf> {
    let dir = repo_root().join("target/test-tokenizers/qwen3");
    if dir.join("tokenizer.json").exists() {
        return Some(dir);
    }
    let message = "the Qwen3 test tokenizer is not fetched (run scripts/fetch-test-tokenizers)";
    missing(message)
}

/// A tiny Qwen3.5-architecture model that speaks the real Qwen3 vocabulary with the real
/// Qwen3.5 chat template (goldens/templates): the qwen3_5 golden's random weights, its tied
/// embedding widened to the vocabulary ([`widen_embeddings`]). Written into `dir`.
pub fn qwen35_chat_model(dir: &Path) -> Option<PathBuf> {
    let tokenizer = qwen3_tokenizer_dir()?;
    let source = tiny_model_dir("qwen3_5");
    let tok: Value = serde_json::from_str(&std::fs::read_to_string(tokenizer.join("tokenizer.json")).unwrap()).unwrap();
    let added = tok["added_tokens"].as_array().unwrap();
    let vocab = added.iter().map(|t| t["id"].as_u64().unwrap() as usize + 1).max().unwrap();
    let eos = added.iter().find(|t| t["content"] == "<|im_end|>").unwrap()["id"].as_u64().unwrap();

    let mut config: Value = serde_json::from_str(&std::fs::read_to_string(source.join("config.json")).unwrap()).unwrap();
    config["eos_token_id"] = eos.into();
    config["text_config"]["eos_token_id"] = eos.into();
    config["text_config"]["vocab_size"] = vocab.into();
    std::fs::write(dir.join("config.json"), serde_json::to_string_pretty(&config).unwrap()).unwrap();

    widen_embeddings(&source.join("model.safetensors"), &dir.join("model.safetensors"), vocab, &[
        "language_model.model.embed_tokens.weight",
    ]);

    std::fs::copy(tokenizer.join("tokenizer.json"), dir.join("tokenizer.json")).unwrap();
    let mut tok_config: Value =
        serde_json::from_str(&std::fs::read_to_string(tokenizer.join("tokenizer_config.json")).unwrap()).unwrap();
    tok_config["chat_template"] = std::fs::read_to_string(goldens_dir().join("templates/Qwen3.5-4B.jinja")).unwrap().into();
    tok_config["eos_token"] = "<|im_end|>".into();
    std::fs::write(dir.join("tokenizer_config.json"), serde_json::to_string_pretty(&tok_config).unwrap()).unwrap();
    Some(dir.to_path_buf())
}

/// A tiny Gemma 4 text model with the real Gemma 4 chat template (goldens/templates) and a
/// byte-level tokenizer that has Gemma 4's turn, channel, tool-call and string-quote markers as
/// special tokens (no registry ships Gemma 4's own vocabulary): the gemma4_text golden's random
/// weights, both embeddings widened to the vocabulary with seeded random rows. Written into `dir`.
pub fn gemma4_chat_model(dir: &Path) -> PathBuf {
    gemma4_chat_model_from(dir, "gemma4_text")
}

/// [`gemma4_chat_model`] over the gemma4-vision-audio golden's weights (its vision and audio
/// towers too), with Gemma 4's image and audio markers added to the vocabulary: media and tools
/// in one request.
pub fn gemma4_media_chat_model(dir: &Path) -> PathBuf {
    gemma4_chat_model_from(dir, "gemma4-vision-audio")
}

fn gemma4_chat_model_from(dir: &Path, source_name: &str) -> PathBuf {
    const SPECIAL: &[&str] = &[
        "<pad>", "<eos>", "<bos>", "<|turn>", "<turn|>", "<|think|>", "<|channel>", "<channel|>", "<|tool>", "<tool|>",
        "<|tool_call>", "<tool_call|>", "<|tool_response>", "<tool_response|>", "<|\"|>",
    ];
    const IMAGE: &[&str] = &["<|image|>", "<|image>", "<image|>"];
    const AUDIO: &[&str] = &["<|audio|>", "<|audio>", "<audio|>"];
    let source = tiny_model_dir(source_name);
    let mut config: Value = serde_json::from_str(&std::fs::read_to_string(source.join("config.json")).unwrap()).unwrap();
    let vision = config.get("vision_config").is_some();
    let audio = config.get("audio_config").is_some();
    let special: Vec<&str> =
        SPECIAL.iter().chain(if vision { IMAGE } else { &[] }).chain(if audio { AUDIO } else { &[] }).copied().collect();
    let template = std::fs::read_to_string(goldens_dir().join("templates/google-gemma-4-31B-it.jinja")).unwrap();
    let tok_config = serde_json::json!({"chat_template": template, "bos_token": "<bos>", "eos_token": "<turn|>",
        "pad_token": "<pad>", "add_bos_token": false});
    write_byte_level_tokenizer(dir, &special, &tok_config);

    let vocab_size = 256 + special.len();
    let id = |t: &str| 256 + special.iter().position(|s| *s == t).unwrap();
    let text = if vision { &mut config["text_config"] } else { &mut config };
    text["vocab_size"] = vocab_size.into();
    text["vocab_size_per_layer_input"] = vocab_size.into();
    text["bos_token_id"] = id("<bos>").into();
    text["eos_token_id"] = id("<turn|>").into();
    if vision {
        config["vocab_size"] = vocab_size.into();
        config["eos_token_id"] = id("<turn|>").into();
        config["image_token_id"] = id("<|image|>").into();
        config["boi_token_id"] = id("<|image>").into();
        config["eoi_token_id"] = id("<image|>").into();
        std::fs::copy(source.join("processor_config.json"), dir.join("processor_config.json")).unwrap();
    }
    if audio {
        config["audio_token_id"] = id("<|audio|>").into();
        config["boa_token_id"] = id("<|audio>").into();
        config["eoa_token_id"] = id("<audio|>").into();
        std::fs::copy(source.join("model-audio.safetensors"), dir.join("model-audio.safetensors")).unwrap();
    }
    std::fs::write(dir.join("config.json"), serde_json::to_string_pretty(&config).unwrap()).unwrap();
    let prefix = if vision { "language_model." } else { "" };
    let embeddings = [format!("{prefix}model.embed_tokens.weight"), format!("{prefix}model.embed_tokens_per_layer.weight")];
    let embeddings: Vec<&str> = embeddings.iter().map(String::as_str).collect();
    widen_embeddings(&source.join("model.safetensors"), &dir.join("model.safetensors"), vocab_size, &embeddings);
    dir.to_path_buf()
}

/// Writes into `dir` a byte-level tokenizer (every byte one token, ids 0..=255) with `special`
/// as special tokens from id 256 on, and `tok_config` as its tokenizer_config.json.
pub fn write_byte_level_tokenizer(dir: &Path, special: &[&str], tok_config: &Value) {
    let tokenizer = byte_level_tokenizer(special);
    std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).unwrap();
    std::fs::write(dir.join("tokenizer_config.json"), tok_config.to_string()).unwrap();
}

/// A family's tokenizer for a tiny model: byte-level with the family's markers as special
/// tokens (`special`, the first being the template's `bos_token`, the second its `eos_token`)
/// and the family's real chat template (goldens/templates/`template`), written into `dir`. For
/// families whose own vocabulary no registry ships as a small download: the markers and the
/// template are the family's, the ordinary text is bytes.
pub fn family_tokenizer(dir: &Path, template: &str, special: &[&str]) -> weft::tokenizer::Tokenizer {
    let source = std::fs::read_to_string(goldens_dir().join("templates").join(template)).unwrap();
    let tok_config = serde_json::json!({"chat_template": source, "bos_token": special[0], "eos_token": special[1],
        "add_bos_token": false});
    write_byte_level_tokenizer(dir, special, &tok_config);
    weft::tokenizer::Tokenizer::from_dir(dir).unwrap()
}

/// A byte-level BPE tokenizer (tokenizer.json) with every byte one token (ids 0..256, GPT-2's
/// byte-to-character map) and `special` as special tokens from 256 on.
pub fn byte_level_tokenizer(special: &[&str]) -> Value {
    // GPT-2's byte-to-character map: every byte one token.
    let mut printable: Vec<u32> = (33..=126).chain(161..=172).chain(174..=255).collect();
    let mut chars = printable.clone();
    for b in 0..256u32 {
        if !printable.contains(&b) {
            printable.push(b);
            chars.push(256 + chars.len() as u32 - 188);
        }
    }
    let mut vocab = serde_json::Map::new();
    for (b, c) in printable.iter().zip(&chars) {
        vocab.insert(char::from_u32(*c).unwrap().to_string(), (*b).into());
    }
    let added: Vec<Value> = special
        .iter()
        .enumerate()
        .map(|(i, t)| serde_json::json!({"id": 256 + i, "content": t, "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": true}))
        .collect();
    let byte_level = serde_json::json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true});
    serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added, "normalizer": null,
        "pre_tokenizer": byte_level, "post_processor": null, "decoder": byte_level,
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": vocab, "merges": []}
    })
}

/// A tiny golden model (whose vocabulary has room for 256 bytes + 2) that chats in ChatML
/// through [`byte_level_tokenizer`], `<|im_end|>` its end of sequence. Written into `dir`.
pub fn chatml_model(tiny: &str, dir: &Path) -> PathBuf {
    let source = tiny_model_dir(tiny);
    for entry in std::fs::read_dir(&source).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.join(path.file_name().unwrap())).unwrap();
    }
    std::fs::write(dir.join("tokenizer.json"), byte_level_tokenizer(&["<|im_start|>", "<|im_end|>"]).to_string()).unwrap();
    let template = "{%- for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endfor %}\
                    {%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}";
    let tok_config = serde_json::json!({"chat_template": template, "eos_token": "<|im_end|>", "add_bos_token": false});
    std::fs::write(dir.join("tokenizer_config.json"), tok_config.to_string()).unwrap();
    edit_config(dir, |c| {
        c["eos_token_id"] = 257.into();
        if c.get("text_config").is_some() {
            c["text_config"]["eos_token_id"] = 257.into();
        }
    });
    let _ = std::fs::remove_file(dir.join("generation_config.json"));
    dir.to_path_buf()
}

/// Copies a float32 safetensors file, the named `[vocab, width]` tensors grown to `vocab` rows
/// (the new rows seeded random, small).
pub fn widen_embeddings(from: &Path, to: &Path, vocab: usize, names: &[&str]) {
    let bytes = std::fs::read(from).unwrap();
    let tensors = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut widened: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for name in names {
        let t = tensors.tensor(name).unwrap();
        let (rows, width) = (t.shape()[0], t.shape()[1]);
        let mut data = t.data().to_vec();
        data.extend((0..(vocab - rows) * width).flat_map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.2).to_le_bytes()
        }));
        widened.push((name.to_string(), vec![vocab, width], data));
    }
    let mut out: Vec<(String, safetensors::tensor::TensorView)> =
        tensors.tensors().into_iter().filter(|(name, _)| !names.contains(&name.as_str())).collect();
    for (name, shape, data) in &widened {
        out.push((name.clone(), safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), data).unwrap()));
    }
    safetensors::serialize_to_file(out, None, to).unwrap();
}
