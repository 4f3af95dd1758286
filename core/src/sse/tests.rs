//! Byte-in / event-out tests of the parser, and its any-split properties.

use crate::Reason;
use proptest::prelude::*;

use super::fuzz::{OwnedEvent, Transcript, run, sizes};
use super::*;
use crate::error::{Category, Evidence, Operation};

fn ev(event_type: &str, data: &str, id: &str) -> OwnedEvent {
    OwnedEvent {
        event_type: event_type.as_bytes().to_vec(),
        data: data.as_bytes().to_vec(),
        last_event_id: id.as_bytes().to_vec(),
    }
}

fn whole(input: &[u8]) -> Transcript {
    run(Config::default(), input, || usize::MAX)
}

fn events(input: &[u8]) -> Vec<OwnedEvent> {
    let t = whole(input);
    assert!(t.end.is_ok(), "{:?}", t.end);
    t.events
}

#[test]
fn lf_cr_and_crlf_all_end_lines() {
    let want = vec![ev("a", "1", ""), ev("b", "2", ""), ev("c", "3", "")];
    assert_eq!(
        events(b"event: a\ndata: 1\n\nevent: b\rdata: 2\r\revent: c\r\ndata: 3\r\n\r\n"),
        want
    );
}

#[test]
fn cr_and_lf_split_across_inputs_are_one_line_end() {
    let mut p = SseParser::new(Config::default());
    p.handle_input(b"data: x\r").unwrap();
    assert!(p.poll_event().unwrap().is_none());
    p.handle_input(b"\ndata: y\r").unwrap();
    assert!(p.poll_event().unwrap().is_none());
    p.handle_input(b"\n\r").unwrap();
    let e = p.poll_event().unwrap().unwrap();
    assert_eq!(e.data(), b"x\ny");
    assert!(p.poll_event().unwrap().is_none());
    // The LF after that last CR is part of its line end, not a second blank line.
    p.handle_input(b"\n").unwrap();
    assert!(p.poll_event().unwrap().is_none());
    assert_eq!(p.finish().unwrap(), StreamEnd::Clean);
}

#[test]
fn one_leading_bom_is_stripped_even_when_split() {
    let input = b"\xEF\xBB\xBFdata: a\n\n";
    for n in 1..input.len() {
        let t = run(Config::default(), input, || n);
        assert_eq!(t.events, vec![ev("message", "a", "")], "piece size {n}");
    }
    // A second BOM is part of the field name, so the line is ignored.
    assert_eq!(
        events(b"\xEF\xBB\xBF\xEF\xBB\xBFdata: a\n\ndata: b\n\n"),
        vec![ev("message", "b", "")]
    );
    // A BOM prefix that never completes is a partial frame at EOF.
    assert_eq!(whole(b"\xEF\xBB").end, Ok(StreamEnd::PartialFrame));
}

#[test]
fn comments_and_fields_with_and_without_colon() {
    assert_eq!(events(b": hi\n:\n\n"), vec![]);
    // `data` without a colon appends an empty line.
    assert_eq!(events(b"data\ndata\n\n"), vec![ev("message", "\n", "")]);
    assert_eq!(events(b"data\n\n"), vec![ev("message", "", "")]);
    // Only one leading space is stripped; no space is fine.
    assert_eq!(
        events(b"data:  two\ndata:none\n\n"),
        vec![ev("message", " two\nnone", "")]
    );
    // Unknown fields are ignored; field names are case-sensitive.
    assert_eq!(
        events(b"Data: x\nfoo: bar\ndata: y\n\n"),
        vec![ev("message", "y", "")]
    );
}

#[test]
fn multi_line_data_joins_with_lf_and_keeps_a_final_empty_line() {
    // worker-api.md TV18.
    assert_eq!(
        events(
            "event: stdout\ndata: café\ndata: \n\nevent: exit\ndata: {\"exitCode\":0}\n\n"
                .as_bytes()
        ),
        vec![
            ev("stdout", "café\n", ""),
            ev("exit", "{\"exitCode\":0}", "")
        ]
    );
}

#[test]
fn events_without_data_are_not_dispatched_and_reset_the_type() {
    assert_eq!(
        events(b"event: a\n\ndata: x\n\n"),
        vec![ev("message", "x", "")]
    );
    assert_eq!(events(b"id: 1\n\n"), vec![]);
}

#[test]
fn id_sets_last_event_id_unless_it_holds_nul() {
    let t = whole(b"id: 1\ndata: a\n\nid: 2\0x\ndata: b\n\nid\ndata: c\n\n");
    assert_eq!(
        t.events,
        vec![
            ev("message", "a", "1"),
            ev("message", "b", "1"),
            ev("message", "c", "")
        ]
    );
    assert_eq!(t.last_event_id, b"");
    // The id persists across events and is committed at a blank line even
    // when no event is dispatched.
    let t = whole(b"id: 7\n\ndata: z\n\n");
    assert_eq!(t.events, vec![ev("message", "z", "7")]);
    assert_eq!(t.last_event_id, b"7");
}

#[test]
fn retry_takes_only_ascii_digits() {
    assert_eq!(whole(b"retry: 1500\n\n").retry, Some(1500));
    assert_eq!(
        whole(b"retry: 1500\nretry: 15x\nretry: -1\nretry:\nretry: 1.5\n\n").retry,
        Some(1500)
    );
    assert_eq!(whole(b"retry: 99999999999999999999999\n\n").retry, None);
    assert_eq!(whole(b"retry:18446744073709551615\n").retry, Some(u64::MAX));
}

#[test]
fn trailing_partial_event_is_discarded_and_reported() {
    let t = whole(b"data: a\n\ndata: b\n");
    assert_eq!(t.events, vec![ev("message", "a", "")]);
    assert_eq!(t.end, Ok(StreamEnd::PartialFrame));
    assert_eq!(
        whole(b"data: a\n\ndata: b").end,
        Ok(StreamEnd::PartialFrame)
    );
    assert_eq!(whole(b"data: a\n\n:\n").end, Ok(StreamEnd::PartialFrame));
    assert_eq!(whole(b"data: a\n\n:\n\n").end, Ok(StreamEnd::Clean));
    assert_eq!(whole(b"").end, Ok(StreamEnd::Clean));
}

#[test]
fn finish_is_idempotent_and_later_input_is_refused() {
    let mut p = SseParser::new(Config::default());
    p.handle_input(b"data: x").unwrap();
    assert_eq!(p.finish(), Ok(StreamEnd::PartialFrame));
    assert_eq!(p.finish(), Ok(StreamEnd::PartialFrame));
    assert!(p.is_finished());
    let e = p.handle_input(b"\n\n").unwrap_err();
    assert_eq!(e.reason(), Reason::SseInputAfterFinish);
    assert!(p.poll_event().unwrap().is_none());
}

#[test]
fn raw_bytes_are_kept_until_the_caller_asks() {
    let mut p = SseParser::new(Config::default());
    p.handle_input(b"data: a\xffb\n\n").unwrap();
    let e = p.poll_event().unwrap().unwrap();
    assert_eq!(e.data(), b"a\xffb");
    assert!(e.data_str().is_err());
    assert_eq!(e.data_lossy(), "a\u{fffd}b");
    assert_eq!(e.event_type(), b"message");
}

#[test]
fn event_debug_prints_no_data() {
    let mut p = SseParser::new(Config::default());
    p.handle_input(b"id: SENTINEL-ID\ndata: SENTINEL-DATA\n\n")
        .unwrap();
    let e = p.poll_event().unwrap().unwrap();
    let d = format!("{e:?}");
    assert!(!d.contains("SENTINEL"), "{d}");
    let d = format!("{p:?}");
    assert!(!d.contains("SENTINEL"), "{d}");
}

fn small(max_line_len: usize, max_event_len: usize) -> Config {
    Config {
        max_line_len,
        max_event_len,
        max_chunk_len: usize::MAX,
        operation: Operation::Sse,
    }
}

#[test]
fn line_cap_at_n_and_n_plus_one() {
    let line = |n: usize| {
        let mut v = b"data:".to_vec();
        v.resize(n, b'x');
        v.extend_from_slice(b"\n\n");
        v
    };
    let cfg = small(16, 1000);
    assert_eq!(run(cfg, &line(16), || usize::MAX).events.len(), 1);
    let t = run(cfg, &line(17), || usize::MAX);
    let e = t.end.unwrap_err();
    assert_eq!(
        (e.category(), e.evidence(), e.reason()),
        (
            Category::OutputLimit,
            Evidence::DispatchUncertain,
            Reason::SseLineTooLong
        )
    );
    assert_eq!(e.limit().map(|l| (l.actual, l.max)), Some((17, 16)));
    // An incomplete line over the cap fails as soon as its 17th byte is in.
    let mut p = SseParser::new(cfg);
    p.handle_input(&[b'x'; 16]).unwrap();
    assert!(p.poll_event().unwrap().is_none());
    p.handle_input(b"x").unwrap();
    assert_eq!(p.poll_event().unwrap_err().reason(), Reason::SseLineTooLong);
    // Sticky.
    assert_eq!(
        p.handle_input(b"\n").unwrap_err().reason(),
        Reason::SseLineTooLong
    );
    assert_eq!(p.finish().unwrap_err().reason(), Reason::SseLineTooLong);
}

#[test]
fn event_cap_at_n_and_n_plus_one_counts_line_ends_and_incomplete_frames() {
    // "data: 123\n" is 10 bytes; two such lines make a 20-byte frame.
    let frame = b"data: 123\ndata: 456\n\n";
    assert_eq!(run(small(100, 20), frame, || usize::MAX).events.len(), 1);
    let e = run(small(100, 19), frame, || usize::MAX).end.unwrap_err();
    assert_eq!(e.reason(), Reason::SseEventTooLarge);
    assert_eq!(e.limit().map(|l| (l.actual, l.max)), Some((20, 19)));
    // Incomplete frames count too, and comments are part of the frame.
    let e = run(small(100, 20), b":0123456789\ndata: 456", || 3)
        .end
        .unwrap_err();
    assert_eq!(e.reason(), Reason::SseEventTooLarge);
    assert_eq!(
        run(small(100, 20), b":0123456789\ndata: 45", || 3).end,
        Ok(StreamEnd::PartialFrame)
    );
    // A blank line resets the frame count.
    let many = b"data: 123\n\ndata: 456\n\ndata: 789\n\n";
    assert_eq!(run(small(100, 10), many, || 1).events.len(), 3);
}

#[test]
fn when_both_caps_are_crossed_the_earlier_byte_decides() {
    // Frame already 15 bytes; the next line crosses the event cap (20) at its
    // 6th byte and the line cap (14) at its 15th: the event cap wins at any chunking.
    let input = b"data: 01234567\ndata: 0123456789";
    for n in 1..=input.len() {
        let e = run(small(14, 20), input, || n).end.unwrap_err();
        assert_eq!(e.reason(), Reason::SseEventTooLarge, "piece size {n}");
    }
    // Line cap crossed first.
    let input = b"data: 0123456789012";
    for n in 1..=input.len() {
        let e = run(small(10, 15), input, || n).end.unwrap_err();
        assert_eq!(e.reason(), Reason::SseLineTooLong, "piece size {n}");
    }
}

#[test]
fn chunk_cap_at_n_and_n_plus_one() {
    let cfg = Config {
        max_chunk_len: 8,
        ..Config::default()
    };
    let mut p = SseParser::new(cfg);
    p.handle_input(b"data: 12").unwrap();
    let e = p.handle_input(b"data: 123").unwrap_err();
    assert_eq!(
        (e.category(), e.reason()),
        (Category::OutputLimit, Reason::SseChunkTooLarge)
    );
    assert_eq!(e.limit().map(|l| (l.actual, l.max)), Some((9, 8)));
    assert_eq!(p.poll_event().unwrap_err(), e);
}

#[test]
fn errors_can_be_attributed_to_the_caller_operation() {
    let cfg = Config {
        max_line_len: 2,
        operation: Operation::ExecStream,
        ..Config::default()
    };
    let e = run(cfg, b"abc", || 1).end.unwrap_err();
    assert_eq!(e.operation(), Operation::ExecStream);
    assert_eq!(
        e.with_operation(Operation::Logs).operation(),
        Operation::Logs
    );
}

#[test]
fn long_line_in_small_pieces_is_one_event() {
    let mut input = b"data: ".to_vec();
    input.extend(std::iter::repeat_n(b'z', 200_000));
    input.extend_from_slice(b"\n\n");
    let cfg = Config {
        max_line_len: 262_144,
        max_event_len: 262_144,
        ..Config::default()
    };
    let t = run(cfg, &input, || 1460);
    assert_eq!(t.events.len(), 1);
    assert_eq!(t.events[0].data.len(), 200_000);
}

#[test]
fn work_is_linear_whatever_the_chunking() {
    // One 200 KB line fed a byte at a time, then many short events fed a
    // byte at a time: rescanning the unchanged prefix would be quadratic.
    let mut input = b"data: ".to_vec();
    input.extend(std::iter::repeat_n(b'z', 200_000));
    input.extend_from_slice(b"\r\n\r\n");
    for _ in 0..2_000 {
        input.extend_from_slice(b"event: stdout\ndata: hi\ndata: \n\n");
    }
    let cfg = Config {
        max_line_len: 262_144,
        max_event_len: 262_144,
        ..Config::default()
    };
    for piece in [1, 7, 1460, 4096] {
        let mut p = SseParser::new(cfg);
        let mut n = 0;
        for chunk in input.chunks(piece) {
            p.handle_input(chunk).unwrap();
            while p.poll_event().unwrap().is_some() {
                n += 1;
            }
        }
        assert_eq!(n, 2_001);
        assert!(
            p.work <= 2 * input.len(),
            "piece {piece}: {} for {}",
            p.work,
            input.len()
        );
    }
}

#[test]
fn buffers_are_reused_across_events() {
    let mut p = SseParser::new(Config::default());
    let frame = b"event: stdout\ndata: 0123456789abcdef\n\n";
    for _ in 0..4 {
        p.handle_input(frame).unwrap();
        while p.poll_event().unwrap().is_some() {}
    }
    let caps = (p.buf.capacity(), p.data.capacity(), p.event_type.capacity());
    for _ in 0..1000 {
        p.handle_input(frame).unwrap();
        while p.poll_event().unwrap().is_some() {}
    }
    assert_eq!(
        caps,
        (p.buf.capacity(), p.data.capacity(), p.event_type.capacity())
    );
}

#[test]
fn fuzz_body_survives_simple_inputs() {
    for input in [
        &b""[..],
        b"\x00",
        b"\x05data: x\r\n\r\n",
        b"\xffretry: 10\nid: \x00\n\n\xEF\xBB\xBF",
    ] {
        fuzz_sse(input);
    }
}

fn sse_stream() -> impl Strategy<Value = Vec<u8>> {
    let piece = prop_oneof![
        Just(&b"\n"[..]),
        Just(&b"\r"[..]),
        Just(&b"\r\n"[..]),
        Just(&b"data"[..]),
        Just(&b"data: "[..]),
        Just(&b"event: "[..]),
        Just(&b"id: "[..]),
        Just(&b"retry: "[..]),
        Just(&b":"[..]),
        Just(&b" "[..]),
        Just("é".as_bytes()),
        Just(&b"\xEF\xBB\xBF"[..]),
        Just(&b"\x00"[..]),
        Just(&b"\xff"[..]),
        Just(&b"12"[..]),
        Just(&b"stdout"[..]),
        Just(&b"xyz"[..]),
    ];
    prop::collection::vec(piece, 0..60).prop_map(|v| v.concat())
}

proptest! {
    // Each case already tries every split point; 96 cases keep `cargo test` quick.
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn any_split_gives_identical_events_and_verdicts(
        input in sse_stream(),
        seed in any::<u64>(),
        max_line in 4usize..40,
        max_event in 8usize..80,
    ) {
        let cfg = small(max_line, max_event);
        let one = run(cfg, &input, || usize::MAX);
        prop_assert_eq!(&one, &run(cfg, &input, sizes(seed, 23)));
        prop_assert_eq!(&one, &run(cfg, &input, || 1));
        let roomy = Config { max_chunk_len: usize::MAX, ..Config::default() };
        let one = run(roomy, &input, || usize::MAX);
        prop_assert_eq!(&one, &run(roomy, &input, sizes(seed, 23)));
    }

    #[test]
    fn every_two_piece_split_matches(input in sse_stream()) {
        let cfg = small(24, 48);
        let one = run(cfg, &input, || usize::MAX);
        for at in 1..input.len() {
            let mut first = true;
            let t = run(cfg, &input, || if std::mem::take(&mut first) { at } else { usize::MAX });
            prop_assert_eq!(&one, &t, "split at {}", at);
        }
    }
}
