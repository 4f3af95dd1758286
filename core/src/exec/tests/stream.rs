use crate::Reason;
use proptest::prelude::*;

use crate::error::{Category, Evidence, Operation};
use crate::exec::fuzz::{OwnedEvent, Transcript, run};
use crate::exec::*;
use crate::sse::fuzz_sizes;

const TV18: &[u8] =
    "event: stdout\ndata: café\ndata: \n\nevent: exit\ndata: {\"exitCode\":0}\n\n".as_bytes();
const TV19: &[u8] = b"event: stdout\ndata: hi\ndata: \n\nevent: stderr\ndata: boom\ndata: \n\nevent: exit\ndata: {\"exitCode\":3}\n\n";
const TV20: &[u8] =
    b"event: stdout\ndata: a\rdata: \ndata: b\n\nevent: exit\ndata: {\"exitCode\":0}\n\n";
const TV21_TAIL: &[u8] = b"event: stdout\ndata: yyyyyyyy\n\nevent: error\ndata: {\"message\":\"streaming output exceeded 11534336 byte cap; exec terminated (output truncated)\"}\n\n";
const TV21_SETUP: &[u8] =
    b"event: error\ndata: {\"message\":\"Agent { operation: \"run\", kind: Other }\"}\n\n";

fn whole(input: &[u8]) -> Transcript {
    run(OutputAllowance::DEFAULT, input, || usize::MAX)
}

fn out(s: &str) -> OwnedEvent {
    OwnedEvent::Stdout(s.into())
}

fn err(s: &str) -> OwnedEvent {
    OwnedEvent::Stderr(s.into())
}

fn protocol_reason(input: &[u8]) -> Reason {
    let e = whole(input).end.unwrap_err();
    assert_eq!(
        (e.category(), e.evidence(), e.operation()),
        (
            Category::Protocol,
            Evidence::DispatchUncertain,
            Operation::ExecStream
        ),
        "{e:?}"
    );
    e.reason()
}

#[test]
fn tv18_normal_completion() {
    let t = whole(TV18);
    assert_eq!(t.events, vec![out("café\n"), OwnedEvent::Exit(0)]);
    assert_eq!(t.end, Ok(0));
}

#[test]
fn tv19_mixed_streams_failure_exit_and_keep_alives() {
    let t = whole(TV19);
    assert_eq!(
        t.events,
        vec![out("hi\n"), err("boom\n"), OwnedEvent::Exit(3)]
    );
    assert_eq!(t.end, Ok(3));
    // A keep-alive comment may appear between any two events, and first.
    let mut with_keepalive = b":\n\n".to_vec();
    for frame in TV19
        .split_inclusive(|&b| b == b'\n')
        .collect::<Vec<_>>()
        .split_inclusive(|l| *l == b"\n")
    {
        with_keepalive.extend(frame.concat());
        with_keepalive.extend_from_slice(b":\n\n");
    }
    assert_eq!(whole(&with_keepalive), t);
}

#[test]
fn tv20_carriage_returns_decode_as_whatwg_says() {
    let t = whole(TV20);
    assert_eq!(t.events, vec![out("a\n\nb"), OwnedEvent::Exit(0)]);
}

#[test]
fn tv21_worker_output_cap_is_an_output_limit_without_exit() {
    let t = whole(TV21_TAIL);
    assert_eq!(t.events, vec![out("yyyyyyyy")]);
    let e = t.end.unwrap_err();
    assert_eq!(
        (e.category(), e.evidence(), e.operation(), e.reason()),
        (
            Category::OutputLimit,
            Evidence::DispatchUncertain,
            Operation::ExecStream,
            Reason::WorkerOutputCap
        )
    );
    // The setup failure's message is invalid JSON: still a failure, closed.
    assert_eq!(protocol_reason(TV21_SETUP), Reason::WorkerErrorEvent);
    assert_eq!(
        protocol_reason(b"event: error\ndata: {\"message\":\"x\"}\n\n"),
        Reason::WorkerErrorEvent
    );
    assert_eq!(
        protocol_reason(b"event: error\ndata: not json\ndata: at all\n\n"),
        Reason::WorkerErrorEvent
    );
    // An error event is terminal at once, even if an exit follows.
    let mut s = TV21_SETUP.to_vec();
    s.extend_from_slice(b"event: exit\ndata: {\"exitCode\":0}\n\n");
    assert_eq!(protocol_reason(&s), Reason::WorkerErrorEvent);
}

#[test]
fn ac_5_3_2_contract_violations_are_protocol() {
    let exit = b"event: exit\ndata: {\"exitCode\":0}\n\n";
    let twice = [&exit[..], exit].concat();
    assert_eq!(protocol_reason(&twice), Reason::SecondExit);
    let after = [&exit[..], b"event: stdout\ndata: x\n\n"].concat();
    assert_eq!(protocol_reason(&after), Reason::OutputAfterExit);
    let after = [&exit[..], b"event: stderr\ndata: x\n\n"].concat();
    assert_eq!(protocol_reason(&after), Reason::OutputAfterExit);
    let after = [&exit[..], TV21_SETUP].concat();
    assert_eq!(protocol_reason(&after), Reason::ErrorAfterExit);
    for bad in [
        &b"{\"exitCode\": \"0\"}"[..],
        b"{\"exitCode\":2147483648}",
        b"{\"exitCode\":0,\"x\":1}",
        b"{}",
        b"0",
        b"{\"exitCode\":0",
    ] {
        let s = [&b"event: exit\ndata: "[..], bad, b"\n\n"].concat();
        assert_eq!(
            protocol_reason(&s),
            Reason::ExitInvalid,
            "{:?}",
            String::from_utf8_lossy(bad)
        );
    }
    assert_eq!(
        whole(b"event: exit\ndata: {\"exitCode\":-2147483648}\n\n").end,
        Ok(i32::MIN)
    );
    assert_eq!(
        protocol_reason(b"event: stdout\ndata: a\xffb\n\n"),
        Reason::OutputInvalidUtf8
    );
    assert_eq!(
        protocol_reason(b"event: stdout\ndata: hi\n\n"),
        Reason::EofWithoutExit
    );
    assert_eq!(protocol_reason(b""), Reason::EofWithoutExit);
    assert_eq!(
        protocol_reason(b"event: stdout\ndata: hi\n\nevent: exit\ndata: {\"exitCode\":0}\n"),
        Reason::EofWithoutExit
    );
    let partial = [&exit[..], b"event: stdout\n"].concat();
    assert_eq!(protocol_reason(&partial), Reason::EofInsideFrame);
    let partial = [&exit[..], b":"].concat();
    assert_eq!(protocol_reason(&partial), Reason::EofInsideFrame);
}

#[test]
fn utf8_split_across_chunks_is_valid_once_complete() {
    // "é" is c3 a9; the cut falls inside it.
    let cut = TV18.iter().position(|&b| b == 0xa9).unwrap();
    let mut first = true;
    let t = run(OutputAllowance::DEFAULT, TV18, || {
        if std::mem::take(&mut first) {
            cut
        } else {
            usize::MAX
        }
    });
    assert_eq!(t, whole(TV18));
}

#[test]
fn unknown_types_comments_and_empty_events_are_ignored() {
    let s = b": hello\n\nevent: progress\ndata: 50%\n\nevent: stdout\n\nevent: stdout\ndata\n\nid: 1\nretry: 5\nevent: stdout\ndata: x\n\nevent: exit\ndata: {\"exitCode\":0}\n\nevent: other\ndata: y\n\n";
    let t = whole(s);
    assert_eq!(t.events, vec![out("x"), OwnedEvent::Exit(0)]);
    assert_eq!(t.end, Ok(0));
}

#[test]
fn ac_5_3_3_chunk_cap_at_n_and_n_plus_one() {
    let mut d = ExecStreamDecoder::new(OutputAllowance::DEFAULT);
    // A full-size chunk is taken; this one is a single comment line over
    // the frame cap, which the next poll reports.
    d.handle_input(&vec![b':'; MAX_STREAM_CHUNK_LEN]).unwrap();
    assert_eq!(d.poll_event().unwrap_err().reason(), Reason::SseLineTooLong);
    let mut d = ExecStreamDecoder::new(OutputAllowance::DEFAULT);
    let mut chunk = Vec::new();
    while chunk.len() + 4 <= MAX_STREAM_CHUNK_LEN {
        chunk.extend_from_slice(b":\n\n\n");
    }
    chunk.resize(MAX_STREAM_CHUNK_LEN, b'\n');
    d.handle_input(&chunk).unwrap();
    assert_eq!(d.poll_event(), Ok(None));
    chunk.push(b'\n');
    let e = d.handle_input(&chunk).unwrap_err();
    assert_eq!(
        (e.category(), e.evidence(), e.operation()),
        (
            Category::OutputLimit,
            Evidence::DispatchUncertain,
            Operation::ExecStream
        )
    );
    assert_eq!(
        e.limit().map(|l| (l.actual, l.max)),
        Some((262_145, 262_144))
    );
    assert_eq!(d.poll_event().unwrap_err(), e);
    assert_eq!(d.finish().unwrap_err(), e);
}

fn frame_of(len: usize) -> Vec<u8> {
    // "event: stdout\n" (14) + "data: " + payload + "\n": frame = 14 + 7 + payload.
    let mut f = b"event: stdout\ndata: ".to_vec();
    f.resize(len - 1, b'x');
    f.extend_from_slice(b"\n\n");
    f
}

#[test]
fn ac_5_3_3_frame_cap_at_n_and_n_plus_one_even_incomplete() {
    let allowance = OutputAllowance::new(MAX_OUTPUT_BYTES).unwrap();
    let exit = b"event: exit\ndata: {\"exitCode\":0}\n\n";
    let ok = [frame_of(MAX_STREAM_FRAME_LEN), exit.to_vec()].concat();
    let t = run(allowance, &ok, || 4096);
    assert_eq!(t.end, Ok(0));
    let over = [frame_of(MAX_STREAM_FRAME_LEN + 1), exit.to_vec()].concat();
    let e = run(allowance, &over, || 4096).end.unwrap_err();
    assert_eq!(
        (e.category(), e.evidence()),
        (Category::OutputLimit, Evidence::DispatchUncertain)
    );
    assert_eq!(
        e.limit().map(|l| (l.actual, l.max)),
        Some((131_073, 131_072))
    );
    // An incomplete frame over the cap fails before its end arrives.
    let incomplete = &over[..MAX_STREAM_FRAME_LEN + 1];
    let e = run(allowance, incomplete, || 4096).end.unwrap_err();
    assert_eq!(e.category(), Category::OutputLimit);
}

#[test]
fn output_allowance_at_n_and_n_plus_one() {
    let allowance = OutputAllowance::new(5).unwrap();
    let exit = b"event: exit\ndata: {\"exitCode\":0}\n\n";
    let ok = [
        &b"event: stdout\ndata: abc\n\nevent: stderr\ndata: de\n\n"[..],
        exit,
    ]
    .concat();
    assert_eq!(run(allowance, &ok, || 3).end, Ok(0));
    let over = [
        &b"event: stdout\ndata: abc\n\nevent: stderr\ndata: def\n\n"[..],
        exit,
    ]
    .concat();
    let t = run(allowance, &over, || 3);
    assert_eq!(t.events, vec![out("abc")]);
    let e = t.end.unwrap_err();
    assert_eq!(
        (e.category(), e.evidence(), e.reason()),
        (
            Category::OutputLimit,
            Evidence::DispatchUncertain,
            Reason::OutputAllowance
        )
    );
    assert_eq!(e.limit().map(|l| (l.actual, l.max)), Some((6, 5)));
}

#[test]
fn drain_into_captures_lossy_utf8_output() {
    let mut d = ExecStreamDecoder::new(OutputAllowance::DEFAULT);
    let mut o = ExecOutput::empty(OutputEncoding::Bytes);
    for chunk in TV19.chunks(5) {
        d.handle_input(chunk).unwrap();
        d.drain_into(&mut o).unwrap();
    }
    assert_eq!(d.finish(), Ok(3));
    assert_eq!(
        (o.exit_code, &o.stdout[..], &o.stderr[..]),
        (3, &b"hi\n"[..], &b"boom\n"[..])
    );
    assert_eq!(o.encoding.as_str(), "lossy_utf8");
    assert_eq!(d.exit_code(), Some(3));
    assert_eq!(d.output_len(), 8);
}

#[test]
fn event_debug_prints_no_output() {
    let mut d = ExecStreamDecoder::new(OutputAllowance::DEFAULT);
    d.handle_input(b"event: stdout\ndata: SENTINEL\n\n")
        .unwrap();
    let ev = d.poll_event().unwrap().unwrap();
    assert!(!format!("{ev:?}").contains("SENTINEL"));
}

#[test]
fn fuzz_body_survives_the_vectors() {
    for v in [TV18, TV19, TV20, TV21_TAIL, TV21_SETUP] {
        for seed in [0u8, 1, 7, 255] {
            fuzz_exec_stream(&[&[seed][..], v].concat());
        }
    }
}

fn exec_stream() -> impl Strategy<Value = Vec<u8>> {
    let text = prop_oneof![
        Just("hi".to_string()),
        Just("café".to_string()),
        Just("€𝄞".to_string()),
        Just("a\rb".to_string()),
        Just("\r\n".to_string()),
        Just("\n".to_string()),
        Just("x\0y".to_string()),
        Just(String::new()),
    ];
    let frame = prop_oneof![
        (text.clone(), any::<bool>()).prop_map(|(t, err)| {
            // Frame as the worker does: split at every LF and CR, the split
            // byte ending the data line.
            let mut f = format!("event: {}\n", if err { "stderr" } else { "stdout" }).into_bytes();
            let mut line = b"data: ".to_vec();
            for b in t.bytes() {
                line.push(b);
                if b == b'\n' || b == b'\r' {
                    f.extend_from_slice(&line);
                    line = b"data: ".to_vec();
                }
            }
            f.extend_from_slice(&line);
            f.extend_from_slice(b"\n\n");
            f
        }),
        Just(b":\n\n".to_vec()),
        Just(b"event: exit\ndata: {\"exitCode\":0}\n\n".to_vec()),
        Just(b"event: exit\ndata: {\"exitCode\":-7}\r\n\r\n".to_vec()),
        Just(b"event: error\ndata: {\"message\":\"x\"}\n\n".to_vec()),
        Just(b"event: stdout\ndata: \xe2\x82\n\n".to_vec()),
        Just(b"event: stdout\r\ndata: crlf\r\n\r\n".to_vec()),
        Just(b"event: other\ndata: y\n\n".to_vec()),
        Just(b"event: stdout\ndata: partial".to_vec()),
    ];
    prop::collection::vec(frame, 0..12).prop_map(|v| v.concat())
}

proptest! {
    // Each case already tries every split point; 96 cases keep `cargo test` quick.
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// AC-5.3.1: random piece sizes 1–23 and every single-byte split give
    /// identical events and verdicts.
    #[test]
    fn ac_5_3_1_any_split_gives_identical_events(input in exec_stream(), seed in any::<u64>(), max in 1usize..64) {
        let allowance = OutputAllowance::new(max).unwrap();
        let one = run(allowance, &input, || usize::MAX);
        prop_assert_eq!(&one, &run(allowance, &input, fuzz_sizes(seed, 23)));
        prop_assert_eq!(&one, &run(allowance, &input, || 1));
        let roomy = run(OutputAllowance::DEFAULT, &input, || usize::MAX);
        for at in 1..input.len() {
            let mut first = true;
            let t = run(OutputAllowance::DEFAULT, &input, || if std::mem::take(&mut first) { at } else { usize::MAX });
            prop_assert_eq!(&roomy, &t, "split at {}", at);
        }
    }
}

#[test]
fn recording_events_captures_output_and_the_exit() {
    use crate::exec::{ExecEvent, ExecOutput, OutputEncoding};
    let mut out = ExecOutput::empty(OutputEncoding::LossyUtf8);
    for ev in [
        ExecEvent::Stdout("a\n".into()),
        ExecEvent::Stderr("e".into()),
        ExecEvent::Stdout("b".into()),
        ExecEvent::Exit(3),
    ] {
        out.record(&ev);
    }
    assert_eq!(
        (out.exit_code, &out.stdout[..], &out.stderr[..]),
        (3, &b"a\nb"[..], &b"e"[..])
    );
}
