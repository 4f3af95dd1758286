//! [`ExecStreamReader`]: a streamed exec's body as both shells read it.
//!
//! The shells pull one event at a time; between two events they turn the
//! connection once ([`crate::http1::HttpExchange::pull`]) and hand the
//! result here. The order (an exchange failure before any event it
//! carried, events decoded before the end, then the end or the decoder's
//! verdict at the end of the body) is decided here, once.

use core::task::Poll;

use super::stream::{ExecEvent, ExecStreamDecoder};
use crate::Reason;
use crate::error::{Error, Evidence, Operation};
use crate::http1::Pulled;

/// Where the read stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Read {
    /// Reading the body.
    Body,
    /// The body ended cleanly: only decoded events are left.
    Ended,
    /// Failed with this error, not reported yet.
    Failing(Error),
    /// The failure was reported: nothing more comes.
    Failed,
}

/// The decoder of a streamed exec plus where its read stands.
#[derive(Debug)]
pub struct ExecStreamReader {
    decoder: ExecStreamDecoder,
    read: Read,
}

impl ExecStreamReader {
    /// A reader of a body with `decoder` (from
    /// [`super::ExecStreamCall::decoder`]).
    pub fn new(decoder: ExecStreamDecoder) -> Self {
        Self {
            decoder,
            read: Read::Body,
        }
    }

    /// The next item: `Ready(Some(event))`, `Ready(Some(Err(e)))` once (the
    /// last item), `Ready(None)` after the exit of a clean stream or after
    /// the failure, or `Pending` when a step of the body is needed
    /// ([`Self::handle_input`] for its bytes, then [`Self::handle_step`]).
    pub fn poll_next(&mut self) -> Poll<Option<Result<ExecEvent, Error>>> {
        match self.read {
            Read::Failed => return Poll::Ready(None),
            Read::Failing(e) => return Poll::Ready(Some(Err(self.fail(e)))),
            Read::Body | Read::Ended => {}
        }
        match self.decoder.poll_event() {
            Ok(Some(event)) => Poll::Ready(Some(Ok(ExecEvent::from(event)))),
            Ok(None) if self.read == Read::Ended => Poll::Ready(None),
            Ok(None) => Poll::Pending,
            Err(e) => Poll::Ready(Some(Err(self.fail(e)))),
        }
    }

    /// Body bytes (the sink of the exchange's step).
    ///
    /// # Errors
    /// The decoder's (limits, protocol); the step then fails with it.
    pub fn handle_input(&mut self, bytes: &[u8]) -> Result<(), Error> {
        self.decoder.handle_input(bytes)
    }

    /// The result of one step of the exchange: the end of the body has the
    /// decoder judge it (exactly one exit, no partial frame); a failure is
    /// the next item.
    pub fn handle_step(&mut self, step: Result<Pulled, Error>) {
        match step {
            Ok(Pulled::End) => match self.decoder.finish() {
                Ok(_) => self.read = Read::Ended,
                Err(e) => self.read = Read::Failing(e),
            },
            Ok(Pulled::Data | Pulled::Head(_)) => {}
            Err(e) => self.read = Read::Failing(e),
        }
    }

    /// What stopping observation now means: `transport` /
    /// `dispatch_uncertain` (reason `detached`: the command may still be
    /// running) while the body is being read, or nothing once it ended or
    /// failed.
    pub fn detach(&self) -> Option<Error> {
        (self.read == Read::Body).then(|| {
            Error::transport(
                Operation::ExecStream,
                Evidence::DispatchUncertain,
                Reason::Detached,
            )
        })
    }

    fn fail(&mut self, e: Error) -> Error {
        self.read = Read::Failed;
        e
    }
}

#[cfg(test)]
mod tests {
    use core::task::Poll;

    use super::ExecStreamReader;
    use crate::exec::{ExecEvent, ExecStreamDecoder, OutputAllowance};
    use crate::http1::Pulled;
    use crate::{Error, Evidence, Operation, Reason};

    fn reader() -> ExecStreamReader {
        ExecStreamReader::new(ExecStreamDecoder::new(OutputAllowance::DEFAULT))
    }

    const BODY: &[u8] =
        b"event: stdout\ndata: hi\ndata: \n\nevent: exit\ndata: {\"exitCode\":3}\n\n";

    #[test]
    fn events_then_the_exit_then_none_after_a_clean_end() {
        let mut r = reader();
        assert!(r.poll_next().is_pending());
        assert!(r.handle_input(BODY).is_ok());
        r.handle_step(Ok(Pulled::Data));
        assert!(
            matches!(r.poll_next(), Poll::Ready(Some(Ok(ExecEvent::Stdout(s)))) if s == "hi\n")
        );
        assert!(matches!(
            r.poll_next(),
            Poll::Ready(Some(Ok(ExecEvent::Exit(3))))
        ));
        assert!(
            r.poll_next().is_pending(),
            "the end of the body is not known yet"
        );
        assert!(r.detach().is_some());
        r.handle_step(Ok(Pulled::End));
        assert!(matches!(r.poll_next(), Poll::Ready(None)));
        assert!(r.detach().is_none());
    }

    #[test]
    fn an_end_without_exit_is_the_last_item_then_none() {
        let mut r = reader();
        assert!(r.handle_input(b"event: stdout\ndata: x\n\n").is_ok());
        r.handle_step(Ok(Pulled::Data));
        assert!(matches!(
            r.poll_next(),
            Poll::Ready(Some(Ok(ExecEvent::Stdout(_))))
        ));
        assert!(r.poll_next().is_pending());
        r.handle_step(Ok(Pulled::End));
        let Poll::Ready(Some(Err(e))) = r.poll_next() else {
            panic!("an end without exit was accepted");
        };
        assert_eq!(e.reason(), Reason::EofWithoutExit);
        assert!(matches!(r.poll_next(), Poll::Ready(None)));
        assert!(r.detach().is_none());
    }

    #[test]
    fn an_exchange_failure_comes_before_the_events_of_its_step() {
        let mut r = reader();
        assert!(r.handle_input(BODY).is_ok());
        let lost = Error::transport(
            Operation::ExecStream,
            Evidence::DispatchUncertain,
            Reason::Truncated,
        );
        r.handle_step(Err(lost));
        assert!(matches!(r.poll_next(), Poll::Ready(Some(Err(e))) if e == lost));
        assert!(matches!(r.poll_next(), Poll::Ready(None)));
    }
}
