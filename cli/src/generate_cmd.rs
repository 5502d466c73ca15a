//! `weft generate`: one completion, streamed to stdout, or the parity JSON with `--json`.

use std::io::Write;

use clap::Args;
use serde_json::json;
use weft::engine::{EngineConfig, Input, Request};
use weft::generate::{generate, GenerateOptions, Generation};
use weft::tokenizer::ChatMessage;
use weft::{Error, Result};

use crate::batch::Collector;
use crate::options::Options;
use crate::common::{load_model, require_tokenizer, EngineArgs, KvArgs, ModelArgs, SamplingArgs};

#[derive(Args, Debug)]
pub struct GenerateArgs {
    /// The prompt text. Chat models get it as a user message through their chat template
    /// unless --raw is given.
    pub prompt: Option<String>,
    #[command(flatten)]
    pub model: ModelArgs,
    /// Token ids instead of text, comma-separated (e.g. 5,17,3). Repeat for several rows.
    #[arg(long = "prompt-ids", value_parser = parse_ids)]
    pub prompt_ids: Vec<Vec<u32>>,
    /// Maximum number of tokens to generate.
    #[arg(long, default_value_t = 256)]
    pub max_tokens: usize,
    /// Print one JSON object instead of streaming text.
    #[arg(long)]
    pub json: bool,
    /// Never stop at end-of-sequence tokens.
    #[arg(long)]
    pub no_eos: bool,
    /// Use the prompt text as-is, without the chat template.
    #[arg(long)]
    pub raw: bool,
    /// System message for the chat template.
    #[arg(long)]
    pub system: Option<String>,
    /// Stop when this string is generated (repeatable); it is not printed.
    #[arg(long)]
    pub stop: Vec<String>,
    /// Prompt tokens processed per prefill chunk.
    #[arg(long, default_value_t = 2048)]
    pub prefill_step_size: usize,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
    #[command(flatten)]
    pub kv: KvArgs,
}

fn parse_ids(s: &str) -> std::result::Result<Vec<u32>, String> {
    s.split(',')
        .filter(|t| !t.trim().is_empty())
        .map(|t| t.trim().parse::<u32>().map_err(|_| format!("invalid token id {t:?} in {s:?}")))
        .collect()
}

/// Number of leading first-step logits the parity JSON reports.
const FIRST_LOGITS: usize = 8;

pub fn run(args: GenerateArgs, options: &Options) -> Result<()> {
    if args.prompt.is_some() == !args.prompt_ids.is_empty() {
        return Err(Error::InvalidRequest("give either a PROMPT or --prompt-ids".into()));
    }
    if args.max_tokens == 0 {
        return Err(Error::InvalidRequest("--max-tokens must be at least 1".into()));
    }
    let loaded = load_model(&args.model, options)?;
    let opts = GenerateOptions {
        max_tokens: args.max_tokens,
        sampling: args.sampling.params(&loaded),
        stop_token_ids: if args.no_eos { Vec::new() } else { loaded.eos_token_ids.clone() },
        stop_strings: args.stop.clone(),
        prefill_step_size: args.prefill_step_size.max(1),
        capture_first_logits: if args.json { FIRST_LOGITS } else { 0 },
        kv_quantization: args.kv.quantization(),
        decode: options.engine_config(EngineConfig::default())?.decode,
        num_draft_tokens: args.engine.num_draft_tokens,
    };
    let model = loaded.model.as_ref();
    let tokenizer = loaded.tokenizer.as_ref();

    if args.prompt_ids.len() > 1 {
        return run_rows(args, loaded, opts, options);
    }
    if args.engine.draft_model.is_some() {
        return Err(Error::InvalidRequest("--draft-model runs in the engine: give several --prompt-ids, or use `weft serve` / `weft bench`".into()));
    }
    if let Some(ids) = args.prompt_ids.first() {
        let g = generate(model, tokenizer, ids, &opts, |_| true)?;
        if args.json {
            println!(
                "{}",
                json!({"tokens": g.tokens, "first_logits": g.first_logits,
                       "prompt_tokens": g.prompt_tokens, "finish_reason": g.finish_reason.as_str()})
            );
        } else {
            print_plain(&g.tokens, g.finish_reason.as_str());
        }
        return Ok(());
    }

    let text = args.prompt.as_deref().unwrap_or_default();
    let tok = require_tokenizer(&loaded)?;
    let ids = if args.raw || tok.chat_template().is_none() {
        tok.encode(text, true)?
    } else {
        let mut messages = Vec::new();
        if let Some(s) = &args.system {
            messages.push(ChatMessage::new("system", s.clone()));
        }
        messages.push(ChatMessage::new("user", text.to_string()));
        tok.apply_chat_template(&messages, true)?
    };
    if args.json {
        let g = generate(model, tokenizer, &ids, &opts, |_| true)?;
        println!(
            "{}",
            json!({"text": g.text, "tokens": g.tokens, "first_logits": g.first_logits,
                   "prompt_tokens": g.prompt_tokens, "finish_reason": g.finish_reason.as_str()})
        );
        return Ok(());
    }
    let mut stdout = std::io::stdout();
    let mut streamed = 0usize;
    let g = generate(model, tokenizer, &ids, &opts, |ev| {
        streamed += ev.text.len();
        let _ = stdout.write_all(ev.text.as_bytes());
        let _ = stdout.flush();
        true
    })?;
    println!("{}", &g.text[streamed.min(g.text.len())..]);
    eprintln!(
        "[{} prompt tokens, {} generated, {:.1} tok/s, finish: {}]",
        g.prompt_tokens,
        g.tokens.len(),
        tokens_per_second(&g),
        g.finish_reason.as_str()
    );
    Ok(())
}

fn print_plain(tokens: &[u32], finish: &str) {
    let ids: Vec<String> = tokens.iter().map(|t| t.to_string()).collect();
    println!("{} ({finish})", ids.join(","));
}

/// Several `--prompt-ids`: all submitted at once to the continuous-batching engine.
fn run_rows(args: GenerateArgs, loaded: weft::loading::LoadedModel, opts: GenerateOptions, options: &Options) -> Result<()> {
    let config = options.engine_config(args.kv.apply(args.engine.config(opts.prefill_step_size)))?;
    let mut engine = Collector::new(loaded, config)?;
    for ids in &args.prompt_ids {
        engine.submit(Request {
            input: Input::Tokens(ids.clone()),
            max_tokens: opts.max_tokens,
            sampling: opts.sampling.clone(),
            stop: opts.stop_strings.clone(),
            ignore_eos: args.no_eos,
            capture_first_logits: FIRST_LOGITS,
            logprobs: None,
            tools: None,
            constraint: None,
            images: Vec::new(),
            ..Request::new(Input::Tokens(Vec::new()))
        })?;
    }
    engine.run_to_completion();
    let rows = engine.results();
    if let Some(err) = rows.iter().find_map(|(_, r)| r.error.clone()) {
        return Err(Error::Mlx(err));
    }
    if args.json {
        let rows: Vec<_> = rows
            .iter()
            .map(|(_, r)| json!({"tokens": r.tokens, "first_logits": r.first_logits,
                                 "prompt_tokens": r.prompt_tokens, "finish_reason": r.finish_str()}))
            .collect();
        println!("{}", json!({ "rows": rows }));
    } else {
        for (_, r) in &rows {
            print_plain(&r.tokens, r.finish_str());
        }
    }
    Ok(())
}

pub fn tokens_per_second(g: &Generation) -> f64 {
    if g.tokens.len() > 1 && g.decode_s > 0.0 {
        (g.tokens.len() - 1) as f64 / g.decode_s
    } else {
        0.0
    }
}
