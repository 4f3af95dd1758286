//! `run --input LOCAL:GUEST_PATH`, `--output GUEST_PATH[:LOCAL]` and
//! `--detach`: runs on a disposable machine the managed runtime creates,
//! stages, runs, collects and deletes (DESIGN.md §5a, features C6.4,
//! C17.2), with the store's artifact directory ([`DirArtifacts`]) holding
//! the declared files' bytes.
//!
//! Every input is read, bounded and hashed before anything is sent (a
//! missing file, too many files, an oversized one or too many bytes in all
//! are refused then, and the message says nothing was sent), then put
//! into the artifact directory under a content-derived reference; the
//! runtime uploads each, reads it back and checks size and digest before
//! the command's dispatch intent is written. Outputs are collected into
//! the artifact directory by the runtime (size and digest recorded, never
//! bytes); this process then reads each back, checks it against the
//! recorded digest, and writes it to its local file through a temporary
//! file in the target's directory and a rename.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::json;
use smolbox_core::exec::{Command, ExecEvent};
use smolbox_core::managed::controller::{Outcome, RunTarget, Submit, spec_for};
use smolbox_core::managed::spec::{InputFile, MAX_BASE_PER_FILE, MAX_FILES, OutputFile};
use smolbox_core::managed::{ExecState, ExecutionRecord, RecordKey};
use smolbox_core::worker::GuestPath;
use smolbox_core::{Error, Evidence, Operation, Reason};
use smolbox_store::artifacts::{DirArtifacts, sha256_hex};

use crate::args::RunArgs;
use crate::backend::Backend;
use crate::records::{self, Opened, Rt, SCOPE};
use crate::report::{self, Failure};

/// Each file's budget: the profile's per-file maximum `run` declares.
pub(crate) const PER_FILE: u64 = MAX_BASE_PER_FILE;
/// All inputs together, and all outputs' maxima together (C6.3's default
/// per-direction aggregate, which the runtime applies).
pub(crate) const AGGREGATE: u64 = 4 * 1_048_576;

/// One input, read and hashed.
struct Input {
    local: PathBuf,
    file: InputFile,
    bytes: Vec<u8>,
}

/// One output and where it goes locally (`None` with `--detach`).
struct Output {
    file: OutputFile,
    local: Option<PathBuf>,
}

/// The declared files of a `run`, checked and read before anything is
/// sent.
#[derive(Default)]
pub(crate) struct Files {
    inputs: Vec<Input>,
    outputs: Vec<Output>,
}

impl Files {
    /// Whether the run declares any file.
    pub(crate) fn any(&self) -> bool {
        !self.inputs.is_empty() || !self.outputs.is_empty()
    }
}

/// A refusal before anything was sent, said so on stderr.
fn refused(e: Error) -> Failure {
    report::note("nothing was sent to the worker");
    Failure::Core(e)
}

/// `exec --input/--output` on a machine that is not a managed one: files
/// go only into a managed machine's slot (nothing was sent).
pub(crate) fn not_managed() -> Failure {
    refused(Error::validation(
        Operation::Submit,
        Reason::ExecFilesNeedManagedMachine,
    ))
}

fn syntax() -> Failure {
    refused(Error::validation(Operation::Submit, Reason::FileFlagSyntax))
}

fn guest(path: &str) -> Result<String, Failure> {
    GuestPath::new(path).map_err(|e| refused(e.with_operation(Operation::Submit)))?;
    Ok(path.to_owned())
}

/// Reads `local`: a regular file of at most [`PER_FILE`] bytes.
fn read_local(local: &Path) -> Result<Vec<u8>, Failure> {
    let doing = || {
        format!(
            "read input {} (nothing was sent to the worker)",
            local.display()
        )
    };
    let f = std::fs::File::open(local).map_err(|e| Failure::local(doing(), &e))?;
    let meta = f.metadata().map_err(|e| Failure::local(doing(), &e))?;
    if !meta.is_file() {
        return Err(refused(Error::validation(
            Operation::Submit,
            Reason::FileNotRegular,
        )));
    }
    let mut bytes = Vec::new();
    f.take(PER_FILE + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Failure::local(doing(), &e))?;
    let size = (bytes.len() as u64).max(meta.len());
    if size > PER_FILE {
        return Err(refused(
            Error::validation(Operation::Submit, Reason::InputOverPerFile)
                .with_limit(size, PER_FILE),
        ));
    }
    Ok(bytes)
}

/// Where output `guest` goes: `local`, or inside it when it is a
/// directory; without `local`, the guest file's name here.
fn local_target(guest: &str, local: Option<&str>) -> Result<PathBuf, Failure> {
    let base = guest.rsplit('/').next().unwrap_or_default();
    let p = match local {
        Some(l) => {
            let l = PathBuf::from(l);
            if l.is_dir() { l.join(base) } else { l }
        }
        None => PathBuf::from(base),
    };
    std::path::absolute(&p).map_err(|e| Failure::local(format!("resolve {}", p.display()), &e))
}

/// Parses and checks `--input`/`--output`/`--output-max` and reads every
/// input, all before any worker request.
///
/// # Errors
/// `validation` (exit 2; the flag's shape, a guest path, more than 32
/// files a direction, a file over 1 MiB, over 4 MiB in all, a duplicate
/// guest or local path, a local output with `--detach`); a local failure
/// (exit 1) for an input that cannot be read. Each says nothing was sent.
pub(crate) fn prepare(args: &RunArgs) -> Result<Files, Failure> {
    prepare_flags(&Flags {
        inputs: &args.inputs,
        outputs: &args.outputs,
        output_max: args.output_max,
        detach: args.detach,
    })
}

/// The file flags of `run` or `exec`.
pub(crate) struct Flags<'a> {
    /// `--input` values.
    pub(crate) inputs: &'a [String],
    /// `--output` values.
    pub(crate) outputs: &'a [String],
    /// `--output-max`.
    pub(crate) output_max: Option<u64>,
    /// `--detach` (outputs stay in the artifact directory).
    pub(crate) detach: bool,
}

/// [`prepare`] for `exec MACHINE` with files (a managed machine's slot):
/// the same checks, done before any worker request.
///
/// # Errors
/// As [`prepare`].
pub(crate) fn prepare_exec(args: &crate::args::ExecArgs) -> Result<Files, Failure> {
    prepare_flags(&Flags {
        inputs: &args.inputs,
        outputs: &args.outputs,
        output_max: args.output_max,
        detach: false,
    })
}

fn prepare_flags(args: &Flags<'_>) -> Result<Files, Failure> {
    let too_many = |n: usize| {
        refused(
            Error::validation(Operation::Submit, Reason::TooManyFiles)
                .with_limit(n as u64, MAX_FILES as u64),
        )
    };
    if args.inputs.len() > MAX_FILES {
        return Err(too_many(args.inputs.len()));
    }
    if args.outputs.len() > MAX_FILES {
        return Err(too_many(args.outputs.len()));
    }
    let mut parsed = Vec::new();
    for raw in args.inputs {
        let Some((local, path)) = raw.rsplit_once(':') else {
            return Err(syntax());
        };
        if local.is_empty() {
            return Err(syntax());
        }
        parsed.push((PathBuf::from(local), guest(path)?));
    }
    parsed.sort_by(|a, b| a.1.cmp(&b.1));
    if parsed.windows(2).any(|w| w[0].1 == w[1].1) {
        return Err(refused(Error::validation(
            Operation::Submit,
            Reason::FilesNotSortedUnique,
        )));
    }
    let mut inputs = Vec::new();
    let mut sum = 0u64;
    for (i, (local, path)) in parsed.into_iter().enumerate() {
        let bytes = read_local(&local)?;
        sum += bytes.len() as u64;
        if sum > AGGREGATE {
            return Err(refused(
                Error::validation(Operation::Submit, Reason::ManifestOverAggregate)
                    .with_limit(sum, AGGREGATE),
            ));
        }
        let sha256 = sha256_hex(&bytes);
        let file = InputFile {
            path,
            source: format!("in{i:02}-{sha256}"),
            sha256,
            size: bytes.len() as u64,
        };
        inputs.push(Input { local, file, bytes });
    }
    let n = args.outputs.len() as u64;
    let max_size = match args.output_max {
        Some(m) => m,
        None if n > 0 => PER_FILE.min(AGGREGATE / n),
        None => PER_FILE,
    };
    if !(1..=PER_FILE).contains(&max_size) {
        return Err(refused(
            Error::validation(Operation::Submit, Reason::OutputMaxRange)
                .with_limit(max_size, PER_FILE),
        ));
    }
    if max_size.saturating_mul(n) > AGGREGATE {
        return Err(refused(
            Error::validation(Operation::Submit, Reason::ManifestOverAggregate)
                .with_limit(max_size.saturating_mul(n), AGGREGATE),
        ));
    }
    let mut outs = Vec::new();
    for raw in args.outputs {
        let (path, local) = match raw.split_once(':') {
            Some((p, l)) if !l.is_empty() => (p, Some(l)),
            Some(_) => return Err(syntax()),
            None => (raw.as_str(), None),
        };
        let path = guest(path)?;
        let local = match (local, args.detach) {
            (Some(_), true) => {
                return Err(refused(Error::validation(
                    Operation::Submit,
                    Reason::DetachOutputLocal,
                )));
            }
            (_, true) => None,
            (l, false) => Some(local_target(&path, l)?),
        };
        outs.push((path, local));
    }
    outs.sort_by(|a, b| a.0.cmp(&b.0));
    if outs.windows(2).any(|w| w[0].0 == w[1].0) {
        return Err(refused(Error::validation(
            Operation::Submit,
            Reason::FilesNotSortedUnique,
        )));
    }
    let mut locals: Vec<&PathBuf> = outs.iter().filter_map(|o| o.1.as_ref()).collect();
    locals.sort();
    if locals.windows(2).any(|w| w[0] == w[1]) {
        return Err(refused(Error::validation(
            Operation::Submit,
            Reason::OutputLocalDuplicate,
        )));
    }
    let outputs = outs
        .into_iter()
        .enumerate()
        .map(|(i, (path, local))| Output {
            file: OutputFile {
                path,
                destination: format!("out{i:02}"),
                max_size,
            },
            local,
        })
        .collect();
    Ok(Files { inputs, outputs })
}

/// The disposable spec of `cmd` with `files`, submitted under `key`;
/// every input put into `artifacts` first (a local write: nothing is sent).
fn submit_of(
    key: RecordKey,
    cmd: &Command,
    worker: &str,
    files: &Files,
    artifacts: &DirArtifacts,
) -> Result<Submit, Failure> {
    // The machine name is a placeholder: a disposable spec names none.
    let mut spec = spec_for(cmd, &RunTarget::unverified().fitting(cmd), worker, "x")?;
    spec.worker_machine = None;
    keep_inputs(files, artifacts)?;
    spec.inputs = files.inputs.iter().map(|i| i.file.clone()).collect();
    spec.outputs = files.outputs.iter().map(|o| o.file.clone()).collect();
    Ok(Submit { key, spec })
}

/// Puts every input into `artifacts` (a local write: nothing is sent).
fn keep_inputs(files: &Files, artifacts: &DirArtifacts) -> Result<(), Failure> {
    for i in &files.inputs {
        artifacts
            .insert(SCOPE, &i.file.source, &i.bytes)
            .map_err(|e| {
                report::note(&format!(
                    "could not keep input {} in the artifact directory; nothing was sent",
                    i.local.display()
                ));
                Failure::Core(e)
            })?;
    }
    Ok(())
}

/// `exec MACHINE` with files on a managed machine: the command and its
/// declared files go into the machine's slot under `key` (the runtime
/// stages the inputs inside the slot before the dispatch intent and
/// collects the outputs after the exit, issue 12); waited for; each
/// collected output is written to its local file as for `run`. Exits with
/// the guest's code (a failed collection keeps it).
pub(crate) fn in_slot(
    ctx: &crate::machines::Ctx<'_>,
    name: &str,
    key: &RecordKey,
    cmd: &Command,
    files: &Files,
    stream: bool,
    json: bool,
) -> Result<i32, Failure> {
    let machine = records::key(name)?;
    let location = records::location(ctx.store)?;
    let artifacts = records::artifacts_at(&location)?;
    keep_inputs(files, &artifacts)?;
    let declared = smolbox_core::managed::CommandFiles {
        inputs: files.inputs.iter().map(|i| i.file.clone()).collect(),
        outputs: files.outputs.iter().map(|o| o.file.clone()).collect(),
    };
    let opened = records::open(ctx.store)?;
    let rt = Rt::with_files(ctx.backend, &opened, ctx.worker, Arc::clone(&artifacts))?;
    let out = (|| {
        if stream {
            report::note(&format!(
                "execution {} into the slot of managed machine {name} (streamed)",
                key.id
            ));
            let mut printer = crate::commands::Printer::new(json);
            let out = rt
                .m_run_streamed_files(&machine, key, cmd, &declared, &mut |e: &ExecEvent| {
                    printer.event(e);
                })
                .map_err(|e| crate::machines::slot_note(e.into(), name));
            printer.done()?;
            return out;
        }
        rt.m_submit_files(&machine, key, cmd, &declared)
            .map_err(|e| crate::machines::slot_note(e.into(), name))?;
        report::note(&format!(
            "execution {} in the slot of managed machine {name}",
            key.id
        ));
        loop {
            match rt.wait(key, records::MAX_WAIT_MS) {
                Err(e)
                    if e.category() == smolbox_core::Category::Expired
                        && e.operation() == Operation::Await => {}
                other => break other.map_err(Failure::from),
            }
        }
    })();
    rt.shutdown();
    let out = out?;
    let delivered = deliver(&artifacts, &out.record, files)?;
    finish(&out, &delivered, stream, json)
}

/// A fresh execution id for a run without `--id`: `run-` and 20 random
/// base32 characters.
fn fresh_id() -> Result<String, Failure> {
    Ok(crate::commands::fresh_name()?
        .as_str()
        .replacen("sb-", "run-", 1))
}

/// Where a run is recorded and sent.
pub(crate) struct At<'a> {
    /// The store's location (the artifact directory is beside it).
    pub(crate) location: &'a records::Location,
    /// The opened store.
    pub(crate) opened: &'a Opened,
    /// The worker id.
    pub(crate) worker: &'a str,
}

/// `run` with files or `--detach`: on a disposable machine of the runtime.
pub(crate) fn run(
    b: &Backend,
    args: &RunArgs,
    cmd: &Command,
    files: &Files,
    at: &At<'_>,
    json: bool,
) -> Result<i32, Failure> {
    let At {
        location,
        opened,
        worker,
    } = *at;
    let artifacts = records::artifacts_at(location)?;
    let id = match &args.id {
        Some(id) => id.clone(),
        None => fresh_id()?,
    };
    let key = records::key(&id)?;
    let submit = submit_of(key.clone(), cmd, worker, files, &artifacts)?;
    if args.detach {
        let profile = b.admit()?;
        let existing = records::accept_only(opened, worker, Some(profile), submit)?;
        report::note(&format!(
            "accepted execution {id}; `smolbox wait {id}` runs it on a disposable machine and \
             waits for its end (the machine is deleted once it settles)"
        ));
        if json {
            report::line(&json!({ "id": id, "existing": existing }).to_string())?;
        } else {
            report::line(&id)?;
        }
        return Ok(0);
    }
    let rt = Rt::with_files(b, opened, worker, Arc::clone(&artifacts))?;
    let out = if args.opts.stream {
        let mut printer = crate::commands::Printer::new(json);
        let out = rt.run_streamed(submit, &mut |e: &ExecEvent| printer.event(e));
        if let Err(f) = printer.done() {
            rt.shutdown();
            return Err(f);
        }
        out
    } else {
        rt.run(submit)
    };
    let out = match out {
        Ok(mut o) => {
            if o.record.state.ends_wait() {
                match records::settle_cleanup(&rt, opened.store.as_ref(), &key) {
                    Ok(rec) => o.record = rec,
                    Err(f) => {
                        rt.shutdown();
                        return Err(f);
                    }
                }
            }
            o
        }
        Err(e) => {
            rt.shutdown();
            return Err(e.into());
        }
    };
    rt.shutdown();
    let delivered = deliver(&artifacts, &out.record, files)?;
    finish(&out, &delivered, args.opts.stream, json)
}

/// One output written locally.
struct Delivered {
    path: String,
    local: PathBuf,
    size: u64,
    sha256: String,
}

/// Writes each collected output of `rec` to its local file: read back
/// from the artifact directory, checked against the recorded size and
/// digest, then written through a temporary file and a rename.
fn deliver(
    artifacts: &DirArtifacts,
    rec: &ExecutionRecord,
    files: &Files,
) -> Result<Vec<Delivered>, Failure> {
    let mut done = Vec::new();
    for o in &files.outputs {
        let Some(local) = &o.local else { continue };
        let Some(a) = rec.artifacts.iter().find(|a| a.path == o.file.path) else {
            continue; // not collected: the record says why
        };
        let Some((sha256, bytes)) = artifacts.output(&rec.key, &a.destination)? else {
            return Err(Failure::Core(Error::not_found(
                Operation::Download,
                Evidence::NotDispatched,
                Reason::ArtifactMissing,
            )));
        };
        if sha256 != a.sha256 || bytes.len() as u64 != a.size {
            return Err(Failure::Core(Error::validation(
                Operation::Download,
                Reason::ArtifactDigestMismatch,
            )));
        }
        crate::files::write_then_rename(local, &bytes)?;
        done.push(Delivered {
            path: a.path.clone(),
            local: local.clone(),
            size: a.size,
            sha256,
        });
    }
    Ok(done)
}

/// Prints the run's output, outputs and outcome; its exit code: the
/// guest's, or the collection's failure when the guest exited 0.
fn finish(
    out: &Outcome,
    delivered: &[Delivered],
    stream: bool,
    json: bool,
) -> Result<i32, Failure> {
    let rec = &out.record;
    let collection_failed = rec.state == ExecState::CollectionFailed;
    if json {
        let mut v = records::record_json(rec);
        if let Some(o) = out.output.as_ref().filter(|_| !stream) {
            v["stdout"] = json!(String::from_utf8_lossy(&o.stdout));
            v["stderr"] = json!(String::from_utf8_lossy(&o.stderr));
        }
        v["delivered"] = delivered
            .iter()
            .map(|d| {
                json!({
                    "path": d.path,
                    "local": d.local.display().to_string(),
                    "size": d.size,
                    "sha256": d.sha256,
                })
            })
            .collect();
        report::line(&v.to_string())?;
    } else {
        if let Some(o) = out.output.as_ref().filter(|_| !stream) {
            report::out(&o.stdout)?;
            report::err(&o.stderr);
        }
        if out.output.is_none() && !stream && rec.state.ends_wait() {
            report::note(&format!(
                "execution {} is recorded as {} (evidence {}); it was not run again here and \
                 its output is not stored",
                rec.key.id,
                rec.state.as_str(),
                records::ev(rec.evidence)
            ));
        }
        for d in delivered {
            report::note(&format!(
                "output {} -> {} ({} bytes, sha256 {})",
                d.path,
                d.local.display(),
                d.size,
                d.sha256
            ));
        }
    }
    // The guest's code when it exited; else what ended it (a staging
    // failure, a cancel, an uncertain dispatch), as `run` reports it.
    let code = match out.exit_code() {
        Some(c) => c,
        None => match (&out.error, records::exit_of(rec)) {
            (Some(e), _) => return Err(Failure::Core(*e)),
            (None, Some(c)) if rec.state != ExecState::Unknown => c,
            (None, _) => {
                return Err(Failure::Core(Error::unknown(
                    Operation::Exec,
                    Evidence::DispatchUncertain,
                    Reason::Unspecified,
                )));
            }
        },
    };
    if collection_failed {
        report::note(&format!(
            "execution {} exited with code {code} but its outputs were not all collected \
             (collection {})",
            rec.key.id,
            json!(rec.collection).as_str().unwrap_or("-")
        ));
        if code == 0 {
            // The collection's own error (the outcome carries it).
            let e = out
                .error
                .unwrap_or_else(|| Error::protocol(Operation::Download, Reason::Unspecified));
            return Err(Failure::Core(e));
        }
    }
    Ok(code)
}
