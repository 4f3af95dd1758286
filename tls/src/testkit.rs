//! A throwaway PKI for TLS tests (feature `testkit`; never in a production
//! build): a CA, a server certificate for the given names and a client
//! certificate, written as PEM files into a temporary directory, and the
//! rustls server configuration a loopback peer presents. Both shells'
//! transport tests use it.

#![allow(clippy::unwrap_used, clippy::missing_panics_doc)] // test support

use std::path::PathBuf;
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::TlsFiles;

/// A CA, a server certificate and a client certificate (PEM), the files
/// `ca.pem`, `server.pem`, `server.key`, `client.pem` and `client.key` in
/// [`Pki::path`]'s directory (removed on drop).
pub struct Pki {
    dir: tempfile::TempDir,
    /// The CA certificate.
    pub ca_pem: String,
    /// The server certificate (signed by the CA).
    pub server_cert_pem: String,
    /// The server's private key.
    pub server_key_pem: String,
    /// The client certificate (signed by the CA).
    pub client_cert_pem: String,
    /// The client's private key.
    pub client_key_pem: String,
}

impl std::fmt::Debug for Pki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pki")
            .field("dir", &self.dir.path())
            .finish_non_exhaustive()
    }
}

impl Pki {
    /// A CA, a server certificate for `names`, and a client certificate.
    pub fn new(names: &[&str]) -> Self {
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_cert = ca_params.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca_params, ca_key);

        let server_key = KeyPair::generate().unwrap();
        let server_params =
            CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>())
                .unwrap();
        let server_cert = server_params.signed_by(&server_key, &issuer).unwrap();

        let client_key = KeyPair::generate().unwrap();
        let client_params = CertificateParams::new(vec!["client".to_owned()]).unwrap();
        let client_cert = client_params.signed_by(&client_key, &issuer).unwrap();

        let pki = Self {
            dir: tempfile::tempdir().unwrap(),
            ca_pem: ca_cert.pem(),
            server_cert_pem: server_cert.pem(),
            server_key_pem: server_key.serialize_pem(),
            client_cert_pem: client_cert.pem(),
            client_key_pem: client_key.serialize_pem(),
        };
        for (name, text) in [
            ("ca.pem", &pki.ca_pem),
            ("server.pem", &pki.server_cert_pem),
            ("server.key", &pki.server_key_pem),
            ("client.pem", &pki.client_cert_pem),
            ("client.key", &pki.client_key_pem),
        ] {
            std::fs::write(pki.path(name), text).unwrap();
        }
        pki
    }

    /// A file in the PKI's directory.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The client certificate and key files (mutual TLS).
    pub fn client_identity(&self) -> (PathBuf, PathBuf) {
        (self.path("client.pem"), self.path("client.key"))
    }

    /// Client files: this CA, with or without the client identity.
    pub fn client_files(&self, with_identity: bool) -> TlsFiles {
        TlsFiles {
            ca_file: Some(self.path("ca.pem")),
            system_roots: false,
            client_identity: with_identity.then(|| self.client_identity()),
        }
    }

    /// The server's rustls configuration (ALPN `h2`, `http/1.1`, as the
    /// worker's listener offers); `require_client` makes it mutual TLS.
    pub fn server_config(&self, require_client: bool) -> Arc<rustls::ServerConfig> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .unwrap();
        let builder = if require_client {
            let mut roots = rustls::RootCertStore::empty();
            roots
                .add(CertificateDer::from_pem_slice(self.ca_pem.as_bytes()).unwrap())
                .unwrap();
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .unwrap();
            builder.with_client_cert_verifier(verifier)
        } else {
            builder.with_no_client_auth()
        };
        let chain = vec![CertificateDer::from_pem_slice(self.server_cert_pem.as_bytes()).unwrap()];
        let key = PrivateKeyDer::from_pem_slice(self.server_key_pem.as_bytes()).unwrap();
        let mut config = builder.with_single_cert(chain, key).unwrap();
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Arc::new(config)
    }
}

/// The (directory mode, socket mode, reason) cases a connect to a Unix
/// socket refuses before anything is sent: others could replace or write
/// the socket (core's `check_unix_socket` on [`crate::unix_socket_facts`]).
pub const REFUSED_SOCKET_MODES: [(u32, u32, smolbox_core::Reason); 4] = [
    (
        0o777,
        0o755,
        smolbox_core::Reason::SocketDirWritableByOthers,
    ),
    (
        0o1777,
        0o755,
        smolbox_core::Reason::SocketDirWritableByOthers,
    ),
    (
        0o770,
        0o755,
        smolbox_core::Reason::SocketDirWritableByOthers,
    ),
    (0o700, 0o777, smolbox_core::Reason::SocketWritableByOthers),
];

/// A listening Unix socket `w.sock` in a fresh directory whose modes a
/// test sets, and a regular file `f` beside it.
#[derive(Debug)]
pub struct SocketDir {
    dir: tempfile::TempDir,
    _listener: std::os::unix::net::UnixListener,
}

impl SocketDir {
    /// The directory, the listening socket and the regular file.
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let listener = std::os::unix::net::UnixListener::bind(dir.path().join("w.sock")).unwrap();
        std::fs::write(dir.path().join("f"), b"").unwrap();
        Self {
            dir,
            _listener: listener,
        }
    }

    /// The socket's path.
    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("w.sock")
    }

    /// A regular file beside the socket (not a socket).
    pub fn regular_file(&self) -> PathBuf {
        self.dir.path().join("f")
    }

    /// Sets the directory's and the socket's permission bits.
    pub fn set_modes(&self, dir_mode: u32, socket_mode: u32) {
        use std::os::unix::fs::PermissionsExt;
        let set = |p: &std::path::Path, mode| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        set(self.dir.path(), dir_mode);
        set(&self.socket(), socket_mode);
    }
}

impl Default for SocketDir {
    fn default() -> Self {
        Self::new()
    }
}
