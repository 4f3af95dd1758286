//! The managed layer over a [`Store`]: runs one buffered command and records
//! it durably (DESIGN.md §5). A thin loop over
//! [`smolbox_core::managed::run::Run`]: it performs the store operations and
//! the one dispatch the core asks for, and makes no decision of its own.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use smolbox_core::exec::Command;
use smolbox_core::managed::run::{Run, RunConfig, RunOutcome, RunTarget, StoreOp};
use smolbox_core::managed::{ExecutionRecord, FingerprintKey, RecordKey};
use smolbox_core::{Category, Error, Evidence, Operation};
use smolbox_store::Store;

use crate::Client;

/// Runs commands through a client and records each in a durable store.
pub struct Runtime {
    client: Client,
    store: Arc<dyn Store>,
    fingerprint_key: FingerprintKey,
    config: RunConfig,
    target: RunTarget,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("owner", &self.config.owner)
            .finish_non_exhaustive()
    }
}

impl Runtime {
    /// A runtime for controller `owner` (an identifier) over `store`, with
    /// the caller's fingerprint key. The target is
    /// [`RunTarget::unverified`] until [`Runtime::with_target`].
    ///
    /// # Errors
    /// `validation` when the store is not durable (the in-memory store is
    /// refused) or `owner` is not an identifier.
    pub fn new(
        client: Client,
        store: Arc<dyn Store>,
        fingerprint_key: FingerprintKey,
        owner: &str,
    ) -> Result<Self, Error> {
        smolbox_core::managed::check_identifier(owner)
            .map_err(|e| e.with_operation(Operation::Config))?;
        if !store.info().durable {
            return Err(Error::validation(Operation::Config, "store_not_durable"));
        }
        Ok(Self {
            client,
            store,
            fingerprint_key,
            config: RunConfig::new(owner),
            target: RunTarget::unverified(),
        })
    }

    /// Replaces the artifact and profile recorded in each spec.
    #[must_use]
    pub fn with_target(mut self, target: RunTarget) -> Self {
        self.target = target;
        self
    }

    /// The client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Runs `command` on worker machine `machine` under record `key`: the
    /// record is accepted, prepared, its `dispatching` intent made durable,
    /// the command sent once, and the outcome stored (`completed` with the
    /// exit, or `unknown` when the request may have reached the worker). A
    /// key whose record was already dispatched is never sent again.
    ///
    /// # Errors
    /// A store failure, with evidence saying what is known about the
    /// command (`not_dispatched` when nothing was sent); `validation` for
    /// a bad key or command.
    pub fn run(
        &self,
        machine: &str,
        command: &Command,
        key: &RecordKey,
    ) -> Result<RunOutcome, Error> {
        let mut run = Run::new(
            key.clone(),
            command.clone(),
            &self.target,
            &self.fingerprint_key,
            self.config.clone(),
            now_ms(),
        )?;
        self.drive(&mut run, Some((machine, command)))
    }

    /// Recovers record `key` after a crash (C17.1): a record that may have
    /// been dispatched and has no saved exit becomes `unknown`; nothing is
    /// sent. A record not yet dispatched is returned as stored (run it again
    /// with the same command and key to dispatch it once).
    ///
    /// # Errors
    /// A store failure (never read as absence); `not_found` only when the
    /// store positively reports no such record.
    pub fn recover(&self, key: &RecordKey) -> Result<RunOutcome, Error> {
        let record = self.store.fetch(key)?;
        let mut run = Run::resume(record, self.config.clone(), now_ms());
        self.drive(&mut run, None)
    }

    fn drive(&self, run: &mut Run, exec: Option<(&str, &Command)>) -> Result<RunOutcome, Error> {
        loop {
            if let Some(op) = run.poll_store_op() {
                let result = apply_op(self.store.as_ref(), op);
                run.handle_stored(now_ms(), result);
            } else if run.poll_dispatch().is_some() {
                let result = match exec {
                    Some((machine, command)) => self.client.exec(machine, command),
                    None => Err(Error::validation(Operation::Recover, "no_command")),
                };
                run.handle_exec_result(now_ms(), result);
            } else {
                break;
            }
        }
        run.take_outcome().unwrap_or_else(|| {
            Err(
                Error::new(Category::Unknown, Operation::Submit, Evidence::Unknown)
                    .with_reason("run_stalled"),
            )
        })
    }
}

/// Performs one core store operation on `store`.
///
/// # Errors
/// The store's error, unchanged.
pub fn apply_op(store: &dyn Store, op: StoreOp) -> Result<ExecutionRecord, Error> {
    match op {
        StoreOp::Accept {
            record,
            max_pending,
        } => store
            .accept(&record, max_pending)
            .map(smolbox_store::Accepted::into_record),
        StoreOp::Claim {
            key,
            owner,
            now_ms,
            ttl_ms,
        } => store.claim(&key, &owner, now_ms, ttl_ms),
        StoreOp::Write {
            key,
            guard,
            patch,
            now_ms,
        } => store.write(&key, &guard, &patch, now_ms),
    }
}

/// Wall-clock milliseconds (the core clamps them to never go back).
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

pub use smolbox_store::keys::{key_file, load_or_create_keys};
