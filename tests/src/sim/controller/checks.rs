//! The end-of-step and end-of-seed checks of the driver (split from
//! `controller.rs`): whether a seed has settled, the reference models fed
//! with each step's commits, the C15 renewal rule, and the end-of-seed
//! rules (every wait ended, no leaked machine, no lost exit).

use smolbox_core::Category;
use smolbox_core::managed::RecordKey;
use smolbox_store::Store;

use super::super::model::Violation;
use super::super::worker::{self, Mutation};
use super::{CHAOS_MS, Ev, IDLE_MS, QUIET_MS, Sim, TTL_MS};

impl Sim {
    /// True when the rest of the quiescent window cannot change anything:
    /// no faults or crashes any more, nothing committed for [`IDLE_MS`]
    /// (every claim of a crashed controller has lapsed), no request, reply
    /// or late effect pending at the worker, no controller paused or
    /// driving anything (an execution or machine in its memory may still
    /// act, e.g. retry a late exit once another claim lapses), no
    /// event queued but timers (and resubmits of accepted keys, which do
    /// nothing), and no record due before the end. What remains are the
    /// live controllers' due scans, which find nothing: the end-of-run
    /// checks then see the state the full window would have left. (Most
    /// of a seed's due scans were in this idle tail.)
    /// Why the run has not settled (for `SMOLBOX_SIM_WHY`).
    fn unsettled_why(&self, end: u64) -> String {
        let now = self.now();
        let mut w = Vec::new();
        if now < self.last_commit_ms + IDLE_MS {
            w.push(format!("commit at {}", self.last_commit_ms));
        }
        if self.worker.next_event_ms().is_some() {
            w.push("worker pending".to_owned());
        }
        for (i, h) in self.hosts.iter().enumerate() {
            if let Some(c) = &h.ctl
                && (c.active() > 0 || c.machines_active() > 0)
            {
                w.push(format!(
                    "ctl-{i} active {} machines {}",
                    c.active(),
                    c.machines_active()
                ));
            }
            if !h.terms.is_empty() {
                w.push(format!("ctl-{i} terms {}", h.terms.len()));
            }
        }
        if self
            .slot_model
            .any_due_by(self.clock.wall_ms() + end.saturating_sub(now))
        {
            w.push("machine due".to_owned());
        }
        if self
            .model
            .any_due_by(self.clock.wall_ms() + end.saturating_sub(now))
        {
            w.push("exec due".to_owned());
        }
        for m in &self.ret.machines {
            if !m.done {
                let r = self.slot_model.last(&m.key);
                let holder = r
                    .and_then(|r| r.active_execution.as_ref())
                    .and_then(|k| self.model.last(k))
                    .map(|e| e.state.as_str());
                w.push(format!(
                    "caller {} not done ({:?} {:?} holder {holder:?})",
                    m.key.id,
                    r.map(|r| r.state.as_str()),
                    r.map(|r| r.operation)
                ));
            }
        }
        w.join(", ")
    }

    pub(super) fn settled(&self, end: u64) -> bool {
        let now = self.now();
        if self.full_window || self.chaos || now < self.last_commit_ms + IDLE_MS {
            return false;
        }
        if self.worker.next_event_ms().is_some()
            || self.hosts.iter().any(|h| {
                h.paused_until > now
                    || h.ctl
                        .as_ref()
                        .is_some_and(|c| c.active() > 0 || c.machines_active() > 0)
            })
        {
            return false;
        }
        if self.hosts.iter().any(|h| !h.terms.is_empty())
            || self
                .slot_model
                .any_due_by(self.clock.wall_ms() + end.saturating_sub(now))
        {
            return false;
        }
        let quiet = self.events.values().all(|e| match **e {
            Ev::Timer(..) | Ev::RegTimer(..) | Ev::Attach(..) => true,
            Ev::Caller(m) => self.ret.machines[m].done,
            Ev::Resubmit(j) => self.jobs[j].accepted,
            _ => false,
        });
        let wall_end = self.clock.wall_ms() + end.saturating_sub(now);
        quiet && !self.model.any_due_by(wall_end)
    }

    pub(super) fn check(&mut self, arrivals: &[(Mutation, String)]) {
        let before = self.model.violations.len();
        let commits = self.store.take_commits();
        if !commits.is_empty() {
            self.last_commit_ms = self.now();
        }
        self.model.check_absence(self.step, &commits, &self.worker);
        let mcommits = self.store.take_machine_commits();
        self.check_refusal_commits(&commits, &mcommits);
        self.model.observe_commits(self.step, commits);
        if !mcommits.is_empty() {
            self.last_commit_ms = self.now();
            let mut out = Vec::new();
            let model = &self.model;
            self.slot_model.observe(
                self.step,
                mcommits,
                &self.worker,
                |k| model.last(k).cloned(),
                &self.ret.authorized,
                &mut out,
            );
            self.model.violations.extend(out);
        }
        self.check_renewal();
        for (m, id) in arrivals {
            if *m == Mutation::Delete && self.refusals.delete_forbidden(id) {
                self.violation(format!(
                    "Delete of {id} reached the worker after its owner asked to delete it with its absence recorded (that delete settles without a worker call)"
                ));
            }
        }
        self.model
            .check_worker(self.step, &self.worker, arrivals, |k| k.id.clone());
        for v in self.worker.take_violations() {
            self.model.violations.push(Violation {
                step: self.step,
                what: v,
            });
        }
        if before == 0 && !self.model.violations.is_empty() && self.frozen.is_none() {
            self.frozen = Some(self.trace.iter().cloned().collect());
        }
    }

    /// C15 / issue 12: the record claim is renewed while the command runs.
    /// While a controller that was never paused waits for a command the
    /// worker is still running, the record must stay claimed by it (a
    /// grace of a third of the TTL for renewals delayed by store failures).
    fn check_renewal(&mut self) {
        let wall = self.clock.wall_ms();
        let mut found = Vec::new();
        for (key, (h, _)) in &self.running {
            let host = &self.hosts[*h];
            if host.ctl.is_none() || host.was_paused {
                continue;
            }
            if !matches!(
                self.worker.exec_truth(&key.id),
                Some(worker::ExecTruth::Running { .. })
            ) {
                continue;
            }
            // The record as last committed (the commit log is complete for
            // execution records, so this is the store's; no decode).
            let Some(rec) = self.model.last(key) else {
                continue;
            };
            let owner = Self::owner(*h);
            let held = rec
                .claim
                .as_ref()
                .is_some_and(|c| c.owner == owner && c.until_ms + TTL_MS / 3 >= wall);
            if !held && rec.result.is_none() {
                found.push(format!(
                    "{}/{}: the claim lapsed while {owner} waits for the running command (claim {:?}, now {wall}) (C15 renewal)",
                    key.scope, key.id, rec.claim
                ));
            }
        }
        for what in found {
            self.violation(what);
        }
        // One report per command.
        if !self.model.violations.is_empty() {
            let flagged: Vec<RecordKey> = self
                .running
                .keys()
                .filter(|k| {
                    self.model.violations.iter().any(|v| {
                        v.what
                            .starts_with(&format!("{}/{}: the claim lapsed", k.scope, k.id))
                    })
                })
                .cloned()
                .collect();
            for k in flagged {
                self.running.remove(&k);
            }
        }
    }

    /// Every accepted record's wait has ended; every exit a surviving
    /// controller saw is stored.
    pub(super) fn finish(&mut self) {
        if std::env::var_os("SMOLBOX_SIM_WHY").is_some() && !self.ended_early {
            let why = self.unsettled_why(CHAOS_MS + QUIET_MS);
            eprintln!("not settled after {} steps: {why}", self.step);
        }
        if self.opts.retained {
            self.finish_retained();
        }
        self.check_files();
        self.check_refused_creates();
        for j in 0..self.jobs.len() {
            let key = self.jobs[j].key.clone();
            let stored = match self.store.inner().fetch(&key) {
                Ok(r) => Some(r),
                Err(e) if e.category() == Category::NotFound => None,
                Err(e) => {
                    self.violation(format!("ground truth unreadable: {e:?}"));
                    None
                }
            };
            if let Some(r) = &stored
                && !r.state.ends_wait()
            {
                self.violation(format!(
                    "{}/{}: the wait never ended (record {} after {} s quiescent)",
                    key.scope,
                    key.id,
                    r.state.as_str(),
                    QUIET_MS / 1_000
                ));
            }
            // No machine is left at the worker with its reservation gone
            // (capacity is held until absence is known, C14.4).
            if let Some(r) = &stored
                && let Some(a) = &r.assignment
                && r.reservation.is_none()
                && (self.worker.has_machine(&a.machine_name)
                    || self.worker.create_may_still_land(&a.machine_name))
            {
                self.violation(format!(
                    "{}/{}: machine {} left at the worker with its reservation released (a leak)",
                    key.scope, key.id, a.machine_name
                ));
            }
            if self.jobs[j].accepted && stored.is_none() {
                self.violation(format!("{}/{}: accepted but absent", key.scope, key.id));
            }
            let alive = |h: &usize| self.hosts.get(*h).filter(|h| h.ctl.is_some());
            let seen = &self.jobs[j].exit_seen;
            let steady = seen.iter().any(|h| alive(h).is_some_and(|h| !h.was_paused));
            let paused = seen.iter().any(|h| alive(h).is_some_and(|h| h.was_paused));
            let lost = stored.as_ref().is_none_or(|r| r.result.is_none());
            let state = stored.as_ref().map(|r| r.state.as_str());
            if self.opts.strict && lost && steady {
                self.violation(format!(
                    "{}/{}: an exit seen by a controller that stayed up was never stored (record {state:?})",
                    key.scope, key.id
                ));
            } else if self.opts.strict && lost && paused {
                self.violation(format!(
                    "{}/{}: an exit seen by a controller that was paused and came back was never stored (record {state:?})",
                    key.scope, key.id
                ));
            }
        }
    }
}
