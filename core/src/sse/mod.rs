//! WHATWG event-stream parser (HTML "Parsing an event stream" and
//! "Interpreting an event stream"), sans-IO.
//!
//! [`SseParser`] is a push parser with the crate's usual shape:
//!
//! * input: [`SseParser::handle_input`] with the next bytes of the body, and
//!   [`SseParser::finish`] at end of stream;
//! * output: [`SseParser::poll_event`], drained until it returns `Ok(None)`
//!   after every input. It hands out an [`Event`] that *borrows* the parser's
//!   buffers (event type, data, last event id), so a steady stream of events
//!   allocates nothing once the buffers have grown to the largest event.
//!
//! ```
//! use smolbox_core::sse::{Config, SseParser, StreamEnd};
//!
//! let mut p = SseParser::new(Config::default());
//! p.handle_input(b"event: stdout\ndata: caf\xc3").unwrap();
//! assert!(p.poll_event().unwrap().is_none()); // the frame is not complete
//! p.handle_input(b"\xa9\r\n\r").unwrap(); // a CR and its LF may arrive apart
//! let ev = p.poll_event().unwrap().unwrap();
//! assert_eq!((ev.event_type(), ev.data()), (&b"stdout"[..], "café".as_bytes()));
//! assert!(p.poll_event().unwrap().is_none());
//! p.handle_input(b"\n").unwrap();
//! assert!(p.poll_event().unwrap().is_none());
//! assert_eq!(p.finish().unwrap(), StreamEnd::Clean);
//! ```
//!
//! # Rules
//!
//! Lines end at CRLF, LF or CR; a CR at the end of one input and an LF at the
//! start of the next are one line end. One leading UTF-8 BOM is stripped. A
//! line starting with `:` is a comment. `name:value` sets a field (one space
//! after the colon is stripped); a line without a colon is a field with an
//! empty value. `event` sets the type, `data` appends a line to the data
//! (lines joined by LF), `id` sets the last event id unless the value contains
//! NUL, `retry` sets the reconnection time when the value is only ASCII digits;
//! other fields are ignored. A blank line dispatches the event unless no `data`
//! field was seen (WHATWG: such events are not dispatched). At end of stream a
//! trailing partial event is discarded and [`StreamEnd::PartialFrame`] says so.
//!
//! # Bytes, not text
//!
//! The parser works on bytes. Every delimiter is ASCII and UTF-8 never puts an
//! ASCII byte inside a multi-byte sequence, so parsing the bytes and decoding
//! each value with replacement gives exactly what WHATWG's decode-then-parse
//! gives. So the parser is always in raw-bytes mode: [`Event::data`] is the
//! raw bytes (exec output keeps its invalid sequences until the caller
//! asks), and [`Event::data_lossy`] (WHATWG's replacement) or
//! [`Event::data_str`] (strict) convert on request.
//!
//! # Limits
//!
//! Each [`SseParser::handle_input`] takes at most [`Config::max_chunk_len`]
//! bytes. A line may hold at most [`Config::max_line_len`] bytes (terminator
//! excluded) and a frame — the lines of one event, counting one byte per line
//! end, complete or not — at most [`Config::max_event_len`]. Both are checked
//! on the logical stream, so the verdict (which limit, and after which event)
//! is the same however the input was chunked: the error is raised at the first
//! byte over a cap, and [`crate::Limit::actual`] is that byte's count
//! (`max + 1`; the chunk cap reports the chunk's length). Errors are `output_limit` with evidence `dispatch_uncertain`,
//! attributed to [`Config::operation`] (default [`Operation::Sse`]). After an
//! error every call returns the same error.
//!
//! Memory is bounded by `max_line_len + max_chunk_len` of unparsed input plus
//! `max_event_len` of event buffers, provided the caller drains
//! [`SseParser::poll_event`] after every input.
//!
//! # Time
//!
//! Linear in the input whatever the chunking: a partial line is scanned once
//! (the scan position is kept) and moved at most once when the buffer is
//! compacted.

use crate::Reason;
use std::borrow::Cow;
use std::str::Utf8Error;

use crate::error::{Error, Evidence, Operation};

mod fuzz;
#[cfg(test)]
mod tests;

pub use fuzz::fuzz_sse;
pub(crate) use fuzz::sizes as fuzz_sizes;

/// Default cap on one line (terminator excluded): 128 KiB.
pub const DEFAULT_MAX_LINE_LEN: usize = 131_072;
/// Default cap on one frame, including an incomplete one: 128 KiB.
pub const DEFAULT_MAX_EVENT_LEN: usize = 131_072;
/// Default cap on the bytes of one [`SseParser::handle_input`] call: 256 KiB.
pub const DEFAULT_MAX_CHUNK_LEN: usize = 262_144;

const BOM: &[u8; 3] = b"\xEF\xBB\xBF";

/// Parser limits and error attribution.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// Largest line, in bytes, terminator excluded.
    pub max_line_len: usize,
    /// Largest frame: the bytes of an event's lines plus one per line end,
    /// counted while incomplete too.
    pub max_event_len: usize,
    /// Largest single input to [`SseParser::handle_input`].
    pub max_chunk_len: usize,
    /// The operation errors are attributed to.
    pub operation: Operation,
}

impl Config {
    /// The defaults: 128 KiB lines and frames, 256 KiB inputs, [`Operation::Sse`].
    pub const fn new() -> Self {
        Self {
            max_line_len: DEFAULT_MAX_LINE_LEN,
            max_event_len: DEFAULT_MAX_EVENT_LEN,
            max_chunk_len: DEFAULT_MAX_CHUNK_LEN,
            operation: Operation::Sse,
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Self::new()
    }
}

/// How the stream ended, as told by [`SseParser::finish`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamEnd {
    /// The stream ended on a frame boundary.
    Clean,
    /// The stream ended inside a frame (bytes after the last blank line);
    /// that partial event was discarded.
    PartialFrame,
}

/// One dispatched event, borrowing the parser's buffers until the next call.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Event<'a> {
    event_type: &'a [u8],
    data: &'a [u8],
    last_event_id: &'a [u8],
}

impl<'a> Event<'a> {
    /// The event type: the last `event` field, or `message` when there was none.
    pub fn event_type(&self) -> &'a [u8] {
        if self.event_type.is_empty() {
            b"message"
        } else {
            self.event_type
        }
    }

    /// The data: the `data` lines joined by LF, as raw bytes.
    pub fn data(&self) -> &'a [u8] {
        self.data
    }

    /// The data decoded as UTF-8 with replacement (WHATWG's decoding).
    pub fn data_lossy(&self) -> Cow<'a, str> {
        String::from_utf8_lossy(self.data)
    }

    /// The data as UTF-8.
    ///
    /// # Errors
    /// When the data holds an invalid UTF-8 sequence.
    pub fn data_str(&self) -> Result<&'a str, Utf8Error> {
        std::str::from_utf8(self.data)
    }

    /// The last event id in force when this event was dispatched (raw bytes).
    pub fn last_event_id(&self) -> &'a [u8] {
        self.last_event_id
    }
}

impl core::fmt::Debug for Event<'_> {
    /// Prints sizes only: event data may be command output.
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Event")
            .field("event_type", &String::from_utf8_lossy(self.event_type()))
            .field("data_len", &self.data.len())
            .field("last_event_id_len", &self.last_event_id.len())
            .finish()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Open,
    Failed(Error),
    Finished(StreamEnd),
}

/// The event-stream parser. See the module docs for the rules, limits and
/// the drain contract.
#[derive(Clone)]
pub struct SseParser {
    config: Config,
    state: State,
    /// Input not yet parsed starts at `pos`.
    buf: Vec<u8>,
    pos: usize,
    /// Bytes after `pos` already known to hold no line end.
    scanned: usize,
    /// The previous line ended with CR: an LF next is part of that line end.
    skip_lf: bool,
    /// The stream start has not been checked for a BOM yet.
    bom_pending: bool,
    /// Bytes of the current frame's complete lines, plus one per line end.
    frame_len: usize,
    /// Event buffers (WHATWG "data buffer", "event type buffer", "last event
    /// ID buffer"); `data` holds a trailing LF after each data line.
    data: Vec<u8>,
    event_type: Vec<u8>,
    id_buf: Vec<u8>,
    /// WHATWG "last event ID string", set from `id_buf` on every blank line.
    last_event_id: Vec<u8>,
    retry: Option<u64>,
    /// An event was handed out: clear the event buffers before parsing on.
    dispatched: bool,
    line_ends: LineEnds,
    /// Bytes scanned for line ends plus bytes moved by compaction (tests
    /// check that this stays linear in the input).
    #[cfg(test)]
    work: usize,
}

impl core::fmt::Debug for SseParser {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("SseParser")
            .field("config", &self.config)
            .field("state", &self.state)
            .field("unparsed", &(self.buf.len() - self.pos))
            .field("frame_len", &self.frame_len)
            .finish_non_exhaustive()
    }
}

impl SseParser {
    /// A parser at the start of a stream.
    pub fn new(config: Config) -> Self {
        Self {
            config,
            state: State::Open,
            buf: Vec::new(),
            pos: 0,
            scanned: 0,
            skip_lf: false,
            bom_pending: true,
            frame_len: 0,
            data: Vec::new(),
            event_type: Vec::new(),
            id_buf: Vec::new(),
            last_event_id: Vec::new(),
            retry: None,
            dispatched: false,
            line_ends: LineEnds::new(),
            #[cfg(test)]
            work: 0,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Feeds the next bytes of the stream. Drain [`Self::poll_event`] after.
    ///
    /// # Errors
    /// `output_limit` when `bytes` is longer than [`Config::max_chunk_len`];
    /// the earlier error when the parser has failed; a `validation` error
    /// after [`Self::finish`].
    pub fn handle_input(&mut self, bytes: &[u8]) -> Result<(), Error> {
        match self.state {
            State::Open => {}
            State::Failed(e) => return Err(e),
            State::Finished(_) => {
                return Err(
                    Error::validation(self.config.operation, Reason::SseInputAfterFinish)
                        .with_evidence(Evidence::DispatchUncertain),
                );
            }
        }
        if bytes.len() > self.config.max_chunk_len {
            let max = self.config.max_chunk_len;
            return Err(self.fail(Reason::SseChunkTooLarge, bytes.len(), max));
        }
        if self.pos > 0 {
            if self.pos == self.buf.len() {
                self.buf.clear();
            } else {
                #[cfg(test)]
                {
                    self.work += self.buf.len() - self.pos;
                }
                self.buf.drain(..self.pos);
            }
            self.pos = 0;
        }
        self.buf.extend_from_slice(bytes);
        Ok(())
    }

    /// The next complete event, if any. The event borrows the parser until
    /// the next call; call again until `Ok(None)`.
    ///
    /// # Errors
    /// `output_limit` when a line or frame exceeds its cap (sticky).
    pub fn poll_event(&mut self) -> Result<Option<Event<'_>>, Error> {
        match self.state {
            State::Open => {}
            State::Failed(e) => return Err(e),
            State::Finished(_) => return Ok(None),
        }
        if self.dispatched {
            self.dispatched = false;
            self.data.clear();
            self.event_type.clear();
        }
        if !self.parse_until_dispatch()? {
            return Ok(None);
        }
        self.dispatched = true;
        // `data` ends with the LF of its last line: WHATWG removes it.
        let data_end = self.data.len() - 1;
        Ok(Some(Event {
            event_type: &self.event_type,
            data: &self.data[..data_end],
            last_event_id: &self.id_buf,
        }))
    }

    /// The event the last [`Self::poll_event`] handed out, while it is still
    /// the current one (until the next `poll_event` or `finish`).
    /// Lets a decoder built on the parser inspect an event and then hand it
    /// on without holding the borrow across its own bookkeeping.
    pub fn event(&self) -> Option<Event<'_>> {
        if !self.dispatched || !matches!(self.state, State::Open) {
            return None;
        }
        Some(Event {
            event_type: &self.event_type,
            data: &self.data[..self.data.len() - 1],
            last_event_id: &self.id_buf,
        })
    }

    /// Ends the stream. Call after [`Self::poll_event`] returned `Ok(None)`:
    /// events still unparsed are parsed and discarded. Says whether the
    /// stream ended inside a frame (whose partial event is discarded).
    /// Repeated calls return the same answer.
    ///
    /// # Errors
    /// A limit error found in the remaining input, or the earlier error.
    pub fn finish(&mut self) -> Result<StreamEnd, Error> {
        match self.state {
            State::Open => {}
            State::Failed(e) => return Err(e),
            State::Finished(end) => return Ok(end),
        }
        while self.poll_event()?.is_some() {}
        let end = if self.frame_len > 0 || self.pos < self.buf.len() {
            StreamEnd::PartialFrame
        } else {
            StreamEnd::Clean
        };
        self.state = State::Finished(end);
        self.buf = Vec::new();
        self.pos = 0;
        self.data.clear();
        self.event_type.clear();
        Ok(end)
    }

    /// The reconnection time in milliseconds from the last valid `retry`
    /// field, if any (values that do not fit in a `u64` are ignored).
    pub fn retry(&self) -> Option<u64> {
        self.retry
    }

    /// The WHATWG "last event ID string": the id in force at the last blank
    /// line (raw bytes; empty when none was set).
    pub fn last_event_id(&self) -> &[u8] {
        &self.last_event_id
    }

    /// True once [`Self::finish`] succeeded.
    pub fn is_finished(&self) -> bool {
        matches!(self.state, State::Finished(_))
    }

    /// Parses complete lines until an event is ready (`true`) or the input
    /// runs out (`false`).
    fn parse_until_dispatch(&mut self) -> Result<bool, Error> {
        loop {
            let avail = &self.buf[self.pos..];
            if avail.is_empty() {
                return Ok(false);
            }
            if self.skip_lf {
                self.skip_lf = false;
                if avail[0] == b'\n' {
                    self.pos += 1;
                }
                continue;
            }
            if self.bom_pending {
                if avail.len() < BOM.len() && BOM.starts_with(avail) {
                    return Ok(false);
                }
                self.bom_pending = false;
                if avail.starts_with(BOM) {
                    self.pos += BOM.len();
                }
                continue;
            }
            let found = self.line_ends.find(&avail[self.scanned..]);
            #[cfg(test)]
            {
                self.work += found.map_or(avail.len() - self.scanned, |i| i + 1);
            }
            let Some(i) = found else {
                self.scanned = avail.len();
                let len = avail.len();
                self.check_caps(len, false)?;
                return Ok(false);
            };
            let line_len = self.scanned + i;
            let ends_with_cr = avail[line_len] == b'\r';
            self.check_caps(line_len, true)?;
            let start = self.pos;
            self.skip_lf = ends_with_cr;
            self.pos += line_len + 1;
            self.scanned = 0;
            if line_len == 0 {
                if self.dispatch() {
                    return Ok(true);
                }
                continue;
            }
            self.frame_len += line_len + 1;
            let line = &self.buf[start..start + line_len];
            process_line(
                line,
                &mut self.data,
                &mut self.event_type,
                &mut self.id_buf,
                &mut self.retry,
            );
        }
    }

    /// WHATWG "dispatch the event" at a blank line; `true` when an event is
    /// to be handed out.
    fn dispatch(&mut self) -> bool {
        self.frame_len = 0;
        if self.last_event_id != self.id_buf {
            self.last_event_id.clear();
            self.last_event_id.extend_from_slice(&self.id_buf);
        }
        if self.data.is_empty() {
            self.event_type.clear();
            return false;
        }
        true
    }

    /// Checks a line of `line_len` bytes (complete, or all that is there so
    /// far) against the line and frame caps. When both are crossed, the one
    /// crossed at the earlier byte wins, so the verdict does not depend on
    /// how much of the line had arrived.
    #[inline]
    fn check_caps(&mut self, line_len: usize, complete: bool) -> Result<(), Error> {
        // Fast path: well inside both caps (the line end counts one byte).
        if line_len <= self.config.max_line_len
            && self.frame_len.saturating_add(line_len) < self.config.max_event_len
        {
            return Ok(());
        }
        self.check_caps_slow(line_len, complete)
    }

    #[cold]
    fn check_caps_slow(&mut self, line_len: usize, complete: bool) -> Result<(), Error> {
        let max_line = self.config.max_line_len;
        let max_event = self.config.max_event_len;
        // Bytes this line adds to the frame: a complete non-blank line counts
        // its line end; a blank line ends the frame and adds nothing.
        let extent = if complete && line_len > 0 {
            line_len + 1
        } else {
            line_len
        };
        // 1-based position in the line of the first byte over each cap.
        let line_cross = max_line.saturating_add(1);
        let event_cross = max_event.saturating_sub(self.frame_len).saturating_add(1);
        let line_over = line_len >= line_cross;
        let event_over = extent >= event_cross;
        if line_over && (!event_over || line_cross <= event_cross) {
            return Err(self.fail(Reason::SseLineTooLong, max_line.saturating_add(1), max_line));
        }
        if event_over {
            return Err(self.fail(
                Reason::SseEventTooLarge,
                max_event.saturating_add(1),
                max_event,
            ));
        }
        Ok(())
    }

    fn fail(&mut self, reason: Reason, actual: usize, max: usize) -> Error {
        let e = Error::output_limit(self.config.operation, Evidence::DispatchUncertain, reason)
            .with_limit(to_u64(actual), to_u64(max));
        self.state = State::Failed(e);
        self.buf = Vec::new();
        self.pos = 0;
        e
    }
}

/// Finds the next CR or LF. Lines are short, so the CPU-specific searcher
/// is picked once per parser rather than once per line.
#[derive(Clone, Copy)]
struct LineEnds {
    #[cfg(target_arch = "x86_64")]
    avx2: Option<memchr::arch::x86_64::avx2::memchr::Two>,
}

impl LineEnds {
    fn new() -> Self {
        Self {
            #[cfg(target_arch = "x86_64")]
            avx2: memchr::arch::x86_64::avx2::memchr::Two::new(b'\n', b'\r'),
        }
    }

    #[inline]
    fn find(&self, haystack: &[u8]) -> Option<usize> {
        #[cfg(target_arch = "x86_64")]
        if let Some(two) = &self.avx2 {
            return two.find(haystack);
        }
        memchr::memchr2(b'\n', b'\r', haystack)
    }
}

fn to_u64(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

/// WHATWG "process the field" for one non-blank line.
#[inline]
fn process_line(
    line: &[u8],
    data: &mut Vec<u8>,
    event_type: &mut Vec<u8>,
    id_buf: &mut Vec<u8>,
    retry: &mut Option<u64>,
) {
    // Fast path for the fields the worker sends: none of these names holds
    // a colon, so a line starting with `data:` has its first colon there.
    let (name, value) = if let Some(v) = line.strip_prefix(b"data:") {
        (&b"data"[..], v)
    } else if let Some(v) = line.strip_prefix(b"event:") {
        (&b"event"[..], v)
    } else {
        match memchr::memchr(b':', line) {
            Some(0) => return, // comment
            Some(c) => (&line[..c], &line[c + 1..]),
            None => (line, &b""[..]),
        }
    };
    let value = value.strip_prefix(b" ").unwrap_or(value);
    match name {
        b"data" => {
            data.extend_from_slice(value);
            data.push(b'\n');
        }
        b"event" => {
            event_type.clear();
            event_type.extend_from_slice(value);
        }
        b"id" if memchr::memchr(0, value).is_none() => {
            id_buf.clear();
            id_buf.extend_from_slice(value);
        }
        b"retry" => {
            if let Some(ms) = parse_retry(value) {
                *retry = Some(ms);
            }
        }
        _ => {}
    }
}

/// Only ASCII digits (at least one), base ten, fitting a `u64`.
fn parse_retry(value: &[u8]) -> Option<u64> {
    if value.is_empty() {
        return None;
    }
    let mut n: u64 = 0;
    for &b in value {
        if !b.is_ascii_digit() {
            return None;
        }
        n = n.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
    }
    Some(n)
}
