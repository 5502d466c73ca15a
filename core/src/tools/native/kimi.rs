//! Kimi K2: `<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX
//! <|tool_call_argument_begin|>{JSON}<|tool_call_end|>…<|tool_calls_section_end|>`, every call
//! of the turn inside one section; IDX counts the conversation's calls.

use serde_json::Value;

use super::{json_arguments, Layout, Properties};

pub(super) const LAYOUT: Layout = Layout {
    starts: &["<|tool_call_begin|>"],
    end: "<|tool_call_end|>",
    wrappers: &["<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"],
    ends_at_eos: false,
};

const ARGUMENTS: &str = "<|tool_call_argument_begin|>";

pub(super) fn parse(body: &str, properties: &Properties) -> Option<(String, Value)> {
    let (id, arguments) = body.split_once(ARGUMENTS)?;
    let id = id.trim();
    let id = id.strip_prefix("functions.").unwrap_or(id);
    let (name, index) = id.rsplit_once(':')?;
    if name.is_empty() || index.is_empty() || !index.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    Some((name.to_string(), json_arguments(name, arguments, properties)?))
}
