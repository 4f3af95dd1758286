#![allow(clippy::unwrap_used)] // test code

use std::time::Duration;

use super::*;
use crate::Category;

#[allow(clippy::disallowed_methods)] // an arbitrary origin; time is virtual after
fn origin() -> Instant {
    Instant::now()
}

const MS: Duration = Duration::from_millis(1);

fn b(s: &'static [u8]) -> Bytes {
    Bytes::from_static(s)
}

fn out(s: &'static [u8]) -> Option<TerminalEvent> {
    Some(TerminalEvent::Output(b(s)))
}

fn assert_overflow(e: Error) {
    assert_eq!(e.category(), Category::OutputLimit);
    assert_eq!(e.evidence(), Evidence::Unknown);
    assert_eq!(e.reason(), Reason::UnreadOutput);
}

#[test]
fn bytes_at_n_are_queued_and_n_plus_1_is_held_for_a_live_consumer() {
    let t0 = origin();
    let mut buf = OutputBuffer::new(4, t0);
    buf.push(t0, b(b"abc")).unwrap();
    buf.push(t0, b(b"d")).unwrap();
    assert_eq!((buf.unread_bytes(), buf.holds()), (4, false));
    assert_eq!(
        buf.pace(t0).unwrap(),
        Pace::Pull,
        "N bytes: the run pulls on"
    );
    buf.push(t0, b(b"e")).unwrap();
    assert_eq!((buf.unread_bytes(), buf.holds()), (4, true), "N+1: held");
    assert_eq!(buf.pace(t0).unwrap(), Pace::Hold(t0 + READ_GRACE));
}

#[test]
fn chunks_at_n_are_queued_and_n_plus_1_is_held() {
    let t0 = origin();
    let mut buf = OutputBuffer::new(usize::MAX, t0);
    for _ in 0..MAX_UNREAD_CHUNKS {
        buf.push(t0, b(b"x")).unwrap();
    }
    assert!(!buf.holds());
    buf.push(t0, b(b"x")).unwrap();
    assert!(buf.holds());
    assert_eq!(buf.unread_bytes(), MAX_UNREAD_CHUNKS);
}

#[test]
fn a_consumer_away_for_grace_minus_1_ms_is_held_for_and_for_the_grace_stalled() {
    let t0 = origin();
    let mut buf = OutputBuffer::new(2, t0);
    buf.push(t0, b(b"ab")).unwrap();
    // Pushing the chunk that does not fit: held just before the grace ends,
    // an overflow at its end.
    let mut early = OutputBuffer::new(2, t0);
    early.push(t0, b(b"ab")).unwrap();
    early.push(t0 + READ_GRACE - MS, b(b"c")).unwrap();
    assert!(early.holds());
    let e = buf.push(t0 + READ_GRACE, b(b"c")).unwrap_err();
    assert_overflow(e);
    // The chunk is kept for the consumer (over the bound: the session ends).
    assert_eq!(buf.unread_bytes(), 3);
    // A held chunk: the run holds until the grace ends, then the consumer
    // is stalled and the held chunk is queued.
    let until = t0 + READ_GRACE;
    assert_eq!(early.pace(until - MS).unwrap(), Pace::Hold(until));
    assert_eq!(
        early.pace(until - Duration::from_nanos(1)).unwrap(),
        Pace::Hold(until)
    );
    assert_overflow(early.pace(until).unwrap_err());
    assert!(!early.holds());
    assert_eq!(early.pop(until), out(b"ab"));
    assert_eq!(early.pop(until), out(b"c"));
}

#[test]
fn a_read_that_makes_room_moves_the_held_chunk_on_and_the_run_pulls_again() {
    let t0 = origin();
    let mut buf = OutputBuffer::new(4, t0);
    buf.push(t0, b(b"ab")).unwrap();
    buf.push(t0, b(b"cd")).unwrap();
    buf.push(t0, b(b"efg")).unwrap();
    // Reading "ab" frees 2 bytes: "efg" (3) still does not fit.
    let t1 = t0 + 60 * MS;
    assert_eq!(buf.pop(t1), out(b"ab"));
    assert!(buf.holds());
    // Each read restarts the grace: 60 ms after the open the consumer read,
    // so at 130 ms (past the open's grace) it is still live.
    assert_eq!(
        buf.pace(t0 + 130 * MS).unwrap(),
        Pace::Hold(t1 + READ_GRACE)
    );
    let t2 = t1 + 90 * MS;
    assert_eq!(buf.pop(t2), out(b"cd"));
    assert!(!buf.holds(), "room for the held chunk");
    assert_eq!(buf.unread_bytes(), 3);
    assert_eq!(buf.pace(t2).unwrap(), Pace::Pull);
    assert_eq!(buf.pop(t2), out(b"efg"));
    assert_eq!(buf.pop(t2), None);
}

#[test]
fn a_consumer_waiting_in_next_is_live_until_its_wait_ends() {
    let t0 = origin();
    let mut buf = OutputBuffer::new(1, t0);
    let end = t0 + Duration::from_secs(5);
    buf.begin_wait(t0, end);
    // Nothing to read at first: the wait goes on (an empty read keeps it).
    assert_eq!(buf.pop(t0), None);
    // Three seconds into the wait the output arrives faster than the
    // consumer is woken: it is held, not an overflow.
    let t3 = t0 + Duration::from_secs(3);
    buf.push(t3, b(b"a")).unwrap();
    buf.push(t3, b(b"b")).unwrap();
    assert_eq!(buf.pace(t3).unwrap(), Pace::Hold(t3 + READ_GRACE));
    // A wait that ended without a read (cancelled): live for the grace
    // after its deadline, stalled at its end.
    assert_eq!(
        buf.pace(end + READ_GRACE - MS).unwrap(),
        Pace::Hold(end + READ_GRACE)
    );
    assert_overflow(buf.pace(end + READ_GRACE).unwrap_err());
}

#[test]
fn a_read_that_returns_output_ends_the_wait() {
    let t0 = origin();
    let mut buf = OutputBuffer::new(1, t0);
    buf.begin_wait(t0, t0 + Duration::from_secs(5));
    buf.push(t0, b(b"a")).unwrap();
    assert_eq!(buf.pop(t0 + MS), out(b"a"));
    buf.push(t0 + MS, b(b"b")).unwrap();
    buf.push(t0 + MS, b(b"c")).unwrap();
    // Live for the grace after that read only, not up to the old deadline.
    assert_overflow(buf.pace(t0 + MS + READ_GRACE).unwrap_err());
}

#[test]
fn the_open_and_the_attach_count_as_reads() {
    let t0 = origin();
    let mut buf = OutputBuffer::new(1, t0);
    buf.push(t0, b(b"a")).unwrap();
    buf.push(t0, b(b"b")).unwrap();
    assert_eq!(buf.pace(t0).unwrap(), Pace::Hold(t0 + READ_GRACE));
    let t1 = t0 + 80 * MS;
    buf.attached(t1);
    assert_eq!(
        buf.pace(t0 + READ_GRACE).unwrap(),
        Pace::Hold(t1 + READ_GRACE)
    );
}

#[test]
fn a_push_while_a_chunk_is_held_is_an_overflow() {
    let t0 = origin();
    let mut buf = OutputBuffer::new(1, t0);
    buf.push(t0, b(b"a")).unwrap();
    buf.push(t0, b(b"b")).unwrap();
    assert_overflow(buf.push(t0, b(b"c")).unwrap_err());
    // Nothing is lost or reordered.
    assert_eq!(buf.pop(t0), out(b"a"));
    assert_eq!(buf.pop(t0), out(b"b"));
    assert_eq!(buf.pop(t0), out(b"c"));
}

#[test]
fn a_chunk_over_the_bound_is_read_once_the_queue_is_empty() {
    let t0 = origin();
    let mut buf = OutputBuffer::new(2, t0);
    buf.push(t0, b(b"a")).unwrap();
    buf.push(t0, b(b"xyz")).unwrap();
    assert!(buf.holds());
    assert_eq!(buf.pop(t0), out(b"a"));
    assert!(buf.holds(), "3 bytes never fit 2");
    assert_eq!(buf.pop(t0), out(b"xyz"));
    assert_eq!(buf.pace(t0).unwrap(), Pace::Pull);
}

#[test]
fn output_first_then_the_held_chunk_then_the_outcome_again_and_again() {
    let t0 = origin();
    let mut buf = OutputBuffer::new(2, t0);
    assert!(buf.pop(t0).is_none());
    buf.push(t0, b(b"hi")).unwrap();
    buf.push(t0, b(b"!")).unwrap();
    buf.close(Ok(TerminalExit { code: 3 }));
    buf.close(Err(super::super::consumer_lost()));
    // The session is over: the run is not held (it has nothing to pull).
    assert_eq!(buf.pace(t0 + READ_GRACE).unwrap(), Pace::Pull);
    assert_eq!(buf.pop(t0), out(b"hi"));
    assert_eq!(buf.pop(t0), out(b"!"));
    let closed = Some(TerminalEvent::Closed(Ok(TerminalExit { code: 3 })));
    assert_eq!(buf.pop(t0), closed);
    assert_eq!(buf.pop(t0), closed);
    assert_eq!(buf.outcome(), Some(Ok(TerminalExit { code: 3 })));
}

#[test]
fn debug_prints_counts_and_never_bytes() {
    let t0 = origin();
    let mut buf = OutputBuffer::new(4, t0);
    buf.push(t0, b(b"secret")).unwrap();
    let s = format!("{buf:?}");
    assert!(!s.contains("secret"), "{s}");
    assert!(s.contains("held: Some(6)"), "{s}");
}
