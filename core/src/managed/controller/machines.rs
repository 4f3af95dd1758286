//! Retained machines inside the controller (C14, C17.3): caller requests
//! ([`MachineRequest`]) answered with [`MachineDone`], and one sub-machine
//! per machine record that drives its lifecycle from the stored record.
//!
//! The rules, each enforced here before an op is emitted:
//! - **intent durable first**: a create, start, stop or delete is sent only
//!   after this controller wrote the record's `(operation, dispatching)`
//!   intent with a claim refreshed immediately before it (C15); a record
//!   found `dispatching` that this process did not write is never resent
//!   (the operation becomes `uncertain`, the state `unknown`);
//! - **creation evidence before use**: start, stop and delete need the
//!   recorded incarnation; an uncertain create is never resent;
//! - **incarnation checked before stop/delete**: the machine is inspected
//!   first and must be the recorded incarnation;
//! - **absence observed before release**: a delete is followed by an
//!   inspect until the 404; `deleted` (which frees capacity and ports in
//!   the same transaction) is written only with the absence time;
//! - **observation writes are rejected** when the lifecycle intent, the
//!   state or the active command changed since the observation began
//!   (C14.2): the reply is dropped, nothing is written.
//!
//! Versioned requests (C14.2) are the store's `request_machine`: repeating
//! the latest identical `(action, version)` returns the current record, a
//! superseded version is `stale_version`, a busy machine (an operation in
//! progress, or a command in the slot for stop/delete) is
//! `admission_exhausted`. A request returns once it is durable; the
//! lifecycle work follows (wait with [`machine_settled`]).

use crate::Reason;
use std::collections::VecDeque;
use std::time::Instant;

use super::ops::{Reservation, StoreOp, StoreReply, StoreResult, WorkerOp, WorkerReply};
use super::{ControllerConfig, Finished, Leases, MAX_STORE_RETRIES, OpId, WorkerResult};
use crate::managed::claim::Guard;
use crate::managed::patch::MachinePatch;
use crate::managed::record::{
    CreationEvidence, ErrorEntry, ExecutionRecord, MachineRecord, RecordedObservation, Resources,
};
use crate::managed::slot::{Disposition, Finish};
use crate::managed::state::{MachineOperation, MachinePhase, MachineRecordState};
use crate::managed::{RecordKey, RetainedMachineSpec};
use crate::worker::{MachineName, MachineSpec, MachineState, Observation, Profile};
use crate::{Category, Error, Evidence, Operation};

use super::Purpose;
use super::exec::{Exec, incarnation_token};
use crate::managed::record::Claim;

mod api;
mod driving;
pub(in crate::managed::controller) mod preinspect;
mod requests;
mod uncreatable;
pub use api::{MachineAnswer, MachineDone, MachineRequest, RequestId, Resolution};
pub(super) use requests::Req;
#[allow(clippy::wildcard_imports)]
use requests::*;

/// Smallest page of a machine list (C14.2).
pub const MIN_LIST_LIMIT: u32 = 1;
/// Largest page of a machine list (C14.2).
pub const MAX_LIST_LIMIT: u32 = 100;
/// The page size when the caller names none (C14.2).
pub const DEFAULT_LIST_LIMIT: u32 = 20;
/// Longest machine wait in milliseconds (C14.2).
pub const MAX_MACHINE_WAIT_MS: u64 = 900_000;

/// What a retained machine reserves on its worker: one slot and the
/// worker's default machine (1 CPU, 256 + 256 MiB, 1 + 1 GiB, C12.3).
pub const RETAINED_RESERVATION: Resources = Resources {
    slots: 1,
    cpus: 1,
    memory_mb: 512,
    disk_gb: 2,
};

/// Checks a list page size (C14.2: 1–100; `None` is 20).
///
/// # Errors
/// `validation` (operation `list`) with the limit for 0 or more than 100.
pub fn check_list_limit(limit: Option<u32>) -> Result<u32, Error> {
    let n = limit.unwrap_or(DEFAULT_LIST_LIMIT);
    if (MIN_LIST_LIMIT..=MAX_LIST_LIMIT).contains(&n) {
        Ok(n)
    } else {
        Err(Error::validation(Operation::List, Reason::ListLimit)
            .with_limit(u64::from(n), u64::from(MAX_LIST_LIMIT)))
    }
}

/// Checks a machine wait (C14.2: 0–900,000 ms).
///
/// # Errors
/// `validation` (operation `await`) with the limit above 900,000.
pub fn check_wait_ms(ms: u64) -> Result<(), Error> {
    if ms <= MAX_MACHINE_WAIT_MS {
        Ok(())
    } else {
        Err(Error::validation(Operation::Await, Reason::WaitTimeout)
            .with_limit(ms, MAX_MACHINE_WAIT_MS))
    }
}

/// True when a machine wait returns (C14.2): the machine is idle (no
/// lifecycle operation, created / running / stopped), or `unknown`,
/// `missing`, `conflict` or `deleted`.
pub fn machine_settled(rec: &MachineRecord) -> bool {
    use MachineRecordState as S;
    match rec.state {
        S::Unknown | S::Missing | S::Conflict | S::Deleted => true,
        S::Created | S::Running | S::Stopped => rec.operation == MachineOperation::None,
        _ => false,
    }
}

/// True when a command may be submitted to the machine now: running, idle
/// and with an empty slot (AC-14.3.2: callers observe the empty slot).
pub fn slot_free(rec: &MachineRecord) -> bool {
    rec.state == MachineRecordState::Running
        && rec.operation == MachineOperation::None
        && rec.active_execution.is_none()
}

/// The worker machine spec of a retained machine: as the worker entry
/// creates the spec's artifact and profile revision
/// ([`WorkerEntry::create_spec`](super::WorkerEntry): the catalog's image
/// path and revision sizes, else the entry's machine source and the
/// default sizes), the spec's network policy, and the spec's port
/// mappings, which the store reserved with the assignment (offline with
/// ports: the create names `virtio-net` with empty allow-lists, C9.2).
///
/// # Errors
/// `validation` (not dispatched) for a port or network policy the worker
/// spec refuses.
pub(super) fn worker_spec(
    spec: &RetainedMachineSpec,
    worker: Option<&super::WorkerEntry>,
) -> Result<MachineSpec, Error> {
    let ports = spec
        .ports
        .iter()
        .map(|p| crate::worker::PortMapping::new(p.host, p.guest))
        .collect::<Result<Vec<_>, _>>()?;
    let base = match worker {
        Some(w) => w.create_spec(&spec.artifact, &spec.profile, spec.network.as_ref())?,
        None => MachineSpec::default(),
    };
    MachineSpec { ports, ..base }.validate()
}

/// The machine name of a retained machine: `smb-` and 24 hex digits of
/// SHA-256 over the record key (deterministic, ≤31 bytes).
pub(super) fn machine_name_for(key: &RecordKey) -> String {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    h.update(b"machine\0");
    h.update(key.scope.as_bytes());
    h.update([0]);
    h.update(key.id.as_bytes());
    let hex = crate::managed::fingerprint::hex(&h.finalize());
    format!("smb-{}", &hex[..24])
}

/// What the record looked like when an observation began (C14.2).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Snap {
    state: MachineRecordState,
    operation: MachineOperation,
    phase: MachinePhase,
    active: Option<RecordKey>,
    request: Option<crate::managed::record::LastRequest>,
}

impl Snap {
    fn of(rec: &MachineRecord) -> Self {
        Self {
            state: rec.state,
            operation: rec.operation,
            phase: rec.phase,
            active: rec.active_execution.clone(),
            request: rec.last_request,
        }
    }
}

/// A worker op of a machine task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WKind {
    Create,
    Start,
    Stop,
    /// Inspect before a stop/delete: the recorded incarnation?
    Verify,
    Delete,
    /// Inspect after a delete: the 404 is the absence.
    Absent,
}

/// What the outstanding store op of a machine task is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SKind {
    Claim,
    Fetch,
    Intent,
    Write,
    Finish,
    Reserve,
}

/// What a machine task wants next.
#[derive(Debug)]
pub(super) enum MStep {
    Wait,
    Store(StoreOp),
    Worker(WorkerOp),
    /// A command's slot was finished: its notice.
    Finished(Box<Finished>),
    /// Nothing more to do for this machine here.
    Done,
}

/// One machine driven by this controller.
#[derive(Debug)]
pub(super) struct Mach {
    rec: MachineRecord,
    inflight: Option<(OpId, SKind)>,
    next_kind: SKind,
    worker_op: Option<OpId>,
    wkind: Option<WKind>,
    pending_w: Option<WKind>,
    reply: Option<(WKind, WorkerResult, Snap)>,
    /// The worker answer the outstanding store op acts on: given back when
    /// that op was a claim, a fetch or failed, so the next step decides
    /// from the same answer (it is never lost with a failed write).
    kept: Option<(WKind, WorkerResult, Snap)>,
    began: Option<Snap>,
    /// When the claim this controller last got confirmed was asked for
    /// (monotonic): fresh from the request, not the answer (C15).
    claim_at: Option<Instant>,
    /// When the outstanding store op was handed out (monotonic).
    asked_at: Option<Instant>,
    fresh_claim: bool,
    /// This process wrote the current `dispatching` intent.
    intent_mine: bool,
    /// The mutation of the current intent was emitted (never twice).
    sent: bool,
    verified: bool,
    deleted: bool,
    retry_at: Option<Instant>,
    failures: u32,
    need_fetch: bool,
    refetches: u32,
    fatal: Option<Error>,
    /// Commands whose slot is to be finished (their notices wait for it).
    finishing: VecDeque<Box<Finished>>,
    /// The worker had no room for the reservation: recorded, retried later.
    no_room: Option<Error>,
    /// A host port of the spec is taken on the worker: the machine is
    /// `conflict` (C14, ports), nothing reserved or sent, no other worker.
    port_conflict: Option<Error>,
    /// The generation of this controller's live lease on the assigned
    /// worker, as of the last step.
    lease_gen: Option<u64>,
    /// Since when a write was refused because the machine is assigned
    /// under another worker-lease generation (C15): the worker lease is
    /// wanted, and the claim re-fences once it is held.
    fenced_at: Option<Instant>,
}

impl Mach {
    pub(super) fn new(rec: MachineRecord) -> Self {
        Self {
            rec,
            inflight: None,
            next_kind: SKind::Write,
            worker_op: None,
            wkind: None,
            pending_w: None,
            reply: None,
            kept: None,
            began: None,
            claim_at: None,
            asked_at: None,
            fresh_claim: false,
            intent_mine: false,
            sent: false,
            verified: false,
            deleted: false,
            retry_at: None,
            failures: 0,
            need_fetch: false,
            refetches: 0,
            fatal: None,
            finishing: VecDeque::new(),
            no_room: None,
            port_conflict: None,
            lease_gen: None,
            fenced_at: None,
        }
    }

    /// This controller's claim on the record was confirmed at `at` (taken
    /// with a command's submission).
    pub(super) fn claimed_at(&mut self, at: Instant) {
        self.claim_at = Some(at);
    }

    /// Queues the slot finish of a command this controller stopped driving.
    pub(super) fn finish_command(&mut self, f: Box<Finished>) {
        if !self.finishing.iter().any(|x| x.key == f.key) {
            self.finishing.push_back(f);
        }
    }

    /// Commands waiting for their slot finish here.
    pub(super) fn finishing_keys(&self) -> impl Iterator<Item = &RecordKey> {
        self.finishing.iter().map(|f| &f.key)
    }

    /// Nothing of this task is in flight and no slot finish is owed: it
    /// can be dropped at shutdown (the store keeps what is due).
    pub(super) fn quiet(&self) -> bool {
        self.inflight.is_none()
            && self.worker_op.is_none()
            && self.reply.is_none()
            && self.finishing.is_empty()
    }

    /// Re-reads the record before the next step (it was seen elsewhere).
    pub(super) fn refresh(&mut self) {
        self.need_fetch = true;
    }

    /// The worker whose lease the next step needs: an unassigned machine
    /// about to be reserved, read fresh under this controller's claim (a
    /// stale view must never take the worker lease: taking it after it
    /// lapsed moves its generation, which fences every machine assigned
    /// under the old one).
    pub(super) fn wants_lease(&self, cfg: &ControllerConfig) -> Option<String> {
        let claimed = self.claim_at.is_some()
            && self
                .rec
                .claim
                .as_ref()
                .is_some_and(|c| c.owner == cfg.owner);
        let creating = claimed
            && self.rec.assignment.is_none()
            && self.rec.state == MachineRecordState::Accepted
            && self.rec.operation == MachineOperation::None
            && self.rec.next_due_at_ms.is_some();
        if let (Some(_), Some(a)) = (self.fenced_at, &self.rec.assignment) {
            // Fenced by a worker-lease generation it was not assigned
            // under: only the lease holder can re-fence it.
            return cfg
                .workers
                .iter()
                .find(|w| w.id == a.worker_id && w.profile.is_some())
                .map(|w| w.id.clone());
        }
        if !creating {
            return None;
        }
        let s = &self.rec.spec;
        cfg.creating_worker(&s.artifact, &s.profile, s.network.as_ref())
            .ok()
            .map(|w| w.id.clone())
    }

    /// Store op `id` (the last `step`'s) was handed out at `now`.
    pub(super) fn store_sent(&mut self, id: OpId, now: Instant) {
        self.inflight = Some((id, self.next_kind));
        self.asked_at = Some(now);
    }

    pub(super) fn worker_sent(&mut self, id: OpId) {
        self.worker_op = Some(id);
        self.wkind = self.pending_w.take();
        self.began = Some(Snap::of(&self.rec));
        if matches!(
            self.wkind,
            Some(WKind::Create | WKind::Start | WKind::Stop | WKind::Delete)
        ) {
            self.sent = true;
        }
    }

    pub(super) fn wake_at(&self, cfg: &ControllerConfig) -> Option<Instant> {
        if self.inflight.is_some() || self.fatal.is_some() {
            return None;
        }
        if let Some(t) = self.retry_at {
            return Some(t);
        }
        if self.worker_op.is_some() {
            return self.claim_at.map(|c| c + cfg.renew_every());
        }
        self.fenced_at.map(|at| at + fence_wait(cfg))
    }

    /// Assigned under another worker-lease generation than the live one
    /// this controller holds: every write is fenced (C15) until the claim
    /// re-fences it (`claim_machine_version`).
    fn needs_refence(&self) -> bool {
        self.rec
            .assignment
            .as_ref()
            .is_some_and(|a| self.lease_gen.is_some_and(|g| g != a.worker_generation))
    }

    /// True while this controller's claim needs no renewal before the next
    /// op (see [`super::claim_fresh`]).
    fn claim_ok(&self, cfg: &ControllerConfig, now: Instant, now_ms: u64) -> bool {
        self.claim_ok_with(cfg, now, now_ms, self.fresh_claim)
    }

    /// [`Mach::claim_ok`]; `just` false while only waiting (the renewal is
    /// due a third of the TTL after the request, as `wake_at` names it).
    fn claim_ok_with(&self, cfg: &ControllerConfig, now: Instant, now_ms: u64, just: bool) -> bool {
        let ours = self
            .rec
            .claim
            .as_ref()
            .is_some_and(|c| c.owner == cfg.owner && c.until_ms > now_ms);
        ours && !self.needs_refence() && cfg.claim_fresh(self.claim_at, just, now)
    }

    fn claim_op(&mut self, cfg: &ControllerConfig, now_ms: u64) -> MStep {
        self.next_kind = SKind::Claim;
        if self.needs_refence() {
            // Decided from the record as read (its version, which claims
            // do not move); the store claims only at that version and moves
            // the assignment to this controller's worker-lease generation,
            // fencing the writer that assigned it.
            return MStep::Store(StoreOp::ClaimMachineVersion {
                key: self.rec.key.clone(),
                owner: cfg.owner.clone(),
                version: self.rec.version,
                now_ms: now_ms.max(self.rec.updated_at_ms),
                ttl_ms: cfg.lease_ttl_ms,
            });
        }
        MStep::Store(StoreOp::ClaimMachine {
            key: self.rec.key.clone(),
            owner: cfg.owner.clone(),
            now_ms: now_ms.max(self.rec.updated_at_ms),
            ttl_ms: cfg.lease_ttl_ms,
        })
    }

    fn write(
        &mut self,
        cfg: &ControllerConfig,
        now_ms: u64,
        kind: SKind,
        p: MachinePatch,
    ) -> MStep {
        self.next_kind = kind;
        MStep::Store(StoreOp::WriteMachine {
            key: self.rec.key.clone(),
            guard: Guard::for_machine(&self.rec, &cfg.owner),
            patch: p,
            now_ms: now_ms.max(self.rec.updated_at_ms),
        })
    }

    fn guarded(
        &mut self,
        cfg: &ControllerConfig,
        now: Instant,
        now_ms: u64,
        p: MachinePatch,
    ) -> MStep {
        if self.claim_ok(cfg, now, now_ms) {
            self.write(cfg, now_ms, SKind::Write, p)
        } else {
            self.claim_op(cfg, now_ms)
        }
    }

    /// The intent write, with the claim refreshed immediately before (C15).
    fn intent(
        &mut self,
        cfg: &ControllerConfig,
        now_ms: u64,
        state: MachineRecordState,
        op: MachineOperation,
    ) -> MStep {
        if !self.fresh_claim {
            return self.claim_op(cfg, now_ms);
        }
        let p = MachinePatch {
            state: Some(state),
            operation: Some((op, MachinePhase::Dispatching)),
            ..MachinePatch::default()
        };
        self.write(cfg, now_ms, SKind::Intent, p)
    }

    fn worker(&mut self, kind: WKind, op: WorkerOp) -> MStep {
        self.pending_w = Some(kind);
        MStep::Worker(op)
    }

    /// Ends the current operation: `state`, no operation, not due.
    fn settle(
        &mut self,
        cfg: &ControllerConfig,
        now: Instant,
        now_ms: u64,
        state: MachineRecordState,
        extra: MachinePatch,
    ) -> MStep {
        self.sent = false;
        self.verified = false;
        self.intent_mine = false;
        let p = MachinePatch {
            state: Some(state),
            operation: Some((MachineOperation::None, MachinePhase::None)),
            next_due_at_ms: Some(None),
            ..extra
        };
        self.guarded(cfg, now, now_ms, p)
    }

    /// The operation's outcome is uncertain: `unknown`, the operation kept
    /// as `uncertain` (never resent; reconcile or resolve settles it).
    fn uncertain(&mut self, cfg: &ControllerConfig, now: Instant, now_ms: u64, e: &Error) -> MStep {
        self.sent = false;
        self.intent_mine = false;
        let p = MachinePatch {
            state: Some(MachineRecordState::Unknown),
            operation: Some((self.rec.operation, MachinePhase::Uncertain)),
            next_due_at_ms: Some(None),
            last_error: Some(ErrorEntry::from_error(e, now_ms)),
            ..MachinePatch::default()
        };
        self.guarded(cfg, now, now_ms, p)
    }

    /// A create that never left the process, or that the worker's create
    /// handler refused (`Create::refused`): no machine, absence known.
    fn create_not_sent(
        &mut self,
        cfg: &ControllerConfig,
        now: Instant,
        now_ms: u64,
        e: &Error,
    ) -> MStep {
        let p = MachinePatch {
            state: Some(MachineRecordState::Unknown),
            operation: Some((MachineOperation::None, MachinePhase::None)),
            absence_at_ms: Some(now_ms.max(self.rec.updated_at_ms)),
            next_due_at_ms: Some(None),
            last_error: Some(ErrorEntry::from_error(e, now_ms)),
            ..MachinePatch::default()
        };
        self.sent = false;
        self.guarded(cfg, now, now_ms, p)
    }

    /// Refuses the requested operation without touching the worker.
    fn refuse(&mut self, cfg: &ControllerConfig, now: Instant, now_ms: u64, e: &Error) -> MStep {
        self.verified = false;
        let p = MachinePatch {
            operation: Some((MachineOperation::None, MachinePhase::None)),
            next_due_at_ms: Some(None),
            last_error: Some(ErrorEntry::from_error(e, now_ms)),
            ..MachinePatch::default()
        };
        self.guarded(cfg, now, now_ms, p)
    }

    fn observation(&self, obs: &Observation, now_ms: u64) -> RecordedObservation {
        RecordedObservation {
            state: record_state(obs.state),
            incarnation: incarnation_token(obs),
            at_ms: now_ms.max(self.rec.updated_at_ms),
        }
    }

    fn same_incarnation(&self, obs: &Observation) -> bool {
        self.rec
            .creation
            .as_ref()
            .is_some_and(|c| c.incarnation == incarnation_token(obs))
    }

    /// The next op. Called only with no store op outstanding.
    pub(super) fn step(
        &mut self,
        cfg: &ControllerConfig,
        leases: &Leases,
        now: Instant,
        now_ms: u64,
    ) -> MStep {
        if self.inflight.is_some() {
            return MStep::Wait;
        }
        if let Some(t) = self.retry_at {
            if now < t {
                return MStep::Wait;
            }
            self.retry_at = None;
        }
        self.lease_gen = self
            .rec
            .assignment
            .as_ref()
            .and_then(|a| leases.live(&a.worker_id, now, now_ms));
        if let Some(at) = self.fenced_at
            && self.fatal.is_none()
        {
            let assigned = self.rec.assignment.as_ref().map(|a| a.worker_generation);
            if self.lease_gen.is_some() && self.lease_gen == assigned {
                // Re-fenced (here or by another lease holder).
                self.fenced_at = None;
            } else if self.lease_gen.is_none() {
                if now.saturating_duration_since(at) < fence_wait(cfg) {
                    // The worker lease is wanted; its answer wakes us.
                    return MStep::Wait;
                }
                // Another controller holds the worker: it drives this
                // machine; nothing was written here.
                self.fatal = Some(Error::stale_claim(
                    Operation::StoreClaim,
                    Evidence::NotDispatched,
                    Reason::WorkerLease,
                ));
            }
        }
        if self.fatal.is_some() {
            if self.worker_op.is_some() {
                return MStep::Wait;
            }
            if let Some(mut f) = self.finishing.pop_front() {
                if f.error.is_none() {
                    // What is known about the command, not the machine
                    // task's store refusal alone.
                    f.error = self
                        .fatal
                        .map(|e| super::with_known_evidence(e, f.record.as_ref(), f.dispatched));
                }
                return MStep::Finished(f);
            }
            return MStep::Done;
        }
        if self.need_fetch {
            self.need_fetch = false;
            self.next_kind = SKind::Fetch;
            return MStep::Store(StoreOp::FetchMachine {
                key: self.rec.key.clone(),
            });
        }
        if let Some(exec) = self.finishing.front().map(|f| f.key.clone()) {
            if self.rec.active_execution.as_ref() != Some(&exec) {
                // Not (or no longer) the holder: resolved or finished elsewhere.
                if let Some(f) = self.finishing.pop_front() {
                    return MStep::Finished(f);
                }
            }
            if !self.claim_ok(cfg, now, now_ms) {
                return self.claim_op(cfg, now_ms);
            }
            self.next_kind = SKind::Finish;
            return MStep::Store(StoreOp::FinishCommand {
                machine: self.rec.key.clone(),
                guard: Guard::for_machine(&self.rec, &cfg.owner),
                exec,
                now_ms: now_ms.max(self.rec.updated_at_ms),
            });
        }
        if self.worker_op.is_some() {
            return if self.claim_ok_with(cfg, now, now_ms, false) {
                MStep::Wait
            } else {
                self.claim_op(cfg, now_ms)
            };
        }
        let taken = self.reply.take();
        let reply = match &taken {
            // C14.2: the intent, state or active command changed since the
            // observation began: the reply is not written.
            Some((_, _, snap)) if *snap != Snap::of(&self.rec) => {
                self.fatal = Some(Error::stale_version(
                    Operation::StoreWrite,
                    Evidence::Unknown,
                    Reason::ObservationOutdated,
                ));
                return MStep::Done;
            }
            Some((k, r, _)) => Some((*k, r.clone())),
            None => None,
        };
        let step = self.lifecycle(cfg, leases, reply, now, now_ms);
        if matches!(step, MStep::Store(_)) {
            self.kept = taken;
        }
        step
    }

    #[allow(clippy::too_many_lines)]
    fn lifecycle(
        &mut self,
        cfg: &ControllerConfig,
        leases: &Leases,
        reply: Option<(WKind, WorkerResult)>,
        now: Instant,
        now_ms: u64,
    ) -> MStep {
        use MachineOperation as Op;
        use MachinePhase as Ph;
        use MachineRecordState as S;
        let worker = self
            .rec
            .assignment
            .as_ref()
            .map(|a| a.worker_id.clone())
            .or_else(|| {
                let s = &self.rec.spec;
                cfg.creating_worker(&s.artifact, &s.profile, s.network.as_ref())
                    .ok()
                    .map(|w| w.id.clone())
            });
        let entry = worker
            .as_ref()
            .and_then(|w| cfg.workers.iter().find(|x| &x.id == w));
        let Some(profile) = entry.and_then(|e| e.profile.clone()) else {
            // Not a worker this controller can drive: an unassigned one is
            // still ended by its owner's delete (`uncreatable.rs`).
            return self.without_worker(cfg, now, now_ms);
        };
        let name = self
            .rec
            .assignment
            .as_ref()
            .and_then(|a| MachineName::new(&a.machine_name).ok());
        let worker_id = worker.clone().unwrap_or_default();
        let op_of = |kind: WKind, name: MachineName, profile: &Profile| -> WorkerOp {
            let profile = Box::new(profile.clone());
            let worker_id = worker_id.clone();
            match kind {
                WKind::Start => WorkerOp::Start {
                    worker_id,
                    profile,
                    name,
                },
                WKind::Stop => WorkerOp::Stop {
                    worker_id,
                    profile,
                    name,
                },
                WKind::Delete => WorkerOp::Delete { worker_id, name },
                WKind::Verify | WKind::Absent | WKind::Create => WorkerOp::Inspect {
                    worker_id,
                    profile,
                    name,
                },
            }
        };
        let (op, phase, state) = (self.rec.operation, self.rec.phase, self.rec.state);
        match (op, phase) {
            (Op::None, Ph::None) if state == S::Accepted && self.rec.next_due_at_ms.is_some() => {
                if self.rec.assignment.is_none() {
                    // The claim first (a fresh record), then the lease.
                    if !self.claim_ok(cfg, now, now_ms) {
                        return self.claim_op(cfg, now_ms);
                    }
                    if let Some(e) = self.port_conflict.take() {
                        // The store rolled every port back: `conflict`, no
                        // reservation, no worker request, no retry on
                        // another worker; a delete needs no worker call.
                        let p = MachinePatch {
                            state: Some(S::Conflict),
                            last_error: Some(ErrorEntry::from_error(&e, now_ms)),
                            next_due_at_ms: Some(None),
                            ..MachinePatch::default()
                        };
                        return self.write(cfg, now_ms, SKind::Write, p);
                    }
                    let Some(entry) = cfg
                        .workers
                        .iter()
                        .find(|w| w.profile.is_some() && Some(&w.id) == worker.as_ref())
                    else {
                        return MStep::Done;
                    };
                    if leases.live(&entry.id, now, now_ms).is_none() {
                        return MStep::Wait;
                    }
                    if let Some(e) = self.no_room.take() {
                        // C14.4: shared capacity is full. The reason is on
                        // the record; the machine stays accepted and is due
                        // again after one claim TTL (no queue position).
                        let p = MachinePatch {
                            last_error: Some(ErrorEntry::from_error(&e, now_ms)),
                            next_due_at_ms: Some(Some(now_ms.saturating_add(cfg.lease_ttl_ms))),
                            ..MachinePatch::default()
                        };
                        self.fatal = Some(e);
                        return self.write(cfg, now_ms, SKind::Write, p);
                    }
                    self.next_kind = SKind::Reserve;
                    return MStep::Store(StoreOp::ReserveMachine {
                        key: self.rec.key.clone(),
                        guard: Guard::for_machine(&self.rec, &cfg.owner),
                        reservation: Reservation {
                            worker_id: entry.id.clone(),
                            machine_name: machine_name_for(&self.rec.key),
                            capacity: entry
                                .reservation(&self.rec.spec.profile, RETAINED_RESERVATION),
                            limit: entry.capacity,
                        },
                        now_ms: now_ms.max(self.rec.updated_at_ms),
                    });
                }
                // Assigned, no intent yet: no create was ever sent.
                self.intent(cfg, now_ms, S::Creating, Op::Create)
            }
            (Op::Create, Ph::Dispatching) => {
                let Some(name) = name else {
                    return MStep::Done;
                };
                match reply {
                    Some((WKind::Create, Ok(WorkerReply::Machine(obs)))) => {
                        let to = match obs.state {
                            MachineState::Running => S::Running,
                            _ => S::Created,
                        };
                        let extra = MachinePatch {
                            creation: Some(CreationEvidence {
                                created_at_ms: obs.incarnation.created_at.saturating_mul(1_000),
                                incarnation: incarnation_token(&obs),
                            }),
                            observation: Some(self.observation(&obs, now_ms)),
                            ..MachinePatch::default()
                        };
                        self.settle(cfg, now, now_ms, to, extra)
                    }
                    // Never sent, or refused by the worker's create handler
                    // (a 400 envelope): this machine's one create made nothing.
                    Some((WKind::Create, Err(e)))
                        if e.evidence() == Evidence::NotDispatched
                            || crate::worker::Create::refused(&e) =>
                    {
                        self.create_not_sent(cfg, now, now_ms, &e)
                    }
                    Some((_, r)) => {
                        let e = match r {
                            Err(e) => e,
                            Ok(_) => {
                                Error::protocol(Operation::Create, Reason::CreateReplyMismatch)
                            }
                        };
                        self.uncertain(cfg, now, now_ms, &e)
                    }
                    None if self.sent => MStep::Wait,
                    None if self.intent_mine => match worker_spec(
                        &self.rec.spec,
                        cfg.workers.iter().find(|w| w.id == *worker_id),
                    ) {
                        Ok(spec) => {
                            self.pending_w = Some(WKind::Create);
                            MStep::Worker(WorkerOp::Create {
                                worker_id: worker_id.clone(),
                                profile: Box::new((*profile).clone()),
                                name,
                                spec: Box::new(spec),
                            })
                        }
                        // Nothing leaves the process: as a create refused
                        // before sending.
                        Err(e) => self.create_not_sent(cfg, now, now_ms, &e),
                    },
                    // Found with an intent this process did not write: the
                    // create may have been sent; never again (C17.1).
                    None => self.uncertain(
                        cfg,
                        now,
                        now_ms,
                        &Error::unknown(
                            Operation::Create,
                            Evidence::DispatchUncertain,
                            Reason::IntentNotMine,
                        ),
                    ),
                }
            }
            (Op::Start, Ph::Pending) => {
                if self.rec.creation.is_none() || name.is_none() {
                    return self.refuse(
                        cfg,
                        now,
                        now_ms,
                        &Error::validation(Operation::Start, Reason::NoCreationEvidence),
                    );
                }
                if state == S::Running {
                    return self.settle(cfg, now, now_ms, S::Running, MachinePatch::default());
                }
                self.intent(cfg, now_ms, S::Starting, Op::Start)
            }
            (Op::Stop | Op::Delete, Ph::Pending) => {
                let Some(name) = name else {
                    if op == Op::Delete && self.rec.assignment.is_none() {
                        // Never assigned: deleted with no worker call.
                        return self.settle(cfg, now, now_ms, S::Deleted, MachinePatch::default());
                    }
                    return self.refuse(
                        cfg,
                        now,
                        now_ms,
                        &Error::validation(Operation::Stop, Reason::NoCreationEvidence),
                    );
                };
                if op == Op::Delete && self.rec.absence_at_ms.is_some() {
                    return self.settle(cfg, now, now_ms, S::Deleted, MachinePatch::default());
                }
                if self.rec.creation.is_none() {
                    let o = if op == Op::Stop {
                        Operation::Stop
                    } else {
                        Operation::Delete
                    };
                    return self.refuse(
                        cfg,
                        now,
                        now_ms,
                        &Error::validation(o, Reason::NoCreationEvidence),
                    );
                }
                if op == Op::Stop && matches!(state, S::Created | S::Stopped) {
                    return self.settle(cfg, now, now_ms, state, MachinePatch::default());
                }
                match reply {
                    Some((WKind::Verify, Ok(WorkerReply::Machine(obs)))) => {
                        if !self.same_incarnation(&obs) {
                            let e = Error::identity_conflict(
                                Operation::Get,
                                Evidence::NotDispatched,
                                Reason::IncarnationMismatch,
                            );
                            return self.refuse(cfg, now, now_ms, &e);
                        }
                        self.verified = true;
                    }
                    Some((WKind::Verify, Err(e))) if e.category() == Category::NotFound => {
                        // The recorded machine is gone (evidence held).
                        let (to, absence) = if op == Op::Delete {
                            (S::Deleted, Some(now_ms.max(self.rec.updated_at_ms)))
                        } else {
                            (S::Missing, None)
                        };
                        if to == S::Deleted && !state.can_move_to(S::Deleted) {
                            // `created`/`running`/`stopped` → `deleted` is
                            // no transition (recovery sim seed 1064: the
                            // write was refused for good and the delete
                            // never ended): the absence is recorded with
                            // `missing`, the delete stays pending and
                            // settles `deleted` next (`missing` → `deleted`).
                            let p = MachinePatch {
                                state: Some(S::Missing),
                                absence_at_ms: absence,
                                ..MachinePatch::default()
                            };
                            return self.guarded(cfg, now, now_ms, p);
                        }
                        let extra = MachinePatch {
                            absence_at_ms: absence,
                            ..MachinePatch::default()
                        };
                        return self.settle(cfg, now, now_ms, to, extra);
                    }
                    Some((WKind::Verify, r)) => {
                        // Could not verify: nothing is mutated; try later.
                        let _ = r;
                        return self.retry(cfg, now);
                    }
                    _ => {}
                }
                if !self.verified {
                    return self.worker(WKind::Verify, op_of(WKind::Verify, name, &profile));
                }
                let to = if op == Op::Stop {
                    S::Stopping
                } else {
                    S::Deleting
                };
                self.intent(cfg, now_ms, to, op)
            }
            (Op::Start | Op::Stop | Op::Delete, Ph::Dispatching) => {
                let Some(name) = name else {
                    return MStep::Done;
                };
                let kind = match op {
                    Op::Start => WKind::Start,
                    Op::Stop => WKind::Stop,
                    _ => WKind::Delete,
                };
                match reply {
                    Some((WKind::Start | WKind::Stop, Ok(WorkerReply::Machine(obs)))) => {
                        let want = if op == Op::Start {
                            MachineState::Running
                        } else {
                            MachineState::Stopped
                        };
                        if obs.state == want && self.same_incarnation(&obs) {
                            let extra = MachinePatch {
                                observation: Some(self.observation(&obs, now_ms)),
                                ..MachinePatch::default()
                            };
                            return self.settle(cfg, now, now_ms, record_state(want), extra);
                        }
                        let e = Error::protocol(operation_of(op), Reason::ReplyMismatch);
                        self.uncertain(cfg, now, now_ms, &e)
                    }
                    Some((WKind::Delete, Ok(WorkerReply::Deleted))) => {
                        self.deleted = true;
                        self.worker(WKind::Absent, op_of(WKind::Absent, name, &profile))
                    }
                    Some((WKind::Absent, Err(e))) if e.category() == Category::NotFound => {
                        let extra = MachinePatch {
                            absence_at_ms: Some(now_ms.max(self.rec.updated_at_ms)),
                            ..MachinePatch::default()
                        };
                        self.settle(cfg, now, now_ms, S::Deleted, extra)
                    }
                    Some((_, r)) => {
                        let e = match r {
                            Err(e) => e,
                            Ok(_) => Error::protocol(operation_of(op), Reason::ReplyMismatch),
                        };
                        self.uncertain(cfg, now, now_ms, &e)
                    }
                    None if self.sent => MStep::Wait,
                    None if self.intent_mine => self.worker(kind, op_of(kind, name, &profile)),
                    None => self.uncertain(
                        cfg,
                        now,
                        now_ms,
                        &Error::unknown(
                            operation_of(op),
                            Evidence::DispatchUncertain,
                            Reason::IntentNotMine,
                        ),
                    ),
                }
            }
            _ => {
                if self.rec.next_due_at_ms.is_some() && self.rec.operation != Op::Create {
                    let p = MachinePatch {
                        next_due_at_ms: Some(None),
                        ..MachinePatch::default()
                    };
                    return self.guarded(cfg, now, now_ms, p);
                }
                MStep::Done
            }
        }
    }

    fn retry(&mut self, cfg: &ControllerConfig, now: Instant) -> MStep {
        self.failures += 1;
        if self.failures > MAX_STORE_RETRIES {
            self.fatal = Some(Error::unknown(
                Operation::Get,
                Evidence::NotDispatched,
                Reason::VerifyFailed,
            ));
            return MStep::Done;
        }
        self.retry_at = Some(now + cfg.poll());
        MStep::Wait
    }

    /// The answer to this task's store op.
    pub(super) fn on_stored(
        &mut self,
        now: Instant,
        id: OpId,
        cfg: &ControllerConfig,
        result: StoreResult,
    ) -> Option<Box<Finished>> {
        let kind = match self.inflight {
            Some((op, k)) if op == id => k,
            _ => return None,
        };
        self.inflight = None;
        let kept = self.kept.take();
        let acted = result.is_ok() && !matches!(kind, SKind::Claim | SKind::Fetch);
        if !acted && kept.is_some() {
            // Not written: the next step decides from the same answer.
            // Only when this op acted on one: a claim renewal or fetch
            // sent while a worker op was out carries none, and the worker
            // answer that arrived meanwhile is kept (recovery sim seed
            // 7961: overwriting it left the create's answer dropped and
            // the record `creating` for good).
            self.reply = kept;
        }
        match result {
            Ok(StoreReply::Machine(rec)) if rec.key == self.rec.key => {
                self.failures = 0;
                if kind != SKind::Fetch {
                    self.refetches = 0;
                }
                self.rec = rec;
                self.fresh_claim = kind == SKind::Claim;
                match kind {
                    SKind::Claim => self.claim_at = Some(self.asked_at.unwrap_or(now)),
                    SKind::Intent => {
                        self.intent_mine = true;
                        self.sent = false;
                    }
                    _ => {}
                }
                None
            }
            Ok(StoreReply::SlotFinished {
                machine,
                execution,
                finish,
            }) if kind == SKind::Finish => {
                self.failures = 0;
                self.rec = machine;
                let mut f = self.finishing.pop_front()?;
                if finish == Finish::Kept && f.error.is_none() && execution.result.is_none() {
                    f.error = Some(Error::unknown(
                        Operation::Exec,
                        Evidence::Unknown,
                        Reason::SlotKept,
                    ));
                }
                f.record = Some(execution);
                Some(f)
            }
            Ok(_) => {
                self.fatal = Some(Error::protocol(
                    Operation::StoreFetch,
                    Reason::UnexpectedReply,
                ));
                None
            }
            Err(e) => {
                self.fresh_claim = false;
                match e.category() {
                    Category::StaleVersion if self.refetches < 16 => {
                        self.refetches += 1;
                        self.need_fetch = true;
                    }
                    Category::Store | Category::Unknown | Category::Transport
                        if self.failures < MAX_STORE_RETRIES =>
                    {
                        self.failures += 1;
                        self.retry_at = Some(now + cfg.poll());
                    }
                    Category::StaleClaim
                        if matches!(e.reason(), Reason::WorkerGeneration | Reason::WorkerLease)
                            && self.rec.assignment.is_some()
                            && self.failures < MAX_STORE_RETRIES =>
                    {
                        // Assigned under a worker-lease generation that is
                        // no longer the worker's (C15): want the lease, then
                        // re-fence with the claim (see `step`).
                        self.failures += 1;
                        self.fenced_at.get_or_insert(now);
                        self.need_fetch = true;
                    }
                    Category::StaleClaim
                        if e.reason() == Reason::ClaimExpired
                            && self.failures < MAX_STORE_RETRIES =>
                    {
                        // This owner's claim at this generation ended (a
                        // settled terminal run of this process released it,
                        // or it lapsed) and nobody claimed since (that would
                        // move the generation: `claim_owner`): re-take it
                        // and decide again from the record it returns.
                        self.failures += 1;
                        self.claim_at = None;
                    }
                    Category::StaleClaim if !self.finishing.is_empty() && self.failures < 64 => {
                        // Another controller holds the machine's claim: the
                        // slot is finished once it lapses (within one TTL).
                        self.failures += 1;
                        self.need_fetch = true;
                        self.retry_at = Some(now + cfg.poll().max(cfg.renew_every() / 2));
                    }
                    Category::AdmissionExhausted if kind == SKind::Reserve => {
                        self.no_room = Some(e);
                    }
                    Category::PortConflict if kind == SKind::Reserve => {
                        self.port_conflict = Some(e);
                    }
                    Category::Validation
                        if kind == SKind::Finish && e.reason() == Reason::NotSlotHolder =>
                    {
                        self.need_fetch = true;
                    }
                    _ => self.fatal = Some(e),
                }
                None
            }
        }
    }

    /// The answer to this task's worker op.
    pub(super) fn on_worker(&mut self, id: OpId, result: WorkerResult) {
        if self.worker_op != Some(id) {
            return;
        }
        self.worker_op = None;
        let Some(kind) = self.wkind.take() else {
            return;
        };
        let snap = self.began.take().unwrap_or_else(|| Snap::of(&self.rec));
        self.reply = Some((kind, result, snap));
    }

    /// The error this task stopped with, if any.
    pub(super) fn take_fatal(&mut self) -> Option<Error> {
        self.fatal.take()
    }
}

/// How long a fenced machine waits for its worker's lease before leaving
/// the machine to the controller holding it: two lease TTLs (a lease
/// nobody renews lapses within one).
fn fence_wait(cfg: &ControllerConfig) -> std::time::Duration {
    std::time::Duration::from_millis(cfg.lease_ttl_ms.saturating_mul(2))
}

const fn record_state(s: MachineState) -> MachineRecordState {
    match s {
        MachineState::Created => MachineRecordState::Created,
        MachineState::Running => MachineRecordState::Running,
        MachineState::Stopped => MachineRecordState::Stopped,
    }
}

const fn operation_of(op: MachineOperation) -> Operation {
    match op {
        MachineOperation::Create => Operation::Create,
        MachineOperation::Start => Operation::Start,
        MachineOperation::Stop => Operation::Stop,
        MachineOperation::Delete => Operation::Delete,
        MachineOperation::None => Operation::Get,
    }
}

/// The stored spec of `command` with `files` in the slot of `machine` (its
/// scope, artifact and exact profile, C14.3). A command with files takes
/// the machine's guest-path policy and is checked by the acceptance rules
/// of a disposable command's files (`exec::check_files`); one
/// without files stores no policy (its identity is unchanged).
///
/// # Errors
/// `validation` when the spec breaks a stored-shape rule, a file rule, or
/// the command's timeout exceeds the profile's execution budget.
pub fn command_spec(
    command: &crate::exec::Command,
    files: &crate::managed::CommandFiles,
    machine: &MachineRecord,
) -> Result<crate::managed::ExecutionSpec, Error> {
    let target = super::RunTarget {
        artifact: machine.spec.artifact.clone(),
        profile: machine.spec.profile.clone(),
    };
    let mut spec = super::spec_for(command, &target, "w", "m")?;
    spec.worker_machine = None;
    spec.machine = Some(machine.key.clone());
    if !files.is_empty() {
        spec.inputs.clone_from(&files.inputs);
        spec.outputs.clone_from(&files.outputs);
        spec.guest_paths.clone_from(&machine.spec.guest_paths);
    }
    if let Some(t) = command.effective_timeout_secs() {
        let ms = u64::from(t) * 1_000;
        if ms > spec.profile.budgets.execution_ms {
            return Err(
                Error::validation(Operation::Submit, Reason::TimeoutOverBudget)
                    .with_limit(ms, spec.profile.budgets.execution_ms),
            );
        }
    }
    spec.validate()?;
    if !files.is_empty() {
        super::exec::check_files(&spec)?;
    }
    Ok(spec)
}

fn key_of(op: &StoreOp) -> RecordKey {
    match op {
        StoreOp::SubmitCommand { record, .. } | StoreOp::SubmitDispatching { record, .. } => {
            record.key.clone()
        }
        _ => RecordKey {
            scope: String::new(),
            id: String::new(),
        },
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::managed::testkit::{key, machine_in};

    const T0: u64 = 1_700_000_000_000;

    #[test]
    fn list_limits_at_n_and_n_plus_one() {
        assert_eq!(check_list_limit(None).unwrap(), DEFAULT_LIST_LIMIT);
        assert_eq!(check_list_limit(Some(1)).unwrap(), 1);
        assert_eq!(check_list_limit(Some(100)).unwrap(), 100);
        for bad in [0, 101] {
            let e = check_list_limit(Some(bad)).unwrap_err();
            assert_eq!(
                (e.category(), e.reason()),
                (Category::Validation, Reason::ListLimit)
            );
            assert_eq!(e.evidence(), Evidence::NotDispatched);
        }
    }

    #[test]
    fn wait_limits_at_n_and_n_plus_one() {
        assert!(check_wait_ms(0).is_ok());
        assert!(check_wait_ms(900_000).is_ok());
        let e = check_wait_ms(900_001).unwrap_err();
        assert_eq!(
            (e.category(), e.reason()),
            (Category::Validation, Reason::WaitTimeout)
        );
    }

    #[test]
    fn a_wait_settles_on_idle_or_uncertain_states_only() {
        use MachineRecordState as S;
        for s in S::ALL {
            let mut m = machine_in(s, key("s", "m1"), T0).unwrap();
            m.operation = MachineOperation::None;
            m.phase = MachinePhase::None;
            let want = matches!(
                s,
                S::Created
                    | S::Running
                    | S::Stopped
                    | S::Unknown
                    | S::Missing
                    | S::Conflict
                    | S::Deleted
            );
            assert_eq!(machine_settled(&m), want, "{s:?}");
        }
        let mut busy = machine_in(S::Running, key("s", "m1"), T0).unwrap();
        busy.operation = MachineOperation::Stop;
        busy.phase = MachinePhase::Pending;
        assert!(!machine_settled(&busy));
        assert!(!slot_free(&busy));
    }

    #[test]
    fn retained_names_are_valid_and_distinct_per_key() {
        let a = machine_name_for(&key("s", "m1"));
        let b = machine_name_for(&key("s", "m2"));
        assert_ne!(a, b);
        for n in [&a, &b] {
            crate::managed::check_machine_name(n).unwrap();
        }
    }
}
