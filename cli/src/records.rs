//! The durable records of `run`, and the commands over them (`records`,
//! `wait`, `cancel`, `recover`).
//!
//! A buffered run goes through the managed runtime (DESIGN.md §5a) over
//! the embedded SQLite store — the record is accepted, its `dispatching`
//! intent made durable before the command is sent, its claim renewed while
//! the command runs, and the observed exit (or `unknown`) stored
//! afterwards. Each process is its own controller (a unique owner id), so
//! two `smolbox` processes fence each other. What a record shows is its
//! state, evidence, exit code, times, worker, machine and last error; the
//! command's argv, env and stdin are sealed in the store and never printed,
//! and its output is never stored.

use smolbox_core::Reason;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde_json::json;
use smolbox_core::exec::{Command, ExecEvent};
use smolbox_core::managed::controller::Resolution;
use smolbox_core::managed::controller::{
    Controller, ControllerConfig, ControllerEvent, Outcome, RunTarget, Submit, WorkerEntry,
    spec_for,
};
use smolbox_core::managed::fingerprint::exec_fingerprint;
use smolbox_core::managed::record::ExecResult;
use smolbox_core::managed::spec::ManagedTerminalSpec;
use smolbox_core::managed::state::MachineOperation;
use smolbox_core::managed::{
    ExecState, ExecutionRecord, FingerprintKey, MachineRecord, RecordEvidence, RecordKey,
    RetainedMachineSpec,
};
use smolbox_core::worker::Profile;
use smolbox_core::{Category, Error, Evidence, Operation};
use smolbox_store::artifacts::DirArtifacts;
use smolbox_store::keys::load_or_create_keys;
use smolbox_store::{
    DEFAULT_LIST_PAGE, PostgresOptions, PostgresStore, Sealer, SqliteStore, Store, apply_op,
};

use crate::backend::Backend;
use crate::report::{self, Failure};

/// Scope of the records the command writes (and the sealing partition).
pub(crate) const SCOPE: &str = "cli";

/// `SMOLBOX_LEASE_TTL_MS`, read once by `main`.
static LEASE_TTL_MS: std::sync::OnceLock<u64> = std::sync::OnceLock::new();

/// The claim/lease TTL range of C12.1, ms.
const LEASE_TTL_RANGE: (u64, u64) = (1_000, 900_000);

/// The claim/lease TTL of the command's controllers unless
/// `SMOLBOX_LEASE_TTL_MS` says otherwise: C12.1's 30 s. A `smolbox`
/// process is a short-lived controller, but a graceful end releases what
/// it holds (the runtime's shutdown its execution and machine claims and
/// worker leases, a managed terminal its record and machine claims once
/// settled), so the next command on the same machine takes over at once;
/// only a killed `smolbox` leaves its claims for the TTL. Renewals come
/// every TTL/3 (10 s), leaving 20 s for a slow store write.
const DEFAULT_LEASE_TTL_MS: u64 = 30_000;

/// Reads `SMOLBOX_LEASE_TTL_MS` (for tests; undocumented in `--help`, see
/// docs/decisions.md "CLI: managed machines"): the claim and lease TTL of
/// this process's controllers, 1,000–900,000 ms (C12.1; the runtime
/// builders also check ≥ 4 × the poll interval). Unset or empty: the
/// CLI's default ([`DEFAULT_LEASE_TTL_MS`]).
///
/// # Errors
/// `validation` (`lease_ttl_out_of_range`, with the limit) for anything
/// else: nothing is sent.
pub(crate) fn lease_ttl_from_env() -> Result<(), Failure> {
    let Some(raw) = std::env::var_os("SMOLBOX_LEASE_TTL_MS").filter(|v| !v.is_empty()) else {
        return Ok(());
    };
    let bad = |actual: u64| {
        Failure::Core(
            Error::validation(Operation::Config, Reason::LeaseTtlOutOfRange)
                .with_limit(actual, LEASE_TTL_RANGE.1),
        )
    };
    let ms: u64 = raw
        .to_str()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad(0))?;
    if !(LEASE_TTL_RANGE.0..=LEASE_TTL_RANGE.1).contains(&ms) {
        return Err(bad(ms));
    }
    let _ = LEASE_TTL_MS.set(ms);
    Ok(())
}

/// The TTL of this process's controllers: `SMOLBOX_LEASE_TTL_MS`, else
/// [`DEFAULT_LEASE_TTL_MS`].
pub(crate) fn lease_ttl_ms() -> Option<u64> {
    Some(LEASE_TTL_MS.get().copied().unwrap_or(DEFAULT_LEASE_TTL_MS))
}

/// Exit code of an execution that ended without running (cancelled,
/// expired, failed before dispatch): "refused".
pub(crate) const EXIT_NOT_RUN: i32 = 8;

/// Where the store lives: `explicit`, else `$XDG_DATA_HOME/smolbox`, else
/// `$HOME/.local/share/smolbox`, as `smolbox.db`.
pub(crate) fn store_path(explicit: Option<&Path>) -> Result<PathBuf, Failure> {
    if let Some(p) = explicit {
        return Ok(p.to_path_buf());
    }
    let base = std::env::var_os("XDG_DATA_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))
        .ok_or_else(|| {
            Failure::local(
                "find a data directory (set HOME or --store)",
                &std::io::Error::from(std::io::ErrorKind::NotFound),
            )
        })?;
    Ok(base.join("smolbox").join("smolbox.db"))
}

/// The opened store and the host's fingerprint key.
pub(crate) struct Opened {
    /// The store.
    pub(crate) store: Arc<dyn Store>,
    /// The fingerprint key (distinct from the sealing key).
    pub(crate) fingerprint_key: FingerprintKey,
}

/// Where the records live: the embedded SQLite file, or a PostgreSQL
/// server shared by many controllers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Location {
    /// One SQLite file; its keys beside it.
    Sqlite(PathBuf),
    /// A PostgreSQL connection string (`postgres://…` or
    /// `postgresql://…`); its keys at `keys` (`<keys>.fingerprint-key`,
    /// `<keys>.seal-key`), which every controller of the partition shares.
    Postgres {
        /// The connection string (may hold a password: never printed).
        url: String,
        /// The key-file prefix.
        keys: PathBuf,
        /// The partition (`[a-z][a-z0-9]{0,9}`; default `cli`).
        partition: String,
    },
}

impl Location {
    /// What the note on stderr says (never the connection string).
    pub(crate) fn describe(&self) -> String {
        match self {
            Self::Sqlite(db) => format!("the embedded SQLite store at {}", db.display()),
            Self::Postgres {
                keys, partition, ..
            } => format!(
                "the PostgreSQL store given by --store (partition {partition}, keys {}.*)",
                keys.display()
            ),
        }
    }
}

/// The store `explicit` names (a path, or a `postgres://` URL), else the
/// default SQLite file. A PostgreSQL store's keys are
/// `$SMOLBOX_STORE_KEYS` (a path prefix), else `postgres` in the data
/// directory; its partition is `$SMOLBOX_STORE_PARTITION`, else `cli`.
pub(crate) fn location(explicit: Option<&Path>) -> Result<Location, Failure> {
    let url = explicit
        .and_then(Path::to_str)
        .filter(|s| s.starts_with("postgres://") || s.starts_with("postgresql://"));
    let Some(url) = url else {
        return Ok(Location::Sqlite(store_path(explicit)?));
    };
    let keys = match std::env::var_os("SMOLBOX_STORE_KEYS").filter(|v| !v.is_empty()) {
        Some(p) => PathBuf::from(p),
        None => store_path(None)?.with_file_name("postgres"),
    };
    let partition = std::env::var("SMOLBOX_STORE_PARTITION")
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| SCOPE.to_owned());
    Ok(Location::Postgres {
        url: url.to_owned(),
        keys,
        partition,
    })
}

/// Opens (creating when absent) the store `explicit` names, or the
/// default SQLite file.
pub(crate) fn open(explicit: Option<&Path>) -> Result<Opened, Failure> {
    open_at(&location(explicit)?)
}

/// Opens (creating when absent) the store at `location`.
pub(crate) fn open_at(location: &Location) -> Result<Opened, Failure> {
    let anchor = match location {
        Location::Sqlite(db) => db,
        Location::Postgres { keys, .. } => keys,
    };
    if let Some(dir) = anchor.parent() {
        create_private_dir(dir)?;
    }
    let (fingerprint_key, encryption_key) = load_or_create_keys(anchor)?;
    let store: Arc<dyn Store> = match location {
        Location::Sqlite(db) => {
            Arc::new(SqliteStore::open(db, Sealer::new(&encryption_key, SCOPE)?)?)
        }
        Location::Postgres { url, partition, .. } => Arc::new(PostgresStore::connect_with(
            url,
            Sealer::new(&encryption_key, partition)?,
            &postgres_options()?,
        )?),
    };
    Ok(Opened {
        store,
        fingerprint_key,
    })
}

/// TLS to PostgreSQL with the CA bundle at `$SMOLBOX_STORE_CA` and/or the
/// system's roots with `$SMOLBOX_STORE_SYSTEM_ROOTS=1`; plain text to
/// another host only with `$SMOLBOX_STORE_PLAINTEXT_REMOTE=1`.
fn postgres_options() -> Result<PostgresOptions, Failure> {
    let mut options = PostgresOptions::new();
    if let Some(ca) = std::env::var_os("SMOLBOX_STORE_CA").filter(|v| !v.is_empty()) {
        options = options.ca_file(Path::new(&ca))?;
    }
    let system = std::env::var("SMOLBOX_STORE_SYSTEM_ROOTS").is_ok_and(|v| v == "1");
    options = options.system_roots(system);
    let plain = std::env::var("SMOLBOX_STORE_PLAINTEXT_REMOTE").is_ok_and(|v| v == "1");
    Ok(options.allow_plaintext_remote(plain))
}

/// The artifact directory of the store at `location` (declared files of
/// `run --input/--output`): `<name>.artifacts` beside the SQLite file
/// (default `~/.local/share/smolbox/smolbox.artifacts`) or beside the
/// PostgreSQL key files, created with mode 0700 when absent (an existing
/// one with a wider mode is refused).
pub(crate) fn artifacts_at(location: &Location) -> Result<Arc<DirArtifacts>, Failure> {
    let anchor = match location {
        Location::Sqlite(db) => db,
        Location::Postgres { keys, .. } => keys,
    };
    let anchor = std::path::absolute(anchor)
        .map_err(|e| Failure::local(format!("resolve {}", anchor.display()), &e))?;
    let mut name = anchor.file_stem().unwrap_or_default().to_os_string();
    name.push(".artifacts");
    let root = anchor.with_file_name(name);
    if let Some(dir) = root.parent() {
        create_private_dir(dir)?;
    }
    let artifacts = DirArtifacts::create(&root)?;
    // Temporary files a crashed put left (older than an hour; a put's own
    // lives for one write): removed, best effort (a failure only leaves
    // them, and is said).
    if let Err(e) = artifacts.sweep_stale(std::time::Duration::from_secs(3600)) {
        eprintln!(
            "smolbox: note: stale temporary files in the artifact directory were not removed: {e}"
        );
    }
    Ok(Arc::new(artifacts))
}

/// Whether `rec` runs on a disposable machine the runtime owns (neither a
/// caller-named nor a managed retained machine).
pub(crate) fn is_disposable(rec: &ExecutionRecord) -> bool {
    rec.spec.worker_machine.is_none() && rec.spec.machine.is_none()
}

/// How long a command waits, once a disposable record has its outcome, for
/// the runtime to delete its machine and record the absence.
const CLEANUP_MS: u64 = 60_000;

/// Waits (while `rt` drives it, at most [`CLEANUP_MS`]) until disposable
/// record `key` holds no reservation any more: its machine was deleted
/// (the recorded incarnation verified first) and its absence observed
/// before the release — the runtime's own cleanup path, so a command that
/// settles a record does not leave its machine behind. The runtime has
/// normally done so by the time its `wait` returns (this then reads the
/// record once); the bounded wait covers a record settled earlier whose
/// cleanup a killed process left unfinished. The last record read; a note
/// when the cleanup is still going on.
pub(crate) fn settle_cleanup(
    rt: &Rt<'_>,
    store: &dyn Store,
    key: &RecordKey,
) -> Result<ExecutionRecord, Failure> {
    let deadline = Instant::now() + std::time::Duration::from_millis(CLEANUP_MS);
    loop {
        let rec = store.fetch(key)?;
        if !is_disposable(&rec) || rec.reservation.is_none() {
            return Ok(rec);
        }
        // Not due again within this wait: an `unknown` outcome's machine is
        // stopped and kept, disks and all, for the retention (C17.2), and
        // no controller acts on it before then.
        if let Some(due) = rec.next_due_at_ms.filter(|d| *d > wall_ms() + CLEANUP_MS) {
            report::note(&format!(
                "the machine of execution {} is kept for its retention (an uncertain \
                 outcome's machine keeps its disks) and is due again in {} s; \
                 `smolbox recover` after that deletes it",
                key.id,
                (due - wall_ms()) / 1_000
            ));
            return Ok(rec);
        }
        if Instant::now() >= deadline {
            report::note(&format!(
                "the machine of execution {} is not cleaned up yet (cleanup {}); \
                 `smolbox recover` continues it",
                key.id,
                json!(rec.cleanup).as_str().unwrap_or("-")
            ));
            return Ok(rec);
        }
        rt.reconcile();
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// The record key of an id the user typed.
pub(crate) fn key(id: &str) -> Result<RecordKey, Failure> {
    Ok(RecordKey::new(SCOPE, id)?)
}

/// The fetched record, `None` only when the store positively reports its
/// absence (a store failure stays an error).
pub(crate) fn fetch_opt(
    store: &dyn Store,
    key: &RecordKey,
) -> Result<Option<ExecutionRecord>, Failure> {
    match store.fetch(key) {
        Ok(r) => Ok(Some(r)),
        Err(e) if e.category() == Category::NotFound => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// `runtime.machines().CALL` on either shell.
macro_rules! machines {
    ($self:ident, $method:ident($($arg:expr),*)) => {
        match $self {
            Self::Tokio(rt, r) => rt.block_on(r.machines().$method($($arg),*)),
            Self::Blocking(r) => r.machines().$method($($arg),*),
        }
    };
}

/// The managed runtime of either shell, over one store and one worker.
pub(crate) enum Rt<'a> {
    /// The tokio shell's runtime, driven on the backend's tokio runtime.
    Tokio(&'a tokio::runtime::Runtime, smolbox_tokio::Runtime),
    /// The blocking shell's runtime.
    Blocking(smolbox_blocking::Runtime),
}

impl<'a> Rt<'a> {
    /// A runtime whose only worker is `worker` (the backend's client),
    /// with the version profile the caller admitted when it has one (the
    /// plain `run`, which admitted it for its machine's create): then a
    /// command that needs a plain image machine is inspected before its
    /// acceptance (docs/decisions.md, "CLI: the plain run's runtime carries
    /// the admitted profile (session 11, issue 12)").
    pub(crate) fn new(
        b: &'a Backend,
        opened: &Opened,
        worker: &str,
        profile: Option<Profile>,
    ) -> Result<Self, Failure> {
        Self::build(b, opened, worker, profile, None)
    }

    /// A runtime whose only worker is `worker`, admitted with its version
    /// profile (so it can create and delete disposable machines), with the
    /// store's artifact directory (declared files): what `run` with files
    /// or `--detach`, `wait`, `cancel` and `recover` use.
    pub(crate) fn with_files(
        b: &'a Backend,
        opened: &Opened,
        worker: &str,
        artifacts: Arc<DirArtifacts>,
    ) -> Result<Self, Failure> {
        Self::build(b, opened, worker, Some(b.admit()?), Some(artifacts))
    }

    /// A runtime whose only worker is `worker`, admitted with its version
    /// profile so the controller can create, start, stop and delete
    /// retained machines on it.
    pub(crate) fn with_profile(
        b: &'a Backend,
        opened: &Opened,
        worker: &str,
    ) -> Result<Self, Failure> {
        Self::build(b, opened, worker, Some(b.admit()?), None)
    }

    fn build(
        b: &'a Backend,
        opened: &Opened,
        worker: &str,
        profile: Option<Profile>,
        artifacts: Option<Arc<DirArtifacts>>,
    ) -> Result<Self, Failure> {
        let store = Arc::clone(&opened.store);
        let fk = opened.fingerprint_key.clone();
        let ttl = lease_ttl_ms();
        Ok(match b {
            Backend::Tokio { rt, client } => {
                let r = rt.block_on(async {
                    let mut builder = smolbox_tokio::Runtime::builder(store, fk);
                    builder = match profile {
                        Some(p) => builder.worker_with_profile(worker, client.clone(), p),
                        None => builder.worker(worker, client.clone()),
                    };
                    if let Some(source) = crate::worker::machine_source() {
                        builder = builder.machine_source(worker, source);
                    }
                    if let Some(ms) = ttl {
                        builder = builder.lease_ttl_ms(ms);
                    }
                    if let Some(a) = artifacts {
                        builder = builder.artifacts(a);
                    }
                    builder.build()
                })?;
                Self::Tokio(rt, r)
            }
            Backend::Blocking(client) => {
                let mut builder = smolbox_blocking::Runtime::builder(store, fk);
                builder = match profile {
                    Some(p) => builder.worker_with_profile(worker, client.clone(), p),
                    None => builder.worker(worker, client.clone()),
                };
                if let Some(source) = crate::worker::machine_source() {
                    builder = builder.machine_source(worker, source);
                }
                if let Some(ms) = ttl {
                    builder = builder.lease_ttl_ms(ms);
                }
                if let Some(a) = artifacts {
                    builder = builder.artifacts(a);
                }
                Self::Blocking(builder.build()?)
            }
        })
    }

    /// `submit` then `wait` to the end.
    pub(crate) fn run(&self, submit: Submit) -> Result<Outcome, Error> {
        match self {
            Self::Tokio(rt, r) => rt.block_on(r.run(submit)),
            Self::Blocking(r) => r.run(submit),
        }
    }

    /// `submit` then `wait` to the end, the output to `on_event` as it
    /// comes (back-pressured; never stored).
    pub(crate) fn run_streamed(
        &self,
        submit: Submit,
        on_event: &mut (dyn FnMut(&ExecEvent) + Send),
    ) -> Result<Outcome, Error> {
        match self {
            Self::Tokio(rt, r) => rt.block_on(r.run_streamed(submit, on_event)),
            Self::Blocking(r) => r.run_streamed(submit, on_event),
        }
    }

    /// A command into the machine's slot, then to its end, the output to
    /// `on_event` as it comes.
    pub(crate) fn m_run_streamed(
        &self,
        machine: &RecordKey,
        key: &RecordKey,
        command: &Command,
        on_event: &mut (dyn FnMut(&ExecEvent) + Send),
    ) -> Result<Outcome, Error> {
        machines!(self, run_streamed(machine, key, command, on_event))
    }

    /// [`Self::m_run_streamed`] with declared files.
    pub(crate) fn m_run_streamed_files(
        &self,
        machine: &RecordKey,
        key: &RecordKey,
        command: &Command,
        files: &smolbox_core::managed::CommandFiles,
        on_event: &mut (dyn FnMut(&ExecEvent) + Send),
    ) -> Result<Outcome, Error> {
        machines!(
            self,
            run_streamed_with_files(machine, key, command, files, on_event)
        )
    }

    /// One wait of at most `ms` (≤ 900,000).
    pub(crate) fn wait(&self, key: &RecordKey, ms: u64) -> Result<Outcome, Error> {
        match self {
            Self::Tokio(rt, r) => rt.block_on(r.wait(key, ms)),
            Self::Blocking(r) => r.wait(key, ms),
        }
    }

    /// Requests cancellation.
    pub(crate) fn cancel(&self, key: &RecordKey) -> Result<ExecutionRecord, Error> {
        match self {
            Self::Tokio(rt, r) => rt.block_on(r.cancel(key)),
            Self::Blocking(r) => r.cancel(key),
        }
    }

    /// Schedules a due scan now.
    pub(crate) fn reconcile(&self) {
        match self {
            Self::Tokio(_, r) => r.reconcile(),
            Self::Blocking(r) => r.reconcile(),
        }
    }

    /// Creates a retained machine (returns at durable acceptance).
    pub(crate) fn m_create(
        &self,
        key: &RecordKey,
        spec: &RetainedMachineSpec,
    ) -> Result<(MachineRecord, bool), Error> {
        machines!(self, create(key, spec))
    }

    /// The stored machine record.
    pub(crate) fn m_inspect(&self, key: &RecordKey) -> Result<MachineRecord, Error> {
        machines!(self, inspect(key))
    }

    /// Waits up to `ms` until the machine is settled.
    pub(crate) fn m_wait(&self, key: &RecordKey, ms: u64) -> Result<MachineRecord, Error> {
        machines!(self, wait(key, ms))
    }

    /// Versioned start, stop or delete (returns once durable).
    pub(crate) fn m_lifecycle(
        &self,
        key: &RecordKey,
        action: MachineOperation,
        version: u64,
    ) -> Result<MachineRecord, Error> {
        match action {
            MachineOperation::Start => machines!(self, start(key, version)),
            MachineOperation::Stop => machines!(self, stop(key, version)),
            _ => machines!(self, delete(key, version)),
        }
    }

    /// Submits `command` with its declared files into the machine's slot
    /// under `key`.
    pub(crate) fn m_submit_files(
        &self,
        machine: &RecordKey,
        key: &RecordKey,
        command: &Command,
        files: &smolbox_core::managed::CommandFiles,
    ) -> Result<(ExecutionRecord, Option<MachineRecord>, bool), Error> {
        machines!(self, submit_with_files(machine, key, command, files))
    }

    /// Submits `command` into the machine's slot under `key`.
    pub(crate) fn m_submit(
        &self,
        machine: &RecordKey,
        key: &RecordKey,
        command: &Command,
    ) -> Result<(ExecutionRecord, Option<MachineRecord>, bool), Error> {
        machines!(self, submit(machine, key, command))
    }

    /// The measurements of the recorded incarnation, with the record they
    /// were checked against (the worker is inspected first).
    pub(crate) fn m_measurements(
        &self,
        key: &RecordKey,
    ) -> Result<(smolbox_core::worker::Measurements, MachineRecord), Error> {
        machines!(self, measurements(key))
    }

    /// An ownership-verified stop for draining.
    pub(crate) fn m_stop_for_drain(
        &self,
        key: &RecordKey,
        version: u64,
    ) -> Result<MachineRecord, Error> {
        machines!(self, stop_for_drain(key, version))
    }

    /// Quiescent resolution.
    pub(crate) fn m_resolve(
        &self,
        key: &RecordKey,
        version: u64,
        quiesced: bool,
        disposition: Resolution,
    ) -> Result<(MachineRecord, Option<ExecutionRecord>), Error> {
        machines!(self, resolve(key, version, quiesced, disposition))
    }

    /// Opens managed terminal `key` on the managed machine `machine`
    /// (returns at durable acceptance: the record holds the slot).
    pub(crate) fn t_open(
        &self,
        key: &RecordKey,
        machine: &RecordKey,
        spec: ManagedTerminalSpec,
    ) -> Result<ExecutionRecord, Error> {
        let (key, machine) = (key.clone(), machine.clone());
        Ok(match self {
            Self::Tokio(rt, r) => rt.block_on(r.terminals().open(key, machine, spec))?.record,
            Self::Blocking(r) => r.terminals().open(key, machine, spec)?.record,
        })
    }

    /// Binds this process as the one consumer of terminal `key`.
    pub(crate) fn t_attach(
        &self,
        key: &RecordKey,
        wait: std::time::Duration,
    ) -> Result<Box<dyn crate::term::Term + 'a>, Error> {
        Ok(match self {
            Self::Tokio(rt, r) => {
                let term = rt.block_on(r.terminals().attach(key, wait))?;
                Box::new(crate::backend_tokio_term::Managed { rt, term })
            }
            Self::Blocking(r) => Box::new(r.terminals().attach(key, wait)?),
        })
    }

    /// Waits up to `wait` for this runtime to finish with terminal `key`;
    /// the stored record.
    pub(crate) fn t_wait(
        &self,
        key: &RecordKey,
        wait: std::time::Duration,
    ) -> Result<ExecutionRecord, Error> {
        match self {
            Self::Tokio(rt, r) => rt.block_on(r.terminals().wait(key, wait)),
            Self::Blocking(r) => r.terminals().wait(key, wait),
        }
    }

    /// Stops taking work; returns once what was sent has been observed to
    /// its end.
    pub(crate) fn shutdown(&self) {
        match self {
            Self::Tokio(rt, r) => rt.block_on(r.shutdown()),
            Self::Blocking(r) => r.shutdown(),
        }
    }
}

/// The spec `run` records for `cmd` on `machine` of `worker`, as submitted.
pub(crate) fn submit_for(
    key: RecordKey,
    cmd: &Command,
    worker: &str,
    machine: &str,
) -> Result<Submit, Failure> {
    let spec = spec_for(cmd, &RunTarget::unverified().fitting(cmd), worker, machine)?;
    Ok(Submit { key, spec })
}

/// Runs `submit` through the managed runtime, to its end; with
/// `on_event`, streamed (the output to it as it comes, never stored). With
/// `profile` (the worker's, admitted by the caller) the runtime's worker
/// carries it ([`Rt::new`]).
pub(crate) fn run_recorded(
    b: &Backend,
    opened: &Opened,
    worker: &str,
    profile: Option<Profile>,
    submit: Submit,
    on_event: Option<&mut (dyn FnMut(&ExecEvent) + Send)>,
) -> Result<Outcome, Failure> {
    let rt = Rt::new(b, opened, worker, profile)?;
    let out = match on_event {
        Some(f) => rt.run_streamed(submit, f),
        None => rt.run(submit),
    };
    rt.shutdown();
    Ok(out?)
}

/// Whether `cmd` under `key` is the command already recorded in `rec`: the
/// spec rebuilt on the record's own worker and machine has the recorded
/// fingerprint. A different command is an `identity_conflict`.
pub(crate) fn same_identity(
    opened: &Opened,
    rec: &ExecutionRecord,
    cmd: &Command,
) -> Result<Submit, Failure> {
    let conflict = || {
        Failure::Core(Error::identity_conflict(
            Operation::Submit,
            Evidence::NotDispatched,
            Reason::ChangedSpec,
        ))
    };
    let Some(wm) = &rec.spec.worker_machine else {
        return Err(conflict());
    };
    let submit = submit_for(rec.key.clone(), cmd, &wm.worker_id, &wm.name)?;
    if exec_fingerprint(&opened.fingerprint_key, &submit.spec) != rec.fingerprint {
        return Err(conflict());
    }
    Ok(submit)
}

/// Makes `submit` durable and returns without driving it: a controller of
/// this process accepts it (the same acceptance rules and store call as the
/// runtime's), and nothing after the acceptance is performed — the record
/// stays `accepted` and due, unclaimed, for the next controller (`wait`,
/// `recover`) to dispatch from the stored spec. `Ok(existing)`.
pub(crate) fn accept_only(
    opened: &Opened,
    worker: &str,
    profile: Option<Profile>,
    submit: Submit,
) -> Result<bool, Failure> {
    let (now, now_ms) = (Instant::now(), wall_ms());
    let mut cfg = ControllerConfig::new(&smolbox_tokio::runtime::default_owner());
    let mut entry = WorkerEntry::new(worker);
    entry.machine_source = crate::worker::machine_source();
    cfg.workers.push(match profile {
        Some(p) => entry.with_profile(p),
        None => entry,
    });
    if let Some(ms) = lease_ttl_ms() {
        cfg.lease_ttl_ms = ms;
    }
    // Left to whichever controller comes next (`wait`, `recover`): no claim.
    cfg.claim_at_accept = false;
    // Declared files are accepted: the next controller has the store's
    // artifact directory (`Rt::with_files`), where the inputs already are.
    cfg.artifacts = !submit.spec.inputs.is_empty() || !submit.spec.outputs.is_empty();
    let mut ctl = Controller::new(cfg, opened.fingerprint_key.clone(), now, now_ms)?;
    let key = submit.key.clone();
    ctl.submit(now, now_ms, submit)?;
    loop {
        // Only the acceptance is performed (the start-up due scan and the
        // claim that would follow acceptance are left undone).
        let mut performed = false;
        while let Some((id, op)) = ctl.poll_store_op() {
            if matches!(
                op,
                smolbox_core::managed::controller::StoreOp::Accept { .. }
            ) {
                let result = apply_op(opened.store.as_ref(), &op);
                ctl.handle_stored(Instant::now(), wall_ms(), id, result);
                performed = true;
                break;
            }
        }
        while let Some(ev) = ctl.poll_event() {
            match ev {
                ControllerEvent::Accepted {
                    key: k, existing, ..
                } if k == key => return Ok(existing),
                ControllerEvent::Refused { key: k, error } if k == key => return Err(error.into()),
                _ => {}
            }
        }
        if !performed {
            return Err(Failure::Core(Error::store(
                Operation::Submit,
                Evidence::NotDispatched,
                Reason::NoAcceptance,
            )));
        }
    }
}

/// The snake_case name of a record's evidence.
pub(crate) fn ev(e: RecordEvidence) -> &'static str {
    match e {
        RecordEvidence::NotDispatched => "not_dispatched",
        RecordEvidence::DispatchUncertain => "dispatch_uncertain",
        RecordEvidence::RunningObserved => "running_observed",
        RecordEvidence::Exited => "exited",
        RecordEvidence::Launched => "launched",
        RecordEvidence::TerminationConfirmed => "termination_confirmed",
        RecordEvidence::Unknown => "unknown",
    }
}

fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The exit code a finished record means: the guest's code when it exited,
/// 3 when its outcome is unknown, [`EXIT_NOT_RUN`] when it ended without
/// running; `None` while it is not finished.
pub(crate) fn exit_of(rec: &ExecutionRecord) -> Option<i32> {
    if let Some(ExecResult::Exited { exit_code, .. } | ExecResult::Terminal { exit_code }) =
        rec.result
    {
        return Some(exit_code);
    }
    if !rec.state.ends_wait() {
        return None;
    }
    Some(match rec.state {
        ExecState::Unknown => 3,
        ExecState::Launched | ExecState::Completed => 0,
        _ => EXIT_NOT_RUN,
    })
}

/// A record as JSON: everything but the command (argv, env, stdin).
pub(crate) fn record_json(r: &ExecutionRecord) -> serde_json::Value {
    let (exit_code, output_bytes, truncated) = match r.result {
        Some(ExecResult::Exited {
            exit_code,
            output_bytes,
            truncated,
        }) => (Some(exit_code), Some(output_bytes), Some(truncated)),
        Some(ExecResult::Terminal { exit_code }) => (Some(exit_code), None, None),
        _ => (None, None, None),
    };
    let wm = r.spec.worker_machine.as_ref();
    json!({
        "id": r.key.id,
        "scope": r.key.scope,
        "state": r.state.as_str(),
        "evidence": ev(r.evidence),
        "exit_code": exit_code,
        "output_bytes": output_bytes,
        "output_truncated": truncated,
        // The caller's machine, else the disposable machine assigned to it.
        "worker": wm
            .map(|w| w.worker_id.clone())
            .or_else(|| r.assignment.as_ref().map(|a| a.worker_id.clone())),
        "machine": wm
            .map(|w| w.name.clone())
            .or_else(|| r.assignment.as_ref().map(|a| a.machine_name.clone())),
        "managed_machine": r.spec.machine.as_ref().map(|k| k.id.clone()),
        "accepted_at_ms": r.accepted_at_ms,
        "updated_at_ms": r.updated_at_ms,
        "next_due_at_ms": r.next_due_at_ms,
        "cancel_requested_at_ms": r.cancel_requested_at_ms,
        "version": r.version,
        "cleanup": json!(r.cleanup),
        // Declared inputs and collected outputs: path, size, digest (never bytes).
        "inputs": r.spec.inputs.iter().map(|i| json!({
            "path": i.path,
            "size": i.size,
            "sha256": i.sha256,
        })).collect::<Vec<_>>(),
        "outputs": r.artifacts.iter().map(|a| json!({
            "path": a.path,
            "size": a.size,
            "sha256": a.sha256,
        })).collect::<Vec<_>>(),
        "last_error": r.last_error.as_ref().map(|e| json!({
            "category": e.category,
            "operation": e.operation,
            "evidence": e.evidence,
            "reason": e.reason,
            "at_ms": e.at_ms,
        })),
    })
}

/// `records ls [--state S] [--machine M]`: every page of the scope, in id
/// order.
pub(crate) fn ls(
    store: Option<&Path>,
    state: Option<&str>,
    machine: Option<&str>,
    json: bool,
) -> Result<i32, Failure> {
    let opened = open(store)?;
    let mut all = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = opened
            .store
            .list(SCOPE, after.as_deref(), DEFAULT_LIST_PAGE)?;
        all.extend(page.records.into_iter().filter(|r| {
            state.is_none_or(|s| r.state.as_str() == s)
                && machine.is_none_or(|m| {
                    r.spec.worker_machine.as_ref().is_some_and(|w| w.name == m)
                        || r.spec.machine.as_ref().is_some_and(|k| k.id == m)
                        || r.assignment.as_ref().is_some_and(|a| a.machine_name == m)
                })
        }));
        match page.next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    if json {
        let v: Vec<_> = all.iter().map(record_json).collect();
        report::line(&serde_json::Value::Array(v).to_string())?;
        return Ok(0);
    }
    report::line(&format!(
        "{:<28} {:<12} {:<20} {:>4} {:<18} {:<26} {:<7} {}",
        "ID", "STATE", "EVIDENCE", "EXIT", "WORKER", "MACHINE", "IN/OUT", "UPDATED_MS"
    ))?;
    let mut placed = std::collections::BTreeMap::new();
    for r in &all {
        let wm = r.spec.worker_machine.as_ref();
        // A command in a managed machine's slot: the machine's worker.
        let slot_worker = r.spec.machine.as_ref().and_then(|k| {
            placed
                .entry(k.clone())
                .or_insert_with(|| placement(opened.store.as_ref(), k))
                .clone()
                .map(|(w, _)| w)
        });
        let exit = match r.result {
            Some(ExecResult::Exited { exit_code, .. } | ExecResult::Terminal { exit_code }) => {
                exit_code.to_string()
            }
            _ => "-".into(),
        };
        report::line(&format!(
            "{:<28} {:<12} {:<20} {:>4} {:<18} {:<26} {:<7} {}",
            r.key.id,
            r.state.as_str(),
            ev(r.evidence),
            exit,
            wm.map(|w| w.worker_id.as_str())
                .or(slot_worker.as_deref())
                .or(r.assignment.as_ref().map(|a| a.worker_id.as_str()))
                .unwrap_or("-"),
            wm.map(|w| w.name.as_str())
                .or(r.spec.machine.as_ref().map(|k| k.id.as_str()))
                .or(r.assignment.as_ref().map(|a| a.machine_name.as_str()))
                .unwrap_or("-"),
            format!("{}/{}", r.spec.inputs.len(), r.artifacts.len()),
            r.updated_at_ms
        ))?;
    }
    Ok(0)
}

/// The worker and worker machine name of managed machine `k`, as its
/// record says (`None` when it is not placed, or cannot be read: the
/// listing still shows the record).
fn placement(store: &dyn Store, k: &RecordKey) -> Option<(String, String)> {
    let m = store.fetch_machine(k).ok()?;
    m.assignment.map(|a| (a.worker_id, a.machine_name))
}

/// `records show ID`.
pub(crate) fn show(store: Option<&Path>, id: &str, json: bool) -> Result<i32, Failure> {
    let opened = open(store)?;
    let rec = opened.store.fetch(&key(id)?)?;
    if !json && let Some(k) = &rec.spec.machine {
        // A command in a managed machine's slot: show where it ran.
        let mut v = record_json(&rec);
        if let Some((worker, name)) = placement(opened.store.as_ref(), k) {
            v["worker"] = json!(worker);
            v["machine"] = json!(name);
        }
        print_fields(&v)?;
        return Ok(0);
    }
    print_record(&rec, json)?;
    Ok(0)
}

/// Prints one record (`key: value` lines, or one JSON object).
pub(crate) fn print_record(rec: &ExecutionRecord, json: bool) -> Result<(), Failure> {
    let v = record_json(rec);
    if json {
        return report::line(&v.to_string());
    }
    print_fields(&v)
}

/// Prints a record's fields as `key: value` lines (`-` for none).
fn print_fields(v: &serde_json::Value) -> Result<(), Failure> {
    if let Some(o) = v.as_object() {
        for (k, val) in o {
            // Files: one line each (`inputs: -` when none).
            if let serde_json::Value::Array(files) = val {
                if files.is_empty() {
                    report::line(&format!("{k}: -"))?;
                }
                for f in files {
                    report::line(&format!(
                        "{k}: {} {} bytes sha256 {}",
                        f["path"].as_str().unwrap_or("-"),
                        f["size"],
                        f["sha256"].as_str().unwrap_or("-")
                    ))?;
                }
                continue;
            }
            let text = match val {
                serde_json::Value::Null => "-".to_owned(),
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            report::line(&format!("{k}: {text}"))?;
        }
    }
    Ok(())
}

fn create_private_dir(dir: &Path) -> Result<(), Failure> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| Failure::local(format!("create {}", dir.display()), &e))
}

/// Longest single runtime wait (C16).
pub(crate) const MAX_WAIT_MS: u64 = 900_000;

/// How long `cancel` and `recover` watch the records they moved settle.
const SETTLE_MS: u64 = 60_000;

/// A confirmed exit whose output went over the allowance (AC-5.2.1: the
/// exec's `output_limit`, evidence `exited`, kept as the outcome's error
/// while the record completes with the exit): the error is printed as any
/// failure is (stderr, `--json` too), and the exit code is the guest's own,
/// or the output limit's (7) when the guest exited 0, as for an output
/// file over its maximum (docs/decisions/cli.md). `None` for any other
/// outcome.
pub(crate) fn output_over_allowance(out: &Outcome, json: bool) -> Option<i32> {
    let e = out.error.filter(|e| {
        out.output.is_none()
            && e.category() == Category::OutputLimit
            && e.evidence() == Evidence::Exited
    })?;
    let f = Failure::Core(e);
    if json {
        f.print_json();
    } else {
        f.print();
    }
    Some(match out.exit_code() {
        Some(0) | None => f.exit_code(),
        Some(code) => code,
    })
}

/// Prints what a wait found: the output this process observed (never
/// stored), then the record; returns the exit code it means.
pub(crate) fn print_outcome(out: &Outcome, json: bool) -> Result<i32, Failure> {
    if !json && let Some(code) = output_over_allowance(out, json) {
        return Ok(code);
    }
    let code = match out.exit_code() {
        Some(c) => c,
        None => match &out.error {
            Some(e) if !out.record.state.ends_wait() => return Err(Failure::Core(*e)),
            _ => exit_of(&out.record).unwrap_or(3),
        },
    };
    if json {
        let mut v = record_json(&out.record);
        if let Some(o) = &out.output {
            v["stdout"] = json!(String::from_utf8_lossy(&o.stdout));
            v["stderr"] = json!(String::from_utf8_lossy(&o.stderr));
        }
        report::line(&v.to_string())?;
        if let Some(over) = output_over_allowance(out, json) {
            return Ok(over);
        }
    } else {
        match &out.output {
            Some(o) => {
                report::out(&o.stdout)?;
                report::err(&o.stderr);
            }
            None => report::note(&format!(
                "execution {} is {} (evidence {}); its output is not stored",
                out.record.key.id,
                out.record.state.as_str(),
                ev(out.record.evidence)
            )),
        }
    }
    Ok(code)
}

/// `wait ID [--timeout MS]`: drives the record when it is still due on
/// this worker (a detached run is sent here, from its stored spec), and
/// returns what it means once it is finished.
pub(crate) fn wait(
    b: &Backend,
    store: Option<&Path>,
    worker: &str,
    id: &str,
    timeout: Option<u64>,
    json: bool,
) -> Result<i32, Failure> {
    let location = location(store)?;
    let opened = open_at(&location)?;
    let key = key(id)?;
    let rec = opened.store.fetch(&key)?;
    if rec.state.ends_wait() && !(is_disposable(&rec) && rec.reservation.is_some()) {
        let out = Outcome {
            record: rec,
            output: None,
            error: None,
        };
        return print_outcome(&out, json);
    }
    let rt = Rt::with_files(b, &opened, worker, artifacts_at(&location)?)?;
    let result = match timeout {
        Some(ms) => rt.wait(&key, ms),
        None => loop {
            match rt.wait(&key, MAX_WAIT_MS) {
                Err(e)
                    if e.category() == Category::Expired && e.operation() == Operation::Await => {}
                other => break other,
            }
        },
    };
    // A settled disposable record's machine is deleted before leaving.
    let result = match result {
        Ok(mut out) if out.record.state.ends_wait() => {
            match settle_cleanup(&rt, opened.store.as_ref(), &key) {
                Ok(rec) => out.record = rec,
                Err(f) => {
                    rt.shutdown();
                    return Err(f);
                }
            }
            Ok(out)
        }
        other => other,
    };
    // A command this process sent is observed to its end.
    rt.shutdown();
    print_outcome(&result?, json)
}

/// `cancel ID`: the cancel request is made durable; the record is then
/// watched (up to a minute) as the controller moves it, and printed.
pub(crate) fn cancel(
    b: &Backend,
    store: Option<&Path>,
    worker: &str,
    id: &str,
    json: bool,
) -> Result<i32, Failure> {
    let location = location(store)?;
    let opened = open_at(&location)?;
    let key = key(id)?;
    let rt = Rt::with_files(b, &opened, worker, artifacts_at(&location)?)?;
    let cancelled = rt.cancel(&key);
    let settled = match &cancelled {
        Ok(_) => {
            rt.reconcile();
            rt.wait(&key, SETTLE_MS).map(|o| o.record)
        }
        Err(_) => Ok(opened.store.fetch(&key)?),
    };
    // A settled disposable record's machine is deleted before leaving.
    let cleaned = match (&cancelled, &settled) {
        (Ok(_), Ok(r)) if r.state.ends_wait() => {
            Some(settle_cleanup(&rt, opened.store.as_ref(), &key))
        }
        _ => None,
    };
    rt.shutdown();
    cancelled?;
    let rec = match (cleaned, settled) {
        (Some(c), _) => c?,
        (None, Ok(r)) => r,
        (None, Err(e)) if e.category() == Category::Expired => opened.store.fetch(&key)?,
        (None, Err(e)) => return Err(e.into()),
    };
    if !json {
        report::note(&format!(
            "cancel of {} recorded; it is now {} (evidence {})",
            rec.key.id,
            rec.state.as_str(),
            ev(rec.evidence)
        ));
    }
    print_record(&rec, json)?;
    Ok(0)
}

/// `recover`: the recovery scan once over the store for this worker; every
/// unfinished record of the worker is watched (up to a minute in all) as
/// the controller moves it, and what changed is printed.
pub(crate) fn recover(
    b: &Backend,
    store: Option<&Path>,
    worker: &str,
    json: bool,
) -> Result<i32, Failure> {
    let location = location(store)?;
    let opened = open_at(&location)?;
    let mut before = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = opened
            .store
            .list(SCOPE, after.as_deref(), DEFAULT_LIST_PAGE)?;
        before.extend(page.records.into_iter().filter(|r| {
            let on_worker = r
                .spec
                .worker_machine
                .as_ref()
                .map(|w| w.worker_id.as_str())
                .or(r.assignment.as_ref().map(|a| a.worker_id.as_str()))
                .is_some_and(|w| w == worker);
            // A disposable record not yet placed is this worker's (the
            // only one in the catalog); a settled one whose machine still
            // holds its reservation is not finished either.
            let mine = on_worker || (is_disposable(r) && r.assignment.is_none());
            let open = !r.state.ends_wait() || (is_disposable(r) && r.reservation.is_some());
            mine && open
        }));
        match page.next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    let rt = Rt::with_files(b, &opened, worker, artifacts_at(&location)?)?;
    rt.reconcile();
    let deadline = Instant::now() + std::time::Duration::from_millis(SETTLE_MS);
    for r in &before {
        let left = deadline.saturating_duration_since(Instant::now());
        let ms = u64::try_from(left.as_millis()).unwrap_or(SETTLE_MS);
        match rt.wait(&r.key, ms) {
            Ok(o) if o.record.state.ends_wait() && is_disposable(&o.record) => {
                if let Err(f) = settle_cleanup(&rt, opened.store.as_ref(), &r.key) {
                    rt.shutdown();
                    return Err(f);
                }
            }
            Ok(_) => {}
            Err(e) if e.category() == Category::Expired => {}
            Err(e) => {
                rt.shutdown();
                return Err(e.into());
            }
        }
    }
    rt.shutdown();
    let mut moved = Vec::new();
    for r in &before {
        let now = opened.store.fetch(&r.key)?;
        moved.push((r.state, now));
    }
    if json {
        let v: Vec<_> = moved
            .iter()
            .map(|(from, now)| {
                json!({
                    "id": now.key.id,
                    "from": from.as_str(),
                    "to": now.state.as_str(),
                    "evidence": ev(now.evidence),
                    "moved": *from != now.state,
                })
            })
            .collect();
        report::line(&json!({ "worker": worker, "records": v }).to_string())?;
        return Ok(0);
    }
    let mut any = false;
    for (from, now) in &moved {
        if *from != now.state {
            any = true;
            report::line(&format!(
                "{}: {} -> {} (evidence {})",
                now.key.id,
                from.as_str(),
                now.state.as_str(),
                ev(now.evidence)
            ))?;
        }
    }
    if !any {
        report::note(&format!(
            "nothing moved ({} unfinished record(s) of worker {worker})",
            moved.len()
        ));
    }
    Ok(0)
}
