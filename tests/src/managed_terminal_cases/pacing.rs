//! Read pacing towards a managed terminal's consumer (C7.3, AC-7.3.1;
//! docs/decisions/shells.md, "Managed terminals: read pacing towards the
//! consumer (session 9)"): a live consumer slower than the guest holds the
//! run back instead of losing the session; one that stops reading meets
//! `output_limit`; the consumer's buffer stays within its bound.

use std::time::Duration;

use smolbox_core::managed::ExecState;
use smolbox_core::managed::spec::ManagedTerminalSpec;
use smolbox_core::terminal::TerminalExit;
use smolbox_core::{Category, Error};

use super::{TermHandle, TermShell, key, read_until, setup};
use crate::TerminalEvent;
use crate::managed_cases::StoreKind;

/// The consumer's buffer: a multiple of the devworker's PTY reads (at most
/// 16 KiB each), far below what the guest writes.
const BUFFER: usize = 65_536;
/// What the guest writes between its two markers.
const FLOOD: usize = 2_000_000;

fn spec() -> ManagedTerminalSpec {
    ManagedTerminalSpec {
        buffer_bytes: BUFFER as u64,
        ..ManagedTerminalSpec::default()
    }
}

/// The flood between two markers (quoted apart so the echoed command line
/// does not contain them), then `exit 0`.
fn flood_command() -> Vec<u8> {
    format!(
        "printf 'ST''ART\\n'; head -c {FLOOD} /dev/zero | tr '\\0' x; printf 'E''ND\\n'; exit 0\n"
    )
    .into_bytes()
}

/// Everything up to the session's end, checking the buffer's bound at
/// every read; `pause` after each read (a consumer slower than the guest).
fn read_all<H: TermHandle>(h: &mut H, pause: Duration) -> (Vec<u8>, Result<TerminalExit, Error>) {
    let mut seen = Vec::new();
    loop {
        assert!(
            h.unread_bytes() <= BUFFER,
            "the buffer grew over its bound: {}",
            h.unread_bytes()
        );
        match h.next(Duration::from_secs(10)).unwrap() {
            TerminalEvent::Output(b) => {
                seen.extend_from_slice(&b);
                if !pause.is_zero() {
                    std::thread::sleep(pause);
                }
            }
            TerminalEvent::Closed(o) => return (seen, o),
            other => panic!("unexpected event: {other:?}"),
        }
    }
}

/// The bytes between the output's `START` and `END` lines.
fn between_markers(out: &[u8]) -> &[u8] {
    let find = |from: usize, needle: &[u8]| {
        out[from..]
            .windows(needle.len())
            .position(|w| w == needle)
            .map(|i| from + i)
    };
    let start = find(0, b"START\r\n").expect("START never arrived") + b"START\r\n".len();
    let end = find(start, b"END").expect("END never arrived");
    &out[start..end]
}

/// A live consumer that reads steadily but slower than the guest writes
/// (a pause after every read, well within the read grace) receives every
/// byte and the exit: the run holds back while the buffer is full instead
/// of ending the session with `output_limit`, and the buffer never holds
/// more than its bound. Before the pacing this session ended with
/// `output_limit` a few reads in.
pub fn a_slow_live_consumer_gets_every_byte_and_the_exit<T: TermShell>(kind: StoreKind) {
    let Some(s) = setup(kind) else { return };
    let rt: T = s.runtime();
    let k = key("term-slow-reader");
    rt.open(&k, &s.machine, spec()).unwrap();
    let mut h = rt.attach(&k, Duration::from_secs(10)).unwrap();
    h.input(&flood_command()).unwrap();
    let (out, outcome) = read_all(&mut h, Duration::from_millis(5));
    assert_eq!(outcome.unwrap(), TerminalExit { code: 0 });
    let flood = between_markers(&out);
    assert_eq!(flood.len(), FLOOD, "every byte arrived");
    assert!(flood.iter().all(|&b| b == b'x'), "and nothing else");
    let rec = rt.wait(&k).unwrap();
    assert_eq!(rec.state, ExecState::Completed);
    assert_eq!(s.upgrades(), 1);
}

/// A consumer that stops reading while the guest floods meets
/// `output_limit` (uncertain, AC-7.3.1) even though the run paces: what
/// waits for it afterwards is at most the bound plus the one held chunk
/// (one PTY read, at most 16 KiB), not the flood.
pub fn a_consumer_that_stops_reading_gets_output_limit<T: TermShell>(kind: StoreKind) {
    let Some(s) = setup(kind) else { return };
    let rt: T = s.runtime();
    let k = key("term-stops-reading");
    rt.open(&k, &s.machine, spec()).unwrap();
    let mut h = rt.attach(&k, Duration::from_secs(10)).unwrap();
    h.input(&flood_command()).unwrap();
    read_until(&mut h, "xxxx");
    // The consumer reads nothing more until the session ended.
    let rec = rt.wait(&k).unwrap();
    assert_eq!((rec.state, rec.result.clone()), (ExecState::Unknown, None));
    assert_eq!(
        rec.last_error.as_ref().map(|e| e.category.as_str()),
        Some("output_limit")
    );
    let (rest, outcome) = read_all_unchecked(&mut h);
    assert_eq!(outcome.unwrap_err().category(), Category::OutputLimit);
    assert!(
        rest.len() <= BUFFER + 16 * 1024,
        "{} bytes waited after the stall",
        rest.len()
    );
}

/// What is left for the consumer, and the outcome (the buffer may hold the
/// held chunk on top of its bound once the session ended).
fn read_all_unchecked<H: TermHandle>(h: &mut H) -> (Vec<u8>, Result<TerminalExit, Error>) {
    let mut seen = Vec::new();
    loop {
        match h.next(Duration::from_secs(10)).unwrap() {
            TerminalEvent::Output(b) => seen.extend_from_slice(&b),
            TerminalEvent::Closed(o) => return (seen, o),
            other => panic!("unexpected event: {other:?}"),
        }
    }
}
