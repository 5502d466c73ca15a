//! A request's event sink with the final-event guarantee: whatever happens to the request
//! (it finishes, is cancelled, its row is dropped while a step unwinds, the engine thread
//! dies, the engine shuts down), its consumer receives exactly one final event.

use std::panic::{catch_unwind, AssertUnwindSafe};

use super::{Event, Sink};

/// What the consumer gets when a request is dropped without a final event having been sent:
/// only a bug can cause that (every deliberate path sends its own).
const DROPPED: &str = "internal error: the request ended without a final event";

/// The message of a caught panic.
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

/// Owns a request's [`Sink`]. Token events go through [`EventSink::token`]; the final event
/// through [`EventSink::close`], after which the sink is gone. Dropping an `EventSink` that
/// was never closed sends an `Error`. A sink that panics is treated as a consumer that went
/// away: its row is cancelled, and its final event is an `Error` naming the panic.
pub struct EventSink {
    sink: Option<Sink>,
    /// Set when the sink panicked; the final event reports it.
    panicked: Option<String>,
}

impl EventSink {
    pub fn new(sink: Sink) -> Self {
        EventSink { sink: Some(sink), panicked: None }
    }

    /// Delivers a non-final event. `false`: the consumer is gone (or its sink panicked) and
    /// the request should be cancelled.
    pub fn token(&mut self, ev: &Event) -> bool {
        debug_assert!(!ev.is_final());
        if self.panicked.is_some() {
            return false;
        }
        let Some(sink) = self.sink.as_mut() else { return false };
        match catch_unwind(AssertUnwindSafe(|| sink(ev))) {
            Ok(keep_going) => keep_going,
            Err(panic) => {
                self.panicked = Some(panic_message(panic.as_ref()));
                false
            }
        }
    }

    /// Delivers the final event. Only the first call does anything.
    pub fn close(&mut self, ev: Event) {
        debug_assert!(ev.is_final());
        let Some(mut sink) = self.sink.take() else { return };
        let ev = match self.panicked.take() {
            Some(what) => Event::Error { message: format!("the request's event consumer panicked: {what}") },
            None => ev,
        };
        // A sink that panics on its final event has received it as far as we can tell.
        let _ = catch_unwind(AssertUnwindSafe(|| sink(&ev)));
    }

    /// Drops the sink without a final event: for a request that was never accepted (its
    /// submitter got an error instead), so it must get no events at all.
    pub fn discard(&mut self) {
        self.sink = None;
        self.panicked = None;
    }

    /// Whether the final event has been sent.
    pub fn is_closed(&self) -> bool {
        self.sink.is_none()
    }
}

impl Drop for EventSink {
    fn drop(&mut self) {
        self.close(Event::Error { message: DROPPED.into() });
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::engine::Usage;
    use crate::stop::FinishReason;

    fn recorder() -> (Sink, Arc<Mutex<Vec<Event>>>) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&seen);
        (Box::new(move |ev: &Event| {
            log.lock().unwrap().push(ev.clone());
            true
        }), seen)
    }

    fn done() -> Event {
        Event::Done {
            finish_reason: FinishReason::Length,
            stop: None,
            text: String::new(),
            reasoning: String::new(),
            usage: Usage::default(),
            first_logits: Vec::new(),
            tool_deltas: Vec::new(),
            tool_calls: Vec::new(),
        }
    }

    #[test]
    fn dropping_an_open_sink_sends_one_error() {
        let (sink, seen) = recorder();
        drop(EventSink::new(sink));
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 1);
        assert!(matches!(&seen[0], Event::Error { message } if message.contains("without a final event")));
    }

    #[test]
    fn only_the_first_final_event_is_delivered() {
        let (sink, seen) = recorder();
        let mut s = EventSink::new(sink);
        s.close(done());
        s.close(Event::Error { message: "late".into() });
        drop(s);
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 1);
        assert!(matches!(seen[0], Event::Done { .. }));
    }

    #[test]
    fn a_panicking_sink_cancels_and_gets_an_error_final() {
        let calls = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&calls);
        let mut s = EventSink::new(Box::new(move |ev: &Event| {
            log.lock().unwrap().push(ev.clone());
            if !ev.is_final() {
                panic!("consumer bug");
            }
            true
        }));
        let token = Event::Token { token_id: 1, text: "a".into(), reasoning: String::new(), logprobs: None, tool_calls: Vec::new() };
        assert!(!s.token(&token));
        assert!(!s.token(&token), "a panicked sink is not called again for tokens");
        s.close(done());
        let calls = calls.lock().unwrap();
        assert_eq!(calls.len(), 2);
        assert!(matches!(&calls[1], Event::Error { message } if message.contains("consumer bug")));
    }
}
