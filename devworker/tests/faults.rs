//! Every injectable fault, shown to happen.
#![allow(clippy::unwrap_used)] // tests

mod common;

use std::time::Duration;

use common::*;
use futures_util::{SinkExt, StreamExt};
use smolbox_devworker::{Fault, FaultRule, MismatchField, Route};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message;

/// Reads until EOF or a connection error, keeping what arrived.
async fn read_all_lossy(s: &mut tokio::net::TcpStream) -> Vec<u8> {
    let mut out = Vec::new();
    let mut chunk = [0u8; 4096];
    let fut = async {
        loop {
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => out.extend_from_slice(&chunk[..n]),
            }
        }
    };
    tokio::time::timeout(PATIENCE, fut)
        .await
        .expect("end in time");
    out
}

/// True if nothing arrives within a short window (for "silent" faults).
async fn silent_for_a_while(s: &mut tokio::net::TcpStream) -> bool {
    let mut chunk = [0u8; 64];
    tokio::time::timeout(Duration::from_millis(300), s.read(&mut chunk))
        .await
        .is_err()
}

fn health_req() -> Vec<u8> {
    request("GET", "/health", &[], b"")
}

#[tokio::test]
async fn drop_after_n_reply_bytes() {
    let w = worker().await;
    w.faults()
        .once(Route::Health, Fault::DropAfter { bytes: 20 });
    let mut s = connect(&w).await;
    s.write_all(&health_req()).await.unwrap();
    assert_eq!(read_all_lossy(&mut s).await, b"HTTP/1.1 200 OK\r\ncon");
    assert_eq!(get(&w, "/health").await.status, 200);
    assert_eq!(w.request_count(Route::Health), 2);
    w.shutdown().await;
}

#[tokio::test]
async fn silent_stall_after_n_bytes() {
    let w = worker().await;
    w.faults()
        .once(Route::Health, Fault::StallAfter { bytes: 17 });
    let mut s = connect(&w).await;
    s.write_all(&health_req()).await.unwrap();
    let mut buf = Vec::new();
    read_until(&mut s, &mut buf, |b| b.len() >= 17).await;
    assert_eq!(buf, b"HTTP/1.1 200 OK\r\n");
    assert!(silent_for_a_while(&mut s).await);
    assert_eq!(get(&w, "/health").await.status, 200);
    w.shutdown().await;
}

#[tokio::test]
async fn raw_reply_bytes() {
    let w = worker().await;
    let raw = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nab".to_vec();
    w.faults()
        .once(Route::Health, Fault::RawReply { bytes: raw.clone() });
    let mut s = connect(&w).await;
    s.write_all(&health_req()).await.unwrap();
    assert_eq!(read_all_lossy(&mut s).await, raw);
    w.shutdown().await;
}

#[tokio::test]
async fn truncated_malformed_and_gzip_json() {
    let w = worker().await;
    w.faults().once(Route::MachinesList, Fault::TruncateJson);
    let r = get(&w, "/api/v1/machines").await;
    assert_eq!(
        (r.body.as_slice(), r.header("content-length")),
        (&b"{\"machi"[..], Some("7"))
    );
    w.faults().once(Route::MachinesList, Fault::MalformedJson);
    let r = get(&w, "/api/v1/machines").await;
    assert_eq!(r.body, b"{\"machines\":[],}");
    assert!(serde_json::from_slice::<serde_json::Value>(&r.body).is_err());
    w.faults().once(Route::MachinesList, Fault::Gzip);
    let r = get(&w, "/api/v1/machines").await;
    assert_eq!(r.header("content-encoding"), Some("gzip"));
    // One stored deflate block after the 10-byte header.
    assert_eq!(&r.body[..3], &[0x1f, 0x8b, 8]);
    assert_eq!(r.body[10], 1);
    let len = usize::from(u16::from_le_bytes([r.body[11], r.body[12]]));
    assert_eq!(&r.body[15..15 + len], b"{\"machines\":[]}");
    assert_eq!(r.body.len(), 15 + len + 8);
    // Once means once.
    assert_eq!(get(&w, "/api/v1/machines").await.body, b"{\"machines\":[]}");
    w.shutdown().await;
}

#[tokio::test]
async fn redirect_without_handling() {
    let w = worker().await;
    w.faults().once(
        Route::MachinesCreate,
        Fault::Redirect {
            location: "http://127.0.0.1:9/elsewhere".into(),
        },
    );
    let r = post(&w, "/api/v1/machines", r#"{"name":"m1"}"#).await;
    r.assert(307, None, "");
    assert_eq!(r.header("location"), Some("http://127.0.0.1:9/elsewhere"));
    assert_eq!(get(&w, "/api/v1/machines").await.body, b"{\"machines\":[]}");
    assert_eq!(w.request_count(Route::MachinesCreate), 1);
    w.shutdown().await;
}

#[tokio::test]
async fn create_reply_differs_from_the_request() {
    let w = worker().await;
    let cases = [
        (MismatchField::Name, "name", serde_json::json!("m0-other")),
        (MismatchField::Cpus, "cpus", serde_json::json!(2)),
        (MismatchField::Memory, "memoryMb", serde_json::json!(320)),
        (MismatchField::Disks, "storageGb", serde_json::json!(21)),
        (
            MismatchField::Ports,
            "ports",
            serde_json::json!([{"host": 1, "guest": 1}]),
        ),
    ];
    for (i, (field, key, want)) in cases.into_iter().enumerate() {
        w.faults()
            .once(Route::MachinesCreate, Fault::CreateMismatch { field });
        let name = format!("m{i}");
        let r = post(
            &w,
            "/api/v1/machines",
            &format!(r#"{{"name":"{name}","cpus":1,"memoryMb":256}}"#),
        )
        .await;
        let mut want = want;
        if field == MismatchField::Name {
            want = serde_json::json!(format!("{name}-other"));
        }
        assert_eq!(r.json()[key], want, "{field:?}");
        // The stored record is what was asked.
        let stored = get(&w, &format!("/api/v1/machines/{name}")).await.json();
        assert_ne!(stored[key], want, "{field:?}");
    }
    w.shutdown().await;
}

#[tokio::test]
async fn early_408_with_the_command_still_running() {
    let w = worker().await;
    create(&w, "m").await;
    w.faults().once(Route::Exec, Fault::Timeout408 { ms: 100 });
    let r = exec(
        &w,
        "m",
        r#"{"command":["sh","-c","sleep 0.5; echo done > /workspace/done"]}"#,
    )
    .await;
    r.assert(408, None, "");
    // The guest command itself waits for its predecessor's marker.
    let r = exec(
        &w,
        "m",
        r#"{"command":["sh","-c","while [ ! -f /workspace/done ]; do sleep 0.05; done; cat /workspace/done"],"timeoutSecs":15}"#,
    )
    .await;
    assert_eq!(r.json()["stdout"], "done\n");
    w.shutdown().await;
}

#[tokio::test]
async fn delay_before_reply() {
    let w = worker().await;
    w.faults().once(Route::Health, Fault::Delay { ms: 60_000 });
    let addr = w.addr();
    let delayed = tokio::spawn(async move {
        let s = tokio::net::TcpStream::connect(addr).await.unwrap();
        exchange(s, &health_req()).await
    });
    // Wait until the delayed request has arrived, then show another request
    // overtakes it.
    eventually("the delayed request to arrive", || {
        w.request_count(Route::Health) == 1
    })
    .await;
    assert_eq!(get(&w, "/health").await.status, 200);
    assert!(!delayed.is_finished());
    delayed.abort();
    w.shutdown().await;
}

#[tokio::test]
async fn sse_close_before_exit_exit130_and_stall() {
    let w = worker().await;
    create(&w, "m").await;
    w.faults().once(Route::ExecStream, Fault::CloseBeforeExit);
    let r = post(
        &w,
        "/api/v1/machines/m/exec/stream",
        r#"{"command":["echo","hi"]}"#,
    )
    .await;
    assert_eq!(r.text(), "event: stdout\ndata: hi\ndata: \n\n");
    w.faults().once(Route::ExecStream, Fault::Exit130);
    let r = post(
        &w,
        "/api/v1/machines/m/exec/stream",
        r#"{"command":["sh","-c","echo hi; exec sleep 30"]}"#,
    )
    .await;
    assert_eq!(r.text(), "event: exit\ndata: {\"exitCode\":130}\n\n");
    w.faults().once(Route::ExecStream, Fault::StallStream);
    let mut s = connect(&w).await;
    s.write_all(&json_req(
        "POST",
        "/api/v1/machines/m/exec/stream",
        r#"{"command":["sh","-c","echo a; sleep 0.1; echo b"]}"#,
    ))
    .await
    .unwrap();
    let mut buf = Vec::new();
    read_until(&mut s, &mut buf, |b| contains(b, b"data: a")).await;
    assert!(silent_for_a_while(&mut s).await);
    assert!(!contains(&buf, b"data: b"));
    w.shutdown().await;
}

const UPGRADE: &[u8] = b"GET /api/v1/machines/dev/exec/interactive?cmd=%2Fbin%2Fsh HTTP/1.1\r\nHost: localhost\r\n\
Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n";

async fn raw_frames(w: &smolbox_devworker::DevWorker) -> Vec<u8> {
    let mut s = connect(w).await;
    s.write_all(UPGRADE).await.unwrap();
    let all = read_all_lossy(&mut s).await;
    let end = all.windows(4).position(|x| x == b"\r\n\r\n").unwrap() + 4;
    assert!(all.starts_with(b"HTTP/1.1 101 "));
    all[end..].to_vec()
}

#[tokio::test]
async fn terminal_masked_and_oversize_frames() {
    let w = worker().await;
    create(&w, "dev").await;
    w.faults().once(Route::Terminal, Fault::MaskedFrame);
    let f = raw_frames(&w).await;
    assert_eq!(&f[..2], &[0x82, 0x84]);
    let unmasked: Vec<u8> = f[6..10]
        .iter()
        .enumerate()
        .map(|(i, b)| b ^ f[2 + i % 4])
        .collect();
    assert_eq!(unmasked, b"/ # ");
    w.faults().once(
        Route::Terminal,
        Fault::OversizeFrame {
            len: 16 * 1024 * 1024 + 1,
        },
    );
    let f = raw_frames(&w).await;
    assert_eq!(&f[..2], &[0x82, 0x7f]);
    assert_eq!(
        u64::from_be_bytes(f[2..10].try_into().unwrap()),
        16 * 1024 * 1024 + 1
    );
    // A conforming client rejects the masked frame.
    w.faults().once(Route::Terminal, Fault::MaskedFrame);
    let url = "ws://localhost/api/v1/machines/dev/exec/interactive";
    let (mut ws, _) = tokio_tungstenite::client_async(url, connect(&w).await)
        .await
        .unwrap();
    assert!(matches!(ws.next().await, Some(Err(_))));
    w.shutdown().await;
}

async fn ws(
    w: &smolbox_devworker::DevWorker,
) -> tokio_tungstenite::WebSocketStream<tokio::net::TcpStream> {
    let url = "ws://localhost/api/v1/machines/dev/exec/interactive?cmd=%2Fbin%2Fsh";
    tokio_tungstenite::client_async(url, connect(w).await)
        .await
        .unwrap()
        .0
}

async fn texts_until_close(
    ws: &mut tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>,
) -> (Vec<String>, bool) {
    let mut texts = Vec::new();
    let fut = async {
        while let Some(Ok(m)) = ws.next().await {
            match m {
                Message::Text(t) => texts.push(t.to_string()),
                Message::Close(_) => return true,
                _ => {}
            }
        }
        false
    };
    let closed = tokio::time::timeout(PATIENCE, fut).await.unwrap();
    (texts, closed)
}

#[tokio::test]
async fn terminal_close_before_exit_exit130_and_stall() {
    let w = worker().await;
    create(&w, "dev").await;
    w.faults().once(Route::Terminal, Fault::CloseBeforeExit);
    let mut t = ws(&w).await;
    t.send(Message::Binary(b"exit 3\n".to_vec().into()))
        .await
        .unwrap();
    assert_eq!(texts_until_close(&mut t).await, (vec![], true));

    w.faults().once(Route::Terminal, Fault::Exit130);
    let mut t = ws(&w).await;
    t.send(Message::Binary(b"exit 3\n".to_vec().into()))
        .await
        .unwrap();
    assert_eq!(
        texts_until_close(&mut t).await,
        (vec![r#"{"type":"exit","code":130}"#.to_owned()], true)
    );

    w.faults().once(Route::Terminal, Fault::StallStream);
    let mut t = ws(&w).await;
    t.send(Message::Binary(b"echo one\n".to_vec().into()))
        .await
        .unwrap();
    assert!(matches!(t.next().await, Some(Ok(Message::Binary(_)))));
    t.send(Message::Binary(b"echo two; exit 0\n".to_vec().into()))
        .await
        .unwrap();
    assert!(
        tokio::time::timeout(Duration::from_millis(300), t.next())
            .await
            .is_err(),
        "stalled"
    );
    w.shutdown().await;
}

#[tokio::test]
async fn per_machine_rules_and_the_control_route() {
    let w = worker().await;
    create(&w, "a").await;
    create(&w, "b").await;
    w.faults()
        .on_machine(Route::Exec, "a", Fault::MalformedJson);
    assert!(
        serde_json::from_slice::<serde_json::Value>(
            &exec(&w, "b", r#"{"command":["true"]}"#).await.body
        )
        .is_ok()
    );
    assert!(
        serde_json::from_slice::<serde_json::Value>(
            &exec(&w, "a", r#"{"command":["true"]}"#).await.body
        )
        .is_err()
    );
    assert_eq!(w.faults().rules().len(), 1);
    let r = send(&w, &request("DELETE", "/_devworker/faults", &[], b"")).await;
    assert_eq!(r.status, 204);
    assert!(w.faults().rules().is_empty());
    let rule = FaultRule {
        route: Some(Route::Health),
        machine: None,
        fault: Fault::TruncateJson,
        times: Some(1),
    };
    let body = serde_json::to_string(&rule).unwrap();
    assert_eq!(
        body,
        r#"{"route":"health","machine":null,"fault":{"kind":"truncate_json"},"times":1}"#
    );
    assert_eq!(post(&w, "/_devworker/faults", &body).await.status, 204);
    let r = get(&w, "/health").await;
    assert!(serde_json::from_slice::<serde_json::Value>(&r.body).is_err());
    let counts = get(&w, "/_devworker/counts").await.json();
    assert_eq!(counts["health"], 1);
    assert_eq!(counts["exec"], 2);
    // Restart over HTTP: 202, then a new boot id.
    let boot = get(&w, "/capacity").await.json()["boot_id"].clone();
    assert_eq!(post(&w, "/_devworker/restart", "").await.status, 202);
    let addr = w.addr();
    let changed = || {
        let boot = boot.clone();
        async move {
            let s = tokio::net::TcpStream::connect(addr).await.unwrap();
            exchange(s, &request("GET", "/capacity", &[], b""))
                .await
                .json()["boot_id"]
                != boot
        }
    };
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !changed().await {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    w.shutdown().await;
}

#[tokio::test]
async fn canned_reply_instead_of_handling() {
    let w = worker().await;
    w.faults().once(
        Route::Readyz,
        Fault::Reply {
            status: 503,
            content_type: None,
            body: String::new(),
        },
    );
    get(&w, "/readyz").await.assert(503, None, "");
    w.faults().once(
        Route::Capacity,
        Fault::Reply {
            status: 503,
            content_type: Some("text/plain".into()),
            body: "main runtime stalled; node unschedulable".into(),
        },
    );
    get(&w, "/capacity").await.assert(
        503,
        Some("text/plain"),
        "main runtime stalled; node unschedulable",
    );
    w.faults().once(
        Route::MachinesCreate,
        Fault::Reply {
            status: 200,
            content_type: Some("text/html".into()),
            body: "<html>".into(),
        },
    );
    post(&w, "/api/v1/machines", r#"{"name":"m"}"#)
        .await
        .assert(200, Some("text/html"), "<html>");
    assert_eq!(get(&w, "/api/v1/machines/m").await.status, 404);
    assert_eq!(get(&w, "/readyz").await.status, 200);
    w.shutdown().await;
}
