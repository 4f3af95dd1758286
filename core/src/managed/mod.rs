//! Execution and machine records, their pure transitions, fingerprints and the
//! record envelope (features C12.5, C13, C14, C15, C19), shared by every store.
//!
//! Everything here is a pure function of its arguments: wall-clock
//! milliseconds (`now_ms`) are passed in, randomness is not used, and no
//! store is touched. Each store adapter loads a record, calls the same
//! function here (for example [`patch::apply_exec`] or [`claim::take`]) and
//! writes the result back inside one transaction, so the rules are written
//! once:
//!
//! - [`state`]: the state tables of C13.1 and C14.1 and the evidence
//!   coupling of C13.2, in one place;
//! - [`record`]: [`ExecutionRecord`] and [`MachineRecord`] with every field of
//!   C13.3 / C14.1 and their invariants;
//! - [`patch`]: the only patchable fields, version + 1, `now ≥ updated_at`,
//!   write-once fields and deadlines set once (C13.4);
//! - [`claim`]: leases, claims and guards `{owner, generation, version}` (C15);
//! - [`slot`]: the command slot, one active execution per machine (C14.3);
//! - [`fingerprint`]: HMAC-SHA256 over a canonical, versioned encoding (C12.5);
//! - [`envelope`]: the versioned, data-only record envelope (C19).
//!
//! Leases, claims and generations fence *store writes only*: they never
//! prove that an HTTP request already sent cannot still take effect (C15).

use crate::Reason;
use serde::{Deserialize, Serialize};

use crate::{Error, Operation};

pub mod claim;
pub mod controller;
pub mod envelope;
pub mod fingerprint;
pub mod live;
pub mod patch;
pub mod record;
pub mod slot;
pub mod spec;
pub mod state;
pub mod terminal;
#[cfg(feature = "testkit")]
pub mod testkit;

pub use claim::{Guard, Lease};
pub use envelope::{Capabilities, RecordFeature, RecordKind};
pub use fingerprint::FingerprintKey;
pub use patch::{ExecPatch, MachinePatch};
pub use record::{ExecutionRecord, MachineRecord};
pub use spec::{CommandFiles, ExecutionSpec, RetainedMachineSpec};
pub use state::{Cleanup, Collection, ExecState, MachineRecordState, RecordEvidence};

/// Largest wall-clock timestamp in milliseconds (C0.1).
pub const MAX_TIMESTAMP_MS: u64 = 253_402_300_000_000;
/// Largest record counter or version (C0.1).
pub const MAX_COUNTER: u64 = 9_007_199_254_740_991;

/// The identity of a record: `(scope, id)`, both identifiers (C0.1).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecordKey {
    /// Tenant or caller scope.
    pub scope: String,
    /// Identifier within the scope.
    pub id: String,
}

impl RecordKey {
    /// A key from two identifiers.
    ///
    /// # Errors
    /// `validation` when either part is not an identifier.
    pub fn new(scope: &str, id: &str) -> Result<Self, Error> {
        let key = Self {
            scope: scope.to_owned(),
            id: id.to_owned(),
        };
        key.validate()?;
        Ok(key)
    }

    /// Checks both parts are identifiers (C0.1).
    ///
    /// # Errors
    /// `validation` when either part is not an identifier.
    pub fn validate(&self) -> Result<(), Error> {
        check_identifier(&self.scope)?;
        check_identifier(&self.id)
    }
}

/// Checks an identifier: 1–128 bytes, first `[A-Za-z0-9]`, rest
/// `[A-Za-z0-9._:-]` (C0.1).
///
/// # Errors
/// `validation` with reason `identifier`.
pub fn check_identifier(s: &str) -> Result<(), Error> {
    let b = s.as_bytes();
    let ok = !b.is_empty()
        && b.len() <= 128
        && b[0].is_ascii_alphanumeric()
        && b[1..]
            .iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b':' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(Error::validation(Operation::StoreWrite, Reason::Identifier))
    }
}

/// Checks a worker id: ≤64 bytes, `^[A-Za-z0-9][A-Za-z0-9._-]*$` (C0.1).
///
/// # Errors
/// `validation` with reason `worker_id`.
pub fn check_worker_id(s: &str) -> Result<(), Error> {
    let b = s.as_bytes();
    let ok = !b.is_empty()
        && b.len() <= 64
        && b[0].is_ascii_alphanumeric()
        && b[1..]
            .iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(Error::validation(Operation::StoreWrite, Reason::WorkerId))
    }
}

/// Checks a machine name: ≤31 bytes, `^[a-z0-9][a-z0-9_-]*$` (C0.1).
///
/// # Errors
/// `validation` with reason `machine_name`.
pub fn check_machine_name(s: &str) -> Result<(), Error> {
    let b = s.as_bytes();
    let ok = !b.is_empty()
        && b.len() <= 31
        && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
        && b[1..]
            .iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(Error::validation(
            Operation::StoreWrite,
            Reason::MachineName,
        ))
    }
}

/// Checks a SHA-256 digest: 64 lowercase hex characters (C0.1).
///
/// # Errors
/// `validation` with reason `digest`.
pub fn check_digest(s: &str) -> Result<(), Error> {
    let ok = s.len() == 64 && s.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'));
    if ok {
        Ok(())
    } else {
        Err(Error::validation(Operation::StoreWrite, Reason::Digest))
    }
}
