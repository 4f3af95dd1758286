//! One connection and the one loop of this shell (STYLE.md §2), generic
//! over the core's [`Machine`] contract: HTTP exchanges (and so streamed
//! exec) and terminals run on it.
//!
//! A [`Conn`] owns a non-blocking [`Stream`], the `mio::Poll` it is
//! registered with (edge-triggered, one socket per poll), a reusable read
//! buffer and the *parked* transmit: bytes the core handed out that the
//! socket has not taken yet. One turn of the loop ([`Conn::turn`]):
//!
//! 1. flush: write parked bytes, then pull more from the core with
//!    `poll_transmit` only once the parked ones are gone, stopping at
//!    `WouldBlock` (the rest stays parked: never dropped, never retried in a
//!    spin);
//! 2. the caller drains events (between turns);
//! 3. wait in `mio::Poll::poll` until the socket is ready or the earliest of
//!    the core's `poll_timeout` and the caller's own deadline, unless the
//!    socket is already known to be readable;
//! 4. read until `WouldBlock` (at most [`READS_PER_TURN`] reads, so events
//!    are delivered between bursts), feeding each chunk with `Instant::now()`;
//! 5. call `handle_timeout` when the core's deadline has passed.
//!
//! What the socket took goes to `handle_written`; a socket failure goes to
//! `handle_transport_error` (the core decides the error and its evidence).
//!
//! Readiness is remembered in two flags (`maybe_readable`,
//! `maybe_writable`) that only a `WouldBlock` clears, so a socket whose edge
//! was consumed while the core did not want input is read again without
//! waiting for another event.

use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::{Duration, Instant};

use mio::{Events, Interest, Poll, Token};
use smolbox_core::{Error, Machine, TransportFailure};

use crate::errors::ConnectError;
use crate::transport::{SocketTarget, Stream};
use smolbox_tls::{Target, unix_socket_facts};

/// Size of the per-connection read buffer.
pub(crate) const READ_CHUNK: usize = 16 * 1024;
/// Reads per turn before events are delivered again (8 × 16 KiB stays
/// under the exec stream decoder's 256 KiB input cap).
pub(crate) const READS_PER_TURN: usize = 8;
/// The core's transmits pulled into the parked buffer per flush, at most.
const PULL_LIMIT: usize = 64 * 1024;
const TOKEN: Token = Token(0);

/// A connected stream with its poll, read buffer and parked transmit.
#[derive(Debug)]
pub(crate) struct Conn {
    stream: Stream,
    poll: Poll,
    events: Events,
    parked: Vec<u8>,
    parked_pos: usize,
    rbuf: Box<[u8]>,
    maybe_readable: bool,
    maybe_writable: bool,
    eof: bool,
    /// Bytes handed to the transport since [`Conn::reset_sent`]. Once this
    /// is non-zero a request byte may have left the process.
    sent: u64,
    /// Bytes read so far.
    received: u64,
    /// Writing failed: nothing more is written.
    write_broken: bool,
}

impl Conn {
    /// Connects (and completes the TLS handshake) before `deadline`.
    pub(crate) fn connect(target: &SocketTarget, deadline: Instant) -> Result<Self, ConnectError> {
        let (host, port, tls) = match &target.kind {
            Target::Unix { path } => {
                let facts = unix_socket_facts(path).map_err(|_| ConnectError::Refused)?;
                smolbox_core::worker::check_unix_socket(facts).map_err(ConnectError::Unsafe)?;
                let stream = Stream::unix(path).map_err(|_| ConnectError::Refused)?;
                return Self::establish(stream, deadline);
            }
            Target::Tcp { host, port } => (host, *port, None),
            Target::Tls {
                host,
                port,
                name,
                connector,
            } => (host, *port, Some((connector, name))),
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let mut addrs = resolve(host, port, deadline)?;
        if tls.is_none() {
            // Plain HTTP goes to loopback addresses only, whatever the
            // resolver says `localhost` is (the decision is core's).
            addrs.retain(|a| smolbox_core::worker::plain_http_address_allowed(a.ip()));
            if addrs.is_empty() {
                return Err(ConnectError::NotLoopback);
            }
        }
        let mut last = ConnectError::Refused;
        for addr in addrs {
            if Instant::now() >= deadline {
                return Err(ConnectError::Timeout);
            }
            let Ok(sock) = Stream::tcp(addr) else {
                continue;
            };
            let stream = match tls {
                Some((config, name)) => {
                    Stream::tls(sock, config, name).map_err(|_| ConnectError::Tls)?
                }
                None => Stream::Tcp(sock),
            };
            match Self::establish(stream, deadline) {
                Ok(conn) => return Ok(conn),
                Err(e @ (ConnectError::Timeout | ConnectError::Tls)) => return Err(e),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    fn establish(mut stream: Stream, deadline: Instant) -> Result<Self, ConnectError> {
        let poll = Poll::new().map_err(|_| ConnectError::Refused)?;
        poll.registry()
            .register(
                stream.source(),
                TOKEN,
                Interest::READABLE | Interest::WRITABLE,
            )
            .map_err(|_| ConnectError::Refused)?;
        let mut conn = Self {
            stream,
            poll,
            events: Events::with_capacity(4),
            parked: Vec::new(),
            parked_pos: 0,
            rbuf: vec![0; READ_CHUNK].into_boxed_slice(),
            maybe_readable: false,
            maybe_writable: false,
            eof: false,
            sent: 0,
            received: 0,
            write_broken: false,
        };
        // TCP / Unix connect completes with a writable edge.
        loop {
            match conn.stream.finish_connect() {
                Ok(true) => break,
                Ok(false) => {}
                Err(_) => return Err(ConnectError::Refused),
            }
            conn.wait_until(Some(deadline))
                .map_err(|_| ConnectError::Refused)?;
            if !conn.maybe_writable && Instant::now() >= deadline {
                return Err(ConnectError::Timeout);
            }
        }
        while conn.stream.is_handshaking() {
            match conn.stream.handshake_step() {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        return Err(ConnectError::Timeout);
                    }
                    conn.maybe_readable = false;
                    conn.maybe_writable = false;
                    conn.wait_until(Some(deadline))
                        .map_err(|_| ConnectError::Tls)?;
                }
                Err(_) => return Err(ConnectError::Tls),
            }
        }
        if conn.stream.is_handshaking() {
            return Err(ConnectError::Tls);
        }
        // Readiness is unknown after the handshake: try reading first.
        conn.maybe_readable = true;
        conn.maybe_writable = true;
        Ok(conn)
    }

    /// Bytes handed to the transport since the last [`Conn::reset_sent`].
    #[cfg(test)]
    pub(crate) fn sent(&self) -> u64 {
        self.sent
    }

    /// Starts counting sent bytes for a new exchange.
    pub(crate) fn reset_sent(&mut self) {
        self.sent = 0;
    }

    /// Bytes read so far.
    pub(crate) fn received(&self) -> u64 {
        self.received
    }

    /// Picks up readiness that arrived since the last wait, without
    /// waiting.
    pub(crate) fn refresh_readiness(&mut self) {
        let _ = self.wait_until(Some(Instant::now()));
    }

    /// True when the peer closed the connection.
    pub(crate) fn is_eof(&self) -> bool {
        self.eof
    }

    /// True when core bytes are parked (or TLS records are pending).
    pub(crate) fn has_parked(&self) -> bool {
        self.parked_pos < self.parked.len() || self.stream.wants_write()
    }

    /// One turn of the loop (see the module docs). Returns after at most one
    /// wait, so the caller can drain events and check its own deadline.
    /// Socket failures are fed to the machine.
    pub(crate) fn turn<M: Machine + ?Sized>(
        &mut self,
        machine: &mut M,
        caller_deadline: Option<Instant>,
    ) {
        self.flush_or_fail(machine);
        let want_read = machine.wants_read() && !self.eof;
        let can_write = self.maybe_writable && self.has_parked();
        let ready = can_write || (want_read && self.maybe_readable);
        if !ready {
            let deadline = min_opt(machine.poll_timeout().map(|(at, _)| at), caller_deadline);
            if deadline.is_none() && !want_read && !self.has_parked() {
                // Nothing can ever happen again: the machine decides what
                // the dead connection means.
                if !machine.is_finished() {
                    self.eof = true;
                    machine.handle_transport_error(Instant::now(), TransportFailure::Read);
                }
                return;
            }
            if deadline.is_none_or(|at| at > Instant::now()) && self.wait_until(deadline).is_err() {
                self.eof = true;
                machine.handle_transport_error(Instant::now(), TransportFailure::Read);
                return;
            }
            self.flush_or_fail(machine);
        }
        if machine.wants_read() && !self.eof && self.read_into(machine).is_err() {
            self.eof = true;
            self.maybe_readable = false;
            machine.handle_transport_error(Instant::now(), TransportFailure::Read);
        }
        let now = Instant::now();
        if machine.poll_timeout().is_some_and(|(at, _)| at <= now) {
            machine.handle_timeout(now);
        }
        // What the input or timer produced (a pong, a close echo) goes out
        // now, not at the next call.
        self.flush_or_fail(machine);
    }

    /// Writes what the socket takes now; a write failure goes to the
    /// machine and nothing more is written.
    pub(crate) fn flush_or_fail<M: Machine + ?Sized>(&mut self, machine: &mut M) {
        if self.write_broken {
            return;
        }
        if self.flush(machine).is_err() {
            self.write_broken = true;
            self.parked.clear();
            self.parked_pos = 0;
            machine.handle_transport_error(Instant::now(), TransportFailure::Write);
        }
    }

    /// Writes parked bytes, then pulls and writes more from the machine,
    /// until `WouldBlock` or nothing is left; what the socket took goes to
    /// `handle_written`.
    fn flush<M: Machine + ?Sized>(&mut self, machine: &mut M) -> io::Result<()> {
        loop {
            if self.parked_pos == self.parked.len() {
                self.parked.clear();
                self.parked_pos = 0;
                while self.parked.len() < PULL_LIMIT && machine.poll_transmit(&mut self.parked) {}
                if self.parked.is_empty() {
                    break;
                }
            }
            if !self.maybe_writable {
                return Ok(());
            }
            match self.stream.write(&self.parked[self.parked_pos..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    self.parked_pos += n;
                    self.sent += n as u64;
                    machine.handle_written(Instant::now(), n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.maybe_writable = false;
                    return Ok(());
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        match self.stream.flush_pending() {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                self.maybe_writable = false;
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Reads until `WouldBlock`, end of stream, or [`READS_PER_TURN`]
    /// reads, feeding every chunk to the machine.
    fn read_into<M: Machine + ?Sized>(&mut self, machine: &mut M) -> io::Result<()> {
        for _ in 0..READS_PER_TURN {
            if !machine.wants_read() {
                return Ok(());
            }
            match self.stream.read(&mut self.rbuf) {
                Ok(0) => {
                    self.eof = true;
                    self.maybe_readable = false;
                    machine.handle_eof(Instant::now());
                    return Ok(());
                }
                Ok(n) => {
                    self.received += n as u64;
                    machine.handle_input(Instant::now(), &self.rbuf[..n]);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.maybe_readable = false;
                    return Ok(());
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Waits for readiness or `deadline` and records what became ready.
    fn wait_until(&mut self, deadline: Option<Instant>) -> io::Result<()> {
        // mio rounds a timeout up to the clock's granularity, so a wake-up
        // never comes before the deadline.
        let timeout = deadline.map(|at| at.saturating_duration_since(Instant::now()));
        match self.poll.poll(&mut self.events, timeout) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok(()),
            Err(e) => return Err(e),
        }
        for event in &self.events {
            if event.is_readable() || event.is_read_closed() || event.is_error() {
                self.maybe_readable = true;
            }
            if event.is_writable() || event.is_write_closed() || event.is_error() {
                self.maybe_writable = true;
            }
        }
        Ok(())
    }

    /// Waits until the peer's end (FIN or reset) reached this socket, or
    /// `deadline`; true when it did. For tests that need a reset to have
    /// arrived before the first write.
    #[cfg(test)]
    pub(crate) fn wait_for_peer_end(&mut self, deadline: Instant) -> bool {
        while Instant::now() < deadline {
            if self.wait_until(Some(deadline)).is_err() {
                return false;
            }
            if self
                .events
                .iter()
                .any(|e| e.is_read_closed() || e.is_error())
            {
                return true;
            }
        }
        false
    }

    /// True when an idle pooled connection is still usable: no bytes, no
    /// end of stream and no error are waiting on it.
    pub(crate) fn is_idle_usable(&mut self) -> bool {
        if self.eof || self.has_parked() {
            return false;
        }
        if self
            .poll
            .poll(&mut self.events, Some(Duration::ZERO))
            .is_err()
        {
            return false;
        }
        let mut probe = [0u8; 1];
        match self.stream.read(&mut probe) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                self.maybe_readable = false;
                true
            }
            _ => false,
        }
    }

    /// Writes all of `bytes`, waiting for the socket as needed, until
    /// `deadline` (`TimedOut` then). For raw use (the probe).
    pub(crate) fn write_all_until(
        &mut self,
        mut bytes: &[u8],
        deadline: Option<Instant>,
    ) -> io::Result<()> {
        loop {
            if bytes.is_empty() {
                match self.stream.flush_pending() {
                    Ok(()) => return Ok(()),
                    Err(e) if e.kind() != io::ErrorKind::WouldBlock => return Err(e),
                    Err(_) => {}
                }
            } else {
                match self.stream.write(bytes) {
                    Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                    Ok(n) => {
                        bytes = &bytes[n..];
                        self.sent += n as u64;
                        continue;
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) if e.kind() != io::ErrorKind::WouldBlock => return Err(e),
                    Err(_) => {}
                }
            }
            self.maybe_writable = false;
            if deadline.is_some_and(|at| Instant::now() >= at) {
                return Err(io::ErrorKind::TimedOut.into());
            }
            self.wait_until(deadline)?;
        }
    }

    /// Reads what is available into `buf`, waiting until `deadline`
    /// (`TimedOut` then). `Ok(0)` is the end of the stream.
    pub(crate) fn read_until(
        &mut self,
        buf: &mut [u8],
        deadline: Option<Instant>,
    ) -> io::Result<usize> {
        loop {
            match self.stream.read(buf) {
                Ok(n) => {
                    self.received += n as u64;
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() != io::ErrorKind::WouldBlock => return Err(e),
                Err(_) => {}
            }
            self.maybe_readable = false;
            if deadline.is_some_and(|at| Instant::now() >= at) {
                return Err(io::ErrorKind::TimedOut.into());
            }
            self.wait_until(deadline)?;
        }
    }

    /// True unless the last write met `WouldBlock` and no writable event
    /// came since.
    #[cfg(test)]
    pub(crate) fn may_write(&self) -> bool {
        self.maybe_writable
    }

    /// Closes the sending side (plain streams only; tests).
    #[cfg(test)]
    pub(crate) fn shutdown_write(&mut self) {
        if let Stream::Tcp(s) = &self.stream {
            let _ = s.shutdown(std::net::Shutdown::Write);
        }
    }

    /// Shuts the connection down (best effort).
    pub(crate) fn shutdown(&mut self) {
        self.stream.shutdown();
    }
}

fn min_opt(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, None) => a,
        (None, b) => b,
    }
}

/// Most name resolutions running at once on their own threads.
const MAX_RESOLVERS: usize = 16;

/// Lookups in flight on helper threads, and how many may be.
struct Resolvers {
    running: std::sync::atomic::AtomicUsize,
    max: usize,
}

/// The process's resolver threads.
static RESOLVERS: Resolvers = Resolvers {
    running: std::sync::atomic::AtomicUsize::new(0),
    max: MAX_RESOLVERS,
};

/// The platform resolver (blocks without a timeout).
fn system_lookup(name: String, port: u16) -> io::Result<Vec<SocketAddr>> {
    (name.as_str(), port)
        .to_socket_addrs()
        .map(Iterator::collect::<Vec<_>>)
}

/// Resolves `host` within `deadline`. A literal address needs no lookup;
/// a name is looked up on a helper thread (the platform resolver blocks
/// without a timeout), so a stuck resolver costs the connect budget, not
/// the caller's thread. `localhost` is the loopback without a lookup
/// (RFC 6761 §6.3). At most [`MAX_RESOLVERS`] lookups run at once; a
/// lookup past the deadline is abandoned (its thread ends when the resolver
/// returns).
fn resolve(host: &str, port: u16, deadline: Instant) -> Result<Vec<SocketAddr>, ConnectError> {
    resolve_with(&RESOLVERS, system_lookup, host, port, deadline)
}

/// [`resolve`] with the resolver threads' bound and the lookup given.
fn resolve_with(
    resolvers: &'static Resolvers,
    lookup: fn(String, u16) -> io::Result<Vec<SocketAddr>>,
    host: &str,
    port: u16,
    deadline: Instant,
) -> Result<Vec<SocketAddr>, ConnectError> {
    use std::sync::atomic::Ordering;
    if let Ok(ip) = host.parse::<std::net::IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    if host.eq_ignore_ascii_case("localhost") {
        // RFC 6761 §6.3: `localhost` is the loopback, without a lookup.
        return Ok(vec![
            SocketAddr::from(([127, 0, 0, 1], port)),
            SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, port)),
        ]);
    }
    if resolvers.running.fetch_add(1, Ordering::SeqCst) >= resolvers.max {
        resolvers.running.fetch_sub(1, Ordering::SeqCst);
        return Err(ConnectError::Resolve);
    }
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    let name = host.to_owned();
    let spawned = std::thread::Builder::new()
        .name("smolbox-resolve".into())
        .spawn(move || {
            let r = lookup(name, port);
            resolvers.running.fetch_sub(1, Ordering::SeqCst);
            let _ = tx.send(r);
        });
    if spawned.is_err() {
        resolvers.running.fetch_sub(1, Ordering::SeqCst);
        return Err(ConnectError::Resolve);
    }
    match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        Ok(Ok(addrs)) => Ok(addrs),
        Ok(Err(_)) | Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            Err(ConnectError::Resolve)
        }
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Err(ConnectError::Timeout),
    }
}

/// One byte stream to a worker (or any peer), for raw use such as the
/// conformance probe: blocking reads and writes bounded by a deadline, on
/// the same mio loop as the client.
#[derive(Debug)]
pub struct Connection {
    conn: Conn,
}

impl SocketTarget {
    /// Opens a connection before `deadline` (TLS handshake included).
    /// Nothing has been written when this fails, so errors carry
    /// `not_dispatched`.
    ///
    /// # Errors
    /// `transport` with reason `connect_timeout`, `connect_failed` or
    /// `tls_handshake`.
    pub fn connect(
        &self,
        deadline: Instant,
        operation: smolbox_core::Operation,
    ) -> Result<Connection, Error> {
        Conn::connect(self, deadline)
            .map(|conn| Connection { conn })
            .map_err(|e| crate::errors::connect(operation, &e))
    }
}

impl Connection {
    /// Drives `machine` over this connection (the shell's one loop, as for
    /// its own exchanges) until it is finished and everything it sent is
    /// written, or until `deadline`; hands each event to `on_event` as it
    /// comes. For callers that bring their own [`Machine`], such as the
    /// conformance probe.
    pub fn drive<M: Machine>(
        &mut self,
        machine: &mut M,
        deadline: Instant,
        mut on_event: impl for<'a> FnMut(M::Event<'a>),
    ) {
        loop {
            while let Some(ev) = machine.poll_event() {
                on_event(ev);
            }
            if machine.is_finished() && !self.conn.has_parked() {
                return;
            }
            if Instant::now() >= deadline {
                return;
            }
            self.conn.turn(machine, Some(deadline));
        }
    }

    /// Writes all of `bytes` (and flushes TLS records), waiting until
    /// `deadline` at most.
    ///
    /// # Errors
    /// `TimedOut` at the deadline; the socket's errors.
    pub fn write_all_until(&mut self, bytes: &[u8], deadline: Option<Instant>) -> io::Result<()> {
        self.conn.write_all_until(bytes, deadline)
    }

    /// Reads what arrived into `buf`, waiting until `deadline` at most;
    /// `Ok(0)` is the end of the stream.
    ///
    /// # Errors
    /// `TimedOut` at the deadline; the socket's errors (a TLS peer that
    /// closed without `close_notify` is `UnexpectedEof`).
    pub fn read_until(&mut self, buf: &mut [u8], deadline: Option<Instant>) -> io::Result<usize> {
        self.conn.read_until(buf, deadline)
    }
}

#[cfg(test)]
mod resolver_tests {
    #![allow(clippy::unwrap_used)] // tests: a panic is the failure report
    use std::sync::Mutex;
    use std::sync::atomic::AtomicUsize;
    use std::sync::mpsc::{Receiver, Sender, channel};

    use super::*;

    /// The lookups of the test: each says it started, then waits for a
    /// release (a lookup that hangs until the test lets it go).
    static STARTED: Mutex<Option<Sender<()>>> = Mutex::new(None);
    static RELEASE: Mutex<Option<Receiver<()>>> = Mutex::new(None);
    static BOUNDED: Resolvers = Resolvers {
        running: AtomicUsize::new(0),
        max: MAX_RESOLVERS,
    };

    fn hanging_lookup(_name: String, port: u16) -> io::Result<Vec<SocketAddr>> {
        if let Some(tx) = STARTED.lock().unwrap().as_ref() {
            tx.send(()).unwrap();
        }
        let released = RELEASE.lock().unwrap().as_ref().map(Receiver::recv);
        assert!(matches!(released, Some(Ok(()))));
        Ok(vec![SocketAddr::from(([127, 0, 0, 1], port))])
    }

    #[test]
    fn at_most_sixteen_lookups_run_at_once_and_a_freed_slot_is_reused() {
        let (started_tx, started) = channel();
        let (release, release_rx) = channel();
        *STARTED.lock().unwrap() = Some(started_tx);
        *RELEASE.lock().unwrap() = Some(release_rx);
        let far = Instant::now() + Duration::from_secs(600);
        let (done_tx, done) = channel();
        for i in 0..MAX_RESOLVERS {
            let done_tx = done_tx.clone();
            std::thread::spawn(move || {
                let r = resolve_with(&BOUNDED, hanging_lookup, &format!("n{i}.test"), 1, far);
                done_tx.send(r).unwrap();
            });
        }
        for _ in 0..MAX_RESOLVERS {
            started.recv().unwrap();
        }
        // N = 16 lookups hang; the 17th is refused at once, unsent.
        assert!(matches!(
            resolve_with(&BOUNDED, hanging_lookup, "n16.test", 1, far),
            Err(ConnectError::Resolve)
        ));
        assert!(started.try_recv().is_err(), "the 17th lookup never started");
        // Release one: its caller gets the address, and its slot is free
        // again (the count drops before the answer is sent).
        release.send(()).unwrap();
        let first = done.recv().unwrap().unwrap();
        assert_eq!(first, vec![SocketAddr::from(([127, 0, 0, 1], 1))]);
        std::thread::spawn(move || {
            let r = resolve_with(&BOUNDED, hanging_lookup, "n17.test", 1, far);
            done_tx.send(r).unwrap();
        });
        started.recv().unwrap();
        for _ in 0..MAX_RESOLVERS {
            release.send(()).unwrap();
        }
        for _ in 0..MAX_RESOLVERS {
            assert!(done.recv().unwrap().is_ok());
        }
        assert_eq!(BOUNDED.running.load(std::sync::atomic::Ordering::SeqCst), 0);
    }

    #[test]
    fn a_lookup_past_the_deadline_is_a_timeout_and_literals_need_none() {
        static ONE: Resolvers = Resolvers {
            running: AtomicUsize::new(0),
            max: 1,
        };
        fn never(_: String, _: u16) -> io::Result<Vec<SocketAddr>> {
            // Parks until the process ends: a resolver that never answers.
            loop {
                std::thread::park();
            }
        }
        let soon = Instant::now() + Duration::from_millis(20);
        assert!(matches!(
            resolve_with(&ONE, never, "stuck.test", 1, soon),
            Err(ConnectError::Timeout)
        ));
        // The stuck lookup still holds the only slot: a second is refused.
        assert!(matches!(
            resolve_with(&ONE, never, "other.test", 1, soon),
            Err(ConnectError::Resolve)
        ));
        // Literals and localhost never take a slot.
        assert!(resolve_with(&ONE, never, "127.0.0.1", 1, soon).is_ok());
        assert_eq!(
            resolve_with(&ONE, never, "LOCALHOST", 1, soon)
                .unwrap()
                .len(),
            2
        );
    }
}
