//! Per-connection write control: the transport under hyper, wrapped so a
//! fault can drop the connection after N reply bytes, stall it silently, or
//! replace the reply with raw bytes.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::state::lock;

/// What happens to the bytes hyper writes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) enum WriteMode {
    /// Pass through.
    #[default]
    Normal,
    /// Let this many more bytes out, then fail the connection.
    DropAfter(u64),
    /// Let this many more bytes out, then never complete a write.
    StallAfter(u64),
    /// Write these bytes instead of the reply, then fail the connection.
    Replace(Vec<u8>),
}

/// Shared between the connection's transport and its requests' middleware.
#[derive(Debug, Default)]
pub(crate) struct ConnCtl {
    mode: Mutex<WriteMode>,
}

impl ConnCtl {
    pub(crate) fn set(&self, mode: WriteMode) {
        *lock(&self.mode) = mode;
    }
}

/// The transport wrapper.
pub(crate) struct FaultIo<S> {
    inner: S,
    ctl: Arc<ConnCtl>,
    replace: Option<(Vec<u8>, usize)>,
    dead: bool,
}

impl<S> FaultIo<S> {
    pub(crate) fn new(inner: S, ctl: Arc<ConnCtl>) -> Self {
        Self {
            inner,
            ctl,
            replace: None,
            dead: false,
        }
    }
}

fn broken() -> io::Error {
    io::Error::new(
        io::ErrorKind::BrokenPipe,
        "devworker fault: connection dropped",
    )
}

impl<S: AsyncRead + Unpin> AsyncRead for FaultIo<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for FaultIo<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if this.dead {
            return match Pin::new(&mut this.inner).poll_flush(cx) {
                Poll::Pending => Poll::Pending,
                Poll::Ready(_) => Poll::Ready(Err(broken())),
            };
        }
        let mode = lock(&this.ctl.mode).clone();
        match mode {
            WriteMode::Normal => Pin::new(&mut this.inner).poll_write(cx, buf),
            WriteMode::DropAfter(n) | WriteMode::StallAfter(n) if n == 0 => {
                if matches!(mode, WriteMode::DropAfter(_)) {
                    this.dead = true;
                    match Pin::new(&mut this.inner).poll_flush(cx) {
                        Poll::Pending => Poll::Pending,
                        Poll::Ready(_) => Poll::Ready(Err(broken())),
                    }
                } else {
                    // Silent stall: never ready, no wake-up registered.
                    let _ = Pin::new(&mut this.inner).poll_flush(cx);
                    Poll::Pending
                }
            }
            WriteMode::DropAfter(n) | WriteMode::StallAfter(n) => {
                let k = usize::try_from(n).unwrap_or(usize::MAX).min(buf.len());
                match Pin::new(&mut this.inner).poll_write(cx, &buf[..k]) {
                    Poll::Ready(Ok(w)) => {
                        let left = n - w as u64;
                        let next = match mode {
                            WriteMode::DropAfter(_) => WriteMode::DropAfter(left),
                            _ => WriteMode::StallAfter(left),
                        };
                        this.ctl.set(next);
                        Poll::Ready(Ok(w))
                    }
                    other => other,
                }
            }
            WriteMode::Replace(bytes) => {
                if this.replace.is_none() {
                    this.replace = Some((bytes, 0));
                }
                while let Some((data, at)) = this.replace.as_mut() {
                    if *at >= data.len() {
                        this.dead = true;
                        break;
                    }
                    match Pin::new(&mut this.inner).poll_write(cx, &data[*at..]) {
                        Poll::Ready(Ok(0)) => return Poll::Ready(Err(broken())),
                        Poll::Ready(Ok(w)) => *at += w,
                        Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                        Poll::Pending => return Poll::Pending,
                    }
                }
                match Pin::new(&mut this.inner).poll_flush(cx) {
                    Poll::Pending => Poll::Pending,
                    Poll::Ready(_) => Poll::Ready(Err(broken())),
                }
            }
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Which listener a request came in on: the TCP listener's bound address,
/// or `None` for the Unix socket.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Listener(pub(crate) Option<SocketAddr>);
