//! Delivering engine events to C callbacks.

use std::ffi::{c_char, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use weft::engine::{Event, RowFlow, Sink, StopCause};
use weft::generate::FinishReason;
use weft::tools::{Assembler, ToolCall, ToolDelta};

use crate::IN_CALLBACK;

/// weft_event.kind.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum weft_event_kind {
    /// A generated token: token_id and its text delta.
    WEFT_EVENT_TOKEN = 1,
    /// The request finished normally or was cancelled: finish_reason and usage. Final.
    WEFT_EVENT_DONE = 2,
    /// The request failed after it was accepted: message. Final.
    WEFT_EVENT_ERROR = 3,
}

/// weft_event.finish_reason of a DONE event.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum weft_finish_reason {
    /// An end-of-sequence token or a stop string ended the request.
    WEFT_FINISH_STOP = 0,
    /// max_tokens or the model's context length was reached.
    WEFT_FINISH_LENGTH = 1,
    /// weft_cancel or the engine's shutdown ended the request.
    WEFT_FINISH_CANCELLED = 2,
    /// (ABI minor 1) A request with "tools" stopped after making calls: DONE's tool_calls holds
    /// them. stop_kind is WEFT_STOP_NONE when the call itself ended the request (a named
    /// tool_choice or "parallel_tool_calls": false stop after the first complete call), else the
    /// stop that did.
    WEFT_FINISH_TOOL_CALLS = 3,
}

const WEFT_EVENT_TOKEN: i32 = weft_event_kind::WEFT_EVENT_TOKEN as i32;
const WEFT_EVENT_DONE: i32 = weft_event_kind::WEFT_EVENT_DONE as i32;
const WEFT_EVENT_ERROR: i32 = weft_event_kind::WEFT_EVENT_ERROR as i32;
const WEFT_FINISH_STOP: i32 = weft_finish_reason::WEFT_FINISH_STOP as i32;
const WEFT_FINISH_LENGTH: i32 = weft_finish_reason::WEFT_FINISH_LENGTH as i32;
const WEFT_FINISH_CANCELLED: i32 = weft_finish_reason::WEFT_FINISH_CANCELLED as i32;
const WEFT_FINISH_TOOL_CALLS: i32 = weft_finish_reason::WEFT_FINISH_TOOL_CALLS as i32;

/// weft_event.stop_kind of a DONE event with WEFT_FINISH_STOP (or WEFT_FINISH_TOOL_CALLS): what
/// stopped the request.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum weft_stop_kind {
    /// Not a WEFT_FINISH_STOP / WEFT_FINISH_TOOL_CALLS (or not a DONE event).
    WEFT_STOP_NONE = 0,
    /// One of the model's end-of-sequence tokens (stop_token_id; not counted, not in the text).
    WEFT_STOP_EOS = 1,
    /// One of the request's stop strings (stop_string); it and what followed are cut.
    WEFT_STOP_STRING = 2,
    /// The request's constraint (json_schema, regex, grammar, choice) was complete.
    WEFT_STOP_CONSTRAINT = 3,
}

const WEFT_STOP_NONE: i32 = weft_stop_kind::WEFT_STOP_NONE as i32;
const WEFT_STOP_EOS: i32 = weft_stop_kind::WEFT_STOP_EOS as i32;
const WEFT_STOP_STRING: i32 = weft_stop_kind::WEFT_STOP_STRING as i32;
const WEFT_STOP_CONSTRAINT: i32 = weft_stop_kind::WEFT_STOP_CONSTRAINT as i32;

/// One of the most likely tokens at a step (see weft_event.top_logprobs).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct weft_token_logprob {
    pub token_id: i32,
    /// Natural-log probability.
    pub logprob: f32,
}

/// weft_tool_delta.kind.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum weft_tool_delta_kind {
    /// Call number `index` begins: id and name are set, arguments is "".
    WEFT_TOOL_DELTA_START = 1,
    /// More of call `index`'s arguments (JSON text): arguments is set, id and name are "".
    WEFT_TOOL_DELTA_ARGUMENTS = 2,
}

const WEFT_TOOL_DELTA_START: i32 = weft_tool_delta_kind::WEFT_TOOL_DELTA_START as i32;
const WEFT_TOOL_DELTA_ARGUMENTS: i32 = weft_tool_delta_kind::WEFT_TOOL_DELTA_ARGUMENTS as i32;

/// A streamed piece of a tool call (see weft_event.tool_deltas), as OpenAI streams
/// `delta.tool_calls`: a START with the call's id and name, then ARGUMENTS fragments whose
/// concatenation is the call's arguments JSON text. Strings are UTF-8, NUL-terminated, never
/// NULL ("" when they do not apply), owned by the library and valid only during the callback.
#[repr(C)]
pub struct weft_tool_delta {
    /// A weft_tool_delta_kind.
    pub kind: i32,
    /// Which call of this request's output (0-based, in the order the model wrote them).
    pub index: u32,
    /// START: the call's id ("call_" + 24 letters or digits).
    pub id: *const c_char,
    pub id_len: usize,
    /// START: the function's name.
    pub name: *const c_char,
    pub name_len: usize,
    /// ARGUMENTS: the next fragment of the arguments' JSON text.
    pub arguments: *const c_char,
    pub arguments_len: usize,
}

/// A complete tool call (see weft_event.tool_calls). Strings as in weft_tool_delta.
#[repr(C)]
pub struct weft_tool_call {
    pub id: *const c_char,
    pub id_len: usize,
    pub name: *const c_char,
    pub name_len: usize,
    /// The arguments as JSON text (an object, as the model wrote it).
    pub arguments: *const c_char,
    pub arguments_len: usize,
}

/// One event of one request, passed to its weft_event_fn. The struct and everything it points
/// to are owned by the library and valid only during the callback: copy what you keep. Fields
/// that do not apply to the event's kind hold the stated neutral values. New fields may be
/// appended at the end in later versions (same WEFT_ABI_VERSION); never allocate or copy this
/// struct by value expecting a fixed size.
#[repr(C)]
pub struct weft_event {
    /// The id weft_submit returned for this request.
    pub request_id: u64,
    /// A weft_event_kind: WEFT_EVENT_TOKEN, WEFT_EVENT_DONE or WEFT_EVENT_ERROR.
    pub kind: i32,
    /// TOKEN: the generated token id; -1 for other kinds.
    pub token_id: i32,
    /// TOKEN: the UTF-8 text this token adds. Never a partial code point; may be empty (text
    /// held back until a character or a possible stop string completes). DONE: the text still
    /// held back when the request ended (often ""); the whole output is every TOKEN's text
    /// followed by DONE's. NUL-terminated for convenience, but use text_len (the text may
    /// contain NUL bytes). Never NULL ("" for ERROR).
    pub text: *const c_char,
    /// Length of text in bytes, excluding the terminating NUL.
    pub text_len: usize,
    /// DONE: a weft_finish_reason (WEFT_FINISH_STOP, WEFT_FINISH_LENGTH,
    /// WEFT_FINISH_CANCELLED or, for a request with "tools", WEFT_FINISH_TOOL_CALLS); -1 for
    /// other kinds.
    pub finish_reason: i32,
    /// DONE: prompt length in tokens; 0 for other kinds.
    pub prompt_tokens: u32,
    /// DONE: tokens generated (a final stop token is not counted); 0 for other kinds.
    pub completion_tokens: u32,
    /// DONE: prompt tokens served from the prompt cache; 0 for other kinds.
    pub cached_tokens: u32,
    /// ERROR: what went wrong (UTF-8, NUL-terminated, see message_len). Never NULL ("" for
    /// other kinds).
    pub message: *const c_char,
    /// Length of message in bytes, excluding the terminating NUL.
    pub message_len: usize,
    /// TOKEN, when the request set "logprobs": true: the token's natural-log probability (after
    /// logit bias and penalties, before temperature). NaN otherwise.
    pub logprob: f32,
    /// TOKEN, with "top_logprobs": n > 0: the n most likely tokens at this step, best first.
    /// NULL when top_logprobs_len is 0.
    pub top_logprobs: *const weft_token_logprob,
    /// Number of entries in top_logprobs.
    pub top_logprobs_len: usize,
    /// DONE with WEFT_FINISH_STOP or WEFT_FINISH_TOOL_CALLS: a weft_stop_kind (WEFT_STOP_EOS, WEFT_STOP_STRING or
    /// WEFT_STOP_CONSTRAINT);
    /// WEFT_STOP_NONE (0) otherwise.
    pub stop_kind: i32,
    /// DONE with WEFT_STOP_EOS: the end-of-sequence token that ended the request; -1 otherwise.
    pub stop_token_id: i32,
    /// DONE with WEFT_STOP_STRING: the stop string that matched (UTF-8, NUL-terminated, see
    /// stop_string_len). Never NULL ("" otherwise).
    pub stop_string: *const c_char,
    /// Length of stop_string in bytes, excluding the terminating NUL.
    pub stop_string_len: usize,
    /// (ABI minor 1) TOKEN and DONE of a request with "tools": the tool-call pieces this event
    /// adds, in order (the text of a call never appears in text). DONE's are the pieces the end
    /// released, so assembling every TOKEN's and DONE's deltas gives DONE's tool_calls. NULL
    /// when tool_deltas_len is 0.
    pub tool_deltas: *const weft_tool_delta,
    /// Number of entries in tool_deltas.
    pub tool_deltas_len: usize,
    /// (ABI minor 1) DONE of a request with "tools": every call the output made, complete (also
    /// with WEFT_FINISH_LENGTH, whose last call may be cut short). NULL when tool_calls_len is 0.
    pub tool_calls: *const weft_tool_call,
    /// Number of entries in tool_calls.
    pub tool_calls_len: usize,
}

/// Receives a request's events, in order, on a delivery thread the library runs for that
/// request (never on the thread that called weft_submit, never on the engine's thread). Different
/// requests' callbacks may run at the same time on different threads. It must return (not
/// longjmp or throw). A slow callback holds back only its own request: the engine parks that
/// row while its undelivered events pile up and lets it continue once the callback catches up.
/// From inside it you may call weft_cancel, weft_submit, weft_engine_stats, weft_last_error and
/// the version/status functions, but not weft_engine_shutdown or weft_engine_free.
pub type weft_event_fn = Option<unsafe extern "C" fn(user_data: *mut c_void, event: *const weft_event)>;

pub(crate) struct Callback {
    pub func: unsafe extern "C" fn(*mut c_void, *const weft_event),
    pub user_data: *mut c_void,
}

// SAFETY: the C contract says callbacks run on a library-owned delivery thread; the caller
// guarantees user_data may be used there.
unsafe impl Send for Callback {}

/// The request id, published by weft_submit once `Engine::submit` returns it. Events may be
/// queued before that, so the delivery thread waits for it before the first callback.
#[derive(Default)]
pub(crate) struct IdSlot {
    id: Mutex<u64>,
    ready: Condvar,
}

impl IdSlot {
    pub fn publish(&self, id: u64) {
        *self.id.lock().unwrap_or_else(|e| e.into_inner()) = id;
        self.ready.notify_all();
    }

    fn wait(&self) -> u64 {
        let mut id = self.id.lock().unwrap_or_else(|e| e.into_inner());
        while *id == 0 {
            id = self.ready.wait(id).unwrap_or_else(|e| e.into_inner());
        }
        *id
    }
}

/// Buffers reused across a request's events (NUL-terminated copies of text / message).
#[derive(Default)]
struct Buffers {
    text: Vec<u8>,
    message: Vec<u8>,
    stop: Vec<u8>,
    top: Vec<weft_token_logprob>,
    /// NUL-terminated strings of the event's tool deltas / calls (each its own allocation, so
    /// pointers stay valid while more are added).
    tool_strings: Vec<Vec<u8>>,
    tool_deltas: Vec<weft_tool_delta>,
    tool_calls: Vec<weft_tool_call>,
    /// The calls as delivered so far, for the pieces DONE must still release.
    assembled: Assembler,
}

impl Buffers {
    /// A NUL-terminated copy of `s` that lives until the next event.
    fn keep(&mut self, s: &str) -> (*const c_char, usize) {
        let mut b = Vec::with_capacity(s.len() + 1);
        b.extend_from_slice(s.as_bytes());
        b.push(0);
        let p = b.as_ptr().cast();
        self.tool_strings.push(b);
        (p, s.len())
    }

    fn set_deltas(&mut self, deltas: &[ToolDelta]) {
        let empty: *const c_char = c"".as_ptr();
        for d in deltas {
            self.assembled.apply(d);
            let mut out = weft_tool_delta {
                kind: 0,
                index: 0,
                id: empty,
                id_len: 0,
                name: empty,
                name_len: 0,
                arguments: empty,
                arguments_len: 0,
            };
            match d {
                ToolDelta::Start { index, id, name } => {
                    out.kind = WEFT_TOOL_DELTA_START;
                    out.index = u32::try_from(*index).unwrap_or(u32::MAX);
                    (out.id, out.id_len) = self.keep(id);
                    (out.name, out.name_len) = self.keep(name);
                }
                ToolDelta::Arguments { index, fragment } => {
                    out.kind = WEFT_TOOL_DELTA_ARGUMENTS;
                    out.index = u32::try_from(*index).unwrap_or(u32::MAX);
                    (out.arguments, out.arguments_len) = self.keep(fragment);
                }
            }
            self.tool_deltas.push(out);
        }
    }

    fn set_calls(&mut self, calls: &[ToolCall]) {
        for c in calls {
            let (id, id_len) = self.keep(&c.id);
            let (name, name_len) = self.keep(&c.name);
            let (arguments, arguments_len) = self.keep(&c.arguments);
            self.tool_calls.push(weft_tool_call { id, id_len, name, name_len, arguments, arguments_len });
        }
    }
}

fn nul_terminated(buf: &mut Vec<u8>, s: &str) -> (*const c_char, usize) {
    buf.clear();
    buf.extend_from_slice(s.as_bytes());
    buf.push(0);
    (buf.as_ptr().cast(), s.len())
}

/// Undelivered events at which the row is paused, and the level at which it resumes: deep
/// enough that a callback keeping up never pauses its row, shallow enough to bound memory.
const PAUSE_AT: usize = 64;
const RESUME_AT: usize = 16;

/// Events between the engine thread (producer) and one request's delivery thread.
#[derive(Default)]
struct Queue {
    state: Mutex<QueueState>,
    ready: Condvar,
}

#[derive(Default)]
struct QueueState {
    events: VecDeque<Event>,
    /// The engine dropped the sink: no more events will come.
    closed: bool,
    /// Delivering failed inside the library: the sink cancels the row.
    failed: bool,
}

impl Queue {
    fn lock(&self) -> std::sync::MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Marks the queue closed when the engine drops the sink, so the delivery thread never waits
/// for events that cannot come.
struct Producer(Arc<Queue>);

impl Drop for Producer {
    fn drop(&mut self) {
        self.0.lock().closed = true;
        self.0.ready.notify_all();
    }
}

/// A request's sink for the engine, and what starts its delivery thread once the request is
/// accepted (events queue up meanwhile).
pub(crate) struct Delivery {
    queue: Arc<Queue>,
    flow: RowFlow,
}

impl Delivery {
    pub fn new() -> (Delivery, Sink) {
        let queue = Arc::new(Queue::default());
        let flow = RowFlow::new();
        let producer = Producer(Arc::clone(&queue));
        let pause = flow.clone();
        let sink: Sink = Box::new(move |ev: &Event| {
            let q = &producer.0;
            let mut state = q.lock();
            state.events.push_back(ev.clone());
            if state.events.len() >= PAUSE_AT && !ev.is_final() {
                pause.pause();
            }
            let keep_going = !state.failed;
            drop(state);
            q.ready.notify_one();
            keep_going
        });
        (Delivery { queue, flow }, sink)
    }

    pub fn flow(&self) -> RowFlow {
        self.flow.clone()
    }

    /// Starts the thread that calls `cb` with each event until the final one.
    pub fn spawn(self, cb: Callback, slot: Arc<IdSlot>) -> std::io::Result<JoinHandle<()>> {
        std::thread::Builder::new()
            .name("weft-events".into())
            .spawn(move || self.run(cb, &slot))
    }

    fn run(self, cb: Callback, slot: &IdSlot) {
        let id = slot.wait();
        let mut bufs = Buffers::default();
        loop {
            let ev = {
                let mut state = self.queue.lock();
                loop {
                    if let Some(ev) = state.events.pop_front() {
                        if state.events.len() <= RESUME_AT {
                            self.flow.resume();
                        }
                        break ev;
                    }
                    if state.closed {
                        return;
                    }
                    state = self.queue.ready.wait(state).unwrap_or_else(|e| e.into_inner());
                }
            };
            // The callback is C (an unwind out of it aborts); the Rust around it must not unwind.
            let delivered = catch_unwind(AssertUnwindSafe(|| deliver(&cb, id, &ev, &mut bufs)));
            if let Err(payload) = delivered {
                eprintln!(
                    "weft: internal error delivering an event of request {id}: {}",
                    crate::status::panic_message(&*payload)
                );
                // Cancels the row (C cancels through weft_cancel); its final event still comes.
                self.queue.lock().failed = true;
                self.flow.resume();
            }
            if ev.is_final() {
                return;
            }
        }
    }
}

fn deliver(cb: &Callback, id: u64, ev: &Event, bufs: &mut Buffers) {
    let empty: *const c_char = c"".as_ptr();
    let mut e = weft_event {
        request_id: id,
        kind: 0,
        token_id: -1,
        text: empty,
        text_len: 0,
        finish_reason: -1,
        prompt_tokens: 0,
        completion_tokens: 0,
        cached_tokens: 0,
        message: empty,
        message_len: 0,
        logprob: f32::NAN,
        top_logprobs: std::ptr::null(),
        top_logprobs_len: 0,
        stop_kind: WEFT_STOP_NONE,
        stop_token_id: -1,
        stop_string: empty,
        stop_string_len: 0,
        tool_deltas: std::ptr::null(),
        tool_deltas_len: 0,
        tool_calls: std::ptr::null(),
        tool_calls_len: 0,
    };
    bufs.tool_strings.clear();
    bufs.tool_deltas.clear();
    bufs.tool_calls.clear();
    let sat = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    match ev {
        Event::Token { token_id, text, logprobs, tool_calls } => {
            e.kind = WEFT_EVENT_TOKEN;
            bufs.set_deltas(tool_calls);
            e.token_id = i32::try_from(*token_id).unwrap_or(i32::MAX);
            (e.text, e.text_len) = nul_terminated(&mut bufs.text, text);
            if let Some(lp) = logprobs {
                e.logprob = lp.logprob;
                bufs.top.clear();
                bufs.top.extend(
                    lp.top.iter().map(|&(t, l)| weft_token_logprob {
                        token_id: i32::try_from(t).unwrap_or(i32::MAX),
                        logprob: l,
                    }),
                );
                if !bufs.top.is_empty() {
                    e.top_logprobs = bufs.top.as_ptr();
                    e.top_logprobs_len = bufs.top.len();
                }
            }
        }
        Event::Done { finish_reason, usage, text, stop, tool_calls, .. } => {
            e.kind = WEFT_EVENT_DONE;
            let released = bufs.assembled.catch_up(tool_calls);
            bufs.set_deltas(&released);
            bufs.set_calls(tool_calls);
            (e.text, e.text_len) = nul_terminated(&mut bufs.text, text);
            match stop {
                Some(StopCause::Eos { token_id }) => {
                    e.stop_kind = WEFT_STOP_EOS;
                    e.stop_token_id = i32::try_from(*token_id).unwrap_or(i32::MAX);
                }
                Some(StopCause::StopString { stop }) => {
                    e.stop_kind = WEFT_STOP_STRING;
                    (e.stop_string, e.stop_string_len) = nul_terminated(&mut bufs.stop, stop);
                }
                Some(StopCause::Constraint) => e.stop_kind = WEFT_STOP_CONSTRAINT,
                None => {}
            }
            e.finish_reason = match finish_reason {
                FinishReason::Stop if !tool_calls.is_empty() => WEFT_FINISH_TOOL_CALLS,
                FinishReason::Stop => WEFT_FINISH_STOP,
                FinishReason::Length => WEFT_FINISH_LENGTH,
                FinishReason::Cancelled => WEFT_FINISH_CANCELLED,
            };
            e.prompt_tokens = sat(usage.prompt_tokens);
            e.completion_tokens = sat(usage.completion_tokens);
            e.cached_tokens = sat(usage.cached_tokens);
        }
        Event::Error { message } => {
            e.kind = WEFT_EVENT_ERROR;
            (e.message, e.message_len) = nul_terminated(&mut bufs.message, message);
        }
    }
    if !bufs.tool_deltas.is_empty() {
        e.tool_deltas = bufs.tool_deltas.as_ptr();
        e.tool_deltas_len = bufs.tool_deltas.len();
    }
    if !bufs.tool_calls.is_empty() {
        e.tool_calls = bufs.tool_calls.as_ptr();
        e.tool_calls_len = bufs.tool_calls.len();
    }
    let _ = IN_CALLBACK.try_with(|c| c.set(c.get() + 1));
    // SAFETY: a valid function pointer from weft_submit; `e` and its buffers outlive the call.
    unsafe { (cb.func)(cb.user_data, &e) };
    let _ = IN_CALLBACK.try_with(|c| c.set(c.get() - 1));
}
