//! The durable record of `run`: a buffered run goes through the managed
//! runtime (DESIGN.md §5a) over the embedded SQLite store — the record is
//! accepted, its `dispatching` intent made durable before the command is
//! sent, its claim renewed while the command runs, and the observed exit
//! (or `unknown`) stored afterwards. Each process is its own controller
//! (a unique owner id), so two `smolbox` processes fence each other.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use smolbox_core::exec::Command;
use smolbox_core::managed::RecordKey;
use smolbox_core::managed::controller::{Outcome, RunTarget, Submit, spec_for};
use smolbox_store::keys::load_or_create_keys;
use smolbox_store::{Sealer, SqliteStore, Store};

use crate::backend::Backend;
use crate::report::{self, Failure};

/// Scope of the records the command writes (and the sealing partition).
const SCOPE: &str = "cli";

/// Where the store lives: `explicit`, else `$XDG_DATA_HOME/smolbox`, else
/// `$HOME/.local/share/smolbox`, as `smolbox.db`.
pub(crate) fn store_path(explicit: Option<&Path>) -> Result<PathBuf, Failure> {
    if let Some(p) = explicit {
        return Ok(p.to_path_buf());
    }
    let base = std::env::var_os("XDG_DATA_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))
        .ok_or_else(|| {
            Failure::local(
                "find a data directory (set HOME or --store)",
                &std::io::Error::from(std::io::ErrorKind::NotFound),
            )
        })?;
    Ok(base.join("smolbox").join("smolbox.db"))
}

/// Runs `cmd` on `machine` under a fresh record `id`, recorded in the
/// SQLite store at `db`.
pub(crate) fn run_recorded(
    b: &Backend,
    db: &Path,
    worker: &str,
    machine: &str,
    id: &str,
    cmd: &Command,
) -> Result<Outcome, Failure> {
    if let Some(dir) = db.parent() {
        create_private_dir(dir)?;
    }
    report::note(&format!(
        "recording this execution in the embedded SQLite store at {}",
        db.display()
    ));
    let (fingerprint_key, encryption_key) = load_or_create_keys(db)?;
    let store: Arc<dyn Store> =
        Arc::new(SqliteStore::open(db, Sealer::new(&encryption_key, SCOPE)?)?);
    let key = RecordKey::new(SCOPE, id)?;
    let spec = spec_for(cmd, &RunTarget::unverified().fitting(cmd), worker, machine)?;
    let submit = Submit { key, spec };
    let outcome = match b {
        Backend::Tokio { rt, client } => rt.block_on(async {
            let runtime = smolbox_tokio::Runtime::builder(store, fingerprint_key)
                .worker(worker, client.clone())
                .build()?;
            let out = runtime.run(submit).await;
            runtime.shutdown().await;
            out
        })?,
        Backend::Blocking(client) => {
            let runtime = smolbox_blocking::Runtime::builder(store, fingerprint_key)
                .worker(worker, client.clone())
                .build()?;
            let out = runtime.run(submit);
            runtime.shutdown();
            out?
        }
    };
    Ok(outcome)
}

fn create_private_dir(dir: &Path) -> Result<(), Failure> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| Failure::local(format!("create {}", dir.display()), &e))
}
