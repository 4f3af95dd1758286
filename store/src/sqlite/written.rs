//! The records one SQLite store handle committed last, served instead of
//! reading their rows again while no other connection has committed to the
//! file (session 11; docs/decisions/store.md, "SQLite: the records a handle
//! wrote, trusted while the file's data version stands").
//!
//! SQLite's `PRAGMA data_version` is per connection: it stays put across
//! this connection's own commits and differs once any other connection
//! (another handle, another process, a tool) has committed to the file. A
//! transaction begins by reading it (after `BEGIN`, so the value belongs
//! to the transaction's snapshot; a write transaction holds the write lock
//! from `BEGIN`, so nothing commits between its snapshot and its commit).
//! When it equals the value of this handle's last committed write, every
//! row this handle wrote last still holds exactly what it wrote: the guard
//! read before a write (and any read of such a record) is answered with that
//! record, without the select, the decryption or the projection check.
//! Anything else (another value, no value yet, a failed transaction) empties
//! the entries, and every read takes the full path.

use std::collections::HashMap;
use std::sync::Arc;

use smolbox_core::managed::{ExecutionRecord, MachineRecord, RecordKey};

/// Most records remembered per kind; when full, the entries are emptied.
pub(super) const WRITTEN_ENTRIES: usize = 256;

/// The entries and the data version they are valid at.
#[derive(Debug, Default)]
pub(super) struct Written {
    /// `PRAGMA data_version` of this handle's last committed write; `None`
    /// trusts nothing.
    data_version: Option<i64>,
    execs: HashMap<RecordKey, Arc<ExecutionRecord>>,
    machines: HashMap<RecordKey, Arc<MachineRecord>>,
}

/// What one transaction wrote, applied to [`Written`] only once it committed.
#[derive(Debug, Default)]
pub(super) struct Pending {
    pub(super) execs: Vec<Arc<ExecutionRecord>>,
    pub(super) machines: Vec<Arc<MachineRecord>>,
}

impl Written {
    /// At a transaction's start, with its data version: whether the
    /// entries may answer its reads. A version other than the one of the
    /// last committed write empties them.
    pub(super) fn begin(&mut self, data_version: i64) -> bool {
        if self.data_version == Some(data_version) {
            true
        } else {
            self.forget();
            false
        }
    }

    /// Forgets everything (a failed write transaction, another version).
    pub(super) fn forget(&mut self) {
        self.data_version = None;
        self.execs.clear();
        self.machines.clear();
    }

    pub(super) fn exec(&self, key: &RecordKey) -> Option<ExecutionRecord> {
        self.execs.get(key).map(|r| ExecutionRecord::clone(r))
    }

    pub(super) fn machine(&self, key: &RecordKey) -> Option<MachineRecord> {
        self.machines.get(key).map(|r| MachineRecord::clone(r))
    }

    /// After a write transaction begun at `data_version` committed: its
    /// records are the rows' contents now, and the version is this
    /// handle's.
    pub(super) fn committed(&mut self, data_version: i64, pending: Pending) {
        if self.data_version != Some(data_version) {
            // The transaction began at another version: the entries from
            // before it are already gone (`begin`), the ones it wrote hold.
            self.forget();
        }
        for rec in pending.execs {
            if self.execs.len() >= WRITTEN_ENTRIES && !self.execs.contains_key(&rec.key) {
                self.execs.clear();
            }
            self.execs.insert(rec.key.clone(), rec);
        }
        for rec in pending.machines {
            if self.machines.len() >= WRITTEN_ENTRIES && !self.machines.contains_key(&rec.key) {
                self.machines.clear();
            }
            self.machines.insert(rec.key.clone(), rec);
        }
        self.data_version = Some(data_version);
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.execs.len() + self.machines.len()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

    use super::*;
    use smolbox_core::managed::state::ExecState;
    use smolbox_core::managed::testkit;

    fn pending(i: usize) -> Pending {
        let key = testkit::key("s", &format!("w{i}"));
        Pending {
            execs: vec![Arc::new(
                testkit::exec_in(ExecState::Accepted, key, 1_000).unwrap(),
            )],
            machines: Vec::new(),
        }
    }

    /// At most `WRITTEN_ENTRIES` records per kind: the 256th is kept with
    /// every earlier one; one more empties them before it is kept.
    #[test]
    fn entries_are_bounded_at_n_and_emptied_at_n_plus_one() {
        let mut w = Written::default();
        for i in 0..WRITTEN_ENTRIES {
            w.committed(7, pending(i));
        }
        assert_eq!(w.len(), WRITTEN_ENTRIES);
        assert!(w.begin(7));
        assert!(w.exec(&testkit::key("s", "w0")).is_some());
        // Writing a kept key again does not empty them.
        w.committed(7, pending(0));
        assert_eq!(w.len(), WRITTEN_ENTRIES);
        w.committed(7, pending(WRITTEN_ENTRIES));
        assert_eq!(w.len(), 1);
        assert!(w.exec(&testkit::key("s", "w0")).is_none());
        assert!(
            w.exec(&testkit::key("s", &format!("w{WRITTEN_ENTRIES}")))
                .is_some()
        );
        // Another data version trusts nothing.
        assert!(!w.begin(8));
        assert_eq!(w.len(), 0);
    }
}
