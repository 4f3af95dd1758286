//! Replays the committed fuzz seed corpora (`fuzz/corpus/ws_frame/`,
//! `fuzz/corpus/terminal_session/`) through the fuzz bodies: none may
//! panic. Also every prefix of each seed, to reach the partial states.

use std::path::PathBuf;

fn corpus(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target);
    let mut seeds: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| {
            let path = entry.expect("readable corpus entry").path();
            let bytes = std::fs::read(&path).expect("readable seed");
            (path.display().to_string(), bytes)
        })
        .collect();
    seeds.sort();
    assert!(seeds.len() >= 8, "the {target} corpus is committed");
    seeds
}

#[test]
fn ws_frame_corpus_replays() {
    for (_name, bytes) in corpus("ws_frame") {
        smolbox_core::ws::fuzz_ws_frames(&bytes);
        for end in (0..bytes.len()).step_by(3) {
            smolbox_core::ws::fuzz_ws_frames(&bytes[..end]);
        }
    }
}

#[test]
fn terminal_session_corpus_replays() {
    for (_name, bytes) in corpus("terminal_session") {
        smolbox_core::terminal::fuzz_terminal(&bytes);
        for end in (0..bytes.len()).step_by(7) {
            smolbox_core::terminal::fuzz_terminal(&bytes[..end]);
        }
    }
}
