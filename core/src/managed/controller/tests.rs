#![allow(clippy::unwrap_used)] // tests: a panic is the failure report

use crate::Reason;
use crate::{Category, Evidence};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::*;
use crate::exec::{Command, ExecOutcome, OutputEncoding};
use crate::managed::claim::{self, Fence, Lease};
use crate::managed::patch::{ExecPatch, apply_exec};
use crate::managed::state::Cleanup;
use crate::managed::testkit::fingerprint_key;

const T0: u64 = 1_700_000_000_000;
const OWNER: &str = "ctl-test-1";
const WORKER: &str = "w1";

/// A store stand-in over the same pure rules every adapter runs.
#[derive(Default)]
struct TestStore {
    records: BTreeMap<RecordKey, ExecutionRecord>,
    leases: BTreeMap<String, Lease>,
    /// The next this many ops fail with a `store` error.
    fail_next: u32,
    commits: u32,
    machines: BTreeMap<RecordKey, MachineRecord>,
}

impl TestStore {
    fn apply(&mut self, op: &StoreOp) -> StoreResult {
        if self.fail_next > 0 {
            self.fail_next -= 1;
            return Err(Error::store(
                Operation::StoreWrite,
                Evidence::Unknown,
                Reason::Unavailable,
            ));
        }
        let absent = || {
            Error::not_found(
                Operation::StoreFetch,
                Evidence::Unknown,
                Reason::Unspecified,
            )
        };
        match op {
            StoreOp::Accept { record, .. } | StoreOp::AcceptDispatching { record, .. } => {
                match self.records.get(&record.key) {
                    Some(r) if r.fingerprint == record.fingerprint => Ok(StoreReply::Accepted {
                        record: r.clone(),
                        existing: true,
                    }),
                    Some(_) => Err(Error::identity_conflict(
                        Operation::StoreAccept,
                        Evidence::NotDispatched,
                        Reason::Unspecified,
                    )),
                    None => {
                        let inserted = if matches!(op, StoreOp::AcceptDispatching { .. }) {
                            crate::managed::patch::intent_at_accept(record)?
                        } else {
                            (**record).clone()
                        };
                        self.commits += 1;
                        self.records.insert(record.key.clone(), inserted.clone());
                        Ok(StoreReply::Accepted {
                            record: inserted,
                            existing: false,
                        })
                    }
                }
            }
            StoreOp::Fetch { key } => self
                .records
                .get(key)
                .cloned()
                .map(StoreReply::Record)
                .ok_or_else(absent),
            StoreOp::Claim {
                key,
                owner,
                now_ms,
                ttl_ms,
            } => {
                let rec = self.records.get(key).ok_or_else(absent)?;
                let next = claim::claim_exec(rec, owner, *now_ms, *ttl_ms)?;
                self.commits += 1;
                self.records.insert(key.clone(), next.clone());
                Ok(StoreReply::Record(next))
            }
            StoreOp::ClaimVersion {
                key,
                owner,
                version,
                now_ms,
                ttl_ms,
            } => {
                let rec = self.records.get(key).ok_or_else(absent)?;
                let lease = rec
                    .assignment
                    .as_ref()
                    .and_then(|a| self.leases.get(&a.worker_id));
                let next =
                    claim::claim_exec_version(rec, owner, *version, lease, *now_ms, *ttl_ms)?;
                self.commits += 1;
                self.records.insert(key.clone(), next.clone());
                Ok(StoreReply::Record(next))
            }
            StoreOp::Write {
                key,
                guard,
                patch,
                now_ms,
            } => {
                let rec = self.records.get(key).ok_or_else(absent)?;
                let lease = rec
                    .assignment
                    .as_ref()
                    .and_then(|a| self.leases.get(&a.worker_id));
                claim::check_guard(
                    Fence::of_exec(rec),
                    guard,
                    lease,
                    *now_ms,
                    Operation::StoreWrite,
                )?;
                let next = apply_exec(rec, patch, *now_ms)?;
                self.commits += 1;
                self.records.insert(key.clone(), next.clone());
                Ok(StoreReply::Record(next))
            }
            StoreOp::WriteSteps {
                key,
                guard,
                patches,
                now_ms,
            } => {
                let rec = self.records.get(key).ok_or_else(absent)?;
                let lease = rec
                    .assignment
                    .as_ref()
                    .and_then(|a| self.leases.get(&a.worker_id));
                claim::check_guard(
                    Fence::of_exec(rec),
                    guard,
                    lease,
                    *now_ms,
                    Operation::StoreWrite,
                )?;
                let next = crate::managed::patch::apply_exec_steps(rec, patches, *now_ms)?;
                self.commits += 1;
                self.records.insert(key.clone(), next.clone());
                Ok(StoreReply::Record(next))
            }
            StoreOp::Cancel { key, now_ms } => {
                let rec = self.records.get(key).ok_or_else(absent)?.clone();
                if rec.state.is_terminal() {
                    return Ok(StoreReply::Record(rec));
                }
                let now = (*now_ms).max(rec.updated_at_ms);
                let mut next = rec;
                next.cancel_requested_at_ms.get_or_insert(now);
                next.next_due_at_ms = Some(now);
                next.version += 1;
                next.updated_at_ms = now;
                self.commits += 1;
                self.records.insert(key.clone(), next.clone());
                Ok(StoreReply::Record(next))
            }
            StoreOp::Due {
                now_ms,
                after,
                limit,
            } => {
                let mut due: Vec<_> = self
                    .records
                    .values()
                    .filter(|r| r.next_due_at_ms.is_some_and(|d| d <= *now_ms))
                    .filter(|r| {
                        after.as_ref().is_none_or(|a| {
                            (r.next_due_at_ms.unwrap_or(0), &r.key) > (a.due_at_ms, &a.key)
                        })
                    })
                    .cloned()
                    .collect();
                due.sort_by(|a, b| (a.next_due_at_ms, &a.key).cmp(&(b.next_due_at_ms, &b.key)));
                due.truncate(*limit as usize);
                let next = (due.len() == *limit as usize).then(|| {
                    let last = &due[due.len() - 1];
                    DueAfter {
                        due_at_ms: last.next_due_at_ms.unwrap_or(0),
                        key: last.key.clone(),
                    }
                });
                Ok(StoreReply::Due { records: due, next })
            }
            StoreOp::ClaimWorker {
                worker_id,
                owner,
                now_ms,
                ttl_ms,
            } => {
                let next = claim::take(self.leases.get(worker_id), owner, *now_ms, *ttl_ms)?;
                self.commits += 1;
                self.leases.insert(worker_id.clone(), next.clone());
                Ok(StoreReply::Lease(next))
            }
            StoreOp::Reserve {
                key,
                guard,
                reservation,
                now_ms,
            } => {
                let lease = self
                    .leases
                    .get(&reservation.worker_id)
                    .filter(|l| l.owner == guard.owner && l.until_ms > *now_ms)
                    .cloned()
                    .ok_or_else(|| {
                        Error::stale_claim(
                            Operation::StoreReserve,
                            Evidence::NotDispatched,
                            Reason::WorkerLease,
                        )
                    })?;
                let rec = self.records.get(key).ok_or_else(absent)?;
                claim::check_guard(
                    Fence::of_exec(rec),
                    guard,
                    None,
                    *now_ms,
                    Operation::StoreReserve,
                )?;
                let mut next = rec.clone();
                next.assignment = Some(crate::managed::record::Assignment {
                    worker_id: reservation.worker_id.clone(),
                    worker_generation: lease.generation,
                    machine_name: reservation.machine_name.clone(),
                });
                next.reservation = Some(reservation.capacity);
                next.version += 1;
                next.updated_at_ms = *now_ms;
                next.validate()?;
                self.commits += 1;
                self.records.insert(key.clone(), next.clone());
                Ok(StoreReply::Record(next))
            }
            StoreOp::Release { key, guard, now_ms } => {
                let rec = self.records.get(key).ok_or_else(absent)?;
                let lease = rec
                    .assignment
                    .as_ref()
                    .and_then(|a| self.leases.get(&a.worker_id));
                claim::check_guard(
                    Fence::of_exec(rec),
                    guard,
                    lease,
                    *now_ms,
                    Operation::StoreRelease,
                )?;
                if rec.cleanup != Cleanup::Complete
                    || (rec.assignment.is_some() && rec.absence_at_ms.is_none())
                {
                    return Err(Error::validation(
                        Operation::StoreRelease,
                        Reason::ReleaseBeforeAbsence,
                    ));
                }
                let mut next = rec.clone();
                next.reservation = None;
                next.version += 1;
                next.updated_at_ms = *now_ms;
                self.commits += 1;
                self.records.insert(key.clone(), next.clone());
                Ok(StoreReply::Record(next))
            }
            StoreOp::ReleaseClaim {
                claimed,
                owner,
                generation,
                now_ms,
            } => {
                use crate::managed::claim::Release;
                match claimed {
                    Claimed::Execution(key) => {
                        let rec = self.records.get(key).ok_or_else(absent)?;
                        match claim::release_exec(rec, owner, *generation, *now_ms)? {
                            Release::Ended(next) => {
                                self.commits += 1;
                                self.records.insert(key.clone(), next.clone());
                                Ok(StoreReply::Record(next))
                            }
                            Release::Lapsed => Ok(StoreReply::Record(rec.clone())),
                        }
                    }
                    Claimed::Machine(key) => {
                        let m = self.machines.get(key).ok_or_else(absent)?;
                        match claim::release_machine(m, owner, *generation, *now_ms)? {
                            Release::Ended(next) => {
                                self.commits += 1;
                                self.machines.insert(key.clone(), next.clone());
                                Ok(StoreReply::Machine(next))
                            }
                            Release::Lapsed => Ok(StoreReply::Machine(m.clone())),
                        }
                    }
                    Claimed::Worker(w) => {
                        let l = self.leases.get(w).ok_or_else(absent)?;
                        match claim::release_lease(Some(l), owner, *generation, *now_ms)? {
                            Release::Ended(next) => {
                                self.commits += 1;
                                self.leases.insert(w.clone(), next.clone());
                                Ok(StoreReply::Lease(next))
                            }
                            Release::Lapsed => Ok(StoreReply::Lease(l.clone())),
                        }
                    }
                }
            }
            other => self.apply_machine_op(other),
        }
    }
}

/// The controller, the store stand-in, a virtual clock and the worker ops
/// the test has not answered yet.
struct Sim {
    ctl: Controller,
    store: TestStore,
    now: Instant,
    now_ms: u64,
    worker: Vec<(OpId, WorkerOp)>,
    events: Vec<ControllerEvent>,
    store_log: Vec<StoreOp>,
}

fn config() -> ControllerConfig {
    let mut c = ControllerConfig::new(OWNER);
    c.workers = vec![WorkerEntry::new(WORKER)];
    c.lease_ttl_ms = 1_000;
    c.poll_interval_ms = 100;
    c
}

impl Sim {
    #[allow(clippy::disallowed_methods)] // an arbitrary origin; time is virtual after
    fn new(cfg: ControllerConfig) -> Self {
        let now = Instant::now();
        Self {
            ctl: Controller::new(cfg, fingerprint_key(), now, T0).unwrap(),
            store: TestStore::default(),
            now,
            now_ms: T0,
            worker: Vec::new(),
            events: Vec::new(),
            store_log: Vec::new(),
        }
    }

    /// Performs every store op (in order) until none is left; collects
    /// worker ops and events.
    fn settle(&mut self) {
        loop {
            while let Some((id, op)) = self.ctl.poll_worker_op() {
                self.worker.push((id, op));
            }
            while let Some(e) = self.ctl.poll_event() {
                self.events.push(e);
            }
            let Some((id, op)) = self.ctl.poll_store_op() else {
                break;
            };
            let r = self.store.apply(&op);
            self.store_log.push(op);
            self.ctl.handle_stored(self.now, self.now_ms, id, r);
        }
    }

    /// Advances both clocks by `ms`, firing timeouts on the way.
    fn advance(&mut self, ms: u64) {
        let end = self.now + Duration::from_millis(ms);
        let end_ms = self.now_ms + ms;
        loop {
            let next = self.ctl.poll_timeout().filter(|t| *t <= end);
            let Some(t) = next else { break };
            let t = t.max(self.now);
            let step = t.duration_since(self.now).as_millis() as u64;
            self.now = t;
            self.now_ms += step;
            self.ctl.handle_timeout(self.now, self.now_ms);
            self.settle();
            if step == 0 && self.ctl.poll_timeout().is_some_and(|x| x <= self.now) {
                // Avoid spinning on a timeout that does not move.
                self.now += Duration::from_millis(1);
                self.now_ms += 1;
            }
        }
        self.now = end;
        self.now_ms = end_ms;
        self.ctl.handle_timeout(self.now, self.now_ms);
        self.settle();
    }

    fn submit(&mut self, id: &str, command: &Command) -> RecordKey {
        let key = RecordKey::new("s", id).unwrap();
        let spec = spec_for(command, &RunTarget::unverified(), WORKER, "m1").unwrap();
        self.ctl
            .submit(
                self.now,
                self.now_ms,
                Submit {
                    key: key.clone(),
                    spec,
                },
            )
            .unwrap();
        key
    }

    fn answer_exec(&mut self, result: WorkerResult) {
        let (id, _) = self.worker.remove(0);
        self.ctl.handle_worker(self.now, self.now_ms, id, result);
        self.settle();
    }

    fn record(&self, key: &RecordKey) -> &ExecutionRecord {
        &self.store.records[key]
    }

    fn finished(&self, key: &RecordKey) -> Option<&Finished> {
        self.events.iter().find_map(|e| match e {
            ControllerEvent::Finished(f) if &f.key == key => Some(&**f),
            _ => None,
        })
    }
}

fn exited(code: i32, stdout: &str) -> WorkerResult {
    Ok(WorkerReply::Exec(ExecOutcome::Exited(ExecOutput {
        exit_code: code,
        stdout: stdout.as_bytes().to_vec(),
        stderr: Vec::new(),
        encoding: OutputEncoding::Bytes,
    })))
}

fn cmd() -> Command {
    Command::new(["sh", "-c", "echo hi; exit 4"]).env("SECRET", "v")
}

#[test]
fn a_command_runs_once_from_the_stored_spec_and_completes() {
    let mut s = Sim::new(config());
    s.settle(); // initial scan: nothing due
    let key = s.submit("r1", &cmd().user("1000"));
    s.settle();
    assert!(matches!(
        s.events.first(),
        Some(ControllerEvent::Accepted {
            existing: false,
            ..
        })
    ));
    assert_eq!(s.worker.len(), 1);
    let (_, op) = &s.worker[0];
    let WorkerOp::Exec {
        worker_id,
        machine,
        command,
    } = op
    else {
        panic!("expected an exec, got {op:?}");
    };
    assert_eq!((worker_id.as_str(), machine.as_str()), (WORKER, "m1"));
    assert_eq!(command.argv(), cmd().argv());
    assert_eq!(command.user_name(), Some("1000"));
    assert_eq!(command.env_pairs(), cmd().env_pairs());
    // The intent was durable before the exec was handed out.
    assert_eq!(s.record(&key).state, ExecState::Dispatching);
    s.answer_exec(exited(4, "hi\n"));
    let rec = s.record(&key);
    assert_eq!(rec.state, ExecState::Completed);
    assert_eq!(rec.evidence, RecordEvidence::Exited);
    assert_eq!(rec.cleanup, Cleanup::Complete);
    assert_eq!(rec.next_due_at_ms, None);
    let f = s.finished(&key).unwrap();
    assert_eq!(f.exit_code(), Some(4));
    assert_eq!(f.output.as_ref().unwrap().stdout, b"hi\n");
    assert!(f.dispatched && f.error.is_none());
    assert_eq!(s.ctl.active(), 0);
}

/// A record accepted without its intent (here a detached submitter's)
/// goes through `preparing` and `ready`, and its claim is refreshed right
/// before the intent (C15).
#[test]
fn the_claim_is_refreshed_right_before_the_intent() {
    let mut s = Sim::new(detached());
    let key = s.submit("r1", &cmd());
    s.settle();
    let kinds: Vec<&str> = s
        .store_log
        .iter()
        .filter_map(|op| match op {
            StoreOp::Claim { key: k, .. } if *k == key => Some("claim"),
            StoreOp::Write { patch, .. } => patch.state.map(ExecState::as_str),
            _ => None,
        })
        .collect();
    assert_eq!(
        kinds,
        ["claim", "preparing", "ready", "claim", "dispatching"]
    );
}

#[test]
fn a_command_outliving_three_claim_ttls_keeps_its_exit() {
    let mut s = Sim::new(config());
    let key = s.submit("long", &cmd());
    s.settle();
    assert_eq!(s.worker.len(), 1);
    // 3.5 × the 1 s TTL with the command still running.
    s.advance(3_500);
    let claim = s.record(&key).claim.clone().unwrap();
    assert_eq!(claim.owner, OWNER);
    assert!(claim.until_ms > s.now_ms, "claim renewed while running");
    s.answer_exec(exited(4, "done\n"));
    let rec = s.record(&key);
    assert_eq!(rec.state, ExecState::Completed);
    assert!(matches!(
        rec.result,
        Some(ExecResult::Exited { exit_code: 4, .. })
    ));
    assert!(s.finished(&key).unwrap().error.is_none());
}

/// A controller whose submissions are accepted without the claim (and so
/// without the intent): the record moves through `preparing` and `ready`.
fn detached() -> ControllerConfig {
    let mut c = config();
    c.claim_at_accept = false;
    c
}

/// Issues 12 and 16: a buffered command on the caller's machine with
/// nothing to collect takes two commits — the acceptance with the claim
/// and the dispatch intent; the result with `completed` (`write_steps`) —
/// and the exec is sent only after the first one is durable.
#[test]
fn a_buffered_command_on_an_existing_machine_takes_two_commits() {
    let mut s = Sim::new(config());
    s.settle();
    let before = s.store.commits;
    let key = s.submit("three", &cmd());
    // The only op is the acceptance with the intent; nothing is sent yet.
    let (id, op) = s.ctl.poll_store_op().unwrap();
    assert!(matches!(&op, StoreOp::AcceptDispatching { record, .. }
        if record.key == key && record.claim.as_ref().is_some_and(|c| c.owner == OWNER)));
    assert!(
        s.ctl.poll_worker_op().is_none(),
        "nothing before the intent"
    );
    let r = s.store.apply(&op);
    s.store_log.push(op);
    let rec = s.record(&key).clone();
    assert_eq!(rec.state, ExecState::Dispatching);
    assert_eq!(rec.evidence, RecordEvidence::DispatchUncertain);
    assert!(rec.deadlines.execution_ms.is_some());
    s.ctl.handle_stored(s.now, s.now_ms, id, r);
    s.settle();
    assert_eq!(s.worker.len(), 1, "the exec follows the durable intent");
    assert_eq!(s.store.commits - before, 1);
    s.answer_exec(exited(4, "hi\n"));
    let rec = s.record(&key);
    assert_eq!(rec.state, ExecState::Completed);
    assert_eq!(rec.cleanup, Cleanup::Complete);
    assert_eq!(rec.next_due_at_ms, None);
    assert_eq!(s.store.commits - before, 2, "{:?}", s.store_log);
    assert_eq!(s.store_log.last().map(StoreOp::name), Some("write_steps"));
    let f = s.finished(&key).unwrap();
    assert_eq!(f.exit_code(), Some(4));
    assert!(f.dispatched && f.error.is_none());
    // Telemetry still names every stored state it passed.
    let states: Vec<ExecState> = s
        .events
        .iter()
        .filter_map(|e| match e {
            ControllerEvent::Telemetry(t) if t.key == key => t.exec_state(),
            _ => None,
        })
        .collect();
    assert_eq!(states, [ExecState::Dispatching, ExecState::Completed]);
}

/// With every slot of `max_active` busy the record is accepted only (no
/// intent), left due for the scan, and moves the long way once there is
/// room: the slot kept for an acceptance with intent is never overcommitted.
#[test]
fn with_no_room_a_submission_is_accepted_without_its_intent() {
    let mut cfg = config();
    cfg.max_active = 1;
    let mut s = Sim::new(cfg);
    s.settle();
    let first = s.submit("busy", &cmd());
    let second = s.submit("queued", &cmd());
    let ops: Vec<_> = std::iter::from_fn(|| s.ctl.poll_store_op()).collect();
    assert!(matches!(&ops[0].1, StoreOp::AcceptDispatching { record, .. } if record.key == first));
    assert!(matches!(&ops[1].1, StoreOp::Accept { record, .. } if record.key == second));
    for (id, op) in ops {
        let r = s.store.apply(&op);
        s.store_log.push(op);
        s.ctl.handle_stored(s.now, s.now_ms, id, r);
    }
    s.settle();
    assert_eq!(s.worker.len(), 1);
    assert_eq!(s.record(&second).state, ExecState::Accepted);
    s.answer_exec(exited(0, ""));
    s.advance(500);
    assert_eq!(s.worker.len(), 1, "the queued one runs once there is room");
    s.answer_exec(exited(0, ""));
    assert_eq!(s.record(&second).state, ExecState::Completed);
}

#[test]
fn a_duplicate_submit_joins_and_a_changed_spec_conflicts() {
    let mut s = Sim::new(config());
    let key = s.submit("d1", &cmd());
    s.settle();
    let again = s.submit("d1", &cmd());
    s.settle();
    assert_eq!(key, again);
    assert!(
        s.events
            .iter()
            .any(|e| matches!(e, ControllerEvent::Accepted { existing: true, .. }))
    );
    assert_eq!(s.worker.len(), 1, "one exec");
    s.submit("d1", &Command::new(["true"]));
    s.settle();
    assert!(s.events.iter().any(|e| matches!(e,
        ControllerEvent::Refused { error, .. } if error.category() == Category::IdentityConflict)));
    s.answer_exec(exited(0, ""));
    s.submit("d1", &cmd());
    s.settle();
    assert_eq!(s.worker.len(), 0, "a completed duplicate is not re-run");
    assert_eq!(
        s.events
            .iter()
            .filter(|e| matches!(e, ControllerEvent::Accepted { existing: true, .. }))
            .count(),
        2
    );
}

#[test]
fn an_exec_refused_with_nothing_sent_fails_not_dispatched() {
    let mut s = Sim::new(config());
    let key = s.submit("f1", &cmd());
    s.settle();
    s.answer_exec(Err(Error::transport(
        Operation::Exec,
        Evidence::NotDispatched,
        Reason::Unspecified,
    )));
    let rec = s.record(&key);
    assert_eq!(rec.state, ExecState::Failed);
    assert_eq!(rec.evidence, RecordEvidence::NotDispatched);
    let f = s.finished(&key).unwrap();
    assert!(!f.dispatched);
    assert_eq!(
        f.error.as_ref().unwrap().evidence(),
        Evidence::NotDispatched
    );
}

#[test]
fn an_uncertain_exec_error_is_unknown() {
    let mut s = Sim::new(config());
    let key = s.submit("u1", &cmd());
    s.settle();
    s.answer_exec(Err(Error::transport(
        Operation::Exec,
        Evidence::DispatchUncertain,
        Reason::Unspecified,
    )));
    let rec = s.record(&key);
    assert_eq!(rec.state, ExecState::Unknown);
    assert_eq!(rec.evidence, RecordEvidence::DispatchUncertain);
    assert_eq!(rec.next_due_at_ms, None);
    assert!(s.finished(&key).is_some());
}

#[test]
fn an_output_overflow_keeps_the_exit() {
    let mut s = Sim::new(config());
    let key = s.submit("o1", &cmd());
    s.settle();
    s.answer_exec(Err(Error::output_limit(
        Operation::Exec,
        Evidence::Exited,
        Reason::Unspecified,
    )
    .with_exit_code(7)));
    assert_eq!(s.record(&key).state, ExecState::Completed);
    assert_eq!(s.finished(&key).unwrap().exit_code(), Some(7));
}

/// Inserts a record of another (expired) controller directly.
fn foreign(s: &mut Sim, id: &str, to: &[ExecState], claim_until: u64) -> RecordKey {
    let key = RecordKey::new("s", id).unwrap();
    let spec = spec_for(&cmd(), &RunTarget::unverified(), WORKER, "m1").unwrap();
    let fp = s.ctl.fingerprint(&spec);
    let mut rec = ExecutionRecord::accepted(key.clone(), fp, spec, T0 - 10_000).unwrap();
    rec = claim::claim_exec(&rec, "old-ctl", T0 - 10_000, claim_until - (T0 - 10_000)).unwrap();
    for st in to {
        let patch = match st {
            ExecState::Dispatching => ExecPatch {
                state: Some(*st),
                evidence: Some(RecordEvidence::DispatchUncertain),
                ..ExecPatch::default()
            },
            ExecState::Collecting => ExecPatch {
                state: Some(*st),
                evidence: Some(RecordEvidence::Exited),
                result: Some(ExecResult::Exited {
                    exit_code: 3,
                    output_bytes: 0,
                    truncated: false,
                }),
                ..ExecPatch::default()
            },
            _ => ExecPatch {
                state: Some(*st),
                ..ExecPatch::default()
            },
        };
        rec = apply_exec(&rec, &patch, T0 - 9_000).unwrap();
    }
    s.store.records.insert(key.clone(), rec);
    key
}

#[test]
fn at_most_max_active_run_and_the_rest_wait_in_the_store() {
    let mut cfg = config();
    cfg.max_active = 2;
    let mut s = Sim::new(cfg);
    let a = s.submit("a", &cmd());
    let b = s.submit("b", &cmd());
    let c = s.submit("c", &cmd());
    s.settle();
    assert_eq!(s.worker.len(), 2);
    assert_eq!(s.record(&c).state, ExecState::Accepted);
    s.answer_exec(exited(0, ""));
    s.advance(10);
    assert_eq!(s.worker.len(), 2, "the third starts when one ends");
    s.answer_exec(exited(0, ""));
    s.answer_exec(exited(0, ""));
    for k in [&a, &b, &c] {
        assert_eq!(s.record(k).state, ExecState::Completed, "{k:?}");
    }
    assert!(s.worker.is_empty());
}

fn due_scans(s: &Sim) -> usize {
    s.store_log
        .iter()
        .filter(|op| matches!(op, StoreOp::Due { .. }))
        .count()
}

/// Issue 16: a finished command starts a due scan at once only when
/// records may be waiting in the store for room; otherwise the scan runs
/// at its interval (no store read per command).
#[test]
fn a_finished_command_scans_at_once_only_when_records_wait_for_room() {
    let mut s = Sim::new(config());
    s.settle();
    let key = s.submit("alone", &cmd());
    s.settle();
    let scans = due_scans(&s);
    s.answer_exec(exited(0, ""));
    assert_eq!(s.record(&key).state, ExecState::Completed);
    assert_eq!(due_scans(&s), scans, "nothing waited: no scan at once");
    s.advance(config().poll_interval_ms);
    assert_eq!(due_scans(&s), scans + 1, "the interval's scan still runs");

    let mut cfg = config();
    cfg.max_active = 1;
    let mut s = Sim::new(cfg);
    s.settle();
    s.submit("busy", &cmd());
    let queued = s.submit("queued", &cmd());
    s.settle();
    assert_eq!(s.record(&queued).state, ExecState::Accepted);
    let scans = due_scans(&s);
    s.answer_exec(exited(0, ""));
    assert_eq!(due_scans(&s), scans + 1, "a record waited: scan at once");
    assert_eq!(s.worker.len(), 1, "the queued one runs without waiting");
    s.answer_exec(exited(0, ""));
    assert_eq!(s.record(&queued).state, ExecState::Completed);
    // Nothing waits any more: the next finish starts no scan at once.
    let third = s.submit("third", &cmd());
    s.settle();
    let scans = due_scans(&s);
    s.answer_exec(exited(0, ""));
    assert_eq!(s.record(&third).state, ExecState::Completed);
    assert_eq!(due_scans(&s), scans);
}

#[test]
fn the_queue_deadline_expires_even_when_the_wall_clock_steps_back() {
    let mut cfg = config();
    cfg.max_active = 1;
    let mut s = Sim::new(cfg);
    s.submit("busy", &cmd());
    let key = RecordKey::new("s", "late").unwrap();
    let mut spec = spec_for(&cmd(), &RunTarget::unverified(), WORKER, "m1").unwrap();
    spec.queue_budget_ms = 1_000;
    s.ctl
        .submit(
            s.now,
            s.now_ms,
            Submit {
                key: key.clone(),
                spec,
            },
        )
        .unwrap();
    s.settle();
    assert_eq!(s.record(&key).state, ExecState::Accepted);
    // The wall clock steps back one hour; two monotonic seconds pass.
    s.now_ms -= 3_600_000;
    s.advance(2_000);
    s.answer_exec(exited(0, ""));
    s.advance(200);
    let rec = s.record(&key);
    assert_eq!(rec.state, ExecState::Expired);
    assert_eq!(rec.evidence, RecordEvidence::NotDispatched);
    assert_eq!(s.worker.len(), 0);
}

#[test]
fn the_execution_deadline_ends_observation_even_when_the_wall_clock_steps_back() {
    let mut s = Sim::new(config());
    let command = Command::new(["sleep", "100"]).timeout_secs(1);
    let key = RecordKey::new("s", "slow").unwrap();
    let mut target = RunTarget::unverified();
    target.profile.budgets.execution_ms = 2_000;
    let spec = spec_for(&command, &target, WORKER, "m1").unwrap();
    s.ctl
        .submit(
            s.now,
            s.now_ms,
            Submit {
                key: key.clone(),
                spec,
            },
        )
        .unwrap();
    s.settle();
    assert_eq!(s.worker.len(), 1);
    s.now_ms -= 3_600_000;
    s.advance(1_500);
    assert_eq!(s.record(&key).state, ExecState::Dispatching);
    s.advance(1_000);
    let rec = s.record(&key);
    assert_eq!(rec.state, ExecState::Unknown);
    assert_eq!(
        rec.last_error.as_ref().unwrap().reason,
        "execution_deadline"
    );
}

#[test]
fn a_store_outage_is_retried_and_never_read_as_absence() {
    let mut s = Sim::new(config());
    let key = s.submit("s1", &cmd());
    s.settle();
    s.store.fail_next = 2;
    s.answer_exec(exited(5, ""));
    assert_eq!(s.record(&key).state, ExecState::Dispatching);
    s.advance(1_000);
    assert_eq!(s.record(&key).state, ExecState::Completed);
    assert_eq!(s.finished(&key).unwrap().exit_code(), Some(5));
}

#[test]
fn a_lasting_store_outage_reports_the_known_exit() {
    let mut s = Sim::new(config());
    let key = s.submit("s2", &cmd());
    s.settle();
    s.store.fail_next = 1_000;
    s.answer_exec(exited(6, "x"));
    s.advance(2_000);
    let f = s.finished(&key).unwrap();
    let e = f.error.as_ref().unwrap();
    assert_eq!(e.category(), Category::Store);
    assert_eq!(e.evidence(), Evidence::Exited);
    assert_eq!(e.exit_code(), Some(6));
    assert!(f.output.is_some());
}

#[test]
fn telemetry_is_bounded_and_counts_what_it_drops() {
    let mut cfg = detached();
    cfg.telemetry_pending = 2;
    let mut s = Sim::new(cfg);
    s.submit("t1", &cmd());
    // Do not drain events while the run goes on.
    for _ in 0..20 {
        let Some((id, op)) = s.ctl.poll_store_op() else {
            break;
        };
        let r = s.store.apply(&op);
        s.ctl.handle_stored(s.now, s.now_ms, id, r);
    }
    assert!(s.ctl.telemetry_dropped() > 0);
    let t: Vec<_> = std::iter::from_fn(|| s.ctl.poll_event())
        .filter_map(|e| match e {
            ControllerEvent::Telemetry(t) => Some(t),
            _ => None,
        })
        .collect();
    assert_eq!(t.len(), 2);
    assert!(t.iter().all(|x| x.epoch == 1 && x.dropped > 0));
}

#[test]
fn submissions_it_cannot_run_are_refused_before_anything_is_stored() {
    let mut s = Sim::new(config());
    let key = RecordKey::new("s", "n1").unwrap();
    let spec = spec_for(&cmd(), &RunTarget::unverified(), "other-worker", "m1").unwrap();
    let e = catalog::refusal(&mut s, key, spec);
    assert_eq!(e.category(), Category::UnsupportedCapability);
    assert_eq!(e.evidence(), Evidence::NotDispatched);
    let key = RecordKey::new("s", "n2").unwrap();
    let spec = spec_for(
        &Command::new(["true"]).timeout_secs(31),
        &RunTarget::unverified(),
        WORKER,
        "m1",
    )
    .unwrap();
    let e = s
        .ctl
        .submit(s.now, s.now_ms, Submit { key, spec })
        .unwrap_err();
    assert_eq!(e.reason(), Reason::TimeoutOverBudget);
    s.settle();
    assert!(s.store.records.is_empty());
}

#[test]
fn shutdown_refuses_new_work_and_reports_stopped() {
    let mut s = Sim::new(config());
    s.submit("z1", &cmd());
    s.settle();
    s.ctl.shutdown(s.now, s.now_ms);
    s.settle();
    let key = RecordKey::new("s", "z2").unwrap();
    let spec = spec_for(&cmd(), &RunTarget::unverified(), WORKER, "m1").unwrap();
    assert!(s.ctl.submit(s.now, s.now_ms, Submit { key, spec }).is_err());
    assert!(
        !s.events
            .iter()
            .any(|e| matches!(e, ControllerEvent::Stopped))
    );
    s.answer_exec(exited(0, ""));
    assert!(
        s.events
            .iter()
            .any(|e| matches!(e, ControllerEvent::Stopped))
    );
}

#[test]
fn options_are_checked_at_n_and_n_plus_one() {
    let ok = config();
    ok.validate().unwrap();
    type Edit = fn(&mut ControllerConfig);
    let cases: [(Edit, Edit); 5] = [
        (|c| c.max_active = 64, |c| c.max_active = 65),
        (
            |c| c.telemetry_pending = 1_024,
            |c| c.telemetry_pending = 1_025,
        ),
        (|c| c.max_pending = 10_000, |c| c.max_pending = 10_001),
        (|c| c.cleanup_attempts = 20, |c| c.cleanup_attempts = 21),
        (
            |c| {
                c.poll_interval_ms = 250;
                c.lease_ttl_ms = 1_000;
            },
            |c| {
                c.poll_interval_ms = 251;
                c.lease_ttl_ms = 1_000;
            },
        ),
    ];
    for (good, bad) in cases {
        let mut c = config();
        good(&mut c);
        c.validate().unwrap();
        let mut c = config();
        bad(&mut c);
        assert_eq!(c.validate().unwrap_err().category(), Category::Validation);
    }
    let mut c = config();
    c.poll_interval_ms = 9;
    assert!(c.validate().is_err());
    c.poll_interval_ms = 10;
    c.validate().unwrap();
    let mut c = config();
    c.workers.push(WorkerEntry::new(WORKER));
    assert_eq!(c.validate().unwrap_err().reason(), Reason::DuplicateWorker);
}

#[test]
fn the_stored_spec_decodes_back_to_the_command() {
    let c = Command::new(["cat"])
        .stdin("in")
        .env("A", "1")
        .workdir("/workspace/x")
        .timeout_secs(9)
        .user("nobody");
    let spec = spec_for(&c, &RunTarget::unverified(), WORKER, "m1").unwrap();
    let back = command_of(&spec).unwrap();
    assert_eq!(back.argv(), c.argv());
    assert_eq!(back.stdin_text(), Some("in"));
    assert_eq!(back.working_dir(), "/workspace/x");
    assert_eq!(back.effective_timeout_secs(), Some(9));
    assert_eq!(back.user_name(), Some("nobody"));
    assert_eq!(back.wire_body().unwrap(), c.wire_body().unwrap());
}

#[test]
fn debug_of_specs_and_records_hides_secrets() {
    let sentinel = "SENTINEL-CTL-93f1";
    let c = Command::new(["echo", sentinel])
        .env("K", sentinel)
        .stdin(sentinel)
        .user(sentinel)
        .workdir(format!("/workspace/{sentinel}"));
    let spec = spec_for(&c, &RunTarget::unverified(), WORKER, "m1").unwrap();
    let fp = fingerprint::exec_fingerprint(&fingerprint_key(), &spec);
    let rec =
        ExecutionRecord::accepted(RecordKey::new("s", "d").unwrap(), fp, spec.clone(), T0).unwrap();
    let op = StoreOp::Accept {
        record: Box::new(rec.clone()),
        max_pending: 1,
    };
    let wop = WorkerOp::Exec {
        worker_id: WORKER.into(),
        machine: "m1".into(),
        command: c,
    };
    for text in [
        format!("{spec:?}"),
        format!("{rec:?}"),
        format!("{op:?}"),
        format!("{wop:?}"),
    ] {
        assert!(!text.contains(sentinel), "{text}");
        assert!(
            !text.contains("U0VOVElORUw"),
            "no base64 of it either: {text}"
        );
    }
}

#[test]
fn a_wait_settles_on_the_notice_while_driven_and_on_unknown_at_once() {
    let mut s = Sim::new(config());
    let key = s.submit("w1", &cmd());
    s.settle();
    let dispatching = s.record(&key).clone();
    assert_eq!(Outcome::settle(dispatching.clone(), None, true), None);
    assert_eq!(Outcome::settle(dispatching, None, false), None);
    s.answer_exec(exited(2, "o"));
    let done = s.record(&key).clone();
    // Terminal but still driven: wait for the notice (it has the output).
    assert_eq!(Outcome::settle(done.clone(), None, true), None);
    let f = s.finished(&key).unwrap().clone();
    let o = Outcome::settle(done.clone(), Some(&f), false).unwrap();
    assert_eq!(o.output.as_ref().unwrap().stdout, b"o");
    assert_eq!(o.exit_code(), Some(2));
    // A notice of a record held elsewhere is not an outcome.
    let mut held = f;
    held.held_elsewhere = true;
    let o = Outcome::settle(done, Some(&held), false).unwrap();
    assert!(o.output.is_none());
    // `unknown` ends the wait even while an exec is still observed.
    let mut s = Sim::new(config());
    let key = s.submit("w2", &cmd());
    s.settle();
    s.ctl.cancel(s.now, s.now_ms, key.clone());
    s.settle();
    let unknown = s.record(&key).clone();
    assert_eq!(unknown.state, ExecState::Unknown);
    assert!(Outcome::settle(unknown, None, true).is_some());
}

// ---- disposable machines the controller owns (C12.4, C17.2; the cases
// are in tests/disposable.rs) ----

use crate::worker::machines::Incarnation;
use crate::worker::{MachineState, NetworkPolicy, Observation, Profile};

fn disposable_config() -> ControllerConfig {
    let mut c = config();
    let profile = Profile::admit("1.22.0", &[]).unwrap();
    c.workers = vec![WorkerEntry::new(WORKER).with_profile(profile)];
    c
}

fn observation(name: &str, state: MachineState, created_at: u64) -> Box<Observation> {
    Box::new(Observation {
        incarnation: Incarnation {
            name: name.to_owned(),
            created_at,
            cpus: 1,
            memory_mb: 256,
            storage_gb: 1,
            overlay_gb: 1,
            network: NetworkPolicy::Offline,
            network_backend: None,
            allowlists_present: false,
            ports: Vec::new(),
            mounts: Vec::new(),
            image: None,
        },
        state,
        pid: None,
        branchable: None,
        measurements: crate::worker::Measurements::default(),
    })
}

fn not_found() -> Error {
    Error::not_found(Operation::Get, Evidence::Unknown, Reason::Unspecified)
}

impl Sim {
    fn submit_disposable(&mut self, id: &str, command: &Command) -> RecordKey {
        let key = RecordKey::new("s", id).unwrap();
        let mut spec = spec_for(command, &RunTarget::unverified(), WORKER, "x").unwrap();
        spec.worker_machine = None;
        self.submit_keyed(&key, spec);
        key
    }

    /// Submits `spec` under `key`; the submit itself must not fail.
    fn submit_keyed(&mut self, key: &RecordKey, spec: ExecutionSpec) {
        self.ctl
            .submit(
                self.now,
                self.now_ms,
                Submit {
                    key: key.clone(),
                    spec,
                },
            )
            .unwrap();
    }

    /// The name of the machine assigned to `key`.
    fn machine_of(&self, key: &RecordKey) -> String {
        self.record(key).assignment.clone().unwrap().machine_name
    }

    /// Drives the disposable execution of `key` up to its own dispatch
    /// intent, performing every store op before it and answering the
    /// machine's create and start as they come; returns the intent's store
    /// op, not yet performed.
    fn until_intent(&mut self, key: &RecordKey) -> (OpId, StoreOp) {
        let intent = |op: &StoreOp| matches!(op, StoreOp::Write { patch, .. } if patch.state == Some(ExecState::Dispatching));
        loop {
            while let Some(w) = self.ctl.poll_worker_op() {
                self.worker.push(w);
            }
            while let Some(e) = self.ctl.poll_event() {
                self.events.push(e);
            }
            if let Some((id, op)) = self.ctl.poll_store_op() {
                if intent(&op) {
                    return (id, op);
                }
                let r = self.store.apply(&op);
                self.store_log.push(op);
                self.ctl.handle_stored(self.now, self.now_ms, id, r);
                continue;
            }
            let (wid, wop) = self.worker.remove(0);
            let name = self.machine_of(key);
            let state = if wop.name() == "create" {
                MachineState::Created
            } else {
                MachineState::Running
            };
            let o = observation(&name, state, 1_700_000_000);
            self.ctl
                .handle_worker(self.now, self.now_ms, wid, Ok(WorkerReply::Machine(o)));
        }
    }

    /// Create and start answered: the machine runs; its name.
    fn started(&mut self, key: &RecordKey) -> String {
        let name = self.machine_of(key);
        let obs = |st| Ok(WorkerReply::Machine(observation(&name, st, 1_700_000_000)));
        self.answer("create", obs(MachineState::Created));
        self.answer("start", obs(MachineState::Running));
        name
    }

    /// Takes the next worker op (asserting its kind by name) and answers it.
    fn answer(&mut self, kind: &str, result: WorkerResult) -> WorkerOp {
        assert!(!self.worker.is_empty(), "expected a {kind} op");
        let (id, op) = self.worker.remove(0);
        let got = op.name();
        assert_eq!(got, kind, "{op:?}");
        self.ctl.handle_worker(self.now, self.now_ms, id, result);
        self.settle();
        op
    }
}

#[test]
fn debug_of_the_controller_mid_run_hides_secrets() {
    let sentinel = "SENTINEL-CTL-DEBUG-7a2c";
    let mut s = Sim::new(config());
    let c = Command::new(["echo", sentinel])
        .env("K", sentinel)
        .stdin(sentinel);
    s.submit("dbg", &c);
    s.settle();
    let mid = format!("{:?} {:?}", s.ctl, s.worker);
    assert!(mid.contains("argc"), "the execution is in it");
    s.answer_exec(exited(0, sentinel));
    for text in [
        mid,
        format!("{:?}", s.ctl),
        format!("{:?}", s.events),
        format!("{:?}", s.store_log),
    ] {
        assert!(!text.contains(sentinel), "{text}");
    }
}

// The regressions of the recovery simulation's findings and the claim at
// acceptance.
mod cancel;
mod catalog;
mod checkpoint;
mod disposable;
mod evidence;
mod files;
mod findings;
mod intent;
mod machines;
mod named;
mod recovery;
mod refence;
mod release;
mod stream;
mod telemetry;
