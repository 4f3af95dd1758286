//! Every state table of the managed records, in one place: execution states
//! (C13.1), the evidence coupling (C13.2), machine states (C14.1), and the
//! collection / cleanup dimensions.

use serde::{Deserialize, Serialize};

/// Execution record states (C13.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExecState {
    /// Durable, not yet prepared.
    Accepted,
    /// Machine and inputs being prepared.
    Preparing,
    /// Ready to dispatch.
    Ready,
    /// Dispatch intent persisted; the request may be on the wire.
    Dispatching,
    /// Seen running.
    Running,
    /// Exit observed; collecting outputs.
    Collecting,
    /// Finished with outputs collected (terminal).
    Completed,
    /// Background launch acknowledged (terminal).
    Launched,
    /// Exit known, collection failed (terminal).
    CollectionFailed,
    /// Failed before dispatch, or refused with nothing sent (terminal).
    Failed,
    /// Cancelled before dispatch (terminal).
    Cancelled,
    /// Queue budget ran out before preparation (terminal).
    Expired,
    /// Outcome unknown; non-terminal, ends a caller's wait.
    Unknown,
    /// Cancel requested after dispatch.
    Cancelling,
}

impl ExecState {
    /// Every state, in declaration order.
    pub const ALL: [Self; 14] = [
        Self::Accepted,
        Self::Preparing,
        Self::Ready,
        Self::Dispatching,
        Self::Running,
        Self::Collecting,
        Self::Completed,
        Self::Launched,
        Self::CollectionFailed,
        Self::Failed,
        Self::Cancelled,
        Self::Expired,
        Self::Unknown,
        Self::Cancelling,
    ];

    /// The allowed next states (C13.1). A state is never its own successor
    /// here; a patch that keeps the state is not a transition.
    ///
    /// Two moves are added to the table of C13.1, both with evidence
    /// `not_dispatched` only (C13.2: `failed` and `cancelled` carry
    /// nothing else): `dispatching → failed`, for an exec refused after the
    /// intent was durable (nothing left the process), and `dispatching →
    /// cancelled`, for a cancel recorded after the intent and before the
    /// send, which this process then never makes (docs/decisions.md).
    pub const fn next(self) -> &'static [Self] {
        use ExecState::*;
        match self {
            Accepted => &[Preparing, Cancelled, Expired],
            Preparing => &[Ready, Failed, Cancelled],
            Ready => &[Dispatching, Cancelled, Failed],
            Dispatching => &[
                Launched, Running, Collecting, Unknown, Cancelling, Failed, Cancelled,
            ],
            Running => &[Collecting, Unknown, Cancelling],
            Cancelling => &[Collecting, Unknown],
            Unknown => &[Collecting, Cancelling],
            Collecting => &[Completed, CollectionFailed],
            Completed | Launched | CollectionFailed | Failed | Cancelled | Expired => &[],
        }
    }

    /// True when `to` may follow `self` (C13.1).
    pub fn can_move_to(self, to: Self) -> bool {
        self.next().contains(&to)
    }

    /// Terminal states: `completed, launched, collection_failed, failed,
    /// cancelled, expired`. `unknown` is not terminal.
    pub const fn is_terminal(self) -> bool {
        matches!(
            self,
            Self::Completed
                | Self::Launched
                | Self::CollectionFailed
                | Self::Failed
                | Self::Cancelled
                | Self::Expired
        )
    }

    /// True for states before any byte of the command could have left.
    pub const fn is_before_dispatch(self) -> bool {
        matches!(self, Self::Accepted | Self::Preparing | Self::Ready)
    }

    /// True when a caller's wait ends: a terminal state or `unknown` (C16).
    pub const fn ends_wait(self) -> bool {
        self.is_terminal() || matches!(self, Self::Unknown)
    }

    /// True while the record counts against the pending limit of `accept`.
    pub const fn is_pending(self) -> bool {
        !self.is_terminal()
    }

    /// The snake_case name (stored, projected, printed).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Accepted => "accepted",
            Self::Preparing => "preparing",
            Self::Ready => "ready",
            Self::Dispatching => "dispatching",
            Self::Running => "running",
            Self::Collecting => "collecting",
            Self::Completed => "completed",
            Self::Launched => "launched",
            Self::CollectionFailed => "collection_failed",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
            Self::Expired => "expired",
            Self::Unknown => "unknown",
            Self::Cancelling => "cancelling",
        }
    }

    /// The evidence values allowed in this state (C13.2).
    pub const fn allowed_evidence(self) -> &'static [RecordEvidence] {
        use RecordEvidence as E;
        match self {
            Self::Accepted
            | Self::Preparing
            | Self::Ready
            | Self::Cancelled
            | Self::Expired
            | Self::Failed => &[E::NotDispatched],
            Self::Dispatching => &[E::DispatchUncertain],
            Self::Running => &[E::RunningObserved],
            Self::Collecting | Self::Completed | Self::CollectionFailed => &[E::Exited],
            Self::Launched => &[E::Launched],
            Self::Unknown | Self::Cancelling => &[
                E::DispatchUncertain,
                E::RunningObserved,
                E::Unknown,
                E::TerminationConfirmed,
            ],
        }
    }
}

/// What a record knows about its command (C13.2). Like [`crate::Evidence`]
/// plus `launched`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecordEvidence {
    /// Not one byte could have left.
    NotDispatched,
    /// The request may have reached the worker.
    DispatchUncertain,
    /// The command was seen running.
    RunningObserved,
    /// The exit was observed.
    Exited,
    /// A background launch was acknowledged.
    Launched,
    /// The guest is known to have stopped, no exit status.
    TerminationConfirmed,
    /// Nothing can be said.
    Unknown,
}

impl RecordEvidence {
    /// Every value, in declaration order.
    pub const ALL: [Self; 7] = [
        Self::NotDispatched,
        Self::DispatchUncertain,
        Self::RunningObserved,
        Self::Exited,
        Self::Launched,
        Self::TerminationConfirmed,
        Self::Unknown,
    ];

    /// True when evidence may move from `self` to `to` (C13.2): `exited` and
    /// `launched` never change; `termination_confirmed` moves only to
    /// itself, `exited`, or back to `unknown` (machine re-observed running).
    pub fn can_move_to(self, to: Self) -> bool {
        match self {
            Self::Exited | Self::Launched => to == self,
            Self::TerminationConfirmed => {
                matches!(
                    to,
                    Self::TerminationConfirmed | Self::Exited | Self::Unknown
                )
            }
            _ => true,
        }
    }

    /// The core error-model evidence this maps to (`launched` → `exited`
    /// is not claimed: a launch is `running_observed`).
    pub const fn to_error_evidence(self) -> crate::Evidence {
        match self {
            Self::NotDispatched => crate::Evidence::NotDispatched,
            Self::DispatchUncertain => crate::Evidence::DispatchUncertain,
            Self::RunningObserved | Self::Launched => crate::Evidence::RunningObserved,
            Self::Exited => crate::Evidence::Exited,
            Self::TerminationConfirmed => crate::Evidence::TerminationConfirmed,
            Self::Unknown => crate::Evidence::Unknown,
        }
    }
}

/// Output collection progress (C13.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Collection {
    /// Not collected yet.
    Pending,
    /// Every declared output collected.
    Complete,
    /// Some outputs collected.
    Partial,
    /// Collection failed.
    Failed,
}

/// Machine cleanup progress (C13.2). `complete` is permanent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Cleanup {
    /// Not started.
    Pending,
    /// Running.
    InProgress,
    /// Done; permanent.
    Complete,
    /// Attempts exhausted or failed.
    Failed,
}

/// Retained machine states (C14.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MachineRecordState {
    /// Durable, not yet assigned or created.
    Accepted,
    /// Create intent persisted.
    Creating,
    /// Created, not started.
    Created,
    /// Observed running.
    Running,
    /// Observed stopped.
    Stopped,
    /// Start intent persisted.
    Starting,
    /// Stop intent persisted.
    Stopping,
    /// Delete intent persisted.
    Deleting,
    /// Outcome unknown.
    Unknown,
    /// The worker reports no such machine, creation evidence held.
    Missing,
    /// The worker's machine does not match the record.
    Conflict,
    /// Deleted (tombstone, kept for dedup).
    Deleted,
}

impl MachineRecordState {
    /// Every state, in declaration order.
    pub const ALL: [Self; 12] = [
        Self::Accepted,
        Self::Creating,
        Self::Created,
        Self::Running,
        Self::Stopped,
        Self::Starting,
        Self::Stopping,
        Self::Deleting,
        Self::Unknown,
        Self::Missing,
        Self::Conflict,
        Self::Deleted,
    ];

    /// The allowed next states. C14.1 names the states and their
    /// invariants; this table is the lifecycle those invariants permit:
    /// intents (`creating`, `starting`, `stopping`, `deleting`) resolve to
    /// an observation or `unknown`, observations may be re-observed, and
    /// `deleted` is a permanent tombstone.
    pub const fn next(self) -> &'static [Self] {
        use MachineRecordState::*;
        match self {
            Accepted => &[Creating, Conflict, Deleted],
            Creating => &[Created, Running, Unknown, Missing, Conflict],
            Created => &[Starting, Running, Stopped, Deleting, Unknown, Missing],
            Running => &[Stopping, Stopped, Deleting, Unknown, Missing],
            Stopped => &[Starting, Running, Deleting, Unknown, Missing],
            Starting => &[Running, Stopped, Unknown, Missing],
            Stopping => &[Stopped, Running, Unknown, Missing],
            Deleting => &[Deleted, Unknown, Missing],
            Unknown => &[
                Created, Running, Stopped, Starting, Stopping, Deleting, Missing, Conflict, Deleted,
            ],
            Missing => &[Running, Stopped, Unknown, Deleting, Deleted],
            Conflict => &[Unknown, Deleting, Deleted],
            Deleted => &[],
        }
    }

    /// True when `to` may follow `self`.
    pub fn can_move_to(self, to: Self) -> bool {
        self.next().contains(&to)
    }

    /// True for states that require persisted creation evidence (C14.1).
    pub const fn needs_creation_evidence(self) -> bool {
        matches!(self, Self::Created | Self::Running | Self::Stopped)
    }

    /// The snake_case name.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Accepted => "accepted",
            Self::Creating => "creating",
            Self::Created => "created",
            Self::Running => "running",
            Self::Stopped => "stopped",
            Self::Starting => "starting",
            Self::Stopping => "stopping",
            Self::Deleting => "deleting",
            Self::Unknown => "unknown",
            Self::Missing => "missing",
            Self::Conflict => "conflict",
            Self::Deleted => "deleted",
        }
    }
}

/// The lifecycle operation a machine is in (C14.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MachineOperation {
    /// Create.
    Create,
    /// Start.
    Start,
    /// Stop.
    Stop,
    /// Delete.
    Delete,
    /// No operation.
    None,
}

/// The phase of the current machine operation (C14.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MachinePhase {
    /// Requested, not dispatched.
    Pending,
    /// Intent persisted, request may be on the wire.
    Dispatching,
    /// Outcome uncertain.
    Uncertain,
    /// No operation.
    None,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_states_have_no_successors() {
        for s in ExecState::ALL {
            assert_eq!(s.is_terminal(), s.next().is_empty(), "{s:?}");
        }
        assert!(!ExecState::Unknown.is_terminal());
    }

    #[test]
    fn unknown_never_goes_back_before_dispatch() {
        for s in ExecState::Unknown.next() {
            assert!(!s.is_before_dispatch() && *s != ExecState::Dispatching);
        }
    }

    #[test]
    fn exited_and_launched_evidence_are_sticky() {
        for to in RecordEvidence::ALL {
            assert_eq!(
                RecordEvidence::Exited.can_move_to(to),
                to == RecordEvidence::Exited
            );
            assert_eq!(
                RecordEvidence::Launched.can_move_to(to),
                to == RecordEvidence::Launched
            );
        }
        assert!(!RecordEvidence::TerminationConfirmed.can_move_to(RecordEvidence::RunningObserved));
    }

    #[test]
    fn dispatching_may_fail_only_with_nothing_sent() {
        // The one move added to C13.1 (docs/decisions.md): an exec refused
        // with `not_dispatched` after the intent is durable.
        assert!(ExecState::Dispatching.can_move_to(ExecState::Failed));
        assert_eq!(
            ExecState::Failed.allowed_evidence(),
            &[RecordEvidence::NotDispatched]
        );
        // Still no way back from `running` or `unknown` to `failed`.
        assert!(!ExecState::Running.can_move_to(ExecState::Failed));
        assert!(!ExecState::Unknown.can_move_to(ExecState::Failed));
        assert!(!ExecState::Cancelling.can_move_to(ExecState::Failed));
    }

    #[test]
    fn dispatching_may_be_cancelled_only_with_nothing_sent() {
        // The second move added to C13.1 (docs/decisions.md): a cancel
        // recorded after the intent, before the send.
        assert!(ExecState::Dispatching.can_move_to(ExecState::Cancelled));
        assert_eq!(
            ExecState::Cancelled.allowed_evidence(),
            &[RecordEvidence::NotDispatched]
        );
        // Once possibly sent and seen so, never `cancelled`: the
        // observation ends (`cancelling`, `unknown`) instead (C16).
        for from in [
            ExecState::Running,
            ExecState::Cancelling,
            ExecState::Unknown,
            ExecState::Collecting,
        ] {
            assert!(!from.can_move_to(ExecState::Cancelled), "{from:?}");
        }
    }

    #[test]
    fn deleted_machine_is_a_tombstone() {
        assert!(MachineRecordState::Deleted.next().is_empty());
        assert!(MachineRecordState::Running.needs_creation_evidence());
    }
}
