//! TLS client configuration (rustls, ring provider).
//!
//! Peer and hostname verification are always on: there is no setting that
//! turns them off (features AC-1.1.2). Trust comes from the CA file only (no
//! system roots are consulted); a client certificate and key make the
//! connection mutual TLS. Verification is rustls' WebPKI verifier, unchanged.
//! The only ALPN protocol offered is `http/1.1` (the WebSocket upgrade needs
//! HTTP/1.1, and the worker's mTLS listener also offers `h2`).

use smolbox_core::Reason;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use smolbox_core::{Error, Operation};

/// Files that configure TLS: the CA that signs the worker's certificate and,
/// for mutual TLS (the worker's network listener is mutual), the client's
/// certificate chain and private key (PEM).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM file with the CA certificate(s) the worker's chain must lead to.
    pub ca_file: PathBuf,
    /// PEM client certificate chain and PEM private key, for mutual TLS.
    pub client_identity: Option<(PathBuf, PathBuf)>,
}

/// A ready rustls client configuration plus the server name to verify.
#[derive(Clone)]
pub(crate) struct TlsSetup {
    pub(crate) config: Arc<rustls::ClientConfig>,
    pub(crate) server_name: ServerName<'static>,
}

impl std::fmt::Debug for TlsSetup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsSetup")
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

impl TlsSetup {
    /// Reads the PEM files and builds the configuration. Performs file I/O
    /// only (no network).
    ///
    /// # Errors
    /// `validation` (operation `config`) when a file cannot be read or
    /// parsed, the host is not a valid server name, or rustls refuses the
    /// key.
    pub(crate) fn new(host: &str, files: &TlsFiles) -> Result<Self, Error> {
        let bad = |reason| Error::validation(Operation::Config, reason);
        let mut roots = rustls::RootCertStore::empty();
        for cert in read_certs(&files.ca_file).map_err(|()| bad(Reason::TlsCaFile))? {
            roots.add(cert).map_err(|_| bad(Reason::TlsCaFile))?;
        }
        if roots.is_empty() {
            return Err(bad(Reason::TlsCaFile));
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|_| bad(Reason::TlsProvider))?
            .with_root_certificates(roots);
        let mut config = match &files.client_identity {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => {
                let chain = read_certs(cert).map_err(|()| bad(Reason::TlsClientCert))?;
                if chain.is_empty() {
                    return Err(bad(Reason::TlsClientCert));
                }
                let key =
                    PrivateKeyDer::from_pem_file(key).map_err(|_| bad(Reason::TlsClientKey))?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|_| bad(Reason::TlsClientKey))?
            }
        };
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let server_name =
            ServerName::try_from(bare.to_owned()).map_err(|_| bad(Reason::TlsServerName))?;
        Ok(Self {
            config: Arc::new(config),
            server_name,
        })
    }
}

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, ()> {
    CertificateDer::pem_file_iter(path)
        .map_err(|_| ())?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| ())
}
