//! Streamed text with stop strings: text is released as soon as it cannot be the start of a
//! stop string, so a client never sees text that a stop string later removes.

use crate::tokenizer::{StreamDecoder, Tokenizer};
use crate::Result;

/// Why a request (or a single-sequence generation) ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// EOS / stop token or stop string.
    Stop,
    /// `max_tokens` or the context limit.
    Length,
    Cancelled,
    /// A request with tools stopped (any stop, or its call limit) after making calls: what
    /// OpenAI calls a `tool_calls` finish and Anthropic `tool_use`.
    #[serde(rename = "tool_calls")]
    ToolCalls,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Cancelled => "cancelled",
            FinishReason::ToolCalls => "tool_calls",
        }
    }
}


#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
}

impl StopMatcher {
    pub fn new(stops: &[String]) -> Self {
        StopMatcher { stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(), held: String::new() }
    }

    /// Feeds new text; returns the text safe to emit and the stop string reached, if one was
    /// (the emitted text then ends just before it).
    pub fn push(&mut self, new: &str) -> (String, Option<String>) {
        self.held.push_str(new);
        if self.stops.is_empty() {
            return (std::mem::take(&mut self.held), None);
        }
        // The earliest match wins; at the same position, the stop listed first.
        let hit = self.stops.iter().filter_map(|s| self.held.find(s.as_str()).map(|pos| (pos, s))).min_by_key(|&(pos, _)| pos);
        if let Some((pos, stop)) = hit {
            let (out, stop) = (self.held[..pos].to_string(), stop.clone());
            self.held.clear();
            return (out, Some(stop));
        }
        // Hold back the longest suffix that is a proper prefix of some stop string.
        let mut hold_from = self.held.len();
        for (i, _) in self.held.char_indices() {
            let tail = &self.held[i..];
            if self.stops.iter().any(|s| s.starts_with(tail)) {
                hold_from = i;
                break;
            }
        }
        let out = self.held[..hold_from].to_string();
        self.held.drain(..hold_from);
        (out, None)
    }

    /// Text still held back when generation ends without a stop string.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

/// Token ids → streamed UTF-8 text (whole characters only) → stop-string matching.
pub struct TextStream {
    decoder: Option<StreamDecoder>,
    stops: StopMatcher,
}

impl TextStream {
    pub fn new(tokenizer: Option<&Tokenizer>, stops: StopMatcher) -> Self {
        TextStream { decoder: tokenizer.map(|t| t.stream_decoder()), stops }
    }

    /// Returns the text to emit for this token and the stop string that ended the output, if
    /// one did.
    pub fn push(&mut self, token: u32) -> Result<(String, Option<String>)> {
        let Some(decoder) = self.decoder.as_mut() else {
            return Ok((String::new(), None));
        };
        let new = decoder.step(token)?.unwrap_or_default();
        Ok(self.stops.push(&new))
    }

    /// Flushes what is left at the end (an incomplete trailing character becomes U+FFFD).
    pub fn finish(&mut self) -> Result<String> {
        let Some(decoder) = self.decoder.as_mut() else {
            return Ok(String::new());
        };
        let rest = decoder.flush()?;
        let (mut out, _) = self.stops.push(&rest);
        out.push_str(&self.stops.finish());
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::StopMatcher;

    #[test]
    fn holds_back_possible_stop_prefixes() {
        let mut m = StopMatcher::new(&["END".to_string()]);
        assert_eq!(m.push("abc E"), ("abc ".to_string(), None));
        assert_eq!(m.push("N"), (String::new(), None));
        assert_eq!(m.push("D tail"), (String::new(), Some("END".to_string())));
    }

    #[test]
    fn releases_held_text_when_it_diverges() {
        let mut m = StopMatcher::new(&["END".to_string()]);
        assert_eq!(m.push("E"), (String::new(), None));
        assert_eq!(m.push("x"), ("Ex".to_string(), None));
        assert_eq!(m.finish(), "");
    }

    #[test]
    fn earliest_of_several_stops_wins() {
        let mut m = StopMatcher::new(&["bb".to_string(), "a".to_string()]);
        assert_eq!(m.push("xxbba"), ("xx".to_string(), Some("bb".to_string())));
    }
}
