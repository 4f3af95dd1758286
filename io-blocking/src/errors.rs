//! Transport failures as core [`Error`] values (the same reasons as the
//! tokio shell).
//!
//! The shell knows only transport facts: whether the connection could be
//! made, and whether any request byte was handed to the socket. Evidence is
//! `not_dispatched` only when not one byte could have left (AC-0.2.1).

use std::time::Instant;

use smolbox_core::{Category, Error, Evidence, Operation};

use crate::conn::{ConnectError, Failure};

/// A connect (or TLS handshake) failure: nothing of the request was sent.
pub(crate) fn connect(operation: Operation, e: &ConnectError) -> Error {
    let reason = match e {
        ConnectError::Timeout => "connect_timeout",
        ConnectError::Resolve | ConnectError::Refused => "connect_failed",
        ConnectError::Tls => "tls_handshake",
    };
    not_dispatched(operation, reason)
}

/// No pooled connection became free within the checkout budget.
pub(crate) fn checkout_timeout(operation: Operation) -> Error {
    not_dispatched(operation, "pool_checkout_timeout")
}

/// A transport error for an operation that has not sent anything.
pub(crate) fn not_dispatched(operation: Operation, reason: &'static str) -> Error {
    Error::new(Category::Transport, operation, Evidence::NotDispatched).with_reason(reason)
}

/// A failed turn; `sent` is how many bytes had been handed to the socket.
pub(crate) fn failure(operation: Operation, failure: Failure, sent: u64) -> Error {
    let evidence = if sent == 0 {
        Evidence::NotDispatched
    } else {
        Evidence::DispatchUncertain
    };
    Error::new(Category::Transport, operation, evidence).with_reason(failure.reason())
}

/// When checkout or connect failed because the *operation* deadline (not
/// their own budget) ran out, say so.
pub(crate) fn with_deadline_reason(e: Error, operation_deadline: Instant) -> Error {
    if e.category() == Category::Transport
        && e.evidence() == Evidence::NotDispatched
        && Instant::now() >= operation_deadline
    {
        e.with_reason("deadline")
    } else {
        e
    }
}
