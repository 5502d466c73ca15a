//! Tool calls in the non-JSON-object syntaxes current models are trained on, parsed as they
//! stream. One file per family reads its call text; this module finds the call regions in the
//! output (the family's markers), holds back what may be the start of a marker, and turns each
//! region into [`ToolDelta`]s:
//!
//! - Qwen3-Coder XML, Qwen3.5 / 3.6 ([`qwen3_coder`]): `<tool_call>\n<function=NAME>\n
//!   <parameter=P>\nVALUE\n</parameter>…`, delivered parameter by parameter.
//! - Gemma 4 ([`gemma4`]): `<|tool_call>call:NAME{key:VALUE,…}<tool_call|>`.
//! - MiniCPM5 ([`minicpm5`]): `<function name="NAME"><param name="P">VALUE</param></function>`.
//! - GLM 4.5 – 4.7 ([`glm`]): `<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>…
//!   </tool_call>`.
//! - Kimi K2 ([`kimi`]): `<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX
//!   <|tool_call_argument_begin|>{JSON}<|tool_call_end|>…<|tool_calls_section_end|>`.
//! - DeepSeek V3.1 ([`deepseek`]): `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>
//!   {JSON}<｜tool▁call▁end｜>…<｜tool▁calls▁end｜>`.
//! - pythonic, LFM2 / LFM2.5 ([`pythonic`]): `<|tool_call_start|>[f(a=1, b="x"), g()]
//!   <|tool_call_end|>`.
//! - gpt-oss harmony ([`harmony`]): `<|channel|>commentary to=functions.NAME <|constrain|>json
//!   <|message|>{JSON}<|call|>` (the reasoning splitter passes call messages on as text).
//!
//! Values are typed by the tool's JSON schema where the syntax writes them as text (an integer
//! parameter's `1` is the number 1, a string parameter's `1` the string "1"). Arguments come out
//! as JSON text in Python's `json.dumps` spacing (`{"city": "Paris", "days": 2}`), which is what
//! the templates render back in history.

mod deepseek;
mod gemma4;
mod glm;
mod harmony;
mod kimi;
mod minicpm5;
mod pythonic;
mod qwen3_coder;

use std::collections::HashMap;

use serde_json::{Map, Value};

use super::parser::{Parsed, ToolDelta};
use super::prompt::python_json;
use super::{new_call_id, ToolCall, ToolSpec};


/// A native call syntax.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NativeFormat {
    Qwen3Coder,
    Gemma4,
    MiniCpm5,
    Glm,
    KimiK2,
    DeepSeekV31,
    Pythonic,
    Harmony,
}

/// Where a family's calls sit in the text.
pub(crate) struct Layout {
    /// Markers that open a call region (the region's text follows the marker).
    pub starts: &'static [&'static str],
    /// The marker that closes a region.
    pub end: &'static str,
    /// Markers around a list of calls: dropped from the text.
    pub wrappers: &'static [&'static str],
    /// The end marker is an end-of-turn token the output may not show: a region the output
    /// ends in is read as a whole call.
    pub ends_at_eos: bool,
}

impl NativeFormat {
    pub(crate) fn layout(self) -> &'static Layout {
        match self {
            Self::Qwen3Coder => &qwen3_coder::LAYOUT,
            Self::Gemma4 => &gemma4::LAYOUT,
            Self::MiniCpm5 => &minicpm5::LAYOUT,
            Self::Glm => &glm::LAYOUT,
            Self::KimiK2 => &kimi::LAYOUT,
            Self::DeepSeekV31 => &deepseek::LAYOUT,
            Self::Pythonic => &pythonic::LAYOUT,
            Self::Harmony => &harmony::LAYOUT,
        }
    }

    /// Where the region in `body` ends (the end marker's position), if it has.
    fn region_end(self, body: &str) -> Option<usize> {
        match self {
            // A CDATA value may hold the end marker.
            Self::MiniCpm5 => minicpm5::region_end(body),
            _ => body.find(self.layout().end),
        }
    }

    /// A whole region (opened by `opener`, its end marker left out) as calls: names and
    /// argument objects. `None`: not a call (given back as text).
    fn parse_region(self, opener: &str, body: &str, properties: &Properties) -> Option<Vec<(String, Value)>> {
        match self {
            Self::Qwen3Coder => None, // delivered as it streams ([`NativeCallParser::xml_progress`])
            Self::Gemma4 => gemma4::parse(body, properties).map(|c| vec![c]),
            Self::MiniCpm5 => minicpm5::parse(body, properties).map(|c| vec![c]),
            Self::Glm => glm::parse(body, properties).map(|c| vec![c]),
            Self::KimiK2 => kimi::parse(body, properties).map(|c| vec![c]),
            Self::DeepSeekV31 => deepseek::parse(body, properties).map(|c| vec![c]),
            Self::Pythonic => pythonic::parse(body, properties),
            Self::Harmony => harmony::parse(opener, body, properties).map(|c| vec![c]),
        }
    }
}

/// Tool name → its parameters' `properties` schema.
pub(crate) type Properties = HashMap<String, Map<String, Value>>;

/// A reading position in a call's argument text, for the notations read by hand (Gemma 4's,
/// Python literals).
struct Cursor<'a> {
    text: &'a str,
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn new(text: &'a str) -> Self {
        Cursor { text, pos: 0 }
    }

    fn rest(&self) -> &'a str {
        &self.text[self.pos..]
    }

    fn skip_ws(&mut self) {
        let rest = self.rest();
        self.pos += rest.len() - rest.trim_start().len();
    }

    /// Skips white space, then `s` if it comes next.
    fn eat(&mut self, s: &str) -> bool {
        self.skip_ws();
        if self.rest().starts_with(s) {
            self.pos += s.len();
            true
        } else {
            false
        }
    }
}

/// The streaming parser of one output in a native syntax.
pub struct NativeCallParser {
    format: NativeFormat,
    properties: Properties,
    /// Inside a call region (after its start marker).
    in_call: bool,
    /// The marker that opened the current region.
    opener: &'static str,
    /// Text mode: held-back text that may begin a marker. Call mode: the region's text.
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
            opener: "",
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
            let layout = self.format.layout();
            if self.format == NativeFormat::Qwen3Coder {
                if self.params_sent.is_none() {
                    out.text.push_str(self.opener);
                    out.text.push_str(&self.pending);
                }
            } else if layout.ends_at_eos {
                let region = std::mem::take(&mut self.pending);
                self.close_region(&region, "", &mut out);
            } else {
                out.text.push_str(self.opener);
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
        let layout = self.format.layout();
        if !self.in_call {
            // The first marker in the text (the longer one where two start at the same place).
            let found = layout
                .starts
                .iter()
                .chain(layout.wrappers)
                .filter_map(|m| self.pending.find(m).map(|i| (i, std::cmp::Reverse(m.len()), *m)))
                .min();
            if let Some((i, _, m)) = found {
                let before = &self.pending[..i];
                if !(self.after_call && before.trim().is_empty()) {
                    out.text.push_str(before);
                }
                self.pending.drain(..i + m.len());
                if layout.wrappers.contains(&m) {
                    // Whitespace between a list's marker and its calls only separates them.
                    self.after_call = true;
                    return true;
                }
                self.in_call = true;
                self.opener = m;
                self.consumed = 0;
                self.params_sent = None;
                self.after_call = false;
                return true;
            }
            if at_end {
                return false;
            }
            let keep = layout.starts.iter().chain(layout.wrappers).map(|m| partial_marker_len(&self.pending, m)).max().unwrap_or(0);
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
        let end_at = self.format.region_end(&self.pending);
        if self.format == NativeFormat::Qwen3Coder {
            let region_end = end_at.unwrap_or(self.pending.len());
            self.xml_progress(region_end, end_at.is_some(), out);
        }
        let Some(i) = end_at else { return false };
        let end = layout.end;
        if self.format == NativeFormat::Qwen3Coder {
            self.xml_close(i, out);
        } else {
            let region = self.pending[..i].to_string();
            self.close_region(&region, end, out);
        }
        self.pending.drain(..i + end.len());
        self.in_call = false;
        self.after_call = true;
        true
    }

    /// A whole region read: its calls out as deltas, or (not a call) its text.
    fn close_region(&mut self, region: &str, end: &str, out: &mut Parsed) {
        match self.format.parse_region(self.opener, region, &self.properties) {
            Some(calls) => {
                for (name, arguments) in calls {
                    let arguments = python_json(&arguments);
                    let index = self.calls.len();
                    let id = new_call_id();
                    out.deltas.push(ToolDelta::Start { index, id: id.clone(), name: name.clone() });
                    out.deltas.push(ToolDelta::Arguments { index, fragment: arguments.clone() });
                    self.calls.push(ToolCall { id, name, arguments });
                    self.completed += 1;
                }
            }
            None => {
                out.text.push_str(self.opener);
                out.text.push_str(region);
                out.text.push_str(end);
            }
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

/// The JSON types a property schema names (`type` as a name or a list).
fn schema_types(schema: &Value) -> Vec<&str> {
    match &schema["type"] {
        Value::String(t) => vec![t.as_str()],
        Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
        _ => vec![],
    }
}

/// A parameter's raw text as the JSON value its schema types it as (text when it does not
/// parse as that type, or when the schema does not name the parameter).
fn typed_value(raw: &str, schema: Option<&Value>) -> Value {
    let Some(schema) = schema else { return Value::from(raw) };
    let types = schema_types(schema);
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

/// Arguments read as values (JSON, Python literals, Gemma's notation) with strings the tool's
/// schema types otherwise (a model that quoted a number) converted.
fn retyped(name: &str, args: Value, properties: &Properties) -> Value {
    match (args, properties.get(name)) {
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
    }
}

/// A JSON object's text as arguments (JSON, or a Python dict literal as models sometimes write
/// one), typed by the schema.
fn json_arguments(name: &str, text: &str, properties: &Properties) -> Option<Value> {
    let text = text.trim();
    let args = match serde_json::from_str::<Value>(text) {
        Ok(v) => v,
        Err(_) => pythonic::literal(text)?,
    };
    args.is_object().then(|| retyped(name, args, properties))
}

#[cfg(test)]
mod tests;
