//! The execution record (C13.3) and the machine record (C14.1), with the
//! invariants every stored record keeps. [`ExecutionRecord::validate`] and
//! [`MachineRecord::validate`] run after every patch and after every decode.

use crate::Operation;
use crate::Reason;
use serde::{Deserialize, Serialize};

use super::spec::{Action, ExecutionSpec, RetainedMachineSpec, SharedSpec};
use super::state::{
    Cleanup, Collection, ExecState, MachineOperation, MachinePhase, MachineRecordState,
    RecordEvidence,
};
use super::{
    MAX_COUNTER, MAX_TIMESTAMP_MS, RecordKey, check_digest, check_identifier, check_machine_name,
    check_worker_id,
};
use crate::{Category, Error};

/// Record schema number stored in every record (C13.3).
pub const SCHEMA: u32 = 1;
/// Most collected artifacts per record (C13.3).
pub const MAX_ARTIFACTS: usize = 32;
/// Length of the error history (C13.3).
pub const MAX_ERROR_HISTORY: usize = 8;
/// Largest cleanup attempt counter (C13.3).
pub const MAX_CLEANUP_ATTEMPTS: u32 = 1_000;
/// Longest stored reason code.
pub const MAX_REASON_LEN: usize = 64;

/// A claim on a record: the owner holding it and until when (C15). The
/// claim's generation is [`ExecutionRecord::generation`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Claim {
    /// Controller identifier.
    pub owner: String,
    /// Expiry, wall-clock milliseconds.
    pub until_ms: u64,
}

/// Slot, CPU, memory and disk amounts (C12.4, C14.4).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Resources {
    /// Machine slots.
    pub slots: u64,
    /// Virtual CPUs.
    pub cpus: u64,
    /// Memory in MiB (guest memory plus host overhead).
    pub memory_mb: u64,
    /// Disk in GiB (storage plus overlay).
    pub disk_gb: u64,
}

impl Resources {
    /// Component-wise sum, saturating.
    #[must_use]
    pub const fn plus(self, o: Self) -> Self {
        Self {
            slots: self.slots.saturating_add(o.slots),
            cpus: self.cpus.saturating_add(o.cpus),
            memory_mb: self.memory_mb.saturating_add(o.memory_mb),
            disk_gb: self.disk_gb.saturating_add(o.disk_gb),
        }
    }

    /// True when every component of `self` is at most `limit`'s.
    pub const fn fits(self, limit: Self) -> bool {
        self.slots <= limit.slots
            && self.cpus <= limit.cpus
            && self.memory_mb <= limit.memory_mb
            && self.disk_gb <= limit.disk_gb
    }
}

/// Where a record's machine lives: worker, the worker-lease generation it
/// was assigned under, and the machine name (C13.3).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Assignment {
    /// Worker id.
    pub worker_id: String,
    /// Worker-lease generation at assignment.
    pub worker_generation: u64,
    /// Machine name on that worker.
    pub machine_name: String,
}

/// Persisted proof that this controller created the machine (write-once).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreationEvidence {
    /// Creation time reported by the worker, wall-clock milliseconds.
    pub created_at_ms: u64,
    /// Incarnation identifier (C3.5).
    pub incarnation: String,
}

/// An observed outcome (write-once).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum ExecResult {
    /// The command exited.
    Exited {
        /// Signed 32-bit exit code.
        exit_code: i32,
        /// Output bytes seen (the bytes themselves are never stored).
        output_bytes: u64,
        /// Output was cut at the allowance.
        truncated: bool,
    },
    /// An interactive terminal's program exited with a confirmed code
    /// (0–255 except 124 and 130, C7.3). No transcript: the session's bytes
    /// are never stored.
    Terminal {
        /// The confirmed exit code.
        exit_code: i32,
    },
    /// A background launch was acknowledged.
    Launched {
        /// Acknowledgement time.
        launched_at_ms: u64,
    },
}

impl ExecResult {
    /// The exit code of a command or a terminal; `None` for a launch.
    pub const fn exit_code(&self) -> Option<i32> {
        match self {
            Self::Exited { exit_code, .. } | Self::Terminal { exit_code } => Some(*exit_code),
            Self::Launched { .. } => None,
        }
    }
}

/// One stored error: the closed fields of [`Error`] (C13.3 last error).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ErrorEntry {
    /// Category name.
    pub category: String,
    /// Operation name.
    pub operation: String,
    /// Evidence name.
    pub evidence: String,
    /// Fixed reason code.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// When it was recorded.
    pub at_ms: u64,
}

impl ErrorEntry {
    /// Records an error at `at_ms`.
    pub fn from_error(e: &Error, at_ms: u64) -> Self {
        Self {
            category: e.category().as_str().to_owned(),
            operation: e.operation().as_str().to_owned(),
            evidence: e.evidence().as_str().to_owned(),
            reason: e.reason().as_str().to_owned(),
            at_ms,
        }
    }

    fn validate(&self) -> Result<(), Error> {
        let snake = |s: &str, max: usize| {
            s.len() <= max
                && s.bytes()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'_')
        };
        let known_category = Category::ALL.iter().any(|c| c.as_str() == self.category);
        let known_evidence = RecordEvidence::ALL
            .iter()
            .any(|e| e.to_error_evidence().as_str() == self.evidence);
        if !known_category
            || !known_evidence
            || self.operation.is_empty()
            || !snake(&self.operation, MAX_REASON_LEN)
            || !snake(&self.reason, MAX_REASON_LEN)
        {
            return Err(Error::validation(Operation::StoreWrite, Reason::ErrorEntry));
        }
        check_time(self.at_ms)
    }
}

/// One collected output (C13.3).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CollectedArtifact {
    /// Guest path; matches a declared output.
    pub path: String,
    /// Artifact-store destination.
    pub destination: String,
    /// Size in bytes, at most the declared maximum.
    pub size: u64,
    /// SHA-256 of the bytes.
    pub sha256: String,
}

/// Deadlines, each set once (C13.4).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Deadlines {
    /// accepted + queue budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_ms: Option<u64>,
    /// Set on first entry to `preparing`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preparation_ms: Option<u64>,
    /// Set on first entry to `dispatching`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution_ms: Option<u64>,
    /// Set on first entry to `collecting`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collection_ms: Option<u64>,
    /// Set on first entry to a terminal or `unknown` state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cleanup_ms: Option<u64>,
}

/// An execution record (C13.3).
#[derive(Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecutionRecord {
    /// Always [`SCHEMA`].
    pub schema: u32,
    /// Scope and id.
    pub key: RecordKey,
    /// Spec fingerprint (64 lowercase hex).
    pub fingerprint: String,
    /// The accepted spec, shared by the record's copies.
    pub spec: SharedSpec,
    /// Acceptance time.
    pub accepted_at_ms: u64,
    /// Last write time; never decreases.
    pub updated_at_ms: u64,
    /// When the record next needs work; absent when nothing is due.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_due_at_ms: Option<u64>,
    /// Retained machine for a managed command.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub managed_machine: Option<RecordKey>,
    /// Worker, worker generation and machine name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub assignment: Option<Assignment>,
    /// Creation evidence (write-once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creation: Option<CreationEvidence>,
    /// Observed result (write-once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<ExecResult>,
    /// Latest error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<ErrorEntry>,
    /// First cancel request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancel_requested_at_ms: Option<u64>,
    /// Current claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<Claim>,
    /// Verified absence time (write-once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub absence_at_ms: Option<u64>,
    /// Compare-and-swap version, ≥ 1.
    pub version: u64,
    /// Claim generation, ≥ 0.
    pub generation: u64,
    /// State.
    pub state: ExecState,
    /// Evidence.
    pub evidence: RecordEvidence,
    /// Collection progress.
    pub collection: Collection,
    /// Cleanup progress.
    pub cleanup: Cleanup,
    /// Cleanup attempts, 0–1,000.
    pub cleanup_attempts: u32,
    /// Held reservation (C12.4); absent once released.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reservation: Option<Resources>,
    /// Deadlines.
    pub deadlines: Deadlines,
    /// Collected outputs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub artifacts: Vec<CollectedArtifact>,
    /// Latest errors, oldest first, at most 8.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<ErrorEntry>,
}

/// Every field copied; the spec shared ([`SharedSpec::share`]), not copied.
impl Clone for ExecutionRecord {
    fn clone(&self) -> Self {
        Self {
            schema: self.schema,
            key: self.key.clone(),
            fingerprint: self.fingerprint.clone(),
            spec: self.spec.share(),
            accepted_at_ms: self.accepted_at_ms,
            updated_at_ms: self.updated_at_ms,
            next_due_at_ms: self.next_due_at_ms,
            managed_machine: self.managed_machine.clone(),
            assignment: self.assignment.clone(),
            creation: self.creation.clone(),
            result: self.result.clone(),
            last_error: self.last_error.clone(),
            cancel_requested_at_ms: self.cancel_requested_at_ms,
            claim: self.claim.clone(),
            absence_at_ms: self.absence_at_ms,
            version: self.version,
            generation: self.generation,
            state: self.state,
            evidence: self.evidence,
            collection: self.collection,
            cleanup: self.cleanup,
            cleanup_attempts: self.cleanup_attempts,
            reservation: self.reservation,
            deadlines: self.deadlines,
            artifacts: self.artifacts.clone(),
            errors: self.errors.clone(),
        }
    }
}

impl ExecutionRecord {
    /// A fresh `accepted` record: version 1, generation 0, queue deadline
    /// fixed at acceptance (C13.4), due now.
    ///
    /// # Errors
    /// `validation` when the key, fingerprint, spec or time is invalid.
    pub fn accepted(
        key: RecordKey,
        fingerprint: String,
        spec: ExecutionSpec,
        now_ms: u64,
    ) -> Result<Self, Error> {
        let rec = Self {
            schema: SCHEMA,
            managed_machine: spec.machine.clone(),
            deadlines: Deadlines {
                queue_ms: Some(now_ms.saturating_add(spec.queue_budget_ms)),
                ..Deadlines::default()
            },
            key,
            fingerprint,
            spec: SharedSpec::new(spec),
            accepted_at_ms: now_ms,
            updated_at_ms: now_ms,
            next_due_at_ms: Some(now_ms),
            assignment: None,
            creation: None,
            result: None,
            last_error: None,
            cancel_requested_at_ms: None,
            claim: None,
            absence_at_ms: None,
            version: 1,
            generation: 0,
            state: ExecState::Accepted,
            evidence: RecordEvidence::NotDispatched,
            collection: Collection::Pending,
            cleanup: Cleanup::Pending,
            cleanup_attempts: 0,
            reservation: None,
            artifacts: Vec::new(),
            errors: Vec::new(),
        };
        rec.validate()?;
        Ok(rec)
    }

    /// Checks every invariant of C13.2 / C13.3.
    ///
    /// # Errors
    /// `validation` naming the first broken rule.
    pub fn validate(&self) -> Result<(), Error> {
        self.check(true)
    }

    /// [`Self::validate`] without the rules that read only fields no patch
    /// writes — the key, the fingerprint, the spec, `managed_machine`
    /// against the spec, the claim (with the generation) and the
    /// assignment — for [`super::patch::apply_exec_steps`]: its later steps
    /// start from a record whose first step passed the whole
    /// [`Self::validate`], and a step ([`super::patch::ExecPatch`]) writes
    /// none of those fields, so those rules hold again and skipping them
    /// neither accepts a record [`Self::validate`] refuses nor changes the
    /// first broken rule it names (every other rule runs in the same order).
    pub(crate) fn validate_after_patch(&self) -> Result<(), Error> {
        self.check(false)
    }

    /// Every rule of [`Self::validate`] in order; `patch_fixed` false
    /// skips the ones [`Self::validate_after_patch`] names.
    fn check(&self, patch_fixed: bool) -> Result<(), Error> {
        if self.schema != SCHEMA {
            return Err(Error::validation(Operation::StoreWrite, Reason::Schema));
        }
        if patch_fixed {
            self.key.validate()?;
            check_digest(&self.fingerprint)?;
            self.spec.validate()?;
            if self.managed_machine != self.spec.machine {
                return Err(Error::validation(
                    Operation::StoreWrite,
                    Reason::ManagedMachine,
                ));
            }
        }
        for t in [self.accepted_at_ms, self.updated_at_ms] {
            check_time(t)?;
        }
        for t in [
            self.next_due_at_ms,
            self.cancel_requested_at_ms,
            self.absence_at_ms,
        ] {
            t.map_or(Ok(()), check_time)?;
        }
        if self.updated_at_ms < self.accepted_at_ms {
            return Err(Error::validation(
                Operation::StoreWrite,
                Reason::UpdatedBeforeAccepted,
            ));
        }
        if self.version == 0 || self.version > MAX_COUNTER || self.generation > MAX_COUNTER {
            return Err(Error::validation(Operation::StoreWrite, Reason::Version));
        }
        if patch_fixed {
            if let Some(c) = &self.claim {
                check_identifier(&c.owner)?;
                check_time(c.until_ms)?;
                if self.generation == 0 {
                    return Err(Error::validation(
                        Operation::StoreWrite,
                        Reason::ClaimGeneration,
                    ));
                }
            }
            if let Some(a) = &self.assignment {
                check_assignment(a)?;
            }
        }
        if self.deadlines.queue_ms.is_none() {
            return Err(Error::validation(
                Operation::StoreWrite,
                Reason::QueueDeadline,
            ));
        }
        self.check_evidence_coupling()?;
        self.check_collection_and_cleanup()?;
        self.check_artifacts()?;
        if self.errors.len() > MAX_ERROR_HISTORY {
            return Err(Error::validation(
                Operation::StoreWrite,
                Reason::ErrorHistory,
            ));
        }
        for e in self.errors.iter().chain(&self.last_error) {
            e.validate()?;
        }
        Ok(())
    }

    fn check_evidence_coupling(&self) -> Result<(), Error> {
        if !self.state.allowed_evidence().contains(&self.evidence) {
            return Err(Error::validation(
                Operation::StoreWrite,
                Reason::EvidenceState,
            ));
        }
        let result_ok = match self.state {
            ExecState::Collecting | ExecState::Completed | ExecState::CollectionFailed => {
                match (&self.spec.action, &self.result) {
                    (Action::Command(_), Some(ExecResult::Exited { .. })) => true,
                    (Action::Terminal(_), Some(ExecResult::Terminal { exit_code })) => {
                        (0..=255).contains(exit_code) && !matches!(exit_code, 124 | 130)
                    }
                    _ => false,
                }
            }
            ExecState::Launched => {
                matches!(self.result, Some(ExecResult::Launched { .. }))
                    && self.managed_machine.is_some()
                    && self.collection == Collection::Complete
            }
            _ => self.result.is_none(),
        };
        if result_ok {
            Ok(())
        } else {
            Err(Error::validation(
                Operation::StoreWrite,
                Reason::ResultState,
            ))
        }
    }

    fn check_collection_and_cleanup(&self) -> Result<(), Error> {
        let collection_ok = match self.state {
            ExecState::Completed | ExecState::Launched => self.collection == Collection::Complete,
            ExecState::CollectionFailed => {
                matches!(self.collection, Collection::Partial | Collection::Failed)
            }
            _ => true,
        };
        if !collection_ok {
            return Err(Error::validation(
                Operation::StoreWrite,
                Reason::CollectionState,
            ));
        }
        if self.cleanup == Cleanup::Complete {
            if !(self.state.is_terminal() || self.state == ExecState::Unknown) {
                return Err(Error::validation(
                    Operation::StoreWrite,
                    Reason::CleanupState,
                ));
            }
            if self.managed_machine.is_none()
                && self.assignment.is_some()
                && self.absence_at_ms.is_none()
            {
                return Err(Error::validation(
                    Operation::StoreWrite,
                    Reason::CleanupWithoutAbsence,
                ));
            }
        }
        if self.cleanup_attempts > MAX_CLEANUP_ATTEMPTS {
            return Err(Error::validation(
                Operation::StoreWrite,
                Reason::CleanupAttempts,
            ));
        }
        Ok(())
    }

    fn check_artifacts(&self) -> Result<(), Error> {
        if self.artifacts.len() > MAX_ARTIFACTS {
            return Err(
                Error::validation(Operation::StoreWrite, Reason::TooManyArtifacts)
                    .with_limit(self.artifacts.len() as u64, MAX_ARTIFACTS as u64),
            );
        }
        if !self.artifacts.windows(2).all(|w| w[0].path < w[1].path) {
            return Err(Error::validation(
                Operation::StoreWrite,
                Reason::ArtifactsNotSortedUnique,
            ));
        }
        for a in &self.artifacts {
            check_digest(&a.sha256)?;
            let declared = self.spec.outputs.iter().find(|o| o.path == a.path);
            match declared {
                Some(o) if a.size <= o.max_size && a.destination == o.destination => {}
                Some(o) if a.size > o.max_size => {
                    return Err(
                        Error::validation(Operation::StoreWrite, Reason::ArtifactSize)
                            .with_limit(a.size, o.max_size),
                    );
                }
                _ => {
                    return Err(Error::validation(
                        Operation::StoreWrite,
                        Reason::ArtifactUndeclared,
                    ));
                }
            }
        }
        Ok(())
    }
}

/// The last request of a machine lifecycle: `(action, version)` (C14.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LastRequest {
    /// The requested action.
    pub action: MachineOperation,
    /// The record version it was requested against.
    pub version: u64,
}

/// The last observation of the machine (same incarnation).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecordedObservation {
    /// Observed state.
    pub state: MachineRecordState,
    /// Incarnation observed.
    pub incarnation: String,
    /// Observation time.
    pub at_ms: u64,
}

/// A retained machine record (C14.1).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MachineRecord {
    /// Always [`SCHEMA`].
    pub schema: u32,
    /// Scope and id.
    pub key: RecordKey,
    /// Machine fingerprint.
    pub fingerprint: String,
    /// The accepted spec.
    pub spec: RetainedMachineSpec,
    /// Acceptance time.
    pub accepted_at_ms: u64,
    /// Last write time; never decreases.
    pub updated_at_ms: u64,
    /// When the record next needs work.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_due_at_ms: Option<u64>,
    /// State.
    pub state: MachineRecordState,
    /// Current lifecycle operation.
    pub operation: MachineOperation,
    /// Its phase.
    pub phase: MachinePhase,
    /// Worker, generation and name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub assignment: Option<Assignment>,
    /// Creation evidence (write-once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creation: Option<CreationEvidence>,
    /// Last observation of the same incarnation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observation: Option<RecordedObservation>,
    /// Held reservation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reservation: Option<Resources>,
    /// Reserved host ports, sorted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reserved_ports: Vec<u16>,
    /// The execution holding the command slot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_execution: Option<RecordKey>,
    /// Current claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<Claim>,
    /// Verified absence time (write-once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub absence_at_ms: Option<u64>,
    /// Latest lifecycle request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_request: Option<LastRequest>,
    /// Deadline of the current operation (set once per operation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation_deadline_ms: Option<u64>,
    /// Operator resolution time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved_at_ms: Option<u64>,
    /// Latest error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<ErrorEntry>,
    /// Compare-and-swap version, ≥ 1: what callers compare against
    /// (`start/stop/delete(version)`, `stop_for_drain`, `resolve`). It moves
    /// on every write except a claim (a take or renewal of the record's
    /// claim), so a controller renewing its claim never makes an operator's
    /// versioned request stale; the claim (owner and generation) still
    /// fences every controller write (C15).
    pub version: u64,
    /// Claim generation.
    pub generation: u64,
    /// Claim writes (takes and renewals) so far; they do not move
    /// `version`. Absent (0) in records written before claims left the
    /// version.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub claims: u64,
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if signature
const fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl MachineRecord {
    /// The record's write counter: `version + claims`. It strictly
    /// increases on every write (a claim moves `claims`, everything else
    /// `version`), so it is what a durable store binds a sealed payload to
    /// and projects as the row's version (C18.4: a payload swapped back
    /// from an earlier write of the same row fails authentication). For a
    /// record without claim writes it equals `version`.
    pub const fn revision(&self) -> u64 {
        self.version.saturating_add(self.claims)
    }

    /// A fresh `accepted` machine record, version 1.
    ///
    /// # Errors
    /// `validation` when the key, fingerprint or spec is invalid.
    pub fn accepted(
        key: RecordKey,
        fingerprint: String,
        spec: RetainedMachineSpec,
        now_ms: u64,
    ) -> Result<Self, Error> {
        let rec = Self {
            schema: SCHEMA,
            key,
            fingerprint,
            spec,
            accepted_at_ms: now_ms,
            updated_at_ms: now_ms,
            next_due_at_ms: Some(now_ms),
            state: MachineRecordState::Accepted,
            operation: MachineOperation::None,
            phase: MachinePhase::None,
            assignment: None,
            creation: None,
            observation: None,
            reservation: None,
            reserved_ports: Vec::new(),
            active_execution: None,
            claim: None,
            absence_at_ms: None,
            last_request: None,
            operation_deadline_ms: None,
            resolved_at_ms: None,
            last_error: None,
            version: 1,
            generation: 0,
            claims: 0,
        };
        rec.validate()?;
        Ok(rec)
    }

    /// Checks the invariants of C14.1.
    ///
    /// # Errors
    /// `validation` naming the first broken rule.
    pub fn validate(&self) -> Result<(), Error> {
        if self.schema != SCHEMA {
            return Err(Error::validation(Operation::StoreWrite, Reason::Schema));
        }
        self.key.validate()?;
        check_digest(&self.fingerprint)?;
        self.spec.validate()?;
        check_time(self.accepted_at_ms)?;
        check_time(self.updated_at_ms)?;
        if self.updated_at_ms < self.accepted_at_ms {
            return Err(Error::validation(
                Operation::StoreWrite,
                Reason::UpdatedBeforeAccepted,
            ));
        }
        if self.version == 0
            || self.revision() > MAX_COUNTER
            || self.claims > MAX_COUNTER
            || self.generation > MAX_COUNTER
        {
            return Err(Error::validation(Operation::StoreWrite, Reason::Version));
        }
        if (self.operation == MachineOperation::None) != (self.phase == MachinePhase::None) {
            return Err(Error::validation(
                Operation::StoreWrite,
                Reason::OperationPhase,
            ));
        }
        if self.state.needs_creation_evidence() && self.creation.is_none() {
            return Err(Error::validation(
                Operation::StoreWrite,
                Reason::CreationEvidence,
            ));
        }
        if let Some(a) = &self.assignment {
            check_assignment(a)?;
        }
        if let Some(c) = &self.claim {
            check_identifier(&c.owner)?;
            if self.generation == 0 {
                return Err(Error::validation(
                    Operation::StoreWrite,
                    Reason::ClaimGeneration,
                ));
            }
        }
        if let Some(k) = &self.active_execution {
            k.validate()?;
            if self.operation != MachineOperation::None
                || !matches!(
                    self.state,
                    MachineRecordState::Running | MachineRecordState::Unknown
                )
            {
                return Err(Error::validation(
                    Operation::StoreWrite,
                    Reason::ActiveExecutionState,
                ));
            }
        }
        if self.state == MachineRecordState::Deleted {
            let absent_ok = self.assignment.is_none() || self.absence_at_ms.is_some();
            if self.active_execution.is_some()
                || !absent_ok
                || self.reservation.is_some()
                || !self.reserved_ports.is_empty()
            {
                return Err(Error::validation(
                    Operation::StoreWrite,
                    Reason::DeletedState,
                ));
            }
        }
        if !self.reserved_ports.windows(2).all(|w| w[0] < w[1]) || self.reserved_ports.contains(&0)
        {
            return Err(Error::validation(
                Operation::StoreWrite,
                Reason::ReservedPorts,
            ));
        }
        if let Some(e) = &self.last_error {
            e.validate()?;
        }
        Ok(())
    }
}

fn check_assignment(a: &Assignment) -> Result<(), Error> {
    check_worker_id(&a.worker_id)?;
    check_machine_name(&a.machine_name)?;
    if a.worker_generation == 0 {
        return Err(Error::validation(
            Operation::StoreWrite,
            Reason::WorkerGeneration,
        ));
    }
    Ok(())
}

fn check_time(t: u64) -> Result<(), Error> {
    if t <= MAX_TIMESTAMP_MS {
        Ok(())
    } else {
        Err(Error::validation(Operation::StoreWrite, Reason::Timestamp))
    }
}
