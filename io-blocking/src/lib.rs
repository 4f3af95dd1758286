//! smolbox-blocking: the blocking shell on mio, with the same API as
//! `smolbox-tokio` minus `async`. No tokio anywhere in its dependency tree.
//!
//! Every call runs on the caller's thread: it checks a connection out of the
//! endpoint's pool (or connects, within the connect budget), then turns the
//! loop (STYLE.md §2) — flush the core's transmits until `WouldBlock`
//! (parking the rest), deliver events, wait in `mio::Poll::poll` until the
//! socket is ready or the core's `poll_timeout`, read until `WouldBlock`,
//! feed `Instant::now()` — until the core reports the outcome. There is no
//! background runtime and no thread per operation; the only threads this
//! crate starts are the bounded, reused delivery threads of
//! [`Client::exec_with`] (see [`MAX_DELIVERY_THREADS`]).
//!
//! ```no_run
//! use smolbox_blocking::Client;
//! use smolbox_core::exec::{Command, ExecOutcome};
//! use smolbox_core::worker::{Endpoint, EndpointConfig};
//!
//! # fn main() -> Result<(), smolbox_core::Error> {
//! let endpoint = Endpoint::new(EndpointConfig {
//!     id: "local".into(),
//!     base_url: "http://127.0.0.1:19470".into(),
//!     allow_insecure_loopback: true,
//!     ..EndpointConfig::default()
//! })?;
//! let client = Client::new(endpoint)?;
//! let health = client.health()?;
//! println!("worker {}", health.version);
//! if let ExecOutcome::Exited(out) = client.exec("dev", &Command::new(["echo", "hi"]))? {
//!     assert_eq!(out.stdout, b"hi\n");
//! }
//! for event in client.exec_stream("dev", &Command::new(["ls"]))? {
//!     println!("{:?}", event?);
//! }
//! # Ok(())
//! # }
//! ```

mod callback;
mod client;
mod conn;
mod errors;
mod http;
pub mod managed_terminal;
mod pool;
pub mod runtime;
mod stream;
mod terminal;
pub mod transport;

pub use callback::MAX_DELIVERY_THREADS;
pub use client::Client;
pub use conn::Connection;
pub use managed_terminal::{ManagedTerminal, ManagedTerminals, TerminalOpened};
pub use pool::MAX_CONNECTIONS;
pub use runtime::Runtime;
pub use smolbox_core::terminal::{MAX_WRITE_WAIT, TerminalEvent};
pub use stream::{ExecEvent, ExecStream};
pub use terminal::Terminal;
pub use transport::{SocketTarget, TlsFiles};

#[cfg(test)]
mod tests;
