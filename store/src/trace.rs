//! What both shells' runtime drivers report through `tracing` (C20),
//! written once: the store and worker operations the controller asks for,
//! their failures, and the controller's events — by scope, record id,
//! state, evidence, operation name and error class only. Never argv, env,
//! stdin, file or terminal bytes, tokens or output: a record's spec and a
//! command are not passed to any of these functions, and an [`Error`] holds
//! no peer bytes. Spans and events use the target `smolbox::runtime`.

use smolbox_core::Error;
use smolbox_core::managed::controller::{
    ControllerEvent, OpId, StoreOp, StoreResult, WorkerOp, WorkerResult,
};

/// The span a driver runs its loop in.
pub fn driver_span(owner: &str) -> tracing::Span {
    tracing::info_span!(target: "smolbox::runtime", "smolbox.runtime", owner = owner)
}

/// A store operation is about to be performed.
pub fn store_op(id: OpId, op: &StoreOp) {
    tracing::trace!(target: "smolbox::runtime", op_id = id.0, op = op.name(), "store op");
}

/// A store operation's answer (failures only, at debug).
pub fn store_result(id: OpId, r: &StoreResult) {
    if let Err(e) = r {
        failed(id, "store op failed", e);
    }
}

/// A worker operation is about to be performed.
pub fn worker_op(id: OpId, op: &WorkerOp) {
    tracing::debug!(
        target: "smolbox::runtime",
        op_id = id.0,
        op = op.name(),
        worker = op.worker_id(),
        "worker op"
    );
}

/// A worker operation's answer (failures only, at debug).
pub fn worker_result(id: OpId, r: &WorkerResult) {
    if let Err(e) = r {
        failed(id, "worker op failed", e);
    }
}

fn failed(id: OpId, what: &'static str, e: &Error) {
    tracing::debug!(
        target: "smolbox::runtime",
        op_id = id.0,
        category = ?e.category(),
        operation = ?e.operation(),
        evidence = ?e.evidence(),
        reason = e.reason().as_str(),
        "{what}"
    );
}

/// One controller event.
pub fn event(event: &ControllerEvent) {
    match event {
        ControllerEvent::Accepted { key, existing, .. } => tracing::info!(
            target: "smolbox::runtime",
            scope = %key.scope, id = %key.id, existing = *existing,
            "execution accepted"
        ),
        ControllerEvent::Refused { key, error } => tracing::warn!(
            target: "smolbox::runtime",
            scope = %key.scope, id = %key.id,
            category = ?error.category(), reason = error.reason().as_str(),
            "submission refused"
        ),
        ControllerEvent::CancelRecorded { key, result } => tracing::info!(
            target: "smolbox::runtime",
            scope = %key.scope, id = %key.id, ok = result.is_ok(),
            "cancel recorded"
        ),
        ControllerEvent::Finished(f) => tracing::info!(
            target: "smolbox::runtime",
            scope = %f.key.scope, id = %f.key.id,
            state = ?f.record.as_ref().map(|r| r.state),
            evidence = ?f.record.as_ref().map(|r| r.evidence),
            exit_code = ?f.exit_code(),
            dispatched = f.dispatched,
            held_elsewhere = f.held_elsewhere,
            error = ?f.error.as_ref().map(Error::reason),
            "execution finished here"
        ),
        ControllerEvent::Telemetry(t) => tracing::debug!(
            target: "smolbox::runtime",
            scope = %t.key.scope, id = %t.key.id,
            lifecycle = ?t.lifecycle, version = t.version,
            epoch = t.epoch, dropped = t.dropped,
            "record written"
        ),
        ControllerEvent::Machine(d) => tracing::info!(
            target: "smolbox::runtime",
            request = d.id.0, ok = d.result.is_ok(),
            category = ?d.result.as_ref().err().map(Error::category),
            reason = d.result.as_ref().err().map_or("", |e| e.reason().as_str()),
            "machine request answered"
        ),
        ControllerEvent::TerminalDue(rec) => tracing::info!(
            target: "smolbox::runtime",
            scope = %rec.key.scope, id = %rec.key.id, state = ?rec.state,
            "terminal due for recovery"
        ),
        ControllerEvent::Stopped => {
            tracing::info!(target: "smolbox::runtime", "controller stopped")
        }
    }
}
