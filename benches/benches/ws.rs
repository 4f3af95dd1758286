//! WebSocket frame decode and encode: smolbox-core's `WsClient` against
//! tungstenite and fastwebsockets, all driven over in-memory buffers (no
//! sockets, no runtime), and memcpy of the same bytes as the floor.
//!
//! Decode feeds a prepared server byte stream in 64 KiB reads (the largest
//! chunk `WsClient::handle_input` takes, features C7.2) and touches every
//! payload; encode masks client frames with fresh random keys.
//!
//!   cargo bench -p smolbox-benches --bench ws
//!
//! Figures: benches/results/ws.md.

use std::future::Future;
use std::io::{self, Read, Write};
use std::pin::{Pin, pin};
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use divan::counter::{BytesCount, ItemsCount};
use divan::{Bencher, black_box};
use rand::RngCore as _;
use smolbox_core::ws::{MAX_INPUT_CHUNK, WsClient, WsConfig, WsEvent, handshake};

#[global_allocator]
static ALLOC: divan::AllocProfiler = divan::AllocProfiler::system();

fn main() {
    if let Ok(which) = std::env::var("SMOLBOX_WS_PROFILE") {
        profile(&which);
        return;
    }
    divan::main();
}

/// For an instruction counter (callgrind): one 16-byte-frame case over
/// `SMOLBOX_WS_PROFILE_FRAMES` frames (default 409,600, in batches of
/// 4,096), nothing else. Instructions per frame = the difference of two
/// runs with different frame counts over the difference of the counts
/// (the set-up is the same in both). Cases: `decode-smolbox` (`poll_event`),
/// `decode-smolbox-batch` (`poll_binary_frames`), `decode-tungstenite`,
/// `decode-fastwebsockets`, `encode-smolbox`, `encode-tungstenite`,
/// `encode-fastwebsockets`, `memcpy` (the frames' bytes copied).
///
/// `SMOLBOX_WS_PROFILE=decode-smolbox-batch valgrind --tool=callgrind target/release/deps/ws-…`
#[allow(clippy::print_stdout)] // the profile's one line
fn profile(which: &str) {
    const PAYLOAD: usize = 16;
    const BATCH: usize = 4_096;
    let frames: usize = std::env::var("SMOLBOX_WS_PROFILE_FRAMES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100 * BATCH);
    let rounds = frames.div_ceil(BATCH);
    let stream = stream_of(PAYLOAD, BATCH);
    let t = now();
    let mut sum = 0usize;
    match which {
        "memcpy" => {
            let mut dst: Vec<u8> = Vec::with_capacity(2 * MAX_INPUT_CHUNK);
            for _ in 0..rounds {
                for chunk in black_box(&stream).chunks(MAX_INPUT_CHUNK) {
                    dst.clear();
                    dst.extend_from_slice(chunk);
                    black_box(&mut dst);
                }
            }
        }
        "decode-smolbox" => {
            let mut ws = open_client(1 << 20);
            for _ in 0..rounds {
                sum = sum.wrapping_add(smolbox_decode(&mut ws, black_box(&stream), t));
            }
        }
        "decode-smolbox-batch" => {
            let mut ws = open_client(1 << 20);
            for _ in 0..rounds {
                sum = sum.wrapping_add(smolbox_decode_batch(&mut ws, black_box(&stream), t));
            }
        }
        "decode-tungstenite" => {
            let mut ws = tungstenite::WebSocket::from_raw_socket(
                MemStream::new(stream.clone()),
                tungstenite::protocol::Role::Client,
                Some(tungstenite_config()),
            );
            for _ in 0..rounds * BATCH {
                if let Ok(tungstenite::Message::Binary(m)) = ws.read() {
                    sum = sum
                        .wrapping_add(m.len())
                        .wrapping_add(usize::from(m[m.len() - 1]));
                }
            }
        }
        "decode-fastwebsockets" => {
            let mut ws = fastwebsockets::WebSocket::after_handshake(
                MemStream::new(stream.clone()),
                fastwebsockets::Role::Client,
            );
            ws.set_max_message_size(1 << 20);
            ready(async {
                for _ in 0..rounds * BATCH {
                    let f = ws.read_frame().await.expect("frame");
                    sum = sum
                        .wrapping_add(f.payload.len())
                        .wrapping_add(usize::from(f.payload[f.payload.len() - 1]));
                }
            });
        }
        "encode-smolbox" => {
            let mut ws = open_client(1 << 20);
            let mut entropy = random_bytes(1 << 16);
            let mut rng = rand::thread_rng();
            let body = random_bytes(PAYLOAD);
            for _ in 0..rounds {
                for _ in 0..BATCH {
                    let wanted = ws.entropy_wanted();
                    if wanted > 0 {
                        rng.fill_bytes(&mut entropy[..wanted]);
                        ws.handle_entropy(&entropy[..wanted]);
                    }
                    ws.send_binary(t, black_box(&body)).expect("send");
                }
                let taken = black_box(ws.transmit_data()).len();
                ws.consume_transmit(taken);
            }
        }
        "encode-tungstenite" => {
            let body = tungstenite::Bytes::from(random_bytes(PAYLOAD));
            let mut ws = tungstenite::WebSocket::from_raw_socket(
                MemStream::new(Vec::new()),
                tungstenite::protocol::Role::Client,
                Some(tungstenite_config()),
            );
            for _ in 0..rounds {
                for _ in 0..BATCH {
                    ws.write(tungstenite::Message::Binary(body.clone()))
                        .expect("write");
                }
                ws.flush().expect("flush");
            }
        }
        "encode-fastwebsockets" => {
            let mut scratch = random_bytes(PAYLOAD);
            let mut ws = fastwebsockets::WebSocket::after_handshake(
                MemStream::new(Vec::new()),
                fastwebsockets::Role::Client,
            );
            ws.set_writev(false);
            ready(async {
                for _ in 0..rounds * BATCH {
                    let frame = fastwebsockets::Frame::binary(
                        fastwebsockets::Payload::BorrowedMut(&mut scratch),
                    );
                    ws.write_frame(frame).await.expect("write");
                }
            });
        }
        other => panic!("unknown SMOLBOX_WS_PROFILE {other}"),
    }
    println!(
        "{which}: {} frames of {PAYLOAD} B (checksum {sum})",
        rounds * BATCH
    );
}

const KEY: [u8; 16] = *b"the sample nonce";

/// Frames per iteration: about 256 KiB (L2-resident) for large frames,
/// 4,096 frames for small ones, so one sample stays short on a busy host.
fn batch(payload: usize) -> usize {
    (262_144 / (payload + 14)).clamp(4, 4_096)
}

fn server_frame(out: &mut Vec<u8>, fin: bool, opcode: u8, payload: &[u8]) {
    out.push(if fin { 0x80 | opcode } else { opcode });
    let len = payload.len();
    if len < 126 {
        out.push(len as u8);
    } else if len <= 0xffff {
        out.push(126);
        out.extend_from_slice(&(len as u16).to_be_bytes());
    } else {
        out.push(127);
        out.extend_from_slice(&(len as u64).to_be_bytes());
    }
    out.extend_from_slice(payload);
}

fn stream_of(payload: usize, frames: usize) -> Vec<u8> {
    let body: Vec<u8> = (0..payload).map(|i| i as u8).collect();
    let mut s = Vec::new();
    for _ in 0..frames {
        server_frame(&mut s, true, 0x2, &body);
    }
    s
}

fn fragmented_stream(messages: usize) -> Vec<u8> {
    let body: Vec<u8> = (0..4_096).map(|i| i as u8).collect();
    let mut s = Vec::new();
    for _ in 0..messages {
        for i in 0..16 {
            let opcode = if i == 0 { 0x2 } else { 0x0 };
            server_frame(&mut s, i == 15, opcode, &body);
        }
    }
    s
}

/// `bytes` copied into a fresh allocation at an offset chosen so that
/// `(dst - src) % 4096 == 2048` for the destination the bytes will be
/// copied to. On this host (AMD EPYC, glibc) `memcpy` of 64 KiB runs ~20x
/// slower when the destination sits 1–31 bytes after the source modulo
/// 4 KiB; placing every measured copy away from that window keeps the
/// comparison about the codecs, not about where malloc put a buffer.
/// Returns the allocation and the offset where `bytes` start.
fn placed(bytes: &[u8], dst: usize) -> (Vec<u8>, usize) {
    let mut v = vec![0u8; bytes.len() + 8_192];
    let base = v.as_ptr() as usize;
    let off = (dst.wrapping_sub(base).wrapping_sub(2_048)) % 4_096;
    v[off..off + bytes.len()].copy_from_slice(bytes);
    (v, off)
}

fn random_bytes(n: usize) -> Vec<u8> {
    let mut v = vec![0; n];
    getrandom::fill(&mut v).expect("OS randomness");
    v
}

#[allow(clippy::disallowed_methods)] // benches own the clock
fn now() -> Instant {
    Instant::now()
}

/// An open `WsClient` with the 101 already consumed.
fn open_client(max_message_len: usize) -> WsClient {
    let t = now();
    let mut c = WsConfig::new("localhost", "/bench");
    c.max_message_len = max_message_len;
    let mut ws = WsClient::new(c, KEY, t).expect("config");
    ws.handle_entropy(&random_bytes(4_096));
    let mut out = Vec::new();
    let _ = ws.poll_transmit(&mut out);
    let accept = handshake::accept_for(&handshake::encode_key(&KEY));
    let reply = format!(
        "HTTP/1.1 101 S\r\nupgrade: websocket\r\nconnection: upgrade\r\nsec-websocket-accept: {accept}\r\n\r\n"
    );
    ws.handle_input(t, reply.as_bytes()).expect("101");
    assert!(matches!(ws.poll_event(), Some(WsEvent::Open)));
    ws
}

/// Reads `stream` straight into the client's `input_buffer` (the copy a
/// socket read does), touching every message; returns a checksum so
/// nothing is optimised away.
#[inline(never)]
fn smolbox_decode(ws: &mut WsClient, stream: &[u8], t: Instant) -> usize {
    let mut sum = 0usize;
    let mut pos = 0;
    while pos < stream.len() {
        let buf = ws.input_buffer();
        let n = buf.len().min(stream.len() - pos);
        buf[..n].copy_from_slice(&stream[pos..pos + n]);
        pos += n;
        ws.handle_read(t, n).expect("valid frames");
        while let Some(ev) = ws.poll_event() {
            if let WsEvent::Binary(b) = ev {
                sum = sum
                    .wrapping_add(b.len())
                    .wrapping_add(usize::from(b[b.len() - 1]));
            }
        }
    }
    sum
}

/// [`smolbox_decode`] with the batch path (`poll_binary_frames`, then
/// `poll_event` for anything else), as the terminal session drains.
#[inline(never)]
fn smolbox_decode_batch(ws: &mut WsClient, stream: &[u8], t: Instant) -> usize {
    let mut sum = 0usize;
    let mut pos = 0;
    while pos < stream.len() {
        let buf = ws.input_buffer();
        let n = buf.len().min(stream.len() - pos);
        buf[..n].copy_from_slice(&stream[pos..pos + n]);
        pos += n;
        ws.handle_read(t, n).expect("valid frames");
        loop {
            ws.poll_binary_frames(|b| {
                sum = sum
                    .wrapping_add(b.len())
                    .wrapping_add(usize::from(b[b.len() - 1]));
                true
            });
            match ws.poll_event() {
                Some(WsEvent::Binary(b)) => {
                    sum = sum
                        .wrapping_add(b.len())
                        .wrapping_add(usize::from(b[b.len() - 1]));
                }
                Some(_) => {}
                None => break,
            }
        }
    }
    sum
}

/// The same through `handle_input` with 64 KiB chunks (one extra copy of
/// each chunk into the receive buffer, and moves of partial frames).
#[inline(never)]
fn smolbox_decode_chunks(ws: &mut WsClient, stream: &[u8], t: Instant) -> usize {
    let mut sum = 0usize;
    for chunk in stream.chunks(MAX_INPUT_CHUNK) {
        ws.handle_input(t, chunk).expect("valid frames");
        while let Some(ev) = ws.poll_event() {
            if let WsEvent::Binary(b) = ev {
                sum = sum
                    .wrapping_add(b.len())
                    .wrapping_add(usize::from(b[b.len() - 1]));
            }
        }
    }
    sum
}

/// A `Read + Write` (and tokio `AsyncRead + AsyncWrite`) over memory: reads
/// replay `input` cyclically (it holds whole frames, so the stream stays
/// valid) in at most 64 KiB pieces; writes are counted and dropped, like a
/// socket taking them.
struct MemStream {
    input: Vec<u8>,
    pos: usize,
    written: usize,
}

impl MemStream {
    fn new(input: Vec<u8>) -> Self {
        Self {
            input,
            pos: 0,
            written: 0,
        }
    }

    fn fill(&mut self, buf: &mut [u8]) -> usize {
        if self.pos == self.input.len() {
            self.pos = 0;
        }
        let n = buf
            .len()
            .min(MAX_INPUT_CHUNK)
            .min(self.input.len() - self.pos);
        buf[..n].copy_from_slice(&self.input[self.pos..self.pos + n]);
        self.pos += n;
        n
    }
}

impl Read for MemStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        Ok(self.fill(buf))
    }
}

impl Write for MemStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.written += buf.len();
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl tokio::io::AsyncRead for MemStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let n = self.fill(buf.initialize_unfilled());
        buf.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl tokio::io::AsyncWrite for MemStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.written += buf.len();
        Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// Polls a future over an always-ready in-memory stream to completion.
fn ready<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
    }
}

fn tungstenite_config() -> tungstenite::protocol::WebSocketConfig {
    let mut c = tungstenite::protocol::WebSocketConfig::default();
    c.max_frame_size = Some(65_536);
    c.max_message_size = Some(1 << 20);
    c
}

// ---- decode -------------------------------------------------------------

const DECODE_SIZES: [usize; 3] = [65_536, 1_024, 16];

#[divan::bench_group(name = "decode_unfragmented")]
mod decode {
    use super::*;

    #[divan::bench(args = DECODE_SIZES)]
    fn memcpy(b: Bencher<'_, '_>, payload: usize) {
        let frames = batch(payload);
        let stream = stream_of(payload, frames);
        let mut dst: Vec<u8> = Vec::with_capacity(2 * MAX_INPUT_CHUNK);
        let (buf, off) = placed(&stream, dst.as_ptr() as usize);
        let stream = &buf[off..off + stream.len()];
        b.counter(ItemsCount::new(frames))
            .counter(BytesCount::new(stream.len()))
            .bench_local(|| {
                for chunk in black_box(stream).chunks(MAX_INPUT_CHUNK) {
                    dst.clear();
                    dst.extend_from_slice(chunk);
                    black_box(&mut dst);
                }
            });
    }

    #[divan::bench(args = DECODE_SIZES)]
    fn smolbox(b: Bencher<'_, '_>, payload: usize) {
        let frames = batch(payload);
        let stream = stream_of(payload, frames);
        let mut ws = open_client(1 << 20);
        let t = now();
        smolbox_decode(&mut ws, &stream, t);
        let (buf, off) = placed(&stream, ws.input_buffer().as_ptr() as usize);
        let stream = &buf[off..off + stream.len()];
        b.counter(ItemsCount::new(frames))
            .counter(BytesCount::new(stream.len()))
            .bench_local(|| smolbox_decode(&mut ws, black_box(stream), t));
    }

    #[divan::bench(args = DECODE_SIZES)]
    fn smolbox_batch(b: Bencher<'_, '_>, payload: usize) {
        let frames = batch(payload);
        let stream = stream_of(payload, frames);
        let mut ws = open_client(1 << 20);
        let t = now();
        smolbox_decode_batch(&mut ws, &stream, t);
        let (buf, off) = placed(&stream, ws.input_buffer().as_ptr() as usize);
        let stream = &buf[off..off + stream.len()];
        b.counter(ItemsCount::new(frames))
            .counter(BytesCount::new(stream.len()))
            .bench_local(|| smolbox_decode_batch(&mut ws, black_box(stream), t));
    }

    #[divan::bench(args = DECODE_SIZES)]
    fn smolbox_handle_input(b: Bencher<'_, '_>, payload: usize) {
        let frames = batch(payload);
        let stream = stream_of(payload, frames);
        let mut ws = open_client(1 << 20);
        let t = now();
        b.counter(ItemsCount::new(frames))
            .counter(BytesCount::new(stream.len()))
            .bench_local(|| smolbox_decode_chunks(&mut ws, black_box(&stream), t));
    }

    #[divan::bench(args = DECODE_SIZES)]
    fn tungstenite(b: Bencher<'_, '_>, payload: usize) {
        let frames = batch(payload);
        let stream = stream_of(payload, frames);
        let mut ws = tungstenite::WebSocket::from_raw_socket(
            MemStream::new(stream.clone()),
            tungstenite::protocol::Role::Client,
            Some(tungstenite_config()),
        );
        b.counter(ItemsCount::new(frames))
            .counter(BytesCount::new(stream.len()))
            .bench_local(|| {
                let mut sum = 0usize;
                for _ in 0..frames {
                    if let Ok(tungstenite::Message::Binary(m)) = ws.read() {
                        sum = sum
                            .wrapping_add(m.len())
                            .wrapping_add(usize::from(m[m.len() - 1]));
                    }
                }
                sum
            });
    }

    #[divan::bench(args = DECODE_SIZES)]
    fn fastwebsockets(b: Bencher<'_, '_>, payload: usize) {
        let frames = batch(payload);
        let stream = stream_of(payload, frames);
        let mut ws = fastwebsockets::WebSocket::after_handshake(
            MemStream::new(stream.clone()),
            fastwebsockets::Role::Client,
        );
        ws.set_max_message_size(1 << 20);
        b.counter(ItemsCount::new(frames))
            .counter(BytesCount::new(stream.len()))
            .bench_local(|| {
                let mut sum = 0usize;
                ready(async {
                    for _ in 0..frames {
                        let f = ws.read_frame().await.expect("frame");
                        sum = sum
                            .wrapping_add(f.payload.len())
                            .wrapping_add(usize::from(f.payload[f.payload.len() - 1]));
                    }
                });
                sum
            });
    }
}

// ---- fragmented ---------------------------------------------------------

/// 64 KiB messages in 16 fragments of 4 KiB, 4 messages per iteration.
#[divan::bench_group(name = "decode_fragmented_64k_16x4k")]
mod fragmented {
    use super::*;

    const MESSAGES: usize = 4;

    #[divan::bench]
    fn memcpy(b: Bencher<'_, '_>) {
        let stream = fragmented_stream(MESSAGES);
        let mut dst: Vec<u8> = Vec::with_capacity(2 * MAX_INPUT_CHUNK);
        let (buf, off) = placed(&stream, dst.as_ptr() as usize);
        let stream = &buf[off..off + stream.len()];
        b.counter(ItemsCount::new(MESSAGES))
            .counter(BytesCount::new(stream.len()))
            .bench_local(|| {
                for chunk in black_box(stream).chunks(MAX_INPUT_CHUNK) {
                    dst.clear();
                    dst.extend_from_slice(chunk);
                    black_box(&mut dst);
                }
            });
    }

    #[divan::bench]
    fn smolbox(b: Bencher<'_, '_>) {
        let stream = fragmented_stream(MESSAGES);
        let mut ws = open_client(65_536);
        let t = now();
        // Warm the buffers: steady state allocates nothing per message.
        smolbox_decode(&mut ws, &stream, t);
        let (buf, off) = placed(&stream, ws.input_buffer().as_ptr() as usize);
        let stream = &buf[off..off + stream.len()];
        b.counter(ItemsCount::new(MESSAGES))
            .counter(BytesCount::new(stream.len()))
            .bench_local(|| smolbox_decode(&mut ws, black_box(stream), t));
    }

    #[divan::bench]
    fn tungstenite(b: Bencher<'_, '_>) {
        let stream = fragmented_stream(MESSAGES);
        let mut ws = tungstenite::WebSocket::from_raw_socket(
            MemStream::new(stream.clone()),
            tungstenite::protocol::Role::Client,
            Some(tungstenite_config()),
        );
        b.counter(ItemsCount::new(MESSAGES))
            .counter(BytesCount::new(stream.len()))
            .bench_local(|| {
                let mut sum = 0usize;
                for _ in 0..MESSAGES {
                    if let Ok(tungstenite::Message::Binary(m)) = ws.read() {
                        sum = sum.wrapping_add(m.len());
                    }
                }
                sum
            });
    }

    #[divan::bench]
    fn fastwebsockets(b: Bencher<'_, '_>) {
        let stream = fragmented_stream(MESSAGES);
        let mut ws =
            fastwebsockets::FragmentCollector::new(fastwebsockets::WebSocket::after_handshake(
                MemStream::new(stream.clone()),
                fastwebsockets::Role::Client,
            ));
        b.counter(ItemsCount::new(MESSAGES))
            .counter(BytesCount::new(stream.len()))
            .bench_local(|| {
                let mut sum = 0usize;
                ready(async {
                    for _ in 0..MESSAGES {
                        let f = ws.read_frame().await.expect("frame");
                        sum = sum.wrapping_add(f.payload.len());
                    }
                });
                sum
            });
    }
}

// ---- encode -------------------------------------------------------------

const ENCODE_SIZES: [usize; 3] = [65_536, 1_024, 16];

/// Frames encoded per iteration.
fn encode_batch(payload: usize) -> usize {
    (262_144 / (payload + 14)).clamp(4, 4_096)
}

#[divan::bench_group(name = "encode_masked")]
mod encode {
    use super::*;

    #[divan::bench(args = ENCODE_SIZES)]
    fn memcpy(b: Bencher<'_, '_>, payload: usize) {
        let n = encode_batch(payload);
        let mut out: Vec<u8> = Vec::with_capacity(n * (payload + 14));
        let (buf, off) = placed(&random_bytes(payload), out.as_ptr() as usize);
        let body = &buf[off..off + payload];
        b.counter(ItemsCount::new(n))
            .counter(BytesCount::new(n * payload))
            .bench_local(|| {
                out.clear();
                for _ in 0..n {
                    out.extend_from_slice(black_box(body));
                }
                black_box(&mut out);
            });
    }

    #[divan::bench(args = ENCODE_SIZES)]
    fn smolbox(b: Bencher<'_, '_>, payload: usize) {
        let n = encode_batch(payload);
        let mut ws = open_client(1 << 20);
        let mut entropy = random_bytes(1 << 16);
        let mut rng = rand::thread_rng();
        let t = now();
        let mut send_all = |ws: &mut WsClient, body: &[u8]| {
            for _ in 0..n {
                let wanted = ws.entropy_wanted();
                if wanted > 0 {
                    // Fresh CSPRNG bytes (ChaCha, OS-seeded) in bulk:
                    // unpredictable masks, as the peers' `rand` gives theirs.
                    rng.fill_bytes(&mut entropy[..wanted]);
                    ws.handle_entropy(&entropy[..wanted]);
                }
                ws.send_binary(t, black_box(body)).expect("send");
            }
            // The shell writes straight from the client's buffer.
            let taken = black_box(ws.transmit_data()).len();
            ws.consume_transmit(taken);
        };
        // Warm the send buffer, then place the payload relative to where
        // its masked copy lands (see `placed`).
        send_all(&mut ws, &vec![0; payload]);
        let header = if payload < 126 {
            6
        } else if payload < 65_536 {
            8
        } else {
            14
        };
        let (buf, off) = placed(
            &random_bytes(payload),
            ws.transmit_data().as_ptr() as usize + header,
        );
        let body = &buf[off..off + payload];
        b.counter(ItemsCount::new(n))
            .counter(BytesCount::new(n * payload))
            .bench_local(|| send_all(&mut ws, body));
    }

    #[divan::bench(args = ENCODE_SIZES)]
    fn tungstenite(b: Bencher<'_, '_>, payload: usize) {
        let n = encode_batch(payload);
        let body = tungstenite::Bytes::from(random_bytes(payload));
        let mut ws = tungstenite::WebSocket::from_raw_socket(
            MemStream::new(Vec::new()),
            tungstenite::protocol::Role::Client,
            Some(tungstenite_config()),
        );
        b.counter(ItemsCount::new(n))
            .counter(BytesCount::new(n * payload))
            .bench_local(|| {
                for _ in 0..n {
                    ws.write(tungstenite::Message::Binary(body.clone()))
                        .expect("write");
                }
                ws.flush().expect("flush");
            });
    }

    #[divan::bench(args = ENCODE_SIZES)]
    fn fastwebsockets(b: Bencher<'_, '_>, payload: usize) {
        let n = encode_batch(payload);
        let body = random_bytes(payload);
        let mut ws = fastwebsockets::WebSocket::after_handshake(
            MemStream::new(Vec::new()),
            fastwebsockets::Role::Client,
        );
        ws.set_writev(false);
        let mut scratch = body;
        b.counter(ItemsCount::new(n))
            .counter(BytesCount::new(n * payload))
            .bench_local(|| {
                ready(async {
                    for _ in 0..n {
                        // fastwebsockets masks the caller's buffer in place, then
                        // copies header and payload into its write buffer.
                        let frame = fastwebsockets::Frame::binary(
                            fastwebsockets::Payload::BorrowedMut(&mut scratch),
                        );
                        ws.write_frame(frame).await.expect("write");
                    }
                });
            });
    }
}
