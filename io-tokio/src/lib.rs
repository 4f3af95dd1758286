//! smolbox-tokio: the async shell. It owns sockets, TLS, timers and
//! `Instant::now()`, feeds bytes and time to `smolbox-core`, and makes no
//! protocol decision of its own.
