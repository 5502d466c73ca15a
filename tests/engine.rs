//! The continuous-batching engine against mlx-lm: batch_generate and BatchGenerator schedules
//! token-exact, first-step logits equal to single-sequence, prefix reuse exact, cancellation
//! and failures contained to their rows, KV-budget admission, and a bounded stress run.
//! Models load in the exact CPU kernel mode (`load_exact`: goldens are compared bit for bit),
//! except where a test compares the engine only with itself.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use support::*;
use weft::engine::{Engine, EngineConfig, Event, Input, Preparer, Request};
use weft::generate::{generate, FinishReason, GenerateOptions};
use weft::loading::{self};
use weft::sampling::SamplingParams;

const BATCHED_MODELS: &[&str] = &["llama-fp32", "llama-bf16", "llama-4bit", "qwen3"];

/// Stats are published after each engine iteration; wait (bounded) for them to settle.
fn settled_stats(engine: &Engine, done: impl Fn(&weft::engine::EngineStats) -> bool) -> weft::engine::EngineStats {
    for _ in 0..200 {
        let s = engine.stats();
        if done(&s) {
            return s;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    engine.stats()
}

fn start(name: &str, config: EngineConfig) -> Engine {
    Engine::start(load_exact(&tiny_model_dir(name)).unwrap(), config).unwrap()
}

#[test]
fn batch_generate_goldens_match_with_single_sequence_first_logits() {
    for name in BATCHED_MODELS {
        let g = golden(name);
        let single = load_exact(&tiny_model_dir(name)).unwrap();
        let engine = start(name, EngineConfig::default());
        // First-step logits equal the single-sequence ones (within 1e-5; bit-equal here).
        assert_batch_goldens(name, &engine, single.model.as_ref(), &g, |r| ids(&r["tokens"]), 1e-5);
    }
}

#[test]
fn continuous_schedules_match_batch_generator() {
    for name in BATCHED_MODELS {
        let g = golden(name);
        for key in ["schedule", "schedule_chunked"] {
            let schedule = &g[key];
            let outs = replay(load_exact(&tiny_model_dir(name)).unwrap(), schedule, 8);
            for (r, out) in schedule["rows"].as_array().unwrap().iter().zip(&outs) {
                assert_eq!(out.finals, 1, "{name}/{key}: exactly one final event");
                assert_eq!(out.tokens, ids(&r["tokens"]), "{name}/{key}: row {}", r["id"]);
            }
        }
    }
}

#[test]
fn a_row_cap_smaller_than_the_schedule_queues_without_changing_tokens() {
    let g = golden("llama-fp32");
    let outs = replay(load_exact(&tiny_model_dir("llama-fp32")).unwrap(), &g["schedule"], 2);
    for (r, out) in g["schedule"]["rows"].as_array().unwrap().iter().zip(&outs) {
        assert_eq!(out.tokens, ids(&r["tokens"]));
    }
}

#[test]
fn prefix_reuse_continues_exactly_like_never_batching() {
    // A row's KV is extracted from the batch into the prompt cache when it finishes; a second
    // request whose prompt extends that row's prompt + output reuses it and must continue the
    // single-sequence golden trajectory exactly.
    let g = golden("llama-fp32");
    let case = &g["single"][2];
    let prompt = ids(&case["prompt_ids"]);
    let want = ids(&case["tokens"]);
    let engine = start("llama-fp32", EngineConfig { prompt_cache_bytes: 64 << 20, ..Default::default() });
    // Run it inside a batch with a companion so the extract comes from a multi-row cache.
    let (_, companion) = engine.submit_channel(greedy(ids(&g["single"][3]["prompt_ids"]), 12)).unwrap();
    let (_, first) = engine.submit_channel(greedy(prompt.clone(), 8)).unwrap();
    let a = collect(&first);
    collect(&companion);
    assert_eq!(a.tokens, want[..8]);

    let mut extended = prompt.clone();
    extended.extend_from_slice(&want[..8]);
    let (_, second) = engine.submit_channel(greedy(extended, 8)).unwrap();
    let b = collect(&second);
    assert!(b.usage.cached_tokens > prompt.len(), "cached {} of {}", b.usage.cached_tokens, prompt.len() + 8);
    assert_eq!(b.tokens, want[8..16]);
    let stats = settled_stats(&engine, |s| s.prompt_cache_hits >= 1);
    assert!(stats.prompt_cache_hits >= 1 && stats.prompt_cache_bytes > 0, "{stats:?}");
}

#[test]
fn cancelling_rows_leaves_the_others_unchanged() {
    let g = golden("qwen3");
    let engine = start("qwen3", EngineConfig::default());
    let cases: Vec<&Value> = g["single"].as_array().unwrap().iter().take(4).collect();
    // Row 1's consumer gives up after 3 tokens (sink returns false); row 2 is cancelled by id.
    let mut streams = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        let req = greedy(ids(&c["prompt_ids"]), 24);
        if i == 1 {
            let (tx, rx) = std::sync::mpsc::channel();
            let mut seen = 0;
            engine
                .submit(req, Box::new(move |ev: &Event| {
                    if matches!(ev, Event::Token { .. }) {
                        seen += 1;
                    }
                    let _ = tx.send(ev.clone());
                    seen < 3 || ev.is_final()
                }))
                .unwrap();
            streams.push((0, rx));
        } else {
            streams.push(engine.submit_channel(req).unwrap());
        }
    }
    let victim = streams[2].0;
    let first = loop {
        match streams[2].1.recv_timeout(Duration::from_secs(60)).unwrap() {
            Event::Started { .. } => {}
            ev => break ev,
        }
    };
    assert!(matches!(first, Event::Token { .. }));
    engine.cancel(victim);
    for (i, ((_, rx), c)) in streams.iter().zip(&cases).enumerate() {
        let out = if i == 2 { collect_after(std::slice::from_ref(&first), rx) } else { collect(rx) };
        assert_eq!(out.finals, 1);
        let want = ids(&c["tokens"]);
        match i {
            1 | 2 => {
                assert_eq!(out.finish, Some(FinishReason::Cancelled), "row {i}");
                assert!(out.tokens.len() < want.len() && want.starts_with(&out.tokens), "row {i}");
            }
            _ => assert_eq!(out.tokens, want, "row {i}"),
        }
    }
    assert_eq!(settled_stats(&engine, |s| s.active_rows == 0).active_rows, 0);
}

#[test]
fn dropping_a_receiver_cancels_its_row_only() {
    let g = golden("llama-bf16");
    let engine = start("llama-bf16", EngineConfig::default());
    let keep = engine.submit_channel(greedy(ids(&g["single"][1]["prompt_ids"]), 24)).unwrap();
    let gone = engine.submit_channel(greedy(ids(&g["single"][2]["prompt_ids"]), 24)).unwrap();
    drop(gone.1);
    assert_eq!(collect(&keep.1).tokens, ids(&g["single"][1]["tokens"]));
}

#[test]
fn kv_budget_admission_waits_fifo_and_rejects_what_never_fits() {
    let loaded = load_exact(&tiny_model_dir("llama-fp32")).unwrap();
    let per_token = loaded.model.info().kv_bytes_per_token() as u64;
    // KV storage is allocated 256 positions at a time, so a short request takes 256 positions:
    // room for one at a time.
    let budget = per_token * (256 + 100);
    let engine = Engine::start(loaded, EngineConfig { kv_budget_bytes: Some(budget), ..Default::default() }).unwrap();

    let too_big = engine.submit_channel(greedy(vec![1; 250], 10)).unwrap_err().to_string();
    assert!(too_big.contains(&format!("needs {} bytes", per_token * 512)), "{too_big}");

    let g = golden("llama-fp32");
    let prompts: Vec<Vec<u32>> =
        (0..3).map(|i| ids(&g["single"][1]["prompt_ids"]).into_iter().map(|t| (t + i) % 512).collect()).collect();
    // One log of (request, is_final) in the order the engine emitted them.
    let log: Arc<Mutex<Vec<(usize, bool)>>> = Arc::default();
    let streams: Vec<_> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let (tx, rx) = std::sync::mpsc::channel();
            let log = Arc::clone(&log);
            let sink = Box::new(move |ev: &Event| {
                log.lock().unwrap().push((i, ev.is_final()));
                tx.send(ev.clone()).is_ok()
            });
            engine.submit(greedy(p.clone(), 10), sink).unwrap();
            rx
        })
        .collect();
    let outs: Vec<Outcome> = streams.iter().map(collect).collect();
    // Each request ran alone: its final event precedes the next request's first token.
    let log = log.lock().unwrap();
    for i in 0..2 {
        let done = log.iter().position(|&(r, fin)| r == i && fin).unwrap();
        let next_first = log.iter().position(|&(r, _)| r == i + 1).unwrap();
        assert!(done < next_first, "request {} started before request {i} finished", i + 1);
    }
    let single = load_exact(&tiny_model_dir("llama-fp32")).unwrap();
    for (p, out) in prompts.iter().zip(&outs) {
        let opts = GenerateOptions { max_tokens: 10, ..Default::default() };
        let solo = generate(single.model.as_ref(), None, p, &opts, |_| true).unwrap();
        assert_eq!(out.tokens, solo.tokens);
    }
}

#[test]
fn seeded_sampling_is_the_same_inside_a_batch_and_alone() {
    let engine = start("llama-fp32", EngineConfig::default());
    let sampled = |seed| Request {
        sampling: SamplingParams { temperature: 0.9, top_p: 0.95, seed: Some(seed), ..Default::default() },
        ..greedy(vec![3, 14, 15, 92, 65], 16)
    };
    let alone = collect(&engine.submit_channel(sampled(7)).unwrap().1);
    let others: Vec<_> = (0..3).map(|i| engine.submit_channel(greedy(vec![i + 1, 2, 3], 16)).unwrap().1).collect();
    let batched = collect(&engine.submit_channel(sampled(7)).unwrap().1);
    for rx in &others {
        collect(rx);
    }
    assert_eq!(alone.tokens, batched.tokens);
    let other_seed = collect(&engine.submit_channel(sampled(8)).unwrap().1);
    assert_ne!(alone.tokens, other_seed.tokens, "different seeds should diverge over 16 tokens");
}

#[test]
fn bad_requests_fail_at_submit_with_clear_errors() {
    let engine = start("llama-fp32", EngineConfig::default());
    let err = |r: Request| engine.submit_channel(r).unwrap_err().to_string();
    assert!(err(greedy(vec![], 4)).contains("empty"));
    assert!(err(greedy(vec![1, 100_000], 4)).contains("outside the vocabulary"));
    assert!(err(greedy(vec![1], 0)).contains("max_tokens"));
    assert!(err(Request::new(Input::Prompt("hi".into()))).contains("no tokenizer"));
    let bad_temp = Request { sampling: SamplingParams { temperature: f32::NAN, ..Default::default() }, ..greedy(vec![1], 4) };
    assert!(err(bad_temp).contains("temperature"));
    assert!(EngineConfig { max_batch: 0, ..Default::default() }.validate().is_err());
}

#[test]
fn shutdown_cancels_outstanding_requests_with_final_events() {
    let engine = start("llama-fp32", EngineConfig { max_batch: 1, ..Default::default() });
    let streams: Vec<_> = (0..4).map(|i| engine.submit_channel(greedy(vec![i + 1; 5], 200)).unwrap().1).collect();
    engine.shutdown();
    for rx in &streams {
        let out = collect(rx);
        assert_eq!(out.finals, 1);
        assert!(matches!(out.finish, Some(FinishReason::Cancelled) | Some(FinishReason::Length)));
    }
}

#[test]
fn stress_many_requests_random_params_and_cancellations() {
    stress(0);
}

/// The stress run with prompt-lookup speculation on (greedy rows draft; the sampled ones have a
/// penalty, so they decode plainly in the same steps).
#[test]
fn stress_with_speculative_decoding() {
    let stats = stress(4);
    assert!(stats.draft_tokens > 0, "{stats:?}");
}

fn stress(num_draft_tokens: usize) -> weft::engine::EngineStats {
    // 64 requests through max_batch 8: random prompt lengths and max_tokens, a third sampled
    // with random params, ~30% cancelled at a random point. Every request must end with exactly
    // one final event and greedy survivors must equal their single-sequence result.
    let engine = start("llama-4bit", EngineConfig { max_batch: 8, prefill_step_size: 16, num_draft_tokens, ..Default::default() });
    let single = load_exact(&tiny_model_dir("llama-4bit")).unwrap();
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = move |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    let mut jobs = Vec::new();
    for i in 0..64u64 {
        let len = 1 + next(40) as usize;
        let prompt: Vec<u32> = (0..len).map(|_| next(512) as u32).collect();
        let max_tokens = 1 + next(24) as usize;
        let sampled = next(3) == 0;
        let mut req = greedy(prompt.clone(), max_tokens);
        if sampled {
            req.sampling = SamplingParams {
                temperature: 0.2 + next(10) as f32 / 10.0,
                top_p: 0.5 + next(50) as f32 / 100.0,
                top_k: next(20) as u32,
                min_p: next(2) as f32 * 0.05,
                repetition_penalty: Some(1.0 + next(5) as f32 / 10.0),
                seed: Some(i),
                ..Default::default()
            };
        }
        let cancel_after = if next(10) < 3 { Some(next(max_tokens as u64) as usize) } else { None };
        let (id, rx) = engine.submit_channel(req).unwrap();
        jobs.push((id, rx, prompt, max_tokens, sampled, cancel_after));
    }
    // One consumer thread per request, cancelling from its own thread when its turn comes.
    let engine = Arc::new(engine);
    let consumers: Vec<_> = jobs
        .into_iter()
        .map(|(id, rx, prompt, max_tokens, sampled, cancel_after)| {
            let engine = Arc::clone(&engine);
            let handle = std::thread::spawn(move || {
                if cancel_after == Some(0) {
                    engine.cancel(id);
                }
                let mut tokens = Vec::new();
                loop {
                    match rx.recv_timeout(Duration::from_secs(120)).expect("stress: no event within 120 s (hang?)") {
                        Event::Token { token_id, .. } => {
                            tokens.push(token_id);
                            if Some(tokens.len()) == cancel_after {
                                engine.cancel(id);
                            }
                        }
                        Event::Done { finish_reason, usage, .. } => {
                            assert_eq!(tokens.len(), usage.completion_tokens);
                            assert!(rx.recv_timeout(Duration::from_millis(20)).is_err(), "events after the final one");
                            return (tokens, finish_reason);
                        }
                        Event::Started { .. } => {}
                        Event::Error { message } => panic!("request {id} failed: {message}"),
                    }
                }
            });
            (handle, id, prompt, max_tokens, sampled)
        })
        .collect();
    let mut cancelled = 0;
    for (handle, id, prompt, max_tokens, sampled) in consumers {
        let (tokens, finish) = handle.join().expect("consumer thread");
        if finish == FinishReason::Cancelled {
            cancelled += 1;
            continue;
        }
        assert_eq!(tokens.len(), max_tokens);
        if !sampled {
            let opts = GenerateOptions { max_tokens, ..Default::default() };
            let solo = generate(single.model.as_ref(), None, &prompt, &opts, |_| true).unwrap();
            assert_eq!(tokens, solo.tokens, "greedy request {id}");
        }
    }
    assert!(cancelled > 5, "only {cancelled} cancellations happened");
    let stats = settled_stats(&engine, |s| s.requests_finished == 64);
    assert_eq!((stats.active_rows, stats.prefilling_rows, stats.queued_rows), (0, 0, 0), "{stats:?}");
    assert_eq!(stats.requests_finished, 64);
    stats
}

/// A model that fails whenever a forward pass carries `fail_rows` rows.
struct FailsAtBatchSize {
    inner: Box<dyn weft::models::LanguageModel>,
    fail_rows: i32,
}

impl weft::models::LanguageModel for FailsAtBatchSize {
    fn forward(&self, tokens: &mlx_rs::Array, caches: &mut [Box<dyn weft::cache::KvCache>]) -> weft::Result<mlx_rs::Array> {
        if tokens.dim(0) == self.fail_rows {
            return Err(weft::Error::Mlx("injected failure".into()));
        }
        self.inner.forward(tokens, caches)
    }
    fn make_caches(&self) -> Vec<Box<dyn weft::cache::KvCache>> {
        self.inner.make_caches()
    }
    fn info(&self) -> &weft::models::ModelInfo {
        self.inner.info()
    }
}

#[test]
fn a_failed_forward_fails_its_rows_and_the_engine_keeps_serving() {
    let mut loaded = load_exact(&tiny_model_dir("llama-fp32")).unwrap();
    loaded.model = Box::new(FailsAtBatchSize { inner: loaded.model, fail_rows: 3 });
    let engine = Engine::start(loaded, EngineConfig::default()).unwrap();
    let streams: Vec<_> = (0..3).map(|i| engine.submit_channel(greedy(vec![i + 1, 7, 9], 30)).unwrap().1).collect();
    let outs: Vec<Outcome> = streams.iter().map(collect).collect();
    for o in &outs {
        assert_eq!(o.finals, 1);
        assert!(o.error.as_deref().is_some_and(|m| m.contains("injected failure")), "{o:?}");
    }
    // The engine is still serving.
    let g = golden("llama-fp32");
    let after = collect(&engine.submit_channel(greedy(ids(&g["single"][1]["prompt_ids"]), 24)).unwrap().1);
    assert_eq!(after.tokens, ids(&g["single"][1]["tokens"]));
}

#[test]
fn default_model_chat_with_stop_string_through_the_engine() {
    let Some(path) = default_model() else { return };
    let engine = Engine::start(load_exact(&path).unwrap(), EngineConfig::default()).unwrap();
    let messages = vec![weft::tokenizer::ChatMessage::new("user", "What is the capital of France?")];
    let plain = Request { max_tokens: 32, ..Request::new(Input::Messages(messages.clone())) };
    let stopped = Request { stop: vec!["Paris".into()], ..plain.clone() };
    let texts: Vec<(String, Outcome)> = [plain, stopped]
        .into_iter()
        .map(|r| engine.submit_channel(r).unwrap().1)
        .collect::<Vec<_>>()
        .iter()
        .map(|rx| {
            let mut text = String::new();
            let mut o = Outcome::default();
            loop {
                match rx.recv_timeout(Duration::from_secs(120)).unwrap() {
                    Event::Token { text: t, token_id, .. } => {
                        text.push_str(&t);
                        o.tokens.push(token_id);
                    }
                    Event::Done { finish_reason, usage, text: tail, .. } => {
                        text.push_str(&tail);
                        o.finish = Some(finish_reason);
                        o.usage = usage;
                        break;
                    }
                    Event::Started { .. } => {}
                    Event::Error { message } => panic!("{message}"),
                }
            }
            (text, o)
        })
        .collect();
    let g = golden("smollm2");
    assert_eq!(texts[0].0, g["chats"][0]["text"].as_str().unwrap());
    assert_eq!(texts[0].1.finish, Some(FinishReason::Stop));
    assert_eq!(texts[0].1.usage.prompt_tokens, ids(&g["chats"][0]["prompt_ids"]).len());
    assert_eq!(texts[1].0, "The capital of France is ");
    assert_eq!(texts[1].1.finish, Some(FinishReason::Stop));
}

#[test]
fn token_logprobs_match_mlx_lm_first_step() {
    let g = golden("llama-fp32");
    let case = &g["single"][2];
    let want_lp = floats(&case["first_logprobs"]);
    let engine = start("llama-fp32", EngineConfig::default());
    // A companion row keeps the batch busy so the logprobs row goes through batched decode too.
    let _companion = engine.submit_channel(greedy(vec![4, 5, 6], 24)).unwrap();
    let req = Request { logprobs: Some(3), ..greedy(ids(&case["prompt_ids"]), 6) };
    let (_, rx) = engine.submit_channel(req).unwrap();
    let mut seen = Vec::new();
    loop {
        match rx.recv_timeout(Duration::from_secs(60)).unwrap() {
            Event::Token { token_id, logprobs, .. } => seen.push((token_id, logprobs.expect("logprobs requested"))),
            Event::Done { .. } => break,
            Event::Started { .. } => {}
            Event::Error { message } => panic!("{message}"),
        }
    }
    assert_eq!(seen.iter().map(|(t, _)| *t).collect::<Vec<_>>(), ids(&case["tokens"])[..6]);
    let (first, lp) = &seen[0];
    assert_eq!(lp.logprob, want_lp[*first as usize]);
    assert_eq!(lp.top.len(), 3);
    for (t, lp) in &seen {
        // Greedy: the chosen token is the most likely one, and alternatives come best first.
        assert_eq!(lp.top[0], (*t, lp.logprob));
        assert!(lp.top.windows(2).all(|w| w[0].1 >= w[1].1));
    }
}

#[test]
fn greedy_rows_are_identical_on_the_vectorized_and_per_row_paths() {
    // With a sampled row in the batch every step takes the per-row path; the greedy rows must
    // still match the goldens the vectorized path reproduces.
    let g = golden("llama-bf16");
    let engine = start("llama-bf16", EngineConfig::default());
    let sampled = Request {
        sampling: SamplingParams { temperature: 1.0, seed: Some(3), ..Default::default() },
        ..greedy(vec![9, 8, 7], 40)
    };
    let noise = engine.submit_channel(sampled).unwrap().1;
    let cases: Vec<&Value> = g["single"].as_array().unwrap().iter().take(4).collect();
    let streams: Vec<_> = cases.iter().map(|c| engine.submit_channel(greedy(ids(&c["prompt_ids"]), 24)).unwrap().1).collect();
    for (c, rx) in cases.iter().zip(&streams) {
        assert_eq!(collect(rx).tokens, ids(&c["tokens"]));
    }
    collect(&noise);
}

#[test]
fn a_panicking_consumer_fails_running_rows_but_not_the_engine() {
    let engine = start("llama-fp32", EngineConfig::default());
    let bomb = Request { ..greedy(vec![1, 2, 3], 10) };
    let (tx, rx) = std::sync::mpsc::channel();
    engine
        .submit(bomb, Box::new(move |ev: &Event| {
            let _ = tx.send(ev.clone());
            if matches!(ev, Event::Token { .. }) {
                panic!("consumer bug");
            }
            true
        }))
        .unwrap();
    // The panicking row ends (its error event may not be deliverable through the same sink);
    // the engine must keep serving new requests.
    let _ = rx.recv_timeout(Duration::from_secs(30));
    let g = golden("llama-fp32");
    let after = collect(&engine.submit_channel(greedy(ids(&g["single"][1]["prompt_ids"]), 24)).unwrap().1);
    assert_eq!(after.tokens, ids(&g["single"][1]["tokens"]));
    assert_eq!(settled_stats(&engine, |s| s.active_rows == 0).active_rows, 0);
}

#[test]
fn default_model_second_turn_with_prompt_cache_equals_without() {
    // Turn 2 of a chat reuses turn 1's KV from the prompt cache; its tokens must equal a cold run.
    let Some(path) = default_model() else { return };
    let msg = |role: &str, text: &str| weft::tokenizer::ChatMessage::new(role, text);
    let run = |engine: &Engine, messages: Vec<weft::tokenizer::ChatMessage>| {
        let req = Request { max_tokens: 24, ..Request::new(Input::Messages(messages)) };
        let rx = engine.submit_channel(req).unwrap().1;
        let mut text = String::new();
        loop {
            match rx.recv_timeout(Duration::from_secs(120)).unwrap() {
                Event::Token { text: t, .. } => text.push_str(&t),
                Event::Done { usage, text: tail, .. } => return (text + &tail, usage),
                Event::Started { .. } => {}
                Event::Error { message } => panic!("{message}"),
            }
        }
    };
    // Weft against itself (no golden): the fast kernels, as `weft run` uses them.
    let load = || loading::load(&path).unwrap();
    let cached = Engine::start(load(), EngineConfig { prompt_cache_bytes: 256 << 20, ..Default::default() }).unwrap();
    let first = vec![msg("user", "What is the capital of France?")];
    let (answer, _) = run(&cached, first.clone());
    let mut second = first;
    second.push(msg("assistant", &answer));
    second.push(msg("user", "And of Italy?"));
    let (warm, warm_usage) = run(&cached, second.clone());
    assert!(warm_usage.cached_tokens > 0, "{warm_usage:?}");
    drop(cached);
    let cold_engine = Engine::start(load(), EngineConfig::default()).unwrap();
    let (cold, cold_usage) = run(&cold_engine, second);
    assert_eq!(cold_usage.cached_tokens, 0);
    assert_eq!(warm, cold);
}

#[test]
fn repeated_prompts_hitting_the_prompt_cache_match_cold_runs() {
    for name in ["llama-fp32", "llama-4bit"] {
        let g = golden(name);
        let engine = start(name, EngineConfig { prompt_cache_bytes: 64 << 20, ..Default::default() });
        for case in g["single"].as_array().unwrap().iter().take(4) {
            for round in 0..3 {
                let out = collect(&engine.submit_channel(greedy(ids(&case["prompt_ids"]), 12)).unwrap().1);
                assert_eq!(out.tokens, ids(&case["tokens"])[..12], "{name} round {round} cached {}", out.usage.cached_tokens);
            }
        }
    }
}

#[test]
fn default_model_repeated_chat_with_prompt_cache_matches_the_golden() {
    let Some(path) = default_model() else { return };
    let g = golden("smollm2");
    let engine = Engine::start(load_exact(&path).unwrap(), EngineConfig { prompt_cache_bytes: 256 << 20, ..Default::default() }).unwrap();
    for chat in g["chats"].as_array().unwrap() {
        let want = ids(&chat["tokens"]);
        for round in 0..3 {
            let req = Request { max_tokens: 48, ignore_eos: false, ..greedy(ids(&chat["prompt_ids"]), 48) };
            let out = collect(&engine.submit_channel(req).unwrap().1);
            assert_eq!(out.tokens, want, "round {round}, cached {}", out.usage.cached_tokens);
            if round > 0 {
                assert_eq!(out.usage.cached_tokens, want.len().min(1).max(ids(&chat["prompt_ids"]).len() - 1));
            }
        }
    }
}

/// A consumer that pauses its row after every token holds back only that row: the others run
/// to completion meanwhile, the paused row is parked (counted in stats), and when resumed it
/// continues exactly where it stopped (goldens); a parked row can be cancelled.
#[test]
fn a_paused_consumer_holds_back_only_its_own_row() {
    use weft::engine::RowFlow;
    let g = golden("llama-fp32");
    let engine = start("llama-fp32", EngineConfig::default());
    let cases: Vec<&Value> = g["single"].as_array().unwrap().iter().take(4).collect();
    let slow = |req: Request| {
        let flow = RowFlow::new();
        let (tx, rx) = std::sync::mpsc::channel();
        let pause = flow.clone();
        let id = engine
            .submit_with_flow(req, Box::new(move |ev: &Event| {
                pause.pause();
                tx.send(ev.clone()).is_ok()
            }), flow.clone())
            .unwrap();
        (id, rx, flow)
    };
    let (_, slow_rx, slow_flow) = slow(greedy(ids(&cases[0]["prompt_ids"]), 24));
    let (parked_id, parked_rx, _parked_flow) = slow(greedy(ids(&cases[1]["prompt_ids"]), 24));
    let fast: Vec<_> = cases[2..].iter().map(|c| engine.submit_channel(greedy(ids(&c["prompt_ids"]), 24)).unwrap()).collect();
    for ((_, rx), c) in fast.iter().zip(&cases[2..]) {
        assert_eq!(collect(rx).tokens, ids(&c["tokens"]));
    }
    let stats = settled_stats(&engine, |s| s.paused_rows == 2 && s.active_rows == 0);
    assert_eq!((stats.paused_rows, stats.active_rows), (2, 0), "{stats:?}");
    // While the fast rows ran, the paused rows produced at most a pipelined step or two.
    let early: Vec<Event> = slow_rx.try_iter().collect();
    let early_tokens = early.iter().filter(|e| matches!(e, Event::Token { .. })).count();
    assert!(early_tokens >= 1 && early_tokens <= 3, "{early_tokens} tokens before resuming");

    engine.cancel(parked_id);
    let cancelled = collect(&parked_rx);
    assert_eq!(cancelled.finish, Some(FinishReason::Cancelled));

    // Resume after each event until the row ends: same tokens as never pausing.
    let mut tokens: Vec<u32> =
        early.iter().filter_map(|e| if let Event::Token { token_id, .. } = e { Some(*token_id) } else { None }).collect();
    loop {
        slow_flow.resume();
        match slow_rx.recv_timeout(Duration::from_secs(60)).expect("the resumed row makes progress") {
            Event::Token { token_id, .. } => tokens.push(token_id),
            Event::Done { finish_reason, .. } => {
                assert_eq!(finish_reason, FinishReason::Length);
                break;
            }
            Event::Started { .. } => {}
            Event::Error { message } => panic!("{message}"),
        }
    }
    assert_eq!(tokens, ids(&cases[0]["tokens"]));
    let stats = settled_stats(&engine, |s| s.paused_rows == 0 && s.requests_finished == 4);
    assert_eq!((stats.paused_rows, stats.requests_finished), (0, 4));
}

/// Enqueues every prompt at once into `core` and runs it to idle (a deterministic burst:
/// nothing decodes before the first prefill).
fn burst_into(core: &mut weft::engine::EngineCore, prep: &Preparer, first_id: u64, prompts: &[Vec<u32>], max_tokens: usize) -> Vec<Outcome> {
    let outs: Vec<Arc<Mutex<Outcome>>> = prompts.iter().map(|_| Arc::default()).collect();
    for (i, p) in prompts.iter().enumerate() {
        let out = Arc::clone(&outs[i]);
        let sink = Box::new(move |ev: &Event| {
            out.lock().unwrap().record(ev);
            true
        });
        let req = Request { capture_first_logits: 16, ..greedy(p.clone(), max_tokens) };
        core.enqueue(prep.submission(first_id + i as u64, req, sink).unwrap());
    }
    for _ in 0..10_000 {
        if core.is_idle() {
            return outs.iter().map(|o| o.lock().unwrap().clone()).collect();
        }
        core.iterate();
    }
    panic!("the burst did not finish");
}

fn burst(name: &str, prompts: &[Vec<u32>], prefill_step_size: usize, max_tokens: usize) -> (Vec<Outcome>, weft::engine::EngineStats) {
    let model = load_exact(&tiny_model_dir(name)).unwrap();
    let config = EngineConfig { prefill_step_size, ..Default::default() };
    let prep = Preparer::new(&model, config.clone()).with_eos_token_ids(Vec::new());
    let mut core = weft::engine::EngineCore::new(model, config);
    let outs = burst_into(&mut core, &prep, 1, prompts, max_tokens);
    (outs, core.stats())
}

/// Single-sequence greedy runs of `prompts` (tokens and 16 leading first-step logits).
fn solo_runs(name: &str, prompts: &[Vec<u32>], max_tokens: usize) -> Vec<weft::generate::Generation> {
    let single = load_exact(&tiny_model_dir(name)).unwrap();
    let opts = GenerateOptions { max_tokens, capture_first_logits: 16, ..Default::default() };
    prompts.iter().map(|p| generate(single.model.as_ref(), None, p, &opts, |_| true).unwrap()).collect()
}

fn assert_like_solo(what: &str, outs: &[Outcome], want: &[weft::generate::Generation]) {
    for (i, (out, w)) in outs.iter().zip(want).enumerate() {
        assert_eq!(out.finals, 1, "{what}, row {i}");
        assert_eq!(out.tokens, w.tokens, "{what}, row {i}");
        assert_eq!(out.first_logits.len(), 16, "{what}, row {i}");
        let worst = out.first_logits.iter().zip(&w.first_logits).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(worst <= 1e-5, "{what}, row {i}: first logits differ by {worst}");
    }
}

#[test]
fn a_burst_of_different_lengths_prefills_as_one_batch_with_single_sequence_results() {
    let prompts: Vec<Vec<u32>> = vec![
        vec![3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46, 26, 43],
        vec![27, 18, 28],
        vec![1, 41, 42, 13, 56, 2, 7],
        vec![9],
        vec![61, 80, 33, 98, 5, 11, 60, 24, 71],
    ];
    let want = solo_runs("llama-fp32", &prompts, 6);
    let real_tokens: u64 = prompts.iter().map(|p| p.len() as u64 - 1).sum();
    // One chunk covers every prompt: the whole burst is one forward. Chunks of 4 take
    // ceil(12 / 4) = 3 forwards (the longest prompt's), however many rows there are.
    for (step, forwards) in [(2048, 1), (4, 3)] {
        let (outs, stats) = burst("llama-fp32", &prompts, step, 6);
        assert_eq!(stats.prefill_forwards, forwards, "step {step}");
        assert_eq!(stats.prefill_tokens, real_tokens, "step {step}");
        assert_like_solo(&format!("step {step}"), &outs, &want);
    }
}

#[test]
fn a_prompt_cache_hit_prefills_together_with_a_fresh_row() {
    let base: Vec<u32> = vec![3, 14, 15, 92, 65, 35, 89, 79];
    let longer: Vec<u32> = base.iter().copied().chain([32, 38, 46, 26, 43]).collect();
    let fresh: Vec<u32> = vec![27, 18, 28, 1, 41, 42];
    let model = load_exact(&tiny_model_dir("llama-fp32")).unwrap();
    let config = EngineConfig { prompt_cache_bytes: 1 << 24, ..Default::default() };
    let prep = Preparer::new(&model, config.clone()).with_eos_token_ids(Vec::new());
    let mut core = weft::engine::EngineCore::new(model, config);
    burst_into(&mut core, &prep, 1, &[base], 4);
    let before = core.stats();
    // `longer` reuses `base`'s KV and prefills its last 4 tokens (minus the final one) next to
    // `fresh`'s 5: different lengths and different cached offsets in one forward.
    let outs = burst_into(&mut core, &prep, 2, &[longer.clone(), fresh.clone()], 6);
    let after = core.stats();
    assert_eq!(after.prompt_cache_hits - before.prompt_cache_hits, 1);
    assert_eq!(after.prefill_forwards - before.prefill_forwards, 1);
    assert!(outs[0].usage.cached_tokens > 0, "{:?}", outs[0].usage);
    assert_eq!(after.prefill_tokens - before.prefill_tokens, (longer.len() - 1 - outs[0].usage.cached_tokens + fresh.len() - 1) as u64);
    assert_like_solo("prompt-cache hit + fresh row", &outs, &solo_runs("llama-fp32", &[longer, fresh], 6));
}

#[test]
fn ring_buffer_caches_fall_back_to_solo_prefill() {
    // Gemma 3's sliding-window layers keep ring buffers, which prefill alone: one forward per row.
    let prompts: Vec<Vec<u32>> = vec![vec![3, 14, 15, 92], vec![27, 18, 28, 1, 2, 3]];
    let (outs, stats) = burst("gemma3-text", &prompts, 2048, 2);
    assert_eq!(stats.prefill_forwards, 2);
    assert!(outs.iter().all(|o| o.finals == 1 && o.error.is_none() && o.tokens.len() == 2));
}

/// Runs `reqs` through an `EngineCore` over `name` with `config`; request `i` is enqueued
/// before iteration `at[i]` (later ones join a running batch). `eos` are the stop ids.
fn staggered(
    name: &str,
    config: EngineConfig,
    reqs: &[Request],
    at: &[usize],
    eos: &[u32],
) -> (Vec<Outcome>, weft::engine::EngineStats) {
    let model = load_exact(&tiny_model_dir(name)).unwrap();
    let prep = Preparer::new(&model, config.clone()).with_eos_token_ids(eos.to_vec());
    run_staggered(weft::engine::EngineCore::new(model, config), &prep, reqs, at)
}

/// [`staggered`] with the goldens model `draft` drafting for `name`.
fn staggered_draft(name: &str, draft: &str, config: EngineConfig, reqs: &[Request], at: &[usize]) -> (Vec<Outcome>, weft::engine::EngineStats) {
    let model = load_exact(&tiny_model_dir(name)).unwrap();
    let vocab = model.model.info().vocab_size;
    let drafter = weft::engine::Drafter::new(load_exact(&tiny_model_dir(draft)).unwrap().model, vocab).unwrap();
    let prep = Preparer::new(&model, config.clone()).with_eos_token_ids(Vec::new());
    let core = weft::engine::EngineCore::new(model, config).with_drafter(Some(drafter));
    run_staggered(core, &prep, reqs, at)
}

fn run_staggered(
    mut core: weft::engine::EngineCore,
    prep: &Preparer,
    reqs: &[Request],
    at: &[usize],
) -> (Vec<Outcome>, weft::engine::EngineStats) {
    let outs: Vec<Arc<Mutex<Outcome>>> = reqs.iter().map(|_| Arc::default()).collect();
    for it in 0..10_000 {
        for (i, req) in reqs.iter().enumerate().filter(|(i, _)| at[*i] == it) {
            let out = Arc::clone(&outs[i]);
            let sink = Box::new(move |ev: &Event| {
                out.lock().unwrap().record(ev);
                true
            });
            core.enqueue(prep.submission(i as u64 + 1, req.clone(), sink).unwrap());
        }
        if it > at.iter().copied().max().unwrap_or(0) && core.is_idle() {
            return (outs.iter().map(|o| o.lock().unwrap().clone()).collect(), core.stats());
        }
        core.iterate();
    }
    panic!("the run did not finish");
}

/// A prompt that repeats itself where `name` (a tiny random model) goes on repeating: a block,
/// the model's own greedy continuation of it, then the block again, so prompt-lookup drafts
/// taken from the first continuation get accepted where the model repeats it.
fn repetitive_prompt(name: &str) -> Vec<u32> {
    let block = [3u32, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46];
    let (out, _) = staggered(name, EngineConfig::default(), &[greedy(block.to_vec(), 40)], &[0], &[]);
    block.iter().chain(&out[0].tokens).chain(&block).copied().collect()
}

const SPEC_PROMPTS: &[&[u32]] = &[&[27, 18, 28, 1, 41, 42, 13], &[9], &[61, 80, 33, 98, 5, 11, 60, 24, 71, 61, 80, 33]];

/// Greedy rows with prompt-lookup speculation produce the tokens of plain decoding, alone and
/// in a batch whose rows join while others decode (some with drafts, some without), on prompts
/// that repeat themselves (drafts accepted) and prompts that do not.
#[test]
fn speculative_greedy_rows_are_token_exact_alone_and_batched() {
    // The tiny qwen3 and qwen2 models repeat their own output (drafts accepted); the tiny llama
    // does not (drafts rejected, exactness still holds).
    for (name, repeats) in [("qwen3", true), ("qwen2", true), ("llama-fp32", false)] {
        let prompts: Vec<Vec<u32>> = std::iter::once(repetitive_prompt(name)).chain(SPEC_PROMPTS.iter().map(|p| p.to_vec())).collect();
        let reqs: Vec<Request> = prompts.iter().map(|p| greedy(p.clone(), 40)).collect();
        let plain = EngineConfig::default();
        let spec = EngineConfig { num_draft_tokens: 4, ..Default::default() };
        // Alone.
        for (i, r) in reqs.iter().enumerate() {
            let (want, _) = staggered(name, plain.clone(), std::slice::from_ref(r), &[0], &[]);
            let (got, stats) = staggered(name, spec.clone(), std::slice::from_ref(r), &[0], &[]);
            assert_eq!(got[0].tokens, want[0].tokens, "{name}: prompt {i} alone");
            assert_eq!((got[0].finals, got[0].finish), (1, Some(FinishReason::Length)), "{name}: prompt {i}");
            assert!(stats.speculation_off.is_none(), "{name}: {:?}", stats.speculation_off);
            if i == 0 && repeats {
                assert!(stats.draft_tokens_accepted > 0, "{name}: no draft accepted on the repetitive prompt: {stats:?}");
                assert!(stats.decode_steps < 39, "{name}: speculation saved no steps ({} steps)", stats.decode_steps);
            }
        }
        // Batched, with continuous joins; one row asks for no drafts.
        let mut reqs = reqs;
        reqs[2].num_draft_tokens = Some(0);
        let at = [0, 0, 3, 7];
        let (want, _) = staggered(name, plain.clone(), &reqs, &at, &[]);
        let (got, stats) = staggered(name, spec.clone(), &reqs, &at, &[]);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.tokens, w.tokens, "{name}: batched row {i}");
            assert_eq!(g.finals, 1);
        }
        assert!(stats.draft_tokens > 0, "{name}: {stats:?}");
        if repeats {
            assert!(stats.draft_tokens_accepted > 0 && stats.draft_acceptance_rate > 0.0, "{name}: {stats:?}");
        }
    }
}

/// Rows of a batch that accept different numbers of draft tokens each step (one copies, one
/// rarely matches its drafts, one joins late) keep exact KV: the output equals plain decoding's
/// over many steps (the rejected positions leave each row's cache as holes, not shifts).
#[test]
fn rows_accepting_different_counts_stay_token_exact() {
    let name = "qwen3";
    let prompts: Vec<Vec<u32>> = vec![repetitive_prompt(name), SPEC_PROMPTS[0].to_vec(), SPEC_PROMPTS[2].to_vec(), repetitive_prompt(name)[5..].to_vec()];
    let reqs: Vec<Request> = prompts.iter().map(|p| greedy(p.clone(), 80)).collect();
    let at = [0, 0, 0, 9];
    let (want, _) = staggered(name, EngineConfig::default(), &reqs, &at, &[]);
    let (got, stats) = staggered(name, EngineConfig { num_draft_tokens: 6, ..Default::default() }, &reqs, &at, &[]);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.tokens, w.tokens, "row {i}");
    }
    assert!(stats.draft_tokens_accepted > 0 && stats.draft_tokens_accepted < stats.draft_tokens, "{stats:?}");
}

/// A draft model drafting greedy rows (for itself, for a sibling with the same vocabulary, and
/// for a model it drafts badly for) gives plain decoding's tokens exactly, alone and batched
/// with joins and a row that asks for no drafts; a model drafting for itself is accepted
/// (nearly) always.
#[test]
fn draft_model_greedy_rows_are_token_exact_alone_and_batched() {
    for (name, draft) in [("qwen3", "qwen3"), ("qwen2", "qwen3"), ("llama-fp32", "qwen3")] {
        let prompts: Vec<Vec<u32>> = std::iter::once(repetitive_prompt(name)).chain(SPEC_PROMPTS.iter().map(|p| p.to_vec())).collect();
        let reqs: Vec<Request> = prompts.iter().map(|p| greedy(p.clone(), 30)).collect();
        let spec = EngineConfig { num_draft_tokens: 4, ..Default::default() };
        for (i, r) in reqs.iter().enumerate() {
            let (want, _) = staggered(name, EngineConfig::default(), std::slice::from_ref(r), &[0], &[]);
            let (got, stats) = staggered_draft(name, draft, spec.clone(), std::slice::from_ref(r), &[0]);
            assert_eq!(got[0].tokens, want[0].tokens, "{name} drafted by {draft}: prompt {i} alone");
            assert!(stats.draft_tokens > 0, "{name}: {stats:?}");
            if name == draft {
                assert!(stats.draft_acceptance_rate > 0.9, "{name} drafting for itself: {stats:?}");
                assert!(stats.decode_steps <= 8, "{name} drafting for itself: {} steps for 30 tokens", stats.decode_steps);
            }
        }
        let mut reqs = reqs;
        reqs[2].num_draft_tokens = Some(0);
        let at = [0, 0, 3, 7];
        let (want, _) = staggered(name, EngineConfig::default(), &reqs, &at, &[]);
        let (got, stats) = staggered_draft(name, draft, spec.clone(), &reqs, &at);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.tokens, w.tokens, "{name} drafted by {draft}: batched row {i}");
            assert_eq!(g.finals, 1);
        }
        if name == draft {
            assert!(stats.draft_acceptance_rate > 0.9, "{name} drafting for itself, batched: {stats:?}");
        }
    }
}

/// Sampled rows verify a draft model's drafts by rejection sampling with the draft's
/// probabilities: at `top_k = 1` both distributions are the argmax, so the tokens are greedy
/// plain decoding's; at temperature 1 the rows run to length with drafts verified and the
/// acceptance reported.
#[test]
fn draft_model_sampled_rows_verify_by_rejection_sampling() {
    let name = "qwen3";
    let sampled = |p: Vec<u32>, seed, top_k, temperature| Request {
        sampling: SamplingParams { temperature, top_k, seed: Some(seed), ..SamplingParams::default() },
        ..greedy(p, 30)
    };
    let prompts: Vec<Vec<u32>> = vec![repetitive_prompt(name), SPEC_PROMPTS[0].to_vec()];
    let (want, _) = staggered(name, EngineConfig::default(), &prompts.iter().map(|p| greedy(p.clone(), 30)).collect::<Vec<_>>(), &[0, 2], &[]);
    let config = EngineConfig { num_draft_tokens: 4, ..Default::default() };
    let reqs: Vec<Request> = prompts.iter().enumerate().map(|(i, p)| sampled(p.clone(), i as u64, 1, 0.7)).collect();
    let (got, stats) = staggered_draft(name, "qwen2", config.clone(), &reqs, &[0, 2]);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.tokens, w.tokens, "row {i}");
    }
    assert!(stats.draft_tokens > 0, "{stats:?}");
    let free: Vec<Request> = prompts.iter().enumerate().map(|(i, p)| sampled(p.clone(), i as u64, 0, 1.0)).collect();
    for draft in ["qwen3", "qwen2"] {
        let (got, stats) = staggered_draft(name, draft, config.clone(), &free, &[0, 2]);
        assert!(got.iter().all(|o| o.finals == 1 && o.error.is_none() && o.tokens.len() == 30), "{got:?}");
        // (A different random model's distribution barely overlaps this one's: few accepted.)
        assert!(stats.draft_tokens > 0, "{draft}: {stats:?}");
        if draft == name {
            // Drafting for itself, q equals p: every draft token is accepted.
            assert!(stats.draft_acceptance_rate > 0.9, "{stats:?}");
        }
    }
}

/// A draft model with another vocabulary is refused, with why, by the engine and the drafter.
#[test]
fn draft_model_with_another_vocabulary_is_refused() {
    let target = load_exact(&tiny_model_dir("qwen3")).unwrap();
    let config = EngineConfig { num_draft_tokens: 3, draft_model: Some(tiny_model_dir("mistral-fp32")), ..Default::default() };
    let err = Engine::start(target, config).err().expect("a draft model with another vocabulary was accepted").to_string();
    assert!(err.contains("vocabulary has 512 tokens") && err.contains("1024"), "{err}");
    // The same model's own directory is accepted.
    let target = load_exact(&tiny_model_dir("qwen3")).unwrap();
    let config = EngineConfig { num_draft_tokens: 3, draft_model: Some(tiny_model_dir("qwen2")), ..Default::default() };
    let engine = Engine::start(target, config).unwrap();
    let out = collect(&engine.submit_channel(greedy(SPEC_PROMPTS[0].to_vec(), 8)).unwrap().1);
    assert_eq!(out.tokens.len(), 8);
}

/// A stop id or `max_tokens` falling inside an accepted draft ends the row exactly where plain
/// decoding ends it: same tokens, same finish, nothing after.
#[test]
fn stops_and_length_limits_inside_drafts_end_rows_like_plain_decoding() {
    let name = "qwen3";
    let prompt = repetitive_prompt(name);
    let plain = EngineConfig::default();
    let spec = EngineConfig { num_draft_tokens: 6, ..Default::default() };
    let (full, _) = staggered(name, plain.clone(), &[greedy(prompt.clone(), 40)], &[0], &[]);
    let full = &full[0].tokens;
    let mut accepted = 0;
    for max_tokens in 1..=24 {
        let r = greedy(prompt.clone(), max_tokens);
        let (got, stats) = staggered(name, spec.clone(), std::slice::from_ref(&r), &[0], &[]);
        assert_eq!(got[0].tokens, full[..max_tokens], "max_tokens {max_tokens}");
        assert_eq!((got[0].finish, got[0].after_final), (Some(FinishReason::Length), 0));
        accepted += stats.draft_tokens_accepted;
    }
    assert!(accepted > 0, "no draft was accepted");
    // Each later token of the plain output as the stop id (with EOS honoured).
    for at in [3, 8, 15, 27] {
        let stop = full[at];
        let r = Request { ignore_eos: false, ..greedy(prompt.clone(), 40) };
        let (want, _) = staggered(name, plain.clone(), std::slice::from_ref(&r), &[0], &[stop]);
        let (got, _) = staggered(name, spec.clone(), std::slice::from_ref(&r), &[0], &[stop]);
        assert_eq!(got[0].tokens, want[0].tokens, "stop id {stop}");
        assert_eq!((got[0].finish, got[0].after_final), (Some(FinishReason::Stop), 0), "stop id {stop}");
        assert_eq!(got[0].tokens.len(), full.iter().position(|&t| t == stop).unwrap(), "stop id {stop}");
    }
}

/// Sampled rows take the rejection-sampling path; with `top_k = 1` their target distribution is
/// the argmax alone, so they must produce greedy plain decoding's tokens exactly.
#[test]
fn sampled_rows_verify_drafts_by_rejection_sampling() {
    let name = "qwen3";
    let sampled = |p: Vec<u32>, seed| Request {
        sampling: SamplingParams { temperature: 0.7, top_k: 1, seed: Some(seed), ..SamplingParams::default() },
        ..greedy(p, 30)
    };
    let prompts: Vec<Vec<u32>> = vec![repetitive_prompt(name), SPEC_PROMPTS[0].to_vec()];
    let (want, _) =
        staggered(name, EngineConfig::default(), &prompts.iter().map(|p| greedy(p.clone(), 30)).collect::<Vec<_>>(), &[0, 2], &[]);
    let reqs: Vec<Request> = prompts.iter().enumerate().map(|(i, p)| sampled(p.clone(), i as u64)).collect();
    let (got, stats) = staggered(name, EngineConfig { num_draft_tokens: 4, ..Default::default() }, &reqs, &[0, 2], &[]);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.tokens, w.tokens, "row {i}");
    }
    assert!(stats.draft_tokens_accepted > 0, "{stats:?}");
    // At a real temperature the rows still finish with their full length and drafts verified.
    let free: Vec<Request> = reqs
        .iter()
        .map(|r| Request { sampling: SamplingParams { top_k: 0, temperature: 1.0, ..r.sampling.clone() }, ..r.clone() })
        .collect();
    let (got, stats) = staggered(name, EngineConfig { num_draft_tokens: 4, ..Default::default() }, &free, &[0, 2], &[]);
    assert!(got.iter().all(|o| o.finals == 1 && o.error.is_none() && o.tokens.len() == 30), "{got:?}");
    assert!(stats.draft_tokens > 0, "{stats:?}");
}

/// Models whose caches cannot drop rejected positions (recurrent layers, sliding-window rings)
/// do not speculate: the engine says why and decodes plainly, with the same tokens.
#[test]
fn models_whose_caches_cannot_trim_do_not_speculate() {
    for name in ["qwen3_next", "gemma3-text"] {
        let reqs = [greedy(SPEC_PROMPTS[2].to_vec(), 12), greedy(SPEC_PROMPTS[0].to_vec(), 12)];
        let (want, _) = staggered(name, EngineConfig::default(), &reqs, &[0, 1], &[]);
        let (got, stats) = staggered(name, EngineConfig { num_draft_tokens: 4, ..Default::default() }, &reqs, &[0, 1], &[]);
        let why = stats.speculation_off.as_deref().unwrap_or_else(|| panic!("{name}: speculation not turned off"));
        assert!(why.contains("cannot drop"), "{name}: {why}");
        assert_eq!((stats.draft_tokens, stats.speculative_steps), (0, 0), "{name}");
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(g.tokens, w.tokens, "{name}");
        }
    }
}

/// On the default model (a real one), copying is the case prompt lookup is for: a text written
/// twice, which the model goes on repeating. Most drafts are accepted, the steps are fewer than
/// the tokens, and the output equals plain decoding's.
#[test]
fn default_model_copying_accepts_most_drafts_with_the_same_text() {
    let Some(path) = default_model() else { return };
    let text = "The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single step.\n";
    let req = Request { max_tokens: 48, ignore_eos: true, ..Request::new(Input::Prompt(text.repeat(2))) };
    let run = |config: EngineConfig| {
        let engine = Engine::start(load_exact(&path).unwrap(), config).unwrap();
        let out = collect(&engine.submit_channel(req.clone()).unwrap().1);
        let stats = settled_stats(&engine, |s| s.requests_finished == 1);
        (out, stats)
    };
    let (want, _) = run(EngineConfig::default());
    let (got, stats) = run(EngineConfig { num_draft_tokens: 8, ..Default::default() });
    assert_eq!(got.tokens, want.tokens);
    assert_eq!(got.text, want.text);
    assert_eq!(got.tokens.len(), 48);
    assert!(stats.draft_acceptance_rate > 0.5, "{:?}: {stats:?}", got.text);
    assert!(stats.decode_steps * 2 < 48, "{} steps for 48 tokens", stats.decode_steps);
}

/// A row that speculated leaves KV that holds exactly its tokens: a request extending its
/// prompt and output reuses it from the prompt cache and continues like a cold plain run.
#[test]
fn prompt_cache_entries_of_speculative_rows_continue_exactly() {
    let name = "qwen3";
    let first = repetitive_prompt(name);
    let (plain_first, _) = staggered(name, EngineConfig::default(), &[greedy(first.clone(), 12)], &[0], &[]);
    let second: Vec<u32> = first.iter().chain(&plain_first[0].tokens).chain(&[7, 8, 9]).copied().collect();
    let (want, _) = staggered(name, EngineConfig::default(), &[greedy(second.clone(), 16)], &[0], &[]);
    let config = EngineConfig { num_draft_tokens: 4, prompt_cache_bytes: 64 << 20, ..Default::default() };
    let (got, stats) = staggered(name, config, &[greedy(first, 12), greedy(second, 16)], &[0, 40], &[]);
    assert_eq!(got[0].tokens, plain_first[0].tokens);
    assert_eq!(got[1].tokens, want[0].tokens);
    assert_eq!(stats.prompt_cache_hits, 1, "{stats:?}");
    assert!(got[1].usage.cached_tokens > 0 && stats.draft_tokens_accepted > 0, "{:?} {stats:?}", got[1].usage);
}

// --- Multi-turn conversations through the prompt cache (boundary checkpoints).

/// A system prompt of about `chars` characters, in the shape of an agent's tool preamble.
fn agent_system_prompt(chars: usize) -> String {
    let line = "Tool read_file(path): returns the file's text. Tool run(cmd): runs a shell command. ";
    let mut s = String::from("You are a coding agent. ");
    while s.len() < chars {
        s.push_str(line);
    }
    s
}

/// One greedy chat turn; the outcome and the answer as the next turn's history gives it.
fn chat_turn(engine: &Engine, messages: &[weft::tokenizer::ChatMessage], max_tokens: usize) -> (Outcome, String) {
    let req = Request {
        max_tokens,
        sampling: SamplingParams::greedy(),
        ignore_eos: false,
        ..Request::new(Input::Messages(messages.to_vec()))
    };
    let out = collect(&engine.submit_channel(req).unwrap().1);
    assert_eq!(out.error, None);
    let answer = if out.text.trim().is_empty() { "(no answer)".to_string() } else { out.text.clone() };
    (out, answer)
}

/// Runs `turns` turns of one conversation on a cached engine and a cold one (no prompt cache):
/// every turn's tokens are equal, and from the second turn on at least 90% of the prompt
/// comes from the cache.
fn assert_multi_turn_exact(what: &str, model: &std::path::Path, config: EngineConfig, system_chars: usize, turns: usize) -> weft::engine::EngineStats {
    use weft::tokenizer::ChatMessage;
    let cached = Engine::start(loading::load(model).unwrap(), EngineConfig { prompt_cache_bytes: 64 << 20, ..config.clone() }).unwrap();
    let cold = Engine::start(loading::load(model).unwrap(), EngineConfig { prompt_cache_bytes: 0, ..config }).unwrap();
    let mut messages = vec![ChatMessage::new("system", &agent_system_prompt(system_chars)), ChatMessage::new("user", "List the files.")];
    for turn in 0..turns {
        let (warm, answer) = chat_turn(&cached, &messages, 6);
        let (want, _) = chat_turn(&cold, &messages, 6);
        assert_eq!(want.usage.cached_tokens, 0);
        assert_eq!(warm.tokens, want.tokens, "{what}: turn {turn} (cached {} of {})", warm.usage.cached_tokens, warm.usage.prompt_tokens);
        if turn > 0 {
            let (hit, all) = (warm.usage.cached_tokens, warm.usage.prompt_tokens);
            assert!(hit * 10 >= all * 9, "{what}: turn {turn} reused {hit} of {all} prompt tokens");
        }
        messages.push(ChatMessage::new("assistant", &answer));
        messages.push(ChatMessage::new("user", &format!("Now run step {turn}.")));
    }
    let stats = settled_stats(&cached, |s| s.prompt_cache_hits as usize >= turns - 1);
    assert!(stats.prompt_cache_hits as usize >= turns - 1 && stats.prompt_cache_cached_tokens > 0, "{what}: {stats:?}");
    assert!(stats.prompt_cache_bytes <= stats.prompt_cache_capacity_bytes, "{what}: {stats:?}");
    stats
}

#[test]
fn multi_turn_chats_reuse_the_previous_turn_on_every_cache_kind() {
    let kv8 = EngineConfig { kv_bits: Some(8), kv_group_size: 32, ..Default::default() };
    let cases: [(&str, &str, EngineConfig); 5] = [
        ("full attention", "llama-fp32", EngineConfig::default()),
        ("quantized KV", "llama-fp32", kv8.clone()),
        ("sliding window of 8", "gemma3-text", EngineConfig::default()),
        ("hybrid recurrent", "qwen3_5", EngineConfig::default()),
        ("hybrid recurrent, quantized KV", "qwen3_5", kv8),
    ];
    for (what, tiny, config) in cases {
        let dir = tempfile::tempdir().unwrap();
        let model = chatml_model(tiny, dir.path());
        // Prefilled in chunks shorter than the prompt too, so checkpoints fall inside chunks.
        for step in [2048, 96] {
            let config = EngineConfig { prefill_step_size: step, ..config.clone() };
            assert_multi_turn_exact(&format!("{what} ({tiny}, chunks of {step})"), &model, config, 1200, 4);
        }
    }
}

/// Chat-boundary checkpoints are found (two more renders and tokenizations of the
/// conversation) only where the executor snapshots rows at them: a model with caches that
/// cannot be cut back, the prompt cache on, a single process.
#[test]
fn chat_checkpoints_are_prepared_only_for_models_that_take_them() {
    use weft::tokenizer::ChatMessage;
    let messages = vec![ChatMessage::new("system", &agent_system_prompt(300)), ChatMessage::new("user", "List the files.")];
    let cached = EngineConfig { prompt_cache_bytes: 64 << 20, ..Default::default() };
    let prepared_with = |tiny: &str, config: &EngineConfig, lockstep: bool, messages: &[ChatMessage]| {
        let dir = tempfile::tempdir().unwrap();
        let model = loading::load(&chatml_model(tiny, dir.path())).unwrap();
        let prep = Preparer::new(&model, config.clone());
        let prep = if lockstep { prep.for_lockstep() } else { prep };
        let sub = prep.submission(1, Request::new(Input::Messages(messages.to_vec())), Box::new(|_: &Event| true)).unwrap();
        // Where the system prompt ends, as the template renders it alone.
        let tok = model.tokenizer.as_ref().unwrap();
        let system = tok.chat_template().unwrap().render(&messages[..1], false).unwrap();
        let system_end = tok.encode(&system, false).unwrap().len();
        (prep.checkpointing(), sub.checkpoints.clone(), system_end, sub.prompt.len())
    };
    let prepared = |tiny: &str, config: &EngineConfig, lockstep: bool| prepared_with(tiny, config, lockstep, &messages);
    // Full attention: a finished row's entry is cut back to any shared prefix, no checkpoints.
    let (on, checkpoints, _, _) = prepared("llama-fp32", &cached, false);
    assert!(!on && checkpoints.is_empty(), "{checkpoints:?}");
    // Hybrid recurrent: the end of the system prompt and of the last message.
    let (on, checkpoints, system_end, prompt_len) = prepared("qwen3_5", &cached, false);
    assert!(on, "a hybrid model checkpoints");
    assert_eq!(checkpoints.len(), 2, "{checkpoints:?}");
    assert_eq!(checkpoints[0], system_end);
    assert!(checkpoints[1] > system_end && checkpoints[1] < prompt_len, "{checkpoints:?} of {prompt_len}");
    // A long conversation: the system prompt, the latest 4 earlier messages and the last one.
    let mut long = messages.clone();
    for i in 0..10 {
        long.push(ChatMessage::new("assistant", &format!("Answer {i}.")));
        long.push(ChatMessage::new("user", &format!("Question {i}?")));
    }
    let (_, checkpoints, system_end, prompt_len) = prepared_with("qwen3_5", &cached, false, &long);
    assert_eq!(checkpoints.len(), 6, "{checkpoints:?}");
    assert_eq!(checkpoints[0], system_end);
    assert!(checkpoints.windows(2).all(|w| w[0] < w[1]) && checkpoints[5] < prompt_len, "{checkpoints:?}");
    // The latest boundaries: nothing between the system prompt and the 4th-last earlier message.
    let tok_dir = tempfile::tempdir().unwrap();
    let model = loading::load(&chatml_model("qwen3_5", tok_dir.path())).unwrap();
    let tok = model.tokenizer.as_ref().unwrap();
    let end_of = |k: usize| tok.encode(&tok.chat_template().unwrap().render(&long[..k], false).unwrap(), false).unwrap().len();
    assert_eq!(checkpoints[1..], [end_of(long.len() - 4), end_of(long.len() - 3), end_of(long.len() - 2), end_of(long.len() - 1), end_of(long.len())]);
    // The prompt cache off, or rank 0 of a rank group (followers never learn the boundaries).
    let off = EngineConfig { prompt_cache_bytes: 0, ..Default::default() };
    assert!(prepared("qwen3_5", &off, false).1.is_empty());
    let (on, checkpoints, _, _) = prepared("qwen3_5", &cached, true);
    assert!(!on && checkpoints.is_empty(), "{checkpoints:?}");
}

/// An agent that retries its last message, or drops its last turns, shares with the previous
/// request only a prefix ending at an earlier message: on caches that cannot be cut back
/// (recurrent state, a wrapped sliding-window ring) the checkpoint at that message's end serves
/// it, exactly.
#[test]
fn edited_or_dropped_last_messages_reuse_the_latest_earlier_message_checkpoint() {
    use weft::tokenizer::ChatMessage;
    let msg = |role: &str, text: &str| ChatMessage::new(role, text);
    for tiny in ["qwen3_5", "gemma3-text"] {
        let dir = tempfile::tempdir().unwrap();
        let model = chatml_model(tiny, dir.path());
        let cached = Engine::start(loading::load(&model).unwrap(), EngineConfig { prompt_cache_bytes: 64 << 20, ..Default::default() }).unwrap();
        let cold = Engine::start(loading::load(&model).unwrap(), EngineConfig { prompt_cache_bytes: 0, ..Default::default() }).unwrap();
        let loaded = loading::load(&model).unwrap();
        let tok = loaded.tokenizer.as_ref().unwrap();
        // Where the conversation up to message `k` ends, as the template renders it.
        let end_of = |messages: &[ChatMessage], k: usize| {
            tok.encode(&tok.chat_template().unwrap().render(&messages[..k], false).unwrap(), false).unwrap().len()
        };
        // A conversation sent whole (a client resuming it): its earlier messages are checkpointed.
        let history = vec![
            msg("system", &agent_system_prompt(600)),
            msg("user", "List the files."),
            msg("assistant", "README.md, src/main.rs and tests/run.rs."),
            msg("user", "Read src/main.rs and summarize it in detail, function by function."),
            msg("assistant", "It parses the arguments, reads the configuration file and starts the server loop."),
            msg("user", "Now run the tests."),
        ];
        let turns: [(&str, Vec<ChatMessage>, usize); 3] = [
            ("the first request", history.clone(), 0),
            // The last message retried with other words: the end of the answer before it.
            ("the last message edited", [&history[..5], &[msg("user", "Run only the fast tests.")]].concat(), 5),
            // The last two turns dropped and another question asked: the end of the first answer.
            ("the last turns dropped", [&history[..3], &[msg("user", "Which file is the largest?")]].concat(), 3),
        ];
        for (what, messages, shared) in turns {
            let (warm, _) = chat_turn(&cached, &messages, 6);
            let (want, _) = chat_turn(&cold, &messages, 6);
            assert_eq!(warm.tokens, want.tokens, "{tiny}: {what}");
            let expect = if shared == 0 { 0 } else { end_of(&messages, shared) };
            assert!(expect < warm.usage.prompt_tokens, "{tiny}: {what}");
            assert_eq!(warm.usage.cached_tokens, expect, "{tiny}: {what}: reused {:?}", warm.usage);
        }
    }
}

#[test]
fn multi_turn_chats_with_real_templates_reuse_the_previous_turn() {
    // Gemma 4's own template over sliding-window layers (window 8) and KV-shared layers.
    let dir = tempfile::tempdir().unwrap();
    let gemma = gemma4_chat_model(dir.path());
    assert_multi_turn_exact("gemma4 template", &gemma, EngineConfig::default(), 1200, 4);
    // Qwen3.5's thinking template drops the reasoning from history: the checkpoint at the end
    // of the last message is what the next turn shares.
    let dir = tempfile::tempdir().unwrap();
    let Some(qwen) = qwen35_chat_model(dir.path()) else { return };
    assert_multi_turn_exact("qwen3.5 template", &qwen, EngineConfig::default(), 3000, 4);
}

#[test]
fn the_prompt_cache_evicts_least_recently_used_entries_under_its_ceiling() {
    use weft::tokenizer::ChatMessage;
    let dir = tempfile::tempdir().unwrap();
    let model = chatml_model("qwen3_5", dir.path());
    let conversation = |topic: &str| vec![ChatMessage::new("system", &format!("{topic} {}", agent_system_prompt(600))), ChatMessage::new("user", "Go.")];
    // What one conversation's first turn leaves in the cache.
    let probe = Engine::start(loading::load(&model).unwrap(), EngineConfig { prompt_cache_bytes: 64 << 20, ..Default::default() }).unwrap();
    chat_turn(&probe, &conversation("A"), 4);
    let one = settled_stats(&probe, |s| s.requests_finished >= 1).prompt_cache_bytes;
    assert!(one > 0);
    // Room for a bit more than that: B's turn evicts A's entries.
    let capacity = one + one / 2;
    let engine = Engine::start(loading::load(&model).unwrap(), EngineConfig { prompt_cache_bytes: capacity, ..Default::default() }).unwrap();
    let cold = Engine::start(loading::load(&model).unwrap(), EngineConfig { prompt_cache_bytes: 0, ..Default::default() }).unwrap();
    for topic in ["A", "B", "A"] {
        let (out, _) = chat_turn(&engine, &conversation(topic), 4);
        let (want, _) = chat_turn(&cold, &conversation(topic), 4);
        assert_eq!(out.tokens, want.tokens, "{topic}");
        let stats = engine.stats();
        assert!(stats.prompt_cache_bytes <= capacity, "{stats:?}");
    }
    let stats = settled_stats(&engine, |s| s.requests_finished >= 3);
    assert!(stats.prompt_cache_evictions > 0, "{stats:?}");
}

#[test]
fn prompt_cache_entries_saved_to_disk_survive_a_restart_and_damaged_files_are_refused() {
    use weft::engine::{load_entry, CacheIdentity};
    use weft::tokenizer::ChatMessage;
    // A ring of sliding-window layers is saved in its storage order, and restored so.
    let gemma_dir = tempfile::tempdir().unwrap();
    assert_restart_reuses(&chatml_model("gemma3-text", gemma_dir.path()), EngineConfig::default());
    // Quantized KV is saved as its packed triples, under the KV quantization it was made with.
    let llama_dir = tempfile::tempdir().unwrap();
    let kv8 = EngineConfig { kv_bits: Some(8), kv_group_size: 32, ..Default::default() };
    assert_restart_reuses(&chatml_model("llama-fp32", llama_dir.path()), kv8);
    let model_dir = tempfile::tempdir().unwrap();
    let model = chatml_model("qwen3_5", model_dir.path());
    let files = tempfile::tempdir().unwrap();
    let config = EngineConfig { prompt_cache_bytes: 64 << 20, prompt_cache_dir: Some(files.path().to_path_buf()), ..Default::default() };
    let mut messages = vec![ChatMessage::new("system", &agent_system_prompt(1200)), ChatMessage::new("user", "List the files.")];
    // Turn 1 on one engine, saved at its shutdown.
    let first = Engine::start(loading::load(&model).unwrap(), config.clone()).unwrap();
    let (_, answer) = chat_turn(&first, &messages, 6);
    first.shutdown();
    let saved: Vec<std::path::PathBuf> = std::fs::read_dir(files.path()).unwrap().map(|e| e.unwrap().path()).collect();
    assert!(!saved.is_empty(), "nothing was saved");
    // Turn 2 on a new engine: the saved entries serve it, exactly.
    messages.push(ChatMessage::new("assistant", &answer));
    messages.push(ChatMessage::new("user", "Now run the tests."));
    let second = Engine::start(loading::load(&model).unwrap(), config.clone()).unwrap();
    let (warm, _) = chat_turn(&second, &messages, 6);
    let cold = Engine::start(loading::load(&model).unwrap(), EngineConfig { prompt_cache_bytes: 0, ..Default::default() }).unwrap();
    let (want, _) = chat_turn(&cold, &messages, 6);
    assert_eq!(warm.tokens, want.tokens);
    assert!(warm.usage.cached_tokens * 10 >= warm.usage.prompt_tokens * 9, "{:?}", warm.usage);
    assert!(second.stats().prompt_cache_files_refused.is_empty(), "{:?}", second.stats().prompt_cache_files_refused);
    second.shutdown();

    // Another model's numerics, a truncated file and a corrupt one are refused, saying why.
    let loaded = loading::load(&model).unwrap();
    let id = CacheIdentity::of(&loaded.source, &loaded.numerics);
    let file = std::fs::read_dir(files.path()).unwrap().map(|e| e.unwrap().path()).next().unwrap();
    let (tokens, caches) = load_entry(&file, &id).unwrap();
    assert_eq!(caches.iter().map(|c| c.len()).min(), Some(tokens.len()));
    let other = CacheIdentity { numerics: "another kernel mode".into(), ..id.clone() };
    let err = load_entry(&file, &other).err().unwrap().to_string();
    assert!(err.contains("saved for another numerics"), "{err}");
    let bytes = std::fs::read(&file).unwrap();
    let damaged = files.path().join("damaged.safetensors");
    std::fs::write(&damaged, &bytes[..bytes.len() - 7]).unwrap();
    let err = load_entry(&damaged, &id).err().unwrap().to_string();
    assert!(err.contains("truncated"), "{err}");
    let mut flipped = bytes.clone();
    let last = flipped.len() - 3;
    flipped[last] ^= 0x40;
    std::fs::write(&damaged, &flipped).unwrap();
    let err = load_entry(&damaged, &id).err().unwrap().to_string();
    assert!(err.contains("checksum"), "{err}");
    // An engine starting on that directory refuses the damaged file and still serves exactly.
    let third = Engine::start(loading::load(&model).unwrap(), config).unwrap();
    let (again, _) = chat_turn(&third, &messages, 6);
    assert_eq!(again.tokens, want.tokens);
    let refused = settled_stats(&third, |s| !s.prompt_cache_files_refused.is_empty()).prompt_cache_files_refused;
    assert!(refused.len() == 1 && refused[0].contains("damaged.safetensors"), "{refused:?}");
}

/// Turn 1 on an engine saving to a directory, turn 2 on a new engine loading it: turn 2 reuses
/// over 90% of its prompt and equals a cold run.
fn assert_restart_reuses(model: &std::path::Path, base: EngineConfig) {
    use weft::tokenizer::ChatMessage;
    let files = tempfile::tempdir().unwrap();
    let config = EngineConfig { prompt_cache_bytes: 64 << 20, prompt_cache_dir: Some(files.path().to_path_buf()), ..base.clone() };
    let mut messages = vec![ChatMessage::new("system", &agent_system_prompt(1200)), ChatMessage::new("user", "Go.")];
    let first = Engine::start(loading::load(model).unwrap(), config.clone()).unwrap();
    let (_, answer) = chat_turn(&first, &messages, 6);
    first.shutdown();
    messages.push(ChatMessage::new("assistant", &answer));
    messages.push(ChatMessage::new("user", "Next."));
    let second = Engine::start(loading::load(model).unwrap(), config).unwrap();
    let (warm, _) = chat_turn(&second, &messages, 6);
    assert!(second.stats().prompt_cache_files_refused.is_empty(), "{:?}", second.stats().prompt_cache_files_refused);
    let cold = Engine::start(loading::load(model).unwrap(), EngineConfig { prompt_cache_bytes: 0, ..base }).unwrap();
    let (want, _) = chat_turn(&cold, &messages, 6);
    assert_eq!(warm.tokens, want.tokens, "{}", model.display());
    assert!(warm.usage.cached_tokens * 10 >= warm.usage.prompt_tokens * 9, "{}: {:?}", model.display(), warm.usage);
}

#[test]
fn cached_entries_give_way_to_admitted_rows_under_the_kv_budget() {
    let loaded = load_exact(&tiny_model_dir("llama-fp32")).unwrap();
    let per_token = loaded.model.info().kv_bytes_per_token() as u64;
    // Room for one short request (256 positions projected) and 10 more positions: not for it
    // and a cached one (its 15 positions).
    let budget = per_token * (256 + 10);
    let config = EngineConfig { kv_budget_bytes: Some(budget), prompt_cache_bytes: 64 << 20, ..Default::default() };
    let engine = Engine::start(loaded, config).unwrap();
    let g = golden("llama-fp32");
    let a = ids(&g["single"][1]["prompt_ids"]);
    let b: Vec<u32> = a.iter().map(|t| (t + 1) % 512).collect();
    collect(&engine.submit_channel(greedy(a, 10)).unwrap().1);
    let held = settled_stats(&engine, |s| s.requests_finished >= 1 && s.prompt_cache_bytes > 0);
    assert!(held.prompt_cache_bytes > per_token * 10, "{held:?}");
    // B is admitted at once: A's entry is evicted to make room under the one ceiling.
    let out = collect(&engine.submit_channel(greedy(b.clone(), 10)).unwrap().1);
    assert_eq!(out.error, None);
    let stats = settled_stats(&engine, |s| s.requests_finished >= 2);
    assert!(stats.prompt_cache_evictions >= 1, "{stats:?}");
    let single = load_exact(&tiny_model_dir("llama-fp32")).unwrap();
    let cold = generate(single.model.as_ref(), None, &b, &GenerateOptions { max_tokens: 10, ..Default::default() }, |_| true).unwrap();
    assert_eq!(out.tokens, cold.tokens);
}

// --- Single prompt-cache entries saved to files and loaded into a running engine.

#[test]
fn a_saved_prompt_cache_entry_serves_a_new_engine_exactly() {
    use weft::tokenizer::ChatMessage;
    let plain = EngineConfig { prompt_cache_bytes: 64 << 20, ..Default::default() };
    let kv8 = EngineConfig { kv_bits: Some(8), kv_group_size: 32, ..plain.clone() };
    // Quantized only from 10,000 positions: the entries hold full-precision KV under the policy.
    let kv4_late = EngineConfig { kv_bits: Some(4), kv_group_size: 32, quantized_kv_start: 10_000, ..plain.clone() };
    // A hybrid model (recurrent state: only whole checkpoints are reusable) and full attention,
    // with full-precision and quantized KV.
    for (tiny, config) in [("qwen3_5", plain.clone()), ("llama-fp32", plain), ("llama-fp32", kv8.clone()), ("qwen3_5", kv8), ("qwen3_5", kv4_late)] {
        let cold_config = EngineConfig { prompt_cache_bytes: 0, ..config.clone() };
        let tiny_name = format!("{tiny} kv_bits={:?}", config.kv_bits);
        let tiny = tiny_name.as_str().split(' ').next().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let model = chatml_model(tiny, dir.path());
        let files = tempfile::tempdir().unwrap();
        let (preamble, latest) = (files.path().join("preamble.safetensors"), files.path().join("latest.bin"));
        let system = ChatMessage::new("system", &agent_system_prompt(1200));
        let first_turn = vec![system.clone(), ChatMessage::new("user", "List the files.")];
        let first = Engine::start(loading::load(&model).unwrap(), config.clone()).unwrap();
        assert_eq!(first.save_prompt_cache_entry(None, &latest).unwrap(), None, "{tiny_name}: nothing cached yet");
        chat_turn(&first, &first_turn, 6);
        // The preamble: what a request starting with the system message reuses.
        let preamble_prompt = Request::new(Input::Messages(vec![system.clone()]));
        let pre = first.save_prompt_cache_entry(Some(preamble_prompt), &preamble).unwrap().expect("an entry for the system prompt");
        assert!(pre.tokens > 200 && pre.bytes > 0, "{tiny_name}: {pre:?}");
        let whole = first.save_prompt_cache_entry(None, &latest).unwrap().expect("the latest entry");
        assert!(whole.tokens > pre.tokens, "{tiny_name}: {whole:?} {pre:?}");
        first.shutdown();

        // A new engine loads the preamble: another conversation with that system prompt
        // prefills only the rest and equals a cold run.
        let second = Engine::start(loading::load(&model).unwrap(), config.clone()).unwrap();
        assert_eq!(second.load_prompt_cache_entry(&preamble).unwrap(), pre);
        let other_turn = vec![system.clone(), ChatMessage::new("user", "Run the tests, then report.")];
        let (warm, _) = chat_turn(&second, &other_turn, 6);
        let cold = Engine::start(loading::load(&model).unwrap(), cold_config.clone()).unwrap();
        let (want, _) = chat_turn(&cold, &other_turn, 6);
        assert_eq!(warm.tokens, want.tokens, "{tiny_name}");
        assert_eq!(warm.usage.cached_tokens, pre.tokens, "{tiny_name}: {:?}", warm.usage);
        let stats = settled_stats(&second, |s| s.prompt_cache_hits >= 1);
        assert!(stats.prompt_cache_files_refused.is_empty(), "{stats:?}");
        if tiny == "llama-fp32" {
            // Full attention trims any entry: the latest one (the first turn's prompt and
            // answer) serves the first turn again.
            second.load_prompt_cache_entry(&latest).unwrap();
            let (again, _) = chat_turn(&second, &first_turn, 6);
            let (want, _) = chat_turn(&cold, &first_turn, 6);
            assert_eq!(again.tokens, want.tokens);
            assert_eq!(again.usage.cached_tokens, again.usage.prompt_tokens - 1, "{:?}", again.usage);
        }
    }
}

#[test]
fn prompt_cache_entry_files_are_refused_with_why() {
    use weft::tokenizer::ChatMessage;
    let (dir, other_dir, files) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let model = chatml_model("llama-fp32", dir.path());
    let file = files.path().join("entry.safetensors");
    let engine = Engine::start(loading::load(&model).unwrap(), EngineConfig { prompt_cache_bytes: 64 << 20, ..Default::default() }).unwrap();
    chat_turn(&engine, &[ChatMessage::new("user", &agent_system_prompt(300))], 4);
    let saved = engine.save_prompt_cache_entry(None, &file).unwrap().unwrap();
    // Missing, corrupt, truncated.
    let err = engine.load_prompt_cache_entry(&files.path().join("missing.safetensors")).unwrap_err().to_string();
    assert!(err.contains("prompt-cache file") && err.contains("missing.safetensors"), "{err}");
    let bad = files.path().join("bad.safetensors");
    std::fs::write(&bad, b"not a cache file at all").unwrap();
    let err = engine.load_prompt_cache_entry(&bad).unwrap_err().to_string();
    assert!(err.contains("bad.safetensors"), "{err}");
    std::fs::write(&bad, b"").unwrap();
    let err = engine.load_prompt_cache_entry(&bad).unwrap_err().to_string();
    assert!(err.contains("bad.safetensors"), "{err}");
    let bytes = std::fs::read(&file).unwrap();
    std::fs::write(&bad, &bytes[..bytes.len() - 5]).unwrap();
    let err = engine.load_prompt_cache_entry(&bad).unwrap_err().to_string();
    assert!(err.contains("truncated"), "{err}");
    // Another model's engine refuses it, saying so.
    let other = Engine::start(loading::load(&chatml_model("gemma3-text", other_dir.path())).unwrap(), EngineConfig { prompt_cache_bytes: 64 << 20, ..Default::default() }).unwrap();
    let err = other.load_prompt_cache_entry(&file).unwrap_err().to_string();
    assert!(err.contains("saved for another model"), "{err}");
    // A cache too small for the entry, and one that is off.
    let small = Engine::start(loading::load(&model).unwrap(), EngineConfig { prompt_cache_bytes: 1024, ..Default::default() }).unwrap();
    let err = small.load_prompt_cache_entry(&file).unwrap_err();
    assert!(matches!(err, weft::Error::Capacity(_)), "{err}");
    let off = Engine::start(loading::load(&model).unwrap(), EngineConfig { prompt_cache_bytes: 0, ..Default::default() }).unwrap();
    assert!(matches!(off.load_prompt_cache_entry(&file).unwrap_err(), weft::Error::Unsupported(_)));
    assert!(matches!(off.save_prompt_cache_entry(None, &file).unwrap_err(), weft::Error::Unsupported(_)));
    // An entry of quantized KV names its settings: an engine with other KV quantization (or
    // none) refuses it, and a quantized engine refuses a full-precision entry.
    let kv8 = EngineConfig { prompt_cache_bytes: 64 << 20, kv_bits: Some(8), kv_group_size: 32, ..Default::default() };
    let quantized = Engine::start(loading::load(&model).unwrap(), kv8.clone()).unwrap();
    chat_turn(&quantized, &[ChatMessage::new("user", &agent_system_prompt(300))], 4);
    let q_file = files.path().join("q.safetensors");
    quantized.save_prompt_cache_entry(None, &q_file).unwrap().unwrap();
    let err = engine.load_prompt_cache_entry(&q_file).unwrap_err().to_string();
    assert!(err.contains("saved with KV quantization bits=8 group_size=32 start=0, this engine's is none"), "{err}");
    let err = quantized.load_prompt_cache_entry(&file).unwrap_err().to_string();
    assert!(err.contains("saved with KV quantization none, this engine's is bits=8 group_size=32 start=0"), "{err}");
    let kv4 = Engine::start(loading::load(&model).unwrap(), EngineConfig { kv_bits: Some(4), ..kv8 }).unwrap();
    let err = kv4.load_prompt_cache_entry(&q_file).unwrap_err().to_string();
    assert!(err.contains("this engine's is bits=4 group_size=32 start=0"), "{err}");
    // A file of the older format (no KV quantization named) is refused, saying so.
    let mut old = bytes.clone();
    let at = old.windows(19).position(|w| w == b"weft-prompt-cache/2").unwrap();
    old[at + 18] = b'1';
    std::fs::write(&bad, &old).unwrap();
    let err = engine.load_prompt_cache_entry(&bad).unwrap_err().to_string();
    assert!(err.contains("older Weft prompt-cache format"), "{err}");
    // The file is intact: a fresh engine still loads it.
    let fresh = Engine::start(loading::load(&model).unwrap(), EngineConfig { prompt_cache_bytes: 64 << 20, ..Default::default() }).unwrap();
    assert_eq!(fresh.load_prompt_cache_entry(&file).unwrap(), saved);
}
