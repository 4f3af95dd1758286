//! Frames after the handshake: RFC 6455 §5.7 vectors, every protocol error,
//! the frame and message caps, UTF-8, control frames, close, masking.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use smolbox_core::Reason;
mod ws_support;

use std::time::Duration;

use smolbox_core::ws::frame::Opcode;
use smolbox_core::ws::{
    CloseCode, CloseInfo, CloseReason, MAX_CLOSE_REASON, MAX_INPUT_CHUNK, MAX_PENDING_TRANSMIT,
    WsClient, WsConfig, WsTimer,
};
use smolbox_core::{Category, Evidence};
use ws_support::*;

fn config() -> WsConfig {
    WsConfig::new("localhost", "/ws")
}

fn open() -> WsClient {
    open_client(config(), t0())
}

/// Feeds `bytes` and returns every event.
fn feed(ws: &mut WsClient, bytes: &[u8]) -> Vec<Ev> {
    let mut evs = Vec::new();
    for chunk in bytes.chunks(MAX_INPUT_CHUNK) {
        ws.handle_input(t0(), chunk).unwrap();
        evs.extend(events(ws));
    }
    evs
}

/// The close code in the one close frame the client queued.
fn sent_close(ws: &mut WsClient) -> Option<u16> {
    let frames = client_frames(&transmit(ws));
    assert_eq!(frames.len(), 1, "exactly one frame (the close)");
    assert_eq!(frames[0].header.opcode, Opcode::Close);
    let p = &frames[0].payload;
    (p.len() >= 2).then(|| u16::from_be_bytes([p[0], p[1]]))
}

#[test]
fn rfc_6455_5_7_examples() {
    // A single-frame unmasked text message.
    let mut ws = open();
    assert_eq!(
        feed(&mut ws, &[0x81, 0x05, 0x48, 0x65, 0x6c, 0x6c, 0x6f]),
        vec![Ev::Text("Hello".into())]
    );
    // A fragmented unmasked text message.
    assert_eq!(feed(&mut ws, &[0x01, 0x03, 0x48, 0x65, 0x6c]), vec![]);
    assert_eq!(
        feed(&mut ws, &[0x80, 0x02, 0x6c, 0x6f]),
        vec![Ev::Text("Hello".into())]
    );
    // Unmasked ping and the masked pong answering it.
    assert_eq!(
        feed(&mut ws, &[0x89, 0x05, 0x48, 0x65, 0x6c, 0x6c, 0x6f]),
        vec![Ev::Ping(b"Hello".to_vec())]
    );
    assert_eq!(
        transmit(&mut ws),
        [
            0x8a, 0x85, 0x37, 0xfa, 0x21, 0x3d, 0x7f, 0x9f, 0x4d, 0x51, 0x58
        ]
    );
    // 256 bytes binary in a single unmasked frame.
    let mut f = vec![0x82, 0x7e, 0x01, 0x00];
    f.extend(vec![0xab; 256]);
    assert_eq!(feed(&mut ws, &f), vec![Ev::Binary(vec![0xab; 256])]);
    // 64 KiB binary in a single unmasked frame.
    let mut f = vec![0x82, 0x7f, 0, 0, 0, 0, 0, 0x01, 0x00, 0x00];
    f.extend(vec![0xcd; 65_536]);
    ws.handle_input(t0(), &f[..40_000]).unwrap();
    assert_eq!(events(&mut ws), vec![]);
    assert_eq!(
        feed(&mut ws, &f[40_000..]),
        vec![Ev::Binary(vec![0xcd; 65_536])]
    );
    // A single-frame masked text message, as this client encodes it.
    ws.send_text(t0(), "Hello").unwrap();
    assert_eq!(
        transmit(&mut ws),
        [
            0x81, 0x85, 0x37, 0xfa, 0x21, 0x3d, 0x7f, 0x9f, 0x4d, 0x51, 0x58
        ]
    );
}

#[test]
fn every_protocol_error_fails_with_close_1002() {
    let cases: Vec<(Vec<u8>, Reason)> = vec![
        (vec![0x82, 0x81, 1, 2, 3, 4, 0], Reason::MaskedServerFrame),
        (vec![0xa2, 0x00], Reason::RsvBitsSet),
        (vec![0x83, 0x00], Reason::ReservedOpcode),
        (vec![0x8f, 0x00], Reason::ReservedOpcode),
        (vec![0x82, 0x7e, 0x00, 0x05], Reason::NonMinimalLength),
        (
            vec![0x82, 0x7f, 0, 0, 0, 0, 0, 0, 0x01, 0x00],
            Reason::NonMinimalLength,
        ),
        (
            vec![0x82, 0x7f, 0x80, 0, 0, 0, 0, 0, 0, 0],
            Reason::LengthTopBitSet,
        ),
        (vec![0x09, 0x00], Reason::FragmentedControlFrame),
        (vec![0x89, 0x7e, 0x00, 0x7e], Reason::ControlFrameTooLong),
        (vec![0x80, 0x01, b'x'], Reason::ContinuationWithoutStart),
        (
            [
                server_frame(false, 0x2, b"a"),
                server_frame(true, 0x2, b"b"),
            ]
            .concat(),
            Reason::DataFrameInsideFragmentedMessage,
        ),
        (
            [
                server_frame(false, 0x1, b"a"),
                server_frame(false, 0x1, b"b"),
            ]
            .concat(),
            Reason::DataFrameInsideFragmentedMessage,
        ),
    ];
    for (bytes, reason) in cases {
        let mut ws = open();
        let e = failure(&feed(&mut ws, &bytes));
        assert_eq!((e.category(), e.reason()), (Category::Protocol, reason));
        assert_eq!(e.evidence(), Evidence::DispatchUncertain);
        assert_eq!(sent_close(&mut ws), Some(1002), "{reason}");
        // Sticky: later input and sends return the same error; nothing more is sent.
        assert_eq!(ws.handle_input(t0(), b"\x81\x00").unwrap_err(), e);
        assert_eq!(ws.send_binary(t0(), b"x").unwrap_err(), e);
        assert!(transmit(&mut ws).is_empty());
        assert_eq!(events(&mut ws), vec![]);
    }
}

#[test]
fn frame_cap_is_refused_from_the_header_at_n_plus_one() {
    for cap in [1_024usize, 65_536] {
        let mut c = config();
        c.max_frame_len = cap;
        c.max_message_len = 1_048_576;
        let mut ws = open_client(c.clone(), t0());
        let ok = server_frame(true, 0x2, &vec![1; cap]);
        assert_eq!(feed(&mut ws, &ok), vec![Ev::Binary(vec![1; cap])]);
        // Only the header of an N+1 frame has arrived: refused at once.
        let mut ws = open_client(c, t0());
        let big = server_frame(true, 0x2, &vec![1; cap + 1]);
        let hdr_len = if cap + 1 < 65_536 { 4 } else { 10 };
        let e = failure(&feed(&mut ws, &big[..hdr_len]));
        assert_eq!(
            (e.category(), e.reason()),
            (Category::OutputLimit, Reason::FrameTooLarge)
        );
        assert_eq!(
            (e.limit().unwrap().actual, e.limit().unwrap().max),
            (cap as u64 + 1, cap as u64)
        );
        assert_eq!(sent_close(&mut ws), Some(1009));
    }
}

#[test]
fn fragmented_message_cap_at_n_and_n_plus_one() {
    let mut c = config();
    c.max_message_len = 1_024;
    let frags = |last: usize| {
        [
            server_frame(false, 0x2, &[1; 500]),
            server_frame(false, 0x0, &[2; 500]),
            server_frame(true, 0x0, &vec![3; last]),
        ]
        .concat()
    };
    let mut ws = open_client(c.clone(), t0());
    let evs = feed(&mut ws, &frags(24));
    assert_eq!(evs.len(), 1);
    assert!(matches!(&evs[0], Ev::Binary(b) if b.len() == 1_024 && b[0] == 1 && b[1_023] == 3));
    let mut ws = open_client(c.clone(), t0());
    let e = failure(&feed(&mut ws, &frags(25)));
    assert_eq!(
        (e.category(), e.reason()),
        (Category::OutputLimit, Reason::MessageTooLarge)
    );
    assert_eq!(e.limit().unwrap().actual, 1_025);
    assert_eq!(sent_close(&mut ws), Some(1009));
    // An unfragmented message over the message cap is refused too.
    let mut ws = open_client(c, t0());
    let e = failure(&feed(&mut ws, &server_frame(true, 0x2, &[0; 1_025])));
    assert_eq!(e.reason(), Reason::MessageTooLarge);
}

#[test]
fn text_must_be_utf8_close_1007() {
    let mut ws = open();
    let e = failure(&feed(&mut ws, &server_frame(true, 0x1, &[0x68, 0xc3])));
    assert_eq!(
        (e.category(), e.reason()),
        (Category::Protocol, Reason::InvalidUtf8)
    );
    assert_eq!(sent_close(&mut ws), Some(1007));
    // A multi-byte character split across fragments is fine.
    let mut ws = open();
    let bytes = [
        server_frame(false, 0x1, &[0x68, 0xc3]),
        server_frame(true, 0x0, &[0xa9]),
    ]
    .concat();
    assert_eq!(feed(&mut ws, &bytes), vec![Ev::Text("hé".into())]);
    let mut ws = open();
    let bytes = [
        server_frame(false, 0x1, &[0x68, 0xc3]),
        server_frame(true, 0x0, &[0x41]),
    ]
    .concat();
    assert_eq!(
        failure(&feed(&mut ws, &bytes)).reason(),
        Reason::InvalidUtf8
    );
}

#[test]
fn control_frames_between_fragments() {
    let mut ws = open();
    let bytes = [
        server_frame(false, 0x2, b"ab"),
        server_frame(true, 0x9, b"p1"),
        server_frame(false, 0x0, b"cd"),
        server_frame(true, 0xa, b"p2"),
        server_frame(true, 0x0, b"ef"),
    ]
    .concat();
    assert_eq!(
        feed(&mut ws, &bytes),
        vec![
            Ev::Ping(b"p1".to_vec()),
            Ev::Pong(b"p2".to_vec()),
            Ev::Binary(b"abcdef".to_vec())
        ]
    );
    let frames = client_frames(&transmit(&mut ws));
    assert_eq!(frames.len(), 1);
    assert_eq!(
        (frames[0].header.opcode, frames[0].payload.as_slice()),
        (Opcode::Pong, &b"p1"[..])
    );
}

#[test]
fn peer_close_is_echoed_and_nothing_follows() {
    let mut ws = open();
    let evs = feed(
        &mut ws,
        &server_frame(true, 0x8, &[0x03, 0xe8, b'b', b'y', b'e']),
    );
    assert_eq!(
        evs,
        vec![Ev::Closed(CloseInfo {
            code: Some(CloseCode::NORMAL),
            reason: CloseReason::from_utf8(b"bye").unwrap(),
            by_peer: true
        })]
    );
    // The echo carries the code only, never the peer's text.
    let echo = client_frames(&transmit(&mut ws));
    assert_eq!(echo.len(), 1);
    assert_eq!(echo[0].payload, [0x03, 0xe8]);
    let mut ws = open();
    feed(
        &mut ws,
        &server_frame(true, 0x8, &[0x03, 0xe8, b'b', b'y', b'e']),
    );
    assert_eq!(sent_close(&mut ws), Some(1000));
    assert!(ws.is_finished());
    assert_eq!(
        ws.send_binary(t0(), b"x").unwrap_err().reason(),
        Reason::Closed
    );
    ws.handle_input(t0(), &server_frame(true, 0x9, b"late"))
        .unwrap();
    assert_eq!(events(&mut ws), vec![]);
    assert!(transmit(&mut ws).is_empty());
    // TCP end after a close is normal.
    ws.handle_eof(t0());
    assert_eq!(events(&mut ws), vec![]);

    // An empty close (peer sees 1005) is echoed empty.
    let mut ws = open();
    let evs = feed(&mut ws, &[0x88, 0x00]);
    assert_eq!(
        evs,
        vec![Ev::Closed(CloseInfo {
            code: None,
            reason: CloseReason::EMPTY,
            by_peer: true
        })]
    );
    assert_eq!(sent_close(&mut ws), None);
}

#[test]
fn close_codes_and_reasons_are_validated() {
    for code in [0u16, 999, 1004, 1005, 1006, 1015, 1016, 2999, 5000, 65_535] {
        let mut ws = open();
        let e = failure(&feed(
            &mut ws,
            &server_frame(true, 0x8, &code.to_be_bytes()),
        ));
        assert_eq!(e.reason(), Reason::CloseCodeInvalid, "{code}");
        assert_eq!(sent_close(&mut ws), Some(1002));
    }
    for code in [1000u16, 1001, 1003, 1007, 1011, 1014, 3000, 4999] {
        let mut ws = open();
        let evs = feed(&mut ws, &server_frame(true, 0x8, &code.to_be_bytes()));
        assert!(matches!(evs[..], [Ev::Closed(_)]), "{code}");
    }
    let mut ws = open();
    assert_eq!(
        failure(&feed(&mut ws, &[0x88, 0x01, 0x03])).reason(),
        Reason::ClosePayloadOneByte
    );
    let mut ws = open();
    assert_eq!(
        failure(&feed(&mut ws, &[0x88, 0x03, 0x03, 0xe8, 0xff])).reason(),
        Reason::InvalidUtf8
    );
    assert_eq!(sent_close(&mut ws), Some(1007));
    // Our side: codes that must not be on the wire are refused.
    let mut ws = open();
    for code in [1005u16, 1006, 1015, 999] {
        let e = ws.close(t0(), CloseCode::from_u16(code)).unwrap_err();
        assert_eq!(e.category(), Category::Validation);
    }
    assert!(transmit(&mut ws).is_empty());
}

#[test]
fn peer_close_reason_is_reported_exactly_up_to_123_bytes() {
    // N = 123 bytes of multi-byte UTF-8: accepted and reported.
    let text = "é".to_owned() + &"€".repeat(40);
    assert_eq!(text.len() + 1, MAX_CLOSE_REASON);
    let text = format!("{text}!");
    let mut payload = vec![0x0f, 0xa0]; // 4000, an application code
    payload.extend_from_slice(text.as_bytes());
    let mut ws = open();
    let evs = feed(&mut ws, &server_frame(true, 0x8, &payload));
    let [Ev::Closed(info)] = evs.as_slice() else {
        panic!("expected a close, got {evs:?}");
    };
    assert_eq!(info.code, Some(CloseCode::from_u16(4000)));
    assert_eq!(info.reason.as_str(), text);
    assert_eq!(info.reason.len(), MAX_CLOSE_REASON);
    assert!(info.by_peer);
    // Debug shows the length only.
    assert!(!format!("{info:?}").contains('€'));
    // N + 1 = 124 bytes makes a 126-byte control payload: a protocol error
    // (RFC 6455 §5.5), answered with 1002.
    let mut long = payload.clone();
    long.push(b'x');
    let mut ws = open();
    let e = failure(&feed(&mut ws, &server_frame(true, 0x8, &long)));
    assert_eq!(e.category(), Category::Protocol);
    assert_eq!(sent_close(&mut ws), Some(1002));
}

#[test]
fn refused_close_frames_are_answered_with_the_rfc_code_and_evidence() {
    // An invalid code: 1002, the code kept as evidence, the request may
    // have reached the peer.
    let mut ws = open();
    let e = failure(&feed(
        &mut ws,
        &server_frame(true, 0x8, &1005u16.to_be_bytes()),
    ));
    assert_eq!(
        (e.category(), e.reason(), e.close_code(), e.evidence()),
        (
            Category::Protocol,
            Reason::CloseCodeInvalid,
            Some(1005),
            Evidence::DispatchUncertain
        )
    );
    let frames = client_frames(&transmit(&mut ws));
    assert_eq!(frames.len(), 1);
    // Our close carries the fixed reason code, nothing of the peer's.
    let mut want = 1002u16.to_be_bytes().to_vec();
    want.extend_from_slice(b"close_code_invalid");
    assert_eq!(frames[0].payload, want);
    // A reason that is not UTF-8: 1007, the peer's code kept.
    let mut ws = open();
    let e = failure(&feed(
        &mut ws,
        &server_frame(true, 0x8, &[0x0b, 0xb8, b'o', 0xc3]),
    ));
    assert_eq!(
        (e.reason(), e.close_code()),
        (Reason::InvalidUtf8, Some(3000))
    );
    assert_eq!(sent_close(&mut ws), Some(1007));
}

#[test]
fn our_close_reason_is_bounded_at_123_bytes() {
    const R123: &str = "rrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrr";
    const R124: &str = "rrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrr";
    assert_eq!((R123.len(), R124.len()), (123, 124));
    let mut ws = open();
    let e = ws
        .close_with_reason(t0(), CloseCode::NORMAL, R124)
        .unwrap_err();
    assert_eq!(
        (e.category(), e.reason(), e.evidence()),
        (
            Category::Validation,
            Reason::CloseReasonTooLong,
            Evidence::NotDispatched
        )
    );
    assert!(transmit(&mut ws).is_empty(), "nothing queued");
    ws.close_with_reason(t0(), CloseCode::NORMAL, R123).unwrap();
    let frames = client_frames(&transmit(&mut ws));
    assert_eq!(frames.len(), 1);
    assert_eq!(frames[0].payload.len(), 125);
    assert_eq!(&frames[0].payload[2..], R123.as_bytes());
}

#[test]
fn our_close_waits_for_the_peer_then_times_out() {
    let now = t0();
    let mut c = config();
    c.close_wait = Duration::from_millis(700);
    let mut ws = open_client(c.clone(), now);
    ws.close(now, CloseCode::NORMAL).unwrap();
    assert_eq!(sent_close(&mut ws), Some(1000));
    let deadline = now + Duration::from_millis(700);
    assert_eq!(ws.poll_timeout(), Some((deadline, WsTimer::CloseWait)));
    // Nothing is sent after our close: no data, no pong.
    assert_eq!(
        ws.send_binary(now, b"x").unwrap_err().reason(),
        Reason::Closed
    );
    assert_eq!(
        feed(&mut ws, &server_frame(true, 0x9, b"p")),
        vec![Ev::Ping(b"p".to_vec())]
    );
    assert_eq!(
        feed(&mut ws, &server_frame(true, 0x2, b"late data")),
        vec![Ev::Binary(b"late data".to_vec())]
    );
    assert!(transmit(&mut ws).is_empty());
    ws.close(now, CloseCode::NORMAL).unwrap();
    assert!(transmit(&mut ws).is_empty(), "a second close sends nothing");
    // The peer answers in time.
    let evs = feed(&mut ws, &server_frame(true, 0x8, &[0x03, 0xe8]));
    assert_eq!(
        evs,
        vec![Ev::Closed(CloseInfo {
            code: Some(CloseCode::NORMAL),
            reason: CloseReason::EMPTY,
            by_peer: false
        })]
    );
    assert!(transmit(&mut ws).is_empty(), "no echo of an answer");
    assert_eq!(ws.poll_timeout(), None);

    // The peer does not answer.
    let mut ws = open_client(c, now);
    ws.close(now, CloseCode::GOING_AWAY).unwrap();
    transmit(&mut ws);
    ws.handle_timeout(deadline - Duration::from_nanos(1));
    assert_eq!(events(&mut ws), vec![]);
    ws.handle_timeout(deadline);
    let e = failure(&events(&mut ws));
    assert_eq!(
        (e.category(), e.reason()),
        (Category::Transport, Reason::CloseWaitExpired)
    );
}

#[test]
fn tcp_end_without_close_is_abnormal_after_buffered_frames() {
    let mut ws = open();
    let mut bytes = server_frame(true, 0x2, b"one");
    bytes.extend(&server_frame(true, 0x2, b"two")[..3]);
    ws.handle_input(t0(), &bytes).unwrap();
    ws.handle_eof(t0());
    let evs = events(&mut ws);
    assert_eq!(evs[0], Ev::Binary(b"one".to_vec()));
    let e = failure(&evs);
    assert_eq!(
        (e.category(), e.reason()),
        (Category::Transport, Reason::AbnormalClose)
    );
    assert_eq!(evs.len(), 2);
}

#[test]
fn masking_needs_caller_entropy_and_control_frames_wait_for_it() {
    let now = t0();
    let mut ws = WsClient::new(config(), KEY, now).unwrap();
    transmit(&mut ws);
    ws.handle_input(now, &reply_101("")).unwrap();
    assert_eq!(events(&mut ws), vec![Ev::Open]);
    assert_eq!(ws.entropy_wanted(), smolbox_core::ws::MASK_POOL_BYTES);
    let e = ws.send_binary(now, b"x").unwrap_err();
    assert_eq!(
        (e.category(), e.reason()),
        (Category::Validation, Reason::MaskEntropyExhausted)
    );
    // A ping with no entropy: the pong waits, then goes out with the next entropy.
    assert_eq!(
        feed(&mut ws, &server_frame(true, 0x9, b"a")),
        vec![Ev::Ping(b"a".to_vec())]
    );
    assert_eq!(
        feed(&mut ws, &server_frame(true, 0x9, b"b")),
        vec![Ev::Ping(b"b".to_vec())]
    );
    assert!(transmit(&mut ws).is_empty());
    ws.handle_entropy(&fixed_entropy(4));
    let frames = client_frames(&transmit(&mut ws));
    assert_eq!(frames.len(), 1, "only the latest ping is answered");
    assert_eq!(frames[0].payload, b"b");
    // Distinct keys come from distinct entropy bytes.
    ws.handle_entropy(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]);
    ws.send_binary(now, b"x").unwrap();
    let f = client_frames(&transmit(&mut ws));
    assert_eq!(f[0].header.mask, Some([1, 2, 3, 4]));
    assert_eq!(
        ws.send_binary(now, b"y").unwrap_err().reason(),
        Reason::MaskEntropyExhausted,
        "keys are kept for a close"
    );
    ws.close(now, CloseCode::NORMAL).unwrap();
    assert_eq!(
        client_frames(&transmit(&mut ws))[0].header.mask,
        Some([5, 6, 7, 8])
    );
}

#[test]
fn input_chunk_cap_at_n_and_n_plus_one() {
    let mut ws = open();
    let frame = server_frame(true, 0x2, &vec![7; MAX_INPUT_CHUNK - 4]);
    assert_eq!(frame.len(), MAX_INPUT_CHUNK);
    assert_eq!(feed(&mut ws, &frame).len(), 1);
    let e = ws
        .handle_input(t0(), &vec![0; MAX_INPUT_CHUNK + 1])
        .unwrap_err();
    assert_eq!(
        (e.category(), e.reason()),
        (Category::Validation, Reason::InputChunkTooLarge)
    );
    // Nothing was consumed: the connection is still usable.
    assert_eq!(
        feed(&mut ws, &server_frame(true, 0x2, b"ok")),
        vec![Ev::Binary(b"ok".to_vec())]
    );
}

/// The send buffer holds at most `MAX_PENDING_TRANSMIT` bytes, counting
/// a frame at its largest header (14 bytes): from an empty buffer a
/// message of `MAX_PENDING_TRANSMIT - 14` bytes is queued, one byte more is
/// refused (`admission_exhausted`, nothing queued), and a full buffer takes
/// more only once it was handed out.
#[test]
fn pending_transmit_at_n_and_n_plus_one() {
    let n = MAX_PENDING_TRANSMIT - 14;
    let mut ws = open();
    let e = ws.send_binary(t0(), &vec![1; n + 1]).unwrap_err();
    assert_eq!(
        (e.category(), e.evidence(), e.reason()),
        (
            Category::AdmissionExhausted,
            Evidence::NotDispatched,
            Reason::SendBufferFull
        )
    );
    let limit = e.limit().unwrap();
    assert_eq!(
        (limit.actual, limit.max),
        ((n + 15) as u64, MAX_PENDING_TRANSMIT as u64)
    );
    assert!(transmit(&mut ws).is_empty(), "nothing was queued");
    ws.send_binary(t0(), &vec![1; n]).unwrap();
    assert_eq!(
        ws.send_binary(t0(), b"x").unwrap_err().reason(),
        Reason::SendBufferFull
    );
    let frames = client_frames(&transmit(&mut ws));
    assert_eq!(frames.len(), 1);
    assert_eq!(frames[0].payload.len(), n);
    ws.send_binary(t0(), b"x").unwrap();
}

/// A ping's payload is a control payload: 125 bytes are sent, 126 refused.
#[test]
fn ping_payload_at_125_and_126() {
    let mut ws = open();
    ws.send_ping(t0(), &[7; 125]).unwrap();
    let frames = client_frames(&transmit(&mut ws));
    assert_eq!(frames.len(), 1);
    assert_eq!(frames[0].header.opcode, Opcode::Ping);
    assert_eq!(frames[0].payload, vec![7; 125]);
    let e = ws.send_ping(t0(), &[7; 126]).unwrap_err();
    assert_eq!(
        (e.category(), e.evidence(), e.reason()),
        (
            Category::Validation,
            Evidence::NotDispatched,
            Reason::PingPayloadTooLong
        )
    );
    assert_eq!(e.limit().map(|l| (l.actual, l.max)), Some((126, 125)));
    assert!(transmit(&mut ws).is_empty(), "nothing was queued");
}

#[test]
fn undrained_input_is_refused_without_consuming() {
    let mut ws = open();
    // 64 KiB of small frames, twice, without draining events.
    let chunk: Vec<u8> = (0..MAX_INPUT_CHUNK / 16)
        .flat_map(|_| server_frame(true, 0x2, &[5; 14]))
        .collect();
    assert_eq!(chunk.len(), MAX_INPUT_CHUNK);
    ws.handle_input(t0(), &chunk).unwrap();
    ws.handle_input(t0(), &chunk).unwrap();
    let e = ws.handle_input(t0(), &chunk).unwrap_err();
    assert_eq!(
        (e.category(), e.reason()),
        (Category::Validation, Reason::InputNotDrained)
    );
    // Draining frees the room, and nothing was lost or duplicated.
    assert_eq!(events(&mut ws).len(), 2 * MAX_INPUT_CHUNK / 16);
    assert_eq!(feed(&mut ws, &chunk).len(), MAX_INPUT_CHUNK / 16);
}

#[test]
fn events_never_print_payloads() {
    let mut ws = open();
    ws.handle_input(t0(), &server_frame(true, 0x2, b"SENTINEL-PAYLOAD"))
        .unwrap();
    let ev = ws.poll_event().unwrap();
    assert!(!format!("{ev:?}").contains("SENTINEL"));
    assert!(!format!("{ws:?}").contains("SENTINEL"));
}

#[test]
fn direct_reads_complete_large_frames_exactly() {
    let mut ws = open();
    let frame = server_frame(true, 0x2, &vec![9; 65_536]);
    let mut stream = frame.clone();
    stream.extend(&frame);
    let mut pos = 0;
    let mut reads = Vec::new();
    let mut got = Vec::new();
    while pos < stream.len() {
        let buf = ws.input_buffer();
        let n = buf.len().min(stream.len() - pos);
        buf[..n].copy_from_slice(&stream[pos..pos + n]);
        ws.handle_read(t0(), n).unwrap();
        reads.push(n);
        pos += n;
        got.extend(events(&mut ws));
    }
    // 64 KiB, then exactly the 10 bytes that finish the frame, twice.
    assert_eq!(reads, vec![65_536, 10, 65_536, 10]);
    assert_eq!(
        got,
        vec![Ev::Binary(vec![9; 65_536]), Ev::Binary(vec![9; 65_536])]
    );
    // Reporting more than was offered is refused.
    let offered = ws.input_buffer().len();
    assert_eq!(
        ws.handle_read(t0(), offered + 1).unwrap_err().reason(),
        Reason::ReadPastInputBuffer
    );
}

#[test]
fn transmit_data_supports_partial_writes() {
    let mut ws = open();
    ws.send_binary(t0(), b"abc").unwrap();
    ws.send_text(t0(), "de").unwrap();
    let all = ws.transmit_data().to_vec();
    assert_eq!(all.len(), 9 + 8);
    ws.consume_transmit(4);
    assert_eq!(ws.transmit_data(), &all[4..]);
    ws.send_binary(t0(), b"f").unwrap();
    let rest = transmit(&mut ws);
    let mut joined = all[..4].to_vec();
    joined.extend(rest);
    let frames = client_frames(&joined);
    let payloads: Vec<&[u8]> = frames.iter().map(|f| f.payload.as_slice()).collect();
    assert_eq!(payloads, vec![&b"abc"[..], b"de", b"f"]);
    assert!(ws.transmit_data().is_empty());
    assert_eq!(ws.poll_transmit(&mut Vec::new()), None);
}

#[test]
fn a_silent_peer_gets_a_ping_at_half_the_idle_timeout_and_fails_at_all_of_it() {
    let now = t0();
    let mut c = config();
    c.idle_timeout = Some(Duration::from_millis(1_000));
    let mut ws = open_client(c, now);
    assert_eq!(
        ws.poll_timeout(),
        Some((now + Duration::from_millis(500), WsTimer::Keepalive))
    );
    ws.handle_timeout(now + Duration::from_millis(500));
    let frames = client_frames(&transmit(&mut ws));
    assert_eq!(frames.len(), 1);
    assert_eq!(frames[0].header.opcode, Opcode::Ping);
    // Any byte from the peer counts as life and restarts the clock.
    let t1 = now + Duration::from_millis(700);
    ws.handle_input(t1, &server_frame(true, 0xa, b"")).unwrap();
    assert_eq!(events(&mut ws), vec![Ev::Pong(Vec::new())]);
    assert_eq!(
        ws.poll_timeout(),
        Some((t1 + Duration::from_millis(500), WsTimer::Keepalive))
    );
    ws.handle_timeout(t1 + Duration::from_millis(500));
    assert_eq!(client_frames(&transmit(&mut ws)).len(), 1, "one ping");
    let end = t1 + Duration::from_millis(1_000);
    assert_eq!(ws.poll_timeout(), Some((end, WsTimer::Idle)));
    // N − 1 ns: still open; N: failed with a timeout and a close 1001.
    ws.handle_timeout(end - Duration::from_nanos(1));
    assert!(ws.is_open());
    ws.handle_timeout(end);
    let e = failure(&events(&mut ws));
    assert_eq!(
        (e.category(), e.reason(), e.evidence()),
        (
            Category::Transport,
            Reason::IdleTimeout,
            Evidence::DispatchUncertain
        )
    );
    assert_eq!(sent_close(&mut ws), Some(1001));
}

#[test]
fn a_peer_that_stops_reading_fails_the_send_at_the_write_bound() {
    let now = t0();
    let mut c = config();
    c.write_wait = Some(Duration::from_millis(1_000));
    let mut ws = open_client(c, now);
    ws.handle_written(now, usize::MAX); // the handshake request went out
    assert_eq!(ws.poll_timeout(), None, "nothing pending, no write timer");
    ws.send_binary(now, &[1; 100]).unwrap();
    let handed = transmit(&mut ws).len();
    let stall = now + Duration::from_millis(1_000);
    assert_eq!(ws.poll_timeout(), Some((stall, WsTimer::WriteStall)));
    // Progress moves the bound.
    let t1 = now + Duration::from_millis(600);
    ws.handle_written(t1, 10);
    let stall = t1 + Duration::from_millis(1_000);
    assert_eq!(ws.poll_timeout(), Some((stall, WsTimer::WriteStall)));
    ws.handle_timeout(stall - Duration::from_nanos(1));
    assert!(ws.is_open());
    ws.handle_timeout(stall);
    let e = failure(&events(&mut ws));
    assert_eq!(
        (e.category(), e.reason(), e.evidence()),
        (
            Category::Transport,
            Reason::WriteTimeout,
            Evidence::DispatchUncertain
        )
    );
    // Nothing more to write: the shell drops the socket.
    assert!(ws.is_finished());
    assert!(transmit(&mut ws).is_empty());
    // Once all handed-out bytes are written, no bound runs.
    let mut c = config();
    c.write_wait = Some(Duration::from_millis(1_000));
    let mut ws = open_client(c, now);
    ws.send_binary(now, &[1; 100]).unwrap();
    ws.handle_written(now, usize::MAX);
    let n = transmit(&mut ws).len();
    assert_eq!(n, handed);
    ws.handle_written(now, n);
    assert_eq!(ws.poll_timeout(), None);
}

#[test]
fn a_ping_flood_to_a_slow_reader_keeps_the_send_buffer_bounded() {
    let mut ws = open();
    // 10,000 pings arrive while the socket takes nothing: at most one pong
    // waits in the send buffer and the latest is kept aside.
    for i in 0..10_000u32 {
        ws.handle_input(t0(), &server_frame(true, 0x9, &i.to_be_bytes()))
            .unwrap();
        let _ = events(&mut ws);
        assert!(ws.pending_transmit() <= 6 + 4, "ping {i}");
    }
    let frames = client_frames(&transmit(&mut ws));
    assert_eq!(frames.len(), 1);
    assert_eq!(
        frames[0].payload,
        0u32.to_be_bytes(),
        "the first ping's pong"
    );
    let frames = client_frames(&transmit(&mut ws));
    assert_eq!(frames.len(), 1);
    assert_eq!(
        frames[0].payload,
        9_999u32.to_be_bytes(),
        "then only the latest ping's"
    );
    assert!(transmit(&mut ws).is_empty());
}

#[test]
fn ws_timer_durations_at_n_and_n_plus_one() {
    use smolbox_core::ws::MAX_WS_TIMER;
    let over = MAX_WS_TIMER + Duration::from_nanos(1);
    type Set = fn(&mut WsConfig, Duration);
    let cases: [(Set, Reason); 4] = [
        (
            |c, d| c.idle_timeout = Some(d),
            Reason::IdleTimeoutOutOfRange,
        ),
        (|c, d| c.write_wait = Some(d), Reason::WriteWaitOutOfRange),
        (
            |c, d| c.handshake_timeout = d,
            Reason::HandshakeTimeoutOutOfRange,
        ),
        (|c, d| c.close_wait = d, Reason::CloseWaitOutOfRange),
    ];
    for (set, reason) in cases {
        let mut c = config();
        set(&mut c, MAX_WS_TIMER);
        assert!(c.validate().is_ok(), "{reason}");
        set(&mut c, over);
        assert_eq!(c.validate().unwrap_err().reason(), reason);
        set(&mut c, Duration::MAX);
        assert!(WsClient::new(c.clone(), KEY, t0()).is_err(), "no panic");
        set(&mut c, Duration::ZERO);
        assert_eq!(c.validate().unwrap_err().reason(), reason);
    }
}

/// Drains with `poll_binary_frames` first and `poll_event` for the rest,
/// the way a consumer of the batch path does.
fn events_batched(ws: &mut WsClient, stop_after: Option<usize>) -> Vec<Ev> {
    let mut out = Vec::new();
    loop {
        let mut batch = Vec::new();
        ws.poll_binary_frames(|b| {
            batch.push(Ev::Binary(b.to_vec()));
            stop_after.is_none_or(|n| batch.len() < n)
        });
        let lent = !batch.is_empty();
        out.extend(batch);
        match ws.poll_event() {
            Some(ev) => out.push(match ev {
                smolbox_core::ws::WsEvent::Binary(b) => Ev::Binary(b.to_vec()),
                smolbox_core::ws::WsEvent::Text(t) => Ev::Text(t.to_owned()),
                smolbox_core::ws::WsEvent::Ping(b) => Ev::Ping(b.to_vec()),
                smolbox_core::ws::WsEvent::Pong(b) => Ev::Pong(b.to_vec()),
                smolbox_core::ws::WsEvent::Closed(c) => Ev::Closed(c),
                smolbox_core::ws::WsEvent::Failed(e) => Ev::Failed(e),
                other => panic!("unexpected {other:?}"),
            }),
            None if lent => {}
            None => return out,
        }
    }
}

#[test]
fn the_binary_batch_lends_exactly_what_poll_event_would() {
    // Small and 16-bit-length binary frames, then frames the batch must
    // leave to the general path: text, a ping, a fragmented message, a
    // non-minimal length, an oversized frame (which fails the connection).
    let mut stream = Vec::new();
    for len in [0usize, 1, 16, 125, 126, 4_000] {
        stream.extend(server_frame(true, 0x2, &vec![len as u8; len]));
    }
    stream.extend(server_frame(true, 0x1, b"text"));
    stream.extend(server_frame(true, 0x2, b"after text"));
    stream.extend(server_frame(true, 0x9, b"ping"));
    stream.extend(server_frame(false, 0x2, b"frag-"));
    stream.extend(server_frame(true, 0x0, b"ment"));
    stream.extend(server_frame(true, 0x2, b"x"));
    // 5 bytes in the 16-bit form: not minimal, a protocol error.
    stream.extend([0x82, 126, 0, 5, b'a', b'b', b'c', b'd', b'e']);
    stream.extend(server_frame(true, 0x2, b"never"));

    let mut reference = open();
    reference.handle_input(t0(), &stream).unwrap();
    let want = events(&mut reference);
    assert!(matches!(want.last(), Some(Ev::Failed(_))), "{want:?}");
    for stop_after in [None, Some(1), Some(2)] {
        let mut ws = open();
        ws.handle_input(t0(), &stream).unwrap();
        assert_eq!(events_batched(&mut ws, stop_after), want, "{stop_after:?}");
    }

    // A partial frame is left in place until it is complete.
    let frame = server_frame(true, 0x2, &[7; 300]);
    let mut ws = open();
    ws.handle_input(t0(), &frame[..100]).unwrap();
    assert_eq!(ws.poll_binary_frames(|_| true), 0);
    ws.handle_input(t0(), &frame[100..]).unwrap();
    let mut got = Vec::new();
    assert_eq!(
        ws.poll_binary_frames(|b| {
            got.extend_from_slice(b);
            true
        }),
        1
    );
    assert_eq!(got, vec![7; 300]);
}

#[test]
fn the_binary_batch_respects_the_frame_cap() {
    let mut c = config();
    c.max_frame_len = 100;
    let mut ws = open_client(c, t0());
    ws.handle_input(t0(), &server_frame(true, 0x2, &[1; 100]))
        .unwrap();
    ws.handle_input(t0(), &server_frame(true, 0x2, &[2; 101]))
        .unwrap();
    assert_eq!(ws.poll_binary_frames(|b| b.len() == 100), 1);
    // The 101-byte frame is over the cap: left to the general path, which fails.
    assert_eq!(ws.poll_binary_frames(|_| true), 0);
    let evs = events(&mut ws);
    assert_eq!(failure(&evs).reason(), Reason::FrameTooLarge, "{evs:?}");
}
