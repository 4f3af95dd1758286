//! A hand-written worker that floods a terminal from its first byte: it
//! answers the version and image preflights and the upgrade, then writes `total`
//! bytes of output in binary frames of `frame` bytes right behind the 101
//! (before the consumer could pull), then the exit frame (code 0) and a
//! close. What the client sends is read and dropped.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::thread::JoinHandle;

/// The preflight's reply: a 1.22.0 worker.
const HEALTH: &str =
    r#"{"status":"ok","version":"1.22.0","machines":{"total":1,"running":1},"uptime_seconds":5}"#;

/// The image preflight's reply: `m1`, a running plain image machine.
const MACHINE: &str = r#"{"name":"m1","image":"alpine:3.19","state":"running","cpus":1,"memoryMb":256,"pid":7,"mounts":[],"ports":[],"network":false,"gpu":false,"cuda":false,"storageGb":1,"overlayGb":1,"branchable":false,"forkable":false,"createdAt":1}"#;

/// A flooding worker on a loopback port, serving one terminal.
#[derive(Debug)]
pub struct FloodPeer {
    addr: SocketAddr,
    thread: Option<JoinHandle<()>>,
}

impl FloodPeer {
    /// Starts the peer; the terminal's output is `total` bytes in frames of
    /// `frame` bytes (`frame` ≤ 65,535).
    ///
    /// # Panics
    /// When no loopback port can be bound.
    pub fn start(total: usize, frame: usize) -> Self {
        #[allow(clippy::unwrap_used)] // a peer that cannot start fails the test
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        #[allow(clippy::unwrap_used)]
        let addr = listener.local_addr().unwrap();
        let (served_tx, served) = std::sync::mpsc::channel();
        // One thread per connection: the preflight's connection stays
        // pooled (open) while the terminal's arrives.
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { return };
                let served_tx = served_tx.clone();
                std::thread::spawn(move || {
                    if serve(conn, total, frame) {
                        let _ = served_tx.send(());
                    }
                });
            }
        });
        let thread = std::thread::spawn(move || {
            let _ = served.recv();
        });
        Self {
            addr,
            thread: Some(thread),
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Waits for the peer to finish its terminal connection.
    ///
    /// # Panics
    /// When the peer's thread panicked.
    pub fn join(mut self) {
        if let Some(t) = self.thread.take() {
            #[allow(clippy::unwrap_used)]
            t.join().unwrap();
        }
    }
}

/// One connection: preflights until the upgrade, then the flood. True once
/// a terminal was served.
fn serve(mut conn: TcpStream, total: usize, frame: usize) -> bool {
    let _ = conn.set_nodelay(true);
    let mut buf = Vec::new();
    loop {
        let Some(head) = read_head(&mut conn, &mut buf) else {
            return false;
        };
        if head.starts_with("GET /health ") {
            let reply = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{HEALTH}",
                HEALTH.len()
            );
            if conn.write_all(reply.as_bytes()).is_err() {
                return false;
            }
            continue;
        }
        if head.starts_with("GET /api/v1/machines/m1 ") {
            // The terminal's image preflight (C7.4): a plain image machine.
            let reply = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{MACHINE}",
                MACHINE.len()
            );
            if conn.write_all(reply.as_bytes()).is_err() {
                return false;
            }
            continue;
        }
        let Some(key) = head.lines().find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.trim()
                .eq_ignore_ascii_case("sec-websocket-key")
                .then(|| value.trim().to_owned())
        }) else {
            return false;
        };
        flood(conn, &key, total, frame);
        return true;
    }
}

/// The 101, then the output frames, the exit and a close, all written as
/// fast as the socket takes them; a second thread drains what the client
/// sends until it closes.
fn flood(mut conn: TcpStream, key: &str, total: usize, frame: usize) {
    let Ok(mut reader) = conn.try_clone() else {
        return;
    };
    let drain = std::thread::spawn(move || {
        let mut sink = vec![0u8; 16 << 10];
        while matches!(reader.read(&mut sink), Ok(n) if n > 0) {}
    });
    let accept = smolbox_core::ws::handshake::accept_for(key);
    let mut out = format!(
        "HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: Upgrade\r\nsec-websocket-accept: {accept}\r\n\r\n"
    )
    .into_bytes();
    let mut left = total;
    while left > 0 {
        let n = left.min(frame);
        out.push(0x82);
        if n < 126 {
            out.push(n as u8);
        } else {
            out.push(126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        out.extend((0..n).map(|i| b'a' + (i % 26) as u8));
        left -= n;
        if out.len() >= 1 << 20 || left == 0 {
            if conn.write_all(&out).is_err() {
                return;
            }
            out.clear();
        }
    }
    let exit = br#"{"type":"exit","code":0}"#;
    out.extend_from_slice(&[0x81, exit.len() as u8]);
    out.extend_from_slice(exit);
    out.extend_from_slice(&[0x88, 2, 0x03, 0xe8]);
    let _ = conn.write_all(&out);
    let _ = drain.join();
}

/// Reads one request head (up to the blank line); bytes after it stay in
/// `buf`. `None` at the end of the stream.
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
