//! Performing a managed terminal run's store ops
//! (`smolbox_core::managed::controller::terminal::TermStoreOp`): each
//! variant is one [`Store`] method with the same arguments, as
//! [`crate::apply_op`] is for the controller's.

use smolbox_core::managed::controller::terminal::{TermStoreOp, TermStoreReply, TermStoreResult};

use crate::{Accepted, Released, Store};

/// Performs `op` on `store` and returns its reply or the store's error,
/// unchanged.
pub fn apply_terminal_op(store: &dyn Store, op: &TermStoreOp) -> TermStoreResult {
    match op {
        TermStoreOp::FetchMachine { key } => store
            .fetch_machine(key)
            .map(|m| TermStoreReply::Machine(Box::new(m))),
        TermStoreOp::Submit {
            record,
            max_pending,
        } => store.submit(record, *max_pending).map(|a| {
            let existing = matches!(a, Accepted::Existing(_));
            let s = a.into_record();
            TermStoreReply::Submitted {
                record: Box::new(s.execution),
                machine: s.machine.map(Box::new),
                existing,
            }
        }),
        TermStoreOp::Fetch { key } => store
            .fetch(key)
            .map(|r| TermStoreReply::Record(Box::new(r))),
        TermStoreOp::Claim {
            key,
            owner,
            now_ms,
            ttl_ms,
        } => store
            .claim(key, owner, *now_ms, *ttl_ms)
            .map(|r| TermStoreReply::Record(Box::new(r))),
        TermStoreOp::Write {
            key,
            guard,
            patch,
            now_ms,
        } => store
            .write(key, guard, patch, *now_ms)
            .map(|r| TermStoreReply::Record(Box::new(r))),
        TermStoreOp::Cancel { key, now_ms } => store
            .cancel(key, *now_ms)
            .map(|r| TermStoreReply::Record(Box::new(r))),
        TermStoreOp::ClaimWorker {
            worker_id,
            owner,
            now_ms,
            ttl_ms,
        } => store
            .claim_worker(worker_id, owner, *now_ms, *ttl_ms)
            .map(TermStoreReply::Lease),
        TermStoreOp::ClaimMachine {
            key,
            owner,
            now_ms,
            ttl_ms,
        } => store
            .claim_machine(key, owner, *now_ms, *ttl_ms)
            .map(|m| TermStoreReply::Machine(Box::new(m))),
        TermStoreOp::ClaimMachineVersion {
            key,
            owner,
            version,
            now_ms,
            ttl_ms,
        } => store
            .claim_machine_version(key, owner, *version, *now_ms, *ttl_ms)
            .map(|m| TermStoreReply::Machine(Box::new(m))),
        TermStoreOp::FinishCommand {
            machine,
            guard,
            exec,
            now_ms,
        } => store
            .finish_command(machine, guard, exec, *now_ms)
            .map(|(m, r, finish)| TermStoreReply::Finished {
                machine: Box::new(m),
                record: Box::new(r),
                finish,
            }),
        TermStoreOp::ReleaseClaim {
            claimed,
            owner,
            generation,
            now_ms,
        } => store
            .release_claim(claimed, owner, *generation, *now_ms)
            .and_then(|r| match r {
                Released::Execution(rec) => Ok(TermStoreReply::Record(rec)),
                Released::Machine(m) => Ok(TermStoreReply::Machine(m)),
                Released::Worker(Some(l)) => Ok(TermStoreReply::Lease(l)),
                Released::Worker(None) => Err(smolbox_core::Error::not_found(
                    smolbox_core::Operation::StoreClaim,
                    smolbox_core::Evidence::Unknown,
                    smolbox_core::Reason::Absent,
                )),
            }),
    }
}
