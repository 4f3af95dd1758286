//! [`Terminal`]: an interactive terminal on a worker (features C7.2, C7.3).
//!
//! The core's `TerminalSession` holds the whole protocol: handshake, frames,
//! budgets (the write-stall bound included), the bounded unread-output
//! queue, the read pacing and exit decoding; the shell's one loop
//! ([`Conn::turn`]) drives it. This shell has no background task: the session is driven on the consumer's thread,
//! inside [`Terminal::next`], [`Terminal::input`], [`Terminal::resize`] and
//! [`Terminal::close`].
//!
//! * Every call first reads what already arrived (without waiting), as
//!   far as the session's read pacing allows — as a continuously reading
//!   task would have: pings are answered, and a consumer that stalled
//!   between calls finds the session ended with `output_limit` when more
//!   than the queue's bound piled up — the same outcome as on the tokio
//!   shell.
//! * `next(timeout)` then waits in `mio::Poll::poll` until the socket is
//!   ready or the earlier of the session's next timer and the wait's end.
//! * Writes never block: bytes the socket does not take are parked and go
//!   out on the next call. Parked bytes that make no progress for the write
//!   bound (the session's write-stall timer, min(connect budget, 1 s)) end
//!   the session with `transport` (`write_timeout`).
//! * Dropping the handle detaches the consumer (the session ends with
//!   `terminal_consumer`); the close frame is written if the socket takes
//!   it at once, then the socket is closed. Nothing outlives the handle.

use smolbox_core::Reason;
use std::time::{Duration, Instant};

use bytes::Bytes;
use smolbox_core::terminal::{
    Next, TerminalCall, TerminalConfig, TerminalEvent, TerminalExit, TerminalSession, TerminalSpec,
};
use smolbox_core::{Error, Evidence, Operation, TransportFailure};
use smolbox_store::entropy;

use crate::conn::Conn;

/// Turns of reading per call before the consumer is served, at most
/// (with 8 reads of 16 KiB per turn: 8 MiB, far above any queue bound).
const DRAIN_TURNS: usize = 64;

/// An open interactive terminal (the 101 was read; that does not mean the
/// program runs). One consumer: the methods take `&mut self`.
pub struct Terminal {
    conn: Conn,
    session: TerminalSession,
}

impl std::fmt::Debug for Terminal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Terminal")
            .field("open", &self.session.is_open())
            .field("unread_bytes", &self.session.unread_bytes())
            .finish_non_exhaustive()
    }
}

impl Terminal {
    /// Starts the session on `conn` and returns once the 101 was read (or
    /// the session ended before that, which is an error).
    pub(crate) fn open(
        conn: Conn,
        spec: &TerminalSpec,
        config: TerminalConfig,
    ) -> Result<Self, Error> {
        let session = entropy::terminal_session(spec, config, Instant::now())?;
        let mut terminal = Self { conn, session };
        loop {
            if terminal.session.is_open() {
                return Ok(terminal);
            }
            if let Some(Err(e)) = terminal.session.outcome() {
                return Err(e);
            }
            if terminal.session.is_transport_finished() {
                return Err(Error::transport(
                    Operation::TerminalOpen,
                    Evidence::DispatchUncertain,
                    Reason::ClosedBeforeOpen,
                ));
            }
            terminal.step(None);
        }
    }

    /// The worker's close frame (its code and exact reason), once one was
    /// received; `None` before that or when the connection ended without one.
    pub fn peer_close(&self) -> Option<smolbox_core::ws::CloseInfo> {
        self.session.peer_close()
    }

    /// Sends `bytes` to the PTY (1..=the spec's per-input cap). `Ok` means
    /// handed to the socket (or parked for it), not read by the guest.
    ///
    /// # Errors
    /// The session's errors (size, cumulative cap, ended session) and a
    /// transport failure of the connection.
    pub fn input(&mut self, bytes: &[u8]) -> Result<(), Error> {
        self.drain_available();
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
        let until = self.session.begin_next(Instant::now(), timeout)?;
        self.drain_available();
        loop {
            match self.session.next(Instant::now(), until) {
                Next::Output(bytes) => {
                    return Ok(TerminalEvent::Output(Bytes::copy_from_slice(bytes)));
                }
                Next::Closed(outcome) => return Ok(TerminalEvent::Closed(outcome)),
                Next::TimedOut(e) => return Err(e),
                Next::Pending(at) => self.step(Some(at)),
            }
        }
    }

    /// The consumer is live although it pulls nothing now: a managed
    /// terminal's run holding output for its own live consumer. Reads
    /// nothing; the next call's reads stay paced as for a live consumer
    /// within the grace (`TerminalSession::keep_live`).
    pub(crate) fn keep_live(&mut self) {
        self.session.keep_live(Instant::now());
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
                while !self.session.is_transport_finished() {
                    self.step(None);
                }
                return outcome;
            }
            self.step(None);
        }
    }

    /// Reads what already arrived (and fires due timers) without waiting.
    fn drain_available(&mut self) {
        for _ in 0..DRAIN_TURNS {
            if self.session.is_transport_finished() {
                return;
            }
            self.conn.refresh_readiness();
            let before = (self.conn.received(), self.session.unread_chunks());
            self.step(Some(Instant::now()));
            // Nothing read and nothing queued (a due timer may have moved
            // frames the session held back, after which reading resumes).
            if (self.conn.received(), self.session.unread_chunks()) == before {
                return;
            }
        }
    }

    /// One turn of the shell's loop, bounded by `until` and the session's
    /// timers.
    fn step(&mut self, until: Option<Instant>) {
        if self.session.is_transport_finished() && !self.conn.has_parked() {
            return;
        }
        self.conn.turn(&mut self.session, until);
        self.top_up();
    }

    /// After a command: top up randomness and write what the socket takes.
    fn after_command(&mut self) {
        self.top_up();
        self.conn.flush_or_fail(&mut self.session);
    }

    /// Tops up masking randomness; without any nothing more can be sent.
    fn top_up(&mut self) {
        if entropy::top_up(&mut self.session).is_err() {
            self.session
                .handle_transport_error(Instant::now(), TransportFailure::Write);
        }
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        self.session.detach(Instant::now());
        // Best effort, without waiting: the close frame goes out if the
        // socket takes it now.
        self.conn.flush_or_fail(&mut self.session);
        self.conn.shutdown();
    }
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
    pub fn terminal(&self, machine: &str, spec: &TerminalSpec) -> Result<Terminal, Error> {
        let deadlines = self.deadlines(Instant::now());
        let call = self.terminal_call(machine, spec, deadlines)?;
        let connect_deadline = deadlines.connect_by(Instant::now());
        let conn = self
            .pool()
            .connect_dedicated(Operation::TerminalOpen, connect_deadline)?;
        Terminal::open(conn, call.spec(), call.config(self.endpoint()))
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
    pub fn terminal_preflight(&self, machine: &str, spec: &TerminalSpec) -> Result<(), Error> {
        self.terminal_call(machine, spec, self.deadlines(Instant::now()))
            .map(|_| ())
    }

    /// The checked terminal call: version, gates, image machine.
    fn terminal_call(
        &self,
        machine: &str,
        spec: &TerminalSpec,
        deadlines: smolbox_core::worker::OperationDeadlines,
    ) -> Result<TerminalCall, Error> {
        spec.validate()?;
        let profile = self.preflight(deadlines)?;
        let call = TerminalCall::new(&profile, machine, spec)?;
        self.image_preflight(call.image_check(), deadlines)?;
        Ok(call)
    }
}
