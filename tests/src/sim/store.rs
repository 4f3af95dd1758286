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
use smolbox_core::managed::state::{ExecState, MachineOperation, MachineRecordState};
use smolbox_core::managed::{ExecPatch, Guard, Lease, MachinePatch, RecordKey};
use smolbox_core::{Error, Evidence, Operation};
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

/// The injected "applied, reply lost" fault of operation `op`: the write
/// may have committed, so the caller must not read it as not applied.
const fn reply_lost(op: Operation) -> Error {
    Error::store(op, Evidence::Unknown, Reason::ReplyLost)
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
    /// `resolve_machine` settled the command that held the slot.
    Resolve,
}

/// What kind of store mutation a machine-record commit was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MachineCommitKind {
    /// `accept_machine` inserted the record.
    Accept,
    /// `claim_machine` / `claim_machine_version`.
    Claim,
    /// `write_machine`.
    Write,
    /// `reserve_machine`.
    Reserve,
    /// `request_machine` (a versioned lifecycle request).
    Request,
    /// `submit` took the slot for a new command.
    Submit,
    /// `acquire_slot`.
    Slot,
    /// `finish_command` / `finish_slot`.
    Finish,
    /// `resolve_machine`.
    Resolve,
}

/// One committed change of a machine record.
#[derive(Clone, Debug)]
pub struct MachineCommit {
    /// What did it.
    pub kind: MachineCommitKind,
    /// The claiming owner for claims, the guard's owner for guarded writes.
    pub owner: Option<String>,
    /// The version the request named (`resolve_machine`, `request_machine`).
    pub requested_version: Option<u64>,
    /// The record's version before the commit (`None`: it was inserted).
    pub before_version: Option<u64>,
    /// The record after the commit.
    pub record: MachineRecord,
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
    machine_commits: Vec<MachineCommit>,
    /// The last logged version and revision (version + claims) of each
    /// machine record.
    machine_versions: BTreeMap<RecordKey, (u64, u64)>,
    previous: BTreeMap<RecordKey, ExecutionRecord>,
    /// Planted `SlotFreedAfterFailedCollection`: `finish_command` frees
    /// the slot of a `collection_failed` holder.
    free_failed_collection: bool,
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
                machine_commits: Vec::new(),
                machine_versions: BTreeMap::new(),
                previous: BTreeMap::new(),
                free_failed_collection: false,
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

    /// Plants a store bug (`Bug::SlotFreedAfterFailedCollection`): from
    /// now on `finish_command` frees the slot of a holder in
    /// `collection_failed` and answers `Released`, as a store whose finish
    /// rule took a failed collection for a confirmed finish would. The rule
    /// lives in the store (C14.3), out of the driver's reach, so the plant
    /// is here: the inner store finishes the command (kept, as the rule
    /// says), then frees the slot in the same logged commit with a quiesced
    /// resolve of the recorded incarnation. Nothing else changes.
    pub fn plant_free_after_failed_collection(&self) {
        self.lock().free_failed_collection = true;
    }

    /// Faults injected so far.
    pub fn faults_injected(&self) -> u64 {
        self.lock().injected
    }

    /// Takes the commit log so far.
    pub fn take_commits(&self) -> Vec<Commit> {
        std::mem::take(&mut self.lock().commits)
    }

    /// Takes the machine-record commit log so far.
    pub fn take_machine_commits(&self) -> Vec<MachineCommit> {
        std::mem::take(&mut self.lock().machine_commits)
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
            return Err(Error::store(op, Evidence::Unknown, Reason::Unavailable));
        }
        let r = f(&self.inner);
        if let Ok(rec) = &r {
            let before = self.lock().previous.get(&rec.key).map(|p| p.version);
            if before != Some(rec.version) {
                self.log(kind, owner, rec);
            }
        }
        if fault == Fault::After {
            return Err(reply_lost(op));
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
            Fault::Before | Fault::After => {
                Err(Error::store(op, Evidence::Unknown, Reason::Timeout))
            }
            Fault::None | Fault::Stale => f(&self.inner),
        }
    }

    fn mutation<T>(
        &self,
        op: Operation,
        f: impl FnOnce(&MemoryStore) -> Result<T, Error>,
    ) -> Result<T, Error> {
        match self.decide(false) {
            Fault::Before => Err(Error::store(op, Evidence::Unknown, Reason::Unavailable)),
            Fault::After => {
                let _applied = f(&self.inner);
                Err(reply_lost(op))
            }
            Fault::None | Fault::Stale => f(&self.inner),
        }
    }
}

/// What a machine mutation touches, for its commit log entries.
struct Touch<'a> {
    kind: MachineCommitKind,
    owner: Option<&'a str>,
    machine: &'a RecordKey,
    /// An execution record the same transaction may change.
    exec: Option<RecordKey>,
    exec_kind: CommitKind,
    requested_version: Option<u64>,
}

impl FaultStore {
    /// Runs a mutation that may change machine `t.machine` (and execution
    /// `t.exec`) under the fault schedule; whatever it committed (even when
    /// the reply is then lost) goes to the logs, the execution record
    /// first (its new state is what the slot rules judge a release by).
    fn machine_mutation<T>(
        &self,
        op: Operation,
        t: &Touch<'_>,
        f: impl FnOnce(&MemoryStore) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let fault = self.decide(false);
        self.machine_mutation_as(fault, op, t, f)
    }

    /// A `resolve_machine` without faults, logged like any other (for a
    /// planted bug that frees a slot itself).
    ///
    /// # Errors
    /// The store's.
    pub fn resolve_unfaulted(
        &self,
        key: &RecordKey,
        version: u64,
        disposition: &Disposition,
        now_ms: u64,
    ) -> Result<Resolved, Error> {
        let holder = self.holder(key);
        if let Some(h) = &holder {
            self.remember(h);
        }
        let t = Touch {
            exec: holder,
            exec_kind: CommitKind::Resolve,
            requested_version: Some(version),
            ..touch(MachineCommitKind::Resolve, None, key)
        };
        self.machine_mutation_as(Fault::None, Operation::StoreWrite, &t, |s| {
            s.resolve_machine(key, version, true, disposition, now_ms)
        })
    }

    fn machine_mutation_as<T>(
        &self,
        fault: Fault,
        op: Operation,
        t: &Touch<'_>,
        f: impl FnOnce(&MemoryStore) -> Result<T, Error>,
    ) -> Result<T, Error> {
        if fault == Fault::Before {
            return Err(Error::store(op, Evidence::Unknown, Reason::Unavailable));
        }
        let exec_before = t
            .exec
            .as_ref()
            .and_then(|k| self.inner.fetch(k).ok())
            .map(|r| r.version);
        let r = f(&self.inner);
        if let Some(k) = &t.exec
            && let Ok(rec) = self.inner.fetch(k)
            && exec_before != Some(rec.version)
        {
            self.log(t.exec_kind, t.owner, &rec);
        }
        self.log_machine(t);
        if fault == Fault::After {
            return Err(reply_lost(op));
        }
        r
    }

    fn log_machine(&self, t: &Touch<'_>) {
        let Ok(rec) = self.inner.fetch_machine(t.machine) else {
            return;
        };
        let mut s = self.lock();
        // A claim moves `claims`, not the version (claims leave the
        // caller-visible version): a commit is a change of either.
        let revision = rec.version + rec.claims;
        let before = s.machine_versions.get(t.machine).copied();
        if before.map(|(_, r)| r) == Some(revision) {
            return;
        }
        s.machine_versions
            .insert(rec.key.clone(), (rec.version, revision));
        let before = before.map(|(v, _)| v);
        s.machine_commits.push(MachineCommit {
            kind: t.kind,
            owner: t.owner.map(str::to_owned),
            requested_version: t.requested_version,
            before_version: before,
            record: rec,
        });
    }

    /// The command holding `machine`'s slot now (ground truth).
    fn holder(&self, machine: &RecordKey) -> Option<RecordKey> {
        self.inner
            .fetch_machine(machine)
            .ok()
            .and_then(|m| m.active_execution)
    }
}

const fn touch<'a>(
    kind: MachineCommitKind,
    owner: Option<&'a str>,
    machine: &'a RecordKey,
) -> Touch<'a> {
    Touch {
        kind,
        owner,
        machine,
        exec: None,
        exec_kind: CommitKind::Write,
        requested_version: None,
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
            return Err(Error::store(
                Operation::StoreAccept,
                Evidence::Unknown,
                Reason::Unavailable,
            ));
        }
        let r = self.inner.accept(record, max_pending);
        if let Ok(Accepted::Inserted(rec)) = &r {
            self.log(CommitKind::Accept, None, rec);
        }
        if fault == Fault::After {
            return Err(reply_lost(Operation::StoreAccept));
        }
        r
    }

    fn fetch(&self, key: &RecordKey) -> Result<ExecutionRecord, Error> {
        match self.decide(true) {
            Fault::Before | Fault::After => Err(Error::store(
                Operation::StoreFetch,
                Evidence::Unknown,
                Reason::Timeout,
            )),
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
        let t = touch(MachineCommitKind::Accept, None, &record.key);
        self.machine_mutation(Operation::StoreAccept, &t, |s| {
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
        let t = touch(MachineCommitKind::Claim, Some(owner), key);
        self.machine_mutation(Operation::StoreClaim, &t, |s| {
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
        let t = touch(MachineCommitKind::Write, Some(&guard.owner), key);
        self.machine_mutation(Operation::StoreWrite, &t, |s| {
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
        let t = touch(MachineCommitKind::Reserve, Some(&guard.owner), key);
        self.machine_mutation(Operation::StoreReserve, &t, |s| {
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
        let t = Touch {
            requested_version: Some(version),
            ..touch(MachineCommitKind::Request, None, key)
        };
        self.machine_mutation(Operation::StoreWrite, &t, |s| {
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
        let t = touch(MachineCommitKind::Slot, Some(&guard.owner), machine);
        self.machine_mutation(Operation::StoreSlot, &t, |s| {
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
        self.remember(exec);
        let t = Touch {
            exec: Some(exec.clone()),
            ..touch(MachineCommitKind::Finish, Some(&guard.owner), machine)
        };
        self.machine_mutation(Operation::StoreSlot, &t, |s| {
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
        let t = touch(MachineCommitKind::Claim, Some(owner), key);
        self.machine_mutation(Operation::StoreClaim, &t, |s| {
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
            return Err(Error::store(
                Operation::StoreAccept,
                Evidence::Unknown,
                Reason::Unavailable,
            ));
        }
        let r = self.inner.submit(record, max_pending);
        if let Ok(Accepted::Inserted(sub)) = &r {
            self.log(CommitKind::Accept, None, &sub.execution);
        }
        if let Some(m) = &record.spec.machine {
            self.log_machine(&touch(MachineCommitKind::Submit, None, m));
        }
        if fault == Fault::After {
            return Err(reply_lost(Operation::StoreAccept));
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
        let t = Touch {
            exec: Some(exec.clone()),
            ..touch(MachineCommitKind::Finish, Some(&guard.owner), machine)
        };
        let planted = self.lock().free_failed_collection
            && self
                .inner
                .fetch(exec)
                .is_ok_and(|r| r.state == ExecState::CollectionFailed);
        self.machine_mutation(Operation::StoreSlot, &t, |s| {
            let (m, c, finish) = s.finish_command(machine, guard, exec, now_ms)?;
            if !planted || finish != Finish::Kept {
                return Ok((m, c, finish));
            }
            // The planted store bug: the slot of a failed collection freed.
            let Some(incarnation) = m.creation.as_ref().map(|e| e.incarnation.clone()) else {
                return Ok((m, c, finish));
            };
            let d = Disposition::Stopped {
                observed: MachineRecordState::Stopped,
                incarnation,
            };
            match s.resolve_machine(machine, m.version, true, &d, now_ms) {
                Ok(r) => {
                    let c = r.command.unwrap_or(c);
                    Ok((r.machine, c, Finish::Released))
                }
                Err(_) => Ok((m, c, finish)),
            }
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
        let holder = self.holder(key);
        if let Some(h) = &holder {
            self.remember(h);
        }
        let t = Touch {
            exec: holder,
            exec_kind: CommitKind::Resolve,
            requested_version: Some(version),
            ..touch(MachineCommitKind::Resolve, None, key)
        };
        self.machine_mutation(Operation::StoreWrite, &t, |s| {
            s.resolve_machine(key, version, quiesced, disposition, now_ms)
        })
    }

    fn accept_dispatching(
        &self,
        record: &ExecutionRecord,
        max_pending: u32,
    ) -> Result<Accepted<ExecutionRecord>, Error> {
        let fault = self.decide(false);
        if fault == Fault::Before {
            return Err(Error::store(
                Operation::StoreAccept,
                Evidence::Unknown,
                Reason::Unavailable,
            ));
        }
        let r = self.inner.accept_dispatching(record, max_pending);
        if let Ok(Accepted::Inserted(rec)) = &r {
            // The claim and the intent in the acceptance itself.
            let owner = rec.claim.as_ref().map(|c| c.owner.as_str());
            self.log(CommitKind::Accept, owner, rec);
        }
        if fault == Fault::After {
            return Err(reply_lost(Operation::StoreAccept));
        }
        r
    }

    fn submit_dispatching(
        &self,
        record: &ExecutionRecord,
        max_pending: u32,
    ) -> Result<Accepted<Submitted>, Error> {
        let fault = self.decide(false);
        if fault == Fault::Before {
            return Err(Error::store(
                Operation::StoreAccept,
                Evidence::Unknown,
                Reason::Unavailable,
            ));
        }
        let r = self.inner.submit_dispatching(record, max_pending);
        if let Ok(Accepted::Inserted(sub)) = &r {
            let owner = sub.execution.claim.as_ref().map(|c| c.owner.as_str());
            self.log(CommitKind::Accept, owner, &sub.execution);
        }
        if let Some(m) = &record.spec.machine {
            self.log_machine(&touch(MachineCommitKind::Submit, None, m));
        }
        if fault == Fault::After {
            return Err(reply_lost(Operation::StoreAccept));
        }
        r
    }

    fn write_steps(
        &self,
        key: &RecordKey,
        guard: &Guard,
        patches: &[ExecPatch],
        now_ms: u64,
    ) -> Result<ExecutionRecord, Error> {
        self.remember(key);
        self.exec_mutation(
            Operation::StoreWrite,
            CommitKind::Write,
            Some(&guard.owner),
            |s| s.write_steps(key, guard, patches, now_ms),
        )
    }

    /// A record's claim ended (a settled terminal run releases its record
    /// and machine claims): logged as a claim commit by no owner, so it
    /// leaves nobody a fresh claim. A worker lease has no commit log.
    fn release_claim(
        &self,
        claimed: &smolbox_core::managed::controller::Claimed,
        owner: &str,
        generation: u64,
        now_ms: u64,
    ) -> Result<smolbox_store::Released, Error> {
        use smolbox_core::managed::controller::Claimed;
        use smolbox_store::Released;
        match claimed {
            Claimed::Execution(key) => {
                self.remember(key);
                self.exec_mutation(Operation::StoreClaim, CommitKind::Claim, None, |s| match s
                    .release_claim(claimed, owner, generation, now_ms)?
                {
                    Released::Execution(r) => Ok(*r),
                    _ => s.fetch(key),
                })
                .map(|r| Released::Execution(Box::new(r)))
            }
            Claimed::Machine(key) => {
                let t = touch(MachineCommitKind::Claim, None, key);
                self.machine_mutation(Operation::StoreClaim, &t, |s| {
                    s.release_claim(claimed, owner, generation, now_ms)
                })
            }
            Claimed::Worker(_) => self.mutation(Operation::StoreClaim, |s| {
                s.release_claim(claimed, owner, generation, now_ms)
            }),
        }
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
    use smolbox_core::Category;
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
