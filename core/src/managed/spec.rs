//! Execution and machine specifications as stored data (features C12.4, C14).
//!
//! These are the semantic inputs a record was accepted with. They are plain
//! data: the managed runtime validates them against the worker catalog; this
//! module checks only the shape rules that every stored record must keep
//! (counts, identifiers, sizes), so a decoded record can be re-validated.

use crate::Operation;
use crate::Reason;
use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use serde_json::value::RawValue;

use serde::{Deserialize, Serialize};

use super::{RecordKey, check_digest, check_identifier};
use crate::Error;

/// Most inputs or outputs one spec may declare (C12.4).
pub const MAX_FILES: usize = 32;
/// Most metadata entries one spec may carry (C12.4).
pub const MAX_METADATA: usize = 16;
/// Longest metadata string value in bytes (C12.4).
pub const MAX_METADATA_STRING: usize = 256;
/// Largest magnitude of a metadata integer (C0.1).
pub const MAX_SAFE_INTEGER: i64 = 9_007_199_254_740_991;
/// Default queue budget in milliseconds (C12.4).
pub const DEFAULT_QUEUE_BUDGET_MS: u64 = 60_000;
/// Default retention in milliseconds (C12.4).
pub const DEFAULT_RETENTION_MS: u64 = 86_400_000;
/// Execution budgets above this need the `extended_execution` capability (C19.2).
pub const MAX_BASE_EXECUTION_BUDGET_MS: u64 = 300_000;
/// Per-file sizes above this need the `guest_files` capability (C19.2).
pub const MAX_BASE_PER_FILE: u64 = 1_048_576;

/// What kind of artifact a machine boots from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ArtifactKind {
    /// A `.smolmachine` image.
    Image,
    /// An approved checkpoint.
    Checkpoint,
}

/// An exact artifact reference `{id, sha256, architecture}` (C12.4).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArtifactRef {
    /// Image or checkpoint.
    pub kind: ArtifactKind,
    /// Catalog identifier.
    pub id: String,
    /// SHA-256 of the artifact, 64 lowercase hex characters.
    pub sha256: String,
    /// `x86_64` or `aarch64`.
    pub architecture: String,
}

/// The profile budgets a record's deadlines are derived from (C12.3, C13.4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProfileBudgets {
    /// Preparation budget in milliseconds.
    pub preparation_ms: u64,
    /// Execution budget in milliseconds.
    pub execution_ms: u64,
    /// Collection budget in milliseconds.
    pub collection_ms: u64,
    /// Cleanup budget in milliseconds.
    pub cleanup_ms: u64,
}

impl ProfileBudgets {
    /// The profile defaults of C12.3.
    pub const DEFAULT: Self = Self {
        preparation_ms: 60_000,
        execution_ms: 30_000,
        collection_ms: 30_000,
        cleanup_ms: 30_000,
    };
}

/// An exact profile revision reference with its budgets.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProfileRef {
    /// Profile identifier (an immutable revision).
    pub id: String,
    /// Budgets of that revision.
    pub budgets: ProfileBudgets,
    /// Largest size of one transferred file in bytes.
    pub per_file_max: u64,
}

/// A foreground, background or streamed command. `Debug` prints counts and
/// flags only: argv, env values, stdin, user and workdir can be secrets.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommandSpec {
    /// Program and arguments (never stored in clear, never in errors).
    pub argv: Vec<String>,
    /// Environment; sorted by construction.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Working directory in the guest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
    /// Standard input bytes, base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin_b64: Option<String>,
    /// Foreground timeout in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_s: Option<u64>,
    /// Background launch (needs `extended_execution`).
    #[serde(default, skip_serializing_if = "is_false")]
    pub background: bool,
    /// Guest user (`name` or `uid[:gid]`); absent runs as the worker's
    /// default user. Part of the identity (canonical encoding version 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

impl core::fmt::Debug for CommandSpec {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("CommandSpec")
            .field("argc", &self.argv.len())
            .field("env_names", &self.env.keys().collect::<Vec<_>>())
            .field("has_workdir", &self.workdir.is_some())
            .field("has_stdin", &self.stdin_b64.is_some())
            .field("timeout_s", &self.timeout_s)
            .field("background", &self.background)
            .field("has_user", &self.user.is_some())
            .finish()
    }
}

/// Default profile output allowance in bytes (C12.3); the managed
/// terminal's unread buffer must not exceed it (C7.1). [`ProfileRef`] does
/// not carry an allowance, so the default applies (docs/decisions.md,
/// "Managed terminals").
pub const DEFAULT_OUTPUT_ALLOWANCE: u64 = 1_048_576;

/// A managed interactive terminal (C7.1): the program alone under a PTY and
/// the session bounds. There is no argv, env, workdir, user, stdin, timeout
/// or background option, and no shell is inserted. `Debug` prints the
/// program's length, never the program.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ManagedTerminalSpec {
    /// The program path: non-empty UTF-8, at most 4,096 bytes, no NUL.
    pub program: String,
    /// Initial columns, 1–65,535.
    pub cols: u16,
    /// Initial rows, 1–65,535.
    pub rows: u16,
    /// Session budget in milliseconds, 1,000–86,400,000 and at most the
    /// profile's execution budget.
    pub session_ms: u64,
    /// Idle budget in milliseconds, 1,000–`session_ms`.
    pub idle_ms: u64,
    /// Close wait in milliseconds, 1–5,000.
    pub close_ms: u64,
    /// Attach wait in milliseconds, 100–30,000: a connection nobody
    /// attaches to within it ends (`terminal_consumer`).
    pub attach_ms: u64,
    /// Unread output buffer in bytes, 1,024–1,048,576 and at most the
    /// profile's output allowance.
    pub buffer_bytes: u64,
    /// Largest single input in bytes, 1–65,536.
    pub input_bytes: u64,
}

impl Default for ManagedTerminalSpec {
    /// The defaults of C7.1: `/bin/sh`, 80×24, 30 s session and idle
    /// budgets, 1 s close wait, 5 s attach wait, 256 KiB buffer, 16 KiB
    /// inputs.
    fn default() -> Self {
        use crate::terminal as t;
        let ms = |d: core::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        Self {
            program: t::DEFAULT_PROGRAM.to_owned(),
            cols: t::DEFAULT_COLS,
            rows: t::DEFAULT_ROWS,
            session_ms: ms(t::DEFAULT_SESSION_BUDGET),
            idle_ms: ms(t::DEFAULT_IDLE_BUDGET),
            close_ms: ms(t::DEFAULT_CLOSE_WAIT),
            attach_ms: ms(t::DEFAULT_ATTACH_WAIT),
            buffer_bytes: t::DEFAULT_MAX_BUFFER_BYTES as u64,
            input_bytes: t::DEFAULT_MAX_INPUT_BYTES as u64,
        }
    }
}

impl ManagedTerminalSpec {
    /// The low-level terminal spec these settings describe (what the
    /// worker upgrade and the live session use).
    ///
    /// # Errors
    /// `validation` (operation `terminal_spec`) naming the first setting
    /// out of the ranges of C7.1.
    pub fn terminal_spec(&self) -> Result<crate::terminal::TerminalSpec, Error> {
        use core::time::Duration;
        let size = |v: u64, reason| {
            usize::try_from(v).map_err(|_| Error::validation(Operation::TerminalSpec, reason))
        };
        let spec = crate::terminal::TerminalSpec {
            program: self.program.clone(),
            cols: self.cols,
            rows: self.rows,
            session_budget: Duration::from_millis(self.session_ms),
            idle_budget: Duration::from_millis(self.idle_ms),
            close_wait: Duration::from_millis(self.close_ms),
            attach_wait: Duration::from_millis(self.attach_ms),
            max_buffer_bytes: size(self.buffer_bytes, Reason::BufferOutOfRange)?,
            max_input_bytes: size(self.input_bytes, Reason::InputLimitOutOfRange)?,
        };
        spec.validate()?;
        Ok(spec)
    }

    /// Checks every range of C7.1 and the managed bounds against
    /// `profile`: session budget ≤ the profile's execution budget, buffer ≤
    /// the output allowance ([`DEFAULT_OUTPUT_ALLOWANCE`]).
    ///
    /// # Errors
    /// `validation` naming the first broken rule, with its limit.
    pub fn validate(&self, profile: &ProfileRef) -> Result<(), Error> {
        self.terminal_spec()?;
        let budget = profile.budgets.execution_ms;
        if self.session_ms > budget {
            return Err(
                Error::validation(Operation::TerminalSpec, Reason::SessionOverBudget)
                    .with_limit(self.session_ms, budget),
            );
        }
        if self.buffer_bytes > DEFAULT_OUTPUT_ALLOWANCE {
            return Err(
                Error::validation(Operation::TerminalSpec, Reason::BufferOverAllowance)
                    .with_limit(self.buffer_bytes, DEFAULT_OUTPUT_ALLOWANCE),
            );
        }
        Ok(())
    }
}

impl core::fmt::Debug for ManagedTerminalSpec {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ManagedTerminalSpec")
            .field("program_len", &self.program.len())
            .field("cols", &self.cols)
            .field("rows", &self.rows)
            .field("session_ms", &self.session_ms)
            .field("idle_ms", &self.idle_ms)
            .field("close_ms", &self.close_ms)
            .field("attach_ms", &self.attach_ms)
            .field("buffer_bytes", &self.buffer_bytes)
            .field("input_bytes", &self.input_bytes)
            .finish()
    }
}

/// What an execution runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Action {
    /// A command.
    Command(CommandSpec),
    /// An interactive terminal.
    Terminal(ManagedTerminalSpec),
}

/// One declared input file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InputFile {
    /// Guest path.
    pub path: String,
    /// Artifact-store reference of the bytes.
    pub source: String,
    /// SHA-256 of the bytes.
    pub sha256: String,
    /// Size in bytes.
    pub size: u64,
}

/// One declared output file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutputFile {
    /// Guest path.
    pub path: String,
    /// Artifact-store destination reference.
    pub destination: String,
    /// Largest accepted size in bytes.
    pub max_size: u64,
}

/// The declared files of a command submitted into a retained machine's
/// slot (C6.4, C14.3): the same manifests a disposable spec carries, each
/// sorted by path. Empty (the default) for a command without files.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CommandFiles {
    /// Inputs staged before the dispatch intent, sorted by path.
    pub inputs: Vec<InputFile>,
    /// Outputs collected after the exit, sorted by path.
    pub outputs: Vec<OutputFile>,
}

impl CommandFiles {
    /// True when neither direction declares a file.
    pub fn is_empty(&self) -> bool {
        self.inputs.is_empty() && self.outputs.is_empty()
    }
}

/// A metadata value (C12.4).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum MetaValue {
    /// A string of at most 256 bytes.
    String(String),
    /// An integer within ±(2^53 − 1).
    Integer(i64),
    /// A boolean.
    Bool(bool),
    /// Null.
    Null,
}

/// Outbound network allowlist (C9.1); absent means offline.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProfileNetwork {
    /// Allowed destinations (host or CIDR), sorted.
    pub allow: Vec<String>,
}

/// Explicit guest-path policy (C6.2); absent means the default root.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GuestPathPolicy {
    /// Allowed transfer roots.
    pub roots: Vec<String>,
    /// Allowed working-directory roots.
    pub workdir_roots: Vec<String>,
}

/// The accepted spec of an execution record, shared by every copy of the
/// record (a reference count, not the spec's strings, per copy): a patch
/// never changes it (C13.3). Reads go through `Deref`; a write (`DerefMut`)
/// gives this copy its own spec and forgets the cached JSON.
///
/// It carries the spec's canonical JSON once a record holding it was
/// encoded ([`super::envelope::encode_exec`]): the next encodings of any
/// copy splice those bytes (`serde_json`'s raw value, written verbatim)
/// instead of serializing the spec again — the same bytes, as serializing
/// is a function of the spec's value and the cache is dropped on any write.
/// A decoded record starts without it, so the envelope's canonical
/// re-encode check serializes everything. Once cached, the spec serializes
/// as compact JSON through any `serde_json` formatter (nothing writes
/// records pretty-printed).
///
/// Deliberately not `Clone`: `rec.spec.clone()` stays a copy of the
/// [`ExecutionSpec`] (through `Deref`); [`Self::share`] is the cheap copy
/// a record's `Clone` uses.
pub struct SharedSpec(Arc<SpecCell>);

#[derive(Clone)]
struct SpecCell {
    spec: ExecutionSpec,
    json: OnceLock<Box<RawValue>>,
}

impl SharedSpec {
    /// Shares `spec`.
    pub fn new(spec: ExecutionSpec) -> Self {
        Self(Arc::new(SpecCell {
            spec,
            json: OnceLock::new(),
        }))
    }

    /// Another handle on the same spec (and its cached JSON).
    #[must_use]
    pub fn share(&self) -> Self {
        Self(Arc::clone(&self.0))
    }

    /// The spec, owned (a copy when shared).
    pub fn into_inner(self) -> ExecutionSpec {
        Arc::try_unwrap(self.0).map_or_else(|shared| shared.spec.clone(), |cell| cell.spec)
    }

    /// Serializes the spec once and keeps the JSON for the next encodings
    /// (the envelope calls this before writing a record).
    pub(crate) fn cache_json(&self) {
        if self.0.json.get().is_none()
            && let Ok(raw) = serde_json::value::to_raw_value(&self.0.spec)
        {
            let _ = self.0.json.set(raw);
        }
    }

    /// True when the JSON is cached (tests).
    #[cfg(test)]
    pub(crate) fn json_cached(&self) -> bool {
        self.0.json.get().is_some()
    }
}

impl From<ExecutionSpec> for SharedSpec {
    fn from(spec: ExecutionSpec) -> Self {
        Self::new(spec)
    }
}

impl core::ops::Deref for SharedSpec {
    type Target = ExecutionSpec;
    fn deref(&self) -> &ExecutionSpec {
        &self.0.spec
    }
}

impl core::ops::DerefMut for SharedSpec {
    fn deref_mut(&mut self) -> &mut ExecutionSpec {
        let cell = Arc::make_mut(&mut self.0);
        cell.json.take();
        &mut cell.spec
    }
}

impl PartialEq for SharedSpec {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0.spec == other.0.spec
    }
}

impl Eq for SharedSpec {}

impl core::fmt::Debug for SharedSpec {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        core::fmt::Debug::fmt(&self.0.spec, f)
    }
}

impl Serialize for SharedSpec {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0.json.get() {
            Some(raw) => raw.serialize(s),
            None => self.0.spec.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for SharedSpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        ExecutionSpec::deserialize(d).map(Self::new)
    }
}

/// An execution specification (C12.4).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecutionSpec {
    /// The artifact the machine boots from.
    pub artifact: ArtifactRef,
    /// The exact profile revision.
    pub profile: ProfileRef,
    /// What runs.
    pub action: Action,
    /// Retained machine the command runs on (managed command); none for a
    /// disposable execution.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<RecordKey>,
    /// A worker machine the caller names and owns (the CLI's `run` and
    /// `exec`): the command runs there and the controller never creates,
    /// stops or deletes it. Part of the identity (canonical encoding
    /// version 2). Exclusive with `machine`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker_machine: Option<WorkerMachine>,
    /// Input files, sorted by path.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inputs: Vec<InputFile>,
    /// Output files, sorted by path.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub outputs: Vec<OutputFile>,
    /// Queue budget in milliseconds.
    pub queue_budget_ms: u64,
    /// Retention in milliseconds.
    pub retention_ms: u64,
    /// Metadata (identifier keys).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, MetaValue>,
    /// Outbound network policy; absent is offline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<ProfileNetwork>,
    /// Guest-path policy; absent is the default root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest_paths: Option<GuestPathPolicy>,
}

/// A machine on a configured worker, named by the caller.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerMachine {
    /// Worker id (a configured worker of the controller).
    pub worker_id: String,
    /// Machine name on that worker.
    pub name: String,
}

/// A host-port to guest-port mapping (C9.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReservedPort {
    /// Host port, 1–65,535.
    pub host: u16,
    /// Guest port, 1–65,535.
    pub guest: u16,
}

/// A retained machine specification (C14). `Debug` prints the workload's
/// argument count only.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetainedMachineSpec {
    /// The artifact the machine boots from.
    pub artifact: ArtifactRef,
    /// The exact profile revision.
    pub profile: ProfileRef,
    /// Port mappings, sorted by host port.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<ReservedPort>,
    /// Startup workload argv.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload: Option<Vec<String>>,
    /// Checkpointable machine.
    #[serde(default, skip_serializing_if = "is_false")]
    pub checkpointable: bool,
    /// Outbound network policy; absent is offline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<ProfileNetwork>,
    /// Guest-path policy; absent is the default root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest_paths: Option<GuestPathPolicy>,
}

impl core::fmt::Debug for RetainedMachineSpec {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("RetainedMachineSpec")
            .field("artifact", &self.artifact)
            .field("profile", &self.profile)
            .field("ports", &self.ports)
            .field("workload_argc", &self.workload.as_ref().map(Vec::len))
            .field("checkpointable", &self.checkpointable)
            .field("network", &self.network)
            .field("guest_paths", &self.guest_paths)
            .finish()
    }
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if signature
fn is_false(b: &bool) -> bool {
    !*b
}

impl ArtifactRef {
    fn validate(&self) -> Result<(), Error> {
        check_identifier(&self.id)?;
        check_digest(&self.sha256)?;
        if !matches!(self.architecture.as_str(), "x86_64" | "aarch64") {
            return Err(Error::validation(
                Operation::StoreWrite,
                Reason::Architecture,
            ));
        }
        Ok(())
    }
}

impl ProfileRef {
    fn validate(&self) -> Result<(), Error> {
        check_identifier(&self.id)?;
        let b = &self.budgets;
        let ok = (1_000..=300_000).contains(&b.preparation_ms)
            && (1_000..=86_460_000).contains(&b.execution_ms)
            && (1_000..=300_000).contains(&b.collection_ms)
            && (1_000..=300_000).contains(&b.cleanup_ms)
            && (1..=16_777_216).contains(&self.per_file_max);
        if ok {
            Ok(())
        } else {
            Err(Error::validation(
                Operation::StoreWrite,
                Reason::ProfileBudget,
            ))
        }
    }
}

impl ExecutionSpec {
    /// Checks the stored-shape rules of C12.4.
    ///
    /// # Errors
    /// `validation` naming the first broken rule.
    pub fn validate(&self) -> Result<(), Error> {
        self.artifact.validate()?;
        self.profile.validate()?;
        match &self.action {
            Action::Command(c) if c.argv.is_empty() => {
                return Err(Error::validation(Operation::StoreWrite, Reason::EmptyArgv));
            }
            Action::Command(_) => {}
            Action::Terminal(t) => self.validate_terminal(t)?,
        }
        if let Some(m) = &self.machine {
            m.validate()?;
        }
        if let Some(w) = &self.worker_machine {
            if self.machine.is_some() {
                return Err(Error::validation(
                    Operation::StoreWrite,
                    Reason::TwoMachines,
                ));
            }
            super::check_worker_id(&w.worker_id)?;
            super::check_machine_name(&w.name)?;
        }
        if let Action::Command(CommandSpec {
            user: Some(user), ..
        }) = &self.action
            && (user.is_empty() || user.len() > crate::exec::MAX_USER_LEN)
        {
            return Err(Error::validation(Operation::StoreWrite, Reason::User));
        }
        if self.inputs.len() > MAX_FILES || self.outputs.len() > MAX_FILES {
            return Err(
                Error::validation(Operation::StoreWrite, Reason::TooManyFiles).with_limit(
                    self.inputs.len().max(self.outputs.len()) as u64,
                    MAX_FILES as u64,
                ),
            );
        }
        if !self.inputs.windows(2).all(|w| w[0].path < w[1].path)
            || !self.outputs.windows(2).all(|w| w[0].path < w[1].path)
        {
            return Err(Error::validation(
                Operation::StoreWrite,
                Reason::FilesNotSortedUnique,
            ));
        }
        for i in &self.inputs {
            check_digest(&i.sha256)?;
        }
        if !(1..=86_400_000).contains(&self.queue_budget_ms) {
            return Err(Error::validation(
                Operation::StoreWrite,
                Reason::QueueBudget,
            ));
        }
        if !(60_000..=2_592_000_000).contains(&self.retention_ms) {
            return Err(Error::validation(Operation::StoreWrite, Reason::Retention));
        }
        if self.metadata.len() > MAX_METADATA {
            return Err(
                Error::validation(Operation::StoreWrite, Reason::TooManyMetadata)
                    .with_limit(self.metadata.len() as u64, MAX_METADATA as u64),
            );
        }
        for (k, v) in &self.metadata {
            check_identifier(k)?;
            match v {
                MetaValue::String(s) if s.len() > MAX_METADATA_STRING => {
                    return Err(
                        Error::validation(Operation::StoreWrite, Reason::MetadataString)
                            .with_limit(s.len() as u64, MAX_METADATA_STRING as u64),
                    );
                }
                MetaValue::Integer(i) if i.unsigned_abs() > MAX_SAFE_INTEGER as u64 => {
                    return Err(Error::validation(
                        Operation::StoreWrite,
                        Reason::MetadataInteger,
                    ));
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// The managed rules of a terminal spec (C7.1, C7.4): a retained
    /// machine (disposable and caller-named machines are refused), no file
    /// manifests, an image source, and the ranges of
    /// [`ManagedTerminalSpec::validate`].
    fn validate_terminal(&self, t: &ManagedTerminalSpec) -> Result<(), Error> {
        if self.machine.is_none() {
            return Err(Error::validation(
                Operation::StoreWrite,
                Reason::TerminalNeedsRetainedMachine,
            ));
        }
        if !self.inputs.is_empty() || !self.outputs.is_empty() {
            return Err(Error::validation(
                Operation::StoreWrite,
                Reason::TerminalFileManifest,
            ));
        }
        if self.artifact.kind != ArtifactKind::Image {
            return Err(Error::validation(
                Operation::StoreWrite,
                Reason::TerminalCheckpointSource,
            ));
        }
        t.validate(&self.profile)
            .map_err(|e| e.with_operation(Operation::StoreWrite))
    }

    /// True for a background launch.
    pub fn is_background(&self) -> bool {
        matches!(&self.action, Action::Command(c) if c.background)
    }
}

impl RetainedMachineSpec {
    /// Checks the stored-shape rules.
    ///
    /// # Errors
    /// `validation` naming the first broken rule.
    pub fn validate(&self) -> Result<(), Error> {
        self.artifact.validate()?;
        self.profile.validate()?;
        if !self.ports.windows(2).all(|w| w[0].host < w[1].host)
            || self.ports.iter().any(|p| p.host == 0 || p.guest == 0)
        {
            return Err(Error::validation(Operation::StoreWrite, Reason::Ports));
        }
        let max = crate::worker::network::MAX_PORTS;
        if self.ports.len() > max {
            // The worker's create takes at most this many (C9.2).
            return Err(
                Error::validation(Operation::StoreWrite, Reason::TooManyPorts)
                    .with_limit(self.ports.len() as u64, max as u64),
            );
        }
        if self.workload.as_ref().is_some_and(Vec::is_empty) {
            return Err(Error::validation(
                Operation::StoreWrite,
                Reason::EmptyWorkload,
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Reason;
    use crate::managed::testkit::{exec_spec, key, managed_exec_spec};

    fn terminal_exec(t: ManagedTerminalSpec) -> ExecutionSpec {
        let mut spec = managed_exec_spec("t", &key("s", "machine-1"));
        spec.outputs.clear();
        spec.action = Action::Terminal(t);
        spec
    }

    fn reason(t: ManagedTerminalSpec) -> Option<Reason> {
        terminal_exec(t).validate().err().map(|e| e.reason())
    }

    #[test]
    fn retained_ports_at_n_and_n_plus_1() {
        let with = |n: u16| {
            let mut m = crate::managed::testkit::machine_spec();
            m.ports = (1..=n)
                .map(|i| ReservedPort {
                    host: 8_000 + i,
                    guest: 80,
                })
                .collect();
            m.validate()
        };
        assert!(with(32).is_ok());
        let e = with(33).unwrap_err();
        assert_eq!(e.reason(), Reason::TooManyPorts);
        assert_eq!(e.evidence(), crate::Evidence::NotDispatched);
    }

    #[test]
    fn every_terminal_bound_at_n_and_n_plus_1() {
        let d = ManagedTerminalSpec::default;
        assert_eq!(reason(d()), None);
        // (accepted at N, refused at N+1 or N−1 for a lower bound)
        let cases: Vec<(ManagedTerminalSpec, ManagedTerminalSpec, Reason)> = vec![
            (
                ManagedTerminalSpec {
                    program: "p".repeat(4_096),
                    ..d()
                },
                ManagedTerminalSpec {
                    program: "p".repeat(4_097),
                    ..d()
                },
                Reason::ProgramLength,
            ),
            (
                ManagedTerminalSpec {
                    program: "p".into(),
                    ..d()
                },
                ManagedTerminalSpec {
                    program: String::new(),
                    ..d()
                },
                Reason::ProgramLength,
            ),
            (
                ManagedTerminalSpec {
                    cols: 1,
                    rows: 1,
                    ..d()
                },
                ManagedTerminalSpec { cols: 0, ..d() },
                Reason::ColsOutOfRange,
            ),
            (
                ManagedTerminalSpec {
                    cols: u16::MAX,
                    rows: u16::MAX,
                    ..d()
                },
                ManagedTerminalSpec { rows: 0, ..d() },
                Reason::RowsOutOfRange,
            ),
            (
                ManagedTerminalSpec {
                    session_ms: 1_000,
                    idle_ms: 1_000,
                    ..d()
                },
                ManagedTerminalSpec {
                    session_ms: 999,
                    idle_ms: 999,
                    ..d()
                },
                Reason::SessionBudgetOutOfRange,
            ),
            (
                ManagedTerminalSpec {
                    idle_ms: 30_000,
                    ..d()
                },
                ManagedTerminalSpec {
                    idle_ms: 30_001,
                    ..d()
                },
                Reason::IdleBudgetOutOfRange,
            ),
            (
                ManagedTerminalSpec {
                    idle_ms: 1_000,
                    ..d()
                },
                ManagedTerminalSpec {
                    idle_ms: 999,
                    ..d()
                },
                Reason::IdleBudgetOutOfRange,
            ),
            (
                ManagedTerminalSpec {
                    close_ms: 5_000,
                    ..d()
                },
                ManagedTerminalSpec {
                    close_ms: 5_001,
                    ..d()
                },
                Reason::CloseWaitOutOfRange,
            ),
            (
                ManagedTerminalSpec { close_ms: 1, ..d() },
                ManagedTerminalSpec { close_ms: 0, ..d() },
                Reason::CloseWaitOutOfRange,
            ),
            (
                ManagedTerminalSpec {
                    attach_ms: 30_000,
                    ..d()
                },
                ManagedTerminalSpec {
                    attach_ms: 30_001,
                    ..d()
                },
                Reason::AttachWaitOutOfRange,
            ),
            (
                ManagedTerminalSpec {
                    attach_ms: 100,
                    ..d()
                },
                ManagedTerminalSpec {
                    attach_ms: 99,
                    ..d()
                },
                Reason::AttachWaitOutOfRange,
            ),
            (
                ManagedTerminalSpec {
                    buffer_bytes: 1_048_576,
                    ..d()
                },
                ManagedTerminalSpec {
                    buffer_bytes: 1_048_577,
                    ..d()
                },
                Reason::BufferOutOfRange,
            ),
            (
                ManagedTerminalSpec {
                    buffer_bytes: 1_024,
                    ..d()
                },
                ManagedTerminalSpec {
                    buffer_bytes: 1_023,
                    ..d()
                },
                Reason::BufferOutOfRange,
            ),
            (
                ManagedTerminalSpec {
                    input_bytes: 65_536,
                    ..d()
                },
                ManagedTerminalSpec {
                    input_bytes: 65_537,
                    ..d()
                },
                Reason::InputLimitOutOfRange,
            ),
            (
                ManagedTerminalSpec {
                    input_bytes: 1,
                    ..d()
                },
                ManagedTerminalSpec {
                    input_bytes: 0,
                    ..d()
                },
                Reason::InputLimitOutOfRange,
            ),
        ];
        for (ok, bad, why) in cases {
            assert_eq!(reason(ok.clone()), None, "{ok:?}");
            assert_eq!(reason(bad.clone()), Some(why), "{bad:?}");
        }
        let nul = ManagedTerminalSpec {
            program: "/bin/\0sh".into(),
            ..d()
        };
        assert_eq!(reason(nul), Some(Reason::ProgramNul));
    }

    #[test]
    fn the_session_budget_is_bounded_by_the_profile_execution_budget() {
        let mut spec = terminal_exec(ManagedTerminalSpec {
            session_ms: 60_000,
            idle_ms: 1_000,
            ..ManagedTerminalSpec::default()
        });
        spec.profile.budgets.execution_ms = 60_000;
        assert_eq!(spec.validate(), Ok(()));
        spec.profile.budgets.execution_ms = 59_999;
        let e = spec.validate().unwrap_err();
        assert_eq!(e.reason(), Reason::SessionOverBudget);
        assert_eq!(e.limit().map(|l| (l.actual, l.max)), Some((60_000, 59_999)));
        // The largest session budget at the largest profile budget.
        spec.profile.budgets.execution_ms = 86_460_000;
        if let Action::Terminal(t) = &mut spec.action {
            t.session_ms = 86_400_000;
        }
        assert_eq!(spec.validate(), Ok(()));
    }

    #[test]
    fn terminals_run_only_on_retained_image_machines_without_manifests() {
        let mut disposable = terminal_exec(ManagedTerminalSpec::default());
        disposable.machine = None;
        assert_eq!(
            disposable.validate().unwrap_err().reason(),
            Reason::TerminalNeedsRetainedMachine
        );
        let mut named = disposable.clone();
        named.worker_machine = Some(WorkerMachine {
            worker_id: "dev".into(),
            name: "m1".into(),
        });
        assert_eq!(
            named.validate().unwrap_err().reason(),
            Reason::TerminalNeedsRetainedMachine
        );
        let with_outputs = ExecutionSpec {
            outputs: exec_spec("x").outputs,
            ..terminal_exec(ManagedTerminalSpec::default())
        };
        assert_eq!(
            with_outputs.validate().unwrap_err().reason(),
            Reason::TerminalFileManifest
        );
        let mut checkpoint = terminal_exec(ManagedTerminalSpec::default());
        checkpoint.artifact.kind = ArtifactKind::Checkpoint;
        assert_eq!(
            checkpoint.validate().unwrap_err().reason(),
            Reason::TerminalCheckpointSource
        );
    }

    #[test]
    fn the_terminal_spec_has_no_command_options_and_debug_hides_the_program() {
        let t = ManagedTerminalSpec {
            program: "/bin/SENTINEL-PROGRAM".into(),
            ..ManagedTerminalSpec::default()
        };
        let dbg = format!("{t:?}");
        assert!(!dbg.contains("SENTINEL"), "{dbg}");
        let json = serde_json::to_value(&t).unwrap();
        for forbidden in [
            "argv",
            "env",
            "workdir",
            "user",
            "stdin",
            "timeout",
            "background",
        ] {
            assert!(json.get(forbidden).is_none(), "{forbidden}");
        }
        let mut with_argv = json;
        with_argv["argv"] = serde_json::json!(["sh"]);
        assert!(serde_json::from_value::<ManagedTerminalSpec>(with_argv).is_err());
    }
}

#[cfg(test)]
mod shared_spec_tests {
    #![allow(clippy::unwrap_used)] // test code
    use crate::managed::envelope::encode_exec_validated;
    use crate::managed::testkit::{accepted, exec_spec, key};

    #[test]
    fn an_encoding_caches_the_json_for_every_copy_and_a_write_drops_it() {
        let rec = accepted(key("s", "r"), exec_spec("x"), 1_700_000_000_000);
        let copy = rec.clone();
        assert!(!rec.spec.json_cached());
        encode_exec_validated(&rec).unwrap();
        assert!(rec.spec.json_cached() && copy.spec.json_cached());
        let mut written = copy.clone();
        written.spec.retention_ms += 1;
        assert!(!written.spec.json_cached());
        assert!(rec.spec.json_cached() && copy.spec.json_cached());
    }
}
