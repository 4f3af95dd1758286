//! core::http1 against memcpy, the `chunked_transfer` decoder and raw
//! `httparse::Response::parse`, in one run:
//!
//!   cargo bench -p smolbox-benches --bench http
//!
//! * `chunked_*`: a 1 MiB body in 4 KiB (or 256 B) chunks, fed in 16 KiB
//!   reads. smolbox hands out body slices borrowed from its receive buffer
//!   (one copy: read → buffer); `chunked_transfer` reads into a reused
//!   16 KiB buffer (one copy); `memcpy` copies the same raw bytes, in the
//!   same 16 KiB pieces, into a reused buffer.
//! * `head_*`: a response head with 8 headers. smolbox runs the whole head
//!   path (copy, end-of-head scan, httparse, the framing / content-type /
//!   encoding / connection look-ups, `ResponseHead`); the baseline is raw
//!   `httparse::Response::parse` of the same bytes.
//!
//! Allocations are counted by divan's `AllocProfiler` (per iteration): the
//! 256-chunk and 4096-chunk runs allocate the same constant number, i.e.
//! 0 allocations per chunk.

use std::hint::black_box;
use std::io::Read;
use std::time::{Duration, Instant};

use divan::Bencher;
use smolbox_core::Operation;
use smolbox_core::http1::{ExchangeConfig, HttpEvent, HttpExchange, Method, Request};

#[global_allocator]
static ALLOC: divan::AllocProfiler = divan::AllocProfiler::system();

const BODY: usize = 1 << 20;
const READ: usize = 16 * 1024;
const HEAD: &[u8] = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: application/octet-stream\r\n\r\n";

fn main() {
    divan::main();
}

/// The chunked framing of a 1 MiB body in `chunk`-byte chunks.
fn chunked_body(chunk: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(BODY + BODY / chunk * 12 + 8);
    let payload: Vec<u8> = (0..BODY).map(|i| (i % 251) as u8).collect();
    for c in payload.chunks(chunk) {
        out.extend_from_slice(format!("{:x}\r\n", c.len()).as_bytes());
        out.extend_from_slice(c);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"0\r\n\r\n");
    out
}

fn exchange(now: Instant) -> HttpExchange {
    let mut config = ExchangeConfig::new("bench", now + Duration::from_secs(3600));
    config.max_response_body = 32 << 20;
    let request = Request::new(Operation::Download, Method::Get, "/file".into());
    let mut x = HttpExchange::new(&request, &config, now).expect("exchange");
    let _ = x.poll_transmit(&mut Vec::new());
    x
}

/// Feeds head + body in 16 KiB reads; returns the payload length.
fn smolbox_decode(x: &mut HttpExchange, now: Instant, body: &[u8]) -> usize {
    let mut total = 0;
    let mut ended = false;
    for piece in std::iter::once(HEAD).chain(body.chunks(READ)) {
        x.handle_input(now, piece).expect("input");
        while let Some(ev) = x.poll_event() {
            match ev {
                HttpEvent::Data(d) => total += black_box(d).len(),
                HttpEvent::End => ended = true,
                HttpEvent::Head(h) => {
                    black_box(h);
                }
                other => panic!("{other:?}"),
            }
        }
    }
    assert!(ended && total == BODY);
    total
}

fn chunked_smolbox(bencher: Bencher<'_, '_>, chunk: usize) {
    let body = chunked_body(chunk);
    #[allow(clippy::disallowed_methods)] // benches may read the clock; only an origin
    let now = Instant::now();
    bencher
        .counter(divan::counter::BytesCount::new(body.len()))
        .with_inputs(|| exchange(now))
        .bench_local_refs(|x| smolbox_decode(x, now, &body));
}

fn chunked_peer(bencher: Bencher<'_, '_>, chunk: usize) {
    let body = chunked_body(chunk);
    let mut buf = vec![0u8; READ];
    bencher
        .counter(divan::counter::BytesCount::new(body.len()))
        .bench_local(|| {
            let mut d = chunked_transfer::Decoder::new(black_box(body.as_slice()));
            let mut total = 0;
            loop {
                let n = d.read(&mut buf).expect("chunked_transfer");
                if n == 0 {
                    break;
                }
                total += black_box(&buf[..n]).len();
            }
            assert_eq!(total, BODY);
            total
        });
}

fn chunked_memcpy(bencher: Bencher<'_, '_>, chunk: usize) {
    let body = chunked_body(chunk);
    let mut buf = Vec::with_capacity(READ);
    bencher
        .counter(divan::counter::BytesCount::new(body.len()))
        .bench_local(|| {
            let mut total = 0;
            for piece in black_box(body.as_slice()).chunks(READ) {
                buf.clear();
                buf.extend_from_slice(piece);
                total += black_box(&buf).len();
            }
            total
        });
}

mod chunked_4k {
    use super::*;

    #[divan::bench(sample_count = 400)]
    fn smolbox(b: Bencher<'_, '_>) {
        chunked_smolbox(b, 4096);
    }

    #[divan::bench(sample_count = 400)]
    fn chunked_transfer(b: Bencher<'_, '_>) {
        chunked_peer(b, 4096);
    }

    #[divan::bench(sample_count = 400)]
    fn memcpy(b: Bencher<'_, '_>) {
        chunked_memcpy(b, 4096);
    }
}

mod chunked_256 {
    use super::*;

    #[divan::bench(sample_count = 400)]
    fn smolbox(b: Bencher<'_, '_>) {
        chunked_smolbox(b, 256);
    }

    #[divan::bench(sample_count = 400)]
    fn chunked_transfer(b: Bencher<'_, '_>) {
        chunked_peer(b, 256);
    }

    #[divan::bench(sample_count = 400)]
    fn memcpy(b: Bencher<'_, '_>) {
        chunked_memcpy(b, 256);
    }
}

mod head_8_headers {
    use super::*;

    const REPLY: &[u8] = b"HTTP/1.1 200 OK\r\n\
Content-Type: application/json\r\n\
Content-Length: 0\r\n\
Date: Sun, 29 Nov 2026 08:00:00 GMT\r\n\
Server: smolvm/1.9.2\r\n\
Connection: keep-alive\r\n\
X-Request-Id: 6f1c2a9e-8d47-4b1e-9a53-0c2d7e41b8f5\r\n\
Cache-Control: no-store\r\n\
Vary: Accept\r\n\r\n";

    /// The whole head path, with the look-ups a reply decoder needs
    /// (status, single content-type + media type, framing, keep-alive).
    #[divan::bench(sample_size = 64, sample_count = 400)]
    fn smolbox(bencher: Bencher<'_, '_>) {
        #[allow(clippy::disallowed_methods)] // benches may read the clock; only an origin
        let now = Instant::now();
        bencher
            .counter(divan::counter::BytesCount::new(REPLY.len()))
            .with_inputs(|| exchange(now))
            .bench_local_refs(|x| {
                x.handle_input(now, black_box(REPLY)).expect("input");
                match x.poll_event() {
                    Some(HttpEvent::Head(h)) => {
                        assert!(h.media_type_is("application/json") && h.keep_alive);
                        h.status
                    }
                    _ => unreachable!("a head"),
                }
            });
    }

    #[divan::bench(sample_size = 64, sample_count = 400)]
    fn httparse_raw(bencher: Bencher<'_, '_>) {
        bencher
            .counter(divan::counter::BytesCount::new(REPLY.len()))
            .bench_local(|| {
                let mut headers = [httparse::EMPTY_HEADER; 64];
                let mut r = httparse::Response::new(&mut headers);
                let n = r.parse(black_box(REPLY)).expect("parse");
                black_box(n.is_complete());
                r.code
            });
    }
}
