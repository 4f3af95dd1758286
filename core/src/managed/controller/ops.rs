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
use crate::managed::record::{ExecutionRecord, MachineRecord, Resources};
use crate::managed::slot::{Disposition, Finish};
use crate::managed::state::MachineOperation;
use crate::managed::{ExecPatch, Guard, Lease, MachinePatch, RecordKey};
use crate::worker::{
    GuestPath, LogsParams, MachineName, MachineSpec, Observation, PathPolicy, Profile,
};

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

/// What a claim release names (`Store::release_claim`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Claimed {
    /// An execution record's claim.
    Execution(RecordKey),
    /// A machine record's claim.
    Machine(RecordKey),
    /// A worker lease.
    Worker(String),
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
    /// `accept_machine(record, max_pending)` → [`StoreReply::MachineAccepted`].
    AcceptMachine {
        /// The fresh `accepted` machine record.
        record: Box<MachineRecord>,
        /// Pending limit (1–10,000).
        max_pending: u32,
    },
    /// `fetch_machine(key)` → [`StoreReply::Machine`].
    FetchMachine {
        /// Machine key.
        key: RecordKey,
    },
    /// `claim_machine(key, owner, now_ms, ttl_ms)` → [`StoreReply::Machine`].
    ClaimMachine {
        /// Machine key.
        key: RecordKey,
        /// Claiming controller.
        owner: String,
        /// Wall-clock milliseconds.
        now_ms: u64,
        /// Claim TTL.
        ttl_ms: u64,
    },
    /// `claim_machine_version(key, owner, version, now_ms, ttl_ms)` →
    /// [`StoreReply::Machine`]: the claim only at `version`, re-fencing an
    /// assigned machine to the claimer's live worker-lease generation (C15).
    ClaimMachineVersion {
        /// Machine key.
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
    /// `write_machine(key, guard, patch, now_ms)` → [`StoreReply::Machine`].
    WriteMachine {
        /// Machine key.
        key: RecordKey,
        /// Guard of the last stored version.
        guard: Guard,
        /// The patch.
        patch: MachinePatch,
        /// Wall-clock milliseconds.
        now_ms: u64,
    },
    /// `reserve_machine(key, guard, reservation, now_ms)` → [`StoreReply::Machine`].
    ReserveMachine {
        /// Machine key.
        key: RecordKey,
        /// Guard of the last stored version.
        guard: Guard,
        /// What to reserve.
        reservation: Reservation,
        /// Wall-clock milliseconds.
        now_ms: u64,
    },
    /// `request_machine(key, action, version, now_ms)` → [`StoreReply::Machine`].
    RequestMachine {
        /// Machine key.
        key: RecordKey,
        /// Start, stop or delete.
        action: MachineOperation,
        /// The version the caller inspected.
        version: u64,
        /// Wall-clock milliseconds.
        now_ms: u64,
    },
    /// `submit(record, max_pending)` → [`StoreReply::Submitted`]: accept a
    /// command on a retained machine and give it the slot, one transaction.
    SubmitCommand {
        /// The fresh `accepted` command record (its spec names the machine).
        record: Box<ExecutionRecord>,
        /// Pending limit (1–10,000).
        max_pending: u32,
    },
    /// `finish_command(machine, guard, exec, now_ms)` → [`StoreReply::SlotFinished`].
    FinishCommand {
        /// Machine key.
        machine: RecordKey,
        /// Guard of the machine's last stored version.
        guard: Guard,
        /// The command holding the slot.
        exec: RecordKey,
        /// Wall-clock milliseconds.
        now_ms: u64,
    },
    /// `resolve_machine(key, version, quiesced, disposition, now_ms)` →
    /// [`StoreReply::Resolved`].
    ResolveMachine {
        /// Machine key.
        key: RecordKey,
        /// The inspected version.
        version: u64,
        /// The operator's assertion (always true when the controller sends it).
        quiesced: bool,
        /// What was verified on the worker.
        disposition: Disposition,
        /// Wall-clock milliseconds.
        now_ms: u64,
    },
    /// `accept_dispatching(record, max_pending)` → [`StoreReply::Accepted`]:
    /// the acceptance, the claim the record carries and its dispatch intent
    /// in one transaction (an existing record is returned untouched).
    AcceptDispatching {
        /// The fresh `accepted` record, carrying the submitter's claim.
        record: Box<ExecutionRecord>,
        /// Pending limit (1–10,000).
        max_pending: u32,
    },
    /// `submit_dispatching(record, max_pending)` → [`StoreReply::Submitted`]:
    /// [`StoreOp::SubmitCommand`] with the dispatch intent in the same
    /// transaction.
    SubmitDispatching {
        /// The fresh `accepted` command record, carrying the claim.
        record: Box<ExecutionRecord>,
        /// Pending limit (1–10,000).
        max_pending: u32,
    },
    /// `write_steps(key, guard, patches, now_ms)` → [`StoreReply::Record`]:
    /// 1–4 guarded patches in one transaction, each by the write rules.
    WriteSteps {
        /// Record key.
        key: RecordKey,
        /// Guard of the last stored version.
        guard: Guard,
        /// The patches, applied in order.
        patches: Vec<ExecPatch>,
        /// Wall-clock milliseconds.
        now_ms: u64,
    },
    /// `release_claim(claimed, owner, generation, now_ms)` →
    /// [`StoreReply::Record`], [`StoreReply::Machine`] or
    /// [`StoreReply::Lease`] by what `claimed` names: ends `owner`'s claim
    /// at `generation` now (C15), so the next controller need not wait out
    /// the TTL; never changes a state, evidence or slot.
    ReleaseClaim {
        /// The record or lease.
        claimed: Claimed,
        /// The releasing controller (the claim's owner).
        owner: String,
        /// The claim generation it holds.
        generation: u64,
        /// Wall-clock milliseconds.
        now_ms: u64,
    },
    /// `due_machines(now_ms, after, limit)` → [`StoreReply::DueMachines`].
    DueMachines {
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
    /// A machine record as stored after the call.
    Machine(MachineRecord),
    /// The answer to [`StoreOp::AcceptMachine`].
    MachineAccepted {
        /// The inserted or existing record.
        record: MachineRecord,
        /// True when it already existed (same identity and fingerprint).
        existing: bool,
    },
    /// The answer to [`StoreOp::SubmitCommand`].
    Submitted {
        /// The command record.
        execution: ExecutionRecord,
        /// Its machine after the transaction (`None` only for an existing
        /// command whose machine the store positively does not hold).
        machine: Option<MachineRecord>,
        /// True when the command already existed.
        existing: bool,
    },
    /// The answer to [`StoreOp::FinishCommand`].
    SlotFinished {
        /// The machine after the transaction.
        machine: MachineRecord,
        /// The command with its cleanup set.
        execution: ExecutionRecord,
        /// Whether the slot was released or kept.
        finish: Finish,
    },
    /// The answer to [`StoreOp::ResolveMachine`].
    Resolved {
        /// The resolved machine.
        machine: MachineRecord,
        /// The command that held its slot, settled.
        command: Option<ExecutionRecord>,
    },
    /// The answer to [`StoreOp::DueMachines`].
    DueMachines {
        /// Machine records ordered by `(next_due_at, scope, id)`.
        records: Vec<MachineRecord>,
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
    /// `Client::logs(Logs::new(profile, name, params))` →
    /// [`WorkerReply::Logs`]: the console history (a read; never follow).
    Logs {
        /// Configured worker id.
        worker_id: String,
        /// The worker's admitted version profile.
        profile: Box<Profile>,
        /// Machine name.
        name: MachineName,
        /// Tail, timeout and allowance (checked; `follow` is false).
        params: LogsParams,
    },
    /// Streamed exec (`Client::exec_stream(machine, command)`) →
    /// [`WorkerReply::Streamed`]: the controller chose to stream this
    /// command because its submitter asked for its output as it comes
    /// ([`super::Controller::stream_output`]). The shell forwards each
    /// output event to the caller registered under `key` and answers with
    /// the exit; the output itself is never handed to the controller.
    ExecStream {
        /// Configured worker id.
        worker_id: String,
        /// Machine name on that worker.
        machine: String,
        /// The command, decoded from the record's spec (no stdin, not
        /// background).
        command: Command,
        /// The execution's record key: whose caller gets the events.
        key: RecordKey,
    },
    /// Stages one declared input (C6.4): the driver reads `size` bytes of
    /// `source` from its artifact store (`read(scope, source, size)`), then
    /// `Client::upload(Upload::new(profile, policy, budget, name, path,
    /// bytes, sha256))`, whose digest check runs before any I/O; the budget
    /// is the client's (`FileBudget::new(per_file, endpoint budgets)`) →
    /// [`WorkerReply::Uploaded`]. Never retried.
    Upload {
        /// Configured worker id.
        worker_id: String,
        /// The worker's admitted version profile.
        profile: Box<Profile>,
        /// Machine name.
        name: MachineName,
        /// The spec's guest-path policy.
        policy: Box<PathPolicy>,
        /// Guest path.
        path: GuestPath,
        /// Artifact-store scope (the record's).
        scope: String,
        /// Artifact-store reference of the bytes.
        source: String,
        /// Declared SHA-256 (lowercase hex).
        sha256: String,
        /// Declared size in bytes (also the read limit).
        size: u64,
        /// The profile's per-file budget (the client allowance).
        per_file: u64,
    },
    /// Reads one guest file back (`Client::download(Download::new(profile,
    /// policy, budget, name, path, max_bytes))`) → [`WorkerReply::Downloaded`]
    /// with its size and SHA-256. With `store`, the bytes are put into the
    /// artifact store under `(record key, destination)` first (a collected
    /// output); without, they are digested and dropped (the re-check of a
    /// staged input). The bytes never come back to the controller.
    Download {
        /// Configured worker id.
        worker_id: String,
        /// The worker's admitted version profile.
        profile: Box<Profile>,
        /// Machine name.
        name: MachineName,
        /// The spec's guest-path policy.
        policy: Box<PathPolicy>,
        /// Guest path.
        path: GuestPath,
        /// Largest accepted size in bytes.
        max_bytes: u64,
        /// The profile's per-file budget (the client allowance).
        per_file: u64,
        /// Where a collected output goes: the record key and the declared
        /// destination reference.
        store: Option<(RecordKey, String)>,
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
            | Self::Inspect { worker_id, .. }
            | Self::Logs { worker_id, .. }
            | Self::ExecStream { worker_id, .. }
            | Self::Upload { worker_id, .. }
            | Self::Download { worker_id, .. } => worker_id,
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
    /// Console history lines (logs).
    Logs(Vec<String>),
    /// The streamed exec's exit ([`WorkerOp::ExecStream`]); the output went
    /// to the caller as events and is counted, not held.
    Streamed {
        /// The guest's exit code (the stream's last event).
        exit_code: i32,
        /// Bytes of output events read before the exit.
        output_bytes: u64,
    },
    /// The upload's verified reply ([`WorkerOp::Upload`]).
    Uploaded {
        /// Bytes the worker wrote.
        size: u64,
    },
    /// What a [`WorkerOp::Download`] read (and, for an output, stored).
    Downloaded {
        /// Bytes read.
        size: u64,
        /// Their SHA-256, lowercase hex.
        sha256: String,
    },
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
            Self::AcceptMachine { .. } => "accept_machine",
            Self::FetchMachine { .. } => "fetch_machine",
            Self::ClaimMachine { .. } => "claim_machine",
            Self::ClaimMachineVersion { .. } => "claim_machine_version",
            Self::WriteMachine { .. } => "write_machine",
            Self::ReserveMachine { .. } => "reserve_machine",
            Self::RequestMachine { .. } => "request_machine",
            Self::SubmitCommand { .. } => "submit",
            Self::FinishCommand { .. } => "finish_command",
            Self::ResolveMachine { .. } => "resolve_machine",
            Self::DueMachines { .. } => "due_machines",
            Self::AcceptDispatching { .. } => "accept_dispatching",
            Self::SubmitDispatching { .. } => "submit_dispatching",
            Self::WriteSteps { .. } => "write_steps",
            Self::ReleaseClaim { .. } => "release_claim",
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
            Self::Logs { .. } => "logs",
            Self::ExecStream { .. } => "exec_stream",
            Self::Upload { .. } => "upload",
            Self::Download { .. } => "download",
        }
    }
}
