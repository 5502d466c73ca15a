//! `weft generate`: one completion, streamed to stdout, or the parity JSON with `--json`.

use std::io::Write;

use clap::Args;
use serde_json::json;
use weft::engine::{Input, Request};
use weft::loading::LoadedModel;
use weft::tokenizer::ChatMessage;
use weft::{Error, Result};

use crate::batch::{Collector, Speculation};
use crate::options::Options;
use crate::common::{load_model, require_tokenizer, resolve_draft_model, EngineArgs, KvArgs, ModelArgs, SamplingArgs};

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

/// Every prompt runs through the engine core ([`Collector`]), as `weft serve` runs requests:
/// one prompt streamed (text) or printed at its end (ids, `--json`), several `--prompt-ids`
/// batched together. Speculative decoding (`--num-draft-tokens`, `--draft-model`) is the
/// engine's; its counters come from the engine's stats.
pub fn run(args: GenerateArgs, options: &Options) -> Result<()> {
    if args.prompt.is_some() == !args.prompt_ids.is_empty() {
        return Err(Error::InvalidRequest("give either a PROMPT or --prompt-ids".into()));
    }
    if args.max_tokens == 0 {
        return Err(Error::InvalidRequest("--max-tokens must be at least 1".into()));
    }
    // Found before the model loads: a bad draft model fails at once.
    let draft_model = resolve_draft_model(args.engine.draft_model.as_deref())?;
    let loaded = load_model(&args.model, options)?;
    let engine_args = EngineArgs { draft_model, ..args.engine.clone() };
    let config = options.engine_config(args.kv.apply(engine_args.config(args.prefill_step_size.max(1))))?;
    let sampling = args.sampling.params(&loaded);
    let prompts = match &args.prompt {
        Some(text) => vec![encode_prompt(&loaded, &args, text)?],
        None => args.prompt_ids.clone(),
    };
    let speculating = config.num_draft_tokens > 0;
    let mut engine = Collector::new(loaded, config)?;
    if speculating {
        if let Some(why) = engine.speculation_off() {
            eprintln!("weft: not speculating: {why}");
        }
    }
    let request = |ids: Vec<u32>, capture_first_logits: usize| Request {
        max_tokens: args.max_tokens,
        sampling: sampling.clone(),
        stop: args.stop.clone(),
        ignore_eos: args.no_eos,
        capture_first_logits,
        ..Request::new(Input::Tokens(ids))
    };
    if prompts.len() > 1 {
        return run_rows(&args, engine, prompts.into_iter().map(|p| request(p, FIRST_LOGITS)).collect());
    }

    let id = engine.submit(request(prompts[0].clone(), if args.json { FIRST_LOGITS } else { 0 }))?;
    let before = Speculation::read(&engine.core);
    let streaming = args.prompt.is_some() && !args.json;
    let mut stdout = std::io::stdout();
    let mut streamed = 0usize;
    let r = engine.stream(id, |text| {
        if streaming {
            streamed += text.len();
            let _ = stdout.write_all(text.as_bytes());
            let _ = stdout.flush();
        }
    });
    let speculation = Speculation::read(&engine.core).since(before);
    if let Some(e) = r.error {
        return Err(Error::Mlx(e));
    }
    if args.json {
        let mut v = json!({"tokens": r.tokens, "first_logits": r.first_logits,
                           "prompt_tokens": r.prompt_tokens, "finish_reason": r.finish_str()});
        if args.prompt.is_some() {
            v["text"] = json!(r.text);
        }
        if speculating {
            v["speculation"] = speculation.json(r.tokens.len());
        }
        println!("{v}");
    } else if args.prompt.is_none() {
        print_plain(&r.tokens, r.finish_str());
    } else {
        println!("{}", &r.text[streamed.min(r.text.len())..]);
        eprintln!("{}", r.summary(speculating.then_some(&speculation)));
    }
    Ok(())
}

/// The prompt text as token ids: through the chat template as a user message (after
/// `--system`), unless `--raw` or the model has no template.
fn encode_prompt(loaded: &LoadedModel, args: &GenerateArgs, text: &str) -> Result<Vec<u32>> {
    let tok = require_tokenizer(loaded)?;
    if args.raw || tok.chat_template().is_none() {
        return tok.encode(text, true);
    }
    let mut messages = Vec::new();
    if let Some(s) = &args.system {
        messages.push(ChatMessage::new("system", s.clone()));
    }
    messages.push(ChatMessage::new("user", text.to_string()));
    tok.apply_chat_template(&messages, true)
}

fn print_plain(tokens: &[u32], finish: &str) {
    let ids: Vec<String> = tokens.iter().map(|t| t.to_string()).collect();
    println!("{} ({finish})", ids.join(","));
}

/// Several `--prompt-ids`: all submitted at once to the continuous-batching engine.
fn run_rows(args: &GenerateArgs, mut engine: Collector, requests: Vec<Request>) -> Result<()> {
    for request in requests {
        engine.submit(request)?;
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
