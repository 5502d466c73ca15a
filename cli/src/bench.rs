//! `weft bench`: generation speed at several batch sizes on random prompt ids (EOS ignored),
//! through the continuous-batching engine, median of several runs. The model is loaded once
//! (weights evaluated at load) and one engine serves every run, after a warm-up run per batch
//! size, so the figures are those of a warm engine. The mlx-lm side of the comparison lives
//! in benches/ (same shapes, same run).

use std::time::Instant;

use clap::Args;
use serde_json::json;
use weft::engine::{Constraint, EngineConfig, Input, Request};
use weft::sampling::SamplingParams;
use weft::{Error, Result};

use crate::batch::Collector;
use crate::common::{resolve_model_path, KvArgs, ModelArgs};

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Batch sizes to measure, comma-separated (each is submitted all at once).
    #[arg(long, value_delimiter = ',', default_value = "1")]
    pub batch: Vec<usize>,
    /// Prompt length in tokens (random ids).
    #[arg(long, default_value_t = 32)]
    pub prompt_len: usize,
    /// Tokens to generate per request.
    #[arg(long, default_value_t = 128)]
    pub gen: usize,
    /// Measured runs per batch size (after one warm-up); medians are reported.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Prompt tokens per prefill chunk.
    #[arg(long, default_value_t = 2048)]
    pub prefill_step_size: usize,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Seed for the random prompt ids.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[command(flatten)]
    pub kv: KvArgs,
    /// Constrain this many rows of each batch (the first ones); 0 = none.
    #[arg(long, default_value_t = 0)]
    pub constrained: usize,
    /// The constraint of `--constrained` rows: `json` (a JSON array of at least 64 strings of
    /// at least 12 characters), `regex` (`[a-z ,.]+`) or `choice` (unbounded runs of "yes"/"no").
    #[arg(long, default_value = "json", value_parser = ["json", "regex", "choice"])]
    pub constraint: String,
    /// Sample this many rows of each batch (the first ones) at `--temp` / `--top-p`, each with
    /// its own seed; the rest decode greedily; 0 = all greedy.
    #[arg(long, default_value_t = 0)]
    pub sampled: usize,
    /// Temperature of `--sampled` rows.
    #[arg(long, default_value_t = 0.8)]
    pub temp: f32,
    /// Nucleus threshold of `--sampled` rows (1 = off).
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    /// Ask for log-probabilities (with 5 alternatives) on this many rows (the last ones).
    #[arg(long, default_value_t = 0)]
    pub logprobs: usize,
    /// Media mode: time the vision tower on this image (PNG / JPEG / WebP), and a request with
    /// it joining `--media-rows` decoding text rows (see `bench_media`).
    #[arg(long)]
    pub image: Option<std::path::PathBuf>,
    /// Media mode: time the audio tower on this clip (per second of audio), and a request with
    /// it joining the busy batch (with `--image` too: one request with both).
    #[arg(long)]
    pub audio: Option<std::path::PathBuf>,
    /// Media mode: text rows decoding when the media request (and the text request it is
    /// compared with) joins.
    #[arg(long, default_value_t = 4)]
    pub media_rows: usize,
    /// Prompt-lookup speculative decoding: draft up to this many tokens per step (0 = off).
    #[arg(long, default_value_t = 0)]
    pub num_draft_tokens: usize,
    /// Speculative decoding with this draft model (sharing the tokenizer; a path, store name or
    /// repo id as `--model`) instead of prompt lookup; `--num-draft-tokens` 0 means 3.
    #[arg(long)]
    pub draft_model: Option<std::path::PathBuf>,
    /// Copy-heavy prompts: each prompt is a random block of `--prompt-len / 2` ids written
    /// twice, so the model goes on copying it (the workload prompt lookup speeds up).
    #[arg(long)]
    pub copy: bool,
}

/// The sampling of row `i` of a batch: `--sampled` rows at `--temp` / `--top-p`, seeded by
/// their index; greedy otherwise.
fn bench_sampling(args: &BenchArgs, i: usize) -> SamplingParams {
    if i < args.sampled {
        SamplingParams { temperature: args.temp, top_p: args.top_p, seed: Some(i as u64), ..SamplingParams::greedy() }
    } else {
        SamplingParams::greedy()
    }
}

/// The constraint `--constraint` names. None of them completes early on its own.
fn bench_constraint(kind: &str) -> Constraint {
    match kind {
        "regex" => Constraint::Regex("[a-z ,.]+".into()),
        "choice" => Constraint::Lark("start: item+\nitem: \"yes \" | \"no \"\n".into()),
        // At least 64 strings of at least 12 characters: more than any --gen of a few hundred.
        _ => Constraint::JsonSchema(json!({"type": "array", "minItems": 64, "items": {"type": "string", "minLength": 12}})),
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct Measure {
    agg_tok_s: f64,
    decode_tok_s: f64,
    prefill_tok_s: f64,
    ttft_ms: f64,
    /// Per decode step: host graph building, waiting on MLX, host work after the tokens arrive.
    build_ms: f64,
    wait_ms: f64,
    host_ms: f64,
    /// Per decode step: constrained rows' mask computation (worker thread), and the part of it
    /// the step waited for.
    mask_ms: f64,
    mask_wait_ms: f64,
    /// Largest KV-cache footprint seen between engine iterations (storage capacity included).
    peak_kv_bytes: f64,
    /// Prefill forward passes the run took (rows arriving together share them).
    prefill_forwards: f64,
    /// Rows that ended before `gen` tokens (a constraint that completed).
    short_rows: f64,
    /// Speculative decoding: draft tokens proposed and the share accepted.
    drafted: f64,
    acceptance: f64,
    /// Tokens per row per decode step (1 without speculation).
    tokens_per_step: f64,
}

/// `--copy`'s prompts: a random block of half the length, twice (an odd length repeats one
/// more id of the block).
fn copy_prompts(seed: u64, count: usize, len: usize, vocab: u64) -> Vec<Vec<u32>> {
    random_prompts(seed, count, len.div_ceil(2), vocab)
        .into_iter()
        .map(|block| block.iter().chain(&block).copied().take(len).collect())
        .collect()
}

/// The same xorshift stream benches/ scripts use, so both sides see identical prompts.
pub fn random_prompts(seed: u64, count: usize, len: usize, vocab: u64) -> Vec<Vec<u32>> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..count)
        .map(|_| {
            (0..len)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    (state % vocab) as u32
                })
                .collect()
        })
        .collect()
}

/// Cumulative engine counters, read before and after a run.
#[derive(Clone, Copy)]
struct Counters {
    steps: u64,
    build: f64,
    wait: f64,
    host: f64,
    mask: f64,
    mask_wait: f64,
    prefill_forwards: u64,
    drafted: u64,
    accepted: u64,
}

impl Counters {
    fn read(engine: &Collector) -> Counters {
        let s = engine.core.stats();
        Counters {
            steps: s.decode_steps,
            build: s.decode_graph_build_s,
            wait: s.decode_eval_wait_s,
            host: s.decode_host_s,
            mask: s.decode_mask_compute_s,
            mask_wait: s.decode_mask_wait_s,
            prefill_forwards: s.prefill_forwards,
            drafted: s.draft_tokens,
            accepted: s.draft_tokens_accepted,
        }
    }
}

/// Submits `batch` prompts at once to the warm engine and runs them to completion.
fn run_once(engine: &mut Collector, args: &BenchArgs, batch: usize, gen: usize, vocab: u64) -> Result<Measure> {
    let before = Counters::read(engine);
    let prompts = match args.copy {
        true => copy_prompts(args.seed, batch, args.prompt_len.max(2), vocab),
        false => random_prompts(args.seed, batch, args.prompt_len.max(1), vocab),
    };
    let start = Instant::now();
    for (i, p) in prompts.into_iter().enumerate() {
        engine.submit(Request {
            input: Input::Tokens(p),
            max_tokens: gen,
            sampling: bench_sampling(args, i),
            stop: Vec::new(),
            ignore_eos: true,
            capture_first_logits: 0,
            logprobs: (i + args.logprobs >= batch).then_some(5),
            tools: None,
            constraint: (i < args.constrained).then(|| bench_constraint(&args.constraint)),
            images: Vec::new(),
            ..Request::new(Input::Tokens(Vec::new()))
        })?;
    }
    let mut peak_kv = 0u64;
    while !engine.core.is_idle() {
        engine.core.iterate();
        peak_kv = peak_kv.max(engine.core.stats().kv_bytes_in_use);
    }
    let wall = start.elapsed().as_secs_f64();
    let after = Counters::read(engine);
    let per_step = |secs: f64| secs * 1000.0 / (after.steps - before.steps).max(1) as f64;
    let rows = engine.results();
    if let Some(e) = rows.iter().find_map(|(_, r)| r.error.clone()) {
        return Err(Error::Mlx(e));
    }
    let short = rows.iter().filter(|(_, r)| r.tokens.len() < gen).count();
    let tokens: usize = rows.iter().map(|(_, r)| r.tokens.len()).sum();
    let mut ttfts: Vec<f64> = rows.iter().filter_map(|(_, r)| r.ttft_s).collect();
    ttfts.sort_by(|a, b| a.total_cmp(b));
    let last_first = *ttfts.last().unwrap_or(&wall);
    let m = Measure {
        agg_tok_s: tokens as f64 / wall,
        decode_tok_s: (tokens.saturating_sub(batch)) as f64 / (wall - last_first).max(1e-9),
        prefill_tok_s: (batch * args.prompt_len) as f64 / last_first.max(1e-9),
        ttft_ms: ttfts[ttfts.len() / 2] * 1000.0,
        build_ms: per_step(after.build - before.build),
        wait_ms: per_step(after.wait - before.wait),
        host_ms: per_step(after.host - before.host),
        mask_ms: per_step(after.mask - before.mask),
        mask_wait_ms: per_step(after.mask_wait - before.mask_wait),
        peak_kv_bytes: peak_kv as f64,
        prefill_forwards: (after.prefill_forwards - before.prefill_forwards) as f64,
        short_rows: short as f64,
        drafted: (after.drafted - before.drafted) as f64,
        acceptance: (after.accepted - before.accepted) as f64 / (after.drafted - before.drafted).max(1) as f64,
        tokens_per_step: tokens.saturating_sub(batch) as f64 / (after.steps - before.steps).max(1) as f64 / batch as f64,
    };
    Ok(m)
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(|a, b| a.total_cmp(b));
    xs[xs.len() / 2]
}

pub fn run(args: BenchArgs, opts: &crate::options::Options) -> Result<()> {
    if args.image.is_some() || args.audio.is_some() {
        return crate::bench_media::run(args, opts);
    }
    if args.batch.iter().any(|&b| b == 0) || args.gen < 2 {
        return Err(Error::InvalidRequest("--batch sizes must be >= 1 and --gen >= 2".into()));
    }
    for (flag, n) in [("--constrained", args.constrained), ("--sampled", args.sampled), ("--logprobs", args.logprobs)] {
        if args.batch.iter().any(|&b| n > b) {
            return Err(Error::InvalidRequest(format!("{flag} must not exceed any --batch size")));
        }
    }
    if args.sampled > 0 {
        SamplingParams { temperature: args.temp, top_p: args.top_p, ..SamplingParams::greedy() }
            .validate(usize::MAX)
            .map_err(|e| Error::InvalidRequest(format!("--temp / --top-p: {e}")))?;
    }
    let source = resolve_model_path(args.model.model.as_deref())?;
    let model = weft::loading::load_with(&source, &opts.load)?;
    if args.constrained > 0 {
        // The token trie is built once per loaded model; keep that out of the timed runs.
        let tokenizer = model.tokenizer.as_ref().ok_or_else(|| Error::InvalidRequest("--constrained needs a model with a tokenizer".into()))?;
        model.constraints.get_or_build(tokenizer)?;
    }
    let info = model.model.info().clone();
    let vocab = info.vocab_size as u64;
    let widest = args.batch.iter().copied().max().unwrap_or(1);
    let config = args.kv.apply(EngineConfig {
        max_batch: widest,
        prompt_concurrency: widest,
        prefill_step_size: args.prefill_step_size.max(1),
        num_draft_tokens: crate::common::draft_tokens(args.num_draft_tokens, args.draft_model.as_deref()),
        draft_model: args.draft_model.as_deref().map(|p| crate::common::resolve_model_path(Some(p))).transpose()?,
        // Every run prefills its prompts cold: the runs repeat prompts, which the (default-on)
        // prompt cache would otherwise serve.
        prompt_cache_bytes: 0,
        ..EngineConfig::default()
    });
    let mut engine = Collector::new(model, opts.engine_config(config)?)?;
    let mut results = Vec::new();
    for &b in &args.batch {
        run_once(&mut engine, &args, b, 4, vocab)?; // warm-up at this batch size
        let mut runs = Vec::new();
        for _ in 0..args.runs.max(1) {
            runs.push(run_once(&mut engine, &args, b, args.gen, vocab)?);
        }
        let pick = |f: fn(&Measure) -> f64| median(runs.iter().map(f).collect());
        results.push((
            b,
            Measure {
                agg_tok_s: pick(|m| m.agg_tok_s),
                decode_tok_s: pick(|m| m.decode_tok_s),
                prefill_tok_s: pick(|m| m.prefill_tok_s),
                ttft_ms: pick(|m| m.ttft_ms),
                build_ms: pick(|m| m.build_ms),
                wait_ms: pick(|m| m.wait_ms),
                host_ms: pick(|m| m.host_ms),
                mask_ms: pick(|m| m.mask_ms),
                mask_wait_ms: pick(|m| m.mask_wait_ms),
                peak_kv_bytes: pick(|m| m.peak_kv_bytes),
                prefill_forwards: pick(|m| m.prefill_forwards),
                short_rows: pick(|m| m.short_rows),
                drafted: pick(|m| m.drafted),
                acceptance: pick(|m| m.acceptance),
                tokens_per_step: pick(|m| m.tokens_per_step),
            },
        ));
    }
    // KV footprint per row (prompt_len + gen positions, all layers) in the chosen mode and in
    // full precision, as the engine's KV-budget admission projects it.
    let positions = args.prompt_len.max(1) + args.gen;
    let kv = args.kv.quantization();
    let row_bytes = (info.kv_bytes_per_token_with(kv.as_ref()) * positions) as f64;
    let full_row_bytes = (info.kv_bytes_per_token() * positions) as f64;
    let per_gb = |b: f64| 1e9 / b;
    if args.json {
        let rows: Vec<_> = results
            .iter()
            .map(|(b, m)| json!({"batch": b, "agg_tok_s": m.agg_tok_s, "decode_tok_s": m.decode_tok_s,
                                 "prefill_tok_s": m.prefill_tok_s, "ttft_ms": m.ttft_ms, "ttft_p50_ms": m.ttft_ms,
                                 "peak_kv_bytes": m.peak_kv_bytes, "prefill_forwards": m.prefill_forwards,
                                 "short_rows": m.short_rows, "draft_tokens": m.drafted,
                                 "draft_acceptance_rate": m.acceptance, "tokens_per_step": m.tokens_per_step,
                                 "step_ms": {"graph_build": m.build_ms, "eval_wait": m.wait_ms, "host": m.host_ms,
                                             "mask": m.mask_ms, "mask_wait": m.mask_wait_ms}}))
            .collect();
        println!(
            "{}",
            json!({"model": source.display().to_string(), "prompt_len": args.prompt_len, "gen": args.gen,
                   "runs": args.runs, "constrained": args.constrained, "constraint": args.constraint,
                   "num_draft_tokens": args.num_draft_tokens, "copy": args.copy,
                   "draft_model": args.draft_model.as_ref().map(|p| p.display().to_string()),
                   "sampled": args.sampled, "temp": args.temp, "top_p": args.top_p, "logprobs": args.logprobs,
                   "kv": {"mode": args.kv.describe(), "kv_bits": args.kv.kv_bits,
                          "kv_group_size": args.kv.kv_group_size, "quantized_kv_start": args.kv.quantized_kv_start,
                          "bytes_per_row": row_bytes, "rows_per_gb": per_gb(row_bytes),
                          "full_precision_bytes_per_row": full_row_bytes, "full_precision_rows_per_gb": per_gb(full_row_bytes)},
                   "results": rows})
        );
    } else {
        println!("model: {}  prompt_len: {}  gen: {}  runs: {} (medians)", source.display(), args.prompt_len, args.gen, args.runs);
        println!(
            "kv: {}  bytes/row: {:.0} ({:.0} rows/GB)  full precision: {:.0} bytes/row ({:.0} rows/GB)",
            args.kv.describe(),
            row_bytes,
            per_gb(row_bytes),
            full_row_bytes,
            per_gb(full_row_bytes)
        );
        if args.sampled > 0 || args.logprobs > 0 {
            println!("sampled rows: {} (temp {}, top_p {})  rows with logprobs: {}", args.sampled, args.temp, args.top_p, args.logprobs);
        }
        if args.num_draft_tokens > 0 || args.draft_model.is_some() {
            println!(
                "speculative decoding: {}, {} draft tokens{}  acceptance (median): {}  tokens/row/step: {}",
                args.draft_model.as_ref().map_or("prompt lookup".to_string(), |p| format!("draft model {}", p.display())),
                crate::common::draft_tokens(args.num_draft_tokens, args.draft_model.as_deref()),
                if args.copy { ", copy-heavy prompts" } else { "" },
                results.iter().map(|(_, m)| format!("{:.2}", m.acceptance)).collect::<Vec<_>>().join(","),
                results.iter().map(|(_, m)| format!("{:.2}", m.tokens_per_step)).collect::<Vec<_>>().join(",")
            );
        }
        if args.constrained > 0 {
            println!("constrained rows: {} ({})  rows ended early (median): {}", args.constrained, args.constraint,
                     results.iter().map(|(_, m)| m.short_rows.to_string()).collect::<Vec<_>>().join(","));
        }
        println!(
            "{:>6} {:>12} {:>14} {:>15} {:>10} {:>13} | per decode step ms: {:>6} {:>6} {:>6} {:>6} {:>9}",
            "batch", "agg tok/s", "decode tok/s", "prefill tok/s", "ttft ms", "peak KV MB", "build", "wait", "host", "mask", "mask wait"
        );
        for (b, m) in &results {
            println!(
                "{:>6} {:>12.1} {:>14.1} {:>15.1} {:>10.1} {:>13.2} | {:>25.3} {:>6.3} {:>6.3} {:>6.3} {:>9.3}",
                b, m.agg_tok_s, m.decode_tok_s, m.prefill_tok_s, m.ttft_ms, m.peak_kv_bytes / 1e6, m.build_ms, m.wait_ms, m.host_ms,
                m.mask_ms, m.mask_wait_ms
            );
        }
    }
    Ok(())
}
