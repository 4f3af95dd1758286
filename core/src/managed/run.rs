//! One buffered command execution, recorded durably (DESIGN.md §5, C13,
//! C16, C17.1): the first, single-execution slice.
//!
//! **Superseded by [`super::controller::Controller`]**, which the shells'
//! `Runtime` drive; this module stays only until the recovery simulation
//! (`tests/src/sim`) moves to the controller. It does not renew claims or
//! read cancel requests; do not build on it.
//!
//! [`Run`] asks for store operations and for one dispatch; it never performs
//! them. The drain order after every input is [`Run::poll_store_op`], then
//! [`Run::poll_dispatch`], then [`Run::outcome`]:
//!
//! - inputs: [`Run::handle_stored`] (the answer to the last [`StoreOp`]) and
//!   [`Run::handle_exec_result`] (the answer to the [`Dispatch`]);
//! - outputs: at most one [`StoreOp`] or one [`Dispatch`] is outstanding at a
//!   time; once [`Run::outcome`] returns `Some`, the run is finished and
//!   every later input is ignored (the outcome is sticky).
//!
//! The path of a fresh run: accept (`accepted`) → claim → `preparing` →
//! `ready` → claim again (C15: refreshed immediately before the intent) →
//! `dispatching` (the intent is durable before any byte is sent) →
//! [`Dispatch`] → `collecting` + `completed` with evidence `exited`, or
//! `unknown` with evidence `dispatch_uncertain` when the exec failed. A store
//! failure ends the run with that error, its evidence set to what is known
//! about the command; it is never read as absence, and nothing is ever sent
//! twice. A record found at or after `dispatching` that this run did not
//! dispatch is decided by [`recover`] and never re-dispatched.
//!
//! The state table, the evidence coupling and the write-once rules are not
//! repeated here: every write is an [`ExecPatch`] the store applies with
//! [`super::patch::apply_exec`].

use std::collections::BTreeMap;

use base64::Engine as _;

use super::claim::Guard;
use super::patch::ExecPatch;
use super::record::{ErrorEntry, ExecResult, ExecutionRecord};
use super::spec::{
    Action, CommandSpec, DEFAULT_QUEUE_BUDGET_MS, DEFAULT_RETENTION_MS, ExecutionSpec,
};
use super::state::{Cleanup, Collection, ExecState, RecordEvidence};
use super::{FingerprintKey, RecordKey, fingerprint};
use crate::exec::{Command, ExecOutcome, ExecOutput};
use crate::{Error, Evidence, Operation};

/// Default claim TTL of a run, in milliseconds.
pub const DEFAULT_CLAIM_TTL_MS: u64 = 60_000;
/// Default pending limit passed to `accept`.
pub const DEFAULT_MAX_PENDING: u32 = 1_000;

/// Who runs, and with which store limits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunConfig {
    /// Controller identifier that claims the record (an identifier, C0.1).
    pub owner: String,
    /// Claim TTL in milliseconds (1–900,000).
    pub claim_ttl_ms: u64,
    /// `max_pending` of `accept` (1–10,000).
    pub max_pending: u32,
}

impl RunConfig {
    /// Defaults for `owner`.
    pub fn new(owner: &str) -> Self {
        Self {
            owner: owner.to_owned(),
            claim_ttl_ms: DEFAULT_CLAIM_TTL_MS,
            max_pending: DEFAULT_MAX_PENDING,
        }
    }
}

/// The artifact and profile a run's spec names: the controller's type.
pub use super::controller::RunTarget;

/// The stored spec of `command` on `target` (argv, env, workdir, stdin and
/// timeout; the store seals them). The guest user is not part of the spec.
///
/// # Errors
/// `validation` when the spec breaks a stored-shape rule (empty argv).
pub fn spec_for(command: &Command, target: &RunTarget) -> Result<ExecutionSpec, Error> {
    let env: BTreeMap<String, String> = command.env_pairs().iter().cloned().collect();
    let spec = ExecutionSpec {
        artifact: target.artifact.clone(),
        profile: target.profile.clone(),
        action: Action::Command(CommandSpec {
            argv: command.argv().to_vec(),
            env,
            workdir: Some(command.working_dir().to_owned()),
            stdin_b64: command
                .stdin_text()
                .map(|s| base64::engine::general_purpose::STANDARD.encode(s)),
            timeout_s: command.effective_timeout_secs().map(u64::from),
            background: command.is_background(),
            user: None,
        }),
        machine: None,
        worker_machine: None,
        inputs: Vec::new(),
        outputs: Vec::new(),
        queue_budget_ms: DEFAULT_QUEUE_BUDGET_MS,
        retention_ms: DEFAULT_RETENTION_MS,
        metadata: BTreeMap::new(),
        network: None,
        guest_paths: None,
    };
    spec.validate()?;
    Ok(spec)
}

/// A store operation the shell performs and answers with
/// [`Run::handle_stored`] (passing the stored record, or the error).
#[derive(Clone, Debug, PartialEq, Eq)]
#[allow(clippy::large_enum_variant)] // one op is outstanding at a time
pub enum StoreOp {
    /// `Store::accept(record, max_pending)`; answer with the inserted or
    /// existing record.
    Accept {
        /// The fresh `accepted` record.
        record: Box<ExecutionRecord>,
        /// Pending limit.
        max_pending: u32,
    },
    /// `Store::claim(key, owner, now_ms, ttl_ms)`.
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
    /// `Store::write(key, guard, patch, now_ms)`.
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
}

/// Send the command now: the `dispatching` intent is durable. Answer with
/// [`Run::handle_exec_result`]. Emitted at most once per [`Run`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dispatch;

/// How a finished run ended. Output is held in memory only, never stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunOutcome {
    /// The record as last stored.
    pub record: ExecutionRecord,
    /// The command's output when this run observed its exit.
    pub output: Option<ExecOutput>,
    /// The exec or preparation error this run saw, as reported.
    pub error: Option<Error>,
    /// True when this run sent the command.
    pub dispatched: bool,
}

impl RunOutcome {
    /// The stored exit code, if an exit was observed (by any run).
    pub fn exit_code(&self) -> Option<i32> {
        match self.record.result {
            Some(ExecResult::Exited { exit_code, .. }) => Some(exit_code),
            _ => None,
        }
    }
}

/// What a stored record needs when a controller finds it (C17.1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Recovery {
    /// Nothing: terminal, `unknown` or `cancelling` records stay as stored.
    Keep,
    /// Not yet dispatched (`accepted`, `preparing`, `ready`): it may be
    /// dispatched once, by a run holding the same command.
    MayDispatch,
    /// Dispatched (or possibly) with no saved exit: write this patch
    /// (`unknown`); never re-send.
    MarkUnknown(ExecPatch),
    /// Exit saved, collection pending: write this patch (`completed`).
    Complete(ExecPatch),
}

/// The recovery decision for a stored record (C17.1): a record in
/// `dispatching` or `running` without a saved exit becomes `unknown` and is
/// never resent; `ready` (and earlier) may dispatch once.
pub fn recover(rec: &ExecutionRecord) -> Recovery {
    match rec.state {
        ExecState::Accepted | ExecState::Preparing | ExecState::Ready => Recovery::MayDispatch,
        ExecState::Dispatching | ExecState::Running => Recovery::MarkUnknown(ExecPatch {
            state: Some(ExecState::Unknown),
            next_due_at_ms: Some(None),
            ..ExecPatch::default()
        }),
        ExecState::Collecting => Recovery::Complete(complete_patch()),
        _ => Recovery::Keep,
    }
}

fn complete_patch() -> ExecPatch {
    ExecPatch {
        state: Some(ExecState::Completed),
        collection: Some(Collection::Complete),
        cleanup: Some(Cleanup::Complete),
        next_due_at_ms: Some(None),
        ..ExecPatch::default()
    }
}

/// What the run is waiting for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Wait {
    /// A store answer.
    Store,
    /// The exec result.
    Exec,
    /// Nothing: finished.
    Done,
}

/// One buffered command execution through the store (see the module docs
/// for the inputs, outputs and drain order).
#[derive(Debug)]
pub struct Run {
    config: RunConfig,
    key: RecordKey,
    command: Option<Command>,
    record: Option<ExecutionRecord>,
    op: Option<StoreOp>,
    dispatch: Option<Dispatch>,
    wait: Wait,
    now_ms: u64,
    /// The last store answer was a claim (a fresh claim for the intent).
    fresh_claim: bool,
    /// Any claim was taken by this run.
    claimed: bool,
    /// This run wrote the `dispatching` intent.
    intent_written: bool,
    dispatched: bool,
    exec_error: Option<Error>,
    output: Option<ExecOutput>,
    outcome: Option<Result<RunOutcome, Error>>,
}

impl Run {
    /// A run of `command` under `key`: builds the spec and fingerprint and
    /// asks to accept the record (an existing record with the same
    /// fingerprint is continued, never re-dispatched once dispatched).
    ///
    /// # Errors
    /// `validation` for a bad key, spec or time (nothing is stored).
    pub fn new(
        key: RecordKey,
        command: Command,
        target: &RunTarget,
        fingerprint_key: &FingerprintKey,
        config: RunConfig,
        now_ms: u64,
    ) -> Result<Self, Error> {
        let spec = spec_for(&command, target)?;
        let fp = fingerprint::exec_fingerprint(fingerprint_key, &spec);
        let record = ExecutionRecord::accepted(key.clone(), fp, spec, now_ms)?;
        let mut run = Self::empty(key, Some(command), config, now_ms);
        run.op = Some(StoreOp::Accept {
            record: Box::new(record),
            max_pending: run.config.max_pending,
        });
        Ok(run)
    }

    /// A run over a record found in the store (recovery, C17.1): applies
    /// [`recover`] and never dispatches (there is no command).
    pub fn resume(record: ExecutionRecord, config: RunConfig, now_ms: u64) -> Self {
        let mut run = Self::empty(record.key.clone(), None, config, now_ms);
        run.record = Some(record);
        run.advance();
        run
    }

    fn empty(key: RecordKey, command: Option<Command>, config: RunConfig, now_ms: u64) -> Self {
        Self {
            config,
            key,
            command,
            record: None,
            op: None,
            dispatch: None,
            wait: Wait::Store,
            now_ms,
            fresh_claim: false,
            claimed: false,
            intent_written: false,
            dispatched: false,
            exec_error: None,
            output: None,
            outcome: None,
        }
    }

    /// The record key.
    pub fn key(&self) -> &RecordKey {
        &self.key
    }

    /// The next store operation, once.
    pub fn poll_store_op(&mut self) -> Option<StoreOp> {
        self.op.take()
    }

    /// The dispatch command, once.
    pub fn poll_dispatch(&mut self) -> Option<Dispatch> {
        self.dispatch.take()
    }

    /// The outcome once finished: `Ok` when the store holds the final
    /// record, `Err` when a store operation failed (its evidence says what is
    /// known about the command).
    pub fn outcome(&self) -> Option<&Result<RunOutcome, Error>> {
        self.outcome.as_ref()
    }

    /// Takes the outcome once finished.
    pub fn take_outcome(&mut self) -> Option<Result<RunOutcome, Error>> {
        self.outcome.take()
    }

    /// The answer to the last [`StoreOp`] at wall-clock `now_ms`.
    pub fn handle_stored(&mut self, now_ms: u64, result: Result<ExecutionRecord, Error>) {
        if self.wait != Wait::Store {
            return;
        }
        self.now_ms = self.now_ms.max(now_ms);
        match result {
            Err(e) => self.fail(e),
            Ok(rec) if rec.key != self.key => {
                self.fail(Error::protocol(
                    Operation::StoreFetch,
                    "record_key_mismatch",
                ));
            }
            Ok(rec) => {
                self.record = Some(rec);
                self.advance();
            }
        }
    }

    /// The answer to [`Dispatch`] at wall-clock `now_ms`: the buffered exec
    /// outcome, or the exec error.
    pub fn handle_exec_result(&mut self, now_ms: u64, result: Result<ExecOutcome, Error>) {
        if self.wait != Wait::Exec {
            return;
        }
        self.now_ms = self.now_ms.max(now_ms);
        self.wait = Wait::Store;
        let exit = match result {
            Ok(ExecOutcome::Exited(out)) => {
                let r = ExecResult::Exited {
                    exit_code: out.exit_code,
                    output_bytes: (out.stdout.len() + out.stderr.len()) as u64,
                    truncated: false,
                };
                self.output = Some(out);
                Some(r)
            }
            Ok(ExecOutcome::Launched(_)) => {
                // Refused before dispatch (see `advance`); a launch reply to
                // a foreground command is a contract violation: unknown.
                self.exec_error = Some(Error::protocol(Operation::Exec, "unexpected_launch"));
                None
            }
            Err(e) => {
                let r = match (e.evidence(), e.exit_code()) {
                    (Evidence::Exited, Some(code)) => Some(ExecResult::Exited {
                        exit_code: code,
                        output_bytes: 0,
                        truncated: true,
                    }),
                    _ => None,
                };
                self.exec_error = Some(e);
                r
            }
        };
        let last_error = self
            .exec_error
            .as_ref()
            .map(|e| ErrorEntry::from_error(e, self.now_ms));
        let patch = match exit {
            Some(result) => ExecPatch {
                state: Some(ExecState::Collecting),
                evidence: Some(RecordEvidence::Exited),
                result: Some(result),
                last_error,
                ..ExecPatch::default()
            },
            None => ExecPatch {
                state: Some(ExecState::Unknown),
                evidence: Some(RecordEvidence::DispatchUncertain),
                next_due_at_ms: Some(None),
                last_error,
                ..ExecPatch::default()
            },
        };
        self.write(patch);
    }

    /// Decides the next step from the last stored record.
    fn advance(&mut self) {
        let Some(rec) = &self.record else {
            return;
        };
        let state = rec.state;
        match state {
            ExecState::Accepted | ExecState::Preparing | ExecState::Ready
                if self.command.is_none() =>
            {
                self.finish();
            }
            _ if !self.claimed && needs_write(rec) => self.claim(),
            ExecState::Accepted => self.write(ExecPatch {
                state: Some(ExecState::Preparing),
                ..ExecPatch::default()
            }),
            ExecState::Preparing => match self.prepare() {
                Ok(()) => self.write(ExecPatch {
                    state: Some(ExecState::Ready),
                    ..ExecPatch::default()
                }),
                Err(e) => {
                    let entry = ErrorEntry::from_error(&e, self.now_ms);
                    self.exec_error = Some(e);
                    self.write(ExecPatch {
                        state: Some(ExecState::Failed),
                        next_due_at_ms: Some(None),
                        cleanup: Some(Cleanup::Complete),
                        last_error: Some(entry),
                        ..ExecPatch::default()
                    });
                }
            },
            ExecState::Ready if !self.fresh_claim => self.claim(),
            ExecState::Ready => {
                self.intent_written = true;
                self.write(ExecPatch {
                    state: Some(ExecState::Dispatching),
                    evidence: Some(RecordEvidence::DispatchUncertain),
                    ..ExecPatch::default()
                });
            }
            ExecState::Dispatching if self.intent_written && !self.dispatched => {
                self.dispatched = true;
                self.wait = Wait::Exec;
                self.dispatch = Some(Dispatch);
            }
            _ => match recover(rec) {
                Recovery::MarkUnknown(p) | Recovery::Complete(p) => self.write(p),
                Recovery::Keep | Recovery::MayDispatch => self.finish(),
            },
        }
    }

    /// Pure pre-dispatch checks: the command's own rules; background
    /// launches are not part of this slice.
    fn prepare(&self) -> Result<(), Error> {
        let Some(cmd) = &self.command else {
            return Err(Error::validation(Operation::CommandSpec, "no_command"));
        };
        cmd.validate()?;
        if cmd.is_background() {
            return Err(Error::validation(
                Operation::CommandSpec,
                "background_unsupported",
            ));
        }
        Ok(())
    }

    fn claim(&mut self) {
        self.claimed = true;
        self.fresh_claim = true;
        self.wait = Wait::Store;
        self.op = Some(StoreOp::Claim {
            key: self.key.clone(),
            owner: self.config.owner.clone(),
            now_ms: self.write_time(),
            ttl_ms: self.config.claim_ttl_ms,
        });
    }

    fn write(&mut self, patch: ExecPatch) {
        let Some(rec) = &self.record else {
            return;
        };
        let guard = Guard::for_exec(rec, &self.config.owner);
        self.fresh_claim = false;
        self.wait = Wait::Store;
        self.op = Some(StoreOp::Write {
            key: self.key.clone(),
            guard,
            patch,
            now_ms: self.write_time(),
        });
    }

    /// `now` never before the record's `updated_at` (C13.3).
    fn write_time(&self) -> u64 {
        self.record
            .as_ref()
            .map_or(self.now_ms, |r| self.now_ms.max(r.updated_at_ms))
    }

    fn finish(&mut self) {
        let Some(record) = self.record.clone() else {
            return;
        };
        self.wait = Wait::Done;
        self.outcome = Some(Ok(RunOutcome {
            record,
            output: self.output.take(),
            error: self.exec_error.take(),
            dispatched: self.dispatched,
        }));
    }

    /// A store failure ends the run; its evidence is what is known about
    /// the command, never `not_dispatched` once it was sent.
    fn fail(&mut self, e: Error) {
        self.wait = Wait::Done;
        self.op = None;
        let e = if self.dispatched {
            match (&self.output, &self.exec_error) {
                (Some(out), _) => e
                    .with_evidence(Evidence::Exited)
                    .with_exit_code(out.exit_code),
                (None, Some(x)) => {
                    let e = e.with_evidence(x.evidence());
                    match x.exit_code() {
                        Some(c) => e.with_exit_code(c),
                        None => e,
                    }
                }
                (None, None) => e.with_evidence(Evidence::DispatchUncertain),
            }
        } else {
            match &self.record {
                Some(r) if !r.state.is_before_dispatch() => {
                    e.with_evidence(r.evidence.to_error_evidence())
                }
                _ => e.with_evidence(Evidence::NotDispatched),
            }
        };
        self.outcome = Some(Err(e));
    }
}

/// True when [`Run::advance`] would write this record.
fn needs_write(rec: &ExecutionRecord) -> bool {
    !matches!(recover(rec), Recovery::Keep)
}

#[cfg(test)]
#[path = "run_tests.rs"]
mod tests;
