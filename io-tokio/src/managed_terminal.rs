//! Managed terminals (features C7.3, C7.4): [`ManagedTerminals`] opens a
//! terminal on a retained machine through the core's `TerminalRun` and
//! keeps the live connection in the core's `Registry`; [`ManagedTerminal`]
//! is the one consumer's handle (`input`, `next`, `resize`, `close`).
//!
//! Every decision is the core's: the run decides the store writes and when
//! to open or close; the registry decides who may attach and when buffers
//! retire. This module performs store ops on tokio's blocking pool, opens
//! the low-level [`Terminal`] through the worker's [`Client`], and runs one
//! task per terminal that pulls the session's output into a bounded buffer
//! (the spec's `buffer_bytes` and 1,024 chunks; overflow ends the session
//! with an uncertain `output_limit`), forwards the consumer's input and
//! resizes, and renews the claim. Terminal bytes are held in memory only.

use smolbox_core::Reason;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use smolbox_core::managed::controller::terminal::{TermConfig, TermEvent, TermOutput, TerminalRun};
use smolbox_core::managed::spec::{Action, ManagedTerminalSpec};
use smolbox_core::managed::terminal::{ConsumerId, Registry, attach_expired};
use smolbox_core::managed::{ExecutionRecord, FingerprintKey, RecordKey};
use smolbox_core::terminal::{MAX_NEXT_WAIT, MAX_UNREAD_CHUNKS, TerminalExit};
use smolbox_core::{Category, Error, Evidence, Operation};
use smolbox_store::{Store, apply_terminal_op};
use tokio::sync::{Notify, mpsc, oneshot};

use crate::runtime::Clock;
use crate::{Client, Terminal, TerminalEvent};

/// What `open` returns at durable acceptance (not readiness).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TerminalOpened {
    /// The terminal's record as stored.
    pub record: ExecutionRecord,
    /// True when the record already existed with the same identity.
    pub existing: bool,
}

/// The runtime's managed terminals (see the module docs). Cheap to clone.
#[derive(Clone)]
pub struct ManagedTerminals {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for ManagedTerminals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManagedTerminals").finish_non_exhaustive()
    }
}

struct Inner {
    store: Arc<dyn Store>,
    fp_key: FingerprintKey,
    cfg: TermConfig,
    clients: BTreeMap<String, Client>,
    clock: Arc<dyn Clock>,
    state: Mutex<State>,
    /// Registrations, ends of runs.
    changed: Notify,
}

struct State {
    registry: Registry<Arc<Live>>,
    /// Keys with a run driven by this runtime.
    runs: BTreeSet<RecordKey>,
}

/// One live connection as the consumer sees it.
struct Live {
    queue: Mutex<Queue>,
    readable: Notify,
    cmd: mpsc::UnboundedSender<Cmd>,
}

#[derive(Default)]
struct Queue {
    chunks: VecDeque<Bytes>,
    bytes: usize,
    closed: Option<Result<TerminalExit, Error>>,
}

enum Cmd {
    Input(Vec<u8>, oneshot::Sender<Result<(), Error>>),
    Resize(u16, u16, oneshot::Sender<Result<(), Error>>),
    Close(oneshot::Sender<Result<TerminalExit, Error>>),
    /// Close with this outcome (expiry, lost consumer).
    End(Error),
    /// A cancel request was persisted: the run decides.
    Cancel,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn ended(op: Operation) -> Error {
    Error::new(Category::Unknown, op, Evidence::Unknown).with_reason(Reason::TerminalTaskEnded)
}

impl ManagedTerminals {
    /// Terminals over `store` for the workers in `clients`, with the
    /// controller options `cfg`, registering at most `limit` sessions (the
    /// runtime's active-task limit, 1–64).
    ///
    /// # Errors
    /// `validation` (operation `config`) for a bad limit.
    pub fn new(
        store: Arc<dyn Store>,
        fp_key: FingerprintKey,
        cfg: TermConfig,
        clients: BTreeMap<String, Client>,
        clock: Arc<dyn Clock>,
        limit: usize,
    ) -> Result<Self, Error> {
        Ok(Self {
            inner: Arc::new(Inner {
                store,
                fp_key,
                cfg,
                clients,
                clock,
                state: Mutex::new(State {
                    registry: Registry::new(limit)?,
                    runs: BTreeSet::new(),
                }),
                changed: Notify::new(),
            }),
        })
    }

    /// Opens terminal `key` on the retained machine `machine` (C7.4):
    /// returns at durable acceptance (the record holds the machine's slot),
    /// not readiness; the upgrade follows in the background. The same key
    /// and spec again returns the same identity and never opens a second
    /// shell; a changed spec is `identity_conflict`.
    ///
    /// # Errors
    /// `validation` for a bad spec (nothing stored); `identity_conflict`;
    /// `admission_exhausted` when the slot is held or the machine is not
    /// idle and running; `not_found` for an absent machine; `store`.
    pub async fn open(
        &self,
        key: RecordKey,
        machine: RecordKey,
        spec: ManagedTerminalSpec,
    ) -> Result<TerminalOpened, Error> {
        let drive = lock(&self.inner.state).runs.insert(key.clone());
        let run = TerminalRun::open(
            self.inner.cfg.clone(),
            self.inner.fp_key.clone(),
            key.clone(),
            machine,
            spec,
            drive,
        );
        let run = match run {
            Ok(r) => r,
            Err(e) => {
                if drive {
                    lock(&self.inner.state).runs.remove(&key);
                }
                return Err(e);
            }
        };
        let (tx, rx) = oneshot::channel();
        tokio::spawn(drive_run(Arc::clone(&self.inner), run, Some(tx), drive));
        rx.await.map_err(|_| ended(Operation::TerminalOpen))?
    }

    /// Binds the caller, as the one consumer, to the live connection of
    /// `key` on this runtime, waiting up to `wait` (0–30,000 ms) for it to
    /// be registered (C7.4).
    ///
    /// # Errors
    /// `authentication` when another consumer is bound (no take-over);
    /// `expired` (`terminal_consumer`) when nobody attached within the
    /// spec's attach wait; `not_found` when no live connection of `key`
    /// appeared here within `wait` (its record says where it stands);
    /// `validation` for a wait over 30 s.
    pub async fn attach(&self, key: &RecordKey, wait: Duration) -> Result<ManagedTerminal, Error> {
        let deadline = Registry::<()>::attach_deadline(Instant::now(), wait)?;
        loop {
            let notified = self.inner.changed.notified();
            {
                let mut st = lock(&self.inner.state);
                self.inner.expire(&mut st, self.inner.clock.now());
                if let Some(who) = st.registry.attach(self.inner.clock.now(), key)? {
                    let live = Arc::clone(st.registry.get(key, who)?);
                    return Ok(ManagedTerminal {
                        inner: Arc::clone(&self.inner),
                        key: key.clone(),
                        who,
                        live,
                        done: false,
                    });
                }
            }
            tokio::select! {
                () = notified => {}
                () = tokio::time::sleep_until(deadline.into()) => {
                    return Err(Error::new(
                        Category::NotFound,
                        Operation::TerminalConsumer,
                        Evidence::NotDispatched,
                    )
                    .with_reason(Reason::TerminalNotLiveHere));
                }
            }
        }
    }

    /// The stored record of terminal `key`.
    ///
    /// # Errors
    /// `not_found` only on positive absence; `store`.
    pub async fn fetch(&self, key: &RecordKey) -> Result<ExecutionRecord, Error> {
        let store = Arc::clone(&self.inner.store);
        let key = key.clone();
        blocking(Operation::StoreFetch, move || store.fetch(&key)).await
    }

    /// Persists a cancel request (C16) for `key`: before dispatch nothing
    /// is opened; after it, a run of this runtime closes observation and
    /// the record stays uncertain unless an exit was confirmed first.
    /// Another controller may cancel a terminal it does not own.
    ///
    /// # Errors
    /// The store's.
    pub async fn cancel(&self, key: &RecordKey) -> Result<ExecutionRecord, Error> {
        let store = Arc::clone(&self.inner.store);
        let now_ms = self.inner.clock.now_ms();
        let k = key.clone();
        let rec = blocking(Operation::StoreCancel, move || store.cancel(&k, now_ms)).await?;
        let live = lock(&self.inner.state)
            .registry
            .owner_get(key)
            .map(|l| Arc::clone(l));
        if let Some(live) = live {
            // The run acts on it: `cancelling`, then it closes observation.
            let _ = live.cmd.send(Cmd::Cancel);
        }
        Ok(rec)
    }

    /// Recovery (C7.4) of terminal `key` found in the store and not driven
    /// here: possibly dispatched without a recorded exit → `unknown`, the
    /// slot kept; a recorded exit stays known and the slot is finished;
    /// provably undispatched intent may still dispatch, once. Returns the
    /// stored record once the run is done, or once its one dispatch was
    /// made (the session then runs in the background, attachable here).
    ///
    /// # Errors
    /// `validation` for a record that is not a managed terminal; `store`.
    pub async fn recover(&self, key: &RecordKey) -> Result<ExecutionRecord, Error> {
        if !lock(&self.inner.state).runs.insert(key.clone()) {
            return self.fetch(key).await;
        }
        let rec = match self.fetch(key).await {
            Ok(r) if matches!(r.spec.action, Action::Terminal(_)) => r,
            Ok(_) => {
                lock(&self.inner.state).runs.remove(key);
                return Err(Error::validation(
                    Operation::TerminalOpen,
                    Reason::NotATerminal,
                ));
            }
            Err(e) => {
                lock(&self.inner.state).runs.remove(key);
                return Err(e);
            }
        };
        let run = TerminalRun::resume(
            self.inner.cfg.clone(),
            self.inner.fp_key.clone(),
            rec,
            self.inner.clock.now(),
            self.inner.clock.now_ms(),
        );
        let run = match run {
            Ok(r) => r,
            Err(e) => {
                lock(&self.inner.state).runs.remove(key);
                return Err(e);
            }
        };
        let (tx, rx) = oneshot::channel();
        tokio::spawn(drive_run(Arc::clone(&self.inner), run, Some(tx), true));
        match rx.await {
            Ok(Ok(_)) | Err(_) => self.fetch(key).await,
            Ok(Err(e)) => Err(e),
        }
    }

    /// Waits up to `timeout` for this runtime to finish with `key` (its
    /// record settled and its slot finished, or the run given up) and
    /// returns the stored record.
    ///
    /// # Errors
    /// `expired` when the run is still going; the store's.
    pub async fn wait(&self, key: &RecordKey, timeout: Duration) -> Result<ExecutionRecord, Error> {
        let deadline = tokio::time::Instant::now() + timeout.min(MAX_NEXT_WAIT);
        loop {
            let notified = self.inner.changed.notified();
            if !lock(&self.inner.state).runs.contains(key) {
                return self.fetch(key).await;
            }
            tokio::select! {
                () = notified => {}
                () = tokio::time::sleep_until(deadline) => {
                    return Err(Error::new(
                        Category::Expired,
                        Operation::TerminalSession,
                        Evidence::Unknown,
                    )
                    .with_reason(Reason::TerminalWait));
                }
            }
        }
    }
}

impl Inner {
    /// The registry's timers: unattached connections are ended
    /// (`terminal_consumer`), old finished buffers dropped.
    fn expire(&self, st: &mut State, now: Instant) {
        let (expired, _retired) = st.registry.handle_timeout(now);
        for (key, _) in expired {
            if let Some(live) = st.registry.owner_get(&key) {
                let _ = live.cmd.send(Cmd::End(attach_expired()));
            }
        }
    }
}

/// The one consumer's handle on a managed terminal (C7.3). Not `Clone`;
/// never persisted; dropping it ends the session (`terminal_consumer`)
/// unless it already ended.
pub struct ManagedTerminal {
    inner: Arc<Inner>,
    key: RecordKey,
    who: ConsumerId,
    live: Arc<Live>,
    done: bool,
}

impl std::fmt::Debug for ManagedTerminal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManagedTerminal")
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl ManagedTerminal {
    /// The terminal's record key.
    pub fn key(&self) -> &RecordKey {
        &self.key
    }

    fn check(&self) -> Result<(), Error> {
        lock(&self.inner.state)
            .registry
            .get(&self.key, self.who)
            .map(|_| ())
    }

    /// Sends `bytes` to the PTY (1..=the spec's `input_bytes`). `Ok` means
    /// handed to the socket, not consumed by the guest.
    ///
    /// # Errors
    /// The session's errors; `authentication` / `not_found` when this
    /// handle no longer holds the session.
    pub async fn input(&mut self, bytes: &[u8]) -> Result<(), Error> {
        self.check()?;
        let (tx, rx) = oneshot::channel();
        self.live
            .cmd
            .send(Cmd::Input(bytes.to_vec(), tx))
            .map_err(|_| ended(Operation::TerminalInput))?;
        rx.await.map_err(|_| ended(Operation::TerminalInput))?
    }

    /// Sends a window-size change (1–65,535 each).
    ///
    /// # Errors
    /// As [`ManagedTerminal::input`]; `validation` for 0.
    pub async fn resize(&mut self, cols: u16, rows: u16) -> Result<(), Error> {
        self.check()?;
        let (tx, rx) = oneshot::channel();
        self.live
            .cmd
            .send(Cmd::Resize(cols, rows, tx))
            .map_err(|_| ended(Operation::TerminalResize))?;
        rx.await.map_err(|_| ended(Operation::TerminalResize))?
    }

    /// Waits up to `timeout` (≤ 900 s) for output or the end of the
    /// session. A timeout is `expired` (operation `terminal_output`) and
    /// the session keeps running. The final `Closed` event retires the
    /// buffer.
    ///
    /// # Errors
    /// `expired` on timeout; `validation` over 900 s; `authentication` /
    /// `not_found` when this handle no longer holds the session.
    pub async fn next(&mut self, timeout: Duration) -> Result<TerminalEvent, Error> {
        if timeout > MAX_NEXT_WAIT {
            return Err(Error::validation(
                Operation::TerminalOutput,
                Reason::NextTimeout,
            ));
        }
        self.check()?;
        let deadline = tokio::time::Instant::now() + timeout;
        let live = Arc::clone(&self.live);
        loop {
            let notified = live.readable.notified();
            if let Some(ev) = self.pop() {
                return Ok(ev);
            }
            tokio::select! {
                () = notified => {}
                () = tokio::time::sleep_until(deadline) => {
                    if let Some(ev) = self.pop() {
                        return Ok(ev);
                    }
                    return Err(Error::new(
                        Category::Expired,
                        Operation::TerminalOutput,
                        Evidence::Unknown,
                    )
                    .with_reason(Reason::NextTimeout));
                }
            }
        }
    }

    fn pop(&mut self) -> Option<TerminalEvent> {
        let mut q = lock(&self.live.queue);
        if let Some(b) = q.chunks.pop_front() {
            q.bytes -= b.len();
            return Some(TerminalEvent::Output(b));
        }
        let outcome = q.closed?;
        drop(q);
        self.done = true;
        let _ = lock(&self.inner.state)
            .registry
            .final_read(&self.key, self.who);
        Some(TerminalEvent::Closed(outcome))
    }

    /// Closes the session: a close frame, then the close wait for the
    /// worker's. Returns the outcome (uncertain without an exit first).
    ///
    /// # Errors
    /// The uncertain outcome; `authentication` / `not_found` when this
    /// handle no longer holds the session.
    pub async fn close(mut self) -> Result<TerminalExit, Error> {
        self.check()?;
        let (tx, rx) = oneshot::channel();
        let sent = self.live.cmd.send(Cmd::Close(tx));
        let outcome = match sent {
            Ok(()) => rx.await.map_err(|_| ended(Operation::TerminalClose))?,
            Err(_) => lock(&self.live.queue)
                .closed
                .unwrap_or_else(|| Err(ended(Operation::TerminalClose))),
        };
        self.done = true;
        let _ = lock(&self.inner.state)
            .registry
            .final_read(&self.key, self.who);
        outcome
    }
}

impl Drop for ManagedTerminal {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let _ = lock(&self.inner.state).registry.detach(&self.key, self.who);
        let _ = self.live.cmd.send(Cmd::End(
            Error::new(
                Category::Unknown,
                Operation::TerminalConsumer,
                Evidence::Unknown,
            )
            .with_reason(Reason::ConsumerLost),
        ));
    }
}

/// Runs a store call on tokio's blocking pool; a lost task is `store`.
async fn blocking<T, F>(op: Operation, f: F) -> Result<T, Error>
where
    F: FnOnce() -> Result<T, Error> + Send + 'static,
    T: Send + 'static,
{
    tokio::task::spawn_blocking(f).await.unwrap_or_else(|_| {
        Err(Error::new(Category::Store, op, Evidence::Unknown).with_reason(Reason::StoreTaskLost))
    })
}

/// The connection half of a run's task.
struct Conn {
    term: Terminal,
    live: Arc<Live>,
    max_bytes: usize,
}

/// One terminal's task: performs the run's ops, owns the low-level
/// terminal once opened, pulls its output into the bounded buffer.
async fn drive_run(
    inner: Arc<Inner>,
    mut run: TerminalRun,
    mut accepted: Option<oneshot::Sender<Result<TerminalOpened, Error>>>,
    owns_key: bool,
) {
    let key = run.key().clone();
    let (cmd_tx, mut cmd_rx) = mpsc::unbounded_channel::<Cmd>();
    let mut conn: Option<Conn> = None;
    loop {
        while let Some(out) = run.poll_output() {
            match out {
                TermOutput::Store(id, op) => {
                    let store = Arc::clone(&inner.store);
                    let name = op.name();
                    tracing::debug!(op = name, "terminal store op");
                    let r = blocking(Operation::StoreWrite, move || {
                        apply_terminal_op(&*store, &op)
                    })
                    .await;
                    run.handle_stored(inner.clock.now(), inner.clock.now_ms(), id, r);
                }
                TermOutput::Open {
                    worker_id,
                    machine,
                    spec,
                } => {
                    let opened = match inner.clients.get(&worker_id) {
                        None => Err(Error::new(
                            Category::UnsupportedCapability,
                            Operation::TerminalOpen,
                            Evidence::NotDispatched,
                        )
                        .with_reason(Reason::UnknownWorker)),
                        Some(c) => c.terminal(&machine, &spec).await,
                    };
                    let opened = opened.and_then(|term| {
                        let live = Arc::new(Live {
                            queue: Mutex::new(Queue::default()),
                            readable: Notify::new(),
                            cmd: cmd_tx.clone(),
                        });
                        let mut st = lock(&inner.state);
                        st.registry
                            .insert(
                                inner.clock.now(),
                                key.clone(),
                                Arc::clone(&live),
                                spec.attach_wait,
                            )
                            .map_err(|e| e.with_evidence(Evidence::DispatchUncertain))?;
                        conn = Some(Conn {
                            term,
                            live,
                            max_bytes: spec.max_buffer_bytes,
                        });
                        Ok(())
                    });
                    inner.changed.notify_waiters();
                    run.handle_opened(inner.clock.now(), inner.clock.now_ms(), opened);
                    if let (Some(tx), Some(rec)) = (accepted.take(), run.record()) {
                        // A resumed run: its one dispatch happened.
                        let _ = tx.send(Ok(TerminalOpened {
                            record: rec.clone(),
                            existing: true,
                        }));
                    }
                }
                TermOutput::Close => {
                    if let Some(c) = conn.take() {
                        let outcome = c.term.close().await;
                        end_live(&inner, &key, &c.live, outcome);
                        run.handle_closed(inner.clock.now(), inner.clock.now_ms(), &outcome);
                    }
                }
                TermOutput::Event(TermEvent::Accepted { record, existing }) => {
                    if let Some(tx) = accepted.take() {
                        let _ = tx.send(Ok(TerminalOpened {
                            record: *record,
                            existing,
                        }));
                    }
                }
                TermOutput::Event(TermEvent::Refused(e)) => {
                    if let Some(tx) = accepted.take() {
                        let _ = tx.send(Err(e));
                    }
                }
                TermOutput::Event(TermEvent::Done { error, .. }) => {
                    if let (Some(e), Some(tx)) = (error, accepted.take()) {
                        let _ = tx.send(Err(e));
                    }
                }
            }
        }
        if run.is_done() && conn.is_none() {
            break;
        }
        let wake = {
            let st = lock(&inner.state);
            [run.poll_timeout(), st.registry.poll_timeout()]
                .into_iter()
                .flatten()
                .min()
        };
        let sleep = async {
            match wake {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            ev = next_of(conn.as_mut()) => {
                match ev {
                    Some(Ok(TerminalEvent::Output(b))) => {
                        let Some(c) = conn.as_ref() else { continue };
                        let over = {
                            let mut q = lock(&c.live.queue);
                            q.bytes += b.len();
                            q.chunks.push_back(b);
                            q.bytes > c.max_bytes || q.chunks.len() > MAX_UNREAD_CHUNKS
                        };
                        c.live.readable.notify_one();
                        if over {
                            // AC-7.3.1: never a fabricated exit.
                            let e = Error::new(
                                Category::OutputLimit,
                                Operation::TerminalOutput,
                                Evidence::Unknown,
                            )
                            .with_reason(Reason::UnreadOutput);
                            finish_conn(&inner, &key, &mut run, &mut conn, Err(e)).await;
                        }
                    }
                    Some(Ok(TerminalEvent::Closed(outcome))) => {
                        if let Some(c) = conn.take() {
                            end_live(&inner, &key, &c.live, outcome);
                        }
                        run.handle_closed(inner.clock.now(), inner.clock.now_ms(), &outcome);
                    }
                    // The pull's own timeout: the session keeps running.
                    Some(Err(_)) | None => {}
                }
            }
            cmd = cmd_rx.recv() => {
                let Some(cmd) = cmd else { continue };
                match (cmd, conn.as_mut()) {
                    (Cmd::Input(b, reply), Some(c)) => {
                        let _ = reply.send(c.term.input(&b).await);
                    }
                    (Cmd::Resize(cols, rows, reply), Some(c)) => {
                        let _ = reply.send(c.term.resize(cols, rows).await);
                    }
                    (Cmd::Close(reply), Some(_)) => {
                        let outcome = close_conn(&inner, &key, &mut run, &mut conn).await;
                        let _ = reply.send(outcome);
                    }
                    (Cmd::End(e), Some(_)) => {
                        finish_conn(&inner, &key, &mut run, &mut conn, Err(e)).await;
                    }
                    (Cmd::Input(_, reply) | Cmd::Resize(_, _, reply), None) => {
                        let _ = reply.send(Err(ended(Operation::TerminalInput)));
                    }
                    (Cmd::Close(reply), None) => {
                        let _ = reply.send(Err(ended(Operation::TerminalClose)));
                    }
                    (Cmd::End(_), None) => {}
                    (Cmd::Cancel, _) => run.cancel(inner.clock.now(), inner.clock.now_ms()),
                }
            }
            () = sleep => {
                let mut st = lock(&inner.state);
                inner.expire(&mut st, inner.clock.now());
                drop(st);
                run.handle_timeout(inner.clock.now(), inner.clock.now_ms());
            }
        }
    }
    if owns_key {
        lock(&inner.state).runs.remove(&key);
    }
    inner.changed.notify_waiters();
}

/// The next event of the connection, or never without one.
async fn next_of(conn: Option<&mut Conn>) -> Option<Result<TerminalEvent, Error>> {
    match conn {
        Some(c) => Some(c.term.next(MAX_NEXT_WAIT).await),
        None => std::future::pending().await,
    }
}

/// Ends the connection with `outcome` decided here (the verdict is given
/// to the run first: it wins over whatever the close reports).
async fn finish_conn(
    inner: &Inner,
    key: &RecordKey,
    run: &mut TerminalRun,
    conn: &mut Option<Conn>,
    outcome: Result<TerminalExit, Error>,
) {
    run.handle_closed(inner.clock.now(), inner.clock.now_ms(), &outcome);
    if let Some(c) = conn.take() {
        let _ = c.term.close().await;
        end_live(inner, key, &c.live, outcome);
    }
}

/// Closes the connection on the consumer's request; the session's outcome
/// decides.
async fn close_conn(
    inner: &Inner,
    key: &RecordKey,
    run: &mut TerminalRun,
    conn: &mut Option<Conn>,
) -> Result<TerminalExit, Error> {
    let Some(c) = conn.take() else {
        return Err(ended(Operation::TerminalClose));
    };
    let outcome = c.term.close().await;
    end_live(inner, key, &c.live, outcome);
    run.handle_closed(inner.clock.now(), inner.clock.now_ms(), &outcome);
    outcome
}

/// Records the final event for the consumer and marks the buffer finished.
fn end_live(inner: &Inner, key: &RecordKey, live: &Live, outcome: Result<TerminalExit, Error>) {
    lock(&live.queue).closed.get_or_insert(outcome);
    live.readable.notify_one();
    lock(&inner.state).registry.finished(inner.clock.now(), key);
}
