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

// ---- every durable boundary, on SQLite and PostgreSQL (issue 14 item 6) ----

use std::os::unix::process::ExitStatusExt;

use smolbox_core::managed::record::ExecResult;
use smolbox_store::PostgresStore;
use smolbox_tests::kill::{KILL_VAR, KillPoint};

/// The store a controller process and the test share.
enum Db {
    Sqlite(std::path::PathBuf),
    Postgres {
        url: String,
        partition: String,
        keys: std::path::PathBuf,
    },
}

impl Db {
    fn arg(&self) -> String {
        match self {
            Self::Sqlite(p) => p.display().to_string(),
            Self::Postgres {
                partition, keys, ..
            } => format!("postgres:{partition}:{}", keys.display()),
        }
    }

    fn key_path(&self) -> &std::path::Path {
        match self {
            Self::Sqlite(p) => p,
            Self::Postgres { keys, .. } => keys,
        }
    }

    fn open(&self) -> Arc<dyn Store> {
        let (_, seal) = load_or_create_keys(self.key_path()).unwrap();
        match self {
            Self::Sqlite(p) => {
                Arc::new(SqliteStore::open(p, Sealer::new(&seal, "managed").unwrap()).unwrap())
            }
            Self::Postgres { url, partition, .. } => Arc::new(
                PostgresStore::connect(url, Sealer::new(&seal, partition).unwrap()).unwrap(),
            ),
        }
    }
}

/// `SMOLBOX_PG_URL`, or `None` (loudly) outside CI.
fn pg_url() -> Option<String> {
    match std::env::var("SMOLBOX_PG_URL") {
        Ok(u) if !u.is_empty() => Some(u),
        _ if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("SMOLBOX_PG_URL is not set in CI: the PostgreSQL kill tests must run")
        }
        _ => {
            eprintln!(
                "PostgreSQL kill tests SKIPPED: SMOLBOX_PG_URL is not set (run scripts/test.sh)"
            );
            None
        }
    }
}

/// A partition no other run uses (`[a-z][a-z0-9]{0,9}`).
fn fresh_partition(n: usize) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("k{:08}{}", (nanos / 1_000) % 100_000_000, n % 10)
}

/// The controller process SIGKILLs itself at `point`; a new controller on
/// the same store recovers the record: never two executions of the one
/// identity (devworker count), a stored exit never lost, an uncertain
/// outcome `unknown`.
fn killed_at(point: KillPoint, db: &Db, dir: &std::path::Path) {
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
    let marker = dir.join(format!("ran-{}", point.name()));
    let script = if point == KillPoint::AfterDispatch {
        // The command kills its controller while it runs: the exec has
        // reached the worker and no reply can have come back.
        format!(
            "kill -KILL {{CTL_PID}}; echo x >> '{}'; exit 3",
            marker.display()
        )
    } else {
        format!("echo x >> '{}'; exit 3", marker.display())
    };
    let status = Process::new(env!("CARGO_BIN_EXE_managed-ctl"))
        .args([
            db.arg().as_str(),
            &fixture.worker.base_url(),
            TOKEN_SENTINEL,
            "k1",
            &script,
        ])
        .env(KILL_VAR, point.name())
        .status()
        .unwrap();
    assert_eq!(
        status.signal(),
        Some(9),
        "{point:?}: the controller did not die there: {status:?}"
    );
    let store = db.open();
    let key = RecordKey::new("suite", "k1").unwrap();
    let sent = fixture.worker.request_count(Route::Exec);
    if point == KillPoint::BeforeIntent {
        // On the caller's machine the intent commits with the acceptance
        // (issue 16): killed before it, nothing is stored and nothing sent;
        // never read as a record. The caller's retry runs it once.
        let e = store.fetch(&key).unwrap_err();
        assert_eq!(
            (e.category(), sent),
            (smolbox_core::Category::NotFound, 0),
            "{point:?} at death"
        );
        let status = Process::new(env!("CARGO_BIN_EXE_managed-ctl"))
            .args([
                db.arg().as_str(),
                &fixture.worker.base_url(),
                TOKEN_SENTINEL,
                "k1",
                &script,
            ])
            .status()
            .unwrap();
        assert!(status.success(), "{point:?}: the retry failed: {status:?}");
    } else {
        let at_death = store.fetch(&key).unwrap();
        let state = match point {
            KillPoint::DuringFinish => ExecState::Collecting,
            _ => ExecState::Dispatching,
        };
        let sent_expected = u64::from(point != KillPoint::AfterIntent);
        assert_eq!(
            (at_death.state, sent),
            (state, sent_expected),
            "{point:?} at death"
        );
    }

    let (fingerprint_key, _) = load_or_create_keys(db.key_path()).unwrap();
    let rt = BlockingManaged::start(
        store.clone(),
        fingerprint_key,
        fixture.endpoint(Fixture::budgets()),
        &Options {
            lease_ttl_ms: 1_000,
            ..Options::default()
        },
    )
    .unwrap();
    let out = rt.wait(&key, 30_000).unwrap();
    rt.reconcile();
    rt.shutdown();
    let rec = out.record;
    let exit3 = matches!(rec.result, Some(ExecResult::Exited { exit_code: 3, .. }));
    match point {
        // Nothing was stored or sent: the retry ran it once.
        KillPoint::BeforeIntent => {
            assert_eq!(rec.state, ExecState::Completed, "{point:?}");
            assert!(exit3, "{point:?}: {:?}", rec.result);
        }
        // Possibly dispatched (the intent is durable), no stored exit:
        // `unknown`, never sent again.
        KillPoint::AfterIntent | KillPoint::AfterDispatch | KillPoint::AfterReply => {
            assert_eq!(rec.state, ExecState::Unknown, "{point:?}");
            assert_eq!(rec.evidence, RecordEvidence::DispatchUncertain, "{point:?}");
            assert!(rec.result.is_none(), "{point:?}");
        }
        // The exit was stored: it is kept and the record completes.
        KillPoint::DuringFinish => {
            assert_eq!(rec.state, ExecState::Completed, "{point:?}");
            assert!(exit3, "{point:?}: {:?}", rec.result);
        }
    }
    let runs = std::fs::read_to_string(&marker).map_or(0, |s| s.lines().count() as u64);
    let sent = fixture.worker.request_count(Route::Exec);
    let expected = match point {
        KillPoint::AfterIntent => 0,
        _ => 1,
    };
    assert_eq!(
        (sent, runs),
        (expected, expected),
        "{point:?}: executions of one identity"
    );
    assert_eq!(
        store.fetch(&key).unwrap(),
        rec,
        "{point:?}: nothing moved after the wait"
    );
}

#[test]
fn every_durable_boundary_on_sqlite() {
    for (i, point) in KillPoint::ALL.into_iter().enumerate() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::Sqlite(dir.path().join(format!("smolbox-{i}.db")));
        killed_at(point, &db, dir.path());
    }
}

#[test]
fn every_durable_boundary_on_postgres() {
    let Some(url) = pg_url() else {
        return;
    };
    for (i, point) in KillPoint::ALL.into_iter().enumerate() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::Postgres {
            url: url.clone(),
            partition: fresh_partition(i),
            keys: dir.path().join("pg"),
        };
        killed_at(point, &db, dir.path());
    }
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

// ---- issue 13's interrupt scenario with a managed terminal ----

/// Issue 13's interrupt scenario: a controller process (`managed-ctl …
/// terminal`) opens a shell on its owned, running, retained machine and
/// types into it; the shell writes a file; the process is SIGKILLed with
/// the session active. A restarted controller records the terminal
/// `unknown` (possibly running, never reopened) and keeps the slot blocked
/// (the machine `unknown`, a command refused); a verified stop for
/// draining and `resolve(quiesced = true, stopped)` free it; the machine
/// starts again, a command reads the file; the shell was launched exactly
/// once (one upgrade, one line in its counter); the machine is deleted.
fn a_killed_terminal_is_resolved<M: ManagedShell>(db: &Db, dir: &std::path::Path) {
    use smolbox_core::Category;
    use smolbox_core::exec::Command;
    use smolbox_core::managed::controller::Resolution;
    use smolbox_core::managed::state::{MachineOperation, MachineRecordState as MS};

    let fixture = Fixture::start(Transport::Tcp);
    let file = dir.join("term-written");
    let counter = dir.join("term-launched");
    // Typed into the shell: the file, one line per launch of this input.
    let script = format!(
        "echo data > '{}'; echo launched >> '{}'",
        file.display(),
        counter.display()
    );
    let mut child = Process::new(env!("CARGO_BIN_EXE_managed-ctl"))
        .args([
            db.arg().as_str(),
            &fixture.worker.base_url(),
            TOKEN_SENTINEL,
            "t1",
            &script,
            "terminal",
        ])
        .spawn()
        .unwrap();
    let key = RecordKey::new("boxes", "t1").unwrap();
    let machine = RecordKey::new("boxes", "kill").unwrap();
    // Observed, not timed: the shell ran the input once the line is there.
    let mut typed = false;
    for _ in 0..3_000 {
        if std::fs::read_to_string(&counter).is_ok_and(|s| s.lines().count() == 1)
            && std::fs::metadata(&file).is_ok_and(|m| m.len() > 0)
        {
            typed = true;
            break;
        }
        assert!(child.try_wait().unwrap().is_none(), "the controller ended");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(typed, "the shell never ran the input");
    let store = db.open();
    assert_eq!(store.fetch(&key).unwrap().state, ExecState::Running);
    child.kill().unwrap(); // SIGKILL
    let status = child.wait().unwrap();
    assert_eq!(status.signal(), Some(9), "{status:?}");

    let (fingerprint_key, _) = load_or_create_keys(db.key_path()).unwrap();
    let rt = M::start(
        store.clone(),
        fingerprint_key,
        fixture.endpoint(Fixture::budgets()),
        &Options {
            lease_ttl_ms: 1_000,
            disposable: true,
            ..Options::default()
        },
    )
    .unwrap();
    // The dead controller's claims lapse (1 s); the scan recovers it.
    let mut seen = None;
    for _ in 0..3_000 {
        let (r, m) = (rt.fetch(&key).unwrap(), rt.m_inspect(&machine).unwrap());
        if r.state == ExecState::Unknown && m.state == MS::Unknown {
            seen = Some((r, m));
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let (rec, m) = seen.expect("the terminal was never recovered as unknown");
    // It was seen running before the kill; what happened after is unknown.
    assert_eq!(rec.evidence, RecordEvidence::RunningObserved);
    assert_eq!(rec.result, None);
    assert_eq!(
        rec.last_error.as_ref().map(|e| e.reason.as_str()),
        Some("terminal_recovered")
    );
    assert_eq!(m.active_execution, Some(key.clone()), "the slot is blocked");
    let next = RecordKey::new("boxes", "after-term").unwrap();
    let read = Command::new(["cat", file.to_str().unwrap()]);
    assert_eq!(
        rt.m_submit(&machine, &next, &read).unwrap_err().category(),
        Category::AdmissionExhausted
    );
    // Resolution needs the operator's word that the machine is quiet.
    let m = rt.m_stop_for_drain(&machine, m.version).unwrap();
    let e = rt
        .m_resolve(&machine, m.version, false, Resolution::Stopped)
        .unwrap_err();
    assert_eq!(e.category(), Category::Validation, "{e:?}");
    let (m, command) = rt
        .m_resolve(&machine, m.version, true, Resolution::Stopped)
        .unwrap();
    assert!(m.active_execution.is_none(), "the slot is free");
    assert_eq!(m.state, MS::Stopped);
    assert_eq!(command.unwrap().state, ExecState::Unknown, "never guessed");
    rt.m_lifecycle(&machine, MachineOperation::Start, m.version)
        .unwrap();
    assert_eq!(rt.m_wait(&machine, 30_000).unwrap().state, MS::Running);
    rt.m_submit(&machine, &next, &read).unwrap();
    let out = rt.wait(&next, 30_000).unwrap();
    assert_eq!(
        out.output.map(|o| o.stdout),
        Some(b"data\n".to_vec()),
        "the file is still there"
    );
    assert_eq!(
        (
            fixture.worker.request_count(Route::Terminal),
            std::fs::read_to_string(&counter).unwrap().lines().count()
        ),
        (1, 1),
        "the shell was launched exactly once"
    );
    let v = rt.m_inspect(&machine).unwrap().version;
    rt.m_lifecycle(&machine, MachineOperation::Delete, v)
        .unwrap();
    let gone = rt.m_wait(&machine, 30_000).unwrap();
    assert_eq!(gone.state, MS::Deleted, "{:?}", gone.last_error);
    assert_eq!(store.fetch(&key).unwrap().state, ExecState::Unknown);
    rt.shutdown();
}

#[test]
fn blocking_resolves_a_killed_terminal_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::Sqlite(dir.path().join("smolbox.db"));
    a_killed_terminal_is_resolved::<BlockingManaged>(&db, dir.path());
}

#[test]
fn tokio_resolves_a_killed_terminal_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::Sqlite(dir.path().join("smolbox.db"));
    a_killed_terminal_is_resolved::<TokioManaged>(&db, dir.path());
}

#[test]
fn blocking_resolves_a_killed_terminal_on_postgres() {
    let Some(url) = pg_url() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let db = Db::Postgres {
        url,
        partition: fresh_partition(7),
        keys: dir.path().join("pg"),
    };
    a_killed_terminal_is_resolved::<BlockingManaged>(&db, dir.path());
}
