//! The driver of one seed over `managed::run::Run`: a discrete-event loop
//! (events ordered by virtual time, then by insertion) that performs each
//! `Run`'s store ops against the [`FaultStore`] and its dispatch against the
//! [`SimWorker`], crashes and pauses controllers at the crash points, and
//! hands every commit and arrival to the [`Model`] after each step.
//!
//! Timeline of a store op: issued → commits after a delay → its reply after
//! another delay. Of a worker request: sent → arrives after a delay (the
//! effect and the count happen here, even if the sender crashed) → replies.

use std::collections::{BTreeMap, VecDeque};

use smolbox_core::exec::{Command, ExecOutcome, ExecOutput, OutputEncoding};
use smolbox_core::managed::record::{ExecResult, ExecutionRecord};
use smolbox_core::managed::run::{
    Recovery, Run, RunConfig, RunOutcome, RunTarget, StoreOp, recover,
};
use smolbox_core::managed::{ExecState, FingerprintKey, RecordKey, testkit};
use smolbox_core::{Category, Error, Evidence};
use smolbox_store::Store;

use super::clock::VirtualClock;
use super::model::{Model, Violation};
use super::rng::Rng;
use super::store::{FaultStore, StoreFaults};
use super::worker::{self, Mutation, Reply, Request, SimWorker, WorkerFaults};
use super::{Bug, Options, SeedReport};

/// The machine every command runs on (a machine the caller already has).
const MACHINE: &str = "m0";
/// Claim TTL of every controller.
const TTL_MS: u64 = 30_000;
/// Virtual time with faults and crashes; then the run goes quiescent.
const CHAOS_MS: u64 = 120_000;
/// A run that needs more steps than this never ends: a violation.
const MAX_STEPS: u64 = 10_000;
/// Per-mille chance that a crash point is taken.
const CRASH: u32 = 25;
/// Lines of trace kept.
const TRACE: usize = 40;

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
};

#[derive(Debug)]
struct Job {
    key: RecordKey,
    command: Command,
    submitted: bool,
    /// The caller's wait has ended (terminal or unknown record seen).
    done: bool,
    /// An exit was handed to run `(host, run)` (strict check).
    exit_seen: Vec<(usize, u64)>,
}

#[derive(Debug)]
struct HostRun {
    job: usize,
    run: Run,
    last: Option<ExecutionRecord>,
    /// `DispatchBeforeIntent`: the request already sent, and its reply if it
    /// came before the `Run` asked for it.
    early: Option<(u64, Option<Result<ExecOutcome, Error>>)>,
}

#[derive(Debug)]
struct Host {
    owner: String,
    alive: bool,
    paused_until: u64,
    runs: BTreeMap<u64, HostRun>,
}

#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // a few hundred events per run
enum Ev {
    Submit(usize),
    Cancel(usize),
    Fetch(usize),
    Retry(usize),
    StoreApply {
        host: usize,
        run: u64,
        op: Box<StoreOp>,
    },
    StoreReply {
        host: usize,
        run: u64,
        result: Result<ExecutionRecord, Error>,
    },
    WorkerReply {
        host: usize,
        run: u64,
        req: u64,
        result: Result<Reply, Error>,
    },
    Restart,
    WallBack(u64),
    WorkerRestart,
    Quiesce,
}

struct Sim {
    opts: Options,
    rng: Rng,
    clock: VirtualClock,
    store: FaultStore,
    worker: SimWorker,
    model: Model,
    fp_key: FingerprintKey,
    target: RunTarget,
    jobs: Vec<Job>,
    hosts: Vec<Host>,
    events: BTreeMap<(u64, u64), Ev>,
    seq: u64,
    next_run: u64,
    next_req: u64,
    /// Request id → (host, run); `None` for a bug's fire-and-forget send.
    reqs: BTreeMap<u64, Option<(usize, u64)>>,
    crashes: BTreeMap<&'static str, u64>,
    chaos: bool,
    wall_steps: u64,
    step: u64,
    trace: VecDeque<String>,
    frozen_trace: Option<Vec<String>>,
}

/// Runs one seed and checks it.
pub fn run_seed(seed: u64, opts: Options) -> SeedReport {
    let mut sim = Sim::new(seed, opts);
    sim.run();
    let crashes = sim.crashes.clone();
    let faults = sim.store.faults_injected()
        + sim.worker.faults_injected
        + sim.worker.restarts
        + sim.wall_steps;
    let trace = sim
        .frozen_trace
        .take()
        .unwrap_or_else(|| sim.trace.iter().cloned().collect());
    SeedReport {
        seed,
        steps: sim.step,
        crashes,
        faults,
        mutations: sim.worker.mutation_counts(),
        violations: sim.model.violations,
        trace,
    }
}

fn is_wait_end(s: ExecState) -> bool {
    s.is_terminal() || s == ExecState::Unknown
}

impl Sim {
    fn new(seed: u64, opts: Options) -> Self {
        let mut rng = Rng::fork(seed, 0);
        let store = FaultStore::new(Rng::fork(seed, 1), STORE_FAULTS);
        let mut worker = SimWorker::new(Rng::fork(seed, 2), WORKER_FAULTS, MACHINE);
        worker.latency_ms = 100;
        worker.timeout_ms = 20_000;
        let mut sim = Self {
            opts,
            rng: Rng::fork(seed, 3),
            clock: VirtualClock::new(1_700_000_000_000 + rng.below(1_000_000)),
            store,
            worker,
            model: Model::new(),
            fp_key: testkit::fingerprint_key(),
            target: RunTarget::unverified(),
            jobs: Vec::new(),
            hosts: Vec::new(),
            events: BTreeMap::new(),
            seq: 0,
            next_run: 0,
            next_req: 0,
            reqs: BTreeMap::new(),
            crashes: BTreeMap::new(),
            chaos: true,
            wall_steps: 0,
            step: 0,
            trace: VecDeque::new(),
            frozen_trace: None,
        };
        sim.workload(&mut rng);
        sim.new_host();
        sim
    }

    /// The seed's workload: 1–4 keys, each submitted once or twice,
    /// maybe cancelled and fetched; wall steps and worker restarts.
    fn workload(&mut self, rng: &mut Rng) {
        let n = rng.range(1, 4) as usize;
        let max_dur = if self.opts.strict { 3 * TTL_MS } else { 8_000 };
        for i in 0..n {
            let id = format!("k{i}");
            let exit = rng.range(0, 3) as i32;
            let dur = rng.range(0, max_dur);
            self.jobs.push(Job {
                key: testkit::key("sim", &id),
                command: Command::new(worker::sim_argv(&id, exit, dur)),
                submitted: false,
                done: false,
                exit_seen: Vec::new(),
            });
            let at = rng.range(0, 5_000);
            self.at(at, Ev::Submit(i));
            if rng.chance(300) {
                self.at(at + rng.range(0, 15_000), Ev::Submit(i));
            }
            // `Run` ignores cancel requests, and the store now refuses the
            // intent of a cancelled record, so a cancelled `ready` record is
            // retried forever: cancels are in the strict workload only.
            if rng.chance(250) && self.opts.strict {
                self.at(at + rng.range(0, 12_000), Ev::Cancel(i));
            }
            if rng.chance(400) {
                self.at(at + rng.range(0, 20_000), Ev::Fetch(i));
            }
        }
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
        self.events.insert((mono_ms, self.seq), ev);
    }

    fn now(&self) -> u64 {
        self.clock.mono_ms()
    }

    fn wall(&self) -> u64 {
        self.clock.wall_ms()
    }

    fn log(&mut self, line: String) {
        if self.trace.len() == TRACE {
            self.trace.pop_front();
        }
        self.trace
            .push_back(format!("[{} t={}ms] {line}", self.step, self.now()));
    }

    fn new_host(&mut self) -> usize {
        let h = self.hosts.len();
        self.hosts.push(Host {
            owner: format!("ctl-{h}"),
            alive: true,
            paused_until: 0,
            runs: BTreeMap::new(),
        });
        h
    }

    /// A live host that is not paused, if any.
    fn live_host(&self) -> Option<usize> {
        let now = self.now();
        self.hosts
            .iter()
            .rposition(|h| h.alive && h.paused_until <= now)
    }

    fn run(&mut self) {
        loop {
            let ev_t = self.events.keys().next().map(|(t, _)| *t);
            let w_t = self.worker.next_event_ms();
            let t = match (ev_t, w_t) {
                (None, None) => break,
                (Some(a), Some(b)) => a.min(b),
                (Some(a), None) | (None, Some(a)) => a,
            };
            self.clock.advance_to(t);
            self.step += 1;
            let now = self.now();
            for (req, result) in self.worker.take_replies(now) {
                if let Some(Some((host, run))) = self.reqs.get(&req).cloned() {
                    self.at(
                        now,
                        Ev::WorkerReply {
                            host,
                            run,
                            req,
                            result,
                        },
                    );
                }
            }
            let arrivals = self.worker.take_arrivals();
            for (m, id) in &arrivals {
                self.log(format!("worker: {m:?} {id} arrives"));
            }
            if ev_t.is_some_and(|e| e <= now)
                && let Some((_, ev)) = self.events.pop_first()
            {
                self.handle(ev);
            }
            self.check(&arrivals);
            if self.step >= MAX_STEPS {
                self.model.violations.push(Violation {
                    step: self.step,
                    what: format!("no end after {MAX_STEPS} steps"),
                });
                break;
            }
        }
        self.finish();
    }

    fn check(&mut self, arrivals: &[(Mutation, String)]) {
        let before = self.model.violations.len();
        self.model
            .observe_commits(self.step, self.store.take_commits());
        self.model
            .check_worker(self.step, &self.worker, arrivals, |k| k.id.clone());
        for v in self.worker.take_violations() {
            self.model.violations.push(Violation {
                step: self.step,
                what: v,
            });
        }
        if before == 0 && !self.model.violations.is_empty() && self.frozen_trace.is_none() {
            self.frozen_trace = Some(self.trace.iter().cloned().collect());
        }
    }

    fn violation(&mut self, what: String) {
        self.model.violations.push(Violation {
            step: self.step,
            what,
        });
        if self.frozen_trace.is_none() {
            self.frozen_trace = Some(self.trace.iter().cloned().collect());
        }
    }

    /// The end: every caller's wait must have ended, and (strict) every
    /// exit a surviving controller saw must be stored.
    fn finish(&mut self) {
        for j in 0..self.jobs.len() {
            let (submitted, done, key) = (
                self.jobs[j].submitted,
                self.jobs[j].done,
                self.jobs[j].key.clone(),
            );
            if !submitted {
                continue;
            }
            let stored = self.store.inner().fetch(&key).ok();
            if !done {
                let state = stored.as_ref().map(|r| r.state.as_str());
                let what = format!(
                    "{}/{}: the wait never ended (record {:?})",
                    key.scope, key.id, state
                );
                self.violation(what);
            }
            if self.opts.strict {
                let survived = self.jobs[j]
                    .exit_seen
                    .iter()
                    .any(|(h, _)| self.hosts.get(*h).is_some_and(|h| h.alive));
                let has = stored.as_ref().is_some_and(|r| r.result.is_some());
                if survived && !has {
                    let what = format!(
                        "{}/{}: an exit seen by a controller that stayed up was never stored",
                        key.scope, key.id
                    );
                    self.violation(what);
                }
            }
        }
    }

    /// A crash point of `kind` for `host`: maybe taken.
    fn crash_point(&mut self, host: usize, kind: &'static str) -> bool {
        if !self.chaos || !self.rng.chance(CRASH) {
            return false;
        }
        let pause = self.rng.chance(250);
        let kind = if pause { "pause" } else { kind };
        *self.crashes.entry(kind).or_insert(0) += 1;
        let now = self.now();
        if pause {
            let until = now + self.rng.range(TTL_MS / 2, 3 * TTL_MS);
            self.hosts[host].paused_until = until;
            self.log(format!("{} paused until {until}ms", self.hosts[host].owner));
        } else {
            self.hosts[host].alive = false;
            self.hosts[host].runs.clear();
            self.log(format!("{} crashes ({kind})", self.hosts[host].owner));
        }
        let later = self.rng.range(0, 2 * TTL_MS);
        self.at(now + later, Ev::Restart);
        // A paused controller carries on where it stopped once it wakes (its
        // answers wait for it); only a crash loses what was in hand.
        !pause
    }

    fn handle(&mut self, ev: Ev) {
        let now = self.now();
        // Events of a paused host wait until it comes back.
        let host_of = match &ev {
            Ev::StoreReply { host, .. } | Ev::WorkerReply { host, .. } => Some(*host),
            Ev::StoreApply { .. } => None, // the store works while its client sleeps
            _ => None,
        };
        if let Some(h) = host_of
            && self.hosts[h].paused_until > now
        {
            let t = self.hosts[h].paused_until;
            self.at(t, ev);
            return;
        }
        match ev {
            Ev::Submit(j) => self.submit(j),
            Ev::Cancel(j) => self.cancel(j),
            Ev::Fetch(j) => self.caller_fetch(j),
            Ev::Retry(j) => self.retry(j),
            Ev::StoreApply { host, run, op } => self.store_apply(host, run, op),
            Ev::StoreReply { host, run, result } => self.store_reply(host, run, result),
            Ev::WorkerReply {
                host,
                run,
                req,
                result,
            } => self.worker_reply(host, run, req, result),
            Ev::Restart => {
                let h = self.new_host();
                self.log(format!("{} starts and recovers", self.hosts[h].owner));
                for j in 0..self.jobs.len() {
                    if self.jobs[j].submitted && !self.jobs[j].done {
                        self.at(now, Ev::Retry(j));
                    }
                }
            }
            Ev::WallBack(ms) => {
                self.wall_steps += 1;
                self.clock.step_wall_back(ms);
                self.log(format!("wall clock steps back {ms}ms"));
            }
            Ev::WorkerRestart => {
                self.worker.restart(now);
                self.log("worker restarts".to_owned());
            }
            Ev::Quiesce => {
                self.chaos = false;
                self.store.set_faults(StoreFaults::NONE);
                self.worker.set_faults(WorkerFaults::NONE);
                self.log("quiescent: no more faults or crashes".to_owned());
                if self.live_host().is_none() {
                    self.new_host();
                }
                for j in 0..self.jobs.len() {
                    if self.jobs[j].submitted && !self.jobs[j].done {
                        self.at(now, Ev::Retry(j));
                    }
                }
            }
        }
    }

    fn config(&self, h: usize) -> RunConfig {
        RunConfig {
            owner: self.hosts[h].owner.clone(),
            claim_ttl_ms: TTL_MS,
            max_pending: 100,
        }
    }

    fn start_run(&mut self, h: usize, j: usize, run: Run) {
        let id = self.next_run;
        self.next_run += 1;
        self.hosts[h].runs.insert(
            id,
            HostRun {
                job: j,
                run,
                last: None,
                early: None,
            },
        );
        self.drain(h, id);
    }

    fn new_run(&mut self, h: usize, j: usize) {
        let cfg = self.config(h);
        let job = &self.jobs[j];
        match Run::new(
            job.key.clone(),
            job.command.clone(),
            &self.target,
            &self.fp_key,
            cfg,
            self.clock.wall_ms(),
        ) {
            Ok(run) => self.start_run(h, j, run),
            Err(e) => self.violation(format!("Run::new refused a valid job: {e:?}")),
        }
    }

    fn submit(&mut self, j: usize) {
        let Some(h) = self.live_host() else {
            let t = self.now() + 1_000;
            self.at(t, Ev::Submit(j));
            return;
        };
        self.jobs[j].submitted = true;
        self.log(format!(
            "caller submits {} on {}",
            self.jobs[j].key.id, self.hosts[h].owner
        ));
        self.new_run(h, j);
    }

    fn cancel(&mut self, j: usize) {
        let key = self.jobs[j].key.clone();
        let r = self.store.cancel(&key, self.wall());
        self.log(format!("caller cancels {}: {}", key.id, brief(&r)));
        if self.opts.strict
            && let Ok(rec) = &r
            && rec.state.is_before_dispatch()
        {
            self.model.cancelled_before_intent(&key);
        }
    }

    /// The caller's `fetch`: `not_found` only on positive absence.
    fn caller_fetch(&mut self, j: usize) {
        let key = self.jobs[j].key.clone();
        let r = self.store.fetch(&key);
        let told_absent = match &r {
            Err(e) if e.category() == Category::NotFound => true,
            Err(e) if e.category() == Category::Store => {
                self.opts.bug == Some(Bug::StoreFailureAsAbsence)
            }
            _ => false,
        };
        self.log(format!("caller fetches {}: {}", key.id, brief(&r)));
        if told_absent && self.store.inner().fetch(&key).is_ok() {
            self.violation(format!(
                "{}/{}: the caller was told not_found while the record exists (a store failure read as absence)",
                key.scope, key.id
            ));
        }
    }

    /// The caller (or a restarted controller) moves job `j` on from the
    /// stored record: never re-sends, never reads a failure as absence.
    fn retry(&mut self, j: usize) {
        if self.jobs[j].done {
            return;
        }
        let Some(h) = self.live_host() else {
            let t = self.now() + 1_000;
            self.at(t, Ev::Retry(j));
            return;
        };
        if self.hosts[h].runs.values().any(|r| r.job == j) {
            return;
        }
        let key = self.jobs[j].key.clone();
        let fetched = self.store.fetch(&key);
        self.log(format!(
            "{} recovers {}: {}",
            self.hosts[h].owner,
            key.id,
            brief(&fetched)
        ));
        match fetched {
            Err(e) if e.category() == Category::NotFound => self.new_run(h, j),
            Err(e) => {
                if self.opts.bug == Some(Bug::StoreFailureAsAbsence)
                    && e.category() == Category::Store
                {
                    if self.store.inner().fetch(&key).is_ok() {
                        self.violation(format!(
                            "{}/{}: recovery read a store failure as absence",
                            key.scope, key.id
                        ));
                    }
                    self.new_run(h, j);
                } else {
                    let t = self.now() + self.rng.range(100, TTL_MS);
                    self.at(t, Ev::Retry(j));
                }
            }
            Ok(rec) => {
                if self.opts.bug == Some(Bug::RedispatchDispatching)
                    && rec.state == ExecState::Dispatching
                {
                    let req = self.next_req;
                    self.next_req += 1;
                    self.reqs.insert(req, None);
                    let argv = self.jobs[j].command.argv().to_vec();
                    let _ = self.worker.send(
                        self.clock.wall_ms(),
                        req,
                        Request::Exec {
                            machine: MACHINE.to_owned(),
                            argv,
                        },
                    );
                }
                match recover(&rec) {
                    Recovery::Keep => {
                        self.jobs[j].done = true;
                        self.log(format!("wait for {} ends: {}", key.id, rec.state.as_str()));
                    }
                    Recovery::MayDispatch => self.new_run(h, j),
                    Recovery::MarkUnknown(_) | Recovery::Complete(_) => {
                        let cfg = self.config(h);
                        let run = Run::resume(rec, cfg, self.wall());
                        self.start_run(h, j, run);
                    }
                }
            }
        }
    }

    /// Takes the run's next output and performs it.
    fn drain(&mut self, h: usize, id: u64) {
        loop {
            let now = self.now();
            let wall = self.wall();
            let Some(hr) = self.hosts[h].runs.get_mut(&id) else {
                return;
            };
            if let Some(op) = hr.run.poll_store_op() {
                if self.opts.bug == Some(Bug::SkipIntentClaimRefresh)
                    && matches!(op, StoreOp::Claim { .. })
                    && hr
                        .last
                        .as_ref()
                        .is_some_and(|r| r.state == ExecState::Ready)
                {
                    let last = hr.last.clone();
                    if let Some(rec) = last {
                        hr.run.handle_stored(wall, Ok(rec));
                        continue;
                    }
                }
                let early_send = self.opts.bug == Some(Bug::DispatchBeforeIntent)
                    && matches!(&op, StoreOp::Write { patch, .. } if patch.state == Some(ExecState::Dispatching));
                let label = op_label(&op);
                if self.crash_point(h, "store_before_commit") {
                    return;
                }
                if early_send {
                    let req = self.send_exec(h, id);
                    if let Some(hr) = self.hosts[h].runs.get_mut(&id) {
                        hr.early = Some((req, None));
                    }
                }
                self.log(format!(
                    "{} {}: {label}",
                    self.hosts[h].owner,
                    self.job_of(h, id)
                ));
                let t = now + self.rng.range(1, 200);
                self.at(
                    t,
                    Ev::StoreApply {
                        host: h,
                        run: id,
                        op: Box::new(op),
                    },
                );
                return;
            }
            if hr.run.poll_dispatch().is_some() {
                if let Some((_, early)) = &mut hr.early {
                    if let Some(r) = early.take() {
                        hr.run.handle_exec_result(wall, r);
                        continue;
                    }
                    return;
                }
                if self.crash_point(h, "worker_before_send") {
                    return;
                }
                self.send_exec(h, id);
                self.crash_point(h, "worker_after_send");
                return;
            }
            if let Some(outcome) = hr.run.take_outcome() {
                let j = hr.job;
                self.hosts[h].runs.remove(&id);
                self.finished(h, id, j, outcome);
            }
            return;
        }
    }

    fn job_of(&self, h: usize, id: u64) -> String {
        self.hosts[h]
            .runs
            .get(&id)
            .map_or_else(String::new, |r| self.jobs[r.job].key.id.clone())
    }

    fn send_exec(&mut self, h: usize, id: u64) -> u64 {
        let req = self.next_req;
        self.next_req += 1;
        self.reqs.insert(req, Some((h, id)));
        let j = self.hosts[h].runs.get(&id).map_or(0, |r| r.job);
        let argv = self.jobs[j].command.argv().to_vec();
        self.log(format!(
            "{} sends exec {}",
            self.hosts[h].owner, self.jobs[j].key.id
        ));
        let now = self.now();
        if let Err(e) = self.worker.send(
            now,
            req,
            Request::Exec {
                machine: MACHINE.to_owned(),
                argv,
            },
        ) {
            self.at(
                now + 1,
                Ev::WorkerReply {
                    host: h,
                    run: id,
                    req,
                    result: Err(e),
                },
            );
        }
        req
    }

    fn store_apply(&mut self, h: usize, id: u64, op: Box<StoreOp>) {
        let crashed = !self.hosts[h].alive || !self.hosts[h].runs.contains_key(&id);
        if crashed && self.rng.chance(500) {
            self.log(format!(
                "in-flight store op of dead {} never arrives",
                self.hosts[h].owner
            ));
            return;
        }
        let result = match *op {
            StoreOp::Accept {
                record,
                max_pending,
            } => self
                .store
                .accept(&record, max_pending)
                .map(smolbox_store::Accepted::into_record),
            StoreOp::Claim {
                key,
                owner,
                now_ms,
                ttl_ms,
            } => self.store.claim(&key, &owner, now_ms, ttl_ms),
            StoreOp::Write {
                key,
                guard,
                patch,
                now_ms,
            } => self.store.write(&key, &guard, &patch, now_ms),
        };
        if crashed {
            return;
        }
        if self.crash_point(h, "store_after_commit") {
            return;
        }
        let t = self.now() + self.rng.range(1, 200);
        self.at(
            t,
            Ev::StoreReply {
                host: h,
                run: id,
                result,
            },
        );
    }

    fn store_reply(&mut self, h: usize, id: u64, result: Result<ExecutionRecord, Error>) {
        let wall = self.wall();
        self.log(format!(
            "{} {} <- {}",
            self.hosts[h].owner,
            self.job_of(h, id),
            brief(&result)
        ));
        let Some(hr) = self.hosts[h].runs.get_mut(&id) else {
            return;
        };
        if let Ok(rec) = &result {
            hr.last = Some(rec.clone());
        }
        hr.run.handle_stored(wall, result);
        if self.crash_point(h, "store_after_reply") {
            return;
        }
        self.drain(h, id);
    }

    fn worker_reply(&mut self, h: usize, id: u64, req: u64, result: Result<Reply, Error>) {
        if !self.hosts[h].alive || !self.hosts[h].runs.contains_key(&id) {
            return;
        }
        if self.crash_point(h, "worker_after_effect") {
            return;
        }
        if result.is_ok() {
            self.worker.settle(req);
        }
        let mut r: Result<ExecOutcome, Error> = match result {
            Ok(Reply::Exec(o)) => Ok(o),
            Ok(_) => Err(Error::protocol(
                smolbox_core::Operation::Exec,
                "unexpected_reply",
            )),
            Err(e) => Err(e),
        };
        if self.opts.bug == Some(Bug::UncertainAsExit)
            && r.as_ref()
                .err()
                .is_some_and(|e| e.evidence() == Evidence::DispatchUncertain)
        {
            r = Ok(ExecOutcome::Exited(ExecOutput {
                exit_code: 0,
                stdout: Vec::new(),
                stderr: Vec::new(),
                encoding: OutputEncoding::Bytes,
            }));
        }
        let wall = self.wall();
        let label = match &r {
            Ok(ExecOutcome::Exited(o)) => format!("exit {}", o.exit_code),
            Ok(ExecOutcome::Launched(_)) => "launched".to_owned(),
            Err(e) => format!(
                "{}:{}:{}",
                e.category().as_str(),
                e.reason(),
                e.evidence().as_str()
            ),
        };
        self.log(format!(
            "{} {} <- exec {label}",
            self.hosts[h].owner,
            self.job_of(h, id)
        ));
        let Some(hr) = self.hosts[h].runs.get_mut(&id) else {
            return;
        };
        let j = hr.job;
        if matches!(r, Ok(ExecOutcome::Exited(_))) {
            self.jobs[j].exit_seen.push((h, id));
        }
        let Some(hr) = self.hosts[h].runs.get_mut(&id) else {
            return;
        };
        if let Some((early_req, slot)) = &mut hr.early
            && *early_req == req
            && slot.is_none()
        {
            *slot = Some(r);
            // The run may not be waiting yet; drain delivers it.
            self.drain(h, id);
            return;
        }
        hr.run.handle_exec_result(wall, r);
        if self.crash_point(h, "worker_after_reply") {
            return;
        }
        self.drain(h, id);
    }

    fn finished(&mut self, h: usize, id: u64, j: usize, outcome: Result<RunOutcome, Error>) {
        let key = self.jobs[j].key.clone();
        match outcome {
            Ok(out) => {
                self.log(format!(
                    "{} {} finished: {} {:?}",
                    self.hosts[h].owner,
                    key.id,
                    out.record.state.as_str(),
                    out.exit_code()
                ));
                if let Some(o) = &out.output {
                    let stored = match out.record.result {
                        Some(ExecResult::Exited { exit_code, .. }) => Some(exit_code),
                        _ => None,
                    };
                    if stored != Some(o.exit_code) {
                        self.violation(format!(
                            "{}/{}: run {id} reported exit {} but stored {stored:?}",
                            key.scope, key.id, o.exit_code
                        ));
                    }
                }
                if is_wait_end(out.record.state) {
                    self.jobs[j].done = true;
                    return;
                }
            }
            Err(e) => {
                self.log(format!(
                    "{} {} failed: {}:{}:{}",
                    self.hosts[h].owner,
                    key.id,
                    e.category().as_str(),
                    e.reason(),
                    e.evidence().as_str()
                ));
                if e.category() == Category::NotFound && self.store.inner().fetch(&key).is_ok() {
                    self.violation(format!(
                        "{}/{}: a run ended not_found while the record exists",
                        key.scope, key.id
                    ));
                }
            }
        }
        let t = self.now() + self.rng.range(TTL_MS / 4, TTL_MS + 1_000);
        self.at(t, Ev::Retry(j));
    }
}

fn op_label(op: &StoreOp) -> String {
    match op {
        StoreOp::Accept { .. } => "accept".to_owned(),
        StoreOp::Claim { .. } => "claim".to_owned(),
        StoreOp::Write { patch, .. } => format!(
            "write {}",
            patch.state.map_or("(no state)", ExecState::as_str)
        ),
    }
}

fn brief(r: &Result<ExecutionRecord, Error>) -> String {
    match r {
        Ok(rec) => format!("v{} {} {:?}", rec.version, rec.state.as_str(), rec.evidence),
        Err(e) => format!("{}:{}", e.category().as_str(), e.reason()),
    }
}
