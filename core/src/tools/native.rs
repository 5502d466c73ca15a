//! Tool calls in the non-JSON syntaxes current models are trained on, parsed as they stream:
//!
//! - Qwen3-Coder XML (Qwen3-Coder, Qwen3.5 / 3.6):
//!   `<tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n</function>\n</tool_call>`.
//!   Values are raw text, typed by the tool's JSON schema (an integer parameter's `1` is the
//!   number 1, a string parameter's `1` the string "1"; objects and arrays are JSON).
//! - Gemma 4: `<|tool_call>call:NAME{key:VALUE,...}<tool_call|>`, strings quoted as
//!   `<|"|>text<|"|>`, bare keys, nested `{}` / `[]`, numbers and `true` / `false` / `null`.
//!
//! Both produce the same [`Parsed`] text and [`ToolDelta`]s as the JSON syntaxes' parser, the
//! arguments as JSON text in Python's `json.dumps` spacing (`{"city": "Paris", "days": 2}`), which
//! is what the templates render back in history.

use std::collections::HashMap;

use serde_json::{Map, Value};

use super::parser::{Parsed, ToolDelta};
use super::prompt::python_json;
use super::{new_call_id, ToolCall, ToolSpec};

/// A native (non-JSON) call syntax.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NativeFormat {
    Qwen3Coder,
    Gemma4,
}

impl NativeFormat {
    fn markers(self) -> (&'static str, &'static str) {
        match self {
            Self::Qwen3Coder => ("<tool_call>", "</tool_call>"),
            Self::Gemma4 => ("<|tool_call>", "<tool_call|>"),
        }
    }
}

const FUNCTION: &str = "<function=";
const END_FUNCTION: &str = "</function>";
const PARAMETER: &str = "<parameter=";
const END_PARAMETER: &str = "</parameter>";
const GEMMA_QUOTE: &str = "<|\"|>";

/// The streaming parser of one output in a native syntax.
pub struct NativeCallParser {
    format: NativeFormat,
    /// Tool name → its parameters' `properties` schema.
    properties: HashMap<String, Map<String, Value>>,
    /// Inside a call region (after its start marker).
    in_call: bool,
    /// Text mode: held-back text that may begin a start marker. Call mode: the region's text.
    pending: String,
    /// Call mode: how far into `pending` the call has been delivered.
    consumed: usize,
    /// Call mode: parameters delivered so far; `None` until the call's `Start` went out.
    params_sent: Option<usize>,
    calls: Vec<ToolCall>,
    completed: usize,
    /// A call just ended: whitespace after it only separates calls.
    after_call: bool,
    /// Deltas of a forced call's opening (written by the prompt), released with the first push.
    opening_deltas: Vec<ToolDelta>,
}

impl NativeCallParser {
    pub fn new(format: NativeFormat, specs: &[ToolSpec]) -> Self {
        let properties = specs
            .iter()
            .map(|s| (s.name.clone(), s.parameters.get("properties").and_then(Value::as_object).cloned().unwrap_or_default()))
            .collect();
        Self {
            format,
            properties,
            in_call: false,
            pending: String::new(),
            consumed: 0,
            params_sent: None,
            calls: Vec::new(),
            completed: 0,
            after_call: false,
            opening_deltas: Vec::new(),
        }
    }

    /// The output continues `opening`, text the prompt already wrote (a forced call's start);
    /// what it means comes out with the first push.
    pub fn set_opening(&mut self, opening: &str) {
        if !opening.is_empty() {
            self.opening_deltas = self.push(opening).deltas;
        }
    }

    /// The calls so far (a call still being written has the arguments delivered so far).
    pub fn calls(&self) -> &[ToolCall] {
        &self.calls
    }

    /// How many calls were read to their end marker.
    pub fn completed_calls(&self) -> usize {
        self.completed
    }

    pub fn push(&mut self, text: &str) -> Parsed {
        self.pending.push_str(text);
        let mut out = Parsed { text: String::new(), deltas: std::mem::take(&mut self.opening_deltas) };
        while self.step(&mut out, false) {}
        out
    }

    /// The end of the output. A region that never became a call is given back as text; a call
    /// cut short stays incomplete ([`NativeCallParser::completed_calls`] does not count it).
    pub fn finish(&mut self) -> Parsed {
        let mut out = Parsed { text: String::new(), deltas: std::mem::take(&mut self.opening_deltas) };
        while self.step(&mut out, true) {}
        if self.in_call {
            if self.params_sent.is_none() {
                out.text.push_str(self.format.markers().0);
                out.text.push_str(&self.pending);
            }
            self.in_call = false;
        } else if !(self.after_call && self.pending.trim().is_empty()) {
            out.text.push_str(&self.pending);
        }
        self.pending.clear();
        out
    }

    fn step(&mut self, out: &mut Parsed, at_end: bool) -> bool {
        let (start, end) = self.format.markers();
        if !self.in_call {
            if let Some(i) = self.pending.find(start) {
                let before = &self.pending[..i];
                if !(self.after_call && before.trim().is_empty()) {
                    out.text.push_str(before);
                }
                self.pending.drain(..i + start.len());
                self.in_call = true;
                self.consumed = 0;
                self.params_sent = None;
                self.after_call = false;
                return true;
            }
            if at_end {
                return false;
            }
            let keep = partial_marker_len(&self.pending, start);
            let ready = self.pending.len() - keep;
            // Whitespace after a call is held until it is known whether another call follows.
            if ready == 0 || (self.after_call && self.pending[..ready].trim().is_empty()) {
                return false;
            }
            out.text.push_str(&self.pending[..ready]);
            self.pending.drain(..ready);
            self.after_call = false;
            return false;
        }
        let end_at = self.pending.find(end);
        let region_end = end_at.unwrap_or(self.pending.len());
        match self.format {
            NativeFormat::Qwen3Coder => self.xml_progress(region_end, end_at.is_some(), out),
            NativeFormat::Gemma4 => {}
        }
        let Some(i) = end_at else { return false };
        match self.format {
            NativeFormat::Qwen3Coder => {
                if let Some(sent) = self.params_sent {
                    let index = self.calls.len() - 1;
                    let close = if sent == 0 { "{}" } else { "}" };
                    self.calls[index].arguments.push_str(close);
                    out.deltas.push(ToolDelta::Arguments { index, fragment: close.into() });
                    self.completed += 1;
                } else {
                    // No `<function=...>` inside: not a call.
                    out.text.push_str(start);
                    out.text.push_str(&self.pending[..i + end.len()]);
                }
            }
            NativeFormat::Gemma4 => match gemma_call(&self.pending[..i], &self.properties) {
                Some((name, arguments)) => {
                    let index = self.calls.len();
                    let id = new_call_id();
                    out.deltas.push(ToolDelta::Start { index, id: id.clone(), name: name.clone() });
                    out.deltas.push(ToolDelta::Arguments { index, fragment: arguments.clone() });
                    self.calls.push(ToolCall { id, name, arguments });
                    self.completed += 1;
                }
                None => {
                    out.text.push_str(start);
                    out.text.push_str(&self.pending[..i + end.len()]);
                }
            },
        }
        self.pending.drain(..i + end.len());
        self.in_call = false;
        self.after_call = true;
        true
    }

    /// Delivers what the XML region up to `region_end` completes: the call's start once its
    /// `<function=NAME>` is whole, then each parameter once its `</parameter>` arrives (or the
    /// function / region ends it).
    fn xml_progress(&mut self, region_end: usize, region_closed: bool, out: &mut Parsed) {
        let body = &self.pending[..region_end];
        if self.params_sent.is_none() {
            let Some(f) = body.find(FUNCTION) else { return };
            let Some(close) = body[f..].find('>') else { return };
            let name = body[f + FUNCTION.len()..f + close].trim().to_string();
            let index = self.calls.len();
            let id = new_call_id();
            out.deltas.push(ToolDelta::Start { index, id: id.clone(), name: name.clone() });
            self.calls.push(ToolCall { id, name, arguments: String::new() });
            self.params_sent = Some(0);
            self.consumed = f + close + 1;
        }
        loop {
            let body = &self.pending[self.consumed..region_end];
            let Some(p) = body.find(PARAMETER) else { return };
            let Some(close) = body[p..].find('>') else { return };
            let name = body[p + PARAMETER.len()..p + close].trim().to_string();
            let value_start = p + close + 1;
            let rest = &body[value_start..];
            // A value ends at `</parameter>`, or (a model that left it out) at the next
            // parameter, the end of the function, or the end of the region.
            let ends = [rest.find(END_PARAMETER), rest.find(PARAMETER), rest.find(END_FUNCTION)];
            let (value_len, skip) = match ends {
                [Some(e), ..] if ends[1..].iter().flatten().all(|o| *o >= e) => (e, END_PARAMETER.len()),
                [_, a, b] => match a.into_iter().chain(b).min() {
                    Some(e) => (e, 0),
                    None if region_closed => (rest.len(), 0),
                    None => return,
                },
            };
            let raw = &rest[..value_len];
            let raw = raw.strip_prefix('\n').unwrap_or(raw);
            let raw = raw.strip_suffix('\n').unwrap_or(raw);
            let index = self.calls.len() - 1;
            let schema = self.properties.get(&self.calls[index].name).and_then(|p| p.get(&name));
            let value = typed_value(raw, schema);
            let sent = self.params_sent.unwrap_or(0);
            let fragment = format!("{}{}: {}", if sent == 0 { "{" } else { ", " }, Value::from(name), python_json(&value));
            self.calls[index].arguments.push_str(&fragment);
            out.deltas.push(ToolDelta::Arguments { index, fragment });
            self.params_sent = Some(sent + 1);
            self.consumed += value_start + value_len + skip;
        }
    }
}

/// The length of the longest proper prefix of `marker` that `text` ends with.
fn partial_marker_len(text: &str, marker: &str) -> usize {
    (1..marker.len().min(text.len() + 1))
        .rev()
        .find(|&n| text.is_char_boundary(text.len() - n) && marker.starts_with(&text[text.len() - n..]))
        .unwrap_or(0)
}

/// A parameter's raw text as the JSON value its schema types it as (text when it does not
/// parse as that type, or when the schema does not name the parameter).
fn typed_value(raw: &str, schema: Option<&Value>) -> Value {
    let Some(schema) = schema else { return Value::from(raw) };
    let types: Vec<&str> = match &schema["type"] {
        Value::String(t) => vec![t.as_str()],
        Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
        _ => vec![],
    };
    let trimmed = raw.trim();
    for t in &types {
        let parsed = match *t {
            "integer" => trimmed.parse::<i64>().ok().map(Value::from),
            "number" => serde_json::from_str::<serde_json::Number>(trimmed).ok().map(Value::Number),
            "boolean" => match trimmed.to_ascii_lowercase().as_str() {
                "true" => Some(Value::Bool(true)),
                "false" => Some(Value::Bool(false)),
                _ => None,
            },
            "null" => (trimmed == "null" || trimmed == "None").then_some(Value::Null),
            "object" | "array" => serde_json::from_str::<Value>(trimmed).ok().filter(|v| v.is_object() == (*t == "object") && (v.is_array() == (*t == "array"))),
            _ => None,
        };
        if let Some(v) = parsed {
            return v;
        }
    }
    if types.is_empty() && schema.get("enum").is_none() {
        // An untyped schema: JSON when the text is JSON, else the text.
        if let Ok(v) = serde_json::from_str::<Value>(trimmed) {
            return v;
        }
    }
    Value::from(raw)
}

/// A whole Gemma 4 call body (`call:NAME{...}`) as its name and JSON arguments.
fn gemma_call(body: &str, properties: &HashMap<String, Map<String, Value>>) -> Option<(String, String)> {
    let body = body.trim().strip_prefix("call:")?;
    let brace = body.find('{')?;
    let name = body[..brace].trim().to_string();
    let mut reader = GemmaReader { text: &body[brace..], pos: 0 };
    let args = reader.value()?;
    if !reader.text[reader.pos..].trim().is_empty() || !args.is_object() {
        return None;
    }
    // Strings the schema types otherwise (a model that quoted a number) are converted.
    let args = match (args, properties.get(&name)) {
        (Value::Object(m), Some(props)) => Value::Object(
            m.into_iter()
                .map(|(k, v)| {
                    let v = match (&v, props.get(&k)) {
                        (Value::String(s), Some(schema)) if schema["type"] != "string" => typed_value(s, Some(schema)),
                        _ => v,
                    };
                    (k, v)
                })
                .collect(),
        ),
        (args, _) => args,
    };
    Some((name, python_json(&args)))
}

/// Reads Gemma 4's argument notation.
struct GemmaReader<'a> {
    text: &'a str,
    pos: usize,
}

impl GemmaReader<'_> {
    fn rest(&self) -> &str {
        &self.text[self.pos..]
    }

    fn skip_ws(&mut self) {
        let rest = self.rest();
        self.pos += rest.len() - rest.trim_start().len();
    }

    fn eat(&mut self, s: &str) -> bool {
        self.skip_ws();
        if self.rest().starts_with(s) {
            self.pos += s.len();
            true
        } else {
            false
        }
    }

    fn value(&mut self) -> Option<Value> {
        self.skip_ws();
        if self.eat("{") {
            let mut m = Map::new();
            if self.eat("}") {
                return Some(Value::Object(m));
            }
            loop {
                let key = if self.rest().starts_with(GEMMA_QUOTE) { self.quoted()? } else { self.bare_key()? };
                if !self.eat(":") {
                    return None;
                }
                let v = self.value()?;
                m.insert(key, v);
                if self.eat("}") {
                    return Some(Value::Object(m));
                }
                if !self.eat(",") {
                    return None;
                }
            }
        }
        if self.eat("[") {
            let mut a = Vec::new();
            if self.eat("]") {
                return Some(Value::Array(a));
            }
            loop {
                a.push(self.value()?);
                if self.eat("]") {
                    return Some(Value::Array(a));
                }
                if !self.eat(",") {
                    return None;
                }
            }
        }
        if self.rest().starts_with(GEMMA_QUOTE) {
            return self.quoted().map(Value::String);
        }
        // A number or literal: up to the next delimiter.
        let rest = self.rest();
        let len = rest.find([',', '}', ']']).unwrap_or(rest.len());
        let token = rest[..len].trim().to_string();
        self.pos += len;
        match token.as_str() {
            "true" => Some(Value::Bool(true)),
            "false" => Some(Value::Bool(false)),
            "null" => Some(Value::Null),
            _ => serde_json::from_str::<serde_json::Number>(&token).ok().map(Value::Number),
        }
    }

    fn quoted(&mut self) -> Option<String> {
        self.pos += GEMMA_QUOTE.len();
        let len = self.rest().find(GEMMA_QUOTE)?;
        let s = self.rest()[..len].to_string();
        self.pos += len + GEMMA_QUOTE.len();
        Some(s)
    }

    fn bare_key(&mut self) -> Option<String> {
        self.skip_ws();
        let rest = self.rest();
        let len = rest.find(':')?;
        let key = rest[..len].trim().trim_matches('"').to_string();
        self.pos += len;
        (!key.is_empty()).then_some(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::Assembler;

    fn spec(name: &str, properties: Value) -> ToolSpec {
        let parameters = serde_json::json!({"type": "object", "properties": properties});
        ToolSpec { name: name.into(), description: None, parameters: parameters.clone(), raw: parameters }
    }

    fn specs() -> Vec<ToolSpec> {
        vec![
            spec("special_function", serde_json::json!({"arg1": {"type": "integer"}})),
            spec("special_function_with_opt", serde_json::json!({"arg1": {"type": "integer"}, "arg2": {"type": "integer"}})),
            spec("python", serde_json::json!({"code": {"type": "string"}})),
            spec("edit", serde_json::json!({"filename": {"type": "string"}, "oldString": {"type": "string"}, "newString": {"type": "string"}})),
            spec("get_time", serde_json::json!({"city": {"type": "string"}})),
            spec("get_weather", serde_json::json!({"city": {"type": "string"}})),
            spec("amount", serde_json::json!({"orig": {"type": "number"}})),
            spec("toggle", serde_json::json!({"enabled": {"type": "boolean"}})),
            spec("cfg", serde_json::json!({"opts": {"type": "object"}, "tags": {"type": "array"}, "n": {"type": "string"}})),
        ]
    }

    /// Parses `text` in pieces of every size from 1 to 7 chars and whole; asserts every way
    /// gives the same text and calls and that the deltas assemble to the calls. Returns the
    /// text and (name, arguments) pairs.
    fn parse(format: NativeFormat, text: &str) -> (String, Vec<(String, String)>, usize) {
        let chars: Vec<char> = text.chars().collect();
        let mut first = None;
        for step in [chars.len().max(1), 1, 2, 3, 5, 7] {
            let mut p = NativeCallParser::new(format, &specs());
            let mut out = String::new();
            let mut asm = Assembler::default();
            for piece in chars.chunks(step) {
                let parsed = p.push(&piece.iter().collect::<String>());
                out.push_str(&parsed.text);
                parsed.deltas.iter().for_each(|d| asm.apply(d));
            }
            let tail = p.finish();
            out.push_str(&tail.text);
            tail.deltas.iter().for_each(|d| asm.apply(d));
            assert_eq!(asm.calls, p.calls(), "deltas assemble to the calls (step {step})");
            let calls: Vec<(String, String)> = p.calls().iter().map(|c| (c.name.clone(), c.arguments.clone())).collect();
            let got = (out, calls, p.completed_calls());
            match &first {
                None => first = Some(got),
                Some(f) => assert_eq!(&got, f, "step {step} of {text:?}"),
            }
        }
        first.unwrap()
    }

    fn call(name: &str, args: &str) -> (String, String) {
        (name.into(), args.into())
    }

    // The native strings below are llama.cpp's test vectors (tests/test-chat.cpp in the
    // llama-cpp-python 0.3.36 sdist) for these templates, with the arguments they expect.

    #[test]
    fn qwen3_coder_calls_typed_by_the_schema() {
        let text = "<tool_call>\n<function=special_function>\n<parameter=arg1>\n1\n</parameter>\n</function>\n</tool_call>";
        assert_eq!(parse(NativeFormat::Qwen3Coder, text), (String::new(), vec![call("special_function", r#"{"arg1": 1}"#)], 1));
        let parallel = "<tool_call>\n<function=special_function>\n<parameter=arg1>\n1\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=special_function_with_opt>\n<parameter=arg1>\n1\n</parameter>\n<parameter=arg2>\n2\n</parameter>\n</function>\n</tool_call>";
        assert_eq!(
            parse(NativeFormat::Qwen3Coder, parallel).1,
            vec![call("special_function", r#"{"arg1": 1}"#), call("special_function_with_opt", r#"{"arg1": 1, "arg2": 2}"#)]
        );
    }

    #[test]
    fn qwen3_coder_multiline_string_values_are_kept() {
        let text = "<tool_call>\n<function=python>\n<parameter=code>\ndef hello():\n    print(\"Hello, world!\")\n\nhello()\n</parameter>\n</function>\n</tool_call>";
        assert_eq!(
            parse(NativeFormat::Qwen3Coder, text).1,
            vec![call("python", "{\"code\": \"def hello():\\n    print(\\\"Hello, world!\\\")\\n\\nhello()\"}")]
        );
        let edit = "<tool_call>\n<function=edit>\n<parameter=filename>\nfoo.c\n</parameter>\n<parameter=oldString>\n#iclunde\n</parameter>\n<parameter=newString>\n#include\n</parameter>\n</function>\n</tool_call>";
        assert_eq!(
            parse(NativeFormat::Qwen3Coder, edit).1,
            vec![call("edit", r##"{"filename": "foo.c", "oldString": "#iclunde", "newString": "#include"}"##)]
        );
        // A value that itself ends in a newline keeps it.
        let trailing = "<tool_call>\n<function=edit>\n<parameter=newString>\n#include\n\n</parameter>\n</function>\n</tool_call>";
        assert_eq!(parse(NativeFormat::Qwen3Coder, trailing).1, vec![call("edit", "{\"newString\": \"#include\\n\"}")]);
    }

    #[test]
    fn qwen3_coder_text_around_calls_and_cut_calls() {
        let (text, calls, done) = parse(NativeFormat::Qwen3Coder, "Let me check.\n<tool_call>\n<function=get_time>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>\n");
        assert_eq!((text.as_str(), done), ("Let me check.\n", 1));
        assert_eq!(calls, vec![call("get_time", r#"{"city": "Paris"}"#)]);
        // Cut by the token budget: the call is started but not completed.
        let (_, calls, done) = parse(NativeFormat::Qwen3Coder, "<tool_call>\n<function=get_time>\n<parameter=city>\nPar");
        assert_eq!((calls, done), (vec![call("get_time", "")], 0));
        // A region without a function is text.
        assert_eq!(parse(NativeFormat::Qwen3Coder, "a <tool_call>b</tool_call> c").0, "a <tool_call>b</tool_call> c");
        assert_eq!(parse(NativeFormat::Qwen3Coder, "just text <tool").0, "just text <tool");
        // No parameters.
        assert_eq!(parse(NativeFormat::Qwen3Coder, "<tool_call>\n<function=get_time>\n</function>\n</tool_call>").1, vec![call("get_time", "{}")]);
    }

    #[test]
    fn values_that_do_not_fit_their_type_stay_text() {
        let text = "<tool_call>\n<function=cfg>\n<parameter=opts>\n{\"a\": [1, 2]}\n</parameter>\n<parameter=tags>\n[\"x\"]\n</parameter>\n<parameter=n>\n12\n</parameter>\n<parameter=other>\n3\n</parameter>\n</function>\n</tool_call>";
        assert_eq!(parse(NativeFormat::Qwen3Coder, text).1, vec![call("cfg", r#"{"opts": {"a": [1, 2]}, "tags": ["x"], "n": "12", "other": "3"}"#)]);
        let bad = "<tool_call>\n<function=special_function>\n<parameter=arg1>\nmany\n</parameter>\n</function>\n</tool_call>";
        assert_eq!(parse(NativeFormat::Qwen3Coder, bad).1, vec![call("special_function", r#"{"arg1": "many"}"#)]);
    }

    #[test]
    fn gemma4_calls() {
        let q = GEMMA_QUOTE;
        let one = format!("<|tool_call>call:get_time{{city:{q}London{q}}}<tool_call|>");
        assert_eq!(parse(NativeFormat::Gemma4, &one), (String::new(), vec![call("get_time", r#"{"city": "London"}"#)], 1));
        let with_text = format!("Hello, world!\nWhat's up?<|tool_call>call:get_time{{city:{q}Paris{q}}}<tool_call|>");
        assert_eq!(parse(NativeFormat::Gemma4, &with_text).0, "Hello, world!\nWhat's up?");
        assert_eq!(parse(NativeFormat::Gemma4, "<|tool_call>call:empty_args{}<tool_call|>").1, vec![call("empty_args", "{}")]);
        let parallel = format!("<|tool_call>call:get_time{{city:{q}London{q}}}<tool_call|><|tool_call>call:get_weather{{city:{q}Paris{q}}}<tool_call|>");
        assert_eq!(parse(NativeFormat::Gemma4, &parallel).1, vec![call("get_time", r#"{"city": "London"}"#), call("get_weather", r#"{"city": "Paris"}"#)]);
        assert_eq!(parse(NativeFormat::Gemma4, "<|tool_call>call:special_function{arg1:-7}<tool_call|>").1, vec![call("special_function", r#"{"arg1": -7}"#)]);
        assert_eq!(parse(NativeFormat::Gemma4, "<|tool_call>call:amount{orig:3.14}<tool_call|>").1, vec![call("amount", r#"{"orig": 3.14}"#)]);
        assert_eq!(parse(NativeFormat::Gemma4, "<|tool_call>call:toggle{enabled:true}<tool_call|>").1, vec![call("toggle", r#"{"enabled": true}"#)]);
        let nested = format!("<|tool_call>call:cfg{{opts:{{a:[1,{q}x, y{q}],b:null}},n:{q}1{q}}}<tool_call|>");
        assert_eq!(parse(NativeFormat::Gemma4, &nested).1, vec![call("cfg", r#"{"opts": {"a": [1, "x, y"], "b": null}, "n": "1"}"#)]);
        // Malformed or cut: text, no call.
        let (text, calls, _) = parse(NativeFormat::Gemma4, "<|tool_call>call:get_time{city:<tool_call|>");
        assert_eq!((text.as_str(), calls.len()), ("<|tool_call>call:get_time{city:<tool_call|>", 0));
        let (text, calls, _) = parse(NativeFormat::Gemma4, "<|tool_call>call:get_ti");
        assert_eq!((text.as_str(), calls.len()), ("<|tool_call>call:get_ti", 0));
    }
}
