//! [`Terminal`]: an interactive terminal on a worker (features C7.2, C7.3).
//!
//! The core's `TerminalSession` holds the whole protocol: handshake, frames,
//! budgets, the bounded unread-output queue and exit decoding. This shell
//! has no background task: the session is driven on the consumer's thread,
//! inside [`Terminal::next`], [`Terminal::input`], [`Terminal::resize`] and
//! [`Terminal::close`].
//!
//! * Every call first reads *everything that already arrived* (without
//!   waiting), as a continuously reading task would have: pings are
//!   answered, and a consumer that stalled between calls finds the session
//!   ended with `output_limit` when more than the queue's bound piled up —
//!   the same outcome as on the tokio shell.
//! * `next(timeout)` then waits in `mio::Poll::poll` until the socket is
//!   ready or the earlier of the session's next timer and the wait's end.
//! * Writes never block: bytes the socket does not take are parked and go
//!   out on the next call. Parked bytes that make no progress for the write
//!   bound (min(connect budget, [`MAX_WRITE_WAIT`])) end the session with
//!   `transport` (`write_timeout`).
//! * Dropping the handle detaches the consumer (the session ends with
//!   `terminal_consumer`); the close frame is written if the socket takes
//!   it at once, then the socket is closed. Nothing outlives the handle.

use std::time::{Duration, Instant};

use bytes::Bytes;
use smolbox_core::terminal::{Next, TerminalConfig, TerminalExit, TerminalSession, TerminalSpec};
use smolbox_core::{Category, Error, Evidence, Operation};

use crate::conn::{Conn, Failure, Machine};

/// Longest time one socket write may stay blocked (C7.2: at most
/// min(connect budget, 1 s)).
pub const MAX_WRITE_WAIT: Duration = Duration::from_millis(1_000);

/// Turns of reading per call before the consumer is served, at most
/// (with 8 reads of 16 KiB per turn: 8 MiB, far above any queue bound).
const DRAIN_TURNS: usize = 64;

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
pub struct Terminal {
    conn: Conn,
    session: TerminalSession,
    write_wait: Duration,
    /// A transport failure the session cannot know about; sticky.
    transport: Option<Error>,
    /// Since when parked bytes have made no progress.
    blocked_since: Option<Instant>,
    sent_at_block: u64,
}

impl std::fmt::Debug for Terminal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Terminal")
            .field("open", &self.session.is_open())
            .field("unread_bytes", &self.session.unread_bytes())
            .field("transport", &self.transport)
            .finish_non_exhaustive()
    }
}

impl Machine for TerminalSession {
    fn handle_input(&mut self, now: Instant, bytes: &[u8]) {
        // Chunks are at most READ_CHUNK (16 KiB), under the session's 64 KiB
        // cap, so the only error cannot happen; peer faults decide the
        // outcome, which `next` reports.
        let _ = Self::handle_input(self, now, bytes);
    }

    fn handle_eof(&mut self, now: Instant) {
        Self::handle_eof(self, now);
    }

    fn handle_timeout(&mut self, now: Instant) {
        Self::handle_timeout(self, now);
    }

    fn poll_transmit(&mut self, out: &mut Vec<u8>) -> bool {
        Self::poll_transmit(self, out).is_some()
    }

    fn poll_timeout(&self) -> Option<Instant> {
        Self::poll_timeout(self).map(|(at, _)| at)
    }

    fn wants_input(&self) -> bool {
        !self.is_transport_finished()
    }
}

impl Terminal {
    /// Starts the session on `conn` and returns once the 101 was read (or
    /// the session ended before that, which is an error).
    pub(crate) fn open(
        conn: Conn,
        spec: &TerminalSpec,
        config: TerminalConfig,
        write_wait: Duration,
    ) -> Result<Self, Error> {
        let mut key = [0u8; 16];
        random(&mut key)?;
        let mut session = TerminalSession::new(spec, config, key, Instant::now())?;
        feed_entropy(&mut session)?;
        let mut terminal = Self {
            conn,
            session,
            write_wait: write_wait.min(MAX_WRITE_WAIT),
            transport: None,
            blocked_since: None,
            sent_at_block: 0,
        };
        loop {
            if terminal.session.is_open() {
                return Ok(terminal);
            }
            if let Some(Err(e)) = terminal.session.outcome() {
                return Err(e);
            }
            if let Some(e) = terminal.transport {
                return Err(e.with_operation(Operation::TerminalOpen));
            }
            if terminal.session.is_transport_finished() {
                return Err(Error::new(
                    Category::Transport,
                    Operation::TerminalOpen,
                    Evidence::DispatchUncertain,
                )
                .with_reason("closed_before_open"));
            }
            terminal.step(None);
        }
    }

    /// Sends `bytes` to the PTY (1..=the spec's per-input cap). `Ok` means
    /// handed to the socket (or parked for it), not read by the guest.
    ///
    /// # Errors
    /// The session's errors (size, cumulative cap, ended session) and a
    /// transport failure of the connection.
    pub fn input(&mut self, bytes: &[u8]) -> Result<(), Error> {
        self.drain_available();
        if let Some(e) = self.transport {
            return Err(e.with_operation(Operation::TerminalInput));
        }
        self.session.input(Instant::now(), bytes)?;
        self.after_command();
        Ok(())
    }

    /// Sends a window-size change.
    ///
    /// # Errors
    /// As [`input`](Self::input); `validation` for 0 columns or rows.
    pub fn resize(&mut self, cols: u16, rows: u16) -> Result<(), Error> {
        self.drain_available();
        if let Some(e) = self.transport {
            return Err(e.with_operation(Operation::TerminalResize));
        }
        self.session.resize(Instant::now(), cols, rows)?;
        self.after_command();
        Ok(())
    }

    /// Waits up to `timeout` (≤ 900 s) for output or the end of the session.
    /// A timeout ends this wait only (`expired`, operation
    /// `terminal_output`); the session keeps running.
    ///
    /// # Errors
    /// The wait's `expired` error, `validation` for a timeout over 900 s.
    pub fn next(&mut self, timeout: Duration) -> Result<TerminalEvent, Error> {
        let until = self.session.wait_deadline(Instant::now(), timeout)?;
        self.drain_available();
        loop {
            let transport = self.transport;
            match self.session.next(Instant::now(), until) {
                Next::Output(bytes) => {
                    return Ok(TerminalEvent::Output(Bytes::copy_from_slice(bytes)));
                }
                Next::Closed(outcome) => return Ok(TerminalEvent::Closed(outcome)),
                Next::TimedOut(e) => return Err(e),
                Next::Pending(at) => {
                    if let Some(e) = transport {
                        return Ok(TerminalEvent::Closed(Err(e)));
                    }
                    self.step(Some(at));
                }
            }
        }
    }

    /// Closes the session: sends a close frame and waits (the close wait)
    /// for the worker's. Returns the outcome: without an exit frame first it
    /// is uncertain.
    ///
    /// # Errors
    /// The uncertain outcome, or the transport failure that ended the wait.
    pub fn close(mut self) -> Result<TerminalExit, Error> {
        self.drain_available();
        self.session.close(Instant::now());
        loop {
            if let Some(outcome) = self.session.outcome() {
                // Let the close handshake finish within the close wait.
                while !self.session.is_transport_finished() && self.transport.is_none() {
                    self.step(None);
                }
                return outcome;
            }
            if let Some(e) = self.transport {
                return Err(e.with_operation(Operation::TerminalClose));
            }
            self.step(None);
        }
    }

    /// Reads what already arrived (and fires due timers) without waiting.
    fn drain_available(&mut self) {
        if self.transport.is_some() || self.session.is_transport_finished() {
            return;
        }
        for _ in 0..DRAIN_TURNS {
            self.conn.refresh_readiness();
            let before = self.conn.received();
            self.step(Some(Instant::now()));
            if self.conn.received() == before || self.transport.is_some() {
                return;
            }
        }
    }

    /// One turn of the loop, bounded by `until`, the session's timers and
    /// the write bound.
    fn step(&mut self, until: Option<Instant>) {
        if self.transport.is_some() {
            return;
        }
        if self.session.is_transport_finished() && !self.conn.has_parked() {
            return;
        }
        let sent = self.conn.sent();
        match self.blocked_since {
            Some(_) if sent != self.sent_at_block || !self.conn.has_parked() => {
                self.blocked_since = None;
            }
            None if self.conn.has_parked() => {
                self.blocked_since = Some(Instant::now());
                self.sent_at_block = sent;
            }
            _ => {}
        }
        let write_limit = self.blocked_since.map(|since| since + self.write_wait);
        let deadline = match (until, write_limit) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if let Err(f) = self.conn.turn(&mut self.session, deadline) {
            self.fail(f.reason());
            return;
        }
        if write_limit.is_some_and(|at| Instant::now() >= at)
            && self.conn.has_parked()
            && self.conn.sent() == self.sent_at_block
        {
            self.fail("write_timeout");
            return;
        }
        if let Err(e) = feed_entropy(&mut self.session) {
            self.transport = Some(e);
        }
    }

    /// After a command: top up randomness and write what the socket takes.
    fn after_command(&mut self) {
        if let Err(e) = feed_entropy(&mut self.session) {
            self.transport = Some(e);
            return;
        }
        if self.conn.flush(&mut self.session).is_err() {
            self.fail(Failure::Write.reason());
        }
    }

    /// The socket failed (or a write stayed blocked too long): the
    /// session sees the end of the stream, and the failure is kept for the
    /// calls that find no outcome.
    fn fail(&mut self, reason: &'static str) {
        self.session.handle_eof(Instant::now());
        self.transport = Some(transport_error(reason));
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        self.session.detach(Instant::now());
        // Best effort, without waiting: the close frame goes out if the
        // socket takes it now.
        let _ = self.conn.flush(&mut self.session);
        self.conn.shutdown();
    }
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
    pub fn terminal(&self, machine: &str, spec: &TerminalSpec) -> Result<Terminal, Error> {
        spec.validate()?;
        let endpoint = self.endpoint();
        let budgets = endpoint.budgets();
        let start = Instant::now();
        let operation_deadline = start + budgets.operation;
        let connect_deadline = (start + budgets.connect).min(operation_deadline);
        let conn = self
            .pool()
            .connect_dedicated(Operation::TerminalOpen, connect_deadline)?;
        let mut config = TerminalConfig::new(endpoint.host_header(), machine);
        config.authorization = endpoint.token().cloned();
        config.max_request_bytes = budgets.max_request_body;
        config.handshake_timeout = budgets
            .operation
            .min(smolbox_core::terminal::MAX_HANDSHAKE_TIMEOUT)
            .min(budgets.connect);
        Terminal::open(conn, spec, config, budgets.connect)
    }
}
