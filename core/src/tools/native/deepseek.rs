//! DeepSeek V3.1: `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{JSON}
//! <｜tool▁call▁end｜>…<｜tool▁calls▁end｜>` (the markers' bars and underscores are the
//! full-width `｜` and `▁` of DeepSeek's vocabulary).

use serde_json::Value;

use super::{json_arguments, Layout, Properties};

pub(super) const LAYOUT: Layout = Layout {
    starts: &["<｜tool▁call▁begin｜>"],
    end: "<｜tool▁call▁end｜>",
    wrappers: &["<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"],
    ends_at_eos: false,
};

const SEP: &str = "<｜tool▁sep｜>";

pub(super) fn parse(body: &str, properties: &Properties) -> Option<(String, Value)> {
    let (name, arguments) = body.split_once(SEP)?;
    let name = name.trim();
    if name.is_empty() || name.contains(char::is_whitespace) {
        return None;
    }
    Some((name.to_string(), json_arguments(name, arguments, properties)?))
}
