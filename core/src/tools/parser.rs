//! Finds tool calls in generated text as it streams: ordinary text passes through, the text
//! of a call never does; each call surfaces as a [`ToolDelta::Start`] (id and name) followed by
//! [`ToolDelta::Arguments`] fragments of its arguments' JSON text, as OpenAI streams them.
//!
//! The syntaxes ([`ToolFormat`]):
//! - Hermes / Qwen: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, repeated for
//!   parallel calls.
//! - Llama 3.x: a JSON object `{"name": ..., "parameters": {...}}` as the whole reply (or after
//!   `<|python_tag|>`), several separated by `;`.
//! - Mistral: `[TOOL_CALLS]` and a JSON array of `{"name": ..., "arguments": {...}}`.

use super::{new_call_id, ToolCall, ToolFormat};

/// A piece of a call, in the order the model wrote it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ToolDelta {
    /// Call number `index` (0-based, in this output) begins.
    Start { index: usize, id: String, name: String },
    /// More of call `index`'s arguments JSON text.
    Arguments { index: usize, fragment: String },
}

/// What one piece of generated text turned into.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Parsed {
    pub text: String,
    pub deltas: Vec<ToolDelta>,
}

struct Syntax {
    starts: &'static [&'static str],
    end: Option<&'static str>,
    /// A reply that begins with `{` is a call (Llama's JSON mode).
    bare_json_at_start: bool,
}

fn syntax(format: ToolFormat) -> Syntax {
    match format {
        ToolFormat::Hermes => Syntax { starts: &["<tool_call>"], end: Some("</tool_call>"), bare_json_at_start: false },
        ToolFormat::Llama3Json => Syntax { starts: &["<|python_tag|>"], end: None, bare_json_at_start: true },
        ToolFormat::Mistral => Syntax { starts: &["[TOOL_CALLS]"], end: None, bare_json_at_start: false },
        // The native syntaxes have their own parser ([`super::native`]); JSON inside their
        // markers is the closest reading should one be given here.
        ToolFormat::Gemma4 => Syntax { starts: &["<|tool_call>"], end: Some("<tool_call|>"), bare_json_at_start: false },
        ToolFormat::Qwen3Coder
        | ToolFormat::MiniCpm5
        | ToolFormat::Glm
        | ToolFormat::KimiK2
        | ToolFormat::DeepSeekV31
        | ToolFormat::Pythonic
        | ToolFormat::Harmony => Syntax { starts: &["<tool_call>"], end: Some("</tool_call>"), bare_json_at_start: false },
    }
}

/// Keys a call object may hold; a first key outside these means the JSON is not a call.
const NAME_KEY: &str = "name";
const ARGUMENT_KEYS: &[&str] = &["arguments", "parameters"];
const OTHER_CALL_KEYS: &[&str] = &["type", "id"];

/// Scans one JSON value incrementally: which characters belong to it and where it ends.
#[derive(Default)]
struct ValueScan {
    depth: usize,
    in_string: bool,
    escaped: bool,
    started: bool,
    scalar: bool,
}

enum Step {
    /// The character is part of the value, which goes on.
    Part,
    /// The character completes the value.
    Last,
    /// The value ended before this character (a number or literal ended by a delimiter).
    Ended,
}

impl ValueScan {
    fn feed(&mut self, c: char) -> Step {
        if !self.started {
            self.started = true;
            match c {
                '{' | '[' => self.depth = 1,
                '"' => self.in_string = true,
                _ => self.scalar = true,
            }
            return Step::Part;
        }
        if self.scalar {
            return if c == ',' || c == '}' || c == ']' || c.is_whitespace() { Step::Ended } else { Step::Part };
        }
        if self.in_string {
            if self.escaped {
                self.escaped = false;
            } else if c == '\\' {
                self.escaped = true;
            } else if c == '"' {
                self.in_string = false;
                if self.depth == 0 {
                    return Step::Last;
                }
            }
            return Step::Part;
        }
        match c {
            '"' => self.in_string = true,
            '{' | '[' => self.depth += 1,
            '}' | ']' => {
                self.depth -= 1;
                if self.depth == 0 {
                    return Step::Last;
                }
            }
            _ => {}
        }
        Step::Part
    }
}

/// Where the parser is inside one call object.
enum Obj {
    KeyOrEnd,
    Key { buf: String, escaped: bool },
    Colon { key: String },
    ValueStart { key: String },
    Value { key: String, scan: ValueScan, buf: String },
    CommaOrEnd,
}

/// One call object being read.
struct CallObj {
    state: Obj,
    keys_seen: usize,
    /// Its index in `calls` once its name is known.
    index: Option<usize>,
    /// Argument text read before the name (emitted once the name is known).
    early_arguments: String,
    /// Arguments given as a JSON string (decoded when complete).
    string_arguments: bool,
}

enum Region {
    /// Between values: a new call object, a separator, an array bracket, the end marker.
    Between { end_matched: usize },
    InObject(CallObj),
}

enum Mode {
    Text,
    Call { region: Region, in_array: bool, raw: String, calls_at_entry: usize },
}

/// The streaming parser of one output.
pub struct JsonCallParser {
    syntax: Syntax,
    mode: Mode,
    /// Text held back because it may be the beginning of a start marker.
    pending: String,
    /// Nothing but whitespace has been output yet.
    at_start: bool,
    calls: Vec<ToolCall>,
    /// Deltas of the opening, released with the first push.
    opening_deltas: Vec<ToolDelta>,
    /// Call objects read to their end.
    completed: usize,
    /// A call region just ended: whitespace after it is held, and dropped if another call or
    /// the end follows (it only separates calls).
    after_call: bool,
}

impl JsonCallParser {
    pub fn new(format: ToolFormat) -> Self {
        Self {
            syntax: syntax(format),
            mode: Mode::Text,
            pending: String::new(),
            at_start: true,
            calls: Vec::new(),
            opening_deltas: Vec::new(),
            completed: 0,
            after_call: false,
        }
    }

    /// A parser for output that continues `opening`, text the prompt already wrote for the
    /// model (a forced call's start, [`super::Tools::opening`]); what it means (a call's
    /// start) comes out with the first push.
    pub fn with_opening(format: ToolFormat, opening: &str) -> Self {
        let mut parser = Self::new(format);
        parser.opening_deltas = parser.push(opening).deltas;
        parser
    }

    /// The calls so far (arguments possibly incomplete while generation goes on).
    pub fn calls(&self) -> &[ToolCall] {
        &self.calls
    }

    /// How many calls were read to their end (their JSON object closed).
    pub fn completed_calls(&self) -> usize {
        self.completed
    }

    /// Feeds the next piece of generated text.
    pub fn push(&mut self, text: &str) -> Parsed {
        let mut out = Parsed { text: String::new(), deltas: std::mem::take(&mut self.opening_deltas) };
        let mut rest: String = text.to_string();
        loop {
            if matches!(self.mode, Mode::Text) {
                self.pending.push_str(&rest);
                rest.clear();
                match self.scan_text(&mut out) {
                    Some(after_marker) => rest = after_marker,
                    None => break,
                }
            } else {
                let mut chars = rest.char_indices();
                let mut back_to_text = None;
                for (i, c) in chars.by_ref() {
                    if let Some(reprocess) = self.call_char(c, &mut out) {
                        back_to_text = Some(if reprocess { i } else { i + c.len_utf8() });
                        break;
                    }
                }
                match back_to_text {
                    Some(at) => rest = rest[at..].to_string(),
                    None => break,
                }
            }
        }
        out
    }

    /// The end of the output: held-back text is released; a region that never became a call
    /// is given back as text; a call cut short keeps the arguments it has.
    pub fn finish(&mut self) -> Parsed {
        let mut out = Parsed { text: String::new(), deltas: std::mem::take(&mut self.opening_deltas) };
        match std::mem::replace(&mut self.mode, Mode::Text) {
            Mode::Text => {}
            Mode::Call { region, raw, calls_at_entry, .. } => {
                if let Region::InObject(obj) = region {
                    self.finish_object(obj, &mut out);
                }
                if self.calls.len() == calls_at_entry {
                    out.text.push_str(&raw);
                }
            }
        }
        let pending = std::mem::take(&mut self.pending);
        if !(self.after_call && pending.trim().is_empty()) {
            out.text.push_str(&pending);
        }
        out
    }

    /// Text mode: releases text up to a start marker; returns what follows the marker when one
    /// is found (the parser is then in call mode).
    fn scan_text(&mut self, out: &mut Parsed) -> Option<String> {
        if self.at_start && self.syntax.bare_json_at_start {
            let trimmed = self.pending.trim_start();
            if trimmed.is_empty() {
                return None;
            }
            self.at_start = false;
            if trimmed.starts_with('{') {
                let body = trimmed.to_string();
                let leading = self.pending[..self.pending.len() - body.len()].to_string();
                self.pending.clear();
                self.enter_call(leading);
                return Some(body);
            }
        }
        let found = self.syntax.starts.iter().filter_map(|m| self.pending.find(m).map(|at| (at, *m))).min();
        let separator = self.pending.len() - self.pending.trim_start().len();
        if self.after_call {
            match found {
                // Only whitespace between two calls: dropped.
                Some((at, _)) if at == separator => self.pending.drain(..separator).for_each(drop),
                Some(_) => self.after_call = false,
                None if self.marker_prefix_len() + separator >= self.pending.len() => return None,
                None => self.after_call = false,
            }
        }
        let found = self.syntax.starts.iter().filter_map(|m| self.pending.find(m).map(|at| (at, *m))).min();
        if let Some((at, marker)) = found {
            let after = self.pending[at + marker.len()..].to_string();
            out.text.push_str(&self.pending[..at]);
            self.note_output(&self.pending[..at].to_string());
            self.pending.clear();
            self.enter_call(marker.to_string());
            return Some(after);
        }
        let keep = self.marker_prefix_len();
        let release = self.pending.len() - keep;
        let released: String = self.pending[..release].to_string();
        self.note_output(&released);
        out.text.push_str(&released);
        self.pending.drain(..release);
        None
    }

    fn note_output(&mut self, text: &str) {
        if !text.trim().is_empty() {
            self.at_start = false;
        }
    }

    /// The longest tail of `pending` that begins some start marker.
    fn marker_prefix_len(&self) -> usize {
        let mut best = 0;
        for marker in self.syntax.starts {
            for len in (1..marker.len().min(self.pending.len()) + 1).rev() {
                if self.pending.is_char_boundary(self.pending.len() - len) && marker.starts_with(&self.pending[self.pending.len() - len..]) {
                    best = best.max(len);
                    break;
                }
            }
        }
        best
    }

    fn enter_call(&mut self, marker: String) {
        let calls_at_entry = self.calls.len();
        self.mode = Mode::Call { region: Region::Between { end_matched: 0 }, in_array: false, raw: marker, calls_at_entry };
    }

    /// One character in call mode. `Some(reprocess)` when the call region ended: `true` if
    /// this character belongs to the text after it.
    fn call_char(&mut self, c: char, out: &mut Parsed) -> Option<bool> {
        let end = self.syntax.end;
        let calls_so_far = self.calls.len();
        let Mode::Call { region, in_array, raw, calls_at_entry } = &mut self.mode else { return Some(true) };
        raw.push(c);
        match region {
            Region::Between { end_matched } => {
                if let Some(end) = end {
                    if *end_matched > 0 || c == '<' {
                        if end[*end_matched..].starts_with(c) {
                            *end_matched += c.len_utf8();
                            if *end_matched == end.len() {
                                self.after_call = calls_so_far > *calls_at_entry;
                                self.mode = Mode::Text;
                                return Some(false);
                            }
                        } else {
                            *end_matched = 0;
                        }
                        return None;
                    }
                }
                match c {
                    '{' => {
                        *region = Region::InObject(CallObj {
                            state: Obj::KeyOrEnd,
                            keys_seen: 0,
                            index: None,
                            early_arguments: String::new(),
                            string_arguments: false,
                        })
                    }
                    '[' if !*in_array => *in_array = true,
                    ']' if *in_array => *in_array = false,
                    c if c.is_whitespace() || c == ',' || c == ';' => {}
                    _ if end.is_none() => {
                        // Text resumes after a Mistral / Llama call list.
                        raw.pop();
                        let was_call = calls_so_far > *calls_at_entry;
                        let raw = std::mem::take(raw);
                        self.mode = Mode::Text;
                        if !was_call {
                            out.text.push_str(&raw);
                        }
                        self.after_call = was_call;
                        return Some(true);
                    }
                    _ => {}
                }
                None
            }
            Region::InObject(_) => {
                let Region::InObject(mut obj) = std::mem::replace(region, Region::Between { end_matched: 0 }) else {
                    unreachable!()
                };
                match self.object_char(&mut obj, c, out) {
                    ObjOutcome::Continue => {
                        if let Mode::Call { region, .. } = &mut self.mode {
                            *region = Region::InObject(obj);
                        }
                        None
                    }
                    ObjOutcome::Closed => {
                        if obj.index.is_some() {
                            self.completed += 1;
                        }
                        self.finish_object(obj, out);
                        None
                    }
                    ObjOutcome::NotACall => {
                        // Give the region back as text.
                        let Mode::Call { raw, .. } = std::mem::replace(&mut self.mode, Mode::Text) else { unreachable!() };
                        out.text.push_str(&raw);
                        self.at_start = false;
                        Some(false)
                    }
                }
            }
        }
    }

    fn object_char(&mut self, obj: &mut CallObj, c: char, out: &mut Parsed) -> ObjOutcome {
        let state = std::mem::replace(&mut obj.state, Obj::KeyOrEnd);
        obj.state = match state {
            Obj::KeyOrEnd => match c {
                '"' => Obj::Key { buf: String::new(), escaped: false },
                '}' => return ObjOutcome::Closed,
                c if c.is_whitespace() || c == ',' => Obj::KeyOrEnd,
                _ => return self.not_a_call(obj),
            },
            Obj::Key { mut buf, escaped } => {
                if escaped {
                    buf.push(c);
                    Obj::Key { buf, escaped: false }
                } else if c == '\\' {
                    Obj::Key { buf, escaped: true }
                } else if c == '"' {
                    obj.keys_seen += 1;
                    let known = buf == NAME_KEY || ARGUMENT_KEYS.contains(&buf.as_str()) || OTHER_CALL_KEYS.contains(&buf.as_str());
                    if !known && obj.index.is_none() {
                        return self.not_a_call(obj);
                    }
                    Obj::Colon { key: buf }
                } else {
                    buf.push(c);
                    Obj::Key { buf, escaped: false }
                }
            }
            Obj::Colon { key } => match c {
                ':' => Obj::ValueStart { key },
                c if c.is_whitespace() => Obj::Colon { key },
                _ => return self.not_a_call(obj),
            },
            Obj::ValueStart { key } if c.is_whitespace() => Obj::ValueStart { key },
            Obj::ValueStart { key } => {
                let mut scan = ValueScan::default();
                scan.feed(c);
                let mut buf = String::new();
                if ARGUMENT_KEYS.contains(&key.as_str()) {
                    if c == '"' {
                        obj.string_arguments = true;
                        buf.push(c);
                    } else {
                        self.argument_text(obj, &c.to_string(), out);
                    }
                } else {
                    buf.push(c);
                }
                Obj::Value { key, scan, buf }
            }
            Obj::Value { key, mut scan, mut buf } => {
                let step = scan.feed(c);
                let is_args = ARGUMENT_KEYS.contains(&key.as_str());
                if !matches!(step, Step::Ended) {
                    if is_args && !obj.string_arguments {
                        self.argument_text(obj, &c.to_string(), out);
                    } else {
                        buf.push(c);
                    }
                }
                match step {
                    Step::Part => Obj::Value { key, scan, buf },
                    Step::Last | Step::Ended => {
                        self.value_done(obj, &key, &buf, out);
                        if matches!(step, Step::Ended) {
                            // The delimiter belongs to the object.
                            obj.state = Obj::CommaOrEnd;
                            return self.object_char(obj, c, out);
                        }
                        Obj::CommaOrEnd
                    }
                }
            }
            Obj::CommaOrEnd => match c {
                ',' => Obj::KeyOrEnd,
                '}' => return ObjOutcome::Closed,
                _ => Obj::CommaOrEnd,
            },
        };
        ObjOutcome::Continue
    }

    fn not_a_call(&mut self, obj: &CallObj) -> ObjOutcome {
        if obj.index.is_some() {
            // Already reported as a call: keep reading it, ignoring what does not fit.
            return ObjOutcome::Continue;
        }
        ObjOutcome::NotACall
    }

    fn value_done(&mut self, obj: &mut CallObj, key: &str, raw: &str, out: &mut Parsed) {
        if key == NAME_KEY && obj.index.is_none() {
            let Ok(name) = serde_json::from_str::<String>(raw) else { return };
            let index = self.calls.len();
            let id = new_call_id();
            self.calls.push(ToolCall { id: id.clone(), name: name.clone(), arguments: String::new() });
            obj.index = Some(index);
            out.deltas.push(ToolDelta::Start { index, id, name });
            let early = std::mem::take(&mut obj.early_arguments);
            if !early.is_empty() {
                self.argument_text(obj, &early, out);
            }
        } else if ARGUMENT_KEYS.contains(&key) && obj.string_arguments {
            let decoded = serde_json::from_str::<String>(raw).unwrap_or_default();
            self.argument_text(obj, &decoded, out);
        }
    }

    fn argument_text(&mut self, obj: &mut CallObj, text: &str, out: &mut Parsed) {
        match obj.index {
            None => obj.early_arguments.push_str(text),
            Some(index) => {
                self.calls[index].arguments.push_str(text);
                match out.deltas.last_mut() {
                    Some(ToolDelta::Arguments { index: i, fragment }) if *i == index => fragment.push_str(text),
                    _ => out.deltas.push(ToolDelta::Arguments { index, fragment: text.to_string() }),
                }
            }
        }
    }

    /// A call object ended (closed, or cut short): a call without arguments gets `{}`.
    fn finish_object(&mut self, obj: CallObj, out: &mut Parsed) {
        let Some(index) = obj.index else { return };
        if self.calls[index].arguments.is_empty() && !obj.string_arguments {
            let mut obj = obj;
            self.argument_text(&mut obj, "{}", out);
        }
    }
}

enum ObjOutcome {
    Continue,
    Closed,
    NotACall,
}

/// Rebuilds calls from deltas (what a streaming client does; tests check the engine's events
/// with it).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Assembler {
    pub calls: Vec<ToolCall>,
}

impl Assembler {
    pub fn apply(&mut self, delta: &ToolDelta) {
        match delta {
            ToolDelta::Start { index, id, name } => {
                if *index == self.calls.len() {
                    self.calls.push(ToolCall { id: id.clone(), name: name.clone(), arguments: String::new() });
                }
            }
            ToolDelta::Arguments { index, fragment } => {
                if let Some(call) = self.calls.get_mut(*index) {
                    call.arguments.push_str(fragment);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parses `text` whole and in every split into pieces of `step` chars; returns the text
    /// and the calls (ids blanked), asserting that the streamed deltas assemble to the calls.
    fn parse(format: ToolFormat, text: &str, step: usize) -> (String, Vec<(String, String)>) {
        let mut p = JsonCallParser::new(format);
        let mut out = String::new();
        let mut asm = Assembler::default();
        let chars: Vec<char> = text.chars().collect();
        for piece in chars.chunks(step) {
            let parsed = p.push(&piece.iter().collect::<String>());
            out.push_str(&parsed.text);
            parsed.deltas.iter().for_each(|d| asm.apply(d));
        }
        let tail = p.finish();
        out.push_str(&tail.text);
        tail.deltas.iter().for_each(|d| asm.apply(d));
        assert_eq!(asm.calls, p.calls(), "streamed deltas assemble to the calls");
        (out, p.calls().iter().map(|c| (c.name.clone(), c.arguments.clone())).collect())
    }

    fn all_splits(format: ToolFormat, text: &str) -> (String, Vec<(String, String)>) {
        let whole = parse(format, text, usize::MAX);
        for step in 1..8 {
            assert_eq!(parse(format, text, step), whole, "split into {step}-char pieces");
        }
        whole
    }

    fn call(name: &str, args: &str) -> (String, String) {
        (name.to_string(), args.to_string())
    }

    #[test]
    fn hermes_text_and_parallel_calls() {
        let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": [1, 2]}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"CET \\\"x\\\" }\"}}\n</tool_call>";
        let (out, calls) = all_splits(ToolFormat::Hermes, text);
        assert_eq!(out, "Let me check.\n");
        assert_eq!(
            calls,
            vec![call("get_weather", r#"{"city": "Paris", "days": [1, 2]}"#), call("get_time", r#"{"tz": "CET \"x\" }"}"#)]
        );
        let mut p = JsonCallParser::new(ToolFormat::Hermes);
        p.push(&text[..text.find("}}").unwrap() + 1]);
        assert_eq!(p.completed_calls(), 0);
        p.push("}");
        assert_eq!(p.completed_calls(), 1);
    }

    #[test]
    fn hermes_arguments_before_name_and_as_string() {
        let (out, calls) = all_splits(ToolFormat::Hermes, "<tool_call>{\"arguments\": {\"a\": 1}, \"name\": \"f\"}</tool_call>");
        assert_eq!((out.as_str(), calls), ("", vec![call("f", r#"{"a": 1}"#)]));
        let (_, calls) = all_splits(ToolFormat::Hermes, r#"<tool_call>{"name": "f", "arguments": "{\"a\": 1}"}</tool_call>"#);
        assert_eq!(calls, vec![call("f", r#"{"a": 1}"#)]);
        let (_, calls) = all_splits(ToolFormat::Hermes, r#"<tool_call>{"name": "f"}</tool_call>"#);
        assert_eq!(calls, vec![call("f", "{}")]);
    }

    #[test]
    fn text_that_only_looks_like_a_marker_is_text() {
        let (out, calls) = all_splits(ToolFormat::Hermes, "a < b and <tool and <tool_ca");
        assert_eq!((out.as_str(), calls.len()), ("a < b and <tool and <tool_ca", 0));
        // A region whose JSON is not a call is given back.
        let (out, calls) = all_splits(ToolFormat::Hermes, "x <tool_call>{\"city\": 1}</tool_call> y");
        assert_eq!((out.as_str(), calls.len()), ("x <tool_call>{\"city\": 1}</tool_call> y", 0));
    }

    #[test]
    fn cut_short_call_keeps_its_partial_arguments() {
        let (out, calls) = all_splits(ToolFormat::Hermes, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"q\": \"abc");
        assert_eq!((out.as_str(), calls), ("", vec![call("f", "{\"q\": \"abc")]));
        let (out, calls) = all_splits(ToolFormat::Hermes, "hi <tool_call>\n{\"na");
        assert_eq!((out.as_str(), calls.len()), ("hi <tool_call>\n{\"na", 0));
    }

    #[test]
    fn llama_json_and_python_tag() {
        let (out, calls) = all_splits(ToolFormat::Llama3Json, "  {\"name\": \"f\", \"parameters\": {\"x\": 2}}; {\"name\": \"g\", \"parameters\": {}}");
        assert_eq!((out.as_str(), calls), ("", vec![call("f", r#"{"x": 2}"#), call("g", "{}")]));
        let (out, calls) = all_splits(ToolFormat::Llama3Json, "Sure. <|python_tag|>{\"name\": \"f\", \"parameters\": {\"x\": 2}}");
        assert_eq!((out.as_str(), calls), ("Sure. ", vec![call("f", r#"{"x": 2}"#)]));
        // JSON that is not a call, and JSON later in the reply, stay text.
        let (out, calls) = all_splits(ToolFormat::Llama3Json, "{\"answer\": 42}");
        assert_eq!((out.as_str(), calls.len()), ("{\"answer\": 42}", 0));
        let (out, calls) = all_splits(ToolFormat::Llama3Json, "Here: {\"name\": \"f\"}");
        assert_eq!((out.as_str(), calls.len()), ("Here: {\"name\": \"f\"}", 0));
    }

    #[test]
    fn mistral_call_array() {
        let text = "[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {\"x\": [1, {\"y\": \"]\"}]}}, {\"name\": \"g\", \"arguments\": {\"n\": -1.5e3}}]";
        let (out, calls) = all_splits(ToolFormat::Mistral, text);
        assert_eq!((out.as_str(), calls), ("", vec![call("f", r#"{"x": [1, {"y": "]"}]}"#), call("g", r#"{"n": -1.5e3}"#)]));
        let (out, calls) = all_splits(ToolFormat::Mistral, "ok [TOOL_CALLS][{\"name\": \"f\", \"arguments\": {}}] done");
        assert_eq!((out.as_str(), calls), ("ok done", vec![call("f", "{}")]));
        // Text after a call is kept, whitespace that only separates calls is not.
        let (out, _) = all_splits(ToolFormat::Hermes, "<tool_call>{\"name\": \"f\"}</tool_call>\n\nDone.\n");
        assert_eq!(out, "\n\nDone.\n");
    }

    #[test]
    fn an_opening_in_the_prompt_starts_the_call() {
        let mut p = JsonCallParser::with_opening(ToolFormat::Hermes, "<tool_call>\n{\"name\": \"f\", \"arguments\": ");
        let first = p.push("{\"a\"");
        assert!(matches!(&first.deltas[0], ToolDelta::Start { index: 0, name, .. } if name == "f"), "{first:?}");
        assert_eq!(first.deltas[1], ToolDelta::Arguments { index: 0, fragment: "{\"a\"".into() });
        p.push(": 1}}\n</tool_call> ok");
        assert_eq!(p.finish().text, "");
        assert_eq!(p.calls()[0].arguments, "{\"a\": 1}");
        let mut p = JsonCallParser::with_opening(ToolFormat::Hermes, "<tool_call>\n{\"name\": \"");
        assert_eq!(p.push("g\", \"arguments\": {}}</tool_call>").deltas.len(), 2);
        assert_eq!(p.calls()[0].name, "g");
    }
}
