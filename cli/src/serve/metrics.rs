//! `/metrics` (Prometheus text format 0.0.4) and `/stats` (JSON).
//!
//! Latencies are measured where they happen: request arrival in the handler, token times in the
//! engine's sink (on the engine thread, before any network write), so a slow client does not
//! inflate them. Engine gauges (queue depth, active rows, KV bytes) are read from
//! `Engine::stats()` at scrape time.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use weft::engine::EngineStats;

/// A cumulative histogram with fixed upper bounds (seconds).
pub struct Histogram {
    bounds: &'static [f64],
    inner: Mutex<HistogramState>,
}

struct HistogramState {
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Histogram { bounds, inner: Mutex::new(HistogramState { counts: vec![0; bounds.len()], sum: 0.0, count: 0 }) }
    }

    pub fn observe(&self, d: Duration) {
        let v = d.as_secs_f64();
        let mut s = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = self.bounds.iter().position(|&b| v <= b) {
            s.counts[i] += 1;
        }
        s.sum += v;
        s.count += 1;
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let s = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (b, c) in self.bounds.iter().zip(&s.counts) {
            cumulative += c;
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {cumulative}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", s.count);
        let _ = writeln!(out, "{name}_sum {}", s.sum);
        let _ = writeln!(out, "{name}_count {}", s.count);
    }
}

const TTFT_BOUNDS: &[f64] = &[0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];
const TOKEN_BOUNDS: &[f64] = &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5];
const REQUEST_BOUNDS: &[f64] = &[0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0];

/// Server-side counters; engine-side numbers come from `EngineStats`.
pub struct Metrics {
    started: Instant,
    /// `(endpoint, status) -> count`.
    http: Mutex<Vec<(&'static str, u16, u64)>>,
    pub prompt_tokens: AtomicU64,
    pub cached_prompt_tokens: AtomicU64,
    pub completion_tokens: AtomicU64,
    /// Finished generations by reason: stop, tool_calls, length, cancelled, error.
    pub finished_stop: AtomicU64,
    pub finished_tool_calls: AtomicU64,
    pub finished_length: AtomicU64,
    pub finished_cancelled: AtomicU64,
    pub finished_error: AtomicU64,
    /// Client disconnects that cancelled a row before it finished.
    pub disconnects: AtomicU64,
    /// Generation requests between submit and their last event.
    pub in_flight: AtomicU64,
    pub ttft: Histogram,
    pub inter_token: Histogram,
    pub request_duration: Histogram,
}

impl Metrics {
    pub fn new() -> Self {
        Metrics {
            started: Instant::now(),
            http: Mutex::new(Vec::new()),
            prompt_tokens: AtomicU64::new(0),
            cached_prompt_tokens: AtomicU64::new(0),
            completion_tokens: AtomicU64::new(0),
            finished_stop: AtomicU64::new(0),
            finished_tool_calls: AtomicU64::new(0),
            finished_length: AtomicU64::new(0),
            finished_cancelled: AtomicU64::new(0),
            finished_error: AtomicU64::new(0),
            disconnects: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            ttft: Histogram::new(TTFT_BOUNDS),
            inter_token: Histogram::new(TOKEN_BOUNDS),
            request_duration: Histogram::new(REQUEST_BOUNDS),
        }
    }

    pub fn count_http(&self, endpoint: &'static str, status: u16) {
        let mut h = self.http.lock().unwrap_or_else(|p| p.into_inner());
        match h.iter_mut().find(|(e, s, _)| *e == endpoint && *s == status) {
            Some(entry) => entry.2 += 1,
            None => h.push((endpoint, status, 1)),
        }
    }

    pub fn uptime(&self) -> Duration {
        self.started.elapsed()
    }

    /// The Prometheus exposition.
    pub fn render(&self, stats: &EngineStats, model: &str) -> String {
        let mut out = String::with_capacity(4096);
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut metric = |name: &str, kind: &str, help: &str, samples: &[(String, f64)]| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (labels, v) in samples {
                let _ = writeln!(out, "{name}{labels} {v}");
            }
        };
        let one = |v: f64| vec![(String::new(), v)];
        metric("weft_info", "gauge", "The served model.", &[(format!("{{model=\"{}\"}}", escape(model)), 1.0)]);
        metric("weft_uptime_seconds", "gauge", "Seconds since the server started.", &one(self.uptime().as_secs_f64()));
        {
            let mut h = self.http.lock().unwrap_or_else(|p| p.into_inner()).clone();
            h.sort();
            let samples: Vec<(String, f64)> =
                h.iter().map(|(e, s, c)| (format!("{{endpoint=\"{e}\",status=\"{s}\"}}"), *c as f64)).collect();
            metric("weft_http_requests_total", "counter", "HTTP requests answered, by endpoint and status.", &samples);
        }
        let finished: Vec<(String, f64)> = [
            ("stop", &self.finished_stop),
            ("tool_calls", &self.finished_tool_calls),
            ("length", &self.finished_length),
            ("cancelled", &self.finished_cancelled),
            ("error", &self.finished_error),
        ]
        .iter()
        .map(|(r, a)| (format!("{{reason=\"{r}\"}}"), load(a) as f64))
        .collect();
        metric("weft_requests_finished_total", "counter", "Generations finished, by reason.", &finished);
        // The single-sample metrics, in exposition order (`None`: not exposed).
        let scalars: [(&str, &str, &str, Option<f64>); 19] = [
            ("weft_client_disconnects_total", "counter", "Generations cancelled because the client went away.", Some(load(&self.disconnects) as f64)),
            ("weft_requests_in_flight", "gauge", "Generation requests being served.", Some(load(&self.in_flight) as f64)),
            ("weft_prompt_tokens_total", "counter", "Prompt tokens of finished requests.", Some(load(&self.prompt_tokens) as f64)),
            ("weft_prompt_tokens_cached_total", "counter", "Prompt tokens served from the prompt cache.", Some(load(&self.cached_prompt_tokens) as f64)),
            ("weft_generation_tokens_total", "counter", "Completion tokens of finished requests.", Some(load(&self.completion_tokens) as f64)),
            ("weft_queue_depth", "gauge", "Requests waiting for admission.", Some(stats.queued_rows as f64)),
            ("weft_prefilling_rows", "gauge", "Requests prefilling their prompt.", Some(stats.prefilling_rows as f64)),
            ("weft_active_rows", "gauge", "Rows decoding in the batch.", Some(stats.active_rows as f64)),
            ("weft_kv_bytes_in_use", "gauge", "Projected KV-cache bytes of admitted rows.", Some(stats.kv_bytes_in_use as f64)),
            ("weft_kv_budget_bytes", "gauge", "The KV budget (--kv-budget).", stats.kv_budget_bytes.map(|b| b as f64)),
            ("weft_prompt_cache_bytes", "gauge", "Bytes held by the prompt cache.", Some(stats.prompt_cache_bytes as f64)),
            ("weft_prompt_cache_entries", "gauge", "Entries in the prompt cache.", Some(stats.prompt_cache_entries as f64)),
            ("weft_prompt_cache_hits_total", "counter", "Prompt-cache hits.", Some(stats.prompt_cache_hits as f64)),
            ("weft_prompt_cache_capacity_bytes", "gauge", "The prompt cache's capacity.", Some(stats.prompt_cache_capacity_bytes as f64)),
            ("weft_prompt_cache_evictions_total", "counter", "Prompt-cache entries evicted.", Some(stats.prompt_cache_evictions as f64)),
            ("weft_decode_steps_total", "counter", "Batched decode steps run.", Some(stats.decode_steps as f64)),
            ("weft_engine_tokens_generated_total", "counter", "Tokens the engine generated (all requests).", Some(stats.tokens_generated as f64)),
            ("weft_draft_tokens_total", "counter", "Speculative draft tokens verified.", Some(stats.draft_tokens as f64)),
            ("weft_draft_tokens_accepted_total", "counter", "Speculative draft tokens accepted.", Some(stats.draft_tokens_accepted as f64)),
        ];
        for (name, kind, help, value) in scalars {
            if let Some(v) = value {
                metric(name, kind, help, &one(v));
            }
        }
        self.ttft.render(&mut out, "weft_time_to_first_token_seconds", "Request arrival to its first token.");
        self.inter_token.render(
            &mut out,
            "weft_inter_token_latency_seconds",
            "Time between a request's successive tokens.",
        );
        self.request_duration.render(&mut out, "weft_request_duration_seconds", "Request arrival to its last event.");
        out
    }

    /// `/stats`: the engine's numbers at the top level plus the server's own.
    pub fn stats_json(&self, stats: &EngineStats, model: &str) -> Value {
        let mut v = serde_json::to_value(stats).unwrap_or_else(|_| json!({}));
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        if let Value::Object(m) = &mut v {
            m.insert("model".into(), json!(model));
            m.insert("uptime_s".into(), json!(self.uptime().as_secs_f64()));
            m.insert("requests_in_flight".into(), json!(load(&self.in_flight)));
            m.insert("client_disconnects".into(), json!(load(&self.disconnects)));
            m.insert("prompt_tokens_total".into(), json!(load(&self.prompt_tokens)));
            m.insert("completion_tokens_total".into(), json!(load(&self.completion_tokens)));
        }
        v
    }
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}
