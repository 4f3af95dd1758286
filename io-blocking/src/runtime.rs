//! The managed runtime (DESIGN.md §5a): a driver of one
//! [`smolbox_core::managed::controller::Controller`] per runtime.
//!
//! The driver thread owns the controller. It performs the controller's
//! store ops on one store thread through [`smolbox_store::apply_op`], its
//! worker ops each on a thread of its own (at most one per execution, so at
//! most `max_active`) through the configured workers' [`Client`]s, feeds
//! every answer back with the current time, and wakes at the controller's
//! `poll_timeout`. It makes no decision of its
//! own: acceptance, dispatch, renewal, cancellation, deadlines and recovery
//! are the controller's.
//!
//! The public API is the same in both shells: [`Runtime::builder`] →
//! [`RuntimeBuilder::build`], then [`Runtime::submit`] (returns at durable
//! acceptance), [`Runtime::fetch`], [`Runtime::wait`] (never cancels, safe
//! to repeat), [`Runtime::cancel`], [`Runtime::reconcile`],
//! [`Runtime::shutdown`] and [`Runtime::run`] (submit + wait).

use smolbox_core::Reason;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::hash::{BuildHasher, Hasher};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use smolbox_core::managed::controller::machine_settled;
use smolbox_core::managed::controller::machines::{check_list_limit, check_wait_ms};
use smolbox_core::managed::controller::{
    Controller, ControllerConfig, ControllerEvent, Finished, OpId, StoreOp, StoreResult, Submit,
    WorkerEntry, WorkerOp, WorkerReply, WorkerResult, owner_id,
};
pub use smolbox_core::managed::controller::{
    MachineAnswer, MachineRequest, Outcome, RequestId, Resolution, Submission, Telemetry,
};
use smolbox_core::managed::state::MachineOperation;
use smolbox_core::managed::{ExecutionRecord, FingerprintKey, RecordKey};
use smolbox_core::managed::{MachineRecord, RetainedMachineSpec};
use smolbox_core::worker::Profile;
use smolbox_core::{Category, Error, Evidence, Operation};
use smolbox_store::Page;
use smolbox_store::Store;
pub use smolbox_store::keys::{key_file, load_or_create_keys};

use crate::Client;

/// Longest single wait (C16).
pub const MAX_WAIT_MS: u64 = 900_000;
/// How often a wait re-reads the store (C16: about 25 ms).
pub const WAIT_POLL: Duration = Duration::from_millis(25);
/// Finished notices kept for waiters (oldest dropped first).
pub const MAX_NOTICES: usize = 64;

/// Wall-clock and monotonic time for the controller (C12.1: injectable).
pub trait Clock: Send + Sync {
    /// Monotonic now.
    fn now(&self) -> Instant;
    /// Wall-clock milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;
}

/// The system clocks.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn now_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }
}

/// A controller id unique to this process: `ctl-<pid>-<random>`.
pub fn default_owner() -> String {
    let random = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    owner_id(std::process::id(), random)
}

/// Options of a [`Runtime`] (C12.1); [`RuntimeBuilder::build`] checks them.
pub struct RuntimeBuilder {
    store: Arc<dyn Store>,
    fingerprint_key: FingerprintKey,
    config: ControllerConfig,
    clients: BTreeMap<String, Client>,
    ephemeral: bool,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for RuntimeBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuntimeBuilder")
            .field("config", &self.config)
            .field("ephemeral", &self.ephemeral)
            .finish_non_exhaustive()
    }
}

impl RuntimeBuilder {
    /// The controller id (an identifier; default [`default_owner`]). Two
    /// runtimes sharing a store must never share an id.
    #[must_use]
    pub fn owner(mut self, owner: &str) -> Self {
        owner.clone_into(&mut self.config.owner);
        self
    }

    /// Adds a worker: commands naming `id` go through `client`.
    #[must_use]
    pub fn worker(mut self, id: &str, client: Client) -> Self {
        self.config.workers.push(WorkerEntry::new(id));
        self.clients.insert(id.to_owned(), client);
        self
    }

    /// Adds a worker that also runs disposable machines (C12.4): the
    /// controller creates, starts, stops and deletes them with `profile`,
    /// the worker's admitted version profile (`Client::admit`).
    #[must_use]
    pub fn worker_with_profile(mut self, id: &str, client: Client, profile: Profile) -> Self {
        self.config
            .workers
            .push(WorkerEntry::new(id).with_profile(profile));
        self.clients.insert(id.to_owned(), client);
        self
    }

    /// `max_pending` of `accept` (1–10,000; default 128).
    #[must_use]
    pub fn max_pending(mut self, n: u32) -> Self {
        self.config.max_pending = n;
        self
    }

    /// Most executions driven at once (1–64; default 4).
    #[must_use]
    pub fn max_active(mut self, n: usize) -> Self {
        self.config.max_active = n;
        self
    }

    /// Due-scan interval in ms (10–5,000; default 250).
    #[must_use]
    pub fn poll_interval_ms(mut self, ms: u64) -> Self {
        self.config.poll_interval_ms = ms;
        self
    }

    /// Claim and lease TTL in ms (1,000–900,000, ≥ 4 × poll; default 30,000).
    #[must_use]
    pub fn lease_ttl_ms(mut self, ms: u64) -> Self {
        self.config.lease_ttl_ms = ms;
        self
    }

    /// Cleanup mutation attempts (1–20; default 5).
    #[must_use]
    pub fn cleanup_attempts(mut self, n: u32) -> Self {
        self.config.cleanup_attempts = n;
        self
    }

    /// Telemetry queue length (1–1,024; default 128).
    #[must_use]
    pub fn telemetry_pending(mut self, n: usize) -> Self {
        self.config.telemetry_pending = n;
        self
    }

    /// Accepts a non-durable store (the in-memory one). Off by default: a
    /// durable runtime refuses it (C12.1 mode).
    #[must_use]
    pub fn ephemeral(mut self, yes: bool) -> Self {
        self.ephemeral = yes;
        self
    }

    /// The clock (default [`SystemClock`]).
    #[must_use]
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Checks the options and starts the driver and store threads; the
    /// first due scan (recovery) starts at once.
    ///
    /// # Errors
    /// `validation` (operation `config`) for a bad option or a non-durable
    /// store without [`RuntimeBuilder::ephemeral`]; `unknown` when a thread
    /// cannot be started.
    pub fn build(self) -> Result<Runtime, Error> {
        if !self.store.info().durable && !self.ephemeral {
            return Err(Error::validation(
                Operation::Config,
                Reason::StoreNotDurable,
            ));
        }
        // The controller's options first: its errors name the option.
        self.config.validate()?;
        let terminals = crate::managed_terminal::ManagedTerminals::new(
            Arc::clone(&self.store),
            self.fingerprint_key.clone(),
            smolbox_core::managed::controller::terminal::TermConfig::of(&self.config),
            self.clients.clone(),
            Arc::clone(&self.clock),
            self.config.max_active,
        )?;
        let telemetry_cap = self.config.telemetry_pending;
        let span = smolbox_store::trace::driver_span(&self.config.owner);
        let controller = Controller::new(
            self.config,
            self.fingerprint_key,
            self.clock.now(),
            self.clock.now_ms(),
        )?;
        let shared = Arc::new(Shared {
            notices: Mutex::new(Notices {
                telemetry_cap: telemetry_cap.max(1),
                ..Notices::default()
            }),
            changed: Condvar::new(),
        });
        let (tx, rx) = mpsc::channel::<Msg>();
        let (store_tx, store_rx) = mpsc::channel::<(OpId, StoreOp)>();
        let store = Arc::clone(&self.store);
        let answers = tx.clone();
        std::thread::Builder::new()
            .name("smolbox-store".into())
            .spawn(move || {
                for (id, op) in store_rx {
                    let r = smolbox_store::apply_op(store.as_ref(), &op);
                    if answers.send(Msg::Stored(id, Box::new(r))).is_err() {
                        return;
                    }
                }
            })
            .map_err(|_| thread_error())?;
        let driver = Driver {
            terminals: terminals.clone(),
            controller,
            clients: self.clients,
            clock: Arc::clone(&self.clock),
            shared: Arc::clone(&shared),
            tx: tx.clone(),
            store_tx,
            accept_waiters: BTreeMap::new(),
            cancel_waiters: BTreeMap::new(),
            machine_waiters: BTreeMap::new(),
            stop_waiters: Vec::new(),
            stopped: false,
            closed: false,
        };
        std::thread::Builder::new()
            .name("smolbox-runtime".into())
            .spawn(move || {
                let _entered = span.enter();
                driver.run(&rx);
            })
            .map_err(|_| thread_error())?;
        Ok(Runtime {
            store: self.store,
            cmd: tx,
            shared,
            terminals,
        })
    }
}

/// Finished notices and the keys the controller drives, shared with waiters.
#[derive(Debug, Default)]
struct Notices {
    finished: BTreeMap<RecordKey, Finished>,
    order: VecDeque<RecordKey>,
    driven: BTreeSet<RecordKey>,
    /// Lifecycle telemetry not yet taken (≤ telemetry pending; oldest
    /// dropped first, counted in each entry's `dropped`).
    telemetry: VecDeque<Telemetry>,
    telemetry_cap: usize,
}

#[derive(Debug)]
struct Shared {
    notices: Mutex<Notices>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Notices> {
        self.notices.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

enum Msg {
    Submit(Box<Submit>, mpsc::Sender<Result<Submission, Error>>),
    Cancel(RecordKey, mpsc::Sender<Result<ExecutionRecord, Error>>),
    Machine(
        Box<MachineRequest>,
        mpsc::Sender<Result<MachineAnswer, Error>>,
    ),
    Reconcile,
    Shutdown(mpsc::Sender<()>),
    /// The last handle was dropped.
    Close,
    Stored(OpId, Box<StoreResult>),
    Worker(OpId, WorkerResult),
}

fn thread_error() -> Error {
    Error::new(
        Category::Unknown,
        Operation::Config,
        Evidence::NotDispatched,
    )
    .with_reason(Reason::ThreadSpawn)
}

/// Runs managed commands through a controller over a durable store.
pub struct Runtime {
    store: Arc<dyn Store>,
    cmd: mpsc::Sender<Msg>,
    shared: Arc<Shared>,
    terminals: crate::managed_terminal::ManagedTerminals,
}

impl Drop for Runtime {
    fn drop(&mut self) {
        // The driver finishes what is in flight, then exits.
        let _ = self.cmd.send(Msg::Close);
    }
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime").finish_non_exhaustive()
    }
}

fn gone(op: Operation) -> Error {
    Error::new(Category::Unknown, op, Evidence::Unknown).with_reason(Reason::RuntimeStopped)
}

impl Runtime {
    /// A builder over `store` with the host's fingerprint key (32–4,096
    /// bytes, stable across restarts, distinct from the encryption key).
    pub fn builder(store: Arc<dyn Store>, fingerprint_key: FingerprintKey) -> RuntimeBuilder {
        RuntimeBuilder {
            store,
            fingerprint_key,
            config: ControllerConfig::new(&default_owner()),
            clients: BTreeMap::new(),
            ephemeral: false,
            clock: Arc::new(SystemClock),
        }
    }

    /// The managed terminals of this runtime (C7.4): `open`, `attach`,
    /// `cancel`, `recover`; live connections belong to this runtime.
    pub fn terminals(&self) -> &crate::managed_terminal::ManagedTerminals {
        &self.terminals
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
        let (tx, rx) = mpsc::channel();
        self.cmd
            .send(Msg::Submit(Box::new(submit), tx))
            .map_err(|_| gone(Operation::Submit))?;
        rx.recv().map_err(|_| gone(Operation::Submit))?
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
        if timeout_ms > MAX_WAIT_MS {
            return Err(Error::validation(Operation::Await, Reason::WaitTimeout)
                .with_limit(timeout_ms, MAX_WAIT_MS));
        }
        let deadline = Instant::now() + Duration::from_millis(timeout_ms);
        loop {
            let record = self.fetch(key)?;
            let n = self.shared.lock();
            if let Some(o) = Outcome::settle(record, n.finished.get(key), n.driven.contains(key)) {
                return Ok(o);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(
                    Error::new(Category::Expired, Operation::Await, Evidence::Unknown)
                        .with_reason(Reason::WaitTimeout),
                );
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
        let (tx, rx) = mpsc::channel();
        self.cmd
            .send(Msg::Cancel(key.clone(), tx))
            .map_err(|_| gone(Operation::Cancel))?;
        rx.recv().map_err(|_| gone(Operation::Cancel))?
    }

    /// Takes the lifecycle telemetry delivered so far (C20): identifiers,
    /// states and evidence only. Bounded and lossy: an entry's `epoch` and
    /// `dropped` say whether entries were lost before it.
    pub fn telemetry(&self) -> Vec<Telemetry> {
        self.shared.lock().telemetry.drain(..).collect()
    }

    /// Schedules a due scan now (observation only; never a replay).
    pub fn reconcile(&self) {
        let _ = self.cmd.send(Msg::Reconcile);
    }

    /// Stops taking work and returns once nothing is outstanding
    /// (executions already dispatched are driven to their end).
    pub fn shutdown(&self) {
        let (tx, rx) = mpsc::channel();
        if self.cmd.send(Msg::Shutdown(tx)).is_ok() {
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
            match self.wait(&s.key, MAX_WAIT_MS) {
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
    fn request(&self, req: MachineRequest) -> Result<MachineAnswer, Error> {
        let (tx, rx) = mpsc::channel();
        self.rt
            .cmd
            .send(Msg::Machine(Box::new(req), tx))
            .map_err(|_| gone(Operation::Submit))?;
        rx.recv().map_err(|_| gone(Operation::Submit))?
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
        self.request(MachineRequest::Create {
            key: key.clone(),
            spec: spec.clone(),
        })?
        .into_machine()
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
                return Err(
                    Error::new(Category::Expired, Operation::Await, Evidence::Unknown)
                        .with_reason(Reason::WaitTimeout),
                );
            }
            let n = self.rt.shared.lock();
            let _ = self
                .rt
                .shared
                .changed
                .wait_timeout(n, (deadline - now).min(WAIT_POLL))
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    fn lifecycle(
        &self,
        key: &RecordKey,
        action: MachineOperation,
        version: u64,
    ) -> Result<MachineRecord, Error> {
        self.request(MachineRequest::Lifecycle {
            key: key.clone(),
            action,
            version,
        })?
        .into_machine()
        .map(|(m, _)| m)
    }

    /// Versioned start (returns once the request is durable).
    ///
    /// # Errors
    /// `stale_version`, `admission_exhausted`, the store's error.
    pub fn start(&self, key: &RecordKey, version: u64) -> Result<MachineRecord, Error> {
        self.lifecycle(key, MachineOperation::Start, version)
    }

    /// Versioned stop (rejected while a command holds the slot).
    ///
    /// # Errors
    /// As [`Machines::start`].
    pub fn stop(&self, key: &RecordKey, version: u64) -> Result<MachineRecord, Error> {
        self.lifecycle(key, MachineOperation::Stop, version)
    }

    /// Versioned delete (rejected while a command holds the slot).
    ///
    /// # Errors
    /// As [`Machines::start`].
    pub fn delete(&self, key: &RecordKey, version: u64) -> Result<MachineRecord, Error> {
        self.lifecycle(key, MachineOperation::Delete, version)
    }

    /// Submits `command` into the machine's slot under `key`; returns at
    /// durable acceptance (wait on `key` with [`Runtime::wait`]).
    ///
    /// # Errors
    /// `admission_exhausted` when the slot is held or the machine not idle
    /// and running (no queue); `identity_conflict`; the store's error.
    pub fn submit(
        &self,
        machine: &RecordKey,
        key: &RecordKey,
        command: &smolbox_core::exec::Command,
    ) -> Result<(ExecutionRecord, Option<MachineRecord>, bool), Error> {
        self.request(MachineRequest::Submit {
            machine: machine.clone(),
            key: key.clone(),
            command: command.clone(),
        })?
        .into_submitted()
    }

    /// Observes the worker and records what it shows (C14.2).
    ///
    /// # Errors
    /// `stale_version` when the record changed during the observation.
    pub fn reconcile(&self, key: &RecordKey) -> Result<MachineRecord, Error> {
        self.request(MachineRequest::Reconcile { key: key.clone() })?
            .into_machine()
            .map(|(m, _)| m)
    }

    /// Records an ownership-verified stop for draining (C17.3); the slot
    /// keeps its command.
    ///
    /// # Errors
    /// `stale_version`, `identity_conflict`, the worker's or store's error.
    pub fn stop_for_drain(&self, key: &RecordKey, version: u64) -> Result<MachineRecord, Error> {
        self.request(MachineRequest::StopForDrain {
            key: key.clone(),
            version,
        })?
        .into_machine()
        .map(|(m, _)| m)
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
        self.request(MachineRequest::Resolve {
            key: key.clone(),
            version,
            quiesced,
            disposition,
        })?
        .into_resolved()
    }
}

impl Runtime {
    /// Retained machines (C14).
    pub fn machines(&self) -> Machines<'_> {
        Machines { rt: self }
    }
}

struct Driver {
    terminals: crate::managed_terminal::ManagedTerminals,
    controller: Controller,
    clients: BTreeMap<String, Client>,
    clock: Arc<dyn Clock>,
    shared: Arc<Shared>,
    tx: mpsc::Sender<Msg>,
    store_tx: mpsc::Sender<(OpId, StoreOp)>,
    accept_waiters: BTreeMap<RecordKey, VecDeque<mpsc::Sender<Result<Submission, Error>>>>,
    cancel_waiters: BTreeMap<RecordKey, VecDeque<mpsc::Sender<Result<ExecutionRecord, Error>>>>,
    machine_waiters: BTreeMap<RequestId, mpsc::Sender<Result<MachineAnswer, Error>>>,
    stop_waiters: Vec<mpsc::Sender<()>>,
    stopped: bool,
    closed: bool,
}

impl Driver {
    fn run(mut self, rx: &mpsc::Receiver<Msg>) {
        loop {
            self.drain();
            if self.stopped && self.closed {
                return;
            }
            let msg = match self.controller.poll_timeout() {
                Some(at) => {
                    let left = at.saturating_duration_since(self.clock.now());
                    match rx.recv_timeout(left) {
                        Ok(m) => Some(m),
                        Err(mpsc::RecvTimeoutError::Timeout) => None,
                        Err(mpsc::RecvTimeoutError::Disconnected) => return,
                    }
                }
                None => match rx.recv() {
                    Ok(m) => Some(m),
                    Err(_) => return,
                },
            };
            let (now, now_ms) = (self.clock.now(), self.clock.now_ms());
            match msg {
                None => self.controller.handle_timeout(now, now_ms),
                Some(Msg::Stored(id, r)) => {
                    smolbox_store::trace::store_result(id, &r);
                    self.controller.handle_stored(now, now_ms, id, *r);
                }
                Some(Msg::Worker(id, r)) => {
                    smolbox_store::trace::worker_result(id, &r);
                    self.controller.handle_worker(now, now_ms, id, r);
                }
                Some(Msg::Close) => {
                    self.closed = true;
                    self.controller.shutdown(now, now_ms);
                }
                Some(Msg::Submit(submit, tx)) => {
                    let key = submit.key.clone();
                    match self.controller.submit(now, now_ms, *submit) {
                        Ok(()) => self.accept_waiters.entry(key).or_default().push_back(tx),
                        Err(e) => {
                            let _ = tx.send(Err(e));
                        }
                    }
                }
                Some(Msg::Cancel(key, tx)) => {
                    self.cancel_waiters
                        .entry(key.clone())
                        .or_default()
                        .push_back(tx);
                    self.controller.cancel(now, now_ms, key);
                }
                Some(Msg::Machine(req, tx)) => match self.controller.machine(now, now_ms, *req) {
                    Ok(id) => {
                        self.machine_waiters.insert(id, tx);
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e));
                    }
                },
                Some(Msg::Reconcile) => self.controller.reconcile(now, now_ms),
                Some(Msg::Shutdown(tx)) => {
                    if self.stopped {
                        let _ = tx.send(());
                    } else {
                        self.stop_waiters.push(tx);
                        self.controller.shutdown(now, now_ms);
                    }
                }
            }
        }
    }

    /// Performs every op the controller asks for and delivers its events.
    fn drain(&mut self) {
        while let Some((id, op)) = self.controller.poll_store_op() {
            smolbox_store::trace::store_op(id, &op);
            if let Err(mpsc::SendError((id, _))) = self.store_tx.send((id, op)) {
                // The store thread is gone: a store failure, never absence.
                let e = Error::new(Category::Store, Operation::StoreWrite, Evidence::Unknown)
                    .with_reason(Reason::StoreThreadLost);
                let (now, now_ms) = (self.clock.now(), self.clock.now_ms());
                self.controller.handle_stored(now, now_ms, id, Err(e));
            }
        }
        while let Some((id, op)) = self.controller.poll_worker_op() {
            smolbox_store::trace::worker_op(id, &op);
            self.perform_worker(id, op);
        }
        let mut changed = false;
        while let Some(event) = self.controller.poll_event() {
            changed |= self.deliver(event);
        }
        let mut n = self.shared.lock();
        let driven: BTreeSet<RecordKey> = self.controller.active_keys().cloned().collect();
        if driven != n.driven {
            n.driven = driven;
            changed = true;
        }
        drop(n);
        if changed {
            self.shared.changed.notify_all();
        }
    }

    fn perform_worker(&mut self, id: OpId, op: WorkerOp) {
        let client = self.clients.get(op.worker_id()).cloned();
        let tx = self.tx.clone();
        let spawned = std::thread::Builder::new()
            .name("smolbox-worker-op".into())
            .spawn(move || {
                let r = match client {
                    Some(c) => call(&c, op),
                    None => Err(Error::validation(Operation::Config, Reason::UnknownWorker)),
                };
                let _ = tx.send(Msg::Worker(id, r));
            });
        if spawned.is_err() {
            // Nothing was sent: the op never started.
            let e = thread_error().with_operation(Operation::Exec);
            let (now, now_ms) = (self.clock.now(), self.clock.now_ms());
            self.controller.handle_worker(now, now_ms, id, Err(e));
        }
    }

    /// Delivers one event; true when waiters should look again.
    fn deliver(&mut self, event: ControllerEvent) -> bool {
        smolbox_store::trace::event(&event);
        match event {
            ControllerEvent::Accepted { key, existing, .. } => {
                if let Some(tx) = pop(&mut self.accept_waiters, &key) {
                    let _ = tx.send(Ok(Submission { key, existing }));
                }
                true
            }
            ControllerEvent::Refused { key, error } => {
                if let Some(tx) = pop(&mut self.accept_waiters, &key) {
                    let _ = tx.send(Err(error));
                }
                false
            }
            ControllerEvent::CancelRecorded { key, result } => {
                if let Some(tx) = pop(&mut self.cancel_waiters, &key) {
                    let _ = tx.send(result.map(|r| *r));
                }
                true
            }
            ControllerEvent::Finished(f) => {
                let mut n = self.shared.lock();
                let key = f.key.clone();
                if n.finished.insert(key.clone(), *f).is_none() {
                    n.order.push_back(key);
                    if n.order.len() > MAX_NOTICES
                        && let Some(old) = n.order.pop_front()
                    {
                        n.finished.remove(&old);
                    }
                }
                true
            }
            ControllerEvent::Telemetry(t) => {
                let mut n = self.shared.lock();
                if n.telemetry.len() >= n.telemetry_cap {
                    n.telemetry.pop_front();
                }
                n.telemetry.push_back(t);
                false
            }
            ControllerEvent::Machine(d) => {
                if let Some(tx) = self.machine_waiters.remove(&d.id) {
                    let _ = tx.send(d.result);
                }
                true
            }
            ControllerEvent::TerminalDue(rec) => {
                // Recovery of a terminal not driven here (C7.4), off the
                // driver thread (it waits for the run's first step).
                let terminals = self.terminals.clone();
                let _ = std::thread::Builder::new()
                    .name("smolbox-terminal-recover".into())
                    .spawn(move || {
                        let _ = terminals.recover(&rec.key);
                    });
                false
            }
            ControllerEvent::Stopped => {
                self.stopped = true;
                for tx in self.stop_waiters.drain(..) {
                    let _ = tx.send(());
                }
                false
            }
        }
    }
}

fn pop<T>(map: &mut BTreeMap<RecordKey, VecDeque<T>>, key: &RecordKey) -> Option<T> {
    let q = map.get_mut(key)?;
    let v = q.pop_front();
    if q.is_empty() {
        map.remove(key);
    }
    v
}

/// Performs one worker op through the client.
fn call(c: &Client, op: WorkerOp) -> WorkerResult {
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
    }
}
