//! Replays the committed `controller` and `row_decode` seed corpora (and
//! truncations of every seed) through their fuzz bodies (docs/fuzzing.md):
//! no input may panic or break an oracle.

use std::path::Path;

fn replay(target: &str, body: fn(&[u8]), min: usize) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target);
    let mut seeds = 0;
    for entry in std::fs::read_dir(&dir).expect("corpus directory exists") {
        let data = std::fs::read(entry.expect("corpus entry").path()).expect("corpus file");
        body(&data);
        for cut in (0..data.len()).step_by(13) {
            body(&data[..cut]);
        }
        seeds += 1;
    }
    assert!(seeds >= min, "{target} corpus has {seeds} seeds");
}

/// Runs the `controller` corpus input `name` (a named finding) once.
fn finding(name: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus/controller")
        .join(name);
    smolbox_store::fuzzing::fuzz_controller(&std::fs::read(path).expect("finding input"));
}

#[test]
fn controller_seed_corpus_keeps_every_oracle() {
    replay("controller", smolbox_store::fuzzing::fuzz_controller, 7);
}

#[test]
fn row_decode_seed_corpus_keeps_every_oracle() {
    replay("row_decode", smolbox_store::fuzzing::fuzz_row, 24);
}

/// Finding 4 of the `controller` target (fuzz/README.md, session 7,
/// fixed): a plain acceptance whose reply showed the new record
/// `dispatching` was driven as this process's own intent and its command
/// sent. The input is also in the replayed corpus; this names it.
#[test]
fn controller_finding_s7_a_plain_acceptance_shown_dispatching_is_never_sent() {
    finding("s7-exec-tainted");
}

/// Finding 5 of the `controller` target (fuzz/README.md, session 7, fixed
/// in session 8): a plain acceptance of `k0`, then a due scan whose
/// (mutated) reply shows `k0` `dispatching`; the scan dropped the row of a
/// record driven here and the execution went on to its own intent and
/// sent. The row now goes to the execution, which never sends after it.
/// The input is also in the replayed corpus; this names it.
#[test]
fn controller_finding_s7_due_reply_shows_dispatching() {
    finding("s7-due-shows-dispatching");
}

/// Finding 9 of the `controller` target (fuzz/README.md, session 8,
/// fixed): a due row of another record under the key `k0`, shown while
/// `k0`'s acceptance with intent was out, matched that acceptance's state,
/// version, generation and claim and was taken for its own intent; the
/// command was sent. Only a row identical to the inserted record is now
/// that intent. The input is also in the replayed corpus; this names it.
#[test]
fn controller_finding_s8_another_records_row_is_not_the_own_intent() {
    finding("s8-exec-tainted-k0");
}

/// Finding 10 of the `controller` target (fuzz/README.md, session 8,
/// fixed in session 9): `k0`'s acceptance with intent out, `shutdown`, then
/// a due scan whose (mutated) reply shows a row of `k0` past `ready`; the
/// scan skipped every undriven row after shutdown instead of keeping it
/// for that acceptance (finding 7), which then sent the command. The row is
/// now kept during shutdown too. The input is also in the replayed corpus;
/// this names it.
#[test]
fn controller_finding_s8_a_row_shown_during_shutdown_is_kept_for_the_acceptance() {
    finding("s8-after-f9");
}

/// Finding 11 of the `controller` target (fuzz/README.md, session 9,
/// fixed): `k0`'s own intent write (detached submitter) was answered with
/// a row showing `k0` `accepted` under another controller's claim; the
/// execution took the answered write as its intent and, the next read
/// showing `dispatching`, sent. Only the write's own outcome is now that
/// intent. The input is also in the replayed corpus; this names it.
#[test]
fn controller_finding_s9_an_intent_reply_that_is_not_the_intent() {
    finding("s9-intent-reply-lied");
}

/// Finding 12 of the `controller` target (fuzz/README.md, session 9,
/// fixed): a store reply at version `u64::MAX` followed by a write's reply
/// overflowed the execution's `version + 1` (a panic on peer input with
/// overflow checks on). The input is also in the replayed corpus.
#[test]
fn controller_finding_s9_a_reply_at_the_largest_version_does_not_panic() {
    finding("s9-version-overflow");
}

/// Finding 13 of the `controller` target (fuzz/README.md, session 9): the
/// oracle was too strict. The reply to the shutdown's release of `k0`'s
/// claim, mutated to carry a row of `k2` (being accepted with its intent),
/// was counted as showing `k2` past `ready`; the controller reads nothing
/// of a release's reply, and a reply about `k0` shows nothing about `k2`.
/// The input is also in the replayed corpus; this names it.
#[test]
fn controller_finding_s9_a_release_reply_shows_nothing_of_another_key() {
    finding("s9-release-reply-other-key");
}

/// Finding 14 of the `controller` target (fuzz/README.md, session 9): the
/// oracle was too strict. A disposable `k2`'s own intent was answered (the
/// grant); while its exec waited for the lapsed worker lease, a due scan
/// read that same row again, unchanged, and the oracle counted it as
/// showing `k2` past `ready`. The input is also in the replayed corpus.
#[test]
fn controller_finding_s9_the_own_intent_read_again_shows_nothing_new() {
    finding("s9-own-intent-scanned-again");
}

/// Finding 15 of the `controller` target (fuzz/README.md, session 9): the
/// oracle was too strict. A disposable `k2`'s own intent was answered (the
/// grant); while its exec waited for the lapsed worker lease, this
/// controller's own cancel of `k2` was recorded on top of the intent
/// (`dispatching`, the next version, the same claim generation), and the
/// oracle counted that row as showing `k2` past `ready`. The input is also
/// in the replayed corpus.
#[test]
fn controller_finding_s9_the_own_cancel_on_the_own_intent_shows_no_other_intent() {
    finding("s9-own-cancel-on-intent");
}

/// Finding 16 of the `controller` target (fuzz/README.md, session 9,
/// fixed): after `k2`'s own intent was answered and while its exec waited
/// for the worker lease, a due scan showed `k2` at the intent's version
/// under another claim generation; the row was ignored and the command
/// sent. The input is also in the replayed corpus.
#[test]
fn controller_finding_s9_a_row_after_the_own_intent_from_another_history() {
    finding("s9-row-after-own-intent");
}

/// Finding 17 of the `controller` target (fuzz/README.md, session 9,
/// fixed): a disposable `k2` never sent (finding 16's rule) waited for the
/// inspect of its machine with its execution deadline long past;
/// `poll_timeout` named that deadline while `handle_timeout` did nothing
/// (a driver would spin). The input is also in the replayed corpus.
#[test]
fn controller_finding_s9_no_timer_in_the_past_while_a_machine_op_is_out() {
    finding("s9-inspect-past-deadline");
}

/// Controller fuzz finding 18 (session 9): a submission refused by the
/// configuration reads its key (AC-12.5.2); that read showed the key's
/// record `running` while this controller drove its own acceptance of it,
/// and the controller took no notice and sent. Fails before the fix.
#[test]
fn controller_finding_s9_a_refused_duplicates_read_counts_like_any_read() {
    for name in ["s9-resolve-row-running", "s9-resolve-row-running-2"] {
        finding(name);
    }
}

/// Controller fuzz finding 19 (session 9, fixed in session 10): while a
/// record's intent write was out, a due scan's page showed another
/// record's row under its key at the intent's version (same state,
/// generation and claim, another spec); it was taken for the early read of
/// the own intent and the command was sent. See fuzz/README.md.
#[test]
fn controller_finding_s9_another_records_row_at_the_intents_version_is_not_the_intent() {
    finding("s9-another-record-at-intent-version");
}

/// Controller fuzz finding 20 (session 10): after its own intent, while
/// the exec waited for the lapsed worker lease, the execution's own read of
/// its record was answered with a row of another history (`completed`, no
/// claim); a later read showed the intent again and the command went out.
/// See fuzz/README.md.
#[test]
fn controller_finding_s10_the_executions_own_read_of_another_history_forbids_the_send() {
    finding("s10-own-read-of-another-history");
}

/// Controller fuzz finding 21 (session 10): this controller's cancel of a
/// record it drove was answered with another key's row at a later version;
/// the execution took it for its own record and sent after rows of other
/// histories (which it no longer matched to its key). See fuzz/README.md.
#[test]
fn controller_finding_s10_a_cancel_answered_with_another_key_is_not_the_record() {
    finding("s10-cancel-answered-with-another-key");
}

/// The `gaps` helper's controller run of session 10 (one job, 719,944
/// executions): the signature of finding 19 on `k3`; it fails on the
/// branch point `c4c58fe` as well (not a regression of that branch).
/// Finding 19's case: it passes with finding 19's fix and fails with that
/// fix's same-record check removed; see fuzz/README.md.
#[test]
fn controller_finding_s10_gaps_k3_unanswered_intent() {
    finding("s10-gaps-k3-unanswered-intent");
}
