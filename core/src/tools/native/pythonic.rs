//! Pythonic calls (LFM2 / LFM2.5, and the list form Llama 3.2 / 4 are prompted for):
//! `<|tool_call_start|>[get_time(city="Paris"), f(a=1, b=[1, 2], c=True)]<|tool_call_end|>`.
//! A list of calls with keyword arguments, values Python literals (strings in either quote,
//! numbers, `True` / `False` / `None`, lists, tuples, dicts); the JSON spellings `true`,
//! `false` and `null` are read too (templates render nested values as JSON). Function names
//! may be dotted (`Calendar.create_event`).

use serde_json::{Map, Number, Value};

use super::{retyped, Cursor, Layout, Properties};

pub(super) const LAYOUT: Layout =
    Layout { starts: &["<|tool_call_start|>"], end: "<|tool_call_end|>", wrappers: &[], ends_at_eos: false };

/// A region's list of calls.
pub(super) fn parse(body: &str, properties: &Properties) -> Option<Vec<(String, Value)>> {
    let mut r = Reader { c: Cursor::new(body) };
    if !r.c.eat("[") {
        return None;
    }
    let mut calls = Vec::new();
    loop {
        let (name, args) = r.call()?;
        calls.push((name.clone(), retyped(&name, Value::Object(args), properties)));
        if r.c.eat("]") {
            break;
        }
        if !r.c.eat(",") {
            return None;
        }
    }
    r.c.skip_ws();
    r.c.rest().is_empty().then_some(calls)
}

/// One Python literal as JSON (the whole text).
pub(super) fn literal(text: &str) -> Option<Value> {
    let mut r = Reader { c: Cursor::new(text) };
    let v = r.value()?;
    r.c.skip_ws();
    r.c.rest().is_empty().then_some(v)
}

struct Reader<'a> {
    c: Cursor<'a>,
}

impl<'a> Reader<'a> {
    fn word(&mut self, dotted: bool) -> Option<String> {
        self.c.skip_ws();
        let len = self.c.rest().find(|c: char| !(c.is_alphanumeric() || c == '_' || (dotted && c == '.'))).unwrap_or(self.c.rest().len());
        let w = self.c.rest()[..len].to_string();
        self.c.pos += len;
        (!w.is_empty()).then_some(w)
    }

    /// `name(key=value, ...)`.
    fn call(&mut self) -> Option<(String, Map<String, Value>)> {
        let name = self.word(true)?;
        if !self.c.eat("(") {
            return None;
        }
        let mut args = Map::new();
        loop {
            if self.c.eat(")") {
                return Some((name, args));
            }
            let key = self.word(false)?;
            if !self.c.eat("=") {
                return None;
            }
            let v = self.value()?;
            args.insert(key, v);
            if !self.c.eat(",") {
                return self.c.eat(")").then_some((name, args));
            }
        }
    }

    /// Items up to `close`, trailing comma allowed.
    fn items(&mut self, close: &str) -> Option<Vec<Value>> {
        let mut a = Vec::new();
        loop {
            if self.c.eat(close) {
                return Some(a);
            }
            a.push(self.value()?);
            if !self.c.eat(",") {
                return self.c.eat(close).then_some(a);
            }
        }
    }

    fn value(&mut self) -> Option<Value> {
        self.c.skip_ws();
        if self.c.eat("[") {
            return self.items("]").map(Value::Array);
        }
        if self.c.eat("(") {
            return self.items(")").map(Value::Array);
        }
        if self.c.eat("{") {
            let mut m = Map::new();
            loop {
                if self.c.eat("}") {
                    return Some(Value::Object(m));
                }
                let key = match self.value()? {
                    Value::String(s) => s,
                    other => other.to_string(),
                };
                if !self.c.eat(":") {
                    return None;
                }
                m.insert(key, self.value()?);
                if !self.c.eat(",") {
                    return self.c.eat("}").then_some(Value::Object(m));
                }
            }
        }
        let rest = self.c.rest();
        if rest.starts_with('"') || rest.starts_with('\'') {
            return self.string().map(Value::String);
        }
        let len = rest.find([',', ')', ']', '}', ':']).unwrap_or(rest.len());
        let token = rest[..len].trim();
        self.c.pos += len;
        match token {
            "True" | "true" => Some(Value::Bool(true)),
            "False" | "false" => Some(Value::Bool(false)),
            "None" | "null" => Some(Value::Null),
            _ => number(token),
        }
    }

    /// A quoted string with Python's escapes.
    fn string(&mut self) -> Option<String> {
        let quote = self.c.rest().chars().next()?;
        self.c.pos += 1;
        let mut out = String::new();
        let mut chars = self.c.rest().char_indices();
        while let Some((i, c)) = chars.next() {
            if c == quote {
                self.c.pos += i + 1;
                return Some(out);
            }
            if c != '\\' {
                out.push(c);
                continue;
            }
            let (_, e) = chars.next()?;
            let mut hex = |n: usize| -> Option<char> {
                let digits: String = (0..n).filter_map(|_| chars.next().map(|(_, c)| c)).collect();
                char::from_u32(u32::from_str_radix(&digits, 16).ok()?)
            };
            match e {
                'n' => out.push('\n'),
                't' => out.push('\t'),
                'r' => out.push('\r'),
                '0' => out.push('\0'),
                '\\' | '\'' | '"' => out.push(e),
                '\n' => {}
                'x' => out.push(hex(2)?),
                'u' => out.push(hex(4)?),
                'U' => out.push(hex(8)?),
                other => {
                    out.push('\\');
                    out.push(other);
                }
            }
        }
        None
    }
}

/// A Python int or float literal.
fn number(token: &str) -> Option<Value> {
    let t = token.replace('_', "");
    if let Ok(i) = t.parse::<i64>() {
        return Some(Value::from(i));
    }
    if t.chars().all(|c| c.is_ascii_digit() || matches!(c, '-' | '+' | '.' | 'e' | 'E')) && t.chars().any(|c| c.is_ascii_digit()) {
        return t.parse::<f64>().ok().and_then(Number::from_f64).map(Value::Number);
    }
    None
}
