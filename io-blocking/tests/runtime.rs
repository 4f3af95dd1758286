#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

//! The blocking managed runtime against the devworker and a `SqliteStore`
//! in a temp dir: completed runs, an uncertain dispatch, a crash after the
//! intent, and the sentinel rule for the database files.

use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use smolbox_blocking::runtime::{apply_op, key_file, load_or_create_keys};
use smolbox_blocking::{Client, Runtime};
use smolbox_core::exec::Command;
use smolbox_core::managed::run::{Run, RunConfig, RunTarget};
use smolbox_core::managed::{ExecState, FingerprintKey, RecordEvidence, RecordKey};
use smolbox_core::worker::{Budgets, Endpoint, EndpointConfig, MachineName, MachineSpec};
use smolbox_core::{Category, Evidence};
use smolbox_devworker::{BlockingDevWorker, DevWorker};
use smolbox_devworker::{Fault, Route};
use smolbox_store::{Sealer, SqliteStore, Store};

const SENTINEL: &str = "SENTINEL-RUNTIME-7c41b2";

struct Setup {
    worker: BlockingDevWorker,
    dir: tempfile::TempDir,
    store: Arc<SqliteStore>,
    fingerprint_key: FingerprintKey,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let worker =
        DevWorker::start_blocking(DevWorker::builder().version("1.22.0").quiet(true)).unwrap();
    let db = dir.path().join("smolbox.db");
    let (fingerprint_key, encryption_key) = load_or_create_keys(&db).unwrap();
    let sealer = Sealer::new(&encryption_key, "runs").unwrap();
    let store = Arc::new(SqliteStore::open(&db, sealer).unwrap());
    let s = Setup {
        worker,
        dir,
        store,
        fingerprint_key,
    };
    let client = s.client();
    let profile = client.admit(&[]).unwrap();
    client
        .create(
            &profile,
            MachineName::new("m1").unwrap(),
            &MachineSpec::default(),
        )
        .unwrap();
    s
}

impl Setup {
    fn client(&self) -> Client {
        let config = EndpointConfig {
            id: "dev".into(),
            base_url: self.worker.base_url(),
            allow_insecure_loopback: true,
            budgets: Budgets {
                operation: Duration::from_secs(10),
                receive_idle: Duration::from_secs(5),
                ..Budgets::default()
            },
            ..EndpointConfig::default()
        };
        Client::new(Endpoint::new(config).unwrap()).unwrap()
    }

    fn runtime(&self, owner: &str) -> Runtime {
        let store: Arc<dyn Store> = self.store.clone();
        Runtime::new(self.client(), store, self.fingerprint_key.clone(), owner).unwrap()
    }

    /// Every byte of every file in the temp dir (database, WAL, keys).
    fn all_bytes(&self) -> Vec<u8> {
        let mut all = Vec::new();
        for entry in std::fs::read_dir(self.dir.path()).unwrap() {
            all.extend(std::fs::read(entry.unwrap().path()).unwrap());
        }
        all
    }
}

fn contains(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

fn sentinel_command() -> Command {
    Command::new(["/bin/sh", "-c", "printf out; exit 3", SENTINEL]).env("SECRET", SENTINEL)
}

fn key(id: &str) -> RecordKey {
    RecordKey::new("cli", id).unwrap()
}

#[test]
fn a_run_records_completed_with_the_exit_code_and_no_clear_payload() {
    let s = setup();
    let rt = s.runtime("ctl-1");
    let out = rt.run("m1", &sentinel_command(), &key("r1")).unwrap();
    assert_eq!(out.record.state, ExecState::Completed);
    assert_eq!(out.record.evidence, RecordEvidence::Exited);
    assert_eq!(out.exit_code(), Some(3));
    assert_eq!(out.output.as_ref().unwrap().stdout, b"out");
    assert!(out.dispatched);
    assert_eq!(s.store.fetch(&key("r1")).unwrap(), out.record);
    assert_eq!(s.worker.request_count(Route::Exec), 1);

    // The same key again returns the stored record and sends nothing.
    let again = rt.run("m1", &sentinel_command(), &key("r1")).unwrap();
    assert_eq!(again.record.state, ExecState::Completed);
    assert!(!again.dispatched);
    assert_eq!(s.worker.request_count(Route::Exec), 1);

    // Sentinel rule: argv and env never reach the files in clear.
    let bytes = s.all_bytes();
    assert!(contains(&bytes, "r1"), "the database was read");
    assert!(!contains(&bytes, SENTINEL), "a payload is stored in clear");
}

#[test]
fn a_dropped_connection_after_the_request_gives_unknown_and_one_exec() {
    let s = setup();
    let rt = s.runtime("ctl-1");
    s.worker
        .faults()
        .once(Route::Exec, Fault::DropAfter { bytes: 0 });
    let out = rt.run("m1", &sentinel_command(), &key("r2")).unwrap();
    assert_eq!(out.record.state, ExecState::Unknown);
    assert_eq!(out.record.evidence, RecordEvidence::DispatchUncertain);
    assert_eq!(out.record.result, None);
    assert_eq!(out.exit_code(), None);
    let err = out.error.unwrap();
    assert_eq!(err.evidence(), Evidence::DispatchUncertain, "{err:?}");
    assert_eq!(s.worker.request_count(Route::Exec), 1);

    // Neither running it again nor recovering re-sends it.
    let again = rt.run("m1", &sentinel_command(), &key("r2")).unwrap();
    assert_eq!(again.record.state, ExecState::Unknown);
    let rec = rt.recover(&key("r2")).unwrap();
    assert_eq!(rec.record.state, ExecState::Unknown);
    assert_eq!(s.worker.request_count(Route::Exec), 1);
}

#[test]
fn a_crash_after_the_intent_then_recover_gives_unknown_and_no_second_exec() {
    let s = setup();
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let command = sentinel_command();
    // Drive the core by hand up to the durable intent, send the request,
    // and "crash" before the outcome is stored.
    let mut run = Run::new(
        key("r3"),
        command.clone(),
        &RunTarget::unverified(),
        &s.fingerprint_key,
        RunConfig::new("ctl-1"),
        now,
    )
    .unwrap();
    while let Some(op) = run.poll_store_op() {
        let r = apply_op(s.store.as_ref(), op);
        run.handle_stored(now, r);
    }
    assert!(run.poll_dispatch().is_some());
    assert_eq!(
        s.store.fetch(&key("r3")).unwrap().state,
        ExecState::Dispatching
    );
    s.client().exec("m1", &command).unwrap();
    drop(run);
    assert_eq!(s.worker.request_count(Route::Exec), 1);

    // The same controller (its claim renews) recovers: unknown, not resent.
    let rt = s.runtime("ctl-1");
    let out = rt.recover(&key("r3")).unwrap();
    assert_eq!(out.record.state, ExecState::Unknown);
    assert_eq!(out.record.evidence, RecordEvidence::DispatchUncertain);
    assert!(!out.dispatched);
    let again = rt.run("m1", &command, &key("r3")).unwrap();
    assert_eq!(again.record.state, ExecState::Unknown);
    assert_eq!(s.worker.request_count(Route::Exec), 1);
}

#[test]
fn another_controller_cannot_recover_under_a_live_claim() {
    let s = setup();
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let mut run = Run::new(
        key("r4"),
        sentinel_command(),
        &RunTarget::unverified(),
        &s.fingerprint_key,
        RunConfig::new("ctl-1"),
        now,
    )
    .unwrap();
    while let Some(op) = run.poll_store_op() {
        let r = apply_op(s.store.as_ref(), op);
        run.handle_stored(now, r);
    }
    let err = s.runtime("ctl-2").recover(&key("r4")).unwrap_err();
    assert_eq!(err.category(), Category::StaleClaim);
    assert_eq!(err.evidence(), Evidence::DispatchUncertain);
    assert_eq!(s.worker.request_count(Route::Exec), 0);
}

#[test]
fn recover_of_an_absent_record_is_not_found() {
    let s = setup();
    let err = s.runtime("ctl-1").recover(&key("nope")).unwrap_err();
    assert_eq!(err.category(), Category::NotFound);
}

#[test]
fn key_files_are_created_0600_and_reloaded() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("k");
    let a = key_file(&path).unwrap();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    assert_eq!(key_file(&path).unwrap(), a);
    assert_ne!(key_file(&dir.path().join("k2")).unwrap(), a);

    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    assert_eq!(
        key_file(&path).unwrap_err().category(),
        Category::Validation
    );
    let short = dir.path().join("short");
    std::fs::write(&short, [0u8; 31]).unwrap();
    std::fs::set_permissions(&short, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(key_file(&short).unwrap_err().reason(), "key_length");
    let long = dir.path().join("long");
    std::fs::write(&long, [0u8; 33]).unwrap();
    std::fs::set_permissions(&long, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(key_file(&long).unwrap_err().reason(), "key_length");
    let exact = dir.path().join("exact");
    std::fs::write(&exact, [7u8; 32]).unwrap();
    std::fs::set_permissions(&exact, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(key_file(&exact).unwrap(), [7u8; 32]);
}
