//! `weft`: run models from the command line.
//!
//! Subcommands: `generate` (one completion; `--json` parity output), `chat` (interactive),
//! `run` (answer a prompt, or chat when none is given), `bench` (decode speed), `pull` (fetch
//! the default model). Every failure prints `error: ...` and exits non-zero; no panics.

mod batch;
mod bench;
mod chat;
mod common;
mod generate_cmd;
mod replay;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "weft", version, about = "Weft: LLM inference on MLX")]
struct Cli {
    #[command(subcommand)]
    command: Command,
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
    /// Download (or verify) the default model.
    Pull,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // A bug must still end in one clear line and a failure code, not a backtrace.
    std::panic::set_hook(Box::new(|info| eprintln!("error: internal error: {info}")));
    let result = std::panic::catch_unwind(|| match cli.command {
        Command::Generate(a) => generate_cmd::run(a),
        Command::Chat(a) => chat::chat(a),
        Command::Run(a) => chat::run(a),
        Command::Replay(a) => replay::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Pull => common::resolve_model_path(None).map(|p| println!("{}", p.display())),
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
