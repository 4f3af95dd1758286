//! The SSE exec stream decoder (C5.3, worker-api.md §7) over [`crate::sse`].
//!
//! The worker frames each output chunk as `event: stdout|stderr` plus one
//! `data:` line per piece of text split at every LF *and* CR, ends with
//! `event: exit` / `data: {"exitCode":N}`, and sends `:` keep-alive comments
//! after 15 s of silence. On failure it sends `event: error` whose data is
//! `{"message":"…"}` built without JSON escaping (often invalid JSON) and
//! closes without an exit.
//!
//! WHATWG line rules recover the text exactly except carriage returns: a lone
//! CR decodes as LF and CRLF as two LFs. Output is therefore tagged
//! [`OutputEncoding::LossyUtf8`]; use buffered exec for exact bytes.

use super::buffered::{ExecOutput, OutputAllowance, OutputEncoding};
use crate::Reason;
use crate::error::{Error, Evidence, Operation};
use crate::sse::{self, SseParser, StreamEnd};

/// Largest single input to [`ExecStreamDecoder::handle_input`]: 256 KiB.
pub const MAX_STREAM_CHUNK_LEN: usize = 262_144;
/// Largest frame (one event's lines, counted while incomplete): 128 KiB.
pub const MAX_STREAM_FRAME_LEN: usize = 131_072;

/// The worker's message when its own 11 MiB stream output cap cut the
/// command off (TV21).
const WORKER_CAP_PREFIX: &str = "streaming output exceeded ";

/// One event of a streamed exec, owned (what the shells hand to callers).
///
/// Its `Debug` prints sizes only: output never reaches a log through it.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ExecEvent {
    /// A piece of standard output (the worker's lossy UTF-8 text).
    Stdout(String),
    /// A piece of standard error.
    Stderr(String),
    /// The exit code; the last event of a complete stream.
    Exit(i32),
}

impl core::fmt::Debug for ExecEvent {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::Stdout(s) => write!(f, "Stdout({} bytes)", s.len()),
            Self::Stderr(s) => write!(f, "Stderr({} bytes)", s.len()),
            Self::Exit(code) => write!(f, "Exit({code})"),
        }
    }
}

impl From<ExecStreamEvent<'_>> for ExecEvent {
    fn from(ev: ExecStreamEvent<'_>) -> Self {
        match ev {
            ExecStreamEvent::Stdout(s) => Self::Stdout(s.to_owned()),
            ExecStreamEvent::Stderr(s) => Self::Stderr(s.to_owned()),
            ExecStreamEvent::Exit(code) => Self::Exit(code),
        }
    }
}

/// One decoded event, borrowing the decoder until the next call.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum ExecStreamEvent<'a> {
    /// A piece of standard output (valid UTF-8, the worker's lossy text).
    Stdout(&'a str),
    /// A piece of standard error.
    Stderr(&'a str),
    /// The exit code (the stream must end after it).
    Exit(i32),
}

impl core::fmt::Debug for ExecStreamEvent<'_> {
    /// Sizes only: output is never printed.
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::Stdout(s) => write!(f, "Stdout({} bytes)", s.len()),
            Self::Stderr(s) => write!(f, "Stderr({} bytes)", s.len()),
            Self::Exit(code) => write!(f, "Exit({code})"),
        }
    }
}

/// Decodes the body of `POST …/exec/stream` (after the 200 head with
/// `text/event-stream`).
///
/// Inputs: [`Self::handle_input`] with each body chunk (≤ 256 KiB), then
/// [`Self::finish`] at end of body. Output: [`Self::poll_event`], drained
/// until `Ok(None)` after every input. Events borrow the decoder's buffers,
/// so a steady stream allocates nothing per event.
///
/// Every error is sticky and attributed to [`Operation::ExecStream`]:
/// * `output_limit` / `dispatch_uncertain`: a chunk over 256 KiB, a frame
///   over 128 KiB (including an incomplete one), output over the allowance,
///   or the worker's own output cap (an `error` event saying so);
/// * `protocol` / `dispatch_uncertain`: a second exit, output or an error
///   after the exit, invalid exit JSON, invalid UTF-8 in a completed
///   stdout/stderr event, an `error` event (the worker's failure, message
///   discarded), end of stream without an exit or inside a frame.
///
/// Comments, unknown event types and events without data are ignored.
#[derive(Clone, Debug)]
pub struct ExecStreamDecoder {
    sse: SseParser,
    allowance: OutputAllowance,
    output_len: usize,
    exit: Option<i32>,
    failed: Option<Error>,
}

enum Action {
    Skip,
    Stdout,
    Stderr,
    Exit(i32),
}

impl ExecStreamDecoder {
    /// A decoder accepting at most `allowance` output bytes (stdout and
    /// stderr together, as decoded text).
    pub fn new(allowance: OutputAllowance) -> Self {
        let config = sse::Config {
            max_line_len: MAX_STREAM_FRAME_LEN,
            max_event_len: MAX_STREAM_FRAME_LEN,
            max_chunk_len: MAX_STREAM_CHUNK_LEN,
            operation: Operation::ExecStream,
        };
        Self {
            sse: SseParser::new(config),
            allowance,
            output_len: 0,
            exit: None,
            failed: None,
        }
    }

    /// Feeds the next body bytes (≤ 256 KiB).
    ///
    /// # Errors
    /// `output_limit` for an oversize chunk; the earlier error once failed.
    pub fn handle_input(&mut self, bytes: &[u8]) -> Result<(), Error> {
        if let Some(e) = self.failed {
            return Err(e);
        }
        self.sse.handle_input(bytes).map_err(|e| self.fail(e))
    }

    /// The next event, if any.
    ///
    /// # Errors
    /// See the type docs.
    pub fn poll_event(&mut self) -> Result<Option<ExecStreamEvent<'_>>, Error> {
        if let Some(e) = self.failed {
            return Err(e);
        }
        let action = loop {
            let action = match self.sse.poll_event() {
                Ok(None) => return Ok(None),
                Ok(Some(ev)) => classify(ev, self.exit.is_some()),
                Err(e) => Err(e),
            };
            match action {
                Err(e) => return Err(self.fail(e)),
                Ok(Action::Skip) => {}
                Ok(action) => break action,
            }
        };
        if let Action::Exit(code) = action {
            self.exit = Some(code);
            return Ok(Some(ExecStreamEvent::Exit(code)));
        }
        // Only disjoint fields are written while the event is borrowed.
        let data = self.sse.event().map_or(&b""[..], |ev| ev.data());
        let Ok(text) = std::str::from_utf8(data) else {
            let e = Error::protocol(Operation::ExecStream, Reason::OutputInvalidUtf8);
            self.failed = Some(e);
            return Err(e);
        };
        self.output_len += text.len();
        if self.output_len > self.allowance.bytes() {
            let e = Error::output_limit(
                Operation::ExecStream,
                Evidence::DispatchUncertain,
                Reason::OutputAllowance,
            )
            .with_limit(to_u64(self.output_len), to_u64(self.allowance.bytes()));
            self.failed = Some(e);
            return Err(e);
        }
        Ok(Some(match action {
            Action::Stderr => ExecStreamEvent::Stderr(text),
            _ => ExecStreamEvent::Stdout(text),
        }))
    }

    /// Ends the body. Completion requires exactly one exit event and no
    /// partial frame.
    ///
    /// # Errors
    /// `protocol` / `dispatch_uncertain` for end of stream without an exit or
    /// inside a frame; any earlier error.
    pub fn finish(&mut self) -> Result<i32, Error> {
        if let Some(e) = self.failed {
            return Err(e);
        }
        let end = self.sse.finish().map_err(|e| self.fail(e))?;
        match (self.exit, end) {
            (Some(code), StreamEnd::Clean) => Ok(code),
            (Some(_), StreamEnd::PartialFrame) => Err(self.fail(Error::protocol(
                Operation::ExecStream,
                Reason::EofInsideFrame,
            ))),
            (None, _) => Err(self.fail(Error::protocol(
                Operation::ExecStream,
                Reason::EofWithoutExit,
            ))),
        }
    }

    /// The exit code, once the exit event was decoded.
    pub fn exit_code(&self) -> Option<i32> {
        self.exit
    }

    /// Output bytes decoded so far (stdout and stderr).
    pub fn output_len(&self) -> usize {
        self.output_len
    }

    /// Drains every ready event into `out`, appending stdout and stderr and
    /// setting the exit code. `out` is tagged [`OutputEncoding::LossyUtf8`].
    ///
    /// # Errors
    /// As [`Self::poll_event`].
    pub fn drain_into(&mut self, out: &mut ExecOutput) -> Result<(), Error> {
        out.encoding = OutputEncoding::LossyUtf8;
        while let Some(ev) = self.poll_event()? {
            match ev {
                ExecStreamEvent::Stdout(s) => out.stdout.extend_from_slice(s.as_bytes()),
                ExecStreamEvent::Stderr(s) => out.stderr.extend_from_slice(s.as_bytes()),
                ExecStreamEvent::Exit(code) => out.exit_code = code,
            }
        }
        Ok(())
    }

    fn fail(&mut self, e: Error) -> Error {
        let e = e.with_operation(Operation::ExecStream);
        self.failed = Some(e);
        e
    }
}

/// What one SSE event means, checked against whether an exit was seen.
fn classify(ev: sse::Event<'_>, exited: bool) -> Result<Action, Error> {
    let protocol = |reason| Error::protocol(Operation::ExecStream, reason);
    let action = match ev.event_type() {
        b"stdout" | b"stderr" => {
            if exited {
                return Err(protocol(Reason::OutputAfterExit));
            }
            if ev.data().is_empty() {
                Action::Skip
            } else if ev.event_type() == b"stdout" {
                Action::Stdout
            } else {
                Action::Stderr
            }
        }
        b"exit" => {
            if exited {
                return Err(protocol(Reason::SecondExit));
            }
            let payload: ExitPayload =
                serde_json::from_slice(ev.data()).map_err(|_| protocol(Reason::ExitInvalid))?;
            Action::Exit(payload.exit_code)
        }
        b"error" => {
            if exited {
                return Err(protocol(Reason::ErrorAfterExit));
            }
            return Err(worker_error(ev.data()));
        }
        _ => Action::Skip,
    };
    Ok(action)
}

/// The worker's `error` event. Its message may be invalid JSON; any error
/// event fails the stream, and only the worker's output-cap message (valid
/// JSON with a known prefix) is told apart, as `output_limit`.
fn worker_error(data: &[u8]) -> Error {
    let is_cap = serde_json::from_slice::<ErrorPayload<'_>>(data)
        .is_ok_and(|p| p.message.starts_with(WORKER_CAP_PREFIX));
    if is_cap {
        Error::output_limit(
            Operation::ExecStream,
            Evidence::DispatchUncertain,
            Reason::WorkerOutputCap,
        )
    } else {
        Error::protocol(Operation::ExecStream, Reason::WorkerErrorEvent)
    }
}

fn to_u64(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ExitPayload {
    #[serde(rename = "exitCode")]
    exit_code: i32,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ErrorPayload<'a> {
    #[serde(borrow)]
    message: std::borrow::Cow<'a, str>,
}
