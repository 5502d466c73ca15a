//! Reasoning ("thinking") text: which markers a model family wraps it in, detected from its chat
//! template, and a streaming splitter that sends reasoning and answer as separate channels.
//!
//! Families (the markers are what the templates write for reasoning history and what the models
//! generate):
//! - `<think>` … `</think>`: Qwen3 / Qwen3.5 / QwQ, DeepSeek R1 / V3.1, GLM 4.5–4.7, Kimi K2
//!   Thinking, MiniCPM5. Templates with thinking on often end the prompt inside the block
//!   (`<think>\n`), so the output starts in reasoning without an opening marker.
//! - `[THINK]` … `[/THINK]`: Mistral's reasoning models (Magistral, Ministral 3 Reasoning).
//! - `<|channel>thought` … `<channel|>`: Gemma 4's thought channel.
//! - Harmony (gpt-oss): messages `<|channel|>NAME<|message|>…<|end|>`; the `analysis` channel is
//!   reasoning, `final` is the answer, a `commentary` message addressed `to=functions.x` is a
//!   tool call (passed through as raw text for the tool-call parser).
//!
//! Reasoning is trimmed of the whitespace around it, and the answer of the whitespace that
//! follows the closing marker (as llama.cpp, vLLM and mlx-lm's servers deliver them).

/// How a model family marks its reasoning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum ReasoningSyntax {
    /// `<think>` … `</think>`.
    Think,
    /// `[THINK]` … `[/THINK]`.
    MistralThink,
    /// `<|channel>thought` … `<channel|>` (Gemma 4).
    GemmaChannel,
    /// gpt-oss harmony channels.
    Harmony,
}

const HARMONY_MESSAGE: &str = "<|message|>";
const HARMONY_ENDS: [&str; 3] = ["<|end|>", "<|return|>", "<|call|>"];

impl ReasoningSyntax {
    /// The syntax a chat template uses for reasoning, if any.
    pub fn detect(template_source: &str) -> Option<Self> {
        if template_source.contains("<|channel|>analysis") && template_source.contains(HARMONY_MESSAGE) {
            Some(Self::Harmony)
        } else if template_source.contains("<|channel>thought") {
            Some(Self::GemmaChannel)
        } else if template_source.contains("[THINK]") {
            Some(Self::MistralThink)
        } else if template_source.contains("<think>") || template_source.contains("</think>") {
            Some(Self::Think)
        } else {
            None
        }
    }

    /// A stable lowercase name (wire formats, logs).
    pub fn name(self) -> &'static str {
        match self {
            Self::Think => "think",
            Self::MistralThink => "mistral_think",
            Self::GemmaChannel => "gemma_channel",
            Self::Harmony => "harmony",
        }
    }

    /// The opening and closing markers of a reasoning block (harmony: the analysis header and
    /// the end of a message).
    pub fn markers(self) -> (&'static str, &'static str) {
        match self {
            Self::Think => ("<think>", "</think>"),
            Self::MistralThink => ("[THINK]", "[/THINK]"),
            Self::GemmaChannel => ("<|channel>thought", "<channel|>"),
            Self::Harmony => ("<|channel|>analysis<|message|>", "<|end|>"),
        }
    }

    /// What to append to the generated text to end an unfinished reasoning block and go on with
    /// the answer (a spent reasoning budget).
    pub fn close_text(self) -> &'static str {
        match self {
            Self::Think => "\n</think>\n\n",
            Self::MistralThink => "[/THINK]",
            Self::GemmaChannel => "<channel|>",
            Self::Harmony => "<|end|><|start|>assistant<|channel|>final<|message|>",
        }
    }

    /// Whether a rendered prompt leaves the model inside an open reasoning block (the template
    /// wrote the opening marker as the last thing, e.g. Qwen3.5's `<think>\n`).
    pub fn starts_open(self, prompt: &str) -> bool {
        if self == Self::Harmony {
            return false;
        }
        let (open, _) = self.markers();
        prompt.trim_end().ends_with(open)
    }
}

/// A request's reasoning, decided when its prompt is rendered: the family's markers, whether
/// the prompt left the model inside a reasoning block, and the token budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ReasoningPlan {
    pub syntax: ReasoningSyntax,
    pub starts_open: bool,
    /// Reasoning tokens allowed before the block is closed for the model; `None`: unbounded.
    pub budget: Option<usize>,
}

impl ReasoningPlan {
    /// The plan for a prompt rendered by a template whose source is `template_source`; `None`
    /// when the template marks no reasoning.
    pub fn for_prompt(template_source: &str, prompt: &str, budget: Option<usize>) -> Option<Self> {
        let syntax = ReasoningSyntax::detect(template_source)?;
        Some(Self { syntax, starts_open: syntax.starts_open(prompt), budget })
    }

    /// The text that closes an unfinished block, through the closing marker (what a spent
    /// budget forces; the answer that follows is the model's).
    pub fn forced_close(&self) -> &'static str {
        match self.syntax {
            ReasoningSyntax::Think => "\n</think>",
            other => other.close_text(),
        }
    }
}

/// Text split into the two channels.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Split {
    pub reasoning: String,
    pub content: String,
}

impl Split {
    pub fn is_empty(&self) -> bool {
        self.reasoning.is_empty() && self.content.is_empty()
    }

    pub fn append(&mut self, other: Split) {
        self.reasoning.push_str(&other.reasoning);
        self.content.push_str(&other.content);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// At the start of the output: an opening marker may come (after whitespace).
    Start,
    /// Inside a reasoning block; `started` once non-whitespace reasoning was sent.
    Reasoning { started: bool },
    /// Answer text; `started` once non-whitespace was sent (leading whitespace is dropped).
    Content { started: bool },
    /// Harmony: reading a message header up to `<|message|>`.
    HarmonyHeader,
    /// Harmony: inside a message of the given kind.
    HarmonyMessage(HarmonyChannel),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HarmonyChannel {
    Analysis,
    Final,
    /// A `commentary` message addressed to a function: a tool call, passed through raw.
    Call,
}

/// Splits streamed output text into reasoning and answer. Holds back only what could still be
/// the start of a marker (or whitespace that trimming may drop), so text flows with at most a
/// marker's length of delay.
#[derive(Debug, Clone)]
pub struct ReasoningSplitter {
    syntax: ReasoningSyntax,
    state: State,
    /// Received text not yet classified.
    pending: String,
    /// Harmony: the header being read.
    header: String,
}

impl ReasoningSplitter {
    /// `starts_open`: the prompt left the model inside a reasoning block
    /// ([`ReasoningSyntax::starts_open`]).
    pub fn new(syntax: ReasoningSyntax, starts_open: bool) -> Self {
        let state = match (syntax, starts_open) {
            (ReasoningSyntax::Harmony, _) => State::HarmonyHeader,
            (_, true) => State::Reasoning { started: false },
            (_, false) => State::Start,
        };
        Self { syntax, state, pending: String::new(), header: String::new() }
    }

    pub fn syntax(&self) -> ReasoningSyntax {
        self.syntax
    }

    /// Whether the text so far ends inside a reasoning block.
    pub fn in_reasoning(&self) -> bool {
        matches!(self.state, State::Reasoning { .. } | State::HarmonyMessage(HarmonyChannel::Analysis))
    }

    /// Feeds generated text; returns what can be delivered now.
    pub fn push(&mut self, text: &str) -> Split {
        self.pending.push_str(text);
        let mut out = Split::default();
        while self.step(&mut out, false) {}
        out
    }

    /// The end of the output: delivers everything held back.
    pub fn finish(&mut self) -> Split {
        let mut out = Split::default();
        while self.step(&mut out, true) {}
        out
    }

    /// One transition over `pending`; `false` when nothing more can be decided now.
    fn step(&mut self, out: &mut Split, at_end: bool) -> bool {
        let (open, close) = self.syntax.markers();
        match self.state {
            State::Start => {
                let rest = self.pending.trim_start();
                if rest.is_empty() {
                    if at_end {
                        self.pending.clear();
                    }
                    return false;
                }
                if let Some(after) = rest.strip_prefix(open) {
                    self.pending = after.to_string();
                    self.state = State::Reasoning { started: false };
                    return true;
                }
                if open.starts_with(rest) && !at_end {
                    return false; // maybe the marker, not complete yet
                }
                self.state = State::Content { started: false };
                true
            }
            State::Reasoning { started } => {
                if let Some(i) = self.pending.find(close) {
                    let body = self.pending[..i].trim_end().to_string();
                    self.pending.drain(..i + close.len());
                    out.reasoning.push_str(if started { &body } else { body.trim_start() });
                    self.state = State::Content { started: false };
                    return true;
                }
                // Hold back a possible partial close marker and the whitespace before it.
                let ready =
                    if at_end { self.pending.trim_end().len() } else { self.pending.len() - held_suffix(&self.pending, close) };
                let body = &self.pending[..ready];
                let body = if started { body } else { body.trim_start() };
                if !body.is_empty() {
                    out.reasoning.push_str(body);
                    self.state = State::Reasoning { started: true };
                }
                if at_end {
                    self.pending.clear();
                } else {
                    self.pending.drain(..ready);
                }
                false
            }
            State::Content { started } => {
                let text = std::mem::take(&mut self.pending);
                let text = if started { text.as_str() } else { text.trim_start() };
                if !text.is_empty() {
                    out.content.push_str(text);
                    self.state = State::Content { started: true };
                }
                false
            }
            State::HarmonyHeader => self.harmony_header(at_end),
            State::HarmonyMessage(channel) => self.harmony_message(channel, out, at_end),
        }
    }

    fn harmony_header(&mut self, at_end: bool) -> bool {
        if let Some(i) = self.pending.find(HARMONY_MESSAGE) {
            self.header.push_str(&self.pending[..i]);
            self.pending.drain(..i + HARMONY_MESSAGE.len());
            let header = std::mem::take(&mut self.header);
            let channel = if header.contains("to=") {
                // The call's header (less the role) goes to the tool-call parser with its body.
                let header = header.trim_start().trim_start_matches("<|start|>").trim_start_matches("assistant").trim_start();
                self.header = format!("{header}{HARMONY_MESSAGE}");
                HarmonyChannel::Call
            } else if header.contains("<|channel|>analysis") {
                HarmonyChannel::Analysis
            } else {
                HarmonyChannel::Final
            };
            self.state = State::HarmonyMessage(channel);
            return true;
        }
        let keep = if at_end { 0 } else { held_suffix(&self.pending, HARMONY_MESSAGE) };
        let ready = self.pending.len() - keep;
        self.header.push_str(&self.pending[..ready]);
        self.pending.drain(..ready);
        if at_end {
            // Output that ended inside a header (or never used channels) is the answer.
            let plain = std::mem::take(&mut self.header);
            self.state = State::Content { started: false };
            self.pending = plain.replace("<|start|>assistant", "").replace("<|channel|>", "");
            return true;
        }
        false
    }

    fn harmony_message(&mut self, channel: HarmonyChannel, out: &mut Split, at_end: bool) -> bool {
        let end = HARMONY_ENDS.iter().filter_map(|m| self.pending.find(m).map(|i| (i, *m))).min();
        let (body, finished) = match end {
            Some((i, marker)) => {
                let body = self.pending[..i].to_string();
                let tail = if channel == HarmonyChannel::Call { marker } else { "" };
                self.pending.drain(..i + marker.len());
                (format!("{body}{tail}"), true)
            }
            None => {
                let keep = if at_end { 0 } else { HARMONY_ENDS.iter().map(|m| held_suffix(&self.pending, m)).max().unwrap_or(0) };
                let ready = self.pending.len() - keep;
                let body = self.pending[..ready].to_string();
                self.pending.drain(..ready);
                (body, at_end)
            }
        };
        match channel {
            HarmonyChannel::Analysis => out.reasoning.push_str(&body),
            HarmonyChannel::Final => out.content.push_str(&body),
            HarmonyChannel::Call => {
                out.content.push_str(&std::mem::take(&mut self.header));
                out.content.push_str(&body);
            }
        }
        if finished {
            self.state = State::HarmonyHeader;
            return !self.pending.is_empty();
        }
        false
    }

    /// Splits a whole text at once.
    pub fn split_all(syntax: ReasoningSyntax, starts_open: bool, text: &str) -> Split {
        let mut s = Self::new(syntax, starts_open);
        let mut out = s.push(text);
        out.append(s.finish());
        out
    }
}

/// The length of the longest suffix of `text` that is a proper prefix of `marker`, plus any
/// whitespace before it (trimming may drop whitespace that ends up before a marker).
fn held_suffix(text: &str, marker: &str) -> usize {
    let mut keep = 0;
    for (i, _) in text.char_indices().rev().take(marker.len()) {
        if marker.starts_with(&text[i..]) && text.len() - i < marker.len() {
            keep = text.len() - i;
        }
    }
    let before = &text[..text.len() - keep];
    keep + (before.len() - before.trim_end().len())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `text` split at every pair of byte boundaries (three pieces) and checks each
    /// delivery equals the whole-text split.
    fn every_split(syntax: ReasoningSyntax, starts_open: bool, text: &str) -> Split {
        let whole = ReasoningSplitter::split_all(syntax, starts_open, text);
        let bounds: Vec<usize> = (0..=text.len()).filter(|i| text.is_char_boundary(*i)).collect();
        for &a in &bounds {
            for &b in bounds.iter().filter(|b| **b >= a) {
                let mut s = ReasoningSplitter::new(syntax, starts_open);
                let mut got = Split::default();
                for piece in [&text[..a], &text[a..b], &text[b..]] {
                    got.append(s.push(piece));
                }
                got.append(s.finish());
                assert_eq!(got, whole, "{syntax:?} split at {a}/{b} of {text:?}");
            }
        }
        whole
    }

    fn split(reasoning: &str, content: &str) -> Split {
        Split { reasoning: reasoning.into(), content: content.into() }
    }

    #[test]
    fn detects_the_families_from_their_templates() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../goldens/templates/");
        let detect = |name: &str| ReasoningSyntax::detect(&std::fs::read_to_string(format!("{dir}{name}.jinja")).unwrap());
        assert_eq!(detect("Qwen3.5-4B"), Some(ReasoningSyntax::Think));
        assert_eq!(detect("GLM-4.7-Flash"), Some(ReasoningSyntax::Think));
        assert_eq!(detect("Kimi-K2-Thinking"), Some(ReasoningSyntax::Think));
        assert_eq!(detect("openbmb-MiniCPM5-1B"), Some(ReasoningSyntax::Think));
        assert_eq!(detect("deepseek-ai-DeepSeek-V3.1"), Some(ReasoningSyntax::Think));
        assert_eq!(detect("google-gemma-4-31B-it"), Some(ReasoningSyntax::GemmaChannel));
        assert_eq!(detect("mistralai-Ministral-3-14B-Reasoning-2512"), Some(ReasoningSyntax::MistralThink));
        assert_eq!(detect("openai-gpt-oss-120b"), Some(ReasoningSyntax::Harmony));
        assert_eq!(detect("Qwen3-Coder"), None);
        assert_eq!(detect("meta-llama-Llama-3.2-3B-Instruct"), None);
    }

    #[test]
    fn an_open_prompt_starts_in_reasoning() {
        assert!(ReasoningSyntax::Think.starts_open("<|im_start|>assistant\n<think>\n"));
        assert!(!ReasoningSyntax::Think.starts_open("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
        assert!(ReasoningSyntax::Think.starts_open("<｜Assistant｜><think>"));
        assert!(!ReasoningSyntax::GemmaChannel.starts_open("<|turn>model\n<|channel>thought\n<channel|>"));
        let got = every_split(ReasoningSyntax::Think, true, "Let me think.\nOK.\n</think>\n\nParis.");
        assert_eq!(got, split("Let me think.\nOK.", "Paris."));
    }

    #[test]
    fn think_tags_at_the_start_open_a_block() {
        assert_eq!(every_split(ReasoningSyntax::Think, false, "<think>\nHmm.\n</think>\n\nYes."), split("Hmm.", "Yes."));
        assert_eq!(every_split(ReasoningSyntax::Think, false, "  <think>a</think>b"), split("a", "b"));
        // Only at the start: a marker later in the answer is answer text.
        assert_eq!(every_split(ReasoningSyntax::Think, false, "Use <think> tags."), split("", "Use <think> tags."));
        assert_eq!(every_split(ReasoningSyntax::Think, false, "<thin"), split("", "<thin"));
    }

    #[test]
    fn unfinished_reasoning_stays_reasoning() {
        assert_eq!(every_split(ReasoningSyntax::Think, true, "step 1\nstep 2 </thi"), split("step 1\nstep 2 </thi", ""));
        assert_eq!(every_split(ReasoningSyntax::Think, false, "<think>only"), split("only", ""));
    }

    #[test]
    fn whitespace_inside_reasoning_is_kept() {
        assert_eq!(every_split(ReasoningSyntax::Think, true, "a\n\nb  c\n</think>d e"), split("a\n\nb  c", "d e"));
    }

    #[test]
    fn mistral_and_gemma_markers() {
        assert_eq!(every_split(ReasoningSyntax::MistralThink, false, "[THINK]x y[/THINK]Answer"), split("x y", "Answer"));
        assert_eq!(
            every_split(ReasoningSyntax::GemmaChannel, false, "<|channel>thought\nPlan.<channel|>Done."),
            split("Plan.", "Done.")
        );
        assert_eq!(every_split(ReasoningSyntax::GemmaChannel, false, "Direct answer."), split("", "Direct answer."));
    }

    #[test]
    fn harmony_channels() {
        let text = "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Hi!<|return|>";
        assert_eq!(every_split(ReasoningSyntax::Harmony, false, text), split("Think.", "Hi!"));
        let call = "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}<|call|>";
        assert_eq!(
            every_split(ReasoningSyntax::Harmony, false, call),
            split("Need weather.", "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}<|call|>")
        );
        assert_eq!(every_split(ReasoningSyntax::Harmony, false, "<|channel|>analysis<|message|>cut"), split("cut", ""));
    }

    #[test]
    fn close_text_closes_the_block() {
        for syntax in [ReasoningSyntax::Think, ReasoningSyntax::MistralThink, ReasoningSyntax::GemmaChannel, ReasoningSyntax::Harmony] {
            let (open, _) = syntax.markers();
            let text = format!("{open}budget ran out{}answer", syntax.close_text());
            assert_eq!(every_split(syntax, false, &text), split("budget ran out", "answer"), "{syntax:?}");
        }
    }
}
