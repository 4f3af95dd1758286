//! Replays the committed `http_response` fuzz seed corpus through the fuzz
//! body (which asserts split-independence and limits and must not panic).

use std::fs;
use std::path::Path;

#[test]
fn replay_http_response_corpus() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/http_response");
    let mut n = 0;
    for entry in fs::read_dir(&dir).expect("corpus directory") {
        let path = entry.expect("corpus entry").path();
        let data = fs::read(&path).expect("corpus file");
        smolbox_core::http1::fuzzing::fuzz_response(&data);
        n += 1;
    }
    assert!(n >= 10, "expected at least 10 seeds in {}", dir.display());
}
