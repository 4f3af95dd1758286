//! Terminal output throughput on a stream that is not PTY-bound (issue 16
//! item 6): a WebSocket server in this bench answers the health preflight
//! and the terminal upgrade, then sends 64 KiB binary frames as fast as the
//! socket takes them (one prebuilt buffer written again and again) once the
//! client sent its first frame, then the exit frame and a close. In the
//! same run:
//!
//! * `Terminal::next` on the tokio shell (current-thread runtime);
//! * `Terminal::next` on the blocking shell;
//! * a `tokio-tungstenite` client reading the same stream;
//! * `memcpy` of the same number of bytes (the physical limit).
//!
//! Each smolbox client sends the frame that starts the flood right after
//! the open and then only pulls (session 8: the open counts as the first
//! pull and a live consumer's queue is never overflowed; before, both shells
//! ended the session with `output_limit`, see BENCHMARKS.md).
//!
//! The server runs on its own threads (blocking `std::net`), so on this
//! 2-core machine the client and the server each get about one core; the
//! server's work per byte is one `write` of a prebuilt buffer.
//!
//! `cargo bench -p smolbox-benches --bench terminal_flood`

#![allow(clippy::unwrap_used)] // benchmark set-up: a failure aborts the run

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::OnceLock;
use std::time::Duration;

use divan::Bencher;
use divan::counter::BytesCount;
use futures_util::{SinkExt, StreamExt};
use smolbox_core::Secret;
use smolbox_core::terminal::TerminalSpec;
use smolbox_core::worker::{Budgets, Endpoint, EndpointConfig};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

/// Output bytes per session (per iteration).
const FLOOD: usize = 64 << 20;
/// Payload of each binary frame the server sends.
const FRAME: usize = 64 << 10;
/// Frames per prebuilt write.
const FRAMES_PER_WRITE: usize = 16;

fn main() {
    divan::main();
}

// ---- the flood server -------------------------------------------------------

fn server() -> SocketAddr {
    static ADDR: OnceLock<SocketAddr> = OnceLock::new();
    *ADDR.get_or_init(|| {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                std::thread::spawn(move || serve(conn));
            }
        });
        addr
    })
}

/// One connection: health and machine requests (keep-alive) until an
/// upgrade, then the flood.
fn serve(mut conn: TcpStream) {
    conn.set_nodelay(true).unwrap();
    let mut buf = Vec::with_capacity(8192);
    loop {
        let Some(head) = read_head(&mut conn, &mut buf) else {
            return;
        };
        if head.starts_with("GET /health ") {
            let body = r#"{"status":"ok","version":"1.22.0","machines":{"total":1,"running":1},"uptime_seconds":5}"#;
            let reply = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            );
            if conn.write_all(reply.as_bytes()).is_err() {
                return;
            }
            continue;
        }
        if head.starts_with("GET /api/v1/machines/m1 ") {
            // The terminal's image preflight: a plain image machine.
            let body = r#"{"name":"m1","image":"alpine:3.19","state":"running","cpus":1,"memoryMb":256,"pid":7,"mounts":[],"ports":[],"network":false,"gpu":false,"cuda":false,"storageGb":1,"overlayGb":1,"branchable":false,"forkable":false,"createdAt":1}"#;
            let reply = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            );
            if conn.write_all(reply.as_bytes()).is_err() {
                return;
            }
            continue;
        }
        let key = head
            .lines()
            .find_map(|l| {
                let (name, value) = l.split_once(':')?;
                name.trim()
                    .eq_ignore_ascii_case("sec-websocket-key")
                    .then(|| value.trim().to_owned())
            })
            .unwrap();
        let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
        let reply = format!(
            "HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: Upgrade\r\nsec-websocket-accept: {accept}\r\n\r\n"
        );
        conn.write_all(reply.as_bytes()).unwrap();
        flood(conn);
        return;
    }
}

/// Reads one request head (up to the blank line) into a string; bytes
/// after it stay in `buf`. `None` at the end of the stream.
fn read_head(conn: &mut TcpStream, buf: &mut Vec<u8>) -> Option<String> {
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).into_owned();
            buf.drain(..end + 4);
            return Some(head);
        }
        let mut chunk = [0u8; 4096];
        match conn.read(&mut chunk) {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// Sends `FLOOD` bytes of output in 64 KiB binary frames, then the exit
/// frame and a close; a second thread drains what the client sends.
fn flood(mut conn: TcpStream) {
    let mut reader = conn.try_clone().unwrap();
    let (started, start) = std::sync::mpsc::channel();
    let drain = std::thread::spawn(move || {
        let mut sink = vec![0u8; 16 << 10];
        let mut first = Some(started);
        while matches!(reader.read(&mut sink), Ok(n) if n > 0) {
            if let Some(s) = first.take() {
                let _ = s.send(());
            }
        }
    });
    // The flood starts with the client's first frame.
    if start.recv().is_err() {
        return;
    }
    let mut frame = Vec::with_capacity(FRAMES_PER_WRITE * (FRAME + 10));
    for _ in 0..FRAMES_PER_WRITE {
        frame.extend_from_slice(&[0x82, 127]);
        frame.extend_from_slice(&(FRAME as u64).to_be_bytes());
        frame.extend((0..FRAME).map(|i| b'a' + (i % 26) as u8));
    }
    let mut sent = 0;
    while sent < FLOOD {
        if conn.write_all(&frame).is_err() {
            return;
        }
        sent += FRAMES_PER_WRITE * FRAME;
    }
    let exit = br#"{"type":"exit","code":0}"#;
    let mut tail = vec![0x81, exit.len() as u8];
    tail.extend_from_slice(exit);
    tail.extend_from_slice(&[0x88, 2, 0x03, 0xe8]);
    let _ = conn.write_all(&tail);
    // The client's close echo ends the drain; then the socket closes.
    let _ = drain.join();
}

// ---- clients ------------------------------------------------------------

fn endpoint() -> Endpoint {
    Endpoint::new(EndpointConfig {
        id: "flood".into(),
        base_url: format!("http://{}", server()),
        allow_insecure_loopback: true,
        token: Some(Secret::new("bench-token")),
        budgets: Budgets {
            operation: Duration::from_secs(60),
            receive_idle: Duration::from_secs(30),
            ..Budgets::default()
        },
        ..EndpointConfig::default()
    })
    .unwrap()
}

fn spec() -> TerminalSpec {
    let mut spec = TerminalSpec::new("/bin/sh");
    spec.session_budget = Duration::from_secs(60);
    spec.idle_budget = Duration::from_secs(30);
    spec.max_buffer_bytes = 1 << 20;
    spec
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[divan::bench_group(name = "terminal_flood", sample_count = 10, sample_size = 1)]
mod terminal_flood {
    use super::*;

    /// `Terminal::next` on the tokio shell until the exit.
    #[divan::bench]
    fn tokio(b: Bencher<'_, '_>) {
        let rt = runtime();
        let client = smolbox_tokio::Client::new(endpoint()).unwrap();
        b.counter(BytesCount::new(FLOOD)).bench_local(|| {
            rt.block_on(async {
                let mut t = client.terminal("m1", &spec()).await.unwrap();
                t.input(b"go").await.unwrap();
                let mut n = 0usize;
                loop {
                    match t.next(Duration::from_secs(30)).await.unwrap() {
                        smolbox_tokio::TerminalEvent::Output(b) => n += b.len(),
                        smolbox_tokio::TerminalEvent::Closed(o) => {
                            o.unwrap();
                            break;
                        }
                        _ => {}
                    }
                }
                assert_eq!(n, FLOOD);
            });
        });
    }

    /// `Terminal::next` on the blocking shell until the exit.
    #[divan::bench]
    fn blocking(b: Bencher<'_, '_>) {
        let client = smolbox_blocking::Client::new(endpoint()).unwrap();
        b.counter(BytesCount::new(FLOOD)).bench_local(|| {
            let mut t = client.terminal("m1", &spec()).unwrap();
            t.input(b"go").unwrap();
            let mut n = 0usize;
            loop {
                match t.next(Duration::from_secs(30)).unwrap() {
                    smolbox_blocking::TerminalEvent::Output(b) => n += b.len(),
                    smolbox_blocking::TerminalEvent::Closed(o) => {
                        o.unwrap();
                        break;
                    }
                    _ => {}
                }
            }
            assert_eq!(n, FLOOD);
        });
    }

    /// `tokio-tungstenite` reading the same stream (its default
    /// configuration: 64 MiB messages, 16 MiB frames).
    #[divan::bench]
    fn tungstenite(b: Bencher<'_, '_>) {
        let rt = runtime();
        let url = format!(
            "ws://{}/api/v1/machines/m1/exec/interactive?cmd=%2Fbin%2Fsh&cols=80&rows=24",
            server()
        );
        b.counter(BytesCount::new(FLOOD)).bench_local(|| {
            rt.block_on(async {
                let mut req = url.as_str().into_client_request().unwrap();
                req.headers_mut()
                    .insert("authorization", "Bearer bench-token".parse().unwrap());
                let tcp = tokio::net::TcpStream::connect(server()).await.unwrap();
                tcp.set_nodelay(true).unwrap();
                let (mut ws, _) = tokio_tungstenite::client_async(req, tcp).await.unwrap();
                ws.send(Message::Binary(b"go".to_vec().into()))
                    .await
                    .unwrap();
                let mut n = 0usize;
                while let Some(m) = ws.next().await {
                    match m.unwrap() {
                        Message::Binary(b) => n += b.len(),
                        Message::Text(_) => {}
                        Message::Close(_) => break,
                        _ => {}
                    }
                }
                let _ = ws.close(None).await;
                assert_eq!(n, FLOOD);
            });
        });
    }

    /// The physical limit: copying the same bytes in 64 KiB pieces.
    #[divan::bench]
    fn memcpy(b: Bencher<'_, '_>) {
        // Source and destination 2 KiB apart modulo 4 KiB: clear of this
        // host's `rep movsb` aliasing slow path (see results/ws.md).
        let mut buf = vec![1u8; 2 * FRAME + 2048];
        let (src, dst) = buf.split_at_mut(FRAME + 2048);
        let src = &src[..FRAME];
        let dst = &mut dst[..FRAME];
        b.counter(BytesCount::new(FLOOD)).bench_local(|| {
            for _ in 0..FLOOD / FRAME {
                dst.copy_from_slice(divan::black_box(src));
                divan::black_box(&mut *dst);
            }
        });
    }
}
