//! What the retained run also does, from its own random stream (so the
//! rest of a seed's schedule does not move with it): callers reconcile
//! their machine and list the store's machines page by page; an operator
//! drains a machine whose slot a live command or terminal holds (a
//! maintenance stop; C17.3's drain is a stop, the quiesced assertion
//! belongs to resolve); and a careless operator asserts `quiesced = true`
//! for a machine that is running at the worker. A child module of the
//! driver.
//!
//! Rules checked here (the slot model checks the machine commits these
//! cause like any other):
//! - a listing of every page (cursor, limit 1–3) returns each machine
//!   record the model has seen exactly once, deleted ones included, in
//!   id order, no page longer than its limit, none newer than the model's
//!   last commit of it (C14.2 `list`);
//! - a resolve asserting `quiesced` for a machine running at the worker
//!   all along is refused (`identity_conflict`, AC-17.3.2) and changes
//!   nothing: an `Ok` answer or any commit of that machine meanwhile is a
//!   violation.

use std::collections::BTreeMap;

use smolbox_core::managed::terminal::ConsumerId;

use smolbox_core::managed::RecordKey;
use smolbox_core::managed::controller::{MachineAnswer, MachineRequest, Resolution};
use smolbox_core::managed::record::MachineRecord;
use smolbox_core::managed::state::{ExecState, MachineOperation, MachineRecordState};
use smolbox_core::{Category, Error};
use smolbox_store::Store;

use super::super::rng::Rng;
use super::retained::What;
use super::{Bug, Sim};

/// The probes' own state.
#[derive(Debug)]
pub(super) struct Probes {
    rng: Rng,
    /// This seed has a careless operator.
    careless: bool,
    /// This seed's operator drains machines with a live holder.
    maintenance: bool,
    /// Machines drained for maintenance (once each).
    drained: Vec<RecordKey>,
    /// Careless resolves in flight: machine → its version when sent.
    careless_sent: BTreeMap<RecordKey, u64>,
    /// How often each probe ran or each checked outcome was seen.
    pub(super) counts: BTreeMap<&'static str, u64>,
    /// This seed's sentinel: consumers type it into managed terminals and
    /// the programs echo it; it must never reach a record, the trace
    /// (the shells' logs) or any `Debug` output of the controller, the
    /// terminal runs or the store.
    sentinel: String,
    /// A trace line carried the sentinel (checked as each line is logged:
    /// the trace keeps only its last lines).
    pub(super) leaked_to_trace: bool,
}

impl Probes {
    pub(super) fn new(seed: u64) -> Self {
        let mut rng = Rng::fork(seed, 14);
        let careless = rng.chance(300);
        let maintenance = rng.chance(300);
        Self {
            rng,
            careless,
            maintenance,
            drained: Vec::new(),
            careless_sent: BTreeMap::new(),
            counts: BTreeMap::new(),
            sentinel: format!("tty-sentinel-{seed:016x}"),
            leaked_to_trace: false,
        }
    }

    fn count(&mut self, what: &'static str) {
        *self.counts.entry(what).or_insert(0) += 1;
    }
}

impl Probes {
    /// The worker a disposable command runs on (half on each).
    pub(super) fn pick_worker(&mut self) -> &'static str {
        let w = super::WORKER_IDS[usize::from(self.rng.chance(500))];
        *self
            .counts
            .entry(if w == super::WORKER_ID {
                "on_w1"
            } else {
                "on_w2"
            })
            .or_insert(0) += 1;
        w
    }

    /// True when `line` carries this seed's sentinel (only once anything
    /// was typed).
    pub(super) fn leaks(&self, line: &str) -> bool {
        self.counts.contains_key("terminal_bytes_typed") && line.contains(&self.sentinel)
    }
}

impl Sim {
    /// One probe at caller `m`'s step, seeing record `r`; true when it took
    /// the step (a request was sent).
    pub(super) fn probe(&mut self, h: usize, m: usize, r: &MachineRecord) -> bool {
        if self.probes.rng.chance(60) {
            self.list_all(&r.key.scope);
        }
        if r.state == MachineRecordState::Deleted {
            return false;
        }
        let key = r.key.clone();
        let name = r.assignment.as_ref().map(|a| a.machine_name.clone());
        let running_there = name.as_deref().is_some_and(|n| self.worker.is_running(n));
        // A careless operator: the machine runs at the worker, nothing is
        // on its way there that could stop it, and nobody else acts on it.
        if self.probes.careless
            && !self.chaos
            && running_there
            && r.operation == MachineOperation::None
            && !self.worker.requests_in_flight()
            && self.hosts.iter().all(|x| x.paused_until <= self.now())
            && self.probes.rng.chance(150)
        {
            self.probes.careless_sent.insert(key.clone(), r.version);
            self.probes.count("careless_resolve");
            self.request(
                h,
                m,
                What::Careless,
                MachineRequest::Resolve {
                    key,
                    version: r.version,
                    quiesced: true,
                    disposition: Resolution::Stopped,
                },
            );
            return true;
        }
        // A maintenance drain while a live command or terminal holds the
        // slot: its program is killed with the machine; a confirmed finish
        // that follows must leave the record `stopped` (seed 185).
        let live_holder = r
            .active_execution
            .as_ref()
            .and_then(|k| self.model.last(k))
            .is_some_and(|e| !e.state.is_before_dispatch() && e.state != ExecState::Unknown);
        if self.probes.maintenance
            && running_there
            && live_holder
            && r.creation.is_some()
            && !self.probes.drained.contains(&key)
            && self.probes.rng.chance(300)
        {
            self.probes.drained.push(key.clone());
            self.probes.count("maintenance_drain");
            self.request(
                h,
                m,
                What::Maintenance,
                MachineRequest::StopForDrain {
                    key,
                    version: r.version,
                },
            );
            return true;
        }
        if r.creation.is_some() && self.probes.rng.chance(80) {
            self.probes.count("reconcile");
            self.request(h, m, What::Reconcile, MachineRequest::Reconcile { key });
            return true;
        }
        false
    }

    /// The answer to a probe's request.
    pub(super) fn on_probe_done(
        &mut self,
        what: What,
        key: &RecordKey,
        result: &Result<MachineAnswer, Error>,
    ) {
        match (what, result) {
            (What::Careless, r) => {
                let Some(sent) = self.probes.careless_sent.remove(key) else {
                    return;
                };
                let _ = sent;
                match r {
                    Ok(_) => self.violation(format!(
                        "{}/{}: a resolve asserting quiesced for a machine running at the worker was applied (must be identity_conflict, AC-17.3.2)",
                        key.scope, key.id
                    )),
                    Err(e) if e.category() == Category::IdentityConflict => {
                        self.probes.count("careless_refused");
                    }
                    Err(_) => {}
                }
            }
            (What::Reconcile, Ok(_)) => self.probes.count("reconcile_ok"),
            (What::Maintenance, Ok(_)) => self.probes.count("maintenance_drained"),
            _ => {}
        }
    }

    /// The consumer that attached to terminal `key` types the sentinel;
    /// the program echoes it.
    pub(super) fn type_into(&mut self, h: usize, key: &RecordKey, who: ConsumerId) {
        let bytes = format!("echo {}\r", self.probes.sentinel).into_bytes();
        let Some(conn) = self.hosts[h]
            .registry
            .as_mut()
            .and_then(|reg| reg.get(key, who).ok())
        else {
            return;
        };
        conn.typed.extend_from_slice(&bytes);
        conn.output.extend_from_slice(&bytes);
        self.probes.count("terminal_bytes_typed");
        if self.opts.bug == Some(Bug::LogTerminalBytes) {
            let typed = String::from_utf8_lossy(&bytes).into_owned();
            self.log(format!("consumer of {} typed {typed:?}", key.id));
        }
    }

    /// No terminal bytes anywhere but in the connections: every stored
    /// execution and machine record, the trace, the controllers' and the
    /// terminal runs' `Debug` output.
    pub(super) fn check_terminal_bytes(&mut self) {
        if !self.probes.counts.contains_key("terminal_bytes_typed") {
            return;
        }
        let s = self.probes.sentinel.clone();
        let mut found: Vec<&'static str> = Vec::new();
        let mut after: Option<String> = None;
        while let Ok(page) = self.store.inner().list("sim", after.as_deref(), 100) {
            if page.records.iter().any(|r| format!("{r:?}").contains(&s)) {
                found.push("a stored execution record");
            }
            match page.next {
                Some(c) => after = Some(c),
                None => break,
            }
        }
        if let Ok(page) = self.store.inner().list_machines("sim", None, 100)
            && page.records.iter().any(|r| format!("{r:?}").contains(&s))
        {
            found.push("a stored machine record");
        }
        if self.probes.leaked_to_trace || self.trace.iter().any(|l| l.contains(&s)) {
            found.push("the trace (logs)");
        }
        for host in &self.hosts {
            if host
                .ctl
                .as_ref()
                .is_some_and(|c| format!("{c:?}").contains(&s))
            {
                found.push("a controller's Debug output");
            }
            if host.terms.values().any(|t| format!("{t:?}").contains(&s)) {
                found.push("a terminal run's Debug output");
            }
        }
        found.dedup();
        for place in found {
            self.violation(format!(
                "terminal bytes typed into a managed terminal found in {place}"
            ));
        }
    }

    /// Lists every machine of `scope` page by page through the faulty
    /// store and checks the listing against the model.
    fn list_all(&mut self, scope: &str) {
        let limit = self.probes.rng.range(1, 3) as u32;
        let mut after: Option<String> = None;
        let mut seen: Vec<MachineRecord> = Vec::new();
        loop {
            // A failed page proves nothing; the listing is abandoned.
            let Ok(page) = self.store.list_machines(scope, after.as_deref(), limit) else {
                return;
            };
            let mut records = page.records;
            if self.opts.bug == Some(Bug::ListSkipsDeleted) {
                records.retain(|r| r.state != MachineRecordState::Deleted);
            }
            if records.len() > limit as usize {
                self.violation(format!(
                    "list page of {} records with limit {limit}",
                    records.len()
                ));
            }
            let full = records.len() == limit as usize;
            seen.extend(records);
            match page.next {
                Some(c) if !full && self.opts.bug.is_none() => {
                    self.violation(format!("list page not full yet a cursor {c} follows"));
                    return;
                }
                Some(c) => after = Some(c),
                None => break,
            }
        }
        self.probes.count("list");
        let ids: Vec<&str> = seen.iter().map(|r| r.key.id.as_str()).collect();
        if ids.windows(2).any(|w| w[0] >= w[1]) {
            self.violation(format!(
                "list of {scope} not in strict id order (a record twice?): {ids:?}"
            ));
        }
        let want: Vec<MachineRecord> = self
            .slot_model
            .all()
            .filter(|r| r.key.scope == scope)
            .cloned()
            .collect();
        for w in &want {
            match seen.iter().find(|r| r.key == w.key) {
                None => self.violation(format!(
                    "{}/{}: list left out a machine the store holds ({}, C14.2: deleted ones included)",
                    w.key.scope,
                    w.key.id,
                    w.state.as_str()
                )),
                Some(r) if r.version + r.claims > w.version + w.claims => self.violation(format!(
                    "{}/{}: list returned v{}+{} newer than the last commit v{}+{}",
                    w.key.scope, w.key.id, r.version, r.claims, w.version, w.claims
                )),
                Some(_) => {}
            }
        }
        for r in &seen {
            if !want.iter().any(|w| w.key == r.key) {
                self.violation(format!(
                    "{}/{}: list returned a machine never committed",
                    r.key.scope, r.key.id
                ));
            }
        }
    }
}
