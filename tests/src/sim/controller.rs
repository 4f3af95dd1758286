//! The driver of one seed over the real `managed::controller::Controller`
//! (DESIGN.md §5a): each simulated controller process is one `Controller`
//! under its own owner; the driver performs its store ops against the
//! [`FaultStore`] and its worker ops against the [`SimWorker`], wakes it at
//! `poll_timeout`, crashes or pauses it at the crash points, and starts a
//! replacement (new owner, later clock) that recovers by its own due scan.
//! Callers only submit, re-submit when no acceptance came, and cancel; no
//! caller names keys to recover.
//!
//! All of the strict rules apply (the `Controller` promises them): a cancel
//! committed before the intent stops the dispatch; an exit seen by a
//! controller that stays up is stored; commands run up to three claim TTLs.

use smolbox_core::Reason;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

use smolbox_core::exec::ExecOutcome;
use smolbox_core::managed::controller::{
    Controller, ControllerConfig, ControllerEvent, OpId, StoreOp, StoreReply, StoreResult, Submit,
    WorkerEntry, WorkerOp, WorkerReply, spec_for,
};
use smolbox_core::managed::record::{Claim, ExecResult, ExecutionRecord};
use smolbox_core::managed::state::Cleanup;
use smolbox_core::managed::{ExecState, ExecutionSpec, RecordKey, testkit};
use smolbox_core::worker::{MachineSpec, Profile, Version};
use smolbox_core::{Category, Error, Evidence, Operation};
use smolbox_store::Store;

mod catalog;
mod checks;
mod conn;
mod files;
pub use files::launches_on;
mod probes;
mod refusals;
mod replies;
mod retained;

use smolbox_core::managed::controller::terminal::{TermStoreOp, TermStoreResult};
use smolbox_core::managed::terminal::Registry;

use self::retained::{Retained, TermHost};
use super::clock::VirtualClock;
use super::model::{Model, Violation};
use super::rng::Rng;
use super::slot_model::SlotModel;
use super::store::{FaultStore, StoreFaults};
use super::worker::{self, Reply, Request, SimWorker, WorkerFaults};
use super::{Bug, Options, SeedReport};

const WORKER_ID: &str = "w1";
/// Every controller is configured with both workers: each has its own
/// worker lease (generation, fencing) and its own capacity in the store;
/// the disposable run spreads its commands over them. One simulated worker
/// process hosts both (disposable machine names are unique per command).
const WORKER_IDS: [&str; 2] = [WORKER_ID, "w2"];
const MACHINE: &str = "m0";
const TTL_MS: u64 = 30_000;
const POLL_MS: u64 = 2_000;
const CHAOS_MS: u64 = 120_000;
/// Quiescent time after the chaos window: every wait must end within it.
const QUIET_MS: u64 = 200_000;
const MAX_STEPS: u64 = 60_000;
/// In the quiescent window, a run ends early once nothing has been
/// committed for this long and nothing can happen any more (see
/// [`Sim::settled`]).
const IDLE_MS: u64 = 2 * TTL_MS;
const CRASH: u32 = 20;
/// Per-mille chance at a worker crash point (there are few of them).
const CRASH_WORKER: u32 = 150;

const STORE_FAULTS: StoreFaults = StoreFaults {
    fail_before: 25,
    lose_reply: 25,
    timeout: 15,
    outage: 5,
    stale_read: 100,
};

const WORKER_FAULTS: WorkerFaults = WorkerFaults {
    refuse: 30,
    lose_reply: 40,
    timeout_408: 40,
    late_create: 100,
    late_stop: 100,
    refuse_create: 50,
};

#[derive(Debug)]
struct Job {
    key: RecordKey,
    spec: ExecutionSpec,
    accepted: bool,
    /// Hosts that were handed this command's exit.
    exit_seen: Vec<usize>,
}

#[derive(Debug)]
struct Host {
    ctl: Option<Controller>,
    paused_until: u64,
    timer: Option<u64>,
    /// Ops outstanding: op id → key (for the planted bugs' bookkeeping).
    store_ops: BTreeMap<OpId, Option<RecordKey>>,
    /// `DispatchBeforeIntent`: key → (request, early reply).
    early: BTreeMap<RecordKey, (u64, Option<Result<Reply, Error>>)>,
    /// `DispatchBeforeIntent`: the controller's exec op waiting for the early reply.
    early_wait: BTreeMap<RecordKey, OpId>,
    /// Last record this host was told, per key (for the planted bugs).
    last: BTreeMap<RecordKey, ExecutionRecord>,
    /// Spin detection: the last timer instant fired, how often in a row.
    last_fire: u64,
    spins: u64,
    /// Found spinning: from then on its timer is at least 10 ms ahead.
    spinning: bool,
    /// It was paused at some point (another controller may have taken over).
    was_paused: bool,
    /// Terminals driven on this host (retained runs).
    terms: BTreeMap<RecordKey, TermHost>,
    /// Its live terminal connections (C7.3, C7.4); `C` is the upgrade's
    /// request id at the worker.
    registry: Option<Registry<conn::SimConn>>,
}

#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // a few thousand events per run
enum Ev {
    Submit(usize),
    /// The caller's retry when no acceptance came.
    Resubmit(usize),
    Cancel(usize),
    Timer(usize, u64),
    StoreApply(usize, OpId, Box<StoreOp>),
    StoreReply(usize, OpId, StoreResult),
    WorkerReply(usize, OpId, u64, Result<Reply, Error>),
    Restart,
    WallBack(u64),
    WorkerRestart,
    Quiesce,
    /// A caller step for retained machine `m`.
    Caller(usize),
    /// The caller cancels slot job `j`.
    CancelSlot(usize),
    TermApply(usize, RecordKey, OpId, Box<TermStoreOp>),
    TermReply(usize, RecordKey, OpId, TermStoreResult),
    TermTimer(usize, RecordKey, u64),
    TermWorker(usize, RecordKey, u64, Result<Reply, Error>),
    Attach(usize, RecordKey),
    RegTimer(usize),
}

/// Where a worker request's reply goes.
#[derive(Clone, Debug)]
enum ReqTo {
    Op(usize, OpId),
    Early(usize),
    /// A terminal's upgrade (its messages go to the run on that host).
    Term(usize, RecordKey),
}

struct Sim {
    opts: Options,
    rng: Rng,
    clock: VirtualClock,
    store: FaultStore,
    worker: SimWorker,
    model: Model,
    jobs: Vec<Job>,
    hosts: Vec<Host>,
    /// Boxed: an event carries whole records, and a B-tree node moves its
    /// values on every insert and pop (most of the harness's memmove).
    events: BTreeMap<(u64, u64), Box<Ev>>,
    seq: u64,
    next_req: u64,
    reqs: BTreeMap<u64, (ReqTo, Option<RecordKey>)>,
    crashes: BTreeMap<&'static str, u64>,
    chaos: bool,
    wall_steps: u64,
    step: u64,
    trace: VecDeque<String>,
    trace_len: usize,
    frozen: Option<Vec<String>>,
    /// While a store answer is handed over: whether the store really
    /// answered "absent" (what the controller was told may differ).
    truly_absent: Option<bool>,
    /// Planted claim skips left in this step (a controller that asks again
    /// at once is let through, so a planted bug cannot hang a step).
    skips_left: u32,
    /// Commands sent and not yet answered: key → (host, request).
    running: BTreeMap<RecordKey, (usize, u64)>,
    /// The spec each machine was created with (its replies echo it).
    machine_specs: BTreeMap<String, MachineSpec>,
    /// When the last commit was seen.
    last_commit_ms: u64,
    /// The run ended before the end of the quiescent window (settled).
    ended_early: bool,
    /// [`super::FULL_VAR`] is set: never end early.
    full_window: bool,
    /// Retained machines (empty unless `opts.retained`).
    ret: Retained,
    /// The reference model of machine records.
    slot_model: SlotModel,
    /// The highest worker-lease generation committed.
    lease_gen: u64,
    /// Keys a cancel of which the store answered `not_found` (truly).
    absent_cancels: BTreeSet<RecordKey>,
    /// Reconcile, lists, maintenance drains, a careless operator
    /// (retained runs).
    probes: probes::Probes,
    files: files::SimFiles,
    /// Refused creates and imageless machines (session 10).
    refusals: refusals::Refusals,
}

/// Runs one seed against the `Controller` and checks it.
pub fn run_seed(seed: u64, opts: Options) -> SeedReport {
    let mut sim = Sim::new(seed, opts);
    sim.run();
    let faults = sim.store.faults_injected()
        + sim.worker.faults_injected
        + sim.worker.restarts
        + sim.wall_steps;
    let trace = match sim.frozen.take() {
        Some(t) if std::env::var_os(super::TRACE_END_VAR).is_none() => t,
        _ => sim.trace.iter().cloned().collect(),
    };
    SeedReport {
        seed,
        steps: sim.step,
        crashes: sim.crashes.clone(),
        faults,
        mutations: sim.worker.mutation_counts(),
        violations: sim.model.violations,
        trace,
        ended_early: sim.ended_early,
        probes: sim
            .probes
            .counts
            .iter()
            .chain(&sim.files.counts)
            .map(|(k, n)| (*k, *n))
            .collect(),
    }
}

fn brief(r: &StoreResult) -> String {
    match r {
        Ok(StoreReply::Record(rec) | StoreReply::Accepted { record: rec, .. }) => {
            format!("v{} {} {:?}", rec.version, rec.state.as_str(), rec.evidence)
        }
        Ok(StoreReply::Lease(_)) => "lease".to_owned(),
        Ok(StoreReply::Due { records, .. }) => format!("{} due", records.len()),
        Ok(StoreReply::Machine(m) | StoreReply::MachineAccepted { record: m, .. }) => format!(
            "machine {} v{} {} {:?}/{:?} due {:?}",
            m.key.id,
            m.version,
            m.state.as_str(),
            m.operation,
            m.phase,
            m.next_due_at_ms
        ),
        Ok(_) => "machine reply".to_owned(),
        Err(e) => format!("{}:{}", e.category().as_str(), e.reason()),
    }
}

fn op_label(op: &StoreOp) -> String {
    match op {
        StoreOp::Accept { record, .. } => format!("accept {}", record.key.id),
        StoreOp::Fetch { key } => format!("fetch {}", key.id),
        StoreOp::Claim { key, .. } => format!("claim {}", key.id),
        StoreOp::ClaimVersion { key, version, .. } => {
            format!("claim_version {} at v{version}", key.id)
        }
        StoreOp::ClaimWorker { .. } => "claim worker".to_owned(),
        StoreOp::Write { key, patch, .. } => format!(
            "write {} {}",
            key.id,
            patch.state.map_or("(no state)", ExecState::as_str)
        ),
        StoreOp::Reserve { key, .. } => format!("reserve {}", key.id),
        StoreOp::Release { key, .. } => format!("release {}", key.id),
        StoreOp::Cancel { key, .. } => format!("cancel {}", key.id),
        StoreOp::Due { .. } => "due".to_owned(),
        other => other.name().to_owned(),
    }
}

fn op_key(op: &StoreOp) -> Option<RecordKey> {
    match op {
        StoreOp::Accept { record, .. } => Some(record.key.clone()),
        StoreOp::Fetch { key }
        | StoreOp::Claim { key, .. }
        | StoreOp::ClaimVersion { key, .. }
        | StoreOp::Write { key, .. }
        | StoreOp::Reserve { key, .. }
        | StoreOp::Release { key, .. }
        | StoreOp::Cancel { key, .. } => Some(key.clone()),
        _ => None,
    }
}

impl Sim {
    fn new(seed: u64, opts: Options) -> Self {
        let mut rng = Rng::fork(seed, 10);
        let mut worker = SimWorker::new(Rng::fork(seed, 12), WORKER_FAULTS, MACHINE);
        worker.latency_ms = 100;
        worker.timeout_ms = 20_000;
        worker.set_side(Rng::fork(seed, 22), refusals::IMAGELESS);
        let mut sim = Self {
            opts,
            rng: Rng::fork(seed, 13),
            clock: VirtualClock::new(1_700_000_000_000 + rng.below(1_000_000)),
            store: FaultStore::new(Rng::fork(seed, 11), STORE_FAULTS),
            worker,
            model: Model::new(),
            jobs: Vec::new(),
            hosts: Vec::new(),
            events: BTreeMap::new(),
            seq: 0,
            next_req: 0,
            reqs: BTreeMap::new(),
            crashes: BTreeMap::new(),
            chaos: true,
            wall_steps: 0,
            step: 0,
            trace: VecDeque::new(),
            trace_len: super::trace_len(),
            frozen: None,
            truly_absent: None,
            skips_left: 0,
            running: BTreeMap::new(),
            machine_specs: BTreeMap::new(),
            last_commit_ms: 0,
            ended_early: false,
            full_window: std::env::var_os(super::FULL_VAR).is_some(),
            ret: Retained::default(),
            slot_model: SlotModel::new(),
            lease_gen: 0,
            absent_cancels: BTreeSet::new(),
            probes: probes::Probes::new(seed),
            files: files::SimFiles::new(seed, opts.inputs && super::inputs_on()),
            refusals: refusals::Refusals::new(seed),
        };
        if opts.bug == Some(Bug::SlotFreedAfterFailedCollection) {
            sim.store.plant_free_after_failed_collection();
        }
        sim.workload(&mut rng);
        // One or two controllers share the store from the start.
        sim.new_host();
        if rng.chance(500) {
            sim.new_host();
        }
        sim
    }

    fn workload(&mut self, rng: &mut Rng) {
        if self.opts.retained {
            self.retained_workload(rng);
            self.chaos_events(rng);
            return;
        }
        let n = rng.range(1, 4) as usize;
        let target = catalog::command_target(catalog::SIM_ARCH);
        for i in 0..n {
            let id = format!("k{i}");
            let exit = rng.range(0, 3) as i32;
            let dur = rng.range(0, 3 * TTL_MS);
            let mut argv = worker::sim_argv(&id, exit, dur);
            let (inputs, outputs) = self.files.plan(&id, &mut argv);
            let cmd = smolbox_core::exec::Command::new(argv);
            let on = if self.opts.disposable {
                self.probes.pick_worker()
            } else {
                WORKER_ID
            };
            let mut spec = spec_for(&cmd, &target, on, MACHINE)
                .unwrap_or_else(|e| unreachable!("a valid spec: {e:?}"));
            spec.inputs = inputs;
            spec.outputs = outputs;
            // Half the commands run on a disposable machine the controller
            // creates, uses, deletes and verifies absent (C17.2).
            if self.opts.disposable && rng.chance(500) {
                spec.worker_machine = None;
            }
            self.jobs.push(Job {
                key: testkit::key("sim", &id),
                spec,
                accepted: false,
                exit_seen: Vec::new(),
            });
            let at = rng.range(0, 5_000);
            self.at(at, Ev::Submit(i));
            if rng.chance(300) {
                self.at(at + rng.range(0, 15_000), Ev::Submit(i));
            }
            if rng.chance(250) {
                self.at(at + rng.range(0, 12_000), Ev::Cancel(i));
            }
        }
        self.chaos_events(rng);
    }

    /// Wall-clock steps, worker restarts and the quiescent point.
    fn chaos_events(&mut self, rng: &mut Rng) {
        if rng.chance(300) {
            let ms = rng.range(1, 20_000);
            self.at(rng.range(0, CHAOS_MS), Ev::WallBack(ms));
        }
        if rng.chance(200) {
            self.at(rng.range(0, CHAOS_MS), Ev::WorkerRestart);
        }
        self.at(CHAOS_MS, Ev::Quiesce);
    }

    fn at(&mut self, mono_ms: u64, ev: Ev) {
        self.seq += 1;
        self.events.insert((mono_ms, self.seq), Box::new(ev));
    }

    fn now(&self) -> u64 {
        self.clock.mono_ms()
    }

    fn owner(h: usize) -> String {
        format!("ctl-{h}")
    }

    fn log(&mut self, line: String) {
        if self.probes.leaks(&line) {
            self.probes.leaked_to_trace = true;
        }
        if self.trace.len() >= self.trace_len {
            self.trace.pop_front();
        }
        self.trace
            .push_back(format!("[{} t={}ms] {line}", self.step, self.now()));
    }

    fn violation(&mut self, what: String) {
        self.model.violations.push(Violation {
            step: self.step,
            what,
        });
        if self.frozen.is_none() {
            self.frozen = Some(self.trace.iter().cloned().collect());
        }
    }

    fn new_host(&mut self) {
        let h = self.hosts.len();
        let mut cfg = ControllerConfig::new(&Self::owner(h));
        cfg.workers = WORKER_IDS
            .iter()
            .map(|w| {
                WorkerEntry::new(w)
                    .with_profile(Profile::known(Version::V1_9_2))
                    .with_catalog(catalog::sim_catalog())
            })
            .collect();
        cfg.lease_ttl_ms = TTL_MS;
        // The driver is the artifact store (`files`): specs with files.
        cfg.artifacts = true;
        cfg.poll_interval_ms = POLL_MS;
        if self.opts.bug == Some(Bug::RestageResumedPreparing) {
            cfg.planted = Some(smolbox_core::managed::controller::Planted::RestageResumedPreparing);
        }
        if self.opts.bug == Some(Bug::ResendRefusedCreate) {
            cfg.planted = Some(smolbox_core::managed::controller::Planted::ResendRefusedCreate);
        }
        let ctl = match Controller::new(
            cfg,
            testkit::fingerprint_key(),
            self.clock.now(),
            self.clock.wall_ms(),
        ) {
            Ok(c) => Some(c),
            Err(e) => {
                self.violation(format!("Controller::new refused a valid config: {e:?}"));
                None
            }
        };
        self.hosts.push(Host {
            ctl,
            paused_until: 0,
            timer: None,
            store_ops: BTreeMap::new(),
            early: BTreeMap::new(),
            early_wait: BTreeMap::new(),
            last: BTreeMap::new(),
            last_fire: u64::MAX,
            spins: 0,
            spinning: false,
            was_paused: false,
            terms: BTreeMap::new(),
            registry: Registry::new(8).ok(),
        });
        self.log(format!(
            "{} starts (recovers by its due scan)",
            Self::owner(h)
        ));
        self.drain(h);
    }

    fn live_host(&self) -> Option<usize> {
        let now = self.now();
        self.hosts
            .iter()
            .rposition(|h| h.ctl.is_some() && h.paused_until <= now)
    }

    fn run(&mut self) {
        let end = CHAOS_MS + QUIET_MS;
        loop {
            let ev_t = self.events.keys().next().map(|(t, _)| *t);
            let w_t = self.worker.next_event_ms();
            let t = match (ev_t, w_t) {
                (None, None) => break,
                (Some(a), Some(b)) => a.min(b),
                (Some(a), None) | (None, Some(a)) => a,
            };
            if t > end {
                break;
            }
            self.clock.advance_to(t);
            self.step += 1;
            self.skips_left = 2;
            let now = self.now();
            for (req, result) in self.worker.take_replies(now) {
                match self.reqs.get(&req).map(|r| r.0.clone()) {
                    Some(ReqTo::Op(h, op)) => self.at(now, Ev::WorkerReply(h, op, req, result)),
                    Some(ReqTo::Term(h, key)) => self.at(now, Ev::TermWorker(h, key, req, result)),
                    Some(ReqTo::Early(h)) => {
                        let key = self.reqs.get(&req).and_then(|r| r.1.clone());
                        if let Some(key) = key {
                            self.early_reply(h, &key, req, result);
                        }
                    }
                    None => {}
                }
            }
            let arrivals = self.worker.take_arrivals();
            for (m, id) in &arrivals {
                self.log(format!("worker: {m:?} {id} arrives"));
            }
            if ev_t.is_some_and(|e| e <= now)
                && let Some((_, ev)) = self.events.pop_first()
            {
                self.handle(*ev);
            }
            self.check(&arrivals);
            if self.step >= MAX_STEPS {
                self.violation(format!("no end after {MAX_STEPS} steps"));
                break;
            }
            if self.settled(end) {
                self.ended_early = true;
                self.log("settled: nothing left to happen before the end".to_owned());
                break;
            }
        }
        self.finish();
    }

    fn crash_point(&mut self, h: usize, kind: &'static str) -> bool {
        let p = if kind.starts_with("worker") {
            CRASH_WORKER
        } else {
            CRASH
        };
        if !self.chaos || !self.rng.chance(p) {
            return false;
        }
        let pause = self.rng.chance(250);
        let kind = if pause { "pause" } else { kind };
        *self.crashes.entry(kind).or_insert(0) += 1;
        let now = self.now();
        if pause {
            let until = now + self.rng.range(TTL_MS / 2, 3 * TTL_MS);
            self.hosts[h].paused_until = until;
            self.hosts[h].was_paused = true;
            self.hosts[h].timer = Some(until);
            self.at(until, Ev::Timer(h, until));
            self.log(format!("{} paused until {until}ms", Self::owner(h)));
        } else {
            if self.opts.retained {
                self.count_slot_file_crash();
            }
            self.hosts[h].ctl = None;
            self.drop_terms(h);
            self.log(format!("{} crashes ({kind})", Self::owner(h)));
        }
        let later = self.rng.range(0, 2 * TTL_MS);
        self.at(now + later, Ev::Restart);
        // A paused controller carries on where it stopped once it wakes (its
        // answers wait for it); only a crash loses what was in hand.
        !pause
    }

    fn host_of(ev: &Ev) -> Option<usize> {
        match ev {
            Ev::Timer(h, _)
            | Ev::StoreReply(h, ..)
            | Ev::WorkerReply(h, ..)
            | Ev::TermReply(h, ..)
            | Ev::TermTimer(h, ..)
            | Ev::TermWorker(h, ..)
            | Ev::Attach(h, _)
            | Ev::RegTimer(h) => Some(*h),
            _ => None,
        }
    }

    fn handle(&mut self, ev: Ev) {
        let now = self.now();
        if let Some(h) = Self::host_of(&ev)
            && self.hosts[h].paused_until > now
        {
            let t = self.hosts[h].paused_until;
            self.at(t, ev);
            return;
        }
        match ev {
            Ev::Submit(j) => self.submit(j),
            Ev::Resubmit(j) => {
                if !self.jobs[j].accepted {
                    self.submit(j);
                }
            }
            Ev::Cancel(j) => self.cancel(j),
            Ev::Timer(h, at) => {
                if self.hosts[h].timer == Some(at) {
                    self.hosts[h].timer = None;
                    let host = &mut self.hosts[h];
                    host.spins = if host.last_fire == at {
                        host.spins + 1
                    } else {
                        0
                    };
                    host.last_fire = at;
                    if host.spins == 1_000 && !host.spinning {
                        host.spinning = true;
                        self.violation(format!(
                            "{} spins: poll_timeout stays at {at}ms (not after now) and handle_timeout makes no progress",
                            Self::owner(h)
                        ));
                    }
                    let (n, w) = (self.clock.now(), self.clock.wall_ms());
                    if let Some(c) = self.hosts[h].ctl.as_mut() {
                        c.handle_timeout(n, w);
                    }
                    self.drain(h);
                }
            }
            Ev::StoreApply(h, op, sop) => self.store_apply(h, op, *sop),
            Ev::StoreReply(h, op, r) => self.store_reply(h, op, r),
            Ev::WorkerReply(h, op, req, r) => self.worker_reply(h, op, req, r),
            Ev::Restart => self.new_host(),
            Ev::WallBack(ms) => {
                self.wall_steps += 1;
                self.clock.step_wall_back(ms);
                self.log(format!("wall clock steps back {ms}ms"));
            }
            Ev::WorkerRestart => {
                self.worker.restart(now);
                self.log("worker restarts".to_owned());
            }
            ev @ (Ev::Caller(_)
            | Ev::CancelSlot(_)
            | Ev::TermApply(..)
            | Ev::TermReply(..)
            | Ev::TermTimer(..)
            | Ev::TermWorker(..)
            | Ev::Attach(..)
            | Ev::RegTimer(..)) => self.handle_retained(ev),
            Ev::Quiesce => {
                self.chaos = false;
                self.store.set_faults(StoreFaults::NONE);
                self.worker.set_faults(WorkerFaults::NONE);
                self.log("quiescent: no more faults or crashes".to_owned());
                if self.live_host().is_none() {
                    self.new_host();
                }
            }
        }
    }

    fn submit(&mut self, j: usize) {
        let Some(h) = self.live_host() else {
            let t = self.now() + 1_000;
            self.at(t, Ev::Submit(j));
            return;
        };
        let s = Submit {
            key: self.jobs[j].key.clone(),
            spec: self.jobs[j].spec.clone(),
        };
        self.log(format!("caller submits {} to {}", s.key.id, Self::owner(h)));
        let (n, w) = (self.clock.now(), self.clock.wall_ms());
        let r = self.hosts[h].ctl.as_mut().map(|c| c.submit(n, w, s));
        if let Some(Err(e)) = r {
            self.violation(format!("submit of a valid spec refused: {e:?}"));
        }
        // The caller submits again if no acceptance arrives.
        let t = self.now() + self.rng.range(5_000, 20_000);
        self.at(t, Ev::Resubmit(j));
        self.drain(h);
    }

    fn cancel(&mut self, j: usize) {
        let Some(h) = self.live_host() else {
            return;
        };
        let key = self.jobs[j].key.clone();
        self.log(format!("caller cancels {} via {}", key.id, Self::owner(h)));
        let (n, w) = (self.clock.now(), self.clock.wall_ms());
        if let Some(c) = self.hosts[h].ctl.as_mut() {
            c.cancel(n, w, key);
        }
        self.drain(h);
    }

    /// Takes every output of host `h`'s controller and performs it.
    fn drain(&mut self, h: usize) {
        loop {
            if self.hosts[h].paused_until > self.now() {
                return;
            }
            let (n, w) = (self.clock.now(), self.clock.wall_ms());
            let live = !self.hosts[h].terms.is_empty();
            let Some(ctl) = self.hosts[h].ctl.as_mut() else {
                return;
            };
            // As the shells' driver: the host's live terminal runs (they
            // use its worker lease) are reported after every input.
            ctl.set_terminals_live(n, live);
            if let Some((id, op)) = ctl.poll_store_op() {
                self.store_op(h, id, op, n, w);
                if self.hosts[h].ctl.is_none() {
                    return;
                }
                continue;
            }
            if let Some((id, op)) = ctl.poll_worker_op() {
                self.worker_op(h, id, op);
                continue;
            }
            if let Some(ev) = ctl.poll_event() {
                self.on_event(h, ev);
                continue;
            }
            let floor = if self.hosts[h].spinning {
                self.now() + 10
            } else {
                self.now()
            };
            let Some(ctl) = self.hosts[h].ctl.as_mut() else {
                return;
            };
            let t = ctl.poll_timeout().map(|i| self.clock.ms_of(i).max(floor));
            if t != self.hosts[h].timer
                && let Some(t) = t
            {
                self.hosts[h].timer = Some(t);
                self.at(t, Ev::Timer(h, t));
            }
            return;
        }
    }

    fn store_op(&mut self, h: usize, id: OpId, mut op: StoreOp, n: std::time::Instant, w: u64) {
        let key = op_key(&op);
        if self.opts.retained {
            self.plant_on_store_op(&op);
        }
        self.plant_on_file_write(&mut op);
        // Planted: a machine without creation evidence (the create may have
        // been sent) is taken as absent, as after a 404 that proves nothing
        // (C0.4 rule 3): absence recorded, then the reservation released.
        if self.opts.bug == Some(Bug::ReleaseAfter404WithoutCreation)
            && let StoreOp::Write { patch, now_ms, .. } = &mut op
            && patch.cleanup == Some(Cleanup::Failed)
            && key
                .as_ref()
                .and_then(|k| self.hosts[h].last.get(k))
                .is_some_and(|r| r.assignment.is_some() && r.creation.is_none())
        {
            patch.cleanup = Some(Cleanup::Complete);
            patch.absence_at_ms = Some(*now_ms);
            patch.next_due_at_ms = Some(Some(*now_ms));
        }
        // Planted: the claim refresh before the intent (or a renewal while
        // the command runs) answered from memory.
        let last = key
            .as_ref()
            .and_then(|k| self.hosts[h].last.get(k))
            .cloned();
        let skip = match (&op, &last, self.opts.bug) {
            (StoreOp::Claim { .. }, Some(r), Some(Bug::SkipIntentClaimRefresh)) => {
                r.state == ExecState::Ready
            }
            (StoreOp::Claim { .. }, Some(_), Some(Bug::DropClaimRenewal)) => key
                .as_ref()
                .and_then(|k| self.running.get(k))
                .is_some_and(|(x, _)| *x == h),
            _ => false,
        };
        // DropClaimRenewal answers "renewed" without renewing.
        let last = match (&op, last, self.opts.bug) {
            (
                StoreOp::Claim {
                    owner,
                    now_ms,
                    ttl_ms,
                    ..
                },
                Some(mut r),
                Some(Bug::DropClaimRenewal),
            ) => {
                r.claim = Some(Claim {
                    owner: owner.clone(),
                    until_ms: now_ms + ttl_ms,
                });
                Some(r)
            }
            (_, last, _) => last,
        };
        if skip
            && self.skips_left > 0
            && let Some(r) = last
            && let Some(c) = self.hosts[h].ctl.as_mut()
        {
            self.skips_left -= 1;
            c.handle_stored(n, w, id, Ok(StoreReply::Record(r)));
            return;
        }
        if self.opts.bug == Some(Bug::DispatchBeforeIntent)
            && let StoreOp::Write { key, patch, .. } = &op
            && patch.state == Some(ExecState::Dispatching)
            && !self.hosts[h].early.contains_key(key)
        {
            let key = key.clone();
            self.send_early(h, &key);
        }
        if self.crash_point(h, "store_before_commit") {
            return;
        }
        self.log(format!("{} {}", Self::owner(h), op_label(&op)));
        self.hosts[h].store_ops.insert(id, key);
        let t = self.now() + self.rng.range(1, 200);
        self.at(t, Ev::StoreApply(h, id, Box::new(op)));
    }

    fn worker_op(&mut self, h: usize, id: OpId, op: WorkerOp) {
        let (request, key) = match op {
            WorkerOp::Exec {
                worker_id,
                machine,
                command,
            } => {
                if !WORKER_IDS.contains(&worker_id.as_str()) {
                    self.violation(format!("exec on unknown worker {worker_id}"));
                }
                return self.exec_op(h, id, machine, &command);
            }
            WorkerOp::Create { name, spec, .. } => {
                self.machine_specs.insert(name.as_str().to_owned(), *spec);
                (
                    Request::Create {
                        name: name.as_str().to_owned(),
                    },
                    name,
                )
            }
            WorkerOp::Start { name, .. } => (
                Request::Start {
                    name: name.as_str().to_owned(),
                },
                name,
            ),
            WorkerOp::Stop { name, .. } => (
                Request::Stop {
                    name: name.as_str().to_owned(),
                },
                name,
            ),
            WorkerOp::Delete { name, .. } => (
                Request::Delete {
                    name: name.as_str().to_owned(),
                },
                name,
            ),
            WorkerOp::Inspect { name, .. } => {
                if let Some(r) = self.fabricated_inspect(h, name.as_str()) {
                    let req = self.next_req;
                    self.next_req += 1;
                    self.reqs.insert(req, (ReqTo::Op(h, id), None));
                    self.log(format!(
                        "planted: inspect of {} answered stopped",
                        name.as_str()
                    ));
                    self.at(self.now() + 1, Ev::WorkerReply(h, id, req, Ok(r)));
                    return;
                }
                (
                    Request::Inspect {
                        name: name.as_str().to_owned(),
                    },
                    name,
                )
            }
            WorkerOp::Logs { .. } => {
                // A read the simulated controllers never request.
                self.violation("a logs read in the simulation".to_owned());
                return;
            }
            WorkerOp::ExecStream { .. } => {
                // No simulated caller asks for a stream.
                self.violation("a streamed exec in the simulation".to_owned());
                return;
            }
            WorkerOp::Upload { .. } | WorkerOp::Download { .. } => {
                return self.file_op(h, id, &op);
            }
        };
        if self.crash_point(h, "worker_before_send") {
            return;
        }
        let req = self.next_req;
        self.next_req += 1;
        self.reqs.insert(req, (ReqTo::Op(h, id), None));
        if let Request::Inspect { name } = &request {
            self.ret.inspects.insert(req, name.clone());
        }
        if let Request::Create { name } = &request {
            self.refusals.create_sent(req, name);
        }
        self.log(format!("{} sends {request:?}", Self::owner(h)));
        let _ = key;
        let now = self.now();
        if let Err(e) = self.worker.send(now, req, request) {
            self.at(now + 1, Ev::WorkerReply(h, id, req, Err(e)));
        }
        self.crash_point(h, "worker_after_send");
    }

    fn exec_op(
        &mut self,
        h: usize,
        id: OpId,
        machine: String,
        command: &smolbox_core::exec::Command,
    ) {
        let argv = command.argv().to_vec();
        let key = testkit::key("sim", &worker::exec_identity(&argv));
        if let Some((req, early)) = self.hosts[h].early.remove(&key) {
            // Planted DispatchBeforeIntent: already sent; answer when it comes.
            match early {
                Some(r) => self.at(self.now(), Ev::WorkerReply(h, id, req, r)),
                None => {
                    self.hosts[h].early_wait.insert(key, id);
                    self.reqs.insert(req, (ReqTo::Op(h, id), None));
                }
            }
            return;
        }
        if self.crash_point(h, "worker_before_send") {
            return;
        }
        let req = self.next_req;
        self.next_req += 1;
        self.reqs.insert(req, (ReqTo::Op(h, id), Some(key.clone())));
        self.running.insert(key.clone(), (h, req));
        self.log(format!("{} sends exec {}", Self::owner(h), key.id));
        let now = self.now();
        let on = machine.clone();
        let request = if command.is_background() {
            Request::Launch { machine, argv }
        } else {
            Request::Exec { machine, argv }
        };
        if let Err(e) = self.worker.send(now, req, request) {
            self.at(now + 1, Ev::WorkerReply(h, id, req, Err(e)));
        }
        self.plant_upload_after_intent(&key, &on);
        self.crash_point(h, "worker_after_send");
    }

    fn send_early(&mut self, h: usize, key: &RecordKey) {
        let Some(job) = self.jobs.iter().find(|j| j.key == *key) else {
            return;
        };
        let argv = match &job.spec.action {
            smolbox_core::managed::spec::Action::Command(c) => c.argv.clone(),
            smolbox_core::managed::spec::Action::Terminal(_) => return,
        };
        let req = self.next_req;
        self.next_req += 1;
        self.reqs.insert(req, (ReqTo::Early(h), Some(key.clone())));
        let _ = self.worker.send(
            self.now(),
            req,
            Request::Exec {
                machine: MACHINE.to_owned(),
                argv,
            },
        );
        self.hosts[h].early.insert(key.clone(), (req, None));
    }

    fn early_reply(&mut self, h: usize, key: &RecordKey, req: u64, r: Result<Reply, Error>) {
        if let Some(id) = self.hosts[h].early_wait.remove(key) {
            self.at(self.now(), Ev::WorkerReply(h, id, req, r));
        } else if let Some(slot) = self.hosts[h].early.get_mut(key) {
            slot.1 = Some(r);
        }
    }

    fn on_event(&mut self, h: usize, ev: ControllerEvent) {
        match ev {
            ControllerEvent::Accepted { key, existing, .. } => {
                self.log(format!(
                    "{} accepted {} (existing {existing})",
                    Self::owner(h),
                    key.id
                ));
                if let Some(j) = self.jobs.iter_mut().find(|j| j.key == key) {
                    j.accepted = true;
                }
            }
            ControllerEvent::Refused { key, error } => {
                self.log(format!(
                    "{} refused {}: {}:{}",
                    Self::owner(h),
                    key.id,
                    error.category().as_str(),
                    error.reason()
                ));
                if error.category() == Category::NotFound {
                    self.violation(format!("{}/{}: refused as not_found", key.scope, key.id));
                }
            }
            ControllerEvent::CancelRecorded { key, result } => {
                if let Ok(rec) = &result
                    && rec.state.is_before_dispatch()
                {
                    self.model.cancelled_before_intent(&key);
                }
                if let Err(e) = &result
                    && e.category() == Category::NotFound
                    && self.truly_absent != Some(true)
                    && !self.absent_cancels.contains(&key)
                {
                    self.violation(format!(
                        "{}/{}: cancel answered not_found while the record exists",
                        key.scope, key.id
                    ));
                }
            }
            ControllerEvent::Finished(f) => {
                let state = f.record.as_ref().map(|r| r.state.as_str());
                self.log(format!(
                    "{} finished {}: {:?} {:?}",
                    Self::owner(h),
                    f.key.id,
                    state,
                    f.error
                        .as_ref()
                        .map(|e| (e.category().as_str(), e.reason()))
                ));
                // A store's `not_found` (the worker's, e.g. an exec on a
                // machine a worker restart removed, is the worker's answer).
                if let Some(e) = &f.error
                    && e.category() == Category::NotFound
                    && e.operation().as_str().starts_with("store")
                    && self.store.inner().fetch(&f.key).is_ok()
                {
                    self.violation(format!(
                        "{}/{}: finished not_found while the record exists (a store failure read as absence)",
                        f.key.scope, f.key.id
                    ));
                }
                if let (Some(out), Some(rec)) = (&f.output, &f.record)
                    && f.error.is_none()
                {
                    let stored = match rec.result {
                        Some(ExecResult::Exited { exit_code, .. }) => Some(exit_code),
                        _ => None,
                    };
                    if stored != Some(out.exit_code) {
                        self.violation(format!(
                            "{}/{}: finished with exit {} but the record says {stored:?}",
                            f.key.scope, f.key.id, out.exit_code
                        ));
                    }
                }
            }
            ev @ (ControllerEvent::Machine(_) | ControllerEvent::TerminalDue(_)) => {
                self.on_retained_event(h, ev);
            }
            ControllerEvent::Telemetry(_) | ControllerEvent::Stopped => {}
        }
    }

    fn store_apply(&mut self, h: usize, id: OpId, op: StoreOp) {
        let dead = self.hosts[h].ctl.is_none();
        if dead && self.rng.chance(500) {
            self.log(format!(
                "in-flight store op of dead {} never arrives",
                Self::owner(h)
            ));
            return;
        }
        let result = smolbox_store::apply_op(&self.store, &op);
        if let (StoreOp::Cancel { key, .. }, Err(e)) = (&op, &result)
            && e.category() == Category::NotFound
        {
            // The store really answered "absent" to this cancel (its answer
            // may reach the controller's caller much later: a pause).
            self.absent_cancels.insert(key.clone());
        }
        if let Ok(StoreReply::Lease(l)) = &result {
            self.lease_gen = self.lease_gen.max(l.generation);
        }
        if dead || self.crash_point(h, "store_after_commit") {
            return;
        }
        let t = self.now() + self.rng.range(1, 200);
        self.at(t, Ev::StoreReply(h, id, result));
    }

    fn store_reply(&mut self, h: usize, id: OpId, mut r: StoreResult) {
        if self.hosts[h].ctl.is_none() {
            return;
        }
        let key = self.hosts[h].store_ops.remove(&id).flatten();
        self.truly_absent = Some(
            r.as_ref()
                .err()
                .is_some_and(|e| e.category() == Category::NotFound),
        );
        if self.opts.bug == Some(Bug::StoreFailureAsAbsence)
            && r.as_ref()
                .err()
                .is_some_and(|e| e.category() == Category::Store)
        {
            r = Err(Error::not_found(
                Operation::StoreFetch,
                Evidence::Unknown,
                Reason::Absent,
            ));
        }
        self.log(format!("{} <- {}", Self::owner(h), brief(&r)));
        if let (Some(k), Ok(StoreReply::Record(rec) | StoreReply::Accepted { record: rec, .. })) =
            (&key, &r)
        {
            self.hosts[h].last.insert(k.clone(), rec.clone());
        }
        if self.opts.bug == Some(Bug::RedispatchDispatching)
            && let Ok(StoreReply::Due { records, .. }) = &r
        {
            for rec in records.clone() {
                if rec.state == ExecState::Dispatching {
                    self.send_early(h, &rec.key);
                    self.hosts[h].early.remove(&rec.key);
                }
            }
        }
        let (n, w) = (self.clock.now(), self.clock.wall_ms());
        if let Some(c) = self.hosts[h].ctl.as_mut() {
            c.handle_stored(n, w, id, r);
        }
        if !self.crash_point(h, "store_after_reply") {
            self.drain(h);
        }
        self.truly_absent = None;
    }

    fn worker_reply(&mut self, h: usize, id: OpId, req: u64, r: Result<Reply, Error>) {
        self.running.retain(|_, (_, q)| *q != req);
        if self.hosts[h].ctl.is_none() {
            return;
        }
        if self.crash_point(h, "worker_after_effect") {
            return;
        }
        self.note_create_reply(h, req, &r);
        if r.is_ok() {
            self.worker.settle(req);
        }
        if let Some(name) = self.ret.inspects.remove(&req)
            && self.opts.retained
            && matches!(r, Ok(Reply::Machine(_) | Reply::Absent))
        {
            self.worker.settle_observed(&name);
        }
        let r = self.collected(req, r);
        let r = self.planted_exit(self.to_worker_result(r));
        let key = self.reqs.get(&req).and_then(|x| x.1.clone());
        let label = match &r {
            Ok(WorkerReply::Exec(ExecOutcome::Exited(o))) => {
                if let Some(k) = &key
                    && let Some(j) = self.jobs.iter_mut().find(|j| j.key == *k)
                {
                    j.exit_seen.push(h);
                }
                format!("exit {}", o.exit_code)
            }
            Ok(_) => "other".to_owned(),
            Err(e) => format!(
                "{}:{}:{}",
                e.category().as_str(),
                e.reason(),
                e.evidence().as_str()
            ),
        };
        self.log(format!(
            "{} <- exec {} {label}",
            Self::owner(h),
            key.map_or_else(String::new, |k| k.id)
        ));
        let (n, w) = (self.clock.now(), self.clock.wall_ms());
        if let Some(c) = self.hosts[h].ctl.as_mut() {
            c.handle_worker(n, w, id, r);
        }
        if self.crash_point(h, "worker_after_reply") {
            return;
        }
        self.drain(h);
    }
}
