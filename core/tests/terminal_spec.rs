//! features C7.1: every bound of the terminal spec at N and N+1, the
//! defaults, the upgrade target, and redaction.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use smolbox_core::Reason;
mod ws_support;

use std::time::Duration;

use smolbox_core::terminal::*;
use smolbox_core::{Category, Evidence, Operation, Secret};
use ws_support::{KEY, fixed_entropy, t0};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn check(f: impl FnOnce(&mut TerminalSpec)) -> Result<(), Reason> {
    let mut s = TerminalSpec::default();
    f(&mut s);
    s.validate().map_err(|e| {
        assert_eq!(
            (e.category(), e.operation(), e.evidence()),
            (
                Category::Validation,
                Operation::TerminalSpec,
                Evidence::NotDispatched
            )
        );
        e.reason()
    })
}

#[test]
fn defaults_match_c7_1() {
    let s = TerminalSpec::default();
    assert_eq!(s.program, "/bin/sh");
    assert_eq!((s.cols, s.rows), (80, 24));
    assert_eq!((s.session_budget, s.idle_budget), (ms(30_000), ms(30_000)));
    assert_eq!((s.close_wait, s.attach_wait), (ms(1_000), ms(5_000)));
    assert_eq!((s.max_buffer_bytes, s.max_input_bytes), (262_144, 16_384));
    assert_eq!(s.validate(), Ok(()));
}

#[test]
fn every_bound_at_n_and_n_plus_one() {
    // program: 1..=4,096 bytes, no NUL.
    assert_eq!(check(|s| s.program = "x".repeat(4_096)), Ok(()));
    assert_eq!(
        check(|s| s.program = "x".repeat(4_097)),
        Err(Reason::ProgramLength)
    );
    assert_eq!(check(|s| s.program = "x".into()), Ok(()));
    assert_eq!(
        check(|s| s.program = String::new()),
        Err(Reason::ProgramLength)
    );
    assert_eq!(
        check(|s| s.program = "/bin/\0sh".into()),
        Err(Reason::ProgramNul)
    );
    // cols / rows: 1..=65,535 (u16 caps the top).
    assert_eq!(check(|s| (s.cols, s.rows) = (1, 1)), Ok(()));
    assert_eq!(check(|s| (s.cols, s.rows) = (65_535, 65_535)), Ok(()));
    assert_eq!(check(|s| s.cols = 0), Err(Reason::ColsOutOfRange));
    assert_eq!(check(|s| s.rows = 0), Err(Reason::RowsOutOfRange));
    // session: 1,000..=86,400,000 ms (idle follows it down).
    assert_eq!(
        check(|s| (s.session_budget, s.idle_budget) = (ms(1_000), ms(1_000))),
        Ok(())
    );
    assert_eq!(
        check(|s| (s.session_budget, s.idle_budget) = (ms(999), ms(999))),
        Err(Reason::SessionBudgetOutOfRange)
    );
    assert_eq!(check(|s| s.session_budget = ms(86_400_000)), Ok(()));
    assert_eq!(
        check(|s| s.session_budget = ms(86_400_001)),
        Err(Reason::SessionBudgetOutOfRange)
    );
    // idle: 1,000..=session.
    assert_eq!(check(|s| s.idle_budget = ms(1_000)), Ok(()));
    assert_eq!(
        check(|s| s.idle_budget = ms(999)),
        Err(Reason::IdleBudgetOutOfRange)
    );
    assert_eq!(check(|s| s.idle_budget = ms(30_000)), Ok(()));
    assert_eq!(
        check(|s| s.idle_budget = ms(30_001)),
        Err(Reason::IdleBudgetOutOfRange)
    );
    // close wait: 1..=5,000 ms.
    assert_eq!(check(|s| s.close_wait = ms(1)), Ok(()));
    assert_eq!(
        check(|s| s.close_wait = ms(0)),
        Err(Reason::CloseWaitOutOfRange)
    );
    assert_eq!(check(|s| s.close_wait = ms(5_000)), Ok(()));
    assert_eq!(
        check(|s| s.close_wait = ms(5_001)),
        Err(Reason::CloseWaitOutOfRange)
    );
    // attach wait: 100..=30,000 ms.
    assert_eq!(check(|s| s.attach_wait = ms(100)), Ok(()));
    assert_eq!(
        check(|s| s.attach_wait = ms(99)),
        Err(Reason::AttachWaitOutOfRange)
    );
    assert_eq!(check(|s| s.attach_wait = ms(30_000)), Ok(()));
    assert_eq!(
        check(|s| s.attach_wait = ms(30_001)),
        Err(Reason::AttachWaitOutOfRange)
    );
    // buffer: 1,024..=1,048,576 bytes.
    assert_eq!(check(|s| s.max_buffer_bytes = 1_024), Ok(()));
    assert_eq!(
        check(|s| s.max_buffer_bytes = 1_023),
        Err(Reason::BufferOutOfRange)
    );
    assert_eq!(check(|s| s.max_buffer_bytes = 1_048_576), Ok(()));
    assert_eq!(
        check(|s| s.max_buffer_bytes = 1_048_577),
        Err(Reason::BufferOutOfRange)
    );
    // per-input: 1..=65,536 bytes.
    assert_eq!(check(|s| s.max_input_bytes = 1), Ok(()));
    assert_eq!(
        check(|s| s.max_input_bytes = 0),
        Err(Reason::InputLimitOutOfRange)
    );
    assert_eq!(check(|s| s.max_input_bytes = 65_536), Ok(()));
    assert_eq!(
        check(|s| s.max_input_bytes = 65_537),
        Err(Reason::InputLimitOutOfRange)
    );
}

#[test]
fn upgrade_target_is_form_encoded() {
    let spec = TerminalSpec {
        cols: 100,
        rows: 30,
        ..TerminalSpec::new("/usr/bin/my shell&x=1")
    };
    assert_eq!(
        spec.upgrade_target("dev-1_a").unwrap(),
        "/api/v1/machines/dev-1_a/exec/interactive?cmd=%2Fusr%2Fbin%2Fmy+shell%26x%3D1&cols=100&rows=30"
    );
    assert_eq!(
        TerminalSpec::default().upgrade_target("dev").unwrap(),
        "/api/v1/machines/dev/exec/interactive?cmd=%2Fbin%2Fsh&cols=80&rows=24"
    );
    for bad in ["", "Dev", "-dev", "a/b", "a?b", &"a".repeat(32)] {
        assert_eq!(
            spec.upgrade_target(bad).unwrap_err().reason(),
            Reason::InvalidMachineName,
            "{bad:?}"
        );
    }
    assert!(spec.upgrade_target(&"a".repeat(31)).is_ok());
}

#[test]
fn session_config_bounds() {
    let spec = TerminalSpec::default();
    let mut c = TerminalConfig::new("localhost", "dev");
    c.handshake_timeout = MAX_HANDSHAKE_TIMEOUT;
    assert!(TerminalSession::new(&spec, c.clone(), KEY, t0()).is_ok());
    c.handshake_timeout = MAX_HANDSHAKE_TIMEOUT + ms(1);
    assert_eq!(
        TerminalSession::new(&spec, c.clone(), KEY, t0())
            .unwrap_err()
            .category(),
        Category::Validation
    );
    c.handshake_timeout = MAX_HANDSHAKE_TIMEOUT;
    c.max_request_bytes = 0;
    assert!(TerminalSession::new(&spec, c, KEY, t0()).is_err());
    let s =
        TerminalSession::new(&spec, TerminalConfig::new("localhost", "dev"), KEY, t0()).unwrap();
    assert!(s.wait_deadline(t0(), MAX_NEXT_WAIT).is_ok());
    assert!(s.wait_deadline(t0(), MAX_NEXT_WAIT + ms(1)).is_err());
}

#[test]
fn sentinels_never_reach_debug_or_errors() {
    // AC-0.2.2 / AC-7.3.3: program, token, input and output bytes.
    let now = t0();
    let spec = TerminalSpec::new("/SENTINEL-PROGRAM");
    let mut c = TerminalConfig::new("localhost", "dev");
    c.authorization = Some(Secret::new("SENTINEL-TOKEN"));
    let mut s = TerminalSession::new(&spec, c.clone(), KEY, now).unwrap();
    s.handle_entropy(&fixed_entropy(4_096));
    let mut out = Vec::new();
    let _ = s.poll_transmit(&mut out);
    let accept =
        smolbox_core::ws::handshake::accept_for(&smolbox_core::ws::handshake::encode_key(&KEY));
    let reply = format!(
        "HTTP/1.1 101 S\r\nconnection: upgrade\r\nupgrade: websocket\r\nsec-websocket-accept: {accept}\r\n\r\n"
    );
    s.handle_input(now, reply.as_bytes()).unwrap();
    s.input(now, b"SENTINEL-INPUT").unwrap();
    let mut frame = vec![0x82, 15];
    frame.extend(b"SENTINEL-OUTPUT");
    // An oversized text frame carrying the sentinel too.
    let text = format!("{{\"type\":\"SENTINEL-TEXT{}\"}}", "x".repeat(120));
    frame.extend([0x81, 126, 0, text.len() as u8]);
    frame.extend(text.as_bytes());
    s.handle_input(now, &frame).unwrap();
    let mut printed = format!("{spec:?} {c:?} {s:?}");
    loop {
        let n = s.next(now, now);
        printed.push_str(&format!("{n:?}"));
        if let Next::Closed(Err(e)) = n {
            printed.push_str(&format!("{e} {e:?}"));
            break;
        }
    }
    printed.push_str(&format!("{s:?}"));
    assert!(!printed.contains("SENTINEL"), "{printed}");
    assert!(printed.contains("text_frame_too_long"));
}
