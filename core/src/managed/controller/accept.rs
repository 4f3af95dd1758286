//! Acceptance of a submission, and the image-machine preflight of a
//! command on a caller-named machine before it (C5.4, C6.1; issue 12).
//!
//! A command on a caller-named machine (`worker_machine`) whose dispatch
//! will carry an [`ImageCheck`] — an extended command (a timeout over
//! 300 s, a workdir outside `/workspace`) or a declared file over 1 MiB
//! or outside `/workspace` ([`gated_operation`]) — is asked of the worker
//! before anything is stored, as a retained machine's slot command is
//! (`machines/preinspect.rs`): [`WorkerOp::Inspect`] of the named
//! machine, and core's verdict ([`ImageCheck::admit`]). Admitted, the
//! record is built at the current time and accepted as before. Refused
//! (`unsupported_capability` / `needs_plain_image_machine` on the first
//! gated operation, or the failed inspect's own error), the key is read
//! from the store and the answer is the stored record when its
//! fingerprint is the spec's (a duplicate resolves whatever the machine
//! is now, even deleted: AC-12.5.2), `identity_conflict` for another
//! spec, the refusal when nothing is stored (`not_dispatched`, nothing
//! stored or sent), and the store's error when it could not answer.
//!
//! Not inspected: a worker this controller has no admitted version
//! profile for (the inspect's request and its decoding depend on it; the
//! shell's own preflight still refuses at the dispatch, `failed` /
//! `not_dispatched`). The dispatch keeps its own check (the machine may
//! change in between).

use super::machines::preinspect::gated_operation;
use super::ops::{StoreOp, WorkerOp, WorkerReply};
use super::{
    Claim, Controller, ControllerEvent, ExecutionRecord, Purpose, Submit, WorkerResult, command_of,
};
use crate::managed::CommandFiles;
use crate::worker::{ImageCheck, MachineName};
use crate::{Error, Evidence, Operation, Reason};

/// A submission waiting for its caller-named machine's inspect.
#[derive(Clone, Debug)]
pub(super) struct Preflight {
    submit: Submit,
    check: ImageCheck,
}

impl Controller {
    /// The inspect (and its verdict) a command on a caller-named machine
    /// needs before its acceptance; `None` when it needs none here (see
    /// the module docs).
    ///
    /// # Errors
    /// `validation` for a machine name the worker API refuses.
    pub(super) fn named_preflight(
        &self,
        submit: &Submit,
    ) -> Result<Option<(WorkerOp, ImageCheck)>, Error> {
        let spec = &submit.spec;
        let Some(w) = &spec.worker_machine else {
            return Ok(None);
        };
        let command = command_of(spec)?;
        let files = CommandFiles {
            inputs: spec.inputs.clone(),
            outputs: spec.outputs.clone(),
        };
        let streamed = self.streamed.contains(&submit.key);
        let Some(operation) = gated_operation(&command, &files, streamed) else {
            return Ok(None);
        };
        let Some(profile) = self.cfg.profile_of(&w.worker_id) else {
            return Ok(None);
        };
        let check = ImageCheck::new(&profile, &w.name, operation)?;
        let op = WorkerOp::Inspect {
            worker_id: w.worker_id.clone(),
            profile,
            name: MachineName::new(&w.name).map_err(|e| e.with_operation(Operation::Submit))?,
        };
        Ok(Some((op, check)))
    }

    /// Sends the preflight's inspect; the acceptance waits for it.
    pub(super) fn preflight(&mut self, submit: Submit, op: WorkerOp, check: ImageCheck) {
        let id = self.op_id();
        let waiting = Preflight { submit, check };
        self.ops.insert(id, Purpose::Preflight(Box::new(waiting)));
        self.worker_out.push_back((id, op));
    }

    /// The preflight's inspect answered: accepted when core's verdict
    /// admits the command, else answered from the store.
    pub(super) fn on_preflight(&mut self, p: Preflight, result: WorkerResult) {
        let Preflight { submit, check } = p;
        let key = submit.key.clone();
        if self.shutting_down {
            let error = Error::admission_exhausted(Operation::Submit, Reason::ShuttingDown);
            self.notices
                .push_back(ControllerEvent::Refused { key, error });
            return;
        }
        let observed = result.and_then(|r| match r {
            WorkerReply::Machine(obs) => Ok(*obs),
            _ => Err(Error::protocol(Operation::Get, Reason::UnexpectedReply)),
        });
        match check.admit(observed) {
            Ok(()) => {
                if let Err(error) = self.accept(submit) {
                    self.notices
                        .push_back(ControllerEvent::Refused { key, error });
                }
            }
            Err(e) => self.resolve_stored(submit, e.with_evidence(Evidence::NotDispatched)),
        }
    }

    /// Builds the record at the current time and asks the store to accept
    /// it (with its claim and dispatch intent when it can be driven now).
    ///
    /// # Errors
    /// `validation` for a record the rules refuse; nothing is stored.
    pub(super) fn accept(&mut self, submit: Submit) -> Result<(), Error> {
        let fp = self.fingerprint(&submit.spec);
        let mut record =
            ExecutionRecord::accepted(submit.key.clone(), fp, submit.spec, self.now_ms)
                .map_err(|e| e.with_operation(Operation::Submit))?;
        if self.cfg.claim_at_accept {
            // Generation 1: the record's first claim (C15).
            record.claim = Some(Claim {
                owner: self.cfg.owner.clone(),
                until_ms: self.now_ms.saturating_add(self.cfg.lease_ttl_ms),
            });
            record.generation = 1;
        }
        // Issue 16: on a machine that needs nothing staged (the caller's),
        // the claim and the dispatch intent commit with the acceptance when
        // the command can be driven at once; otherwise it is accepted only
        // and moves through `preparing` and `ready` (the due scan, a
        // detached submitter, a duplicate of a key in flight here).
        let intent = self.cfg.claim_at_accept
            && record.spec.worker_machine.is_some()
            && record.spec.inputs.is_empty()
            && !self.execs.contains_key(&submit.key)
            && !self.accepting.contains_key(&submit.key)
            && self.busy() < self.cfg.max_active;
        *self.accepting.entry(submit.key.clone()).or_insert(0) += 1;
        let record = Box::new(record);
        let max_pending = self.cfg.max_pending;
        let op = if intent {
            self.intent_accepts += 1;
            StoreOp::AcceptDispatching {
                record,
                max_pending,
            }
        } else {
            StoreOp::Accept {
                record,
                max_pending,
            }
        };
        let asked = self.now;
        self.push_store(Purpose::Accept(submit.key, intent, asked), op);
        Ok(())
    }
}
