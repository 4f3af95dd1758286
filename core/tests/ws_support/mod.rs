//! Helpers shared by the WebSocket and terminal test files: a fixed key and
//! mask, a 101 reply, server frames, and a reader for client frames.
#![allow(dead_code, unreachable_pub)] // each test file uses a different subset

use std::time::Instant;

use smolbox_core::Error;
use smolbox_core::ws::frame::{FrameHeader, parse_any_header};
use smolbox_core::ws::{CloseInfo, WsClient, WsConfig, WsEvent, handshake};

/// RFC 6455 §1.3's sample nonce: key `dGhlIHNhbXBsZSBub25jZQ==`.
pub const KEY: [u8; 16] = *b"the sample nonce";
/// RFC 6455 §5.7's (and TV28's) masking key.
pub const MASK: [u8; 4] = [0x37, 0xfa, 0x21, 0x3d];

/// The epoch of a test's virtual clock; every later instant is derived
/// from it by addition.
#[allow(clippy::disallowed_methods)] // tests need one real Instant to start from
pub fn t0() -> Instant {
    Instant::now()
}

/// `n` bytes of "randomness" that make every masking key [`MASK`].
pub fn fixed_entropy(n: usize) -> Vec<u8> {
    MASK.iter().copied().cycle().take(n).collect()
}

/// A valid 101 reply for [`KEY`], with optional extra header lines.
pub fn reply_101(extra: &str) -> Vec<u8> {
    let accept = handshake::accept_for(&handshake::encode_key(&KEY));
    format!(
        "HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\nupgrade: websocket\r\nsec-websocket-accept: {accept}\r\n{extra}\r\n"
    )
    .into_bytes()
}

/// An unmasked server frame.
pub fn server_frame(fin: bool, opcode: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = vec![(if fin { 0x80 } else { 0 }) | opcode];
    let len = payload.len();
    if len < 126 {
        out.push(len as u8);
    } else if len <= 0xffff {
        out.push(126);
        out.extend_from_slice(&(len as u16).to_be_bytes());
    } else {
        out.push(127);
        out.extend_from_slice(&(len as u64).to_be_bytes());
    }
    out.extend_from_slice(payload);
    out
}

/// A client (masked) frame read back: header and unmasked payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientFrame {
    pub header: FrameHeader,
    pub payload: Vec<u8>,
}

/// Splits client bytes into frames, unmasking each payload; panics on a
/// partial or unmasked frame (a client must mask, RFC 6455 §5.3).
pub fn client_frames(mut bytes: &[u8]) -> Vec<ClientFrame> {
    let mut frames = Vec::new();
    while !bytes.is_empty() {
        let header = parse_any_header(bytes).expect("complete client header");
        let mask = header.mask.expect("client frames are masked");
        let end = header.header_len + header.payload_len as usize;
        let payload = bytes[header.header_len..end]
            .iter()
            .enumerate()
            .map(|(i, b)| b ^ mask[i % 4])
            .collect();
        frames.push(ClientFrame { header, payload });
        bytes = &bytes[end..];
    }
    frames
}

/// An owned copy of a [`WsEvent`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ev {
    Open,
    Binary(Vec<u8>),
    Text(String),
    Ping(Vec<u8>),
    Pong(Vec<u8>),
    Closed(CloseInfo),
    Failed(Error),
}

/// Drains every event.
pub fn events(ws: &mut WsClient) -> Vec<Ev> {
    let mut out = Vec::new();
    while let Some(ev) = ws.poll_event() {
        out.push(match ev {
            WsEvent::Open => Ev::Open,
            WsEvent::Binary(b) => Ev::Binary(b.to_vec()),
            WsEvent::Text(t) => Ev::Text(t.to_owned()),
            WsEvent::Ping(b) => Ev::Ping(b.to_vec()),
            WsEvent::Pong(b) => Ev::Pong(b.to_vec()),
            WsEvent::Closed(c) => Ev::Closed(c),
            WsEvent::Failed(e) => Ev::Failed(e),
            other => panic!("an event this support does not know: {other:?}"),
        });
    }
    out
}

/// Drains the transmit queue.
pub fn transmit(ws: &mut WsClient) -> Vec<u8> {
    let mut out = Vec::new();
    let _ = ws.poll_transmit(&mut out);
    out
}

/// A client past a valid handshake (request drained, `Open` consumed),
/// with entropy that makes every mask [`MASK`].
pub fn open_client(config: WsConfig, now: Instant) -> WsClient {
    let mut ws = WsClient::new(config, KEY, now).expect("valid config");
    ws.handle_entropy(&fixed_entropy(4_096));
    transmit(&mut ws);
    ws.handle_input(now, &reply_101("")).expect("valid reply");
    assert_eq!(events(&mut ws), vec![Ev::Open]);
    ws
}

/// The failure in `evs`, which must be the last event.
pub fn failure(evs: &[Ev]) -> Error {
    match evs.last() {
        Some(Ev::Failed(e)) => *e,
        other => panic!("expected a failure last, got {other:?}"),
    }
}
