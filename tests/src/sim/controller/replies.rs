//! The worker's replies as the client decodes them (split from
//! `controller.rs`): a machine view as an `Observation`, and a simulated
//! reply as the controller's `WorkerResult`.

use smolbox_core::Reason;
use smolbox_core::exec::{ExecOutcome, ExecOutput, OutputEncoding};
use smolbox_core::managed::controller::{WorkerReply, WorkerResult};
use smolbox_core::worker::{Incarnation, MachineState as WState, Measurements, Observation};
use smolbox_core::{Error, Evidence, Operation};

use super::super::Bug;
use super::super::worker::{self, Reply};
use super::Sim;

impl Sim {
    /// A machine reply as the client decodes it.
    pub(super) fn observation(&self, v: &worker::MachineView) -> Observation {
        let spec = self.machine_specs.get(&v.name).cloned().unwrap_or_default();
        Observation {
            incarnation: Incarnation {
                name: v.name.clone(),
                created_at: 1_700_000_000 + v.incarnation,
                cpus: spec.cpus,
                memory_mb: spec.memory_mb,
                storage_gb: spec.storage_gb,
                overlay_gb: spec.overlay_gb,
                network: spec.network.clone(),
                network_backend: None,
                allowlists_present: false,
                ports: spec.ports.clone(),
                mounts: spec.mounts.clone(),
                // A slot launch is inspected before its acceptance and goes
                // out only to a plain image machine; imageless ones (a
                // `.smolmachine`) show none (planted `ImagelessAdmitted`:
                // every machine shows one).
                image: (!v.imageless || self.opts.bug == Some(Bug::ImagelessAdmitted))
                    .then(|| "sim:1".to_owned()),
            },
            state: match v.state {
                worker::MachineState::Created => WState::Created,
                worker::MachineState::Running => WState::Running,
                worker::MachineState::Stopped => WState::Stopped,
            },
            pid: None,
            branchable: Some(false),
            measurements: Measurements::default(),
        }
    }

    /// The planted bugs that rewrite an exec reply as exit 0:
    /// `UncertainAsExit` (an uncertain reply) and `LaunchedAsExit` (a
    /// launch acknowledgement).
    pub(super) fn planted_exit(&self, r: WorkerResult) -> WorkerResult {
        let uncertain = self.opts.bug == Some(Bug::UncertainAsExit)
            && r.as_ref()
                .err()
                .is_some_and(|e| e.evidence() == Evidence::DispatchUncertain);
        let launched = self.opts.bug == Some(Bug::LaunchedAsExit)
            && matches!(r, Ok(WorkerReply::Exec(ExecOutcome::Launched(_))));
        if !uncertain && !launched {
            return r;
        }
        Ok(WorkerReply::Exec(ExecOutcome::Exited(ExecOutput {
            exit_code: 0,
            stdout: Vec::new(),
            stderr: Vec::new(),
            encoding: OutputEncoding::Bytes,
        })))
    }

    /// A simulated reply as the controller gets it.
    pub(super) fn to_worker_result(&self, r: Result<Reply, Error>) -> WorkerResult {
        match r {
            Ok(Reply::Exec(o)) => Ok(WorkerReply::Exec(o)),
            Ok(Reply::Machine(v)) => Ok(WorkerReply::Machine(Box::new(self.observation(&v)))),
            Ok(Reply::Deleted) => Ok(WorkerReply::Deleted),
            Ok(Reply::Uploaded { size, .. }) => Ok(WorkerReply::Uploaded { size }),
            Ok(Reply::Downloaded(b)) => Ok(WorkerReply::Downloaded {
                size: b.len() as u64,
                sha256: worker::sha256_hex(&b),
            }),
            Ok(Reply::TermOpened | Reply::TermClosed(_)) => Err(Error::protocol(
                Operation::Get,
                Reason::TerminalMessageOnAnOp,
            )),
            // The observed 404 is a `not_found` error (worker-api.md).
            Ok(Reply::Absent) => Err(Error::not_found(
                Operation::Get,
                Evidence::NotDispatched,
                Reason::MachineNotFound,
            )),
            Err(e) => Err(e),
        }
    }
}
