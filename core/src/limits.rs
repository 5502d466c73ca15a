//! Every limit a request is checked against, in one place: the contract, the engine and every
//! face read them from here, so a limit and its message are the same on every path
//! (docs/limits.md lists them). Format parsers' own internal bounds (GGUF nesting, the
//! resampler's ratio terms) stay with their parsers.

/// The most top alternatives a request may ask for with its log-probabilities (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// The largest token id a request may name (ids are `u32`).
pub const MAX_TOKEN_ID: u64 = u32::MAX as u64;

/// The most draft tokens a speculative decoding step verifies per row (`num_draft_tokens`, in
/// engine options and requests).
pub const MAX_DRAFT_TOKENS: usize = 64;

/// The most choices (`n`) one OpenAI request may ask for; a server also caps it at its batch.
pub const MAX_CHOICES: usize = 16;

/// Largest expansion of a regular expression's counted repetitions accepted
/// (`constrain::check_regex_size`).
pub const MAX_REGEX_EXPANSION: u64 = 50_000;

/// Largest encoded image a request may carry (bytes).
pub const MAX_IMAGE_BYTES: usize = 20 << 20;
/// Most images one request may carry (a model may allow fewer).
pub const MAX_IMAGES: usize = 16;
/// Largest decoded image accepted (pixels), so a small file cannot expand into gigabytes.
pub const MAX_PIXELS: u64 = 64 << 20;
/// Longest image side accepted (pixels): the resize's per-axis coefficient tables grow with it,
/// so a 1 x 64M-pixel strip is refused rather than resized.
pub const MAX_SIDE: u32 = 32_768;

/// Most audio clips one request may carry (a model may allow fewer).
pub const MAX_AUDIO_CLIPS: usize = 8;
/// Longest clip accepted, seconds (the Gemma 4 extractor's `max_length` of 480 000 samples at
/// 16 kHz; 750 soft tokens).
pub const MAX_AUDIO_SECONDS: f64 = 30.0;
/// Lowest source sample rate accepted (Hz).
pub const MIN_SAMPLE_RATE: u32 = 1_000;
/// Highest source sample rate accepted (Hz): a header's rate sizes the decoded clip and the
/// resampler's work, so it is bounded before anything is allocated from it.
pub const MAX_SAMPLE_RATE: u32 = 384_000;
