//! Non-blocking byte streams on mio: TCP, Unix socket, and TLS over TCP by
//! driving `rustls::ClientConnection` directly.
//!
//! The TLS configuration is `smolbox_tls::ClientTlsBuilder::worker`'s, the
//! one builder both shells and the PostgreSQL store use: peer and host-name
//! verification are always on (no setting turns them off), trust is the CA
//! file and, only when asked, the platform's roots beside it, and the only
//! ALPN protocol offered is `http/1.1` (the WebSocket upgrade needs it).
//!
//! Every method here is non-blocking: it returns `WouldBlock` instead of
//! waiting. Waiting is the job of the connection loop, which owns the
//! `mio::Poll` the stream is registered with.

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use mio::net::{TcpStream, UnixStream};

use smolbox_core::Error;

use rustls::pki_types::ServerName;
use smolbox_core::worker::Endpoint;
use smolbox_tls::Target;

/// Files that configure TLS (one definition, in `smolbox-tls`, shared with
/// the tokio shell).
pub use smolbox_tls::TlsFiles;

/// Plaintext that rustls may hold for sending before `write` refuses more.
/// Bytes past it stay parked in the connection's own buffer.
const TLS_SEND_BUFFER: usize = 64 * 1024;

/// Where to connect. Built once per client (reading the TLS files then), so
/// connecting does no file I/O.
#[derive(Clone)]
pub struct SocketTarget {
    pub(crate) kind: Target<Arc<rustls::ClientConfig>>,
}

impl std::fmt::Debug for SocketTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.kind.fmt(f)
    }
}

impl SocketTarget {
    /// The target of `endpoint` ([`Target::of`]).
    pub(crate) fn of(endpoint: &Endpoint) -> Result<Self, Error> {
        Target::of(endpoint).map(|kind| Self { kind })
    }

    /// Plain TCP. The caller (endpoint validation) is responsible for only
    /// asking for this on loopback with insecure loopback allowed.
    pub fn tcp(host: impl Into<String>, port: u16) -> Self {
        Self {
            kind: Target::tcp(host, port),
        }
    }

    /// A Unix domain socket.
    pub fn unix(path: impl Into<PathBuf>) -> Self {
        Self {
            kind: Target::unix(path),
        }
    }

    /// TLS over TCP ([`Target::tls`]: the one client configuration, from
    /// which each connection's `rustls::ClientConnection` is made).
    ///
    /// # Errors
    /// `validation` (operation `config`) when a file cannot be read or parsed,
    /// or the host is not a valid server name.
    pub fn tls(host: impl Into<String>, port: u16, files: &TlsFiles) -> Result<Self, Error> {
        Target::tls(host, port, files).map(|kind| Self { kind })
    }

    /// True for TLS targets (WebSocket URLs use `wss`).
    pub fn is_tls(&self) -> bool {
        self.kind.is_tls()
    }
}

/// A connected, non-blocking stream.
#[derive(Debug)]
pub(crate) enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
    Tls(Box<TlsStream>),
}

/// TLS over a non-blocking TCP socket.
pub(crate) struct TlsStream {
    sock: TcpStream,
    tls: rustls::ClientConnection,
    /// The socket reported end of stream.
    sock_eof: bool,
}

impl std::fmt::Debug for TlsStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsStream")
            .field("handshaking", &self.tls.is_handshaking())
            .finish_non_exhaustive()
    }
}

impl Stream {
    /// Starts a non-blocking TCP connect to `addr`.
    pub(crate) fn tcp(addr: SocketAddr) -> io::Result<TcpStream> {
        let sock = TcpStream::connect(addr)?;
        sock.set_nodelay(true)?;
        Ok(sock)
    }

    /// Starts a non-blocking Unix-socket connect.
    pub(crate) fn unix(path: &std::path::Path) -> io::Result<Self> {
        UnixStream::connect(path).map(Self::Unix)
    }

    /// Wraps a connected TCP socket in a TLS client (the handshake runs as
    /// the connection is driven).
    pub(crate) fn tls(
        sock: TcpStream,
        config: &Arc<rustls::ClientConfig>,
        name: &ServerName<'static>,
    ) -> io::Result<Self> {
        let mut tls = rustls::ClientConnection::new(Arc::clone(config), name.clone())
            .map_err(io::Error::other)?;
        tls.set_buffer_limit(Some(TLS_SEND_BUFFER));
        Ok(Self::Tls(Box::new(TlsStream {
            sock,
            tls,
            sock_eof: false,
        })))
    }

    /// The mio source to register.
    pub(crate) fn source(&mut self) -> &mut dyn mio::event::Source {
        match self {
            Self::Tcp(s) => s,
            Self::Unix(s) => s,
            Self::Tls(t) => &mut t.sock,
        }
    }

    /// After a writable event on a connecting socket: `Ok(true)` once
    /// connected, `Ok(false)` while still in progress, the error if it
    /// failed.
    pub(crate) fn finish_connect(&mut self) -> io::Result<bool> {
        let (err, peer) = match self {
            Self::Tcp(s) => (s.take_error()?, s.peer_addr().map(|_| ())),
            Self::Unix(s) => (s.take_error()?, s.peer_addr().map(|_| ())),
            Self::Tls(t) => (t.sock.take_error()?, t.sock.peer_addr().map(|_| ())),
        };
        if let Some(e) = err {
            return Err(e);
        }
        match peer {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(false),
            Err(e) if e.raw_os_error() == Some(libc_einprogress()) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// True while a TLS handshake is still running.
    pub(crate) fn is_handshaking(&self) -> bool {
        matches!(self, Self::Tls(t) if t.tls.is_handshaking())
    }

    /// True when TLS has records waiting for the socket.
    pub(crate) fn wants_write(&self) -> bool {
        matches!(self, Self::Tls(t) if t.tls.wants_write())
    }

    /// Reads plaintext. `Ok(0)` is a clean end of stream; `WouldBlock` means
    /// nothing more is available now.
    pub(crate) fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Self::Tcp(s) => s.read(buf),
            Self::Unix(s) => s.read(buf),
            Self::Tls(t) => t.read(buf),
        }
    }

    /// Writes plaintext; `WouldBlock` when nothing could be accepted now.
    pub(crate) fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Self::Tcp(s) => s.write(buf),
            Self::Unix(s) => s.write(buf),
            Self::Tls(t) => t.write(buf),
        }
    }

    /// Pushes pending TLS records to the socket; `WouldBlock` when some
    /// remain. A no-op for plain streams (they have no buffer of their own).
    pub(crate) fn flush_pending(&mut self) -> io::Result<()> {
        match self {
            Self::Tls(t) => t.flush_tls(),
            _ => Ok(()),
        }
    }

    /// Drives the TLS handshake one step: flush records, read records.
    /// `WouldBlock` while waiting for the socket.
    pub(crate) fn handshake_step(&mut self) -> io::Result<()> {
        let Self::Tls(t) = self else { return Ok(()) };
        while t.tls.is_handshaking() {
            t.flush_tls()?;
            if !t.tls.is_handshaking() {
                break;
            }
            if t.sock_eof {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            if !t.tls.wants_read() {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            t.read_records()?;
        }
        t.flush_tls()
    }

    /// Shuts both directions down (best effort; errors are irrelevant once
    /// the connection is being discarded).
    pub(crate) fn shutdown(&mut self) {
        match self {
            Self::Tcp(s) => {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
            Self::Unix(s) => {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
            Self::Tls(t) => {
                t.tls.send_close_notify();
                let _ = t.flush_tls();
                let _ = t.sock.shutdown(std::net::Shutdown::Both);
            }
        }
    }
}

impl TlsStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            match self.tls.reader().read(buf) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
            if self.sock_eof {
                // rustls reports UnexpectedEof above when the peer closed
                // without close_notify; reaching here means it has more to
                // say only once records arrive, which they cannot.
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            self.read_records()?;
        }
    }

    /// One `read_tls` + `process_new_packets`.
    fn read_records(&mut self) -> io::Result<()> {
        let n = loop {
            match self.tls.read_tls(&mut self.sock) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                other => break other?,
            }
        };
        if n == 0 {
            self.sock_eof = true;
        }
        let processed = self.tls.process_new_packets();
        // Alerts and key updates produced while processing go out at once.
        let _ = self.flush_tls();
        processed.map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        Ok(())
    }

    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self.flush_tls() {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
        let n = self.tls.writer().write(buf)?;
        match self.flush_tls() {
            Ok(()) => {}
            // The session took `n` plaintext bytes (records carrying some
            // of them may have left): report them as written, so the
            // machine knows they may have reached the worker. A socket
            // error surfaces again on the next write or flush (a reset
            // socket keeps failing).
            Err(_) if n > 0 => {}
            Err(e) => return Err(e),
        }
        if n == 0 && !buf.is_empty() {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(n)
    }

    fn flush_tls(&mut self) -> io::Result<()> {
        while self.tls.wants_write() {
            match self.tls.write_tls(&mut self.sock) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// EINPROGRESS on the platforms mio supports here (Linux, macOS).
const fn libc_einprogress() -> i32 {
    if cfg!(target_os = "linux") { 115 } else { 36 }
}
