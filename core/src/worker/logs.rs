//! Console logs over SSE (features C8.2): the request with its bounds, a
//! line collector over parsed SSE events ([`LogLines`]) and the whole-body
//! decoder over [`crate::sse`] ([`LogStream`]).
//!
//! A shell checks the head with [`Logs::check_head`], then feeds body bytes
//! to [`LogStream::handle_input`]; in follow mode it drains
//! [`LogStream::poll_line`] after every input and hands each line to the
//! caller's callback; at end of stream [`LogStream::finish`] returns the
//! snapshot lines (a partial final frame is a `protocol` error).

use crate::Reason;
use std::collections::VecDeque;
use std::time::Duration;

use super::machines::MachineName;
use super::profile::{Feature, Profile};
use super::status::{check_media_type, check_status};
use super::{TEXT_EVENT_STREAM, WorkerCall, machine_target};
use crate::error::{Error, Evidence, Operation};
use crate::http1::{Method, Request, ResponseHead};
use crate::sse::{self, SseParser, StreamEnd};

/// Largest `tail`.
pub const MAX_TAIL: u32 = 10_000;
/// Default `tail`.
pub const DEFAULT_TAIL: u32 = 100;
/// Smallest and largest timeout, ms.
pub const TIMEOUT_MS: (u64, u64) = (1_000, 300_000);
/// Default timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(30_000);
/// Largest output allowance.
pub const MAX_ALLOWANCE: u64 = 8_388_608;
/// Default output allowance.
pub const DEFAULT_ALLOWANCE: u64 = 1_048_576;
/// Bytes of SSE framing a log frame may add to its line.
const FRAMING_ROOM: usize = 64;
/// Most events one read may deliver.
pub const MAX_EVENTS: u32 = 10_000;

/// The bounds of one console-log read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogsParams {
    /// History lines, 0–10,000 (default 100; 0 skips history).
    pub tail: u32,
    /// Follow new lines (the shell must deliver them to a callback).
    pub follow: bool,
    /// Operation timeout, 1,000–300,000 ms (default 30,000), also capped by
    /// the endpoint's operation budget.
    pub timeout: Duration,
    /// Output allowance, 1–8,388,608 B (default 1 MiB), counting one
    /// newline per event.
    pub allowance: u64,
}

impl Default for LogsParams {
    fn default() -> Self {
        Self {
            tail: DEFAULT_TAIL,
            follow: false,
            timeout: DEFAULT_TIMEOUT,
            allowance: DEFAULT_ALLOWANCE,
        }
    }
}

impl LogsParams {
    /// Checks every bound.
    ///
    /// # Errors
    /// `validation`, operation `logs`, with the offending value as limit.
    pub fn validate(&self) -> Result<(), Error> {
        let op = Operation::Logs;
        if self.tail > MAX_TAIL {
            return Err(Error::validation(op, Reason::TailOutOfRange)
                .with_limit(self.tail.into(), MAX_TAIL.into()));
        }
        let ms = u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX);
        if !(TIMEOUT_MS.0..=TIMEOUT_MS.1).contains(&ms)
            || !self.timeout.subsec_nanos().is_multiple_of(1_000_000)
        {
            return Err(
                Error::validation(op, Reason::TimeoutOutOfRange).with_limit(ms, TIMEOUT_MS.1)
            );
        }
        if !(1..=MAX_ALLOWANCE).contains(&self.allowance) {
            return Err(Error::validation(op, Reason::AllowanceOutOfRange)
                .with_limit(self.allowance, MAX_ALLOWANCE));
        }
        Ok(())
    }
}

/// `GET /api/v1/machines/{name}/logs?tail=T&follow=F` (1.17.0+). A 404
/// does not mean the machine is absent (it may never have started).
#[derive(Clone, Debug)]
pub struct Logs {
    name: MachineName,
    params: LogsParams,
}

impl Logs {
    /// Validates the bounds and the version.
    ///
    /// # Errors
    /// `validation` or `unsupported_capability`, `not_dispatched`.
    pub fn new(profile: &Profile, name: MachineName, params: LogsParams) -> Result<Self, Error> {
        params.validate()?;
        profile.require(Feature::ConsoleLogs, Operation::Logs)?;
        Ok(Self { name, params })
    }

    /// The bounds.
    pub const fn params(&self) -> &LogsParams {
        &self.params
    }

    /// The time this read may take: its own timeout, capped by the
    /// endpoint's operation budget.
    pub fn timeout(&self, operation_budget: Duration) -> Duration {
        self.params.timeout.min(operation_budget)
    }

    /// The request.
    ///
    /// # Errors
    /// None today; the signature matches the other operations.
    pub fn request(&self) -> Result<Request, Error> {
        let query = format!(
            "/logs?tail={}&follow={}",
            self.params.tail, self.params.follow
        );
        Ok(Request::new(
            Operation::Logs,
            Method::Get,
            machine_target(self.name.as_str(), &query),
        )
        .accept(TEXT_EVENT_STREAM))
    }

    /// Checks the reply head: 200 `text/event-stream`. For any other status
    /// the shell reads the (bounded) body and calls [`Logs::decode_error`].
    ///
    /// # Errors
    /// `protocol` for a wrong media type on a 200.
    pub fn check_head(&self, head: &ResponseHead) -> Result<bool, Error> {
        if head.status != 200 {
            return Ok(false);
        }
        check_media_type(Operation::Logs, head, TEXT_EVENT_STREAM)?;
        Ok(true)
    }

    /// The error of a non-200 reply (404 is `not_found`, which does not
    /// prove absence).
    pub fn decode_error(&self, head: &ResponseHead, body: &[u8]) -> Error {
        match check_status(Operation::Logs, head, body, 200) {
            Err(e) => e,
            Ok(()) => Error::protocol(Operation::Logs, Reason::UnexpectedStatus),
        }
    }

    /// The body decoder for this read (SSE framing plus line bounds).
    pub fn stream(&self) -> LogStream {
        // A line may be as long as the whole allowance (the worker flushes
        // partial lines only past 1 MiB); frames hold one data line. The
        // small extra room is for the `data: ` field name and line ends.
        let cap = usize::try_from(self.params.allowance)
            .unwrap_or(usize::MAX)
            .saturating_add(FRAMING_ROOM);
        let config = sse::Config {
            max_line_len: cap,
            max_event_len: cap,
            max_chunk_len: sse::DEFAULT_MAX_CHUNK_LEN,
            operation: Operation::Logs,
        };
        LogStream {
            parser: SseParser::new(config),
            lines: self.lines(),
            ready: VecDeque::new(),
        }
    }

    /// A line collector with this read's bounds.
    pub fn lines(&self) -> LogLines {
        LogLines {
            allowance: self.params.allowance,
            bytes: 0,
            events: 0,
            lines: Vec::new(),
            keep: !self.params.follow,
        }
    }
}

impl WorkerCall for Logs {
    /// Every line of the read, in order (snapshot lines, or the followed
    /// lines seen before the body ended).
    type Output = Vec<String>;

    fn operation(&self) -> Operation {
        Operation::Logs
    }

    fn request(&self) -> Result<Request, Error> {
        Self::request(self)
    }

    fn decode(&self, head: &ResponseHead, body: &[u8]) -> Result<Vec<String>, Error> {
        if !self.check_head(head)? {
            return Err(self.decode_error(head, body));
        }
        let mut stream = self.stream();
        let mut followed = Vec::new();
        for chunk in body.chunks(sse::DEFAULT_MAX_CHUNK_LEN) {
            stream.handle_input(chunk)?;
            while let Some(line) = stream.poll_line() {
                followed.push(line);
            }
        }
        let mut lines = stream.finish()?;
        if lines.is_empty() {
            lines = followed;
        }
        Ok(lines)
    }
}

/// Collects console-log lines from parsed SSE events: every data-only
/// (`message`) event is one line; comments and other event names are
/// ignored; each line must be UTF-8; ≤10,000 events and the allowance
/// (line bytes + one newline each) are enforced.
#[derive(Clone, Debug)]
pub struct LogLines {
    allowance: u64,
    bytes: u64,
    events: u32,
    lines: Vec<String>,
    keep: bool,
}

impl LogLines {
    /// Feeds one parsed event (`event_type` `None` or `"message"` is a log
    /// line). Returns the line for a follow read (the shell hands it to the
    /// callback), `None` for ignored events or when snapshot lines are kept.
    ///
    /// # Errors
    /// `protocol` for invalid UTF-8; `output_limit` past the allowance or
    /// the event cap; all `dispatch_uncertain`.
    pub fn handle_event(
        &mut self,
        event_type: Option<&str>,
        data: &[u8],
    ) -> Result<Option<String>, Error> {
        if !matches!(event_type, None | Some("message")) {
            return Ok(None);
        }
        let op = Operation::Logs;
        self.events += 1;
        if self.events > MAX_EVENTS {
            return Err(
                Error::output_limit(op, Evidence::DispatchUncertain, Reason::LogEventCap)
                    .with_limit(self.events.into(), MAX_EVENTS.into()),
            );
        }
        self.bytes += data.len() as u64 + 1;
        if self.bytes > self.allowance {
            return Err(
                Error::output_limit(op, Evidence::DispatchUncertain, Reason::LogAllowance)
                    .with_limit(self.bytes, self.allowance),
            );
        }
        let line = std::str::from_utf8(data)
            .map_err(|_| Error::protocol(op, Reason::LogLineNotUtf8))?
            .to_owned();
        if self.keep {
            self.lines.push(line);
            Ok(None)
        } else {
            Ok(Some(line))
        }
    }

    /// The snapshot lines at a clean end of stream.
    pub fn finish(self) -> Vec<String> {
        self.lines
    }
}

/// The console-log body decoder: [`crate::sse`] framing (comments and
/// keep-alives ignored) feeding a [`LogLines`].
#[derive(Debug)]
pub struct LogStream {
    parser: SseParser,
    lines: LogLines,
    ready: VecDeque<String>,
}

impl LogStream {
    /// Feeds body bytes (at most 256 KiB per call). Follow lines become
    /// available from [`Self::poll_line`].
    ///
    /// # Errors
    /// `output_limit` (frame, allowance or event cap), `protocol` (invalid
    /// UTF-8); all `dispatch_uncertain` and sticky in the parser.
    pub fn handle_input(&mut self, bytes: &[u8]) -> Result<(), Error> {
        self.parser.handle_input(bytes)?;
        while let Some(event) = self.parser.poll_event()? {
            let kind = std::str::from_utf8(event.event_type()).unwrap_or("");
            let kind = if kind.is_empty() { None } else { Some(kind) };
            let data = event.data();
            if let Some(line) = self.lines.handle_event(kind, data)? {
                self.ready.push_back(line);
            }
        }
        Ok(())
    }

    /// The next followed line, in arrival order.
    pub fn poll_line(&mut self) -> Option<String> {
        self.ready.pop_front()
    }

    /// Hands every ready followed line to `on_line`, in order; `false`
    /// once `on_line` returned `false` (the reader wants no more).
    pub fn deliver<F>(&mut self, on_line: &mut F) -> bool
    where
        F: FnMut(String) -> bool + ?Sized,
    {
        while let Some(line) = self.ready.pop_front() {
            if !on_line(line) {
                return false;
            }
        }
        true
    }

    /// Ends the stream: the snapshot lines (empty for a follow read).
    ///
    /// # Errors
    /// `protocol` when the stream ended inside a frame.
    pub fn finish(mut self) -> Result<Vec<String>, Error> {
        match self.parser.finish()? {
            StreamEnd::Clean => Ok(self.lines.finish()),
            StreamEnd::PartialFrame => {
                Err(Error::protocol(Operation::Logs, Reason::LogPartialFrame))
            }
        }
    }
}
