//! Weft's stable C ABI: the functions and types of `include/weft.h` (generated from this crate
//! by cbindgen; see docs/c-api.md for the contract in prose).
//!
//! Every `extern "C"` function runs its body under [`status::guard`]: failures become status
//! codes plus a per-thread message, and panics are caught (`WEFT_ERR_INTERNAL`), so no unwinding
//! crosses the boundary. Every pointer argument is checked.
//!
//! The engine is `weft::engine::Engine`; this crate only parses JSON, adapts callbacks and maps
//! errors.

// C names: weft_engine, weft_event, ...
#![allow(non_camel_case_types)]
// The exported functions are for C callers and check every pointer they are given; marking
// them `unsafe` would add nothing for C and put Rust-only "# Safety" sections in the header.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

mod download;
mod event;
mod json;
mod status;

use std::cell::Cell;
use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use weft::engine::Engine;

pub use event::{
    weft_event, weft_event_fn, weft_event_kind, weft_finish_reason, weft_token_logprob, weft_tool_call, weft_tool_delta,
    weft_tool_delta_kind,
};
pub use download::{weft_download_phase, weft_download_progress, weft_progress_fn};
pub use status::weft_status;

use status::{
    from_engine_error, guard, Failure, FfiResult, WEFT_ERR_CANCELLED, WEFT_ERR_CAPACITY, WEFT_ERR_INTERNAL,
    WEFT_ERR_NOT_FOUND, WEFT_ERR_SHUTDOWN,
};

/// The ABI version this header describes. It changes only when an existing function, type,
/// constant or struct field changes incompatibly; additions (new functions, constants, fields
/// appended to the end of weft_event) keep it. Compare with weft_abi_version() at start-up.
pub const WEFT_ABI_VERSION: u32 = 1;

/// Compatible additions within WEFT_ABI_VERSION, counted: 0 = the first release; 1 = tool calls
/// (weft_event's tool_deltas .. tool_calls_len, WEFT_FINISH_TOOL_CALLS, weft_tool_delta,
/// weft_tool_call, weft_abi_minor); 2 = reasoning (weft_event's reasoning .. reasoning_tokens)
/// and model downloads with progress and cancellation (weft_engine_new_with_progress,
/// weft_progress_fn, weft_download_progress, weft_download_phase, WEFT_ERR_CANCELLED) with
/// Hugging Face repo ids as "model". Compare with weft_abi_minor() before reading a field added
/// in a later minor (docs/c-api.md, Versioning); 3 = prompt-cache entries saved to and loaded
/// from files (weft_prompt_cache_save, weft_prompt_cache_load).
pub const WEFT_ABI_MINOR: u32 = 3;

static VERSION: &CStr = match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
    Ok(v) => v,
    Err(_) => panic!("the package version contains a NUL"),
};

thread_local! {
    /// How many weft event callbacks are running on this thread (for refusing calls that would
    /// deadlock, such as freeing the engine from its own callback).
    static IN_CALLBACK: Cell<u32> = const { Cell::new(0) };
}

fn in_callback() -> bool {
    IN_CALLBACK.try_with(|c| c.get() > 0).unwrap_or(false)
}

/// A loaded model and its running engine thread (opaque to C).
pub struct weft_engine {
    /// `None` once shut down; submits then fail with `WEFT_ERR_SHUTDOWN`.
    engine: RwLock<Option<Engine>>,
    /// The highest request id handed out so far (the engine issues ids 1, 2, 3, ...).
    max_issued: AtomicU64,
    /// Delivers every request's events to its callback on a few threads (drained and joined
    /// at shutdown, so no callback runs after it).
    pool: Arc<event::Pool>,
}

// C calls the functions on one handle from many threads at once.
const _: () = {
    const fn shared_across_threads<T: Send + Sync>() {}
    shared_across_threads::<weft_engine>();
};

impl weft_engine {
    /// Runs `f` on the engine if it is still running.
    fn with<T>(&self, f: impl FnOnce(&Engine) -> FfiResult<T>) -> FfiResult<T> {
        // A poisoned lock only means some thread panicked while holding it (caught at the
        // boundary); the `Option<Engine>` inside is still consistent.
        let guard = self.engine.read().unwrap_or_else(|e| e.into_inner());
        match guard.as_ref() {
            Some(engine) => f(engine),
            None => Err(Failure::new(WEFT_ERR_SHUTDOWN, "the engine has been shut down")),
        }
    }

    /// Takes the engine out (later calls see `WEFT_ERR_SHUTDOWN`) and drops it outside the lock:
    /// dropping cancels outstanding requests, delivers their final events and joins the engine
    /// thread, whose callbacks may themselves call into this handle.
    fn shutdown(&self) {
        let engine = self.engine.write().unwrap_or_else(|e| e.into_inner()).take();
        // The engine delivers every outstanding request's final event into its queue as it
        // stops; then the delivery pool drains every queue and its threads end.
        drop(engine);
        self.pool.drain_and_stop();
    }
}

fn engine_ref<'a>(engine: *mut weft_engine, func: &str) -> FfiResult<&'a weft_engine> {
    if engine.is_null() {
        return Err(Failure::invalid(format!("{func}: engine is NULL")));
    }
    // SAFETY: non-NULL, and per the contract a live handle from weft_engine_new.
    Ok(unsafe { &*engine })
}

/// Reads a NUL-terminated UTF-8 string argument.
fn str_arg<'a>(p: *const c_char, func: &str, name: &str) -> FfiResult<&'a str> {
    if p.is_null() {
        return Err(Failure::invalid(format!("{func}: {name} is NULL")));
    }
    // SAFETY: non-NULL and NUL-terminated per the contract.
    let bytes = unsafe { CStr::from_ptr(p) };
    bytes
        .to_str()
        .map_err(|e| Failure::invalid(format!("{func}: {name} is not valid UTF-8 (at byte {})", e.valid_up_to())))
}

/// The ABI version of the loaded library (WEFT_ABI_VERSION of the header it was built from).
/// A program built against a header whose WEFT_ABI_VERSION differs must not use the library.
#[no_mangle]
pub extern "C" fn weft_abi_version() -> u32 {
    WEFT_ABI_VERSION
}

/// The ABI minor version of the loaded library (WEFT_ABI_MINOR of the header it was built from):
/// fields and constants of minor n exist when weft_abi_minor() >= n. (Libraries before minor 1
/// lack this function; they also reject "tools" at weft_submit.)
#[no_mangle]
pub extern "C" fn weft_abi_minor() -> u32 {
    WEFT_ABI_MINOR
}

/// The library's version, e.g. "0.1.0": a static NUL-terminated string (never freed).
#[no_mangle]
pub extern "C" fn weft_version() -> *const c_char {
    VERSION.as_ptr()
}

/// A static English description of a status code ("unknown status" for codes this library
/// does not know). Never NULL.
#[no_mangle]
pub extern "C" fn weft_status_string(status: i32) -> *const c_char {
    status::status_str(status).as_ptr()
}

/// The message of the last call that failed on this thread (a NUL-terminated UTF-8 string;
/// "" if none has). Successful calls do not clear it. Valid until the next weft_* call on this
/// thread; copy it to keep it. Never NULL.
#[no_mangle]
pub extern "C" fn weft_last_error() -> *const c_char {
    status::last_error_ptr()
}

/// Loads a model and starts its engine thread.
///
/// options_json: a JSON object (NULL means "{}"), every field optional, null = default:
///   "model": path of an mlx-lm model directory or a .gguf file, a name the model store knows
///            (gemma-3-270m), or a Hugging Face repo id "org/repo[@revision][:file]" (fetched into
///            the Hugging Face cache; HF_ENDPOINT, HF_TOKEN, HF_HUB_OFFLINE, HF_HUB_CACHE and
///            HF_HOME apply as for huggingface_hub); absent/null = the default model
///            (SmolLM2-135M-Instruct, downloaded to the model store on first use);
///   "max_batch": rows decoding together (default 8);
///   "prompt_concurrency": requests prefilling at once (default 8);
///   "prefill_step_size": prompt tokens per prefill chunk (default 2048);
///   "kv_budget_bytes": projected KV-cache bytes across running requests (default: no limit);
///   "prompt_cache_bytes": KV bytes kept for prefix reuse, finished requests and their chat-
///                         boundary checkpoints (0 = off; default: sized from the memory left
///                         after loading the model);
///   "kv_bits": store keys/values affine-quantized to this many bits (2, 3, 4, 5, 6 or 8;
///              default: full precision, the mode that matches mlx-lm exactly);
///   "kv_group_size": elements per quantization group: 32, 64 (default) or 128, dividing head_dim;
///   "quantized_kv_start": positions a row holds before its cache is quantized (default 0);
///   "cache_limit_bytes": largest buffer cache MLX keeps (default: MLX's);
///   "clear_cache_every_steps": return MLX's buffer cache every this many decode steps
///                              (default 256; 0 = only when idle);
///   "memory_limit_bytes": MLX's memory limit, >= 1 (default: MLX's);
///   "wired_limit_bytes": memory MLX may keep wired on Apple GPUs (default: MLX's);
///   "num_draft_tokens": prompt-lookup speculative decoding for requests that name none: draft
///                       up to this many tokens per step, 0 to 64 (default 0 = off).
///   "draft_model": a draft model (local path sharing the tokenizer) drafting num_draft_tokens
///                  tokens per step (default 3) instead of prompt lookup.
/// Unknown fields are errors (WEFT_ERR_INVALID_ARGUMENT). The schema is weft::contract's, shared
/// with the Node and Swift packages (docs/c-api.md lists every field and range).
///
/// On success stores a new handle in *out_engine and returns WEFT_OK; free it with
/// weft_engine_free. On failure stores NULL (if out_engine is not NULL) and returns
/// WEFT_ERR_INVALID_ARGUMENT, WEFT_ERR_MODEL_LOAD (also for a model that could not be downloaded:
/// an unknown repo, an unreachable Hub, a gated repo without HF_TOKEN; weft_last_error says
/// which) or WEFT_ERR_UNSUPPORTED. May block for a long time (model loading, the first download
/// of a model; weft_engine_new_with_progress reports it).
#[no_mangle]
pub extern "C" fn weft_engine_new(options_json: *const c_char, out_engine: *mut *mut weft_engine) -> i32 {
    engine_new("weft_engine_new", options_json, None, std::ptr::null_mut(), out_engine)
}

/// weft_engine_new, reporting the model's download to `progress` (NULL: none) with `user_data`,
/// on the calling thread; `progress` returning non-zero cancels a Hugging Face download, and
/// the call then returns WEFT_ERR_CANCELLED. With a model already on disk or in the cache it
/// reports nothing (or one WEFT_DOWNLOAD_DONE) and behaves as weft_engine_new.
#[no_mangle]
pub extern "C" fn weft_engine_new_with_progress(
    options_json: *const c_char,
    progress: weft_progress_fn,
    user_data: *mut c_void,
    out_engine: *mut *mut weft_engine,
) -> i32 {
    engine_new("weft_engine_new_with_progress", options_json, progress, user_data, out_engine)
}

fn engine_new(
    name: &'static str,
    options_json: *const c_char,
    progress: weft_progress_fn,
    user_data: *mut c_void,
    out_engine: *mut *mut weft_engine,
) -> i32 {
    guard(name, || {
        if out_engine.is_null() {
            return Err(Failure::invalid(format!("{name}: out_engine is NULL")));
        }
        // SAFETY: checked non-NULL; the caller provides a writable pointer slot.
        unsafe { *out_engine = std::ptr::null_mut() };
        let options = if options_json.is_null() {
            json::parse_options("{}")?
        } else {
            json::parse_options(str_arg(options_json, name, "options_json")?)?
        };
        // Options left unset come from the environment (WEFT_CPU_KERNELS, HF_TOKEN, ...): the
        // one documented place, EngineOptions::load_options / engine_config / model_path.
        let config = options.engine_config().map_err(|e| from_engine_error(&e, false))?;
        config.validate().map_err(|e| from_engine_error(&e, false))?;
        let load_options = options.load_options().map_err(|e| from_engine_error(&e, true))?;
        let cancel = AtomicBool::new(false);
        let fetched = options.model_path(&mut download::adapter(progress, user_data, &cancel), &cancel);
        if cancel.load(Ordering::Relaxed) {
            let why = fetched.err().map(|e| format!(": {}", e.message())).unwrap_or_default();
            return Err(Failure::new(WEFT_ERR_CANCELLED, format!("{name}: the progress callback cancelled the download{why}")));
        }
        let path = fetched.map_err(|e| from_engine_error(&e, true))?;
        let model = weft::loading::load_with(&path, &load_options).map_err(|e| from_engine_error(&e, true))?;
        let engine = Engine::start(model, config).map_err(|e| from_engine_error(&e, false))?;
        let handle = Box::new(weft_engine {
            engine: RwLock::new(Some(engine)),
            max_issued: AtomicU64::new(0),
            pool: Arc::new(event::Pool::default()),
        });
        // SAFETY: as above.
        unsafe { *out_engine = Box::into_raw(handle) };
        Ok(())
    })
}

/// Stops the engine but keeps the handle valid: cancels every outstanding request (each gets its
/// final DONE event with WEFT_FINISH_CANCELLED, or an ERROR), waits for those callbacks and joins
/// the engine thread and the delivery threads. Afterwards weft_submit, weft_cancel and weft_engine_stats return
/// WEFT_ERR_SHUTDOWN, and no callback of this engine runs again. May be called from any thread,
/// concurrently with other calls on the handle (useful to stop an engine other threads still
/// use before freeing it), and more than once. Not from inside an event callback:
/// that returns WEFT_ERR_INVALID_ARGUMENT and does nothing.
#[no_mangle]
pub extern "C" fn weft_engine_shutdown(engine: *mut weft_engine) -> i32 {
    const F: &str = "weft_engine_shutdown";
    guard(F, || {
        let e = engine_ref(engine, F)?;
        if in_callback() {
            return Err(Failure::invalid(format!("{F} cannot be called from inside an event callback")));
        }
        e.shutdown();
        Ok(())
    })
}

/// Shuts the engine down (as weft_engine_shutdown) and frees the handle. No callback runs after
/// it returns. NULL is a no-op. No other call on this handle may run concurrently or follow.
/// Must not be called from inside an event callback: there it does nothing (the engine keeps
/// running), sets this thread's weft_last_error and prints a warning to stderr.
#[no_mangle]
pub extern "C" fn weft_engine_free(engine: *mut weft_engine) {
    const F: &str = "weft_engine_free";
    let status = guard(F, || {
        if engine.is_null() {
            return Ok(());
        }
        if in_callback() {
            let message = format!("{F} cannot be called from inside an event callback; the engine was not freed");
            eprintln!("weft: {message}");
            return Err(Failure::invalid(message));
        }
        // SAFETY: non-NULL, from weft_engine_new, not freed before (per the contract).
        let handle = unsafe { Box::from_raw(engine) };
        handle.shutdown();
        drop(handle);
        Ok(())
    });
    let _ = status;
}

/// Submits a request. Validation and tokenization happen here, on the calling thread: a bad
/// request fails synchronously and then no callback is ever made for it. On WEFT_OK the request
/// is queued, its id is stored in *out_request_id (if not NULL), and on_event receives its events
/// on a delivery thread of this request (see weft_event_fn): TOKEN events, then exactly one DONE or ERROR, after which on_event is
/// never called for it again and user_data is no longer used. *out_request_id is written before
/// the first callback runs, though the callbacks may run before weft_submit returns.
///
/// request_json: a JSON object with exactly one input
///   "prompt": raw text (tokenized as-is, special tokens per the tokenizer's config), or
///   "messages": [{"role": "...", "content": "..."}, ...] rendered with the model's chat
///               template (generation prompt added), or
///   "prompt_ids": [token ids];
/// and optionally (null = default): "max_tokens" (1..2^32-1, default 256), "temperature" (default 0 =
/// greedy), "top_p" (default 1), "top_k" (default 0 = off), "min_p" (default 0), "seed",
/// "repetition_penalty", "presence_penalty", "frequency_penalty", "penalty_context" (>= 1,
/// default 20), "logit_bias" ({"<token id>": bias}; the bias "-Infinity" bans the token),
/// "stop" (a string or an array of non-empty strings), "ignore_eos" (default false),
/// "num_draft_tokens" (0..64, prompt-lookup speculative decoding; default: the engine's),
/// "logprobs" (bool), "top_logprobs" (0..20, needs "logprobs"), one constraint of
/// "response_format" / "json_schema" / "regex" / "grammar" / "choice", and (ABI minor 1) "tools",
/// "tool_choice", "parallel_tool_calls", whose calls arrive in weft_event's tool_deltas /
/// tool_calls (docs/c-api.md, Tool calls). The input must not be empty. Unknown fields are errors.
///
/// Returns WEFT_OK, WEFT_ERR_INVALID_ARGUMENT (NULL engine / request_json / on_event, bad JSON,
/// a bad field, a prompt longer than the model's context, token ids outside the vocabulary,
/// text input for a model without a tokenizer), WEFT_ERR_CAPACITY (the request alone needs more
/// KV cache than the engine's kv_budget_bytes) or WEFT_ERR_SHUTDOWN.
#[no_mangle]
pub extern "C" fn weft_submit(
    engine: *mut weft_engine,
    request_json: *const c_char,
    on_event: weft_event_fn,
    user_data: *mut c_void,
    out_request_id: *mut u64,
) -> i32 {
    const F: &str = "weft_submit";
    guard(F, || {
        let e = engine_ref(engine, F)?;
        let text = str_arg(request_json, F, "request_json")?;
        let Some(func) = on_event else {
            return Err(Failure::invalid(format!("{F}: on_event is NULL")));
        };
        // Local media paths are read as the engine's `local_media` option allows.
        let local = e.with(|engine| Ok(engine.config().local_media.clone()))?;
        let request = json::parse_request(text, &local)?;
        let (delivery, sink, flow) = e.pool.register(event::Callback { func, user_data }).map_err(|err| {
            Failure::new(WEFT_ERR_INTERNAL, format!("{F}: cannot start an event delivery thread: {err}"))
        })?;
        // Submitted under the engine's read lock: a concurrent shutdown (write lock) either
        // refuses this submit or drains its events (the pool waits for this request's final
        // event, which it delivers once the id below is published).
        let submitted = e.with(|engine| engine.submit_with_flow(request, sink, flow).map_err(|err| from_engine_error(&err, false)));
        let id = match submitted {
            Ok(id) => id,
            Err(f) => {
                delivery.abandon();
                return Err(f);
            }
        };
        // Everything here happens before the first callback: nothing is delivered until the id
        // is published (so *out_request_id may live in memory that the final callback frees).
        if !out_request_id.is_null() {
            // SAFETY: checked non-NULL; a writable uint64_t per the contract.
            unsafe { *out_request_id = id };
        }
        e.max_issued.fetch_max(id, Ordering::SeqCst);
        delivery.publish(id);
        Ok(())
    })
}

/// Cancels a request: if it has not finished, it ends soon with a DONE event whose
/// finish_reason is WEFT_FINISH_CANCELLED (tokens already delivered stay delivered). Returns
/// WEFT_OK for any id this engine issued, including finished ones (then it does nothing);
/// WEFT_ERR_NOT_FOUND for an id it never issued; WEFT_ERR_SHUTDOWN after shutdown. Any thread,
/// also from inside a callback (including for the request being delivered); does not block.
#[no_mangle]
pub extern "C" fn weft_cancel(engine: *mut weft_engine, request_id: u64) -> i32 {
    const F: &str = "weft_cancel";
    guard(F, || {
        let e = engine_ref(engine, F)?;
        e.with(|engine| {
            if request_id == 0 || request_id > e.max_issued.load(Ordering::SeqCst) {
                return Err(Failure::new(
                    WEFT_ERR_NOT_FOUND,
                    format!("{F}: request id {request_id} was not issued by this engine"),
                ));
            }
            engine.cancel(request_id);
            Ok(())
        })
    })
}

/// Writes the engine's statistics as a NUL-terminated JSON object into buf, e.g. "active_rows",
/// "queued_rows", "prefilling_rows", "kv_bytes_in_use", "kv_budget_bytes" (null = no limit),
/// "prompt_cache_bytes", "prompt_cache_entries", "prompt_cache_hits", "tokens_generated",
/// "decode_steps", "requests_finished" (integers) and cumulative decode timings in seconds
/// (numbers ending in "_s"); see docs/c-api.md. Fields may be added; parse by name.
/// *out_len (if out_len is not NULL) always receives the JSON's length in bytes, excluding the
/// NUL. Returns WEFT_OK when it fits (cap >= length + 1), else WEFT_ERR_CAPACITY with buf
/// untouched: call again with a buffer of *out_len + 1 bytes. buf may be NULL when cap is 0.
/// Any thread, also from inside a callback.
#[no_mangle]
pub extern "C" fn weft_engine_stats(
    engine: *mut weft_engine,
    buf: *mut c_char,
    cap: usize,
    out_len: *mut usize,
) -> i32 {
    const F: &str = "weft_engine_stats";
    guard(F, || {
        let e = engine_ref(engine, F)?;
        if buf.is_null() && cap > 0 {
            return Err(Failure::invalid(format!("{F}: buf is NULL but cap is {cap}")));
        }
        let stats = e.with(|engine| Ok(engine.stats()))?;
        let json = serde_json::to_string(&stats)
            .map_err(|err| Failure::new(WEFT_ERR_INTERNAL, format!("{F}: cannot serialize stats: {err}")))?;
        if !out_len.is_null() {
            // SAFETY: checked non-NULL; a writable size_t per the contract.
            unsafe { *out_len = json.len() };
        }
        if cap < json.len() + 1 {
            return Err(Failure::new(
                WEFT_ERR_CAPACITY,
                format!("{F}: the stats need {} bytes (with the NUL), the buffer has {cap}", json.len() + 1),
            ));
        }
        // SAFETY: buf is non-NULL (cap > 0 here) with room for cap >= len + 1 bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(json.as_ptr(), buf.cast::<u8>(), json.len());
            *buf.add(json.len()) = 0;
        }
        Ok(())
    })
}

/// Whether the engine is serving: WEFT_OK, or WEFT_ERR_ENGINE_FAILED once its thread has
/// failed (weft_last_error says why; every outstanding request got an ERROR event and later
/// weft_submit calls fail the same way), or WEFT_ERR_SHUTDOWN after weft_engine_shutdown.
/// Any thread, also from inside a callback.
#[no_mangle]
pub extern "C" fn weft_engine_health(engine: *mut weft_engine) -> i32 {
    const F: &str = "weft_engine_health";
    guard(F, || {
        let e = engine_ref(engine, F)?;
        e.with(|engine| engine.health().map_err(|err| from_engine_error(&err, false)))
    })
}

/// Writes the entry info of a prompt-cache save or load to the optional out pointers.
fn entry_out(info: weft::engine::SavedEntryInfo, out_tokens: *mut u64, out_bytes: *mut u64) {
    if !out_tokens.is_null() {
        // SAFETY: checked non-NULL; a writable uint64_t per the contract.
        unsafe { *out_tokens = info.tokens as u64 };
    }
    if !out_bytes.is_null() {
        // SAFETY: as above.
        unsafe { *out_bytes = info.bytes };
    }
}

/// (ABI minor 3) Saves one prompt-cache entry to the file at path (written through a temporary
/// file beside it, so a crash leaves no half-written file under the name), so a fixed preamble
/// is prefilled once, ever: load it into a later engine with weft_prompt_cache_load.
/// prompt_json NULL saves the most recently used entry (after a request, its prompt and
/// answer); otherwise it is a request as weft_submit takes it, of which only the input
/// ("messages" rendered with "tools" and "chat_template_kwargs" as a request's are, "prompt"
/// or "prompt_ids") is used: the entry saved is the cached prefix a request with that input
/// would reuse. *out_tokens receives the tokens the entry holds and *out_bytes the file's size
/// (each if not NULL). Returns WEFT_OK, WEFT_ERR_NOT_FOUND (the cache holds nothing for that
/// prompt), WEFT_ERR_UNSUPPORTED (the prompt cache is off: prompt_cache_bytes 0),
/// WEFT_ERR_INVALID_ARGUMENT (a bad prompt_json, a file that cannot be written) or
/// WEFT_ERR_SHUTDOWN. Runs between
/// two engine steps: running requests wait for the write. Any thread.
#[no_mangle]
pub extern "C" fn weft_prompt_cache_save(
    engine: *mut weft_engine,
    path: *const c_char,
    prompt_json: *const c_char,
    out_tokens: *mut u64,
    out_bytes: *mut u64,
) -> i32 {
    const F: &str = "weft_prompt_cache_save";
    guard(F, || {
        let e = engine_ref(engine, F)?;
        let path = str_arg(path, F, "path")?;
        let prompt = if prompt_json.is_null() {
            None
        } else {
            let local = e.with(|engine| Ok(engine.config().local_media.clone()))?;
            Some(json::parse_request(str_arg(prompt_json, F, "prompt_json")?, &local)?)
        };
        let saved = e.with(|engine| {
            engine.save_prompt_cache_entry(prompt, std::path::Path::new(path)).map_err(|err| from_engine_error(&err, false))
        })?;
        let info = saved.ok_or_else(|| Failure::new(WEFT_ERR_NOT_FOUND, format!("{F}: the prompt cache holds no entry to save (for this prompt)")))?;
        entry_out(info, out_tokens, out_bytes);
        Ok(())
    })
}

/// (ABI minor 3) Loads an entry weft_prompt_cache_save wrote into this engine's prompt cache:
/// later requests whose prompts start with its tokens reuse it, with outputs equal to a cold
/// run's. A file saved for another model, tokenizer or kernel mode, or truncated or corrupt,
/// is refused (WEFT_ERR_INVALID_ARGUMENT; weft_last_error says why); a missing file is
/// WEFT_ERR_NOT_FOUND; an entry larger than the cache's capacity WEFT_ERR_CAPACITY; a cache
/// that is off WEFT_ERR_UNSUPPORTED. *out_tokens and *out_bytes as for weft_prompt_cache_save.
/// Runs between two engine steps. Any thread.
#[no_mangle]
pub extern "C" fn weft_prompt_cache_load(engine: *mut weft_engine, path: *const c_char, out_tokens: *mut u64, out_bytes: *mut u64) -> i32 {
    const F: &str = "weft_prompt_cache_load";
    guard(F, || {
        let e = engine_ref(engine, F)?;
        let path = std::path::Path::new(str_arg(path, F, "path")?);
        if !path.is_file() {
            return Err(Failure::new(WEFT_ERR_NOT_FOUND, format!("{F}: no file {}", path.display())));
        }
        let info = e.with(|engine| engine.load_prompt_cache_entry(path).map_err(|err| from_engine_error(&err, false)))?;
        entry_out(info, out_tokens, out_bytes);
        Ok(())
    })
}

