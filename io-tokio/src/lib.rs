//! smolbox-tokio: the async shell. It owns sockets, TLS, timers and
//! `Instant::now()`, feeds bytes and time to `smolbox-core`, and makes no
//! protocol decision of its own.
//!
//! # Public surface (mirrored name for name by `smolbox-blocking`, minus `async`)
//!
//! ```text
//! Client::new(endpoint: core::worker::Endpoint) -> Result<Client, Error>   // no network I/O
//! Client::endpoint(&self) -> &Endpoint
//! Client::call<C: core::worker::WorkerCall>(&self, call: &C) -> Result<C::Output, Error>
//! Client::{health, readyz, capacity, metrics, create, list, get, start, stop, delete,
//!          exec, launch, upload, download, logs, volume_create, volume_delete}(…)
//!                                            // one thin method per core::worker operation
//! Client::exec_stream(&self, machine, &Command) -> Result<ExecStream, Error>
//! Client::exec_with(&self, machine, &Command, callback: FnMut(&ExecEvent) + Send + 'static)
//!                                            -> Result<StreamedResult, Error>
//! ExecStream: futures_core::Stream<Item = Result<ExecEvent, Error>>; ExecStream::next(&mut self).await;
//!             ExecStream::detach(self) -> Error  // observation ends; says dispatch_uncertain
//! Client::terminal(&self, machine, &TerminalSpec) -> Result<Terminal, Error>  // after the 101
//! Terminal::{input(&[u8]), resize(cols, rows), next(timeout) -> Result<TerminalEvent, Error>, close()}
//! TerminalEvent::{Output(Bytes), Closed(outcome)}
//! transport::{Target, Connection, TlsFiles}, MAX_CONNECTIONS
//! ```

mod client;
mod drive;
mod http;
mod pool;
mod stream;
mod terminal;
#[cfg(test)]
mod tests;
pub mod transport;

pub use client::Client;
pub use pool::MAX_CONNECTIONS;
pub use stream::{ExecEvent, ExecStream};
pub use terminal::{Terminal, TerminalEvent};
pub use transport::{Connection, Target, TlsFiles};
