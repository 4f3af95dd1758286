//! Recovery after a crash, on the blocking shell. A first controller
//! process submits a durable command and is killed with SIGKILL once the
//! command has reached the worker. A second controller on the same store
//! recovers the record: the command may have run, nobody saw its exit, so
//! the record becomes `unknown` (evidence `dispatch_uncertain`) and the
//! command is **never sent again**. A record the crashed controller had
//! accepted but provably not sent would instead run, once.
//!
//! `cargo run -p smolbox-examples --example recovery_blocking`
#![allow(clippy::print_stdout)] // an example prints what it shows

use std::path::Path;
use std::sync::Arc;

use smolbox_blocking::{Client, Runtime};
use smolbox_core::exec::Command;
use smolbox_core::managed::RecordKey;
use smolbox_core::managed::controller::{RunTarget, Submit, spec_for};
use smolbox_core::worker::{MachineName, MachineSpec};
use smolbox_devworker::Route;
use smolbox_examples::Failure;
use smolbox_examples::crash::{self, ID, MACHINE, SCOPE, Scenario, WORKER};
use smolbox_store::keys::load_or_create_keys;
use smolbox_store::{Sealer, SqliteStore, Store};

fn open(db: &Path) -> Result<(Arc<dyn Store>, smolbox_core::managed::FingerprintKey), Failure> {
    let (fingerprint_key, encryption_key) = load_or_create_keys(db)?;
    let store = SqliteStore::open(db, Sealer::new(&encryption_key, "examples")?)?;
    Ok((Arc::new(store), fingerprint_key))
}

/// The first controller: submit and wait, until it is killed.
fn first_controller(child: crash::Child) -> Result<(), Failure> {
    let (store, fingerprint_key) = open(&child.db)?;
    let runtime = Runtime::builder(store, fingerprint_key)
        .worker(WORKER, Client::new(child.endpoint)?)
        .lease_ttl_ms(1_000) // its claim lapses a second after it dies
        .poll_interval_ms(100)
        .build()?;
    let command = Command::new(["sh", "-c", child.script.as_str()]).timeout_secs(120);
    let spec = spec_for(
        &command,
        &RunTarget::unverified().fitting(&command),
        WORKER,
        MACHINE,
    )?;
    runtime.run(Submit {
        key: RecordKey::new(SCOPE, ID)?,
        spec,
    })?;
    Ok(())
}

fn main() -> Result<(), Failure> {
    if let Some(child) = crash::child()? {
        return first_controller(child);
    }
    let scenario = Scenario::new()?;
    let client = Client::new(scenario.endpoint.clone())?;
    let profile = client.admit(&[])?;
    client.create(
        &profile,
        MachineName::new(MACHINE)?,
        &MachineSpec::default(),
    )?;
    // Open the store (creating its keys) before the first controller does.
    let (store, fingerprint_key) = open(&scenario.db)?;

    scenario.run_first_controller_and_kill_it()?;
    let key = RecordKey::new(SCOPE, ID)?;
    let before = store.fetch(&key)?;
    println!(
        "recovery: the first controller was killed with the record {:?}",
        before.state
    );

    // The second controller: its due scan finds the record whose claim
    // lapsed; `wait` returns once the record is settled.
    let runtime = Runtime::builder(store, fingerprint_key)
        .worker(WORKER, client)
        .lease_ttl_ms(1_000)
        .build()?;
    runtime.reconcile();
    let outcome = runtime.wait(&key, 60_000)?;
    println!(
        "recovery: the second controller recorded {:?} (evidence {:?}); the worker received {} exec(s)",
        outcome.record.state,
        outcome.record.evidence,
        scenario.worker.request_count(Route::Exec)
    );
    runtime.shutdown();
    scenario.release_the_orphan()?;
    Ok(())
}
