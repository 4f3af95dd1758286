//! The command slot (C14.3) and versioned lifecycle requests (C14.2).
//!
//! A retained machine runs at most one command, terminal, background launch
//! or other exclusive operation at a time, across every controller sharing
//! the store. There is no queue: a second submission is
//! `admission_exhausted`. Unknown outcomes, interrupted preparation and
//! failed collection keep the slot (the machine becomes `unknown`).

use super::record::{ExecutionRecord, LastRequest, MachineRecord};
use super::state::{ExecState, MachineOperation, MachinePhase, MachineRecordState};
use crate::{Category, Error, Evidence, Operation};

const fn exhausted(reason: &'static str) -> Error {
    Error::new(
        Category::AdmissionExhausted,
        Operation::StoreSlot,
        Evidence::NotDispatched,
    )
    .with_reason(reason)
}

/// Gives the slot of `machine` to `exec` (C14.3): the machine must be idle
/// and running, in the same scope, with the same artifact and exact profile.
/// Acquiring a slot the execution already holds returns the record as is.
///
/// # Errors
/// `admission_exhausted` when the slot is held or the machine is not idle
/// and running; `validation` when the execution does not target this
/// machine or differs in scope, artifact or profile.
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
            "command_machine_mismatch",
        ));
    }
    match &machine.active_execution {
        Some(k) if *k == exec.key => return Ok(machine.clone()),
        Some(_) => return Err(exhausted("slot_busy")),
        None => {}
    }
    if machine.state != MachineRecordState::Running || machine.operation != MachineOperation::None {
        return Err(exhausted("machine_not_idle"));
    }
    if now_ms < machine.updated_at_ms {
        return Err(Error::validation(
            Operation::StoreSlot,
            "clock_before_updated_at",
        ));
    }
    let mut next = machine.clone();
    next.active_execution = Some(exec.key.clone());
    next.version += 1;
    next.updated_at_ms = now_ms;
    next.validate()?;
    Ok(next)
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

/// Finishes `exec`'s hold on the slot (C14.3): completed, launched, or
/// cancelled / expired without inputs release it; anything else keeps it
/// and marks the machine `unknown`. Capacity and ports stay either way.
///
/// # Errors
/// `validation` when `exec` does not hold the slot or has not finished
/// (only terminal or `unknown` executions finish).
pub fn finish(
    machine: &MachineRecord,
    exec: &ExecutionRecord,
    now_ms: u64,
) -> Result<(MachineRecord, Finish), Error> {
    if machine.active_execution.as_ref() != Some(&exec.key) {
        return Err(Error::validation(Operation::StoreSlot, "not_slot_holder"));
    }
    if !(exec.state.is_terminal() || exec.state == ExecState::Unknown) {
        return Err(Error::validation(
            Operation::StoreSlot,
            "execution_not_finished",
        ));
    }
    if now_ms < machine.updated_at_ms {
        return Err(Error::validation(
            Operation::StoreSlot,
            "clock_before_updated_at",
        ));
    }
    let release = match exec.state {
        ExecState::Completed | ExecState::Launched => true,
        ExecState::Cancelled | ExecState::Expired => exec.spec.inputs.is_empty(),
        _ => false,
    };
    let mut next = machine.clone();
    let outcome = if release {
        next.active_execution = None;
        Finish::Released
    } else {
        if next.state != MachineRecordState::Unknown {
            if !next.state.can_move_to(MachineRecordState::Unknown) {
                return Err(Error::validation(
                    Operation::StoreSlot,
                    "forbidden_transition",
                ));
            }
            next.state = MachineRecordState::Unknown;
        }
        Finish::Kept
    };
    next.version += 1;
    next.updated_at_ms = now_ms;
    next.validate()?;
    Ok((next, outcome))
}

/// Records a versioned lifecycle request `(action, version)` (C14.2).
/// Repeating the latest identical request returns `Ok(None)` (the caller
/// answers with the current record).
///
/// # Errors
/// `stale_version` for a superseded version; `admission_exhausted` when an
/// operation is in progress or a command holds the slot and stop / delete
/// is requested (AC-14.3.1); `validation` for `none`.
pub fn request(
    machine: &MachineRecord,
    action: MachineOperation,
    version: u64,
    now_ms: u64,
) -> Result<Option<MachineRecord>, Error> {
    if action == MachineOperation::None {
        return Err(Error::validation(Operation::StoreSlot, "request_none"));
    }
    let req = LastRequest { action, version };
    if machine.last_request == Some(req) {
        return Ok(None);
    }
    if version != machine.version {
        return Err(super::claim::stale_version(Operation::StoreSlot));
    }
    if machine.active_execution.is_some()
        && matches!(action, MachineOperation::Stop | MachineOperation::Delete)
    {
        return Err(exhausted("command_active"));
    }
    if machine.operation != MachineOperation::None {
        return Err(exhausted("operation_in_progress"));
    }
    if now_ms < machine.updated_at_ms {
        return Err(Error::validation(
            Operation::StoreSlot,
            "clock_before_updated_at",
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
