//! gpt-oss harmony: a call is a `commentary` message addressed to the function,
//! `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{JSON}<|call|>` (the
//! recipient may also come first: `to=functions.NAME<|channel|>commentary json<|message|>…`,
//! as the template writes history). The reasoning splitter ([`crate::reasoning`]) passes call
//! messages through as text, the role header dropped; `<|call|>` ends the turn, so a message the
//! output ends in is a whole call. One call per turn.

use serde_json::Value;

use super::{json_arguments, Layout, Properties};

pub(super) const LAYOUT: Layout =
    Layout { starts: &["<|channel|>", "to=functions."], end: "<|call|>", wrappers: &[], ends_at_eos: true };

const RECIPIENT: &str = "to=functions.";
const MESSAGE: &str = "<|message|>";

pub(super) fn parse(opener: &str, body: &str, properties: &Properties) -> Option<(String, Value)> {
    let text = format!("{opener}{body}");
    let (header, arguments) = text.split_once(MESSAGE)?;
    let at = header.find(RECIPIENT)? + RECIPIENT.len();
    let name_len = header[at..].find(|c: char| c.is_whitespace() || c == '<').unwrap_or(header.len() - at);
    let name = &header[at..at + name_len];
    if name.is_empty() {
        return None;
    }
    Some((name.to_string(), json_arguments(name, arguments, properties)?))
}
