//! The real SmolLM2-135M-Instruct GGUF against transformers (tests/fixtures/smollm2_tokenizer.json):
//! header, encode/decode, chat templates, BOS/EOS, streaming decode, and the tokenizer.json path.
//! Skips (loudly) without the model unless WEFT_REQUIRE_DEFAULT_MODEL=1.

mod tokenizer_support;

use tokenizer_support::{check_stream_exact, random_ids, TempDir};
use weft::gguf::GgufHeader;
use weft::tokenizer::{ChatMessage, Tokenizer};

fn load() -> Option<(GgufHeader, Tokenizer)> {
    let path = tokenizer_support::smollm2_gguf()?;
    let header = GgufHeader::read(&path).unwrap();
    let tokenizer = Tokenizer::from_gguf(&header).unwrap();
    Some((header, tokenizer))
}

fn ids_of(json: &serde_json::Value) -> Vec<u32> {
    json.as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect()
}

/// Every id sequence in the fixture: the plain encodings and the chat encodings.
fn fixture_id_sequences(fixture: &serde_json::Value) -> Vec<Vec<u32>> {
    let encodings = fixture["encodings"].as_array().unwrap().iter().map(|e| ids_of(&e["ids"]));
    let chats = fixture["chats"].as_array().unwrap().iter().map(|c| ids_of(&c["ids"]));
    encodings.chain(chats).collect()
}

#[test]
fn header_describes_the_model() {
    let Some((header, _)) = load() else { return };
    assert_eq!(header.version, 3);
    assert_eq!(header.architecture(), Some("llama"));
    assert_eq!(header.get_u64("llama.context_length"), Some(8192));
    assert_eq!(header.get_u64("llama.block_count"), Some(30));
    assert_eq!(header.get_f64("llama.rope.freq_base"), Some(100000.0));
    assert_eq!(header.get_str("tokenizer.ggml.pre"), Some("smollm"));
    assert_eq!(header.get_str_array("tokenizer.ggml.tokens").unwrap().len(), 49152);
    assert_eq!(header.tensors.len(), 272);
    let embedding = header.tensors.iter().find(|t| t.name == "token_embd.weight").unwrap();
    assert_eq!(embedding.dims, [576, 49152]);
    assert_eq!(embedding.type_name(), "Q8_0");
    assert!(header.tensors.iter().any(|t| t.type_name() == "Q4_1"));
    assert_eq!(header.data_offset % 32, 0);
    header.check_supported_tensor_types().unwrap();
}

#[test]
fn special_tokens_match_transformers() {
    let Some((_, tokenizer)) = load() else { return };
    let special = &tokenizer_support::fixture()["special"];
    assert_eq!(tokenizer.vocab_size() as u64, special["vocab_size"].as_u64().unwrap());
    assert_eq!(tokenizer.bos_token_id().map(u64::from), special["bos_token_id"].as_u64());
    assert_eq!(tokenizer.eos_token_ids(), [special["eos_token_id"].as_u64().unwrap() as u32]);
    assert_eq!(tokenizer.id_to_token(2).as_deref(), special["eos_token"].as_str());
    assert!(tokenizer.warnings().is_empty(), "{:?}", tokenizer.warnings());
    // add_bos_token is false in this file: nothing is added.
    assert_eq!(tokenizer.encode("Hello", true).unwrap(), tokenizer.encode("Hello", false).unwrap());
}

#[test]
fn encode_and_decode_match_transformers() {
    let Some((_, tokenizer)) = load() else { return };
    let fixture = tokenizer_support::fixture();
    let encodings = fixture["encodings"].as_array().unwrap();
    assert!(encodings.len() >= 20);
    let mut mismatches = Vec::new();
    for case in encodings {
        let text = case["text"].as_str().unwrap();
        let expected = ids_of(&case["ids"]);
        let ids = tokenizer.encode(text, false).unwrap();
        if ids != expected {
            mismatches.push(format!("{text:?}\n  ours: {ids:?}\n  HF:   {expected:?}"));
        }
        assert_eq!(tokenizer.decode(&expected, false).unwrap(), case["decoded"].as_str().unwrap(), "{text:?}");
    }
    assert!(mismatches.is_empty(), "encodings differ from transformers:\n{}", mismatches.join("\n"));
}

#[test]
fn chat_template_matches_transformers() {
    let Some((_, tokenizer)) = load() else { return };
    let fixture = tokenizer_support::fixture();
    for chat in fixture["chats"].as_array().unwrap() {
        let messages: Vec<ChatMessage> = serde_json::from_value(chat["messages"].clone()).unwrap();
        let add_generation_prompt = chat["add_generation_prompt"].as_bool().unwrap();
        let template = tokenizer.chat_template().unwrap();
        assert_eq!(template.render(&messages, add_generation_prompt).unwrap(), chat["text"].as_str().unwrap());
        assert_eq!(tokenizer.apply_chat_template(&messages, add_generation_prompt).unwrap(), ids_of(&chat["ids"]));
    }
}

#[test]
fn stream_decoding_concatenates_to_the_full_decode() {
    let Some((_, tokenizer)) = load() else { return };
    let fixture = tokenizer_support::fixture();
    for ids in fixture_id_sequences(&fixture) {
        check_stream_exact(&tokenizer, &ids, false);
        check_stream_exact(&tokenizer, &ids, true);
    }
}

#[test]
fn stream_decoding_random_ids() {
    let Some((_, tokenizer)) = load() else { return };
    for seed in 1..=200 {
        let ids = random_ids(seed, 1 + seed as usize % 24, tokenizer.vocab_size() as u32);
        check_stream_exact(&tokenizer, &ids, false);
        check_stream_exact(&tokenizer, &ids, true);
    }
}

#[test]
fn stream_decoding_holds_back_split_characters() {
    let Some((_, tokenizer)) = load() else { return };
    let text = "😀 中文测试 👨‍👩‍👧‍👦";
    let ids = tokenizer.encode(text, false).unwrap();
    assert!(ids.len() > text.chars().count(), "some characters must span several tokens");
    let mut decoder = tokenizer.stream_decoder();
    let mut held_back = 0;
    let mut streamed = String::new();
    for &id in &ids {
        match decoder.step(id).unwrap() {
            Some(chunk) => streamed += &chunk,
            None => held_back += 1,
        }
    }
    assert!(held_back > 0);
    assert_eq!(decoder.flush().unwrap(), "");
    assert_eq!(streamed, text);
}

#[test]
fn stream_decoding_an_invalid_byte_sequence() {
    let Some((_, tokenizer)) = load() else { return };
    // The first byte token of "😀" twice, then "a": the lone lead bytes become U+FFFD, as in decode.
    let emoji = tokenizer.encode("😀", false).unwrap();
    let ids = [emoji[0], emoji[0], tokenizer.encode("a", false).unwrap()[0]];
    let full = tokenizer.decode(&ids, false).unwrap();
    assert!(full.contains('\u{FFFD}') && full.ends_with('a'));
    check_stream_exact(&tokenizer, &ids, false);
    check_stream_exact(&tokenizer, &ids[..2], false);
}

#[test]
fn saved_tokenizer_json_loads_through_from_dir() {
    let Some((header, tokenizer)) = load() else { return };
    let dir = TempDir::new("smollm2-dir");
    tokenizer.inner().save(dir.path("tokenizer.json"), false).unwrap();
    std::fs::write(
        dir.path("tokenizer_config.json"),
        serde_json::json!({
            "bos_token": "<|im_start|>",
            "eos_token": "<|im_end|>",
            "chat_template": header.get_str("tokenizer.chat_template").unwrap(),
        })
        .to_string(),
    )
    .unwrap();
    std::fs::write(dir.path("generation_config.json"), r#"{"eos_token_id": [2, 0]}"#).unwrap();
    let loaded = Tokenizer::from_dir(&dir.0).unwrap();
    assert_eq!(loaded.eos_token_ids(), [2, 0]);
    assert_eq!(loaded.bos_token_id(), Some(1));

    let fixture = tokenizer_support::fixture();
    for case in fixture["encodings"].as_array().unwrap() {
        assert_eq!(loaded.encode(case["text"].as_str().unwrap(), true).unwrap(), ids_of(&case["ids"]));
    }
    for chat in fixture["chats"].as_array().unwrap() {
        let messages: Vec<ChatMessage> = serde_json::from_value(chat["messages"].clone()).unwrap();
        let add_generation_prompt = chat["add_generation_prompt"].as_bool().unwrap();
        assert_eq!(loaded.apply_chat_template(&messages, add_generation_prompt).unwrap(), ids_of(&chat["ids"]));
    }
}
