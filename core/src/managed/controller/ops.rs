//! The operations a [`super::Controller`] asks its driver to perform, and
//! their answers, as plain data.
//!
//! A [`StoreOp`] names one method of the store trait (`smolbox_store::Store`)
//! with all of its arguments; `smolbox_store::apply_op` performs it and
//! returns a [`StoreResult`]. A [`WorkerOp`] carries everything the worker
//! call needs (the [`Command`] for an exec, the admitted [`Profile`] and
//! the worker machine spec for a create), so a driver never remembers what
//! to send; it answers with a [`WorkerResult`].

use crate::Error;
use crate::exec::{Command, ExecOutcome};
use crate::managed::record::{ExecutionRecord, Resources};
use crate::managed::{ExecPatch, Guard, Lease, RecordKey};
use crate::worker::{MachineName, MachineSpec, Observation, Profile};

/// Identifies one outstanding operation; the answer names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OpId(pub u64);

/// What a reservation asks for (the arguments of `Store::reserve`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reservation {
    /// Worker id; the guard's owner must hold its live lease.
    pub worker_id: String,
    /// Machine name on that worker.
    pub machine_name: String,
    /// What the record reserves.
    pub capacity: Resources,
    /// The worker's total capacity.
    pub limit: Resources,
}

/// A keyset position of `Store::due`: the last `(next_due_at, key)` seen.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct DueAfter {
    /// Due time of the last record seen.
    pub due_at_ms: u64,
    /// Its key.
    pub key: RecordKey,
}

/// One store method call, as data (C18.1). Each variant maps to exactly
/// one `smolbox_store::Store` method with the same arguments.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreOp {
    /// `accept(record, max_pending)` → [`StoreReply::Accepted`].
    Accept {
        /// The fresh `accepted` record.
        record: Box<ExecutionRecord>,
        /// Pending limit (1–10,000).
        max_pending: u32,
    },
    /// `fetch(key)` → [`StoreReply::Record`].
    Fetch {
        /// Record key.
        key: RecordKey,
    },
    /// `claim(key, owner, now_ms, ttl_ms)` → [`StoreReply::Record`].
    Claim {
        /// Record key.
        key: RecordKey,
        /// Claiming controller.
        owner: String,
        /// Wall-clock milliseconds.
        now_ms: u64,
        /// Claim TTL.
        ttl_ms: u64,
    },
    /// `claim_version(key, owner, version, now_ms, ttl_ms)` →
    /// [`StoreReply::Record`]: the claim only at `version`, re-fencing an
    /// assigned record to the claimer's live worker-lease generation (C15).
    ClaimVersion {
        /// Record key.
        key: RecordKey,
        /// Claiming controller.
        owner: String,
        /// The version the controller read and decided from.
        version: u64,
        /// Wall-clock milliseconds.
        now_ms: u64,
        /// Claim TTL.
        ttl_ms: u64,
    },
    /// `claim_worker(worker_id, owner, now_ms, ttl_ms)` → [`StoreReply::Lease`].
    ClaimWorker {
        /// Worker id.
        worker_id: String,
        /// Claiming controller.
        owner: String,
        /// Wall-clock milliseconds.
        now_ms: u64,
        /// Lease TTL.
        ttl_ms: u64,
    },
    /// `write(key, guard, patch, now_ms)` → [`StoreReply::Record`].
    Write {
        /// Record key.
        key: RecordKey,
        /// Guard of the last stored version.
        guard: Guard,
        /// The patch.
        patch: ExecPatch,
        /// Wall-clock milliseconds.
        now_ms: u64,
    },
    /// `reserve(key, guard, reservation, now_ms)` → [`StoreReply::Record`].
    Reserve {
        /// Record key.
        key: RecordKey,
        /// Guard of the last stored version.
        guard: Guard,
        /// What to reserve.
        reservation: Reservation,
        /// Wall-clock milliseconds.
        now_ms: u64,
    },
    /// `release(key, guard, now_ms)` → [`StoreReply::Record`].
    Release {
        /// Record key.
        key: RecordKey,
        /// Guard of the last stored version.
        guard: Guard,
        /// Wall-clock milliseconds.
        now_ms: u64,
    },
    /// `cancel(key, now_ms)` → [`StoreReply::Record`].
    Cancel {
        /// Record key.
        key: RecordKey,
        /// Wall-clock milliseconds.
        now_ms: u64,
    },
    /// `due(now_ms, after, limit)` → [`StoreReply::Due`].
    Due {
        /// Wall-clock milliseconds.
        now_ms: u64,
        /// Keyset position (exclusive).
        after: Option<DueAfter>,
        /// Page size (1–100).
        limit: u32,
    },
}

/// The answer to a [`StoreOp`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreReply {
    /// The record as stored after the call.
    Record(ExecutionRecord),
    /// The answer to [`StoreOp::Accept`]: the record, and whether it
    /// already existed (same identity and fingerprint).
    Accepted {
        /// The inserted or existing record.
        record: ExecutionRecord,
        /// True when it already existed.
        existing: bool,
    },
    /// The answer to [`StoreOp::ClaimWorker`].
    Lease(Lease),
    /// The answer to [`StoreOp::Due`].
    Due {
        /// Records ordered by `(next_due_at, scope, id)`.
        records: Vec<ExecutionRecord>,
        /// Position of the next page; `None` when this page was not full.
        next: Option<DueAfter>,
    },
}

/// What a store op returned: its reply or the store's error, unchanged.
pub type StoreResult = Result<StoreReply, Error>;

/// One worker call, with everything needed to perform it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WorkerOp {
    /// Buffered exec (`Client::exec(machine, command)`) → [`WorkerReply::Exec`].
    /// The command was decoded from the stored spec.
    Exec {
        /// Configured worker id.
        worker_id: String,
        /// Machine name on that worker.
        machine: String,
        /// The command, decoded from the record's spec.
        command: Command,
    },
    /// `Client::create(profile, name, spec)` → [`WorkerReply::Machine`].
    Create {
        /// Configured worker id.
        worker_id: String,
        /// The worker's admitted version profile.
        profile: Box<Profile>,
        /// Machine name (reserved in the store first).
        name: MachineName,
        /// What to create.
        spec: Box<MachineSpec>,
    },
    /// `Client::start(profile, name)` → [`WorkerReply::Machine`].
    Start {
        /// Configured worker id.
        worker_id: String,
        /// The worker's admitted version profile.
        profile: Box<Profile>,
        /// Machine name.
        name: MachineName,
    },
    /// `Client::stop(profile, name)` → [`WorkerReply::Machine`].
    Stop {
        /// Configured worker id.
        worker_id: String,
        /// The worker's admitted version profile.
        profile: Box<Profile>,
        /// Machine name.
        name: MachineName,
    },
    /// `Client::delete(name)` → [`WorkerReply::Deleted`].
    Delete {
        /// Configured worker id.
        worker_id: String,
        /// Machine name.
        name: MachineName,
    },
    /// `Client::get(profile, name)` → [`WorkerReply::Machine`] (a
    /// `not_found` error is the observed 404).
    Inspect {
        /// Configured worker id.
        worker_id: String,
        /// The worker's admitted version profile.
        profile: Box<Profile>,
        /// Machine name.
        name: MachineName,
    },
}

impl WorkerOp {
    /// The configured worker the op goes to.
    pub fn worker_id(&self) -> &str {
        match self {
            Self::Exec { worker_id, .. }
            | Self::Create { worker_id, .. }
            | Self::Start { worker_id, .. }
            | Self::Stop { worker_id, .. }
            | Self::Delete { worker_id, .. }
            | Self::Inspect { worker_id, .. } => worker_id,
        }
    }
}

/// The answer to a [`WorkerOp`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WorkerReply {
    /// The buffered exec's outcome (output is held in memory only).
    Exec(ExecOutcome),
    /// A machine observation (create, start, stop, inspect).
    Machine(Box<Observation>),
    /// The delete succeeded.
    Deleted,
}

/// What a worker op returned: its reply or the call's error, unchanged.
pub type WorkerResult = Result<WorkerReply, Error>;

impl StoreOp {
    /// The store operation's name, for tracing (never its payload).
    pub const fn name(&self) -> &'static str {
        match self {
            Self::Accept { .. } => "accept",
            Self::Fetch { .. } => "fetch",
            Self::Claim { .. } => "claim",
            Self::ClaimVersion { .. } => "claim_version",
            Self::ClaimWorker { .. } => "claim_worker",
            Self::Write { .. } => "write",
            Self::Reserve { .. } => "reserve",
            Self::Release { .. } => "release",
            Self::Cancel { .. } => "cancel",
            Self::Due { .. } => "due",
        }
    }
}

impl WorkerOp {
    /// The worker operation's name, for tracing (never the command, the
    /// machine spec or anything else it carries).
    pub const fn name(&self) -> &'static str {
        match self {
            Self::Exec { .. } => "exec",
            Self::Create { .. } => "create",
            Self::Start { .. } => "start",
            Self::Stop { .. } => "stop",
            Self::Delete { .. } => "delete",
            Self::Inspect { .. } => "inspect",
        }
    }
}
