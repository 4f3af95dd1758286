//! The managed runtime's shell-independent half (DESIGN.md §5a), written
//! once for `smolbox-tokio` and `smolbox-blocking`: the builder and its
//! options, the clocks, and the driver's bookkeeping around the
//! [`Controller`] — which waiter gets which answer, the finished notices
//! and telemetry kept for waiters, and the order in which the controller's
//! store ops, worker ops and events are taken.
//!
//! Nothing here waits, spawns or touches a socket. A shell owns a
//! [`Driver`] (the [`Host`], the [`Shared`] notices and its [`Perform`],
//! which starts the ops on its own tasks or threads) on its driver task or
//! thread, and loops: [`Driver::turn`] drains the controller and says how
//! long to wait; the shell waits for an [`Input`] — a [`Command`], an
//! [`Answer`], the time, the last handle's drop — and hands it to
//! [`Driver::handle`]. A waiter's reply is a [`Reply`], a closure over the
//! shell's channel.

use smolbox_core::Reason;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::hash::{BuildHasher, Hasher};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use smolbox_core::managed::controller::terminal::TermConfig;
use smolbox_core::managed::controller::{
    Controller, ControllerConfig, ControllerEvent, Finished, MachineAnswer, MachineRequest, OpId,
    Outcome, RequestId, StoreOp, StoreResult, Submission, Submit, Telemetry, WorkerEntry, WorkerOp,
    WorkerResult, owner_id,
};
use smolbox_core::managed::{ExecutionRecord, FingerprintKey, RecordKey};
use smolbox_core::worker::{Profile, Source};
use smolbox_core::{Error, Evidence, Operation};

use crate::artifacts::Artifacts;
use crate::terminals::{LiveConn, Terminals};
use crate::{Store, trace};

mod driver;
pub mod files;
pub mod stream;

pub use driver::{Driver, Input, Shared, Turn, Wake};

/// Longest single wait (C16).
pub const MAX_WAIT_MS: u64 = 900_000;
/// How often a wait looks again (C16: about 25 ms): it re-reads the store
/// then unless this runtime drives the key ([`Notices::needs_read`]).
pub const WAIT_POLL: Duration = Duration::from_millis(25);
/// While this runtime drives the key, how often a wait re-reads the store
/// anyway (1 s): the finished notice is what ends such a wait; this read
/// is only a safety net.
pub const DRIVEN_POLL: Duration = Duration::from_secs(1);
/// Finished notices kept for waiters (oldest dropped first).
pub const MAX_NOTICES: usize = 64;

pub use crate::clock::{Clock, SystemClock};

/// A controller id unique to this process: `ctl-<pid>-<random>`.
pub fn default_owner() -> String {
    let random = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    owner_id(std::process::id(), random)
}

/// The error of a call on a runtime whose driver is gone.
pub fn stopped(op: Operation) -> Error {
    Error::unknown(op, Evidence::Unknown, Reason::RuntimeStopped)
}

/// The error of a wait whose time ran out (operation `await`).
pub fn wait_expired() -> Error {
    Error::expired(Operation::Await, Evidence::Unknown, Reason::WaitTimeout)
}

/// A shell's runtime, built from a [`Builder`] (the shell's
/// `RuntimeBuilder` is `Builder<Runtime>`).
pub trait Build: Sized {
    /// The shell's worker client.
    type Client: Clone;

    /// Starts the runtime from `builder` (see [`Builder::build`]).
    ///
    /// # Errors
    /// As [`Builder::build`].
    fn build(builder: Builder<Self>) -> Result<Self, Error>;
}

/// Options of a runtime (C12.1); [`Builder::build`] checks them.
pub struct Builder<R: Build> {
    store: Arc<dyn Store>,
    fingerprint_key: FingerprintKey,
    config: ControllerConfig,
    clients: BTreeMap<String, R::Client>,
    ephemeral: bool,
    clock: Arc<dyn Clock>,
    artifacts: Option<Arc<dyn Artifacts>>,
}

impl<R: Build> std::fmt::Debug for Builder<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuntimeBuilder")
            .field("config", &self.config)
            .field("ephemeral", &self.ephemeral)
            .finish_non_exhaustive()
    }
}

impl<R: Build> Builder<R> {
    /// A builder over `store` with the host's fingerprint key (32–4,096
    /// bytes, stable across restarts, distinct from the encryption key).
    pub fn new(store: Arc<dyn Store>, fingerprint_key: FingerprintKey) -> Self {
        Self {
            store,
            fingerprint_key,
            config: ControllerConfig::new(&default_owner()),
            clients: BTreeMap::new(),
            ephemeral: false,
            clock: Arc::new(SystemClock),
            artifacts: None,
        }
    }

    /// The controller id (an identifier; default [`default_owner`]). Two
    /// runtimes sharing a store must never share an id.
    #[must_use]
    pub fn owner(mut self, owner: &str) -> Self {
        owner.clone_into(&mut self.config.owner);
        self
    }

    /// Adds a worker: commands naming `id` go through `client`.
    #[must_use]
    pub fn worker(mut self, id: &str, client: R::Client) -> Self {
        self.config.workers.push(WorkerEntry::new(id));
        self.clients.insert(id.to_owned(), client);
        self
    }

    /// Adds a worker that also runs disposable machines (C12.4): the
    /// controller creates, starts, stops and deletes them with `profile`,
    /// the worker's admitted version profile (`Client::admit`).
    #[must_use]
    pub fn worker_with_profile(mut self, id: &str, client: R::Client, profile: Profile) -> Self {
        self.config
            .workers
            .push(WorkerEntry::new(id).with_profile(profile));
        self.clients.insert(id.to_owned(), client);
        self
    }

    /// Adds a configured worker as a whole [`WorkerEntry`] (capacity,
    /// admitted version profile, catalog, C12.2): with a catalog, a
    /// disposable execution or retained machine is accepted on it only
    /// with the catalog's exact artifact and profile revision (C12.4).
    /// The entry is checked by [`Builder::build`].
    #[must_use]
    pub fn worker_entry(mut self, entry: WorkerEntry, client: R::Client) -> Self {
        self.clients.insert(entry.id.clone(), client);
        self.config.workers.push(entry);
        self
    }

    /// The machines this runtime creates on worker `id` (added before),
    /// disposable and retained, are created from `source`: an image
    /// ([`Source::Oci`] from 1.19.0, or a `.smolmachine` [`Source::Image`])
    /// makes them image machines, which terminals, extended and background
    /// commands and large or out-of-root files need (C5.4, C6.1, C7.4).
    /// Without it they are imageless ([`Source::Bare`]). A source the
    /// worker's profile lacks refuses the create before it is sent. For an
    /// uncatalogued (development) worker only: on a worker with a catalog
    /// the spec's image artifact decides the source (its catalog path),
    /// and this is used only for a checkpoint artifact.
    #[must_use]
    pub fn machine_source(mut self, id: &str, source: Source) -> Self {
        if let Some(w) = self.config.workers.iter_mut().find(|w| w.id == id) {
            w.machine_source = Some(source);
        }
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

    /// The artifact store declared input files are read from and
    /// collected outputs are put into (C6.5). Without one, a spec with
    /// input or output files is refused (`unsupported_capability`).
    #[must_use]
    pub fn artifacts(mut self, artifacts: Arc<dyn Artifacts>) -> Self {
        self.config.artifacts = true;
        self.artifacts = Some(artifacts);
        self
    }

    /// The clock (default [`SystemClock`]).
    #[must_use]
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Checks the options and starts the runtime (the shell's driver task
    /// or thread); the first due scan (recovery) starts at once.
    ///
    /// # Errors
    /// `validation` (operation `config`) for a bad option, a non-durable
    /// store without [`Builder::ephemeral`], or (tokio) no tokio runtime;
    /// `unknown` (blocking) when a thread cannot be started.
    pub fn build(self) -> Result<R, Error> {
        R::build(self)
    }

    /// For a shell's [`Build::build`]: refuses a non-durable store unless
    /// [`Builder::ephemeral`].
    ///
    /// # Errors
    /// `validation` (`store_not_durable`).
    pub fn check_durable(&self) -> Result<(), Error> {
        if !self.store.info().durable && !self.ephemeral {
            return Err(Error::validation(
                Operation::Config,
                Reason::StoreNotDurable,
            ));
        }
        Ok(())
    }

    /// For a shell's [`Build::build`]: checks the options and makes the
    /// controller and its bookkeeping.
    ///
    /// # Errors
    /// As [`Builder::check_durable`], then the controller's options (the
    /// errors name the option).
    pub fn into_parts(self) -> Result<Parts<R::Client>, Error> {
        self.check_durable()?;
        self.config.validate()?;
        let term = TermConfig::of(&self.config);
        let max_active = self.config.max_active;
        let telemetry_cap = self.config.telemetry_pending;
        let span = trace::driver_span(&self.config.owner);
        let controller = Controller::new(
            self.config,
            self.fingerprint_key.clone(),
            self.clock.now(),
            self.clock.now_ms(),
        )?;
        Ok(Parts {
            host: Host {
                controller,
                clock: Arc::clone(&self.clock),
                accept_waiters: BTreeMap::new(),
                cancel_waiters: BTreeMap::new(),
                machine_waiters: BTreeMap::new(),
                stop_waiters: Vec::new(),
                stopped: false,
            },
            notices: Notices::new(telemetry_cap),
            store: self.store,
            fingerprint_key: self.fingerprint_key,
            term,
            max_active,
            clients: self.clients,
            clock: self.clock,
            span,
            artifacts: self.artifacts,
        })
    }
}

/// A checked [`Builder`], taken apart for the shell that starts it.
#[non_exhaustive]
pub struct Parts<C> {
    /// The driver's bookkeeping (for the driver task or thread).
    pub host: Host,
    /// The waiters' view of what the driver delivered.
    pub notices: Notices,
    /// The store.
    pub store: Arc<dyn Store>,
    /// The host's fingerprint key (for the managed terminals).
    pub fingerprint_key: FingerprintKey,
    /// The managed terminals' options.
    pub term: TermConfig,
    /// Most executions (and managed terminals) driven at once.
    pub max_active: usize,
    /// The workers' clients by id.
    pub clients: BTreeMap<String, C>,
    /// The clock.
    pub clock: Arc<dyn Clock>,
    /// The span the driver runs in.
    pub span: tracing::Span,
    /// The artifact store the driver's transfers read from and put into.
    pub artifacts: Option<Arc<dyn Artifacts>>,
}

impl<C: Clone> Parts<C> {
    /// The runtime's managed terminals (`L`: the shell's live-connection
    /// handle), registering at most `max_active` sessions.
    ///
    /// # Errors
    /// `validation` (operation `config`) for a bad limit.
    pub fn terminals<L: LiveConn + Clone>(&self) -> Result<Terminals<L, C>, Error> {
        Terminals::new(
            Arc::clone(&self.store),
            self.fingerprint_key.clone(),
            self.term.clone(),
            self.clients.clone(),
            Arc::clone(&self.clock),
            self.max_active,
        )
    }
}

/// Finished notices and the keys the controller drives, shared with
/// waiters (behind the shell's lock).
#[derive(Debug, Default)]
pub struct Notices {
    finished: BTreeMap<RecordKey, Finished>,
    order: VecDeque<RecordKey>,
    driven: BTreeSet<RecordKey>,
    /// Lifecycle telemetry not yet taken (≤ telemetry pending; oldest
    /// dropped first, counted in each entry's `dropped`).
    telemetry: VecDeque<Telemetry>,
    telemetry_cap: usize,
}

impl Notices {
    /// Empty, keeping at most `telemetry_cap` (at least 1) telemetry entries.
    pub fn new(telemetry_cap: usize) -> Self {
        Self {
            telemetry_cap: telemetry_cap.max(1),
            ..Self::default()
        }
    }

    /// The outcome of `record` (just read under `key`) if a waiter may
    /// return it now ([`Outcome::settle`] with this runtime's notice).
    pub fn settle(&self, key: &RecordKey, record: ExecutionRecord) -> Option<Outcome> {
        Outcome::settle(record, self.finished.get(key), self.driven.contains(key))
    }

    /// The outcome this runtime's finished notice settles on its own,
    /// without another store read, for a waiter that already read the
    /// record at version `seen` during this wait: only when the notice
    /// carries a record this controller had stored (a committed write's
    /// answer) at a version above `seen`, in a terminal state, with no
    /// error that ended it here, not held by another controller, and the
    /// key is no longer driven. That record was durable at a moment after
    /// the waiter's read, so it is what a read then would have returned;
    /// in every other case the waiter reads the store again.
    pub fn settle_on_notice(&self, key: &RecordKey, seen: u64) -> Option<Outcome> {
        if self.driven.contains(key) {
            return None;
        }
        let f = self.finished.get(key)?;
        let record = f.record.as_ref()?;
        if f.held_elsewhere
            || f.error.is_some()
            || record.version <= seen
            || !record.state.is_terminal()
        {
            return None;
        }
        Some(Outcome {
            record: record.clone(),
            output: f.output.clone(),
            error: None,
        })
    }

    /// Whether a waiter must read the store now, having last seen the
    /// record at version `seen` (`None`: not yet during this wait) `since`
    /// ago (or since the wait began). A waiter with no version reads; so
    /// does one whose key this runtime does not drive (another controller,
    /// or a due scan, may move it: C16's cadence). While this runtime
    /// drives the key, its finished notice is what ends the wait
    /// ([`Notices::settle_on_notice`]), so the waiter reads only every
    /// [`DRIVEN_POLL`] (issue 12: a wait read the store at every wake).
    pub fn needs_read(&self, key: &RecordKey, seen: Option<u64>, since: Duration) -> bool {
        seen.is_none() || !self.driven.contains(key) || since >= DRIVEN_POLL
    }

    /// Takes the telemetry delivered so far.
    pub fn take_telemetry(&mut self) -> Vec<Telemetry> {
        self.telemetry.drain(..).collect()
    }

    fn finished(&mut self, f: Finished) {
        let key = f.key.clone();
        if self.finished.insert(key.clone(), f).is_none() {
            self.order.push_back(key);
            if self.order.len() > MAX_NOTICES
                && let Some(old) = self.order.pop_front()
            {
                self.finished.remove(&old);
            }
        }
    }

    fn telemetry(&mut self, t: Telemetry) {
        if self.telemetry.len() >= self.telemetry_cap {
            self.telemetry.pop_front();
        }
        self.telemetry.push_back(t);
    }
}

/// Locks `notices`; a poisoned lock is still read (the data is plain).
pub fn lock(notices: &Mutex<Notices>) -> MutexGuard<'_, Notices> {
    notices.lock().unwrap_or_else(PoisonError::into_inner)
}

/// How a shell answers one waiter (a closure over its channel's sender),
/// and one built from a send.
pub use smolbox_core::managed::live::{Reply, reply};

/// A request of a runtime handle to its driver.
pub enum Command {
    /// Submit; answered at durable acceptance or refusal.
    Submit(Box<Submit>, Reply<Result<Submission, Error>>),
    /// Cancel; answered once the cancel time is persisted.
    Cancel(RecordKey, Reply<Result<ExecutionRecord, Error>>),
    /// A retained-machine request; answered by the controller.
    Machine(Box<MachineRequest>, Reply<Result<MachineAnswer, Error>>),
    /// A due scan now.
    Reconcile,
    /// Stop taking work; answered once nothing is outstanding.
    Shutdown(Reply<()>),
    /// A caller wants (`true`) or no longer wants the output of the key's
    /// command as it comes (see [`stream`]); sent before its submission.
    Stream(RecordKey, bool),
}

/// A retained-machine request and how its answer is read: one per method
/// of the shells' `Machines` (built by the functions of [`machine_call`]).
pub struct MachineCall<T> {
    request: MachineRequest,
    read: ReadAnswer<T>,
}

/// How a [`MachineCall`]'s answer is read.
pub type ReadAnswer<T> = fn(MachineAnswer) -> Result<T, Error>;

impl<T> std::fmt::Debug for MachineCall<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MachineCall").finish_non_exhaustive()
    }
}

impl<T> MachineCall<T> {
    /// The request for [`Command::Machine`] and the reader of its answer.
    pub fn into_parts(self) -> (MachineRequest, ReadAnswer<T>) {
        (self.request, self.read)
    }
}

/// The retained-machine requests of the shells' `Machines`, each with the
/// reading of its answer.
pub mod machine_call {
    use smolbox_core::Error;
    use smolbox_core::managed::controller::{MachineAnswer, MachineRequest, Resolution};
    use smolbox_core::managed::state::MachineOperation;
    use smolbox_core::managed::{ExecutionRecord, MachineRecord, RecordKey, RetainedMachineSpec};

    use super::MachineCall;

    fn record(a: MachineAnswer) -> Result<MachineRecord, Error> {
        a.into_machine().map(|(m, _)| m)
    }

    /// Create (deduplicated by scoped fingerprint): the record and whether
    /// it already existed.
    pub fn create(
        key: &RecordKey,
        spec: &RetainedMachineSpec,
    ) -> MachineCall<(MachineRecord, bool)> {
        MachineCall {
            request: MachineRequest::Create {
                key: key.clone(),
                spec: spec.clone(),
            },
            read: MachineAnswer::into_machine,
        }
    }

    /// A versioned start, stop or delete.
    pub fn lifecycle(
        key: &RecordKey,
        action: MachineOperation,
        version: u64,
    ) -> MachineCall<MachineRecord> {
        MachineCall {
            request: MachineRequest::Lifecycle {
                key: key.clone(),
                action,
                version,
            },
            read: record,
        }
    }

    /// A command with its declared files into the machine's slot.
    pub fn submit(
        machine: &RecordKey,
        key: &RecordKey,
        command: &smolbox_core::exec::Command,
        files: &smolbox_core::managed::CommandFiles,
    ) -> MachineCall<(ExecutionRecord, Option<MachineRecord>, bool)> {
        MachineCall {
            request: MachineRequest::Submit {
                machine: machine.clone(),
                key: key.clone(),
                command: command.clone(),
                files: files.clone(),
            },
            read: MachineAnswer::into_submitted,
        }
    }

    /// Observe the worker and record what it shows.
    pub fn reconcile(key: &RecordKey) -> MachineCall<MachineRecord> {
        MachineCall {
            request: MachineRequest::Reconcile { key: key.clone() },
            read: record,
        }
    }

    /// An ownership-verified stop for draining.
    pub fn stop_for_drain(key: &RecordKey, version: u64) -> MachineCall<MachineRecord> {
        MachineCall {
            request: MachineRequest::StopForDrain {
                key: key.clone(),
                version,
            },
            read: record,
        }
    }

    /// Quiescent resolution.
    pub fn resolve(
        key: &RecordKey,
        version: u64,
        quiesced: bool,
        disposition: Resolution,
    ) -> MachineCall<(MachineRecord, Option<ExecutionRecord>)> {
        MachineCall {
            request: MachineRequest::Resolve {
                key: key.clone(),
                version,
                quiesced,
                disposition,
            },
            read: MachineAnswer::into_resolved,
        }
    }

    /// The recorded incarnation's console history (`tail` lines).
    pub fn logs(
        key: &RecordKey,
        params: smolbox_core::worker::LogsParams,
    ) -> MachineCall<Vec<String>> {
        MachineCall {
            request: MachineRequest::Logs {
                key: key.clone(),
                params,
            },
            read: MachineAnswer::into_logs,
        }
    }

    /// The recorded incarnation's measurements, with the record they were
    /// checked against.
    pub fn measurements(
        key: &RecordKey,
    ) -> MachineCall<(smolbox_core::worker::Measurements, MachineRecord)> {
        MachineCall {
            request: MachineRequest::Measurements { key: key.clone() },
            read: MachineAnswer::into_measurements,
        }
    }
}

/// The answer to an op the shell performed for the controller.
#[derive(Debug)]
pub enum Answer {
    /// A store op's result.
    Stored(OpId, Box<StoreResult>),
    /// A worker op's result.
    Worker(OpId, WorkerResult),
}

/// What a shell does for [`Host::drain`]: start the ops on its own tasks
/// or threads and hand each result back as an [`Answer`].
pub trait Perform {
    /// Starts store op `id`. An `Err` means it was not started (nothing
    /// reached the store); it is fed back at once as the op's result.
    ///
    /// # Errors
    /// The op could not be started.
    fn store(&mut self, id: OpId, op: StoreOp) -> Result<(), Error>;

    /// Starts worker op `id`. An `Err` means it was not started (nothing
    /// was sent); it is fed back at once as the op's result.
    ///
    /// # Errors
    /// The op could not be started.
    fn worker(&mut self, id: OpId, op: WorkerOp) -> Result<(), Error>;

    /// A managed terminal's record found due by the controller's scan
    /// (`ControllerEvent::TerminalDue`): handed to the runtime's terminals
    /// (`Terminals::due`, the core's `LiveSet::due_row` decides), which
    /// give it to a live run of its key; otherwise the shell recovers the
    /// key (C7.4), off the driver (it waits for the run's first step).
    fn terminal_due(&mut self, row: ExecutionRecord);

    /// True while a managed terminal run of this runtime is live: they
    /// take claims under the controller's owner, so a shutdown keeps the
    /// machine claims and worker leases meanwhile.
    fn terminals_live(&self) -> bool;
}

/// The driver's bookkeeping around one [`Controller`]: every decision is
/// the controller's; this only routes inputs in and answers out.
pub struct Host {
    controller: Controller,
    clock: Arc<dyn Clock>,
    accept_waiters: BTreeMap<RecordKey, VecDeque<Reply<Result<Submission, Error>>>>,
    cancel_waiters: BTreeMap<RecordKey, VecDeque<Reply<Result<ExecutionRecord, Error>>>>,
    machine_waiters: BTreeMap<RequestId, Reply<Result<MachineAnswer, Error>>>,
    stop_waiters: Vec<Reply<()>>,
    stopped: bool,
}

impl std::fmt::Debug for Host {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Host")
            .field("stopped", &self.stopped)
            .finish_non_exhaustive()
    }
}

impl Host {
    fn now(&self) -> (Instant, u64) {
        (self.clock.now(), self.clock.now_ms())
    }

    /// True once the controller stopped (after a shutdown, nothing left).
    pub fn is_stopped(&self) -> bool {
        self.stopped
    }

    /// When the driver must call [`Host::handle_timeout`], on the clock's
    /// monotonic time.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.controller.poll_timeout()
    }

    /// The controller's timers.
    pub fn handle_timeout(&mut self) {
        let (now, now_ms) = self.now();
        self.controller.handle_timeout(now, now_ms);
    }

    /// Every handle is gone: finish what is in flight, then stop.
    pub fn close(&mut self) {
        let (now, now_ms) = self.now();
        self.controller.shutdown(now, now_ms);
    }

    /// A performed op's result.
    pub fn handle_answer(&mut self, answer: Answer) {
        let (now, now_ms) = self.now();
        match answer {
            Answer::Stored(id, r) => {
                trace::store_result(id, &r);
                self.controller.handle_stored(now, now_ms, id, *r);
            }
            Answer::Worker(id, r) => {
                trace::worker_result(id, &r);
                self.controller.handle_worker(now, now_ms, id, r);
            }
        }
    }

    /// A handle's request.
    pub fn command(&mut self, cmd: Command) {
        let (now, now_ms) = self.now();
        match cmd {
            Command::Submit(submit, reply) => {
                let key = submit.key.clone();
                match self.controller.submit(now, now_ms, *submit) {
                    Ok(()) => self.accept_waiters.entry(key).or_default().push_back(reply),
                    Err(e) => reply(Err(e)),
                }
            }
            Command::Cancel(key, reply) => {
                self.cancel_waiters
                    .entry(key.clone())
                    .or_default()
                    .push_back(reply);
                self.controller.cancel(now, now_ms, key);
            }
            Command::Machine(req, reply) => match self.controller.machine(now, now_ms, *req) {
                Ok(id) => {
                    self.machine_waiters.insert(id, reply);
                }
                Err(e) => reply(Err(e)),
            },
            Command::Reconcile => self.controller.reconcile(now, now_ms),
            Command::Stream(key, on) => self.controller.stream_output(key, on),
            Command::Shutdown(reply) => {
                if self.stopped {
                    reply(());
                } else {
                    self.stop_waiters.push(reply);
                    self.controller.shutdown(now, now_ms);
                }
            }
        }
    }

    /// Starts every op the controller asks for through `io` and delivers
    /// its events (answers to waiters, notices, telemetry). Returns true
    /// when waiters of `notices` should look again.
    pub fn drain(&mut self, notices: &Mutex<Notices>, io: &mut impl Perform) -> bool {
        let now = self.clock.now();
        self.controller.set_terminals_live(now, io.terminals_live());
        while let Some((id, op)) = self.controller.poll_store_op() {
            trace::store_op(id, &op);
            if let Err(e) = io.store(id, op) {
                let (now, now_ms) = self.now();
                self.controller.handle_stored(now, now_ms, id, Err(e));
            }
        }
        while let Some((id, op)) = self.controller.poll_worker_op() {
            trace::worker_op(id, &op);
            if let Err(e) = io.worker(id, op) {
                let (now, now_ms) = self.now();
                self.controller.handle_worker(now, now_ms, id, Err(e));
            }
        }
        // Keys leave the driven set only after the events are delivered:
        // a waiter that sees its key undriven also sees its finished notice
        // (with the output), or it would settle on the stored record
        // without it. A key being accepted is driven from its submission
        // (`active_keys` includes it), so a submitter answered here already
        // sees it driven.
        let mut changed = false;
        while let Some(event) = self.controller.poll_event() {
            changed |= self.deliver(notices, io, event);
        }
        let mut n = lock(notices);
        let driven: BTreeSet<RecordKey> = self.controller.active_keys().cloned().collect();
        if driven != n.driven {
            n.driven = driven;
            changed = true;
        }
        changed
    }

    /// Delivers one event; true when waiters should look again.
    fn deliver(
        &mut self,
        notices: &Mutex<Notices>,
        io: &mut impl Perform,
        event: ControllerEvent,
    ) -> bool {
        trace::event(&event);
        match event {
            ControllerEvent::Accepted {
                key,
                existing,
                record,
            } => {
                if let Some(reply) = pop(&mut self.accept_waiters, &key) {
                    reply(Ok(Submission {
                        key,
                        existing,
                        version: record.version,
                    }));
                }
                true
            }
            ControllerEvent::Refused { key, error } => {
                if let Some(reply) = pop(&mut self.accept_waiters, &key) {
                    reply(Err(error));
                }
                false
            }
            ControllerEvent::CancelRecorded { key, result } => {
                if let Some(reply) = pop(&mut self.cancel_waiters, &key) {
                    reply(result.map(|r| *r));
                }
                true
            }
            ControllerEvent::Finished(f) => {
                lock(notices).finished(*f);
                true
            }
            ControllerEvent::Telemetry(t) => {
                lock(notices).telemetry(t);
                false
            }
            ControllerEvent::Machine(d) => {
                if let Some(reply) = self.machine_waiters.remove(&d.id) {
                    reply(d.result);
                }
                true
            }
            ControllerEvent::TerminalDue(rec) => {
                io.terminal_due(*rec);
                false
            }
            ControllerEvent::Stopped => {
                self.stopped = true;
                for reply in self.stop_waiters.drain(..) {
                    reply(());
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code

    use smolbox_core::managed::state::{ExecState, RecordEvidence};
    use smolbox_core::managed::testkit;

    use super::*;
    use crate::{MemoryConfig, MemoryStore};
    use smolbox_core::Category;

    /// A runtime type for the builder, never started.
    struct Inert;

    impl Build for Inert {
        type Client = ();
        fn build(_: Builder<Self>) -> Result<Self, Error> {
            Ok(Self)
        }
    }

    /// A memory store and the runtime parts of an ephemeral runtime with
    /// one worker `w1`.
    fn w1_parts() -> (Arc<dyn Store>, Parts<()>) {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new(MemoryConfig::default()).unwrap());
        let p = Builder::<Inert>::new(Arc::clone(&store), testkit::fingerprint_key())
            .ephemeral(true)
            .worker("w1", ())
            .into_parts()
            .unwrap();
        (store, p)
    }

    /// A submission of `true` on `w1`'s machine `m1` under `key`.
    fn submit_true(key: RecordKey) -> Submit {
        let command = smolbox_core::exec::Command::new(["true"]);
        let target = smolbox_core::managed::controller::RunTarget::unverified();
        let spec =
            smolbox_core::managed::controller::spec_for(&command, &target, "w1", "m1").unwrap();
        Submit { key, spec }
    }

    fn telemetry(id: &str) -> Telemetry {
        Telemetry {
            epoch: 0,
            dropped: 0,
            key: testkit::key("s", id),
            version: 1,
            lifecycle: smolbox_core::managed::controller::Lifecycle::Execution {
                state: ExecState::Accepted,
                evidence: RecordEvidence::NotDispatched,
            },
        }
    }

    fn finished(id: &str) -> Finished {
        Finished {
            key: testkit::key("s", id),
            record: None,
            output: None,
            error: None,
            dispatched: false,
            held_elsewhere: false,
        }
    }

    #[test]
    fn telemetry_keeps_the_newest_n_and_drops_the_oldest_at_n_plus_1() {
        let mut n = Notices::new(2);
        n.telemetry(telemetry("a"));
        n.telemetry(telemetry("b"));
        assert_eq!(n.take_telemetry().len(), 2);
        for id in ["a", "b", "c"] {
            n.telemetry(telemetry(id));
        }
        let kept: Vec<String> = n.take_telemetry().into_iter().map(|t| t.key.id).collect();
        assert_eq!(kept, ["b", "c"]);
        assert!(n.take_telemetry().is_empty());
        // A cap of 0 keeps one.
        let mut n = Notices::new(0);
        n.telemetry(telemetry("a"));
        n.telemetry(telemetry("b"));
        assert_eq!(n.take_telemetry().len(), 1);
    }

    #[test]
    fn finished_notices_keep_n_and_retire_the_oldest_at_n_plus_1() {
        let mut n = Notices::default();
        for i in 0..MAX_NOTICES {
            n.finished(finished(&format!("f{i}")));
        }
        assert_eq!(n.finished.len(), MAX_NOTICES);
        assert!(n.finished.contains_key(&testkit::key("s", "f0")));
        n.finished(finished("last"));
        assert_eq!(n.finished.len(), MAX_NOTICES);
        assert!(!n.finished.contains_key(&testkit::key("s", "f0")));
        assert!(n.finished.contains_key(&testkit::key("s", "last")));
    }

    #[test]
    fn a_notice_settles_a_wait_without_a_read_only_when_its_record_is_newer_terminal_and_clean() {
        let key = testkit::key("s", "w");
        let done = testkit::exec_in(ExecState::Completed, key.clone(), 1_000).unwrap();
        let v = done.version;
        let notice = |f: &dyn Fn(&mut Finished)| {
            let mut n = Notices::default();
            let mut x = finished("w");
            x.record = Some(done.clone());
            x.output = Some(smolbox_core::exec::ExecOutput::empty(
                smolbox_core::exec::OutputEncoding::Bytes,
            ));
            f(&mut x);
            n.finished(x);
            n
        };
        let clean = notice(&|_| {});
        // Newer than the waiter's read (v - 1): settled, with the output,
        // exactly as a read of the older version would have settled.
        let o = clean.settle_on_notice(&key, v - 1).unwrap();
        assert_eq!(o.record, done);
        assert!(o.output.is_some() && o.error.is_none());
        let mut older = done.clone();
        older.version = v - 1;
        assert_eq!(clean.settle(&key, older), Some(o));
        // Not newer than what the waiter read (v): read the store again.
        assert_eq!(clean.settle_on_notice(&key, v), None);
        // Another key, or no notice: nothing.
        assert_eq!(clean.settle_on_notice(&testkit::key("s", "x"), 0), None);
        assert_eq!(Notices::default().settle_on_notice(&key, 0), None);
        // Still driven here: not yet.
        let mut driven = notice(&|_| {});
        driven.driven.insert(key.clone());
        assert_eq!(driven.settle_on_notice(&key, 0), None);
        // Held elsewhere, ended with an error, without a stored record, or
        // not terminal (`unknown`, `running`): the store decides.
        for n in [
            notice(&|f| f.held_elsewhere = true),
            notice(&|f| {
                f.error = Some(Error::store(
                    Operation::StoreWrite,
                    Evidence::Unknown,
                    Reason::StoreThreadLost,
                ));
            }),
            notice(&|f| f.record = None),
            notice(&|f| {
                if let Some(r) = f.record.as_mut() {
                    r.state = ExecState::Unknown;
                }
            }),
            notice(&|f| {
                f.record = Some(testkit::exec_in(ExecState::Running, key.clone(), 1_000).unwrap());
            }),
        ] {
            assert_eq!(n.settle_on_notice(&key, 0), None);
        }
    }

    #[test]
    fn a_waiter_reads_unless_this_runtime_drives_the_key_within_the_driven_poll() {
        let key = testkit::key("s", "w");
        let mut n = Notices::default();
        let just_under = DRIVEN_POLL - Duration::from_millis(1);
        // Not driven here: read (another controller may move it).
        assert!(n.needs_read(&key, Some(1), Duration::ZERO));
        n.driven.insert(key.clone());
        // Nothing seen yet during this wait: read.
        assert!(n.needs_read(&key, None, Duration::ZERO));
        // Driven, seen: the notice ends the wait; read only at the poll.
        assert!(!n.needs_read(&key, Some(1), Duration::ZERO));
        assert!(!n.needs_read(&key, Some(1), just_under));
        assert!(n.needs_read(&key, Some(1), DRIVEN_POLL));
        // Another key is not driven.
        assert!(n.needs_read(&testkit::key("s", "x"), Some(1), Duration::ZERO));
    }

    #[test]
    fn a_non_durable_store_is_refused_unless_ephemeral() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new(MemoryConfig::default()).unwrap());
        let b = Builder::<Inert>::new(Arc::clone(&store), testkit::fingerprint_key());
        assert_eq!(
            b.check_durable().unwrap_err().reason(),
            Reason::StoreNotDurable
        );
        let b = Builder::<Inert>::new(store, testkit::fingerprint_key()).ephemeral(true);
        assert!(b.check_durable().is_ok());
        assert!(b.build().is_ok());
    }

    #[test]
    fn a_bad_option_is_refused_before_anything_starts() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new(MemoryConfig::default()).unwrap());
        let b = Builder::<Inert>::new(store, testkit::fingerprint_key())
            .ephemeral(true)
            .max_active(0);
        let e = b.into_parts().err().unwrap();
        assert_eq!(e.category(), Category::Validation);
    }

    /// Records what the host starts; every store op fails at once.
    #[derive(Default)]
    struct Failing {
        store_ops: Vec<&'static str>,
    }

    impl Perform for Failing {
        fn store(&mut self, _: OpId, op: StoreOp) -> Result<(), Error> {
            self.store_ops.push(op.name());
            Err(Error::store(
                Operation::StoreWrite,
                Evidence::Unknown,
                Reason::StoreThreadLost,
            ))
        }
        fn worker(&mut self, _: OpId, _: WorkerOp) -> Result<(), Error> {
            unreachable!("nothing is dispatched without a durable record")
        }
        fn terminal_due(&mut self, _: ExecutionRecord) {}
        fn terminals_live(&self) -> bool {
            false
        }
    }

    #[test]
    fn a_store_op_that_cannot_start_answers_the_submitter_with_the_store_error() {
        let (_store, p) = w1_parts();
        let mut host = p.host;
        let notices = Mutex::new(p.notices);
        let got = Arc::new(Mutex::new(None));
        let g = Arc::clone(&got);
        let submit = submit_true(testkit::key("s", "e1"));
        host.command(Command::Submit(
            Box::new(submit),
            Box::new(move |r| *g.lock().unwrap() = Some(r)),
        ));
        let mut io = Failing::default();
        for _ in 0..4 {
            host.drain(&notices, &mut io);
        }
        assert!(!io.store_ops.is_empty());
        let answer = got.lock().unwrap().take().unwrap();
        let e = answer.unwrap_err();
        assert_eq!(e.category(), Category::Store, "{e:?} {:?}", io.store_ops);
        assert!(!host.is_stopped());
    }

    /// Counts the driver's wake-ups.
    #[derive(Default)]
    struct Count(std::sync::atomic::AtomicUsize);

    impl Wake for Count {
        fn wake_all(&self) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    /// Performs store ops at once on a memory store and keeps the answers
    /// for the test to hand back; no worker op can start.
    struct Inline {
        store: Arc<dyn Store>,
        answers: Arc<Mutex<Vec<Answer>>>,
    }

    impl Perform for Inline {
        fn store(&mut self, id: OpId, op: StoreOp) -> Result<(), Error> {
            let r = crate::apply_op(self.store.as_ref(), &op);
            self.answers
                .lock()
                .unwrap()
                .push(Answer::Stored(id, Box::new(r)));
            Ok(())
        }
        fn worker(&mut self, _: OpId, _: WorkerOp) -> Result<(), Error> {
            Err(Error::validation(Operation::Config, Reason::UnknownWorker))
        }
        fn terminal_due(&mut self, _: ExecutionRecord) {}
        fn terminals_live(&self) -> bool {
            false
        }
    }

    /// A submitter answered during a turn sees its key driven at once (a
    /// `run` then waits for the notice without a store read), and the key
    /// leaves the driven set only with its finished notice in place.
    #[test]
    fn a_submitter_sees_its_key_driven_when_answered_and_undriven_only_with_its_notice() {
        let (store, p) = w1_parts();
        let mut host = p.host;
        let notices = Arc::new(Mutex::new(p.notices));
        let key = testkit::key("s", "d1");
        let seen = Arc::new(Mutex::new(None));
        let (n, k, s) = (Arc::clone(&notices), key.clone(), Arc::clone(&seen));
        host.command(Command::Submit(
            Box::new(submit_true(key.clone())),
            Box::new(move |r| {
                let driven = lock(&n).driven.contains(&k);
                *s.lock().unwrap() = Some((r.is_ok(), driven));
            }),
        ));
        let performed = Arc::new(Mutex::new(Vec::new()));
        let mut io = Inline {
            store,
            answers: Arc::clone(&performed),
        };
        for _ in 0..16 {
            host.drain(&notices, &mut io);
            // Between turns: never undriven without the finished notice.
            {
                let n = lock(&notices);
                if seen.lock().unwrap().is_some() && !n.driven.contains(&key) {
                    assert!(n.finished.contains_key(&key), "undriven before its notice");
                }
            }
            for a in std::mem::take(&mut *performed.lock().unwrap()) {
                host.handle_answer(a);
            }
        }
        assert_eq!(
            *seen.lock().unwrap(),
            Some((true, true)),
            "answered, and driven when answered"
        );
        // The exec could not start here: the execution ended, noticed.
        let n = lock(&notices);
        assert!(!n.driven.contains(&key));
        assert!(n.finished.contains_key(&key));
    }

    #[test]
    fn the_driver_wakes_waiters_on_a_delivery_and_stops_only_once_closed() {
        let (store, p) = w1_parts();
        let shared = Arc::new(Shared::<Count>::new(p.notices));
        let woken = || shared.changed.0.load(std::sync::atomic::Ordering::SeqCst);
        let answers = Arc::new(Mutex::new(Vec::new()));
        let performed = Arc::new(Mutex::new(Vec::new()));
        let io = Inline {
            store,
            answers: Arc::clone(&performed),
        };
        let mut driver = Driver::new(p.host, Arc::clone(&shared), io);
        // One turn and the answers it produced, handed back.
        let step = |driver: &mut Driver<Count, Inline>| {
            let turn = driver.turn();
            let done = std::mem::take(&mut *performed.lock().unwrap());
            for a in done {
                driver.handle(Input::Answer(a));
            }
            turn
        };
        assert!(matches!(step(&mut driver), Turn::Wait(_)));
        let before = woken();
        let got = Arc::clone(&answers);
        let submit = submit_true(testkit::key("s", "e1"));
        driver.handle(Input::Command(Command::Submit(
            Box::new(submit),
            Box::new(move |r| got.lock().unwrap().push(r)),
        )));
        for _ in 0..8 {
            // Never stopped while a handle may still send.
            assert_ne!(step(&mut driver), Turn::Stop);
        }
        assert!(answers.lock().unwrap().pop().unwrap().is_ok());
        assert!(woken() > before, "the acceptance wakes the waiters");
        driver.handle(Input::Close);
        let turns = (0..16)
            .take_while(|_| step(&mut driver) != Turn::Stop)
            .count();
        assert!(turns < 16, "a closed driver with nothing in flight stops");
    }
}
