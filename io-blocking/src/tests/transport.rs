//! Transports and the loop against loopback peers made here.

use smolbox_core::Reason;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::os::unix::net::UnixListener;
use std::sync::{Arc, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use smolbox_core::{Category, Evidence, Operation};

use smolbox_core::{Machine, TransportFailure};
use smolbox_tls::testkit::{Pki, REFUSED_SOCKET_MODES, SocketDir};

use crate::conn::Conn;
use crate::errors::ConnectError;
use crate::pool::Pool;
use crate::transport::SocketTarget;

/// Sends `to_send` once and collects replies until `want` bytes or EOF.
struct Probe {
    to_send: Option<Vec<u8>>,
    received: Vec<u8>,
    want: usize,
    eof: bool,
    failed: Option<TransportFailure>,
}

impl Probe {
    fn new(to_send: Vec<u8>, want: usize) -> Self {
        Self {
            to_send: Some(to_send),
            received: Vec::new(),
            want,
            eof: false,
            failed: None,
        }
    }
    fn done(&self) -> bool {
        self.eof || self.failed.is_some() || self.received.len() >= self.want
    }
}

impl Machine for Probe {
    type Event<'a> = ();
    type Timer = ();
    fn handle_input(&mut self, _now: Instant, bytes: &[u8]) {
        self.received.extend_from_slice(bytes);
    }
    fn handle_eof(&mut self, _now: Instant) {
        self.eof = true;
    }
    fn handle_timeout(&mut self, _now: Instant) {}
    fn handle_written(&mut self, _now: Instant, _n: usize) {}
    fn handle_transport_error(&mut self, _now: Instant, failure: TransportFailure) {
        self.failed = Some(failure);
    }
    fn poll_transmit(&mut self, out: &mut Vec<u8>) -> bool {
        match self.to_send.take() {
            Some(bytes) => {
                out.extend_from_slice(&bytes);
                true
            }
            None => false,
        }
    }
    fn poll_timeout(&self) -> Option<(Instant, ())> {
        None
    }
    fn poll_event(&mut self) -> Option<()> {
        None
    }
    fn is_finished(&self) -> bool {
        self.done()
    }
}

fn run(conn: &mut Conn, probe: &mut Probe) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !probe.done() {
        assert!(Instant::now() < deadline, "probe did not finish");
        conn.turn(probe, Some(deadline));
        assert_eq!(probe.failed, None);
    }
}

const BUDGET: Duration = Duration::from_secs(5);

fn soon() -> Instant {
    Instant::now() + Duration::from_secs(5)
}

fn echo_once(mut s: impl Read + Write) {
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if s.write_all(&buf[..n]).is_err() {
                    return;
                }
            }
        }
    }
}

fn tcp_echo() -> (u16, thread::JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let h = thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        echo_once(s);
    });
    (port, h)
}

fn tls_echo(config: Arc<rustls::ServerConfig>) -> (u16, thread::JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let h = thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        let conn = rustls::ServerConnection::new(config).unwrap();
        echo_once(rustls::StreamOwned::new(conn, s));
    });
    (port, h)
}

fn local(port: u16) -> SocketTarget {
    SocketTarget::tcp("127.0.0.1", port)
}

#[test]
fn tcp_round_trip() {
    let (port, h) = tcp_echo();
    let mut conn = Conn::connect(&local(port), soon()).unwrap();
    let mut probe = Probe::new(b"hello over tcp".to_vec(), 14);
    run(&mut conn, &mut probe);
    assert_eq!(probe.received, b"hello over tcp");
    drop(conn);
    h.join().unwrap();
}

#[test]
fn unix_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.sock");
    let l = UnixListener::bind(&path).unwrap();
    let h = thread::spawn(move || echo_once(l.accept().unwrap().0));
    let mut conn = Conn::connect(&SocketTarget::unix(path), soon()).unwrap();
    let mut probe = Probe::new(b"hello over unix".to_vec(), 15);
    run(&mut conn, &mut probe);
    assert_eq!(probe.received, b"hello over unix");
    drop(conn);
    h.join().unwrap();
}

#[test]
fn mutual_tls_round_trip_with_large_payload() {
    let pki = Pki::new(&["127.0.0.1", "localhost"]);
    let (port, h) = tls_echo(pki.server_config(true));
    let setup = SocketTarget::tls("127.0.0.1", port, &pki.client_files(true)).unwrap();
    let mut conn = Conn::connect(&setup, soon()).unwrap();
    let payload: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let mut probe = Probe::new(payload.clone(), payload.len());
    run(&mut conn, &mut probe);
    assert_eq!(probe.received, payload);
    conn.shutdown();
    drop(conn);
    h.join().unwrap();
}

#[test]
fn tls_with_hostname_localhost_verifies() {
    let pki = Pki::new(&["localhost"]);
    let (port, h) = tls_echo(pki.server_config(false));
    let setup = SocketTarget::tls("localhost", port, &pki.client_files(false)).unwrap();
    let mut conn = Conn::connect(&setup, soon()).unwrap();
    let mut probe = Probe::new(b"ping".to_vec(), 4);
    run(&mut conn, &mut probe);
    assert_eq!(probe.received, b"ping");
    conn.shutdown();
    drop(conn);
    h.join().unwrap();
}

#[test]
fn tls_refuses_a_certificate_from_another_ca() {
    let server_pki = Pki::new(&["127.0.0.1"]);
    let other = Pki::new(&["127.0.0.1"]);
    let (port, h) = tls_echo(server_pki.server_config(false));
    let setup = SocketTarget::tls("127.0.0.1", port, &other.client_files(false)).unwrap();
    let err = Conn::connect(&setup, soon()).unwrap_err();
    assert!(matches!(err, ConnectError::Tls), "{err:?}");
    h.join().unwrap();
}

#[test]
fn tls_refuses_a_certificate_for_another_name() {
    let pki = Pki::new(&["worker.example"]);
    let (port, h) = tls_echo(pki.server_config(false));
    let setup = SocketTarget::tls("127.0.0.1", port, &pki.client_files(false)).unwrap();
    let err = Conn::connect(&setup, soon()).unwrap_err();
    assert!(matches!(err, ConnectError::Tls), "{err:?}");
    h.join().unwrap();
}

#[test]
fn a_ca_file_without_certificates_is_refused() {
    let pki = Pki::new(&["127.0.0.1"]);
    std::fs::write(pki.path("empty.pem"), "").unwrap();
    let files = crate::TlsFiles {
        ca_file: Some(pki.path("empty.pem")),
        system_roots: false,
        client_identity: None,
    };
    let e = SocketTarget::tls("127.0.0.1", 1, &files).unwrap_err();
    assert_eq!(
        (e.category(), e.reason()),
        (Category::Validation, Reason::TlsCaFile)
    );
}

#[test]
fn mutual_tls_server_refuses_a_client_without_certificate() {
    let pki = Pki::new(&["127.0.0.1"]);
    let (port, h) = tls_echo(pki.server_config(true));
    let setup = SocketTarget::tls("127.0.0.1", port, &pki.client_files(false)).unwrap();
    // TLS 1.3: the client may finish its side before the server rejects it;
    // the refusal then arrives as an alert on the first read.
    match Conn::connect(&setup, soon()) {
        Err(e) => assert!(matches!(e, ConnectError::Tls), "{e:?}"),
        Ok(mut conn) => {
            let mut probe = Probe::new(b"x".to_vec(), 1);
            let deadline = soon();
            while !probe.done() && Instant::now() < deadline {
                conn.turn(&mut probe, Some(deadline));
            }
            assert!(probe.failed.is_some() && probe.received.is_empty());
        }
    }
    h.join().unwrap();
}

#[test]
fn unreadable_tls_files_are_validation_errors() {
    let files = crate::TlsFiles {
        ca_file: Some("/nonexistent/ca.pem".into()),
        system_roots: false,
        client_identity: None,
    };
    let e = SocketTarget::tls("127.0.0.1", 1, &files).unwrap_err();
    assert_eq!(e.category(), Category::Validation);
    assert_eq!(e.evidence(), Evidence::NotDispatched);
}

#[test]
fn a_silent_tls_peer_runs_into_the_connect_budget() {
    let pki = Pki::new(&["127.0.0.1"]);
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let (tx, rx) = mpsc::channel::<()>();
    let h = thread::spawn(move || {
        let (_s, _) = l.accept().unwrap();
        let _ = rx.recv(); // hold the socket open, say nothing
    });
    let setup = SocketTarget::tls("127.0.0.1", port, &pki.client_files(false)).unwrap();
    let deadline = Instant::now() + Duration::from_millis(100);
    let err = Conn::connect(&setup, deadline).unwrap_err();
    assert!(matches!(err, ConnectError::Timeout), "{err:?}");
    tx.send(()).unwrap();
    h.join().unwrap();
}

#[test]
fn nothing_listening_is_a_connect_failure() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    drop(l);
    let err = Conn::connect(&local(port), soon()).unwrap_err();
    assert!(matches!(err, ConnectError::Refused), "{err:?}");
}

/// A peer that does not read: the transmit is parked at `WouldBlock`, a turn
/// waits instead of spinning, and every byte arrives, in order, once the
/// peer reads.
#[test]
fn blocked_writes_are_parked_not_dropped_nor_spun() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let h = thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        go_rx.recv().unwrap();
        let mut all = Vec::new();
        s.read_to_end(&mut all).unwrap();
        s.write_all(&(all.len() as u64).to_be_bytes()).unwrap();
        all
    });
    let payload: Vec<u8> = (0..8_000_000u32).map(|i| (i % 253) as u8).collect();
    let mut conn = Conn::connect(&local(port), soon()).unwrap();
    let mut probe = Probe::new(payload.clone(), usize::MAX);
    // Turns until the socket refuses more.
    let mut turns = 0;
    while !conn.has_parked() || conn.may_write() {
        conn.turn(&mut probe, Some(Instant::now()));
        assert_eq!(probe.failed, None);
        turns += 1;
        assert!(turns < 1000);
    }
    let parked_before = conn.sent();
    assert!(
        parked_before < payload.len() as u64,
        "the peer took everything"
    );
    // A turn with a short caller deadline waits (one poll) and returns; it
    // does not spin and does not lose the parked bytes.
    conn.turn(&mut probe, Some(Instant::now() + Duration::from_millis(20)));
    assert_eq!(probe.failed, None);
    assert!(conn.has_parked());
    go_tx.send(()).unwrap();
    let deadline = soon();
    while conn.has_parked() {
        assert!(Instant::now() < deadline);
        conn.turn(&mut probe, Some(deadline));
        assert_eq!(probe.failed, None);
    }
    assert_eq!(conn.sent(), payload.len() as u64);
    conn.shutdown_write();
    let got = h.join().unwrap();
    assert!(got == payload, "bytes lost or reordered");
}

#[test]
fn pool_caps_connections_and_times_out_checkout() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let held = thread::spawn(move || {
        let mut socks = Vec::new();
        for _ in 0..4 {
            socks.push(l.accept().unwrap().0);
        }
        socks
    });
    let pool = Arc::new(Pool::new(local(port), 4));
    let mut out = Vec::new();
    for _ in 0..4 {
        out.push(
            pool.checkout(Operation::Health, soon(), BUDGET, soon())
                .unwrap(),
        );
    }
    assert_eq!(pool.open_count(), 4);
    let at = Instant::now() + Duration::from_millis(30);
    let e = pool
        .checkout(Operation::Health, at, BUDGET, soon())
        .unwrap_err();
    assert_eq!(e.category(), Category::Transport);
    assert_eq!(e.evidence(), Evidence::NotDispatched);
    assert_eq!(e.reason(), Reason::PoolCheckoutTimeout);
    // Releasing one as reusable lets the next checkout reuse it.
    out.pop().unwrap().release(true);
    assert_eq!(pool.idle_count(), 1);
    let again = pool
        .checkout(Operation::Health, soon(), BUDGET, soon())
        .unwrap();
    assert!(again.reused);
    assert_eq!(pool.open_count(), 4);
    // A connection the core did not call reusable is closed.
    again.release(false);
    assert_eq!((pool.open_count(), pool.idle_count()), (3, 0));
    drop(out);
    assert_eq!(pool.open_count(), 0);
    drop(held.join().unwrap());
}

#[test]
fn pool_does_not_reuse_a_connection_the_peer_closed() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let (closed_tx, closed_rx) = mpsc::channel::<()>();
    let h = thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        drop(s);
        closed_tx.send(()).unwrap();
        let (s2, _) = l.accept().unwrap();
        s2
    });
    let pool = Arc::new(Pool::new(local(port), 4));
    let c = pool
        .checkout(Operation::Health, soon(), BUDGET, soon())
        .unwrap();
    c.release(true);
    closed_rx.recv().unwrap();
    // Wait until the FIN is visible on our side without sleeping blindly.
    let fresh = pool
        .checkout(Operation::Health, soon(), BUDGET, soon())
        .unwrap();
    assert!(!fresh.reused, "a closed idle connection was reused");
    drop(fresh);
    drop(h.join().unwrap());
}

#[test]
fn checkout_waits_for_a_released_connection() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let held = thread::spawn(move || l.accept().unwrap().0);
    let pool = Arc::new(Pool::new(local(port), 1));
    let first = pool
        .checkout(Operation::Health, soon(), BUDGET, soon())
        .unwrap();
    let p2 = pool.clone();
    let waiter = thread::spawn(move || {
        p2.checkout(Operation::Health, soon(), BUDGET, soon())
            .map(|c| c.reused)
    });
    // The waiter can only succeed through the release below (max is 1).
    first.release(true);
    assert!(waiter.join().unwrap().unwrap());
    drop(held.join().unwrap());
}

#[test]
fn connect_error_mapping_never_claims_dispatch() {
    let e = crate::errors::connect(Operation::Exec, &ConnectError::Timeout);
    assert_eq!(
        (e.category(), e.evidence(), e.reason()),
        (
            Category::Transport,
            Evidence::NotDispatched,
            Reason::ConnectTimeout
        )
    );
}

/// The raw `Connection` (the probe's I/O): writes and reads with a deadline
/// on the same loop; a silent peer times the read out.
#[test]
fn raw_connection_reads_writes_and_times_out() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let h = thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut b = [0u8; 5];
        s.read_exact(&mut b).unwrap();
        go_rx.recv().unwrap();
        s.write_all(&b).unwrap();
    });
    let mut c = local(port).connect(soon(), Operation::Http).unwrap();
    c.write_all_until(b"hello", Some(soon())).unwrap();
    let mut buf = [0u8; 16];
    let e = c
        .read_until(&mut buf, Some(Instant::now() + Duration::from_millis(20)))
        .unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
    go_tx.send(()).unwrap();
    let mut got = Vec::new();
    while got.len() < 5 {
        let n = c.read_until(&mut buf, Some(soon())).unwrap();
        assert!(n > 0);
        got.extend_from_slice(&buf[..n]);
    }
    assert_eq!(got, b"hello");
    assert_eq!(
        c.read_until(&mut buf, Some(soon())).unwrap(),
        0,
        "end of stream"
    );
    h.join().unwrap();
}

#[test]
fn a_tls_reset_before_the_first_record_is_dispatch_uncertain() {
    use smolbox_core::http1::{ExchangeConfig, HttpEvent, HttpExchange, Method, Request};

    let pki = Pki::new(&["127.0.0.1", "localhost"]);
    let config = pki.server_config(true);
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let (tx, rx) = mpsc::channel();
    let h = thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut tls = rustls::ServerConnection::new(config).unwrap();
        while tls.is_handshaking() {
            tls.complete_io(&mut s).unwrap();
        }
        // Reset the TCP connection (SO_LINGER 0) right after the handshake.
        socket2::SockRef::from(&s)
            .set_linger(Some(Duration::ZERO))
            .unwrap();
        drop(s);
        tx.send(()).unwrap();
    });
    let setup = SocketTarget::tls("127.0.0.1", port, &pki.client_files(true)).unwrap();
    let mut conn = Conn::connect(&setup, soon()).unwrap();
    rx.recv().unwrap();
    assert!(conn.wait_for_peer_end(soon()), "the reset arrived");

    let now = Instant::now();
    let config = ExchangeConfig::new("localhost", now + BUDGET);
    let request = Request::new(Operation::Get, Method::Get, "/health".into());
    let mut ex = HttpExchange::new(&request, &config, now).unwrap();
    let e = loop {
        conn.turn(&mut ex, Some(soon()));
        match ex.poll_event() {
            Some(HttpEvent::Failed(e)) => break e,
            Some(HttpEvent::End) => panic!("the server reset the connection"),
            _ => {}
        }
    };
    // The TLS session took the request's plaintext before the socket
    // failed: it may have reached the worker.
    assert_eq!(e.category(), Category::Transport, "{e:?}");
    assert_eq!(e.evidence(), Evidence::DispatchUncertain, "{e:?}");
    h.join().unwrap();
}

#[test]
fn plain_tcp_connects_only_to_loopback_addresses() {
    for host in ["10.255.255.1", "0.0.0.0", "::ffff:10.0.0.1"] {
        let e = SocketTarget::tcp(host, 80)
            .connect(soon(), Operation::Health)
            .unwrap_err();
        assert_eq!(
            (e.category(), e.reason(), e.evidence()),
            (
                Category::Transport,
                Reason::ResolvedNotLoopback,
                Evidence::NotDispatched
            ),
            "{host}"
        );
    }
    // `localhost` is the loopback without a lookup.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    assert!(
        SocketTarget::tcp("localhost", port)
            .connect(soon(), Operation::Health)
            .is_ok()
    );
    drop(l);
}

#[test]
fn a_unix_socket_others_could_replace_or_write_is_refused_unsent() {
    let s = SocketDir::new();
    for (dir_mode, sock_mode, reason) in REFUSED_SOCKET_MODES {
        s.set_modes(dir_mode, sock_mode);
        let e = SocketTarget::unix(s.socket())
            .connect(soon(), Operation::Health)
            .unwrap_err();
        assert_eq!(
            (e.category(), e.reason(), e.evidence(), e.operation()),
            (
                Category::Validation,
                reason,
                Evidence::NotDispatched,
                Operation::Health
            ),
            "{dir_mode:o} {sock_mode:o}"
        );
    }
    // A private directory and a socket others cannot write: accepted.
    s.set_modes(0o700, 0o775);
    assert!(
        SocketTarget::unix(s.socket())
            .connect(soon(), Operation::Health)
            .is_ok()
    );
    // A regular file is not a socket.
    let e = SocketTarget::unix(s.regular_file())
        .connect(soon(), Operation::Health)
        .unwrap_err();
    assert_eq!(e.reason(), Reason::SocketNotASocket);
}
