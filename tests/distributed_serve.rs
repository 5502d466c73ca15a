//! `weft serve --hostfile` across 2 ranks on localhost (MLX's `ring` backend, CPU): rank 0
//! starts rank 1 itself, serves HTTP and leads; a streamed greedy chat must equal the
//! single-process server's, and killing the follower mid-stream must end the stream with an
//! error and turn /health 503 within the rank timeout; one that stops answering is caught by
//! the watchdog, and shutdown still completes. Every wait is bounded.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use support::*;

struct Server {
    child: Child,
    addr: String,
    /// Rank 0's stderr lines (the follower's pid is announced there).
    stderr: mpsc::Receiver<String>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(extra: &[&str]) -> Server {
    let model = goldens_dir().join("gguf").join("llama-q4_1.gguf");
    let mut child = Command::new(env!("CARGO_BIN_EXE_weft"))
        .args(["serve", "--model"])
        .arg(&model)
        .args(["--host", "127.0.0.1", "--port", "0", "--log-level", "INFO"])
        .args(extra)
        .env_remove("MLX_RANK")
        .env_remove("MLX_HOSTFILE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start weft serve");
    let (out_tx, out_rx) = mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(|l| l.ok()) {
            let _ = out_tx.send(line);
        }
    });
    let (err_tx, err_rx) = mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(|l| l.ok()) {
            eprintln!("[serve] {line}");
            let _ = err_tx.send(line);
        }
    });
    let line = match out_rx.recv_timeout(Duration::from_secs(180)) {
        Ok(line) => line,
        Err(e) => {
            let _ = child.kill();
            panic!("weft serve did not report its address: {e:?} (status {:?})", child.try_wait());
        }
    };
    let url = line.strip_prefix("listening on ").unwrap_or_else(|| panic!("unexpected first line {line:?}"));
    Server { addr: url.trim_start_matches("http://").to_string(), child, stderr: err_rx }
}

/// A raw HTTP/1.1 request; returns (status, body) once the server closes (bounded).
fn http(addr: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let out = String::from_utf8_lossy(&out).to_string();
    let status = out.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (status, out.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default())
}

/// Streams a long greedy chat on a thread; returns once its first tokens arrived, with the
/// thread that yields (status, body) when the stream ends.
fn stream_in_flight(addr: &str) -> std::thread::JoinHandle<(u16, String)> {
    let (tx, rx) = mpsc::channel();
    let addr = addr.to_string();
    // (No context bound on this model: 100k tokens take minutes, far past the failure.)
    let body = chat(100_000, true);
    let stream = std::thread::spawn(move || {
        let mut s = TcpStream::connect(&addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        write!(
            s,
            "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        let mut told = false;
        while let Ok(n) = s.read(&mut buf) {
            if n == 0 {
                break;
            }
            out.extend_from_slice(&buf[..n]);
            if !told && String::from_utf8_lossy(&out).matches("data: ").count() >= 4 {
                told = true;
                let _ = tx.send(());
            }
        }
        let out = String::from_utf8_lossy(&out).to_string();
        let status = out.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
        (status, out.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default())
    });
    rx.recv_timeout(Duration::from_secs(60)).expect("the long stream's first tokens");
    stream
}

fn chat(max_tokens: usize, ignore_eos: bool) -> String {
    serde_json::json!({
        "messages": [{"role": "user", "content": "Tell me a story about a tiny model"}],
        "max_tokens": max_tokens, "temperature": 0, "stream": true, "ignore_eos": ignore_eos,
    })
    .to_string()
}

/// Requests with a grammar: JSON mode, a JSON schema, and a forced tool call (greedy, short).
fn constrained_requests() -> Vec<(&'static str, serde_json::Value)> {
    let user = serde_json::json!([{"role": "user", "content": "Give me a small JSON object"}]);
    vec![
        ("json_object", serde_json::json!({
            "messages": user, "max_tokens": 16, "temperature": 0, "response_format": {"type": "json_object"},
        })),
        ("json_schema", serde_json::json!({
            "messages": user, "max_tokens": 16, "temperature": 0,
            "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {
                "type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}}},
        })),
        // An enum argument and one call: the call completes within the budget whatever the
        // weights (a call cut by max_tokens is not delivered).
        ("tools", serde_json::json!({
            "messages": user, "max_tokens": 48, "temperature": 0, "tool_choice": "required",
            "parallel_tool_calls": false,
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {
                "type": "object", "properties": {"a": {"enum": [1, 2]}}, "required": ["a"]}}}],
        })),
    ]
}

/// A non-streamed response's first choice (its message and finish reason).
fn choice(body: &str) -> serde_json::Value {
    let mut v: serde_json::Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"));
    let mut c = v["choices"][0].take();
    // Tool-call ids are fresh per response.
    if let Some(calls) = c["message"]["tool_calls"].as_array_mut() {
        for call in calls {
            call["id"] = serde_json::Value::Null;
        }
    }
    c
}

/// The streamed content deltas, in order, and whether an error event came.
fn deltas(body: &str) -> (Vec<String>, bool) {
    let mut out = Vec::new();
    let mut error = false;
    for line in body.lines().filter_map(|l| l.strip_prefix("data: ")) {
        if line == "[DONE]" {
            continue;
        }
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        if v.get("error").is_some() {
            error = true;
        }
        if let Some(c) = v["choices"][0]["delta"]["content"].as_str() {
            out.push(c.to_string());
        }
    }
    (out, error)
}

/// `weft serve --hostfile` over two local ranks (rank 0 starts rank 1), and rank 1's pid.
fn start_ranks(dir: &std::path::Path, rank_timeout: &str, extra: &[&str]) -> (Server, String) {
    let hostfile = dir.join("hosts.json");
    let host = serde_json::json!({"ssh": "localhost", "ips": ["127.0.0.1"]});
    std::fs::write(&hostfile, serde_json::json!([host, host]).to_string()).unwrap();
    let port = free_port_pair().to_string();
    let mut args = vec!["--hostfile", hostfile.to_str().unwrap(), "--starting-port", &port, "--rank-timeout", rank_timeout];
    args.extend_from_slice(extra);
    let server = start(&args);
    let deadline = Instant::now() + Duration::from_secs(10);
    let pid = loop {
        let line = server.stderr.recv_timeout(deadline.saturating_duration_since(Instant::now())).expect("rank 1's pid in the log");
        // Anywhere in the line: both ranks write to one stderr.
        if let Some(at) = line.find("weft serve: rank 1 started (pid ") {
            let rest = &line[at + "weft serve: rank 1 started (pid ".len()..];
            break rest[..rest.find(')').unwrap_or(rest.len())].to_string();
        }
    };
    (server, pid)
}

fn signal(pid: &str, name: &str) {
    assert!(Command::new("kill").args([&format!("-{name}"), pid]).status().unwrap().success(), "kill -{name} {pid}");
}

/// Polls /health until it is 503 or `within` passed; returns (status, body).
fn health_after(addr: &str, since: Instant, within: Duration) -> (u16, String) {
    loop {
        let (h, b) = http(addr, "GET", "/health", "");
        if h == 503 || since.elapsed() > within {
            return (h, b);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn free_port_pair() -> u16 {
    loop {
        let a = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let p = a.local_addr().unwrap().port();
        if p < 65000 && std::net::TcpListener::bind(("127.0.0.1", p + 1)).is_ok() {
            return p;
        }
    }
}

#[test]
fn serve_across_2_ranks_streams_single_process_tokens_and_fails_cleanly_when_a_rank_dies() {
    let single = start(&[]);
    let (status, body) = http(&single.addr, "POST", "/v1/chat/completions", &chat(24, false));
    assert_eq!(status, 200, "{body}");
    let (want, error) = deltas(&body);
    assert!(!error && !want.is_empty(), "{body}");
    let want_constrained: std::collections::HashMap<&str, serde_json::Value> = constrained_requests()
        .into_iter()
        .map(|(what, req)| {
            let (status, body) = http(&single.addr, "POST", "/v1/chat/completions", &req.to_string());
            assert_eq!(status, 200, "{what}: {body}");
            (what, choice(&body))
        })
        .collect();
    assert!(want_constrained["tools"]["message"]["tool_calls"][0]["function"]["name"] == "f", "{want_constrained:?}");
    let (_, stats) = http(&single.addr, "GET", "/stats", "");
    let stats: serde_json::Value = serde_json::from_str(&stats).unwrap();
    assert!(stats.get("ranks").is_none(), "a single process reports no ranks: {stats}");
    drop(single);

    let dir = tempfile::tempdir().unwrap();
    let timeout_s = 5.0;
    let (ranks, pid) = start_ranks(dir.path(), "5", &[]);
    let (status, body) = http(&ranks.addr, "POST", "/v1/chat/completions", &chat(24, false));
    assert_eq!(status, 200, "{body}");
    let (got, error) = deltas(&body);
    assert!(!error, "{body}");
    assert_eq!(got, want, "2-rank serve vs single-process serve: streamed deltas");
    assert_eq!(http(&ranks.addr, "GET", "/health", "").0, 200);
    // /stats: every rank's device and MLX memory, gathered by rank 0 with the step plans.
    let (status, stats) = http(&ranks.addr, "GET", "/stats", "");
    assert_eq!(status, 200, "{stats}");
    let stats: serde_json::Value = serde_json::from_str(&stats).unwrap();
    let per_rank = stats["ranks"].as_array().unwrap_or_else(|| panic!("no ranks in /stats: {stats}"));
    assert_eq!(per_rank.len(), 2, "{stats}");
    for (r, s) in per_rank.iter().enumerate() {
        assert_eq!(s["rank"], r, "{stats}");
        assert!(s["device"].as_str().is_some_and(|d| d.starts_with("cpu")), "rank {r}'s device: {stats}");
        let (active, peak) = (s["mlx_active_bytes"].as_u64().unwrap(), s["mlx_peak_bytes"].as_u64().unwrap());
        // Each rank holds its shard of the weights; its peak covers its prefill and decode.
        assert!(active > 0 && peak >= active, "rank {r}'s memory: {stats}");
        assert!(s["mlx_cache_bytes"].is_u64(), "{stats}");
    }
    // Constrained output and tools: every rank runs the same grammar over the same tokens, so
    // the rows equal the single-process server's.
    for (what, req) in constrained_requests() {
        let (status, body) = http(&ranks.addr, "POST", "/v1/chat/completions", &req.to_string());
        assert_eq!(status, 200, "{what}: {body}");
        assert_eq!(choice(&body), want_constrained[what], "{what}: 2-rank serve vs single-process serve");
    }
    assert_eq!(http(&ranks.addr, "GET", "/health", "").0, 200, "constrained rows leave the group healthy");

    // A long stream in flight; the follower is stopped (so the stream cannot finish) and then
    // killed.
    let stream = stream_in_flight(&ranks.addr);
    signal(&pid, "STOP");
    std::thread::sleep(Duration::from_millis(200));
    let killed = Instant::now();
    signal(&pid, "KILL");
    let (status, body) = stream.join().unwrap();
    let (streamed, error) = deltas(&body);
    assert_eq!(status, 200, "{body}");
    assert!(error && streamed.len() > 1, "the in-flight stream must end with an error event: {body}");
    let (health, why) = health_after(&ranks.addr, killed, Duration::from_secs_f64(timeout_s + 5.0));
    assert_eq!(health, 503, "/health after the follower died: {why}");
    assert!(killed.elapsed() < Duration::from_secs_f64(timeout_s + 5.0));
    assert!(why.contains("rank"), "{why}");
    // New requests are refused, not hung.
    let (status, body) = http(&ranks.addr, "POST", "/v1/chat/completions", &chat(4, false));
    assert!(status >= 500, "{status} {body}");
}

/// A follower that stops answering (SIGSTOP: its sockets stay open, so MLX's collective just
/// blocks) is caught by rank 0's watchdog: the in-flight stream ends with an error after the
/// rank timeout, /health turns 503 naming it, and SIGTERM still stops the server.
#[test]
fn serve_across_2_ranks_fails_requests_when_a_rank_stops_answering() {
    let dir = tempfile::tempdir().unwrap();
    let (mut ranks, pid) = start_ranks(dir.path(), "3", &["--shutdown-timeout", "1"]);
    let stream = stream_in_flight(&ranks.addr);
    let stopped = Instant::now();
    signal(&pid, "STOP");
    let (status, body) = stream.join().unwrap();
    let waited = stopped.elapsed();
    let (streamed, error) = deltas(&body);
    assert_eq!(status, 200, "{body}");
    assert!(error && streamed.len() > 1, "the in-flight stream must end with an error event: {body}");
    assert!(body.contains("stopped answering"), "{body}");
    assert!(waited >= Duration::from_secs(2) && waited < Duration::from_secs(10), "ended after {waited:?} (rank timeout 3 s)");
    let (health, why) = health_after(&ranks.addr, stopped, Duration::from_secs(10));
    assert_eq!(health, 503, "{why}");
    assert!(why.contains("stopped answering"), "{why}");
    // The driver thread is stuck in MLX's collective: shutting down must not wait for it.
    let sent = Instant::now();
    signal(&ranks.child.id().to_string(), "TERM");
    loop {
        if ranks.child.try_wait().unwrap().is_some() {
            break;
        }
        assert!(sent.elapsed() < Duration::from_secs(15), "rank 0 did not exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Rank 0 kills the followers it started when it exits.
    let alive = Command::new("kill").args(["-0", &pid]).stderr(Stdio::null()).status().unwrap().success();
    if alive {
        signal(&pid, "KILL");
    }
    assert!(!alive, "rank 1 outlived rank 0");
}

/// Bad hostfiles are a message and exit code 1 before any rank starts.
#[test]
fn serve_refuses_bad_hostfiles() {
    let dir = tempfile::tempdir().unwrap();
    let model = goldens_dir().join("gguf").join("llama-q4_1.gguf");
    let cases = [
        ("missing.json", None, "missing.json"),
        ("one.json", Some(r#"[{"ssh": "localhost", "ips": ["127.0.0.1"]}]"#), "at least 2"),
        ("noips.json", Some(r#"{"hosts": [{"ssh": "localhost", "ips": ["127.0.0.1"]}, {"ssh": "localhost"}]}"#), "no \"ips\""),
        ("garbage.json", Some("not json"), "not JSON"),
    ];
    for (name, text, want) in cases {
        let path = dir.path().join(name);
        if let Some(t) = text {
            std::fs::write(&path, t).unwrap();
        }
        let out = Command::new(env!("CARGO_BIN_EXE_weft"))
            .args(["serve", "--model"])
            .arg(&model)
            .args(["--port", "0", "--hostfile"])
            .arg(&path)
            .env_remove("MLX_RANK")
            .env_remove("MLX_HOSTFILE")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{name}: {stderr}");
        assert!(stderr.contains("--hostfile") && stderr.contains(want), "{name}: {stderr}");
        assert!(out.stdout.is_empty(), "{name}: nothing listens");
    }
}
