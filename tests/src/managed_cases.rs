//! The managed suite, written once for both shells: each case is a generic
//! `fn case<M: ManagedShell>(store: StoreKind)` run against a fresh
//! devworker (TCP) and a fresh store: a `SqliteStore` in a temp dir, or a
//! `PostgresStore` partition of its own on the server `SMOLBOX_PG_URL`
//! names (`scripts/pg.sh`; without it the PostgreSQL cases report SKIPPED,
//! and fail under `CI=true`). Devworker request counters prove how
//! many execs really reached the worker. No case sleeps to wait for what it
//! can observe: commands that must outlive a step wait for a gate file the
//! case creates.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use smolbox_core::exec::Command;
use smolbox_core::managed::claim;
use smolbox_core::managed::controller::{RunTarget, Submit, spec_for};
use smolbox_core::managed::patch::{ExecPatch, apply_exec};
use smolbox_core::managed::record::ExecResult;
use smolbox_core::managed::{
    ExecState, ExecutionRecord, FingerprintKey, RecordEvidence, RecordKey, fingerprint,
};
use smolbox_core::worker::{MachineName, MachineSpec};
use smolbox_core::{Category, Evidence};
use smolbox_devworker::{Fault, Route};
use smolbox_store::keys::load_or_create_keys;
use smolbox_store::{PostgresStore, Sealer, SqliteStore, Store};

use crate::fixture::{Fixture, TOKEN_SENTINEL, Transport};
use crate::managed::{ManagedShell, Options, WORKER};

const MACHINE: &str = "m1";
const SENTINEL: &str = "SENTINEL-MANAGED-4b8e1d";

/// Which store a case runs against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreKind {
    /// A `SqliteStore` file in a temp dir.
    Sqlite,
    /// A fresh partition of the PostgreSQL server `SMOLBOX_PG_URL` names.
    Postgres,
}

/// A devworker with machine `m1`, a store and the host keys.
pub(crate) struct Setup {
    pub(crate) fixture: Fixture,
    pub(crate) dir: tempfile::TempDir,
    pub(crate) store: Arc<dyn Store>,
    pub(crate) key: FingerprintKey,
}

/// The PostgreSQL URL, or `None` (the case of `suite` is skipped, loudly;
/// under `CI=true` it fails instead).
pub(crate) fn pg_url(suite: &str) -> Option<String> {
    match std::env::var("SMOLBOX_PG_URL") {
        Ok(u) if !u.is_empty() => Some(u),
        _ if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("SMOLBOX_PG_URL is not set in CI: the PostgreSQL cases must run")
        }
        _ => {
            eprintln!("{suite} on PostgreSQL SKIPPED: SMOLBOX_PG_URL is not set");
            None
        }
    }
}

/// A partition name no other case uses: `prefix` + 9 base-36 digits (each
/// suite has its own prefix, so two suites' binaries never share one).
pub(crate) fn fresh_partition(prefix: char) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let mut v = (now_ms() % 36u64.pow(6)) * 1_000
        + u64::from(std::process::id() % 10) * 100
        + N.fetch_add(1, Ordering::Relaxed) % 100;
    let mut s = String::from(prefix);
    while s.len() < 10 {
        s.push(char::from_digit((v % 36) as u32, 36).unwrap());
        v /= 36;
    }
    s
}

/// A fresh store of `kind` with its host keys: SQLite in a temp dir, or a
/// fresh PostgreSQL partition (tagged `partition`) when `SMOLBOX_PG_URL`
/// is set (`None` otherwise: `suite` says which suite skipped), sealed
/// under `scope`.
pub(crate) fn fresh_store(
    kind: StoreKind,
    suite: &str,
    scope: &str,
    partition: char,
) -> Option<(tempfile::TempDir, FingerprintKey, Arc<dyn Store>)> {
    let url = match kind {
        StoreKind::Sqlite => None,
        StoreKind::Postgres => Some(pg_url(suite)?),
    };
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("smolbox.db");
    let (key, seal) = load_or_create_keys(&db).unwrap();
    let store: Arc<dyn Store> = match url {
        None => Arc::new(SqliteStore::open(&db, Sealer::new(&seal, scope).unwrap()).unwrap()),
        Some(url) => Arc::new(
            PostgresStore::connect(
                &url,
                Sealer::new(&seal, &fresh_partition(partition)).unwrap(),
            )
            .unwrap(),
        ),
    };
    Some((dir, key, store))
}

pub(crate) fn setup(kind: StoreKind) -> Option<Setup> {
    let (dir, key, store) = fresh_store(kind, "managed suite", "managed", 'm')?;
    let fixture = Fixture::start(Transport::Tcp);
    let client = smolbox_blocking::Client::new(fixture.endpoint(Fixture::budgets())).unwrap();
    let profile = client.admit(&[]).unwrap();
    client
        .create(
            &profile,
            MachineName::new(MACHINE).unwrap(),
            &MachineSpec::default(),
        )
        .unwrap();
    Some(Setup {
        fixture,
        dir,
        store,
        key,
    })
}

impl Setup {
    pub(crate) fn runtime<M: ManagedShell>(&self, options: &Options) -> M {
        self.runtime_on(Arc::clone(&self.store), options)
    }

    /// A runtime over `store` (e.g. a forwarding store around this one).
    pub(crate) fn runtime_on<M: ManagedShell>(
        &self,
        store: Arc<dyn Store>,
        options: &Options,
    ) -> M {
        M::start(
            store,
            self.key.clone(),
            self.fixture.endpoint(Fixture::budgets()),
            options,
        )
        .unwrap()
    }

    pub(crate) fn execs(&self) -> u64 {
        self.fixture.worker.request_count(Route::Exec)
    }

    /// A gate file the case creates to let a waiting command finish.
    pub(crate) fn gate(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Every byte of every file in the store directory.
    pub(crate) fn all_bytes(&self) -> Vec<u8> {
        let mut all = Vec::new();
        for entry in std::fs::read_dir(self.dir.path()).unwrap() {
            let p = entry.unwrap().path();
            if p.is_file() {
                all.extend(std::fs::read(p).unwrap());
            }
        }
        all
    }
}

/// Key `suite/<id>`.
pub(crate) fn key(id: &str) -> RecordKey {
    RecordKey::new("suite", id).unwrap()
}

/// A submission of `command` as `suite/<id>` on the devworker's machine
/// `m1` (the caller's machine).
pub(crate) fn submit_of(id: &str, command: &Command) -> Submit {
    Submit {
        key: key(id),
        spec: spec_for(
            command,
            &RunTarget::unverified().fitting(command),
            WORKER,
            MACHINE,
        )
        .unwrap(),
    }
}

/// A command that prints `ok` and exits 0 once `gate` exists.
pub(crate) fn gated(gate: &Path) -> Command {
    Command::new([
        "sh",
        "-c",
        &format!(
            "while [ ! -e '{}' ]; do sleep 0.02; done; echo ok",
            gate.display()
        ),
    ])
}

pub(crate) fn open(gate: &Path) {
    std::fs::write(gate, b"").unwrap();
}

/// Polls the store until `pred` holds (bounded): for states reached by
/// the runtime in the background, which a case observes but cannot wait on.
pub(crate) fn eventually<M: ManagedShell>(
    rt: &M,
    k: &RecordKey,
    pred: impl Fn(&ExecutionRecord) -> bool,
) -> ExecutionRecord {
    let mut last = None;
    for _ in 0..1_000 {
        let rec = rt.fetch(k).unwrap();
        if pred(&rec) {
            return rec;
        }
        last = Some(rec);
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("condition never held for {k:?}: {last:?}");
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// `submit` returns at durable acceptance, before the command can finish;
/// `wait` returns its outcome with the output; `fetch` shows the record.
pub fn submit_returns_at_acceptance_and_wait_returns_the_outcome<M: ManagedShell>(kind: StoreKind) {
    let Some(s) = setup(kind) else { return };
    let rt: M = s.runtime(&Options::default());
    let gate = s.gate("g1");
    let sub = rt.submit(submit_of("a1", &gated(&gate))).unwrap();
    assert_eq!(sub.key, key("a1"));
    assert!(!sub.existing);
    // The command cannot have finished: its gate does not exist yet.
    let rec = rt.fetch(&sub.key).unwrap();
    assert!(!rec.state.is_terminal(), "{:?}", rec.state);
    // A short wait times out without cancelling anything.
    let e = rt.wait(&sub.key, 0).unwrap_err();
    assert_eq!(e.category(), Category::Expired);
    open(&gate);
    let out = rt.wait(&sub.key, 30_000).unwrap();
    assert_eq!(out.record.state, ExecState::Completed);
    assert_eq!(out.record.evidence, RecordEvidence::Exited);
    assert_eq!(out.exit_code(), Some(0));
    assert_eq!(out.output.as_ref().unwrap().stdout, b"ok\n");
    // Safe to repeat.
    let again = rt.wait(&sub.key, 0).unwrap();
    assert_eq!(again.record, out.record);
    assert_eq!(rt.fetch(&sub.key).unwrap(), out.record);
    assert_eq!(s.execs(), 1);
    // Every state it was stored in, in order, from the lifecycle
    // telemetry: the acceptance carries the claim and the dispatch intent
    // (issue 16), so `preparing` and `ready` are never a commit of their
    // own; the result is stored with `completed` (nothing to collect,
    // session 11), so `collecting` is not either.
    let states: Vec<ExecState> = rt
        .telemetry()
        .into_iter()
        .filter(|t| t.key == sub.key)
        .filter_map(|t| t.exec_state())
        .collect();
    assert_eq!(states, [ExecState::Dispatching, ExecState::Completed]);
    let e = rt.wait(&sub.key, 900_001).unwrap_err();
    assert_eq!(e.category(), Category::Validation);
    rt.shutdown();
}

/// Issues 12 and 16: a buffered command on the caller's machine with
/// nothing to collect takes two store commits (acceptance with the claim
/// and the intent; the result with `completed`), counted by the store
/// itself; the same holds for a second command on the same runtime.
pub fn a_buffered_command_takes_two_commits<M: ManagedShell>(kind: StoreKind) {
    let Some(s) = setup(kind) else { return };
    let rt: M = s.runtime(&Options::default());
    for id in ["n1", "n2"] {
        let before = s.store.commits().expect("the adapter counts commits");
        let sub = rt
            .submit(submit_of(id, &Command::new(["echo", "ok"])))
            .unwrap();
        let out = rt.wait(&sub.key, 30_000).unwrap();
        assert_eq!(out.record.state, ExecState::Completed, "{:?}", out.error);
        assert_eq!(out.output.as_ref().unwrap().stdout, b"ok\n");
        let after = s.store.commits().unwrap();
        assert_eq!(after - before, 2, "{id}: commits per buffered command");
    }
    assert_eq!(s.execs(), 2);
    rt.shutdown();
}

/// Issue 12 (benchmark): a waiter reads the store only when it must. A
/// `run` waits from its acceptance, so while this runtime drives the key
/// the finished notice ends it without any read; a separate `wait` reads
/// once, then not again while the key is driven here (it used to re-read
/// about every 25 ms). Counted by a forwarding store.
pub fn a_waiter_reads_the_store_only_when_its_runtime_does_not_drive_the_key<M: ManagedShell>(
    kind: StoreKind,
) {
    let Some(s) = setup(kind) else { return };
    let counting = Arc::new(crate::kill::KillStore::new(Arc::clone(&s.store), None));
    let rt: M = s.runtime_on(Arc::clone(&counting) as Arc<dyn Store>, &Options::default());
    let out = rt
        .run(submit_of("r1", &Command::new(["echo", "ok"])))
        .unwrap();
    assert_eq!(out.record.state, ExecState::Completed, "{:?}", out.error);
    assert_eq!(out.output.as_ref().unwrap().stdout, b"ok\n");
    assert_eq!(counting.fetches(), 0, "a run reads nothing itself");
    // A wait of 300 ms on a command that cannot finish yet: one read.
    let gate = s.gate("g-reads");
    let sub = rt.submit(submit_of("r2", &gated(&gate))).unwrap();
    let e = rt.wait(&sub.key, 300).unwrap_err();
    assert_eq!(e.category(), Category::Expired);
    assert_eq!(
        counting.fetches(),
        1,
        "one read, then the notice is awaited"
    );
    open(&gate);
    let out = rt.wait(&sub.key, 30_000).unwrap();
    assert_eq!(out.record.state, ExecState::Completed, "{:?}", out.error);
    // The same outcome as the store holds.
    assert_eq!(rt.fetch(&sub.key).unwrap(), out.record);
    rt.shutdown();
}

/// A store op that panics (a store bug, planted in the first due scan)
/// fails that op only: the runtime goes on and runs the next command (the
/// blocking shell performs store ops on its driver thread since session
/// 11, where an uncaught panic would end the runtime).
pub fn a_panicking_store_op_fails_only_itself<M: ManagedShell>(kind: StoreKind) {
    let Some(s) = setup(kind) else { return };
    let planted =
        Arc::new(crate::kill::KillStore::new(Arc::clone(&s.store), None).panicking_in_due(1));
    let rt: M = s.runtime_on(Arc::clone(&planted) as Arc<dyn Store>, &Options::default());
    // The first due scan runs before the first command is taken.
    let out = rt
        .run(submit_of("p1", &Command::new(["echo", "ok"])))
        .unwrap();
    assert_eq!(out.record.state, ExecState::Completed, "{:?}", out.error);
    assert_eq!(planted.panicked(), 1, "the planted panic happened");
    let out = rt
        .run(submit_of("p2", &Command::new(["echo", "ok"])))
        .unwrap();
    assert_eq!(out.record.state, ExecState::Completed, "{:?}", out.error);
    assert_eq!(s.execs(), 2);
    // The failed scan was answered: the next ones run (a lost answer would
    // leave the first scan outstanding and no other would start).
    rt.reconcile();
    assert!(
        planted.wait_for_dues(2, Duration::from_secs(30)) >= 2,
        "no due scan after the panicked one"
    );
    rt.shutdown();
}

/// A command running 3.5 × a 1 s claim TTL completes with its exit stored
/// and its output returned (the claim is renewed while it runs).
pub fn a_run_past_three_claim_ttls_keeps_its_exit<M: ManagedShell>(kind: StoreKind) {
    let Some(s) = setup(kind) else { return };
    let options = Options {
        lease_ttl_ms: 1_000,
        poll_interval_ms: 100,
        ..Options::default()
    };
    let rt: M = s.runtime(&options);
    let cmd = Command::new(["sh", "-c", "sleep 3.5; echo done; exit 4"]).timeout_secs(30);
    let sub = rt.submit(submit_of("long", &cmd)).unwrap();
    let out = rt.wait(&sub.key, 60_000).unwrap();
    assert_eq!(out.record.state, ExecState::Completed, "{:?}", out.error);
    assert!(out.error.is_none(), "{:?}", out.error);
    assert!(matches!(
        out.record.result,
        Some(ExecResult::Exited { exit_code: 4, .. })
    ));
    assert_eq!(out.output.as_ref().unwrap().stdout, b"done\n");
    assert_eq!(s.execs(), 1);
    rt.shutdown();
}

/// With the one active slot held, a second submission waits in the store;
/// cancelled there, it becomes `cancelled` / `not_dispatched` and the
/// worker never sees it.
pub fn cancel_before_dispatch_sends_nothing<M: ManagedShell>(kind: StoreKind) {
    let Some(s) = setup(kind) else { return };
    let options = Options {
        max_active: 1,
        ..Options::default()
    };
    let rt: M = s.runtime(&options);
    let gate = s.gate("g2");
    let first = rt.submit(submit_of("busy", &gated(&gate))).unwrap();
    let second = rt
        .submit(submit_of("victim", &Command::new(["echo", "never"])))
        .unwrap();
    let rec = rt.cancel(&second.key).unwrap();
    assert!(rec.cancel_requested_at_ms.is_some());
    open(&gate);
    rt.wait(&first.key, 30_000).unwrap();
    let out = rt.wait(&second.key, 30_000).unwrap();
    assert_eq!(out.record.state, ExecState::Cancelled);
    assert_eq!(out.record.evidence, RecordEvidence::NotDispatched);
    assert_eq!(s.execs(), 1, "only the first command reached the worker");
    // Cancelling a finished record changes nothing.
    let again = rt.cancel(&second.key).unwrap();
    assert_eq!(again, out.record);
    rt.shutdown();
}

/// After dispatch a cancel ends the observation (`unknown`, the wait
/// returns); the exit that arrives later still wins.
pub fn cancel_after_dispatch_ends_the_wait_and_a_late_exit_wins<M: ManagedShell>(kind: StoreKind) {
    let Some(s) = setup(kind) else { return };
    let rt: M = s.runtime(&Options::default());
    let gate = s.gate("g3");
    let sub = rt.submit(submit_of("c1", &gated(&gate))).unwrap();
    eventually(&rt, &sub.key, |r| r.state == ExecState::Dispatching);
    rt.cancel(&sub.key).unwrap();
    let out = rt.wait(&sub.key, 30_000).unwrap();
    assert_eq!(out.record.state, ExecState::Unknown);
    assert!(out.record.cancel_requested_at_ms.is_some());
    open(&gate);
    let done = eventually(&rt, &sub.key, |r| r.state == ExecState::Completed);
    assert_eq!(done.evidence, RecordEvidence::Exited);
    assert_eq!(s.execs(), 1);
    rt.shutdown();
}

/// The same spec under the same key resolves to the same record while
/// running and after completion (one exec); a changed spec conflicts.
pub fn duplicates_resolve_to_one_exec_and_a_changed_spec_conflicts<M: ManagedShell>(
    kind: StoreKind,
) {
    let Some(s) = setup(kind) else { return };
    let rt: M = s.runtime(&Options::default());
    let gate = s.gate("g4");
    let first = rt.submit(submit_of("d1", &gated(&gate))).unwrap();
    let dup = rt.submit(submit_of("d1", &gated(&gate))).unwrap();
    assert_eq!(dup.key, first.key);
    assert!(dup.existing);
    let e = rt
        .submit(submit_of("d1", &Command::new(["echo", "other"])))
        .unwrap_err();
    assert_eq!(e.category(), Category::IdentityConflict);
    open(&gate);
    let out = rt.wait(&first.key, 30_000).unwrap();
    assert_eq!(out.record.state, ExecState::Completed);
    let late = rt.submit(submit_of("d1", &gated(&gate))).unwrap();
    assert!(late.existing);
    assert_eq!(rt.wait(&late.key, 1_000).unwrap().record, out.record);
    assert_eq!(s.execs(), 1);
    rt.shutdown();
}

/// A connection dropped after the request: `unknown`, evidence
/// `dispatch_uncertain`, and neither a resubmit nor a reconcile resends it.
pub fn an_uncertain_dispatch_is_unknown_and_never_resent<M: ManagedShell>(kind: StoreKind) {
    let Some(s) = setup(kind) else { return };
    s.fixture
        .worker
        .faults()
        .once(Route::Exec, Fault::DropAfter { bytes: 0 });
    let rt: M = s.runtime(&Options::default());
    let cmd = Command::new(["echo", "x"]);
    let sub = rt.submit(submit_of("u1", &cmd)).unwrap();
    let out = rt.wait(&sub.key, 30_000).unwrap();
    assert_eq!(out.record.state, ExecState::Unknown);
    assert_eq!(out.record.evidence, RecordEvidence::DispatchUncertain);
    assert_eq!(out.exit_code(), None);
    // The transport error is stored as the last error (and returned as the
    // outcome's error when the notice was read first).
    let last = out.record.last_error.as_ref().unwrap();
    assert_eq!(last.evidence, "dispatch_uncertain");
    if let Some(e) = &out.error {
        assert_eq!(e.evidence(), Evidence::DispatchUncertain);
    }
    let again = rt.submit(submit_of("u1", &cmd)).unwrap();
    assert!(again.existing);
    rt.reconcile();
    assert_eq!(
        rt.wait(&sub.key, 1_000).unwrap().record.state,
        ExecState::Unknown
    );
    rt.shutdown();
    assert_eq!(s.execs(), 1);
}

/// A record whose queue budget ran out while the only slot was busy is
/// `expired` / `not_dispatched` and never sent.
pub fn the_queue_deadline_expires_a_waiting_record<M: ManagedShell>(kind: StoreKind) {
    let Some(s) = setup(kind) else { return };
    let options = Options {
        max_active: 1,
        ..Options::default()
    };
    let rt: M = s.runtime(&options);
    let gate = s.gate("g5");
    let first = rt.submit(submit_of("q-busy", &gated(&gate))).unwrap();
    let mut late = submit_of("q-late", &Command::new(["echo", "late"]));
    late.spec.queue_budget_ms = 1;
    let late = rt.submit(late).unwrap();
    // Observed, not slept for: the first command holds the slot.
    eventually(&rt, &first.key, |r| r.state == ExecState::Dispatching);
    open(&gate);
    let out = rt.wait(&late.key, 30_000).unwrap();
    assert_eq!(out.record.state, ExecState::Expired);
    assert_eq!(out.record.evidence, RecordEvidence::NotDispatched);
    assert_eq!(s.execs(), 1);
    rt.shutdown();
}

/// Writes a record of a crashed controller (`old-ctl`, claim expired)
/// moved through `states`.
fn crashed(s: &Setup, id: &str, command: &Command, states: &[ExecState], claim_until: u64) {
    let sub = submit_of(id, command);
    let fp = fingerprint::exec_fingerprint(&s.key, &sub.spec);
    let t = now_ms() - 20_000;
    let rec = ExecutionRecord::accepted(sub.key.clone(), fp, sub.spec, t).unwrap();
    s.store.accept(&rec, 100).unwrap();
    let mut rec = s
        .store
        .claim(&sub.key, "old-ctl", t, claim_until.saturating_sub(t).max(1))
        .unwrap();
    for (i, st) in states.iter().enumerate() {
        let patch = ExecPatch {
            state: Some(*st),
            evidence: (*st == ExecState::Dispatching).then_some(RecordEvidence::DispatchUncertain),
            ..ExecPatch::default()
        };
        // The same pure rule the store applies, checked here first.
        apply_exec(&rec, &patch, t + 1 + i as u64).unwrap();
        let guard = claim::Guard::for_exec(&rec, "old-ctl");
        rec = s
            .store
            .write(&sub.key, &guard, &patch, t + 1 + i as u64)
            .unwrap();
    }
}

/// A controller crashed after its intent (the request may be out): the
/// next runtime's recovery scan makes it `unknown` and sends nothing.
pub fn recovery_marks_a_crashed_dispatch_unknown_and_sends_nothing<M: ManagedShell>(
    kind: StoreKind,
) {
    let Some(s) = setup(kind) else { return };
    crashed(
        &s,
        "r1",
        &Command::new(["echo", "once"]),
        &[
            ExecState::Preparing,
            ExecState::Ready,
            ExecState::Dispatching,
        ],
        now_ms() - 10_000,
    );
    let rt: M = s.runtime(&Options::default());
    let out = rt.wait(&key("r1"), 30_000).unwrap();
    assert_eq!(out.record.state, ExecState::Unknown);
    assert_eq!(out.record.evidence, RecordEvidence::DispatchUncertain);
    rt.shutdown();
    assert_eq!(s.execs(), 0);
}

/// A `ready` record of a crashed controller is dispatched once, with the
/// command decoded from its stored spec.
pub fn recovery_dispatches_a_ready_record_once_from_its_stored_spec<M: ManagedShell>(
    kind: StoreKind,
) {
    let Some(s) = setup(kind) else { return };
    let cmd = Command::new(["sh", "-c", "echo stored; exit 9"]);
    crashed(
        &s,
        "r2",
        &cmd,
        &[ExecState::Preparing, ExecState::Ready],
        now_ms() - 10_000,
    );
    let rt: M = s.runtime(&Options::default());
    let out = rt.wait(&key("r2"), 30_000).unwrap();
    assert_eq!(out.record.state, ExecState::Completed);
    assert_eq!(out.exit_code(), Some(9));
    assert_eq!(out.output.as_ref().unwrap().stdout, b"stored\n");
    rt.reconcile();
    rt.shutdown();
    assert_eq!(s.execs(), 1);
}

/// A record another live controller holds is neither run nor marked
/// `unknown`: a second runtime submitting the same key waits for it.
pub fn a_live_claim_of_another_controller_is_respected<M: ManagedShell>(kind: StoreKind) {
    let Some(s) = setup(kind) else { return };
    let cmd = Command::new(["echo", "held"]);
    crashed(
        &s,
        "h1",
        &cmd,
        &[
            ExecState::Preparing,
            ExecState::Ready,
            ExecState::Dispatching,
        ],
        now_ms() + 600_000,
    );
    let rt: M = s.runtime(&Options::default());
    let sub = rt.submit(submit_of("h1", &cmd)).unwrap();
    assert!(sub.existing);
    rt.reconcile();
    let e = rt.wait(&sub.key, 300).unwrap_err();
    assert_eq!(e.category(), Category::Expired, "still waiting, not taken");
    let rec = rt.fetch(&sub.key).unwrap();
    assert_eq!(rec.state, ExecState::Dispatching);
    assert_eq!(rec.claim.unwrap().owner, "old-ctl");
    rt.shutdown();
    assert_eq!(s.execs(), 0);
}

/// argv, env and stdin never reach the database or its WAL in clear.
pub fn sentinels_never_reach_the_database_files<M: ManagedShell>(kind: StoreKind) {
    let capturing = crate::trace_capture::install();
    let Some(s) = setup(kind) else { return };
    let rt: M = s.runtime(&Options::default());
    let cmd = Command::new(["sh", "-c", "cat; exit 3", SENTINEL])
        .env("SECRET", SENTINEL)
        .stdin(SENTINEL);
    let out = rt.wait(&rt.submit(submit_of("z1", &cmd)).unwrap().key, 30_000);
    let out = out.unwrap();
    assert_eq!(out.exit_code(), Some(3));
    assert_eq!(out.output.as_ref().unwrap().stdout, SENTINEL.as_bytes());
    assert!(!format!("{:?}", out.record).contains(SENTINEL));
    rt.shutdown();
    // The runtime's tracing (every level, every target, spans included)
    // names the record and never its argv, env, stdin, output or token.
    assert!(
        capturing,
        "the capturing subscriber is this binary's default"
    );
    let traced = crate::trace_capture::text();
    assert!(
        traced.contains("id=z1") && traced.contains("execution finished here"),
        "the run was traced: {traced}"
    );
    assert!(!traced.contains(SENTINEL), "a payload reached tracing");
    assert!(
        !traced.contains(TOKEN_SENTINEL),
        "the token reached tracing"
    );
    if kind != StoreKind::Sqlite {
        // The PostgreSQL adapter's own suite checks its rows.
        return;
    }
    let bytes = s.all_bytes();
    let has = |n: &str| bytes.windows(n.len()).any(|w| w == n.as_bytes());
    assert!(has("z1"), "the database was read");
    assert!(!has(SENTINEL), "a payload is stored in clear");
}

/// A disposable run: the runtime reserves, creates, starts, runs, deletes,
/// observes the 404, records absence and releases; one create, one exec,
/// one delete, and no machine is left.
pub fn a_disposable_machine_is_created_used_deleted_and_released<M: ManagedShell>(kind: StoreKind) {
    let Some(s) = setup(kind) else { return };
    let options = Options {
        disposable: true,
        ..Options::default()
    };
    let rt: M = s.runtime(&options);
    let cmd = Command::new(["sh", "-c", "echo in-vm; exit 5"]);
    let mut sub = submit_of("disp", &cmd);
    sub.spec.worker_machine = None;
    let k = rt.submit(sub).unwrap().key;
    let out = rt.wait(&k, 30_000).unwrap();
    assert_eq!(out.record.state, ExecState::Completed, "{:?}", out.error);
    assert_eq!(out.exit_code(), Some(5));
    // Cleanup continues after the outcome: observe it end.
    let rec = eventually(&rt, &k, |r| r.reservation.is_none());
    assert!(rec.absence_at_ms.is_some());
    assert_eq!(rec.cleanup, smolbox_core::managed::Cleanup::Complete);
    let name = rec.assignment.unwrap().machine_name;
    let w = &s.fixture.worker;
    assert_eq!(
        w.request_count(Route::MachinesCreate),
        2,
        "m1 and the disposable one"
    );
    assert_eq!(w.request_count(Route::Exec), 1);
    assert_eq!(w.request_count(Route::MachineDelete), 1);
    let client = smolbox_blocking::Client::new(s.fixture.endpoint(Fixture::budgets())).unwrap();
    let profile = client.admit(&[]).unwrap();
    let left: Vec<String> = client
        .list(&profile)
        .unwrap()
        .into_iter()
        .map(|o| o.incarnation.name)
        .collect();
    assert!(!left.contains(&name), "{left:?}");
    rt.shutdown();
}

/// C12.4 through the runtime: a worker whose catalog lacks the spec's
/// artifact refuses a disposable submit with `unsupported_capability`
/// (`not_dispatched`) before anything is stored or sent; a catalog holding
/// the exact artifact and profile revision runs it.
pub fn a_spec_outside_the_workers_catalog_is_refused_before_anything_is_stored<M: ManagedShell>(
    kind: StoreKind,
) {
    let Some(s) = setup(kind) else { return };
    let cmd = Command::new(["sh", "-c", "echo in-vm; exit 5"]);
    let mut sub = submit_of("cat", &cmd);
    sub.spec.worker_machine = None;
    // The machine is created from the catalog's image path (C12.2), which
    // the worker requires to exist on its host (the devworker runs here).
    let image = s.dir.path().join("a.smolmachine");
    std::fs::write(&image, b"").unwrap();
    let holding = catalog_holding(&sub, &image);
    let mut lacking = holding.clone();
    lacking.images[0].sha256 = "1".repeat(64);
    let (creates, execs) = (
        s.fixture.worker.request_count(Route::MachinesCreate),
        s.execs(),
    );
    let rt: M = s.runtime(&Options {
        disposable: true,
        catalog: Some(lacking),
        ..Options::default()
    });
    let e = rt.submit(sub.clone()).unwrap_err();
    assert_eq!(e.category(), Category::UnsupportedCapability, "{e:?}");
    assert_eq!(e.evidence(), Evidence::NotDispatched);
    assert_eq!(e.reason(), smolbox_core::Reason::ArtifactNotInCatalog);
    assert_eq!(
        rt.fetch(&sub.key).unwrap_err().category(),
        Category::NotFound,
        "nothing stored"
    );
    assert_eq!(
        s.fixture.worker.request_count(Route::MachinesCreate),
        creates
    );
    assert_eq!(s.execs(), execs, "nothing sent");
    rt.shutdown();
    let rt: M = s.runtime(&Options {
        disposable: true,
        catalog: Some(holding),
        ..Options::default()
    });
    let k = rt.submit(sub).unwrap().key;
    let out = rt.wait(&k, 30_000).unwrap();
    assert_eq!(out.exit_code(), Some(5), "{:?}", out.error);
    rt.shutdown();
}

/// A catalog (C12.2) holding exactly `sub`'s artifact, at `image`, and its
/// profile revision, for the platform the devworker reports (1.22.0: Linux
/// x86_64 or macOS aarch64).
fn catalog_holding(sub: &Submit, image: &Path) -> smolbox_core::managed::catalog::Catalog {
    use smolbox_core::managed::catalog::{Architecture, Catalog, Floor, Platform, ProfileRevision};
    let floor = Floor {
        storage_gb: 1,
        overlay_gb: 1,
        host_overhead_mb: 128,
    };
    let mut revision = ProfileRevision::new(&sub.spec.profile.id);
    revision.budgets = sub.spec.profile.budgets;
    revision.per_file_max = sub.spec.profile.per_file_max;
    let platform = if cfg!(target_arch = "aarch64") {
        Platform::Macos
    } else {
        Platform::Linux
    };
    Catalog::new(platform, Architecture::host(), floor)
        .with_image(
            &sub.spec.artifact.id,
            &sub.spec.artifact.sha256,
            image.to_str().unwrap(),
        )
        .with_profile(revision)
}

/// A create the worker refuses with its error envelope (400 `BAD_REQUEST`
/// "sidecar file not found", worker-api.md §5.1 / TV8: the catalog's image
/// path does not exist on the worker host) made nothing: the record fails
/// with absence recorded, cleanup `complete`, the reservation released
/// with no operator, and the create is sent once, never again.
pub fn a_create_the_worker_refuses_fails_and_releases_the_reservation<M: ManagedShell>(
    kind: StoreKind,
) {
    let Some(s) = setup(kind) else { return };
    let cmd = Command::new(["echo", "never"]);
    let mut sub = submit_of("refused", &cmd);
    sub.spec.worker_machine = None;
    let image = s.dir.path().join("missing.smolmachine");
    let w = &s.fixture.worker;
    let (creates, execs) = (w.request_count(Route::MachinesCreate), s.execs());
    let rt: M = s.runtime(&Options {
        disposable: true,
        catalog: Some(catalog_holding(&sub, &image)),
        ..Options::default()
    });
    let k = rt.submit(sub).unwrap().key;
    let out = rt.wait(&k, 30_000).unwrap();
    assert_eq!(out.record.state, ExecState::Failed, "{:?}", out.error);
    assert_eq!(out.record.evidence, RecordEvidence::NotDispatched);
    let e = out.error.unwrap();
    assert_eq!(e.operation(), smolbox_core::Operation::Create, "{e:?}");
    assert_eq!(e.reason(), smolbox_core::Reason::WorkerBadRequest, "{e:?}");
    let rec = eventually(&rt, &k, |r| r.reservation.is_none());
    assert!(rec.absence_at_ms.is_some(), "{rec:?}");
    assert_eq!(rec.cleanup, smolbox_core::managed::Cleanup::Complete);
    assert_eq!(rec.next_due_at_ms, None, "nothing left to do");
    let last = rec.last_error.unwrap();
    assert_eq!(last.reason, "worker_bad_request");
    // Sent once (not due any more, so no scan sends it again).
    assert_eq!(w.request_count(Route::MachinesCreate), creates + 1);
    assert_eq!(w.request_count(Route::MachineDelete), 0);
    assert_eq!(s.execs(), execs, "nothing run");
    rt.shutdown();
}

/// Two runtimes (two controllers) on one SQLite file, both submitting and
/// reconciling the same commands: each is dispatched exactly once.
pub fn two_runtimes_on_one_store_dispatch_each_command_once<M: ManagedShell>(kind: StoreKind) {
    let Some(s) = setup(kind) else { return };
    let a: M = s.runtime(&Options::default());
    let b: M = s.runtime(&Options::default());
    let ids: Vec<String> = (0..8).map(|i| format!("race-{i}")).collect();
    for id in &ids {
        let cmd = Command::new(["echo", id.as_str()]);
        let x = a.submit(submit_of(id, &cmd)).unwrap();
        let y = b.submit(submit_of(id, &cmd)).unwrap();
        assert_eq!(x.key, y.key);
    }
    a.reconcile();
    b.reconcile();
    for id in &ids {
        let oa = a.wait(&key(id), 30_000).unwrap();
        let ob = b.wait(&key(id), 30_000).unwrap();
        assert_eq!(oa.record.state, ExecState::Completed);
        assert_eq!(ob.record.state, ExecState::Completed);
    }
    a.shutdown();
    b.shutdown();
    assert_eq!(s.execs(), ids.len() as u64, "each command exactly once");
}
