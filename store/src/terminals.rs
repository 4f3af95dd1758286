//! The managed terminals' shell-independent half (features C7.3, C7.4),
//! written once for `smolbox-tokio` and `smolbox-blocking`: [`Terminals`]
//! holds the store, the options, the workers' clients and the clock, and
//! the [`LiveSet`] (runs driven here, live connections) behind one lock,
//! and feeds a run's inputs with the clock's time. A shell keeps only its
//! waiting (for registrations, output and the ends of runs), its tasks or
//! threads, the low-level terminal and its public surface.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use smolbox_core::Error;
use smolbox_core::managed::controller::OpId;
use smolbox_core::managed::controller::terminal::{TermConfig, TermStoreResult, TerminalRun};
use smolbox_core::managed::live::{
    DueRow, LiveSet, OutputBuffer, Pace, TermCommand, consumer_lost, unknown_worker,
};
use smolbox_core::managed::spec::ManagedTerminalSpec;
use smolbox_core::managed::terminal::ConsumerId;
use smolbox_core::managed::{ExecutionRecord, FingerprintKey, RecordKey};
use smolbox_core::terminal::{TerminalExit, TerminalSpec};

use crate::Store;
use crate::clock::Clock;

/// A shell's handle on one live connection: how commands reach the task
/// or thread that owns it, and the consumer's output buffer with how the
/// shell wakes the consumer waiting on it.
pub trait LiveConn {
    /// Hands `cmd` to the connection's task; false when it is gone.
    fn send(&self, cmd: TermCommand) -> bool;
    /// The consumer's bounded output buffer.
    fn buffer(&self) -> &Mutex<OutputBuffer>;
    /// Wakes the consumer waiting for the buffer.
    fn wake_reader(&self);
}

impl<T: LiveConn + ?Sized> LiveConn for Arc<T> {
    fn send(&self, cmd: TermCommand) -> bool {
        T::send(self, cmd)
    }
    fn buffer(&self) -> &Mutex<OutputBuffer> {
        T::buffer(self)
    }
    fn wake_reader(&self) {
        T::wake_reader(self);
    }
}

/// The open connection of a run's task or thread: the shell's low-level
/// terminal `T` and its live handle (whose buffer holds the spec's bound).
#[derive(Debug)]
pub struct Conn<T, L> {
    /// The low-level terminal.
    pub term: T,
    /// What the consumer reads from.
    pub live: L,
}

/// Locks `m`; a poisoned lock is still read (the data is plain).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The runtime's managed terminals, without their waiting (see the module
/// docs): `L` is the shell's live-connection handle, `C` its worker client.
pub struct Terminals<L, C> {
    store: Arc<dyn Store>,
    fp_key: FingerprintKey,
    cfg: TermConfig,
    clients: BTreeMap<String, C>,
    clock: Arc<dyn Clock>,
    state: Mutex<LiveSet<L>>,
}

impl<L, C> std::fmt::Debug for Terminals<L, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Terminals").finish_non_exhaustive()
    }
}

impl<L: LiveConn + Clone, C> Terminals<L, C> {
    /// Terminals over `store` for the workers in `clients`, with the
    /// controller options `cfg`, registering at most `limit` sessions (the
    /// runtime's active-task limit, 1–64).
    ///
    /// # Errors
    /// `validation` (operation `config`) for a bad limit.
    pub fn new(
        store: Arc<dyn Store>,
        fp_key: FingerprintKey,
        cfg: TermConfig,
        clients: BTreeMap<String, C>,
        clock: Arc<dyn Clock>,
        limit: usize,
    ) -> Result<Self, Error> {
        Ok(Self {
            store,
            fp_key,
            cfg,
            clients,
            clock,
            state: Mutex::new(LiveSet::new(limit)?),
        })
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The clock's wall-clock milliseconds.
    pub fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// The clock's monotonic now (the time of the output buffers' pacing).
    pub fn now(&self) -> Instant {
        self.clock.now()
    }

    /// The runs and connections, for a shell that waits on their lock.
    pub fn state(&self) -> &Mutex<LiveSet<L>> {
        &self.state
    }

    /// Locks the runs and connections.
    pub fn lock(&self) -> MutexGuard<'_, LiveSet<L>> {
        lock(&self.state)
    }

    /// A new run for `open` and whether it drives the key
    /// ([`LiveSet::open_run`]).
    ///
    /// # Errors
    /// The run's validation of `spec`.
    pub fn open_run(
        &self,
        key: RecordKey,
        machine: RecordKey,
        spec: ManagedTerminalSpec,
    ) -> Result<(TerminalRun, bool), Error> {
        self.lock()
            .open_run(self.cfg.clone(), self.fp_key.clone(), key, machine, spec)
    }

    /// The recovering run of `key` from its stored record `fetched`
    /// ([`LiveSet::resume_run`]; the key was marked with
    /// [`LiveSet::begin_run`]).
    ///
    /// # Errors
    /// As [`LiveSet::resume_run`].
    pub fn resume_run(
        &self,
        key: &RecordKey,
        fetched: Result<ExecutionRecord, Error>,
    ) -> Result<TerminalRun, Error> {
        let (now, now_ms) = (self.clock.now(), self.clock.now_ms());
        self.lock().resume_run(
            self.cfg.clone(),
            self.fp_key.clone(),
            key,
            fetched,
            now,
            now_ms,
        )
    }

    /// In `st` (the locked state): binds the caller as the one consumer of
    /// `key` once its connection is registered, after ending connections
    /// nobody attached to in time.
    ///
    /// # Errors
    /// As [`LiveSet::attach`].
    pub fn attach(
        &self,
        st: &mut LiveSet<L>,
        key: &RecordKey,
    ) -> Result<Option<(ConsumerId, L)>, Error> {
        st.attach(self.clock.now(), key, end)
    }

    /// A due-scan row of a managed terminal (`ControllerEvent::TerminalDue`):
    /// the core decides ([`LiveSet::due_row`]); `Some(key)` when the shell
    /// is to recover the key (no run of it here), `None` when a live run
    /// here takes the row at its next input.
    pub fn due(&self, row: ExecutionRecord) -> Option<RecordKey> {
        match self.lock().due_row(row) {
            DueRow::Recover(key) => Some(key),
            DueRow::Kept => None,
        }
    }

    /// A cancel of `key` was persisted: its run here (if any) acts on it.
    pub fn cancelled(&self, key: &RecordKey) {
        if let Some(live) = self.lock().owner_get(key) {
            live.send(TermCommand::Cancel);
        }
    }

    /// The client of `worker_id`.
    ///
    /// # Errors
    /// `unsupported_capability` (`unknown_worker`, nothing sent).
    pub fn client(&self, worker_id: &str) -> Result<&C, Error> {
        self.clients.get(worker_id).ok_or_else(unknown_worker)
    }

    /// Registers the just-opened connection `live` of `key`.
    ///
    /// # Errors
    /// As [`LiveSet::register`].
    pub fn register(&self, key: &RecordKey, live: L, attach_wait: Duration) -> Result<(), Error> {
        self.lock()
            .register(self.clock.now(), key.clone(), live, attach_wait)
    }

    /// The low-level terminal `term` of `key` just opened (for the
    /// low-level `spec`): registers its live handle `live` (the spec's
    /// attach wait; its buffer was made with [`Terminals::buffer`]) and
    /// returns the run's connection.
    ///
    /// # Errors
    /// As [`LiveSet::register`].
    pub fn connect<T>(
        &self,
        key: &RecordKey,
        term: T,
        live: L,
        spec: &TerminalSpec,
    ) -> Result<Conn<T, L>, Error> {
        self.register(key, live.clone(), spec.attach_wait)?;
        Ok(Conn { term, live })
    }

    /// The consumer's output buffer for the low-level `spec` (its buffer
    /// bound), opened now.
    pub fn buffer(&self, spec: &TerminalSpec) -> OutputBuffer {
        OutputBuffer::new(spec.max_buffer_bytes, self.clock.now())
    }

    /// Output of `conn`: queued for the consumer (within the spec's
    /// buffer) or held while the consumer is live; the consumer is woken.
    ///
    /// # Errors
    /// An overflow for a stalled consumer (`output_limit`, uncertain),
    /// which ends the session: the shell ends the connection with it
    /// ([`Terminals::verdict`]).
    pub fn output<T>(&self, conn: &Conn<T, L>, bytes: bytes::Bytes) -> Result<(), Error> {
        let pushed = lock(conn.live.buffer()).push(self.clock.now(), bytes);
        conn.live.wake_reader();
        pushed
    }

    /// Whether `conn`'s run pulls its low-level terminal now or holds for
    /// its live consumer ([`OutputBuffer::pace`]). On [`Pace::Hold`] the
    /// shell keeps the low-level terminal's consumer live and waits for the
    /// consumer's next read or the instant given.
    ///
    /// # Errors
    /// `output_limit` (uncertain) once the consumer stalled with output
    /// held: the shell ends the connection with it ([`Terminals::verdict`]).
    pub fn pace<T>(&self, conn: &Conn<T, L>) -> Result<Pace, Error> {
        lock(conn.live.buffer()).pace(self.clock.now())
    }

    /// The peer ended the session with `outcome` (the connection's
    /// `Closed` event): the connection is gone, the consumer gets the final
    /// event, then the run the outcome.
    pub fn peer_closed<T>(
        &self,
        run: &mut TerminalRun,
        key: &RecordKey,
        conn: &mut Option<Conn<T, L>>,
        outcome: Result<TerminalExit, Error>,
    ) {
        if let Some(c) = conn.take() {
            self.ended(key, &c.live, outcome);
        }
        self.closed(run, &outcome);
    }

    /// The session ends with `outcome` decided here: the run gets it first
    /// (it wins over whatever the close reports). Returns the connection,
    /// which the shell closes and then hands to [`Terminals::ended`] with
    /// the same `outcome`.
    pub fn verdict<T>(
        &self,
        run: &mut TerminalRun,
        conn: &mut Option<Conn<T, L>>,
        outcome: &Result<TerminalExit, Error>,
    ) -> Option<Conn<T, L>> {
        self.closed(run, outcome);
        conn.take()
    }

    /// The consumer's close of `live` ended with `outcome` (what the close
    /// reported): the consumer's final event, then the run told; returns
    /// the outcome, the consumer's answer.
    pub fn closed_on_request(
        &self,
        run: &mut TerminalRun,
        key: &RecordKey,
        live: &L,
        outcome: Result<TerminalExit, Error>,
    ) -> Result<TerminalExit, Error> {
        self.ended(key, live, outcome);
        self.closed(run, &outcome);
        outcome
    }

    /// The connection of `key` is gone with `outcome`: the final event is
    /// queued for the consumer (the buffer finished), who is woken, and the
    /// registry is told ([`Terminals::finished`]).
    pub fn ended(&self, key: &RecordKey, live: &L, outcome: Result<TerminalExit, Error>) {
        lock(live.buffer()).close(outcome);
        live.wake_reader();
        self.finished(key, &outcome);
    }

    /// When `run`'s task must wake next (its timers and the registry's).
    pub fn wake(&self, run: &TerminalRun) -> Option<Instant> {
        let registry = self.lock().poll_timeout();
        [run.poll_timeout(), registry].into_iter().flatten().min()
    }

    /// The timers: the registry's expiries, then `run`'s. Each input
    /// below first hands the run the due-scan rows kept for it
    /// ([`LiveSet::feed_rows`]).
    pub fn tick(&self, run: &mut TerminalRun) {
        self.lock().feed_rows(run);
        self.lock().expire(self.clock.now(), end);
        run.handle_timeout(self.clock.now(), self.clock.now_ms());
    }

    /// Feeds `run` a store op's result.
    pub fn stored(&self, run: &mut TerminalRun, id: OpId, r: TermStoreResult) {
        self.lock().feed_rows(run);
        run.handle_stored(self.clock.now(), self.clock.now_ms(), id, r);
    }

    /// Feeds `run` the image preflight's result.
    pub fn inspected(&self, run: &mut TerminalRun, r: Result<(), Error>) {
        self.lock().feed_rows(run);
        run.handle_inspected(self.clock.now(), self.clock.now_ms(), r);
    }

    /// Feeds `run` the open's result.
    pub fn opened(&self, run: &mut TerminalRun, r: Result<(), Error>) {
        self.lock().feed_rows(run);
        run.handle_opened(self.clock.now(), self.clock.now_ms(), r);
    }

    /// Feeds `run` the session's outcome.
    pub fn closed(&self, run: &mut TerminalRun, outcome: &Result<TerminalExit, Error>) {
        self.lock().feed_rows(run);
        run.handle_closed(self.clock.now(), self.clock.now_ms(), outcome);
    }

    /// Feeds `run` a persisted cancel.
    pub fn cancel(&self, run: &mut TerminalRun) {
        self.lock().feed_rows(run);
        run.cancel(self.clock.now(), self.clock.now_ms());
    }

    /// The session of `key` ended with `outcome`: its buffer waits for the
    /// final read (or, when nobody attached in time, refuses a late attach).
    pub fn finished(&self, key: &RecordKey, outcome: &Result<TerminalExit, Error>) {
        self.lock().registry().ended(self.clock.now(), key, outcome);
    }

    /// The run of `key` is over here.
    pub fn end_run(&self, key: &RecordKey) {
        self.lock().end_run(key);
    }

    /// True while this runtime drives a run of `key`.
    pub fn is_running(&self, key: &RecordKey) -> bool {
        self.lock().is_running(key)
    }

    /// True while this runtime drives any terminal run (they take claims
    /// under the controller's owner).
    pub fn any_running(&self) -> bool {
        self.lock().any_running()
    }

    /// Checks that consumer `who` still holds `key`.
    ///
    /// # Errors
    /// `authentication` / `not_found` when it no longer does.
    pub fn check(&self, key: &RecordKey, who: ConsumerId) -> Result<(), Error> {
        self.lock().registry().get(key, who).map(|_| ())
    }

    /// Consumer `who` read the final event of `key`: the buffer retires.
    pub fn final_read(&self, key: &RecordKey, who: ConsumerId) {
        let _ = self.lock().registry().final_read(key, who);
    }

    /// Consumer `who` dropped its handle before the end: it is detached
    /// (nobody may take over) and the session ends (`consumer_lost`).
    pub fn lost(&self, key: &RecordKey, who: ConsumerId, live: &L) {
        let _ = self.lock().registry().detach(key, who);
        live.send(TermCommand::End(consumer_lost()));
    }
}

/// The one consumer's hold on a managed terminal, behind each shell's
/// `ManagedTerminal`: the key, the consumer id and the live connection it
/// was bound to ([`Terminals::attach`]), and whether it read the final
/// event. Dropped before that, it detaches the consumer and ends the
/// session ([`Terminals::lost`]: `consumer_lost`).
pub struct Consumer<L: LiveConn + Clone, C> {
    terminals: Arc<Terminals<L, C>>,
    key: RecordKey,
    who: ConsumerId,
    live: L,
    done: bool,
}

impl<L: LiveConn + Clone, C> std::fmt::Debug for Consumer<L, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consumer")
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl<L: LiveConn + Clone, C> Consumer<L, C> {
    /// Consumer `who` of `key`, bound to `live` by [`Terminals::attach`].
    pub fn new(
        terminals: Arc<Terminals<L, C>>,
        key: RecordKey,
        (who, live): (ConsumerId, L),
    ) -> Self {
        lock(live.buffer()).attached(terminals.now());
        Self {
            terminals,
            key,
            who,
            live,
            done: false,
        }
    }

    /// The terminal's record key.
    pub fn key(&self) -> &RecordKey {
        &self.key
    }

    /// The live connection: its commands and its output buffer.
    pub fn live(&self) -> &L {
        &self.live
    }

    /// The runtime clock's monotonic now, the time of this consumer's
    /// reads ([`OutputBuffer::pop`], [`OutputBuffer::begin_wait`]).
    pub fn now(&self) -> Instant {
        self.terminals.now()
    }

    /// Checks that this consumer still holds the session.
    ///
    /// # Errors
    /// `authentication` / `not_found` when it no longer does.
    pub fn check(&self) -> Result<(), Error> {
        self.terminals.check(&self.key, self.who)
    }

    /// The final event was read (or the session closed): the buffer
    /// retires and a later drop changes nothing.
    pub fn final_read(&mut self) {
        self.done = true;
        self.terminals.final_read(&self.key, self.who);
    }
}

impl<L: LiveConn + Clone, C> Drop for Consumer<L, C> {
    fn drop(&mut self) {
        if !self.done {
            self.terminals.lost(&self.key, self.who, &self.live);
        }
    }
}

/// Ends a live connection with `e` (the registry's expiry).
fn end<L: LiveConn>(live: &L, e: Error) {
    live.send(TermCommand::End(e));
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code

    use smolbox_core::Reason;
    use smolbox_core::managed::testkit;

    use super::*;
    use crate::clock::SystemClock;
    use crate::{MemoryConfig, MemoryStore};

    /// A live connection that keeps the reasons of the `End` commands it
    /// was handed.
    struct Recorder {
        ended: Mutex<Vec<Reason>>,
        queue: Mutex<OutputBuffer>,
    }

    impl Default for Recorder {
        fn default() -> Self {
            Self {
                ended: Mutex::default(),
                queue: Mutex::new(OutputBuffer::new(1_024, SystemClock.now())),
            }
        }
    }

    impl LiveConn for Recorder {
        fn send(&self, cmd: TermCommand) -> bool {
            if let TermCommand::End(e) = cmd {
                lock(&self.ended).push(e.reason());
            }
            true
        }
        fn buffer(&self) -> &Mutex<OutputBuffer> {
            &self.queue
        }
        fn wake_reader(&self) {}
    }

    /// Terminals over a fresh memory store, recording connections.
    fn terminals() -> Terminals<Arc<Recorder>, ()> {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new(MemoryConfig::default()).unwrap());
        let cfg = TermConfig {
            owner: "ctl-test".into(),
            lease_ttl_ms: 30_000,
            poll_interval_ms: 25,
            max_pending: 4,
        };
        Terminals::new(
            store,
            testkit::fingerprint_key(),
            cfg,
            BTreeMap::new(),
            Arc::new(SystemClock),
            4,
        )
        .unwrap()
    }

    /// A consumer bound to a registered connection, and that connection.
    fn bound() -> (Consumer<Arc<Recorder>, ()>, Arc<Recorder>) {
        let t = terminals();
        let t = Arc::new(t);
        let key = testkit::key("s", "t1");
        let live = Arc::new(Recorder::default());
        t.register(&key, Arc::clone(&live), Duration::from_secs(30))
            .unwrap();
        let who = t.attach(&mut t.lock(), &key).unwrap().unwrap();
        (Consumer::new(Arc::clone(&t), key, who), live)
    }

    /// A due-scan row of a key this runtime drives is kept for its run
    /// (the core decides) and handed over by the run's next input, here
    /// a store answer and a timer; a key driven by no run is recovered
    /// (its row kept for the key's next run).
    #[test]
    fn a_due_row_goes_to_the_live_run_at_its_next_input() {
        use smolbox_core::managed::state::ExecState;
        let t = terminals();
        let key = testkit::key("s", "t1");
        let row = |k: &RecordKey| testkit::exec_in(ExecState::Dispatching, k.clone(), 1).unwrap();
        assert_eq!(t.due(row(&key)), Some(key.clone()), "no run: recover");
        let machine = testkit::key("s", "m1");
        let (mut run, drives) = t
            .open_run(key.clone(), machine, ManagedTerminalSpec::default())
            .unwrap();
        assert!(drives);
        let Some(smolbox_core::managed::controller::terminal::TermOutput::Store(id, _)) =
            run.poll_output()
        else {
            panic!("the machine is read first");
        };
        assert_eq!(t.due(row(&key)), None, "the live run takes it");
        // With the row answered `recover` before the run began (session 11).
        assert_eq!(t.lock().rows_kept(&key), 2);
        let absent: TermStoreResult = Err(Error::not_found(
            smolbox_core::Operation::StoreFetch,
            smolbox_core::Evidence::NotDispatched,
            Reason::Unspecified,
        ));
        t.stored(&mut run, id, absent);
        assert_eq!(t.lock().rows_kept(&key), 0, "handed over with the answer");
        assert_eq!(t.due(row(&key)), None);
        t.tick(&mut run);
        assert_eq!(t.lock().rows_kept(&key), 0, "handed over with the timer");
        t.end_run(&key);
        assert_eq!(t.due(row(&key)), Some(key), "run over: recover");
    }

    #[test]
    fn a_consumer_dropped_before_the_final_event_ends_the_session_as_lost() {
        let (c, live) = bound();
        assert!(c.check().is_ok());
        drop(c);
        assert_eq!(*lock(&live.ended), [Reason::ConsumerLost]);
    }

    #[test]
    fn a_consumer_that_read_the_final_event_ends_nothing_when_dropped() {
        let (mut c, live) = bound();
        c.final_read();
        drop(c);
        assert!(lock(&live.ended).is_empty());
    }
}
