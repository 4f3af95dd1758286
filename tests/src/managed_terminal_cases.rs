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

use smolbox_core::Reason;
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
use smolbox_core::worker::{Endpoint, MachineName};
use smolbox_core::{Category, Error};
use smolbox_devworker::Route;
use smolbox_store::{Reserve, Store};

mod pacing;
mod recovery;
mod round_trips;
pub use pacing::{
    a_consumer_that_stops_reading_gets_output_limit,
    a_slow_live_consumer_gets_every_byte_and_the_exit,
};
pub use recovery::{
    another_controller_takes_the_machine_at_once_after_a_terminal_ends,
    recovery_keeps_a_recorded_exit_and_releases_the_slot,
    recovery_never_reopens_a_possibly_dispatched_session,
};
pub use round_trips::a_managed_terminal_checks_the_worker_before_acceptance_and_at_the_open;

use crate::TerminalEvent;
use crate::fixture::{Fixture, TOKEN_SENTINEL, Transport};
use crate::managed_cases::{StoreKind, fresh_store};

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
    fn start(
        store: Arc<dyn Store>,
        key: FingerprintKey,
        endpoint: Endpoint,
        machines: bool,
    ) -> Result<Self, Error> {
        Self::start_as(store, key, endpoint, machines, OWNER)
    }
    /// As [`TermShell::start`] under controller id `owner`.
    ///
    /// # Errors
    /// The builder's.
    fn start_as(
        store: Arc<dyn Store>,
        key: FingerprintKey,
        endpoint: Endpoint,
        machines: bool,
        owner: &str,
    ) -> Result<Self, Error> {
        Self::start_with(store, key, endpoint, machines, owner, None)
    }
    /// As [`TermShell::start_as`] with claim/lease TTL `ttl_ms` (`None`:
    /// the builder's default).
    ///
    /// # Errors
    /// The builder's.
    fn start_with(
        store: Arc<dyn Store>,
        key: FingerprintKey,
        endpoint: Endpoint,
        machines: bool,
        owner: &str,
        ttl_ms: Option<u64>,
    ) -> Result<Self, Error>;
    /// `terminals().cancel`.
    ///
    /// # Errors
    /// The store's.
    fn cancel(&self, key: &RecordKey) -> Result<ExecutionRecord, Error>;
    /// `machines().create` then `wait`, `start`, `wait`: a running machine.
    ///
    /// # Errors
    /// As the runtime's.
    fn running_machine(
        &self,
        key: &RecordKey,
        spec: &RetainedMachineSpec,
    ) -> Result<MachineRecord, Error>;
    /// `machines().submit` then `Runtime::wait`.
    ///
    /// # Errors
    /// As the runtime's (`admission_exhausted` while the slot is held).
    fn slot_command(
        &self,
        machine: &RecordKey,
        key: &RecordKey,
        command: &Command,
    ) -> Result<Outcome, Error>;
    /// `machines().submit` only (returns at durable acceptance).
    ///
    /// # Errors
    /// As the runtime's (`admission_exhausted` while the slot is held).
    fn submit_only(
        &self,
        machine: &RecordKey,
        key: &RecordKey,
        command: &Command,
    ) -> Result<ExecutionRecord, Error>;
    /// `Runtime::wait` on a command.
    ///
    /// # Errors
    /// As the runtime's.
    fn wait_command(&self, key: &RecordKey) -> Result<Outcome, Error>;
    /// `machines().stop` / `delete` (then `wait`).
    ///
    /// # Errors
    /// As the runtime's.
    fn lifecycle(
        &self,
        machine: &RecordKey,
        op: MachineOperation,
        version: u64,
    ) -> Result<MachineRecord, Error>;
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
    /// `unread_bytes`.
    fn unread_bytes(&self) -> usize;
}

/// A shell's runtime builder `$b` with the worker `$client` (when
/// `$machines`, the profile `$admit` returns and the image source), owner
/// `$owner`, a 100 ms poll and, if given, the lease TTL `$ttl`. A macro:
/// the two shells' builders and clients share no trait.
macro_rules! configured {
    ($b:expr, $client:expr, $machines:expr, $owner:expr, $ttl:expr, $admit:expr) => {{
        let b = $b;
        let b = if $machines {
            let profile = $admit?;
            b.worker_with_profile(WORKER, $client, profile)
                .machine_source(WORKER, crate::cases::image_spec().source)
        } else {
            b.worker(WORKER, $client)
        };
        let b = b.owner($owner).poll_interval_ms(100);
        match $ttl {
            Some(ttl) => b.lease_ttl_ms(ttl),
            None => b,
        }
    }};
}

fn builder_parts(endpoint: Endpoint) -> Result<smolbox_blocking::Client, Error> {
    smolbox_blocking::Client::new(endpoint)
}

/// `smolbox_blocking::Runtime` as a [`TermShell`].
#[derive(Debug)]
pub struct BlockingTerm(smolbox_blocking::Runtime);

impl TermShell for BlockingTerm {
    type Handle = smolbox_blocking::ManagedTerminal;
    fn start_with(
        store: Arc<dyn Store>,
        key: FingerprintKey,
        endpoint: Endpoint,
        machines: bool,
        owner: &str,
        ttl_ms: Option<u64>,
    ) -> Result<Self, Error> {
        let client = builder_parts(endpoint)?;
        let b = smolbox_blocking::Runtime::builder(store, key);
        let b = configured!(b, client, machines, owner, ttl_ms, client.admit(&[]));
        Ok(Self(b.build()?))
    }
    fn cancel(&self, key: &RecordKey) -> Result<ExecutionRecord, Error> {
        self.0.terminals().cancel(key)
    }
    fn running_machine(
        &self,
        key: &RecordKey,
        spec: &RetainedMachineSpec,
    ) -> Result<MachineRecord, Error> {
        let m = self.0.machines();
        m.create(key, spec)?;
        let rec = m.wait(key, 30_000)?;
        m.start(key, rec.version)?;
        m.wait(key, 30_000)
    }
    fn slot_command(
        &self,
        machine: &RecordKey,
        key: &RecordKey,
        command: &Command,
    ) -> Result<Outcome, Error> {
        self.0.machines().submit(machine, key, command)?;
        self.0.wait(key, 30_000)
    }
    fn submit_only(
        &self,
        machine: &RecordKey,
        key: &RecordKey,
        command: &Command,
    ) -> Result<ExecutionRecord, Error> {
        self.0
            .machines()
            .submit(machine, key, command)
            .map(|(e, _, _)| e)
    }
    fn wait_command(&self, key: &RecordKey) -> Result<Outcome, Error> {
        self.0.wait(key, 30_000)
    }
    fn lifecycle(
        &self,
        machine: &RecordKey,
        op: MachineOperation,
        version: u64,
    ) -> Result<MachineRecord, Error> {
        let m = self.0.machines();
        match op {
            MachineOperation::Stop => m.stop(machine, version)?,
            _ => m.delete(machine, version)?,
        };
        m.wait(machine, 30_000)
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
    fn unread_bytes(&self) -> usize {
        Self::unread_bytes(self)
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
    fn start_with(
        store: Arc<dyn Store>,
        key: FingerprintKey,
        endpoint: Endpoint,
        machines: bool,
        owner: &str,
        ttl_ms: Option<u64>,
    ) -> Result<Self, Error> {
        let rt = crate::tokio_shell::runtime(2)?;
        let client = smolbox_tokio::Client::new(endpoint)?;
        let b = smolbox_tokio::Runtime::builder(store, key);
        let b = configured!(
            b,
            client,
            machines,
            owner,
            ttl_ms,
            rt.block_on(client.admit(&[]))
        );
        let runtime = {
            let _guard = rt.enter();
            b.build()?
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
    fn cancel(&self, key: &RecordKey) -> Result<ExecutionRecord, Error> {
        self.rt.block_on(self.runtime.terminals().cancel(key))
    }
    fn running_machine(
        &self,
        key: &RecordKey,
        spec: &RetainedMachineSpec,
    ) -> Result<MachineRecord, Error> {
        let m = self.runtime.machines();
        self.rt.block_on(async {
            m.create(key, spec).await?;
            let rec = m.wait(key, 30_000).await?;
            m.start(key, rec.version).await?;
            m.wait(key, 30_000).await
        })
    }
    fn slot_command(
        &self,
        machine: &RecordKey,
        key: &RecordKey,
        command: &Command,
    ) -> Result<Outcome, Error> {
        self.rt.block_on(async {
            self.runtime
                .machines()
                .submit(machine, key, command)
                .await?;
            self.runtime.wait(key, 30_000).await
        })
    }
    fn submit_only(
        &self,
        machine: &RecordKey,
        key: &RecordKey,
        command: &Command,
    ) -> Result<ExecutionRecord, Error> {
        self.rt
            .block_on(self.runtime.machines().submit(machine, key, command))
            .map(|(e, _, _)| e)
    }
    fn wait_command(&self, key: &RecordKey) -> Result<Outcome, Error> {
        self.rt.block_on(self.runtime.wait(key, 30_000))
    }
    fn lifecycle(
        &self,
        machine: &RecordKey,
        op: MachineOperation,
        version: u64,
    ) -> Result<MachineRecord, Error> {
        let m = self.runtime.machines();
        self.rt.block_on(async {
            match op {
                MachineOperation::Stop => m.stop(machine, version).await?,
                _ => m.delete(machine, version).await?,
            };
            m.wait(machine, 30_000).await
        })
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
    fn unread_bytes(&self) -> usize {
        self.h.unread_bytes()
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
    let (dir, key, store) = fresh_store(kind, "managed terminal suite", "term", 't')?;
    let fixture = Fixture::start(Transport::Tcp);
    let client = smolbox_blocking::Client::new(fixture.endpoint(Fixture::budgets())).unwrap();
    let profile = client.admit(&[]).unwrap();
    client
        .create(
            &profile,
            MachineName::new(MACHINE).unwrap(),
            &crate::cases::image_spec(),
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
    /// The machine once its slot is empty, polled (bounded, at most 30 s):
    /// a slot's finish runs in a runtime's background with no waiter of
    /// its own. The last read if it never emptied.
    fn slot_emptied(&self) -> MachineRecord {
        let mut m = self.machine();
        for _ in 0..3_000 {
            if m.active_execution.is_none() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
            m = self.machine();
        }
        m
    }

    fn runtime<T: TermShell>(&self) -> T {
        T::start(
            Arc::clone(&self.store),
            self.key.clone(),
            self.fixture.endpoint(Fixture::budgets()),
            false,
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
            other => panic!("unexpected event before {needle:?}: {other:?}"),
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

/// C7.4: a managed terminal on a machine whose worker machine is not an
/// image machine is refused before acceptance (`unsupported_capability`,
/// `needs_plain_image_machine`, `not_dispatched`): no record, the slot
/// free, no upgrade; the worker saw only the inspect. The slot then takes
/// an ordinary command.
pub fn a_terminal_on_an_imageless_machine_is_refused_unsent<T: TermShell>(kind: StoreKind) {
    let Some(s) = setup(kind) else { return };
    let client = smolbox_blocking::Client::new(s.fixture.endpoint(Fixture::budgets())).unwrap();
    let profile = client.admit(&[]).unwrap();
    let name = MachineName::new(MACHINE).unwrap();
    client.delete(name.clone()).unwrap();
    client
        .create(
            &profile,
            name,
            &smolbox_core::worker::MachineSpec::default(),
        )
        .unwrap();
    let rt: T = s.runtime();
    let k = key("term-bare");
    let gets = s.fixture.worker.request_count(Route::MachineGet);
    let e = rt
        .open(&k, &s.machine, ManagedTerminalSpec::default())
        .unwrap_err();
    assert_eq!(
        (e.category(), e.reason(), e.evidence()),
        (
            Category::UnsupportedCapability,
            Reason::NeedsPlainImageMachine,
            smolbox_core::Evidence::NotDispatched
        ),
        "{e:?}"
    );
    assert!(s.fixture.worker.request_count(Route::MachineGet) > gets);
    assert_eq!(s.upgrades(), 0, "nothing opened");
    assert!(s.store.fetch(&k).is_err(), "nothing accepted");
    assert_eq!(s.machine().active_execution, None, "the slot untouched");
    let sub = Submit {
        key: key("after-bare"),
        spec: spec_for(
            &Command::new(["true"]),
            &RunTarget::unverified(),
            WORKER,
            MACHINE,
        )
        .unwrap(),
    };
    assert_eq!(rt.run(sub).unwrap().exit_code(), Some(0));
}

/// The seed scenario through the retained-machine API: a machine created
/// and started by the runtime, a terminal in its slot (commands refused
/// with `admission_exhausted`, stop / delete refused), `pwd`, a file,
/// resize, `exit 7` → `completed` with no transcript, the slot released,
/// a slot command reads the file, and the machine is deleted.
pub fn seed_scenario_on_a_created_machine<T: TermShell>(kind: StoreKind) {
    let Some(s) = setup(kind) else { return };
    let rt = T::start(
        Arc::clone(&s.store),
        s.key.clone(),
        s.fixture.endpoint(Fixture::budgets()),
        true,
    )
    .unwrap();
    let mk = RecordKey::new("boxes", "box-1").unwrap();
    let m = rt.running_machine(&mk, &machine_spec()).unwrap();
    assert_eq!(m.state, MachineRecordState::Running, "{:?}", m.last_error);
    let bx = |id: &str| RecordKey::new("boxes", id).unwrap();
    let k = bx("term-box");
    let (rec, existing) = rt.open(&k, &mk, ManagedTerminalSpec::default()).unwrap();
    assert!(!existing);
    assert_eq!(rec.spec.machine.as_ref(), Some(&mk));
    let mut h = rt.attach(&k, Duration::from_secs(10)).unwrap();
    h.input(b"echo \"pwd=$(pwd)\"\n").unwrap();
    read_until(&mut h, "pwd=/");
    let held = rt
        .slot_command(&mk, &bx("cmd-busy"), &Command::new(["true"]))
        .unwrap_err();
    assert_eq!(held.category(), Category::AdmissionExhausted);
    let version = s.store.fetch_machine(&mk).unwrap().version;
    for op in [MachineOperation::Stop, MachineOperation::Delete] {
        let e = rt.lifecycle(&mk, op, version).unwrap_err();
        assert_eq!(e.category(), Category::AdmissionExhausted, "{op:?}");
    }
    h.input(b"mkdir -p workspace && echo BOXFILE-OK > workspace/box.txt && echo wrote-it\n")
        .unwrap();
    read_until(&mut h, "wrote-it");
    h.resize(90, 30).unwrap();
    h.input(b"stty size\n").unwrap();
    read_until(&mut h, "30 90");
    h.input(b"exit 7\n").unwrap();
    assert_eq!(outcome_of(&mut h).unwrap(), TerminalExit { code: 7 });
    let rec = rt.wait(&k).unwrap();
    assert_eq!(
        (rec.state, rec.result.clone()),
        (
            ExecState::Completed,
            Some(ExecResult::Terminal { exit_code: 7 })
        )
    );
    assert!(rec.artifacts.is_empty());
    assert_eq!(s.store.fetch_machine(&mk).unwrap().active_execution, None);
    let out = rt
        .slot_command(
            &mk,
            &bx("cmd-read"),
            &Command::new(["cat", "/workspace/box.txt"]),
        )
        .unwrap();
    assert_eq!(out.exit_code(), Some(0), "{:?}", out.error);
    assert_eq!(out.output.unwrap().stdout, b"BOXFILE-OK\n");
    let version = s.store.fetch_machine(&mk).unwrap().version;
    let gone = rt
        .lifecycle(&mk, MachineOperation::Delete, version)
        .unwrap();
    assert_eq!(
        gone.state,
        MachineRecordState::Deleted,
        "{:?}",
        gone.last_error
    );
    assert_eq!(s.upgrades(), 1);
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

/// A stalled consumer: output beyond the buffer ends the session with an
/// uncertain `output_limit` (AC-7.3.1), never a fabricated exit.
pub fn a_stalled_consumer_hits_output_limit<T: TermShell>(kind: StoreKind) {
    let Some(s) = setup(kind) else { return };
    let rt: T = s.runtime();
    let k = key("term-flood");
    let spec = ManagedTerminalSpec {
        buffer_bytes: 1_024,
        ..ManagedTerminalSpec::default()
    };
    rt.open(&k, &s.machine, spec).unwrap();
    let mut h = rt.attach(&k, Duration::from_secs(10)).unwrap();
    h.input(b"head -c 300000 /dev/zero | tr '\\0' x; exit 0\n")
        .unwrap();
    // The consumer reads nothing until the session ended.
    let rec = rt.wait(&k).unwrap();
    assert_eq!((rec.state, rec.result.clone()), (ExecState::Unknown, None));
    assert_eq!(
        rec.last_error.as_ref().map(|e| e.category.as_str()),
        Some("output_limit")
    );
    let outcome = outcome_of(&mut h).unwrap_err();
    assert_eq!(outcome.category(), Category::OutputLimit);
    assert_eq!(
        s.machine().active_execution,
        Some(k),
        "unknown keeps the slot"
    );
}

/// Cancel after dispatch closes observation and keeps the outcome
/// uncertain; the consumer sees the end.
pub fn cancel_after_dispatch_keeps_uncertainty<T: TermShell>(kind: StoreKind) {
    let Some(s) = setup(kind) else { return };
    let rt: T = s.runtime();
    let k = key("term-cancel");
    rt.open(&k, &s.machine, ManagedTerminalSpec::default())
        .unwrap();
    let mut h = rt.attach(&k, Duration::from_secs(10)).unwrap();
    h.input(b"echo live-$((2+3))\n").unwrap();
    read_until(&mut h, "live-5");
    let rec = rt.cancel(&k).unwrap();
    assert!(rec.cancel_requested_at_ms.is_some());
    let outcome = outcome_of(&mut h);
    assert!(outcome.is_err(), "{outcome:?}");
    let rec = rt.wait(&k).unwrap();
    assert_eq!((rec.state, rec.result.clone()), (ExecState::Unknown, None));
    assert_eq!(s.upgrades(), 1);
}

/// The C7.1 bounds through the managed path: a session budget over the
/// profile's execution budget is refused before anything is stored; input
/// at N is taken and N+1 refused.
pub fn managed_bounds_at_n_and_n_plus_1<T: TermShell>(kind: StoreKind) {
    let Some(s) = setup(kind) else { return };
    let rt: T = s.runtime();
    let budget = s.machine().spec.profile.budgets.execution_ms;
    let over = ManagedTerminalSpec {
        session_ms: budget + 1,
        ..ManagedTerminalSpec::default()
    };
    let e = rt.open(&key("term-over"), &s.machine, over).unwrap_err();
    assert_eq!(
        (e.category(), e.reason()),
        (Category::Validation, Reason::SessionOverBudget)
    );
    assert_eq!(
        s.store.fetch(&key("term-over")).unwrap_err().category(),
        Category::NotFound
    );
    let spec = ManagedTerminalSpec {
        session_ms: budget,
        idle_ms: budget,
        input_bytes: 16,
        ..ManagedTerminalSpec::default()
    };
    let k = key("term-n");
    rt.open(&k, &s.machine, spec).unwrap();
    let mut h = rt.attach(&k, Duration::from_secs(10)).unwrap();
    let e = h.input(b"echo 17-bytes-xx\n").unwrap_err();
    assert_eq!(e.category(), Category::Validation);
    h.input(b"echo sixteen-bb\n").unwrap();
    read_until(&mut h, "sixteen-bb");
    h.input(b"exit 0\n").unwrap();
    assert_eq!(outcome_of(&mut h).unwrap().code, 0);
    assert_eq!(s.upgrades(), 1);
}

/// Another controller sees the record and may cancel, but never takes the
/// live connection over.
pub fn another_controller_never_takes_over<T: TermShell>(kind: StoreKind) {
    let Some(s) = setup(kind) else { return };
    let rt: T = s.runtime();
    let other = T::start_as(
        Arc::clone(&s.store),
        s.key.clone(),
        s.fixture.endpoint(Fixture::budgets()),
        false,
        "ctl-term-other",
    )
    .unwrap();
    let k = key("term-own");
    rt.open(&k, &s.machine, ManagedTerminalSpec::default())
        .unwrap();
    let mut h = rt.attach(&k, Duration::from_secs(10)).unwrap();
    h.input(b"echo mine\n").unwrap();
    read_until(&mut h, "mine");
    let e = other.attach(&k, Duration::from_millis(200)).unwrap_err();
    assert_eq!(e.category(), Category::NotFound, "not live there");
    // The duplicate open elsewhere reports the identity and opens nothing.
    let (rec, existing) = other
        .open(&k, &s.machine, ManagedTerminalSpec::default())
        .unwrap();
    assert!(existing && !rec.state.is_before_dispatch());
    h.input(b"exit 4\n").unwrap();
    assert_eq!(outcome_of(&mut h).unwrap().code, 4);
    assert_eq!(rt.wait(&k).unwrap().state, ExecState::Completed);
    assert_eq!(s.upgrades(), 1);
}

/// Two controllers on one store (issue 13: on PostgreSQL, each with its own
/// connection) race a terminal open against a command submit for one
/// machine's slot: exactly one holds it, the other is refused
/// `admission_exhausted` with nothing sent; the winner runs once and the
/// slot empties after it.
pub fn a_terminal_and_a_command_race_for_one_slot<T: TermShell + Sync>(kind: StoreKind) {
    let Some(s) = setup(kind) else { return };
    let a: T = s.runtime();
    let b = T::start_as(
        Arc::clone(&s.store),
        s.key.clone(),
        s.fixture.endpoint(Fixture::budgets()),
        true,
        "ctl-term-race",
    )
    .unwrap();
    let gate = s.dir.path().join("race-gate");
    let (tk, ck) = (key("term-race"), key("cmd-race"));
    let barrier = std::sync::Barrier::new(2);
    let (opened, submitted) = std::thread::scope(|t| {
        let o = t.spawn(|| {
            barrier.wait();
            a.open(&tk, &s.machine, ManagedTerminalSpec::default())
        });
        let c = t.spawn(|| {
            barrier.wait();
            b.submit_only(&s.machine, &ck, &crate::managed_cases::gated(&gate))
        });
        (o.join().unwrap(), c.join().unwrap())
    });
    let holder = s.machine().active_execution;
    match (&opened, &submitted) {
        (Ok(_), Err(e)) => {
            assert_eq!(e.category(), Category::AdmissionExhausted, "{e:?}");
            assert_eq!(holder.as_ref(), Some(&tk));
            let mut h = a.attach(&tk, Duration::from_secs(10)).unwrap();
            h.input(b"exit 0\n").unwrap();
            assert_eq!(outcome_of(&mut h).unwrap().code, 0);
            assert_eq!(a.wait(&tk).unwrap().state, ExecState::Completed);
            assert_eq!(s.upgrades(), 1);
            assert!(
                s.store
                    .fetch(&ck)
                    .is_err_and(|e| e.category() == Category::NotFound)
            );
        }
        (Err(e), Ok(_)) => {
            assert_eq!(e.category(), Category::AdmissionExhausted, "{e:?}");
            assert_eq!(holder.as_ref(), Some(&ck));
            crate::managed_cases::open(&gate);
            // The command's own record ends; its slot finish then waits
            // for the setup's machine claim (the other controller's, 60 s),
            // so the slot is not waited for here.
            let mut c = s.store.fetch(&ck).unwrap();
            for _ in 0..3_000 {
                if c.state.is_terminal() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
                c = s.store.fetch(&ck).unwrap();
            }
            assert_eq!(c.state, ExecState::Completed, "{c:?}");
            assert_eq!(s.upgrades(), 0, "the refused terminal never opened");
            assert_eq!(s.fixture.worker.request_count(Route::Exec), 1);
            assert!(
                s.store
                    .fetch(&tk)
                    .is_err_and(|e| e.category() == Category::NotFound)
            );
            return;
        }
        other => panic!("exactly one must hold the slot: {other:?}"),
    }
    let m = s.slot_emptied();
    assert_eq!(
        m.active_execution, None,
        "the slot empties after the winner"
    );
}

/// Instantiates every managed terminal case for `$shell` (a
/// [`TermShell`]), one `#[test]` per case and store.
#[macro_export]
macro_rules! managed_terminal_suite {
    ($shell:ty) => {
        $crate::store_suite!(
            $shell,
            managed_terminal_cases,
            sqlite,
            postgres,
            [
                seed_scenario_open_attach_exit_7,
                seed_scenario_on_a_created_machine,
                duplicate_open_keeps_one_identity_and_one_upgrade,
                a_second_consumer_is_refused,
                attach_after_attach_ms_is_expired,
                the_terminal_holds_the_slot_until_it_completes,
                terminal_bytes_never_leave_memory,
                a_stalled_consumer_hits_output_limit,
                cancel_after_dispatch_keeps_uncertainty,
                managed_bounds_at_n_and_n_plus_1,
                another_controller_never_takes_over,
                a_terminal_and_a_command_race_for_one_slot,
                recovery_never_reopens_a_possibly_dispatched_session,
                recovery_keeps_a_recorded_exit_and_releases_the_slot,
                another_controller_takes_the_machine_at_once_after_a_terminal_ends,
                a_terminal_on_an_imageless_machine_is_refused_unsent,
                a_managed_terminal_checks_the_worker_before_acceptance_and_at_the_open,
                a_slow_live_consumer_gets_every_byte_and_the_exit,
                a_consumer_that_stops_reading_gets_output_limit,
            ]
        );
    };
}
