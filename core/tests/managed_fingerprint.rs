//! Fingerprints (C12.5): golden values freeze the canonical encoding, every
//! semantic field changes the fingerprint, defaults are left out.
#![allow(clippy::unwrap_used)] // tests: a panic is the failure report

use smolbox_core::managed::fingerprint::{
    FingerprintKey, command_fingerprint, encode_exec_spec, exec_fingerprint, machine_fingerprint,
};
use smolbox_core::managed::spec::{
    Action, GuestPathPolicy, MetaValue, ProfileNetwork, ReservedPort,
};
use smolbox_core::managed::testkit::{exec_spec, fingerprint_key, key, machine_spec};

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[test]
fn golden_canonical_encoding_and_fingerprints() {
    let spec = exec_spec("g");
    let k = fingerprint_key();
    let enc = encode_exec_spec(&spec);
    assert!(enc.starts_with(b"smolbox.fp\0\x01\0\0\0\x0eexecution-spec"));
    assert_eq!(hex(&sha(&enc)), GOLDEN_ENCODING_SHA256);
    assert_eq!(exec_fingerprint(&k, &spec), GOLDEN_EXEC);
    let managed = smolbox_core::managed::testkit::managed_exec_spec("g", &key("s", "m1"));
    assert_eq!(exec_fingerprint(&k, &managed), GOLDEN_COMMAND);
    assert_eq!(machine_fingerprint(&k, &machine_spec()), GOLDEN_MACHINE);
}

fn sha(b: &[u8]) -> Vec<u8> {
    use sha2::Digest;
    sha2::Sha256::digest(b).to_vec()
}

const GOLDEN_ENCODING_SHA256: &str =
    "297812564aa9a1d561bfffe5baba2774c623f6816043c4480c25ce3ae60aa4db";
const GOLDEN_EXEC: &str = "07bd4aa16a677728c1d816bba2ec4131f8718c2cfe0a693ec83cc4ec591a4e1f";
const GOLDEN_COMMAND: &str = "7247e15143788fc1e6d70aca5936ca86c93144151cceecdcfa3708e8f3afc118";
const GOLDEN_MACHINE: &str = "a6940065040a4d5a4d328fda27760c6dd3054510c7bb3571dc7343bf7b43ced4";

#[test]
fn every_semantic_field_changes_the_fingerprint() {
    let k = fingerprint_key();
    let base = exec_spec("g");
    let fp = exec_fingerprint(&k, &base);
    let mut variants = Vec::new();
    let mut v = base.clone();
    v.artifact.id = "other".into();
    variants.push(v);
    let mut v = base.clone();
    v.artifact.sha256 = "b".repeat(64);
    variants.push(v);
    let mut v = base.clone();
    v.profile.id = "big".into();
    variants.push(v);
    let mut v = base.clone();
    v.queue_budget_ms += 1;
    variants.push(v);
    let mut v = base.clone();
    v.retention_ms += 1;
    variants.push(v);
    let mut v = base.clone();
    v.metadata.insert("k".into(), MetaValue::Bool(true));
    variants.push(v);
    let mut v = base.clone();
    v.network = Some(ProfileNetwork {
        allow: vec!["1.1.1.1".into()],
    });
    variants.push(v);
    let mut v = base.clone();
    v.guest_paths = Some(GuestPathPolicy {
        roots: vec!["/w".into()],
        workdir_roots: vec![],
    });
    variants.push(v);
    let mut v = base.clone();
    v.outputs.clear();
    variants.push(v);
    for f in 0..6 {
        let mut v = base.clone();
        let Action::Command(c) = &mut v.action else {
            unreachable!()
        };
        match f {
            0 => c.argv.push("x".into()),
            1 => {
                c.env.insert("A".into(), "1".into());
            }
            2 => c.workdir = None,
            3 => c.stdin_b64 = None,
            4 => c.timeout_s = Some(11),
            _ => c.background = true,
        }
        variants.push(v);
    }
    let mut seen = std::collections::BTreeSet::new();
    seen.insert(fp);
    for v in variants {
        assert!(
            seen.insert(exec_fingerprint(&k, &v)),
            "a field change must change the fingerprint"
        );
    }
}

#[test]
fn env_order_and_budgets_do_not_change_identity() {
    let k = fingerprint_key();
    let mut a = exec_spec("g");
    let mut b = exec_spec("g");
    let (Action::Command(ca), Action::Command(cb)) = (&mut a.action, &mut b.action) else {
        unreachable!()
    };
    ca.env.insert("A".into(), "1".into());
    ca.env.insert("Z".into(), "2".into());
    cb.env.insert("Z".into(), "2".into());
    cb.env.insert("A".into(), "1".into());
    assert_eq!(exec_fingerprint(&k, &a), exec_fingerprint(&k, &b));
}

#[test]
fn key_and_domain_separate_identities() {
    let spec = exec_spec("g");
    let k2 = FingerprintKey::new(&[7; 32]).unwrap();
    assert_ne!(
        exec_fingerprint(&fingerprint_key(), &spec),
        exec_fingerprint(&k2, &spec)
    );
    let fp = exec_fingerprint(&fingerprint_key(), &spec);
    assert_ne!(
        command_fingerprint(&fingerprint_key(), &key("s", "m1"), &fp),
        command_fingerprint(&fingerprint_key(), &key("s", "m2"), &fp)
    );
    assert_eq!(fp.len(), 64);
    assert!(
        fp.bytes()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
    );
}

#[test]
fn machine_layers_change_the_machine_fingerprint() {
    let k = fingerprint_key();
    let base = machine_spec();
    let fp = machine_fingerprint(&k, &base);
    let mut v = base.clone();
    v.ports.push(ReservedPort {
        host: 8080,
        guest: 80,
    });
    assert_ne!(machine_fingerprint(&k, &v), fp);
    let mut v = base.clone();
    v.workload = Some(vec!["nginx".into()]);
    assert_ne!(machine_fingerprint(&k, &v), fp);
    let mut v = base;
    v.checkpointable = true;
    assert_ne!(machine_fingerprint(&k, &v), fp);
}

#[test]
fn key_length_is_bounded_at_n_and_n_plus_one() {
    assert!(FingerprintKey::new(&[1; 32]).is_ok());
    assert!(FingerprintKey::new(&[1; 31]).is_err());
    assert!(FingerprintKey::new(&[1; 4_096]).is_ok());
    assert!(FingerprintKey::new(&[1; 4_097]).is_err());
    assert!(!format!("{:?}", FingerprintKey::new(&[0x41; 32]).unwrap()).contains("AAAA"));
}

#[test]
fn version_2_adds_the_guest_user_and_worker_machine_and_keeps_old_identities() {
    use smolbox_core::managed::spec::WorkerMachine;
    let k = fingerprint_key();
    // Without the new fields: byte-for-byte version 1 (the golden above).
    let old = exec_spec("g");
    assert_eq!(exec_fingerprint(&k, &old), GOLDEN_EXEC);
    let mut user = exec_spec("g");
    if let Action::Command(c) = &mut user.action {
        c.user = Some("1000:1000".to_owned());
    }
    let enc = encode_exec_spec(&user);
    assert!(enc.starts_with(b"smolbox.fp\0\x02\0\0\0\x0eexecution-spec"));
    assert_eq!(exec_fingerprint(&k, &user), GOLDEN_EXEC_USER);
    let mut on = exec_spec("g");
    on.worker_machine = Some(WorkerMachine {
        worker_id: "w1".to_owned(),
        name: "m1".to_owned(),
    });
    assert_eq!(exec_fingerprint(&k, &on), GOLDEN_EXEC_MACHINE);
    // Each field is semantic: a different user or machine is another identity.
    let mut other = on.clone();
    other.worker_machine = Some(WorkerMachine {
        worker_id: "w1".to_owned(),
        name: "m2".to_owned(),
    });
    assert_ne!(exec_fingerprint(&k, &other), GOLDEN_EXEC_MACHINE);
    let mut other_user = user.clone();
    if let Action::Command(c) = &mut other_user.action {
        c.user = Some("root".to_owned());
    }
    assert_ne!(exec_fingerprint(&k, &other_user), GOLDEN_EXEC_USER);
}

const GOLDEN_EXEC_USER: &str = "7324a00810628761791f6ee041e847be90180a36cae84dc6be6404e734823a4b";
const GOLDEN_EXEC_MACHINE: &str =
    "50575c51babf8932f3ae56d9f9fcf3c84f83db7908ff1da7279d4742204b11b5";
