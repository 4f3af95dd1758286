//! Managed terminals, sans-IO (features C7.3, C7.4): what a session's end
//! means for its durable record ([`Verdict`], [`closing_patches`]) and the
//! runtime's live registry of connections ([`Registry`]).
//!
//! Nothing here reads a clock: every call that depends on time takes
//! `now`. Terminal bytes never pass through this module; the registry holds
//! the shell's connection object opaquely and reports counts only.

use super::patch::ExecPatch;
use super::record::{ErrorEntry, ExecResult};
use super::state::{Collection, ExecState, RecordEvidence};
use crate::terminal::TerminalExit;
use crate::{Category, Error, Evidence};

/// What a terminal session's end proves about its program (C7.3, C7.4).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// A confirmed exit (0–255 except 124 and 130): the record becomes
    /// `completed` / `exited` with a terminal result and no transcript.
    Exited(i32),
    /// Nothing could have reached the worker (the upgrade was refused
    /// before a byte left): the record becomes `failed` / `not_dispatched`.
    NotSent(Error),
    /// The program may have run and its outcome is not known (124, 130,
    /// −1, a close before the exit frame, a budget, buffer exhaustion
    /// `output_limit`, a lost consumer…): the record becomes `unknown` and
    /// keeps the machine's slot.
    Uncertain(Error),
}

impl Verdict {
    /// Classifies a session's outcome, or the error of the open itself.
    pub fn of(outcome: &Result<TerminalExit, Error>) -> Self {
        match outcome {
            Ok(TerminalExit { code }) if (0..=255).contains(code) && !matches!(code, 124 | 130) => {
                Self::Exited(*code)
            }
            Ok(TerminalExit { code }) => Self::Uncertain(
                Error::new(
                    Category::Unknown,
                    crate::Operation::TerminalSession,
                    Evidence::Unknown,
                )
                .with_reason("ambiguous_exit_code")
                .with_exit_code(*code),
            ),
            Err(e) if e.evidence() == Evidence::NotDispatched => Self::NotSent(*e),
            Err(e) => Self::Uncertain(*e),
        }
    }

    /// The confirmed exit code, if any.
    pub const fn exit_code(&self) -> Option<i32> {
        match self {
            Self::Exited(c) => Some(*c),
            _ => None,
        }
    }
}

/// The guarded writes, in order, that record `verdict` on a record in
/// `state` (`dispatching`, `running`, `cancelling` or `unknown`): an exit
/// is `collecting` with the terminal result, then `completed` (nothing to
/// collect); an uncertain end is `unknown` with the error; a refused open
/// is `failed` / `not_dispatched`. Empty when the record cannot take the
/// verdict (already finished, or an exit already stored: a completed
/// result is never erased).
pub fn closing_patches(state: ExecState, verdict: &Verdict, now_ms: u64) -> Vec<ExecPatch> {
    match verdict {
        Verdict::Exited(code) if state.can_move_to(ExecState::Collecting) => vec![
            ExecPatch {
                state: Some(ExecState::Collecting),
                evidence: Some(RecordEvidence::Exited),
                result: Some(ExecResult::Terminal { exit_code: *code }),
                ..ExecPatch::default()
            },
            ExecPatch {
                state: Some(ExecState::Completed),
                collection: Some(Collection::Complete),
                next_due_at_ms: Some(None),
                ..ExecPatch::default()
            },
        ],
        Verdict::Exited(_) if state == ExecState::Collecting => vec![ExecPatch {
            state: Some(ExecState::Completed),
            collection: Some(Collection::Complete),
            next_due_at_ms: Some(None),
            ..ExecPatch::default()
        }],
        Verdict::NotSent(e) if state.can_move_to(ExecState::Failed) => vec![ExecPatch {
            state: Some(ExecState::Failed),
            evidence: Some(RecordEvidence::NotDispatched),
            next_due_at_ms: Some(None),
            last_error: Some(ErrorEntry::from_error(e, now_ms)),
            ..ExecPatch::default()
        }],
        Verdict::NotSent(e) | Verdict::Uncertain(e)
            if state.can_move_to(ExecState::Unknown) || state == ExecState::Unknown =>
        {
            vec![ExecPatch {
                state: Some(ExecState::Unknown),
                next_due_at_ms: Some(None),
                last_error: Some(ErrorEntry::from_error(e, now_ms)),
                ..ExecPatch::default()
            }]
        }
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Operation;
    use crate::managed::patch::apply_exec;
    use crate::managed::testkit::{accepted, key, managed_exec_spec};
    use crate::managed::{ExecutionRecord, spec::Action, spec::ManagedTerminalSpec};

    const T0: u64 = 1_700_000_000_000;

    fn terminal_record(state: ExecState) -> ExecutionRecord {
        let mut spec = managed_exec_spec("t", &key("s", "machine-1"));
        spec.outputs.clear();
        spec.action = Action::Terminal(ManagedTerminalSpec::default());
        let mut rec = accepted(key("s", "term-1"), spec, T0);
        let path: &[ExecState] = match state {
            ExecState::Dispatching => &[
                ExecState::Preparing,
                ExecState::Ready,
                ExecState::Dispatching,
            ],
            ExecState::Running => &[
                ExecState::Preparing,
                ExecState::Ready,
                ExecState::Dispatching,
                ExecState::Running,
            ],
            _ => &[],
        };
        for (i, s) in path.iter().enumerate() {
            let ev = match s {
                ExecState::Dispatching => Some(RecordEvidence::DispatchUncertain),
                ExecState::Running => Some(RecordEvidence::RunningObserved),
                _ => None,
            };
            let p = ExecPatch {
                state: Some(*s),
                evidence: ev,
                ..ExecPatch::default()
            };
            rec = apply_exec(&rec, &p, T0 + i as u64 + 1).unwrap();
        }
        rec
    }

    fn apply_all(rec: &ExecutionRecord, patches: &[ExecPatch]) -> ExecutionRecord {
        let mut r = rec.clone();
        for (i, p) in patches.iter().enumerate() {
            r = apply_exec(&r, p, T0 + 100 + i as u64).unwrap();
        }
        r
    }

    #[test]
    fn a_confirmed_exit_completes_with_a_terminal_result_and_no_transcript() {
        for code in [0, 7, 123, 125, 129, 131, 255] {
            let v = Verdict::of(&Ok(TerminalExit { code }));
            assert_eq!(v, Verdict::Exited(code));
            let rec = terminal_record(ExecState::Running);
            let done = apply_all(&rec, &closing_patches(rec.state, &v, T0 + 100));
            assert_eq!(done.state, ExecState::Completed);
            assert_eq!(done.evidence, RecordEvidence::Exited);
            assert_eq!(done.result, Some(ExecResult::Terminal { exit_code: code }));
            assert_eq!(done.collection, Collection::Complete);
            assert!(done.artifacts.is_empty(), "no transcript");
        }
    }

    #[test]
    fn codes_124_130_and_minus_1_stay_uncertain() {
        for code in [124, 130, -1] {
            let v = Verdict::of(&Ok(TerminalExit { code }));
            let Verdict::Uncertain(e) = &v else {
                panic!("{code} must be uncertain: {v:?}")
            };
            assert_eq!(e.exit_code(), Some(code));
            let rec = terminal_record(ExecState::Running);
            let done = apply_all(&rec, &closing_patches(rec.state, &v, T0 + 100));
            assert_eq!(done.state, ExecState::Unknown);
            assert_eq!(done.result, None);
        }
        // The session itself reports them as errors: still uncertain.
        let e = Error::new(
            Category::Unknown,
            Operation::TerminalSession,
            Evidence::Unknown,
        )
        .with_exit_code(130);
        assert!(matches!(Verdict::of(&Err(e)), Verdict::Uncertain(_)));
    }

    #[test]
    fn a_terminal_result_refuses_the_sentinel_codes_in_the_record() {
        let rec = terminal_record(ExecState::Running);
        let bad = ExecPatch {
            state: Some(ExecState::Collecting),
            evidence: Some(RecordEvidence::Exited),
            result: Some(ExecResult::Terminal { exit_code: 130 }),
            ..ExecPatch::default()
        };
        assert!(apply_exec(&rec, &bad, T0 + 100).is_err());
        let wrong_kind = ExecPatch {
            result: Some(ExecResult::Exited {
                exit_code: 0,
                output_bytes: 0,
                truncated: false,
            }),
            ..bad
        };
        assert!(apply_exec(&rec, &wrong_kind, T0 + 100).is_err());
    }

    #[test]
    fn buffer_exhaustion_is_an_uncertain_output_limit() {
        let e = Error::new(
            Category::OutputLimit,
            Operation::TerminalOutput,
            Evidence::Unknown,
        )
        .with_reason("unread_output");
        let v = Verdict::of(&Err(e));
        assert!(matches!(&v, Verdict::Uncertain(e) if e.category() == Category::OutputLimit));
        let rec = terminal_record(ExecState::Running);
        let done = apply_all(&rec, &closing_patches(rec.state, &v, T0 + 100));
        assert_eq!(done.state, ExecState::Unknown);
        assert_eq!(done.result, None);
        assert_eq!(
            done.last_error.map(|e| e.category),
            Some("output_limit".to_owned())
        );
    }

    #[test]
    fn a_refused_open_fails_without_dispatch_and_a_finished_record_takes_nothing() {
        let e = Error::new(
            Category::Transport,
            Operation::TerminalOpen,
            Evidence::NotDispatched,
        );
        let v = Verdict::of(&Err(e));
        let rec = terminal_record(ExecState::Dispatching);
        let done = apply_all(&rec, &closing_patches(rec.state, &v, T0 + 100));
        assert_eq!(
            (done.state, done.evidence),
            (ExecState::Failed, RecordEvidence::NotDispatched)
        );
        let completed = apply_all(
            &rec,
            &closing_patches(rec.state, &Verdict::Exited(0), T0 + 100),
        );
        for v in [
            Verdict::Exited(1),
            Verdict::Uncertain(e),
            Verdict::NotSent(e),
        ] {
            assert!(closing_patches(completed.state, &v, T0 + 200).is_empty());
        }
    }
}
