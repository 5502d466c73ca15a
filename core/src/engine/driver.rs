//! The driver thread: the loop that feeds commands to the core and steps it until shutdown.

use std::sync::atomic::AtomicBool;
use std::sync::mpsc::Receiver;
use std::sync::Arc;

use parking_lot::Mutex;

use super::{events, EngineCore, EngineStats, Event, RequestId, Submission};
use crate::{Error, Result};

pub(super) enum Command {
    Submit(Submission),
    Cancel(RequestId),
    /// A paused row was resumed; an idle driver re-checks its parked rows.
    Wake,
    Shutdown,
}

/// Whether the driver thread is alive. Once it has died (a panic outside any step, which
/// only a bug causes) the engine takes no more requests and says why.
#[derive(Default)]
pub(super) struct Health {
    pub(super) failure: Mutex<Option<String>>,
    /// The driver is stuck where it cannot be interrupted (a collective of a rank group that
    /// stopped answering): shutting down leaves it instead of joining it.
    pub(super) abandoned: AtomicBool,
}

impl Health {
    pub(super) fn check(&self) -> Result<()> {
        match self.failure.lock().as_ref() {
            Some(why) => Err(Error::EngineFailed(why.clone())),
            None => Ok(()),
        }
    }

    pub(super) fn mark_dead(&self, why: String) {
        self.failure.lock().get_or_insert(why);
    }
}

/// The driver thread: runs the core until shutdown. A panic inside a step fails the rows in
/// flight and the engine goes on; a panic anywhere else kills the engine, which then fails
/// every outstanding request and reports itself dead.
pub(super) fn drive(core: EngineCore, rx: Receiver<Command>, stats: Arc<Mutex<EngineStats>>, health: Arc<Health>) {
    let mut core = Some(core);
    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| serve(&mut core, &rx, &stats)));
    if let Err(panic) = run {
        let why = format!("the engine thread failed: {}", events::panic_message(panic.as_ref()));
        health.mark_dead(why.clone());
        if let Some(mut core) = core.take() {
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| core.fail_all(&why)));
            // Whatever is left (a row the failure stranded) gets its final event when dropped.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(core)));
        }
        // Requests submitted before the handle saw the failure.
        for cmd in rx.try_iter() {
            if let Command::Submit(mut sub) = cmd {
                sub.sink.close(Event::Error { message: why.clone() });
            }
        }
        stats.lock().active_rows = 0;
    }
}

fn serve(core: &mut Option<EngineCore>, rx: &Receiver<Command>, stats: &Mutex<EngineStats>) {
    let Some(core) = core.as_mut() else { return };
    let mut shutting_down = false;
    loop {
        // Block only when there is nothing to compute (parked rows wait for a Wake).
        let first = if core.is_idle() && !shutting_down {
            core.on_idle();
            *stats.lock() = core.stats(); // what an idle engine holds, after the release
            match rx.recv() {
                Ok(c) => Some(c),
                Err(_) => break,
            }
        } else {
            None
        };
        for cmd in first.into_iter().chain(std::iter::from_fn(|| rx.try_recv().ok())) {
            match cmd {
                Command::Submit(mut sub) => {
                    if shutting_down {
                        sub.sink.close(Event::Error { message: "the engine is shutting down".into() });
                    } else {
                        core.enqueue(sub);
                    }
                }
                Command::Cancel(id) => core.cancel(id),
                Command::Wake => {}
                Command::Shutdown => shutting_down = true,
            }
        }
        if shutting_down {
            core.cancel_all();
            core.save_prompt_cache();
            *stats.lock() = core.stats();
            break;
        }
        // A bug in a step must not leave requests hanging: the rows in flight get an error
        // event (rows the unwinding dropped get theirs from their EventSink) and the engine
        // keeps serving the queue.
        let step = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| core.iterate()));
        if let Err(panic) = step {
            let what = events::panic_message(panic.as_ref());
            core.fail_running(&format!("internal error: {what}"));
        }
        core.after_step();
        *stats.lock() = core.stats();
    }
}
