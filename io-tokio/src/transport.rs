//! Connections: TCP, TLS (rustls, ring provider) and Unix sockets.
//!
//! A [`Connection`] is one byte stream to a worker. It is opened by
//! [`SocketTarget::connect`] within a deadline; the TLS configuration comes from
//! [`TlsFiles`] and always verifies the peer certificate chain and the host
//! name (there is no switch to turn either off). ALPN offers `http/1.1` only.

use smolbox_core::Reason;
use std::io;
use std::path::PathBuf;
use std::pin::Pin;
use std::task::{Context, Poll};

use smolbox_core::worker::Endpoint;
use smolbox_core::{Error, Evidence, Operation};
use smolbox_tls::{Target, unix_socket_facts};
use std::time::Instant;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

/// Files that configure TLS (one definition, in `smolbox-tls`, shared with
/// the blocking shell).
pub use smolbox_tls::TlsFiles;

/// Where to connect. Built once per client (reading the TLS files then), so
/// connecting does no file I/O.
#[derive(Clone)]
pub struct SocketTarget {
    kind: Target<TlsConnector>,
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

    /// TLS over TCP ([`Target::tls`]: the one client configuration, in a
    /// `tokio_rustls::TlsConnector`).
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

    /// Opens a connection before `deadline`. Nothing of a request has been
    /// written when this fails, so errors carry `not_dispatched`.
    ///
    /// # Errors
    /// `transport` with reason `connect_timeout`, `connect_failed` or
    /// `tls_handshake`.
    pub async fn connect(
        &self,
        deadline: Instant,
        operation: Operation,
    ) -> Result<Connection, Error> {
        let fail = |reason| Error::transport(operation, Evidence::NotDispatched, reason);
        let attempt = async {
            match &self.kind {
                Target::Tcp { host, port } => {
                    let host = host.trim_start_matches('[').trim_end_matches(']');
                    let mut addrs = resolve(host, *port)
                        .await
                        .map_err(|_| fail(Reason::ConnectFailed))?;
                    // Plain HTTP goes to loopback addresses only, whatever
                    // the resolver says (the decision is core's).
                    addrs.retain(|a| smolbox_core::worker::plain_http_address_allowed(a.ip()));
                    if addrs.is_empty() {
                        return Err(fail(Reason::ResolvedNotLoopback));
                    }
                    let s = TcpStream::connect(&addrs[..])
                        .await
                        .map_err(|_| fail(Reason::ConnectFailed))?;
                    let _ = s.set_nodelay(true);
                    Ok(Connection::Tcp(s))
                }
                Target::Unix { path } => {
                    let facts = unix_socket_facts(path).map_err(|_| fail(Reason::ConnectFailed))?;
                    smolbox_core::worker::check_unix_socket(facts)
                        .map_err(|e| e.with_operation(operation))?;
                    UnixStream::connect(path)
                        .await
                        .map(Connection::Unix)
                        .map_err(|_| fail(Reason::ConnectFailed))
                }
                Target::Tls {
                    host,
                    port,
                    name,
                    connector,
                } => {
                    let s = TcpStream::connect((
                        host.trim_start_matches('[').trim_end_matches(']'),
                        *port,
                    ))
                    .await
                    .map_err(|_| fail(Reason::ConnectFailed))?;
                    let _ = s.set_nodelay(true);
                    let tls = connector
                        .connect(name.clone(), s)
                        .await
                        .map_err(|_| fail(Reason::TlsHandshake))?;
                    Ok(Connection::Tls(Box::new(tls)))
                }
            }
        };
        match tokio::time::timeout_at(deadline.into(), attempt).await {
            Ok(r) => r,
            Err(_) => Err(fail(Reason::ConnectTimeout)),
        }
    }
}

/// The addresses of `host` (the caller bounds the wait): a literal address
/// as it is, `localhost` as the loopback without a lookup (RFC 6761 §6.3),
/// anything else through the resolver.
async fn resolve(host: &str, port: u16) -> io::Result<Vec<std::net::SocketAddr>> {
    if let Ok(ip) = host.parse::<std::net::IpAddr>() {
        return Ok(vec![std::net::SocketAddr::new(ip, port)]);
    }
    if host.eq_ignore_ascii_case("localhost") {
        return Ok(vec![
            std::net::SocketAddr::from(([127, 0, 0, 1], port)),
            std::net::SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, port)),
        ]);
    }
    Ok(tokio::net::lookup_host((host, port)).await?.collect())
}

/// One byte stream to a worker.
#[derive(Debug)]
#[non_exhaustive]
pub enum Connection {
    /// Plain TCP (loopback only).
    Tcp(TcpStream),
    /// TLS over TCP.
    Tls(Box<TlsStream<TcpStream>>),
    /// A Unix domain socket.
    Unix(UnixStream),
}

impl Connection {
    /// True when the peer has closed, sent unexpected bytes, or failed while
    /// the connection sat idle: such a connection must not carry a request.
    /// Looks without waiting.
    pub(crate) fn is_stale(&mut self) -> bool {
        let mut byte = [0u8; 1];
        let mut buf = ReadBuf::new(&mut byte);
        let mut cx = Context::from_waker(std::task::Waker::noop());
        // Pending means "nothing to read": the healthy idle case.
        !Pin::new(self).poll_read(&mut cx, &mut buf).is_pending()
    }
}

impl AsyncRead for Connection {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            Self::Unix(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Connection {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Self::Tls(s) => tls_poll_write(s, cx, buf),
            Self::Unix(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Tcp(s) => Pin::new(s).poll_flush(cx),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
            Self::Unix(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            Self::Unix(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

/// Writes plaintext into the TLS session and pushes its records out.
///
/// Unlike `tokio_rustls`' own `poll_write`, a socket error after the
/// session took plaintext is not returned for this call: the bytes were
/// taken (and records carrying some of them may have left), so the call
/// reports them as written and the error surfaces on the next write or
/// flush (a reset socket keeps failing). The machine then learns that its
/// bytes may have reached the worker (`dispatch_uncertain`), never
/// `not_dispatched`.
fn tls_poll_write(
    s: &mut TlsStream<TcpStream>,
    cx: &mut Context<'_>,
    buf: &[u8],
) -> Poll<io::Result<usize>> {
    let (sock, session) = s.get_mut();
    let mut accepted = 0;
    loop {
        if accepted < buf.len() {
            match io::Write::write(&mut session.writer(), &buf[accepted..]) {
                Ok(n) => accepted += n,
                Err(e) if accepted == 0 => return Poll::Ready(Err(e)),
                Err(_) => return Poll::Ready(Ok(accepted)),
            }
        }
        let mut blocked = false;
        while session.wants_write() {
            let mut w = SyncWriter {
                sock: &mut *sock,
                cx: &mut *cx,
            };
            match session.write_tls(&mut w) {
                Ok(0) => {
                    let e = io::Error::from(io::ErrorKind::WriteZero);
                    return Poll::Ready(if accepted > 0 { Ok(accepted) } else { Err(e) });
                }
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    blocked = true;
                    break;
                }
                Err(e) => return Poll::Ready(if accepted > 0 { Ok(accepted) } else { Err(e) }),
            }
        }
        if accepted == buf.len() {
            return Poll::Ready(Ok(accepted));
        }
        if blocked {
            // The socket registered the waker when it returned Pending.
            return if accepted > 0 {
                Poll::Ready(Ok(accepted))
            } else {
                Poll::Pending
            };
        }
    }
}

/// An `io::Write` over a polled socket: `Pending` is `WouldBlock`.
struct SyncWriter<'a, 'b> {
    sock: &'a mut TcpStream,
    cx: &'a mut Context<'b>,
}

impl io::Write for SyncWriter<'_, '_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match Pin::new(&mut *self.sock).poll_write(self.cx, buf) {
            Poll::Ready(r) => r,
            Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
        }
    }

    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        match Pin::new(&mut *self.sock).poll_write_vectored(self.cx, bufs) {
            Poll::Ready(r) => r,
            Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
