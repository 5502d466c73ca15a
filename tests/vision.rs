//! Gemma 3 vision against mlx-vlm 0.7.10 on mlx 0.32.4 (goldens/gemma3_vision.json and
//! goldens/vision/gemma3.safetensors, made by goldens/make_vision_goldens.py): pixel values
//! of the reference processor, tower + projector features, first-step logits and greedy
//! tokens of image prompts through the engine, alone and batched with text rows (image rows
//! joining a running batch), prompt-cache keys per image, and the errors of bad image input.
//! Pan-and-scan against the reference processor and mlx-vlm (goldens/gemma3_pan_and_scan.json,
//! goldens/vision/gemma3_pas.safetensors, made by goldens/make_vision_pan_and_scan_goldens.py).

mod support;
// Image helpers; a module of its own because not every crate that uses support has MLX.
#[path = "support/vision.rs"]
mod vision_support;

use std::collections::HashMap;

use mlx_rs::Array;
use serde_json::Value;
use vision_support::*;
use support::*;
use weft::engine::{Engine, EngineConfig, Request};
use weft::loading::LoadedModel;
use weft::vision::preprocess;

const MODEL: &str = "gemma3-vision";

fn load() -> LoadedModel {
    support::load_exact(&tiny_model_dir(MODEL)).unwrap()
}

fn tensors() -> HashMap<String, Array> {
    Array::load_safetensors(goldens_dir().join("vision").join("gemma3.safetensors")).unwrap()
}

#[test]
fn pixel_values_equal_the_reference_processor() {
    let loaded = load();
    let spec = loaded.model.vision().expect("a vision tower").spec().clone();
    assert_eq!((spec.processor.height, spec.processor.width, spec.tokens_per_image), (32, 32, 4));
    let t = tensors();
    // a: 61x45 RGB downscaled; b: 24x20 upscaled; c: RGBA composited onto white.
    for name in ["a", "b", "c"] {
        let got = spec.processor.process(&image_bytes(name)).unwrap();
        let want = hwc(&values(&t[&format!("pixels/{name}")]), 32, 32);
        assert_eq!(bit_diffs(&got, &want), 0, "image {name}: pixel values differ from Gemma3ImageProcessor");
    }
    // The resize is Pillow's antialiased one (support widened by the scale), not a plain
    // 2-tap bilinear (which gives 50 / 125 here); values from PIL 13.0.0.
    let img = preprocess::Rgb8 { width: 4, height: 1, data: vec![0, 0, 0, 100, 100, 100, 200, 200, 200, 50, 50, 50] };
    assert_eq!(preprocess::resize(&img, 2, 1, preprocess::Resample::Bilinear).data, vec![71, 71, 71, 121, 121, 121]);
}

#[test]
fn tower_features_equal_mlx_vlm() {
    let loaded = load();
    let tower = loaded.model.vision().unwrap();
    let t = tensors();
    for name in ["a", "b", "c"] {
        let px = Array::from_slice(&hwc(&values(&t[&format!("pixels/{name}")]), 32, 32), &[1, 32, 32, 3]);
        let got = values(&tower.encode(&px).unwrap());
        // The soft tokens are the features / sqrt(hidden_size 64) = / 8 (exact in f32).
        let want: Vec<f32> = values(&t[&format!("features/{name}")]).iter().map(|v| v / 8.0).collect();
        assert_eq!(got.len(), 4 * 64);
        assert_eq!(bit_diffs(&got, &want), 0, "image {name}: tower features differ");
    }
}

#[test]
fn image_prompts_alone_match_mlx_vlm_tokens_and_first_logits() {
    let g = golden("gemma3_vision");
    let t = tensors();
    for step in [2048usize, 5] {
        let engine = Engine::start(load(), EngineConfig { prefill_step_size: step, ..Default::default() }).unwrap();
        for c in g["cases"].as_array().unwrap() {
            if c["prefill_step_size"].as_u64().unwrap() as usize != step && step != 2048 {
                continue;
            }
            let name = c["name"].as_str().unwrap();
            let mut r = request(c, 20);
            r.capture_first_logits = 512;
            let out = collect(&engine.submit_channel(r).unwrap().1);
            assert_eq!(out.error, None, "{name}");
            assert_eq!(out.tokens, ids(&c["tokens"]), "{name} (prefill step {step})");
            if let Some(want) = t.get(&format!("first_logits/{name}")) {
                let d = bit_diffs(&out.first_logits, &values(want));
                assert_eq!(d, 0, "{name}: first-step logits differ in {d} of 512");
            }
        }
    }
}

#[test]
fn a_text_prompt_with_the_image_marker_is_expanded_as_the_processor_does() {
    // goldens/models/gemma3-vision/tokenizer.json: "<start_of_image>" becomes
    // "\n\n<start_of_image>" + "<image_soft_token>" x 4 + "<end_of_image>\n\n", then tokenized.
    let g = golden("gemma3_vision");
    let t = &g["text_prompt"];
    let want = case(&g, t["equals_case"].as_str().unwrap());
    let engine = Engine::start(load(), EngineConfig::default()).unwrap();
    let mut r = request(want, 20);
    r.input = weft::engine::Input::Prompt(t["text"].as_str().unwrap().to_string());
    let out = collect(&engine.submit_channel(r).unwrap().1);
    assert_eq!(out.error, None);
    assert_eq!(out.usage.prompt_tokens, want["prompt_ids"].as_array().unwrap().len());
    assert_eq!(out.tokens, ids(&want["tokens"]));
    // A marker count that differs from the images is refused.
    let mut r = request(want, 4);
    r.input = weft::engine::Input::Prompt("t2 t5".into());
    let e = engine.submit_channel(r).err().expect("refused").to_string();
    assert!(e.contains("0 image marker(s)"), "{e}");
}

#[test]
fn image_and_text_rows_batch_together_and_join_a_running_batch() {
    let g = golden("gemma3_vision");
    let names = ["image_a", "text", "image_b", "two_images", "image_c"];
    for step in [2048usize, 5] {
        // All at once: they prefill together in right-padded chunks.
        let engine = Engine::start(load(), EngineConfig { prefill_step_size: step, ..Default::default() }).unwrap();
        let rxs: Vec<_> = names.iter().map(|n| engine.submit_channel(request(case(&g, n), 20)).unwrap().1).collect();
        for (n, rx) in names.iter().zip(&rxs) {
            let out = collect(rx);
            assert_eq!(out.finals, 1);
            assert_eq!(out.tokens, ids(&case(&g, n)["tokens"]), "{n} batched (prefill step {step})");
        }
        // Image rows joining while a text row decodes (and the reverse).
        let text = engine.submit_channel(request(case(&g, "text"), 20)).unwrap().1;
        let first = text.recv().unwrap();
        let image = engine.submit_channel(request(case(&g, "image_a"), 20)).unwrap().1;
        let late_text = engine.submit_channel(request(case(&g, "text"), 12)).unwrap().1;
        assert_eq!(collect_after(&[first], &text).tokens, ids(&case(&g, "text")["tokens"]));
        assert_eq!(collect(&image).tokens, ids(&case(&g, "image_a")["tokens"]), "joining image row");
        assert_eq!(collect(&late_text).tokens, ids(&case(&g, "text")["tokens"])[..12]);
    }
}

#[test]
fn two_images_never_share_a_prompt_cache_entry() {
    // A one-token request leaves KV for exactly its prompt; the prompt plus that token then
    // finds it as an exact prefix by token ids (rings past the window of 8 are only reused
    // whole). With another image at the same ids it must not.
    let g = golden("gemma3_vision");
    let cached = Engine::start(load(), EngineConfig { prompt_cache_bytes: 64 << 20, ..Default::default() }).unwrap();
    let cold = Engine::start(load(), EngineConfig::default()).unwrap();
    let (a, b) = (case(&g, "image_a"), case(&g, "image_b"));
    assert_eq!(a["prompt_ids"], b["prompt_ids"], "same ids, different images");
    let prompt = ids(&a["prompt_ids"]);
    let image_at = prompt.iter().position(|&t| t == 511).unwrap();
    let want = ids(&a["tokens"]);
    let run = |engine: &Engine, r: Request| collect(&engine.submit_channel(r).unwrap().1);
    assert_eq!(run(&cached, request(a, 1)).tokens, want[..1]);
    let continued = |c: &Value| {
        let mut r = request(c, 8);
        r.input = weft::engine::Input::Tokens([prompt.clone(), want[..1].to_vec()].concat());
        r
    };
    let other = run(&cached, continued(b));
    assert!(other.usage.cached_tokens <= image_at, "image b reused {} tokens of image a's KV", other.usage.cached_tokens);
    assert_eq!(other.tokens, run(&cold, continued(b)).tokens, "image b's continuation as computed cold");
    let same = run(&cached, continued(a));
    assert_eq!(same.usage.cached_tokens, prompt.len(), "the same image at the same place is reused");
    assert_eq!(same.tokens, want[1..9]);
    // The same ids as a text prompt (placeholder ids, no image) reuse nothing past the image.
    let text = run(&cached, greedy([prompt.clone(), want[..1].to_vec()].concat(), 4));
    assert!(text.usage.cached_tokens <= image_at);
}

#[test]
fn bad_image_input_is_a_clear_error() {
    let g = golden("gemma3_vision");
    let c = case(&g, "image_a");
    let err = |engine: &Engine, r: Request| engine.submit_channel(r).err().expect("refused").to_string();
    // A text-only model given an image (the gemma3 text checkpoint and the multimodal form
    // whose vision tower was stripped).
    for dir in ["gemma3-text", "gemma3-wrapped"] {
        let engine = Engine::start(support::load_exact(&tiny_model_dir(dir)).unwrap(), EngineConfig::default()).unwrap();
        assert!(engine.vision().is_none());
        let e = err(&engine, request(c, 4));
        assert!(e.contains("no vision tower"), "{dir}: {e}");
    }
    let engine = Engine::start(load(), EngineConfig::default()).unwrap();
    let mut r = request(c, 4);
    r.images.push(image_bytes("b"));
    assert!(err(&engine, r).contains("placeholders for 1 image(s) but 2 were given"));
    let mut r = request(c, 4);
    r.images = vec![b"GIF89a not an image".to_vec()];
    assert!(err(&engine, r).contains("images[0]"));
    let mut r = request(c, 4);
    r.images = vec![image_bytes("a")[..200].to_vec()];
    assert!(err(&engine, r).contains("cannot decode"));
    let mut r = request(c, 4);
    r.images = vec![image_bytes("a"); 9];
    r.input = weft::engine::Input::Tokens([vec![2], vec![511; 36], vec![5]].concat());
    assert!(err(&engine, r).contains("at most 8"));
    // The engine still serves after refusals.
    assert_eq!(collect(&engine.submit_channel(request(c, 20)).unwrap().1).tokens, ids(&c["tokens"]));
}

const PAS_MODEL: &str = "gemma3-vision-pas";

fn pas_tensors() -> HashMap<String, Array> {
    Array::load_safetensors(goldens_dir().join("vision").join("gemma3_pas.safetensors")).unwrap()
}

/// The request's prompt and views after admission's preparation (images attached).
fn prepared(loaded: &LoadedModel, r: Request) -> weft::engine::Submission {
    let sink = Box::new(|_: &weft::engine::Event| true);
    weft::engine::Preparer::new(loaded, EngineConfig::default()).submission(1, r, sink).unwrap()
}

#[test]
fn pan_and_scan_views_and_prompt_ids_equal_the_reference_processor() {
    // preprocessor_config.json turns it on, as for transformers' AutoImageProcessor.
    let loaded = support::load_exact(&tiny_model_dir(PAS_MODEL)).unwrap();
    let spec = loaded.model.vision().unwrap().spec().clone();
    let want_pas = preprocess::PanAndScan { min_crop_size: 16, max_num_crops: 4, min_ratio_to_activate: 1.2 };
    assert_eq!(spec.processor.pan_and_scan, Some(want_pas));
    let plain = load();
    assert_eq!(plain.model.vision().unwrap().spec().processor.pan_and_scan, None, "off without the config");
    let g = golden("gemma3_pan_and_scan");
    let t = pas_tensors();
    let mut crops_seen = Vec::new();
    // a 61x45 (2 crops, the second narrower), b 24x20 (crops too small: none), c 40x40 (square:
    // none), e 100x20 (4 crops, max_num_crops), f 20x70 (tall: 4 crops, the last shorter).
    for (name, im) in g["images"].as_object().unwrap() {
        let crops = im["crops"].as_u64().unwrap() as usize;
        crops_seen.push(crops);
        let want_px = values(&t[&format!("pixels/{name}")]);
        let mut r = Request::new(weft::engine::Input::Prompt(im["text"].as_str().unwrap().into()));
        r.images = vec![image_bytes(name)];
        let sub = prepared(&loaded, r.clone());
        assert_eq!(sub.prompt, ids(&im["prompt_ids"]), "{name}: expanded prompt ids");
        assert_eq!(sub.images.len(), 1 + crops, "{name}: views");
        for (v, view) in sub.images.iter().enumerate() {
            let chw = &want_px[v * 3 * 32 * 32..(v + 1) * 3 * 32 * 32];
            // Crops like 31x45 -> 32x32 take Pillow 13's vertical-first pass order.
            assert_eq!(bit_diffs(&view.pixels, &hwc(chw, 32, 32)), 0, "{name} view {v}: pixel values");
            assert_eq!(view.tokens, 4);
        }
        // Off (the plain checkpoint; the processor's per-call override): one view, the plain
        // expansion (the two tokenizers differ only in the crop sentence's words).
        let off = prepared(&plain, r);
        assert_eq!((off.prompt, off.images.len()), (ids(&im["prompt_ids_off"]), 1), "{name}: off");
        let views = spec.processor.process_views(&image_bytes(name), Some(false)).unwrap();
        assert_eq!(views.len(), 1);
        assert_eq!(views[0].data, sub.images[0].pixels, "{name}: the original view");
    }
    assert_eq!(crops_seen, [2, 0, 0, 4, 4]);
}

#[test]
fn pan_and_scan_prompts_match_mlx_vlm_tokens_alone_and_batched() {
    let g = golden("gemma3_pan_and_scan");
    let engine = Engine::start(support::load_exact(&tiny_model_dir(PAS_MODEL)).unwrap(), EngineConfig::default()).unwrap();
    let prompt_request = |c: &Value| {
        let im = &g["images"][c["image"].as_str().unwrap()];
        let mut r = greedy(Vec::new(), 12);
        r.input = weft::engine::Input::Prompt(im["text"].as_str().unwrap().into());
        r.images = vec![image_bytes(c["image"].as_str().unwrap())];
        r
    };
    let cases = g["cases"].as_array().unwrap();
    for c in cases {
        let out = collect(&engine.submit_channel(prompt_request(c)).unwrap().1);
        assert_eq!(out.error, None);
        assert_eq!(out.tokens, ids(&c["tokens"]), "{} alone", c["name"]);
    }
    // Together (views of different images in one prefill), with a text row.
    let text = engine.submit_channel(greedy(vec![2, 17, 93, 44, 301, 12, 77], 12)).unwrap().1;
    let rxs: Vec<_> = cases.iter().map(|c| engine.submit_channel(prompt_request(c)).unwrap().1).collect();
    for (c, rx) in cases.iter().zip(&rxs) {
        assert_eq!(collect(rx).tokens, ids(&c["tokens"]), "{} batched", c["name"]);
    }
    assert_eq!(collect(&text).finals, 1);
}

/// A PNG signature and IHDR chunk claiming `width x height` RGB8, and a scrap of image data.
fn png_header(width: u32, height: u32) -> Vec<u8> {
    fn crc32(bytes: &[u8]) -> u32 {
        let mut c = 0xffff_ffffu32;
        for &b in bytes {
            c ^= b as u32;
            for _ in 0..8 {
                c = if c & 1 != 0 { 0xedb8_8320 ^ (c >> 1) } else { c >> 1 };
            }
        }
        !c
    }
    let mut ihdr = width.to_be_bytes().to_vec();
    ihdr.extend_from_slice(&height.to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
    let mut v = b"\x89PNG\r\n\x1a\n".to_vec();
    // IHDR, then the start of an IDAT (the decoder reads the header up to the first IDAT).
    for (name, body) in [(&b"IHDR"[..], ihdr), (&b"IDAT"[..], vec![0x78, 0x9c, 0, 0])] {
        let chunk = [name, &body[..]].concat();
        v.extend_from_slice(&(body.len() as u32).to_be_bytes());
        v.extend_from_slice(&chunk);
        v.extend_from_slice(&crc32(&chunk).to_be_bytes());
    }
    v
}

/// issue 27: an image's size is checked from its header before any pixel buffer is allocated:
/// a 49-byte PNG claiming 20000 x 20000 (1.2 GB of RGB) or a 100000-pixel side is an invalid
/// request naming the limits, at once.
#[test]
fn image_sizes_are_checked_from_the_header() {
    for (w, h) in [(20_000, 20_000), (100_000, 1), (1, 40_000), (0, 5)] {
        let t = std::time::Instant::now();
        let e = preprocess::decode(&png_header(w, h)).expect_err("refused").to_string();
        assert!(t.elapsed().as_millis() < 200, "{w}x{h}: {:?}", t.elapsed());
        assert!(e.starts_with("invalid request: image:"), "{w}x{h}: {e}");
        if w > 0 {
            assert!(e.contains("32768") && e.contains(&weft::limits::MAX_PIXELS.to_string()), "{w}x{h}: {e}");
        }
    }
}
