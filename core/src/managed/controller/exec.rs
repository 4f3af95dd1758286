//! One execution inside the controller: a pure state machine over the last
//! stored record and what this controller itself did (sent the intent,
//! sent the command, holds an unwritten result).
//!
//! [`Exec::step`] decides the next op from that; it is called whenever the
//! execution has no store op outstanding. At most one store op and one
//! worker op are outstanding at a time.

use crate::Reason;
use std::time::{Duration, Instant};

use super::ops::{
    OpId, Reservation, StoreOp, StoreReply, StoreResult, WorkerOp, WorkerReply, WorkerResult,
};
use super::{ControllerConfig, Finished, Leases, MAX_STORE_RETRIES, command_of};
use crate::exec::{ExecOutcome, ExecOutput};
use crate::managed::claim::Guard;
use crate::managed::patch::ExecPatch;
use crate::managed::record::{
    CreationEvidence, ErrorEntry, ExecResult, ExecutionRecord, Resources,
};
use crate::managed::state::{Cleanup, Collection, ExecState, RecordEvidence};
use crate::worker::{MachineName, MachineSpec, MachineState, Observation};
use crate::{Category, Error, Evidence, Operation};

mod disposable;
mod files;
mod intent;

pub(super) use intent::{descends_from, intent_outcome};

pub(super) use files::check_files;

/// Consecutive `stale_version` refetches before an execution is given up.
const MAX_REFETCHES: u32 = 16;

/// What an execution wants next.
#[derive(Debug)]
pub(super) enum Step {
    /// Nothing until an answer or a timeout.
    Wait,
    /// Perform this store op.
    Store(StoreOp),
    /// Perform this worker op (then call `step` again).
    Worker(WorkerOp),
    /// This controller is done with the execution.
    Finish(Box<Finished>),
}

/// What the outstanding store op is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Claim,
    Fetch,
    Intent,
    Result,
    Write,
}

/// The exec's answer, classified, until it is stored.
#[derive(Clone, Debug)]
enum Observed {
    /// An exit (with the output when it was read whole).
    Exit(ExecResult),
    /// Refused before anything could leave the process.
    NotSent,
    /// May have reached the worker; outcome unknown.
    Uncertain,
    /// A background launch was acknowledged (C5.4).
    Launched,
}

/// Deadline slots with a monotonic bound (C13.4).
#[derive(Clone, Copy, Debug)]
enum Deadline {
    Queue = 0,
    Preparation = 1,
    Execution = 2,
    Cleanup = 3,
    Collection = 4,
}

#[derive(Debug)]
pub(super) struct Exec {
    rec: ExecutionRecord,
    inflight: Option<(OpId, Kind)>,
    next_kind: Kind,
    worker_op: Option<OpId>,
    /// When the claim this controller last got confirmed was asked for
    /// (monotonic): its freshness counts from the request, not from the
    /// answer (C15, as the worker lease's monotonic end), so a slow answer
    /// leaves it less fresh.
    claim_at: Option<Instant>,
    /// When the outstanding store op was handed out (monotonic).
    asked_at: Option<Instant>,
    /// The last store answer was a claim (fresh for the intent).
    fresh_claim: bool,
    /// This controller wrote the `dispatching` intent.
    intent_mine: bool,
    /// A due-scan row showed the record past `ready` while this execution
    /// had neither written nor was writing its own intent (fuzz finding 5,
    /// session 8): another controller's intent may be out there. Also set
    /// when its own intent write was answered with a row that is not that
    /// intent (fuzz finding 11, session 9). The
    /// command is never sent from here, even if this execution's own
    /// intent write later succeeds (a rollback the store handle did not
    /// see), and a later read showing the record before dispatch is
    /// `record_went_back`.
    shown_dispatched: bool,
    /// This controller committed `accepted → preparing`: staging the
    /// inputs is its own. Only the writer of `preparing` ever uploads, so a
    /// `preparing` record with inputs that it did not write (another
    /// controller may have sent uploads, their outcome unknown here) is
    /// failed `not_dispatched`, never staged again (C6.1; sim finding 10).
    preparing_mine: bool,
    /// The exec was emitted (or refused locally): never sent again.
    attempted: bool,
    /// The exec was emitted to the worker.
    dispatched: bool,
    observed: Option<Observed>,
    result_written: bool,
    output: Option<ExecOutput>,
    exec_error: Option<Error>,
    /// Monotonic bound of each deadline, fixed when first seen.
    mono: [Option<Instant>; 5],
    retry_at: Option<Instant>,
    failures: u32,
    /// Consecutive store failures of claim renewals while the exec is
    /// outstanding: only the backoff, never a reason to give up.
    renew_failures: u32,
    /// Another controller's claim stopped a write of an observed outcome:
    /// the next fetch tells when that claim lapses.
    foreign_wait: bool,
    refetches: u32,
    need_fetch: bool,
    cancel_seen: bool,
    fatal: Option<Error>,
    held_elsewhere: bool,
    /// What the next `Step::Worker` is (set by `step`, read by `worker_sent`).
    pending_kind: Option<MKind>,
    machine: MachineSteps,
    /// A command on a retained machine: the machine's worker and name,
    /// read from its record (the controller sets it before the first step).
    target: Option<(String, String)>,
    /// The retained machine's recorded incarnation (its creation
    /// evidence), which it must show running before each output download.
    target_incarnation: Option<String>,
    /// The generation of this controller's live lease on the execution's
    /// worker, read at the start of each `step` (disposable only).
    lease_gen: Option<u64>,
    /// A caller of this process wants the output as it comes: the command
    /// goes out as a streamed exec when it can be streamed (set by the
    /// controller before each step; read only before the exec is sent).
    stream: bool,
    /// Staging and collection of the declared files.
    files: files::FileSteps,
}

/// A machine operation of a disposable execution.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum MKind {
    Create,
    Start,
    Stop,
    /// Inspect before a delete: the machine must be the recorded incarnation.
    Verify,
    Delete,
    /// Inspect after a delete: a 404 is the recorded absence.
    Absent,
}

/// What this controller did to a disposable execution's machine (C12.4,
/// C17.2). Only facts of this process: a resumed record starts empty.
#[derive(Debug, Default)]
struct MachineSteps {
    /// This process reserved the name (or claimed the record reserved
    /// and before any create intent), so no create was sent for it before.
    reserved_here: bool,
    /// This process committed the create intent (`accepted` → `preparing`)
    /// of a name it reserved: the create may be sent (once). A `preparing`
    /// record it did not write itself — another controller may have taken
    /// it over and sent the create meanwhile — never is.
    create_intent_mine: bool,
    create_sent: bool,
    start_sent: bool,
    started: bool,
    verified: bool,
    delete_sent: bool,
    deleted: bool,
    absent_sent: bool,
    stop_sent: bool,
    /// This process committed the record's move into `unknown`: it alone
    /// sends the graceful stop (at most one per record).
    marked_unknown: bool,
    /// The kind of the outstanding machine op.
    kind: Option<MKind>,
    /// The last machine answer, until a write acting on it succeeds.
    reply: Option<(MKind, WorkerResult)>,
}

impl Exec {
    /// An execution over `rec`, first seen at `now`; `queue_bound` is the
    /// monotonic queue deadline fixed when this controller accepted it.
    pub(super) fn new(
        rec: ExecutionRecord,
        now: Instant,
        now_ms: u64,
        queue_bound: Option<Instant>,
    ) -> Self {
        let mut ex = Self {
            rec,
            inflight: None,
            next_kind: Kind::Write,
            worker_op: None,
            claim_at: None,
            asked_at: None,
            fresh_claim: false,
            intent_mine: false,
            shown_dispatched: false,
            preparing_mine: false,
            attempted: false,
            dispatched: false,
            observed: None,
            result_written: false,
            output: None,
            exec_error: None,
            mono: [queue_bound, None, None, None, None],
            retry_at: None,
            failures: 0,
            renew_failures: 0,
            foreign_wait: false,
            refetches: 0,
            need_fetch: false,
            cancel_seen: false,
            fatal: None,
            held_elsewhere: false,
            pending_kind: None,
            machine: MachineSteps::default(),
            target: None,
            target_incarnation: None,
            lease_gen: None,
            stream: false,
            files: files::FileSteps::default(),
        };
        ex.bound_deadlines(now, now_ms);
        ex
    }

    /// An execution over `rec`, inserted by this controller's own
    /// acceptance together with its claim and dispatch intent (issue 16):
    /// the intent is this controller's and the claim was confirmed by an
    /// acceptance asked at `asked`.
    pub(super) fn with_intent(
        rec: ExecutionRecord,
        now: Instant,
        asked: Instant,
        now_ms: u64,
    ) -> Self {
        let mut ex = Self::new(rec, now, now_ms, None);
        ex.intent_committed(asked);
        ex
    }

    /// The record this execution holds was stored by this controller with
    /// its dispatch intent and a claim (an acceptance or a command
    /// submission with the intent, asked at `asked`): the exec is sent
    /// next, after a renewal when the claim is no longer fresh.
    pub(super) fn intent_committed(&mut self, asked: Instant) {
        self.intent_mine = true;
        self.claim_at = Some(asked);
    }

    /// Fixes the monotonic bound of every deadline the record carries and
    /// that has none yet: `now + (deadline − now_ms)`. Taken once, so a
    /// later wall-clock step backwards cannot extend it.
    fn bound_deadlines(&mut self, now: Instant, now_ms: u64) {
        let d = self.rec.deadlines;
        for (slot, wall) in [
            (Deadline::Queue, d.queue_ms),
            (Deadline::Preparation, d.preparation_ms),
            (Deadline::Execution, d.execution_ms),
            (Deadline::Cleanup, d.cleanup_ms),
            (Deadline::Collection, d.collection_ms),
        ] {
            if let (None, Some(w)) = (self.mono[slot as usize], wall) {
                self.mono[slot as usize] =
                    Some(now + Duration::from_millis(w.saturating_sub(now_ms)));
            }
        }
    }

    fn past(&self, slot: Deadline, now: Instant, now_ms: u64) -> bool {
        let d = self.rec.deadlines;
        let wall = match slot {
            Deadline::Queue => d.queue_ms,
            Deadline::Preparation => d.preparation_ms,
            Deadline::Execution => d.execution_ms,
            Deadline::Cleanup => d.cleanup_ms,
            Deadline::Collection => d.collection_ms,
        };
        wall.is_some_and(|w| now_ms >= w) || self.mono[slot as usize].is_some_and(|m| now >= m)
    }

    /// Store op `id` (the last `step`'s) was handed out at `now`.
    pub(super) fn store_sent(&mut self, id: OpId, now: Instant) {
        self.inflight = Some((id, self.next_kind));
        self.asked_at = Some(now);
    }

    pub(super) fn worker_sent(&mut self, id: OpId) {
        self.worker_op = Some(id);
        if let Some(k) = self.files.pending.take() {
            self.files.kind = Some(k);
            return;
        }
        match self.pending_kind.take() {
            Some(k) => {
                self.machine.kind = Some(k);
                let m = &mut self.machine;
                match k {
                    MKind::Create => m.create_sent = true,
                    MKind::Start => m.start_sent = true,
                    MKind::Stop => m.stop_sent = true,
                    MKind::Delete => m.delete_sent = true,
                    MKind::Absent => m.absent_sent = true,
                    MKind::Verify => {}
                }
            }
            None => {
                self.attempted = true;
                self.dispatched = true;
            }
        }
    }

    /// Sets the worker, machine name and recorded incarnation of a
    /// retained machine's command.
    pub(super) fn set_target(
        &mut self,
        worker_id: String,
        machine: String,
        incarnation: Option<String>,
    ) {
        self.target = Some((worker_id, machine));
        self.target_incarnation = incarnation;
    }

    /// Whether a caller of this process wants the output as it comes.
    pub(super) fn set_stream(&mut self, on: bool) {
        self.stream = on;
    }

    /// Re-reads the record before the first step (it came from a due page
    /// that may be older than the store).
    pub(super) fn refetch(&mut self) {
        self.need_fetch = true;
    }

    /// The retained machine whose slot this command holds.
    pub(super) fn retained_machine(&self) -> Option<&crate::managed::RecordKey> {
        self.rec.spec.machine.as_ref()
    }

    /// True for an execution on a machine this controller owns (C12.4).
    pub(super) fn is_disposable(&self) -> bool {
        self.rec.spec.worker_machine.is_none() && self.rec.spec.machine.is_none()
    }

    /// The worker a disposable execution runs on: its assignment, else the
    /// first configured worker that can create machines.
    pub(super) fn worker_of(&self, cfg: &ControllerConfig) -> Option<String> {
        if let Some(a) = &self.rec.assignment {
            return Some(a.worker_id.clone());
        }
        let s = &self.rec.spec;
        cfg.creating_worker(&s.artifact, &s.profile, s.network.as_ref())
            .ok()
            .map(|w| w.id.clone())
    }

    /// When this execution next needs time to pass (claim renewal while a
    /// command runs, the execution deadline, a store retry).
    pub(super) fn wake_at(
        &self,
        cfg: &ControllerConfig,
        leases: &Leases,
        now_ms: u64,
    ) -> Option<Instant> {
        if self.inflight.is_some() {
            return None;
        }
        let worker = self.worker_of(cfg).filter(|_| self.is_disposable());
        if worker.as_ref().is_some_and(|w| !leases.held(w, now_ms)) {
            // `step` waits for the worker lease, whose own timer wakes us.
            return None;
        }
        let at = self.wake_at_leased(cfg);
        match worker.and_then(|w| leases.until(&w)) {
            // From the lease's monotonic end on, `step` waits for the
            // worker lease too (its renewal is out or due by then).
            Some(end) => at.filter(|t| *t < end),
            None => at,
        }
    }

    /// [`Exec::wake_at`] while the worker lease (if any) is live.
    fn wake_at_leased(&self, cfg: &ControllerConfig) -> Option<Instant> {
        if self.fatal.is_some() || self.held_elsewhere {
            // `step` waits for the worker's answer only: no timer moves it.
            return None;
        }
        if let Some(t) = self.retry_at {
            // `step` does nothing before `retry_at`: an earlier wake (a
            // renewal or deadline already due) would make a driver spin.
            return Some(t);
        }
        if self.worker_op.is_some() && self.files.kind.is_some() {
            // A transfer is out: only the claim renewal needs time.
            return self.claim_at.map(|c| c + cfg.renew_every());
        }
        if self.worker_op.is_some() {
            let renew = self.claim_at.map(|c| c + cfg.renew_every());
            // The execution deadline moves `step` only while the exec
            // itself is out: with a machine op out (a disposable's inspect
            // or stop) `step` waits for that answer, so a deadline already
            // past would make a driver spin (fuzz finding 17, session 9).
            let deadline = if self.rec.state.ends_wait() || !self.exec_outstanding() {
                None
            } else {
                self.mono[Deadline::Execution as usize]
            };
            return [renew, deadline].into_iter().flatten().min();
        }
        None
    }

    /// True while the claim this controller holds is live and fresh enough
    /// not to need renewal before the next op (and, on an assigned
    /// disposable record, under the generation of this controller's live
    /// worker lease); see [`super::claim_fresh`].
    fn claim_ok(&self, cfg: &ControllerConfig, now: Instant, now_ms: u64) -> bool {
        self.claim_ok_with(cfg, now, now_ms, self.fresh_claim)
    }

    /// [`Exec::claim_ok`]; `just`: the claim's answer was the last one and
    /// an op follows it (while only waiting, a third of the TTL since the
    /// request makes the renewal due, as `wake_at` names it).
    fn claim_ok_with(&self, cfg: &ControllerConfig, now: Instant, now_ms: u64, just: bool) -> bool {
        let ours = self
            .rec
            .claim
            .as_ref()
            .is_some_and(|c| c.owner == cfg.owner && c.until_ms > now_ms);
        ours && !self.needs_refence() && cfg.claim_fresh(self.claim_at, just, now)
    }

    /// An assigned disposable record under another worker-lease generation
    /// than the one this controller holds: every write is fenced (C15)
    /// until the claim re-fences it (`claim_version`).
    fn needs_refence(&self) -> bool {
        self.is_disposable()
            && self
                .rec
                .assignment
                .as_ref()
                .is_some_and(|a| self.lease_gen != Some(a.worker_generation))
    }

    fn claim_op(&mut self, cfg: &ControllerConfig, now_ms: u64) -> Step {
        self.next_kind = Kind::Claim;
        if self.needs_refence() {
            // Decided from the record as read (its version); the store
            // claims only at that version and moves the assignment to this
            // controller's worker-lease generation, fencing the old writer.
            return Step::Store(StoreOp::ClaimVersion {
                key: self.rec.key.clone(),
                owner: cfg.owner.clone(),
                version: self.rec.version,
                now_ms: now_ms.max(self.rec.updated_at_ms),
                ttl_ms: cfg.lease_ttl_ms,
            });
        }
        Step::Store(StoreOp::Claim {
            key: self.rec.key.clone(),
            owner: cfg.owner.clone(),
            now_ms: now_ms.max(self.rec.updated_at_ms),
            ttl_ms: cfg.lease_ttl_ms,
        })
    }

    fn write(&mut self, cfg: &ControllerConfig, now_ms: u64, kind: Kind, patch: ExecPatch) -> Step {
        self.next_kind = kind;
        Step::Store(StoreOp::Write {
            key: self.rec.key.clone(),
            guard: Guard::for_exec(&self.rec, &cfg.owner),
            patch,
            now_ms: now_ms.max(self.rec.updated_at_ms),
        })
    }

    /// A guarded write, claiming (or renewing) first when needed.
    fn guarded(
        &mut self,
        cfg: &ControllerConfig,
        now: Instant,
        now_ms: u64,
        kind: Kind,
        patch: ExecPatch,
    ) -> Step {
        if self.claim_ok(cfg, now, now_ms) {
            self.write(cfg, now_ms, kind, patch)
        } else {
            self.claim_op(cfg, now_ms)
        }
    }

    /// A guarded write of several patches in one commit (the result and
    /// what follows it), claiming (or renewing) first when needed.
    fn guarded_steps(
        &mut self,
        cfg: &ControllerConfig,
        now: Instant,
        now_ms: u64,
        patches: Vec<ExecPatch>,
    ) -> Step {
        if !self.claim_ok(cfg, now, now_ms) {
            return self.claim_op(cfg, now_ms);
        }
        self.next_kind = Kind::Result;
        Step::Store(StoreOp::WriteSteps {
            key: self.rec.key.clone(),
            guard: Guard::for_exec(&self.rec, &cfg.owner),
            patches,
            now_ms: now_ms.max(self.rec.updated_at_ms),
        })
    }

    fn finish(&mut self) -> Step {
        let error = match self.fatal.take() {
            Some(e) => Some(self.with_known_evidence(e)),
            None => self.exec_error.take(),
        };
        Step::Finish(Box::new(Finished {
            key: self.rec.key.clone(),
            record: Some(self.rec.clone()),
            output: self.output.take(),
            error,
            dispatched: self.dispatched && !matches!(self.observed, Some(Observed::NotSent)),
            held_elsewhere: self.held_elsewhere,
        }))
    }

    /// An error that ends the execution here carries what is known about
    /// the command: never `not_dispatched` once it was sent.
    fn with_known_evidence(&self, e: Error) -> Error {
        if self.dispatched && !matches!(self.observed, Some(Observed::NotSent)) {
            match (&self.output, &self.observed, &self.exec_error) {
                (Some(out), _, _) => e
                    .with_evidence(Evidence::Exited)
                    .with_exit_code(out.exit_code),
                (None, Some(Observed::Exit(ExecResult::Exited { exit_code, .. })), _) => {
                    e.with_evidence(Evidence::Exited).with_exit_code(*exit_code)
                }
                (None, _, Some(x)) => {
                    let e = e.with_evidence(x.evidence());
                    match x.exit_code() {
                        Some(c) => e.with_exit_code(c),
                        None => e,
                    }
                }
                _ => e.with_evidence(Evidence::DispatchUncertain),
            }
        } else if self.shown_dispatched && self.rec.state.is_before_dispatch() {
            // Not sent from here, but a due scan showed it possibly sent.
            e.with_evidence(Evidence::DispatchUncertain)
        } else if self.rec.state.is_before_dispatch() {
            e.with_evidence(Evidence::NotDispatched)
        } else {
            e.with_evidence(self.rec.evidence.to_error_evidence())
        }
    }

    /// The next op, given the last stored record and what this controller
    /// did. Called only with no store op outstanding.
    pub(super) fn step(
        &mut self,
        cfg: &ControllerConfig,
        leases: &Leases,
        now: Instant,
        now_ms: u64,
    ) -> Step {
        if self.inflight.is_some() {
            return Step::Wait;
        }
        self.lease_gen = if self.is_disposable() {
            self.worker_of(cfg)
                .and_then(|w| leases.live(&w, now, now_ms))
        } else {
            None
        };
        if self.fatal.is_some() || self.held_elsewhere {
            if self.worker_op.is_some() {
                // Keep the slot until the worker answers; nothing more is
                // written by this controller.
                return Step::Wait;
            }
            return self.finish();
        }
        if let Some(t) = self.retry_at {
            if now < t {
                return Step::Wait;
            }
            self.retry_at = None;
        }
        if self.need_fetch || (self.cancel_seen && self.rec.cancel_requested_at_ms.is_none()) {
            self.need_fetch = false;
            self.cancel_seen = false;
            self.next_kind = Kind::Fetch;
            return Step::Store(StoreOp::Fetch {
                key: self.rec.key.clone(),
            });
        }
        if self.is_disposable() && self.rec.assignment.is_some() && self.lease_gen.is_none() {
            // Every write on an assigned record is fenced by the worker
            // lease: wait for it (its own timer wakes this execution).
            return Step::Wait;
        }
        if self.worker_op.is_some() && self.files.kind.is_some() {
            // A transfer is out: renew while it runs.
            return self.renew_or_wait(cfg, now, now_ms);
        }
        if let Some(obs) = self.observed.clone()
            && !self.result_written
        {
            if let Some(patch) = self.result_patch(&obs, now_ms) {
                if patch.state == Some(ExecState::Collecting)
                    && !self.is_disposable()
                    && self.rec.spec.outputs.is_empty()
                {
                    // Nothing to collect and no machine to clean up (a
                    // retained machine's slot finish is a commit of its
                    // own): the result and `completed` are one commit.
                    // A caller's machine: acceptance with intent, then
                    // this; a retained slot: submission with intent, this,
                    // the slot finish (issues 12 and 16).
                    let done = self.completion_patch(now_ms);
                    return self.guarded_steps(cfg, now, now_ms, vec![patch, done]);
                }
                return self.guarded(cfg, now, now_ms, Kind::Result, patch);
            }
            self.result_written = true;
        }
        // Disposable: reservation, machine and cleanup steps; `ready`,
        // dispatching, running and cancelling go as on a named machine.
        if self.is_disposable()
            && let Some(step) = self.step_disposable(cfg, leases, now, now_ms)
        {
            return step;
        }
        let state = self.rec.state;
        if self.rec.spec.machine.is_some()
            && self.worker_op.is_none()
            && (state.is_terminal() || state == ExecState::Unknown)
        {
            // A retained machine's command: the controller finishes the
            // slot (and sets the cleanup) in one store transaction.
            return self.finish();
        }
        let cancel = self.rec.cancel_requested_at_ms.is_some();
        match state {
            ExecState::Accepted | ExecState::Preparing | ExecState::Ready if cancel => {
                let patch = self.cancelled_unsent(now_ms);
                self.guarded(cfg, now, now_ms, Kind::Write, patch)
            }
            ExecState::Accepted if self.past(Deadline::Queue, now, now_ms) => {
                let e = Error::expired(
                    Operation::Submit,
                    Evidence::NotDispatched,
                    Reason::QueueDeadline,
                );
                let patch = ExecPatch {
                    state: Some(ExecState::Expired),
                    cleanup: Some(self.end_cleanup()),
                    next_due_at_ms: Some(self.end_due(now_ms)),
                    last_error: Some(ErrorEntry::from_error(&e, now_ms)),
                    ..ExecPatch::default()
                };
                self.exec_error = Some(e);
                self.guarded(cfg, now, now_ms, Kind::Write, patch)
            }
            ExecState::Accepted => {
                let patch = ExecPatch {
                    state: Some(ExecState::Preparing),
                    ..ExecPatch::default()
                };
                self.guarded(cfg, now, now_ms, Kind::Write, patch)
            }
            ExecState::Preparing | ExecState::Ready => {
                let check = if self.past(Deadline::Preparation, now, now_ms) {
                    Err(Error::expired(
                        Operation::Submit,
                        Evidence::NotDispatched,
                        Reason::PreparationDeadline,
                    ))
                } else {
                    self.prepare()
                };
                // A caller's machine stages its inputs here; a disposable
                // one did so before `ready` (`prepare_machine`).
                let check = match check {
                    Ok(()) if state == ExecState::Preparing && self.staging_unowned(cfg) => {
                        // Resumed mid-preparation (sim finding 10): another
                        // controller wrote `preparing` and may have sent
                        // uploads whose outcome is unknown here; an upload
                        // is never resent (C6.1), so the preparation fails,
                        // nothing dispatched.
                        Err(Error::unknown(
                            Operation::Upload,
                            Evidence::DispatchUncertain,
                            Reason::StagingUncertain,
                        ))
                    }
                    Ok(()) if state == ExecState::Preparing => {
                        match self.stage_inputs(cfg, now, now_ms) {
                            Ok(Some(step)) => return step,
                            Ok(None) => Ok(()),
                            Err(e) => Err(e),
                        }
                    }
                    other => other,
                };
                match check {
                    Err(e) => {
                        let patch = ExecPatch {
                            state: Some(ExecState::Failed),
                            cleanup: Some(self.end_cleanup()),
                            next_due_at_ms: Some(self.end_due(now_ms)),
                            last_error: Some(ErrorEntry::from_error(&e, now_ms)),
                            ..ExecPatch::default()
                        };
                        self.exec_error = Some(e);
                        self.guarded(cfg, now, now_ms, Kind::Write, patch)
                    }
                    Ok(_) if state == ExecState::Preparing => {
                        let patch = ExecPatch {
                            state: Some(ExecState::Ready),
                            ..ExecPatch::default()
                        };
                        self.guarded(cfg, now, now_ms, Kind::Write, patch)
                    }
                    // C15: the claim is refreshed immediately before the
                    // intent is committed.
                    Ok(_) if !self.fresh_claim => self.claim_op(cfg, now_ms),
                    Ok(_) => {
                        let patch = ExecPatch {
                            state: Some(ExecState::Dispatching),
                            evidence: Some(RecordEvidence::DispatchUncertain),
                            ..ExecPatch::default()
                        };
                        self.write(cfg, now_ms, Kind::Intent, patch)
                    }
                }
            }
            ExecState::Dispatching | ExecState::Running | ExecState::Cancelling => {
                self.after_dispatch(cfg, now, now_ms)
            }
            ExecState::Unknown => {
                if self.worker_op.is_some() {
                    // A late exit still wins (unknown → collecting).
                    return self.renew_or_wait(cfg, now, now_ms);
                }
                if self.rec.next_due_at_ms.is_some() {
                    let patch = ExecPatch {
                        next_due_at_ms: Some(None),
                        ..ExecPatch::default()
                    };
                    return self.guarded(cfg, now, now_ms, Kind::Write, patch);
                }
                self.finish()
            }
            ExecState::Collecting => {
                if let Some(step) = self.collect_outputs(cfg, now, now_ms) {
                    return step;
                }
                let patch = self.completion_patch(now_ms);
                self.guarded(cfg, now, now_ms, Kind::Write, patch)
            }
            s if s.is_terminal() => {
                if self.rec.next_due_at_ms.is_some() || self.rec.cleanup != Cleanup::Complete {
                    let patch = ExecPatch {
                        cleanup: Some(self.end_cleanup()),
                        next_due_at_ms: Some(self.end_due(now_ms)),
                        ..ExecPatch::default()
                    };
                    return self.guarded(cfg, now, now_ms, Kind::Write, patch);
                }
                self.finish()
            }
            _ => self.finish(),
        }
    }

    /// `dispatching`, `running` or `cancelling`.
    fn after_dispatch(&mut self, cfg: &ControllerConfig, now: Instant, now_ms: u64) -> Step {
        if !self.intent_mine || (self.shown_dispatched && !self.attempted) {
            // Found possibly dispatched, not by this controller, no saved
            // exit: `unknown`, never re-sent (C17.1). Also when this
            // controller's intent committed after a due scan had shown
            // another intent (`shown_dispatched`): the store took the
            // intent only because it went back, so the other controller
            // may have sent the command.
            let patch = ExecPatch {
                state: Some(ExecState::Unknown),
                next_due_at_ms: Some(self.unknown_due(now_ms)),
                ..ExecPatch::default()
            };
            return self.guarded(cfg, now, now_ms, Kind::Write, patch);
        }
        if !self.attempted {
            if let Some(step) = self.before_send(cfg, now, now_ms) {
                return step;
            }
            let target = match (&self.rec.spec.worker_machine, &self.rec.assignment) {
                (Some(w), _) => Some((w.worker_id.clone(), w.name.clone())),
                (None, Some(a)) => Some((a.worker_id.clone(), a.machine_name.clone())),
                (None, None) => self.target.clone(),
            };
            let Some((worker_id, machine)) = target else {
                self.fatal = Some(Error::validation(Operation::Submit, Reason::NoMachine));
                return Step::Wait;
            };
            return match command_of(&self.rec.spec) {
                // Streamed only when asked for and the command can be:
                // stdin and background are buffered-only (C5.3), so such a
                // command goes out buffered and its caller gets the output
                // at the end.
                Ok(command)
                    if self.stream
                        && command.stdin_text().is_none()
                        && !command.is_background() =>
                {
                    Step::Worker(WorkerOp::ExecStream {
                        worker_id,
                        machine,
                        command,
                        key: self.rec.key.clone(),
                    })
                }
                Ok(command) => Step::Worker(WorkerOp::Exec {
                    worker_id,
                    machine,
                    command,
                }),
                Err(e) => {
                    // Checked before the intent; unreachable in practice.
                    // Nothing was sent: the outcome is stored as refused.
                    self.attempted = true;
                    self.exec_error = Some(e);
                    self.observed = Some(Observed::NotSent);
                    self.result_written = false;
                    self.step_after_local_refusal(cfg, now, now_ms)
                }
            };
        }
        if self.worker_op.is_none() {
            // Attempted and answered, but the outcome could not be stored
            // from this state: nothing more to do here.
            return self.finish();
        }
        if self.rec.state == ExecState::Cancelling {
            // The observation ends (C16): unknown unless an exit arrives.
            let patch = ExecPatch {
                state: Some(ExecState::Unknown),
                next_due_at_ms: Some(self.unknown_due(now_ms)),
                ..ExecPatch::default()
            };
            return self.guarded(cfg, now, now_ms, Kind::Write, patch);
        }
        if self.rec.cancel_requested_at_ms.is_some() {
            let patch = ExecPatch {
                state: Some(ExecState::Cancelling),
                ..ExecPatch::default()
            };
            return self.guarded(cfg, now, now_ms, Kind::Write, patch);
        }
        if self.past(Deadline::Execution, now, now_ms) {
            let e = Error::expired(
                Operation::Exec,
                Evidence::DispatchUncertain,
                Reason::ExecutionDeadline,
            );
            let patch = ExecPatch {
                state: Some(ExecState::Unknown),
                next_due_at_ms: Some(self.unknown_due(now_ms)),
                last_error: Some(ErrorEntry::from_error(&e, now_ms)),
                ..ExecPatch::default()
            };
            self.exec_error = Some(e);
            return self.guarded(cfg, now, now_ms, Kind::Write, patch);
        }
        self.renew_or_wait(cfg, now, now_ms)
    }

    fn step_after_local_refusal(
        &mut self,
        cfg: &ControllerConfig,
        now: Instant,
        now_ms: u64,
    ) -> Step {
        match self.observed.clone() {
            Some(obs) => match self.result_patch(&obs, now_ms) {
                Some(patch) => self.guarded(cfg, now, now_ms, Kind::Result, patch),
                None => self.finish(),
            },
            None => Step::Wait,
        }
    }

    /// While the command runs: renew the claim every third of the TTL.
    fn renew_or_wait(&mut self, cfg: &ControllerConfig, now: Instant, now_ms: u64) -> Step {
        if self.claim_ok_with(cfg, now, now_ms, false) {
            Step::Wait
        } else {
            self.claim_op(cfg, now_ms)
        }
    }

    /// Pre-dispatch checks from the **stored** spec (also the re-check of a
    /// resumed `ready` record, C17.1).
    fn prepare(&self) -> Result<(), Error> {
        if self.rec.spec.is_background() && self.rec.spec.machine.is_none() {
            // A launch leaves a process running: only on a retained machine
            // (C5.4, AC-5.4.2), never on a disposable or a caller's one.
            return Err(Error::unsupported_capability(
                Operation::Submit,
                Reason::Background,
            ));
        }
        if self.rec.spec.machine.is_some() && self.target.is_none() {
            return Err(Error::unsupported_capability(
                Operation::Submit,
                Reason::RetainedMachines,
            ));
        }
        command_of(&self.rec.spec)?.validate()
    }

    /// The write that stores an observed outcome, from the current state;
    /// `None` when nothing more can be stored.
    fn result_patch(&self, obs: &Observed, now_ms: u64) -> Option<ExecPatch> {
        let state = self.rec.state;
        let last_error = self
            .exec_error
            .as_ref()
            .map(|e| ErrorEntry::from_error(e, now_ms));
        match obs {
            // Due now: if this controller stops before `completed`,
            // recovery finishes the collection (C17.1), also after
            // `unknown` cleared the due time.
            Observed::Exit(result) if state.can_move_to(ExecState::Collecting) => Some(ExecPatch {
                state: Some(ExecState::Collecting),
                evidence: Some(RecordEvidence::Exited),
                result: Some(result.clone()),
                next_due_at_ms: Some(Some(now_ms)),
                last_error,
                ..ExecPatch::default()
            }),
            // C13.2: launched evidence, the launch result, collection
            // complete; a launch is terminal and collects nothing.
            Observed::Launched if state.can_move_to(ExecState::Launched) => Some(ExecPatch {
                state: Some(ExecState::Launched),
                evidence: Some(RecordEvidence::Launched),
                result: Some(ExecResult::Launched {
                    launched_at_ms: now_ms.max(self.rec.updated_at_ms),
                }),
                collection: Some(Collection::Complete),
                cleanup: Some(self.end_cleanup()),
                next_due_at_ms: Some(self.end_due(now_ms)),
                last_error,
                ..ExecPatch::default()
            }),
            Observed::NotSent if state.can_move_to(ExecState::Failed) => Some(ExecPatch {
                state: Some(ExecState::Failed),
                evidence: Some(RecordEvidence::NotDispatched),
                cleanup: Some(self.end_cleanup()),
                next_due_at_ms: Some(self.end_due(now_ms)),
                last_error,
                ..ExecPatch::default()
            }),
            Observed::NotSent | Observed::Uncertain if state.can_move_to(ExecState::Unknown) => {
                Some(ExecPatch {
                    state: Some(ExecState::Unknown),
                    next_due_at_ms: Some(self.unknown_due(now_ms)),
                    last_error,
                    ..ExecPatch::default()
                })
            }
            // Already `unknown` (cancel or deadline ended the observation):
            // the exec's error is kept as the last error.
            Observed::NotSent | Observed::Uncertain
                if state == ExecState::Unknown && last_error.is_some() =>
            {
                Some(ExecPatch {
                    last_error,
                    ..ExecPatch::default()
                })
            }
            _ => None,
        }
    }

    /// The answer to this execution's store op; returns the new record when
    /// its state or evidence changed (for telemetry).
    pub(super) fn on_stored(
        &mut self,
        now: Instant,
        now_ms: u64,
        cfg: &ControllerConfig,
        id: OpId,
        result: StoreResult,
    ) -> Option<ExecutionRecord> {
        let kind = match self.inflight {
            Some((op, kind)) if op == id => kind,
            _ => return None,
        };
        self.inflight = None;
        match result {
            Ok(StoreReply::Record(rec))
                if rec.key == self.rec.key
                    && (!self.rec.state.is_before_dispatch() || self.shown_dispatched)
                    && rec.state.is_before_dispatch() =>
            {
                // No transition leads back before dispatch: the store handed
                // back an older row (a whole-row rollback). What was seen
                // stands; nothing is dispatched from that read (C17.1).
                self.fatal = Some(Error::store(
                    Operation::StoreFetch,
                    self.rec.evidence.to_error_evidence(),
                    Reason::RecordWentBack,
                ));
                None
            }
            Ok(StoreReply::Record(rec)) if rec.key == self.rec.key => {
                self.failures = 0;
                self.renew_failures = 0;
                if kind == Kind::Fetch && std::mem::take(&mut self.foreign_wait) {
                    // Retry once the other claim has lapsed (at most one
                    // TTL), else after one poll interval.
                    let wait = match &rec.claim {
                        Some(c) if c.owner != cfg.owner && c.until_ms > now_ms => {
                            Duration::from_millis((c.until_ms - now_ms).min(cfg.lease_ttl_ms) + 1)
                        }
                        _ => cfg.poll(),
                    };
                    self.retry_at = Some(now + wait);
                }
                if kind != Kind::Fetch {
                    self.refetches = 0;
                }
                let changed = rec.state != self.rec.state || rec.evidence != self.rec.evidence;
                if kind == Kind::Write
                    && self.rec.state == ExecState::Accepted
                    && rec.state == ExecState::Preparing
                {
                    // Our own write moved it (a write applies only under
                    // our guard): the staging that follows is ours.
                    self.preparing_mine = true;
                }
                if kind == Kind::Write
                    && self.machine.reserved_here
                    && self.rec.state == ExecState::Accepted
                    && rec.state == ExecState::Preparing
                    && rec.creation.is_none()
                {
                    self.machine.create_intent_mine = true;
                }
                if matches!(kind, Kind::Write | Kind::Result)
                    && self.rec.state != ExecState::Unknown
                    && rec.state == ExecState::Unknown
                {
                    self.machine.marked_unknown = true;
                }
                if matches!(kind, Kind::Write | Kind::Result | Kind::Intent) {
                    // The machine answer this write acted on is recorded.
                    self.machine.reply = None;
                }
                // Every write (claims included) moves the version by one;
                // a record that moved further was written by another
                // controller in between, which may have sent the create
                // for the name this process reserved (a paused controller
                // coming back): the reservation is no longer only ours.
                let ours = if kind == Kind::Fetch {
                    self.rec.version
                } else {
                    self.rec.version.saturating_add(1)
                };
                if rec.version != ours {
                    self.machine.reserved_here = false;
                    // The same for a verification before a delete (sim
                    // finding 11): another writer may have verified and
                    // sent its own delete meanwhile, so this process's
                    // inspection (or its answer still held) no longer
                    // speaks for the machine; it inspects again.
                    self.machine.verified = false;
                    if matches!(self.machine.reply, Some((MKind::Verify, _))) {
                        self.machine.reply = None;
                    }
                }
                // Only the write's own outcome is this execution's intent:
                // `dispatching` at the next version, the same generation
                // and claim, this controller's (fuzz finding 11, session 9),
                // of the same record (fingerprint and spec, finding 19).
                // After the own intent and before the send, every reply
                // must descend from that intent (C15: the claim renewed
                // before the send; fuzz finding 16's rule for rows, finding
                // 20 for the execution's own reads).
                self.on_reply_after_intent(&rec, cfg);
                let own_intent =
                    kind == Kind::Intent && intent_outcome(&self.rec, &rec, &cfg.owner);
                self.rec = rec;
                // Deadlines set by this write get their monotonic bound now.
                let now_ms = self.rec.updated_at_ms;
                self.bound_deadlines(now, now_ms);
                self.fresh_claim = kind == Kind::Claim;
                match kind {
                    Kind::Claim => {
                        // Fresh from when it was asked (C15).
                        self.claim_at = Some(self.asked_at.unwrap_or(now));
                        if self.rec.state == ExecState::Accepted
                            && self.rec.assignment.is_some()
                            && self.rec.creation.is_none()
                        {
                            // Reserved, no create intent yet, and this
                            // claim fences every other writer: no create
                            // was ever sent for this name, so the intent
                            // this controller writes next is its own.
                            self.machine.reserved_here = true;
                        }
                    }
                    Kind::Intent if own_intent => self.intent_mine = true,
                    // Answered with another row: the intent may have
                    // committed (uncertain), but nothing read proves it is
                    // this controller's. Never sent from here: `unknown`
                    // once read dispatched, `record_went_back` if read
                    // before dispatch.
                    Kind::Intent => self.shown_dispatched = true,
                    Kind::Result => self.result_written = true,
                    Kind::Fetch | Kind::Write => {}
                }
                changed.then(|| self.rec.clone())
            }
            Ok(_) => {
                self.fatal = Some(Error::protocol(
                    Operation::StoreFetch,
                    Reason::UnexpectedReply,
                ));
                None
            }
            Err(e) => {
                self.on_store_error(now, cfg, kind, e);
                None
            }
        }
    }

    fn on_store_error(&mut self, now: Instant, cfg: &ControllerConfig, kind: Kind, e: Error) {
        self.fresh_claim = false;
        match e.category() {
            Category::StaleVersion => {
                self.refetches += 1;
                if self.refetches > MAX_REFETCHES {
                    self.fatal = Some(e);
                } else {
                    self.need_fetch = true;
                }
            }
            Category::StaleClaim if self.owes_outcome() => {
                // Another controller holds the record (e.g. it marked it
                // `unknown`) while this one still waits for, or holds, the
                // command's exit: an exit is never dropped. Fetch, wait for
                // that claim to lapse (within one TTL), claim, store it.
                self.foreign_wait = true;
                self.need_fetch = true;
            }
            Category::StaleClaim => {
                // Another controller holds the record (or took it after our
                // claim lapsed): leave it alone, never mark it.
                self.held_elsewhere = true;
                if self.dispatched || kind != Kind::Claim {
                    self.fatal = Some(e);
                }
            }
            Category::Validation if e.reason() == Reason::CancelRequested => {
                self.need_fetch = true;
            }
            Category::Validation if e.reason() == Reason::ClockBeforeUpdatedAt => {
                // Another writer committed with a later `updated_at` than
                // this op carries (its clock ahead, or its commit landing
                // between our read and this op): a stale view, not a
                // reason to stop renewing while the command runs (sim
                // finding 8, seed 1291). Re-read; the next op is stamped
                // at least at the stored `updated_at`. Bounded like
                // `stale_version`.
                self.refetches += 1;
                if self.refetches > MAX_REFETCHES {
                    self.fatal = Some(e);
                } else {
                    self.need_fetch = true;
                }
            }
            Category::Store | Category::Unknown | Category::Transport
                if kind == Kind::Claim && self.exec_outstanding() =>
            {
                // A renewal while the command runs: keep retrying, with a
                // bounded backoff (poll × 2ⁿ, at most a third of the TTL),
                // for as long as the exec is outstanding.
                self.renew_failures = self.renew_failures.saturating_add(1);
                let factor = 1u32 << self.renew_failures.min(6).saturating_sub(1);
                let wait = (cfg.poll() * factor).min(cfg.renew_every().max(cfg.poll()));
                self.retry_at = Some(now + wait);
            }
            Category::Store | Category::Unknown | Category::Transport => {
                self.failures += 1;
                if self.failures > MAX_STORE_RETRIES {
                    self.fatal = Some(e);
                } else {
                    self.retry_at = Some(now + cfg.poll());
                }
            }
            _ => self.fatal = Some(e),
        }
    }

    /// The exec (not a machine op) was sent and has not been answered.
    fn exec_outstanding(&self) -> bool {
        self.worker_op.is_some()
            && self.machine.kind.is_none()
            && self.files.kind.is_none()
            && self.dispatched
    }

    /// This controller waits for the command's exit, or holds one not yet
    /// stored in a record that can still take it.
    fn owes_outcome(&self) -> bool {
        self.exec_outstanding()
            || (matches!(self.observed, Some(Observed::Exit(_)))
                && !self.result_written
                && self.rec.state.can_move_to(ExecState::Collecting))
    }

    /// The worker's answer to the exec.
    pub(super) fn on_worker(&mut self, id: OpId, result: WorkerResult) {
        if self.worker_op != Some(id) {
            return;
        }
        self.worker_op = None;
        if let Some(k) = self.files.kind.take() {
            self.files.reply = Some((k, result));
            return;
        }
        if let Some(k) = self.machine.kind.take() {
            self.machine.reply = Some((k, result));
            return;
        }
        let obs = match result {
            Ok(WorkerReply::Exec(ExecOutcome::Exited(out))) => {
                let r = ExecResult::Exited {
                    exit_code: out.exit_code,
                    output_bytes: (out.stdout.len() + out.stderr.len()) as u64,
                    truncated: false,
                };
                self.output = Some(out);
                Observed::Exit(r)
            }
            // The output went to the caller as it came; only its size is
            // recorded, exactly like a buffered exit's.
            Ok(WorkerReply::Streamed {
                exit_code,
                output_bytes,
            }) => Observed::Exit(ExecResult::Exited {
                exit_code,
                output_bytes,
                truncated: false,
            }),
            Ok(WorkerReply::Exec(ExecOutcome::Launched(_))) if self.rec.spec.is_background() => {
                // The PID is evidence of the launch only (C5.4): never
                // stored, never used to signal or adopt.
                Observed::Launched
            }
            Ok(_) => {
                // A launch or machine reply to a foreground exec breaks the
                // contract: the outcome is unknown.
                self.exec_error = Some(Error::protocol(Operation::Exec, Reason::UnexpectedReply));
                Observed::Uncertain
            }
            Err(e) => {
                let obs = match (e.evidence(), e.exit_code()) {
                    (Evidence::Exited, Some(code)) => Observed::Exit(ExecResult::Exited {
                        exit_code: code,
                        output_bytes: 0,
                        truncated: true,
                    }),
                    (Evidence::NotDispatched, _) => Observed::NotSent,
                    _ => Observed::Uncertain,
                };
                self.exec_error = Some(e);
                obs
            }
        };
        self.observed = Some(obs);
        self.result_written = false;
    }
}

/// What a disposable execution reserves (C12.4): `{slots 1, cpus, memory +
/// overhead, storage + overlay}` of the profile defaults (C12.3: 1 CPU,
/// 256 + 256 MiB, 1 + 1 GiB), the machine the controller creates.
pub(super) const DISPOSABLE_RESERVATION: Resources = Resources {
    slots: 1,
    cpus: 1,
    memory_mb: 512,
    disk_gb: 2,
};

/// The machine name of a disposable execution: `sbx-` and 24 hex digits
/// of SHA-256 over the record key (deterministic, ≤31 bytes).
pub(super) fn machine_name_for(rec: &ExecutionRecord) -> String {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    h.update(rec.key.scope.as_bytes());
    h.update([0]);
    h.update(rec.key.id.as_bytes());
    let hex = crate::managed::fingerprint::hex(&h.finalize());
    format!("sbx-{}", &hex[..24])
}

/// The incarnation token stored as creation evidence: SHA-256 over the
/// identity fields of the observation (C3.5), in a fixed layout.
pub(super) fn incarnation_token(obs: &Observation) -> String {
    use sha2::Digest;
    let i = &obs.incarnation;
    let text = format!(
        "{}\0{}\0{}\0{}\0{}\0{}\0{}",
        i.name,
        i.created_at,
        i.cpus,
        i.memory_mb,
        i.storage_gb,
        i.overlay_gb,
        i.image.as_deref().unwrap_or("")
    );
    crate::managed::fingerprint::hex(&sha2::Sha256::digest(text.as_bytes()))
}
