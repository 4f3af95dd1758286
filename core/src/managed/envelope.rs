//! The record envelope (C19): one version tag, a record kind and a
//! data-only payload of at most 16 MiB.
//!
//! ```text
//! envelope = version(u16 BE) kind(u8: 'E' execution | 'M' machine) payload
//! payload  = canonical JSON of the record (serde, unknown keys refused)
//! ```
//!
//! Decoding fails loudly, with a `store` error, on: a short or oversized
//! envelope, an unknown version (including compressed data, whose magic is
//! no known version), a kind mismatch, unexpected keys or variants, a
//! payload that is not exactly the canonical encoding of the record it
//! decodes to (trailing bytes, whitespace, reordered or explicit-null keys),
//! a record that breaks an invariant, or a record needing features newer
//! than its envelope version. Decoding grows no global table: every
//! vocabulary is a closed enum.
//!
//! # Selective versions (C19.2)
//!
//! This project numbers its envelopes from 1. A record is written with the
//! oldest version that can hold its features (so records without newer
//! features keep older envelopes and fingerprints), and every capability
//! any of its features needs stays required:
//!
//! | Version | Trigger | Store capability |
//! |---|---|---|
//! | 1 | disposable execution (image or checkpoint) | base |
//! | 2 | retained machines and their commands | `managed_machines` (+ `managed_ports` with ports) |
//! | 3 | background launch or execution budget > 300,000 ms | `extended_execution` |
//! | 4 | terminal execution | `interactive_terminal` + `extended_execution` |
//! | 5 | machine with startup workload | `managed_workloads` |
//! | 6 | explicit guest-path policy or per-file > 1 MiB | `guest_files` |
//!
//! All versions share one payload schema whose newer fields are optional,
//! so an older envelope decodes with neutral defaults.

use crate::Reason;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::record::{ExecutionRecord, MachineRecord};
use super::spec::{Action, MAX_BASE_EXECUTION_BUDGET_MS, MAX_BASE_PER_FILE};
use crate::{Error, Evidence, Operation};

/// Newest envelope version this build reads and writes.
pub const CURRENT_VERSION: u16 = 6;
/// Largest payload in bytes (C19.1).
pub const MAX_PAYLOAD_LEN: usize = 16 * 1024 * 1024;
/// Bytes before the payload.
pub const HEADER_LEN: usize = 3;

/// Which record an envelope holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RecordKind {
    /// An execution record.
    Execution,
    /// A retained machine record.
    Machine,
}

impl RecordKind {
    /// The kind byte of the envelope.
    pub const fn tag(self) -> u8 {
        match self {
            Self::Execution => b'E',
            Self::Machine => b'M',
        }
    }

    /// The name used in associated data and projections.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Execution => "execution",
            Self::Machine => "machine",
        }
    }
}

/// A feature that forces a newer envelope (C19.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RecordFeature {
    /// Disposable execution.
    Base,
    /// Retained machine or a command on one.
    ManagedMachines,
    /// Host ports on a retained machine.
    ManagedPorts,
    /// Background launch or execution budget > 300,000 ms.
    ExtendedExecution,
    /// Interactive terminal.
    InteractiveTerminal,
    /// Machine with a startup workload.
    ManagedWorkloads,
    /// Explicit guest-path policy or per-file > 1 MiB.
    GuestFiles,
}

impl RecordFeature {
    /// The oldest envelope version that can hold this feature.
    pub const fn min_version(self) -> u16 {
        match self {
            Self::Base => 1,
            Self::ManagedMachines | Self::ManagedPorts => 2,
            Self::ExtendedExecution => 3,
            Self::InteractiveTerminal => 4,
            Self::ManagedWorkloads => 5,
            Self::GuestFiles => 6,
        }
    }

    /// The store capabilities this feature needs.
    pub const fn capabilities(self) -> Capabilities {
        let mut c = Capabilities::BASE;
        match self {
            Self::Base => {}
            Self::ManagedMachines => c.managed_machines = true,
            Self::ManagedPorts => {
                c.managed_machines = true;
                c.managed_ports = true;
            }
            Self::ExtendedExecution => c.extended_execution = true,
            Self::InteractiveTerminal => {
                c.interactive_terminal = true;
                c.extended_execution = true;
            }
            Self::ManagedWorkloads => {
                c.managed_machines = true;
                c.managed_workloads = true;
            }
            Self::GuestFiles => c.guest_files = true,
        }
        c
    }
}

/// Store feature flags (C18.1, C19.2); `base` is implied.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Capabilities {
    /// Retained machines and their commands.
    pub managed_machines: bool,
    /// Host port reservations.
    pub managed_ports: bool,
    /// Background launches and long budgets.
    pub extended_execution: bool,
    /// Interactive terminals.
    pub interactive_terminal: bool,
    /// Startup workloads.
    pub managed_workloads: bool,
    /// Explicit guest-path policies and large files.
    pub guest_files: bool,
}

impl Capabilities {
    /// Base only.
    pub const BASE: Self = Self {
        managed_machines: false,
        managed_ports: false,
        extended_execution: false,
        interactive_terminal: false,
        managed_workloads: false,
        guest_files: false,
    };

    /// Every capability this build knows.
    pub const ALL: Self = Self {
        managed_machines: true,
        managed_ports: true,
        extended_execution: true,
        interactive_terminal: true,
        managed_workloads: true,
        guest_files: true,
    };

    /// The union of two sets.
    #[must_use]
    pub const fn union(self, o: Self) -> Self {
        Self {
            managed_machines: self.managed_machines | o.managed_machines,
            managed_ports: self.managed_ports | o.managed_ports,
            extended_execution: self.extended_execution | o.extended_execution,
            interactive_terminal: self.interactive_terminal | o.interactive_terminal,
            managed_workloads: self.managed_workloads | o.managed_workloads,
            guest_files: self.guest_files | o.guest_files,
        }
    }

    /// True when every capability in `needed` is in `self`.
    pub const fn covers(self, needed: Self) -> bool {
        (!needed.managed_machines || self.managed_machines)
            && (!needed.managed_ports || self.managed_ports)
            && (!needed.extended_execution || self.extended_execution)
            && (!needed.interactive_terminal || self.interactive_terminal)
            && (!needed.managed_workloads || self.managed_workloads)
            && (!needed.guest_files || self.guest_files)
    }
}

/// The envelope version and capabilities a record needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Requirements {
    /// Oldest envelope version that holds every feature.
    pub version: u16,
    /// Union of every feature's capabilities.
    pub capabilities: Capabilities,
}

impl Requirements {
    fn of(features: &[RecordFeature]) -> Self {
        features.iter().fold(
            Self {
                version: 1,
                capabilities: Capabilities::BASE,
            },
            |acc, f| Self {
                version: acc.version.max(f.min_version()),
                capabilities: acc.capabilities.union(f.capabilities()),
            },
        )
    }
}

/// The features an execution record uses.
pub fn exec_features(rec: &ExecutionRecord) -> Vec<RecordFeature> {
    let spec = &rec.spec;
    let mut f = vec![RecordFeature::Base];
    if spec.machine.is_some() {
        f.push(RecordFeature::ManagedMachines);
    }
    if spec.is_background() || spec.profile.budgets.execution_ms > MAX_BASE_EXECUTION_BUDGET_MS {
        f.push(RecordFeature::ExtendedExecution);
    }
    if matches!(spec.action, Action::Terminal(_)) {
        f.push(RecordFeature::InteractiveTerminal);
    }
    if spec.guest_paths.is_some() || spec.profile.per_file_max > MAX_BASE_PER_FILE {
        f.push(RecordFeature::GuestFiles);
    }
    f
}

/// The features a machine record uses.
pub fn machine_features(rec: &MachineRecord) -> Vec<RecordFeature> {
    let spec = &rec.spec;
    let mut f = vec![RecordFeature::Base, RecordFeature::ManagedMachines];
    if !spec.ports.is_empty() {
        f.push(RecordFeature::ManagedPorts);
    }
    if spec.profile.budgets.execution_ms > MAX_BASE_EXECUTION_BUDGET_MS {
        f.push(RecordFeature::ExtendedExecution);
    }
    if spec.workload.is_some() {
        f.push(RecordFeature::ManagedWorkloads);
    }
    if spec.guest_paths.is_some() || spec.profile.per_file_max > MAX_BASE_PER_FILE {
        f.push(RecordFeature::GuestFiles);
    }
    f
}

/// What an execution record needs (AC-19.2).
pub fn exec_requirements(rec: &ExecutionRecord) -> Requirements {
    Requirements::of(&exec_features(rec))
}

/// What a machine record needs.
pub fn machine_requirements(rec: &MachineRecord) -> Requirements {
    Requirements::of(&machine_features(rec))
}

/// Encodes an execution record in the oldest envelope its features allow.
///
/// # Errors
/// `validation` when the record breaks an invariant; `store` when the
/// payload would exceed 16 MiB.
pub fn encode_exec(rec: &ExecutionRecord) -> Result<Vec<u8>, Error> {
    rec.validate()?;
    rec.spec.cache_json();
    encode(RecordKind::Execution, exec_requirements(rec).version, rec)
}

/// Encodes a machine record.
///
/// # Errors
/// As [`encode_exec`].
pub fn encode_machine(rec: &MachineRecord) -> Result<Vec<u8>, Error> {
    rec.validate()?;
    encode(RecordKind::Machine, machine_requirements(rec).version, rec)
}

/// Encodes an execution record its caller has just validated (a store
/// writing the result of a rule that validated it, such as
/// [`super::patch::apply_exec`]): the bytes of [`encode_exec`] without
/// validating a second time. Decoding always re-validates, so a record that
/// was not valid is never read back.
///
/// # Errors
/// `store` when the payload would exceed 16 MiB.
pub fn encode_exec_validated(rec: &ExecutionRecord) -> Result<Vec<u8>, Error> {
    rec.spec.cache_json();
    encode(RecordKind::Execution, exec_requirements(rec).version, rec)
}

/// Encodes a machine record its caller has just validated, as
/// [`encode_exec_validated`].
///
/// # Errors
/// As [`encode_exec_validated`].
pub fn encode_machine_validated(rec: &MachineRecord) -> Result<Vec<u8>, Error> {
    encode(RecordKind::Machine, machine_requirements(rec).version, rec)
}

/// Decodes and re-validates an execution record.
///
/// # Errors
/// `store` for every failure listed in the module docs.
pub fn decode_exec(bytes: &[u8]) -> Result<ExecutionRecord, Error> {
    let (version, rec): (u16, ExecutionRecord) = decode(RecordKind::Execution, bytes)?;
    rec.validate().map_err(|_| {
        Error::store(
            Operation::Envelope,
            Evidence::Unknown,
            Reason::RecordInvalid,
        )
    })?;
    if exec_requirements(&rec).version > version {
        return Err(Error::store(
            Operation::Envelope,
            Evidence::Unknown,
            Reason::FeatureBeyondVersion,
        ));
    }
    Ok(rec)
}

/// Decodes and re-validates a machine record.
///
/// # Errors
/// As [`decode_exec`].
pub fn decode_machine(bytes: &[u8]) -> Result<MachineRecord, Error> {
    let (version, rec): (u16, MachineRecord) = decode(RecordKind::Machine, bytes)?;
    rec.validate().map_err(|_| {
        Error::store(
            Operation::Envelope,
            Evidence::Unknown,
            Reason::RecordInvalid,
        )
    })?;
    if machine_requirements(&rec).version > version {
        return Err(Error::store(
            Operation::Envelope,
            Evidence::Unknown,
            Reason::FeatureBeyondVersion,
        ));
    }
    Ok(rec)
}

/// The version and kind of an envelope, without decoding its payload.
///
/// # Errors
/// `store` for a short envelope, an unknown version or kind.
pub fn peek(bytes: &[u8]) -> Result<(u16, RecordKind), Error> {
    if bytes.len() < HEADER_LEN {
        return Err(Error::store(
            Operation::Envelope,
            Evidence::Unknown,
            Reason::EnvelopeShort,
        ));
    }
    let version = u16::from_be_bytes([bytes[0], bytes[1]]);
    if !(1..=CURRENT_VERSION).contains(&version) {
        return Err(Error::store(
            Operation::Envelope,
            Evidence::Unknown,
            Reason::UnknownEnvelopeVersion,
        ));
    }
    let kind = match bytes[2] {
        b'E' => RecordKind::Execution,
        b'M' => RecordKind::Machine,
        _ => {
            return Err(Error::store(
                Operation::Envelope,
                Evidence::Unknown,
                Reason::UnknownRecordKind,
            ));
        }
    };
    Ok((version, kind))
}

fn encode<T: Serialize>(kind: RecordKind, version: u16, rec: &T) -> Result<Vec<u8>, Error> {
    let mut out = Vec::with_capacity(512);
    out.extend_from_slice(&version.to_be_bytes());
    out.push(kind.tag());
    serde_json::to_writer(&mut out, rec)
        .map_err(|_| Error::store(Operation::Envelope, Evidence::Unknown, Reason::Encode))?;
    if out.len() - HEADER_LEN > MAX_PAYLOAD_LEN {
        return Err(Error::store(
            Operation::Envelope,
            Evidence::Unknown,
            Reason::PayloadTooLarge,
        )
        .with_limit((out.len() - HEADER_LEN) as u64, MAX_PAYLOAD_LEN as u64));
    }
    Ok(out)
}

fn decode<T: Serialize + DeserializeOwned>(
    kind: RecordKind,
    bytes: &[u8],
) -> Result<(u16, T), Error> {
    if bytes.len() > HEADER_LEN + MAX_PAYLOAD_LEN {
        return Err(Error::store(
            Operation::Envelope,
            Evidence::Unknown,
            Reason::PayloadTooLarge,
        )
        .with_limit((bytes.len() - HEADER_LEN) as u64, MAX_PAYLOAD_LEN as u64));
    }
    let (version, found) = peek(bytes)?;
    if found != kind {
        return Err(Error::store(
            Operation::Envelope,
            Evidence::Unknown,
            Reason::RecordKindMismatch,
        ));
    }
    let payload = &bytes[HEADER_LEN..];
    let rec: T = serde_json::from_slice(payload).map_err(|_| {
        Error::store(
            Operation::Envelope,
            Evidence::Unknown,
            Reason::PayloadDecode,
        )
    })?;
    // Canonical form: the payload must be exactly what this record encodes
    // to, which refuses trailing bytes, whitespace, duplicate or reordered
    // keys and explicit defaults.
    let again = serde_json::to_vec(&rec)
        .map_err(|_| Error::store(Operation::Envelope, Evidence::Unknown, Reason::Encode))?;
    if again != payload {
        return Err(Error::store(
            Operation::Envelope,
            Evidence::Unknown,
            Reason::PayloadNotCanonical,
        ));
    }
    Ok((version, rec))
}

/// Fuzz body of the `envelope` target: arbitrary bytes never panic, and
/// anything that decodes re-encodes to the same bytes.
#[cfg(feature = "testkit")]
pub fn fuzz_envelope(data: &[u8]) {
    if let Ok(rec) = decode_exec(data) {
        let again = encode_exec(&rec).ok();
        assert!(
            again.is_some_and(|b| b[HEADER_LEN..] == data[HEADER_LEN..]),
            "a decoded record re-encodes to the same payload"
        );
    }
    if let Ok(rec) = decode_machine(data) {
        let again = encode_machine(&rec).ok();
        assert!(
            again.is_some_and(|b| b[HEADER_LEN..] == data[HEADER_LEN..]),
            "a decoded record re-encodes to the same payload"
        );
    }
}
