//! Several guarded moves in one commit (issue 16): `apply_exec_steps` and
//! `intent_at_accept` keep every rule of `apply_exec`.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use smolbox_core::Category;
use smolbox_core::Reason;
use smolbox_core::managed::patch::{
    ExecPatch, MAX_STEPS, apply_exec, apply_exec_steps, intent_at_accept, intent_steps,
};
use smolbox_core::managed::record::Claim;
use smolbox_core::managed::state::{ExecState, RecordEvidence};
use smolbox_core::managed::testkit::{accepted, entry_patch, exec_spec, key};

const T0: u64 = 1_700_000_000_000;

fn claimed() -> smolbox_core::managed::ExecutionRecord {
    let mut rec = accepted(key("s", "k"), exec_spec("x"), T0);
    rec.claim = Some(Claim {
        owner: "ctl".into(),
        until_ms: T0 + 30_000,
    });
    rec.generation = 1;
    rec
}

#[test]
fn the_intent_at_acceptance_is_the_three_writes_in_one_version() {
    let rec = claimed();
    let folded = intent_at_accept(&rec).unwrap();
    let mut one_by_one = rec.clone();
    for p in intent_steps() {
        one_by_one = apply_exec(&one_by_one, &p, T0).unwrap();
    }
    assert_eq!(one_by_one.version, 4);
    assert_eq!(folded.version, 1, "one insertion");
    one_by_one.version = 1;
    assert_eq!(folded, one_by_one);
    assert_eq!(folded.state, ExecState::Dispatching);
    assert_eq!(folded.evidence, RecordEvidence::DispatchUncertain);
    assert!(folded.deadlines.execution_ms.is_some());
}

#[test]
fn the_intent_at_acceptance_needs_a_fresh_record_and_a_live_claim() {
    let bare = accepted(key("s", "k"), exec_spec("x"), T0);
    assert_eq!(
        intent_at_accept(&bare).unwrap_err().reason(),
        Reason::IntentWithoutClaim
    );
    let mut expired = claimed();
    expired.claim.as_mut().unwrap().until_ms = T0;
    assert_eq!(
        intent_at_accept(&expired).unwrap_err().reason(),
        Reason::IntentWithoutClaim
    );
    let moved = apply_exec(
        &claimed(),
        &entry_patch(&claimed(), ExecState::Preparing),
        T0,
    )
    .unwrap();
    assert_eq!(
        intent_at_accept(&moved).unwrap_err().reason(),
        Reason::NotFreshlyAccepted
    );
    // C16 still holds inside a fold: a cancel requested refuses the intent.
    let mut cancelled = claimed();
    cancelled.cancel_requested_at_ms = Some(T0);
    let e = apply_exec_steps(&cancelled, &intent_steps(), T0).unwrap_err();
    assert_eq!(
        (e.category(), e.reason()),
        (Category::Validation, Reason::CancelRequested)
    );
}

#[test]
fn steps_are_bounded_at_n_and_n_plus_one_and_each_is_checked() {
    let rec = claimed();
    assert_eq!(
        apply_exec_steps(&rec, &[], T0).unwrap_err().reason(),
        Reason::Steps
    );
    let mut path = Vec::new();
    let mut cur = rec.clone();
    for st in [
        ExecState::Preparing,
        ExecState::Ready,
        ExecState::Dispatching,
        ExecState::Collecting,
        ExecState::Completed,
    ] {
        let p = entry_patch(&cur, st);
        cur = apply_exec(&cur, &p, T0).unwrap();
        path.push(p);
    }
    assert_eq!(MAX_STEPS, 4);
    let four = apply_exec_steps(&rec, &path[..4], T0).unwrap();
    assert_eq!(
        (four.state, four.version),
        (ExecState::Collecting, rec.version + 1)
    );
    assert_eq!(
        apply_exec_steps(&rec, &path, T0).unwrap_err().reason(),
        Reason::Steps
    );
    // A forbidden move anywhere refuses the whole fold.
    let skip: Vec<ExecPatch> = vec![path[0].clone(), path[3].clone()];
    assert_eq!(
        apply_exec_steps(&rec, &skip, T0).unwrap_err().reason(),
        Reason::ForbiddenTransition
    );
}

#[test]
fn a_middle_step_that_breaks_an_invariant_refuses_the_fold_though_a_later_step_mends_it() {
    let mut cur = claimed();
    for st in [
        ExecState::Preparing,
        ExecState::Ready,
        ExecState::Dispatching,
    ] {
        cur = apply_exec(&cur, &entry_patch(&cur, st), T0).unwrap();
    }
    // `collecting` with its result is one valid move; split into the move
    // without the result (no result in `collecting`: an invariant broken)
    // and the result alone, the end record would be the valid one.
    let whole = entry_patch(&cur, ExecState::Collecting);
    assert!(whole.result.is_some());
    assert!(apply_exec(&cur, &whole, T0).is_ok());
    let bare = ExecPatch {
        result: None,
        ..whole.clone()
    };
    let mend = ExecPatch {
        result: whole.result.clone(),
        ..ExecPatch::default()
    };
    assert_eq!(
        apply_exec(&cur, &bare, T0).unwrap_err().reason(),
        Reason::ResultState
    );
    let e = apply_exec_steps(&cur, &[bare.clone(), mend.clone()], T0).unwrap_err();
    assert_eq!(
        (e.category(), e.reason()),
        (Category::Validation, Reason::ResultState)
    );
    // The same in the third of three steps (a later step's validation,
    // not only the first's).
    let noop = ExecPatch::default();
    let e = apply_exec_steps(&cur, &[noop.clone(), bare, mend], T0).unwrap_err();
    assert_eq!(e.reason(), Reason::ResultState);
    // And a rule of a step against the value before it, in a middle step:
    // cleanup attempts never decrease.
    let up = ExecPatch {
        cleanup_attempts: Some(2),
        ..ExecPatch::default()
    };
    let down = ExecPatch {
        cleanup_attempts: Some(1),
        ..ExecPatch::default()
    };
    assert_eq!(
        apply_exec_steps(&cur, &[noop.clone(), up.clone(), down, up.clone()], T0)
            .unwrap_err()
            .reason(),
        Reason::CleanupAttemptsDecrease
    );
    assert_eq!(
        apply_exec_steps(&cur, &[noop, up.clone(), up], T0)
            .unwrap()
            .cleanup_attempts,
        2
    );
}
