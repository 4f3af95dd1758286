//! An unassigned retained machine no configured worker may create (a
//! later configuration's catalog, versions or draining flag no longer
//! allow its spec, C12.4; AC-12.5.2 keeps such a record resolvable).
//!
//! It does not expire: a machine spec has no queue budget (C12.4's is the
//! execution specification's), machine states have no `expired`
//! (`accepted` moves only to `creating`, `conflict` or `deleted`), and
//! C14.4 gives machines no TTL; a machine waiting for worker capacity
//! already waits without a queue position. So it is treated as that wait:
//! - a controller able to drive machines records the configuration's
//!   refusal on the record (`last_error`, e.g. `artifact_not_in_catalog`,
//!   operation `create`) and makes it due again after one claim TTL, with
//!   no reservation and no worker request. The owner sees why it waits;
//!   a later configuration that may create it creates it then; the scan
//!   is not filled by such records at every poll interval (before, each
//!   one took a task slot per scan and was left due as stored, so
//!   `max_active` of them starved every machine due after them);
//! - its owner's `delete` ends it: `deleted` with no worker call
//!   (C14.2: "an unassigned accepted or conflicted machine can be deleted
//!   with no worker call"). Before, the pending delete was never settled
//!   here, because the task stopped when it found no worker for the spec.

#[allow(clippy::wildcard_imports)] // the parent's vocabulary, one module
use super::*;

impl Mach {
    /// The step of a machine this controller has no worker for: neither
    /// the assigned worker nor one that may create its spec has a profile
    /// here. Only an unassigned machine is acted on (see the module docs);
    /// anything else is left as stored.
    pub(super) fn without_worker(
        &mut self,
        cfg: &ControllerConfig,
        now: Instant,
        now_ms: u64,
    ) -> MStep {
        use MachineOperation as Op;
        use MachinePhase as Ph;
        use MachineRecordState as S;
        let drives = cfg.workers.iter().any(|w| w.profile.is_some());
        if self.rec.assignment.is_some() || !drives {
            return MStep::Done;
        }
        match (self.rec.operation, self.rec.phase, self.rec.state) {
            // Never assigned: nothing exists on a worker.
            (Op::Delete, Ph::Pending, _) => {
                self.settle(cfg, now, now_ms, S::Deleted, MachinePatch::default())
            }
            (Op::None, Ph::None, S::Accepted) if self.rec.next_due_at_ms.is_some() => {
                let s = &self.rec.spec;
                let Err(e) = cfg.creating_worker(&s.artifact, &s.profile, s.network.as_ref())
                else {
                    return MStep::Done;
                };
                if !self.claim_ok(cfg, now, now_ms) {
                    return self.claim_op(cfg, now_ms);
                }
                let e = e.with_operation(Operation::Create);
                let p = MachinePatch {
                    last_error: Some(ErrorEntry::from_error(&e, now_ms)),
                    next_due_at_ms: Some(Some(now_ms.saturating_add(cfg.lease_ttl_ms))),
                    ..MachinePatch::default()
                };
                // Ends the task after this write (as a full worker does).
                self.fatal = Some(e);
                self.write(cfg, now_ms, SKind::Write, p)
            }
            _ => MStep::Done,
        }
    }
}
