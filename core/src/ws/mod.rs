//! RFC 6455 WebSocket client connection, sans-IO.
//!
//! [`WsClient`] owns one connection from the upgrade request to the end of
//! the close handshake. It never reads a clock or a socket and seeds no
//! randomness: the 16 handshake key bytes are a constructor argument and
//! masking keys come from random bytes the caller adds in bulk with
//! [`WsClient::handle_entropy`].
//!
//! The codec pieces are public for tests, fuzzing and benchmarks:
//! [`frame`] (header parse and encode), [`mask`] (word-at-a-time masking),
//! [`handshake`] (key and accept values).

mod client;
mod close;
mod config;
pub mod frame;
#[cfg(feature = "testkit")]
mod fuzz;
pub mod handshake;
pub mod mask;
mod send;

pub use client::{CloseInfo, MAX_PENDING_TRANSMIT, WsClient, WsEvent, WsTimer};
pub use close::{CloseCode, CloseReason, MAX_CLOSE_REASON};
pub use config::{
    DEFAULT_CLOSE_WAIT, DEFAULT_HANDSHAKE_TIMEOUT, DEFAULT_MAX_FRAME_LEN, DEFAULT_MAX_MESSAGE_LEN,
    MAX_FRAME_LEN, MAX_HANDSHAKE_LEN, MAX_INPUT_CHUNK, MAX_MESSAGE_LEN, MAX_WS_TIMER, WsConfig,
};
pub use frame::Opcode;
#[cfg(feature = "testkit")]
pub(crate) use fuzz::fuzz_epoch;
#[cfg(feature = "testkit")]
pub use fuzz::fuzz_ws_frames;
pub use mask::MASK_POOL_BYTES;
