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
        _ => Syntax { close: "", between: "", end: "" },
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
        native => shape(native).and_then(|s| s.trigger).map(after).into_iter().collect(),
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
        format!("/[ \\n]{{1,4}}/? {} ", written(&self.opening, special))
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
    /// The grammar of calls in a native syntax: each call the family's opener, a tool's name,
    /// its arguments typed by the schema, the call's end; with parallel calls more may follow.
    fn native_grammar(&self, format: ToolFormat, special: SpecialTokens) -> Option<Constraint> {
        let shape = shape(format)?;
        let mut rules = match format {
            ToolFormat::Gemma4 => Self::gemma_value_rules(special),
            _ => Vec::new(),
        };
        // Each tool: its name, its parameters, the end of the call.
        for (i, spec) in self.specs.iter().enumerate() {
            let (body, call_end) = match format {
                ToolFormat::Gemma4 => (self.gemma_arguments(i, spec, special, &mut rules), format!("\"}}\" {}", marker("<tool_call|>", special))),
                ToolFormat::Qwen3Coder => (self.qwen_parameters(i, spec, &mut rules), format!("\"</function>\\n\" {}", marker("</tool_call>", special))),
                ToolFormat::MiniCpm5 => (self.minicpm_parameters(i, spec, &mut rules), literal("</function>")),
                ToolFormat::Glm => (self.glm_parameters(i, spec, special, &mut rules), marker("</tool_call>", special)),
                ToolFormat::KimiK2 => (
                    format!("/[0-9]{{1,4}}/ {} %json {}", marker("<|tool_call_argument_begin|>", special), embedded_schema(spec)),
                    marker("<|tool_call_end|>", special),
                ),
                ToolFormat::DeepSeekV31 => (format!("%json {}", embedded_schema(spec)), marker("<｜tool▁call▁end｜>", special)),
                ToolFormat::Harmony => (format!("%json {}", embedded_schema(spec)), marker("<|call|>", special)),
                ToolFormat::Pythonic => (self.pythonic_arguments(i, spec, &mut rules), literal(")")),
                ToolFormat::Hermes | ToolFormat::Llama3Json | ToolFormat::Mistral => return None,
            };
            rules.push(format!("body{i}: {body} {call_end}"));
            let name = match (format, &self.choice) {
                // Unforced, the recipient may also come in the role header
                // (`to=functions.NAME<|channel|>commentary json`).
                (ToolFormat::Harmony, ToolChoice::Auto) => format!("{} hhead", literal(&spec.name)),
                _ => written(&format!("{}{}", spec.name, shape.name_end), special),
            };
            rules.push(format!("fn{i}: {name} body{i}"));
        }
        if format == ToolFormat::Harmony && self.choice == ToolChoice::Auto {
            rules.push(format!(
                "hhead: {} | {} {}? {} {}",
                written(shape.name_end, special),
                written("<|channel|>commentary ", special),
                marker("<|constrain|>", special),
                literal("json"),
                marker("<|message|>", special)
            ));
        }
        let alternatives: Vec<String> = (0..self.specs.len()).map(|i| format!("fn{i}")).collect();
        rules.push(format!("named: {}", alternatives.join(" | ")));
        rules.push(format!("call: {} named", written(shape.call_open, special)));
        let parallel = self.parallel && shape.between.is_some();
        let more = match shape.between {
            Some(between) if parallel => format!(" ({between}call)*"),
            _ => String::new(),
        };
        let close = if shape.list_close.is_empty() { String::new() } else { format!(" {}", written(shape.list_close, special)) };
        let mut opening = self.unwritten_opening(special);
        if format == ToolFormat::Harmony && !opening.is_empty() {
            // An analysis message (reasoning) may come first.
            opening = format!("analysis? {opening}");
            let end = text_until("atext", "<|end|>", special, &mut rules);
            rules.push(format!(
                "analysis: {} {end} {}",
                written("<|channel|>analysis<|message|>", special),
                written("<|start|>assistant", special)
            ));
        }
        let start = match &self.choice {
            ToolChoice::None => return None,
            ToolChoice::Function(name) => {
                let i = self.specs.iter().position(|s| &s.name == name)?;
                format!("start: {opening}body{i}{more}{close}")
            }
            ToolChoice::Required => format!("start: {opening}named{more}{close}"),
            ToolChoice::Auto => {
                let trigger = shape.trigger?;
                let after = format!("{}{}", shape.list_open, shape.call_open);
                let after = after.find(trigger).map_or(after.as_str(), |i| &after[i + trigger.len()..]);
                let after = if after.is_empty() { String::new() } else { format!("{} ", written(after, special)) };
                format!("start: {after}named{more}{close}")
            }
        };
        rules.insert(0, start);
        let lark = rules.join("\n");
        Some(match self.choice {
            ToolChoice::Auto => Constraint::Triggered(Triggered { triggers: triggers(format), lark }),
            _ => Constraint::Lark(lark),
        })
    }

    /// MiniCPM5: `<param name="P">VALUE</param>` for each parameter in schema order (optional
    /// ones may be left out); strings raw without `<`, `&` or newlines, or as CDATA; other
    /// types JSON.
    fn minicpm_parameters(&self, i: usize, spec: &ToolSpec, rules: &mut Vec<String>) -> String {
        let mut seq = Vec::new();
        for (j, (name, schema, required)) in parameters(spec, false).into_iter().enumerate() {
            let value = match (type_of(&schema), string_enum(&schema)) {
                (_, Some(choices)) => alternatives(&choices),
                (Some("string") | None, None) => {
                    rules.push(format!("{}[suffix={}]: /(?s:.*)/", rule("cdata", i, j), literal("]]>")));
                    format!("(/[^<&\\n]+/ | {} {})?", literal("<![CDATA["), rule("cdata", i, j))
                }
                (Some(_), None) => json_value(&schema),
            };
            rules.push(format!("{}: {} {value} {}", rule("param", i, j), literal(&format!("<param name=\"{name}\">")), literal("</param>")));
            seq.push(format!("{}{}", rule("param", i, j), if required { "" } else { "?" }));
        }
        sequence(seq)
    }

    /// GLM: `<arg_key>P</arg_key><arg_value>VALUE</arg_value>` for each parameter in schema
    /// order (optional ones may be left out); strings raw, other types JSON.
    fn glm_parameters(&self, i: usize, spec: &ToolSpec, special: SpecialTokens, rules: &mut Vec<String>) -> String {
        let mut seq = Vec::new();
        let end_value = marker("</arg_value>", special);
        for (j, (name, schema, required)) in parameters(spec, false).into_iter().enumerate() {
            let value = match (type_of(&schema), string_enum(&schema)) {
                (_, Some(choices)) => format!("{} {end_value}", alternatives(&choices)),
                (Some("string") | None, None) => text_until(&rule("text", i, j), "</arg_value>", special, rules),
                (Some(_), None) => format!("{} {end_value}", json_value(&schema)),
            };
            let head = written(&format!("<arg_key>{name}</arg_key><arg_value>"), special);
            rules.push(format!("{}: {head} {value}", rule("param", i, j)));
            seq.push(format!("{}{}", rule("param", i, j), if required { "" } else { "?" }));
        }
        sequence(seq)
    }

    /// Pythonic: `key=VALUE` pairs in schema order joined by `, ` (optional ones may be left
    /// out); strings, numbers, objects and arrays as JSON (which Python reads the same),
    /// booleans `True` / `False`.
    fn pythonic_arguments(&self, i: usize, spec: &ToolSpec, rules: &mut Vec<String>) -> String {
        let params = parameters(spec, false);
        let items: Vec<bool> = params.iter().map(|p| p.2).collect();
        for (j, (name, schema, _)) in params.iter().enumerate() {
            let value = match (type_of(schema), string_enum(schema)) {
                (_, Some(choices)) => {
                    let alts: Vec<String> = choices.iter().map(|c| literal(&serde_json::to_string(c).unwrap_or_default())).collect();
                    format!("({})", alts.join(" | "))
                }
                (Some("boolean"), None) => "(\"True\" | \"False\")".to_string(),
                (Some("null"), None) => "\"None\"".to_string(),
                _ => json_value(schema),
            };
            rules.push(format!("{}: {} {value}", rule("pair", i, j), literal(&format!("{name}="))));
        }
        chain(i, &items, ", ", rules)
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
        sequence(seq)
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
        let required: Vec<bool> = params.iter().map(|p| p.2).collect();
        chain(i, &required, ",", rules)
    }
}

/// Tool `i`'s pairs `pair_i_j` joined by `sep`, in order, the optional ones (`required[j]`
/// false) left out at will. `first_i_j`: no pair written yet, from parameter j on; `rest_i_j`:
/// some written. Returns the rule of the whole list.
fn chain(i: usize, required: &[bool], sep: &str, rules: &mut Vec<String>) -> String {
    let n = required.len();
    for j in (0..=n).rev() {
        let (first, rest) = if j == n {
            ("\"\"".to_string(), "\"\"".to_string())
        } else {
            let pair = rule("pair", i, j);
            let mut first = vec![format!("{pair} {}", rule("rest", i, j + 1))];
            let mut rest = vec![format!("{} {pair} {}", literal(sep), rule("rest", i, j + 1))];
            if !required[j] {
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

/// Parameter rules one after another (`""` for none).
fn sequence(seq: Vec<String>) -> String {
    if seq.is_empty() {
        "\"\"".to_string()
    } else {
        seq.join(" ")
    }
}

/// An enum's strings as alternatives, written raw.
fn alternatives(choices: &[&str]) -> String {
    let alts: Vec<String> = choices.iter().map(|c| literal(c)).collect();
    format!("({})", alts.join(" | "))
}

/// Raw text up to and including `end`: a special token of the vocabulary (no text can hold
/// it) or text (the text ends at its first occurrence, through rule `name`).
fn text_until(name: &str, end: &str, special: SpecialTokens, rules: &mut Vec<String>) -> String {
    match special(end) {
        Some(id) => format!("/(?s:[^\\x00]+)/? <[{id}]>"),
        None => {
            rules.push(format!("{name}[suffix={}]: /(?s:.*)/", literal(end)));
            name.to_string()
        }
    }
}

/// How a native family lays out its calls, as text: a forced call's opening is
/// `list_open + call_open` (`required`) or that, the name and `name_end` (named).
pub(super) struct Shape {
    /// Before the first call (a list's opener) and after the last.
    pub list_open: &'static str,
    pub list_close: &'static str,
    /// What opens each call, up to the function's name.
    pub call_open: &'static str,
    /// Between the name and the arguments.
    pub name_end: &'static str,
    /// Grammar text between parallel calls; `None`: one call per turn.
    pub between: Option<&'static str>,
    /// What switches an `auto` grammar on (in `list_open + call_open`: the grammar starts after
    /// it).
    pub trigger: Option<&'static str>,
}

pub(super) fn shape(format: ToolFormat) -> Option<Shape> {
    let s = |list_open, list_close, call_open, name_end, between, trigger| Shape { list_open, list_close, call_open, name_end, between, trigger };
    Some(match format {
        ToolFormat::Qwen3Coder => s("", "", "<tool_call>\n<function=", ">\n", Some("/\\n{1,2}/ "), Some("<tool_call>")),
        ToolFormat::Gemma4 => s("", "", "<|tool_call>call:", "{", Some(""), Some("<|tool_call>")),
        ToolFormat::MiniCpm5 => s("", "", "<function name=\"", "\">", Some("\"\\n\" "), Some("<function name=")),
        ToolFormat::Glm => s("", "", "<tool_call>", "", Some("\"\\n\"? "), Some("<tool_call>")),
        ToolFormat::KimiK2 => s(
            "<|tool_calls_section_begin|>",
            "<|tool_calls_section_end|>",
            "<|tool_call_begin|>functions.",
            ":",
            Some(""),
            Some("<|tool_calls_section_begin|>"),
        ),
        ToolFormat::DeepSeekV31 => {
            s("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", Some(""), Some("<｜tool▁calls▁begin｜>"))
        }
        ToolFormat::Pythonic => s("<|tool_call_start|>[", "]<|tool_call_end|>", "", "(", Some("\", \" "), Some("<|tool_call_start|>")),
        // `auto`: from the recipient on, whichever header the model writes it in.
        ToolFormat::Harmony => s("", "", "<|channel|>commentary to=functions.", " <|constrain|>json<|message|>", None, Some("to=functions.")),
        ToolFormat::Hermes | ToolFormat::Llama3Json | ToolFormat::Mistral => return None,
    })
}

/// Markers the native layouts write, as special tokens where the vocabulary has them.
const MARKERS: &[&str] = &[
    "<tool_call>",
    "[TOOL_CALLS]",
    "<|tool_call>",
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁sep｜>",
    "<|tool_call_start|>",
    "<|tool_call_end|>",
    "<|channel|>",
    "<|constrain|>",
    "<|message|>",
    "<|start|>",
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
];

/// `text` as a grammar sequence: its markers as special tokens where they are, the rest text.
fn written(text: &str, special: SpecialTokens) -> String {
    let mut parts = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        match MARKERS.iter().filter_map(|m| rest.find(m).map(|i| (i, *m))).min() {
            Some((i, m)) => {
                if i > 0 {
                    parts.push(literal(&rest[..i]));
                }
                parts.push(marker(m, special));
                rest = &rest[i + m.len()..];
            }
            None => {
                parts.push(literal(rest));
                break;
            }
        }
    }
    if parts.is_empty() {
        "\"\"".to_string()
    } else {
        parts.join(" ")
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
