//! Which columns an update of a record row sets (session 11). SQLite
//! rewrites the entries of every index whose columns an `UPDATE` names,
//! whether or not their values change: setting all thirteen columns on
//! every write rewrote the due, pending and worker index entries (a WAL
//! frame each) at every commit. An update sets the payload and every
//! column no index holds, and an indexed column only when its value
//! differs from what the row holds: known from the record this transaction
//! read (checked against the row, or the handle's own last write while no
//! other connection committed, `written`) or wrote. Without such knowledge
//! every column is set.

use std::sync::OnceLock;

use smolbox_core::managed::{ExecutionRecord, MachineRecord};

use crate::row::{Projection, exec_indexed, machine_indexed};

/// A record table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Table {
    Executions,
    Machines,
}

/// The next due time is indexed (both tables).
const DUE: u8 = 1;
/// The pending flag is indexed (executions only).
const PENDING: u8 = 2;
/// The worker is indexed (both tables).
const WORKER: u8 = 4;

impl Table {
    fn name(self) -> &'static str {
        match self {
            Self::Executions => "executions",
            Self::Machines => "machines",
        }
    }

    /// The insert of a new row.
    pub(super) fn insert_sql(self) -> &'static str {
        static SQL: OnceLock<[String; 2]> = OnceLock::new();
        let sql = SQL.get_or_init(|| {
            [Self::Executions, Self::Machines].map(|t| {
                format!(
                    "INSERT INTO {} (partition, scope, id, {}) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)",
                    t.name(),
                    super::COLS
                )
            })
        });
        &sql[self as usize]
    }

    /// The update setting the payload, every column no index of this table
    /// holds, and the indexed columns in `changed` ([`Indexed::changed`]).
    /// Every form takes the same sixteen parameters.
    pub(super) fn update_sql(self, changed: u8) -> &'static str {
        static SQL: OnceLock<Vec<String>> = OnceLock::new();
        let sql = SQL.get_or_init(|| {
            let mut all = Vec::with_capacity(16);
            for t in [Self::Executions, Self::Machines] {
                for mask in 0..8u8 {
                    let mut set = String::from(
                        "payload = ?4, fingerprint = ?5, state = ?6, version = ?7, \
                         machine_name = ?11, slots = ?12, cpus = ?13, memory_mb = ?14, \
                         disk_gb = ?15, managed_machine = ?16",
                    );
                    if mask & DUE != 0 {
                        set.push_str(", next_due_ms = ?8");
                    }
                    if mask & PENDING != 0 || t == Self::Machines {
                        set.push_str(", pending = ?9");
                    }
                    if mask & WORKER != 0 {
                        set.push_str(", worker_id = ?10");
                    }
                    all.push(format!(
                        "UPDATE {} SET {set} WHERE partition = ?1 AND scope = ?2 AND id = ?3",
                        t.name()
                    ));
                }
            }
            all
        });
        &sql[self as usize * 8 + usize::from(changed & Indexed::ALL)]
    }
}

/// The indexed columns of a record row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Indexed {
    next_due_ms: Option<i64>,
    pending: bool,
    worker_id: Option<String>,
}

impl Indexed {
    /// Every indexed column.
    pub(super) const ALL: u8 = DUE | PENDING | WORKER;

    pub(super) fn of(p: &Projection) -> Self {
        Self {
            next_due_ms: p.next_due_ms,
            pending: p.pending,
            worker_id: p.worker_id.clone(),
        }
    }

    pub(super) fn of_exec(r: &ExecutionRecord) -> Self {
        Self::of_parts(exec_indexed(r))
    }

    pub(super) fn of_machine(r: &MachineRecord) -> Self {
        Self::of_parts(machine_indexed(r))
    }

    fn of_parts((next_due_ms, pending, worker_id): (Option<i64>, bool, Option<&str>)) -> Self {
        Self {
            next_due_ms,
            pending,
            worker_id: worker_id.map(str::to_owned),
        }
    }

    /// The indexed columns whose value `now` changes.
    pub(super) fn changed(&self, now: &Self) -> u8 {
        let mut mask = 0;
        if self.next_due_ms != now.next_due_ms {
            mask |= DUE;
        }
        if self.pending != now.pending {
            mask |= PENDING;
        }
        if self.worker_id != now.worker_id {
            mask |= WORKER;
        }
        mask
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn every_form_names_the_sixteen_parameters_and_only_changed_indexed_columns() {
        for t in [Table::Executions, Table::Machines] {
            for mask in 0..8u8 {
                let sql = t.update_sql(mask);
                assert!(sql.contains("?16") && sql.contains("?1 "));
                assert_eq!(sql.contains("next_due_ms"), mask & DUE != 0);
                assert_eq!(sql.contains("worker_id"), mask & WORKER != 0);
                // Machines have no pending index: always set.
                assert_eq!(
                    sql.contains("pending"),
                    mask & PENDING != 0 || t == Table::Machines
                );
            }
            assert_eq!(t.update_sql(Indexed::ALL).matches(" = ?").count(), 16);
        }
    }
}
