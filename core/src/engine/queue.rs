//! The one bounded event queue every face drains. A consumer off the driver thread (a C
//! callback pool, a JavaScript iterator, an HTTP response) may fall behind; its undelivered
//! events queue here and the row is paused ([`RowFlow`]) once [`PAUSE_AT`] wait, and resumed
//! once the consumer has brought them down to [`RESUME_AT`]. So a slow consumer back-pressures
//! only its own row, memory per request stays bounded, and no face writes its own watermarks.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use super::{Event, RowFlow, Sink};

/// Undelivered items at which the row is paused: deep enough that a consumer keeping up never
/// pauses its row, shallow enough to bound memory.
pub const PAUSE_AT: usize = 64;
/// Undelivered items at (or below) which a paused row resumes.
pub const RESUME_AT: usize = 16;

/// A FIFO tied to a row's [`RowFlow`]: pushing the [`PAUSE_AT`]th undelivered item pauses the
/// row, popping down to [`RESUME_AT`] resumes it. Not synchronized itself: the owner keeps it
/// under the lock its producer and consumer share, so a pause never lands after the drain that
/// should have undone it. [`EventQueue`] is that for [`Event`]s; a face that turns events into
/// its own items (the Node binding's chunks) holds a `FlowQueue` of those.
pub struct FlowQueue<T> {
    items: VecDeque<T>,
    flow: RowFlow,
}

impl<T> FlowQueue<T> {
    pub fn new(flow: RowFlow) -> Self {
        FlowQueue { items: VecDeque::new(), flow }
    }

    /// The row's flow control, to pass to [`super::Engine::submit_with_flow`].
    pub fn flow(&self) -> &RowFlow {
        &self.flow
    }

    /// Queues an item. A final item never pauses (nothing follows it).
    pub fn push(&mut self, item: T, is_final: bool) {
        self.items.push_back(item);
        if !is_final && self.items.len() >= PAUSE_AT {
            self.flow.pause();
        }
    }

    /// The oldest item, resuming the row once the backlog is low again.
    pub fn pop(&mut self) -> Option<T> {
        let item = self.items.pop_front()?;
        if self.items.len() <= RESUME_AT {
            self.flow.resume();
        }
        Some(item)
    }

    /// Drops every queued item (a consumer that gave up) and lets the row run to its end.
    pub fn clear(&mut self) {
        self.items.clear();
        self.flow.resume();
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

/// What [`EventQueue::try_next`] found.
#[derive(Debug)]
pub enum Next {
    Event(Event),
    /// Nothing queued now; more will come (the consumer is woken by its notify hook).
    Empty,
    /// Nothing queued and nothing more will come (the engine dropped the sink).
    Closed,
}

/// A request's events between the engine's driver thread (through the [`Sink`] that
/// [`EventQueue::new`] returns) and one consumer, with the flow control of [`FlowQueue`].
/// Blocking consumers use [`EventQueue::next_blocking`]; others give a notify hook (called on
/// the producer's thread, outside the lock, after each event and when the sink is dropped) and
/// poll [`EventQueue::try_next`].
#[derive(Clone)]
pub struct EventQueue {
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<State>,
    ready: Condvar,
    notify: Option<Box<dyn Fn() + Send + Sync>>,
}

struct State {
    events: FlowQueue<Event>,
    /// The engine dropped the sink: no more events will come.
    closed: bool,
    /// The consumer asked for the row to end ([`EventQueue::cancel`]): the sink answers
    /// `false`, which cancels the row; its remaining events, the final one included, still come.
    cancelled: bool,
}

/// Closes the queue when the engine drops the sink, so a consumer never waits for events that
/// cannot come.
struct Producer(Arc<Shared>);

impl Drop for Producer {
    fn drop(&mut self) {
        self.0.lock().closed = true;
        self.0.ready.notify_all();
        if let Some(notify) = &self.0.notify {
            notify();
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A poisoned lock only means a consumer panicked while holding it; the queue is intact.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl EventQueue {
    /// A queue for a blocking consumer, and the sink to submit with (with [`EventQueue::flow`]).
    pub fn new() -> (EventQueue, Sink) {
        Self::build(None)
    }

    /// A queue whose consumer is woken by `notify` (on the engine's thread: it must not block).
    pub fn with_notify(notify: impl Fn() + Send + Sync + 'static) -> (EventQueue, Sink) {
        Self::build(Some(Box::new(notify)))
    }

    fn build(notify: Option<Box<dyn Fn() + Send + Sync>>) -> (EventQueue, Sink) {
        let shared = Arc::new(Shared {
            state: Mutex::new(State { events: FlowQueue::new(RowFlow::new()), closed: false, cancelled: false }),
            ready: Condvar::new(),
            notify,
        });
        let producer = Producer(Arc::clone(&shared));
        let sink: Sink = Box::new(move |ev: &Event| {
            let shared = &producer.0;
            let mut state = shared.lock();
            state.events.push(ev.clone(), ev.is_final());
            let keep_going = !state.cancelled;
            drop(state);
            shared.ready.notify_one();
            if let Some(notify) = &shared.notify {
                notify();
            }
            keep_going
        });
        (EventQueue { shared }, sink)
    }

    /// The row's flow control: submit with it ([`super::Engine::submit_with_flow`]).
    pub fn flow(&self) -> RowFlow {
        self.shared.lock().events.flow().clone()
    }

    /// The next event if one is queued.
    pub fn try_next(&self) -> Next {
        let mut state = self.shared.lock();
        match state.events.pop() {
            Some(ev) => Next::Event(ev),
            None if state.closed => Next::Closed,
            None => Next::Empty,
        }
    }

    /// Waits for the next event; `None` once the queue is closed and drained.
    pub fn next_blocking(&self) -> Option<Event> {
        let mut state = self.shared.lock();
        loop {
            if let Some(ev) = state.events.pop() {
                return Some(ev);
            }
            if state.closed {
                return None;
            }
            state = self.shared.ready.wait(state).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Whether an event (or the close) is waiting to be taken.
    pub fn has_pending(&self) -> bool {
        let state = self.shared.lock();
        !state.events.is_empty() || state.closed
    }

    /// Asks for the row to end from the consumer's side (its next event's sink call answers
    /// `false`); the row is resumed if paused, so that answer comes. The final event still
    /// arrives.
    pub fn cancel(&self) {
        let mut state = self.shared.lock();
        state.cancelled = true;
        state.events.flow().resume();
    }

    /// Undelivered events now.
    pub fn len(&self) -> usize {
        self.shared.lock().events.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(i: u32) -> Event {
        Event::Token { token_id: i, text: String::new(), reasoning: String::new(), logprobs: None, tool_calls: Vec::new() }
    }

    #[test]
    fn pauses_at_the_high_mark_and_resumes_at_the_low_one() {
        let (q, mut sink) = EventQueue::new();
        let flow = q.flow();
        for i in 0..PAUSE_AT as u32 - 1 {
            assert!(sink(&token(i)));
        }
        assert!(!flow.is_paused());
        sink(&token(99));
        assert!(flow.is_paused(), "the {PAUSE_AT}th undelivered event pauses the row");
        while q.len() > RESUME_AT + 1 {
            assert!(matches!(q.try_next(), Next::Event(_)));
            assert!(flow.is_paused());
        }
        assert!(matches!(q.try_next(), Next::Event(_)));
        assert!(!flow.is_paused(), "down to {RESUME_AT} the row resumes");
    }

    #[test]
    fn closes_when_the_sink_is_dropped_and_cancel_answers_false() {
        let (q, mut sink) = EventQueue::new();
        assert!(sink(&token(1)));
        q.cancel();
        assert!(!sink(&token(2)), "a cancelled consumer's sink answers false");
        drop(sink);
        assert!(q.next_blocking().is_some());
        assert!(q.next_blocking().is_some());
        assert!(q.next_blocking().is_none());
        assert!(matches!(q.try_next(), Next::Closed));
    }
}
