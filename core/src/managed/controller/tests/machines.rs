//! Retained machines, the command slot and quiescent resolution through
//! the controller (C14, C17.3), over the test store running the same pure
//! rules as every adapter.

use super::*;
use crate::Reason;
use crate::managed::RetainedMachineSpec;
use crate::managed::claim::Guard;
use crate::managed::patch::apply_machine;
use crate::managed::record::Resources;
use crate::managed::slot;
use crate::managed::state::MachinePhase;
use crate::managed::state::{MachineOperation as Op, MachineRecordState as MS};
use crate::{Category, Evidence};

impl TestStore {
    #[allow(clippy::too_many_lines)]
    pub(super) fn apply_machine_op(&mut self, op: &StoreOp) -> StoreResult {
        let absent = || {
            Error::not_found(
                Operation::StoreFetch,
                Evidence::Unknown,
                Reason::Unspecified,
            )
        };
        let guard_ok = |store: &Self, m: &MachineRecord, guard: &Guard, now_ms: u64| {
            let lease = m
                .assignment
                .as_ref()
                .and_then(|a| store.leases.get(&a.worker_id));
            claim::check_guard(
                Fence::of_machine(m),
                guard,
                lease,
                now_ms,
                Operation::StoreWrite,
            )
        };
        match op {
            StoreOp::AcceptMachine { record, .. } => match self.machines.get(&record.key) {
                Some(m) if m.fingerprint == record.fingerprint => Ok(StoreReply::MachineAccepted {
                    record: m.clone(),
                    existing: true,
                }),
                Some(_) => Err(Error::identity_conflict(
                    Operation::StoreAccept,
                    Evidence::NotDispatched,
                    Reason::Unspecified,
                )),
                None => {
                    self.machines.insert(record.key.clone(), (**record).clone());
                    Ok(StoreReply::MachineAccepted {
                        record: (**record).clone(),
                        existing: false,
                    })
                }
            },
            StoreOp::FetchMachine { key } => self
                .machines
                .get(key)
                .cloned()
                .map(StoreReply::Machine)
                .ok_or_else(absent),
            StoreOp::ClaimMachine {
                key,
                owner,
                now_ms,
                ttl_ms,
            } => {
                let m = self.machines.get(key).ok_or_else(absent)?;
                let next = claim::claim_machine(m, owner, *now_ms, *ttl_ms)?;
                self.machines.insert(key.clone(), next.clone());
                Ok(StoreReply::Machine(next))
            }
            StoreOp::ClaimMachineVersion {
                key,
                owner,
                version,
                now_ms,
                ttl_ms,
            } => {
                let m = self.machines.get(key).ok_or_else(absent)?;
                let lease = m
                    .assignment
                    .as_ref()
                    .and_then(|a| self.leases.get(&a.worker_id));
                let next =
                    claim::claim_machine_version(m, owner, *version, lease, *now_ms, *ttl_ms)?;
                self.machines.insert(key.clone(), next.clone());
                Ok(StoreReply::Machine(next))
            }
            StoreOp::WriteMachine {
                key,
                guard,
                patch,
                now_ms,
            } => {
                let m = self.machines.get(key).ok_or_else(absent)?;
                guard_ok(self, m, guard, *now_ms)?;
                let next = apply_machine(m, patch, *now_ms)?;
                self.machines.insert(key.clone(), next.clone());
                Ok(StoreReply::Machine(next))
            }
            StoreOp::ReserveMachine {
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
                let m = self.machines.get(key).ok_or_else(absent)?;
                guard_ok(self, m, guard, *now_ms)?;
                let on_worker = |a: Option<&crate::managed::record::Assignment>| {
                    a.is_some_and(|a| a.worker_id == reservation.worker_id)
                };
                let used = self
                    .machines
                    .values()
                    .filter(|x| on_worker(x.assignment.as_ref()))
                    .filter_map(|x| x.reservation)
                    .chain(
                        self.records
                            .values()
                            .filter(|x| on_worker(x.assignment.as_ref()))
                            .filter_map(|x| x.reservation),
                    )
                    .fold(Resources::default(), Resources::plus);
                if !used.plus(reservation.capacity).fits(reservation.limit) {
                    return Err(Error::admission_exhausted(
                        Operation::StoreReserve,
                        Reason::WorkerCapacity,
                    ));
                }
                let ports: Vec<u16> = m.spec.ports.iter().map(|p| p.host).collect();
                let taken = self.machines.values().any(|x| {
                    on_worker(x.assignment.as_ref())
                        && x.reserved_ports.iter().any(|p| ports.contains(p))
                });
                if taken {
                    return Err(Error::port_conflict(
                        Operation::StoreReserve,
                        Evidence::NotDispatched,
                        Reason::HostPortTaken,
                    ));
                }
                let mut next = m.clone();
                next.assignment = Some(crate::managed::record::Assignment {
                    worker_id: reservation.worker_id.clone(),
                    worker_generation: lease.generation,
                    machine_name: reservation.machine_name.clone(),
                });
                next.reservation = Some(reservation.capacity);
                next.reserved_ports = ports;
                next.version += 1;
                next.updated_at_ms = *now_ms;
                next.validate()?;
                self.machines.insert(key.clone(), next.clone());
                Ok(StoreReply::Machine(next))
            }
            StoreOp::RequestMachine {
                key,
                action,
                version,
                now_ms,
            } => {
                let m = self.machines.get(key).ok_or_else(absent)?;
                match slot::request(m, *action, *version, *now_ms)? {
                    None => Ok(StoreReply::Machine(m.clone())),
                    Some(next) => {
                        self.machines.insert(key.clone(), next.clone());
                        Ok(StoreReply::Machine(next))
                    }
                }
            }
            StoreOp::SubmitCommand { record, .. } | StoreOp::SubmitDispatching { record, .. } => {
                let intent = matches!(op, StoreOp::SubmitDispatching { .. });
                let mkey = record.spec.machine.clone().ok_or_else(absent)?;
                if let Some(e) = self.records.get(&record.key) {
                    return if e.fingerprint == record.fingerprint {
                        Ok(StoreReply::Submitted {
                            execution: e.clone(),
                            machine: self.machines.get(&mkey).cloned(),
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
                let m = self.machines.get(&mkey).ok_or_else(absent)?;
                let now = record.accepted_at_ms.max(m.updated_at_ms);
                let held = if intent {
                    slot::acquire_claimed(m, record, now)?
                } else {
                    slot::acquire(m, record, now)?
                };
                let inserted = if intent {
                    crate::managed::patch::intent_at_accept(record)?
                } else {
                    (**record).clone()
                };
                self.commits += 1;
                self.records.insert(record.key.clone(), inserted.clone());
                self.machines.insert(mkey, held.clone());
                Ok(StoreReply::Submitted {
                    execution: inserted,
                    machine: Some(held),
                    existing: false,
                })
            }
            StoreOp::FinishCommand {
                machine,
                guard,
                exec,
                now_ms,
            } => {
                let m = self.machines.get(machine).ok_or_else(absent)?;
                guard_ok(self, m, guard, *now_ms)?;
                let e = self.records.get(exec).ok_or_else(absent)?;
                let (next, command, finish) = slot::finish_command(m, e, *now_ms)?;
                self.commits += 1;
                self.machines.insert(machine.clone(), next.clone());
                self.records.insert(exec.clone(), command.clone());
                Ok(StoreReply::SlotFinished {
                    machine: next,
                    execution: command,
                    finish,
                })
            }
            StoreOp::ResolveMachine {
                key,
                version,
                quiesced,
                disposition,
                now_ms,
            } => {
                let m = self.machines.get(key).ok_or_else(absent)?;
                let command = m
                    .active_execution
                    .as_ref()
                    .and_then(|k| self.records.get(k));
                let (next, settled) =
                    slot::resolve(m, command, *version, *quiesced, disposition, *now_ms)?;
                self.machines.insert(key.clone(), next.clone());
                if let Some(c) = &settled {
                    self.records.insert(c.key.clone(), c.clone());
                }
                Ok(StoreReply::Resolved {
                    machine: next,
                    command: settled,
                })
            }
            StoreOp::DueMachines { now_ms, limit, .. } => {
                let mut due: Vec<_> = self
                    .machines
                    .values()
                    .filter(|r| r.next_due_at_ms.is_some_and(|d| d <= *now_ms))
                    .cloned()
                    .collect();
                due.truncate(*limit as usize);
                Ok(StoreReply::DueMachines {
                    records: due,
                    next: None,
                })
            }
            _ => Err(Error::protocol(
                Operation::StoreFetch,
                Reason::StoreCapability,
            )),
        }
    }
}

pub(super) fn mkey() -> RecordKey {
    RecordKey::new("s", "box-1").unwrap()
}

pub(super) fn mspec() -> RetainedMachineSpec {
    let t = RunTarget::unverified();
    RetainedMachineSpec {
        artifact: t.artifact,
        profile: t.profile,
        ports: Vec::new(),
        workload: None,
        checkpointable: false,
        network: None,
        guest_paths: None,
    }
}

fn machine_name() -> String {
    super::super::machines::machine_name_for(&mkey())
}

impl Sim {
    pub(super) fn request(&mut self, r: MachineRequest) -> Result<MachineAnswer, Error> {
        let id = self.ctl.machine(self.now, self.now_ms, r)?;
        self.settle();
        self.answer_of(id)
    }

    /// Starts a request whose answer needs worker answers first.
    fn request_async(&mut self, r: MachineRequest) -> RequestId {
        let id = self.ctl.machine(self.now, self.now_ms, r).unwrap();
        self.settle();
        id
    }

    pub(super) fn answer_of(&self, id: RequestId) -> Result<MachineAnswer, Error> {
        self.events
            .iter()
            .find_map(|e| match e {
                ControllerEvent::Machine(d) if d.id == id => Some(d.result.clone()),
                _ => None,
            })
            .expect("the request was answered")
    }

    pub(super) fn machine(&self) -> &MachineRecord {
        &self.store.machines[&mkey()]
    }

    fn lifecycle(&mut self, action: Op) -> Result<MachineAnswer, Error> {
        let version = self.machine().version;
        self.request(MachineRequest::Lifecycle {
            key: mkey(),
            action,
            version,
        })
    }

    /// Creates and starts the machine, answering the worker.
    pub(super) fn running_machine(&mut self) {
        self.settle();
        self.request(MachineRequest::Create {
            key: mkey(),
            spec: mspec(),
        })
        .unwrap();
        self.settle();
        self.answer(
            "create",
            Ok(WorkerReply::Machine(obs(MachineState::Created))),
        );
        assert_eq!(self.machine().state, MS::Created);
        self.lifecycle(Op::Start).unwrap();
        self.answer(
            "start",
            Ok(WorkerReply::Machine(obs(MachineState::Running))),
        );
        assert_eq!(self.machine().state, MS::Running);
        assert_eq!(self.machine().operation, Op::None);
    }

    pub(super) fn submit_to_slot(
        &mut self,
        id: &str,
        command: &Command,
    ) -> Result<MachineAnswer, Error> {
        self.submit_files_to_slot(id, command, &crate::managed::CommandFiles::default())
    }

    pub(super) fn submit_files_to_slot(
        &mut self,
        id: &str,
        command: &Command,
        files: &crate::managed::CommandFiles,
    ) -> Result<MachineAnswer, Error> {
        self.request(MachineRequest::Submit {
            machine: mkey(),
            key: RecordKey::new("s", id).unwrap(),
            command: command.clone(),
            files: files.clone(),
        })
    }
}

fn obs(state: MachineState) -> Box<Observation> {
    observation(&machine_name(), state, 1_700_000_000)
}

#[test]
fn create_persists_the_intent_before_the_create_and_records_evidence_before_use() {
    let mut s = Sim::new(disposable_config());
    s.settle();
    let a = s
        .request(MachineRequest::Create {
            key: mkey(),
            spec: mspec(),
        })
        .unwrap();
    assert!(matches!(
        a,
        MachineAnswer::Machine {
            existing: false,
            ..
        }
    ));
    s.settle();
    // The create is out only once the intent (creating / create dispatching)
    // and the reservation are stored.
    assert_eq!(s.worker.len(), 1, "{:?}", s.worker);
    let m = s.machine().clone();
    assert_eq!(
        (m.state, m.operation, m.phase),
        (MS::Creating, Op::Create, MachinePhase::Dispatching)
    );
    assert!(m.reservation.is_some() && m.assignment.is_some());
    assert!(m.creation.is_none());
    let op = s.answer(
        "create",
        Ok(WorkerReply::Machine(obs(MachineState::Created))),
    );
    assert!(matches!(op, WorkerOp::Create { name, .. } if name.as_str() == machine_name()));
    let m = s.machine().clone();
    assert_eq!((m.state, m.operation), (MS::Created, Op::None));
    assert!(m.creation.is_some());
    assert_eq!(m.next_due_at_ms, None);
    // A duplicate create returns the same record; a changed spec conflicts.
    let again = s
        .request(MachineRequest::Create {
            key: mkey(),
            spec: mspec(),
        })
        .unwrap();
    assert!(
        matches!(again, MachineAnswer::Machine { existing: true, ref record } if record.key == mkey())
    );
    let mut other = mspec();
    other.checkpointable = true;
    let e = s
        .request(MachineRequest::Create {
            key: mkey(),
            spec: other,
        })
        .unwrap_err();
    assert_eq!(e.category(), Category::IdentityConflict);
    assert!(s.worker.is_empty(), "no second create");
}

#[test]
fn versioned_requests_repeat_return_current_and_superseded_are_stale() {
    let mut s = Sim::new(disposable_config());
    s.running_machine();
    let v = s.machine().version;
    let stop = MachineRequest::Lifecycle {
        key: mkey(),
        action: Op::Stop,
        version: v,
    };
    let first = s.request(stop.clone()).unwrap();
    // Verify (inspect) comes before the stop.
    s.answer(
        "inspect",
        Ok(WorkerReply::Machine(obs(MachineState::Running))),
    );
    s.answer("stop", Ok(WorkerReply::Machine(obs(MachineState::Stopped))));
    assert_eq!(s.machine().state, MS::Stopped);
    // The latest identical (action, version) returns the current record.
    let MachineAnswer::Machine { record, .. } = s.request(stop).unwrap() else {
        panic!("not a machine answer");
    };
    assert_eq!(record.version, s.machine().version);
    assert!(s.worker.is_empty(), "a repeat sends nothing");
    let MachineAnswer::Machine { record: r1, .. } = first else {
        panic!()
    };
    assert_eq!(r1.operation, Op::Stop);
    // A superseded version is stale.
    let e = s
        .request(MachineRequest::Lifecycle {
            key: mkey(),
            action: Op::Start,
            version: v,
        })
        .unwrap_err();
    assert_eq!(e.category(), Category::StaleVersion);
}

/// Issue 16: a buffered command in a retained machine's slot takes three
/// commits (nine before) — the submission with the slot, the machine claim,
/// the command's claim and its dispatch intent; the result with `completed`
/// (nothing to collect); the slot finish — and the exec is sent only after
/// the first one is durable.
#[test]
fn a_command_in_a_retained_slot_takes_three_commits() {
    let mut s = Sim::new(disposable_config());
    s.running_machine();
    let from = s.store_log.len();
    let a = s.submit_to_slot("c3", &cmd()).unwrap();
    assert!(matches!(
        a,
        MachineAnswer::Submitted {
            existing: false,
            ..
        }
    ));
    let c3 = RecordKey::new("s", "c3").unwrap();
    assert_eq!(s.record(&c3).state, ExecState::Dispatching);
    s.answer("exec", exited(0, "hi"));
    let rec = s.record(&c3).clone();
    assert_eq!(rec.state, ExecState::Completed);
    assert_eq!(rec.cleanup, Cleanup::Complete);
    assert!(s.machine().active_execution.is_none());
    let writes: Vec<&str> = s.store_log[from..]
        .iter()
        .map(StoreOp::name)
        .filter(|n| !n.starts_with("fetch") && !n.starts_with("due"))
        .collect();
    assert_eq!(
        writes,
        ["submit_dispatching", "write_steps", "finish_command"],
        "the command's commits"
    );
}

#[test]
fn the_slot_takes_one_command_and_stop_is_rejected_while_it_runs() {
    let mut s = Sim::new(disposable_config());
    s.running_machine();
    let a = s.submit_to_slot("c1", &cmd()).unwrap();
    let MachineAnswer::Submitted {
        existing: false, ..
    } = a
    else {
        panic!("{a:?}")
    };
    let c1 = RecordKey::new("s", "c1").unwrap();
    assert_eq!(s.machine().active_execution, Some(c1.clone()));
    // No queue: another submission is refused, nothing stored.
    let e = s.submit_to_slot("c2", &cmd()).unwrap_err();
    assert_eq!(e.category(), Category::AdmissionExhausted);
    assert!(
        !s.store
            .records
            .contains_key(&RecordKey::new("s", "c2").unwrap())
    );
    // AC-14.3.1: stop/delete while the command is active are rejected.
    for action in [Op::Stop, Op::Delete] {
        let e = s.lifecycle(action).unwrap_err();
        assert_eq!(
            (e.category(), e.reason()),
            (Category::AdmissionExhausted, Reason::CommandActive)
        );
    }
    // The exec goes to the machine's worker and name.
    let op = s.answer("exec", exited(0, "hi"));
    assert!(matches!(op, WorkerOp::Exec { machine, .. } if machine == machine_name()));
    let rec = s.record(&c1).clone();
    assert_eq!(rec.state, ExecState::Completed);
    assert_eq!(
        rec.cleanup,
        Cleanup::Complete,
        "set with the slot's release"
    );
    assert_eq!(rec.next_due_at_ms, None);
    assert!(s.machine().active_execution.is_none());
    let f = s.finished(&c1).expect("notice after the slot finish");
    assert_eq!(
        f.output.as_ref().map(|o| o.stdout.clone()),
        Some(b"hi".to_vec())
    );
    // The next command runs.
    s.submit_to_slot("c2", &cmd()).unwrap();
    s.answer("exec", exited(3, ""));
    assert!(s.machine().active_execution.is_none());
}

#[test]
fn an_unknown_command_keeps_the_slot_until_a_quiescent_resolution() {
    let mut s = Sim::new(disposable_config());
    s.running_machine();
    s.submit_to_slot("c1", &cmd()).unwrap();
    let uncertain = Error::transport(
        Operation::Exec,
        Evidence::DispatchUncertain,
        Reason::Unspecified,
    );
    s.answer("exec", Err(uncertain));
    let c1 = RecordKey::new("s", "c1").unwrap();
    assert_eq!(s.record(&c1).state, ExecState::Unknown);
    assert_eq!(s.record(&c1).cleanup, Cleanup::Failed);
    assert_eq!(s.machine().state, MS::Unknown);
    assert_eq!(
        s.machine().active_execution,
        Some(c1.clone()),
        "the slot is kept"
    );
    assert_eq!(
        s.submit_to_slot("c2", &cmd()).unwrap_err().category(),
        Category::AdmissionExhausted
    );
    // AC-17.3.1: without quiesced = true → rejected before anything.
    let v = s.machine().version;
    let e = s
        .ctl
        .machine(
            s.now,
            s.now_ms,
            MachineRequest::Resolve {
                key: mkey(),
                version: v,
                quiesced: false,
                disposition: Resolution::Stopped,
            },
        )
        .unwrap_err();
    assert_eq!(e.reason(), Reason::NotQuiesced);
    assert!(s.ctl.poll_store_op().is_none());
    // An ownership-verified stop for draining keeps the slot.
    let id = s
        .ctl
        .machine(
            s.now,
            s.now_ms,
            MachineRequest::StopForDrain {
                key: mkey(),
                version: v,
            },
        )
        .unwrap();
    s.settle();
    s.answer(
        "inspect",
        Ok(WorkerReply::Machine(obs(MachineState::Running))),
    );
    assert!(
        s.machine()
            .last_error
            .as_ref()
            .is_some_and(|e| e.reason == "drain_stop_intent"),
        "the stop intent is durable before the stop"
    );
    s.answer("stop", Ok(WorkerReply::Machine(obs(MachineState::Stopped))));
    s.answer(
        "inspect",
        Ok(WorkerReply::Machine(obs(MachineState::Stopped))),
    );
    let MachineAnswer::Machine { record, .. } = s.answer_of(id).unwrap() else {
        panic!("not a machine answer")
    };
    assert_eq!(
        record.active_execution,
        Some(c1.clone()),
        "drain keeps the slot"
    );
    assert_eq!(
        record.observation.as_ref().map(|o| o.state),
        Some(MS::Stopped)
    );
    // AC-17.3.2: a running incarnation → identity_conflict, nothing changes.
    let resolve = |version| MachineRequest::Resolve {
        key: mkey(),
        version,
        quiesced: true,
        disposition: Resolution::Stopped,
    };
    let v = s.machine().version;
    let id = s.ctl.machine(s.now, s.now_ms, resolve(v)).unwrap();
    s.settle();
    s.answer(
        "inspect",
        Ok(WorkerReply::Machine(obs(MachineState::Running))),
    );
    let e = s.answer_of(id).unwrap_err();
    assert_eq!(e.category(), Category::IdentityConflict);
    assert_eq!(s.machine().version, v, "nothing changed");
    // A worker outage changes nothing either (AC-17.3.3).
    let id = s.ctl.machine(s.now, s.now_ms, resolve(v)).unwrap();
    s.settle();
    let outage = Error::transport(Operation::Get, Evidence::Unknown, Reason::Unspecified);
    s.answer("inspect", Err(outage));
    assert_eq!(s.answer_of(id).unwrap_err().category(), Category::Transport);
    assert_eq!(s.machine().version, v);
    // A different incarnation → identity_conflict.
    let id = s.ctl.machine(s.now, s.now_ms, resolve(v)).unwrap();
    s.settle();
    let other = observation(&machine_name(), MachineState::Stopped, 1_700_000_999);
    s.answer("inspect", Ok(WorkerReply::Machine(other)));
    assert_eq!(
        s.answer_of(id).unwrap_err().reason(),
        Reason::IncarnationMismatch
    );
    // Stopped, same incarnation: the slot is cleared, the command stays unknown.
    let id = s.ctl.machine(s.now, s.now_ms, resolve(v)).unwrap();
    s.settle();
    s.answer(
        "inspect",
        Ok(WorkerReply::Machine(obs(MachineState::Stopped))),
    );
    let MachineAnswer::Resolved { machine, command } = s.answer_of(id).unwrap() else {
        panic!("not resolved")
    };
    assert!(machine.active_execution.is_none());
    assert_eq!(machine.state, MS::Stopped);
    let command = command.unwrap();
    assert_eq!(
        (command.state, command.result.clone()),
        (ExecState::Unknown, None)
    );
    // Deleted: verify the 404; no mutation is sent.
    let v = s.machine().version;
    let id = s
        .ctl
        .machine(
            s.now,
            s.now_ms,
            MachineRequest::Resolve {
                key: mkey(),
                version: v,
                quiesced: true,
                disposition: Resolution::Deleted,
            },
        )
        .unwrap();
    s.settle();
    s.answer(
        "inspect",
        Ok(WorkerReply::Machine(obs(MachineState::Stopped))),
    );
    assert_eq!(s.answer_of(id).unwrap_err().reason(), Reason::Present);
    let id = s
        .ctl
        .machine(
            s.now,
            s.now_ms,
            MachineRequest::Resolve {
                key: mkey(),
                version: v,
                quiesced: true,
                disposition: Resolution::Deleted,
            },
        )
        .unwrap();
    s.settle();
    s.answer("inspect", Err(not_found()));
    assert!(s.answer_of(id).is_ok());
    assert!(s.worker.is_empty(), "no mutation sent");
    let m = s.machine();
    assert_eq!(m.state, MS::Deleted);
    assert!(m.reservation.is_none() && m.absence_at_ms.is_some());
}

#[test]
fn delete_verifies_the_incarnation_then_waits_for_the_404_before_release() {
    let mut s = Sim::new(disposable_config());
    s.running_machine();
    s.lifecycle(Op::Delete).unwrap();
    // A different incarnation under the name is never deleted.
    let other = observation(&machine_name(), MachineState::Running, 1_700_000_999);
    s.answer("inspect", Ok(WorkerReply::Machine(other)));
    assert!(s.worker.is_empty());
    assert_eq!(s.machine().operation, Op::None);
    assert!(s.machine().reservation.is_some());
    s.lifecycle(Op::Delete).unwrap();
    s.answer(
        "inspect",
        Ok(WorkerReply::Machine(obs(MachineState::Running))),
    );
    assert_eq!(s.machine().state, MS::Deleting, "intent before the delete");
    s.answer("delete", Ok(WorkerReply::Deleted));
    assert!(s.machine().reservation.is_some(), "kept until the 404");
    s.answer("inspect", Err(not_found()));
    let m = s.machine();
    assert_eq!(m.state, MS::Deleted);
    assert!(m.reservation.is_none() && m.absence_at_ms.is_some());
}

#[test]
fn an_observation_is_not_written_when_the_record_changed_since_it_began() {
    let mut s = Sim::new(disposable_config());
    s.running_machine();
    let id = s
        .ctl
        .machine(s.now, s.now_ms, MachineRequest::Reconcile { key: mkey() })
        .unwrap();
    s.settle();
    // While the inspect is out, a command takes the slot (another
    // controller's submit through the shared store).
    let before = s.machine().clone();
    let mut changed = before.clone();
    changed.active_execution = Some(RecordKey::new("s", "other").unwrap());
    changed.version += 1;
    s.store.machines.insert(mkey(), changed.clone());
    s.answer(
        "inspect",
        Ok(WorkerReply::Machine(obs(MachineState::Stopped))),
    );
    let e = s.answer_of(id).unwrap_err();
    assert_eq!(e.category(), Category::StaleVersion);
    assert_eq!(s.machine(), &changed, "nothing written");
}

#[test]
fn a_create_intent_found_after_a_crash_is_never_sent_again() {
    let mut s = create_out();
    assert_eq!(s.worker.len(), 1);
    // The controller dies with the create out; a new one (another owner)
    // recovers from the store after the claim lapsed.
    let store = std::mem::take(&mut s.store);
    let mut cfg = disposable_config();
    cfg.owner = "ctl-test-2".into();
    let mut t = Sim::new(cfg);
    t.store = store;
    t.now_ms = s.now_ms;
    t.advance(5_000);
    assert!(t.worker.is_empty(), "no second create: {:?}", t.worker);
    let m = &t.store.machines[&mkey()];
    assert_eq!((m.state, m.phase), (MS::Unknown, MachinePhase::Uncertain));
    assert!(m.reservation.is_some(), "the reservation stays");
}

/// A new controller (another owner, after the first one's claims lapsed)
/// over what the first left in the store.
pub(super) fn successor(s: &mut Sim) -> Sim {
    let store = std::mem::take(&mut s.store);
    let mut cfg = disposable_config();
    cfg.owner = "ctl-test-2".into();
    let mut t = Sim::new(cfg);
    t.store = store;
    t.now_ms = s.now_ms;
    t
}

#[test]
fn recovery_marks_a_dispatched_command_unknown_keeps_the_slot_and_sends_nothing() {
    let mut s = Sim::new(disposable_config());
    s.running_machine();
    s.submit_to_slot("c1", &cmd()).unwrap();
    let c1 = RecordKey::new("s", "c1").unwrap();
    assert_eq!(s.record(&c1).state, ExecState::Dispatching);
    assert_eq!(s.worker.len(), 1, "the exec is out");
    // The controller dies with the exec out.
    let mut t = successor(&mut s);
    t.advance(5_000);
    assert!(t.worker.is_empty(), "never re-sent: {:?}", t.worker);
    let rec = t.record(&c1).clone();
    assert_eq!(
        (rec.state, rec.cleanup),
        (ExecState::Unknown, Cleanup::Failed)
    );
    assert_eq!(rec.next_due_at_ms, None, "settled with the slot");
    let m = t.machine().clone();
    assert_eq!(m.state, MS::Unknown);
    assert_eq!(m.active_execution, Some(c1), "the slot stays blocked");
}

#[test]
fn recovery_finishes_the_slot_of_a_recorded_exit_and_keeps_the_exit() {
    let mut s = Sim::new(disposable_config());
    s.running_machine();
    s.submit_to_slot("c1", &cmd()).unwrap();
    s.answer("exec", exited(7, ""));
    let c1 = RecordKey::new("s", "c1").unwrap();
    // Put the store back to "completed, slot not yet finished" (the
    // controller died between the two transactions).
    let done = s.record(&c1).clone();
    assert_eq!(done.state, ExecState::Completed);
    let mut before = done.clone();
    before.cleanup = Cleanup::Pending;
    before.next_due_at_ms = Some(s.now_ms);
    s.store.records.insert(c1.clone(), before);
    let mut m = s.machine().clone();
    m.active_execution = Some(c1.clone());
    m.version += 1;
    s.store.machines.insert(mkey(), m);
    let mut t = successor(&mut s);
    t.advance(5_000);
    assert!(t.worker.is_empty(), "nothing is sent");
    let rec = t.record(&c1).clone();
    assert!(matches!(
        rec.result,
        Some(ExecResult::Exited { exit_code: 7, .. })
    ));
    assert_eq!(
        (rec.state, rec.cleanup),
        (ExecState::Completed, Cleanup::Complete)
    );
    assert!(t.machine().active_execution.is_none(), "released");
    assert_eq!(t.machine().state, MS::Running);
}

#[test]
fn an_unknown_command_stays_due_until_its_slot_is_finished() {
    let mut s = Sim::new(disposable_config());
    s.running_machine();
    s.submit_to_slot("c1", &cmd()).unwrap();
    let c1 = RecordKey::new("s", "c1").unwrap();
    let uncertain = Error::transport(
        Operation::Exec,
        Evidence::DispatchUncertain,
        Reason::Unspecified,
    );
    s.answer("exec", Err(uncertain));
    // The `unknown` write itself keeps the command due (so a crash before
    // the slot finish leaves work for the due scan).
    let unknown_write = s.store_log.iter().find_map(|op| match op {
        StoreOp::Write { key, patch, .. }
            if *key == c1 && patch.state == Some(ExecState::Unknown) =>
        {
            Some(patch.next_due_at_ms)
        }
        _ => None,
    });
    assert!(
        matches!(unknown_write, Some(Some(Some(_)))),
        "{unknown_write:?}"
    );
    // Rewind to "unknown written, slot not finished": the record is due.
    let mut rec = s.record(&c1).clone();
    assert_eq!(rec.state, ExecState::Unknown);
    rec.cleanup = Cleanup::Pending;
    rec.next_due_at_ms = Some(s.now_ms);
    s.store.records.insert(c1.clone(), rec);
    let mut m = s.machine().clone();
    m.state = MS::Running;
    m.version += 1;
    s.store.machines.insert(mkey(), m);
    let mut t = successor(&mut s);
    t.advance(5_000);
    assert!(t.worker.is_empty());
    assert_eq!(t.machine().state, MS::Unknown);
    assert_eq!(t.record(&c1).cleanup, Cleanup::Failed);
    assert_eq!(t.record(&c1).next_due_at_ms, None);
}

#[test]
fn a_command_timeout_is_checked_against_the_budget_at_n_and_n_plus_one() {
    let mut s = Sim::new(disposable_config());
    s.running_machine();
    let budget_s = s.machine().spec.profile.budgets.execution_ms / 1_000;
    let at = |t: u64| Command::new(["true"]).timeout_secs(u32::try_from(t).unwrap());
    let e = s.submit_to_slot("over", &at(budget_s + 1)).unwrap_err();
    assert_eq!(e.reason(), Reason::TimeoutOverBudget);
    s.submit_to_slot("fits", &at(budget_s)).unwrap();
    assert_eq!(
        s.machine().active_execution,
        Some(RecordKey::new("s", "fits").unwrap())
    );
}

#[test]
fn capacity_is_shared_at_n_and_n_plus_one_and_freed_by_a_delete() {
    let mut cfg = disposable_config();
    cfg.workers[0].capacity.slots = 1;
    let mut s = Sim::new(cfg);
    s.running_machine(); // N = 1 reservation fits
    let second = RecordKey::new("s", "box-2").unwrap();
    s.request(MachineRequest::Create {
        key: second.clone(),
        spec: mspec(),
    })
    .unwrap();
    s.settle();
    // N + 1: refused by the store, recorded, nothing sent.
    assert!(s.worker.is_empty(), "{:?}", s.worker);
    let m2 = s.store.machines[&second].clone();
    assert_eq!(m2.state, MS::Accepted);
    assert!(m2.assignment.is_none() && m2.reservation.is_none());
    assert_eq!(
        m2.last_error.as_ref().map(|e| e.category.as_str()),
        Some("admission_exhausted")
    );
    assert!(m2.next_due_at_ms.is_some_and(|d| d > s.now_ms), "due later");
    // Deleting the first frees the slot; the second is created after.
    s.lifecycle(Op::Delete).unwrap();
    s.answer(
        "inspect",
        Ok(WorkerReply::Machine(obs(MachineState::Running))),
    );
    s.answer("delete", Ok(WorkerReply::Deleted));
    s.answer("inspect", Err(not_found()));
    assert_eq!(s.machine().state, MS::Deleted);
    s.advance(2_000);
    let m2 = s.store.machines[&second].clone();
    assert_eq!(m2.state, MS::Creating, "{:?}", m2.last_error);
    assert!(matches!(
        s.worker.first(),
        Some((_, WorkerOp::Create { .. }))
    ));
}

#[test]
fn shutdown_leaves_waiting_machine_work_due_and_stops() {
    let mut s = Sim::new(disposable_config());
    s.settle();
    // Another controller holds the worker lease: the create must wait.
    s.store.leases.insert(
        WORKER.into(),
        Lease {
            owner: "ctl-other".into(),
            generation: 7,
            until_ms: s.now_ms + 600_000,
        },
    );
    s.request(MachineRequest::Create {
        key: mkey(),
        spec: mspec(),
    })
    .unwrap();
    s.advance(500);
    assert!(s.worker.is_empty());
    assert_eq!(s.ctl.machines_active(), 1);
    s.ctl.shutdown(s.now, s.now_ms);
    s.settle();
    assert!(
        s.events
            .iter()
            .any(|e| matches!(e, ControllerEvent::Stopped))
    );
    let m = s.machine();
    assert_eq!(m.state, MS::Accepted);
    assert!(
        m.next_due_at_ms.is_some(),
        "still due for the next controller"
    );
}

#[test]
fn a_due_machine_another_controller_claims_never_takes_the_worker_lease() {
    let mut s = Sim::new(disposable_config());
    s.settle();
    // Another controller accepted and claimed the machine (not yet reserved).
    let fp = fingerprint::machine_fingerprint(&fingerprint_key(), &mspec());
    let rec = MachineRecord::accepted(mkey(), fp, mspec(), s.now_ms).unwrap();
    let claimed = claim::claim_machine(&rec, "ctl-other", s.now_ms, 600_000).unwrap();
    s.store.machines.insert(mkey(), claimed);
    s.advance(1_000);
    assert!(
        !s.store_log
            .iter()
            .any(|op| matches!(op, StoreOp::ClaimWorker { .. })),
        "a stale view took the worker lease"
    );
    assert!(s.store.leases.is_empty());
    assert!(s.worker.is_empty());
    assert_eq!(
        s.machine().claim.as_ref().map(|c| c.owner.as_str()),
        Some("ctl-other")
    );
}

fn owned_by(owner: &str) -> ControllerConfig {
    let mut c = disposable_config();
    c.owner = owner.into();
    c
}

/// Another controller on `s`'s store, `ms` of both clocks later.
fn take_over(s: &mut Sim, owner: &str, ms: u64) -> Sim {
    let mut t = Sim::new(owned_by(owner));
    t.store = std::mem::take(&mut s.store);
    t.now_ms = s.now_ms;
    t.advance(ms);
    t
}

fn machine_refenced(t: &Sim) -> bool {
    t.store_log
        .iter()
        .any(|op| matches!(op, StoreOp::ClaimMachineVersion { key, .. } if *key == mkey()))
}

/// A running retained machine assigned under worker-lease generation 1,
/// whose lease a crashed controller then took (generation 2) and left to
/// lapse: a new controller's first write on it is fenced
/// (`worker_generation`); it takes the worker lease (generation 3),
/// re-fences the machine with `claim_machine_version` at the version it
/// read, and the stop the operator requested (at the version read before
/// any of this) goes through: verified, intent, stop, `stopped`.
#[test]
fn a_machine_left_under_an_older_worker_lease_is_refenced_and_moves_forward() {
    let mut s = Sim::new(disposable_config());
    s.running_machine();
    assert_eq!(
        s.machine().assignment.as_ref().unwrap().worker_generation,
        1
    );
    let operator_read = s.machine().version;
    s.store.leases.insert(
        WORKER.into(),
        Lease {
            owner: "ctl-crashed".into(),
            generation: 2,
            until_ms: s.now_ms + 10,
        },
    );
    let mut t = take_over(&mut s, "ctl-test-3", 5_000);
    let a = t
        .request(MachineRequest::Lifecycle {
            key: mkey(),
            action: Op::Stop,
            version: operator_read,
        })
        .unwrap();
    assert_eq!(a.into_machine().unwrap().0.operation, Op::Stop);
    t.answer(
        "inspect",
        Ok(WorkerReply::Machine(obs(MachineState::Running))),
    );
    assert!(machine_refenced(&t), "{:#?}", t.store_log);
    assert_eq!(t.store.leases[WORKER].generation, 3);
    let m = t.machine().clone();
    assert_eq!(m.assignment.as_ref().unwrap().worker_generation, 3);
    assert_eq!(m.claim.as_ref().unwrap().owner, "ctl-test-3");
    assert_eq!(
        (m.state, m.phase),
        (MS::Stopping, MachinePhase::Dispatching)
    );
    t.answer("stop", Ok(WorkerReply::Machine(obs(MachineState::Stopped))));
    assert_eq!(t.machine().state, MS::Stopped);
    assert_eq!(t.machine().operation, Op::None);
    t.advance(5_000);
    assert!(t.worker.is_empty(), "nothing else sent");
}

/// A controller that already holds the worker lease under a newer
/// generation (it created another machine there) re-fences a machine
/// assigned under the older one with its first claim, before any write:
/// no write on it is refused.
#[test]
fn a_lease_holder_refences_before_writing() {
    let mut s = Sim::new(disposable_config());
    s.running_machine();
    let operator_read = s.machine().version;
    let mut t = take_over(&mut s, "ctl-test-3", 5_000);
    // The new controller takes the worker for another machine first.
    t.request(MachineRequest::Create {
        key: RecordKey::new("s", "box-2").unwrap(),
        spec: mspec(),
    })
    .unwrap();
    assert_eq!(t.store.leases[WORKER].generation, 2);
    // Its create stays unanswered.
    t.worker
        .retain(|(_, op)| !matches!(op, WorkerOp::Create { .. }));
    t.store_log.clear();
    t.request(MachineRequest::Lifecycle {
        key: mkey(),
        action: Op::Stop,
        version: operator_read,
    })
    .unwrap();
    let first_claim = t.store_log.iter().find_map(|op| match op {
        StoreOp::ClaimMachine { key, .. } if *key == mkey() => Some("claim_machine"),
        StoreOp::ClaimMachineVersion { key, .. } if *key == mkey() => Some("claim_machine_version"),
        _ => None,
    });
    assert_eq!(first_claim, Some("claim_machine_version"));
    assert_eq!(
        t.machine().assignment.as_ref().unwrap().worker_generation,
        2
    );
    t.answer(
        "inspect",
        Ok(WorkerReply::Machine(obs(MachineState::Running))),
    );
    t.answer("stop", Ok(WorkerReply::Machine(obs(MachineState::Stopped))));
    assert_eq!(t.machine().state, MS::Stopped);
    let writes = t
        .store_log
        .iter()
        .filter(|op| matches!(op, StoreOp::WriteMachine { key, .. } if *key == mkey()))
        .count();
    assert_eq!(writes, 2, "the intent and the settle, none refused");
}

/// A controller whose retained machine's create is out at the worker.
fn create_out() -> Sim {
    let mut s = Sim::new(disposable_config());
    s.settle();
    s.request(MachineRequest::Create {
        key: mkey(),
        spec: mspec(),
    })
    .unwrap();
    s.settle();
    s
}

mod delete;
mod ports;
mod reads;
mod refence;
mod released;
mod renewal;
mod unconfigured;
mod uncreatable;
