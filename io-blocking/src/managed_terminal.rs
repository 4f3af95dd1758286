//! Managed terminals (features C7.3, C7.4), blocking: the same API as
//! `smolbox_tokio::managed_terminal` minus `async`. [`ManagedTerminals`]
//! opens a terminal on a retained machine through the core's
//! `TerminalRun` and keeps the live connection in the core's `Registry`;
//! [`ManagedTerminal`] is the one consumer's handle.
//!
//! Every decision is the core's. One thread per terminal performs the
//! run's store ops, opens the low-level [`Terminal`], pulls its output into
//! a bounded buffer (the spec's `buffer_bytes` and 1,024 chunks; overflow
//! ends the session with an uncertain `output_limit`), forwards input and
//! resizes, and renews the claim. The thread pulls in slices of at most
//! [`PULL_SLICE`] so the consumer's commands are served between pulls.
//! Terminal bytes are held in memory only.

use smolbox_core::Reason;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use smolbox_core::managed::controller::terminal::{TermConfig, TermEvent, TermOutput, TerminalRun};
use smolbox_core::managed::spec::{Action, ManagedTerminalSpec};
use smolbox_core::managed::terminal::{ConsumerId, Registry, attach_expired};
use smolbox_core::managed::{ExecutionRecord, FingerprintKey, RecordKey};
use smolbox_core::terminal::{MAX_NEXT_WAIT, MAX_UNREAD_CHUNKS, TerminalExit};
use smolbox_core::{Category, Error, Evidence, Operation};
use smolbox_store::{Store, apply_terminal_op};

use crate::runtime::Clock;
use crate::{Client, Terminal, TerminalEvent};

/// Longest single pull of the low-level terminal between two looks at the
/// consumer's commands and the timers.
pub const PULL_SLICE: Duration = Duration::from_millis(20);

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
    changed: Condvar,
}

struct State {
    registry: Registry<Arc<Live>>,
    /// Keys with a run driven by this runtime.
    runs: BTreeSet<RecordKey>,
}

/// One live connection as the consumer sees it.
struct Live {
    queue: Mutex<Queue>,
    readable: Condvar,
    cmd: Mutex<Sender<Cmd>>,
}

impl Live {
    fn send(&self, cmd: Cmd) -> bool {
        lock(&self.cmd).send(cmd).is_ok()
    }
}

#[derive(Default)]
struct Queue {
    chunks: VecDeque<Bytes>,
    bytes: usize,
    closed: Option<Result<TerminalExit, Error>>,
}

enum Cmd {
    Input(Vec<u8>, Sender<Result<(), Error>>),
    Resize(u16, u16, Sender<Result<(), Error>>),
    Close(Sender<Result<TerminalExit, Error>>),
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
                changed: Condvar::new(),
            }),
        })
    }

    /// Opens terminal `key` on the retained machine `machine` (C7.4):
    /// returns at durable acceptance, not readiness. The same key and spec
    /// again returns the same identity and never opens a second shell; a
    /// changed spec is `identity_conflict`.
    ///
    /// # Errors
    /// As `smolbox_tokio::ManagedTerminals::open`.
    pub fn open(
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
        let (tx, rx) = mpsc::channel();
        self.spawn(run, tx, drive)?;
        rx.recv().map_err(|_| ended(Operation::TerminalOpen))?
    }

    fn spawn(
        &self,
        run: TerminalRun,
        tx: Sender<Result<TerminalOpened, Error>>,
        owns_key: bool,
    ) -> Result<(), Error> {
        let inner = Arc::clone(&self.inner);
        let key = run.key().clone();
        std::thread::Builder::new()
            .name("smolbox-terminal".into())
            .spawn(move || drive_run(&inner, run, Some(tx), owns_key))
            .map(|_| ())
            .map_err(|_| {
                if owns_key {
                    lock(&self.inner.state).runs.remove(&key);
                }
                Error::new(
                    Category::AdmissionExhausted,
                    Operation::TerminalOpen,
                    Evidence::NotDispatched,
                )
                .with_reason(Reason::NoThread)
            })
    }

    /// Binds the caller, as the one consumer, to the live connection of
    /// `key` on this runtime, waiting up to `wait` (0–30,000 ms) for it to
    /// be registered (C7.4).
    ///
    /// # Errors
    /// As `smolbox_tokio::ManagedTerminals::attach`.
    pub fn attach(&self, key: &RecordKey, wait: Duration) -> Result<ManagedTerminal, Error> {
        let deadline = Registry::<()>::attach_deadline(Instant::now(), wait)?;
        let mut st = lock(&self.inner.state);
        loop {
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
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::new(
                    Category::NotFound,
                    Operation::TerminalConsumer,
                    Evidence::NotDispatched,
                )
                .with_reason(Reason::TerminalNotLiveHere));
            }
            st = self
                .inner
                .changed
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// The stored record of terminal `key`.
    ///
    /// # Errors
    /// `not_found` only on positive absence; `store`.
    pub fn fetch(&self, key: &RecordKey) -> Result<ExecutionRecord, Error> {
        self.inner.store.fetch(key)
    }

    /// Persists a cancel request (C16) for `key`; a run of this runtime
    /// then acts on it (before dispatch nothing opens; after it observation
    /// ends and the record stays uncertain unless an exit came first).
    ///
    /// # Errors
    /// The store's.
    pub fn cancel(&self, key: &RecordKey) -> Result<ExecutionRecord, Error> {
        let rec = self.inner.store.cancel(key, self.inner.clock.now_ms())?;
        let live = lock(&self.inner.state)
            .registry
            .owner_get(key)
            .map(|l| Arc::clone(l));
        if let Some(live) = live {
            live.send(Cmd::Cancel);
        }
        Ok(rec)
    }

    /// Recovery (C7.4) of terminal `key` found in the store and not driven
    /// here; see `smolbox_tokio::ManagedTerminals::recover`.
    ///
    /// # Errors
    /// `validation` for a record that is not a managed terminal; `store`.
    pub fn recover(&self, key: &RecordKey) -> Result<ExecutionRecord, Error> {
        if !lock(&self.inner.state).runs.insert(key.clone()) {
            return self.fetch(key);
        }
        let release = |e: Error| {
            lock(&self.inner.state).runs.remove(key);
            Err(e)
        };
        let rec = match self.fetch(key) {
            Ok(r) if matches!(r.spec.action, Action::Terminal(_)) => r,
            Ok(_) => {
                return release(Error::validation(
                    Operation::TerminalOpen,
                    Reason::NotATerminal,
                ));
            }
            Err(e) => return release(e),
        };
        let run = match TerminalRun::resume(
            self.inner.cfg.clone(),
            self.inner.fp_key.clone(),
            rec,
            self.inner.clock.now(),
            self.inner.clock.now_ms(),
        ) {
            Ok(r) => r,
            Err(e) => return release(e),
        };
        let (tx, rx) = mpsc::channel();
        self.spawn(run, tx, true)?;
        match rx.recv() {
            Ok(Ok(_)) | Err(_) => self.fetch(key),
            Ok(Err(e)) => Err(e),
        }
    }

    /// Waits up to `timeout` for this runtime to finish with `key` and
    /// returns the stored record.
    ///
    /// # Errors
    /// `expired` when the run is still going; the store's.
    pub fn wait(&self, key: &RecordKey, timeout: Duration) -> Result<ExecutionRecord, Error> {
        let deadline = Instant::now() + timeout.min(MAX_NEXT_WAIT);
        let mut st = lock(&self.inner.state);
        while st.runs.contains(key) {
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::new(
                    Category::Expired,
                    Operation::TerminalSession,
                    Evidence::Unknown,
                )
                .with_reason(Reason::TerminalWait));
            }
            st = self
                .inner
                .changed
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        drop(st);
        self.fetch(key)
    }
}

impl Inner {
    /// The registry's timers: unattached connections are ended
    /// (`terminal_consumer`), old finished buffers dropped.
    fn expire(&self, st: &mut State, now: Instant) {
        let (expired, _retired) = st.registry.handle_timeout(now);
        for (key, _) in expired {
            if let Some(live) = st.registry.owner_get(&key) {
                live.send(Cmd::End(attach_expired()));
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

    fn call<T>(
        &self,
        op: Operation,
        make: impl FnOnce(Sender<Result<T, Error>>) -> Cmd,
    ) -> Result<T, Error> {
        self.check()?;
        let (tx, rx) = mpsc::channel();
        if !self.live.send(make(tx)) {
            return Err(ended(op));
        }
        rx.recv().map_err(|_| ended(op))?
    }

    /// Sends `bytes` to the PTY (1..=the spec's `input_bytes`). `Ok` means
    /// handed to the socket, not consumed by the guest.
    ///
    /// # Errors
    /// The session's errors; `authentication` / `not_found` when this
    /// handle no longer holds the session.
    pub fn input(&mut self, bytes: &[u8]) -> Result<(), Error> {
        let b = bytes.to_vec();
        self.call(Operation::TerminalInput, |tx| Cmd::Input(b, tx))
    }

    /// Sends a window-size change (1–65,535 each).
    ///
    /// # Errors
    /// As [`ManagedTerminal::input`]; `validation` for 0.
    pub fn resize(&mut self, cols: u16, rows: u16) -> Result<(), Error> {
        self.call(Operation::TerminalResize, |tx| Cmd::Resize(cols, rows, tx))
    }

    /// Waits up to `timeout` (≤ 900 s) for output or the end of the
    /// session. A timeout is `expired` (operation `terminal_output`) and
    /// the session keeps running. The final `Closed` event retires the
    /// buffer.
    ///
    /// # Errors
    /// `expired` on timeout; `validation` over 900 s; `authentication` /
    /// `not_found` when this handle no longer holds the session.
    pub fn next(&mut self, timeout: Duration) -> Result<TerminalEvent, Error> {
        if timeout > MAX_NEXT_WAIT {
            return Err(Error::validation(
                Operation::TerminalOutput,
                Reason::NextTimeout,
            ));
        }
        self.check()?;
        let deadline = Instant::now() + timeout;
        let live = Arc::clone(&self.live);
        let mut q = lock(&live.queue);
        loop {
            if let Some(b) = q.chunks.pop_front() {
                q.bytes -= b.len();
                return Ok(TerminalEvent::Output(b));
            }
            if let Some(outcome) = q.closed {
                drop(q);
                self.done = true;
                let _ = lock(&self.inner.state)
                    .registry
                    .final_read(&self.key, self.who);
                return Ok(TerminalEvent::Closed(outcome));
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::new(
                    Category::Expired,
                    Operation::TerminalOutput,
                    Evidence::Unknown,
                )
                .with_reason(Reason::NextTimeout));
            }
            q = live
                .readable
                .wait_timeout(q, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Closes the session: a close frame, then the close wait for the
    /// worker's. Returns the outcome (uncertain without an exit first).
    ///
    /// # Errors
    /// The uncertain outcome; `authentication` / `not_found` when this
    /// handle no longer holds the session.
    pub fn close(mut self) -> Result<TerminalExit, Error> {
        let outcome = match self.call(Operation::TerminalClose, Cmd::Close) {
            Err(e) if e.reason() == Reason::TerminalTaskEnded => {
                lock(&self.live.queue).closed.unwrap_or(Err(e))
            }
            other => other,
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
        self.live.send(Cmd::End(
            Error::new(
                Category::Unknown,
                Operation::TerminalConsumer,
                Evidence::Unknown,
            )
            .with_reason(Reason::ConsumerLost),
        ));
    }
}

/// The connection half of a run's thread.
struct Conn {
    term: Terminal,
    live: Arc<Live>,
    max_bytes: usize,
}

/// One terminal's thread: performs the run's ops, owns the low-level
/// terminal once opened, pulls its output into the bounded buffer.
fn drive_run(
    inner: &Inner,
    mut run: TerminalRun,
    mut accepted: Option<Sender<Result<TerminalOpened, Error>>>,
    owns_key: bool,
) {
    let key = run.key().clone();
    let (cmd_tx, cmd_rx) = mpsc::channel::<Cmd>();
    let mut conn: Option<Conn> = None;
    loop {
        while let Some(out) = run.poll_output() {
            match out {
                TermOutput::Store(id, op) => {
                    let r = apply_terminal_op(&*inner.store, &op);
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
                        Some(c) => c.terminal(&machine, &spec),
                    };
                    let opened = opened.and_then(|term| {
                        let live = Arc::new(Live {
                            queue: Mutex::new(Queue::default()),
                            readable: Condvar::new(),
                            cmd: Mutex::new(cmd_tx.clone()),
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
                    inner.changed.notify_all();
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
                    let _ = close_conn(inner, &key, &mut run, &mut conn);
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
        let now = Instant::now();
        let slice = wake.map_or(PULL_SLICE, |w| {
            w.saturating_duration_since(now).min(PULL_SLICE)
        });
        match conn.as_mut() {
            Some(c) => match c.term.next(slice) {
                Ok(TerminalEvent::Output(b)) => {
                    let over = {
                        let mut q = lock(&c.live.queue);
                        q.bytes += b.len();
                        q.chunks.push_back(b);
                        q.bytes > c.max_bytes || q.chunks.len() > MAX_UNREAD_CHUNKS
                    };
                    c.live.readable.notify_all();
                    if over {
                        // AC-7.3.1: never a fabricated exit.
                        let e = Error::new(
                            Category::OutputLimit,
                            Operation::TerminalOutput,
                            Evidence::Unknown,
                        )
                        .with_reason(Reason::UnreadOutput);
                        finish_conn(inner, &key, &mut run, &mut conn, Err(e));
                    }
                }
                Ok(TerminalEvent::Closed(outcome)) => {
                    if let Some(c) = conn.take() {
                        end_live(inner, &key, &c.live, outcome);
                    }
                    run.handle_closed(inner.clock.now(), inner.clock.now_ms(), &outcome);
                }
                // The slice's own timeout: the session keeps running.
                Err(_) => {}
            },
            None => match cmd_rx.recv_timeout(slice) {
                Ok(cmd) => serve(inner, &key, &mut run, &mut conn, cmd),
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => {}
            },
        }
        while let Ok(cmd) = cmd_rx.try_recv() {
            serve(inner, &key, &mut run, &mut conn, cmd);
        }
        if wake.is_some_and(|w| Instant::now() >= w) {
            let mut st = lock(&inner.state);
            inner.expire(&mut st, inner.clock.now());
            drop(st);
            run.handle_timeout(inner.clock.now(), inner.clock.now_ms());
        }
    }
    drain_commands(&cmd_rx);
    if owns_key {
        lock(&inner.state).runs.remove(&key);
    }
    inner.changed.notify_all();
}

/// Answers what is left in the channel once the thread ends.
fn drain_commands(rx: &Receiver<Cmd>) {
    while let Ok(cmd) = rx.try_recv() {
        match cmd {
            Cmd::Input(_, reply) | Cmd::Resize(_, _, reply) => {
                let _ = reply.send(Err(ended(Operation::TerminalInput)));
            }
            Cmd::Close(reply) => {
                let _ = reply.send(Err(ended(Operation::TerminalClose)));
            }
            Cmd::End(_) | Cmd::Cancel => {}
        }
    }
}

fn serve(inner: &Inner, key: &RecordKey, run: &mut TerminalRun, conn: &mut Option<Conn>, cmd: Cmd) {
    match (cmd, conn.as_mut()) {
        (Cmd::Input(b, reply), Some(c)) => {
            let _ = reply.send(c.term.input(&b));
        }
        (Cmd::Resize(cols, rows, reply), Some(c)) => {
            let _ = reply.send(c.term.resize(cols, rows));
        }
        (Cmd::Close(reply), Some(_)) => {
            let _ = reply.send(close_conn(inner, key, run, conn));
        }
        (Cmd::End(e), Some(_)) => finish_conn(inner, key, run, conn, Err(e)),
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

/// Ends the connection with `outcome` decided here (given to the run
/// first: it wins over whatever the close reports).
fn finish_conn(
    inner: &Inner,
    key: &RecordKey,
    run: &mut TerminalRun,
    conn: &mut Option<Conn>,
    outcome: Result<TerminalExit, Error>,
) {
    run.handle_closed(inner.clock.now(), inner.clock.now_ms(), &outcome);
    if let Some(c) = conn.take() {
        let _ = c.term.close();
        end_live(inner, key, &c.live, outcome);
    }
}

/// Closes the connection; the session's outcome decides.
fn close_conn(
    inner: &Inner,
    key: &RecordKey,
    run: &mut TerminalRun,
    conn: &mut Option<Conn>,
) -> Result<TerminalExit, Error> {
    let Some(c) = conn.take() else {
        return Err(ended(Operation::TerminalClose));
    };
    let outcome = c.term.close();
    end_live(inner, key, &c.live, outcome);
    run.handle_closed(inner.clock.now(), inner.clock.now_ms(), &outcome);
    outcome
}

/// Records the final event for the consumer and marks the buffer finished.
fn end_live(inner: &Inner, key: &RecordKey, live: &Live, outcome: Result<TerminalExit, Error>) {
    lock(&live.queue).closed.get_or_insert(outcome);
    live.readable.notify_all();
    lock(&inner.state).registry.finished(inner.clock.now(), key);
}
