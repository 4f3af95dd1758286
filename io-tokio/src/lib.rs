//! smolbox-tokio: the async shell. It owns sockets, TLS, timers and
//! `Instant::now()`, feeds bytes and time to `smolbox-core`, and makes no
//! protocol decision of its own.
//!
//! # Public surface (mirrored name for name by `smolbox-blocking`, minus `async`)
//!
//! ```text
//! Client::new(endpoint: core::worker::Endpoint) -> Result<Client, Error>   // reads TLS files; no network I/O
//! Client::endpoint(&self) -> &Endpoint
//! Client::call<C: core::worker::WorkerCall>(&self, &C) -> Result<C::Output, Error>   // any operation
//! Client::health() -> HealthReply            Client::admit(&[Profile]) -> Profile (health + Profile::admit)
//! Client::readyz() -> ()                     Client::capacity() -> CapacityReply     Client::metrics() -> String
//! Client::create(&Profile, MachineName, &MachineSpec) -> Observation
//! Client::list(&Profile) -> Vec<Observation> Client::get / measure / start / stop (&Profile, MachineName)
//! Client::delete(MachineName) -> ()
//! Client::exec(machine, &Command) -> ExecOutcome          Client::exec_with_allowance(…, OutputAllowance)
//! Client::launch(machine, &Command) -> Launched
//! Client::exec_stream(machine, &Command) -> ExecStream    Client::exec_stream_with_allowance(…, OutputAllowance)
//! Client::exec_with(machine, &Command, FnMut(&ExecEvent) + Send + 'static) -> ExecOutput
//! Client::upload(&Upload) -> UploadReply     Client::download(&Download) -> Bytes
//! Client::logs(&Logs) -> Vec<String>         Client::volume_create(&VolumeCreate) / volume_delete(&VolumeDelete)
//! Client::terminal(machine, &TerminalSpec) -> Terminal   // returns once the 101 was read
//! ExecStream: futures_core::Stream<Item = Result<ExecEvent, Error>>; ExecStream::next(&mut self);
//!             ExecStream::detach(self) -> Option<Error>  // transport/dispatch_uncertain "detached"
//! ExecEvent::{Stdout(String), Stderr(String), Exit(i32)}
//! Terminal::input(&mut self, &[u8]), resize(cols, rows), next(Duration) -> TerminalEvent, close(self) -> Result<TerminalExit, Error>
//! TerminalEvent::{Output(Bytes), Closed(Result<TerminalExit, Error>)}
//! Runtime::terminals() -> &ManagedTerminals   // managed terminals on retained machines (C7.4)
//! ManagedTerminals::open(key, machine, ManagedTerminalSpec) -> TerminalOpened   // durable acceptance
//! ManagedTerminals::attach(key, wait) -> ManagedTerminal   // one consumer; others: authentication
//! ManagedTerminals::fetch / cancel / recover / wait(key, …) -> ExecutionRecord
//! ManagedTerminal::input(&[u8]), resize(cols, rows), next(Duration) -> TerminalEvent, unread_bytes(), close(self)
//! transport::{SocketTarget, Connection, TlsFiles}, MAX_CONNECTIONS (= 4)
//! ```
//!
//! Every call takes its budgets from the endpoint when it starts (pool
//! checkout and connect inside the operation deadline, receive idle, request
//! and response bytes). Nothing is retried, redirected or decompressed; an
//! error's evidence is `not_dispatched` only when not one request byte was
//! written. Dropping a future closes its connection; dropping an
//! [`ExecStream`] ends observation only (the command may still run);
//! dropping a [`Terminal`] detaches its consumer and its driver task ends
//! within the close wait.
//!
//! The conformance probe is the `smolbox-probe` binary of this package.

mod client;
mod drive;
mod http;
pub mod managed_terminal;
mod pool;
pub mod runtime;
mod stream;
mod terminal;
#[cfg(test)]
mod tests;
pub mod transport;

pub use client::Client;
pub use drive::drive;
pub use managed_terminal::{ManagedTerminal, ManagedTerminals, TerminalOpened};
pub use pool::MAX_CONNECTIONS;
pub use runtime::Runtime;
pub use smolbox_core::terminal::TerminalEvent;
pub use stream::{ExecEvent, ExecStream, MAX_DELIVERY_THREADS};
pub use terminal::Terminal;
pub use transport::{Connection, SocketTarget, TlsFiles};
