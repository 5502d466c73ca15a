//! MiniCPM5: `<function name="NAME"><param name="P">VALUE</param>…</function>`, no outer
//! wrapper, consecutive blocks (a newline between) for parallel calls. A value holding `<`,
//! `&` or a newline is wrapped as `<![CDATA[…]]>` (which may then hold `</param>` or
//! `</function>`). Values are typed by the tool's schema; `null` is null.

use serde_json::{Map, Value};

use super::{typed_value, Layout, Properties};

pub(super) const LAYOUT: Layout = Layout { starts: &["<function name="], end: "</function>", wrappers: &[], ends_at_eos: false };

const PARAM: &str = "<param name=";
const END_PARAM: &str = "</param>";
const CDATA: &str = "<![CDATA[";
const END_CDATA: &str = "]]>";

/// The first `marker` in `text` outside CDATA sections.
fn find_outside_cdata(text: &str, marker: &str) -> Option<usize> {
    let mut from = 0;
    loop {
        let rest = &text[from..];
        let m = rest.find(marker);
        match rest.find(CDATA) {
            Some(c) if m.is_none_or(|m| c < m) => {
                let inner = from + c + CDATA.len();
                from = inner + text[inner..].find(END_CDATA)? + END_CDATA.len();
            }
            _ => return m.map(|m| from + m),
        }
    }
}

pub(super) fn region_end(body: &str) -> Option<usize> {
    find_outside_cdata(body, LAYOUT.end)
}

/// A quoted or bare name and what follows its closing `>`.
fn name_and_rest(text: &str) -> Option<(&str, &str)> {
    let text = text.trim_start();
    let (name, rest) = match text.chars().next()? {
        q @ ('"' | '\'') => {
            let end = text[1..].find(q)? + 1;
            (&text[1..end], &text[end + 1..])
        }
        _ => {
            let end = text.find(|c: char| c.is_whitespace() || c == '>')?;
            (&text[..end], &text[end..])
        }
    };
    Some((name, rest.trim_start().strip_prefix('>')?))
}

pub(super) fn parse(body: &str, properties: &Properties) -> Option<(String, Value)> {
    let (name, mut rest) = name_and_rest(body)?;
    if name.is_empty() {
        return None;
    }
    let props = properties.get(name);
    let mut args = Map::new();
    loop {
        rest = rest.trim_start();
        if rest.is_empty() {
            break;
        }
        let (key, after) = name_and_rest(rest.strip_prefix(PARAM)?)?;
        let end = find_outside_cdata(after, END_PARAM)?;
        let raw = &after[..end];
        let value = match raw.trim().strip_prefix(CDATA).and_then(|v| v.strip_suffix(END_CDATA)) {
            Some(inner) => Value::from(inner),
            None if raw.trim().eq_ignore_ascii_case("null") => Value::Null,
            None => typed_value(raw.trim(), props.and_then(|p| p.get(key))),
        };
        // A CDATA value of a typed parameter is typed too.
        let value = match (&value, props.and_then(|p| p.get(key))) {
            (Value::String(s), Some(schema)) if schema["type"] != "string" => typed_value(s, Some(schema)),
            _ => value,
        };
        args.insert(key.to_string(), value);
        rest = &after[end + END_PARAM.len()..];
    }
    Some((name.to_string(), Value::Object(args)))
}
