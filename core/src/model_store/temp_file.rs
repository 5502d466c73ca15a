//! Temp files: pid-suffixed `.<name>.<pid>.part` / `.tmp` files that are deleted on every
//! failure path, swept when a dead process left them, and renamed into place atomically.

use std::fs;
use std::path::{Path, PathBuf};

/// Deletes the file it names when dropped (set the field to `None` to keep it).
pub(super) struct TempGuard(pub(super) Option<PathBuf>);

impl Drop for TempGuard {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = fs::remove_file(p);
        }
    }
}

/// Remove `.<name>.<pid>.part` / `.tmp` files left by killed processes. Only called while
/// holding the directory lock.
pub(super) fn sweep_stale_temps(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with('.') && (name.ends_with(".part") || name.ends_with(".tmp")) {
            let _ = fs::remove_file(entry.path());
        }
    }
}

/// Makes a rename in `dir` durable (fsync of the directory; a no-op where unsupported).
pub(super) fn sync_dir(dir: &Path) {
    #[cfg(unix)]
    if let Ok(d) = fs::File::open(dir) {
        let _ = d.sync_all();
    }
    #[cfg(not(unix))]
    let _ = dir;
}
