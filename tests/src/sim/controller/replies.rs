//! The worker's replies as the client decodes them (split from
//! `controller.rs`): a machine view as an `Observation`, and a simulated
//! reply as the controller's `WorkerResult`.

use smolbox_core::Reason;
use smolbox_core::managed::controller::{WorkerReply, WorkerResult};
use smolbox_core::worker::{Incarnation, MachineState as WState, Measurements, Observation};
use smolbox_core::{Error, Evidence, Operation};

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
                image: None,
            },
            state: match v.state {
                worker::MachineState::Created => WState::Created,
                worker::MachineState::Running => WState::Running,
                worker::MachineState::Stopped => WState::Stopped,
            },
            pid: None,
            branchable: None,
            measurements: Measurements::default(),
        }
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
