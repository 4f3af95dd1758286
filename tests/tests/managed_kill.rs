//! The controller process is killed (SIGKILL, a separate process) after its
//! `dispatching` intent is durable and the exec reached the worker; a new
//! controller on the same SQLite file recovers it: `unknown`, never resent
//! (devworker counter), on both shells.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::process::Command as Process;
use std::sync::Arc;
use std::time::Duration;

use smolbox_core::managed::{ExecState, RecordEvidence, RecordKey};
use smolbox_core::worker::{MachineName, MachineSpec};
use smolbox_devworker::Route;
use smolbox_store::keys::load_or_create_keys;
use smolbox_store::{Sealer, SqliteStore, Store};
use smolbox_tests::fixture::TOKEN_SENTINEL;
use smolbox_tests::managed::{BlockingManaged, ManagedShell, Options, TokioManaged};
use smolbox_tests::{Fixture, Transport};

fn killed_after_the_intent_then_recovered<M: ManagedShell>() {
    let fixture = Fixture::start(Transport::Tcp);
    let client = smolbox_blocking::Client::new(fixture.endpoint(Fixture::budgets())).unwrap();
    let profile = client.admit(&[]).unwrap();
    client
        .create(
            &profile,
            MachineName::new("m1").unwrap(),
            &MachineSpec::default(),
        )
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("smolbox.db");
    let gate = dir.path().join("gate");
    let script = format!(
        "while [ ! -e '{}' ]; do sleep 0.02; done; echo late",
        gate.display()
    );
    let mut child = Process::new(env!("CARGO_BIN_EXE_managed-ctl"))
        .args([
            db.to_str().unwrap(),
            &fixture.worker.base_url(),
            TOKEN_SENTINEL,
            "k1",
            &script,
        ])
        .spawn()
        .unwrap();
    let key = RecordKey::new("suite", "k1").unwrap();
    // Observe (bounded) the durable intent and the exec reaching the worker.
    let mut store: Option<Arc<dyn Store>> = None;
    let mut reached = false;
    for _ in 0..2_000 {
        if store.is_none() && std::fs::metadata(&db).is_ok() {
            let (_, seal) = load_or_create_keys(&db).unwrap();
            if let Ok(s) = SqliteStore::open(&db, Sealer::new(&seal, "managed").unwrap()) {
                store = Some(Arc::new(s));
            }
        }
        if let Some(s) = &store
            && s.fetch(&key)
                .is_ok_and(|r| r.state == ExecState::Dispatching)
            && fixture.worker.request_count(Route::Exec) == 1
        {
            reached = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(reached, "the child never dispatched");
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    std::fs::write(&gate, b"").unwrap();

    let (fingerprint_key, _) = load_or_create_keys(&db).unwrap();
    let rt = M::start(
        store.unwrap(),
        fingerprint_key,
        fixture.endpoint(Fixture::budgets()),
        &Options {
            lease_ttl_ms: 1_000,
            ..Options::default()
        },
    )
    .unwrap();
    let out = rt.wait(&key, 30_000).unwrap();
    assert_eq!(out.record.state, ExecState::Unknown);
    assert_eq!(out.record.evidence, RecordEvidence::DispatchUncertain);
    assert!(out.output.is_none());
    rt.reconcile();
    rt.shutdown();
    assert_eq!(
        fixture.worker.request_count(Route::Exec),
        1,
        "never re-sent after the restart"
    );
}

#[test]
fn blocking_recovers_a_killed_controller() {
    killed_after_the_intent_then_recovered::<BlockingManaged>();
}

#[test]
fn tokio_recovers_a_killed_controller() {
    killed_after_the_intent_then_recovered::<TokioManaged>();
}

/// The interrupt scenario on a retained machine, without the terminal: the
/// controller process is SIGKILLed with a command in the machine's slot;
/// the restarted controller records it `unknown` and keeps the slot
/// blocked; a verified drain stop and `resolve(quiesced = true, stopped)`
/// free it; the program ran exactly once and its file is still there.
fn a_killed_slot_holder_is_resolved<M: ManagedShell>() {
    use smolbox_core::Category;
    use smolbox_core::exec::Command;
    use smolbox_core::managed::controller::Resolution;
    use smolbox_core::managed::state::{MachineOperation, MachineRecordState};

    let fixture = Fixture::start(Transport::Tcp);
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("smolbox.db");
    let gate = dir.path().join("gate");
    let file = dir.path().join("written");
    let script = format!(
        "echo data > '{}'; while [ ! -e '{}' ]; do sleep 0.02; done; echo late",
        file.display(),
        gate.display()
    );
    let mut child = Process::new(env!("CARGO_BIN_EXE_managed-ctl"))
        .args([
            db.to_str().unwrap(),
            &fixture.worker.base_url(),
            TOKEN_SENTINEL,
            "k2",
            &script,
            "retained",
        ])
        .spawn()
        .unwrap();
    let key = RecordKey::new("boxes", "k2").unwrap();
    let machine = RecordKey::new("boxes", "kill").unwrap();
    let mut store: Option<Arc<dyn Store>> = None;
    let mut reached = false;
    for _ in 0..3_000 {
        if store.is_none() && std::fs::metadata(&db).is_ok() {
            let (_, seal) = load_or_create_keys(&db).unwrap();
            if let Ok(s) = SqliteStore::open(&db, Sealer::new(&seal, "managed").unwrap()) {
                store = Some(Arc::new(s));
            }
        }
        if let Some(s) = &store
            && s.fetch(&key)
                .is_ok_and(|r| r.state == ExecState::Dispatching)
            && fixture.worker.request_count(Route::Exec) == 1
        {
            reached = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(reached, "the child never dispatched");
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();

    let (fingerprint_key, _) = load_or_create_keys(&db).unwrap();
    let rt = M::start(
        store.unwrap(),
        fingerprint_key,
        fixture.endpoint(Fixture::budgets()),
        &Options {
            lease_ttl_ms: 1_000,
            disposable: true,
            ..Options::default()
        },
    )
    .unwrap();
    let out = rt.wait(&key, 30_000).unwrap();
    assert_eq!(out.record.state, ExecState::Unknown);
    let mut m = rt.m_inspect(&machine).unwrap();
    for _ in 0..1_000 {
        if m.state == MachineRecordState::Unknown {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
        m = rt.m_inspect(&machine).unwrap();
    }
    assert_eq!(m.state, MachineRecordState::Unknown);
    assert_eq!(m.active_execution, Some(key.clone()), "the slot is blocked");
    let next = RecordKey::new("boxes", "after").unwrap();
    let read = Command::new(["cat", file.to_str().unwrap()]);
    assert_eq!(
        rt.m_submit(&machine, &next, &read).unwrap_err().category(),
        Category::AdmissionExhausted
    );
    std::fs::write(&gate, b"").unwrap();
    let m = rt.m_stop_for_drain(&machine, m.version).unwrap();
    let (m, command) = rt
        .m_resolve(&machine, m.version, true, Resolution::Stopped)
        .unwrap();
    assert!(m.active_execution.is_none(), "the slot is free");
    assert_eq!(command.unwrap().state, ExecState::Unknown);
    rt.m_lifecycle(&machine, MachineOperation::Start, m.version)
        .unwrap();
    assert_eq!(
        rt.m_wait(&machine, 30_000).unwrap().state,
        MachineRecordState::Running
    );
    rt.m_submit(&machine, &next, &read).unwrap();
    let out = rt.wait(&next, 30_000).unwrap();
    assert_eq!(
        out.output.map(|o| o.stdout),
        Some(b"data\n".to_vec()),
        "the file is still there"
    );
    rt.reconcile();
    rt.shutdown();
    assert_eq!(
        fixture.worker.request_count(Route::Exec),
        2,
        "the killed command ran exactly once, then the reader"
    );
}

#[test]
fn blocking_resolves_a_killed_slot_holder() {
    a_killed_slot_holder_is_resolved::<BlockingManaged>();
}

#[test]
fn tokio_resolves_a_killed_slot_holder() {
    a_killed_slot_holder_is_resolved::<TokioManaged>();
}
