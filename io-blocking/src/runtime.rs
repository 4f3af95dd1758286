//! The managed runtime (DESIGN.md §5a): a driver of one
//! [`smolbox_core::managed::controller::Controller`] per runtime.
//!
//! The driver thread runs the shared driver's turns
//! ([`smolbox_store::runtime::Driver`] over the controller's bookkeeping,
//! written once with the tokio shell). It
//! performs the controller's store ops itself, one after another, through
//! [`smolbox_store::apply_op`] (a store op is a blocking call either way,
//! and the controller's ops were serialised on one store thread before;
//! performing them on the driver thread saves two thread hand-offs per op,
//! docs/decisions/performance.md, session 11), its worker ops each on a thread of its own
//! while it runs (at most one per execution, so at most `max_active`;
//! a finished op's thread waits for the next op, up to a few, see
//! `runtime/worker_threads.rs`) through the
//! configured workers' [`Client`]s, feeds every answer back, and wakes at
//! the controller's `poll_timeout`. It makes no decision of its own:
//! acceptance, dispatch, renewal, cancellation, deadlines and recovery are
//! the controller's.
//!
//! The public API is the same in both shells: [`Runtime::builder`] →
//! [`RuntimeBuilder::build`], then [`Runtime::submit`] (returns at durable
//! acceptance), [`Runtime::fetch`], [`Runtime::wait`] (never cancels, safe
//! to repeat), [`Runtime::cancel`], [`Runtime::reconcile`],
//! [`Runtime::shutdown`] and [`Runtime::run`] (submit + wait).

use smolbox_core::Reason;
use std::collections::{BTreeMap, VecDeque};
use std::panic::AssertUnwindSafe;
use std::sync::mpsc;
use std::sync::{Arc, Condvar, PoisonError};
use std::time::{Duration, Instant};

use smolbox_core::managed::controller::machine_settled;
use smolbox_core::managed::controller::machines::{check_list_limit, check_wait_ms};
pub use smolbox_core::managed::controller::{
    MachineAnswer, MachineRequest, Outcome, RequestId, Resolution, Submission, Telemetry,
};
use smolbox_core::managed::controller::{
    OpId, StoreOp, Submit, WorkerOp, WorkerReply, WorkerResult,
};
use smolbox_core::managed::state::MachineOperation;
use smolbox_core::managed::{CommandFiles, MachineRecord, RetainedMachineSpec};
use smolbox_core::managed::{ExecutionRecord, FingerprintKey, RecordKey};
use smolbox_core::{Category, Error, Evidence, Operation};
use smolbox_store::Page;
use smolbox_store::Store;
use smolbox_store::artifacts::Artifacts;
pub use smolbox_store::keys::{key_file, load_or_create_keys};
use smolbox_store::runtime::{
    Answer, Build, Builder, Command, Driver, Input, MachineCall, Perform, Reply, Shared, Turn,
    files, lock, machine_call, reply, stopped, wait_expired,
};
pub use smolbox_store::runtime::{
    Clock, MAX_NOTICES, MAX_WAIT_MS, SystemClock, WAIT_POLL, default_owner,
};

use crate::Client;
use crate::managed_terminal::ManagedTerminals;

mod stream;
mod worker_threads;

use worker_threads::WorkerThreads;

/// Options of a [`Runtime`] (C12.1); [`RuntimeBuilder::build`] checks them
/// and starts the driver thread.
pub type RuntimeBuilder = Builder<Runtime>;

impl Build for Runtime {
    type Client = Client;

    fn build(builder: RuntimeBuilder) -> Result<Self, Error> {
        let p = builder.into_parts()?;
        let terminals = ManagedTerminals::new(&p)?;
        let shared = Arc::new(Shared::new(p.notices));
        let (tx, rx) = mpsc::channel::<Input>();
        let streams = Arc::new(stream::Sinks::default());
        let io = Io {
            terminals: terminals.clone(),
            clients: p.clients,
            workers: WorkerThreads::new(tx.clone()),
            store: Arc::clone(&p.store),
            stored: VecDeque::new(),
            streams: Arc::clone(&streams),
            artifacts: p.artifacts,
        };
        let driver = Driver::new(p.host, Arc::clone(&shared), io);
        let span = p.span;
        std::thread::Builder::new()
            .name("smolbox-runtime".into())
            .spawn(move || {
                let _entered = span.enter();
                drive(driver, &rx);
            })
            .map_err(|_| THREAD_SPAWN)?;
        Ok(Self {
            store: p.store,
            cmd: tx,
            shared,
            terminals,
            streams,
        })
    }
}

/// A thread of the runtime could not be started: nothing was sent.
const THREAD_SPAWN: Error = Error::unknown(
    Operation::Config,
    Evidence::NotDispatched,
    Reason::ThreadSpawn,
);

/// Runs managed commands through a controller over a durable store.
pub struct Runtime {
    store: Arc<dyn Store>,
    cmd: mpsc::Sender<Input>,
    shared: Arc<Shared<Condvar>>,
    terminals: ManagedTerminals,
    /// Sinks of the streamed executions callers wait for.
    streams: Arc<stream::Sinks>,
}

impl Drop for Runtime {
    fn drop(&mut self) {
        // The driver finishes what is in flight, then exits.
        let _ = self.cmd.send(Input::Close);
    }
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime").finish_non_exhaustive()
    }
}

impl Runtime {
    /// A builder over `store` with the host's fingerprint key (32–4,096
    /// bytes, stable across restarts, distinct from the encryption key).
    pub fn builder(store: Arc<dyn Store>, fingerprint_key: FingerprintKey) -> RuntimeBuilder {
        RuntimeBuilder::new(store, fingerprint_key)
    }

    /// The managed terminals of this runtime (C7.4): `open`, `attach`,
    /// `cancel`, `recover`; live connections belong to this runtime.
    pub fn terminals(&self) -> &ManagedTerminals {
        &self.terminals
    }

    /// Sends one request to the driver and waits for its answer.
    fn ask<T: Send + 'static>(
        &self,
        op: Operation,
        make: impl FnOnce(Reply<Result<T, Error>>) -> Command,
    ) -> Result<T, Error> {
        let (tx, rx) = mpsc::channel();
        self.cmd
            .send(Input::Command(make(reply(move |v| tx.send(v).is_ok()))))
            .map_err(|_| stopped(op))?;
        rx.recv().map_err(|_| stopped(op))?
    }

    /// Submits a command; returns once the record is durable (or already
    /// was, `existing`). Nothing is sent before that.
    ///
    /// # Errors
    /// `validation` / `unsupported_capability` (nothing stored),
    /// `identity_conflict` for a changed spec under the same key,
    /// `admission_exhausted`, or the store's error (never read as absence;
    /// an ambiguous acceptance is resolved by submitting the same spec again).
    pub fn submit(&self, submit: Submit) -> Result<Submission, Error> {
        self.ask(Operation::Submit, |r| Command::Submit(Box::new(submit), r))
    }

    /// The stored record.
    ///
    /// # Errors
    /// `not_found` only when the store positively reports absence; `store`
    /// on failure.
    pub fn fetch(&self, key: &RecordKey) -> Result<ExecutionRecord, Error> {
        self.store.fetch(key)
    }

    /// Waits up to `timeout_ms` (0–900,000) for the record to be terminal
    /// or `unknown`. Never cancels; safe to repeat.
    ///
    /// # Errors
    /// `validation` for a bad timeout; `expired` (operation `await`) when
    /// the time ran out; the store's error.
    pub fn wait(&self, key: &RecordKey, timeout_ms: u64) -> Result<Outcome, Error> {
        self.wait_from(key, timeout_ms, None)
    }

    /// [`Runtime::wait`] by a waiter that already saw the record at
    /// version `seen` (its submission's acceptance).
    fn wait_from(
        &self,
        key: &RecordKey,
        timeout_ms: u64,
        mut seen: Option<u64>,
    ) -> Result<Outcome, Error> {
        if timeout_ms > MAX_WAIT_MS {
            return Err(Error::validation(Operation::Await, Reason::WaitTimeout)
                .with_limit(timeout_ms, MAX_WAIT_MS));
        }
        let mut read_at = Instant::now();
        let deadline = read_at + Duration::from_millis(timeout_ms);
        // `seen`: the version this wait last saw; a finished notice of a
        // newer terminal record settles without another read, and while
        // this runtime drives the key the notice is waited for.
        loop {
            let mut n = lock(&self.shared.notices);
            if let Some(v) = seen
                && let Some(o) = n.settle_on_notice(key, v)
            {
                return Ok(o);
            }
            if n.needs_read(key, seen, read_at.elapsed()) {
                drop(n);
                let record = self.fetch(key)?;
                read_at = Instant::now();
                seen = Some(record.version);
                n = lock(&self.shared.notices);
                if let Some(o) = n.settle(key, record) {
                    return Ok(o);
                }
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(wait_expired());
            }
            let step = (deadline - now).min(WAIT_POLL);
            let _ = self
                .shared
                .changed
                .wait_timeout(n, step)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Requests cancellation (C16); returns the record with the persisted
    /// cancel time. Cancelling a finished record changes nothing.
    ///
    /// # Errors
    /// `not_found` for an absent record; the store's error.
    pub fn cancel(&self, key: &RecordKey) -> Result<ExecutionRecord, Error> {
        self.ask(Operation::Cancel, |r| Command::Cancel(key.clone(), r))
    }

    /// Takes the lifecycle telemetry delivered so far (C20): identifiers,
    /// states and evidence only. Bounded and lossy: an entry's `epoch` and
    /// `dropped` say whether entries were lost before it.
    pub fn telemetry(&self) -> Vec<Telemetry> {
        lock(&self.shared.notices).take_telemetry()
    }

    /// Schedules a due scan now (observation only; never a replay).
    pub fn reconcile(&self) {
        let _ = self.cmd.send(Input::Command(Command::Reconcile));
    }

    /// Stops taking work and returns once nothing is outstanding
    /// (executions already dispatched are driven to their end) and the
    /// claims this runtime held are released, so the next controller need
    /// not wait out the TTL (C15; a crash releases nothing). Dropping the
    /// runtime starts the same shutdown without waiting for it.
    pub fn shutdown(&self) {
        let (tx, rx) = mpsc::channel();
        if self
            .cmd
            .send(Input::Command(Command::Shutdown(reply(move |v| {
                tx.send(v).is_ok()
            }))))
            .is_ok()
        {
            let _ = rx.recv();
        }
    }

    /// [`Runtime::submit`], then [`Runtime::wait`] until the record is
    /// terminal or `unknown`.
    ///
    /// # Errors
    /// As [`Runtime::submit`] and [`Runtime::wait`].
    pub fn run(&self, submit: Submit) -> Result<Outcome, Error> {
        let s = self.submit(submit)?;
        loop {
            match self.wait_from(&s.key, MAX_WAIT_MS, Some(s.version)) {
                Err(e)
                    if e.category() == Category::Expired && e.operation() == Operation::Await => {}
                other => return other,
            }
        }
    }
}

/// Retained machines through the runtime (C14, C17.3): every request goes
/// through the controller; `list`, `inspect` and `wait` read the store.
#[derive(Debug)]
pub struct Machines<'a> {
    rt: &'a Runtime,
}

impl Machines<'_> {
    fn call<T: Send + 'static>(&self, call: MachineCall<T>) -> Result<T, Error> {
        let (req, read) = call.into_parts();
        let answer = self
            .rt
            .ask(Operation::Submit, |r| Command::Machine(Box::new(req), r))?;
        read(answer)
    }

    /// Creates a machine (deduplicated by scoped fingerprint, tombstones
    /// included); returns the durable record and whether it already existed.
    ///
    /// # Errors
    /// `validation`, `identity_conflict`, `admission_exhausted`, the store's.
    pub fn create(
        &self,
        key: &RecordKey,
        spec: &RetainedMachineSpec,
    ) -> Result<(MachineRecord, bool), Error> {
        self.call(machine_call::create(key, spec))
    }

    /// Machines of `scope` (deleted included), by id after `cursor`;
    /// `limit` 1–100, default 20.
    ///
    /// # Errors
    /// `validation` for a bad limit; the store's error.
    pub fn list(
        &self,
        scope: &str,
        cursor: Option<&str>,
        limit: Option<u32>,
    ) -> Result<Page<MachineRecord>, Error> {
        let limit = check_list_limit(limit)?;
        self.rt.store.list_machines(scope, cursor, limit)
    }

    /// The stored record (store only).
    ///
    /// # Errors
    /// `not_found` only on positive absence; the store's error.
    pub fn inspect(&self, key: &RecordKey) -> Result<MachineRecord, Error> {
        self.rt.store.fetch_machine(key)
    }

    /// Waits up to `timeout_ms` (0–900,000) until the machine is idle or
    /// `unknown` / `missing` / `conflict` / `deleted`.
    ///
    /// # Errors
    /// `validation` for a bad timeout; `expired` when time ran out.
    pub fn wait(&self, key: &RecordKey, timeout_ms: u64) -> Result<MachineRecord, Error> {
        check_wait_ms(timeout_ms)?;
        let deadline = Instant::now() + Duration::from_millis(timeout_ms);
        loop {
            let rec = self.inspect(key)?;
            if machine_settled(&rec) {
                return Ok(rec);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(wait_expired());
            }
            let n = lock(&self.rt.shared.notices);
            let _ = self
                .rt
                .shared
                .changed
                .wait_timeout(n, (deadline - now).min(WAIT_POLL))
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Versioned start (returns once the request is durable).
    ///
    /// # Errors
    /// `stale_version`, `admission_exhausted`, the store's error.
    pub fn start(&self, key: &RecordKey, version: u64) -> Result<MachineRecord, Error> {
        self.call(machine_call::lifecycle(
            key,
            MachineOperation::Start,
            version,
        ))
    }

    /// Versioned stop (rejected while a command holds the slot).
    ///
    /// # Errors
    /// As [`Machines::start`].
    pub fn stop(&self, key: &RecordKey, version: u64) -> Result<MachineRecord, Error> {
        self.call(machine_call::lifecycle(
            key,
            MachineOperation::Stop,
            version,
        ))
    }

    /// Versioned delete (rejected while a command holds the slot).
    ///
    /// # Errors
    /// As [`Machines::start`].
    pub fn delete(&self, key: &RecordKey, version: u64) -> Result<MachineRecord, Error> {
        self.call(machine_call::lifecycle(
            key,
            MachineOperation::Delete,
            version,
        ))
    }

    /// Submits `command` into the machine's slot under `key`; returns at
    /// durable acceptance (wait on `key` with [`Runtime::wait`]).
    ///
    /// A command that needs a plain image machine (an extended or
    /// background command, a file over 1 MiB or outside `/workspace`) is
    /// asked of the worker first: the machine is inspected before anything
    /// is stored.
    ///
    /// # Errors
    /// `admission_exhausted` when the slot is held or the machine not idle
    /// and running (no queue); `identity_conflict`; the store's error;
    /// before acceptance (nothing stored, no slot taken, `not_dispatched`):
    /// `unsupported_capability` (`needs_plain_image_machine`) when the
    /// machine is not a plain image machine, the inspect's own error when it
    /// fails.
    pub fn submit(
        &self,
        machine: &RecordKey,
        key: &RecordKey,
        command: &smolbox_core::exec::Command,
    ) -> Result<(ExecutionRecord, Option<MachineRecord>, bool), Error> {
        self.submit_with_files(machine, key, command, &CommandFiles::default())
    }

    /// [`Machines::submit`] with declared files (C6.4), by the rules of a
    /// disposable command: each input is read from the runtime's artifact
    /// store, uploaded and read back (size and SHA-256) inside the slot
    /// before the dispatch intent; each output is downloaded after the
    /// exit, with its declared maximum, into the artifact store under
    /// `(key, destination)`. A failed collection ends `collection_failed`
    /// with the exit kept and keeps the slot (C14.3).
    ///
    /// # Errors
    /// As [`Machines::submit`]; `unsupported_capability` without an
    /// artifact store; `validation` for a broken file rule (nothing
    /// stored).
    pub fn submit_with_files(
        &self,
        machine: &RecordKey,
        key: &RecordKey,
        command: &smolbox_core::exec::Command,
        files: &CommandFiles,
    ) -> Result<(ExecutionRecord, Option<MachineRecord>, bool), Error> {
        self.call(machine_call::submit(machine, key, command, files))
    }

    /// Observes the worker and records what it shows (C14.2).
    ///
    /// # Errors
    /// `stale_version` when the record changed during the observation.
    pub fn reconcile(&self, key: &RecordKey) -> Result<MachineRecord, Error> {
        self.call(machine_call::reconcile(key))
    }

    /// Records an ownership-verified stop for draining (C17.3); the slot
    /// keeps its command.
    ///
    /// # Errors
    /// `stale_version`, `identity_conflict`, the worker's or store's error.
    pub fn stop_for_drain(&self, key: &RecordKey, version: u64) -> Result<MachineRecord, Error> {
        self.call(machine_call::stop_for_drain(key, version))
    }

    /// Quiescent resolution (C17.3).
    ///
    /// # Errors
    /// `validation` without `quiesced`; `identity_conflict` for a running
    /// or different incarnation; an outage's error (nothing changed).
    pub fn resolve(
        &self,
        key: &RecordKey,
        version: u64,
        quiesced: bool,
        disposition: Resolution,
    ) -> Result<(MachineRecord, Option<ExecutionRecord>), Error> {
        self.call(machine_call::resolve(key, version, quiesced, disposition))
    }

    /// The machine's console history (C14.2): the recorded incarnation is
    /// inspected first, then its `tail` lines are read (`follow` refused).
    ///
    /// # Errors
    /// `validation` for bad bounds or `follow`; `no_creation_evidence` or
    /// `not_found` (deleted) before any worker call; `identity_conflict`
    /// when another incarnation holds the name; the worker's error.
    pub fn logs(
        &self,
        key: &RecordKey,
        params: smolbox_core::worker::LogsParams,
    ) -> Result<Vec<String>, Error> {
        self.call(machine_call::logs(key, params))
    }

    /// The machine's measurements (C14.2, C2.4) from an inspect of the
    /// recorded incarnation, with the record they were checked against.
    ///
    /// # Errors
    /// As [`Machines::logs`].
    pub fn measurements(
        &self,
        key: &RecordKey,
    ) -> Result<(smolbox_core::worker::Measurements, MachineRecord), Error> {
        self.call(machine_call::measurements(key))
    }
}

impl Runtime {
    /// Retained machines (C14).
    pub fn machines(&self) -> Machines<'_> {
        Machines { rt: self }
    }
}

/// What the driver performs for the controller: its store ops on the
/// driver thread (their answers queued until the turn ends) and a thread
/// per running worker op.
struct Io {
    terminals: ManagedTerminals,
    clients: BTreeMap<String, Client>,
    workers: WorkerThreads<Input>,
    store: Arc<dyn Store>,
    /// Answers of store ops performed during the current turn, handed to
    /// the controller before anything else is waited for.
    stored: VecDeque<Answer>,
    streams: Arc<stream::Sinks>,
    artifacts: Option<Arc<dyn Artifacts>>,
}

/// The driver thread: the shared [`Driver`]'s turns, waiting in between
/// for a command, an answer, the last handle's drop or the controller's
/// next timer.
fn drive(mut driver: Driver<Condvar, Io>, rx: &mpsc::Receiver<Input>) {
    while let Turn::Wait(left) = driver.turn() {
        if let Some(answer) = driver.io_mut().stored.pop_front() {
            driver.handle(Input::Answer(answer));
            continue;
        }
        let input = match left {
            Some(left) => match rx.recv_timeout(left) {
                Ok(input) => input,
                Err(mpsc::RecvTimeoutError::Timeout) => Input::Timeout,
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            },
            None => match rx.recv() {
                Ok(input) => input,
                Err(_) => return,
            },
        };
        driver.handle(input);
    }
}

impl Perform for Io {
    fn store(&mut self, id: OpId, op: StoreOp) -> Result<(), Error> {
        // A panic inside the store (a bug) ends this op, not the runtime:
        // a store failure whose outcome is unknown, never absence.
        let r = std::panic::catch_unwind(AssertUnwindSafe(|| {
            smolbox_store::apply_op(self.store.as_ref(), &op)
        }))
        .unwrap_or_else(|_| {
            Err(Error::store(
                Operation::StoreWrite,
                Evidence::Unknown,
                Reason::StoreThreadLost,
            ))
        });
        self.stored.push_back(Answer::Stored(id, Box::new(r)));
        Ok(())
    }

    fn worker(&mut self, id: OpId, op: WorkerOp) -> Result<(), Error> {
        let client = self.clients.get(op.worker_id()).cloned();
        let sink = match &op {
            WorkerOp::ExecStream { key, .. } => self.streams.take(key),
            _ => None,
        };
        let artifacts = self.artifacts.clone();
        self.workers
            .run(Box::new(move || {
                let r = match client {
                    Some(c) => call(&c, op, sink, artifacts.as_deref()),
                    None => Err(Error::validation(Operation::Config, Reason::UnknownWorker)),
                };
                Input::Answer(Answer::Worker(id, r))
            }))
            // Nothing was sent: the op never started.
            .map_err(|_| THREAD_SPAWN.with_operation(Operation::Exec))
    }

    fn terminals_live(&self) -> bool {
        self.terminals.any_running()
    }

    fn terminal_due(&mut self, row: ExecutionRecord) {
        // The core decides: a live run here takes the row; else recover.
        let Some(key) = self.terminals.due(row) else {
            return;
        };
        // Off the driver thread: it waits for the run's first step.
        let terminals = self.terminals.clone();
        let _ = std::thread::Builder::new()
            .name("smolbox-terminal-recover".into())
            .spawn(move || {
                let _ = terminals.recover(&key);
            });
    }
}

/// Performs one worker op through the client (a streamed exec's events
/// go to `sink`).
fn call(
    c: &Client,
    op: WorkerOp,
    sink: Option<stream::Sink>,
    artifacts: Option<&dyn Artifacts>,
) -> WorkerResult {
    match op {
        WorkerOp::Exec {
            machine, command, ..
        } => c.exec(&machine, &command).map(WorkerReply::Exec),
        WorkerOp::Create {
            profile,
            name,
            spec,
            ..
        } => c
            .create(&profile, name, &spec)
            .map(|o| WorkerReply::Machine(Box::new(o))),
        WorkerOp::Start { profile, name, .. } => c
            .start(&profile, name)
            .map(|o| WorkerReply::Machine(Box::new(o))),
        WorkerOp::Stop { profile, name, .. } => c
            .stop(&profile, name)
            .map(|o| WorkerReply::Machine(Box::new(o))),
        WorkerOp::Delete { name, .. } => c.delete(name).map(|()| WorkerReply::Deleted),
        WorkerOp::Inspect { profile, name, .. } => c
            .get(&profile, name)
            .map(|o| WorkerReply::Machine(Box::new(o))),
        WorkerOp::Logs {
            profile,
            name,
            params,
            ..
        } => smolbox_core::worker::Logs::new(&profile, name, params)
            .and_then(|logs| c.logs(&logs))
            .map(WorkerReply::Logs),
        WorkerOp::ExecStream {
            machine, command, ..
        } => stream::perform(c, &machine, &command, sink),
        WorkerOp::Upload { .. } => {
            let upload = files::upload_of(&op, artifacts, c.endpoint().budgets())?;
            c.upload(&upload)
                .map(|r| WorkerReply::Uploaded { size: r.size })
        }
        WorkerOp::Download { .. } => {
            let download = files::download_of(&op, c.endpoint().budgets())?;
            let bytes = c.download(&download)?;
            files::downloaded(&op, bytes, artifacts)
        }
    }
}
