//! Bounds on what one client can make the server do: body size, message count, `max_tokens`,
//! open connections, and prompts that can never fit the context (refused from their byte
//! length, before tokenizing them).

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use weft::tokenizer::Tokenizer;

use super::errors::ApiError;

/// The configurable limits (`--max-body-bytes`, `--max-messages`, `--max-tokens-limit`,
/// `--max-connections`).
#[derive(Debug, Clone)]
pub struct Limits {
    pub body_bytes: usize,
    pub messages: usize,
    /// Largest `max_tokens` a request may ask for; `None` = the model's context is the bound.
    pub max_tokens: Option<usize>,
    pub connections: usize,
}

impl Limits {
    pub fn check_messages(&self, count: usize, param: &str) -> Result<(), ApiError> {
        if count > self.messages {
            return Err(ApiError::field(
                param,
                format!("`{param}` has {count} messages; this server accepts at most {} (--max-messages)", self.messages),
            ));
        }
        Ok(())
    }

    pub fn check_max_tokens(&self, requested: usize, param: &str) -> Result<(), ApiError> {
        match self.max_tokens {
            Some(limit) if requested > limit => Err(ApiError::field(
                param,
                format!("`{param}` is {requested}; this server allows at most {limit} (--max-tokens-limit)"),
            )),
            _ => Ok(()),
        }
    }
}

/// Refuses text that cannot fit the context whatever it tokenizes to: no token covers more
/// than the vocabulary's longest entry, so `bytes / longest` is a floor on the token count.
/// (Twice the longest entry, as headroom for normalizers that shorten text.)
#[derive(Debug, Clone, Copy)]
pub struct PromptBound {
    context: Option<usize>,
    max_token_bytes: usize,
}

impl PromptBound {
    pub fn new(tokenizer: Option<&Tokenizer>, context: Option<usize>) -> Self {
        let longest = tokenizer
            .map(|t| t.inner().get_vocab(true).keys().map(String::len).max().unwrap_or(0))
            .unwrap_or(0);
        PromptBound { context, max_token_bytes: longest.max(1) * 2 }
    }

    /// `bytes`: the length of the text to be tokenized (all message contents, or the prompt).
    pub fn check(&self, bytes: usize) -> Result<(), ApiError> {
        let Some(context) = self.context else { return Ok(()) };
        let at_least = bytes / self.max_token_bytes;
        if at_least > context {
            return Err(ApiError::overflow(
                at_least,
                context.saturating_sub(1),
                format!("the prompt is {bytes} bytes, at least {at_least} tokens: longer than the model's context of {context} tokens"),
            ));
        }
        Ok(())
    }
}

/// SO_SNDBUF of accepted connections (Linux doubles it). Token streams are small; without it
/// loopback autotuning lets one stalled client park megabytes in the kernel.
const SEND_BUFFER_BYTES: usize = 128 << 10;

/// Connections served past the cap, for `/health` only (each answers one request, under the
/// header timeout, then closes). Beyond these too, a connection gets the 429 unread.
pub const HEALTH_RESERVE: usize = 32;

/// A listener that holds at most `limit` connections open. Past that, up to [`HEALTH_RESERVE`]
/// more are accepted to answer `/health` (and 429 to anything else, see [`super::conn`]); one
/// more still is answered with a 429 JSON error and closed, without reading its request.
pub struct LimitedListener {
    inner: TcpListener,
    open: Arc<AtomicUsize>,
    overflow: Arc<AtomicUsize>,
    limit: usize,
    refused_body: Arc<str>,
    refused: u64,
}

/// An accepted connection: within the cap, or past it (served for `/health` only).
pub enum Accepted {
    Counted(CountedStream),
    Overflow(CountedStream),
}

impl LimitedListener {
    pub fn new(inner: TcpListener, limit: usize, refused_body: Arc<str>) -> Self {
        LimitedListener {
            inner,
            open: Arc::new(AtomicUsize::new(0)),
            overflow: Arc::new(AtomicUsize::new(0)),
            limit: limit.max(1),
            refused_body,
            refused: 0,
        }
    }

    pub async fn accept(&mut self) -> Accepted {
        loop {
            let stream = match self.inner.accept().await {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    eprintln!("weft serve: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let counted = |stream: TcpStream, open: &Arc<AtomicUsize>| {
                let _ = stream.set_nodelay(true);
                // The kernel's share of what a non-reading client holds; the rest of the
                // bound is the stream's own (see state.rs, back-pressure).
                let _ = socket2::SockRef::from(&stream).set_send_buffer_size(SEND_BUFFER_BYTES);
                CountedStream { inner: stream, open: Arc::clone(open) }
            };
            if self.open.fetch_add(1, Ordering::SeqCst) < self.limit {
                return Accepted::Counted(counted(stream, &self.open));
            }
            self.open.fetch_sub(1, Ordering::SeqCst);
            // Said once, then every 1000th: a refusing sidecar should not be silent, nor flood
            // its log.
            if self.refused % 1000 == 0 {
                eprintln!(
                    "weft serve: {} open connections, refusing more (--max-connections); {} refused so far",
                    self.limit,
                    self.refused + 1
                );
            }
            self.refused += 1;
            if self.overflow.fetch_add(1, Ordering::SeqCst) < HEALTH_RESERVE {
                return Accepted::Overflow(counted(stream, &self.overflow));
            }
            self.overflow.fetch_sub(1, Ordering::SeqCst);
            tokio::spawn(refuse(stream, Arc::clone(&self.refused_body)));
        }
    }
}

/// Writes the 429 and closes; reads a little of the request first so the close is not a reset
/// that would hide the response from the client.
async fn refuse(stream: TcpStream, body: Arc<str>) {
    let response = format!(
        "HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\ncontent-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        let mut buf = [0u8; 4096];
        let _ = tokio::time::timeout(Duration::from_millis(200), stream.readable()).await;
        let _ = stream.try_read(&mut buf);
        let mut rest = response.as_bytes();
        while !rest.is_empty() {
            if stream.writable().await.is_err() {
                return;
            }
            match stream.try_write(rest) {
                Ok(n) => rest = &rest[n..],
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(_) => return,
            }
        }
    })
    .await;
}

/// A connection, counted while open.
pub struct CountedStream {
    inner: TcpStream,
    open: Arc<AtomicUsize>,
}

impl Drop for CountedStream {
    fn drop(&mut self) {
        self.open.fetch_sub(1, Ordering::SeqCst);
    }
}

impl AsyncRead for CountedStream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

/// `AsyncWrite` for a stream wrapper that only watches reads: every write call goes to its
/// `inner` stream unchanged.
macro_rules! forward_async_write {
    ($wrapper:ty) => {
        impl AsyncWrite for $wrapper {
            fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
                Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
            }

            fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                Pin::new(&mut self.get_mut().inner).poll_flush(cx)
            }

            fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
            }

            fn poll_write_vectored(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                bufs: &[io::IoSlice<'_>],
            ) -> Poll<io::Result<usize>> {
                Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
            }

            fn is_write_vectored(&self) -> bool {
                self.inner.is_write_vectored()
            }
        }
    };
}
pub(super) use forward_async_write;

forward_async_write!(CountedStream);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompt_bound_refuses_only_what_cannot_fit() {
        let b = PromptBound { context: Some(100), max_token_bytes: 20 };
        assert!(b.check(2000).is_ok());
        assert!(b.check(2020).is_err());
        assert!(PromptBound { context: None, max_token_bytes: 20 }.check(usize::MAX).is_ok());
    }
}
