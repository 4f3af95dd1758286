//! The terminal run against a pure in-memory store built from the same
//! record functions every store adapter calls (`apply_exec`,
//! `claim_exec`, `slot::acquire`, `slot::finish_command`, `check_guard`).

use crate::Reason;
use std::collections::BTreeMap;

use super::*;
use crate::managed::claim::{self, Fence};
use crate::managed::controller::{Controller, ControllerConfig, Submit, WorkerEntry};
use crate::managed::patch::apply_exec;
use crate::managed::record::Assignment;
use crate::managed::slot;
use crate::managed::testkit::{fingerprint_key, key, machine_in};

const T0: u64 = 1_700_000_000_000;
const OWNER: &str = "ctl-term";
const TTL: u64 = 3_000;

#[derive(Default)]
struct Fake {
    execs: BTreeMap<RecordKey, ExecutionRecord>,
    machines: BTreeMap<RecordKey, MachineRecord>,
    leases: BTreeMap<String, Lease>,
    log: Vec<&'static str>,
    /// Fail the next op of this name with this error.
    fail: Option<(&'static str, Error)>,
}

fn nf() -> Error {
    Error::not_found(
        Operation::StoreWrite,
        Evidence::NotDispatched,
        Reason::Unspecified,
    )
}

impl Fake {
    fn with_machine() -> (Self, RecordKey) {
        let mut f = Self::default();
        let mut m = machine_in(MachineRecordState::Running, key("s", "machine-1"), T0).unwrap();
        m.assignment = Some(Assignment {
            worker_id: "dev".into(),
            worker_generation: 1,
            machine_name: "m1".into(),
        });
        m.validate().unwrap();
        f.leases.insert(
            "dev".into(),
            Lease {
                owner: OWNER.into(),
                generation: 1,
                until_ms: T0,
            },
        );
        let k = m.key.clone();
        f.machines.insert(k.clone(), m);
        (f, k)
    }

    fn apply(&mut self, op: &TermStoreOp) -> TermStoreResult {
        self.log.push(op.name());
        if let Some((name, e)) = self.fail
            && name == op.name()
        {
            self.fail = None;
            return Err(e);
        }
        match op {
            TermStoreOp::FetchMachine { key } => self
                .machines
                .get(key)
                .cloned()
                .map(|m| TermStoreReply::Machine(Box::new(m)))
                .ok_or_else(nf),
            TermStoreOp::Submit { record, .. } => {
                let m_key = record.spec.machine.clone().unwrap();
                if let Some(e) = self.execs.get(&record.key) {
                    return if e.fingerprint == record.fingerprint {
                        Ok(TermStoreReply::Submitted {
                            record: Box::new(e.clone()),
                            machine: self.machines.get(&m_key).cloned().map(Box::new),
                            existing: true,
                        })
                    } else {
                        Err(Error::identity_conflict(
                            Operation::StoreAccept,
                            Evidence::NotDispatched,
                            Reason::Unspecified,
                        ))
                    };
                }
                let m = self.machines.get(&m_key).ok_or_else(nf)?;
                let held = slot::acquire(m, record, record.accepted_at_ms.max(m.updated_at_ms))?;
                self.machines.insert(m_key, held.clone());
                self.execs.insert(record.key.clone(), (**record).clone());
                Ok(TermStoreReply::Submitted {
                    record: record.clone(),
                    machine: Some(Box::new(held)),
                    existing: false,
                })
            }
            TermStoreOp::Fetch { key } => self
                .execs
                .get(key)
                .cloned()
                .map(|r| TermStoreReply::Record(Box::new(r)))
                .ok_or_else(nf),
            TermStoreOp::Claim {
                key,
                owner,
                now_ms,
                ttl_ms,
            } => {
                let r = self.execs.get(key).ok_or_else(nf)?;
                let next = claim::claim_exec(r, owner, *now_ms, *ttl_ms)?;
                self.execs.insert(key.clone(), next.clone());
                Ok(TermStoreReply::Record(Box::new(next)))
            }
            TermStoreOp::Write {
                key,
                guard,
                patch,
                now_ms,
            } => {
                let r = self.execs.get(key).ok_or_else(nf)?;
                claim::check_guard(
                    Fence::of_exec(r),
                    guard,
                    None,
                    *now_ms,
                    Operation::StoreWrite,
                )?;
                let next = apply_exec(r, patch, *now_ms)?;
                self.execs.insert(key.clone(), next.clone());
                Ok(TermStoreReply::Record(Box::new(next)))
            }
            TermStoreOp::Cancel { key, now_ms } => {
                let r = self.execs.get_mut(key).ok_or_else(nf)?;
                if !r.state.is_terminal() {
                    let now = (*now_ms).max(r.updated_at_ms);
                    r.cancel_requested_at_ms.get_or_insert(now);
                    r.version += 1;
                    r.updated_at_ms = now;
                }
                Ok(TermStoreReply::Record(Box::new(r.clone())))
            }
            TermStoreOp::ClaimWorker {
                worker_id,
                owner,
                now_ms,
                ttl_ms,
            } => {
                let l = claim::take(self.leases.get(worker_id), owner, *now_ms, *ttl_ms)?;
                self.leases.insert(worker_id.clone(), l.clone());
                Ok(TermStoreReply::Lease(l))
            }
            TermStoreOp::ClaimMachine {
                key,
                owner,
                now_ms,
                ttl_ms,
            } => {
                let m = self.machines.get(key).ok_or_else(nf)?;
                let next = claim::claim_machine(m, owner, *now_ms, *ttl_ms)?;
                self.machines.insert(key.clone(), next.clone());
                Ok(TermStoreReply::Machine(Box::new(next)))
            }
            TermStoreOp::ClaimMachineVersion {
                key,
                owner,
                version,
                now_ms,
                ttl_ms,
            } => {
                let m = self.machines.get(key).ok_or_else(nf)?;
                let lease = m
                    .assignment
                    .as_ref()
                    .and_then(|a| self.leases.get(&a.worker_id));
                let next =
                    claim::claim_machine_version(m, owner, *version, lease, *now_ms, *ttl_ms)?;
                self.machines.insert(key.clone(), next.clone());
                Ok(TermStoreReply::Machine(Box::new(next)))
            }
            TermStoreOp::FinishCommand {
                machine,
                guard,
                exec,
                now_ms,
            } => {
                let m = self.machines.get(machine).ok_or_else(nf)?;
                let lease = m
                    .assignment
                    .as_ref()
                    .and_then(|a| self.leases.get(&a.worker_id));
                claim::check_guard(
                    Fence::of_machine(m),
                    guard,
                    lease,
                    *now_ms,
                    Operation::StoreSlot,
                )?;
                let e = self.execs.get(exec).ok_or_else(nf)?;
                let (m2, e2, finish) = slot::finish_command(m, e, *now_ms)?;
                self.machines.insert(machine.clone(), m2.clone());
                self.execs.insert(exec.clone(), e2.clone());
                Ok(TermStoreReply::Finished {
                    machine: Box::new(m2),
                    record: Box::new(e2),
                    finish,
                })
            }
            TermStoreOp::ReleaseClaim {
                claimed,
                owner,
                generation,
                now_ms,
            } => match claimed {
                Claimed::Execution(k) => {
                    let r = self.execs.get(k).ok_or_else(nf)?;
                    let next = match claim::release_exec(r, owner, *generation, *now_ms)? {
                        claim::Release::Ended(n) => n,
                        claim::Release::Lapsed => r.clone(),
                    };
                    self.execs.insert(k.clone(), next.clone());
                    Ok(TermStoreReply::Record(Box::new(next)))
                }
                Claimed::Machine(k) => {
                    let m = self.machines.get(k).ok_or_else(nf)?;
                    let next = match claim::release_machine(m, owner, *generation, *now_ms)? {
                        claim::Release::Ended(n) => n,
                        claim::Release::Lapsed => m.clone(),
                    };
                    self.machines.insert(k.clone(), next.clone());
                    Ok(TermStoreReply::Machine(Box::new(next)))
                }
                Claimed::Worker(_) => Err(nf()),
            },
        }
    }
}

/// A run, its store and a virtual clock.
struct Sim {
    fake: Fake,
    machine: RecordKey,
    now: Instant,
    now_ms: u64,
    /// Non-store outputs, in order.
    seen: Vec<TermOutput>,
    /// The answer to an image preflight ([`TermOutput::Inspect`]).
    inspect: Result<(), Error>,
}

fn cfg() -> TermConfig {
    TermConfig {
        owner: OWNER.into(),
        lease_ttl_ms: TTL,
        poll_interval_ms: 100,
        max_pending: 16,
    }
}

impl Sim {
    #[allow(clippy::disallowed_methods)] // an arbitrary origin; time is virtual after
    fn new() -> Self {
        let (fake, machine) = Fake::with_machine();
        Self {
            fake,
            machine,
            now: Instant::now(),
            now_ms: T0 + 10,
            seen: Vec::new(),
            inspect: Ok(()),
        }
    }

    fn open(&mut self, id: &str, spec: ManagedTerminalSpec) -> TerminalRun {
        let mut run = TerminalRun::open(
            cfg(),
            fingerprint_key(),
            key("s", id),
            self.machine.clone(),
            spec,
            true,
        )
        .unwrap();
        self.settle(&mut run);
        run
    }

    /// Performs store ops until none is left (at most `limit`).
    fn settle_at_most(&mut self, run: &mut TerminalRun, mut limit: usize) {
        while let Some(o) = run.poll_output() {
            match o {
                TermOutput::Store(id, op) if limit > 0 => {
                    limit -= 1;
                    let r = self.fake.apply(&op);
                    run.handle_stored(self.now, self.now_ms, id, r);
                }
                TermOutput::Store(id, op) => {
                    // Put it back: the test performs it later.
                    self.seen.push(TermOutput::Store(id, op));
                    return;
                }
                inspect @ TermOutput::Inspect { .. } => {
                    self.seen.push(inspect);
                    run.handle_inspected(self.now, self.now_ms, self.inspect);
                }
                other => self.seen.push(other),
            }
        }
    }

    fn settle(&mut self, run: &mut TerminalRun) {
        self.settle_at_most(run, usize::MAX);
    }

    fn advance(&mut self, ms: u64) {
        self.now += Duration::from_millis(ms);
        self.now_ms += ms;
    }

    fn exec(&self, id: &str) -> &ExecutionRecord {
        &self.fake.execs[&key("s", id)]
    }

    fn machine(&self) -> &MachineRecord {
        &self.fake.machines[&self.machine]
    }

    fn opens(&self) -> usize {
        self.seen
            .iter()
            .filter(|o| matches!(o, TermOutput::Open { .. }))
            .count()
    }

    fn events(&self) -> Vec<&TermEvent> {
        self.seen
            .iter()
            .filter_map(|o| match o {
                TermOutput::Event(e) => Some(e),
                _ => None,
            })
            .collect()
    }
}

fn exit(code: i32) -> Result<TerminalExit, Error> {
    Ok(TerminalExit { code })
}

#[test]
fn open_accepts_durably_then_dispatches_before_the_upgrade_then_completes() {
    let mut sim = Sim::new();
    let mut run = sim.open("t1", ManagedTerminalSpec::default());
    // Acceptance comes first, then the intent, then the upgrade.
    let first = sim.events()[0].clone();
    assert!(matches!(
        first,
        TermEvent::Accepted {
            existing: false,
            ..
        }
    ));
    let writes: Vec<_> = sim.fake.log.clone();
    assert_eq!(
        writes,
        [
            "fetch_machine",
            "submit",
            "write",
            "write",
            "claim",
            "write"
        ],
        "preparing, ready, the claim refreshed, dispatching before the Open"
    );
    assert_eq!(sim.opens(), 1);
    let rec = sim.exec("t1").clone();
    assert_eq!(
        (rec.state, rec.evidence),
        (ExecState::Dispatching, RecordEvidence::DispatchUncertain)
    );
    assert_eq!(sim.machine().active_execution, Some(rec.key.clone()));
    let Some(TermOutput::Open {
        worker_id,
        machine,
        spec,
    }) = sim
        .seen
        .iter()
        .find(|o| matches!(o, TermOutput::Open { .. }))
    else {
        unreachable!()
    };
    assert_eq!((worker_id.as_str(), machine.as_str()), ("dev", "m1"));
    assert_eq!(spec.session_budget, Duration::from_millis(30_000));
    assert_eq!(spec.program, "/bin/sh");

    run.handle_opened(sim.now, sim.now_ms, Ok(()));
    sim.settle(&mut run);
    assert_eq!(sim.exec("t1").state, ExecState::Running);
    sim.advance(50);
    run.handle_closed(sim.now, sim.now_ms, &exit(7));
    sim.settle(&mut run);
    let rec = sim.exec("t1");
    assert_eq!(
        (rec.state, rec.evidence, rec.result.clone()),
        (
            ExecState::Completed,
            RecordEvidence::Exited,
            Some(ExecResult::Terminal { exit_code: 7 })
        )
    );
    assert_eq!(rec.cleanup, crate::managed::Cleanup::Complete);
    assert_eq!(sim.machine().active_execution, None, "slot released");
    assert_eq!(sim.machine().state, MachineRecordState::Running);
    assert!(run.is_done());
    assert!(matches!(
        sim.events().last(),
        Some(TermEvent::Done { error: None, .. })
    ));
    assert_eq!(sim.opens(), 1);
}

/// C15 (found by the recovery simulation, retained run, seed 2): the
/// dispatch intent is committed right after the run's own claim, never
/// under a claim taken earlier (at acceptance), also when resumed.
#[test]
fn the_claim_is_refreshed_immediately_before_the_dispatch_intent() {
    for resumed in [false, true] {
        let mut sim = Sim::new();
        let mut run = TerminalRun::open(
            cfg(),
            fingerprint_key(),
            key("s", "t1"),
            sim.machine.clone(),
            ManagedTerminalSpec::default(),
            true,
        )
        .unwrap();
        if resumed {
            sim.settle_at_most(&mut run, 4); // fetch, submit, preparing, ready
            drop(run);
            sim.fake.log.clear();
            let rec = sim.exec("t1").clone();
            let _run = resume(&mut sim, rec);
        } else {
            sim.settle(&mut run);
        }
        let log = &sim.fake.log;
        let intent = log
            .iter()
            .rposition(|op| *op == "write")
            .unwrap_or_else(|| unreachable!("no write: {log:?}"));
        assert_eq!(sim.exec("t1").state, ExecState::Dispatching);
        assert!(
            intent > 0 && log[intent - 1] == "claim",
            "resumed {resumed}: the op before the intent is a claim: {log:?}"
        );
        assert_eq!(sim.opens(), 1);
    }
}

/// Found by the recovery simulation (retained run, seed 7): while a store
/// op is outstanding (here the claim renewal of a live session), the run's
/// timeout was the renewal time already past, and `handle_timeout` did
/// nothing — a driver that waits for store answers asynchronously spun.
#[test]
fn no_timeout_in_the_past_while_a_store_op_is_outstanding() {
    let mut sim = Sim::new();
    let mut run = sim.open("t1", ManagedTerminalSpec::default());
    run.handle_opened(sim.now, sim.now_ms, Ok(()));
    sim.settle(&mut run);
    assert_eq!(sim.exec("t1").state, ExecState::Running);
    sim.advance(TTL / 3 + 1);
    run.handle_timeout(sim.now, sim.now_ms);
    // The renewal is emitted; the test holds its answer back.
    sim.settle_at_most(&mut run, 0);
    assert!(
        matches!(sim.seen.last(), Some(TermOutput::Store(_, op)) if op.name() == "claim"),
        "a renewal is outstanding"
    );
    for _ in 0..3 {
        assert!(
            run.poll_timeout().is_none_or(|t| t > sim.now),
            "poll_timeout {:?} is not after now while the renewal is outstanding",
            run.poll_timeout()
        );
        run.handle_timeout(sim.now, sim.now_ms);
        assert!(run.poll_output().is_none(), "nothing new to do");
    }
}

/// Found by the recovery simulation (retained run, seed 5; fixed the same
/// way on branch `cli`, whose wait of up to two TTLs this exercises):
/// another controller held the machine's claim for longer than five poll
/// intervals; the completed terminal gave its slot finish up and the slot
/// stayed held for good (nothing else finishes a settled, not due record).
/// It now waits for that claim to lapse, then finishes the slot.
#[test]
fn a_settled_terminal_waits_out_another_machine_claim_then_frees_the_slot() {
    let mut sim = Sim::new();
    let mut run = sim.open("t1", ManagedTerminalSpec::default());
    run.handle_opened(sim.now, sim.now_ms, Ok(()));
    sim.settle(&mut run);
    // Another controller claims the machine (and keeps renewing it).
    let other = |sim: &mut Sim| {
        let m = sim.machine().clone();
        let c = claim::claim_machine(&m, "ctl-other", sim.now_ms, TTL).unwrap();
        sim.fake.machines.insert(c.key.clone(), c);
    };
    other(&mut sim);
    run.handle_closed(sim.now, sim.now_ms, &exit(0));
    sim.settle(&mut run);
    assert_eq!(sim.exec("t1").state, ExecState::Completed);
    for _ in 0..10 {
        sim.advance(TTL / 6);
        other(&mut sim);
        run.handle_timeout(sim.now, sim.now_ms);
        sim.settle(&mut run);
        assert!(
            !run.is_done(),
            "gave the slot finish up while the claim is held"
        );
    }
    // The other controller stops renewing: its claim lapses within a TTL.
    sim.advance(TTL + 1);
    for _ in 0..4 {
        run.handle_timeout(sim.now, sim.now_ms);
        sim.settle(&mut run);
        sim.advance(TTL / 6);
    }
    assert!(run.is_done());
    assert_eq!(sim.machine().active_execution, None, "slot released");
}

#[test]
fn the_claim_is_renewed_while_observing_and_the_session_deadline_never_resets() {
    let mut sim = Sim::new();
    let mut run = sim.open("t1", ManagedTerminalSpec::default());
    run.handle_opened(sim.now, sim.now_ms, Ok(()));
    sim.settle(&mut run);
    let deadline = sim.exec("t1").deadlines.execution_ms;
    assert!(deadline.is_some());
    let before = sim.fake.log.iter().filter(|n| **n == "claim").count();
    for _ in 0..5 {
        let at = run.poll_timeout().unwrap();
        assert_eq!(at - sim.now, Duration::from_millis(TTL / 3));
        sim.advance(TTL / 3);
        run.handle_timeout(sim.now, sim.now_ms);
        sim.settle(&mut run);
    }
    let after = sim.fake.log.iter().filter(|n| **n == "claim").count();
    assert_eq!(after - before, 5, "one renewal per third of the TTL");
    let rec = sim.exec("t1");
    assert!(rec.claim.as_ref().unwrap().until_ms > sim.now_ms);
    assert_eq!(
        rec.deadlines.execution_ms, deadline,
        "set once at the intent"
    );
    assert_eq!(sim.opens(), 1);
}

#[test]
fn the_live_budget_counts_from_the_durable_intent() {
    let mut sim = Sim::new();
    let run = sim.open("t1", ManagedTerminalSpec::default());
    let rec = sim.exec("t1").clone();
    let intent = rec.deadlines.execution_ms.unwrap() - rec.spec.profile.budgets.execution_ms;
    let spec = run.live_spec(&rec, intent + 10_000).unwrap();
    assert_eq!(spec.session_budget, Duration::from_millis(20_000));
    // With less than the smallest session budget left, nothing is opened.
    let e = run.live_spec(&rec, intent + 29_001).unwrap_err();
    assert_eq!(
        (e.category(), e.evidence()),
        (Category::Expired, Evidence::NotDispatched)
    );
}

#[test]
fn cancel_before_dispatch_prevents_opening() {
    let mut sim = Sim::new();
    let mut run = TerminalRun::open(
        cfg(),
        fingerprint_key(),
        key("s", "t1"),
        sim.machine.clone(),
        ManagedTerminalSpec::default(),
        true,
    )
    .unwrap();
    // fetch_machine + submit only: the record is accepted.
    sim.settle_at_most(&mut run, 2);
    assert_eq!(sim.exec("t1").state, ExecState::Accepted);
    run.cancel(sim.now, sim.now_ms);
    // The pending `preparing` write runs first, then the cancel.
    if let Some(TermOutput::Store(id, op)) = sim.seen.pop() {
        let r = sim.fake.apply(&op);
        run.handle_stored(sim.now, sim.now_ms, id, r);
    }
    sim.settle(&mut run);
    let rec = sim.exec("t1");
    assert_eq!(
        (rec.state, rec.evidence),
        (ExecState::Cancelled, RecordEvidence::NotDispatched)
    );
    assert_eq!(sim.opens(), 0, "nothing opened");
    assert_eq!(sim.machine().active_execution, None);
    assert!(run.is_done());
}

#[test]
fn cancel_after_dispatch_closes_observation_and_keeps_uncertainty() {
    let mut sim = Sim::new();
    let mut run = sim.open("t1", ManagedTerminalSpec::default());
    run.handle_opened(sim.now, sim.now_ms, Ok(()));
    sim.settle(&mut run);
    run.cancel(sim.now, sim.now_ms);
    sim.settle(&mut run);
    assert_eq!(sim.exec("t1").state, ExecState::Cancelling);
    assert!(sim.seen.iter().any(|o| matches!(o, TermOutput::Close)));
    // The close ends the session without an exit: uncertain.
    let closed = Err(Error::transport(
        Operation::TerminalSession,
        Evidence::Unknown,
        Reason::Unspecified,
    ));
    run.handle_closed(sim.now, sim.now_ms, &closed);
    sim.settle(&mut run);
    let rec = sim.exec("t1");
    assert_eq!((rec.state, rec.result.clone()), (ExecState::Unknown, None));
    assert_eq!(
        sim.machine().active_execution,
        Some(rec.key.clone()),
        "slot kept"
    );
    assert_eq!(sim.machine().state, MachineRecordState::Unknown);
}

#[test]
fn an_exit_that_beats_the_cancel_still_wins() {
    let mut sim = Sim::new();
    let mut run = sim.open("t1", ManagedTerminalSpec::default());
    run.handle_opened(sim.now, sim.now_ms, Ok(()));
    sim.settle(&mut run);
    run.cancel(sim.now, sim.now_ms);
    sim.settle(&mut run);
    run.handle_closed(sim.now, sim.now_ms, &exit(0));
    sim.settle(&mut run);
    assert_eq!(sim.exec("t1").state, ExecState::Completed);
    assert_eq!(sim.machine().active_execution, None);
}

#[test]
fn sentinel_exit_codes_and_output_limit_stay_unknown_and_keep_the_slot() {
    for outcome in [
        exit(124),
        exit(130),
        Err(Error::output_limit(
            Operation::TerminalOutput,
            Evidence::Unknown,
            Reason::Unspecified,
        )),
    ] {
        let mut sim = Sim::new();
        let mut run = sim.open("t1", ManagedTerminalSpec::default());
        run.handle_opened(sim.now, sim.now_ms, Ok(()));
        run.handle_closed(sim.now, sim.now_ms, &outcome);
        sim.settle(&mut run);
        let rec = sim.exec("t1");
        assert_eq!(
            (rec.state, rec.result.clone()),
            (ExecState::Unknown, None),
            "{outcome:?}"
        );
        assert_eq!(sim.machine().active_execution, Some(rec.key.clone()));
    }
}

#[test]
fn duplicates_keep_one_identity_and_never_open_a_second_shell() {
    let mut sim = Sim::new();
    let mut run = sim.open("t1", ManagedTerminalSpec::default());
    run.handle_opened(sim.now, sim.now_ms, Ok(()));
    sim.settle(&mut run);
    // Same spec while active: the same identity, nothing opened.
    sim.seen.clear();
    let dup = sim.open("t1", ManagedTerminalSpec::default());
    assert!(
        matches!(sim.events()[0], TermEvent::Accepted { existing: true, record } if record.key == key("s", "t1"))
    );
    assert!(dup.is_done());
    assert_eq!(sim.opens(), 0);
    // A changed spec conflicts.
    sim.seen.clear();
    let changed = ManagedTerminalSpec {
        cols: 100,
        ..ManagedTerminalSpec::default()
    };
    let _ = sim.open("t1", changed);
    assert!(
        matches!(sim.events()[0], TermEvent::Refused(e) if e.category() == Category::IdentityConflict)
    );
    assert_eq!(sim.opens(), 0);
    // Completed: still the same identity.
    run.handle_closed(sim.now, sim.now_ms, &exit(3));
    sim.settle(&mut run);
    sim.seen.clear();
    let _ = sim.open("t1", ManagedTerminalSpec::default());
    assert!(
        matches!(sim.events()[0], TermEvent::Accepted { existing: true, record } if record.state == ExecState::Completed)
    );
    assert_eq!(sim.opens(), 0);
}

#[test]
fn a_second_terminal_while_the_slot_is_held_is_admission_exhausted() {
    let mut sim = Sim::new();
    let _run = sim.open("t1", ManagedTerminalSpec::default());
    sim.seen.clear();
    let _ = sim.open("t2", ManagedTerminalSpec::default());
    assert!(
        matches!(sim.events()[0], TermEvent::Refused(e) if e.category() == Category::AdmissionExhausted)
    );
    assert_eq!(sim.opens(), 0);
    assert!(!sim.fake.execs.contains_key(&key("s", "t2")));
}

fn resume(sim: &mut Sim, rec: ExecutionRecord) -> TerminalRun {
    let mut run = TerminalRun::resume(cfg(), fingerprint_key(), rec, sim.now, sim.now_ms).unwrap();
    sim.settle(&mut run);
    run
}

#[test]
fn recovery_marks_a_possibly_dispatched_session_unknown_and_never_reopens() {
    for opened in [false, true] {
        let mut sim = Sim::new();
        let mut run = sim.open("t1", ManagedTerminalSpec::default());
        if opened {
            run.handle_opened(sim.now, sim.now_ms, Ok(()));
            sim.settle(&mut run);
        }
        drop(run); // the controller died
        sim.seen.clear();
        sim.advance(TTL + 1); // its claim lapsed
        let rec = sim.exec("t1").clone();
        let run = resume(&mut sim, rec);
        assert!(run.is_done());
        let rec = sim.exec("t1");
        assert_eq!(rec.state, ExecState::Unknown);
        assert_eq!(
            rec.last_error.as_ref().map(|e| e.reason.as_str()),
            Some("terminal_recovered")
        );
        assert_eq!(sim.opens(), 0, "never reopened");
        assert_eq!(sim.machine().active_execution, Some(rec.key.clone()));
        assert_eq!(sim.machine().state, MachineRecordState::Unknown);
    }
}

#[test]
fn recovery_keeps_a_recorded_exit_and_finishes_the_slot() {
    let mut sim = Sim::new();
    let mut run = sim.open("t1", ManagedTerminalSpec::default());
    run.handle_opened(sim.now, sim.now_ms, Ok(()));
    run.handle_closed(sim.now, sim.now_ms, &exit(7));
    // Only the `collecting` write lands; the controller dies after it.
    sim.settle_at_most(&mut run, 2);
    assert_eq!(sim.exec("t1").state, ExecState::Collecting);
    drop(run);
    sim.seen.clear();
    sim.advance(TTL + 1);
    let rec = sim.exec("t1").clone();
    let _ = resume(&mut sim, rec);
    let rec = sim.exec("t1");
    assert_eq!(rec.state, ExecState::Completed);
    assert_eq!(rec.result, Some(ExecResult::Terminal { exit_code: 7 }));
    assert_eq!(sim.machine().active_execution, None);
    assert_eq!(sim.opens(), 0);
}

/// Another controller's live claim on the machine (a `smolbox` that
/// started it and ended), lasting `ms` from now.
fn claimed_by_another(sim: &mut Sim, ms: u64) {
    let m = sim.fake.machines[&sim.machine].clone();
    let claimed = claim::claim_machine(&m, "ctl-other", sim.now_ms, ms).unwrap();
    sim.fake.machines.insert(sim.machine.clone(), claimed);
}

#[test]
fn a_finished_terminal_waits_out_another_claim_on_its_machine_and_frees_the_slot() {
    let mut sim = Sim::new();
    let mut run = sim.open("t1", ManagedTerminalSpec::default());
    run.handle_opened(sim.now, sim.now_ms, Ok(()));
    // The other controller's claim lasts one TTL (the most it can).
    claimed_by_another(&mut sim, TTL);
    run.handle_closed(sim.now, sim.now_ms, &exit(7));
    sim.settle(&mut run);
    assert_eq!(sim.exec("t1").state, ExecState::Completed);
    assert!(!run.is_done(), "the run waits for the machine claim");
    assert!(sim.machine().active_execution.is_some());
    // Poll by poll until the other claim has ended, then the slot is freed.
    for _ in 0..(TTL / 100 + 2) {
        sim.advance(100);
        run.handle_timeout(sim.now, sim.now_ms);
        sim.settle(&mut run);
        if run.is_done() {
            break;
        }
    }
    assert!(run.is_done());
    assert_eq!(sim.machine().active_execution, None);
    assert!(matches!(
        sim.events().last(),
        Some(TermEvent::Done { error: None, .. })
    ));
}

#[test]
fn the_slot_is_finished_without_taking_a_lapsed_worker_lease() {
    // The worker lease lapsed under another controller (the `smolbox`
    // that created the machine). Taking it would move its generation past
    // the machine's assignment and fence the machine for good.
    let mut sim = Sim::new();
    sim.fake.leases.insert(
        "dev".into(),
        Lease {
            owner: "ctl-other".into(),
            generation: 1,
            until_ms: T0,
        },
    );
    let mut run = sim.open("t1", ManagedTerminalSpec::default());
    run.handle_opened(sim.now, sim.now_ms, Ok(()));
    run.handle_closed(sim.now, sim.now_ms, &exit(7));
    sim.settle(&mut run);
    assert!(run.is_done());
    assert_eq!(sim.machine().active_execution, None, "the slot is free");
    assert_eq!(
        sim.fake.leases["dev"].generation, 1,
        "the lease was not moved"
    );
    assert!(!sim.fake.log.contains(&"claim_worker"));
}

/// Recovery simulation, retained run, seed 184 (finding 6): the machine
/// was assigned under worker-lease generation 1; its controller ended and
/// the lease moved on (generation 2, lapsed since). Every finish is fenced
/// (`worker_generation`) until the lease holder re-fences the machine, so
/// the run takes the lease and re-fences it at the version it read
/// (`claim_machine_version`), as the machine task does, then frees the slot.
#[test]
fn a_finished_terminal_refences_a_machine_assigned_under_an_older_lease_and_frees_the_slot() {
    let mut sim = Sim::new();
    let mut run = sim.open("t1", ManagedTerminalSpec::default());
    run.handle_opened(sim.now, sim.now_ms, Ok(()));
    sim.fake.leases.insert(
        "dev".into(),
        Lease {
            owner: "ctl-other".into(),
            generation: 2,
            until_ms: sim.now_ms,
        },
    );
    let version = sim.machine().version;
    run.handle_closed(sim.now, sim.now_ms, &exit(7));
    sim.settle(&mut run);
    assert_eq!(sim.exec("t1").state, ExecState::Completed);
    assert!(run.is_done());
    assert!(
        matches!(
            sim.events().last(),
            Some(TermEvent::Done { error: None, .. })
        ),
        "{:?}",
        sim.events().last()
    );
    let m = sim.machine();
    assert_eq!(m.active_execution, None, "the slot is free");
    assert_eq!(m.state, MachineRecordState::Running);
    assert_eq!(sim.fake.leases["dev"].owner, OWNER);
    assert_eq!(
        m.assignment.as_ref().unwrap().worker_generation,
        sim.fake.leases["dev"].generation,
        "re-fenced to the lease it holds"
    );
    assert!(m.version > version, "the finish is a caller-visible write");
    let refence = sim
        .fake
        .log
        .iter()
        .position(|n| *n == "claim_machine_version");
    let finish = sim.fake.log.iter().rposition(|n| *n == "finish_command");
    assert!(refence.is_some() && refence < finish, "{:?}", sim.fake.log);
}

/// The same fenced finish while another controller holds the worker lease
/// live: nothing is written; once that lease lapses, the run takes it,
/// re-fences and frees the slot.
#[test]
fn a_fenced_finish_waits_for_another_live_worker_lease_then_frees_the_slot() {
    let mut sim = Sim::new();
    let mut run = sim.open("t1", ManagedTerminalSpec::default());
    run.handle_opened(sim.now, sim.now_ms, Ok(()));
    sim.fake.leases.insert(
        "dev".into(),
        Lease {
            owner: "ctl-other".into(),
            generation: 2,
            until_ms: sim.now_ms + TTL / 2,
        },
    );
    run.handle_closed(sim.now, sim.now_ms, &exit(7));
    sim.settle(&mut run);
    assert!(!run.is_done(), "waits for the worker lease");
    assert!(sim.machine().active_execution.is_some());
    for _ in 0..(TTL / 100 + 2) {
        sim.advance(100);
        run.handle_timeout(sim.now, sim.now_ms);
        sim.settle(&mut run);
        if run.is_done() {
            break;
        }
    }
    assert!(run.is_done());
    assert_eq!(sim.machine().active_execution, None);
    assert_eq!(sim.fake.leases["dev"].generation, 3);
    assert_eq!(
        sim.machine().assignment.as_ref().unwrap().worker_generation,
        3
    );
}

#[test]
fn a_machine_claim_held_past_two_ttls_is_given_up_and_the_slot_kept() {
    let mut sim = Sim::new();
    let mut run = sim.open("t1", ManagedTerminalSpec::default());
    run.handle_opened(sim.now, sim.now_ms, Ok(()));
    // A live controller renews its claim all along.
    claimed_by_another(&mut sim, 100 * TTL);
    run.handle_closed(sim.now, sim.now_ms, &exit(7));
    sim.settle(&mut run);
    let mut polls = 0;
    while !run.is_done() {
        polls += 1;
        assert!(polls < 10 * TTL / 100, "the run never gave up");
        sim.advance(100);
        run.handle_timeout(sim.now, sim.now_ms);
        sim.settle(&mut run);
    }
    // Two TTLs of polls (plus the bounded store retries), not fewer.
    assert!(polls >= 2 * TTL / 100, "gave up after {polls} polls");
    assert_eq!(sim.exec("t1").state, ExecState::Completed);
    assert!(sim.machine().active_execution.is_some(), "slot kept");
    assert!(matches!(
        sim.events().last(),
        Some(TermEvent::Done { error: Some(_), .. })
    ));
}

#[test]
fn recovery_finishes_the_slot_of_a_completed_record() {
    let mut sim = Sim::new();
    let mut run = sim.open("t1", ManagedTerminalSpec::default());
    run.handle_opened(sim.now, sim.now_ms, Ok(()));
    run.handle_closed(sim.now, sim.now_ms, &exit(7));
    sim.fake.fail = Some((
        "claim_machine",
        Error::store(
            Operation::StoreClaim,
            Evidence::Unknown,
            Reason::Unspecified,
        ),
    ));
    // Up to `completed`, then the first machine claim fails; the
    // controller dies before the retry.
    sim.settle(&mut run);
    assert_eq!(sim.exec("t1").state, ExecState::Completed);
    assert!(sim.machine().active_execution.is_some());
    drop(run);
    sim.seen.clear();
    sim.advance(TTL + 1);
    let rec = sim.exec("t1").clone();
    // The settled record is still due, so a due scan finds it and hands it
    // to a resumed run (recovery simulation, retained run, seed 892).
    assert!(
        rec.next_due_at_ms.is_some_and(|d| d <= sim.now_ms),
        "a completed terminal holding its slot must stay due"
    );
    let _ = resume(&mut sim, rec);
    let rec = sim.exec("t1");
    assert_eq!(rec.state, ExecState::Completed);
    assert_eq!(
        rec.next_due_at_ms, None,
        "finishing the slot ends the due time"
    );
    assert_eq!(sim.machine().active_execution, None);
    assert_eq!(sim.machine().state, MachineRecordState::Running);
}

#[test]
fn recovery_dispatches_a_provably_undispatched_intent_once() {
    let mut sim = Sim::new();
    let mut run = TerminalRun::open(
        cfg(),
        fingerprint_key(),
        key("s", "t1"),
        sim.machine.clone(),
        ManagedTerminalSpec::default(),
        true,
    )
    .unwrap();
    sim.settle_at_most(&mut run, 4); // fetch, submit, preparing, ready
    assert_eq!(sim.exec("t1").state, ExecState::Ready);
    drop(run);
    sim.seen.clear();
    sim.advance(TTL + 1);
    let rec = sim.exec("t1").clone();
    let run = resume(&mut sim, rec);
    assert_eq!(sim.opens(), 1);
    assert_eq!(sim.exec("t1").state, ExecState::Dispatching);
    assert!(!run.is_done());
}

#[test]
fn a_refused_upgrade_sent_nothing_and_fails() {
    let mut sim = Sim::new();
    let mut run = sim.open("t1", ManagedTerminalSpec::default());
    let e = Error::transport(
        Operation::TerminalOpen,
        Evidence::NotDispatched,
        Reason::Unspecified,
    );
    run.handle_opened(sim.now, sim.now_ms, Err(e));
    sim.settle(&mut run);
    let rec = sim.exec("t1");
    assert_eq!(
        (rec.state, rec.evidence),
        (ExecState::Failed, RecordEvidence::NotDispatched)
    );
}

/// C7.4: the worker machine is inspected before acceptance, with the
/// machine's assignment and the terminal's own spec; a machine that is not
/// a plain image machine refuses the terminal then: no record, the slot
/// untouched, nothing opened.
#[test]
fn a_terminal_on_a_machine_that_is_no_image_machine_is_refused_before_acceptance() {
    let mut sim = Sim::new();
    sim.inspect = Err(Error::unsupported_capability(
        Operation::TerminalOpen,
        Reason::NeedsPlainImageMachine,
    ));
    let run = sim.open("t1", ManagedTerminalSpec::default());
    assert!(run.is_done());
    let Some(TermOutput::Inspect {
        worker_id, machine, ..
    }) = sim.seen.first()
    else {
        panic!("no inspect first: {:?}", sim.seen);
    };
    let a = sim.machine().assignment.clone().unwrap();
    assert_eq!((worker_id, machine), (&a.worker_id, &a.machine_name));
    let refused = sim.events();
    assert!(
        matches!(refused[..], [TermEvent::Refused(e)] if e.reason() == Reason::NeedsPlainImageMachine
            && e.evidence() == Evidence::NotDispatched),
        "{refused:?}"
    );
    assert!(sim.fake.execs.is_empty(), "nothing accepted");
    assert_eq!(sim.machine().active_execution, None, "the slot untouched");
    assert_eq!(sim.opens(), 0);
    // An inspect that fails (the worker unreachable, the machine gone) is
    // the same refusal, never an uncertain record.
    let mut sim = Sim::new();
    sim.inspect = Err(Error::not_found(
        Operation::Get,
        Evidence::DispatchUncertain,
        Reason::MachineNotFound,
    ));
    let _ = sim.open("t1", ManagedTerminalSpec::default());
    assert!(matches!(sim.events()[..], [TermEvent::Refused(e)]
        if e.category() == Category::NotFound && e.evidence() == Evidence::NotDispatched));
    assert!(sim.fake.execs.is_empty());
}

#[test]
fn a_machine_without_creation_evidence_is_refused_before_acceptance() {
    let mut sim = Sim::new();
    let m = sim.fake.machines.get_mut(&sim.machine).unwrap();
    m.assignment = None;
    let _ = sim.open("t1", ManagedTerminalSpec::default());
    assert!(
        matches!(sim.events()[0], TermEvent::Refused(e) if e.reason() == Reason::MachineNotOwned)
    );
    assert!(sim.fake.execs.is_empty());
}

#[test]
fn disposable_submissions_reject_terminal_specs_before_acceptance() {
    #[allow(clippy::disallowed_methods)] // an arbitrary origin
    let now = Instant::now();
    let mut c = ControllerConfig::new(OWNER);
    c.workers = vec![WorkerEntry::new("dev")];
    let mut ctl = Controller::new(c, fingerprint_key(), now, T0).unwrap();
    while ctl.poll_store_op().is_some() {}
    let mut spec = crate::managed::testkit::exec_spec("x");
    spec.outputs.clear();
    spec.action = Action::Terminal(ManagedTerminalSpec::default());
    let e = ctl
        .submit(
            now,
            T0,
            Submit {
                key: key("s", "t1"),
                spec,
            },
        )
        .unwrap_err();
    assert_eq!(
        (e.category(), e.reason(), e.evidence()),
        (
            Category::Validation,
            Reason::TerminalNeedsRetainedMachine,
            Evidence::NotDispatched
        )
    );
    assert!(ctl.poll_store_op().is_none(), "nothing is stored");
}

#[test]
fn the_controller_hands_due_terminals_to_the_driver_and_never_drives_them() {
    use crate::managed::controller::{ControllerEvent, StoreOp, StoreReply};
    let mut sim = Sim::new();
    let mut run = sim.open("t1", ManagedTerminalSpec::default());
    run.handle_opened(sim.now, sim.now_ms, Ok(()));
    sim.settle(&mut run);
    let rec = sim.exec("t1").clone();
    assert!(rec.next_due_at_ms.is_some(), "a live terminal stays due");
    let mut c = ControllerConfig::new(OWNER);
    c.workers = vec![
        WorkerEntry::new("dev").with_profile(crate::worker::Profile::known(
            crate::worker::Version::V1_22_0,
        )),
    ];
    let mut ctl = Controller::new(c, fingerprint_key(), sim.now, sim.now_ms).unwrap();
    let mut scans = 0;
    let mut due_events = 0;
    for round in 0..2 {
        let now = sim.now + Duration::from_millis(300 * round);
        ctl.handle_timeout(now, sim.now_ms);
        while let Some((id, op)) = ctl.poll_store_op() {
            let reply = match op {
                StoreOp::Due { .. } => {
                    scans += 1;
                    StoreReply::Due {
                        records: vec![rec.clone()],
                        next: None,
                    }
                }
                StoreOp::DueMachines { .. } => StoreReply::DueMachines {
                    records: Vec::new(),
                    next: None,
                },
                other => panic!("the controller touched the terminal: {}", other.name()),
            };
            ctl.handle_stored(now, sim.now_ms, id, Ok(reply));
        }
        while let Some(e) = ctl.poll_event() {
            if let ControllerEvent::TerminalDue(r) = e {
                assert_eq!(r.key, rec.key);
                due_events += 1;
            }
        }
    }
    assert_eq!(scans, 2, "two due scans");
    assert_eq!(due_events, 1, "reported once per claim TTL");
    assert!(
        ctl.poll_worker_op().is_none(),
        "nothing sent for a terminal"
    );
}

// A due-scan row of a live run's key goes to that run (session 10).
mod due;
// What an error that ends a run says about the terminal (issue 15).
mod evidence;
mod intent;
mod release;
