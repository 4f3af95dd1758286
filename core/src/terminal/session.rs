//! The interactive terminal session (features C7.2, C7.3; worker-api.md §8).

use core::fmt;
use core::time::Duration;
use std::time::Instant;

use super::exit::{TerminalExit, classify_exit, parse_exit_frame};
use super::queue::{OutputQueue, Overflow};
use super::spec::TerminalSpec;
use crate::error::{Category, Error, Evidence, Operation};
use crate::secret::Secret;
use crate::ws::{CloseCode, MAX_FRAME_LEN, WsClient, WsConfig, WsEvent, WsTimer};

/// Default cap on input + resize bytes per connection: the worker's
/// `max_request_bytes` default, 1 MiB (worker-api.md §12.3).
pub const DEFAULT_MAX_REQUEST_BYTES: u64 = 1_048_576;
/// Longest wait one [`TerminalSession::next`] call may ask for (900 s).
pub const MAX_NEXT_WAIT: Duration = Duration::from_millis(900_000);
/// Longest handshake deadline (features C7.2: min(operation budget, 30 s)).
pub const MAX_HANDSHAKE_TIMEOUT: Duration = Duration::from_millis(30_000);

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
    /// Deadline for the 101 reply (≤ 30 s; the shell passes
    /// min(operation budget, 30 s, connect budget)).
    pub handshake_timeout: Duration,
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
        }
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
            .finish()
    }
}

/// The timers a [`TerminalSession`] runs, in the order they are checked
/// when several are due at once (features C7.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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
/// blocking `next(timeout)` is: `let until = session.wait_deadline(now,
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
                "max_request_bytes_zero",
            ));
        }
        if config.handshake_timeout.is_zero() || config.handshake_timeout > MAX_HANDSHAKE_TIMEOUT {
            return Err(Error::validation(
                Operation::TerminalSpec,
                "handshake_timeout_out_of_range",
            ));
        }
        let mut ws_config = WsConfig::new(config.host, target);
        ws_config.authorization = config.authorization;
        ws_config.operation = Operation::TerminalOpen;
        ws_config.max_frame_len = spec.max_buffer_bytes.min(MAX_FRAME_LEN);
        ws_config.max_message_len = spec.max_buffer_bytes;
        ws_config.handshake_timeout = config.handshake_timeout;
        ws_config.close_wait = spec.close_wait;
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
        self.ws.handle_eof(now);
        self.pump(now);
    }

    /// Acts on timers due at `now`, in the order close wait, session budget,
    /// attach wait, idle budget; early or repeated calls do nothing.
    pub fn handle_timeout(&mut self, now: Instant) {
        let now = self.touch(now);
        self.ws.handle_timeout(now);
        self.pump(now);
        if self.exit_close_deadline.is_some_and(|t| t <= now) {
            let e = self.expired(Operation::TerminalClose, "close_wait_expired");
            self.finish(now, Err(e), CloseCode::GOING_AWAY);
        } else if self.outcome.is_none() {
            if self.session_deadline <= now {
                let e = self.expired(Operation::TerminalSession, "session_budget");
                self.finish(now, Err(e), CloseCode::GOING_AWAY);
            } else if !self.attached && self.attach_deadline <= now {
                let e = self.expired(Operation::TerminalConsumer, "attach_wait");
                self.finish(now, Err(e), CloseCode::GOING_AWAY);
            } else if self.idle_deadline <= now {
                let e = self.expired(Operation::TerminalIdle, "idle_budget");
                self.finish(now, Err(e), CloseCode::GOING_AWAY);
            }
        }
        self.pump(now);
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
            return Err(Error::validation(op, "input_size")
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
            return Err(Error::validation(op, "size_out_of_range"));
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
            let e = Error::new(
                Category::Unknown,
                Operation::TerminalConsumer,
                self.evidence(),
            )
            .with_reason("consumer_lost");
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
                "wait_out_of_range",
            ));
        }
        Ok(now + timeout)
    }

    /// Pulls the next thing for the consumer (and marks it attached):
    /// unread output first, then the final outcome; otherwise `TimedOut`
    /// once `now ≥ wait_until`, else `Pending` with the instant to wake.
    pub fn next(&mut self, now: Instant, wait_until: Instant) -> Next<'_> {
        let now = self.touch(now);
        self.attached = true;
        if self.queue.chunks() > 0 {
            return self.queue.pop().map_or(Next::Pending(now), Next::Output);
        }
        if let Some(outcome) = self.outcome {
            return Next::Closed(outcome);
        }
        if now >= wait_until {
            let e = Error::new(
                Category::Expired,
                Operation::TerminalOutput,
                self.evidence(),
            )
            .with_reason("wait_timeout");
            return Next::TimedOut(e);
        }
        let wake = self
            .poll_timeout()
            .map_or(wait_until, |(t, _)| t.min(wait_until));
        Next::Pending(wake)
    }

    /// Appends queued bytes to `out`; see [`WsClient::poll_transmit`].
    pub fn poll_transmit(&mut self, out: &mut Vec<u8>) -> Option<usize> {
        self.ws.poll_transmit(out)
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

    /// The next deadline and its timer; ties go to the earlier timer in
    /// [`TerminalTimer`] order.
    pub fn poll_timeout(&self) -> Option<(Instant, TerminalTimer)> {
        let ws = self.ws.poll_timeout().map(|(t, w)| {
            let timer = match w {
                WsTimer::Handshake => TerminalTimer::Handshake,
                WsTimer::CloseWait => TerminalTimer::Close,
            };
            (t, timer)
        });
        let live = self.outcome.is_none();
        let candidates = [
            ws,
            self.exit_close_deadline.map(|t| (t, TerminalTimer::Close)),
            live.then_some((self.session_deadline, TerminalTimer::Session)),
            (live && !self.attached).then_some((self.attach_deadline, TerminalTimer::Consumer)),
            live.then_some((self.idle_deadline, TerminalTimer::Idle)),
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
        self.ws.is_finished() && self.ws.pending_transmit() == 0
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

    fn expired(&self, op: Operation, reason: &'static str) -> Error {
        Error::new(Category::Expired, op, self.evidence()).with_reason(reason)
    }

    fn check_can_send(&self, op: Operation) -> Result<(), Error> {
        if self.outcome.is_some() || self.ws.is_close_sent() {
            return Err(Error::validation(op, "session_closed"));
        }
        if !self.opened {
            return Err(Error::validation(op, "not_open"));
        }
        Ok(())
    }

    /// Checks the cumulative cap; past it the session ends.
    fn charge(&mut self, now: Instant, op: Operation, len: usize) -> Result<(), Error> {
        let total = self.sent_bytes + len as u64;
        if total > self.max_request_bytes {
            let e = Error::new(Category::OutputLimit, op, Evidence::Unknown)
                .with_reason("cumulative_input")
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

    /// Decides the outcome (first decision wins) and starts closing.
    fn finish(&mut self, now: Instant, outcome: Result<TerminalExit, Error>, code: CloseCode) {
        if self.outcome.is_none() {
            self.outcome = Some(outcome);
        }
        self.exit_close_deadline = None;
        if !self.ws.is_close_sent() && !self.ws.is_finished() {
            // `code` is one of the sendable constants.
            let _ = self.ws.close(now, code);
        }
    }

    /// Processes every pending WebSocket event.
    fn pump(&mut self, now: Instant) {
        while let Some(ev) = self.ws.poll_event() {
            match ev {
                WsEvent::Open => self.opened = true,
                WsEvent::Binary(bytes) => {
                    if self.outcome.is_some() {
                        continue;
                    }
                    if self.exit_code.is_some() {
                        let e = self.protocol("output_after_exit");
                        self.finish(now, Err(e), CloseCode::PROTOCOL_ERROR);
                        continue;
                    }
                    self.idle_deadline = now + self.idle_budget;
                    if bytes.is_empty() {
                        continue;
                    }
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
                        Err(self.protocol("text_after_exit"))
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
                WsEvent::Closed(_) => {
                    let outcome = match self.exit_code {
                        Some(code) => classify_exit(code),
                        None if self.user_closed => Err(Error::new(
                            Category::Unknown,
                            Operation::TerminalClose,
                            Evidence::Unknown,
                        )
                        .with_reason("closed_by_client")),
                        None => Err(Error::new(
                            Category::Unknown,
                            Operation::TerminalOutput,
                            Evidence::Unknown,
                        )
                        .with_reason("closed_without_exit")),
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

    fn protocol(&self, reason: &'static str) -> Error {
        Error::protocol(Operation::TerminalOutput, reason).with_evidence(Evidence::Unknown)
    }

    fn overflow(&self, overflow: Overflow) -> Error {
        let e = Error::new(
            Category::OutputLimit,
            Operation::TerminalOutput,
            Evidence::Unknown,
        );
        match overflow {
            Overflow::Bytes(total) => e
                .with_reason("unread_output_bytes")
                .with_limit(total, self.queue_max_bytes()),
            Overflow::Chunks => e.with_reason("unread_output_chunks").with_limit(
                super::queue::MAX_UNREAD_CHUNKS as u64 + 1,
                super::queue::MAX_UNREAD_CHUNKS as u64,
            ),
        }
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
        if e.reason() == "close_wait_expired" {
            Error::new(
                Category::Expired,
                Operation::TerminalClose,
                Evidence::Unknown,
            )
            .with_reason("close_wait_expired")
        } else {
            e.with_operation(Operation::TerminalOutput)
        }
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
