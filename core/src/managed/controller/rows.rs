//! The store's answers that carry execution rows to the controller: an
//! acceptance (a duplicate joins the execution driven here; otherwise the
//! record is driven now or left due), a recorded cancel (only a row of the
//! cancelled key answers it, fuzz finding 21), and a due scan's page (rows
//! of executions driven here go to them; others start an execution when
//! there is room). Rows of a key whose acceptance is still out are kept
//! for the execution a later acceptance starts.

use std::time::{Duration, Instant};

use super::exec::Exec;
use super::ops::{StoreOp, StoreReply, StoreResult};
use super::{Action, Controller, ControllerEvent, ExecState, ExecutionRecord, Purpose, RecordKey};
use crate::{Error, Operation, Reason};

impl Controller {
    /// True when this controller may drive `rec` (its namespace: a machine
    /// on one of its workers). A record with declared files needs an
    /// artifact store to stage or collect them: a controller without one
    /// leaves it to one that has it (as it refuses such specs at
    /// acceptance), never fails it for lack of one.
    pub(super) fn owns(&self, rec: &ExecutionRecord) -> bool {
        if !self.cfg.artifacts && (!rec.spec.inputs.is_empty() || !rec.spec.outputs.is_empty()) {
            return false;
        }
        if rec.spec.machine.is_some() {
            // Decided once its machine is read (`on_adopt`).
            return self.cfg.workers.iter().any(|x| x.profile.is_some());
        }
        let configured = |id: &str, needs_profile: bool| {
            self.cfg
                .workers
                .iter()
                .any(|x| x.id == id && (!needs_profile || x.profile.is_some()))
        };
        match (&rec.spec.worker_machine, &rec.assignment) {
            (Some(w), _) => configured(&w.worker_id, false),
            (None, Some(a)) => configured(&a.worker_id, true),
            // Unassigned: a worker that may create it (its catalog, C12.4),
            // else to expire it once its queue deadline passed.
            (None, None) => self.creating_or_lapsed(rec),
        }
    }

    /// The answer to an acceptance asked at `asked`; `intent` when it was
    /// the acceptance that also commits the dispatch intent
    /// (`accept_dispatching`).
    pub(super) fn on_accepted(
        &mut self,
        now: Instant,
        asked: Instant,
        key: RecordKey,
        intent: bool,
        result: StoreResult,
    ) {
        // Rows past `ready` shown while this key was accepted and not
        // driven (dropped with its last acceptance, whatever the answer).
        let earlier = if self.accepting.contains_key(&key) {
            self.accept_rows.get(&key).cloned().unwrap_or_default()
        } else {
            self.accept_rows.remove(&key).unwrap_or_default()
        };
        let (record, existing) = match result {
            Ok(StoreReply::Accepted { record, existing }) if record.key == key => {
                (record, existing)
            }
            Ok(_) => {
                let error = Error::protocol(Operation::StoreAccept, Reason::UnexpectedReply);
                self.notices
                    .push_back(ControllerEvent::Refused { key, error });
                return;
            }
            Err(error) => {
                self.notices
                    .push_back(ControllerEvent::Refused { key, error });
                return;
            }
        };
        self.notices.push_back(ControllerEvent::Accepted {
            key: key.clone(),
            existing,
            record: Box::new(record.clone()),
        });
        // Kept for a later acceptance of the key (dropped below if this
        // one starts its execution).
        self.note_undriven_row(&record);
        // A duplicate of an execution driven here joins it; otherwise the
        // record is driven now if there is room, else left due in the
        // store for the scan (bounded memory).
        if intent && !existing && record.state == ExecState::Dispatching {
            // This acceptance inserted the record with its intent (and its
            // claim, fresh in the same transaction): it is driven at once,
            // in the slot kept for it, also while shutting down (the
            // intent is durable; not sending would only make it `unknown`).
            // Only an acceptance that asked for the intent can have
            // written it: a plain acceptance's reply showing `dispatching`
            // is not this process's intent (fuzz finding 4, session 7) and
            // is driven below like any record found possibly dispatched.
            self.push_telemetry(&record);
            let mut ex = Exec::with_intent(record, now, asked, self.now_ms);
            for row in &earlier {
                ex.on_row_before_intent(row);
            }
            self.accept_rows.remove(&key);
            self.execs.insert(key, ex);
            return;
        }
        if let Some(ex) = self.execs.get_mut(&key) {
            // A duplicate of an execution driven here: its row goes to it
            // like a due scan's (never a send after another intent).
            ex.on_row_read(&record, &self.cfg);
            return;
        }
        if self.shutting_down {
            return;
        }
        if existing && !record.state.is_before_dispatch() && record.next_due_at_ms.is_none() {
            return;
        }
        if self.busy() < self.cfg.max_active {
            let mut ex = Exec::new(record, now, self.now_ms, None);
            for row in &earlier {
                ex.on_row_read(row, &self.cfg);
            }
            self.accept_rows.remove(&key);
            self.execs.insert(key, ex);
        } else if record.state == ExecState::Accepted {
            self.backlog = true;
            if self.queue_bounds.len() >= self.cfg.max_pending as usize {
                self.queue_bounds.pop_first();
            }
            let left = record
                .deadlines
                .queue_ms
                .unwrap_or(0)
                .saturating_sub(self.now_ms);
            self.queue_bounds
                .insert(key, now + Duration::from_millis(left));
        }
    }

    /// A row of a key whose acceptance is still out and that no execution
    /// drives: kept (past `ready` only) for the execution a later
    /// acceptance starts.
    pub(super) fn note_undriven_row(&mut self, rec: &ExecutionRecord) {
        if !rec.state.is_before_dispatch()
            && self.accepting.contains_key(&rec.key)
            && !self.execs.contains_key(&rec.key)
        {
            let rows = self.accept_rows.entry(rec.key.clone()).or_default();
            if rows.len() < 8 {
                rows.push(rec.clone());
            } else {
                // Bounded; any one such row already forbids a send.
                rows[7] = rec.clone();
            }
        }
    }

    pub(super) fn on_cancel(&mut self, key: RecordKey, result: StoreResult) {
        let result = match result {
            // Only a row of the cancelled key answers the cancel: another
            // record's row is a lie, never handed to the key's execution,
            // which took it for its own record and ignored every later row
            // of its key (fuzz finding 21, session 10).
            Ok(StoreReply::Record(rec)) if rec.key == key => Ok(rec),
            Ok(_) => Err(Error::protocol(
                Operation::StoreCancel,
                Reason::UnexpectedReply,
            )),
            Err(e) => Err(e),
        };
        if let (Ok(rec), Some(ex)) = (&result, self.execs.get_mut(&key)) {
            ex.on_cancel_recorded(rec, &self.cfg);
        } else if let Ok(rec) = &result {
            self.note_undriven_row(rec);
        }
        self.notices.push_back(ControllerEvent::CancelRecorded {
            key,
            result: result.map(Box::new),
        });
    }

    pub(super) fn on_scan(&mut self, now: Instant, result: StoreResult) {
        self.scanning = false;
        let Ok(StoreReply::Due { records, next }) = result else {
            // A failed scan is retried next interval (never read as "none
            // due"), unless shutting down: no scan runs any more.
            self.scan_cursor = None;
            self.scan_at = (!self.shutting_down).then(|| now + self.cfg.poll());
            return;
        };
        let mut full = false;
        for rec in records {
            if let Some(ex) = self.execs.get_mut(&rec.key) {
                // Driven here: the row goes to its execution, which never
                // sends a command a row showed possibly sent by another
                // controller (fuzz finding 5), also after the page ran out
                // of room or shutdown began (finding 8).
                ex.on_row_read(&rec, &self.cfg);
                continue;
            }
            // Kept for an acceptance still out, also after shutdown (finding 10).
            self.note_undriven_row(&rec);
            if self.shutting_down {
                continue;
            }
            if matches!(rec.spec.action, Action::Terminal(_)) {
                // Terminals belong to the driver's terminal module.
                if !self.skip.contains_key(&rec.key) {
                    let until = now + Duration::from_millis(self.cfg.lease_ttl_ms);
                    self.skip.insert(rec.key.clone(), until);
                    self.notices
                        .push_back(ControllerEvent::TerminalDue(Box::new(rec)));
                }
                continue;
            }
            if self.accepting.contains_key(&rec.key) {
                continue;
            }
            if self.skip.contains_key(&rec.key) || !self.owns(&rec) {
                continue;
            }
            if self.busy() >= self.cfg.max_active {
                // No room: later rows start nothing, but those of
                // executions driven here still go to them.
                full = true;
                self.backlog = true;
                continue;
            }
            let key = rec.key.clone();
            if let Some(m) = rec.spec.machine.clone() {
                // A retained machine's command: read its machine first.
                self.skip.insert(key, now + self.cfg.poll());
                self.push_store(
                    Purpose::Adopt(Box::new(rec)),
                    StoreOp::FetchMachine { key: m },
                );
                continue;
            }
            let bound = self.queue_bounds.remove(&key);
            self.execs
                .insert(key, Exec::new(rec, now, self.now_ms, bound));
        }
        match next {
            Some(cursor) if !full && !self.shutting_down => {
                self.scan_cursor = Some(cursor);
                self.scan_at = Some(now);
            }
            _ => {
                if !full && !self.shutting_down {
                    // Every due record of this page set was seen with room.
                    self.backlog = false;
                }
                self.scan_cursor = None;
                self.scan_at = if self.shutting_down {
                    None
                } else {
                    Some(now + self.cfg.poll())
                };
            }
        }
    }
}
