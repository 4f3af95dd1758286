//! A controller process for the SIGKILL restart test (`tests/tests/
//! managed_kill.rs`): opens the SQLite store at `DB` (keys next to it),
//! builds a blocking `Runtime` with a 1 s claim TTL and the devworker at
//! `URL` (bearer `TOKEN`) as worker `dev`, submits `sh -c SCRIPT` under
//! record `suite/ID` on machine `m1` and waits. The test kills it with
//! SIGKILL at a durable step.
//!
//! Usage: `managed-ctl DB URL TOKEN ID SCRIPT`.

use std::sync::Arc;
use std::time::Duration;

use smolbox_core::Secret;
use smolbox_core::exec::Command;
use smolbox_core::managed::RecordKey;
use smolbox_core::managed::controller::{RunTarget, Submit, spec_for};
use smolbox_core::worker::{Budgets, Endpoint, EndpointConfig};
use smolbox_store::keys::load_or_create_keys;
use smolbox_store::{Sealer, SqliteStore, Store};

fn main() -> Result<(), smolbox_core::Error> {
    let args: Vec<String> = std::env::args().collect();
    let [_, db, url, token, id, script] = args.as_slice() else {
        eprintln!("usage: managed-ctl DB URL TOKEN ID SCRIPT");
        std::process::exit(2);
    };
    let db = std::path::Path::new(db);
    let (key, seal) = load_or_create_keys(db)?;
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(db, Sealer::new(&seal, "managed")?)?);
    let endpoint = Endpoint::new(EndpointConfig {
        id: "dev".into(),
        base_url: url.clone(),
        token: Some(Secret::new(token.as_str())),
        allow_insecure_loopback: true,
        budgets: Budgets {
            operation: Duration::from_secs(60),
            receive_idle: Duration::from_secs(60),
            ..Budgets::default()
        },
        ..EndpointConfig::default()
    })?;
    let client = smolbox_blocking::Client::new(endpoint)?;
    let runtime = smolbox_blocking::Runtime::builder(store, key)
        .worker("dev", client)
        .lease_ttl_ms(1_000)
        .poll_interval_ms(100)
        .build()?;
    let command = Command::new(["sh", "-c", script.as_str()]).timeout_secs(60);
    let spec = spec_for(
        &command,
        &RunTarget::unverified().fitting(&command),
        "dev",
        "m1",
    )?;
    let key = RecordKey::new("suite", id)?;
    runtime.run(Submit { key, spec })?;
    Ok(())
}
