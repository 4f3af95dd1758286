//! [`ExecStream`]: streamed exec (`POST …/exec/stream`) as a `Stream` of
//! events, and its callback form with back-pressure (features C5.3).

use smolbox_core::Reason;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use futures_core::Stream;
use smolbox_core::exec::{ExecOutput, ExecStreamCall, ExecStreamReader, OutputEncoding};
use smolbox_core::{Error, Evidence, Operation};

use crate::http::Exchange;

pub use smolbox_core::exec::ExecEvent;

/// A streamed exec in progress: a [`Stream`] of [`ExecEvent`]s (or call
/// [`ExecStream::next`]). The stream ends after [`ExecEvent::Exit`] once the
/// body ended cleanly, or after the first error.
///
/// Reading is driven by the consumer: a slow consumer slows the reads (the
/// worker is back-pressured, nothing is buffered beyond one read).
/// Dropping the stream (or calling [`ExecStream::detach`]) closes the
/// connection and ends *observation* only; the command may still be
/// running in the guest, and `detach` says so with evidence
/// `dispatch_uncertain`.
pub struct ExecStream {
    inner: Option<Inner>,
    pending: Option<PendingNext>,
}

/// An in-flight `next` of the `Stream` impl; it gives the state back.
type PendingNext = Pin<Box<dyn Future<Output = (Inner, Option<Result<ExecEvent, Error>>)> + Send>>;

struct Inner {
    exchange: Exchange,
    reader: ExecStreamReader,
}

impl std::fmt::Debug for ExecStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecStream").finish_non_exhaustive()
    }
}

impl ExecStream {
    /// Reads the head of a started exchange and has the core's call judge
    /// it (status mapping, media type), then streams the body.
    pub(crate) async fn open_call(
        mut exchange: Exchange,
        call: &ExecStreamCall,
    ) -> Result<Self, Error> {
        let head = exchange.head().await?;
        if !call.check_head(&head)? {
            let mut body = Vec::new();
            exchange.read_body(&mut body).await?;
            return Err(call.decode_error(&head, &body));
        }
        Ok(Self {
            inner: Some(Inner {
                exchange,
                reader: ExecStreamReader::new(call.decoder()),
            }),
            pending: None,
        })
    }

    /// The next event; `None` after the exit of a clean stream or after an
    /// error was returned.
    pub async fn next(&mut self) -> Option<Result<ExecEvent, Error>> {
        if let Some(fut) = self.pending.take() {
            let (inner, item) = fut.await;
            self.inner = Some(inner);
            return item;
        }
        self.inner.as_mut()?.next().await
    }

    /// Stops observing: closes the connection and returns the error value
    /// that describes what is known — the command may still be running
    /// (`transport`, `dispatch_uncertain`, reason `detached`), or nothing if
    /// the stream had already finished.
    pub fn detach(mut self) -> Option<Error> {
        self.pending = None;
        self.inner.take()?.reader.detach()
    }
}

impl Stream for ExecStream {
    type Item = Result<ExecEvent, Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if this.pending.is_none() {
            let Some(mut inner) = this.inner.take() else {
                return Poll::Ready(None);
            };
            this.pending = Some(Box::pin(async move {
                let item = inner.next().await;
                (inner, item)
            }));
        }
        let Some(fut) = this.pending.as_mut() else {
            return Poll::Ready(None);
        };
        match fut.as_mut().poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready((inner, item)) => {
                this.pending = None;
                this.inner = Some(inner);
                Poll::Ready(item)
            }
        }
    }
}

impl Inner {
    async fn next(&mut self) -> Option<Result<ExecEvent, Error>> {
        loop {
            if let Poll::Ready(item) = self.reader.poll_next() {
                return item;
            }
            let reader = &mut self.reader;
            let mut sink = |bytes: &[u8]| reader.handle_input(bytes);
            let step = self.exchange.next(&mut sink).await;
            self.reader.handle_step(step);
        }
    }
}

/// Drives `stream` to its end, capturing output into an [`ExecOutput`]
/// (tagged lossy UTF-8) and handing each event to `callback` on a helper
/// thread, one at a time, waiting for it to return before reading on
/// (back-pressure). A callback that panics is detached and capture
/// continues; one that blocks is abandoned at `deadline` and the call fails
/// with `transport`/`dispatch_uncertain` (reason `callback_deadline`).
pub(crate) async fn run_with_callback<F>(
    mut stream: ExecStream,
    callback: F,
    permit: CallbackPermit,
    deadline: Instant,
) -> Result<ExecOutput, Error>
where
    F: FnMut(&ExecEvent) + Send + 'static,
{
    let mut out = ExecOutput::empty(OutputEncoding::LossyUtf8);
    let mut observer = Some(Observer::spawn(callback, permit));
    while let Some(item) = stream.next().await {
        let event = item?;
        out.record(&event);
        if let Some(obs) = observer.as_mut() {
            match obs.deliver(event, deadline).await {
                Delivered::Ok => {}
                Delivered::Panicked => observer = None,
                Delivered::Deadline => {
                    drop(stream);
                    return Err(Error::transport(
                        Operation::ExecStream,
                        Evidence::DispatchUncertain,
                        Reason::CallbackDeadline,
                    ));
                }
            }
        }
    }
    Ok(out)
}

enum Delivered {
    Ok,
    Panicked,
    Deadline,
}

/// The helper thread that runs a synchronous callback. Each event is
/// acknowledged before the next is sent, so at most one is in flight. The
/// thread ends when the sender drops (or right after a panic).
struct Observer {
    events: tokio::sync::mpsc::Sender<(ExecEvent, tokio::sync::oneshot::Sender<bool>)>,
}

/// Most callback threads per client (busy and abandoned), as in the
/// blocking shell.
pub const MAX_DELIVERY_THREADS: usize = 8;

/// The callback threads of one client: a count, held by a permit for as
/// long as its thread lives (an abandoned thread keeps it until its
/// callback returns).
#[derive(Debug, Default)]
pub(crate) struct CallbackThreads {
    pub(crate) alive: std::sync::atomic::AtomicUsize,
}

/// One thread's share of [`CallbackThreads`]; released on drop.
pub(crate) struct CallbackPermit(Arc<CallbackThreads>);

impl CallbackThreads {
    /// A permit for one more thread, or `admission_exhausted` (nothing
    /// sent) when [`MAX_DELIVERY_THREADS`] exist.
    pub(crate) fn take(threads: &Arc<Self>) -> Result<CallbackPermit, Error> {
        use std::sync::atomic::Ordering;
        if threads.alive.fetch_add(1, Ordering::SeqCst) >= MAX_DELIVERY_THREADS {
            threads.alive.fetch_sub(1, Ordering::SeqCst);
            return Err(Error::admission_exhausted(
                Operation::ExecStream,
                Reason::CallbackThreadsExhausted,
            ));
        }
        Ok(CallbackPermit(Arc::clone(threads)))
    }
}

impl Drop for CallbackPermit {
    fn drop(&mut self) {
        self.0
            .alive
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Observer {
    fn spawn<F>(mut callback: F, permit: CallbackPermit) -> Self
    where
        F: FnMut(&ExecEvent) + Send + 'static,
    {
        let (tx, mut rx) =
            tokio::sync::mpsc::channel::<(ExecEvent, tokio::sync::oneshot::Sender<bool>)>(1);
        // If the thread cannot be spawned, `rx` drops and the first delivery
        // reports the callback as gone (capture continues without it).
        let _ = std::thread::Builder::new()
            .name("smolbox-exec-callback".into())
            .spawn(move || {
                let _permit = permit;
                while let Some((event, ack)) = rx.blocking_recv() {
                    let ok =
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| callback(&event)))
                            .is_ok();
                    let _ = ack.send(ok);
                    if !ok {
                        return;
                    }
                }
            });
        Self { events: tx }
    }

    async fn deliver(&mut self, event: ExecEvent, deadline: Instant) -> Delivered {
        let (ack_tx, ack_rx) = tokio::sync::oneshot::channel();
        let wait = async {
            if self.events.send((event, ack_tx)).await.is_err() {
                return false;
            }
            ack_rx.await.unwrap_or(false)
        };
        match tokio::time::timeout_at(deadline.into(), wait).await {
            Ok(true) => Delivered::Ok,
            Ok(false) => Delivered::Panicked,
            Err(_) => Delivered::Deadline,
        }
    }
}
