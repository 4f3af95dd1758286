//! The simulated worker's files and background launches (worker-api.md
//! §9.1, §9.2, §6.3), with their uncertain cases: an upload whose bytes
//! landed but whose reply was lost, a download cut short (a connection
//! error mid-body: nothing is known about the file), a missing file (500),
//! a file over the client's bound, and a background launch whose program
//! started but whose acknowledgement was lost (the generic lost reply of
//! [`SimWorker::send`]).
//!
//! Files belong to a machine's incarnation: a delete, or a restart that
//! loses a running machine, loses them; a stop keeps them. Uploads and
//! downloads implicitly start a created or stopped machine (§9.1, §9.2).
//! A command reads the machine's files under `/workspace/<identity>/` when
//! it arrives (the snapshot the input rule is checked against) and writes each path named after its
//! duration in its argv when it exits (`"<identity>:<path>:<exit>"`).
//!
//! The worker also reports one rule itself: an upload that arrives on a
//! path a still-running command read when it started (an input staged
//! after, or resent while, the command runs).

use smolbox_core::exec::{ExecOutcome, Launched};
use smolbox_core::{Error, Evidence, Operation, Reason};
use std::collections::BTreeMap;

use super::{ExecTruth, MachineState, Reply, SimWorker};

/// The lowercase hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// What one command saw and wrote.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExecFiles {
    /// The machine's files when the command arrived: path → SHA-256.
    pub read: BTreeMap<String, String>,
    /// The machine incarnation it ran on.
    pub incarnation: u64,
    /// Paths it writes when it exits.
    pub writes: Vec<String>,
    /// Launched in the background (§6.3): no exit is ever reported.
    pub background: bool,
}

/// The files state of the worker.
#[derive(Debug, Default)]
pub(super) struct Files {
    /// `(incarnation, path)` → bytes.
    on: BTreeMap<(u64, String), Vec<u8>>,
    /// Command identity → what it read and writes.
    execs: BTreeMap<String, ExecFiles>,
    /// Upload arrivals per `<machine>:<path>` (bytes landed).
    uploads: BTreeMap<String, u32>,
}

/// The content a simulated command writes to `path`.
pub fn output_content(identity: &str, path: &str, exit_code: i32) -> Vec<u8> {
    format!("{identity}:{path}:{exit_code}").into_bytes()
}

impl SimWorker {
    /// The incarnation of machine `name`, implicitly started (§9: a file
    /// request starts a created or stopped machine), or `None` (404).
    fn started_for_files(&mut self, name: &str) -> Option<u64> {
        let m = self.machines.get_mut(name)?;
        m.state = MachineState::Running;
        Some(m.incarnation)
    }

    pub(super) fn upload(
        &mut self,
        back: u64,
        machine: &str,
        path: &str,
        bytes: Vec<u8>,
    ) -> (u64, Result<Reply, Error>) {
        let Some(inc) = self.started_for_files(machine) else {
            return (back, Err(absent(Operation::Upload)));
        };
        *self
            .files
            .uploads
            .entry(format!("{machine}:{path}"))
            .or_insert(0) += 1;
        // A command that read this path when it started and still runs.
        for (id, f) in &self.files.execs {
            if f.incarnation == inc
                && f.read.contains_key(path)
                && matches!(self.execs.get(id), Some(ExecTruth::Running { .. }))
            {
                self.violations.push(format!(
                    "an upload of {path} on {machine} arrived while command {id}, which read it, runs (inputs are staged before the exec, never after)"
                ));
            }
        }
        let size = bytes.len() as u64;
        self.files.on.insert((inc, path.to_owned()), bytes);
        (
            back,
            Ok(Reply::Uploaded {
                path: path.to_owned(),
                size,
            }),
        )
    }

    pub(super) fn download(
        &mut self,
        back: u64,
        machine: &str,
        path: &str,
        max_bytes: u64,
    ) -> (u64, Result<Reply, Error>) {
        let Some(inc) = self.started_for_files(machine) else {
            return (back, Err(absent(Operation::Download)));
        };
        match self.files.on.get(&(inc, path.to_owned())) {
            // §9.2: a missing file is a 500 with the agent's message.
            None => (
                back,
                Err(Error::unknown(
                    Operation::Download,
                    Evidence::NotDispatched,
                    Reason::WorkerInternalError,
                )
                .with_status(500)),
            ),
            Some(b) if b.len() as u64 > max_bytes => (
                back,
                Err(Error::output_limit(
                    Operation::Download,
                    Evidence::NotDispatched,
                    Reason::DownloadCap,
                )
                .with_limit(b.len() as u64, max_bytes)),
            ),
            Some(b) => (back, Ok(Reply::Downloaded(b.clone()))),
        }
    }

    /// A background launch (§6.3): the program starts and runs for its
    /// duration (writing nothing); the reply is the acknowledgement.
    pub(super) fn launch(
        &mut self,
        at: u64,
        back: u64,
        machine: &str,
        argv: &[String],
    ) -> (u64, Result<Reply, Error>) {
        // As a foreground exec: a machine that is not running (absent,
        // created, stopped) launches nothing (finding 13: a launch on a
        // machine a restart had deleted "ran" there, so a resolve that
        // verified the machine's absence looked like freeing the slot
        // under a live program).
        if !self.is_running(machine) {
            return (
                back,
                Err(Error::not_found(
                    Operation::Exec,
                    Evidence::NotDispatched,
                    Reason::MachineNotRunning,
                )),
            );
        }
        let id = super::exec_identity(argv);
        let exit_code: i32 = argv.get(2).and_then(|s| s.parse().ok()).unwrap_or(127);
        let duration: u64 = argv.get(3).and_then(|s| s.parse().ok()).unwrap_or(0);
        self.exec_started(&id, machine, argv);
        if let Some(f) = self.files.execs.get_mut(&id) {
            f.background = true;
            f.writes.clear();
        }
        self.exec_machine.insert(id.clone(), machine.to_owned());
        self.execs.insert(
            id,
            ExecTruth::Running {
                until_ms: at + duration.max(1),
                exit_code,
            },
        );
        let pid = u32::try_from(self.seq % 60_000).unwrap_or(1) + 2;
        (
            back,
            Ok(Reply::Exec(ExecOutcome::Launched(Launched { pid }))),
        )
    }

    /// Command `id` arrived on running `machine`: what it reads now and
    /// what it writes at its exit.
    pub(super) fn exec_started(&mut self, id: &str, machine: &str, argv: &[String]) {
        let inc = self.machines.get(machine).map_or(0, |m| m.incarnation);
        // A command reads the files under `/workspace/<identity>/`.
        let dir = format!("/workspace/{id}/");
        let read = self
            .files
            .on
            .iter()
            .filter(|((i, p), _)| *i == inc && p.starts_with(&dir))
            .map(|((_, p), b)| (p.clone(), sha256_hex(b)))
            .collect();
        self.files.execs.insert(
            id.to_owned(),
            ExecFiles {
                read,
                incarnation: inc,
                writes: argv.iter().skip(4).cloned().collect(),
                background: false,
            },
        );
    }

    /// Command `id` exited: it writes its declared paths (on its
    /// incarnation, if the machine still has it).
    pub(super) fn write_outputs(&mut self, id: &str, exit_code: i32) {
        let Some(f) = self.files.execs.get(id) else {
            return;
        };
        let alive = self
            .machines
            .values()
            .any(|m| m.incarnation == f.incarnation);
        if !alive {
            return;
        }
        for p in f.writes.clone() {
            self.files.on.insert(
                (f.incarnation, p.clone()),
                output_content(id, &p, exit_code),
            );
        }
    }

    /// What command `identity` read when it arrived and writes at its exit.
    pub fn exec_files(&self, identity: &str) -> Option<&ExecFiles> {
        self.files.execs.get(identity)
    }

    /// The bytes of `path` on machine `name`'s current incarnation.
    pub fn file(&self, name: &str, path: &str) -> Option<&[u8]> {
        let inc = self.machines.get(name)?.incarnation;
        self.files
            .on
            .get(&(inc, path.to_owned()))
            .map(Vec::as_slice)
    }

    /// Uploads that arrived for `path` on machine `name`.
    pub fn uploads(&self, name: &str, path: &str) -> u32 {
        self.files
            .uploads
            .get(&format!("{name}:{path}"))
            .copied()
            .unwrap_or(0)
    }
}

fn absent(op: Operation) -> Error {
    Error::not_found(op, Evidence::NotDispatched, Reason::MachineNotFound)
}

#[cfg(test)]
mod tests {
    use super::super::{Request, WorkerFaults};
    use super::*;
    use crate::sim::rng::Rng;

    fn worker(faults: WorkerFaults) -> SimWorker {
        SimWorker::new(Rng::new(3), faults, "m0")
    }

    fn upload(path: &str, bytes: &[u8]) -> Request {
        Request::Upload {
            machine: "m0".to_owned(),
            path: path.to_owned(),
            bytes: bytes.to_vec(),
        }
    }

    fn download(path: &str, max_bytes: u64) -> Request {
        Request::Download {
            machine: "m0".to_owned(),
            path: path.to_owned(),
            max_bytes,
        }
    }

    fn run(w: &mut SimWorker) -> Vec<(u64, Result<Reply, Error>)> {
        w.take_replies(u64::MAX / 2)
    }

    #[test]
    fn an_upload_lands_and_reads_back_with_its_size_at_n_and_is_refused_at_n_minus_one() {
        let mut w = worker(WorkerFaults::NONE);
        w.send(0, 1, upload("/workspace/a", b"abc")).unwrap();
        let r = run(&mut w);
        assert_eq!(
            r[0].1,
            Ok(Reply::Uploaded {
                path: "/workspace/a".to_owned(),
                size: 3
            })
        );
        assert_eq!(w.uploads("m0", "/workspace/a"), 1);
        w.send(10, 2, download("/workspace/a", 3)).unwrap();
        w.send(10, 3, download("/workspace/a", 2)).unwrap();
        w.send(10, 4, download("/workspace/none", 9)).unwrap();
        let mut r = run(&mut w);
        r.sort_by_key(|x| x.0);
        assert_eq!(r[0].1, Ok(Reply::Downloaded(b"abc".to_vec())));
        let e = r[1].1.clone().unwrap_err();
        assert_eq!(e.reason(), Reason::DownloadCap);
        let e = r[2].1.clone().unwrap_err();
        assert_eq!(e.status(), Some(500));
    }

    #[test]
    fn an_upload_whose_reply_is_lost_has_landed_and_a_resend_while_uncertain_is_a_violation() {
        let mut w = worker(WorkerFaults {
            lose_reply: 1000,
            ..WorkerFaults::NONE
        });
        w.send(0, 1, upload("/workspace/a", b"xy")).unwrap();
        let r = run(&mut w);
        assert_eq!(
            r[0].1.as_ref().unwrap_err().evidence(),
            Evidence::DispatchUncertain
        );
        assert_eq!(w.file("m0", "/workspace/a"), Some(&b"xy"[..]));
        assert!(w.take_violations().is_empty());
        w.send(5, 2, upload("/workspace/a", b"xy")).unwrap();
        run(&mut w);
        let v = w.take_violations();
        assert!(
            v.iter()
                .any(|v| v.contains("sent again while an earlier one was uncertain")),
            "{v:?}"
        );
    }

    #[test]
    fn a_download_cut_short_reports_a_connection_error_and_changes_nothing() {
        let mut w = worker(WorkerFaults::NONE);
        w.send(0, 1, upload("/workspace/a", b"abc")).unwrap();
        run(&mut w);
        w.set_faults(WorkerFaults {
            lose_reply: 1000,
            ..WorkerFaults::NONE
        });
        w.send(5, 2, download("/workspace/a", 10)).unwrap();
        let r = run(&mut w);
        let e = r[0].1.clone().unwrap_err();
        assert_eq!(e.category(), smolbox_core::Category::Transport);
        assert_eq!(w.file("m0", "/workspace/a"), Some(&b"abc"[..]));
        assert!(w.take_violations().is_empty());
    }

    #[test]
    fn a_command_reads_the_staged_files_and_writes_its_outputs_at_exit() {
        let mut w = worker(WorkerFaults::NONE);
        w.send(0, 1, upload("/workspace/c1/in", b"data")).unwrap();
        run(&mut w);
        let mut argv = super::super::sim_argv("c1", 2, 100);
        argv.push("/workspace/out".to_owned());
        w.send(
            10,
            2,
            Request::Exec {
                machine: "m0".to_owned(),
                argv,
            },
        )
        .unwrap();
        w.take_replies(50);
        let f = w.exec_files("c1").unwrap().clone();
        assert_eq!(f.read.get("/workspace/c1/in"), Some(&sha256_hex(b"data")));
        assert_eq!(w.file("m0", "/workspace/out"), None, "written at the exit");
        // An upload of a path the running command read is reported.
        w.send(60, 3, upload("/workspace/c1/in", b"late")).unwrap();
        w.take_replies(100);
        let v = w.take_violations();
        assert!(v.iter().any(|v| v.contains("which read it, runs")), "{v:?}");
        run(&mut w);
        assert_eq!(
            w.file("m0", "/workspace/out"),
            Some(&output_content("c1", "/workspace/out", 2)[..])
        );
    }

    #[test]
    fn a_background_launch_acknowledges_at_once_and_a_lost_ack_still_launched() {
        let mut w = worker(WorkerFaults::NONE);
        let launch = |id: &str| Request::Launch {
            machine: "m0".to_owned(),
            argv: super::super::sim_argv(id, 0, 10_000),
        };
        w.send(0, 1, launch("b1")).unwrap();
        let r = w.take_replies(500);
        assert!(matches!(r[0].1, Ok(Reply::Exec(ExecOutcome::Launched(_)))));
        assert!(w.is_live("b1"));
        assert!(w.exec_files("b1").unwrap().background);
        w.set_faults(WorkerFaults {
            lose_reply: 1000,
            ..WorkerFaults::NONE
        });
        w.send(600, 2, launch("b2")).unwrap();
        let r = w.take_replies(1_000);
        assert_eq!(
            r[0].1.as_ref().unwrap_err().evidence(),
            Evidence::DispatchUncertain
        );
        assert!(w.is_live("b2"), "launched although the ack was lost");
        w.send(1_100, 3, launch("b2")).unwrap();
        w.take_replies(2_000);
        let v = w.take_violations();
        assert!(
            v.iter().any(|v| v.contains("exec b2 received 2 times")),
            "{v:?}"
        );
    }

    #[test]
    fn files_live_on_the_incarnation_a_stop_keeps_them_a_delete_loses_them() {
        let mut w = worker(WorkerFaults::NONE);
        w.send(
            0,
            1,
            Request::Create {
                name: "m1".to_owned(),
            },
        )
        .unwrap();
        run(&mut w);
        // Created, not running: the upload starts it implicitly.
        w.send(
            10,
            2,
            Request::Upload {
                machine: "m1".to_owned(),
                path: "/workspace/f".to_owned(),
                bytes: b"1".to_vec(),
            },
        )
        .unwrap();
        run(&mut w);
        assert!(w.is_running("m1"));
        w.send(
            20,
            3,
            Request::Stop {
                name: "m1".to_owned(),
            },
        )
        .unwrap();
        run(&mut w);
        assert_eq!(w.file("m1", "/workspace/f"), Some(&b"1"[..]));
        w.send(
            30,
            4,
            Request::Delete {
                name: "m1".to_owned(),
            },
        )
        .unwrap();
        run(&mut w);
        w.send(
            40,
            5,
            Request::Create {
                name: "m1".to_owned(),
            },
        )
        .unwrap();
        run(&mut w);
        assert_eq!(w.file("m1", "/workspace/f"), None, "a new incarnation");
    }
}
