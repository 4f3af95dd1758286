//! TLS client configuration: `smolbox_tls::ClientTlsBuilder::worker`, the
//! one builder both shells and the PostgreSQL store use.
//!
//! Peer and hostname verification are always on: there is no setting that
//! turns them off (features AC-1.1.2). Trust comes from the CA file and,
//! only when asked (`TlsFiles::system_roots`), the platform's roots beside
//! it; a client certificate and key make the connection mutual TLS.
//! Verification is rustls' WebPKI verifier, unchanged. The only ALPN
//! protocol offered is `http/1.1` (the WebSocket upgrade needs HTTP/1.1, and
//! the worker's mTLS listener also offers `h2`).

use std::sync::Arc;

use rustls::pki_types::ServerName;
use smolbox_core::Error;

/// Files that configure TLS (one definition, in `smolbox-tls`, shared with
/// the tokio shell).
pub use smolbox_tls::TlsFiles;

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
    /// Reads the PEM files (and the platform store when asked) and builds
    /// the configuration. Performs file I/O only (no network).
    ///
    /// # Errors
    /// `validation` (operation `config`) when a file cannot be read or
    /// parsed, the host is not a valid server name, or rustls refuses the
    /// key (`smolbox_tls::ClientTlsBuilder` lists the reasons).
    pub(crate) fn new(host: &str, files: &TlsFiles) -> Result<Self, Error> {
        let config = smolbox_tls::ClientTlsBuilder::worker(files)?;
        Ok(Self {
            config: Arc::new(config),
            server_name: smolbox_tls::server_name(host)?,
        })
    }
}
