//! [`HttpExchange`]: one request and its response on one connection.

use crate::Reason;
use core::fmt;
use core::ops::Range;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::body::{BodyDecoder, BodyLimits};
use super::config::ExchangeConfig;
use super::head::{self, Decoded, HeadScanner, Scan};
use super::request::encode_head;
use super::types::{Request, ResponseHead};
use crate::error::{Error, Evidence, Operation};
use crate::machine::{Machine, TransportFailure};

/// What the exchange reports, in order: one [`HttpEvent::Head`], any number
/// of [`HttpEvent::Data`], then one [`HttpEvent::End`] — or, at any point,
/// one [`HttpEvent::Failed`], after which nothing more comes.
#[derive(Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum HttpEvent<'a> {
    /// The final response head (interim 1xx heads are skipped; 101 is final).
    Head(ResponseHead),
    /// Body bytes (transfer framing removed; no content coding is ever
    /// accepted, so these are the raw payload), borrowed from the
    /// exchange's buffer until the next call. All payload received so far
    /// comes as one event, so a shell that drains after every read sees at
    /// most one `Data` per read.
    Data(&'a [u8]),
    /// The body is complete.
    End,
    /// The exchange failed (the last event): a status, limit, timeout,
    /// truncation or transport error with its evidence.
    Failed(Error),
}

/// The exchange's timers, as named by [`HttpExchange::poll_timeout`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Timer {
    /// The overall deadline.
    Deadline,
    /// The receive-idle timeout.
    Idle,
}

#[derive(Debug)]
enum Phase {
    /// Reading (interim or final) response heads.
    Head,
    /// Streaming the body: `rx[pos..]` is payload not yet reported.
    Body(BodyDecoder),
    /// A response without body: `End` is next.
    Ending,
    /// `End` was reported.
    Finished,
}

/// What one decoding step produced (before it is turned into an event).
enum Step {
    Head(ResponseHead),
    Data(Range<usize>),
    End,
}

/// One HTTP/1.1 request/response exchange as a sans-IO state machine.
///
/// * Inputs: [`handle_input`](Self::handle_input) (bytes read),
///   [`handle_eof`](Self::handle_eof) (the peer closed),
///   [`handle_timeout`](Self::handle_timeout).
/// * Outputs, drained in this order after every input:
///   [`poll_transmit`](Self::poll_transmit) (bytes to write),
///   [`poll_event`](Self::poll_event) (until `None`),
///   [`poll_timeout`](Self::poll_timeout) (when to call `handle_timeout`).
///
/// It implements the driver contract [`Machine`](crate::Machine); the
/// inherent methods of the same names are that contract.
///
/// A failure is reported once, as [`HttpEvent::Failed`] (the last event);
/// it stays readable with [`error`](Self::error) and `handle_input` returns
/// it. Errors carry the request's operation. Before `poll_transmit` handed
/// out a byte, evidence is `not_dispatched`; from then on it is
/// `dispatch_uncertain` — except a transport failure
/// ([`handle_transport_error`](Self::handle_transport_error)) before the
/// socket took one byte ([`handle_written`](Self::handle_written)), which
/// stays `not_dispatched`. See the [module docs](super) for a drive loop.
pub struct HttpExchange {
    operation: Operation,
    tx_head: Vec<u8>,
    tx_body: Bytes,
    transmitted: bool,
    rx: Vec<u8>,
    pos: usize,
    /// Bytes ever accepted into `rx`, and how many may be.
    accepted: u64,
    allowance: u64,
    dropped: bool,
    eof: bool,
    phase: Phase,
    scanner: HeadScanner,
    head_used: usize,
    /// A head decoded in place by `handle_input`, not yet reported.
    ready: Option<Decoded>,
    /// A body error found while de-framing, reported after the payload
    /// that preceded it.
    pending: Option<Error>,
    /// Bytes followed the end of the body.
    extra: bool,
    max_head_bytes: usize,
    max_headers: usize,
    body_limits: BodyLimits,
    keep_alive: bool,
    status: Option<u16>,
    idle_timeout: Option<Duration>,
    last_activity: Instant,
    deadline: Instant,
    last_now: Instant,
    error: Option<Error>,
    /// The failure was reported by `poll_event`.
    failure_reported: bool,
    /// Request bytes the socket took (`handle_written`).
    written: u64,
    /// The body count [`HttpExchange::poll_body_progress`] last reported.
    progress_reported: Option<u64>,
    /// Length of the encoded request head (for [`Self::body_written`]).
    head_len: u64,
    /// A read failure, reported after the events of the bytes before it.
    read_failure: Option<Error>,
}

impl fmt::Debug for HttpExchange {
    /// Never prints the request (it may carry the bearer token) or peer bytes.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpExchange")
            .field("operation", &self.operation)
            .field("transmitted", &self.transmitted)
            .field("status", &self.status)
            .field("finished", &matches!(self.phase, Phase::Finished))
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

impl HttpExchange {
    /// Validates `config` and `request` and encodes the request. Refuses,
    /// before any byte exists: a body over `max_request_body`
    /// (`validation`, operation `request_size`, with the limit), a bad
    /// target or header value (`validation`), an invalid config
    /// (`validation`, operation `config`), and a deadline already passed
    /// (`transport`, reason `deadline`). All with evidence `not_dispatched`.
    pub fn new(request: &Request, config: &ExchangeConfig, now: Instant) -> Result<Self, Error> {
        let mut tx_head = Vec::new();
        encode_head(request, config, &mut tx_head)?;
        if now >= config.deadline {
            return Err(Error::transport(
                request.operation,
                Evidence::NotDispatched,
                Reason::Deadline,
            ));
        }
        Ok(Self {
            operation: request.operation,
            head_len: tx_head.len() as u64,
            tx_head,
            tx_body: request.body.clone(),
            transmitted: false,
            rx: Vec::new(),
            pos: 0,
            accepted: 0,
            allowance: (config.max_head_bytes as u64)
                .saturating_add(config.max_response_body)
                .saturating_add(1),
            dropped: false,
            eof: false,
            phase: Phase::Head,
            scanner: HeadScanner::default(),
            head_used: 0,
            ready: None,
            pending: None,
            extra: false,
            max_head_bytes: config.max_head_bytes,
            max_headers: config.max_headers,
            body_limits: BodyLimits {
                max_raw: config.max_response_body,
                max_extension: config.max_chunk_extension,
                max_trailer: config.max_trailer_bytes,
            },
            keep_alive: false,
            status: None,
            idle_timeout: config.idle_timeout,
            last_activity: now,
            deadline: config.deadline,
            last_now: now,
            error: None,
            failure_reported: false,
            written: 0,
            progress_reported: None,
            read_failure: None,
        })
    }

    /// Appends the whole request (head and body) to `out` the first time;
    /// returns whether anything was appended. From the first `true` on, the
    /// request may have reached the peer (`dispatch_uncertain`) and the
    /// receive-idle timer runs from the last `now` the exchange was given.
    #[must_use]
    pub fn poll_transmit(&mut self, out: &mut Vec<u8>) -> bool {
        if self.transmitted || self.error.is_some() {
            return false;
        }
        out.reserve(self.tx_head.len() + self.tx_body.len());
        out.extend_from_slice(&self.tx_head);
        out.extend_from_slice(&self.tx_body);
        self.transmitted = true;
        self.last_activity = self.last_now;
        self.tx_head = Vec::new();
        self.tx_body = Bytes::new();
        true
    }

    /// Bytes read from the connection. Head bytes are buffered (a head that
    /// arrives whole is decoded in place); body bytes are de-framed on the
    /// way in, so only payload is kept. What they mean is reported by
    /// [`poll_event`](Self::poll_event), in stream order (an error found
    /// while de-framing comes after the payload before it). Returns the
    /// sticky error, if any.
    pub fn handle_input(&mut self, now: Instant, bytes: &[u8]) -> Result<(), Error> {
        if let Some(e) = self.error {
            return Err(e);
        }
        self.advance(now);
        if self.eof || bytes.is_empty() {
            return Ok(());
        }
        self.last_activity = self.last_now;
        if self.pos == self.rx.len() {
            self.rx.clear();
            self.pos = 0;
        } else if self.pos > 0 {
            self.rx.drain(..self.pos);
            self.pos = 0;
        }
        let mut bytes = bytes;
        if self.pos == self.rx.len()
            && self.ready.is_none()
            && matches!(self.phase, Phase::Head)
            && self.scanner.is_fresh()
        {
            // A head that arrives whole at the start of a read is decoded in
            // place, without copying it into the receive buffer. Only a
            // success is taken here; anything else goes the general way,
            // which reaches the same verdict.
            let budget = self.max_head_bytes - self.head_used;
            let window = &bytes[..bytes.len().min(budget)];
            if let Some(Ok((n, decoded))) = head::decode_whole(window, self.max_headers) {
                self.head_used += n;
                self.accepted += n as u64;
                self.ready = Some(decoded);
                bytes = &bytes[n..];
            }
        }
        let room = self.allowance - self.accepted;
        let take = usize::try_from(room).map_or(bytes.len(), |r| r.min(bytes.len()));
        self.dropped |= take < bytes.len();
        self.accepted += take as u64;
        let bytes = &bytes[..take];
        match &mut self.phase {
            // Body bytes are de-framed on the way in: the receive buffer
            // then holds payload only, reported as one event per read.
            Phase::Body(body) if self.pending.is_none() => {
                // Payload is never longer than its input: one reservation,
                // reused for every later read of the same size.
                self.rx.reserve(bytes.len());
                absorb(
                    body,
                    bytes,
                    &mut self.rx,
                    &mut self.pending,
                    &mut self.extra,
                );
            }
            Phase::Body(_) => {}
            Phase::Head | Phase::Ending | Phase::Finished => self.rx.extend_from_slice(bytes),
        }
        Ok(())
    }

    /// The peer closed its side. A read-to-close body ends here; an
    /// unfinished head or body becomes `transport` (`early_close` /
    /// `truncated`), reported by `poll_event` after the buffered bytes.
    pub fn handle_eof(&mut self, now: Instant) {
        self.advance(now);
        self.eof = true;
    }

    /// Fires due timers: `transport` with reason `deadline` or
    /// `idle_timeout`. Early or repeated calls are harmless no-ops.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.advance(now);
        let Some((at, timer)) = self.poll_timeout() else {
            return;
        };
        if self.last_now < at {
            return;
        }
        let reason = match timer {
            Timer::Deadline => Reason::Deadline,
            Timer::Idle => Reason::IdleTimeout,
        };
        self.fail(Error::transport(
            self.operation,
            Evidence::DispatchUncertain,
            reason,
        ));
    }

    /// Request body bytes the socket took so far (what an upload's
    /// progress shows): the bytes reported by
    /// [`handle_written`](Self::handle_written) past the encoded head.
    pub fn body_written(&self) -> u64 {
        self.written.saturating_sub(self.head_len)
    }

    /// [`body_written`](Self::body_written) when it moved since the last
    /// call (the first call reports it, even 0): what an upload's progress
    /// callback is handed, once per change.
    #[must_use]
    pub fn poll_body_progress(&mut self) -> Option<u64> {
        let sent = self.body_written();
        if self.progress_reported == Some(sent) {
            return None;
        }
        self.progress_reported = Some(sent);
        Some(sent)
    }

    /// The socket took `n` more request bytes.
    pub fn handle_written(&mut self, now: Instant, n: usize) {
        self.advance(now);
        self.written = self.written.saturating_add(n as u64);
    }

    /// The socket failed: `transport` with reason `write_failed` or
    /// `read_failed`, evidence `not_dispatched` only when the socket took
    /// no request byte. A read failure is reported after the events of the
    /// bytes read before it (a reply that ended just before is whole).
    pub fn handle_transport_error(&mut self, now: Instant, failure: TransportFailure) {
        self.advance(now);
        if self.error.is_some() || matches!(self.phase, Phase::Finished) {
            return;
        }
        let evidence = if self.written == 0 {
            Evidence::NotDispatched
        } else {
            Evidence::DispatchUncertain
        };
        let e = Error::transport(self.operation, evidence, failure.reason());
        match failure {
            TransportFailure::Read => self.read_failure = Some(e),
            _ => {
                self.error = Some(e);
                self.rx = Vec::new();
                self.pos = 0;
            }
        }
    }

    /// The next moment [`handle_timeout`](Self::handle_timeout) will act,
    /// and which timer that is. `None` once finished or failed.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<(Instant, Timer)> {
        if self.error.is_some() || matches!(self.phase, Phase::Finished) {
            return None;
        }
        let idle = self
            .idle_timeout
            .filter(|_| self.transmitted)
            // A caller-built huge timeout saturates: past `Instant`'s range
            // only the deadline holds (never a panic).
            .and_then(|d| self.last_activity.checked_add(d));
        match idle {
            Some(at) if at < self.deadline => Some((at, Timer::Idle)),
            _ => Some((self.deadline, Timer::Deadline)),
        }
    }

    /// Replaces the receive-idle timeout (`None`: only the deadline holds),
    /// counted from the last activity. Extended exec uses this.
    pub fn set_idle_timeout(&mut self, idle: Option<Duration>) {
        self.idle_timeout = idle;
    }

    /// The next event, or `None` when more input (or EOF) is needed or the
    /// exchange ended. A [`HttpEvent::Data`] borrows the receive buffer.
    /// A failure comes once, as the last event.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<HttpEvent<'_>> {
        if let Some(e) = self.error {
            if self.failure_reported {
                return None;
            }
            self.failure_reported = true;
            return Some(HttpEvent::Failed(e));
        }
        match self.step() {
            Ok(None) => match self.read_failure.take() {
                Some(e) if !matches!(self.phase, Phase::Finished) => {
                    self.error = Some(e);
                    self.rx = Vec::new();
                    self.pos = 0;
                    self.failure_reported = true;
                    Some(HttpEvent::Failed(e))
                }
                _ => None,
            },
            Ok(Some(Step::Head(h))) => Some(HttpEvent::Head(h)),
            Ok(Some(Step::Data(r))) => Some(HttpEvent::Data(&self.rx[r])),
            Ok(Some(Step::End)) => Some(HttpEvent::End),
            Err(e) => {
                let e = self.fail(e);
                self.failure_reported = true;
                Some(HttpEvent::Failed(e))
            }
        }
    }

    /// The final status, once the head was reported.
    pub fn status(&self) -> Option<u16> {
        self.status
    }

    /// The sticky error, if the exchange failed.
    pub fn error(&self) -> Option<Error> {
        self.error
    }

    /// True once the exchange ended: [`HttpEvent::End`] was reported or
    /// the exchange failed (its [`HttpEvent::Failed`] is the next event if
    /// not reported yet).
    pub fn is_finished(&self) -> bool {
        self.is_complete() || self.error.is_some()
    }

    /// True once [`HttpEvent::End`] was reported (a clean end).
    pub fn is_complete(&self) -> bool {
        matches!(self.phase, Phase::Finished) && self.error.is_none()
    }

    /// True when the connection may carry another exchange: the response
    /// ended cleanly, was length-delimited, allowed keep-alive, the whole
    /// request was handed out, the peer did not close, and no byte follows
    /// the response.
    pub fn is_reusable(&self) -> bool {
        self.is_complete()
            && self.keep_alive
            && self.transmitted
            && !self.eof
            && !self.dropped
            && !self.extra
            && self.pos == self.rx.len()
    }

    /// Bytes received after the end of the response (e.g. the first bytes
    /// of another protocol after a 101).
    pub fn leftover(&self) -> &[u8] {
        if self.is_complete() {
            &self.rx[self.pos..]
        } else {
            &[]
        }
    }

    fn advance(&mut self, now: Instant) {
        self.last_now = self.last_now.max(now);
    }

    fn evidence(&self) -> Evidence {
        if self.transmitted {
            Evidence::DispatchUncertain
        } else {
            Evidence::NotDispatched
        }
    }

    fn fail(&mut self, e: Error) -> Error {
        let e = e
            .with_operation(self.operation)
            .with_evidence(self.evidence());
        self.error = Some(e);
        self.rx = Vec::new();
        self.pos = 0;
        e
    }

    /// After a complete head: a final one starts the body and is returned.
    fn start_body(&mut self, decoded: Decoded) -> Result<Option<ResponseHead>, Error> {
        let Decoded::Final(head, framing) = decoded else {
            return Ok(None);
        };
        let mut body = BodyDecoder::new(framing, self.body_limits)?;
        self.keep_alive = head.keep_alive;
        self.status = Some(head.status);
        if body.is_done() {
            // No body: what follows the head stays as `leftover`.
            self.phase = Phase::Ending;
        } else {
            // Body bytes that came with the head: de-frame them in place.
            absorb_in_place(
                &mut body,
                &mut self.rx,
                self.pos,
                &mut self.pending,
                &mut self.extra,
            );
            self.phase = Phase::Body(body);
        }
        Ok(Some(head))
    }

    fn step(&mut self) -> Result<Option<Step>, Error> {
        loop {
            match &mut self.phase {
                Phase::Finished => return Ok(None),
                Phase::Head if self.ready.is_some() => {
                    if let Some(decoded) = self.ready.take()
                        && let Some(head) = self.start_body(decoded)?
                    {
                        return Ok(Some(Step::Head(head)));
                    }
                }
                Phase::Head => {
                    let region = &self.rx[self.pos..];
                    let budget = self.max_head_bytes - self.head_used;
                    let window = &region[..region.len().min(budget)];
                    // A head that arrived whole is parsed once, in place;
                    // otherwise the scanner finds its end incrementally.
                    let whole = match self.scanner.is_fresh() {
                        true => head::decode_whole(window, self.max_headers),
                        false => None,
                    };
                    let scan = match &whole {
                        Some(Ok((n, _))) => Scan::Complete(*n),
                        Some(Err(_)) | None => self.scanner.scan(window),
                    };
                    match scan {
                        Scan::Complete(n) => {
                            let decoded = match whole {
                                Some(d) => d?.1,
                                None => head::decode(&region[..n], self.max_headers)?,
                            };
                            self.pos += n;
                            self.head_used += n;
                            self.scanner = HeadScanner::default();
                            if let Some(head) = self.start_body(decoded)? {
                                return Ok(Some(Step::Head(head)));
                            }
                        }
                        Scan::Partial if region.len() > budget => {
                            let max = self.max_head_bytes as u64;
                            return Err(Error::output_limit(
                                Operation::Http,
                                Evidence::DispatchUncertain,
                                Reason::HeadBytes,
                            )
                            .with_limit(max + 1, max));
                        }
                        Scan::Partial if self.eof => {
                            return Err(Error::transport(
                                Operation::Http,
                                Evidence::DispatchUncertain,
                                Reason::EarlyClose,
                            ));
                        }
                        Scan::Partial => return Ok(None),
                    }
                }
                Phase::Ending => {
                    self.phase = Phase::Finished;
                    return Ok(Some(Step::End));
                }
                Phase::Body(body) => {
                    if self.pos < self.rx.len() {
                        let payload = self.pos..self.rx.len();
                        self.pos = self.rx.len();
                        return Ok(Some(Step::Data(payload)));
                    }
                    if let Some(e) = self.pending.take() {
                        return Err(e);
                    }
                    if body.is_done() {
                        self.phase = Phase::Finished;
                        return Ok(Some(Step::End));
                    }
                    if !self.eof {
                        return Ok(None);
                    }
                    body.finish()?;
                }
            }
        }
    }
}

/// De-frames `input` (raw body bytes, in stream order) into `out`: payload
/// is appended, framing dropped. A decoding error is parked in `pending`
/// (reported after the payload before it); bytes after the end of the body
/// set `extra`.
fn absorb(
    body: &mut BodyDecoder,
    input: &[u8],
    out: &mut Vec<u8>,
    pending: &mut Option<Error>,
    extra: &mut bool,
) {
    match body.decode_into(input, out) {
        Ok(n) => *extra |= n < input.len(),
        Err(e) => *pending = Some(e),
    }
}

/// [`absorb`] for raw body bytes already in `buf[start..]`: the payload is
/// moved down over the framing and `buf` truncated after it.
fn absorb_in_place(
    body: &mut BodyDecoder,
    buf: &mut Vec<u8>,
    start: usize,
    pending: &mut Option<Error>,
    extra: &mut bool,
) {
    let (mut read, mut write) = (start, start);
    while read < buf.len() {
        if body.is_done() {
            *extra = true;
            break;
        }
        match body.decode(&buf[read..]) {
            Ok(progress) => {
                if let Some(r) = progress.data {
                    buf.copy_within(read + r.start..read + r.end, write);
                    write += r.len();
                }
                if progress.consumed == 0 {
                    break;
                }
                read += progress.consumed;
            }
            Err(e) => {
                *pending = Some(e);
                break;
            }
        }
    }
    buf.truncate(write);
}

impl Machine for HttpExchange {
    type Event<'a> = HttpEvent<'a>;
    type Timer = Timer;

    fn handle_input(&mut self, now: Instant, bytes: &[u8]) {
        // A failure is reported by `poll_event`.
        let _ = Self::handle_input(self, now, bytes);
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
        Self::poll_transmit(self, out)
    }

    fn poll_timeout(&self) -> Option<(Instant, Timer)> {
        Self::poll_timeout(self)
    }

    fn poll_event(&mut self) -> Option<HttpEvent<'_>> {
        Self::poll_event(self)
    }

    fn is_finished(&self) -> bool {
        Self::is_finished(self)
    }

    fn wants_read(&self) -> bool {
        !self.is_finished() && self.read_failure.is_none()
    }
}
