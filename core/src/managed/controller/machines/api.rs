//! The caller's side of retained machines: the requests a controller
//! takes ([`MachineRequest`]), what each answers ([`MachineAnswer`], in a
//! [`MachineDone`]) and the operator's verified [`Resolution`].

use crate::managed::record::{ExecutionRecord, MachineRecord};
use crate::managed::state::MachineOperation;
use crate::managed::{RecordKey, RetainedMachineSpec};
use crate::{Error, Operation, Reason};

/// Identifies one caller request; its [`MachineDone`] names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RequestId(pub u64);

/// What the operator verified before a quiescent resolution (C17.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resolution {
    /// The recorded incarnation is stopped (or still only created).
    Stopped,
    /// The worker answers 404 for the machine.
    Deleted,
}

/// A caller's request about retained machines.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MachineRequest {
    /// Create (dedup by scoped fingerprint, tombstones included).
    Create {
        /// Scope and id.
        key: RecordKey,
        /// What to create.
        spec: RetainedMachineSpec,
    },
    /// Versioned start, stop or delete (C14.2).
    Lifecycle {
        /// Machine key.
        key: RecordKey,
        /// Start, stop or delete.
        action: MachineOperation,
        /// The version the caller inspected.
        version: u64,
    },
    /// A command into the machine's slot (C14.3).
    Submit {
        /// Machine key.
        machine: RecordKey,
        /// The command's record key (idempotency key).
        key: RecordKey,
        /// The command.
        command: crate::exec::Command,
        /// Its declared files (C6.4): inputs staged inside the slot before
        /// the dispatch intent, outputs collected after the exit, both by
        /// the rules of a disposable command.
        files: crate::managed::CommandFiles,
    },
    /// Observe the worker and record what it shows (C14.2).
    Reconcile {
        /// Machine key.
        key: RecordKey,
    },
    /// An ownership-verified stop for draining (C17.3); keeps the slot.
    StopForDrain {
        /// Machine key.
        key: RecordKey,
        /// The inspected version.
        version: u64,
    },
    /// The machine's console history (C14.2 `logs`), read from the worker
    /// after the recorded incarnation is verified.
    Logs {
        /// Machine key.
        key: RecordKey,
        /// Tail, timeout and allowance (`follow` must be false).
        params: crate::worker::LogsParams,
    },
    /// The machine's measurements (C14.2, C2.4), from an inspect of the
    /// recorded incarnation.
    Measurements {
        /// Machine key.
        key: RecordKey,
    },
    /// Quiescent resolution (C17.3).
    Resolve {
        /// Machine key.
        key: RecordKey,
        /// The inspected version.
        version: u64,
        /// The operator's assertion that old controllers are stopped and
        /// their requests drained; without it the request is rejected.
        quiesced: bool,
        /// What to resolve to.
        disposition: Resolution,
    },
}

/// The answer to a [`MachineRequest`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MachineAnswer {
    /// The machine as stored (create: `existing` when it already was).
    Machine {
        /// The record.
        record: Box<MachineRecord>,
        /// True for a create that found the record (same identity).
        existing: bool,
    },
    /// A command holds (or held) the slot.
    Submitted {
        /// The command record.
        execution: Box<ExecutionRecord>,
        /// The machine after the transaction.
        machine: Option<Box<MachineRecord>>,
        /// True when the command already existed.
        existing: bool,
    },
    /// Console history lines of the recorded incarnation.
    Logs {
        /// The lines, oldest first.
        lines: Vec<String>,
    },
    /// Measurements of the recorded incarnation.
    Measurements {
        /// What the worker's reply carried (`None` fields: not reported).
        measurements: crate::worker::Measurements,
        /// The machine record the incarnation was checked against.
        record: Box<MachineRecord>,
    },
    /// A resolved machine and the command that held its slot.
    Resolved {
        /// The machine.
        machine: Box<MachineRecord>,
        /// The settled command.
        command: Option<Box<ExecutionRecord>>,
    },
}

/// A request finished.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MachineDone {
    /// Which request.
    pub id: RequestId,
    /// Its answer or error (the error's evidence says whether anything may
    /// have reached the worker).
    pub result: Result<MachineAnswer, Error>,
}

impl MachineAnswer {
    /// The machine record (and the create's `existing` flag).
    ///
    /// # Errors
    /// `protocol` for another kind of answer.
    pub fn into_machine(self) -> Result<(MachineRecord, bool), Error> {
        match self {
            Self::Machine { record, existing } => Ok((*record, existing)),
            _ => Err(Error::protocol(Operation::Submit, Reason::UnexpectedAnswer)),
        }
    }

    /// The command record, its machine and whether it already existed.
    ///
    /// # Errors
    /// `protocol` for another kind of answer.
    pub fn into_submitted(self) -> Result<(ExecutionRecord, Option<MachineRecord>, bool), Error> {
        match self {
            Self::Submitted {
                execution,
                machine,
                existing,
            } => Ok((*execution, machine.map(|m| *m), existing)),
            _ => Err(Error::protocol(Operation::Submit, Reason::UnexpectedAnswer)),
        }
    }

    /// The console lines of a logs request.
    ///
    /// # Errors
    /// `protocol` for another kind of answer.
    pub fn into_logs(self) -> Result<Vec<String>, Error> {
        match self {
            Self::Logs { lines } => Ok(lines),
            _ => Err(Error::protocol(Operation::Submit, Reason::UnexpectedAnswer)),
        }
    }

    /// The measurements (and the record they were checked against).
    ///
    /// # Errors
    /// `protocol` for another kind of answer.
    pub fn into_measurements(self) -> Result<(crate::worker::Measurements, MachineRecord), Error> {
        match self {
            Self::Measurements {
                measurements,
                record,
            } => Ok((measurements, *record)),
            _ => Err(Error::protocol(Operation::Submit, Reason::UnexpectedAnswer)),
        }
    }

    /// The resolved machine and the settled command.
    ///
    /// # Errors
    /// `protocol` for another kind of answer.
    pub fn into_resolved(self) -> Result<(MachineRecord, Option<ExecutionRecord>), Error> {
        match self {
            Self::Resolved { machine, command } => Ok((*machine, command.map(|c| *c))),
            _ => Err(Error::protocol(Operation::Submit, Reason::UnexpectedAnswer)),
        }
    }
}
