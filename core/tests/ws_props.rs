//! Property tests: any split of the input gives the same events and the
//! same verdict; encode → decode round-trips; timers act exactly when
//! `poll_timeout` says.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod ws_support;

use std::time::Duration;

use proptest::prelude::*;
use smolbox_core::terminal::{Next, TerminalConfig, TerminalSession, TerminalSpec, TerminalTimer};
use smolbox_core::ws::frame::{Opcode, encode_header, parse_any_header};
use smolbox_core::ws::mask::{apply_mask, extend_masked};
use smolbox_core::ws::{MAX_INPUT_CHUNK, WsClient, WsConfig};
use ws_support::*;

fn config() -> WsConfig {
    let mut c = WsConfig::new("localhost", "/p");
    c.max_message_len = 8_192;
    c
}

/// One server frame: (fin, opcode, payload).
fn frame_strategy() -> impl Strategy<Value = (bool, u8, Vec<u8>)> {
    prop_oneof![
        4 => (any::<bool>(), Just(0x2u8), proptest::collection::vec(any::<u8>(), 0..3_000)),
        2 => (any::<bool>(), Just(0x0u8), proptest::collection::vec(any::<u8>(), 0..3_000)),
        2 => (any::<bool>(), Just(0x1u8), "[a-zé€]{0,40}".prop_map(String::into_bytes)),
        1 => (Just(true), Just(0x9u8), proptest::collection::vec(any::<u8>(), 0..126)),
        1 => (Just(true), Just(0xau8), proptest::collection::vec(any::<u8>(), 0..126)),
        1 => (Just(true), Just(0x8u8), proptest::collection::vec(any::<u8>(), 0..4)),
    ]
}

/// Feeds `bytes` in the given chunk sizes (cycled) and returns every event
/// and everything transmitted.
fn run(bytes: &[u8], sizes: &[usize]) -> (Vec<Ev>, Vec<u8>) {
    let now = t0();
    let mut ws = WsClient::new(config(), KEY, now).unwrap();
    ws.handle_entropy(&fixed_entropy(4_096));
    transmit(&mut ws);
    let mut all = reply_101("");
    all.extend_from_slice(bytes);
    let mut evs = Vec::new();
    let mut sent = Vec::new();
    let mut rest = &all[..];
    let mut i = 0;
    while !rest.is_empty() {
        let n = sizes[i % sizes.len()]
            .clamp(1, MAX_INPUT_CHUNK)
            .min(rest.len());
        i += 1;
        if ws.handle_input(now, &rest[..n]).is_err() {
            break;
        }
        rest = &rest[n..];
        evs.extend(events(&mut ws));
        sent.extend(transmit(&mut ws));
    }
    ws.handle_eof(now);
    evs.extend(events(&mut ws));
    sent.extend(transmit(&mut ws));
    (evs, sent)
}

/// A sent frame, unmasked: FIN, opcode, payload.
type SentFrame = (bool, u8, Vec<u8>);

/// What must not depend on how the input was split: every event, and the
/// frames we sent other than pongs (unmasked). Pongs are coalesced to the
/// latest ping not yet answered, so how many go out depends on when the
/// shell drains transmits; each one sent must echo a ping received.
fn same_up_to_pongs((evs, sent): (Vec<Ev>, Vec<u8>)) -> (Vec<Ev>, Vec<SentFrame>) {
    let pings: Vec<&Vec<u8>> = evs
        .iter()
        .filter_map(|e| match e {
            Ev::Ping(p) => Some(p),
            _ => None,
        })
        .collect();
    let mut frames = Vec::new();
    for f in client_frames(&sent) {
        if f.header.opcode == Opcode::Pong {
            assert!(pings.contains(&&f.payload), "a pong that echoes no ping");
        } else {
            frames.push((f.header.fin, f.header.opcode as u8, f.payload));
        }
    }
    (evs, frames)
}

/// As [`run`], reading straight into `input_buffer` with at most the
/// given sizes per read.
fn run_direct(bytes: &[u8], sizes: &[usize]) -> (Vec<Ev>, Vec<u8>) {
    let now = t0();
    let mut ws = WsClient::new(config(), KEY, now).unwrap();
    ws.handle_entropy(&fixed_entropy(4_096));
    transmit(&mut ws);
    let mut all = reply_101("");
    all.extend_from_slice(bytes);
    let mut evs = Vec::new();
    let mut sent = Vec::new();
    let mut rest = &all[..];
    let mut i = 0;
    while !rest.is_empty() {
        let buf = ws.input_buffer();
        if buf.is_empty() {
            break;
        }
        let n = sizes[i % sizes.len()].clamp(1, buf.len()).min(rest.len());
        i += 1;
        buf[..n].copy_from_slice(&rest[..n]);
        if ws.handle_read(now, n).is_err() {
            break;
        }
        rest = &rest[n..];
        evs.extend(events(&mut ws));
        sent.extend(transmit(&mut ws));
    }
    ws.handle_eof(now);
    evs.extend(events(&mut ws));
    sent.extend(transmit(&mut ws));
    (evs, sent)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn any_split_gives_the_same_events(
        frames in proptest::collection::vec(frame_strategy(), 0..12),
        sizes in proptest::collection::vec(1usize..5_000, 1..8),
    ) {
        let bytes: Vec<u8> = frames.iter().flat_map(|(fin, op, p)| server_frame(*fin, *op, p)).collect();
        let whole = same_up_to_pongs(run(&bytes, &[MAX_INPUT_CHUNK]));
        let split = same_up_to_pongs(run(&bytes, &sizes));
        prop_assert_eq!(&whole, &split);
        prop_assert_eq!(&whole, &same_up_to_pongs(run_direct(&bytes, &sizes)));
        prop_assert_eq!(&whole, &same_up_to_pongs(run_direct(&bytes, &[MAX_INPUT_CHUNK])));
        let bytewise = same_up_to_pongs(run(&bytes[..bytes.len().min(2_000)], &[1]));
        let prefix = same_up_to_pongs(run(&bytes[..bytes.len().min(2_000)], &[MAX_INPUT_CHUNK]));
        prop_assert_eq!(bytewise, prefix);
    }

    #[test]
    fn arbitrary_bytes_get_the_same_verdict_whatever_the_split(
        bytes in proptest::collection::vec(any::<u8>(), 0..4_000),
        sizes in proptest::collection::vec(1usize..300, 1..6),
    ) {
        let whole = run(&bytes, &[MAX_INPUT_CHUNK]);
        prop_assert_eq!(&whole, &run(&bytes, &sizes));
        prop_assert_eq!(&whole, &run_direct(&bytes, &sizes));
    }

    #[test]
    fn fuzz_bodies_never_panic(data in proptest::collection::vec(any::<u8>(), 0..3_000)) {
        smolbox_core::ws::fuzz_ws_frames(&data);
        smolbox_core::terminal::fuzz_terminal(&data);
    }

    #[test]
    fn encode_then_decode_round_trips(
        payload in proptest::collection::vec(any::<u8>(), 0..70_000),
        mask in any::<[u8; 4]>(),
        text in any::<bool>(),
    ) {
        let now = t0();
        let mut ws = WsClient::new(config(), KEY, now).unwrap();
        ws.handle_entropy(&mask.repeat(1_024));
        transmit(&mut ws);
        ws.handle_input(now, &reply_101("")).unwrap();
        events(&mut ws);
        let opcode = if text {
            let s = String::from_utf8_lossy(&payload).into_owned();
            ws.send_text(now, &s).unwrap();
            (Opcode::Text, s.into_bytes())
        } else {
            ws.send_binary(now, &payload).unwrap();
            (Opcode::Binary, payload.clone())
        };
        let frames = client_frames(&transmit(&mut ws));
        prop_assert_eq!(frames.len(), 1);
        prop_assert_eq!(frames[0].header.opcode, opcode.0);
        prop_assert_eq!(frames[0].header.mask, Some(mask));
        prop_assert!(frames[0].header.fin);
        prop_assert_eq!(&frames[0].payload, &opcode.1);
        // And the unmasked server form decodes to the same payload.
        if payload.len() <= 65_536 {
            let mut c = config();
            c.max_message_len = 65_536;
            let mut ws = open_client(c, now);
            let mut evs = Vec::new();
            for chunk in server_frame(true, 0x2, &payload).chunks(MAX_INPUT_CHUNK) {
                ws.handle_input(now, chunk).unwrap();
                evs.extend(events(&mut ws));
            }
            prop_assert_eq!(evs, vec![Ev::Binary(payload.clone())]);
        }
    }

    #[test]
    fn header_encoding_round_trips(len in 0usize..200_000, fin in any::<bool>(), mask in proptest::option::of(any::<[u8; 4]>())) {
        let mut out = Vec::new();
        encode_header(&mut out, fin, Opcode::Binary, len, mask);
        let h = parse_any_header(&out).unwrap();
        prop_assert_eq!((h.fin, h.payload_len, h.mask, h.header_len), (fin, len as u64, mask, out.len()));
    }

    #[test]
    fn masking_is_an_involution(data in proptest::collection::vec(any::<u8>(), 0..10_000), mask in any::<[u8; 4]>()) {
        let mut out = Vec::new();
        extend_masked(&mut out, &data, mask);
        apply_mask(&mut out, mask);
        prop_assert_eq!(out, data);
    }

    #[test]
    fn terminal_any_split_same_output_and_outcome(
        outputs in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 1..600), 0..30),
        code in -2i32..300,
        sizes in proptest::collection::vec(1usize..2_000, 1..6),
        buffer in 1_024usize..8_192,
    ) {
        let mut bytes: Vec<u8> = outputs.iter().flat_map(|o| server_frame(true, 0x2, o)).collect();
        bytes.extend(server_frame(true, 0x1, format!(r#"{{"type":"exit","code":{code}}}"#).as_bytes()));
        bytes.extend(server_frame(true, 0x8, &[]));
        let a = terminal_run(&bytes, &[MAX_INPUT_CHUNK], buffer);
        let b = terminal_run(&bytes, &sizes, buffer);
        prop_assert_eq!(&a, &b);
        // A confirmed exit only ever comes from the worker's own code.
        if let Ok(exit) = &a.1 {
            prop_assert_eq!(exit.code, code);
            prop_assert!((0..=255).contains(&code) && code != 124 && code != 130);
        }
    }

    #[test]
    fn timers_act_exactly_at_poll_timeout(
        session in 1_000u64..5_000,
        idle in 1_000u64..5_000,
        attach in 100u64..5_000,
    ) {
        let spec = TerminalSpec {
            session_budget: Duration::from_millis(session.max(idle)),
            idle_budget: Duration::from_millis(idle),
            attach_wait: Duration::from_millis(attach),
            ..TerminalSpec::default()
        };
        let now = t0();
        let mut s = TerminalSession::new(&spec, TerminalConfig::new("localhost", "dev"), KEY, now).unwrap();
        s.handle_entropy(&fixed_entropy(4_096));
        let mut out = Vec::new();
        // Every transmit is written at once (as a shell reports it): the
        // write bound never fires here.
        let _ = s.poll_transmit(&mut out);
        s.handle_written(now, out.len());
        s.handle_input(now, &reply_101("")).unwrap();
        let (mut at, mut timer) = s.poll_timeout().unwrap();
        // The keepalive ping at half the idle budget does not end anything.
        while timer == TerminalTimer::Liveness {
            s.handle_timeout(at);
            prop_assert!(s.outcome().is_none());
            out.clear();
            let _ = s.poll_transmit(&mut out);
            s.handle_written(at, out.len());
            (at, timer) = s.poll_timeout().unwrap();
        }
        s.handle_timeout(at - Duration::from_nanos(1));
        prop_assert!(s.outcome().is_none());
        s.handle_timeout(at);
        prop_assert!(s.outcome().is_some());
    }
}

fn terminal_run(
    bytes: &[u8],
    sizes: &[usize],
    buffer: usize,
) -> (
    Vec<u8>,
    Result<smolbox_core::terminal::TerminalExit, smolbox_core::Error>,
) {
    let now = t0();
    let spec = TerminalSpec {
        max_buffer_bytes: buffer,
        ..TerminalSpec::default()
    };
    let mut s =
        TerminalSession::new(&spec, TerminalConfig::new("localhost", "dev"), KEY, now).unwrap();
    s.handle_entropy(&fixed_entropy(4_096));
    let mut out = Vec::new();
    let _ = s.poll_transmit(&mut out);
    s.handle_input(now, &reply_101("")).unwrap();
    let mut rest = bytes;
    let mut i = 0;
    // A stalled consumer: everything arrives before the first pull, later
    // than the read grace after the open (which counts as a pull).
    let late = now + smolbox_core::terminal::READ_GRACE;
    while !rest.is_empty() {
        let n = sizes[i % sizes.len()].min(rest.len());
        i += 1;
        s.handle_input(late, &rest[..n]).unwrap();
        rest = &rest[n..];
    }
    let mut output = Vec::new();
    loop {
        match s.next(late, late) {
            Next::Output(b) => output.extend_from_slice(b),
            Next::Closed(r) => return (output, r),
            other => panic!("unexpected {other:?}"),
        }
    }
}
