//! A controller process for the SIGKILL restart test (`tests/tests/
//! managed_kill.rs`): opens the SQLite store at `DB` (keys next to it),
//! builds a blocking `Runtime` with a 1 s claim TTL and the devworker at
//! `URL` (bearer `TOKEN`) as worker `dev`, submits `sh -c SCRIPT` under
//! record `suite/ID` on machine `m1` and waits. The test kills it with
//! SIGKILL at a durable step.
//!
//! With a sixth argument `retained`, the worker gets its admitted profile,
//! the process creates and starts retained machine `boxes/kill` and submits
//! the command into its slot under `boxes/ID` instead.
//!
//! Usage: `managed-ctl DB URL TOKEN ID SCRIPT [retained]`.

use std::sync::Arc;
use std::time::Duration;

use smolbox_core::Secret;
use smolbox_core::exec::Command;
use smolbox_core::managed::controller::{RunTarget, Submit, spec_for};
use smolbox_core::managed::{RecordKey, RetainedMachineSpec};
use smolbox_core::worker::{Budgets, Endpoint, EndpointConfig};
use smolbox_store::keys::load_or_create_keys;
use smolbox_store::{Sealer, SqliteStore, Store};

fn main() -> Result<(), smolbox_core::Error> {
    let args: Vec<String> = std::env::args().collect();
    let (db, url, token, id, script, retained) = match args.as_slice() {
        [_, db, url, token, id, script] => (db, url, token, id, script, false),
        [_, db, url, token, id, script, mode] if mode == "retained" => {
            (db, url, token, id, script, true)
        }
        _ => {
            eprintln!("usage: managed-ctl DB URL TOKEN ID SCRIPT [retained]");
            std::process::exit(2);
        }
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
    let command = Command::new(["sh", "-c", script.as_str()]).timeout_secs(60);
    if retained {
        let profile = client.admit(&[])?;
        let runtime = smolbox_blocking::Runtime::builder(store, key)
            .worker_with_profile("dev", client, profile)
            .lease_ttl_ms(1_000)
            .poll_interval_ms(100)
            .build()?;
        let target = RunTarget::unverified().fitting(&command);
        let spec = RetainedMachineSpec {
            artifact: target.artifact,
            profile: target.profile,
            ports: Vec::new(),
            workload: None,
            checkpointable: false,
            network: None,
            guest_paths: None,
        };
        let machine = RecordKey::new("boxes", "kill")?;
        let m = runtime.machines();
        m.create(&machine, &spec)?;
        let rec = m.wait(&machine, 30_000)?;
        m.start(&machine, rec.version)?;
        m.wait(&machine, 30_000)?;
        let key = RecordKey::new("boxes", id)?;
        m.submit(&machine, &key, &command)?;
        runtime.wait(&key, 60_000)?;
        return Ok(());
    }
    let runtime = smolbox_blocking::Runtime::builder(store, key)
        .worker("dev", client)
        .lease_ttl_ms(1_000)
        .poll_interval_ms(100)
        .build()?;
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
