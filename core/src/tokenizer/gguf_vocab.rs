//! Building a byte-level BPE tokenizer from a GGUF file's `tokenizer.ggml.*` metadata. It encodes
//! like transformers' `AutoTokenizer.from_pretrained(..., gguf_file=...)` and, where the two
//! differ, like llama.cpp running the file: digits split for `smollm`-style vocabularies, and
//! added tokens spelled outside the byte alphabet kept under their own ids.

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior};

use super::special_tokens_processor;
use crate::gguf::GgufHeader;
use crate::{Error, Result};

/// llama.cpp's `llama_token_type` values in `tokenizer.ggml.token_type`.
const TOKEN_TYPE_CONTROL: i64 = 3;
const TOKEN_TYPE_USER_DEFINED: i64 = 4;

/// Split regexes for the `tokenizer.ggml.pre` values llama.cpp writes, spelled as the models'
/// own `tokenizer.json` files spell them (Oniguruma syntax, which `tokenizers` uses).
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_SPLIT: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const GPT4O_SPLIT: &str = concat!(
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);
/// StarCoder-style vocabularies (SmolLM among them) split every digit off before the GPT-2 regex.
const DIGIT_SPLIT: &str = r"\p{N}";

/// How text is cut into words before BPE, by `tokenizer.ggml.pre`.
enum PreTokenization {
    /// GPT-2's own regex (built into `ByteLevel`).
    Gpt2,
    /// Single digits first, then GPT-2's regex.
    DigitsThenGpt2,
    /// One regex, then the byte-level mapping.
    Regex(&'static str),
}

impl PreTokenization {
    fn for_pre(pre: &str) -> Option<Self> {
        Some(match pre {
            "gpt2" | "mpt" | "olmo" => Self::Gpt2,
            "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" | "minerva-7b" => {
                Self::DigitsThenGpt2
            }
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0" | "lfm2"
            | "dbrx" | "smaug-bpe" => Self::Regex(LLAMA3_SPLIT),
            "qwen2" | "deepseek-r1-qwen" | "megrez" => Self::Regex(QWEN2_SPLIT),
            "gpt-4o" | "llama4" | "minimax-m2" => Self::Regex(GPT4O_SPLIT),
            _ => return None,
        })
    }

    fn build(&self) -> Result<PreTokenizerWrapper> {
        let isolated = |regex: &str| -> Result<PreTokenizerWrapper> {
            Split::new(SplitPattern::Regex(regex.to_string()), SplitDelimiterBehavior::Isolated, false)
                .map(Into::into)
                .map_err(|e| Error::Tokenizer(format!("pre-tokenizer regex: {e}")))
        };
        Ok(match self {
            Self::Gpt2 => ByteLevel::new(false, true, true).into(),
            Self::DigitsThenGpt2 => {
                Sequence::new(vec![isolated(DIGIT_SPLIT)?, ByteLevel::new(false, true, true).into()]).into()
            }
            Self::Regex(regex) => {
                Sequence::new(vec![isolated(regex)?, ByteLevel::new(false, true, false).into()]).into()
            }
        })
    }
}

/// What [`build`] hands back to [`super::Tokenizer::from_gguf`].
pub(super) struct GgufTokenizer {
    pub tokenizer: tokenizers::Tokenizer,
    pub bos: Option<(u32, String)>,
    pub eos_ids: Vec<u32>,
    pub eos_token: Option<String>,
    pub chat_template: Option<String>,
    pub warnings: Vec<String>,
}

pub(super) fn build(header: &GgufHeader) -> Result<GgufTokenizer> {
    let model = header
        .get_str("tokenizer.ggml.model")
        .ok_or_else(|| Error::ModelLoad("GGUF file has no tokenizer (no 'tokenizer.ggml.model' key)".into()))?;
    if model == "llama" && header.architecture() == Some("gemma3") {
        return super::gguf_spm::build(header);
    }
    if model != "gpt2" {
        return Err(Error::Unsupported(format!(
            "GGUF tokenizer model '{model}' (tokenizer.ggml.model) is not supported; Weft builds only byte-level \
             BPE ('gpt2') tokenizers from GGUF metadata"
        )));
    }
    let tokens = header
        .get_str_array("tokenizer.ggml.tokens")
        .ok_or_else(|| missing("tokenizer.ggml.tokens", "an array of strings"))?;
    let merges = header
        .get_str_array("tokenizer.ggml.merges")
        .ok_or_else(|| missing("tokenizer.ggml.merges", "an array of strings"))?;
    let token_types = match header.get("tokenizer.ggml.token_type") {
        None => None,
        Some(_) => {
            let types = header
                .get_i64_array("tokenizer.ggml.token_type")
                .ok_or_else(|| missing("tokenizer.ggml.token_type", "an array of integers"))?;
            if types.len() != tokens.len() {
                return Err(Error::ModelLoad(format!(
                    "GGUF tokenizer.ggml.token_type has {} entries but there are {} tokens",
                    types.len(),
                    tokens.len()
                )));
            }
            Some(types)
        }
    };
    let token_id = |key: &str| -> Result<Option<u32>> {
        let Some(value) = header.get(key) else { return Ok(None) };
        match value.as_u64().and_then(|id| u32::try_from(id).ok()) {
            Some(id) if (id as usize) < tokens.len() => Ok(Some(id)),
            _ => Err(Error::ModelLoad(format!(
                "GGUF {key} is {value:?}, not a token id below the vocabulary size {}",
                tokens.len()
            ))),
        }
    };

    let bos_id = token_id("tokenizer.ggml.bos_token_id")?;
    let eos_id = token_id("tokenizer.ggml.eos_token_id")?;
    let special_ids =
        [bos_id, eos_id, token_id("tokenizer.ggml.unknown_token_id")?, token_id("tokenizer.ggml.padding_token_id")?];
    let type_of = |id: usize| token_types.as_ref().map(|types| types[id]);
    let is_special = |id: usize| type_of(id) == Some(TOKEN_TYPE_CONTROL) || special_ids.contains(&Some(id as u32));
    let is_user_defined = |id: usize| type_of(id) == Some(TOKEN_TYPE_USER_DEFINED);

    // Ordinary tokens are spelled in the byte alphabet, which BPE works in. Added tokens (control
    // and user-defined) are plain text that llama.cpp matches verbatim in the input, e.g.
    // `<|im_start|>` or DeepSeek's `<｜begin▁of▁sentence｜>`, so they are keyed by that text.
    let bytes = ByteAlphabet::new();
    let mut vocab = Vocab::with_capacity(tokens.len());
    for (id, token) in tokens.iter().enumerate() {
        let key = if is_special(id) || is_user_defined(id) { token.to_string() } else { bytes.spell(token) };
        // A later duplicate wins, as in transformers' dict of the vocabulary.
        vocab.insert(key, id as u32);
    }
    let merges = merges
        .iter()
        .map(|merge| {
            // llama.cpp splits at the first space after the first character.
            let split_at = merge.char_indices().skip(1).find(|&(_, c)| c == ' ').map(|(i, _)| i);
            let (left, right) = split_at.map(|i| (&merge[..i], &merge[i + 1..])).ok_or_else(|| {
                Error::ModelLoad(format!("GGUF tokenizer merge {merge:?} is not two tokens separated by a space"))
            })?;
            Ok((left.to_string(), right.to_string()))
        })
        .collect::<Result<Vec<_>>>()?;
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .build()
        .map_err(|e| Error::ModelLoad(format!("GGUF tokenizer vocabulary/merges are inconsistent: {e}")))?;

    let mut warnings = Vec::new();
    let pre = header.get_str("tokenizer.ggml.pre").unwrap_or("gpt2");
    let pre_tokenization = PreTokenization::for_pre(pre).unwrap_or_else(|| {
        warnings.push(format!(
            "GGUF tokenizer.ggml.pre = '{pre}' is not one Weft knows; splitting text with the GPT-2 regex, \
             which may tokenize some text differently from the model's own tokenizer"
        ));
        PreTokenization::Gpt2
    });

    let mut tokenizer = tokenizers::Tokenizer::new(bpe);
    tokenizer.with_pre_tokenizer(Some(pre_tokenization.build()?));
    tokenizer.with_decoder(Some(ByteLevelDecoder::default()));

    // Added tokens are matched whole in the input; only the special ones are dropped by
    // `decode(skip_special = true)`.
    let added_tokens = |keep: &dyn Fn(usize) -> bool, special: bool| -> Vec<AddedToken> {
        let kept = tokens.iter().enumerate().filter(|&(id, _)| keep(id));
        kept.map(|(_, token)| AddedToken::from(token.to_string(), special).normalized(false)).collect()
    };
    tokenizer.add_special_tokens(&added_tokens(&is_special, true));
    tokenizer.add_tokens(&added_tokens(&|id| is_user_defined(id) && !is_special(id), false));

    let token_text = |id: u32| tokens[id as usize].to_string();
    let flag = |key: &str| header.get_bool(key).unwrap_or(false);
    let bos = bos_id.map(|id| (id, token_text(id)));
    let eos = eos_id.map(|id| (id, token_text(id)));
    // As transformers does, asking for BOS/EOS that the file does not name adds nothing.
    let add_bos = flag("tokenizer.ggml.add_bos_token").then_some(bos.clone()).flatten();
    let add_eos = flag("tokenizer.ggml.add_eos_token").then_some(eos.clone()).flatten();
    tokenizer.with_post_processor(Some(special_tokens_processor(add_bos, add_eos)?));

    // llama.cpp also stops at the end-of-turn / end-of-message tokens when the file names them.
    let mut eos_ids = Vec::new();
    for key in ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"] {
        if let Some(id) = token_id(key)? {
            if !eos_ids.contains(&id) {
                eos_ids.push(id);
            }
        }
    }

    Ok(GgufTokenizer {
        tokenizer,
        bos,
        eos_ids,
        eos_token: eos.map(|(_, text)| text),
        chat_template: header.get_str("tokenizer.chat_template").map(str::to_string),
        warnings,
    })
}

fn missing(key: &str, what: &str) -> Error {
    Error::ModelLoad(format!("GGUF key '{key}' is missing or is not {what}"))
}

/// GPT-2's reversible byte → character mapping (`bytes_to_unicode`): printable Latin-1 bytes
/// stand for themselves, the other 68 bytes map to U+0100.. in byte order.
struct ByteAlphabet {
    chars: [char; 256],
}

impl ByteAlphabet {
    fn new() -> Self {
        let mut chars = ['\0'; 256];
        let mut next_unprintable = 0x100u32;
        for byte in 0..=255u8 {
            chars[byte as usize] = if Self::is_printable(byte) {
                char::from(byte)
            } else {
                let c = char::from_u32(next_unprintable).expect("U+0100..U+0143 are characters");
                next_unprintable += 1;
                c
            };
        }
        Self { chars }
    }

    fn is_printable(byte: u8) -> bool {
        matches!(byte, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF)
    }

    /// Whether every character of `token` belongs to the alphabet.
    fn spells(&self, token: &str) -> bool {
        token.chars().all(|c| match u32::from(c) {
            code @ 0..=0xFF => Self::is_printable(code as u8),
            code => (0x100..0x100 + 68).contains(&code),
        })
    }

    /// `token` as the BPE model stores it: as is when already in the alphabet (GGUF files store
    /// byte-level vocabularies that way), else its UTF-8 bytes mapped into the alphabet.
    fn spell(&self, token: &str) -> String {
        if self.spells(token) {
            token.to_string()
        } else {
            token.bytes().map(|b| self.chars[b as usize]).collect()
        }
    }
}
