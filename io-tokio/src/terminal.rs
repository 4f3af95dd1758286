//! [`Terminal`]: an interactive terminal on a worker (features C7.2, C7.3).
//!
//! The core's `TerminalSession` holds the whole protocol: handshake, frames,
//! budgets (the write-stall bound included), the bounded unread-output
//! queue, the read pacing and exit decoding. This shell runs one task per
//! terminal that turns the shell's one [`Driver`] over the session (kept
//! behind a lock the consumer shares): it reads whenever the session wants
//! to (so pings are answered and a stalled consumer hits the queue's bound
//! instead of stalling the worker), writes what the session queues, and
//! fires the session's timers. The consumer pulls with [`Terminal::next`].
//! Dropping the handle detaches the consumer (the session ends with
//! `terminal_consumer`), and the task ends within the close wait; it never
//! outlives the session budget.

use smolbox_core::Reason;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use smolbox_core::terminal::{
    Next, TerminalCall, TerminalConfig, TerminalEvent, TerminalExit, TerminalSession, TerminalSpec,
};
use smolbox_core::{Error, Evidence, Operation, TransportFailure};
use smolbox_store::entropy;
use tokio::sync::Notify;

use crate::drive::Driver;
use crate::transport::Connection;

/// An open interactive terminal (the 101 was read; that does not mean the
/// program runs). One consumer: the methods take `&mut self`.
#[derive(Debug)]
pub struct Terminal {
    shared: Arc<Shared>,
    task: Option<tokio::task::JoinHandle<()>>,
}

struct Shared {
    state: Mutex<State>,
    /// The task wakes for new transmits or a detach.
    to_task: Notify,
    /// The consumer wakes for new output, the outcome, or a transport end.
    to_consumer: Notify,
}

struct State {
    session: TerminalSession,
    /// The task ended (socket closed).
    task_done: bool,
    /// The consumer handle was dropped.
    detached: bool,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").finish_non_exhaustive()
    }
}

impl Terminal {
    /// Starts the session on `conn` and returns once the 101 was read (or
    /// the session ended before that, which is an error).
    pub(crate) async fn open(
        conn: Connection,
        spec: &TerminalSpec,
        config: TerminalConfig,
    ) -> Result<Self, Error> {
        let session = entropy::terminal_session(spec, config, Instant::now())?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                session,
                task_done: false,
                detached: false,
            }),
            to_task: Notify::new(),
            to_consumer: Notify::new(),
        });
        let task = tokio::spawn(drive(Arc::clone(&shared), Driver::new(conn)));
        let mut terminal = Self {
            shared,
            task: Some(task),
        };
        terminal.wait_open().await?;
        Ok(terminal)
    }

    /// The worker's close frame (its code and exact reason), once one was
    /// received; `None` before that or when the connection ended without one.
    pub fn peer_close(&self) -> Option<smolbox_core::ws::CloseInfo> {
        self.shared.lock().session.peer_close()
    }

    /// Sends `bytes` to the PTY (1..=the spec's per-input cap). `Ok` means
    /// handed to the socket writer, not read by the guest.
    ///
    /// # Errors
    /// The session's errors (size, cumulative cap, ended session) and a
    /// transport failure of the connection.
    pub async fn input(&mut self, bytes: &[u8]) -> Result<(), Error> {
        {
            let mut st = self.shared.lock();
            st.session.input(Instant::now(), bytes)?;
            entropy::top_up(&mut st.session)?;
        }
        self.shared.to_task.notify_one();
        Ok(())
    }

    /// Sends a window-size change.
    ///
    /// # Errors
    /// As [`input`](Self::input); `validation` for 0 columns or rows.
    pub async fn resize(&mut self, cols: u16, rows: u16) -> Result<(), Error> {
        {
            let mut st = self.shared.lock();
            st.session.resize(Instant::now(), cols, rows)?;
            entropy::top_up(&mut st.session)?;
        }
        self.shared.to_task.notify_one();
        Ok(())
    }

    /// Waits up to `timeout` (≤ 900 s) for output or the end of the session.
    /// A timeout ends this wait only (`expired`, operation
    /// `terminal_output`); the session keeps running.
    ///
    /// # Errors
    /// The wait's `expired` error, `validation` for a timeout over 900 s.
    pub async fn next(&mut self, timeout: Duration) -> Result<TerminalEvent, Error> {
        let until = {
            let mut st = self.shared.lock();
            st.session.begin_next(Instant::now(), timeout)?
        };
        loop {
            // Register interest before looking, so a wake in between is kept.
            let notified = self.shared.to_consumer.notified();
            let wake = {
                let mut st = self.shared.lock();
                let now = Instant::now();
                match st.session.next(now, until) {
                    Next::Output(bytes) => {
                        let out = Bytes::copy_from_slice(bytes);
                        drop(st);
                        // Queue space was freed: a throttled driver reads on.
                        self.shared.to_task.notify_one();
                        return Ok(TerminalEvent::Output(out));
                    }
                    Next::Closed(outcome) => return Ok(TerminalEvent::Closed(outcome)),
                    Next::TimedOut(e) => return Err(e),
                    Next::Pending(at) => at,
                }
            };
            tokio::select! {
                () = notified => {}
                () = tokio::time::sleep_until(wake.into()) => {
                    // The task fires the session's timers; a wait deadline is
                    // seen by the next `session.next`.
                    let mut st = self.shared.lock();
                    st.session.handle_timeout(Instant::now());
                }
            }
        }
    }

    /// The consumer is live although it pulls nothing now: a managed
    /// terminal's run holding output for its own live consumer. The
    /// session keeps pausing its reads for the grace
    /// (`TerminalSession::keep_live`).
    pub(crate) fn keep_live(&mut self) {
        self.shared.lock().session.keep_live(Instant::now());
        // The reading task plans again (it may have been reading for a
        // consumer it took for stalled).
        self.shared.to_task.notify_one();
    }

    /// Closes the session: sends a close frame and waits (the close wait)
    /// for the worker's. Returns the outcome: without an exit frame first it
    /// is uncertain.
    pub async fn close(self) -> Result<TerminalExit, Error> {
        {
            let mut st = self.shared.lock();
            st.session.close(Instant::now());
        }
        self.shared.to_task.notify_one();
        loop {
            let notified = self.shared.to_consumer.notified();
            {
                let st = self.shared.lock();
                if let Some(outcome) = st.session.outcome() {
                    return outcome;
                }
            }
            notified.await;
        }
    }

    async fn wait_open(&mut self) -> Result<(), Error> {
        loop {
            let notified = self.shared.to_consumer.notified();
            {
                let st = self.shared.lock();
                if st.session.is_open() {
                    return Ok(());
                }
                if let Some(Err(e)) = st.session.outcome() {
                    return Err(e);
                }
                if st.task_done {
                    return Err(Error::transport(
                        Operation::TerminalOpen,
                        Evidence::DispatchUncertain,
                        Reason::ClosedBeforeOpen,
                    ));
                }
            }
            notified.await;
        }
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        if let Ok(mut st) = self.shared.state.lock() {
            st.detached = true;
            st.session.detach(Instant::now());
        }
        self.shared.to_task.notify_one();
        // The task finishes on its own within the close wait; it is not
        // aborted so that the close frame can still go out.
        self.task.take();
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A poisoned lock means a panic while holding it elsewhere; the
        // state is still consistent enough to report (all writes are single
        // calls into the session).
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The driver task: turns the shell's one [`Driver`] over the shared
/// session until the session says the transport is finished. The lock is
/// held around the synchronous steps only; the wait races the consumer's
/// wake-ups (new transmits, a pull that freed queue space, a detach).
async fn drive(shared: Arc<Shared>, mut driver: Driver) {
    loop {
        let notified = shared.to_task.notified();
        let plan = {
            let mut st = shared.lock();
            if st.session.is_transport_finished() && driver.is_flushed() {
                break;
            }
            driver.prepare(&mut st.session)
        };
        let io = tokio::select! {
            io = driver.wait(plan) => Some(io),
            () = notified => None,
        };
        let mut st = shared.lock();
        if let Some(io) = io {
            driver.apply(&mut st.session, io, Instant::now());
        }
        if entropy::top_up(&mut st.session).is_err() {
            // No randomness for masks: nothing more can be sent.
            st.session
                .handle_transport_error(Instant::now(), TransportFailure::Write);
        }
        drop(st);
        shared.to_consumer.notify_one();
    }
    let mut st = shared.lock();
    st.task_done = true;
    if st.session.outcome().is_none() {
        // The socket is gone: the session decides what that means.
        st.session
            .handle_transport_error(Instant::now(), TransportFailure::Read);
    }
    drop(st);
    shared.to_consumer.notify_one();
}

impl crate::Client {
    /// Opens an interactive terminal on `machine` running `spec.program`:
    /// admits the worker's version (a `GET /health` preflight), checks the
    /// spec and the version gate (terminals from 1.17.0) with the core's
    /// [`TerminalCall`], inspects the machine (it must be a plain image
    /// machine: C7.4), connects (outside the request pool: the connection
    /// becomes the WebSocket), sends the upgrade and returns once the 101
    /// was read — all inside one operation deadline. The handshake must
    /// complete within min(operation budget, 30 s, connect budget); socket
    /// writes within min(connect budget, 1 s).
    ///
    /// # Errors
    /// Spec validation (`validation`, nothing sent); an unknown version or
    /// one without terminals (`unsupported_capability`, `not_dispatched`);
    /// connect failures (`transport`, `not_dispatched`); 401/403
    /// (`authentication`) and any other status (`protocol`); handshake
    /// timeout.
    pub async fn terminal(&self, machine: &str, spec: &TerminalSpec) -> Result<Terminal, Error> {
        let deadlines = self.deadlines(Instant::now());
        let call = self.terminal_call(machine, spec, deadlines).await?;
        let connect_deadline = deadlines.connect_by(Instant::now());
        let conn = self
            .pool()
            .target()
            .connect(connect_deadline, Operation::TerminalOpen)
            .await?;
        Terminal::open(conn, call.spec(), call.config(self.endpoint())).await
    }

    /// Everything [`terminal`](Self::terminal) checks before it connects
    /// — the health preflight, the core's [`TerminalCall`] gates and its
    /// image-machine inspect — inside one operation deadline, opening
    /// nothing. The managed runtime asks it before accepting a terminal
    /// (C7.4).
    ///
    /// # Errors
    /// As [`terminal`](Self::terminal) before connecting; a machine that
    /// is not a plain image machine is `unsupported_capability`
    /// (`needs_plain_image_machine`), evidence `not_dispatched`.
    pub async fn terminal_preflight(
        &self,
        machine: &str,
        spec: &TerminalSpec,
    ) -> Result<(), Error> {
        self.terminal_call(machine, spec, self.deadlines(Instant::now()))
            .await
            .map(|_| ())
    }

    /// The checked terminal call: version, gates, image machine.
    async fn terminal_call(
        &self,
        machine: &str,
        spec: &TerminalSpec,
        deadlines: smolbox_core::worker::OperationDeadlines,
    ) -> Result<TerminalCall, Error> {
        spec.validate()?;
        let profile = self.preflight(deadlines).await?;
        let call = TerminalCall::new(&profile, machine, spec)?;
        self.image_preflight(call.image_check(), deadlines).await?;
        Ok(call)
    }
}
