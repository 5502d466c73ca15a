//! Chat templates rendered the way Hugging Face transformers renders them (`apply_chat_template`):
//! Jinja with `trim_blocks` and `lstrip_blocks`, loop controls, Python string methods, a
//! `tojson` that prints what Python's `json.dumps` prints, `raise_exception` and `strftime_now`,
//! and the variables `messages`, `add_generation_prompt`, `bos_token`, `eos_token`, `tools`
//! (none unless given) and `documents` (none). Messages carry assistant `tool_calls` and the
//! `tool_call_id` / `name` of tool results the way transformers' callers pass them.

use std::fmt::Write as _;

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Environment, ErrorKind, Value};
use serde::{Deserialize, Serialize};

use crate::{Error, Result};

const TEMPLATE_NAME: &str = "chat_template";

/// One turn of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    #[serde(default)]
    pub content: String,
    /// The calls an assistant turn made.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// The call a `tool` turn answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// The function a `tool` turn comes from (some templates print it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// An assistant turn's reasoning (templates that keep or drop reasoning history read it as
    /// `reasoning_content`, Gemma 4's also as `reasoning`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
            name: None,
            reasoning_content: None,
        }
    }

    /// The message as templates see it: tool calls in OpenAI's shape (`{"id", "type":
    /// "function", "function": {"name", "arguments"}}`) with the arguments as a JSON object
    /// when they parse (what transformers' templates expect), else as the string.
    fn template_value(&self) -> serde_json::Value {
        use serde_json::{json, Map, Value};
        let mut m = Map::new();
        // transformers names reasoning `thinking` too (gpt-oss reads that), ahead of the rest.
        if let Some(reasoning) = &self.reasoning_content {
            m.insert("thinking".into(), Value::from(reasoning.as_str()));
        }
        m.insert("role".into(), Value::from(self.role.as_str()));
        m.insert("content".into(), Value::from(self.content.as_str()));
        if !self.tool_calls.is_empty() {
            let calls = self.tool_calls.iter().map(|c| {
                let arguments = serde_json::from_str::<Value>(&c.arguments).unwrap_or_else(|_| Value::from(c.arguments.as_str()));
                json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": arguments}})
            });
            m.insert("tool_calls".into(), Value::Array(calls.collect()));
        }
        if let Some(id) = &self.tool_call_id {
            m.insert("tool_call_id".into(), Value::from(id.as_str()));
        }
        if let Some(name) = &self.name {
            m.insert("name".into(), Value::from(name.as_str()));
        }
        if let Some(reasoning) = &self.reasoning_content {
            m.insert("reasoning_content".into(), Value::from(reasoning.as_str()));
        }
        Value::Object(m)
    }
}

/// A call the model made. `arguments` is JSON text, as OpenAI sends it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

/// A compiled chat template plus the special-token strings it may reference.
#[derive(Clone)]
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source", &self.source)
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish()
    }
}

impl ChatTemplate {
    /// Compiles `source`; syntax errors are reported here rather than at the first render.
    pub fn new(source: &str, bos_token: Option<String>, eos_token: Option<String>) -> Result<Self> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", raise_exception);
        env.add_test("iterable", is_iterable);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned(TEMPLATE_NAME, namespace_list_updates(&without_generation_tags(source)))
            .map_err(|e| Error::Tokenizer(format!("invalid chat template: {e}")))?;
        Ok(Self { env, source: source.to_string(), bos_token, eos_token })
    }

    /// The template text as given to [`ChatTemplate::new`].
    pub fn source(&self) -> &str {
        &self.source
    }

    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        self.render_with_tools(messages, None, add_generation_prompt)
    }

    /// [`ChatTemplate::render`] with `tools` (JSON values as transformers' callers pass them:
    /// `{"type": "function", "function": {...}}`); `None` leaves the variable none.
    pub fn render_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: Option<&[serde_json::Value]>,
        add_generation_prompt: bool,
    ) -> Result<String> {
        self.render_with_kwargs(messages, tools, add_generation_prompt, &serde_json::Map::new())
    }

    /// [`ChatTemplate::render_with_tools`] with extra template variables, as transformers'
    /// `apply_chat_template(**kwargs)` and the servers' `chat_template_kwargs` pass them
    /// (`enable_thinking` foremost). They cannot replace the variables named above.
    pub fn render_with_kwargs(
        &self,
        messages: &[ChatMessage],
        tools: Option<&[serde_json::Value]>,
        add_generation_prompt: bool,
        kwargs: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String> {
        let messages: Vec<serde_json::Value> = messages.iter().map(ChatMessage::template_value).collect();
        let mut context: Vec<(&str, Value)> = vec![
            ("messages", Value::from_serialize(&messages)),
            ("add_generation_prompt", Value::from(add_generation_prompt)),
            ("tools", tools.map_or(Value::from(()), Value::from_serialize)),
            ("documents", Value::from(())),
        ];
        // transformers passes only the special tokens the tokenizer has, so a missing one stays
        // undefined rather than none.
        if let Some(bos) = &self.bos_token {
            context.push(("bos_token", Value::from(bos.as_str())));
        }
        if let Some(eos) = &self.eos_token {
            context.push(("eos_token", Value::from(eos.as_str())));
        }
        for (key, value) in kwargs {
            if !context.iter().any(|(k, _)| *k == key.as_str()) {
                context.push((key.as_str(), Value::from_serialize(value)));
            }
        }
        let template = self.env.get_template(TEMPLATE_NAME).map_err(|e| Error::Tokenizer(e.to_string()))?;
        template.render(Value::from_iter(context)).map_err(|e| match raised_message(&e) {
            // The template author's own words (e.g. "Conversation roles must alternate"), as is.
            Some(message) => Error::Tokenizer(message.to_string()),
            // minijinja's message names the template line: "... (in chat_template:3)".
            None => Error::Tokenizer(format!("chat template failed: {e}")),
        })
    }
}

/// Jinja2's `iterable` test: strings, sequences and mappings; not none or undefined
/// (minijinja's own counts none, which Qwen3-Coder's `tools is iterable and tools | length`
/// then fails on).
fn is_iterable(value: Value) -> bool {
    matches!(value.kind(), ValueKind::String | ValueKind::Seq | ValueKind::Map | ValueKind::Iterable)
}

fn raised_message(error: &minijinja::Error) -> Option<&str> {
    if error.kind() != ErrorKind::InvalidOperation {
        return None;
    }
    error.detail()?.strip_prefix(RAISED_PREFIX)
}

const RAISED_PREFIX: &str = "raise_exception: ";

fn raise_exception(message: String) -> std::result::Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, format!("{RAISED_PREFIX}{message}")))
}

/// The local time formatted with a C `strftime` format, as Python's `datetime.now().strftime`.
fn strftime_now(format: String) -> std::result::Result<String, minijinja::Error> {
    use chrono::format::{Item, StrftimeItems};
    let items: Vec<Item> = StrftimeItems::new(&format).collect();
    if items.iter().any(|item| matches!(item, Item::Error)) {
        return Err(minijinja::Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: invalid format string {format:?}"),
        ));
    }
    Ok(chrono::Local::now().format_with_items(items.into_iter()).to_string())
}

/// transformers' `{% generation %}` blocks only mark assistant text for training masks; they
/// render their body unchanged, which `{% if true %}` does too (keeping any `-` whitespace
/// control on the tags).
fn without_generation_tags(source: &str) -> String {
    static OPEN: once_cell::sync::Lazy<regex::Regex> =
        once_cell::sync::Lazy::new(|| regex::Regex::new(r"\{%([-+]?)\s*generation\s*([-+]?)%\}").expect("valid regex"));
    static CLOSE: once_cell::sync::Lazy<regex::Regex> = once_cell::sync::Lazy::new(|| {
        regex::Regex::new(r"\{%([-+]?)\s*endgeneration\s*([-+]?)%\}").expect("valid regex")
    });
    let opened = OPEN.replace_all(source, "{%${1} if true ${2}%}");
    CLOSE.replace_all(&opened, "{%${1} endif ${2}%}").into_owned()
}

/// Python's in-place list updates on a namespace attribute, which Kimi K2's templates use for
/// tool history (`{%- set _ = ns.ids.append(x) -%}`, `{%- set id = ns.ids.pop(0) -%}`), as
/// assignments minijinja evaluates (its values are immutable): `set ns.ids = ns.ids + [x]`, and
/// `set id = ns.ids[0]` then `set ns.ids = ns.ids[1:]`.
fn namespace_list_updates(source: &str) -> String {
    static APPEND: once_cell::sync::Lazy<regex::Regex> = once_cell::sync::Lazy::new(|| {
        regex::Regex::new(r"\{%([-+]?)\s*set\s+\w+\s*=\s*(\w+\.\w+)\.append\((.+?)\)\s*([-+]?)%\}").expect("valid regex")
    });
    static POP_FIRST: once_cell::sync::Lazy<regex::Regex> = once_cell::sync::Lazy::new(|| {
        regex::Regex::new(r"\{%([-+]?)\s*set\s+(\w+)\s*=\s*(\w+\.\w+)\.pop\(0\)\s*([-+]?)%\}").expect("valid regex")
    });
    let appended = APPEND.replace_all(source, "{%${1} set ${2} = ${2} + [${3}] ${4}%}");
    POP_FIRST.replace_all(&appended, "{%${1} set ${2} = ${3}[0] %}{% set ${3} = ${3}[1:] ${4}%}").into_owned()
}

/// `tojson` as transformers defines it: Python's `json.dumps(x, ensure_ascii=False, indent=None,
/// separators=None, sort_keys=False)`. Unlike minijinja's built-in it does not HTML-escape, and it
/// spaces separators the Python way (`{"a": 1, "b": 2}`).
fn tojson(value: Value, kwargs: Kwargs) -> std::result::Result<String, minijinja::Error> {
    let indent = match kwargs.get::<Option<Value>>("indent")? {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match v.as_i64() {
            Some(n) => Some(" ".repeat(usize::try_from(n).unwrap_or(0))),
            None => {
                Some(v.as_str().map(str::to_string).ok_or_else(|| bad_argument("indent must be an int or a string"))?)
            }
        },
    };
    let (item_separator, key_separator) = match kwargs.get::<Option<Vec<String>>>("separators")? {
        Some(pair) => match <[String; 2]>::try_from(pair) {
            Ok([item, key]) => (item, key),
            Err(_) => return Err(bad_argument("separators must be a pair of strings")),
        },
        None if indent.is_some() => (",".to_string(), ": ".to_string()),
        None => (", ".to_string(), ": ".to_string()),
    };
    let writer = PythonJson {
        indent,
        item_separator,
        key_separator,
        sort_keys: kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false),
        ensure_ascii: kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false),
    };
    kwargs.assert_all_used()?;
    let mut out = String::new();
    writer.write(&mut out, &value, 0)?;
    Ok(out)
}

fn bad_argument(message: &str) -> minijinja::Error {
    minijinja::Error::new(ErrorKind::InvalidOperation, format!("tojson: {message}"))
}

struct PythonJson {
    indent: Option<String>,
    item_separator: String,
    key_separator: String,
    sort_keys: bool,
    ensure_ascii: bool,
}

impl PythonJson {
    fn write(&self, out: &mut String, value: &Value, depth: usize) -> std::result::Result<(), minijinja::Error> {
        match value.kind() {
            ValueKind::Undefined | ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
            ValueKind::Number => out.push_str(&python_number(value)),
            ValueKind::String => self.write_string(out, value.as_str().unwrap_or_default()),
            ValueKind::Map => {
                let mut entries = Vec::new();
                for key in value.try_iter()? {
                    let item = value.get_item(&key)?;
                    entries.push((self.key_string(&key)?, item));
                }
                if self.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(&b.0));
                }
                self.write_container(out, ('{', '}'), entries.len(), depth, |out, i| {
                    let (key, item) = &entries[i];
                    self.write_string(out, key);
                    out.push_str(&self.key_separator);
                    self.write(out, item, depth + 1)
                })?;
            }
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = value.try_iter()?.collect();
                self.write_container(out, ('[', ']'), items.len(), depth, |out, i| {
                    self.write(out, &items[i], depth + 1)
                })?;
            }
            _ => {
                return Err(minijinja::Error::new(
                    ErrorKind::InvalidOperation,
                    format!("tojson: cannot serialize a value of kind {}", value.kind()),
                ))
            }
        }
        Ok(())
    }

    fn write_container(
        &self,
        out: &mut String,
        (open, close): (char, char),
        len: usize,
        depth: usize,
        mut write_item: impl FnMut(&mut String, usize) -> std::result::Result<(), minijinja::Error>,
    ) -> std::result::Result<(), minijinja::Error> {
        out.push(open);
        if len == 0 {
            out.push(close);
            return Ok(());
        }
        for i in 0..len {
            if i > 0 {
                out.push_str(&self.item_separator);
            }
            if let Some(indent) = &self.indent {
                out.push('\n');
                out.push_str(&indent.repeat(depth + 1));
            }
            write_item(out, i)?;
        }
        if let Some(indent) = &self.indent {
            out.push('\n');
            out.push_str(&indent.repeat(depth));
        }
        out.push(close);
        Ok(())
    }

    /// Python converts non-string keys to strings: `1` → `"1"`, `True` → `"true"`.
    fn key_string(&self, key: &Value) -> std::result::Result<String, minijinja::Error> {
        match key.kind() {
            ValueKind::String => Ok(key.as_str().unwrap_or_default().to_string()),
            ValueKind::Number => Ok(python_number(key)),
            ValueKind::Bool => Ok(if key.is_true() { "true" } else { "false" }.to_string()),
            ValueKind::None => Ok("null".to_string()),
            kind => Err(minijinja::Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: keys must be strings, not {kind}"),
            )),
        }
    }

    fn write_string(&self, out: &mut String, s: &str) {
        // serde_json escapes exactly what Python does with ensure_ascii=False.
        let quoted = serde_json::to_string(s).unwrap_or_default();
        if !self.ensure_ascii {
            out.push_str(&quoted);
            return;
        }
        for c in quoted.chars() {
            if c.is_ascii() {
                out.push(c);
            } else {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
        }
    }
}

/// A number the way Python's `json.dumps` prints it: integers as they are, floats as `repr` does
/// (`1.0`, `1e-05`, `1e+20`, `NaN`, `Infinity`).
fn python_number(value: &Value) -> String {
    if value.is_integer() {
        return value.to_string();
    }
    let float = f64::try_from(value.clone()).unwrap_or(f64::NAN);
    if float.is_nan() {
        return "NaN".to_string();
    }
    if float.is_infinite() {
        return if float > 0.0 { "Infinity" } else { "-Infinity" }.to_string();
    }
    // Rust's `{:?}` picks the same shortest digits and the same switch to exponent notation as
    // Python's repr; only the exponent is spelled differently (`1e-5` vs `1e-05`).
    let debug = format!("{float:?}");
    match debug.split_once('e') {
        None => debug,
        Some((mantissa, exponent)) => {
            let (sign, digits) = match exponent.strip_prefix('-') {
                Some(digits) => ('-', digits),
                None => ('+', exponent),
            };
            format!("{mantissa}e{sign}{digits:0>2}")
        }
    }
}
