//! The devworker is a safe neighbour (issue 17 item 5): DNS rebinding and
//! foreign WebSocket origins are refused, the standalone binary requires a
//! token by default, the token never shows in `Debug`, keys and tokens are
//! 0600, terminal teardown reaches the whole process group, `timeoutSecs`
//! is bounded, and downloads refuse non-regular and oversized files.
#![allow(clippy::unwrap_used)] // tests

mod common;

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use futures_util::StreamExt;
use smolbox_devworker::{DevWorker, Limits};
use tokio_tungstenite::client_async;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

fn with_host(path: &str, host: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n\r\n").into_bytes()
}

#[tokio::test]
async fn a_rebinding_host_is_refused_loopback_and_the_bound_address_pass() {
    let w = worker().await;
    let port = w.addr().port();
    for host in [
        format!("evil.example:{port}"),
        "evil.example".to_owned(),
        format!("localhost.evil.example:{port}"),
        format!("10.1.2.3:{port}"),
    ] {
        let r = send(&w, &with_host("/health", &host)).await;
        assert_eq!(r.status, 403, "{host}: {}", r.text());
        assert_eq!(r.json()["code"], "FORBIDDEN", "{host}");
        // Refused before anything runs: even the machine list is not read.
        let r = send(&w, &with_host("/api/v1/machines", &host)).await;
        assert_eq!(r.status, 403, "{host}");
    }
    for host in [
        format!("localhost:{port}"),
        "LOCALHOST".to_owned(),
        format!("127.0.0.1:{port}"),
        format!("127.9.9.9:{port}"),
        format!("[::1]:{port}"),
    ] {
        let r = send(&w, &with_host("/health", &host)).await;
        assert_eq!(r.status, 200, "{host}: {}", r.text());
    }
    w.shutdown().await;

    // Opt-out (for comparisons with the real worker, which has no check).
    let w = start(DevWorker::builder().neighbour_checks(false)).await;
    let r = send(&w, &with_host("/health", "evil.example")).await;
    assert_eq!(r.status, 200);
    w.shutdown().await;
}

#[tokio::test]
async fn the_unix_socket_takes_any_host() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("w.sock");
    let w = start(DevWorker::builder().unix_socket(Some(sock.clone()))).await;
    let s = tokio::net::UnixStream::connect(&sock).await.unwrap();
    let r = exchange(s, &with_host("/health", "anything.example")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    w.shutdown().await;
}

async fn upgrade(w: &DevWorker, origin: Option<&str>) -> Result<u16, u16> {
    let mut req = "ws://localhost/api/v1/machines/dev/exec/interactive?cmd=%2Fbin%2Fsh"
        .into_client_request()
        .unwrap();
    if let Some(o) = origin {
        req.headers_mut().insert("origin", o.parse().unwrap());
    }
    match client_async(req, connect(w).await).await {
        Ok((mut ws, resp)) => {
            let _ = ws.close(None).await;
            Ok(resp.status().as_u16())
        }
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => Err(resp.status().as_u16()),
        Err(e) => panic!("{e}"),
    }
}

#[tokio::test]
async fn a_websocket_upgrade_from_a_foreign_origin_is_refused() {
    let w = worker().await;
    create(&w, "dev").await;
    assert_eq!(upgrade(&w, Some("https://evil.example")).await, Err(403));
    assert_eq!(upgrade(&w, Some("null")).await, Err(403));
    assert_eq!(upgrade(&w, Some("http://localhost:3000")).await, Ok(101));
    assert_eq!(upgrade(&w, None).await, Ok(101));
    // A plain request with a foreign Origin is not an upgrade: CORS (the
    // browser) governs it, as on the real worker.
    let r = send(
        &w,
        &request("GET", "/health", &[("origin", "https://evil.example")], b""),
    )
    .await;
    assert_eq!(r.status, 200);
    w.shutdown().await;
}

#[tokio::test]
async fn the_token_is_never_in_debug_and_near_misses_are_refused() {
    const TOKEN: &str = "sentinel-devworker-token-5c1e";
    let b = DevWorker::builder().token(Some(TOKEN));
    assert!(!format!("{b:?}").contains(TOKEN), "{b:?}");
    let w = start(b).await;
    assert!(!format!("{w:?}").contains(TOKEN));
    let auth = |t: &str| format!("Bearer {t}");
    for wrong in [
        String::new(),
        TOKEN[..TOKEN.len() - 1].to_owned(),
        format!("{TOKEN}x"),
        TOKEN.to_uppercase(),
    ] {
        let r = send(
            &w,
            &request("GET", "/health", &[("authorization", &auth(&wrong))], b""),
        )
        .await;
        assert_eq!(r.status, 401, "{wrong:?}");
    }
    let r = send(&w, &request("GET", "/health", &[], b"")).await;
    assert_eq!(r.status, 401, "tokenless");
    let r = send(
        &w,
        &request("GET", "/health", &[("authorization", &auth(TOKEN))], b""),
    )
    .await;
    assert_eq!(r.status, 200);
    w.shutdown().await;
}

#[tokio::test]
async fn generated_tls_keys_are_owner_only() {
    let w = start(DevWorker::builder().tls(true)).await;
    let files = w.tls_files().unwrap();
    let dir = files.ca_pem.parent().unwrap().to_path_buf();
    for key in [files.client_key_pem.clone(), dir.join("server-key.pem")] {
        let mode = std::fs::metadata(&key).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{}", key.display());
    }
    w.shutdown().await;
}

/// The standalone binary: started on a free loopback port; returns the
/// child, its URL and the token it printed (if any).
fn standalone(args: &[&str]) -> (std::process::Child, String, Option<String>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_smolbox-devworker"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let (mut url, mut token, mut all) = (None, None, String::new());
    while url.is_none() {
        let mut line = String::new();
        assert!(err.read_line(&mut line).unwrap() > 0, "ended early: {all}");
        all.push_str(&line);
        if let Some(t) = line.split("0600): ").nth(1) {
            token = Some(t.trim().to_owned());
        }
        if let Some(u) = line.strip_prefix("smolbox-devworker: listening on ") {
            url = Some(u.trim().to_owned());
        }
    }
    (child, url.unwrap(), token, all)
}

fn stop(mut child: std::process::Child) {
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    child.wait().unwrap();
}

async fn raw(url: &str, req: &[u8]) -> Resp {
    let addr = url.strip_prefix("http://").unwrap();
    exchange(tokio::net::TcpStream::connect(addr).await.unwrap(), req).await
}

#[tokio::test]
async fn the_standalone_devworker_requires_a_generated_token_by_default() {
    let (child, url, token, all) = standalone(&["--listen", "127.0.0.1:0"]);
    let token = token.unwrap_or_else(|| panic!("no token printed: {all}"));
    assert_eq!(token.len(), 64);
    // The token file: 0600, the same token.
    let state = all
        .split("state in ")
        .nth(1)
        .and_then(|s| s.lines().next())
        .unwrap()
        .trim()
        .to_owned();
    let file = std::path::Path::new(&state).join("token");
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), token);

    let r = raw(&url, &request("GET", "/health", &[], b"")).await;
    assert_eq!(r.status, 401, "a tokenless request is refused");
    let r = raw(&url, &request("GET", "/_devworker/counts", &[], b"")).await;
    assert_eq!(r.status, 401, "the control routes too");
    let bearer = format!("Bearer {token}");
    let r = raw(
        &url,
        &request("GET", "/health", &[("authorization", &bearer)], b""),
    )
    .await;
    assert_eq!(r.status, 200);
    stop(child);

    // --no-token on loopback: allowed, and it says so.
    let (child, url, token, all) = standalone(&["--listen", "127.0.0.1:0", "--no-token"]);
    assert!(token.is_none());
    assert!(all.contains("no token required"), "{all}");
    let r = raw(&url, &request("GET", "/health", &[], b"")).await;
    assert_eq!(r.status, 200);
    stop(child);
}

#[test]
fn the_standalone_devworker_refuses_a_non_loopback_listen_without_a_token() {
    let o = Command::new(env!("CARGO_BIN_EXE_smolbox-devworker"))
        .args(["--listen", "0.0.0.0:0", "--no-token"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("without a token"), "{err}");
    assert!(!err.contains("listening on"), "{err}");
}

#[tokio::test]
async fn terminal_teardown_hangs_up_then_kills_the_whole_process_group() {
    let w = start(DevWorker::builder().limits(Limits {
        terminal_hangup_grace: Duration::from_millis(200),
        ..Default::default()
    }))
    .await;
    create(&w, "dev").await;
    let r = post(&w, "/api/v1/machines/dev/start", "{}").await;
    assert_eq!(r.status, 200, "{}", r.text());
    // A program whose group holds a child that ignores SIGHUP.
    let script = w.guest_root("dev").join("workspace").join("hup.sh");
    write_file(
        &script,
        b"#!/bin/sh\ntrap '' HUP\nsleep 1000 &\necho \"PID=$!.\"\nwait\n",
    );
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let url = "ws://localhost/api/v1/machines/dev/exec/interactive?cmd=%2Fworkspace%2Fhup.sh";
    let (mut ws, _) = client_async(url, connect(&w).await).await.unwrap();
    let mut out = Vec::new();
    let pid = tokio::time::timeout(PATIENCE, async {
        loop {
            match ws.next().await {
                Some(Ok(Message::Binary(b))) => out.extend_from_slice(&b),
                other => panic!("{other:?}"),
            }
            let text = String::from_utf8_lossy(&out);
            if let Some(rest) = text.split("PID=").nth(1)
                && let Some((digits, _)) = rest.split_once('.')
            {
                return digits.parse::<u32>().unwrap();
            }
        }
    })
    .await
    .unwrap();
    assert!(pid_alive(pid));
    // The client goes away: teardown.
    ws.close(None).await.unwrap();
    drop(ws);
    eventually("the SIGHUP-ignoring group member is killed", || {
        !pid_alive(pid)
    })
    .await;
    w.shutdown().await;
}

#[tokio::test]
async fn timeout_secs_is_bounded_at_one_day() {
    let w = worker().await;
    create(&w, "dev").await;
    let r = exec(&w, "dev", r#"{"command":["true"],"timeoutSecs":86400}"#).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = exec(&w, "dev", r#"{"command":["true"],"timeoutSecs":86401}"#).await;
    r.assert(
        400,
        Some("application/json"),
        r#"{"error":"timeoutSecs must be at most 86400","code":"BAD_REQUEST"}"#,
    );
    w.shutdown().await;
    let w = start(DevWorker::builder().neighbour_checks(false)).await;
    create(&w, "dev").await;
    let r = exec(&w, "dev", r#"{"command":["true"],"timeoutSecs":86401}"#).await;
    assert_eq!(r.status, 200, "opt-out: {}", r.text());
    w.shutdown().await;
}

#[tokio::test]
async fn downloads_refuse_non_regular_files_and_respect_the_cap() {
    let cap = 4096;
    let w = start(DevWorker::builder().limits(Limits {
        file_body_max: cap,
        ..Default::default()
    }))
    .await;
    create(&w, "dev").await;
    let r = post(&w, "/api/v1/machines/dev/start", "{}").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let ws = w.guest_root("dev").join("workspace");
    std::fs::create_dir_all(&ws).unwrap();
    // A FIFO: refused at once (reading it would block forever).
    let fifo = ws.join("fifo");
    assert!(
        Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    let r = get(&w, "/api/v1/machines/dev/files/workspace/fifo").await;
    r.assert(
        500,
        Some("application/json"),
        r#"{"error":"failed to read file '/workspace/fifo': not a regular file","code":"INTERNAL_ERROR"}"#,
    );
    // At the cap: served; one byte more: refused.
    write_file(&ws.join("at.bin"), &vec![7u8; cap]);
    let r = get(&w, "/api/v1/machines/dev/files/workspace/at.bin").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body.len(), cap);
    write_file(&ws.join("over.bin"), &vec![7u8; cap + 1]);
    let r = get(&w, "/api/v1/machines/dev/files/workspace/over.bin").await;
    assert_eq!(r.status, 500, "{}", r.text());
    assert!(
        r.text().contains("above the transfer limit"),
        "{}",
        r.text()
    );
    w.shutdown().await;
}
