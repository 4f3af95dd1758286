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
//! reaches the database, bound to the row's identity and version (an older
//! payload swapped back fails authentication); only identifiers, the
//! fingerprint, state, version, due time, worker and capacity numbers are
//! projected into clear columns, and those are checked against the
//! decrypted payload on every read. Each partition stores a key-check
//! value, so a store opened with a missing or replaced key is refused at
//! open (`key_mismatch`) instead of failing record by record. A whole row
//! swapped back (its version column with its own sealed payload) is caught
//! within a handle's life: each handle remembers the highest write counter
//! it saw per key (an execution's version, a machine's revision, which a
//! claim renewal moves too; bounded, [`MAX_WATCHED_KEYS`]), a read below it
//! is `store`
//! / `record_went_back`, and the due scans leave such a record out.
//! Leases, claims and generations fence store writes only; they never fence
//! HTTP already sent (C15).

use smolbox_core::Error;
use smolbox_core::managed::controller::{Claimed, DueAfter, StoreOp, StoreReply, StoreResult};
use smolbox_core::managed::record::{ExecutionRecord, MachineRecord, Resources};
use smolbox_core::managed::slot::{Disposition, Finish};
use smolbox_core::managed::state::MachineOperation;
use smolbox_core::managed::{Capabilities, ExecPatch, Guard, Lease, MachinePatch, RecordKey};

pub mod artifacts;
mod clock;
mod engine;
pub mod entropy;
#[cfg(feature = "testkit")]
pub mod fuzzing;
pub mod keys;
mod memory;
#[cfg(feature = "postgres")]
mod pg_connect;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod row;
pub mod runtime;
mod seal;
#[cfg(feature = "sqlite")]
mod sqlite;
pub mod terminal_ops;
pub mod terminals;
pub mod trace;
mod watch;

#[cfg(feature = "testkit")]
pub use memory::MemorySnapshot;
pub use memory::{
    DEFAULT_MAX_BYTES, DEFAULT_MAX_RECORDS, MAX_BYTES, MAX_LEASES, MAX_RECORDS, MemoryConfig,
    MemoryStore,
};
#[cfg(feature = "postgres")]
pub use pg_connect::{MAX_CA_BYTES, PostgresOptions};
#[cfg(feature = "postgres")]
pub use postgres::PostgresStore;
pub use seal::{EncryptionKey, KEY_ID, Sealer};
#[cfg(feature = "sqlite")]
pub use sqlite::{SqliteMode, SqliteOptions, SqliteStore};
pub use terminal_ops::apply_terminal_op;
pub use watch::MAX_WATCHED_KEYS;

/// Record schema every adapter stores (C18.1).
pub const SCHEMA: u32 = 1;
/// Smallest `max_pending` of `accept` (C12.1).
pub const MIN_PENDING: u32 = 1;
/// Largest `max_pending` of `accept` (C12.1).
pub const MAX_PENDING: u32 = 10_000;
/// Largest page of `due` (C18.1).
pub const MAX_DUE_PAGE: u32 = 100;
/// Largest page of `list` and `list_machines` (C14.2, C18.1).
pub const MAX_LIST_PAGE: u32 = 100;
/// The page size callers use when theirs asks for none (C14.2).
pub const DEFAULT_LIST_PAGE: u32 = 20;

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

/// One page of `due` (execution records) or `due_machines`
/// (`DuePage<MachineRecord>`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DuePage<T = ExecutionRecord> {
    /// Records ordered by `(next_due_at, scope, id)`.
    pub records: Vec<T>,
    /// Cursor for the next page; `None` when this page was not full.
    pub next: Option<DueCursor>,
}

/// One page of `list` or `list_machines`: records of one scope ordered by
/// id. An empty page is `records: [], next: None`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Page<T> {
    /// Records ordered by id.
    pub records: Vec<T>,
    /// The exclusive cursor for the next page (the last id of this page);
    /// `None` when this page was not full.
    pub next: Option<String>,
}

/// What `submit` accepted: the command and the machine whose slot it holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Submitted {
    /// The command's execution record.
    pub execution: ExecutionRecord,
    /// Its machine as stored after the transaction; `None` only when an
    /// existing command names a machine the store positively does not hold.
    pub machine: Option<MachineRecord>,
}

/// What `resolve_machine` wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    /// The resolved machine.
    pub machine: MachineRecord,
    /// The command that held its slot, settled (C17.3), if there was one.
    pub command: Option<ExecutionRecord>,
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

    /// Resources reserved on `worker_id` by executions and machines.
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

    /// Claims a machine record. Moves its `claims` count, not its version
    /// (callers compare against the version; the claim fences writers).
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

    /// Finishes `exec`'s hold on the slot (C14.3) and sets the command's
    /// cleanup in the same transaction, as [`Store::finish_command`]
    /// without returning the command record.
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

    /// Execution records of `scope` in every state, ordered by id, strictly
    /// after the id `after`, at most `limit` (1–100).
    ///
    /// # Errors
    /// `validation` for a bad scope or limit; `store` on failure (never an
    /// empty page on failure).
    fn list(
        &self,
        scope: &str,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Page<ExecutionRecord>, Error>;

    /// Machine records of `scope`, deleted ones included, ordered by id,
    /// strictly after the id `after`, at most `limit` (1–100; callers
    /// without a preference use [`DEFAULT_LIST_PAGE`]).
    ///
    /// # Errors
    /// As [`Store::list`].
    fn list_machines(
        &self,
        scope: &str,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Page<MachineRecord>, Error>;

    /// Machine records due at `now_ms`, keyset-ordered by `(next_due_at,
    /// scope, id)`, strictly after `after`, at most `limit` (1–100).
    ///
    /// # Errors
    /// `validation` for a bad limit.
    fn due_machines(
        &self,
        now_ms: u64,
        after: Option<&DueCursor>,
        limit: u32,
    ) -> Result<DuePage<MachineRecord>, Error>;

    /// Claims an execution record as [`Store::claim`], only while its
    /// version is still `version`, and re-fences it (C15): a record
    /// assigned to a worker moves to the generation of that worker's live
    /// lease, which `owner` must hold, so writers of an older worker-lease
    /// generation are fenced from then on (`smolbox_core::managed::claim::
    /// claim_exec_version`). This is how a recovering controller takes over
    /// a disposable record another controller assigned.
    ///
    /// # Errors
    /// `stale_version` when the record moved on; `stale_claim` (reason
    /// `worker_lease`) for an assigned record whose worker lease `owner`
    /// does not hold live; otherwise as [`Store::claim`].
    fn claim_version(
        &self,
        key: &RecordKey,
        owner: &str,
        version: u64,
        now_ms: u64,
        ttl_ms: u64,
    ) -> Result<ExecutionRecord, Error>;

    /// Claims a machine record as [`Store::claim_machine`], only while its
    /// version is still `version`, and re-fences it as
    /// [`Store::claim_version`] does (`smolbox_core::managed::claim::
    /// claim_machine_version`): an assigned machine moves to the generation
    /// of its worker's live lease, which `owner` must hold. How a
    /// controller takes over a retained machine another controller left
    /// under an older worker lease.
    ///
    /// # Errors
    /// `stale_version` when the record moved on; `stale_claim` (reason
    /// `worker_lease`) for an assigned machine whose worker lease `owner`
    /// does not hold live; otherwise as [`Store::claim_machine`].
    fn claim_machine_version(
        &self,
        key: &RecordKey,
        owner: &str,
        version: u64,
        now_ms: u64,
        ttl_ms: u64,
    ) -> Result<MachineRecord, Error>;

    /// Accepts a command on a retained machine and gives it the machine's
    /// command slot in one transaction (C14.3), at the record's acceptance
    /// time. An existing record with the same identity and fingerprint is
    /// returned as stored even when the slot is held, the machine deleted or
    /// the pending limit reached (AC-12.5.2). Needs no claim: taking the
    /// slot moves the machine's version, which fences every writer that
    /// read the machine before.
    ///
    /// # Errors
    /// `identity_conflict` for a different fingerprint; `admission_exhausted`
    /// when the slot is held, the machine is not idle and running, or more
    /// than `max_pending` (1–10,000) records are pending; `validation` when
    /// the record is not a fresh command on a machine or differs from the
    /// machine in scope, artifact or profile; `not_found` when the machine
    /// is positively absent.
    fn submit(
        &self,
        record: &ExecutionRecord,
        max_pending: u32,
    ) -> Result<Accepted<Submitted>, Error>;

    /// Finishes `exec`'s hold on the slot and sets its cleanup in the same
    /// transaction (C14.3): released with cleanup `complete`, or kept
    /// (machine `unknown`) with cleanup `failed`. Guarded by the machine
    /// claim; both records move one version.
    ///
    /// # Errors
    /// As [`Store::finish_slot`].
    fn finish_command(
        &self,
        machine: &RecordKey,
        guard: &Guard,
        exec: &RecordKey,
        now_ms: u64,
    ) -> Result<(MachineRecord, ExecutionRecord, Finish), Error>;

    /// Quiescent resolution, store half (C17.3): at the inspected `version`
    /// and with `quiesced` asserted, clears the command slot and records the
    /// verified stop, or records deletion and absence and releases capacity
    /// and ports; the command that held the slot keeps an uncertain outcome
    /// and completes its cleanup. One transaction; needs no claim (the
    /// operator stopped the old controllers), the version guards it.
    ///
    /// # Errors
    /// `validation` without `quiesced` (`not_quiesced`) or for a deleted
    /// machine; `stale_version`; `identity_conflict` for another
    /// incarnation or a state other than stopped / created; `not_found`.
    fn resolve_machine(
        &self,
        key: &RecordKey,
        version: u64,
        quiesced: bool,
        disposition: &Disposition,
        now_ms: u64,
    ) -> Result<Resolved, Error>;

    /// [`Store::accept`], and for an inserted record its dispatch intent
    /// in the same transaction (issue 16: acceptance, claim and intent in
    /// one commit): the record must carry its submitter's claim and is
    /// stored (version 1) `dispatching` / `dispatch_uncertain` after
    /// `preparing` and `ready`, each move checked by the transition table
    /// (`smolbox_core::managed::patch::intent_at_accept`). An existing
    /// record (same identity and fingerprint) is returned untouched: no
    /// intent is written for it.
    ///
    /// # Errors
    /// As [`Store::accept`]; `validation` (`intent_without_claim`) for a
    /// record without a live claim.
    fn accept_dispatching(
        &self,
        record: &ExecutionRecord,
        max_pending: u32,
    ) -> Result<Accepted<ExecutionRecord>, Error>;

    /// [`Store::submit`] (acceptance and the command slot), and for an
    /// inserted command its dispatch intent in the same transaction, as
    /// [`Store::accept_dispatching`].
    ///
    /// # Errors
    /// As [`Store::submit`] and [`Store::accept_dispatching`].
    fn submit_dispatching(
        &self,
        record: &ExecutionRecord,
        max_pending: u32,
    ) -> Result<Accepted<Submitted>, Error>;

    /// A guarded write of 1–4 patches in one transaction: the guard is
    /// checked once, then each patch is applied in order by the same rules
    /// as [`Store::write`]; the version moves by one, as for every write;
    /// any refusal stores nothing.
    ///
    /// # Errors
    /// As [`Store::write`]; `validation` (`steps`) for 0 or more than 4.
    fn write_steps(
        &self,
        key: &RecordKey,
        guard: &Guard,
        patches: &[ExecPatch],
        now_ms: u64,
    ) -> Result<ExecutionRecord, Error>;

    /// Ends `owner`'s claim on an execution record, a machine record or a
    /// worker lease (C15), held at `generation`: a controller shutting
    /// down releases what it holds so the next one need not wait out the
    /// TTL. The claim ends in place, as if its TTL had lapsed at `now_ms`
    /// (`smolbox_core::managed::claim::release_exec`): the next owner takes
    /// it at once with generation + 1. A record's version (a machine's
    /// `claims`) moves by one; its state, evidence, result, cleanup, slot,
    /// reservation and ports never change; no capacity is freed. A claim
    /// that has lapsed already is returned as stored, nothing written.
    ///
    /// # Errors
    /// `stale_claim` (`claim_owner`) when the claim is not `owner`'s at
    /// `generation` (another controller took it over: nothing changes);
    /// `not_found` for an absent record; `validation` for a bad owner.
    fn release_claim(
        &self,
        claimed: &Claimed,
        owner: &str,
        generation: u64,
        now_ms: u64,
    ) -> Result<Released, Error>;

    /// Write transactions this store object committed since it was opened
    /// (reads are not counted), or `None` when it does not count them (a
    /// wrapper, for example). For tests and benchmarks (issue 16: commits
    /// per command).
    fn commits(&self) -> Option<u64> {
        None
    }
}

/// What `release_claim` returns: the record or lease as stored after it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Released {
    /// An execution record.
    Execution(Box<ExecutionRecord>),
    /// A machine record.
    Machine(Box<MachineRecord>),
    /// A worker lease (`None`: the worker was never leased).
    Worker(Option<Lease>),
}

/// What `find_machine` found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Assigned {
    /// A disposable execution's machine.
    Execution(RecordKey),
    /// A retained machine.
    Machine(RecordKey),
}

/// Writes [`Store`] methods that only forward, from their signatures:
/// `to field;` calls `self.field.method(args)` (a wrapper that changes a
/// few methods lists the others here), `engine;` calls the shared engine's
/// function of the same name with `self` first (the backends). One
/// signature per method, so a forward is never spelled out by hand.
#[macro_export]
macro_rules! forward_store {
    (to $field:ident; $(fn $name:ident(&self $(, $arg:ident: $ty:ty)* $(,)?) -> $ret:ty;)*) => {
        $(fn $name(&self $(, $arg: $ty)*) -> $ret {
            self.$field.$name($($arg),*)
        })*
    };
    (engine; $(fn $name:ident(&self $(, $arg:ident: $ty:ty)* $(,)?) -> $ret:ty;)*) => {
        $(fn $name(&self $(, $arg: $ty)*) -> $ret {
            $crate::engine::$name(self $(, $arg)*)
        })*
    };
}

/// Forwards every [`Store`] method to the shared engine over a backend.
macro_rules! impl_store {
    ($ty:ty) => {
        impl $crate::Store for $ty {
            $crate::forward_store! { engine;
                fn accept(&self, record: &smolbox_core::managed::ExecutionRecord, max_pending: u32)
                    -> Result<$crate::Accepted<smolbox_core::managed::ExecutionRecord>, smolbox_core::Error>;
                fn fetch(&self, key: &smolbox_core::managed::RecordKey)
                    -> Result<smolbox_core::managed::ExecutionRecord, smolbox_core::Error>;
                fn find_machine(&self, worker_id: &str, name: &str)
                    -> Result<$crate::Assigned, smolbox_core::Error>;
                fn claim_worker(&self, worker_id: &str, owner: &str, now_ms: u64, ttl_ms: u64)
                    -> Result<smolbox_core::managed::Lease, smolbox_core::Error>;
                fn claim(&self, key: &smolbox_core::managed::RecordKey, owner: &str, now_ms: u64, ttl_ms: u64)
                    -> Result<smolbox_core::managed::ExecutionRecord, smolbox_core::Error>;
                fn write(&self, key: &smolbox_core::managed::RecordKey, guard: &smolbox_core::managed::Guard, patch: &smolbox_core::managed::ExecPatch, now_ms: u64)
                    -> Result<smolbox_core::managed::ExecutionRecord, smolbox_core::Error>;
                fn reserve(&self, key: &smolbox_core::managed::RecordKey, guard: &smolbox_core::managed::Guard, request: &$crate::Reserve, now_ms: u64)
                    -> Result<smolbox_core::managed::ExecutionRecord, smolbox_core::Error>;
                fn release(&self, key: &smolbox_core::managed::RecordKey, guard: &smolbox_core::managed::Guard, now_ms: u64)
                    -> Result<smolbox_core::managed::ExecutionRecord, smolbox_core::Error>;
                fn cancel(&self, key: &smolbox_core::managed::RecordKey, now_ms: u64)
                    -> Result<smolbox_core::managed::ExecutionRecord, smolbox_core::Error>;
                fn due(&self, now_ms: u64, after: Option<&$crate::DueCursor>, limit: u32)
                    -> Result<$crate::DuePage, smolbox_core::Error>;
                fn usage(&self, worker_id: &str)
                    -> Result<smolbox_core::managed::record::Resources, smolbox_core::Error>;
                fn accept_machine(&self, record: &smolbox_core::managed::MachineRecord, max_pending: u32)
                    -> Result<$crate::Accepted<smolbox_core::managed::MachineRecord>, smolbox_core::Error>;
                fn fetch_machine(&self, key: &smolbox_core::managed::RecordKey)
                    -> Result<smolbox_core::managed::MachineRecord, smolbox_core::Error>;
                fn claim_machine(&self, key: &smolbox_core::managed::RecordKey, owner: &str, now_ms: u64, ttl_ms: u64)
                    -> Result<smolbox_core::managed::MachineRecord, smolbox_core::Error>;
                fn write_machine(&self, key: &smolbox_core::managed::RecordKey, guard: &smolbox_core::managed::Guard, patch: &smolbox_core::managed::MachinePatch, now_ms: u64)
                    -> Result<smolbox_core::managed::MachineRecord, smolbox_core::Error>;
                fn reserve_machine(&self, key: &smolbox_core::managed::RecordKey, guard: &smolbox_core::managed::Guard, request: &$crate::Reserve, now_ms: u64)
                    -> Result<smolbox_core::managed::MachineRecord, smolbox_core::Error>;
                fn request_machine(&self, key: &smolbox_core::managed::RecordKey, action: smolbox_core::managed::state::MachineOperation, version: u64, now_ms: u64)
                    -> Result<smolbox_core::managed::MachineRecord, smolbox_core::Error>;
                fn acquire_slot(&self, machine: &smolbox_core::managed::RecordKey, guard: &smolbox_core::managed::Guard, exec: &smolbox_core::managed::RecordKey, now_ms: u64)
                    -> Result<smolbox_core::managed::MachineRecord, smolbox_core::Error>;
                fn finish_slot(&self, machine: &smolbox_core::managed::RecordKey, guard: &smolbox_core::managed::Guard, exec: &smolbox_core::managed::RecordKey, now_ms: u64)
                    -> Result<(smolbox_core::managed::MachineRecord, smolbox_core::managed::slot::Finish), smolbox_core::Error>;
                fn list(&self, scope: &str, after: Option<&str>, limit: u32)
                    -> Result<$crate::Page<smolbox_core::managed::ExecutionRecord>, smolbox_core::Error>;
                fn list_machines(&self, scope: &str, after: Option<&str>, limit: u32)
                    -> Result<$crate::Page<smolbox_core::managed::MachineRecord>, smolbox_core::Error>;
                fn due_machines(&self, now_ms: u64, after: Option<&$crate::DueCursor>, limit: u32)
                    -> Result<$crate::DuePage<smolbox_core::managed::MachineRecord>, smolbox_core::Error>;
                fn claim_version(&self, key: &smolbox_core::managed::RecordKey, owner: &str, version: u64, now_ms: u64, ttl_ms: u64)
                    -> Result<smolbox_core::managed::ExecutionRecord, smolbox_core::Error>;
                fn claim_machine_version(&self, key: &smolbox_core::managed::RecordKey, owner: &str, version: u64, now_ms: u64, ttl_ms: u64)
                    -> Result<smolbox_core::managed::MachineRecord, smolbox_core::Error>;
                fn submit(&self, record: &smolbox_core::managed::ExecutionRecord, max_pending: u32)
                    -> Result<$crate::Accepted<$crate::Submitted>, smolbox_core::Error>;
                fn finish_command(&self, machine: &smolbox_core::managed::RecordKey, guard: &smolbox_core::managed::Guard, exec: &smolbox_core::managed::RecordKey, now_ms: u64)
                    -> Result<(smolbox_core::managed::MachineRecord, smolbox_core::managed::ExecutionRecord, smolbox_core::managed::slot::Finish), smolbox_core::Error>;
                fn resolve_machine(&self, key: &smolbox_core::managed::RecordKey, version: u64, quiesced: bool, disposition: &smolbox_core::managed::slot::Disposition, now_ms: u64)
                    -> Result<$crate::Resolved, smolbox_core::Error>;
                fn accept_dispatching(&self, record: &smolbox_core::managed::ExecutionRecord, max_pending: u32)
                    -> Result<$crate::Accepted<smolbox_core::managed::ExecutionRecord>, smolbox_core::Error>;
                fn submit_dispatching(&self, record: &smolbox_core::managed::ExecutionRecord, max_pending: u32)
                    -> Result<$crate::Accepted<$crate::Submitted>, smolbox_core::Error>;
                fn write_steps(&self, key: &smolbox_core::managed::RecordKey, guard: &smolbox_core::managed::Guard, patches: &[smolbox_core::managed::ExecPatch], now_ms: u64)
                    -> Result<smolbox_core::managed::ExecutionRecord, smolbox_core::Error>;
                fn release_claim(&self, claimed: &smolbox_core::managed::controller::Claimed, owner: &str, generation: u64, now_ms: u64)
                    -> Result<$crate::Released, smolbox_core::Error>;
            }
            fn info(&self) -> $crate::StoreInfo {
                $crate::engine::Backend::info(self)
            }
            fn commits(&self) -> Option<u64> {
                Some($crate::engine::Backend::handle(self).commits())
            }
        }
    };
}
pub(crate) use impl_store;

/// Performs one controller [`StoreOp`] on `store` (the one place both
/// shells' drivers turn the controller's data into a store call). The
/// store's error is returned unchanged, never mapped to absence.
///
/// # Errors
/// The store method's error.
pub fn apply_op(store: &dyn Store, op: &StoreOp) -> StoreResult {
    match op {
        StoreOp::Accept {
            record,
            max_pending,
        } => store.accept(record, *max_pending).map(|a| match a {
            Accepted::Inserted(record) => StoreReply::Accepted {
                record,
                existing: false,
            },
            Accepted::Existing(record) => StoreReply::Accepted {
                record,
                existing: true,
            },
        }),
        StoreOp::Fetch { key } => store.fetch(key).map(StoreReply::Record),
        StoreOp::Claim {
            key,
            owner,
            now_ms,
            ttl_ms,
        } => store
            .claim(key, owner, *now_ms, *ttl_ms)
            .map(StoreReply::Record),
        StoreOp::ClaimVersion {
            key,
            owner,
            version,
            now_ms,
            ttl_ms,
        } => store
            .claim_version(key, owner, *version, *now_ms, *ttl_ms)
            .map(StoreReply::Record),
        StoreOp::ClaimWorker {
            worker_id,
            owner,
            now_ms,
            ttl_ms,
        } => store
            .claim_worker(worker_id, owner, *now_ms, *ttl_ms)
            .map(StoreReply::Lease),
        StoreOp::Write {
            key,
            guard,
            patch,
            now_ms,
        } => store
            .write(key, guard, patch, *now_ms)
            .map(StoreReply::Record),
        StoreOp::Reserve {
            key,
            guard,
            reservation,
            now_ms,
        } => store
            .reserve(key, guard, &reserve_of(reservation), *now_ms)
            .map(StoreReply::Record),
        StoreOp::Release { key, guard, now_ms } => {
            store.release(key, guard, *now_ms).map(StoreReply::Record)
        }
        StoreOp::Cancel { key, now_ms } => store.cancel(key, *now_ms).map(StoreReply::Record),
        StoreOp::Due {
            now_ms,
            after,
            limit,
        } => {
            let cursor = after.as_ref().map(|a| DueCursor {
                due_at_ms: a.due_at_ms,
                key: a.key.clone(),
            });
            store
                .due(*now_ms, cursor.as_ref(), *limit)
                .map(|page| StoreReply::Due {
                    records: page.records,
                    next: page.next.map(after_of),
                })
        }
        StoreOp::AcceptMachine {
            record,
            max_pending,
        } => store.accept_machine(record, *max_pending).map(|a| match a {
            Accepted::Inserted(record) => StoreReply::MachineAccepted {
                record,
                existing: false,
            },
            Accepted::Existing(record) => StoreReply::MachineAccepted {
                record,
                existing: true,
            },
        }),
        StoreOp::FetchMachine { key } => store.fetch_machine(key).map(StoreReply::Machine),
        StoreOp::ClaimMachine {
            key,
            owner,
            now_ms,
            ttl_ms,
        } => store
            .claim_machine(key, owner, *now_ms, *ttl_ms)
            .map(StoreReply::Machine),
        StoreOp::ClaimMachineVersion {
            key,
            owner,
            version,
            now_ms,
            ttl_ms,
        } => store
            .claim_machine_version(key, owner, *version, *now_ms, *ttl_ms)
            .map(StoreReply::Machine),
        StoreOp::WriteMachine {
            key,
            guard,
            patch,
            now_ms,
        } => store
            .write_machine(key, guard, patch, *now_ms)
            .map(StoreReply::Machine),
        StoreOp::ReserveMachine {
            key,
            guard,
            reservation,
            now_ms,
        } => store
            .reserve_machine(key, guard, &reserve_of(reservation), *now_ms)
            .map(StoreReply::Machine),
        StoreOp::RequestMachine {
            key,
            action,
            version,
            now_ms,
        } => store
            .request_machine(key, *action, *version, *now_ms)
            .map(StoreReply::Machine),
        StoreOp::AcceptDispatching {
            record,
            max_pending,
        } => store
            .accept_dispatching(record, *max_pending)
            .map(|a| match a {
                Accepted::Inserted(record) => StoreReply::Accepted {
                    record,
                    existing: false,
                },
                Accepted::Existing(record) => StoreReply::Accepted {
                    record,
                    existing: true,
                },
            }),
        StoreOp::SubmitDispatching {
            record,
            max_pending,
        } => store
            .submit_dispatching(record, *max_pending)
            .map(submitted_reply),
        StoreOp::WriteSteps {
            key,
            guard,
            patches,
            now_ms,
        } => store
            .write_steps(key, guard, patches, *now_ms)
            .map(StoreReply::Record),
        StoreOp::SubmitCommand {
            record,
            max_pending,
        } => store.submit(record, *max_pending).map(submitted_reply),
        StoreOp::FinishCommand {
            machine,
            guard,
            exec,
            now_ms,
        } => store.finish_command(machine, guard, exec, *now_ms).map(
            |(machine, execution, finish)| StoreReply::SlotFinished {
                machine,
                execution,
                finish,
            },
        ),
        StoreOp::ResolveMachine {
            key,
            version,
            quiesced,
            disposition,
            now_ms,
        } => store
            .resolve_machine(key, *version, *quiesced, disposition, *now_ms)
            .map(|r| StoreReply::Resolved {
                machine: r.machine,
                command: r.command,
            }),
        StoreOp::ReleaseClaim {
            claimed,
            owner,
            generation,
            now_ms,
        } => store
            .release_claim(claimed, owner, *generation, *now_ms)
            .and_then(|r| match r {
                Released::Execution(rec) => Ok(StoreReply::Record(*rec)),
                Released::Machine(rec) => Ok(StoreReply::Machine(*rec)),
                Released::Worker(Some(l)) => Ok(StoreReply::Lease(l)),
                Released::Worker(None) => Err(Error::not_found(
                    smolbox_core::Operation::StoreClaim,
                    smolbox_core::Evidence::Unknown,
                    smolbox_core::Reason::Absent,
                )),
            }),
        StoreOp::DueMachines {
            now_ms,
            after,
            limit,
        } => {
            let cursor = after.as_ref().map(|a| DueCursor {
                due_at_ms: a.due_at_ms,
                key: a.key.clone(),
            });
            store
                .due_machines(*now_ms, cursor.as_ref(), *limit)
                .map(|page| StoreReply::DueMachines {
                    records: page.records,
                    next: page.next.map(after_of),
                })
        }
    }
}

fn submitted_reply(a: Accepted<Submitted>) -> StoreReply {
    let (s, existing) = match a {
        Accepted::Inserted(s) => (s, false),
        Accepted::Existing(s) => (s, true),
    };
    StoreReply::Submitted {
        execution: s.execution,
        machine: s.machine,
        existing,
    }
}

fn after_of(c: DueCursor) -> DueAfter {
    DueAfter {
        due_at_ms: c.due_at_ms,
        key: c.key,
    }
}

fn reserve_of(r: &smolbox_core::managed::controller::Reservation) -> Reserve {
    Reserve {
        worker_id: r.worker_id.clone(),
        machine_name: r.machine_name.clone(),
        capacity: r.capacity,
        limit: r.limit,
    }
}
