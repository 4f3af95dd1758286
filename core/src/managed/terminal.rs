//! Managed terminals, sans-IO (features C7.3, C7.4): what a session's end
//! means for its durable record ([`Verdict`], [`closing_patches`]) and the
//! runtime's live registry of connections ([`Registry`]).
//!
//! Nothing here reads a clock: every call that depends on time takes
//! `now`. Terminal bytes never pass through this module; the registry holds
//! the shell's connection object opaquely and reports counts only.

use crate::Reason;
use core::fmt;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::RecordKey;
use super::patch::ExecPatch;
use super::record::{ErrorEntry, ExecResult};
use super::state::{Collection, ExecState, RecordEvidence};
use crate::terminal::TerminalExit;
use crate::{Category, Error, Evidence, Operation};

/// What a terminal session's end proves about its program (C7.3, C7.4).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// A confirmed exit (0–255 except 124 and 130): the record becomes
    /// `completed` / `exited` with a terminal result and no transcript.
    Exited(i32),
    /// Nothing could have reached the worker (the upgrade was refused
    /// before a byte left): the record becomes `failed` / `not_dispatched`.
    NotSent(Error),
    /// The program may have run and its outcome is not known (124, 130,
    /// −1, a close before the exit frame, a budget, buffer exhaustion
    /// `output_limit`, a lost consumer…): the record becomes `unknown` and
    /// keeps the machine's slot.
    Uncertain(Error),
}

impl Verdict {
    /// Classifies a session's outcome, or the error of the open itself.
    pub fn of(outcome: &Result<TerminalExit, Error>) -> Self {
        match outcome {
            Ok(TerminalExit { code }) if (0..=255).contains(code) && !matches!(code, 124 | 130) => {
                Self::Exited(*code)
            }
            Ok(TerminalExit { code }) => Self::Uncertain(
                Error::unknown(
                    Operation::TerminalSession,
                    Evidence::Unknown,
                    Reason::AmbiguousExitCode,
                )
                .with_exit_code(*code),
            ),
            Err(e) if e.evidence() == Evidence::NotDispatched => Self::NotSent(*e),
            Err(e) => Self::Uncertain(*e),
        }
    }

    /// The confirmed exit code, if any.
    pub const fn exit_code(&self) -> Option<i32> {
        match self {
            Self::Exited(c) => Some(*c),
            _ => None,
        }
    }
}

/// The guarded writes, in order, that record `verdict` on a record in
/// `state` (`dispatching`, `running`, `cancelling` or `unknown`): an exit
/// is `collecting` with the terminal result, then `completed` (nothing to
/// collect); an uncertain end is `unknown` with the error; a refused open
/// is `failed` / `not_dispatched`. Empty when the record cannot take the
/// verdict (already finished, or an exit already stored: a completed
/// result is never erased).
///
/// The settled record stays due (now) until its slot is finished:
/// `finish_command` (or a resolve) clears the due time in the same
/// transaction as the slot, so a controller that stops between the two
/// writes leaves a record the next due scan resumes, and its run frees the
/// slot (found by the recovery simulation, retained run, seed 892).
pub fn closing_patches(state: ExecState, verdict: &Verdict, now_ms: u64) -> Vec<ExecPatch> {
    match verdict {
        Verdict::Exited(code) if state.can_move_to(ExecState::Collecting) => vec![
            ExecPatch {
                state: Some(ExecState::Collecting),
                evidence: Some(RecordEvidence::Exited),
                result: Some(ExecResult::Terminal { exit_code: *code }),
                ..ExecPatch::default()
            },
            ExecPatch {
                state: Some(ExecState::Completed),
                collection: Some(Collection::Complete),
                next_due_at_ms: Some(Some(now_ms)),
                ..ExecPatch::default()
            },
        ],
        Verdict::Exited(_) if state == ExecState::Collecting => vec![ExecPatch {
            state: Some(ExecState::Completed),
            collection: Some(Collection::Complete),
            next_due_at_ms: Some(Some(now_ms)),
            ..ExecPatch::default()
        }],
        Verdict::NotSent(e) if state.can_move_to(ExecState::Failed) => vec![ExecPatch {
            state: Some(ExecState::Failed),
            evidence: Some(RecordEvidence::NotDispatched),
            next_due_at_ms: Some(Some(now_ms)),
            last_error: Some(ErrorEntry::from_error(e, now_ms)),
            ..ExecPatch::default()
        }],
        Verdict::NotSent(e) | Verdict::Uncertain(e)
            if state.can_move_to(ExecState::Unknown) || state == ExecState::Unknown =>
        {
            vec![ExecPatch {
                state: Some(ExecState::Unknown),
                next_due_at_ms: Some(Some(now_ms)),
                last_error: Some(ErrorEntry::from_error(e, now_ms)),
                ..ExecPatch::default()
            }]
        }
        _ => Vec::new(),
    }
}

/// How long a finished session's buffer stays for its consumer (C7.3).
pub const FINISHED_RETENTION: Duration = Duration::from_millis(30_000);
/// Longest wait one [`Registry::attach`] caller may ask for (C7.4).
pub const MAX_ATTACH_WAIT: Duration = Duration::from_millis(30_000);

/// The consumer a live connection is bound to: issued by
/// [`Registry::attach`], held by the shell's handle. Not a credential and
/// never persisted: it only tells two callers of one runtime apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConsumerId(u64);

/// Where a registered session stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// The connection is open (or opening) and its program may run.
    Live,
    /// The session ended; its buffer waits for the final read, at most
    /// [`FINISHED_RETENTION`] after `at`.
    Finished {
        /// When it ended.
        at: Instant,
    },
}

/// Why [`Registry::handle_timeout`] wants a live connection closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expiry {
    /// Nobody attached within the attach wait (`terminal_consumer`).
    NoConsumer,
}

/// What [`Registry::handle_timeout`] found: live connections to close
/// (with why), and retired connections to drop.
pub type Timeouts<C> = (Vec<(RecordKey, Expiry)>, Vec<(RecordKey, C)>);

/// One session of the registry.
struct Entry<C> {
    conn: C,
    consumer: Option<ConsumerId>,
    /// The bound consumer dropped its handle: nobody may take over.
    consumer_lost: bool,
    attach_by: Instant,
    /// The session ended because nobody attached in time.
    expired: bool,
    phase: Phase,
    /// Insertion order, for retiring the oldest closed buffer first.
    seq: u64,
}

/// The runtime's live terminal connections (C7.3, C7.4), sans-IO: each
/// key (the terminal's record key) holds one connection `C` (the shell's
/// object), bound to at most one consumer. The registry is bounded by the
/// runtime's active-task limit; when it is full, closed buffers are retired
/// (oldest first) before a new connection is refused. Retiring drops the
/// connection object only: the durable record, and its completion evidence,
/// are not the registry's.
pub struct Registry<C> {
    entries: BTreeMap<RecordKey, Entry<C>>,
    limit: usize,
    next_consumer: u64,
    next_seq: u64,
}

impl<C> fmt::Debug for Registry<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Keys and phases only: never the connection (it holds bytes).
        f.debug_struct("Registry")
            .field("limit", &self.limit)
            .field("live", &self.live())
            .field("finished", &(self.entries.len() - self.live()))
            .finish_non_exhaustive()
    }
}

/// How a live session nobody attached to within its attach wait ends
/// (returned by [`Registry::handle_timeout`]): `expired`, operation
/// `terminal_consumer`, evidence `unknown` (the program may have run),
/// reason `attach_wait` — the same error the low-level session reports.
#[must_use]
pub const fn attach_expired() -> Error {
    Error::expired(
        Operation::TerminalConsumer,
        Evidence::Unknown,
        Reason::AttachWait,
    )
}

impl<C> Registry<C> {
    /// An empty registry holding at most `limit` sessions (the runtime's
    /// active-task limit, 1–64).
    ///
    /// # Errors
    /// `validation` (operation `config`) for a limit outside 1–64.
    pub fn new(limit: usize) -> Result<Self, Error> {
        if !(1..=super::controller::MAX_ACTIVE).contains(&limit) {
            return Err(Error::validation(Operation::Config, Reason::TerminalLimit)
                .with_limit(limit as u64, super::controller::MAX_ACTIVE as u64));
        }
        Ok(Self {
            entries: BTreeMap::new(),
            limit,
            next_consumer: 1,
            next_seq: 0,
        })
    }

    /// Sessions whose connection is still live.
    pub fn live(&self) -> usize {
        self.entries
            .values()
            .filter(|e| e.phase == Phase::Live)
            .count()
    }

    /// Every registered session, live or finished.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when nothing is registered.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The phase of `key`'s session, if registered here.
    pub fn phase(&self, key: &RecordKey) -> Option<Phase> {
        self.entries.get(key).map(|e| e.phase)
    }

    /// Registers a new connection for `key` at `now`; nobody is attached
    /// yet and the attach wait runs from `now`. At the limit, the oldest
    /// finished buffer is retired first (and returned to the caller to
    /// drop).
    ///
    /// # Errors
    /// `validation` (`terminal_already_registered`) when `key` already has a
    /// session here (a second shell is never opened); `admission_exhausted`
    /// (`terminal_limit`) when the registry is full of live sessions.
    pub fn insert(
        &mut self,
        now: Instant,
        key: RecordKey,
        conn: C,
        attach_wait: Duration,
    ) -> Result<Option<(RecordKey, C)>, Error> {
        if self.entries.contains_key(&key) {
            return Err(Error::validation(
                Operation::TerminalOpen,
                Reason::TerminalAlreadyRegistered,
            ));
        }
        let mut retired = None;
        if self.entries.len() >= self.limit {
            let oldest = self
                .entries
                .iter()
                .filter(|(_, e)| matches!(e.phase, Phase::Finished { .. }))
                .min_by_key(|(_, e)| e.seq)
                .map(|(k, _)| k.clone());
            match oldest {
                Some(k) => retired = self.entries.remove(&k).map(|e| (k, e.conn)),
                None => {
                    return Err(Error::admission_exhausted(
                        Operation::TerminalOpen,
                        Reason::TerminalLimit,
                    )
                    .with_limit(self.entries.len() as u64 + 1, self.limit as u64));
                }
            }
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.entries.insert(
            key,
            Entry {
                conn,
                consumer: None,
                consumer_lost: false,
                attach_by: now + attach_wait,
                expired: false,
                phase: Phase::Live,
                seq,
            },
        );
        Ok(retired)
    }

    /// The deadline of an attach that may wait `wait` (0–30,000 ms) for
    /// the session to be registered here.
    ///
    /// # Errors
    /// `validation` (`attach_wait_out_of_range`) above 30,000 ms.
    pub fn attach_deadline(now: Instant, wait: Duration) -> Result<Instant, Error> {
        if wait > MAX_ATTACH_WAIT {
            return Err(Error::validation(
                Operation::TerminalConsumer,
                Reason::AttachWaitOutOfRange,
            )
            .with_limit(
                u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
                MAX_ATTACH_WAIT.as_millis() as u64,
            ));
        }
        Ok(now + wait)
    }

    /// Binds the first consumer to `key`'s session (C7.4). `Ok(None)`: no
    /// session for `key` is registered here (yet): the caller may wait
    /// until its attach deadline and ask again.
    ///
    /// # Errors
    /// `authentication` when another consumer is (or was) bound: a handle
    /// is never taken over; `expired` (`terminal_consumer`) when nobody
    /// attached within the attach wait and the connection was ended.
    pub fn attach(&mut self, now: Instant, key: &RecordKey) -> Result<Option<ConsumerId>, Error> {
        let Some(e) = self.entries.get_mut(key) else {
            return Ok(None);
        };
        if e.consumer.is_some() || e.consumer_lost {
            return Err(Error::authentication(
                Operation::TerminalConsumer,
                Evidence::NotDispatched,
                Reason::TerminalConsumerBound,
            ));
        }
        if e.expired || (e.phase == Phase::Live && now >= e.attach_by) {
            e.expired = true;
            return Err(Error::expired(
                Operation::TerminalConsumer,
                Evidence::Unknown,
                Reason::TerminalConsumer,
            ));
        }
        let id = ConsumerId(self.next_consumer);
        self.next_consumer += 1;
        e.consumer = Some(id);
        Ok(Some(id))
    }

    /// The connection of `key` for its bound consumer `who`.
    ///
    /// # Errors
    /// `authentication` for any other caller; `not_found` when the session
    /// was retired (its record still says how it ended).
    pub fn get(&mut self, key: &RecordKey, who: ConsumerId) -> Result<&mut C, Error> {
        match self.entries.get_mut(key) {
            None => Err(Error::not_found(
                Operation::TerminalConsumer,
                Evidence::NotDispatched,
                Reason::TerminalRetired,
            )),
            Some(e) if e.consumer != Some(who) || e.consumer_lost => Err(Error::authentication(
                Operation::TerminalConsumer,
                Evidence::NotDispatched,
                Reason::TerminalConsumerBound,
            )),
            Some(e) => Ok(&mut e.conn),
        }
    }

    /// The connection of `key` for its owner (the runtime itself, to drive
    /// it or close it), whoever is attached.
    pub fn owner_get(&mut self, key: &RecordKey) -> Option<&mut C> {
        self.entries.get_mut(key).map(|e| &mut e.conn)
    }

    /// The session of `key` ended at `now` with `outcome`: as
    /// [`Registry::finished`], and when the session itself ended because
    /// nobody attached within its attach wait (its own timer can fire
    /// before this registry's, which started at registration), a late
    /// attach is `expired` — never bound to the ended session.
    pub fn ended(&mut self, now: Instant, key: &RecordKey, outcome: &Result<TerminalExit, Error>) {
        self.finished(now, key);
        let nobody_attached = matches!(outcome, Err(e)
            if e.category() == Category::Expired && e.operation() == Operation::TerminalConsumer);
        if let Some(e) = self.entries.get_mut(key)
            && nobody_attached
            && e.consumer.is_none()
        {
            e.expired = true;
        }
    }

    /// The session of `key` ended at `now`; its buffer stays for the final
    /// read, at most [`FINISHED_RETENTION`].
    pub fn finished(&mut self, now: Instant, key: &RecordKey) {
        if let Some(e) = self.entries.get_mut(key)
            && e.phase == Phase::Live
        {
            e.phase = Phase::Finished { at: now };
        }
    }

    /// The bound consumer read the final event: the buffer retires now.
    /// Returns the connection to drop.
    ///
    /// # Errors
    /// As [`Registry::get`].
    pub fn final_read(&mut self, key: &RecordKey, who: ConsumerId) -> Result<C, Error> {
        self.get(key, who)?;
        self.entries.remove(key).map(|e| e.conn).ok_or_else(|| {
            Error::not_found(
                Operation::TerminalConsumer,
                Evidence::NotDispatched,
                Reason::TerminalRetired,
            )
        })
    }

    /// The bound consumer dropped its handle: nobody may attach again (the
    /// session ends with `terminal_consumer`); a finished buffer retires.
    /// Returns a retired connection to drop.
    pub fn detach(&mut self, key: &RecordKey, who: ConsumerId) -> Option<C> {
        let e = self.entries.get_mut(key)?;
        if e.consumer != Some(who) {
            return None;
        }
        e.consumer_lost = true;
        if matches!(e.phase, Phase::Finished { .. }) {
            return self.entries.remove(key).map(|e| e.conn);
        }
        None
    }

    /// Time passed: live sessions nobody attached to within their attach
    /// wait are returned to be closed (`terminal_consumer`, their record
    /// says so); finished buffers older than [`FINISHED_RETENTION`] are
    /// retired and returned to be dropped.
    pub fn handle_timeout(&mut self, now: Instant) -> Timeouts<C> {
        let mut expire = Vec::new();
        let mut old = Vec::new();
        for (k, e) in &mut self.entries {
            match e.phase {
                Phase::Live if e.consumer.is_none() && !e.expired && now >= e.attach_by => {
                    e.expired = true;
                    expire.push((k.clone(), Expiry::NoConsumer));
                }
                Phase::Finished { at } if now >= at + FINISHED_RETENTION => old.push(k.clone()),
                _ => {}
            }
        }
        let retired = old
            .into_iter()
            .filter_map(|k| self.entries.remove(&k).map(|e| (k, e.conn)))
            .collect();
        (expire, retired)
    }

    /// When [`Registry::handle_timeout`] has something to do next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.entries
            .values()
            .filter_map(|e| match e.phase {
                Phase::Live if e.consumer.is_none() && !e.expired => Some(e.attach_by),
                Phase::Finished { at } => Some(at + FINISHED_RETENTION),
                Phase::Live => None,
            })
            .min()
    }

    /// Removes `key`'s session whatever its phase (the owner is shutting
    /// it down); returns the connection to drop.
    pub fn remove(&mut self, key: &RecordKey) -> Option<C> {
        self.entries.remove(key).map(|e| e.conn)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Reason;
    use crate::managed::patch::apply_exec;
    use crate::managed::testkit::{accepted, key, managed_exec_spec};
    use crate::managed::{ExecutionRecord, spec::Action, spec::ManagedTerminalSpec};

    const T0: u64 = 1_700_000_000_000;

    fn terminal_record(state: ExecState) -> ExecutionRecord {
        let mut spec = managed_exec_spec("t", &key("s", "machine-1"));
        spec.outputs.clear();
        spec.action = Action::Terminal(ManagedTerminalSpec::default());
        let mut rec = accepted(key("s", "term-1"), spec, T0);
        let path: &[ExecState] = match state {
            ExecState::Dispatching => &[
                ExecState::Preparing,
                ExecState::Ready,
                ExecState::Dispatching,
            ],
            ExecState::Running => &[
                ExecState::Preparing,
                ExecState::Ready,
                ExecState::Dispatching,
                ExecState::Running,
            ],
            _ => &[],
        };
        for (i, s) in path.iter().enumerate() {
            let ev = match s {
                ExecState::Dispatching => Some(RecordEvidence::DispatchUncertain),
                ExecState::Running => Some(RecordEvidence::RunningObserved),
                _ => None,
            };
            let p = ExecPatch {
                state: Some(*s),
                evidence: ev,
                ..ExecPatch::default()
            };
            rec = apply_exec(&rec, &p, T0 + i as u64 + 1).unwrap();
        }
        rec
    }

    fn apply_all(rec: &ExecutionRecord, patches: &[ExecPatch]) -> ExecutionRecord {
        let mut r = rec.clone();
        for (i, p) in patches.iter().enumerate() {
            r = apply_exec(&r, p, T0 + 100 + i as u64).unwrap();
        }
        r
    }

    #[test]
    fn a_confirmed_exit_completes_with_a_terminal_result_and_no_transcript() {
        for code in [0, 7, 123, 125, 129, 131, 255] {
            let v = Verdict::of(&Ok(TerminalExit { code }));
            assert_eq!(v, Verdict::Exited(code));
            let rec = terminal_record(ExecState::Running);
            let done = apply_all(&rec, &closing_patches(rec.state, &v, T0 + 100));
            assert_eq!(done.state, ExecState::Completed);
            assert_eq!(done.evidence, RecordEvidence::Exited);
            assert_eq!(done.result, Some(ExecResult::Terminal { exit_code: code }));
            assert_eq!(done.collection, Collection::Complete);
            assert!(done.artifacts.is_empty(), "no transcript");
        }
    }

    #[test]
    fn codes_124_130_and_minus_1_stay_uncertain() {
        for code in [124, 130, -1] {
            let v = Verdict::of(&Ok(TerminalExit { code }));
            let Verdict::Uncertain(e) = &v else {
                panic!("{code} must be uncertain: {v:?}")
            };
            assert_eq!(e.exit_code(), Some(code));
            let rec = terminal_record(ExecState::Running);
            let done = apply_all(&rec, &closing_patches(rec.state, &v, T0 + 100));
            assert_eq!(done.state, ExecState::Unknown);
            assert_eq!(done.result, None);
        }
        // The session itself reports them as errors: still uncertain.
        let e = Error::unknown(
            Operation::TerminalSession,
            Evidence::Unknown,
            Reason::Unspecified,
        )
        .with_exit_code(130);
        assert!(matches!(Verdict::of(&Err(e)), Verdict::Uncertain(_)));
    }

    #[test]
    fn a_terminal_result_refuses_the_sentinel_codes_in_the_record() {
        let rec = terminal_record(ExecState::Running);
        let bad = ExecPatch {
            state: Some(ExecState::Collecting),
            evidence: Some(RecordEvidence::Exited),
            result: Some(ExecResult::Terminal { exit_code: 130 }),
            ..ExecPatch::default()
        };
        assert!(apply_exec(&rec, &bad, T0 + 100).is_err());
        let wrong_kind = ExecPatch {
            result: Some(ExecResult::Exited {
                exit_code: 0,
                output_bytes: 0,
                truncated: false,
            }),
            ..bad
        };
        assert!(apply_exec(&rec, &wrong_kind, T0 + 100).is_err());
    }

    #[test]
    fn buffer_exhaustion_is_an_uncertain_output_limit() {
        let e = Error::output_limit(
            Operation::TerminalOutput,
            Evidence::Unknown,
            Reason::UnreadOutput,
        );
        let v = Verdict::of(&Err(e));
        assert!(matches!(&v, Verdict::Uncertain(e) if e.category() == Category::OutputLimit));
        let rec = terminal_record(ExecState::Running);
        let done = apply_all(&rec, &closing_patches(rec.state, &v, T0 + 100));
        assert_eq!(done.state, ExecState::Unknown);
        assert_eq!(done.result, None);
        assert_eq!(
            done.last_error.map(|e| e.category),
            Some("output_limit".to_owned())
        );
    }

    #[test]
    fn a_refused_open_fails_without_dispatch_and_a_finished_record_takes_nothing() {
        let e = Error::transport(
            Operation::TerminalOpen,
            Evidence::NotDispatched,
            Reason::Unspecified,
        );
        let v = Verdict::of(&Err(e));
        let rec = terminal_record(ExecState::Dispatching);
        let done = apply_all(&rec, &closing_patches(rec.state, &v, T0 + 100));
        assert_eq!(
            (done.state, done.evidence),
            (ExecState::Failed, RecordEvidence::NotDispatched)
        );
        let completed = apply_all(
            &rec,
            &closing_patches(rec.state, &Verdict::Exited(0), T0 + 100),
        );
        for v in [
            Verdict::Exited(1),
            Verdict::Uncertain(e),
            Verdict::NotSent(e),
        ] {
            assert!(closing_patches(completed.state, &v, T0 + 200).is_empty());
        }
    }

    // ---- the live registry ----

    #[allow(clippy::disallowed_methods)] // an arbitrary origin; time is virtual after
    fn origin() -> Instant {
        Instant::now()
    }

    fn k(id: &str) -> RecordKey {
        key("s", id)
    }

    const ATTACH: Duration = Duration::from_millis(5_000);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn the_limit_is_1_to_64() {
        assert!(Registry::<u8>::new(1).is_ok());
        assert!(Registry::<u8>::new(64).is_ok());
        assert!(Registry::<u8>::new(0).is_err());
        assert_eq!(
            Registry::<u8>::new(65).unwrap_err().reason(),
            Reason::TerminalLimit
        );
    }

    #[test]
    fn one_consumer_per_handle_and_no_take_over() {
        let t0 = origin();
        let mut r = Registry::new(4).unwrap();
        assert_eq!(r.attach(t0, &k("a")), Ok(None), "not registered yet");
        r.insert(t0, k("a"), 1u8, ATTACH).unwrap();
        let me = r.attach(t0 + ms(1), &k("a")).unwrap().unwrap();
        let other = r.attach(t0 + ms(2), &k("a")).unwrap_err();
        assert_eq!(
            (other.category(), other.reason()),
            (Category::Authentication, Reason::TerminalConsumerBound)
        );
        assert_eq!(*r.get(&k("a"), me).unwrap(), 1);
        let forged = ConsumerId(me.0 + 1);
        assert_eq!(
            r.get(&k("a"), forged).unwrap_err().category(),
            Category::Authentication
        );
        // Dropping the handle never frees the session for someone else.
        assert_eq!(r.detach(&k("a"), forged), None);
        assert_eq!(r.detach(&k("a"), me), None, "live: not retired");
        assert_eq!(
            r.attach(t0 + ms(3), &k("a")).unwrap_err().category(),
            Category::Authentication
        );
        assert_eq!(
            r.get(&k("a"), me).unwrap_err().category(),
            Category::Authentication
        );
        assert!(r.owner_get(&k("a")).is_some(), "the owner still closes it");
    }

    #[test]
    fn a_second_session_for_one_key_is_refused() {
        let t0 = origin();
        let mut r = Registry::new(4).unwrap();
        r.insert(t0, k("a"), 1u8, ATTACH).unwrap();
        let e = r.insert(t0, k("a"), 2u8, ATTACH).unwrap_err();
        assert_eq!(e.reason(), Reason::TerminalAlreadyRegistered);
        assert_eq!(r.len(), 1);
    }

    #[test]
    fn attach_wait_bounds_and_expiry_under_attach_ms() {
        let t0 = origin();
        assert_eq!(Registry::<u8>::attach_deadline(t0, ms(0)), Ok(t0));
        assert_eq!(
            Registry::<u8>::attach_deadline(t0, ms(30_000)),
            Ok(t0 + ms(30_000))
        );
        assert_eq!(
            Registry::<u8>::attach_deadline(t0, ms(30_001))
                .unwrap_err()
                .reason(),
            Reason::AttachWaitOutOfRange
        );
        let mut r = Registry::new(4).unwrap();
        r.insert(t0, k("late"), 1u8, ATTACH).unwrap();
        r.insert(t0, k("ok"), 2u8, ATTACH).unwrap();
        assert_eq!(r.poll_timeout(), Some(t0 + ATTACH));
        // One millisecond before the attach wait ends: still attachable.
        assert!(r.attach(t0 + ATTACH - ms(1), &k("ok")).unwrap().is_some());
        let (expired, retired) = r.handle_timeout(t0 + ATTACH - ms(1));
        assert!(expired.is_empty() && retired.is_empty());
        let (expired, _) = r.handle_timeout(t0 + ATTACH);
        assert_eq!(expired, vec![(k("late"), Expiry::NoConsumer)]);
        let e = r.attach(t0 + ATTACH, &k("late")).unwrap_err();
        assert_eq!(
            (e.category(), e.reason(), e.evidence()),
            (
                Category::Expired,
                Reason::TerminalConsumer,
                Evidence::Unknown
            )
        );
        // Expired once, reported once; still refused after it finished.
        r.finished(t0 + ATTACH + ms(5), &k("late"));
        assert!(r.handle_timeout(t0 + ATTACH + ms(6)).0.is_empty());
        assert_eq!(
            r.attach(t0 + ATTACH + ms(7), &k("late"))
                .unwrap_err()
                .category(),
            Category::Expired
        );
        // Attaching at exactly the deadline, before any timeout ran: expired.
        r.insert(t0, k("edge"), 3u8, ATTACH).unwrap();
        assert_eq!(
            r.attach(t0 + ATTACH, &k("edge")).unwrap_err().category(),
            Category::Expired
        );
    }

    /// The session's own attach timer fired before the registry's (which
    /// started later, at registration): the record says "nobody attached",
    /// so a late attach is `expired`, not bound to the ended session.
    #[test]
    fn a_session_ended_by_its_own_attach_wait_refuses_a_late_attach() {
        let t0 = origin();
        let mut r = Registry::new(4).unwrap();
        r.insert(t0, k("a"), 1u8, ATTACH).unwrap();
        r.insert(t0, k("b"), 2u8, ATTACH).unwrap();
        let own = Error::expired(
            Operation::TerminalConsumer,
            Evidence::Unknown,
            Reason::AttachWait,
        );
        r.ended(t0 + ms(10), &k("a"), &Err(own));
        let e = r.attach(t0 + ms(20), &k("a")).unwrap_err();
        assert_eq!(
            (e.category(), e.reason()),
            (Category::Expired, Reason::TerminalConsumer)
        );
        // Any other end (an exit, another error) stays readable once.
        r.ended(t0 + ms(10), &k("b"), &Ok(TerminalExit { code: 0 }));
        let me = r.attach(t0 + ms(20), &k("b")).unwrap().unwrap();
        assert_eq!(r.final_read(&k("b"), me), Ok(2));
    }

    #[test]
    fn a_session_that_ended_before_attach_can_still_be_read() {
        let t0 = origin();
        let mut r = Registry::new(4).unwrap();
        r.insert(t0, k("a"), 1u8, ATTACH).unwrap();
        r.finished(t0 + ms(10), &k("a"));
        let me = r.attach(t0 + ms(20), &k("a")).unwrap().unwrap();
        assert_eq!(r.final_read(&k("a"), me), Ok(1));
        assert!(r.is_empty());
    }

    #[test]
    fn finished_buffers_retire_after_30_s_or_at_the_final_read() {
        let t0 = origin();
        let mut r = Registry::new(4).unwrap();
        r.insert(t0, k("kept"), 1u8, ATTACH).unwrap();
        r.insert(t0, k("read"), 2u8, ATTACH).unwrap();
        let a = r.attach(t0, &k("kept")).unwrap().unwrap();
        let b = r.attach(t0, &k("read")).unwrap().unwrap();
        let end = t0 + ms(100);
        r.finished(end, &k("kept"));
        r.finished(end, &k("read"));
        assert_eq!(r.phase(&k("kept")), Some(Phase::Finished { at: end }));
        assert_eq!(r.live(), 0);
        assert_eq!(r.final_read(&k("read"), b), Ok(2));
        assert_eq!(
            r.get(&k("read"), b).unwrap_err().category(),
            Category::NotFound
        );
        assert_eq!(r.poll_timeout(), Some(end + FINISHED_RETENTION));
        let (_, retired) = r.handle_timeout(end + FINISHED_RETENTION - ms(1));
        assert!(retired.is_empty());
        assert!(r.get(&k("kept"), a).is_ok());
        let (_, retired) = r.handle_timeout(end + FINISHED_RETENTION);
        assert_eq!(retired, vec![(k("kept"), 1)]);
        assert!(r.is_empty());
        assert_eq!(r.poll_timeout(), None);
    }

    #[test]
    fn a_detached_finished_buffer_retires_at_once() {
        let t0 = origin();
        let mut r = Registry::new(4).unwrap();
        r.insert(t0, k("a"), 1u8, ATTACH).unwrap();
        let me = r.attach(t0, &k("a")).unwrap().unwrap();
        r.finished(t0 + ms(1), &k("a"));
        assert_eq!(r.detach(&k("a"), me), Some(1));
        assert!(r.is_empty());
    }

    #[test]
    fn at_the_active_limit_closed_buffers_retire_first() {
        let t0 = origin();
        let mut r = Registry::new(3).unwrap();
        for (i, id) in ["a", "b", "c"].iter().enumerate() {
            r.insert(t0 + ms(i as u64), k(id), i as u8, ATTACH).unwrap();
        }
        // N = 3 live sessions: the fourth is refused, nothing is retired.
        let e = r.insert(t0 + ms(5), k("d"), 9, ATTACH).unwrap_err();
        assert_eq!(
            (e.category(), e.reason()),
            (Category::AdmissionExhausted, Reason::TerminalLimit)
        );
        assert_eq!(e.limit().map(|l| (l.actual, l.max)), Some((4, 3)));
        assert_eq!(r.len(), 3);
        // Two closed buffers: the oldest-registered one goes first; the
        // live session is never retired.
        r.finished(t0 + ms(6), &k("c"));
        r.finished(t0 + ms(7), &k("b"));
        let retired = r.insert(t0 + ms(8), k("d"), 3, ATTACH).unwrap();
        assert_eq!(retired, Some((k("b"), 1)));
        let retired = r.insert(t0 + ms(9), k("e"), 4, ATTACH).unwrap();
        assert_eq!(retired, Some((k("c"), 2)));
        assert_eq!(r.phase(&k("a")), Some(Phase::Live));
        assert!(r.insert(t0 + ms(10), k("f"), 5, ATTACH).is_err());
    }

    #[test]
    fn debug_never_shows_the_connection() {
        let t0 = origin();
        let mut r = Registry::new(2).unwrap();
        r.insert(t0, k("a"), "SENTINEL-BYTES".to_owned(), ATTACH)
            .unwrap();
        let dbg = format!("{r:?}");
        assert!(!dbg.contains("SENTINEL"), "{dbg}");
        assert!(dbg.contains("live: 1"), "{dbg}");
    }

    #[test]
    fn retiring_touches_no_record() {
        // The registry has no store access at all: retiring a finished
        // buffer returns only the connection; a record completed before is
        // unchanged (durable completion evidence stays).
        let rec = terminal_record(ExecState::Running);
        let done = apply_all(
            &rec,
            &closing_patches(rec.state, &Verdict::Exited(7), T0 + 100),
        );
        let t0 = origin();
        let mut r = Registry::new(1).unwrap();
        r.insert(t0, done.key.clone(), done.clone(), ATTACH)
            .unwrap();
        r.finished(t0, &done.key);
        let (_, retired) = r.handle_timeout(t0 + FINISHED_RETENTION);
        assert_eq!(retired.len(), 1);
        assert_eq!(retired[0].1, done);
        assert_eq!(done.result, Some(ExecResult::Terminal { exit_code: 7 }));
    }
}
