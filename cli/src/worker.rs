//! Worker selection: `--worker URL|unix:PATH` (or `SMOLBOX_WORKER`), else
//! the background devworker of `smolbox dev up` (see [`crate::dev`]), else
//! a devworker started in-process on loopback behind a random token.

use std::time::Duration;

use smolbox_core::Secret;
use smolbox_core::worker::files::{MAX_DIRECTION_BUDGET, MAX_FILE_ALLOWANCE};
use smolbox_core::worker::{Budgets, Endpoint, EndpointConfig};
use smolbox_devworker::{BlockingDevWorker, DevWorker};

use crate::args::Global;
use crate::dev::{self, DevPaths, DevState};
use crate::report::{self, Failure};

/// The version the in-process devworker impersonates (the later profile,
/// so console logs and large files are available).
const DEV_VERSION: &str = "1.22.0";

/// The worker the command talks to, and the devworker kept alive for it.
pub(crate) struct Selected {
    /// The endpoint.
    pub(crate) endpoint: Endpoint,
    /// The in-process devworker, when one was started (dropped last).
    pub(crate) dev: Option<BlockingDevWorker>,
}

/// Budgets the command runs under. `command_secs` is the longest guest
/// command timeout the command will ask for: the operation deadline and the
/// receive-idle bound leave room for it.
pub(crate) fn budgets(command_secs: Option<u32>) -> Budgets {
    let base = Budgets::default();
    let needed = Duration::from_secs(u64::from(command_secs.unwrap_or(0)) + 15);
    let operation = base.operation.max(needed);
    Budgets {
        operation,
        receive_idle: base.receive_idle.max(needed),
        max_request_body: MAX_FILE_ALLOWANCE,
        max_response_bytes: MAX_DIRECTION_BUDGET.min(Budgets::MAX_RESPONSE_BYTES),
        ..base
    }
}

/// Resolves the worker from the global options.
pub(crate) fn select(global: &Global, budgets: Budgets) -> Result<Selected, Failure> {
    let token = global.token.as_deref().map(Secret::new);
    let Some(worker) = global.worker.as_deref().filter(|w| !w.is_empty()) else {
        return local(budgets);
    };
    let mut config = EndpointConfig {
        id: "cli".into(),
        token,
        ca_file: global.ca.clone(),
        client_cert: global.cert.clone(),
        client_key: global.key.clone(),
        budgets,
        ..EndpointConfig::default()
    };
    if let Some(path) = worker.strip_prefix("unix:") {
        config.base_url = "http://localhost".into();
        config.unix_socket = Some(path.to_owned());
    } else {
        // Plain http is accepted by the core on loopback only; naming such
        // a URL is the opt-in.
        config.allow_insecure_loopback = worker.starts_with("http://");
        config.base_url = worker.to_owned();
    }
    Ok(Selected {
        endpoint: Endpoint::new(config)?,
        dev: None,
    })
}

/// No worker named: the background devworker when `dev up` started one,
/// else one in-process for this command.
fn local(budgets: Budgets) -> Result<Selected, Failure> {
    let paths = DevPaths::for_user()?;
    match dev::state(&paths)? {
        DevState::Running(r) => {
            report::note(&format!(
                "no worker configured (--worker or SMOLBOX_WORKER): using the local devworker \
                 of `smolbox dev up` (pid {}, unix:{}); it runs commands on this host WITHOUT \
                 isolation",
                r.pid,
                r.paths.sock.display()
            ));
            let endpoint = Endpoint::new(EndpointConfig {
                id: "devworker".into(),
                base_url: "http://localhost".into(),
                unix_socket: Some(r.paths.sock.to_string_lossy().into_owned()),
                token: Some(Secret::new(r.token()?)),
                budgets,
                ..EndpointConfig::default()
            })?;
            return Ok(Selected {
                endpoint,
                dev: None,
            });
        }
        DevState::Stale(pid) => report::note(&format!(
            "the local devworker of `smolbox dev up` is not running (stale pid file: pid {pid} \
             is gone; `smolbox dev up` starts it again)"
        )),
        DevState::Absent => {}
    }
    startdev(budgets)
}

/// A devworker in-process on loopback for this command only. It requires
/// a random token, so another local user (or a web page) cannot drive it
/// while it lives.
fn startdev(budgets: Budgets) -> Result<Selected, Failure> {
    let token = dev::random_token()?;
    let dev = DevWorker::start_blocking(
        DevWorker::builder()
            .version(DEV_VERSION)
            .token(Some(&token))
            .quiet(true),
    )
    .map_err(|e| Failure::local("start the in-process devworker", &e))?;
    report::note(&format!(
        "no worker configured (--worker or SMOLBOX_WORKER): started the local devworker \
         in-process at {}; it runs commands on this host WITHOUT isolation",
        dev.base_url()
    ));
    let endpoint = Endpoint::new(EndpointConfig {
        id: "devworker".into(),
        base_url: dev.base_url(),
        allow_insecure_loopback: true,
        token: Some(Secret::new(token)),
        budgets,
        ..EndpointConfig::default()
    })?;
    Ok(Selected {
        endpoint,
        dev: Some(dev),
    })
}
