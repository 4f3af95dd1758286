//! Transport and pool tests on loopback (TCP, mutual TLS, Unix socket).

use smolbox_core::Reason;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use smolbox_core::{Category, Evidence, Operation};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, UnixListener};

use crate::pool::Pool;
use crate::transport::{SocketTarget, TlsFiles};
use smolbox_tls::testkit::{Pki, REFUSED_SOCKET_MODES, SocketDir};

/// A mutual-TLS echo server on 127.0.0.1; returns its port.
async fn mtls_echo(pki: &Pki) -> u16 {
    let acceptor = tokio_rustls::TlsAcceptor::from(pki.server_config(true));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        for _ in 0..8 {
            let Ok((s, _)) = listener.accept().await else {
                return;
            };
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                if let Ok(mut tls) = acceptor.accept(s).await {
                    let mut b = [0u8; 64];
                    if let Ok(n) = tls.read(&mut b).await {
                        let _ = tls.write_all(&b[..n]).await;
                        let _ = tls.flush().await;
                    }
                }
            });
        }
    });
    port
}

fn soon() -> Instant {
    Instant::now() + Duration::from_secs(5)
}

#[tokio::test]
async fn mutual_tls_connects_and_carries_bytes() {
    let pki = Pki::new(&["localhost"]);
    let port = mtls_echo(&pki).await;
    let files = pki.client_files(true);
    let target = SocketTarget::tls("localhost", port, &files).unwrap();
    let mut conn = target.connect(soon(), Operation::Health).await.unwrap();
    conn.write_all(b"ping").await.unwrap();
    conn.flush().await.unwrap();
    let mut b = [0u8; 4];
    conn.read_exact(&mut b).await.unwrap();
    assert_eq!(&b, b"ping");
}

#[tokio::test]
async fn tls_refuses_an_unknown_ca_and_a_wrong_host_name() {
    let pki = Pki::new(&["localhost"]);
    let other = Pki::new(&["localhost"]);
    let port = mtls_echo(&pki).await;
    // A CA that did not sign the server.
    let files = TlsFiles {
        ca_file: Some(other.path("ca.pem")),
        system_roots: false,
        client_identity: Some(pki.client_identity()),
    };
    let e = SocketTarget::tls("localhost", port, &files)
        .unwrap()
        .connect(soon(), Operation::Health)
        .await
        .unwrap_err();
    assert_eq!(
        (e.category(), e.evidence(), e.reason()),
        (
            Category::Transport,
            Evidence::NotDispatched,
            Reason::TlsHandshake
        )
    );
    // The right CA, but the certificate does not name 127.0.0.1.
    let files = pki.client_files(true);
    let e = SocketTarget::tls("127.0.0.1", port, &files)
        .unwrap()
        .connect(soon(), Operation::Health)
        .await
        .unwrap_err();
    assert_eq!(e.reason(), Reason::TlsHandshake);
}

#[tokio::test]
async fn system_roots_add_trust_beside_the_ca_file_and_never_replace_it() {
    let pki = Pki::new(&["localhost"]);
    let port = mtls_echo(&pki).await;
    let identity = Some(pki.client_identity());
    // The server's CA is in the file only: the platform's roots alone do
    // not anchor it (or, on a machine without a trust store, the
    // configuration is refused before any connection).
    let files = TlsFiles {
        ca_file: None,
        system_roots: true,
        client_identity: identity.clone(),
    };
    match SocketTarget::tls("localhost", port, &files) {
        Ok(target) => {
            let e = target.connect(soon(), Operation::Health).await.unwrap_err();
            assert_eq!(
                (e.category(), e.reason()),
                (Category::Transport, Reason::TlsHandshake)
            );
        }
        Err(e) => assert_eq!(e.reason(), Reason::TlsSystemRoots),
    }
    // Beside the file the same server is accepted and carries bytes.
    let files = TlsFiles {
        ca_file: Some(pki.path("ca.pem")),
        system_roots: true,
        client_identity: identity,
    };
    if let Ok(target) = SocketTarget::tls("localhost", port, &files) {
        let mut conn = target.connect(soon(), Operation::Health).await.unwrap();
        conn.write_all(b"ping").await.unwrap();
        conn.flush().await.unwrap();
        let mut b = [0u8; 4];
        conn.read_exact(&mut b).await.unwrap();
        assert_eq!(&b, b"ping");
    }
    // Neither a file nor system roots: nothing to trust.
    let e = SocketTarget::tls("localhost", port, &TlsFiles::default()).unwrap_err();
    assert_eq!(e.reason(), Reason::TlsRequiresCaFile);
}

#[tokio::test]
async fn tls_files_that_are_missing_or_not_pem_are_validation_errors() {
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.pem");
    std::fs::write(&junk, "not a certificate").unwrap();
    for ca in [dir.path().join("missing.pem"), junk] {
        let files = TlsFiles {
            ca_file: Some(ca),
            system_roots: false,
            client_identity: None,
        };
        let e = SocketTarget::tls("localhost", 1, &files).unwrap_err();
        assert_eq!(
            (e.category(), e.reason()),
            (Category::Validation, Reason::TlsCaFile)
        );
    }
}

#[tokio::test]
async fn connect_refused_is_transport_not_dispatched() {
    // Bind then drop to get a port nobody listens on.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let e = SocketTarget::tcp("127.0.0.1", port)
        .connect(soon(), Operation::Get)
        .await
        .unwrap_err();
    assert_eq!(
        (e.category(), e.operation(), e.evidence(), e.reason()),
        (
            Category::Transport,
            Operation::Get,
            Evidence::NotDispatched,
            Reason::ConnectFailed
        )
    );
}

#[tokio::test]
async fn unix_socket_connects() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.sock");
    let listener = UnixListener::bind(&path).unwrap();
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        s.write_all(b"hi").await.unwrap();
    });
    let mut conn = SocketTarget::unix(&path)
        .connect(soon(), Operation::Health)
        .await
        .unwrap();
    let mut b = [0u8; 2];
    conn.read_exact(&mut b).await.unwrap();
    assert_eq!(&b, b"hi");
}

/// A TCP server that counts accepted connections and keeps them open.
async fn counting_server() -> (u16, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let count = Arc::new(AtomicUsize::new(0));
    let c = Arc::clone(&count);
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = listener.accept().await {
            c.fetch_add(1, Ordering::SeqCst);
            held.push(s);
        }
    });
    (port, count)
}

#[tokio::test]
async fn pool_holds_at_most_four_and_times_out_the_fifth_checkout() {
    let (port, accepted) = counting_server().await;
    let pool = Pool::new(SocketTarget::tcp("127.0.0.1", port), 4);
    let budget = Duration::from_secs(5);
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(
            pool.checkout(Operation::Get, soon(), budget, soon())
                .await
                .unwrap(),
        );
    }
    let e = pool
        .checkout(
            Operation::Get,
            Instant::now() + Duration::from_millis(20),
            budget,
            soon(),
        )
        .await
        .unwrap_err();
    assert_eq!(
        (e.category(), e.evidence(), e.reason()),
        (
            Category::Transport,
            Evidence::NotDispatched,
            Reason::PoolCheckoutTimeout
        )
    );
    // Give one back as reusable: the next checkout reuses it (no new accept).
    let (conn, permit) = held.pop().unwrap().into_parts();
    pool.give_back(conn, permit);
    assert_eq!(pool.idle_len(), 1);
    let again = pool
        .checkout(Operation::Get, soon(), budget, soon())
        .await
        .unwrap();
    assert!(!again.fresh);
    drop(again);
    let fresh = pool
        .checkout(Operation::Get, soon(), budget, soon())
        .await
        .unwrap();
    assert!(fresh.fresh);
    // Wait for the server to have seen every connect (4 + 1 fresh).
    while accepted.load(Ordering::SeqCst) < 5 {
        tokio::task::yield_now().await;
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 5);
}

#[tokio::test]
async fn pool_drops_an_idle_connection_the_peer_closed() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (closed_tx, closed_rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (s, _) = listener.accept().await.unwrap();
        drop(s);
        let _ = closed_tx.send(());
        let (s2, _) = listener.accept().await.unwrap();
        std::future::pending::<()>().await;
        drop(s2);
    });
    let pool = Pool::new(SocketTarget::tcp("127.0.0.1", port), 4);
    let first = pool
        .checkout(Operation::Get, soon(), Duration::from_secs(5), soon())
        .await
        .unwrap();
    let (mut conn, permit) = first.into_parts();
    closed_rx.await.unwrap();
    // Let the FIN arrive: read until EOF is visible.
    let mut b = [0u8; 1];
    assert_eq!(conn.read(&mut b).await.unwrap(), 0);
    pool.give_back(conn, permit);
    let next = pool
        .checkout(Operation::Get, soon(), Duration::from_secs(5), soon())
        .await
        .unwrap();
    assert!(next.fresh, "a closed idle connection is never reused");
}

/// A mutual-TLS server on 127.0.0.1 that completes one handshake and then
/// resets the TCP connection (SO_LINGER 0); `reset` fires after the reset.
async fn tls_resetting_server(pki: &Pki) -> (u16, tokio::sync::oneshot::Receiver<()>) {
    let acceptor = tokio_rustls::TlsAcceptor::from(pki.server_config(true));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (s, _) = listener.accept().await.unwrap();
        let tls = acceptor.accept(s).await.unwrap();
        let (tcp, _) = tls.into_inner();
        tcp.set_zero_linger().unwrap();
        drop(tcp);
        let _ = tx.send(());
    });
    (port, rx)
}

#[tokio::test]
async fn a_tls_reset_before_the_first_record_is_dispatch_uncertain() {
    use smolbox_core::http1::{ExchangeConfig, HttpEvent, HttpExchange, Method, Request};

    use crate::transport::Connection;

    let pki = Pki::new(&["localhost"]);
    let (port, reset) = tls_resetting_server(&pki).await;
    let files = pki.client_files(true);
    let target = SocketTarget::tls("localhost", port, &files).unwrap();
    let conn = target.connect(soon(), Operation::Health).await.unwrap();
    reset.await.unwrap();
    // Wait until the reset reached this socket (it turns readable).
    let Connection::Tls(tls) = &conn else {
        panic!("a TLS connection")
    };
    tls.get_ref().0.readable().await.unwrap();

    let now = Instant::now();
    let config = ExchangeConfig::new("localhost", now + Duration::from_secs(5));
    let request = Request::new(Operation::Get, Method::Get, "/health".into());
    let mut ex = HttpExchange::new(&request, &config, now).unwrap();
    let mut driver = crate::drive::Driver::new(conn);
    let e = loop {
        driver.turn(&mut ex).await;
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
}

#[tokio::test]
async fn plain_tcp_connects_only_to_loopback_addresses() {
    for host in ["10.255.255.1", "0.0.0.0", "::ffff:10.0.0.1"] {
        let e = SocketTarget::tcp(host, 80)
            .connect(soon(), Operation::Health)
            .await
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
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let conn = SocketTarget::tcp("localhost", port)
        .connect(soon(), Operation::Health)
        .await;
    assert!(conn.is_ok());
}

#[tokio::test]
async fn a_unix_socket_others_could_replace_or_write_is_refused_unsent() {
    let s = SocketDir::new();
    for (dir_mode, sock_mode, reason) in REFUSED_SOCKET_MODES {
        s.set_modes(dir_mode, sock_mode);
        let e = SocketTarget::unix(s.socket())
            .connect(soon(), Operation::Health)
            .await
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
            .await
            .is_ok()
    );
    // A regular file is not a socket.
    let e = SocketTarget::unix(s.regular_file())
        .connect(soon(), Operation::Health)
        .await
        .unwrap_err();
    assert_eq!(e.reason(), Reason::SocketNotASocket);
}

/// A worker peer: `GET /health` answers 1.22.0 (the exec preflight), every
/// other request a short SSE exec reply; counts the non-health requests.
async fn sse_worker() -> (u16, Arc<AtomicUsize>) {
    const BODY: &str = "event: stdout\ndata: hi\ndata: \n\nevent: exit\ndata: {\"exitCode\":3}\n\n";
    const HEALTH: &str = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 34\r\n\r\n{\"status\":\"ok\",\"version\":\"1.22.0\"}";
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let requests = Arc::new(AtomicUsize::new(0));
    let r = Arc::clone(&requests);
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let r = Arc::clone(&r);
            tokio::spawn(async move {
                let mut got = Vec::new();
                let mut b = [0u8; 1];
                loop {
                    got.clear();
                    while !got.ends_with(b"\r\n\r\n") {
                        if s.read(&mut b).await.unwrap_or(0) == 0 {
                            return;
                        }
                        got.push(b[0]);
                    }
                    let answer = if got.starts_with(b"GET /health ") {
                        HEALTH.to_owned()
                    } else {
                        r.fetch_add(1, Ordering::SeqCst);
                        format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{BODY}\r\n0\r\n\r\n",
                            BODY.len()
                        )
                    };
                    if s.write_all(answer.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (port, requests)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callback_threads_are_bounded_per_client_and_a_refusal_sends_nothing() {
    use smolbox_core::exec::Command;
    use smolbox_core::worker::{Budgets, Endpoint, EndpointConfig};

    let (port, requests) = sse_worker().await;
    let client = crate::Client::new(
        Endpoint::new(EndpointConfig {
            id: "w1".into(),
            base_url: format!("http://127.0.0.1:{port}"),
            allow_insecure_loopback: true,
            budgets: Budgets {
                operation: Duration::from_millis(300),
                ..Budgets::default()
            },
            ..EndpointConfig::default()
        })
        .unwrap(),
    )
    .unwrap();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let release_rx = Arc::new(std::sync::Mutex::new(release_rx));
    // N = 8 callbacks block past the deadline: each call is cut off, and
    // each abandoned thread still counts.
    for _ in 0..crate::MAX_DELIVERY_THREADS {
        let rx = Arc::clone(&release_rx);
        let e = client
            .exec_with("dev", &Command::new(["echo", "hi"]), move |_| {
                let _ = rx.lock().map(|r| r.recv());
            })
            .await
            .unwrap_err();
        assert_eq!(
            (e.category(), e.evidence(), e.reason()),
            (
                Category::Transport,
                Evidence::DispatchUncertain,
                Reason::CallbackDeadline
            )
        );
    }
    assert_eq!(client.callback_threads(), crate::MAX_DELIVERY_THREADS);
    // N + 1: refused before anything is sent.
    let before = requests.load(Ordering::SeqCst);
    let e = client
        .exec_with("dev", &Command::new(["echo", "hi"]), |_| {})
        .await
        .unwrap_err();
    assert_eq!(
        (e.category(), e.evidence(), e.reason()),
        (
            Category::AdmissionExhausted,
            Evidence::NotDispatched,
            Reason::CallbackThreadsExhausted
        )
    );
    assert_eq!(
        requests.load(Ordering::SeqCst),
        before,
        "a refused call sent a request"
    );
    // A stream without a callback needs no thread and still runs.
    let mut stream = client
        .exec_stream("dev", &Command::new(["echo", "hi"]))
        .await
        .unwrap();
    let mut last = None;
    while let Some(ev) = stream.next().await {
        last = Some(ev.unwrap());
    }
    assert!(matches!(last, Some(crate::ExecEvent::Exit(3))), "{last:?}");
    drop(release_tx);
}

/// The pool keeps the drive buffers of finished exchanges for the next
/// ones (no 64 KiB allocated and zeroed per request), at most one set per
/// connection slot (N kept, N+1 freed), and never a write buffer a large
/// request grew.
#[test]
fn the_pool_keeps_at_most_one_buffer_set_per_connection_slot() {
    use crate::drive::{Buffers, KEEP_OUT};
    use crate::pool::MAX_CONNECTIONS;
    let pool = Pool::new(SocketTarget::unix("/nonexistent"), 2);
    for _ in 0..MAX_CONNECTIONS {
        pool.keep_buffers(Buffers::default());
    }
    assert_eq!(pool.kept_buffers(), MAX_CONNECTIONS);
    pool.keep_buffers(Buffers::default());
    assert_eq!(pool.kept_buffers(), MAX_CONNECTIONS, "N+1 is freed");
    let _taken = pool.take_buffers();
    assert_eq!(pool.kept_buffers(), MAX_CONNECTIONS - 1);
    pool.keep_buffers(Buffers::with_out_capacity(KEEP_OUT + 1));
    assert_eq!(
        pool.kept_buffers(),
        MAX_CONNECTIONS - 1,
        "a grown buffer is freed"
    );
    pool.keep_buffers(Buffers::with_out_capacity(KEEP_OUT));
    assert_eq!(pool.kept_buffers(), MAX_CONNECTIONS);
}
