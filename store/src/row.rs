//! Projected columns of the durable adapters: what a row shows in clear
//! beside its sealed payload, and the check that they match the decrypted
//! record on every read (C18.3). Only identifiers, the fingerprint (a keyed
//! hash), the state, the version, the due time, the assignment and the
//! capacity numbers are projected; argv, env, stdin, paths and every other
//! payload field exist only inside the ciphertext (C18.4).

use smolbox_core::Evidence;
use smolbox_core::Reason;
use smolbox_core::managed::record::Resources;
use smolbox_core::managed::{ExecutionRecord, Lease, MachineRecord, RecordKey, RecordKind};
use smolbox_core::{Error, Operation};

use crate::{Assigned, Sealer};

/// Projected columns, in the order of the SQL column lists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Projection {
    pub(crate) fingerprint: String,
    pub(crate) state: String,
    pub(crate) version: i64,
    pub(crate) next_due_ms: Option<i64>,
    pub(crate) pending: bool,
    pub(crate) worker_id: Option<String>,
    pub(crate) machine_name: Option<String>,
    pub(crate) slots: i64,
    pub(crate) cpus: i64,
    pub(crate) memory_mb: i64,
    pub(crate) disk_gb: i64,
    pub(crate) managed_machine: Option<String>,
}

/// Every projected value is at most 2^53 − 1 or rejected before a write;
/// an out-of-range value maps to -1, which never matches on read.
pub(crate) fn int(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(-1)
}

fn reserved(c: Option<Resources>) -> [i64; 4] {
    let c = c.unwrap_or_default();
    [int(c.slots), int(c.cpus), int(c.memory_mb), int(c.disk_gb)]
}

/// `scope/id` (identifiers never contain `/`).
pub(crate) fn joined(k: &RecordKey) -> String {
    format!("{}/{}", k.scope, k.id)
}

/// The projected columns an index of the adapters holds (due time, pending
/// flag, worker) of an execution record, as [`Projection::of_exec`] has them.
pub(crate) fn exec_indexed(r: &ExecutionRecord) -> (Option<i64>, bool, Option<&str>) {
    (
        r.next_due_at_ms.map(int),
        r.state.is_pending(),
        r.assignment.as_ref().map(|a| a.worker_id.as_str()),
    )
}

/// As [`exec_indexed`] for a machine record ([`Projection::of_machine`]).
pub(crate) fn machine_indexed(r: &MachineRecord) -> (Option<i64>, bool, Option<&str>) {
    (
        r.next_due_at_ms.map(int),
        r.state != smolbox_core::managed::MachineRecordState::Deleted,
        r.assignment.as_ref().map(|a| a.worker_id.as_str()),
    )
}

impl Projection {
    pub(crate) fn of_exec(r: &ExecutionRecord) -> Self {
        let [slots, cpus, memory_mb, disk_gb] = reserved(r.reservation);
        let (next_due_ms, pending, worker_id) = exec_indexed(r);
        Self {
            fingerprint: r.fingerprint.clone(),
            state: r.state.as_str().to_owned(),
            version: int(r.version),
            next_due_ms,
            pending,
            worker_id: worker_id.map(str::to_owned),
            machine_name: r.assignment.as_ref().map(|a| a.machine_name.clone()),
            slots,
            cpus,
            memory_mb,
            disk_gb,
            managed_machine: r.managed_machine.as_ref().map(joined),
        }
    }

    pub(crate) fn of_machine(r: &MachineRecord) -> Self {
        let [slots, cpus, memory_mb, disk_gb] = reserved(r.reservation);
        let (next_due_ms, pending, worker_id) = machine_indexed(r);
        Self {
            fingerprint: r.fingerprint.clone(),
            state: r.state.as_str().to_owned(),
            // The row's write counter (a claim moves it, not the version),
            // which the sealed payload is bound to.
            version: int(r.revision()),
            next_due_ms,
            pending,
            worker_id: worker_id.map(str::to_owned),
            machine_name: r.assignment.as_ref().map(|a| a.machine_name.clone()),
            slots,
            cpus,
            memory_mb,
            disk_gb,
            managed_machine: r.active_execution.as_ref().map(joined),
        }
    }

    /// The row's version column, which the sealed payload is bound to.
    pub(crate) fn stored_version(&self) -> Result<u64, Error> {
        u64::try_from(self.version).map_err(|_| {
            Error::store(
                Operation::StoreFetch,
                Evidence::Unknown,
                Reason::ProjectionMismatch,
            )
        })
    }

    /// Fails loudly when the clear columns disagree with the payload.
    pub(crate) fn check(&self, decoded: &Self) -> Result<(), Error> {
        if self == decoded {
            Ok(())
        } else {
            Err(Error::store(
                Operation::StoreFetch,
                Evidence::Unknown,
                Reason::ProjectionMismatch,
            ))
        }
    }
}

/// An execution row's read path, the same for every durable adapter:
/// the sealed payload is opened at the row's version column (bound in its
/// associated data), then the clear columns are checked against the
/// decrypted record. Every failure is `store` with operation `op`.
pub(crate) fn open_exec_row(
    sealer: &Sealer,
    key: &RecordKey,
    payload: &[u8],
    p: &Projection,
    op: Operation,
) -> Result<ExecutionRecord, Error> {
    let rec = sealer
        .open_exec(key, p.stored_version()?, payload)
        .map_err(|e| e.with_operation(op))?;
    p.check(&Projection::of_exec(&rec))
        .map_err(|e| e.with_operation(op))?;
    Ok(rec)
}

/// As [`open_exec_row`] for a machine row (its version column is the
/// machine's revision).
pub(crate) fn open_machine_row(
    sealer: &Sealer,
    key: &RecordKey,
    payload: &[u8],
    p: &Projection,
    op: Operation,
) -> Result<MachineRecord, Error> {
    let rec = sealer
        .open_machine(key, p.stored_version()?, payload)
        .map_err(|e| e.with_operation(op))?;
    p.check(&Projection::of_machine(&rec))
        .map_err(|e| e.with_operation(op))?;
    Ok(rec)
}

pub(crate) fn lease_of(
    owner: String,
    generation: i64,
    until: i64,
    op: Operation,
) -> Result<Lease, Error> {
    match (u64::try_from(generation), u64::try_from(until)) {
        (Ok(generation), Ok(until_ms)) if generation > 0 => Ok(Lease {
            owner,
            generation,
            until_ms,
        }),
        _ => Err(Error::store(op, Evidence::Unknown, Reason::CorruptLease)),
    }
}

pub(crate) fn assigned_of(
    kind: &str,
    scope: String,
    id: String,
    op: Operation,
) -> Result<Assigned, Error> {
    let key = RecordKey { scope, id };
    if kind == RecordKind::Execution.as_str() {
        Ok(Assigned::Execution(key))
    } else if kind == RecordKind::Machine.as_str() {
        Ok(Assigned::Machine(key))
    } else {
        Err(Error::store(
            op,
            Evidence::Unknown,
            Reason::CorruptAssignment,
        ))
    }
}
