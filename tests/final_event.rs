//! The final-event guarantee under injected faults: whatever fails (a consumer's sink, a
//! forward pass, a step, the engine thread itself, shutdown), every request gets exactly one
//! final event, the other rows keep their goldens where they can, and a dead engine says so.

mod support;

use std::sync::mpsc;
use std::time::Duration;

use support::*;
use weft::engine::{Engine, EngineConfig, Event, Faults, Input, Request, StopCause};
use weft::generate::FinishReason;
use weft::ErrorCode;

fn start(config: EngineConfig) -> Engine {
    Engine::start(support::load_exact(&tiny_model_dir("llama-fp32")).unwrap(), config).unwrap()
}

fn with_faults(faults: Faults, max_batch: usize) -> EngineConfig {
    EngineConfig { faults, max_batch, ..Default::default() }
}

/// Golden single-sequence cases of the tiny llama: (prompt, tokens).
fn cases() -> Vec<(Vec<u32>, Vec<u32>)> {
    let g = golden("llama-fp32");
    g["single"].as_array().unwrap().iter().map(|c| (ids(&c["prompt_ids"]), ids(&c["tokens"]))).collect()
}

/// Stalls the engine's thread (the sink of a one-token request blocks on its first token) until
/// the returned sender sends or is dropped, so requests submitted meanwhile are all queued before
/// any decode step runs and the faults fire at a known point, however loaded the machine is.
fn hold(engine: &Engine) -> mpsc::Sender<()> {
    let (release, gate) = mpsc::channel::<()>();
    let sink = Box::new(move |ev: &Event| {
        if !ev.is_final() {
            let _ = gate.recv_timeout(Duration::from_secs(60));
        }
        true
    });
    engine.submit(greedy(vec![1, 2, 3], 1), sink).unwrap();
    release
}

fn assert_one_final(outs: &[Outcome]) {
    for (i, o) in outs.iter().enumerate() {
        assert_eq!((o.finals, o.after_final), (1, 0), "row {i}: exactly one final event, nothing after: {o:?}");
    }
}

#[test]
fn a_panicking_sink_gets_one_error_and_its_batch_mates_stay_exact() {
    let engine = start(EngineConfig::default());
    let cases = cases();
    let mates: Vec<_> = cases[..2].iter().map(|(p, _)| engine.submit_channel(greedy(p.clone(), 24)).unwrap().1).collect();
    let (tx, rx) = mpsc::channel();
    let mut seen = 0;
    engine
        .submit(
            greedy(cases[2].0.clone(), 24),
            Box::new(move |ev: &Event| {
                let _ = tx.send(ev.clone());
                if matches!(ev, Event::Token { .. }) {
                    seen += 1;
                }
                if seen == 3 {
                    panic!("consumer bug on its third token");
                }
                true
            }),
        )
        .unwrap();
    let bomb = collect(&rx);
    assert_one_final(std::slice::from_ref(&bomb));
    assert_eq!(bomb.tokens, cases[2].1[..3], "tokens up to the panic are delivered");
    assert!(bomb.error.as_deref().is_some_and(|m| m.contains("consumer bug")), "{bomb:?}");
    let outs: Vec<Outcome> = mates.iter().map(collect).collect();
    assert_one_final(&outs);
    for (o, (_, want)) in outs.iter().zip(&cases) {
        assert_eq!(o.tokens, want[..24]);
    }
    assert!(engine.health().is_ok());
}

#[test]
fn a_failing_forward_fails_its_batch_once_per_row_and_the_engine_serves_on() {
    let engine = start(with_faults(Faults { forward_error_at_step: Some(3), ..Default::default() }, 8));
    let cases = cases();
    let release = hold(&engine);
    let streams: Vec<_> = cases[..3].iter().map(|(p, _)| engine.submit_channel(greedy(p.clone(), 24)).unwrap().1).collect();
    drop(release);
    let outs: Vec<Outcome> = streams.iter().map(collect).collect();
    assert_one_final(&outs);
    for o in &outs {
        assert!(o.error.as_deref().is_some_and(|m| m.contains("injected fault: forward-error")), "{o:?}");
    }
    let after = collect(&engine.submit_channel(greedy(cases[1].0.clone(), 24)).unwrap().1);
    assert_eq!(after.tokens, cases[1].1[..24]);
    assert!(engine.health().is_ok());
}

#[test]
fn a_panic_inside_a_step_fails_the_running_rows_and_the_queue_still_runs() {
    // Two rows decode, two wait for a slot: the step panic fails the running pair; the queued
    // pair then runs from scratch and matches the goldens.
    let engine = start(with_faults(Faults { step_panic_at_step: Some(4), ..Default::default() }, 2));
    let cases = cases();
    let release = hold(&engine);
    let streams: Vec<_> = cases[..4].iter().map(|(p, _)| engine.submit_channel(greedy(p.clone(), 16)).unwrap().1).collect();
    drop(release);
    let outs: Vec<Outcome> = streams.iter().map(collect).collect();
    assert_one_final(&outs);
    for o in &outs[..2] {
        assert!(o.error.as_deref().is_some_and(|m| m.contains("injected fault: step-panic")), "{o:?}");
    }
    for (o, (_, want)) in outs[2..].iter().zip(&cases[2..]) {
        assert_eq!(o.error, None);
        assert_eq!(o.tokens, want[..16]);
    }
    assert!(engine.health().is_ok());
}

#[test]
fn a_dead_engine_thread_fails_every_request_once_and_refuses_new_ones() {
    let engine = start(with_faults(Faults { driver_panic_after_step: Some(3), ..Default::default() }, 2));
    let cases = cases();
    // Two rows running, two queued, when the driver dies.
    let release = hold(&engine);
    let streams: Vec<_> = cases[..4].iter().map(|(p, _)| engine.submit_channel(greedy(p.clone(), 64)).unwrap().1).collect();
    drop(release);
    let outs: Vec<Outcome> = streams.iter().map(collect).collect();
    assert_one_final(&outs);
    for o in &outs {
        assert!(o.error.as_deref().is_some_and(|m| m.contains("engine thread failed")), "{o:?}");
    }
    let health = engine.health().unwrap_err();
    assert_eq!(health.code(), ErrorCode::EngineFailed);
    assert!(health.to_string().contains("injected fault: driver-panic"), "{health}");
    let refused = engine.submit_channel(greedy(cases[0].0.clone(), 4)).unwrap_err();
    assert_eq!(refused.code(), ErrorCode::EngineFailed, "{refused}");
    // Dropping a dead engine neither hangs nor panics.
    drop(engine);
}

#[test]
fn shutdown_with_every_kind_of_row_outstanding_ends_each_once() {
    let engine = start(EngineConfig { max_batch: 2, ..Default::default() });
    let cases = cases();
    let streams: Vec<_> = cases[..4].iter().map(|(p, _)| engine.submit_channel(greedy(p.clone(), 200)).unwrap().1).collect();
    // Wait until the first row produced a token, so there are decoding and queued rows.
    let first = loop {
        match streams[0].recv_timeout(Duration::from_secs(60)).unwrap() {
            Event::Started { .. } => {}
            ev => break ev,
        }
    };
    assert!(matches!(first, Event::Token { .. }));
    engine.shutdown();
    let mut outs: Vec<Outcome> = streams[1..].iter().map(collect).collect();
    outs.insert(0, collect_after(&[first], &streams[0]));
    assert_one_final(&outs);
    for o in &outs {
        assert_eq!(o.finish, Some(FinishReason::Cancelled), "{o:?}");
    }
}

#[test]
fn faults_parse_from_the_environment_spelling() {
    let f = Faults::parse("driver-panic@2").unwrap();
    assert_eq!(f.driver_panic_after_step, Some(2));
    assert!(Faults::parse("driver-panic@soon").is_err());
}

#[test]
fn done_names_the_stop_and_carries_the_held_back_text() {
    let Some(path) = default_model() else { return };
    let engine = Engine::start(support::load_exact(&path).unwrap(), EngineConfig::default()).unwrap();
    let messages = vec![weft::tokenizer::ChatMessage::new("user", "What is the capital of France?")];
    let plain = Request { max_tokens: 32, ..Request::new(Input::Messages(messages)) };
    let by_string = Request { stop: vec!["Paris".into(), "zzz".into()], ..plain.clone() };
    // After 4 tokens ("The capital of France") "France" is held back, as it may begin the stop
    // string; the length limit ends the row and Done releases it.
    let by_length = Request { stop: vec!["France is".into()], max_tokens: 4, ..plain.clone() };
    let outs: Vec<Outcome> = [plain, by_string, by_length]
        .into_iter()
        .map(|r| engine.submit_channel(r).unwrap().1)
        .collect::<Vec<_>>()
        .iter()
        .map(collect)
        .collect();
    assert_one_final(&outs);
    let eos = support::load_exact(&path).unwrap().eos_token_ids;
    assert!(matches!(outs[0].stop, Some(StopCause::Eos { token_id }) if eos.contains(&token_id)), "{:?}", outs[0]);
    assert_eq!(outs[1].stop, Some(StopCause::StopString { stop: "Paris".into() }));
    assert_eq!(outs[1].tail, "", "a stop string cuts everything after it");
    assert_eq!(outs[1].text, "The capital of France is ");
    assert_eq!(outs[2].finish, Some(FinishReason::Length));
    assert_eq!(outs[2].stop, None);
    assert_eq!((outs[2].text.as_str(), outs[2].tail.as_str()), ("The capital of France", "France"));
}
