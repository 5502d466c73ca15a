//! `weft chat` (interactive, multi-turn) and `weft run` (one answer, or chat).

use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;

use clap::Args;
use weft::engine::{EngineConfig, Input, Request};
use weft::sampling::SamplingParams;
use weft::tokenizer::ChatMessage;
use weft::{Error, Result};

use crate::batch::{Collector, Speculation};
use crate::options::Options;
use crate::common::{draft_tokens, load_model, require_tokenizer, resolve_draft_model, ModelArgs, SamplingArgs};

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
    /// Speculative decoding with this draft model (sharing the tokenizer; a path, store name or
    /// repo id as `--model`) instead of prompt lookup; `--num-draft-tokens` 0 means 3.
    #[arg(long)]
    pub draft_model: Option<PathBuf>,
    /// After each reply, print its token counts, speed and finish reason (and with speculation,
    /// the drafts and tokens per step) on stderr.
    #[arg(long, short = 'v')]
    pub verbose: bool,
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
            let mut session = Session::start(&args.chat, opts)?;
            let mut messages = system_messages(&args.chat);
            messages.push(ChatMessage::new("user", prompt));
            session.reply(&args.chat, &messages)?;
            Ok(())
        }
    }
}

pub fn chat(args: ChatArgs, opts: &Options) -> Result<()> {
    let mut session = Session::start(&args, opts)?;
    let interactive = std::io::stdin().is_terminal();
    if interactive {
        eprintln!("Chatting with {}. /reset clears the conversation, /exit or Ctrl-D quits.", session.source.display());
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
        let answer = session.reply(&args, &messages)?;
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

/// The model behind one `run` / `chat`: an engine core every reply is submitted to as a
/// request (speculation, stop ids and the row loop are the engine's), kept across turns.
struct Session {
    engine: Collector,
    sampling: SamplingParams,
    source: PathBuf,
    speculating: bool,
}

impl Session {
    fn start(args: &ChatArgs, opts: &Options) -> Result<Session> {
        // Found before the model loads: a bad draft model fails at once.
        let draft_model = resolve_draft_model(args.draft_model.as_deref())?;
        let loaded = load_model(&args.model, opts)?;
        require_tokenizer(&loaded)?;
        let config = opts.engine_config(EngineConfig {
            // Each turn prefills the whole conversation, as before; nothing is kept between turns.
            prompt_cache_bytes: 0,
            num_draft_tokens: draft_tokens(args.num_draft_tokens, draft_model.as_deref()),
            draft_model,
            ..EngineConfig::default()
        })?;
        let speculating = config.num_draft_tokens > 0;
        let sampling = args.sampling.params(&loaded);
        let source = loaded.source.clone();
        let engine = Collector::new(loaded, config)?;
        if speculating {
            if let Some(why) = engine.speculation_off() {
                eprintln!("weft: not speculating: {why}");
            }
        }
        Ok(Session { engine, sampling, source, speculating })
    }

    /// Streams the assistant's reply to `messages` to stdout and returns its text.
    fn reply(&mut self, args: &ChatArgs, messages: &[ChatMessage]) -> Result<String> {
        let tok = self.engine.tokenizer().ok_or_else(|| Error::InvalidRequest("this model has no tokenizer".into()))?;
        let ids = tok.apply_chat_template(messages, true)?;
        let request = Request { max_tokens: args.max_tokens, sampling: self.sampling.clone(), ..Request::new(Input::Tokens(ids)) };
        let id = self.engine.submit(request)?;
        let before = Speculation::read(&self.engine.core);
        let mut stdout = std::io::stdout();
        let mut streamed = 0usize;
        let r = self.engine.stream(id, |text| {
            streamed += text.len();
            let _ = stdout.write_all(text.as_bytes());
            let _ = stdout.flush();
        });
        let speculation = Speculation::read(&self.engine.core).since(before);
        if let Some(e) = r.error {
            return Err(Error::Mlx(e));
        }
        println!("{}", &r.text[streamed.min(r.text.len())..]);
        if args.verbose {
            eprintln!("{}", r.summary(self.speculating.then_some(&speculation)));
        }
        Ok(r.text)
    }
}
