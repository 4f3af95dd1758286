//! The command slot (C14.3) and versioned lifecycle requests (C14.2).
//!
//! A retained machine runs at most one command, terminal, background launch
//! or other exclusive operation at a time, across every controller sharing
//! the store. There is no queue: a second submission is
//! `admission_exhausted`. Unknown outcomes, interrupted preparation and
//! failed collection keep the slot (the machine becomes `unknown`).

use super::patch::{ExecPatch, apply_exec};
use super::record::{ExecutionRecord, LastRequest, MachineRecord, RecordedObservation};
use super::state::{
    Cleanup, Collection, ExecState, MachineOperation, MachinePhase, MachineRecordState,
};
use crate::Reason;
use crate::{Error, Evidence, Operation};

/// Gives the slot of `machine` to `exec` (C14.3): the machine must be idle
/// and running, in the same scope, with the same artifact and exact profile,
/// and the execution must not have been dispatched yet (`accepted`,
/// `preparing` or `ready`). Acquiring a slot the execution already holds
/// returns the record as is.
///
/// # Errors
/// `admission_exhausted` when the slot is held or the machine is not idle
/// and running; `validation` when the execution does not target this
/// machine, differs in scope, artifact or profile (`command_machine_mismatch`),
/// or is past dispatch, finished or `unknown` (`execution_not_pending`).
pub fn acquire(
    machine: &MachineRecord,
    exec: &ExecutionRecord,
    now_ms: u64,
) -> Result<MachineRecord, Error> {
    let same = exec.spec.machine.as_ref() == Some(&machine.key)
        && exec.key.scope == machine.key.scope
        && exec.spec.artifact == machine.spec.artifact
        && exec.spec.profile == machine.spec.profile;
    if !same {
        return Err(Error::validation(
            Operation::StoreSlot,
            Reason::CommandMachineMismatch,
        ));
    }
    match &machine.active_execution {
        Some(k) if *k == exec.key => return Ok(machine.clone()),
        Some(_) => {
            return Err(Error::admission_exhausted(
                Operation::StoreSlot,
                Reason::SlotBusy,
            ));
        }
        None => {}
    }
    if !exec.state.is_before_dispatch() {
        return Err(Error::validation(
            Operation::StoreSlot,
            Reason::ExecutionNotPending,
        ));
    }
    if machine.state != MachineRecordState::Running || machine.operation != MachineOperation::None {
        return Err(Error::admission_exhausted(
            Operation::StoreSlot,
            Reason::MachineNotIdle,
        ));
    }
    if now_ms < machine.updated_at_ms {
        return Err(Error::validation(
            Operation::StoreSlot,
            Reason::ClockBeforeUpdatedAt,
        ));
    }
    let mut next = machine.clone();
    next.active_execution = Some(exec.key.clone());
    next.version += 1;
    next.updated_at_ms = now_ms;
    next.validate()?;
    Ok(next)
}

/// [`acquire`] for a command submitted with its dispatch intent (issue 16):
/// in the same step the machine is claimed for the command's own claimer
/// (owner and expiry of `exec`'s claim, by [`claim_machine`]'s rules), so
/// the slot finish that ends the command needs no claim of its own while
/// that claim is fresh. A machine another controller holds is left
/// unclaimed (the finish claims it then). The machine moves one version.
///
/// # Errors
/// As [`acquire`].
///
/// [`claim_machine`]: super::claim::claim_machine
pub fn acquire_claimed(
    machine: &MachineRecord,
    exec: &ExecutionRecord,
    now_ms: u64,
) -> Result<MachineRecord, Error> {
    let held = acquire(machine, exec, now_ms)?;
    let Some(c) = exec.claim.as_ref().filter(|c| c.until_ms > now_ms) else {
        return Ok(held);
    };
    match super::claim::claim_machine(&held, &c.owner, now_ms, c.until_ms - now_ms) {
        Ok(mut claimed) => {
            claimed.version = held.version;
            Ok(claimed)
        }
        Err(_) => Ok(held),
    }
}

/// What finishing a command did to the slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// The slot is free; the command's cleanup is complete.
    Released,
    /// The slot is kept and the machine is `unknown`; the command's cleanup
    /// failed and needs an operator (C14.3).
    Kept,
}

/// Finishes `exec`'s hold on the slot (C14.3), as [`finish_command`]
/// without the updated command record.
///
/// # Errors
/// As [`finish_command`].
pub fn finish(
    machine: &MachineRecord,
    exec: &ExecutionRecord,
    now_ms: u64,
) -> Result<(MachineRecord, Finish), Error> {
    finish_command(machine, exec, now_ms).map(|(m, _, f)| (m, f))
}

/// Finishes `exec`'s hold on the slot (C14.3) and sets the command's
/// cleanup in the same step: completed, launched, or cancelled / expired
/// without inputs release the slot and complete the command's cleanup;
/// anything else keeps the slot, marks the machine `unknown` and sets the
/// command's cleanup to `failed` (a cleanup already `complete` stays).
/// Resources and ports stay either way. Both records move one version.
///
/// # Errors
/// `validation` when `exec` does not hold the slot (`not_slot_holder`),
/// has not finished (`execution_not_finished`: only terminal or `unknown`
/// executions finish), or the clock is before either record's last write.
pub fn finish_command(
    machine: &MachineRecord,
    exec: &ExecutionRecord,
    now_ms: u64,
) -> Result<(MachineRecord, ExecutionRecord, Finish), Error> {
    if machine.active_execution.as_ref() != Some(&exec.key) {
        return Err(Error::validation(
            Operation::StoreSlot,
            Reason::NotSlotHolder,
        ));
    }
    if !(exec.state.is_terminal() || exec.state == ExecState::Unknown) {
        return Err(Error::validation(
            Operation::StoreSlot,
            Reason::ExecutionNotFinished,
        ));
    }
    if now_ms < machine.updated_at_ms {
        return Err(Error::validation(
            Operation::StoreSlot,
            Reason::ClockBeforeUpdatedAt,
        ));
    }
    let release = match exec.state {
        ExecState::Completed | ExecState::Launched => true,
        ExecState::Cancelled | ExecState::Expired => exec.spec.inputs.is_empty(),
        _ => false,
    };
    let mut next = machine.clone();
    let (outcome, cleanup) = if release {
        next.active_execution = None;
        if let Some(observed) = verified_stop(machine) {
            // A stop verified while the slot was held (`stop_for_drain`,
            // or a reconcile that found the recorded incarnation stopped)
            // could not move the state then (an active execution requires
            // `running`); it does now, so the next command is refused
            // before acceptance instead of being admitted into a stopped
            // machine, and a start is sent instead of settling at once.
            next.state = observed;
        }
        (Finish::Released, Cleanup::Complete)
    } else {
        if next.state != MachineRecordState::Unknown {
            if !next.state.can_move_to(MachineRecordState::Unknown) {
                return Err(Error::validation(
                    Operation::StoreSlot,
                    Reason::ForbiddenTransition,
                ));
            }
            next.state = MachineRecordState::Unknown;
        }
        let cleanup = if exec.cleanup == Cleanup::Complete {
            Cleanup::Complete
        } else {
            Cleanup::Failed
        };
        (Finish::Kept, cleanup)
    };
    next.version += 1;
    next.updated_at_ms = now_ms;
    next.validate()?;
    let patch = ExecPatch {
        cleanup: Some(cleanup),
        next_due_at_ms: Some(None),
        ..ExecPatch::default()
    };
    let command =
        apply_exec(exec, &patch, now_ms).map_err(|e| e.with_operation(Operation::StoreSlot))?;
    Ok((next, command, outcome))
}

/// The stopped (or created) state last observed for the recorded
/// incarnation of a machine whose record still says `running`: a stop
/// verified while a command held the slot.
fn verified_stop(machine: &MachineRecord) -> Option<MachineRecordState> {
    let obs = machine.observation.as_ref()?;
    let ours = machine
        .creation
        .as_ref()
        .is_some_and(|c| c.incarnation == obs.incarnation);
    let stopped = matches!(
        obs.state,
        MachineRecordState::Stopped | MachineRecordState::Created
    );
    let running = machine.state == MachineRecordState::Running;
    (ours && stopped && running && machine.state.can_move_to(obs.state)).then_some(obs.state)
}

/// Records a versioned lifecycle request `(action, version)` (C14.2).
/// Repeating the latest identical request returns `Ok(None)` (the caller
/// answers with the current record).
///
/// A delete of a machine in `conflict` supersedes an operation left
/// `uncertain` (the reconcile that found the conflict settled what the
/// worker shows; the delete verifies ownership again before any mutation).
/// An assigned `conflict` machine without creation evidence cannot be
/// deleted by the controller: a create of it may still land, so only a
/// quiescent resolution (`resolve` with `deleted`) settles it.
///
/// # Errors
/// `stale_version` for a superseded version; `admission_exhausted` when an
/// operation is in progress or a command holds the slot and stop / delete
/// is requested (AC-14.3.1); `validation` for `none`, and
/// (`no_creation_evidence`) for the delete of an assigned `conflict`
/// machine without creation evidence.
pub fn request(
    machine: &MachineRecord,
    action: MachineOperation,
    version: u64,
    now_ms: u64,
) -> Result<Option<MachineRecord>, Error> {
    if action == MachineOperation::None {
        return Err(Error::validation(Operation::StoreSlot, Reason::RequestNone));
    }
    let req = LastRequest { action, version };
    if machine.last_request == Some(req) {
        return Ok(None);
    }
    if version != machine.version {
        return Err(Error::stale_version(
            Operation::StoreSlot,
            Evidence::NotDispatched,
            Reason::VersionMismatch,
        ));
    }
    if machine.active_execution.is_some()
        && matches!(action, MachineOperation::Stop | MachineOperation::Delete)
    {
        return Err(Error::admission_exhausted(
            Operation::StoreSlot,
            Reason::CommandActive,
        ));
    }
    let conflict_delete =
        machine.state == MachineRecordState::Conflict && action == MachineOperation::Delete;
    let superseded = conflict_delete && machine.phase == MachinePhase::Uncertain;
    if machine.operation != MachineOperation::None && !superseded {
        return Err(Error::admission_exhausted(
            Operation::StoreSlot,
            Reason::OperationInProgress,
        ));
    }
    if conflict_delete && machine.assignment.is_some() && machine.creation.is_none() {
        return Err(Error::validation(
            Operation::StoreSlot,
            Reason::NoCreationEvidence,
        ));
    }
    if now_ms < machine.updated_at_ms {
        return Err(Error::validation(
            Operation::StoreSlot,
            Reason::ClockBeforeUpdatedAt,
        ));
    }
    let mut next = machine.clone();
    next.operation = action;
    next.phase = MachinePhase::Pending;
    next.last_request = Some(req);
    next.next_due_at_ms = Some(now_ms);
    next.version += 1;
    next.updated_at_ms = now_ms;
    next.validate()?;
    Ok(Some(next))
}

/// What the operator verified on the worker before a quiescent resolution
/// (C17.3). The controller checks the worker; the store half checks the
/// record against it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Disposition {
    /// The worker showed the machine stopped, or still only created, with
    /// this incarnation.
    Stopped {
        /// The observed state: `stopped` or `created`.
        observed: MachineRecordState,
        /// The observed incarnation; must be the recorded one.
        incarnation: String,
    },
    /// The worker answered 404 for the machine's name.
    Deleted,
}

/// Resolves a quiesced machine (C17.3, store half), at the inspected
/// `version`: clears the command slot, and either records the verified stop
/// (`Stopped`) or records deletion and absence and releases capacity and
/// ports (`Deleted`). The command that held the slot, if any, keeps an
/// uncertain outcome: a dispatched command becomes (or stays) `unknown`, a
/// command still before dispatch ends `cancelled` (from `accepted`) or
/// `failed`, a command that was collecting ends `collection_failed`; its
/// cleanup becomes `complete` (the slot it held is released) and nothing
/// about it is due any more. `command` must be the record named by the
/// machine's active execution (or `None` when the slot is free).
///
/// # Errors
/// `validation` without `quiesced` (`not_quiesced`, AC-17.3.1), for a
/// machine already deleted, a mismatched `command`, or a clock before the
/// last write; `stale_version` when `version` is not the record's;
/// `identity_conflict` when `Stopped` names another incarnation, a machine
/// without recorded creation evidence, or a state other than
/// `stopped` / `created` (AC-17.3.2).
pub fn resolve(
    machine: &MachineRecord,
    command: Option<&ExecutionRecord>,
    version: u64,
    quiesced: bool,
    disposition: &Disposition,
    now_ms: u64,
) -> Result<(MachineRecord, Option<ExecutionRecord>), Error> {
    let op = Operation::StoreSlot;
    if !quiesced {
        return Err(Error::validation(op, Reason::NotQuiesced));
    }
    if version != machine.version {
        return Err(Error::stale_version(
            op,
            Evidence::NotDispatched,
            Reason::VersionMismatch,
        ));
    }
    if machine.state == MachineRecordState::Deleted {
        return Err(Error::validation(op, Reason::AlreadyDeleted));
    }
    if command.map(|c| &c.key) != machine.active_execution.as_ref() {
        return Err(Error::validation(op, Reason::CommandMismatch));
    }
    if now_ms < machine.updated_at_ms {
        return Err(Error::validation(op, Reason::ClockBeforeUpdatedAt));
    }
    let mut next = machine.clone();
    match disposition {
        Disposition::Stopped {
            observed,
            incarnation,
        } => {
            let recorded = machine.creation.as_ref().map(|c| c.incarnation.as_str());
            if recorded != Some(incarnation.as_str()) {
                return Err(Error::identity_conflict(
                    Operation::StoreSlot,
                    Evidence::NotDispatched,
                    Reason::IncarnationMismatch,
                ));
            }
            if !matches!(
                observed,
                MachineRecordState::Stopped | MachineRecordState::Created
            ) {
                return Err(Error::identity_conflict(
                    Operation::StoreSlot,
                    Evidence::NotDispatched,
                    Reason::NotStopped,
                ));
            }
            next.state = *observed;
            next.observation = Some(RecordedObservation {
                state: *observed,
                incarnation: incarnation.clone(),
                at_ms: now_ms,
            });
        }
        Disposition::Deleted => {
            next.state = MachineRecordState::Deleted;
            if next.assignment.is_some() {
                next.absence_at_ms.get_or_insert(now_ms);
            }
            next.reservation = None;
            next.reserved_ports.clear();
        }
    }
    next.operation = MachineOperation::None;
    next.phase = MachinePhase::None;
    next.operation_deadline_ms = None;
    next.active_execution = None;
    next.next_due_at_ms = None;
    next.resolved_at_ms = Some(now_ms);
    next.version += 1;
    next.updated_at_ms = now_ms;
    next.validate().map_err(|e| e.with_operation(op))?;
    let settled = command
        .map(|c| settle_command(c, now_ms))
        .transpose()
        .map_err(|e| e.with_operation(op))?;
    Ok((next, settled))
}

/// The command of a resolved machine: its outcome stays uncertain (never a
/// success), its cleanup completes with the slot's release.
fn settle_command(c: &ExecutionRecord, now_ms: u64) -> Result<ExecutionRecord, Error> {
    let state = match c.state {
        ExecState::Dispatching | ExecState::Running | ExecState::Cancelling => {
            Some(ExecState::Unknown)
        }
        ExecState::Accepted => Some(ExecState::Cancelled),
        ExecState::Preparing | ExecState::Ready => Some(ExecState::Failed),
        ExecState::Collecting => Some(ExecState::CollectionFailed),
        _ => None,
    };
    let collection = (state == Some(ExecState::CollectionFailed)
        && !matches!(c.collection, Collection::Partial | Collection::Failed))
    .then_some(Collection::Failed);
    let patch = ExecPatch {
        state,
        collection,
        cleanup: Some(Cleanup::Complete),
        next_due_at_ms: Some(None),
        ..ExecPatch::default()
    };
    apply_exec(c, &patch, now_ms.max(c.updated_at_ms))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Category;
    use crate::Reason;
    use crate::managed::testkit::{exec_in, key, machine_in};

    const T0: u64 = 1_700_000_000_000;

    fn holding(state: ExecState) -> (MachineRecord, ExecutionRecord) {
        let e = exec_in(state, key("s", "e1"), T0).unwrap();
        let mut m = machine_in(MachineRecordState::Running, key("s", "machine-1"), T0).unwrap();
        m.active_execution = Some(e.key.clone());
        (m, e)
    }

    /// A delete of a `conflict` machine supersedes an `uncertain`
    /// operation (never a pending or dispatching one); an assigned
    /// `conflict` machine without creation evidence is refused (a create
    /// may still land: only `resolve` settles it).
    #[test]
    fn a_conflict_delete_supersedes_only_uncertain_and_needs_evidence_when_assigned() {
        use crate::managed::record::{Assignment, CreationEvidence};
        let mut m = machine_in(MachineRecordState::Conflict, key("s", "machine-1"), T0).unwrap();
        m.operation = MachineOperation::Create;
        m.phase = MachinePhase::Uncertain;
        let next = request(&m, MachineOperation::Delete, m.version, T0 + 1)
            .unwrap()
            .unwrap();
        assert_eq!(
            (next.operation, next.phase),
            (MachineOperation::Delete, MachinePhase::Pending)
        );
        let e = request(&m, MachineOperation::Start, m.version, T0 + 1).unwrap_err();
        assert_eq!(e.reason(), Reason::OperationInProgress);
        let mut busy = m.clone();
        busy.phase = MachinePhase::Dispatching;
        let e = request(&busy, MachineOperation::Delete, m.version, T0 + 1).unwrap_err();
        assert_eq!(e.reason(), Reason::OperationInProgress);
        m.assignment = Some(Assignment {
            worker_id: "w1".into(),
            worker_generation: 1,
            machine_name: "n1".into(),
        });
        let e = request(&m, MachineOperation::Delete, m.version, T0 + 1).unwrap_err();
        assert_eq!(
            (e.category(), e.reason(), e.evidence()),
            (
                Category::Validation,
                Reason::NoCreationEvidence,
                Evidence::NotDispatched
            )
        );
        m.creation = Some(CreationEvidence {
            created_at_ms: T0,
            incarnation: "inc-1".into(),
        });
        assert!(request(&m, MachineOperation::Delete, m.version, T0 + 1).is_ok());
    }

    #[test]
    fn acquire_refuses_an_execution_past_dispatch() {
        let m = machine_in(MachineRecordState::Running, key("s", "machine-1"), T0).unwrap();
        for state in ExecState::ALL {
            let e = exec_in(state, key("s", "e1"), T0).unwrap();
            let got = acquire(&m, &e, T0 + 50);
            if state.is_before_dispatch() {
                assert_eq!(got.unwrap().active_execution, Some(e.key), "{state:?}");
            } else {
                let err = got.unwrap_err();
                assert_eq!(
                    (err.category(), err.reason()),
                    (Category::Validation, Reason::ExecutionNotPending),
                    "{state:?}"
                );
            }
        }
    }

    #[test]
    fn finish_sets_the_command_cleanup_with_the_slot() {
        for (state, expect, cleanup) in [
            (ExecState::Completed, Finish::Released, Cleanup::Complete),
            (ExecState::Launched, Finish::Released, Cleanup::Complete),
            (ExecState::Cancelled, Finish::Released, Cleanup::Complete),
            (ExecState::Expired, Finish::Released, Cleanup::Complete),
            (ExecState::Unknown, Finish::Kept, Cleanup::Failed),
            (ExecState::CollectionFailed, Finish::Kept, Cleanup::Failed),
            (ExecState::Failed, Finish::Kept, Cleanup::Failed),
        ] {
            let (m, e) = holding(state);
            let (after, cmd, got) = finish_command(&m, &e, T0 + 60).unwrap();
            assert_eq!((got, cmd.cleanup), (expect, cleanup), "{state:?}");
            assert_eq!(cmd.version, e.version + 1);
            assert_eq!(after.version, m.version + 1);
            assert_eq!(after.reservation, m.reservation, "capacity stays");
            match expect {
                Finish::Released => assert!(after.active_execution.is_none()),
                Finish::Kept => {
                    assert_eq!(after.active_execution, Some(e.key.clone()));
                    assert_eq!(after.state, MachineRecordState::Unknown);
                }
            }
        }
    }

    /// Recovery simulation seed 185: a stop verified while a command held
    /// the slot (`stop_for_drain` records it as the observation only)
    /// becomes the machine's state when the holder's confirmed finish frees
    /// the slot, so the next command is refused before acceptance
    /// (`admission_exhausted`, nothing sent) instead of being admitted into
    /// a stopped machine. A running observation, or one of another
    /// incarnation, changes nothing.
    #[test]
    fn a_stop_verified_while_the_slot_was_held_is_the_state_once_released() {
        use crate::managed::record::RecordedObservation;
        let observed = |state, incarnation: &str| RecordedObservation {
            state,
            incarnation: incarnation.into(),
            at_ms: T0 + 30,
        };
        let (mut m, e) = holding(ExecState::Completed);
        m.observation = Some(observed(MachineRecordState::Stopped, "inc-1"));
        let (after, _, got) = finish_command(&m, &e, T0 + 60).unwrap();
        assert_eq!(got, Finish::Released);
        assert_eq!(after.state, MachineRecordState::Stopped);
        assert!(after.active_execution.is_none());
        after.validate().unwrap();
        let next = exec_in(ExecState::Accepted, key("s", "e2"), T0 + 70).unwrap();
        let err = acquire(&after, &next, T0 + 70).unwrap_err();
        assert_eq!(
            (err.category(), err.reason(), err.evidence()),
            (
                Category::AdmissionExhausted,
                Reason::MachineNotIdle,
                Evidence::NotDispatched
            )
        );
        for obs in [
            observed(MachineRecordState::Running, "inc-1"),
            observed(MachineRecordState::Stopped, "inc-2"),
        ] {
            let (mut m, e) = holding(ExecState::Completed);
            m.observation = Some(obs);
            let (after, _, _) = finish_command(&m, &e, T0 + 60).unwrap();
            assert_eq!(after.state, MachineRecordState::Running);
            assert!(acquire(&after, &next, T0 + 70).is_ok());
        }
        // Kept (an unknown holder): the machine is `unknown` as before;
        // the resolve records the verified state.
        let (mut m, e) = holding(ExecState::Unknown);
        m.observation = Some(observed(MachineRecordState::Stopped, "inc-1"));
        let (after, _, got) = finish_command(&m, &e, T0 + 60).unwrap();
        assert_eq!(
            (got, after.state),
            (Finish::Kept, MachineRecordState::Unknown)
        );
    }

    #[test]
    fn cancelled_with_inputs_keeps_the_slot() {
        let (m, mut e) = holding(ExecState::Cancelled);
        e.spec.inputs.push(crate::managed::spec::InputFile {
            path: "/workspace/in".into(),
            sha256: "b".repeat(64),
            size: 1,
            source: "src-1".into(),
        });
        let (_, cmd, got) = finish_command(&m, &e, T0 + 60).unwrap();
        assert_eq!((got, cmd.cleanup), (Finish::Kept, Cleanup::Failed));
    }

    fn stopped(incarnation: &str) -> Disposition {
        Disposition::Stopped {
            observed: MachineRecordState::Stopped,
            incarnation: incarnation.into(),
        }
    }

    #[test]
    fn resolve_needs_quiesced_and_the_version() {
        let (m, e) = holding(ExecState::Unknown);
        let err = resolve(&m, Some(&e), m.version, false, &stopped("inc-1"), T0 + 60).unwrap_err();
        assert_eq!(
            (err.category(), err.reason()),
            (Category::Validation, Reason::NotQuiesced)
        );
        let err = resolve(
            &m,
            Some(&e),
            m.version - 1,
            true,
            &stopped("inc-1"),
            T0 + 60,
        )
        .unwrap_err();
        assert_eq!(err.category(), Category::StaleVersion);
        let err = resolve(&m, None, m.version, true, &stopped("inc-1"), T0 + 60).unwrap_err();
        assert_eq!(err.reason(), Reason::CommandMismatch);
    }

    #[test]
    fn resolve_stopped_checks_the_incarnation_and_clears_the_slot() {
        let (m, e) = holding(ExecState::Unknown);
        let err = resolve(&m, Some(&e), m.version, true, &stopped("inc-2"), T0 + 60).unwrap_err();
        assert_eq!(
            (err.category(), err.reason()),
            (Category::IdentityConflict, Reason::IncarnationMismatch)
        );
        let running = Disposition::Stopped {
            observed: MachineRecordState::Running,
            incarnation: "inc-1".into(),
        };
        let err = resolve(&m, Some(&e), m.version, true, &running, T0 + 60).unwrap_err();
        assert_eq!(err.category(), Category::IdentityConflict);
        let (after, cmd) =
            resolve(&m, Some(&e), m.version, true, &stopped("inc-1"), T0 + 60).unwrap();
        let cmd = cmd.unwrap();
        assert_eq!(after.state, MachineRecordState::Stopped);
        assert!(after.active_execution.is_none());
        assert_eq!(after.resolved_at_ms, Some(T0 + 60));
        assert_eq!(
            after.reservation, m.reservation,
            "a stopped machine keeps capacity"
        );
        assert_eq!(
            (cmd.state, cmd.cleanup),
            (ExecState::Unknown, Cleanup::Complete)
        );
        assert_eq!(cmd.result, None, "the outcome stays unknown");
    }

    #[test]
    fn resolve_settles_every_kind_of_holder_without_a_success() {
        for (state, expect) in [
            (ExecState::Accepted, ExecState::Cancelled),
            (ExecState::Preparing, ExecState::Failed),
            (ExecState::Ready, ExecState::Failed),
            (ExecState::Dispatching, ExecState::Unknown),
            (ExecState::Running, ExecState::Unknown),
            (ExecState::Cancelling, ExecState::Unknown),
            (ExecState::Collecting, ExecState::CollectionFailed),
            (ExecState::CollectionFailed, ExecState::CollectionFailed),
            (ExecState::Unknown, ExecState::Unknown),
        ] {
            let (m, e) = holding(state);
            let (after, cmd) = resolve(
                &m,
                Some(&e),
                m.version,
                true,
                &Disposition::Deleted,
                T0 + 60,
            )
            .unwrap();
            let cmd = cmd.unwrap();
            assert_eq!(cmd.state, expect, "{state:?}");
            assert_eq!(cmd.cleanup, Cleanup::Complete);
            assert_eq!(cmd.next_due_at_ms, None);
            assert_eq!(after.state, MachineRecordState::Deleted);
            assert!(after.reservation.is_none() && after.reserved_ports.is_empty());
        }
    }
}
