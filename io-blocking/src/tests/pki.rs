//! A throwaway PKI for TLS tests: a CA, a server certificate for
//! `127.0.0.1`/`localhost`, a client certificate, all written as PEM files.

use std::path::PathBuf;
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::TlsFiles;

pub(crate) struct Pki {
    pub(crate) dir: tempfile::TempDir,
    pub(crate) ca_pem: String,
    pub(crate) server_cert_pem: String,
    pub(crate) server_key_pem: String,
    pub(crate) client_cert_pem: String,
    pub(crate) client_key_pem: String,
}

impl Pki {
    /// A CA, a server certificate for `names`, and a client certificate.
    pub(crate) fn new(names: &[&str]) -> Self {
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

        let dir = tempfile::tempdir().unwrap();
        let pki = Self {
            dir,
            ca_pem: ca_cert.pem(),
            server_cert_pem: server_cert.pem(),
            server_key_pem: server_key.serialize_pem(),
            client_cert_pem: client_cert.pem(),
            client_key_pem: client_key.serialize_pem(),
        };
        std::fs::write(pki.path("ca.pem"), &pki.ca_pem).unwrap();
        std::fs::write(pki.path("client.pem"), &pki.client_cert_pem).unwrap();
        std::fs::write(pki.path("client.key"), &pki.client_key_pem).unwrap();
        pki
    }

    pub(crate) fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Client files: this CA, with or without the client identity.
    pub(crate) fn client_files(&self, with_identity: bool) -> TlsFiles {
        TlsFiles {
            ca_file: Some(self.path("ca.pem")),
            system_roots: false,
            client_identity: with_identity
                .then(|| (self.path("client.pem"), self.path("client.key"))),
        }
    }

    /// A rustls server config; `require_client` makes it mutual TLS.
    pub(crate) fn server_config(&self, require_client: bool) -> Arc<rustls::ServerConfig> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
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
