//! The record envelope (C19): AC-19.1 round trips of every state of every
//! record type, appended bytes, unknown versions, unexpected keys, the size
//! cap, AC-19.2 selective versions, and the fuzz seed corpus.
#![allow(clippy::unwrap_used)] // tests: a panic is the failure report

use smolbox_core::Category;
use smolbox_core::Reason;
use smolbox_core::managed::envelope::{
    self, CURRENT_VERSION, Capabilities, HEADER_LEN, MAX_PAYLOAD_LEN, decode_exec, decode_machine,
    encode_exec, encode_machine, exec_requirements,
};
use smolbox_core::managed::spec::{Action, GuestPathPolicy, ManagedTerminalSpec};
use smolbox_core::managed::state::{ExecState, MachineRecordState};
use smolbox_core::managed::testkit::{
    accepted, exec_in, exec_spec, key, machine_in, managed_exec_spec,
};

const T0: u64 = 1_700_000_000_000;

fn store_reason(r: Result<impl std::fmt::Debug, smolbox_core::Error>) -> Reason {
    let e = r.unwrap_err();
    assert_eq!(e.category(), Category::Store, "{e:?}");
    e.reason()
}

#[test]
fn ac_19_1_every_state_round_trips_and_an_appended_byte_fails() {
    for s in ExecState::ALL {
        let rec = exec_in(s, key("s", "r"), T0).unwrap();
        let bytes = encode_exec(&rec).unwrap();
        assert_eq!(decode_exec(&bytes).unwrap(), rec, "{s:?}");
        for extra in [b' ', b'\n', b'0', b'}'] {
            let mut more = bytes.clone();
            more.push(extra);
            let reason = store_reason(decode_exec(&more));
            assert!(
                matches!(reason, Reason::PayloadNotCanonical | Reason::PayloadDecode),
                "{reason}"
            );
        }
    }
    for s in MachineRecordState::ALL {
        let rec = machine_in(s, key("s", "m"), T0).unwrap();
        let bytes = encode_machine(&rec).unwrap();
        assert_eq!(decode_machine(&bytes).unwrap(), rec, "{s:?}");
        let mut more = bytes.clone();
        more.push(b' ');
        assert_eq!(
            store_reason(decode_machine(&more)),
            Reason::PayloadNotCanonical
        );
    }
}

#[test]
fn ac_19_1_unknown_version_is_a_store_error() {
    let rec = exec_in(ExecState::Running, key("s", "r"), T0).unwrap();
    let mut bytes = encode_exec(&rec).unwrap();
    for v in [0u16, CURRENT_VERSION + 1, 0x1f8b] {
        bytes[..2].copy_from_slice(&v.to_be_bytes());
        assert_eq!(
            store_reason(decode_exec(&bytes)),
            Reason::UnknownEnvelopeVersion
        );
    }
}

#[test]
fn kind_mismatch_short_and_garbage_are_store_errors() {
    let rec = exec_in(ExecState::Running, key("s", "r"), T0).unwrap();
    let bytes = encode_exec(&rec).unwrap();
    assert_eq!(
        store_reason(decode_machine(&bytes)),
        Reason::RecordKindMismatch
    );
    assert_eq!(
        store_reason(decode_exec(&bytes[..2])),
        Reason::EnvelopeShort
    );
    assert_eq!(
        store_reason(decode_exec(&bytes[..bytes.len() - 1])),
        Reason::PayloadDecode
    );
}

#[test]
fn unexpected_keys_and_variants_are_refused() {
    let rec = accepted(key("s", "r"), exec_spec("x"), T0);
    let bytes = encode_exec(&rec).unwrap();
    let payload = std::str::from_utf8(&bytes[HEADER_LEN..]).unwrap();
    let with_key = payload.replacen("{\"schema\":1", "{\"schema\":1,\"extra\":true", 1);
    let with_variant = payload.replace("\"accepted\"", "\"teleported\"");
    let with_null = payload.replacen("{\"schema\":1", "{\"schema\":1,\"claim\":null", 1);
    for p in [with_key, with_variant] {
        let mut b = bytes[..HEADER_LEN].to_vec();
        b.extend_from_slice(p.as_bytes());
        assert_eq!(store_reason(decode_exec(&b)), Reason::PayloadDecode);
    }
    let mut b = bytes[..HEADER_LEN].to_vec();
    b.extend_from_slice(with_null.as_bytes());
    assert_eq!(store_reason(decode_exec(&b)), Reason::PayloadNotCanonical);
}

#[test]
fn a_decoded_record_is_revalidated() {
    let rec = exec_in(ExecState::Running, key("s", "r"), T0).unwrap();
    let bytes = encode_exec(&rec).unwrap();
    let p = std::str::from_utf8(&bytes[HEADER_LEN..])
        .unwrap()
        .replace("\"running_observed\"", "\"not_dispatched\"");
    let mut b = bytes[..HEADER_LEN].to_vec();
    b.extend_from_slice(p.as_bytes());
    assert_eq!(store_reason(decode_exec(&b)), Reason::RecordInvalid);
}

#[test]
fn payload_cap_is_checked_before_parsing() {
    let mut b = vec![0, 1, b'E'];
    b.resize(HEADER_LEN + MAX_PAYLOAD_LEN, b' ');
    assert_eq!(store_reason(decode_exec(&b)), Reason::PayloadDecode);
    b.push(b' ');
    assert_eq!(store_reason(decode_exec(&b)), Reason::PayloadTooLarge);
}

#[test]
fn ac_19_2_selective_versions_keep_every_capability() {
    let base = accepted(key("s", "r"), exec_spec("x"), T0);
    assert_eq!(encode_exec(&base).unwrap()[..2], 1u16.to_be_bytes());
    assert_eq!(exec_requirements(&base).capabilities, Capabilities::BASE);

    let mut spec = managed_exec_spec("x", &key("s", "m"));
    spec.outputs.clear();
    spec.action = Action::Terminal(ManagedTerminalSpec::default());
    let terminal = accepted(key("s", "t"), spec.clone(), T0);
    assert_eq!(exec_requirements(&terminal).version, 4);
    spec.guest_paths = Some(GuestPathPolicy {
        roots: vec!["/data".into()],
        workdir_roots: vec![],
    });
    let both = accepted(key("s", "t"), spec, T0);
    let req = exec_requirements(&both);
    assert_eq!(req.version, 6);
    assert!(req.capabilities.interactive_terminal && req.capabilities.extended_execution);
    assert!(req.capabilities.guest_files && req.capabilities.managed_machines);
    let bytes = encode_exec(&both).unwrap();
    assert_eq!(bytes[..2], 6u16.to_be_bytes());
    assert_eq!(decode_exec(&bytes).unwrap(), both);
    // An older envelope cannot carry a newer feature.
    let mut old = bytes.clone();
    old[..2].copy_from_slice(&4u16.to_be_bytes());
    assert_eq!(
        store_reason(decode_exec(&old)),
        Reason::FeatureBeyondVersion
    );
    assert!(!Capabilities::BASE.covers(req.capabilities));
    assert!(Capabilities::ALL.covers(req.capabilities));
}

fn corpus_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/envelope")
}

#[test]
fn fuzz_seed_corpus_replays() {
    let dir = corpus_dir();
    if std::env::var_os("SMOLBOX_WRITE_SEEDS").is_some() {
        std::fs::create_dir_all(&dir).unwrap();
        let e = encode_exec(&exec_in(ExecState::Completed, key("s", "r"), T0).unwrap()).unwrap();
        let m =
            encode_machine(&machine_in(MachineRecordState::Running, key("s", "m"), T0).unwrap())
                .unwrap();
        std::fs::write(dir.join("exec-completed"), &e).unwrap();
        std::fs::write(dir.join("machine-running"), &m).unwrap();
        std::fs::write(dir.join("exec-truncated"), &e[..e.len() / 2]).unwrap();
        std::fs::write(dir.join("empty"), b"").unwrap();
        std::fs::write(dir.join("gzip-magic"), [0x1f, 0x8b, 8, 0]).unwrap();
    }
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let bytes = std::fs::read(entry.unwrap().path()).unwrap();
        envelope::fuzz_envelope(&bytes);
        n += 1;
    }
    assert!(n >= 5, "the seed corpus is committed");
    assert!(decode_exec(&std::fs::read(dir.join("exec-completed")).unwrap()).is_ok());
}
