#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

//! The blocking runtime's own rules: key files, durable stores only unless
//! ephemeral is explicit, a unique owner per process. The managed suite
//! against the devworker is `tests/src/managed_cases.rs` (both shells).

use smolbox_core::Reason;
use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;

use smolbox_blocking::Runtime;
use smolbox_blocking::runtime::{default_owner, key_file};
use smolbox_core::Category;
use smolbox_core::managed::testkit::fingerprint_key;
use smolbox_store::{MemoryConfig, MemoryStore, Store};

#[test]
fn a_non_durable_store_is_refused_unless_ephemeral() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new(MemoryConfig::default()).unwrap());
    let e = Runtime::builder(Arc::clone(&store), fingerprint_key())
        .build()
        .unwrap_err();
    assert_eq!(e.category(), Category::Validation);
    assert_eq!(e.reason(), Reason::StoreNotDurable);
    let rt = Runtime::builder(store, fingerprint_key())
        .ephemeral(true)
        .build()
        .unwrap();
    rt.shutdown();
}

#[test]
fn options_out_of_range_are_refused() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new(MemoryConfig::default()).unwrap());
    let e = Runtime::builder(store, fingerprint_key())
        .ephemeral(true)
        .max_active(65)
        .build()
        .unwrap_err();
    assert_eq!(e.reason(), Reason::MaxActive);
}

#[test]
fn the_default_owner_is_unique_per_process_and_an_identifier() {
    let a = default_owner();
    let b = default_owner();
    assert_ne!(a, b, "never a shared constant");
    assert!(a.starts_with(&format!("ctl-{}-", std::process::id())));
    smolbox_core::managed::check_identifier(&a).unwrap();
}

#[test]
fn key_files_are_created_0600_and_reloaded() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("k");
    let a = key_file(&path).unwrap();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    assert_eq!(key_file(&path).unwrap(), a);
    assert_ne!(key_file(&dir.path().join("k2")).unwrap(), a);

    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    assert_eq!(
        key_file(&path).unwrap_err().category(),
        Category::Validation
    );
    let short = dir.path().join("short");
    std::fs::write(&short, [0u8; 31]).unwrap();
    std::fs::set_permissions(&short, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(key_file(&short).unwrap_err().reason(), Reason::KeyLength);
    let long = dir.path().join("long");
    std::fs::write(&long, [0u8; 33]).unwrap();
    std::fs::set_permissions(&long, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(key_file(&long).unwrap_err().reason(), Reason::KeyLength);
    let exact = dir.path().join("exact");
    std::fs::write(&exact, [7u8; 32]).unwrap();
    std::fs::set_permissions(&exact, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(key_file(&exact).unwrap(), [7u8; 32]);
}
