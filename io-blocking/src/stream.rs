//! [`ExecStream`]: streamed exec (`POST …/exec/stream`) as an [`Iterator`]
//! of events, and its callback form with back-pressure (features C5.3).

use smolbox_core::Reason;
use std::task::Poll;
use std::time::Instant;

use smolbox_core::exec::{ExecOutput, ExecStreamCall, ExecStreamReader, OutputEncoding};
use smolbox_core::{Error, Evidence, Operation};

use crate::callback::{Delivered, Observer};
use crate::http::Exchange;

pub use smolbox_core::exec::ExecEvent;

/// A streamed exec in progress: an [`Iterator`] of [`ExecEvent`]s. It ends
/// after [`ExecEvent::Exit`] once the body ended cleanly, or after the first
/// error.
///
/// Reading is driven by the consumer, on the consumer's thread: each
/// `next` turns the loop only until the next event is decoded, so a slow
/// consumer slows the reads (the worker is back-pressured; nothing is
/// buffered beyond one turn of reads). Dropping the stream (or calling
/// [`ExecStream::detach`]) closes the connection and ends *observation*
/// only; the command may still be running in the guest, and `detach` says
/// so with evidence `dispatch_uncertain`.
pub struct ExecStream {
    inner: Option<Inner>,
}

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
    pub(crate) fn open_call(mut exchange: Exchange, call: &ExecStreamCall) -> Result<Self, Error> {
        let head = exchange.head()?;
        if !call.check_head(&head)? {
            let mut body = Vec::new();
            exchange.read_body(&mut body)?;
            return Err(call.decode_error(&head, &body));
        }
        Ok(Self {
            inner: Some(Inner {
                exchange,
                reader: ExecStreamReader::new(call.decoder()),
            }),
        })
    }

    /// Stops observing: closes the connection and returns the error value
    /// that describes what is known — the command may still be running
    /// (`transport`, `dispatch_uncertain`, reason `detached`), or nothing if
    /// the stream had already finished.
    pub fn detach(mut self) -> Option<Error> {
        self.inner.take()?.reader.detach()
    }
}

impl Iterator for ExecStream {
    type Item = Result<ExecEvent, Error>;

    /// The next event; `None` after the exit of a clean stream or after an
    /// error was returned.
    fn next(&mut self) -> Option<Self::Item> {
        self.inner.as_mut()?.next()
    }
}

impl Inner {
    fn next(&mut self) -> Option<Result<ExecEvent, Error>> {
        loop {
            if let Poll::Ready(item) = self.reader.poll_next() {
                return item;
            }
            let reader = &mut self.reader;
            let mut sink = |bytes: &[u8]| reader.handle_input(bytes);
            let step = self.exchange.next(&mut sink);
            self.reader.handle_step(step);
        }
    }
}

/// Drives `stream` to its end on the caller's thread, capturing output into
/// an [`ExecOutput`] (tagged lossy UTF-8) and handing each event to the
/// observer's callback on its delivery thread, one at a time, waiting for it
/// to return before reading on (back-pressure). A callback that panics is
/// detached and capture continues; one that blocks is abandoned at
/// `deadline` and the call fails with `transport`/`dispatch_uncertain`
/// (reason `callback_deadline`).
pub(crate) fn run_with_callback(
    stream: ExecStream,
    observer: Observer,
    deadline: Instant,
) -> Result<ExecOutput, Error> {
    let mut out = ExecOutput::empty(OutputEncoding::LossyUtf8);
    let mut observer = Some(observer);
    for item in stream {
        let event = item?;
        out.record(&event);
        if let Some(obs) = observer.as_mut() {
            match obs.deliver(event, deadline) {
                Delivered::Ok => {}
                Delivered::Panicked => observer = None,
                Delivered::Deadline => {
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
