//! Definite refusals in the driver (session 10, issue 12): creates the
//! worker's create handler refuses, and imageless machines. A child module
//! of the driver; its choices come from a random stream of their own
//! (`Rng::fork(seed, 23)`; the worker's draws from `Rng::fork(seed, 22)`).
//!
//! Rules checked here:
//! - **A refused create made nothing, and the controller that heard it
//!   says so** (docs/decisions/runtime.md, "A create the worker refuses"):
//!   the first write of the record by the controller that was handed the
//!   refusal is a create that made nothing — disposable: `failed` /
//!   `not_dispatched`, absence recorded, cleanup `complete`; retained:
//!   `unknown`, absence recorded, no operation. (A refusal whose hearer
//!   crashed proves nothing to the next controller: it finds an intent it
//!   did not write and keeps the reservation, which is allowed.) At the
//!   end of a seed, a refused record whose absence is recorded has its
//!   reservation released, and no machine exists under a refused name.
//!   The worker itself reports a create arriving again for a refused name,
//!   and the reference model absence recorded without creation evidence
//!   after a create that made the machine.
//! - **The owner's delete of such a machine settles without a worker
//!   call**: no delete of its name reaches the worker once the owner asked
//!   for it, and the machine is `deleted` at the end (a seeded half of the
//!   callers delete it; the others leave it to the operator's resolve, as
//!   before).
//! - **An imageless machine's refusal stores nothing and takes no slot**: a
//!   background launch or a terminal refused `unsupported_capability` /
//!   `needs_plain_image_machine` at acceptance has no execution record and
//!   does not hold the machine's slot; the worker reports any launch or
//!   terminal that reaches an imageless machine.

use std::collections::{BTreeMap, BTreeSet};

use smolbox_core::managed::RecordEvidence;
use smolbox_core::managed::RecordKey;
use smolbox_core::managed::controller::MachineRequest;
use smolbox_core::managed::state::{Cleanup, ExecState, MachineOperation, MachineRecordState};
use smolbox_core::worker::{Create, ImageCheck, Profile, Version};
use smolbox_core::{Category, Error, Evidence, Operation, Reason};
use smolbox_store::Store;

use super::super::Bug;
use super::super::rng::Rng;
use super::super::store::{Commit, CommitKind, MachineCommit, MachineCommitKind};
use super::super::worker::Reply;
use super::Sim;

/// Per mille of the machines a create makes that are imageless.
pub(super) const IMAGELESS: u32 = 250;

/// A commit, as the hearer's-write rule reads it.
struct Written {
    /// A guarded write (not a claim, acceptance, reservation, …).
    write: bool,
    owner: Option<String>,
    /// The machine name of its assignment.
    name: Option<String>,
    /// It records a create that made nothing.
    ok: bool,
    probe: &'static str,
    /// The violation when it does not.
    what: String,
}

/// The driver's refusal bookkeeping.
#[derive(Debug)]
pub(super) struct Refusals {
    rng: Rng,
    /// Create requests in flight: request → machine name.
    creates: BTreeMap<u64, String>,
    /// Machine names whose refusal a controller heard: name → host.
    heard: BTreeMap<String, usize>,
    /// Heard refusals whose hearer has not written the record since.
    pending: BTreeSet<String>,
    /// Machine names whose owner asked to delete them after a refused (or
    /// never sent) create: no delete of them may reach the worker.
    deleted_absent: BTreeSet<String>,
    /// Retained machines whose owner was asked (decided once each).
    owner_deletes: BTreeMap<RecordKey, bool>,
}

impl Refusals {
    pub(super) fn new(seed: u64) -> Self {
        Self {
            rng: Rng::fork(seed, 23),
            creates: BTreeMap::new(),
            heard: BTreeMap::new(),
            pending: BTreeSet::new(),
            deleted_absent: BTreeSet::new(),
            owner_deletes: BTreeMap::new(),
        }
    }

    /// A create of `name` goes out as request `req`.
    pub(super) fn create_sent(&mut self, req: u64, name: &str) {
        self.creates.insert(req, name.to_owned());
    }

    /// Whether the owner of retained machine `key` (absent, its create
    /// refused or never sent) deletes it rather than waiting for the
    /// operator (drawn once per machine).
    pub(super) fn owner_deletes(&mut self, key: &RecordKey) -> bool {
        if let Some(d) = self.owner_deletes.get(key) {
            return *d;
        }
        let d = self.rng.chance(500);
        self.owner_deletes.insert(key.clone(), d);
        d
    }

    /// The owner asked to delete `name`, whose absence is recorded.
    pub(super) fn delete_asked(&mut self, name: &str) {
        self.deleted_absent.insert(name.to_owned());
    }

    /// Whether a delete of `name` would break the "no worker call" rule.
    pub(super) fn delete_forbidden(&self, name: &str) -> bool {
        self.deleted_absent.contains(name)
    }
}

impl Sim {
    /// A worker answer to request `req` is handed to host `h`: a create's
    /// refusal is definite (it settles the create at the worker) and is
    /// remembered with its hearer.
    pub(super) fn note_create_reply(&mut self, h: usize, req: u64, r: &Result<Reply, Error>) {
        let Some(name) = self.refusals.creates.remove(&req) else {
            return;
        };
        if let Err(e) = r
            && Create::refused(e)
        {
            self.worker.settle(req);
            *self.files.counts.entry("create_refused").or_insert(0) += 1;
            self.log(format!(
                "{} hears the refusal of create {name}",
                Self::owner(h)
            ));
            self.refusals.pending.insert(name.clone());
            self.refusals.heard.insert(name, h);
        }
    }

    /// The answer to a terminal's image preflight (`TermOutput::Inspect`),
    /// as core's verdict on the machine as the worker shows it now (the
    /// inspect mutates nothing). Planted `ImagelessAdmitted`: every machine
    /// is taken for a plain image machine.
    pub(super) fn terminal_image_verdict(&self, machine: &str) -> Result<(), Error> {
        if self.opts.bug == Some(Bug::ImagelessAdmitted) {
            return Ok(());
        }
        let check = ImageCheck::new(
            &Profile::known(Version::V1_9_2),
            machine,
            Operation::TerminalOpen,
        )?;
        let observed = match self.worker.machine_view(machine) {
            Some(v) => Ok(self.observation(&v)),
            None => Err(Error::not_found(
                Operation::Get,
                Evidence::NotDispatched,
                Reason::MachineNotFound,
            )),
        };
        check.admit(observed)
    }

    /// A slot command or terminal `key` on retained machine `m` was refused
    /// at acceptance: when the refusal is the image rule's, nothing of it
    /// is stored and it holds no slot; the caller moves on to its next job
    /// (the refusal is definite). `true` when it was the image rule's.
    pub(super) fn on_slot_refusal(&mut self, m: usize, key: &RecordKey, e: &Error) -> bool {
        if e.reason() != Reason::NeedsPlainImageMachine {
            return false;
        }
        let probe = if key.id.starts_with('t') {
            "imageless_refused_terminal"
        } else {
            "imageless_refused_launch"
        };
        *self.files.counts.entry(probe).or_insert(0) += 1;
        if e.category() != Category::UnsupportedCapability
            || e.evidence() != Evidence::NotDispatched
        {
            self.violation(format!(
                "{}/{}: refused for an imageless machine as {}:{} (unsupported_capability, not_dispatched expected)",
                key.scope,
                key.id,
                e.category().as_str(),
                e.evidence().as_str()
            ));
        }
        if self.model.last(key).is_some() {
            self.violation(format!(
                "{}/{}: refused for an imageless machine, yet its record was stored (a refusal at acceptance stores nothing)",
                key.scope, key.id
            ));
        }
        let machine = self.ret.machines[m].key.clone();
        let holds = self
            .slot_model
            .last(&machine)
            .is_some_and(|r| r.active_execution.as_ref() == Some(key));
        if holds {
            self.violation(format!(
                "{}/{}: refused for an imageless machine, yet it holds the slot of {}",
                key.scope, key.id, machine.id
            ));
        }
        self.job_refused(key);
        true
    }

    /// The owner of retained machine `m` (record `r`) deletes it when its
    /// create made nothing (`unknown`, no creation evidence, absence
    /// recorded, no operation) and the seeded choice says so: the delete
    /// settles `deleted` without a worker call. `true` when it asked.
    pub(super) fn owner_deletes_absent(
        &mut self,
        h: usize,
        m: usize,
        r: &smolbox_core::managed::record::MachineRecord,
    ) -> bool {
        let absent = r.state == MachineRecordState::Unknown
            && r.creation.is_none()
            && r.absence_at_ms.is_some()
            && r.operation == MachineOperation::None;
        if !absent || !self.refusals.owner_deletes(&r.key) {
            return false;
        }
        if let Some(a) = &r.assignment {
            self.refusals.delete_asked(&a.machine_name);
        }
        *self.files.counts.entry("owner_deletes_absent").or_insert(0) += 1;
        let op = MachineOperation::Delete;
        self.request(
            h,
            m,
            super::retained::What::Lifecycle(op),
            MachineRequest::Lifecycle {
                key: r.key.clone(),
                action: op,
                version: r.version,
            },
        );
        true
    }

    /// The commits of a step: the hearer's first write of a record whose
    /// create it heard refused records a create that made nothing
    /// (disposable: `failed` / `not_dispatched`, absence recorded, cleanup
    /// `complete`; retained: `unknown`, absence recorded). Claims are
    /// skipped (a write may need a fresh claim first); another
    /// controller's writes are not the hearer's decision.
    pub(super) fn check_refusal_commits(&mut self, commits: &[Commit], mcommits: &[MachineCommit]) {
        if self.refusals.heard.is_empty() {
            return;
        }
        let name_of = |a: Option<&str>| a.map(str::to_owned);
        let exec = commits.iter().map(|c| {
            let r = &c.record;
            let name = name_of(r.assignment.as_ref().map(|a| a.machine_name.as_str()));
            Written {
                write: c.kind == CommitKind::Write,
                owner: c.owner.clone(),
                ok: r.state == ExecState::Failed
                    && r.evidence == RecordEvidence::NotDispatched
                    && r.creation.is_none()
                    && r.absence_at_ms.is_some()
                    && r.cleanup == Cleanup::Complete,
                probe: "create_refused_failed",
                what: format!(
                    "{}/{}: the worker refused the create of {}, yet its hearer wrote {} / {:?}, absence {:?}, cleanup {:?} (a refused create made nothing: failed, not_dispatched, absence recorded, cleanup complete)",
                    r.key.scope, r.key.id, name.as_deref().unwrap_or_default(), r.state.as_str(), r.evidence, r.absence_at_ms, r.cleanup
                ),
                name,
            }
        });
        let machine = mcommits.iter().map(|c| {
            let r = &c.record;
            let name = name_of(r.assignment.as_ref().map(|a| a.machine_name.as_str()));
            Written {
                write: c.kind == MachineCommitKind::Write,
                owner: c.owner.clone(),
                ok: r.state == MachineRecordState::Unknown
                    && r.creation.is_none()
                    && r.absence_at_ms.is_some()
                    && r.operation == MachineOperation::None,
                probe: "create_refused_absent",
                what: format!(
                    "{}/{}: the worker refused the create of {}, yet its hearer wrote {} with {:?}, creation {}, absence {:?} (a refused create made nothing: unknown with absence recorded)",
                    r.key.scope, r.key.id, name.as_deref().unwrap_or_default(), r.state.as_str(), r.operation, r.creation.is_some(), r.absence_at_ms
                ),
                name,
            }
        });
        let written: Vec<Written> = exec.chain(machine).collect();
        for w in written {
            if !w.write || !self.hearers_write(w.owner.as_deref(), w.name.as_deref()) {
                continue;
            }
            if w.ok {
                *self.files.counts.entry(w.probe).or_insert(0) += 1;
            } else {
                self.violation(w.what);
            }
        }
    }

    /// Whether a write by `owner` of machine `name`'s record is the first
    /// since that owner heard the refusal of `name`'s create (then no
    /// longer pending).
    fn hearers_write(&mut self, owner: Option<&str>, name: Option<&str>) -> bool {
        let Some(name) = name else {
            return false;
        };
        let Some(h) = self.refusals.heard.get(name).copied() else {
            return false;
        };
        owner == Some(Self::owner(h).as_str()) && self.refusals.pending.remove(name)
    }

    /// End of seed: no machine exists under a refused name, and a record
    /// whose refused create's absence is recorded has its reservation
    /// released (the release is its own step after the absence; any
    /// controller's due scan makes it within the quiescent window).
    pub(super) fn check_refused_creates(&mut self) {
        // The owner's delete of a machine whose create made nothing
        // settles it `deleted` (without a worker call).
        let asked: Vec<_> = self
            .slot_model
            .all()
            .filter(|r| {
                r.assignment
                    .as_ref()
                    .is_some_and(|a| self.refusals.delete_forbidden(&a.machine_name))
                    && r.state != MachineRecordState::Deleted
            })
            .map(|r| (r.key.clone(), r.state.as_str(), r.last_error.clone()))
            .collect();
        for (key, state, last) in asked {
            self.violation(format!(
                "{}/{}: its owner asked to delete it with its absence recorded, yet it is {state} at the end (last error {:?})",
                key.scope,
                key.id,
                last.map(|e| e.reason)
            ));
        }
        let names: Vec<String> = self.refusals.heard.keys().cloned().collect();
        for name in names {
            if self.worker.has_machine(&name) {
                self.violation(format!(
                    "machine {name} exists although the worker refused its create (a refused create is never resent)"
                ));
            }
            let keys: Vec<RecordKey> = self.jobs.iter().map(|j| j.key.clone()).collect();
            for key in keys {
                let Ok(r) = self.store.inner().fetch(&key) else {
                    continue;
                };
                if r.assignment.as_ref().is_none_or(|a| a.machine_name != name)
                    || r.absence_at_ms.is_none()
                {
                    continue;
                }
                if r.reservation.is_some() {
                    self.violation(format!(
                        "{}/{}: the worker refused the create of {name} and its absence is recorded, yet the reservation is kept at the end (released after the definite refusal)",
                        key.scope, key.id
                    ));
                } else {
                    *self
                        .files
                        .counts
                        .entry("create_refused_released")
                        .or_insert(0) += 1;
                }
            }
        }
    }
}
