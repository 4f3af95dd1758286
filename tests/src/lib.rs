//! Cross-crate suites: end-to-end (both shells), recovery simulation, worker
//! API test vectors, store conformance on every adapter.
