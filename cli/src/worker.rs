//! Worker selection: `--worker URL|unix:PATH` (or `SMOLBOX_WORKER`), else
//! the background devworker of `smolbox dev up` (see [`crate::dev`]), else
//! a devworker started in-process on loopback behind a random token.

use std::time::Duration;

use smolbox_core::Secret;
use smolbox_core::worker::files::{MAX_DIRECTION_BUDGET, MAX_FILE_ALLOWANCE};
use smolbox_core::worker::{Budgets, Endpoint, EndpointConfig, MachineSpec, Source};
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
    /// The worker id the command's records name (C12.2). Each in-process
    /// devworker is a worker of its own (`local-<pid>-<random>`), so two
    /// `smolbox` processes sharing one store never take each other's
    /// records for their own; the `dev up` worker and a named worker get
    /// an id derived from their address ([`named_worker_id`]), so records
    /// of two different workers never share an id.
    pub(crate) worker_id: String,
    /// The local devworker (in-process or `smolbox dev up`): its machines
    /// are image machines by default ([`DEV_IMAGE`]).
    pub(crate) local: bool,
}

/// The image reference of the machines smolbox creates on the local
/// devworker when `--image` is not given. The devworker reports it as the
/// machine's `image` and pulls nothing.
pub(crate) const DEV_IMAGE: &str = "alpine:3.19";

/// `--image`, or [`DEV_IMAGE`] on the local devworker; set once by `main`.
static MACHINE_IMAGE: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Sets the image of the machines this process creates (once; `main`).
pub(crate) fn set_machine_image(explicit: Option<&str>, selected: &Selected) {
    let image = explicit
        .filter(|i| !i.is_empty())
        .map(str::to_owned)
        .or_else(|| selected.local.then(|| DEV_IMAGE.to_owned()));
    if let Some(image) = image {
        let _ = MACHINE_IMAGE.set(image);
    }
}

/// What the machines this process creates (raw and managed) are made
/// from: an OCI image ([`set_machine_image`]), so terminals, extended
/// commands and large or out-of-root files can run on them (C5.4, C6.1,
/// C7.4); `None`: imageless.
pub(crate) fn machine_source() -> Option<Source> {
    MACHINE_IMAGE.get().map(|reference| Source::Oci {
        reference: reference.clone(),
    })
}

/// `base` made from [`machine_source`] when there is one.
pub(crate) fn machine_spec(base: MachineSpec) -> MachineSpec {
    match machine_source() {
        Some(source) => MachineSpec { source, ..base },
        None => base,
    }
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
        system_roots: global.system_roots,
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
    let worker_id = named_worker_id(&config.base_url, config.unix_socket.as_deref());
    Ok(Selected {
        endpoint: Endpoint::new(config)?,
        dev: None,
        worker_id,
        local: false,
    })
}

/// Whether the command would use a worker that outlives it: one named
/// (--worker, `SMOLBOX_WORKER`), or the running `smolbox dev up` devworker.
/// Nothing is started.
pub(crate) fn persistent_available(global: &Global) -> Result<bool, Failure> {
    if global.worker.as_deref().is_some_and(|w| !w.is_empty()) {
        return Ok(true);
    }
    Ok(matches!(
        dev::state(&DevPaths::for_user()?)?,
        DevState::Running(_)
    ))
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
                worker_id: named_worker_id(
                    "http://localhost",
                    Some(&r.paths.sock.to_string_lossy()),
                ),
                local: true,
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
    // A fresh random suffix (never derived from the token).
    let nonce = dev::random_token()?;
    Ok(Selected {
        endpoint,
        dev: Some(dev),
        worker_id: format!("local-{}-{}", std::process::id(), &nonce[..12]),
        local: true,
    })
}

/// The worker id of a worker named by its address: `w-` and the first 16
/// hex digits of SHA-256 over the base URL and the Unix socket path. Two
/// addresses never share an id by accident; the same address always gets
/// the same one (so a later `smolbox` finds its records).
pub(crate) fn named_worker_id(base_url: &str, unix_socket: Option<&str>) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(base_url.as_bytes());
    h.update([0]);
    h.update(unix_socket.unwrap_or("").as_bytes());
    let d = h.finalize();
    let hex: String = d[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("w-{hex}")
}

#[cfg(test)]
mod tests {
    use super::named_worker_id;

    #[test]
    fn named_worker_ids_are_stable_distinct_and_valid() {
        let a = named_worker_id("http://127.0.0.1:1000", None);
        assert_eq!(a, named_worker_id("http://127.0.0.1:1000", None));
        assert_ne!(a, named_worker_id("http://127.0.0.1:1001", None));
        assert_ne!(
            named_worker_id("http://localhost", Some("/a.sock")),
            named_worker_id("http://localhost", Some("/b.sock"))
        );
        // The URL/socket boundary is not ambiguous.
        assert_ne!(
            named_worker_id("http://localhost/a", Some("b")),
            named_worker_id("http://localhost/", Some("ab"))
        );
        assert!(smolbox_core::managed::check_worker_id(&a).is_ok());
        assert_eq!(a.len(), 18);
    }
}
