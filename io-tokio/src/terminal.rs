//! [`Terminal`]: an interactive terminal on a worker (features C7.2, C7.3).
//!
//! The core's `TerminalSession` holds the whole protocol: handshake, frames,
//! budgets, the bounded unread-output queue and exit decoding. This shell
//! runs one driver task per terminal that owns the socket: it reads
//! continuously (so pings are answered and a stalled consumer hits the
//! queue's bound instead of stalling the worker), writes what the session
//! queues within the write bound, and fires the session's timers. The
//! consumer pulls with [`Terminal::next`]. Dropping the handle detaches the
//! consumer (the session ends with `terminal_consumer`), and the task ends
//! within the close wait; it never outlives the session budget.

use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Poll;
use std::time::{Duration, Instant};

use bytes::Bytes;
use smolbox_core::terminal::{Next, TerminalConfig, TerminalExit, TerminalSession, TerminalSpec};
use smolbox_core::{Category, Error, Evidence, Operation};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;

use crate::drive::READ_CHUNK;
use crate::transport::Connection;

/// Longest time one socket write may stay blocked (C7.2: at most
/// min(connect budget, 1 s)).
pub(crate) const MAX_WRITE_WAIT: Duration = Duration::from_millis(1_000);

/// How long a throttled driver waits for the consumer before reading on.
const READ_GRACE: Duration = Duration::from_millis(20);

/// What [`Terminal::next`] returns.
#[derive(Clone, PartialEq, Eq)]
pub enum TerminalEvent {
    /// Output bytes from the PTY (chunk boundaries are arbitrary).
    Output(Bytes),
    /// The session ended: `Ok` is a confirmed exit code; `Err` an uncertain
    /// outcome (124, 130, a close before the exit, a budget, a limit…).
    Closed(Result<TerminalExit, Error>),
}

impl std::fmt::Debug for TerminalEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Terminal bytes are never printed.
        match self {
            Self::Output(b) => write!(f, "Output(len {})", b.len()),
            Self::Closed(r) => write!(f, "Closed({r:?})"),
        }
    }
}

/// An open interactive terminal (the 101 was read; that does not mean the
/// program runs). One consumer: the methods take `&mut self`.
#[derive(Debug)]
pub struct Terminal {
    shared: Arc<Shared>,
    task: Option<tokio::task::JoinHandle<()>>,
}

struct Shared {
    state: Mutex<State>,
    /// The unread-output bound of the session (for the read throttle).
    max_buffer_bytes: usize,
    /// The task wakes for new transmits or a detach.
    to_task: Notify,
    /// The consumer wakes for new output, the outcome, or a transport end.
    to_consumer: Notify,
}

struct State {
    session: TerminalSession,
    /// A transport failure the session cannot know about (socket error,
    /// write timeout); sticky.
    transport: Option<Error>,
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
        write_wait: Duration,
    ) -> Result<Self, Error> {
        let mut key = [0u8; 16];
        random(&mut key)?;
        let mut session = TerminalSession::new(spec, config, key, Instant::now())?;
        feed_entropy(&mut session)?;
        let shared = Arc::new(Shared {
            max_buffer_bytes: spec.max_buffer_bytes,
            state: Mutex::new(State {
                session,
                transport: None,
                task_done: false,
                detached: false,
            }),
            to_task: Notify::new(),
            to_consumer: Notify::new(),
        });
        let task = tokio::spawn(drive(
            Arc::clone(&shared),
            conn,
            write_wait.min(MAX_WRITE_WAIT),
        ));
        let mut terminal = Self {
            shared,
            task: Some(task),
        };
        terminal.wait_open().await?;
        Ok(terminal)
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
            if let Some(e) = st.transport {
                return Err(e.with_operation(Operation::TerminalInput));
            }
            st.session.input(Instant::now(), bytes)?;
            feed_entropy(&mut st.session)?;
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
            if let Some(e) = st.transport {
                return Err(e.with_operation(Operation::TerminalResize));
            }
            st.session.resize(Instant::now(), cols, rows)?;
            feed_entropy(&mut st.session)?;
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
            let st = self.shared.lock();
            st.session.wait_deadline(Instant::now(), timeout)?
        };
        loop {
            // Register interest before looking, so a wake in between is kept.
            let notified = self.shared.to_consumer.notified();
            let wake = {
                let mut st = self.shared.lock();
                let transport = st.transport;
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
                    Next::Pending(at) => {
                        if let Some(e) = transport {
                            return Ok(TerminalEvent::Closed(Err(e)));
                        }
                        at
                    }
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
                if let Some(e) = st.transport {
                    return Err(e.with_operation(Operation::TerminalClose));
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
                if let Some(e) = st.transport {
                    return Err(e.with_operation(Operation::TerminalOpen));
                }
                if st.task_done {
                    return Err(Error::new(
                        Category::Transport,
                        Operation::TerminalOpen,
                        Evidence::DispatchUncertain,
                    )
                    .with_reason("closed_before_open"));
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

/// The driver task: write what the session queued (within the write
/// bound), read what arrives, fire timers; until the transport is finished.
async fn drive(shared: Arc<Shared>, mut conn: Connection, write_wait: Duration) {
    let mut out: Vec<u8> = Vec::with_capacity(4096);
    let mut pos = 0usize;
    let mut rbuf = vec![0u8; READ_CHUNK].into_boxed_slice();
    let mut eof = false;
    let mut need_flush = false;
    // After a failed write the peer may still send (the exit frame, its
    // close): keep reading, stop writing.
    let mut write_broken = false;
    let mut blocked_since: Option<Instant> = None;
    // Set when a throttle grace passed without the consumer pulling: the
    // consumer is stalled, so read on (the queue bound decides) until it
    // pulls again.
    let mut consumer_stalled = false;
    loop {
        let notified = shared.to_task.notified();
        let throttle;
        let deadline = {
            let mut st = shared.lock();
            if pos == out.len() || write_broken {
                out.clear();
                pos = 0;
                need_flush = false;
                while st.session.poll_transmit(&mut out).is_some() {}
                if write_broken {
                    out.clear();
                }
            }
            if st.session.is_transport_finished() && pos == out.len() && !need_flush {
                break;
            }
            if eof && pos == out.len() && st.session.poll_timeout().is_none() {
                break;
            }
            let mut deadline = st.session.poll_timeout().map(|(at, _)| at);
            // A live consumer on the same runtime must get a chance to pull
            // before the driver fills the queue: above half of either bound
            // the driver pauses reading until the consumer pulls, or for a
            // short grace. A stalled consumer still overflows the queue
            // (output_limit) after a few graces.
            throttle = !consumer_stalled
                && (st.session.unread_bytes() * 2 > shared.max_buffer_bytes
                    || st.session.unread_chunks() * 2 > smolbox_core::terminal::MAX_UNREAD_CHUNKS);
            if throttle {
                let grace = Instant::now() + READ_GRACE;
                deadline = Some(deadline.map_or(grace, |d| d.min(grace)));
            }
            if pos < out.len() || need_flush {
                let since = *blocked_since.get_or_insert_with(Instant::now);
                let limit = since + write_wait;
                deadline = Some(deadline.map_or(limit, |d| d.min(limit)));
            }
            deadline
        };
        let io = std::future::poll_fn(|cx| {
            if pos < out.len() {
                match Pin::new(&mut conn).poll_write(cx, &out[pos..]) {
                    Poll::Ready(Ok(0) | Err(_)) => return Poll::Ready(Io::Failed("write_failed")),
                    Poll::Ready(Ok(n)) => return Poll::Ready(Io::Wrote(n)),
                    Poll::Pending => {}
                }
            } else if need_flush {
                match Pin::new(&mut conn).poll_flush(cx) {
                    Poll::Ready(Ok(())) => return Poll::Ready(Io::Flushed),
                    Poll::Ready(Err(_)) => return Poll::Ready(Io::Failed("write_failed")),
                    Poll::Pending => {}
                }
            }
            if eof || throttle {
                return Poll::Pending;
            }
            let mut buf = ReadBuf::new(&mut rbuf[..]);
            match Pin::new(&mut conn).poll_read(cx, &mut buf) {
                Poll::Ready(Ok(())) => Poll::Ready(Io::Read(buf.filled().len())),
                Poll::Ready(Err(_)) => Poll::Ready(Io::Failed("read_failed")),
                Poll::Pending => Poll::Pending,
            }
        });
        let sleep = async {
            match deadline {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => std::future::pending().await,
            }
        };
        let outcome = tokio::select! {
            io = io => io,
            () = sleep => Io::Timer,
            () = notified => Io::Commands,
        };
        let now = Instant::now();
        let mut st = shared.lock();
        match outcome {
            Io::Wrote(n) => {
                pos += n;
                blocked_since = None;
                // TLS may hold records until flushed.
                need_flush = pos == out.len();
            }
            Io::Flushed => {
                need_flush = false;
                blocked_since = None;
            }
            Io::Read(0) => {
                eof = true;
                st.session.handle_eof(now);
            }
            Io::Read(n) => {
                // A chunk is at most READ_CHUNK = 64 KiB, the session's cap.
                let _ = st.session.handle_input(now, &rbuf[..n]);
            }
            Io::Timer => {
                consumer_stalled |= throttle;
                if blocked_since.is_some_and(|since| now >= since + write_wait) {
                    st.transport = Some(transport_error("write_timeout"));
                    break;
                }
                st.session.handle_timeout(now);
            }
            Io::Commands => consumer_stalled = false,
            Io::Failed("write_failed") if !eof => {
                write_broken = true;
                blocked_since = None;
            }
            Io::Failed(reason) => {
                st.session.handle_eof(now);
                if st.session.outcome().is_none() {
                    st.transport = Some(transport_error(reason));
                }
                break;
            }
        }
        if let Err(e) = feed_entropy(&mut st.session) {
            st.transport = Some(e);
            break;
        }
        drop(st);
        shared.to_consumer.notify_one();
    }
    let mut st = shared.lock();
    st.task_done = true;
    if st.session.outcome().is_none() && st.transport.is_none() {
        let reason = if write_broken {
            "write_failed"
        } else {
            "connection_ended"
        };
        st.transport = Some(transport_error(reason));
    }
    drop(st);
    shared.to_consumer.notify_one();
}

enum Io {
    Wrote(usize),
    Flushed,
    Read(usize),
    Timer,
    Commands,
    Failed(&'static str),
}

fn transport_error(reason: &'static str) -> Error {
    Error::new(
        Category::Transport,
        Operation::TerminalOutput,
        Evidence::Unknown,
    )
    .with_reason(reason)
}

/// Tops up the session's masking randomness when it asks for more.
fn feed_entropy(session: &mut TerminalSession) -> Result<(), Error> {
    let wanted = session.entropy_wanted();
    if wanted > 0 {
        let mut buf = vec![0u8; wanted];
        random(&mut buf)?;
        session.handle_entropy(&buf);
    }
    Ok(())
}

fn random(buf: &mut [u8]) -> Result<(), Error> {
    getrandom::getrandom(buf).map_err(|_| {
        Error::new(
            Category::Transport,
            Operation::TerminalOpen,
            Evidence::NotDispatched,
        )
        .with_reason("no_randomness")
    })
}

impl crate::Client {
    /// Opens an interactive terminal on `machine` running `spec.program`:
    /// connects (outside the request pool: the connection becomes the
    /// WebSocket), sends the upgrade and returns once the 101 was read.
    /// The handshake must complete within min(operation budget, 30 s,
    /// connect budget); socket writes within min(connect budget, 1 s).
    ///
    /// # Errors
    /// Spec validation (`validation`, nothing sent); connect failures
    /// (`transport`, `not_dispatched`); 401/403 (`authentication`) and any
    /// other status (`protocol`); handshake timeout.
    pub async fn terminal(&self, machine: &str, spec: &TerminalSpec) -> Result<Terminal, Error> {
        spec.validate()?;
        let endpoint = self.endpoint();
        let budgets = endpoint.budgets();
        let start = Instant::now();
        let operation_deadline = start + budgets.operation;
        let connect_deadline = (start + budgets.connect).min(operation_deadline);
        let conn = self
            .pool()
            .target()
            .connect(connect_deadline, Operation::TerminalOpen)
            .await?;
        let mut config = TerminalConfig::new(endpoint.host_header(), machine);
        config.authorization = endpoint.token().cloned();
        config.max_request_bytes = budgets.max_request_body;
        config.handshake_timeout = budgets
            .operation
            .min(smolbox_core::terminal::MAX_HANDSHAKE_TIMEOUT)
            .min(budgets.connect);
        Terminal::open(conn, spec, config, budgets.connect).await
    }
}
