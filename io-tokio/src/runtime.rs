//! The managed runtime (DESIGN.md §5a): a driver of one
//! [`smolbox_core::managed::controller::Controller`] per runtime.
//!
//! The driver task runs the shared driver's turns
//! ([`smolbox_store::runtime::Driver`] over the controller's bookkeeping,
//! written once with the blocking shell). It
//! performs the controller's store ops on tokio's blocking pool (at most
//! `max_active + 2` at once) through [`smolbox_store::apply_op`], its worker
//! ops through the configured workers' [`Client`]s, feeds every answer back,
//! and wakes at the controller's `poll_timeout`. It makes no decision of
//! its own: acceptance, dispatch, renewal, cancellation, deadlines and
//! recovery are the controller's.
//!
//! The public API is the same in both shells: [`Runtime::builder`] →
//! [`RuntimeBuilder::build`], then [`Runtime::submit`] (returns at durable
//! acceptance), [`Runtime::fetch`], [`Runtime::wait`] (never cancels, safe
//! to repeat), [`Runtime::cancel`], [`Runtime::reconcile`],
//! [`Runtime::shutdown`] and [`Runtime::run`] (submit + wait).

use smolbox_core::Reason;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

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
    Wake, files, lock, machine_call, reply, stopped, wait_expired,
};
pub use smolbox_store::runtime::{
    Clock, MAX_NOTICES, MAX_WAIT_MS, SystemClock, WAIT_POLL, default_owner,
};
use tokio::sync::{Notify, Semaphore, mpsc, oneshot};

use crate::Client;
use crate::managed_terminal::ManagedTerminals;

mod stream;

/// Options of a [`Runtime`] (C12.1); [`RuntimeBuilder::build`] checks them
/// and starts the driver task on the current tokio runtime.
pub type RuntimeBuilder = Builder<Runtime>;

impl Build for Runtime {
    type Client = Client;

    fn build(builder: RuntimeBuilder) -> Result<Self, Error> {
        builder.check_durable()?;
        let handle = tokio::runtime::Handle::try_current()
            .map_err(|_| Error::validation(Operation::Config, Reason::NoTokioRuntime))?;
        let p = builder.into_parts()?;
        let terminals = ManagedTerminals::new(&p)?;
        let shared = Arc::new(Shared::new(p.notices));
        let (cmd_tx, cmd_rx) = mpsc::unbounded_channel();
        let (res_tx, res_rx) = mpsc::unbounded_channel();
        let streams = Arc::new(stream::Sinks::default());
        let io = Io {
            terminals: terminals.clone(),
            store: Arc::clone(&p.store),
            clients: p.clients,
            res_tx,
            pool: Arc::new(Semaphore::new(p.max_active + 2)),
            streams: Arc::clone(&streams),
            artifacts: p.artifacts,
        };
        let driver = Driver::new(p.host, Arc::clone(&shared), io);
        handle.spawn(tracing::Instrument::instrument(
            drive(driver, cmd_rx, res_rx),
            p.span,
        ));
        Ok(Self {
            store: p.store,
            cmd: cmd_tx,
            shared,
            terminals,
            streams,
        })
    }
}

/// Wakes the runtime's waiters: a tokio `Notify` ([`Wake`] for the
/// shared driver).
#[derive(Debug, Default)]
struct Changed(Notify);

impl Wake for Changed {
    fn wake_all(&self) {
        self.0.notify_waiters();
    }
}

/// Runs managed commands through a controller over a durable store.
pub struct Runtime {
    store: Arc<dyn Store>,
    cmd: mpsc::UnboundedSender<Command>,
    shared: Arc<Shared<Changed>>,
    terminals: ManagedTerminals,
    /// Sinks of the streamed executions callers wait for.
    streams: Arc<stream::Sinks>,
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
    async fn ask<T: Send + 'static>(
        &self,
        op: Operation,
        make: impl FnOnce(Reply<Result<T, Error>>) -> Command,
    ) -> Result<T, Error> {
        let (tx, rx) = oneshot::channel();
        self.cmd
            .send(make(reply(move |v| tx.send(v).is_ok())))
            .map_err(|_| stopped(op))?;
        rx.await.map_err(|_| stopped(op))?
    }

    /// Submits a command; returns once the record is durable (or already
    /// was, `existing`). Nothing is sent before that.
    ///
    /// # Errors
    /// `validation` / `unsupported_capability` (nothing stored),
    /// `identity_conflict` for a changed spec under the same key,
    /// `admission_exhausted`, or the store's error (never read as absence;
    /// an ambiguous acceptance is resolved by submitting the same spec again).
    pub async fn submit(&self, submit: Submit) -> Result<Submission, Error> {
        self.ask(Operation::Submit, |r| Command::Submit(Box::new(submit), r))
            .await
    }

    /// The stored record.
    ///
    /// # Errors
    /// `not_found` only when the store positively reports absence; `store`
    /// on failure.
    pub async fn fetch(&self, key: &RecordKey) -> Result<ExecutionRecord, Error> {
        let store = Arc::clone(&self.store);
        let key = key.clone();
        blocking(Operation::StoreFetch, move || store.fetch(&key)).await
    }

    /// Waits up to `timeout_ms` (0–900,000) for the record to be terminal
    /// or `unknown`. Never cancels; safe to repeat.
    ///
    /// # Errors
    /// `validation` for a bad timeout; `expired` (operation `await`) when
    /// the time ran out; the store's error.
    pub async fn wait(&self, key: &RecordKey, timeout_ms: u64) -> Result<Outcome, Error> {
        self.wait_from(key, timeout_ms, None).await
    }

    /// [`Runtime::wait`] by a waiter that already saw the record at
    /// version `seen` (its submission's acceptance).
    async fn wait_from(
        &self,
        key: &RecordKey,
        timeout_ms: u64,
        mut seen: Option<u64>,
    ) -> Result<Outcome, Error> {
        if timeout_ms > MAX_WAIT_MS {
            return Err(Error::validation(Operation::Await, Reason::WaitTimeout)
                .with_limit(timeout_ms, MAX_WAIT_MS));
        }
        let mut read_at = tokio::time::Instant::now();
        let deadline = read_at + Duration::from_millis(timeout_ms);
        // `seen`: the version this wait last saw; a finished notice of a
        // newer terminal record settles without another read, and while
        // this runtime drives the key the notice is waited for.
        loop {
            let notified = self.shared.changed.0.notified();
            let read = {
                let n = lock(&self.shared.notices);
                if let Some(v) = seen
                    && let Some(o) = n.settle_on_notice(key, v)
                {
                    return Ok(o);
                }
                n.needs_read(key, seen, read_at.elapsed())
            };
            if read {
                let record = self.fetch(key).await?;
                read_at = tokio::time::Instant::now();
                seen = Some(record.version);
                if let Some(o) = lock(&self.shared.notices).settle(key, record) {
                    return Ok(o);
                }
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Err(wait_expired());
            }
            let step = (deadline - now).min(WAIT_POLL);
            let _ = tokio::time::timeout(step, notified).await;
        }
    }

    /// Requests cancellation (C16); returns the record with the persisted
    /// cancel time. Cancelling a finished record changes nothing.
    ///
    /// # Errors
    /// `not_found` for an absent record; the store's error.
    pub async fn cancel(&self, key: &RecordKey) -> Result<ExecutionRecord, Error> {
        self.ask(Operation::Cancel, |r| Command::Cancel(key.clone(), r))
            .await
    }

    /// Takes the lifecycle telemetry delivered so far (C20): identifiers,
    /// states and evidence only. Bounded and lossy: an entry's `epoch` and
    /// `dropped` say whether entries were lost before it.
    pub fn telemetry(&self) -> Vec<Telemetry> {
        lock(&self.shared.notices).take_telemetry()
    }

    /// Schedules a due scan now (observation only; never a replay).
    pub fn reconcile(&self) {
        let _ = self.cmd.send(Command::Reconcile);
    }

    /// Stops taking work and returns once nothing is outstanding
    /// (executions already dispatched are driven to their end) and the
    /// claims this runtime held are released, so the next controller need
    /// not wait out the TTL (C15; a crash releases nothing). Dropping the
    /// runtime starts the same shutdown without waiting for it.
    pub async fn shutdown(&self) {
        let (tx, rx) = oneshot::channel();
        if self
            .cmd
            .send(Command::Shutdown(reply(move |v| tx.send(v).is_ok())))
            .is_ok()
        {
            let _ = rx.await;
        }
    }

    /// [`Runtime::submit`], then [`Runtime::wait`] until the record is
    /// terminal or `unknown`.
    ///
    /// # Errors
    /// As [`Runtime::submit`] and [`Runtime::wait`].
    pub async fn run(&self, submit: Submit) -> Result<Outcome, Error> {
        let s = self.submit(submit).await?;
        loop {
            match self.wait_from(&s.key, MAX_WAIT_MS, Some(s.version)).await {
                Err(e)
                    if e.category() == Category::Expired && e.operation() == Operation::Await => {}
                other => return other,
            }
        }
    }
}

/// Runs a store call on tokio's blocking pool. A lost task is a `store`
/// failure (never absence).
async fn blocking<T, F>(op: Operation, f: F) -> Result<T, Error>
where
    F: FnOnce() -> Result<T, Error> + Send + 'static,
    T: Send + 'static,
{
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|_| Err(Error::store(op, Evidence::Unknown, Reason::StoreTaskLost)))
}

/// Retained machines through the runtime (C14, C17.3): every request goes
/// through the controller; `list`, `inspect` and `wait` read the store.
#[derive(Debug)]
pub struct Machines<'a> {
    rt: &'a Runtime,
}

impl Machines<'_> {
    async fn call<T: Send + 'static>(&self, call: MachineCall<T>) -> Result<T, Error> {
        let (req, read) = call.into_parts();
        let answer = self
            .rt
            .ask(Operation::Submit, |r| Command::Machine(Box::new(req), r))
            .await?;
        read(answer)
    }

    /// Creates a machine (deduplicated by scoped fingerprint, tombstones
    /// included); returns the durable record and whether it already existed.
    ///
    /// # Errors
    /// `validation`, `identity_conflict`, `admission_exhausted`, the store's.
    pub async fn create(
        &self,
        key: &RecordKey,
        spec: &RetainedMachineSpec,
    ) -> Result<(MachineRecord, bool), Error> {
        self.call(machine_call::create(key, spec)).await
    }

    /// Machines of `scope` (deleted included), by id after `cursor`;
    /// `limit` 1–100, default 20.
    ///
    /// # Errors
    /// `validation` for a bad limit; the store's error.
    pub async fn list(
        &self,
        scope: &str,
        cursor: Option<&str>,
        limit: Option<u32>,
    ) -> Result<Page<MachineRecord>, Error> {
        let limit = check_list_limit(limit)?;
        let store = Arc::clone(&self.rt.store);
        let (scope, cursor) = (scope.to_owned(), cursor.map(str::to_owned));
        blocking(Operation::List, move || {
            store.list_machines(&scope, cursor.as_deref(), limit)
        })
        .await
    }

    /// The stored record (store only).
    ///
    /// # Errors
    /// `not_found` only on positive absence; the store's error.
    pub async fn inspect(&self, key: &RecordKey) -> Result<MachineRecord, Error> {
        let store = Arc::clone(&self.rt.store);
        let key = key.clone();
        blocking(Operation::StoreFetch, move || store.fetch_machine(&key)).await
    }

    /// Waits up to `timeout_ms` (0–900,000) until the machine is idle or
    /// `unknown` / `missing` / `conflict` / `deleted`.
    ///
    /// # Errors
    /// `validation` for a bad timeout; `expired` when time ran out.
    pub async fn wait(&self, key: &RecordKey, timeout_ms: u64) -> Result<MachineRecord, Error> {
        check_wait_ms(timeout_ms)?;
        let deadline = tokio::time::Instant::now() + Duration::from_millis(timeout_ms);
        loop {
            let notified = self.rt.shared.changed.0.notified();
            let rec = self.inspect(key).await?;
            if machine_settled(&rec) {
                return Ok(rec);
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Err(wait_expired());
            }
            let _ = tokio::time::timeout((deadline - now).min(WAIT_POLL), notified).await;
        }
    }

    /// Versioned start (returns once the request is durable).
    ///
    /// # Errors
    /// `stale_version`, `admission_exhausted`, the store's error.
    pub async fn start(&self, key: &RecordKey, version: u64) -> Result<MachineRecord, Error> {
        self.call(machine_call::lifecycle(
            key,
            MachineOperation::Start,
            version,
        ))
        .await
    }

    /// Versioned stop (rejected while a command holds the slot).
    ///
    /// # Errors
    /// As [`Machines::start`].
    pub async fn stop(&self, key: &RecordKey, version: u64) -> Result<MachineRecord, Error> {
        self.call(machine_call::lifecycle(
            key,
            MachineOperation::Stop,
            version,
        ))
        .await
    }

    /// Versioned delete (rejected while a command holds the slot).
    ///
    /// # Errors
    /// As [`Machines::start`].
    pub async fn delete(&self, key: &RecordKey, version: u64) -> Result<MachineRecord, Error> {
        self.call(machine_call::lifecycle(
            key,
            MachineOperation::Delete,
            version,
        ))
        .await
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
    pub async fn submit(
        &self,
        machine: &RecordKey,
        key: &RecordKey,
        command: &smolbox_core::exec::Command,
    ) -> Result<(ExecutionRecord, Option<MachineRecord>, bool), Error> {
        self.submit_with_files(machine, key, command, &CommandFiles::default())
            .await
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
    pub async fn submit_with_files(
        &self,
        machine: &RecordKey,
        key: &RecordKey,
        command: &smolbox_core::exec::Command,
        files: &CommandFiles,
    ) -> Result<(ExecutionRecord, Option<MachineRecord>, bool), Error> {
        self.call(machine_call::submit(machine, key, command, files))
            .await
    }

    /// Observes the worker and records what it shows (C14.2).
    ///
    /// # Errors
    /// `stale_version` when the record changed during the observation.
    pub async fn reconcile(&self, key: &RecordKey) -> Result<MachineRecord, Error> {
        self.call(machine_call::reconcile(key)).await
    }

    /// Records an ownership-verified stop for draining (C17.3); the slot
    /// keeps its command.
    ///
    /// # Errors
    /// `stale_version`, `identity_conflict`, the worker's or store's error.
    pub async fn stop_for_drain(
        &self,
        key: &RecordKey,
        version: u64,
    ) -> Result<MachineRecord, Error> {
        self.call(machine_call::stop_for_drain(key, version)).await
    }

    /// Quiescent resolution (C17.3).
    ///
    /// # Errors
    /// `validation` without `quiesced`; `identity_conflict` for a running
    /// or different incarnation; an outage's error (nothing changed).
    pub async fn resolve(
        &self,
        key: &RecordKey,
        version: u64,
        quiesced: bool,
        disposition: Resolution,
    ) -> Result<(MachineRecord, Option<ExecutionRecord>), Error> {
        self.call(machine_call::resolve(key, version, quiesced, disposition))
            .await
    }

    /// The machine's console history (C14.2): the recorded incarnation is
    /// inspected first, then its `tail` lines are read (`follow` refused).
    ///
    /// # Errors
    /// `validation` for bad bounds or `follow`; `no_creation_evidence` or
    /// `not_found` (deleted) before any worker call; `identity_conflict`
    /// when another incarnation holds the name; the worker's error.
    pub async fn logs(
        &self,
        key: &RecordKey,
        params: smolbox_core::worker::LogsParams,
    ) -> Result<Vec<String>, Error> {
        self.call(machine_call::logs(key, params)).await
    }

    /// The machine's measurements (C14.2, C2.4) from an inspect of the
    /// recorded incarnation, with the record they were checked against.
    ///
    /// # Errors
    /// As [`Machines::logs`].
    pub async fn measurements(
        &self,
        key: &RecordKey,
    ) -> Result<(smolbox_core::worker::Measurements, MachineRecord), Error> {
        self.call(machine_call::measurements(key)).await
    }
}

impl Runtime {
    /// Retained machines (C14).
    pub fn machines(&self) -> Machines<'_> {
        Machines { rt: self }
    }
}

/// What the driver starts for the controller: tasks.
struct Io {
    terminals: ManagedTerminals,
    store: Arc<dyn Store>,
    clients: std::collections::BTreeMap<String, Client>,
    res_tx: mpsc::UnboundedSender<Answer>,
    pool: Arc<Semaphore>,
    streams: Arc<stream::Sinks>,
    artifacts: Option<Arc<dyn Artifacts>>,
}

/// The driver task: the shared [`Driver`]'s turns, waiting in between
/// for a command, an answer or the controller's next timer.
async fn drive(
    mut driver: Driver<Changed, Io>,
    mut cmds: mpsc::UnboundedReceiver<Command>,
    mut answers: mpsc::UnboundedReceiver<Answer>,
) {
    let mut cmds_open = true;
    while let Turn::Wait(left) = driver.turn() {
        let sleep = left.map(|left| tokio::time::Instant::now() + left);
        let input = tokio::select! {
            cmd = cmds.recv(), if cmds_open => cmd.map_or_else(|| {
                // Every handle is gone: finish what is in flight.
                cmds_open = false;
                Input::Close
            }, Input::Command),
            Some(answer) = answers.recv() => Input::Answer(answer),
            () = sleep_until(sleep) => Input::Timeout,
        };
        driver.handle(input);
    }
}

impl Perform for Io {
    fn store(&mut self, id: OpId, op: StoreOp) -> Result<(), Error> {
        let store = Arc::clone(&self.store);
        let pool = Arc::clone(&self.pool);
        let tx = self.res_tx.clone();
        if let Ok(permit) = Arc::clone(&pool).try_acquire_owned() {
            // A free slot of the bounded pool: straight onto the blocking
            // pool, answering the driver from there (no task in between;
            // session 11). A panic inside the store (a bug) still answers.
            tokio::task::spawn_blocking(move || {
                let _permit = permit;
                let r = std::panic::catch_unwind(AssertUnwindSafe(|| {
                    smolbox_store::apply_op(store.as_ref(), &op)
                }))
                .unwrap_or_else(|_| {
                    Err(Error::store(
                        Operation::StoreWrite,
                        Evidence::Unknown,
                        Reason::StoreTaskLost,
                    ))
                });
                let _ = tx.send(Answer::Stored(id, Box::new(r)));
            });
            return Ok(());
        }
        tokio::spawn(async move {
            // The semaphore is never closed; a failed acquire still runs.
            let _permit = pool.acquire_owned().await.ok();
            let r = blocking(Operation::StoreWrite, move || {
                smolbox_store::apply_op(store.as_ref(), &op)
            })
            .await;
            let _ = tx.send(Answer::Stored(id, Box::new(r)));
        });
        Ok(())
    }

    fn worker(&mut self, id: OpId, op: WorkerOp) -> Result<(), Error> {
        let client = self.clients.get(op.worker_id()).cloned();
        let tx = self.res_tx.clone();
        let sink = match &op {
            WorkerOp::ExecStream { key, .. } => self.streams.take(key),
            _ => None,
        };
        let artifacts = self.artifacts.clone();
        tokio::spawn(async move {
            let r = match client {
                Some(c) => call(&c, op, sink, artifacts).await,
                None => Err(Error::validation(Operation::Config, Reason::UnknownWorker)),
            };
            let _ = tx.send(Answer::Worker(id, r));
        });
        Ok(())
    }

    fn terminals_live(&self) -> bool {
        self.terminals.any_running()
    }

    fn terminal_due(&mut self, row: ExecutionRecord) {
        // The core decides: a live run here takes the row; else recover.
        let Some(key) = self.terminals.due(row) else {
            return;
        };
        let terminals = self.terminals.clone();
        tokio::spawn(async move {
            let _ = terminals.recover(&key).await;
        });
    }
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Performs one worker op through the client (a streamed exec's events
/// go to `sink`).
async fn call(
    c: &Client,
    op: WorkerOp,
    sink: Option<stream::Sink>,
    artifacts: Option<Arc<dyn Artifacts>>,
) -> WorkerResult {
    match op {
        WorkerOp::Exec {
            machine, command, ..
        } => c.exec(&machine, &command).await.map(WorkerReply::Exec),
        WorkerOp::Create {
            profile,
            name,
            spec,
            ..
        } => c
            .create(&profile, name, &spec)
            .await
            .map(|o| WorkerReply::Machine(Box::new(o))),
        WorkerOp::Start { profile, name, .. } => c
            .start(&profile, name)
            .await
            .map(|o| WorkerReply::Machine(Box::new(o))),
        WorkerOp::Stop { profile, name, .. } => c
            .stop(&profile, name)
            .await
            .map(|o| WorkerReply::Machine(Box::new(o))),
        WorkerOp::Delete { name, .. } => c.delete(name).await.map(|()| WorkerReply::Deleted),
        WorkerOp::Inspect { profile, name, .. } => c
            .get(&profile, name)
            .await
            .map(|o| WorkerReply::Machine(Box::new(o))),
        WorkerOp::Logs {
            profile,
            name,
            params,
            ..
        } => match smolbox_core::worker::Logs::new(&profile, name, params) {
            Ok(logs) => c.logs(&logs).await.map(WorkerReply::Logs),
            Err(e) => Err(e),
        },
        WorkerOp::ExecStream {
            machine, command, ..
        } => stream::perform(c, &machine, &command, sink).await,
        WorkerOp::Upload { .. } => {
            // The artifact read may touch a disk: off the async workers.
            let budgets = *c.endpoint().budgets();
            let upload = blocking(Operation::Upload, move || {
                files::upload_of(&op, artifacts.as_deref(), &budgets)
            })
            .await?;
            c.upload(&upload)
                .await
                .map(|r| WorkerReply::Uploaded { size: r.size })
        }
        WorkerOp::Download { .. } => {
            let download = files::download_of(&op, c.endpoint().budgets())?;
            let bytes = c.download(&download).await?;
            blocking(Operation::Download, move || {
                files::downloaded(&op, bytes, artifacts.as_deref())
            })
            .await
        }
    }
}
