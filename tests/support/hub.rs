//! A local Hugging Face Hub for tests: an HTTP/1.1 server on 127.0.0.1 that speaks the Hub's URL
//! layout as `huggingface_hub` sees it, serving repos built from files on disk:
//!
//! - `GET /api/models/{org}/{repo}/revision/{rev}` → `{"id", "sha", "siblings": [{"rfilename"}]}`;
//!   an unknown repo is 401 with `X-Error-Code: RepoNotFound` (what the Hub answers without a
//!   token), an unknown revision 404 `RevisionNotFound`, a gated repo without the right
//!   `Authorization: Bearer` 401 `GatedRepo`;
//! - `HEAD|GET /{org}/{repo}/resolve/{rev}/{file}` → for LFS files (`*.safetensors`, `*.gguf`) a
//!   302 to `/cdn/{sha256}` carrying `X-Linked-Etag` and `X-Linked-Size`; for others 200 with
//!   `ETag` (a 40-hex id) and the bytes;
//! - `GET /cdn/{sha256}` → the bytes, honouring `Range`, or cut short while `cut_at` is set.
//!
//! Every request line is recorded (with its `Range`), so tests can count what was fetched.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};

pub struct HubFile {
    pub bytes: Vec<u8>,
    pub sha256: String,
}

pub struct HubRepo {
    pub id: String,
    /// branch or tag → commit
    pub refs: BTreeMap<String, String>,
    /// commit → files
    pub commits: BTreeMap<String, BTreeMap<String, Arc<HubFile>>>,
    /// The token a gated repo wants.
    pub gated_token: Option<String>,
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

fn file(bytes: Vec<u8>) -> Arc<HubFile> {
    Arc::new(HubFile { sha256: sha256_hex(&bytes), bytes })
}

/// A commit id made from a label (40 hex digits).
pub fn commit_id(label: &str) -> String {
    sha256_hex(label.as_bytes())[..40].to_string()
}

impl HubRepo {
    /// A repo whose `main` is one commit holding `files`.
    pub fn new(id: &str, files: Vec<(String, Vec<u8>)>) -> Self {
        let commit = commit_id(&format!("{id}@main"));
        let mut r = HubRepo { id: id.into(), refs: BTreeMap::new(), commits: BTreeMap::new(), gated_token: None };
        r.add_commit("main", &commit, files);
        r
    }

    /// Adds a commit and points `branch` at it.
    pub fn add_commit(&mut self, branch: &str, commit: &str, files: Vec<(String, Vec<u8>)>) {
        self.commits.insert(commit.into(), files.into_iter().map(|(n, b)| (n, file(b))).collect());
        self.refs.insert(branch.into(), commit.into());
    }

    pub fn main_commit(&self) -> String {
        self.refs["main"].clone()
    }

    /// The files of a model directory on disk (top level), plus `extra`.
    pub fn from_dir(id: &str, dir: &Path, extra: Vec<(String, Vec<u8>)>) -> Self {
        let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.is_file())
            .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(&p).unwrap()))
            .collect();
        files.extend(extra);
        files.push(("README.md".into(), b"# a test model\n".to_vec()));
        files.sort();
        HubRepo::new(id, files)
    }
}

/// The repository root: the test crate's manifest folder or the nearest one above it that
/// holds goldens/ (bindings/node is two levels down).
fn repo_root() -> std::path::PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.ancestors().find(|d| d.join("goldens").is_dir()).unwrap_or(manifest).to_path_buf()
}

/// goldens/models/qwen3 (an index and four shards) with the tokenizer of
/// goldens/models/gemma3-vision (512 tokens) and a chat template: everything a text model loads
/// from, plus a README nobody needs, as repo `id`.
pub fn tiny_repo(id: &str) -> HubRepo {
    let tokenizer = std::fs::read(repo_root().join("goldens/models/gemma3-vision/tokenizer.json")).unwrap();
    let config = br#"{"chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}"}"#.to_vec();
    HubRepo::from_dir(
        id,
        &repo_root().join("goldens/models/qwen3"),
        vec![("tokenizer.json".into(), tokenizer), ("tokenizer_config.json".into(), config)],
    )
}

#[derive(Default)]
pub struct HubState {
    pub repos: Vec<HubRepo>,
    /// While set, every CDN GET sends only this many bytes of what it promised, then hangs up.
    pub cut_at: Option<usize>,
    /// Every request: `METHOD PATH range=Some(n)|None auth=bool`.
    pub requests: Vec<String>,
}

pub struct Hub {
    pub url: String,
    pub state: Arc<Mutex<HubState>>,
}

impl Hub {
    pub fn start(repos: Vec<HubRepo>) -> Hub {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://127.0.0.1:{}", listener.local_addr().unwrap().port());
        let state = Arc::new(Mutex::new(HubState { repos, ..Default::default() }));
        let shared = state.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(s) = stream else { continue };
                let st = shared.clone();
                std::thread::spawn(move || handle(s, &st));
            }
        });
        Hub { url, state }
    }

    pub fn requests(&self) -> Vec<String> {
        self.state.lock().unwrap().requests.clone()
    }

    pub fn clear_requests(&self) {
        self.state.lock().unwrap().requests.clear();
    }

    /// Requests that moved file bytes (GETs of `/cdn/` or of non-LFS `resolve` URLs).
    pub fn downloads(&self) -> Vec<String> {
        self.requests().into_iter().filter(|r| r.starts_with("GET ") && !r.contains("/api/")).collect()
    }

    pub fn set_cut(&self, cut: Option<usize>) {
        self.state.lock().unwrap().cut_at = cut;
    }
}

fn is_lfs(name: &str) -> bool {
    name.ends_with(".safetensors") || name.ends_with(".gguf")
}

/// An HTTP request as the test servers see it.
pub struct Req {
    /// The request line, trimmed (`GET /path HTTP/1.1`).
    pub line: String,
    pub method: String,
    pub path: String,
    /// The start of a `Range: bytes=N-` header.
    pub range: Option<usize>,
    pub auth: Option<String>,
}

/// Reads a request's line and headers (the test servers' requests have no body).
pub fn read_request(s: &TcpStream) -> Option<Req> {
    let mut r = BufReader::new(s.try_clone().ok()?);
    let mut line = String::new();
    r.read_line(&mut line).ok()?;
    let line = line.trim().to_string();
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next()?.to_string(), parts.next()?.to_string());
    let (mut range, mut auth) = (None, None);
    loop {
        let mut h = String::new();
        if r.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
            break;
        }
        let lower = h.to_ascii_lowercase();
        if let Some(v) = lower.strip_prefix("range: bytes=") {
            range = v.trim().trim_end_matches('-').parse().ok();
        }
        if lower.starts_with("authorization:") {
            auth = Some(h["authorization:".len()..].trim().to_string());
        }
    }
    Some(Req { line, method, path, range, auth })
}

fn respond(s: &mut TcpStream, status: &str, headers: &[String], body: &[u8], head_only: bool) {
    let mut head = format!("HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n", body.len());
    for h in headers {
        head.push_str(h);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    let _ = s.write_all(head.as_bytes());
    if !head_only {
        let _ = s.write_all(body);
    }
    let _ = s.flush();
}

fn hub_error(s: &mut TcpStream, status: &str, code: &str, head_only: bool) {
    let msg = format!("{code} (test hub)");
    respond(s, status, &[format!("X-Error-Code: {code}"), format!("X-Error-Message: {msg}")], msg.as_bytes(), head_only);
}

fn decode(p: &str) -> String {
    let b = p.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Ok(v) = u8::from_str_radix(&p[i + 1..i + 3], 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn handle(mut s: TcpStream, state: &Mutex<HubState>) {
    let Some(req) = read_request(&s) else { return };
    let head_only = req.method == "HEAD";
    let mut st = state.lock().unwrap();
    st.requests.push(format!("{} {} range={:?} auth={}", req.method, req.path, req.range, req.auth.is_some()));
    let cut = st.cut_at;
    if let Some(sha) = req.path.strip_prefix("/cdn/") {
        let found = st
            .repos
            .iter()
            .flat_map(|r| r.commits.values())
            .flat_map(|files| files.values())
            .find(|f| f.sha256 == sha)
            .cloned();
        drop(st);
        match found {
            Some(f) => send_bytes(&mut s, &f.bytes, req.range, cut, head_only),
            None => respond(&mut s, "404 Not Found", &[], b"no such blob", head_only),
        }
        return;
    }
    let api = req.path.strip_prefix("/api/models/");
    let path = api.unwrap_or(req.path.trim_start_matches('/'));
    let segs: Vec<&str> = path.splitn(4, '/').collect();
    if segs.len() < 4 {
        return respond(&mut s, "404 Not Found", &[], b"not found", head_only);
    }
    let id = format!("{}/{}", segs[0], segs[1]);
    let Some(repo) = st.repos.iter().find(|r| r.id == id) else {
        return hub_error(&mut s, "401 Unauthorized", "RepoNotFound", head_only);
    };
    if let Some(token) = &repo.gated_token {
        if req.auth.as_deref() != Some(&format!("Bearer {token}")) {
            return hub_error(&mut s, "401 Unauthorized", "GatedRepo", head_only);
        }
    }
    let (kind, rest) = (segs[2], segs[3]);
    let (rev, file) = match (api.is_some(), kind) {
        (true, "revision") => (decode(rest), None),
        (false, "resolve") => {
            let (rev, file) = rest.split_once('/').unwrap_or((rest, ""));
            (decode(rev), Some(decode(file)))
        }
        _ => return respond(&mut s, "404 Not Found", &[], b"not found", head_only),
    };
    let commit = repo.refs.get(&rev).cloned().unwrap_or(rev.clone());
    let Some(files) = repo.commits.get(&commit) else {
        return hub_error(&mut s, "404 Not Found", "RevisionNotFound", head_only);
    };
    let Some(file) = file else {
        let siblings: Vec<serde_json::Value> = files.keys().map(|f| serde_json::json!({"rfilename": f})).collect();
        let body = serde_json::json!({"id": id, "sha": commit, "siblings": siblings}).to_string();
        return respond(&mut s, "200 OK", &["Content-Type: application/json".into()], body.as_bytes(), head_only);
    };
    let Some(f) = files.get(&file).cloned() else {
        return hub_error(&mut s, "404 Not Found", "EntryNotFound", head_only);
    };
    drop(st);
    let commit_h = format!("X-Repo-Commit: {commit}");
    if is_lfs(&file) {
        let headers = [
            commit_h,
            format!("X-Linked-Etag: \"{}\"", f.sha256),
            format!("X-Linked-Size: {}", f.bytes.len()),
            format!("Location: /cdn/{}", f.sha256),
            "ETag: \"not-the-sha\"".into(),
        ];
        respond(&mut s, "302 Found", &headers, b"", head_only);
    } else if head_only {
        let headers = [commit_h, format!("ETag: \"{}\"", &f.sha256[..40])];
        // HEAD: the length of what a GET would send, and no body.
        let head = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n{}\r\n{}\r\nConnection: close\r\n\r\n",
            f.bytes.len(),
            headers[0],
            headers[1]
        );
        let _ = s.write_all(head.as_bytes());
    } else {
        send_bytes(&mut s, &f.bytes, req.range, None, false);
    }
}

fn send_bytes(s: &mut TcpStream, data: &[u8], range: Option<usize>, cut: Option<usize>, head_only: bool) {
    let start = range.unwrap_or(0).min(data.len());
    let status = if range.is_some() { "206 Partial Content" } else { "200 OK" };
    let mut head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/octet-stream\r\nAccept-Ranges: bytes\r\nContent-Length: {}\r\nConnection: close\r\n",
        data.len() - start
    );
    if range.is_some() {
        head.push_str(&format!("Content-Range: bytes {start}-{}/{}\r\n", data.len().saturating_sub(1), data.len()));
    }
    head.push_str("\r\n");
    let _ = s.write_all(head.as_bytes());
    if head_only {
        return;
    }
    let end = match cut {
        Some(n) => (start + n).min(data.len()),
        None => data.len(),
    };
    let _ = s.write_all(&data[start..end]);
    let _ = s.flush();
    let _ = s.shutdown(std::net::Shutdown::Both);
}
