//! Lifecycle telemetry (C20): optional, lossy, bounded entries for the
//! records this controller writes — executions (every state or evidence
//! change) and retained machines (created, a start/stop/delete requested,
//! an operation's intent and its end, absence recorded, resolved).
//!
//! Both kinds share one queue of at most `telemetry_pending` entries
//! (C12.1): the oldest is dropped first, counted, and every delivered entry
//! carries the drop count and an epoch that moves once per run of drops.
//! An entry names a record and its lifecycle position only: never argv,
//! env, stdin, metadata, fingerprints, artifact ids or digests, ports,
//! output or raw errors. Stored records are authoritative, never entries.
//!
//! A machine entry is made from the store's answer to one of this
//! controller's own lifecycle writes, recognised when the op is handed to
//! the driver ([`Controller::poll_store_op`]): `accept_machine` (a new
//! record, not a duplicate), `request_machine`, `write_machine` with a
//! state, operation, absence or resolution in its patch, `resolve_machine`,
//! and a `finish_command` that kept the slot (the machine `unknown`).
//! Claims, reservations, observations and reads make none.

use std::collections::BTreeSet;

use super::Controller;
use super::ops::{OpId, StoreOp, StoreReply, StoreResult};
use crate::managed::RecordKey;
use crate::managed::record::{ExecutionRecord, MachineRecord};
use crate::managed::slot::Finish;
use crate::managed::state::{
    ExecState, MachineOperation, MachinePhase, MachineRecordState, RecordEvidence,
};

/// Most machine lifecycle writes remembered while their answer is out (a
/// driver that never answers cannot grow it past this).
const MAX_LIFECYCLE_OPS: usize = 1_024;

/// One lifecycle telemetry entry (C20): identifiers and lifecycle position
/// only (never argv, env, stdin, paths' contents, tokens or output).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Telemetry {
    /// Overflow epoch, stamped at delivery: +1 for each run of drops
    /// between two deliveries. A consumer that sees it change lost entries
    /// just before this one.
    pub epoch: u64,
    /// Entries dropped in total so far (stamped at delivery).
    pub dropped: u64,
    /// Record key (an execution's or a machine's).
    pub key: RecordKey,
    /// Record version after the write.
    pub version: u64,
    /// Where the record stands after the write.
    pub lifecycle: Lifecycle,
}

impl Telemetry {
    /// The execution state, for an execution entry.
    pub fn exec_state(&self) -> Option<ExecState> {
        match self.lifecycle {
            Lifecycle::Execution { state, .. } => Some(state),
            Lifecycle::Machine { .. } => None,
        }
    }

    /// The machine state, for a machine entry.
    pub fn machine_state(&self) -> Option<MachineRecordState> {
        match self.lifecycle {
            Lifecycle::Machine { state, .. } => Some(state),
            Lifecycle::Execution { .. } => None,
        }
    }
}

/// What a telemetry entry reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lifecycle {
    /// An execution record was written.
    Execution {
        /// State after the write.
        state: ExecState,
        /// Evidence after the write.
        evidence: RecordEvidence,
    },
    /// A retained machine's lifecycle was recorded (module docs).
    Machine {
        /// State after the write.
        state: MachineRecordState,
        /// Operation in progress after the write.
        operation: MachineOperation,
        /// Its phase.
        phase: MachinePhase,
        /// The machine's absence on its worker is recorded.
        absent: bool,
    },
}

/// True for a store op whose answer is a machine lifecycle entry.
fn is_lifecycle_write(op: &StoreOp) -> bool {
    match op {
        StoreOp::AcceptMachine { .. }
        | StoreOp::RequestMachine { .. }
        | StoreOp::ResolveMachine { .. }
        | StoreOp::FinishCommand { .. } => true,
        StoreOp::WriteMachine { patch, .. } => {
            patch.state.is_some()
                || patch.operation.is_some()
                || patch.absence_at_ms.is_some()
                || patch.resolved_at_ms.is_some()
        }
        _ => false,
    }
}

/// The lifecycle writes whose answers are outstanding.
#[derive(Debug, Default)]
pub(super) struct LifecycleOps(BTreeSet<OpId>);

impl Controller {
    /// Pushes one telemetry entry, dropping the oldest when full (C20).
    pub(super) fn push_telemetry(&mut self, rec: &ExecutionRecord) {
        let lifecycle = Lifecycle::Execution {
            state: rec.state,
            evidence: rec.evidence,
        };
        self.push_entry(rec.key.clone(), rec.version, lifecycle);
    }

    fn push_machine_telemetry(&mut self, m: &MachineRecord) {
        let lifecycle = Lifecycle::Machine {
            state: m.state,
            operation: m.operation,
            phase: m.phase,
            absent: m.absence_at_ms.is_some(),
        };
        self.push_entry(m.key.clone(), m.version, lifecycle);
    }

    fn push_entry(&mut self, key: RecordKey, version: u64, lifecycle: Lifecycle) {
        if self.telemetry.len() >= self.cfg.telemetry_pending {
            self.telemetry.pop_front();
            self.telemetry_dropped += 1;
            if !self.dropped_since_delivery {
                self.dropped_since_delivery = true;
                self.telemetry_epoch += 1;
            }
        }
        self.telemetry.push_back(Telemetry {
            epoch: self.telemetry_epoch,
            dropped: self.telemetry_dropped,
            key,
            version,
            lifecycle,
        });
    }

    /// A store op is handed to the driver: a machine lifecycle write is
    /// remembered until its answer.
    pub(super) fn note_sent(&mut self, id: OpId, op: &StoreOp) {
        if is_lifecycle_write(op) {
            let ops = &mut self.lifecycle_ops.0;
            if ops.len() >= MAX_LIFECYCLE_OPS {
                ops.pop_first();
            }
            ops.insert(id);
        }
    }

    /// The answer to store op `id`: a machine lifecycle entry when it was
    /// one of this controller's lifecycle writes and it changed the record.
    pub(super) fn note_lifecycle(&mut self, id: OpId, result: &StoreResult) {
        if !self.lifecycle_ops.0.remove(&id) {
            return;
        }
        let m = match result {
            Ok(StoreReply::MachineAccepted {
                record,
                existing: false,
            }) => record,
            Ok(StoreReply::Machine(m) | StoreReply::Resolved { machine: m, .. }) => m,
            Ok(StoreReply::SlotFinished {
                machine,
                finish: Finish::Kept,
                ..
            }) => machine,
            _ => return,
        };
        let m = m.clone();
        self.push_machine_telemetry(&m);
    }
}
