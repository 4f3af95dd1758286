//! Releasing this controller's claims when it shuts down (C15), so the
//! next controller (the next CLI process, a restarted service) takes over
//! at once instead of waiting out the claim TTL.
//!
//! The controller remembers the claims it holds from the records its own
//! store ops return (never from a due page: a record another part of this
//! process claims under the same owner, a managed terminal, is not the
//! controller's to release). At [`Controller::shutdown`] it releases, with
//! [`StoreOp::ReleaseClaim`] guarded by owner and claim generation:
//! - every execution claim it is not driving any more (a record still
//!   driven is released once it ends), except records that are not due
//!   (no successor moves them: a settled or `unknown` record);
//! - machine claims and worker leases once nothing is driven, no request
//!   is in flight and the driver reports no live terminal run of this
//!   process ([`Controller::set_terminals_live`]): terminal runs share the
//!   owner and use the machine claim and the worker lease. A shutdown never
//!   waits for terminal runs: with one live, those claims lapse with their
//!   TTL.
//!
//! A release never changes a state, evidence or slot and never frees
//! capacity; a refused release (another controller took the claim over, the
//! store failed) is not retried: the claim then lapses with its TTL, as
//! after a crash. A crash releases nothing.
//!
//! Memory is bounded: at most [`MAX_HELD`] claims are remembered; past it,
//! lapsed ones are forgotten first, then the oldest key (its claim simply
//! lapses with the TTL).

use std::time::Instant;

use super::ops::{Claimed, StoreOp, StoreReply, StoreResult};
use super::{Controller, Purpose};
use crate::managed::record::{ExecutionRecord, MachineRecord};

/// Most claims a controller remembers for its release at shutdown.
pub const MAX_HELD: usize = 1_024;

/// A claim this controller holds, as last seen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Held {
    generation: u64,
    until_ms: u64,
    /// False for a record nobody moves any more (not due).
    needed: bool,
    releasing: bool,
}

impl Controller {
    /// Tells the controller whether terminal runs of this process (which
    /// take claims under the same owner) are live; while they are, a
    /// shutdown keeps the machine claims and worker leases (see the
    /// module docs of `release`). The driver reports it after every input.
    pub fn set_terminals_live(&mut self, now: Instant, live: bool) {
        if self.terminals_live != live {
            self.terminals_live = live;
            if self.shutting_down {
                self.pump(now);
            }
        }
    }

    /// Claims remembered for the release at shutdown (for tests).
    pub fn held_claims(&self) -> usize {
        self.held.len()
    }

    /// Remembers (or forgets) the claims the records in an answer show.
    pub(super) fn note_claims(&mut self, purpose: &Purpose, result: &StoreResult) {
        if matches!(
            purpose,
            Purpose::Scan | Purpose::MachineScan | Purpose::Release(_)
        ) {
            return;
        }
        match result {
            Ok(StoreReply::Record(r) | StoreReply::Accepted { record: r, .. }) => self.note_exec(r),
            Ok(StoreReply::Machine(m) | StoreReply::MachineAccepted { record: m, .. }) => {
                self.note_machine(m);
            }
            Ok(StoreReply::Submitted {
                execution, machine, ..
            }) => {
                self.note_exec(execution);
                if let Some(m) = machine {
                    self.note_machine(m);
                }
            }
            Ok(StoreReply::SlotFinished {
                machine, execution, ..
            }) => {
                self.note_exec(execution);
                self.note_machine(machine);
            }
            Ok(StoreReply::Resolved { machine, command }) => {
                self.note_machine(machine);
                if let Some(c) = command {
                    self.note_exec(c);
                }
            }
            _ => {}
        }
    }

    fn note_exec(&mut self, r: &ExecutionRecord) {
        if matches!(r.spec.action, crate::managed::spec::Action::Terminal(_)) {
            // A terminal's claim belongs to its run in the driver.
            return;
        }
        // Only a due record waits for a successor (the due scan); one that
        // is not due is moved by nobody, so its claim is left to lapse.
        let needed = r.next_due_at_ms.is_some();
        let claim = r.claim.as_ref().map(|c| (c.owner.as_str(), c.until_ms));
        self.note(
            Claimed::Execution(r.key.clone()),
            claim,
            r.generation,
            needed,
        );
    }

    fn note_machine(&mut self, m: &MachineRecord) {
        let claim = m.claim.as_ref().map(|c| (c.owner.as_str(), c.until_ms));
        self.note(Claimed::Machine(m.key.clone()), claim, m.generation, true);
    }

    fn note(&mut self, what: Claimed, claim: Option<(&str, u64)>, generation: u64, needed: bool) {
        match claim {
            Some((owner, until_ms)) if owner == self.cfg.owner && until_ms > self.now_ms => {
                if !self.held.contains_key(&what) && self.held.len() >= MAX_HELD {
                    let now_ms = self.now_ms;
                    self.held.retain(|_, h| h.until_ms > now_ms || h.releasing);
                    if self.held.len() >= MAX_HELD {
                        self.held.pop_first();
                    }
                }
                let releasing = self.held.get(&what).is_some_and(|h| h.releasing);
                self.held.insert(
                    what,
                    Held {
                        generation,
                        until_ms,
                        needed,
                        releasing,
                    },
                );
            }
            // Lapsed, released, or another controller's now.
            _ => {
                if self.held.get(&what).is_some_and(|h| !h.releasing) {
                    self.held.remove(&what);
                }
            }
        }
    }

    /// The answer to a release: forgotten either way (never retried).
    pub(super) fn on_released(&mut self, what: &Claimed) {
        self.held.remove(what);
        if let Claimed::Worker(w) = what
            && let Some(st) = self.leases.map.get_mut(w)
        {
            st.lease = None;
            st.at = None;
            st.until = None;
            st.inflight = false;
        }
    }

    /// Nothing of this process uses a worker lease: nothing driven, no op
    /// but releases and cancels outstanding, no live terminal run.
    fn quiet(&self) -> bool {
        self.execs.is_empty()
            && self.accepting.is_empty()
            && self.machs.is_empty()
            && self.reqs.is_empty()
            && self.slot_machines.is_empty()
            && !self.terminals_live
            && self
                .ops
                .values()
                .all(|p| matches!(p, Purpose::Release(_) | Purpose::Cancel(_)))
    }

    /// While running: once nothing of this process uses them, the worker
    /// leases it holds are released at once rather than left to lapse
    /// (sim finding 14, disposable seed 966): an idle lease kept every
    /// other controller's records on that worker waiting for up to a TTL
    /// each, and with many controllers queued for it one paused with a
    /// confirmed exit never got its turn. The lease counts as gone from
    /// the moment the release is sent (no write uses it, no claim is sent
    /// for that worker until the release is answered); a later need takes
    /// it again (a new generation when another took it meanwhile; records
    /// assigned under the old one are re-fenced as after any lapse).
    pub(super) fn release_unused_leases(&mut self) {
        if self.shutting_down || !self.quiet() {
            return;
        }
        let now_ms = self.now_ms;
        let mut out = Vec::new();
        for (w, st) in &mut self.leases.map {
            if st.inflight {
                continue;
            }
            let Some(l) = st.lease.take() else {
                continue;
            };
            st.at = None;
            st.until = None;
            if l.owner != self.cfg.owner || l.until_ms <= now_ms {
                continue;
            }
            st.inflight = true;
            out.push((w.clone(), l.generation));
        }
        for (w, generation) in out {
            let what = Claimed::Worker(w);
            self.held.remove(&what);
            self.push_release(what, generation, now_ms);
        }
    }

    /// At shutdown: releases what is not in use any more (module docs).
    pub(super) fn release_idle(&mut self) {
        if !self.shutting_down || self.stopped_sent {
            return;
        }
        let now_ms = self.now_ms;
        // What needs nobody, or has lapsed, is not released: forgotten.
        self.held
            .retain(|_, h| h.releasing || (h.needed && h.until_ms > now_ms));
        let quiet = self.quiet();
        if quiet {
            for (w, st) in &self.leases.map {
                if let Some(l) = &st.lease
                    && l.owner == self.cfg.owner
                    && l.until_ms > now_ms
                {
                    let what = Claimed::Worker(w.clone());
                    self.held.entry(what).or_insert(Held {
                        generation: l.generation,
                        until_ms: l.until_ms,
                        needed: true,
                        releasing: false,
                    });
                }
            }
        }
        let busy: std::collections::BTreeSet<_> = self
            .active_keys()
            .chain(self.slot_machines.keys())
            .cloned()
            .collect();
        let mut out = Vec::new();
        for (what, h) in &mut self.held {
            if h.releasing {
                continue;
            }
            let free = match what {
                Claimed::Execution(k) => !busy.contains(k),
                Claimed::Machine(_) | Claimed::Worker(_) => quiet,
            };
            if free {
                h.releasing = true;
                out.push((what.clone(), h.generation));
            }
        }
        for (what, generation) in out {
            self.push_release(what, generation, now_ms);
        }
    }

    /// Sends the release of `what` at `generation`, guarded by this
    /// controller's owner id.
    fn push_release(&mut self, what: Claimed, generation: u64, now_ms: u64) {
        let op = StoreOp::ReleaseClaim {
            claimed: what.clone(),
            owner: self.cfg.owner.clone(),
            generation,
            now_ms,
        };
        self.push_store(Purpose::Release(what), op);
    }
}
