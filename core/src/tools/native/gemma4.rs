//! Gemma 4: `<|tool_call>call:NAME{key:VALUE,...}<tool_call|>`, strings quoted as
//! `<|"|>text<|"|>`, bare keys, nested `{}` / `[]`, numbers and `true` / `false` / `null`.

use serde_json::{Map, Value};

use super::{retyped, Layout, Properties};

pub(super) const LAYOUT: Layout = Layout { starts: &["<|tool_call>"], end: "<tool_call|>", wrappers: &[], ends_at_eos: false };

pub(super) const GEMMA_QUOTE: &str = "<|\"|>";

/// A whole call body (`call:NAME{...}`) as its name and arguments.
pub(super) fn parse(body: &str, properties: &Properties) -> Option<(String, Value)> {
    let body = body.trim().strip_prefix("call:")?;
    let brace = body.find('{')?;
    let name = body[..brace].trim().to_string();
    let mut reader = GemmaReader { text: &body[brace..], pos: 0 };
    let args = reader.value()?;
    if !reader.text[reader.pos..].trim().is_empty() || !args.is_object() {
        return None;
    }
    Some((name.clone(), retyped(&name, args, properties)))
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

