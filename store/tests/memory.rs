//! The conformance suite on `MemoryStore`, and its C18.2 bounds.
#![allow(clippy::unwrap_used)] // tests: a panic is the failure report

mod conformance;

use std::sync::Arc;

use smolbox_core::Category;
use smolbox_core::managed::envelope::encode_exec;
use smolbox_core::managed::testkit::{accepted, exec_spec, key};
use smolbox_store::{MAX_LEASES, MemoryConfig, MemoryStore, Store};

struct Mem(Arc<MemoryStore>);

impl conformance::Harness for Mem {
    fn store(&self) -> Arc<dyn Store> {
        self.0.clone()
    }
    fn another(&self) -> Arc<dyn Store> {
        // One serialized owner: every controller shares the same state.
        self.0.clone()
    }
}

fn make() -> Option<Mem> {
    let config = MemoryConfig {
        max_records: 10_000,
        ..MemoryConfig::default()
    };
    Some(Mem(Arc::new(MemoryStore::new(config).unwrap())))
}

conformance_tests!(make);

#[test]
fn memory_is_not_durable() {
    assert!(
        !MemoryStore::new(MemoryConfig::default())
            .unwrap()
            .info()
            .durable
    );
}

#[test]
fn record_bound_at_n_and_n_plus_one() {
    let s = MemoryStore::new(MemoryConfig {
        max_records: 3,
        ..MemoryConfig::default()
    })
    .unwrap();
    for i in 0..3 {
        s.accept(
            &accepted(key("s", &format!("r{i}")), exec_spec("x"), 1),
            100,
        )
        .unwrap();
    }
    let e = s
        .accept(&accepted(key("s", "r3"), exec_spec("x"), 1), 100)
        .unwrap_err();
    assert_eq!(e.category(), Category::AdmissionExhausted);
    assert_eq!(e.limit().map(|l| (l.actual, l.max)), Some((4, 3)));
    // Completed identities are kept: a duplicate still resolves.
    assert!(
        s.accept(&accepted(key("s", "r0"), exec_spec("x"), 1), 100)
            .is_ok()
    );
}

#[test]
fn byte_bound_at_n_and_n_plus_one() {
    let one = encode_exec(&accepted(key("s", "b0"), exec_spec("x"), 1))
        .unwrap()
        .len();
    let s = MemoryStore::new(MemoryConfig {
        max_records: 100,
        max_bytes: 2 * one,
    })
    .unwrap();
    s.accept(&accepted(key("s", "b0"), exec_spec("x"), 1), 100)
        .unwrap();
    s.accept(&accepted(key("s", "b1"), exec_spec("x"), 1), 100)
        .unwrap();
    let e = s
        .accept(&accepted(key("s", "b2"), exec_spec("x"), 1), 100)
        .unwrap_err();
    assert_eq!(e.category(), Category::AdmissionExhausted);
    assert_eq!(e.reason(), "memory_bytes");
}

#[test]
fn lease_bound_at_n_and_n_plus_one() {
    let s = MemoryStore::new(MemoryConfig::default()).unwrap();
    for i in 0..MAX_LEASES {
        s.claim_worker(&format!("w{i}"), "ctl", 0, 1_000).unwrap();
    }
    let e = s.claim_worker("w-extra", "ctl", 0, 1_000).unwrap_err();
    assert_eq!(e.category(), Category::AdmissionExhausted);
}

#[test]
fn config_bounds_are_checked() {
    for (r, b) in [(0, 1), (10_001, 1), (1, 0), (1, (1 << 30) + 1)] {
        assert!(
            MemoryStore::new(MemoryConfig {
                max_records: r,
                max_bytes: b
            })
            .is_err()
        );
    }
    assert!(
        MemoryStore::new(MemoryConfig {
            max_records: 10_000,
            max_bytes: 1 << 30
        })
        .is_ok()
    );
}
