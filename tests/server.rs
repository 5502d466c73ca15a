//! `weft serve` end to end: the server binary started on a free loopback port, driven by the
//! official clients (the `openai` and `anthropic` Python packages from `.venv`, the `openai` npm
//! package from tests/server/node), a bounded load test with disconnecting clients, bad inputs,
//! and graceful shutdown on SIGTERM / SIGINT.
//!
//! The client-side tests live in tests/server/ (see its README); this file starts servers,
//! runs them, and checks what only the process owner can see (exit codes, shutdown).
//!
//! Models: the default model (SmolLM2, `weft pull`; its greedy chats are in
//! goldens/smollm2.json) for output parity, and the tiny goldens/gguf/llama-q4_1.gguf (it
//! carries a small tokenizer and chat template) for errors, load and shutdown.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use support::*;

const API_KEY: &str = "weft-test-key";

/// A running `weft serve`, killed when dropped.
struct Server {
    child: Child,
    /// `http://127.0.0.1:PORT`
    url: String,
    addr: String,
}

impl Server {
    fn start(model: &Path, extra: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_weft"))
            .arg("serve")
            .arg("--model")
            .arg(model)
            .args(["--host", "127.0.0.1", "--port", "0", "--log-level", "WARNING"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start weft serve");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            let first = lines.next().and_then(|l| l.ok());
            let _ = tx.send(first);
            for _ in lines {} // keep the pipe drained
        });
        let line = match rx.recv_timeout(Duration::from_secs(120)) {
            Ok(Some(line)) => line,
            other => {
                let _ = child.kill();
                panic!("weft serve did not report its address: {other:?} (status {:?})", child.try_wait());
            }
        };
        let url =
            line.strip_prefix("listening on ").unwrap_or_else(|| panic!("unexpected first line {line:?}")).to_string();
        let addr = url.trim_start_matches("http://").to_string();
        Server { child, url, addr }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn signal(&self, name: &str) {
        let ok = Command::new("kill").args([&format!("-{name}"), &self.pid().to_string()]).status().unwrap();
        assert!(ok.success(), "kill -{name} failed");
    }

    fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            if start.elapsed() > within {
                let _ = self.child.kill();
                panic!("weft serve did not exit within {within:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A plain HTTP/1.1 GET (for what no client library covers: the process's own view).
    fn get(&self, path: &str, headers: &str) -> (u16, String) {
        let mut s = TcpStream::connect(&self.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        write!(s, "GET {path} HTTP/1.1\r\nHost: {}\r\n{headers}Connection: close\r\n\r\n", self.addr).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        let status = out.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
        let body = out.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
        (status, body)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn tiny_model() -> PathBuf {
    goldens_dir().join("gguf").join("llama-q4_1.gguf")
}

fn server_tests_dir() -> PathBuf {
    repo_root().join("tests").join("server")
}

/// `.venv/bin/python` with the pinned `openai` and `anthropic` packages (installed from
/// scripts/requirements-oracle.txt when an older venv lacks them).
fn python() -> PathBuf {
    let py = repo_root().join(".venv").join("bin").join("python");
    assert!(py.exists(), "{} is missing: run scripts/setup", py.display());
    let has = |py: &Path| {
        Command::new(py)
            .args(["-c", "import openai, anthropic"])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if !has(&py) {
        let reqs = std::fs::read_to_string(repo_root().join("scripts/requirements-oracle.txt")).unwrap();
        let pins: Vec<&str> =
            reqs.lines().filter(|l| l.starts_with("openai==") || l.starts_with("anthropic==")).collect();
        let status = Command::new(&py)
            .args(["-m", "pip", "install", "-q", "--disable-pip-version-check"])
            .args(&pins)
            .status()
            .expect("pip");
        assert!(status.success() && has(&py), "installing {pins:?} into .venv failed");
    }
    py
}

/// Runs a client script against `server`; its output goes to the test log; fails on non-zero.
fn run_python(script: &str, server: &Server, env: &[(&str, String)]) -> std::process::Child {
    Command::new(python())
        .arg(server_tests_dir().join(script))
        .env("WEFT_URL", &server.url)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run python")
}

/// Waits for a client process, printing its output; panics with it on failure.
fn finish(name: &str, child: Child) {
    let out = child.wait_with_output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    println!("---- {name} ----\n{text}");
    assert!(out.status.success(), "{name} failed ({}):\n{text}", out.status);
}

fn node_test(server: &Server, model_id: &str) -> Child {
    let dir = server_tests_dir().join("node");
    if !dir.join("node_modules").join("openai").exists() {
        let status = Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund", "--loglevel=error"])
            .current_dir(&dir)
            .status()
            .expect("npm (Node.js) is needed for tests/server/node");
        assert!(status.success(), "npm ci failed in {}", dir.display());
    }
    Command::new("node")
        .args(["--test", "--test-reporter=spec", "clients.test.mjs"])
        .current_dir(&dir)
        .env("WEFT_URL", &server.url)
        .env("WEFT_API_KEY", API_KEY)
        .env("WEFT_MODEL_ID", model_id)
        .env("WEFT_GOLDENS", goldens_dir().join("smollm2.json"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run node")
}

/// The official clients (Python openai + anthropic, npm openai) against the default model:
/// greedy outputs equal mlx-lm's goldens, streaming and not, on every endpoint.
#[test]
fn official_clients_reproduce_the_goldens() {
    let Some(model) = default_model() else { return };
    let server = Server::start(&model, &["--api-key", API_KEY]);
    let model_id = model.to_string_lossy().into_owned();
    let env = [
        ("WEFT_API_KEY", API_KEY.to_string()),
        ("WEFT_MODEL_ID", model_id.clone()),
        ("WEFT_GOLDENS", goldens_dir().join("smollm2.json").to_string_lossy().into_owned()),
    ];
    // Both client suites at once: their requests batch together in the engine.
    let py = run_python("test_goldens.py", &server, &env);
    let node = node_test(&server, &model_id);
    finish("python openai + anthropic (test_goldens.py)", py);
    finish("node openai (node/clients.test.mjs)", node);
    // The aborted Node stream's row is gone too.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, body) = server.get("/stats", &format!("Authorization: Bearer {API_KEY}\r\n"));
        assert_eq!(status, 200, "{body}");
        let stats: serde_json::Value = serde_json::from_str(&body).unwrap();
        let idle = stats["active_rows"] == 0 && stats["queued_rows"] == 0 && stats["requests_in_flight"] == 0;
        if idle {
            break;
        }
        assert!(Instant::now() < deadline, "rows left behind: {stats}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Every bad input gets its protocol's error JSON and a 4xx, and the server keeps serving.
#[test]
fn bad_inputs_get_protocol_errors() {
    // KV budget 1 MB: the tiny model needs 1536 bytes per token, so about 650 tokens fit.
    let server =
        Server::start(&tiny_model(), &["--api-key", API_KEY, "--kv-budget", "1MB", "--served-model-name", "tiny"]);
    let env = [("WEFT_API_KEY", API_KEY.to_string()), ("WEFT_MODEL_ID", "tiny".to_string())];
    finish("bad inputs (test_errors.py)", run_python("test_errors.py", &server, &env));
}

/// Stop strings, max_tokens, seeds, sampling fields, logit_bias, content parts, logprobs, echo,
/// count_tokens, model names, /health, /stats, /metrics, through the official clients.
#[test]
fn protocol_features_through_the_official_clients() {
    let server = Server::start(&tiny_model(), &["--api-key", API_KEY, "--served-model-name", "tiny"]);
    let env = [("WEFT_API_KEY", API_KEY.to_string()), ("WEFT_MODEL_ID", "tiny".to_string())];
    finish("features (test_features.py)", run_python("test_features.py", &server, &env));
}

/// 64 concurrent streams, about 30% of the clients hanging up mid-stream: the server survives,
/// every finished stream is well-formed, no row is leaked.
#[test]
fn load_with_disconnects_leaks_no_rows() {
    let server = Server::start(&tiny_model(), &["--served-model-name", "tiny", "--decode-concurrency", "32"]);
    let env = [("WEFT_MODEL_ID", "tiny".to_string())];
    finish("load (test_load.py)", run_python("test_load.py", &server, &env));
}

/// Sends a streaming chat request over a raw socket and returns the socket after the headers.
fn open_stream(server: &Server, max_tokens: usize) -> BufReader<TcpStream> {
    let body = format!(
        r#"{{"messages":[{{"role":"user","content":"Tell me a story"}}],"max_tokens":{max_tokens},"ignore_eos":true,"stream":true}}"#
    );
    let mut s = TcpStream::connect(&server.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(
        s,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        server.addr,
        body.len()
    )
    .unwrap();
    let mut r = BufReader::new(s);
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    assert!(line.starts_with("HTTP/1.1 200"), "{line}");
    loop {
        line.clear();
        r.read_line(&mut line).unwrap();
        if line == "\r\n" {
            break;
        }
    }
    r
}

/// The rest of a (chunked) SSE body until the server closes it.
fn read_rest(mut r: BufReader<TcpStream>) -> String {
    let mut out = Vec::new();
    let _ = r.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// SIGTERM with a grace period: the running stream finishes normally, new connections are
/// refused, and the process exits 0.
#[test]
fn sigterm_lets_running_requests_finish_then_exits_0() {
    let mut server = Server::start(&tiny_model(), &["--shutdown-timeout", "30"]);
    let stream = open_stream(&server, 200);
    server.signal("TERM");
    let rest = read_rest(stream);
    assert!(rest.contains(r#""finish_reason":"length""#), "the stream did not finish: {rest}");
    assert!(rest.contains("data: [DONE]"), "{rest}");
    let status = server.wait_exit(Duration::from_secs(30));
    assert_eq!(status.code(), Some(0), "{status}");
    assert!(TcpStream::connect(&server.addr).is_err(), "still accepting after shutdown");
}

/// SIGINT with no grace: running rows are cancelled (the stream ends with an error event, not
/// silence), and the process exits 0.
#[test]
fn sigint_without_grace_cancels_rows_and_exits_0() {
    let mut server = Server::start(&tiny_model(), &["--shutdown-timeout", "0"]);
    let mut stream = open_stream(&server, 2000);
    let mut first = String::new();
    stream.read_line(&mut first).unwrap(); // the chunk-size line of the first event
    server.signal("INT");
    let rest = read_rest(stream);
    assert!(rest.contains("shutting down"), "expected a cancellation error event: {rest}");
    assert!(rest.contains("data: [DONE]"), "{rest}");
    let status = server.wait_exit(Duration::from_secs(30));
    assert_eq!(status.code(), Some(0), "{status}");
}

/// A missing model, a bad flag value and a taken port end in one clear error line.
#[test]
fn startup_errors_are_clear() {
    let out = Command::new(env!("CARGO_BIN_EXE_weft"))
        .args(["serve", "--model", "/nonexistent/model.gguf", "--port", "0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("error:") && err.contains("/nonexistent/model.gguf"), "{err}");

    let out = Command::new(env!("CARGO_BIN_EXE_weft"))
        .args(["serve", "--model", tiny_model().to_str().unwrap(), "--kv-budget", "lots"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));

    // The port is taken: a clear error, not a panic.
    let first = Server::start(&tiny_model(), &[]);
    let port = first.addr.rsplit(':').next().unwrap().to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_weft"))
        .args(["serve", "--model", tiny_model().to_str().unwrap(), "--port", &port])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("listening address") && err.contains(&port) && !err.contains("panicked"), "{err}");
    let (status, _) = first.get("/health", "");
    assert_eq!(status, 200);
}
