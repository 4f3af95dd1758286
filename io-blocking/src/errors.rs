//! Transport failures as core [`Error`] values.
//!
//! The shell knows only transport facts: whether the connection could be
//! made, and whether any request byte was handed to the socket. Evidence is
//! `not_dispatched` only when not one byte could have left (AC-0.2.1).

use std::io;

use smolbox_core::{Category, Error, Evidence, Operation};

use crate::conn::ConnectError;

/// A connect (or TLS handshake) failure: nothing of the request was sent.
pub(crate) fn connect(operation: Operation, e: &ConnectError) -> Error {
    let reason = match e {
        ConnectError::Timeout => "connect_timeout",
        ConnectError::Resolve => "resolve_failed",
        ConnectError::Refused => "connect_failed",
        ConnectError::Tls => "tls_handshake_failed",
    };
    Error::new(Category::Transport, operation, Evidence::NotDispatched).with_reason(reason)
}

/// No pooled connection became free within the checkout budget.
pub(crate) fn checkout_timeout(operation: Operation) -> Error {
    Error::new(Category::Transport, operation, Evidence::NotDispatched)
        .with_reason("pool_checkout_timeout")
}

/// A socket error during an exchange; `sent` is how many request bytes had
/// been handed to the transport.
pub(crate) fn io(operation: Operation, e: &io::Error, sent: u64) -> Error {
    let evidence = if sent == 0 {
        Evidence::NotDispatched
    } else {
        Evidence::DispatchUncertain
    };
    let reason = match e.kind() {
        io::ErrorKind::ConnectionReset => "connection_reset",
        io::ErrorKind::BrokenPipe => "broken_pipe",
        io::ErrorKind::UnexpectedEof => "unexpected_eof",
        io::ErrorKind::InvalidData => "tls_failed",
        _ => "io_error",
    };
    Error::new(Category::Transport, operation, evidence).with_reason(reason)
}
