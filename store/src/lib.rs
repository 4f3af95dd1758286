//! smolbox-store: durable execution and machine records behind one
//! synchronous [`Store`] trait (features C18, DESIGN.md §4), with three
//! adapters:
//!
//! - [`MemoryStore`]: ephemeral, bounded (C18.2); a durable runtime refuses it;
//! - `SqliteStore` (feature `sqlite`, default): one file, WAL, `BEGIN
//!   IMMEDIATE`, safe with several processes on one host;
//! - `PostgresStore` (feature `postgres`): many controllers on many hosts,
//!   real transactions and row locks.
//!
//! Every rule lives once, in `smolbox_core::managed` (transitions, evidence,
//! write-once fields, deadlines, guards, claims, the command slot, the
//! envelope). The adapters share one engine (`engine.rs`) that runs those
//! pure functions inside each adapter's transaction, so every mutation is
//! one transaction and a failure rolls back record, assignment, port,
//! capacity and index changes together.
//!
//! Reads never turn "unavailable", "corrupt" or "unknown version" into
//! `not_found`: `not_found` means the store positively answered "no such
//! row". There is no fallback store.
//!
//! Durable adapters seal every payload with AES-256-GCM (C18.4) before it
//! reaches the database; only identifiers, the fingerprint, state, version,
//! due time, worker and capacity numbers are projected into clear columns,
//! and those are checked against the decrypted payload on every read.
//! Leases, claims and generations fence store writes only; they never fence
//! HTTP already sent (C15).

use smolbox_core::managed::record::{ExecutionRecord, MachineRecord, Resources};
use smolbox_core::managed::slot::Finish;
use smolbox_core::managed::state::MachineOperation;
use smolbox_core::managed::{Capabilities, ExecPatch, Guard, Lease, MachinePatch, RecordKey};
use smolbox_core::{Category, Error, Evidence, Operation};

mod engine;
pub mod keys;
mod memory;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod row;
mod seal;
#[cfg(feature = "sqlite")]
mod sqlite;

pub use memory::{
    DEFAULT_MAX_BYTES, DEFAULT_MAX_RECORDS, MAX_BYTES, MAX_LEASES, MAX_RECORDS, MemoryConfig,
    MemoryStore,
};
#[cfg(feature = "postgres")]
pub use postgres::PostgresStore;
pub use seal::{EncryptionKey, Sealer};
#[cfg(feature = "sqlite")]
pub use sqlite::{SqliteMode, SqliteOptions, SqliteStore};

/// Record schema every adapter stores (C18.1).
pub const SCHEMA: u32 = 1;
/// Smallest `max_pending` of `accept` (C12.1).
pub const MIN_PENDING: u32 = 1;
/// Largest `max_pending` of `accept` (C12.1).
pub const MAX_PENDING: u32 = 10_000;
/// Largest page of `due` (C18.1).
pub const MAX_DUE_PAGE: u32 = 100;

/// What a store is and can hold (C18.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreInfo {
    /// Record schema, always [`SCHEMA`].
    pub schema: u32,
    /// False for the in-memory store; a durable runtime refuses it.
    pub durable: bool,
    /// Every mutation is one transaction.
    pub atomic: bool,
    /// Feature capabilities (C19.2).
    pub capabilities: Capabilities,
}

/// The outcome of an idempotent accept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Accepted<T> {
    /// The record was inserted.
    Inserted(T),
    /// A record with this identity and fingerprint already existed; it is
    /// returned as stored (AC-12.5.1, AC-12.5.2).
    Existing(T),
}

impl<T> Accepted<T> {
    /// The record either way.
    pub fn into_record(self) -> T {
        match self {
            Self::Inserted(r) | Self::Existing(r) => r,
        }
    }
}

/// What a reservation asks for (C18.1 reserve).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reserve {
    /// Worker id; the guard's owner must hold its live lease.
    pub worker_id: String,
    /// Machine name on that worker (unique per worker).
    pub machine_name: String,
    /// What the record reserves.
    pub capacity: Resources,
    /// The worker's total capacity (C12.2).
    pub limit: Resources,
}

/// A keyset cursor of `due`: the last `(next_due_at, scope, id)` seen.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct DueCursor {
    /// Due time of the last record.
    pub due_at_ms: u64,
    /// Its key.
    pub key: RecordKey,
}

/// One page of `due`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DuePage {
    /// Records ordered by `(next_due_at, scope, id)`.
    pub records: Vec<ExecutionRecord>,
    /// Cursor for the next page; `None` when this page was not full.
    pub next: Option<DueCursor>,
}

/// Transactional, versioned persistence of execution and machine records
/// (C18.1). Synchronous: the tokio shell calls it through
/// `spawn_blocking`, the blocking shell directly.
///
/// Every method is one transaction. Errors are `store` (unavailable,
/// corrupt, unknown version), `not_found` (positive absence only),
/// `stale_claim`, `stale_version`, `identity_conflict`,
/// `admission_exhausted`, `port_conflict`, `expired` or `validation`.
pub trait Store: Send + Sync {
    /// Schema, durability, atomicity and capabilities.
    fn info(&self) -> StoreInfo;

    /// Inserts an accepted record, or returns the existing one with the
    /// same identity and fingerprint (even when the pending limit is
    /// reached); a different fingerprint is `identity_conflict`; more than
    /// `max_pending` (1–10,000) non-terminal records is
    /// `admission_exhausted`.
    ///
    /// # Errors
    /// See the trait docs.
    fn accept(
        &self,
        record: &ExecutionRecord,
        max_pending: u32,
    ) -> Result<Accepted<ExecutionRecord>, Error>;

    /// The stored record.
    ///
    /// # Errors
    /// `not_found` only when the store positively reports absence.
    fn fetch(&self, key: &RecordKey) -> Result<ExecutionRecord, Error>;

    /// The record assigned machine `name` on `worker_id`, execution or
    /// machine, through the assignment index kept after cleanup.
    ///
    /// # Errors
    /// `not_found` when no record was ever assigned that name.
    fn find_machine(&self, worker_id: &str, name: &str) -> Result<Assigned, Error>;

    /// Takes or renews the worker lease (C15).
    ///
    /// # Errors
    /// `stale_claim` when another owner holds a live lease.
    fn claim_worker(
        &self,
        worker_id: &str,
        owner: &str,
        now_ms: u64,
        ttl_ms: u64,
    ) -> Result<Lease, Error>;

    /// Takes or renews the claim on a record (C15); bumps its version.
    ///
    /// # Errors
    /// `stale_claim` when another owner holds a live claim.
    fn claim(
        &self,
        key: &RecordKey,
        owner: &str,
        now_ms: u64,
        ttl_ms: u64,
    ) -> Result<ExecutionRecord, Error>;

    /// A guarded patch (C13.3, C15).
    ///
    /// # Errors
    /// `stale_version`, `stale_claim`, `validation` (forbidden move).
    fn write(
        &self,
        key: &RecordKey,
        guard: &Guard,
        patch: &ExecPatch,
        now_ms: u64,
    ) -> Result<ExecutionRecord, Error>;

    /// Reserves worker capacity and assigns the machine name, checking the
    /// worker lease, the claim, the version, the queue deadline and the
    /// worker's slot/CPU/memory/disk totals.
    ///
    /// # Errors
    /// `admission_exhausted` when the totals would be exceeded; `expired`
    /// past the queue deadline; `identity_conflict` for a name in use.
    fn reserve(
        &self,
        key: &RecordKey,
        guard: &Guard,
        request: &Reserve,
        now_ms: u64,
    ) -> Result<ExecutionRecord, Error>;

    /// Releases the reservation; only when cleanup is complete and the
    /// record is unassigned or its absence is recorded (C0.4 rule 7).
    ///
    /// # Errors
    /// `validation` when release is not yet allowed.
    fn release(
        &self,
        key: &RecordKey,
        guard: &Guard,
        now_ms: u64,
    ) -> Result<ExecutionRecord, Error>;

    /// Persists the first cancel time (idempotent) and makes the record due
    /// now. Needs no claim; never changes the state.
    ///
    /// # Errors
    /// `not_found` for an absent record.
    fn cancel(&self, key: &RecordKey, now_ms: u64) -> Result<ExecutionRecord, Error>;

    /// Records due at `now_ms`, keyset-ordered by `(next_due_at, scope, id)`,
    /// strictly after `after`, at most `limit` (1–100).
    ///
    /// # Errors
    /// `validation` for a bad limit.
    fn due(&self, now_ms: u64, after: Option<&DueCursor>, limit: u32) -> Result<DuePage, Error>;

    /// Capacity reserved on `worker_id` by executions and machines.
    ///
    /// # Errors
    /// `store` on failure (never zero on failure).
    fn usage(&self, worker_id: &str) -> Result<Resources, Error>;

    /// Inserts an accepted machine or returns the existing one (dedup by
    /// fingerprint, tombstones included).
    ///
    /// # Errors
    /// `identity_conflict`, `admission_exhausted`.
    fn accept_machine(
        &self,
        record: &MachineRecord,
        max_pending: u32,
    ) -> Result<Accepted<MachineRecord>, Error>;

    /// The stored machine record.
    ///
    /// # Errors
    /// `not_found` only on positive absence.
    fn fetch_machine(&self, key: &RecordKey) -> Result<MachineRecord, Error>;

    /// Claims a machine record.
    ///
    /// # Errors
    /// `stale_claim`.
    fn claim_machine(
        &self,
        key: &RecordKey,
        owner: &str,
        now_ms: u64,
        ttl_ms: u64,
    ) -> Result<MachineRecord, Error>;

    /// A guarded machine patch; entering `deleted` frees its ports.
    ///
    /// # Errors
    /// `stale_version`, `stale_claim`, `validation`.
    fn write_machine(
        &self,
        key: &RecordKey,
        guard: &Guard,
        patch: &MachinePatch,
        now_ms: u64,
    ) -> Result<MachineRecord, Error>;

    /// Reserves capacity and the spec's host ports for a machine.
    ///
    /// # Errors
    /// As [`Store::reserve`], plus `port_conflict`.
    fn reserve_machine(
        &self,
        key: &RecordKey,
        guard: &Guard,
        request: &Reserve,
        now_ms: u64,
    ) -> Result<MachineRecord, Error>;

    /// Records a versioned lifecycle request (C14.2); repeating the latest
    /// identical request returns the current record.
    ///
    /// # Errors
    /// `stale_version`, `admission_exhausted`.
    fn request_machine(
        &self,
        key: &RecordKey,
        action: MachineOperation,
        version: u64,
        now_ms: u64,
    ) -> Result<MachineRecord, Error>;

    /// Gives the machine's command slot to `exec` (C14.3), guarded by the
    /// machine claim.
    ///
    /// # Errors
    /// `admission_exhausted` when held or not idle.
    fn acquire_slot(
        &self,
        machine: &RecordKey,
        guard: &Guard,
        exec: &RecordKey,
        now_ms: u64,
    ) -> Result<MachineRecord, Error>;

    /// Finishes `exec`'s hold on the slot (C14.3).
    ///
    /// # Errors
    /// `validation` when `exec` does not hold it or has not finished.
    fn finish_slot(
        &self,
        machine: &RecordKey,
        guard: &Guard,
        exec: &RecordKey,
        now_ms: u64,
    ) -> Result<(MachineRecord, Finish), Error>;
}

/// What `find_machine` found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Assigned {
    /// A disposable execution's machine.
    Execution(RecordKey),
    /// A retained machine.
    Machine(RecordKey),
}

/// A `store` error: the store failed (unavailable, corrupt, unknown version).
pub(crate) const fn store_error(op: Operation, reason: &'static str) -> Error {
    Error::new(Category::Store, op, Evidence::Unknown).with_reason(reason)
}

/// A `not_found` error: the store positively answered "no such record".
pub(crate) const fn not_found(op: Operation) -> Error {
    Error::new(Category::NotFound, op, Evidence::Unknown).with_reason("absent")
}

/// Forwards every [`Store`] method to the shared engine over a backend.
macro_rules! impl_store {
    ($ty:ty) => {
        impl $crate::Store for $ty {
            fn info(&self) -> $crate::StoreInfo {
                $crate::engine::Backend::info(self)
            }
            fn accept(
                &self,
                record: &smolbox_core::managed::ExecutionRecord,
                max_pending: u32,
            ) -> Result<$crate::Accepted<smolbox_core::managed::ExecutionRecord>, smolbox_core::Error>
            {
                $crate::engine::accept(self, record, max_pending)
            }
            fn fetch(
                &self,
                key: &smolbox_core::managed::RecordKey,
            ) -> Result<smolbox_core::managed::ExecutionRecord, smolbox_core::Error> {
                $crate::engine::fetch(self, key)
            }
            fn find_machine(
                &self,
                worker_id: &str,
                name: &str,
            ) -> Result<$crate::Assigned, smolbox_core::Error> {
                $crate::engine::find_machine(self, worker_id, name)
            }
            fn claim_worker(
                &self,
                worker_id: &str,
                owner: &str,
                now_ms: u64,
                ttl_ms: u64,
            ) -> Result<smolbox_core::managed::Lease, smolbox_core::Error> {
                $crate::engine::claim_worker(self, worker_id, owner, now_ms, ttl_ms)
            }
            fn claim(
                &self,
                key: &smolbox_core::managed::RecordKey,
                owner: &str,
                now_ms: u64,
                ttl_ms: u64,
            ) -> Result<smolbox_core::managed::ExecutionRecord, smolbox_core::Error> {
                $crate::engine::claim(self, key, owner, now_ms, ttl_ms)
            }
            fn write(
                &self,
                key: &smolbox_core::managed::RecordKey,
                guard: &smolbox_core::managed::Guard,
                patch: &smolbox_core::managed::ExecPatch,
                now_ms: u64,
            ) -> Result<smolbox_core::managed::ExecutionRecord, smolbox_core::Error> {
                $crate::engine::write(self, key, guard, patch, now_ms)
            }
            fn reserve(
                &self,
                key: &smolbox_core::managed::RecordKey,
                guard: &smolbox_core::managed::Guard,
                request: &$crate::Reserve,
                now_ms: u64,
            ) -> Result<smolbox_core::managed::ExecutionRecord, smolbox_core::Error> {
                $crate::engine::reserve(self, key, guard, request, now_ms)
            }
            fn release(
                &self,
                key: &smolbox_core::managed::RecordKey,
                guard: &smolbox_core::managed::Guard,
                now_ms: u64,
            ) -> Result<smolbox_core::managed::ExecutionRecord, smolbox_core::Error> {
                $crate::engine::release(self, key, guard, now_ms)
            }
            fn cancel(
                &self,
                key: &smolbox_core::managed::RecordKey,
                now_ms: u64,
            ) -> Result<smolbox_core::managed::ExecutionRecord, smolbox_core::Error> {
                $crate::engine::cancel(self, key, now_ms)
            }
            fn due(
                &self,
                now_ms: u64,
                after: Option<&$crate::DueCursor>,
                limit: u32,
            ) -> Result<$crate::DuePage, smolbox_core::Error> {
                $crate::engine::due(self, now_ms, after, limit)
            }
            fn usage(
                &self,
                worker_id: &str,
            ) -> Result<smolbox_core::managed::record::Resources, smolbox_core::Error> {
                $crate::engine::usage(self, worker_id)
            }
            fn accept_machine(
                &self,
                record: &smolbox_core::managed::MachineRecord,
                max_pending: u32,
            ) -> Result<$crate::Accepted<smolbox_core::managed::MachineRecord>, smolbox_core::Error>
            {
                $crate::engine::accept_machine(self, record, max_pending)
            }
            fn fetch_machine(
                &self,
                key: &smolbox_core::managed::RecordKey,
            ) -> Result<smolbox_core::managed::MachineRecord, smolbox_core::Error> {
                $crate::engine::fetch_machine(self, key)
            }
            fn claim_machine(
                &self,
                key: &smolbox_core::managed::RecordKey,
                owner: &str,
                now_ms: u64,
                ttl_ms: u64,
            ) -> Result<smolbox_core::managed::MachineRecord, smolbox_core::Error> {
                $crate::engine::claim_machine(self, key, owner, now_ms, ttl_ms)
            }
            fn write_machine(
                &self,
                key: &smolbox_core::managed::RecordKey,
                guard: &smolbox_core::managed::Guard,
                patch: &smolbox_core::managed::MachinePatch,
                now_ms: u64,
            ) -> Result<smolbox_core::managed::MachineRecord, smolbox_core::Error> {
                $crate::engine::write_machine(self, key, guard, patch, now_ms)
            }
            fn reserve_machine(
                &self,
                key: &smolbox_core::managed::RecordKey,
                guard: &smolbox_core::managed::Guard,
                request: &$crate::Reserve,
                now_ms: u64,
            ) -> Result<smolbox_core::managed::MachineRecord, smolbox_core::Error> {
                $crate::engine::reserve_machine(self, key, guard, request, now_ms)
            }
            fn request_machine(
                &self,
                key: &smolbox_core::managed::RecordKey,
                action: smolbox_core::managed::state::MachineOperation,
                version: u64,
                now_ms: u64,
            ) -> Result<smolbox_core::managed::MachineRecord, smolbox_core::Error> {
                $crate::engine::request_machine(self, key, action, version, now_ms)
            }
            fn acquire_slot(
                &self,
                machine: &smolbox_core::managed::RecordKey,
                guard: &smolbox_core::managed::Guard,
                exec: &smolbox_core::managed::RecordKey,
                now_ms: u64,
            ) -> Result<smolbox_core::managed::MachineRecord, smolbox_core::Error> {
                $crate::engine::acquire_slot(self, machine, guard, exec, now_ms)
            }
            fn finish_slot(
                &self,
                machine: &smolbox_core::managed::RecordKey,
                guard: &smolbox_core::managed::Guard,
                exec: &smolbox_core::managed::RecordKey,
                now_ms: u64,
            ) -> Result<
                (
                    smolbox_core::managed::MachineRecord,
                    smolbox_core::managed::slot::Finish,
                ),
                smolbox_core::Error,
            > {
                $crate::engine::finish_slot(self, machine, guard, exec, now_ms)
            }
        }
    };
}
pub(crate) use impl_store;
