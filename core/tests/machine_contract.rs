//! The driver contract ([`Machine`]) as the shells use it: the decisions
//! that moved out of the shells — write-stall bound, read pacing, transport
//! failures and their evidence, failure as the last event.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use smolbox_core::Reason;
mod ws_support;

use std::time::{Duration, Instant};

use smolbox_core::http1::{ExchangeConfig, HttpEvent, HttpExchange, Method, Request};
use smolbox_core::terminal::{
    MAX_WRITE_WAIT, Next, READ_GRACE, TerminalConfig, TerminalEvent, TerminalSession, TerminalSpec,
    TerminalTimer,
};
use smolbox_core::{Category, Evidence, Machine, Operation, TransportFailure};
use ws_support::{KEY, fixed_entropy, t0};

const REPLY: &str = "HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\nupgrade: websocket\r\nsec-websocket-accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n";

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// An open session whose upgrade request the socket took at `now`.
fn opened(spec: &TerminalSpec, now: Instant) -> TerminalSession {
    let mut s =
        TerminalSession::new(spec, TerminalConfig::new("localhost", "dev"), KEY, now).unwrap();
    s.handle_entropy(&fixed_entropy(4_096));
    let mut out = Vec::new();
    assert!(Machine::poll_transmit(&mut s, &mut out));
    s.handle_written(now, out.len());
    Machine::handle_input(&mut s, now, REPLY.as_bytes());
    assert!(s.is_open());
    s
}

/// A terminal spec whose unread queue holds 1,024 bytes (read pacing
/// pauses above 512).
fn small_queue() -> TerminalSpec {
    TerminalSpec {
        max_buffer_bytes: 1_024,
        ..TerminalSpec::new("/bin/sh")
    }
}

fn binary(payload: &[u8]) -> Vec<u8> {
    let mut f = vec![0x82, payload.len() as u8];
    f.extend_from_slice(payload);
    f
}

#[test]
fn write_stall_bound_ends_the_session_at_exactly_its_deadline() {
    let now = t0();
    let spec = TerminalSpec::new("/bin/sh");
    let mut s = opened(&spec, now);
    s.input(now, b"x").unwrap();
    let mut out = Vec::new();
    assert!(Machine::poll_transmit(&mut s, &mut out));
    // The socket takes part of it just before the bound: progress moves it.
    let almost = now + MAX_WRITE_WAIT - ms(1);
    s.handle_written(almost, 1);
    s.handle_timeout(now + MAX_WRITE_WAIT);
    assert!(s.outcome().is_none(), "progress resets the write bound");
    assert_eq!(
        s.poll_timeout(),
        Some((almost + MAX_WRITE_WAIT, TerminalTimer::WriteStall))
    );
    // No more progress: one instant early nothing happens, at it the end.
    s.handle_timeout(almost + MAX_WRITE_WAIT - ms(1));
    assert!(s.outcome().is_none());
    s.handle_timeout(almost + MAX_WRITE_WAIT);
    let e = s.outcome().unwrap().unwrap_err();
    assert_eq!(
        (e.category(), e.operation(), e.evidence(), e.reason()),
        (
            Category::Transport,
            Operation::TerminalOutput,
            Evidence::Unknown,
            Reason::WriteTimeout
        )
    );
    assert!(Machine::is_finished(&s));
    // Commands after it report the transport failure.
    let e = s.input(now + ms(2_000), b"y").unwrap_err();
    assert_eq!(
        (e.operation(), e.reason()),
        (Operation::TerminalInput, Reason::WriteTimeout)
    );
}

#[test]
fn a_written_transmit_sets_no_write_timer() {
    let now = t0();
    let mut s = opened(&TerminalSpec::new("/bin/sh"), now);
    s.input(now, b"x").unwrap();
    let mut out = Vec::new();
    assert!(Machine::poll_transmit(&mut s, &mut out));
    s.handle_written(now, out.len());
    assert_ne!(
        s.poll_timeout().map(|(_, t)| t),
        Some(TerminalTimer::WriteStall)
    );
}

#[test]
fn reading_pauses_for_a_live_consumer_only_within_the_grace() {
    let now = t0();
    let spec = small_queue();
    let mut s = opened(&spec, now);
    // Not above half yet: reading goes on.
    Machine::handle_input(&mut s, now, &binary(&[b'a'; 100]));
    Machine::handle_input(&mut s, now, &binary(&[b'b'; 100]));
    let pulled = Machine::poll_event(&mut s).unwrap();
    assert!(matches!(pulled, TerminalEvent::Output(ref b) if b.len() == 100));
    // Unread at exactly half of the bound (512): still reading.
    let half: Vec<u8> = [&binary(&[b'c'; 100])[..], &binary(&[b'd'; 125])[..]].concat();
    Machine::handle_input(&mut s, now, &half);
    Machine::handle_input(&mut s, now, &binary(&[b'e'; 125]));
    Machine::handle_input(&mut s, now, &binary(&[b'g'; 62]));
    assert_eq!(s.unread_bytes(), 512);
    assert!(Machine::wants_read(&s));
    // One byte past half, pulled just now: pause until the grace ends.
    Machine::handle_input(&mut s, now, &binary(b"f"));
    assert!(!Machine::wants_read(&s));
    assert_eq!(
        s.poll_timeout(),
        Some((now + READ_GRACE, TerminalTimer::Throttle))
    );
    s.handle_timeout(now + READ_GRACE - ms(1));
    assert!(!Machine::wants_read(&s));
    s.handle_timeout(now + READ_GRACE);
    assert!(
        Machine::wants_read(&s),
        "a consumer silent past the grace is stalled"
    );
    // A pull pauses reading again only while still above half.
    let _ = Machine::poll_event(&mut s).unwrap();
    assert!(Machine::wants_read(&s));
}

/// The open counts as the consumer's first pull: output that floods in
/// right after the 101, before the consumer's first `next`, pauses reading
/// for the grace instead of finding the consumer already stalled (the
/// flood bench's `output_limit`); a consumer that makes no pull within the
/// grace after the open is stalled and the bound decides.
#[test]
fn the_open_counts_as_the_first_pull() {
    let now = t0();
    let spec = small_queue();
    let mut s = opened(&spec, now);
    for _ in 0..6 {
        Machine::handle_input(&mut s, now + ms(1), &binary(&[b'a'; 100]));
    }
    assert_eq!(s.unread_bytes(), 600);
    assert!(
        !Machine::wants_read(&s),
        "paused for a consumer not yet pulling"
    );
    assert_eq!(
        s.poll_timeout(),
        Some((now + READ_GRACE, TerminalTimer::Throttle))
    );
    // The first pull within the grace: still live, still paused above half.
    s.handle_timeout(now + READ_GRACE - ms(1));
    assert!(!Machine::wants_read(&s));
    let _ = Machine::poll_event(&mut s).unwrap();
    assert!(Machine::wants_read(&s), "500 of 1,024: at half, reading");

    // No pull within the grace after the open: stalled, reading goes on
    // and the queue bound ends the session.
    let mut t = opened(&spec, now);
    for _ in 0..6 {
        Machine::handle_input(&mut t, now, &binary(&[b'a'; 100]));
    }
    assert!(!Machine::wants_read(&t));
    t.handle_timeout(now + READ_GRACE);
    assert!(Machine::wants_read(&t), "silent past the grace: stalled");
    for _ in 0..5 {
        Machine::handle_input(&mut t, now + READ_GRACE, &binary(&[b'a'; 100]));
    }
    assert_eq!(
        t.outcome().unwrap().unwrap_err().category(),
        Category::OutputLimit
    );
}

/// A consumer waiting in `next` is pulling: output that arrives in a burst
/// after the wait began more than the grace ago pauses reading above half
/// (before, the blocking shell read the whole burst within one turn and
/// ended the session with `output_limit` while the consumer waited); once
/// the wait has ended without a pull, the grace runs out as usual.
#[test]
fn a_consumer_waiting_in_next_is_pulling() {
    let now = t0();
    let spec = small_queue();
    let mut s = opened(&spec, now);
    let until = now + ms(1_000);
    assert!(matches!(s.next(now, until), Next::Pending(_)));
    for _ in 0..6 {
        Machine::handle_input(&mut s, now + ms(500), &binary(&[b'a'; 100]));
    }
    assert!(!Machine::wants_read(&s), "the waiting consumer is live");
    s.handle_timeout(until);
    assert!(!Machine::wants_read(&s), "live up to the wait's end");
    s.handle_timeout(until + READ_GRACE);
    assert!(
        Machine::wants_read(&s),
        "no pull within the grace after the wait ended: stalled"
    );
    // A pull ends the wait: from then on the grace counts from the pull.
    let mut t = opened(&spec, now);
    assert!(matches!(t.next(now, until), Next::Pending(_)));
    Machine::handle_input(&mut t, now, &binary(&[b'a'; 100]));
    assert!(matches!(t.next(now, until), Next::Output(_)));
    for _ in 0..6 {
        Machine::handle_input(&mut t, now + READ_GRACE, &binary(&[b'a'; 100]));
    }
    assert!(Machine::wants_read(&t), "pulled, not waiting: stalled");
}

/// A consumer that enters `next` while live pulls for the whole call: the
/// shell's own work in the call (reading what already arrived, which under
/// a 50x slowdown took longer than the grace and ended the blocking flood
/// bench with `output_limit`) does not make it stalled. One that enters
/// after a silence longer than the grace is stalled for those reads.
#[test]
fn a_consumer_entering_next_while_live_pulls_for_the_whole_call() {
    let now = t0();
    let spec = small_queue();
    let mut s = opened(&spec, now);
    assert!(Machine::poll_event(&mut s).is_none()); // a pull at `now`
    s.begin_next(now + ms(10), ms(1_000)).unwrap();
    for _ in 0..6 {
        Machine::handle_input(&mut s, now + ms(40), &binary(&[b'a'; 100]));
    }
    assert!(!Machine::wants_read(&s), "pulling for the whole call");

    let mut t = opened(&spec, now);
    assert!(Machine::poll_event(&mut t).is_none());
    t.begin_next(now + READ_GRACE, ms(1_000)).unwrap();
    for _ in 0..6 {
        Machine::handle_input(&mut t, now + READ_GRACE, &binary(&[b'a'; 100]));
    }
    assert!(Machine::wants_read(&t), "silent past the grace: stalled");
}

/// The grace is 100 ms (session 9; it was 20 ms): a consumer away for 99 ms
/// — as one whose thread a loaded host did not schedule can be — is still
/// live: reading stays paused above half and it gets every byte when it
/// comes back; away for 100 ms it is stalled and the bound decides
/// (AC-7.3.1). Both shells' views: the throttle timer firing while the
/// consumer is away (tokio's reading task), and a `next` entered after the
/// absence (the blocking shell's catch-up reads).
#[test]
fn a_consumer_away_for_99_ms_is_live_and_for_100_ms_stalled() {
    let now = t0();
    let spec = small_queue();
    let flood = |s: &mut TerminalSession, at: Instant| {
        for _ in 0..6 {
            Machine::handle_input(s, at, &binary(&[b'a'; 100]));
        }
    };
    // The timer fires at 99 ms: still paused; the consumer then drains
    // everything and the session goes on.
    let mut s = opened(&spec, now);
    assert!(Machine::poll_event(&mut s).is_none()); // a pull at `now`
    flood(&mut s, now + ms(1));
    assert_eq!(
        s.poll_timeout(),
        Some((now + ms(100), TerminalTimer::Throttle))
    );
    s.handle_timeout(now + ms(99));
    assert!(!Machine::wants_read(&s), "away for 99 ms: live");
    let mut delivered = 0;
    while let Some(TerminalEvent::Output(b)) = Machine::poll_event(&mut s) {
        delivered += b.len();
    }
    assert_eq!((delivered, s.outcome()), (600, None));
    // The timer fires at 100 ms: stalled, reading goes on and overflows.
    let mut t = opened(&spec, now);
    assert!(Machine::poll_event(&mut t).is_none());
    flood(&mut t, now + ms(1));
    t.handle_timeout(now + ms(100));
    assert!(Machine::wants_read(&t), "away for 100 ms: stalled");
    flood(&mut t, now + ms(100));
    assert_eq!(
        t.outcome().unwrap().unwrap_err().category(),
        Category::OutputLimit
    );
    // `next` entered after 99 ms of silence pulls for the whole call; after
    // 100 ms its catch-up reads find the consumer stalled.
    for (away, live) in [(ms(99), true), (ms(100), false)] {
        let mut u = opened(&spec, now);
        assert!(Machine::poll_event(&mut u).is_none());
        u.begin_next(now + away, ms(1_000)).unwrap();
        flood(&mut u, now + away);
        assert_eq!(Machine::wants_read(&u), !live, "away for {away:?}");
    }
}

/// A managed run that holds output for its own live consumer takes
/// nothing from the session but keeps it live (`keep_live`): the pause
/// lasts the grace after the last keep-alive, not after the last pull; a
/// run that stops calling it is stalled after the grace as before.
#[test]
fn keep_live_pauses_reading_for_the_grace_without_taking_output() {
    let now = t0();
    let spec = small_queue();
    let mut s = opened(&spec, now);
    assert!(Machine::poll_event(&mut s).is_none()); // a pull at `now`
    for _ in 0..6 {
        Machine::handle_input(&mut s, now + ms(1), &binary(&[b'a'; 100]));
    }
    assert!(!Machine::wants_read(&s));
    // Kept live at 90 ms: still paused at 189 ms, nothing was taken.
    s.keep_live(now + ms(90));
    s.handle_timeout(now + ms(189));
    assert!(!Machine::wants_read(&s), "kept live 99 ms ago: paused");
    assert!(s.unread_bytes() > 0);
    let unread = s.unread_bytes();
    // At 190 ms (the grace after the keep-alive) the run is stalled.
    s.handle_timeout(now + ms(190));
    assert!(Machine::wants_read(&s), "kept live 100 ms ago: stalled");
    assert!(s.unread_bytes() >= unread, "keep_live took nothing");
}

#[test]
fn a_read_failure_decides_the_outcome_and_a_write_failure_keeps_reading() {
    let now = t0();
    let mut s = opened(&TerminalSpec::new("/bin/sh"), now);
    Machine::handle_transport_error(&mut s, now, TransportFailure::Write);
    assert!(s.outcome().is_none() && Machine::wants_read(&s));
    s.input(now, b"x").unwrap_err();
    // The exit still arrives and decides the outcome.
    let exit = br#"{"type":"exit","code":0}"#;
    let mut frame = vec![0x81, exit.len() as u8];
    frame.extend_from_slice(exit);
    Machine::handle_input(&mut s, now, &frame);
    Machine::handle_input(&mut s, now, &[0x88, 0x02, 0x03, 0xe8]);
    assert_eq!(s.outcome().unwrap().unwrap().code, 0);

    let mut r = opened(&TerminalSpec::new("/bin/sh"), now);
    Machine::handle_input(&mut r, now, &binary(b"out"));
    Machine::handle_transport_error(&mut r, now, TransportFailure::Read);
    assert!(Machine::is_finished(&r));
    // Output read before the failure is still delivered, then the end.
    assert!(matches!(
        Machine::poll_event(&mut r),
        Some(TerminalEvent::Output(b)) if &b[..] == b"out"
    ));
    assert!(matches!(
        Machine::poll_event(&mut r),
        Some(TerminalEvent::Closed(Err(_)))
    ));
    assert!(
        Machine::poll_event(&mut r).is_none(),
        "the end is the last event"
    );
}

fn exchange(now: Instant) -> HttpExchange {
    let config = ExchangeConfig::new("worker:1", now + Duration::from_secs(30));
    let request = Request::new(Operation::Get, Method::Get, "/health".into());
    HttpExchange::new(&request, &config, now).unwrap()
}

#[test]
fn http_transport_failure_evidence_follows_what_the_socket_took() {
    let now = t0();
    for (written, evidence) in [
        (0, Evidence::NotDispatched),
        (1, Evidence::DispatchUncertain),
    ] {
        for failure in [TransportFailure::Write, TransportFailure::Read] {
            let mut x = exchange(now);
            let mut out = Vec::new();
            assert!(Machine::poll_transmit(&mut x, &mut out));
            Machine::handle_written(&mut x, now, written);
            Machine::handle_transport_error(&mut x, now, failure);
            let e = match Machine::poll_event(&mut x) {
                Some(HttpEvent::Failed(e)) => e,
                other => panic!("{other:?}"),
            };
            assert_eq!(
                (e.category(), e.evidence(), e.reason()),
                (Category::Transport, evidence, failure.reason())
            );
            assert!(Machine::poll_event(&mut x).is_none());
            assert!(Machine::is_finished(&x));
        }
    }
}

#[test]
fn a_reply_complete_before_a_read_failure_is_whole() {
    let now = t0();
    let mut x = exchange(now);
    let _ = x.poll_transmit(&mut Vec::new());
    x.handle_written(now, 1);
    Machine::handle_input(
        &mut x,
        now,
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}",
    );
    Machine::handle_transport_error(&mut x, now, TransportFailure::Read);
    assert!(matches!(
        Machine::poll_event(&mut x),
        Some(HttpEvent::Head(_))
    ));
    assert_eq!(Machine::poll_event(&mut x), Some(HttpEvent::Data(b"{}")));
    assert_eq!(Machine::poll_event(&mut x), Some(HttpEvent::End));
    assert_eq!(Machine::poll_event(&mut x), None);
    // A cut-off body instead fails with the read failure, after its bytes.
    let mut y = exchange(now);
    let _ = y.poll_transmit(&mut Vec::new());
    y.handle_written(now, 1);
    Machine::handle_input(
        &mut y,
        now,
        b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\n{}",
    );
    Machine::handle_transport_error(&mut y, now, TransportFailure::Read);
    assert!(matches!(
        Machine::poll_event(&mut y),
        Some(HttpEvent::Head(_))
    ));
    assert_eq!(Machine::poll_event(&mut y), Some(HttpEvent::Data(b"{}")));
    assert!(matches!(
        Machine::poll_event(&mut y),
        Some(HttpEvent::Failed(e)) if e.reason() == Reason::ReadFailed
    ));
}
