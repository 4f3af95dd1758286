//! The controller's side of retained machines: taking a
//! [`MachineRequest`], routing store and worker answers to the machine
//! tasks and request flows, and the machine due scan. Split from
//! `machines.rs` (a child module).

#[allow(clippy::wildcard_imports)] // the parent's vocabulary, one module
use super::*;

impl crate::managed::controller::Controller {
    /// A retained-machine request (C14.2, C14.3, C17.3). Returns at once
    /// with the request's id; the answer is [`crate::managed::controller::ControllerEvent::Machine`].
    /// Creates and versioned requests answer once durable; the lifecycle
    /// work follows and is driven here (and by any controller's due scan).
    ///
    /// # Errors
    /// `validation` for a bad key, spec or command, for a resolve without
    /// `quiesced = true` (`not_quiesced`, nothing read or sent); for
    /// `start`/`stop`/`delete` with the action `none`;
    /// `unsupported_capability` (`retained_machines`) without a worker
    /// able to create machines (a create or a slot command whose key is
    /// stored is answered from the store instead, AC-12.5.2);
    /// `admission_exhausted` after shutdown.
    pub fn machine(
        &mut self,
        now: Instant,
        now_ms: u64,
        request: MachineRequest,
    ) -> Result<RequestId, Error> {
        self.observe_clock(now, now_ms);
        if self.shutting_down {
            return Err(Error::admission_exhausted(
                Operation::Submit,
                Reason::ShuttingDown,
            ));
        }
        // No worker here may create or drive machines: a create or a slot
        // command is still answered from the store for a key stored under
        // an earlier configuration (AC-12.5.2, `resolve.rs`); every other
        // request is refused at once.
        let drives = self.drives_machines();
        let no_machines =
            || Error::unsupported_capability(Operation::Submit, Reason::RetainedMachines);
        if !drives
            && !matches!(
                request,
                MachineRequest::Create { .. } | MachineRequest::Submit { .. }
            )
        {
            return Err(no_machines());
        }
        let mut refused = None;
        let mut unstored = None;
        let req_op = match &request {
            MachineRequest::Create { key, spec } => {
                key.validate()
                    .map_err(|e| e.with_operation(Operation::Create))?;
                spec.validate()
                    .map_err(|e| e.with_operation(Operation::Create))?;
                let fp =
                    crate::managed::fingerprint::machine_fingerprint(&self.fingerprint_key, spec);
                // C12.4: a worker whose catalog holds the exact artifact
                // and profile revision, before anything is stored; past a
                // refusal of this configuration, a stored duplicate still
                // resolves (AC-12.5.2): the key is read, nothing stored.
                let worker = if drives {
                    self.cfg
                        .accepting_worker(&spec.artifact, &spec.profile, spec.network.as_ref())
                        .and_then(|w| {
                            // From an approved checkpoint (C11.1): no
                            // ports either; refused before it is stored.
                            if spec.artifact.kind == crate::managed::spec::ArtifactKind::Checkpoint
                                && w.catalog.is_some()
                            {
                                worker_spec(spec, Some(w))?;
                            }
                            Ok(())
                        })
                } else {
                    Err(no_machines())
                };
                match worker {
                    Ok(_) => {
                        let rec =
                            MachineRecord::accepted(key.clone(), fp, spec.clone(), self.now_ms)
                                .map_err(|e| e.with_operation(Operation::Create))?;
                        Some(StoreOp::AcceptMachine {
                            record: Box::new(rec),
                            max_pending: self.cfg.max_pending,
                        })
                    }
                    Err(e) if !drives => {
                        refused = Some((fp, e));
                        Some(StoreOp::FetchMachine { key: key.clone() })
                    }
                    Err(e) if crate::managed::controller::resolve::configuration_refusal(&e) => {
                        refused = Some((fp, e.with_operation(Operation::Create)));
                        Some(StoreOp::FetchMachine { key: key.clone() })
                    }
                    Err(e) => return Err(e.with_operation(Operation::Create)),
                }
            }
            MachineRequest::Lifecycle { key, action, .. } => {
                key.validate()?;
                if *action == MachineOperation::None || *action == MachineOperation::Create {
                    return Err(Error::validation(
                        Operation::Submit,
                        Reason::LifecycleAction,
                    ));
                }
                None
            }
            MachineRequest::Submit {
                machine,
                key,
                command,
                files,
            } => {
                machine.validate()?;
                key.validate()
                    .map_err(|e| e.with_operation(Operation::Submit))?;
                // A background command launches in the slot (C5.4): its
                // record ends `launched`, the slot is released, the machine
                // keeps running it.
                command.validate()?;
                if !files.is_empty() && !self.cfg.artifacts {
                    // Bytes come from and go to the runtime's artifact
                    // store (C6.4): without one, refused before anything
                    // is read or stored (as for a disposable command).
                    return Err(Error::unsupported_capability(
                        Operation::Submit,
                        Reason::FileTransfer,
                    ));
                }
                if !drives {
                    // The command's key is read once its machine was
                    // (its fingerprint names the machine's spec).
                    unstored = Some(no_machines());
                }
                None
            }
            MachineRequest::Resolve { key, quiesced, .. } => {
                key.validate()?;
                if !quiesced {
                    // AC-17.3.1: rejected before anything is read or sent.
                    return Err(Error::validation(Operation::Resolve, Reason::NotQuiesced));
                }
                None
            }
            MachineRequest::Reconcile { key }
            | MachineRequest::StopForDrain { key, .. }
            | MachineRequest::Measurements { key } => {
                key.validate()?;
                None
            }
            MachineRequest::Logs { key, params } => {
                key.validate()?;
                params.validate()?;
                if params.follow {
                    // A request answers once; following is a stream.
                    return Err(Error::validation(
                        Operation::Logs,
                        Reason::FollowUnsupported,
                    ));
                }
                None
            }
        };
        let id = RequestId(self.next_req);
        self.next_req += 1;
        let mut req = Req::new(id, request);
        req.refused = refused;
        req.unstored = unstored;
        let op = match req_op {
            Some(op) => op,
            None => match req.initial_op(self.now_ms) {
                Some(op) => op,
                None => return Err(Error::protocol(Operation::Submit, Reason::NoInitialOp)),
            },
        };
        self.push_req(req, op);
        self.pump(now);
        Ok(id)
    }

    /// True when a configured worker has an admitted version profile:
    /// only then are retained machines created and driven here.
    pub(in crate::managed::controller) fn drives_machines(&self) -> bool {
        self.cfg.workers.iter().any(|w| w.profile.is_some())
    }

    /// Retained machines driven here right now.
    pub fn machines_active(&self) -> usize {
        self.machs.len()
    }

    pub(in crate::managed::controller) fn on_req_stored(
        &mut self,
        now: Instant,
        rid: RequestId,
        result: StoreResult,
    ) {
        let Some(mut req) = self.reqs.remove(&rid) else {
            return;
        };
        if let (Some(_), Ok(StoreReply::Record(rec))) = (&req.refused, &result) {
            // A refused slot command's key, read: counted as any read of
            // the key (fuzz finding 18's rule, as `on_resolved`).
            if let Some(ex) = self.execs.get_mut(&rec.key) {
                ex.on_row_read(rec, &self.cfg);
            } else {
                self.note_undriven_row(rec);
            }
        }
        let intent = req.asked_intent();
        let asked = req.asked_at.unwrap_or(now);
        let step = req.on_stored(&self.cfg, self.now_ms, result);
        if let RStep::Done(Ok(answer)) = &step {
            self.after_answer(now, asked, answer, intent);
        }
        self.req_step(req, step);
    }

    /// Hands out a request flow's store op, noting when it was asked (a
    /// claim the op takes counts from then, C15).
    pub(in crate::managed::controller) fn push_req(&mut self, mut req: Req, op: StoreOp) {
        let id = req.id;
        req.asked_at = Some(self.now);
        self.reqs.insert(id, req);
        self.push_store(Purpose::Req(id), op);
    }

    /// Continues a request flow with its next step.
    pub(in crate::managed::controller) fn req_step(&mut self, req: Req, step: RStep) {
        match step {
            RStep::Store(op) => self.push_req(req, op),
            RStep::Worker(op) => {
                let id = req.id;
                self.reqs.insert(id, req);
                let oid = self.op_id();
                self.ops.insert(oid, Purpose::Req(id));
                self.worker_out.push_back((oid, op));
            }
            RStep::NeedCommand(m) => self.command_for(req, *m, false),
            RStep::Inspected(m) => self.command_for(req, *m, true),
            RStep::Done(result) => {
                if let Some(c) = &req.command
                    && let Some(n) = self.accepting.get_mut(&c.key)
                {
                    // Counted like an exec acceptance; the rows kept for
                    // the key go with its last acceptance.
                    *n = n.saturating_sub(1);
                    if *n == 0 {
                        self.accepting.remove(&c.key);
                        self.accept_rows.remove(&c.key);
                    }
                }
                self.done(req.id, result);
            }
        }
    }

    pub(in crate::managed::controller) fn done(
        &mut self,
        id: RequestId,
        result: Result<MachineAnswer, Error>,
    ) {
        self.notices
            .push_back(crate::managed::controller::ControllerEvent::Machine(
                Box::new(MachineDone { id, result }),
            ));
    }

    /// After a durable answer to a store op asked at `asked`: drive what
    /// it made due. `intent`: the answer is a command submission's that
    /// asked for the dispatch intent.
    pub(in crate::managed::controller) fn after_answer(
        &mut self,
        now: Instant,
        asked: Instant,
        answer: &MachineAnswer,
        intent: bool,
    ) {
        match answer {
            MachineAnswer::Machine { record, .. } => {
                if let Some(m) = self.machs.get_mut(&record.key) {
                    m.refresh();
                } else if record.next_due_at_ms.is_some() && self.machs.len() < self.cfg.max_active
                {
                    self.machs
                        .insert(record.key.clone(), Mach::new((**record).clone()));
                }
            }
            MachineAnswer::Submitted {
                execution,
                machine: Some(machine),
                existing,
            } => {
                // Not driven by a configuration that drives no machines
                // (its due scan does not adopt slot commands either).
                let held = machine.active_execution.as_ref() == Some(&execution.key)
                    && self.drives_machines();
                // Rows past `ready` a due scan or a cancel showed while this
                // submission was out (kept as for an exec acceptance,
                // findings 7 and 10; dropped with the key's last one).
                let earlier = self
                    .accept_rows
                    .get(&execution.key)
                    .cloned()
                    .unwrap_or_default();
                if held && !self.execs.contains_key(&execution.key) {
                    self.start_command(now, (**execution).clone(), (**machine).clone(), false);
                    let own = intent
                        && !*existing
                        && execution.state == crate::managed::ExecState::Dispatching;
                    if !own && let Some(ex) = self.execs.get_mut(&execution.key) {
                        // Not this submission's intent (a plain submission
                        // cannot have written one: finding 4's rule).
                        for row in &earlier {
                            ex.on_row_read(row, &self.cfg);
                        }
                    }
                    if own && let Some(ex) = self.execs.get_mut(&execution.key) {
                        // Inserted by this submission with its intent; the
                        // machine claimed for this controller in the same
                        // commit (when no other one held it). An earlier row
                        // other than that very record forbids the send
                        // (finding 9's rule).
                        ex.intent_committed(asked);
                        for row in &earlier {
                            ex.on_row_before_intent(row);
                        }
                        if machine
                            .claim
                            .as_ref()
                            .is_some_and(|c| c.owner == self.cfg.owner)
                            && let Some(snap) = self.slot_machines.get_mut(&execution.key)
                        {
                            snap.1 = Some(asked);
                        }
                    }
                } else if let Some(ex) = self.execs.get_mut(&execution.key) {
                    // A duplicate of a command driven here: its row goes to
                    // its execution (never a send after another intent).
                    ex.on_row_read(execution, &self.cfg);
                }
            }
            MachineAnswer::Submitted { .. }
            | MachineAnswer::Logs { .. }
            | MachineAnswer::Measurements { .. } => {}
            MachineAnswer::Resolved { machine, .. } => {
                if let Some(m) = self.machs.get_mut(&machine.key) {
                    m.refresh();
                }
            }
        }
    }

    /// Drives a command holding `machine`'s slot.
    pub(in crate::managed::controller) fn start_command(
        &mut self,
        now: Instant,
        rec: ExecutionRecord,
        machine: MachineRecord,
        refetch: bool,
    ) {
        let Some(a) = machine.assignment.clone() else {
            return;
        };
        if !self.cfg.workers.iter().any(|w| w.id == a.worker_id) {
            return;
        }
        let key = rec.key.clone();
        let mut ex = Exec::new(rec, now, self.now_ms, None);
        let incarnation = machine.creation.as_ref().map(|c| c.incarnation.clone());
        ex.set_target(a.worker_id, a.machine_name, incarnation);
        if refetch {
            ex.refetch();
        }
        self.slot_machines.insert(key.clone(), (machine, None));
        self.execs.insert(key, ex);
    }

    /// The due scan found a retained command: its machine was read.
    pub(in crate::managed::controller) fn on_adopt(
        &mut self,
        now: Instant,
        rec: ExecutionRecord,
        result: StoreResult,
    ) {
        let Ok(StoreReply::Machine(m)) = result else {
            return;
        };
        let finishing = self
            .machs
            .values()
            .any(|m| m.finishing_keys().any(|k| *k == rec.key));
        if self.execs.contains_key(&rec.key) || finishing || self.shutting_down {
            return;
        }
        if self.execs.len() >= self.cfg.max_active {
            return;
        }
        self.skip.remove(&rec.key);
        if m.active_execution.as_ref() != Some(&rec.key) {
            // Not the slot holder (never took it, or resolved): nothing
            // is sent; its record is left as stored.
            return;
        }
        self.start_command(now, rec, m, true);
    }

    /// A retained command ended here: finish its slot (C14.3).
    pub(in crate::managed::controller) fn finish_slot(
        &mut self,
        machine: &RecordKey,
        f: Box<Finished>,
    ) {
        let snapshot = self.slot_machines.remove(&f.key);
        if let Some(m) = self.machs.get_mut(machine) {
            m.finish_command(f);
            return;
        }
        match snapshot {
            Some((rec, claimed_at)) => {
                let mut m = Mach::new(rec);
                if let Some(at) = claimed_at {
                    m.claimed_at(at);
                }
                m.refresh();
                m.finish_command(f);
                self.machs.insert(machine.clone(), m);
            }
            None => self
                .notices
                .push_back(crate::managed::controller::ControllerEvent::Finished(f)),
        }
    }

    pub(in crate::managed::controller) fn on_machine_scan(
        &mut self,
        now: Instant,
        result: StoreResult,
    ) {
        self.mscanning = false;
        let Ok(StoreReply::DueMachines { records, next }) = result else {
            self.mscan_cursor = None;
            self.mscan_at = (!self.shutting_down).then(|| now + self.cfg.poll());
            return;
        };
        let mut full = false;
        for rec in records {
            if self.shutting_down {
                break;
            }
            if self.machs.contains_key(&rec.key) || self.skip.contains_key(&rec.key) {
                continue;
            }
            let ours = match &rec.assignment {
                Some(a) => self
                    .cfg
                    .workers
                    .iter()
                    .any(|w| w.id == a.worker_id && w.profile.is_some()),
                None => self.cfg.workers.iter().any(|w| w.profile.is_some()),
            };
            if !ours {
                continue;
            }
            if self.machs.len() >= self.cfg.max_active {
                full = true;
                break;
            }
            self.machs.insert(rec.key.clone(), Mach::new(rec));
        }
        match next {
            Some(c) if !full && !self.shutting_down => {
                self.mscan_cursor = Some(c);
                self.mscan_at = Some(now);
            }
            _ => {
                self.mscan_cursor = None;
                self.mscan_at = (!self.shutting_down).then(|| now + self.cfg.poll());
            }
        }
    }

    /// Moves every machine task forward; starts a machine due scan.
    pub(in crate::managed::controller) fn pump_machines(&mut self, now: Instant) {
        if self.shutting_down {
            // No new lifecycle work after shutdown: what is due stays due.
            self.machs.retain(|_, m| !m.quiet());
        }
        let keys: Vec<RecordKey> = self.machs.keys().cloned().collect();
        for key in keys {
            let Some(m) = self.machs.get_mut(&key) else {
                continue;
            };
            loop {
                match m.step(&self.cfg, &self.leases, now, self.now_ms) {
                    MStep::Wait => break,
                    MStep::Store(op) => {
                        let id = OpId(self.next_op);
                        self.next_op += 1;
                        self.ops.insert(id, Purpose::Mach(key.clone()));
                        m.store_sent(id, now);
                        self.store_out.push_back((id, op));
                        break;
                    }
                    MStep::Worker(op) => {
                        let id = OpId(self.next_op);
                        self.next_op += 1;
                        self.ops.insert(id, Purpose::Mach(key.clone()));
                        m.worker_sent(id);
                        self.worker_out.push_back((id, op));
                    }
                    MStep::Finished(f) => self
                        .notices
                        .push_back(crate::managed::controller::ControllerEvent::Finished(f)),
                    MStep::Done => {
                        if m.take_fatal().is_some() {
                            self.skip.insert(key.clone(), now + self.cfg.poll());
                        }
                        self.machs.remove(&key);
                        break;
                    }
                }
            }
        }
        if let Some(at) = self.mscan_at
            && at <= now
            && !self.mscanning
            && !self.shutting_down
        {
            if self.machs.len() < self.cfg.max_active {
                self.mscanning = true;
                let op = StoreOp::DueMachines {
                    now_ms: self.now_ms,
                    after: self.mscan_cursor.clone(),
                    limit: crate::managed::controller::DUE_PAGE,
                };
                self.push_store(Purpose::MachineScan, op);
            } else {
                self.mscan_at = Some(now + self.cfg.poll());
            }
        }
    }
}
