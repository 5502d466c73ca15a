//! Tool calls as grammars (llguidance Lark), arguments valid against each tool's parameters
//! schema (`%json`), calls written and closed in the family's syntax:
//!
//! - `required` / named: the prompt wrote the opening of a call ([`super::prompt::forced_opening`]);
//!   the output must finish it (for `required`, a call of one of the tools) and, with
//!   parallel calls, may add more calls after it.
//! - `auto`: the output is free text until the family's call opener appears
//!   ([`Constraint::Triggered`]); from there on it must be one or more valid calls (one
//!   without parallel calls).

use serde_json::Value;

use super::{ToolChoice, ToolFormat, ToolSpec, Tools};
use crate::constrain::{Constraint, Trigger, Triggered};

/// A Lark string literal for `text`.
fn literal(text: &str) -> String {
    serde_json::to_string(text).expect("strings serialize")
}

/// The schema as `%json` embeds it: fixed whitespace, spaced as Python's `json.dumps` (how
/// templates and the fallback prompt show calls; small models otherwise emit whitespace
/// forever: llguidance's default inside Lark is flexible).
fn embedded_schema(spec: &ToolSpec) -> String {
    let mut schema = spec.parameters.clone();
    if let Value::Object(m) = &mut schema {
        m.entry("x-guidance").or_insert_with(|| {
            serde_json::json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "})
        });
    }
    schema.to_string()
}

fn arguments_key(format: ToolFormat) -> &'static str {
    match format {
        ToolFormat::Llama3Json => "parameters",
        _ => "arguments",
    }
}

/// The family's syntax around call objects: `{"name": ...}` objects, each closed by `close`,
/// consecutive ones joined by `between`, the whole list ended by `end`.
struct Syntax {
    close: &'static str,
    between: &'static str,
    end: &'static str,
}

fn syntax(format: ToolFormat) -> Syntax {
    match format {
        ToolFormat::Hermes => Syntax { close: "\n</tool_call>", between: "\n<tool_call>\n", end: "" },
        ToolFormat::Llama3Json => Syntax { close: "", between: "; ", end: "" },
        ToolFormat::Mistral => Syntax { close: "", between: ", ", end: "]" },
    }
}

/// What switches an `auto` grammar on: the family's call opener, as a special token or text.
fn triggers(format: ToolFormat) -> Vec<Trigger> {
    let after = |text: &str| Trigger { text: text.into(), included: false, at_start: false };
    match format {
        ToolFormat::Hermes => vec![after("<tool_call>")],
        ToolFormat::Mistral => vec![after("[TOOL_CALLS]")],
        // Llama 3 also writes a bare call object as its whole reply.
        ToolFormat::Llama3Json => {
            vec![after("<|python_tag|>"), Trigger { text: "{\"name\"".into(), included: true, at_start: true }]
        }
    }
}

impl Tools {
    /// The grammar of this request's calls, once the prompt is rendered (`format` set):
    /// forced for `required` / named, triggered by the call opener for `auto`; `None` for
    /// `none`.
    pub fn grammar(&self) -> Option<Constraint> {
        let format = self.format?;
        let syn = syntax(format);
        let close = literal(&syn.close_of_call());
        let end = if syn.end.is_empty() { String::new() } else { format!(" {}", literal(syn.end)) };
        let args = |i: usize| format!("args{i}: %json {}", embedded_schema(&self.specs[i]));
        // The opening holds the name and the arguments key: one call, its arguments.
        if let ToolChoice::Function(name) = &self.choice {
            let i = self.specs.iter().position(|s| &s.name == name)?;
            return Some(Constraint::Lark(format!("start: args{i} {close}{end}\n{}", args(i))));
        }
        // `named`: the rest of a call object after `{"name": "`, one alternative per tool.
        let mut rules = vec![
            format!("named: {}", self.named_alternatives(format).join(" | ")),
            format!("call: {} named {close}", literal("{\"name\": \"")),
        ];
        rules.extend((0..self.specs.len()).map(args));
        // With parallel calls a newline after a call may also end the list (Hermes writes one
        // before its end of turn): else a newline would force another call.
        let more = match (self.parallel, format) {
            (false, _) => String::new(),
            (true, ToolFormat::Hermes) => format!(" ({} call)* \"\\n\"?", literal(syn.between)),
            (true, _) => format!(" ({} call)*", literal(syn.between)),
        };
        let start = match &self.choice {
            ToolChoice::None | ToolChoice::Function(_) => return None,
            // The opening stops inside the first call's name.
            ToolChoice::Required => format!("start: named {close}{more}{end}"),
            // A little whitespace may follow the opener (part of the token that completed it).
            ToolChoice::Auto => {
                let list = if format == ToolFormat::Mistral { "\"[\" " } else { "" };
                format!("start: /[ \\n]{{1,4}}/? {list}call{more}{end}")
            }
        };
        rules.insert(0, start);
        let lark = rules.join("\n");
        Some(match self.choice {
            ToolChoice::Auto => Constraint::Triggered(Triggered { triggers: triggers(format), lark }),
            _ => Constraint::Lark(lark),
        })
    }

    /// `name", "arguments": <schema>}` for each tool (the name's opening quote is written).
    fn named_alternatives(&self, format: ToolFormat) -> Vec<String> {
        self.specs
            .iter()
            .enumerate()
            .map(|(i, spec)| format!("{} args{i}", literal(&format!("{}\", \"{}\": ", spec.name, arguments_key(format)))))
            .collect()
    }
}

impl Syntax {
    /// What follows a call's arguments object: the object's `}` and the call's closing.
    fn close_of_call(&self) -> String {
        format!("}}{}", self.close)
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
    fn grammars_for_each_choice() {
        let Some(Constraint::Lark(g)) = tools(json!({"type": "function", "function": {"name": "a"}})).grammar() else { panic!() };
        assert!(g.starts_with("start: args0 \"}\\n</tool_call>\"\nargs0: %json {\"type\":\"object\""), "{g}");
        assert!(g.contains("\"x-guidance\":{\"whitespace_flexible\":false,\"item_separator\":\", \",\"key_separator\":\": \"}"), "{g}");
        // Required: the first call's name onwards, then any number of further calls.
        let Some(Constraint::Lark(g)) = tools(json!("required")).grammar() else { panic!() };
        assert!(g.starts_with("start: named \"}\\n</tool_call>\" (\"\\n<tool_call>\\n\" call)* \"\\n\"?\n"), "{g}");
        assert!(g.contains("\nnamed: \"a\\\", \\\"arguments\\\": \" args0 | \"b\\\", \\\"arguments\\\": \" args1\n"), "{g}");
        let mut single = tools(json!("required"));
        single.parallel = false;
        let Some(Constraint::Lark(g)) = single.grammar() else { panic!() };
        assert!(g.starts_with("start: named \"}\\n</tool_call>\"\n"), "{g}");
        // Auto: triggered by the opener.
        let Some(Constraint::Triggered(t)) = tools(json!("auto")).grammar() else { panic!() };
        assert_eq!(t.triggers, vec![Trigger { text: "<tool_call>".into(), included: false, at_start: false }]);
        assert!(t.lark.starts_with("start: /[ \\n]{1,4}/? call (\"\\n<tool_call>\\n\" call)* \"\\n\"?\n"), "{}", t.lark);
        let mut llama = tools(json!("auto"));
        llama.format = Some(ToolFormat::Llama3Json);
        let Some(Constraint::Triggered(t)) = llama.grammar() else { panic!() };
        assert_eq!(t.triggers.len(), 2);
        assert!(t.lark.starts_with("start: /[ \\n]{1,4}/? call (\"; \" call)*\n") && t.lark.contains("\\\"parameters\\\": \" args0"), "{}", t.lark);
        assert!(tools(json!("none")).grammar().is_none());
    }
}
