//! Gemma 4 vision against mlx-vlm 0.7.10 on mlx 0.32.4 (goldens/gemma4_vision.json and
//! goldens/vision/gemma4.safetensors, made by goldens/make_gemma4_vision_goldens.py): the
//! processor's pixel values and soft-token counts, the tower + embedder's soft tokens, and
//! greedy tokens / first-step logits of image prompts (bidirectional image spans) through the
//! engine, alone, chunked, and batched with text rows. Images and audio in one request on the
//! tiny Gemma 4 with both towers (goldens/gemma4_vision_audio.json, made by
//! goldens/make_gemma4_vision_audio_goldens.py): token prompts and a chat request, causal
//! throughout as mlx-vlm runs a prompt with both.

mod support;
// Image helpers; a module of its own because not every crate that uses support has MLX.
#[path = "support/vision.rs"]
mod vision_support;

use std::collections::HashMap;

use mlx_rs::Array;
use serde_json::Value;
use vision_support::*;
use support::*;
use weft::engine::{Engine, EngineConfig, Input, Request};
use weft::loading::LoadedModel;
use weft::tokenizer::ChatMessage;

const MODEL: &str = "gemma4-vision";

fn load() -> LoadedModel {
    support::load_exact(&tiny_model_dir(MODEL)).unwrap()
}

fn tensors() -> HashMap<String, Array> {
    Array::load_safetensors(goldens_dir().join("vision").join("gemma4.safetensors")).unwrap()
}

fn golden_pixels(t: &HashMap<String, Array>, name: &str) -> (Vec<f32>, usize, usize) {
    let a = &t[&format!("pixels/{name}")];
    let (h, w) = (a.dim(1) as usize, a.dim(2) as usize);
    (hwc(&values(a), h, w), h, w)
}

#[test]
fn pixel_values_and_soft_token_counts_equal_the_reference_processor() {
    let g = golden("gemma4_vision");
    let loaded = load();
    let spec = loaded.model.vision().expect("a vision tower").spec().clone();
    let t = tensors();
    // a: 61x45 downscaled, b: 24x20 upscaled, c: RGBA (alpha dropped), d: 32x32 (no resize).
    for name in ["a", "b", "c", "d"] {
        let got = spec.processor.process_sized(&image_bytes(name)).unwrap();
        let (want, h, w) = golden_pixels(&t, name);
        assert_eq!((got.height, got.width), (h, w), "image {name}: resize target");
        assert_eq!(bit_diffs(&got.data, &want), 0, "image {name}: pixel values differ from Gemma4ImageProcessor");
        let n = g["images"][name]["soft_tokens"].as_u64().unwrap() as usize;
        assert_eq!(spec.tokens_for(h, w), n, "image {name}: soft tokens");
    }
}

#[test]
fn soft_tokens_equal_mlx_vlm_bit_for_bit() {
    let loaded = load();
    let tower = loaded.model.vision().unwrap();
    let t = tensors();
    for name in ["a", "b", "c", "d"] {
        let (px, h, w) = golden_pixels(&t, name);
        let got = values(&tower.encode(&Array::from_slice(&px, &[1, h as i32, w as i32, 3])).unwrap());
        let want = values(&t[&format!("soft/{name}")]);
        assert_eq!(got.len(), want.len(), "image {name}");
        assert_eq!(bit_diffs(&got, &want), 0, "image {name}: soft tokens differ");
    }
    // Two images of one size in one batch: each equals its single run.
    let ((a, h, w), (b, _, _)) = (golden_pixels(&t, "a"), golden_pixels(&t, "b"));
    let both = tower.encode(&Array::from_slice(&[a, b].concat(), &[2, h as i32, w as i32, 3])).unwrap();
    let want = [values(&t["soft/a"]), values(&t["soft/b"])].concat();
    assert_eq!(bit_diffs(&values(&both), &want), 0, "batched soft tokens");
}

#[test]
fn image_prompts_alone_match_mlx_vlm_tokens_and_first_logits() {
    let g = golden("gemma4_vision");
    let t = tensors();
    let engine = Engine::start(load(), EngineConfig::default()).unwrap();
    for c in g["cases"].as_array().unwrap() {
        let name = c["name"].as_str().unwrap();
        let mut r = request(c, 20);
        r.capture_first_logits = 256;
        let out = collect(&engine.submit_channel(r).unwrap().1);
        assert_eq!(out.error, None, "{name}");
        assert_eq!(out.tokens, ids(&c["tokens"]), "{name}");
        // Bit-equal to mlx-vlm's model on the engine's schedule (prompt[:-1], then the last
        // token); within 1e-4 of generate_step's one-forward prefill.
        let split = values(&t[&format!("first_logits/{name}")]);
        assert_eq!(bit_diffs(&out.first_logits, &split), 0, "{name}: first-step logits");
        let whole = values(&t[&format!("whole_logits/{name}")]);
        let max = out.first_logits.iter().zip(&whole).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(max <= 1e-4, "{name}: {max} from generate_step's logits");
    }
    // Causal attention over the image gives other tokens: the bidirectional spans matter.
    assert_ne!(ids(&g["image_a_causal_tokens"]), ids(&case(&g, "image_a")["tokens"]));
}

#[test]
fn image_and_text_rows_batch_together_chunked_and_joining() {
    let g = golden("gemma4_vision");
    let names = ["image_a", "text", "image_c", "two_images", "image_d"];
    // Prefill chunks of 5 never cut an image span (it is attended both ways).
    for step in [2048usize, 5] {
        let engine = Engine::start(load(), EngineConfig { prefill_step_size: step, ..Default::default() }).unwrap();
        let rxs: Vec<_> = names.iter().map(|n| engine.submit_channel(request(case(&g, n), 20)).unwrap().1).collect();
        for (n, rx) in names.iter().zip(&rxs) {
            let out = collect(rx);
            assert_eq!(out.error, None, "{n}");
            assert_eq!(out.tokens, ids(&case(&g, n)["tokens"]), "{n} batched (prefill step {step})");
        }
        let text = engine.submit_channel(request(case(&g, "text"), 20)).unwrap().1;
        let first = text.recv().unwrap();
        let image = engine.submit_channel(request(case(&g, "image_b"), 20)).unwrap().1;
        assert_eq!(collect_after(&[first], &text).tokens, ids(&case(&g, "text")["tokens"]));
        assert_eq!(collect(&image).tokens, ids(&case(&g, "image_b")["tokens"]), "joining image row");
    }
}

#[test]
fn a_text_prompt_expands_each_image_token_by_its_image_size() {
    let g = golden("gemma4_vision");
    let tp = &g["text_prompt"];
    let want = case(&g, tp["equals_case"].as_str().unwrap());
    let engine = Engine::start(load(), EngineConfig::default()).unwrap();
    let mut r = request(want, 20);
    r.input = Input::Prompt(tp["text"].as_str().unwrap().to_string());
    let out = collect(&engine.submit_channel(r).unwrap().1);
    assert_eq!(out.error, None);
    assert_eq!(out.usage.prompt_tokens, want["prompt_ids"].as_array().unwrap().len());
    assert_eq!(out.tokens, ids(&want["tokens"]));
    // Token ids whose image run does not fit the image's size are refused.
    let mut r = request(want, 4);
    r.images = vec![image_bytes("c")];
    let e = engine.submit_channel(r).err().expect("refused").to_string();
    assert!(e.contains("image 0 takes exactly 16 image tokens"), "{e}");
    assert_eq!(collect(&engine.submit_channel(request(want, 20)).unwrap().1).tokens, ids(&want["tokens"]));
}

#[test]
fn prompt_cache_keys_tell_images_apart_and_text_only_gemma4_refuses_images() {
    let g = golden("gemma4_vision");
    let (a, b) = (case(&g, "image_a"), case(&g, "image_b"));
    assert_eq!(a["prompt_ids"], b["prompt_ids"], "same ids (12 soft tokens each), different images");
    let prompt = ids(&a["prompt_ids"]);
    let image_at = prompt.iter().position(|&t| t == 250).unwrap();
    let want = ids(&a["tokens"]);
    let cached = Engine::start(load(), EngineConfig { prompt_cache_bytes: 64 << 20, ..Default::default() }).unwrap();
    let run = |r: Request| collect(&cached.submit_channel(r).unwrap().1);
    assert_eq!(run(request(a, 1)).tokens, want[..1]);
    let continued = |c: &Value| {
        let mut r = request(c, 6);
        r.input = Input::Tokens([prompt.clone(), want[..1].to_vec()].concat());
        r
    };
    let other = run(continued(b));
    assert!(other.usage.cached_tokens <= image_at, "image b reused {} tokens of image a's KV", other.usage.cached_tokens);
    let cold = Engine::start(load(), EngineConfig::default()).unwrap();
    assert_eq!(other.tokens, collect(&cold.submit_channel(continued(b)).unwrap().1).tokens, "image b's continuation as computed cold");
    let same = run(continued(a));
    assert_eq!(same.usage.cached_tokens, prompt.len(), "the same image at the same place is reused");
    assert_eq!(same.tokens, want[1..7]);
    // The text-only Gemma 4 model (no vision tower) refuses images clearly.
    let text_only = Engine::start(support::load_exact(&tiny_model_dir("gemma4_text")).unwrap(), EngineConfig::default()).unwrap();
    assert!(text_only.vision().is_none());
    let e = text_only.submit_channel(request(a, 4)).err().expect("refused").to_string();
    assert!(e.contains("no vision tower"), "{e}");
}

/// A case of goldens/gemma4_vision_audio.json as a request: its template ids (image span
/// expanded, one audio token), the image and the clip.
fn mixed_request(g: &Value, c: &Value, max_tokens: usize) -> Request {
    let mut r = greedy(ids(&c["prompt_template_ids"]), max_tokens);
    r.images = vec![image_bytes(g["image"].as_str().unwrap())];
    r.audio = vec![std::fs::read(goldens_dir().join(g["clip"].as_str().unwrap())).unwrap()];
    r
}

#[test]
fn images_and_audio_in_one_request_match_mlx_vlm_in_either_order() {
    let g = golden("gemma4_vision_audio");
    let cases = g["cases"].as_array().unwrap();
    for step in [2048usize, 7] {
        let engine = Engine::start(
            support::load_exact(&tiny_model_dir("gemma4-vision-audio")).unwrap(),
            EngineConfig { prefill_step_size: step, prompt_cache_bytes: 64 << 20, ..Default::default() },
        )
        .unwrap();
        for c in cases {
            let out = collect(&engine.submit_channel(mixed_request(&g, c, 16)).unwrap().1);
            assert_eq!(out.error, None);
            assert_eq!(out.usage.prompt_tokens, c["prompt_ids"].as_array().unwrap().len(), "{}", c["name"]);
            assert_eq!(out.tokens, ids(&c["tokens"]), "{} alone (prefill step {step})", c["name"]);
        }
        // Both orders and a text row in one batch; then the same image with another clip must
        // not reuse the cached KV past the audio span.
        let text = engine.submit_channel(greedy(vec![2, 17, 44, 9, 12, 77, 5], 16)).unwrap().1;
        let rxs: Vec<_> = cases.iter().map(|c| engine.submit_channel(mixed_request(&g, c, 16)).unwrap().1).collect();
        for (c, rx) in cases.iter().zip(&rxs) {
            assert_eq!(collect(rx).tokens, ids(&c["tokens"]), "{} batched (prefill step {step})", c["name"]);
        }
        assert_eq!(collect(&text).finals, 1);
        let c = &cases[0];
        let mut other = mixed_request(&g, c, 4);
        other.audio = vec![std::fs::read(goldens_dir().join("audio/tones-16k-mono.wav")).unwrap()];
        let prompt = ids(&c["prompt_template_ids"]);
        let audio_at = prompt.iter().position(|&t| t == 253).unwrap();
        let out = collect(&engine.submit_channel(other).unwrap().1);
        assert_eq!(out.error, None);
        assert!(out.usage.cached_tokens <= audio_at + 1, "another clip reused {} cached tokens", out.usage.cached_tokens);
    }
}

/// issue 27 item 9: a chat request with an image part and an audio part, as mlx-vlm's own
/// request path builds it (apply_chat_template, Gemma4Processor expanding both, generate_step
/// with the processor's mm_token_type_ids), gives mlx-vlm's prompt and tokens. The image span
/// is not attended both ways when the prompt also carries audio: mlx-vlm keeps such prompts
/// causal, and the bidirectional overlay gives other tokens.
#[test]
fn a_chat_request_with_an_image_and_a_clip_matches_mlx_vlm() {
    let g = golden("gemma4_vision_audio");
    let m = &g["messages"];
    let engine = Engine::start(
        support::load_exact(&tiny_model_dir("gemma4-vision-audio")).unwrap(),
        EngineConfig { prompt_cache_bytes: 64 << 20, ..Default::default() },
    )
    .unwrap();
    let prompt = ids(&m["prompt_ids"]);
    let image_at = prompt.iter().position(|&t| t == 250).unwrap();
    let boa_at = prompt.iter().position(|&t| t == 254).unwrap();
    // The same image and text first without the clip: that row attends the image both ways, so
    // its cached KV past the image's first token must not serve the chat request.
    let mut image_only = greedy(prompt[..boa_at].to_vec(), 1);
    image_only.images = vec![image_bytes(g["image"].as_str().unwrap())];
    assert_eq!(collect(&engine.submit_channel(image_only).unwrap().1).error, None);
    // The user turn as Weft's server writes content parts: text parts trimmed, each medium's
    // placeholder where its part stands; the template renders what mlx-vlm's renders.
    let content = "t2 t17<|image|>t44 t9 t61 t12<|audio|>";
    let template = engine.tokenizer().unwrap().chat_template().unwrap();
    let messages = vec![ChatMessage::new("user", content)];
    assert_eq!(template.render(&messages, true).unwrap(), m["rendered"].as_str().unwrap());
    let mut r = greedy(Vec::new(), 16);
    r.input = Input::Messages(messages);
    r.images = vec![image_bytes(g["image"].as_str().unwrap())];
    r.audio = vec![std::fs::read(goldens_dir().join(g["clip"].as_str().unwrap())).unwrap()];
    let out = collect(&engine.submit_channel(r).unwrap().1);
    assert_eq!(out.error, None);
    assert_eq!(out.usage.prompt_tokens, prompt.len());
    assert!(out.usage.cached_tokens <= image_at, "reused {} tokens of an image-only row's KV", out.usage.cached_tokens);
    assert_eq!(out.tokens, ids(&m["tokens"]), "chat request with an image and a clip");
    // The same ids as a token prompt (one audio token where the clip goes), for one token; then
    // continued by that token it reuses the first one's KV (same media, same causal attention).
    let want = ids(&m["tokens"]);
    let as_tokens = |extra: &[u32], max_tokens: usize| {
        let mut r = greedy(prompt[..boa_at].iter().copied().chain([253]).chain(extra.iter().copied()).collect(), max_tokens);
        r.images = vec![image_bytes(g["image"].as_str().unwrap())];
        r.audio = vec![std::fs::read(goldens_dir().join(g["clip"].as_str().unwrap())).unwrap()];
        r
    };
    assert_eq!(collect(&engine.submit_channel(as_tokens(&[], 1)).unwrap().1).tokens, want[..1], "as token ids");
    let out = collect(&engine.submit_channel(as_tokens(&want[..1], 15)).unwrap().1);
    assert_eq!(out.tokens, want[1..], "continued as token ids");
    assert_eq!(out.usage.cached_tokens, prompt.len(), "the same image and clip reuse the KV");
    // What the overlay would have given (mlx-vlm with image-only types) is another trajectory.
    let c = &g["cases"][0];
    assert_ne!(ids(&g["image_then_audio_bidirectional_tokens"]), ids(&c["tokens"]));
}
