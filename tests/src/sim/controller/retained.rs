//! Retained machines in the simulation (issue 14 item 1, C14, C7.4,
//! C17.3): a caller per machine that creates, starts, stops and deletes it
//! with versioned requests, submits commands and opens terminals into its
//! slot (sometimes a second one while the slot is held, which must be
//! refused), cancels some, and an operator that, once the run is
//! quiescent, drains (`stop_for_drain`) and resolves (`resolve`, quiesced)
//! a machine left `unknown`. Terminals are driven like the shells drive
//! them: a [`TerminalRun`] per terminal on its controller's host, a
//! [`Registry`] of live connections (open, attach within the attach wait
//! or be ended, exit code or lost), and `TerminalDue` from the due scan
//! resumed with [`TerminalRun::resume`]. A child module of the driver (its
//! private items are visible here).

use smolbox_core::Reason;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use smolbox_core::exec::Command;
use smolbox_core::managed::controller::terminal::{
    TermConfig, TermEvent, TermOutput, TermStoreOp, TermStoreReply, TermStoreResult, TerminalRun,
};
use smolbox_core::managed::controller::{
    ControllerEvent, MachineAnswer, MachineDone, MachineRequest, OpId, RequestId, Resolution,
    StoreOp,
};
use smolbox_core::managed::record::{ExecutionRecord, MachineRecord};
use smolbox_core::managed::slot::Disposition;
use smolbox_core::managed::spec::ManagedTerminalSpec;
use smolbox_core::managed::state::{Cleanup, ExecState, MachineOperation, MachineRecordState};
use smolbox_core::managed::terminal::{Registry, attach_expired};
use smolbox_core::managed::{RecordKey, testkit};
use smolbox_core::terminal::TerminalExit;
use smolbox_core::{Category, Error, Evidence, Operation};
use smolbox_store::Store;

use super::super::worker::{self, Reply, Request};
use super::{Bug, Ev, Job, ReqTo, Sim, TTL_MS};

/// A terminal driven on one host.
#[derive(Debug)]
pub(super) struct TermHost {
    run: TerminalRun,
    /// The upgrade request at the worker, once sent.
    req: Option<u64>,
    /// The 101 was read.
    opened: bool,
    /// The session's end was handed to the run.
    closed: bool,
    timer: Option<u64>,
    /// Spin detection: the last timer instant fired, how often in a row.
    last_fire: u64,
    spins: u64,
    /// Found spinning: from then on its timer is at least 10 ms ahead.
    spinning: bool,
}

/// What a caller's machine request was for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum What {
    Create,
    Lifecycle(MachineOperation),
    Submit(usize),
    Drain,
    Resolve,
    /// A reconcile (probes).
    Reconcile,
    /// A resolve asserting `quiesced` for a running machine (probes).
    Careless,
    /// A drain while a live holder has the slot (probes).
    Maintenance,
}

/// One slot job: a command or a terminal.
#[derive(Clone, Debug)]
pub(super) struct SlotJob {
    key: RecordKey,
    machine: usize,
    terminal: bool,
    exit: i32,
    dur: u64,
    lost: bool,
    /// Index in `Sim::jobs` (commands: exit bookkeeping and end checks).
    job: usize,
    /// The command's argv (with the output paths it writes, if any).
    argv: Vec<String>,
    /// Its declared files (issue 12; none for a terminal or a launch).
    files: smolbox_core::managed::CommandFiles,
}

/// One caller's retained machine.
#[derive(Clone, Debug)]
pub(super) struct RMachine {
    pub(super) key: RecordKey,
    jobs: Vec<usize>,
    next_job: usize,
    created: bool,
    stop_after: bool,
    delete_after: bool,
    stopped_once: bool,
    pub(super) done: bool,
    /// A request of the caller is outstanding until then.
    busy_until: u64,
    drain_tried: bool,
    /// The operator skips the drain and resolves at once (the resolve's
    /// own inspection must then refuse a running machine).
    skip_drain: bool,
    resolves: u32,
    /// The worker answered 404 for the machine (resolve it as deleted).
    gone: bool,
}

/// The retained part of a run.
#[derive(Debug, Default)]
pub(super) struct Retained {
    pub(super) machines: Vec<RMachine>,
    pub(super) slot_jobs: Vec<SlotJob>,
    /// Caller requests in flight: (host, request) → (machine, what).
    reqs: BTreeMap<(usize, RequestId), (usize, What)>,
    /// Machines an operator's quiescent resolve is in flight for.
    pub(super) authorized: BTreeSet<RecordKey>,
    /// Worker requests that are inspects: request → machine name.
    pub(super) inspects: BTreeMap<u64, String>,
}

/// The defaults of C7.1 (a 30 s session: the profile's execution budget).
fn term_spec() -> ManagedTerminalSpec {
    ManagedTerminalSpec::default()
}

impl Sim {
    /// The retained workload: 1–2 machines, 1–3 jobs each (a third of them
    /// terminals), cancels, and the lifecycle plan after the jobs.
    pub(super) fn retained_workload(&mut self, rng: &mut super::super::rng::Rng) {
        self.worker.stop_kills = true;
        let n = if rng.chance(300) { 2 } else { 1 };
        let target = super::catalog::command_target(super::catalog::SIM_ARCH);
        for m in 0..n {
            let key = testkit::key("sim", &format!("mk{m}"));
            let mut jobs = Vec::new();
            for j in 0..rng.range(1, 3) {
                let terminal = rng.chance(350);
                let id = format!("{}{m}{j}", if terminal { 't' } else { 'c' });
                let exit = rng.range(0, 3) as i32;
                let dur = rng.range(0, if terminal { 25_000 } else { 3 * TTL_MS });
                let mut argv = worker::sim_argv(&id, exit, dur);
                let key = testkit::key("sim", &id);
                // A slot command (not a launch) may declare files, by the
                // named run's plan (the files' own random stream).
                let files = if terminal || self.files.background(&key) {
                    smolbox_core::managed::CommandFiles::default()
                } else {
                    let (inputs, outputs) = self.files.plan(&id, &mut argv);
                    smolbox_core::managed::CommandFiles { inputs, outputs }
                };
                let cmd = Command::new(argv.clone());
                let mut spec =
                    smolbox_core::managed::controller::spec_for(&cmd, &target, "w1", "m0")
                        .unwrap_or_else(|e| unreachable!("a valid spec: {e:?}"));
                spec.inputs.clone_from(&files.inputs);
                spec.outputs.clone_from(&files.outputs);
                let job = self.jobs.len();
                self.jobs.push(Job {
                    key: testkit::key("sim", &id),
                    spec,
                    accepted: false,
                    exit_seen: Vec::new(),
                });
                let sj = self.ret.slot_jobs.len();
                self.ret.slot_jobs.push(SlotJob {
                    key: testkit::key("sim", &id),
                    machine: m,
                    terminal,
                    exit,
                    dur,
                    lost: terminal && rng.chance(150),
                    job,
                    argv,
                    files,
                });
                jobs.push(sj);
                if rng.chance(200) {
                    self.at(rng.range(2_000, 60_000), Ev::CancelSlot(sj));
                }
            }
            self.ret.machines.push(RMachine {
                key,
                jobs,
                next_job: 0,
                created: false,
                stop_after: rng.chance(500),
                delete_after: rng.chance(300),
                stopped_once: false,
                done: false,
                busy_until: 0,
                drain_tried: false,
                skip_drain: rng.chance(250),
                resolves: 0,
                gone: false,
            });
            self.at(rng.range(0, 3_000), Ev::Caller(m));
        }
    }

    fn caller_again(&mut self, m: usize) {
        let t = self.now() + self.rng.range(2_000, 6_000);
        self.at(t, Ev::Caller(m));
    }

    /// May the operator assert `quiesced` for machine record `r` now? Only
    /// when it is true: the run is quiescent, no controller is paused (an
    /// old one could come back), nothing sent by any controller is still
    /// on its way, and no live controller still drives the slot's holder
    /// (one that was paused may hold a late exit it is about to store).
    fn operator_may_act(&self, r: &MachineRecord) -> bool {
        let now = self.now();
        let driven = r.active_execution.as_ref().is_some_and(|k| {
            self.hosts
                .iter()
                .any(|h| h.terms.contains_key(k) || h.ctl.as_ref().is_some_and(|c| c.is_active(k)))
        });
        !self.chaos
            && !driven
            && self.hosts.iter().all(|h| h.paused_until <= now)
            && !self.worker.requests_in_flight()
    }

    pub(super) fn request(&mut self, h: usize, m: usize, what: What, req: MachineRequest) {
        self.log(format!(
            "caller of {}: {what:?} via {}",
            self.ret.machines[m].key.id,
            Self::owner(h)
        ));
        let (n, w) = (self.clock.now(), self.clock.wall_ms());
        let Some(ctl) = self.hosts[h].ctl.as_mut() else {
            return;
        };
        match ctl.machine(n, w, req) {
            Ok(id) => {
                self.ret.reqs.insert((h, id), (m, what));
                if what == What::Resolve {
                    let key = self.ret.machines[m].key.clone();
                    self.ret.authorized.insert(key);
                }
                self.ret.machines[m].busy_until = self.now() + 20_000;
            }
            Err(e) => self.violation(format!("machine request {what:?} refused: {e:?}")),
        }
        self.drain(h);
    }

    /// One caller step for machine `m` (see the module docs).
    pub(super) fn caller(&mut self, m: usize) {
        if self.ret.machines[m].done {
            return;
        }
        let Some(h) = self.live_host() else {
            return self.caller_again(m);
        };
        let now = self.now();
        if self.ret.machines[m].busy_until > now {
            return self.caller_again(m);
        }
        let key = self.ret.machines[m].key.clone();
        if !self.ret.machines[m].created {
            self.request(
                h,
                m,
                What::Create,
                MachineRequest::Create {
                    key,
                    spec: super::catalog::machine_spec(super::catalog::SIM_ARCH),
                },
            );
            return self.caller_again(m);
        }
        // The caller reads the record as any client does (faults apply).
        let Ok(r) = self.store.fetch_machine(&key) else {
            return self.caller_again(m);
        };
        self.caller_step(h, m, &r);
        if !self.ret.machines[m].done {
            self.caller_again(m);
        }
    }

    fn holder_state(&self, r: &MachineRecord) -> Option<ExecState> {
        let k = r.active_execution.as_ref()?;
        self.model.last(k).map(|e| e.state)
    }

    fn caller_step(&mut self, h: usize, m: usize, r: &MachineRecord) {
        use MachineRecordState as S;
        self.log(format!(
            "caller of {} sees v{} {} {:?} slot {:?}",
            r.key.id,
            r.version,
            r.state.as_str(),
            r.operation,
            r.active_execution.as_ref().map(|k| k.id.as_str())
        ));
        let key = r.key.clone();
        let v = r.version;
        let blocked = matches!(r.state, S::Unknown | S::Missing | S::Conflict)
            || self
                .holder_state(r)
                .is_some_and(|s| s == ExecState::Unknown);
        if self.probe(h, m, r) || self.owner_deletes_absent(h, m, r) {
            return;
        }
        if r.state == S::Deleted {
            self.ret.machines[m].done = true;
            return;
        }
        // An uncertain lifecycle operation (`unknown` with the operation
        // kept `uncertain`) or an unknown holder: only the operator's
        // resolve settles it.
        if blocked && (r.operation == MachineOperation::None || r.state == S::Unknown) {
            if self.ret.machines[m].resolves >= 20 {
                self.ret.machines[m].done = true;
                return;
            }
            if !self.operator_may_act(r) {
                return;
            }
            let rm = &mut self.ret.machines[m];
            if !rm.drain_tried && !rm.skip_drain && r.creation.is_some() {
                rm.drain_tried = true;
                return self.request(
                    h,
                    m,
                    What::Drain,
                    MachineRequest::StopForDrain { key, version: v },
                );
            }
            rm.resolves += 1;
            let disposition = if r.state == S::Missing || rm.gone {
                Resolution::Deleted
            } else {
                Resolution::Stopped
            };
            return self.request(
                h,
                m,
                What::Resolve,
                MachineRequest::Resolve {
                    key,
                    version: v,
                    quiesced: true,
                    disposition,
                },
            );
        }
        if r.operation != MachineOperation::None {
            return;
        }
        let rm = self.ret.machines[m].clone();
        // No new work in the second half of the quiescent window: what was
        // started must be able to end in it.
        let late = self.now() > super::CHAOS_MS + super::QUIET_MS / 2;
        let jobs_left = rm.next_job < rm.jobs.len() && !late;
        let lifecycle = |op| What::Lifecycle(op);
        match r.state {
            S::Running if r.active_execution.is_none() && jobs_left => {
                self.submit_job(h, m, rm.jobs[rm.next_job]);
            }
            // A second submission while the slot is held: refused.
            S::Running if r.active_execution.is_some() && jobs_left && self.rng.chance(150) => {
                self.submit_job(h, m, rm.jobs[rm.next_job]);
            }
            S::Running if r.active_execution.is_some() => {}
            S::Running if rm.stop_after && !rm.stopped_once && !late => {
                self.ret.machines[m].stopped_once = true;
                let op = MachineOperation::Stop;
                self.request(
                    h,
                    m,
                    lifecycle(op),
                    MachineRequest::Lifecycle {
                        key,
                        action: op,
                        version: v,
                    },
                );
            }
            S::Created | S::Stopped if jobs_left => {
                let op = MachineOperation::Start;
                self.request(
                    h,
                    m,
                    lifecycle(op),
                    MachineRequest::Lifecycle {
                        key,
                        action: op,
                        version: v,
                    },
                );
            }
            S::Running | S::Created | S::Stopped if rm.delete_after && !late => {
                let op = MachineOperation::Delete;
                self.request(
                    h,
                    m,
                    lifecycle(op),
                    MachineRequest::Lifecycle {
                        key,
                        action: op,
                        version: v,
                    },
                );
            }
            S::Running | S::Created | S::Stopped => self.ret.machines[m].done = true,
            _ => {}
        }
    }

    fn submit_job(&mut self, h: usize, m: usize, sj: usize) {
        let job = self.ret.slot_jobs[sj].clone();
        let machine = self.ret.machines[m].key.clone();
        if job.terminal {
            return self.open_terminal(h, sj);
        }
        let command = self.slot_command(&job.key, job.argv);
        self.request(
            h,
            m,
            What::Submit(sj),
            MachineRequest::Submit {
                machine,
                key: job.key,
                command,
                files: job.files,
            },
        );
    }

    fn open_terminal(&mut self, h: usize, sj: usize) {
        let job = self.ret.slot_jobs[sj].clone();
        if self.hosts[h].terms.contains_key(&job.key) {
            return;
        }
        let Some(ctl) = self.hosts[h].ctl.as_ref() else {
            return;
        };
        let cfg = TermConfig::of(ctl.config());
        let machine = self.ret.machines[job.machine].key.clone();
        match TerminalRun::open(
            cfg,
            testkit::fingerprint_key(),
            job.key.clone(),
            machine,
            term_spec(),
            true,
        ) {
            Ok(run) => {
                self.log(format!(
                    "caller opens terminal {} via {}",
                    job.key.id,
                    Self::owner(h)
                ));
                self.ret.machines[job.machine].busy_until = self.now() + 20_000;
                self.add_term(h, job.key, run);
            }
            Err(e) => self.violation(format!("terminal open refused: {e:?}")),
        }
    }

    fn add_term(&mut self, h: usize, key: RecordKey, run: TerminalRun) {
        self.hosts[h].terms.insert(
            key.clone(),
            TermHost {
                run,
                req: None,
                opened: false,
                closed: false,
                timer: None,
                last_fire: u64::MAX,
                spins: 0,
                spinning: false,
            },
        );
        self.drain_term(h, &key);
    }

    /// The due scan found a terminal not driven here: resumed (C7.4).
    pub(super) fn terminal_due(&mut self, h: usize, rec: ExecutionRecord) {
        if let Some(t) = self.hosts[h].terms.get_mut(&rec.key) {
            // A live run of the key takes the row (as `LiveSet::due_row`
            // and `feed_rows` hand it over in the shells).
            t.run.handle_row(&rec);
            return;
        }
        let Some(ctl) = self.hosts[h].ctl.as_ref() else {
            return;
        };
        let cfg = TermConfig::of(ctl.config());
        let key = rec.key.clone();
        let (n, w) = (self.clock.now(), self.clock.wall_ms());
        match TerminalRun::resume(cfg, testkit::fingerprint_key(), rec, n, w) {
            Ok(run) => {
                self.log(format!("{} resumes terminal {}", Self::owner(h), key.id));
                self.add_term(h, key, run);
            }
            Err(e) => self.violation(format!("resume of a due terminal refused: {e:?}")),
        }
    }

    /// Performs every output of terminal `key`'s run on host `h`.
    pub(super) fn drain_term(&mut self, h: usize, key: &RecordKey) {
        loop {
            if self.hosts[h].paused_until > self.now() || self.hosts[h].ctl.is_none() {
                return;
            }
            let Some(t) = self.hosts[h].terms.get_mut(key) else {
                return;
            };
            let Some(out) = t.run.poll_output() else {
                break;
            };
            match out {
                TermOutput::Store(id, op) => {
                    let op = *op;
                    if self.opts.bug == Some(Bug::SlotReleasedOnUnknown)
                        && let TermStoreOp::FinishCommand { machine, exec, .. } = &op
                    {
                        let (machine, exec) = (machine.clone(), exec.clone());
                        self.plant_slot_release(&machine, &exec);
                    }
                    if self.crash_point(h, "store_before_commit") {
                        return;
                    }
                    self.log(format!("{} term {} {}", Self::owner(h), key.id, op.name()));
                    let t = self.now() + self.rng.range(1, 200);
                    self.at(t, Ev::TermApply(h, key.clone(), id, Box::new(op)));
                }
                TermOutput::Open { machine, .. } => {
                    if self.crash_point(h, "worker_before_send") {
                        return;
                    }
                    let Some(job) = self.ret.slot_jobs.iter().find(|j| j.key == *key).cloned()
                    else {
                        continue;
                    };
                    let req = self.next_req;
                    self.next_req += 1;
                    self.reqs
                        .insert(req, (ReqTo::Term(h, key.clone()), Some(key.clone())));
                    if let Some(t) = self.hosts[h].terms.get_mut(key) {
                        t.req = Some(req);
                    }
                    self.log(format!("{} opens terminal {}", Self::owner(h), key.id));
                    let now = self.now();
                    let sent = self.worker.send(
                        now,
                        req,
                        Request::Terminal {
                            machine,
                            identity: key.id.clone(),
                            exit_code: job.exit,
                            duration_ms: job.dur,
                            lost: job.lost,
                        },
                    );
                    if let Err(e) = sent {
                        self.at(now + 1, Ev::TermWorker(h, key.clone(), req, Err(e)));
                    }
                    if self.crash_point(h, "worker_after_send") {
                        return;
                    }
                }
                TermOutput::Inspect { machine, .. } => {
                    // The image preflight: core's verdict on the machine as
                    // the worker shows it (imageless ones are refused).
                    // Answered at once; it mutates nothing, so no crash
                    // point belongs here.
                    let verdict = self.terminal_image_verdict(&machine);
                    let (n, w) = (self.clock.now(), self.clock.wall_ms());
                    if let Some(t) = self.hosts[h].terms.get_mut(key) {
                        t.run.handle_inspected(n, w, verdict);
                    }
                }
                TermOutput::Close => {
                    // Cancel after dispatch: the connection is closed; the
                    // worker hangs up the program; observation ends.
                    self.worker.close_terminal(&key.id);
                    if let Some(reg) = self.hosts[h].registry.as_mut() {
                        reg.remove(key);
                    }
                    self.log(format!("{} closes terminal {}", Self::owner(h), key.id));
                    let (n, w) = (self.clock.now(), self.clock.wall_ms());
                    if let Some(t) = self.hosts[h].terms.get_mut(key)
                        && !t.closed
                    {
                        t.closed = true;
                        let e = Error::unknown(
                            Operation::TerminalSession,
                            Evidence::DispatchUncertain,
                            Reason::ClosedByCancel,
                        );
                        t.run.handle_closed(n, w, &Err(e));
                    }
                }
                TermOutput::Event(TermEvent::Accepted { record, existing }) => {
                    self.log(format!(
                        "{} terminal {} accepted (existing {existing}) {}",
                        Self::owner(h),
                        key.id,
                        record.state.as_str()
                    ));
                    self.job_accepted(key);
                }
                TermOutput::Event(TermEvent::Refused(e)) => {
                    self.log(format!(
                        "{} terminal {} refused: {}:{}",
                        Self::owner(h),
                        key.id,
                        e.category().as_str(),
                        e.reason()
                    ));
                    if let Some(m) = self.job_machine(key) {
                        self.ret.machines[m].busy_until = 0;
                        self.on_slot_refusal(m, key, &e);
                    }
                }
                TermOutput::Event(TermEvent::Done { record, error, .. }) => {
                    self.log(format!(
                        "{} terminal {} done: {:?} {:?}",
                        Self::owner(h),
                        key.id,
                        record.as_ref().map(|r| r.state.as_str()),
                        error.as_ref().map(|e| (e.category().as_str(), e.reason()))
                    ));
                }
            }
        }
        let done = self.hosts[h]
            .terms
            .get(key)
            .is_some_and(|t| t.run.is_done() && (t.closed || !t.opened));
        if done {
            self.hosts[h].terms.remove(key);
            if let Some(reg) = self.hosts[h].registry.as_mut() {
                reg.remove(key);
            }
            return;
        }
        let Some(t) = self.hosts[h].terms.get(key) else {
            return;
        };
        let floor = if t.spinning {
            self.now() + 10
        } else {
            self.now()
        };
        let at = t.run.poll_timeout().map(|i| self.clock.ms_of(i).max(floor));
        if at != t.timer
            && let Some(at) = at
        {
            if let Some(t) = self.hosts[h].terms.get_mut(key) {
                t.timer = Some(at);
            }
            self.at(at, Ev::TermTimer(h, key.clone(), at));
        }
    }

    fn job_machine(&self, key: &RecordKey) -> Option<usize> {
        self.ret
            .slot_jobs
            .iter()
            .find(|j| j.key == *key)
            .map(|j| j.machine)
    }

    /// Slot job `key` was refused for good (its machine is imageless): the
    /// caller moves on to its next job.
    pub(super) fn job_refused(&mut self, key: &RecordKey) {
        let Some(sj) = self.ret.slot_jobs.iter().position(|j| j.key == *key) else {
            return;
        };
        let rm = &mut self.ret.machines[self.ret.slot_jobs[sj].machine];
        rm.busy_until = 0;
        if rm.jobs.get(rm.next_job) == Some(&sj) {
            rm.next_job += 1;
        }
    }

    fn job_accepted(&mut self, key: &RecordKey) {
        let Some(sj) = self.ret.slot_jobs.iter().position(|j| j.key == *key) else {
            return;
        };
        let (m, job) = (self.ret.slot_jobs[sj].machine, self.ret.slot_jobs[sj].job);
        self.jobs[job].accepted = true;
        let rm = &mut self.ret.machines[m];
        rm.busy_until = 0;
        if rm.jobs.get(rm.next_job) == Some(&sj) {
            rm.next_job += 1;
        }
    }

    pub(super) fn term_timer(&mut self, h: usize, key: &RecordKey, at: u64) {
        let (n, w) = (self.clock.now(), self.clock.wall_ms());
        let mut spun = false;
        if let Some(t) = self.hosts[h].terms.get_mut(key)
            && t.timer == Some(at)
        {
            t.timer = None;
            t.spins = if t.last_fire == at { t.spins + 1 } else { 0 };
            t.last_fire = at;
            if t.spins == 1_000 && !t.spinning {
                t.spinning = true;
                spun = true;
            }
            t.run.handle_timeout(n, w);
        } else {
            return;
        }
        if spun {
            self.violation(format!(
                "{}/{}: terminal run spins: poll_timeout stays at {at}ms (not after now) and handle_timeout makes no progress",
                key.scope, key.id
            ));
        }
        self.drain_term(h, key);
    }

    pub(super) fn term_apply(&mut self, h: usize, key: RecordKey, id: OpId, op: TermStoreOp) {
        let dead = self.hosts[h].ctl.is_none();
        if dead && self.rng.chance(500) {
            return;
        }
        let result = smolbox_store::apply_terminal_op(&self.store, &op);
        if let Ok(TermStoreReply::Lease(l)) = &result {
            self.lease_gen = self.lease_gen.max(l.generation);
        }
        if dead || self.crash_point(h, "store_after_commit") {
            return;
        }
        let t = self.now() + self.rng.range(1, 200);
        self.at(t, Ev::TermReply(h, key, id, result));
    }

    pub(super) fn term_reply(&mut self, h: usize, key: &RecordKey, id: OpId, r: TermStoreResult) {
        if self.hosts[h].ctl.is_none() {
            return;
        }
        let label = match &r {
            Ok(TermStoreReply::Record(rec)) => format!("v{} {}", rec.version, rec.state.as_str()),
            Ok(_) => "reply".to_owned(),
            Err(e) => format!("{}:{}", e.category().as_str(), e.reason()),
        };
        self.log(format!("{} term {} <- {label}", Self::owner(h), key.id));
        let (n, w) = (self.clock.now(), self.clock.wall_ms());
        if let Some(t) = self.hosts[h].terms.get_mut(key) {
            t.run.handle_stored(n, w, id, r);
        }
        if !self.crash_point(h, "store_after_reply") {
            self.drain_term(h, key);
        }
    }

    /// A worker message for terminal `key` on host `h`: the upgrade's
    /// answer, or the session's end.
    pub(super) fn term_worker(
        &mut self,
        h: usize,
        key: &RecordKey,
        req: u64,
        r: Result<Reply, Error>,
    ) {
        if self.hosts[h].ctl.is_none() || !self.hosts[h].terms.contains_key(key) {
            return;
        }
        if self.crash_point(h, "worker_after_effect") {
            return;
        }
        let (n, w) = (self.clock.now(), self.clock.wall_ms());
        let opened = self.hosts[h].terms.get(key).is_some_and(|t| t.opened);
        match (opened, r) {
            (false, Ok(Reply::TermOpened)) => {
                self.worker.settle(req);
                let wait = Duration::from_millis(term_spec().attach_ms);
                let inserted = self.hosts[h]
                    .registry
                    .as_mut()
                    .map(|reg| reg.insert(n, key.clone(), super::conn::SimConn::new(), wait));
                let result = match inserted {
                    Some(Ok(_)) => Ok(()),
                    Some(Err(e)) => Err(e.with_evidence(Evidence::DispatchUncertain)),
                    None => Ok(()),
                };
                self.log(format!("{} terminal {} opened", Self::owner(h), key.id));
                if let Some(t) = self.hosts[h].terms.get_mut(key) {
                    t.opened = result.is_ok();
                    t.run.handle_opened(n, w, result);
                }
                // The consumer attaches within the attach wait, mostly.
                let within = term_spec().attach_ms * 5 / 4;
                let at = self.now() + self.rng.range(0, within);
                self.at(at, Ev::Attach(h, key.clone()));
                self.arm_registry(h);
            }
            (false, other) => {
                let e = match other {
                    Err(e) => e,
                    Ok(_) => Error::protocol(Operation::TerminalOpen, Reason::UnexpectedReply),
                };
                self.log(format!(
                    "{} terminal {} open failed: {}:{}",
                    Self::owner(h),
                    key.id,
                    e.category().as_str(),
                    e.evidence().as_str()
                ));
                if let Some(t) = self.hosts[h].terms.get_mut(key) {
                    t.closed = true;
                    t.run.handle_opened(n, w, Err(e));
                }
            }
            (true, r) => {
                let outcome = match r {
                    Ok(Reply::TermClosed(Ok(code))) => Ok(TerminalExit { code }),
                    Ok(Reply::TermClosed(Err(e))) | Err(e) => Err(e),
                    Ok(_) => return,
                };
                self.log(format!(
                    "{} terminal {} closed: {:?}",
                    Self::owner(h),
                    key.id,
                    outcome.as_ref().map(|x| x.code).map_err(|e| e.reason())
                ));
                if let Some(reg) = self.hosts[h].registry.as_mut() {
                    reg.finished(n, key);
                }
                if let Some(t) = self.hosts[h].terms.get_mut(key)
                    && !t.closed
                {
                    t.closed = true;
                    t.run.handle_closed(n, w, &outcome);
                }
            }
        }
        if self.crash_point(h, "worker_after_reply") {
            return;
        }
        self.drain_term(h, key);
    }

    pub(super) fn attach(&mut self, h: usize, key: &RecordKey) {
        let n = self.clock.now();
        if let Some(reg) = self.hosts[h].registry.as_mut() {
            let r = reg.attach(n, key);
            let label = match r {
                Ok(Some(_)) => "attached",
                Ok(None) => "nothing to attach",
                Err(_) => "attach refused",
            };
            self.log(format!("consumer of {}: {label}", key.id));
            if let Ok(Some(who)) = r {
                self.type_into(h, key, who);
            }
        }
    }

    fn arm_registry(&mut self, h: usize) {
        let Some(at) = self.hosts[h]
            .registry
            .as_ref()
            .and_then(Registry::poll_timeout)
        else {
            return;
        };
        let at = self.clock.ms_of(at).max(self.now());
        self.at(at, Ev::RegTimer(h));
    }

    /// The registry's timers: a live connection nobody attached to within
    /// its attach wait is ended (the program may have run: uncertain).
    pub(super) fn reg_timer(&mut self, h: usize) {
        let (n, w) = (self.clock.now(), self.clock.wall_ms());
        let Some(reg) = self.hosts[h].registry.as_mut() else {
            return;
        };
        let (expired, _retired) = reg.handle_timeout(n);
        for (key, _) in expired {
            self.worker.close_terminal(&key.id);
            self.log(format!("terminal {}: nobody attached in time", key.id));
            if let Some(t) = self.hosts[h].terms.get_mut(&key)
                && !t.closed
            {
                t.closed = true;
                t.run.handle_closed(n, w, &Err(attach_expired()));
            }
            self.drain_term(h, &key);
        }
        self.arm_registry(h);
    }

    pub(super) fn cancel_slot(&mut self, sj: usize) {
        let Some(h) = self.live_host() else {
            return;
        };
        let key = self.ret.slot_jobs[sj].key.clone();
        self.log(format!("caller cancels {} via {}", key.id, Self::owner(h)));
        let (n, w) = (self.clock.now(), self.clock.wall_ms());
        if let Some(t) = self.hosts[h].terms.get_mut(&key) {
            t.run.cancel(n, w);
            return self.drain_term(h, &key);
        }
        if let Some(c) = self.hosts[h].ctl.as_mut() {
            c.cancel(n, w, key);
        }
        self.drain(h);
    }

    /// A crash drops the host's terminals: their connections go away
    /// without a close (nobody hears them; the programs run on).
    pub(super) fn drop_terms(&mut self, h: usize) {
        for (key, t) in std::mem::take(&mut self.hosts[h].terms) {
            if t.req.is_some() && !t.closed {
                self.worker.drop_terminal(&key.id);
            }
        }
        self.hosts[h].registry = Registry::new(8).ok();
        let resolving: Vec<RecordKey> = self
            .ret
            .reqs
            .iter()
            .filter(|((x, _), (_, what))| *x == h && *what == What::Resolve)
            .map(|(_, (m, _))| self.ret.machines[*m].key.clone())
            .collect();
        for k in resolving {
            self.ret.authorized.remove(&k);
        }
        self.ret.reqs.retain(|(x, _), _| *x != h);
    }

    /// The answer to a caller's machine request.
    pub(super) fn on_machine_done(&mut self, h: usize, d: MachineDone) {
        let Some((m, what)) = self.ret.reqs.remove(&(h, d.id)) else {
            return;
        };
        let key = self.ret.machines[m].key.clone();
        if what == What::Resolve {
            self.ret.authorized.remove(&key);
        }
        self.ret.machines[m].busy_until = 0;
        let label = match &d.result {
            Ok(_) => "ok".to_owned(),
            Err(e) => format!("{}:{}", e.category().as_str(), e.reason()),
        };
        self.log(format!("caller of {}: {what:?} -> {label}", key.id));
        if matches!(what, What::Reconcile | What::Careless | What::Maintenance) {
            return self.on_probe_done(what, &key, &d.result);
        }
        match (what, d.result) {
            (What::Create, Ok(_)) => self.ret.machines[m].created = true,
            (What::Submit(sj), Ok(MachineAnswer::Submitted { execution, .. })) => {
                let k = execution.key.clone();
                let _ = sj;
                self.job_accepted(&k);
            }
            (What::Submit(sj), Err(e)) if e.reason() == Reason::NeedsPlainImageMachine => {
                let k = self.ret.slot_jobs[sj].key.clone();
                self.on_slot_refusal(m, &k, &e);
            }
            (What::Resolve, Ok(MachineAnswer::Resolved { .. })) => {
                self.ret.machines[m].drain_tried = false;
            }
            (What::Resolve | What::Drain, Err(e)) if e.category() == Category::StaleVersion => {
                self.ret.machines[m].drain_tried = false;
            }
            // What the resolve's inspection found decides the operator's
            // next try: a 404 → resolve as deleted; present → as stopped;
            // running → drain it first.
            (What::Resolve, Err(e)) if e.category() == Category::IdentityConflict => {
                let evidence = self
                    .slot_model
                    .last(&key)
                    .is_some_and(|r| r.creation.is_some());
                let name = self
                    .slot_model
                    .last(&key)
                    .and_then(|r| r.assignment.as_ref())
                    .map(|a| a.machine_name.clone());
                let rm = &mut self.ret.machines[m];
                match e.reason() {
                    Reason::Absent => rm.gone = true,
                    Reason::Present | Reason::IncarnationMismatch if !evidence => {
                        // A machine whose create was uncertain: nothing
                        // proves it is this record's. The operator removes
                        // it at the worker by hand, then resolves deleted.
                        if let Some(n) = name {
                            self.log(format!("operator deletes {n} at the worker by hand"));
                            self.worker.remove_by_hand(&n);
                        }
                        self.ret.machines[m].gone = true;
                    }
                    Reason::Present => rm.gone = false,
                    Reason::Running => {
                        rm.skip_drain = false;
                        rm.drain_tried = false;
                    }
                    _ => {}
                }
            }
            (What::Drain | What::Resolve, Err(e))
                if e.category() == Category::NotFound
                    && !e.operation().as_str().starts_with("store") =>
            {
                // The worker has no such machine: resolve it as deleted.
                self.ret.machines[m].gone = true;
            }
            (_, Err(e))
                if e.category() == Category::NotFound
                    && e.operation().as_str().starts_with("store") =>
            {
                self.violation(format!(
                    "{}/{}: machine request {what:?} answered not_found while the record exists",
                    key.scope, key.id
                ));
            }
            _ => {}
        }
    }

    /// Planted `SlotReleasedOnUnknown`: the holder's outcome is unknown,
    /// yet the slot is freed (here through the store's resolve, with
    /// nobody's quiescent assertion behind it).
    pub(super) fn plant_slot_release(&mut self, machine: &RecordKey, exec: &RecordKey) {
        let unknown = self
            .model
            .last(exec)
            .is_some_and(|r| r.state == ExecState::Unknown);
        let Ok(m) = self.store.inner().fetch_machine(machine) else {
            return;
        };
        if !unknown || m.active_execution.as_ref() != Some(exec) {
            return;
        }
        let Some(c) = m.creation.clone() else {
            return;
        };
        let d = Disposition::Stopped {
            observed: MachineRecordState::Stopped,
            incarnation: c.incarnation,
        };
        let now_ms = self.clock.wall_ms().max(m.updated_at_ms);
        self.log(format!(
            "planted: slot of {} released while {} is unknown",
            machine.id, exec.id
        ));
        let _ = self.store.resolve_unfaulted(machine, m.version, &d, now_ms);
    }

    /// Planted `ResolveWithoutVerifiedStop`: the resolve's inspection is
    /// answered "stopped" without asking the worker.
    pub(super) fn fabricated_inspect(&self, h: usize, name: &str) -> Option<Reply> {
        if self.opts.bug != Some(Bug::ResolveWithoutVerifiedStop) {
            return None;
        }
        let resolving = self.ret.reqs.iter().any(|((x, _), (m, what))| {
            *x == h
                && matches!(*what, What::Resolve | What::Careless)
                && self
                    .slot_model
                    .last(&self.ret.machines[*m].key)
                    .and_then(|r| r.assignment.as_ref())
                    .is_some_and(|a| a.machine_name == name)
        });
        if !resolving {
            return None;
        }
        let mut v = self.worker.machine_view(name)?;
        v.state = worker::MachineState::Stopped;
        Some(Reply::Machine(v))
    }

    /// End-of-run rules of retained machines: every machine's wait ended
    /// (no lifecycle operation left in progress after the quiescent
    /// window) and no slot is left held by a finished holder.
    /// Probe (session 9): a controller crashed while a slot command with
    /// declared files was at a durable boundary: its record `preparing`,
    /// `ready`, `dispatching`, `running` or `collecting`, or ended (or
    /// `unknown`) while it still held the slot and before the slot's finish
    /// set its cleanup.
    pub(super) fn count_slot_file_crash(&mut self) {
        let mut hits = Vec::new();
        for j in &self.ret.slot_jobs {
            if j.files.inputs.is_empty() && j.files.outputs.is_empty() {
                continue;
            }
            let Some(rec) = self.model.last(&j.key) else {
                continue;
            };
            let machine = &self.ret.machines[j.machine].key;
            let holds = self
                .slot_model
                .last(machine)
                .is_some_and(|m| m.active_execution.as_ref() == Some(&j.key));
            hits.push(match rec.state {
                ExecState::Preparing => "crash_slot_files_preparing",
                ExecState::Ready => "crash_slot_files_ready",
                ExecState::Dispatching => "crash_slot_files_dispatching",
                ExecState::Running => "crash_slot_files_running",
                ExecState::Collecting => "crash_slot_files_collecting",
                // Not finished yet: a finish sets the cleanup (complete or
                // failed) in the same transaction.
                s if holds
                    && (s.is_terminal() || s == ExecState::Unknown)
                    && !matches!(rec.cleanup, Cleanup::Complete | Cleanup::Failed) =>
                {
                    "crash_slot_files_before_finish"
                }
                _ => continue,
            });
        }
        for probe in hits {
            *self.files.counts.entry(probe).or_insert(0) += 1;
        }
    }

    pub(super) fn finish_retained(&mut self) {
        self.check_terminal_bytes();
        let recs: Vec<MachineRecord> = self.slot_model.all().cloned().collect();
        for r in recs {
            if r.operation != MachineOperation::None && r.state != MachineRecordState::Unknown {
                let fenced = self.fenced_note(&r);
                self.violation(format!(
                    "{}/{}: the machine's wait never ended ({} with {:?} in progress){fenced}",
                    r.key.scope,
                    r.key.id,
                    r.state.as_str(),
                    r.operation
                ));
            }
            if let Some(k) = &r.active_execution
                && self
                    .model
                    .last(k)
                    .is_some_and(|e| e.state.is_terminal() && e.state != ExecState::Failed)
                && r.state != MachineRecordState::Unknown
            {
                let fenced = self.fenced_note(&r);
                self.violation(format!(
                    "{}/{}: slot still held by {}, which finished (a leaked slot){fenced}",
                    r.key.scope, r.key.id, k.id
                ));
            }
        }
    }

    /// " (fenced: …)" when `r` is assigned under an older worker-lease
    /// generation than the latest committed one (a known finding: such a
    /// machine is fenced for every controller and never moves again).
    fn fenced_note(&self, r: &MachineRecord) -> String {
        r.assignment
            .as_ref()
            .filter(|a| a.worker_generation < self.lease_gen)
            .map_or_else(String::new, |a| {
                format!(
                    " (fenced: assigned under an older worker-lease generation {} < {})",
                    a.worker_generation, self.lease_gen
                )
            })
    }

    /// Store ops the `Controller` emits for retained machines that the
    /// planted bugs act on.
    pub(super) fn plant_on_store_op(&mut self, op: &StoreOp) {
        if self.opts.bug == Some(Bug::SlotReleasedOnUnknown)
            && let StoreOp::FinishCommand { machine, exec, .. } = op
        {
            let (machine, exec) = (machine.clone(), exec.clone());
            self.plant_slot_release(&machine, &exec);
        }
    }

    /// Every retained event.
    pub(super) fn handle_retained(&mut self, ev: Ev) {
        match ev {
            Ev::Caller(m) => self.caller(m),
            Ev::CancelSlot(sj) => self.cancel_slot(sj),
            Ev::TermApply(h, key, id, op) => self.term_apply(h, key, id, *op),
            Ev::TermReply(h, key, id, r) => self.term_reply(h, &key, id, r),
            Ev::TermTimer(h, key, at) => self.term_timer(h, &key, at),
            Ev::TermWorker(h, key, req, r) => self.term_worker(h, &key, req, r),
            Ev::Attach(h, key) => self.attach(h, &key),
            Ev::RegTimer(h) => self.reg_timer(h),
            _ => {}
        }
    }

    /// Routes a retained controller event.
    pub(super) fn on_retained_event(&mut self, h: usize, ev: ControllerEvent) {
        match ev {
            ControllerEvent::Machine(d) => self.on_machine_done(h, *d),
            ControllerEvent::TerminalDue(rec) => self.terminal_due(h, *rec),
            _ => {}
        }
    }
}
