//! The in-memory adapter (C18.2): explicitly ephemeral, one serialized
//! owner (a mutex), bounded by record count, encoded bytes and worker
//! leases. It keeps completed identities (so duplicates still resolve) and
//! therefore eventually refuses with `admission_exhausted`. A durable
//! runtime refuses it (`StoreInfo::durable` is false).
//!
//! A transaction runs on a copy of the state that replaces the original
//! only when the operation succeeds, so a failure changes nothing.

use smolbox_core::Reason;
use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::{Mutex, PoisonError};

#[cfg(any(feature = "sqlite", feature = "postgres", feature = "testkit"))]
use smolbox_core::managed::RecordKind;
use smolbox_core::managed::envelope::{encode_exec_validated, encode_machine_validated};
use smolbox_core::managed::record::Resources;
use smolbox_core::managed::{ExecutionRecord, Lease, MachineRecord, MachineRecordState, RecordKey};
use smolbox_core::{Error, Operation};

use crate::engine::{Backend, Handle, Lock, Tx};
use crate::{Assigned, DueCursor, impl_store};

/// Default record bound (C18.2).
pub const DEFAULT_MAX_RECORDS: usize = 256;
/// Largest record bound (C18.2).
pub const MAX_RECORDS: usize = 10_000;
/// Default encoded-bytes bound: 64 MiB (C18.2).
pub const DEFAULT_MAX_BYTES: usize = 64 * 1024 * 1024;
/// Largest encoded-bytes bound: 1 GiB (C18.2).
pub const MAX_BYTES: usize = 1024 * 1024 * 1024;
/// Most worker leases (C18.2).
pub const MAX_LEASES: usize = 64;

/// Bounds of a [`MemoryStore`]. Worst-case memory is about `max_bytes`
/// twice over (records are kept decoded and their encoded size counted).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryConfig {
    /// Execution plus machine records, 1–10,000 (default 256).
    pub max_records: usize,
    /// Encoded bytes of all records, 1 B – 1 GiB (default 64 MiB).
    pub max_bytes: usize,
}

impl Default for MemoryConfig {
    fn default() -> Self {
        Self {
            max_records: DEFAULT_MAX_RECORDS,
            max_bytes: DEFAULT_MAX_BYTES,
        }
    }
}

/// The ephemeral, bounded in-memory store.
#[derive(Debug)]
pub struct MemoryStore {
    config: MemoryConfig,
    state: Mutex<MemState>,
    /// Durability (none), rollback marks and commit count.
    handle: Handle,
}

#[derive(Clone, Debug, Default)]
struct MemState {
    execs: BTreeMap<RecordKey, (ExecutionRecord, usize)>,
    machines: BTreeMap<RecordKey, (MachineRecord, usize)>,
    leases: BTreeMap<String, Lease>,
    assignments: BTreeMap<(String, String), Assigned>,
    ports: BTreeMap<(String, u16), RecordKey>,
    bytes: usize,
}

impl MemoryStore {
    /// A new, empty store.
    ///
    /// # Errors
    /// `validation` when a bound is out of range.
    pub fn new(config: MemoryConfig) -> Result<Self, Error> {
        if !(1..=MAX_RECORDS).contains(&config.max_records) {
            return Err(Error::validation(Operation::Config, Reason::MaxRecords)
                .with_limit(config.max_records as u64, MAX_RECORDS as u64));
        }
        if !(1..=MAX_BYTES).contains(&config.max_bytes) {
            return Err(Error::validation(Operation::Config, Reason::MaxBytes)
                .with_limit(config.max_bytes as u64, MAX_BYTES as u64));
        }
        Ok(Self {
            config,
            state: Mutex::new(MemState::default()),
            handle: Handle::new(false),
        })
    }
}

/// A copy of one stored record as the memory store holds it (or its
/// absence), taken behind the engine's back by
/// [`MemoryStore::testkit_snapshot`]: the rollback tests' whole-row swap.
#[cfg(feature = "testkit")]
#[derive(Clone, Debug)]
pub struct MemorySnapshot {
    key: RecordKey,
    exec: Option<Option<(ExecutionRecord, usize)>>,
    machine: Option<Option<(MachineRecord, usize)>>,
}

#[cfg(feature = "testkit")]
impl MemoryStore {
    /// Test kit: a copy of the stored record `key` of `kind` (or its
    /// absence), bypassing every rule and the rollback marks.
    pub fn testkit_snapshot(&self, kind: RecordKind, key: &RecordKey) -> MemorySnapshot {
        let s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let machine = kind == RecordKind::Machine;
        MemorySnapshot {
            key: key.clone(),
            exec: (!machine).then(|| s.execs.get(key).cloned()),
            machine: machine.then(|| s.machines.get(key).cloned()),
        }
    }

    /// Test kit: puts a snapshot back as stored (a whole-row rollback
    /// behind the store's back), bypassing every rule.
    pub fn testkit_restore(&self, snap: &MemorySnapshot) {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(row) = &snap.exec {
            if let Some((_, size)) = s.execs.remove(&snap.key) {
                s.bytes -= size;
            }
            if let Some((rec, size)) = row {
                s.bytes += size;
                s.execs.insert(snap.key.clone(), (rec.clone(), *size));
            }
        }
        if let Some(row) = &snap.machine {
            if let Some((_, size)) = s.machines.remove(&snap.key) {
                s.bytes -= size;
            }
            if let Some((rec, size)) = row {
                s.bytes += size;
                s.machines.insert(snap.key.clone(), (rec.clone(), *size));
            }
        }
    }
}

impl Backend for MemoryStore {
    fn handle(&self) -> &Handle {
        &self.handle
    }

    fn run_transaction<R>(
        &self,
        _op: Operation,
        lock: Lock,
        f: &mut dyn FnMut(&mut dyn Tx) -> Result<R, Error>,
    ) -> Result<R, Error> {
        // A poisoned lock means a panic mid-operation; a write's changes
        // are undone when it fails or unwinds (`MemTx`'s drop), so the
        // state it guards is still consistent.
        let mut guard = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let mut tx = MemTx {
            s: &mut guard,
            config: self.config,
            undo: Vec::new(),
        };
        if lock == Lock::Read {
            // A read changes nothing; keep it as it ran.
            let out = f(&mut tx);
            tx.undo.clear();
            return out;
        }
        let out = f(&mut tx)?;
        // Committed (counted by `Backend::transact`): nothing to undo.
        tx.undo.clear();
        Ok(out)
    }
}

impl_store!(MemoryStore);

/// A transaction on the store's state. A write changes the state in place
/// and journals the previous value of every entry it touches; unless it
/// commits (the journal is emptied), dropping it puts them back, newest
/// first, so a failed or panicking write changes nothing. A write costs
/// what it touches, not a copy of every record (issue 16, session 7).
struct MemTx<'a> {
    s: &'a mut MemState,
    config: MemoryConfig,
    undo: Vec<Undo>,
}

/// The previous value of one entry a write changed.
// A write journals a few entries; boxing the records would add an
// allocation per entry for nothing.
#[allow(clippy::large_enum_variant)]
enum Undo {
    Exec(RecordKey, Option<(ExecutionRecord, usize)>),
    Machine(RecordKey, Option<(MachineRecord, usize)>),
    Lease(String, Option<Lease>),
    Assignment((String, String), Option<Assigned>),
    Port((String, u16), Option<RecordKey>),
    Bytes(usize),
}

/// Puts `old` back under `key` (or removes the entry when there was none).
fn restore<K: Ord, V>(map: &mut BTreeMap<K, V>, key: K, old: Option<V>) {
    match old {
        Some(v) => {
            map.insert(key, v);
        }
        None => {
            map.remove(&key);
        }
    }
}

impl Drop for MemTx<'_> {
    fn drop(&mut self) {
        while let Some(u) = self.undo.pop() {
            let s = &mut *self.s;
            match u {
                Undo::Exec(k, old) => restore(&mut s.execs, k, old),
                Undo::Machine(k, old) => restore(&mut s.machines, k, old),
                Undo::Lease(k, old) => restore(&mut s.leases, k, old),
                Undo::Assignment(k, old) => restore(&mut s.assignments, k, old),
                Undo::Port(k, old) => restore(&mut s.ports, k, old),
                Undo::Bytes(b) => s.bytes = b,
            }
        }
    }
}

impl MemTx<'_> {
    fn admit(&mut self, old: usize, new: usize, inserting: bool) -> Result<(), Error> {
        let op = Operation::StoreWrite;
        let records = self.s.execs.len() + self.s.machines.len();
        if inserting && records >= self.config.max_records {
            return Err(Error::admission_exhausted(op, Reason::MemoryRecords)
                .with_limit(records as u64 + 1, self.config.max_records as u64));
        }
        let bytes = self.s.bytes - old + new;
        if bytes > self.config.max_bytes {
            return Err(Error::admission_exhausted(op, Reason::MemoryBytes)
                .with_limit(bytes as u64, self.config.max_bytes as u64));
        }
        self.undo.push(Undo::Bytes(self.s.bytes));
        self.s.bytes = bytes;
        Ok(())
    }
}

impl Tx for MemTx<'_> {
    fn exec(&mut self, key: &RecordKey) -> Result<Option<ExecutionRecord>, Error> {
        Ok(self.s.execs.get(key).map(|(r, _)| r.clone()))
    }

    fn put_exec(&mut self, rec: &ExecutionRecord, new: bool) -> Result<(), Error> {
        let size = encode_exec_validated(rec)?.len();
        let old = self.s.execs.get(&rec.key).map_or(0, |(_, n)| *n);
        self.admit(old, size, new)?;
        let old = self.s.execs.insert(rec.key.clone(), (rec.clone(), size));
        self.undo.push(Undo::Exec(rec.key.clone(), old));
        Ok(())
    }

    fn pending_count(&mut self) -> Result<u64, Error> {
        Ok(self
            .s
            .execs
            .values()
            .filter(|(r, _)| r.state.is_pending())
            .count() as u64)
    }

    fn machine(&mut self, key: &RecordKey) -> Result<Option<MachineRecord>, Error> {
        Ok(self.s.machines.get(key).map(|(r, _)| r.clone()))
    }

    fn put_machine(&mut self, rec: &MachineRecord, new: bool) -> Result<(), Error> {
        let size = encode_machine_validated(rec)?.len();
        let old = self.s.machines.get(&rec.key).map_or(0, |(_, n)| *n);
        self.admit(old, size, new)?;
        let old = self.s.machines.insert(rec.key.clone(), (rec.clone(), size));
        self.undo.push(Undo::Machine(rec.key.clone(), old));
        Ok(())
    }

    fn lease(&mut self, worker_id: &str) -> Result<Option<Lease>, Error> {
        Ok(self.s.leases.get(worker_id).cloned())
    }

    fn put_lease(&mut self, worker_id: &str, lease: &Lease, new: bool) -> Result<(), Error> {
        if new && self.s.leases.len() >= MAX_LEASES {
            return Err(
                Error::admission_exhausted(Operation::StoreClaim, Reason::MemoryLeases)
                    .with_limit(self.s.leases.len() as u64 + 1, MAX_LEASES as u64),
            );
        }
        let old = self.s.leases.insert(worker_id.to_owned(), lease.clone());
        self.undo.push(Undo::Lease(worker_id.to_owned(), old));
        Ok(())
    }

    fn assignment(&mut self, worker_id: &str, name: &str) -> Result<Option<Assigned>, Error> {
        Ok(self
            .s
            .assignments
            .get(&(worker_id.to_owned(), name.to_owned()))
            .cloned())
    }

    fn put_assignment(&mut self, worker_id: &str, name: &str, who: &Assigned) -> Result<(), Error> {
        let key = (worker_id.to_owned(), name.to_owned());
        let old = self.s.assignments.insert(key.clone(), who.clone());
        self.undo.push(Undo::Assignment(key, old));
        Ok(())
    }

    fn port_owner(&mut self, worker_id: &str, port: u16) -> Result<Option<RecordKey>, Error> {
        Ok(self.s.ports.get(&(worker_id.to_owned(), port)).cloned())
    }

    fn put_port(&mut self, worker_id: &str, port: u16, owner: &RecordKey) -> Result<(), Error> {
        let key = (worker_id.to_owned(), port);
        let old = self.s.ports.insert(key.clone(), owner.clone());
        self.undo.push(Undo::Port(key, old));
        Ok(())
    }

    fn delete_ports(&mut self, owner: &RecordKey) -> Result<(), Error> {
        let held: Vec<(String, u16)> = self
            .s
            .ports
            .iter()
            .filter(|(_, k)| *k == owner)
            .map(|(p, _)| p.clone())
            .collect();
        for p in held {
            let old = self.s.ports.remove(&p);
            self.undo.push(Undo::Port(p, old));
        }
        Ok(())
    }

    fn usage(&mut self, worker_id: &str) -> Result<Resources, Error> {
        let held = |a: Option<&smolbox_core::managed::record::Assignment>, r: Option<Resources>| {
            r.filter(|_| a.is_some_and(|a| a.worker_id == worker_id))
        };
        let execs = self
            .s
            .execs
            .values()
            .filter_map(|(r, _)| held(r.assignment.as_ref(), r.reservation));
        let machines = self
            .s
            .machines
            .values()
            .filter_map(|(r, _)| held(r.assignment.as_ref(), r.reservation));
        Ok(execs
            .chain(machines)
            .fold(Resources::default(), Resources::plus))
    }

    fn due(
        &mut self,
        now_ms: u64,
        after: Option<&DueCursor>,
        limit: u32,
    ) -> Result<Vec<ExecutionRecord>, Error> {
        let mut due: Vec<(u64, &RecordKey, &ExecutionRecord)> = self
            .s
            .execs
            .values()
            .filter_map(|(r, _)| r.next_due_at_ms.map(|d| (d, &r.key, r)))
            .filter(|(d, k, _)| {
                *d <= now_ms && after.is_none_or(|c| (*d, *k) > (c.due_at_ms, &c.key))
            })
            .collect();
        due.sort_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
        Ok(due
            .into_iter()
            .take(limit as usize)
            .map(|(_, _, r)| r.clone())
            .collect())
    }

    fn pending_machines(&mut self) -> Result<u64, Error> {
        Ok(self
            .s
            .machines
            .values()
            .filter(|(r, _)| r.state != MachineRecordState::Deleted)
            .count() as u64)
    }

    fn due_machines(
        &mut self,
        now_ms: u64,
        after: Option<&DueCursor>,
        limit: u32,
    ) -> Result<Vec<MachineRecord>, Error> {
        let mut due: Vec<(u64, &RecordKey, &MachineRecord)> = self
            .s
            .machines
            .values()
            .filter_map(|(r, _)| r.next_due_at_ms.map(|d| (d, &r.key, r)))
            .filter(|(d, k, _)| {
                *d <= now_ms && after.is_none_or(|c| (*d, *k) > (c.due_at_ms, &c.key))
            })
            .collect();
        due.sort_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
        Ok(due
            .into_iter()
            .take(limit as usize)
            .map(|(_, _, r)| r.clone())
            .collect())
    }

    fn list_execs(
        &mut self,
        scope: &str,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Vec<ExecutionRecord>, Error> {
        Ok(page_of(&self.s.execs, scope, after, limit))
    }

    fn list_machines(
        &mut self,
        scope: &str,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Vec<MachineRecord>, Error> {
        Ok(page_of(&self.s.machines, scope, after, limit))
    }

    // Nothing is sealed in memory: there is no key to check.
    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    fn key_check(&mut self) -> Result<Option<Vec<u8>>, Error> {
        Ok(None)
    }

    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    fn put_key_check(&mut self, _check: &[u8]) -> Result<(), Error> {
        Ok(())
    }

    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    fn row_formats(&mut self) -> Result<Vec<(RecordKind, RecordKey, bool)>, Error> {
        Ok(Vec::new())
    }
}

/// The records of `scope` with id > `after` in key order (the map is
/// ordered by `(scope, id)`).
fn page_of<T: Clone>(
    map: &BTreeMap<RecordKey, (T, usize)>,
    scope: &str,
    after: Option<&str>,
    limit: u32,
) -> Vec<T> {
    let start = RecordKey {
        scope: scope.to_owned(),
        id: after.unwrap_or_default().to_owned(),
    };
    let lower = match after {
        Some(_) => Bound::Excluded(start),
        None => Bound::Included(start),
    };
    map.range((lower, Bound::Unbounded))
        .take_while(|(k, _)| k.scope == scope)
        .take(limit as usize)
        .map(|(_, (r, _))| r.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code

    use smolbox_core::managed::testkit;
    use smolbox_core::{Evidence, Reason};

    use super::*;

    /// The whole state (a panicked write poisons the lock; it is still read).
    fn state(s: &MemoryStore) -> String {
        format!(
            "{:?}",
            *s.state.lock().unwrap_or_else(PoisonError::into_inner)
        )
    }

    /// Changes every kind of entry, then fails (or panics) at the end.
    fn write_all(tx: &mut dyn Tx, fail: bool) -> Result<(), Error> {
        let key = testkit::key("s", "a");
        let rec = testkit::accepted(key.clone(), testkit::exec_spec("s"), 1);
        tx.put_exec(&rec, false)?;
        tx.put_exec(
            &testkit::accepted(testkit::key("s", "new"), testkit::exec_spec("s"), 1),
            true,
        )?;
        let lease = Lease {
            owner: "other".into(),
            generation: 2,
            until_ms: 9,
        };
        tx.put_lease("w", &lease, false)?;
        tx.put_assignment("w", "m2", &Assigned::Execution(key.clone()))?;
        tx.put_port("w", 80, &testkit::key("s", "new"))?;
        tx.delete_ports(&key)?;
        tx.put_port("w", 81, &key)?;
        if fail {
            return Err(Error::store(
                Operation::StoreWrite,
                Evidence::NotDispatched,
                Reason::StoreThreadLost,
            ));
        }
        panic!("a panic mid-write");
    }

    #[test]
    fn a_failed_or_panicking_write_changes_nothing_and_a_committed_one_everything() {
        let s = MemoryStore::new(MemoryConfig::default()).unwrap();
        let key = testkit::key("s", "a");
        s.transact(Operation::StoreWrite, Lock::Record, &mut |tx| {
            tx.put_exec(
                &testkit::accepted(key.clone(), testkit::exec_spec("first"), 0),
                true,
            )?;
            tx.put_lease(
                "w",
                &Lease {
                    owner: "me".into(),
                    generation: 1,
                    until_ms: 5,
                },
                true,
            )?;
            tx.put_assignment("w", "m1", &Assigned::Execution(key.clone()))?;
            tx.put_port("w", 80, &key)?;
            tx.put_port("w", 90, &key)
        })
        .unwrap();
        let before = state(&s);
        let commits = s.handle.commits();
        let failed = s.transact(Operation::StoreWrite, Lock::Record, &mut |tx| {
            write_all(tx, true)
        });
        assert_eq!(failed.unwrap_err().reason(), Reason::StoreThreadLost);
        assert_eq!(state(&s), before);
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            s.transact(Operation::StoreWrite, Lock::Record, &mut |tx| {
                write_all(tx, false)
            })
        }));
        assert!(panicked.is_err());
        assert_eq!(state(&s), before);
        assert_eq!(s.handle.commits(), commits);
        // The same changes committed are all there (the check above could
        // fail: the journal is what undid them).
        s.transact(Operation::StoreWrite, Lock::Record, &mut |tx| {
            let _ = write_all(tx, true);
            Ok(())
        })
        .unwrap();
        let after = state(&s);
        assert_ne!(after, before);
        let st = s.state.lock().unwrap_or_else(PoisonError::into_inner);
        assert_eq!(st.execs.len(), 2);
        assert_eq!(st.leases["w"].owner, "other");
        assert_eq!(st.assignments.len(), 2);
        assert_eq!(
            st.ports.keys().cloned().collect::<Vec<_>>(),
            [("w".to_owned(), 80), ("w".to_owned(), 81)]
        );
    }
}
