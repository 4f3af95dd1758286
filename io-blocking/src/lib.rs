//! smolbox-blocking: the blocking shell on mio, with the same API as
//! `smolbox-tokio` minus `async`. No tokio anywhere in its dependency tree.
//!
//! Every call runs on the caller's thread: it checks a connection out of the
//! endpoint's pool (or connects, within the connect budget), then turns the
//! loop of [`conn`](crate) — flush the core's transmits until `WouldBlock`,
//! deliver events, wait in `mio::Poll::poll` until the socket is ready or the
//! core's `poll_timeout`, read until `WouldBlock`, feed `Instant::now()` —
//! until the core reports the outcome. There is no background runtime and no
//! thread per operation.

// The loop, pool and transports are used by the operations that are wired
// to the core as its modules land; until then only the tests reach them.
#![allow(dead_code)]

mod callback;
mod client;
mod conn;
mod errors;
mod http;
mod pool;
mod stream;
mod terminal;
mod tls;
pub mod transport;

pub use callback::MAX_DELIVERY_THREADS;
pub use client::Client;
pub use pool::MAX_CONNECTIONS;
pub use stream::{ExecEvent, ExecStream};
pub use terminal::{MAX_WRITE_WAIT, Terminal, TerminalEvent};
pub use tls::TlsFiles;
pub use transport::Target;

#[cfg(test)]
mod tests;
