//! Managed retained machines (`machine …`, `stop-for-drain`,
//! `resolve`, and `exec` into a managed machine's slot), through the
//! runtime's `machines()` over the store `--store` names (DESIGN.md §5a,
//! C14, C17.3).
//!
//! A managed machine is a record under the scope the execution records
//! use, keyed by the id the user gives; the worker's machine has a name of
//! the controller's choosing (shown as `worker_machine`). Lifecycle
//! requests are versioned: the command reads the record's current version
//! and passes it, re-reading once after a `stale_version` (the controller
//! itself may have written the record meanwhile).

use smolbox_core::Reason;
use std::path::Path;

use serde_json::json;
use smolbox_core::exec::{Command, ExecEvent};
use smolbox_core::managed::controller::Resolution;
use smolbox_core::managed::controller::RunTarget;
use smolbox_core::managed::state::MachineOperation;
use smolbox_core::managed::{MachineRecord, MachineRecordState, RecordKey, RetainedMachineSpec};
use smolbox_core::{Category, Error, Operation};

use crate::args::MachineCmd;
use crate::backend::Backend;
use crate::records::{self, MAX_WAIT_MS, Rt};
use crate::report::{self, Failure};

/// What a managed command needs: the backend, the store, the worker id,
/// and whether the worker outlives this command.
pub(crate) struct Ctx<'a> {
    /// The worker client.
    pub(crate) backend: &'a Backend,
    /// `--store`.
    pub(crate) store: Option<&'a Path>,
    /// The selected worker's id.
    pub(crate) worker: &'a str,
    /// False for the in-process devworker (gone when the command ends).
    pub(crate) persistent: bool,
}

pub(crate) fn needs_persistent(ctx: &Ctx<'_>) -> Result<(), Failure> {
    if ctx.persistent {
        return Ok(());
    }
    Err(no_persistent_worker())
}

/// The refusal of a managed-machine command with no worker that outlives
/// it (exit 2), after a note saying what to do.
pub(crate) fn no_persistent_worker() -> Failure {
    report::note(
        "managed machines need a worker that outlives this command: run `smolbox dev up` \
         (a devworker in the background for this user), or name one with --worker; \
         `smolbox machine --raw …` drives a worker's machines directly",
    );
    Error::validation(Operation::Submit, Reason::ManagedNeedsPersistentWorker).into()
}

/// The worker's name of machine `name` for a direct worker call (`cp`,
/// `logs`): for a managed machine, its recorded incarnation is verified on
/// the worker first, through the runtime (`machines().measurements`: an
/// inspect checked against the recorded creation evidence), so a machine
/// another incarnation now holds under that name is refused with
/// `identity_conflict` and nothing of it is read or written. Any other name
/// is the worker's own.
pub(crate) fn verified_worker_name(ctx: &Ctx<'_>, name: &str) -> Result<String, Failure> {
    let Some(m) = lookup(ctx.store, name)? else {
        return Ok(name.to_owned());
    };
    if m.assignment.is_none() {
        return Err(Error::validation(Operation::Config, Reason::ManagedMachineNotPlaced).into());
    }
    needs_persistent(ctx)?;
    let key = records::key(name)?;
    let (_, rec) = with_rt(ctx, |rt| {
        rt.m_measurements(&key)
            .map_err(|e| claim_note(e.into(), name))
    })?;
    match rec.assignment {
        Some(a) => Ok(a.machine_name),
        None => Err(Error::validation(Operation::Config, Reason::ManagedMachineNotPlaced).into()),
    }
}

/// The execution budget of a managed machine's profile: 12 hours, so a
/// `shell` session (whose length is at most this budget) lasts as long as
/// one on a worker's machine used directly.
const EXECUTION_BUDGET_MS: u64 = 12 * 3_600_000;

/// The retained spec of a managed machine: the worker profile's artifact
/// and budgets, with a 12-hour execution budget (nothing the user chooses
/// yet).
fn spec() -> RetainedMachineSpec {
    let mut t = RunTarget::unverified();
    t.profile.budgets.execution_ms = EXECUTION_BUDGET_MS;
    RetainedMachineSpec {
        artifact: t.artifact,
        profile: t.profile,
        ports: Vec::new(),
        workload: None,
        checkpointable: false,
        network: None,
        guest_paths: None,
    }
}

/// A machine record as JSON (never a command, env or workload argv).
pub(crate) fn machine_json(m: &MachineRecord) -> serde_json::Value {
    let a = m.assignment.as_ref();
    json!({
        "id": m.key.id,
        "scope": m.key.scope,
        "state": m.state.as_str(),
        "operation": m.operation,
        "phase": m.phase,
        "worker": a.map(|a| a.worker_id.clone()),
        "worker_machine": a.map(|a| a.machine_name.clone()),
        "active_execution": m.active_execution.as_ref().map(|k| k.id.clone()),
        "observed": m.observation.as_ref().map(|o| o.state.as_str()),
        "accepted_at_ms": m.accepted_at_ms,
        "updated_at_ms": m.updated_at_ms,
        "resolved_at_ms": m.resolved_at_ms,
        "claim_until_ms": m.claim.as_ref().map(|c| c.until_ms),
        "version": m.version,
        "last_error": m.last_error.as_ref().map(|e| json!({
            "category": e.category,
            "operation": e.operation,
            "evidence": e.evidence,
            "reason": e.reason,
            "at_ms": e.at_ms,
        })),
    })
}

fn print_machine(m: &MachineRecord, json: bool) -> Result<(), Failure> {
    let v = machine_json(m);
    if json {
        return report::line(&v.to_string());
    }
    if let Some(o) = v.as_object() {
        for (k, val) in o {
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

/// The exit code a settled machine means: 0, 3 when it is `unknown`, 8
/// when it is `missing` or in `conflict`.
fn settled_code(m: &MachineRecord) -> i32 {
    match m.state {
        MachineRecordState::Unknown => 3,
        MachineRecordState::Missing | MachineRecordState::Conflict => 8,
        _ => 0,
    }
}

/// Waits until the machine settles (at most 15 minutes).
fn settle(rt: &Rt<'_>, key: &RecordKey) -> Result<MachineRecord, Failure> {
    Ok(rt.m_wait(key, MAX_WAIT_MS)?)
}

/// Most tries of a versioned request (the record re-read before each).
const VERSION_TRIES: u32 = 20;

/// `f(version)` with the record's current version, re-read and tried again
/// after a `stale_version` (at most [`VERSION_TRIES`] times in all, 50 ms
/// apart): the controller of this very command may be writing the record
/// (a due scan finishing an abandoned command), and each refused try
/// changed nothing.
fn versioned<T>(
    rt: &Rt<'_>,
    key: &RecordKey,
    f: impl Fn(u64) -> Result<T, Error>,
) -> Result<T, Failure> {
    let mut tries = 0;
    loop {
        tries += 1;
        let v = rt.m_inspect(key)?.version;
        match f(v) {
            Err(e) if e.category() == Category::StaleVersion && tries < VERSION_TRIES => {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            other => return Ok(other?),
        }
    }
}

/// Runs `f` over a runtime of this worker, shut down afterwards.
pub(crate) fn with_rt<T>(
    ctx: &Ctx<'_>,
    f: impl FnOnce(&Rt<'_>) -> Result<T, Failure>,
) -> Result<T, Failure> {
    let opened = records::open(ctx.store)?;
    let rt = Rt::with_profile(ctx.backend, &opened, ctx.worker)?;
    let out = f(&rt);
    rt.shutdown();
    out
}

/// `machine ls|get` (managed): the store alone (no worker is needed).
pub(crate) fn machine_from_store(
    store: Option<&Path>,
    cmd: &MachineCmd,
    json: bool,
) -> Result<i32, Failure> {
    match cmd {
        MachineCmd::Ls => ls(store, json),
        MachineCmd::Get { name } => {
            let opened = records::open(store)?;
            let m = opened.store.fetch_machine(&records::key(name)?)?;
            print_machine(&m, json)?;
            Ok(0)
        }
        _ => Err(Error::validation(Operation::Config, Reason::MachineActionNeedsAWorker).into()),
    }
}

/// `machine create|start|stop|rm` (managed): versioned requests through
/// the runtime, each waited for until the machine settles.
pub(crate) fn machine(ctx: &Ctx<'_>, cmd: MachineCmd, json: bool) -> Result<i32, Failure> {
    needs_persistent(ctx)?;
    let (name, action) = match cmd {
        MachineCmd::Create {
            name,
            cpus,
            memory,
            no_start,
        } => {
            if cpus.is_some() || memory.is_some() {
                return Err(
                    Error::validation(Operation::Create, Reason::ManagedSizeIsTheProfiles).into(),
                );
            }
            let key = records::key(&name)?;
            return with_rt(ctx, |rt| {
                let (m, existing) = rt.m_create(&key, &spec())?;
                if existing {
                    report::note(&format!(
                        "managed machine {name} already exists ({})",
                        m.state.as_str()
                    ));
                }
                let mut m = settle(rt, &key)?;
                if !no_start && m.state == MachineRecordState::Created {
                    versioned(rt, &key, |v| {
                        rt.m_lifecycle(&key, MachineOperation::Start, v)
                    })
                    .map_err(|f| slot_note(f, &name))?;
                    m = settle(rt, &key)?;
                }
                print_machine(&m, json)?;
                Ok(settled_code(&m))
            });
        }
        MachineCmd::Start { name } => (name, MachineOperation::Start),
        MachineCmd::Stop { name } => (name, MachineOperation::Stop),
        MachineCmd::Rm { name } => (name, MachineOperation::Delete),
        MachineCmd::Ls | MachineCmd::Get { .. } => {
            return machine_from_store(ctx.store, &cmd, json);
        }
    };
    let key = records::key(&name)?;
    with_rt(ctx, |rt| {
        versioned(rt, &key, |v| rt.m_lifecycle(&key, action, v))
            .map_err(|f| slot_note(f, &name))?;
        let m = settle(rt, &key)?;
        print_machine(&m, json)?;
        Ok(settled_code(&m))
    })
}

/// Adds the explanation of a `stale_claim` refusal: another controller
/// (perhaps a killed `smolbox`) holds the machine until its lease ends.
fn claim_note(f: Failure, name: &str) -> Failure {
    if let Failure::Core(e) = &f
        && e.category() == Category::StaleClaim
    {
        report::note(&format!(
            "managed machine {name} is claimed by another controller (a running or killed \
                 smolbox); run this again once its lease ends (`claim_until_ms` of \
                 `smolbox --json machine get {name}`)"
        ));
    }
    f
}

/// Adds the explanation of an `admission_exhausted` refusal.
pub(crate) fn slot_note(f: Failure, name: &str) -> Failure {
    let f = claim_note(f, name);
    if let Failure::Core(e) = &f
        && e.category() == Category::AdmissionExhausted
    {
        report::note(&format!(
            "managed machine {name} is busy: a command holds its slot, or it is not idle \
                 and running (`smolbox machine get {name}` shows which)"
        ));
    }
    f
}

fn ls(store: Option<&Path>, json: bool) -> Result<i32, Failure> {
    let opened = records::open(store)?;
    let mut all = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = opened
            .store
            .list_machines(records::SCOPE, after.as_deref(), 100)?;
        all.extend(page.records);
        match page.next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    if json {
        let v: Vec<_> = all.iter().map(machine_json).collect();
        report::line(&serde_json::Value::Array(v).to_string())?;
        return Ok(0);
    }
    report::line(&format!(
        "{:<28} {:<10} {:<10} {:<28} {:>7}",
        "ID", "STATE", "OPERATION", "SLOT", "VERSION"
    ))?;
    for m in &all {
        let v = machine_json(m);
        report::line(&format!(
            "{:<28} {:<10} {:<10} {:<28} {:>7}",
            m.key.id,
            m.state.as_str(),
            v["operation"].as_str().unwrap_or("-"),
            m.active_execution.as_ref().map_or("-", |k| k.id.as_str()),
            m.version
        ))?;
    }
    Ok(0)
}

/// `stop-for-drain MACHINE`.
pub(crate) fn stop_for_drain(ctx: &Ctx<'_>, name: &str, json: bool) -> Result<i32, Failure> {
    needs_persistent(ctx)?;
    let key = records::key(name)?;
    with_rt(ctx, |rt| {
        let m = versioned(rt, &key, |v| rt.m_stop_for_drain(&key, v))
            .map_err(|f| claim_note(f, name))?;
        if !json {
            report::note(&format!(
                "stop for draining of {name} recorded (the worker shows it {})",
                m.observation.as_ref().map_or("-", |o| o.state.as_str())
            ));
        }
        print_machine(&m, json)?;
        Ok(0)
    })
}

/// `resolve MACHINE --quiesced --stopped|--deleted`.
pub(crate) fn resolve(
    ctx: &Ctx<'_>,
    name: &str,
    quiesced: bool,
    disposition: Resolution,
    json: bool,
) -> Result<i32, Failure> {
    needs_persistent(ctx)?;
    let key = records::key(name)?;
    with_rt(ctx, |rt| {
        let (m, command) = versioned(rt, &key, |v| rt.m_resolve(&key, v, quiesced, disposition))
            .map_err(|f| claim_note(f, name))?;
        if json {
            let mut v = machine_json(&m);
            v["command"] = command
                .as_ref()
                .map_or(serde_json::Value::Null, records::record_json);
            report::line(&v.to_string())?;
            return Ok(0);
        }
        if let Some(c) = &command {
            report::note(&format!(
                "the slot of {name} is released; command {} stays {}",
                c.key.id,
                c.state.as_str()
            ));
        }
        print_machine(&m, json)?;
        Ok(0)
    })
}

/// The managed machine `name`, when the store has one (`None` when the
/// default SQLite store does not exist yet, or positively has none).
pub(crate) fn lookup(store: Option<&Path>, name: &str) -> Result<Option<MachineRecord>, Failure> {
    if let records::Location::Sqlite(db) = records::location(store)?
        && !db.exists()
    {
        return Ok(None);
    }
    let opened = records::open(store)?;
    let Ok(key) = records::key(name) else {
        return Ok(None);
    };
    match opened.store.fetch_machine(&key) {
        Ok(m) => Ok(Some(m)),
        Err(e) if e.category() == Category::NotFound => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// `exec MACHINE -- ARGV…` on a managed machine: the command (with its
/// declared `files`, [`crate::run_files::in_slot`]) goes into its slot
/// under a fresh execution id (printed on stderr) and is waited for; exits
/// with the guest's code (3 when unknown).
pub(crate) fn exec(
    ctx: &Ctx<'_>,
    name: &str,
    cmd: &Command,
    files: &crate::run_files::Files,
    stream: bool,
    json: bool,
) -> Result<i32, Failure> {
    needs_persistent(ctx)?;
    let machine = records::key(name)?;
    let id = crate::commands::fresh_name()?
        .as_str()
        .replacen("sb-", "x-", 1);
    let key = records::key(&id)?;
    if files.any() {
        return crate::run_files::in_slot(ctx, name, &key, cmd, files, stream, json);
    }
    if stream {
        return with_rt(ctx, |rt| {
            report::note(&format!(
                "execution {id} into the slot of managed machine {name} (streamed)"
            ));
            let mut printer = crate::commands::Printer::new(json);
            let out = rt
                .m_run_streamed(&machine, &key, cmd, &mut |e: &ExecEvent| printer.event(e))
                .map_err(|e| slot_note(e.into(), name))?;
            printer.done()?;
            crate::commands::streamed_exit(&out, json)
        });
    }
    with_rt(ctx, |rt| {
        rt.m_submit(&machine, &key, cmd)
            .map_err(|e| slot_note(e.into(), name))?;
        report::note(&format!(
            "execution {id} in the slot of managed machine {name}"
        ));
        let out = loop {
            match rt.wait(&key, MAX_WAIT_MS) {
                Err(e)
                    if e.category() == Category::Expired && e.operation() == Operation::Await => {}
                other => break other,
            }
        };
        records::print_outcome(&out?, json)
    })
}
