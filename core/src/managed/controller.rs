//! The managed runtime as one sans-IO object per controller process
//! (DESIGN.md §5a; features C12, C13, C15, C16, C17.1, C20).
//!
//! A [`Controller`] runs many executions at once. It never performs I/O:
//! it asks its driver (the shells' `Runtime`) for store and worker
//! operations and is told their results. Time is an argument: every input
//! takes a monotonic `now: Instant` and a wall-clock `now_ms: u64`; the
//! controller reads no clock.
//!
//! # Inputs
//! - commands: [`Controller::submit`], [`Controller::cancel`],
//!   [`Controller::reconcile`], [`Controller::shutdown`];
//! - [`Controller::handle_stored`]`(now, now_ms, op_id, result)`: the answer
//!   to a [`StoreOp`];
//! - [`Controller::handle_worker`]`(now, now_ms, op_id, result)`: the answer
//!   to a [`WorkerOp`];
//! - [`Controller::handle_timeout`]`(now, now_ms)`: call it at (or after)
//!   [`Controller::poll_timeout`].
//!
//! # Outputs (drain all four after every input)
//! - [`Controller::poll_store_op`] → `(OpId, StoreOp)`: perform with
//!   `smolbox_store::apply_op` and answer with `handle_stored`;
//! - [`Controller::poll_worker_op`] → `(OpId, WorkerOp)`: perform with the
//!   worker's client and answer with `handle_worker`;
//! - [`Controller::poll_event`] → [`ControllerEvent`]: acceptance and completion
//!   notices (never dropped), then telemetry (bounded, lossy, C20);
//! - [`Controller::poll_timeout`] → when to call `handle_timeout`.
//!
//! Several ops may be outstanding at once, in any order of completion;
//! each execution has at most one store op and one worker op outstanding.
//!
//! # What it does (C13, C15, C16, C17.1)
//! An execution runs on a machine the caller names
//! ([`ExecutionSpec::worker_machine`]): accept → claim → `preparing` →
//! `ready` → claim again (refreshed immediately before the intent, C15) →
//! `dispatching` (durable before any byte is sent) → [`WorkerOp::Exec`]
//! with the command decoded from the **stored** spec → `collecting` with
//! the exit → `completed`; an exec error that may have reached the worker →
//! `unknown`; an exec refused with `not_dispatched` → `failed`. The record
//! claim is renewed every third of the TTL while the execution is driven
//! (so a command may outlive its claim TTL many times). At most
//! `max_active` executions are driven at once; accepted records beyond that
//! stay due in the store and are picked up by the due scan.
//!
//! Recovery is a procedure, not a caller's job: on start and every poll
//! interval the controller pages through due records of its workers and
//! moves each forward: possibly dispatched without a saved exit →
//! `unknown` (never re-sent); `collecting` → `completed`; not yet
//! dispatched → dispatched once from the stored spec (after re-checking
//! it). A record another live controller holds (`stale_claim`) is left
//! alone and retried after one claim TTL. A due row of a record this
//! controller already drives goes to its execution: one showing it past
//! `ready` before this execution's own intent means the command is never
//! sent from it (fuzz finding 5).
//!
//! Cancel (C16) persists the request; before dispatch the record becomes
//! `cancelled` / `not_dispatched` (the store refuses the `dispatching`
//! intent of a record with a cancel request, so nothing is sent); after
//! dispatch the observation ends (`cancelling` → `unknown`) unless an exit
//! is observed, which wins. Deadlines (C13.4) are enforced with both the
//! stored wall-clock deadline and a monotonic bound taken when the
//! controller first saw the record, so a wall-clock step backwards never
//! extends a budget: past the queue deadline an accepted record becomes
//! `expired`; past the preparation deadline `failed`; past the execution
//! deadline the observation ends (`unknown`; a later exit still wins).
//!
//! A store failure is never read as absence and never a reason to resend:
//! a failed write is retried (the guard makes a retry safe) a bounded
//! number of times, then the execution is reported [`ControllerEvent::Finished`] with
//! the error, its evidence saying what is known about the command. The
//! exception is a claim renewal while the command runs: it is retried with
//! a bounded backoff (poll interval × 2ⁿ, at most a third of the TTL) for as
//! long as the exec is outstanding, never given up.
//!
//! An observed exit is never dropped while the record can still take it
//! (`unknown`/`cancelling` without a result): when another controller's
//! claim stops its write (`stale_claim`, e.g. after this one was paused and
//! the other marked the record `unknown`), the record is fetched, the write
//! is retried once that claim has lapsed (within one TTL), then claimed and
//! written `collecting`. Writing `collecting` makes the record due (now), so
//! if this controller stops before `completed` the due scan finishes it.
//!
//! [`Controller::poll_timeout`] never returns a time at which
//! [`Controller::handle_timeout`] would do nothing: a store retry's time
//! replaces an already-due renewal, and an execution waiting for its worker
//! lease or only for the worker's answer adds no timer of its own.
//!
//! Leases, claims and generations fence store writes only; they never
//! prove that an HTTP request already sent cannot still take effect (C15).
//!
//! # Disposable machines (C12.4, C17.2)
//! A spec with neither `worker_machine` nor a retained `machine` runs on a
//! machine the controller creates, on a configured worker with an admitted
//! profile ([`WorkerEntry::with_profile`]): claim → worker lease (taken and
//! renewed every third of the TTL while needed; live only until its TTL
//! counted on the monotonic clock from the request, whatever the wall
//! clock says; every write on an assigned record is fenced by it) → `reserve` (capacity and a machine name
//! `sbx-<hash of the key>` in one transaction) → `preparing` (the durable
//! create intent) → [`WorkerOp::Create`] (the call itself matches the reply
//! to the request) → creation evidence (incarnation token) →
//! [`WorkerOp::Start`] → `ready` → the common path → `collecting` →
//! `completed` with cleanup `in_progress` → the cleanup decision, chosen
//! before mutating: finished or never dispatched → inspect and verify the
//! incarnation → [`WorkerOp::Delete`] → inspect until the 404 → absence
//! recorded, cleanup `complete` → `release` as a store op of its own;
//! `unknown` within retention → [`WorkerOp::Stop`], disks kept, due again
//! at the end of retention; after retention → delete as above. A create
//! whose outcome is uncertain (or whose reply does not match) is never sent
//! again, nothing is started or adopted, and the reservation is kept
//! (cleanup `failed`); a create refused with `not_dispatched` records
//! absence and releases. Failed cleanup mutations are bounded by
//! `cleanup_attempts`. A record assigned under another worker-lease
//! generation (left by a crashed or paused controller) is fenced (C15):
//! the controller holding the worker lease re-fences it with
//! [`StoreOp::ClaimVersion`] at the version it read, then moves it forward
//! from what is stored — `accepted` with a reservation → its own create
//! intent; `preparing` without creation evidence → `failed`, reservation
//! kept (the create may have been sent); `preparing` with evidence but no
//! start of its own → `failed` and deleted (the start may have been sent);
//! possibly dispatched → `unknown`. Only the controller that moved a record
//! into `unknown` sends its graceful stop. A machine answer is kept until
//! the write acting on it succeeds.
//!
//! Declared files (C6.4): after the start and before `ready`, each input
//! is uploaded ([`WorkerOp::Upload`], bytes from the driver's artifact
//! store, digest checked before I/O) and read back ([`WorkerOp::Download`]
//! without a destination) to its declared size and digest; after the
//! result is stored (`collecting`), each output is downloaded into the
//! artifact store (a disposable machine re-inspected running first) and
//! `completed` records their sizes and digests, or `collection_failed`
//! keeps the exit. A background command runs only in a retained
//! machine's slot and ends `launched` (C5.4). See docs/decisions/runtime.md,
//! "Managed files and background launches".

use crate::Reason;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

mod accept;
mod exec;
mod leases;
pub mod machines;
pub mod ops;
pub mod release;
mod resolve;
mod rows;
mod target;
mod telemetry;
pub mod terminal;
mod worker;

pub use target::{RunTarget, command_of, spec_for};
pub use telemetry::{Lifecycle, Telemetry};
pub use worker::WorkerEntry;

pub use ops::{
    Claimed, DueAfter, OpId, Reservation, StoreOp, StoreReply, StoreResult, WorkerOp, WorkerReply,
    WorkerResult,
};

pub use machines::{
    MachineAnswer, MachineDone, MachineRequest, RequestId, Resolution, machine_settled, slot_free,
};

use self::exec::{Exec, Step};
use self::leases::Leases;
use self::machines::{Mach, Req};
use super::record::{Claim, ExecResult, ExecutionRecord, MachineRecord};
use super::spec::{Action, ExecutionSpec};
use super::state::{ExecState, RecordEvidence};
use super::{FingerprintKey, RecordKey, check_identifier, check_worker_id, fingerprint};
use crate::exec::ExecOutput;
use crate::{Error, Operation};

/// Default `max_pending` (C12.1).
pub const DEFAULT_MAX_PENDING: u32 = 128;
/// Default most executions driven at once (C12.1).
pub const DEFAULT_MAX_ACTIVE: usize = 4;
/// Largest `max_active` (C12.1).
pub const MAX_ACTIVE: usize = 64;
/// Default poll interval in milliseconds (C12.1).
pub const DEFAULT_POLL_INTERVAL_MS: u64 = 250;
/// Default lease and claim TTL in milliseconds (C12.1).
pub const DEFAULT_LEASE_TTL_MS: u64 = 30_000;
/// Default cleanup attempts (C12.1).
pub const DEFAULT_CLEANUP_ATTEMPTS: u32 = 5;
/// Default telemetry queue length (C12.1).
pub const DEFAULT_TELEMETRY_PENDING: usize = 128;
/// Largest telemetry queue length (C12.1).
pub const MAX_TELEMETRY_PENDING: usize = 1_024;
/// Most configured workers (C12.1).
pub const MAX_WORKERS: usize = 64;
/// Page size of the due scan.
pub const DUE_PAGE: u32 = 100;
/// Consecutive store failures of one execution before it is given up.
pub const MAX_STORE_RETRIES: u32 = 5;
/// Keys whose output callers of one controller may want streamed at once
/// ([`Controller::stream_output`]).
pub const MAX_STREAMS: usize = 64;

/// Controller options (C12.1) with their ranges, checked by
/// [`ControllerConfig::validate`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ControllerConfig {
    /// Controller identifier (claims and leases are taken under it); must be
    /// unique per process.
    pub owner: String,
    /// Configured workers (≤64, unique ids). The controller only touches
    /// records whose machine is on one of them (its namespace).
    pub workers: Vec<WorkerEntry>,
    /// `max_pending` of `accept` (1–10,000).
    pub max_pending: u32,
    /// Most executions driven at once (1–64).
    pub max_active: usize,
    /// Due-scan interval in milliseconds (10–5,000).
    pub poll_interval_ms: u64,
    /// Claim and worker-lease TTL (1,000–900,000 and ≥ 4 × poll interval).
    pub lease_ttl_ms: u64,
    /// Cleanup mutation attempts (1–20).
    pub cleanup_attempts: u32,
    /// Telemetry queue length (1–1,024); older entries are dropped first.
    pub telemetry_pending: usize,
    /// The submitter's claim is written in the acceptance transaction
    /// itself (the accepted record carries it), so another controller's
    /// due scan cannot take a freshly accepted record — and run it where
    /// its submitter cannot see the output — before the submitter claims
    /// it. Default true; false for a submitter that only makes the intent
    /// durable and leaves the record to whichever controller comes next
    /// (`smolbox run --detach`).
    pub claim_at_accept: bool,
    /// The driver has an artifact store (`smolbox_store::artifacts`):
    /// specs with input or output files are accepted (C6.4). Default
    /// false: they are refused with `unsupported_capability`.
    pub artifacts: bool,
    /// A bug planted on purpose, so the recovery simulation
    /// (`tests/src/sim`) can show that it catches it; `None` everywhere
    /// else. Only in `testkit` builds (never in a production build).
    #[cfg(feature = "testkit")]
    #[doc(hidden)]
    pub planted: Option<Planted>,
}

/// Bugs the recovery simulation plants in the controller itself (the
/// others live in its driver): each restores a behaviour that a finding
/// removed. `testkit` builds only.
#[cfg(feature = "testkit")]
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Planted {
    /// A resumed `preparing` record whose inputs another controller may
    /// have uploaded is staged again (the uploads resent while uncertain;
    /// sim finding 10, fixed in session 7).
    RestageResumedPreparing,
    /// A create the worker's create handler refused (400 `BAD_REQUEST`
    /// envelope) is taken for a passing failure and sent again (the one
    /// create of a disposable machine resent; session 10).
    ResendRefusedCreate,
}

impl ControllerConfig {
    /// Defaults of C12.1 for `owner`, no workers.
    pub fn new(owner: &str) -> Self {
        Self {
            owner: owner.to_owned(),
            workers: Vec::new(),
            max_pending: DEFAULT_MAX_PENDING,
            max_active: DEFAULT_MAX_ACTIVE,
            poll_interval_ms: DEFAULT_POLL_INTERVAL_MS,
            lease_ttl_ms: DEFAULT_LEASE_TTL_MS,
            cleanup_attempts: DEFAULT_CLEANUP_ATTEMPTS,
            telemetry_pending: DEFAULT_TELEMETRY_PENDING,
            claim_at_accept: true,
            artifacts: false,
            #[cfg(feature = "testkit")]
            planted: None,
        }
    }

    /// Checks every range of C12.1.
    ///
    /// # Errors
    /// `validation` (operation `config`) naming the first bad option.
    pub fn validate(&self) -> Result<(), Error> {
        let bad = |reason| Err(Error::validation(Operation::Config, reason));
        if check_identifier(&self.owner).is_err() {
            return bad(Reason::Owner);
        }
        if self.workers.len() > MAX_WORKERS {
            return Err(Error::validation(Operation::Config, Reason::TooManyWorkers)
                .with_limit(self.workers.len() as u64, MAX_WORKERS as u64));
        }
        let mut ids = BTreeSet::new();
        for w in &self.workers {
            if check_worker_id(&w.id).is_err() {
                return bad(Reason::WorkerId);
            }
            if !ids.insert(w.id.as_str()) {
                return bad(Reason::DuplicateWorker);
            }
            let c = w.capacity;
            let range = 1..=1_048_576;
            if ![c.slots, c.cpus, c.memory_mb, c.disk_gb]
                .iter()
                .all(|v| range.contains(v))
            {
                return bad(Reason::WorkerCapacity);
            }
            if let Some(cat) = &w.catalog {
                cat.validate(w.profile.as_ref().map(|p| p.version_text()))?;
            }
        }
        if !(1..=10_000).contains(&self.max_pending) {
            return Err(Error::validation(Operation::Config, Reason::MaxPending)
                .with_limit(u64::from(self.max_pending), 10_000));
        }
        if !(1..=MAX_ACTIVE).contains(&self.max_active) {
            return Err(Error::validation(Operation::Config, Reason::MaxActive)
                .with_limit(self.max_active as u64, MAX_ACTIVE as u64));
        }
        if !(10..=5_000).contains(&self.poll_interval_ms) {
            return Err(Error::validation(Operation::Config, Reason::PollInterval)
                .with_limit(self.poll_interval_ms, 5_000));
        }
        if !(1_000..=900_000).contains(&self.lease_ttl_ms)
            || self.lease_ttl_ms < 4 * self.poll_interval_ms
        {
            return Err(Error::validation(Operation::Config, Reason::LeaseTtl)
                .with_limit(self.lease_ttl_ms, 900_000));
        }
        if !(1..=20).contains(&self.cleanup_attempts) {
            return Err(
                Error::validation(Operation::Config, Reason::CleanupAttempts)
                    .with_limit(u64::from(self.cleanup_attempts), 20),
            );
        }
        if !(1..=MAX_TELEMETRY_PENDING).contains(&self.telemetry_pending) {
            return Err(
                Error::validation(Operation::Config, Reason::TelemetryPending)
                    .with_limit(self.telemetry_pending as u64, MAX_TELEMETRY_PENDING as u64),
            );
        }
        Ok(())
    }

    fn poll(&self) -> Duration {
        Duration::from_millis(self.poll_interval_ms)
    }

    /// How often a held claim is renewed: a third of the TTL.
    fn renew_every(&self) -> Duration {
        Duration::from_millis(self.lease_ttl_ms / 3)
    }

    /// See [`claim_fresh`].
    fn claim_fresh(&self, asked: Option<Instant>, just: bool, now: Instant) -> bool {
        asked.is_some_and(|at| claim_fresh(at, just, now, self.lease_ttl_ms))
    }

    /// The admitted version profile of the configured worker `worker_id`
    /// (`None`: not configured here, or configured without a profile).
    fn profile_of(&self, worker_id: &str) -> Option<Box<crate::worker::Profile>> {
        self.workers
            .iter()
            .find(|w| w.id == worker_id)
            .and_then(|w| w.profile.clone())
    }
}

/// True while a claim of this controller asked at `at` (monotonic) is
/// fresh enough to write or send under without renewing it first (C15):
/// less than a third of the TTL has passed since it was **asked** (not
/// since its answer arrived: a slow answer leaves it less fresh), or
/// `just` — its answer was the last store answer, so the op that follows
/// it goes out under it — while its whole TTL counted from the request
/// has not run out. The second rule keeps a store slower than a third of
/// the TTL moving (each renewal would otherwise be stale on arrival).
pub(crate) fn claim_fresh(at: Instant, just: bool, now: Instant, ttl_ms: u64) -> bool {
    let age = now.saturating_duration_since(at);
    age < Duration::from_millis(ttl_ms / 3) || (just && age < Duration::from_millis(ttl_ms))
}

/// A command to run: its record key and spec (C12.4).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Submit {
    /// Scope and id (the idempotency key).
    pub key: RecordKey,
    /// What to run, where.
    pub spec: ExecutionSpec,
}

/// How one execution ended for this controller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finished {
    /// Record key.
    pub key: RecordKey,
    /// The record as last stored (absent when it never was).
    pub record: Option<ExecutionRecord>,
    /// The command's output when this controller observed its exit (held
    /// in memory only, never stored).
    pub output: Option<ExecOutput>,
    /// The error that ended the execution here, or the exec error stored
    /// as its outcome; its evidence says what is known about the command.
    pub error: Option<Error>,
    /// True when this controller sent the command.
    pub dispatched: bool,
    /// True when another controller holds the record (it was left alone).
    pub held_elsewhere: bool,
}

impl Finished {
    /// The stored exit code, if an exit was observed (by any controller).
    pub fn exit_code(&self) -> Option<i32> {
        self.record.as_ref()?.result.as_ref()?.exit_code()
    }
}

/// An error that ends the driving of a command or terminal carries what is
/// known about it (its `Evidence`). A store refusal (`stale_claim`,
/// `stale_version`, …) says `not_dispatched` about its own call; once the
/// command may have been sent (`sent`, or a record past its dispatch
/// intent), that is corrected to the record's evidence when it says more
/// (with the recorded exit code), else `dispatch_uncertain`. An error that
/// already says more (a worker's `exited`, `dispatch_uncertain`) is kept.
pub(super) fn with_known_evidence(e: Error, rec: Option<&ExecutionRecord>, sent: bool) -> Error {
    let sent = sent || rec.is_some_and(|r| !r.state.is_before_dispatch());
    if !sent
        || !matches!(
            e.evidence(),
            crate::Evidence::NotDispatched | crate::Evidence::Unknown
        )
    {
        return e;
    }
    let e = match rec.map(|r| r.evidence) {
        Some(ev) if !matches!(ev, RecordEvidence::NotDispatched | RecordEvidence::Unknown) => {
            e.with_evidence(ev.to_error_evidence())
        }
        _ => e.with_evidence(crate::Evidence::DispatchUncertain),
    };
    match rec
        .and_then(|r| r.result.as_ref())
        .and_then(ExecResult::exit_code)
    {
        Some(code) => e.with_exit_code(code),
        None => e,
    }
}

/// What `submit` returns at durable acceptance (C16).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Submission {
    /// The record key (the handle).
    pub key: RecordKey,
    /// True when the record already existed with the same identity.
    pub existing: bool,
    /// The record's version as the acceptance read or wrote it (a wait
    /// that starts from it needs no first store read while this runtime
    /// drives the key).
    pub version: u64,
}

/// What a caller's wait returns: the record once terminal or `unknown`
/// (C16), with the output when this process observed the exit, or the
/// error that made this controller stop driving it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// The record as stored.
    pub record: ExecutionRecord,
    /// The command's output when this process observed the exit.
    pub output: Option<ExecOutput>,
    /// The exec error stored as the outcome, or the error that ended the
    /// execution here (its evidence says what is known about the command).
    pub error: Option<Error>,
}

impl Outcome {
    /// The stored exit code, else the exit code the error carries.
    pub fn exit_code(&self) -> Option<i32> {
        match self.record.result.as_ref().and_then(ExecResult::exit_code) {
            Some(code) => Some(code),
            None => self.error.as_ref().and_then(Error::exit_code),
        }
    }

    /// The rule of a caller's wait: given the record just read from the
    /// store, the controller's notice for the key (if any) and whether the
    /// controller still drives the key, the outcome to return, or `None` to
    /// keep waiting. A notice of a record another controller holds is not
    /// an outcome; one that ended with an error is, even before the record
    /// settles (the controller will not move it any more).
    pub fn settle(
        record: ExecutionRecord,
        notice: Option<&Finished>,
        driven: bool,
    ) -> Option<Self> {
        let notice = notice.filter(|f| !f.held_elsewhere);
        match notice {
            Some(f) if !driven => {
                let record = match &f.record {
                    Some(r) if r.version > record.version => r.clone(),
                    _ => record,
                };
                if record.state.ends_wait() || f.error.is_some() {
                    Some(Self {
                        record,
                        output: f.output.clone(),
                        error: f.error,
                    })
                } else {
                    None
                }
            }
            // Still driven here and terminal: the notice (with the output)
            // follows at once; wait for it. `unknown` ends the wait even
            // while an exec is still observed (a late exit may follow).
            _ if driven && record.state != ExecState::Unknown => None,
            _ if record.state.ends_wait() => Some(Self {
                record,
                output: None,
                error: None,
            }),
            _ => None,
        }
    }
}

/// A controller id unique per process (never a shared constant):
/// `ctl-<pid>-<16 hex digits of randomness>`.
pub fn owner_id(pid: u32, random: u64) -> String {
    format!("ctl-{pid}-{random:016x}")
}

/// What the controller tells its driver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ControllerEvent {
    /// A submission is durable (`existing`: it already was, same identity).
    Accepted {
        /// Record key.
        key: RecordKey,
        /// True when the record already existed.
        existing: bool,
        /// The record as stored.
        record: Box<ExecutionRecord>,
    },
    /// A submission was refused (nothing was dispatched).
    Refused {
        /// Record key.
        key: RecordKey,
        /// Why (`identity_conflict`, `admission_exhausted`, `store`, …).
        error: Error,
    },
    /// A cancel request is durable; the record as the store returned it.
    CancelRecorded {
        /// Record key.
        key: RecordKey,
        /// The record, or the store's error.
        result: Result<Box<ExecutionRecord>, Error>,
    },
    /// This controller stopped driving an execution.
    Finished(Box<Finished>),
    /// Lifecycle telemetry (lossy).
    Telemetry(Telemetry),
    /// A retained-machine request ([`Controller::machine`]) finished.
    Machine(Box<MachineDone>),
    /// A managed terminal's record is due (found by the due scan): the
    /// controller never drives terminals itself; the driver's terminal
    /// module resumes it (`TerminalRun::resume`, recovery C7.4). Reported
    /// at most once per claim TTL per record.
    TerminalDue(Box<ExecutionRecord>),
    /// After [`Controller::shutdown`]: nothing is outstanding any more.
    Stopped,
}

/// What an outstanding op is for.
#[derive(Clone, Debug)]
enum Purpose {
    Lease(String),
    /// An acceptance; `true` when it carries the dispatch intent (a slot
    /// of `max_active` is kept for it until the answer); when it was asked
    /// (the claim it carries counts from then, C15).
    Accept(RecordKey, bool, Instant),
    Exec(RecordKey),
    Scan,
    Cancel(RecordKey),
    /// A machine task's op.
    Mach(RecordKey),
    /// A caller request's op.
    Req(RequestId),
    /// The machine of a retained command found by the due scan.
    Adopt(Box<ExecutionRecord>),
    MachineScan,
    /// A claim release at shutdown.
    Release(Claimed),
    /// A submission this configuration refuses, looked up (AC-12.5.2).
    Resolve(Box<resolve::Refused>),
    /// The inspect of a caller-named machine before an acceptance.
    Preflight(Box<accept::Preflight>),
}

/// The managed controller (see the module docs for inputs, outputs and
/// behaviour).
#[derive(Debug)]
pub struct Controller {
    cfg: ControllerConfig,
    fingerprint_key: FingerprintKey,
    next_op: u64,
    ops: BTreeMap<OpId, Purpose>,
    store_out: VecDeque<(OpId, StoreOp)>,
    worker_out: VecDeque<(OpId, WorkerOp)>,
    notices: VecDeque<ControllerEvent>,
    telemetry: VecDeque<Telemetry>,
    telemetry_epoch: u64,
    telemetry_dropped: u64,
    dropped_since_delivery: bool,
    /// Machine lifecycle writes whose answers are out (telemetry).
    lifecycle_ops: telemetry::LifecycleOps,
    /// Executions being driven (≤ max_active once started).
    execs: BTreeMap<RecordKey, Exec>,
    /// Keys submitted here whose acceptance is outstanding (how many).
    accepting: BTreeMap<RecordKey, u32>,
    /// Rows past `ready` that replies (another acceptance, a cancel, a due
    /// scan) showed for a key whose acceptance is still out while no
    /// execution drove it: handed to the execution a later acceptance
    /// starts (fuzz campaign of session 8). Dropped with the last
    /// acceptance of the key.
    accept_rows: BTreeMap<RecordKey, Vec<ExecutionRecord>>,
    /// Acceptances with their dispatch intent outstanding: each keeps one
    /// of the `max_active` slots, so its answer is always driven at once.
    intent_accepts: usize,
    /// Records held by another controller: not retried before the instant.
    skip: BTreeMap<RecordKey, Instant>,
    scan_at: Option<Instant>,
    scan_cursor: Option<DueAfter>,
    scanning: bool,
    shutting_down: bool,
    stopped_sent: bool,
    /// Monotonic queue deadlines of records accepted here but left due in
    /// the store (no room): kept so a wall-clock step backwards cannot
    /// extend their queue budget before they are picked up (≤ max_pending).
    queue_bounds: BTreeMap<RecordKey, Instant>,
    /// Records may be left due in the store for lack of room: an accept
    /// while busy, a scan stopped or skipped for lack of room, or the start
    /// (nothing scanned yet). Only then does a finished execution start a
    /// due scan at once; otherwise the next one runs at the poll interval
    /// (issue 16: no scan per command when nothing waits).
    backlog: bool,
    leases: Leases,
    /// Largest wall clock seen (a step backwards never moves time back).
    now_ms: u64,
    /// Latest monotonic time given (every input sets it): when an op
    /// handed out outside a pump was asked.
    now: Instant,
    /// Retained machines driven here (≤ max_active once started).
    machs: BTreeMap<RecordKey, Mach>,
    /// Caller requests in flight.
    reqs: BTreeMap<RequestId, Req>,
    next_req: u64,
    /// The machine record each retained command driven here was started
    /// from (for its slot finish).
    slot_machines: BTreeMap<RecordKey, (MachineRecord, Option<Instant>)>,
    mscan_at: Option<Instant>,
    mscan_cursor: Option<DueAfter>,
    mscanning: bool,
    /// Claims this controller holds, for their release at shutdown
    /// (≤ [`release::MAX_HELD`]).
    held: BTreeMap<Claimed, release::Held>,
    /// The driver's terminal runs (same owner) are live.
    terminals_live: bool,
    /// Keys whose output a caller of this process wants as it comes
    /// ([`Controller::stream_output`]; at most [`MAX_STREAMS`]).
    streamed: BTreeSet<RecordKey>,
}

impl Controller {
    /// A controller with `cfg` and the host's fingerprint key, started at
    /// `now`: the first due scan (recovery, C17.1) is due immediately.
    ///
    /// # Errors
    /// `validation` (operation `config`) for a bad option.
    pub fn new(
        cfg: ControllerConfig,
        fingerprint_key: FingerprintKey,
        now: Instant,
        now_ms: u64,
    ) -> Result<Self, Error> {
        cfg.validate()?;
        let scan_at = if cfg.workers.is_empty() {
            None
        } else {
            Some(now)
        };
        let mut ctl = Self {
            cfg,
            fingerprint_key,
            next_op: 1,
            ops: BTreeMap::new(),
            store_out: VecDeque::new(),
            worker_out: VecDeque::new(),
            notices: VecDeque::new(),
            telemetry: VecDeque::new(),
            telemetry_epoch: 0,
            telemetry_dropped: 0,
            dropped_since_delivery: false,
            lifecycle_ops: telemetry::LifecycleOps::default(),
            execs: BTreeMap::new(),
            accepting: BTreeMap::new(),
            accept_rows: BTreeMap::new(),
            intent_accepts: 0,
            skip: BTreeMap::new(),
            scan_at,
            scan_cursor: None,
            scanning: false,
            shutting_down: false,
            stopped_sent: false,
            queue_bounds: BTreeMap::new(),
            backlog: true,
            leases: Leases::default(),
            now_ms,
            now,
            machs: BTreeMap::new(),
            reqs: BTreeMap::new(),
            next_req: 1,
            slot_machines: BTreeMap::new(),
            mscan_at: scan_at,
            mscan_cursor: None,
            mscanning: false,
            held: BTreeMap::new(),
            terminals_live: false,
            streamed: BTreeSet::new(),
        };
        ctl.pump(now);
        Ok(ctl)
    }

    /// The options.
    pub fn config(&self) -> &ControllerConfig {
        &self.cfg
    }

    /// Executions currently driven by this controller.
    pub fn active(&self) -> usize {
        self.execs.len()
    }

    /// Executions driven plus acceptances whose intent is outstanding.
    fn busy(&self) -> usize {
        self.execs.len() + self.intent_accepts
    }

    /// True when the controller drives `key` right now, or its acceptance
    /// is outstanding (a caller waiting on it should wait for the notice).
    pub fn is_active(&self, key: &RecordKey) -> bool {
        self.execs.contains_key(key) || self.accepting.contains_key(key)
    }

    /// Every key [`Controller::is_active`] is true for.
    pub fn active_keys(&self) -> impl Iterator<Item = &RecordKey> {
        self.execs
            .keys()
            .chain(self.accepting.keys())
            .chain(self.machs.values().flat_map(Mach::finishing_keys))
    }

    /// Telemetry entries dropped so far (C20).
    pub fn telemetry_dropped(&self) -> u64 {
        self.telemetry_dropped
    }

    /// The spec's fingerprint under this controller's key.
    pub fn fingerprint(&self, spec: &ExecutionSpec) -> String {
        fingerprint::exec_fingerprint(&self.fingerprint_key, spec)
    }

    /// Submits a command (C12.4, C12.5, C16): checks the spec against the
    /// catalog (refused with `unsupported_capability` before anything is
    /// stored), fingerprints it and asks the store to accept it. The answer
    /// is [`ControllerEvent::Accepted`] (also for a duplicate, `existing: true`) or
    /// [`ControllerEvent::Refused`]. A duplicate of an execution driven here joins it.
    /// A refusal of this configuration's workers and catalogs comes as
    /// `Refused` after a store read, unless the key is stored (AC-12.5.2).
    /// A command on a caller-named machine that needs a plain image
    /// machine is inspected first (`accept.rs`): its refusal, too, comes
    /// as `Refused` unless the key is stored.
    ///
    /// # Errors
    /// `validation` for a bad key, spec or time; `unsupported_capability`
    /// for what this controller cannot run (but see above); `admission_exhausted` after
    /// [`Controller::shutdown`]. Nothing is stored on error.
    pub fn submit(&mut self, now: Instant, now_ms: u64, submit: Submit) -> Result<(), Error> {
        self.observe_clock(now, now_ms);
        if self.shutting_down {
            return Err(Error::admission_exhausted(
                Operation::Submit,
                Reason::ShuttingDown,
            ));
        }
        submit
            .key
            .validate()
            .map_err(|e| e.with_operation(Operation::Submit))?;
        submit
            .spec
            .validate()
            .map_err(|e| e.with_operation(Operation::Submit))?;
        if let Err(e) = self.check_catalog(&submit.spec) {
            return self.resolve_refused(submit, e);
        }
        command_of(&submit.spec)?.validate()?;
        if let Some((op, check)) = self.named_preflight(&submit)? {
            // Asked of the worker first (`accept.rs`); accepted after.
            self.preflight(submit, op, check);
            return Ok(());
        }
        self.accept(submit)
    }

    /// A caller of this process wants (`on`) or no longer wants the output
    /// of `key`'s command as it comes. If this controller sends that
    /// command afterwards, it goes out as [`WorkerOp::ExecStream`] (when the
    /// command can be streamed: no stdin, not background) and its exit is
    /// recorded exactly like a buffered one; the output is the driver's to
    /// forward and is never stored. Call it before the submission. A
    /// command already sent, or driven by another controller, is not
    /// streamed. At most [`MAX_STREAMS`] keys are kept: beyond that the
    /// request is ignored and the command goes out buffered (its output in
    /// the [`Finished`] notice); the runtimes refuse a caller first.
    pub fn stream_output(&mut self, key: RecordKey, on: bool) {
        if !on {
            self.streamed.remove(&key);
        } else if self.streamed.len() < MAX_STREAMS {
            self.streamed.insert(key);
        }
    }

    /// Requests cancellation of `key` (C16): the first cancel time is
    /// persisted (idempotent) and the record made due; the answer is
    /// [`ControllerEvent::CancelRecorded`]. The execution then moves as the module
    /// docs say. Cancelling a finished record changes nothing.
    pub fn cancel(&mut self, now: Instant, now_ms: u64, key: RecordKey) {
        self.observe_clock(now, now_ms);
        let op = StoreOp::Cancel {
            key: key.clone(),
            now_ms: self.now_ms,
        };
        self.push_store(Purpose::Cancel(key), op);
    }

    /// Schedules a due scan now (C16 reconcile): observation only, never a
    /// replay, never a budget reset.
    pub fn reconcile(&mut self, now: Instant, now_ms: u64) {
        self.observe_clock(now, now_ms);
        if !self.shutting_down && !self.cfg.workers.is_empty() {
            self.scan_at = Some(now);
            self.mscan_at = Some(now);
            self.pump(now);
        }
    }

    /// Stops taking work: new submissions are refused, no new execution is
    /// started or adopted; executions already dispatched are driven to
    /// their end. The claims this controller holds on records it no longer
    /// drives are released (guarded by owner and generation; machine
    /// claims and worker leases once nothing is driven), so the next
    /// controller need not wait out the TTL ([`release`]).
    /// [`ControllerEvent::Stopped`] follows once nothing is outstanding.
    pub fn shutdown(&mut self, now: Instant, now_ms: u64) {
        self.observe_clock(now, now_ms);
        self.shutting_down = true;
        // Neither due scan runs any more: no timer of theirs may stay behind
        // (one left in the past, with nothing to do, would make a driver
        // spin until `Stopped`).
        self.scan_at = None;
        self.mscan_at = None;
        self.pump(now);
    }

    /// The answer to store op `id`.
    pub fn handle_stored(&mut self, now: Instant, now_ms: u64, id: OpId, result: StoreResult) {
        self.observe_clock(now, now_ms);
        let Some(purpose) = self.ops.remove(&id) else {
            return;
        };
        self.note_claims(&purpose, &result);
        self.note_lifecycle(id, &result);
        match purpose {
            Purpose::Lease(worker) => {
                let st = self.leases.map.entry(worker).or_default();
                st.inflight = false;
                let sent = st.sent.take();
                match result {
                    Ok(StoreReply::Lease(l)) if l.owner == self.cfg.owner => {
                        // Counted from the send, never longer than the TTL
                        // asked for (a renewal never shortens the stored
                        // lease, so `until_ms` may reach further).
                        let (at, ms) = sent.unwrap_or((now, self.now_ms));
                        let ttl = l.until_ms.saturating_sub(ms).min(self.cfg.lease_ttl_ms);
                        st.until = Some(at + Duration::from_millis(ttl));
                        st.lease = Some(l);
                        st.at = Some(now);
                    }
                    // Held by another controller, or the store failed: no
                    // lease; retry after one poll interval.
                    _ => {
                        st.lease = None;
                        st.at = None;
                        st.until = None;
                        st.retry_at = Some(now + self.cfg.poll());
                    }
                }
            }
            Purpose::Scan => self.on_scan(now, result),
            Purpose::Cancel(key) => self.on_cancel(key, result),
            Purpose::Accept(key, intent, asked) => {
                if let Some(n) = self.accepting.get_mut(&key) {
                    *n -= 1;
                    if *n == 0 {
                        self.accepting.remove(&key);
                    }
                }
                if intent {
                    self.intent_accepts = self.intent_accepts.saturating_sub(1);
                }
                self.on_accepted(now, asked, key, intent, result);
            }
            Purpose::Exec(key) => {
                let changed = self
                    .execs
                    .get_mut(&key)
                    .and_then(|ex| ex.on_stored(now, now_ms, &self.cfg, id, result));
                if let Some(rec) = changed {
                    self.push_telemetry(&rec);
                }
            }
            Purpose::Mach(key) => {
                let done = self
                    .machs
                    .get_mut(&key)
                    .and_then(|m| m.on_stored(now, id, &self.cfg, result));
                if let Some(f) = done {
                    self.notices.push_back(ControllerEvent::Finished(f));
                }
            }
            Purpose::Req(rid) => self.on_req_stored(now, rid, result),
            Purpose::Adopt(rec) => self.on_adopt(now, *rec, result),
            Purpose::MachineScan => self.on_machine_scan(now, result),
            Purpose::Release(what) => self.on_released(&what),
            Purpose::Resolve(r) => self.on_resolved(*r, result),
            // A worker op's purpose; never a store op's.
            Purpose::Preflight(_) => {}
        }
        self.pump(now);
    }

    /// The answer to worker op `id`.
    pub fn handle_worker(&mut self, now: Instant, now_ms: u64, id: OpId, result: WorkerResult) {
        self.observe_clock(now, now_ms);
        match self.ops.remove(&id) {
            Some(Purpose::Exec(key)) => {
                if let Some(ex) = self.execs.get_mut(&key) {
                    ex.on_worker(id, result);
                }
            }
            Some(Purpose::Mach(key)) => {
                if let Some(m) = self.machs.get_mut(&key) {
                    m.on_worker(id, result);
                }
            }
            Some(Purpose::Req(rid)) => {
                if let Some(mut req) = self.reqs.remove(&rid) {
                    let step = req.on_worker(&self.cfg, self.now_ms, result);
                    self.req_step(req, step);
                }
            }
            Some(Purpose::Preflight(p)) => self.on_preflight(*p, result),
            _ => return,
        }
        self.pump(now);
    }

    /// Time passed: due scans, claim renewals, deadlines, retries.
    pub fn handle_timeout(&mut self, now: Instant, now_ms: u64) {
        self.observe_clock(now, now_ms);
        self.skip.retain(|_, until| *until > now);
        self.pump(now);
    }

    /// When [`Controller::handle_timeout`] should next be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let scan = if self.scanning { None } else { self.scan_at };
        let leases = self.wanted_workers().into_iter().filter_map(|w| {
            let st = self.leases.map.get(&w)?;
            if st.inflight {
                return None;
            }
            st.retry_at.or(st.at.map(|at| at + self.cfg.renew_every()))
        });
        let mscan = if self.mscanning { None } else { self.mscan_at };
        self.execs
            .values()
            .filter_map(|e| e.wake_at(&self.cfg, &self.leases, self.now_ms))
            .chain(self.machs.values().filter_map(|m| m.wake_at(&self.cfg)))
            .chain(scan)
            .chain(mscan)
            .chain(leases)
            .min()
    }

    /// Workers whose lease a driven disposable execution needs.
    fn wanted_workers(&self) -> BTreeSet<String> {
        self.execs
            .values()
            .filter(|e| e.is_disposable())
            .filter_map(|e| e.worker_of(&self.cfg))
            .chain(self.machs.values().filter_map(|m| m.wants_lease(&self.cfg)))
            .collect()
    }

    /// Takes or renews each wanted worker lease that is missing or a third
    /// of its TTL old.
    fn renew_leases(&mut self, now: Instant) {
        self.leases.now = Some(now);
        for w in self.wanted_workers() {
            let st = self.leases.map.entry(w.clone()).or_default();
            let fresh = st
                .at
                .is_some_and(|at| now.saturating_duration_since(at) < self.cfg.renew_every())
                && st.until.is_some_and(|until| now < until)
                && st.lease.as_ref().is_some_and(|l| l.until_ms > self.now_ms);
            let waiting = st.retry_at.is_some_and(|t| now < t);
            if fresh || st.inflight || waiting {
                continue;
            }
            st.inflight = true;
            st.retry_at = None;
            st.sent = Some((now, self.now_ms));
            let op = StoreOp::ClaimWorker {
                worker_id: w.clone(),
                owner: self.cfg.owner.clone(),
                now_ms: self.now_ms,
                ttl_ms: self.cfg.lease_ttl_ms,
            };
            self.push_store(Purpose::Lease(w), op);
        }
    }

    /// The next store op to perform.
    pub fn poll_store_op(&mut self) -> Option<(OpId, StoreOp)> {
        let (id, op) = self.store_out.pop_front()?;
        self.note_sent(id, &op);
        Some((id, op))
    }

    /// The next worker op to perform.
    pub fn poll_worker_op(&mut self) -> Option<(OpId, WorkerOp)> {
        self.worker_out.pop_front()
    }

    /// The next event: notices first (never dropped), then telemetry.
    pub fn poll_event(&mut self) -> Option<ControllerEvent> {
        if let Some(e) = self.notices.pop_front() {
            return Some(e);
        }
        let mut t = self.telemetry.pop_front()?;
        // Stamped at delivery: a consumer that sees `dropped` grow (or the
        // epoch change) lost entries before this one.
        t.epoch = self.telemetry_epoch;
        t.dropped = self.telemetry_dropped;
        self.dropped_since_delivery = false;
        Some(ControllerEvent::Telemetry(t))
    }

    fn observe_clock(&mut self, now: Instant, now_ms: u64) {
        self.now_ms = self.now_ms.max(now_ms);
        self.now = self.now.max(now);
    }

    fn op_id(&mut self) -> OpId {
        let id = OpId(self.next_op);
        self.next_op += 1;
        id
    }

    fn push_store(&mut self, purpose: Purpose, op: StoreOp) -> OpId {
        let id = self.op_id();
        self.ops.insert(id, purpose);
        self.store_out.push_back((id, op));
        id
    }

    /// Acceptance rules that need the catalog (C12.4).
    fn check_catalog(&self, spec: &ExecutionSpec) -> Result<(), Error> {
        let unsupported = |reason| Err(Error::unsupported_capability(Operation::Submit, reason));
        if spec.machine.is_some() {
            return unsupported(Reason::RetainedMachines);
        }
        match &spec.worker_machine {
            Some(w) if !self.cfg.workers.iter().any(|x| x.id == w.worker_id) => {
                return unsupported(Reason::UnknownWorker);
            }
            None => {
                self.cfg
                    .accepting_worker(&spec.artifact, &spec.profile, spec.network.as_ref())?;
            }
            Some(_) => {}
        }
        if !spec.inputs.is_empty() || !spec.outputs.is_empty() {
            // Transfers go with the worker's admitted profile, bytes from
            // and to the runtime's artifact store (C6.4).
            let worker = match &spec.worker_machine {
                Some(w) => self.cfg.workers.iter().find(|x| x.id == w.worker_id),
                None => self
                    .cfg
                    .accepting_worker(&spec.artifact, &spec.profile, spec.network.as_ref())
                    .ok(),
            };
            if !self.cfg.artifacts || worker.is_none_or(|w| w.profile.is_none()) {
                return unsupported(Reason::FileTransfer);
            }
            exec::check_files(spec)?;
        }
        match &spec.action {
            Action::Terminal(_) => unsupported(Reason::Terminal),
            // A launch runs only on a retained machine (C5.4, AC-5.4.2),
            // submitted through `machines` (the command slot).
            Action::Command(c) if c.background => unsupported(Reason::Background),
            Action::Command(c) => {
                if let Some(t) = c.timeout_s
                    && t.saturating_mul(1_000) > spec.profile.budgets.execution_ms
                {
                    return Err(
                        Error::validation(Operation::Submit, Reason::TimeoutOverBudget)
                            .with_limit(t.saturating_mul(1_000), spec.profile.budgets.execution_ms),
                    );
                }
                Ok(())
            }
        }
    }

    /// Moves every execution forward and starts a due scan when it is time.
    fn pump(&mut self, now: Instant) {
        self.renew_leases(now);
        let keys: Vec<RecordKey> = self.execs.keys().cloned().collect();
        let mut freed = false;
        for key in keys {
            let Some(ex) = self.execs.get_mut(&key) else {
                continue;
            };
            ex.set_stream(self.streamed.contains(&key));
            loop {
                match ex.step(&self.cfg, &self.leases, now, self.now_ms) {
                    Step::Wait => break,
                    Step::Store(op) => {
                        let id = OpId(self.next_op);
                        self.next_op += 1;
                        self.ops.insert(id, Purpose::Exec(key.clone()));
                        ex.store_sent(id, now);
                        self.store_out.push_back((id, op));
                        break;
                    }
                    Step::Worker(op) => {
                        let id = OpId(self.next_op);
                        self.next_op += 1;
                        self.ops.insert(id, Purpose::Exec(key.clone()));
                        ex.worker_sent(id);
                        self.worker_out.push_back((id, op));
                    }
                    Step::Finish(f) => {
                        if f.held_elsewhere {
                            self.skip.insert(
                                key.clone(),
                                now + Duration::from_millis(self.cfg.lease_ttl_ms),
                            );
                        }
                        let machine = ex.retained_machine().cloned();
                        self.execs.remove(&key);
                        self.streamed.remove(&key);
                        // Only a command whose slot was not finished yet
                        // (cleanup pending) goes to the slot finish.
                        let pending = f
                            .record
                            .as_ref()
                            .is_some_and(|r| r.cleanup == super::state::Cleanup::Pending);
                        match machine {
                            Some(m) if !f.held_elsewhere && pending => self.finish_slot(&m, f),
                            _ => {
                                self.slot_machines.remove(&key);
                                self.notices.push_back(ControllerEvent::Finished(f));
                            }
                        }
                        freed = true;
                        break;
                    }
                }
            }
        }
        if freed
            && self.backlog
            && !self.shutting_down
            && !self.cfg.workers.is_empty()
            && self.scan_at.is_some()
        {
            // Room again: pick up records left due in the store.
            self.scan_at = Some(now);
        }
        if let Some(at) = self.scan_at
            && at <= now
            && !self.scanning
            && !self.shutting_down
            && self.busy() < self.cfg.max_active
        {
            self.scanning = true;
            let op = StoreOp::Due {
                now_ms: self.now_ms,
                after: self.scan_cursor.clone(),
                limit: DUE_PAGE,
            };
            self.push_store(Purpose::Scan, op);
        } else if let Some(at) = self.scan_at
            && at <= now
            && self.busy() >= self.cfg.max_active
        {
            // Skipped for lack of room: records may be left due.
            self.backlog = true;
            self.scan_at = Some(now + self.cfg.poll());
        }
        self.pump_machines(now);
        self.release_idle();
        self.release_unused_leases();
        if self.shutting_down
            && self.ops.is_empty()
            && self.execs.is_empty()
            && self.machs.is_empty()
            && !self.stopped_sent
        {
            self.stopped_sent = true;
            self.notices.push_back(ControllerEvent::Stopped);
        }
    }
}

#[cfg(test)]
mod tests;
