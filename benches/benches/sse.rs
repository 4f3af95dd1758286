//! The event-stream parser (`smolbox_core::sse`) against memcpy of the same
//! bytes and against the `sse-stream` and `eventsource-stream` crates.
//!
//!   cargo bench -p smolbox-benches --bench sse
//!
//! Figures: benches/results/sse-exec.md.

use std::convert::Infallible;
use std::hint::black_box;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use divan::Bencher;
use divan::counter::BytesCount;
use futures_core::Stream;
use smolbox_core::sse::{Config, SseParser};

#[global_allocator]
static ALLOC: divan::AllocProfiler = divan::AllocProfiler::system();

fn main() {
    divan::main();
}

/// About 1 MiB of exec events framed as the worker frames them: each output
/// chunk is eight 60-byte lines, so eight `data:` lines plus a final empty one.
fn exec_events() -> Vec<u8> {
    let mut out = Vec::with_capacity(1 << 20);
    let mut i = 0u32;
    while out.len() < (1 << 20) - 1024 {
        out.extend_from_slice(if i % 4 == 3 {
            b"event: stderr\n"
        } else {
            b"event: stdout\n"
        });
        for line in 0..8 {
            out.extend_from_slice(b"data: ");
            let text = format!("line {i:06}.{line} the quick brown fox jumps over the lazy dog");
            out.extend_from_slice(&text.as_bytes()[..54]);
            out.push(b'\n');
        }
        out.extend_from_slice(b"data: \n\n");
        i += 1;
    }
    out
}

/// One 256 KiB data line.
fn long_line() -> Vec<u8> {
    let mut out = b"event: stdout\ndata: ".to_vec();
    out.extend(std::iter::repeat_n(b'y', 256 * 1024));
    out.extend_from_slice(b"\n\n");
    out
}

fn roomy() -> Config {
    Config {
        max_line_len: 512 * 1024,
        max_event_len: 512 * 1024,
        ..Config::default()
    }
}

fn parse(p: &mut SseParser, input: &[u8], piece: usize) -> usize {
    let mut n = 0;
    for chunk in input.chunks(piece) {
        p.handle_input(chunk).unwrap_or_else(|e| panic!("{e}"));
        while let Some(ev) = p.poll_event().unwrap_or_else(|e| panic!("{e}")) {
            n += ev.data().len() + ev.event_type().len();
        }
    }
    n
}

fn memcpy(b: Bencher<'_, '_>, input: &[u8], piece: usize) {
    let mut dst = vec![0u8; input.len()];
    b.counter(BytesCount::new(input.len())).bench_local(|| {
        for (i, chunk) in black_box(input).chunks(piece).enumerate() {
            dst[i * piece..i * piece + chunk.len()].copy_from_slice(chunk);
        }
        black_box(&mut dst);
    });
}

/// A stream over pre-split `Bytes` pieces (cloning one is a refcount bump),
/// always ready, polled with a no-op waker.
struct Pieces {
    pieces: Vec<Bytes>,
    next: usize,
}

impl Stream for Pieces {
    type Item = Result<Bytes, Infallible>;
    fn poll_next(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let i = self.next;
        self.next += 1;
        Poll::Ready(self.pieces.get(i).cloned().map(Ok))
    }
}

fn drain<S: Stream + Unpin>(mut s: S, mut f: impl FnMut(S::Item)) {
    let mut cx = Context::from_waker(Waker::noop());
    while let Poll::Ready(Some(item)) = Pin::new(&mut s).poll_next(&mut cx) {
        f(item);
    }
}

fn split(input: &[u8], piece: usize) -> Vec<Bytes> {
    input.chunks(piece).map(Bytes::copy_from_slice).collect()
}

mod exec_events_4k {
    use super::*;

    #[divan::bench]
    fn memcpy(b: Bencher<'_, '_>) {
        super::memcpy(b, &exec_events(), 4096);
    }

    /// A fresh parser per run (its buffers grow once per run).
    #[divan::bench]
    fn smolbox(b: Bencher<'_, '_>) {
        let input = exec_events();
        b.counter(BytesCount::new(input.len())).bench_local(|| {
            let mut p = SseParser::new(Config::default());
            black_box(parse(&mut p, black_box(&input), 4096))
        });
    }

    /// One parser across runs: the steady state (0 allocations per event).
    #[divan::bench]
    fn smolbox_steady(b: Bencher<'_, '_>) {
        let input = exec_events();
        let mut p = SseParser::new(Config::default());
        parse(&mut p, &input, 4096);
        b.counter(BytesCount::new(input.len()))
            .bench_local(|| black_box(parse(&mut p, black_box(&input), 4096)));
    }

    #[divan::bench]
    fn sse_stream(b: Bencher<'_, '_>) {
        let input = exec_events();
        let pieces = split(&input, 4096);
        b.counter(BytesCount::new(input.len())).bench_local(|| {
            let mut n = 0;
            let s = sse_stream::SseByteStream::new(Pieces {
                pieces: pieces.clone(),
                next: 0,
            });
            drain(s, |ev| {
                let ev = ev.unwrap_or_else(|e| panic!("{e}"));
                n += ev.data.map_or(0, |d| d.len()) + ev.event.map_or(0, |e| e.len());
            });
            black_box(n)
        });
    }

    #[divan::bench]
    fn eventsource_stream(b: Bencher<'_, '_>) {
        let input = exec_events();
        let pieces = split(&input, 4096);
        b.counter(BytesCount::new(input.len())).bench_local(|| {
            let mut n = 0;
            let s = eventsource_stream::EventStream::new(Pieces {
                pieces: pieces.clone(),
                next: 0,
            });
            drain(s, |ev| {
                let ev = ev.unwrap_or_else(|e| panic!("{e}"));
                n += ev.data.len() + ev.event.len();
            });
            black_box(n)
        });
    }
}

mod long_line_1460 {
    use super::*;

    #[divan::bench]
    fn memcpy(b: Bencher<'_, '_>) {
        super::memcpy(b, &long_line(), 1460);
    }

    #[divan::bench]
    fn smolbox(b: Bencher<'_, '_>) {
        let input = long_line();
        b.counter(BytesCount::new(input.len())).bench_local(|| {
            let mut p = SseParser::new(roomy());
            black_box(parse(&mut p, black_box(&input), 1460))
        });
    }

    #[divan::bench]
    fn smolbox_steady(b: Bencher<'_, '_>) {
        let input = long_line();
        let mut p = SseParser::new(roomy());
        parse(&mut p, &input, 1460);
        b.counter(BytesCount::new(input.len()))
            .bench_local(|| black_box(parse(&mut p, black_box(&input), 1460)));
    }

    #[divan::bench]
    fn sse_stream(b: Bencher<'_, '_>) {
        let input = long_line();
        let pieces = split(&input, 1460);
        b.counter(BytesCount::new(input.len())).bench_local(|| {
            let mut n = 0;
            let s = sse_stream::SseByteStream::new(Pieces {
                pieces: pieces.clone(),
                next: 0,
            });
            drain(s, |ev| {
                n += ev.map_or(0, |ev| ev.data.map_or(0, |d| d.len()))
            });
            black_box(n)
        });
    }
}
