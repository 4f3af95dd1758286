//! A devworker started for one case, and endpoints that reach it over TCP,
//! mutual TLS or a Unix socket.

use std::time::Duration;

use smolbox_core::Secret;
use smolbox_core::worker::{Budgets, Endpoint, EndpointConfig};
use smolbox_devworker::{BlockingDevWorker, DevWorker};

use crate::shell::Shell;

/// The bearer token every fixture requires: a sentinel that must never
/// appear in an error's `Debug` or `Display`.
pub const TOKEN_SENTINEL: &str = "SENTINEL-TOKEN-5f3a9c";

/// The worker version the fixture impersonates (terminals need ≥ 1.17.0).
pub const WORKER_VERSION: &str = "1.22.0";

/// How the client reaches the worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// Plain HTTP on loopback (insecure loopback allowed).
    Tcp,
    /// HTTPS with a client certificate (the worker's listener is mutual).
    Tls,
    /// The worker's Unix socket.
    Unix,
}

/// A running devworker for one case.
#[derive(Debug)]
pub struct Fixture {
    /// The worker (fault switchboard, request counts).
    pub worker: BlockingDevWorker,
    /// The transport the endpoints use.
    pub transport: Transport,
    _dir: tempfile::TempDir,
}

impl Fixture {
    /// Starts a devworker for `transport`.
    ///
    /// # Panics
    /// When the devworker cannot start (the case cannot run).
    pub fn start(transport: Transport) -> Self {
        Self::start_version(transport, WORKER_VERSION)
    }

    /// Starts a devworker impersonating `version` (`1.9.2` or `1.22.0`).
    ///
    /// # Panics
    /// When the devworker cannot start (the case cannot run).
    pub fn start_version(transport: Transport, version: &str) -> Self {
        #[allow(clippy::unwrap_used)] // a fixture that cannot start fails the test
        let dir = tempfile::Builder::new()
            .prefix("sbx")
            .tempdir_in("/tmp")
            .unwrap();
        let socket = dir.path().join("w.sock");
        let builder = DevWorker::builder()
            .version(version)
            .token(Some(TOKEN_SENTINEL))
            .tls(transport == Transport::Tls)
            .unix_socket((transport == Transport::Unix).then_some(socket))
            .quiet(true);
        #[allow(clippy::unwrap_used)]
        let worker = DevWorker::start_blocking(builder).unwrap();
        Self {
            worker,
            transport,
            _dir: dir,
        }
    }

    /// Budgets small enough for fast tests (operation 10 s, idle 5 s).
    pub fn budgets() -> Budgets {
        Budgets {
            operation: Duration::from_secs(10),
            receive_idle: Duration::from_secs(5),
            ..Budgets::default()
        }
    }

    /// An endpoint with `budgets` over the fixture's transport.
    ///
    /// # Panics
    /// When the endpoint is refused (a bug in the fixture).
    pub fn endpoint(&self, budgets: Budgets) -> Endpoint {
        let mut config = EndpointConfig {
            id: "dev".into(),
            token: Some(Secret::new(TOKEN_SENTINEL)),
            budgets,
            ..EndpointConfig::default()
        };
        match self.transport {
            Transport::Tcp => {
                config.base_url = self.worker.base_url();
                config.allow_insecure_loopback = true;
            }
            Transport::Unix => {
                config.base_url = "http://localhost".into();
                config.unix_socket = self
                    .worker
                    .unix_path()
                    .map(|p| p.to_string_lossy().into_owned());
            }
            Transport::Tls => {
                #[allow(clippy::unwrap_used)]
                let files = self.worker.tls_files().unwrap();
                config.base_url = format!(
                    "https://{}:{}",
                    files.server_name,
                    self.worker.addr().port()
                );
                config.ca_file = Some(files.ca_pem);
                config.client_cert = Some(files.client_cert_pem);
                config.client_key = Some(files.client_key_pem);
            }
        }
        #[allow(clippy::unwrap_used)]
        Endpoint::new(config).unwrap()
    }

    /// A client with the test budgets.
    ///
    /// # Panics
    /// When the client is refused.
    pub fn shell<S: Shell>(&self) -> S {
        self.shell_with(Self::budgets())
    }

    /// A client with `budgets`.
    ///
    /// # Panics
    /// When the client is refused.
    pub fn shell_with<S: Shell>(&self, budgets: Budgets) -> S {
        #[allow(clippy::unwrap_used)]
        S::connect(self.endpoint(budgets)).unwrap()
    }
}
