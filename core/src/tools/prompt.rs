//! Showing tools to the model: the model's own chat template when it renders `tools`, else
//! Weft's fallback (Hermes-style), which works with any template that takes system, user and
//! assistant turns.

use serde_json::Value;

use super::{ToolChoice, Tools, ToolsError};
use crate::reasoning::ReasoningSyntax;
use crate::tokenizer::{ChatMessage, ChatTemplate};

/// The call syntax a model family writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolFormat {
    /// `<tool_call>{"name", "arguments"}</tool_call>` (Hermes, Qwen 2.5 / 3, Weft's fallback).
    Hermes,
    /// `{"name", "parameters"}` or `<|python_tag|>` (Llama 3.1 / 3.2 / 3.3).
    Llama3Json,
    /// `[TOOL_CALLS][{"name", "arguments"}]` (Mistral).
    Mistral,
    /// `<tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>…` (Qwen3-Coder,
    /// Qwen3.5 / 3.6: [`super::native`]).
    Qwen3Coder,
    /// `<|tool_call>call:NAME{key:VALUE,…}<tool_call|>` (Gemma 4: [`super::native`]).
    Gemma4,
    /// `<function name="NAME"><param name="P">VALUE</param></function>` (MiniCPM5).
    #[serde(rename = "minicpm5")]
    MiniCpm5,
    /// `<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>…</tool_call>` (GLM 4.5–4.7).
    Glm,
    /// `<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{…}…`
    /// (Kimi K2).
    KimiK2,
    /// `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{…}<｜tool▁call▁end｜>…` (DeepSeek V3.1).
    #[serde(rename = "deepseek_v31")]
    DeepSeekV31,
    /// `<|tool_call_start|>[f(a=1, b="x")]<|tool_call_end|>` (LFM2 / LFM2.5 pythonic calls).
    Pythonic,
    /// `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{…}<|call|>` (gpt-oss).
    Harmony,
}

impl ToolFormat {
    /// The syntax's parser in [`super::native`], for the non-JSON syntaxes.
    pub fn native(self) -> Option<super::NativeFormat> {
        match self {
            ToolFormat::Qwen3Coder => Some(super::NativeFormat::Qwen3Coder),
            ToolFormat::Gemma4 => Some(super::NativeFormat::Gemma4),
            ToolFormat::MiniCpm5 => Some(super::NativeFormat::MiniCpm5),
            ToolFormat::Glm => Some(super::NativeFormat::Glm),
            ToolFormat::KimiK2 => Some(super::NativeFormat::KimiK2),
            ToolFormat::DeepSeekV31 => Some(super::NativeFormat::DeepSeekV31),
            ToolFormat::Pythonic => Some(super::NativeFormat::Pythonic),
            ToolFormat::Harmony => Some(super::NativeFormat::Harmony),
            ToolFormat::Hermes | ToolFormat::Llama3Json | ToolFormat::Mistral => None,
        }
    }

    /// A stable lowercase name (docs, logs, wire formats).
    pub fn name(self) -> &'static str {
        match self {
            ToolFormat::Hermes => "hermes",
            ToolFormat::Llama3Json => "llama3_json",
            ToolFormat::Mistral => "mistral",
            ToolFormat::Qwen3Coder => "qwen3_coder",
            ToolFormat::Gemma4 => "gemma4",
            ToolFormat::MiniCpm5 => "minicpm5",
            ToolFormat::Glm => "glm",
            ToolFormat::KimiK2 => "kimi_k2",
            ToolFormat::DeepSeekV31 => "deepseek_v31",
            ToolFormat::Pythonic => "pythonic",
            ToolFormat::Harmony => "harmony",
        }
    }
}

/// How a template takes tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TemplateTools {
    /// It renders `tools` and calls itself, in this syntax.
    Native(ToolFormat),
    /// It ignores tools: Weft's fallback prompt is used.
    Fallback,
    /// It renders tools in a syntax Weft does not parse.
    Unknown,
}

impl TemplateTools {
    pub fn detect(source: &str) -> TemplateTools {
        if !source.contains("tools") && !source.contains("tool_calls") {
            return TemplateTools::Fallback;
        }
        // The families whose markers are their own come first; then the ones inside
        // `<tool_call>` (Qwen3-Coder's `<function=`, GLM's `<arg_key>`) before Hermes.
        if source.contains("<|channel|>commentary") && source.contains("<|call|>") {
            TemplateTools::Native(ToolFormat::Harmony)
        } else if source.contains("<|tool_calls_section_begin|>") {
            TemplateTools::Native(ToolFormat::KimiK2)
        } else if source.contains("<｜tool▁calls▁begin｜>") {
            // V3.1's `NAME<｜tool▁sep｜>{json}`; R1's `function<｜tool▁sep｜>NAME\n```json` is another syntax.
            if source.contains("```json") {
                TemplateTools::Unknown
            } else {
                TemplateTools::Native(ToolFormat::DeepSeekV31)
            }
        } else if source.contains("<function name=") && source.contains("<param name=") {
            TemplateTools::Native(ToolFormat::MiniCpm5)
        } else if source.contains("<|tool_call_start|>") || source.contains("<|tool_list_start|>") {
            TemplateTools::Native(ToolFormat::Pythonic)
        } else if source.contains("<tool_call>") && source.contains("<arg_key>") {
            TemplateTools::Native(ToolFormat::Glm)
        } else if source.contains("<tool_call>") && source.contains("<function=") {
            TemplateTools::Native(ToolFormat::Qwen3Coder)
        } else if source.contains("<|tool_call>") {
            TemplateTools::Native(ToolFormat::Gemma4)
        } else if source.contains("<tool_call>") {
            TemplateTools::Native(ToolFormat::Hermes)
        } else if source.contains("[TOOL_CALLS]") {
            TemplateTools::Native(ToolFormat::Mistral)
        } else if source.contains("<|python_tag|>") || source.contains("<|start_header_id|>") {
            TemplateTools::Native(ToolFormat::Llama3Json)
        } else {
            TemplateTools::Unknown
        }
    }
}

/// Every `tool` message answers a call made earlier in the conversation.
pub fn check_history(messages: &[ChatMessage]) -> Result<(), ToolsError> {
    let mut ids = std::collections::HashSet::new();
    for (i, m) in messages.iter().enumerate() {
        check_role(&m.role, &format!("messages[{i}].role"))?;
        for call in &m.tool_calls {
            ids.insert(call.id.as_str());
        }
        if m.role == "tool" {
            let param = format!("messages[{i}].tool_call_id");
            match &m.tool_call_id {
                None => return Err(ToolsError::new(param, format!("`messages[{i}]` (role tool) needs a `tool_call_id`"))),
                Some(id) if !ids.contains(id.as_str()) => {
                    return Err(ToolsError::new(
                        param,
                        format!("`messages[{i}].tool_call_id` {id:?} does not match any earlier assistant tool call"),
                    ))
                }
                Some(_) => {}
            }
        }
    }
    Ok(())
}

/// The roles a conversation's messages may have (OpenAI's `developer` is a face's alias of
/// `system`, mapped before this check).
pub const ROLES: &[&str] = &["system", "user", "assistant", "tool"];

/// The one rule for a message's role, with one message on every face; `key` names the field
/// as the caller wrote it (`messages[2].role`).
pub fn check_role(role: &str, key: &str) -> Result<(), ToolsError> {
    if ROLES.contains(&role) {
        return Ok(());
    }
    Err(ToolsError::new(key, format!("{key} must be one of {}, got {role:?}", ROLES.join(", "))))
}

/// Renders `messages` with `tools` (generation prompt added, then the opening of a forced
/// call) and records in `tools` the call syntax to parse and that opening. A template that
/// renders tools gets them as transformers passes them; otherwise the fallback rewrites the
/// conversation (tools in the system prompt, calls and results as text). `kwargs` are the
/// template's extra variables (`enable_thinking`).
///
/// A prompt that leaves the model inside an open reasoning block (Qwen3.5 with thinking on)
/// does not get the opening: the model reasons first, and the call's grammar writes the
/// opening after the block ([`Tools::opening_in_prompt`]).
pub fn render_with_tools(
    template: &ChatTemplate,
    messages: &[ChatMessage],
    tools: &mut Tools,
    kwargs: &serde_json::Map<String, Value>,
) -> crate::Result<String> {
    let raw: Vec<Value> = tools.specs.iter().map(|s| s.raw.clone()).collect();
    let (mut text, format) = match TemplateTools::detect(template.source()) {
        TemplateTools::Native(format) => (template.render_with_kwargs(messages, Some(&raw), true, kwargs)?, format),
        TemplateTools::Fallback => {
            (template.render_with_kwargs(&fallback_messages(messages, &raw), None, true, kwargs)?, ToolFormat::Hermes)
        }
        TemplateTools::Unknown => return Err(unknown_syntax().into()),
    };
    tools.format = Some(format);
    tools.opening = forced_opening(&tools.choice, format);
    let thinking_open = ReasoningSyntax::detect(template.source()).is_some_and(|r| r.starts_open(&text));
    // Harmony: the model may write an analysis message before its call; the grammar writes
    // the call's header after it.
    tools.opening_in_prompt = !thinking_open && format != ToolFormat::Harmony;
    if tools.opening_in_prompt {
        text.push_str(&tools.opening);
    }
    Ok(text)
}

/// The opening the prompt writes for a forced call, so that the model continues a call of the
/// right shape (the grammar engine, when the request has one, makes it a valid call).
pub fn forced_opening(choice: &ToolChoice, format: ToolFormat) -> String {
    let json_call = |start: &str, arguments: &str| match choice {
        ToolChoice::Auto | ToolChoice::None => String::new(),
        ToolChoice::Required => format!("{start}\""),
        ToolChoice::Function(name) => format!("{start}{}, \"{arguments}\": ", serde_json::to_string(name).unwrap_or_default()),
    };
    match (format, choice) {
        (_, ToolChoice::Auto | ToolChoice::None) => String::new(),
        (ToolFormat::Hermes, _) => json_call("<tool_call>\n{\"name\": ", "arguments"),
        (ToolFormat::Llama3Json, _) => json_call("{\"name\": ", "parameters"),
        (ToolFormat::Mistral, _) => json_call("[TOOL_CALLS][{\"name\": ", "arguments"),
        // The native syntaxes: the family's layout up to the name, or through it.
        (native, choice) => match (super::grammar::shape(native), choice) {
            (Some(s), ToolChoice::Required) => format!("{}{}", s.list_open, s.call_open),
            (Some(s), ToolChoice::Function(name)) => format!("{}{}{name}{}", s.list_open, s.call_open, s.name_end),
            _ => String::new(),
        },
    }
}

/// The error for a template whose tool syntax Weft does not parse (`param` tools).
pub fn unknown_syntax() -> ToolsError {
    ToolsError::new(
            "tools",
            "this model's chat template renders tools in a call syntax Weft cannot parse (known: <tool_call> JSON, \
             Qwen3-Coder XML, Gemma 4 <|tool_call>, MiniCPM5 <function name=>, GLM <arg_key>, Kimi K2 \
             <|tool_calls_section_begin|>, DeepSeek V3.1 <｜tool▁calls▁begin｜>, pythonic <|tool_call_start|>, \
             gpt-oss harmony, Llama 3 JSON, [TOOL_CALLS])",
    )
}

/// The fallback's system prompt: the tools as JSON signatures and the call syntax, with an
/// example call of the first tool (small models follow an example better than a description).
pub fn fallback_system_prompt(tools: &[Value]) -> String {
    let mut prompt = String::from(
        "You can call functions. Each function is described by a JSON signature inside <tools></tools>:\n<tools>",
    );
    for tool in tools {
        prompt.push('\n');
        prompt.push_str(&python_json(tool.get("function").unwrap_or(tool)));
    }
    prompt.push_str(
        "\n</tools>\n\nTo call a function, reply with a JSON object holding its name and its arguments \
         inside <tool_call></tool_call>, for example:\n",
    );
    if let Some(first) = tools.first().and_then(|t| t.get("function")) {
        prompt.push_str(&format!(
            "<tool_call>\n{{\"name\": {}, \"arguments\": {}}}\n</tool_call>\n",
            python_json(&first["name"]),
            python_json(&example_arguments(&first["parameters"]))
        ));
    }
    prompt.push_str("Results come back inside <tool_response></tool_response>.");
    prompt
}

/// JSON with Python's `json.dumps` spacing (`{"a": 1, "b": 2}`), as templates print tools (and
/// the native tool-call parsers print arguments).
pub(crate) fn python_json(v: &Value) -> String {
    match v {
        Value::Object(m) => {
            let items: Vec<String> = m.iter().map(|(k, v)| format!("{}: {}", Value::from(k.as_str()), python_json(v))).collect();
            format!("{{{}}}", items.join(", "))
        }
        Value::Array(a) => format!("[{}]", a.iter().map(python_json).collect::<Vec<_>>().join(", ")),
        other => other.to_string(),
    }
}

/// Placeholder arguments for an example call: each property with a value of its type.
fn example_arguments(schema: &Value) -> Value {
    let mut out = serde_json::Map::new();
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        for (name, p) in props {
            let value = match p.get("enum").and_then(Value::as_array).and_then(|e| e.first()) {
                Some(first) => first.clone(),
                None => match p.get("type").and_then(Value::as_str) {
                    Some("integer") | Some("number") => Value::from(1),
                    Some("boolean") => Value::from(true),
                    Some("array") => Value::Array(Vec::new()),
                    Some("object") => Value::Object(Default::default()),
                    _ => Value::from(format!("<{name}>")),
                },
            };
            out.insert(name.clone(), value);
        }
    }
    Value::Object(out)
}

/// The conversation as a template without tool support sees it under the fallback.
pub fn fallback_messages(messages: &[ChatMessage], tools: &[Value]) -> Vec<ChatMessage> {
    let system = fallback_system_prompt(tools);
    let mut out: Vec<ChatMessage> = Vec::with_capacity(messages.len() + 1);
    match messages.first() {
        Some(first) if first.role == "system" => {
            out.push(ChatMessage::new("system", format!("{}\n\n{system}", first.content)));
        }
        _ => out.push(ChatMessage::new("system", system)),
    }
    let skip = usize::from(messages.first().is_some_and(|m| m.role == "system"));
    for m in &messages[skip..] {
        if m.role == "tool" {
            let response = format!("<tool_response>\n{}\n</tool_response>", m.content);
            match out.last_mut() {
                // Consecutive results share one user turn.
                Some(last) if last.role == "user" && last.content.ends_with("</tool_response>") => {
                    last.content.push('\n');
                    last.content.push_str(&response);
                }
                _ => out.push(ChatMessage::new("user", response)),
            }
        } else if !m.tool_calls.is_empty() {
            let mut content = m.content.clone();
            for call in &m.tool_calls {
                if !content.is_empty() {
                    content.push('\n');
                }
                let name = serde_json::to_string(&call.name).unwrap_or_default();
                content.push_str(&format!("<tool_call>\n{{\"name\": {name}, \"arguments\": {}}}\n</tool_call>", call.arguments));
            }
            out.push(ChatMessage::new(m.role.clone(), content));
        } else {
            out.push(ChatMessage::new(m.role.clone(), m.content.clone()));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::ToolCall;

    #[test]
    fn detects_the_families() {
        assert_eq!(TemplateTools::detect("{{ messages }}"), TemplateTools::Fallback);
        assert_eq!(TemplateTools::detect("{% if tools %}<tool_call>{% endif %}"), TemplateTools::Native(ToolFormat::Hermes));
        assert_eq!(TemplateTools::detect("{% if tools %}[TOOL_CALLS]{% endif %}"), TemplateTools::Native(ToolFormat::Mistral));
        assert_eq!(
            TemplateTools::detect("{% if tools %}<|start_header_id|>ipython{% endif %}"),
            TemplateTools::Native(ToolFormat::Llama3Json)
        );
        assert_eq!(TemplateTools::detect("{% if tools %}<function>{% endif %}"), TemplateTools::Unknown);
        // DeepSeek R1's `function<｜tool▁sep｜>NAME` + fenced JSON is not V3.1's syntax.
        let r1 = "{% if tools %}<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>{{ name }}\n```json\n{% endif %}";
        assert_eq!(TemplateTools::detect(r1), TemplateTools::Unknown);
        // LFM2's template names its tool-list markers only.
        let lfm2 = "{% if tools %}List of tools: <|tool_list_start|>[{% endif %}";
        assert_eq!(TemplateTools::detect(lfm2), TemplateTools::Native(ToolFormat::Pythonic));
    }

    #[test]
    fn forced_openings_follow_each_native_layout() {
        let named = ToolChoice::Function("f".into());
        let cases = [
            (ToolFormat::MiniCpm5, "<function name=\"", "<function name=\"f\">"),
            (ToolFormat::Glm, "<tool_call>", "<tool_call>f"),
            (ToolFormat::KimiK2, "<|tool_calls_section_begin|><|tool_call_begin|>functions.", "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:"),
            (ToolFormat::DeepSeekV31, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>"),
            (ToolFormat::Pythonic, "<|tool_call_start|>[", "<|tool_call_start|>[f("),
            (ToolFormat::Harmony, "<|channel|>commentary to=functions.", "<|channel|>commentary to=functions.f <|constrain|>json<|message|>"),
            (ToolFormat::Qwen3Coder, "<tool_call>\n<function=", "<tool_call>\n<function=f>\n"),
            (ToolFormat::Gemma4, "<|tool_call>call:", "<|tool_call>call:f{"),
        ];
        for (format, required, function) in cases {
            assert_eq!(forced_opening(&ToolChoice::Required, format), required, "{format:?}");
            assert_eq!(forced_opening(&named, format), function, "{format:?}");
            // The wire name (serde, as the step plan carries it) is the documented one.
            assert_eq!(serde_json::to_value(format).unwrap(), format.name());
        }
    }

    #[test]
    fn history_needs_matching_ids() {
        let call = ToolCall { id: "call_1".into(), name: "f".into(), arguments: "{}".into() };
        let assistant = ChatMessage { tool_calls: vec![call], ..ChatMessage::new("assistant", "") };
        let answer = ChatMessage { tool_call_id: Some("call_1".into()), ..ChatMessage::new("tool", "42") };
        assert!(check_history(&[ChatMessage::new("user", "q"), assistant.clone(), answer.clone()]).is_ok());
        let stray = ChatMessage { tool_call_id: Some("call_2".into()), ..ChatMessage::new("tool", "42") };
        let e = check_history(&[assistant, stray]).unwrap_err();
        assert_eq!(e.param, "messages[1].tool_call_id");
        assert!(e.message.contains("call_2"));
        let e = check_history(&[ChatMessage::new("tool", "42")]).unwrap_err();
        assert!(e.message.contains("needs a `tool_call_id`"));
    }

    #[test]
    fn fallback_writes_calls_and_results_as_text() {
        let call = |id: &str| ToolCall { id: id.into(), name: "f".into(), arguments: "{\"a\": 1}".into() };
        let messages = vec![
            ChatMessage::new("user", "q"),
            ChatMessage { tool_calls: vec![call("1"), call("2")], ..ChatMessage::new("assistant", "") },
            ChatMessage { tool_call_id: Some("1".into()), ..ChatMessage::new("tool", "r1") },
            ChatMessage { tool_call_id: Some("2".into()), ..ChatMessage::new("tool", "r2") },
        ];
        let out = fallback_messages(&messages, &[serde_json::json!({"type": "function"})]);
        assert_eq!(out.len(), 4);
        assert!(out[0].content.contains("<tools>\n{\"type\": \"function\"}\n</tools>"), "{}", out[0].content);
        assert_eq!(
            out[2].content,
            "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>"
        );
        assert_eq!((out[3].role.as_str(), out[3].content.as_str()), ("user", "<tool_response>\nr1\n</tool_response>\n<tool_response>\nr2\n</tool_response>"));
    }
}
