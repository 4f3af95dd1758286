//! The builder against an in-memory rustls server (no socket): a server
//! certificate from a CA only in the file is accepted with the file and
//! refused without it; system roots added beside it never make an
//! unanchored (self-signed) certificate acceptable.

#![allow(clippy::unwrap_used)]

use super::*;
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use rustls::{ClientConnection, ServerConnection};

struct Ca {
    pem: String,
    issuer: Issuer<'static, KeyPair>,
}

fn ca(name: &str) -> Ca {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    let cert = params.self_signed(&key).unwrap();
    Ca {
        pem: cert.pem(),
        issuer: Issuer::new(params, key),
    }
}

/// A server for `localhost` whose certificate `ca` signs (or, with `None`,
/// a self-signed one).
fn server(ca: Option<&Ca>) -> Arc<rustls::ServerConfig> {
    let key = KeyPair::generate().unwrap();
    let params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    let cert = match ca {
        Some(ca) => params.signed_by(&key, &ca.issuer).unwrap(),
        None => params.self_signed(&key).unwrap(),
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes()).unwrap(),
        )
        .unwrap();
    Arc::new(config)
}

/// Runs a handshake for `localhost` in memory; the client's verdict.
fn handshake(
    client: rustls::ClientConfig,
    server: Arc<rustls::ServerConfig>,
) -> Result<(), String> {
    handshake_as(client, "localhost", server)
}

/// Runs a handshake in memory with the client asking for `host`; the
/// client's verdict.
fn handshake_as(
    client: rustls::ClientConfig,
    host: &str,
    server: Arc<rustls::ServerConfig>,
) -> Result<(), String> {
    let name = server_name(host).unwrap();
    let mut c = ClientConnection::new(Arc::new(client), name).unwrap();
    let mut s = ServerConnection::new(server).unwrap();
    for _ in 0..20 {
        let mut buf = Vec::new();
        while c.wants_write() {
            c.write_tls(&mut buf).unwrap();
        }
        let mut rd = &buf[..];
        while !rd.is_empty() {
            s.read_tls(&mut rd).unwrap();
        }
        // The server's own verdict does not matter here; the client's does.
        let _ = s.process_new_packets();
        let mut buf = Vec::new();
        while s.wants_write() {
            s.write_tls(&mut buf).unwrap();
        }
        let mut rd = &buf[..];
        while !rd.is_empty() {
            c.read_tls(&mut rd).unwrap();
        }
        c.process_new_packets().map_err(|e| e.to_string())?;
        if !c.is_handshaking() {
            return Ok(());
        }
    }
    Err("handshake did not finish".to_owned())
}

fn platform(cas: &[&Ca]) -> impl FnOnce() -> SystemStore {
    let certs = cas
        .iter()
        .map(|ca| CertificateDer::from_pem_slice(ca.pem.as_bytes()).unwrap())
        .collect();
    move || SystemStore { certs }
}

fn write_ca(dir: &tempfile::TempDir, ca: &Ca) -> PathBuf {
    let path = dir.path().join("ca.pem");
    std::fs::write(&path, &ca.pem).unwrap();
    path
}

/// Two CAs: `private`, written to a CA file, and `public`, the one the
/// simulated platform store holds.
struct Trust {
    private: Ca,
    public: Ca,
    file: PathBuf,
    _dir: tempfile::TempDir,
}

impl Trust {
    fn new() -> Self {
        let private = ca("private");
        let dir = tempfile::tempdir().unwrap();
        let file = write_ca(&dir, &private);
        Self {
            private,
            public: ca("system"),
            file,
            _dir: dir,
        }
    }

    /// A worker configuration trusting the CA file (when `file`) and the
    /// simulated platform store holding `public` (when `system`).
    fn config(&self, file: bool, system: bool) -> rustls::ClientConfig {
        let mut b = ClientTlsBuilder::new(Peer::Worker);
        if file {
            b = b.ca_file(&self.file).unwrap();
        }
        if system {
            b.system_roots(true)
                .build_with(platform(&[&self.public]))
                .unwrap()
        } else {
            b.build_with(platform(&[])).unwrap()
        }
    }
}

#[test]
fn a_certificate_from_the_file_ca_is_accepted_with_the_file_and_refused_without_it() {
    let t = Trust::new();
    let with_file = t.config(true, false);
    assert_eq!(handshake(with_file, server(Some(&t.private))), Ok(()));
    // The same server, trust from the (simulated) platform store only.
    let without = t.config(false, true);
    let e = handshake(without, server(Some(&t.private))).unwrap_err();
    assert!(e.contains("UnknownIssuer"), "{e}");
    // A file CA beside system roots still works, and so does a system CA.
    assert_eq!(
        handshake(t.config(true, true), server(Some(&t.private))),
        Ok(())
    );
    assert_eq!(
        handshake(t.config(true, true), server(Some(&t.public))),
        Ok(())
    );
}

#[test]
fn system_roots_never_disable_verification() {
    let t = Trust::new();
    let e = handshake(t.config(true, true), server(None)).unwrap_err();
    assert!(
        e.contains("UnknownIssuer") || e.contains("invalid peer certificate"),
        "{e}"
    );
    // The real platform store (whatever this machine holds) does not anchor
    // a freshly generated self-signed certificate either.
    match ClientTlsBuilder::new(Peer::Worker)
        .system_roots(true)
        .build()
    {
        Ok(config) => assert!(handshake(config, server(None)).is_err()),
        Err(e) => assert_eq!(e.reason(), Reason::TlsSystemRoots),
    }
    // A certificate for another name, from a trusted CA, is refused.
    let e = handshake_as(
        t.config(true, false),
        "db.example",
        server(Some(&t.private)),
    )
    .unwrap_err();
    assert!(e.contains("not valid for name"), "{e}");
}

#[test]
fn configuration_errors_are_typed() {
    let dir = tempfile::tempdir().unwrap();
    let reason = |r: Result<ClientTlsBuilder, Error>| r.err().map(|e| (e.category(), e.reason()));
    let v = smolbox_core::Category::Validation;
    // Unreadable, empty, malformed CA: worker and PostgreSQL reasons.
    let missing = dir.path().join("missing.pem");
    assert_eq!(
        reason(ClientTlsBuilder::new(Peer::Worker).ca_file(&missing)),
        Some((v, Reason::TlsCaFile))
    );
    assert_eq!(
        reason(ClientTlsBuilder::new(Peer::Postgres).ca_file(&missing)),
        Some((v, Reason::PostgresCaFile))
    );
    assert_eq!(
        reason(ClientTlsBuilder::new(Peer::Worker).ca_pem(b"no certificate here")),
        Some((v, Reason::TlsCaFile))
    );
    assert_eq!(
        reason(ClientTlsBuilder::new(Peer::Postgres).ca_pem(b"")),
        Some((v, Reason::PostgresCa))
    );
    // The CA cap: N accepted, N + 1 refused with the limit.
    let mut at_cap = ca("cap").pem.into_bytes();
    at_cap.resize(MAX_CA_BYTES, b'\n');
    assert!(
        ClientTlsBuilder::new(Peer::Worker)
            .ca_pem(&at_cap)
            .unwrap()
            .has_trust()
    );
    let big = dir.path().join("big.pem");
    std::fs::write(&big, &at_cap).unwrap();
    assert!(ClientTlsBuilder::new(Peer::Worker).ca_file(&big).is_ok());
    at_cap.push(b'\n');
    std::fs::write(&big, &at_cap).unwrap();
    for e in [
        ClientTlsBuilder::new(Peer::Worker).ca_pem(&at_cap).err(),
        ClientTlsBuilder::new(Peer::Worker).ca_file(&big).err(),
    ] {
        let e = e.unwrap();
        assert_eq!(e.reason(), Reason::TlsCaFile);
        assert_eq!(e.limit().map(|l| l.max), Some(MAX_CA_BYTES as u64));
    }
    // No anchor at all.
    let e = ClientTlsBuilder::new(Peer::Worker)
        .build_with(platform(&[]))
        .unwrap_err();
    assert_eq!(
        (e.category(), e.reason()),
        (
            smolbox_core::Category::UnsupportedCapability,
            Reason::TlsRequiresCaFile
        )
    );
    // System roots asked for and the platform store is empty (or holds
    // only certificates rustls cannot use).
    let e = ClientTlsBuilder::new(Peer::Postgres)
        .system_roots(true)
        .build_with(|| SystemStore {
            certs: vec![CertificateDer::from(vec![0u8; 8])],
        })
        .unwrap_err();
    assert_eq!((e.category(), e.reason()), (v, Reason::TlsSystemRoots));
    // Client identity files.
    let cert = dir.path().join("client.pem");
    let key = dir.path().join("client.key");
    std::fs::write(&cert, "not a certificate").unwrap();
    assert_eq!(
        reason(ClientTlsBuilder::new(Peer::Worker).client_identity(&cert, &key)),
        Some((v, Reason::TlsClientCert))
    );
    let k = KeyPair::generate().unwrap();
    let c = CertificateParams::new(vec!["client".to_owned()])
        .unwrap()
        .self_signed(&k)
        .unwrap();
    std::fs::write(&cert, c.pem()).unwrap();
    assert_eq!(
        reason(ClientTlsBuilder::new(Peer::Worker).client_identity(&cert, &key)),
        Some((v, Reason::TlsClientKey))
    );
    // A key that is not the certificate's.
    std::fs::write(&key, KeyPair::generate().unwrap().serialize_pem()).unwrap();
    let e = ClientTlsBuilder::new(Peer::Worker)
        .ca_pem(ca("x").pem.as_bytes())
        .unwrap()
        .client_identity(&cert, &key)
        .unwrap()
        .build_with(platform(&[]))
        .unwrap_err();
    assert_eq!(e.reason(), Reason::TlsClientKey);
    // The server name.
    assert_eq!(
        server_name("not a name!").err().map(|e| e.reason()),
        Some(Reason::TlsServerName)
    );
    assert!(server_name("[::1]").is_ok());
}

#[test]
fn the_worker_configuration_offers_http11_and_debug_shows_no_material() {
    let private = ca("private");
    let dir = tempfile::tempdir().unwrap();
    let files = TlsFiles::ca(write_ca(&dir, &private));
    let config = ClientTlsBuilder::worker(&files).unwrap();
    assert_eq!(config.alpn_protocols, vec![b"http/1.1".to_vec()]);
    assert_eq!(handshake(config, server(Some(&private))), Ok(()));
    let b = ClientTlsBuilder::new(Peer::Worker)
        .ca_pem(private.pem.as_bytes())
        .unwrap();
    let shown = format!("{b:?}");
    assert!(
        shown.contains("ca_roots: 1") && !shown.contains("BEGIN"),
        "{shown}"
    );
    // Neither a file nor system roots.
    let e = ClientTlsBuilder::worker(&TlsFiles::default()).unwrap_err();
    assert_eq!(e.reason(), Reason::TlsRequiresCaFile);
}

#[test]
fn the_socket_plan_owns_what_the_endpoint_says() {
    use smolbox_core::Secret;
    use smolbox_core::worker::EndpointConfig;
    let endpoint = |config: EndpointConfig| Endpoint::new(config).unwrap();
    let tcp = endpoint(EndpointConfig {
        id: "w1".into(),
        base_url: "http://127.0.0.1:9000".into(),
        allow_insecure_loopback: true,
        ..EndpointConfig::default()
    });
    assert_eq!(
        SocketPlan::of(&tcp),
        Ok(SocketPlan::Tcp {
            host: "127.0.0.1".into(),
            port: 9000
        })
    );
    let unix = endpoint(EndpointConfig {
        id: "w1".into(),
        base_url: "http://localhost".into(),
        unix_socket: Some("/run/smolvm.sock".into()),
        allow_insecure_loopback: true,
        ..EndpointConfig::default()
    });
    assert_eq!(
        SocketPlan::of(&unix),
        Ok(SocketPlan::Unix("/run/smolvm.sock".into()))
    );
    let https = |ca_file: Option<PathBuf>, system_roots: bool| {
        endpoint(EndpointConfig {
            id: "w1".into(),
            base_url: "https://worker.example:8443".into(),
            token: Some(Secret::new("t0ken")),
            ca_file,
            system_roots,
            client_cert: Some("/k/client.pem".into()),
            client_key: Some("/k/client.key".into()),
            ..EndpointConfig::default()
        })
    };
    assert_eq!(
        SocketPlan::of(&https(Some("/k/ca.pem".into()), true)),
        Ok(SocketPlan::Tls {
            host: "worker.example".into(),
            port: 8443,
            files: TlsFiles {
                ca_file: Some("/k/ca.pem".into()),
                system_roots: true,
                client_identity: Some(("/k/client.pem".into(), "/k/client.key".into())),
            },
        })
    );
    // Neither a CA file nor system roots: the endpoint's refusal.
    let e = SocketPlan::of(&https(None, false)).unwrap_err();
    assert_eq!(e.reason(), Reason::TlsRequiresCaFile);
}

#[test]
fn a_target_checks_the_files_then_builds_the_plan() {
    use smolbox_core::worker::EndpointConfig;
    type T = Target<Arc<rustls::ClientConfig>>;
    let endpoint = |config: EndpointConfig| Endpoint::new(config).unwrap();
    let unix = endpoint(EndpointConfig {
        id: "w1".into(),
        base_url: "http://localhost".into(),
        unix_socket: Some("/run/smolvm.sock".into()),
        allow_insecure_loopback: true,
        ..EndpointConfig::default()
    });
    let t = T::of(&unix).unwrap();
    assert!(!t.is_tls());
    assert_eq!(format!("{t:?}"), "SocketTarget(unix /run/smolvm.sock)");
    // A CA file that does not exist: refused before any plan is built.
    let dir = tempfile::tempdir().unwrap();
    let https = endpoint(EndpointConfig {
        id: "w1".into(),
        base_url: "https://localhost:8443".into(),
        token: Some(smolbox_core::Secret::new("t0ken")),
        ca_file: Some(dir.path().join("missing.pem")),
        ..EndpointConfig::default()
    });
    let e = T::of(&https).unwrap_err();
    assert_eq!(e.category(), smolbox_core::Category::Validation);
    // The CA file present: a TLS target for the endpoint's host.
    let ca = ca("test CA");
    std::fs::write(dir.path().join("ca.pem"), &ca.pem).unwrap();
    let https = endpoint(EndpointConfig {
        id: "w1".into(),
        base_url: "https://localhost:8443".into(),
        token: Some(smolbox_core::Secret::new("t0ken")),
        ca_file: Some(dir.path().join("ca.pem")),
        ..EndpointConfig::default()
    });
    let t = T::of(&https).unwrap();
    assert!(t.is_tls());
    assert_eq!(format!("{t:?}"), "SocketTarget(tls localhost:8443)");
}
