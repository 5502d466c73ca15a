//! Tool calls as grammars (llguidance Lark), arguments valid against each tool's parameters
//! schema (`%json`), calls written and closed in the family's syntax:
//!
//! - `required` / named: the prompt wrote the opening of a call ([`super::prompt::forced_opening`]);
//!   the output must finish it (for `required`, a call of one of the tools) and, with
//!   parallel calls, may add more calls after it.
//! - `auto`: the output is free text until the family's call opener appears
//!   ([`Constraint::Triggered`]); from there on it must be one or more valid calls (one
//!   without parallel calls).
//!
//! When the prompt left the model reasoning, it does not hold the forced opening
//! ([`Tools::opening_in_prompt`]): the grammar (in force once the reasoning block has closed)
//! writes it first.
//!
//! The native syntaxes ([`ToolFormat::Qwen3Coder`], [`ToolFormat::Gemma4`]) get grammars of
//! their own shape: parameters typed by the tool's schema (strings as raw text, other types as
//! JSON or Gemma's value syntax), markers that are special tokens of the vocabulary written as
//! those tokens.

use serde_json::Value;

use super::{ToolChoice, ToolFormat, ToolSpec, Tools};
use crate::constrain::{Constraint, Trigger, Triggered};

/// A Lark string literal for `text`.
fn literal(text: &str) -> String {
    serde_json::to_string(text).expect("strings serialize")
}

/// The schema as `%json` embeds it: fixed whitespace, spaced as Python's `json.dumps` (how
/// templates and the fallback prompt show calls; small models otherwise emit whitespace
/// forever: llguidance's default inside Lark is flexible). Lenient: keywords llguidance cannot
/// enforce (`propertyNames`, which Claude Code's tools use) are ignored rather than refused —
/// a tool schema is the client's description of its function, not a contract to fail on.
fn embedded_schema(spec: &ToolSpec) -> String {
    guided(&spec.parameters)
}

/// `schema` with Weft's `x-guidance` options ([`embedded_schema`]), as JSON text.
fn guided(schema: &Value) -> String {
    let mut schema = schema.clone();
    if let Value::Object(m) = &mut schema {
        m.entry("x-guidance").or_insert_with(|| {
            serde_json::json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": ", "lenient": true})
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
        ToolFormat::Qwen3Coder | ToolFormat::Gemma4 => Syntax { close: "", between: "", end: "" },
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
        ToolFormat::Qwen3Coder => vec![after("<tool_call>")],
        ToolFormat::Gemma4 => vec![after("<|tool_call>")],
    }
}

/// How a marker is written in a grammar: as the vocabulary's special token when it is one
/// (text can never produce a special token), else as text.
pub type SpecialTokens<'a> = &'a dyn Fn(&str) -> Option<u32>;

fn marker(text: &str, special: SpecialTokens) -> String {
    match special(text) {
        Some(id) => format!("<[{id}]>"),
        None => literal(text),
    }
}

impl Tools {
    /// The grammar of this request's calls, once the prompt is rendered (`format` set):
    /// forced for `required` / named, triggered by the call opener for `auto`; `None` for
    /// `none`.
    pub fn grammar(&self, special: SpecialTokens) -> Option<Constraint> {
        let format = self.format?;
        if format.native().is_some() {
            return self.native_grammar(format, special);
        }
        let syn = syntax(format);
        // The opening the prompt did not write (reasoning first): the grammar's start writes it.
        let opening = self.unwritten_opening(special);
        let close = literal(&syn.close_of_call());
        let end = if syn.end.is_empty() { String::new() } else { format!(" {}", literal(syn.end)) };
        let args = |i: usize| format!("args{i}: %json {}", embedded_schema(&self.specs[i]));
        // The opening holds the name and the arguments key: one call, its arguments.
        if let ToolChoice::Function(name) = &self.choice {
            let i = self.specs.iter().position(|s| &s.name == name)?;
            return Some(Constraint::Lark(format!("start: {opening}args{i} {close}{end}\n{}", args(i))));
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
            ToolChoice::Required => format!("start: {opening}named {close}{more}{end}"),
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

    /// The forced opening as the start of a grammar rule (with the whitespace a model may put
    /// after its reasoning), when the prompt does not hold it; else nothing.
    fn unwritten_opening(&self, special: SpecialTokens) -> String {
        if self.opening_in_prompt || self.opening.is_empty() {
            return String::new();
        }
        let opener = ["<tool_call>", "[TOOL_CALLS]", "<|tool_call>"].into_iter().find(|m| self.opening.starts_with(m));
        let written = match opener {
            Some(m) if self.opening.len() > m.len() => format!("{} {}", marker(m, special), literal(&self.opening[m.len()..])),
            Some(m) => marker(m, special),
            None => literal(&self.opening),
        };
        format!("/[ \\n]{{1,4}}/? {written} ")
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

/// Rule names of tool `i`'s grammar pieces.
fn rule(kind: &str, i: usize, j: usize) -> String {
    format!("{kind}_{i}_{j}")
}

/// The parameters of a tool in the order a call writes them, with whether each is required.
fn parameters(spec: &ToolSpec, sorted: bool) -> Vec<(String, Value, bool)> {
    let required: Vec<&str> = spec
        .parameters
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut params: Vec<(String, Value, bool)> = spec
        .parameters
        .get("properties")
        .and_then(Value::as_object)
        .map(|p| p.iter().map(|(k, v)| (k.clone(), v.clone(), required.contains(&k.as_str()))).collect())
        .unwrap_or_default();
    if sorted {
        params.sort_by(|a, b| a.0.cmp(&b.0));
    }
    params
}

/// A property schema's single type name, if it has one.
fn type_of(schema: &Value) -> Option<&str> {
    match schema.get("type") {
        Some(Value::String(t)) => Some(t.as_str()),
        _ => None,
    }
}

/// String values of an `enum` of strings.
fn string_enum(schema: &Value) -> Option<Vec<&str>> {
    let items = schema.get("enum")?.as_array()?;
    items.iter().map(Value::as_str).collect()
}

/// A property schema as `%json` embeds it, with Weft's fixed spacing.
fn json_value(schema: &Value) -> String {
    format!("%json {}", guided(schema))
}

impl Tools {
    /// The grammar of calls in a native syntax.
    fn native_grammar(&self, format: ToolFormat, special: SpecialTokens) -> Option<Constraint> {
        let (open, close, mut rules) = match format {
            ToolFormat::Gemma4 => ("<|tool_call>", "<tool_call|>", Self::gemma_value_rules(special)),
            _ => ("<tool_call>", "</tool_call>", Vec::new()),
        };
        let (open_m, close_m) = (marker(open, special), marker(close, special));
        // Each tool: its name, its parameters, the end of the call.
        for (i, spec) in self.specs.iter().enumerate() {
            let body = match format {
                ToolFormat::Gemma4 => self.gemma_arguments(i, spec, special, &mut rules),
                _ => self.qwen_parameters(i, spec, &mut rules),
            };
            let (name_end, call_end) = match format {
                ToolFormat::Gemma4 => ("{", format!("\"}}\" {close_m}")),
                _ => (">\n", format!("\"</function>\\n\" {close_m}")),
            };
            rules.push(format!("body{i}: {body} {call_end}"));
            rules.push(format!("fn{i}: {} body{i}", literal(&format!("{}{name_end}", spec.name))));
        }
        let alternatives: Vec<String> = (0..self.specs.len()).map(|i| format!("fn{i}")).collect();
        rules.push(format!("named: {}", alternatives.join(" | ")));
        let (after_open, between) = match format {
            ToolFormat::Gemma4 => ("call:", ""),
            _ => ("\n<function=", "/\\n{1,2}/ "),
        };
        rules.push(format!("call: {open_m} {} named", literal(after_open)));
        let more = if self.parallel { format!(" ({between}call)*") } else { String::new() };
        let opening = self.unwritten_opening(special);
        let start = match &self.choice {
            ToolChoice::None => return None,
            ToolChoice::Function(name) => {
                let i = self.specs.iter().position(|s| &s.name == name)?;
                format!("start: {opening}body{i}{more}")
            }
            ToolChoice::Required => format!("start: {opening}named{more}"),
            ToolChoice::Auto => format!("start: {} named{more}", literal(after_open)),
        };
        rules.insert(0, start);
        let lark = rules.join("\n");
        Some(match self.choice {
            ToolChoice::Auto => Constraint::Triggered(Triggered { triggers: triggers(format), lark }),
            _ => Constraint::Lark(lark),
        })
    }

    /// Qwen3-Coder: `<parameter=P>\nVALUE\n</parameter>\n` for each parameter in schema order
    /// (optional ones may be left out); strings raw up to the closing tag, other types JSON.
    fn qwen_parameters(&self, i: usize, spec: &ToolSpec, rules: &mut Vec<String>) -> String {
        let mut seq = Vec::new();
        for (j, (name, schema, required)) in parameters(spec, false).into_iter().enumerate() {
            let head = literal(&format!("<parameter={name}>\n"));
            let tail = "\n</parameter>\n";
            let value = match (type_of(&schema), string_enum(&schema)) {
                (_, Some(choices)) => {
                    let alts: Vec<String> = choices.iter().map(|c| literal(&format!("{c}{tail}"))).collect();
                    format!("({})", alts.join(" | "))
                }
                (Some("string") | None, None) => {
                    rules.push(format!("{}[suffix={}]: /(?s:.*)/", rule("text", i, j), literal(tail)));
                    rule("text", i, j)
                }
                (Some(_), None) => format!("{} {}", json_value(&schema), literal(tail)),
            };
            rules.push(format!("{}: {head} {value}", rule("param", i, j)));
            seq.push(format!("{}{}", rule("param", i, j), if required { "" } else { "?" }));
        }
        if seq.is_empty() {
            "\"\"".to_string()
        } else {
            seq.join(" ")
        }
    }

    /// Gemma's untyped values (`gval`, for objects, arrays and schemas without a type) and its
    /// strings (`gstr`): text between `<|"|>` quotes, which a vocabulary may hold as a special
    /// token (then no text can contain it) or as text (then the string ends at its first quote).
    fn gemma_value_rules(special: SpecialTokens) -> Vec<String> {
        let quote = marker("<|\"|>", special);
        let mut rules = Vec::new();
        if special("<|\"|>").is_some() {
            rules.push(format!("gstr: {quote} /(?s:[^\\x00]+)/? {quote}"));
        } else {
            rules.push(format!("gtext[suffix={quote}]: /(?s:.*)/"));
            rules.push(format!("gstr: {quote} gtext"));
        }
        rules.push("gnum: /-?(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][-+]?[0-9]+)?/".into());
        rules.push("gkey: /[A-Za-z_][A-Za-z0-9_]*/".into());
        rules.push("gval: gstr | gnum | \"true\" | \"false\" | \"null\" | gobj | garr".into());
        rules.push("gobj: \"{\" (gkey \":\" gval (\",\" gkey \":\" gval)*)? \"}\"".into());
        rules.push("garr: \"[\" (gval (\",\" gval)*)? \"]\"".into());
        rules
    }

    /// Gemma 4: `key:VALUE` pairs in key order joined by commas (optional ones may be left
    /// out); strings between `<|"|>` quotes, numbers and literals bare, nested values in the
    /// same syntax.
    fn gemma_arguments(&self, i: usize, spec: &ToolSpec, special: SpecialTokens, rules: &mut Vec<String>) -> String {
        let quote = marker("<|\"|>", special);
        let params = parameters(spec, true);
        let n = params.len();
        for (j, (name, schema, _)) in params.iter().enumerate() {
            let value = match (type_of(schema), string_enum(schema)) {
                (_, Some(choices)) => {
                    let alts: Vec<String> =
                        choices.iter().map(|c| format!("{quote} {} {quote}", literal(c))).collect();
                    format!("({})", alts.join(" | "))
                }
                (Some("string"), None) => "gstr".to_string(),
                // Gemma writes numbers and booleans bare, as JSON does: the schema's own JSON
                // grammar keeps its bounds (minimum, maximum, multipleOf...).
                (Some("integer" | "number" | "boolean"), None) => json_value(schema),
                _ => "gval".to_string(),
            };
            rules.push(format!("{}: {} {value}", rule("pair", i, j), literal(&format!("{name}:"))));
        }
        // first_j: no pair written yet, from parameter j on; rest_j: some written.
        for j in (0..=n).rev() {
            let (first, rest) = if j == n {
                ("\"\"".to_string(), "\"\"".to_string())
            } else {
                let pair = rule("pair", i, j);
                let mut first = vec![format!("{pair} {}", rule("rest", i, j + 1))];
                let mut rest = vec![format!("\",\" {pair} {}", rule("rest", i, j + 1))];
                if !params[j].2 {
                    first.push(rule("first", i, j + 1));
                    rest.push(rule("rest", i, j + 1));
                }
                (first.join(" | "), rest.join(" | "))
            };
            rules.push(format!("{}: {first}", rule("first", i, j)));
            rules.push(format!("{}: {rest}", rule("rest", i, j)));
        }
        rule("first", i, 0)
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
        let Some(Constraint::Lark(g)) = tools(json!({"type": "function", "function": {"name": "a"}})).grammar(&|_| None) else { panic!() };
        assert!(g.starts_with("start: args0 \"}\\n</tool_call>\"\nargs0: %json {\"type\":\"object\""), "{g}");
        assert!(g.contains("\"x-guidance\":{\"whitespace_flexible\":false,\"item_separator\":\", \",\"key_separator\":\": \",\"lenient\":true}"), "{g}");
        // Required: the first call's name onwards, then any number of further calls.
        let Some(Constraint::Lark(g)) = tools(json!("required")).grammar(&|_| None) else { panic!() };
        assert!(g.starts_with("start: named \"}\\n</tool_call>\" (\"\\n<tool_call>\\n\" call)* \"\\n\"?\n"), "{g}");
        assert!(g.contains("\nnamed: \"a\\\", \\\"arguments\\\": \" args0 | \"b\\\", \\\"arguments\\\": \" args1\n"), "{g}");
        let mut single = tools(json!("required"));
        single.parallel = false;
        let Some(Constraint::Lark(g)) = single.grammar(&|_| None) else { panic!() };
        assert!(g.starts_with("start: named \"}\\n</tool_call>\"\n"), "{g}");
        // Auto: triggered by the opener.
        let Some(Constraint::Triggered(t)) = tools(json!("auto")).grammar(&|_| None) else { panic!() };
        assert_eq!(t.triggers, vec![Trigger { text: "<tool_call>".into(), included: false, at_start: false }]);
        assert!(t.lark.starts_with("start: /[ \\n]{1,4}/? call (\"\\n<tool_call>\\n\" call)* \"\\n\"?\n"), "{}", t.lark);
        let mut llama = tools(json!("auto"));
        llama.format = Some(ToolFormat::Llama3Json);
        let Some(Constraint::Triggered(t)) = llama.grammar(&|_| None) else { panic!() };
        assert_eq!(t.triggers.len(), 2);
        assert!(t.lark.starts_with("start: /[ \\n]{1,4}/? call (\"; \" call)*\n") && t.lark.contains("\\\"parameters\\\": \" args0"), "{}", t.lark);
        assert!(tools(json!("none")).grammar(&|_| None).is_none());
    }
}
