//! The live side of managed terminals (features C7.3, C7.4), written once
//! for both shells: which runs this runtime drives and which connections it
//! holds ([`LiveSet`], over the [`Registry`]), the consumer's bounded output
//! buffer and its read pacing ([`OutputBuffer`], [`Pace`]), the consumer's requests to a run's task
//! ([`TermCommand`]), what `open` answers ([`OpenReply`]), and the errors
//! a shell reports for them.
//!
//! Nothing here waits or reads a clock: the shell owns the locks, the
//! waiting and the connection, and passes `now`. Terminal bytes pass through
//! [`OutputBuffer`] and [`TermCommand::Input`] only, and neither prints them.

use crate::Reason;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::{Duration, Instant};

use super::RecordKey;
use super::controller::terminal::{TermConfig, TermEvent, TerminalRun};
use super::fingerprint::FingerprintKey;
use super::record::ExecutionRecord;
use super::spec::{Action, ManagedTerminalSpec};
use super::terminal::{ConsumerId, Registry, attach_expired};
use crate::terminal::{MAX_NEXT_WAIT, TerminalExit};
use crate::{Error, Evidence, Operation};

mod output;
pub use output::{OutputBuffer, Pace};

/// How a shell answers one waiting caller: a closure over its channel.
pub type Reply<T> = Box<dyn FnOnce(T) + Send>;

/// A [`Reply`] through `send`, a send on the shell's channel that says
/// whether the caller still waited (for example
/// `move |v| tx.send(v).is_ok()`); a caller that stopped waiting is not an
/// error, so the answer is ignored.
pub fn reply<T>(send: impl FnOnce(T) -> bool + Send + 'static) -> Reply<T> {
    Box::new(move |v| {
        let _delivered = send(v);
    })
}

/// What `open` returns at durable acceptance (not readiness).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TerminalOpened {
    /// The terminal's record as stored.
    pub record: ExecutionRecord,
    /// True when the record already existed with the same identity.
    pub existing: bool,
}

/// A consumer's request to the task that drives a run and owns its
/// connection.
pub enum TermCommand {
    /// Send these bytes to the PTY.
    Input(Vec<u8>, Reply<Result<(), Error>>),
    /// A window-size change (columns, rows).
    Resize(u16, u16, Reply<Result<(), Error>>),
    /// Close the session; answered with its outcome.
    Close(Reply<Result<TerminalExit, Error>>),
    /// Close with this outcome (expiry, lost consumer).
    End(Error),
    /// A cancel request was persisted: the run decides.
    Cancel,
}

impl fmt::Debug for TermCommand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Terminal bytes are never printed.
        match self {
            Self::Input(b, _) => write!(f, "Input(len {})", b.len()),
            Self::Resize(c, r, _) => write!(f, "Resize({c}, {r})"),
            Self::Close(_) => f.write_str("Close"),
            Self::End(e) => f.debug_tuple("End").field(e).finish(),
            Self::Cancel => f.write_str("Cancel"),
        }
    }
}

impl TermCommand {
    /// Answers a command that found no connection (not opened yet, or
    /// already closed): input, resize and close fail with
    /// [`task_ended`]; an end has nothing left to end. A cancel is the
    /// run's, never refused: this does nothing with it.
    pub fn refuse(self) {
        match self {
            Self::Input(_, reply) | Self::Resize(_, _, reply) => {
                reply(Err(task_ended(Operation::TerminalInput)));
            }
            Self::Close(reply) => reply(Err(task_ended(Operation::TerminalClose))),
            Self::End(_) | Self::Cancel => {}
        }
    }
}

/// The error of a call whose terminal task is gone.
pub const fn task_ended(op: Operation) -> Error {
    Error::unknown(op, Evidence::Unknown, Reason::TerminalTaskEnded)
}

/// `attach` found no live connection of the key on this runtime in time.
pub const fn not_live_here() -> Error {
    Error::not_found(
        Operation::TerminalConsumer,
        Evidence::NotDispatched,
        Reason::TerminalNotLiveHere,
    )
}

/// `wait` ran out while this runtime still drives the run.
pub const fn run_wait_expired() -> Error {
    Error::expired(
        Operation::TerminalSession,
        Evidence::Unknown,
        Reason::TerminalWait,
    )
}

/// `next` ran out without output or the end (the session keeps running).
pub const fn next_expired() -> Error {
    Error::expired(
        Operation::TerminalOutput,
        Evidence::Unknown,
        Reason::NextTimeout,
    )
}

/// Checks a `next` wait (at most [`MAX_NEXT_WAIT`]).
///
/// # Errors
/// `validation` (`next_timeout`) over the bound.
pub fn check_next_wait(timeout: Duration) -> Result<(), Error> {
    if timeout > MAX_NEXT_WAIT {
        return Err(Error::validation(
            Operation::TerminalOutput,
            Reason::NextTimeout,
        ));
    }
    Ok(())
}

/// The consumer's handle was dropped before the session ended.
pub const fn consumer_lost() -> Error {
    Error::unknown(
        Operation::TerminalConsumer,
        Evidence::Unknown,
        Reason::ConsumerLost,
    )
}

/// The run's machine is on a worker this runtime has no client for.
pub const fn unknown_worker() -> Error {
    Error::unsupported_capability(Operation::TerminalOpen, Reason::UnknownWorker)
}

/// Most due-scan rows kept for one live run between two of its inputs;
/// past that the run is told rows were dropped (it then never opens).
pub const MAX_KEPT_ROWS: usize = 8;

/// Most keys with due-scan rows kept while no run of theirs is live here
/// (answered [`DueRow::Recover`], for whichever run of the key begins
/// next); past that a row of another such key is not kept (as before
/// session 11).
pub const MAX_UNDRIVEN_KEYS: usize = 64;

/// What the shell does with a due-scan row of a managed terminal
/// ([`LiveSet::due_row`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DueRow {
    /// A run of the key is live here: the row is its (kept until the
    /// run's next input, [`LiveSet::feed_rows`]); nothing to start.
    Kept,
    /// No run of the key here: recover it (`recover`, C7.4).
    Recover(RecordKey),
}

/// Rows kept for one live run.
#[derive(Debug, Default)]
struct KeptRows {
    rows: Vec<ExecutionRecord>,
    dropped: bool,
}

/// The runs this runtime drives and the live connections it holds (the
/// shell's connection handle `L`, cheap to clone).
pub struct LiveSet<L> {
    registry: Registry<L>,
    runs: BTreeSet<RecordKey>,
    /// Due-scan rows of live runs' keys, until the run's next input; and
    /// rows past `ready` of keys answered [`DueRow::Recover`], until the
    /// next run of the key begins here (the recovery, or an `open` that
    /// raced it) and takes them at its first input.
    rows: BTreeMap<RecordKey, KeptRows>,
}

impl<L> fmt::Debug for LiveSet<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LiveSet")
            .field("registry", &self.registry)
            .field("runs", &self.runs.len())
            .field("rows", &self.rows.len())
            .finish()
    }
}

impl<L: Clone> LiveSet<L> {
    /// Empty, registering at most `limit` connections (1–64).
    ///
    /// # Errors
    /// `validation` (operation `config`) for a bad limit.
    pub fn new(limit: usize) -> Result<Self, Error> {
        Ok(Self {
            registry: Registry::new(limit)?,
            runs: BTreeSet::new(),
            rows: BTreeMap::new(),
        })
    }

    /// The registry (attach, final read, detach, finished).
    pub fn registry(&mut self) -> &mut Registry<L> {
        &mut self.registry
    }

    /// True while this runtime drives a run of `key`.
    pub fn is_running(&self, key: &RecordKey) -> bool {
        self.runs.contains(key)
    }

    /// True while this runtime drives any run.
    pub fn any_running(&self) -> bool {
        !self.runs.is_empty()
    }

    /// Marks `key` driven here; false when it already was.
    pub fn begin_run(&mut self, key: &RecordKey) -> bool {
        self.runs.insert(key.clone())
    }

    /// The run of `key` is over here.
    pub fn end_run(&mut self, key: &RecordKey) {
        self.runs.remove(key);
        self.rows.remove(key);
    }

    /// A row of a managed terminal's record that the controller's due scan
    /// read (`ControllerEvent::TerminalDue`). While this runtime drives a
    /// run of its key, the row is that run's (fuzz finding 5's case for
    /// terminals): it is kept for the run's next input (a row before
    /// dispatch shows the run nothing and is not kept). Otherwise the key
    /// is recovered, and a row past `ready` is kept too (at most
    /// [`MAX_UNDRIVEN_KEYS`] such keys): an `open` of the key may begin its
    /// run before the recovery does (the recovery then finds the key driven
    /// and returns), and that run takes the row like any row read while it
    /// is live; otherwise the recovery's run takes it. The shell only acts
    /// on the answer.
    pub fn due_row(&mut self, row: ExecutionRecord) -> DueRow {
        let driven = self.runs.contains(&row.key);
        if !row.state.is_before_dispatch() && (driven || self.room_for(&row.key)) {
            let kept = self.rows.entry(row.key.clone()).or_default();
            if kept.rows.len() < MAX_KEPT_ROWS {
                kept.rows.push(row.clone());
            } else {
                kept.dropped = true;
            }
        }
        if driven {
            DueRow::Kept
        } else {
            DueRow::Recover(row.key)
        }
    }

    /// True when rows of `key`, driven by no run here, may be kept.
    fn room_for(&self, key: &RecordKey) -> bool {
        self.rows.contains_key(key)
            || self.rows.keys().filter(|k| !self.runs.contains(*k)).count() < MAX_UNDRIVEN_KEYS
    }

    /// How many due-scan rows wait for the run of `key` (dropped ones not
    /// counted).
    pub fn rows_kept(&self, key: &RecordKey) -> usize {
        self.rows.get(key).map_or(0, |k| k.rows.len())
    }

    /// Hands `run` the rows kept for its key ([`LiveSet::due_row`]) if it
    /// drives the key; a shell calls it before each input it feeds the run.
    pub fn feed_rows(&mut self, run: &mut TerminalRun) {
        if !run.drives() {
            return;
        }
        let Some(kept) = self.rows.remove(run.key()) else {
            return;
        };
        for row in &kept.rows {
            run.handle_row(row);
        }
        if kept.dropped {
            run.handle_rows_dropped();
        }
    }

    /// A new run for `open` (C7.4). It drives the key unless another run
    /// of this runtime already does (`drives`, second in the answer; the
    /// new run then only answers the caller).
    ///
    /// # Errors
    /// The run's validation of `spec` (nothing stored, nothing marked).
    pub fn open_run(
        &mut self,
        cfg: TermConfig,
        fp_key: FingerprintKey,
        key: RecordKey,
        machine: RecordKey,
        spec: ManagedTerminalSpec,
    ) -> Result<(TerminalRun, bool), Error> {
        let drives = self.begin_run(&key);
        match TerminalRun::open(cfg, fp_key, key.clone(), machine, spec, drives) {
            Ok(run) => Ok((run, drives)),
            Err(e) => {
                if drives {
                    // Rows kept for the key stay for its next run.
                    self.runs.remove(&key);
                }
                Err(e)
            }
        }
    }

    /// The run recovering `key` from its stored record `fetched` (C7.4;
    /// [`LiveSet::begin_run`] was true). On any error the key is no longer
    /// driven here.
    ///
    /// # Errors
    /// `validation` (`not_a_terminal`) for a record that is not a managed
    /// terminal; the fetch's error; the run's.
    pub fn resume_run(
        &mut self,
        cfg: TermConfig,
        fp_key: FingerprintKey,
        key: &RecordKey,
        fetched: Result<ExecutionRecord, Error>,
        now: Instant,
        now_ms: u64,
    ) -> Result<TerminalRun, Error> {
        let run = fetched.and_then(|rec| {
            if !matches!(rec.spec.action, Action::Terminal(_)) {
                return Err(Error::validation(
                    Operation::TerminalOpen,
                    Reason::NotATerminal,
                ));
            }
            TerminalRun::resume(cfg, fp_key, rec, now, now_ms)
        });
        match run {
            Ok(mut run) => {
                // Rows read while the record was being fetched.
                self.feed_rows(&mut run);
                Ok(run)
            }
            Err(e) => {
                self.end_run(key);
                Err(e)
            }
        }
    }

    /// The registry's timers: each connection nobody attached to in time
    /// is handed to `end` (to be ended with [`attach_expired`]); old
    /// finished buffers are dropped.
    pub fn expire(&mut self, now: Instant, mut end: impl FnMut(&L, Error)) {
        let (expired, _retired) = self.registry.handle_timeout(now);
        for (key, _) in expired {
            if let Some(live) = self.registry.owner_get(&key) {
                end(live, attach_expired());
            }
        }
    }

    /// After [`LiveSet::expire`], binds the caller as the one consumer of
    /// `key` if its connection is registered: its id and connection.
    ///
    /// # Errors
    /// The registry's (`authentication` when another consumer is bound,
    /// `expired` when nobody attached within the attach wait).
    pub fn attach(
        &mut self,
        now: Instant,
        key: &RecordKey,
        end: impl FnMut(&L, Error),
    ) -> Result<Option<(ConsumerId, L)>, Error> {
        self.expire(now, end);
        match self.registry.attach(now, key)? {
            Some(who) => Ok(Some((who, self.registry.get(key, who)?.clone()))),
            None => Ok(None),
        }
    }

    /// Registers the just-opened connection of `key`.
    ///
    /// # Errors
    /// The registry's, as `dispatch_uncertain` (the terminal is open).
    pub fn register(
        &mut self,
        now: Instant,
        key: RecordKey,
        live: L,
        attach_wait: Duration,
    ) -> Result<(), Error> {
        self.registry
            .insert(now, key, live, attach_wait)
            .map(|_| ())
            .map_err(|e| e.with_evidence(Evidence::DispatchUncertain))
    }

    /// The connection of `key` for its owner (the runtime), if any.
    pub fn owner_get(&mut self, key: &RecordKey) -> Option<L> {
        self.registry.owner_get(key).cloned()
    }

    /// When [`LiveSet::expire`] is due next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.registry.poll_timeout()
    }
}

/// The reply `open` (or `recover`) waits for, fed from the run.
pub struct OpenReply(Option<Reply<Result<TerminalOpened, Error>>>);

impl fmt::Debug for OpenReply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("OpenReply").field(&self.0.is_some()).finish()
    }
}

impl OpenReply {
    /// A reply still to give.
    pub fn new(reply: Reply<Result<TerminalOpened, Error>>) -> Self {
        Self(Some(reply))
    }

    /// Answers from the run's event: acceptance, refusal, or an early end.
    pub fn on_event(&mut self, event: TermEvent) {
        match event {
            TermEvent::Accepted { record, existing } => self.give(Ok(TerminalOpened {
                record: *record,
                existing,
            })),
            TermEvent::Refused(e) => self.give(Err(e)),
            TermEvent::Done { error, .. } => {
                // The run is over: a caller still waiting hears its error,
                // or (without one) that the task ended.
                let reply = self.0.take();
                if let (Some(e), Some(reply)) = (error, reply) {
                    reply(Err(e));
                }
            }
        }
    }

    /// After the run's one dispatch: a resumed run (which has no
    /// acceptance) answers with its record.
    pub fn on_opened(&mut self, run: &TerminalRun) {
        if let Some(rec) = run.record() {
            self.give(Ok(TerminalOpened {
                record: rec.clone(),
                existing: true,
            }));
        }
    }

    fn give(&mut self, v: Result<TerminalOpened, Error>) {
        if let Some(reply) = self.0.take() {
            reply(v);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code
    use crate::Reason;

    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::Category;

    #[test]
    fn a_reply_delivers_through_its_send_and_ignores_a_gone_caller() {
        let (tx, rx) = std::sync::mpsc::channel();
        reply(move |v| tx.send(v).is_ok())(7_u32);
        assert_eq!(rx.recv(), Ok(7));
        let (tx, rx) = std::sync::mpsc::channel::<u32>();
        drop(rx);
        // The caller stopped waiting: answering it is not a failure.
        reply(move |v| tx.send(v).is_ok())(8);
    }

    #[allow(clippy::disallowed_methods)] // an arbitrary origin; time is virtual after
    fn origin() -> Instant {
        Instant::now()
    }

    fn key(id: &str) -> RecordKey {
        RecordKey::new("s", id).unwrap()
    }

    #[test]
    fn refused_commands_answer_task_ended_and_never_print_input() {
        let got = Arc::new(Mutex::new(Vec::new()));
        let g = Arc::clone(&got);
        let input = TermCommand::Input(
            b"secret".to_vec(),
            Box::new(move |r| g.lock().unwrap().push(r)),
        );
        assert_eq!(format!("{input:?}"), "Input(len 6)");
        input.refuse();
        let g = Arc::clone(&got);
        TermCommand::Resize(1, 1, Box::new(move |r| g.lock().unwrap().push(r))).refuse();
        let got = got.lock().unwrap();
        assert_eq!(got.len(), 2);
        for r in got.iter() {
            let e = r.unwrap_err();
            assert_eq!(e.reason(), Reason::TerminalTaskEnded);
            assert_eq!(e.operation(), Operation::TerminalInput);
        }
        let closed = Arc::new(Mutex::new(None));
        let c = Arc::clone(&closed);
        TermCommand::Close(Box::new(move |r| *c.lock().unwrap() = Some(r))).refuse();
        let e = closed.lock().unwrap().unwrap().unwrap_err();
        assert_eq!(e.operation(), Operation::TerminalClose);
    }

    #[test]
    fn next_wait_at_the_bound_accepted_and_above_refused() {
        assert!(check_next_wait(MAX_NEXT_WAIT).is_ok());
        let e = check_next_wait(MAX_NEXT_WAIT + Duration::from_nanos(1)).unwrap_err();
        assert_eq!(e.category(), Category::Validation);
    }

    #[test]
    fn live_set_marks_runs_and_binds_one_consumer() {
        let mut set = LiveSet::<u32>::new(2).unwrap();
        let k = key("t1");
        assert!(set.begin_run(&k));
        assert!(!set.begin_run(&k));
        assert!(set.is_running(&k));
        let now = origin();
        let mut ended = Vec::new();
        assert!(
            set.attach(now, &k, |l, e| ended.push((*l, e)))
                .unwrap()
                .is_none()
        );
        set.register(now, k.clone(), 7, Duration::from_secs(5))
            .unwrap();
        let (_, live) = set
            .attach(now, &k, |l, e| ended.push((*l, e)))
            .unwrap()
            .unwrap();
        assert_eq!(live, 7);
        assert_eq!(set.owner_get(&k), Some(7));
        // A second registration of the same key is refused as uncertain:
        // the terminal is already open.
        let e = set
            .register(now, k.clone(), 8, Duration::from_secs(5))
            .unwrap_err();
        assert_eq!(e.evidence(), Evidence::DispatchUncertain);
        set.end_run(&k);
        assert!(!set.is_running(&k));
        assert!(ended.is_empty());
    }

    #[test]
    fn live_set_ends_a_connection_nobody_attached_to() {
        let mut set = LiveSet::<u32>::new(1).unwrap();
        let now = origin();
        set.register(now, key("t2"), 9, Duration::from_millis(10))
            .unwrap();
        let at = set.poll_timeout().unwrap();
        let mut ended = Vec::new();
        set.expire(at, |l, e| ended.push((*l, e)));
        assert_eq!(ended.len(), 1);
        assert_eq!(ended[0].0, 9);
        assert_eq!(ended[0].1.reason(), Reason::AttachWait);
    }

    #[test]
    fn resume_of_a_record_that_is_not_a_terminal_releases_the_key() {
        let mut set = LiveSet::<u32>::new(1).unwrap();
        let k = key("t3");
        assert!(set.begin_run(&k));
        let e = set
            .resume_run(
                TermConfig::of(&crate::managed::controller::ControllerConfig::new("ctl-1")),
                FingerprintKey::new(&[7; 32]).unwrap(),
                &k,
                Err(Error::store(
                    Operation::StoreFetch,
                    Evidence::Unknown,
                    Reason::Unspecified,
                )),
                origin(),
                0,
            )
            .unwrap_err();
        assert_eq!(e.category(), Category::Store);
        assert!(!set.is_running(&k));
    }
}
