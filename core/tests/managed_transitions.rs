//! Execution and machine record transitions (C13.1–C13.4, C14.1): every
//! allowed and forbidden move, evidence coupling, write-once fields,
//! deadlines set once, and the properties AC-13.1 / AC-13.2.
#![allow(clippy::unwrap_used)] // tests: a panic is the failure report

use proptest::prelude::*;
use smolbox_core::Category;
use smolbox_core::Reason;
use smolbox_core::managed::patch::{ExecPatch, MachinePatch, apply_exec, apply_machine};
use smolbox_core::managed::record::{CreationEvidence, ErrorEntry, ExecResult};
use smolbox_core::managed::state::{
    Cleanup, Collection, ExecState, MachineRecordState, RecordEvidence,
};
use smolbox_core::managed::testkit::{self, EXIT, entry_patch, exec_in, key, machine_in};

const T0: u64 = 1_700_000_000_000;

#[test]
fn every_state_is_reachable_and_valid() {
    for s in ExecState::ALL {
        let rec = exec_in(s, key("s", "r"), T0).unwrap();
        assert_eq!(rec.state, s);
        rec.validate().unwrap();
        assert_eq!(rec.version, 1 + testkit::path_to(s).len() as u64);
    }
}

#[test]
fn every_allowed_and_forbidden_execution_transition() {
    for from in ExecState::ALL {
        let rec = exec_in(from, key("s", "r"), T0).unwrap();
        for to in ExecState::ALL {
            if to == from {
                continue;
            }
            let got = apply_exec(&rec, &entry_patch(&rec, to), T0 + 100);
            if from.can_move_to(to) {
                let next = got.unwrap_or_else(|e| panic!("{from:?} -> {to:?}: {e}"));
                assert_eq!(next.state, to);
                assert_eq!(next.version, rec.version + 1);
                assert_eq!(next.updated_at_ms, T0 + 100);
            } else {
                let e = got.expect_err(&format!("{from:?} -> {to:?} must be refused"));
                assert_eq!(e.category(), Category::Validation);
                assert_eq!(
                    e.reason(),
                    Reason::ForbiddenTransition,
                    "{from:?} -> {to:?}"
                );
            }
        }
    }
}

#[test]
fn every_allowed_and_forbidden_machine_transition() {
    for from in MachineRecordState::ALL {
        let rec = machine_in(from, key("s", "m"), T0).unwrap();
        for to in MachineRecordState::ALL {
            if to == from {
                continue;
            }
            let patch = MachinePatch {
                state: Some(to),
                creation: Some(CreationEvidence {
                    created_at_ms: T0,
                    incarnation: "inc-1".into(),
                }),
                ..MachinePatch::default()
            };
            let got = apply_machine(&rec, &patch, T0 + 100);
            if from.can_move_to(to) {
                assert_eq!(got.unwrap().state, to, "{from:?} -> {to:?}");
            } else {
                assert_eq!(
                    got.unwrap_err().reason(),
                    Reason::ForbiddenTransition,
                    "{from:?} -> {to:?}"
                );
            }
        }
    }
}

#[test]
fn evidence_must_match_the_state() {
    let rec = exec_in(ExecState::Ready, key("s", "r"), T0).unwrap();
    // dispatching with not_dispatched evidence breaks C13.2
    let p = ExecPatch {
        state: Some(ExecState::Dispatching),
        ..ExecPatch::default()
    };
    assert_eq!(
        apply_exec(&rec, &p, T0 + 10).unwrap_err().reason(),
        Reason::EvidenceState
    );
    // collecting without a result
    let rec = exec_in(ExecState::Running, key("s", "r"), T0).unwrap();
    let p = ExecPatch {
        state: Some(ExecState::Collecting),
        evidence: Some(RecordEvidence::Exited),
        ..ExecPatch::default()
    };
    assert_eq!(
        apply_exec(&rec, &p, T0 + 10).unwrap_err().reason(),
        Reason::ResultState
    );
    // completed needs complete collection
    let rec = exec_in(ExecState::Collecting, key("s", "r"), T0).unwrap();
    let p = ExecPatch {
        state: Some(ExecState::Completed),
        collection: Some(Collection::Partial),
        ..ExecPatch::default()
    };
    assert_eq!(
        apply_exec(&rec, &p, T0 + 10).unwrap_err().reason(),
        Reason::CollectionState
    );
}

#[test]
fn exited_evidence_never_changes() {
    let rec = exec_in(ExecState::Collecting, key("s", "r"), T0).unwrap();
    for ev in RecordEvidence::ALL {
        let p = ExecPatch {
            evidence: Some(ev),
            ..ExecPatch::default()
        };
        assert_eq!(
            apply_exec(&rec, &p, T0 + 10).is_ok(),
            ev == RecordEvidence::Exited,
            "{ev:?}"
        );
    }
}

#[test]
fn result_creation_and_absence_are_write_once() {
    let rec = exec_in(ExecState::Collecting, key("s", "r"), T0).unwrap();
    let same = ExecPatch {
        result: Some(EXIT),
        ..ExecPatch::default()
    };
    assert!(apply_exec(&rec, &same, T0 + 10).is_ok());
    let other = ExecPatch {
        result: Some(ExecResult::Exited {
            exit_code: 1,
            output_bytes: 0,
            truncated: false,
        }),
        ..ExecPatch::default()
    };
    assert_eq!(
        apply_exec(&rec, &other, T0 + 10).unwrap_err().reason(),
        Reason::ResultWriteOnce
    );

    let c1 = CreationEvidence {
        created_at_ms: T0,
        incarnation: "a".into(),
    };
    let with = apply_exec(
        &rec,
        &ExecPatch {
            creation: Some(c1.clone()),
            absence_at_ms: Some(T0 + 5),
            ..ExecPatch::default()
        },
        T0 + 10,
    )
    .unwrap();
    let c2 = CreationEvidence {
        incarnation: "b".into(),
        ..c1
    };
    let p = ExecPatch {
        creation: Some(c2),
        ..ExecPatch::default()
    };
    assert_eq!(
        apply_exec(&with, &p, T0 + 11).unwrap_err().reason(),
        Reason::CreationWriteOnce
    );
    let p = ExecPatch {
        absence_at_ms: Some(T0 + 6),
        ..ExecPatch::default()
    };
    assert_eq!(
        apply_exec(&with, &p, T0 + 11).unwrap_err().reason(),
        Reason::AbsenceWriteOnce
    );
}

#[test]
fn clock_never_goes_back_and_version_counts_writes() {
    let rec = exec_in(ExecState::Preparing, key("s", "r"), T0).unwrap();
    let p = ExecPatch::default();
    let e = apply_exec(&rec, &p, rec.updated_at_ms - 1).unwrap_err();
    assert_eq!(e.reason(), Reason::ClockBeforeUpdatedAt);
    let next = apply_exec(&rec, &p, rec.updated_at_ms).unwrap();
    assert_eq!(next.version, rec.version + 1);
}

#[test]
fn deadlines_are_set_once_on_first_entry() {
    let rec = exec_in(ExecState::Dispatching, key("s", "r"), T0).unwrap();
    let b = rec.spec.profile.budgets;
    assert_eq!(rec.deadlines.queue_ms, Some(T0 + rec.spec.queue_budget_ms));
    assert_eq!(
        rec.deadlines.preparation_ms,
        Some(T0 + 1 + b.preparation_ms)
    );
    let exec_deadline = T0 + 3 + b.execution_ms;
    assert_eq!(rec.deadlines.execution_ms, Some(exec_deadline));
    // running -> unknown -> cancelling -> unknown -> collecting: execution
    // deadline never moves; cleanup set once on first entry to unknown.
    let r = apply_exec(&rec, &entry_patch(&rec, ExecState::Unknown), T0 + 50).unwrap();
    let cleanup = r.deadlines.cleanup_ms.unwrap();
    assert_eq!(
        cleanup,
        exec_deadline + rec.spec.retention_ms + b.cleanup_ms
    );
    let r = apply_exec(&r, &entry_patch(&r, ExecState::Cancelling), T0 + 60).unwrap();
    let r = apply_exec(&r, &entry_patch(&r, ExecState::Unknown), T0 + 70).unwrap();
    assert_eq!(r.deadlines.execution_ms, Some(exec_deadline));
    assert_eq!(r.deadlines.cleanup_ms, Some(cleanup));
    let r = apply_exec(&r, &entry_patch(&r, ExecState::Collecting), T0 + 80).unwrap();
    assert_eq!(r.deadlines.collection_ms, Some(T0 + 80 + b.collection_ms));
}

#[test]
fn cleanup_complete_is_permanent_and_needs_terminal_or_unknown() {
    let running = exec_in(ExecState::Running, key("s", "r"), T0).unwrap();
    let p = ExecPatch {
        cleanup: Some(Cleanup::Complete),
        ..ExecPatch::default()
    };
    assert_eq!(
        apply_exec(&running, &p, T0 + 10).unwrap_err().reason(),
        Reason::CleanupState
    );
    let done = exec_in(ExecState::Completed, key("s", "r"), T0).unwrap();
    let done = apply_exec(&done, &p, T0 + 10).unwrap();
    let back = ExecPatch {
        cleanup: Some(Cleanup::Failed),
        ..ExecPatch::default()
    };
    assert_eq!(
        apply_exec(&done, &back, T0 + 11).unwrap_err().reason(),
        Reason::CleanupCompletePermanent
    );
}

#[test]
fn error_history_keeps_the_latest_eight() {
    let mut rec = exec_in(ExecState::Running, key("s", "r"), T0).unwrap();
    for i in 0..10 {
        let e = smolbox_core::Error::validation(smolbox_core::Operation::Exec, Reason::ArgvEmpty);
        let p = ExecPatch {
            last_error: Some(ErrorEntry::from_error(&e, T0 + 100 + i)),
            ..ExecPatch::default()
        };
        rec = apply_exec(&rec, &p, T0 + 100 + i).unwrap();
    }
    assert_eq!(rec.errors.len(), 8);
    assert_eq!(rec.errors[0].at_ms, T0 + 102);
    assert_eq!(rec.last_error.as_ref().unwrap().at_ms, T0 + 109);
}

#[test]
fn artifacts_must_match_declared_outputs_at_n_and_n_plus_one_bytes() {
    let rec = exec_in(ExecState::Collecting, key("s", "r"), T0).unwrap();
    let out = rec.spec.outputs[0].clone();
    let art = |size| smolbox_core::managed::record::CollectedArtifact {
        path: out.path.clone(),
        destination: out.destination.clone(),
        size,
        sha256: "b".repeat(64),
    };
    let p = |size| ExecPatch {
        artifacts: Some(vec![art(size)]),
        ..ExecPatch::default()
    };
    assert!(apply_exec(&rec, &p(out.max_size), T0 + 10).is_ok());
    assert_eq!(
        apply_exec(&rec, &p(out.max_size + 1), T0 + 10)
            .unwrap_err()
            .reason(),
        Reason::ArtifactSize
    );
    let mut other = art(1);
    other.path = "/elsewhere".into();
    let p = ExecPatch {
        artifacts: Some(vec![other]),
        ..ExecPatch::default()
    };
    assert_eq!(
        apply_exec(&rec, &p, T0 + 10).unwrap_err().reason(),
        Reason::ArtifactUndeclared
    );
}

fn any_patch() -> impl Strategy<Value = ExecPatch> {
    let state = prop::option::of(prop::sample::select(ExecState::ALL.to_vec()));
    let evidence = prop::option::of(prop::sample::select(RecordEvidence::ALL.to_vec()));
    let collection = prop::option::of(prop::sample::select(vec![
        Collection::Pending,
        Collection::Complete,
        Collection::Partial,
        Collection::Failed,
    ]));
    let due = prop::option::of(prop::option::of(0u64..10));
    (state, evidence, collection, due, any::<bool>()).prop_map(
        |(state, evidence, collection, due, res)| ExecPatch {
            state,
            evidence,
            collection,
            next_due_at_ms: due.map(|d| d.map(|d| T0 + d)),
            result: res.then_some(EXIT),
            ..ExecPatch::default()
        },
    )
}

proptest! {
    /// AC-13.1: from `unknown`, no sequence of patches reaches accepted,
    /// preparing, ready or dispatching, and the execution deadline never moves.
    #[test]
    fn ac_13_1_unknown_never_returns_before_dispatch(patches in prop::collection::vec(any_patch(), 1..40)) {
        let mut rec = exec_in(ExecState::Unknown, key("s", "r"), T0).unwrap();
        let deadline = rec.deadlines.execution_ms;
        prop_assert!(deadline.is_some());
        let mut now = T0 + 1_000;
        for p in patches {
            now += 1;
            if let Ok(next) = apply_exec(&rec, &p, now) {
                rec = next;
            }
            prop_assert!(!rec.state.is_before_dispatch() && rec.state != ExecState::Dispatching);
            prop_assert_eq!(rec.deadlines.execution_ms, deadline);
        }
    }

    /// AC-13.2: `unknown` with `termination_confirmed` never becomes
    /// `completed` or `cancelled` (no exit was observed, so no result).
    #[test]
    fn ac_13_2_termination_confirmed_unknown_never_completes(patches in prop::collection::vec(any_patch(), 1..40)) {
        let rec = exec_in(ExecState::Unknown, key("s", "r"), T0).unwrap();
        let mut rec = apply_exec(&rec, &ExecPatch { evidence: Some(RecordEvidence::TerminationConfirmed), ..ExecPatch::default() }, T0 + 500).unwrap();
        let mut now = T0 + 1_000;
        for mut p in patches {
            p.result = None;
            now += 1;
            if let Ok(next) = apply_exec(&rec, &p, now) {
                rec = next;
            }
            prop_assert!(!matches!(rec.state, ExecState::Completed | ExecState::Cancelled));
        }
    }
}

#[test]
fn a_cancel_request_refuses_the_dispatch_intent() {
    // C16: a cancel requested before dispatch wins; every store applies
    // this rule, so the intent write fails and nothing is sent.
    let mut rec = exec_in(ExecState::Ready, key("s", "r"), T0).unwrap();
    let intent = entry_patch(&rec, ExecState::Dispatching);
    apply_exec(&rec, &intent, T0 + 100).unwrap();
    rec.cancel_requested_at_ms = Some(T0);
    let e = apply_exec(&rec, &intent, T0 + 100).unwrap_err();
    assert_eq!(e.category(), Category::Validation);
    assert_eq!(e.reason(), Reason::CancelRequested);
    // Cancelled is still reachable.
    let next = apply_exec(&rec, &entry_patch(&rec, ExecState::Cancelled), T0 + 100).unwrap();
    assert_eq!(next.state, ExecState::Cancelled);
}

#[test]
fn dispatching_fails_only_back_to_not_dispatched() {
    let rec = exec_in(ExecState::Dispatching, key("s", "r"), T0).unwrap();
    let failed = ExecPatch {
        state: Some(ExecState::Failed),
        evidence: Some(RecordEvidence::NotDispatched),
        ..ExecPatch::default()
    };
    let next = apply_exec(&rec, &failed, T0 + 100).unwrap();
    assert_eq!(next.evidence, RecordEvidence::NotDispatched);
    let uncertain = ExecPatch {
        state: Some(ExecState::Failed),
        ..ExecPatch::default()
    };
    assert!(apply_exec(&rec, &uncertain, T0 + 100).is_err());
}
