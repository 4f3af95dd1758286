//! The reference model of retained machines (features C14.2–C14.4, C15,
//! C17.3), checked on every machine-record commit of the store's log (the
//! ground truth) against the simulated worker's truth, like
//! [`super::model`] for execution records. Written from the spec text, not
//! from `smolbox_core::managed::slot`.
//!
//! The rules:
//! - the slot holds at most one command or terminal at a time: it passes
//!   from one holder to another only through an empty slot;
//! - a slot is freed only by a confirmed finish (`completed`, `launched`,
//!   `cancelled` or `expired` without inputs: `finish_command`) or by an operator's
//!   quiescent resolve after a verified stop or deletion: the worker shows
//!   the machine not running (or gone) and the holder's program no longer
//!   runs; so a command or terminal whose outcome is unknown keeps the
//!   slot until resolve;
//! - a retained machine's reservation is released only with its recorded
//!   absence, and only when the worker really has no such machine and no
//!   create of it can still land;
//! - a versioned request (lifecycle or resolve) applies only at the
//!   version it names: against a moved record it fails (`stale_version`);
//! - a lifecycle intent (`(operation, dispatching)`) is committed right
//!   after a claim by the same owner (C15);
//! - creation evidence and absence time are write-once; versions grow.

use std::collections::{BTreeMap, BTreeSet};

use smolbox_core::managed::RecordKey;
use smolbox_core::managed::record::{ExecutionRecord, MachineRecord};
use smolbox_core::managed::state::{ExecState, MachinePhase, MachineRecordState};

use super::model::Violation;
use super::store::{MachineCommit, MachineCommitKind};
use super::worker::SimWorker;

#[derive(Clone, Debug)]
struct Seen {
    last: MachineRecord,
    /// Owner of the latest claim commit not followed by another commit.
    fresh_claim: Option<String>,
}

/// The model of a run's machine records.
#[derive(Debug, Default)]
pub struct SlotModel {
    machines: BTreeMap<RecordKey, Seen>,
}

/// A confirmed finish: the only holders `finish_command` may free the slot
/// for (C14.3): completed, launched, or cancelled / expired without inputs
/// (a command with inputs may have staged some before it was cancelled).
fn confirmed(r: &ExecutionRecord) -> bool {
    match r.state {
        ExecState::Completed | ExecState::Launched => true,
        ExecState::Cancelled | ExecState::Expired => r.spec.inputs.is_empty(),
        _ => false,
    }
}

impl SlotModel {
    /// An empty model.
    pub fn new() -> Self {
        Self::default()
    }

    /// The last committed version of machine `key`.
    pub fn last(&self, key: &RecordKey) -> Option<&MachineRecord> {
        self.machines.get(key).map(|s| &s.last)
    }

    /// Every machine record seen.
    pub fn all(&self) -> impl Iterator<Item = &MachineRecord> {
        self.machines.values().map(|s| &s.last)
    }

    /// True when a machine record seen is due at or before `wall_ms`.
    pub fn any_due_by(&self, wall_ms: u64) -> bool {
        self.machines
            .values()
            .any(|s| s.last.next_due_at_ms.is_some_and(|d| d <= wall_ms))
    }

    /// Checks each machine commit against the previous version of its
    /// record. `exec` gives the execution record as last committed (the
    /// execution commits of the same step are observed first);
    /// `authorized` names the machines an operator's quiescent resolve is
    /// in flight for; `identity` maps a command's key to its identity at
    /// the worker.
    pub fn observe(
        &mut self,
        step: u64,
        commits: Vec<MachineCommit>,
        worker: &SimWorker,
        exec: impl Fn(&RecordKey) -> Option<ExecutionRecord>,
        authorized: &BTreeSet<RecordKey>,
        out: &mut Vec<Violation>,
    ) {
        for c in commits {
            let key = c.record.key.clone();
            let mut v = |what: String| {
                out.push(Violation {
                    step,
                    what: format!("{}/{}: {what}", key.scope, key.id),
                });
            };
            let prev = self.machines.get(&key).cloned();
            let b = &c.record;
            if let Some(p) = &prev {
                check_step(p, &c, worker, &exec, authorized, &mut v);
            } else if c.kind != MachineCommitKind::Accept || b.state != MachineRecordState::Accepted
            {
                v(format!("first machine commit is {:?}", c.kind));
            }
            check_absence(prev.as_ref().map(|p| &p.last), b, worker, &mut v);
            let fresh = match c.kind {
                MachineCommitKind::Claim => c.owner.clone(),
                _ => None,
            };
            self.machines.insert(
                key,
                Seen {
                    last: c.record,
                    fresh_claim: fresh,
                },
            );
        }
    }
}

fn check_step(
    p: &Seen,
    c: &MachineCommit,
    worker: &SimWorker,
    exec: &impl Fn(&RecordKey) -> Option<ExecutionRecord>,
    authorized: &BTreeSet<RecordKey>,
    v: &mut impl FnMut(String),
) {
    let (a, b) = (&p.last, &c.record);
    // Every commit moves the revision (version + claims); a claim leaves
    // the version, which never goes back.
    if b.version + b.claims <= a.version + a.claims || b.version < a.version {
        v(format!(
            "machine version {}+{} after {}+{}",
            b.version, b.claims, a.version, a.claims
        ));
    }
    if a.creation.is_some() && a.creation != b.creation {
        v("machine creation evidence changed".to_owned());
    }
    if a.absence_at_ms.is_some() && a.absence_at_ms != b.absence_at_ms {
        v("machine absence time changed".to_owned());
    }
    // Versioned requests apply only at the version they name (C14.2, C17.3).
    if matches!(
        c.kind,
        MachineCommitKind::Resolve | MachineCommitKind::Request
    ) && let (Some(want), Some(before)) = (c.requested_version, c.before_version)
        && want != before
    {
        v(format!(
            "{:?} at v{want} applied to the record at v{before} (must be stale_version)",
            c.kind
        ));
    }
    // C15: a lifecycle intent right after the writer's own claim.
    let intent = b.phase == MachinePhase::Dispatching
        && (a.phase != MachinePhase::Dispatching || a.operation != b.operation);
    if intent
        && (c.kind != MachineCommitKind::Write
            || c.owner.is_none()
            || p.fresh_claim.as_deref() != c.owner.as_deref())
    {
        v(format!(
            "machine intent {:?} by {:?} not right after its own claim (latest claim: {:?}) (C15)",
            b.operation, c.owner, p.fresh_claim
        ));
    }
    // C14.3, seed 185: a stop verified for the recorded incarnation while
    // the slot was held is the record's state once the slot is free, so no
    // command is admitted into a machine known to be stopped.
    let verified_stop = b.observation.as_ref().is_some_and(|o| {
        matches!(
            o.state,
            MachineRecordState::Stopped | MachineRecordState::Created
        ) && b
            .creation
            .as_ref()
            .is_some_and(|c| c.incarnation == o.incarnation)
    });
    if verified_stop
        && b.state == MachineRecordState::Running
        && b.active_execution.is_none()
        && b.phase == MachinePhase::None
    {
        v(format!(
            "machine recorded running while its verified observation says {} (a command would be admitted into a stopped machine) after a {:?} commit",
            b.observation.as_ref().map_or("?", |o| o.state.as_str()),
            c.kind
        ));
    }
    match (&a.active_execution, &b.active_execution) {
        (Some(x), Some(y)) if x != y => v(format!(
            "slot passed from {} to {} while held (two active holders)",
            x.id, y.id
        )),
        (None, Some(y)) => {
            if !matches!(c.kind, MachineCommitKind::Submit | MachineCommitKind::Slot) {
                v(format!("slot taken for {} by a {:?} commit", y.id, c.kind));
            }
            // `submit_dispatching` takes the slot and writes the intent in
            // the acceptance itself (one transaction): still never a
            // command dispatched before it held the slot.
            let pending = |r: &ExecutionRecord| {
                r.state.is_before_dispatch()
                    || (c.kind == MachineCommitKind::Submit && r.state == ExecState::Dispatching)
            };
            if exec(y).is_some_and(|r| !pending(&r)) {
                v(format!("slot taken for {} after its dispatch", y.id));
            }
        }
        (Some(x), None) => {
            let holder = exec(x);
            let state = holder.as_ref().map(|r| r.state);
            match c.kind {
                MachineCommitKind::Finish if holder.as_ref().is_some_and(confirmed) => {}
                MachineCommitKind::Finish => v(format!(
                    "slot released while its holder {} is {} (an unknown or unconfirmed outcome keeps the slot until resolve)",
                    x.id,
                    state.map_or("absent", ExecState::as_str)
                )),
                MachineCommitKind::Resolve if !authorized.contains(&b.key) => v(format!(
                    "slot released on an unknown outcome without an operator's resolve (holder {} is {})",
                    x.id,
                    state.map_or("absent", ExecState::as_str)
                )),
                MachineCommitKind::Resolve => {
                    let name = b.assignment.as_ref().map(|a| a.machine_name.as_str());
                    if name.is_some_and(|n| worker.is_running(n)) {
                        v(format!(
                            "slot freed by resolve while the machine is running at the worker (no verified stop; holder {})",
                            x.id
                        ));
                    } else if worker.is_live(&x.id) {
                        v(format!(
                            "slot freed by resolve while its holder {} still runs at the worker (no verified stop)",
                            x.id
                        ));
                    }
                }
                other => v(format!(
                    "slot of holder {} freed by a {other:?} commit",
                    x.id
                )),
            }
        }
        _ => {}
    }
}

fn check_absence(
    prev: Option<&MachineRecord>,
    b: &MachineRecord,
    worker: &SimWorker,
    v: &mut impl FnMut(String),
) {
    let Some(a) = &b.assignment else {
        return;
    };
    let newly = b.absence_at_ms.is_some() && prev.is_none_or(|p| p.absence_at_ms.is_none());
    if newly && worker.has_machine(&a.machine_name) {
        v(format!(
            "absence of {} recorded while the machine exists",
            a.machine_name
        ));
    } else if newly && worker.create_may_still_land(&a.machine_name) {
        v(format!(
            "absence of {} recorded while a create of it may still land",
            a.machine_name
        ));
    }
    let released = prev.is_some_and(|p| p.reservation.is_some()) && b.reservation.is_none();
    if released && b.absence_at_ms.is_none() {
        v(format!(
            "reservation of {} released before recorded absence",
            a.machine_name
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::rng::Rng;
    use crate::sim::worker::WorkerFaults;
    use smolbox_core::managed::testkit;

    fn commit(
        kind: MachineCommitKind,
        before: Option<u64>,
        record: MachineRecord,
    ) -> MachineCommit {
        MachineCommit {
            kind,
            owner: Some("o".to_owned()),
            requested_version: None,
            before_version: before,
            record,
        }
    }

    /// A machine whose slot `holder` holds, accepted then running.
    fn held(m: &mut SlotModel, holder: &RecordKey) -> MachineRecord {
        let key = testkit::key("s", "m");
        let acc = testkit::machine_in(MachineRecordState::Accepted, key.clone(), 1_000).unwrap();
        let mut run = testkit::machine_in(MachineRecordState::Running, key, 1_000).unwrap();
        run.version = acc.version + 1;
        run.active_execution = Some(holder.clone());
        let w = SimWorker::new(Rng::new(1), WorkerFaults::NONE, "m0");
        let mut out = Vec::new();
        let none = BTreeSet::new();
        m.observe(
            1,
            vec![commit(MachineCommitKind::Accept, None, acc)],
            &w,
            |_| None,
            &none,
            &mut out,
        );
        let pending = testkit::exec_in(ExecState::Accepted, holder.clone(), 1_000).ok();
        m.observe(
            2,
            vec![commit(MachineCommitKind::Submit, Some(1), run.clone())],
            &w,
            |_| pending.clone(),
            &none,
            &mut out,
        );
        assert!(out.is_empty(), "{out:?}");
        run
    }

    fn freed(run: &MachineRecord) -> MachineRecord {
        let mut f = run.clone();
        f.version += 1;
        f.active_execution = None;
        f
    }

    #[test]
    fn an_unknown_holder_keeps_the_slot_a_completed_one_frees_it() {
        let holder = testkit::key("s", "c");
        let w = SimWorker::new(Rng::new(1), WorkerFaults::NONE, "m0");
        let none = BTreeSet::new();
        for (state, bad) in [(ExecState::Unknown, true), (ExecState::Completed, false)] {
            let mut m = SlotModel::new();
            let run = held(&mut m, &holder);
            let rec = testkit::exec_in(state, holder.clone(), 1_000).ok();
            let mut out = Vec::new();
            m.observe(
                3,
                vec![commit(
                    MachineCommitKind::Finish,
                    Some(run.version),
                    freed(&run),
                )],
                &w,
                |_| rec.clone(),
                &none,
                &mut out,
            );
            assert_eq!(
                out.iter()
                    .any(|v| v.what.contains("slot released while its holder")),
                bad,
                "{state:?}: {out:?}"
            );
        }
    }

    #[test]
    fn a_resolve_frees_the_slot_only_for_an_operator_and_a_stopped_machine() {
        let holder = testkit::key("s", "c");
        let unknown = testkit::exec_in(ExecState::Unknown, holder.clone(), 1_000).ok();
        let mut w = SimWorker::new(Rng::new(1), WorkerFaults::NONE, "m0");
        let mut m = SlotModel::new();
        let run = held(&mut m, &holder);
        let name = run.assignment.as_ref().map(|a| a.machine_name.clone());
        let mut out = Vec::new();
        let none = BTreeSet::new();
        m.observe(
            3,
            vec![commit(
                MachineCommitKind::Resolve,
                Some(run.version),
                freed(&run),
            )],
            &w,
            |_| unknown.clone(),
            &none,
            &mut out,
        );
        assert!(
            out.iter()
                .any(|v| v.what.contains("without an operator's resolve")),
            "{out:?}"
        );
        // An operator's resolve while the machine runs at the worker.
        let Some(name) = name else {
            return;
        };
        w.send(
            0,
            1,
            crate::sim::worker::Request::Create { name: name.clone() },
        )
        .unwrap();
        w.send(0, 2, crate::sim::worker::Request::Start { name })
            .unwrap();
        w.take_replies(10_000);
        let mut m = SlotModel::new();
        let run = held(&mut m, &holder);
        let mut out = Vec::new();
        let ok: BTreeSet<RecordKey> = [run.key.clone()].into();
        m.observe(
            3,
            vec![commit(
                MachineCommitKind::Resolve,
                Some(run.version),
                freed(&run),
            )],
            &w,
            |_| unknown.clone(),
            &ok,
            &mut out,
        );
        assert!(
            out.iter()
                .any(|v| v.what.contains("running at the worker (no verified stop")),
            "{out:?}"
        );
    }

    #[test]
    fn a_versioned_resolve_against_a_moved_record_is_a_violation() {
        let holder = testkit::key("s", "c");
        let w = SimWorker::new(Rng::new(1), WorkerFaults::NONE, "m0");
        let mut m = SlotModel::new();
        let run = held(&mut m, &holder);
        let mut c = commit(MachineCommitKind::Resolve, Some(run.version), freed(&run));
        c.requested_version = Some(run.version - 1);
        let ok: BTreeSet<RecordKey> = [run.key.clone()].into();
        let mut out = Vec::new();
        let unknown = testkit::exec_in(ExecState::Unknown, holder, 1_000).ok();
        m.observe(3, vec![c], &w, |_| unknown.clone(), &ok, &mut out);
        assert!(
            out.iter().any(|v| v.what.contains("must be stale_version")),
            "{out:?}"
        );
    }
}
