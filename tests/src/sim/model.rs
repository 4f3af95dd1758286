//! The reference model: a small, independent statement of what the rules
//! allow (features.md §0.4, C13.1, C13.2, C13.4, C15), checked against the
//! ground truth after every step — the store's commit log and the simulated
//! worker's counters — never against what the controller believes.
//!
//! The tables below are written from the spec text, not imported from
//! `smolbox_core::managed::state`, so a wrong table in core is a finding,
//! not a shared blind spot.

use std::collections::{BTreeMap, BTreeSet};

use smolbox_core::managed::record::{ExecResult, ExecutionRecord};
use smolbox_core::managed::{ExecState, RecordEvidence, RecordKey};

use super::store::{Commit, CommitKind};
use super::worker::{ExecTruth, Mutation, SimWorker};

/// One broken rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The simulation step at which it was seen.
    pub step: u64,
    /// Which rule, and how.
    pub what: String,
}

/// C13.1, from the spec's table. `dispatching → failed` and `dispatching →
/// cancelled` are allowed only with evidence `not_dispatched` (issue 12: an
/// exec refused before any byte left after the intent was durable; a cancel
/// recorded after the intent and before the send, session 10).
fn allowed(from: ExecState, to: ExecState) -> bool {
    use ExecState as S;
    matches!(
        (from, to),
        (S::Accepted, S::Preparing | S::Cancelled | S::Expired)
            | (S::Preparing, S::Ready | S::Failed | S::Cancelled)
            | (S::Ready, S::Dispatching | S::Cancelled | S::Failed)
            | (
                S::Dispatching,
                S::Launched
                    | S::Running
                    | S::Collecting
                    | S::Unknown
                    | S::Cancelling
                    | S::Failed
                    | S::Cancelled
            )
            | (S::Running, S::Collecting | S::Unknown | S::Cancelling)
            | (S::Cancelling, S::Collecting | S::Unknown)
            | (S::Unknown, S::Collecting | S::Cancelling)
            | (S::Collecting, S::Completed | S::CollectionFailed)
    )
}

const fn before_dispatch(s: ExecState) -> bool {
    matches!(
        s,
        ExecState::Accepted | ExecState::Preparing | ExecState::Ready
    )
}

/// C13.2, from the spec's text.
fn coupling_ok(rec: &ExecutionRecord) -> Result<(), &'static str> {
    use ExecState as S;
    use RecordEvidence as E;
    let has_exit = matches!(
        rec.result,
        Some(ExecResult::Exited { .. } | ExecResult::Terminal { .. })
    );
    let has_launch = matches!(rec.result, Some(ExecResult::Launched { .. }));
    let ok = match rec.state {
        S::Accepted | S::Preparing | S::Ready | S::Cancelled | S::Expired | S::Failed => {
            rec.evidence == E::NotDispatched && rec.result.is_none()
        }
        S::Dispatching => rec.evidence == E::DispatchUncertain && rec.result.is_none(),
        S::Running => rec.evidence == E::RunningObserved && rec.result.is_none(),
        S::Collecting | S::Completed | S::CollectionFailed => rec.evidence == E::Exited && has_exit,
        S::Launched => rec.evidence == E::Launched && has_launch,
        S::Unknown | S::Cancelling => {
            matches!(
                rec.evidence,
                E::DispatchUncertain | E::RunningObserved | E::Unknown | E::TerminationConfirmed
            ) && rec.result.is_none()
        }
    };
    if ok {
        Ok(())
    } else {
        Err("evidence coupling (C13.2)")
    }
}

#[derive(Clone, Debug)]
struct Key {
    last: ExecutionRecord,
    /// Owner of the latest claim commit not followed by a write.
    fresh_claim: Option<String>,
}

/// The model of one run: every record it has seen, and the rules.
#[derive(Debug, Default)]
pub struct Model {
    keys: BTreeMap<RecordKey, Key>,
    cancelled: BTreeSet<RecordKey>,
    /// Keys whose record or cancel status changed since the last
    /// [`Model::check_worker`] (only they can newly break its rules, apart
    /// from keys whose command just arrived).
    dirty: BTreeSet<RecordKey>,
    /// Every violation seen, in order.
    pub violations: Vec<Violation>,
}

impl Model {
    /// An empty model.
    pub fn new() -> Self {
        Self::default()
    }

    fn violate(&mut self, step: u64, key: &RecordKey, what: impl Into<String>) {
        self.violations.push(Violation {
            step,
            what: format!("{}/{}: {}", key.scope, key.id, what.into()),
        });
    }

    /// A cancel of `key` committed while it was before dispatch: its
    /// command must never arrive (C16).
    pub fn cancelled_before_intent(&mut self, key: &RecordKey) {
        self.cancelled.insert(key.clone());
        self.dirty.insert(key.clone());
    }

    /// True when a record seen is due (its `next_due_at_ms`) at or before
    /// `wall_ms`.
    pub fn any_due_by(&self, wall_ms: u64) -> bool {
        self.keys
            .values()
            .any(|k| k.last.next_due_at_ms.is_some_and(|d| d <= wall_ms))
    }

    /// The last committed version of `key`.
    pub fn last(&self, key: &RecordKey) -> Option<&ExecutionRecord> {
        self.keys.get(key).map(|k| &k.last)
    }

    /// C0.4 rule 3, C14.4, C17.2: a machine's absence is recorded only when
    /// the machine is really gone at the worker and no create of it can
    /// still land; a reservation (capacity, name, ports) is released only
    /// after recorded absence. Call before [`Model::observe_commits`] with
    /// the same commits (it compares with the previous version).
    pub fn check_absence(&mut self, step: u64, commits: &[Commit], worker: &SimWorker) {
        for c in commits {
            let r = &c.record;
            let prev = self.keys.get(&r.key).map(|k| k.last.clone());
            if let Some(a) = &r.assignment {
                let newly = r.absence_at_ms.is_some()
                    && prev.as_ref().is_none_or(|p| p.absence_at_ms.is_none());
                if newly && worker.has_machine(&a.machine_name) {
                    self.violate(
                        step,
                        &r.key,
                        format!(
                            "absence of {} recorded while the machine exists",
                            a.machine_name
                        ),
                    );
                } else if newly && r.creation.is_none() && worker.create_made(&a.machine_name) {
                    // Without creation evidence only a create that never
                    // left or that the worker refused proves nothing was
                    // made (session 10).
                    self.violate(
                        step,
                        &r.key,
                        format!(
                            "absence of {} recorded without creation evidence although a create of it made the machine",
                            a.machine_name
                        ),
                    );
                } else if newly && worker.create_may_still_land(&a.machine_name) {
                    self.violate(
                        step,
                        &r.key,
                        format!(
                            "absence of {} recorded while a create of it may still land",
                            a.machine_name
                        ),
                    );
                }
            }
            let released =
                prev.as_ref().is_some_and(|p| p.reservation.is_some()) && r.reservation.is_none();
            if released && r.absence_at_ms.is_none() {
                self.violate(step, &r.key, "reservation released before recorded absence");
            }
        }
    }

    /// Checks each commit against the previous version of its record.
    pub fn observe_commits(&mut self, step: u64, commits: Vec<Commit>) {
        for c in commits {
            let key = c.record.key.clone();
            self.dirty.insert(key.clone());
            let Some(prev) = self.keys.get(&key).cloned() else {
                // Issue 16: an acceptance may carry its dispatch intent, but
                // only under the claim written in the same commit (C15:
                // the intent right after its own, fresh claim).
                let intent_at_accept = c.record.state == ExecState::Dispatching
                    && c.owner.is_some()
                    && c.record.claim.as_ref().map(|cl| cl.owner.as_str()) == c.owner.as_deref();
                if c.kind != CommitKind::Accept
                    || (c.record.state != ExecState::Accepted && !intent_at_accept)
                {
                    self.violate(
                        step,
                        &key,
                        format!(
                            "first commit is {:?} in {}",
                            c.kind,
                            c.record.state.as_str()
                        ),
                    );
                }
                if let Err(w) = coupling_ok(&c.record) {
                    self.violate(step, &key, w);
                }
                self.keys.insert(
                    key,
                    Key {
                        last: c.record,
                        fresh_claim: None,
                    },
                );
                continue;
            };
            self.check_step(step, &key, &prev, &c);
            let fresh = match c.kind {
                CommitKind::Claim => c.owner.clone(),
                CommitKind::Cancel | CommitKind::Accept => prev.fresh_claim.clone(),
                CommitKind::Write
                | CommitKind::Reserve
                | CommitKind::Release
                | CommitKind::Resolve => None,
            };
            self.keys.insert(
                key,
                Key {
                    last: c.record,
                    fresh_claim: fresh,
                },
            );
        }
    }

    fn check_step(&mut self, step: u64, key: &RecordKey, prev: &Key, c: &Commit) {
        let (a, b) = (&prev.last, &c.record);
        if b.version <= a.version {
            self.violate(
                step,
                key,
                format!("version {} after {}", b.version, a.version),
            );
        }
        if b.updated_at_ms < a.updated_at_ms {
            self.violate(step, key, "updated_at decreased (C13.4)");
        }
        // Issue 16: one guarded write may store the result and what
        // follows it (`write_steps`: → collecting → completed).
        let via_collecting = c.kind == CommitKind::Write
            && allowed(a.state, ExecState::Collecting)
            && allowed(ExecState::Collecting, b.state);
        if a.state != b.state && !allowed(a.state, b.state) && !via_collecting {
            let what = if !before_dispatch(a.state) && before_dispatch(b.state) {
                "went back before dispatch"
            } else {
                "transition not in C13.1"
            };
            self.violate(
                step,
                key,
                format!("{} -> {}: {what}", a.state.as_str(), b.state.as_str()),
            );
        }
        if a.state == ExecState::Dispatching
            && b.state == ExecState::Failed
            && b.evidence != RecordEvidence::NotDispatched
        {
            self.violate(step, key, "dispatching -> failed without not_dispatched");
        }
        if let Err(w) = coupling_ok(b) {
            self.violate(
                step,
                key,
                format!("{w}: {} with {:?}", b.state.as_str(), b.evidence),
            );
        }
        if matches!(
            a.evidence,
            RecordEvidence::Exited | RecordEvidence::Launched
        ) && b.evidence != a.evidence
        {
            self.violate(
                step,
                key,
                format!("evidence {:?} changed to {:?}", a.evidence, b.evidence),
            );
        }
        if a.result.is_some() && a.result != b.result {
            self.violate(
                step,
                key,
                format!("result changed: {:?} -> {:?}", a.result, b.result),
            );
        }
        if a.creation.is_some() && a.creation != b.creation {
            self.violate(step, key, "creation evidence changed");
        }
        if a.absence_at_ms.is_some() && a.absence_at_ms != b.absence_at_ms {
            self.violate(step, key, "absence timestamp changed");
        }
        let d = [
            ("queue", a.deadlines.queue_ms, b.deadlines.queue_ms),
            (
                "preparation",
                a.deadlines.preparation_ms,
                b.deadlines.preparation_ms,
            ),
            (
                "execution",
                a.deadlines.execution_ms,
                b.deadlines.execution_ms,
            ),
            (
                "collection",
                a.deadlines.collection_ms,
                b.deadlines.collection_ms,
            ),
            ("cleanup", a.deadlines.cleanup_ms, b.deadlines.cleanup_ms),
        ];
        for (name, x, y) in d {
            if x.is_some() && x != y {
                self.violate(step, key, format!("{name} deadline moved: {x:?} -> {y:?}"));
            }
        }
        if a.cancel_requested_at_ms.is_some()
            && a.cancel_requested_at_ms != b.cancel_requested_at_ms
        {
            self.violate(step, key, "cancel request time changed");
        }
        if a.state != ExecState::Dispatching && b.state == ExecState::Dispatching {
            let by = c.owner.as_deref();
            if c.kind != CommitKind::Write || prev.fresh_claim.as_deref() != by || by.is_none() {
                self.violate(
                    step,
                    key,
                    format!(
                        "dispatch intent by {by:?} not right after its own claim (latest claim: {:?}) (C15)",
                        prev.fresh_claim
                    ),
                );
            }
        }
    }

    /// Checks records against the worker's truth: a record that says
    /// nothing was sent had nothing arrive; a command arrived only once its
    /// intent was durable; a stored exit is the command's real exit.
    /// `identity` maps a key to its command's identity at the worker.
    ///
    /// Only records that changed since the last call (a commit, a cancel)
    /// and records whose command just arrived are checked: every rule here
    /// compares a record with the worker's count or truth for it, and
    /// neither side of a rule can change without one of those (the truth
    /// of a command only moves from running to its own exit, or to killed
    /// while no exit is stored), so checking the others again finds
    /// nothing new. (Checking every key on every step cost a tenth of the
    /// harness's CPU.)
    pub fn check_worker(
        &mut self,
        step: u64,
        worker: &SimWorker,
        arrivals: &[(Mutation, String)],
        identity: impl Fn(&RecordKey) -> String,
    ) {
        let launch = |m: &Mutation| matches!(m, Mutation::Exec | Mutation::Terminal);
        let mut check = std::mem::take(&mut self.dirty);
        if arrivals.iter().any(|(m, _)| launch(m)) {
            for key in self.keys.keys() {
                let id = identity(key);
                if arrivals.iter().any(|(m, i)| launch(m) && *i == id) {
                    check.insert(key.clone());
                }
            }
        }
        let mut found = Vec::new();
        for key in &check {
            let Some(k) = self.keys.get(key) else {
                continue;
            };
            let id = identity(key);
            let rec = &k.last;
            let n = worker.received(Mutation::Exec, &id) + worker.received(Mutation::Terminal, &id);
            if n > 0 && rec.evidence == RecordEvidence::NotDispatched {
                found.push((
                    key.clone(),
                    format!(
                        "{} with not_dispatched but the worker received the command",
                        rec.state.as_str()
                    ),
                ));
            }
            if n > 0 && self.cancelled.contains(key) {
                found.push((
                    key.clone(),
                    "cancelled before its intent but the command was sent (C16)".to_owned(),
                ));
            }
            if arrivals.iter().any(|(m, i)| launch(m) && *i == id) && before_dispatch(rec.state) {
                found.push((
                    key.clone(),
                    format!(
                        "command arrived while the record was {}",
                        rec.state.as_str()
                    ),
                ));
            }
            if let Some(ExecResult::Exited { exit_code, .. } | ExecResult::Terminal { exit_code }) =
                rec.result
            {
                let truth = worker.exec_truth(&id);
                if truth != Some(&ExecTruth::Exited(exit_code)) {
                    found.push((
                        key.clone(),
                        format!("stored exit {exit_code} but the worker says {truth:?}"),
                    ));
                }
            }
        }
        for (key, what) in found {
            self.violate(step, &key, what);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use smolbox_core::managed::testkit;

    #[test]
    fn the_table_matches_the_spec_in_both_directions() {
        use ExecState as S;
        assert!(allowed(S::Ready, S::Dispatching));
        assert!(!allowed(S::Unknown, S::Ready));
        assert!(!allowed(S::Unknown, S::Dispatching));
        assert!(!allowed(S::Completed, S::Collecting));
        assert!(!allowed(S::Accepted, S::Dispatching));
    }

    fn commit(kind: CommitKind, owner: Option<&str>, record: ExecutionRecord) -> Commit {
        Commit {
            kind,
            owner: owner.map(str::to_owned),
            record,
        }
    }

    #[test]
    fn a_move_back_before_dispatch_and_a_changed_result_are_violations() {
        let key = testkit::key("s", "k");
        let acc = testkit::exec_in(ExecState::Accepted, key.clone(), 1_000).unwrap();
        let unk = testkit::exec_in(ExecState::Unknown, key.clone(), 1_000).unwrap();
        let mut m = Model::new();
        m.observe_commits(1, vec![commit(CommitKind::Accept, None, acc)]);
        assert!(m.violations.is_empty(), "{:?}", m.violations);
        let mut back = unk.clone();
        back.state = ExecState::Ready;
        back.evidence = RecordEvidence::NotDispatched;
        back.version = unk.version + 1;
        m.observe_commits(2, vec![commit(CommitKind::Write, Some("o"), unk)]);
        m.observe_commits(3, vec![commit(CommitKind::Write, Some("o"), back)]);
        assert!(
            m.violations
                .iter()
                .any(|v| v.what.contains("went back before dispatch")),
            "{:?}",
            m.violations
        );
    }

    #[test]
    fn a_second_exit_and_a_moved_deadline_are_violations() {
        let key = testkit::key("s", "k");
        let done = testkit::exec_in(ExecState::Completed, key.clone(), 1_000).unwrap();
        let mut acc = testkit::exec_in(ExecState::Accepted, key, 1_000).unwrap();
        acc.version = 1;
        let mut m = Model::new();
        m.observe_commits(1, vec![commit(CommitKind::Accept, None, acc)]);
        let mut first = done.clone();
        first.version = 10;
        let mut second = done;
        second.version = 11;
        second.result = Some(ExecResult::Exited {
            exit_code: 99,
            output_bytes: 0,
            truncated: false,
        });
        second.deadlines.execution_ms = second.deadlines.execution_ms.map(|d| d + 1);
        m.observe_commits(2, vec![commit(CommitKind::Write, Some("o"), first)]);
        let before = m.violations.len();
        m.observe_commits(3, vec![commit(CommitKind::Write, Some("o"), second)]);
        let new: Vec<&str> = m.violations[before..]
            .iter()
            .map(|v| v.what.as_str())
            .collect();
        assert!(new.iter().any(|w| w.contains("result changed")), "{new:?}");
        assert!(
            new.iter().any(|w| w.contains("execution deadline moved")),
            "{new:?}"
        );
    }

    #[test]
    fn an_intent_without_a_fresh_claim_is_a_violation() {
        let key = testkit::key("s", "k");
        let ready = testkit::exec_in(ExecState::Ready, key.clone(), 1_000).unwrap();
        let mut disp = testkit::exec_in(ExecState::Dispatching, key, 1_000).unwrap();
        disp.version = ready.version + 1;
        let mut m = Model::new();
        let mut acc = ready.clone();
        acc.state = ExecState::Accepted;
        m.observe_commits(1, vec![commit(CommitKind::Accept, None, acc)]);
        m.observe_commits(2, vec![commit(CommitKind::Write, Some("o"), ready.clone())]);
        m.observe_commits(3, vec![commit(CommitKind::Write, Some("o"), disp.clone())]);
        assert!(
            m.violations.iter().any(|v| v.what.contains("C15")),
            "{:?}",
            m.violations
        );
        let mut m2 = Model::new();
        let mut acc = ready.clone();
        acc.state = ExecState::Accepted;
        m2.observe_commits(1, vec![commit(CommitKind::Accept, None, acc)]);
        m2.observe_commits(2, vec![commit(CommitKind::Claim, Some("o"), ready)]);
        m2.observe_commits(3, vec![commit(CommitKind::Write, Some("o"), disp)]);
        assert!(
            !m2.violations.iter().any(|v| v.what.contains("C15")),
            "{:?}",
            m2.violations
        );
    }
}
