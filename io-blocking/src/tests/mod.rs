//! Shell-level tests on loopback: transports, the loop, the pool.

mod pki;
mod transport;
