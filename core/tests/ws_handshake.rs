//! The opening handshake: request bytes, reply checks, the 16 KiB cap, the
//! timer, and bytes after the 101.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use smolbox_core::Reason;
mod ws_support;

use std::time::Duration;

use smolbox_core::ws::{MAX_HANDSHAKE_LEN, WsClient, WsConfig, WsTimer};
use smolbox_core::{Category, Evidence, Operation, Secret};
use ws_support::*;

fn config() -> WsConfig {
    WsConfig::new("localhost", "/chat?x=1")
}

#[test]
fn request_carries_exactly_the_upgrade_headers() {
    let mut ws = WsClient::new(config(), KEY, t0()).unwrap();
    let req = String::from_utf8(transmit(&mut ws)).unwrap();
    assert_eq!(
        req,
        "GET /chat?x=1 HTTP/1.1\r\nHost: localhost\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    );
    let mut c = config();
    c.authorization = Some(Secret::new("tok-123"));
    let mut ws = WsClient::new(c, KEY, t0()).unwrap();
    let req = String::from_utf8(transmit(&mut ws)).unwrap();
    assert!(req.ends_with(
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nAuthorization: Bearer tok-123\r\n\r\n"
    ));
    assert!(!req.to_ascii_lowercase().contains("extensions"));
    assert!(!req.to_ascii_lowercase().contains("protocol:"));
}

#[test]
fn config_refuses_header_injection_and_bad_limits() {
    let bad = |f: &dyn Fn(&mut WsConfig)| {
        let mut c = config();
        f(&mut c);
        WsClient::new(c, KEY, t0()).unwrap_err()
    };
    assert_eq!(
        bad(&|c| c.host = "a\r\nX: y".into()).reason(),
        Reason::InvalidHost
    );
    assert_eq!(
        bad(&|c| c.target = "no-slash".into()).reason(),
        Reason::InvalidTarget
    );
    assert_eq!(
        bad(&|c| c.authorization = Some(Secret::new("a\nb"))).reason(),
        Reason::InvalidToken
    );
    assert_eq!(
        bad(&|c| c.max_frame_len = 65_537).reason(),
        Reason::MaxFrameLenOutOfRange
    );
    let mut c = config();
    c.max_frame_len = 65_536;
    assert!(WsClient::new(c, KEY, t0()).is_ok());
    assert_eq!(
        bad(&|c| c.max_message_len = 0).category(),
        Category::Validation
    );
}

#[test]
fn valid_reply_opens_and_keeps_following_bytes_as_frames() {
    let now = t0();
    let mut ws = WsClient::new(config(), KEY, now).unwrap();
    transmit(&mut ws);
    let mut bytes = reply_101("x-trace-id: 0000000000001234\r\n");
    bytes.extend(server_frame(true, 0x2, b"/ # "));
    bytes.extend(server_frame(true, 0x1, b"hi"));
    ws.handle_input(now, &bytes).unwrap();
    assert_eq!(
        events(&mut ws),
        vec![
            Ev::Open,
            Ev::Binary(b"/ # ".to_vec()),
            Ev::Text("hi".into())
        ]
    );
    assert!(ws.is_open());
    assert_eq!(ws.poll_timeout(), None);
}

fn reply_error(reply: &[u8]) -> smolbox_core::Error {
    let now = t0();
    let mut ws = WsClient::new(config(), KEY, now).unwrap();
    transmit(&mut ws);
    let err = ws.handle_input(now, reply).unwrap_err();
    assert_eq!(failure(&events(&mut ws)), err);
    assert!(ws.is_finished());
    assert!(
        transmit(&mut ws).is_empty(),
        "no close frame before the upgrade"
    );
    err
}

#[test]
fn status_401_and_403_are_authentication_others_protocol() {
    for status in [401u16, 403] {
        let e =
            reply_error(format!("HTTP/1.1 {status} No\r\ncontent-length: 0\r\n\r\n").as_bytes());
        assert_eq!(
            (e.category(), e.status()),
            (Category::Authentication, Some(status))
        );
        assert_eq!(e.evidence(), Evidence::DispatchUncertain);
    }
    for status in [200u16, 404, 500, 426] {
        let e = reply_error(format!("HTTP/1.1 {status} X\r\n\r\n").as_bytes());
        assert_eq!(
            (e.category(), e.status()),
            (Category::Protocol, Some(status))
        );
        assert_eq!(e.operation(), Operation::WebSocket);
    }
}

#[test]
fn reply_checks() {
    let accept = handshake_accept();
    let cases: [(&str, Reason); 8] = [
        (
            "HTTP/1.1 101 S\r\nconnection: upgrade\r\nupgrade: websocket\r\nsec-websocket-accept: AAAAAAAAAAAAAAAAAAAAAAAAAAA=\r\n\r\n",
            Reason::AcceptMismatch,
        ),
        (
            "HTTP/1.1 101 S\r\nconnection: upgrade\r\nupgrade: websocket\r\n\r\n",
            Reason::AcceptMismatch,
        ),
        (
            "HTTP/1.1 101 S\r\nconnection: upgrade\r\nsec-websocket-accept: {A}\r\n\r\n",
            Reason::UpgradeHeader,
        ),
        (
            "HTTP/1.1 101 S\r\nconnection: upgrade\r\nupgrade: h2c\r\nsec-websocket-accept: {A}\r\n\r\n",
            Reason::UpgradeNotWebsocket,
        ),
        (
            "HTTP/1.1 101 S\r\nupgrade: websocket\r\nsec-websocket-accept: {A}\r\n\r\n",
            Reason::ConnectionHeader,
        ),
        (
            "HTTP/1.1 101 S\r\nconnection: upgrade\r\nupgrade: websocket\r\nsec-websocket-accept: {A}\r\nsec-websocket-extensions: permessage-deflate\r\n\r\n",
            Reason::UnrequestedExtension,
        ),
        (
            "HTTP/1.1 101 S\r\nconnection: upgrade\r\nupgrade: websocket\r\nsec-websocket-accept: {A}\r\nsec-websocket-protocol: chat\r\n\r\n",
            Reason::UnrequestedSubprotocol,
        ),
        (
            "HTTP/1.0 101 S\r\nconnection: upgrade\r\nupgrade: websocket\r\nsec-websocket-accept: {A}\r\n\r\n",
            Reason::HttpVersion,
        ),
    ];
    for (reply, reason) in cases {
        let e = reply_error(reply.replace("{A}", &accept).as_bytes());
        assert_eq!(
            (e.category(), e.reason()),
            (Category::Protocol, reason),
            "{reply}"
        );
    }
    // Tokens are matched case-insensitively inside lists.
    let now = t0();
    let mut ws = WsClient::new(config(), KEY, now).unwrap();
    let ok = format!(
        "HTTP/1.1 101 S\r\nConnection: keep-alive, Upgrade\r\nUpgrade: WebSocket\r\nSec-WebSocket-Accept:  {accept} \r\n\r\n"
    );
    ws.handle_input(now, ok.as_bytes()).unwrap();
    assert_eq!(events(&mut ws), vec![Ev::Open]);
}

fn handshake_accept() -> String {
    smolbox_core::ws::handshake::accept_for(&smolbox_core::ws::handshake::encode_key(&KEY))
}

/// A valid reply padded with one header to exactly `len` bytes.
fn padded_reply(len: usize) -> Vec<u8> {
    let base = reply_101("x-pad: \r\n");
    let mut s = String::from_utf8(reply_101("")).unwrap();
    s.truncate(s.len() - 2);
    s.push_str("x-pad: ");
    s.push_str(&"p".repeat(len - base.len()));
    s.push_str("\r\n\r\n");
    assert_eq!(s.len(), len);
    s.into_bytes()
}

#[test]
fn reply_head_cap_is_16_kib_whatever_the_chunking() {
    for chunk in [1usize, 7, 4_096, 65_536] {
        let now = t0();
        let mut ws = WsClient::new(config(), KEY, now).unwrap();
        for piece in padded_reply(MAX_HANDSHAKE_LEN).chunks(chunk) {
            ws.handle_input(now, piece).unwrap();
        }
        assert_eq!(events(&mut ws), vec![Ev::Open], "chunk {chunk}");

        let mut ws = WsClient::new(config(), KEY, now).unwrap();
        let mut result = Ok(());
        for piece in padded_reply(MAX_HANDSHAKE_LEN + 1).chunks(chunk) {
            result = ws.handle_input(now, piece);
            if result.is_err() {
                break;
            }
        }
        let e = result.unwrap_err();
        assert_eq!(
            (e.category(), e.reason()),
            (Category::Protocol, Reason::HandshakeTooLarge),
            "chunk {chunk}"
        );
        assert_eq!(e.limit().unwrap().max, MAX_HANDSHAKE_LEN as u64);
    }
}

#[test]
fn handshake_timer_fires_exactly_at_its_deadline() {
    let now = t0();
    let mut c = config();
    c.handshake_timeout = Duration::from_millis(2_500);
    let mut ws = WsClient::new(c.clone(), KEY, now).unwrap();
    let deadline = now + Duration::from_millis(2_500);
    assert_eq!(ws.poll_timeout(), Some((deadline, WsTimer::Handshake)));
    // Before any byte left: not_dispatched.
    ws.handle_timeout(deadline - Duration::from_nanos(1));
    assert_eq!(events(&mut ws), vec![]);
    ws.handle_timeout(deadline);
    let e = failure(&events(&mut ws));
    assert_eq!(
        (e.category(), e.reason(), e.evidence()),
        (
            Category::Transport,
            Reason::HandshakeTimeout,
            Evidence::NotDispatched
        )
    );
    assert_eq!(ws.poll_timeout(), None);
    // After the request was handed out: dispatch_uncertain.
    let mut ws = WsClient::new(c, KEY, now).unwrap();
    transmit(&mut ws);
    ws.handle_timeout(deadline);
    assert_eq!(
        failure(&events(&mut ws)).evidence(),
        Evidence::DispatchUncertain
    );
    assert_eq!(
        ws.handle_input(deadline, b"HTTP/1.1").unwrap_err().reason(),
        Reason::HandshakeTimeout
    );
}

#[test]
fn eof_during_handshake_fails() {
    let now = t0();
    let mut ws = WsClient::new(config(), KEY, now).unwrap();
    transmit(&mut ws);
    ws.handle_input(now, b"HTTP/1.1 101 Switching").unwrap();
    ws.handle_eof(now);
    assert_eq!(
        failure(&events(&mut ws)).reason(),
        Reason::EofDuringHandshake
    );
}
