//! File transfers of the managed runtime (C6.4), the half shared by both
//! shells: what [`WorkerOp::Upload`] and [`WorkerOp::Download`] become.
//!
//! The shell only moves bytes: for an upload it reads the declared input
//! from the runtime's [`Artifacts`] ([`upload_of`]: at most the declared
//! size, and the core [`Upload`] checks the digest before any I/O), sends
//! it with its `Client`, and answers with the reply's size; for a download
//! it reads the guest file with its `Client` ([`download_of`]: the cap the
//! controller chose) and hands the bytes to [`downloaded`], which digests
//! them and, for a collected output, puts them into the artifact store.
//! The controller gets sizes and digests, never bytes.

use bytes::Bytes;
use smolbox_core::managed::controller::{WorkerOp, WorkerReply, WorkerResult};
use smolbox_core::worker::{Budgets, Download, FileBudget, Upload};
use smolbox_core::{Error, Operation, Reason};

use crate::artifacts::{Artifacts, sha256_hex};

fn not_a(op: Operation) -> Error {
    Error::validation(op, Reason::UnexpectedReply)
}

/// The upload a [`WorkerOp::Upload`] names, its bytes read from
/// `artifacts` (at most the declared size; exactly it, else refused).
///
/// # Errors
/// The artifact store's errors; `validation` (`artifact_read_size`) for
/// bytes of another size; [`Upload::new`]'s (policy, digest, size,
/// version); all before anything is sent.
pub fn upload_of(
    op: &WorkerOp,
    artifacts: Option<&dyn Artifacts>,
    budgets: &Budgets,
) -> Result<Upload, Error> {
    let WorkerOp::Upload {
        profile,
        name,
        policy,
        path,
        scope,
        source,
        sha256,
        size,
        per_file,
        ..
    } = op
    else {
        return Err(not_a(Operation::Upload));
    };
    let artifacts = artifacts
        .ok_or_else(|| Error::unsupported_capability(Operation::Upload, Reason::FileTransfer))?;
    let data = artifacts.read(scope, source, *size)?;
    if data.len() as u64 != *size {
        return Err(
            Error::validation(Operation::Upload, Reason::ArtifactReadSize)
                .with_limit(data.len() as u64, *size),
        );
    }
    let budget = FileBudget::new(*per_file, budgets)?;
    Upload::new(
        profile,
        policy,
        &budget,
        name.clone(),
        path.clone(),
        data,
        sha256,
    )
}

/// The download a [`WorkerOp::Download`] names.
///
/// # Errors
/// [`Download::new`]'s (policy, limit, version), before anything is sent.
pub fn download_of(op: &WorkerOp, budgets: &Budgets) -> Result<Download, Error> {
    let WorkerOp::Download {
        profile,
        name,
        policy,
        path,
        max_bytes,
        per_file,
        ..
    } = op
    else {
        return Err(not_a(Operation::Download));
    };
    let budget = FileBudget::new(*per_file, budgets)?;
    Download::new(
        profile,
        policy,
        &budget,
        name.clone(),
        path.clone(),
        *max_bytes,
    )
}

/// The answer to a [`WorkerOp::Download`] whose bytes were read: their
/// size and digest, after putting them into `artifacts` when the op names
/// a destination (a collected output).
///
/// # Errors
/// The artifact store's errors (an output-store outage: the controller
/// records `collection_failed` with the exit kept).
pub fn downloaded(op: &WorkerOp, bytes: Bytes, artifacts: Option<&dyn Artifacts>) -> WorkerResult {
    let sha256 = sha256_hex(&bytes);
    let size = bytes.len() as u64;
    if let WorkerOp::Download {
        store: Some((key, destination)),
        ..
    } = op
    {
        let artifacts = artifacts.ok_or_else(|| {
            Error::unsupported_capability(Operation::Download, Reason::FileTransfer)
        })?;
        artifacts.put(key, destination, bytes, &sha256)?;
    }
    Ok(WorkerReply::Downloaded { size, sha256 })
}
