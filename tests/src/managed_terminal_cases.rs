//! Managed terminals end to end (features C7.3, C7.4, C14.3), written once
//! for both shells: each case is a generic `fn case<T: TermShell>(store)`
//! run against a fresh devworker (TCP, real PTYs) and a fresh store
//! (SQLite in a temp dir, or a PostgreSQL partition when `SMOLBOX_PG_URL`
//! is set). The retained machine is the devworker's `m1`, recorded in the
//! store as running, assigned and with creation evidence under the
//! runtime's owner (the retained-machine API is another branch's work).
//! Devworker request counters prove how many upgrades reached the worker.
//! No case sleeps to wait for something it can observe.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::sync::Arc;
use std::time::Duration;

use smolbox_core::exec::Command;
use smolbox_core::managed::claim::Guard;
use smolbox_core::managed::controller::{Outcome, RunTarget, Submit, spec_for};
use smolbox_core::managed::fingerprint::{exec_fingerprint, machine_fingerprint};
use smolbox_core::managed::patch::MachinePatch;
use smolbox_core::managed::record::{CreationEvidence, ExecResult, Resources};
use smolbox_core::managed::spec::{
    Action, ArtifactKind, ArtifactRef, CommandSpec, DEFAULT_QUEUE_BUDGET_MS, DEFAULT_RETENTION_MS,
    ExecutionSpec, ManagedTerminalSpec, ProfileBudgets, ProfileRef, RetainedMachineSpec,
};
use smolbox_core::managed::state::{MachineOperation, MachinePhase, MachineRecordState};
use smolbox_core::managed::{
    ExecState, ExecutionRecord, FingerprintKey, MachineRecord, RecordEvidence, RecordKey,
};
use smolbox_core::terminal::TerminalExit;
use smolbox_core::worker::{Endpoint, MachineName, MachineSpec};
use smolbox_core::{Category, Error};
use smolbox_devworker::Route;
use smolbox_store::keys::load_or_create_keys;
use smolbox_store::{PostgresStore, Reserve, Sealer, SqliteStore, Store};

use crate::TerminalEvent;
use crate::fixture::{Fixture, TOKEN_SENTINEL, Transport};
use crate::managed_cases::StoreKind;

/// The controller id of every case's runtime (and of the machine record's
/// claims, so the runtime may finish the slot it fences).
pub const OWNER: &str = "ctl-term-e2e";
/// Worker id the cases configure.
pub const WORKER: &str = "dev";
const MACHINE: &str = "m1";
const SENTINEL: &str = "SENTINEL-TERMINAL-7c2d";

/// A runtime's managed terminals, synchronously (the tokio one wrapped in
/// `block_on`).
pub trait TermShell: Sized {
    /// The consumer handle.
    type Handle: TermHandle;
    /// A runtime over `store` with worker `dev` at `endpoint`, owner [`OWNER`].
    ///
    /// # Errors
    /// The builder's.
    fn start(store: Arc<dyn Store>, key: FingerprintKey, endpoint: Endpoint)
    -> Result<Self, Error>;
    /// `terminals().open`: `(record, existing)`.
    ///
    /// # Errors
    /// As the runtime's.
    fn open(
        &self,
        key: &RecordKey,
        machine: &RecordKey,
        spec: ManagedTerminalSpec,
    ) -> Result<(ExecutionRecord, bool), Error>;
    /// `terminals().attach`.
    ///
    /// # Errors
    /// As the runtime's.
    fn attach(&self, key: &RecordKey, wait: Duration) -> Result<Self::Handle, Error>;
    /// `terminals().wait`.
    ///
    /// # Errors
    /// As the runtime's.
    fn wait(&self, key: &RecordKey) -> Result<ExecutionRecord, Error>;
    /// `Runtime::run` (a command on the caller-named worker machine).
    ///
    /// # Errors
    /// As the runtime's.
    fn run(&self, submit: Submit) -> Result<Outcome, Error>;
}

/// The consumer's handle, synchronously.
pub trait TermHandle: std::fmt::Debug {
    /// `input`.
    ///
    /// # Errors
    /// As the handle's.
    fn input(&mut self, bytes: &[u8]) -> Result<(), Error>;
    /// `resize`.
    ///
    /// # Errors
    /// As the handle's.
    fn resize(&mut self, cols: u16, rows: u16) -> Result<(), Error>;
    /// `next`.
    ///
    /// # Errors
    /// As the handle's.
    fn next(&mut self, timeout: Duration) -> Result<TerminalEvent, Error>;
}

fn builder_parts(endpoint: Endpoint) -> Result<smolbox_blocking::Client, Error> {
    smolbox_blocking::Client::new(endpoint)
}

/// `smolbox_blocking::Runtime` as a [`TermShell`].
#[derive(Debug)]
pub struct BlockingTerm(smolbox_blocking::Runtime);

impl TermShell for BlockingTerm {
    type Handle = smolbox_blocking::ManagedTerminal;
    fn start(
        store: Arc<dyn Store>,
        key: FingerprintKey,
        endpoint: Endpoint,
    ) -> Result<Self, Error> {
        let client = builder_parts(endpoint)?;
        let rt = smolbox_blocking::Runtime::builder(store, key)
            .worker(WORKER, client)
            .owner(OWNER)
            .poll_interval_ms(100)
            .build()?;
        Ok(Self(rt))
    }
    fn open(
        &self,
        key: &RecordKey,
        machine: &RecordKey,
        spec: ManagedTerminalSpec,
    ) -> Result<(ExecutionRecord, bool), Error> {
        self.0
            .terminals()
            .open(key.clone(), machine.clone(), spec)
            .map(|o| (o.record, o.existing))
    }
    fn attach(&self, key: &RecordKey, wait: Duration) -> Result<Self::Handle, Error> {
        self.0.terminals().attach(key, wait)
    }
    fn wait(&self, key: &RecordKey) -> Result<ExecutionRecord, Error> {
        self.0.terminals().wait(key, Duration::from_secs(30))
    }
    fn run(&self, submit: Submit) -> Result<Outcome, Error> {
        self.0.run(submit)
    }
}

impl TermHandle for smolbox_blocking::ManagedTerminal {
    fn input(&mut self, bytes: &[u8]) -> Result<(), Error> {
        Self::input(self, bytes)
    }
    fn resize(&mut self, cols: u16, rows: u16) -> Result<(), Error> {
        Self::resize(self, cols, rows)
    }
    fn next(&mut self, timeout: Duration) -> Result<TerminalEvent, Error> {
        Self::next(self, timeout)
    }
}

/// `smolbox_tokio::Runtime` behind a synchronous face.
#[derive(Debug)]
pub struct TokioTerm {
    rt: Arc<tokio::runtime::Runtime>,
    runtime: smolbox_tokio::Runtime,
}

/// A tokio handle with its runtime.
#[derive(Debug)]
pub struct TokioHandle {
    rt: Arc<tokio::runtime::Runtime>,
    h: smolbox_tokio::ManagedTerminal,
}

impl TermShell for TokioTerm {
    type Handle = TokioHandle;
    fn start(
        store: Arc<dyn Store>,
        key: FingerprintKey,
        endpoint: Endpoint,
    ) -> Result<Self, Error> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|_| Error::validation(smolbox_core::Operation::Config, "tokio"))?;
        let client = smolbox_tokio::Client::new(endpoint)?;
        let runtime = {
            let _guard = rt.enter();
            smolbox_tokio::Runtime::builder(store, key)
                .worker(WORKER, client)
                .owner(OWNER)
                .poll_interval_ms(100)
                .build()?
        };
        Ok(Self {
            rt: Arc::new(rt),
            runtime,
        })
    }
    fn open(
        &self,
        key: &RecordKey,
        machine: &RecordKey,
        spec: ManagedTerminalSpec,
    ) -> Result<(ExecutionRecord, bool), Error> {
        self.rt
            .block_on(
                self.runtime
                    .terminals()
                    .open(key.clone(), machine.clone(), spec),
            )
            .map(|o| (o.record, o.existing))
    }
    fn attach(&self, key: &RecordKey, wait: Duration) -> Result<Self::Handle, Error> {
        let h = self
            .rt
            .block_on(self.runtime.terminals().attach(key, wait))?;
        Ok(TokioHandle {
            rt: Arc::clone(&self.rt),
            h,
        })
    }
    fn wait(&self, key: &RecordKey) -> Result<ExecutionRecord, Error> {
        self.rt
            .block_on(self.runtime.terminals().wait(key, Duration::from_secs(30)))
    }
    fn run(&self, submit: Submit) -> Result<Outcome, Error> {
        self.rt.block_on(self.runtime.run(submit))
    }
}

impl TermHandle for TokioHandle {
    fn input(&mut self, bytes: &[u8]) -> Result<(), Error> {
        self.rt.block_on(self.h.input(bytes))
    }
    fn resize(&mut self, cols: u16, rows: u16) -> Result<(), Error> {
        self.rt.block_on(self.h.resize(cols, rows))
    }
    fn next(&mut self, timeout: Duration) -> Result<TerminalEvent, Error> {
        self.rt.block_on(self.h.next(timeout))
    }
}

/// A devworker with machine `m1`, a store holding it as a running
/// retained machine, and the host keys.
struct Setup {
    fixture: Fixture,
    dir: tempfile::TempDir,
    store: Arc<dyn Store>,
    key: FingerprintKey,
    machine: RecordKey,
}

fn pg_url() -> Option<String> {
    match std::env::var("SMOLBOX_PG_URL") {
        Ok(u) if !u.is_empty() => Some(u),
        _ if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("SMOLBOX_PG_URL is not set in CI: the PostgreSQL cases must run")
        }
        _ => {
            eprintln!("managed terminal suite on PostgreSQL SKIPPED: SMOLBOX_PG_URL is not set");
            None
        }
    }
}

fn fresh_partition() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::{SystemTime, UNIX_EPOCH};
    static N: AtomicU64 = AtomicU64::new(0);
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let mut v = (ms % 36u64.pow(6)) * 1_000
        + u64::from(std::process::id() % 10) * 100
        + N.fetch_add(1, Ordering::Relaxed) % 100;
    let mut s = String::from("t");
    while s.len() < 10 {
        s.push(char::from_digit((v % 36) as u32, 36).unwrap());
        v /= 36;
    }
    s
}

fn now_ms() -> u64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn machine_spec() -> RetainedMachineSpec {
    let target = RunTarget::unverified();
    RetainedMachineSpec {
        artifact: ArtifactRef {
            kind: ArtifactKind::Image,
            ..target.artifact
        },
        profile: ProfileRef {
            budgets: ProfileBudgets::DEFAULT,
            ..target.profile
        },
        ports: Vec::new(),
        workload: None,
        checkpointable: false,
        network: None,
        guest_paths: None,
    }
}

/// Records the devworker's `m1` as a running retained machine owned by
/// [`OWNER`]: accepted, worker lease, claim, reservation (the name), the
/// create intent, then running with creation evidence.
fn record_machine(s: &dyn Store, key: &FingerprintKey, k: &RecordKey) -> MachineRecord {
    let spec = machine_spec();
    let t = now_ms();
    let fp = machine_fingerprint(key, &spec);
    let rec = MachineRecord::accepted(k.clone(), fp, spec, t).unwrap();
    s.accept_machine(&rec, 100).unwrap();
    s.claim_worker(WORKER, OWNER, t, 60_000).unwrap();
    let m = s.claim_machine(k, OWNER, t, 60_000).unwrap();
    let req = Reserve {
        worker_id: WORKER.into(),
        machine_name: MACHINE.into(),
        capacity: Resources {
            slots: 1,
            cpus: 1,
            memory_mb: 512,
            disk_gb: 2,
        },
        limit: Resources {
            slots: 8,
            cpus: 64,
            memory_mb: 65_536,
            disk_gb: 1_024,
        },
    };
    let m = s
        .reserve_machine(k, &Guard::for_machine(&m, OWNER), &req, t + 1)
        .unwrap();
    let p = MachinePatch {
        state: Some(MachineRecordState::Creating),
        operation: Some((MachineOperation::Create, MachinePhase::Dispatching)),
        ..MachinePatch::default()
    };
    let m = s
        .write_machine(k, &Guard::for_machine(&m, OWNER), &p, t + 2)
        .unwrap();
    let p = MachinePatch {
        state: Some(MachineRecordState::Running),
        operation: Some((MachineOperation::None, MachinePhase::None)),
        creation: Some(CreationEvidence {
            created_at_ms: t + 2,
            incarnation: "inc-1".into(),
        }),
        ..MachinePatch::default()
    };
    s.write_machine(k, &Guard::for_machine(&m, OWNER), &p, t + 3)
        .unwrap()
}

fn setup(kind: StoreKind) -> Option<Setup> {
    let url = match kind {
        StoreKind::Sqlite => None,
        StoreKind::Postgres => Some(pg_url()?),
    };
    let fixture = Fixture::start(Transport::Tcp);
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("smolbox.db");
    let (key, seal) = load_or_create_keys(&db).unwrap();
    let store: Arc<dyn Store> = match url {
        None => Arc::new(SqliteStore::open(&db, Sealer::new(&seal, "term").unwrap()).unwrap()),
        Some(url) => Arc::new(
            PostgresStore::connect(&url, Sealer::new(&seal, &fresh_partition()).unwrap()).unwrap(),
        ),
    };
    let client = smolbox_blocking::Client::new(fixture.endpoint(Fixture::budgets())).unwrap();
    let profile = client.admit(&[]).unwrap();
    client
        .create(
            &profile,
            MachineName::new(MACHINE).unwrap(),
            &MachineSpec::default(),
        )
        .unwrap();
    let machine = RecordKey::new("suite", "machine-1").unwrap();
    record_machine(&*store, &key, &machine);
    Some(Setup {
        fixture,
        dir,
        store,
        key,
        machine,
    })
}

impl Setup {
    fn runtime<T: TermShell>(&self) -> T {
        T::start(
            Arc::clone(&self.store),
            self.key.clone(),
            self.fixture.endpoint(Fixture::budgets()),
        )
        .unwrap()
    }

    fn upgrades(&self) -> u64 {
        self.fixture.worker.request_count(Route::Terminal)
    }

    fn machine(&self) -> MachineRecord {
        self.store.fetch_machine(&self.machine).unwrap()
    }

    /// Every byte of every file in the store directory.
    fn all_bytes(&self) -> Vec<u8> {
        let mut all = Vec::new();
        for entry in std::fs::read_dir(self.dir.path()).unwrap() {
            let p = entry.unwrap().path();
            if p.is_file() {
                all.extend(std::fs::read(p).unwrap());
            }
        }
        all
    }

    /// A command record for the machine's slot (what the retained-machine
    /// submission stores).
    fn command_record(&self, id: &str) -> ExecutionRecord {
        let m = self.machine();
        let spec = ExecutionSpec {
            artifact: m.spec.artifact.clone(),
            profile: m.spec.profile.clone(),
            action: Action::Command(CommandSpec {
                argv: vec!["true".into()],
                env: Default::default(),
                workdir: None,
                stdin_b64: None,
                timeout_s: None,
                background: false,
                user: None,
            }),
            machine: Some(self.machine.clone()),
            worker_machine: None,
            inputs: Vec::new(),
            outputs: Vec::new(),
            queue_budget_ms: DEFAULT_QUEUE_BUDGET_MS,
            retention_ms: DEFAULT_RETENTION_MS,
            metadata: Default::default(),
            network: None,
            guest_paths: None,
        };
        let fp = exec_fingerprint(&self.key, &spec);
        ExecutionRecord::accepted(key(id), fp, spec, now_ms()).unwrap()
    }
}

fn key(id: &str) -> RecordKey {
    RecordKey::new("suite", id).unwrap()
}

fn read_until<H: TermHandle>(h: &mut H, needle: &str) -> String {
    let mut seen = Vec::new();
    for _ in 0..400 {
        match h.next(Duration::from_secs(5)).unwrap() {
            TerminalEvent::Output(b) => {
                seen.extend_from_slice(&b);
                let text = String::from_utf8_lossy(&seen);
                if text.contains(needle) {
                    return text.into_owned();
                }
            }
            TerminalEvent::Closed(o) => panic!("closed before {needle:?}: {o:?}"),
        }
    }
    panic!("{needle:?} never arrived");
}

fn outcome_of<H: TermHandle>(h: &mut H) -> Result<TerminalExit, Error> {
    for _ in 0..10_000 {
        if let TerminalEvent::Closed(o) = h.next(Duration::from_secs(5)).unwrap() {
            return o;
        }
    }
    panic!("the session never ended");
}

/// The seed scenario: open on an owned running machine, attach, `pwd`,
/// write a file, resize, `exit 7` → `completed` with exit 7 and no
/// transcript, the slot released, and the next command reads the file;
/// exactly one upgrade.
pub fn seed_scenario_open_attach_exit_7<T: TermShell>(kind: StoreKind) {
    let Some(s) = setup(kind) else { return };
    let rt: T = s.runtime();
    let k = key("term-1");
    let (rec, existing) = rt
        .open(&k, &s.machine, ManagedTerminalSpec::default())
        .unwrap();
    assert!(!existing);
    assert_eq!(
        rec.state,
        ExecState::Accepted,
        "durable acceptance, not readiness"
    );
    assert_eq!(
        s.machine().active_execution,
        Some(k.clone()),
        "holds the slot"
    );
    let mut h = rt.attach(&k, Duration::from_secs(10)).unwrap();
    h.input(b"echo \"pwd=$(pwd)\"\n").unwrap();
    let out = read_until(&mut h, "pwd=/");
    assert!(out.contains("pwd=/"), "{out}");
    h.input(b"mkdir -p workspace && echo TERMFILE-OK > workspace/note.txt && echo wrote-it\n")
        .unwrap();
    read_until(&mut h, "wrote-it");
    h.resize(100, 40).unwrap();
    h.input(b"stty size\n").unwrap();
    read_until(&mut h, "40 100");
    h.input(b"exit 7\n").unwrap();
    assert_eq!(outcome_of(&mut h).unwrap(), TerminalExit { code: 7 });
    let rec = rt.wait(&k).unwrap();
    assert_eq!(
        (rec.state, rec.evidence, rec.result.clone()),
        (
            ExecState::Completed,
            RecordEvidence::Exited,
            Some(ExecResult::Terminal { exit_code: 7 })
        )
    );
    assert!(rec.artifacts.is_empty(), "no transcript");
    let m = s.machine();
    assert_eq!(m.active_execution, None, "slot released");
    assert_eq!(m.state, MachineRecordState::Running);
    // The next command reads the file the terminal wrote.
    let cmd = Command::new(["cat", "/workspace/note.txt"]);
    let sub = Submit {
        key: key("after-1"),
        spec: spec_for(&cmd, &RunTarget::unverified(), WORKER, MACHINE).unwrap(),
    };
    let out = rt.run(sub).unwrap();
    assert_eq!(out.exit_code(), Some(0));
    assert_eq!(out.output.unwrap().stdout, b"TERMFILE-OK\n");
    assert_eq!(s.upgrades(), 1, "exactly one upgrade");
}

/// Duplicate opens: the same identity while active and completed, a
/// changed spec conflicts, never a second shell.
pub fn duplicate_open_keeps_one_identity_and_one_upgrade<T: TermShell>(kind: StoreKind) {
    let Some(s) = setup(kind) else { return };
    let rt: T = s.runtime();
    let k = key("term-dup");
    let spec = ManagedTerminalSpec::default();
    rt.open(&k, &s.machine, spec.clone()).unwrap();
    let mut h = rt.attach(&k, Duration::from_secs(10)).unwrap();
    h.input(b"echo up-$((1+1))\n").unwrap();
    read_until(&mut h, "up-2");
    let (again, existing) = rt.open(&k, &s.machine, spec.clone()).unwrap();
    assert!(existing);
    assert_eq!(again.key, k);
    assert!(!again.state.is_before_dispatch(), "{:?}", again.state);
    let changed = ManagedTerminalSpec {
        cols: 132,
        ..spec.clone()
    };
    let e = rt.open(&k, &s.machine, changed).unwrap_err();
    assert_eq!(e.category(), Category::IdentityConflict);
    h.input(b"exit 0\n").unwrap();
    assert_eq!(outcome_of(&mut h).unwrap().code, 0);
    assert_eq!(rt.wait(&k).unwrap().state, ExecState::Completed);
    let (done, existing) = rt.open(&k, &s.machine, spec).unwrap();
    assert!(existing);
    assert_eq!(done.state, ExecState::Completed);
    assert_eq!(s.upgrades(), 1, "never a second shell");
}

/// One consumer per handle: a second attach is `authentication`.
pub fn a_second_consumer_is_refused<T: TermShell>(kind: StoreKind) {
    let Some(s) = setup(kind) else { return };
    let rt: T = s.runtime();
    let k = key("term-2c");
    rt.open(&k, &s.machine, ManagedTerminalSpec::default())
        .unwrap();
    let mut h = rt.attach(&k, Duration::from_secs(10)).unwrap();
    let e = rt.attach(&k, Duration::from_secs(1)).unwrap_err();
    assert_eq!(e.category(), Category::Authentication);
    // The first consumer still drives the session.
    h.input(b"exit 3\n").unwrap();
    assert_eq!(outcome_of(&mut h).unwrap().code, 3);
    assert_eq!(rt.wait(&k).unwrap().state, ExecState::Completed);
}

/// Nobody attaches within `attach_ms`: the connection expires, the record
/// says so (uncertain, `terminal_consumer`), and a late attach is
/// `expired`.
pub fn attach_after_attach_ms_is_expired<T: TermShell>(kind: StoreKind) {
    let Some(s) = setup(kind) else { return };
    let rt: T = s.runtime();
    let k = key("term-late");
    let spec = ManagedTerminalSpec {
        attach_ms: 100,
        ..ManagedTerminalSpec::default()
    };
    rt.open(&k, &s.machine, spec).unwrap();
    let rec = rt.wait(&k).unwrap();
    assert_eq!(rec.state, ExecState::Unknown);
    let err = rec.last_error.clone().unwrap();
    assert_eq!(
        (err.category.as_str(), err.operation.as_str()),
        ("expired", "terminal_consumer")
    );
    let e = rt.attach(&k, Duration::from_secs(1)).unwrap_err();
    assert_eq!(e.category(), Category::Expired);
    // Unknown keeps the slot (C14.3): the machine needs resolution.
    assert_eq!(s.machine().active_execution, Some(k));
    assert_eq!(s.upgrades(), 1);
}

/// While the terminal holds the slot, a command is `admission_exhausted`
/// and stop/delete are refused; after it completes the slot is empty and
/// the command is taken.
pub fn the_terminal_holds_the_slot_until_it_completes<T: TermShell>(kind: StoreKind) {
    let Some(s) = setup(kind) else { return };
    let rt: T = s.runtime();
    let k = key("term-slot");
    rt.open(&k, &s.machine, ManagedTerminalSpec::default())
        .unwrap();
    let mut h = rt.attach(&k, Duration::from_secs(10)).unwrap();
    let cmd = s.command_record("cmd-1");
    let e = s.store.submit(&cmd, 100).unwrap_err();
    assert_eq!(e.category(), Category::AdmissionExhausted);
    let m = s.machine();
    for op in [MachineOperation::Stop, MachineOperation::Delete] {
        let e = s
            .store
            .request_machine(&s.machine, op, m.version, now_ms())
            .unwrap_err();
        assert_eq!(e.category(), Category::AdmissionExhausted, "{op:?}");
    }
    h.input(b"exit 0\n").unwrap();
    assert_eq!(outcome_of(&mut h).unwrap().code, 0);
    assert_eq!(rt.wait(&k).unwrap().state, ExecState::Completed);
    assert_eq!(s.machine().active_execution, None);
    let taken = s.store.submit(&s.command_record("cmd-2"), 100).unwrap();
    assert_eq!(
        taken.into_record().machine.unwrap().active_execution,
        Some(key("cmd-2"))
    );
}

/// Terminal bytes (input and output) never reach records, the database
/// files, tracing, errors or `Debug` output.
pub fn terminal_bytes_never_leave_memory<T: TermShell>(kind: StoreKind) {
    let capturing = crate::trace_capture::install();
    let Some(s) = setup(kind) else { return };
    let rt: T = s.runtime();
    let k = key("term-sentinel");
    rt.open(&k, &s.machine, ManagedTerminalSpec::default())
        .unwrap();
    let mut h = rt.attach(&k, Duration::from_secs(10)).unwrap();
    h.input(format!("echo {SENTINEL}-$((6*7))\n").as_bytes())
        .unwrap();
    let seen = read_until(&mut h, &format!("{SENTINEL}-42"));
    assert!(seen.contains(SENTINEL));
    let dbg = format!("{h:?}");
    assert!(!dbg.contains(SENTINEL), "{dbg}");
    // An error of the handle names no bytes either.
    let e = h.input(&vec![b'x'; 65_537]).unwrap_err();
    assert!(!format!("{e:?} {e}").contains(SENTINEL));
    h.input(b"exit 0\n").unwrap();
    let _ = outcome_of(&mut h);
    let rec = rt.wait(&k).unwrap();
    assert_eq!(rec.state, ExecState::Completed);
    assert!(!format!("{rec:?}").contains(SENTINEL));
    assert!(!format!("{:?}", s.machine()).contains(SENTINEL));
    assert!(
        capturing,
        "the capturing subscriber is this binary's default"
    );
    let traced = crate::trace_capture::text();
    assert!(!traced.contains(SENTINEL), "terminal bytes reached tracing");
    assert!(
        !traced.contains(TOKEN_SENTINEL),
        "the token reached tracing"
    );
    if kind != StoreKind::Sqlite {
        return;
    }
    let bytes = s.all_bytes();
    let has = |n: &str| bytes.windows(n.len()).any(|w| w == n.as_bytes());
    assert!(has("term-sentinel"), "the database was read");
    assert!(!has(SENTINEL), "terminal bytes stored in clear");
}

/// Instantiates every managed terminal case for `$shell` (a
/// [`TermShell`]), one `#[test]` per case and store.
#[macro_export]
macro_rules! managed_terminal_suite {
    ($shell:ty) => {
        mod sqlite {
            $crate::managed_terminal_suite!(@store $shell, $crate::managed_cases::StoreKind::Sqlite);
        }
        mod postgres {
            $crate::managed_terminal_suite!(@store $shell, $crate::managed_cases::StoreKind::Postgres);
        }
    };
    (@store $shell:ty, $kind:expr) => {
        $crate::managed_terminal_suite!(@cases $shell, $kind,
            seed_scenario_open_attach_exit_7,
            duplicate_open_keeps_one_identity_and_one_upgrade,
            a_second_consumer_is_refused,
            attach_after_attach_ms_is_expired,
            the_terminal_holds_the_slot_until_it_completes,
            terminal_bytes_never_leave_memory,
        );
    };
    (@cases $shell:ty, $kind:expr, $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                $crate::managed_terminal_cases::$case::<$shell>($kind);
            }
        )*
    };
}
