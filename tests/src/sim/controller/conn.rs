//! The terminal connection object of the sim's registry (split from
//! `probes.rs`, so `retained` and `probes` no longer import each other).

/// A live terminal connection as the sim's registry holds it: the bytes
/// that crossed it (the shells' connection carries these; nothing else
/// may).
#[derive(Debug)]
pub(super) struct SimConn {
    /// What the consumer typed into it.
    pub(super) typed: Vec<u8>,
    /// What the program wrote back.
    pub(super) output: Vec<u8>,
}

impl SimConn {
    pub(super) const fn new() -> Self {
        Self {
            typed: Vec::new(),
            output: Vec::new(),
        }
    }
}
