//! Interactive terminals under a real PTY, driven by a WebSocket client
//! (tokio-tungstenite) and by raw frames (worker-api.md TV28).
#![allow(clippy::unwrap_used)] // tests

mod common;

use common::*;
use futures_util::{SinkExt, StreamExt};
use tokio::io::AsyncWriteExt;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{WebSocketStream, client_async};

type Ws = WebSocketStream<tokio::net::TcpStream>;

pub async fn open(w: &smolbox_devworker::DevWorker, machine: &str, query: &str) -> Ws {
    let url = format!("ws://localhost/api/v1/machines/{machine}/exec/interactive?{query}");
    let (ws, resp) = client_async(url, connect(w).await).await.unwrap();
    assert_eq!(resp.status(), 101);
    assert!(resp.headers().get("sec-websocket-protocol").is_none());
    assert!(resp.headers().get("x-trace-id").is_some());
    ws
}

/// Reads binary output until `needle` shows up; returns everything read.
async fn output_until(ws: &mut Ws, acc: &mut Vec<u8>, needle: &[u8]) {
    let fut = async {
        while !contains(acc, needle) {
            match ws.next().await {
                Some(Ok(Message::Binary(b))) => acc.extend_from_slice(&b),
                other => panic!(
                    "unexpected {other:?} while waiting for {:?}",
                    String::from_utf8_lossy(needle)
                ),
            }
        }
    };
    tokio::time::timeout(PATIENCE, fut)
        .await
        .expect("output in time");
}

/// Reads to the end: returns (text frames, saw close without payload).
async fn rest(ws: &mut Ws) -> (Vec<String>, bool) {
    let mut texts = Vec::new();
    let fut = async {
        while let Some(m) = ws.next().await {
            match m {
                Ok(Message::Binary(_)) => {}
                Ok(Message::Text(t)) => texts.push(t.to_string()),
                Ok(Message::Close(frame)) => return frame.is_none(),
                Ok(_) => {}
                Err(_) => return false,
            }
        }
        false
    };
    let clean = tokio::time::timeout(PATIENCE, fut)
        .await
        .expect("end in time");
    (texts, clean)
}

#[tokio::test]
async fn tv28_session_with_resize_stdin_and_exit_code() {
    let w = worker().await;
    create(&w, "dev").await;
    let mut ws = open(&w, "dev", "cmd=%2Fbin%2Fsh&cols=100&rows=30").await;
    let mut acc = Vec::new();
    ws.send(Message::Binary(b"stty size\n".to_vec().into()))
        .await
        .unwrap();
    output_until(&mut ws, &mut acc, b"30 100").await;
    ws.send(Message::Text(
        r#"{"type":"resize","cols":120,"rows":40}"#.into(),
    ))
    .await
    .unwrap();
    ws.send(Message::Binary(b"stty size\n".to_vec().into()))
        .await
        .unwrap();
    output_until(&mut ws, &mut acc, b"40 120").await;
    ws.send(Message::Text(
        r#"{"type":"stdin","data":"echo via-$((1+1))\n"}"#.into(),
    ))
    .await
    .unwrap();
    output_until(&mut ws, &mut acc, b"via-2").await;
    ws.send(Message::Text("echo verbatim-$((2+2))\n".into()))
        .await
        .unwrap();
    output_until(&mut ws, &mut acc, b"verbatim-4").await;
    ws.send(Message::Binary(b"exit 7\n".to_vec().into()))
        .await
        .unwrap();
    let (texts, clean_close) = rest(&mut ws).await;
    assert_eq!(texts, [r#"{"type":"exit","code":7}"#]);
    assert!(clean_close, "close frame without payload (1005)");
    // Implicit start happened.
    assert_eq!(
        get(&w, "/api/v1/machines/dev").await.json()["state"],
        "running"
    );
    w.shutdown().await;
}

#[tokio::test]
async fn tv28_raw_handshake_and_final_frames() {
    let w = worker().await;
    create(&w, "dev").await;
    let mut s = connect(&w).await;
    s.write_all(
        b"GET /api/v1/machines/dev/exec/interactive?cmd=%2Fbin%2Fsh&cols=100&rows=30 HTTP/1.1\r\n\
Host: localhost\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n\
Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
    )
    .await
    .unwrap();
    let mut buf = Vec::new();
    read_until(&mut s, &mut buf, |b| contains(b, b"\r\n\r\n")).await;
    let head_end = buf.windows(4).position(|x| x == b"\r\n\r\n").unwrap() + 4;
    let head = String::from_utf8(buf[..head_end].to_vec()).unwrap();
    assert!(
        head.starts_with("HTTP/1.1 101 Switching Protocols\r\n"),
        "{head}"
    );
    assert!(head.contains("sec-websocket-accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n"));
    assert!(head.contains("upgrade: websocket\r\n") && head.contains("connection: upgrade\r\n"));
    assert!(!head.contains("sec-websocket-protocol"));
    // Frame 5 of TV28: client binary "exit 7\n" masked with 37 fa 21 3d.
    s.write_all(&[
        0x82, 0x87, 0x37, 0xfa, 0x21, 0x3d, 0x52, 0x82, 0x48, 0x49, 0x17, 0xcd, 0x2b,
    ])
    .await
    .unwrap();
    let mut frames = buf[head_end..].to_vec();
    assert!(read_until(&mut s, &mut frames, |_| false).await);
    let mut tail = vec![0x81, 0x18];
    tail.extend_from_slice(br#"{"type":"exit","code":7}"#);
    tail.extend_from_slice(&[0x88, 0x00]);
    assert!(frames.ends_with(&tail), "{frames:02x?}");
    // Everything before is unmasked binary frames.
    let mut at = 0;
    let body = &frames[..frames.len() - tail.len()];
    while at < body.len() {
        assert_eq!(body[at], 0x82);
        assert!(body[at + 1] < 0x7e, "unmasked, short frames");
        at += 2 + usize::from(body[at + 1]);
    }
    assert_eq!(at, body.len());
    w.shutdown().await;
}

#[tokio::test]
async fn client_disconnect_kills_the_program() {
    let w = worker().await;
    create(&w, "dev").await;
    let mut ws = open(&w, "dev", "").await;
    let mut acc = Vec::new();
    ws.send(Message::Binary(b"echo PID=$$:$((40+2))\n".to_vec().into()))
        .await
        .unwrap();
    output_until(&mut ws, &mut acc, b":42\r\n").await;
    let text = String::from_utf8_lossy(&acc).into_owned();
    let pid: u32 = text
        .split("PID=")
        .filter_map(|p| p.split(':').next()?.parse().ok())
        .next()
        .unwrap_or_else(|| panic!("no pid in {text:?}"));
    assert!(pid_alive(pid));
    ws.close(None).await.unwrap();
    drop(ws);
    eventually("the PTY program to be killed", || !pid_alive(pid)).await;
    w.shutdown().await;
}

#[tokio::test]
async fn program_exit_without_input_and_unknown_machine() {
    let w = worker().await;
    create(&w, "dev").await;
    let mut ws = open(&w, "dev", "cmd=/bin/false").await;
    let (texts, clean) = rest(&mut ws).await;
    assert_eq!(texts, [r#"{"type":"exit","code":1}"#]);
    assert!(clean);
    // A program that cannot start: the internal-error sentinel -1.
    let mut ws = open(&w, "dev", "cmd=/no/such/program").await;
    let (texts, clean) = rest(&mut ws).await;
    assert_eq!(texts, [r#"{"type":"exit","code":-1}"#]);
    assert!(clean);
    let mut s = connect(&w).await;
    s.write_all(
        b"GET /api/v1/machines/ghost/exec/interactive HTTP/1.1\r\nhost: localhost\r\n\
connection: Upgrade\r\nupgrade: websocket\r\nsec-websocket-version: 13\r\n\
sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
    )
    .await
    .unwrap();
    let mut buf = Vec::new();
    read_until(&mut s, &mut buf, |b| b.ends_with(b"}")).await;
    let r = parse(buf);
    r.assert(
        404,
        Some("application/json"),
        r#"{"error":"machine 'ghost' not found","code":"NOT_FOUND"}"#,
    );
    w.shutdown().await;
}

#[tokio::test]
async fn stopping_the_machine_ends_the_session_with_minus_one() {
    let w = worker().await;
    create(&w, "dev").await;
    let mut ws = open(&w, "dev", "").await;
    let mut acc = Vec::new();
    ws.send(Message::Binary(b"echo up-$((1+1))\n".to_vec().into()))
        .await
        .unwrap();
    output_until(&mut ws, &mut acc, b"up-2").await;
    post(&w, "/api/v1/machines/dev/stop", "").await;
    let (texts, clean) = rest(&mut ws).await;
    assert_eq!(texts, [r#"{"type":"exit","code":-1}"#]);
    assert!(clean);
    w.shutdown().await;
}
