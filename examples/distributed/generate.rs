//! One rank of a tensor- or pipeline-parallel greedy generation: started once per rank by
//! `mlx.launch` (or anything that sets MLX's variables the same way), it joins the group, loads
//! its shard (or its stage's layers) of the model and generates; rank 0 prints the result as one
//! JSON line.
//!
//! ```sh
//! cargo build --release -p weft-core --example distributed_generate
//! .venv/bin/mlx.launch --backend ring -n 2 target/release/examples/distributed_generate \
//!     goldens/models/llama-fp32 --prompt 1,2,3 --max-tokens 16
//! ```
//!
//! Flags: `--prompt IDS` (comma-separated token ids, required), `--pipeline` (pipeline instead
//! of tensor parallel), `--max-tokens N` (default 16),
//! `--prefill-step N` (default 2048), `--logits N` (first-step logits to print, default 0).
//! The backend is `WEFT_DISTRIBUTED_BACKEND` (default `ring`). docs/distributed.md has more.

use std::path::PathBuf;
use std::process::ExitCode;

use weft::generate::{generate, GenerateOptions};
use weft::loading::LoadOptions;
use weft::nn::Parallel;

struct Args {
    model: PathBuf,
    prompt: Vec<u32>,
    max_tokens: usize,
    prefill_step: usize,
    logits: usize,
    pipeline: bool,
}

fn parse() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let mut model = None;
    let (mut prompt, mut max_tokens, mut prefill_step, mut logits, mut pipeline) = (None, 16, 2048, 0, false);
    while let Some(a) = it.next() {
        let mut value = |flag: &str| it.next().ok_or_else(|| format!("{flag} needs a value"));
        let number = |flag: &str, v: String| v.parse::<usize>().map_err(|_| format!("{flag}: {v:?} is not a count"));
        match a.as_str() {
            "--prompt" => {
                let v = value("--prompt")?;
                let ids: Result<Vec<u32>, _> = v.split(',').map(|t| t.trim().parse::<u32>()).collect();
                prompt = Some(ids.map_err(|_| format!("--prompt: {v:?} is not a comma-separated list of token ids"))?);
            }
            "--max-tokens" => max_tokens = number("--max-tokens", value("--max-tokens")?)?,
            "--prefill-step" => prefill_step = number("--prefill-step", value("--prefill-step")?)?,
            "--logits" => logits = number("--logits", value("--logits")?)?,
            "--pipeline" => pipeline = true,
            flag if flag.starts_with("--") => return Err(format!("unknown flag {flag}")),
            path if model.is_none() => model = Some(PathBuf::from(path)),
            extra => return Err(format!("unexpected argument {extra:?}")),
        }
    }
    Ok(Args {
        model: model.ok_or("usage: distributed_generate MODEL_DIR --prompt IDS [--pipeline] [--max-tokens N] [--prefill-step N] [--logits N]")?,
        prompt: prompt.ok_or("--prompt is required")?,
        max_tokens,
        prefill_step,
        logits,
        pipeline,
    })
}

fn run(args: Args) -> weft::Result<()> {
    let group = weft::env::distributed_group()?;
    let parallel = if args.pipeline { Parallel::Pipeline(group.clone()) } else { Parallel::Tensor(group.clone()) };
    let loaded = weft::loading::load_with(&args.model, &LoadOptions { parallel: Some(parallel), ..weft::env::load_options(None, None, None)? })?;
    let opts = GenerateOptions {
        max_tokens: args.max_tokens,
        prefill_step_size: args.prefill_step,
        capture_first_logits: args.logits,
        ..GenerateOptions::default()
    };
    let out = generate(loaded.model.as_ref(), None, &args.prompt, &opts, |_| true)?;
    if group.rank() == 0 {
        let line = serde_json::json!({
            "world_size": group.size(),
            "mode": if args.pipeline { "pipeline" } else { "tensor" },
            "tokens": out.tokens,
            "first_logits": out.first_logits,
        });
        println!("{line}");
    }
    Ok(())
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("distributed_generate: {e}");
            return ExitCode::from(2);
        }
    };
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("distributed_generate: {e}");
            ExitCode::FAILURE
        }
    }
}
