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
//! (the spec's `buffer_bytes` and 1,024 chunks), forwards the consumer's
//! input and resizes, and renews the claim. The buffer paces the task as
//! the low-level terminal paces its reads (the core's `Pace`): while the
//! consumer is live and the buffer full, the task pulls nothing (the
//! low-level terminal, kept live, holds its frames and stops reading the
//! socket) until the consumer reads; a consumer that has not read for the
//! grace is stalled and the session ends with an uncertain `output_limit`.
//! Terminal bytes are held in memory only.

use smolbox_core::Reason;
use std::sync::{Arc, Mutex};
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
use smolbox_core::{Error, Evidence, Operation};
use smolbox_store::apply_terminal_op;
use smolbox_store::runtime::Parts;
use smolbox_store::terminals::{self, Consumer, LiveConn, Terminals, lock};
use tokio::sync::{Notify, mpsc, oneshot};

use crate::{Client, Terminal, TerminalEvent};

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
    changed: Notify,
}

/// One live connection as the consumer sees it.
struct Live {
    queue: Mutex<OutputBuffer>,
    readable: Notify,
    /// The consumer read output: a run holding for room looks again.
    room: Notify,
    cmd: mpsc::UnboundedSender<Cmd>,
}

impl LiveConn for Live {
    fn send(&self, cmd: Cmd) -> bool {
        self.cmd.send(cmd).is_ok()
    }
    fn buffer(&self) -> &Mutex<OutputBuffer> {
        &self.queue
    }
    fn wake_reader(&self) {
        self.readable.notify_one();
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
        let (run, drive) = self.inner.t.open_run(key, machine, spec)?;
        let (tx, rx) = oneshot::channel();
        let accepted = OpenReply::new(reply(move |v| tx.send(v).is_ok()));
        tokio::spawn(drive_run(Arc::clone(&self.inner), run, accepted, drive));
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
            let bound = self.inner.t.attach(&mut self.inner.t.lock(), key)?;
            if let Some(bound) = bound {
                let t = Arc::clone(&self.inner.t);
                return Ok(ManagedTerminal {
                    c: Consumer::new(t, key.clone(), bound),
                });
            }
            tokio::select! {
                () = notified => {}
                () = tokio::time::sleep_until(deadline.into()) => return Err(not_live_here()),
            }
        }
    }

    /// The stored record of terminal `key`.
    ///
    /// # Errors
    /// `not_found` only on positive absence; `store`.
    pub async fn fetch(&self, key: &RecordKey) -> Result<ExecutionRecord, Error> {
        let store = Arc::clone(self.inner.t.store());
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
        let store = Arc::clone(self.inner.t.store());
        let now_ms = self.inner.t.now_ms();
        let k = key.clone();
        let rec = blocking(Operation::StoreCancel, move || store.cancel(&k, now_ms)).await?;
        // The run acts on it: `cancelling`, then it closes observation.
        self.inner.t.cancelled(key);
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
        if !self.inner.t.lock().begin_run(key) {
            return self.fetch(key).await;
        }
        let fetched = self.fetch(key).await;
        let run = self.inner.t.resume_run(key, fetched)?;
        let (tx, rx) = oneshot::channel();
        let accepted = OpenReply::new(reply(move |v| tx.send(v).is_ok()));
        tokio::spawn(drive_run(Arc::clone(&self.inner), run, accepted, true));
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
            if !self.inner.t.is_running(key) {
                return self.fetch(key).await;
            }
            tokio::select! {
                () = notified => {}
                () = tokio::time::sleep_until(deadline) => return Err(run_wait_expired()),
            }
        }
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

    /// Sends one command to the run's task and waits for its answer.
    async fn call<T: Send + 'static>(
        &self,
        op: Operation,
        make: impl FnOnce(Reply<Result<T, Error>>) -> Cmd,
    ) -> Result<T, Error> {
        self.c.check()?;
        let (tx, rx) = oneshot::channel();
        if !self.c.live().send(make(reply(move |v| tx.send(v).is_ok()))) {
            return Err(ended(op));
        }
        rx.await.map_err(|_| ended(op))?
    }

    /// Sends `bytes` to the PTY (1..=the spec's `input_bytes`). `Ok` means
    /// handed to the socket, not consumed by the guest.
    ///
    /// # Errors
    /// The session's errors; `authentication` / `not_found` when this
    /// handle no longer holds the session.
    pub async fn input(&mut self, bytes: &[u8]) -> Result<(), Error> {
        let b = bytes.to_vec();
        self.call(Operation::TerminalInput, |r| Cmd::Input(b, r))
            .await
    }

    /// Sends a window-size change (1–65,535 each).
    ///
    /// # Errors
    /// As [`ManagedTerminal::input`]; `validation` for 0.
    pub async fn resize(&mut self, cols: u16, rows: u16) -> Result<(), Error> {
        self.call(Operation::TerminalResize, |r| Cmd::Resize(cols, rows, r))
            .await
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
        check_next_wait(timeout)?;
        self.c.check()?;
        let deadline = tokio::time::Instant::now() + timeout;
        let live = Arc::clone(self.c.live());
        let now = self.c.now();
        lock(&live.queue).begin_wait(now, now + timeout);
        loop {
            let notified = live.readable.notified();
            if let Some(ev) = self.pop() {
                return Ok(ev);
            }
            tokio::select! {
                () = notified => {}
                () = tokio::time::sleep_until(deadline) => {
                    return self.pop().ok_or_else(next_expired);
                }
            }
        }
    }

    fn pop(&mut self) -> Option<TerminalEvent> {
        let ev = lock(&self.c.live().queue).pop(self.c.now())?;
        if matches!(ev, TerminalEvent::Closed(_)) {
            self.c.final_read();
        } else {
            self.c.live().room.notify_one();
        }
        Some(ev)
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
    pub async fn close(mut self) -> Result<TerminalExit, Error> {
        self.c.check()?;
        let (tx, rx) = oneshot::channel();
        let outcome = if self
            .c
            .live()
            .send(Cmd::Close(reply(move |v| tx.send(v).is_ok())))
        {
            rx.await.map_err(|_| ended(Operation::TerminalClose))?
        } else {
            lock(&self.c.live().queue)
                .outcome()
                .unwrap_or(Err(ended(Operation::TerminalClose)))
        };
        self.c.final_read();
        outcome
    }
}

/// Runs a store call on tokio's blocking pool; a lost task is `store`.
async fn blocking<T, F>(op: Operation, f: F) -> Result<T, Error>
where
    F: FnOnce() -> Result<T, Error> + Send + 'static,
    T: Send + 'static,
{
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|_| Err(Error::store(op, Evidence::Unknown, Reason::StoreTaskLost)))
}

/// The connection half of a run's task.
type Conn = terminals::Conn<Terminal, Arc<Live>>;

/// One terminal's task: performs the run's ops, owns the low-level
/// terminal once opened, pulls its output into the bounded buffer.
async fn drive_run(
    inner: Arc<Inner>,
    mut run: TerminalRun,
    mut accepted: OpenReply,
    owns_key: bool,
) {
    let key = run.key().clone();
    let (cmd_tx, mut cmd_rx) = mpsc::unbounded_channel::<Cmd>();
    let mut conn: Option<Conn> = None;
    loop {
        while let Some(out) = run.poll_output() {
            match out {
                TermOutput::Store(id, op) => {
                    let store = Arc::clone(inner.t.store());
                    tracing::debug!(op = op.name(), "terminal store op");
                    let r = blocking(Operation::StoreWrite, move || {
                        apply_terminal_op(&*store, &op)
                    })
                    .await;
                    inner.t.stored(&mut run, id, r);
                }
                TermOutput::Inspect {
                    worker_id,
                    machine,
                    spec,
                } => {
                    let r = match inner.t.client(&worker_id) {
                        Err(e) => Err(e),
                        Ok(c) => c.terminal_preflight(&machine, &spec).await,
                    };
                    inner.t.inspected(&mut run, r);
                }
                TermOutput::Open {
                    worker_id,
                    machine,
                    spec,
                } => {
                    let opened = match inner.t.client(&worker_id) {
                        Err(e) => Err(e),
                        Ok(c) => c.terminal(&machine, &spec).await,
                    };
                    let opened = opened.and_then(|term| {
                        let live = Arc::new(Live {
                            queue: Mutex::new(inner.t.buffer(&spec)),
                            readable: Notify::new(),
                            room: Notify::new(),
                            cmd: cmd_tx.clone(),
                        });
                        conn = Some(inner.t.connect(&key, term, live, &spec)?);
                        Ok(())
                    });
                    inner.changed.notify_waiters();
                    inner.t.opened(&mut run, opened);
                    accepted.on_opened(&run);
                }
                TermOutput::Close => {
                    let _ = close_conn(&inner, &key, &mut run, &mut conn).await;
                }
                TermOutput::Event(ev) => accepted.on_event(ev),
            }
        }
        if run.is_done() && conn.is_none() {
            break;
        }
        let hold = match conn.as_mut().map(|c| (inner.t.pace(c), c)) {
            Some((Err(e), _)) => {
                finish_conn(&inner, &key, &mut run, &mut conn, Err(e)).await;
                continue;
            }
            Some((Ok(Pace::Hold(until)), c)) => {
                // The consumer is live: so is the low-level terminal's
                // (the run), which holds its frames meanwhile.
                c.term.keep_live();
                Some((until, Arc::clone(&c.live)))
            }
            Some((Ok(_), _)) | None => None,
        };
        let held = hold.is_some();
        let wake = inner.t.wake(&run);
        let sleep = async {
            match wake {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            ev = next_of(conn.as_mut().filter(|_| !held)) => match ev {
                Some(Ok(TerminalEvent::Output(b))) => {
                    let Some(c) = conn.as_ref() else { continue };
                    if let Err(e) = inner.t.output(c, b) {
                        finish_conn(&inner, &key, &mut run, &mut conn, Err(e)).await;
                    }
                }
                Some(Ok(TerminalEvent::Closed(outcome))) => {
                    inner.t.peer_closed(&mut run, &key, &mut conn, outcome);
                }
                // The pull's own timeout, or an event kind this build does
                // not know: the session keeps running.
                Some(Ok(_) | Err(_)) | None => {}
            },
            cmd = cmd_rx.recv() => {
                let Some(cmd) = cmd else { continue };
                match (cmd, conn.as_mut()) {
                    (Cmd::Input(b, reply), Some(c)) => reply(c.term.input(&b).await),
                    (Cmd::Resize(cols, rows, reply), Some(c)) => {
                        reply(c.term.resize(cols, rows).await);
                    }
                    (Cmd::Close(reply), Some(_)) => {
                        reply(close_conn(&inner, &key, &mut run, &mut conn).await);
                    }
                    (Cmd::End(e), Some(_)) => {
                        finish_conn(&inner, &key, &mut run, &mut conn, Err(e)).await;
                    }
                    (Cmd::Cancel, _) => inner.t.cancel(&mut run),
                    (cmd, None) => cmd.refuse(),
                }
            }
            () = room(hold) => {}
            () = sleep => inner.t.tick(&mut run),
        }
    }
    if owns_key {
        inner.t.end_run(&key);
    }
    inner.changed.notify_waiters();
}

/// The consumer's next read, or the end of its grace (then the run asks
/// again); never without a hold.
async fn room(hold: Option<(Instant, Arc<Live>)>) {
    match hold {
        Some((until, live)) => tokio::select! {
            () = live.room.notified() => {}
            () = tokio::time::sleep_until(until.into()) => {}
        },
        None => std::future::pending().await,
    }
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
    if let Some(c) = inner.t.verdict(run, conn, &outcome) {
        let _ = c.term.close().await;
        inner.t.ended(key, &c.live, outcome);
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
    inner.t.closed_on_request(run, key, &c.live, outcome)
}
