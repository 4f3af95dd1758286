//! A fault-injecting [`Store`] around [`MemoryStore`]: every operation may,
//! from the seed, fail before applying, apply and lose its reply, time out
//! (applied or not, the caller cannot tell), find the store gone for the
//! next few operations, or (reads) return the previous version of a record.
//!
//! Every committed execution-record change is also appended to a commit
//! log, which the reference model reads (the ground truth, not what the
//! controller was told).

use smolbox_core::Reason;
use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

use smolbox_core::managed::record::{ExecutionRecord, MachineRecord, Resources};
use smolbox_core::managed::slot::{Disposition, Finish};
use smolbox_core::managed::state::MachineOperation;
use smolbox_core::managed::{ExecPatch, Guard, Lease, MachinePatch, RecordKey};
use smolbox_core::{Category, Error, Evidence, Operation};
use smolbox_store::{
    Accepted, Assigned, DueCursor, DuePage, MemoryConfig, MemoryStore, Page, Reserve, Resolved,
    Store, StoreInfo, Submitted,
};

use super::rng::Rng;

/// Per-mille probabilities of the store's faults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreFaults {
    /// Fails before applying.
    pub fail_before: u32,
    /// Applies, then the reply is lost (the caller sees a `store` error).
    pub lose_reply: u32,
    /// Times out: applied or not, at random.
    pub timeout: u32,
    /// The store goes away for the next 1–8 operations.
    pub outage: u32,
    /// A read returns the previous version of the record.
    pub stale_read: u32,
}

impl StoreFaults {
    /// No faults.
    pub const NONE: Self = Self {
        fail_before: 0,
        lose_reply: 0,
        timeout: 0,
        outage: 0,
        stale_read: 0,
    };
}

/// What kind of store mutation a commit was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommitKind {
    /// `accept` inserted the record.
    Accept,
    /// `claim` took or renewed the claim.
    Claim,
    /// A guarded patch.
    Write,
    /// `reserve`.
    Reserve,
    /// `release`.
    Release,
    /// `cancel`.
    Cancel,
}

/// One committed change of an execution record.
#[derive(Clone, Debug)]
pub struct Commit {
    /// What did it.
    pub kind: CommitKind,
    /// The claiming owner for claims, the guard's owner for writes.
    pub owner: Option<String>,
    /// The record after the commit.
    pub record: ExecutionRecord,
}

#[derive(Debug)]
struct State {
    rng: Rng,
    faults: StoreFaults,
    outage_left: u32,
    injected: u64,
    commits: Vec<Commit>,
    previous: BTreeMap<RecordKey, ExecutionRecord>,
}

/// What a fault decision said.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    None,
    Before,
    After,
    Stale,
}

/// The fault-injecting store.
#[derive(Debug)]
pub struct FaultStore {
    inner: MemoryStore,
    state: Mutex<State>,
}

fn store_err(op: Operation, reason: Reason) -> Error {
    Error::new(Category::Store, op, Evidence::Unknown).with_reason(reason)
}

impl FaultStore {
    /// An empty store drawing its faults from `rng`.
    ///
    /// # Panics
    /// Never: the memory bounds are valid constants.
    pub fn new(rng: Rng, faults: StoreFaults) -> Self {
        let inner = MemoryStore::new(MemoryConfig {
            max_records: 2_000,
            ..MemoryConfig::default()
        })
        .unwrap_or_else(|_| unreachable!("valid bounds"));
        Self {
            inner,
            state: Mutex::new(State {
                rng,
                faults,
                outage_left: 0,
                injected: 0,
                commits: Vec::new(),
                previous: BTreeMap::new(),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Changes the fault rates (the quiescent phase turns them off; an
    /// outage in progress ends too).
    pub fn set_faults(&self, faults: StoreFaults) {
        let mut s = self.lock();
        s.faults = faults;
        if faults == StoreFaults::NONE {
            s.outage_left = 0;
        }
    }

    /// Faults injected so far.
    pub fn faults_injected(&self) -> u64 {
        self.lock().injected
    }

    /// Takes the commit log so far.
    pub fn take_commits(&self) -> Vec<Commit> {
        std::mem::take(&mut self.lock().commits)
    }

    /// The ground truth, bypassing faults.
    pub const fn inner(&self) -> &MemoryStore {
        &self.inner
    }

    fn decide(&self, read: bool) -> Fault {
        let mut s = self.lock();
        if s.outage_left > 0 {
            s.outage_left -= 1;
            s.injected += 1;
            return Fault::Before;
        }
        let f = s.faults;
        let d = if s.rng.chance(f.outage) {
            s.outage_left = s.rng.range(1, 8) as u32;
            Fault::Before
        } else if s.rng.chance(f.fail_before) {
            Fault::Before
        } else if !read && s.rng.chance(f.lose_reply) {
            Fault::After
        } else if s.rng.chance(f.timeout) {
            if read || s.rng.chance(500) {
                Fault::Before
            } else {
                Fault::After
            }
        } else if read && s.rng.chance(f.stale_read) {
            Fault::Stale
        } else {
            Fault::None
        };
        if d != Fault::None {
            s.injected += 1;
        }
        d
    }

    /// Runs a mutation of an execution record under the fault schedule and
    /// logs its commit.
    fn exec_mutation(
        &self,
        op: Operation,
        kind: CommitKind,
        owner: Option<&str>,
        f: impl FnOnce(&MemoryStore) -> Result<ExecutionRecord, Error>,
    ) -> Result<ExecutionRecord, Error> {
        let fault = self.decide(false);
        if fault == Fault::Before {
            return Err(store_err(op, Reason::Unavailable));
        }
        let r = f(&self.inner);
        if let Ok(rec) = &r {
            let before = self.lock().previous.get(&rec.key).map(|p| p.version);
            if before != Some(rec.version) {
                self.log(kind, owner, rec);
            }
        }
        if fault == Fault::After {
            return Err(store_err(op, Reason::ReplyLost));
        }
        r
    }

    fn log(&self, kind: CommitKind, owner: Option<&str>, rec: &ExecutionRecord) {
        self.lock().commits.push(Commit {
            kind,
            owner: owner.map(str::to_owned),
            record: rec.clone(),
        });
    }

    fn read<T>(
        &self,
        op: Operation,
        f: impl FnOnce(&MemoryStore) -> Result<T, Error>,
    ) -> Result<T, Error> {
        match self.decide(true) {
            Fault::Before | Fault::After => Err(store_err(op, Reason::Timeout)),
            Fault::None | Fault::Stale => f(&self.inner),
        }
    }

    fn mutation<T>(
        &self,
        op: Operation,
        f: impl FnOnce(&MemoryStore) -> Result<T, Error>,
    ) -> Result<T, Error> {
        match self.decide(false) {
            Fault::Before => Err(store_err(op, Reason::Unavailable)),
            Fault::After => {
                let _applied = f(&self.inner);
                Err(store_err(op, Reason::ReplyLost))
            }
            Fault::None | Fault::Stale => f(&self.inner),
        }
    }
}

impl Store for FaultStore {
    fn info(&self) -> StoreInfo {
        self.inner.info()
    }

    fn accept(
        &self,
        record: &ExecutionRecord,
        max_pending: u32,
    ) -> Result<Accepted<ExecutionRecord>, Error> {
        let fault = self.decide(false);
        if fault == Fault::Before {
            return Err(store_err(Operation::StoreAccept, Reason::Unavailable));
        }
        let r = self.inner.accept(record, max_pending);
        if let Ok(Accepted::Inserted(rec)) = &r {
            self.log(CommitKind::Accept, None, rec);
        }
        if fault == Fault::After {
            return Err(store_err(Operation::StoreAccept, Reason::ReplyLost));
        }
        r
    }

    fn fetch(&self, key: &RecordKey) -> Result<ExecutionRecord, Error> {
        match self.decide(true) {
            Fault::Before | Fault::After => Err(store_err(Operation::StoreFetch, Reason::Timeout)),
            Fault::Stale => {
                let prev = self.lock().previous.get(key).cloned();
                match prev {
                    Some(p) => Ok(p),
                    None => self.inner.fetch(key),
                }
            }
            Fault::None => self.inner.fetch(key),
        }
    }

    fn find_machine(&self, worker_id: &str, name: &str) -> Result<Assigned, Error> {
        self.read(Operation::StoreFind, |s| s.find_machine(worker_id, name))
    }

    fn claim_worker(
        &self,
        worker_id: &str,
        owner: &str,
        now_ms: u64,
        ttl_ms: u64,
    ) -> Result<Lease, Error> {
        self.mutation(Operation::StoreClaim, |s| {
            s.claim_worker(worker_id, owner, now_ms, ttl_ms)
        })
    }

    fn claim(
        &self,
        key: &RecordKey,
        owner: &str,
        now_ms: u64,
        ttl_ms: u64,
    ) -> Result<ExecutionRecord, Error> {
        self.remember(key);
        self.exec_mutation(Operation::StoreClaim, CommitKind::Claim, Some(owner), |s| {
            s.claim(key, owner, now_ms, ttl_ms)
        })
    }

    fn write(
        &self,
        key: &RecordKey,
        guard: &Guard,
        patch: &ExecPatch,
        now_ms: u64,
    ) -> Result<ExecutionRecord, Error> {
        self.remember(key);
        self.exec_mutation(
            Operation::StoreWrite,
            CommitKind::Write,
            Some(&guard.owner),
            |s| s.write(key, guard, patch, now_ms),
        )
    }

    fn reserve(
        &self,
        key: &RecordKey,
        guard: &Guard,
        request: &Reserve,
        now_ms: u64,
    ) -> Result<ExecutionRecord, Error> {
        self.remember(key);
        self.exec_mutation(
            Operation::StoreReserve,
            CommitKind::Reserve,
            Some(&guard.owner),
            |s| s.reserve(key, guard, request, now_ms),
        )
    }

    fn release(
        &self,
        key: &RecordKey,
        guard: &Guard,
        now_ms: u64,
    ) -> Result<ExecutionRecord, Error> {
        self.remember(key);
        self.exec_mutation(
            Operation::StoreRelease,
            CommitKind::Release,
            Some(&guard.owner),
            |s| s.release(key, guard, now_ms),
        )
    }

    fn cancel(&self, key: &RecordKey, now_ms: u64) -> Result<ExecutionRecord, Error> {
        self.remember(key);
        self.exec_mutation(Operation::StoreCancel, CommitKind::Cancel, None, |s| {
            s.cancel(key, now_ms)
        })
    }

    fn due(&self, now_ms: u64, after: Option<&DueCursor>, limit: u32) -> Result<DuePage, Error> {
        self.read(Operation::StoreDue, |s| s.due(now_ms, after, limit))
    }

    fn usage(&self, worker_id: &str) -> Result<Resources, Error> {
        self.read(Operation::StoreUsage, |s| s.usage(worker_id))
    }

    fn accept_machine(
        &self,
        record: &MachineRecord,
        max_pending: u32,
    ) -> Result<Accepted<MachineRecord>, Error> {
        self.mutation(Operation::StoreAccept, |s| {
            s.accept_machine(record, max_pending)
        })
    }

    fn fetch_machine(&self, key: &RecordKey) -> Result<MachineRecord, Error> {
        self.read(Operation::StoreFetch, |s| s.fetch_machine(key))
    }

    fn claim_machine(
        &self,
        key: &RecordKey,
        owner: &str,
        now_ms: u64,
        ttl_ms: u64,
    ) -> Result<MachineRecord, Error> {
        self.mutation(Operation::StoreClaim, |s| {
            s.claim_machine(key, owner, now_ms, ttl_ms)
        })
    }

    fn write_machine(
        &self,
        key: &RecordKey,
        guard: &Guard,
        patch: &MachinePatch,
        now_ms: u64,
    ) -> Result<MachineRecord, Error> {
        self.mutation(Operation::StoreWrite, |s| {
            s.write_machine(key, guard, patch, now_ms)
        })
    }

    fn reserve_machine(
        &self,
        key: &RecordKey,
        guard: &Guard,
        request: &Reserve,
        now_ms: u64,
    ) -> Result<MachineRecord, Error> {
        self.mutation(Operation::StoreReserve, |s| {
            s.reserve_machine(key, guard, request, now_ms)
        })
    }

    fn request_machine(
        &self,
        key: &RecordKey,
        action: MachineOperation,
        version: u64,
        now_ms: u64,
    ) -> Result<MachineRecord, Error> {
        self.mutation(Operation::StoreWrite, |s| {
            s.request_machine(key, action, version, now_ms)
        })
    }

    fn acquire_slot(
        &self,
        machine: &RecordKey,
        guard: &Guard,
        exec: &RecordKey,
        now_ms: u64,
    ) -> Result<MachineRecord, Error> {
        self.mutation(Operation::StoreSlot, |s| {
            s.acquire_slot(machine, guard, exec, now_ms)
        })
    }

    fn finish_slot(
        &self,
        machine: &RecordKey,
        guard: &Guard,
        exec: &RecordKey,
        now_ms: u64,
    ) -> Result<(MachineRecord, Finish), Error> {
        self.mutation(Operation::StoreSlot, |s| {
            s.finish_slot(machine, guard, exec, now_ms)
        })
    }

    // The operations added with issue 13's store work: reads may time out,
    // mutations fail before or after applying, like the others.
    fn list(
        &self,
        scope: &str,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Page<ExecutionRecord>, Error> {
        self.read(Operation::StoreFetch, |s| s.list(scope, after, limit))
    }

    fn list_machines(
        &self,
        scope: &str,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Page<MachineRecord>, Error> {
        self.read(Operation::StoreFetch, |s| {
            s.list_machines(scope, after, limit)
        })
    }

    fn due_machines(
        &self,
        now_ms: u64,
        after: Option<&DueCursor>,
        limit: u32,
    ) -> Result<DuePage<MachineRecord>, Error> {
        self.read(Operation::StoreDue, |s| {
            s.due_machines(now_ms, after, limit)
        })
    }

    fn claim_version(
        &self,
        key: &RecordKey,
        owner: &str,
        version: u64,
        now_ms: u64,
        ttl_ms: u64,
    ) -> Result<ExecutionRecord, Error> {
        self.exec_mutation(Operation::StoreClaim, CommitKind::Claim, Some(owner), |s| {
            s.claim_version(key, owner, version, now_ms, ttl_ms)
        })
    }

    fn claim_machine_version(
        &self,
        key: &RecordKey,
        owner: &str,
        version: u64,
        now_ms: u64,
        ttl_ms: u64,
    ) -> Result<MachineRecord, Error> {
        self.mutation(Operation::StoreClaim, |s| {
            s.claim_machine_version(key, owner, version, now_ms, ttl_ms)
        })
    }

    fn submit(
        &self,
        record: &ExecutionRecord,
        max_pending: u32,
    ) -> Result<Accepted<Submitted>, Error> {
        let fault = self.decide(false);
        if fault == Fault::Before {
            return Err(store_err(Operation::StoreAccept, Reason::Unavailable));
        }
        let r = self.inner.submit(record, max_pending);
        if let Ok(Accepted::Inserted(sub)) = &r {
            self.log(CommitKind::Accept, None, &sub.execution);
        }
        if fault == Fault::After {
            return Err(store_err(Operation::StoreAccept, Reason::ReplyLost));
        }
        r
    }

    fn finish_command(
        &self,
        machine: &RecordKey,
        guard: &Guard,
        exec: &RecordKey,
        now_ms: u64,
    ) -> Result<(MachineRecord, ExecutionRecord, Finish), Error> {
        self.remember(exec);
        let before = self.lock().previous.get(exec).map(|p| p.version);
        self.mutation(Operation::StoreSlot, |s| {
            let r = s.finish_command(machine, guard, exec, now_ms);
            if let Ok((_, rec, _)) = &r
                && before != Some(rec.version)
            {
                self.log(CommitKind::Write, Some(&guard.owner), rec);
            }
            r
        })
    }

    fn resolve_machine(
        &self,
        key: &RecordKey,
        version: u64,
        quiesced: bool,
        disposition: &Disposition,
        now_ms: u64,
    ) -> Result<Resolved, Error> {
        self.mutation(Operation::StoreWrite, |s| {
            s.resolve_machine(key, version, quiesced, disposition, now_ms)
        })
    }
}

impl FaultStore {
    /// Keeps the current version of `key` as the "previous" one a stale
    /// read may return.
    fn remember(&self, key: &RecordKey) {
        match self.inner.fetch(key) {
            Ok(cur) => {
                self.lock().previous.insert(key.clone(), cur);
            }
            Err(_) => {
                self.lock().previous.remove(key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use smolbox_core::Reason;
    use smolbox_core::managed::testkit;

    fn record() -> ExecutionRecord {
        testkit::accepted(testkit::key("s", "k"), testkit::exec_spec("x"), 1_000)
    }

    #[test]
    fn fail_before_applies_nothing_lose_reply_applies_and_errs() {
        let s = FaultStore::new(
            Rng::new(1),
            StoreFaults {
                fail_before: 1000,
                ..StoreFaults::NONE
            },
        );
        let e = s.accept(&record(), 10).unwrap_err();
        assert_eq!(e.category(), Category::Store);
        assert_eq!(
            s.inner().fetch(&record().key).unwrap_err().category(),
            Category::NotFound
        );

        let s = FaultStore::new(
            Rng::new(1),
            StoreFaults {
                lose_reply: 1000,
                ..StoreFaults::NONE
            },
        );
        let e = s.accept(&record(), 10).unwrap_err();
        assert_eq!(e.category(), Category::Store);
        assert_eq!(e.reason(), Reason::ReplyLost);
        assert!(s.inner().fetch(&record().key).is_ok());
        assert_eq!(s.take_commits().len(), 1);
    }

    #[test]
    fn an_outage_fails_the_next_operations_and_a_read_never_says_absent() {
        let s = FaultStore::new(
            Rng::new(2),
            StoreFaults {
                outage: 1000,
                ..StoreFaults::NONE
            },
        );
        for _ in 0..3 {
            let e = s.fetch(&record().key).unwrap_err();
            assert_eq!(e.category(), Category::Store, "{e:?}");
        }
        assert!(s.faults_injected() >= 3);
        s.set_faults(StoreFaults::NONE);
        assert_eq!(
            s.fetch(&record().key).unwrap_err().category(),
            Category::NotFound
        );
    }

    #[test]
    fn a_stale_read_returns_the_previous_version() {
        let s = FaultStore::new(Rng::new(3), StoreFaults::NONE);
        let r = s.accept(&record(), 10).unwrap().into_record();
        let c = s.claim(&r.key, "o", 2_000, 1_000).unwrap();
        assert_eq!(c.version, r.version + 1);
        s.set_faults(StoreFaults {
            stale_read: 1000,
            ..StoreFaults::NONE
        });
        assert_eq!(s.fetch(&r.key).unwrap().version, r.version);
        let log = s.take_commits();
        assert_eq!(log.len(), 2);
        assert_eq!(log[1].kind, CommitKind::Claim);
        assert_eq!(log[1].owner.as_deref(), Some("o"));
    }
}
