//! A record's spec is shared by its copies and carries its JSON once
//! encoded (`SharedSpec`): the envelope bytes stay exactly those of
//! serializing the whole record, for any spec content, and a written spec
//! drops the cached JSON.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use proptest::prelude::*;
use smolbox_core::managed::ExecutionRecord;
use smolbox_core::managed::envelope::{
    HEADER_LEN, decode_exec, encode_exec, encode_exec_validated,
};
use smolbox_core::managed::patch::{apply_exec_steps, intent_steps};
use smolbox_core::managed::record::Claim;
use smolbox_core::managed::spec::{Action, MetaValue, SharedSpec};
use smolbox_core::managed::testkit::{accepted, exec_spec, key, managed_exec_spec};

const T0: u64 = 1_700_000_000_000;

/// The payload as every build before the shared spec wrote it: the record
/// serialized whole, its spec from scratch (a fresh, uncached copy).
fn serialized_whole(rec: &ExecutionRecord) -> Vec<u8> {
    let mut fresh = rec.clone();
    fresh.spec = SharedSpec::new(rec.spec.clone());
    serde_json::to_vec(&fresh).unwrap()
}

fn record_with(
    argv: Vec<String>,
    env_value: String,
    meta: String,
    managed: bool,
) -> ExecutionRecord {
    let mut spec = if managed {
        managed_exec_spec("p", &key("s", "m1"))
    } else {
        exec_spec("p")
    };
    if let Action::Command(c) = &mut spec.action {
        c.argv = argv;
        c.env.insert("K".into(), env_value);
    }
    spec.metadata.insert("note".into(), MetaValue::String(meta));
    let mut rec = accepted(key("s", "r"), spec, T0);
    rec.claim = Some(Claim {
        owner: "ctl".into(),
        until_ms: T0 + 30_000,
    });
    rec.generation = 1;
    rec
}

fn check_identical(rec: &ExecutionRecord) {
    let whole = serialized_whole(rec);
    let first = encode_exec_validated(rec).unwrap();
    assert_eq!(&first[HEADER_LEN..], &whole[..], "first encoding");
    // Cached now: the same bytes again, from this record and any copy
    // (the copies share the spec and its JSON).
    assert_eq!(encode_exec_validated(rec).unwrap(), first);
    let copy = rec.clone();
    assert_eq!(encode_exec(&copy).unwrap(), first);
    // A patched copy (the store's next write) encodes as its whole
    // serialization too.
    let next = apply_exec_steps(rec, &intent_steps(), T0).unwrap();
    let next_bytes = encode_exec_validated(&next).unwrap();
    assert_eq!(&next_bytes[HEADER_LEN..], &serialized_whole(&next)[..]);
    // Decoding (its canonical re-encode check) accepts the bytes and gives
    // the record back.
    assert_eq!(decode_exec(&first).unwrap(), *rec);
    assert_eq!(decode_exec(&next_bytes).unwrap(), next);
}

#[test]
fn the_sample_records_encode_byte_for_byte_as_before() {
    for managed in [false, true] {
        check_identical(&record_with(
            vec!["/bin/true".into()],
            "v".into(),
            "m".into(),
            managed,
        ));
        check_identical(&record_with(
            vec!["sh".into(), "-c".into(), "echo \"a\\b\"\n\t\u{1}é✓".into()],
            "\u{7f}\u{0}</script>".into(),
            "quote \" backslash \\ slash / nl \n".into(),
            managed,
        ));
    }
}

#[test]
fn a_written_spec_drops_the_cached_json() {
    let rec = record_with(vec!["/bin/true".into()], "v".into(), "m".into(), false);
    let before = encode_exec_validated(&rec).unwrap();
    let mut changed = rec.clone();
    if let Action::Command(c) = &mut changed.spec.action {
        c.argv = vec!["/bin/false".into()];
    }
    let after = encode_exec_validated(&changed).unwrap();
    assert_ne!(after, before);
    assert_eq!(&after[HEADER_LEN..], &serialized_whole(&changed)[..]);
    assert!(String::from_utf8_lossy(&after).contains("/bin/false"));
    // The original keeps its own spec and JSON.
    assert_eq!(encode_exec_validated(&rec).unwrap(), before);
    assert!(String::from_utf8_lossy(&before).contains("/bin/true"));
}

proptest! {
    /// Any strings in argv, env and metadata: the envelope's bytes are the
    /// whole record serialized, first and cached, and decode back.
    #[test]
    fn any_spec_encodes_byte_for_byte_as_before(
        argv in prop::collection::vec(any::<String>(), 1..4),
        env_value in any::<String>(),
        meta in any::<String>(),
        managed in any::<bool>(),
    ) {
        check_identical(&record_with(argv, env_value, meta, managed));
    }
}
