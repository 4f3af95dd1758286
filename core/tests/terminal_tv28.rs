//! worker-api.md §14 TV28: the interactive terminal transcript, byte for
//! byte, and its variant endings.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod ws_support;

use std::time::Instant;

use smolbox_core::terminal::{Next, TerminalConfig, TerminalExit, TerminalSession, TerminalSpec};
use smolbox_core::{Category, Error, Evidence, Operation};
use ws_support::{KEY, fixed_entropy, t0};

fn hex(s: &str) -> Vec<u8> {
    s.split_whitespace()
        .map(|b| u8::from_str_radix(b, 16).unwrap())
        .collect()
}

fn session(now: Instant) -> TerminalSession {
    let spec = TerminalSpec {
        cols: 100,
        rows: 30,
        ..TerminalSpec::new("/bin/sh")
    };
    let mut s =
        TerminalSession::new(&spec, TerminalConfig::new("localhost", "dev"), KEY, now).unwrap();
    s.handle_entropy(&fixed_entropy(4_096));
    s
}

fn tx(s: &mut TerminalSession) -> Vec<u8> {
    let mut out = Vec::new();
    let _ = s.poll_transmit(&mut out);
    out
}

fn next_output(s: &mut TerminalSession, now: Instant) -> Vec<u8> {
    match s.next(now, now) {
        Next::Output(b) => b.to_vec(),
        other => panic!("expected output, got {other:?}"),
    }
}

fn next_closed(s: &mut TerminalSession, now: Instant) -> Result<TerminalExit, Error> {
    match s.next(now, now) {
        Next::Closed(r) => r,
        other => panic!("expected closed, got {other:?}"),
    }
}

const REPLY: &str = "HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\nupgrade: websocket\r\nsec-websocket-accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\nx-trace-id: 000000000000498a\r\n\r\n";

fn opened(now: Instant) -> TerminalSession {
    let mut s = session(now);
    assert_eq!(
        String::from_utf8(tx(&mut s)).unwrap(),
        "GET /api/v1/machines/dev/exec/interactive?cmd=%2Fbin%2Fsh&cols=100&rows=30 HTTP/1.1\r\n\
         Host: localhost\r\n\
         Connection: Upgrade\r\n\
         Upgrade: websocket\r\n\
         Sec-WebSocket-Version: 13\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    );
    s.handle_input(now, REPLY.as_bytes()).unwrap();
    assert!(s.is_open());
    s
}

#[test]
fn tv28_full_session_byte_for_byte() {
    let now = t0();
    let mut s = opened(now);
    // 1 S→C
    s.handle_input(now, &hex("82 04 2f 20 23 20")).unwrap();
    assert_eq!(next_output(&mut s, now), b"/ # ");
    // 2 C→S
    s.input(now, b"echo hi\n").unwrap();
    assert_eq!(tx(&mut s), hex("82 88 37 fa 21 3d 52 99 49 52 17 92 48 37"));
    // 3 S→C
    s.handle_input(
        now,
        &hex("82 11 65 63 68 6f 20 68 69 0d 0a 68 69 0d 0a 2f 20 23 20"),
    )
    .unwrap();
    assert_eq!(next_output(&mut s, now), b"echo hi\r\nhi\r\n/ # ");
    // 4 C→S
    s.resize(now, 120, 40).unwrap();
    assert_eq!(
        tx(&mut s),
        hex(
            "81 a6 37 fa 21 3d 4c d8 55 44 47 9f 03 07 15 88 44 4e 5e 80 44 1f 1b d8 42 52 5b 89 03 07 06 c8 11 11 15 88 4e 4a 44 d8 1b 09 07 87"
        )
    );
    // 5 C→S
    s.input(now, b"exit 7\n").unwrap();
    assert_eq!(tx(&mut s), hex("82 87 37 fa 21 3d 52 82 48 49 17 cd 2b"));
    // 6, 7, 8 S→C in one read.
    let mut rest = hex("82 08 65 78 69 74 20 37 0d 0a");
    rest.extend(hex(
        "81 18 7b 22 74 79 70 65 22 3a 22 65 78 69 74 22 2c 22 63 6f 64 65 22 3a 37 7d",
    ));
    rest.extend(hex("88 00"));
    s.handle_input(now, &rest).unwrap();
    // The close is echoed (empty, masked).
    assert_eq!(tx(&mut s), hex("88 80 37 fa 21 3d"));
    assert!(s.is_transport_finished());
    assert_eq!(next_output(&mut s, now), b"exit 7\r\n");
    assert_eq!(next_closed(&mut s, now), Ok(TerminalExit { code: 7 }));
    assert_eq!(
        next_closed(&mut s, now),
        Ok(TerminalExit { code: 7 }),
        "the final event repeats"
    );
    assert_eq!(s.sent_bytes(), 8 + 38 + 7);
}

#[test]
fn tv28_client_closes_first() {
    let now = t0();
    let mut s = opened(now);
    s.close(now);
    assert_eq!(tx(&mut s), hex("88 82 37 fa 21 3d 34 12"));
    assert!(s.input(now, b"x").is_err(), "nothing is sent after close");
    s.handle_input(now, &hex("88 02 03 e8")).unwrap();
    let e = next_closed(&mut s, now).unwrap_err();
    assert_eq!(
        (e.category(), e.operation(), e.evidence()),
        (
            Category::Unknown,
            Operation::TerminalClose,
            Evidence::Unknown
        )
    );
    assert_eq!(e.exit_code(), None, "no exit is fabricated");
    // If the exit text does arrive after our close, 130 stays uncertain.
    let mut s = opened(now);
    s.close(now);
    tx(&mut s);
    let mut rest = hex("81 1a");
    rest.extend(br#"{"type":"exit","code":130}"#);
    rest.extend(hex("88 00"));
    s.handle_input(now, &rest).unwrap();
    let e = next_closed(&mut s, now).unwrap_err();
    assert_eq!(
        (e.category(), e.exit_code()),
        (Category::Unknown, Some(130))
    );
}

#[test]
fn tv28_agent_failure_exit_minus_one_is_uncertain() {
    let now = t0();
    let mut s = opened(now);
    let mut rest = hex("81 19");
    rest.extend(br#"{"type":"exit","code":-1}"#);
    rest.extend(hex("88 00"));
    s.handle_input(now, &rest).unwrap();
    let e = next_closed(&mut s, now).unwrap_err();
    assert_eq!(
        (e.category(), e.evidence(), e.exit_code()),
        (Category::Unknown, Evidence::Unknown, Some(-1))
    );
}

#[test]
fn tv28_unknown_machine_is_a_404_protocol_failure() {
    let now = t0();
    let mut s = session(now);
    tx(&mut s);
    let body = r#"{"error":"machine 'dev' not found","code":"NOT_FOUND"}"#;
    let reply = format!(
        "HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    s.handle_input(now, reply.as_bytes()).unwrap();
    let e = next_closed(&mut s, now).unwrap_err();
    assert_eq!(
        (e.category(), e.operation(), e.status()),
        (Category::Protocol, Operation::TerminalOpen, Some(404))
    );
    assert_eq!(e.evidence(), Evidence::DispatchUncertain);
    assert!(
        !format!("{e:?} {e}").contains("not found"),
        "no peer text in errors"
    );
}
