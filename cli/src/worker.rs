//! Worker selection: `--worker URL|unix:PATH` (or `SMOLBOX_WORKER`), else
//! the devworker started in-process on loopback.

use std::time::Duration;

use smolbox_core::Secret;
use smolbox_core::worker::files::{MAX_DIRECTION_BUDGET, MAX_FILE_ALLOWANCE};
use smolbox_core::worker::{Budgets, Endpoint, EndpointConfig};
use smolbox_devworker::{BlockingDevWorker, DevWorker};

use crate::args::Global;
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
        return startdev(budgets);
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

fn startdev(budgets: Budgets) -> Result<Selected, Failure> {
    let dev = DevWorker::start_blocking(DevWorker::builder().version(DEV_VERSION).quiet(true))
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
        budgets,
        ..EndpointConfig::default()
    })?;
    Ok(Selected {
        endpoint,
        dev: Some(dev),
    })
}
