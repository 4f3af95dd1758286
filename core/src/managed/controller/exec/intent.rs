//! The own dispatch intent of an execution and what may follow it before
//! the send (C15, C16, C17.1): rows read by other ops of this controller,
//! replies after the intent, the claim renewed before the send, and a
//! cancel recorded between the intent and the send. Split from `exec.rs`;
//! the same `Exec`, its private state is visible here (a child module).

#[allow(clippy::wildcard_imports)] // the parent's vocabulary, one module
use super::*;

/// Whether `row` is the outcome of an intent write on `base` by this
/// controller (`owner`): `dispatching` at the next version of the same
/// record (fingerprint and spec), under the same generation and claim,
/// that claim `owner`'s (fuzz findings 11 and 19). The caller checks that
/// the answered write was the intent, and the key. A command's execution
/// and a managed terminal's run apply the same rule.
pub(in crate::managed::controller) fn intent_outcome(
    base: &ExecutionRecord,
    row: &ExecutionRecord,
    owner: &str,
) -> bool {
    row.state == ExecState::Dispatching
        && row.version == base.version.saturating_add(1)
        && row.generation == base.generation
        && row.claim == base.claim
        && row.fingerprint == base.fingerprint
        && row.spec == base.spec
        && row.claim.as_ref().is_some_and(|c| c.owner == owner)
}

/// Whether `row` descends from the own intent as last held (`base`): the
/// same record (key, fingerprint, spec) under the same claim generation of
/// this controller (`owner`), at that version or later, past `ready`.
/// Another controller writing meanwhile would have had to claim the
/// record, which moves the generation; a store gone back shows an older
/// version or another generation (fuzz findings 14–16, 19). A command's
/// execution and a managed terminal's run apply the same rule.
pub(in crate::managed::controller) fn descends_from(
    base: &ExecutionRecord,
    row: &ExecutionRecord,
    owner: &str,
) -> bool {
    !row.state.is_before_dispatch()
        && row.key == base.key
        && row.fingerprint == base.fingerprint
        && row.spec == base.spec
        && row.generation == base.generation
        && row.version >= base.version
        && row.claim.as_ref().is_some_and(|c| c.owner == owner)
}

impl Exec {
    /// The write that ends this execution `cancelled` with nothing sent
    /// (`not_dispatched`): a cancel recorded before the send, before or
    /// after the own intent; its cleanup and when that cleanup is due.
    pub(super) fn cancelled_unsent(&self, now_ms: u64) -> ExecPatch {
        ExecPatch {
            state: Some(ExecState::Cancelled),
            evidence: Some(RecordEvidence::NotDispatched),
            cleanup: Some(self.end_cleanup()),
            next_due_at_ms: Some(self.end_due(now_ms)),
            ..ExecPatch::default()
        }
    }

    /// True when `row` descends from this execution's own intent as last
    /// held (`self.rec`): the same record (fingerprint and spec) under the same
    /// claim generation of this controller, at that version or later,
    /// past `ready`. Another controller writing meanwhile would have had
    /// to claim the record, which moves the generation; a store gone back
    /// shows an older version or another generation (fuzz findings 14–16,
    /// session 9).
    fn descends_from_intent(&self, row: &ExecutionRecord, cfg: &ControllerConfig) -> bool {
        descends_from(&self.rec, row, &cfg.owner)
    }

    /// A reply to this execution's own store op (a claim renewal, a write,
    /// a fetch) after its own intent and before the send: one that does not
    /// descend from the intent shows a history without it (another
    /// controller claimed the record meanwhile, or the store went back), so
    /// the command is never sent from here (`unknown`). Called before the
    /// reply replaces the record held.
    pub(super) fn on_reply_after_intent(&mut self, rec: &ExecutionRecord, cfg: &ControllerConfig) {
        if self.intent_mine && !self.attempted && !self.descends_from_intent(rec, cfg) {
            self.shown_dispatched = true;
        }
    }

    /// Before the exec is sent (the own intent is held, nothing was sent):
    /// `Some(step)` when something else must come first.
    ///
    /// - A cancel recorded after the intent (C16): the command is not sent;
    ///   this process knows it never left, so the record ends `cancelled` /
    ///   `not_dispatched` (the move `dispatching → cancelled` added to
    ///   C13.1 for this) and its machine is cleaned up as for any record
    ///   whose command never left.
    /// - The record's claim (C15): the exec goes out only under a claim
    ///   confirmed less than a third of the TTL ago (the renewal cadence
    ///   of a running command) and live by the wall clock; otherwise it is
    ///   renewed first, and the renewal's reply must descend from the own
    ///   intent ([`Exec::on_reply_after_intent`]). A renewal refused as
    ///   `stale_claim` (another controller holds the record) sends nothing
    ///   and writes nothing (`held_elsewhere`).
    pub(super) fn before_send(
        &mut self,
        cfg: &ControllerConfig,
        now: Instant,
        now_ms: u64,
    ) -> Option<Step> {
        if self.rec.cancel_requested_at_ms.is_some() && self.rec.state == ExecState::Dispatching {
            let patch = self.cancelled_unsent(now_ms);
            return Some(self.guarded(cfg, now, now_ms, Kind::Write, patch));
        }
        (!self.claim_ok(cfg, now, now_ms)).then(|| self.claim_op(cfg, now_ms))
    }

    /// A row of this record that another op of this controller read while
    /// this execution drives it: a due scan's page, a duplicate
    /// submission's acceptance reply, a cancel's reply (fuzz finding 5 and
    /// the session-8 campaign). A row past `ready` before this execution's
    /// own intent is another controller's intent (or a store that went
    /// back): like a read showing the record possibly dispatched, the
    /// command is never sent from here, and the record is re-read. The
    /// read may also have seen this execution's own intent before the
    /// write's answer arrived: that row is the intent write's outcome (the
    /// version right after the one written at, the same claim of this
    /// controller, `dispatching`, the same fingerprint and spec) and shows
    /// nothing new.
    pub(in crate::managed::controller) fn on_row_read(
        &mut self,
        row: &ExecutionRecord,
        cfg: &ControllerConfig,
    ) {
        if row.key != self.rec.key || self.attempted {
            return;
        }
        if self.intent_mine {
            // After its own intent and before the send (the exec waits for
            // the worker lease): a row that does not descend from that
            // intent shows a history without it, so another intent may be
            // out there: the command is never sent from here (fuzz finding
            // 16, session 9).
            self.on_reply_after_intent(row, cfg);
            return;
        }
        if row.state.is_before_dispatch() {
            return;
        }
        // The same record: another record's row under this key (another
        // spec) is never this execution's intent (fuzz finding 19).
        let own_intent = matches!(self.inflight, Some((_, Kind::Intent)))
            && intent_outcome(&self.rec, row, &cfg.owner);
        if own_intent {
            return;
        }
        self.shown_dispatched = true;
        self.need_fetch = true;
    }

    /// A row past `ready` that another reply showed before this
    /// execution's own acceptance with intent answered (while no execution
    /// drove the key): unless it is that very intent (the row identical to
    /// the record inserted: nothing writes it without a new version),
    /// another controller's intent may be out there, so the command is
    /// never sent from here (the record is marked `unknown`). Matching only
    /// state, version, generation and claim took another record's row
    /// under this key for the intent (fuzz finding 9, session 8).
    pub(in crate::managed::controller) fn on_row_before_intent(&mut self, row: &ExecutionRecord) {
        let own = *row == self.rec;
        if !own && !row.state.is_before_dispatch() && !self.attempted {
            self.shown_dispatched = true;
        }
    }

    /// A cancel request was stored by this controller.
    pub(in crate::managed::controller) fn on_cancel_recorded(
        &mut self,
        rec: &ExecutionRecord,
        cfg: &ControllerConfig,
    ) {
        self.on_row_read(rec, cfg);
        if self.inflight.is_none()
            && rec.key == self.rec.key
            && rec.fingerprint == self.rec.fingerprint
            && rec.spec == self.rec.spec
            && rec.version > self.rec.version
            && rec.generation == self.rec.generation
            && rec.claim == self.rec.claim
        {
            self.rec = rec.clone();
        } else {
            self.cancel_seen = true;
        }
    }
}
