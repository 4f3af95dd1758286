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
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/controller/s7-exec-tainted");
    smolbox_store::fuzzing::fuzz_controller(&std::fs::read(path).expect("finding input"));
}

/// Finding 5 of the `controller` target (fuzz/README.md, session 7, fixed
/// in session 8): a plain acceptance of `k0`, then a due scan whose
/// (mutated) reply shows `k0` `dispatching`; the scan dropped the row of a
/// record driven here and the execution went on to its own intent and
/// sent. The row now goes to the execution, which never sends after it.
/// The input is also in the replayed corpus; this names it.
#[test]
fn controller_finding_s7_due_reply_shows_dispatching() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus/controller/s7-due-shows-dispatching");
    smolbox_store::fuzzing::fuzz_controller(&std::fs::read(path).expect("finding input"));
}

/// Finding 9 of the `controller` target (fuzz/README.md, session 8,
/// fixed): a due row of another record under the key `k0`, shown while
/// `k0`'s acceptance with intent was out, matched that acceptance's state,
/// version, generation and claim and was taken for its own intent; the
/// command was sent. Only a row identical to the inserted record is now
/// that intent. The input is also in the replayed corpus; this names it.
#[test]
fn controller_finding_s8_another_records_row_is_not_the_own_intent() {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/controller/s8-exec-tainted-k0");
    smolbox_store::fuzzing::fuzz_controller(&std::fs::read(path).expect("finding input"));
}

/// Open finding 10 of the `controller` target (fuzz/README.md, session 8):
/// found by a 600 s run after the fix of finding 9, after about 1,000
/// executions; an exec for `k0` follows without this controller's own
/// fresh intent (oracle: `Seen { tainted: true, granted: false }`). Not
/// yet traced or minimized. Kept out of the replayed corpus until it is
/// fixed or the oracle is shown too strict; then the input moves to
/// `fuzz/corpus/controller/` and this test loses its `ignore`.
#[test]
#[ignore = "open finding 10: the controller target's s8-after-f9 input breaks the one-dispatch oracle"]
fn controller_open_finding_s8_after_f9() {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/findings/controller/s8-after-f9");
    smolbox_store::fuzzing::fuzz_controller(&std::fs::read(path).expect("finding input"));
}
