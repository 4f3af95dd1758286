//! A slot command's image-machine preflight before its acceptance (C5.4,
//! C6.1, C14.3). A command whose dispatch will carry an
//! [`ImageCheck`] — an extended command (a timeout over 300 s, a
//! background launch, a workdir outside `/workspace`) or a declared file
//! over 1 MiB or outside `/workspace` — is asked of the worker first: the
//! flow sends [`WorkerOp::Inspect`] of the slot's machine and core's
//! verdict ([`ImageCheck::admit`]) decides. A machine that is not a plain
//! image machine is `unsupported_capability` / `needs_plain_image_machine`
//! and a failed inspect keeps its own category; both are `not_dispatched`
//! with nothing stored, no slot taken and the machine record untouched.
//! Without it the command would be accepted with its dispatch intent and
//! refused by the shell's own preflight afterwards: `failed` /
//! `not_dispatched`, its slot kept and the machine `unknown` until an
//! operator's `resolve` (C14.3, "anything else → keep slot"). Managed
//! terminals ask the same before acceptance (`TermOutput::Inspect`).
//!
//! The dispatch itself still carries the check (the machine could change
//! in between); that refusal, after the intent, stays `failed` /
//! `not_dispatched` with the slot kept, as the spec says.

#[allow(clippy::wildcard_imports)] // the parent's vocabulary, one module
use super::*;
use crate::exec::Command;
use crate::managed::CommandFiles;
use crate::worker::{GuestPath, ImageCheck, files::needs_image_machine};

/// The first operation of a slot command's dispatch that will need a
/// plain image machine, in the order they go out (uploads, the exec or
/// launch, downloads); `None` when none will. `streamed`: the submitter
/// asked for the output as it comes (the command then goes out as a
/// streamed exec when it can be).
pub(in crate::managed::controller) fn gated_operation(
    command: &Command,
    files: &CommandFiles,
    streamed: bool,
) -> Option<Operation> {
    let gated =
        |bytes: u64, path: &str| GuestPath::new(path).is_ok_and(|p| needs_image_machine(bytes, &p));
    if files.inputs.iter().any(|i| gated(i.size, &i.path)) {
        return Some(Operation::Upload);
    }
    if command.is_extended() {
        return Some(if command.is_background() {
            Operation::Launch
        } else if streamed && command.stdin_text().is_none() {
            Operation::ExecStream
        } else {
            Operation::Exec
        });
    }
    files
        .outputs
        .iter()
        .any(|o| gated(o.max_size, &o.path))
        .then_some(Operation::Download)
}

impl crate::managed::controller::Controller {
    /// A submit read its machine (`inspected`: and passed the preflight):
    /// builds the command's record at the current time, asks for the
    /// preflight when it needs one, else submits it (acceptance and the
    /// slot in one transaction).
    pub(in crate::managed::controller) fn command_for(
        &mut self,
        mut req: Req,
        m: MachineRecord,
        inspected: bool,
    ) {
        let MachineRequest::Submit {
            key,
            command,
            files,
            ..
        } = req.request.clone()
        else {
            return;
        };
        let built = command_spec(&command, &files, &m).and_then(|spec| {
            let fp = self.fingerprint(&spec);
            ExecutionRecord::accepted(key, fp, spec, self.now_ms.max(m.updated_at_ms))
                .map_err(|e| e.with_operation(Operation::Submit))
        });
        let mut rec = match built {
            Ok(rec) => rec,
            Err(e) => return self.done(req.id, Err(e)),
        };
        if let Some(refusal) = req.unstored.take() {
            // Nothing is submitted: the stored command, if any, answers.
            req.refused = Some((rec.fingerprint.clone(), refusal));
            let op = StoreOp::Fetch { key: rec.key };
            return self.req_step(req, RStep::Store(op));
        }
        if !inspected {
            match self.image_preflight(&command, &files, &rec, &m) {
                Ok(Some((op, check))) => {
                    req.inspect_first(check);
                    return self.req_step(req, RStep::Worker(op));
                }
                Ok(None) => {}
                Err(e) => return self.done(req.id, Err(e)),
            }
        }
        if self.cfg.claim_at_accept {
            rec.claim = Some(Claim {
                owner: self.cfg.owner.clone(),
                until_ms: rec.accepted_at_ms.saturating_add(self.cfg.lease_ttl_ms),
            });
            rec.generation = 1;
        }
        req.command = Some(rec.clone());
        // Issue 16: the slot, the claim and the intent in one commit (a
        // command holding the slot is driven at once, whatever
        // `max_active`). A command with inputs stages them first (C6.4:
        // verified before the intent), so it is accepted with the slot and
        // the claim only, and writes `preparing` itself.
        let intent = self.cfg.claim_at_accept && rec.spec.inputs.is_empty();
        let op = req.submit_op(rec, self.cfg.max_pending, intent);
        *self.accepting.entry(key_of(&op)).or_insert(0) += 1;
        self.push_req(req, op);
    }

    /// The inspect (and its verdict) a slot command needs before its
    /// acceptance, `None` when it needs none here: no gated operation
    /// ([`gated_operation`]); a command the store would not put into the
    /// free slot now (a duplicate holding it, a busy or non-running
    /// machine: the store answers those as before); a machine on a worker
    /// this controller has no profile for (the controller that dispatches
    /// it still runs the check at the send).
    fn image_preflight(
        &self,
        command: &Command,
        files: &CommandFiles,
        rec: &ExecutionRecord,
        m: &MachineRecord,
    ) -> Result<Option<(WorkerOp, ImageCheck)>, Error> {
        let Some(operation) = gated_operation(command, files, self.streamed.contains(&rec.key))
        else {
            return Ok(None);
        };
        if m.active_execution.is_some()
            || crate::managed::slot::acquire(m, rec, rec.accepted_at_ms).is_err()
        {
            return Ok(None);
        }
        let Some(a) = m.assignment.as_ref() else {
            return Ok(None);
        };
        let Some(profile) = self.cfg.profile_of(&a.worker_id) else {
            return Ok(None);
        };
        let check = ImageCheck::new(&profile, &a.machine_name, operation)?;
        let op = WorkerOp::Inspect {
            worker_id: a.worker_id.clone(),
            profile,
            name: MachineName::new(&a.machine_name)?,
        };
        Ok(Some((op, check)))
    }
}
