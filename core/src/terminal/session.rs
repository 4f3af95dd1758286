//! The interactive terminal session (features C7.2, C7.3; worker-api.md §8).

use crate::Reason;
use core::fmt;
use core::time::Duration;
use std::time::Instant;

use bytes::Bytes;

use super::exit::{TerminalExit, classify_exit, parse_exit_frame};
use super::queue::{MAX_UNREAD_CHUNKS, OutputQueue, Overflow};
use super::spec::{MIN_IDLE_BUDGET, TerminalSpec};
use crate::error::{Category, Error, Evidence, Operation};
use crate::machine::{Machine, TransportFailure};
use crate::secret::Secret;
use crate::worker::Endpoint;
use crate::ws::{
    CloseCode, CloseInfo, MAX_FRAME_LEN, MAX_WS_TIMER, WsClient, WsConfig, WsEvent, WsTimer,
};

/// Default cap on input + resize bytes per connection: the worker's
/// `max_request_bytes` default, 1 MiB (worker-api.md §12.3).
pub const DEFAULT_MAX_REQUEST_BYTES: u64 = 1_048_576;
/// Longest wait one [`TerminalSession::next`] call may ask for (900 s).
pub const MAX_NEXT_WAIT: Duration = Duration::from_millis(900_000);
/// Longest handshake deadline (features C7.2: min(operation budget, 30 s)).
pub const MAX_HANDSHAKE_TIMEOUT: Duration = Duration::from_millis(30_000);
/// Longest time queued bytes may wait for the socket to take any of them
/// (features C7.2: min(connect budget, 1 s)).
pub const MAX_WRITE_WAIT: Duration = Duration::from_millis(1_000);
/// How long the session keeps reading paused, above half of either unread
/// bound, after the consumer's last pull (the open counts as one): a live
/// consumer gets the chance to pull before the queue fills; a stalled one
/// still overflows it.
///
/// 100 ms: several scheduler periods, so a consumer whose thread was only
/// not scheduled (a loaded host) is not taken for a stalled one, and under
/// half of [`MIN_IDLE_BUDGET`] (the first liveness
/// ping), so a pause never looks like a silent peer. A pause holds at most
/// one read in the receive buffer and reads nothing more, so the grace
/// costs no memory; a stalled consumer meets `output_limit` that much later.
pub const READ_GRACE: Duration = Duration::from_millis(100);
const _: () = assert!(READ_GRACE.as_millis() * 2 < MIN_IDLE_BUDGET.as_millis());

/// What [`TerminalSession::poll_event`] yields and what the shells'
/// `Terminal::next` returns.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TerminalEvent {
    /// Output bytes from the PTY (chunk boundaries are arbitrary).
    Output(Bytes),
    /// The session ended: `Ok` is a confirmed exit code; `Err` an uncertain
    /// outcome (124, 130, a close before the exit, a budget, a limit…).
    Closed(Result<TerminalExit, Error>),
}

impl fmt::Debug for TerminalEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Terminal bytes are never printed.
        match self {
            Self::Output(b) => write!(f, "Output(len {})", b.len()),
            Self::Closed(r) => write!(f, "Closed({r:?})"),
        }
    }
}

/// Where and how to open the terminal's WebSocket.
#[derive(Clone)]
pub struct TerminalConfig {
    /// The `Host` header value.
    pub host: String,
    /// The machine name (one path segment).
    pub machine: String,
    /// Sent as `Authorization: Bearer` when set.
    pub authorization: Option<Secret>,
    /// Cap on cumulative input and resize bytes on this connection: the
    /// worker's max request body.
    pub max_request_bytes: u64,
    /// Deadline for the 101 reply (≤ 30 s; [`Self::for_endpoint`] takes
    /// min(operation budget, 30 s, connect budget)).
    pub handshake_timeout: Duration,
    /// Longest time queued bytes may wait for the socket (≤ 1 s;
    /// [`Self::for_endpoint`] takes min(connect budget, 1 s)); past it the
    /// session ends with `transport` (`write_timeout`).
    pub write_wait: Duration,
}

impl TerminalConfig {
    /// A configuration with the default limits.
    pub fn new(host: impl Into<String>, machine: impl Into<String>) -> Self {
        Self {
            host: host.into(),
            machine: machine.into(),
            authorization: None,
            max_request_bytes: DEFAULT_MAX_REQUEST_BYTES,
            handshake_timeout: MAX_HANDSHAKE_TIMEOUT,
            write_wait: MAX_WRITE_WAIT,
        }
    }

    /// The configuration of a terminal on `machine` at `endpoint`: its Host
    /// header and token, the worker's max request body as the cumulative
    /// input cap, the handshake deadline min(operation budget, 30 s,
    /// connect budget) and the write bound min(connect budget, 1 s).
    pub fn for_endpoint(endpoint: &Endpoint, machine: impl Into<String>) -> Self {
        let budgets = endpoint.budgets();
        let mut config = Self::new(endpoint.host_header(), machine);
        config.authorization = endpoint.token().cloned();
        config.max_request_bytes = budgets.max_request_body;
        config.handshake_timeout = budgets
            .operation
            .min(MAX_HANDSHAKE_TIMEOUT)
            .min(budgets.connect);
        config.write_wait = budgets.connect.min(MAX_WRITE_WAIT);
        config
    }
}

impl fmt::Debug for TerminalConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TerminalConfig")
            .field("host", &self.host)
            .field("machine", &self.machine)
            .field("authorization", &self.authorization)
            .field("max_request_bytes", &self.max_request_bytes)
            .field("handshake_timeout", &self.handshake_timeout)
            .field("write_wait", &self.write_wait)
            .finish()
    }
}

/// Opening a terminal as a checked call: the spec's bounds and the
/// version gate (terminals from 1.17.0), decided before anything is sent,
/// and the image-machine preflight a terminal always needs (C7.4,
/// worker-api.md §8.5): the shell performs [`Self::image_check`]'s inspect
/// inside the open's operation deadline and connects only when it admits.
#[derive(Clone, Debug)]
pub struct TerminalCall {
    machine: String,
    spec: TerminalSpec,
    check: crate::worker::ImageCheck,
}

impl TerminalCall {
    /// A checked terminal call on `machine` against a worker with
    /// `profile`.
    ///
    /// # Errors
    /// `validation` (the spec's bounds, the machine name) or
    /// `unsupported_capability` (a version without terminals), all
    /// `not_dispatched`.
    pub fn new(
        profile: &crate::worker::Profile,
        machine: impl Into<String>,
        spec: &TerminalSpec,
    ) -> Result<Self, Error> {
        spec.validate()?;
        let machine = machine.into();
        spec.upgrade_target(&machine)?;
        profile.require(crate::worker::Feature::Terminals, Operation::TerminalOpen)?;
        let check = crate::worker::ImageCheck::new(profile, &machine, Operation::TerminalOpen)?;
        Ok(Self {
            machine,
            spec: spec.clone(),
            check,
        })
    }

    /// The image-machine preflight to perform before connecting.
    pub fn image_check(&self) -> &crate::worker::ImageCheck {
        &self.check
    }

    /// The spec.
    pub fn spec(&self) -> &TerminalSpec {
        &self.spec
    }

    /// The session configuration at `endpoint` ([`TerminalConfig::for_endpoint`]).
    pub fn config(&self, endpoint: &Endpoint) -> TerminalConfig {
        TerminalConfig::for_endpoint(endpoint, self.machine.clone())
    }
}

/// The timers a [`TerminalSession`] runs, in the order they are checked
/// when several are due at once (features C7.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TerminalTimer {
    /// The 101 reply is due (operation `terminal_open`).
    Handshake,
    /// The peer's close is due (operation `terminal_close`).
    Close,
    /// The session budget ends (operation `terminal_session`).
    Session,
    /// No consumer attached in time (operation `terminal_consumer`).
    Consumer,
    /// No activity for the idle budget (operation `terminal_idle`).
    Idle,
    /// Queued bytes made no progress for the write bound (`transport`,
    /// `write_timeout`).
    WriteStall,
    /// The read pause for a live consumer ends ([`READ_GRACE`]).
    Throttle,
    /// Peer liveness: half the idle budget without a received byte sends a
    /// ping; the whole budget without one ends the session (`transport`,
    /// `idle_timeout`), also while the consumer keeps typing.
    Liveness,
}

/// What [`TerminalSession::next`] found.
pub enum Next<'a> {
    /// The oldest unread output chunk, lent until the next call (chunk
    /// boundaries are arbitrary).
    Output(&'a [u8]),
    /// The session ended: `Ok` is a confirmed exit; `Err` an uncertain
    /// outcome. Returned again on every later call.
    Closed(Result<TerminalExit, Error>),
    /// This wait ended (`expired`, operation `terminal_output`); the session
    /// keeps running.
    TimedOut(Error),
    /// Nothing yet: wait for input or this instant (the earlier of the
    /// caller's wait deadline and the session's next timer), then feed what
    /// happened and call again.
    Pending(Instant),
}

impl fmt::Debug for Next<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Terminal bytes are never printed.
        match self {
            Self::Output(b) => write!(f, "Output(len {})", b.len()),
            Self::Closed(r) => write!(f, "Closed({r:?})"),
            Self::TimedOut(e) => write!(f, "TimedOut({e:?})"),
            Self::Pending(t) => write!(f, "Pending({t:?})"),
        }
    }
}

/// One interactive terminal on a worker, sans-IO: the WebSocket connection
/// plus the session's budgets, the unread-output queue, input caps and exit
/// decoding.
///
/// # Contract
/// * **Inputs** — [`handle_input`](Self::handle_input),
///   [`handle_eof`](Self::handle_eof), [`handle_timeout`](Self::handle_timeout),
///   [`handle_entropy`](Self::handle_entropy) (masking randomness; top up
///   whenever [`entropy_wanted`](Self::entropy_wanted) is non-zero).
/// * **Commands** — [`input`](Self::input), [`resize`](Self::resize),
///   [`close`](Self::close), [`attach`](Self::attach),
///   [`detach`](Self::detach).
/// * **Outputs** — [`poll_transmit`](Self::poll_transmit),
///   [`next`](Self::next) (pull: output, the final outcome, or how long to
///   wait), [`poll_timeout`](Self::poll_timeout).
///
/// Every input processes all frames it completes, so after any input or
/// command the shell drains `poll_transmit`, then `poll_timeout`. A shell's
/// blocking `next(timeout)` is: `let until = session.begin_next(now,
/// timeout)?;` then loop on `session.next(now, until)`, flushing transmits,
/// and on `Pending(at)` wait for readable-or-`at` and feed the result.
/// Once [`is_transport_finished`](Self::is_transport_finished) the socket
/// may be closed.
pub struct TerminalSession {
    ws: WsClient,
    queue: OutputQueue,
    max_input_bytes: usize,
    max_request_bytes: u64,
    idle_budget: Duration,
    close_wait: Duration,
    sent_bytes: u64,
    opened: bool,
    attached: bool,
    user_closed: bool,
    exit_code: Option<i32>,
    outcome: Option<Result<TerminalExit, Error>>,
    session_deadline: Instant,
    attach_deadline: Instant,
    idle_deadline: Instant,
    exit_close_deadline: Option<Instant>,
    last_now: Instant,
    write_wait: Duration,
    /// Bytes handed out by `poll_transmit` the socket has not taken yet.
    unwritten: usize,
    /// The last time the socket took bytes (or, with none pending, the
    /// time bytes were handed out).
    write_progress_at: Instant,
    /// Writing failed; the peer may still send (keep reading).
    write_broken: bool,
    /// The socket is done with (read failure, write stall): nothing more
    /// is read or written.
    abandoned: bool,
    /// A transport failure the commands report.
    transport_error: Option<Error>,
    /// The last time the consumer pulled; the open (the 101) counts as
    /// the first pull.
    last_pull: Option<Instant>,
    /// The deadline of the consumer's `next` that is waiting (it returned
    /// `Pending` and no pull ended it yet): the consumer counts as pulling
    /// at every instant up to it.
    pull_waiting_until: Option<Instant>,
    /// Complete frames wait in the WebSocket's receive buffer because the
    /// unread queue is above half for a live consumer; they move on at the
    /// next pull (or once the consumer counts as stalled).
    held: bool,
    /// `poll_event` reported the outcome.
    outcome_reported: bool,
    /// The peer ended the byte stream.
    eof: bool,
    /// The worker's close frame (code and reason), once received.
    peer_close: Option<CloseInfo>,
}

impl TerminalSession {
    /// Validates `spec` and `config` and starts the upgrade: the request is
    /// queued for `poll_transmit`; the session, attach and idle budgets and
    /// the handshake timer start at `now`. `key` is 16 random bytes for
    /// `Sec-WebSocket-Key`.
    ///
    /// # Errors
    /// `validation` (evidence `not_dispatched`) for a bad spec, machine
    /// name, host, token, request cap or handshake timeout.
    pub fn new(
        spec: &TerminalSpec,
        config: TerminalConfig,
        key: [u8; 16],
        now: Instant,
    ) -> Result<Self, Error> {
        let target = spec.upgrade_target(&config.machine)?;
        if config.max_request_bytes == 0 {
            return Err(Error::validation(
                Operation::TerminalSpec,
                Reason::MaxRequestBytesZero,
            ));
        }
        if config.handshake_timeout.is_zero() || config.handshake_timeout > MAX_HANDSHAKE_TIMEOUT {
            return Err(Error::validation(
                Operation::TerminalSpec,
                Reason::HandshakeTimeoutOutOfRange,
            ));
        }
        if config.write_wait.is_zero() || config.write_wait > MAX_WRITE_WAIT {
            return Err(Error::validation(
                Operation::TerminalSpec,
                Reason::WriteWaitOutOfRange,
            ));
        }
        let mut ws_config = WsConfig::new(config.host, target);
        ws_config.authorization = config.authorization;
        ws_config.operation = Operation::TerminalOpen;
        ws_config.max_frame_len = spec.max_buffer_bytes.min(MAX_FRAME_LEN);
        ws_config.max_message_len = spec.max_buffer_bytes;
        ws_config.handshake_timeout = config.handshake_timeout;
        ws_config.close_wait = spec.close_wait;
        // A silent peer ends the session within the idle budget even while
        // the consumer types (the write bound is the session's own).
        ws_config.idle_timeout = Some(spec.idle_budget.min(MAX_WS_TIMER));
        let ws = WsClient::new(ws_config, key, now)
            .map_err(|e| e.with_operation(Operation::TerminalSpec))?;
        Ok(Self {
            ws,
            queue: OutputQueue::new(spec.max_buffer_bytes),
            max_input_bytes: spec.max_input_bytes,
            max_request_bytes: config.max_request_bytes,
            idle_budget: spec.idle_budget,
            close_wait: spec.close_wait,
            sent_bytes: 0,
            opened: false,
            attached: false,
            user_closed: false,
            exit_code: None,
            outcome: None,
            session_deadline: now + spec.session_budget,
            attach_deadline: now + spec.attach_wait,
            idle_deadline: now + spec.idle_budget,
            exit_close_deadline: None,
            last_now: now,
            write_wait: config.write_wait,
            unwritten: 0,
            write_progress_at: now,
            write_broken: false,
            abandoned: false,
            transport_error: None,
            last_pull: None,
            pull_waiting_until: None,
            held: false,
            outcome_reported: false,
            eof: false,
            peer_close: None,
        })
    }

    // ---- inputs -------------------------------------------------------

    /// Feeds bytes read from the socket (≤ 64 KiB per call) and processes
    /// every frame they complete.
    ///
    /// # Errors
    /// `validation` only for a chunk over 64 KiB (nothing consumed). Peer
    /// misbehaviour is not an error here: it decides the outcome, which
    /// [`next`](Self::next) reports.
    pub fn handle_input(&mut self, now: Instant, bytes: &[u8]) -> Result<(), Error> {
        let now = self.touch(now);
        if let Err(e) = self.ws.handle_input(now, bytes)
            && e.category() == Category::Validation
        {
            return Err(e.with_operation(Operation::TerminalOutput));
        }
        self.pump(now);
        Ok(())
    }

    /// Room to read socket bytes into directly; see
    /// [`WsClient::input_buffer`].
    pub fn input_buffer(&mut self) -> &mut [u8] {
        self.ws.input_buffer()
    }

    /// `n` bytes were read into the last [`input_buffer`](Self::input_buffer);
    /// every frame they complete is processed.
    ///
    /// # Errors
    /// `validation` when `n` is larger than the slice handed out.
    pub fn handle_read(&mut self, now: Instant, n: usize) -> Result<(), Error> {
        let now = self.touch(now);
        if let Err(e) = self.ws.handle_read(now, n)
            && e.category() == Category::Validation
        {
            return Err(e.with_operation(Operation::TerminalOutput));
        }
        self.pump(now);
        Ok(())
    }

    /// The peer ended the byte stream: without a close frame this is an
    /// abnormal close (uncertain outcome).
    pub fn handle_eof(&mut self, now: Instant) {
        let now = self.touch(now);
        self.eof = true;
        self.ws.handle_eof(now);
        self.pump(now);
    }

    /// Acts on timers due at `now`, in the order close wait, session budget,
    /// attach wait, idle budget; early or repeated calls do nothing.
    pub fn handle_timeout(&mut self, now: Instant) {
        let now = self.touch(now);
        if self.is_write_stalled(now) {
            let e = Error::transport(
                Operation::TerminalOutput,
                Evidence::Unknown,
                Reason::WriteTimeout,
            );
            self.abandon(e);
            return;
        }
        // The session's own budgets win a tie with peer liveness (a silent
        // peer and a quiet consumer end with `idle_budget`, as before).
        if matches!(
            self.ws.poll_timeout(),
            Some((t, WsTimer::Keepalive | WsTimer::Idle)) if t <= now
        ) {
            self.own_timers(now);
        }
        self.ws.handle_timeout(now);
        self.pump(now);
        self.own_timers(now);
        self.pump(now);
    }

    /// The close wait after the exit, then the session, attach and idle
    /// budgets (first decision wins).
    fn own_timers(&mut self, now: Instant) {
        if self.exit_close_deadline.is_some_and(|t| t <= now) {
            let e = self.expired(Operation::TerminalClose, Reason::CloseWaitExpired);
            self.finish(now, Err(e), CloseCode::GOING_AWAY);
        } else if self.outcome.is_none() {
            if self.session_deadline <= now {
                let e = self.expired(Operation::TerminalSession, Reason::SessionBudget);
                self.finish(now, Err(e), CloseCode::GOING_AWAY);
            } else if !self.attached && self.attach_deadline <= now {
                let e = self.expired(Operation::TerminalConsumer, Reason::AttachWait);
                self.finish(now, Err(e), CloseCode::GOING_AWAY);
            } else if self.idle_deadline <= now {
                let e = self.expired(Operation::TerminalIdle, Reason::IdleBudget);
                self.finish(now, Err(e), CloseCode::GOING_AWAY);
            }
        }
    }

    /// The socket took `n` more of the bytes `poll_transmit` handed out
    /// (this feeds the write-stall bound).
    pub fn handle_written(&mut self, now: Instant, n: usize) {
        let now = self.touch(now);
        if n > 0 {
            self.unwritten = self.unwritten.saturating_sub(n);
            self.write_progress_at = now;
        }
    }

    /// The socket failed. A read failure (or a write failure after the
    /// peer closed) ends the connection: without a decided outcome the
    /// session ends with `transport` (`read_failed` / `write_failed`,
    /// evidence `unknown`). A write failure while the peer may still send
    /// (its exit frame, its close) stops writing only.
    pub fn handle_transport_error(&mut self, now: Instant, failure: TransportFailure) {
        let now = self.touch(now);
        let e = Error::transport(
            Operation::TerminalOutput,
            Evidence::Unknown,
            failure.reason(),
        );
        if failure == TransportFailure::Write && !self.eof {
            self.write_broken = true;
            self.unwritten = 0;
            self.transport_error.get_or_insert(e);
            let pending = self.ws.pending_transmit();
            self.ws.consume_transmit(pending);
            return;
        }
        self.eof = true;
        self.ws.handle_eof(now);
        self.pump(now);
        self.abandon(e);
    }

    /// Adds random bytes for masking keys.
    pub fn handle_entropy(&mut self, random: &[u8]) {
        self.ws.handle_entropy(random);
    }

    /// Random bytes wanted now (0 while the pool is at least half full).
    pub fn entropy_wanted(&self) -> usize {
        self.ws.entropy_wanted()
    }

    // ---- commands -----------------------------------------------------

    /// Sends `bytes` to the PTY as one binary frame. `Ok` means queued for
    /// the socket, not read by the guest.
    ///
    /// # Errors
    /// `validation` for 0 or more than `max_input_bytes` bytes, before the
    /// upgrade, after the session ended, or without masking randomness
    /// (nothing sent). `output_limit` (evidence `unknown`) when cumulative
    /// input and resize bytes would pass the worker's max request body: the
    /// session then ends with that error.
    pub fn input(&mut self, now: Instant, bytes: &[u8]) -> Result<(), Error> {
        let now = self.touch(now);
        let op = Operation::TerminalInput;
        self.check_can_send(op)?;
        if bytes.is_empty() || bytes.len() > self.max_input_bytes {
            return Err(Error::validation(op, Reason::InputSize)
                .with_limit(bytes.len() as u64, self.max_input_bytes as u64));
        }
        self.charge(now, op, bytes.len())?;
        self.ws
            .send_binary(now, bytes)
            .map_err(|e| e.with_operation(op))?;
        self.commit_send(now, bytes.len());
        Ok(())
    }

    /// Sends the window size as `{"type":"resize","cols":C,"rows":R}`.
    ///
    /// # Errors
    /// `validation` for 0 columns or rows, and as [`input`](Self::input)
    /// (the text counts towards the cumulative cap).
    pub fn resize(&mut self, now: Instant, cols: u16, rows: u16) -> Result<(), Error> {
        let now = self.touch(now);
        let op = Operation::TerminalResize;
        if cols == 0 || rows == 0 {
            return Err(Error::validation(op, Reason::SizeOutOfRange));
        }
        self.check_can_send(op)?;
        let text = format!("{{\"type\":\"resize\",\"cols\":{cols},\"rows\":{rows}}}");
        self.charge(now, op, text.len())?;
        self.ws
            .send_text(now, &text)
            .map_err(|e| e.with_operation(op))?;
        self.commit_send(now, text.len());
        Ok(())
    }

    /// Closes the session: sends a close frame (1000) and waits the close
    /// wait for the worker's. Without an exit frame the outcome is
    /// uncertain. Does nothing once the session ended.
    pub fn close(&mut self, now: Instant) {
        let now = self.touch(now);
        if self.outcome.is_none() && !self.ws.is_close_sent() {
            self.user_closed = true;
            // NORMAL is always sendable.
            let _ = self.ws.close(now, CloseCode::NORMAL);
            self.pump(now);
        }
    }

    /// Marks the consumer as attached (also done by [`next`](Self::next)).
    pub fn attach(&mut self, now: Instant) {
        self.touch(now);
        self.attached = true;
    }

    /// The owner or consumer is gone: the session ends with
    /// `terminal_consumer` and an uncertain outcome.
    pub fn detach(&mut self, now: Instant) {
        let now = self.touch(now);
        if self.outcome.is_none() {
            let e = Error::unknown(
                Operation::TerminalConsumer,
                self.evidence(),
                Reason::ConsumerLost,
            );
            self.finish(now, Err(e), CloseCode::GOING_AWAY);
            self.pump(now);
        }
    }

    // ---- outputs ------------------------------------------------------

    /// The deadline for a `next(timeout)` that starts at `now`.
    ///
    /// # Errors
    /// `validation` (operation `terminal_output`) for a timeout over 900 s.
    pub fn wait_deadline(&self, now: Instant, timeout: Duration) -> Result<Instant, Error> {
        if timeout > MAX_NEXT_WAIT {
            return Err(Error::validation(
                Operation::TerminalOutput,
                Reason::WaitOutOfRange,
            ));
        }
        Ok(now + timeout)
    }

    /// Starts a consumer's `next(timeout)` at `now`: returns the wait's
    /// deadline (as [`wait_deadline`](Self::wait_deadline)) and, when the
    /// consumer is live (it pulled within [`READ_GRACE`]), counts it as
    /// pulling up to that deadline, so the shell's own work in this call
    /// (reading what already arrived) never makes it look stalled. A
    /// consumer that had been silent for longer stays stalled for those
    /// reads: they queue what a continuously reading shell would have
    /// queued while it was away. Shells call this first in `next`.
    ///
    /// # Errors
    /// As [`wait_deadline`](Self::wait_deadline).
    pub fn begin_next(&mut self, now: Instant, timeout: Duration) -> Result<Instant, Error> {
        let until = self.wait_deadline(now, timeout)?;
        let now = self.touch(now);
        if self.live_until().is_some_and(|live| now < live) {
            self.pull_waiting_until = Some(until);
        }
        Ok(until)
    }

    /// Pulls the next thing for the consumer (and marks it attached):
    /// unread output first, then the final outcome; otherwise `TimedOut`
    /// once `now ≥ wait_until`, else `Pending` with the instant to wake.
    pub fn next(&mut self, now: Instant, wait_until: Instant) -> Next<'_> {
        let now = self.touch(now);
        self.attached = true;
        self.last_pull = Some(now);
        self.pull_waiting_until = None;
        if self.held {
            self.pump(now);
        }
        if self.queue.chunks() > 0 {
            return self.queue.pop().map_or(Next::Pending(now), Next::Output);
        }
        if let Some(outcome) = self.outcome {
            return Next::Closed(outcome);
        }
        if now >= wait_until {
            let e = Error::expired(
                Operation::TerminalOutput,
                self.evidence(),
                Reason::WaitTimeout,
            );
            return Next::TimedOut(e);
        }
        // The consumer waits in this call: it is live until the wait ends.
        self.pull_waiting_until = Some(wait_until);
        let wake = self
            .poll_timeout()
            .map_or(wait_until, |(t, _)| t.min(wait_until));
        Next::Pending(wake)
    }

    /// The consumer is live at `now` although it takes nothing: a managed
    /// terminal's run calls this while it holds output back for its own
    /// live consumer (`managed::live::Pace::Hold`), so this session keeps
    /// pausing its reads too (frames wait in the socket) instead of taking
    /// the run for a stalled consumer. Counts as a pull for the grace.
    pub fn keep_live(&mut self, now: Instant) {
        let now = self.touch(now);
        self.last_pull = Some(now);
    }

    /// The next event for a consumer (and marks it attached): the oldest
    /// unread output chunk, then the outcome once (the last event).
    #[must_use]
    pub fn poll_event(&mut self) -> Option<TerminalEvent> {
        self.attached = true;
        self.last_pull = Some(self.last_now);
        self.pull_waiting_until = None;
        if self.held {
            self.pump(self.last_now);
        }
        if let Some(chunk) = self.queue.pop() {
            return Some(TerminalEvent::Output(Bytes::copy_from_slice(chunk)));
        }
        if self.outcome_reported {
            return None;
        }
        let outcome = self.outcome?;
        self.outcome_reported = true;
        Some(TerminalEvent::Closed(outcome))
    }

    /// Appends queued bytes to `out`; see [`WsClient::poll_transmit`].
    /// After a write failure queued bytes are dropped instead.
    #[must_use]
    pub fn poll_transmit(&mut self, out: &mut Vec<u8>) -> Option<usize> {
        if self.write_broken || self.abandoned {
            let pending = self.ws.pending_transmit();
            self.ws.consume_transmit(pending);
            return None;
        }
        let n = self.ws.poll_transmit(out)?;
        if self.unwritten == 0 {
            self.write_progress_at = self.last_now;
        }
        self.unwritten += n;
        Some(n)
    }

    /// Queued bytes to write straight from the session's buffer; see
    /// [`WsClient::transmit_data`].
    pub fn transmit_data(&self) -> &[u8] {
        self.ws.transmit_data()
    }

    /// `n` bytes of [`transmit_data`](Self::transmit_data) were written.
    pub fn consume_transmit(&mut self, n: usize) {
        self.ws.consume_transmit(n);
    }

    /// False while reading should pause: the transport is finished, or the
    /// unread output is above half of either bound and the consumer pulled
    /// within [`READ_GRACE`] (it is live and gets the chance to pull
    /// first). The open counts as a pull, and a consumer waiting in
    /// [`next`](Self::next) pulls at every instant up to its wait's end. A
    /// consumer that did not pull for longer counts as stalled and reading
    /// goes on, so the queue bound decides.
    pub fn wants_read(&self) -> bool {
        !self.is_transport_finished() && self.throttle_until().is_none()
    }

    /// While reading pauses: until the consumer's grace ends. With frames
    /// held back it stays set (possibly in the past, so the shell fires the
    /// timer and the held frames move on).
    fn throttle_until(&self) -> Option<Instant> {
        if self.outcome.is_some() {
            return None;
        }
        let until = self.live_until()?;
        (self.held || (self.above_half() && self.last_now < until)).then_some(until)
    }

    /// The end of the consumer's grace: [`READ_GRACE`] after its last pull
    /// (the open counts as one; a waiting `next` pulls up to its deadline).
    fn live_until(&self) -> Option<Instant> {
        let mut pulled = self.last_pull?;
        if let Some(wait) = self.pull_waiting_until {
            pulled = pulled.max(wait.min(self.last_now));
        }
        Some(pulled + READ_GRACE)
    }

    /// Unread output above half of either bound.
    fn above_half(&self) -> bool {
        above_half(&self.queue)
    }

    fn is_write_stalled(&self, now: Instant) -> bool {
        self.unwritten > 0 && !self.abandoned && self.write_progress_at + self.write_wait <= now
    }

    /// The socket is done with: the outcome (if none yet) is `e`.
    fn abandon(&mut self, e: Error) {
        self.abandoned = true;
        self.unwritten = 0;
        if self.outcome.is_none() {
            self.outcome = Some(Err(e));
        }
        self.transport_error.get_or_insert(e);
        self.exit_close_deadline = None;
        let pending = self.ws.pending_transmit();
        self.ws.consume_transmit(pending);
    }

    /// The next deadline and its timer; ties go to the earlier timer in
    /// [`TerminalTimer`] order.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<(Instant, TerminalTimer)> {
        if self.abandoned {
            return None;
        }
        let ws = self.ws.poll_timeout().map(|(t, w)| {
            let timer = match w {
                WsTimer::Handshake => TerminalTimer::Handshake,
                WsTimer::CloseWait => TerminalTimer::Close,
                WsTimer::WriteStall => TerminalTimer::WriteStall,
                _ => TerminalTimer::Liveness,
            };
            (t, timer)
        });
        let live = self.outcome.is_none();
        // Peer liveness loses ties with the session's own budgets.
        let (ws, liveness) = match ws {
            Some((_, TerminalTimer::Liveness)) => (None, ws),
            other => (other, None),
        };
        let candidates = [
            ws,
            self.exit_close_deadline.map(|t| (t, TerminalTimer::Close)),
            live.then_some((self.session_deadline, TerminalTimer::Session)),
            (live && !self.attached).then_some((self.attach_deadline, TerminalTimer::Consumer)),
            live.then_some((self.idle_deadline, TerminalTimer::Idle)),
            liveness,
            (self.unwritten > 0).then_some((
                self.write_progress_at + self.write_wait,
                TerminalTimer::WriteStall,
            )),
            self.throttle_until().map(|t| (t, TerminalTimer::Throttle)),
        ];
        let mut best: Option<(Instant, TerminalTimer)> = None;
        for c in candidates.into_iter().flatten() {
            if best.is_none_or(|b| c.0 < b.0) {
                best = Some(c);
            }
        }
        best
    }

    // ---- getters ------------------------------------------------------

    /// True once the 101 reply was accepted.
    pub fn is_open(&self) -> bool {
        self.opened
    }

    /// The outcome, once decided (unread output may still be queued).
    pub fn outcome(&self) -> Option<Result<TerminalExit, Error>> {
        self.outcome
    }

    /// True when the connection is over and nothing is left to send: the
    /// shell may close the socket.
    pub fn is_transport_finished(&self) -> bool {
        self.abandoned || self.ws.is_finished() || (self.write_broken && self.ws.is_ended())
    }

    /// The worker's close frame (code and exact reason), once one was
    /// received; `None` when the connection ended without one.
    pub fn peer_close(&self) -> Option<CloseInfo> {
        self.peer_close
    }

    /// Unread output bytes.
    pub fn unread_bytes(&self) -> usize {
        self.queue.bytes()
    }

    /// Unread output chunks.
    pub fn unread_chunks(&self) -> usize {
        self.queue.chunks()
    }

    /// Input and resize bytes sent on this connection.
    pub fn sent_bytes(&self) -> u64 {
        self.sent_bytes
    }

    // ---- internals ----------------------------------------------------

    fn touch(&mut self, now: Instant) -> Instant {
        self.last_now = self.last_now.max(now);
        self.last_now
    }

    fn evidence(&self) -> Evidence {
        if self.opened {
            Evidence::Unknown
        } else if self.ws.has_transmitted() {
            Evidence::DispatchUncertain
        } else {
            Evidence::NotDispatched
        }
    }

    fn expired(&self, op: Operation, reason: Reason) -> Error {
        Error::expired(op, self.evidence(), reason)
    }

    fn check_can_send(&self, op: Operation) -> Result<(), Error> {
        if let Some(e) = self.transport_error {
            return Err(e.with_operation(op));
        }
        if self.outcome.is_some() || self.ws.is_close_sent() {
            return Err(Error::validation(op, Reason::SessionClosed));
        }
        if !self.opened {
            return Err(Error::validation(op, Reason::NotOpen));
        }
        Ok(())
    }

    /// Checks the cumulative cap; past it the session ends.
    fn charge(&mut self, now: Instant, op: Operation, len: usize) -> Result<(), Error> {
        let total = self.sent_bytes + len as u64;
        if total > self.max_request_bytes {
            let e = Error::output_limit(op, Evidence::Unknown, Reason::CumulativeInput)
                .with_limit(total, self.max_request_bytes);
            self.finish(now, Err(e), CloseCode::POLICY_VIOLATION);
            self.pump(now);
            return Err(e);
        }
        Ok(())
    }

    fn commit_send(&mut self, now: Instant, len: usize) {
        self.sent_bytes += len as u64;
        self.idle_deadline = now + self.idle_budget;
    }

    /// Decides the outcome (first decision wins) and starts closing. Our
    /// close frame carries the outcome's fixed reason code (never terminal
    /// bytes; every reason code is far below 123 bytes).
    fn finish(&mut self, now: Instant, outcome: Result<TerminalExit, Error>, code: CloseCode) {
        if self.outcome.is_none() {
            self.outcome = Some(outcome);
        }
        self.exit_close_deadline = None;
        if !self.ws.is_close_sent() && !self.ws.is_ended() {
            let reason = match outcome {
                Err(e) => e.reason(),
                Ok(_) => Reason::Unspecified,
            };
            // `code` is one of the sendable constants; a reason code that
            // were too long would be refused, so fall back to none.
            if self
                .ws
                .close_with_reason(now, code, reason.as_str())
                .is_err()
            {
                let _ = self.ws.close(now, code);
            }
        }
    }

    /// Processes every pending WebSocket event, except that while the
    /// consumer is live (pulled within the grace) processing stops once the
    /// unread output is above half of either bound: the rest waits in the
    /// receive buffer (at most one read) for the next pull, so a consumer
    /// that keeps pulling never finds the queue overflowed by a read larger
    /// than the room left.
    fn pump(&mut self, now: Instant) {
        self.held = false;
        loop {
            // A consumer that closed wants the outcome, not more output.
            // (Checked every turn: the open, a pull, starts the grace.)
            let live = !self.user_closed && self.live_until().is_some_and(|until| now < until);
            if live && self.outcome.is_none() && self.above_half() {
                self.held = self.ws.unprocessed_input() > 0;
                break;
            }
            // Output frames first, in one batch (the same frames and checks
            // as `poll_event`'s binary fast path); everything else below.
            if self.outcome.is_none() && self.exit_code.is_none() {
                let queue = &mut self.queue;
                let mut active = false;
                let mut overflow = None;
                let mut paused = false;
                self.ws.poll_binary_frames(|bytes| {
                    // Only non-empty output is activity (as below).
                    if bytes.is_empty() {
                        return true;
                    }
                    active = true;
                    match queue.push(bytes) {
                        Ok(()) if live && above_half(queue) => {
                            paused = true;
                            false
                        }
                        Ok(()) => true,
                        Err(o) => {
                            overflow = Some(o);
                            false
                        }
                    }
                });
                if active {
                    self.idle_deadline = now + self.idle_budget;
                }
                if let Some(o) = overflow {
                    let e = self.overflow(o);
                    self.finish(now, Err(e), CloseCode::POLICY_VIOLATION);
                }
                if paused {
                    continue;
                }
            }
            let Some(ev) = self.ws.poll_event() else {
                break;
            };
            match ev {
                WsEvent::Open => {
                    self.opened = true;
                    // The consumer gets the grace from the open to make its
                    // first pull: a peer that floods from its first byte
                    // does not find a consumer that has not pulled yet
                    // already stalled.
                    self.last_pull.get_or_insert(now);
                }
                WsEvent::Binary(bytes) => {
                    if self.outcome.is_some() {
                        continue;
                    }
                    if self.exit_code.is_some() {
                        let e = self.protocol(Reason::OutputAfterExit);
                        self.finish(now, Err(e), CloseCode::PROTOCOL_ERROR);
                        continue;
                    }
                    // Only non-empty output is activity: empty frames cannot
                    // keep an idle session alive.
                    if bytes.is_empty() {
                        continue;
                    }
                    self.idle_deadline = now + self.idle_budget;
                    let pushed = self.queue.push(bytes);
                    if let Err(overflow) = pushed {
                        let e = self.overflow(overflow);
                        self.finish(now, Err(e), CloseCode::POLICY_VIOLATION);
                    }
                }
                WsEvent::Text(text) => {
                    if self.outcome.is_some() {
                        continue;
                    }
                    let parsed = if self.exit_code.is_some() {
                        Err(self.protocol(Reason::TextAfterExit))
                    } else {
                        parse_exit_frame(text)
                    };
                    match parsed {
                        Ok(code) => {
                            self.exit_code = Some(code);
                            self.exit_close_deadline = Some(now + self.close_wait);
                        }
                        Err(e) => self.finish(now, Err(e), CloseCode::PROTOCOL_ERROR),
                    }
                }
                WsEvent::Ping(_) | WsEvent::Pong(_) => {}
                WsEvent::Closed(info) => {
                    self.peer_close = Some(info);
                    let outcome = match self.exit_code {
                        Some(code) => classify_exit(code),
                        None if self.user_closed => Err(Error::unknown(
                            Operation::TerminalClose,
                            Evidence::Unknown,
                            Reason::ClosedByClient,
                        )),
                        None => Err(Error::unknown(
                            Operation::TerminalOutput,
                            Evidence::Unknown,
                            Reason::ClosedWithoutExit,
                        )),
                    };
                    let outcome = match (outcome, info.code) {
                        (Err(e), Some(code)) => Err(e.with_close_code(code.as_u16())),
                        (other, _) => other,
                    };
                    self.finish(now, outcome, CloseCode::NORMAL);
                }
                WsEvent::Failed(e) => {
                    let e = self.remap(e);
                    self.finish(now, Err(e), CloseCode::PROTOCOL_ERROR);
                }
            }
        }
    }

    fn protocol(&self, reason: Reason) -> Error {
        Error::protocol(Operation::TerminalOutput, reason).with_evidence(Evidence::Unknown)
    }

    fn overflow(&self, overflow: Overflow) -> Error {
        let (reason, actual, max) = match overflow {
            Overflow::Bytes(total) => (Reason::UnreadOutputBytes, total, self.queue_max_bytes()),
            Overflow::Chunks => (
                Reason::UnreadOutputChunks,
                MAX_UNREAD_CHUNKS as u64 + 1,
                MAX_UNREAD_CHUNKS as u64,
            ),
        };
        Error::output_limit(Operation::TerminalOutput, Evidence::Unknown, reason)
            .with_limit(actual, max)
    }

    fn queue_max_bytes(&self) -> u64 {
        self.queue.max_bytes() as u64
    }

    /// Attributes a connection error: before the upgrade it stays with
    /// `terminal_open`; after it the outcome is unknown.
    fn remap(&self, e: Error) -> Error {
        if !self.opened {
            return e;
        }
        let e = e.with_evidence(Evidence::Unknown);
        if e.reason() == Reason::CloseWaitExpired {
            Error::expired(
                Operation::TerminalClose,
                Evidence::Unknown,
                Reason::CloseWaitExpired,
            )
        } else {
            e.with_operation(Operation::TerminalOutput)
        }
    }
}

/// Unread output above half of either bound of `queue`.
fn above_half(queue: &OutputQueue) -> bool {
    queue.bytes() * 2 > queue.max_bytes() || queue.chunks() * 2 > MAX_UNREAD_CHUNKS
}

impl Machine for TerminalSession {
    type Event<'a> = TerminalEvent;
    type Timer = TerminalTimer;

    /// As [`TerminalSession::handle_input`], in chunks of at most 64 KiB.
    fn handle_input(&mut self, now: Instant, bytes: &[u8]) {
        for chunk in bytes.chunks(crate::ws::MAX_INPUT_CHUNK) {
            // The only error is a chunk over the cap, which cannot happen.
            let _ = Self::handle_input(self, now, chunk);
        }
    }

    fn handle_eof(&mut self, now: Instant) {
        Self::handle_eof(self, now);
    }

    fn handle_timeout(&mut self, now: Instant) {
        Self::handle_timeout(self, now);
    }

    fn handle_written(&mut self, now: Instant, n: usize) {
        Self::handle_written(self, now, n);
    }

    fn handle_transport_error(&mut self, now: Instant, failure: TransportFailure) {
        Self::handle_transport_error(self, now, failure);
    }

    fn poll_transmit(&mut self, out: &mut Vec<u8>) -> bool {
        Self::poll_transmit(self, out).is_some()
    }

    fn poll_timeout(&self) -> Option<(Instant, TerminalTimer)> {
        Self::poll_timeout(self)
    }

    fn poll_event(&mut self) -> Option<TerminalEvent> {
        Self::poll_event(self)
    }

    fn is_finished(&self) -> bool {
        self.is_transport_finished()
    }

    fn wants_read(&self) -> bool {
        Self::wants_read(self)
    }
}

impl fmt::Debug for TerminalSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Counts and states only: never terminal bytes (AC-7.3.3).
        f.debug_struct("TerminalSession")
            .field("opened", &self.opened)
            .field("attached", &self.attached)
            .field("unread_bytes", &self.queue.bytes())
            .field("unread_chunks", &self.queue.chunks())
            .field("sent_bytes", &self.sent_bytes)
            .field("exit_seen", &self.exit_code.is_some())
            .field("outcome", &self.outcome)
            .finish_non_exhaustive()
    }
}
