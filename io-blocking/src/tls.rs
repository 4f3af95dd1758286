//! TLS client configuration (rustls, ring provider).
//!
//! Peer and hostname verification are always on: there is no setting that
//! turns them off (features AC-1.1.2). Trust comes from a CA file when one is
//! configured; a client certificate and key make the connection mutual TLS.
//! The only ALPN protocol offered is `http/1.1` (the WebSocket upgrade needs
//! HTTP/1.1, and the worker's mTLS listener also offers `h2`).

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use smolbox_core::{Error, Operation};

/// Where TLS trust and the client identity come from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM file of the certificate authorities that may sign the worker's
    /// certificate. Without it the connection trusts nothing and every
    /// handshake fails verification.
    pub ca_file: Option<std::path::PathBuf>,
    /// PEM client certificate chain and PEM private key, for mutual TLS.
    pub client_identity: Option<(std::path::PathBuf, std::path::PathBuf)>,
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
        let mut roots = rustls::RootCertStore::empty();
        if let Some(ca) = &files.ca_file {
            for cert in read_certs(ca)? {
                roots
                    .add(cert)
                    .map_err(|_| Error::validation(Operation::Config, "tls_ca_invalid"))?;
            }
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|_| Error::validation(Operation::Config, "tls_protocol_versions"))?
            .with_root_certificates(roots);
        let mut config = match &files.client_identity {
            Some((cert, key)) => {
                let chain = read_certs(cert)?;
                let key = PrivateKeyDer::from_pem_file(key).map_err(|_| {
                    Error::validation(Operation::Config, "tls_client_key_unreadable")
                })?;
                builder.with_client_auth_cert(chain, key).map_err(|_| {
                    Error::validation(Operation::Config, "tls_client_identity_invalid")
                })?
            }
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let server_name = ServerName::try_from(host.to_owned())
            .map_err(|_| Error::validation(Operation::Config, "tls_server_name_invalid"))?;
        Ok(Self {
            config: Arc::new(config),
            server_name,
        })
    }
}

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, Error> {
    let certs: Vec<_> = CertificateDer::pem_file_iter(path)
        .map_err(|_| Error::validation(Operation::Config, "tls_pem_unreadable"))?
        .collect::<Result<_, _>>()
        .map_err(|_| Error::validation(Operation::Config, "tls_pem_invalid"))?;
    if certs.is_empty() {
        return Err(Error::validation(Operation::Config, "tls_pem_empty"));
    }
    Ok(certs)
}
