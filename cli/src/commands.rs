//! `health`, `machine …`, `exec`, `run` and `logs`, written once over
//! [`Backend`].

use smolbox_core::Reason;
use std::io::Read;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::json;
use smolbox_core::exec::{Command, ExecEvent, ExecOutcome, ExecOutput};
use smolbox_core::managed::ExecutionRecord;
use smolbox_core::managed::controller::{Outcome, Submit};
use smolbox_core::worker::{
    Logs, LogsParams, MachineName, MachineSpec, MachineState, Namespace, Observation, Profile,
};
use smolbox_core::{Category, Error, Evidence, Operation};

use crate::args::{CommandOpts, LogsArgs, MachineCmd, RunArgs};
use crate::backend::{Backend, StreamPiece};
use crate::report::{self, EXIT_CLEANUP, Failure};

/// `health`.
pub(crate) fn health(b: &Backend, json: bool) -> Result<i32, Failure> {
    let h = b.health()?;
    if json {
        report::line(
            &json!({
                "version": h.version,
                "machines_total": h.total,
                "machines_running": h.running,
                "uptime_seconds": h.uptime_seconds,
            })
            .to_string(),
        )?;
    } else {
        let mut text = format!("ok: worker version {}", h.version);
        if let (Some(t), Some(r)) = (h.total, h.running) {
            text.push_str(&format!(", {t} machines ({r} running)"));
        }
        if let Some(u) = h.uptime_seconds {
            text.push_str(&format!(", up {u} s"));
        }
        report::line(&text)?;
    }
    Ok(0)
}

/// `machine …`.
pub(crate) fn machine(b: &Backend, cmd: MachineCmd, json: bool) -> Result<i32, Failure> {
    let profile = b.admit()?;
    match cmd {
        MachineCmd::Create { no_start: true, .. } => {
            return Err(Error::validation(Operation::Create, Reason::NoStartIsManagedOnly).into());
        }
        MachineCmd::Create {
            name, cpus, memory, ..
        } => {
            let d = MachineSpec::default();
            let spec = crate::worker::machine_spec(MachineSpec {
                cpus: cpus.unwrap_or(d.cpus),
                memory_mb: memory.unwrap_or(d.memory_mb),
                ..d
            });
            let obs = b.create(&profile, MachineName::new(&name)?, &spec)?;
            print_observation(&obs, json)?;
        }
        MachineCmd::Ls => {
            let list = b.list(&profile)?;
            if json {
                let all: Vec<_> = list.iter().map(observation_json).collect();
                report::line(&serde_json::Value::Array(all).to_string())?;
            } else {
                report::line(&format!(
                    "{:<32} {:<8} {:>4} {:>7}",
                    "NAME", "STATE", "CPUS", "MEM_MB"
                ))?;
                for o in &list {
                    report::line(&format!(
                        "{:<32} {:<8} {:>4} {:>7}",
                        o.incarnation.name,
                        state_str(o.state),
                        o.incarnation.cpus,
                        o.incarnation.memory_mb
                    ))?;
                }
            }
        }
        MachineCmd::Get { name } => {
            let obs = b.get(&profile, MachineName::new(&name)?)?;
            print_observation(&obs, json)?;
        }
        MachineCmd::Start { name } => {
            let obs = b.start(&profile, MachineName::new(&name)?)?;
            print_observation(&obs, json)?;
        }
        MachineCmd::Stop { name } => {
            let obs = b.stop(&profile, MachineName::new(&name)?)?;
            print_observation(&obs, json)?;
        }
        MachineCmd::Rm { name } => {
            b.delete(MachineName::new(&name)?)?;
            if json {
                report::line(&json!({ "deleted": name }).to_string())?;
            } else {
                report::line(&format!("deleted {name}"))?;
            }
        }
    }
    Ok(0)
}

fn state_str(s: MachineState) -> &'static str {
    match s {
        MachineState::Created => "created",
        MachineState::Running => "running",
        MachineState::Stopped => "stopped",
    }
}

fn observation_json(o: &Observation) -> serde_json::Value {
    json!({
        "name": o.incarnation.name,
        "state": state_str(o.state),
        "cpus": o.incarnation.cpus,
        "memory_mb": o.incarnation.memory_mb,
        "created_at": o.incarnation.created_at,
        "pid": o.pid,
        "image": o.incarnation.image,
    })
}

fn print_observation(o: &Observation, json: bool) -> Result<(), Failure> {
    if json {
        return report::line(&observation_json(o).to_string());
    }
    let mut text = format!(
        "{}: {} ({} cpu, {} MiB)",
        o.incarnation.name,
        state_str(o.state),
        o.incarnation.cpus,
        o.incarnation.memory_mb
    );
    if let Some(pid) = o.pid {
        text.push_str(&format!(", pid {pid}"));
    }
    report::line(&text)
}

/// Builds the guest command from the options.
pub(crate) fn command(opts: &CommandOpts, argv: Vec<String>) -> Result<Command, Failure> {
    let mut cmd = Command::new(argv);
    for pair in &opts.env {
        let Some((k, v)) = pair.split_once('=') else {
            return Err(Error::validation(Operation::CommandSpec, Reason::EnvNotKEqualsV).into());
        };
        cmd = cmd.env(k, v);
    }
    if let Some(w) = &opts.workdir {
        cmd = cmd.workdir(w.clone());
    }
    if let Some(t) = opts.timeout {
        cmd = cmd.timeout_secs(t);
    }
    if let Some(path) = &opts.stdin {
        if opts.stream {
            return Err(Error::validation(Operation::CommandSpec, Reason::StdinWithStream).into());
        }
        let mut bytes = Vec::new();
        let limit = smolbox_core::exec::MAX_STDIN_LEN as u64 + 1;
        let read = if path.as_os_str() == "-" {
            std::io::stdin().lock().take(limit).read_to_end(&mut bytes)
        } else {
            std::fs::File::open(path).and_then(|f| f.take(limit).read_to_end(&mut bytes))
        };
        read.map_err(|e| Failure::local(format!("read stdin file {}", path.display()), &e))?;
        let text = String::from_utf8(bytes)
            .map_err(|_| Error::validation(Operation::CommandSpec, Reason::StdinNotUtf8))?;
        cmd = cmd.stdin(text);
    }
    cmd.validate()?;
    Ok(cmd)
}

/// Runs `cmd` in `machine` and prints its output: buffered (stdout then
/// stderr) or streamed. Returns the guest's exit code.
fn run_command(
    b: &Backend,
    machine: &str,
    cmd: &Command,
    stream: bool,
    json: bool,
) -> Result<i32, Failure> {
    if stream {
        let mut write_failed = None;
        let code = b.exec_stream(machine, cmd, &mut |piece| {
            let written = match (piece, json) {
                // --json: one object per piece on stdout, in arrival order.
                (StreamPiece::Stdout(s), true) => report::line(&json!({ "stdout": s }).to_string()),
                (StreamPiece::Stderr(s), true) => report::line(&json!({ "stderr": s }).to_string()),
                (StreamPiece::Stdout(s), false) => report::out(s.as_bytes()),
                (StreamPiece::Stderr(s), false) => {
                    report::err(s.as_bytes());
                    Ok(())
                }
            };
            if let Err(e) = written {
                write_failed.get_or_insert(e);
            }
        })?;
        if let Some(e) = write_failed {
            return Err(e);
        }
        if json {
            report::line(&json!({ "exit_code": code }).to_string())?;
        }
        return Ok(code);
    }
    match b.exec(machine, cmd)? {
        ExecOutcome::Exited(out) => {
            print_output(&out, json)?;
            Ok(out.exit_code)
        }
        ExecOutcome::Launched(l) => {
            if json {
                report::line(&json!({ "launched_pid": l.pid }).to_string())?;
            } else {
                report::line(&format!("launched pid {}", l.pid))?;
            }
            Ok(0)
        }
    }
}

fn print_output(out: &ExecOutput, json: bool) -> Result<(), Failure> {
    if json {
        return report::line(
            &json!({
                "exit_code": out.exit_code,
                "stdout": String::from_utf8_lossy(&out.stdout),
                "stderr": String::from_utf8_lossy(&out.stderr),
            })
            .to_string(),
        );
    }
    report::out(&out.stdout)?;
    report::err(&out.stderr);
    Ok(())
}

/// `exec MACHINE -- ARGV…`.
pub(crate) fn exec(
    b: &Backend,
    machine: &str,
    opts: &CommandOpts,
    argv: Vec<String>,
    json: bool,
) -> Result<i32, Failure> {
    MachineName::new(machine)?;
    let cmd = command(opts, argv)?;
    run_command(b, machine, &cmd, opts.stream, json)
}

/// `run -- ARGV…`: a fresh machine, the command, the machine removed
/// (whatever the command's outcome). With `--id` of a recorded execution,
/// the recorded one is used (nothing new is created or run); with files
/// or `--detach`, on a disposable machine of the runtime
/// ([`crate::run_files`]).
pub(crate) fn run(
    b: &Backend,
    args: &RunArgs,
    files: &crate::run_files::Files,
    store: Option<&Path>,
    json: bool,
    worker_id: &str,
    persistent: bool,
) -> Result<i32, Failure> {
    let cmd = command(&args.opts, args.argv.clone())?;
    if args.detach && !persistent {
        report::note(
            "--detach needs a persistent worker (--worker, or `smolbox dev up`): the \
             in-process devworker ends with this command, so nothing would run the execution",
        );
        return Err(
            Error::validation(Operation::Submit, Reason::DetachNeedsPersistentWorker).into(),
        );
    }
    let location = crate::records::location(store)?;
    report::note(&format!(
        "recording this execution in {}",
        location.describe()
    ));
    let opened = &crate::records::open_at(&location)?;
    // A recorded disposable execution (a run with files, or detached) is
    // resubmitted the same way: its spec names no machine.
    let disposable = match &args.id {
        Some(id) => crate::records::fetch_opt(opened.store.as_ref(), &crate::records::key(id)?)?
            .is_some_and(|r| crate::records::is_disposable(&r)),
        None => false,
    };
    if args.detach || files.any() || disposable {
        let at = crate::run_files::At {
            location: &location,
            opened,
            worker: worker_id,
        };
        return crate::run_files::run(b, args, &cmd, files, &at, json);
    }
    let stream = args.opts.stream;
    if let Some(id) = &args.id {
        let key = crate::records::key(id)?;
        if let Some(rec) = crate::records::fetch_opt(opened.store.as_ref(), &key)? {
            let submit = crate::records::same_identity(opened, &rec, &cmd)?;
            let again = Again {
                detach: args.detach,
                stream,
            };
            return run_existing(b, opened, worker_id, &rec, submit, again, json);
        }
    }
    let profile = b.admit()?;
    let name = fresh_name()?;
    let id = args.id.clone().unwrap_or_else(|| name.as_str().to_owned());
    b.create(
        &profile,
        name.clone(),
        &crate::worker::machine_spec(MachineSpec::default()),
    )?;
    let guard = if args.keep {
        None
    } else {
        remove_on_interrupt(b, &name)
    };
    let outcome = crate::records::key(&id)
        .and_then(|key| crate::records::submit_for(key, &cmd, worker_id, name.as_str()))
        .and_then(|submit| {
            // The profile admitted for the create goes to the runtime: an
            // extended command's machine is inspected before acceptance.
            let at = (worker_id, Some(profile));
            run_recorded(b, opened, submit, json, at, stream)
        });
    if let Some((handle, fired)) = guard {
        handle.close();
        if fired.load(Ordering::SeqCst) {
            // The interrupt thread removes the machine and exits; the
            // command's failure (it was ended by the removal) is not news.
            loop {
                std::thread::park();
            }
        }
    }
    if args.keep {
        report::note(&format!("kept machine {}", name.as_str()));
        return outcome;
    }
    match b.delete(name.clone()) {
        Ok(()) => outcome,
        Err(e) => {
            // The command's own outcome first, then why cleanup failed.
            let code = match outcome {
                Ok(code) => {
                    report::note(&format!("the command exited with code {code}"));
                    EXIT_CLEANUP
                }
                Err(f) => {
                    f.print();
                    EXIT_CLEANUP
                }
            };
            report::note(&format!("could not remove machine {}", name.as_str()));
            Failure::Core(e).print();
            Ok(code)
        }
    }
}

/// How `run --id` of a recorded execution was asked for.
#[derive(Clone, Copy)]
struct Again {
    detach: bool,
    stream: bool,
}

/// `run --id ID` of an execution already recorded with the same command:
/// a finished one prints its recorded outcome (its output is not stored)
/// and is not run again; an unfinished one on this worker is driven here
/// (or, with `--detach`, left as it is).
fn run_existing(
    b: &Backend,
    opened: &crate::records::Opened,
    worker_id: &str,
    rec: &ExecutionRecord,
    submit: Submit,
    again: Again,
    json: bool,
) -> Result<i32, Failure> {
    let Again { detach, stream } = again;
    let id = rec.key.id.as_str();
    if let Some(code) = crate::records::exit_of(rec) {
        report::note(&format!(
            "execution {id} is already recorded as {} (evidence {}); it is not run again and \
             its output is not stored",
            rec.state.as_str(),
            crate::records::ev(rec.evidence)
        ));
        if json {
            let mut v = crate::records::record_json(rec);
            v["existing"] = json!(true);
            report::line(&v.to_string())?;
        }
        return Ok(code);
    }
    let on_this = rec
        .spec
        .worker_machine
        .as_ref()
        .is_some_and(|w| w.worker_id == worker_id);
    if !on_this {
        report::note(&format!(
            "execution {id} is recorded as {} on another worker; run `smolbox wait {id}` \
             with that worker",
            rec.state.as_str()
        ));
        return Err(Error::validation(Operation::Submit, Reason::RecordOnAnotherWorker).into());
    }
    if detach {
        report::note(&format!(
            "execution {id} is already accepted ({})",
            rec.state.as_str()
        ));
        if json {
            report::line(&json!({ "id": id, "existing": true }).to_string())?;
        } else {
            report::line(id)?;
        }
        return Ok(0);
    }
    // A duplicate: its stored record answers whatever the machine is now,
    // so no profile is admitted for an inspect.
    run_recorded(b, opened, submit, json, (worker_id, None), stream)
}

/// A `run` through the durable record (see [`crate::records`]), buffered
/// or streamed: the guest's exit code when observed; an uncertain outcome
/// is reported as such (exit 3), never guessed. `at`: the worker and, when
/// the caller admitted it, its version profile.
fn run_recorded(
    b: &Backend,
    opened: &crate::records::Opened,
    submit: Submit,
    json: bool,
    at: (&str, Option<Profile>),
    stream: bool,
) -> Result<i32, Failure> {
    let (worker_id, profile) = at;
    if stream {
        let mut printer = Printer::new(json);
        let out = crate::records::run_recorded(
            b,
            opened,
            worker_id,
            profile,
            submit,
            Some(&mut |e: &ExecEvent| printer.event(e)),
        )?;
        printer.done()?;
        return streamed_exit(&out, json);
    }
    let out = crate::records::run_recorded(b, opened, worker_id, profile, submit, None)?;
    if let Some(output) = &out.output {
        print_output(output, json)?;
    } else if let Some(code) = crate::records::output_over_allowance(&out, json) {
        return Ok(code);
    } else if out.record.state.ends_wait() {
        report::note(&format!(
            "execution {} ended as {} before this process observed it: its output is not \
             stored",
            out.record.key.id,
            out.record.state.as_str()
        ));
    }
    match out.exit_code() {
        Some(code) => Ok(code),
        None => match out.error {
            Some(e) => Err(Failure::Core(e)),
            None => match crate::records::exit_of(&out.record) {
                Some(code) if out.record.state != smolbox_core::managed::ExecState::Unknown => {
                    Ok(code)
                }
                _ => Err(Failure::Core(Error::unknown(
                    Operation::Exec,
                    Evidence::DispatchUncertain,
                    Reason::Unspecified,
                ))),
            },
        },
    }
}

/// Prints streamed output as it comes: stdout and stderr as they are, or
/// one JSON object per piece on stdout (`--json`); the first failed write
/// is kept for [`Printer::done`].
pub(crate) struct Printer {
    json: bool,
    failed: Option<Failure>,
}

impl Printer {
    pub(crate) fn new(json: bool) -> Self {
        Self { json, failed: None }
    }

    /// Prints one event (the exit is the record's: not printed here).
    pub(crate) fn event(&mut self, e: &ExecEvent) {
        let written = match (e, self.json) {
            (ExecEvent::Stdout(s), true) => report::line(&json!({ "stdout": s }).to_string()),
            (ExecEvent::Stderr(s), true) => report::line(&json!({ "stderr": s }).to_string()),
            (ExecEvent::Stdout(s), false) => report::out(s.as_bytes()),
            (ExecEvent::Stderr(s), false) => {
                report::err(s.as_bytes());
                Ok(())
            }
            // The exit, or a kind of event this build does not show.
            _ => Ok(()),
        };
        if let Err(f) = written {
            self.failed.get_or_insert(f);
        }
    }

    /// The first write failure, if any.
    pub(crate) fn done(self) -> Result<(), Failure> {
        self.failed.map_or(Ok(()), Err)
    }
}

/// The exit of a streamed recorded run (its output was printed as it
/// came): the guest's code when observed, else what the record means (3
/// for an unknown outcome), or the error that ended it; `--json` adds a
/// last line with the id, state, evidence and exit code.
pub(crate) fn streamed_exit(out: &Outcome, json: bool) -> Result<i32, Failure> {
    let code = match out.exit_code() {
        Some(c) => c,
        None => match (&out.error, crate::records::exit_of(&out.record)) {
            (_, Some(c)) if out.record.state.ends_wait() => c,
            (Some(e), _) => return Err(Failure::Core(*e)),
            _ => 3,
        },
    };
    if out.exit_code().is_none() {
        report::note(&format!(
            "execution {} is {} (evidence {})",
            out.record.key.id,
            out.record.state.as_str(),
            crate::records::ev(out.record.evidence)
        ));
    }
    if json {
        report::line(
            &json!({
                "id": out.record.key.id,
                "state": out.record.state.as_str(),
                "evidence": crate::records::ev(out.record.evidence),
                "exit_code": code,
            })
            .to_string(),
        )?;
    }
    Ok(code)
}

/// Exit code after an interrupt (128 + SIGINT).
const EXIT_INTERRUPTED: i32 = 130;

/// Until the returned handle is closed, Ctrl-C (SIGINT) removes the
/// machine with a client of its own (which also ends the command in it),
/// then exits with 130; the flag says it fired. `None` when the handler
/// cannot be installed (then Ctrl-C leaves the machine behind, as without
/// it).
fn remove_on_interrupt(
    b: &Backend,
    name: &MachineName,
) -> Option<(signal_hook::iterator::Handle, Arc<AtomicBool>)> {
    let mut signals = signal_hook::iterator::Signals::new([signal_hook::consts::SIGINT]).ok()?;
    let handle = signals.handle();
    let (kind, endpoint, name) = (b.kind(), b.endpoint().clone(), name.clone());
    let fired = Arc::new(AtomicBool::new(false));
    let fired_here = Arc::clone(&fired);
    let spawned = std::thread::Builder::new()
        .name("smolbox-interrupt".into())
        .spawn(move || {
            if signals.forever().next().is_none() {
                return; // closed: the command finished first
            }
            fired_here.store(true, Ordering::SeqCst);
            report::note(&format!("interrupted: removing machine {}", name.as_str()));
            let removed = Backend::new(kind, endpoint).and_then(|c| Ok(c.delete(name)?));
            let code = match removed {
                Ok(()) => EXIT_INTERRUPTED,
                Err(f) => {
                    f.print();
                    EXIT_CLEANUP
                }
            };
            std::process::exit(code);
        });
    spawned.ok().map(|_| (handle, fired))
}

/// `sb-` and 20 random base32 characters.
pub(crate) fn fresh_name() -> Result<MachineName, Failure> {
    let ns = Namespace::new("sb")?;
    let mut random = [0u8; 13];
    getrandom::getrandom(&mut random).map_err(|_| {
        Error::unknown(
            Operation::Config,
            Evidence::NotDispatched,
            Reason::NoRandomness,
        )
    })?;
    Ok(ns.generate(random))
}

/// One console line: as is, or `{"line": …}` with `--json`.
fn log_line(l: &str, json: bool) -> Result<(), Failure> {
    if json {
        report::line(&json!({ "line": l }).to_string())
    } else {
        report::line(l)
    }
}

/// `logs MACHINE [-f]`, of the worker's machine `machine` (a managed
/// machine's placed name, see [`crate::machines::verified_worker_name`]).
pub(crate) fn logs(
    b: &Backend,
    machine: &str,
    args: &LogsArgs,
    json: bool,
) -> Result<i32, Failure> {
    let profile = b.admit()?;
    let name = MachineName::new(machine)?;
    let read = |tail: u32| {
        let params = LogsParams {
            tail,
            // A full window of long lines fits.
            allowance: smolbox_core::worker::logs::MAX_ALLOWANCE,
            ..LogsParams::default()
        };
        b.call(&Logs::new(&profile, name.clone(), params)?)
    };
    if !args.follow {
        for l in &read(args.tail)? {
            log_line(l, json)?;
        }
        return Ok(0);
    }
    follow_logs(b, &profile, &name, args.tail, json)
}

/// Lines of overlap a new follow read asks for (`tail`) to find where the
/// previous read stopped: it must reach back past every line the previous
/// read did not deliver (a read ends at its 10,000-event cap with the rest
/// of a burst unread), and leave room under the cap for new lines (at
/// least 5,000 per read).
const REALIGN_TAIL: usize = 5_000;

/// Consecutive follow reads that delivered no line before `logs -f` gives
/// up with the last error.
const MAX_EMPTY_READS: u32 = 3;

/// `logs -f`: the worker's follow read (SSE), one after another. A read
/// ends at its own bounds (10,000 events, the allowance, its timeout) or
/// when the worker ends the body; the next read asks for the last
/// [`REALIGN_TAIL`] lines again and [`Follow`] drops the ones already
/// printed. A definite answer (404, 409 too many followers, 400) ends the
/// command with it.
fn follow_logs(
    b: &Backend,
    profile: &Profile,
    name: &MachineName,
    first_tail: u32,
    json: bool,
) -> Result<i32, Failure> {
    let mut follow = Follow::new(REALIGN_TAIL);
    let mut tail = first_tail;
    let mut empty_reads = 0;
    loop {
        let params = LogsParams {
            tail,
            follow: true,
            allowance: smolbox_core::worker::logs::MAX_ALLOWANCE,
            timeout: Duration::from_millis(smolbox_core::worker::logs::TIMEOUT_MS.1),
        };
        let call = Logs::new(profile, name.clone(), params)?;
        let mut failed: Option<Failure> = None;
        let mut got_line = false;
        let mut on_line = |line: String| {
            got_line = true;
            let (out, gap) = follow.push(line);
            if gap {
                report::note(&format!(
                    "more console lines arrived between two follow reads than the overlap \
                     asked for ({REALIGN_TAIL}): some lines may be missing here"
                ));
            }
            for l in &out {
                if let Err(f) = log_line(l, json) {
                    failed = Some(f);
                    return false;
                }
            }
            true
        };
        let result = b.logs_follow(&call, &mut on_line);
        if let Some(f) = failed {
            return Err(f);
        }
        let again = match &result {
            Ok(()) => true,
            Err(e) => {
                matches!(
                    e.category(),
                    Category::OutputLimit | Category::Expired | Category::Transport
                ) && report::definite_answer(e).is_none()
            }
        };
        if !again {
            return Err(result.err().map_or_else(
                || Error::protocol(Operation::Logs, Reason::FollowEnded).into(),
                Failure::from,
            ));
        }
        empty_reads = if got_line { 0 } else { empty_reads + 1 };
        if empty_reads >= MAX_EMPTY_READS {
            return match result {
                Err(e) => Err(e.into()),
                Ok(()) => Err(Error::protocol(Operation::Logs, Reason::FollowEnded).into()),
            };
        }
        tail = follow.reconnect();
    }
}

/// The lines of a console log followed across reads. It keeps the last
/// `overlap` lines printed; after [`Follow::reconnect`] the next read's
/// first lines repeat some of them, and they are dropped: the smallest
/// slide `d` for which the kept window's `window[d..]` is a prefix of what
/// the new read delivered is taken (exact unless the log repeats a run of
/// identical lines), and decided as soon as the lines seen allow it.
/// When no part of the window reappears (more new lines than the overlap
/// arrived in between, or the log was replaced), every line of the new
/// read is new and a possible gap is reported.
#[derive(Debug)]
pub(crate) struct Follow {
    window: std::collections::VecDeque<String>,
    overlap: usize,
    aligning: Option<Align>,
}

/// A new read being aligned with the window it follows.
#[derive(Debug)]
struct Align {
    window: Vec<String>,
    read: Vec<String>,
    /// Slides still consistent with the lines read so far, ascending.
    slides: Vec<usize>,
}

impl Follow {
    /// A follow that keeps `overlap` lines to realign with.
    pub(crate) fn new(overlap: usize) -> Self {
        Self {
            window: std::collections::VecDeque::new(),
            overlap,
            aligning: None,
        }
    }

    /// A new read starts; returns the `tail` it must ask for (the kept
    /// window's length).
    pub(crate) fn reconnect(&mut self) -> u32 {
        if self.window.is_empty() {
            self.aligning = None;
            return 0;
        }
        let window: Vec<String> = self.window.iter().cloned().collect();
        let slides = (0..window.len()).collect();
        let tail = u32::try_from(window.len()).unwrap_or(u32::MAX);
        self.aligning = Some(Align {
            window,
            read: Vec::new(),
            slides,
        });
        tail
    }

    fn keep(&mut self, line: &str) {
        if self.window.len() == self.overlap {
            self.window.pop_front();
        }
        if self.overlap > 0 {
            self.window.push_back(line.to_owned());
        }
    }

    /// One line from the worker: the lines to print now, and whether lines
    /// may have been missed before them.
    pub(crate) fn push(&mut self, line: String) -> (Vec<String>, bool) {
        let Some(a) = self.aligning.as_mut() else {
            self.keep(&line);
            return (vec![line], false);
        };
        let n = a.read.len();
        let len = a.window.len();
        a.slides
            .retain(|&d| d + n >= len || a.window.get(d + n) == Some(&line));
        a.read.push(line);
        let n = a.read.len();
        let (skip, gap) = match a.slides.first() {
            Some(&d) if len - d <= n => (len - d, false),
            Some(_) => return (Vec::new(), false),
            None => (0, true),
        };
        let fresh: Vec<String> = a.read.split_off(skip);
        self.aligning = None;
        for l in &fresh {
            self.keep(l);
        }
        (fresh, gap)
    }
}

#[cfg(test)]
mod tests {
    use super::Follow;

    fn lines(r: std::ops::Range<u32>) -> Vec<String> {
        r.map(|i| format!("line {i}")).collect()
    }

    /// Feeds `read` after a reconnect; everything printed, and the gaps.
    fn feed(f: &mut Follow, read: Vec<String>) -> (Vec<String>, bool) {
        let mut out = Vec::new();
        let mut gap = false;
        for l in read {
            let (o, g) = f.push(l);
            out.extend(o);
            gap |= g;
        }
        (out, gap)
    }

    #[test]
    fn the_first_read_is_printed_as_it_comes() {
        let mut f = Follow::new(3);
        assert_eq!(feed(&mut f, lines(0..5)), (lines(0..5), false));
        // The window is the last 3 printed.
        assert_eq!(f.reconnect(), 3);
    }

    #[test]
    fn a_new_read_drops_the_repeated_lines_and_prints_the_rest() {
        let mut f = Follow::new(3);
        feed(&mut f, lines(0..5));
        f.reconnect();
        // The worker's tail=3 now starts 2 lines later (2 arrived between
        // the reads), then follows.
        assert_eq!(feed(&mut f, lines(4..9)), (lines(5..9), false));
        // Nothing new in between: the whole history repeats.
        f.reconnect();
        assert_eq!(feed(&mut f, lines(6..9)), (Vec::new(), false));
        assert_eq!(feed(&mut f, lines(9..10)), (lines(9..10), false));
    }

    #[test]
    fn the_decision_waits_only_until_the_lines_allow_it() {
        let mut f = Follow::new(3);
        feed(&mut f, lines(0..3));
        f.reconnect();
        // Lines 0..3 repeat: nothing is printed until the overlap is seen.
        assert_eq!(f.push("line 0".into()), (Vec::new(), false));
        assert_eq!(f.push("line 1".into()), (Vec::new(), false));
        assert_eq!(f.push("line 2".into()), (Vec::new(), false));
        assert_eq!(f.push("line 3".into()), (lines(3..4), false));
    }

    #[test]
    fn more_new_lines_than_the_overlap_is_a_reported_gap() {
        let mut f = Follow::new(3);
        feed(&mut f, lines(0..3));
        f.reconnect();
        let (out, gap) = feed(&mut f, lines(10..13));
        assert_eq!(out, lines(10..13));
        assert!(gap);
    }

    #[test]
    fn nothing_printed_yet_asks_for_no_history() {
        let mut f = Follow::new(3);
        assert_eq!(f.reconnect(), 0);
        assert_eq!(feed(&mut f, lines(0..2)), (lines(0..2), false));
    }

    #[test]
    fn repeated_lines_keep_the_longest_overlap() {
        let mut f = Follow::new(4);
        let x = |n: usize| vec!["x".to_owned(); n];
        feed(&mut f, x(4));
        f.reconnect();
        // Four `x` again then `y`: taken as the same four, `y` is new.
        let mut read = x(4);
        read.push("y".into());
        assert_eq!(feed(&mut f, read), (vec!["y".to_owned()], false));
    }
}
