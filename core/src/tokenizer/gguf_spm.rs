//! Gemma's SentencePiece vocabulary from GGUF metadata (`tokenizer.ggml.model = "llama"` in a
//! `gemma3` file), built the way transformers builds it from the same file
//! (`gguf_tokenizer_mapping.gemma_tokenizer` + `GemmaTokenizer`): a BPE with byte fallback whose
//! merges are recovered from the vocabulary (the file lists none), spaces normalized to `▁`, no
//! prefix space, control tokens special and user-defined tokens matched whole.
//!
//! Merge recovery (transformers `generate_merges` with Gemma's scores = minus the token's
//! position): every token is cut at each character boundary into two vocabulary tokens; pairs are
//! ordered best-first by the merged token's position, then by longer left piece, then by longer
//! right piece; pairs of one token keep the order of their pieces' ids.

use std::collections::HashMap;

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::replace::Replace;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, SplitDelimiterBehavior};

use super::gguf_vocab::GgufTokenizer;
use super::special_tokens_processor;
use crate::gguf::GgufHeader;
use crate::{Error, Result};

const TOKEN_TYPE_CONTROL: i64 = 3;
const TOKEN_TYPE_USER_DEFINED: i64 = 4;

fn tok_err(e: impl std::fmt::Display) -> Error {
    Error::ModelLoad(format!("GGUF sentencepiece tokenizer: {e}"))
}

/// Merges implied by the vocabulary (see the module docs).
fn recover_merges(tokens: &[String], vocab: &HashMap<String, u32>) -> Vec<(String, String)> {
    // First position of each distinct token (Python dict insertion order) with its last
    // position as the score (a later duplicate overwrites the value).
    let mut order: Vec<&str> = Vec::new();
    let mut score: HashMap<&str, i64> = HashMap::new();
    for (i, t) in tokens.iter().enumerate() {
        if score.insert(t.as_str(), -(i as i64)).is_none() {
            order.push(t.as_str());
        }
    }
    // (score, left chars, right chars, left, right)
    let mut merges: Vec<(i64, usize, usize, &str, &str)> = Vec::new();
    for merged in order {
        let s = score[merged];
        let mut local: Vec<(&str, &str)> = Vec::new();
        for (cut, _) in merged.char_indices().skip(1) {
            let (l, r) = merged.split_at(cut);
            if vocab.contains_key(l) && vocab.contains_key(r) {
                local.push((l, r));
            }
        }
        local.sort_by_key(|(l, r)| (vocab[*l], vocab[*r]));
        merges.extend(local.into_iter().map(|(l, r)| (s, l.chars().count(), r.chars().count(), l, r)));
    }
    // Python's sorted(reverse=True) is stable: equal keys keep their order.
    merges.sort_by(|a, b| (b.0, b.1, b.2).cmp(&(a.0, a.1, a.2)));
    merges.into_iter().map(|(_, _, _, l, r)| (l.to_string(), r.to_string())).collect()
}

pub(super) fn build(header: &GgufHeader) -> Result<GgufTokenizer> {
    let raw = header
        .get_str_array("tokenizer.ggml.tokens")
        .ok_or_else(|| tok_err("missing tokenizer.ggml.tokens"))?;
    let types = header.get_i64_array("tokenizer.ggml.token_type").unwrap_or_default();
    // Tokens of whitespace with a space are stored with real spaces; the model spells them "▁".
    let tokens: Vec<String> = raw
        .iter()
        .map(|t| {
            if t.contains(' ') && t.trim().is_empty() {
                "\u{2581}".repeat(t.chars().count())
            } else {
                t.to_string()
            }
        })
        .collect();
    let mut vocab: HashMap<String, u32> = HashMap::with_capacity(tokens.len());
    for (i, t) in tokens.iter().enumerate() {
        vocab.insert(t.clone(), i as u32);
    }
    let merges = recover_merges(&tokens, &vocab);
    let id = |key: &str| header.get_u64(key).map(|v| v as u32).filter(|&v| (v as usize) < tokens.len());
    let (bos_id, eos_id, unk_id, pad_id) = (
        id("tokenizer.ggml.bos_token_id"),
        id("tokenizer.ggml.eos_token_id"),
        id("tokenizer.ggml.unknown_token_id"),
        id("tokenizer.ggml.padding_token_id"),
    );
    let unk = unk_id.map(|u| tokens[u as usize].clone()).unwrap_or_else(|| "<unk>".into());
    let bpe = BPE::builder()
        .vocab_and_merges(vocab.clone().into_iter().collect::<Vocab>(), merges)
        .unk_token(unk)
        .fuse_unk(true)
        .byte_fallback(true)
        .build()
        .map_err(tok_err)?;
    let mut tokenizer = tokenizers::Tokenizer::new(bpe);
    tokenizer.with_normalizer(Some(Replace::new(" ", "\u{2581}").map_err(tok_err)?));
    tokenizer.with_pre_tokenizer(Some(Split::new(
        SplitPattern::String(" ".into()),
        SplitDelimiterBehavior::MergedWithPrevious,
        false,
    )
    .map_err(tok_err)?));
    tokenizer.with_decoder(Some(DecoderSequence::new(vec![
        Replace::new("\u{2581}", " ").map_err(tok_err)?.into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ])));

    let type_of = |i: usize| types.get(i).copied();
    let named = [bos_id, eos_id, unk_id, pad_id];
    let special: Vec<AddedToken> = raw
        .iter()
        .enumerate()
        .filter(|&(i, _)| type_of(i) == Some(TOKEN_TYPE_CONTROL) || named.contains(&Some(i as u32)))
        .map(|(_, t)| AddedToken::from(t.to_string(), true).normalized(false))
        .collect();
    tokenizer.add_special_tokens(&special);
    let user: Vec<AddedToken> = raw
        .iter()
        .enumerate()
        .filter(|&(i, t)| type_of(i) == Some(TOKEN_TYPE_USER_DEFINED) && vocab.contains_key(*t))
        .map(|(_, t)| AddedToken::from(t.to_string(), false).normalized(false))
        .collect();
    tokenizer.add_tokens(&user);

    let text = |i: u32| tokens[i as usize].clone();
    let bos = bos_id.map(|i| (i, text(i)));
    let eos = eos_id.map(|i| (i, text(i)));
    let flag = |key: &str, default: bool| header.get_bool(key).unwrap_or(default);
    // llama.cpp adds BOS to a sentencepiece vocabulary unless the file says otherwise.
    let add_bos = flag("tokenizer.ggml.add_bos_token", true).then_some(bos.clone()).flatten();
    let add_eos = flag("tokenizer.ggml.add_eos_token", false).then_some(eos.clone()).flatten();
    tokenizer.with_post_processor(Some(special_tokens_processor(add_bos, add_eos)?));

    let mut eos_ids = Vec::new();
    for key in ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"] {
        if let Some(i) = id(key) {
            if !eos_ids.contains(&i) {
                eos_ids.push(i);
            }
        }
    }
    Ok(GgufTokenizer {
        tokenizer,
        bos,
        eos_ids,
        eos_token: eos.map(|(_, t)| t),
        chat_template: header.get_str("tokenizer.chat_template").map(str::to_string),
        warnings: Vec::new(),
    })
}
