//! The thin drive loop (STYLE.md §2) shared by every core object.
//!
//! A [`Machine`] is the shape every core object has (`handle_input`,
//! `handle_eof`, `handle_timeout`, `poll_transmit`, `poll_timeout`); a
//! [`Driver`] owns the connection and performs one *turn* at a time: pull
//! transmits from the machine, then write what is pending, read what arrived,
//! or wake at the machine's deadline, and feed the result with
//! `Instant::now()`. Events are drained by the caller between turns. The
//! driver takes no protocol decision: it never interprets a byte.

use std::future::poll_fn;
use std::pin::Pin;
use std::task::Poll;
use std::time::Instant;

use smolbox_core::{Category, Error, Evidence, Operation};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::transport::Connection;

/// Bytes read per turn (and the size of the reused read buffer).
pub(crate) const READ_CHUNK: usize = 64 * 1024;
/// Largest batch of transmits pulled from a machine in one turn.
const MAX_TRANSMIT_BATCH: usize = 256 * 1024;

/// The sans-IO surface a driver needs; implemented beside each core type.
pub(crate) trait Machine {
    /// Bytes received.
    fn handle_input(&mut self, now: Instant, bytes: &[u8]);
    /// The peer closed its sending side.
    fn handle_eof(&mut self, now: Instant);
    /// The deadline reported by `poll_timeout` passed.
    fn handle_timeout(&mut self, now: Instant);
    /// Appends bytes to send to `out`; false when there was nothing.
    fn poll_transmit(&mut self, out: &mut Vec<u8>) -> bool;
    /// The next moment `handle_timeout` must be called.
    fn poll_timeout(&self) -> Option<Instant>;
}

/// What a turn did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Turn {
    /// Bytes were written, read or the peer closed; events may be ready.
    Progress,
    /// The machine's deadline passed and `handle_timeout` was called.
    Timeout,
    /// The caller's hard deadline passed (nothing was fed to the machine).
    HardDeadline,
    /// The peer closed, nothing is left to write and the machine set no
    /// deadline: no further turn can change anything.
    Stalled,
}

/// A connection plus the write and read buffers of the loop.
#[derive(Debug)]
pub(crate) struct Driver {
    conn: Connection,
    out: Vec<u8>,
    out_pos: usize,
    need_flush: bool,
    rbuf: Box<[u8]>,
    written: u64,
    eof: bool,
    operation: Operation,
}

impl Driver {
    pub(crate) fn new(conn: Connection, operation: Operation) -> Self {
        Self {
            conn,
            out: Vec::with_capacity(4096),
            out_pos: 0,
            need_flush: false,
            rbuf: vec![0; READ_CHUNK].into_boxed_slice(),
            written: 0,
            eof: false,
            operation,
        }
    }

    /// True when every transmit pulled so far has been written and flushed.
    pub(crate) fn is_flushed(&self) -> bool {
        self.out_pos == self.out.len() && !self.need_flush
    }

    /// Gives the connection back (for pooling).
    pub(crate) fn into_connection(self) -> Connection {
        self.conn
    }

    /// The evidence an I/O failure carries now.
    pub(crate) fn evidence(&self) -> Evidence {
        if self.written == 0 {
            Evidence::NotDispatched
        } else {
            Evidence::DispatchUncertain
        }
    }

    /// A transport error with the evidence of what was written.
    pub(crate) fn transport_error(&self, reason: &'static str) -> Error {
        Error::new(Category::Transport, self.operation, self.evidence()).with_reason(reason)
    }

    /// One turn of the loop: pull transmits, then wait until bytes could be
    /// written, bytes arrived, the peer closed, the machine's deadline or the
    /// hard deadline; feed what happened to the machine.
    ///
    /// # Errors
    /// `transport` when the connection fails (`write_failed`, `read_failed`),
    /// with `not_dispatched` only when not one byte was written.
    pub(crate) async fn turn<M: Machine + ?Sized>(
        &mut self,
        machine: &mut M,
        hard_deadline: Option<Instant>,
    ) -> Result<Turn, Error> {
        self.pull_transmits(machine);
        let machine_deadline = machine.poll_timeout();
        let deadline = match (machine_deadline, hard_deadline) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if let Some(at) = deadline {
            let now = Instant::now();
            if at <= now {
                return Ok(self.expire(machine, machine_deadline, now));
            }
        }
        if self.eof && self.is_flushed() {
            return match deadline {
                None => Ok(Turn::Stalled),
                Some(at) => {
                    tokio::time::sleep_until(at.into()).await;
                    Ok(self.expire(machine, machine_deadline, Instant::now()))
                }
            };
        }
        let io = self.io_once();
        let outcome = match deadline {
            Some(at) => match tokio::time::timeout_at(at.into(), io).await {
                Ok(o) => o,
                Err(_) => return Ok(self.expire(machine, machine_deadline, Instant::now())),
            },
            None => io.await,
        };
        let now = Instant::now();
        match outcome {
            Io::Wrote(n) => {
                self.written += n as u64;
                self.out_pos += n;
                if self.out_pos == self.out.len() {
                    self.out.clear();
                    self.out_pos = 0;
                    self.need_flush = true;
                }
            }
            Io::Flushed => self.need_flush = false,
            Io::Read(0) => {
                self.eof = true;
                machine.handle_eof(now);
            }
            Io::Read(n) => machine.handle_input(now, &self.rbuf[..n]),
            Io::WriteFailed => return Err(self.transport_error("write_failed")),
            Io::ReadFailed => return Err(self.transport_error("read_failed")),
        }
        Ok(Turn::Progress)
    }

    fn pull_transmits<M: Machine + ?Sized>(&mut self, machine: &mut M) {
        if self.out_pos == self.out.len() {
            self.out.clear();
            self.out_pos = 0;
        }
        while self.out.len() < MAX_TRANSMIT_BATCH && machine.poll_transmit(&mut self.out) {}
    }

    fn expire<M: Machine + ?Sized>(
        &mut self,
        machine: &mut M,
        machine_deadline: Option<Instant>,
        now: Instant,
    ) -> Turn {
        if machine_deadline.is_some_and(|at| at <= now) {
            machine.handle_timeout(now);
            Turn::Timeout
        } else {
            Turn::HardDeadline
        }
    }

    /// One I/O step: write if something is pending (or flush), and read
    /// unless the peer already closed; whichever is ready first.
    async fn io_once(&mut self) -> Io {
        let Self {
            conn,
            out,
            out_pos,
            need_flush,
            rbuf,
            eof,
            ..
        } = self;
        poll_fn(|cx| {
            if *out_pos < out.len() {
                match Pin::new(&mut *conn).poll_write(cx, &out[*out_pos..]) {
                    Poll::Ready(Ok(0) | Err(_)) => return Poll::Ready(Io::WriteFailed),
                    Poll::Ready(Ok(n)) => return Poll::Ready(Io::Wrote(n)),
                    Poll::Pending => {}
                }
            } else if *need_flush {
                match Pin::new(&mut *conn).poll_flush(cx) {
                    Poll::Ready(Ok(())) => return Poll::Ready(Io::Flushed),
                    Poll::Ready(Err(_)) => return Poll::Ready(Io::WriteFailed),
                    Poll::Pending => {}
                }
            }
            if *eof {
                // Nothing more can arrive; only the pending write can move.
                return Poll::Pending;
            }
            let mut buf = ReadBuf::new(&mut rbuf[..]);
            match Pin::new(&mut *conn).poll_read(cx, &mut buf) {
                Poll::Ready(Ok(())) => Poll::Ready(Io::Read(buf.filled().len())),
                Poll::Ready(Err(_)) => Poll::Ready(Io::ReadFailed),
                Poll::Pending => Poll::Pending,
            }
        })
        .await
    }
}

enum Io {
    Wrote(usize),
    Flushed,
    Read(usize),
    WriteFailed,
    ReadFailed,
}
