//! Shell-level tests on loopback: transports, the loop, the pool.

mod client;
mod exec;
mod terminal;
mod transport;
