//! What every example shares: a local devworker to run against, and the
//! endpoint that reaches it.
//!
//! The devworker is smolbox's stand-in for `smolvm serve`: it runs commands
//! **on this host, without isolation**. Against a real worker, build the
//! [`EndpointConfig`] from its URL, its bearer token and (for `https://`)
//! its CA and client certificate instead; nothing else in the examples
//! changes.

use std::time::Duration;

use smolbox_core::Secret;
use smolbox_core::worker::{Budgets, Endpoint, EndpointConfig};
use smolbox_devworker::{BlockingDevWorker, DevWorker};

/// The examples' error type: anything, reported by `main`.
pub type Failure = Box<dyn std::error::Error + Send + Sync>;

/// A devworker on 127.0.0.1 behind a fresh random token, and an endpoint
/// for it. Keep the worker alive while you use the endpoint; dropping it
/// stops every process it started.
///
/// # Errors
/// When the devworker cannot start or the endpoint is refused.
pub fn local_worker() -> Result<(BlockingDevWorker, Endpoint), Failure> {
    let token = random_token()?;
    let worker = DevWorker::start_blocking(
        DevWorker::builder()
            .version("1.22.0")
            .token(Some(&token))
            .quiet(true),
    )?;
    let endpoint = endpoint(&worker.base_url(), &token)?;
    Ok((worker, endpoint))
}

/// The endpoint of a worker at `base_url` with bearer `token`.
///
/// `allow_insecure_loopback` permits plain HTTP, and only to a loopback
/// address; a remote worker needs `https://` with `ca_file` (and a client
/// certificate when it asks for one).
///
/// # Errors
/// When the configuration is refused (bad URL, budgets out of range).
pub fn endpoint(base_url: &str, token: &str) -> Result<Endpoint, Failure> {
    Ok(Endpoint::new(EndpointConfig {
        id: "local".into(),
        base_url: base_url.into(),
        token: Some(Secret::new(token)),
        allow_insecure_loopback: true,
        budgets: Budgets {
            operation: Duration::from_secs(30),
            receive_idle: Duration::from_secs(30),
            ..Budgets::default()
        },
        ..EndpointConfig::default()
    })?)
}

/// 32 random bytes as hex.
///
/// # Errors
/// When the system has no randomness.
pub fn random_token() -> Result<String, Failure> {
    let mut b = [0u8; 32];
    getrandom::getrandom(&mut b).map_err(|e| format!("no randomness: {e}"))?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// The process plumbing of the recovery examples: a controller process
/// that is killed with SIGKILL once its command has reached the worker.
pub mod crash {
    use std::path::PathBuf;
    use std::process::Command as Process;
    use std::time::Duration;

    use smolbox_core::worker::Endpoint;
    use smolbox_devworker::{BlockingDevWorker, DevWorker};

    use super::{Failure, endpoint, random_token};

    /// The record both controllers use.
    pub const SCOPE: &str = "examples";
    /// The record id.
    pub const ID: &str = "deploy-7";
    /// The machine.
    pub const MACHINE: &str = "demo";
    /// The worker id both controllers give the worker.
    pub const WORKER: &str = "local";

    /// What the first controller process is given on its command line.
    #[derive(Debug)]
    pub struct Child {
        /// The SQLite store.
        pub db: PathBuf,
        /// The worker.
        pub endpoint: Endpoint,
        /// `sh -c` script of the command.
        pub script: String,
    }

    /// `Some` when this process is the controller that will be killed
    /// (`EXAMPLE --controller DB URL TOKEN SCRIPT`).
    ///
    /// # Errors
    /// A malformed command line or endpoint.
    pub fn child() -> Result<Option<Child>, Failure> {
        let args: Vec<String> = std::env::args().collect();
        match args.as_slice() {
            [_, flag, db, url, token, script] if flag == "--controller" => Ok(Some(Child {
                db: db.into(),
                endpoint: endpoint(url, token)?,
                script: script.clone(),
            })),
            [_] => Ok(None),
            _ => Err("usage: EXAMPLE [--controller DB URL TOKEN SCRIPT]".into()),
        }
    }

    /// A devworker, a store path and the files the command uses.
    #[derive(Debug)]
    pub struct Scenario {
        /// The devworker (running commands on this host).
        pub worker: BlockingDevWorker,
        /// Its endpoint.
        pub endpoint: Endpoint,
        /// The SQLite store both controllers share.
        pub db: PathBuf,
        token: String,
        marker: PathBuf,
        gate: PathBuf,
        _dir: tempfile::TempDir,
    }

    impl Scenario {
        /// Starts the devworker.
        ///
        /// # Errors
        /// When it cannot start.
        pub fn new() -> Result<Self, Failure> {
            let token = random_token()?;
            let worker = DevWorker::start_blocking(
                DevWorker::builder()
                    .version("1.22.0")
                    .token(Some(&token))
                    .quiet(true),
            )?;
            let endpoint = endpoint(&worker.base_url(), &token)?;
            let dir = tempfile::tempdir()?;
            Ok(Self {
                worker,
                endpoint,
                db: dir.path().join("smolbox.db"),
                token,
                marker: dir.path().join("started"),
                gate: dir.path().join("gate"),
                _dir: dir,
            })
        }

        /// Starts this program again as the first controller, waits
        /// (bounded) until its command has started on the worker, then
        /// kills it with SIGKILL: a controller crash after dispatch.
        ///
        /// # Errors
        /// When the child cannot start or the command never starts.
        pub fn run_first_controller_and_kill_it(&self) -> Result<(), Failure> {
            let script = format!(
                "echo started > '{}'; while [ ! -e '{}' ]; do sleep 0.02; done; echo finished",
                self.marker.display(),
                self.gate.display()
            );
            let mut child = Process::new(std::env::current_exe()?)
                .arg("--controller")
                .arg(&self.db)
                .arg(self.worker.base_url())
                .arg(&self.token)
                .arg(script)
                .spawn()?;
            let mut started = false;
            for _ in 0..3_000 {
                if self.marker.exists() {
                    started = true;
                    break;
                }
                if child.try_wait()?.is_some() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            child.kill()?; // SIGKILL: no shutdown, no cleanup
            child.wait()?;
            if started {
                Ok(())
            } else {
                Err("the first controller's command never started".into())
            }
        }

        /// Lets the orphaned command finish (it is still running on the
        /// worker: nobody can observe its exit any more).
        ///
        /// # Errors
        /// When the gate file cannot be written.
        pub fn release_the_orphan(&self) -> Result<(), Failure> {
            std::fs::write(&self.gate, b"")?;
            Ok(())
        }
    }
}
