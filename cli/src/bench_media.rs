//! `weft bench --image FILE` / `--audio FILE`: the towers' cost and what a multimodal request
//! costs a busy batch. Per run: the tower time of the image (preprocessing apart) and of the
//! clip (decode + resample + log-mel apart, reported per second of audio); then `--media-rows`
//! text rows are started and, once each has its first token, a request with the media joins
//! them and, after its first token, a text request of the same prompt length joins the same
//! batch (the order alternates per run). TTFT is from submission to the first token. Medians
//! of `--runs` runs after one warm-up.

use std::sync::mpsc::Receiver;
use std::time::Instant;

use mlx_rs::Array;
use serde_json::json;
use weft::engine::{Engine, EngineConfig, Event, Input, Request};
use weft::sampling::SamplingParams;
use weft::{Error, Result};

use crate::bench::{random_prompts, BenchArgs};
use crate::common::resolve_model_path;

#[derive(Default, Clone, Copy)]
struct Run {
    image_prep_ms: f64,
    image_tower_ms: f64,
    audio_prep_ms: f64,
    audio_tower_ms: f64,
    media_ttft_ms: f64,
    text_ttft_ms: f64,
}

fn greedy(input: Input, max_tokens: usize) -> Request {
    Request { max_tokens, ignore_eos: true, sampling: SamplingParams::greedy(), ..Request::new(input) }
}

/// Milliseconds from now until `rx`'s first token (an error event is an error).
fn first_token(rx: &Receiver<Event>, since: Instant) -> Result<f64> {
    loop {
        match rx.recv().map_err(|_| Error::Mlx("the engine dropped a request".into()))? {
            Event::Token { .. } => return Ok(since.elapsed().as_secs_f64() * 1000.0),
            Event::Started { .. } => {}
            Event::Error { message } => return Err(Error::Mlx(message)),
            Event::Done { .. } => return Err(Error::Mlx("a request ended before its first token".into())),
        }
    }
}

fn drain(rx: &Receiver<Event>) -> Result<usize> {
    for ev in rx.iter() {
        match ev {
            Event::Done { usage, .. } => return Ok(usage.prompt_tokens),
            Event::Started { .. } => {}
            Event::Error { message } => return Err(Error::Mlx(message)),
            Event::Token { .. } => {}
        }
    }
    Err(Error::Mlx("the engine dropped a request".into()))
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(|a, b| a.total_cmp(b));
    xs[xs.len() / 2]
}

pub fn run(args: BenchArgs, opts: &crate::options::Options) -> Result<()> {
    let read = |p: &Option<std::path::PathBuf>| -> Result<Option<Vec<u8>>> {
        p.as_ref().map(|p| std::fs::read(p).map_err(|e| Error::io(p, e))).transpose()
    };
    let (image, audio) = (read(&args.image)?, read(&args.audio)?);
    let source = resolve_model_path(args.model.model.as_deref())?;
    let loaded = weft::loading::load_with(&source, &opts.load)?;
    let model = loaded.model.as_ref();
    let vision = match &image {
        Some(_) => Some(model.vision().ok_or_else(|| Error::InvalidRequest("--image: this model has no vision tower".into()))?),
        None => None,
    };
    let tower = match &audio {
        Some(_) => Some(model.audio().ok_or_else(|| Error::InvalidRequest("--audio: this model has no audio tower".into()))?),
        None => None,
    };
    let runs = args.runs.max(1);
    let mut measured = vec![Run::default(); runs + 1];
    let (mut views, mut clip_seconds, mut image_tokens, mut audio_tokens) = (0, 0.0, 0, 0);
    // Towers first, on this thread, before the engine owns the model (run 0 is the warm-up).
    for r in measured.iter_mut() {
        if let (Some(bytes), Some(v)) = (&image, vision) {
            let t = Instant::now();
            let px = v.spec().processor.process_views(bytes, None)?;
            let (h, w) = (px[0].height, px[0].width);
            let data: Vec<f32> = px.iter().flat_map(|p| p.data.iter().copied()).collect();
            let arr = Array::from_slice(&data, &[px.len() as i32, h as i32, w as i32, 3]);
            r.image_prep_ms = t.elapsed().as_secs_f64() * 1000.0;
            let t = Instant::now();
            v.encode(&arr)?.eval()?;
            r.image_tower_ms = t.elapsed().as_secs_f64() * 1000.0;
            views = px.len();
            image_tokens = v.spec().tokens_for(h, w);
        }
        if let (Some(bytes), Some(a)) = (&audio, tower) {
            let t = Instant::now();
            let samples = weft::audio::load_clip(bytes, None)?;
            let mel = a.spec().frontend.features(&samples)?;
            r.audio_prep_ms = t.elapsed().as_secs_f64() * 1000.0;
            let n = a.spec().tokens.soft_token_count(samples.len(), weft::audio::SAMPLE_RATE);
            let t = Instant::now();
            a.encode(&mel, n)?.eval()?;
            r.audio_tower_ms = t.elapsed().as_secs_f64() * 1000.0;
            clip_seconds = samples.len() as f64 / weft::audio::SAMPLE_RATE as f64;
            audio_tokens = n;
        }
    }
    // The media prompt: random text around each view's placeholder run and the clip's audio
    // token (special ids in the random text are replaced, so the placeholders are the only ones).
    let vocab = model.info().vocab_size as u64;
    let mut special: Vec<u32> = Vec::new();
    let image_spec = vision.map(|v| v.spec().clone());
    let audio_ids = tower.map(|a| a.spec().tokens);
    if let Some(s) = &image_spec {
        special.extend([Some(s.image_token_id), s.begin_token_id, s.end_token_id, s.zeroed_token_id].into_iter().flatten());
    }
    if let Some(t) = &audio_ids {
        special.extend([t.audio_token_id, t.boa_token_id, t.eoa_token_id]);
    }
    let clean = |p: Vec<u32>| -> Vec<u32> {
        p.into_iter().map(|t| if special.contains(&t) { (0..vocab as u32).find(|c| !special.contains(c)).unwrap_or(t) } else { t }).collect()
    };
    let half = args.prompt_len.max(2) / 2;
    let mut media_prompt = clean(random_prompts(args.seed + 1, 1, half, vocab).remove(0));
    if let Some(s) = &image_spec {
        for _ in 0..views {
            media_prompt.extend(s.begin_token_id);
            media_prompt.extend(std::iter::repeat_n(s.image_token_id, image_tokens));
            media_prompt.extend(s.end_token_id);
        }
    }
    if let Some(t) = &audio_ids {
        media_prompt.push(t.audio_token_id);
    }
    media_prompt.extend(clean(random_prompts(args.seed + 2, 1, half, vocab).remove(0)));
    let media_request = || {
        let mut r = greedy(Input::Tokens(media_prompt.clone()), 2);
        r.images = image.iter().cloned().collect();
        r.audio = audio.iter().cloned().collect();
        r
    };

    let busy = args.media_rows;
    let engine = Engine::start(
        loaded,
        opts.engine_config(args.kv.apply(EngineConfig {
            max_batch: busy + 2,
            prompt_concurrency: busy + 2,
            prefill_step_size: args.prefill_step_size.max(1),
            ..EngineConfig::default()
        }))?,
    )?;
    // The media prompt's length once expanded (audio): the text request's length.
    let (_, rx) = engine.submit_channel(media_request())?;
    let expanded = drain(&rx)?;
    let text_prompt = clean(random_prompts(args.seed + 3, 1, expanded, vocab).remove(0));
    for (k, r) in measured.iter_mut().enumerate() {
        let rows: Vec<_> = random_prompts(args.seed + 10 + k as u64, busy, args.prompt_len.max(1), vocab)
            .into_iter()
            .map(|p| engine.submit_channel(greedy(Input::Tokens(clean(p)), args.gen.max(8))).map(|(_, rx)| rx))
            .collect::<Result<_>>()?;
        for rx in &rows {
            first_token(rx, Instant::now())?;
        }
        let join = |media: bool| -> Result<f64> {
            let req = if media { media_request() } else { greedy(Input::Tokens(text_prompt.clone()), 2) };
            let t = Instant::now();
            let (_, rx) = engine.submit_channel(req)?;
            let ms = first_token(&rx, t)?;
            drain(&rx)?;
            Ok(ms)
        };
        if k % 2 == 0 {
            r.media_ttft_ms = join(true)?;
            r.text_ttft_ms = join(false)?;
        } else {
            r.text_ttft_ms = join(false)?;
            r.media_ttft_ms = join(true)?;
        }
        for rx in &rows {
            drain(rx)?;
        }
    }
    let m = &measured[1..];
    let pick = |f: fn(&Run) -> f64| median(m.iter().map(f).collect());
    let (media_ttft, text_ttft) = (pick(|r| r.media_ttft_ms), pick(|r| r.text_ttft_ms));
    let per_audio_s = if clip_seconds > 0.0 { pick(|r| r.audio_tower_ms) / clip_seconds } else { 0.0 };
    let out = json!({
        "model": source.display().to_string(), "runs": runs, "busy_rows": busy, "prompt_len": args.prompt_len,
        "gen": args.gen, "media_prompt_tokens": expanded,
        "image": args.image.as_ref().map(|p| json!({"file": p.display().to_string(), "views": views,
            "soft_tokens_per_view": image_tokens, "prep_ms": pick(|r| r.image_prep_ms),
            "tower_ms": pick(|r| r.image_tower_ms)})),
        "audio": args.audio.as_ref().map(|p| json!({"file": p.display().to_string(), "seconds": clip_seconds,
            "soft_tokens": audio_tokens, "prep_ms": pick(|r| r.audio_prep_ms), "tower_ms": pick(|r| r.audio_tower_ms),
            "tower_ms_per_audio_second": per_audio_s})),
        "join_busy_batch": {"media_ttft_ms": media_ttft, "text_ttft_ms": text_ttft, "ratio": media_ttft / text_ttft},
    });
    if args.json {
        println!("{out}");
    } else {
        println!("model: {}  runs: {runs} (medians)  busy text rows: {busy} (prompt {} + gen {})", source.display(), args.prompt_len, args.gen);
        if let Some(v) = out.get("image").filter(|v| !v.is_null()) {
            println!("image: {} view(s) x {} soft tokens  preprocess {:.2} ms  tower {:.2} ms", views, image_tokens,
                     v["prep_ms"].as_f64().unwrap_or(0.0), v["tower_ms"].as_f64().unwrap_or(0.0));
        }
        if let Some(v) = out.get("audio").filter(|v| !v.is_null()) {
            println!("audio: {clip_seconds:.2} s, {audio_tokens} soft tokens  decode+mel {:.2} ms  tower {:.2} ms ({per_audio_s:.2} ms per audio second)",
                     v["prep_ms"].as_f64().unwrap_or(0.0), v["tower_ms"].as_f64().unwrap_or(0.0));
        }
        println!("joining the busy batch ({expanded} prompt tokens): media TTFT {media_ttft:.2} ms  text TTFT {text_ttft:.2} ms  ratio {:.2}",
                 media_ttft / text_ttft);
    }
    Ok(())
}
