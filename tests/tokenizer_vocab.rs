//! Tokenizers built from synthetic GGUF metadata (a tiny byte-level BPE vocabulary) and from a
//! tokenizer.json directory: special and user-defined tokens, pre-tokenizer choice by
//! `tokenizer.ggml.pre`, BOS/EOS handling, unsupported vocabularies, streaming decode.

mod tokenizer_support;

use tokenizer_support::{
    check_stream, check_stream_exact, random_ids, tiny_tokenizer_gguf, tiny_vocab, GgufWriter, Meta, TempDir,
    TINY_TEMPLATE,
};
use weft::gguf::GgufHeader;
use weft::tokenizer::{ChatMessage, StreamDecoder, Tokenizer};
use weft::Error;

fn tiny(pre: &str, extra: impl FnOnce(GgufWriter) -> GgufWriter) -> weft::Result<Tokenizer> {
    let dir = TempDir::new(&format!("vocab-{pre}"));
    let path = extra(tiny_tokenizer_gguf(pre)).write(&dir.path("tiny.gguf"));
    Tokenizer::from_gguf(&GgufHeader::read(path)?)
}

fn ids(t: &Tokenizer, tokens: &[&str]) -> Vec<u32> {
    tokens.iter().map(|s| t.token_to_id(s).unwrap_or_else(|| panic!("no token {s:?}"))).collect()
}

#[test]
fn encodes_with_merges_and_whole_special_tokens() {
    let t = tiny("gpt2", |w| w).unwrap();
    assert!(t.warnings().is_empty());
    assert_eq!(t.vocab_size(), 256 + 12 + 4);
    assert_eq!(t.encode("hello world", false).unwrap(), ids(&t, &["hello", "Ġworld"]));
    assert_eq!(
        t.encode("<|im_start|>hello<|im_end|>", false).unwrap(),
        ids(&t, &["<|im_start|>", "hello", "<|im_end|>"])
    );
    // é is two bytes merged into one token; 中 stays three byte tokens.
    assert_eq!(t.encode("é中", false).unwrap(), ids(&t, &["Ã©", "ä", "¸", "Ń"]));
    // A user-defined token is matched whole too.
    assert_eq!(t.encode("<think>hello", false).unwrap(), ids(&t, &["<think>", "hello"]));
}

#[test]
fn added_tokens_outside_the_byte_alphabet_keep_their_ids() {
    // DeepSeek-style control tokens and user-defined tokens with real spaces are stored as plain
    // text; they must be matched verbatim and map to their own ids, not grow the vocabulary.
    let (mut tokens, merges, mut types) = tiny_vocab();
    tokens.extend(["<｜begin▁of▁sentence｜>".to_string(), "<tool call>".to_string()]);
    types.extend([3, 4]);
    let dir = TempDir::new("vocab-raw-added");
    let writer = GgufWriter::default()
        .kv("tokenizer.ggml.model", Meta::str("gpt2"))
        .kv("tokenizer.ggml.tokens", Meta::strs(&tokens))
        .kv("tokenizer.ggml.merges", Meta::strs(&merges))
        .kv("tokenizer.ggml.token_type", Meta::i32s(&types));
    let t = Tokenizer::from_gguf(&GgufHeader::read(writer.write(&dir.path("raw.gguf"))).unwrap()).unwrap();
    let (begin, tool) = (tokens.len() as u32 - 2, tokens.len() as u32 - 1);
    assert_eq!(t.vocab_size(), tokens.len());
    let text = "<｜begin▁of▁sentence｜>hello<tool call>";
    let encoded = t.encode(text, false).unwrap();
    assert_eq!(encoded, [vec![begin], ids(&t, &["hello"]), vec![tool]].concat());
    assert_eq!(t.decode(&encoded, false).unwrap(), text);
    assert_eq!(t.decode(&encoded, true).unwrap(), "hello<tool call>");
}

#[test]
fn decode_skips_control_tokens_but_keeps_user_defined_ones() {
    let t = tiny("gpt2", |w| w).unwrap();
    let encoded = t.encode("<|im_start|><think>hello world<|im_end|>", false).unwrap();
    assert_eq!(t.decode(&encoded, false).unwrap(), "<|im_start|><think>hello world<|im_end|>");
    assert_eq!(t.decode(&encoded, true).unwrap(), "<think>hello world");
    assert_eq!(t.decode(&[999_999], false).unwrap(), "", "unknown ids decode to nothing");
}

#[test]
fn special_token_ids_and_eos_set() {
    let t = tiny("gpt2", |w| w).unwrap();
    let [endoftext, im_start, im_end] =
        [ids(&t, &["<|endoftext|>"])[0], ids(&t, &["<|im_start|>"])[0], ids(&t, &["<|im_end|>"])[0]];
    assert_eq!(t.bos_token_id(), Some(im_start));
    // EOS first, then the end-of-turn token llama.cpp also stops at.
    assert_eq!(t.eos_token_ids(), [im_end, endoftext]);
    assert!(t.is_eos(endoftext) && !t.is_eos(im_start));
    assert_eq!(t.id_to_token(im_end).as_deref(), Some("<|im_end|>"));
}

#[test]
fn add_bos_token_controls_encode_with_special_tokens() {
    let plain = tiny("gpt2", |w| w).unwrap();
    assert_eq!(plain.encode("hello", true).unwrap(), plain.encode("hello", false).unwrap());

    let with_bos = tiny("gpt2", |w| w.kv("tokenizer.ggml.add_bos_token", Meta::Bool(true))).unwrap();
    let bos = with_bos.bos_token_id().unwrap();
    let hello = with_bos.encode("hello", false).unwrap();
    assert_eq!(with_bos.encode("hello", true).unwrap(), [vec![bos], hello.clone()].concat());
    // Chat templates write their own special tokens: apply_chat_template adds no BOS.
    let chat = with_bos.apply_chat_template(&[ChatMessage::new("user", "hello")], false).unwrap();
    assert_eq!(chat[0], bos);
    assert_ne!(chat[1], bos);
}

#[test]
fn pre_tokenizer_follows_tokenizer_ggml_pre() {
    // The vocabulary has "12" and "123": whether they are used depends on how digits are split.
    let cases = [
        ("gpt2", vec!["123", "4"]),           // digits stay together, BPE merges what it can
        ("smollm", vec!["1", "2", "3", "4"]), // every digit split off first
        ("llama-bpe", vec!["123", "4"]),      // groups of up to three digits
        ("qwen2", vec!["1", "2", "3", "4"]),  // single digits
    ];
    for (pre, expected) in cases {
        let t = tiny(pre, |w| w).unwrap();
        assert_eq!(t.encode("1234", false).unwrap(), ids(&t, &expected), "pre = {pre}");
        assert!(t.warnings().is_empty(), "{pre}: {:?}", t.warnings());
    }
    // llama3-style splitting keeps "\n\n" apart from following text and words from spaces.
    let t = tiny("llama-bpe", |w| w).unwrap();
    assert_eq!(t.decode(&t.encode("hello  world\n\nhello", false).unwrap(), false).unwrap(), "hello  world\n\nhello");
}

#[test]
fn unknown_pre_falls_back_to_gpt2_with_a_warning() {
    let t = tiny("some-future-model", |w| w).unwrap();
    assert_eq!(t.encode("1234", false).unwrap(), ids(&t, &["123", "4"]));
    assert_eq!(t.warnings().len(), 1);
    assert!(t.warnings()[0].contains("'some-future-model'"), "{:?}", t.warnings());
}

#[test]
fn unsupported_or_broken_vocabularies() {
    let dir = TempDir::new("vocab-broken");
    let llama = GgufWriter::default()
        .kv("tokenizer.ggml.model", Meta::str("llama"))
        .kv("tokenizer.ggml.tokens", Meta::strs(&["<unk>", "<s>", "</s>"]));
    let header = GgufHeader::read(llama.write(&dir.path("spm.gguf"))).unwrap();
    match Tokenizer::from_gguf(&header) {
        Err(Error::Unsupported(message)) => assert!(message.contains("'llama'"), "{message}"),
        other => panic!("expected Unsupported, got {other:?}"),
    }

    let no_tokenizer = GgufHeader::read(GgufWriter::default().write(&dir.path("none.gguf"))).unwrap();
    assert!(
        matches!(Tokenizer::from_gguf(&no_tokenizer), Err(Error::ModelLoad(m)) if m.contains("tokenizer.ggml.model"))
    );

    let without_merges = |w: GgufWriter| GgufWriter {
        metadata: w.metadata.into_iter().filter(|(k, _)| k != "tokenizer.ggml.merges").collect(),
        ..w
    };
    assert!(matches!(tiny("gpt2", without_merges), Err(Error::ModelLoad(m)) if m.contains("tokenizer.ggml.merges")));

    let bad_eos = tiny("gpt2", |w| w.kv("tokenizer.ggml.eos_token_id", Meta::U32(1_000_000)));
    assert!(matches!(bad_eos, Err(Error::ModelLoad(m)) if m.contains("eos_token_id")));

    let merge_out_of_vocab = tiny("gpt2", |w| w.kv("tokenizer.ggml.merges", Meta::strs(&["x yz"])));
    assert!(matches!(merge_out_of_vocab, Err(Error::ModelLoad(_))));

    let short_types = tiny("gpt2", |w| w.kv("tokenizer.ggml.token_type", Meta::i32s(&[1, 1])));
    assert!(matches!(short_types, Err(Error::ModelLoad(m)) if m.contains("token_type")));
}

#[test]
fn no_chat_template_is_a_clear_error() {
    let t = tiny("gpt2", |w| GgufWriter {
        metadata: w.metadata.into_iter().filter(|(k, _)| k != "tokenizer.chat_template").collect(),
        ..w
    })
    .unwrap();
    assert!(t.chat_template().is_none());
    match t.apply_chat_template(&[ChatMessage::new("user", "hi")], true) {
        Err(Error::Tokenizer(message)) => assert_eq!(message, "this model has no chat template; pass a raw prompt"),
        other => panic!("expected Tokenizer error, got {other:?}"),
    }
}

#[test]
fn stream_decoder_waits_for_whole_characters() {
    let t = tiny("gpt2", |w| w).unwrap();
    let encoded = t.encode("é中 world", false).unwrap();
    let mut decoder = t.stream_decoder();
    let steps: Vec<Option<String>> = encoded.iter().map(|&id| decoder.step(id).unwrap()).collect();
    // "é" is one token; 中's three bytes come out together with the last of them.
    assert_eq!(steps, [Some("é".into()), None, None, Some("中".into()), Some(" world".into())]);
    assert_eq!(decoder.flush().unwrap(), "");
}

#[test]
fn stream_decoder_invariants_on_random_ids() {
    // Mostly raw byte tokens: plenty of split, invalid and completed characters.
    let t = tiny("gpt2", |w| w).unwrap();
    for seed in 1..=500 {
        let ids = random_ids(seed, 1 + seed as usize % 16, t.vocab_size() as u32);
        check_stream_exact(&t, &ids, false);
        check_stream_exact(&t, &ids, true);
    }
    // Only the bytes of valid multi-byte characters: the decode never shows U+FFFD, so no chunk may.
    let text = "é中😀ü€𝄞";
    let ids = t.encode(text, false).unwrap();
    for seed in 1..=100 {
        let order = random_ids(seed, 12, text.chars().count() as u32);
        let mut sequence = Vec::new();
        for i in order {
            let c = text.chars().nth(i as usize).unwrap().to_string();
            sequence.extend(t.encode(&c, false).unwrap());
        }
        check_stream_exact(&t, &sequence, false);
    }
    check_stream_exact(&t, &ids, false);
}

#[test]
fn stream_decoder_flush_replaces_an_incomplete_tail() {
    let t = tiny("gpt2", |w| w).unwrap();
    let encoded = t.encode("a中", false).unwrap();
    let cut = &encoded[..encoded.len() - 1];
    let mut decoder = t.stream_decoder();
    let mut text: String = cut.iter().filter_map(|&id| decoder.step(id).unwrap()).collect();
    assert_eq!(text, "a");
    text += &decoder.flush().unwrap();
    assert_eq!(text, t.decode(cut, false).unwrap());
    assert!(text.ends_with('\u{FFFD}'));
}

#[test]
fn stream_decoder_can_skip_special_tokens() {
    let t = tiny("gpt2", |w| w).unwrap();
    let encoded = t.encode("<|im_start|>hello<|im_end|> world", false).unwrap();
    let mut decoder = StreamDecoder::new(&t, true);
    let mut text: String = encoded.iter().filter_map(|&id| decoder.step(id).unwrap()).collect();
    text += &decoder.flush().unwrap();
    assert_eq!(text, "hello world");
}

#[test]
fn from_dir_reads_tokenizer_json_and_configs() {
    let t = tiny("smollm", |w| w).unwrap();
    let dir = TempDir::new("vocab-dir");
    t.inner().save(dir.path("tokenizer.json"), false).unwrap();
    std::fs::write(
        dir.path("tokenizer_config.json"),
        serde_json::json!({
            "bos_token": {"content": "<|im_start|>", "__type": "AddedToken"},
            "eos_token": "<|im_end|>",
            "add_bos_token": true,
            "chat_template": TINY_TEMPLATE,
        })
        .to_string(),
    )
    .unwrap();
    let [endoftext, im_start, im_end] =
        [t.token_to_id("<|endoftext|>").unwrap(), t.bos_token_id().unwrap(), t.eos_token_ids()[0]];
    std::fs::write(dir.path("generation_config.json"), format!(r#"{{"eos_token_id": [{im_end}, {endoftext}]}}"#))
        .unwrap();
    std::fs::write(dir.path("config.json"), r#"{"eos_token_id": 7}"#).unwrap();

    let loaded = Tokenizer::from_dir(&dir.0).unwrap();
    assert_eq!(loaded.bos_token_id(), Some(im_start));
    assert_eq!(loaded.eos_token_ids(), [im_end, endoftext, 7]);
    // Same splitting as the GGUF original; add_bos_token in tokenizer_config.json adds BOS.
    let text = "hello world 1234 <|im_start|>é";
    assert_eq!(loaded.encode(text, false).unwrap(), t.encode(text, false).unwrap());
    assert_eq!(loaded.encode("hello", true).unwrap(), [vec![im_start], t.encode("hello", false).unwrap()].concat());
    let messages = [ChatMessage::new("user", "hello")];
    assert_eq!(loaded.apply_chat_template(&messages, true).unwrap(), t.apply_chat_template(&messages, true).unwrap());

    // chat_template.jinja wins over tokenizer_config.json; config eos may be a single id.
    std::fs::write(dir.path("chat_template.jinja"), "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}").unwrap();
    std::fs::write(dir.path("generation_config.json"), format!(r#"{{"eos_token_id": {endoftext}}}"#)).unwrap();
    std::fs::remove_file(dir.path("config.json")).unwrap();
    let loaded = Tokenizer::from_dir(&dir.0).unwrap();
    assert_eq!(loaded.chat_template().unwrap().render(&messages, false).unwrap(), "<|im_start|>hello<|im_end|>");
    assert_eq!(loaded.eos_token_ids(), [im_end, endoftext]);
}

#[test]
fn from_dir_errors_name_the_problem() {
    let dir = TempDir::new("vocab-dir-errors");
    assert!(matches!(Tokenizer::from_dir(&dir.0), Err(Error::ModelLoad(m)) if m.contains("no tokenizer.json")));

    tiny("gpt2", |w| w).unwrap().inner().save(dir.path("tokenizer.json"), false).unwrap();
    std::fs::write(dir.path("generation_config.json"), r#"{"eos_token_id": "two"}"#).unwrap();
    assert!(
        matches!(Tokenizer::from_dir(&dir.0), Err(Error::ModelLoad(m)) if m.contains("generation_config.json") && m.contains("eos_token_id"))
    );
    std::fs::write(dir.path("generation_config.json"), "{not json").unwrap();
    assert!(matches!(Tokenizer::from_dir(&dir.0), Err(Error::ModelLoad(m)) if m.contains("not valid JSON")));
    std::fs::remove_file(dir.path("generation_config.json")).unwrap();

    // A special token the vocabulary lacks is ignored, with a warning.
    std::fs::write(dir.path("tokenizer_config.json"), r#"{"eos_token": "<|no_such_token|>"}"#).unwrap();
    let loaded = Tokenizer::from_dir(&dir.0).unwrap();
    assert!(loaded.eos_token_ids().is_empty());
    assert!(loaded.warnings()[0].contains("eos_token \"<|no_such_token|>\""), "{:?}", loaded.warnings());
    std::fs::write(dir.path("tokenizer_config.json"), r#"{"chat_template": "{% if %}"}"#).unwrap();
    assert!(matches!(Tokenizer::from_dir(&dir.0), Err(Error::Tokenizer(m)) if m.contains("invalid chat template")));
}

/// A Llama-2-style tokenizer.json: sentencepiece BPE with byte fallback, a decoder that strips the
/// leading space of the whole text, and BOS added by the post-processor.
fn write_sentencepiece_style_tokenizer(path: &std::path::Path) {
    let mut vocab = serde_json::Map::new();
    for (i, token) in ["<unk>", "<s>", "</s>"].iter().enumerate() {
        vocab.insert(token.to_string(), i.into());
    }
    for byte in 0..=255u32 {
        vocab.insert(format!("<0x{byte:02X}>"), (3 + byte).into());
    }
    let merges = ["h e", "l l", "he ll", "hell o", "▁ hello", "▁ w", "o r", "▁w or", "l d", "▁wor ld"];
    let mut pieces: Vec<String> = ["▁", "h", "e", "l", "o", "w", "r", "d"].iter().map(|s| s.to_string()).collect();
    pieces.extend(merges.iter().map(|m| m.replace(' ', "")));
    for piece in pieces {
        let id = vocab.len();
        vocab.insert(piece, id.into());
    }
    let special = |id: u32, content: &str| {
        serde_json::json!({"id": id, "content": content, "single_word": false, "lstrip": false, "rstrip": false,
                           "normalized": false, "special": true})
    };
    let json = serde_json::json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [special(0, "<unk>"), special(1, "<s>"), special(2, "</s>")],
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "▁"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}
        ]},
        "pre_tokenizer": null,
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}
        },
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}
        ]},
        "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>", "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
                  "vocab": vocab, "merges": merges}
    });
    std::fs::write(path, json.to_string()).unwrap();
}

#[test]
fn sentencepiece_style_tokenizer_json_streams_like_decode() {
    let dir = TempDir::new("vocab-spm");
    write_sentencepiece_style_tokenizer(&dir.path("tokenizer.json"));
    std::fs::write(dir.path("tokenizer_config.json"), r#"{"bos_token": "<s>", "eos_token": "</s>"}"#).unwrap();
    let t = Tokenizer::from_dir(&dir.0).unwrap();
    assert_eq!(t.bos_token_id(), Some(1));
    assert_eq!(t.eos_token_ids(), [2]);

    // tokenizer.json's post-processor adds BOS; 中 falls back to its three UTF-8 bytes.
    let encoded = t.encode("hello world 中", true).unwrap();
    let e4 = t.token_to_id("<0xE4>").unwrap();
    assert_eq!(
        encoded,
        [&[1][..], &ids(&t, &["▁hello", "▁world", "▁"]), &[e4, e4 - 0xE4 + 0xB8, e4 - 0xE4 + 0xAD]].concat()
    );
    assert_eq!(t.decode(&encoded, true).unwrap(), "hello world 中");

    // The decoder strips the leading space of the text, not of each chunk.
    let mut decoder = StreamDecoder::new(&t, true);
    let chunks: Vec<Option<String>> = encoded.iter().map(|&id| decoder.step(id).unwrap()).collect();
    let expected = [None, Some("hello"), Some(" world"), Some(" "), None, None, Some("中")];
    assert_eq!(chunks, expected.map(|c| c.map(String::from)));
    // A byte that is valid alone, then one that makes the byte run invalid: ByteFallback turns
    // the whole run into U+FFFD, rewriting the text already streamed. The stream goes on.
    let invalid_run = [t.token_to_id("<0x0B>").unwrap(), e4, t.token_to_id("▁hello").unwrap()];
    let (streamed, full) = check_stream(&t, &invalid_run, false);
    assert_eq!(full, "\u{FFFD}\u{FFFD} hello");
    assert_eq!(streamed, "\u{b}\u{FFFD} hello");
    for seed in 1..=300 {
        check_stream(&t, &random_ids(seed, 1 + seed as usize % 12, t.vocab_size() as u32), false);
        check_stream(&t, &random_ids(seed, 1 + seed as usize % 12, t.vocab_size() as u32), true);
    }
}
