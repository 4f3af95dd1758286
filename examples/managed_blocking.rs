//! The managed runtime on the blocking shell: a durable command. `submit`
//! returns once the record is in the store (nothing is sent before that);
//! `wait` returns the recorded outcome; submitting the same id again
//! returns the same record and never runs the command a second time.
//!
//! `cargo run -p smolbox-examples --example managed_blocking`
#![allow(clippy::print_stdout)] // an example prints what it shows

use std::sync::Arc;

use smolbox_blocking::{Client, Runtime};
use smolbox_core::exec::Command;
use smolbox_core::managed::RecordKey;
use smolbox_core::managed::controller::{RunTarget, Submit, spec_for};
use smolbox_core::worker::{MachineName, MachineSpec};
use smolbox_devworker::Route;
use smolbox_examples::{Failure, local_worker};
use smolbox_store::keys::load_or_create_keys;
use smolbox_store::{Sealer, SqliteStore, Store};

fn main() -> Result<(), Failure> {
    let (worker, endpoint) = local_worker()?;
    let client = Client::new(endpoint)?;
    let profile = client.admit(&[])?;
    client.create(&profile, MachineName::new("demo")?, &MachineSpec::default())?;

    // The embedded store: one SQLite file; the keys beside it (created on
    // first use, 0600): one seals command text at rest, the other keys the
    // fingerprints that make resubmission idempotent.
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("smolbox.db");
    let (fingerprint_key, encryption_key) = load_or_create_keys(&db)?;
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(
        &db,
        Sealer::new(&encryption_key, "examples")?,
    )?);

    let runtime = Runtime::builder(store, fingerprint_key)
        .worker("local", client)
        .build()?;

    let command = Command::new(["sh", "-c", "echo built; exit 3"]).timeout_secs(60);
    let target = RunTarget::unverified().fitting(&command);
    let submit = || -> Result<Submit, Failure> {
        Ok(Submit {
            key: RecordKey::new("examples", "build-42")?,
            spec: spec_for(&command, &target, "local", "demo")?,
        })
    };

    let accepted = runtime.submit(submit()?)?;
    println!(
        "managed: accepted {} (existing: {})",
        accepted.key.id, accepted.existing
    );
    let outcome = runtime.wait(&accepted.key, 60_000)?;
    println!(
        "managed: state {:?}, exit {:?}, stdout {:?}",
        outcome.record.state,
        outcome.exit_code(),
        outcome
            .output
            .as_ref()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim_end().to_owned())
    );

    // The same id and the same command: the recorded outcome, not a rerun.
    let again = runtime.submit(submit()?)?;
    let outcome = runtime.wait(&again.key, 60_000)?;
    println!(
        "managed: again: existing {}, state {:?}, exit {:?}; the worker ran it {} time(s)",
        again.existing,
        outcome.record.state,
        outcome.exit_code(),
        worker.request_count(Route::Exec)
    );
    runtime.shutdown();
    Ok(())
}
