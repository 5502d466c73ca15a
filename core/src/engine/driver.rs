//! The driver thread: one loop, for one process or rank 0 of a rank group ([`Stepper`]), that
//! turns the handle's commands into admitted work, steps the engine, waits when idle and
//! publishes its stats, until shutdown.

use std::sync::atomic::AtomicBool;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use super::{events, EngineCore, EngineStats, Event, RequestId, Step, Submission};
use crate::{Error, Result};

pub(super) enum Command {
    Submit(Submission),
    Cancel(RequestId),
    /// A paused row was resumed; an idle driver re-checks its parked rows.
    Wake,
    Shutdown,
    /// Work on the core itself (saving or loading a prompt-cache entry: [`super::cache_io`]).
    Core(super::cache_io::CoreTask),
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

/// What the driver loop steps: an [`EngineCore`] in this process, or rank 0 of a rank group
/// ([`super::lockstep`]), which sends every step to the other ranks first. The loop (commands,
/// waiting, shutdown, stats, a panic outside a step) is the same for both.
pub(super) trait Stepper {
    /// Nothing to compute: the driver waits for a command.
    fn is_idle(&self) -> bool;
    /// How long an idle driver waits for a command before it runs an idle step anyway (a rank
    /// group's heartbeat); `None`: until one comes.
    fn idle_wait(&self) -> Option<Duration>;
    /// The driver is about to wait for a command.
    fn on_wait(&mut self);
    /// A submitted request, to be admitted.
    fn admit(&mut self, sub: Submission);
    fn cancel(&mut self, id: RequestId);
    /// Runs work on this process's core between two steps ([`Command::Core`]).
    fn run_task(&mut self, task: super::cache_io::CoreTask);
    /// Runs one step. [`Halt`]: the driver ends now and leaves the stepper where it stands (it
    /// may be blocked in a collective); the stepper failed every request itself.
    fn step(&mut self, step: Step) -> std::result::Result<(), Halt>;
    fn stats(&self) -> EngineStats;
    /// The driver failed outside any step (only a bug does that): every outstanding request
    /// gets `why`.
    fn fail_all(&mut self, why: &str);
}

/// A step after which the driver cannot go on ([`Stepper::step`]).
pub(super) struct Halt;

/// One process: the core itself.
impl Stepper for EngineCore {
    fn is_idle(&self) -> bool {
        EngineCore::is_idle(self)
    }

    fn idle_wait(&self) -> Option<Duration> {
        None
    }

    fn on_wait(&mut self) {
        self.on_idle();
    }

    fn admit(&mut self, sub: Submission) {
        self.enqueue(sub);
    }

    fn cancel(&mut self, id: RequestId) {
        EngineCore::cancel(self, id);
    }

    fn run_task(&mut self, task: super::cache_io::CoreTask) {
        task(self);
    }

    fn step(&mut self, step: Step) -> std::result::Result<(), Halt> {
        match step {
            Step::Iterate => {
                // A bug in a step must not leave requests hanging: the rows in flight get an
                // error event (rows the unwinding dropped get theirs from their EventSink) and
                // the engine keeps serving the queue.
                let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.iterate()));
                if let Err(panic) = run {
                    let what = events::panic_message(panic.as_ref());
                    self.fail_running(&format!("internal error: {what}"));
                }
                self.after_step();
            }
            // Not reached: without a wait limit an idle driver steps only after a command.
            Step::Idle => self.on_idle(),
            Step::Shutdown => {
                self.cancel_all();
                self.save_prompt_cache();
            }
        }
        Ok(())
    }

    fn stats(&self) -> EngineStats {
        EngineCore::stats(self)
    }

    fn fail_all(&mut self, why: &str) {
        EngineCore::fail_all(self, why);
    }
}

/// The driver thread: runs `stepper` until shutdown. A panic inside a step is the stepper's to
/// handle (one process fails the rows in flight and goes on); a panic anywhere else kills the
/// engine, which then fails every outstanding request and reports itself dead.
pub(super) fn drive<S: Stepper>(stepper: S, rx: Arc<Mutex<Receiver<Command>>>, stats: Arc<Mutex<EngineStats>>, health: Arc<Health>) {
    let mut stepper = Some(stepper);
    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| serve(&mut stepper, &rx, &stats)));
    match run {
        Ok(Ok(())) => {}
        // Left as it is: it may be blocked where it cannot be interrupted.
        Ok(Err(Halt)) => std::mem::forget(stepper.take()),
        Err(panic) => {
            let why = format!("the engine thread failed: {}", events::panic_message(panic.as_ref()));
            health.mark_dead(why.clone());
            if let Some(mut stepper) = stepper.take() {
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| stepper.fail_all(&why)));
                // Whatever is left (a row the failure stranded) gets its final event when dropped.
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(stepper)));
            }
            // Requests submitted before the handle saw the failure.
            for cmd in rx.lock().try_iter() {
                if let Command::Submit(mut sub) = cmd {
                    sub.sink.close(Event::Error { message: why.clone() });
                }
            }
            stats.lock().active_rows = 0;
        }
    }
}

fn serve<S: Stepper>(stepper: &mut Option<S>, rx: &Mutex<Receiver<Command>>, stats: &Mutex<EngineStats>) -> std::result::Result<(), Halt> {
    let Some(stepper) = stepper.as_mut() else { return Ok(()) };
    let mut shutting_down = false;
    loop {
        // Wait only when there is nothing to compute (parked rows wait for a Wake).
        let idle = !shutting_down && stepper.is_idle();
        let mut commands = Vec::new();
        {
            let rx = rx.lock();
            if idle {
                stepper.on_wait();
                *stats.lock() = stepper.stats(); // what an idle engine holds, after the release
                let first = match stepper.idle_wait() {
                    None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
                    Some(limit) => rx.recv_timeout(limit),
                };
                match first {
                    Ok(c) => commands.push(c),
                    Err(RecvTimeoutError::Timeout) => {}
                    // Every handle is gone (after its Shutdown): nothing can come any more.
                    Err(RecvTimeoutError::Disconnected) => shutting_down = true,
                }
            }
            commands.extend(rx.try_iter());
        }
        let asked = !commands.is_empty();
        for cmd in commands {
            match cmd {
                Command::Submit(mut sub) if shutting_down => {
                    sub.sink.close(Event::Error { message: "the engine is shutting down".into() })
                }
                Command::Submit(sub) => stepper.admit(sub),
                Command::Cancel(id) => stepper.cancel(id),
                Command::Wake => {}
                Command::Shutdown => shutting_down = true,
                Command::Core(task) => stepper.run_task(task),
            }
        }
        let step = match (shutting_down, idle && !asked) {
            (true, _) => Step::Shutdown,
            (false, true) => Step::Idle,
            (false, false) => Step::Iterate,
        };
        stepper.step(step)?;
        *stats.lock() = stepper.stats();
        if step == Step::Shutdown {
            return Ok(());
        }
    }
}
