//! The disposable machine of an execution (C12.4, C17.2): create →
//! creation evidence → start → `ready`, then stop/verify/delete → recorded
//! absence. Split from `exec.rs`; the same `Exec`, its private state is
//! visible here (a child module).

#[allow(clippy::wildcard_imports)] // the parent's vocabulary, one module
use super::*;

impl Exec {
    /// Cleanup when a disposable record ends: `in_progress` until absence
    /// is recorded (C13.2), `complete` for records with no machine.
    pub(super) fn end_cleanup(&self) -> Cleanup {
        if self.rec.spec.machine.is_some() {
            // Set with the slot's release (C14.3).
            return Cleanup::Pending;
        }
        if self.rec.assignment.is_some() && self.rec.absence_at_ms.is_none() {
            Cleanup::InProgress
        } else {
            Cleanup::Complete
        }
    }

    /// Next due time when a record ends: due now while its machine or its
    /// reservation still needs work (recovery continues it), else none.
    pub(super) fn end_due(&self, now_ms: u64) -> Option<u64> {
        if self.rec.spec.machine.is_some() {
            // Due until the slot is finished (recovery finishes it).
            return Some(now_ms);
        }
        let owed = self.rec.assignment.is_some()
            && (self.rec.absence_at_ms.is_none() || self.rec.reservation.is_some());
        owed.then_some(now_ms)
    }

    /// Next due time when a record becomes `unknown`: none, except for a
    /// retained machine's command, due until its slot is finished.
    pub(super) fn unknown_due(&self, now_ms: u64) -> Option<u64> {
        self.rec.spec.machine.is_some().then_some(now_ms)
    }

    pub(super) fn machine_op(&mut self, kind: MKind, op: WorkerOp) -> Step {
        self.pending_kind = Some(kind);
        Step::Worker(op)
    }

    /// The steps of a disposable execution that differ from a run on a
    /// named machine (C12.4, C17.2); `None` hands over to the common steps
    /// (`ready` → intent → exec → result).
    pub(super) fn step_disposable(
        &mut self,
        cfg: &ControllerConfig,
        leases: &Leases,
        now: Instant,
        now_ms: u64,
    ) -> Option<Step> {
        if self.worker_op.is_some() && self.machine.kind.is_some() {
            // A machine op is out: renew while it runs.
            return Some(self.renew_or_wait(cfg, now, now_ms));
        }
        let Some(worker) = self.worker_of(cfg) else {
            // No configured worker may create it (a later configuration's
            // catalog lacks it): it is never prepared here; only a cancel
            // or its queue deadline ends it (the common steps).
            let ends = self.rec.cancel_requested_at_ms.is_some()
                || self.past(Deadline::Queue, now, now_ms);
            let unprepared = self.rec.state == ExecState::Accepted && self.rec.assignment.is_none();
            return (unprepared && !ends).then(|| self.finish());
        };
        let entry = cfg.workers.iter().find(|w| w.id == worker)?;
        let profile = entry.profile.clone()?;
        // Every write on an assigned record is fenced by the worker lease.
        let Some(generation) = leases.live(&worker, now, now_ms) else {
            return Some(Step::Wait);
        };
        if let Some(a) = &self.rec.assignment
            && a.worker_generation != generation
        {
            // Assigned under another worker-lease generation (another
            // controller reserved it, or this one under an older lease):
            // every write is fenced (C15) until the claim re-fences the
            // record at the version read (`claim_version`); then it moves
            // forward from what is stored, nothing uncertain resent.
            return Some(self.claim_op(cfg, now_ms));
        }
        let cancel = self.rec.cancel_requested_at_ms.is_some();
        // Kept until a write succeeds: a write that fails (or whose claim
        // comes first) is decided again from the same answer, never from
        // none (an answer dropped with a failed write left the execution
        // waiting for a reply that had already come).
        let reply = self.machine.reply.clone();
        match self.rec.state {
            ExecState::Accepted if cancel || self.past(Deadline::Queue, now, now_ms) => None,
            ExecState::Accepted if self.rec.assignment.is_none() => {
                if !self.claim_ok(cfg, now, now_ms) {
                    return Some(self.claim_op(cfg, now_ms));
                }
                self.machine.reserved_here = true;
                self.next_kind = Kind::Write;
                Some(Step::Store(StoreOp::Reserve {
                    key: self.rec.key.clone(),
                    guard: Guard::for_exec(&self.rec, &cfg.owner),
                    reservation: Reservation {
                        worker_id: worker,
                        machine_name: machine_name_for(&self.rec),
                        capacity: entry.reservation(&self.rec.spec.profile, DISPOSABLE_RESERVATION),
                        limit: entry.capacity,
                    },
                    now_ms: now_ms.max(self.rec.updated_at_ms),
                }))
            }
            // Assigned: `preparing` with the assignment is the durable
            // create intent (persisted before the create is sent).
            ExecState::Accepted => {
                let patch = ExecPatch {
                    state: Some(ExecState::Preparing),
                    ..ExecPatch::default()
                };
                Some(self.guarded(cfg, now, now_ms, Kind::Write, patch))
            }
            ExecState::Preparing => Some(self.prepare_machine(cfg, &profile, reply, now, now_ms)),
            s if s.is_terminal() || s == ExecState::Unknown => {
                Some(self.cleanup_machine(cfg, &profile, reply, now, now_ms))
            }
            _ => None,
        }
    }

    /// `preparing` on a disposable machine: create → creation evidence →
    /// start → `ready`. A create whose outcome is uncertain is never sent
    /// again and its reservation is kept (C0.4 rules 1, 3, 7).
    pub(super) fn prepare_machine(
        &mut self,
        cfg: &ControllerConfig,
        profile: &crate::worker::Profile,
        reply: Option<(MKind, WorkerResult)>,
        now: Instant,
        now_ms: u64,
    ) -> Step {
        let Some(a) = self.rec.assignment.clone() else {
            return Step::Wait;
        };
        let fail = |this: &mut Self, e: Error, cleanup: Cleanup| {
            let patch = ExecPatch {
                state: Some(ExecState::Failed),
                cleanup: Some(cleanup),
                next_due_at_ms: Some(this.end_due(now_ms)),
                last_error: Some(ErrorEntry::from_error(&e, now_ms)),
                ..ExecPatch::default()
            };
            this.exec_error = Some(e);
            this.guarded(cfg, now, now_ms, Kind::Write, patch)
        };
        let name = match MachineName::new(&a.machine_name) {
            Ok(n) => n,
            Err(e) => return fail(self, e, Cleanup::Failed),
        };
        if self.rec.creation.is_none() {
            match reply {
                Some((MKind::Create, Ok(WorkerReply::Machine(obs)))) => {
                    let patch = ExecPatch {
                        creation: Some(CreationEvidence {
                            created_at_ms: obs.incarnation.created_at.saturating_mul(1_000),
                            incarnation: incarnation_token(&obs),
                        }),
                        ..ExecPatch::default()
                    };
                    return self.guarded(cfg, now, now_ms, Kind::Write, patch);
                }
                // Never sent, or refused by the worker's create handler (a
                // 400 envelope): the one create of this record made nothing.
                Some((MKind::Create, Err(e)))
                    if e.evidence() == Evidence::NotDispatched
                        || crate::worker::Create::refused(&e) =>
                {
                    #[cfg(feature = "testkit")]
                    if cfg.planted == Some(super::super::Planted::ResendRefusedCreate)
                        && crate::worker::Create::refused(&e)
                    {
                        self.machine.create_sent = false;
                        self.machine.reply = None;
                        return self.prepare_machine(cfg, profile, None, now, now_ms);
                    }
                    return self.not_created(cfg, now, now_ms, e);
                }
                Some((_, r)) if self.machine.create_sent => {
                    // Uncertain creation (or a reply that does not match):
                    // no start, no adoption, no second create; the
                    // reservation stays until an operator resolves it.
                    let e = match r {
                        Err(e) => e,
                        Ok(_) => Error::protocol(Operation::Create, Reason::CreateReplyMismatch),
                    };
                    return fail(self, e, Cleanup::Failed);
                }
                _ if self.machine.create_sent => return Step::Wait,
                // The create goes out under a live, fresh claim of the
                // current worker-lease generation: a controller that was
                // paused past its claim finds out first whether another
                // took the record over.
                _ if self.machine.create_intent_mine && !self.claim_ok(cfg, now, now_ms) => {
                    return self.claim_op(cfg, now_ms);
                }
                _ if self.machine.create_intent_mine => {
                    // From the spec's artifact as the worker's catalog
                    // resolves it, sized by its profile revision (C12.4).
                    let s = &self.rec.spec;
                    let spec = match cfg.workers.iter().find(|w| w.id == a.worker_id) {
                        Some(w) => w.create_spec(&s.artifact, &s.profile, s.network.as_ref()),
                        None => Ok(MachineSpec::default()),
                    };
                    let spec = match spec {
                        Ok(spec) => spec,
                        Err(e) => return self.not_created(cfg, now, now_ms, e),
                    };
                    return self.machine_op(
                        MKind::Create,
                        WorkerOp::Create {
                            worker_id: a.worker_id,
                            profile: Box::new(profile.clone()),
                            name,
                            spec: Box::new(spec),
                        },
                    );
                }
                _ => {
                    // Found after a crash with the intent and no evidence:
                    // the create may have been sent; never send it again.
                    let e = Error::unknown(
                        Operation::Create,
                        Evidence::DispatchUncertain,
                        Reason::CreationUncertain,
                    );
                    return fail(self, e, Cleanup::Failed);
                }
            }
        }
        if reply.is_none() && !self.machine.start_sent && !self.machine.create_sent {
            // Resumed after the creation evidence: a start may have been
            // sent by the controller that created it, so it is never sent
            // again; the machine exists, so fail, then delete it.
            let e = Error::unknown(
                Operation::Start,
                Evidence::DispatchUncertain,
                Reason::StartUncertain,
            );
            return fail(self, e, Cleanup::InProgress);
        }
        if reply.is_none()
            && !self.machine.start_sent
            && self.past(Deadline::Preparation, now, now_ms)
        {
            // The machine exists (evidence recorded): fail, then delete it.
            let e = Error::expired(
                Operation::Submit,
                Evidence::NotDispatched,
                Reason::PreparationDeadline,
            );
            return fail(self, e, Cleanup::InProgress);
        }
        match reply {
            Some((MKind::Start, Ok(WorkerReply::Machine(obs))))
                if obs.state == MachineState::Running
                    && self
                        .rec
                        .creation
                        .as_ref()
                        .is_some_and(|c| c.incarnation == incarnation_token(&obs)) =>
            {
                self.machine.started = true;
            }
            Some((MKind::Start, r)) => {
                let e = match r {
                    Err(e) => e,
                    Ok(_) => Error::protocol(Operation::Start, Reason::StartReplyMismatch),
                };
                // The machine exists (evidence recorded): fail, then delete.
                return fail(self, e, Cleanup::InProgress);
            }
            _ => {}
        }
        if !self.machine.started {
            if self.machine.start_sent {
                return Step::Wait;
            }
            return self.machine_op(
                MKind::Start,
                WorkerOp::Start {
                    worker_id: a.worker_id,
                    profile: Box::new(profile.clone()),
                    name,
                },
            );
        }
        // Inputs are staged on the started machine before `ready` (C6.4).
        let staged = self
            .prepare()
            .and_then(|()| self.stage_inputs(cfg, now, now_ms));
        match staged {
            Ok(Some(step)) => step,
            Ok(None) => {
                let patch = ExecPatch {
                    state: Some(ExecState::Ready),
                    ..ExecPatch::default()
                };
                self.guarded(cfg, now, now_ms, Kind::Write, patch)
            }
            Err(e) => fail(self, e, Cleanup::InProgress),
        }
    }

    /// A create that never left the process (refused before sending, or
    /// its spec refused here) or that the worker's create handler refused
    /// (`Create::refused`; this record's only create, never resent): no
    /// machine, so absence is known and the record fails with the
    /// reservation released afterwards.
    fn not_created(&mut self, cfg: &ControllerConfig, now: Instant, now_ms: u64, e: Error) -> Step {
        let patch = ExecPatch {
            state: Some(ExecState::Failed),
            absence_at_ms: Some(now_ms),
            cleanup: Some(Cleanup::Complete),
            next_due_at_ms: Some(Some(now_ms)),
            last_error: Some(ErrorEntry::from_error(&e, now_ms)),
            ..ExecPatch::default()
        };
        self.exec_error = Some(e);
        self.guarded(cfg, now, now_ms, Kind::Write, patch)
    }

    /// The cleanup decision of C17.2, chosen before mutating: a finished
    /// (or never dispatched) record → verify the incarnation, delete,
    /// observe the 404, record absence, then release the reservation in
    /// its own step. An `unknown` record within retention → graceful stop,
    /// disks kept, due again when retention ends; after it → delete.
    pub(super) fn cleanup_machine(
        &mut self,
        cfg: &ControllerConfig,
        profile: &crate::worker::Profile,
        reply: Option<(MKind, WorkerResult)>,
        now: Instant,
        now_ms: u64,
    ) -> Step {
        if self.worker_op.is_some() {
            // The exec is still observed (a late exit wins).
            return self.renew_or_wait(cfg, now, now_ms);
        }
        let Some(a) = self.rec.assignment.clone() else {
            return self.tidy_unassigned(cfg, now, now_ms);
        };
        if self.rec.cleanup == Cleanup::Complete {
            if self.rec.reservation.is_some() {
                if !self.claim_ok(cfg, now, now_ms) {
                    return self.claim_op(cfg, now_ms);
                }
                self.next_kind = Kind::Write;
                return Step::Store(StoreOp::Release {
                    key: self.rec.key.clone(),
                    guard: Guard::for_exec(&self.rec, &cfg.owner),
                    now_ms: now_ms.max(self.rec.updated_at_ms),
                });
            }
            if self.rec.next_due_at_ms.is_some() {
                let patch = ExecPatch {
                    next_due_at_ms: Some(None),
                    ..ExecPatch::default()
                };
                return self.guarded(cfg, now, now_ms, Kind::Write, patch);
            }
            return self.finish();
        }
        let Some(creation) = self.rec.creation.clone() else {
            // No creation evidence: a 404 proves nothing (C0.4 rule 3); the
            // reservation stays for an operator.
            if self.rec.cleanup != Cleanup::Failed || self.rec.next_due_at_ms.is_some() {
                let patch = ExecPatch {
                    cleanup: Some(Cleanup::Failed),
                    next_due_at_ms: Some(None),
                    ..ExecPatch::default()
                };
                return self.guarded(cfg, now, now_ms, Kind::Write, patch);
            }
            return self.finish();
        };
        let Ok(name) = MachineName::new(&a.machine_name) else {
            return self.finish();
        };
        let retention_until = self
            .rec
            .deadlines
            .execution_ms
            .unwrap_or(self.rec.accepted_at_ms)
            .saturating_add(self.rec.spec.retention_ms);
        if self.rec.state == ExecState::Unknown && now_ms < retention_until {
            // Keep the disks for inspection: stop, then come back later.
            // Only the controller that moved the record into `unknown`
            // sends the stop (one per record: another, resuming it, cannot
            // know whether a stop already went out).
            if !self.machine.stop_sent && self.machine.marked_unknown {
                return self.machine_op(
                    MKind::Stop,
                    WorkerOp::Stop {
                        worker_id: a.worker_id,
                        profile: Box::new(profile.clone()),
                        name,
                    },
                );
            }
            if self.rec.next_due_at_ms != Some(retention_until) {
                let patch = ExecPatch {
                    next_due_at_ms: Some(Some(retention_until)),
                    ..ExecPatch::default()
                };
                return self.guarded(cfg, now, now_ms, Kind::Write, patch);
            }
            return self.finish();
        }
        let attempts = self.rec.cleanup_attempts;
        match reply {
            Some((MKind::Verify, Ok(WorkerReply::Machine(obs))))
                if incarnation_token(&obs) == creation.incarnation =>
            {
                self.machine.verified = true;
            }
            Some((MKind::Verify, Err(e))) if e.category() == Category::NotFound => {
                // Already gone, with creation evidence: that is absence.
                self.machine.deleted = true;
                self.machine.verified = true;
                return self.record_absence(cfg, now, now_ms);
            }
            Some((MKind::Verify, Ok(_))) => {
                // Another incarnation under the name: never delete it.
                let patch = ExecPatch {
                    cleanup: Some(Cleanup::Failed),
                    next_due_at_ms: Some(None),
                    ..ExecPatch::default()
                };
                return self.guarded(cfg, now, now_ms, Kind::Write, patch);
            }
            Some((MKind::Delete, Ok(WorkerReply::Deleted))) => self.machine.deleted = true,
            Some((MKind::Absent, Err(e))) if e.category() == Category::NotFound => {
                return self.record_absence(cfg, now, now_ms);
            }
            Some((kind, _)) => {
                // A failed mutation or check: count it; retry later, bounded.
                let next = attempts.saturating_add(1);
                let exhausted = next >= cfg.cleanup_attempts;
                if kind == MKind::Delete || kind == MKind::Verify {
                    self.machine.delete_sent = false;
                    self.machine.verified = false;
                }
                self.machine.absent_sent = false;
                let patch = ExecPatch {
                    cleanup_attempts: Some(next),
                    cleanup: Some(if exhausted {
                        Cleanup::Failed
                    } else {
                        Cleanup::InProgress
                    }),
                    next_due_at_ms: Some((!exhausted).then(|| now_ms + cfg.poll_interval_ms)),
                    ..ExecPatch::default()
                };
                return self.guarded(cfg, now, now_ms, Kind::Write, patch);
            }
            None => {}
        }
        if self.rec.cleanup == Cleanup::Failed {
            return self.finish();
        }
        if !self.machine.deleted && self.past(Deadline::Cleanup, now, now_ms) {
            // C13.4: the cleanup budget is spent (wall clock or the
            // monotonic bound, whichever comes first): no new mutation is
            // sent; absence was never recorded, so the reservation stays
            // for an operator. A delete already confirmed still gets its
            // 404 check (a read), the only way to a release.
            let e = Error::expired(
                Operation::Delete,
                Evidence::NotDispatched,
                Reason::CleanupDeadline,
            );
            let patch = ExecPatch {
                cleanup: Some(Cleanup::Failed),
                next_due_at_ms: Some(None),
                last_error: Some(ErrorEntry::from_error(&e, now_ms)),
                ..ExecPatch::default()
            };
            return self.guarded(cfg, now, now_ms, Kind::Write, patch);
        }
        if !self.machine.verified {
            return self.machine_op(
                MKind::Verify,
                WorkerOp::Inspect {
                    worker_id: a.worker_id,
                    profile: Box::new(profile.clone()),
                    name,
                },
            );
        }
        if !self.machine.deleted {
            if self.machine.delete_sent {
                return Step::Wait;
            }
            if !self.claim_ok(cfg, now, now_ms) {
                // The delete goes out under a live, fresh claim (sim
                // finding 11): a controller paused since its verification
                // finds out first whether another took the record over
                // meanwhile (and may have sent its own delete); if so the
                // claim's answer drops the verification (`on_stored`) and
                // the machine is inspected again.
                return self.claim_op(cfg, now_ms);
            }
            return self.machine_op(
                MKind::Delete,
                WorkerOp::Delete {
                    worker_id: a.worker_id,
                    name,
                },
            );
        }
        if !self.machine.absent_sent {
            return self.machine_op(
                MKind::Absent,
                WorkerOp::Inspect {
                    worker_id: a.worker_id,
                    profile: Box::new(profile.clone()),
                    name,
                },
            );
        }
        Step::Wait
    }

    /// The observed 404 after a verified delete: absence recorded, cleanup
    /// complete (the release follows as its own step).
    pub(super) fn record_absence(
        &mut self,
        cfg: &ControllerConfig,
        now: Instant,
        now_ms: u64,
    ) -> Step {
        let patch = ExecPatch {
            absence_at_ms: Some(now_ms.max(self.rec.updated_at_ms)),
            cleanup: Some(Cleanup::Complete),
            next_due_at_ms: Some(Some(now_ms)),
            ..ExecPatch::default()
        };
        self.guarded(cfg, now, now_ms, Kind::Write, patch)
    }

    pub(super) fn tidy_unassigned(
        &mut self,
        cfg: &ControllerConfig,
        now: Instant,
        now_ms: u64,
    ) -> Step {
        if self.rec.state.is_terminal()
            && (self.rec.cleanup != Cleanup::Complete || self.rec.next_due_at_ms.is_some())
        {
            let patch = ExecPatch {
                cleanup: Some(Cleanup::Complete),
                next_due_at_ms: Some(None),
                ..ExecPatch::default()
            };
            return self.guarded(cfg, now, now_ms, Kind::Write, patch);
        }
        self.finish()
    }
}
