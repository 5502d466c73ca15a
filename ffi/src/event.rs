//! Delivering engine events to C callbacks.

use std::ffi::{c_char, c_void};
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use weft::engine::{Event, EventQueue, Next, RowFlow, Sink, StopCause};
use weft::generate::FinishReason;
use weft::tools::{ToolCall, ToolDelta};

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
    /// (ABI minor 1) DONE of a request with "tools": every call the output made, complete (a
    /// call the output did not finish, e.g. cut by max_tokens, is not delivered, not even in
    /// part: a call's deltas come once it is complete). NULL when tool_calls_len is 0.
    pub tool_calls: *const weft_tool_call,
    /// Number of entries in tool_calls.
    pub tool_calls_len: usize,
    /// (ABI minor 2) TOKEN and DONE of a model that reasons ("thinks") before it answers: the
    /// reasoning text this event adds, markers removed (text holds only the answer). DONE's is
    /// the reasoning still held back at the end. UTF-8, NUL-terminated, see reasoning_len;
    /// never NULL ("" when there is none).
    pub reasoning: *const c_char,
    /// Length of reasoning in bytes, excluding the terminating NUL.
    pub reasoning_len: usize,
    /// (ABI minor 2) DONE: how many of completion_tokens were spent reasoning (the block and
    /// its markers); 0 for other kinds.
    pub reasoning_tokens: u32,
}

/// Receives a request's events, in order, on one of a small pool of delivery threads the
/// library runs per engine (never on the thread that called weft_submit, never on the engine's
/// thread). One request's callbacks never overlap and come in order; different requests'
/// callbacks may run at the same time on different pool threads. It must return (not longjmp
/// or throw). A slow callback holds back its own request and occupies one pool thread: the
/// engine parks that row while its undelivered events pile up and lets it continue once the
/// callback catches up, and the other requests are delivered by the other pool threads.
/// From inside it you may call weft_cancel, weft_submit, weft_engine_stats, weft_last_error and
/// the version/status functions, but not weft_engine_shutdown or weft_engine_free.
pub type weft_event_fn = Option<unsafe extern "C" fn(user_data: *mut c_void, event: *const weft_event)>;

pub(crate) struct Callback {
    pub func: unsafe extern "C" fn(*mut c_void, *const weft_event),
    pub user_data: *mut c_void,
}

// SAFETY: the C contract says callbacks run on library-owned delivery threads; the caller
// guarantees user_data may be used there. One request's callback is called by one pool thread
// at a time (its mailbox is scheduled once), so sharing the pointer pair is sound.
unsafe impl Send for Callback {}
unsafe impl Sync for Callback {}

/// Buffers reused across a request's events (NUL-terminated copies of text / message).
#[derive(Default)]
struct Buffers {
    text: Vec<u8>,
    reasoning: Vec<u8>,
    message: Vec<u8>,
    stop: Vec<u8>,
    top: Vec<weft_token_logprob>,
    /// NUL-terminated strings of the event's tool deltas / calls (each its own allocation, so
    /// pointers stay valid while more are added).
    tool_strings: Vec<Vec<u8>>,
    tool_deltas: Vec<weft_tool_delta>,
    tool_calls: Vec<weft_tool_call>,
}

// SAFETY: the raw pointers point into the buffers' own allocations; only the pool thread
// delivering the request's event uses them.
unsafe impl Send for Buffers {}

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

/// Delivery threads per engine at most: enough that a few blocked callbacks do not hold back
/// the rest, few enough that thousands of outstanding requests cost no more threads.
const MAX_THREADS: usize = 8;
/// Events one pool thread delivers for a request before giving others a turn.
const BATCH: usize = 32;

/// An engine's delivery pool: requests with events waiting (their mailboxes) queue for the
/// pool's threads, which start on demand up to [`MAX_THREADS`]. A mailbox is scheduled at most
/// once at a time, so one request's events are delivered in order and never concurrently.
#[derive(Default)]
pub(crate) struct Pool {
    state: Mutex<PoolState>,
    /// Wakes idle pool threads (work, or stopping).
    work: Condvar,
    /// Wakes `drain_and_stop` when the last outstanding request got its final event.
    drained: Condvar,
}

#[derive(Default)]
struct PoolState {
    run: VecDeque<Arc<Mailbox>>,
    threads: Vec<JoinHandle<()>>,
    idle: usize,
    /// Requests accepted and not yet delivered their final event.
    outstanding: usize,
    stopping: bool,
}

/// One request's side of the pool: its event queue (with the row's flow control, from the
/// engine), its callback and its reused buffers.
struct Mailbox {
    queue: EventQueue,
    cb: Callback,
    /// The request id, published by weft_submit once `Engine::submit` returned it; 0 before.
    /// Events may be queued before that: nothing is delivered until it is set.
    id: AtomicU64,
    scheduled: AtomicBool,
    finished: AtomicBool,
    bufs: Mutex<Buffers>,
}

/// The engine's sink for one request: queues the event and schedules the request's mailbox;
/// dropping it (the engine is done with the request) closes the queue and schedules it too.
struct PoolSink {
    inner: Option<Sink>,
    mailbox: Arc<Mailbox>,
    pool: Arc<Pool>,
}

impl Drop for PoolSink {
    fn drop(&mut self) {
        drop(self.inner.take());
        Pool::schedule(&self.pool, &self.mailbox);
    }
}

/// A submitted request's handle on its mailbox: publish its id once the engine accepted it,
/// or abandon it when the engine refused it.
pub(crate) struct Delivery {
    mailbox: Arc<Mailbox>,
    pool: Arc<Pool>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Pool {
    /// A mailbox for a new request: the sink and flow to submit with. Fails only when the pool
    /// has no thread and none can be started.
    pub fn register(self: &Arc<Self>, cb: Callback) -> std::io::Result<(Delivery, Sink, RowFlow)> {
        let (queue, sink) = EventQueue::new();
        let flow = queue.flow();
        let mailbox = Arc::new(Mailbox {
            queue,
            cb,
            id: AtomicU64::new(0),
            scheduled: AtomicBool::new(false),
            finished: AtomicBool::new(false),
            bufs: Mutex::new(Buffers::default()),
        });
        {
            let mut st = lock(&self.state);
            if st.threads.is_empty() {
                self.spawn(&mut st)?;
            }
            st.outstanding += 1;
        }
        let pool_sink = PoolSink { inner: Some(sink), mailbox: Arc::clone(&mailbox), pool: Arc::clone(self) };
        let mut pool_sink = pool_sink;
        let sink: Sink = Box::new(move |ev: &Event| {
            let keep_going = pool_sink.inner.as_mut().is_some_and(|s| s(ev));
            Pool::schedule(&pool_sink.pool, &pool_sink.mailbox);
            keep_going
        });
        Ok((Delivery { mailbox, pool: Arc::clone(self) }, sink, flow))
    }

    fn spawn(self: &Arc<Self>, st: &mut PoolState) -> std::io::Result<()> {
        let pool = Arc::clone(self);
        let t = std::thread::Builder::new().name("weft-events".into()).spawn(move || pool.work())?;
        st.threads.push(t);
        Ok(())
    }

    /// Queues `mb` for a pool thread unless it is queued or running already, or its id is not
    /// published yet (publishing schedules it).
    fn schedule(self: &Arc<Self>, mb: &Arc<Mailbox>) {
        if mb.id.load(Ordering::SeqCst) == 0 || mb.finished.load(Ordering::SeqCst) {
            return;
        }
        if mb.scheduled.swap(true, Ordering::SeqCst) {
            return;
        }
        let mut st = lock(&self.state);
        st.run.push_back(Arc::clone(mb));
        if st.idle == 0 && st.threads.len() < MAX_THREADS && !st.stopping {
            // Best effort: the threads already running deliver it otherwise.
            let _ = self.spawn(&mut st);
        }
        drop(st);
        self.work.notify_one();
    }

    fn work(self: Arc<Self>) {
        loop {
            let mb = {
                let mut st = lock(&self.state);
                loop {
                    if let Some(mb) = st.run.pop_front() {
                        break mb;
                    }
                    if st.stopping {
                        return;
                    }
                    st.idle += 1;
                    st = self.work.wait(st).unwrap_or_else(|e| e.into_inner());
                    st.idle -= 1;
                }
            };
            self.run(&mb);
        }
    }

    /// Delivers up to [`BATCH`] of `mb`'s events, then lets it be scheduled again.
    fn run(self: &Arc<Self>, mb: &Arc<Mailbox>) {
        let id = mb.id.load(Ordering::SeqCst);
        for _ in 0..BATCH {
            let ev = match mb.queue.try_next() {
                Next::Event(ev) => ev,
                Next::Empty => break,
                Next::Closed => return self.finished(mb),
            };
            let mut bufs = lock(&mb.bufs);
            // The callback is C (an unwind out of it aborts); the Rust around it must not unwind.
            let delivered = catch_unwind(AssertUnwindSafe(|| deliver(&mb.cb, id, &ev, &mut bufs)));
            drop(bufs);
            if let Err(payload) = delivered {
                eprintln!(
                    "weft: internal error delivering an event of request {id}: {}",
                    crate::status::panic_message(&*payload)
                );
                // Cancels the row (C cancels through weft_cancel); its final event still comes.
                mb.queue.cancel();
            }
            if ev.is_final() {
                return self.finished(mb);
            }
        }
        mb.scheduled.store(false, Ordering::SeqCst);
        if mb.queue.has_pending() {
            Pool::schedule(self, mb);
        }
    }

    /// `mb` got its final event (or its queue closed): it is never scheduled again.
    fn finished(&self, mb: &Mailbox) {
        if mb.finished.swap(true, Ordering::SeqCst) {
            return;
        }
        let mut st = lock(&self.state);
        st.outstanding -= 1;
        if st.outstanding == 0 {
            self.drained.notify_all();
        }
    }

    /// Waits until every accepted request got its final event (the engine has been dropped,
    /// so each has one queued), then stops and joins the pool's threads.
    pub fn drain_and_stop(&self) {
        let mut st = lock(&self.state);
        while st.outstanding > 0 {
            st = self.drained.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        st.stopping = true;
        let threads = std::mem::take(&mut st.threads);
        drop(st);
        self.work.notify_all();
        for t in threads {
            let _ = t.join();
        }
        lock(&self.state).stopping = false;
    }

    /// Live delivery threads (tests and stats).
    #[allow(dead_code)]
    pub fn threads(&self) -> usize {
        lock(&self.state).threads.len()
    }
}

impl Delivery {
    /// The engine accepted the request as `id`: its events may now be delivered.
    pub fn publish(self, id: u64) {
        self.mailbox.id.store(id, Ordering::SeqCst);
        Pool::schedule(&self.pool, &self.mailbox);
    }

    /// The engine refused the request: it gets no events.
    pub fn abandon(self) {
        self.pool.finished(&self.mailbox);
    }
}

fn deliver(cb: &Callback, id: u64, ev: &Event, bufs: &mut Buffers) {
    // The C event has no kind for admission (DONE carries the same counts): not delivered.
    if matches!(ev, Event::Started { .. }) {
        return;
    }
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
        reasoning: empty,
        reasoning_len: 0,
        reasoning_tokens: 0,
    };
    bufs.tool_strings.clear();
    bufs.tool_deltas.clear();
    bufs.tool_calls.clear();
    let sat = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    match ev {
        Event::Token { token_id, text, reasoning, logprobs, tool_calls } => {
            e.kind = WEFT_EVENT_TOKEN;
            bufs.set_deltas(tool_calls);
            e.token_id = i32::try_from(*token_id).unwrap_or(i32::MAX);
            (e.text, e.text_len) = nul_terminated(&mut bufs.text, text);
            (e.reasoning, e.reasoning_len) = nul_terminated(&mut bufs.reasoning, reasoning);
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
        Event::Done { finish_reason, usage, text, reasoning, stop, tool_deltas, tool_calls, .. } => {
            e.kind = WEFT_EVENT_DONE;
            bufs.set_deltas(tool_deltas);
            bufs.set_calls(tool_calls);
            (e.text, e.text_len) = nul_terminated(&mut bufs.text, text);
            (e.reasoning, e.reasoning_len) = nul_terminated(&mut bufs.reasoning, reasoning);
            e.reasoning_tokens = sat(usage.reasoning_tokens);
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
                // The call limit: documented as WEFT_STOP_NONE ("the call itself ended it").
                Some(StopCause::ToolCallLimit) | None => {}
            }
            e.finish_reason = match finish_reason {
                FinishReason::ToolCalls => WEFT_FINISH_TOOL_CALLS,
                FinishReason::Stop => WEFT_FINISH_STOP,
                FinishReason::Length => WEFT_FINISH_LENGTH,
                FinishReason::Cancelled => WEFT_FINISH_CANCELLED,
            };
            e.prompt_tokens = sat(usage.prompt_tokens);
            e.completion_tokens = sat(usage.completion_tokens);
            e.cached_tokens = sat(usage.cached_tokens);
        }
        Event::Started { .. } => {}
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
