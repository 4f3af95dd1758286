//! Replays the committed `worker_reply` seed corpus (and truncations of
//! every seed) through the fuzz body: no reply decoder may panic.

use std::path::Path;

use smolbox_core::worker::fuzzing::fuzz_worker_reply;

#[test]
fn seed_corpus_never_panics() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/worker_reply");
    let mut seeds = 0;
    for entry in std::fs::read_dir(&dir).expect("corpus directory exists") {
        let data = std::fs::read(entry.expect("corpus entry").path()).expect("corpus file");
        fuzz_worker_reply(&data);
        for cut in (0..data.len()).step_by(17) {
            fuzz_worker_reply(&data[..cut]);
        }
        seeds += 1;
    }
    assert!(seeds >= 20, "corpus has {seeds} seeds");
}

#[test]
fn adversarial_bodies_never_panic() {
    let deep = "[".repeat(10_000);
    let cases: [&[u8]; 9] = [
        b"\xff\xfe\xfd",
        b"{\"machines\":[{}]}",
        b"{\"status\":\"ok\",\"version\":\"1.9.2\",\"machines\":{\"total\":18446744073709551615,\"running\":18446744073709551615}}",
        b"{\"used_cpus\":1e400}",
        b"{\"name\":\"a\",\"name\":\"b\"}",
        b"{\"deleted\":\"wire-test\",\"deleted\":\"wire-test\"}",
        b"{\"cpus\":-1}",
        deep.as_bytes(),
        b"{\"allowedCidrs\":[\"10.0.0.0/999\"]}",
    ];
    for c in cases {
        fuzz_worker_reply(c);
    }
}
