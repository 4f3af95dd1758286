//! A hand-written worker that floods a terminal: it answers the version and
//! image preflights and the upgrade, then writes `total` bytes of output in
//! binary frames of `frame` bytes as fast as the socket takes them, then
//! the exit frame (code 0) and a close. What the client sends is read and
//! dropped.
//!
//! The end-to-end suite floods from the first byte behind the 101 (before
//! the consumer could pull); the `terminal_flood` bench starts the flood
//! with the client's first frame. The peer's work per byte is one `write`
//! of a prebuilt buffer, so a bench measures the client, not the peer.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc::{Receiver, channel};

use smolbox_core::ws::Opcode;
use smolbox_core::ws::frame::encode_header;

/// The preflight's reply: a 1.22.0 worker.
const HEALTH: &str =
    r#"{"status":"ok","version":"1.22.0","machines":{"total":1,"running":1},"uptime_seconds":5}"#;

/// The image preflight's reply: `m1`, a running plain image machine.
const MACHINE: &str = r#"{"name":"m1","image":"alpine:3.19","state":"running","cpus":1,"memoryMb":256,"pid":7,"mounts":[],"ports":[],"network":false,"gpu":false,"cuda":false,"storageGb":1,"overlayGb":1,"branchable":false,"forkable":false,"createdAt":1}"#;

/// Bytes of whole frames per prebuilt write (at least one frame).
const WRITE_BYTES: usize = 1 << 20;

/// When the output starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FloodStart {
    /// Right behind the 101, in the same write.
    Immediately,
    /// Once the client sent its first bytes after the upgrade.
    AfterFirstFrame,
}

/// What each terminal connection gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Flood {
    /// Output bytes per terminal.
    pub total: usize,
    /// Payload of each binary frame (the last one may be shorter); ≥ 1.
    pub frame: usize,
    /// When the output starts.
    pub start: FloodStart,
}

/// A flooding worker on a loopback port. It serves every connection it
/// accepts (each on its own thread: the preflight's connection stays
/// pooled while the terminal's arrives) until the process ends, also after
/// this handle is dropped.
#[derive(Debug)]
pub struct FloodPeer {
    addr: SocketAddr,
    served: Receiver<()>,
}

impl FloodPeer {
    /// Starts a peer that floods from the first byte: `total` bytes in
    /// frames of `frame` bytes.
    ///
    /// # Panics
    /// When no loopback port can be bound.
    pub fn start(total: usize, frame: usize) -> Self {
        Self::with(Flood {
            total,
            frame,
            start: FloodStart::Immediately,
        })
    }

    /// Starts a peer serving `flood` to every terminal.
    ///
    /// # Panics
    /// When no loopback port can be bound or `flood.frame` is 0.
    pub fn with(flood: Flood) -> Self {
        assert!(flood.frame > 0, "a flood needs frames of at least one byte");
        #[allow(clippy::unwrap_used)] // a peer that cannot start fails the test
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        #[allow(clippy::unwrap_used)]
        let addr = listener.local_addr().unwrap();
        let (served_tx, served) = channel();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let served_tx = served_tx.clone();
                std::thread::spawn(move || {
                    if serve(conn, flood) {
                        let _ = served_tx.send(());
                    }
                });
            }
        });
        Self { addr, served }
    }

    /// The peer's socket address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Waits until the peer finished serving one terminal connection (the
    /// client's close echo or its end of the stream).
    pub fn join(self) {
        let _ = self.served.recv();
    }
}

/// One connection: preflights until the upgrade, then the flood. True once
/// a terminal was served.
fn serve(mut conn: TcpStream, flood: Flood) -> bool {
    let _ = conn.set_nodelay(true);
    let mut buf = Vec::new();
    loop {
        let Some(head) = read_head(&mut conn, &mut buf) else {
            return false;
        };
        let body = if head.starts_with("GET /health ") {
            HEALTH
        } else if head.starts_with("GET /api/v1/machines/m1 ") {
            // The terminal's image preflight (C7.4): a plain image machine.
            MACHINE
        } else {
            let Some(key) = head.lines().find_map(|l| {
                let (name, value) = l.split_once(':')?;
                name.trim()
                    .eq_ignore_ascii_case("sec-websocket-key")
                    .then(|| value.trim().to_owned())
            }) else {
                return false;
            };
            run(conn, &key, flood);
            return true;
        };
        let reply = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        if conn.write_all(reply.as_bytes()).is_err() {
            return false;
        }
    }
}

/// The 101, then the flood; a second thread drains what the client sends
/// until it closes (and says when its first bytes came).
fn run(mut conn: TcpStream, key: &str, flood: Flood) {
    let Ok(mut reader) = conn.try_clone() else {
        return;
    };
    let (first_tx, first) = channel();
    let drain = std::thread::spawn(move || {
        let mut sink = vec![0u8; 16 << 10];
        let mut first_tx = Some(first_tx);
        while matches!(reader.read(&mut sink), Ok(n) if n > 0) {
            if let Some(tx) = first_tx.take() {
                let _ = tx.send(());
            }
        }
    });
    let accept = smolbox_core::ws::handshake::accept_for(key);
    let upgrade = format!(
        "HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: Upgrade\r\nsec-websocket-accept: {accept}\r\n\r\n"
    );
    let mut w = FloodWriter::new(&mut conn, upgrade.into_bytes());
    let started = match flood.start {
        FloodStart::Immediately => true,
        FloodStart::AfterFirstFrame => w.flush().is_ok() && first.recv().is_ok(),
    };
    if started {
        let _ = write_flood(&mut w, flood);
    }
    // The client's close echo ends the drain; then the socket closes.
    let _ = drain.join();
}

/// Writes `flood.total` bytes of output frames, the exit frame and a close
/// into `w`, whole frames from one prebuilt buffer.
fn write_flood<W: Write>(w: &mut FloodWriter<'_, W>, flood: Flood) -> std::io::Result<()> {
    let per_write = (WRITE_BYTES / flood.frame).max(1);
    let block = frames(flood.frame, per_write);
    let frame_bytes = block.len() / per_write;
    let mut whole = flood.total / flood.frame;
    while whole > 0 {
        let n = whole.min(per_write);
        w.write(&block[..n * frame_bytes])?;
        whole -= n;
    }
    let rest = flood.total % flood.frame;
    if rest > 0 {
        w.write(&frames(rest, 1))?;
    }
    let exit = br#"{"type":"exit","code":0}"#;
    let mut tail = Vec::with_capacity(exit.len() + 6);
    encode_header(&mut tail, true, Opcode::Text, exit.len(), None);
    tail.extend_from_slice(exit);
    // Close 1000.
    encode_header(&mut tail, true, Opcode::Close, 2, None);
    tail.extend_from_slice(&1000u16.to_be_bytes());
    w.write(&tail)?;
    w.flush()
}

/// `count` binary frames of `len` payload bytes each (`a`..`z` repeated).
fn frames(len: usize, count: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(count * (len + 10));
    for _ in 0..count {
        encode_header(&mut out, true, Opcode::Binary, len, None);
        out.extend((0..len).map(|i| b'a' + (i % 26) as u8));
    }
    out
}

/// Bytes held back (the 101) go out with the first write.
struct FloodWriter<'a, W: Write> {
    out: &'a mut W,
    held: Vec<u8>,
}

impl<'a, W: Write> FloodWriter<'a, W> {
    fn new(out: &'a mut W, held: Vec<u8>) -> Self {
        Self { out, held }
    }

    fn write(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        if self.held.is_empty() {
            return self.out.write_all(bytes);
        }
        self.held.extend_from_slice(bytes);
        self.flush()
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if !self.held.is_empty() {
            self.out.write_all(&self.held)?;
            self.held.clear();
        }
        Ok(())
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use smolbox_core::ws::frame::parse_server_header;

    /// The frames a flood writes, parsed back with the client's own header
    /// rules (minimal length encoding, no mask): payload lengths and
    /// opcodes, in order.
    fn parsed(flood: Flood) -> Vec<(Opcode, usize)> {
        let mut sink = Vec::new();
        let mut w = FloodWriter::new(&mut sink, b"HTTP/1.1 101\r\n\r\n".to_vec());
        write_flood(&mut w, flood).unwrap();
        let mut rest = sink
            .strip_prefix(b"HTTP/1.1 101\r\n\r\n".as_slice())
            .unwrap();
        let mut out = Vec::new();
        while !rest.is_empty() {
            let h = parse_server_header(rest, u64::MAX >> 1).unwrap().unwrap();
            let len = h.payload_len as usize;
            out.push((h.opcode, len));
            rest = &rest[h.header_len + len..];
        }
        out
    }

    fn flood(total: usize, frame: usize) -> Flood {
        Flood {
            total,
            frame,
            start: FloodStart::Immediately,
        }
    }

    /// Every length encoding (7-, 16- and 64-bit) is minimal, the output
    /// adds up to `total` in frames of `frame` with a shorter last one, and
    /// the exit and the close follow.
    #[test]
    fn flood_is_total_bytes_in_frames_then_exit_and_close() {
        for (total, frame) in [
            (1000, 125),
            (1000, 126),
            (200_000, 65_535),
            (200_000, 65_536),
            (3 << 20, 16 << 10),
            (5, 7),
        ] {
            let frames = parsed(flood(total, frame));
            let (data, tail) = frames.split_at(frames.len() - 2);
            assert_eq!(
                tail,
                [(Opcode::Text, 24), (Opcode::Close, 2)],
                "{total}/{frame}"
            );
            assert!(
                data.iter()
                    .all(|&(op, n)| op == Opcode::Binary && n <= frame)
            );
            assert!(data[..data.len() - 1].iter().all(|&(_, n)| n == frame));
            assert_eq!(data.iter().map(|&(_, n)| n).sum::<usize>(), total);
        }
    }

    /// No output: only the exit and the close.
    #[test]
    fn empty_flood_is_exit_and_close() {
        assert_eq!(
            parsed(flood(0, 16)),
            [(Opcode::Text, 24), (Opcode::Close, 2)]
        );
    }
}
