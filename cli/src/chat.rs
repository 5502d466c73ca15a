//! `weft chat` (interactive, multi-turn) and `weft run` (one answer, or chat).

use std::io::{BufRead, IsTerminal, Write};

use clap::Args;
use weft::engine::EngineConfig;
use weft::generate::{generate, GenerateOptions};
use weft::loading::LoadedModel;
use weft::tokenizer::ChatMessage;
use weft::Result;

use crate::options::Options;
use crate::common::{load_model, require_tokenizer, ModelArgs, SamplingArgs};

#[derive(Args, Debug)]
pub struct ChatArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// System message.
    #[arg(long)]
    pub system: Option<String>,
    /// Maximum tokens per reply.
    #[arg(long, default_value_t = 512)]
    pub max_tokens: usize,
    /// Prompt-lookup speculative decoding: draft up to this many tokens per step (0 = off).
    #[arg(long, default_value_t = 0)]
    pub num_draft_tokens: usize,
    #[command(flatten)]
    pub sampling: SamplingArgs,
}

#[derive(Args, Debug)]
pub struct RunArgs {
    /// What to ask. Without it, starts an interactive chat.
    pub prompt: Option<String>,
    #[command(flatten)]
    pub chat: ChatArgs,
}

pub fn run(args: RunArgs, opts: &Options) -> Result<()> {
    match args.prompt {
        None => chat(args.chat, opts),
        Some(prompt) => {
            let loaded = load_model(&args.chat.model, opts)?;
            let mut messages = system_messages(&args.chat);
            messages.push(ChatMessage::new("user", prompt));
            reply(&loaded, &args.chat, &messages, opts)?;
            Ok(())
        }
    }
}

pub fn chat(args: ChatArgs, opts: &Options) -> Result<()> {
    let loaded = load_model(&args.model, opts)?;
    require_tokenizer(&loaded)?;
    let interactive = std::io::stdin().is_terminal();
    if interactive {
        eprintln!("Chatting with {}. /reset clears the conversation, /exit or Ctrl-D quits.", loaded.source.display());
    }
    let mut messages = system_messages(&args);
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    loop {
        if interactive {
            eprint!(">>> ");
            let _ = std::io::stderr().flush();
        }
        let Some(line) = lines.next() else { break };
        let line = line.map_err(|e| weft::Error::io("<stdin>", e))?;
        let line = line.trim();
        match line {
            "" => continue,
            "/exit" | "/quit" => break,
            "/reset" => {
                messages = system_messages(&args);
                continue;
            }
            _ => {}
        }
        messages.push(ChatMessage::new("user", line.to_string()));
        let answer = reply(&loaded, &args, &messages, opts)?;
        messages.push(ChatMessage::new("assistant", answer));
    }
    Ok(())
}

fn system_messages(args: &ChatArgs) -> Vec<ChatMessage> {
    args.system
        .iter()
        .map(|s| ChatMessage::new("system", s.clone()))
        .collect()
}

/// Streams the assistant's reply to stdout and returns its text.
fn reply(loaded: &LoadedModel, args: &ChatArgs, messages: &[ChatMessage], options: &Options) -> Result<String> {
    let tok = require_tokenizer(loaded)?;
    let ids = tok.apply_chat_template(messages, true)?;
    let opts = GenerateOptions {
        max_tokens: args.max_tokens,
        sampling: args.sampling.params(loaded),
        stop_token_ids: loaded.eos_token_ids.clone(),
        decode: options.engine_config(EngineConfig::default())?.decode,
        num_draft_tokens: args.num_draft_tokens,
        ..GenerateOptions::default()
    };
    let mut stdout = std::io::stdout();
    let mut streamed = 0usize;
    let g = generate(loaded.model.as_ref(), Some(tok), &ids, &opts, |ev| {
        streamed += ev.text.len();
        let _ = stdout.write_all(ev.text.as_bytes());
        let _ = stdout.flush();
        true
    })?;
    println!("{}", &g.text[streamed.min(g.text.len())..]);
    Ok(g.text)
}
