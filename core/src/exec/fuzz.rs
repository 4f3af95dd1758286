//! The fuzz body for the exec stream decoder (`fuzz/fuzz_targets/exec_stream.rs`),
//! a plain function so that `cargo test` replays the seed corpus on stable.

use super::{ExecStreamDecoder, ExecStreamEvent, OutputAllowance};
use crate::error::Error;
use crate::sse::fuzz_sizes;

/// One decoded event, owned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum OwnedEvent {
    Stdout(String),
    Stderr(String),
    Exit(i32),
}

/// The events of a run and its verdict.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Transcript {
    pub(crate) events: Vec<OwnedEvent>,
    pub(crate) end: Result<i32, Error>,
}

/// Feeds `input` in pieces whose sizes `next_size` picks, draining after
/// every piece, then finishes.
pub(crate) fn run(
    allowance: OutputAllowance,
    input: &[u8],
    mut next_size: impl FnMut() -> usize,
) -> Transcript {
    let mut d = ExecStreamDecoder::new(allowance);
    let mut events = Vec::new();
    let mut rest = input;
    let end = 'outer: loop {
        if rest.is_empty() {
            break d.finish();
        }
        let n = next_size().clamp(1, rest.len());
        let (chunk, tail) = rest.split_at(n);
        rest = tail;
        if let Err(e) = d.handle_input(chunk) {
            break Err(e);
        }
        loop {
            match d.poll_event() {
                Ok(Some(ev)) => events.push(match ev {
                    ExecStreamEvent::Stdout(s) => OwnedEvent::Stdout(s.to_owned()),
                    ExecStreamEvent::Stderr(s) => OwnedEvent::Stderr(s.to_owned()),
                    ExecStreamEvent::Exit(c) => OwnedEvent::Exit(c),
                }),
                Ok(None) => break,
                Err(e) => break 'outer Err(e),
            }
        }
    };
    Transcript { events, end }
}

/// Fuzz body: the first byte picks an output allowance and a chunking; the
/// rest is the stream body. Never panics on any input, and asserts that the
/// stream fed whole, in pseudo-random pieces of 1–23 bytes and one byte at a
/// time yields identical events and verdicts, with at most one exit.
///
/// # Panics
/// Only when that invariant breaks (a bug for the fuzzer to find).
pub fn fuzz_exec_stream(data: &[u8]) {
    let Some((&seed, input)) = data.split_first() else {
        return;
    };
    let Ok(allowance) = OutputAllowance::new(1 + usize::from(seed) * 4) else {
        return;
    };
    // Inputs over the 256 KiB chunk cap are refused whole; keep the split
    // comparison to inputs that fit in one chunk.
    let whole = run(allowance, input, || usize::MAX);
    let pieces = run(allowance, input, fuzz_sizes(u64::from(seed), 23));
    let bytes = run(allowance, input, || 1);
    if input.len() <= super::MAX_STREAM_CHUNK_LEN {
        assert_eq!(whole, pieces, "chunking changed the outcome");
    }
    assert_eq!(pieces, bytes, "chunking changed the outcome");
    let exits = bytes
        .events
        .iter()
        .filter(|e| matches!(e, OwnedEvent::Exit(_)))
        .count();
    assert!(exits <= 1, "more than one exit");
    if let Ok(code) = bytes.end {
        assert_eq!(bytes.events.last(), Some(&OwnedEvent::Exit(code)));
    }
}
