//! Patches: the only way a stored record changes outside claims,
//! reservations and the command slot (C13.3).
//!
//! A patch names only patchable fields, so identity, spec, claims and
//! reservations cannot be patched by construction. [`apply_exec`] and
//! [`apply_machine`] check the transition table, the evidence coupling, the
//! write-once fields and `now ≥ updated_at`, set each deadline once on first
//! entry to its state (C13.4), increment the version, and re-validate the
//! whole record. Guards are checked separately ([`super::claim::check_guard`]).

use super::record::{
    CollectedArtifact, CreationEvidence, ErrorEntry, ExecResult, ExecutionRecord,
    MAX_ERROR_HISTORY, MachineRecord, RecordedObservation,
};
use super::state::{
    Cleanup, Collection, ExecState, MachineOperation, MachinePhase, MachineRecordState,
    RecordEvidence,
};
use crate::Error;
use crate::Operation;
use crate::Reason;

/// The patchable fields of an execution record (C13.3). `None` leaves a
/// field as it is.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExecPatch {
    /// New state (must be allowed by C13.1, or the same state).
    pub state: Option<ExecState>,
    /// New evidence (C13.2).
    pub evidence: Option<RecordEvidence>,
    /// The result (write-once).
    pub result: Option<ExecResult>,
    /// Collection progress.
    pub collection: Option<Collection>,
    /// Cleanup progress (`complete` is permanent).
    pub cleanup: Option<Cleanup>,
    /// Creation evidence (write-once).
    pub creation: Option<CreationEvidence>,
    /// Next due time; `Some(None)` clears it.
    pub next_due_at_ms: Option<Option<u64>>,
    /// Collected artifacts (replaces the list).
    pub artifacts: Option<Vec<CollectedArtifact>>,
    /// Latest error (also appended to the history of 8).
    pub last_error: Option<ErrorEntry>,
    /// Cleanup attempts.
    pub cleanup_attempts: Option<u32>,
    /// Verified absence time (write-once).
    pub absence_at_ms: Option<u64>,
}

/// The patchable fields of a machine record.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MachinePatch {
    /// New state.
    pub state: Option<MachineRecordState>,
    /// New operation and phase (both none or both set).
    pub operation: Option<(MachineOperation, MachinePhase)>,
    /// Creation evidence (write-once).
    pub creation: Option<CreationEvidence>,
    /// Latest observation.
    pub observation: Option<RecordedObservation>,
    /// Next due time; `Some(None)` clears it.
    pub next_due_at_ms: Option<Option<u64>>,
    /// Verified absence time (write-once).
    pub absence_at_ms: Option<u64>,
    /// Operation deadline (set once per operation).
    pub operation_deadline_ms: Option<u64>,
    /// Operator resolution time.
    pub resolved_at_ms: Option<u64>,
    /// Latest error.
    pub last_error: Option<ErrorEntry>,
}

/// Applies `patch` to `rec` at `now_ms`, returning the new record.
///
/// # Errors
/// `validation` (nothing changes) when the clock went back, the transition
/// or evidence move is forbidden, a write-once field would change, or the
/// result breaks a record invariant.
pub fn apply_exec(
    rec: &ExecutionRecord,
    patch: &ExecPatch,
    now_ms: u64,
) -> Result<ExecutionRecord, Error> {
    if now_ms < rec.updated_at_ms {
        return Err(Error::validation(
            Operation::StoreWrite,
            Reason::ClockBeforeUpdatedAt,
        ));
    }
    let mut next = rec.clone();
    step_exec(&mut next, patch, now_ms)?;
    next.validate()?;
    Ok(next)
}

/// Applies `patch` to `rec` in place — every rule of [`apply_exec`] but the
/// final [`ExecutionRecord::validate`], which the caller runs. On an error
/// `rec` may be half changed: callers apply to a copy they drop on error.
/// The rules compare against the values the fields had before this patch,
/// read before each field is written.
fn step_exec(rec: &mut ExecutionRecord, patch: &ExecPatch, now_ms: u64) -> Result<(), Error> {
    // Every field by name: a new patch field must be handled here, and
    // checked against what `ExecutionRecord::validate_after_patch` skips
    // (the fields no patch writes).
    let ExecPatch {
        state,
        evidence,
        result,
        collection,
        cleanup,
        creation,
        next_due_at_ms,
        artifacts,
        last_error,
        cleanup_attempts,
        absence_at_ms,
    } = patch;
    if now_ms < rec.updated_at_ms {
        return Err(Error::validation(
            Operation::StoreWrite,
            Reason::ClockBeforeUpdatedAt,
        ));
    }
    if let Some(to) = *state
        && to != rec.state
    {
        if !rec.state.can_move_to(to) {
            return Err(Error::validation(
                Operation::StoreWrite,
                Reason::ForbiddenTransition,
            ));
        }
        // C16: a cancel requested before dispatch wins; the intent is
        // refused so nothing is sent.
        if to == ExecState::Dispatching && rec.cancel_requested_at_ms.is_some() {
            return Err(Error::validation(
                Operation::StoreWrite,
                Reason::CancelRequested,
            ));
        }
        rec.state = to;
        enter_state(rec, now_ms);
    }
    if let Some(ev) = *evidence {
        if !rec.evidence.can_move_to(ev) {
            return Err(Error::validation(
                Operation::StoreWrite,
                Reason::ForbiddenEvidence,
            ));
        }
        rec.evidence = ev;
    }
    set_once(&mut rec.result, result, Reason::ResultWriteOnce)?;
    set_once(&mut rec.creation, creation, Reason::CreationWriteOnce)?;
    set_once(
        &mut rec.absence_at_ms,
        absence_at_ms,
        Reason::AbsenceWriteOnce,
    )?;
    if let Some(c) = *collection {
        rec.collection = c;
    }
    if let Some(c) = *cleanup {
        if rec.cleanup == Cleanup::Complete && c != Cleanup::Complete {
            return Err(Error::validation(
                Operation::StoreWrite,
                Reason::CleanupCompletePermanent,
            ));
        }
        rec.cleanup = c;
    }
    if let Some(due) = *next_due_at_ms {
        rec.next_due_at_ms = due;
    }
    if let Some(a) = artifacts {
        rec.artifacts.clone_from(a);
    }
    if let Some(n) = *cleanup_attempts {
        if n < rec.cleanup_attempts {
            return Err(Error::validation(
                Operation::StoreWrite,
                Reason::CleanupAttemptsDecrease,
            ));
        }
        rec.cleanup_attempts = n;
    }
    if let Some(e) = last_error {
        rec.last_error = Some(e.clone());
        rec.errors.push(e.clone());
        if rec.errors.len() > MAX_ERROR_HISTORY {
            let extra = rec.errors.len() - MAX_ERROR_HISTORY;
            rec.errors.drain(..extra);
        }
    }
    rec.version += 1;
    rec.updated_at_ms = now_ms;
    Ok(())
}

/// Most patches one [`apply_exec_steps`] applies (one transaction).
pub const MAX_STEPS: usize = 4;

/// Applies `patches` in order, each as [`apply_exec`] would (transition
/// table, evidence coupling, write-once fields, deadlines on entry, the
/// record's invariants after the step), so several guarded moves become one
/// commit (issue 16). Like every write, the commit moves the version by
/// exactly one. The caller checks the guard once, against `rec`.
///
/// The steps change one owned copy of `rec` in place (no copy per step)
/// and give what [`apply_exec`] step by step gives, refusing the same
/// folds with the same reason:
/// - each step runs every rule of [`apply_exec`] but the final validation
///   (`step_exec`, the one body both share), against the values the
///   fields had before that step;
/// - the first step's result then passes the whole
///   [`ExecutionRecord::validate`], and every later step's result passes
///   `validate_after_patch`: the same rules in the same order but those
///   reading only fields no patch writes (key, fingerprint, spec, managed
///   machine, claim and generation, assignment). Those fields are the
///   first step's, which passed them, so they would pass again: a broken
///   invariant in a middle step still refuses the fold there, with the
///   reason `validate` names, even if a later step would mend it.
///
/// # Errors
/// `validation` (`steps`) for 0 or more than [`MAX_STEPS`] patches; the
/// first patch's error as [`apply_exec`] reports it (nothing changes).
pub fn apply_exec_steps(
    rec: &ExecutionRecord,
    patches: &[ExecPatch],
    now_ms: u64,
) -> Result<ExecutionRecord, Error> {
    if patches.is_empty() || patches.len() > MAX_STEPS {
        return Err(Error::validation(Operation::StoreWrite, Reason::Steps));
    }
    let mut next = rec.clone();
    for (i, p) in patches.iter().enumerate() {
        step_exec(&mut next, p, now_ms)?;
        if i == 0 {
            next.validate()?;
        } else {
            next.validate_after_patch()?;
        }
    }
    next.version = rec.version + 1;
    Ok(next)
}

/// The patches of the dispatch intent of a record accepted on a machine
/// that needs nothing staged: `preparing`, `ready`, then `dispatching` with
/// evidence `dispatch_uncertain` (C13.1, in table order).
pub fn intent_steps() -> [ExecPatch; 3] {
    [
        ExecPatch {
            state: Some(ExecState::Preparing),
            ..ExecPatch::default()
        },
        ExecPatch {
            state: Some(ExecState::Ready),
            ..ExecPatch::default()
        },
        ExecPatch {
            state: Some(ExecState::Dispatching),
            evidence: Some(RecordEvidence::DispatchUncertain),
            ..ExecPatch::default()
        },
    ]
}

/// A freshly accepted record with its dispatch intent committed in the
/// same transaction (issue 16: acceptance, claim and intent in one
/// commit): the record must be `accepted` at version 1 and carry its
/// submitter's live claim (the claim that fences the intent, as fresh as a
/// claim can be: written in the same transaction, C15); the
/// [`intent_steps`] are applied at its acceptance time.
///
/// # Errors
/// `validation`: `not_freshly_accepted`, `intent_without_claim` (no claim,
/// or one already expired at acceptance), or what [`apply_exec_steps`]
/// refuses.
pub fn intent_at_accept(rec: &ExecutionRecord) -> Result<ExecutionRecord, Error> {
    if rec.state != ExecState::Accepted || rec.version != 1 {
        return Err(Error::validation(
            Operation::StoreWrite,
            Reason::NotFreshlyAccepted,
        ));
    }
    if rec
        .claim
        .as_ref()
        .is_none_or(|c| c.until_ms <= rec.accepted_at_ms)
    {
        return Err(Error::validation(
            Operation::StoreWrite,
            Reason::IntentWithoutClaim,
        ));
    }
    let mut next = apply_exec_steps(rec, &intent_steps(), rec.accepted_at_ms)?;
    // One insertion: version 1, as every accepted record.
    next.version = 1;
    Ok(next)
}

/// Sets the deadline that belongs to `rec.state`, once (C13.4).
fn enter_state(rec: &mut ExecutionRecord, now_ms: u64) {
    let b = rec.spec.profile.budgets;
    let d = &mut rec.deadlines;
    match rec.state {
        ExecState::Preparing => {
            d.preparation_ms
                .get_or_insert(now_ms.saturating_add(b.preparation_ms));
        }
        ExecState::Dispatching => {
            d.execution_ms
                .get_or_insert(now_ms.saturating_add(b.execution_ms));
        }
        ExecState::Collecting => {
            d.collection_ms
                .get_or_insert(now_ms.saturating_add(b.collection_ms));
        }
        s if s.is_terminal() || s == ExecState::Unknown => {
            let retention_until = if s == ExecState::Unknown {
                d.execution_ms
                    .unwrap_or(rec.accepted_at_ms)
                    .saturating_add(rec.spec.retention_ms)
            } else {
                now_ms
            };
            d.cleanup_ms
                .get_or_insert(now_ms.max(retention_until).saturating_add(b.cleanup_ms));
        }
        _ => {}
    }
}

fn set_once<T: Clone + PartialEq>(
    field: &mut Option<T>,
    value: &Option<T>,
    reason: Reason,
) -> Result<(), Error> {
    match (field.as_ref(), value) {
        (_, None) => Ok(()),
        (None, Some(v)) => {
            *field = Some(v.clone());
            Ok(())
        }
        (Some(old), Some(v)) if old == v => Ok(()),
        (Some(_), Some(_)) => Err(Error::validation(Operation::StoreWrite, reason)),
    }
}

/// Applies a machine patch at `now_ms`. Entering `deleted` clears the
/// reservation and ports (C14.1); the operation deadline is set once per
/// operation and cleared with it.
///
/// # Errors
/// `validation` (nothing changes) as for [`apply_exec`].
pub fn apply_machine(
    rec: &MachineRecord,
    patch: &MachinePatch,
    now_ms: u64,
) -> Result<MachineRecord, Error> {
    if now_ms < rec.updated_at_ms {
        return Err(Error::validation(
            Operation::StoreWrite,
            Reason::ClockBeforeUpdatedAt,
        ));
    }
    let mut next = rec.clone();
    if let Some(to) = patch.state
        && to != rec.state
    {
        if !rec.state.can_move_to(to) {
            return Err(Error::validation(
                Operation::StoreWrite,
                Reason::ForbiddenTransition,
            ));
        }
        next.state = to;
        if to == MachineRecordState::Deleted {
            next.reservation = None;
            next.reserved_ports.clear();
        }
    }
    if let Some((op, phase)) = patch.operation {
        if op != rec.operation || op == MachineOperation::None {
            next.operation_deadline_ms = None;
        }
        next.operation = op;
        next.phase = phase;
    }
    if let Some(d) = patch.operation_deadline_ms {
        if next.operation == MachineOperation::None {
            return Err(Error::validation(
                Operation::StoreWrite,
                Reason::DeadlineWithoutOperation,
            ));
        }
        set_once(
            &mut next.operation_deadline_ms,
            &Some(d),
            Reason::DeadlineSetOnce,
        )?;
    }
    set_once(
        &mut next.creation,
        &patch.creation,
        Reason::CreationWriteOnce,
    )?;
    set_once(
        &mut next.absence_at_ms,
        &patch.absence_at_ms,
        Reason::AbsenceWriteOnce,
    )?;
    if let Some(o) = &patch.observation {
        if let Some(c) = &next.creation
            && c.incarnation != o.incarnation
        {
            return Err(Error::validation(
                Operation::StoreWrite,
                Reason::ObservationIncarnation,
            ));
        }
        next.observation = Some(o.clone());
    }
    if let Some(due) = patch.next_due_at_ms {
        next.next_due_at_ms = due;
    }
    if let Some(t) = patch.resolved_at_ms {
        next.resolved_at_ms = Some(t);
    }
    if let Some(e) = &patch.last_error {
        next.last_error = Some(e.clone());
    }
    next.version = rec.version + 1;
    next.updated_at_ms = now_ms;
    next.validate()?;
    Ok(next)
}
