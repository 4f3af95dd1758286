//! [`Machine`]: the one contract every connection object of this crate
//! implements, so that each shell drives all of them with one generic loop.
//!
//! Implemented by [`HttpExchange`](crate::http1::HttpExchange),
//! [`WsClient`](crate::ws::WsClient) and
//! [`TerminalSession`](crate::terminal::TerminalSession).
//!
//! * **Inputs** (things that happened outside): [`Machine::handle_input`]
//!   (bytes read), [`Machine::handle_eof`] (the peer closed its side),
//!   [`Machine::handle_written`] (the socket took bytes),
//!   [`Machine::handle_transport_error`] (the socket failed),
//!   [`Machine::handle_timeout`] (the deadline of `poll_timeout` passed; an
//!   early or repeated call is a no-op).
//! * **Outputs**, drained after every input: [`Machine::poll_transmit`]
//!   (bytes to write), [`Machine::poll_event`] (until `None`),
//!   [`Machine::poll_timeout`] (when to call `handle_timeout`).
//! * **State**: [`Machine::is_finished`] (stop driving; close or pool the
//!   socket) and [`Machine::wants_read`] (read pacing; false while the
//!   object wants no more bytes for now).
//!
//! A failure is an event (the last one), never a nested `Result`: after it
//! `is_finished` is true. Every error an object reports says whether the
//! request may have reached the peer (its [`Evidence`](crate::Evidence)),
//! which the object decides from what it handed out and what
//! `handle_written` says the socket took.

use crate::Reason;
use core::fmt;
use std::time::Instant;

/// Which side of the socket failed (fed with
/// [`Machine::handle_transport_error`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TransportFailure {
    /// Reading (or TLS record processing) failed: reason `read_failed`.
    Read,
    /// Writing (or flushing TLS records) failed: reason `write_failed`.
    Write,
}

impl TransportFailure {
    /// The fixed reason code of the error the object builds from it.
    pub const fn reason(self) -> Reason {
        match self {
            Self::Read => Reason::ReadFailed,
            Self::Write => Reason::WriteFailed,
        }
    }
}

/// A sans-IO connection object as a shell drives it (see the
/// [module docs](self) and the drive loop in the [crate docs](crate)).
pub trait Machine {
    /// What [`poll_event`](Self::poll_event) yields; may borrow the object
    /// until the next call.
    type Event<'a>
    where
        Self: 'a;
    /// The name of the timer [`poll_timeout`](Self::poll_timeout) reports.
    type Timer: Copy + fmt::Debug;

    /// Bytes read from the socket. Everything they complete is decoded
    /// here; what it means comes out of `poll_event`.
    fn handle_input(&mut self, now: Instant, bytes: &[u8]);

    /// The peer closed its sending side. Afterwards the object ends in an
    /// event (a success or a failure); no shell invents one.
    fn handle_eof(&mut self, now: Instant);

    /// The deadline reported by `poll_timeout` may have passed. Early or
    /// repeated calls do nothing.
    fn handle_timeout(&mut self, now: Instant);

    /// The socket took `n` more of the bytes `poll_transmit` handed out.
    fn handle_written(&mut self, now: Instant, n: usize);

    /// The socket failed; the object decides what that means for its
    /// outcome (and with which evidence).
    fn handle_transport_error(&mut self, now: Instant, failure: TransportFailure);

    /// Appends bytes to send to `out`; false when there were none.
    #[must_use]
    fn poll_transmit(&mut self, out: &mut Vec<u8>) -> bool;

    /// The next moment `handle_timeout` acts, and which timer that is.
    #[must_use]
    fn poll_timeout(&self) -> Option<(Instant, Self::Timer)>;

    /// The next event, or `None` until more input (or time) arrives. A
    /// failure is the last event.
    #[must_use]
    fn poll_event(&mut self) -> Option<Self::Event<'_>>;

    /// True once the object needs no more I/O: its final event is decided
    /// and nothing is left to send.
    fn is_finished(&self) -> bool;

    /// False while the object wants no bytes read for now (read pacing);
    /// a shell then waits for output, a command or `poll_timeout` only.
    fn wants_read(&self) -> bool {
        !self.is_finished()
    }
}
