//! Fuzzing the C ABI's JSON entry points through the real `extern "C"` functions: the options
//! document of `weft_engine_new` and the request document of `weft_submit`, fed arbitrary bytes
//! (invalid UTF-8, embedded NULs: the API reads up to the first one), arbitrary JSON values
//! (whose object keys are often the real field names) and mutations of valid documents (a field
//! set to an odd value, removed or misspelled, then maybe a byte flipped, inserted or cut off),
//! against the tiny goldens model `goldens/models/llama-fp32`.
//!
//! Every case must either fail with a status code and a message (never WEFT_ERR_INTERNAL, which
//! is what a caught panic becomes, and then no callback at all), or succeed and end with exactly
//! one final event (DONE or ERROR) and nothing after it, the engine still healthy
//! (`weft_engine_health`). Each call runs under a time limit, so a hang fails the case instead
//! of the suite. A request still running after a short while is cancelled (also a path under
//! test) so that a huge `max_tokens` stays cheap. Each test ends by checking that its engine
//! still produces mlx-lm's greedy tokens.
//!
//! The RNG seed is fixed, so CI runs the same cases every time; explore with
//! `WEFT_FUZZ_SEED=<u64>` and `WEFT_FUZZ_CASES=<multiplier>`:
//!   WEFT_FUZZ_SEED=7 WEFT_FUZZ_CASES=10 cargo test --release -p weft-ffi --test json_fuzz

use std::ffi::{c_void, CStr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Condvar, Mutex, Once};
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};
use serde_json::{json, Map, Value};
use weft_ffi::{
    weft_cancel, weft_engine, weft_engine_free, weft_engine_health, weft_engine_new, weft_event, weft_event_kind,
    weft_last_error, weft_status, weft_submit,
};

const OK: i32 = weft_status::WEFT_OK as i32;
const INVALID: i32 = weft_status::WEFT_ERR_INVALID_ARGUMENT as i32;
const MODEL_LOAD: i32 = weft_status::WEFT_ERR_MODEL_LOAD as i32;
const CAPACITY: i32 = weft_status::WEFT_ERR_CAPACITY as i32;
const UNSUPPORTED: i32 = weft_status::WEFT_ERR_UNSUPPORTED as i32;
const TOKEN: i32 = weft_event_kind::WEFT_EVENT_TOKEN as i32;
const DONE: i32 = weft_event_kind::WEFT_EVENT_DONE as i32;
const ERROR: i32 = weft_event_kind::WEFT_EVENT_ERROR as i32;

/// The tiny model's vocabulary size: every generated token id is below it.
const VOCAB: i32 = 1024;
/// A call that has not returned by then is a hang.
const CALL_LIMIT: Duration = Duration::from_secs(20);
/// How long an accepted fuzz request may run before it is cancelled.
const RUN_BEFORE_CANCEL: Duration = Duration::from_millis(50);
/// How long a request may take to deliver its final event (after a cancel at the latest).
const FINAL_LIMIT: Duration = Duration::from_secs(20);

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn model_dir() -> String {
    repo_root().join("goldens/models/llama-fp32").to_str().unwrap().to_string()
}

/// Options without a "model" mean the default model: point the store at an empty directory and
/// a missing local wheel, so those cases fail fast (WEFT_ERR_MODEL_LOAD) instead of downloading.
/// Runs before any engine exists, while no other thread reads the environment.
fn setup() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let dir = std::env::temp_dir().join(format!("weft-json-fuzz-{}", std::process::id()));
        std::env::set_var("WEFT_MODELS_DIR", &dir);
        std::env::set_var("WEFT_DEFAULT_MODEL_WHEEL", dir.join("missing.whl"));
    });
}

fn cases(base: u32) -> u32 {
    let scale = std::env::var("WEFT_FUZZ_CASES").ok().and_then(|s| s.parse::<u32>().ok()).unwrap_or(1);
    base * scale.max(1)
}

/// Runs `strategy` × `test` for `cases` cases from a seeded RNG; panics with the (shrunk)
/// failing input.
fn fuzz<S: Strategy>(name: &str, cases: u32, strategy: S, test: impl Fn(S::Value) -> Result<(), TestCaseError>)
where
    S::Value: std::fmt::Debug,
{
    let seed: u64 = std::env::var("WEFT_FUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5EED_F00D);
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    for (i, b) in name.bytes().enumerate() {
        bytes[8 + i % 24] ^= b;
    }
    // Shrinking is bounded: a hanging case costs CALL_LIMIT per attempt.
    let config =
        Config { cases, max_shrink_iters: 32, max_shrink_time: 60_000, failure_persistence: None, ..Config::default() };
    let mut runner = TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &bytes));
    if let Err(e) = runner.run(&strategy, test) {
        panic!("{name} (WEFT_FUZZ_SEED={seed}): {e}");
    }
}

/// Runs `f` on its own thread and waits at most `limit` for it.
fn within<T: Send + 'static>(what: &str, limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(limit) {
        Ok(v) => v,
        Err(_) => panic!("{what} did not return within {limit:?}"),
    }
}

fn last_error() -> String {
    // SAFETY: weft_last_error never returns NULL; the string is copied before the next call.
    unsafe { CStr::from_ptr(weft_last_error()) }.to_string_lossy().into_owned()
}

/// The C string the API sees: `bytes` up to its first NUL (the terminator is added).
fn c_bytes(bytes: &[u8]) -> Vec<u8> {
    let mut v = bytes.to_vec();
    v.push(0);
    v
}

/// What the cases of one test did, so that a test whose cases all fail early (or all pass)
/// is noticed: each test asserts that both outcomes occurred where both are possible.
#[derive(Default)]
struct Tally {
    accepted: AtomicU64,
    refused: AtomicU64,
    cancelled: AtomicU64,
}

impl Tally {
    fn add(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn report(&self, name: &str) -> (u64, u64) {
        let (a, r, c) = (self.accepted.load(Ordering::Relaxed), self.refused.load(Ordering::Relaxed), self.cancelled.load(Ordering::Relaxed));
        eprintln!("{name}: {a} accepted ({c} of them cancelled while running), {r} refused");
        (a, r)
    }
}

/// A handle that may cross threads (the C contract allows calls from any thread).
#[derive(Clone, Copy)]
struct Handle(*mut weft_engine);
unsafe impl Send for Handle {}

impl Handle {
    /// (A method, so that closures capture the whole `Send` handle, not its raw field.)
    fn ptr(self) -> *mut weft_engine {
        self.0
    }
}

// ---------------------------------------------------------------------------------------------
// One request's events, as its callback sees them.

#[derive(Default)]
struct Record {
    tokens: Vec<i32>,
    finals: usize,
    after_final: usize,
    /// Events whose fields break the contract (wrong id, NULL text, unknown kind...).
    malformed: Vec<String>,
}

/// A request's user_data. Leaked: a callback may in principle still run when a failing case
/// unwinds, and it must never see freed memory.
#[derive(Default)]
struct Case {
    id: AtomicU64,
    record: Mutex<Record>,
    changed: Condvar,
}

impl Case {
    fn new() -> &'static Case {
        Box::leak(Box::default())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Record> {
        self.record.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until the final event arrived or `limit` passed; true if it arrived.
    fn wait_final(&self, limit: Duration) -> bool {
        let r = self.lock();
        let (r, _) = self.changed.wait_timeout_while(r, limit, |r| r.finals == 0).unwrap_or_else(|e| e.into_inner());
        r.finals > 0
    }
}

unsafe extern "C" fn on_event(user_data: *mut c_void, event: *const weft_event) {
    // SAFETY: user_data is a leaked &'static Case; event is valid during the callback.
    let case = unsafe { &*(user_data as *const Case) };
    let ev = unsafe { &*event };
    let mut r = case.lock();
    if r.finals > 0 {
        r.after_final += 1;
    }
    let id = case.id.load(Ordering::SeqCst);
    if ev.request_id != id {
        r.malformed.push(format!("request_id {} in an event of request {id}", ev.request_id));
    }
    if ev.text.is_null() || ev.message.is_null() {
        r.malformed.push(format!("NULL text or message in an event of kind {}", ev.kind));
    }
    match ev.kind {
        TOKEN => {
            if !(0..VOCAB).contains(&ev.token_id) {
                r.malformed.push(format!("token id {} outside the vocabulary", ev.token_id));
            }
            // SAFETY: text is non-NULL (checked above) with text_len bytes, valid in the callback.
            let text = (!ev.text.is_null()).then(|| unsafe { std::slice::from_raw_parts(ev.text.cast::<u8>(), ev.text_len) });
            if text.is_some_and(|t| std::str::from_utf8(t).is_err()) {
                r.malformed.push("token text is not UTF-8".into());
            }
            r.tokens.push(ev.token_id);
        }
        DONE => r.finals += 1,
        ERROR => {
            if ev.message_len == 0 {
                r.malformed.push("an ERROR event without a message".into());
            }
            r.finals += 1;
        }
        other => r.malformed.push(format!("unknown event kind {other}")),
    }
    drop(r);
    case.changed.notify_all();
}

/// Submits `bytes` (as a C string) and checks the outcome. Returns the case if accepted.
/// An accepted request still running after `patience` is cancelled.
fn submit_case(
    engine: Handle,
    bytes: &[u8],
    patience: Duration,
    tally: &Tally,
) -> Result<Option<&'static Case>, TestCaseError> {
    let case = Case::new();
    let text = c_bytes(bytes);
    let (status, message) = within("weft_submit", CALL_LIMIT, move || {
        let user = case as *const Case as *mut c_void;
        let out = case.id.as_ptr();
        let status = weft_submit(engine.ptr(), text.as_ptr().cast(), Some(on_event), user, out);
        (status, if status == OK { String::new() } else { last_error() })
    });
    if status != OK {
        prop_assert!(status == INVALID || status == CAPACITY, "weft_submit returned {status}: {message}");
        prop_assert!(!message.is_empty(), "status {status} without a message");
        prop_assert!(!message.contains("panic"), "a caught panic: {message}");
        let r = case.lock();
        prop_assert!(r.tokens.is_empty() && r.finals == 0, "a refused request got events");
        Tally::add(&tally.refused);
        return Ok(None);
    }
    let id = case.id.load(Ordering::SeqCst);
    prop_assert!(id > 0, "accepted without a request id");
    Tally::add(&tally.accepted);
    if !case.wait_final(patience) {
        Tally::add(&tally.cancelled);
        let status = within("weft_cancel", CALL_LIMIT, move || weft_cancel(engine.ptr(), id));
        prop_assert_eq!(status, OK, "weft_cancel of a running request: {}", last_error());
        prop_assert!(case.wait_final(FINAL_LIMIT), "request {} got no final event within {:?} of its cancel", id, FINAL_LIMIT);
    }
    let r = case.lock();
    prop_assert_eq!(r.finals, 1);
    prop_assert_eq!(r.after_final, 0);
    prop_assert!(r.malformed.is_empty(), "{:?}", r.malformed);
    drop(r);
    // The request did not take the engine down with it.
    let health = within("weft_engine_health", CALL_LIMIT, move || weft_engine_health(engine.ptr()));
    prop_assert_eq!(health, OK, "the engine is no longer healthy: {}", last_error());
    Ok(Some(case))
}

fn new_engine(options: &[u8]) -> (i32, String, Option<Handle>) {
    let text = c_bytes(options);
    within("weft_engine_new", CALL_LIMIT, move || {
        let mut engine: *mut weft_engine = std::ptr::null_mut();
        let status = weft_engine_new(text.as_ptr().cast(), &mut engine);
        let message = if status == OK { String::new() } else { last_error() };
        (status, message, (!engine.is_null()).then_some(Handle(engine)))
    })
}

fn free_engine(engine: Handle) {
    within("weft_engine_free", CALL_LIMIT, move || weft_engine_free(engine.ptr()));
}

/// The tiny model's engine, for the submit tests.
fn tiny_engine() -> Handle {
    setup();
    let options = json!({"model": model_dir(), "max_batch": 4}).to_string();
    let (status, message, engine) = new_engine(options.as_bytes());
    assert_eq!(status, OK, "{message}");
    engine.unwrap()
}

/// The engine still answers mlx-lm's greedy trajectory (goldens/llama-fp32.json, first case).
fn assert_still_exact(engine: Handle) {
    let golden: Value =
        serde_json::from_str(&std::fs::read_to_string(repo_root().join("goldens/llama-fp32.json")).unwrap()).unwrap();
    let single = &golden["single"][0];
    let want: Vec<i32> = single["tokens"].as_array().unwrap().iter().map(|t| t.as_i64().unwrap() as i32).collect();
    let request = json!({"prompt_ids": single["prompt_ids"], "max_tokens": want.len(), "ignore_eos": true});
    let case = submit_case(engine, request.to_string().as_bytes(), FINAL_LIMIT, &Tally::default())
        .unwrap()
        .expect("the golden request is accepted");
    assert_eq!(case.lock().tokens, want, "the engine drifted from mlx-lm after the fuzz cases");
}

// ---------------------------------------------------------------------------------------------
// Strategies.

/// The request fields: the contract's own list.
fn request_fields() -> &'static [&'static str] {
    &weft::contract::REQUEST_FIELDS
}

/// The engine options fuzzed: the contract's list minus the four MLX memory-policy fields, which
/// set process-wide MLX limits (a fuzzed 1-byte memory limit would starve every other test in
/// this process).
const OPTION_FIELDS: &[&str] = &[
    "model",
    "max_batch",
    "prompt_concurrency",
    "prefill_step_size",
    "kv_budget_bytes",
    "prompt_cache_bytes",
    "kv_bits",
    "kv_group_size",
    "quantized_kv_start",
];

/// Numbers at the edges of the ranges the parser checks, and just past them.
fn edge_number() -> impl Strategy<Value = Value> {
    prop::sample::select(vec![
        json!(0),
        json!(1),
        json!(-1),
        json!(2),
        json!(3),
        json!(20),
        json!(21),
        json!(1023),
        json!(1024),
        json!(2047),
        json!(2048),
        json!(65536),
        json!(u32::MAX),
        json!(u32::MAX as u64 + 1),
        json!(i64::MAX),
        json!(i64::MIN),
        json!(u64::MAX),
        json!(0.5),
        json!(-0.5),
        json!(1.5),
        json!(-0.0),
        json!(1e-45),
        json!(1e38),
        json!(3.5e38),
        json!(-3.5e38),
        json!(1e308),
        json!(-1e308),
    ])
}

/// A logit_bias object whose keys are token ids in and out of the vocabulary (and not ids).
fn logit_bias_edge() -> impl Strategy<Value = Value> {
    let key = prop::sample::select(vec!["0", "2", "1023", "1024", "4294967295", "4294967296", "-1", "01", " 1", "1e3", ""]);
    prop::collection::vec((key, edge_number()), 0..4)
        .prop_map(|kv| Value::Object(kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect()))
}

fn field_name(fields: &'static [&'static str]) -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(fields).prop_map(str::to_string),
        1 => prop::sample::select(vec!["role", "content"]).prop_map(str::to_string),
        1 => "\\PC{0,8}",
    ]
}

/// Any JSON value, biased towards what the parsers look at.
fn any_json(fields: &'static [&'static str]) -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_filter_map("finite", |x| serde_json::Number::from_f64(x).map(Value::Number)),
        edge_number(),
        "\\PC{0,16}".prop_map(Value::from),
        prop::sample::select(vec!["", "user", "system", "assistant", "\u{0}", "</s>", "{{", "\u{FFFD}"])
            .prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 48, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((field_name(fields), inner), 0..6)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

/// A request the tiny model serves.
fn valid_request() -> impl Strategy<Value = Map<String, Value>> {
    let ids = prop::collection::vec(0u32..1024, 1..12);
    let optional = (
        prop::option::of(1u32..24),
        prop::option::of(0.0f64..2.0),
        prop::option::of(0.05f64..1.0),
        prop::option::of(0u32..50),
        prop::option::of(any::<u64>()),
        prop::option::of(0.5f64..2.0),
        prop::option::of(prop::collection::btree_map(0u32..1024, -100.0f64..100.0, 0..3)),
        prop::option::of(any::<bool>()),
        prop::option::of(0u64..=20),
    );
    (ids, optional).prop_map(|(ids, (max, temp, top_p, top_k, seed, rep, bias, eos, top))| {
        let mut m = Map::new();
        m.insert("prompt_ids".into(), json!(ids));
        let mut put = |k: &str, v: Option<Value>| {
            if let Some(v) = v {
                m.insert(k.into(), v);
            }
        };
        put("max_tokens", max.map(Value::from));
        put("temperature", temp.map(Value::from));
        put("top_p", top_p.map(Value::from));
        put("top_k", top_k.map(Value::from));
        put("seed", seed.map(Value::from));
        put("repetition_penalty", rep.map(Value::from));
        put(
            "logit_bias",
            bias.map(|b| Value::Object(b.into_iter().map(|(k, v)| (k.to_string(), Value::from(v))).collect())),
        );
        put("ignore_eos", eos.map(Value::from));
        if let Some(n) = top {
            put("logprobs", Some(Value::from(true)));
            put("top_logprobs", Some(Value::from(n)));
        }
        m
    })
}

/// Engine options the tiny model loads with.
fn valid_options() -> impl Strategy<Value = Map<String, Value>> {
    (
        prop::option::of(1u32..9),
        prop::option::of(1u32..9),
        prop::option::of(1u32..4096),
        prop::option::of(1u64..1 << 30),
        prop::option::of(0u64..1 << 24),
        prop::option::of(prop::sample::select(vec![4u32, 8])),
    )
        .prop_map(|(batch, conc, step, budget, cache, bits)| {
            let mut m = Map::new();
            m.insert("model".into(), Value::from(model_dir()));
            let mut put = |k: &str, v: Option<Value>| {
                if let Some(v) = v {
                    m.insert(k.into(), v);
                }
            };
            put("max_batch", batch.map(Value::from));
            put("prompt_concurrency", conc.map(Value::from));
            put("prefill_step_size", step.map(Value::from));
            put("kv_budget_bytes", budget.map(Value::from));
            put("prompt_cache_bytes", cache.map(Value::from));
            if let Some(bits) = bits {
                // The tiny model's head_dim is 32: the default group size (64) does not divide it.
                put("kv_bits", Some(Value::from(bits)));
                put("kv_group_size", Some(Value::from(32)));
            }
            m
        })
}

/// One change to a document.
#[derive(Debug, Clone)]
enum Edit {
    Set(String, Value),
    Remove(String),
}

/// A byte-level change to the serialized document.
#[derive(Debug, Clone)]
enum ByteEdit {
    None,
    Flip(usize, u8),
    Insert(usize, u8),
    Truncate(usize),
}

fn edits(fields: &'static [&'static str]) -> impl Strategy<Value = Vec<Edit>> {
    let value = prop_oneof![
        4 => edge_number(),
        2 => any_json(fields),
        1 => logit_bias_edge(),
        // Token ids around the vocabulary's end, up to past the context length (2048).
        1 => prop::collection::vec(0u64..1100, 0..2100).prop_map(|v| json!(v)),
        1 => "\\PC{0,64}".prop_map(Value::from),
        1 => Just(Value::from("x".repeat(10_000))),
    ];
    let edit = prop_oneof![
        5 => (field_name(fields), value).prop_map(|(k, v)| Edit::Set(k, v)),
        1 => field_name(fields).prop_map(Edit::Remove),
    ];
    prop::collection::vec(edit, 1..3)
}

fn byte_edit() -> impl Strategy<Value = ByteEdit> {
    prop_oneof![
        9 => Just(ByteEdit::None),
        1 => (any::<usize>(), any::<u8>()).prop_map(|(i, b)| ByteEdit::Flip(i, b)),
        1 => (any::<usize>(), prop::sample::select(vec![0u8, b'"', b'{', b'}', b',', b'\\', 0x80, 0xC3, 0xFF]))
            .prop_map(|(i, b)| ByteEdit::Insert(i, b)),
        1 => any::<usize>().prop_map(ByteEdit::Truncate),
    ]
}

fn apply(mut doc: Map<String, Value>, edits: &[Edit], bytes: &ByteEdit) -> Vec<u8> {
    for e in edits {
        match e {
            Edit::Set(k, v) => {
                doc.insert(k.clone(), v.clone());
            }
            Edit::Remove(k) => {
                doc.remove(k);
            }
        }
    }
    let mut text = Value::Object(doc).to_string().into_bytes();
    let n = text.len();
    match *bytes {
        ByteEdit::None => {}
        ByteEdit::Flip(i, b) => text[i % n] ^= b,
        ByteEdit::Insert(i, b) => text.insert(i % (n + 1), b),
        ByteEdit::Truncate(i) => text.truncate(i % n),
    }
    text
}

fn arbitrary_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..256),
        // Mostly JSON punctuation, so the parser gets past the first byte.
        prop::collection::vec(
            prop::sample::select(&b"{}[]\":,0123456789.eE+-tfnul \\/xabc\x00\x80\xff"[..]),
            0..128
        ),
    ]
}

// ---------------------------------------------------------------------------------------------
// The tests.

#[test]
fn submit_arbitrary_bytes() {
    let engine = tiny_engine();
    let tally = Tally::default();
    fuzz("submit_arbitrary_bytes", cases(400), arbitrary_bytes(), |bytes| {
        submit_case(engine, &bytes, RUN_BEFORE_CANCEL, &tally).map(|_| ())
    });
    let (_, refused) = tally.report("submit_arbitrary_bytes");
    assert!(refused > 0);
    assert_still_exact(engine);
    free_engine(engine);
}

#[test]
fn submit_arbitrary_json() {
    let engine = tiny_engine();
    let tally = Tally::default();
    fuzz("submit_arbitrary_json", cases(600), any_json(request_fields()), |v| {
        submit_case(engine, v.to_string().as_bytes(), RUN_BEFORE_CANCEL, &tally).map(|_| ())
    });
    let (_, refused) = tally.report("submit_arbitrary_json");
    assert!(refused > 0);
    assert_still_exact(engine);
    free_engine(engine);
}

#[test]
fn submit_mutated_requests() {
    let engine = tiny_engine();
    // Unmutated valid requests must be accepted: the mutations start from real requests.
    let valid = Tally::default();
    fuzz("submit_valid_requests", cases(40), valid_request(), |doc| {
        let case = submit_case(engine, Value::Object(doc).to_string().as_bytes(), RUN_BEFORE_CANCEL, &valid)?;
        prop_assert!(case.is_some(), "a valid request was refused: {}", last_error());
        Ok(())
    });
    let tally = Tally::default();
    let strategy = (valid_request(), edits(request_fields()), byte_edit());
    fuzz("submit_mutated_requests", cases(1200), strategy, |(doc, edits, bytes)| {
        submit_case(engine, &apply(doc, &edits, &bytes), RUN_BEFORE_CANCEL, &tally).map(|_| ())
    });
    let (accepted, refused) = tally.report("submit_mutated_requests");
    assert!(accepted > 0 && refused > 0, "the mutations should both keep and break requests");
    assert_still_exact(engine);
    free_engine(engine);
}

/// Checks one weft_engine_new outcome; a new engine gets one request (checked like the fuzz
/// requests), then is freed.
fn engine_new_case(options: &[u8], tally: &Tally) -> Result<(), TestCaseError> {
    let (status, message, engine) = new_engine(options);
    if status != OK {
        prop_assert!(
            status == INVALID || status == MODEL_LOAD || status == UNSUPPORTED,
            "weft_engine_new returned {status}: {message}"
        );
        prop_assert!(!message.is_empty() && !message.contains("panic"), "{status}: {message:?}");
        prop_assert!(engine.is_none(), "a failed weft_engine_new left a handle");
        Tally::add(&tally.refused);
        return Ok(());
    }
    Tally::add(&tally.accepted);
    let engine = engine.expect("WEFT_OK without a handle");
    // (It may refuse the request: a mutated kv_budget_bytes can be too small for it.)
    let served = submit_case(engine, br#"{"prompt_ids": [1, 2, 3], "max_tokens": 2}"#, FINAL_LIMIT, &Tally::default());
    free_engine(engine);
    served.map(|_| ())
}

#[test]
fn engine_new_options() {
    setup();
    let tally = Tally::default();
    fuzz("engine_new_bytes", cases(150), arbitrary_bytes(), |bytes| engine_new_case(&bytes, &tally));
    fuzz("engine_new_json", cases(300), any_json(OPTION_FIELDS), |v| engine_new_case(v.to_string().as_bytes(), &tally));
    tally.report("engine_new_bytes + engine_new_json");
    let valid = Tally::default();
    fuzz("engine_new_valid_options", cases(10), valid_options(), |doc| {
        engine_new_case(Value::Object(doc).to_string().as_bytes(), &valid)?;
        prop_assert_eq!(valid.refused.load(Ordering::Relaxed), 0, "valid options were refused: {}", last_error());
        Ok(())
    });
    let mutated = Tally::default();
    let strategy = (valid_options(), edits(OPTION_FIELDS), byte_edit());
    fuzz("engine_new_mutated_options", cases(120), strategy, |(doc, edits, bytes)| {
        engine_new_case(&apply(doc, &edits, &bytes), &mutated)
    });
    let (accepted, refused) = mutated.report("engine_new_mutated_options");
    assert!(accepted > 0 && refused > 0, "the mutations should both keep and break options");
}
