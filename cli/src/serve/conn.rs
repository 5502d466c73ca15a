//! Serving connections: HTTP/1.1 through hyper with a timer, so that no client holds a
//! connection (one of `--max-connections`) for free.
//!
//! - `--header-timeout`: a request head must arrive whole within it (hyper's header read
//!   timeout; it also runs while a kept-alive connection waits for its next request).
//! - `--read-timeout`: a request body must arrive whole within it, counted from its head;
//!   a body still arriving then gets 408 (the handler reading it sees [`BodyTimeout`]).
//! - `--keep-alive-timeout`: a connection with no request in progress and nothing received
//!   since its last response (or since it was opened) is closed after it. A response being
//!   written (a generating stream, however long) is a request in progress.
//!
//! Past the connection cap a few more connections are served, for `/health` only (everything
//! else gets the 429), so a full server can still be probed; see [`super::limits`].

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{header, HeaderValue, Request, Response, StatusCode};
use axum::Router;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::watch;
use tower_service::Service as _;

use super::limits::{forward_async_write, Accepted, CountedStream, LimitedListener};

/// The connection timeouts; `None` = none.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    pub header: Option<Duration>,
    pub read: Option<Duration>,
    pub keep_alive: Option<Duration>,
}

/// The error a request body reports once `--read-timeout` has passed.
#[derive(Debug)]
pub struct BodyTimeout(pub Duration);

impl std::fmt::Display for BodyTimeout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the request body did not arrive within {}s (--read-timeout)", self.0.as_secs_f64())
    }
}

impl std::error::Error for BodyTimeout {}

/// Accepts until `stop` turns true, then asks every connection to finish its request in
/// progress and close, and returns once all have.
pub async fn serve(
    mut listener: LimitedListener,
    app: Router,
    timeouts: Timeouts,
    refused: Arc<str>,
    stop: watch::Receiver<bool>,
) {
    // Every connection task holds a receiver; `closed()` resolves once all are gone.
    let (all_closed_tx, all_closed_rx) = watch::channel(());
    let mut stopping = stop.clone();
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stopping.wait_for(|s| *s) => break,
        };
        let app = app.clone();
        let stop = stop.clone();
        let alive = all_closed_rx.clone();
        let refused = Arc::clone(&refused);
        tokio::spawn(async move {
            connection(accepted, app, timeouts, refused, stop).await;
            drop(alive);
        });
    }
    drop(listener); // no more accepts: the port closes now
    drop(all_closed_rx);
    all_closed_tx.closed().await;
}

async fn connection(
    accepted: Accepted,
    app: Router,
    timeouts: Timeouts,
    refused: Arc<str>,
    mut stop: watch::Receiver<bool>,
) {
    let (stream, overflow) = match accepted {
        Accepted::Counted(s) => (s, false),
        Accepted::Overflow(s) => (s, true),
    };
    let activity = Arc::new(Activity::new());
    let io = TokioIo::new(WatchedStream { inner: stream, activity: Arc::clone(&activity) });
    let service = ConnService {
        app,
        activity: Arc::clone(&activity),
        read_timeout: timeouts.read,
        refused: overflow.then_some(refused),
    };
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(timeouts.header)
        // A connection past the cap answers one request.
        .keep_alive(!overflow)
        // A client that shuts its write side after the request still gets the answer.
        .half_close(true);
    let conn = builder.serve_connection(io, service);
    tokio::pin!(conn);
    let mut shutting = false;
    loop {
        let idle_check = async {
            match timeouts.keep_alive {
                Some(limit) if !shutting => activity.idle_for(limit).await,
                _ => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = conn.as_mut() => return,
            _ = stop.wait_for(|s| *s), if !shutting => {
                shutting = true;
                conn.as_mut().graceful_shutdown();
            }
            _ = idle_check => {
                shutting = true;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
}

/// What a connection is doing, for the keep-alive timeout: requests in progress (from their
/// head until their response body is finished or dropped) and whether anything was received
/// since it last went idle.
struct Activity {
    in_progress: AtomicUsize,
    received: AtomicBool,
    idle_since: Mutex<Instant>,
}

impl Activity {
    fn new() -> Self {
        Activity {
            in_progress: AtomicUsize::new(0),
            received: AtomicBool::new(false),
            idle_since: Mutex::new(Instant::now()),
        }
    }

    fn begin(self: &Arc<Self>) -> InProgress {
        self.in_progress.fetch_add(1, Ordering::SeqCst);
        InProgress(Arc::clone(self))
    }

    /// Resolves once the connection has been idle (no request in progress, nothing received)
    /// for `limit`.
    async fn idle_for(&self, limit: Duration) {
        loop {
            let since = *self.idle_since.lock().unwrap_or_else(|p| p.into_inner());
            let busy = self.in_progress.load(Ordering::SeqCst) > 0 || self.received.load(Ordering::SeqCst);
            if !busy && since.elapsed() >= limit {
                return;
            }
            // Re-checked at most every quarter of the limit: cheap, and closes within 1.25×.
            let wait = if busy { limit } else { limit.saturating_sub(since.elapsed()) };
            tokio::time::sleep(wait.clamp(Duration::from_millis(10), (limit / 4).max(Duration::from_millis(10)))).await;
        }
    }
}

/// One request in progress; dropped with its response body.
struct InProgress(Arc<Activity>);

impl Drop for InProgress {
    fn drop(&mut self) {
        let a = &self.0;
        if a.in_progress.fetch_sub(1, Ordering::SeqCst) == 1 {
            *a.idle_since.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
            a.received.store(false, Ordering::SeqCst);
        }
    }
}

/// The connection's socket, noting every byte received.
struct WatchedStream {
    inner: CountedStream,
    activity: Arc<Activity>,
}

impl AsyncRead for WatchedStream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut this.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            this.activity.received.store(true, Ordering::SeqCst);
        }
        r
    }
}

forward_async_write!(WatchedStream);

/// The router, with each request's body under the read timeout and its response marking the
/// request in progress until it is done. `refused`: a connection past the cap, which answers
/// `/health` and refuses the rest with this 429 body.
#[derive(Clone)]
struct ConnService {
    app: Router,
    activity: Arc<Activity>,
    read_timeout: Option<Duration>,
    refused: Option<Arc<str>>,
}

impl hyper::service::Service<Request<Incoming>> for ConnService {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        if let Some(body) = &self.refused {
            if req.uri().path() != "/health" {
                let mut r = Response::new(Body::from(body.to_string()));
                *r.status_mut() = StatusCode::TOO_MANY_REQUESTS;
                r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
                r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                return Box::pin(std::future::ready(Ok(r)));
            }
        }
        let guard = self.activity.begin();
        let deadline = self.read_timeout.map(|d| (d, Box::pin(tokio::time::sleep(d))));
        let req = req.map(|body| Body::new(TimedBody { inner: body, deadline }));
        let mut app = self.app.clone();
        Box::pin(async move {
            let response = match app.call(req).await {
                Ok(r) => r,
                Err(e) => match e {},
            };
            Ok(response.map(|body| Body::new(GuardedBody { inner: body, _guard: guard })))
        })
    }
}

/// A request body that fails with [`BodyTimeout`] once its deadline has passed unfinished.
struct TimedBody {
    inner: Incoming,
    deadline: Option<(Duration, Pin<Box<tokio::time::Sleep>>)>,
}

impl http_body::Body for TimedBody {
    type Data = axum::body::Bytes;
    type Error = axum::BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        if let Some((limit, sleep)) = &mut this.deadline {
            if sleep.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Some(Err(Box::new(BodyTimeout(*limit)))));
            }
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A response body that keeps its request counted as in progress until it is done.
struct GuardedBody {
    inner: Body,
    _guard: InProgress,
}

impl http_body::Body for GuardedBody {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
