//! Qwen3-Coder XML (Qwen3-Coder, Qwen3.5 / 3.6):
//! `<tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n</function>\n</tool_call>`.
//! Values are raw text, typed by the tool's JSON schema (objects and arrays are JSON). Each
//! parameter is delivered as soon as it is whole.

use serde_json::Value;

use super::{typed_value, Layout, NativeCallParser};
use crate::tools::parser::{Parsed, ToolDelta};
use crate::tools::prompt::python_json;
use crate::tools::{new_call_id, ToolCall};

pub(super) const LAYOUT: Layout = Layout { starts: &["<tool_call>"], end: "</tool_call>", wrappers: &[], ends_at_eos: false };

const FUNCTION: &str = "<function=";
const END_FUNCTION: &str = "</function>";
const PARAMETER: &str = "<parameter=";
const END_PARAMETER: &str = "</parameter>";

impl NativeCallParser {
    /// Delivers what the XML region up to `region_end` completes: the call's start once its
    /// `<function=NAME>` is whole, then each parameter once its `</parameter>` arrives (or the
    /// function / region ends it).
    pub(super) fn xml_progress(&mut self, region_end: usize, region_closed: bool, out: &mut Parsed) {
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

    /// The region's end marker at `i`: the call's arguments closed, or (no `<function=...>`
    /// inside) the region given back as text.
    pub(super) fn xml_close(&mut self, i: usize, out: &mut Parsed) {
        if let Some(sent) = self.params_sent {
            let index = self.calls.len() - 1;
            let close = if sent == 0 { "{}" } else { "}" };
            self.calls[index].arguments.push_str(close);
            out.deltas.push(ToolDelta::Arguments { index, fragment: close.into() });
            self.completed += 1;
        } else {
            out.text.push_str(self.opener);
            out.text.push_str(&self.pending[..i + LAYOUT.end.len()]);
        }
    }
}
