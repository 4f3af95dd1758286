//! One managed terminal, controller side (features C7.4, C14.3), sans-IO.
//!
//! A [`TerminalRun`] takes a terminal from `open(machine, spec)` to a
//! settled record and a finished slot. Like the [`Controller`](super::Controller)
//! it performs no I/O: it asks its driver (the shells' managed terminal
//! module) for store operations ([`TermStoreOp`], performed with
//! `smolbox_store::apply_terminal_op`) and for the upgrade itself
//! ([`TermOutput::Open`]), and is told their results. Time is an argument.
//!
//! # The path
//! 1. the machine record is read: it must be running with recorded creation
//!    evidence (an owned machine); the execution spec takes its artifact and
//!    exact profile and the terminal settings;
//! 2. the image preflight (C7.4): [`TermOutput::Inspect`] — the driver
//!    inspects the worker machine with the same checks the upgrade makes
//!    (version, then a plain image machine) and answers
//!    [`TerminalRun::handle_inspected`]; a refusal ends the run with
//!    [`TermEvent::Refused`] before acceptance: no record, no slot, nothing
//!    sent (a record `failed` after the intent would keep the slot and
//!    mark the machine `unknown`, C14.3). Not for a deleted machine's
//!    duplicate nor an identity check;
//! 3. `submit`: acceptance and the machine's command slot in one
//!    transaction, the claim written with it ([`TermOutput::Event`]
//!    `Accepted` — durable acceptance, not readiness). A duplicate with the
//!    same spec returns the same identity, a changed spec is
//!    `identity_conflict`, a held slot `admission_exhausted`;
//! 4. `preparing` → `ready` → claim → `dispatching` (the dispatch intent,
//!    written right after the claim is refreshed (C15), durable
//!    before the upgrade; its write fixes the execution deadline, from which
//!    the session deadline is derived: `dispatch + session_ms`, never reset);
//! 5. [`TermOutput::Open`] with the remaining session budget; the driver
//!    answers [`TerminalRun::handle_opened`] (the 101 was read → `running`)
//!    and later [`TerminalRun::handle_closed`] with the session's outcome;
//!    the claim is renewed every third of the TTL meanwhile;
//! 6. the verdict ([`Verdict`]): `completed` with a terminal result, `unknown`,
//!    or `failed` when nothing was sent;
//! 7. the slot: machine claim, `finish_command` — released for
//!    a completed (or cancelled) record, kept with the machine `unknown`
//!    otherwise (C14.3);
//! 8. the claims (C15): once settled and its slot finished, the run ends
//!    the record claim and the machine claim it holds
//!    ([`TermStoreOp::ReleaseClaim`], guarded by owner and generation, as
//!    the controller's release at shutdown), so the next controller — the
//!    next `smolbox` command on the machine, an operator's drain — takes
//!    them over at once instead of waiting out the TTL. A refused release
//!    is not retried (the claim lapses with its TTL); a run that gives up
//!    early releases nothing. A worker lease the run took to re-fence its
//!    machine is not released: the process's controller uses the same
//!    lease for every record on that worker, and releases it at shutdown.
//!
//! Cancel (C16) before the intent: `cancelled`, nothing opened (the store
//! also refuses the intent of a record with a cancel request). After it:
//! `cancelling` and [`TermOutput::Close`] — observation ends, a confirmed
//! exit that arrives first still wins, otherwise the record is `unknown`.
//!
//! # Recovery
//! [`TerminalRun::resume`] takes a stored record this runtime does not
//! drive: possibly dispatched (`dispatching`, `running`, `cancelling`)
//! without a recorded exit → `unknown`, the slot kept and the machine
//! `unknown`; never reopened, no input replayed. A recorded exit
//! (`collecting` with a terminal result) → `completed`; a completed record
//! whose slot was not finished → the slot is finished. Provably undispatched
//! (`accepted`, `preparing`, `ready`) may still dispatch, once.

use crate::Reason;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::OpId;
use super::exec::{descends_from, intent_outcome};
use super::ops::Claimed;
use crate::managed::claim::Guard;
use crate::managed::patch::ExecPatch;
use crate::managed::record::{Claim, ErrorEntry, ExecResult, ExecutionRecord, MachineRecord};
use crate::managed::slot::Finish;
use crate::managed::spec::{
    Action, DEFAULT_QUEUE_BUDGET_MS, DEFAULT_RETENTION_MS, ExecutionSpec, ManagedTerminalSpec,
};
use crate::managed::state::{ExecState, MachineRecordState, RecordEvidence};
use crate::managed::terminal::{Verdict, closing_patches};
use crate::managed::{FingerprintKey, Lease, RecordKey, fingerprint};
use crate::terminal::{MIN_SESSION_BUDGET, TerminalExit, TerminalSpec};
use crate::{Category, Error, Evidence, Operation};

/// Consecutive store failures before a run gives up (the record stays as
/// stored; recovery settles it).
pub const MAX_TERM_STORE_RETRIES: u32 = 5;

/// The options a run needs from its controller (C12.1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TermConfig {
    /// Controller id (claims and leases are taken under it).
    pub owner: String,
    /// Claim and lease TTL in milliseconds.
    pub lease_ttl_ms: u64,
    /// Retry interval after a store failure, in milliseconds.
    pub poll_interval_ms: u64,
    /// `max_pending` of `submit`.
    pub max_pending: u32,
}

impl TermConfig {
    /// The options of `cfg` (owner, TTL, poll interval, `max_pending`).
    pub fn of(cfg: &super::ControllerConfig) -> Self {
        Self {
            owner: cfg.owner.clone(),
            lease_ttl_ms: cfg.lease_ttl_ms,
            poll_interval_ms: cfg.poll_interval_ms,
            max_pending: cfg.max_pending,
        }
    }
}

/// One store method call of a terminal run, as data. Each variant maps to
/// exactly one `smolbox_store::Store` method with the same arguments.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TermStoreOp {
    /// `fetch_machine(key)` → [`TermStoreReply::Machine`].
    FetchMachine {
        /// Machine record key.
        key: RecordKey,
    },
    /// `submit(record, max_pending)` → [`TermStoreReply::Submitted`].
    Submit {
        /// The fresh `accepted` terminal record.
        record: Box<ExecutionRecord>,
        /// Pending limit.
        max_pending: u32,
    },
    /// `fetch(key)` → [`TermStoreReply::Record`].
    Fetch {
        /// Record key.
        key: RecordKey,
    },
    /// `claim(key, owner, now_ms, ttl_ms)` → [`TermStoreReply::Record`].
    Claim {
        /// Record key.
        key: RecordKey,
        /// Claiming controller.
        owner: String,
        /// Wall-clock milliseconds.
        now_ms: u64,
        /// Claim TTL.
        ttl_ms: u64,
    },
    /// `write(key, guard, patch, now_ms)` → [`TermStoreReply::Record`].
    Write {
        /// Record key.
        key: RecordKey,
        /// Guard of the last stored version.
        guard: Guard,
        /// The patch.
        patch: ExecPatch,
        /// Wall-clock milliseconds.
        now_ms: u64,
    },
    /// `cancel(key, now_ms)` → [`TermStoreReply::Record`].
    Cancel {
        /// Record key.
        key: RecordKey,
        /// Wall-clock milliseconds.
        now_ms: u64,
    },
    /// `claim_worker(worker_id, owner, now_ms, ttl_ms)` → [`TermStoreReply::Lease`].
    ClaimWorker {
        /// Worker id.
        worker_id: String,
        /// Claiming controller.
        owner: String,
        /// Wall-clock milliseconds.
        now_ms: u64,
        /// Lease TTL.
        ttl_ms: u64,
    },
    /// `claim_machine(key, owner, now_ms, ttl_ms)` → [`TermStoreReply::Machine`].
    ClaimMachine {
        /// Machine record key.
        key: RecordKey,
        /// Claiming controller.
        owner: String,
        /// Wall-clock milliseconds.
        now_ms: u64,
        /// Claim TTL.
        ttl_ms: u64,
    },
    /// `claim_machine_version(key, owner, version, now_ms, ttl_ms)` →
    /// [`TermStoreReply::Machine`]: the machine claim only at `version`,
    /// re-fencing a machine assigned under an older worker-lease generation
    /// to the claimer's live lease (C15), as the machine task does.
    ClaimMachineVersion {
        /// Machine record key.
        key: RecordKey,
        /// Claiming controller.
        owner: String,
        /// The version the run read the machine at.
        version: u64,
        /// Wall-clock milliseconds.
        now_ms: u64,
        /// Claim TTL.
        ttl_ms: u64,
    },
    /// `finish_command(machine, guard, exec, now_ms)` → [`TermStoreReply::Finished`].
    FinishCommand {
        /// Machine record key.
        machine: RecordKey,
        /// Guard of the machine claim.
        guard: Guard,
        /// The terminal's record key.
        exec: RecordKey,
        /// Wall-clock milliseconds.
        now_ms: u64,
    },
    /// `release_claim(claimed, owner, generation, now_ms)` →
    /// [`TermStoreReply::Record`] or [`TermStoreReply::Machine`] (a worker
    /// lease, which a run never names, → [`TermStoreReply::Lease`]): ends
    /// the run's claim at `generation` now (C15); never changes a state,
    /// evidence or slot.
    ReleaseClaim {
        /// The record whose claim ends.
        claimed: Claimed,
        /// The releasing controller (the claim's owner).
        owner: String,
        /// The claim generation the run holds.
        generation: u64,
        /// Wall-clock milliseconds.
        now_ms: u64,
    },
}

impl TermStoreOp {
    /// The store operation's name, for tracing (never its payload).
    pub const fn name(&self) -> &'static str {
        match self {
            Self::FetchMachine { .. } => "fetch_machine",
            Self::Submit { .. } => "submit",
            Self::Fetch { .. } => "fetch",
            Self::Claim { .. } => "claim",
            Self::Write { .. } => "write",
            Self::Cancel { .. } => "cancel",
            Self::ClaimWorker { .. } => "claim_worker",
            Self::ClaimMachine { .. } => "claim_machine",
            Self::ClaimMachineVersion { .. } => "claim_machine_version",
            Self::FinishCommand { .. } => "finish_command",
            Self::ReleaseClaim { .. } => "release_claim",
        }
    }
}

/// The answer to a [`TermStoreOp`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TermStoreReply {
    /// A machine record.
    Machine(Box<MachineRecord>),
    /// The answer to `submit`.
    Submitted {
        /// The terminal's record as stored.
        record: Box<ExecutionRecord>,
        /// Its machine as stored after the transaction.
        machine: Option<Box<MachineRecord>>,
        /// True when the record already existed (same identity).
        existing: bool,
    },
    /// An execution record.
    Record(Box<ExecutionRecord>),
    /// A worker lease.
    Lease(Lease),
    /// The answer to `finish_command`.
    Finished {
        /// The machine after the transaction.
        machine: Box<MachineRecord>,
        /// The terminal's record after the transaction.
        record: Box<ExecutionRecord>,
        /// Released or kept.
        finish: Finish,
    },
}

/// What a terminal store op returned.
pub type TermStoreResult = Result<TermStoreReply, Error>;

/// What a run tells its driver.
#[derive(Debug)]
pub enum TermOutput {
    /// Perform this store op and answer with [`TerminalRun::handle_stored`].
    Store(OpId, Box<TermStoreOp>),
    /// Before acceptance: perform everything the upgrade of `spec` on
    /// `machine` checks before connecting — the health preflight, the
    /// core's terminal call gates and its image-machine inspect
    /// (`TerminalCall::image_check`) — without opening anything, and answer
    /// with [`TerminalRun::handle_inspected`].
    Inspect {
        /// Worker id of the machine.
        worker_id: String,
        /// Machine name on that worker.
        machine: String,
        /// The low-level spec the terminal would open with.
        spec: Box<TerminalSpec>,
    },
    /// Open the terminal: the dispatch intent is durable. Answer with
    /// [`TerminalRun::handle_opened`], then [`TerminalRun::handle_closed`].
    Open {
        /// Worker id of the machine.
        worker_id: String,
        /// Machine name on that worker.
        machine: String,
        /// The low-level spec, its session budget the remaining session.
        spec: Box<TerminalSpec>,
    },
    /// Close the live connection (cancel after dispatch): observation ends.
    Close,
    /// A notice for the caller.
    Event(TermEvent),
}

/// Notices of a terminal run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TermEvent {
    /// The terminal is durably accepted and holds the slot (or already
    /// existed with the same identity).
    Accepted {
        /// The record as stored.
        record: Box<ExecutionRecord>,
        /// True when it already existed.
        existing: bool,
    },
    /// Nothing was accepted (`identity_conflict`, `admission_exhausted`,
    /// `validation`, `not_found`, `store`, …); nothing was sent.
    Refused(Error),
    /// The run is over: the record as last stored, and the error that ended
    /// the run here (if any).
    Done {
        /// The record as last stored.
        record: Option<Box<ExecutionRecord>>,
        /// The machine as last stored.
        machine: Option<Box<MachineRecord>>,
        /// Why the run stopped early (store failures, another claim).
        error: Option<Error>,
    },
}

/// What the outstanding store op is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    FetchMachine,
    Submit,
    Fetch,
    Claim,
    Write,
    Cancel,
    ClaimMachine,
    ClaimWorker,
    Refence,
    Finish,
    Release,
}

/// A managed terminal run (see the module docs).
#[derive(Debug)]
pub struct TerminalRun {
    cfg: TermConfig,
    fp_key: FingerprintKey,
    key: RecordKey,
    machine_key: RecordKey,
    tspec: Option<ManagedTerminalSpec>,
    /// Continue past acceptance (false: an identity check only).
    drive: bool,
    rec: Option<ExecutionRecord>,
    machine: Option<MachineRecord>,
    inflight: Option<(OpId, Kind)>,
    next_op: u64,
    out: VecDeque<TermOutput>,
    /// When the claim this run last got confirmed was asked for
    /// (monotonic): fresh from the request, not the answer (C15).
    claim_at: Option<Instant>,
    /// The latest monotonic time given (every input with a time sets it).
    now: Option<Instant>,
    /// When the outstanding store op was handed out (the latest time
    /// given then).
    asked_at: Option<Instant>,
    /// This run wrote the dispatch intent (only then may it open).
    intent_mine: bool,
    /// The outstanding write is the dispatch intent: only its reply can
    /// show this run's own intent (not any write's reply that says
    /// `dispatching`; the session-9 audit, fuzz finding 4's class).
    intent_out: bool,
    /// A reply showed the record past `ready` before this run's own intent
    /// (another run's intent, or a lie): never opened from here, and a
    /// later read showing it before dispatch is `record_went_back`.
    shown_dispatched: bool,
    /// A [`TermOutput::Inspect`] is out; its answer decides the submit.
    inspecting: bool,
    /// The last store answer was this run's own claim: the dispatch intent
    /// is written only then (C15: refreshed immediately before it).
    claim_fresh_now: bool,
    open_sent: bool,
    opened: bool,
    close_sent: bool,
    cancel_wanted: bool,
    cancel_sent: bool,
    verdict: Option<Verdict>,
    /// The machine record held is this run's own claim's answer.
    machine_claimed: bool,
    slot_done: bool,
    done: bool,
    failures: u32,
    /// `stale_claim` answers to the machine claim in a row (another
    /// controller's claim, perhaps a finished or killed one's).
    claim_waits: u64,
    /// The slot finish was fenced: the machine was assigned under a
    /// worker-lease generation that is no longer its worker's (C15). The
    /// worker lease is taken, then the machine re-fenced at the version
    /// read (`claim_machine_version`), as the machine task does.
    fenced: bool,
    /// The worker lease this run took to re-fence its machine.
    lease: Option<Lease>,
    retry_at: Option<Instant>,
    need_fetch: bool,
    /// The claims still to release once settled (`None`: not listed yet).
    releases: Option<VecDeque<(Claimed, u64)>>,
}

impl TerminalRun {
    /// A run that opens a terminal `key` on the retained machine `machine`
    /// with `spec` (C7.4). `drive` false checks identity and acceptance
    /// only (this runtime already drives `key`).
    ///
    /// # Errors
    /// `validation` for a bad key, owner or spec range; nothing is stored.
    pub fn open(
        cfg: TermConfig,
        fp_key: FingerprintKey,
        key: RecordKey,
        machine: RecordKey,
        spec: ManagedTerminalSpec,
        drive: bool,
    ) -> Result<Self, Error> {
        key.validate()
            .and_then(|()| machine.validate())
            .and_then(|()| spec.terminal_spec().map(|_| ()))
            .map_err(|e| e.with_operation(Operation::TerminalOpen))?;
        let mut run = Self::empty(cfg, fp_key, key, machine, drive);
        run.tspec = Some(spec);
        let op = TermStoreOp::FetchMachine {
            key: run.machine_key.clone(),
        };
        run.push(Kind::FetchMachine, op);
        Ok(run)
    }

    /// A run over a stored terminal record this runtime does not drive
    /// (recovery; see the module docs).
    ///
    /// # Errors
    /// `validation` when the record is not a managed terminal.
    pub fn resume(
        cfg: TermConfig,
        fp_key: FingerprintKey,
        rec: ExecutionRecord,
        now: Instant,
        now_ms: u64,
    ) -> Result<Self, Error> {
        let (Action::Terminal(_), Some(machine)) = (&rec.spec.action, rec.spec.machine.clone())
        else {
            return Err(Error::validation(
                Operation::TerminalOpen,
                Reason::NotATerminal,
            ));
        };
        let mut run = Self::empty(cfg, fp_key, rec.key.clone(), machine, true);
        run.rec = Some(rec);
        run.observe(now);
        run.pump(now, now_ms);
        Ok(run)
    }

    fn empty(
        cfg: TermConfig,
        fp_key: FingerprintKey,
        key: RecordKey,
        machine_key: RecordKey,
        drive: bool,
    ) -> Self {
        Self {
            cfg,
            fp_key,
            key,
            machine_key,
            tspec: None,
            drive,
            rec: None,
            machine: None,
            inflight: None,
            next_op: 1,
            out: VecDeque::new(),
            claim_at: None,
            now: None,
            asked_at: None,
            intent_mine: false,
            intent_out: false,
            shown_dispatched: false,
            inspecting: false,
            claim_fresh_now: false,
            open_sent: false,
            opened: false,
            close_sent: false,
            cancel_wanted: false,
            cancel_sent: false,
            verdict: None,
            machine_claimed: false,
            slot_done: false,
            done: false,
            failures: 0,
            claim_waits: 0,
            fenced: false,
            lease: None,
            retry_at: None,
            need_fetch: false,
            releases: None,
        }
    }

    /// The terminal's record key.
    pub fn key(&self) -> &RecordKey {
        &self.key
    }

    /// The record as last stored.
    pub fn record(&self) -> Option<&ExecutionRecord> {
        self.rec.as_ref()
    }

    /// True when this run drives its key (not only an identity check).
    pub fn drives(&self) -> bool {
        self.drive
    }

    /// A row of this run's record read elsewhere while the run is live:
    /// the controller's due scan (`ControllerEvent::TerminalDue`), handed
    /// over by [`LiveSet::due_row`](crate::managed::live::LiveSet::due_row).
    /// Fuzz finding 5's rule for terminals: before the open, a row past
    /// `ready` that is neither this run's own intent read before the
    /// write's answer (`dispatching` at the next version, the same
    /// generation and claim of this controller, while the intent write is
    /// out) nor, after that intent, a row descending from it (the same
    /// record and claim generation of this controller, that version or
    /// later) shows another history: the run never opens (the record is
    /// marked `unknown`), and a later read showing the record before
    /// dispatch ends the run with `record_went_back`. Takes effect at the
    /// run's next step: feed rows before the run's next input.
    pub fn handle_row(&mut self, row: &ExecutionRecord) {
        if row.key != self.key || !self.drive || self.open_sent || self.done {
            return;
        }
        if row.state.is_before_dispatch() {
            return;
        }
        let owner = self.cfg.owner.as_str();
        // The command's rules, the same record included (fingerprint and
        // spec: fuzz finding 19).
        let shows_other = match &self.rec {
            // Before acceptance: nothing of this run's is stored yet.
            None => true,
            Some(rec) if self.intent_mine => !descends_from(rec, row, owner),
            Some(rec) => !(self.intent_out && intent_outcome(rec, row, owner)),
        };
        if shows_other {
            self.shown_dispatched = true;
        }
    }

    /// Rows of this run's record were read elsewhere but not kept (more
    /// than [`LiveSet`](crate::managed::live::LiveSet) holds): any of them
    /// may have shown another history, so the run never opens.
    pub fn handle_rows_dropped(&mut self) {
        if self.drive && !self.open_sent && !self.done {
            self.shown_dispatched = true;
        }
    }

    /// True once the run is over ([`TermEvent::Done`] was emitted).
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// The next output; drain after every input.
    pub fn poll_output(&mut self) -> Option<TermOutput> {
        self.out.pop_front()
    }

    /// When [`TerminalRun::handle_timeout`] should next be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.done || self.inflight.is_some() {
            // A store op is outstanding: its answer moves the run (a
            // renewal due meanwhile is made then); a timer now would find
            // nothing to do and, in the past, spin its driver.
            return None;
        }
        if self.inflight.is_none()
            && let Some(at) = self.retry_at
        {
            return Some(at);
        }
        // Renewal while the connection may be open.
        if self.open_sent && self.verdict.is_none() {
            return self.claim_at.map(|at| at + self.renew_every());
        }
        None
    }

    /// Requests cancellation (C16): persisted first, then acted on.
    pub fn cancel(&mut self, now: Instant, now_ms: u64) {
        self.observe(now);
        self.cancel_wanted = true;
        self.pump(now, now_ms);
    }

    /// Time passed: claim renewal, retries.
    pub fn handle_timeout(&mut self, now: Instant, now_ms: u64) {
        self.observe(now);
        self.pump(now, now_ms);
    }

    /// The upgrade's answer: `Ok` once the 101 was read; an error of the
    /// open itself (its evidence says whether anything was sent).
    pub fn handle_opened(&mut self, now: Instant, now_ms: u64, result: Result<(), Error>) {
        self.observe(now);
        match result {
            Ok(()) => self.opened = true,
            Err(e) => self.verdict = Some(Verdict::of(&Err(e))),
        }
        self.pump(now, now_ms);
    }

    /// The live session ended with `outcome` (the session's own verdict
    /// input: exit, budget, limit, lost consumer, close before exit…).
    pub fn handle_closed(
        &mut self,
        now: Instant,
        now_ms: u64,
        outcome: &Result<TerminalExit, Error>,
    ) {
        self.observe(now);
        if self.verdict.is_none() {
            self.verdict = Some(Verdict::of(outcome));
        }
        self.pump(now, now_ms);
    }

    /// The answer to [`TermOutput::Inspect`]: `Ok` submits the terminal;
    /// an error refuses it ([`TermEvent::Refused`], evidence
    /// `not_dispatched`: the inspect mutates nothing and nothing else was
    /// sent).
    pub fn handle_inspected(&mut self, now: Instant, now_ms: u64, result: Result<(), Error>) {
        self.observe(now);
        if !self.inspecting {
            return;
        }
        self.inspecting = false;
        match (result, self.machine.take()) {
            (Ok(()), Some(m)) => self.submit(m, now_ms),
            (Ok(()), None) => {
                self.fail_or_refuse(Error::validation(Operation::TerminalOpen, Reason::NoSpec))
            }
            (Err(e), _) => self.fail_or_refuse(e.with_evidence(Evidence::NotDispatched)),
        }
        self.pump(now, now_ms);
    }

    /// The answer to store op `id`.
    pub fn handle_stored(&mut self, now: Instant, now_ms: u64, id: OpId, result: TermStoreResult) {
        self.observe(now);
        let Some((want, kind)) = self.inflight else {
            return;
        };
        if want != id {
            return;
        }
        self.inflight = None;
        let intent = std::mem::take(&mut self.intent_out);
        self.claim_fresh_now = kind == Kind::Claim && result.is_ok();
        match result {
            Ok(reply) => {
                self.failures = 0;
                self.retry_at = None;
                self.on_reply(now, now_ms, (kind, intent), reply);
            }
            Err(e) => self.on_error(now, kind, e),
        }
        self.pump(now, now_ms);
    }

    /// Notes the monotonic time an input gave (never moved back).
    fn observe(&mut self, now: Instant) {
        self.now = Some(self.now.map_or(now, |t| t.max(now)));
    }

    fn renew_every(&self) -> Duration {
        Duration::from_millis(self.cfg.lease_ttl_ms / 3)
    }

    fn push(&mut self, kind: Kind, op: TermStoreOp) {
        let id = OpId(self.next_op);
        self.next_op += 1;
        self.inflight = Some((id, kind));
        self.asked_at = self.now;
        self.out.push_back(TermOutput::Store(id, Box::new(op)));
    }

    fn finish(&mut self, error: Option<Error>) {
        // Never `not_dispatched` once the open may have been sent.
        let error = error.map(|e| super::with_known_evidence(e, self.rec.as_ref(), self.open_sent));
        if !self.done {
            self.done = true;
            self.out.push_back(TermOutput::Event(TermEvent::Done {
                record: self.rec.clone().map(Box::new),
                machine: self.machine.clone().map(Box::new),
                error,
            }));
        }
    }

    /// `intent`: the reply is the dispatch intent write's.
    fn on_reply(&mut self, now: Instant, now_ms: u64, op: (Kind, bool), reply: TermStoreReply) {
        let (kind, intent) = op;
        let mut own = false;
        if let TermStoreReply::Record(r)
        | TermStoreReply::Submitted { record: r, .. }
        | TermStoreReply::Finished { record: r, .. } = &reply
        {
            if r.key != self.key {
                // A reply about another record: a lie, never driven here.
                let e = Error::protocol(Operation::StoreWrite, Reason::UnexpectedReply);
                return self.fail_or_refuse(e);
            }
            if self.shown_dispatched && r.state.is_before_dispatch() {
                // No transition leads back before dispatch: the store
                // handed back an older row. Nothing opens from that read.
                return self.finish(Some(Error::store(
                    Operation::StoreFetch,
                    Evidence::DispatchUncertain,
                    Reason::RecordWentBack,
                )));
            }
            // Only the intent write's own outcome is this run's intent:
            // `dispatching` at the next version of the same record (key,
            // fingerprint, spec), the same generation and claim of this
            // controller (the command's rule, fuzz findings 11 and 19).
            own = kind == Kind::Write
                && intent
                && self
                    .rec
                    .as_ref()
                    .is_some_and(|p| intent_outcome(p, r, &self.cfg.owner));
            if !own && !self.intent_mine && !r.state.is_before_dispatch() {
                self.shown_dispatched = true;
            }
        }
        match (kind, reply) {
            (Kind::FetchMachine, TermStoreReply::Machine(m)) => self.on_machine(*m, now_ms),
            (
                Kind::Submit,
                TermStoreReply::Submitted {
                    record,
                    machine,
                    existing,
                },
            ) => {
                if !existing {
                    // The claim was written with the acceptance (fresh
                    // from when it was asked, C15).
                    self.claim_at = Some(self.asked_at.unwrap_or(now));
                }
                self.out.push_back(TermOutput::Event(TermEvent::Accepted {
                    record: record.clone(),
                    existing,
                }));
                self.rec = Some(*record);
                if let Some(m) = machine {
                    self.machine = Some(*m);
                }
                let settled = self
                    .rec
                    .as_ref()
                    .is_some_and(|r| !r.state.is_before_dispatch());
                if !self.drive || (existing && settled && !self.finishable()) {
                    // Never a second shell: a duplicate of a dispatched or
                    // finished terminal only reports its identity.
                    self.finish(None);
                }
            }
            (Kind::Claim, TermStoreReply::Record(r)) => {
                self.claim_at = Some(self.asked_at.unwrap_or(now));
                self.rec = Some(*r);
            }
            (Kind::Fetch | Kind::Write | Kind::Cancel, TermStoreReply::Record(r)) => {
                if own && !self.shown_dispatched {
                    self.intent_mine = true;
                }
                if kind == Kind::Cancel {
                    self.cancel_sent = true;
                }
                self.need_fetch = false;
                self.rec = Some(*r);
            }
            (Kind::ClaimMachine, TermStoreReply::Machine(m)) => {
                self.machine = Some(*m);
                self.machine_claimed = true;
                self.claim_waits = 0;
            }
            (Kind::ClaimWorker, TermStoreReply::Lease(l)) => {
                self.lease = (l.owner == self.cfg.owner).then_some(l);
            }
            (Kind::Refence, TermStoreReply::Machine(m)) => {
                // Claimed at the version read and moved to this run's
                // worker-lease generation: the finish is no longer fenced.
                self.machine = Some(*m);
                self.machine_claimed = true;
                self.fenced = false;
                self.claim_waits = 0;
            }
            (
                Kind::Finish,
                TermStoreReply::Finished {
                    machine, record, ..
                },
            ) => {
                self.machine = Some(*machine);
                self.rec = Some(*record);
                self.slot_done = true;
            }
            (Kind::Release, TermStoreReply::Record(r)) => self.rec = Some(*r),
            (Kind::Release, TermStoreReply::Machine(m)) => self.machine = Some(*m),
            _ => {
                let e = Error::protocol(Operation::StoreWrite, Reason::UnexpectedReply);
                self.fail_or_refuse(e);
            }
        }
    }

    /// The most `stale_claim` answers to the machine claim waited out: two
    /// lease TTLs' worth of poll intervals.
    fn claim_wait_limit(&self) -> u64 {
        (2 * self.cfg.lease_ttl_ms) / self.cfg.poll_interval_ms.max(1) + 1
    }

    fn fail_or_refuse(&mut self, e: Error) {
        if self.rec.is_none() {
            self.out.push_back(TermOutput::Event(TermEvent::Refused(e)));
            self.done = true;
        } else {
            self.finish(Some(e));
        }
    }

    fn on_error(&mut self, now: Instant, kind: Kind, e: Error) {
        match kind {
            // Before acceptance nothing is retried: the caller is told.
            Kind::FetchMachine | Kind::Submit => self.fail_or_refuse(e),
            // A refused release (another controller took the claim over,
            // the store failed) is not retried: the claim lapses with its
            // TTL, as after a crash; the next one is tried.
            Kind::Release => {}
            Kind::Finish if e.category() == Category::StaleVersion => {
                self.machine_claimed = false;
            }
            // The machine was assigned under a worker-lease generation that
            // is no longer its worker's (C15): nobody's finish passes until
            // the lease holder re-fences it. Take the lease, then re-fence
            // (see `settle_slot`), for up to two lease TTLs of attempts.
            Kind::Finish | Kind::Refence
                if e.category() == Category::StaleClaim
                    && matches!(e.reason(), Reason::WorkerGeneration | Reason::WorkerLease)
                    && self.claim_waits < self.claim_wait_limit()
                    && self
                        .machine
                        .as_ref()
                        .is_some_and(|m| m.assignment.is_some()) =>
            {
                self.claim_waits += 1;
                self.fenced = true;
                self.machine_claimed = false;
                if kind == Kind::Refence {
                    // The lease this run took is no longer live.
                    self.lease = None;
                    self.retry_at = Some(now + Duration::from_millis(self.cfg.poll_interval_ms));
                }
            }
            // Re-fencing at a version the machine has moved past: claim it
            // afresh (its record as stored) and try the finish again.
            Kind::Refence if e.category() == Category::StaleVersion => {
                self.fenced = false;
                self.machine_claimed = false;
            }
            // Another controller claims the machine — often one that has
            // ended (a `smolbox` that created or started it) and whose
            // claim lasts until its lease ends. The slot is this run's to
            // finish: the claim is tried again each poll interval, for up
            // to two lease TTLs (then the run gives up as for any store
            // failure, and the slot stays held for an operator).
            // The worker lease is live under another controller: it may be
            // the one driving this machine; the lease is tried again each
            // poll interval, within the same bound.
            Kind::ClaimMachine | Kind::ClaimWorker | Kind::Refence
                if e.category() == Category::StaleClaim
                    && self.claim_waits < self.claim_wait_limit() =>
            {
                self.claim_waits += 1;
                self.retry_at = Some(now + Duration::from_millis(self.cfg.poll_interval_ms));
            }
            _ if e.category() == Category::StaleVersion => self.need_fetch = true,
            _ if e.category() == Category::StaleClaim
                && matches!(kind, Kind::Claim | Kind::Write)
                && !self.open_sent =>
            {
                // Another live controller holds the record: leave it alone.
                self.finish(Some(e));
            }
            _ => {
                self.failures += 1;
                if self.failures > MAX_TERM_STORE_RETRIES {
                    self.finish(Some(e));
                } else {
                    if kind == Kind::Finish {
                        // Re-claim the machine for a fresh guard.
                        self.machine_claimed = false;
                    }
                    self.retry_at = Some(now + Duration::from_millis(self.cfg.poll_interval_ms));
                }
            }
        }
    }

    fn on_machine(&mut self, m: MachineRecord, now_ms: u64) {
        let refuse = |reason| Error::admission_exhausted(Operation::TerminalOpen, reason);
        let Some(spec) = self.tspec.clone() else {
            return self.fail_or_refuse(Error::validation(Operation::TerminalOpen, Reason::NoSpec));
        };
        if m.state == MachineRecordState::Deleted {
            // A duplicate of a terminal on a deleted machine still answers
            // with its identity: submit returns an existing record as is.
        } else if m.creation.is_none() || m.assignment.is_none() {
            return self.fail_or_refuse(refuse(Reason::MachineNotOwned));
        }
        if self.drive
            && m.state != MachineRecordState::Deleted
            && let Some(a) = m.assignment.as_ref()
        {
            // C7.4: only a plain image machine takes a terminal; asked of
            // the worker before anything is stored.
            let t = match spec.terminal_spec() {
                Ok(t) => t,
                Err(e) => return self.fail_or_refuse(e.with_operation(Operation::TerminalOpen)),
            };
            self.out.push_back(TermOutput::Inspect {
                worker_id: a.worker_id.clone(),
                machine: a.machine_name.clone(),
                spec: Box::new(t),
            });
            self.inspecting = true;
            self.machine = Some(m);
            return;
        }
        self.submit(m, now_ms);
    }

    /// Builds the terminal's record on machine `m` and submits it
    /// (acceptance and the slot in one transaction).
    fn submit(&mut self, m: MachineRecord, now_ms: u64) {
        let Some(spec) = self.tspec.clone() else {
            return self.fail_or_refuse(Error::validation(Operation::TerminalOpen, Reason::NoSpec));
        };
        let exec = ExecutionSpec {
            artifact: m.spec.artifact.clone(),
            profile: m.spec.profile.clone(),
            action: Action::Terminal(spec),
            machine: Some(m.key.clone()),
            worker_machine: None,
            inputs: Vec::new(),
            outputs: Vec::new(),
            queue_budget_ms: DEFAULT_QUEUE_BUDGET_MS,
            retention_ms: DEFAULT_RETENTION_MS,
            metadata: std::collections::BTreeMap::new(),
            network: m.spec.network.clone(),
            guest_paths: m.spec.guest_paths.clone(),
        };
        let fp = fingerprint::exec_fingerprint(&self.fp_key, &exec);
        self.machine = Some(m);
        let record = ExecutionRecord::accepted(self.key.clone(), fp, exec, now_ms);
        let mut record = match record {
            Ok(r) => r,
            Err(e) => return self.fail_or_refuse(e.with_operation(Operation::TerminalOpen)),
        };
        record.claim = Some(Claim {
            owner: self.cfg.owner.clone(),
            until_ms: now_ms.saturating_add(self.cfg.lease_ttl_ms),
        });
        record.generation = 1;
        self.push(
            Kind::Submit,
            TermStoreOp::Submit {
                record: Box::new(record),
                max_pending: self.cfg.max_pending,
            },
        );
    }

    /// A finished (or unknown) record whose slot may still be held.
    fn finishable(&self) -> bool {
        self.rec.as_ref().is_some_and(|r| {
            (r.state.is_terminal() || r.state == ExecState::Unknown)
                && self
                    .machine
                    .as_ref()
                    .is_some_and(|m| m.active_execution.as_ref() == Some(&r.key))
        })
    }

    fn guard(&self, rec: &ExecutionRecord) -> Guard {
        Guard::for_exec(rec, &self.cfg.owner)
    }

    fn claim_fresh(&self, rec: &ExecutionRecord, now: Instant, now_ms: u64) -> bool {
        let mine = rec
            .claim
            .as_ref()
            .is_some_and(|c| c.owner == self.cfg.owner && c.until_ms > now_ms);
        // While the session is live the run only waits between renewals
        // (`poll_timeout` names the next one): no op follows the answer.
        let just = self.claim_fresh_now && !(self.open_sent && self.verdict.is_none());
        mine && self
            .claim_at
            .is_some_and(|at| super::claim_fresh(at, just, now, self.cfg.lease_ttl_ms))
    }

    fn write(&mut self, rec: &ExecutionRecord, patch: ExecPatch, now_ms: u64) {
        let intent = patch.state == Some(ExecState::Dispatching);
        let op = TermStoreOp::Write {
            key: rec.key.clone(),
            guard: self.guard(rec),
            patch,
            now_ms: now_ms.max(rec.updated_at_ms),
        };
        self.push(Kind::Write, op);
        self.intent_out = intent;
    }

    /// Moves the run forward while no store op is outstanding.
    fn pump(&mut self, now: Instant, now_ms: u64) {
        if self.done {
            return;
        }
        if self.close_needed() {
            self.close_sent = true;
            self.out.push_back(TermOutput::Close);
        }
        if self.inflight.is_some() || self.retry_at.is_some_and(|at| now < at) {
            return;
        }
        self.retry_at = None;
        let Some(rec) = self.rec.clone() else {
            return;
        };
        if self.need_fetch {
            self.push(
                Kind::Fetch,
                TermStoreOp::Fetch {
                    key: rec.key.clone(),
                },
            );
            return;
        }
        if self.cancel_wanted && !self.cancel_sent {
            self.push(
                Kind::Cancel,
                TermStoreOp::Cancel {
                    key: rec.key.clone(),
                    now_ms,
                },
            );
            return;
        }
        let settled = rec.state.is_terminal() || rec.state == ExecState::Unknown;
        if settled {
            return self.settle_slot(&rec, now_ms);
        }
        if !self.claim_fresh(&rec, now, now_ms) {
            let op = TermStoreOp::Claim {
                key: rec.key.clone(),
                owner: self.cfg.owner.clone(),
                now_ms,
                ttl_ms: self.cfg.lease_ttl_ms,
            };
            self.push(Kind::Claim, op);
            return;
        }
        if let Some(patch) = self.next_patch(&rec, now_ms) {
            if patch.state == Some(ExecState::Dispatching) && !self.claim_fresh_now {
                // C15: the claim is refreshed immediately before the intent.
                let op = TermStoreOp::Claim {
                    key: rec.key.clone(),
                    owner: self.cfg.owner.clone(),
                    now_ms,
                    ttl_ms: self.cfg.lease_ttl_ms,
                };
                self.push(Kind::Claim, op);
                return;
            }
            self.write(&rec, patch, now_ms);
            return;
        }
        if rec.state == ExecState::Dispatching
            && self.intent_mine
            && !self.shown_dispatched
            && !self.open_sent
        {
            self.open_sent = true;
            match self.live_spec(&rec, now_ms) {
                Ok(spec) => {
                    let (worker_id, machine) = self
                        .machine
                        .as_ref()
                        .and_then(|m| m.assignment.as_ref())
                        .map(|a| (a.worker_id.clone(), a.machine_name.clone()))
                        .unwrap_or_default();
                    self.out.push_back(TermOutput::Open {
                        worker_id,
                        machine,
                        spec: Box::new(spec),
                    });
                }
                Err(e) => {
                    // Nothing was sent: the session ran out before opening.
                    self.verdict = Some(Verdict::NotSent(e));
                    self.pump(now, now_ms);
                }
            }
        }
    }

    fn close_needed(&self) -> bool {
        let cancelling = self
            .rec
            .as_ref()
            .is_some_and(|r| r.state == ExecState::Cancelling);
        cancelling && self.open_sent && self.verdict.is_none() && !self.close_sent
    }

    /// The next write for a record not yet settled, or `None` to wait.
    fn next_patch(&mut self, rec: &ExecutionRecord, now_ms: u64) -> Option<ExecPatch> {
        let to = |state, evidence| ExecPatch {
            state: Some(state),
            evidence,
            ..ExecPatch::default()
        };
        if let Some(v) = &self.verdict {
            return closing_patches(rec.state, v, now_ms).into_iter().next();
        }
        let cancelled = rec.cancel_requested_at_ms.is_some();
        match rec.state {
            s if s.is_before_dispatch() && cancelled => Some(ExecPatch {
                state: Some(ExecState::Cancelled),
                next_due_at_ms: Some(None),
                ..ExecPatch::default()
            }),
            ExecState::Accepted => Some(to(ExecState::Preparing, None)),
            ExecState::Preparing => Some(to(ExecState::Ready, None)),
            ExecState::Ready => Some(to(
                ExecState::Dispatching,
                Some(RecordEvidence::DispatchUncertain),
            )),
            ExecState::Collecting => {
                // A recorded exit stays known: finish it.
                matches!(rec.result, Some(ExecResult::Terminal { .. }))
                    .then(|| closing_patches(rec.state, &Verdict::Exited(0), now_ms))
                    .and_then(|p| p.into_iter().next())
            }
            ExecState::Dispatching | ExecState::Running | ExecState::Cancelling
                if !self.intent_mine || (self.shown_dispatched && !self.open_sent) =>
            {
                // Possibly dispatched by a run that is gone: never reopened,
                // no input replayed (C7.4). Also after this run's own intent
                // when a row read before the open showed another history.
                Some(ExecPatch {
                    state: Some(ExecState::Unknown),
                    next_due_at_ms: Some(None),
                    last_error: Some(ErrorEntry::from_error(
                        &Error::unknown(
                            Operation::TerminalSession,
                            Evidence::DispatchUncertain,
                            Reason::TerminalRecovered,
                        ),
                        now_ms,
                    )),
                    ..ExecPatch::default()
                })
            }
            ExecState::Dispatching | ExecState::Running if cancelled => {
                Some(to(ExecState::Cancelling, None))
            }
            ExecState::Dispatching if self.opened => Some(to(
                ExecState::Running,
                Some(RecordEvidence::RunningObserved),
            )),
            _ => None,
        }
    }

    /// The spec the live session runs with: the remaining session budget,
    /// counted from the durable dispatch intent (never reset).
    fn live_spec(&self, rec: &ExecutionRecord, now_ms: u64) -> Result<TerminalSpec, Error> {
        let Action::Terminal(t) = &rec.spec.action else {
            return Err(Error::validation(
                Operation::TerminalOpen,
                Reason::NotATerminal,
            ));
        };
        let mut spec = t.terminal_spec()?;
        let dispatch_ms = rec
            .deadlines
            .execution_ms
            .unwrap_or(now_ms)
            .saturating_sub(rec.spec.profile.budgets.execution_ms);
        let session_end = dispatch_ms.saturating_add(t.session_ms);
        let left = Duration::from_millis(session_end.saturating_sub(now_ms));
        if left < MIN_SESSION_BUDGET {
            return Err(Error::expired(
                Operation::TerminalSession,
                Evidence::NotDispatched,
                Reason::TerminalSession,
            ));
        }
        spec.session_budget = spec.session_budget.min(left);
        spec.idle_budget = spec.idle_budget.min(spec.session_budget);
        Ok(spec)
    }

    /// Machine claim → `finish_command`, then done; a fenced finish first
    /// takes the worker lease and re-fences the machine.
    fn settle_slot(&mut self, rec: &ExecutionRecord, now_ms: u64) {
        if self.slot_done {
            return self.release_then_finish(now_ms);
        }
        if self.fenced
            && let Some(m) = self.machine.clone()
            && let Some(a) = m.assignment.as_ref()
        {
            let live = self
                .lease
                .as_ref()
                .is_some_and(|l| l.owner == self.cfg.owner && l.until_ms > now_ms);
            if !live {
                // The machine is fenced already (its worker lease moved on).
                // Only the live lease holder may re-fence it; a lapsed lease
                // taken here moves its generation as any holder's would, and
                // machines assigned under the old one are re-fenced by
                // their own tasks the same way.
                let op = TermStoreOp::ClaimWorker {
                    worker_id: a.worker_id.clone(),
                    owner: self.cfg.owner.clone(),
                    now_ms,
                    ttl_ms: self.cfg.lease_ttl_ms,
                };
                return self.push(Kind::ClaimWorker, op);
            }
            // Decided from the machine as read (its version, which claims
            // do not move): the store claims it only at that version and
            // moves its assignment to this run's lease generation.
            let op = TermStoreOp::ClaimMachineVersion {
                key: m.key.clone(),
                owner: self.cfg.owner.clone(),
                version: m.version,
                now_ms: now_ms.max(m.updated_at_ms),
                ttl_ms: self.cfg.lease_ttl_ms,
            };
            return self.push(Kind::Refence, op);
        }
        let Some(m) = self.machine.clone().filter(|_| self.machine_claimed) else {
            let op = TermStoreOp::ClaimMachine {
                key: self.machine_key.clone(),
                owner: self.cfg.owner.clone(),
                now_ms,
                ttl_ms: self.cfg.lease_ttl_ms,
            };
            return self.push(Kind::ClaimMachine, op);
        };
        if m.active_execution.as_ref() != Some(&rec.key) {
            // Already finished (by this or an earlier run).
            return self.release_then_finish(now_ms);
        }
        // No worker lease is taken here: the finish is fenced by the
        // machine claim and the generation the machine was assigned under
        // (as the machine task's own finish). Taking the lease after it
        // lapsed would move its generation and fence the machine itself,
        // so no controller could finish the slot any more.
        let op = TermStoreOp::FinishCommand {
            machine: m.key.clone(),
            guard: Guard::for_machine(&m, &self.cfg.owner),
            exec: rec.key.clone(),
            now_ms: now_ms.max(m.updated_at_ms),
        };
        self.push(Kind::Finish, op);
    }

    /// Settled with the slot finished: releases the record claim and the
    /// machine claim the run holds (live, this owner's), one store op at a
    /// time, then done (module docs, step 7).
    fn release_then_finish(&mut self, now_ms: u64) {
        let owner = self.cfg.owner.as_str();
        let mine = |c: Option<&Claim>| c.is_some_and(|c| c.owner == owner && c.until_ms > now_ms);
        let rec = self.rec.as_ref();
        let machine = self.machine.as_ref().filter(|_| self.machine_claimed);
        let queue = self.releases.get_or_insert_with(|| {
            let exec = rec
                .filter(|r| mine(r.claim.as_ref()))
                .map(|r| (Claimed::Execution(r.key.clone()), r.generation));
            let mach = machine
                .filter(|m| mine(m.claim.as_ref()))
                .map(|m| (Claimed::Machine(m.key.clone()), m.generation));
            exec.into_iter().chain(mach).collect()
        });
        let Some((claimed, generation)) = queue.pop_front() else {
            return self.finish(None);
        };
        let op = TermStoreOp::ReleaseClaim {
            claimed,
            owner: self.cfg.owner.clone(),
            generation,
            now_ms,
        };
        self.push(Kind::Release, op);
    }
}

#[cfg(test)]
mod tests;
