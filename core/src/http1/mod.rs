//! HTTP/1.1 client exchange as a sans-IO state machine (features C1.2, C1.3).
//!
//! [`Request`] and [`ResponseHead`] are the values worker operations build and
//! read; the exchange itself (encoder, response decoder over httparse, body
//! framing, caps and timers) lives in this module.

pub mod encode;
mod types;

pub use types::{Method, Request, ResponseHead};
