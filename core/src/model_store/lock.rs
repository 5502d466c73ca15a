//! Locking: an exclusive advisory lock per model directory, so that concurrent processes
//! install a model once (the others wait, then find the file).

use std::fs::{File, OpenOptions};
use std::io;
use std::path::Path;

use super::progress::{Phase, Progress, Reporter};
use crate::error::{Error, Result};

/// An exclusive advisory lock on a file; released when dropped (or when the process dies).
pub(super) struct DirLock {
    _file: File,
}

impl DirLock {
    /// `Ok(None)` if the filesystem does not support locking: we then go on without it (the
    /// pid-suffixed temp files + atomic rename still keep the cache consistent).
    pub(super) fn acquire(path: &Path, rep: &mut Reporter) -> Result<Option<DirLock>> {
        let file =
            OpenOptions::new().create(true).truncate(false).write(true).open(path).map_err(|e| Error::io(path, e))?;
        match lock_exclusive(&file, false) {
            Ok(true) => return Ok(Some(DirLock { _file: file })),
            Ok(false) => {}
            Err(_) => return Ok(None),
        }
        rep.force(Progress { downloaded: 0, total: None, phase: Phase::Waiting });
        match lock_exclusive(&file, true) {
            Ok(_) => Ok(Some(DirLock { _file: file })),
            Err(_) => Ok(None),
        }
    }
}

/// `Ok(false)`: held by someone else (only when `block` is false).
#[cfg(unix)]
fn lock_exclusive(file: &File, block: bool) -> io::Result<bool> {
    use std::os::unix::io::AsRawFd;
    let op = libc::LOCK_EX | if block { 0 } else { libc::LOCK_NB };
    loop {
        // SAFETY: flock on a file descriptor we own for the duration of the call.
        if unsafe { libc::flock(file.as_raw_fd(), op) } == 0 {
            return Ok(true);
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(code) if code == libc::EWOULDBLOCK => return Ok(false),
            _ => return Err(e),
        }
    }
}

#[cfg(not(unix))]
fn lock_exclusive(_file: &File, _block: bool) -> io::Result<bool> {
    Err(io::Error::new(io::ErrorKind::Unsupported, "no advisory locking on this platform"))
}
