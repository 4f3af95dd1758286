//! Recovery after a crash, on the tokio shell. A first controller process
//! submits a durable command and is killed with SIGKILL once the command
//! has reached the worker. A second controller on the same store recovers
//! the record: the command may have run, nobody saw its exit, so the record
//! becomes `unknown` (evidence `dispatch_uncertain`) and the command is
//! **never sent again**. A record the crashed controller had accepted but
//! provably not sent would instead run, once.
//!
//! `cargo run -p smolbox-examples --example recovery_tokio`
#![allow(clippy::print_stdout)] // an example prints what it shows

use std::path::Path;
use std::sync::Arc;

use smolbox_core::exec::Command;
use smolbox_core::managed::controller::{RunTarget, Submit, spec_for};
use smolbox_core::managed::{FingerprintKey, RecordKey};
use smolbox_core::worker::{MachineName, MachineSpec};
use smolbox_devworker::Route;
use smolbox_examples::Failure;
use smolbox_examples::crash::{self, ID, MACHINE, SCOPE, Scenario, WORKER};
use smolbox_store::keys::load_or_create_keys;
use smolbox_store::{Sealer, SqliteStore, Store};
use smolbox_tokio::{Client, Runtime};

fn open(db: &Path) -> Result<(Arc<dyn Store>, FingerprintKey), Failure> {
    let (fingerprint_key, encryption_key) = load_or_create_keys(db)?;
    let store = SqliteStore::open(db, Sealer::new(&encryption_key, "examples")?)?;
    Ok((Arc::new(store), fingerprint_key))
}

/// The first controller: submit and wait, until it is killed.
async fn first_controller(child: crash::Child) -> Result<(), Failure> {
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
    runtime
        .run(Submit {
            key: RecordKey::new(SCOPE, ID)?,
            spec,
        })
        .await?;
    Ok(())
}

fn main() -> Result<(), Failure> {
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    if let Some(child) = crash::child()? {
        return tokio.block_on(first_controller(child));
    }
    // The devworker has a runtime of its own; start it outside ours.
    let scenario = Scenario::new()?;
    tokio.block_on(async {
        let client = Client::new(scenario.endpoint.clone())?;
        let profile = client.admit(&[]).await?;
        client
            .create(&profile, MachineName::new(MACHINE)?, &MachineSpec::default())
            .await?;
        // Open the store (creating its keys) before the first controller does.
        let (store, fingerprint_key) = open(&scenario.db)?;

        // Killing the child blocks on the child process: off the runtime.
        tokio::task::block_in_place(|| scenario.run_first_controller_and_kill_it())?;
        let key = RecordKey::new(SCOPE, ID)?;
        let before = store.fetch(&key)?;
        println!("recovery: the first controller was killed with the record {:?}", before.state);

        let runtime = Runtime::builder(store, fingerprint_key)
            .worker(WORKER, client)
            .lease_ttl_ms(1_000)
            .build()?;
        runtime.reconcile();
        let outcome = runtime.wait(&key, 60_000).await?;
        println!(
            "recovery: the second controller recorded {:?} (evidence {:?}); the worker received {} exec(s)",
            outcome.record.state,
            outcome.record.evidence,
            scenario.worker.request_count(Route::Exec)
        );
        runtime.shutdown().await;
        scenario.release_the_orphan()?;
        Ok(())
    })
}
