//! Forced tool calls as a grammar (llguidance Lark): after the opening the prompt wrote
//! ([`super::prompt::forced_opening`]), the output must finish a call of the named function
//! (or, for `required`, of one of the tools) whose arguments validate against its parameters
//! schema, then close the call in the family's syntax.

use serde_json::Value;

use super::{ToolChoice, ToolFormat, ToolSpec, Tools};
use crate::constrain::Constraint;

/// A Lark string literal for `text`.
fn literal(text: &str) -> String {
    serde_json::to_string(text).expect("strings serialize")
}

/// The schema as `%json` embeds it, with whitespace kept to single spaces (small models
/// otherwise emit whitespace forever: llguidance's default inside Lark is flexible).
fn embedded_schema(spec: &ToolSpec) -> String {
    let mut schema = spec.parameters.clone();
    if let Value::Object(m) = &mut schema {
        m.entry("x-guidance").or_insert_with(|| serde_json::json!({"whitespace_flexible": false}));
    }
    schema.to_string()
}

/// What closes a call after its arguments object.
fn closing(format: ToolFormat) -> &'static str {
    match format {
        ToolFormat::Hermes => "}\n</tool_call>",
        ToolFormat::Llama3Json => "}",
        ToolFormat::Mistral => "}]",
    }
}

fn arguments_key(format: ToolFormat) -> &'static str {
    match format {
        ToolFormat::Llama3Json => "parameters",
        _ => "arguments",
    }
}

impl Tools {
    /// The grammar that enforces a `required` / named choice, once the prompt is rendered
    /// (`format` set); `None` for `auto` and `none`.
    pub fn grammar(&self) -> Option<Constraint> {
        let format = self.format?;
        let close = closing(format);
        let mut rules = Vec::new();
        let start = match &self.choice {
            ToolChoice::Auto | ToolChoice::None => return None,
            // The opening already holds the name and the arguments key.
            ToolChoice::Function(name) => {
                let spec = self.spec(name)?;
                rules.push(format!("args0: %json {}", embedded_schema(spec)));
                format!("start: args0 {}", literal(close))
            }
            // The opening stops inside the name's string: one alternative per tool.
            ToolChoice::Required => {
                let mut alternatives = Vec::new();
                for (i, spec) in self.specs.iter().enumerate() {
                    let head = format!("{}\", \"{}\": ", spec.name, arguments_key(format));
                    rules.push(format!("args{i}: %json {}", embedded_schema(spec)));
                    alternatives.push(format!("{} args{i} {}", literal(&head), literal(close)));
                }
                format!("start: {}", alternatives.join(" | "))
            }
        };
        rules.insert(0, start);
        Some(Constraint::Lark(rules.join("\n")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tools(choice: Value) -> Tools {
        let list = json!([
            {"type": "function", "function": {"name": "a", "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}},
            {"type": "function", "function": {"name": "b"}}
        ]);
        let mut t = Tools::parse(Some(&list), Some(&choice), None).unwrap().unwrap();
        t.format = Some(ToolFormat::Hermes);
        t
    }

    #[test]
    fn grammars_for_forced_choices() {
        let Some(Constraint::Lark(g)) = tools(json!({"type": "function", "function": {"name": "a"}})).grammar() else { panic!() };
        assert!(g.starts_with("start: args0 \"}\\n</tool_call>\"\nargs0: %json {\"type\":\"object\""), "{g}");
        assert!(g.contains("\"x-guidance\":{\"whitespace_flexible\":false}"), "{g}");
        let Some(Constraint::Lark(g)) = tools(json!("required")).grammar() else { panic!() };
        assert!(g.starts_with("start: \"a\\\", \\\"arguments\\\": \" args0 \"}\\n</tool_call>\" | \"b\\\", "), "{g}");
        assert!(tools(json!("auto")).grammar().is_none());
    }
}
