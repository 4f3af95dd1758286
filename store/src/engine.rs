//! The one implementation of every store operation, over a backend's
//! transaction. Each operation loads what it needs through [`Tx`], calls
//! the pure rule in `smolbox_core::managed`, and writes the result back;
//! the backend commits only when the closure returns `Ok`.

use smolbox_core::Reason;
use smolbox_core::managed::claim::{self, Fence, Release};
use smolbox_core::managed::controller::Claimed;
use smolbox_core::managed::envelope::{exec_requirements, machine_requirements};
use smolbox_core::managed::patch::{apply_exec, apply_exec_steps, apply_machine, intent_at_accept};
use smolbox_core::managed::record::{Assignment, Resources};
use smolbox_core::managed::slot::{self, Disposition, Finish};
use smolbox_core::managed::state::{Cleanup, ExecState, MachineOperation};
use smolbox_core::managed::{
    ExecPatch, ExecutionRecord, Guard, Lease, MachinePatch, MachineRecord, RecordKey,
    check_identifier, check_machine_name, check_worker_id,
};
use smolbox_core::{Error, Evidence, Operation};

#[cfg(any(feature = "sqlite", feature = "postgres"))]
use crate::Sealer;
use crate::watch::{self, Marks, run};
use crate::{
    Accepted, Assigned, DueCursor, DuePage, MAX_DUE_PAGE, MAX_LIST_PAGE, MAX_PENDING, MIN_PENDING,
    Page, Released, Reserve, Resolved, SCHEMA, StoreInfo, Submitted,
};
use smolbox_core::managed::RecordKind;
use smolbox_core::managed::envelope::Capabilities;
use std::sync::atomic::{AtomicU64, Ordering};

/// How much a transaction locks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lock {
    /// A read: no locks, never writes.
    Read,
    /// Writes records it loads (each row locked as it is read).
    Record,
    /// Also serializes on the partition: for partition-wide totals
    /// (pending count, capacity, leases, names and ports).
    Partition,
}

/// One transaction's view of a partition. Reads inside a `Record` or
/// `Partition` transaction lock the rows they return. Every record given to
/// `put_exec` / `put_machine` has just been validated by the operation (the
/// pure rule that produced it, or an explicit `validate`): the adapters
/// encode it without validating again, and every read re-validates what it
/// decodes (issue 16: a write validates once and seals once).
pub(crate) trait Tx {
    fn exec(&mut self, key: &RecordKey) -> Result<Option<ExecutionRecord>, Error>;
    fn put_exec(&mut self, rec: &ExecutionRecord, new: bool) -> Result<(), Error>;
    fn pending_count(&mut self) -> Result<u64, Error>;
    fn machine(&mut self, key: &RecordKey) -> Result<Option<MachineRecord>, Error>;
    fn put_machine(&mut self, rec: &MachineRecord, new: bool) -> Result<(), Error>;
    fn lease(&mut self, worker_id: &str) -> Result<Option<Lease>, Error>;
    fn put_lease(&mut self, worker_id: &str, lease: &Lease, new: bool) -> Result<(), Error>;
    fn assignment(&mut self, worker_id: &str, name: &str) -> Result<Option<Assigned>, Error>;
    fn put_assignment(&mut self, worker_id: &str, name: &str, who: &Assigned) -> Result<(), Error>;
    fn port_owner(&mut self, worker_id: &str, port: u16) -> Result<Option<RecordKey>, Error>;
    fn put_port(&mut self, worker_id: &str, port: u16, owner: &RecordKey) -> Result<(), Error>;
    fn delete_ports(&mut self, owner: &RecordKey) -> Result<(), Error>;
    fn usage(&mut self, worker_id: &str) -> Result<Resources, Error>;
    fn due(
        &mut self,
        now_ms: u64,
        after: Option<&DueCursor>,
        limit: u32,
    ) -> Result<Vec<ExecutionRecord>, Error>;
    /// Non-deleted machine records (the machines' pending count).
    fn pending_machines(&mut self) -> Result<u64, Error>;
    /// Machine records due at `now_ms`, as [`Tx::due`].
    fn due_machines(
        &mut self,
        now_ms: u64,
        after: Option<&DueCursor>,
        limit: u32,
    ) -> Result<Vec<MachineRecord>, Error>;
    /// Execution records of `scope` with id > `after`, by id, at most `limit`.
    fn list_execs(
        &mut self,
        scope: &str,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Vec<ExecutionRecord>, Error>;
    /// Machine records of `scope` with id > `after`, by id, at most `limit`.
    fn list_machines(
        &mut self,
        scope: &str,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Vec<MachineRecord>, Error>;
    /// The partition's stored key-check value.
    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    fn key_check(&mut self) -> Result<Option<Vec<u8>>, Error>;
    /// Stores the partition's key-check value.
    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    fn put_key_check(&mut self, check: &[u8]) -> Result<(), Error>;
    /// Every record of the partition: kind, key, and whether its payload
    /// is sealed in the current format.
    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    fn row_formats(&mut self) -> Result<Vec<(RecordKind, RecordKey, bool)>, Error>;
    /// Whether this record was read back below the version this store
    /// handle already saw (a rollback; `watch`). Only the watched
    /// transaction of `watch::run` knows; an adapter's own says no.
    fn behind(&self, _kind: RecordKind, _key: &RecordKey, _version: u64) -> bool {
        false
    }
}

/// Readies a partition of a durable store at open, in one transaction run
/// with a sealer that also opens first-format payloads: a partition with a
/// key-check value must match the key (a replaced or newly created key file
/// is refused); a partition without one is checked record by record under
/// the key (every record must open), first-format payloads are re-sealed in
/// the current format (the versioned migration of C18.4), and the key check
/// is stored.
///
/// # Errors
/// `store` with reason `key_mismatch` when the key does not open the
/// partition; any read or decode failure as it is.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn prepare_partition(tx: &mut dyn Tx, sealer: &Sealer) -> Result<(), Error> {
    let op = Operation::StoreMigrate;
    if let Some(check) = tx.key_check()? {
        return sealer.verify_key_check(&check);
    }
    let mismatch = |e: Error| {
        if e.reason() == Reason::AuthenticationFailed {
            Error::store(op, Evidence::Unknown, Reason::KeyMismatch)
        } else {
            e
        }
    };
    for (kind, key, current) in tx.row_formats()? {
        match kind {
            RecordKind::Execution => {
                let rec = tx.exec(&key).map_err(mismatch)?.ok_or(Error::store(
                    op,
                    Evidence::Unknown,
                    Reason::RowVanished,
                ))?;
                if !current {
                    tx.put_exec(&rec, false)?;
                }
            }
            RecordKind::Machine => {
                let rec = tx.machine(&key).map_err(mismatch)?.ok_or(Error::store(
                    op,
                    Evidence::Unknown,
                    Reason::RowVanished,
                ))?;
                if !current {
                    tx.put_machine(&rec, false)?;
                }
            }
        }
    }
    tx.put_key_check(&sealer.key_check()?)
}

/// What every store handle carries beside its adapter's own state:
/// whether its commits are durable, its rollback marks (`watch`) and its
/// count of committed write transactions (`Store::commits`).
#[derive(Debug)]
pub(crate) struct Handle {
    /// Whether a committed write survives an OS crash or power loss
    /// ([`StoreInfo::durable`]).
    durable: bool,
    /// This handle's highest-seen write counters (rollback detection).
    marks: Marks,
    /// Write transactions committed.
    commits: AtomicU64,
}

impl Handle {
    /// A new handle's state: no marks, no commits.
    pub(crate) fn new(durable: bool) -> Self {
        Self {
            durable,
            marks: Marks::default(),
            commits: AtomicU64::new(0),
        }
    }

    /// Write transactions committed through [`Backend::transact`].
    pub(crate) fn commits(&self) -> u64 {
        self.commits.load(Ordering::Relaxed)
    }
}

/// A store adapter: runs closures in its transactions.
pub(crate) trait Backend {
    /// This handle's durability, marks and commit count.
    fn handle(&self) -> &Handle;
    /// The adapter's transaction: runs `f` in one transaction and commits
    /// when it returns `Ok`; rolls everything back otherwise. A backend may
    /// run `f` again after a serialization failure, so `f` must not keep
    /// state between runs. Called through [`Backend::transact`].
    fn run_transaction<R>(
        &self,
        op: Operation,
        lock: Lock,
        f: &mut dyn FnMut(&mut dyn Tx) -> Result<R, Error>,
    ) -> Result<R, Error>;

    /// What the adapter is: every adapter is atomic and has every
    /// capability; only durability differs ([`Handle::new`]).
    fn info(&self) -> StoreInfo {
        StoreInfo {
            schema: SCHEMA,
            durable: self.handle().durable,
            atomic: true,
            capabilities: Capabilities::ALL,
        }
    }

    /// This handle's highest-seen write counters (`watch`).
    fn marks(&self) -> &Marks {
        &self.handle().marks
    }

    /// [`Backend::run_transaction`], counting a committed write
    /// transaction (a read is not counted).
    fn transact<R>(
        &self,
        op: Operation,
        lock: Lock,
        f: &mut dyn FnMut(&mut dyn Tx) -> Result<R, Error>,
    ) -> Result<R, Error> {
        let out = self.run_transaction(op, lock, f)?;
        if lock != Lock::Read {
            self.handle().commits.fetch_add(1, Ordering::Relaxed);
        }
        Ok(out)
    }
}

pub(crate) fn accept<B: Backend>(
    b: &B,
    rec: &ExecutionRecord,
    max_pending: u32,
) -> Result<Accepted<ExecutionRecord>, Error> {
    accept_as(b, rec, max_pending, false)
}

/// `accept`, and for an inserted record its dispatch intent in the same
/// transaction (`patch::intent_at_accept`); an existing record is
/// returned untouched.
pub(crate) fn accept_dispatching<B: Backend>(
    b: &B,
    rec: &ExecutionRecord,
    max_pending: u32,
) -> Result<Accepted<ExecutionRecord>, Error> {
    accept_as(b, rec, max_pending, true)
}

/// The record an acceptance inserts: `rec` itself, or with its intent.
fn inserted(rec: &ExecutionRecord, intent: bool, op: Operation) -> Result<ExecutionRecord, Error> {
    if intent {
        intent_at_accept(rec).map_err(|e| e.with_operation(op))
    } else {
        Ok(rec.clone())
    }
}

fn accept_as<B: Backend>(
    b: &B,
    rec: &ExecutionRecord,
    max_pending: u32,
    intent: bool,
) -> Result<Accepted<ExecutionRecord>, Error> {
    let op = Operation::StoreAccept;
    check_pending(max_pending, op)?;
    rec.validate().map_err(|e| e.with_operation(op))?;
    if rec.state != ExecState::Accepted || rec.version != 1 {
        return Err(Error::validation(op, Reason::NotFreshlyAccepted));
    }
    // Checked before the transaction, so a refused intent stores nothing.
    let insert = inserted(rec, intent, op)?;
    if !b
        .info()
        .capabilities
        .covers(exec_requirements(rec).capabilities)
    {
        return Err(Error::unsupported_capability(op, Reason::StoreCapability));
    }
    run(b, op, Lock::Partition, &mut |tx| {
        if let Some(existing) = tx.exec(&rec.key)? {
            return if existing.fingerprint == rec.fingerprint {
                Ok(Accepted::Existing(existing))
            } else {
                Err(Error::identity_conflict(
                    op,
                    Evidence::NotDispatched,
                    Reason::FingerprintDiffers,
                ))
            };
        }
        let pending = tx.pending_count()?;
        if pending >= u64::from(max_pending) {
            return Err(Error::admission_exhausted(op, Reason::MaxPending)
                .with_limit(pending + 1, max_pending.into()));
        }
        tx.put_exec(&insert, true)?;
        Ok(Accepted::Inserted(insert.clone()))
    })
}

pub(crate) fn fetch<B: Backend>(b: &B, key: &RecordKey) -> Result<ExecutionRecord, Error> {
    let op = Operation::StoreFetch;
    run(b, op, Lock::Read, &mut |tx| {
        tx.exec(key)?
            .ok_or(Error::not_found(op, Evidence::Unknown, Reason::Absent))
    })
}

pub(crate) fn find_machine<B: Backend>(b: &B, worker: &str, name: &str) -> Result<Assigned, Error> {
    let op = Operation::StoreFind;
    run(b, op, Lock::Read, &mut |tx| {
        tx.assignment(worker, name)?
            .ok_or(Error::not_found(op, Evidence::Unknown, Reason::Absent))
    })
}

pub(crate) fn claim_worker<B: Backend>(
    b: &B,
    worker: &str,
    owner: &str,
    now_ms: u64,
    ttl_ms: u64,
) -> Result<Lease, Error> {
    let op = Operation::StoreClaim;
    check_worker_id(worker).map_err(|e| e.with_operation(op))?;
    run(b, op, Lock::Partition, &mut |tx| {
        let current = tx.lease(worker)?;
        let next = claim::take(current.as_ref(), owner, now_ms, ttl_ms)?;
        if current.as_ref() != Some(&next) {
            tx.put_lease(worker, &next, current.is_none())?;
        }
        Ok(next)
    })
}

pub(crate) fn claim<B: Backend>(
    b: &B,
    key: &RecordKey,
    owner: &str,
    now_ms: u64,
    ttl_ms: u64,
) -> Result<ExecutionRecord, Error> {
    let op = Operation::StoreClaim;
    run(b, op, Lock::Record, &mut |tx| {
        let rec = tx
            .exec(key)?
            .ok_or(Error::not_found(op, Evidence::Unknown, Reason::Absent))?;
        let next = claim::claim_exec(&rec, owner, now_ms, ttl_ms)?;
        tx.put_exec(&next, false)?;
        Ok(next)
    })
}

/// Loads a record and checks the guard, including its worker generation.
fn guarded_exec(
    tx: &mut dyn Tx,
    key: &RecordKey,
    guard: &Guard,
    now_ms: u64,
    op: Operation,
) -> Result<ExecutionRecord, Error> {
    let rec = tx
        .exec(key)?
        .ok_or(Error::not_found(op, Evidence::Unknown, Reason::Absent))?;
    let lease = match &rec.assignment {
        Some(a) => tx.lease(&a.worker_id)?,
        None => None,
    };
    claim::check_guard(Fence::of_exec(&rec), guard, lease.as_ref(), now_ms, op)?;
    Ok(rec)
}

fn guarded_machine(
    tx: &mut dyn Tx,
    key: &RecordKey,
    guard: &Guard,
    now_ms: u64,
    op: Operation,
) -> Result<MachineRecord, Error> {
    let rec = tx
        .machine(key)?
        .ok_or(Error::not_found(op, Evidence::Unknown, Reason::Absent))?;
    let lease = match &rec.assignment {
        Some(a) => tx.lease(&a.worker_id)?,
        None => None,
    };
    claim::check_guard(Fence::of_machine(&rec), guard, lease.as_ref(), now_ms, op)?;
    Ok(rec)
}

pub(crate) fn write<B: Backend>(
    b: &B,
    key: &RecordKey,
    guard: &Guard,
    patch: &ExecPatch,
    now_ms: u64,
) -> Result<ExecutionRecord, Error> {
    let op = Operation::StoreWrite;
    run(b, op, Lock::Record, &mut |tx| {
        let rec = guarded_exec(tx, key, guard, now_ms, op)?;
        let next = apply_exec(&rec, patch, now_ms).map_err(|e| e.with_operation(op))?;
        tx.put_exec(&next, false)?;
        Ok(next)
    })
}

/// A guarded write of several patches in one transaction: the guard is
/// checked once, each patch by the pure rules (`apply_exec_steps`).
pub(crate) fn write_steps<B: Backend>(
    b: &B,
    key: &RecordKey,
    guard: &Guard,
    patches: &[ExecPatch],
    now_ms: u64,
) -> Result<ExecutionRecord, Error> {
    let op = Operation::StoreWrite;
    run(b, op, Lock::Record, &mut |tx| {
        let rec = guarded_exec(tx, key, guard, now_ms, op)?;
        let next = apply_exec_steps(&rec, patches, now_ms).map_err(|e| e.with_operation(op))?;
        tx.put_exec(&next, false)?;
        Ok(next)
    })
}

/// Checks the worker lease the guard's owner must hold to reserve, and
/// returns its generation.
fn live_lease(
    tx: &mut dyn Tx,
    req: &Reserve,
    guard: &Guard,
    now_ms: u64,
    op: Operation,
) -> Result<u64, Error> {
    check_worker_id(&req.worker_id).map_err(|e| e.with_operation(op))?;
    check_machine_name(&req.machine_name).map_err(|e| e.with_operation(op))?;
    match tx.lease(&req.worker_id)? {
        Some(l) if l.owner == guard.owner && l.until_ms > now_ms => Ok(l.generation),
        _ => Err(Error::stale_claim(
            op,
            Evidence::NotDispatched,
            Reason::WorkerLease,
        )),
    }
}

fn check_capacity(tx: &mut dyn Tx, req: &Reserve, op: Operation) -> Result<(), Error> {
    let used = tx.usage(&req.worker_id)?;
    if used.plus(req.capacity).fits(req.limit) {
        Ok(())
    } else {
        Err(Error::admission_exhausted(op, Reason::WorkerCapacity))
    }
}

fn check_name(tx: &mut dyn Tx, req: &Reserve, who: &Assigned, op: Operation) -> Result<(), Error> {
    match tx.assignment(&req.worker_id, &req.machine_name)? {
        Some(existing) if existing != *who => Err(Error::identity_conflict(
            op,
            Evidence::NotDispatched,
            Reason::MachineNameTaken,
        )),
        Some(_) => Err(Error::validation(op, Reason::AlreadyAssigned)),
        None => Ok(()),
    }
}

pub(crate) fn reserve<B: Backend>(
    b: &B,
    key: &RecordKey,
    guard: &Guard,
    req: &Reserve,
    now_ms: u64,
) -> Result<ExecutionRecord, Error> {
    let op = Operation::StoreReserve;
    run(b, op, Lock::Partition, &mut |tx| {
        let generation = live_lease(tx, req, guard, now_ms, op)?;
        let rec = guarded_exec(tx, key, guard, now_ms, op)?;
        if rec.spec.machine.is_some() {
            return Err(Error::validation(
                op,
                Reason::ManagedCommandHasNoReservation,
            ));
        }
        if rec.assignment.is_some() || rec.reservation.is_some() {
            return Err(Error::validation(op, Reason::AlreadyAssigned));
        }
        if rec.deadlines.queue_ms.is_some_and(|q| now_ms > q) {
            return Err(Error::expired(
                op,
                Evidence::NotDispatched,
                Reason::QueueDeadline,
            ));
        }
        if now_ms < rec.updated_at_ms {
            return Err(Error::validation(op, Reason::ClockBeforeUpdatedAt));
        }
        let who = Assigned::Execution(rec.key.clone());
        check_name(tx, req, &who, op)?;
        check_capacity(tx, req, op)?;
        let mut next = rec;
        next.assignment = Some(Assignment {
            worker_id: req.worker_id.clone(),
            worker_generation: generation,
            machine_name: req.machine_name.clone(),
        });
        next.reservation = Some(req.capacity);
        next.version += 1;
        next.updated_at_ms = now_ms;
        next.validate().map_err(|e| e.with_operation(op))?;
        tx.put_exec(&next, false)?;
        tx.put_assignment(&req.worker_id, &req.machine_name, &who)?;
        Ok(next)
    })
}

pub(crate) fn release<B: Backend>(
    b: &B,
    key: &RecordKey,
    guard: &Guard,
    now_ms: u64,
) -> Result<ExecutionRecord, Error> {
    let op = Operation::StoreRelease;
    run(b, op, Lock::Record, &mut |tx| {
        let rec = guarded_exec(tx, key, guard, now_ms, op)?;
        if rec.reservation.is_none() {
            return Err(Error::validation(op, Reason::NotReserved));
        }
        // C0.4 rule 7: only after verified absence (or no machine at all).
        let allowed = rec.cleanup == Cleanup::Complete
            && (rec.assignment.is_none() || rec.absence_at_ms.is_some());
        if !allowed {
            return Err(Error::validation(op, Reason::ReleaseBeforeAbsence));
        }
        if now_ms < rec.updated_at_ms {
            return Err(Error::validation(op, Reason::ClockBeforeUpdatedAt));
        }
        let mut next = rec;
        next.reservation = None;
        next.version += 1;
        next.updated_at_ms = now_ms;
        next.validate().map_err(|e| e.with_operation(op))?;
        tx.put_exec(&next, false)?;
        Ok(next)
    })
}

pub(crate) fn cancel<B: Backend>(
    b: &B,
    key: &RecordKey,
    now_ms: u64,
) -> Result<ExecutionRecord, Error> {
    let op = Operation::StoreCancel;
    run(b, op, Lock::Record, &mut |tx| {
        let rec = tx
            .exec(key)?
            .ok_or(Error::not_found(op, Evidence::Unknown, Reason::Absent))?;
        if rec.state.is_terminal() {
            return Ok(rec);
        }
        let now = now_ms.max(rec.updated_at_ms);
        let mut next = rec;
        next.cancel_requested_at_ms.get_or_insert(now);
        next.next_due_at_ms = Some(now);
        next.version += 1;
        next.updated_at_ms = now;
        next.validate().map_err(|e| e.with_operation(op))?;
        tx.put_exec(&next, false)?;
        Ok(next)
    })
}

fn check_due_limit(limit: u32, op: Operation) -> Result<(), Error> {
    if (1..=MAX_DUE_PAGE).contains(&limit) {
        Ok(())
    } else {
        Err(Error::validation(op, Reason::DueLimit).with_limit(limit.into(), MAX_DUE_PAGE.into()))
    }
}

/// The page of a keyset scan: the next cursor only when the page is full.
fn due_page<T>(
    records: Vec<T>,
    limit: u32,
    cursor: impl Fn(&T) -> Option<DueCursor>,
) -> DuePage<T> {
    let next = if records.len() == limit as usize {
        records.last().and_then(cursor)
    } else {
        None
    };
    DuePage { records, next }
}

pub(crate) fn due<B: Backend>(
    b: &B,
    now_ms: u64,
    after: Option<&DueCursor>,
    limit: u32,
) -> Result<DuePage, Error> {
    let op = Operation::StoreDue;
    check_due_limit(limit, op)?;
    run(b, op, Lock::Read, &mut |tx| {
        let records = tx.due(now_ms, after, limit)?;
        let mut page = due_page(records, limit, |r: &ExecutionRecord| {
            r.next_due_at_ms.map(|due_at_ms| DueCursor {
                due_at_ms,
                key: r.key.clone(),
            })
        });
        // A rolled-back record is not picked up again (the cursor above
        // still comes from the whole page).
        page.records
            .retain(|r| !tx.behind(RecordKind::Execution, &r.key, r.version));
        Ok(page)
    })
}

pub(crate) fn due_machines<B: Backend>(
    b: &B,
    now_ms: u64,
    after: Option<&DueCursor>,
    limit: u32,
) -> Result<DuePage<MachineRecord>, Error> {
    let op = Operation::StoreDue;
    check_due_limit(limit, op)?;
    run(b, op, Lock::Read, &mut |tx| {
        let records = tx.due_machines(now_ms, after, limit)?;
        let mut page = due_page(records, limit, |r: &MachineRecord| {
            r.next_due_at_ms.map(|due_at_ms| DueCursor {
                due_at_ms,
                key: r.key.clone(),
            })
        });
        page.records
            .retain(|r| !tx.behind(RecordKind::Machine, &r.key, watch::mark_of(r)));
        Ok(page)
    })
}

fn check_list(scope: &str, after: Option<&str>, limit: u32, op: Operation) -> Result<(), Error> {
    check_identifier(scope).map_err(|e| e.with_operation(op))?;
    if let Some(a) = after {
        check_identifier(a).map_err(|e| e.with_operation(op))?;
    }
    if (1..=MAX_LIST_PAGE).contains(&limit) {
        Ok(())
    } else {
        Err(Error::validation(op, Reason::ListLimit).with_limit(limit.into(), MAX_LIST_PAGE.into()))
    }
}

fn list_page<T>(records: Vec<T>, limit: u32, id: impl Fn(&T) -> &str) -> Page<T> {
    let next = if records.len() == limit as usize {
        records.last().map(|r| id(r).to_owned())
    } else {
        None
    };
    Page { records, next }
}

pub(crate) fn list<B: Backend>(
    b: &B,
    scope: &str,
    after: Option<&str>,
    limit: u32,
) -> Result<Page<ExecutionRecord>, Error> {
    let op = Operation::StoreFetch;
    check_list(scope, after, limit, op)?;
    run(b, op, Lock::Read, &mut |tx| {
        let records = tx.list_execs(scope, after, limit)?;
        Ok(list_page(records, limit, |r: &ExecutionRecord| {
            r.key.id.as_str()
        }))
    })
}

pub(crate) fn list_machines<B: Backend>(
    b: &B,
    scope: &str,
    after: Option<&str>,
    limit: u32,
) -> Result<Page<MachineRecord>, Error> {
    let op = Operation::StoreFetch;
    check_list(scope, after, limit, op)?;
    run(b, op, Lock::Read, &mut |tx| {
        let records = tx.list_machines(scope, after, limit)?;
        Ok(list_page(records, limit, |r: &MachineRecord| {
            r.key.id.as_str()
        }))
    })
}

pub(crate) fn usage<B: Backend>(b: &B, worker: &str) -> Result<Resources, Error> {
    run(b, Operation::StoreUsage, Lock::Read, &mut |tx| {
        tx.usage(worker)
    })
}

pub(crate) fn accept_machine<B: Backend>(
    b: &B,
    rec: &MachineRecord,
    max_pending: u32,
) -> Result<Accepted<MachineRecord>, Error> {
    let op = Operation::StoreAccept;
    check_pending(max_pending, op)?;
    rec.validate().map_err(|e| e.with_operation(op))?;
    if rec.version != 1 {
        return Err(Error::validation(op, Reason::NotFreshlyAccepted));
    }
    if !b
        .info()
        .capabilities
        .covers(machine_requirements(rec).capabilities)
    {
        return Err(Error::unsupported_capability(op, Reason::StoreCapability));
    }
    run(b, op, Lock::Partition, &mut |tx| {
        if let Some(existing) = tx.machine(&rec.key)? {
            return if existing.fingerprint == rec.fingerprint {
                Ok(Accepted::Existing(existing))
            } else {
                Err(Error::identity_conflict(
                    op,
                    Evidence::NotDispatched,
                    Reason::FingerprintDiffers,
                ))
            };
        }
        let pending = tx.pending_machines()?;
        if pending >= u64::from(max_pending) {
            return Err(Error::admission_exhausted(op, Reason::MaxPending)
                .with_limit(pending + 1, max_pending.into()));
        }
        tx.put_machine(rec, true)?;
        Ok(Accepted::Inserted(rec.clone()))
    })
}

pub(crate) fn fetch_machine<B: Backend>(b: &B, key: &RecordKey) -> Result<MachineRecord, Error> {
    let op = Operation::StoreFetch;
    run(b, op, Lock::Read, &mut |tx| {
        tx.machine(key)?
            .ok_or(Error::not_found(op, Evidence::Unknown, Reason::Absent))
    })
}

pub(crate) fn claim_machine<B: Backend>(
    b: &B,
    key: &RecordKey,
    owner: &str,
    now_ms: u64,
    ttl_ms: u64,
) -> Result<MachineRecord, Error> {
    let op = Operation::StoreClaim;
    run(b, op, Lock::Record, &mut |tx| {
        let rec =
            tx.machine(key)?
                .ok_or(Error::not_found(op, Evidence::Unknown, Reason::Absent))?;
        let next = claim::claim_machine(&rec, owner, now_ms, ttl_ms)?;
        tx.put_machine(&next, false)?;
        Ok(next)
    })
}

/// Ends `owner`'s claim at `generation` (`Store::release_claim`): the pure
/// rules of `claim::release_*`; a lapsed claim is returned as stored.
pub(crate) fn release_claim<B: Backend>(
    b: &B,
    claimed: &Claimed,
    owner: &str,
    generation: u64,
    now_ms: u64,
) -> Result<Released, Error> {
    let op = Operation::StoreClaim;
    match claimed {
        Claimed::Execution(key) => run(b, op, Lock::Record, &mut |tx| {
            let rec =
                tx.exec(key)?
                    .ok_or(Error::not_found(op, Evidence::Unknown, Reason::Absent))?;
            match claim::release_exec(&rec, owner, generation, now_ms)? {
                Release::Ended(next) => {
                    tx.put_exec(&next, false)?;
                    Ok(Released::Execution(Box::new(next)))
                }
                Release::Lapsed => Ok(Released::Execution(Box::new(rec))),
            }
        }),
        Claimed::Machine(key) => run(b, op, Lock::Record, &mut |tx| {
            let rec =
                tx.machine(key)?
                    .ok_or(Error::not_found(op, Evidence::Unknown, Reason::Absent))?;
            match claim::release_machine(&rec, owner, generation, now_ms)? {
                Release::Ended(next) => {
                    tx.put_machine(&next, false)?;
                    Ok(Released::Machine(Box::new(next)))
                }
                Release::Lapsed => Ok(Released::Machine(Box::new(rec))),
            }
        }),
        Claimed::Worker(worker) => {
            check_worker_id(worker).map_err(|e| e.with_operation(op))?;
            run(b, op, Lock::Partition, &mut |tx| {
                let current = tx.lease(worker)?;
                match claim::release_lease(current.as_ref(), owner, generation, now_ms)? {
                    Release::Ended(next) => {
                        tx.put_lease(worker, &next, false)?;
                        Ok(Released::Worker(Some(next)))
                    }
                    Release::Lapsed => Ok(Released::Worker(current.clone())),
                }
            })
        }
    }
}

pub(crate) fn claim_version<B: Backend>(
    b: &B,
    key: &RecordKey,
    owner: &str,
    version: u64,
    now_ms: u64,
    ttl_ms: u64,
) -> Result<ExecutionRecord, Error> {
    let op = Operation::StoreClaim;
    run(b, op, Lock::Record, &mut |tx| {
        let rec = tx
            .exec(key)?
            .ok_or(Error::not_found(op, Evidence::Unknown, Reason::Absent))?;
        let lease = match &rec.assignment {
            Some(a) => tx.lease(&a.worker_id)?,
            None => None,
        };
        let next = claim::claim_exec_version(&rec, owner, version, lease.as_ref(), now_ms, ttl_ms)?;
        tx.put_exec(&next, false)?;
        Ok(next)
    })
}

pub(crate) fn claim_machine_version<B: Backend>(
    b: &B,
    key: &RecordKey,
    owner: &str,
    version: u64,
    now_ms: u64,
    ttl_ms: u64,
) -> Result<MachineRecord, Error> {
    let op = Operation::StoreClaim;
    run(b, op, Lock::Record, &mut |tx| {
        let rec =
            tx.machine(key)?
                .ok_or(Error::not_found(op, Evidence::Unknown, Reason::Absent))?;
        let lease = match &rec.assignment {
            Some(a) => tx.lease(&a.worker_id)?,
            None => None,
        };
        let next =
            claim::claim_machine_version(&rec, owner, version, lease.as_ref(), now_ms, ttl_ms)?;
        tx.put_machine(&next, false)?;
        Ok(next)
    })
}

pub(crate) fn write_machine<B: Backend>(
    b: &B,
    key: &RecordKey,
    guard: &Guard,
    patch: &MachinePatch,
    now_ms: u64,
) -> Result<MachineRecord, Error> {
    let op = Operation::StoreWrite;
    run(b, op, Lock::Partition, &mut |tx| {
        let rec = guarded_machine(tx, key, guard, now_ms, op)?;
        let next = apply_machine(&rec, patch, now_ms).map_err(|e| e.with_operation(op))?;
        if !rec.reserved_ports.is_empty() && next.reserved_ports.is_empty() {
            tx.delete_ports(key)?;
        }
        tx.put_machine(&next, false)?;
        Ok(next)
    })
}

pub(crate) fn reserve_machine<B: Backend>(
    b: &B,
    key: &RecordKey,
    guard: &Guard,
    req: &Reserve,
    now_ms: u64,
) -> Result<MachineRecord, Error> {
    let op = Operation::StoreReserve;
    run(b, op, Lock::Partition, &mut |tx| {
        let generation = live_lease(tx, req, guard, now_ms, op)?;
        let rec = guarded_machine(tx, key, guard, now_ms, op)?;
        if rec.assignment.is_some() || rec.reservation.is_some() {
            return Err(Error::validation(op, Reason::AlreadyAssigned));
        }
        if now_ms < rec.updated_at_ms {
            return Err(Error::validation(op, Reason::ClockBeforeUpdatedAt));
        }
        let who = Assigned::Machine(rec.key.clone());
        check_name(tx, req, &who, op)?;
        check_capacity(tx, req, op)?;
        let ports: Vec<u16> = rec.spec.ports.iter().map(|p| p.host).collect();
        for port in &ports {
            if tx.port_owner(&req.worker_id, *port)?.is_some() {
                return Err(Error::port_conflict(
                    op,
                    Evidence::NotDispatched,
                    Reason::HostPortTaken,
                ));
            }
        }
        let mut next = rec;
        next.assignment = Some(Assignment {
            worker_id: req.worker_id.clone(),
            worker_generation: generation,
            machine_name: req.machine_name.clone(),
        });
        next.reservation = Some(req.capacity);
        next.reserved_ports.clone_from(&ports);
        next.version += 1;
        next.updated_at_ms = now_ms;
        next.validate().map_err(|e| e.with_operation(op))?;
        tx.put_machine(&next, false)?;
        tx.put_assignment(&req.worker_id, &req.machine_name, &who)?;
        for port in ports {
            tx.put_port(&req.worker_id, port, key)?;
        }
        Ok(next)
    })
}

pub(crate) fn request_machine<B: Backend>(
    b: &B,
    key: &RecordKey,
    action: MachineOperation,
    version: u64,
    now_ms: u64,
) -> Result<MachineRecord, Error> {
    let op = Operation::StoreSlot;
    run(b, op, Lock::Record, &mut |tx| {
        let rec =
            tx.machine(key)?
                .ok_or(Error::not_found(op, Evidence::Unknown, Reason::Absent))?;
        match slot::request(&rec, action, version, now_ms)? {
            None => Ok(rec),
            Some(next) => {
                tx.put_machine(&next, false)?;
                Ok(next)
            }
        }
    })
}

pub(crate) fn acquire_slot<B: Backend>(
    b: &B,
    machine: &RecordKey,
    guard: &Guard,
    exec: &RecordKey,
    now_ms: u64,
) -> Result<MachineRecord, Error> {
    let op = Operation::StoreSlot;
    run(b, op, Lock::Partition, &mut |tx| {
        let m = guarded_machine(tx, machine, guard, now_ms, op)?;
        let e = tx
            .exec(exec)?
            .ok_or(Error::not_found(op, Evidence::Unknown, Reason::Absent))?;
        let next = slot::acquire(&m, &e, now_ms)?;
        if next != m {
            tx.put_machine(&next, false)?;
        }
        Ok(next)
    })
}

pub(crate) fn finish_slot<B: Backend>(
    b: &B,
    machine: &RecordKey,
    guard: &Guard,
    exec: &RecordKey,
    now_ms: u64,
) -> Result<(MachineRecord, Finish), Error> {
    finish_command(b, machine, guard, exec, now_ms).map(|(m, _, f)| (m, f))
}

pub(crate) fn finish_command<B: Backend>(
    b: &B,
    machine: &RecordKey,
    guard: &Guard,
    exec: &RecordKey,
    now_ms: u64,
) -> Result<(MachineRecord, ExecutionRecord, Finish), Error> {
    let op = Operation::StoreSlot;
    run(b, op, Lock::Partition, &mut |tx| {
        let m = guarded_machine(tx, machine, guard, now_ms, op)?;
        let e = tx
            .exec(exec)?
            .ok_or(Error::not_found(op, Evidence::Unknown, Reason::Absent))?;
        let (next, command, finish) = slot::finish_command(&m, &e, now_ms)?;
        tx.put_machine(&next, false)?;
        tx.put_exec(&command, false)?;
        Ok((next, command, finish))
    })
}

pub(crate) fn submit<B: Backend>(
    b: &B,
    rec: &ExecutionRecord,
    max_pending: u32,
) -> Result<Accepted<Submitted>, Error> {
    submit_as(b, rec, max_pending, false)
}

/// `submit`, and for an inserted command its dispatch intent in the same
/// transaction (after the slot is taken); an existing command is returned
/// untouched.
pub(crate) fn submit_dispatching<B: Backend>(
    b: &B,
    rec: &ExecutionRecord,
    max_pending: u32,
) -> Result<Accepted<Submitted>, Error> {
    submit_as(b, rec, max_pending, true)
}

fn submit_as<B: Backend>(
    b: &B,
    rec: &ExecutionRecord,
    max_pending: u32,
    intent: bool,
) -> Result<Accepted<Submitted>, Error> {
    let op = Operation::StoreAccept;
    check_pending(max_pending, op)?;
    rec.validate().map_err(|e| e.with_operation(op))?;
    if rec.state != ExecState::Accepted || rec.version != 1 {
        return Err(Error::validation(op, Reason::NotFreshlyAccepted));
    }
    let insert = inserted(rec, intent, op)?;
    let Some(machine_key) = rec.spec.machine.clone() else {
        return Err(Error::validation(op, Reason::NotAMachineCommand));
    };
    if !b
        .info()
        .capabilities
        .covers(exec_requirements(rec).capabilities)
    {
        return Err(Error::unsupported_capability(op, Reason::StoreCapability));
    }
    run(b, op, Lock::Partition, &mut |tx| {
        if let Some(existing) = tx.exec(&rec.key)? {
            return if existing.fingerprint == rec.fingerprint {
                let machine = tx.machine(&machine_key)?;
                Ok(Accepted::Existing(Submitted {
                    execution: existing,
                    machine,
                }))
            } else {
                Err(Error::identity_conflict(
                    op,
                    Evidence::NotDispatched,
                    Reason::FingerprintDiffers,
                ))
            };
        }
        let m = tx.machine(&machine_key)?.ok_or(Error::not_found(
            op,
            Evidence::Unknown,
            Reason::Absent,
        ))?;
        let pending = tx.pending_count()?;
        if pending >= u64::from(max_pending) {
            return Err(Error::admission_exhausted(op, Reason::MaxPending)
                .with_limit(pending + 1, max_pending.into()));
        }
        // The machine's time never goes back: the slot is taken at the
        // acceptance time, or at the machine's last write when that is later.
        let now = rec.accepted_at_ms.max(m.updated_at_ms);
        let held = if intent {
            slot::acquire_claimed(&m, rec, now)
        } else {
            slot::acquire(&m, rec, now)
        }
        .map_err(|e| e.with_operation(op))?;
        tx.put_exec(&insert, true)?;
        tx.put_machine(&held, false)?;
        Ok(Accepted::Inserted(Submitted {
            execution: insert.clone(),
            machine: Some(held),
        }))
    })
}

pub(crate) fn resolve_machine<B: Backend>(
    b: &B,
    key: &RecordKey,
    version: u64,
    quiesced: bool,
    disposition: &Disposition,
    now_ms: u64,
) -> Result<Resolved, Error> {
    let op = Operation::StoreSlot;
    if !quiesced {
        // AC-17.3.1: refused before anything is read.
        return Err(Error::validation(op, Reason::NotQuiesced));
    }
    run(b, op, Lock::Partition, &mut |tx| {
        let m = tx
            .machine(key)?
            .ok_or(Error::not_found(op, Evidence::Unknown, Reason::Absent))?;
        let command = match &m.active_execution {
            Some(k) => Some(tx.exec(k)?.ok_or(Error::store(
                op,
                Evidence::Unknown,
                Reason::ActiveExecutionMissing,
            ))?),
            None => None,
        };
        let (next, settled) =
            slot::resolve(&m, command.as_ref(), version, quiesced, disposition, now_ms)?;
        if !m.reserved_ports.is_empty() && next.reserved_ports.is_empty() {
            tx.delete_ports(key)?;
        }
        tx.put_machine(&next, false)?;
        if let Some(c) = &settled {
            tx.put_exec(c, false)?;
        }
        Ok(Resolved {
            machine: next,
            command: settled,
        })
    })
}

fn check_pending(max_pending: u32, op: Operation) -> Result<(), Error> {
    if (MIN_PENDING..=MAX_PENDING).contains(&max_pending) {
        Ok(())
    } else {
        Err(Error::validation(op, Reason::MaxPending)
            .with_limit(max_pending.into(), MAX_PENDING.into()))
    }
}

/// The kind and key an assignment row stores.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn assigned_parts(a: &Assigned) -> (RecordKind, &RecordKey) {
    match a {
        Assigned::Execution(k) => (RecordKind::Execution, k),
        Assigned::Machine(k) => (RecordKind::Machine, k),
    }
}
