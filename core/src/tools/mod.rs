//! Tool calling: the tools a request offers (OpenAI's function shape), how the model may use
//! them (`tool_choice`), the calls it made, the prompt that shows them to the model
//! ([`prompt`]) and the parser that finds calls in generated text ([`parser`]).
//!
//! The call syntax is the model family's ([`ToolFormat`], detected from the chat template).
//! A template with no tool support gets Weft's fallback: a system prompt listing the tools and
//! the `<tool_call>` JSON syntax, with calls and results written into the history as text.

mod grammar;
pub mod native;
pub mod parser;
pub mod prompt;

pub use native::{NativeCallParser, NativeFormat};
pub use parser::{Assembler, JsonCallParser, Parsed, ToolDelta};
pub use prompt::{check_history, check_role, render_with_tools, unknown_syntax, TemplateTools, ToolFormat, ROLES};

use serde_json::Value;

use crate::Error;

/// One function the model may call.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ToolSpec {
    pub name: String,
    pub description: Option<String>,
    /// The JSON Schema of the arguments object (`{"type": "object"}` when not given).
    pub parameters: Value,
    /// The tool as the caller sent it (`{"type": "function", "function": {...}}`), which is
    /// what chat templates are given, key order kept.
    pub raw: Value,
}

/// How the model may use the tools.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub enum ToolChoice {
    /// The model decides whether to call.
    #[default]
    Auto,
    /// No calls: output is text (the tools are still shown to the model).
    None,
    /// At least one call.
    Required,
    /// A call of this function.
    Function(String),
}

/// The tool side of a request.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Tools {
    pub specs: Vec<ToolSpec>,
    pub choice: ToolChoice,
    /// More than one call in a turn (OpenAI `parallel_tool_calls`, default true).
    pub parallel: bool,
    /// The call syntax, set when the prompt is rendered ([`render_with_tools`]).
    pub format: Option<ToolFormat>,
    /// Text the prompt ends with to open a forced call (`required` / a named function): the
    /// output continues it ([`prompt::forced_opening`]).
    pub opening: String,
    /// Whether the prompt holds `opening`; if not (the prompt left the model reasoning), the
    /// call grammar writes it once the reasoning is over.
    pub opening_in_prompt: bool,
}

/// A call the model made (defined with the chat messages that carry it in history).
pub use crate::tokenizer::ToolCall;

/// A bad `tools` / `tool_choice` / tool message: `param` names the field for HTTP's 400.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolsError {
    pub param: String,
    pub message: String,
}

impl ToolsError {
    pub fn new(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self { param: param.into(), message: message.into() }
    }
}

impl std::fmt::Display for ToolsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<ToolsError> for Error {
    fn from(e: ToolsError) -> Self {
        Error::Field { key: e.param, message: e.message }
    }
}

/// Function names OpenAI accepts: letters, digits, `_` and `-`, at most 64.
fn valid_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= 64 && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

impl ToolSpec {
    /// One entry of `tools`: `{"type": "function", "function": {"name", "description"?,
    /// "parameters"?}}`. `param` is how the caller names it (`tools[0]`).
    pub fn parse(raw: &Value, param: &str) -> Result<ToolSpec, ToolsError> {
        let bad = |m: String| ToolsError::new(param, m);
        let obj = raw.as_object().ok_or_else(|| bad(format!("`{param}` must be an object")))?;
        match obj.get("type").and_then(Value::as_str) {
            Some("function") => {}
            Some(other) => return Err(bad(format!("`{param}.type` must be \"function\", got {other:?}"))),
            None => return Err(bad(format!("`{param}.type` must be \"function\""))),
        }
        let function = obj
            .get("function")
            .and_then(Value::as_object)
            .ok_or_else(|| bad(format!("`{param}.function` must be an object")))?;
        let name = function
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| bad(format!("`{param}.function.name` must be a string")))?;
        if !valid_name(name) {
            return Err(bad(format!(
                "`{param}.function.name` {name:?} must be 1-64 letters, digits, underscores or dashes"
            )));
        }
        let description = match function.get("description") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(_) => return Err(bad(format!("`{param}.function.description` must be a string"))),
        };
        let parameters = match function.get("parameters") {
            None | Some(Value::Null) => serde_json::json!({"type": "object", "properties": {}}),
            Some(schema @ Value::Object(s)) => {
                check_schema(schema, &format!("{param}.function.parameters")).map_err(|m| bad(m))?;
                if s.get("type").is_some_and(|t| t != "object") {
                    return Err(bad(format!("`{param}.function.parameters` must describe an object (\"type\": \"object\")")));
                }
                schema.clone()
            }
            Some(_) => return Err(bad(format!("`{param}.function.parameters` must be a JSON Schema object"))),
        };
        Ok(ToolSpec { name: name.to_string(), description, parameters, raw: raw.clone() })
    }
}

/// The shape checks a JSON Schema must pass here: objects all the way down where the
/// vocabulary expects schemas, known `type` names. (The grammar engine checks the rest when it
/// compiles the schema.)
fn check_schema(schema: &Value, path: &str) -> Result<(), String> {
    let Some(obj) = schema.as_object() else {
        if schema.is_boolean() {
            return Ok(());
        }
        return Err(format!("`{path}` must be a JSON Schema (an object), got {}", crate::error::show(schema)));
    };
    const TYPES: &[&str] = &["object", "array", "string", "number", "integer", "boolean", "null"];
    match obj.get("type") {
        None => {}
        Some(Value::String(t)) if TYPES.contains(&t.as_str()) => {}
        Some(Value::Array(ts)) if ts.iter().all(|t| t.as_str().is_some_and(|t| TYPES.contains(&t))) => {}
        Some(t) => return Err(format!("`{path}.type` must be a JSON Schema type name, got {}", crate::error::show(t))),
    }
    if let Some(props) = obj.get("properties") {
        let props = props.as_object().ok_or_else(|| format!("`{path}.properties` must be an object"))?;
        for (k, v) in props {
            check_schema(v, &format!("{path}.properties.{k}"))?;
        }
    }
    if let Some(items) = obj.get("items") {
        check_schema(items, &format!("{path}.items"))?;
    }
    if let Some(required) = obj.get("required") {
        if !required.as_array().is_some_and(|r| r.iter().all(Value::is_string)) {
            return Err(format!("`{path}.required` must be an array of property names"));
        }
    }
    for key in ["anyOf", "oneOf", "allOf"] {
        if let Some(list) = obj.get(key) {
            let list = list.as_array().ok_or_else(|| format!("`{path}.{key}` must be an array of schemas"))?;
            for (i, s) in list.iter().enumerate() {
                check_schema(s, &format!("{path}.{key}[{i}]"))?;
            }
        }
    }
    Ok(())
}

impl Tools {
    /// `tools` (an array), `tool_choice` (OpenAI: "auto" | "none" | "required" |
    /// `{"type": "function", "function": {"name"}}`) and `parallel_tool_calls`.
    /// `None` when `tools` is absent or empty and no choice forces a call.
    pub fn parse(tools: Option<&Value>, choice: Option<&Value>, parallel: Option<bool>) -> Result<Option<Tools>, ToolsError> {
        let specs = match tools {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(list)) => {
                list.iter().enumerate().map(|(i, t)| ToolSpec::parse(t, &format!("tools[{i}]"))).collect::<Result<Vec<_>, _>>()?
            }
            Some(_) => return Err(ToolsError::new("tools", "`tools` must be an array of tools")),
        };
        let mut seen = std::collections::HashSet::new();
        for spec in &specs {
            if !seen.insert(spec.name.as_str()) {
                return Err(ToolsError::new("tools", format!("`tools` names the function {:?} twice", spec.name)));
            }
        }
        let choice = match choice {
            None | Some(Value::Null) => ToolChoice::Auto,
            Some(Value::String(s)) => match s.as_str() {
                "auto" => ToolChoice::Auto,
                "none" => ToolChoice::None,
                "required" => ToolChoice::Required,
                other => {
                    return Err(ToolsError::new(
                        "tool_choice",
                        format!("`tool_choice` must be \"auto\", \"none\", \"required\" or a function, got {other:?}"),
                    ))
                }
            },
            Some(Value::Object(o)) => {
                let name = o
                    .get("function")
                    .and_then(|f| f.get("name"))
                    .and_then(Value::as_str)
                    .filter(|_| o.get("type").and_then(Value::as_str) == Some("function"))
                    .ok_or_else(|| {
                        ToolsError::new(
                            "tool_choice",
                            "`tool_choice` must be {\"type\": \"function\", \"function\": {\"name\": ...}}",
                        )
                    })?;
                ToolChoice::Function(name.to_string())
            }
            Some(_) => return Err(ToolsError::new("tool_choice", "`tool_choice` must be a string or an object")),
        };
        Self::from_parts(specs, choice, parallel.unwrap_or(true))
    }

    /// Checks `choice` against `specs` (a named function must be one of them; `required`
    /// needs tools). `None` when there is nothing to call and nothing forced.
    pub fn from_parts(specs: Vec<ToolSpec>, choice: ToolChoice, parallel: bool) -> Result<Option<Tools>, ToolsError> {
        match &choice {
            ToolChoice::Function(name) if !specs.iter().any(|s| &s.name == name) => {
                let known: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
                return Err(ToolsError::new(
                    "tool_choice",
                    format!("`tool_choice` names the function {name:?}, which is not in `tools` (tools: {known:?})"),
                ));
            }
            ToolChoice::Required if specs.is_empty() => {
                return Err(ToolsError::new("tool_choice", "`tool_choice` \"required\" needs at least one tool in `tools`"))
            }
            _ => {}
        }
        if specs.is_empty() {
            return Ok(None);
        }
        Ok(Some(Tools { specs, choice, parallel, format: None, opening: String::new(), opening_in_prompt: true }))
    }

    /// Whether generated text is parsed for calls (not with `tool_choice` none).
    pub fn parses_calls(&self) -> bool {
        self.choice != ToolChoice::None
    }

    /// After how many complete calls generation ends: one for a named function or without
    /// parallel calls (what the caller asked for is there; text after it would be noise).
    pub fn call_limit(&self) -> Option<usize> {
        match self.choice {
            ToolChoice::Function(_) => Some(1),
            _ if !self.parallel => Some(1),
            _ => None,
        }
    }

    /// The parser for this request's output, once the prompt was rendered (`None` with
    /// `tool_choice` none).
    pub fn parser(&self) -> Option<ToolCallParser> {
        let format = self.format.filter(|_| self.parses_calls())?;
        let opening = if self.opening_in_prompt { self.opening.as_str() } else { "" };
        Some(ToolCallParser::with_opening(format, opening, &self.specs))
    }

    pub fn spec(&self, name: &str) -> Option<&ToolSpec> {
        self.specs.iter().find(|s| s.name == name)
    }
}

/// Finds calls in one output, in its model's syntax (JSON syntaxes or a native one).
pub enum ToolCallParser {
    Json(JsonCallParser),
    Native(NativeCallParser),
}

impl ToolCallParser {
    /// The parser for output that continues `opening` (text of a forced call the prompt
    /// already wrote; its meaning comes out with the first push).
    pub fn with_opening(format: ToolFormat, opening: &str, specs: &[ToolSpec]) -> Self {
        match format.native() {
            Some(native) => {
                let mut parser = NativeCallParser::new(native, specs);
                parser.set_opening(opening);
                ToolCallParser::Native(parser)
            }
            None => ToolCallParser::Json(JsonCallParser::with_opening(format, opening)),
        }
    }

    /// The calls so far (arguments possibly incomplete while generation goes on).
    pub fn calls(&self) -> &[ToolCall] {
        match self {
            ToolCallParser::Json(p) => p.calls(),
            ToolCallParser::Native(p) => p.calls(),
        }
    }

    /// How many calls were read to their end.
    pub fn completed_calls(&self) -> usize {
        match self {
            ToolCallParser::Json(p) => p.completed_calls(),
            ToolCallParser::Native(p) => p.completed_calls(),
        }
    }

    /// Feeds the next piece of generated text.
    pub fn push(&mut self, text: &str) -> Parsed {
        match self {
            ToolCallParser::Json(p) => p.push(text),
            ToolCallParser::Native(p) => p.push(text),
        }
    }

    /// The end of the output: held-back text is released, a call cut short is closed with the
    /// arguments it has.
    pub fn finish(&mut self) -> Parsed {
        match self {
            ToolCallParser::Json(p) => p.finish(),
            ToolCallParser::Native(p) => p.finish(),
        }
    }
}

/// A fresh call id, `call_` and 24 letters or digits (OpenAI's shape).
pub fn new_call_id() -> String {
    use rand::Rng as _;
    const CHARS: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rng();
    let tail: String = (0..24).map(|_| CHARS[rng.random_range(0..CHARS.len())] as char).collect();
    format!("call_{tail}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn weather() -> Value {
        json!({"type": "function", "function": {"name": "get_weather", "description": "Weather now",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}})
    }

    #[test]
    fn parses_tools_and_choices() {
        let tools = json!([weather()]);
        let t = Tools::parse(Some(&tools), None, None).unwrap().unwrap();
        assert_eq!(t.specs[0].name, "get_weather");
        assert_eq!(t.choice, ToolChoice::Auto);
        assert!(t.parallel);
        let named = json!({"type": "function", "function": {"name": "get_weather"}});
        let t = Tools::parse(Some(&tools), Some(&named), Some(false)).unwrap().unwrap();
        assert_eq!(t.choice, ToolChoice::Function("get_weather".into()));
        assert!(!t.parallel);
        assert!(Tools::parse(None, None, None).unwrap().is_none());
    }

    #[test]
    fn bad_tools_name_the_param() {
        let tools = json!([weather()]);
        let unknown = json!({"type": "function", "function": {"name": "nope"}});
        let e = Tools::parse(Some(&tools), Some(&unknown), None).unwrap_err();
        assert_eq!(e.param, "tool_choice");
        assert!(e.message.contains("\"nope\""), "{}", e.message);
        let e = Tools::parse(Some(&json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "strang"}}}}}])), None, None).unwrap_err();
        assert_eq!(e.param, "tools[0]");
        assert!(e.message.contains("properties.a.type"), "{}", e.message);
        let e = Tools::parse(Some(&json!([{"type": "function"}])), None, None).unwrap_err();
        assert!(e.message.contains("tools[0].function"), "{}", e.message);
        let e = Tools::parse(Some(&json!([weather(), weather()])), None, None).unwrap_err();
        assert!(e.message.contains("twice"), "{}", e.message);
        let e = Tools::parse(None, Some(&json!("required")), None).unwrap_err();
        assert_eq!(e.param, "tool_choice");
        let e = Tools::parse(Some(&tools), Some(&json!("sometimes")), None).unwrap_err();
        assert!(e.message.contains("sometimes"));
    }

    #[test]
    fn call_ids_look_like_openais() {
        let id = new_call_id();
        assert!(id.starts_with("call_") && id.len() == 29, "{id}");
        assert_ne!(id, new_call_id());
    }
}
