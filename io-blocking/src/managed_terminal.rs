//! Managed terminals (features C7.3, C7.4), blocking: the same API as
//! `smolbox_tokio::managed_terminal` minus `async`. [`ManagedTerminals`]
//! opens a terminal on a retained machine through the core's
//! `TerminalRun` and keeps the live connection in the core's `Registry`;
//! [`ManagedTerminal`] is the one consumer's handle.
//!
//! Every decision is the core's. One thread per terminal performs the
//! run's store ops, opens the low-level [`Terminal`], pulls its output into
//! a bounded buffer (the spec's `buffer_bytes` and 1,024 chunks), forwards
//! input and resizes, and renews the claim. The thread pulls in slices of
//! at most [`PULL_SLICE`] so the consumer's commands are served between
//! pulls. The buffer paces the thread as in the tokio shell (the core's
//! `Pace`): while the consumer is live and the buffer full, the thread
//! pulls nothing (the low-level terminal, kept live, reads nothing) and
//! waits for the consumer's read, at most a slice at a time; a consumer
//! that has not read for the grace is stalled and the session ends with an
//! uncertain `output_limit`. Terminal bytes are held in memory only.

use smolbox_core::Reason;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use smolbox_core::managed::controller::terminal::{TermOutput, TerminalRun};
pub use smolbox_core::managed::live::TerminalOpened;
use smolbox_core::managed::live::{
    OpenReply, OutputBuffer, Pace, Reply, TermCommand as Cmd, check_next_wait, next_expired,
    not_live_here, reply, run_wait_expired, task_ended as ended,
};
use smolbox_core::managed::spec::ManagedTerminalSpec;
use smolbox_core::managed::terminal::Registry;
use smolbox_core::managed::{ExecutionRecord, RecordKey};
use smolbox_core::terminal::{MAX_NEXT_WAIT, TerminalExit};
use smolbox_core::{Error, Operation};
use smolbox_store::apply_terminal_op;
use smolbox_store::runtime::Parts;
use smolbox_store::terminals::{self, Consumer, LiveConn, Terminals, lock};

use crate::{Client, Terminal, TerminalEvent};

/// Longest single pull of the low-level terminal between two looks at the
/// consumer's commands and the timers.
pub const PULL_SLICE: Duration = Duration::from_millis(20);

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
    t: Arc<Terminals<Arc<Live>, Client>>,
    /// Registrations, ends of runs.
    changed: Condvar,
}

/// One live connection as the consumer sees it.
struct Live {
    queue: Mutex<OutputBuffer>,
    readable: Condvar,
    /// The consumer read output: a run holding for room looks again.
    room: Condvar,
    cmd: Mutex<Sender<Cmd>>,
}

impl LiveConn for Live {
    fn send(&self, cmd: Cmd) -> bool {
        lock(&self.cmd).send(cmd).is_ok()
    }
    fn buffer(&self) -> &Mutex<OutputBuffer> {
        &self.queue
    }
    fn wake_reader(&self) {
        self.readable.notify_all();
    }
}

impl ManagedTerminals {
    /// A due-scan row of a managed terminal: `Some(key)` when the key is
    /// to be recovered here (the core's `LiveSet::due_row` decides; a live
    /// run of the key takes the row instead).
    pub(crate) fn due(&self, row: ExecutionRecord) -> Option<RecordKey> {
        self.inner.t.due(row)
    }

    /// True while this runtime drives any terminal run.
    pub(crate) fn any_running(&self) -> bool {
        self.inner.t.any_running()
    }

    /// The runtime's terminals, from its checked options (at most
    /// `max_active` sessions registered).
    ///
    /// # Errors
    /// `validation` (operation `config`) for a bad limit.
    pub(crate) fn new(parts: &Parts<Client>) -> Result<Self, Error> {
        Ok(Self {
            inner: Arc::new(Inner {
                t: Arc::new(parts.terminals()?),
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
        let (run, drive) = self.inner.t.open_run(key, machine, spec)?;
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
        let accepted = OpenReply::new(reply(move |v| tx.send(v).is_ok()));
        std::thread::Builder::new()
            .name("smolbox-terminal".into())
            .spawn(move || drive_run(&inner, run, accepted, owns_key))
            .map(|_| ())
            .map_err(|_| {
                if owns_key {
                    self.inner.t.end_run(&key);
                }
                Error::admission_exhausted(Operation::TerminalOpen, Reason::NoThread)
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
        let mut st = self.inner.t.lock();
        loop {
            if let Some(bound) = self.inner.t.attach(&mut st, key)? {
                let t = Arc::clone(&self.inner.t);
                return Ok(ManagedTerminal {
                    c: Consumer::new(t, key.clone(), bound),
                });
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(not_live_here());
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
        self.inner.t.store().fetch(key)
    }

    /// Persists a cancel request (C16) for `key`; a run of this runtime
    /// then acts on it (before dispatch nothing opens; after it observation
    /// ends and the record stays uncertain unless an exit came first).
    ///
    /// # Errors
    /// The store's.
    pub fn cancel(&self, key: &RecordKey) -> Result<ExecutionRecord, Error> {
        let rec = self.inner.t.store().cancel(key, self.inner.t.now_ms())?;
        self.inner.t.cancelled(key);
        Ok(rec)
    }

    /// Recovery (C7.4) of terminal `key` found in the store and not driven
    /// here; see `smolbox_tokio::ManagedTerminals::recover`.
    ///
    /// # Errors
    /// `validation` for a record that is not a managed terminal; `store`.
    pub fn recover(&self, key: &RecordKey) -> Result<ExecutionRecord, Error> {
        if !self.inner.t.lock().begin_run(key) {
            return self.fetch(key);
        }
        let fetched = self.fetch(key);
        let run = self.inner.t.resume_run(key, fetched)?;
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
        let mut st = self.inner.t.lock();
        while st.is_running(key) {
            let now = Instant::now();
            if now >= deadline {
                return Err(run_wait_expired());
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

/// The one consumer's handle on a managed terminal (C7.3). Not `Clone`;
/// never persisted; dropping it ends the session (`terminal_consumer`)
/// unless it already ended.
#[derive(Debug)]
pub struct ManagedTerminal {
    c: Consumer<Arc<Live>, Client>,
}

impl ManagedTerminal {
    /// The terminal's record key.
    pub fn key(&self) -> &RecordKey {
        self.c.key()
    }

    /// Sends one command to the run's thread and waits for its answer.
    fn call<T: Send + 'static>(
        &self,
        op: Operation,
        make: impl FnOnce(Reply<Result<T, Error>>) -> Cmd,
    ) -> Result<T, Error> {
        self.c.check()?;
        let (tx, rx) = mpsc::channel();
        if !self.c.live().send(make(reply(move |v| tx.send(v).is_ok()))) {
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
        self.call(Operation::TerminalInput, |r| Cmd::Input(b, r))
    }

    /// Sends a window-size change (1–65,535 each).
    ///
    /// # Errors
    /// As [`ManagedTerminal::input`]; `validation` for 0.
    pub fn resize(&mut self, cols: u16, rows: u16) -> Result<(), Error> {
        self.call(Operation::TerminalResize, |r| Cmd::Resize(cols, rows, r))
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
        check_next_wait(timeout)?;
        self.c.check()?;
        let deadline = Instant::now() + timeout;
        let live = Arc::clone(self.c.live());
        let mut q = lock(&live.queue);
        let now = self.c.now();
        q.begin_wait(now, now + timeout);
        loop {
            if let Some(ev) = q.pop(self.c.now()) {
                drop(q);
                if matches!(ev, TerminalEvent::Closed(_)) {
                    self.c.final_read();
                } else {
                    live.room.notify_all();
                }
                return Ok(ev);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(next_expired());
            }
            q = live
                .readable
                .wait_timeout(q, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Unread output bytes waiting for this consumer (at most the spec's
    /// `buffer_bytes` while it reads; one more chunk may be held back).
    pub fn unread_bytes(&self) -> usize {
        lock(&self.c.live().queue).unread_bytes()
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
                lock(&self.c.live().queue).outcome().unwrap_or(Err(e))
            }
            other => other,
        };
        self.c.final_read();
        outcome
    }
}

/// The connection half of a run's thread.
type Conn = terminals::Conn<Terminal, Arc<Live>>;

/// One terminal's thread: performs the run's ops, owns the low-level
/// terminal once opened, pulls its output into the bounded buffer.
fn drive_run(inner: &Inner, mut run: TerminalRun, mut accepted: OpenReply, owns_key: bool) {
    let key = run.key().clone();
    let (cmd_tx, cmd_rx) = mpsc::channel::<Cmd>();
    let mut conn: Option<Conn> = None;
    loop {
        while let Some(out) = run.poll_output() {
            match out {
                TermOutput::Store(id, op) => {
                    let r = apply_terminal_op(&**inner.t.store(), &op);
                    inner.t.stored(&mut run, id, r);
                }
                TermOutput::Inspect {
                    worker_id,
                    machine,
                    spec,
                } => {
                    let r = inner
                        .t
                        .client(&worker_id)
                        .and_then(|c| c.terminal_preflight(&machine, &spec));
                    inner.t.inspected(&mut run, r);
                }
                TermOutput::Open {
                    worker_id,
                    machine,
                    spec,
                } => {
                    let opened = inner
                        .t
                        .client(&worker_id)
                        .and_then(|c| c.terminal(&machine, &spec));
                    let opened = opened.and_then(|term| {
                        let live = Arc::new(Live {
                            queue: Mutex::new(inner.t.buffer(&spec)),
                            readable: Condvar::new(),
                            room: Condvar::new(),
                            cmd: Mutex::new(cmd_tx.clone()),
                        });
                        conn = Some(inner.t.connect(&key, term, live, &spec)?);
                        Ok(())
                    });
                    inner.changed.notify_all();
                    inner.t.opened(&mut run, opened);
                    accepted.on_opened(&run);
                }
                TermOutput::Close => {
                    let _ = close_conn(inner, &key, &mut run, &mut conn);
                }
                TermOutput::Event(ev) => accepted.on_event(ev),
            }
        }
        if run.is_done() && conn.is_none() {
            break;
        }
        let wake = inner.t.wake(&run);
        let now = Instant::now();
        let slice = wake.map_or(PULL_SLICE, |w| {
            w.saturating_duration_since(now).min(PULL_SLICE)
        });
        match conn.as_mut().map(|c| (inner.t.pace(c), c)) {
            Some((Err(e), _)) => finish_conn(inner, &key, &mut run, &mut conn, Err(e)),
            Some((Ok(Pace::Hold(until)), c)) => {
                // The consumer is live: so is the low-level terminal's
                // (this thread), which reads nothing meanwhile.
                c.term.keep_live();
                let left = until.saturating_duration_since(inner.t.now());
                let q = lock(&c.live.queue);
                if q.holds() {
                    drop(c.live.room.wait_timeout(q, left.min(slice)));
                }
            }
            Some((Ok(_), c)) => match c.term.next(slice) {
                Ok(TerminalEvent::Output(b)) => {
                    if let Err(e) = inner.t.output(c, b) {
                        finish_conn(inner, &key, &mut run, &mut conn, Err(e));
                    }
                }
                Ok(TerminalEvent::Closed(outcome)) => {
                    inner.t.peer_closed(&mut run, &key, &mut conn, outcome);
                }
                // The slice's own timeout, or an event kind this build does
                // not know: the session keeps running.
                Ok(_) | Err(_) => {}
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
            inner.t.tick(&mut run);
        }
    }
    drain_commands(&cmd_rx);
    if owns_key {
        inner.t.end_run(&key);
    }
    inner.changed.notify_all();
}

/// Answers what is left in the channel once the thread ends.
fn drain_commands(rx: &Receiver<Cmd>) {
    while let Ok(cmd) = rx.try_recv() {
        cmd.refuse();
    }
}

fn serve(inner: &Inner, key: &RecordKey, run: &mut TerminalRun, conn: &mut Option<Conn>, cmd: Cmd) {
    match (cmd, conn.as_mut()) {
        (Cmd::Input(b, reply), Some(c)) => reply(c.term.input(&b)),
        (Cmd::Resize(cols, rows, reply), Some(c)) => reply(c.term.resize(cols, rows)),
        (Cmd::Close(reply), Some(_)) => reply(close_conn(inner, key, run, conn)),
        (Cmd::End(e), Some(_)) => finish_conn(inner, key, run, conn, Err(e)),
        (Cmd::Cancel, _) => inner.t.cancel(run),
        (cmd, None) => cmd.refuse(),
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
    if let Some(c) = inner.t.verdict(run, conn, &outcome) {
        let _ = c.term.close();
        inner.t.ended(key, &c.live, outcome);
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
    inner.t.closed_on_request(run, key, &c.live, outcome)
}
