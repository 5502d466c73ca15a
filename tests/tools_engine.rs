//! Tool calls through the engine on a real forward pass (the tiny GGUF: random weights, a
//! byte-level tokenizer and a ChatML template without tool support, so Weft's fallback): a
//! named choice opens the call in the prompt, the row's tokens carry no ordinary text, the
//! streamed deltas assemble to `Done`'s calls, and a plain row batched alongside is untouched.

mod support;

use std::sync::mpsc::Receiver;

use serde_json::json;
use support::goldens_dir;
use weft::engine::{Engine, EngineConfig, Event, Input, Request};
use weft::loading;
use weft::sampling::SamplingParams;
use weft::tokenizer::ChatMessage;
use weft::tools::{Assembler, ToolDelta, Tools};

fn engine() -> Engine {
    Engine::start(loading::load(&goldens_dir().join("gguf/llama-q4_1.gguf")).unwrap(), EngineConfig::default()).unwrap()
}

fn weather_tools(choice: serde_json::Value) -> Tools {
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
    Tools::parse(Some(&tools), Some(&choice), None).unwrap().unwrap()
}

fn chat(tools: Option<Tools>) -> Request {
    Request {
        max_tokens: 10,
        sampling: SamplingParams::greedy(),
        ignore_eos: true,
        tools,
        ..Request::new(Input::Messages(vec![ChatMessage::new("user", "Weather in Oslo?")]))
    }
}

fn events(rx: Receiver<Event>) -> Vec<Event> {
    let mut out = Vec::new();
    for ev in rx {
        let last = ev.is_final();
        out.push(ev);
        if last {
            break;
        }
    }
    out
}

fn text_of(evs: &[Event]) -> (Vec<u32>, String) {
    let mut ids = Vec::new();
    let mut text = String::new();
    for ev in evs {
        match ev {
            Event::Token { token_id, text: t, .. } => {
                ids.push(*token_id);
                text.push_str(t);
            }
            Event::Done { text: t, .. } => text.push_str(t),
            Event::Error { message } => panic!("{message}"),
        }
    }
    (ids, text)
}

#[test]
fn named_call_streams_as_deltas_and_leaves_other_rows_alone() {
    let engine = engine();
    let (_, plain_alone) = engine.submit_channel(chat(None)).unwrap();
    let plain_alone = text_of(&events(plain_alone));

    // The call and a plain row in one batch.
    let named = json!({"type": "function", "function": {"name": "get_weather"}});
    let (_, called) = engine.submit_channel(chat(Some(weather_tools(named)))).unwrap();
    let (_, plain) = engine.submit_channel(chat(None)).unwrap();
    let called = events(called);
    assert_eq!(text_of(&events(plain)), plain_alone, "a plain row batched with a tool row is unchanged");

    let mut asm = Assembler::default();
    let mut tokens = 0;
    for ev in &called {
        if let Event::Token { text, tool_calls, .. } = ev {
            tokens += 1;
            assert_eq!(text, "", "the row is inside the call: no ordinary text");
            tool_calls.iter().for_each(|d| asm.apply(d));
            if tokens == 1 {
                assert!(matches!(&tool_calls[0], ToolDelta::Start { index: 0, name, .. } if name == "get_weather"), "{tool_calls:?}");
            }
        }
    }
    let Some(Event::Done { tool_calls, usage, text, .. }) = called.last() else { panic!("no Done: {called:?}") };
    assert_eq!(usage.completion_tokens, tokens, "one Token event per generated token");
    assert_eq!(text, "");
    assert_eq!(tool_calls.len(), 1);
    assert_eq!(tool_calls[0].name, "get_weather");
    assert!(!tool_calls[0].arguments.is_empty());
    for d in asm.catch_up(tool_calls) {
        asm.apply(&d);
    }
    assert_eq!(&asm.calls, tool_calls, "deltas assemble to the final calls");
}

#[test]
fn bad_tool_requests_fail_at_submit() {
    let engine = engine();
    let auto = json!("auto");
    let raw = Request { tools: Some(weather_tools(auto.clone())), ..Request::new(Input::Prompt("hi".into())) };
    let e = engine.submit_channel(raw).unwrap_err().to_string();
    assert!(e.contains("tools need a conversation"), "{e}");
    let stray = ChatMessage { tool_call_id: Some("call_9".into()), ..ChatMessage::new("tool", "42") };
    let request = Request { tools: Some(weather_tools(auto)), ..Request::new(Input::Messages(vec![stray])) };
    let e = engine.submit_channel(request).unwrap_err().to_string();
    assert!(e.contains("call_9") && e.contains("does not match"), "{e}");
}
