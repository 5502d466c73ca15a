//! Chat templates with tools, tool calls and tool results, against transformers' renderer on
//! real templates (goldens/tool_templates.json, made by goldens/make_tool_template_goldens.py),
//! and Weft's fallback for templates without tool support. Reasoning models' real templates
//! (goldens/templates/) with thinking on and off, tools, tool and reasoning history, against
//! transformers (goldens/reasoning_templates.json, goldens/make_reasoning_template_goldens.py).

use serde_json::Value;
use weft::tokenizer::{ChatMessage, ChatTemplate, ToolCall};
use weft::tools::{render_with_tools, TemplateTools, ToolFormat, Tools};

fn goldens() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../goldens/tool_templates.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("goldens/tool_templates.json")).expect("json")
}

/// A golden conversation (OpenAI shape) as Weft messages: call arguments become JSON text.
fn messages(v: &Value) -> Vec<ChatMessage> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|m| ChatMessage {
            tool_calls: m["tool_calls"]
                .as_array()
                .map(|calls| {
                    calls
                        .iter()
                        .map(|c| ToolCall {
                            id: c["id"].as_str().unwrap().into(),
                            name: c["function"]["name"].as_str().unwrap().into(),
                            arguments: serde_json::to_string(&c["function"]["arguments"]).unwrap(),
                        })
                        .collect()
                })
                .unwrap_or_default(),
            tool_call_id: m["tool_call_id"].as_str().map(Into::into),
            name: m["name"].as_str().map(Into::into),
            reasoning_content: m["reasoning_content"].as_str().map(Into::into),
            ..ChatMessage::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap())
        })
        .collect()
}

fn template(goldens: &Value, name: &str) -> ChatTemplate {
    ChatTemplate::new(goldens["templates"][name]["source"].as_str().unwrap(), Some("<s>".into()), Some("</s>".into()))
        .unwrap()
}

#[test]
fn tool_templates_match_transformers() {
    let g = goldens();
    let cases = g["cases"].as_array().unwrap();
    assert!(cases.len() >= 15);
    for case in cases {
        let t = template(&g, case["template"].as_str().unwrap());
        let tools: Option<Vec<Value>> = case["tools"].as_array().cloned();
        let rendered = t.render_with_tools(&messages(&case["messages"]), tools.as_deref(), true).unwrap();
        assert_eq!(rendered, case["text"].as_str().unwrap(), "{} / {}", case["template"], case["title"]);
    }
}

#[test]
fn families_are_detected_from_the_real_templates() {
    let g = goldens();
    let detect = |name: &str| TemplateTools::detect(g["templates"][name]["source"].as_str().unwrap());
    assert_eq!(detect("qwen3"), TemplateTools::Native(ToolFormat::Hermes));
    assert_eq!(detect("smollm2"), TemplateTools::Fallback);
    assert_eq!(detect("llama3"), TemplateTools::Fallback);
}

#[test]
fn native_templates_get_tools_as_transformers_passes_them() {
    let g = goldens();
    let case = g["cases"].as_array().unwrap().iter().find(|c| c["template"] == "qwen3" && c["title"] == "a call, its result, the answer").unwrap();
    let mut tools = Tools::parse(Some(&case["tools"]), None, None).unwrap().unwrap();
    let text = render_with_tools(&template(&g, "qwen3"), &messages(&case["messages"]), &mut tools, &Default::default()).unwrap();
    assert_eq!(tools.format, Some(ToolFormat::Hermes));
    assert_eq!(text, case["text"].as_str().unwrap());
    // A named choice ends the prompt with the opening of that call.
    let named = serde_json::json!({"type": "function", "function": {"name": "get_weather"}});
    let mut tools = Tools::parse(Some(&case["tools"]), Some(&named), None).unwrap().unwrap();
    let text = render_with_tools(&template(&g, "qwen3"), &messages(&case["messages"]), &mut tools, &Default::default()).unwrap();
    let opening = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": ";
    assert_eq!(text, format!("{}{opening}", case["text"].as_str().unwrap()));
    assert_eq!(tools.opening, opening);
}

#[test]
fn fallback_shows_tools_calls_and_results_to_plain_chatml() {
    let g = goldens();
    let case = g["cases"].as_array().unwrap().iter().find(|c| c["template"] == "smollm2" && c["title"] == "parallel calls with text, two results").unwrap();
    // transformers' SmolLM2 template ignores tools and calls entirely ...
    assert!(!case["text"].as_str().unwrap().contains("get_weather"));
    // ... so Weft's fallback writes them in.
    let mut tools = Tools::parse(Some(&case["tools"]), None, None).unwrap().unwrap();
    let text = render_with_tools(&template(&g, "smollm2"), &messages(&case["messages"]), &mut tools, &Default::default()).unwrap();
    assert_eq!(tools.format, Some(ToolFormat::Hermes));
    assert!(text.starts_with("<|im_start|>system\nYou can call functions."), "{text}");
    assert!(text.contains("<tools>\n{\"name\": \"get_weather\", \"description\": \"Current weather in a city\""), "{text}");
    assert!(text.contains("for example:\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"<city>\", \"unit\": \"celsius\"}}\n</tool_call>"), "{text}");
    assert!(text.contains("<|im_start|>assistant\nChecking both.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Oslo\"}}\n</tool_call>\n<tool_call>"), "{text}");
    assert!(text.contains("<|im_start|>user\n<tool_response>\nrain\n</tool_response>\n<tool_response>\n09:00\n</tool_response><|im_end|>\n<|im_start|>assistant\n"), "{text}");
    // SmolLM2's default system prompt is replaced, not doubled.
    assert!(!text.contains("SmolLM"), "{text}");
}

#[test]
fn reasoning_templates_match_transformers_with_chat_template_kwargs() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../goldens/reasoning_templates.json");
    let g: Value = serde_json::from_str(&std::fs::read_to_string(path).expect("goldens/reasoning_templates.json")).unwrap();
    let mut compared = 0;
    let mut raised = Vec::new();
    // gpt-oss and Llama 3.2 print the date (`strftime_now`); the goldens store it as <<TODAY>>
    // and <<TODAY_DMY>>.
    let date = |format: &str| {
        ChatTemplate::new(&format!("{{{{ strftime_now('{format}') }}}}"), None, None).unwrap().render(&[], false).unwrap()
    };
    let (today, today_dmy) = (date("%Y-%m-%d"), date("%d %b %Y"));
    for case in g["cases"].as_array().unwrap() {
        let name = case["template"].as_str().unwrap();
        let t = ChatTemplate::new(g["templates"][name].as_str().unwrap(), Some("<s>".into()), Some("</s>".into()))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let tools: Option<Vec<Value>> = case["tools"].as_array().cloned();
        let kwargs = case["kwargs"].as_object().unwrap();
        let rendered = t.render_with_kwargs(&messages(&case["messages"]), tools.as_deref(), true, kwargs);
        // transformers' immutable sandbox refuses `list.append`, which Kimi K2's templates use
        // for tool history: there the golden is the same renderer with a mutable sandbox.
        match case["text"].as_str().or(case["text_mutable_sandbox"].as_str()) {
            Some(text) => {
                let rendered = rendered.unwrap_or_else(|e| panic!("{name} / {}: {e}", case["title"]));
                let rendered = rendered.replace(&today, "<<TODAY>>").replace(&today_dmy, "<<TODAY_DMY>>");
                assert_eq!(rendered, text, "{name} / {}", case["title"]);
                compared += 1;
            }
            None => raised.push(format!("{name} / {}", case["title"].as_str().unwrap())),
        }
    }
    assert_eq!(compared, 231);
    // Llama 3.2's template refuses more than one call in a turn (so does Weft's rendering).
    assert_eq!(raised.len(), 3, "{raised:?}");
    assert!(raised.iter().all(|r| r.starts_with("meta-llama-Llama-3.2-3B-Instruct / parallel")), "{raised:?}");
    // Thinking off changes what Qwen3.5 renders: the think block is closed in the prompt.
    let qwen = g["cases"].as_array().unwrap().iter().filter(|c| c["template"] == "Qwen3.5-4B" && c["title"].as_str().unwrap().starts_with("one user turn"));
    let ends: Vec<&str> = qwen.map(|c| c["text"].as_str().unwrap()).collect();
    assert!(ends[1].ends_with("<think>\n") && ends[2].ends_with("<think>\n\n</think>\n\n"), "{ends:?}");
}

#[test]
fn real_templates_name_their_native_call_syntax() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../goldens/templates/");
    for (file, expected) in [
        ("Qwen3.5-4B.jinja", TemplateTools::Native(ToolFormat::Qwen3Coder)),
        ("Qwen3-Coder.jinja", TemplateTools::Native(ToolFormat::Qwen3Coder)),
        ("google-gemma-4-31B-it.jinja", TemplateTools::Native(ToolFormat::Gemma4)),
        ("meta-llama-Llama-3.2-3B-Instruct.jinja", TemplateTools::Native(ToolFormat::Llama3Json)),
        ("openbmb-MiniCPM5-1B.jinja", TemplateTools::Native(ToolFormat::MiniCpm5)),
        ("GLM-4.7-Flash.jinja", TemplateTools::Native(ToolFormat::Glm)),
        ("GLM-4.6.jinja", TemplateTools::Native(ToolFormat::Glm)),
        ("Kimi-K2-Thinking.jinja", TemplateTools::Native(ToolFormat::KimiK2)),
        ("Kimi-K2-Instruct.jinja", TemplateTools::Native(ToolFormat::KimiK2)),
        ("deepseek-ai-DeepSeek-V3.1.jinja", TemplateTools::Native(ToolFormat::DeepSeekV31)),
        ("LFM2.5-8B-A1B.jinja", TemplateTools::Native(ToolFormat::Pythonic)),
        ("openai-gpt-oss-120b.jinja", TemplateTools::Native(ToolFormat::Harmony)),
        ("mistralai-Ministral-3-14B-Reasoning-2512.jinja", TemplateTools::Native(ToolFormat::Mistral)),
    ] {
        let source = std::fs::read_to_string(format!("{dir}{file}")).unwrap();
        assert_eq!(TemplateTools::detect(&source), expected, "{file}");
    }
}

/// Weft's native call parsers give what mlx-lm's own parsers give on the same raw text
/// (goldens/native_calls.json, made by goldens/make_native_call_goldens.py), fed in small
/// streamed pieces.
#[test]
fn native_parsers_agree_with_mlx_lm() {
    use weft::tools::{NativeCallParser, ToolSpec};
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../goldens/native_calls.json");
    let g: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let specs: Vec<ToolSpec> = g["tools"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, t)| ToolSpec::parse(t, &format!("tools[{i}]")).unwrap())
        .collect();
    let cases = g["cases"].as_array().unwrap();
    assert!(cases.len() >= 30);
    for case in cases {
        let format = serde_json::from_value::<ToolFormat>(case["format"].clone()).ok().and_then(ToolFormat::native).unwrap();
        let what = format!("{} / {}", case["format"], case["title"]);
        let text = case["text"].as_str().unwrap();
        // Whole, and split in two at every boundary: the same calls.
        let splits = (0..=text.len()).filter(|i| text.is_char_boundary(*i));
        for at in splits {
            let mut parser = NativeCallParser::new(format, &specs);
            let mut leaked = parser.push(&text[..at]).text;
            leaked.push_str(&parser.push(&text[at..]).text);
            leaked.push_str(&parser.finish().text);
            assert_eq!(leaked.trim(), "", "{what} split at {at}: call text leaked as text");
            check_calls(&parser, case, &what);
        }
        let chars: Vec<char> = text.chars().collect();
        let mut parser = NativeCallParser::new(format, &specs);
        let mut leaked = String::new();
        for piece in chars.chunks(3) {
            leaked.push_str(&parser.push(&piece.iter().collect::<String>()).text);
        }
        leaked.push_str(&parser.finish().text);
        assert_eq!(leaked.trim(), "", "{what}: call text leaked as text");
        check_calls(&parser, case, &what);
    }
}

/// The parser's calls are the golden's: names, argument values, all complete.
fn check_calls(parser: &weft::tools::NativeCallParser, case: &Value, what: &str) {
    let want = case["calls"].as_array().unwrap();
    let got = parser.calls();
    assert_eq!(got.len(), want.len(), "{what}: {got:?}");
    assert_eq!(parser.completed_calls(), want.len(), "{what}");
    for (call, want) in got.iter().zip(want) {
        assert_eq!(call.name, want["name"].as_str().unwrap(), "{what}");
        let args: Value = serde_json::from_str(&call.arguments).unwrap_or_else(|e| panic!("{what}: {e}: {call:?}"));
        assert_eq!(args, want["arguments"], "{what}");
    }
}
