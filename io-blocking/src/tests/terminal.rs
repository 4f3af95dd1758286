//! The blocking Terminal against a hand-written WebSocket peer that speaks
//! the worker's terminal protocol (worker-api.md TV28).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use base64::Engine;
use sha1::{Digest, Sha1};
use smolbox_core::terminal::{TerminalExit, TerminalSpec};
use smolbox_core::{Category, Operation};

use super::client::{budgets, tcp_client};
use crate::TerminalEvent;

const GUID: &str = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// The image preflight's reply: `dev` is a plain image machine.
const IMAGE_MACHINE: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 217\r\n\r\n{\"name\":\"dev\",\"image\":\"alpine:3\",\"state\":\"running\",\"cpus\":1,\"memoryMb\":256,\"mounts\":[],\"ports\":[],\"network\":false,\"gpu\":false,\"cuda\":false,\"storageGb\":1,\"overlayGb\":1,\"branchable\":false,\"forkable\":false,\"createdAt\":1}";

fn read_head(s: &mut TcpStream) -> Vec<u8> {
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut b).unwrap();
        head.push(b[0]);
    }
    head
}

/// Accepts connections until one carries a request other than the
/// version preflight `GET /health` (answered as a 1.22.0 worker) and the
/// image preflight that follows it on the same pooled connection
/// (answered with a plain image machine); returns that connection and its
/// request head.
fn accept_after_preflight(l: &TcpListener) -> (TcpStream, Vec<u8>) {
    loop {
        let (mut s, _) = l.accept().unwrap();
        let head = read_head(&mut s);
        if head.starts_with(b"GET /health ") {
            s.write_all(super::client::HEALTH_1_22).unwrap();
            let next = read_head(&mut s);
            assert!(next.starts_with(b"GET /api/v1/machines/dev "), "{next:?}");
            s.write_all(IMAGE_MACHINE).unwrap();
            // The preflights' connection stays pooled; keep it open.
            std::mem::forget(s);
            continue;
        }
        return (s, head);
    }
}

/// Accepts one upgrade; returns the socket after the 101.
fn upgrade(l: &TcpListener) -> TcpStream {
    let (mut s, head) = accept_after_preflight(l);
    let head = String::from_utf8(head).unwrap();
    assert!(
        head.starts_with("GET /api/v1/machines/dev/exec/interactive?"),
        "{head}"
    );
    let key = head
        .lines()
        .find_map(|l| {
            l.strip_prefix("Sec-WebSocket-Key: ")
                .or_else(|| l.strip_prefix("sec-websocket-key: "))
        })
        .unwrap()
        .trim()
        .to_owned();
    let accept = base64::engine::general_purpose::STANDARD
        .encode(Sha1::digest(format!("{key}{GUID}").as_bytes()));
    write!(
        s,
        "HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\nupgrade: websocket\r\nsec-websocket-accept: {accept}\r\n\r\n"
    )
    .unwrap();
    s
}

/// One unmasked server frame.
fn frame(opcode: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![0x80 | opcode];
    if payload.len() < 126 {
        f.push(payload.len() as u8);
    } else {
        f.push(126);
        f.extend_from_slice(&(payload.len() as u16).to_be_bytes());
    }
    f.extend_from_slice(payload);
    f
}

/// Reads one masked client frame: (opcode, payload).
fn read_frame(s: &mut TcpStream) -> (u8, Vec<u8>) {
    let mut h = [0u8; 2];
    s.read_exact(&mut h).unwrap();
    assert!(h[1] & 0x80 != 0, "client frames are masked");
    let mut len = u64::from(h[1] & 0x7f);
    if len == 126 {
        let mut l = [0u8; 2];
        s.read_exact(&mut l).unwrap();
        len = u64::from(u16::from_be_bytes(l));
    }
    let mut mask = [0u8; 4];
    s.read_exact(&mut mask).unwrap();
    let mut p = vec![0u8; len as usize];
    s.read_exact(&mut p).unwrap();
    for (i, b) in p.iter_mut().enumerate() {
        *b ^= mask[i % 4];
    }
    (h[0] & 0x0f, p)
}

fn spec() -> TerminalSpec {
    TerminalSpec::new("/bin/sh")
}

fn output(ev: TerminalEvent) -> Vec<u8> {
    match ev {
        TerminalEvent::Output(b) => b.to_vec(),
        other => panic!("expected output, got {other:?}"),
    }
}

#[test]
fn a_full_session_echo_resize_and_exit() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let (seen_tx, seen_rx) = mpsc::channel();
    let peer = thread::spawn(move || {
        let mut s = upgrade(&l);
        s.write_all(&frame(2, b"/ # ")).unwrap();
        loop {
            let (op, p) = read_frame(&mut s);
            seen_tx.send((op, p.clone())).unwrap();
            match op {
                2 if p == b"exit 7\n" => {
                    s.write_all(&frame(2, b"exit 7\r\n")).unwrap();
                    s.write_all(&frame(1, br#"{"type":"exit","code":7}"#))
                        .unwrap();
                    s.write_all(&frame(8, b"")).unwrap();
                    let (op, _) = read_frame(&mut s);
                    assert_eq!(op, 8, "the client echoes the close");
                    return;
                }
                2 => s.write_all(&frame(2, &p)).unwrap(),
                _ => {}
            }
        }
    });
    let client = tcp_client(port, budgets());
    let mut t = client.terminal("dev", &spec()).unwrap();
    let wait = Duration::from_secs(5);
    assert_eq!(output(t.next(wait).unwrap()), b"/ # ");
    t.input(b"echo hi\n").unwrap();
    assert_eq!(output(t.next(wait).unwrap()), b"echo hi\n");
    assert_eq!(seen_rx.recv().unwrap(), (2, b"echo hi\n".to_vec()));
    t.resize(120, 40).unwrap();
    t.input(b"exit 7\n").unwrap();
    let mut got = Vec::new();
    let outcome = loop {
        match t.next(wait).unwrap() {
            TerminalEvent::Output(b) => got.extend_from_slice(&b),
            TerminalEvent::Closed(outcome) => break outcome,
            other => panic!("unexpected event: {other:?}"),
        }
    };
    assert_eq!(got, b"exit 7\r\n");
    assert_eq!(outcome, Ok(TerminalExit { code: 7 }));
    assert_eq!(
        seen_rx.recv().unwrap(),
        (1, br#"{"type":"resize","cols":120,"rows":40}"#.to_vec())
    );
    peer.join().unwrap();
}

#[test]
fn a_wait_that_times_out_leaves_the_session_running() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let peer = thread::spawn(move || {
        let mut s = upgrade(&l);
        go_rx.recv().unwrap();
        s.write_all(&frame(2, b"late")).unwrap();
        let _ = read_frame(&mut s);
    });
    let mut t = tcp_client(port, budgets())
        .terminal("dev", &spec())
        .unwrap();
    let e = t.next(Duration::from_millis(30)).unwrap_err();
    assert_eq!(
        (e.category(), e.operation()),
        (Category::Expired, Operation::TerminalOutput)
    );
    go_tx.send(()).unwrap();
    assert_eq!(output(t.next(Duration::from_secs(5)).unwrap()), b"late");
    drop(t);
    peer.join().unwrap();
}

/// A consumer that stops calling `next` while the guest floods finds the
/// session ended by the queue bound, as with a continuously reading shell.
#[test]
fn a_stalled_consumer_hits_the_output_limit() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let (flooded_tx, flooded_rx) = mpsc::channel::<()>();
    let peer = thread::spawn(move || {
        let mut s = upgrade(&l);
        let chunk = frame(2, &[b'y'; 4096]);
        for _ in 0..64 {
            if s.write_all(&chunk).is_err() {
                break;
            }
        }
        flooded_tx.send(()).unwrap();
        let mut sink = Vec::new();
        let _ = s.read_to_end(&mut sink);
    });
    let mut spec = spec();
    spec.max_buffer_bytes = 65_536;
    let mut t = tcp_client(port, budgets()).terminal("dev", &spec).unwrap();
    flooded_rx.recv().unwrap(); // 256 KiB sent while nobody read
    // The consumer stays away longer than the read grace after the open
    // (the open counts as its first pull): it is stalled.
    thread::sleep(smolbox_core::terminal::READ_GRACE * 5);
    let mut delivered = 0usize;
    let outcome = loop {
        match t.next(Duration::from_secs(5)).unwrap() {
            TerminalEvent::Output(b) => delivered += b.len(),
            TerminalEvent::Closed(outcome) => break outcome,
            other => panic!("unexpected event: {other:?}"),
        }
    };
    let e = outcome.unwrap_err();
    assert_eq!(e.category(), Category::OutputLimit, "{e:?}");
    assert!(
        delivered <= 65_536,
        "more than the bound was queued: {delivered}"
    );
    drop(t);
    peer.join().unwrap();
}

#[test]
fn a_refused_upgrade_is_an_error_from_open() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    thread::spawn(move || {
        let (mut s, _) = accept_after_preflight(&l);
        let body = r#"{"error":"machine 'dev' not found","code":"NOT_FOUND"}"#;
        let _ = write!(
            s,
            "HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
    });
    let e = tcp_client(port, budgets())
        .terminal("dev", &spec())
        .unwrap_err();
    assert_eq!(e.operation(), Operation::TerminalOpen, "{e:?}");
}
