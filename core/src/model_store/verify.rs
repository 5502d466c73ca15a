//! Verification: streamed sha256 of files and the size + hash check every installed file passes.

use std::fmt::Write as _;
use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

use sha2::{Digest, Sha256};

use super::catalogue::DefaultModel;
use super::progress::{Phase, Progress, Reporter};
use super::CHUNK;
use crate::error::{Error, Result};

/// Checks a local wheel (`WEFT_DEFAULT_MODEL_WHEEL`) against the pinned size and sha256.
pub(super) fn verify_local_wheel(path: &Path, spec: &DefaultModel, rep: &mut Reporter) -> Result<()> {
    let (size, hash) = hash_file(path, Some(rep))?;
    check(&path.display(), "wheel", spec.wheel_size, &spec.wheel_sha256, size, &hash)
}

/// Size + sha256 of a file, streamed.
pub(super) fn hash_file(path: &Path, mut rep: Option<&mut Reporter>) -> Result<(u64, String)> {
    let mut f = File::open(path).map_err(|e| Error::io(path, e))?;
    let total = f.metadata().ok().map(|m| m.len());
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; CHUNK];
    let mut read = 0u64;
    if let Some(r) = rep.as_deref_mut() {
        r.force(Progress { downloaded: 0, total, phase: Phase::Verifying });
    }
    loop {
        let n = match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Error::io(path, e)),
        };
        hasher.update(&buf[..n]);
        read += n as u64;
        if let Some(r) = rep.as_deref_mut() {
            r.report(Progress { downloaded: read, total, phase: Phase::Verifying });
        }
    }
    Ok((read, hex(&hasher.finalize())))
}

pub(super) fn check(
    what: &dyn std::fmt::Display,
    kind: &str,
    want_size: u64,
    want_sha: &str,
    got_size: u64,
    got_sha: &str,
) -> Result<()> {
    if got_size == want_size && got_sha.eq_ignore_ascii_case(want_sha) {
        return Ok(());
    }
    Err(Error::Download(format!(
        "{kind} {what} failed verification: expected {want_size} bytes with sha256 {want_sha}, \
         got {got_size} bytes with sha256 {got_sha}"
    )))
}

pub(super) fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

