//! The artifact store (features C6.5): host-owned, bounded bytes that a
//! managed execution's declared inputs are read from and its collected
//! outputs are put into. The controller never sees the bytes: the shell's
//! driver reads an input for [`WorkerOp::Upload`] and puts an output for
//! [`WorkerOp::Download`]; only sizes and digests reach the record.
//!
//! [`WorkerOp::Upload`]: smolbox_core::managed::controller::WorkerOp::Upload
//! [`WorkerOp::Download`]: smolbox_core::managed::controller::WorkerOp::Download

pub mod dir;

pub use dir::DirArtifacts;

use std::collections::BTreeMap;
use std::sync::Mutex;

use bytes::Bytes;
use sha2::{Digest, Sha256};
use smolbox_core::managed::RecordKey;
use smolbox_core::{Error, Evidence, Operation, Reason};

/// Where a runtime's input bytes come from and its outputs go.
pub trait Artifacts: Send + Sync {
    /// The bytes stored under `(scope, reference)`, refusing more than
    /// `max` while reading.
    ///
    /// # Errors
    /// `not_found` (`artifact_missing`) when nothing is stored under the
    /// reference; `output_limit` past `max`; `store` when the store fails.
    fn read(&self, scope: &str, reference: &str, max: u64) -> Result<Bytes, Error>;

    /// Puts one collected output of `key` under `destination`; immutable
    /// per `(key, destination)`: the same digest again is `Ok`, another one
    /// is `identity_conflict` and the original stays.
    ///
    /// # Errors
    /// `identity_conflict` (`artifact_digest_conflict`); `store` when the
    /// store fails.
    fn put(
        &self,
        key: &RecordKey,
        destination: &str,
        bytes: Bytes,
        sha256: &str,
    ) -> Result<(), Error>;
}

/// The lowercase hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut s = String::with_capacity(64);
    for b in Sha256::digest(bytes) {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// An in-memory artifact store (tests, ephemeral runtimes; the directory
/// one is [`DirArtifacts`]): inputs put
/// with [`MemoryArtifacts::insert`], outputs read back with
/// [`MemoryArtifacts::output`]. `Debug` prints counts, never bytes.
#[derive(Default)]
pub struct MemoryArtifacts {
    inputs: Mutex<BTreeMap<(String, String), Bytes>>,
    outputs: Mutex<BTreeMap<(RecordKey, String), (String, Bytes)>>,
}

impl std::fmt::Debug for MemoryArtifacts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryArtifacts")
            .field("inputs", &self.inputs.lock().map(|g| g.len()).ok())
            .field("outputs", &self.outputs.lock().map(|g| g.len()).ok())
            .finish()
    }
}

fn poisoned(op: Operation) -> Error {
    Error::store(op, Evidence::NotDispatched, Reason::StoreTaskLost)
}

impl MemoryArtifacts {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Stores an input under `(scope, reference)` (replacing any) and
    /// returns its SHA-256 for the manifest.
    pub fn insert(&self, scope: &str, reference: &str, bytes: impl Into<Bytes>) -> String {
        let bytes = bytes.into();
        let digest = sha256_hex(&bytes);
        if let Ok(mut g) = self.inputs.lock() {
            g.insert((scope.to_owned(), reference.to_owned()), bytes);
        }
        digest
    }

    /// A collected output of `key` under `destination`, with its digest.
    pub fn output(&self, key: &RecordKey, destination: &str) -> Option<(String, Bytes)> {
        let g = self.outputs.lock().ok()?;
        g.get(&(key.clone(), destination.to_owned())).cloned()
    }
}

impl Artifacts for MemoryArtifacts {
    fn read(&self, scope: &str, reference: &str, max: u64) -> Result<Bytes, Error> {
        let op = Operation::Upload;
        let g = self.inputs.lock().map_err(|_| poisoned(op))?;
        let Some(b) = g.get(&(scope.to_owned(), reference.to_owned())) else {
            return Err(Error::not_found(
                op,
                Evidence::NotDispatched,
                Reason::ArtifactMissing,
            ));
        };
        if b.len() as u64 > max {
            return Err(
                Error::output_limit(op, Evidence::NotDispatched, Reason::ArtifactReadSize)
                    .with_limit(b.len() as u64, max),
            );
        }
        Ok(b.clone())
    }

    fn put(
        &self,
        key: &RecordKey,
        destination: &str,
        bytes: Bytes,
        sha256: &str,
    ) -> Result<(), Error> {
        let op = Operation::Download;
        let mut g = self.outputs.lock().map_err(|_| poisoned(op))?;
        let k = (key.clone(), destination.to_owned());
        match g.get(&k) {
            Some((d, _)) if d == sha256 => Ok(()),
            Some(_) => Err(Error::identity_conflict(
                op,
                Evidence::NotDispatched,
                Reason::ArtifactDigestConflict,
            )),
            None => {
                g.insert(k, (sha256.to_owned(), bytes));
                Ok(())
            }
        }
    }
}
