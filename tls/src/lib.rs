//! smolbox's one TLS client configuration builder (rustls, ring provider).
//!
//! Both shells' worker connections (`smolbox-tokio`, `smolbox-blocking`)
//! and the PostgreSQL store's connector (`smolbox-store`) build their
//! `rustls::ClientConfig` here, so the trust rules are written once:
//!
//! - peer and host-name verification are always on: rustls' WebPKI
//!   verifier, unchanged; there is no setting that turns it off (features
//!   AC-1.1.2);
//! - trust comes from a CA bundle (a PEM file or bytes, at most
//!   [`MAX_CA_BYTES`]) and, **optionally and beside it**, from the
//!   platform's trust store ([`ClientTlsBuilder::system_roots`], read with
//!   `rustls-native-certs`). System roots add anchors; they never replace
//!   verification, so a self-signed or otherwise unanchored certificate is
//!   still refused;
//! - a configuration with no trust anchor at all is refused (never "trust
//!   anything");
//! - safe default protocol versions (TLS 1.2 and 1.3) only.
//!
//! Errors are `validation` (operation `config`) with a reason chosen by the
//! [`Peer`] the configuration is for, so the worker's and the store's
//! existing reasons stay what their callers and documents say.
//!
//! Beside the builder, what both shells need to connect and no socket
//! does: [`SocketPlan`] (the endpoint's plan as owned values), [`Target`]
//! (that plan with the configuration built, in the shell's connector type)
//! and [`unix_socket_facts`] (what `stat` says about a Unix socket, for
//! core's check). The `testkit` feature adds the shells' test PKI.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use smolbox_core::worker::{ConnectPlan, Endpoint};
use smolbox_core::{Error, Operation, Reason};

pub use rustls;
pub use target::{Target, unix_socket_facts};

mod target;
#[cfg(feature = "testkit")]
pub mod testkit;

/// Largest CA bundle accepted (PEM bytes): far above any real bundle, small
/// enough that a wrong path (a disk image, a log) is refused, not read.
pub const MAX_CA_BYTES: usize = 1 << 20;

/// Files that configure a worker's TLS: the CA that signs the worker's
/// certificate, whether the platform's trust store is added beside it, and,
/// for mutual TLS (the worker's network listener is mutual), the client's
/// certificate chain and private key (PEM).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM file with the CA certificate(s) the worker's chain may lead to.
    pub ca_file: Option<PathBuf>,
    /// Also trust the platform's trust store (beside `ca_file`; at least one
    /// of the two is needed).
    pub system_roots: bool,
    /// PEM client certificate chain and PEM private key, for mutual TLS.
    pub client_identity: Option<(PathBuf, PathBuf)>,
}

/// How a shell connects to a worker endpoint, with the TLS files in the
/// form [`ClientTlsBuilder::worker`] takes: the endpoint's
/// [`ConnectPlan`] turned into owned values, the same for both shells.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SocketPlan {
    /// A Unix domain socket.
    Unix(PathBuf),
    /// Plain TCP (loopback only, validated by the endpoint).
    Tcp {
        /// Host name or IP literal (no brackets).
        host: String,
        /// Port.
        port: u16,
    },
    /// TLS over TCP, verified as `files` say (and against `host`).
    Tls {
        /// Host name or IP literal (no brackets); also the server name.
        host: String,
        /// Port.
        port: u16,
        /// The trust and the client identity.
        files: TlsFiles,
    },
}

impl SocketPlan {
    /// The plan for `endpoint` ([`Endpoint::connect_plan`]).
    ///
    /// # Errors
    /// The endpoint's (`unsupported_capability` / `tls_requires_ca_file`
    /// for HTTPS with neither a CA file nor system roots);
    /// `unsupported_capability` (`transport_not_supported`) for a plan
    /// this build does not know.
    pub fn of(endpoint: &Endpoint) -> Result<Self, Error> {
        match endpoint.connect_plan()? {
            ConnectPlan::Unix(path) => Ok(Self::Unix(path.to_path_buf())),
            ConnectPlan::Tcp { host, port } => Ok(Self::Tcp {
                host: host.to_owned(),
                port,
            }),
            ConnectPlan::Tls {
                host,
                port,
                ca_file,
                system_roots,
                client_identity,
            } => Ok(Self::Tls {
                host: host.to_owned(),
                port,
                files: TlsFiles {
                    ca_file: ca_file.map(Path::to_path_buf),
                    system_roots,
                    client_identity: client_identity
                        .map(|(c, k)| (c.to_path_buf(), k.to_path_buf())),
                },
            }),
            // A plan this build does not know cannot be connected.
            _ => Err(Error::unsupported_capability(
                Operation::Config,
                Reason::TransportNotSupported,
            )),
        }
    }
}

impl TlsFiles {
    /// Trust exactly this CA file (no system roots, no client identity).
    pub fn ca(path: impl Into<PathBuf>) -> Self {
        Self {
            ca_file: Some(path.into()),
            ..Self::default()
        }
    }
}

/// Whom the configuration is for; it selects the error reasons.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Peer {
    /// A worker (`tls_ca_file`, `tls_client_cert`, `tls_client_key`,
    /// `tls_provider`, `tls_requires_ca_file`).
    Worker,
    /// A PostgreSQL server (`postgres_ca`, `postgres_ca_file`,
    /// `postgres_tls`).
    Postgres,
}

/// What went wrong, before it becomes a [`Reason`] for a [`Peer`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    CaPem,
    CaFile,
    ClientCert,
    ClientKey,
    Provider,
    SystemRoots,
    NoRoots,
}

impl Peer {
    fn error(self, fault: Fault) -> Error {
        let reason = match (self, fault) {
            (Self::Worker, Fault::CaPem | Fault::CaFile) => Reason::TlsCaFile,
            (Self::Postgres, Fault::CaPem | Fault::NoRoots) => Reason::PostgresCa,
            (Self::Postgres, Fault::CaFile) => Reason::PostgresCaFile,
            (_, Fault::ClientCert) => Reason::TlsClientCert,
            (_, Fault::ClientKey) => Reason::TlsClientKey,
            (Self::Worker, Fault::Provider) => Reason::TlsProvider,
            (Self::Postgres, Fault::Provider) => Reason::PostgresTls,
            (_, Fault::SystemRoots) => Reason::TlsSystemRoots,
            (Self::Worker, Fault::NoRoots) => {
                return Error::unsupported_capability(Operation::Config, Reason::TlsRequiresCaFile);
            }
        };
        Error::validation(Operation::Config, reason)
    }
}

/// The platform trust store as `rustls-native-certs` reads it: the
/// certificates that loaded.
struct SystemStore {
    certs: Vec<CertificateDer<'static>>,
}

fn load_platform_store() -> SystemStore {
    // A partly unreadable store (one bad file in a directory) still gives
    // the certificates that did load; an empty result is refused in
    // `build` instead.
    SystemStore {
        certs: rustls_native_certs::load_native_certs().certs,
    }
}

/// Builds a verified rustls client configuration; see the crate docs.
pub struct ClientTlsBuilder {
    peer: Peer,
    roots: RootCertStore,
    system_roots: bool,
    identity: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
    alpn: Vec<Vec<u8>>,
}

impl Clone for ClientTlsBuilder {
    fn clone(&self) -> Self {
        Self {
            peer: self.peer,
            roots: self.roots.clone(),
            system_roots: self.system_roots,
            identity: self
                .identity
                .as_ref()
                .map(|(chain, key)| (chain.clone(), key.clone_key())),
            alpn: self.alpn.clone(),
        }
    }
}

impl core::fmt::Debug for ClientTlsBuilder {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ClientTlsBuilder")
            .field("peer", &self.peer)
            .field("ca_roots", &self.roots.len())
            .field("system_roots", &self.system_roots)
            .field("client_identity", &self.identity.is_some())
            .finish_non_exhaustive()
    }
}

impl ClientTlsBuilder {
    /// No trust anchor yet, no client identity, no ALPN.
    pub fn new(peer: Peer) -> Self {
        Self {
            peer,
            roots: RootCertStore::empty(),
            system_roots: false,
            identity: None,
            alpn: Vec::new(),
        }
    }

    /// The worker configuration of `files`: its CA file, system roots if
    /// asked, its client identity, ALPN `http/1.1` only (the WebSocket
    /// upgrade needs HTTP/1.1; the worker's mTLS listener also offers `h2`).
    ///
    /// # Errors
    /// As [`ClientTlsBuilder::ca_file`], [`ClientTlsBuilder::client_identity`]
    /// and [`ClientTlsBuilder::build`] with [`Peer::Worker`].
    pub fn worker(files: &TlsFiles) -> Result<rustls::ClientConfig, Error> {
        let mut b = Self::new(Peer::Worker).system_roots(files.system_roots);
        if let Some(ca) = &files.ca_file {
            b = b.ca_file(ca)?;
        }
        if let Some((cert, key)) = &files.client_identity {
            b = b.client_identity(cert, key)?;
        }
        b.alpn(&[b"http/1.1"]).build()
    }

    /// Trust the certificates of this PEM bundle.
    ///
    /// # Errors
    /// `validation` (`tls_ca_file` for a worker, `postgres_ca` for
    /// PostgreSQL) when the bundle is larger than [`MAX_CA_BYTES`], holds no
    /// certificate, or a certificate is malformed.
    pub fn ca_pem(mut self, pem: &[u8]) -> Result<Self, Error> {
        let bad = || self.peer.error(Fault::CaPem);
        if pem.len() > MAX_CA_BYTES {
            return Err(bad().with_limit(pem.len() as u64, MAX_CA_BYTES as u64));
        }
        let mut added = 0usize;
        for cert in CertificateDer::pem_slice_iter(pem) {
            self.roots
                .add(cert.map_err(|_| bad())?)
                .map_err(|_| bad())?;
            added += 1;
        }
        if added == 0 {
            return Err(bad());
        }
        Ok(self)
    }

    /// [`ClientTlsBuilder::ca_pem`] with the bundle read from a file.
    ///
    /// # Errors
    /// `validation` (`tls_ca_file` / `postgres_ca_file`) when the file
    /// cannot be read or is larger than [`MAX_CA_BYTES`]; then as
    /// [`ClientTlsBuilder::ca_pem`] (its reason for bad contents).
    pub fn ca_file(self, path: &Path) -> Result<Self, Error> {
        let bad = || self.peer.error(Fault::CaFile);
        let len = std::fs::metadata(path).map_err(|_| bad())?.len();
        if len > MAX_CA_BYTES as u64 {
            return Err(bad().with_limit(len, MAX_CA_BYTES as u64));
        }
        let pem = std::fs::read(path).map_err(|_| bad())?;
        if pem.len() > MAX_CA_BYTES {
            // The file grew between the two reads.
            return Err(bad().with_limit(pem.len() as u64, MAX_CA_BYTES as u64));
        }
        self.ca_pem(&pem)
    }

    /// Also trust the platform's trust store (read when
    /// [`ClientTlsBuilder::build`] runs). Verification stays on: this only
    /// adds anchors.
    #[must_use]
    pub fn system_roots(mut self, on: bool) -> Self {
        self.system_roots = on;
        self
    }

    /// Present this PEM certificate chain and private key (mutual TLS).
    ///
    /// # Errors
    /// `validation` `tls_client_cert` (unreadable or empty chain) or
    /// `tls_client_key` (unreadable key); a key that does not fit the
    /// certificate is `tls_client_key` from [`ClientTlsBuilder::build`].
    pub fn client_identity(mut self, cert: &Path, key: &Path) -> Result<Self, Error> {
        let chain = CertificateDer::pem_file_iter(cert)
            .map_err(|_| self.peer.error(Fault::ClientCert))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| self.peer.error(Fault::ClientCert))?;
        if chain.is_empty() {
            return Err(self.peer.error(Fault::ClientCert));
        }
        let key =
            PrivateKeyDer::from_pem_file(key).map_err(|_| self.peer.error(Fault::ClientKey))?;
        self.identity = Some((chain, key));
        Ok(self)
    }

    /// Whether any trust anchor is configured or asked for (a CA bundle or
    /// the system roots).
    pub fn has_trust(&self) -> bool {
        !self.roots.is_empty() || self.system_roots
    }

    /// The ALPN protocols to offer, in order.
    #[must_use]
    pub fn alpn(mut self, protocols: &[&[u8]]) -> Self {
        self.alpn = protocols.iter().map(|p| p.to_vec()).collect();
        self
    }

    /// The configuration.
    ///
    /// # Errors
    /// `validation` `tls_system_roots` when system roots were asked for and
    /// the platform store gave no usable certificate; no anchor at all is
    /// `unsupported_capability` `tls_requires_ca_file` for a worker
    /// (`validation` `postgres_ca` for PostgreSQL); `tls_provider` /
    /// `postgres_tls` when the provider refuses the protocol versions;
    /// `tls_client_key` when the key does not fit the certificate.
    pub fn build(self) -> Result<rustls::ClientConfig, Error> {
        self.build_with(load_platform_store)
    }

    fn build_with(
        mut self,
        platform: impl FnOnce() -> SystemStore,
    ) -> Result<rustls::ClientConfig, Error> {
        let peer = self.peer;
        if self.system_roots {
            let (added, _ignored) = self.roots.add_parsable_certificates(platform().certs);
            if added == 0 {
                return Err(peer.error(Fault::SystemRoots));
            }
        }
        if self.roots.is_empty() {
            return Err(peer.error(Fault::NoRoots));
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|_| peer.error(Fault::Provider))?
            .with_root_certificates(self.roots);
        let mut config = match self.identity {
            None => builder.with_no_client_auth(),
            Some((chain, key)) => builder
                .with_client_auth_cert(chain, key)
                .map_err(|_| peer.error(Fault::ClientKey))?,
        };
        config.alpn_protocols = self.alpn;
        Ok(config)
    }
}

/// The TLS server name to verify for `host` (brackets of an IPv6 literal
/// removed).
///
/// # Errors
/// `validation` (`config`, `tls_server_name`) when the host is not a DNS
/// name or IP address.
pub fn server_name(host: &str) -> Result<ServerName<'static>, Error> {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    ServerName::try_from(bare.to_owned())
        .map_err(|_| Error::validation(Operation::Config, Reason::TlsServerName))
}

#[cfg(test)]
mod tests;
