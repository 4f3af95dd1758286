//! The fuzz body for the parser (`fuzz/fuzz_targets/sse.rs`), a plain
//! function so that `cargo test` replays the committed seed corpus on stable.

use super::{Config, SseParser, StreamEnd};
use crate::error::Error;

/// One event, owned (for comparisons in tests and fuzzing).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct OwnedEvent {
    pub(crate) event_type: Vec<u8>,
    pub(crate) data: Vec<u8>,
    pub(crate) last_event_id: Vec<u8>,
}

/// Everything a run produces: the events, then the verdict, and the retry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Transcript {
    pub(crate) events: Vec<OwnedEvent>,
    pub(crate) end: Result<StreamEnd, Error>,
    pub(crate) retry: Option<u64>,
    pub(crate) last_event_id: Vec<u8>,
}

/// Feeds `input` in pieces whose sizes `next_size` chooses (each ≥ 1),
/// draining after every piece, then finishes.
pub(crate) fn run(
    config: Config,
    input: &[u8],
    mut next_size: impl FnMut() -> usize,
) -> Transcript {
    let mut p = SseParser::new(config);
    let mut events = Vec::new();
    let mut rest = input;
    let end = 'outer: loop {
        if rest.is_empty() {
            break p.finish();
        }
        let n = next_size().clamp(1, rest.len());
        let (chunk, tail) = rest.split_at(n);
        rest = tail;
        if let Err(e) = p.handle_input(chunk) {
            break Err(e);
        }
        loop {
            match p.poll_event() {
                Ok(Some(ev)) => events.push(OwnedEvent {
                    event_type: ev.event_type().to_vec(),
                    data: ev.data().to_vec(),
                    last_event_id: ev.last_event_id().to_vec(),
                }),
                Ok(None) => break,
                Err(e) => break 'outer Err(e),
            }
        }
    };
    Transcript {
        events,
        end,
        retry: p.retry(),
        last_event_id: p.last_event_id().to_vec(),
    }
}

/// A deterministic piece-size sequence in `1..=max` from a seed.
pub(crate) fn sizes(seed: u64, max: usize) -> impl FnMut() -> usize {
    let mut x = seed | 1;
    move || {
        // xorshift64: deterministic, seeded by the caller.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        usize::try_from(x % u64::try_from(max.max(1)).unwrap_or(1)).unwrap_or(0) + 1
    }
}

/// Fuzz body: the first byte picks small caps and a chunking; the rest is the
/// stream. Never panics on any input, and asserts that feeding the stream in
/// one piece, in pseudo-random pieces of 1–23 bytes and one byte at a time
/// yields identical events, verdicts, retry and last event id.
///
/// # Panics
/// Only when that invariant breaks (a bug for the fuzzer to find).
pub fn fuzz_sse(data: &[u8]) {
    let Some((&seed, input)) = data.split_first() else {
        return;
    };
    let config = Config {
        max_line_len: 16 + usize::from(seed & 0x3f),
        max_event_len: 32 + usize::from(seed >> 2),
        max_chunk_len: usize::MAX,
        ..Config::default()
    };
    let whole = run(config, input, || usize::MAX);
    let pieces = run(config, input, sizes(u64::from(seed), 23));
    assert_eq!(whole, pieces, "chunking changed the outcome");
    let bytes = run(config, input, || 1);
    assert_eq!(whole, bytes, "byte-at-a-time changed the outcome");
    let roomy = run(
        Config {
            max_chunk_len: usize::MAX,
            ..Config::default()
        },
        input,
        sizes(u64::from(seed), 7),
    );
    let roomy_whole = run(
        Config {
            max_chunk_len: usize::MAX,
            ..Config::default()
        },
        input,
        || usize::MAX,
    );
    assert_eq!(roomy, roomy_whole, "chunking changed the outcome");
}
