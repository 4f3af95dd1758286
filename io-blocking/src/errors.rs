//! Transport failures as core [`Error`] values (the same reasons as the
//! tokio shell).
//!
//! Only the connect and checkout failures are built here (nothing was sent:
//! `not_dispatched`); a failure on an established connection is fed to the
//! core object, which decides its error and evidence.

use smolbox_core::Reason;

use smolbox_core::{Error, Evidence, Operation};

/// Why a connection could not be established.
#[derive(Debug)]
pub(crate) enum ConnectError {
    /// The budget ran out.
    Timeout,
    /// The name did not resolve.
    Resolve,
    /// The socket could not connect.
    Refused,
    /// The TLS handshake failed (verification, protocol, or the peer closed).
    Tls,
    /// Plain HTTP, and the name resolved to no loopback address.
    NotLoopback,
    /// The Unix socket's owner or modes are unsafe (core's verdict).
    Unsafe(Error),
}

/// A connect (or TLS handshake) failure: nothing of the request was sent.
pub(crate) fn connect(operation: Operation, e: &ConnectError) -> Error {
    let reason = match e {
        ConnectError::Unsafe(e) => return e.with_operation(operation),
        ConnectError::Timeout => Reason::ConnectTimeout,
        ConnectError::Resolve | ConnectError::Refused => Reason::ConnectFailed,
        ConnectError::Tls => Reason::TlsHandshake,
        ConnectError::NotLoopback => Reason::ResolvedNotLoopback,
    };
    Error::transport(operation, Evidence::NotDispatched, reason)
}
