//! `weft bench`: single-sequence prefill and decode speed on random prompt ids, median of runs.
//! The mlx-lm side of the comparison is benches/compare_mlx_lm.py.

use clap::Args;
use serde_json::json;
use weft::generate::{generate, GenerateOptions};
use weft::Result;

use crate::common::{load_model, ModelArgs};
use crate::generate_cmd::tokens_per_second;

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt length in tokens (random ids).
    #[arg(long, default_value_t = 32)]
    pub prompt_len: usize,
    /// Tokens to generate per run (EOS ignored).
    #[arg(long, default_value_t = 128)]
    pub gen: usize,
    /// Measured runs (after one warm-up); the median is reported.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Seed for the random prompt ids.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

pub fn run(args: BenchArgs) -> Result<()> {
    let loaded = load_model(&args.model)?;
    let model = loaded.model.as_ref();
    let vocab = model.info().vocab_size as u64;
    // A fixed xorshift stream: the same prompt for every run and for the mlx-lm script.
    let mut state = args.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let prompt: Vec<u32> = (0..args.prompt_len.max(1))
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % vocab) as u32
        })
        .collect();
    let opts = GenerateOptions { max_tokens: args.gen.max(2), ..GenerateOptions::default() };
    generate(model, None, &prompt, &GenerateOptions { max_tokens: 4, ..opts.clone() }, |_| true)?;
    let mut decode = Vec::new();
    let mut ttft = Vec::new();
    for _ in 0..args.runs.max(1) {
        let g = generate(model, None, &prompt, &opts, |_| true)?;
        decode.push(tokens_per_second(&g));
        ttft.push(g.ttft_s * 1000.0);
    }
    let (decode, ttft) = (median(&mut decode), median(&mut ttft));
    let prefill = prompt.len() as f64 / (ttft / 1000.0);
    if args.json {
        println!(
            "{}",
            json!({"results": [{"batch": 1, "prompt_len": prompt.len(), "gen": opts.max_tokens,
                   "decode_tok_s": decode, "prefill_tok_s": prefill, "ttft_ms": ttft, "runs": args.runs}]})
        );
    } else {
        println!("model: {}", loaded.source.display());
        println!("{:>6} {:>10} {:>5} {:>14} {:>15} {:>10}", "batch", "prompt_len", "gen", "decode tok/s", "prefill tok/s", "ttft ms");
        println!("{:>6} {:>10} {:>5} {:>14.1} {:>15.1} {:>10.1}", 1, prompt.len(), opts.max_tokens, decode, prefill, ttft);
    }
    Ok(())
}

fn median(xs: &mut [f64]) -> f64 {
    xs.sort_by(|a, b| a.total_cmp(b));
    xs[xs.len() / 2]
}
