//! Where a shell connects: the endpoint's [`SocketPlan`] with the TLS
//! configuration built, and what `stat` says about a Unix socket. Both
//! shells hold a [`Target`] inside their `SocketTarget` and differ only in
//! the TLS connector type they wrap the one client configuration in
//! (`tokio_rustls::TlsConnector`, or the `Arc<ClientConfig>` a
//! `rustls::ClientConnection` is made from).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::ClientConfig;
use rustls::pki_types::ServerName;
use smolbox_core::Error;
use smolbox_core::worker::{Endpoint, SocketFileFacts};

use crate::{ClientTlsBuilder, SocketPlan, TlsFiles, server_name};

/// Where to connect. Built once per client (reading the TLS files then), so
/// connecting does no file I/O. `C` is the shell's TLS connector, made from
/// [`ClientTlsBuilder::worker`]'s configuration.
#[derive(Clone)]
pub enum Target<C> {
    /// Plain TCP (loopback only, validated by the endpoint and again on
    /// the resolved addresses).
    Tcp {
        /// Host name or IP literal.
        host: String,
        /// Port.
        port: u16,
    },
    /// TLS over TCP.
    Tls {
        /// Host name or IP literal.
        host: String,
        /// Port.
        port: u16,
        /// The name the certificate is verified against.
        name: ServerName<'static>,
        /// The shell's connector over the one client configuration.
        connector: C,
    },
    /// A Unix domain socket.
    Unix {
        /// Its path.
        path: PathBuf,
    },
}

impl<C> std::fmt::Debug for Target<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Tcp { host, port } => write!(f, "SocketTarget(tcp {host}:{port})"),
            Self::Tls { host, port, .. } => write!(f, "SocketTarget(tls {host}:{port})"),
            Self::Unix { path } => write!(f, "SocketTarget(unix {})", path.display()),
        }
    }
}

impl<C: From<Arc<ClientConfig>>> Target<C> {
    /// The target of `endpoint`: its TLS files must be regular files, then
    /// the plan ([`SocketPlan::of`]) is built (the TLS files read).
    ///
    /// # Errors
    /// `validation` (operation `config`) when a file is missing, not a
    /// regular file, or cannot be parsed; as [`SocketPlan::of`].
    pub fn of(endpoint: &Endpoint) -> Result<Self, Error> {
        endpoint.check_files(Path::is_file)?;
        match SocketPlan::of(endpoint)? {
            SocketPlan::Unix(path) => Ok(Self::unix(path)),
            SocketPlan::Tcp { host, port } => Ok(Self::tcp(host, port)),
            SocketPlan::Tls { host, port, files } => Self::tls(host, port, &files),
        }
    }

    /// Plain TCP. The caller (endpoint validation) is responsible for only
    /// asking for this on loopback with insecure loopback allowed.
    pub fn tcp(host: impl Into<String>, port: u16) -> Self {
        Self::Tcp {
            host: host.into(),
            port,
        }
    }

    /// A Unix domain socket.
    pub fn unix(path: impl Into<PathBuf>) -> Self {
        Self::Unix { path: path.into() }
    }

    /// TLS over TCP, verifying the chain against `files.ca_file` (and the
    /// platform's roots when `files.system_roots`) and the certificate
    /// against `host`; presents the client identity when given. The
    /// configuration is [`ClientTlsBuilder::worker`]'s.
    ///
    /// # Errors
    /// `validation` (operation `config`) when a file cannot be read or
    /// parsed, or the host is not a valid server name.
    pub fn tls(host: impl Into<String>, port: u16, files: &TlsFiles) -> Result<Self, Error> {
        let host = host.into();
        let config = ClientTlsBuilder::worker(files)?;
        let name = server_name(&host)?;
        Ok(Self::Tls {
            host,
            port,
            name,
            connector: C::from(Arc::new(config)),
        })
    }
}

impl<C> Target<C> {
    /// True for TLS targets (WebSocket URLs use `wss`).
    pub fn is_tls(&self) -> bool {
        matches!(self, Self::Tls { .. })
    }
}

/// What `stat` says about a Unix socket path and its parent directory
/// (the decision is core's
/// [`check_unix_socket`](smolbox_core::worker::check_unix_socket)).
///
/// # Errors
/// The `stat` failure of the socket or its directory.
pub fn unix_socket_facts(path: &Path) -> io::Result<SocketFileFacts> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let socket = std::fs::metadata(path)?;
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let dir = std::fs::metadata(dir)?;
    Ok(SocketFileFacts {
        socket_mode: socket.mode() & 0o7777,
        is_socket: socket.file_type().is_socket(),
        socket_uid: socket.uid(),
        dir_mode: dir.mode() & 0o7777,
        dir_uid: dir.uid(),
    })
}
