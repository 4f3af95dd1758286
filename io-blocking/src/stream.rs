//! [`ExecStream`]: streamed exec (`POST …/exec/stream`) as an [`Iterator`]
//! of events, and its callback form with back-pressure (features C5.3).

use smolbox_core::Reason;
use std::time::Instant;

use smolbox_core::exec::{ExecOutput, ExecStreamCall, ExecStreamDecoder, OutputEncoding};
use smolbox_core::{Error, Evidence, Operation};

use crate::callback::{Delivered, Observer};
use crate::http::{Exchange, Step};

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
    decoder: ExecStreamDecoder,
    state: State,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    Body,
    Finished,
    Failed,
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
                decoder: call.decoder(),
                state: State::Body,
            }),
        })
    }

    /// Stops observing: closes the connection and returns the error value
    /// that describes what is known — the command may still be running
    /// (`transport`, `dispatch_uncertain`, reason `detached`), or nothing if
    /// the stream had already finished.
    pub fn detach(mut self) -> Option<Error> {
        match self.inner.take() {
            Some(inner) if inner.state == State::Body => Some(Error::transport(
                Operation::ExecStream,
                Evidence::DispatchUncertain,
                Reason::Detached,
            )),
            _ => None,
        }
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
            match self.state {
                State::Failed => return None,
                State::Finished => {
                    return match self.decoder.poll_event() {
                        Ok(Some(ev)) => Some(Ok(ExecEvent::from(ev))),
                        Ok(None) => None,
                        Err(e) => self.fail(e),
                    };
                }
                State::Body => {}
            }
            match self.decoder.poll_event() {
                Ok(Some(ev)) => return Some(Ok(ExecEvent::from(ev))),
                Ok(None) => {}
                Err(e) => return self.fail(e),
            }
            let decoder = &mut self.decoder;
            let mut sink = |bytes: &[u8]| decoder.handle_input(bytes);
            match self.exchange.next(&mut sink) {
                Ok(Step::Data | Step::Head(_)) => {}
                Ok(Step::End) => {
                    if let Err(e) = self.decoder.finish() {
                        return self.fail(e);
                    }
                    self.state = State::Finished;
                }
                Err(e) => return self.fail(e),
            }
        }
    }

    fn fail(&mut self, e: Error) -> Option<Result<ExecEvent, Error>> {
        self.state = State::Failed;
        Some(Err(e))
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
