//! smolbox-core: the sans-IO protocol core of smolbox.
//!
//! Every object here has the same shape: inputs are `handle_*(now, …)`,
//! application commands are plain verbs, outputs are
//! `poll_transmit(&mut Vec<u8>)`, `poll_event()` and
//! `poll_timeout() -> Option<(Instant, Timer)>`. Time, randomness and
//! wall-clock milliseconds are arguments. Nothing in this crate blocks,
//! sleeps, spawns, reads a clock, or touches a socket or a database; the
//! shells (`smolbox-tokio`, `smolbox-blocking`) own all of that.
//!
//! After every input or command a shell drains, in this order:
//! `poll_transmit` (write the bytes), `poll_event` (deliver them), then
//! `poll_timeout` (the next moment to call `handle_timeout`).

#![warn(missing_docs)]

pub mod error;
pub mod exec;
pub mod http1;
pub mod managed;
pub mod secret;
pub mod sse;
pub mod terminal;
pub mod worker;
pub mod ws;

pub use error::{Category, Error, Evidence, Limit, Operation};
pub use secret::Secret;
