//! `weft`: run models from the command line.
//!
//! Subcommands: `generate` (a completion, or several `--prompt-ids` rows through the batching
//! engine; `--json` parity output), `chat` (interactive), `run` (answer a prompt, or chat when
//! none is given), `replay` (a join/leave schedule), `bench` (speed at several batch sizes),
//! `serve` (the OpenAI/Anthropic-compatible HTTP server), `pull` (fetch the default model),
//! `models` / `ls` (known and installed models).
//! Every failure prints `error: ...` and exits non-zero; no panics.

mod batch;
mod bench;
mod bench_media;
mod chat;
mod common;
mod gdn_check;
mod generate_cmd;
mod models_cmd;
mod options;
mod progress;
mod replay;
mod serve;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "weft", version, about = "Weft: LLM inference on MLX")]
struct Cli {
    /// CPU quantized-matmul kernels: `fast` (Weft's SIMD multi-threaded kernel, the default) or
    /// `exact` (MLX's own, bit-for-bit mlx-lm). Overrides WEFT_CPU_KERNELS.
    #[arg(long, global = true, value_parser = parse_cpu_kernels)]
    cpu_kernels: Option<weft::kernels::CpuKernels>,
    /// Activations of the fast CPU kernel below 16 rows (decode): `int8` (the default:
    /// quantized per block of 32, as llama.cpp; next-token KL vs exact ~4e-3 nats, as
    /// llama.cpp's) or `float` (slower, KL ~1e-10). Overrides WEFT_CPU_ACTIVATIONS.
    #[arg(long, global = true, value_parser = parse_cpu_activations)]
    cpu_activations: Option<weft::kernels::CpuActivations>,
    #[command(subcommand)]
    command: Command,
}

fn parse_cpu_kernels(s: &str) -> Result<weft::kernels::CpuKernels, String> {
    s.parse().map_err(|_| format!("expected \"exact\" or \"fast\", got {s:?}"))
}

fn parse_cpu_activations(s: &str) -> Result<weft::kernels::CpuActivations, String> {
    s.parse().map_err(|_| format!("expected \"float\" or \"int8\", got {s:?}"))
}

#[derive(Subcommand)]
enum Command {
    /// Generate a completion for a prompt (chat-templated unless --raw) or for token ids.
    Generate(generate_cmd::GenerateArgs),
    /// Interactive chat with the model.
    Chat(chat::ChatArgs),
    /// Answer PROMPT, or start an interactive chat when no prompt is given.
    Run(chat::RunArgs),
    /// Run a join/leave schedule through the batching engine (parity tooling).
    Replay(replay::ReplayArgs),
    /// Measure generation speed at several batch sizes.
    Bench(bench::BenchArgs),
    /// Download a model (or find it already installed) and print its path: the default model,
    /// or one the store knows by name (gemma-3-270m).
    Pull(common::PullArgs),
    /// List the models the store knows and those installed: size, architecture,
    /// quantization, capabilities (chat template, tools, vision); --json for one JSON object.
    #[command(alias = "ls")]
    Models(models_cmd::ModelsArgs),
    /// Serve the model over HTTP: OpenAI and Anthropic APIs, /health, /stats, /metrics.
    Serve(Box<serve::ServeArgs>),
    /// Check a gated delta recurrence kernel against the ops path on this device.
    #[command(hide = true)]
    GdnCheck(gdn_check::GdnCheckArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // A bug must still end in one clear line and a failure code, not a backtrace.
    std::panic::set_hook(Box::new(|info| eprintln!("error: internal error: {info}")));
    let result = std::panic::catch_unwind(|| {
        // Only the commands that load a model map the environment to options.
        let opts = || options::options_from_env(cli.cpu_kernels, cli.cpu_activations);
        match cli.command {
            Command::Generate(a) => generate_cmd::run(a, &opts()?),
            Command::Chat(a) => chat::chat(a, &opts()?),
            Command::Run(a) => chat::run(a, &opts()?),
            Command::Replay(a) => replay::run(a, &opts()?),
            Command::Bench(a) => bench::run(a, &opts()?),
            Command::Pull(a) => common::pull(a).map(|p| println!("{}", p.display())),
            Command::Models(a) => models_cmd::run(a),
            Command::Serve(a) => serve::run(*a, &opts()?),
            Command::GdnCheck(a) => gdn_check::run_check(a, &opts()?),
        }
    });
    match result {
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(e)) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
        Err(_) => ExitCode::FAILURE,
    }
}
