//! The native half of the `weft` npm package (napi-rs v3): an [`Engine`] class wrapping
//! `weft::engine::Engine`, and [`Generation`], the async iterator one `generate` call returns.
//!
//! Threading: the engine's driver thread calls each request's sink. The sink never waits on
//! JavaScript: it appends the event to the request's own queue (or hands it straight to a
//! pending `next()` promise, settled through a threadsafe function), so one slow consumer never
//! stalls the batch. JavaScript pulls tokens with `next()`; a row's queue is bounded by its
//! `maxTokens`. Cancellation (`break`, `return()`, `cancel()`, an aborted `signal`, `close()`,
//! garbage collection of an unfinished `Generation`) reaches the engine's `cancel`, and the sink
//! also answers `false` from then on so the row is evicted at its next token.
//!
//! Tokenization and chat-template rendering never run on the JS thread: `generate` /
//! `complete` run the contract's cheap checks there (so bad options still throw or reject at
//! once), and a request whose prompt is text or messages is tokenized by the engine's
//! [`Preparer`] thread, which then queues it; token-id prompts are queued at once.

mod js;
mod options;

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Weak};

use napi::bindgen_prelude::{AsyncTask, Either, FromNapiValue, ObjectFinalize, PromiseRaw, ToNapiValue, Unknown};
use napi::threadsafe_function::{ThreadsafeFunction, ThreadsafeFunctionCallMode};
use napi::{sys, Env, JsDeferred, JsValue, Task};
use napi_derive::napi;
use parking_lot::Mutex;

use weft::engine::{CheckedRequest, Event, FlowQueue, RowFlow, Submitter};
use weft::generate::FinishReason as WeftFinish;

use crate::js::{Fail, JsRef, Raw, Res};

// ---------------------------------------------------------------------------------------------
// Public object types (also the source of index.d.ts).

/// Options for {@link Engine.load}.
#[napi(object, object_to_js = false)]
pub struct LoadOptions {
    /// An mlx-lm model directory or a `.gguf` file, or a Hugging Face repo id
    /// (`org/repo[@revision][:file]`, fetched into the Hugging Face cache; see `onProgress`).
    /// Omitted: the default model (SmolLM2-135M-Instruct), downloaded and verified on first use.
    pub model: Option<String>,
    /// CPU kernels of this engine's model: `'fast'` (Weft's) or `'exact'` (MLX's own, bit for bit
    /// mlx-lm). Omitted: `WEFT_CPU_KERNELS` if set, else fast. Engines in one process may differ.
    #[napi(ts_type = "'fast' | 'exact'")]
    pub cpu_kernels: Option<String>,
    /// What fast mode's quantized matmul multiplies the weights with below 16 rows (decode):
    /// `'int8'` (llama.cpp-style activations, as close to exact mode as llama.cpp) or `'float'`
    /// (slower, closer). Omitted: `WEFT_CPU_ACTIVATIONS` if set, else int8.
    #[napi(ts_type = "'float' | 'int8'")]
    pub cpu_activations: Option<String>,
    /// GGUF block types MLX's reader lacks: `'native'` (kept quantized) or `'dequantize'` (all
    /// float32). Omitted: `WEFT_GGUF_WEIGHTS` if set, else native.
    #[napi(ts_type = "'native' | 'dequantize'")]
    pub gguf_weights: Option<String>,
    /// Rows decoding together (default 8).
    pub max_batch: Option<u32>,
    /// Requests admitted to prefill at once (default 8).
    pub prompt_concurrency: Option<u32>,
    /// Prompt tokens per prefill chunk; decode steps interleave between chunks (default 2048).
    pub prefill_step_size: Option<u32>,
    /// Projected KV-cache bytes allowed across admitted rows (default: no limit).
    pub kv_budget_bytes: Option<f64>,
    /// Bytes of KV kept for prompt-prefix reuse, finished rows and their chat-boundary
    /// checkpoints (0: off; default: sized from the memory left after loading the model).
    pub prompt_cache_bytes: Option<f64>,
    /// Store keys and values affine-quantized to this many bits (2, 3, 4, 5, 6 or 8). Default:
    /// full precision, the mode that matches mlx-lm token for token.
    pub kv_bits: Option<u32>,
    /// Elements per KV quantization group: 32, 64 (default) or 128; must divide the head size.
    pub kv_group_size: Option<u32>,
    /// Positions a row holds in full precision before its KV is quantized (default 0).
    pub quantized_kv_start: Option<u32>,
    /// Largest buffer cache (freed buffers kept for reuse) MLX keeps (default: MLX's).
    pub cache_limit_bytes: Option<f64>,
    /// Return MLX's buffer cache every this many decode steps (default 256; 0: only when idle).
    pub clear_cache_every_steps: Option<f64>,
    /// MLX's memory limit, >= 1 (default: MLX's).
    pub memory_limit_bytes: Option<f64>,
    /// Memory MLX may keep wired on Apple GPUs; ignored elsewhere (default: MLX's).
    pub wired_limit_bytes: Option<f64>,
    /// Which local files requests may name as images / audio: `'any'` (default), `'deny'`, or
    /// `{ dirs: [...] }` (files under these directories only).
    #[napi(ts_type = "'any' | 'deny' | { dirs: string[] }")]
    pub local_media: Option<bool>,
    /// Chat-template variables every request starts from (e.g. `{ enable_thinking: false }`).
    #[napi(ts_type = "Record<string, unknown>")]
    pub chat_template_kwargs: Option<bool>,
    /// Reasoning tokens allowed when a request names no `reasoningBudget` (default: unbounded).
    pub reasoning_budget: Option<u32>,
    /// Prompt-lookup speculative decoding for requests that name no `numDraftTokens`: draft up
    /// to this many tokens per step, 0 to 64 (default 0: off).
    pub num_draft_tokens: Option<u32>,
    /// Draft model for speculative decoding (a local model path sharing the tokenizer): drafts
    /// `numDraftTokens` tokens per step (default 3) instead of prompt lookup.
    pub draft_model: Option<String>,
    /// Hears about the model's download, on the JS thread, at most every ~100 ms per phase plus
    /// once when a phase starts and ends (nothing when the model is already on disk). The load
    /// waits for each call, so every report arrives before the promise settles.
    #[napi(ts_type = "(progress: DownloadProgress) => void")]
    pub on_progress: Option<bool>,
    /// Aborting it cancels a Hugging Face download: the promise rejects with a `WeftError` of
    /// code `CANCELLED`; what was received stays in the cache's `.incomplete` file (never under a
    /// name that loads) and a later load resumes it.
    #[napi(ts_type = "AbortSignal")]
    pub signal: Option<bool>,
}

/// One report of a model download, as {@link LoadOptions.onProgress} receives it.
#[napi(object)]
pub struct DownloadProgress {
    /// `waiting` (another process is downloading the same file), `downloading`, `verifying`
    /// (hashing a local file), `extracting` (unpacking the default model), `done` (once, at the end).
    #[napi(ts_type = "'waiting' | 'downloading' | 'verifying' | 'extracting' | 'done'")]
    pub phase: String,
    /// Bytes done in this phase (a repo's small files, then its weights, each count from 0).
    pub downloaded: f64,
    /// Bytes the phase will reach, when known.
    pub total: Option<f64>,
}

impl From<weft::model_store::Progress> for DownloadProgress {
    fn from(p: weft::model_store::Progress) -> Self {
        use weft::model_store::Phase;
        let phase = match p.phase {
            Phase::Waiting => "waiting",
            Phase::Downloading => "downloading",
            Phase::Verifying => "verifying",
            Phase::Extracting => "extracting",
            Phase::Done => "done",
        };
        DownloadProgress { phase: phase.into(), downloaded: p.downloaded as f64, total: p.total.map(|t| t as f64) }
    }
}

/// One turn of a conversation.
#[napi(object)]
pub struct ChatMessage {
    /// `"system"`, `"user"`, `"assistant"`, `"tool"`... as the model's chat template expects.
    pub role: String,
    /// May be `null` on an assistant turn that only calls tools.
    #[napi(ts_type = "string | null")]
    pub content: Option<String>,
    /// An assistant turn's calls, in OpenAI's shape (a {@link ToolCall} `c` is `{ id: c.id,
    /// type: 'function', function: { name: c.name, arguments: c.arguments } }`).
    #[napi(ts_type = "Array<{ id: string; type: 'function'; function: { name: string; arguments: string | Record<string, unknown> } }>")]
    pub tool_calls: Option<Vec<bool>>,
    /// A `tool` turn: the id of the call it answers.
    pub tool_call_id: Option<String>,
    /// A `tool` turn: the function's name (optional).
    pub name: Option<String>,
    /// An assistant turn's reasoning, for templates that show it in history.
    pub reasoning_content: Option<String>,
}

/// A tool the model may call (OpenAI's function shape).
#[napi(object, object_to_js = false)]
pub struct Tool {
    #[napi(js_name = "type", ts_type = "'function'")]
    pub kind: String,
    #[napi(ts_type = "{ name: string; description?: string; parameters?: Record<string, unknown> }")]
    pub function: bool,
}

/// Options for {@link Engine.generate} and {@link Engine.complete}. Exactly one of `messages`,
/// `prompt` or `promptIds` is required.
#[napi(object, object_to_js = false)]
pub struct GenerateOptions {
    /// A conversation, rendered with the model's chat template.
    pub messages: Option<Vec<ChatMessage>>,
    /// Raw text, tokenized as is.
    pub prompt: Option<String>,
    /// Token ids.
    pub prompt_ids: Option<Vec<u32>>,
    /// Most tokens to generate (default 256).
    pub max_tokens: Option<u32>,
    /// 0 (the default) is greedy.
    pub temperature: Option<f64>,
    /// Nucleus sampling threshold in (0, 1]; 1 (default) disables.
    pub top_p: Option<f64>,
    /// Keep the k most likely tokens; 0 (default) disables.
    pub top_k: Option<u32>,
    /// Drop tokens below `minP × p(top token)`; 0 (default) disables.
    pub min_p: Option<f64>,
    pub repetition_penalty: Option<f64>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    /// How many recent tokens the penalties look at (default 20).
    pub penalty_context: Option<u32>,
    /// Additive bias per token id; `-Infinity` bans a token.
    #[napi(ts_type = "Record<number, number>")]
    pub logit_bias: Option<HashMap<String, f64>>,
    /// Makes sampling reproducible.
    pub seed: Option<f64>,
    /// Stop strings: generation ends before the first match, which is cut from the text.
    #[napi(ts_type = "string | string[]")]
    pub stop: Option<Vec<String>>,
    /// Keep going past the model's end-of-sequence tokens.
    pub ignore_eos: Option<bool>,
    /// Report each generated token's log-probability (`Chunk.logprob`, `Completion.logprobs`).
    pub logprobs: Option<bool>,
    /// Also report this many most likely alternatives per token (0 to 20; needs `logprobs`).
    pub top_logprobs: Option<u32>,
    /// Constrains the output, OpenAI's shape: `{ type: 'json_object' }`, or `{ type:
    /// 'json_schema', json_schema: { name, schema, strict } }`; `{ type: 'text' }` is none.
    /// At most one of `responseFormat`, `jsonSchema`, `regex`, `grammar`, `choice`.
    #[napi(
        ts_type = "{ type: 'text' | 'json_object' } | { type: 'json_schema'; json_schema: { name: string; schema?: Record<string, unknown> | boolean; strict?: boolean; description?: string } }"
    )]
    pub response_format: Option<bool>,
    /// A JSON schema the output must validate against.
    #[napi(ts_type = "Record<string, unknown> | boolean")]
    pub json_schema: Option<bool>,
    /// A regular expression the whole output must match.
    pub regex: Option<String>,
    /// A grammar in llguidance's Lark syntax (may embed `%json {schema}`).
    pub grammar: Option<String>,
    /// The output is exactly one of these strings.
    pub choice: Option<Vec<String>>,
    /// Tools the model may call; its calls arrive as `toolCalls` in chunks and the completion
    /// (docs/tools.md). Needs `messages`.
    pub tools: Option<Vec<Tool>>,
    /// `'auto'` (default), `'none'`, `'required'` (a call is forced) or a named function
    /// (`{ type: 'function', function: { name } }`, forced); forced calls are grammar-constrained.
    #[napi(ts_type = "'auto' | 'none' | 'required' | { type: 'function'; function: { name: string } }")]
    pub tool_choice: Option<bool>,
    /// `false` ends generation after the first complete call (default `true`).
    pub parallel_tool_calls: Option<bool>,
    /// Variables for the chat template, over the engine's (`{ enable_thinking: false }` turns a
    /// reasoning model's thinking off).
    #[napi(ts_type = "Record<string, unknown>")]
    pub chat_template_kwargs: Option<bool>,
    /// Reasoning tokens the model may spend before its reasoning block is closed for it and the
    /// answer begins (`Chunk.reasoning`); default: the engine's, else unbounded.
    pub reasoning_budget: Option<u32>,
    /// Prompt-lookup speculative decoding: draft up to this many tokens per step, 0 to 64 (0:
    /// off); default: the engine's `numDraftTokens`. Greedy output is unchanged, sampled output
    /// keeps its distribution.
    pub num_draft_tokens: Option<u32>,
    /// Images for a model with a vision tower (`modelInfo.vision`), in prompt order: a file's
    /// bytes (`Uint8Array` / `Buffer`), a local file path or a `data:` URL. The prompt holds the
    /// model's image marker once per image (docs/node.md).
    #[napi(ts_type = "Array<Uint8Array | string>")]
    pub images: Option<bool>,
    /// Audio clips (WAV / MP3 / FLAC / Ogg, at most 30 s each) for a model with an audio tower
    /// (`modelInfo.audio`), in prompt order, as `images`. The prompt holds the model's audio
    /// token once per clip.
    #[napi(ts_type = "Array<Uint8Array | string>")]
    pub audio: Option<bool>,
    /// Aborting it cancels the request in the engine; the stream then ends normally with
    /// `finishReason: "cancelled"` (nothing is thrown).
    #[napi(ts_type = "AbortSignal")]
    pub signal: Option<bool>,
}

/// One streamed piece of output.
#[napi(object)]
pub struct Chunk {
    /// Text this token completes (may be empty while a multi-byte character or a possible stop
    /// string is held back).
    pub text: String,
    /// The reasoning ("thinking") text this token completes, for a model whose template marks
    /// reasoning: kept apart from `text`, markers removed. Absent when there is none.
    pub reasoning: Option<String>,
    /// The generated token; absent on a last chunk that only carries text held back when the
    /// request ended.
    pub token_id: Option<u32>,
    /// With `logprobs: true`: the token's natural-log probability (after logit bias and
    /// penalties, before temperature). Absent otherwise and on a held-back-text chunk.
    pub logprob: Option<f64>,
    /// With `logprobs: true`: the `topLogprobs` most likely tokens at this step, best first
    /// (empty when `topLogprobs` is 0).
    pub top_logprobs: Option<Vec<TokenLogprob>>,
    /// With `tools`: the pieces of tool calls this chunk adds, in order (a call's text is never
    /// in `text`). Absent when there are none. Assembling every chunk's pieces gives the
    /// completion's `toolCalls`.
    pub tool_calls: Option<Vec<ToolCallDelta>>,
}

/// A streamed piece of a tool call, as OpenAI streams `delta.tool_calls`: the first piece of a
/// call has its `id` and `name`; later pieces carry `arguments` fragments whose concatenation
/// is the call's arguments JSON text.
#[napi(object)]
#[derive(Clone)]
pub struct ToolCallDelta {
    /// Which call of the output (0-based, in the order the model wrote them).
    pub index: u32,
    /// The call's id (`call_` + 24 letters or digits), on its first piece.
    pub id: Option<String>,
    /// The function's name, on the call's first piece.
    pub name: Option<String>,
    /// The next fragment of the arguments' JSON text.
    pub arguments: Option<String>,
}

/// A complete tool call.
#[napi(object)]
#[derive(Clone)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// The arguments as JSON text (an object; `JSON.parse` it).
    pub arguments: String,
}

/// One of the most likely tokens at a step.
#[napi(object)]
#[derive(Clone)]
pub struct TokenLogprob {
    pub token_id: u32,
    /// Natural-log probability.
    pub logprob: f64,
}

/// A generated token's log-probability and the most likely alternatives at its step.
#[napi(object)]
#[derive(Clone)]
pub struct TokenLogprobs {
    pub token_id: u32,
    pub logprob: f64,
    /// Best first; empty when `topLogprobs` is 0.
    pub top_logprobs: Vec<TokenLogprob>,
}

/// Why a request ended: `"stop"` (an end-of-sequence token, a stop string or a complete
/// constraint), `"length"` (`maxTokens` or the model's context length), `"cancelled"`
/// (`break`, `return()`, `cancel()`, an aborted signal or `close()`) or `"tool_calls"` (a
/// request with `tools` stopped after making calls).
#[napi(string_enum = "snake_case")]
#[derive(Clone, Copy)]
pub enum FinishReason {
    /// An end-of-sequence token or a stop string.
    Stop,
    /// `maxTokens` or the model's context length.
    Length,
    /// `break`, `return()`, `cancel()`, an aborted signal or `close()`.
    Cancelled,
    /// A request with `tools` stopped after making calls (`Completion.toolCalls`).
    ToolCalls,
}

#[napi(object)]
#[derive(Clone)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    /// Prompt tokens whose KV came from the prompt cache.
    pub cached_tokens: u32,
    /// Completion tokens spent reasoning (the reasoning block and its markers).
    pub reasoning_tokens: u32,
}

/// The result of {@link Engine.complete}, and {@link Generation.summary} once a stream ended.
#[napi(object)]
pub struct Completion {
    pub text: String,
    /// The model's reasoning, apart from `text` (absent for a model without reasoning or when
    /// it reasoned nothing).
    pub reasoning: Option<String>,
    /// Generated token ids (an end-of-sequence token that stopped generation is not included).
    pub token_ids: Vec<u32>,
    pub finish_reason: FinishReason,
    pub usage: Usage,
    /// With `logprobs: true`: one entry per generated token, in the order of `tokenIds`.
    pub logprobs: Option<Vec<TokenLogprobs>>,
    /// With `tools`: every call the output made, complete (empty when it made none; a call the
    /// output did not finish is not delivered).
    pub tool_calls: Option<Vec<ToolCall>>,
}

/// A snapshot of the engine's scheduler and counters.
#[napi(object)]
pub struct EngineStats {
    pub active_rows: u32,
    pub queued_rows: u32,
    pub prefilling_rows: u32,
    pub kv_bytes_in_use: f64,
    /// Absent when there is no KV budget.
    pub kv_budget_bytes: Option<f64>,
    pub prompt_cache_bytes: f64,
    pub prompt_cache_entries: u32,
    pub prompt_cache_hits: f64,
    /// Prompt tokens served from the prompt cache (summed over its hits).
    pub prompt_cache_cached_tokens: f64,
    /// The most the prompt cache holds (0: off).
    pub prompt_cache_capacity_bytes: f64,
    /// Entries dropped to stay under the capacity or to make room for running requests.
    pub prompt_cache_evictions: f64,
    /// Files of `promptCacheDir` refused at load, each with why.
    pub prompt_cache_files_refused: Vec<String>,
    pub tokens_generated: f64,
    pub decode_steps: f64,
    pub requests_finished: f64,
    /// Rows parked because their stream went unread (see `generate`).
    pub paused_rows: u32,
    /// Speculative decoding (`numDraftTokens`): draft tokens verified and accepted.
    pub draft_tokens: f64,
    pub draft_tokens_accepted: f64,
}

/// A prompt-cache entry written by `savePromptCache` or read by `loadPromptCache`.
#[napi(object)]
pub struct PromptCacheEntry {
    /// The tokens the entry holds.
    pub tokens: u32,
    /// The file's size.
    pub bytes: f64,
}

#[napi(object)]
#[derive(Clone)]
pub struct ModelInfo {
    /// The resolved model path.
    pub path: String,
    /// `config.json`'s `model_type` (`llama`, `qwen3`...).
    pub model_type: String,
    pub vocab_size: u32,
    pub num_layers: u32,
    /// Longest context the model was trained for, when its config says.
    pub context_length: Option<u32>,
    /// Whether the model has a tokenizer (else only `promptIds` work).
    pub has_tokenizer: bool,
    /// The model takes images (`images`): it has a vision tower Weft runs.
    pub vision: bool,
    /// The model takes audio (`audio`): it has an audio tower Weft runs.
    pub audio: bool,
}

// ---------------------------------------------------------------------------------------------
// Registration hook used by index.js.

/// index.js registers its `WeftError` class so native errors are `instanceof WeftError`.
#[napi(js_name = "__registerErrorClass", skip_typescript)]
pub fn register_error_class(env: Env, ctor: Unknown) -> napi::Result<()> {
    js::register_error_class(env.raw(), ctor.raw()).map_err(|f| js::to_napi(env.raw(), &f))
}

// ---------------------------------------------------------------------------------------------
// Engine

struct Shared {
    engine: Mutex<Option<weft::engine::Engine>>,
    preparer: Preparer,
    info: ModelInfo,
}

impl Shared {
    /// Cancels the row's request once it is in the engine; a row still being prepared is
    /// cancelled by the preparer as soon as it has been queued (it reads `row.cancelled`).
    fn cancel(&self, row: &Row) {
        row.cancelled.store(true, Ordering::SeqCst);
        let id = row.id.load(Ordering::SeqCst);
        if id != 0 {
            if let Some(e) = self.engine.lock().as_ref() {
                e.cancel(id);
            }
        }
    }
}

/// Work for the preparer thread, in the order `generate` / `complete` / `close` were called.
enum Job {
    /// Tokenize (or render the chat template of) a checked request and queue it for its row.
    Submit(CheckedRequest, Arc<Row>),
    /// Answered once every earlier job is done (`close` waits for it before shutting down).
    Barrier(mpsc::Sender<()>),
}

/// One thread per engine that tokenizes requests off the JS thread and queues them. It ends
/// when the engine object is freed (its channel closes).
struct Preparer {
    tx: mpsc::Sender<Job>,
}

impl Preparer {
    fn start(submitter: Submitter) -> Res<Preparer> {
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("weft-node-prepare".into())
            .spawn(move || {
                for job in rx {
                    match job {
                        Job::Submit(checked, row) => queue_row(&submitter, checked, &row),
                        Job::Barrier(done) => {
                            let _ = done.send(());
                        }
                    }
                }
            })
            .map_err(|e| Fail::new("INTERNAL", format!("cannot start the tokenizer thread: {e}")))?;
        Ok(Preparer { tx })
    }

    fn barrier(&self) -> mpsc::Receiver<()> {
        let (done, wait) = mpsc::channel();
        let _ = self.tx.send(Job::Barrier(done));
        wait
    }
}

/// Queues a checked request for `row` (tokenizing it first when it needs it); a request the
/// engine refuses (a prompt longer than the context, over the KV budget, a template error, a
/// closed engine) ends the row with that error and its own code.
fn queue_row(submitter: &Submitter, checked: CheckedRequest, row: &Arc<Row>) {
    let sink_row = Arc::clone(row);
    let sink: weft::engine::Sink = Box::new(move |ev: &Event| on_event(&sink_row, ev));
    match submitter.submit_checked(checked, sink, Some(row.flow.clone())) {
        Ok(id) => {
            row.id.store(id, Ordering::SeqCst);
            if row.cancelled.load(Ordering::SeqCst) {
                submitter.cancel(id);
            }
        }
        Err(e) => {
            let mut st = row.state.lock();
            st.end = Some(End::Failed(Fail::from(e)));
            flush_end(&mut st, row.serial);
        }
    }
}

/// A loaded model served by a continuous-batching engine. Create one with {@link Engine.load};
/// concurrent `generate` / `complete` calls share its batch.
#[napi]
pub struct Engine {
    shared: Arc<Shared>,
}

type ProgressFn = ThreadsafeFunction<DownloadProgress, Unknown<'static>, DownloadProgress, napi::Status, false>;

pub struct LoadTask {
    params: Option<options::LoadParams>,
    /// `onProgress`, callable from the loading thread (released when the download is over).
    progress: Option<ProgressFn>,
    /// Set by the `signal`'s abort listener (registered under `serial`).
    cancel: Arc<AtomicBool>,
    serial: u64,
    fail: Option<Fail>,
}

impl LoadTask {
    /// Calls `onProgress` and waits until JavaScript ran it (reports stay in order and all
    /// arrive before the promise settles; a load never outruns its listener).
    fn report(progress: &ProgressFn, p: weft::model_store::Progress) {
        let (tx, rx) = mpsc::channel::<()>();
        let status = progress.call_with_return_value(p.into(), ThreadsafeFunctionCallMode::Blocking, move |_, _| {
            let _ = tx.send(());
            Ok(())
        });
        if status == napi::Status::Ok {
            // A dropped callback (the environment is going away) also ends the wait.
            let _ = rx.recv();
        }
    }
}

impl Task for LoadTask {
    type Output = (weft::engine::Engine, ModelInfo);
    type JsValue = Engine;

    fn compute(&mut self) -> napi::Result<Self::Output> {
        let params = self.params.take().expect("load runs once");
        let progress = self.progress.take();
        let mut report = |p| {
            if let Some(f) = &progress {
                LoadTask::report(f, p);
            }
        };
        let loaded = load_engine(params, &mut report, &self.cancel);
        drop(progress);
        loaded.map_err(|f| {
            let e = napi::Error::from_reason(f.message.clone());
            self.fail = Some(f);
            e
        })
    }

    fn resolve(&mut self, env: Env, (engine, info): Self::Output) -> napi::Result<Engine> {
        release_listener(env.raw(), self.serial);
        let preparer = Preparer::start(engine.submitter()).map_err(|f| js::to_napi(env.raw(), &f))?;
        Ok(Engine { shared: Arc::new(Shared { engine: Mutex::new(Some(engine)), preparer, info }) })
    }

    fn reject(&mut self, env: Env, err: napi::Error) -> napi::Result<Engine> {
        release_listener(env.raw(), self.serial);
        let fail = self.fail.take().unwrap_or_else(|| Fail::new("INTERNAL", err.reason.clone()));
        Err(js::to_napi(env.raw(), &fail))
    }
}

fn load_engine(
    params: options::LoadParams,
    progress: &mut dyn FnMut(weft::model_store::Progress),
    cancel: &AtomicBool,
) -> Res<(weft::engine::Engine, ModelInfo)> {
    let fetched = params.options.model_path(progress, cancel);
    if cancel.load(Ordering::SeqCst) {
        let why = fetched.err().map(|e| format!(": {e}")).unwrap_or_default();
        return Err(Fail::new("CANCELLED", format!("the model download was cancelled by the signal{why}")));
    }
    let path = fetched.map_err(Fail::loading)?;
    let loaded = weft::loading::load_with(&path, &params.load).map_err(Fail::loading)?;
    let engine = weft::engine::Engine::start(loaded, params.config)?;
    let i = engine.model_info();
    let info = ModelInfo {
        path: path.display().to_string(),
        model_type: i.model_type.clone(),
        vocab_size: i.vocab_size.max(0) as u32,
        num_layers: i.num_layers as u32,
        context_length: i.max_position_embeddings.map(|n| n.min(u32::MAX as usize) as u32),
        has_tokenizer: engine.tokenizer().is_some(),
        vision: engine.vision().is_some(),
        audio: engine.audio().is_some(),
    };
    Ok((engine, info))
}

/// `savePromptCache` / `loadPromptCache` on a worker thread (the engine runs it between two
/// steps).
pub struct CacheFileTask {
    submitter: Submitter,
    path: std::path::PathBuf,
    prompt: Option<weft::engine::Request>,
    save: bool,
    fail: Option<Fail>,
}

impl Task for CacheFileTask {
    type Output = weft::engine::SavedEntryInfo;
    type JsValue = PromptCacheEntry;

    fn compute(&mut self) -> napi::Result<Self::Output> {
        let out = if self.save {
            match self.submitter.save_prompt_cache_entry(self.prompt.take(), &self.path) {
                Ok(Some(info)) => Ok(info),
                Ok(None) => Err(Fail::new("NOT_FOUND", "the prompt cache holds no entry to save (for this prompt)")),
                Err(e) => Err(Fail::from(e)),
            }
        } else if !self.path.is_file() {
            Err(Fail::new("NOT_FOUND", format!("no file {}", self.path.display())))
        } else {
            self.submitter.load_prompt_cache_entry(&self.path).map_err(Fail::from)
        };
        out.map_err(|f| {
            let e = napi::Error::from_reason(f.message.clone());
            self.fail = Some(f);
            e
        })
    }

    fn resolve(&mut self, _env: Env, info: Self::Output) -> napi::Result<PromptCacheEntry> {
        Ok(PromptCacheEntry { tokens: info.tokens as u32, bytes: info.bytes as f64 })
    }

    fn reject(&mut self, env: Env, err: napi::Error) -> napi::Result<PromptCacheEntry> {
        let fail = self.fail.take().unwrap_or_else(|| Fail::new("INTERNAL", err.reason.clone()));
        Err(js::to_napi(env.raw(), &fail))
    }
}

pub struct CloseTask {
    engine: Option<weft::engine::Engine>,
    /// Requests still being tokenized are queued first, so `close` cancels them too.
    prepared: Option<mpsc::Receiver<()>>,
}

impl Task for CloseTask {
    type Output = ();
    type JsValue = ();

    fn compute(&mut self) -> napi::Result<()> {
        if let Some(wait) = self.prepared.take() {
            let _ = wait.recv();
        }
        if let Some(e) = self.engine.take() {
            e.shutdown();
        }
        Ok(())
    }

    fn resolve(&mut self, _env: Env, _: ()) -> napi::Result<()> {
        Ok(())
    }
}

#[napi]
impl Engine {
    /// Loads a model (on a worker thread) and starts its engine.
    /// Invalid options reject with a `WeftError` (`INVALID_ARGUMENT`), a model that cannot be
    /// loaded with `MODEL_LOAD`, `UNSUPPORTED`, `DOWNLOAD`...
    #[napi(ts_args_type = "options?: LoadOptions", ts_return_type = "Promise<Engine>")]
    pub fn load(env: Env, options: Option<Unknown>) -> napi::Result<Either<AsyncTask<LoadTask>, Raw>> {
        let raw = env.raw();
        let task = (|| -> Res<LoadTask> {
            let (params, hooks) = options::load_params(raw, options.map(|o| o.raw()))?;
            let progress = match hooks.on_progress {
                // SAFETY: a function value of this call's environment (checked by load_params).
                Some(f) => Some(unsafe { ProgressFn::from_napi_value(raw, f) }?),
                None => None,
            };
            let cancel = Arc::new(AtomicBool::new(false));
            let serial = NEXT_SERIAL.fetch_add(1, Ordering::Relaxed);
            if let Some(signal) = hooks.signal {
                let flag = Arc::clone(&cancel);
                listen_for_abort(raw, signal, serial, move || flag.store(true, Ordering::SeqCst))?;
            }
            Ok(LoadTask { params: Some(params), progress, cancel, serial, fail: None })
        })();
        match task {
            Ok(task) => Ok(Either::A(AsyncTask::new(task))),
            Err(f) => Ok(Either::B(rejected(&env, &f)?)),
        }
    }

    /// What was loaded.
    #[napi(getter)]
    pub fn model_info(&self) -> ModelInfo {
        self.shared.info.clone()
    }

    /// Whether {@link Engine.close} was called.
    #[napi(getter)]
    pub fn closed(&self) -> bool {
        self.shared.engine.lock().is_none()
    }

    /// Starts a request and returns its token stream: `for await (const chunk of
    /// engine.generate(...))`. Invalid options throw a `WeftError` here, synchronously.
    /// Leaving the loop early (`break`, `return`, an exception) cancels the request.
    #[napi(ts_args_type = "options: GenerateOptions")]
    pub fn generate(&self, env: Env, options: Option<Unknown>) -> napi::Result<Generation> {
        let raw = env.raw();
        self.start(raw, options.map(|o| o.raw()), true).map_err(|f| js::to_napi(raw, &f))
    }

    /// Runs a request to the end and resolves with its text, token ids, finish reason and
    /// usage. Invalid options reject with a `WeftError`.
    #[napi(ts_args_type = "options: GenerateOptions", ts_return_type = "Promise<Completion>")]
    pub fn complete(&self, env: Env, options: Option<Unknown>) -> napi::Result<Raw> {
        let raw = env.raw();
        let result = self.start(raw, options.map(|o| o.raw()), false).and_then(|generation| {
            let mut st = generation.row.state.lock();
            if let Some(end) = st.end.take() {
                // The preparer refused the request before this call got here.
                drop(st);
                return settle_now(&env, &generation.row, end).map(|p| p.0);
            }
            let (deferred, promise) = env.create_deferred::<CompletionResult, Resolver<CompletionResult>>()?;
            st.waiters.push_back(Waiter::Complete(deferred));
            Ok(promise.raw())
        });
        match result {
            Ok(p) => Ok(Raw(p)),
            Err(f) => rejected(&env, &f),
        }
    }

    /// Scheduler state and counters (published after each engine step).
    #[napi]
    pub fn stats(&self, env: Env) -> napi::Result<EngineStats> {
        let guard = self.shared.engine.lock();
        let Some(e) = guard.as_ref() else { return Err(js::to_napi(env.raw(), &Fail::closed())) };
        let s = e.stats();
        Ok(EngineStats {
            active_rows: s.active_rows as u32,
            queued_rows: s.queued_rows as u32,
            prefilling_rows: s.prefilling_rows as u32,
            kv_bytes_in_use: s.kv_bytes_in_use as f64,
            kv_budget_bytes: s.kv_budget_bytes.map(|b| b as f64),
            prompt_cache_bytes: s.prompt_cache_bytes as f64,
            prompt_cache_entries: s.prompt_cache_entries as u32,
            prompt_cache_hits: s.prompt_cache_hits as f64,
            prompt_cache_cached_tokens: s.prompt_cache_cached_tokens as f64,
            prompt_cache_capacity_bytes: s.prompt_cache_capacity_bytes as f64,
            prompt_cache_evictions: s.prompt_cache_evictions as f64,
            prompt_cache_files_refused: s.prompt_cache_files_refused,
            tokens_generated: s.tokens_generated as f64,
            decode_steps: s.decode_steps as f64,
            requests_finished: s.requests_finished as f64,
            paused_rows: s.paused_rows as u32,
            draft_tokens: s.draft_tokens as f64,
            draft_tokens_accepted: s.draft_tokens_accepted as f64,
        })
    }

    /// Saves one prompt-cache entry to the file at `path`, so a fixed preamble is prefilled
    /// once, ever (load it into a later engine with {@link Engine.loadPromptCache}). Without
    /// `prompt` the most recently used entry (after a request, its prompt and answer); with it
    /// (the input of a `generate` call: `messages` with `tools`, `prompt` or `promptIds`) the
    /// cached prefix a request with that input would reuse. Rejects with `NOT_FOUND` when the
    /// cache holds nothing for it, `UNSUPPORTED` when the prompt cache is off.
    #[napi(ts_args_type = "path: string, prompt?: GenerateOptions", ts_return_type = "Promise<PromptCacheEntry>")]
    pub fn save_prompt_cache(&self, env: Env, path: String, prompt: Option<Unknown>) -> napi::Result<Either<AsyncTask<CacheFileTask>, Raw>> {
        let raw = env.raw();
        let task = (|| -> Res<CacheFileTask> {
            let guard = self.shared.engine.lock();
            let engine = guard.as_ref().ok_or_else(Fail::closed)?;
            let prompt = match prompt {
                Some(p) => Some(options::generate_params(raw, Some(p.raw()), &engine.config().local_media)?.request),
                None => None,
            };
            Ok(CacheFileTask { submitter: engine.submitter(), path: path.into(), prompt, save: true, fail: None })
        })();
        match task {
            Ok(task) => Ok(Either::A(AsyncTask::new(task))),
            Err(f) => Ok(Either::B(rejected(&env, &f)?)),
        }
    }

    /// Loads an entry {@link Engine.savePromptCache} wrote into this engine's prompt cache:
    /// later requests whose prompts start with its tokens reuse it, with outputs equal to a
    /// cold run's. A file saved for another model, tokenizer or kernel mode, or truncated or
    /// corrupt, rejects with `INVALID_ARGUMENT` saying why; a missing file with `NOT_FOUND`.
    #[napi(ts_return_type = "Promise<PromptCacheEntry>")]
    pub fn load_prompt_cache(&self, env: Env, path: String) -> napi::Result<Either<AsyncTask<CacheFileTask>, Raw>> {
        let submitter = self.shared.engine.lock().as_ref().map(|e| e.submitter());
        match submitter {
            Some(submitter) => Ok(Either::A(AsyncTask::new(CacheFileTask { submitter, path: path.into(), prompt: None, save: false, fail: None }))),
            None => Ok(Either::B(rejected(&env, &Fail::closed())?)),
        }
    }

    /// Cancels every outstanding request (their streams end with `finishReason: "cancelled"`),
    /// stops the engine thread and frees the model. Later calls are rejected with
    /// `ENGINE_CLOSED`; closing twice is harmless.
    #[napi(ts_return_type = "Promise<void>")]
    pub fn close(&self) -> AsyncTask<CloseTask> {
        let engine = self.shared.engine.lock().take();
        let prepared = engine.is_some().then(|| self.shared.preparer.barrier());
        AsyncTask::new(CloseTask { engine, prepared })
    }

    /// Checks the request here (cheap: bad options fail at once); a token-id prompt is queued
    /// here too, a text or messages prompt by the preparer thread once it is tokenized.
    fn start(&self, env: sys::napi_env, options: Option<sys::napi_value>, stream: bool) -> Res<Generation> {
        // Local media paths are read as the engine's `localMedia` option allows.
        let local = self.shared.engine.lock().as_ref().ok_or_else(Fail::closed)?.config().local_media.clone();
        let params = options::generate_params(env, options, &local)?;
        let flow = RowFlow::new();
        let row = Arc::new(Row {
            state: Mutex::new(RowState::new(
                stream,
                params.request.logprobs.is_some(),
                params.request.tools.is_some(),
                flow.clone(),
            )),
            cancelled: AtomicBool::new(false),
            id: AtomicU64::new(0),
            serial: NEXT_SERIAL.fetch_add(1, Ordering::Relaxed),
            flow,
        });
        {
            let guard = self.shared.engine.lock();
            let engine = guard.as_ref().ok_or_else(Fail::closed)?;
            let checked = engine.check(params.request)?;
            if checked.needs_tokenizing() {
                // Under the engine lock, so a `close` after this call waits for it.
                if self.shared.preparer.tx.send(Job::Submit(checked, Arc::clone(&row))).is_err() {
                    return Err(Fail::new("INTERNAL", "the tokenizer thread has stopped"));
                }
            } else {
                let sink_row = Arc::clone(&row);
                let sink = Box::new(move |ev: &Event| on_event(&sink_row, ev));
                let id = engine.submitter().submit_checked(checked, sink, Some(row.flow.clone()))?;
                row.id.store(id, Ordering::SeqCst);
            }
        }
        let generation = Generation { row, shared: Arc::clone(&self.shared) };
        if let Some(signal) = params.signal {
            if let Err(f) = watch_signal(env, signal, &generation) {
                generation.cancel_row();
                return Err(f);
            }
        }
        Ok(generation)
    }
}

/// A promise rejected with `WeftError(fail)`.
fn rejected(env: &Env, fail: &Fail) -> napi::Result<Raw> {
    let raw = env.raw();
    let err = js::error_value(raw, fail).map_err(|f| js::to_napi(raw, &f))?;
    Ok(Raw(PromiseRaw::<()>::reject(env, Raw(err))?.raw()))
}

/// Requests whose stream is not yet fully handed to JavaScript, keyed by serial: the abort
/// listener to remove from the caller's signal once it is (so one long-lived signal shared by
/// many requests does not pile up listeners).
struct Listener {
    signal: JsRef,
    func: JsRef,
}

thread_local! {
    static LISTENERS: RefCell<HashMap<u64, Listener>> = RefCell::new(HashMap::new());
}

static NEXT_SERIAL: AtomicU64 = AtomicU64::new(1);

fn watch_signal(env: sys::napi_env, signal: sys::napi_value, generation: &Generation) -> Res<()> {
    let row = Arc::downgrade(&generation.row);
    let shared: Weak<Shared> = Arc::downgrade(&generation.shared);
    listen_for_abort(env, signal, generation.row.serial, move || {
        if let Some(row) = row.upgrade() {
            row.cancelled.store(true, Ordering::SeqCst);
            if let Some(shared) = shared.upgrade() {
                shared.cancel(&row);
            }
        }
    })
}

/// Runs `on_abort` now if `signal` is already aborted, else when it aborts, through a listener
/// kept under `serial` until [`release_listener`].
fn listen_for_abort(env: sys::napi_env, signal: sys::napi_value, serial: u64, on_abort: impl Fn() + 'static) -> Res<()> {
    if js::as_bool(env, js::get(env, signal, "aborted")?)? {
        on_abort();
        return Ok(());
    }
    let env_ = Env::from_raw(env);
    let func = env_.create_function_from_closure::<(), (), _>("weftAbort", move |_ctx| {
        on_abort();
        Ok(())
    })?;
    let func = func.raw();
    js::call_method(env, signal, "addEventListener", &[js::string(env, "abort")?, func])?;
    let listener = Listener { signal: JsRef::new(env, signal)?, func: JsRef::new(env, func)? };
    LISTENERS.with(|l| l.borrow_mut().insert(serial, listener));
    Ok(())
}

fn release_listener(env: sys::napi_env, serial: u64) {
    let Some(l) = LISTENERS.with(|l| l.borrow_mut().remove(&serial)) else { return };
    if let (Ok(signal), Ok(func), Ok(name)) = (l.signal.value(), l.func.value(), js::string(env, "abort")) {
        let _ = js::call_method(env, signal, "removeEventListener", &[name, func]);
    }
}

// ---------------------------------------------------------------------------------------------
// Rows: the per-request queue between the engine thread and JavaScript.

type Resolver<T> = Box<dyn FnOnce(Env) -> napi::Result<T> + Send>;

enum Waiter {
    /// A pending `next()`.
    Next(JsDeferred<Step, Resolver<Step>>),
    /// A pending `return()`: resolves `{ done: true }` once the row ended, even if it failed.
    Return(JsDeferred<Step, Resolver<Step>>),
    /// `complete()`'s promise.
    Complete(JsDeferred<CompletionResult, Resolver<CompletionResult>>),
}

/// How a row ended (its summary, for `Done`, is in `RowState::summary`).
enum End {
    Done,
    /// An engine error (`GENERATION_FAILED`), or the preparer's refusal with its own code.
    Failed(Fail),
}

struct RowState {
    /// Queue chunks for `next()` (generate) or only accumulate (complete).
    stream: bool,
    /// The engine's bounded queue: its watermarks pause the row while chunks wait unread.
    queue: FlowQueue<Chunk>,
    /// Pending promises, oldest first. Non-empty only while `queue` is empty.
    waiters: VecDeque<Waiter>,
    text: String,
    reasoning: String,
    token_ids: Vec<u32>,
    /// Per generated token, when the request asked for log-probabilities.
    logprobs: Option<Vec<TokenLogprobs>>,
    /// The request offered tools (chunks and the completion carry calls).
    tools: bool,
    /// Done's calls, once the engine finished the row.
    final_calls: Vec<weft::tools::ToolCall>,
    /// The final event, once the engine sent it and until it is handed to JavaScript.
    end: Option<End>,
    /// The summary, once the engine finished the row successfully.
    summary: Option<(WeftFinish, weft::engine::Usage)>,
    /// JavaScript has received the end (or gave up on the stream): later `next()` calls resolve
    /// `{ done: true, value: undefined }`.
    delivered: bool,
}

impl RowState {
    fn new(stream: bool, logprobs: bool, tools: bool, flow: RowFlow) -> Self {
        RowState {
            stream,
            queue: FlowQueue::new(flow),
            waiters: VecDeque::new(),
            text: String::new(),
            reasoning: String::new(),
            token_ids: Vec::new(),
            logprobs: logprobs.then(Vec::new),
            tools,
            final_calls: Vec::new(),
            end: None,
            summary: None,
            delivered: false,
        }
    }

    fn completion(&self) -> Option<Completion> {
        let (finish, usage) = self.summary?;
        Some(Completion {
            text: self.text.clone(),
            reasoning: (!self.reasoning.is_empty()).then(|| self.reasoning.clone()),
            token_ids: self.token_ids.clone(),
            finish_reason: match finish {
                WeftFinish::ToolCalls => FinishReason::ToolCalls,
                WeftFinish::Stop => FinishReason::Stop,
                WeftFinish::Length => FinishReason::Length,
                WeftFinish::Cancelled => FinishReason::Cancelled,
            },
            usage: Usage {
                prompt_tokens: usage.prompt_tokens as u32,
                completion_tokens: usage.completion_tokens as u32,
                cached_tokens: usage.cached_tokens as u32,
                reasoning_tokens: usage.reasoning_tokens as u32,
            },
            logprobs: self.logprobs.clone(),
            tool_calls: self.tools.then(|| self.final_calls.iter().map(tool_call).collect()),
        })
    }
}

fn tool_call(c: &weft::tools::ToolCall) -> ToolCall {
    ToolCall { id: c.id.clone(), name: c.name.clone(), arguments: c.arguments.clone() }
}

/// The deltas as JS pieces (for a request with tools); `None` if empty.
fn tool_deltas(tools: bool, deltas: &[weft::tools::ToolDelta]) -> Option<Vec<ToolCallDelta>> {
    use weft::tools::ToolDelta;
    if !tools || deltas.is_empty() {
        return None;
    }
    Some(
        deltas
            .iter()
            .map(|d| {
                match d {
                    ToolDelta::Start { index, id, name } => {
                        ToolCallDelta { index: *index as u32, id: Some(id.clone()), name: Some(name.clone()), arguments: None }
                    }
                    ToolDelta::Arguments { index, fragment } => {
                        ToolCallDelta { index: *index as u32, id: None, name: None, arguments: Some(fragment.clone()) }
                    }
                }
            })
            .collect(),
    )
}

struct Row {
    state: Mutex<RowState>,
    /// Set by any cancellation; the sink then answers `false` so the engine drops the row.
    cancelled: AtomicBool,
    /// The engine's request id once the row is queued; 0 while the preparer tokenizes it.
    id: AtomicU64,
    serial: u64,
    /// Paused by the state's queue while chunks wait unread, so an iterator nobody advances parks its
    /// row in the engine instead of buffering without bound; resumed as `next()` drains it.
    flow: RowFlow,
}


/// A resolved `next()` value: `{ done: false, value: chunk }` or `{ done: true, value }`.
enum Step {
    Chunk(Chunk),
    Done(Option<Completion>),
}

impl ToNapiValue for Step {
    unsafe fn to_napi_value(env: sys::napi_env, val: Self) -> napi::Result<sys::napi_value> {
        let mut obj = std::ptr::null_mut();
        let status = unsafe { sys::napi_create_object(env, &mut obj) };
        if status != sys::Status::napi_ok {
            return Err(napi::Error::from_reason("cannot create an object"));
        }
        let (done, value) = match val {
            Step::Chunk(c) => (false, unsafe { Chunk::to_napi_value(env, c) }?),
            Step::Done(Some(c)) => (true, unsafe { Completion::to_napi_value(env, c) }?),
            Step::Done(None) => (true, js::undefined(env).map_err(|f| napi::Error::from_reason(f.message))?),
        };
        let done = unsafe { bool::to_napi_value(env, done) }?;
        unsafe {
            sys::napi_set_named_property(env, obj, c"done".as_ptr(), done);
            sys::napi_set_named_property(env, obj, c"value".as_ptr(), value);
        }
        Ok(obj)
    }
}

/// What `complete()` resolves with.
struct CompletionResult(Completion);

impl ToNapiValue for CompletionResult {
    unsafe fn to_napi_value(env: sys::napi_env, val: Self) -> napi::Result<sys::napi_value> {
        unsafe { Completion::to_napi_value(env, val.0) }
    }
}

fn failure(message: &str) -> Fail {
    Fail::new("GENERATION_FAILED", message.to_string())
}

/// The sink: runs on the engine thread and never blocks on JavaScript.
fn on_event(row: &Row, ev: &Event) -> bool {
    let mut st = row.state.lock();
    match ev {
        Event::Token { token_id, text, reasoning, logprobs, tool_calls } => {
            st.text.push_str(text);
            st.reasoning.push_str(reasoning);
            st.token_ids.push(*token_id);
            let lp = logprobs.as_ref().map(|lp| TokenLogprobs {
                token_id: *token_id,
                logprob: lp.logprob as f64,
                top_logprobs: lp.top.iter().map(|&(t, l)| TokenLogprob { token_id: t, logprob: l as f64 }).collect(),
            });
            if let (Some(all), Some(lp)) = (st.logprobs.as_mut(), &lp) {
                all.push(lp.clone());
            }
            let pieces = tool_deltas(st.tools, tool_calls);
            if st.stream {
                let (logprob, top_logprobs) = match lp {
                    Some(lp) => (Some(lp.logprob), Some(lp.top_logprobs)),
                    None => (None, None),
                };
                let reasoning = (!reasoning.is_empty()).then(|| reasoning.clone());
                let chunk = Chunk { text: text.clone(), reasoning, token_id: Some(*token_id), logprob, top_logprobs, tool_calls: pieces };
                push_chunk(&mut st, chunk);
            }
        }
        Event::Done { finish_reason, usage, text, reasoning, tool_deltas: released, tool_calls, .. } => {
            st.text.push_str(text);
            st.reasoning.push_str(reasoning);
            // The pieces the end released (a call completed by the last text) come with Done.
            let pieces = tool_deltas(st.tools, released);
            if st.stream && (!text.is_empty() || !reasoning.is_empty() || pieces.is_some()) {
                let reasoning = (!reasoning.is_empty()).then(|| reasoning.clone());
                let chunk =
                    Chunk { text: text.clone(), reasoning, token_id: None, logprob: None, top_logprobs: None, tool_calls: pieces };
                push_chunk(&mut st, chunk);
            }
            st.final_calls = tool_calls.clone();
            st.summary = Some((*finish_reason, *usage));
            st.end = Some(End::Done);
            flush_end(&mut st, row.serial);
        }
        // Chunks are tokens; the counts come with the completion's usage.
        Event::Started { .. } => {}
        Event::Error { message } => {
            st.end = Some(End::Failed(failure(message)));
            flush_end(&mut st, row.serial);
        }
    }
    !row.cancelled.load(Ordering::Relaxed)
}

/// Hands a chunk to a waiting `next()` or queues it (pausing the row when the queue is deep).
fn push_chunk(st: &mut RowState, chunk: Chunk) {
    match st.waiters.pop_front() {
        Some(Waiter::Next(d)) => d.resolve(Box::new(move |_| Ok(Step::Chunk(chunk)))),
        Some(other) => {
            // A pending return(): the consumer no longer wants chunks.
            st.waiters.push_front(other);
        }
        None => {
            st.queue.push(chunk, false);
        }
    }
}

/// Hands the end to pending waiters (engine thread). Waiters exist only when the queue is empty.
fn flush_end(st: &mut RowState, serial: u64) {
    if st.waiters.is_empty() {
        return;
    }
    let end = st.end.take().expect("flush_end after end");
    let completion = st.completion();
    st.delivered = true;
    let mut first = true;
    while let Some(w) = st.waiters.pop_front() {
        let gets_end = std::mem::replace(&mut first, false);
        match w {
            Waiter::Next(d) if gets_end => match &end {
                End::Done => {
                    let c = completion.clone_completion();
                    d.resolve(Box::new(move |env| {
                        release_listener(env.raw(), serial);
                        Ok(Step::Done(c))
                    }))
                }
                End::Failed(f) => {
                    let f = f.clone();
                    d.resolve(Box::new(move |env| {
                        release_listener(env.raw(), serial);
                        Err(js::to_napi(env.raw(), &f))
                    }))
                }
            },
            Waiter::Next(d) | Waiter::Return(d) => {
                let c = if gets_end { completion.clone_completion() } else { None };
                d.resolve(Box::new(move |env| {
                    release_listener(env.raw(), serial);
                    Ok(Step::Done(c))
                }))
            }
            Waiter::Complete(d) => {
                let result = match (&end, completion.clone_completion()) {
                    (End::Done, Some(c)) => Ok(c),
                    (End::Failed(f), _) => Err(f.clone()),
                    (End::Done, None) => Err(Fail::new("INTERNAL", "no summary")),
                };
                d.resolve(Box::new(move |env| {
                    release_listener(env.raw(), serial);
                    result.map(CompletionResult).map_err(|f| js::to_napi(env.raw(), &f))
                }))
            }
        }
    }
}

trait CloneCompletion {
    fn clone_completion(&self) -> Self;
}

impl CloneCompletion for Option<Completion> {
    fn clone_completion(&self) -> Self {
        self.as_ref().map(|c| Completion {
            text: c.text.clone(),
            reasoning: c.reasoning.clone(),
            token_ids: c.token_ids.clone(),
            finish_reason: c.finish_reason,
            usage: c.usage.clone(),
            logprobs: c.logprobs.clone(),
            tool_calls: c.tool_calls.clone(),
        })
    }
}

/// Settles an end that is already known, on the JS thread (the end was taken from the state).
fn settle_now(env: &Env, row: &Row, end: End) -> Res<Raw> {
    let st = row.state.lock();
    let completion = st.completion();
    drop(st);
    release_listener(env.raw(), row.serial);
    let p = match end {
        End::Done => match completion {
            Some(c) => PromiseRaw::resolve(env, CompletionResult(c))?.raw(),
            None => return Err(Fail::new("INTERNAL", "no summary")),
        },
        End::Failed(f) => PromiseRaw::<()>::reject(env, Raw(js::error_value(env.raw(), &f)?))?.raw(),
    };
    Ok(Raw(p))
}

// ---------------------------------------------------------------------------------------------
// Generation

/// The token stream of one `generate` call: an async iterator of {@link Chunk}s. Tokens are
/// buffered per request (never blocking the engine), so a slow consumer only delays itself.
#[napi(custom_finalize)]
pub struct Generation {
    row: Arc<Row>,
    shared: Arc<Shared>,
}

impl Generation {
    fn cancel_row(&self) {
        self.shared.cancel(&self.row);
    }

    fn wait(&self, env: &Env, returning: bool) -> napi::Result<Raw> {
        let raw = env.raw();
        let mut st = self.row.state.lock();
        if returning {
            st.queue.clear();
        }
        if let Some(chunk) = st.queue.pop() {
            return Ok(Raw(PromiseRaw::resolve(env, Step::Chunk(chunk))?.raw()));
        }
        if st.delivered {
            return Ok(Raw(PromiseRaw::resolve(env, Step::Done(None))?.raw()));
        }
        if let Some(end) = st.end.take() {
            st.delivered = true;
            let completion = st.completion();
            drop(st);
            release_listener(raw, self.row.serial);
            let p = match end {
                End::Failed(f) if !returning => {
                    let err = js::error_value(raw, &f).map_err(|f| js::to_napi(raw, &f))?;
                    PromiseRaw::<()>::reject(env, Raw(err))?.raw()
                }
                _ => PromiseRaw::resolve(env, Step::Done(completion))?.raw(),
            };
            return Ok(Raw(p));
        }
        let (deferred, promise) = env.create_deferred::<Step, Resolver<Step>>()?;
        st.waiters.push_back(if returning { Waiter::Return(deferred) } else { Waiter::Next(deferred) });
        Ok(Raw(promise.raw()))
    }
}

#[napi]
impl Generation {
    /// The next chunk: `{ done: false, value: chunk }`, then once `{ done: true, value:
    /// summary }`. A failure mid-stream rejects with a `WeftError` (code `GENERATION_FAILED`).
    #[napi(ts_return_type = "Promise<IteratorResult<Chunk, Completion | undefined>>")]
    pub fn next(&self, env: Env) -> napi::Result<Raw> {
        self.wait(&env, false)
    }

    /// Stops the stream (what `break` in `for await` calls): cancels the request, drops
    /// buffered chunks and resolves once the engine has released the row.
    #[napi(
        js_name = "return",
        ts_args_type = "value?: unknown",
        ts_return_type = "Promise<IteratorResult<Chunk, Completion | undefined>>"
    )]
    pub fn return_(&self, env: Env) -> napi::Result<Raw> {
        self.cancel_row();
        self.wait(&env, true)
    }

    /// Cancels the request; chunks already produced can still be read, then the stream ends with
    /// `finishReason: "cancelled"`.
    #[napi]
    pub fn cancel(&self) {
        self.cancel_row();
    }

    /// Text, token ids, finish reason and usage once the engine has finished the request (chunks
    /// may still be buffered for the iterator), else `null`.
    #[napi(getter, ts_return_type = "Completion | null")]
    pub fn summary(&self) -> Option<Completion> {
        self.row.state.lock().completion()
    }
}

impl ObjectFinalize for Generation {
    fn finalize(self, env: Env) -> napi::Result<()> {
        // Garbage-collected before the end: nobody can read it any more.
        let unfinished = {
            let st = self.row.state.lock();
            st.end.is_none() && !st.delivered
        };
        if unfinished {
            self.cancel_row();
        }
        release_listener(env.raw(), self.row.serial);
        Ok(())
    }
}
