//! `weft serve`: an OpenAI- and Anthropic-compatible HTTP server on the continuous-batching
//! engine, a drop-in for `mlx_lm.server` (same flag names, port 8080, 127.0.0.1).
//!
//! - [`openai`]: `/v1/chat/completions`, `/v1/completions`, `/v1/models`
//! - [`anthropic`]: `/v1/messages`, `/v1/messages/count_tokens`
//! - [`responses`]: `/v1/responses` (OpenAI's Responses API) and its store
//! - [`metrics`]: `/metrics` (Prometheus) and `/stats` (JSON); `/health` is here
//! - [`state`]: shared state and the engine-sink → async bridge (disconnect = cancel)
//! - [`params`], [`errors`]: request fields and each protocol's error JSON
//! - [`security`]: CORS origins, the `Host` allowlist, the API key
//! - [`limits`]: body size, message count, `max_tokens`, connections, over-context prompts
//! - [`conn`]: serving connections through hyper: header, body and keep-alive timeouts,
//!   `/health` past the connection cap
//!
//! One tokio runtime (two workers: HTTP work is light next to the engine's own thread) serves
//! every connection; all generation goes through one [`weft::engine::Engine`].

mod anthropic;
mod conn;
mod errors;
mod limits;
mod metrics;
mod openai;
mod params;
mod ranks;
mod responses;
mod security;
mod slots;
mod state;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use clap::Args;
use serde_json::json;
use weft::engine::{Engine, EngineConfig};
use weft::tokenizer::ChatTemplate;
use weft::vision::source::LocalMedia;
use weft::{Error, Result};

use errors::{json_response, ApiError, ErrorKind, Protocol};
use limits::{LimitedListener, Limits};
use security::{HostPolicy, OriginPolicy};
use state::{Access, AppState, Defaults, ServedModel};

use crate::common::{resolve_model_path, ModelArgs};

#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Address to bind. The default keeps the server private to this machine.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0 = any free port; the chosen one is printed).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Rows decoding together in the batch.
    #[arg(long, default_value_t = 32, alias = "max-batch")]
    pub decode_concurrency: usize,
    /// Requests prefilling at once.
    #[arg(long, default_value_t = 8)]
    pub prompt_concurrency: usize,
    /// Prompt tokens per prefill chunk (decode steps of running rows interleave between chunks).
    #[arg(long, default_value_t = 2048)]
    pub prefill_step_size: usize,
    /// Prompt-lookup speculative decoding for requests that do not set `num_draft_tokens`:
    /// draft up to this many tokens per step (0 = off; mlx_lm.server's flag).
    #[arg(long, default_value_t = 0)]
    pub num_draft_tokens: usize,
    /// Draft model for speculative decoding (mlx_lm.server's flag): a model sharing the
    /// tokenizer (a path, a store name or a Hugging Face repo id, as `--model`) drafts
    /// `--num-draft-tokens` tokens per step (3 when that is left at 0) instead of prompt lookup.
    #[arg(long)]
    pub draft_model: Option<std::path::PathBuf>,
    /// Default `max_tokens` for requests that do not set it.
    #[arg(long, default_value_t = 512)]
    pub max_tokens: usize,
    /// Default sampling temperature (0 = greedy).
    #[arg(long = "temp", alias = "temperature", default_value_t = 0.0)]
    pub temperature: f32,
    /// Default nucleus sampling threshold.
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// Default top-k (0 = off).
    #[arg(long, default_value_t = 0)]
    pub top_k: u32,
    /// Default min-p (0 = off).
    #[arg(long, default_value_t = 0.0)]
    pub min_p: f32,
    /// KV-cache budget across admitted requests (prompt + max_tokens, projected), in GB, or
    /// with a unit: 512MB, 2GB. Requests that could never fit get a 400; others wait their turn.
    /// Default: no limit.
    #[arg(long, value_parser = parse_gb, alias = "kv-budget-bytes")]
    pub kv_budget: Option<u64>,
    /// Bytes of KV kept for prompt-prefix reuse (1GB, 512MB, or bytes; 0 = off): finished
    /// requests and checkpoints at their chat boundaries, so an agent's next turn prefills only
    /// what is new, on hybrid and sliding-window models too. `auto` (the default) sizes it from
    /// the memory left after loading the model; it shares one ceiling with the rows' KV (the
    /// --kv-budget, else for `auto` the memory left after loading). Reuse is exact: outputs equal a cold run's.
    #[arg(long, value_parser = parse_prompt_cache, default_value = "auto")]
    pub prompt_cache_bytes: u64,
    /// Load the prompt cache from this directory at start and save it there at shutdown, so
    /// entries (a long system prompt, an agent's conversation) survive a restart. Files saved
    /// for another model, tokenizer or kernel mode, or damaged, are refused and reported.
    /// `POST /slots/0?action=save|restore` writes and reads single entries here (llama-server's
    /// `--slot-save-path` is an alias).
    #[arg(long, value_name = "DIR", alias = "slot-save-path")]
    pub prompt_cache_dir: Option<PathBuf>,
    #[command(flatten)]
    pub kv: crate::common::KvArgs,
    #[command(flatten)]
    pub memory: crate::common::MemoryArgs,
    /// Require this key as `Authorization: Bearer KEY` or `x-api-key: KEY` (all but /health).
    /// Default: $WEFT_API_KEY, else none. Visible to other local users in the process list:
    /// prefer --api-key-file or $WEFT_API_KEY.
    #[arg(long, conflicts_with = "api_key_file")]
    pub api_key: Option<String>,
    /// Read the API key from this file (its contents, surrounding whitespace trimmed).
    #[arg(long)]
    pub api_key_file: Option<PathBuf>,
    /// A directory whose files requests may name as local image / audio paths (`file://` URLs
    /// or plain paths); repeatable. Without it, local paths are refused: requests send media
    /// as `data:` URLs.
    #[arg(long = "allowed-media-dir", value_name = "DIR")]
    pub allowed_media_dirs: Vec<PathBuf>,
    /// Browser origins allowed (CORS), comma-separated: exact origins, `local` (the default:
    /// loopback pages and app schemes), `null`, or `*` (any). Default: $WEFT_ALLOWED_ORIGINS,
    /// else `local`. Requests from other origins get 403.
    #[arg(long, value_delimiter = ',')]
    pub allowed_origins: Vec<String>,
    /// Extra `Host` names accepted when bound to loopback (the DNS-rebinding defence), comma-
    /// separated; `*` turns the check off. Default: $WEFT_ALLOWED_HOSTS, else none.
    #[arg(long, value_delimiter = ',')]
    pub allowed_hosts: Vec<String>,
    /// Largest request body (413 beyond, before any of it is parsed): bytes, or 4MB, 1GB.
    #[arg(long, value_parser = parse_bytes, default_value = "4MB")]
    pub max_body_bytes: u64,
    /// Most messages in one chat / Messages request.
    #[arg(long, default_value_t = 2048)]
    pub max_messages: usize,
    /// Largest `max_tokens` a request may ask for (default: no ceiling beyond the context).
    #[arg(long)]
    pub max_tokens_limit: Option<usize>,
    /// Connections open at once; one more gets a 429 and is closed (`/health` is still
    /// answered on a few connections past the cap).
    #[arg(long, default_value_t = 512)]
    pub max_connections: usize,
    /// Seconds a request's head (request line and headers) may take to arrive; the connection
    /// is closed beyond. 0 = no limit.
    #[arg(long, default_value_t = 10.0, value_parser = parse_seconds)]
    pub header_timeout: f64,
    /// Seconds a request's body may take to arrive, counted from its head; 408 beyond.
    /// 0 = no limit.
    #[arg(long, default_value_t = 600.0, value_parser = parse_seconds)]
    pub read_timeout: f64,
    /// Seconds a connection with no request in progress stays open waiting for the next one
    /// (a response being streamed is in progress). 0 = until --header-timeout.
    #[arg(long, default_value_t = 5.0, value_parser = parse_seconds)]
    pub keep_alive_timeout: f64,
    /// Answer 404 when a request names a model other than the served one (default: accept any
    /// name and echo the served id).
    #[arg(long)]
    pub strict_model: bool,
    /// A chat template replacing the model's: a file, or the template text itself.
    #[arg(long)]
    pub chat_template: Option<String>,
    /// Default chat-template variables, a JSON object (mlx_lm.server's flag), e.g.
    /// '{"enable_thinking": false}'; a request's `chat_template_kwargs` override them key by key.
    #[arg(long, value_parser = parse_template_args)]
    pub chat_template_args: Option<serde_json::Map<String, serde_json::Value>>,
    /// The model id served in responses and /v1/models (default: the --model argument, or the
    /// default model's file name).
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// DEBUG logs every request; INFO startup and shutdown; WARNING and above only problems.
    #[arg(long, default_value = "INFO", value_parser = ["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"], ignore_case = true)]
    pub log_level: String,
    /// Seconds running requests get to finish after SIGINT/SIGTERM before they are cancelled.
    #[arg(long, default_value_t = 10.0)]
    pub shutdown_timeout: f64,
    /// Serve across ranks: an `mlx.launch` hostfile (JSON hosts with `ips`, optional `backend`
    /// and `envs`). Rank 0 starts the local follower ranks, serves HTTP and leads; the
    /// others load their shard and follow (docs/distributed.md).
    #[arg(long)]
    pub hostfile: Option<PathBuf>,
    /// This process's rank in the --hostfile group (default: $MLX_RANK, else 0, which also
    /// starts the other local ranks).
    #[arg(long, requires = "hostfile")]
    pub rank: Option<usize>,
    /// Seconds a step across ranks may take before the group counts as failed (in-flight
    /// requests end with an error, /health turns 503).
    #[arg(long, default_value_t = 60.0, requires = "hostfile")]
    pub rank_timeout: f64,
    /// First port of the ring backend (rank i listens on starting_port + i, as mlx.launch).
    #[arg(long, default_value_t = 32323, requires = "hostfile")]
    pub starting_port: u16,
    /// Split the model's layers across ranks (pipeline parallel) instead of sharding them.
    #[arg(long, requires = "hostfile")]
    pub pipeline: bool,
    /// Bytes of `/v1/responses` answers kept for `previous_response_id` and GET (oldest
    /// evicted first): bytes, or 64MB, 1GB. 0 = store nothing.
    #[arg(long, value_parser = parse_bytes, default_value = "64MB")]
    pub response_store_bytes: u64,
    /// Seconds a stored response is kept.
    #[arg(long, default_value_t = 3600.0, value_parser = parse_seconds)]
    pub response_ttl: f64,
    /// Accepted for mlx_lm.server compatibility; Weft never runs model code from the model.
    #[arg(long, hide = true)]
    pub trust_remote_code: bool,
}

/// A size: a bare number in bytes, or with K/KB/M/MB/G/GB (powers of 1000, as mlx_lm.server).
fn parse_size(s: &str, bare_unit: f64) -> std::result::Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().map_err(|_| format!("expected a size like 512MB or 2GB, got {s:?}"))?;
    let scale = match unit.trim().to_ascii_uppercase().as_str() {
        "" => bare_unit,
        "B" => 1.0,
        "K" | "KB" => 1e3,
        "M" | "MB" => 1e6,
        "G" | "GB" => 1e9,
        "T" | "TB" => 1e12,
        other => return Err(format!("unknown size unit {other:?} in {s:?}")),
    };
    Ok((n * scale).round() as u64)
}

fn parse_bytes(s: &str) -> std::result::Result<u64, String> {
    parse_size(s, 1.0)
}

fn parse_prompt_cache(s: &str) -> std::result::Result<u64, String> {
    match s.trim() {
        "auto" => Ok(weft::engine::PROMPT_CACHE_AUTO),
        other => parse_bytes(other),
    }
}

fn parse_template_args(s: &str) -> std::result::Result<serde_json::Map<String, serde_json::Value>, String> {
    match serde_json::from_str::<serde_json::Value>(s) {
        Ok(serde_json::Value::Object(m)) => Ok(m),
        Ok(_) => Err("expected a JSON object, e.g. '{\"enable_thinking\": false}'".into()),
        Err(e) => Err(format!("not JSON: {e}")),
    }
}

fn parse_seconds(s: &str) -> std::result::Result<f64, String> {
    match s.trim().trim_end_matches('s').parse::<f64>() {
        Ok(x) if x.is_finite() && x >= 0.0 => Ok(x),
        _ => Err(format!("expected a number of seconds (0 = no limit), got {s:?}")),
    }
}

/// Seconds → a timeout, 0 = none.
fn timeout(seconds: f64) -> Option<Duration> {
    (seconds > 0.0).then(|| Duration::from_secs_f64(seconds))
}

fn parse_gb(s: &str) -> std::result::Result<u64, String> {
    match parse_size(s, 1e9)? {
        0 => Err("the KV budget must be positive".into()),
        n => Ok(n),
    }
}

/// The id a model is served under when no name is given: the file stem of a `.gguf`, the
/// directory name of an mlx-lm model (short, as the clients' model pickers show it); the
/// argument as typed and the path are aliases.
fn model_names(arg: Option<&Path>, path: &Path, served: Option<&str>) -> (String, Vec<String>) {
    let file_name = path.file_name().map(|n| n.to_string_lossy().into_owned());
    let stem = if path.is_dir() { file_name.clone() } else { path.file_stem().map(|n| n.to_string_lossy().into_owned()) };
    // A Hugging Face repo id given as --model is the served id (as mlx_lm.server reports it).
    let repo_id = arg.and_then(Path::to_str).filter(|a| Path::new(a) != path && weft::model_store::RepoRef::parse(a).is_some());
    let id = served.map(str::to_string).or_else(|| repo_id.map(str::to_string)).or_else(|| stem.clone()).unwrap_or_else(|| "weft".into());
    let mut aliases: Vec<String> = vec!["default_model".into(), path.to_string_lossy().into_owned()];
    if let Ok(abs) = std::fs::canonicalize(path) {
        aliases.push(abs.to_string_lossy().into_owned());
    }
    if let Some(a) = arg {
        aliases.push(a.to_string_lossy().into_owned());
    }
    aliases.extend(file_name);
    aliases.extend(stem);
    aliases.retain(|a| *a != id);
    aliases.dedup();
    (id, aliases)
}

fn load_chat_template(arg: &str, engine: &Engine) -> Result<ChatTemplate> {
    let source = if Path::new(arg).is_file() {
        std::fs::read_to_string(arg).map_err(|e| Error::io(PathBuf::from(arg), e))?
    } else {
        arg.to_string()
    };
    let tokenizer = engine
        .tokenizer()
        .ok_or_else(|| Error::InvalidRequest("--chat-template needs a model with a tokenizer".into()))?;
    let bos = tokenizer.bos_token_id().and_then(|id| tokenizer.id_to_token(id));
    let eos = tokenizer.eos_token_ids().first().and_then(|&id| tokenizer.id_to_token(id));
    ChatTemplate::new(&source, bos, eos)
}

pub fn run(args: ServeArgs, opts: &crate::options::Options) -> Result<()> {
    if args.max_tokens == 0 {
        return Err(Error::InvalidRequest("--max-tokens must be at least 1".into()));
    }
    // Flags that can be wrong are checked before the model loads.
    api_key(&args)?;
    local_media_policy(&args.allowed_media_dirs)?;
    // A server idles between bursts: what it freed must be able to leave its RSS.
    weft::engine::use_single_heap_arena();
    let path = resolve_model_path(args.model.model.as_deref())?;
    let level = args.log_level.to_ascii_uppercase();
    let info = level == "DEBUG" || level == "INFO";
    if info {
        log_line(&format!("weft serve: loading {} (MLX device: {})", path.display(), weft::default_device()));
    }
    let ranks = match &args.hostfile {
        Some(file) => Some(ranks::join(file, args.rank, args.starting_port, args.rank_timeout, args.pipeline)?),
        None => None,
    };
    let model = match &ranks {
        Some(r) => r.load(&path, &opts.load)?,
        None => weft::loading::load_with(&path, &opts.load)?,
    };
    let config = opts.engine_config(EngineConfig {
        max_batch: args.decode_concurrency,
        prompt_concurrency: args.prompt_concurrency,
        prefill_step_size: args.prefill_step_size,
        kv_budget_bytes: args.kv_budget,
        prompt_cache_bytes: args.prompt_cache_bytes,
        prompt_cache_dir: args.prompt_cache_dir.clone(),
        kv_bits: args.kv.kv_bits,
        kv_group_size: args.kv.kv_group_size,
        quantized_kv_start: args.kv.quantized_kv_start,
        memory: args.memory.policy(),
        local_media: local_media_policy(&args.allowed_media_dirs)?,
        chat_template_kwargs: args.chat_template_args.clone().unwrap_or_default(),
        num_draft_tokens: crate::common::draft_tokens(args.num_draft_tokens, args.draft_model.as_deref()),
        draft_model: args.draft_model.as_deref().map(|p| crate::common::resolve_model_path(Some(p))).transpose()?,
        // --chat-template goes with each request (Request::chat_template): it needs the
        // loaded tokenizer's special tokens.
        ..EngineConfig::default()
    })?;
    let engine = match &ranks {
        Some(r) if r.group.rank() > 0 => {
            if info {
                eprintln!("weft serve: rank {} of {} following rank 0", r.group.rank(), r.group.size());
            }
            return weft::engine::follow(model, config, r.group.clone(), r.opts, None);
        }
        Some(r) => Engine::start_distributed(model, config, r.group.clone(), r.opts)?,
        None => Engine::start(model, config)?,
    };
    if args.prompt_cache_dir.is_some() {
        // The engine thread publishes its stats (what it refused) once it has started.
        let mut stats = engine.stats();
        for _ in 0..500 {
            if stats.prompt_cache_capacity_bytes > 0 || args.prompt_cache_bytes == 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
            stats = engine.stats();
        }
        for refused in stats.prompt_cache_files_refused {
            log_line(&format!("weft serve: prompt cache: {refused}"));
        }
    }
    let chat_template = args.chat_template.as_deref().map(|t| load_chat_template(t, &engine)).transpose()?;
    let (model_id, aliases) = model_names(args.model.model.as_deref(), &path, args.served_model_name.as_deref());
    let served = ServedModel {
        id: model_id,
        aliases,
        path: std::fs::canonicalize(&path).unwrap_or_else(|_| path.clone()).to_string_lossy().into_owned(),
        strict: args.strict_model,
    };
    let api_key = api_key(&args)?;
    let from_env = |flag: &[String], var: &str| -> Vec<String> {
        if !flag.is_empty() {
            return flag.to_vec();
        }
        std::env::var(var).map(|v| v.split(',').map(str::to_string).collect()).unwrap_or_default()
    };
    let access = Access {
        api_key,
        origins: OriginPolicy::new(&from_env(&args.allowed_origins, "WEFT_ALLOWED_ORIGINS")),
        hosts: HostPolicy::new(&args.host, &from_env(&args.allowed_hosts, "WEFT_ALLOWED_HOSTS")),
    };
    let limits = Limits {
        body_bytes: usize::try_from(args.max_body_bytes).unwrap_or(usize::MAX),
        messages: args.max_messages,
        max_tokens: args.max_tokens_limit,
        connections: args.max_connections,
    };
    let defaults = Defaults {
        temperature: args.temperature,
        top_p: args.top_p,
        top_k: args.top_k,
        min_p: args.min_p,
        max_tokens: args.max_tokens,
    };
    let store = responses::Store::new(
        usize::try_from(args.response_store_bytes).unwrap_or(usize::MAX),
        Duration::from_secs_f64(args.response_ttl),
    );
    let state = Arc::new(AppState::new(engine, served, defaults, chat_template, access, limits, store, level == "DEBUG"));

    // Tokenizing is CPU work: more blocking threads than cores only adds threads (and their
    // allocator arenas).
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(cores.clamp(2, 8))
        .thread_name("weft-http")
        .enable_all()
        .build()
        .map_err(|e| Error::io("tokio runtime", e))?;
    let result = runtime.block_on(serve(Arc::clone(&state), &args, info));
    runtime.shutdown_timeout(Duration::from_secs(1));
    let leftover = Arc::strong_count(&state);
    drop(state); // the last reference stops the engine thread (outstanding rows get final events)
    if info {
        eprintln!("weft serve: stopped{}", if leftover > 1 { " (connections abandoned)" } else { "" });
    }
    result
}

/// The API key: `--api-key-file` (trimmed), `--api-key`, else `$WEFT_API_KEY`; empty = none.
fn api_key(args: &ServeArgs) -> Result<Option<String>> {
    let key = match (&args.api_key_file, &args.api_key) {
        (Some(_), Some(_)) => return Err(Error::InvalidRequest("give --api-key or --api-key-file, not both".into())),
        (Some(file), None) => {
            let text = std::fs::read_to_string(file).map_err(|e| Error::io(file.clone(), e))?;
            let key = text.trim().to_string();
            if key.is_empty() {
                return Err(Error::InvalidRequest(format!("--api-key-file {}: the file is empty", file.display())));
            }
            Some(key)
        }
        (None, key) => key.clone().or_else(|| std::env::var("WEFT_API_KEY").ok()),
    };
    Ok(key.filter(|k| !k.is_empty()))
}

/// `--allowed-media-dir`: none = local media paths refused; each directory must exist.
fn local_media_policy(dirs: &[PathBuf]) -> Result<LocalMedia> {
    if dirs.is_empty() {
        return Ok(LocalMedia::Deny);
    }
    LocalMedia::dirs(dirs)
}

async fn serve(state: Arc<AppState>, args: &ServeArgs, info: bool) -> Result<()> {
    // An IPv6 address needs brackets before the port.
    let addr = if args.host.contains(':') && !args.host.starts_with('[') {
        format!("[{}]:{}", args.host, args.port)
    } else {
        format!("{}:{}", args.host, args.port)
    };
    let listener =
        tokio::net::TcpListener::bind(&addr).await.map_err(|e| Error::io(format!("listening address {addr}"), e))?;
    let local: SocketAddr = listener.local_addr().map_err(|e| Error::io(addr.clone(), e))?;
    if info {
        eprintln!(
            "weft serve: serving {} on http://{local} (decode concurrency {}, {}, browser origins: {}{})",
            state.model_id,
            args.decode_concurrency,
            if state.access.api_key.is_some() { "API key required" } else { "no API key" },
            state.access.origins.describe(),
            if state.access.hosts.is_enforced() { ", Host checked" } else { "" },
        );
    }
    let refused = ApiError::new(
        ErrorKind::TooManyRequests,
        format!("too many open connections (--max-connections {})", state.limits.connections),
    )
    .body(Protocol::OpenAi)
    .to_string();
    let refused: Arc<str> = refused.into();
    let listener = LimitedListener::new(listener, state.limits.connections, Arc::clone(&refused));
    let signals = Signals::new();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let grace = Duration::from_secs_f64(args.shutdown_timeout.max(0.0));
    tokio::spawn(watch_signals(Arc::clone(&state), signals, stop_tx, grace, info));
    // Machine-readable, for apps and tests that start the server on port 0.
    println!("listening on http://{local}");

    let app = router(Arc::clone(&state));
    let timeouts = conn::Timeouts {
        header: timeout(args.header_timeout),
        read: timeout(args.read_timeout),
        keep_alive: timeout(args.keep_alive_timeout),
    };
    let server = conn::serve(listener, app, timeouts, refused, stop_rx.clone());
    // Connections that stay open after their rows were cancelled (a client not reading) must
    // not keep the process alive.
    let mut deadline = stop_rx;
    let hard_stop = async move {
        let _ = deadline.wait_for(|stop| *stop).await;
        tokio::time::sleep(grace + Duration::from_secs(5)).await;
    };
    tokio::select! {
        _ = server => Ok(()),
        _ = hard_stop => {
            eprintln!("weft serve: connections still open after the shutdown timeout; exiting");
            Ok(())
        }
    }
}

/// SIGINT / SIGTERM: stop accepting, give running requests `grace` to finish, cancel the rest.
/// A second signal cancels at once.
async fn watch_signals(
    state: Arc<AppState>,
    mut signals: Signals,
    stop: tokio::sync::watch::Sender<bool>,
    grace: Duration,
    info: bool,
) {
    signals.recv().await;
    state.shutting_down.store(true, Ordering::SeqCst);
    let running = state.in_flight_count();
    if info {
        eprintln!("weft serve: shutting down ({running} request(s) running, {:.0}s to finish)", grace.as_secs_f64());
    }
    let _ = stop.send(true);
    tokio::select! {
        _ = tokio::time::sleep(grace) => {}
        _ = signals.recv() => {}
    }
    let n = state.cancel_all();
    if n > 0 && info {
        eprintln!("weft serve: cancelled {n} unfinished request(s)");
    }
}

/// SIGINT and SIGTERM, registered when created: before the address is announced, so a
/// supervisor that signals right after reading it never hits the default (fatal) action.
struct Signals {
    #[cfg(unix)]
    int: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    term: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    fn new() -> Self {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Signals { int: signal(SignalKind::interrupt()).ok(), term: signal(SignalKind::terminate()).ok() }
        }
        #[cfg(not(unix))]
        Signals {}
    }

    async fn recv(&mut self) {
        #[cfg(unix)]
        {
            if let (Some(int), Some(term)) = (self.int.as_mut(), self.term.as_mut()) {
                tokio::select! {
                    _ = int.recv() => {}
                    _ = term.recv() => {}
                }
                return;
            }
        }
        let _ = tokio::signal::ctrl_c().await;
    }
}

fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(openai::chat_completions).fallback(method_not_allowed))
        .route("/chat/completions", post(openai::chat_completions).fallback(method_not_allowed))
        .route("/v1/completions", post(openai::completions).fallback(method_not_allowed))
        .route("/v1/models", get(openai::models).fallback(method_not_allowed))
        .route("/v1/models/{*id}", get(openai::model).fallback(method_not_allowed))
        .route("/v1/responses", post(responses::create).fallback(method_not_allowed))
        .route("/v1/responses/{id}", get(responses::retrieve).delete(responses::delete).fallback(method_not_allowed))
        .route("/v1/responses/{id}/input_items", get(responses::input_items).fallback(method_not_allowed))
        .route("/v1/messages", post(anthropic::messages).fallback(method_not_allowed))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens).fallback(method_not_allowed))
        .route("/health", get(health).fallback(method_not_allowed))
        .route("/stats", get(stats).fallback(method_not_allowed))
        .route("/metrics", get(prometheus).fallback(method_not_allowed))
        .route("/slots/{id}", post(slots::slot).fallback(method_not_allowed))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(Arc::clone(&state), gate))
        .with_state(state)
}

fn protocol_of(path: &str) -> Protocol {
    if path.starts_with("/v1/messages") {
        Protocol::Anthropic
    } else {
        Protocol::OpenAi
    }
}

fn endpoint_of(path: &str) -> &'static str {
    match path {
        "/v1/chat/completions" | "/chat/completions" => "chat_completions",
        "/v1/completions" => "completions",
        "/v1/messages" => "messages",
        "/v1/messages/count_tokens" => "count_tokens",
        "/v1/responses" => "responses",
        p if p.starts_with("/v1/responses/") => "responses",
        "/health" => "health",
        "/stats" => "stats",
        "/metrics" => "metrics",
        p if p.starts_with("/slots/") => "slots",
        p if p.starts_with("/v1/models") => "models",
        _ => "other",
    }
}

async fn not_found(req: Request) -> Response {
    let path = req.uri().path().to_string();
    ApiError::new(ErrorKind::NotFound, format!("no such endpoint: {} {path}", req.method()))
        .into_response(protocol_of(&path))
}

async fn method_not_allowed(req: Request) -> Response {
    let path = req.uri().path().to_string();
    ApiError::new(ErrorKind::MethodNotAllowed, format!("{} is not allowed on {path}", req.method()))
        .into_response(protocol_of(&path))
}

/// Every request: the `Host` and `Origin` checks, CORS preflight and headers, the API key,
/// per-endpoint counts and logging.
async fn gate(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    let origin = req.headers().get(header::ORIGIN).cloned();
    let request_headers = req.headers().get(header::ACCESS_CONTROL_REQUEST_HEADERS).cloned();
    let endpoint = endpoint_of(&path);
    let protocol = protocol_of(&path);
    let access = &state.access;
    let host = req.headers().get(header::HOST).map(|h| h.to_str().unwrap_or("\u{fffd}"));
    let origin_ok = origin.as_ref().is_none_or(|o| o.to_str().is_ok_and(|o| access.origins.allows(o)));
    let mut response = if !access.hosts.allows(host) {
        ApiError::new(
            ErrorKind::Forbidden,
            "this server only answers requests addressed to a loopback name (Host header); see --allowed-hosts",
        )
        .into_response(protocol)
    } else if !origin_ok {
        ApiError::new(
            ErrorKind::Forbidden,
            "requests from this browser origin are not allowed; see --allowed-origins",
        )
        .into_response(protocol)
    } else if method == Method::OPTIONS {
        StatusCode::NO_CONTENT.into_response()
    } else if let (Some(expected), false) = (access.api_key.as_deref(), path == "/health") {
        match security::presented_key(req.headers()) {
            Some(k) if security::same_key(k, expected) => next.run(req).await,
            Some(_) => ApiError::new(ErrorKind::Authentication, "invalid API key")
                .with_code("invalid_api_key")
                .into_response(protocol),
            None => ApiError::new(
                ErrorKind::Authentication,
                "missing API key: send `Authorization: Bearer KEY` or `x-api-key: KEY`",
            )
            .with_code("invalid_api_key")
            .into_response(protocol),
        }
    } else {
        next.run(req).await
    };
    let status = response.status().as_u16();
    state.metrics.count_http(endpoint, status);
    if state.verbose || status >= 500 {
        eprintln!("weft serve: {method} {path} -> {status}");
    }
    if origin_ok {
        security::cors_headers(&access.origins, origin.as_ref(), request_headers.as_ref(), response.headers_mut());
    }
    response
}

async fn health(State(state): State<Arc<AppState>>) -> Response {
    if state.shutting_down.load(Ordering::SeqCst) {
        return json_response(StatusCode::SERVICE_UNAVAILABLE, &json!({"status": "shutting_down"}));
    }
    if let Err(e) = state.engine.health() {
        return json_response(StatusCode::SERVICE_UNAVAILABLE, &json!({"status": "failed", "error": e.to_string()}));
    }
    json_response(StatusCode::OK, &json!({"status": "ok", "model": state.model_id}))
}

async fn stats(State(state): State<Arc<AppState>>) -> Response {
    json_response(StatusCode::OK, &state.metrics.stats_json(&state.engine.stats(), &state.model_id))
}

async fn prometheus(State(state): State<Arc<AppState>>) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        state.metrics.render(&state.engine.stats(), &state.model_id),
    )
        .into_response()
}


/// Writes one log line to stderr in a single write: ranks started by this process share its
/// stderr, and `eprintln!` writes a formatted line piece by piece, so lines could interleave.
pub(crate) fn log_line(line: &str) {
    use std::io::Write as _;
    let _ = std::io::stderr().write_all(format!("{line}\n").as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_like_mlx_lm() {
        assert_eq!(parse_bytes("512MB"), Ok(512_000_000));
        assert_eq!(parse_bytes("2G"), Ok(2_000_000_000));
        assert_eq!(parse_bytes("1024"), Ok(1024));
        assert_eq!(parse_gb("1.5"), Ok(1_500_000_000));
        assert_eq!(parse_gb("300KB"), Ok(300_000));
        assert!(parse_gb("0").is_err());
        assert!(parse_bytes("12 parsecs").is_err());
    }

    #[test]
    fn timeouts_parse_as_seconds() {
        assert_eq!(parse_seconds("10"), Ok(10.0));
        assert_eq!(parse_seconds("2.5s"), Ok(2.5));
        assert_eq!(parse_seconds("0"), Ok(0.0));
        assert!(parse_seconds("-1").is_err() && parse_seconds("soon").is_err() && parse_seconds("inf").is_err());
        assert_eq!(parse_template_args(r#"{"enable_thinking": false}"#).unwrap()["enable_thinking"], false);
        assert!(parse_template_args("[1]").is_err() && parse_template_args("{").is_err());
        assert_eq!(timeout(0.0), None);
        assert_eq!(timeout(1.5), Some(Duration::from_millis(1500)));
    }

    #[test]
    fn served_ids_are_short() {
        let (id, aliases) = model_names(Some(Path::new("models/tiny.gguf")), Path::new("models/tiny.gguf"), None);
        assert_eq!(id, "tiny");
        assert!(aliases.contains(&"models/tiny.gguf".to_string()) && aliases.contains(&"default_model".to_string()));
        let (id, _) = model_names(None, Path::new("models/tiny.gguf"), Some("mine"));
        assert_eq!(id, "mine");
    }
}
