//! Gemma 4: `<|tool_call>call:NAME{key:VALUE,...}<tool_call|>`, strings quoted as
//! `<|"|>text<|"|>`, bare keys, nested `{}` / `[]`, numbers and `true` / `false` / `null`.

use serde_json::{Map, Value};

use super::{retyped, Cursor, Layout, Properties};

pub(super) const LAYOUT: Layout = Layout { starts: &["<|tool_call>"], end: "<tool_call|>", wrappers: &[], ends_at_eos: false };

pub(super) const GEMMA_QUOTE: &str = "<|\"|>";

/// A whole call body (`call:NAME{...}`) as its name and arguments.
pub(super) fn parse(body: &str, properties: &Properties) -> Option<(String, Value)> {
    let body = body.trim().strip_prefix("call:")?;
    let brace = body.find('{')?;
    let name = body[..brace].trim().to_string();
    let mut reader = GemmaReader { c: Cursor::new(&body[brace..]) };
    let args = reader.value()?;
    if !reader.c.rest().trim().is_empty() || !args.is_object() {
        return None;
    }
    Some((name.clone(), retyped(&name, args, properties)))
}

/// Reads Gemma 4's argument notation.
struct GemmaReader<'a> {
    c: Cursor<'a>,
}

impl GemmaReader<'_> {
    fn value(&mut self) -> Option<Value> {
        self.c.skip_ws();
        if self.c.eat("{") {
            let mut m = Map::new();
            if self.c.eat("}") {
                return Some(Value::Object(m));
            }
            loop {
                let key = if self.c.rest().starts_with(GEMMA_QUOTE) { self.quoted()? } else { self.bare_key()? };
                if !self.c.eat(":") {
                    return None;
                }
                let v = self.value()?;
                m.insert(key, v);
                if self.c.eat("}") {
                    return Some(Value::Object(m));
                }
                if !self.c.eat(",") {
                    return None;
                }
            }
        }
        if self.c.eat("[") {
            let mut a = Vec::new();
            if self.c.eat("]") {
                return Some(Value::Array(a));
            }
            loop {
                a.push(self.value()?);
                if self.c.eat("]") {
                    return Some(Value::Array(a));
                }
                if !self.c.eat(",") {
                    return None;
                }
            }
        }
        if self.c.rest().starts_with(GEMMA_QUOTE) {
            return self.quoted().map(Value::String);
        }
        // A number or literal: up to the next delimiter.
        let rest = self.c.rest();
        let len = rest.find([',', '}', ']']).unwrap_or(rest.len());
        let token = rest[..len].trim().to_string();
        self.c.pos += len;
        match token.as_str() {
            "true" => Some(Value::Bool(true)),
            "false" => Some(Value::Bool(false)),
            "null" => Some(Value::Null),
            _ => serde_json::from_str::<serde_json::Number>(&token).ok().map(Value::Number),
        }
    }

    fn quoted(&mut self) -> Option<String> {
        self.c.pos += GEMMA_QUOTE.len();
        let len = self.c.rest().find(GEMMA_QUOTE)?;
        let s = self.c.rest()[..len].to_string();
        self.c.pos += len + GEMMA_QUOTE.len();
        Some(s)
    }

    fn bare_key(&mut self) -> Option<String> {
        self.c.skip_ws();
        let rest = self.c.rest();
        let len = rest.find(':')?;
        let key = rest[..len].trim().trim_matches('"').to_string();
        self.c.pos += len;
        (!key.is_empty()).then_some(key)
    }
}

