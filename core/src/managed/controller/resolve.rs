//! AC-12.5.2: a submission this configuration refuses (no configured
//! worker may create its machine, or the worker it names is not
//! configured) still resolves as a duplicate of a stored record. The
//! refusal is not returned at once: the store is asked for the key (a
//! read, nothing stored), and the answer is the stored record
//! (`Accepted`, `existing: true`) when its fingerprint is the spec's,
//! `identity_conflict` when another spec holds the key, and the refusal
//! itself when nothing is stored.

use super::{Controller, ControllerEvent, Purpose, Submit, command_of};
use crate::managed::RecordKey;
use crate::managed::controller::ops::{StoreOp, StoreReply, StoreResult};
use crate::{Category, Error, Evidence, Operation, Reason};

/// A submission refused by this configuration, waiting for the store.
#[derive(Clone, Debug)]
pub(super) struct Refused {
    key: RecordKey,
    fingerprint: String,
    refusal: Error,
}

/// True for the refusals that depend only on which workers, versions and
/// catalogs are configured (C12.4): a stored duplicate resolves past them.
pub(super) fn configuration_refusal(e: &Error) -> bool {
    e.category() == Category::UnsupportedCapability
        && matches!(
            e.reason(),
            Reason::UnknownWorker
                | Reason::DisposableMachines
                | Reason::NetworkPolicyNotInVersion
                | Reason::WorkerDraining
                | Reason::ArtifactNotInCatalog
                | Reason::ProfileNotInCatalog
                | Reason::ProfileBelowFloor
        )
}

impl Controller {
    /// `submit` after the catalog check refused `refusal`: any other
    /// refusal is returned as is; a configuration refusal first asks the
    /// store whether the key is stored (answered as a notice).
    ///
    /// # Errors
    /// `refusal` unless it is a configuration refusal; the command's own
    /// validation.
    pub(super) fn resolve_refused(&mut self, submit: Submit, refusal: Error) -> Result<(), Error> {
        if !configuration_refusal(&refusal) {
            return Err(refusal);
        }
        command_of(&submit.spec)?.validate()?;
        self.resolve_stored(submit, refusal);
        Ok(())
    }

    /// Answers `submit` from the store (nothing written): the stored
    /// record, `identity_conflict`, or `refusal` when nothing is stored.
    pub(super) fn resolve_stored(&mut self, submit: Submit, refusal: Error) {
        let fingerprint = self.fingerprint(&submit.spec);
        let key = submit.key;
        let op = StoreOp::Fetch { key: key.clone() };
        let waiting = Refused {
            key,
            fingerprint,
            refusal,
        };
        self.push_store(Purpose::Resolve(Box::new(waiting)), op);
    }

    /// The store's answer for a refused submission.
    pub(super) fn on_resolved(&mut self, r: Refused, result: StoreResult) {
        let Refused {
            key,
            fingerprint,
            refusal,
        } = r;
        if let Ok(StoreReply::Record(record)) = &result
            && record.key == key
        {
            // What this read shows of the key counts as any other read of
            // it does: an execution driven here takes the row (it never
            // sends after a row showed the record possibly sent), and an
            // acceptance still out keeps it (fuzz finding 18, session 9).
            if let Some(ex) = self.execs.get_mut(&record.key) {
                ex.on_row_read(record, &self.cfg);
            } else {
                self.note_undriven_row(record);
            }
        }
        let notice = match result {
            Ok(StoreReply::Record(record)) if record.key == key => {
                if record.fingerprint == fingerprint {
                    // Left to the due scan: driven where a worker may
                    // still run it, else expired at its queue deadline.
                    ControllerEvent::Accepted {
                        key,
                        existing: true,
                        record: Box::new(record),
                    }
                } else {
                    let error = Error::identity_conflict(
                        Operation::Submit,
                        Evidence::NotDispatched,
                        Reason::FingerprintDiffers,
                    );
                    ControllerEvent::Refused { key, error }
                }
            }
            Err(e) if e.category() == Category::NotFound => ControllerEvent::Refused {
                key,
                error: refusal,
            },
            // The store could not answer: ambiguous, resolved by
            // resubmitting (AC-12.5.3); never read as "not stored".
            Err(error) => ControllerEvent::Refused { key, error },
            Ok(_) => ControllerEvent::Refused {
                key,
                error: Error::protocol(Operation::StoreFetch, Reason::UnexpectedReply),
            },
        };
        self.notices.push_back(notice);
    }
}

/// The store's answer for a retained machine's create this configuration
/// refused: the stored machine when its fingerprint is the spec's.
///
/// # Errors
/// `identity_conflict` when another spec holds the key; `refusal` when
/// nothing is stored; the store's error when it could not answer.
pub(super) fn stored_machine(
    key: &RecordKey,
    fingerprint: &str,
    refusal: Error,
    result: StoreResult,
) -> Result<crate::managed::MachineRecord, Error> {
    match result {
        Ok(StoreReply::Machine(m)) if m.key == *key && m.fingerprint == fingerprint => Ok(m),
        Ok(StoreReply::Machine(m)) if m.key == *key => Err(Error::identity_conflict(
            Operation::Create,
            Evidence::NotDispatched,
            Reason::FingerprintDiffers,
        )),
        Err(e) if e.category() == Category::NotFound => Err(refusal),
        Err(e) => Err(e),
        Ok(_) => Err(Error::protocol(
            Operation::StoreFetch,
            Reason::UnexpectedReply,
        )),
    }
}

/// The store's answer for a slot command this configuration refused (no
/// worker here drives machines): the stored command when its fingerprint
/// is the spec's, with `machine` as read before it.
///
/// # Errors
/// `identity_conflict` when another spec holds the key; `refusal` when
/// nothing is stored; the store's error when it could not answer.
pub(super) fn stored_command(
    key: &RecordKey,
    fingerprint: &str,
    refusal: Error,
    result: StoreResult,
    machine: &crate::managed::MachineRecord,
) -> Result<super::MachineAnswer, Error> {
    match result {
        Ok(StoreReply::Record(r)) if r.key == *key && r.fingerprint == fingerprint => {
            Ok(super::MachineAnswer::Submitted {
                execution: Box::new(r),
                machine: Some(Box::new(machine.clone())),
                existing: true,
            })
        }
        Ok(StoreReply::Record(r)) if r.key == *key => Err(Error::identity_conflict(
            Operation::Submit,
            Evidence::NotDispatched,
            Reason::FingerprintDiffers,
        )),
        Err(e) if e.category() == Category::NotFound => Err(refusal),
        Err(e) => Err(e),
        Ok(_) => Err(Error::protocol(
            Operation::StoreFetch,
            Reason::UnexpectedReply,
        )),
    }
}
