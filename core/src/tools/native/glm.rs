//! GLM 4.5 – 4.7: `<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>…</tool_call>`
//! (GLM 4.5 / 4.6 put a newline after the name and after each tag pair; 4.7 writes none).
//! Consecutive calls for parallel calls. A value is raw text for a string parameter, else JSON
//! or a Python literal when it reads as one (as the template renders non-strings: JSON).

use serde_json::{Map, Value};

use super::{pythonic, retyped, Layout, Properties};

pub(super) const LAYOUT: Layout = Layout { starts: &["<tool_call>"], end: "</tool_call>", wrappers: &[], ends_at_eos: false };

const KEY: &str = "<arg_key>";
const END_KEY: &str = "</arg_key>";
const VALUE: &str = "<arg_value>";
const END_VALUE: &str = "</arg_value>";

pub(super) fn parse(body: &str, properties: &Properties) -> Option<(String, Value)> {
    let name_end = body.find(KEY).unwrap_or(body.len());
    let name = body[..name_end].trim().to_string();
    if name.is_empty() || name.contains(char::is_whitespace) || name.contains('<') {
        return None;
    }
    let props = properties.get(&name);
    let mut args = Map::new();
    let mut rest = &body[name_end..];
    loop {
        rest = rest.trim_start();
        if rest.is_empty() {
            break;
        }
        let after_key = rest.strip_prefix(KEY)?;
        let key_end = after_key.find(END_KEY)?;
        let key = after_key[..key_end].trim().to_string();
        let after_value = after_key[key_end + END_KEY.len()..].trim_start().strip_prefix(VALUE)?;
        let value_end = after_value.find(END_VALUE)?;
        let raw = after_value[..value_end].trim();
        let is_string = props.and_then(|p| p.get(&key)).is_some_and(|s| s["type"] == "string");
        let value = if is_string {
            Value::from(raw)
        } else {
            serde_json::from_str(raw).ok().or_else(|| pythonic::literal(raw)).unwrap_or_else(|| Value::from(raw))
        };
        args.insert(key, value);
        rest = &after_value[value_end + END_VALUE.len()..];
    }
    Some((name.clone(), retyped(&name, Value::Object(args), properties)))
}
