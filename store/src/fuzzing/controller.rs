//! Body of the `controller` fuzz target: a core [`Controller`] driven by an
//! arbitrary sequence of commands, store answers, worker answers and clock
//! steps.
//!
//! The store answers come from a real [`MemoryStore`] (through
//! [`apply_op`], as the shells do), or are replaced, as the input says, by
//! an error of any category and evidence, a reply of the wrong kind, the
//! true reply with its records mutated (state, evidence, version, claim,
//! cancel, due time, generation), or a record decoded from the input's
//! bytes by the envelope decoder. Worker answers are exits, typed errors of
//! every evidence, machine observations or replies of the wrong kind. The
//! wall clock may step backwards.
//!
//! Oracles (each panics, which libFuzzer reports):
//! - no input panics (the controller is peer-facing through the store);
//! - `poll_store_op`, `poll_worker_op` and `poll_event` run dry within a
//!   bound after every input (no unbounded output);
//! - `poll_timeout` never names a time at which `handle_timeout` does
//!   nothing, three times running (a shell waiting on it would spin);
//! - **never a second dispatch**: a [`WorkerOp::Exec`] for a record is
//!   only emitted after the reply to this controller's own dispatching
//!   intent, once, and never for a record that a store reply had shown
//!   possibly dispatched or finished (any state after `ready`) while the
//!   controller was driving it (after its own intent's reply, rows that
//!   descend from that intent excepted: the same record under the same
//!   claim generation of this controller, at that version or later). What the controller forgets (a record it no
//!   longer drives, or an execution of it that ended, even while an
//!   acceptance of the key is still out) is out of scope: a store that
//!   rolls a whole row back is the store's to detect (docs/decisions.md,
//!   "Stored data").

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use smolbox_core::exec::{Command, ExecOutcome, ExecOutput, OutputEncoding};
use smolbox_core::managed::controller::{
    Claimed, Controller, ControllerConfig, ControllerEvent, OpId, RunTarget, StoreOp, StoreReply,
    StoreResult, Submit, WorkerEntry, WorkerOp, WorkerReply, WorkerResult, spec_for,
};
use smolbox_core::managed::envelope::decode_exec;
use smolbox_core::managed::record::Claim;
use smolbox_core::managed::{ExecState, ExecutionRecord, RecordEvidence, RecordKey, testkit};
use smolbox_core::worker::machines::Incarnation;
use smolbox_core::worker::{MachineState, Measurements, NetworkPolicy, Observation, Profile};
use smolbox_core::{Error, Evidence, Operation, Reason};

use crate::{MemoryConfig, MemoryStore, apply_op};

const T0: u64 = 1_700_000_000_000;
const OWNER: &str = "ctl-fuzz-1";
const KEYS: [&str; 4] = ["k0", "k1", "k2", "k3"];
/// Most inputs one run consumes.
const MAX_STEPS: usize = 400;
/// Most outputs one input may produce before the drain is called unbounded.
const MAX_DRAIN: usize = 20_000;

/// The input, read a byte at a time; zeros once it is used up.
struct Input<'a> {
    data: &'a [u8],
    pos: usize,
}

impl Input<'_> {
    fn done(&self) -> bool {
        self.pos >= self.data.len()
    }

    fn u8(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }

    fn u16(&mut self) -> u16 {
        u16::from_be_bytes([self.u8(), self.u8()])
    }

    fn slice(&mut self, n: usize) -> &[u8] {
        let start = self.pos.min(self.data.len());
        let end = (start + n).min(self.data.len());
        self.pos = start + n;
        &self.data[start..end]
    }
}

/// What the oracle knows about one record key while the controller drives it.
#[derive(Debug, Default)]
struct Seen {
    /// A store reply showed it past `ready` (not as the answer to this
    /// controller's own intent).
    tainted: bool,
    /// The reply to this controller's own intent: one exec may follow.
    granted: bool,
    /// That reply's row. A later row of the same record under the same
    /// claim generation of this controller, at that version or later,
    /// descends from this controller's own intent (no other intent can
    /// follow `dispatching`, and another claimer moves the generation) and
    /// shows no other intent: the same row read again by a due scan while
    /// the exec waits for the worker lease (session 9, finding 14), or this
    /// controller's own cancel recorded on top of it (finding 15). The
    /// oracle was too strict in both.
    intent_row: Option<ExecutionRecord>,
}

struct Harness {
    ctl: Controller,
    store: MemoryStore,
    now: Instant,
    now_ms: u64,
    store_ops: VecDeque<(OpId, StoreOp)>,
    worker_ops: VecDeque<(OpId, WorkerOp)>,
    seen: BTreeMap<String, Seen>,
}

fn key(i: u8) -> RecordKey {
    testkit::key("s", KEYS[usize::from(i) % KEYS.len()])
}

fn config(b: u8) -> ControllerConfig {
    let mut c = ControllerConfig::new(OWNER);
    let mut w1 = WorkerEntry::new("w1");
    if b & 1 != 0
        && let Ok(p) = Profile::admit("1.22.0", &[])
    {
        w1 = w1.with_profile(p);
    }
    c.workers = vec![w1];
    if b & 2 != 0 {
        c.workers.push(WorkerEntry::new("w2"));
    }
    c.max_active = 1 + usize::from((b >> 2) & 3);
    c.claim_at_accept = b & 16 == 0;
    c.poll_interval_ms = 100;
    c.lease_ttl_ms = if b & 32 == 0 { 1_000 } else { 3_000 };
    c.max_pending = if b & 64 == 0 { 128 } else { 2 };
    c
}

/// A spec for key `k` (its argv names the key, so an exec is attributed).
fn spec(k: &RecordKey, b: u8) -> Option<Submit> {
    let mut command = Command::new(["echo", k.id.as_str(), &format!("v{}", b >> 4)]);
    match b & 7 {
        3 => command = command.timeout_secs(u32::MAX),
        4 => command = command.background(true),
        5 => command = command.stdin("in").env("E", "v"),
        _ => {}
    }
    let worker = if b & 7 == 2 { "w9" } else { "w1" };
    let mut spec = spec_for(&command, &RunTarget::unverified(), worker, "m1").ok()?;
    match b & 7 {
        1 => spec.worker_machine = None,
        6 => spec.machine = Some(testkit::key("s", "mach")),
        7 => spec.queue_budget_ms = 1,
        _ => {}
    }
    Some(Submit {
        key: k.clone(),
        spec,
    })
}

/// An error of the category the byte names, with `evidence` (any pair,
/// also ones no real store or worker returns).
fn any_error(b: u8, operation: Operation, evidence: Evidence) -> Error {
    let (op, ev, r) = (operation, evidence, Reason::Unavailable);
    let e = match b % 17 {
        0 => Error::validation(op, r),
        1 => Error::unsupported_capability(op, r),
        2 => Error::unsupported_network_policy(op, ev, r),
        3 => Error::authentication(op, ev, r),
        4 => Error::admission_exhausted(op, r),
        5 => Error::expired(op, ev, r),
        6 => Error::transport(op, ev, r),
        7 => Error::protocol(op, r),
        8 => Error::output_limit(op, ev, r),
        9 => Error::identity_conflict(op, ev, r),
        10 => Error::port_conflict(op, ev, r),
        11 => Error::not_found(op, ev, r),
        12 => Error::store(op, ev, r),
        13 => Error::stale_claim(op, ev, r),
        14 => Error::stale_version(op, ev, r),
        15 => Error::unknown(op, ev, r),
        _ => Error::cleanup(op, ev, r),
    };
    e.with_evidence(ev)
}

fn error(b: u8, e: u8) -> Error {
    let evidence = [
        Evidence::NotDispatched,
        Evidence::DispatchUncertain,
        Evidence::RunningObserved,
        Evidence::Exited,
        Evidence::TerminationConfirmed,
        Evidence::Unknown,
    ][usize::from(e) % 6];
    any_error(b, Operation::StoreWrite, evidence)
}

fn observation(name: &str, b: u8) -> Box<Observation> {
    Box::new(Observation {
        incarnation: Incarnation {
            name: name.to_owned(),
            created_at: u64::from(b & 3),
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
        state: [
            MachineState::Created,
            MachineState::Running,
            MachineState::Stopped,
        ][usize::from(b >> 2) % 3],
        pid: None,
        branchable: None,
        measurements: Measurements::default(),
    })
}

/// The key whose dispatching intent `op` writes.
fn intent_key(op: &StoreOp) -> Option<&RecordKey> {
    let dispatching =
        |p: &smolbox_core::managed::ExecPatch| p.state == Some(ExecState::Dispatching);
    match op {
        StoreOp::Write { key, patch, .. } if dispatching(patch) => Some(key),
        StoreOp::WriteSteps { key, patches, .. } if patches.iter().any(dispatching) => Some(key),
        StoreOp::AcceptDispatching { record, .. } | StoreOp::SubmitDispatching { record, .. } => {
            Some(&record.key)
        }
        _ => None,
    }
}

/// The one execution record an op is about, for ops about one record: a
/// reply of such an op carrying another key's record is a lie the
/// controller refuses by key (`UnexpectedReply`, or the execution's
/// key check), so it shows nothing about that other record. A release of
/// an execution's claim is one too: the controller reads nothing of its
/// reply but that it was answered (session 9, finding 13: the oracle was
/// too strict).
fn exec_key_of(op: &StoreOp) -> Option<&RecordKey> {
    match op {
        StoreOp::Accept { record, .. }
        | StoreOp::AcceptDispatching { record, .. }
        | StoreOp::SubmitCommand { record, .. }
        | StoreOp::SubmitDispatching { record, .. } => Some(&record.key),
        StoreOp::Fetch { key }
        | StoreOp::Claim { key, .. }
        | StoreOp::ClaimVersion { key, .. }
        | StoreOp::Write { key, .. }
        | StoreOp::WriteSteps { key, .. }
        | StoreOp::Reserve { key, .. }
        | StoreOp::Release { key, .. }
        | StoreOp::Cancel { key, .. }
        | StoreOp::ReleaseClaim {
            claimed: Claimed::Execution(key),
            ..
        } => Some(key),
        _ => None,
    }
}

/// Every execution record a reply carries (with "inserted by this call").
fn records_mut(reply: &mut StoreReply) -> Vec<(&mut ExecutionRecord, bool)> {
    match reply {
        StoreReply::Record(r) => vec![(r, true)],
        StoreReply::Accepted { record, existing } => vec![(record, !*existing)],
        StoreReply::Due { records, .. } => records.iter_mut().map(|r| (r, false)).collect(),
        StoreReply::Submitted {
            execution,
            existing,
            ..
        } => vec![(execution, !*existing)],
        StoreReply::SlotFinished { execution, .. } => vec![(execution, false)],
        StoreReply::Resolved {
            command: Some(c), ..
        } => vec![(c, false)],
        _ => Vec::new(),
    }
}

/// `row` is `intent` or a later row of the same record written under the
/// same claim generation of this controller.
fn descends(intent: &ExecutionRecord, row: &ExecutionRecord) -> bool {
    row.key == intent.key
        && row.fingerprint == intent.fingerprint
        && row.spec == intent.spec
        && row.generation == intent.generation
        && row.claim.as_ref().is_some_and(|c| c.owner == OWNER)
        && row.version >= intent.version
}

fn mutate(rec: &mut ExecutionRecord, input: &mut Input<'_>) {
    let what = input.u8();
    let v = input.u8();
    match what % 9 {
        0 => rec.state = ExecState::ALL[usize::from(v) % ExecState::ALL.len()],
        1 => {
            rec.evidence = [
                RecordEvidence::NotDispatched,
                RecordEvidence::DispatchUncertain,
                RecordEvidence::RunningObserved,
                RecordEvidence::Exited,
                RecordEvidence::Launched,
                RecordEvidence::TerminationConfirmed,
                RecordEvidence::Unknown,
            ][usize::from(v) % 7];
        }
        2 => rec.version = rec.version.wrapping_add(u64::from(v)).wrapping_sub(128),
        3 => {
            rec.claim = Some(Claim {
                owner: if v & 1 == 0 { "ctl-other" } else { OWNER }.to_owned(),
                until_ms: T0 + u64::from(v) * 100,
            });
        }
        4 => rec.claim = None,
        5 => rec.cancel_requested_at_ms = Some(T0 + u64::from(v)),
        6 => rec.next_due_at_ms = (v & 1 == 0).then_some(T0 + u64::from(v) * 50),
        7 => rec.generation = u64::from(v),
        _ => rec.key = key(v),
    }
}

impl Harness {
    fn new(b: u8) -> Option<Self> {
        let now = fuzz_epoch();
        let ctl = Controller::new(config(b), testkit::fingerprint_key(), now, T0).ok()?;
        Some(Self {
            ctl,
            store: MemoryStore::new(MemoryConfig::default()).ok()?,
            now,
            now_ms: T0,
            store_ops: VecDeque::new(),
            worker_ops: VecDeque::new(),
            seen: BTreeMap::new(),
        })
    }

    /// Drains every output after an input; checks the exec oracle.
    fn drain(&mut self) -> bool {
        let mut any = false;
        for _ in 0..MAX_DRAIN {
            let mut got = false;
            while let Some(op) = self.ctl.poll_store_op() {
                self.store_ops.push_back(op);
                got = true;
            }
            while let Some((id, op)) = self.ctl.poll_worker_op() {
                self.check_exec(&op);
                self.worker_ops.push_back((id, op));
                got = true;
            }
            if let Some(e) = self.ctl.poll_event() {
                if let ControllerEvent::Finished(f) = &e {
                    assert!(!format!("{f:?}").contains("ctl-fuzz-secret"));
                    // That execution ended: what it saw is forgotten with
                    // it, also while an acceptance of the key is still out
                    // (which keeps the key in `active_keys`); a later
                    // execution of the key needs its own intent's grant.
                    self.seen.remove(&f.key.id);
                }
                got = true;
            }
            if !got {
                self.forget_undriven();
                return any;
            }
            any = true;
            assert!(
                self.store_ops.len() + self.worker_ops.len() <= MAX_DRAIN,
                "the controller's outputs grow without bound"
            );
        }
        panic!("poll_store_op/poll_worker_op/poll_event do not run dry");
    }

    /// Once the controller stops driving a key, what it forgot is not held
    /// against it.
    fn forget_undriven(&mut self) {
        let active: BTreeSet<String> = self.ctl.active_keys().map(|k| k.id.clone()).collect();
        self.seen.retain(|k, _| active.contains(k));
    }

    fn check_exec(&mut self, op: &WorkerOp) {
        let WorkerOp::Exec { command, .. } = op else {
            return;
        };
        let Some(id) = command.argv().get(1) else {
            return;
        };
        if command.argv().first().map(String::as_str) != Some("echo")
            || !KEYS.contains(&id.as_str())
        {
            return;
        }
        let seen = self.seen.entry(id.clone()).or_default();
        assert!(
            seen.granted && !seen.tainted,
            "an exec for {id} without this controller's own fresh intent \
             (or after the record was shown possibly dispatched): {seen:?}"
        );
        seen.granted = false;
        seen.intent_row = None;
        seen.tainted = true;
    }

    /// Records what a store reply shows, before the controller sees it.
    fn observe(&mut self, op: &StoreOp, result: &mut StoreResult) {
        let intent = intent_key(op).cloned();
        let about = exec_key_of(op).cloned();
        let Ok(reply) = result else { return };
        for (rec, inserted) in records_mut(reply) {
            if about.as_ref().is_some_and(|k| *k != rec.key) {
                // Another record's row in the reply of an op about one
                // record: refused by key, it shows nothing (session 7's
                // second `controller` crash; the oracle was too strict).
                continue;
            }
            let seen = self.seen.entry(rec.key.id.clone()).or_default();
            let own = intent.as_ref() == Some(&rec.key)
                && inserted
                && matches!(
                    rec.state,
                    ExecState::Dispatching | ExecState::Running | ExecState::Cancelling
                );
            if own && !seen.tainted {
                seen.granted = true;
                seen.intent_row = Some(rec.clone());
            } else if seen.granted && seen.intent_row.as_ref().is_some_and(|i| descends(i, rec)) {
                // This controller's own intent, or what it wrote on top.
            } else if !rec.state.is_before_dispatch() {
                seen.tainted = true;
            }
        }
    }

    fn answer_store(&mut self, input: &mut Input<'_>) {
        if self.store_ops.is_empty() {
            return;
        }
        let i = usize::from(input.u8()) % self.store_ops.len();
        let Some((id, op)) = self.store_ops.remove(i) else {
            return;
        };
        let mode = input.u8();
        let mut result = match mode % 10 {
            0..=4 => apply_op(&self.store, &op),
            5 => Err(error(input.u8(), input.u8())),
            6 => apply_op(&self.store, &op).map(|mut r| {
                let n = input.u8() % 3 + 1;
                for (rec, _) in records_mut(&mut r) {
                    for _ in 0..n {
                        mutate(rec, input);
                    }
                }
                r
            }),
            7 => {
                let n = usize::from(input.u16() % 4096);
                let bytes = input.slice(n).to_vec();
                match decode_exec(&bytes) {
                    Ok(rec) => apply_op(&self.store, &op).map(|mut r| {
                        for (slot, _) in records_mut(&mut r) {
                            let k = slot.key.clone();
                            *slot = rec.clone();
                            slot.key = k;
                        }
                        r
                    }),
                    Err(e) => Err(e),
                }
            }
            8 => Ok(StoreReply::Due {
                records: Vec::new(),
                next: None,
            }),
            _ => {
                // Applied, but the answer is lost (the driver saw an error
                // after the commit).
                let _ = apply_op(&self.store, &op);
                Err(error(12, input.u8()))
            }
        };
        self.observe(&op, &mut result);
        self.ctl.handle_stored(self.now, self.now_ms, id, result);
    }

    fn answer_worker(&mut self, input: &mut Input<'_>) {
        if self.worker_ops.is_empty() {
            return;
        }
        let i = usize::from(input.u8()) % self.worker_ops.len();
        let Some((id, op)) = self.worker_ops.remove(i) else {
            return;
        };
        let b = input.u8();
        let result: WorkerResult = match (b % 8, &op) {
            (0..=2, WorkerOp::Exec { .. }) => {
                Ok(WorkerReply::Exec(ExecOutcome::Exited(ExecOutput {
                    exit_code: i32::from(input.u8()) - 1,
                    stdout: b"out".to_vec(),
                    stderr: Vec::new(),
                    encoding: OutputEncoding::Bytes,
                })))
            }
            (0..=2, WorkerOp::Delete { .. }) => Ok(WorkerReply::Deleted),
            (
                0..=2,
                WorkerOp::Create { name, .. }
                | WorkerOp::Start { name, .. }
                | WorkerOp::Stop { name, .. }
                | WorkerOp::Inspect { name, .. },
            ) => Ok(WorkerReply::Machine(observation(name.as_str(), input.u8()))),
            (0..=2, WorkerOp::Logs { .. }) => Ok(WorkerReply::Logs(Vec::new())),
            (3, _) => Ok(WorkerReply::Deleted),
            (4, _) => Ok(WorkerReply::Machine(observation("other", input.u8()))),
            _ => {
                let category = input.u8();
                let evidence = [
                    Evidence::NotDispatched,
                    Evidence::DispatchUncertain,
                    Evidence::Unknown,
                    Evidence::Exited,
                ][usize::from(b >> 3) % 4];
                Err(any_error(category, Operation::Exec, evidence))
            }
        };
        self.ctl.handle_worker(self.now, self.now_ms, id, result);
    }

    fn advance(&mut self, input: &mut Input<'_>) {
        let b = input.u8();
        let ms = match b {
            255 => 3_600_000,
            254 => 0,
            _ => u64::from(b) * 37,
        };
        self.now += Duration::from_millis(ms);
        let step = input.u8();
        self.now_ms = match step % 4 {
            // The wall clock steps back (never below the start).
            0 => self.now_ms.saturating_sub(u64::from(step) * 100).max(T0),
            1 => self.now_ms + ms + u64::from(step) * 1_000,
            _ => self.now_ms + ms,
        };
        self.ctl.handle_timeout(self.now, self.now_ms);
    }

    /// A shell waits until `poll_timeout`: a time in the past at which
    /// `handle_timeout` does nothing would make it spin.
    fn check_timer(&mut self) {
        for _ in 0..3 {
            match self.ctl.poll_timeout() {
                Some(t) if t <= self.now => {
                    self.ctl.handle_timeout(self.now, self.now_ms);
                    if self.drain() {
                        return;
                    }
                }
                _ => return,
            }
        }
        assert!(
            self.ctl.poll_timeout().is_none_or(|t| t > self.now),
            "poll_timeout names a past time at which handle_timeout does nothing"
        );
    }

    fn step(&mut self, input: &mut Input<'_>) {
        let op = input.u8();
        match op % 12 {
            0 => {
                let k = key(input.u8());
                if let Some(s) = spec(&k, input.u8()) {
                    let _ = self.ctl.submit(self.now, self.now_ms, s);
                }
            }
            1 => self.ctl.cancel(self.now, self.now_ms, key(input.u8())),
            2 => self.ctl.reconcile(self.now, self.now_ms),
            3 => {
                if input.u8() < 32 {
                    self.ctl.shutdown(self.now, self.now_ms);
                }
            }
            4..=7 => self.answer_store(input),
            8 | 9 => self.answer_worker(input),
            10 => self.advance(input),
            _ => {
                // An answer to an op that is not outstanding is ignored.
                let id = OpId(u64::from(input.u16()) + 1_000_000);
                self.ctl
                    .handle_stored(self.now, self.now_ms, id, Err(error(12, 0)));
                self.ctl
                    .handle_worker(self.now, self.now_ms, id, Ok(WorkerReply::Deleted));
            }
        }
    }

    /// After the input: a truthful store and worker until nothing moves
    /// (bounded), then shutdown.
    fn settle(&mut self) {
        self.ctl.shutdown(self.now, self.now_ms);
        self.drain();
        for _ in 0..64 {
            if let Some((id, op)) = self.store_ops.pop_front() {
                let mut r = apply_op(&self.store, &op);
                self.observe(&op, &mut r);
                self.ctl.handle_stored(self.now, self.now_ms, id, r);
            } else if let Some((id, _)) = self.worker_ops.pop_front() {
                self.ctl.handle_worker(
                    self.now,
                    self.now_ms,
                    id,
                    Ok(WorkerReply::Exec(ExecOutcome::Exited(ExecOutput {
                        exit_code: 0,
                        stdout: Vec::new(),
                        stderr: Vec::new(),
                        encoding: OutputEncoding::Bytes,
                    }))),
                );
            } else if let Some(t) = self.ctl.poll_timeout() {
                self.now = self.now.max(t);
                self.now_ms += 1_000;
                self.ctl.handle_timeout(self.now, self.now_ms);
            } else {
                return;
            }
            self.drain();
            self.check_timer();
        }
    }
}

/// The fuzz body (see the module docs for the oracles).
pub fn fuzz_controller(data: &[u8]) {
    let mut input = Input { data, pos: 0 };
    let Some(mut h) = Harness::new(input.u8()) else {
        return;
    };
    h.drain();
    let mut steps = 0;
    while !input.done() && steps < MAX_STEPS {
        h.step(&mut input);
        h.drain();
        h.check_timer();
        steps += 1;
    }
    h.settle();
}

/// Some `Instant` to start from; every later time is derived by addition.
#[allow(clippy::disallowed_methods)] // a fuzz harness, not protocol logic
fn fuzz_epoch() -> Instant {
    Instant::now()
}
