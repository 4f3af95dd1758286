//! The conformance probe against local peers of our own making (HTTP, SSE
//! and WebSocket servers on 127.0.0.1 written byte by byte here).
//!
//! The same cases run against the blocking shell's probe with
//! `SMOLBOX_PROBE_BIN=target/debug/examples/probe SMOLBOX_PROBE_SHELL=blocking`
//! (after `cargo build -p smolbox-blocking --example probe`).

#![allow(clippy::unwrap_used)] // test code

use std::time::Duration;

use base64::Engine;
use serde_json::Value;
use sha1::{Digest, Sha1};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

/// Runs the probe and returns its JSON lines.
async fn probe(args: Vec<String>) -> Vec<Value> {
    let out = tokio::task::spawn_blocking(move || {
        let bin = std::env::var("SMOLBOX_PROBE_BIN")
            .unwrap_or_else(|_| env!("CARGO_BIN_EXE_smolbox-probe").to_owned());
        std::process::Command::new(bin)
            .args(&args)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn args(mode: &str, url: &str, extra: &[&str]) -> Vec<String> {
    let shell = std::env::var("SMOLBOX_PROBE_SHELL").unwrap_or_else(|_| "tokio".to_owned());
    let mut v: Vec<String> = [
        mode,
        url,
        "--shell",
        &shell,
        "--idle-timeout-ms",
        "2000",
        "--deadline-ms",
        "5000",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    v.extend(extra.iter().map(|s| (*s).to_owned()));
    v
}

async fn listener() -> (TcpListener, String) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    (l, format!("127.0.0.1:{port}"))
}

/// Reads a request head (and a Content-Length body) from `s`.
async fn read_request(s: &mut TcpStream) -> Vec<u8> {
    let mut req = Vec::new();
    let mut b = [0u8; 4096];
    loop {
        let n = s.read(&mut b).await.unwrap();
        if n == 0 {
            return req;
        }
        req.extend_from_slice(&b[..n]);
        if let Some(end) = req.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&req[..end]).to_lowercase();
            let len = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map_or(0, |v| v.trim().parse::<usize>().unwrap());
            while req.len() < end + 4 + len {
                let n = s.read(&mut b).await.unwrap();
                req.extend_from_slice(&b[..n]);
            }
            return req;
        }
    }
}

/// Serves `reply` to one HTTP request; returns the URL authority and a
/// receiver for the request bytes. Counts further connections as failures.
async fn http_once(reply: Vec<u8>) -> (String, oneshot::Receiver<(Vec<u8>, usize)>) {
    let (l, addr) = listener().await;
    let (tx, rx) = oneshot::channel();
    tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        let req = read_request(&mut s).await;
        s.write_all(&reply).await.unwrap();
        s.shutdown().await.ok();
        // Any other connection within a moment would be a retry or redirect.
        let extra = match tokio::time::timeout(Duration::from_millis(200), l.accept()).await {
            Ok(_) => 1,
            Err(_) => 0,
        };
        let _ = tx.send((req, extra));
    });
    (addr, rx)
}

fn reply(status: &str, headers: &[&str], body: &[u8]) -> Vec<u8> {
    let mut r = format!("HTTP/1.1 {status}\r\ncontent-length: {}\r\n", body.len());
    for h in headers {
        r.push_str(h);
        r.push_str("\r\n");
    }
    r.push_str("\r\n");
    let mut r = r.into_bytes();
    r.extend_from_slice(body);
    r
}

fn error_class(lines: &[Value]) -> (&str, Option<u64>) {
    let last = lines.last().unwrap();
    assert_eq!(last["kind"], "error", "{lines:?}");
    (last["error"].as_str().unwrap(), last["status"].as_u64())
}

#[tokio::test(flavor = "multi_thread")]
async fn http_prints_the_decoded_json_reply() {
    let (addr, rx) = http_once(reply(
        "200 OK",
        &["content-type: application/json"],
        br#"{"a":[1,2]}"#,
    ))
    .await;
    let lines = probe(args("http", &format!("http://{addr}/x?y=1"), &[])).await;
    assert_eq!(
        lines,
        vec![serde_json::json!({"kind":"response","status":200,"body":{"a":[1,2]}})]
    );
    let (req, extra) = rx.await.unwrap();
    assert!(req.starts_with(b"GET /x?y=1 HTTP/1.1\r\n"));
    assert_eq!(extra, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn http_post_sends_the_json_document() {
    let (addr, rx) = http_once(reply(
        "201 Created",
        &["content-type: application/json; charset=utf-8"],
        b"{}",
    ))
    .await;
    let lines = probe(args(
        "http",
        &format!("http://{addr}/p"),
        &["--method", "POST", "--json", r#"{"k":"v"}"#],
    ))
    .await;
    assert_eq!(lines[0]["status"], 201);
    let (req, _) = rx.await.unwrap();
    assert!(req.starts_with(b"POST /p HTTP/1.1\r\n"));
    assert!(req.ends_with(br#"{"k":"v"}"#));
}

#[tokio::test(flavor = "multi_thread")]
async fn http_error_classes() {
    let json = "content-type: application/json";
    let cases: Vec<(Vec<u8>, &[&str], &str)> = vec![
        (reply("301 Moved Permanently", &["location: /elsewhere"], b""), &[], "status"),
        (reply("500 Oops", &[json], b"{}"), &[], "status"),
        (reply("200 OK", &[json, "content-encoding: gzip"], b"\x1f\x8b"), &[], "unsupported_encoding"),
        (reply("200 OK", &["content-type: text/html"], b"<p>"), &[], "content_type"),
        (reply("200 OK", &[json], b"{not json"), &[], "json"),
        (reply("200 OK", &[json], b"[1,2,3]"), &["--max-body", "6"], "too_large"),
        (reply("200 OK", &[json, "x-pad: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"], b"[]"), &["--max-header", "40"], "too_large"),
        (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"a\"".to_vec(), &[], "truncated"),
        (b"HTTP/1.1 200 OK\r\nbroken header line\r\n\r\n".to_vec(), &[], "protocol"),
    ];
    for (bytes, extra, class) in cases {
        let (addr, rx) = http_once(bytes).await;
        let lines = probe(args("http", &format!("http://{addr}/"), extra)).await;
        assert_eq!(error_class(&lines).0, class, "{lines:?}");
        let (_, again) = rx.await.unwrap();
        assert_eq!(again, 0, "never follows or retries");
    }
    // A 301 carries its status.
    let (addr, _rx) = http_once(reply("301 Moved Permanently", &["location: /x"], b"")).await;
    let lines = probe(args("http", &format!("http://{addr}/"), &[])).await;
    assert_eq!(error_class(&lines), ("status", Some(301)));
}

#[tokio::test(flavor = "multi_thread")]
async fn http_body_cap_at_n_and_n_plus_1() {
    let body = b"[1,2,3]";
    let (addr, _rx) = http_once(reply("200 OK", &["content-type: application/json"], body)).await;
    let lines = probe(args(
        "http",
        &format!("http://{addr}/"),
        &["--max-body", "7"],
    ))
    .await;
    assert_eq!(lines[0]["kind"], "response");
    let (addr, _rx) = http_once(reply("200 OK", &["content-type: application/json"], body)).await;
    let lines = probe(args(
        "http",
        &format!("http://{addr}/"),
        &["--max-body", "6"],
    ))
    .await;
    assert_eq!(error_class(&lines).0, "too_large");
}

#[tokio::test(flavor = "multi_thread")]
async fn http_silence_is_a_timeout_and_refusal_is_connect() {
    let (l, addr) = listener().await;
    tokio::spawn(async move {
        let (_s, _) = l.accept().await.unwrap();
        tokio::time::sleep(Duration::from_secs(10)).await;
    });
    let mut a = args("http", &format!("http://{addr}/"), &[]);
    a.extend(["--idle-timeout-ms".to_owned(), "100".to_owned()]);
    let lines = probe(a).await;
    assert_eq!(error_class(&lines).0, "timeout");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let lines = probe(args("http", &format!("http://127.0.0.1:{port}/"), &[])).await;
    assert_eq!(error_class(&lines).0, "connect");
}

fn sse_reply(body: &str) -> Vec<u8> {
    reply(
        "200 OK",
        &["content-type: text/event-stream"],
        body.as_bytes(),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn sse_prints_events_then_end() {
    let (addr, rx) = http_once(sse_reply(
        "retry: 2500\nid: 7\ndata: a\ndata: b\n\nevent: tick\ndata: c\n\n: comment\n",
    ))
    .await;
    let lines = probe(args("sse", &format!("http://{addr}/s"), &[])).await;
    assert_eq!(
        lines,
        vec![
            serde_json::json!({"kind":"event","event":"message","data":"a\nb","id":"7"}),
            serde_json::json!({"kind":"event","event":"tick","data":"c","id":"7"}),
            serde_json::json!({"kind":"end","last_event_id":"7","retry_ms":2500}),
        ]
    );
    let (req, _) = rx.await.unwrap();
    assert!(
        String::from_utf8_lossy(&req)
            .to_lowercase()
            .contains("accept: text/event-stream")
    );
    let (addr, _rx) = http_once(sse_reply("data: x\n\n")).await;
    let lines = probe(args("sse", &format!("http://{addr}/s"), &[])).await;
    assert_eq!(
        lines[1],
        serde_json::json!({"kind":"end","last_event_id":"","retry_ms":null})
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn sse_line_cap_at_n_and_n_plus_1() {
    let (addr, _rx) = http_once(sse_reply("data: 12345\n\n")).await;
    let lines = probe(args(
        "sse",
        &format!("http://{addr}/s"),
        &["--max-line", "11"],
    ))
    .await;
    assert_eq!(lines.last().unwrap()["kind"], "end");
    let (addr, _rx) = http_once(sse_reply("data: 12345\n\n")).await;
    let lines = probe(args(
        "sse",
        &format!("http://{addr}/s"),
        &["--max-line", "10"],
    ))
    .await;
    assert_eq!(error_class(&lines).0, "too_large");
}

// ---- WebSocket peer --------------------------------------------------------

const GUID: &str = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// Accepts one upgrade; returns the stream after the 101.
async fn ws_accept(l: &TcpListener) -> TcpStream {
    let (mut s, _) = l.accept().await.unwrap();
    let req = read_request(&mut s).await;
    let text = String::from_utf8_lossy(&req).to_string();
    let key = text
        .lines()
        .find_map(|l| {
            l.to_lowercase()
                .starts_with("sec-websocket-key:")
                .then(|| l[18..].trim().to_owned())
        })
        .unwrap();
    let accept = base64::engine::general_purpose::STANDARD
        .encode(Sha1::digest(format!("{key}{GUID}").as_bytes()));
    let head = format!(
        "HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: Upgrade\r\nsec-websocket-accept: {accept}\r\n\r\n"
    );
    s.write_all(head.as_bytes()).await.unwrap();
    s
}

fn frame(op: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![0x80 | op];
    if payload.len() < 126 {
        f.push(u8::try_from(payload.len()).unwrap());
    } else if payload.len() < 65_536 {
        f.push(126);
        f.extend_from_slice(&u16::try_from(payload.len()).unwrap().to_be_bytes());
    } else {
        f.push(127);
        f.extend_from_slice(&(payload.len() as u64).to_be_bytes());
    }
    f.extend_from_slice(payload);
    f
}

/// Reads one (masked) client frame: (opcode, payload); `None` at EOF.
async fn read_frame(s: &mut TcpStream) -> Option<(u8, Vec<u8>)> {
    let mut h = [0u8; 2];
    s.read_exact(&mut h).await.ok()?;
    let mut len = u64::from(h[1] & 0x7f);
    if len == 126 {
        let mut b = [0u8; 2];
        s.read_exact(&mut b).await.ok()?;
        len = u64::from(u16::from_be_bytes(b));
    } else if len == 127 {
        let mut b = [0u8; 8];
        s.read_exact(&mut b).await.ok()?;
        len = u64::from_be_bytes(b);
    }
    assert!(h[1] & 0x80 != 0, "client frames are masked");
    let mut mask = [0u8; 4];
    s.read_exact(&mut mask).await.ok()?;
    let mut p = vec![0u8; usize::try_from(len).unwrap()];
    s.read_exact(&mut p).await.ok()?;
    for (i, b) in p.iter_mut().enumerate() {
        *b ^= mask[i % 4];
    }
    Some((h[0] & 0x0f, p))
}

fn close_code(payload: &[u8]) -> u16 {
    u16::from_be_bytes([payload[0], payload[1]])
}

#[tokio::test(flavor = "multi_thread")]
async fn ws_prints_messages_and_the_close() {
    let (l, addr) = listener().await;
    let peer = tokio::spawn(async move {
        let mut s = ws_accept(&l).await;
        s.write_all(&frame(1, b"hello")).await.unwrap();
        s.write_all(&frame(2, &[7u8; 8000])).await.unwrap();
        let (op, p) = read_frame(&mut s).await.unwrap();
        assert_eq!((op, close_code(&p)), (8, 1000));
        let mut close = 1000u16.to_be_bytes().to_vec();
        close.extend_from_slice("done ✓".as_bytes());
        s.write_all(&frame(8, &close)).await.unwrap();
    });
    let lines = probe(args("ws", &format!("ws://{addr}/w"), &["--recv", "2"])).await;
    peer.await.unwrap();
    assert_eq!(lines[0]["text"], "hello");
    assert_eq!(lines[0]["len"], 5);
    assert_eq!(
        lines[0]["sha256"],
        "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
    );
    assert_eq!(
        (lines[1]["type"].as_str(), lines[1]["len"].as_u64()),
        (Some("binary"), Some(8000))
    );
    assert_eq!(
        lines[2],
        serde_json::json!({"kind":"close","code":1000,"reason":"done ✓"})
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn ws_sends_in_order_and_reports_an_empty_close_as_1005() {
    let (l, addr) = listener().await;
    let peer = tokio::spawn(async move {
        let mut s = ws_accept(&l).await;
        let a = read_frame(&mut s).await.unwrap();
        let b = read_frame(&mut s).await.unwrap();
        s.write_all(&frame(8, b"")).await.unwrap();
        let echo = read_frame(&mut s).await.unwrap();
        (a, b, echo.0)
    });
    let lines = probe(args(
        "ws",
        &format!("ws://{addr}/w"),
        &["--send", "text:hi", "--send", "hex:01ff"],
    ))
    .await;
    let (a, b, echo) = peer.await.unwrap();
    assert_eq!(a, (1, b"hi".to_vec()));
    assert_eq!(b, (2, vec![1, 0xff]));
    assert_eq!(echo, 8);
    assert_eq!(
        lines.last().unwrap(),
        &serde_json::json!({"kind":"close","code":1005,"reason":""})
    );
}

/// Bytes the peer sends, extra probe flags, the class, the close code sent.
type WsCase = (Vec<u8>, &'static [&'static str], &'static str, Option<u16>);

/// Bad peers: the error class, and the close code the probe sent first.
#[tokio::test(flavor = "multi_thread")]
async fn ws_failures_send_the_matching_close_code() {
    let cases: Vec<WsCase> = vec![
        (frame(1, b"\xff\xfe"), &[], "invalid_utf8", Some(1007)),
        (
            frame(2, &[0u8; 2000]),
            &["--max-frame", "1000"],
            "too_large",
            Some(1009),
        ),
        (vec![0x81 | 0x70, 0], &[], "protocol", Some(1002)),
        (Vec::new(), &[], "abnormal_close", None),
    ];
    for (bytes, extra, class, code) in cases {
        let (l, addr) = listener().await;
        let peer = tokio::spawn(async move {
            let mut s = ws_accept(&l).await;
            s.write_all(&bytes).await.unwrap();
            if bytes.is_empty() {
                drop(s);
                return None;
            }
            read_frame(&mut s).await.map(|(op, p)| {
                assert_eq!(op, 8);
                close_code(&p)
            })
        });
        let lines = probe(args("ws", &format!("ws://{addr}/w"), extra)).await;
        assert_eq!(error_class(&lines).0, class, "{lines:?}");
        assert_eq!(peer.await.unwrap(), code);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn ws_upgrade_refused_is_a_handshake_error() {
    let (addr, _rx) = http_once(reply("404 Not Found", &[], b"")).await;
    let lines = probe(args("ws", &format!("ws://{addr}/w"), &[])).await;
    assert_eq!(error_class(&lines).0, "handshake");
}

#[tokio::test(flavor = "multi_thread")]
async fn ws_echo_returns_each_message_with_its_type() {
    let (l, addr) = listener().await;
    let peer = tokio::spawn(async move {
        let mut s = ws_accept(&l).await;
        s.write_all(&frame(1, b"text-1")).await.unwrap();
        s.write_all(&frame(2, &[1, 2, 3])).await.unwrap();
        let a = read_frame(&mut s).await.unwrap();
        let b = read_frame(&mut s).await.unwrap();
        s.write_all(&frame(8, &1000u16.to_be_bytes()))
            .await
            .unwrap();
        (a, b)
    });
    let lines = probe(args("ws-echo", &format!("ws://{addr}/w"), &[])).await;
    let (a, b) = peer.await.unwrap();
    assert_eq!(a, (1, b"text-1".to_vec()));
    assert_eq!(b, (2, vec![1, 2, 3]));
    assert_eq!(lines.last().unwrap()["code"], 1000);
}

#[tokio::test(flavor = "multi_thread")]
async fn ws_flood_sends_exactly_the_bytes_asked_for() {
    let (l, addr) = listener().await;
    let peer = tokio::spawn(async move {
        let mut s = ws_accept(&l).await;
        let mut total = 0usize;
        let mut messages = 0usize;
        while total < 200_000 {
            let (op, p) = read_frame(&mut s).await.unwrap();
            assert_eq!(op, 2);
            assert!(p.len() <= 65_536);
            total += p.len();
            messages += 1;
        }
        s.write_all(&frame(8, &1000u16.to_be_bytes()))
            .await
            .unwrap();
        (total, messages)
    });
    let lines = probe(args(
        "ws",
        &format!("ws://{addr}/w"),
        &["--flood", "200000"],
    ))
    .await;
    assert_eq!(peer.await.unwrap(), (200_000, 4));
    assert_eq!(lines.last().unwrap()["code"], 1000);
}

#[tokio::test(flavor = "multi_thread")]
async fn ws_a_silent_peer_ends_with_idle_timeout_after_an_unanswered_ping() {
    let (l, addr) = listener().await;
    let peer = tokio::spawn(async move {
        let mut s = ws_accept(&l).await;
        // Never answer; report what the client sent until it hangs up.
        let mut ops = Vec::new();
        while let Some((op, _)) = read_frame(&mut s).await {
            ops.push(op);
        }
        ops
    });
    let lines = probe(args(
        "ws",
        &format!("ws://{addr}/w"),
        &["--idle-timeout-ms", "300"],
    ))
    .await;
    let ops = peer.await.unwrap();
    let last = lines.last().unwrap();
    assert_eq!(last["error"], "timeout", "{last}");
    assert!(
        last["detail"].as_str().unwrap().contains("idle_timeout"),
        "the idle budget, not the deadline: {last}"
    );
    // A keepalive ping (9), then our close 1001 (8).
    assert_eq!(ops, vec![9, 8]);
}

#[tokio::test(flavor = "multi_thread")]
async fn ws_a_peer_that_stops_reading_ends_the_send_with_write_timeout() {
    let (l, addr) = listener().await;
    let (done_tx, done_rx) = oneshot::channel::<()>();
    let peer = tokio::spawn(async move {
        let s = ws_accept(&l).await;
        // Hold the socket without reading until the probe has finished.
        let _ = done_rx.await;
        drop(s);
    });
    let lines = probe(args(
        "ws",
        &format!("ws://{addr}/w"),
        &["--idle-timeout-ms", "300", "--flood", "268435456"],
    ))
    .await;
    let _ = done_tx.send(());
    peer.await.unwrap();
    let last = lines.last().unwrap();
    assert_eq!(last["error"], "timeout", "{last}");
    assert!(
        last["detail"].as_str().unwrap().contains("write_timeout"),
        "{last}"
    );
}
