//! Declared files of an execution (C6.4, C12.4): inputs staged after the
//! machine started and before the dispatch intent, outputs collected after
//! the result is stored (`collecting`). Split from `exec.rs`; the same
//! `Exec`, its private state is visible here (a child module).
//!
//! Staging: for each input, in path order, [`WorkerOp::Upload`] (the driver
//! reads the declared bytes from its artifact store; the upload's digest
//! check runs before any I/O), then [`WorkerOp::Download`] without a
//! destination, whose size and SHA-256 must equal the declared ones. Only
//! then is `ready` written: that write, over a spec whose manifest names
//! each input's size and digest, is the staging evidence. A staging answer
//! that is not a verified success fails the preparation (`failed`,
//! `not_dispatched`; a disposable machine is then deleted): an upload is
//! never retried in this process (C6.1). Nor in another: only the process
//! that wrote `preparing` stages, so a `preparing` record with inputs found
//! by recovery (or taken over from a paused controller) fails
//! `not_dispatched` with `staging_uncertain` instead of uploading again (a
//! disposable one already fails at its start, `start_uncertain`).
//!
//! A retained machine's command (issue 12) takes the same steps inside its
//! slot: it is accepted without the dispatch intent when it has inputs, so
//! the process that writes `preparing` stages them; the slot finish (with
//! the cleanup) follows the completion write, so a failed collection or an
//! interrupted preparation keeps the slot (C14.3).
//!
//! Collection: for each output, in path order, an owned machine
//! (disposable, or the retained machine of the slot) is re-observed
//! running as the recorded incarnation ([`WorkerOp::Inspect`]),
//! then [`WorkerOp::Download`] with the declared maximum puts the bytes into
//! the artifact store under `(record key, destination)`; only the size and
//! digest come back, and only they are recorded (`artifacts`). All
//! collected → `completed`, collection `complete`; a failure → collection
//! `failed` (or `partial` with what was stored), state
//! `collection_failed`, the exit kept. Collection is reads and immutable
//! puts, so a `collecting` record found after a restart collects again
//! from the first output.

#[allow(clippy::wildcard_imports)] // the parent's vocabulary, one module
use super::*;
use crate::managed::record::CollectedArtifact;
use crate::managed::spec::{ExecutionSpec, InputFile};
use crate::managed::{check_digest, check_identifier};
use crate::worker::{GuestPath, PathPolicy, Profile};

/// The per-direction aggregate budget (C6.3 default, 4 MiB). The profile
/// reference carries no aggregate of its own, so this default applies, or
/// the per-file budget when that is larger (the aggregate is ≥ per-file).
pub(in crate::managed::controller) const DEFAULT_AGGREGATE: u64 = 4_194_304;

/// What a file op is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::managed::controller) enum FKind {
    /// The upload of the next input.
    Upload,
    /// Reading the uploaded input back.
    Recheck,
    /// Inspecting a disposable machine before a download.
    Observe,
    /// Downloading the next output into the artifact store.
    Collect,
}

/// What this process did with the execution's files (facts of this
/// process only: a resumed record starts empty).
#[derive(Debug, Default)]
pub(in crate::managed::controller) struct FileSteps {
    /// Inputs uploaded and verified, in path order.
    staged: usize,
    /// The next input was uploaded; its re-check is next.
    uploaded: bool,
    /// Outputs collected, in path order.
    collected: Vec<CollectedArtifact>,
    /// The machine was observed running right before the next download.
    observed: bool,
    /// The op the next `Step::Worker` is (set by the step, taken by
    /// `worker_sent`).
    pub(super) pending: Option<FKind>,
    /// The outstanding file op.
    pub(super) kind: Option<FKind>,
    /// Its answer, until the step reads it.
    pub(super) reply: Option<(FKind, WorkerResult)>,
    /// Staging or collection ended with this error (kept until the write
    /// that records it succeeds: nothing is resent meanwhile).
    failed: Option<Error>,
}

/// The guest-path policy of a spec (C6.2): its explicit roots for both
/// transfer directions, or the default root.
///
/// # Errors
/// `validation` (`guest_path`) for a bad root.
pub(in crate::managed::controller) fn policy_of(spec: &ExecutionSpec) -> Result<PathPolicy, Error> {
    match &spec.guest_paths {
        None => Ok(PathPolicy::default()),
        Some(g) => {
            let paths = |v: &[String]| {
                v.iter()
                    .map(|p| GuestPath::new(p))
                    .collect::<Result<Vec<_>, _>>()
            };
            let roots: Vec<GuestPath> = paths(&g.roots)?;
            PathPolicy::new(roots.clone(), roots, paths(&g.workdir_roots)?)
        }
    }
}

/// The acceptance rules of a spec's files (C5.4, C6.2, C6.4), checked
/// before anything is stored: every path valid and inside the policy
/// (inputs need upload and download approval: they are read back), sizes
/// within the profile's per-file budget, unique references, sums within the
/// aggregate, no outputs on a background command.
///
/// # Errors
/// `validation` (operation `submit`) naming the first broken rule, with
/// the limit where one applies.
pub(in crate::managed::controller) fn check_files(spec: &ExecutionSpec) -> Result<(), Error> {
    let op = Operation::Submit;
    let bad = |reason| Error::validation(op, reason);
    if spec.is_background() && !spec.outputs.is_empty() {
        return Err(bad(Reason::BackgroundOutputs));
    }
    let policy = policy_of(spec).map_err(|e| e.with_operation(op))?;
    let per_file = spec.profile.per_file_max;
    let aggregate = DEFAULT_AGGREGATE.max(per_file);
    let mut refs = std::collections::BTreeSet::new();
    let mut sum = 0u64;
    for i in &spec.inputs {
        let path = GuestPath::new(&i.path).map_err(|e| e.with_operation(op))?;
        if !policy.allows_upload(&path) {
            return Err(bad(Reason::PathOutsideUploadRoots));
        }
        if !policy.allows_download(&path) {
            return Err(bad(Reason::PathOutsideDownloadRoots));
        }
        check_identifier(&i.source).map_err(|e| e.with_operation(op))?;
        check_digest(&i.sha256).map_err(|e| e.with_operation(op))?;
        if i.size > per_file {
            return Err(bad(Reason::InputOverPerFile).with_limit(i.size, per_file));
        }
        if !refs.insert(i.source.as_str()) {
            return Err(bad(Reason::FileReferenceDuplicate));
        }
        sum = sum.saturating_add(i.size);
    }
    if sum > aggregate {
        return Err(bad(Reason::ManifestOverAggregate).with_limit(sum, aggregate));
    }
    refs.clear();
    sum = 0;
    for o in &spec.outputs {
        let path = GuestPath::new(&o.path).map_err(|e| e.with_operation(op))?;
        if !policy.allows_download(&path) {
            return Err(bad(Reason::PathOutsideDownloadRoots));
        }
        check_identifier(&o.destination).map_err(|e| e.with_operation(op))?;
        if !(1..=per_file).contains(&o.max_size) {
            return Err(bad(Reason::OutputMaxRange).with_limit(o.max_size, per_file));
        }
        if !refs.insert(o.destination.as_str()) {
            return Err(bad(Reason::FileReferenceDuplicate));
        }
        sum = sum.saturating_add(o.max_size);
    }
    if sum > aggregate {
        return Err(bad(Reason::ManifestOverAggregate).with_limit(sum, aggregate));
    }
    Ok(())
}

impl Exec {
    /// The worker, its admitted profile and the machine the files go to.
    fn file_target(&self, cfg: &ControllerConfig) -> Option<(String, Box<Profile>, MachineName)> {
        let (worker, name) = match (&self.rec.spec.worker_machine, &self.rec.assignment) {
            (Some(w), _) => (w.worker_id.clone(), w.name.clone()),
            (None, Some(a)) => (a.worker_id.clone(), a.machine_name.clone()),
            // A retained machine's command: the machine its slot is on.
            (None, None) => self.target.clone()?,
        };
        let profile = cfg
            .workers
            .iter()
            .find(|w| w.id == worker)?
            .profile
            .clone()?;
        Some((worker, profile, MachineName::new(&name).ok()?))
    }

    /// True for a machine this runtime owns (disposable or retained), as
    /// opposed to a caller-named one whose identity it never recorded.
    fn owned_machine(&self) -> bool {
        self.rec.spec.worker_machine.is_none()
    }

    /// The recorded incarnation of the owned machine: the execution's own
    /// creation evidence (disposable) or its retained machine's.
    fn owned_incarnation(&self) -> Option<String> {
        match &self.rec.creation {
            Some(c) => Some(c.incarnation.clone()),
            None => self.target_incarnation.clone(),
        }
    }

    /// A `preparing` record with inputs whose `preparing` this process did
    /// not write (it was resumed from the store): another controller may
    /// have sent its uploads, so none is sent again (sim finding 10).
    pub(super) fn staging_unowned(&self, cfg: &ControllerConfig) -> bool {
        #[cfg(feature = "testkit")]
        if cfg.planted == Some(super::super::Planted::RestageResumedPreparing) {
            return false;
        }
        #[cfg(not(feature = "testkit"))]
        let _ = cfg;
        !self.rec.spec.inputs.is_empty() && !self.preparing_mine
    }

    fn file_op(&mut self, kind: FKind, op: WorkerOp) -> Step {
        self.files.pending = Some(kind);
        Step::Worker(op)
    }

    /// The next staging step in `preparing`: `Ok(Some(step))` while inputs
    /// are being staged (a file op, or waiting for its answer), `Ok(None)`
    /// once every input is staged and verified (or none is declared), `Err`
    /// when staging failed (the preparation fails with it).
    pub(super) fn stage_inputs(
        &mut self,
        cfg: &ControllerConfig,
        now: Instant,
        now_ms: u64,
    ) -> Result<Option<Step>, Error> {
        if let Some(e) = &self.files.failed {
            return Err(*e);
        }
        if self.files.kind.is_some() {
            return Ok(Some(Step::Wait));
        }
        if let Some((kind, result)) = self.files.reply.take() {
            let Some(input) = self.rec.spec.inputs.get(self.files.staged).cloned() else {
                return Err(
                    self.file_failed(Error::protocol(Operation::Upload, Reason::UnexpectedReply))
                );
            };
            let mismatch = |op| Error::protocol(op, Reason::StagedInputMismatch);
            match (kind, result) {
                (FKind::Upload, Ok(WorkerReply::Uploaded { size })) if size == input.size => {
                    self.files.uploaded = true;
                }
                (FKind::Recheck, Ok(WorkerReply::Downloaded { size, sha256 }))
                    if size == input.size && sha256 == input.sha256 =>
                {
                    self.files.staged += 1;
                    self.files.uploaded = false;
                }
                (FKind::Upload, Ok(_)) => return Err(self.file_failed(mismatch(Operation::Upload))),
                (_, Ok(_)) => return Err(self.file_failed(mismatch(Operation::Download))),
                (_, Err(e)) => return Err(self.file_failed(e)),
            }
        }
        let Some(input) = self.rec.spec.inputs.get(self.files.staged).cloned() else {
            return Ok(None);
        };
        if self.past(Deadline::Preparation, now, now_ms) {
            return Err(self.file_failed(Error::expired(
                Operation::Submit,
                Evidence::NotDispatched,
                Reason::PreparationDeadline,
            )));
        }
        if !self.claim_ok(cfg, now, now_ms) {
            // Each transfer goes out under a live, fresh claim.
            return Ok(Some(self.claim_op(cfg, now_ms)));
        }
        let op = match self.stage_op(cfg, &input) {
            Ok(op) => op,
            Err(e) => return Err(self.file_failed(e)),
        };
        let kind = if self.files.uploaded {
            FKind::Recheck
        } else {
            FKind::Upload
        };
        Ok(Some(self.file_op(kind, op)))
    }

    fn stage_op(&self, cfg: &ControllerConfig, input: &InputFile) -> Result<WorkerOp, Error> {
        let no_target = || Error::unsupported_capability(Operation::Upload, Reason::FileTransfer);
        let (worker_id, profile, name) = self.file_target(cfg).ok_or_else(no_target)?;
        let policy = Box::new(policy_of(&self.rec.spec)?);
        let path = GuestPath::new(&input.path)?;
        let per_file = self.rec.spec.profile.per_file_max;
        Ok(if self.files.uploaded {
            WorkerOp::Download {
                worker_id,
                profile,
                name,
                policy,
                path,
                max_bytes: input.size.max(1),
                per_file,
                store: None,
            }
        } else {
            WorkerOp::Upload {
                worker_id,
                profile,
                name,
                policy,
                path,
                scope: self.rec.key.scope.clone(),
                source: input.source.clone(),
                sha256: input.sha256.clone(),
                size: input.size,
                per_file,
            }
        })
    }

    fn file_failed(&mut self, e: Error) -> Error {
        self.files.failed = Some(e);
        e
    }

    /// The next collection step in `collecting`: `Some(step)` while outputs
    /// are being collected, `None` when collection is over (every output
    /// stored, or a failure recorded in `files.failed`): the completion
    /// write comes next.
    pub(super) fn collect_outputs(
        &mut self,
        cfg: &ControllerConfig,
        now: Instant,
        now_ms: u64,
    ) -> Option<Step> {
        if self.rec.spec.outputs.is_empty() || self.files.failed.is_some() {
            return None;
        }
        if self.files.kind.is_some() {
            return Some(self.renew_or_wait(cfg, now, now_ms));
        }
        if let Some((kind, result)) = self.files.reply.take() {
            let next = self
                .rec
                .spec
                .outputs
                .get(self.files.collected.len())
                .cloned();
            let failure = match (kind, result, next) {
                (FKind::Observe, Ok(WorkerReply::Machine(obs)), _)
                    if obs.state == MachineState::Running
                        && self.owned_incarnation() == Some(incarnation_token(&obs)) =>
                {
                    self.files.observed = true;
                    None
                }
                (FKind::Observe, Ok(_), _) => Some(Error::unknown(
                    Operation::Download,
                    Evidence::NotDispatched,
                    Reason::MachineNotRunning,
                )),
                (FKind::Collect, Ok(WorkerReply::Downloaded { size, sha256 }), Some(out))
                    if size <= out.max_size =>
                {
                    self.files.collected.push(CollectedArtifact {
                        path: out.path,
                        destination: out.destination,
                        size,
                        sha256,
                    });
                    self.files.observed = false;
                    None
                }
                (_, Ok(_), _) => Some(Error::protocol(
                    Operation::Download,
                    Reason::UnexpectedReply,
                )),
                (_, Err(e), _) => Some(e),
            };
            if let Some(e) = failure {
                self.files.failed = Some(e);
                return None;
            }
        }
        let out = self
            .rec
            .spec
            .outputs
            .get(self.files.collected.len())?
            .clone();
        if self.past(Deadline::Collection, now, now_ms) {
            self.files.failed = Some(Error::expired(
                Operation::Download,
                Evidence::NotDispatched,
                Reason::CollectionDeadline,
            ));
            return None;
        }
        if !self.claim_ok(cfg, now, now_ms) {
            return Some(self.claim_op(cfg, now_ms));
        }
        let Some((worker_id, profile, name)) = self.file_target(cfg) else {
            self.files.failed = Some(Error::unsupported_capability(
                Operation::Download,
                Reason::FileTransfer,
            ));
            return None;
        };
        if self.owned_machine() && !self.files.observed {
            // C6.4: the owned machine (disposable or retained) is
            // re-observed running (the recorded incarnation) before each
            // output download.
            return Some(self.file_op(
                FKind::Observe,
                WorkerOp::Inspect {
                    worker_id,
                    profile,
                    name,
                },
            ));
        }
        let op = policy_of(&self.rec.spec).and_then(|policy| {
            Ok(WorkerOp::Download {
                worker_id,
                profile,
                name,
                policy: Box::new(policy),
                path: GuestPath::new(&out.path)?,
                max_bytes: out.max_size,
                per_file: self.rec.spec.profile.per_file_max,
                store: Some((self.rec.key.clone(), out.destination.clone())),
            })
        });
        match op {
            Ok(op) => Some(self.file_op(FKind::Collect, op)),
            Err(e) => {
                self.files.failed = Some(e);
                None
            }
        }
    }

    /// The write that ends `collecting`: `completed` with every output's
    /// size and digest, or `collection_failed` (collection `partial` when
    /// some outputs were stored, else `failed`) with the exit kept and the
    /// failure as the last error.
    pub(super) fn completion_patch(&mut self, now_ms: u64) -> ExecPatch {
        let failed = self.files.failed;
        let collected = self.files.collected.clone();
        let (state, collection) = match &failed {
            None => (ExecState::Completed, Collection::Complete),
            Some(_) if collected.is_empty() => (ExecState::CollectionFailed, Collection::Failed),
            Some(_) => (ExecState::CollectionFailed, Collection::Partial),
        };
        if let Some(e) = &failed
            && self.exec_error.is_none()
        {
            self.exec_error = Some(*e);
        }
        ExecPatch {
            state: Some(state),
            collection: Some(collection),
            artifacts: (!collected.is_empty()).then_some(collected),
            cleanup: Some(self.end_cleanup()),
            next_due_at_ms: Some(self.end_due(now_ms)),
            last_error: failed.as_ref().map(|e| ErrorEntry::from_error(e, now_ms)),
            ..ExecPatch::default()
        }
    }
}
