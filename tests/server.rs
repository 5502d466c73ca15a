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
use weft::kernels::CpuKernels::{self, Exact, Fast};

const API_KEY: &str = "weft-test-key";

/// A running `weft serve`, killed when dropped.
struct Server {
    child: Child,
    /// `http://127.0.0.1:PORT`
    url: String,
    addr: String,
}

impl Server {
    /// Every server names its CPU kernels (`--cpu-kernels`, which wins over `WEFT_CPU_KERNELS`):
    /// `Exact` where a test compares outputs with mlx-lm / mlx-vlm goldens, `Fast` (the default
    /// build's kernels, several times faster on the quantized default model) where it compares
    /// the server with itself or checks protocol behaviour.
    fn start(model: &Path, kernels: CpuKernels, extra: &[&str]) -> Server {
        Self::start_with_env(model, kernels, extra, &[])
    }

    fn start_with_env(model: &Path, kernels: CpuKernels, extra: &[&str], env: &[(&str, &str)]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_weft"))
            .args(["--cpu-kernels", kernels.as_str(), "serve"])
            .arg("--model")
            .arg(model)
            .args(["--host", "127.0.0.1", "--port", "0", "--log-level", "WARNING"])
            .args(extra)
            .env_remove("WEFT_ALLOWED_ORIGINS")
            .env_remove("WEFT_ALLOWED_HOSTS")
            .env_remove("WEFT_API_KEY")
            .envs(env.iter().copied())
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

/// `.venv/bin/python` with the pinned `openai`, `anthropic` and `openai-agents` packages (installed from
/// scripts/requirements-oracle.txt when an older venv lacks them).
fn python() -> PathBuf {
    let py = repo_root().join(".venv").join("bin").join("python");
    assert!(py.exists(), "{} is missing: run scripts/setup", py.display());
    let has = |py: &Path| {
        Command::new(py)
            .args(["-c", "import openai, anthropic, agents"])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if !has(&py) {
        let reqs = std::fs::read_to_string(repo_root().join("scripts/requirements-oracle.txt")).unwrap();
        let pins: Vec<&str> =
            reqs.lines().filter(|l| ["openai==", "anthropic==", "openai-agents=="].iter().any(|p| l.starts_with(p))).collect();
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
    node_test_file(server, model_id, "clients.test.mjs")
}

fn node_test_file(server: &Server, model_id: &str, file: &str) -> Child {
    let dir = server_tests_dir().join("node");
    if !["openai", "ai", "@ai-sdk/openai"].iter().all(|p| dir.join("node_modules").join(p).exists()) {
        let status = Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund", "--loglevel=error"])
            .current_dir(&dir)
            .status()
            .expect("npm (Node.js) is needed for tests/server/node");
        assert!(status.success(), "npm ci failed in {}", dir.display());
    }
    Command::new("node")
        .args(["--test", "--test-reporter=spec", file])
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
    let server = Server::start(&model, Exact, &["--api-key", API_KEY]);
    // The short id the server chose (the model directory's name).
    let (status, listed) = server.get("/v1/models", &format!("Authorization: Bearer {API_KEY}\r\n"));
    assert_eq!(status, 200, "{listed}");
    let listed: serde_json::Value = serde_json::from_str(&listed).unwrap();
    let model_id = listed["data"][0]["id"].as_str().unwrap().to_string();
    assert!(!model_id.contains('/'), "not a short id: {model_id}");
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
    let server = Server::start(
        &tiny_model(),
        Fast,
        &["--api-key", API_KEY, "--kv-budget", "1MB", "--served-model-name", "tiny", "--strict-model"],
    );
    let env = [("WEFT_API_KEY", API_KEY.to_string()), ("WEFT_MODEL_ID", "tiny".to_string())];
    finish("bad inputs (test_errors.py)", run_python("test_errors.py", &server, &env));
}

/// Stop strings, max_tokens, seeds, sampling fields, logit_bias, content parts, logprobs, echo,
/// count_tokens, model names, /health, /stats, /metrics, through the official clients.
#[test]
fn protocol_features_through_the_official_clients() {
    let server = Server::start(&tiny_model(), Fast, &["--api-key", API_KEY, "--served-model-name", "tiny"]);
    let env = [("WEFT_API_KEY", API_KEY.to_string()), ("WEFT_MODEL_ID", "tiny".to_string())];
    finish("features (test_features.py)", run_python("test_features.py", &server, &env));
}

/// What agent clients rely on (test_agents.py, test_agents_sdk.py, node/aisdk.test.mjs; tiny
/// model): the Responses API streaming and
/// not, its store and previous_response_id, function tools beside hosted ones, text.format;
/// Chat Completions with `n` choices and the reasoning / template fields; Anthropic Messages
/// as Claude Code sends them; count_tokens equal to the prefilled prompt; context overflow in
/// each protocol's words; context lengths in /v1/models.
#[test]
fn agent_protocols_through_the_official_clients() {
    let server = Server::start(
        &tiny_model(),
        Fast,
        &["--api-key", API_KEY, "--served-model-name", "tiny", "--chat-template-args", r#"{"enable_thinking": true}"#],
    );
    let env = [("WEFT_API_KEY", API_KEY.to_string()), ("WEFT_MODEL_ID", "tiny".to_string())];
    // All at once: their requests batch together in the engine.
    let sdk = run_python("test_agents.py", &server, &env);
    let agents = run_python("test_agents_sdk.py", &server, &env);
    let aisdk = node_test_file(&server, "tiny", "aisdk.test.mjs");
    finish("agents (test_agents.py)", sdk);
    finish("openai-agents (test_agents_sdk.py)", agents);
    finish("AI SDK (node/aisdk.test.mjs)", aisdk);
    // --chat-template-args must be a JSON object: a usage error (exit 2) before the model loads.
    let out = Command::new(env!("CARGO_BIN_EXE_weft"))
        .args(["serve", "--chat-template-args", "[1]", "--port", "0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("JSON object"));
}

/// A reasoning model through the official Python clients (tests/server/test_reasoning.py): a tiny
/// Qwen3.5 with the real Qwen3 vocabulary and Qwen3.5 template. Unfinished reasoning arrives as
/// `reasoning_content` / `thinking`, never as content; thinking off renders the closed block; a
/// named call comes in Qwen3-Coder XML after a budgeted block; Anthropic answers `thinking` then
/// `tool_use`; Responses a reasoning item then the call; a call cut by max_tokens is not sent. And
/// a tiny Gemma 4 with the real Gemma 4 template: Gemma's own call syntax on every endpoint.
#[test]
fn reasoning_model_through_the_official_clients() {
    let dir = tempfile::tempdir().unwrap();
    let Some(model) = support::qwen35_chat_model(dir.path()) else { return };
    let server = Server::start(&model, Fast, &["--api-key", API_KEY, "--served-model-name", "qwen35"]);
    let env = [("WEFT_API_KEY", API_KEY.to_string()), ("WEFT_MODEL_ID", "qwen35".to_string())];
    let qwen = run_python("test_reasoning.py", &server, &env);
    // A tiny Gemma 4 with the real Gemma 4 template: its own call syntax on every endpoint.
    let gemma_dir = tempfile::tempdir().unwrap();
    let gemma = Server::start(&support::gemma4_chat_model(gemma_dir.path()), Fast, &["--api-key", API_KEY, "--served-model-name", "gemma4"]);
    let env = [("WEFT_API_KEY", API_KEY.to_string()), ("WEFT_MODEL_ID", "gemma4".to_string())];
    let gemma_run = run_python("test_reasoning.py", &gemma, &env);
    finish("reasoning, Qwen3.5 (test_reasoning.py)", qwen);
    finish("reasoning, Gemma 4 (test_reasoning.py)", gemma_run);
}

/// Tool calling through the official Python clients and the npm openai client on the default model (Weft's fallback
/// tool prompt on SmolLM2's plain ChatML template): OpenAI and Anthropic tool loops, streaming
/// and not, forced choices, and the 400s for bad tool input.
#[test]
fn tool_calls_through_the_official_clients() {
    let Some(model) = default_model() else { return };
    let server = Server::start(&model, Fast, &["--api-key", API_KEY, "--served-model-name", "smol"]);
    let env = [("WEFT_API_KEY", API_KEY.to_string()), ("WEFT_MODEL_ID", "smol".to_string())];
    // Both at once: their requests batch together in the engine.
    let py = run_python("test_tools.py", &server, &env);
    let node = node_test_file(&server, "smol", "tools.test.mjs");
    finish("tools (test_tools.py)", py);
    finish("node openai tools (node/tools.test.mjs)", node);
}

/// 64 concurrent streams, about 30% of the clients hanging up mid-stream: the server survives,
/// every finished stream is well-formed, no row is leaked.
#[test]
fn load_with_disconnects_leaks_no_rows() {
    let server = Server::start(&tiny_model(), Fast, &["--served-model-name", "tiny", "--decode-concurrency", "32"]);
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
    let mut server = Server::start(&tiny_model(), Fast, &["--shutdown-timeout", "30"]);
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
    let mut server = Server::start(&tiny_model(), Fast, &["--shutdown-timeout", "0"]);
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
    let first = Server::start(&tiny_model(), Fast, &[]);
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

/// One raw HTTP/1.1 exchange (`Connection: close`); returns (status, head, body with any
/// chunked framing removed). Panics if the server drops the connection without an answer.
fn exchange(addr: &str, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> (u16, String, Vec<u8>) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut head = format!("{method} {path} HTTP/1.1\r\n");
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        head += &format!("Host: {addr}\r\n");
    }
    for (k, v) in headers {
        head += &format!("{k}: {v}\r\n");
    }
    head += &format!("Content-Length: {}\r\nConnection: close\r\n\r\n", body.len());
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap_or_else(|e| panic!("{method} {path}: connection failed: {e}"));
    parse_response(&raw).unwrap_or_else(|e| panic!("{method} {path}: {e}: {:?}", String::from_utf8_lossy(&raw)))
}

/// Status, head and de-chunked body of a complete HTTP/1.1 response.
fn parse_response(raw: &[u8]) -> Result<(u16, String, Vec<u8>), String> {
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").ok_or("no end of headers")?;
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let status = head.split(' ').nth(1).and_then(|c| c.parse().ok()).ok_or("no status")?;
    let mut rest = &raw[split + 4..];
    let lower = head.to_ascii_lowercase();
    if !lower.contains("transfer-encoding: chunked") {
        if let Some(n) = lower.split("content-length:").nth(1).and_then(|v| v.lines().next()?.trim().parse::<usize>().ok()) {
            if rest.len() != n {
                return Err(format!("body is {} bytes, Content-Length {n}", rest.len()));
            }
        }
        return Ok((status, head, rest.to_vec()));
    }
    let mut body = Vec::new();
    loop {
        let eol = rest.windows(2).position(|w| w == b"\r\n").ok_or("truncated chunk size")?;
        let size = usize::from_str_radix(String::from_utf8_lossy(&rest[..eol]).trim(), 16).map_err(|e| e.to_string())?;
        rest = &rest[eol + 2..];
        if size == 0 {
            return Ok((status, head, body));
        }
        if rest.len() < size + 2 {
            return Err("truncated chunk (the stream did not end)".into());
        }
        body.extend_from_slice(&rest[..size]);
        rest = &rest[size + 2..];
    }
}

fn header_value(head: &str, name: &str) -> Option<String> {
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then(|| v.trim().to_string())
    })
}

/// The security defaults and limits (issue 19), through raw HTTP and the official client:
/// foreign origins and hosts refused, local ones allowed, oversize bodies 413 before they are
/// read, limits with 4xx JSON, the API key on everything but /health.
#[test]
fn security_defaults_and_limits() {
    let server = Server::start(
        &tiny_model(),
        Fast,
        &[
            "--api-key",
            API_KEY,
            "--served-model-name",
            "tiny",
            "--max-body-bytes",
            "1MB",
            "--max-messages",
            "4",
            "--max-tokens-limit",
            "64",
            "--max-connections",
            "8",
        ],
    );
    let env = [("WEFT_API_KEY", API_KEY.to_string()), ("WEFT_MODEL_ID", "tiny".to_string())];
    finish("security (test_security.py)", run_python("test_security.py", &server, &env));
}

/// `--allowed-origins` / `$WEFT_ALLOWED_ORIGINS` replace the default origins (`local` keeps
/// them), `*` allows any; `--allowed-hosts` extends the Host allowlist, `*` turns it off.
#[test]
fn origins_and_hosts_are_configurable() {
    let chat = br#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":1}"#;
    let server = Server::start_with_env(
        &tiny_model(),
        Fast,
        &["--allowed-hosts", "mybox.local"],
        &[("WEFT_ALLOWED_ORIGINS", "https://app.example.com")],
    );
    let post = |origin: &str, host: &str| {
        let (status, head, _) = exchange(
            &server.addr,
            "POST",
            "/v1/chat/completions",
            &[("Origin", origin), ("Host", host), ("Content-Type", "application/json")],
            chat,
        );
        (status, header_value(&head, "access-control-allow-origin"))
    };
    let own = server.addr.clone();
    assert_eq!(post("https://app.example.com", &own), (200, Some("https://app.example.com".into())));
    assert_eq!(post("http://localhost:3000", &own).0, 403, "the env list replaces the defaults");
    assert_eq!(post("https://app.example.com", "mybox.local:8080").0, 200);
    assert_eq!(post("https://app.example.com", "evil.example").0, 403);
    drop(server);

    let server = Server::start_with_env(
        &tiny_model(),
        Fast,
        &["--allowed-origins", "local,https://app.example.com", "--allowed-hosts", "*"],
        &[("WEFT_ALLOWED_ORIGINS", "https://ignored.example")],
    );
    let post = |origin: &str, host: &str| {
        exchange(&server.addr, "POST", "/v1/chat/completions", &[("Origin", origin), ("Host", host)], chat).0
    };
    assert_eq!(post("http://localhost:3000", "evil.example"), 200, "hosts unchecked with *");
    assert_eq!(post("https://app.example.com", &server.addr), 200);
    assert_eq!(post("https://ignored.example", &server.addr), 403, "the flag wins over the env var");
    drop(server);

    let server = Server::start(&tiny_model(), Fast, &["--allowed-origins", "*"]);
    let (status, head, _) =
        exchange(&server.addr, "OPTIONS", "/v1/chat/completions", &[("Origin", "https://evil.example")], b"");
    assert_eq!((status, header_value(&head, "access-control-allow-origin")), (204, Some("*".into())));
}

/// The `data:` payloads of an SSE body.
fn sse_payloads(body: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(body).lines().filter_map(|l| l.strip_prefix("data: ")).map(str::to_string).collect()
}

fn stats(server: &Server) -> serde_json::Value {
    let (status, body) = server.get("/stats", "");
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// SSE back-pressure: a client that stops reading parks only its own row (the engine's
/// `paused_rows`), another request meanwhile runs to its end, and once the slow client reads
/// again its stream resumes where it stopped: its first tokens equal mlx-lm's goldens and the
/// whole stream equals the same request served without a stall.
#[test]
fn slow_stream_parks_only_its_own_row() {
    let server = Server::start(&tiny_model(), Exact, &["--served-model-name", "tiny"]);
    let golden = golden("gguf/llama-q4_1");
    let case = &golden["single"][0];
    let prompt = ids(&case["prompt_ids"]);
    let golden_tokens = ids(&case["tokens"]);
    let tokenizer = support::load_exact(&tiny_model()).unwrap().tokenizer.expect("the tiny GGUF has a tokenizer");
    let golden_texts: Vec<String> = golden_tokens.iter().map(|&t| tokenizer.decode(&[t], false).unwrap()).collect();

    // Greedy, EOS ignored, 20 alternatives a token: ~800 bytes an event, 800 kB in all; the
    // socket buffers (256 kB send, 4 kB receive), hyper's write buffer and the 64 events before
    // the pause hold about a third of that (measured: parked after ~325 tokens).
    let body = serde_json::json!({
        "prompt": prompt, "max_tokens": 1000, "temperature": 0, "ignore_eos": true, "logprobs": 20, "stream": true,
    })
    .to_string();
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let addr: std::net::SocketAddr = server.addr.parse().unwrap();
    socket.connect(&addr.into()).unwrap();
    let mut slow: TcpStream = socket.into();
    write!(
        slow,
        "POST /v1/completions HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        server.addr,
        body.len()
    )
    .unwrap();

    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let s = stats(&server);
        if s["paused_rows"] == 1 {
            let generated = s["tokens_generated"].as_u64().unwrap();
            println!("parked after {generated} of 1000 tokens");
            assert!(generated < 1000, "{s}");
            break;
        }
        assert!(s["requests_finished"] == 0, "the slow stream finished without being parked: {s}");
        assert!(Instant::now() < deadline, "the slow client's row was never parked: {s}");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Another client is served to its end while the slow row stays parked.
    let other = br#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":40,"ignore_eos":true}"#;
    let (status, _, reply) = exchange(&server.addr, "POST", "/v1/chat/completions", &[], other);
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&reply));
    let reply: serde_json::Value = serde_json::from_slice(&reply).unwrap();
    assert_eq!(reply["usage"]["completion_tokens"], 40);
    // The engine publishes its stats after the step that ended the other request, which can
    // come after the reply's last byte.
    let settled = Instant::now() + Duration::from_secs(10);
    let mut s = stats(&server);
    while s["requests_finished"] == 0 && Instant::now() < settled {
        std::thread::sleep(Duration::from_millis(20));
        s = stats(&server);
    }
    assert_eq!((s["paused_rows"].as_u64(), s["active_rows"].as_u64()), (Some(1), Some(0)), "{s}");

    // The slow client reads again: the stream resumes and ends normally.
    let mut raw = Vec::new();
    slow.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    slow.read_to_end(&mut raw).unwrap();
    let (status, _, sse) = parse_response(&raw).unwrap();
    assert_eq!(status, 200);
    let events = sse_payloads(&sse);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let mut texts = Vec::new();
    let mut logprobs = Vec::new();
    let mut finish = None;
    for e in &events[..events.len() - 1] {
        let chunk: serde_json::Value = serde_json::from_str(e).unwrap();
        let choice = &chunk["choices"][0];
        if let Some(lp) = choice["logprobs"].as_object() {
            texts.extend(lp["tokens"].as_array().unwrap().iter().map(|t| t.as_str().unwrap().to_string()));
            logprobs.extend(lp["token_logprobs"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()));
        }
        if !choice["finish_reason"].is_null() {
            finish = choice["finish_reason"].as_str().map(str::to_string);
        }
    }
    assert_eq!(finish.as_deref(), Some("length"));
    assert_eq!(texts.len(), 1000);
    assert_eq!(texts[..golden_texts.len()], golden_texts[..], "the resumed stream left mlx-lm's greedy trajectory");

    // The same request without a stall: token for token and logprob for logprob.
    let plain = serde_json::json!({
        "prompt": prompt, "max_tokens": 1000, "temperature": 0, "ignore_eos": true, "logprobs": 20,
    })
    .to_string();
    let (status, _, reply) = exchange(&server.addr, "POST", "/v1/completions", &[], plain.as_bytes());
    assert_eq!(status, 200);
    let reply: serde_json::Value = serde_json::from_slice(&reply).unwrap();
    let lp = &reply["choices"][0]["logprobs"];
    let plain_texts: Vec<String> = lp["tokens"].as_array().unwrap().iter().map(|t| t.as_str().unwrap().to_string()).collect();
    let plain_logprobs: Vec<f64> = lp["token_logprobs"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
    assert_eq!(texts, plain_texts);
    assert_eq!(logprobs, plain_logprobs);
    assert_eq!(stats(&server)["paused_rows"], 0);
}

/// The bounded soak (issue 12): 5 storms of 300 concurrent streamed requests, 35% of whose
/// clients hang up mid-stream: every other stream ends with a finish reason, nothing errors,
/// no row is left behind, and RSS after the last storm is within 10% of RSS after the first
/// (about 45 s on 2 cores).
#[test]
fn soak_storms_keep_memory_bounded() {
    // Without the prompt cache, which keeps the storms' KV up to its size by design.
    let server = Server::start(&tiny_model(), Fast, &["--served-model-name", "tiny", "--prompt-cache-bytes", "0"]);
    let env = [("WEFT_MODEL_ID", "tiny".to_string()), ("WEFT_PID", server.pid().to_string())];
    finish("soak (test_soak.py)", run_python("test_soak.py", &server, &env));
}

mod fuzz {
    //! HTTP body fuzzing: arbitrary bytes, arbitrary JSON values and valid bodies with fields
    //! replaced by arbitrary values, to every POST endpoint. Every case must get a complete
    //! response: a 2xx (a well-formed stream when streaming) or a 4xx with a JSON error; never
    //! a 5xx, a dropped connection or a hang (each exchange has a 60 s read timeout).

    use super::*;
    use proptest::prelude::*;
    use serde_json::{json, Map, Value};

    const ENDPOINTS: [&str; 4] =
        ["/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/messages/count_tokens"];

    /// Field names the endpoints read, so mutations hit real code paths.
    const KEYS: &[&str] = &[
        "model", "messages", "prompt", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "min_p",
        "stream", "stream_options", "include_usage", "stop", "stop_sequences", "logprobs", "top_logprobs", "n",
        "best_of", "seed", "logit_bias", "presence_penalty", "frequency_penalty", "repetition_penalty",
        "repetition_context_size", "echo", "suffix", "system", "tools", "response_format", "ignore_eos", "role",
        "content", "type", "text",
    ];

    fn key() -> impl Strategy<Value = String> {
        prop_oneof![3 => prop::sample::select(KEYS).prop_map(str::to_string), 1 => "[a-z_]{0,8}"]
    }

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            any::<u64>().prop_map(|n| json!(n)),
            any::<f64>().prop_filter("JSON numbers are finite", |f| f.is_finite()).prop_map(|f| json!(f)),
            prop::sample::select(vec![-1i64, 0, 1, 2, 3, 5, 20, 21, 1023, 1024, 2047, 2049, 1 << 31])
                .prop_map(|n| json!(n)),
            prop::sample::select(vec![-1.5f64, 0.0, 0.5, 1.0, 1.5, 1e308, -0.0]).prop_map(|f| json!(f)),
            any::<String>().prop_map(Value::String),
            prop::sample::select(vec!["user", "assistant", "system", "developer", "tool", "text", "image", "", "tiny"])
                .prop_map(|s| json!(s)),
        ];
        leaf.prop_recursive(3, 32, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::vec((key(), inner), 0..4)
                    .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<_, _>>())),
            ]
        })
    }

    /// A valid body for `endpoint` (short generations: the server caps max_tokens).
    fn valid_body(endpoint: &str) -> Map<String, Value> {
        let v = match endpoint {
            "/v1/completions" => json!({"prompt": "Once upon a time", "max_tokens": 4}),
            "/v1/chat/completions" => json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}),
            _ => json!({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}),
        };
        v.as_object().unwrap().clone()
    }

    #[derive(Debug, Clone)]
    enum Mutation {
        Set(String, Value),
        Remove(String),
        /// In the first message: set a field (role, content, ...).
        SetInMessage(String, Value),
    }

    fn mutation() -> impl Strategy<Value = Mutation> {
        prop_oneof![
            3 => (key(), json_value()).prop_map(|(k, v)| Mutation::Set(k, v)),
            1 => key().prop_map(Mutation::Remove),
            2 => (key(), json_value()).prop_map(|(k, v)| Mutation::SetInMessage(k, v)),
        ]
    }

    fn mutated(endpoint: &str, mutations: &[Mutation]) -> Vec<u8> {
        let mut body = valid_body(endpoint);
        for m in mutations {
            match m {
                Mutation::Set(k, v) => {
                    body.insert(k.clone(), v.clone());
                }
                Mutation::Remove(k) => {
                    body.remove(k);
                }
                Mutation::SetInMessage(k, v) => {
                    if let Some(Value::Object(first)) = body.get_mut("messages").and_then(|m| m.get_mut(0)) {
                        first.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        Value::Object(body).to_string().into_bytes()
    }

    /// Sends one case and checks the answer.
    fn check(server: &Server, endpoint: &str, body: &[u8]) -> Result<(), TestCaseError> {
        let (status, head, reply) =
            exchange(&server.addr, "POST", endpoint, &[("Content-Type", "application/json")], body);
        let text = String::from_utf8_lossy(&reply);
        prop_assert!((200..500).contains(&status), "{endpoint} -> {status}: {text}");
        if status >= 300 {
            prop_assert!(header_value(&head, "content-type").is_some_and(|c| c.contains("application/json")), "{head}");
            let v: Value = serde_json::from_slice(&reply).map_err(|e| TestCaseError::fail(format!("{e}: {text}")))?;
            prop_assert!(v["error"]["message"].is_string(), "{text}");
        } else if header_value(&head, "content-type").is_some_and(|c| c.contains("text/event-stream")) {
            let events = sse_payloads(&reply);
            prop_assert!(!text.contains("event: error") && !text.contains(r#"data: {"error""#), "{text}");
            let ended = events.last().is_some_and(|e| e == "[DONE]" || e.contains(r#""type":"message_stop""#));
            prop_assert!(ended, "the stream did not end: {text}");
        } else {
            prop_assert!(serde_json::from_slice::<Value>(&reply).is_ok(), "{text}");
        }
        Ok(())
    }

    fn config(cases: u32) -> ProptestConfig {
        // No regression files in the source tree; a failure prints its minimal case.
        ProptestConfig { cases, failure_persistence: None, ..ProptestConfig::default() }
    }

    #[test]
    fn http_bodies_never_crash_or_5xx() {
        // Short generations: requests asking for more than 8 tokens get a 400.
        let server = Server::start(&tiny_model(), Fast, &["--max-tokens", "4", "--max-tokens-limit", "8"]);
        let endpoint = || prop::sample::select(ENDPOINTS.to_vec());
        let mut runner = proptest::test_runner::TestRunner::new(config(150));
        runner
            .run(&(endpoint(), prop::collection::vec(any::<u8>(), 0..300)), |(e, bytes)| check(&server, e, &bytes))
            .unwrap();
        let mut runner = proptest::test_runner::TestRunner::new(config(150));
        runner
            .run(&(endpoint(), json_value()), |(e, v)| check(&server, e, v.to_string().as_bytes()))
            .unwrap();
        let mut runner = proptest::test_runner::TestRunner::new(config(300));
        runner
            .run(&(endpoint(), prop::collection::vec(mutation(), 1..4)), |(e, m)| check(&server, e, &mutated(e, &m)))
            .unwrap();
        let (status, _) = server.get("/health", "");
        assert_eq!(status, 200);
        // Not vacuous: the cases reached generation (2xx) as well as each kind of refusal,
        // and the server's own count has no 5xx.
        let (_, metrics) = server.get("/metrics", "");
        let count = |status: &str| -> f64 {
            metrics
                .lines()
                .filter(|l| l.starts_with("weft_http_requests_total{") && l.contains(&format!("status=\"{status}")))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum()
        };
        println!("fuzz: {} answered 200, {} 400 (and /health)", count("200") as u64, count("400") as u64);
        assert!(count("200") >= 20.0 && count("400") >= 100.0, "{metrics}");
        assert_eq!(count("5"), 0.0, "{metrics}");
    }
}

/// One request path: the server hands image chats to the engine as messages like every other
/// chat, so `--chat-template` applies to them too (here a template that writes three extra
/// words before the turns: the prompt grows by 3 tokens over the model's own template's 19).
#[test]
fn chat_template_applies_to_image_requests() {
    let png = std::fs::read(goldens_dir().join("vision").join("a.png")).unwrap();
    let b64 = base64_encode(&png);
    let body = serde_json::json!({
        "max_tokens": 2, "temperature": 0, "ignore_eos": true,
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": "t2 t17 t93 "},
            {"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{b64}")}},
            {"type": "text", "text": " t44 t0 t301 t12 t77 t250 t5 t33"}]}]
    })
    .to_string();
    let model = goldens_dir().join("models").join("gemma3-vision");
    let prompt_tokens = |extra: &[&str]| {
        let server = Server::start(&model, Fast, extra);
        let (status, _, raw) = exchange(&server.addr, "POST", "/v1/chat/completions", &[("Content-Type", "application/json")], body.as_bytes());
        let v: serde_json::Value = serde_json::from_slice(&raw).unwrap();
        assert_eq!(status, 200, "{v}");
        v["usage"]["prompt_tokens"].as_u64().unwrap()
    };
    assert_eq!(prompt_tokens(&[]), 19);
    let template = "t7 t7 t7 {% for m in messages %}{{ m['content'] }}{% endfor %}";
    assert_eq!(prompt_tokens(&["--chat-template", template]), 22, "--chat-template renders the image request");
}

/// One set of request-validation rules and messages across both HTTP APIs: a bad role gets the
/// same message (and field) on /v1/chat/completions and /v1/messages, and `top_logprobs: 21`
/// the same 400 on /v1/chat/completions and /v1/completions (it was clamped there).
#[test]
fn one_set_of_validation_messages_across_endpoints() {
    let server = Server::start(&tiny_model(), Fast, &[]);
    let post = |path: &str, b: serde_json::Value| {
        let (status, _, raw) = exchange(&server.addr, "POST", path, &[("Content-Type", "application/json")], b.to_string().as_bytes());
        let v: serde_json::Value = serde_json::from_slice(&raw).unwrap();
        (status, v)
    };
    let bad_role = serde_json::json!([{"role": "wizard", "content": "hi"}]);
    let (status, oai) = post("/v1/chat/completions", serde_json::json!({"max_tokens": 2, "messages": bad_role}));
    assert_eq!(status, 400, "{oai}");
    let (status, ant) = post("/v1/messages", serde_json::json!({"model": "m", "max_tokens": 2, "messages": bad_role}));
    assert_eq!(status, 400, "{ant}");
    let message = oai["error"]["message"].as_str().unwrap();
    assert_eq!(message, ant["error"]["message"].as_str().unwrap(), "the same message on both APIs");
    assert!(message.contains("messages[0].role") && message.contains("wizard"), "{message}");
    assert_eq!(oai["error"]["param"], "messages[0].role");

    let ask = serde_json::json!([{"role": "user", "content": "hi"}]);
    let (status, chat) = post("/v1/chat/completions", serde_json::json!({"max_tokens": 2, "messages": ask, "logprobs": true, "top_logprobs": 21}));
    assert_eq!(status, 400, "{chat}");
    let (status, legacy) = post("/v1/completions", serde_json::json!({"max_tokens": 2, "prompt": "hi", "logprobs": true, "top_logprobs": 21}));
    assert_eq!(status, 400, "top_logprobs 21 is refused, not clamped: {legacy}");
    assert_eq!(chat["error"]["message"], legacy["error"]["message"]);
    assert_eq!((chat["error"]["param"].as_str(), legacy["error"]["param"].as_str()), (Some("top_logprobs"), Some("top_logprobs")));
}

/// Gemma 3 vision (goldens/models/gemma3-vision, word-level tokenizer "t<id>", a template that
/// writes the turns' text): an OpenAI image_url part gives mlx-vlm's greedy tokens for that
/// image, and so does the same image as a Responses `input_image` part (also kept for a second
/// turn through `previous_response_id`); Anthropic's count_tokens counts it as the engine
/// expands it; a remote URL and an image for a text-only model are 400s; /v1/models says vision.
#[test]
fn image_parts_through_the_chat_endpoint() {
    let g = golden("gemma3_vision");
    let case = g["cases"].as_array().unwrap().iter().find(|c| c["name"] == "image_a").unwrap();
    let want: Vec<String> = case["tokens"].as_array().unwrap().iter().map(|t| format!("t{t}")).collect();
    let server = Server::start(&goldens_dir().join("models").join("gemma3-vision"), Exact, &[]);
    let (status, listed) = server.get("/v1/models", "");
    assert_eq!(status, 200, "{listed}");
    assert!(listed.contains("\"vision\":true"), "{listed}");
    let png = std::fs::read(goldens_dir().join("vision").join("a.png")).unwrap();
    let b64 = base64_encode(&png);
    let body = gemma3_vision_request;
    let post = |b: String| exchange(&server.addr, "POST", "/v1/chat/completions", &[("Content-Type", "application/json")], b.as_bytes());
    let (status, _, raw) = post(body(&format!("data:image/png;base64,{b64}")));
    let v: serde_json::Value = serde_json::from_slice(&raw).unwrap();
    assert_eq!(status, 200, "{v}");
    let got: Vec<&str> = v["choices"][0]["logprobs"]["content"].as_array().unwrap().iter().map(|e| e["token"].as_str().unwrap()).collect();
    assert_eq!(got, want);
    assert_eq!(v["usage"]["prompt_tokens"], 19, "{v}");
    let chat_text = v["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    // The same image through /v1/responses (an input_image part), /v1/messages and its
    // count_tokens (an image block): the same prompt and answer.
    let url = format!("data:image/png;base64,{b64}");
    let responses = serde_json::json!({
        "max_output_tokens": 20, "temperature": 0, "ignore_eos": true,
        "input": [{"role": "user", "content": [
            {"type": "input_text", "text": "t2 t17 t93 "}, {"type": "input_image", "image_url": url},
            {"type": "input_text", "text": " t44 t0 t301 t12 t77 t250 t5 t33"}]}]
    });
    let (status, _, raw) = exchange(&server.addr, "POST", "/v1/responses", &[], responses.to_string().as_bytes());
    let r: serde_json::Value = serde_json::from_slice(&raw).unwrap();
    assert_eq!(status, 200, "{r}");
    assert_eq!((r["output"][0]["content"][0]["text"].as_str(), &r["usage"]["input_tokens"]), (Some(chat_text.as_str()), &serde_json::json!(19)));
    // A second turn on the stored response keeps its image: the same prompt and answer as the
    // whole conversation sent to chat.
    let next = serde_json::json!({"max_output_tokens": 2, "previous_response_id": r["id"], "input": "t5 t6", "ignore_eos": true});
    let (status, _, raw) = exchange(&server.addr, "POST", "/v1/responses", &[], next.to_string().as_bytes());
    let r2: serde_json::Value = serde_json::from_slice(&raw).unwrap();
    assert_eq!(status, 200, "{r2}");
    let whole = serde_json::json!({
        "max_tokens": 2, "temperature": 0, "ignore_eos": true,
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": "t2 t17 t93 "}, {"type": "image_url", "image_url": {"url": url}},
            {"type": "text", "text": " t44 t0 t301 t12 t77 t250 t5 t33"}]},
            {"role": "assistant", "content": chat_text}, {"role": "user", "content": "t5 t6"}]
    });
    let (status, _, raw) = post(whole.to_string());
    let c2: serde_json::Value = serde_json::from_slice(&raw).unwrap();
    assert_eq!(status, 200, "{c2}");
    assert_eq!(r2["usage"]["input_tokens"], c2["usage"]["prompt_tokens"], "{r2} {c2}");
    assert_eq!(r2["output"][0]["content"][0]["text"], c2["choices"][0]["message"]["content"]);
    let image = serde_json::json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64}});
    let messages = serde_json::json!([{"role": "user", "content": [
        {"type": "text", "text": "t2 t17 t93 "}, image, {"type": "text", "text": " t44 t0 t301 t12 t77 t250 t5 t33"}]}]);
    let (status, _, raw) = exchange(&server.addr, "POST", "/v1/messages/count_tokens", &[],
        serde_json::json!({"model": "m", "messages": messages}).to_string().as_bytes());
    let n: serde_json::Value = serde_json::from_slice(&raw).unwrap();
    assert_eq!((status, &n["input_tokens"]), (200, &serde_json::json!(19)), "{n}");
    let (status, _, raw) = post(body("https://example.com/a.png"));
    let text = String::from_utf8_lossy(&raw);
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("remote URLs are not fetched") && text.contains("messages[0].content[1].image_url"), "{text}");
    // Tools need a grammar over the vocabulary; this word-level one can't have it: a 400 naming
    // the field, not a server error.
    let mut tools: serde_json::Value = serde_json::from_str(&body(&url)).unwrap();
    tools["tools"] = serde_json::json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]);
    let (status, _, raw) = post(tools.to_string());
    let text = String::from_utf8_lossy(&raw);
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("tokenizer cannot constrain output") && !text.contains("unsupported model: unsupported"), "{text}");
    // A text-only model.
    let text_only = Server::start(&tiny_model(), Fast, &[]);
    let (status, _, raw) = exchange(&text_only.addr, "POST", "/v1/chat/completions", &[("Content-Type", "application/json")], body("data:image/png;base64,AAAA").as_bytes());
    let text = String::from_utf8_lossy(&raw);
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("takes no images"), "{text}");
}

/// Gemma 4 audio (goldens/models/gemma4-audio-lm) through the official Python clients
/// (tests/server/test_audio.py): input_audio / audio_url parts give mlx-vlm's tokens, bad audio
/// is a 400, Anthropic audio points to the OpenAI endpoint; a model without an audio tower
/// refuses audio parts.
#[test]
fn audio_parts_through_the_official_clients() {
    let server = Server::start(&goldens_dir().join("models").join("gemma4-audio-lm"), Exact, &["--served-model-name", "tiny-audio"]);
    let env = [("WEFT_MODEL_ID", "tiny-audio".to_string()), ("WEFT_GOLDENS", goldens_dir().display().to_string())];
    finish("audio (test_audio.py)", run_python("test_audio.py", &server, &env));
    let text_only = Server::start(&tiny_model(), Fast, &[]);
    let body = serde_json::json!({"max_tokens": 2, "messages": [{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}]}]});
    let (status, _, raw) = exchange(&text_only.addr, "POST", "/v1/chat/completions", &[("Content-Type", "application/json")], body.to_string().as_bytes());
    let text = String::from_utf8_lossy(&raw);
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("takes no audio") && text.contains("messages[0].content[0].input_audio"), "{text}");
}

/// Images, audio and tools in one request (an agent sending a screenshot or a voice note): a tiny
/// Gemma 4 vision + audio model with the real Gemma 4 template and a vocabulary that has its
/// call and media markers. A named call on the OpenAI and on the Anthropic endpoint comes in
/// Gemma's own syntax with schema-valid arguments, and the prompt holds the media's soft tokens.
#[test]
fn media_and_tools_in_one_request() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&support::gemma4_media_chat_model(dir.path()), Fast, &[]);
    let b64 = base64_encode(&std::fs::read(goldens_dir().join("vision").join("a.png")).unwrap());
    let post = |path: &str, b: serde_json::Value| {
        let (status, _, raw) = exchange(&server.addr, "POST", path, &[("Content-Type", "application/json")], b.to_string().as_bytes());
        let v: serde_json::Value = serde_json::from_slice(&raw).unwrap();
        assert_eq!(status, 200, "{v}");
        v
    };
    let parameters = serde_json::json!({"type": "object", "properties": {
        "unit": {"type": "string", "enum": ["c", "f"]}, "days": {"type": "integer", "minimum": 1, "maximum": 9}},
        "required": ["unit", "days"], "additionalProperties": false});
    let openai = |media: Option<serde_json::Value>| {
        let mut content = vec![serde_json::json!({"type": "text", "text": "What is the weather where this was recorded?"})];
        content.extend(media);
        post("/v1/chat/completions", serde_json::json!({
            "max_tokens": 60, "temperature": 0, "messages": [{"role": "user", "content": content}],
            "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": parameters}}],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}}
        }))
    };
    let valid = |args: &serde_json::Value| {
        assert!(["c", "f"].contains(&args["unit"].as_str().unwrap()), "{args}");
        assert!((1..=9).contains(&args["days"].as_i64().unwrap()), "{args}");
        assert_eq!(args.as_object().unwrap().len(), 2, "{args}");
    };
    let without = openai(None);
    let clip = base64_encode(&std::fs::read(goldens_dir().join("audio").join("tones-16k-mono.wav")).unwrap());
    let audio = openai(Some(serde_json::json!({"type": "input_audio", "input_audio": {"data": clip, "format": "wav"}})));
    let with = openai(Some(serde_json::json!({"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{b64}")}})));
    for (what, v, soft) in [("image", &with, 12), ("audio", &audio, 10)] {
        assert_eq!(v["choices"][0]["finish_reason"], "tool_calls", "{what}: {v}");
        let call = &v["choices"][0]["message"]["tool_calls"][0]["function"];
        assert_eq!(call["name"], "get_weather", "{what}: {v}");
        valid(&serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap());
        // The media's soft tokens between their begin/end markers.
        let extra = v["usage"]["prompt_tokens"].as_u64().unwrap() - without["usage"]["prompt_tokens"].as_u64().unwrap();
        assert!(extra >= soft, "the {what} added {extra} prompt tokens: {v} {without}");
    }

    let v = post("/v1/messages", serde_json::json!({
        "model": "m", "max_tokens": 60, "temperature": 0,
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": "What is the weather where this was recorded?"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64}}]}],
        "tools": [{"name": "get_weather", "input_schema": parameters}],
        "tool_choice": {"type": "tool", "name": "get_weather"}
    }));
    assert_eq!(v["stop_reason"], "tool_use", "{v}");
    let used = v["content"].as_array().unwrap().iter().find(|b| b["type"] == "tool_use").expect("a tool_use block");
    assert_eq!(used["name"], "get_weather", "{v}");
    valid(&used["input"]);
    assert_eq!(v["usage"]["input_tokens"], with["usage"]["prompt_tokens"], "the same prompt on both endpoints: {v} {with}");
}

/// Gemma 4 vision (goldens/models/gemma4-vision): an OpenAI image_url part stands for
/// `<|image|>`, expanded by the image's size (12 soft tokens for a.png), and an Anthropic
/// image block the same; both give mlx-vlm's greedy tokens.
#[test]
fn gemma4_image_parts_through_both_endpoints() {
    let g = golden("gemma4_vision");
    let case = g["cases"].as_array().unwrap().iter().find(|c| c["name"] == "image_a").unwrap();
    let want: Vec<String> = case["tokens"].as_array().unwrap().iter().map(|t| format!("t{t}")).collect();
    let server = Server::start(&goldens_dir().join("models").join("gemma4-vision"), Exact, &[]);
    let (status, listed) = server.get("/v1/models", "");
    assert_eq!(status, 200, "{listed}");
    assert!(listed.contains("\"vision\":true"), "{listed}");
    let b64 = base64_encode(&std::fs::read(goldens_dir().join("vision").join("a.png")).unwrap());
    let post = |path: &str, b: serde_json::Value| {
        let (status, _, raw) = exchange(&server.addr, "POST", path, &[("Content-Type", "application/json")], b.to_string().as_bytes());
        let v: serde_json::Value = serde_json::from_slice(&raw).unwrap();
        assert_eq!(status, 200, "{v}");
        v
    };
    let v = post("/v1/chat/completions", serde_json::json!({
        "max_tokens": 20, "temperature": 0, "ignore_eos": true, "logprobs": true,
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": "t2 t17 t93 "},
            {"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{b64}")}},
            {"type": "text", "text": " t44 t0 t201 t12 t77 t150 t5 t33"}]}]
    }));
    let got: Vec<&str> = v["choices"][0]["logprobs"]["content"].as_array().unwrap().iter().map(|e| e["token"].as_str().unwrap()).collect();
    assert_eq!(got, want);
    assert_eq!(v["usage"]["prompt_tokens"], case["prompt_ids"].as_array().unwrap().len(), "{v}");
    let v = post("/v1/messages", serde_json::json!({
        "model": "m", "max_tokens": 20, "temperature": 0,
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": "t2 t17 t93 "},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64}},
            {"type": "text", "text": " t44 t0 t201 t12 t77 t150 t5 t33"}]}]
    }));
    assert_eq!(v["usage"]["input_tokens"], case["prompt_ids"].as_array().unwrap().len(), "{v}");
    // Streamed: message_start's usage is the engine's count too (its Started event), not 0.
    let (status, _, raw) = exchange(&server.addr, "POST", "/v1/messages", &[("Content-Type", "application/json")], serde_json::json!({
        "model": "m", "max_tokens": 4, "temperature": 0, "stream": true,
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": "t2 t17 t93 "},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64}},
            {"type": "text", "text": " t44 t0 t201 t12 t77 t150 t5 t33"}]}]
    }).to_string().as_bytes());
    assert_eq!(status, 200);
    let sse = String::from_utf8_lossy(&raw);
    let start = sse.lines().find_map(|l| l.strip_prefix("data: ").filter(|d| d.contains("\"message_start\""))).expect("message_start");
    let start: serde_json::Value = serde_json::from_str(start).unwrap();
    assert_eq!(start["message"]["usage"]["input_tokens"], case["prompt_ids"].as_array().unwrap().len(), "{start}");
    // Up to the first EOS (id 1, which ends the turn here), spacing aside.
    let until_eos: String = want.iter().take_while(|t| *t != "t1").map(String::as_str).collect();
    assert!(until_eos.len() > 10);
    assert_eq!(v["content"][0]["text"].as_str().unwrap().replace(' ', ""), until_eos, "{v}");
}

/// Gemma 4 with both towers (goldens/models/gemma4-vision-audio, `<|audio|>` = 253): an image_url part and an
/// input_audio part in one OpenAI chat request, in prompt order, give mlx-vlm's greedy tokens
/// (goldens/gemma4_vision_audio.json).
#[test]
fn image_and_audio_parts_in_one_chat_request() {
    let g = golden("gemma4_vision_audio");
    let case = g["cases"].as_array().unwrap().iter().find(|c| c["name"] == "image_then_audio").unwrap();
    let want: Vec<String> = case["tokens"].as_array().unwrap().iter().map(|t| format!("t{t}")).collect();
    let server = Server::start(&goldens_dir().join("models").join("gemma4-vision-audio"), Exact, &[]);
    let (status, listed) = server.get("/v1/models", "");
    assert_eq!(status, 200, "{listed}");
    assert!(listed.contains("\"vision\":true") && listed.contains("\"audio\":true"), "{listed}");
    let png = base64_encode(&std::fs::read(goldens_dir().join("vision").join("a.png")).unwrap());
    let wav = base64_encode(&std::fs::read(goldens_dir().join(g["clip"].as_str().unwrap())).unwrap());
    // "t2 t17" <image> "t44 t9 t61" <audio> "t12 t77 t150 t5": the case's prompt_template_ids.
    let body = serde_json::json!({
        "max_tokens": 16, "temperature": 0, "ignore_eos": true, "logprobs": true,
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": "t2 t17 "},
            {"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{png}")}},
            {"type": "text", "text": " t44 t9 t61 "},
            {"type": "input_audio", "input_audio": {"data": wav, "format": "wav"}},
            {"type": "text", "text": " t12 t77 t150 t5"}]}]
    });
    let (status, _, raw) = exchange(&server.addr, "POST", "/v1/chat/completions", &[("Content-Type", "application/json")], body.to_string().as_bytes());
    let v: serde_json::Value = serde_json::from_slice(&raw).unwrap();
    assert_eq!(status, 200, "{v}");
    let got: Vec<&str> = v["choices"][0]["logprobs"]["content"].as_array().unwrap().iter().map(|e| e["token"].as_str().unwrap()).collect();
    assert_eq!(got, want);
    assert_eq!(v["usage"]["prompt_tokens"], case["prompt_ids"].as_array().unwrap().len(), "{v}");
    // The golden's chat request (issue 27 item 9): the parts mlx-vlm's apply_chat_template and
    // Gemma4Processor turned into its prompt, with the real image and clip.
    let m = &g["messages"];
    let mut parts = m["messages"][0]["content"].clone();
    parts[1]["image_url"]["url"] = format!("data:image/png;base64,{png}").into();
    parts[3]["input_audio"]["data"] = wav.clone().into();
    let body = serde_json::json!({"max_tokens": 16, "temperature": 0, "ignore_eos": true, "logprobs": true,
        "messages": [{"role": "user", "content": parts}]});
    let (status, _, raw) = exchange(&server.addr, "POST", "/v1/chat/completions", &[("Content-Type", "application/json")], body.to_string().as_bytes());
    let v: serde_json::Value = serde_json::from_slice(&raw).unwrap();
    assert_eq!(status, 200, "{v}");
    let got: Vec<String> = v["choices"][0]["logprobs"]["content"].as_array().unwrap().iter().map(|e| e["token"].as_str().unwrap().to_string()).collect();
    let want: Vec<String> = m["tokens"].as_array().unwrap().iter().map(|t| format!("t{t}")).collect();
    assert_eq!(got, want, "the chat-shaped golden");
    assert_eq!(v["usage"]["prompt_tokens"], m["prompt_ids"].as_array().unwrap().len(), "{v}");
}

fn base64_encode(bytes: &[u8]) -> String {
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in bytes.chunks(3) {
        let n = (c[0] as u32) << 16 | (*c.get(1).unwrap_or(&0) as u32) << 8 | *c.get(2).unwrap_or(&0) as u32;
        for i in 0..4 {
            out.push(if i <= c.len() { A[(n >> (18 - 6 * i) & 63) as usize] as char } else { '=' });
        }
    }
    out
}

/// True if the server closed `s` (EOF or reset) within `within`; false if it stayed open.
fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    s.set_read_timeout(Some(within)).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue, // an answer before the close (hyper's 408 on a header timeout)
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => return false,
            Err(_) => return true,
        }
    }
}

fn chat_body(max_tokens: usize) -> String {
    format!(r#"{{"messages":[{{"role":"user","content":"hi"}}],"max_tokens":{max_tokens}}}"#)
}

/// Issue 27: idle keep-alives, half-sent heads and endless bodies are dropped by the header,
/// keep-alive and read timeouts; 520 idle sockets (the cap is 512) lock out neither /health
/// (answered past the cap at once) nor real requests (once the idle ones are closed); a
/// stream longer than every timeout is not cut; a half-closed client gets its answer;
/// `Expect: 100-continue` with an oversize body gets the 413 without `100 Continue`.
#[test]
fn connection_timeouts_and_the_cap() {
    let server = Server::start(
        &tiny_model(),
        Fast,
        &["--header-timeout", "6", "--keep-alive-timeout", "4", "--read-timeout", "3"],
    );
    let chat = chat_body(2);
    let post_chat = || exchange(&server.addr, "POST", "/v1/chat/completions", &[("Content-Type", "application/json")], chat.as_bytes());

    // 520 idle sockets: past the cap /health still answers, anything else gets the 429.
    let mut idle: Vec<TcpStream> = (0..520).map(|_| TcpStream::connect(&server.addr).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(300));
    let start = Instant::now();
    let (status, body) = server.get("/health", "");
    assert_eq!(status, 200, "{body}");
    assert!(start.elapsed() < Duration::from_secs(2), "/health took {:?}", start.elapsed());
    let (status, _, body) = post_chat();
    assert_eq!(status, 429, "{}", String::from_utf8_lossy(&body));
    // The keep-alive timeout (4 s) closes every idle socket; then requests are served again.
    let start = Instant::now();
    for s in idle.iter_mut() {
        assert!(closed_within(s, Duration::from_secs(12)), "an idle connection stayed open");
    }
    assert!(start.elapsed() < Duration::from_secs(12), "idle sockets closed after {:?}", start.elapsed());
    drop(idle);
    std::thread::sleep(Duration::from_millis(200));
    let (status, _, body) = post_chat();
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));

    // A half-sent head is dropped after the header timeout (6 s; the keep-alive timeout, 4 s,
    // is for connections with nothing received).
    let mut s = TcpStream::connect(&server.addr).unwrap();
    write!(s, "POST /v1/chat/completions HTTP/1.1\r\nHost: {}\r\nContent-Type: appl", server.addr).unwrap();
    let start = Instant::now();
    assert!(closed_within(&mut s, Duration::from_secs(15)), "a half-sent head was held");
    let took = start.elapsed();
    assert!(took >= Duration::from_millis(5500) && took < Duration::from_secs(12), "closed after {took:?}");

    // A chunked body that never ends: 408 after the read timeout (3 s), then closed.
    let mut s = TcpStream::connect(&server.addr).unwrap();
    write!(
        s,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n1\r\n{{\r\n",
        server.addr
    )
    .unwrap();
    let mut writer = s.try_clone().unwrap();
    let dripping = std::thread::spawn(move || {
        while writer.write_all(b"1\r\n \r\n").is_ok() {
            std::thread::sleep(Duration::from_millis(700));
        }
    });
    let start = Instant::now();
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let took = start.elapsed();
    let text = String::from_utf8_lossy(&raw);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("--read-timeout"), "{text}");
    assert!(took >= Duration::from_millis(2500) && took < Duration::from_secs(10), "408 after {took:?}");
    let _ = s.shutdown(std::net::Shutdown::Both);
    dripping.join().unwrap();

    // A stream whose client does not read for longer than every timeout is paused, not cut.
    let mut stream = open_stream(&server, 2000);
    std::thread::sleep(Duration::from_secs(7));
    let mut first = String::new();
    stream.read_line(&mut first).unwrap();
    let rest = read_rest(stream);
    assert!(rest.contains(r#""finish_reason":"length""#) && rest.contains("data: [DONE]"), "{rest}");

    // Half-close after a full request: the answer still comes.
    let mut s = TcpStream::connect(&server.addr).unwrap();
    write!(
        s,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{chat}",
        server.addr,
        chat.len()
    )
    .unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let (status, _, body) = parse_response(&raw).unwrap_or_else(|e| panic!("{e}: {:?}", String::from_utf8_lossy(&raw)));
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert!(String::from_utf8_lossy(&body).contains("chat.completion"));

    // Expect: 100-continue with a Content-Length over --max-body-bytes: 413, no 100 first.
    let mut s = TcpStream::connect(&server.addr).unwrap();
    write!(
        s,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: 100000000\r\nExpect: 100-continue\r\n\r\n",
        server.addr
    )
    .unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw);
    assert!(text.starts_with("HTTP/1.1 413"), "{text}");
    assert!(!text.contains("100 Continue"), "{text}");

    // Still serving.
    let (status, _, _) = post_chat();
    assert_eq!(status, 200);
}

/// Issue 27: `/v1/messages/count_tokens` gets /v1/messages' prompt-length precheck: eight
/// 3.9 MB requests are refused at once, before tokenizing, while a stream keeps generating.
#[test]
fn count_tokens_refuses_oversize_prompts_before_tokenizing() {
    let server = Server::start(&tiny_model(), Fast, &[]);
    let stream = open_stream(&server, 2000);
    let text = "lorem ipsum ".repeat(3_900_000 / 12);
    let body = serde_json::json!({"model": "m", "messages": [{"role": "user", "content": text}]}).to_string();
    assert!(body.len() > 3_800_000 && body.len() < 4_000_000);
    let start = Instant::now();
    let clients: Vec<_> = (0..8)
        .map(|_| {
            let (addr, body) = (server.addr.clone(), body.clone());
            std::thread::spawn(move || {
                exchange(&addr, "POST", "/v1/messages/count_tokens", &[("Content-Type", "application/json")], body.as_bytes())
            })
        })
        .collect();
    for c in clients {
        let (status, _, raw) = c.join().unwrap();
        let text = String::from_utf8_lossy(&raw);
        assert_eq!(status, 400, "{text}");
        assert!(text.contains("longer than the model's context"), "{text}");
    }
    assert!(start.elapsed() < Duration::from_secs(10), "took {:?}", start.elapsed());
    let rest = read_rest(stream);
    assert!(rest.contains(r#""finish_reason":"length""#) && rest.contains("data: [DONE]"), "{rest}");
    // A prompt that fits is still counted.
    let (status, _, raw) = exchange(
        &server.addr,
        "POST",
        "/v1/messages/count_tokens",
        &[("Content-Type", "application/json")],
        br#"{"model":"m","messages":[{"role":"user","content":"hello there"}]}"#,
    );
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&raw));
    assert!(String::from_utf8_lossy(&raw).contains("input_tokens"));
}

/// Issue 27: `--api-key-file` reads the key (trimmed) so it stays out of argv; it cannot be
/// combined with `--api-key`; an empty or missing file is a clear startup error.
#[test]
fn api_key_from_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("key");
    std::fs::write(&file, format!("  {API_KEY}\n")).unwrap();
    let server = Server::start(&tiny_model(), Fast, &["--api-key-file", file.to_str().unwrap()]);
    assert_eq!(server.get("/v1/models", "").0, 401);
    assert_eq!(server.get("/v1/models", &format!("Authorization: Bearer {API_KEY}\r\n")).0, 200);
    assert_eq!(server.get("/health", "").0, 200);
    drop(server);

    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_weft"))
            .args(["serve", "--model", tiny_model().to_str().unwrap(), "--port", "0"])
            .args(args)
            .env_remove("WEFT_API_KEY")
            .output()
            .unwrap()
    };
    let out = run(&["--api-key", "k", "--api-key-file", file.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--api-key-file") && err.contains("cannot be used with"), "{err}");
    let empty = dir.path().join("empty");
    std::fs::write(&empty, "\n").unwrap();
    let out = run(&["--api-key-file", empty.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("the file is empty"), "{err}");
    let out = run(&["--api-key-file", dir.path().join("missing").to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("missing") && !err.contains("panicked"), "{err}");
}

/// Issue 27: local media paths. By default every local path is refused; with
/// `--allowed-media-dir` a file inside it is read (and gives mlx-vlm's tokens, as the data: URL
/// does), while /etc/shadow, /proc/self/environ, a directory, a missing file and a symlink out
/// of the directory all get the identical 400 body.
#[test]
fn local_media_paths_need_an_allowed_dir() {
    let g = golden("gemma3_vision");
    let case = g["cases"].as_array().unwrap().iter().find(|c| c["name"] == "image_a").unwrap();
    let want: Vec<String> = case["tokens"].as_array().unwrap().iter().map(|t| format!("t{t}")).collect();
    let dir = tempfile::tempdir().unwrap();
    let allowed = dir.path().join("media");
    std::fs::create_dir_all(allowed.join("sub")).unwrap();
    std::fs::copy(goldens_dir().join("vision").join("a.png"), allowed.join("a.png")).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", allowed.join("escape.png")).unwrap();
    let body = gemma3_vision_request;
    let model = goldens_dir().join("models").join("gemma3-vision");
    let inside = allowed.join("a.png");
    let probes: Vec<String> = vec![
        "/etc/shadow".into(),
        "file:///proc/self/environ".into(),
        allowed.join("sub").display().to_string(),
        allowed.join("missing.png").display().to_string(),
        allowed.join("escape.png").display().to_string(),
        format!("{}/../../etc/passwd", allowed.display()),
    ];

    let server = Server::start(&model, Exact, &[]);
    let post = |addr: &str, url: &str| {
        let (status, _, raw) = exchange(addr, "POST", "/v1/chat/completions", &[("Content-Type", "application/json")], body(url).as_bytes());
        (status, String::from_utf8_lossy(&raw).into_owned())
    };
    let (status, denied) = post(&server.addr, inside.to_str().unwrap());
    assert_eq!(status, 400, "{denied}");
    assert!(denied.contains("local media paths are not allowed"), "{denied}");
    for p in &probes {
        assert_eq!(post(&server.addr, p), (400, denied.clone()), "{p}");
    }
    drop(server);

    let server = Server::start(&model, Exact, &["--allowed-media-dir", allowed.to_str().unwrap()]);
    for url in [inside.display().to_string(), format!("file://{}", inside.display())] {
        let (status, raw) = post(&server.addr, &url);
        assert_eq!(status, 200, "{raw}");
        let v: serde_json::Value = serde_json::from_str(&raw).unwrap();
        let got: Vec<&str> = v["choices"][0]["logprobs"]["content"].as_array().unwrap().iter().map(|e| e["token"].as_str().unwrap()).collect();
        assert_eq!(got, want);
    }
    let (status, refused) = post(&server.addr, &probes[0]);
    assert_eq!(status, 400, "{refused}");
    assert!(refused.contains("not a readable file inside an allowed media dir"), "{refused}");
    for p in &probes {
        assert_eq!(post(&server.addr, p), (400, refused.clone()), "{p}");
    }
    // The flag's directory must exist.
    let out = Command::new(env!("CARGO_BIN_EXE_weft"))
        .args(["serve", "--model", model.to_str().unwrap(), "--port", "0", "--allowed-media-dir"])
        .arg(dir.path().join("nope"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
}

/// The gemma3-vision golden's chat request (text, the image at `url`, text), greedy, 20 tokens.
fn gemma3_vision_request(url: &str) -> String {
    serde_json::json!({
        "max_tokens": 20, "temperature": 0, "ignore_eos": true, "logprobs": true,
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": "t2 t17 t93 "},
            {"type": "image_url", "image_url": {"url": url}},
            {"type": "text", "text": " t44 t0 t301 t12 t77 t250 t5 t33"}]}]
    })
    .to_string()
}

#[path = "support/hub.rs"]
mod hub_fixture;

/// `weft serve --model org/repo` with HF_ENDPOINT at a local Hub: fetched into the Hugging Face
/// cache, served under the repo id; a second server downloads nothing; a request naming another
/// model is a 404.
#[test]
fn serve_fetches_a_hub_repo_id_once() {
    let hub = hub_fixture::Hub::start(vec![hub_fixture::tiny_repo("org/tiny-model")]);
    let cache = tempfile::tempdir().unwrap();
    let env = [("HF_ENDPOINT", hub.url.as_str()), ("HF_HUB_CACHE", cache.path().to_str().unwrap()), ("HF_TOKEN", "")];
    for run in 0..2 {
        hub.clear_requests();
        let server = Server::start_with_env(Path::new("org/tiny-model"), Fast, &["--strict-model"], &env);
        let (status, body) = server.get("/v1/models", "");
        assert_eq!(status, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["data"][0]["id"], "org/tiny-model", "{v}");
        let downloads = hub.downloads();
        if run == 0 {
            assert!(downloads.iter().filter(|r| r.contains("/cdn/")).count() == 4, "{downloads:?}");
        } else {
            assert!(downloads.is_empty(), "the second server downloaded {downloads:?}");
        }
        let body = r#"{"model": "org/other", "prompt": [1, 2], "max_tokens": 1}"#;
        let mut s = TcpStream::connect(&server.addr).unwrap();
        write!(
            s,
            "POST /v1/completions HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            server.addr,
            body.len()
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        assert!(out.starts_with("HTTP/1.1 404") && out.contains("model_not_found"), "{out}");
    }
}

/// `--num-draft-tokens` and the request field `num_draft_tokens`: a completion with drafts
/// equals the one without, `/stats` and `/metrics` count the drafts, and an out-of-range count
/// is a 400 naming the field.
#[test]
fn speculative_decoding_through_the_flag_and_the_request_field() {
    let server = Server::start(&tiny_model(), Exact, &["--num-draft-tokens", "4"]);
    let prompt = "one two three four five one two three four five one two three four five one two";
    let post = |extra: serde_json::Value| {
        let mut body = serde_json::json!({"model": "m", "prompt": prompt, "max_tokens": 64, "ignore_eos": true});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let (status, _, body) =
            exchange(&server.addr, "POST", "/v1/completions", &[("Content-Type", "application/json")], body.to_string().as_bytes());
        (status, serde_json::from_slice::<serde_json::Value>(&body).unwrap())
    };
    let (status, spec) = post(serde_json::json!({}));
    assert_eq!(status, 200, "{spec}");
    let s = stats(&server);
    assert!(s["draft_tokens"].as_u64().unwrap() > 0 && s["speculative_steps"].as_u64().unwrap() > 0, "{s}");
    assert!(s["draft_acceptance_rate"].is_number() && s.get("speculation_off").is_none(), "{s}");
    let (status, plain) = post(serde_json::json!({"num_draft_tokens": 0}));
    assert_eq!(status, 200, "{plain}");
    assert_eq!(spec["choices"][0]["text"], plain["choices"][0]["text"]);
    assert_eq!(stats(&server)["draft_tokens"], s["draft_tokens"], "a request with num_draft_tokens 0 drafts nothing");
    let (status, err) = post(serde_json::json!({"num_draft_tokens": 65}));
    assert_eq!(status, 400, "{err}");
    assert_eq!(err["error"]["param"], "num_draft_tokens", "{err}");
    let (status, metrics) = server.get("/metrics", "");
    assert_eq!(status, 200);
    assert!(metrics.contains("weft_draft_tokens_total ") && metrics.contains("weft_draft_tokens_accepted_total "), "{metrics}");
}

/// llama-server's slot save / restore (`POST /slots/0?action=save|restore`): an entry saved by
/// one server is restored by a new one, whose next request with that prompt reuses it and
/// equals the first (cold) run; names outside the directory, unknown slots and files, and a
/// server without a directory are refused with JSON errors.
#[test]
fn slot_save_and_restore_carry_a_prompt_cache_entry_across_servers() {
    let files = tempfile::tempdir().unwrap();
    let dir = files.path().to_str().unwrap();
    let post = |s: &Server, path: &str, body: serde_json::Value| -> (u16, serde_json::Value) {
        let (status, _, body) = exchange(&s.addr, "POST", path, &[("Content-Type", "application/json")], body.to_string().as_bytes());
        (status, serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null))
    };
    let request = serde_json::json!({"prompt": "The quick brown fox jumps over the lazy dog and then", "max_tokens": 8, "temperature": 0});
    // Files of --prompt-cache-dir load at start: a directory of its own for the slot files.
    let first = Server::start(&tiny_model(), Exact, &["--prompt-cache-bytes", "64MB", "--slot-save-path", dir]);
    let (status, body) = post(&first, "/slots/0?action=save", serde_json::json!({"filename": "fox.bin"}));
    assert_eq!(status, 404, "nothing cached yet: {body}");
    let (status, cold) = post(&first, "/v1/completions", request.clone());
    assert_eq!(status, 200, "{cold}");
    let (status, saved) = post(&first, "/slots/0?action=save", serde_json::json!({"filename": "fox.bin"}));
    assert_eq!(status, 200, "{saved}");
    assert!(saved["n_saved"].as_u64().unwrap() > 8 && saved["n_written"].as_u64().unwrap() > 0, "{saved}");
    assert_eq!(saved["filename"], "fox.bin");
    // Keyed by a prompt (a Weft extension): that prompt's cached prefix.
    let (status, part) = post(&first, "/slots/0?action=save", serde_json::json!({"filename": "part.bin", "prompt": "The quick brown fox"}));
    assert_eq!(status, 200, "{part}");
    assert!(part["n_saved"].as_u64().unwrap() < saved["n_saved"].as_u64().unwrap(), "{part}");
    for (path, body, want) in [
        ("/slots/0?action=save", serde_json::json!({"filename": "../escape.bin"}), 400),
        ("/slots/0?action=save", serde_json::json!({"filename": "sub/x.bin"}), 400),
        ("/slots/0?action=save", serde_json::json!({"filename": ".hidden"}), 400),
        ("/slots/0?action=save", serde_json::json!({}), 400),
        ("/slots/0?action=erase", serde_json::json!({"filename": "fox.bin"}), 400),
        ("/slots/1?action=save", serde_json::json!({"filename": "fox.bin"}), 404),
        ("/slots/0?action=restore", serde_json::json!({"filename": "missing.bin"}), 404),
    ] {
        let (status, err) = post(&first, path, body.clone());
        assert_eq!(status, want, "{path} {body}: {err}");
        assert!(err["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{err}");
    }
    assert!(!files.path().parent().unwrap().join("escape.bin").exists());
    drop(first);

    let second = Server::start(&tiny_model(), Exact, &["--prompt-cache-bytes", "64MB", "--prompt-cache-dir", dir]);
    let (status, restored) = post(&second, "/slots/0?action=restore", serde_json::json!({"filename": "fox.bin"}));
    assert_eq!(status, 200, "{restored}");
    assert_eq!(restored["n_restored"], saved["n_saved"]);
    assert_eq!(restored["n_read"], saved["n_written"]);
    let (status, warm) = post(&second, "/v1/completions", request.clone());
    assert_eq!(status, 200, "{warm}");
    assert_eq!(warm["choices"][0]["text"], cold["choices"][0]["text"]);
    let prompt_tokens = warm["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(warm["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64(), Some(prompt_tokens - 1), "{warm}");
    // A corrupt file is refused, saying why.
    std::fs::write(files.path().join("bad.bin"), b"not a cache file").unwrap();
    let (status, err) = post(&second, "/slots/0?action=restore", serde_json::json!({"filename": "bad.bin"}));
    assert_eq!(status, 400, "{err}");
    assert!(err["error"]["message"].as_str().unwrap().contains("prompt-cache file"), "{err}");
    drop(second);

    // Without a directory, or with the cache off: a clear 400.
    let bare = Server::start(&tiny_model(), Fast, &[]);
    let (status, err) = post(&bare, "/slots/0?action=save", serde_json::json!({"filename": "fox.bin"}));
    assert_eq!(status, 400, "{err}");
    assert!(err["error"]["message"].as_str().unwrap().contains("--prompt-cache-dir"), "{err}");
    let off = Server::start(&tiny_model(), Fast, &["--prompt-cache-bytes", "0", "--prompt-cache-dir", dir]);
    let (status, err) = post(&off, "/slots/0?action=restore", serde_json::json!({"filename": "fox.bin"}));
    assert_eq!(status, 400, "{err}");
    assert!(err["error"]["message"].as_str().unwrap().contains("prompt cache is off"), "{err}");
}
