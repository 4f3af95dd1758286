//! Stored-data rollback detection within one store handle's life (issue 17
//! item 4; docs/decisions/hardening.md, "Stored-data rollback: the
//! per-process mark").
//!
//! A record's write counter only grows, and no record is ever deleted, so a
//! row read back at a lower counter than this handle already saw committed
//! (or gone after it was seen) was rolled back: a whole row swapped back
//! with its own sealed payload, which the payload's authentication cannot
//! show. The counter is what every write moves: an execution's `version`,
//! a machine's [`MachineRecord::revision`] (`version + claims`: a claim
//! take or renewal moves `claims`, not `version`, so a mark on the version
//! alone would miss a rolled-back renewal; [`mark_of`]).
//! Every engine operation runs through [`run`], which wraps the adapter's
//! transaction in [`Watched`]:
//!
//! - a single-record read (`exec`, `machine`, inside any operation) of a
//!   key below its mark fails the operation with `store` /
//!   `record_went_back` before anything is written or returned;
//! - a due scan leaves such a record out of its page (the page's cursor
//!   still comes from the raw page, so later records are not skipped): a
//!   rolled-back record that is still due is not picked up as if new;
//! - the marks are fed only after the transaction committed: with the
//!   versions the operation read and the versions it wrote.
//!
//! Memory is bounded: at most [`MAX_WATCHED_KEYS`] keys, the least recently
//! seen forgotten first (a forgotten key is no longer checked). The mark is
//! per handle: another handle (another process, or a handle opened again)
//! starts with no marks, and a rollback of the whole database before a
//! handle opens is not detectable from inside it.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, PoisonError};

use smolbox_core::managed::record::Resources;
use smolbox_core::managed::{ExecutionRecord, Lease, MachineRecord, RecordKey, RecordKind};
use smolbox_core::{Error, Evidence, Operation, Reason};

use crate::engine::{Backend, Lock, Tx};
use crate::{Assigned, DueCursor};

/// The most keys a store handle remembers a version for: 16,384 (at most
/// about 11 MiB, with every key two 128-byte identifiers; far less for
/// usual keys). The least recently seen key is forgotten first.
pub const MAX_WATCHED_KEYS: usize = 16_384;

type Mark = (RecordKind, RecordKey);

/// The highest committed write counter seen per key ([`mark_of`]), least
/// recently seen forgotten first. A key already remembered is looked up
/// and moved to the most recent place without copying it (session 11:
/// the marks cost 4 k instructions per transaction in key copies).
#[derive(Debug)]
struct HighWater {
    cap: usize,
    tick: u64,
    /// Per kind ([`slot`]): key → (highest counter, tick last seen).
    versions: [HashMap<RecordKey, (u64, u64)>; 2],
    order: BTreeMap<u64, Mark>,
}

/// The index of a kind's map in [`HighWater::versions`].
const fn slot(kind: RecordKind) -> usize {
    match kind {
        RecordKind::Execution => 0,
        RecordKind::Machine => 1,
    }
}

impl HighWater {
    fn new(cap: usize) -> Self {
        Self {
            cap,
            tick: 0,
            versions: [HashMap::new(), HashMap::new()],
            order: BTreeMap::new(),
        }
    }

    fn len(&self) -> usize {
        self.versions[0].len() + self.versions[1].len()
    }

    fn highest(&self, kind: RecordKind, key: &RecordKey) -> Option<u64> {
        self.versions[slot(kind)].get(key).map(|&(v, _)| v)
    }

    fn note(&mut self, kind: RecordKind, key: &RecordKey, version: u64) {
        self.tick += 1;
        let tick = self.tick;
        if let Some((highest, seen)) = self.versions[slot(kind)].get_mut(key) {
            *highest = (*highest).max(version);
            let mark = self
                .order
                .remove(seen)
                .unwrap_or_else(|| (kind, key.clone()));
            *seen = tick;
            self.order.insert(tick, mark);
            return;
        }
        self.versions[slot(kind)].insert(key.clone(), (version, tick));
        self.order.insert(tick, (kind, key.clone()));
        while self.len() > self.cap {
            let Some((_, (kind, oldest))) = self.order.pop_first() else {
                break;
            };
            self.versions[slot(kind)].remove(&oldest);
        }
    }
}

/// One store handle's marks (shared by its threads).
#[derive(Debug)]
pub(crate) struct Marks(Mutex<HighWater>);

impl Default for Marks {
    fn default() -> Self {
        Self::with_capacity(MAX_WATCHED_KEYS)
    }
}

impl Marks {
    pub(crate) fn with_capacity(cap: usize) -> Self {
        Self(Mutex::new(HighWater::new(cap.max(1))))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HighWater> {
        // Every update leaves the marks consistent, so a panic elsewhere
        // while the lock was held leaves nothing half done.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn highest(&self, kind: RecordKind, key: &RecordKey) -> Option<u64> {
        self.lock().highest(kind, key)
    }

    fn note_all(&self, seen: &[(RecordKind, RecordKey, u64)]) {
        let mut hw = self.lock();
        for (kind, key, version) in seen {
            hw.note(*kind, key, *version);
        }
    }

    /// How many keys are remembered.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().len()
    }
}

/// Runs `f` in the backend's transaction behind [`Watched`]; the marks
/// take what it read and wrote only once it committed.
pub(crate) fn run<B: Backend, R>(
    b: &B,
    op: Operation,
    lock: Lock,
    f: &mut dyn FnMut(&mut dyn Tx) -> Result<R, Error>,
) -> Result<R, Error> {
    let marks = b.marks();
    let mut seen = Vec::new();
    let out = b.transact(op, lock, &mut |tx| {
        // A backend may run the closure again (a serialization retry):
        // only the last run's observations count.
        seen.clear();
        let mut w = Watched {
            inner: tx,
            marks,
            seen: &mut seen,
            op,
        };
        f(&mut w)
    })?;
    marks.note_all(&seen);
    Ok(out)
}

/// A transaction that checks every record read against the marks and
/// notes what it reads and writes.
struct Watched<'a, 'b> {
    inner: &'a mut dyn Tx,
    marks: &'b Marks,
    seen: &'a mut Vec<(RecordKind, RecordKey, u64)>,
    op: Operation,
}

/// A machine record's mark: its revision, which every write moves (a
/// claim renewal included), where its version stays put on a claim.
pub(crate) const fn mark_of(rec: &MachineRecord) -> u64 {
    rec.revision()
}

fn went_back(op: Operation) -> Error {
    Error::store(op, Evidence::Unknown, Reason::RecordWentBack)
}

impl Watched<'_, '_> {
    /// A single read: below the mark, or gone after it was seen, is a
    /// rollback.
    fn check(
        &mut self,
        kind: RecordKind,
        key: &RecordKey,
        version: Option<u64>,
    ) -> Result<(), Error> {
        match (self.marks.highest(kind, key), version) {
            (Some(mark), Some(v)) if v < mark => Err(went_back(self.op)),
            (Some(_), None) => Err(went_back(self.op)),
            (_, Some(v)) => {
                self.seen.push((kind, key.clone(), v));
                Ok(())
            }
            (None, None) => Ok(()),
        }
    }

    fn scanned(&mut self, kind: RecordKind, key: &RecordKey, version: u64) {
        if !self.behind(kind, key, version) {
            self.seen.push((kind, key.clone(), version));
        }
    }
}

impl Tx for Watched<'_, '_> {
    fn exec(&mut self, key: &RecordKey) -> Result<Option<ExecutionRecord>, Error> {
        let r = self.inner.exec(key)?;
        self.check(RecordKind::Execution, key, r.as_ref().map(|r| r.version))?;
        Ok(r)
    }
    fn put_exec(&mut self, rec: &ExecutionRecord, new: bool) -> Result<(), Error> {
        self.inner.put_exec(rec, new)?;
        self.seen
            .push((RecordKind::Execution, rec.key.clone(), rec.version));
        Ok(())
    }
    fn pending_count(&mut self) -> Result<u64, Error> {
        self.inner.pending_count()
    }
    fn machine(&mut self, key: &RecordKey) -> Result<Option<MachineRecord>, Error> {
        let r = self.inner.machine(key)?;
        self.check(RecordKind::Machine, key, r.as_ref().map(mark_of))?;
        Ok(r)
    }
    fn put_machine(&mut self, rec: &MachineRecord, new: bool) -> Result<(), Error> {
        self.inner.put_machine(rec, new)?;
        self.seen
            .push((RecordKind::Machine, rec.key.clone(), mark_of(rec)));
        Ok(())
    }
    fn lease(&mut self, worker_id: &str) -> Result<Option<Lease>, Error> {
        self.inner.lease(worker_id)
    }
    fn put_lease(&mut self, worker_id: &str, lease: &Lease, new: bool) -> Result<(), Error> {
        self.inner.put_lease(worker_id, lease, new)
    }
    fn assignment(&mut self, worker_id: &str, name: &str) -> Result<Option<Assigned>, Error> {
        self.inner.assignment(worker_id, name)
    }
    fn put_assignment(&mut self, worker_id: &str, name: &str, who: &Assigned) -> Result<(), Error> {
        self.inner.put_assignment(worker_id, name, who)
    }
    fn port_owner(&mut self, worker_id: &str, port: u16) -> Result<Option<RecordKey>, Error> {
        self.inner.port_owner(worker_id, port)
    }
    fn put_port(&mut self, worker_id: &str, port: u16, owner: &RecordKey) -> Result<(), Error> {
        self.inner.put_port(worker_id, port, owner)
    }
    fn delete_ports(&mut self, owner: &RecordKey) -> Result<(), Error> {
        self.inner.delete_ports(owner)
    }
    fn usage(&mut self, worker_id: &str) -> Result<Resources, Error> {
        self.inner.usage(worker_id)
    }
    fn due(
        &mut self,
        now_ms: u64,
        after: Option<&DueCursor>,
        limit: u32,
    ) -> Result<Vec<ExecutionRecord>, Error> {
        let records = self.inner.due(now_ms, after, limit)?;
        for r in &records {
            self.scanned(RecordKind::Execution, &r.key, r.version);
        }
        Ok(records)
    }
    fn pending_machines(&mut self) -> Result<u64, Error> {
        self.inner.pending_machines()
    }
    fn due_machines(
        &mut self,
        now_ms: u64,
        after: Option<&DueCursor>,
        limit: u32,
    ) -> Result<Vec<MachineRecord>, Error> {
        let records = self.inner.due_machines(now_ms, after, limit)?;
        for r in &records {
            self.scanned(RecordKind::Machine, &r.key, mark_of(r));
        }
        Ok(records)
    }
    fn list_execs(
        &mut self,
        scope: &str,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Vec<ExecutionRecord>, Error> {
        let records = self.inner.list_execs(scope, after, limit)?;
        for r in &records {
            self.scanned(RecordKind::Execution, &r.key, r.version);
        }
        Ok(records)
    }
    fn list_machines(
        &mut self,
        scope: &str,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Vec<MachineRecord>, Error> {
        let records = self.inner.list_machines(scope, after, limit)?;
        for r in &records {
            self.scanned(RecordKind::Machine, &r.key, mark_of(r));
        }
        Ok(records)
    }
    fn behind(&self, kind: RecordKind, key: &RecordKey, version: u64) -> bool {
        self.marks
            .highest(kind, key)
            .is_some_and(|mark| version < mark)
    }
    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    fn key_check(&mut self) -> Result<Option<Vec<u8>>, Error> {
        self.inner.key_check()
    }
    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    fn put_key_check(&mut self, check: &[u8]) -> Result<(), Error> {
        self.inner.put_key_check(check)
    }
    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    fn row_formats(&mut self) -> Result<Vec<(RecordKind, RecordKey, bool)>, Error> {
        self.inner.row_formats()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn k(i: usize) -> RecordKey {
        RecordKey::new("s", &format!("r{i}")).unwrap()
    }

    #[test]
    fn the_highest_version_is_kept_and_a_lower_one_does_not_lower_it() {
        let m = Marks::with_capacity(4);
        m.note_all(&[(RecordKind::Execution, k(0), 5)]);
        m.note_all(&[(RecordKind::Execution, k(0), 3)]);
        assert_eq!(m.highest(RecordKind::Execution, &k(0)), Some(5));
        // Kinds are separate keys.
        assert_eq!(m.highest(RecordKind::Machine, &k(0)), None);
        m.note_all(&[(RecordKind::Execution, k(0), 7)]);
        assert_eq!(m.highest(RecordKind::Execution, &k(0)), Some(7));
    }

    #[test]
    fn at_most_n_keys_the_least_recently_seen_forgotten_first() {
        const N: usize = 8;
        let m = Marks::with_capacity(N);
        for i in 0..N {
            m.note_all(&[(RecordKind::Execution, k(i), 2)]);
        }
        // N keys: all remembered.
        assert_eq!(m.len(), N);
        assert!((0..N).all(|i| m.highest(RecordKind::Execution, &k(i)) == Some(2)));
        // Key 0 seen again, then key N + 1: key 1 (least recent) goes.
        m.note_all(&[(RecordKind::Execution, k(0), 3)]);
        m.note_all(&[(RecordKind::Execution, k(N), 2)]);
        assert_eq!(m.len(), N);
        assert_eq!(m.highest(RecordKind::Execution, &k(1)), None);
        assert_eq!(m.highest(RecordKind::Execution, &k(0)), Some(3));
        assert_eq!(m.highest(RecordKind::Execution, &k(N)), Some(2));
    }

    #[test]
    fn the_default_bound_is_max_watched_keys() {
        let m = Marks::default();
        for i in 0..=MAX_WATCHED_KEYS {
            m.note_all(&[(RecordKind::Machine, k(i), 1)]);
        }
        assert_eq!(m.len(), MAX_WATCHED_KEYS);
        assert_eq!(m.highest(RecordKind::Machine, &k(0)), None);
        assert_eq!(m.highest(RecordKind::Machine, &k(1)), Some(1));
    }
}
