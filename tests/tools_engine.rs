//! Tool calls through the engine on a real forward pass (the tiny GGUF: random weights, a
//! byte-level tokenizer and a ChatML template without tool support, so Weft's fallback): a
//! named choice opens the call in the prompt, the row's tokens carry no ordinary text, the
//! streamed deltas assemble to `Done`'s calls, and a plain row batched alongside is untouched.
//!
//! The call grammars: `auto`'s, switched on by the call opener, fed token by token at the
//! constraint level (free text unmasked, then only valid calls; text, split and special-token
//! openers), and end to end on a tiny model whose tokenizer has `<tool_call>` as one token
//! that a logit bias makes the model write (golden rows in the same batch stay exact);
//! `required` with parallel calls (one or more) and without (exactly one).

mod support;
mod tokenizer_support;

use std::sync::mpsc::Receiver;

use serde_json::json;
use support::goldens_dir;
use weft::engine::{Engine, EngineConfig, Event, Input, Request};
use weft::sampling::SamplingParams;
use weft::tokenizer::ChatMessage;
use weft::tools::{Assembler, ToolDelta, Tools};

fn engine() -> Engine {
    Engine::start(support::load_exact(&goldens_dir().join("gguf/llama-q4_1.gguf")).unwrap(), EngineConfig::default()).unwrap()
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
            Event::Started { .. } => {}
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
            // A call's deltas are held until it is complete, then come together, name first.
            if asm.calls.is_empty() && !tool_calls.is_empty() {
                assert!(matches!(&tool_calls[0], ToolDelta::Start { index: 0, name, .. } if name == "get_weather"), "{tool_calls:?}");
            }
            tool_calls.iter().for_each(|d| asm.apply(d));
        }
    }
    let Some(Event::Done { tool_calls, tool_deltas, usage, text, finish_reason, .. }) = called.last() else { panic!("no Done: {called:?}") };
    assert_eq!(*finish_reason, FinishReason::ToolCalls, "a stop after calls is a tool_calls finish");
    assert_eq!(usage.completion_tokens, tokens, "one Token event per generated token");
    assert_eq!(text, "");
    assert_eq!(tool_calls.len(), 1);
    assert_eq!(tool_calls[0].name, "get_weather");
    assert!(!tool_calls[0].arguments.is_empty());
    // Done carries what the end released: every Token's and Done's deltas give the calls.
    tool_deltas.iter().for_each(|d| asm.apply(d));
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

// ---- the call grammars ----

use weft::constrain::{self, Constraint, RowConstraint, Trigger, Triggered};
use weft::generate::FinishReason;
use weft::gguf::GgufHeader;
use weft::tokenizer::Tokenizer;
use weft::tools::ToolFormat;

/// The tiny byte-level tokenizer (byte tokens 0..=255 are the bytes) plus `<tool_call>` and
/// `</tool_call>` as single tokens: added text tokens as in Qwen's vocabulary, or with
/// `special` the opener a control token (as `[TOOL_CALLS]` / `<|python_tag|>` are).
fn tool_tokenizer(special: bool) -> Tokenizer {
    use tokenizer_support::{tiny_vocab, GgufWriter, Meta, TempDir, TINY_TEMPLATE};
    let (mut tokens, merges, mut types) = tiny_vocab();
    // Two tokens that finish a byte-by-byte opener and run past it.
    for (t, control) in [("<tool_call>", special), ("</tool_call>", false), (">\n{", false), (">x", false)] {
        tokens.push(t.into());
        types.push(if control { 3 } else { 4 });
    }
    let id = |t: &str| tokens.iter().position(|x| x == t).unwrap() as u32;
    let dir = TempDir::new("tool-tok");
    let path = GgufWriter::default()
        .kv("general.architecture", Meta::str("llama"))
        .kv("tokenizer.ggml.model", Meta::str("gpt2"))
        .kv("tokenizer.ggml.pre", Meta::str("gpt2"))
        .kv("tokenizer.ggml.bos_token_id", Meta::U32(id("<|im_start|>")))
        .kv("tokenizer.ggml.eos_token_id", Meta::U32(id("<|im_end|>")))
        .kv("tokenizer.chat_template", Meta::str(TINY_TEMPLATE))
        .kv("tokenizer.ggml.tokens", Meta::strs(&tokens))
        .kv("tokenizer.ggml.merges", Meta::strs(&merges))
        .kv("tokenizer.ggml.token_type", Meta::i32s(&types))
        .write(&dir.path("tok.gguf"));
    Tokenizer::from_gguf(&GgufHeader::read(path).unwrap()).unwrap()
}

fn two_tools(choice: serde_json::Value, parallel: bool, format: ToolFormat) -> Tools {
    let tools = json!([
        {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
            "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object",
            "properties": {"zone": {"type": "integer"}}, "required": ["zone"], "additionalProperties": false}}}
    ]);
    let mut t = Tools::parse(Some(&tools), Some(&choice), Some(parallel)).unwrap().unwrap();
    t.format = Some(format);
    t
}

fn compiled(tools: &Tools, tok: &Tokenizer) -> RowConstraint {
    constrain::ConstraintFactoryCell::default().compile(&tools.grammar(&|_| None).expect("a grammar"), tok).unwrap()
}

/// Feeds `text` byte token by byte token; every token must be allowed and committed.
fn feed(c: &mut RowConstraint, tok: &Tokenizer, text: &str) {
    for t in tok.encode(text, false).unwrap() {
        c.prepare_mask().unwrap();
        assert!(c.allows(t), "token {t} of {text:?} not allowed");
        c.commit(t).unwrap_or_else(|e| panic!("{text:?}: {e}"));
    }
}

/// Feeds free text: no mask while waiting for the opener.
fn feed_free(c: &mut RowConstraint, tok: &Tokenizer, text: &str) {
    for t in tok.encode(text, false).unwrap() {
        assert!(c.is_waiting(), "{text:?}: the grammar switched on early");
        assert_eq!(c.bias(300, &[]).unwrap(), None, "free text is not masked");
        c.commit(t).unwrap();
    }
}

/// Feeds `good` then expects the first token of `bad` to be refused.
fn refused(c: &mut RowConstraint, tok: &Tokenizer, good: &str, bad: &str) {
    feed(c, tok, good);
    let t = tok.encode(bad, false).unwrap()[0];
    c.prepare_mask().unwrap();
    assert!(!c.allows(t), "{bad:?} after {good:?} was allowed");
    assert!(c.commit(t).is_err(), "{bad:?} after {good:?} was committed");
}

#[test]
fn auto_grammar_switches_on_at_the_opener() {
    for special in [false, true] {
        let tok = tool_tokenizer(special);
        let auto = two_tools(json!("auto"), true, ToolFormat::Hermes);
        let call = "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
        let mut c = compiled(&auto, &tok);
        // Free text, near misses included, then the opener as one token (text or special).
        feed_free(&mut c, &tok, "Let me see <tool_ca <tool_x> {\"name\": ");
        let opener = tok.encode("<tool_call>", false).unwrap();
        assert_eq!(opener.len(), 1, "<tool_call> is one token");
        c.commit(opener[0]).unwrap();
        assert!(!c.is_waiting(), "special={special}: the opener switches the grammar on");
        feed(&mut c, &tok, &format!("\n{call}"));
        assert!(c.is_accepting() && !c.is_finished(), "a complete call; more may follow");
        if !special {
            // (A second opener is grammar text: Hermes' `<tool_call>` is text in its vocabularies.)
            feed(&mut c, &tok, "\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": 3}}\n</tool_call>");
            assert!(c.is_accepting());
        }
        // Bad arguments, unknown names, text after a call: refused.
        for (good, bad) in [
            ("\n{\"name\": \"get_weather\", \"arguments\": {\"city\": ", "5"),
            ("\n{\"name\": \"get_weather\", \"arguments\": {\"", "town"),
            ("\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"", ","),
            ("\n{\"name\": \"get_", "x"),
            ("\n{\"name\": \"get_time\", \"arguments\": {\"zone\": 3}}\n</tool_call>", "Done"),
        ] {
            let mut c = compiled(&auto, &tok);
            c.commit(opener[0]).unwrap();
            refused(&mut c, &tok, good.strip_prefix("\n").unwrap_or(good), bad);
        }
    }
    // The opener written byte by byte (no single token for it) fires across tokens.
    let tok = tool_tokenizer(false);
    let auto = two_tools(json!("auto"), false, ToolFormat::Hermes);
    let mut c = compiled(&auto, &tok);
    let split: Vec<u32> = "Sure. <tool_call>".bytes().map(u32::from).collect();
    for (i, t) in split.iter().enumerate() {
        assert!(c.is_waiting(), "fired before byte {i}");
        c.commit(*t).unwrap();
    }
    assert!(!c.is_waiting());
    feed(&mut c, &tok, "\n{\"name\": \"get_time\", \"arguments\": {\"zone\": 12}}\n</tool_call>");
    assert!(c.is_finished(), "without parallel calls the grammar ends after one call");
    // A token that completes the opener and goes on: what follows the opener is checked.
    let run_past = |last: &str| {
        let mut c = compiled(&auto, &tok);
        for b in "ok <tool_call".bytes() {
            c.commit(u32::from(b)).unwrap();
        }
        let t = tok.encode(last, false).unwrap();
        assert_eq!(t.len(), 1, "{last:?} is one token");
        (c.commit(t[0]), c)
    };
    let (ok, mut c) = run_past(">\n{");
    ok.unwrap();
    feed(&mut c, &tok, "\"name\": \"get_time\", \"arguments\": {\"zone\": 1}}\n</tool_call>");
    assert!(c.is_finished());
    let e = run_past(">x").0.unwrap_err().to_string();
    assert!(e.contains("not a valid call") && e.contains("\"x\""), "{e}");
}

#[test]
fn llama_bare_call_at_the_start_and_special_triggers() {
    let tok = tool_tokenizer(false);
    let auto = two_tools(json!("auto"), true, ToolFormat::Llama3Json);
    // A reply that starts with `{"name"` is a call from its first byte...
    let mut c = compiled(&auto, &tok);
    for t in tok.encode(" {\"name\"", false).unwrap() {
        c.commit(t).unwrap();
    }
    assert!(!c.is_waiting());
    refused(&mut c, &tok, ": \"get_time\", \"parameters\": {\"zone\": 1}}; {\"name\": \"get_weather\", \"parameters\": {\"city\": ", "{");
    // ...one after text is not.
    let mut c = compiled(&auto, &tok);
    feed_free(&mut c, &tok, "Hi {\"name\": \"x\"} ");
    assert!(c.is_waiting());
    // A trigger that is a special token fires on that token alone.
    let hello = Triggered { triggers: vec![Trigger { text: "<|im_start|>".into(), included: false, at_start: false }], lark: "start: \"ok\"".into() };
    let mut c = constrain::ConstraintFactoryCell::default().compile(&Constraint::Triggered(hello), &tok).unwrap();
    feed_free(&mut c, &tok, "<|im_start|"); // its text, byte by byte, is just text
    c.commit(tok.encode("<|im_start|>", false).unwrap()[0]).unwrap();
    assert!(!c.is_waiting());
    feed(&mut c, &tok, "ok");
    assert!(c.is_finished());
}

#[test]
fn required_allows_parallel_calls_unless_told_not_to() {
    let tok = tool_tokenizer(false);
    // The prompt's opening ends inside the first name: `<tool_call>\n{"name": "`.
    let rest = "get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call>";
    let mut c = compiled(&two_tools(json!("required"), true, ToolFormat::Hermes), &tok);
    feed(&mut c, &tok, rest);
    assert!(c.is_accepting() && !c.is_finished());
    feed(&mut c, &tok, "\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": 2}}\n</tool_call>");
    assert!(c.is_accepting());
    // A newline after a call may end the list too (end-of-sequence allowed).
    feed(&mut c, &tok, "\n");
    assert!(c.is_accepting());
    let mut c = compiled(&two_tools(json!("required"), false, ToolFormat::Hermes), &tok);
    feed(&mut c, &tok, rest);
    assert!(c.is_finished(), "parallel_tool_calls false: exactly one call");
    // Mistral's list and Llama's `;`-separated calls.
    let mut c = compiled(&two_tools(json!("required"), true, ToolFormat::Mistral), &tok);
    feed(&mut c, &tok, "get_time\", \"arguments\": {\"zone\": 1}}, {\"name\": \"get_time\", \"arguments\": {\"zone\": 2}}]");
    assert!(c.is_finished());
}

/// The tiny qwen3 model with [`tool_tokenizer`] (text `<tool_call>`).
fn tool_engine() -> Engine {
    let mut model = support::load_exact(&support::tiny_model_dir("qwen3")).unwrap();
    model.tokenizer = Some(tool_tokenizer(false));
    Engine::start(model, EngineConfig::default()).unwrap()
}

fn tool_chat(tools: Tools, max_tokens: usize, bias: Vec<(u32, f32)>) -> Request {
    Request {
        max_tokens,
        sampling: SamplingParams { logit_bias: bias, ..SamplingParams::greedy() },
        ignore_eos: true,
        tools: Some(tools),
        ..Request::new(Input::Messages(vec![ChatMessage::new("user", "Weather in Oslo?")]))
    }
}

/// Every call valid for [`two_tools`]' schemas.
fn assert_valid_calls(calls: &[weft::tools::ToolCall], what: &str) {
    for call in calls {
        let args: serde_json::Value = serde_json::from_str(&call.arguments).unwrap_or_else(|e| panic!("{what}: {e}: {call:?}"));
        match call.name.as_str() {
            "get_weather" => assert!(args["city"].as_str().is_some_and(|c| c.chars().count() <= 12) && args.as_object().unwrap().len() == 1, "{what}: {args}"),
            "get_time" => assert!(args["zone"].is_i64() && args.as_object().unwrap().len() == 1, "{what}: {args}"),
            other => panic!("{what}: unknown tool {other}"),
        }
    }
}

#[test]
fn auto_calls_end_to_end_and_golden_rows_stay_exact() {
    let engine = tool_engine();
    let opener = tool_tokenizer(false).encode("<tool_call>", false).unwrap()[0];
    let g = support::golden("qwen3");
    let batch = &g["batch"].as_array().unwrap()[0];
    let rows = batch["rows"].as_array().unwrap();
    // The bias makes the opener the first token; from there the grammar holds.
    let auto = |parallel| tool_chat(two_tools(json!("auto"), parallel, ToolFormat::Hermes), 120, vec![(opener, 100.0)]);
    let (_, single) = engine.submit_channel(auto(false)).unwrap();
    let goldens: Vec<_> = rows
        .iter()
        .map(|r| engine.submit_channel(support::greedy(support::ids(&r["prompt_ids"]), r["max_tokens"].as_u64().unwrap() as usize)).unwrap().1)
        .collect();
    let (_, many) = engine.submit_channel(auto(true)).unwrap();
    for (r, rx) in rows.iter().zip(&goldens) {
        let out = support::collect(rx);
        assert_eq!(out.error, None);
        assert_eq!(out.tokens, support::ids(&r["tokens"]), "a golden row batched with auto tool rows");
    }
    let single = events(single);
    let Some(Event::Done { tool_calls, finish_reason, text, .. }) = single.last() else { panic!("{single:?}") };
    assert_eq!((*finish_reason, text.as_str()), (FinishReason::ToolCalls, ""), "{single:?}");
    assert_eq!(tool_calls.len(), 1, "parallel_tool_calls false: one call");
    assert_valid_calls(tool_calls, "auto");
    let (_, streamed) = text_of(&single);
    assert_eq!(streamed, "", "no call text leaks");
    // With parallel calls and no end-of-sequence (ignore_eos), the grammar only allows more
    // calls: several, the complete ones valid, until max_tokens.
    let many = events(many);
    let Some(Event::Done { tool_calls, finish_reason, .. }) = many.last() else { panic!("{many:?}") };
    assert_eq!(*finish_reason, FinishReason::Length);
    let complete: Vec<_> = tool_calls.iter().filter(|c| serde_json::from_str::<serde_json::Value>(&c.arguments).is_ok()).cloned().collect();
    assert!(complete.len() >= 2, "{tool_calls:?}");
    assert_valid_calls(&complete, "auto parallel");
    let mut asm = Assembler::default();
    let mut starts = Vec::new();
    for ev in &many {
        if let Event::Token { tool_calls, .. } = ev {
            for d in tool_calls {
                if let ToolDelta::Start { index, .. } = d {
                    starts.push(*index);
                }
                asm.apply(d);
            }
        }
    }
    assert_eq!(starts, (0..tool_calls.len()).collect::<Vec<_>>(), "each call starts with the next index");
    assert_eq!(&asm.calls[..complete.len()], &tool_calls[..complete.len()], "streamed deltas assemble to the calls");
}

#[test]
fn required_parallel_end_to_end() {
    let engine = tool_engine();
    let (_, many) = engine.submit_channel(tool_chat(two_tools(json!("required"), true, ToolFormat::Hermes), 120, vec![])).unwrap();
    let (_, one) = engine.submit_channel(tool_chat(two_tools(json!("required"), false, ToolFormat::Hermes), 120, vec![])).unwrap();
    let many = events(many);
    let Some(Event::Done { tool_calls, .. }) = many.last() else { panic!("{many:?}") };
    let complete: Vec<_> = tool_calls.iter().filter(|c| serde_json::from_str::<serde_json::Value>(&c.arguments).is_ok()).cloned().collect();
    assert!(complete.len() >= 2, "ignore_eos: the grammar goes on with more calls: {tool_calls:?}");
    assert_valid_calls(&complete, "required parallel");
    let one = events(one);
    let Some(Event::Done { tool_calls, finish_reason, stop, .. }) = one.last() else { panic!("{one:?}") };
    assert_eq!((*finish_reason, tool_calls.len()), (FinishReason::ToolCalls, 1), "{one:?}");
    assert_eq!(*stop, Some(weft::engine::StopCause::ToolCallLimit), "parallel_tool_calls false: the call limit ended it");
    assert_valid_calls(tool_calls, "required single");
}

// --- Reasoning models: a tiny Qwen3.5 with the real Qwen3 vocabulary and Qwen3.5 template.

use weft::tokenizer::ToolCall;

/// Everything a reasoning row streamed.
#[derive(Debug, Default)]
struct Streamed {
    tokens: Vec<u32>,
    text: String,
    reasoning: String,
    /// Deltas in the order they came (Token events', then Done's).
    deltas: Vec<ToolDelta>,
    calls: Vec<ToolCall>,
    finish: Option<FinishReason>,
    completion_tokens: usize,
    reasoning_tokens: usize,
    prompt_tokens: usize,
}

fn stream(engine: &Engine, request: Request) -> Streamed {
    let (_, rx) = engine.submit_channel(request).unwrap();
    let mut s = Streamed::default();
    for ev in events(rx) {
        match ev {
            Event::Started { prompt_tokens, .. } => s.prompt_tokens = prompt_tokens,
            Event::Token { token_id, text, reasoning, tool_calls, .. } => {
                s.tokens.push(token_id);
                s.text.push_str(&text);
                s.reasoning.push_str(&reasoning);
                s.deltas.extend(tool_calls);
            }
            Event::Done { text, reasoning, tool_deltas, tool_calls, finish_reason, usage, .. } => {
                s.text.push_str(&text);
                s.reasoning.push_str(&reasoning);
                s.deltas.extend(tool_deltas);
                s.calls = tool_calls;
                s.finish = Some(finish_reason);
                s.completion_tokens = usage.completion_tokens;
                s.reasoning_tokens = usage.reasoning_tokens;
            }
            Event::Error { message } => panic!("{message}"),
        }
    }
    s
}

fn qwen35_engine() -> Option<(Engine, Tokenizer, tempfile::TempDir)> {
    let dir = tempfile::tempdir().unwrap();
    support::qwen35_chat_model(dir.path())?;
    let tokenizer = Tokenizer::from_dir(dir.path()).unwrap();
    let engine = Engine::start(weft::loading::load(dir.path()).unwrap(), EngineConfig::default()).unwrap();
    Some((engine, tokenizer, dir))
}

fn qwen35_chat(max_tokens: usize, thinking: Option<bool>) -> Request {
    let mut request = Request {
        max_tokens,
        sampling: SamplingParams::greedy(),
        ignore_eos: true,
        ..Request::new(Input::Messages(vec![ChatMessage::new("user", "What is the weather in Paris?")]))
    };
    if let Some(on) = thinking {
        request.chat_template_kwargs.insert("enable_thinking".into(), on.into());
    }
    request
}

/// A tool whose calls a random model can finish: every value is from a small set.
fn forecast_tools(choice: serde_json::Value) -> Tools {
    let tools = json!([{"type": "function", "function": {"name": "get_forecast", "parameters": {"type": "object",
        "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}, "metric": {"type": "boolean"}},
        "required": ["city", "metric"]}}}]);
    Tools::parse(Some(&tools), Some(&choice), Some(false)).unwrap().unwrap()
}

fn assert_forecast_call(call: &ToolCall, what: &str) {
    assert_eq!(call.name, "get_forecast", "{what}");
    let args: serde_json::Value = serde_json::from_str(&call.arguments).unwrap_or_else(|e| panic!("{what}: {e}: {call:?}"));
    assert!(["Paris", "Oslo"].contains(&args["city"].as_str().unwrap_or("")) && args["metric"].is_boolean(), "{what}: {args}");
    assert_eq!(args.as_object().unwrap().len(), 2, "{what}: {args}");
}

#[test]
fn thinking_on_streams_every_unfinished_thought_as_reasoning() {
    let Some((engine, tok, _dir)) = qwen35_engine() else { return };
    let out = stream(&engine, qwen35_chat(12, None));
    let close = tok.token_to_id("</think>").unwrap();
    assert!(!out.tokens.contains(&close), "the random model did not close its block: {:?}", out.tokens);
    assert_eq!(out.text, "", "no answer text while the block is open");
    let decoded = tok.decode(&out.tokens, false).unwrap();
    assert_eq!(out.reasoning.trim(), decoded.trim(), "all of the output is reasoning");
    assert!(!out.reasoning.trim().is_empty());
    assert_eq!(out.reasoning_tokens, out.completion_tokens);
    assert_eq!(out.completion_tokens, 12);
}

#[test]
fn thinking_off_is_all_answer() {
    let Some((engine, tok, _dir)) = qwen35_engine() else { return };
    let out = stream(&engine, qwen35_chat(8, Some(false)));
    assert_eq!(out.reasoning, "");
    assert_eq!(out.reasoning_tokens, 0);
    assert_eq!(out.text.trim_start(), tok.decode(&out.tokens, false).unwrap().trim_start());
    // The prompt is the template's with thinking off: its closed empty block is in the prompt.
    let on = stream(&engine, qwen35_chat(1, None));
    let template = weft::tokenizer::ChatTemplate::new(
        &std::fs::read_to_string(support::goldens_dir().join("templates/Qwen3.5-4B.jinja")).unwrap(),
        None,
        None,
    )
    .unwrap();
    let mut kwargs = serde_json::Map::new();
    kwargs.insert("enable_thinking".into(), false.into());
    let messages = vec![ChatMessage::new("user", "What is the weather in Paris?")];
    let text = template.render_with_kwargs(&messages, None, true, &kwargs).unwrap();
    assert!(text.ends_with("<think>\n\n</think>\n\n"), "{text:?}");
    assert_eq!(out.prompt_tokens, tok.encode(&text, false).unwrap().len());
    assert!(on.prompt_tokens < out.prompt_tokens, "thinking on ends the prompt inside the block");
}

#[test]
fn a_spent_budget_closes_the_block_and_the_answer_follows() {
    let Some((engine, tok, _dir)) = qwen35_engine() else { return };
    let out = stream(&engine, Request { reasoning_budget: Some(3), ..qwen35_chat(10, None) });
    let forced = tok.encode("\n</think>", false).unwrap();
    assert_eq!(&out.tokens[3..3 + forced.len()], &forced[..], "the budget's end forces the closing marker: {:?}", out.tokens);
    assert_eq!(out.reasoning_tokens, 3 + forced.len());
    assert_eq!(out.reasoning.trim(), tok.decode(&out.tokens[..3], false).unwrap().trim());
    let answer = tok.decode(&out.tokens[3 + forced.len()..], false).unwrap();
    assert_eq!(out.text, answer.trim_start(), "after the block, the answer");
}

#[test]
fn a_named_call_comes_in_the_native_format_after_a_budgeted_block() {
    let Some((engine, tok, _dir)) = qwen35_engine() else { return };
    let named = json!({"type": "function", "function": {"name": "get_forecast"}});
    let request = Request { tools: Some(forecast_tools(named)), reasoning_budget: Some(2), ..qwen35_chat(60, None) };
    let out = stream(&engine, request);
    let close = tok.token_to_id("</think>").unwrap();
    let at = out.tokens.iter().position(|&t| t == close).expect("the block closed");
    let raw = tok.decode(&out.tokens[at + 1..], false).unwrap();
    assert!(
        raw.trim_start().starts_with("<tool_call>\n<function=get_forecast>\n<parameter="),
        "the model's own syntax (Qwen3-Coder XML), not JSON: {raw:?}"
    );
    assert!(!out.reasoning.is_empty());
    assert_eq!(out.finish, Some(FinishReason::ToolCalls), "{raw:?}");
    assert_eq!(out.calls.len(), 1);
    assert_forecast_call(&out.calls[0], "named after thinking");
    let mut asm = Assembler::default();
    out.deltas.iter().for_each(|d| asm.apply(d));
    assert_eq!(asm.calls, out.calls, "the deltas assemble to the call");
    assert_eq!(out.text.trim(), "", "the call's text is not answer text");
}

#[test]
fn required_calls_without_thinking_and_calls_cut_short() {
    let Some((engine, _tok, _dir)) = qwen35_engine() else { return };
    let required = || Request { tools: Some(forecast_tools(json!("required"))), ..qwen35_chat(60, Some(false)) };
    let out = stream(&engine, required());
    assert_eq!(out.finish, Some(FinishReason::ToolCalls));
    assert_eq!(out.calls.len(), 1);
    assert_forecast_call(&out.calls[0], "required, thinking off");
    assert_eq!(out.reasoning, "");
    // Cut by max_tokens mid-call: no call, not even in part.
    let cut = stream(&engine, Request { max_tokens: 3, ..required() });
    assert_eq!(cut.finish, Some(FinishReason::Length));
    assert!(cut.calls.is_empty() && cut.deltas.is_empty(), "a cut call is never delivered: {cut:?}");
}

#[test]
fn a_schema_applies_to_the_answer_after_the_reasoning() {
    let Some((engine, tok, _dir)) = qwen35_engine() else { return };
    let schema = json!({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": false});
    let request = Request {
        constraint: Some(Constraint::JsonSchema(schema)),
        reasoning_budget: Some(4),
        ignore_eos: false,
        ..qwen35_chat(40, None)
    };
    let out = stream(&engine, request);
    let close = tok.token_to_id("</think>").unwrap();
    assert_eq!(out.tokens.iter().position(|&t| t == close), Some(5), "free reasoning, then the forced close: {:?}", out.tokens);
    let answer: serde_json::Value = serde_json::from_str(out.text.trim()).unwrap_or_else(|e| panic!("{e}: {:?}", out.text));
    assert!(answer["ok"].is_boolean(), "{answer}");
    assert_eq!(out.finish, Some(FinishReason::Stop));
}

/// Tools with every kind of parameter the native grammars type.
fn typed_tools(choice: serde_json::Value, format: ToolFormat) -> Tools {
    let tools = json!([{"type": "function", "function": {"name": "get_forecast", "parameters": {"type": "object",
        "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}, "metric": {"type": "boolean"},
            "note": {"type": "string"}, "days": {"type": "integer"}, "hours": {"type": "array", "items": {"type": "integer"}}},
        "required": ["city", "metric"]}}}]);
    let mut t = Tools::parse(Some(&tools), Some(&choice), Some(true)).unwrap().unwrap();
    t.format = Some(format);
    t.opening = weft::tools::prompt::forced_opening(&t.choice, format);
    t
}

#[test]
fn native_grammars_accept_the_models_own_calls_and_nothing_else() {
    let Some(dir) = support::qwen3_tokenizer_dir() else { return };
    let tok = Tokenizer::from_dir(&dir).unwrap();
    let qwen_call = "<parameter=city>\nOslo\n</parameter>\n<parameter=metric>\nfalse\n</parameter>\n\
                     <parameter=note>\nline one\n</para> line two\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";
    let gemma_call = "city:<|\"|>Oslo<|\"|>,days:3,hours:[1,2],metric:false,note:<|\"|>a, b: {c}<|\"|>}<tool_call|>";
    // Required: the prompt wrote the opening up to the function's name.
    let mut c = compiled(&typed_tools(json!("required"), ToolFormat::Qwen3Coder), &tok);
    feed(&mut c, &tok, &format!("get_forecast>\n{qwen_call}"));
    assert!(c.is_accepting());
    feed(&mut c, &tok, &format!("\n<tool_call>\n<function=get_forecast>\n{qwen_call}"));
    assert!(c.is_accepting(), "a second parallel call");
    let mut c = compiled(&typed_tools(json!("required"), ToolFormat::Gemma4), &tok);
    feed(&mut c, &tok, &format!("get_forecast{{{gemma_call}"));
    assert!(c.is_accepting());
    // Auto: free text, then the opener switches the grammar on.
    let mut c = compiled(&typed_tools(json!("auto"), ToolFormat::Qwen3Coder), &tok);
    feed_free(&mut c, &tok, "Let me check.");
    c.commit(tok.encode("<tool_call>", false).unwrap()[0]).unwrap();
    feed(&mut c, &tok, &format!("\n<function=get_forecast>\n{qwen_call}"));
    assert!(c.is_accepting());
    let mut c = compiled(&typed_tools(json!("auto"), ToolFormat::Gemma4), &tok);
    feed_free(&mut c, &tok, "Let me check.");
    for t in tok.encode("<|tool_call>", false).unwrap() {
        c.commit(t).unwrap();
    }
    assert!(!c.is_waiting());
    feed(&mut c, &tok, &format!("call:get_forecast{{{gemma_call}"));
    assert!(c.is_accepting());
    // Typed values: an enum outside its set, a word for an integer, JSON for Gemma's strings.
    for (format, good, bad) in [
        (ToolFormat::Qwen3Coder, "get_forecast>\n<parameter=city>\n", "Rome"),
        (ToolFormat::Qwen3Coder, "get_forecast>\n<parameter=city>\nOslo\n</parameter>\n<parameter=metric>\ntrue\n</parameter>\n<parameter=days>\n", "three"),
        // (Forced text is written as the tokenizer writes it: `:<` is one token here.)
        (ToolFormat::Gemma4, "get_forecast{city:<|\"|>", "Rome"),
        (ToolFormat::Gemma4, "get_forecast{", "metric:"),
    ] {
        let mut c = compiled(&typed_tools(json!("required"), format), &tok);
        refused(&mut c, &tok, good, bad);
    }
}


// --- Gemma 4: the real template, a vocabulary with its markers as special tokens.

fn gemma4_engine() -> (Engine, Tokenizer, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    support::gemma4_chat_model(dir.path());
    let tokenizer = Tokenizer::from_dir(dir.path()).unwrap();
    let engine = Engine::start(weft::loading::load(dir.path()).unwrap(), EngineConfig::default()).unwrap();
    (engine, tokenizer, dir)
}

#[test]
fn gemma4_calls_come_in_its_own_syntax() {
    let (engine, tok, _dir) = gemma4_engine();
    let raw = |out: &Streamed| tok.decode(&out.tokens, false).unwrap();
    // Named: the prompt opens the call (`<|tool_call>call:get_forecast{`), the grammar finishes it.
    let named = json!({"type": "function", "function": {"name": "get_forecast"}});
    let out = stream(&engine, Request { tools: Some(forecast_tools(named)), ..qwen35_chat(40, None) });
    assert_eq!(out.finish, Some(FinishReason::ToolCalls), "{:?}", raw(&out));
    assert!(raw(&out).starts_with("city:<|\"|>") && raw(&out).ends_with("}<tool_call|>"), "Gemma's own syntax: {:?}", raw(&out));
    assert_forecast_call(&out.calls[0], "gemma4 named");
    assert_eq!((out.text.as_str(), out.reasoning.as_str()), ("", ""));
    // Required: from the function's name on.
    let out = stream(&engine, Request { tools: Some(forecast_tools(json!("required"))), ..qwen35_chat(40, None) });
    assert!(raw(&out).starts_with("get_forecast{city:<|\"|>"), "{:?}", raw(&out));
    assert_forecast_call(&out.calls[0], "gemma4 required");
    // Auto: free text until the model writes the call opener (a special token; a bias makes it
    // the first token), then one valid call.
    let opener = tok.token_to_id("<|tool_call>").unwrap();
    // (Every character is a token of this vocabulary: the whole call is ~60.)
    let mut auto = Request { tools: Some(forecast_tools(json!("auto"))), ..qwen35_chat(120, None) };
    auto.sampling.logit_bias = vec![(opener, 100.0)];
    let out = stream(&engine, auto);
    assert!(raw(&out).starts_with("<|tool_call>call:get_forecast{"), "{:?}", raw(&out));
    assert_eq!(out.finish, Some(FinishReason::ToolCalls), "{:?}", raw(&out));
    assert_forecast_call(&out.calls[0], "gemma4 auto");
    let mut asm = Assembler::default();
    out.deltas.iter().for_each(|d| asm.apply(d));
    assert_eq!(asm.calls, out.calls);
}

#[test]
fn gemma4_thinking_switch_reaches_the_template() {
    let (engine, tok, _dir) = gemma4_engine();
    let template = weft::tokenizer::ChatTemplate::new(
        &std::fs::read_to_string(support::goldens_dir().join("templates/google-gemma-4-31B-it.jinja")).unwrap(),
        Some("<bos>".into()),
        Some("<turn|>".into()),
    )
    .unwrap();
    let messages = vec![ChatMessage::new("user", "What is the weather in Paris?")];
    for on in [false, true] {
        let mut kwargs = serde_json::Map::new();
        kwargs.insert("enable_thinking".into(), on.into());
        let text = template.render_with_kwargs(&messages, None, true, &kwargs).unwrap();
        assert_eq!(text.ends_with("<|channel>thought\n<channel|>"), !on, "{text:?}");
        let out = stream(&engine, qwen35_chat(2, Some(on)));
        assert_eq!(out.prompt_tokens, tok.encode(&text, false).unwrap().len(), "thinking {on}");
    }
}

#[test]
fn tool_schemas_with_keywords_grammars_cannot_enforce_still_compile() {
    // Claude Code's tools use `propertyNames`; the grammar ignores it rather than refusing the tool.
    let tools = json!([{"type": "function", "function": {"name": "run", "parameters": {"type": "object", "properties": {
        "env": {"type": "object", "propertyNames": {"pattern": "^[A-Z_]+$"}, "additionalProperties": {"type": "string"}}}}}}]);
    let mut t = Tools::parse(Some(&tools), Some(&json!("required")), None).unwrap().unwrap();
    t.format = Some(ToolFormat::Hermes);
    let mut c = compiled(&t, &tool_tokenizer(false));
    feed(&mut c, &tool_tokenizer(false), "run\", \"arguments\": {\"env\": {\"PATH\": \"/bin\"}}}\n</tool_call>");
    assert!(c.is_accepting());
}

// --- The other native families: the tiny qwen3 model (vocabulary 1024) speaking a byte-level
// vocabulary with the family's markers as special tokens and the family's real template
// (no registry ships these families' own vocabularies as small downloads; the markers, their
// being single tokens, and the templates are the families'). A forced call must come out in
// the family's own syntax, parse, and validate against the tool's schema.

struct Family {
    template: &'static str,
    /// Special tokens: the template's bos and eos first.
    special: &'static [&'static str],
    format: ToolFormat,
    /// How the generated text of a named call begins (after the opening the prompt wrote).
    named_starts: &'static str,
    /// Tokens to favour (a random model otherwise reasons on).
    bias: &'static [&'static str],
}

const FAMILIES: &[Family] = &[
    Family {
        template: "openbmb-MiniCPM5-1B.jinja",
        special: &["<s>", "<|im_end|>", "<|im_start|>", "<think>", "</think>"],
        format: ToolFormat::MiniCpm5,
        named_starts: "<param name=\"",
        bias: &[],
    },
    Family {
        template: "GLM-4.7-Flash.jinja",
        special: &[
            "[gMASK]", "<|endoftext|>", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>", "<think>",
            "</think>", "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>",
            "<tool_response>", "</tool_response>",
        ],
        format: ToolFormat::Glm,
        named_starts: "<arg_key>",
        bias: &[],
    },
    Family {
        template: "Kimi-K2-Thinking.jinja",
        special: &[
            "[BOS]", "<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_system|>", "<|im_middle|>", "<think>",
            "</think>", "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
            "<|tool_call_argument_begin|>", "<|tool_call_end|>",
        ],
        format: ToolFormat::KimiK2,
        named_starts: "",
        bias: &[],
    },
    Family {
        template: "deepseek-ai-DeepSeek-V3.1.jinja",
        special: &[
            "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<think>", "</think>",
            "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
            "<｜tool▁sep｜>", "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>",
        ],
        format: ToolFormat::DeepSeekV31,
        named_starts: "{\"city\": \"",
        bias: &[],
    },
    Family {
        template: "LFM2.5-8B-A1B.jinja",
        special: &["<|startoftext|>", "<|im_end|>", "<|im_start|>", "<|tool_call_start|>", "<|tool_call_end|>", "<think>", "</think>"],
        format: ToolFormat::Pythonic,
        named_starts: "city=\"",
        bias: &[],
    },
    Family {
        template: "openai-gpt-oss-120b.jinja",
        special: &["<|startoftext|>", "<|return|>", "<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|call|>"],
        format: ToolFormat::Harmony,
        named_starts: "",
        // An analysis message the grammar allows first closes at once.
        bias: &["<|end|>"],
    },
];

fn family_engine(family: &Family) -> (Engine, Tokenizer, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let tok = support::family_tokenizer(dir.path(), family.template, family.special);
    let mut model = support::load_exact(&support::tiny_model_dir("qwen3")).unwrap();
    model.tokenizer = Some(tok.clone());
    (Engine::start(model, EngineConfig::default()).unwrap(), tok, dir)
}

/// [`forecast_tools`] closed to other keys (the JSON-bodied syntaxes would let a random model
/// add keys of its own).
fn strict_forecast_tools(choice: serde_json::Value) -> Tools {
    // (gpt-oss's template prints every tool's description.)
    let tools = json!([{"type": "function", "function": {"name": "get_forecast", "description": "The forecast",
        "parameters": {"type": "object",
        "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}, "metric": {"type": "boolean"}},
        "required": ["city", "metric"], "additionalProperties": false}}}]);
    Tools::parse(Some(&tools), Some(&choice), Some(false)).unwrap().unwrap()
}

/// A forced call through the engine: the raw output (after the prompt's opening) and what
/// the row delivered.
fn forced(family: &Family, engine: &Engine, tok: &Tokenizer, choice: serde_json::Value, budget: Option<usize>) -> (String, Streamed) {
    let mut request = Request { tools: Some(strict_forecast_tools(choice)), reasoning_budget: budget, ..qwen35_chat(120, Some(budget.is_some())) };
    request.sampling.logit_bias = family.bias.iter().map(|t| (tok.token_to_id(t).unwrap(), 100.0)).collect();
    let out = stream(engine, request);
    (tok.decode(&out.tokens, false).unwrap(), out)
}

#[test]
fn every_native_family_writes_its_own_forced_calls() {
    let named = json!({"type": "function", "function": {"name": "get_forecast"}});
    for family in FAMILIES {
        let (engine, tok, _dir) = family_engine(family);
        for choice in [named.clone(), json!("required")] {
            let what = format!("{} / {choice}", family.template);
            let (raw, out) = forced(family, &engine, &tok, choice.clone(), None);
            assert_eq!(out.finish, Some(FinishReason::ToolCalls), "{what}: {raw:?}");
            assert_eq!(out.calls.len(), 1, "{what}: {raw:?}");
            assert_forecast_call(&out.calls[0], &what);
            assert_eq!(out.text.trim(), "", "{what}: the call's text is not answer text: {raw:?}");
            let mut asm = Assembler::default();
            out.deltas.iter().for_each(|d| asm.apply(d));
            assert_eq!(asm.calls, out.calls, "{what}: the deltas assemble to the call");
            // The model's own syntax: the prompt's opening and the output parse as one call.
            let opening = weft::tools::prompt::forced_opening(&forecast_tools(choice.clone()).choice, family.format);
            let full = if family.format == ToolFormat::Harmony {
                // Harmony: the grammar writes the header (after an analysis message, if any).
                let at = raw.rfind("<|channel|>commentary").unwrap_or_else(|| panic!("{what}: {raw:?}"));
                assert!(raw[at..].starts_with(&opening), "{what}: {raw:?}");
                raw[at..].to_string()
            } else {
                format!("{opening}{raw}")
            };
            if choice == named {
                assert!(full[opening.len()..].starts_with(family.named_starts), "{what}: {full:?}");
            }
            let specs = forecast_tools(json!("auto")).specs;
            let mut parser = weft::tools::NativeCallParser::new(family.format.native().unwrap(), &specs);
            let mut text = parser.push(&full).text;
            text.push_str(&parser.finish().text);
            assert_eq!((parser.completed_calls(), text.trim()), (1, ""), "{what}: {full:?}");
            assert_eq!(parser.calls()[0].arguments, out.calls[0].arguments, "{what}");
        }
    }
}

#[test]
fn glm_calls_after_a_budgeted_think_block() {
    let family = &FAMILIES[1];
    let (engine, tok, _dir) = family_engine(family);
    let named = json!({"type": "function", "function": {"name": "get_forecast"}});
    let (raw, out) = forced(family, &engine, &tok, named, Some(2));
    let close = tok.token_to_id("</think>").unwrap();
    let at = out.tokens.iter().position(|&t| t == close).expect("the block closed");
    let after = tok.decode(&out.tokens[at + 1..], false).unwrap();
    assert!(after.trim_start().starts_with("<tool_call>get_forecast<arg_key>"), "GLM's own syntax after the block: {raw:?}");
    assert!(!out.reasoning.is_empty());
    assert_eq!(out.finish, Some(FinishReason::ToolCalls), "{raw:?}");
    assert_forecast_call(&out.calls[0], "glm after thinking");
}

#[test]
fn a_spent_budget_closes_harmonys_analysis_channel() {
    let family = FAMILIES.iter().find(|f| f.format == ToolFormat::Harmony).unwrap();
    let (engine, tok, _dir) = family_engine(family);
    // A named call whose grammar lets an analysis message come first; `<|channel|>` and `a`
    // favoured, so the model takes the analysis channel and writes on in it until the budget
    // closes it.
    let named = json!({"type": "function", "function": {"name": "get_forecast"}});
    let mut request = Request { tools: Some(strict_forecast_tools(named)), reasoning_budget: Some(3), ..qwen35_chat(120, None) };
    request.sampling.logit_bias = vec![(tok.encode("a", false).unwrap()[0], 100.0), (tok.token_to_id("<|channel|>").unwrap(), 100.0)];
    let out = stream(&engine, request);
    let raw = tok.decode(&out.tokens, false).unwrap();
    let message = tok.token_to_id("<|message|>").unwrap();
    let end = tok.token_to_id("<|end|>").unwrap();
    let at = out.tokens.iter().position(|&t| t == message).unwrap_or_else(|| panic!("{raw:?}"));
    assert!(raw.starts_with("<|channel|>analysis<|message|>"), "{raw:?}");
    assert_eq!(out.tokens[at + 3], end, "three tokens of the block (its header's <|message|> first), then the forced end: {raw:?}");
    assert_eq!(out.reasoning_tokens, 4, "{raw:?}");
    assert_eq!(out.reasoning, tok.decode(&out.tokens[at + 1..at + 3], false).unwrap());
    assert!(raw.contains("<|end|><|start|>assistant<|channel|>commentary to=functions.get_forecast <|constrain|>json<|message|>"), "{raw:?}");
    assert_eq!(out.finish, Some(FinishReason::ToolCalls), "{raw:?}");
    assert_forecast_call(&out.calls[0], "harmony after a budgeted analysis");
    assert_eq!(out.text.trim(), "");
}

#[test]
fn native_family_grammars_take_parallel_calls_and_auto_openers_in_their_own_syntax() {
    // (family, required: the text after the prompt's opening; auto: the text after the opener)
    let cases: [(ToolFormat, &str, &str); 6] = [
        (
            ToolFormat::MiniCpm5,
            "get_forecast\"><param name=\"city\">Oslo</param><param name=\"metric\">false</param><param name=\"note\"><![CDATA[a <b>\nc]]></param>\
             <param name=\"days\">3</param></function>\n<function name=\"get_forecast\"><param name=\"city\">Paris</param><param name=\"metric\">true</param></function>",
            "\"get_forecast\"><param name=\"city\">Oslo</param><param name=\"metric\">false</param></function>",
        ),
        (
            ToolFormat::Glm,
            "get_forecast<arg_key>city</arg_key><arg_value>Oslo</arg_value><arg_key>metric</arg_key><arg_value>false</arg_value>\
             <arg_key>note</arg_key><arg_value>line one\nline two</arg_value></tool_call><tool_call>get_forecast<arg_key>city</arg_key>\
             <arg_value>Paris</arg_value><arg_key>metric</arg_key><arg_value>true</arg_value></tool_call>",
            "get_forecast<arg_key>city</arg_key><arg_value>Oslo</arg_value><arg_key>metric</arg_key><arg_value>false</arg_value></tool_call>",
        ),
        (
            ToolFormat::KimiK2,
            "get_forecast:0<|tool_call_argument_begin|>{\"city\": \"Oslo\", \"metric\": false, \"days\": 3}<|tool_call_end|>\
             <|tool_call_begin|>functions.get_forecast:1<|tool_call_argument_begin|>{\"city\": \"Paris\", \"metric\": true}<|tool_call_end|><|tool_calls_section_end|>",
            "<|tool_call_begin|>functions.get_forecast:0<|tool_call_argument_begin|>{\"city\": \"Oslo\", \"metric\": false}<|tool_call_end|><|tool_calls_section_end|>",
        ),
        (
            ToolFormat::DeepSeekV31,
            "get_forecast<｜tool▁sep｜>{\"city\": \"Oslo\", \"metric\": false}<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_forecast<｜tool▁sep｜>\
             {\"city\": \"Paris\", \"metric\": true}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
            "<｜tool▁call▁begin｜>get_forecast<｜tool▁sep｜>{\"city\": \"Oslo\", \"metric\": false}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        ),
        (
            ToolFormat::Pythonic,
            "get_forecast(city=\"Oslo\", metric=False, days=3, hours=[1, 2]), get_forecast(city=\"Paris\", metric=True)]<|tool_call_end|>",
            "[get_forecast(city=\"Oslo\", metric=False)]<|tool_call_end|>",
        ),
        (
            ToolFormat::Harmony,
            "<|channel|>analysis<|message|>Need the forecast.<|end|><|start|>assistant<|channel|>commentary to=functions.get_forecast \
             <|constrain|>json<|message|>{\"city\": \"Oslo\", \"metric\": false}<|call|>",
            "",
        ),
    ];
    for (format, required, auto) in cases {
        let family = FAMILIES.iter().find(|f| f.format == format).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let tok = support::family_tokenizer(dir.path(), family.template, family.special);
        let special = |m: &str| tok.token_to_id(m);
        let compile = |choice: serde_json::Value| {
            let mut tools = typed_tools(choice, format);
            // As rendering decides it: harmony's grammar writes the call's header.
            tools.opening_in_prompt = format != ToolFormat::Harmony;
            let grammar = tools.grammar(&special).expect("a grammar");
            constrain::ConstraintFactoryCell::default().compile(&grammar, &tok).unwrap()
        };
        let mut c = compile(json!("required"));
        feed(&mut c, &tok, required);
        assert!(c.is_accepting(), "{format:?}: two calls in its own syntax");
        // A foreign (Hermes JSON) call is refused.
        let mut c = compile(json!("required"));
        let t = tok.encode("{\"name\"", false).unwrap()[0];
        c.prepare_mask().unwrap();
        assert!(!c.allows(t), "{format:?}: JSON call allowed");
        if format == ToolFormat::Harmony {
            // Auto: free reasoning and text, then from the recipient on a call, with the recipient
            // in the channel header or (as history writes it) in the role header.
            for (before, after) in [
                ("<|channel|>analysis<|message|>Let me check.<|end|><|start|>assistant<|channel|>commentary ", "get_forecast <|constrain|>json"),
                ("<|channel|>analysis<|message|>Let me check.<|end|><|start|>assistant ", "get_forecast<|channel|>commentary json"),
            ] {
                let mut c = compile(json!("auto"));
                feed_free(&mut c, &tok, before);
                for t in tok.encode("to=functions.", false).unwrap() {
                    c.commit(t).unwrap();
                }
                assert!(!c.is_waiting(), "harmony: the recipient switched the grammar on");
                feed(&mut c, &tok, &format!("{after}<|message|>{{\"city\": \"Oslo\", \"metric\": false}}<|call|>"));
                assert!(c.is_accepting(), "harmony auto: {after}");
            }
            continue;
        }
        let mut c = compile(json!("auto"));
        feed_free(&mut c, &tok, "Let me check.");
        let trigger = match format {
            ToolFormat::MiniCpm5 => "<function name=",
            ToolFormat::Glm => "<tool_call>",
            ToolFormat::KimiK2 => "<|tool_calls_section_begin|>",
            ToolFormat::DeepSeekV31 => "<｜tool▁calls▁begin｜>",
            _ => "<|tool_call_start|>",
        };
        for t in tok.encode(trigger, false).unwrap() {
            c.commit(t).unwrap();
        }
        assert!(!c.is_waiting(), "{format:?}: the opener switched the grammar on");
        feed(&mut c, &tok, auto);
        assert!(c.is_accepting(), "{format:?}: auto");
    }
}
