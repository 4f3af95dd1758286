//! The short request flows of retained machines (C14, C17.3): submit into
//! the slot, reconcile, `stop_for_drain` and `resolve`, each a [`Req`]
//! driven by the controller until its answer. Split from `machines.rs` (a
//! child module: the parent's private items are visible here).

#[allow(clippy::wildcard_imports)] // the parent's vocabulary, one module
use super::*;

/// Where a request flow is.
#[derive(Debug)]
pub(in crate::managed::controller) enum Stage {
    /// Waiting for the first store answer (accept, request, fetch).
    Start,
    /// Claimed; inspecting before the drain stop.
    DrainVerify,
    DrainIntent,
    DrainStop,
    DrainConfirm,
    DrainWrite,
    /// Inspecting before the resolve.
    ResolveInspect,
    ResolveWrite,
    /// Claimed; inspecting for a reconcile.
    ReconcileClaim,
    ReconcileInspect,
    ReconcileWrite,
    /// Accepting a command into the slot.
    SubmitAccept,
    /// Inspecting the machine before a slot command's acceptance (the
    /// image-machine preflight, `preinspect.rs`).
    SubmitInspect,
    /// Inspecting the recorded incarnation before a read (logs,
    /// measurements).
    ReadVerify,
    /// Reading the console history.
    ReadLogs,
    /// A write was fenced (the machine was assigned under an older
    /// worker-lease generation): taking the worker lease.
    RefenceLease,
    /// Re-fencing the machine at the version read
    /// (`claim_machine_version`) before the write is made again.
    RefenceClaim,
    /// The write found this owner's claim ended (`claim_expired`: a
    /// settled terminal run of this process released it): re-taking it;
    /// the write is made again only if nobody claimed or wrote since.
    Reclaim,
}

/// Re-fencing rounds a flow makes before its write's `stale_claim` is
/// the answer (one is enough unless the lease moves again meanwhile).
const MAX_REFENCES: u32 = 2;

/// One caller request in flight (a short flow of store and worker ops).
#[derive(Debug)]
pub(in crate::managed::controller) struct Req {
    pub(super) id: RequestId,
    pub(super) request: MachineRequest,
    stage: Stage,
    machine: Option<MachineRecord>,
    snap: Option<Snap>,
    /// The command record to submit (built once the machine was read).
    pub(super) command: Option<ExecutionRecord>,
    /// The submission asked for the dispatch intent (`submit_dispatching`):
    /// only then can its reply show this controller's own intent.
    intent: bool,
    /// The last machine write sent, and the stage its answer goes to: made
    /// again after a re-fence.
    write: Option<(Stage, StoreOp)>,
    refences: u32,
    reclaims: u32,
    /// A create this configuration refuses, with its spec's fingerprint:
    /// the store's answer for the key resolves it (AC-12.5.2).
    pub(super) refused: Option<(String, Error)>,
    /// A slot command this configuration refuses (it drives no machines):
    /// once the machine is read, the command's key is read instead of
    /// submitted, and the stored command answers (AC-12.5.2).
    pub(super) unstored: Option<Error>,
    /// The image-machine preflight a slot command waits for
    /// ([`Stage::SubmitInspect`]).
    check: Option<crate::worker::ImageCheck>,
    /// When the outstanding store op was handed out (monotonic): a claim
    /// a submission takes counts from then (C15).
    pub(super) asked_at: Option<Instant>,
}

/// What a request flow wants next.
#[derive(Debug)]
pub(in crate::managed::controller) enum RStep {
    Store(StoreOp),
    Worker(WorkerOp),
    /// A submit read its machine: the controller builds the command.
    NeedCommand(Box<MachineRecord>),
    /// The machine passed the image-machine preflight: the controller
    /// builds the command again (at the current time) and submits it.
    Inspected(Box<MachineRecord>),
    Done(Result<MachineAnswer, Error>),
}

impl Req {
    pub(in crate::managed::controller) fn new(id: RequestId, request: MachineRequest) -> Self {
        Self {
            id,
            request,
            stage: Stage::Start,
            machine: None,
            snap: None,
            command: None,
            intent: false,
            write: None,
            refences: 0,
            reclaims: 0,
            refused: None,
            unstored: None,
            check: None,
            asked_at: None,
        }
    }

    /// The submission asked for the dispatch intent (see [`Self::submit_op`]).
    pub(in crate::managed::controller) fn asked_intent(&self) -> bool {
        self.intent
    }

    pub(in crate::managed::controller) fn key(&self) -> &RecordKey {
        match &self.request {
            MachineRequest::Create { key, .. }
            | MachineRequest::Lifecycle { key, .. }
            | MachineRequest::Reconcile { key }
            | MachineRequest::StopForDrain { key, .. }
            | MachineRequest::Logs { key, .. }
            | MachineRequest::Measurements { key }
            | MachineRequest::Resolve { key, .. } => key,
            MachineRequest::Submit { machine, .. } => machine,
        }
    }

    /// The worker op of an inspect of the flow's machine.
    pub(in crate::managed::controller) fn inspect(
        &self,
        cfg: &ControllerConfig,
    ) -> Result<WorkerOp, Error> {
        let m = self
            .machine
            .as_ref()
            .ok_or(Error::protocol(Operation::Resolve, Reason::NoMachine))?;
        let a = m.assignment.as_ref().ok_or(Error::identity_conflict(
            Operation::Resolve,
            Evidence::NotDispatched,
            Reason::NotAssigned,
        ))?;
        let profile = cfg
            .profile_of(&a.worker_id)
            .ok_or(Error::unsupported_capability(
                Operation::Resolve,
                Reason::UnknownWorker,
            ))?;
        Ok(WorkerOp::Inspect {
            worker_id: a.worker_id.clone(),
            profile,
            name: MachineName::new(&a.machine_name)?,
        })
    }

    pub(in crate::managed::controller) fn claim(
        &self,
        cfg: &ControllerConfig,
        now_ms: u64,
        m: &MachineRecord,
    ) -> StoreOp {
        StoreOp::ClaimMachine {
            key: m.key.clone(),
            owner: cfg.owner.clone(),
            now_ms: now_ms.max(m.updated_at_ms),
            ttl_ms: cfg.lease_ttl_ms,
        }
    }

    pub(in crate::managed::controller) fn write(
        cfg: &ControllerConfig,
        now_ms: u64,
        m: &MachineRecord,
        p: MachinePatch,
    ) -> StoreOp {
        StoreOp::WriteMachine {
            key: m.key.clone(),
            guard: Guard::for_machine(m, &cfg.owner),
            patch: p,
            now_ms: now_ms.max(m.updated_at_ms),
        }
    }

    pub(in crate::managed::controller) fn answer(m: MachineRecord) -> RStep {
        RStep::Done(Ok(MachineAnswer::Machine {
            record: Box::new(m),
            existing: false,
        }))
    }

    /// The answer to the flow's store op.
    pub(in crate::managed::controller) fn on_stored(
        &mut self,
        cfg: &ControllerConfig,
        now_ms: u64,
        result: StoreResult,
    ) -> RStep {
        if let Some((fingerprint, refusal)) = self.refused.take() {
            if let (MachineRequest::Submit { key, .. }, Some(m)) = (&self.request, &self.machine) {
                return RStep::Done(crate::managed::controller::resolve::stored_command(
                    key,
                    &fingerprint,
                    refusal,
                    result,
                    m,
                ));
            }
            let key = self.key().clone();
            return RStep::Done(
                crate::managed::controller::resolve::stored_machine(
                    &key,
                    &fingerprint,
                    refusal,
                    result,
                )
                .map(|record| MachineAnswer::Machine {
                    record: Box::new(record),
                    existing: true,
                }),
            );
        }
        let step = self.stored(cfg, now_ms, result);
        self.track(step)
    }

    /// Remembers a machine write (and the stage awaiting it) so that a
    /// fenced answer can be followed by a re-fence and the same write.
    fn track(&mut self, step: RStep) -> RStep {
        if let RStep::Store(op @ StoreOp::WriteMachine { .. }) = &step {
            let stage = match self.stage {
                Stage::DrainIntent => Stage::DrainIntent,
                Stage::DrainWrite => Stage::DrainWrite,
                Stage::ReconcileWrite => Stage::ReconcileWrite,
                _ => return step,
            };
            self.write = Some((stage, op.clone()));
        }
        step
    }

    /// A machine write of `stop_for_drain` or `reconcile` answered
    /// `stale_claim` because the machine was assigned under a worker-lease
    /// generation that is no longer its worker's (C15): as the machine
    /// task does, the flow takes the worker lease, re-fences the machine
    /// at the version it read (`claim_machine_version`) and makes the same
    /// write again. `None` when the error is the answer.
    fn refence(&mut self, cfg: &ControllerConfig, now_ms: u64, e: &Error) -> Option<RStep> {
        let fenced = e.category() == Category::StaleClaim
            && matches!(e.reason(), Reason::WorkerGeneration | Reason::WorkerLease);
        let waiting = matches!(
            self.stage,
            Stage::DrainIntent | Stage::DrainWrite | Stage::ReconcileWrite | Stage::RefenceClaim
        );
        if !fenced || !waiting || self.write.is_none() || self.refences >= MAX_REFENCES {
            return None;
        }
        let a = self.machine.as_ref()?.assignment.as_ref()?;
        self.refences += 1;
        self.stage = Stage::RefenceLease;
        Some(RStep::Store(StoreOp::ClaimWorker {
            worker_id: a.worker_id.clone(),
            owner: cfg.owner.clone(),
            now_ms,
            ttl_ms: cfg.lease_ttl_ms,
        }))
    }

    /// A machine write of `stop_for_drain` or `reconcile` answered
    /// `stale_claim` / `claim_expired`: the claim is still this owner's at
    /// the generation the write names (another claim would have moved it),
    /// but ended — a settled terminal run of this process releases the
    /// machine claim it holds under the same owner (issue 13, "same owner,
    /// one window"). The flow re-takes the claim (once) and makes the same
    /// write if the claim comes back at that generation and version.
    /// `None` when the error is the answer.
    fn reclaim(&mut self, cfg: &ControllerConfig, now_ms: u64, e: &Error) -> Option<RStep> {
        let expired = e.category() == Category::StaleClaim && e.reason() == Reason::ClaimExpired;
        let waiting = matches!(
            self.stage,
            Stage::DrainIntent | Stage::DrainWrite | Stage::ReconcileWrite
        );
        if !expired || !waiting || self.write.is_none() || self.reclaims >= 1 {
            return None;
        }
        let op = self.claim(cfg, now_ms, self.machine.as_ref()?);
        self.reclaims += 1;
        self.stage = Stage::Reclaim;
        Some(RStep::Store(op))
    }

    #[allow(clippy::too_many_lines)]
    fn stored(&mut self, cfg: &ControllerConfig, now_ms: u64, result: StoreResult) -> RStep {
        let reply = match result {
            Ok(r) => r,
            Err(e) => {
                if let Some(step) = self.reclaim(cfg, now_ms, &e) {
                    return step;
                }
                if let Some(step) = self.refence(cfg, now_ms, &e) {
                    return step;
                }
                // After the drain's stop was sent (a re-fence of the drain's
                // write included), a store refusal does not mean nothing
                // reached the worker.
                let stop_sent = matches!(
                    self.stage,
                    Stage::DrainStop | Stage::DrainConfirm | Stage::DrainWrite
                ) || (matches!(
                    self.stage,
                    Stage::RefenceLease | Stage::RefenceClaim | Stage::Reclaim
                ) && matches!(self.write, Some((Stage::DrainWrite, _))));
                if stop_sent && matches!(e.evidence(), Evidence::NotDispatched | Evidence::Unknown)
                {
                    return RStep::Done(Err(e.with_evidence(Evidence::DispatchUncertain)));
                }
                return RStep::Done(Err(e));
            }
        };
        match (&self.stage, reply) {
            (Stage::RefenceLease, StoreReply::Lease(l)) => {
                let Some(m) = self.machine.as_ref().filter(|_| l.owner == cfg.owner) else {
                    // The drain's stop may already have reached the worker.
                    let evidence = if matches!(self.write, Some((Stage::DrainWrite, _))) {
                        Evidence::DispatchUncertain
                    } else {
                        Evidence::NotDispatched
                    };
                    return RStep::Done(Err(Error::stale_claim(
                        Operation::StoreClaim,
                        evidence,
                        Reason::WorkerLease,
                    )));
                };
                // Decided from the machine as read: the claim applies only
                // at that version (claims do not move it), so what the flow
                // inspected still describes the record it writes.
                let op = StoreOp::ClaimMachineVersion {
                    key: m.key.clone(),
                    owner: cfg.owner.clone(),
                    version: m.version,
                    now_ms: now_ms.max(m.updated_at_ms),
                    ttl_ms: cfg.lease_ttl_ms,
                };
                self.stage = Stage::RefenceClaim;
                RStep::Store(op)
            }
            (Stage::RefenceClaim, StoreReply::Machine(m)) => {
                let Some((stage, StoreOp::WriteMachine { patch, .. })) = self.write.take() else {
                    return RStep::Done(Err(Error::protocol(Operation::StoreWrite, Reason::Stage)));
                };
                let op = Self::write(cfg, now_ms, &m, patch);
                self.machine = Some(m);
                self.stage = stage;
                RStep::Store(op)
            }
            (Stage::Reclaim, StoreReply::Machine(m)) => {
                let Some((stage, StoreOp::WriteMachine { guard, patch, .. })) = self.write.take()
                else {
                    return RStep::Done(Err(Error::protocol(Operation::StoreWrite, Reason::Stage)));
                };
                if m.generation != guard.generation || m.version != guard.version {
                    // Someone claimed or wrote since the flow read the
                    // machine: what it inspected no longer speaks for it.
                    let evidence = if matches!(stage, Stage::DrainWrite) {
                        Evidence::DispatchUncertain
                    } else {
                        Evidence::NotDispatched
                    };
                    return RStep::Done(Err(Error::stale_claim(
                        Operation::StoreWrite,
                        evidence,
                        Reason::ClaimOwner,
                    )));
                }
                let op = Self::write(cfg, now_ms, &m, patch);
                self.machine = Some(m);
                self.stage = stage;
                RStep::Store(op)
            }
            (Stage::Start, StoreReply::MachineAccepted { record, existing }) => {
                RStep::Done(Ok(MachineAnswer::Machine {
                    record: Box::new(record),
                    existing,
                }))
            }
            (Stage::Start, StoreReply::Machine(m)) => {
                let request = self.request.clone();
                match request {
                    MachineRequest::Lifecycle { .. } => Self::answer(m),
                    MachineRequest::Submit { .. } => {
                        self.machine = Some(m.clone());
                        RStep::NeedCommand(Box::new(m))
                    }
                    MachineRequest::StopForDrain { version, .. } => {
                        if m.version != version {
                            return RStep::Done(Err(Error::stale_version(
                                Operation::Stop,
                                Evidence::NotDispatched,
                                Reason::VersionMismatch,
                            )));
                        }
                        if m.creation.is_none() {
                            return RStep::Done(Err(Error::validation(
                                Operation::Stop,
                                Reason::NoCreationEvidence,
                            )));
                        }
                        let op = self.claim(cfg, now_ms, &m);
                        self.machine = Some(m);
                        self.stage = Stage::DrainVerify;
                        RStep::Store(op)
                    }
                    MachineRequest::Resolve {
                        version,
                        disposition,
                        ..
                    } => {
                        if m.version != version {
                            return RStep::Done(Err(Error::stale_version(
                                Operation::Resolve,
                                Evidence::NotDispatched,
                                Reason::VersionMismatch,
                            )));
                        }
                        self.machine = Some(m.clone());
                        if m.assignment.is_none() {
                            // Never assigned: nothing exists on a worker.
                            if disposition == Resolution::Stopped {
                                return RStep::Done(Err(Error::identity_conflict(
                                    Operation::Resolve,
                                    Evidence::NotDispatched,
                                    Reason::NotAssigned,
                                )));
                            }
                            self.stage = Stage::ResolveWrite;
                            return RStep::Store(self.resolve_op(now_ms, Disposition::Deleted));
                        }
                        self.stage = Stage::ResolveInspect;
                        match self.inspect(cfg) {
                            Ok(op) => RStep::Worker(op),
                            Err(e) => RStep::Done(Err(e)),
                        }
                    }
                    MachineRequest::Reconcile { .. } => {
                        if m.assignment.is_none() || m.state == MachineRecordState::Deleted {
                            return Self::answer(m);
                        }
                        let op = self.claim(cfg, now_ms, &m);
                        self.machine = Some(m);
                        self.stage = Stage::ReconcileClaim;
                        RStep::Store(op)
                    }
                    MachineRequest::Logs { .. } | MachineRequest::Measurements { .. } => {
                        let op = if matches!(self.request, MachineRequest::Logs { .. }) {
                            Operation::Logs
                        } else {
                            Operation::Get
                        };
                        if m.state == MachineRecordState::Deleted {
                            return RStep::Done(Err(Error::not_found(
                                op,
                                Evidence::NotDispatched,
                                Reason::MachineDeleted,
                            )));
                        }
                        if m.creation.is_none() {
                            return RStep::Done(Err(Error::validation(
                                op,
                                Reason::NoCreationEvidence,
                            )));
                        }
                        self.machine = Some(m);
                        self.stage = Stage::ReadVerify;
                        match self.inspect(cfg) {
                            Ok(op) => RStep::Worker(op),
                            Err(e) => RStep::Done(Err(e)),
                        }
                    }
                    MachineRequest::Create { .. } => RStep::Done(Err(Error::protocol(
                        Operation::Create,
                        Reason::UnexpectedReply,
                    ))),
                }
            }
            (Stage::DrainVerify | Stage::ReconcileClaim, StoreReply::Machine(m)) => {
                self.snap = Some(Snap::of(&m));
                self.machine = Some(m);
                self.stage = if matches!(self.stage, Stage::DrainVerify) {
                    Stage::DrainVerify
                } else {
                    Stage::ReconcileInspect
                };
                match self.inspect(cfg) {
                    Ok(op) => RStep::Worker(op),
                    Err(e) => RStep::Done(Err(e)),
                }
            }
            (Stage::DrainIntent, StoreReply::Machine(m)) => {
                let Some(a) = m.assignment.clone() else {
                    return RStep::Done(Err(Error::identity_conflict(
                        Operation::Stop,
                        Evidence::NotDispatched,
                        Reason::NotAssigned,
                    )));
                };
                let profile = cfg.profile_of(&a.worker_id);
                let (Some(profile), Ok(name)) = (profile, MachineName::new(&a.machine_name)) else {
                    return RStep::Done(Err(Error::protocol(
                        Operation::Stop,
                        Reason::UnknownWorker,
                    )));
                };
                self.machine = Some(m);
                self.stage = Stage::DrainStop;
                RStep::Worker(WorkerOp::Stop {
                    worker_id: a.worker_id,
                    profile,
                    name,
                })
            }
            (Stage::DrainWrite | Stage::ReconcileWrite, StoreReply::Machine(m)) => Self::answer(m),
            (Stage::ResolveWrite, StoreReply::Resolved { machine, command }) => {
                RStep::Done(Ok(MachineAnswer::Resolved {
                    machine: Box::new(machine),
                    command: command.map(Box::new),
                }))
            }
            // The reply of a submission is about the command it submitted:
            // another record's is a lie (refused, never driven from here).
            (
                Stage::SubmitAccept,
                StoreReply::Submitted {
                    execution,
                    machine,
                    existing,
                },
            ) if self
                .command
                .as_ref()
                .is_some_and(|c| c.key == execution.key) =>
            {
                RStep::Done(Ok(MachineAnswer::Submitted {
                    execution: Box::new(execution),
                    machine: machine.map(Box::new),
                    existing,
                }))
            }
            _ => RStep::Done(Err(Error::protocol(
                Operation::StoreFetch,
                Reason::UnexpectedReply,
            ))),
        }
    }

    pub(in crate::managed::controller) fn resolve_op(
        &self,
        now_ms: u64,
        disposition: Disposition,
    ) -> StoreOp {
        let (version, updated) = self
            .machine
            .as_ref()
            .map_or((0, 0), |m| (m.version, m.updated_at_ms));
        StoreOp::ResolveMachine {
            key: self.key().clone(),
            version,
            quiesced: true,
            disposition,
            now_ms: now_ms.max(updated),
        }
    }

    /// Submitting: the command record is ready; `intent` commits its
    /// dispatch intent in the same transaction (the record carries its
    /// claim).
    pub(in crate::managed::controller) fn submit_op(
        &mut self,
        record: ExecutionRecord,
        max_pending: u32,
        intent: bool,
    ) -> StoreOp {
        self.stage = Stage::SubmitAccept;
        self.intent = intent;
        let record = Box::new(record);
        if intent {
            StoreOp::SubmitDispatching {
                record,
                max_pending,
            }
        } else {
            StoreOp::SubmitCommand {
                record,
                max_pending,
            }
        }
    }

    /// The answer to the flow's worker op.
    pub(in crate::managed::controller) fn on_worker(
        &mut self,
        cfg: &ControllerConfig,
        now_ms: u64,
        result: WorkerResult,
    ) -> RStep {
        if matches!(self.stage, Stage::SubmitInspect) {
            return self.inspected(result);
        }
        let step = self.worker_answer(cfg, now_ms, result);
        self.track(step)
    }

    /// Waits for the image-machine preflight `check` before the command is
    /// accepted.
    pub(in crate::managed::controller) fn inspect_first(
        &mut self,
        check: crate::worker::ImageCheck,
    ) {
        self.stage = Stage::SubmitInspect;
        self.check = Some(check);
    }

    /// The preflight's inspect answered: core's verdict
    /// ([`crate::worker::ImageCheck::admit`]) admits the command or ends
    /// the request unaccepted (evidence `not_dispatched`).
    fn inspected(&mut self, result: WorkerResult) -> RStep {
        let (Some(check), Some(m)) = (self.check.take(), self.machine.clone()) else {
            return RStep::Done(Err(Error::protocol(Operation::Submit, Reason::Stage)));
        };
        let observed = result.and_then(|r| match r {
            WorkerReply::Machine(obs) => Ok(*obs),
            _ => Err(Error::protocol(Operation::Get, Reason::UnexpectedReply)),
        });
        match check.admit(observed) {
            Ok(()) => RStep::Inspected(Box::new(m)),
            Err(e) => RStep::Done(Err(e.with_evidence(Evidence::NotDispatched))),
        }
    }

    #[allow(clippy::too_many_lines)]
    fn worker_answer(
        &mut self,
        cfg: &ControllerConfig,
        now_ms: u64,
        result: WorkerResult,
    ) -> RStep {
        let Some(m) = self.machine.clone() else {
            return RStep::Done(Err(Error::protocol(Operation::Get, Reason::NoMachine)));
        };
        let recorded = m.creation.as_ref().map(|c| c.incarnation.clone());
        match &self.stage {
            Stage::ResolveInspect => {
                let MachineRequest::Resolve { disposition, .. } = self.request else {
                    return RStep::Done(Err(Error::protocol(Operation::Resolve, Reason::Stage)));
                };
                let d = match (disposition, result) {
                    (Resolution::Stopped, Ok(WorkerReply::Machine(obs))) => {
                        let inc = incarnation_token(&obs);
                        if recorded.as_deref() != Some(inc.as_str()) {
                            return RStep::Done(Err(Error::identity_conflict(
                                Operation::Resolve,
                                Evidence::NotDispatched,
                                Reason::IncarnationMismatch,
                            )));
                        }
                        if obs.state == MachineState::Running {
                            return RStep::Done(Err(Error::identity_conflict(
                                Operation::Resolve,
                                Evidence::NotDispatched,
                                Reason::Running,
                            )));
                        }
                        Disposition::Stopped {
                            observed: record_state(obs.state),
                            incarnation: inc,
                        }
                    }
                    (Resolution::Stopped, Err(e)) if e.category() == Category::NotFound => {
                        return RStep::Done(Err(Error::identity_conflict(
                            Operation::Resolve,
                            Evidence::NotDispatched,
                            Reason::Absent,
                        )));
                    }
                    (Resolution::Deleted, Err(e)) if e.category() == Category::NotFound => {
                        Disposition::Deleted
                    }
                    (Resolution::Deleted, Ok(WorkerReply::Machine(_))) => {
                        return RStep::Done(Err(Error::identity_conflict(
                            Operation::Resolve,
                            Evidence::NotDispatched,
                            Reason::Present,
                        )));
                    }
                    // A worker outage changes nothing (AC-17.3.3).
                    (_, Err(e)) => return RStep::Done(Err(e)),
                    (_, Ok(_)) => {
                        return RStep::Done(Err(Error::protocol(
                            Operation::Resolve,
                            Reason::UnexpectedReply,
                        )));
                    }
                };
                self.stage = Stage::ResolveWrite;
                RStep::Store(self.resolve_op(now_ms, d))
            }
            Stage::ReadVerify => match result {
                // Only the recorded incarnation's numbers or console: a
                // machine under the same name that is not ours is refused.
                Ok(WorkerReply::Machine(obs))
                    if recorded.as_deref() == Some(incarnation_token(&obs).as_str()) =>
                {
                    match &self.request {
                        MachineRequest::Measurements { .. } => {
                            RStep::Done(Ok(MachineAnswer::Measurements {
                                measurements: obs.measurements,
                                record: Box::new(m),
                            }))
                        }
                        MachineRequest::Logs { params, .. } => {
                            let params = *params;
                            let WorkerOp::Inspect {
                                worker_id,
                                profile,
                                name,
                            } = (match self.inspect(cfg) {
                                Ok(op) => op,
                                Err(e) => return RStep::Done(Err(e)),
                            })
                            else {
                                return RStep::Done(Err(Error::protocol(
                                    Operation::Logs,
                                    Reason::Stage,
                                )));
                            };
                            self.stage = Stage::ReadLogs;
                            RStep::Worker(WorkerOp::Logs {
                                worker_id,
                                profile,
                                name,
                                params,
                            })
                        }
                        _ => RStep::Done(Err(Error::protocol(Operation::Get, Reason::Stage))),
                    }
                }
                Ok(WorkerReply::Machine(_)) => RStep::Done(Err(Error::identity_conflict(
                    Operation::Get,
                    Evidence::NotDispatched,
                    Reason::IncarnationMismatch,
                ))),
                Ok(_) => RStep::Done(Err(Error::protocol(
                    Operation::Get,
                    Reason::UnexpectedReply,
                ))),
                Err(e) => RStep::Done(Err(e)),
            },
            Stage::ReadLogs => match result {
                Ok(WorkerReply::Logs(lines)) => RStep::Done(Ok(MachineAnswer::Logs { lines })),
                Ok(_) => RStep::Done(Err(Error::protocol(
                    Operation::Logs,
                    Reason::UnexpectedReply,
                ))),
                Err(e) => RStep::Done(Err(e)),
            },
            Stage::DrainVerify => match result {
                Ok(WorkerReply::Machine(obs))
                    if recorded.as_deref() == Some(incarnation_token(&obs).as_str()) =>
                {
                    // Ownership verified: the stop intent is durable first
                    // (the slot keeps its command, so the intent is the
                    // record's latest error entry, not an operation).
                    let e =
                        Error::unknown(Operation::Stop, Evidence::Unknown, Reason::DrainStopIntent);
                    let p = MachinePatch {
                        last_error: Some(ErrorEntry::from_error(&e, now_ms)),
                        ..MachinePatch::default()
                    };
                    self.stage = Stage::DrainIntent;
                    RStep::Store(Self::write(cfg, now_ms, &m, p))
                }
                Ok(WorkerReply::Machine(_)) => RStep::Done(Err(Error::identity_conflict(
                    Operation::Stop,
                    Evidence::NotDispatched,
                    Reason::IncarnationMismatch,
                ))),
                Ok(_) => RStep::Done(Err(Error::protocol(
                    Operation::Get,
                    Reason::UnexpectedReply,
                ))),
                Err(e) => RStep::Done(Err(e)),
            },
            Stage::DrainStop => match result {
                Ok(_) => {
                    self.stage = Stage::DrainConfirm;
                    match self.inspect(cfg) {
                        Ok(op) => RStep::Worker(op),
                        Err(e) => RStep::Done(Err(e)),
                    }
                }
                Err(e) => RStep::Done(Err(e)),
            },
            Stage::DrainConfirm => match result {
                Ok(WorkerReply::Machine(obs))
                    if obs.state == MachineState::Stopped
                        && recorded.as_deref() == Some(incarnation_token(&obs).as_str()) =>
                {
                    let stopped = RecordedObservation {
                        state: MachineRecordState::Stopped,
                        incarnation: incarnation_token(&obs),
                        at_ms: now_ms.max(m.updated_at_ms),
                    };
                    let free = m.active_execution.is_none()
                        && m.operation == MachineOperation::None
                        && m.state.can_move_to(MachineRecordState::Stopped);
                    let p = MachinePatch {
                        state: free.then_some(MachineRecordState::Stopped),
                        observation: Some(stopped),
                        ..MachinePatch::default()
                    };
                    self.stage = Stage::DrainWrite;
                    RStep::Store(Self::write(cfg, now_ms, &m, p))
                }
                Ok(WorkerReply::Machine(_)) => RStep::Done(Err(Error::identity_conflict(
                    Operation::Stop,
                    Evidence::NotDispatched,
                    Reason::NotStopped,
                ))),
                Ok(_) => RStep::Done(Err(Error::protocol(
                    Operation::Get,
                    Reason::UnexpectedReply,
                ))),
                Err(e) => RStep::Done(Err(e)),
            },
            Stage::ReconcileInspect => {
                // C14.2: the write carries the guard of the version read
                // when the observation began; any change since is refused
                // by the store (stale_version) and nothing is written.
                let p = match result {
                    Ok(WorkerReply::Machine(obs)) => {
                        let inc = incarnation_token(&obs);
                        if recorded.as_deref() == Some(inc.as_str()) {
                            let to = record_state(obs.state);
                            let idle = m.operation == MachineOperation::None
                                && m.active_execution.is_none();
                            MachinePatch {
                                state: (idle && (m.state == to || m.state.can_move_to(to)))
                                    .then_some(to),
                                observation: Some(RecordedObservation {
                                    state: to,
                                    incarnation: inc,
                                    at_ms: now_ms.max(m.updated_at_ms),
                                }),
                                ..MachinePatch::default()
                            }
                        } else {
                            let e = Error::identity_conflict(
                                Operation::Get,
                                Evidence::NotDispatched,
                                Reason::IncarnationMismatch,
                            );
                            MachinePatch {
                                state: m
                                    .state
                                    .can_move_to(MachineRecordState::Conflict)
                                    .then_some(MachineRecordState::Conflict),
                                last_error: Some(ErrorEntry::from_error(&e, now_ms)),
                                ..MachinePatch::default()
                            }
                        }
                    }
                    Err(e) if e.category() == Category::NotFound && m.creation.is_some() => {
                        let idle =
                            m.operation == MachineOperation::None && m.active_execution.is_none();
                        MachinePatch {
                            state: (idle && m.state.can_move_to(MachineRecordState::Missing))
                                .then_some(MachineRecordState::Missing),
                            last_error: Some(ErrorEntry::from_error(&e, now_ms)),
                            ..MachinePatch::default()
                        }
                    }
                    Err(e) => return RStep::Done(Err(e)),
                    Ok(_) => {
                        return RStep::Done(Err(Error::protocol(
                            Operation::Get,
                            Reason::UnexpectedReply,
                        )));
                    }
                };
                self.stage = Stage::ReconcileWrite;
                RStep::Store(Self::write(cfg, now_ms, &m, p))
            }
            _ => RStep::Done(Err(Error::protocol(
                Operation::Get,
                Reason::UnexpectedReply,
            ))),
        }
    }

    /// The flow's first store op (`None` for a create: the controller
    /// builds the record).
    pub(in crate::managed::controller) fn initial_op(&self, now_ms: u64) -> Option<StoreOp> {
        match &self.request {
            MachineRequest::Create { .. } => None,
            MachineRequest::Lifecycle {
                key,
                action,
                version,
            } => Some(StoreOp::RequestMachine {
                key: key.clone(),
                action: *action,
                version: *version,
                now_ms,
            }),
            MachineRequest::Submit { machine, .. } => Some(StoreOp::FetchMachine {
                key: machine.clone(),
            }),
            MachineRequest::Reconcile { key }
            | MachineRequest::StopForDrain { key, .. }
            | MachineRequest::Logs { key, .. }
            | MachineRequest::Measurements { key }
            | MachineRequest::Resolve { key, .. } => {
                Some(StoreOp::FetchMachine { key: key.clone() })
            }
        }
    }
}
