//! Gemma 4 audio against mlx-vlm 0.7.10 (goldens/make_audio_goldens.py, goldens/audio.json):
//! decoding + downmix + resampling, the USM log-mel frontend, the soft-token rule and splice,
//! and the tiny random-weight Conformer tower + embedder (`goldens/models/gemma4-audio`); audio
//! requests through the engine on `goldens/models/gemma4-audio-lm` (goldens/audio_engine.json),
//! alone, chunked, batched with text rows, prompt-cache keys per clip, and bad-input errors.
//! The extractor's settings from a checkpoint's processor_config.json
//! (goldens/make_audio_extractor_goldens.py, goldens/audio/extractor.safetensors).

mod support;

use std::collections::HashMap;
use std::path::PathBuf;

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::Array;
use weft::audio::{self, AudioTokens, MelConfig, MelFrontend};
use weft::models::gemma4_audio::{Gemma4Audio, Gemma4AudioTower};

fn goldens() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../goldens")
}

fn meta() -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(goldens().join("audio.json")).unwrap()).unwrap()
}

fn golden_tensors() -> HashMap<String, Array> {
    Array::load_safetensors(goldens().join("audio/golden.safetensors")).unwrap()
}

fn to_f32(a: &Array) -> Vec<f32> {
    a.as_dtype(mlx_rs::Dtype::Float32).unwrap().as_slice::<f32>().to_vec()
}

fn clip_bytes(name: &str) -> Vec<u8> {
    std::fs::read(goldens().join(format!("audio/{name}.wav"))).unwrap()
}

const CLIPS: [&str; 3] = ["tones-16k-mono", "tones-44k-stereo", "short-16k-mono"];

/// Largest |a - b| and where.
fn max_abs_diff(a: &[f32], b: &[f32]) -> (f32, usize) {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).enumerate().fold((0f32, 0), |(m, at), (i, (x, y))| {
        let d = (x - y).abs();
        if d > m { (d, i) } else { (m, at) }
    })
}

#[test]
fn decoded_16k_waveforms_match_the_reference() {
    let g = golden_tensors();
    for name in CLIPS {
        let got = audio::load_clip(&clip_bytes(name), Some("wav")).unwrap();
        let want = to_f32(&g[&format!("{name}.waveform")]);
        assert_eq!(got.len(), want.len(), "{name}: length");
        let (d, at) = max_abs_diff(&got, &want);
        if name.contains("44k") {
            // Downmix + Kaiser polyphase resampler, float64 inside both; summation order only.
            eprintln!("{name}: resampled waveform max |diff| {d:e}");
            assert!(d < 2e-7, "{name}: resampled waveform differs by {d} at {at}");
        } else {
            // 16 kHz PCM16: no resampling, exactly s / 32768.
            assert_eq!(d, 0.0, "{name}: waveform differs by {d} at {at}");
        }
    }
}

#[test]
fn flac_decodes_to_the_same_samples_as_wav() {
    // goldens/audio/short-16k-mono.flac holds the WAV's PCM (the script checks the reference
    // decodes both alike).
    let flac = std::fs::read(goldens().join("audio/short-16k-mono.flac")).unwrap();
    let got = audio::load_clip(&flac, None).unwrap();
    let want = to_f32(&golden_tensors()["short-16k-mono.waveform"]);
    assert_eq!(got, want);
}

#[test]
fn log_mel_features_match_the_reference_extractor() {
    let g = golden_tensors();
    let frontend = MelFrontend::new(MelConfig::default()).unwrap();
    for name in CLIPS {
        // From the reference's own waveform, so this isolates the frontend.
        let wav = to_f32(&g[&format!("{name}.waveform")]);
        let f = frontend.features(&wav).unwrap();
        let want = &g[&format!("{name}.mel")];
        assert_eq!([f.frames as i32, f.bins as i32], [want.dim(0), want.dim(1)], "{name}: shape");
        let want_mask: Vec<bool> = g[&format!("{name}.mel_mask")].as_slice::<u8>().iter().map(|&m| m != 0).collect();
        assert_eq!(f.valid, want_mask, "{name}: frame mask");
        let (d, at) = max_abs_diff(&f.data, &to_f32(want));
        eprintln!("{name}: log-mel max |diff| {d:e}");
        // numpy's float32 FFT vs this float64 FFT, then log: measured max 8.6e-6 on these clips.
        assert!(d < 5e-5, "{name}: log-mel differs by {d} at frame {} bin {}", at / f.bins, at % f.bins);
    }
}

#[test]
fn extractor_settings_come_from_the_checkpoints_processor_config() {
    // gemma4-audio-lm-fe = gemma4-audio-lm + processor_config.json {"feature_extractor": {32 ms
    // frames / 16 ms hop, 125-7600 Hz, preemphasis 0.97, mel_floor 0.01, input scale 0.5}}.
    let g = golden_tensors();
    let want = Array::load_safetensors(goldens().join("audio/extractor.safetensors")).unwrap();
    let changed = support::load_exact(&goldens().join("models/gemma4-audio-lm-fe")).unwrap();
    let plain = support::load_exact(&goldens().join("models/gemma4-audio-lm")).unwrap();
    let frontend = |m: &weft::loading::LoadedModel| m.model.audio().expect("an audio tower").spec().frontend.clone();
    let (fe, default) = (frontend(&changed), frontend(&plain));
    // Gemma4Audio::load reads the directory the same way.
    let direct = Gemma4Audio::load(&goldens().join("models/gemma4-audio-lm-fe"), &exact_layers()).unwrap();
    for name in CLIPS {
        let wav = to_f32(&g[&format!("{name}.waveform")]);
        let f = fe.features(&wav).unwrap();
        let w = &want[&format!("{name}.mel")];
        assert_eq!([f.frames as i32, f.bins as i32], [w.dim(0), w.dim(1)], "{name}: shape");
        let mask: Vec<bool> = want[&format!("{name}.mel_mask")].as_slice::<u8>().iter().map(|&m| m != 0).collect();
        assert_eq!(f.valid, mask, "{name}: frame mask");
        let (d, _) = max_abs_diff(&f.data, &to_f32(w));
        assert!(d < 5e-5, "{name}: log-mel differs from the configured reference extractor by {d}");
        assert_eq!(direct.frontend.features(&wav).unwrap().data, f.data, "{name}: Gemma4Audio::load");
        // Without the config: the class defaults (the reference's default features).
        let (d, _) = max_abs_diff(&default.features(&wav).unwrap().data, &to_f32(&g[&format!("{name}.mel")]));
        assert!(d < 5e-5, "{name}: default extractor");
    }
}

#[test]
fn soft_token_counts_match_the_processor() {
    let m = meta();
    let t = AudioTokens::from_config(
        &serde_json::from_str(&std::fs::read_to_string(goldens().join("models/gemma4-audio/config.json")).unwrap()).unwrap(),
    );
    assert_eq!(t, AudioTokens::default());
    for name in CLIPS {
        let c = &m["clips"][name];
        let n = t.soft_token_count(c["samples_16k"].as_u64().unwrap() as usize, audio::SAMPLE_RATE);
        assert_eq!(n as u64, c["soft_tokens"].as_u64().unwrap(), "{name}");
    }
}

#[test]
fn bad_audio_is_a_clear_error() {
    let err = |bytes: &[u8]| audio::load_clip(bytes, None).unwrap_err().to_string();
    assert!(err(b"").contains("empty"), "{}", err(b""));
    let e = err(b"this is not audio at all, just some text bytes..........");
    assert!(e.contains("unsupported or unreadable format"), "{e}");
    // A truncated WAV header.
    let wav = clip_bytes("tones-16k-mono");
    let e = err(&wav[..20]);
    assert!(e.starts_with("invalid request: audio:"), "{e}");
    // 31 s of 8 kHz silence: over the limit.
    let long = pcm16_wav(&vec![0i16; 8000 * 31], 8000, 1);
    let e = err(&long);
    assert!(e.contains("30 s"), "{e}");
    // Too short for one frame.
    let e = MelFrontend::new(MelConfig::default()).unwrap().features(&[0.1; 100]).unwrap_err().to_string();
    assert!(e.contains("too short"), "{e}");
}

fn tower() -> Gemma4AudioTower {
    Gemma4AudioTower::load(&goldens().join("models/gemma4-audio"), &exact_layers()).unwrap()
}

#[test]
fn tower_and_embedder_match_mlx_vlm_on_the_reference_features() {
    let g = golden_tensors();
    let tower = tower();
    for name in CLIPS {
        // The reference's mel features in, so this isolates the tower.
        let mel = &g[&format!("{name}.mel")];
        let mask: Vec<bool> = g[&format!("{name}.mel_mask")].as_slice::<u8>().iter().map(|&m| m == 0).collect();
        let enc = tower.encode(&mel.expand_dims(0).unwrap(), &[mask]).unwrap();
        let want_tower = &g[&format!("{name}.tower")];
        assert_eq!(enc.tower.shape()[1..], *want_tower.shape(), "{name}: tower shape");
        let want_invalid: Vec<bool> = g[&format!("{name}.tower_mask")].as_slice::<u8>().iter().map(|&m| m != 0).collect();
        assert_eq!(enc.invalid[0], want_invalid, "{name}: tower mask");
        let (dt, _) = max_abs_diff(&to_f32(&enc.tower.index(0)), &to_f32(want_tower));
        let (de, _) = max_abs_diff(&to_f32(&enc.embeddings.index(0)), &to_f32(&g[&format!("{name}.embeddings")]));
        eprintln!("{name}: tower max |diff| {dt:e}, embeddings {de:e}");
        // Same ops as mlx-vlm in float32: bit-equal.
        assert!(dt == 0.0 && de == 0.0, "{name}: tower {dt}, embeddings {de}");
    }
}

#[test]
fn a_padded_batch_of_two_clips_matches_mlx_vlm_and_each_single_clip() {
    let g = golden_tensors();
    let tower = tower();
    let pair = ["tones-16k-mono", "short-16k-mono"];
    let frames = g[&format!("{}.mel", pair[0])].dim(0) as usize;
    // The extractor's batch: the shorter clip's frames, then masked zero frames.
    let (mut data, mut invalid) = (Vec::new(), Vec::new());
    for name in pair {
        let mel = to_f32(&g[&format!("{name}.mel")]);
        let mask: Vec<bool> = g[&format!("{name}.mel_mask")].as_slice::<u8>().iter().map(|&m| m == 0).collect();
        let own = mask.len();
        data.extend_from_slice(&mel);
        data.extend(std::iter::repeat_n(0f32, (frames - own) * 128));
        invalid.push(mask.into_iter().chain(std::iter::repeat_n(true, frames - own)).collect::<Vec<_>>());
    }
    let features = Array::from_slice(&data, &[2, frames as i32, 128]);
    let enc = tower.encode(&features, &invalid).unwrap();
    let want_mask: Vec<bool> = g["batch.tower_mask"].as_slice::<u8>().iter().map(|&m| m != 0).collect();
    assert_eq!(enc.invalid.concat(), want_mask);
    assert_eq!(to_f32(&enc.tower), to_f32(&g["batch.tower"]), "batched tower");
    assert_eq!(to_f32(&enc.embeddings), to_f32(&g["batch.embeddings"]), "batched embeddings");
    // Each row's valid frames equal that clip run alone.
    for (b, name) in pair.iter().enumerate() {
        let single = to_f32(&g[&format!("{name}.embeddings")]);
        let row = to_f32(&enc.embeddings.index(b as i32));
        assert_eq!(&row[..single.len()], &single[..], "{name}");
    }
}

#[test]
fn bfloat16_tower_matches_mlx_vlm() {
    // The released checkpoints keep the tower in bfloat16; the golden casts these weights.
    let dir = goldens().join("models/gemma4-audio");
    let tensors: HashMap<String, Array> = Array::load_safetensors(dir.join("model.safetensors"))
        .unwrap()
        .into_iter()
        .map(|(k, v)| (k, v.as_dtype(mlx_rs::Dtype::Bfloat16).unwrap()))
        .collect();
    let cfg: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    let audio_cfg = serde_json::from_value(cfg["audio_config"].clone()).unwrap();
    let mut w = weft::nn::Weights::new(tensors, None);
    let tower = Gemma4AudioTower::from_weights(&mut w, audio_cfg, 64).unwrap();
    w.finish().unwrap();
    let g = golden_tensors();
    let name = "tones-16k-mono";
    let mask: Vec<bool> = g[&format!("{name}.mel_mask")].as_slice::<u8>().iter().map(|&m| m == 0).collect();
    let enc = tower.encode(&g[&format!("{name}.mel")].expand_dims(0).unwrap(), &[mask]).unwrap();
    let (dt, _) = max_abs_diff(&to_f32(&enc.tower.index(0)), &to_f32(&g[&format!("bf16.{name}.tower")]));
    let (de, _) = max_abs_diff(&to_f32(&enc.embeddings.index(0)), &to_f32(&g[&format!("bf16.{name}.embeddings")]));
    eprintln!("bf16 {name}: tower max |diff| {dt:e}, embeddings {de:e}");
    assert!(dt == 0.0 && de == 0.0, "bf16 tower {dt}, embeddings {de}");
}

#[test]
fn audio_bytes_to_spliced_soft_tokens_end_to_end() {
    let g = golden_tensors();
    let m = meta();
    let tower = tower();
    let t = AudioTokens::default();
    let frontend = MelFrontend::new(MelConfig::default()).unwrap();
    for name in CLIPS {
        // Bytes -> 16 kHz -> mel -> tower -> embedder, all in Weft.
        let wav = audio::load_clip(&clip_bytes(name), None).unwrap();
        let soft = tower.encode_clip(&frontend.features(&wav).unwrap()).unwrap();
        let n = t.soft_token_count(wav.len(), audio::SAMPLE_RATE);
        assert_eq!(n as u64, m["clips"][name]["soft_tokens"].as_u64().unwrap());
        // The golden's prompt: [2, <|audio|>, 106] expanded, over stand-in embeddings of 1.0.
        let ids = audio::expand_audio_placeholders(&[2, t.audio_token_id, 106], &[n], &t).unwrap();
        assert_eq!(ids.len(), n + 4);
        let text = Array::ones::<f32>(&[ids.len() as i32, tower.text_hidden_size]).unwrap();
        let spliced = audio::splice_soft_tokens(&text, &ids, &[soft], &t).unwrap();
        let want = &g[&format!("{name}.spliced")];
        assert_eq!(spliced.shape(), want.shape(), "{name}");
        let (d, at) = max_abs_diff(&to_f32(&spliced), &to_f32(want));
        eprintln!("{name}: bytes -> spliced max |diff| {d:e}");
        // Only the frontend's float64 FFT differs from the reference: measured 2e-6.
        assert!(d < 1e-5, "{name}: spliced sequence differs by {d} at row {}", at / tower.text_hidden_size as usize);
    }
}

#[test]
fn the_pipeline_prepares_expands_and_splices_two_clips() {
    let g = golden_tensors();
    let audio = Gemma4Audio::load(&goldens().join("models/gemma4-audio"), &exact_layers()).unwrap();
    let t = audio.tokens;
    let names = ["tones-44k-stereo", "short-16k-mono"];
    let clips: Vec<_> = names.iter().map(|n| audio.prepare_clip(&clip_bytes(n), Some("wav")).unwrap()).collect();
    assert_eq!(clips[0].soft_tokens, 19);
    assert!((clips[0].seconds - 0.75).abs() < 1e-9);
    let ids = audio.expand_prompt(&[2, t.audio_token_id, 5, t.audio_token_id, 106], &clips).unwrap();
    assert_eq!(ids.len(), 3 + (1 + 19 + 1) + (1 + 14 + 1));
    let embeds = Array::ones::<f32>(&[ids.len() as i32, audio.tower.text_hidden_size]).unwrap();
    let out = to_f32(&audio.splice(&embeds, &ids, &clips).unwrap());
    // Each span equals that clip's single-clip golden splice (minus its framing tokens).
    let d = audio.tower.text_hidden_size as usize;
    let first = to_f32(&g["tones-44k-stereo.spliced"]);
    let second = to_f32(&g["short-16k-mono.spliced"]);
    let (a, _) = max_abs_diff(&out[2 * d..(2 + 19) * d], &first[2 * d..(2 + 19) * d]);
    let s0 = 2 + 19 + 3; // 2, boa, 19 audio, eoa, 5, boa
    let (b, _) = max_abs_diff(&out[s0 * d..(s0 + 14) * d], &second[2 * d..(2 + 14) * d]);
    assert!(a < 1e-5 && b < 1e-5, "{a} {b}");
    assert!(out[..2 * d].iter().all(|&v| v == 1.0), "text positions untouched");
    // Placeholders and clips must agree.
    assert!(audio.expand_prompt(&[2, t.audio_token_id, 106], &clips).is_err());
    // The contiguous span a seam splices equals the wrapped rows (14 tokens over 13 rows).
    let span = to_f32(&clips[1].span_embeddings().unwrap());
    assert_eq!(span.len(), 14 * d);
    assert_eq!(&span[..], &out[s0 * d..(s0 + 14) * d]);
    assert_eq!(&span[13 * d..], &span[..d], "token 14 takes row 0");
}

/// goldens/audio_lm.json: mlx-vlm's gemma4 `Model` (models/gemma4_text + this tower) on an
/// audio prompt. The text model on spliced embeddings needs the embeddings seam; until it is
/// wired, this pins the prompt Weft builds (and that the clip gives the processor's count).
#[test]
fn audio_prompt_ids_match_the_end_to_end_golden() {
    let lm: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(goldens().join("audio_lm.json")).unwrap()).unwrap();
    let mut audio = Gemma4Audio::load(&goldens().join(lm["audio_model"].as_str().unwrap()), &exact_layers()).unwrap();
    let id = |k: &str| lm[k].as_u64().unwrap() as u32;
    audio.tokens = AudioTokens { audio_token_id: id("audio_token_id"), boa_token_id: id("boa_token_id"), eoa_token_id: id("eoa_token_id"), ..audio.tokens };
    let clip = audio.prepare_clip(&std::fs::read(goldens().join(lm["clip"].as_str().unwrap())).unwrap(), None).unwrap();
    assert_eq!(clip.soft_tokens as u64, lm["soft_tokens"].as_u64().unwrap());
    let ids: Vec<u32> = serde_json::from_value(lm["prompt_template_ids"].clone()).unwrap();
    let want: Vec<u32> = serde_json::from_value(lm["prompt_ids"].clone()).unwrap();
    assert_eq!(audio.expand_prompt(&ids, &[clip]).unwrap(), want);
}

/// Greedy decoding of `ids` with one clip's soft tokens as mlx-vlm's `generate_step` runs it:
/// the prompt but its last position in one forward (soft tokens spliced), the last position
/// alone, then one token at a time. Returns the tokens and the first step's logprobs.
fn greedy_with_audio(model: &dyn weft::models::LanguageModel, ids: &[u32], col: usize, soft: &Array, steps: usize) -> (Vec<u32>, Vec<f32>) {
    use weft::language_model::{PromptMedia, SoftTokens};
    let as_i32 = |v: &[u32]| Array::from_slice(&v.iter().map(|&t| t as i32).collect::<Vec<_>>(), &[1, v.len() as i32]);
    let mut caches = model.make_caches();
    let media = PromptMedia { rows: vec![true], audio_rows: vec![true], soft: vec![SoftTokens { row: 0, col, embeddings: soft.clone() }] };
    let (head, last) = ids.split_at(ids.len() - 1);
    model.forward_with_media(&as_i32(head), &media, &mut caches).unwrap().eval().unwrap();
    let mut logits = model.forward(&as_i32(last), &mut caches).unwrap();
    let (mut tokens, mut first) = (Vec::new(), Vec::new());
    for step in 0..steps {
        let row = logits.index((0, -1));
        let lse = mlx_rs::ops::logsumexp_axis(&row, -1, true).unwrap();
        let logprobs = row.subtract(&lse).unwrap();
        let next = mlx_rs::ops::indexing::argmax_axis(&logprobs, -1, None).unwrap().item_cast::<u32>();
        if step == 0 {
            first = to_f32(&logprobs);
        }
        tokens.push(next);
        logits = model.forward(&as_i32(&[next]), &mut caches).unwrap();
    }
    (tokens, first)
}

/// End to end against goldens/audio_lm.json (mlx-vlm's gemma4 Model: models/gemma4_text +
/// this tower, `generate_step` on an audio prompt) through the embeddings seam's
/// `forward_with_media`: the reference's soft tokens give bit-equal first logprobs; the
/// clip run through Weft's own decode + frontend + tower gives the same greedy tokens.
#[test]
fn greedy_tokens_of_an_audio_prompt_match_mlx_vlm() {
    let lm: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(goldens().join("audio_lm.json")).unwrap()).unwrap();
    let loaded = support::load_exact(&goldens().join(lm["text_model"].as_str().unwrap())).unwrap();
    let ids: Vec<u32> = serde_json::from_value(lm["prompt_ids"].clone()).unwrap();
    let want: Vec<u32> = serde_json::from_value(lm["tokens"].clone()).unwrap();
    let want_first: Vec<f32> = serde_json::from_value(lm["first_logprobs"].clone()).unwrap();
    let audio_id = lm["audio_token_id"].as_u64().unwrap() as u32;
    let col = ids.iter().position(|&t| t == audio_id).unwrap();
    let n = lm["soft_tokens"].as_u64().unwrap() as i32;

    // The reference's own embedder output (19 rows for 19 tokens).
    let reference = golden_tensors()["tones-44k-stereo.embeddings"].index(..n);
    let (tokens, first) = greedy_with_audio(loaded.model.as_ref(), &ids, col, &reference, want.len());
    assert_eq!(tokens, want, "tokens from the reference's soft tokens");
    let (d, _) = max_abs_diff(&first, &want_first);
    assert_eq!(d, 0.0, "first logprobs differ by {d}");

    // All in Weft: bytes -> soft tokens -> the same tokens.
    let mut audio = Gemma4Audio::load(&goldens().join(lm["audio_model"].as_str().unwrap()), &exact_layers()).unwrap();
    audio.tokens.audio_token_id = audio_id;
    let clip = audio.prepare_clip(&std::fs::read(goldens().join(lm["clip"].as_str().unwrap())).unwrap(), None).unwrap();
    let (tokens, first) = greedy_with_audio(loaded.model.as_ref(), &ids, col, &clip.span_embeddings().unwrap(), want.len());
    assert_eq!(tokens, want, "tokens from Weft's own audio pipeline");
    let (d, _) = max_abs_diff(&first, &want_first);
    assert!(d < 1e-4, "first logprobs differ by {d}");
    eprintln!("audio prompt: Weft pipeline first logprobs max |diff| {d:e}");
}

#[test]
fn tower_rejects_features_of_the_wrong_shape() {
    let tower = tower();
    let bad = Array::zeros::<f32>(&[1, 10, 64]).unwrap();
    assert!(tower.encode(&bad, &[vec![false; 10]]).is_err());
    let ok_shape = Array::zeros::<f32>(&[1, 10, 128]).unwrap();
    assert!(tower.encode(&ok_shape, &[vec![false; 9]]).is_err());
    let e = Gemma4AudioTower::load(&goldens().join("models/gemma3-text"), &exact_layers()).err().unwrap().to_string();
    assert!(e.contains("audio_config"), "{e}");
}

/// A PCM16 WAV file (for inputs the goldens do not need to carry).
fn pcm16_wav(samples: &[i16], rate: u32, channels: u16) -> Vec<u8> {
    let data_len = (samples.len() * 2) as u32;
    let mut v = Vec::with_capacity(44 + data_len as usize);
    v.extend_from_slice(b"RIFF");
    v.extend_from_slice(&(36 + data_len).to_le_bytes());
    v.extend_from_slice(b"WAVEfmt ");
    v.extend_from_slice(&16u32.to_le_bytes());
    v.extend_from_slice(&1u16.to_le_bytes());
    v.extend_from_slice(&channels.to_le_bytes());
    v.extend_from_slice(&rate.to_le_bytes());
    v.extend_from_slice(&(rate * channels as u32 * 2).to_le_bytes());
    v.extend_from_slice(&(channels * 2).to_le_bytes());
    v.extend_from_slice(&16u16.to_le_bytes());
    v.extend_from_slice(b"data");
    v.extend_from_slice(&data_len.to_le_bytes());
    for s in samples {
        v.extend_from_slice(&s.to_le_bytes());
    }
    v
}

// ---- audio requests through the engine (goldens/audio_engine.json) ----

fn engine_golden() -> serde_json::Value {
    support::golden("audio_engine")
}

fn engine_case<'a>(g: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    g["cases"].as_array().unwrap().iter().find(|c| c["name"] == name).unwrap_or_else(|| panic!("no case {name}"))
}

/// The layer options of the towers loaded on their own: exact mode (MLX's kernels), as the
/// goldens were made.
fn exact_layers() -> weft::nn::LayerOptions {
    weft::nn::LayerOptions::new(weft::kernels::CpuKernels::Exact, None, None, None).unwrap()
}

fn lm() -> weft::loading::LoadedModel {
    support::load_exact(&goldens().join(engine_golden()["model"].as_str().unwrap())).unwrap()
}

/// The caller's form: one audio token per clip (the engine expands it).
fn audio_request(c: &serde_json::Value, max_tokens: usize) -> weft::engine::Request {
    let mut r = support::greedy(support::ids(&c["prompt_template_ids"]), max_tokens);
    if let Some(clip) = c["clip"].as_str() {
        r.audio = vec![std::fs::read(goldens().join(clip)).unwrap()];
    }
    r
}

const ENGINE_CASES: [&str; 4] = ["tones-44k-stereo", "tones-16k-mono", "short-16k-mono", "text"];

#[test]
fn audio_prompts_through_the_engine_match_mlx_vlm() {
    use weft::engine::{Engine, EngineConfig};
    let g = engine_golden();
    // Step 5 cuts the soft-token spans across prefill chunks.
    for step in [2048usize, 5] {
        let engine = Engine::start(lm(), EngineConfig { prefill_step_size: step, ..Default::default() }).unwrap();
        assert_eq!(engine.audio().map(|a| a.tokens.audio_token_id), Some(250));
        for name in ENGINE_CASES {
            let c = engine_case(&g, name);
            let out = support::collect(&engine.submit_channel(audio_request(c, 16)).unwrap().1);
            assert_eq!(out.error, None, "{name}");
            assert_eq!(out.usage.prompt_tokens, c["prompt_ids"].as_array().unwrap().len(), "{name}: expanded prompt");
            assert_eq!(out.tokens, support::ids(&c["tokens"]), "{name} (prefill step {step})");
        }
    }
    // A text prompt with the audio token, tokenized then expanded as the processor does.
    let engine = Engine::start(lm(), EngineConfig::default()).unwrap();
    let c = engine_case(&g, "tones-44k-stereo");
    let mut r = audio_request(c, 16);
    r.input = weft::engine::Input::Prompt(g["text_prompt"].as_str().unwrap().into());
    assert_eq!(support::collect(&engine.submit_channel(r).unwrap().1).tokens, support::ids(&c["tokens"]));
}

#[test]
fn audio_and_text_rows_batch_together_and_join_a_running_batch() {
    use weft::engine::{Engine, EngineConfig};
    let g = engine_golden();
    let want = |n: &str| support::ids(&engine_case(&g, n)["tokens"]);
    for step in [2048usize, 7] {
        let engine = Engine::start(lm(), EngineConfig { prefill_step_size: step, ..Default::default() }).unwrap();
        let rxs: Vec<_> = ENGINE_CASES.iter().map(|n| engine.submit_channel(audio_request(engine_case(&g, n), 16)).unwrap().1).collect();
        for (n, rx) in ENGINE_CASES.iter().zip(&rxs) {
            let out = support::collect(rx);
            assert_eq!(out.finals, 1);
            assert_eq!(out.tokens, want(n), "{n} batched (prefill step {step})");
        }
        // An audio row joining while a text row decodes; a text row joining the audio row;
        // the first leaves before the others finish.
        let text = engine.submit_channel(audio_request(engine_case(&g, "text"), 6)).unwrap().1;
        let first = text.recv().unwrap();
        let audio = engine.submit_channel(audio_request(engine_case(&g, "tones-16k-mono"), 16)).unwrap().1;
        let late = engine.submit_channel(audio_request(engine_case(&g, "short-16k-mono"), 16)).unwrap().1;
        assert_eq!(support::collect_after(&[first], &text).tokens, want("text")[..6]);
        assert_eq!(support::collect(&audio).tokens, want("tones-16k-mono"), "joining audio row");
        assert_eq!(support::collect(&late).tokens, want("short-16k-mono"), "second joining audio row");
    }
}

#[test]
fn two_clips_never_share_a_prompt_cache_entry() {
    use weft::engine::{Engine, EngineConfig, Input};
    let g = engine_golden();
    let cached = Engine::start(lm(), EngineConfig { prompt_cache_bytes: 64 << 20, ..Default::default() }).unwrap();
    let (a, b) = (engine_case(&g, "tones-44k-stereo"), engine_case(&g, "tones-16k-mono"));
    let run = |r: weft::engine::Request| support::collect(&cached.submit_channel(r).unwrap().1);
    let want_a = support::ids(&a["tokens"]);
    assert_eq!(run(audio_request(a, 1)).tokens, want_a[..1]);
    // The same template ids with another clip (of another length) and with this clip again.
    let continued = |c: &serde_json::Value, clip: &serde_json::Value| {
        let mut r = audio_request(clip, 8);
        r.input = Input::Tokens([support::ids(&c["prompt_template_ids"]), want_a[..1].to_vec()].concat());
        r
    };
    let same = run(continued(a, a));
    assert_eq!(same.usage.cached_tokens, a["prompt_ids"].as_array().unwrap().len(), "the same clip is reused");
    assert_eq!(same.tokens, want_a[1..9]);
    // short-16k-mono: 14 soft tokens like no other; feed it where tones-44k-stereo (19) was.
    let other = run(continued(a, b));
    assert!(other.usage.cached_tokens <= 3, "another clip reused {} tokens of the first clip's KV", other.usage.cached_tokens);
    let cold = Engine::start(lm(), EngineConfig::default()).unwrap();
    assert_eq!(other.tokens, support::collect(&cold.submit_channel(continued(a, b)).unwrap().1).tokens);
}

#[test]
fn bad_audio_requests_are_clear_errors() {
    use weft::engine::{Engine, EngineConfig};
    let g = engine_golden();
    let c = engine_case(&g, "tones-44k-stereo");
    let err = |engine: &Engine, r: weft::engine::Request| engine.submit_channel(r).err().expect("refused").to_string();
    // A model without an audio tower.
    let text_only = Engine::start(support::load_exact(&goldens().join("models/gemma4_text")).unwrap(), EngineConfig::default()).unwrap();
    assert!(text_only.audio().is_none());
    let e = err(&text_only, audio_request(c, 4));
    assert!(e.contains("no audio tower"), "{e}");
    let engine = Engine::start(lm(), EngineConfig::default()).unwrap();
    let mut r = audio_request(c, 4);
    r.audio.push(r.audio[0].clone());
    let e = err(&engine, r);
    assert!(e.contains("1 audio token(s)") && e.contains("2 clip(s)"), "{e}");
    let mut r = audio_request(c, 4);
    r.audio = vec![b"GIF89a: not audio at all, whatever the caller says it is".to_vec()];
    let e = err(&engine, r);
    assert!(e.starts_with("invalid request: audio[0]:") && e.contains("unsupported or unreadable format"), "{e}");
    let mut r = audio_request(c, 4);
    r.audio = vec![pcm16_wav(&vec![0i16; 8000 * 31], 8000, 1)];
    let e = err(&engine, r);
    assert!(e.contains("audio[0]") && e.contains("30 s"), "{e}");
    let mut r = audio_request(c, 4);
    r.audio = vec![r.audio[0].clone(); 9];
    r.input = weft::engine::Input::Tokens([vec![2], vec![250; 9], vec![11]].concat());
    let e = err(&engine, r);
    assert!(e.contains("at most 8"), "{e}");
    // The engine still serves after refusals.
    assert_eq!(support::collect(&engine.submit_channel(audio_request(c, 16)).unwrap().1).tokens, support::ids(&c["tokens"]));
}

/// A PCM16 mono WAV whose header claims `rate` Hz (any u32: the byte rate wraps as a crafted
/// file's would), holding `samples` samples of a ramp.
fn crafted_wav(rate: u32, samples: usize) -> Vec<u8> {
    let data: Vec<i16> = (0..samples).map(|i| (i % 2000) as i16 * 8).collect();
    let mut v = pcm16_wav(&data, 8000, 1);
    v[24..28].copy_from_slice(&rate.to_le_bytes());
    v[28..32].copy_from_slice(&rate.wrapping_mul(2).to_le_bytes());
    v
}

/// issue 27: sizes derived from media headers are bounded before anything is allocated from
/// them. A 592-byte WAV claiming 4 294 967 295 Hz made the resampler allocate ~880 GB (the
/// process aborted); 1 MHz and 4 MHz clips took 13 s / 1 GB and 56 s / 3.9 GB; a 0 Hz header
/// panicked inside symphonia. Each is now an invalid request, at once.
#[test]
fn absurd_sample_rates_are_refused_before_any_allocation() {
    let wav = crafted_wav(u32::MAX, 274);
    assert_eq!(wav.len(), 592);
    for (rate, samples) in [(u32::MAX, 274), (1_000_000, 500_000), (4_000_000, 2_000_000), (0, 274), (999, 274), (384_001, 274)] {
        let bytes = crafted_wav(rate, samples);
        let t = std::time::Instant::now();
        let e = audio::load_clip(&bytes, None).expect_err("refused").to_string();
        assert!(t.elapsed().as_millis() < 500, "{rate} Hz took {:?}", t.elapsed());
        assert!(e.starts_with("invalid request: audio:") && e.contains(&format!("sample rate is {rate} Hz")), "{rate} Hz: {e}");
        assert!(e.contains("1000..=384000 Hz"), "{e}");
    }
    // The bounds themselves, and every standard rate, decode.
    for rate in [1_000, 8_000, 11_025, 22_050, 44_100, 48_000, 88_200, 96_000, 176_400, 192_000, 352_800, 384_000] {
        let got = audio::load_clip(&crafted_wav(rate, rate as usize / 10), None).unwrap_or_else(|e| panic!("{rate} Hz: {e}"));
        assert_eq!(got.len(), 1600, "{rate} Hz: 0.1 s at 16 kHz");
    }
    // A rate in range whose ratio to 16 kHz needs an oversized filter.
    let e = audio::load_clip(&crafted_wav(383_999, 1000), None).unwrap_err().to_string();
    assert!(e.contains("bounded filter"), "{e}");
    // Other header fields symphonia would divide by or allocate from.
    let mut zero_channels = crafted_wav(16_000, 100);
    zero_channels[22..24].copy_from_slice(&0u16.to_le_bytes());
    assert!(audio::load_clip(&zero_channels, None).unwrap_err().to_string().contains("0 channels"));
    let mut zero_block = crafted_wav(16_000, 100);
    zero_block[32..34].copy_from_slice(&0u16.to_le_bytes());
    assert!(audio::load_clip(&zero_block, None).unwrap_err().to_string().contains("block size 0"));
    let mut adpcm = crafted_wav(16_000, 100);
    adpcm[20..22].copy_from_slice(&2u16.to_le_bytes());
    assert!(audio::load_clip(&adpcm, None).unwrap_err().to_string().contains("format tag 0x0002"));
    // A LIST chunk claiming 4 GB in a short file (symphonia would allocate it up front).
    let mut list = crafted_wav(16_000, 100);
    let data = list.split_off(36);
    list.extend_from_slice(b"LIST");
    list.extend_from_slice(&u32::MAX.to_le_bytes());
    list.extend_from_slice(b"INFO");
    list.extend_from_slice(&data);
    let e = audio::load_clip(&list, None).unwrap_err().to_string();
    assert!(e.contains("\"LIST\" claims 4294967295 bytes"), "{e}");
}

/// issue 27: a clip too short for the tower's mel frames is an invalid request at submit (it
/// was a failed row, "1 mel frames", a 500 on HTTP); one just long enough runs.
#[test]
fn clips_too_short_for_the_tower_are_refused_at_submit() {
    use weft::engine::{Engine, EngineConfig};
    let g = engine_golden();
    let c = engine_case(&g, "tones-44k-stereo");
    let engine = Engine::start(lm(), EngineConfig::default()).unwrap();
    let spec = engine.audio().unwrap().clone();
    let min = spec.frontend.min_samples(audio::MIN_MEL_FRAMES);
    assert_eq!(min, 385, "docs/server.md and docs/c-api.md state 385 samples");
    assert_eq!(spec.frontend.frames_for(min), audio::MIN_MEL_FRAMES);
    assert!(spec.frontend.frames_for(min - 1) < audio::MIN_MEL_FRAMES);
    let mut r = audio_request(c, 4);
    r.audio = vec![pcm16_wav(&vec![100i16; 200], 16_000, 1)];
    let e = engine.submit_channel(r).err().expect("refused").to_string();
    assert!(e.starts_with("invalid request: audio[0]: the clip is too short: 200 samples"), "{e}");
    assert!(e.contains(&format!("at least {min} samples")), "{e}");
    let mut r = audio_request(c, 4);
    r.audio = vec![pcm16_wav(&vec![100i16; min], 16_000, 1)];
    let out = support::collect(&engine.submit_channel(r).unwrap().1);
    assert_eq!((out.error, out.tokens.len()), (None, 4), "a clip of {min} samples");
}
