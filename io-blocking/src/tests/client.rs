//! The client against a scripted loopback HTTP peer: one operation per call,
//! connection reuse only when the core allows it, budgets, evidence.

use smolbox_core::Reason;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::os::unix::net::UnixListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::thread;
use std::time::Duration;

use smolbox_core::worker::{Budgets, Endpoint, EndpointConfig, Health, Readyz};
use smolbox_core::{Category, Evidence, Operation, Secret};

use crate::Client;
use smolbox_tls::testkit::Pki;

const HEALTH: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 33\r\n\r\n{\"status\":\"ok\",\"version\":\"1.9.2\"}";

/// Reads one request head (and a Content-Length body) from `s`.
fn read_request(s: &mut impl Read) -> Option<Vec<u8>> {
    let mut got = Vec::new();
    let mut b = [0u8; 1];
    while !got.ends_with(b"\r\n\r\n") {
        match s.read(&mut b) {
            Ok(1) => got.push(b[0]),
            _ => return None,
        }
    }
    Some(got)
}

/// The `/health` reply of a 1.22.0 worker (the preflight of exec and
/// terminal calls).
pub(super) const HEALTH_1_22: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 34\r\n\r\n{\"status\":\"ok\",\"version\":\"1.22.0\"}";

/// A peer answering every request on every connection with `reply` (and
/// the version preflight `GET /health` with [`HEALTH_1_22`], not counted);
/// counts connections and requests.
pub(super) struct Peer {
    pub(super) port: u16,
    pub(super) conns: Arc<AtomicUsize>,
    pub(super) requests: Arc<AtomicUsize>,
}

pub(super) fn peer(reply: &'static [u8]) -> Peer {
    peer_with(reply, false)
}

/// [`peer`] that also answers the version preflight (exec, terminals).
pub(super) fn worker_peer(reply: &'static [u8]) -> Peer {
    peer_with(reply, true)
}

fn peer_with(reply: &'static [u8], preflight: bool) -> Peer {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let conns = Arc::new(AtomicUsize::new(0));
    let requests = Arc::new(AtomicUsize::new(0));
    let (c, r) = (conns.clone(), requests.clone());
    thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            c.fetch_add(1, Ordering::SeqCst);
            let r = r.clone();
            thread::spawn(move || {
                while let Some(head) = read_request(&mut s) {
                    // The head may follow the unread body of the last request.
                    let is_health = head.windows(12).any(|w| w == b"GET /health ");
                    let answer = if preflight && is_health {
                        HEALTH_1_22
                    } else {
                        r.fetch_add(1, Ordering::SeqCst);
                        reply
                    };
                    if s.write_all(answer).is_err() {
                        return;
                    }
                }
            });
        }
    });
    Peer {
        port,
        conns,
        requests,
    }
}

pub(super) fn budgets() -> Budgets {
    Budgets {
        connect: Duration::from_secs(2),
        pool_checkout: Duration::from_secs(2),
        receive_idle: Duration::from_secs(5),
        operation: Duration::from_secs(10),
        max_request_body: Budgets::DEFAULT_MAX_REQUEST_BODY,
        max_response_bytes: Budgets::DEFAULT_MAX_RESPONSE_BYTES,
    }
}

pub(super) fn tcp_client(port: u16, budgets: Budgets) -> Client {
    let endpoint = Endpoint::new(EndpointConfig {
        id: "w1".into(),
        base_url: format!("http://127.0.0.1:{port}"),
        allow_insecure_loopback: true,
        budgets,
        ..EndpointConfig::default()
    })
    .unwrap();
    Client::new(endpoint).unwrap()
}

#[test]
fn health_over_tcp_reuses_one_connection() {
    let p = peer(HEALTH);
    let client = tcp_client(p.port, budgets());
    for _ in 0..3 {
        let h = client.call(&Health::new()).unwrap();
        assert_eq!(h.version, "1.9.2");
    }
    assert_eq!(p.requests.load(Ordering::SeqCst), 3);
    assert_eq!(
        p.conns.load(Ordering::SeqCst),
        1,
        "keep-alive connection not reused"
    );
}

#[test]
fn a_reply_with_connection_close_is_not_reused() {
    let p = peer(b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: 33\r\n\r\n{\"status\":\"ok\",\"version\":\"1.9.2\"}");
    let client = tcp_client(p.port, budgets());
    client.call(&Health::new()).unwrap();
    client.call(&Health::new()).unwrap();
    assert_eq!(p.conns.load(Ordering::SeqCst), 2);
}

#[test]
fn health_over_a_unix_socket() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.sock");
    let l = UnixListener::bind(&path).unwrap();
    thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        while read_request(&mut s).is_some() {
            s.write_all(HEALTH).unwrap();
        }
    });
    let endpoint = Endpoint::new(EndpointConfig {
        id: "w1".into(),
        base_url: "http://localhost".into(),
        unix_socket: Some(path.to_str().unwrap().into()),
        budgets: budgets(),
        ..EndpointConfig::default()
    })
    .unwrap();
    let client = Client::new(endpoint).unwrap();
    assert_eq!(client.call(&Health::new()).unwrap().version, "1.9.2");
}

#[test]
fn health_over_mutual_tls_sends_the_token() {
    let pki = Pki::new(&["localhost"]);
    let config = pki.server_config(true);
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        let mut tls = rustls::StreamOwned::new(rustls::ServerConnection::new(config).unwrap(), s);
        let req = read_request(&mut tls).unwrap();
        tx.send(req).unwrap();
        tls.write_all(HEALTH).unwrap();
        tls.flush().unwrap();
        let _ = read_request(&mut tls);
    });
    let endpoint = Endpoint::new(EndpointConfig {
        id: "w1".into(),
        base_url: format!("https://localhost:{port}"),
        token: Some(Secret::new("SENTINEL-TOKEN")),
        ca_file: Some(pki.path("ca.pem")),
        client_cert: Some(pki.path("client.pem")),
        client_key: Some(pki.path("client.key")),
        budgets: budgets(),
        ..EndpointConfig::default()
    })
    .unwrap();
    let client = Client::new(endpoint).unwrap();
    assert_eq!(client.call(&Health::new()).unwrap().version, "1.9.2");
    let req = String::from_utf8(rx.recv().unwrap()).unwrap();
    assert!(req.contains("Bearer SENTINEL-TOKEN"), "{req}");
    assert!(!format!("{client:?}").contains("SENTINEL"));
}

#[test]
fn https_without_ca_file_is_unsupported() {
    let endpoint = Endpoint::new(EndpointConfig {
        id: "w1".into(),
        base_url: "https://localhost:1".into(),
        token: Some(Secret::new("t")),
        budgets: budgets(),
        ..EndpointConfig::default()
    })
    .unwrap();
    let e = Client::new(endpoint).unwrap_err();
    assert_eq!(e.category(), Category::UnsupportedCapability);
}

#[test]
fn nothing_listening_is_transport_not_dispatched() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    drop(l);
    let e = tcp_client(port, budgets())
        .call(&Health::new())
        .unwrap_err();
    assert_eq!(
        (e.category(), e.evidence(), e.operation(), e.reason()),
        (
            Category::Transport,
            Evidence::NotDispatched,
            Operation::Health,
            Reason::ConnectFailed
        )
    );
}

#[test]
fn a_silent_peer_hits_the_receive_idle_budget_after_dispatch() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let (tx, rx) = mpsc::channel::<()>();
    thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let _ = read_request(&mut s);
        let _ = rx.recv();
    });
    let mut b = budgets();
    b.receive_idle = Duration::from_millis(50);
    let e = tcp_client(port, b).call(&Health::new()).unwrap_err();
    assert_eq!(
        (e.category(), e.evidence(), e.reason()),
        (
            Category::Transport,
            Evidence::DispatchUncertain,
            Reason::IdleTimeout
        )
    );
    drop(tx);
}

#[test]
fn a_slow_trickle_hits_the_operation_deadline() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let (tx, rx) = mpsc::channel::<()>();
    thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let _ = read_request(&mut s);
        // One byte of head every 10 ms keeps the idle timer happy, never ends.
        for b in b"HTTP/1.1 200 OK\r\nx-pad: "
            .iter()
            .chain([b'a'; 10_000].iter())
        {
            if rx.try_recv().is_ok() || s.write_all(&[*b]).is_err() {
                return;
            }
            thread::sleep(Duration::from_millis(10));
        }
    });
    let mut b = budgets();
    b.receive_idle = Duration::from_secs(5);
    b.operation = Duration::from_millis(150);
    let e = tcp_client(port, b).call(&Health::new()).unwrap_err();
    assert_eq!(
        (e.category(), e.evidence(), e.reason()),
        (
            Category::Transport,
            Evidence::DispatchUncertain,
            Reason::Deadline
        )
    );
    let _ = tx.send(());
}

/// The response byte cap at N (accepted) and N+1 (refused).
#[test]
fn response_byte_cap_at_n_and_n_plus_one() {
    let p = peer(HEALTH);
    let body_len = 33u64;
    let mut b = budgets();
    b.max_response_bytes = body_len;
    assert!(tcp_client(p.port, b).call(&Health::new()).is_ok());
    b.max_response_bytes = body_len - 1;
    let e = tcp_client(p.port, b).call(&Health::new()).unwrap_err();
    assert_eq!(e.category(), Category::OutputLimit, "{e:?}");
    assert_eq!(e.evidence(), Evidence::DispatchUncertain);
}

#[test]
fn readyz_requires_exactly_200_and_empty() {
    let p = peer(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n");
    tcp_client(p.port, budgets()).call(&Readyz).unwrap();
    let p = peer(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n");
    let e = tcp_client(p.port, budgets()).call(&Readyz).unwrap_err();
    assert_eq!(e.evidence(), Evidence::DispatchUncertain);
}

/// A TLS peer that sends a whole reply and vanishes without `close_notify`:
/// the reply is complete, so the call succeeds (the read failure after it
/// is reported only if the core still needed bytes).
#[test]
fn a_complete_reply_before_an_unclean_tls_close_is_a_result() {
    let pki = Pki::new(&["localhost"]);
    let config = pki.server_config(true);
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        let mut tls = rustls::StreamOwned::new(rustls::ServerConnection::new(config).unwrap(), s);
        read_request(&mut tls).unwrap();
        tls.write_all(HEALTH).unwrap();
        tls.flush().unwrap();
        // Dropping the socket without close_notify.
        let _ = tls.sock.shutdown(std::net::Shutdown::Both);
    });
    let endpoint = Endpoint::new(EndpointConfig {
        id: "w1".into(),
        base_url: format!("https://localhost:{port}"),
        token: Some(Secret::new("t")),
        ca_file: Some(pki.path("ca.pem")),
        client_cert: Some(pki.path("client.pem")),
        client_key: Some(pki.path("client.key")),
        budgets: budgets(),
        ..EndpointConfig::default()
    })
    .unwrap();
    assert_eq!(
        Client::new(endpoint).unwrap().health().unwrap().version,
        "1.9.2"
    );
}
