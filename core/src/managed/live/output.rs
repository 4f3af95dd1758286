//! The managed consumer's bounded output buffer and its read pacing
//! (features C7.3; docs/decisions/shells.md, "Managed terminals: read
//! pacing towards the consumer (session 9)").
//!
//! A run's task pulls its low-level terminal and pushes into this buffer;
//! the consumer pops. The rule is the low-level terminal's
//! ([`READ_GRACE`]): while the consumer is live — it read (or waited in
//! `next`) within the grace — a chunk that does not fit is *held* and the
//! run pulls nothing more ([`Pace::Hold`]), so the low-level terminal holds
//! its frames and stops reading the socket (back-pressure on the worker);
//! the consumer's next read that makes room moves the held chunk on and the
//! run pulls again. A consumer that has not read for the grace while a
//! chunk is held is stalled: the session ends with `output_limit` (AC-7.3.1).
//! Time is always an argument.

use std::collections::VecDeque;
use std::fmt;
use std::time::Instant;

use bytes::Bytes;

use crate::terminal::{MAX_UNREAD_CHUNKS, READ_GRACE, TerminalEvent, TerminalExit};
use crate::{Error, Evidence, Operation, Reason};

/// What a run does next with its low-level terminal's output
/// ([`OutputBuffer::pace`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pace {
    /// Pull the next chunk and [`push`](OutputBuffer::push) it.
    Pull,
    /// Pull nothing: a chunk is held for a live consumer. The run keeps its
    /// low-level terminal's consumer live (so that terminal holds its
    /// frames too) and waits for the consumer's next read or this instant
    /// (the end of the consumer's grace), then asks again.
    Hold(Instant),
}

/// The consumer's output buffer: at most `max_bytes` (the spec's
/// `buffer_bytes`) and [`MAX_UNREAD_CHUNKS`] unread, plus one held chunk
/// while the consumer is live; then the session's outcome.
pub struct OutputBuffer {
    chunks: VecDeque<Bytes>,
    bytes: usize,
    max_bytes: usize,
    /// The chunk that did not fit, kept while the consumer is live.
    held: Option<Bytes>,
    /// The consumer's last read (the open and the attach count as reads).
    last_read: Instant,
    /// The deadline of the consumer's `next` that is waiting: it reads at
    /// every instant up to it.
    waiting_until: Option<Instant>,
    closed: Option<Result<TerminalExit, Error>>,
}

impl fmt::Debug for OutputBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Counts only: terminal bytes are never printed.
        f.debug_struct("OutputBuffer")
            .field("chunks", &self.chunks.len())
            .field("bytes", &self.bytes)
            .field("max_bytes", &self.max_bytes)
            .field("held", &self.held.as_ref().map(Bytes::len))
            .field("closed", &self.closed)
            .finish()
    }
}

/// The overflow of a stalled consumer's buffer.
const fn overflow() -> Error {
    Error::output_limit(
        Operation::TerminalOutput,
        Evidence::Unknown,
        Reason::UnreadOutput,
    )
}

impl OutputBuffer {
    /// An empty buffer of at most `max_bytes` unread, opened at `now`
    /// (the open counts as the consumer's first read: it gets the grace to
    /// attach and read).
    pub fn new(max_bytes: usize, now: Instant) -> Self {
        Self {
            chunks: VecDeque::new(),
            bytes: 0,
            max_bytes,
            held: None,
            last_read: now,
            waiting_until: None,
            closed: None,
        }
    }

    /// The byte bound (the spec's `buffer_bytes`).
    pub fn max_bytes(&self) -> usize {
        self.max_bytes
    }

    /// Unread bytes queued for the consumer (never above
    /// [`max_bytes`](Self::max_bytes) while the consumer is live), without
    /// the held chunk.
    pub fn unread_bytes(&self) -> usize {
        self.bytes
    }

    /// True while a chunk is held (the run pulls nothing more).
    pub fn holds(&self) -> bool {
        self.held.is_some()
    }

    /// The consumer attached at `now`: a read.
    pub fn attached(&mut self, now: Instant) {
        self.read_at(now);
    }

    /// The consumer's `next` starts at `now` and waits up to `until`: it
    /// counts as reading at every instant up to `until` (until it returns
    /// an event).
    pub fn begin_wait(&mut self, now: Instant, until: Instant) {
        self.read_at(now);
        self.waiting_until = Some(until.max(now));
    }

    /// True while the consumer counts as live at `now`: it read (or
    /// waited in `next`) less than [`READ_GRACE`] ago.
    pub fn is_live(&self, now: Instant) -> bool {
        now < self.live_until(now)
    }

    /// Appends a chunk the run pulled at `now` (after [`Pace::Pull`]): it
    /// is queued when it fits; otherwise, while the consumer is live, held
    /// (the run then holds, [`pace`](Self::pace)).
    ///
    /// # Errors
    /// `output_limit` (`unread_output`, evidence unknown: never a
    /// fabricated exit, AC-7.3.1) when it does not fit and the consumer is
    /// stalled, or when a chunk is already held (the run pulled while told
    /// to hold); the chunk is kept for the consumer, and the shell ends the
    /// session with this error.
    pub fn push(&mut self, now: Instant, chunk: Bytes) -> Result<(), Error> {
        if self.held.is_none() {
            if self.fits(chunk.len()) {
                self.enqueue(chunk);
                return Ok(());
            }
            if self.is_live(now) {
                self.held = Some(chunk);
                return Ok(());
            }
        }
        self.release_held();
        self.enqueue(chunk);
        Err(overflow())
    }

    /// What the run does next at `now`: pull while nothing is held (or the
    /// session is over), hold while a chunk is held for a live consumer.
    ///
    /// # Errors
    /// `output_limit` (as [`push`](Self::push)) when a chunk is held and
    /// the consumer has not read for [`READ_GRACE`]: it is stalled. The
    /// held chunk is queued for the consumer; the shell ends the session.
    pub fn pace(&mut self, now: Instant) -> Result<Pace, Error> {
        if self.held.is_none() || self.closed.is_some() {
            return Ok(Pace::Pull);
        }
        let until = self.live_until(now);
        if now < until {
            return Ok(Pace::Hold(until));
        }
        self.release_held();
        Err(overflow())
    }

    /// Records the session's outcome (the first one stays).
    pub fn close(&mut self, outcome: Result<TerminalExit, Error>) {
        self.closed.get_or_insert(outcome);
    }

    /// The session's outcome, once recorded.
    pub fn outcome(&self) -> Option<Result<TerminalExit, Error>> {
        self.closed
    }

    /// The consumer reads at `now`: unread output first (then the held
    /// chunk, which moves into the queue as soon as it fits), then — and
    /// again on every later call — the outcome; `None` while neither.
    pub fn pop(&mut self, now: Instant) -> Option<TerminalEvent> {
        self.read_at(now);
        let chunk = match self.chunks.pop_front() {
            Some(b) => {
                self.bytes -= b.len();
                Some(b)
            }
            None => self.held.take(),
        };
        if let Some(b) = chunk {
            self.waiting_until = None;
            if self.held.as_ref().is_some_and(|h| self.fits(h.len())) {
                self.release_held();
            }
            return Some(TerminalEvent::Output(b));
        }
        self.closed.map(TerminalEvent::Closed)
    }

    fn read_at(&mut self, now: Instant) {
        self.last_read = self.last_read.max(now);
    }

    /// The end of the consumer's grace at `now`: [`READ_GRACE`] after its
    /// last read, a waiting `next` reading up to its deadline.
    fn live_until(&self, now: Instant) -> Instant {
        let mut read = self.last_read;
        if let Some(wait) = self.waiting_until {
            read = read.max(wait.min(now));
        }
        read + READ_GRACE
    }

    fn fits(&self, len: usize) -> bool {
        self.chunks.len() < MAX_UNREAD_CHUNKS && self.bytes + len <= self.max_bytes
    }

    fn enqueue(&mut self, chunk: Bytes) {
        self.bytes += chunk.len();
        self.chunks.push_back(chunk);
    }

    fn release_held(&mut self) {
        if let Some(h) = self.held.take() {
            self.enqueue(h);
        }
    }
}

#[cfg(test)]
mod tests;
