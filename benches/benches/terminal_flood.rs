//! Terminal output throughput on a stream that is not PTY-bound (issue 16
//! item 6): the end-to-end suite's flood peer (`smolbox_tests::flood`)
//! answers the health and image preflights and the terminal upgrade, then
//! sends 64 KiB binary frames as fast as the socket takes them (one
//! prebuilt 1 MiB buffer written again and again) once the client sent its
//! first frame, then the exit frame and a close. In the same run:
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

use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::Duration;

use divan::Bencher;
use divan::counter::BytesCount;
use futures_util::{SinkExt, StreamExt};
use smolbox_core::Secret;
use smolbox_core::terminal::TerminalSpec;
use smolbox_core::worker::{Budgets, Endpoint, EndpointConfig};
use smolbox_tests::flood::{Flood, FloodPeer, FloodStart};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

/// Output bytes per session (per iteration).
const FLOOD: usize = 64 << 20;
/// Payload of each binary frame the server sends.
const FRAME: usize = 64 << 10;

fn main() {
    divan::main();
}

// ---- the flood server -------------------------------------------------------

/// The end-to-end suite's flood peer (`smolbox_tests::flood`), started once
/// for the whole run (it keeps serving after its handle is dropped):
/// `FLOOD` bytes in `FRAME`-byte frames from the client's first frame on.
fn server() -> SocketAddr {
    static ADDR: OnceLock<SocketAddr> = OnceLock::new();
    *ADDR.get_or_init(|| {
        FloodPeer::with(Flood {
            total: FLOOD,
            frame: FRAME,
            start: FloodStart::AfterFirstFrame,
        })
        .addr()
    })
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
