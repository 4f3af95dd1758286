//! The one drive loop of this shell (STYLE.md §2), generic over the core's
//! [`Machine`] contract: HTTP exchanges (and so streamed exec) and
//! terminals run on it.
//!
//! A [`Driver`] owns the connection and its buffers. One turn is three
//! steps, so a caller that shares its machine behind a lock (the terminal)
//! holds the lock only around the synchronous ones:
//!
//! 1. [`Driver::prepare`]: pull transmits (once the last batch is written)
//!    and read the machine's deadline and read pacing ([`Machine::wants_read`]);
//! 2. [`Driver::wait`]: write what is pending, read what arrives, or sleep
//!    until the deadline — whichever comes first;
//! 3. [`Driver::apply`]: feed what happened to the machine with
//!    `Instant::now()` (`handle_written`, `handle_input`, `handle_eof`,
//!    `handle_transport_error`, `handle_timeout`).
//!
//! The caller drains events between turns. The driver takes no protocol
//! decision: it never interprets a byte, and failures are the machine's to
//! turn into errors.

use std::future::poll_fn;
use std::pin::Pin;
use std::task::Poll;
use std::time::Instant;

use smolbox_core::{Machine, TransportFailure};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::transport::Connection;

/// Drives `machine` over `conn` (this shell's one loop) until it is
/// finished and everything it sent is written, or until `deadline`;
/// hands each event to `on_event` as it comes. For callers outside the
/// shell that bring their own [`Machine`], such as the conformance probe.
pub async fn drive<M: Machine>(
    conn: Connection,
    machine: &mut M,
    deadline: Instant,
    mut on_event: impl for<'a> FnMut(M::Event<'a>),
) {
    let mut driver = Driver::new(conn);
    loop {
        while let Some(ev) = machine.poll_event() {
            on_event(ev);
        }
        if machine.is_finished() && driver.is_flushed() {
            return;
        }
        let turn = driver.turn(machine);
        if tokio::time::timeout_at(deadline.into(), turn)
            .await
            .is_err()
        {
            return;
        }
    }
}

/// Bytes read per turn (and the size of the reused read buffer).
pub(crate) const READ_CHUNK: usize = 64 * 1024;
/// Largest batch of transmits pulled from a machine in one turn.
const MAX_TRANSMIT_BATCH: usize = 256 * 1024;

/// What [`Driver::wait`] should wait for.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Plan {
    deadline: Option<Instant>,
    read: bool,
}

/// What happened while waiting.
#[derive(Debug)]
pub(crate) enum Io {
    Wrote(usize),
    Flushed,
    Read(usize),
    WriteFailed,
    ReadFailed,
    /// The machine's deadline passed.
    Timer,
}

/// The write and read buffers of a [`Driver`], kept by the pool between
/// exchanges so that a request does not allocate (and zero) 64 KiB.
#[derive(Debug)]
pub(crate) struct Buffers {
    out: Vec<u8>,
    rbuf: Box<[u8]>,
}

/// Largest write buffer kept for reuse: one grown past it by a large
/// request is freed with its exchange, not kept by the pool.
pub(crate) const KEEP_OUT: usize = 64 * 1024;

impl Buffers {
    /// True when the pool may keep these for the next exchange.
    pub(crate) fn reusable(&self) -> bool {
        self.out.capacity() <= KEEP_OUT && self.rbuf.len() == READ_CHUNK
    }

    /// Buffers whose write buffer holds `n` bytes of capacity (tests).
    #[cfg(test)]
    pub(crate) fn with_out_capacity(n: usize) -> Self {
        Self {
            out: Vec::with_capacity(n),
            ..Self::default()
        }
    }
}

impl Default for Buffers {
    fn default() -> Self {
        Self {
            out: Vec::with_capacity(4096),
            rbuf: vec![0; READ_CHUNK].into_boxed_slice(),
        }
    }
}

/// A connection plus the write and read buffers of the loop.
#[derive(Debug)]
pub(crate) struct Driver {
    conn: Connection,
    out: Vec<u8>,
    out_pos: usize,
    need_flush: bool,
    rbuf: Box<[u8]>,
    eof: bool,
    write_broken: bool,
}

impl Driver {
    pub(crate) fn new(conn: Connection) -> Self {
        Self::with_buffers(conn, Buffers::default())
    }

    /// A driver over `conn` that reuses `buffers` (emptied; their memory
    /// is kept).
    pub(crate) fn with_buffers(conn: Connection, buffers: Buffers) -> Self {
        let Buffers { mut out, rbuf } = buffers;
        out.clear();
        Self {
            conn,
            out,
            out_pos: 0,
            need_flush: false,
            rbuf,
            eof: false,
            write_broken: false,
        }
    }

    /// The connection and the buffers, for reuse by the next exchange.
    pub(crate) fn into_parts(self) -> (Connection, Buffers) {
        (
            self.conn,
            Buffers {
                out: self.out,
                rbuf: self.rbuf,
            },
        )
    }

    /// True when every transmit pulled so far has been written and flushed.
    pub(crate) fn is_flushed(&self) -> bool {
        self.out_pos == self.out.len() && !self.need_flush
    }

    /// One whole turn (see the module docs).
    pub(crate) async fn turn<M: Machine + ?Sized>(&mut self, machine: &mut M) {
        let plan = self.prepare(machine);
        let io = self.wait(plan).await;
        self.apply(machine, io, Instant::now());
    }

    /// Step 1: pull transmits and plan the wait.
    pub(crate) fn prepare<M: Machine + ?Sized>(&mut self, machine: &mut M) -> Plan {
        if self.out_pos == self.out.len() {
            self.out.clear();
            self.out_pos = 0;
            while self.out.len() < MAX_TRANSMIT_BATCH && machine.poll_transmit(&mut self.out) {}
            if self.write_broken {
                self.out.clear();
            }
        }
        Plan {
            deadline: machine.poll_timeout().map(|(at, _)| at),
            read: !self.eof && machine.wants_read(),
        }
    }

    /// Step 2: write if something is pending (or flush), read if the plan
    /// says so, or wake at the deadline; whichever is ready first. Without
    /// anything to wait for it never returns (the caller races it against
    /// its own wake-ups).
    pub(crate) async fn wait(&mut self, plan: Plan) -> Io {
        let Self {
            conn,
            out,
            out_pos,
            need_flush,
            rbuf,
            ..
        } = self;
        let io = poll_fn(|cx| {
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
            if !plan.read {
                return Poll::Pending;
            }
            let mut buf = ReadBuf::new(&mut rbuf[..]);
            match Pin::new(&mut *conn).poll_read(cx, &mut buf) {
                Poll::Ready(Ok(())) => Poll::Ready(Io::Read(buf.filled().len())),
                Poll::Ready(Err(_)) => Poll::Ready(Io::ReadFailed),
                Poll::Pending => Poll::Pending,
            }
        });
        match plan.deadline {
            Some(at) => tokio::time::timeout_at(at.into(), io)
                .await
                .unwrap_or(Io::Timer),
            None => io.await,
        }
    }

    /// Step 3: feed what happened to the machine.
    pub(crate) fn apply<M: Machine + ?Sized>(&mut self, machine: &mut M, io: Io, now: Instant) {
        match io {
            Io::Wrote(n) => {
                self.out_pos += n;
                // TLS may hold records until flushed.
                self.need_flush = self.out_pos == self.out.len();
                machine.handle_written(now, n);
            }
            Io::Flushed => self.need_flush = false,
            Io::Read(0) => {
                self.eof = true;
                machine.handle_eof(now);
            }
            Io::Read(n) => machine.handle_input(now, &self.rbuf[..n]),
            Io::WriteFailed => {
                // Keep reading: the peer may still send (the machine decides).
                self.write_broken = true;
                self.out.clear();
                self.out_pos = 0;
                self.need_flush = false;
                machine.handle_transport_error(now, TransportFailure::Write);
            }
            Io::ReadFailed => {
                self.eof = true;
                machine.handle_transport_error(now, TransportFailure::Read);
            }
            Io::Timer => machine.handle_timeout(now),
        }
    }
}
