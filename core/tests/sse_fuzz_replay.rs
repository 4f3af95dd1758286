//! Replays the committed seed corpora of the `sse` and `exec_stream` fuzz
//! targets through their bodies (plain functions in smolbox-core), so that
//! `cargo test` on stable checks what cargo-fuzz checks on nightly.
#![allow(clippy::unwrap_used)] // test code: a missing corpus should fail loudly

use std::path::PathBuf;

fn replay(target: &str, body: fn(&[u8])) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target);
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let data = std::fs::read(&path).unwrap();
        body(&data);
        n += 1;
    }
    assert!(n >= 10, "{target}: only {n} seeds in {}", dir.display());
}

#[test]
fn sse_seed_corpus_replays() {
    replay("sse", smolbox_core::sse::fuzz_sse);
}

#[test]
fn exec_stream_seed_corpus_replays() {
    replay("exec_stream", smolbox_core::exec::fuzz_exec_stream);
}
