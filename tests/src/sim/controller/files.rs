//! Files and background launches in the driver (session 6): the caller's
//! artifact store (input sources) and the collected outputs, the
//! translation of the controller's `Upload`/`Download` ops into worker
//! requests, the workload's file plan, and the rules checked at the end of
//! a seed:
//!
//! - every input is staged (its declared digest is what the command read)
//!   before the exec; no upload reaches a path a running command read (the
//!   worker reports that one, the simulated worker's `files.rs`);
//! - a command runs at most once (the worker's exec count, unchanged);
//! - a confirmed exit is never lost, also when collection fails: a
//!   `collection_failed` record holds the command's real exit;
//! - a `completed` record's artifacts are what the command wrote, and the
//!   artifact store holds those bytes;
//! - `launched` never becomes an exit: a background command's record never
//!   holds an exit or reaches `collecting`/`completed`, and `launched` is
//!   stored only for a launch that really reached the worker.
//!
//! Decisions come from their own random stream (`Rng::fork(seed, 20)`), so
//! the schedules of seeds without files are unchanged.

use smolbox_core::exec::Command;
use smolbox_core::managed::record::ExecResult;
use smolbox_core::managed::spec::{InputFile, OutputFile};
use smolbox_core::managed::{ExecState, RecordKey};
use smolbox_core::{Category, Error, Evidence, Operation, Reason};
use smolbox_store::Store;
use std::collections::BTreeMap;

use super::super::Bug;
use super::super::rng::Rng;
use super::super::worker::{self, Reply, Request, output_content, sha256_hex};
use super::{OpId, ReqTo, Sim, StoreOp, WorkerOp};

/// The driver's files state.
#[derive(Debug)]
pub(super) struct SimFiles {
    rng: Rng,
    /// Jobs may declare inputs (`Options::inputs`).
    inputs: bool,
    /// The caller's artifact store: `(scope, source)` → bytes.
    sources: BTreeMap<(String, String), Vec<u8>>,
    /// Collected outputs: `(record key, destination)` → bytes (immutable).
    outputs: BTreeMap<(RecordKey, String), Vec<u8>>,
    /// Downloads in flight that store an output: request → destination.
    downloads: BTreeMap<u64, (RecordKey, String)>,
    /// Retained slot commands launched in the background (decided once).
    background: BTreeMap<RecordKey, bool>,
    /// Probe counts: inputs staged, outputs collected, launches.
    pub(super) counts: BTreeMap<&'static str, u64>,
}

impl SimFiles {
    pub(super) fn new(seed: u64, inputs: bool) -> Self {
        Self {
            rng: Rng::fork(seed, 20),
            inputs,
            sources: BTreeMap::new(),
            outputs: BTreeMap::new(),
            downloads: BTreeMap::new(),
            background: BTreeMap::new(),
            counts: BTreeMap::new(),
        }
    }

    /// A named job's files (30 % inputs when on, 30 % outputs, 1–2 each; one
    /// output in ten with a bound below what the command writes, so its
    /// collection fails): the output paths are appended to `argv` (the
    /// command writes them at its exit).
    pub(super) fn plan(
        &mut self,
        id: &str,
        argv: &mut Vec<String>,
    ) -> (Vec<InputFile>, Vec<OutputFile>) {
        let mut inputs = Vec::new();
        let mut outputs = Vec::new();
        // The chance is drawn either way (fewer shifted draws).
        if self.rng.chance(300) && self.inputs {
            for n in 0..self.rng.range(1, 2) {
                let bytes = format!("input {n} of {id}").into_bytes();
                let source = format!("src-{id}-{n}");
                inputs.push(InputFile {
                    path: format!("/workspace/{id}/in{n}"),
                    source: source.clone(),
                    sha256: sha256_hex(&bytes),
                    size: bytes.len() as u64,
                });
                self.sources.insert(("sim".to_owned(), source), bytes);
            }
        }
        if self.rng.chance(300) {
            for n in 0..self.rng.range(1, 2) {
                let path = format!("/workspace/{id}/out{n}");
                argv.push(path.clone());
                let max_size = if self.rng.chance(100) { 4 } else { 256 };
                outputs.push(OutputFile {
                    path,
                    destination: format!("dst-{id}-{n}"),
                    max_size,
                });
            }
        }
        (inputs, outputs)
    }

    /// Whether retained slot command `key` is a background launch (15 %,
    /// decided at its first submission and kept for every resubmission).
    /// On by default since session 7 (finding 13 was the simulated
    /// worker's: a launch on a machine that was not running "ran");
    /// `SMOLBOX_SIM_LAUNCHES=0` turns launches off (the draw is not made
    /// then, as before session 7).
    pub(super) fn background(&mut self, key: &RecordKey) -> bool {
        if let Some(b) = self.background.get(key) {
            return *b;
        }
        let b = launches_on() && self.rng.chance(150);
        self.background.insert(key.clone(), b);
        b
    }
}

/// Background launches in the retained run: on unless
/// `SMOLBOX_SIM_LAUNCHES=0`.
pub fn launches_on() -> bool {
    std::env::var("SMOLBOX_SIM_LAUNCHES").map_or(true, |v| v.trim() != "0")
}

impl Sim {
    /// A retained slot command, in the background when the plan says so.
    pub(super) fn slot_command(&mut self, key: &RecordKey, argv: Vec<String>) -> Command {
        let bg = self.files.background(key);
        Command::new(argv).background(bg)
    }

    /// Sends an `Upload` or `Download` op of controller `h` to the worker.
    pub(super) fn file_op(&mut self, h: usize, id: OpId, op: &WorkerOp) {
        let (request, store) = match op {
            WorkerOp::Upload {
                name,
                path,
                scope,
                source,
                sha256,
                size,
                ..
            } => {
                let bytes = self
                    .files
                    .sources
                    .get(&(scope.clone(), source.clone()))
                    .cloned();
                let Some(bytes) =
                    bytes.filter(|b| b.len() as u64 == *size && sha256_hex(b) == *sha256)
                else {
                    self.violation(format!(
                        "an upload of {source}, which is not the declared input"
                    ));
                    return;
                };
                *self.files.counts.entry("upload").or_insert(0) += 1;
                let request = Request::Upload {
                    machine: name.as_str().to_owned(),
                    path: path.as_str().to_owned(),
                    bytes,
                };
                (request, None)
            }
            WorkerOp::Download {
                name,
                path,
                max_bytes,
                store,
                ..
            } => {
                *self.files.counts.entry("download").or_insert(0) += 1;
                let request = Request::Download {
                    machine: name.as_str().to_owned(),
                    path: path.as_str().to_owned(),
                    max_bytes: *max_bytes,
                };
                (request, store.clone())
            }
            _ => return,
        };
        if self.crash_point(h, "worker_before_send") {
            return;
        }
        let req = self.next_req;
        self.next_req += 1;
        self.reqs.insert(req, (ReqTo::Op(h, id), None));
        if let Some(dest) = store {
            self.files.downloads.insert(req, dest);
        }
        self.log(format!("{} sends {}", Self::owner(h), describe(&request)));
        let now = self.now();
        if let Err(e) = self.worker.send(now, req, request) {
            self.at(now + 1, super::Ev::WorkerReply(h, id, req, Err(e)));
        }
        self.crash_point(h, "worker_after_send");
    }

    /// Planted [`Bug::UploadAfterIntent`]: when the exec of `key` goes out
    /// (after its dispatch intent), each of its inputs is uploaded again
    /// to `machine` (the reply goes nowhere). Caught when the upload lands
    /// while the command, which read the path, runs.
    pub(super) fn plant_upload_after_intent(&mut self, key: &RecordKey, machine: &str) {
        if self.opts.bug != Some(Bug::UploadAfterIntent) {
            return;
        }
        let Some(job) = self.jobs.iter().find(|j| j.key == *key) else {
            return;
        };
        for i in job.spec.inputs.clone() {
            let source = (key.scope.clone(), i.source.clone());
            let Some(bytes) = self.files.sources.get(&source).cloned() else {
                continue;
            };
            let req = self.next_req;
            self.next_req += 1;
            self.log(format!(
                "planted: upload {machine}:{} after the intent",
                i.path
            ));
            let request = Request::Upload {
                machine: machine.to_owned(),
                path: i.path,
                bytes,
            };
            let now = self.now();
            let _ = self.worker.send(now, req, request);
        }
    }

    /// Planted [`Bug::WrongOutputDigest`]: a write that records collected
    /// artifacts records the first one's digest with its first hex digit
    /// changed.
    pub(super) fn plant_on_file_write(&mut self, op: &mut StoreOp) {
        if self.opts.bug != Some(Bug::WrongOutputDigest) {
            return;
        }
        if let StoreOp::Write { patch, .. } = op
            && let Some(a) = patch.artifacts.as_mut().and_then(|v| v.first_mut())
        {
            let digit = if a.sha256.starts_with('0') { "1" } else { "0" };
            a.sha256.replace_range(0..1, digit);
        }
    }

    /// A download that collects an output puts its bytes into the artifact
    /// store before the controller hears of it (as the shells do); a put
    /// under a key that holds other bytes is refused (C6.5), the original
    /// kept.
    pub(super) fn collected(&mut self, req: u64, r: Result<Reply, Error>) -> Result<Reply, Error> {
        let Some(dest) = self.files.downloads.remove(&req) else {
            return r;
        };
        let Ok(Reply::Downloaded(bytes)) = &r else {
            return r;
        };
        match self.files.outputs.get(&dest) {
            Some(b) if b != bytes => Err(Error::identity_conflict(
                Operation::Download,
                Evidence::NotDispatched,
                Reason::Unspecified,
            )),
            _ => {
                self.files.outputs.insert(dest, bytes.clone());
                *self.files.counts.entry("output_stored").or_insert(0) += 1;
                r
            }
        }
    }

    /// The end-of-seed rules of files and launches (module docs).
    pub(super) fn check_files(&mut self) {
        let mut found = Vec::new();
        let jobs: Vec<(RecordKey, Vec<InputFile>, Vec<OutputFile>)> = self
            .jobs
            .iter()
            .map(|j| (j.key.clone(), j.spec.inputs.clone(), j.spec.outputs.clone()))
            .collect();
        let background: Vec<(RecordKey, bool)> = self
            .files
            .background
            .iter()
            .map(|(k, b)| (k.clone(), *b))
            .collect();
        let fetch = |s: &Self, k: &RecordKey| match s.store.inner().fetch(k) {
            Ok(r) => Some(r),
            Err(e) if e.category() == Category::NotFound => None,
            Err(_) => None,
        };
        for (key, inputs, outputs) in jobs {
            let ran = self.worker.exec_files(&key.id).cloned();
            if let Some(f) = &ran {
                for i in &inputs {
                    if f.read.get(&i.path) != Some(&i.sha256) {
                        found.push(format!(
                            "{}/{}: the command ran without its input {} staged (C6.4)",
                            key.scope, key.id, i.path
                        ));
                    }
                }
            }
            let Some(rec) = fetch(self, &key) else {
                continue;
            };
            let real = match self.worker.exec_truth(&key.id) {
                Some(worker::ExecTruth::Exited(c)) => Some(*c),
                _ => None,
            };
            let stored = match &rec.result {
                Some(ExecResult::Exited { exit_code, .. }) => Some(*exit_code),
                _ => None,
            };
            if rec.state == ExecState::CollectionFailed {
                *self.files.counts.entry("collection_failed").or_insert(0) += 1;
                if stored.is_none() || stored != real {
                    found.push(format!(
                        "{}/{}: collection failed and the confirmed exit is not kept (stored {stored:?}, real {real:?})",
                        key.scope, key.id
                    ));
                }
            }
            if rec.state == ExecState::Completed && !outputs.is_empty() {
                *self.files.counts.entry("outputs_completed").or_insert(0) += 1;
                let arts = rec.artifacts.clone();
                for o in &outputs {
                    let want = stored.map(|c| output_content(&key.id, &o.path, c));
                    let art = arts.iter().find(|a| a.destination == o.destination);
                    let held = self
                        .files
                        .outputs
                        .get(&(key.clone(), o.destination.clone()));
                    let ok = want.as_ref().is_some_and(|w| {
                        art.is_some_and(|a| a.sha256 == sha256_hex(w) && a.size == w.len() as u64)
                            && held == Some(w)
                    });
                    if !ok {
                        found.push(format!(
                            "{}/{}: completed, but output {} is not what the command wrote",
                            key.scope, key.id, o.path
                        ));
                    }
                }
            }
        }
        for (key, bg) in background {
            let Some(rec) = fetch(self, &key) else {
                continue;
            };
            let launched = self
                .worker
                .exec_files(&key.id)
                .is_some_and(|f| f.background);
            if bg && rec.state == ExecState::Launched {
                *self.files.counts.entry("launched").or_insert(0) += 1;
            }
            let exit = matches!(rec.result, Some(ExecResult::Exited { .. }))
                || matches!(
                    rec.state,
                    ExecState::Collecting | ExecState::Completed | ExecState::CollectionFailed
                );
            if bg && exit {
                found.push(format!(
                    "{}/{}: a background launch became an exit (record {})",
                    key.scope,
                    key.id,
                    rec.state.as_str()
                ));
            }
            if rec.state == ExecState::Launched && (!bg || !launched) {
                found.push(format!(
                    "{}/{}: launched without a launch at the worker",
                    key.scope, key.id
                ));
            }
        }
        for what in found {
            self.violation(what);
        }
    }
}

fn describe(r: &Request) -> String {
    match r {
        Request::Upload {
            machine,
            path,
            bytes,
        } => {
            format!("upload {machine}:{path} ({} bytes)", bytes.len())
        }
        Request::Download {
            machine,
            path,
            max_bytes,
        } => {
            format!("download {machine}:{path} (max {max_bytes})")
        }
        other => format!("{other:?}"),
    }
}
