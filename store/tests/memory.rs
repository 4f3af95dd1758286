//! The conformance suite on `MemoryStore`, and its C18.2 bounds.
#![allow(clippy::unwrap_used)] // tests: a panic is the failure report

use smolbox_core::Reason;
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

impl conformance::Rollback for Mem {
    fn snapshot(
        &self,
        kind: smolbox_core::managed::RecordKind,
        key: &smolbox_core::managed::RecordKey,
    ) -> Box<dyn conformance::Restore + '_> {
        Box::new((self.0.clone(), self.0.testkit_snapshot(kind, key)))
    }
}

impl conformance::Restore for (Arc<MemoryStore>, smolbox_store::MemorySnapshot) {
    fn restore(&self) {
        self.0.testkit_restore(&self.1);
    }
}

rollback_conformance_tests!(make);

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
    assert_eq!(e.reason(), Reason::MemoryBytes);
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

#[test]
fn apply_op_performs_controller_ops_and_keeps_errors() {
    use smolbox_core::managed::Guard;
    use smolbox_core::managed::controller::{StoreOp, StoreReply};
    use smolbox_core::managed::patch::ExecPatch;
    use smolbox_core::managed::state::ExecState;
    use smolbox_store::apply_op;

    let s = MemoryStore::new(MemoryConfig::default()).unwrap();
    let rec = accepted(key("s", "a"), exec_spec("x"), 1_000);
    let op = StoreOp::Accept {
        record: Box::new(rec.clone()),
        max_pending: 10,
    };
    assert!(matches!(
        apply_op(&s, &op).unwrap(),
        StoreReply::Accepted {
            existing: false,
            ..
        }
    ));
    assert!(matches!(
        apply_op(&s, &op).unwrap(),
        StoreReply::Accepted { existing: true, .. }
    ));
    let claim = StoreOp::Claim {
        key: rec.key.clone(),
        owner: "ctl-1".into(),
        now_ms: 1_001,
        ttl_ms: 1_000,
    };
    let StoreReply::Record(claimed) = apply_op(&s, &claim).unwrap() else {
        panic!("record expected");
    };
    let write = StoreOp::Write {
        key: rec.key.clone(),
        guard: Guard::for_exec(&claimed, "ctl-1"),
        patch: ExecPatch {
            state: Some(ExecState::Preparing),
            ..ExecPatch::default()
        },
        now_ms: 1_002,
    };
    let StoreReply::Record(w) = apply_op(&s, &write).unwrap() else {
        panic!("record expected");
    };
    assert_eq!(w.state, ExecState::Preparing);
    // The same guard again is stale: the store's error, unchanged.
    assert_eq!(
        apply_op(&s, &write).unwrap_err().category(),
        Category::StaleVersion
    );
    let due = StoreOp::Due {
        now_ms: 5_000,
        after: None,
        limit: 1,
    };
    let StoreReply::Due { records, next } = apply_op(&s, &due).unwrap() else {
        panic!("due page expected");
    };
    assert_eq!(records.len(), 1);
    assert_eq!(next.unwrap().key, rec.key);
    let fetch = StoreOp::Fetch {
        key: key("s", "absent"),
    };
    assert_eq!(
        apply_op(&s, &fetch).unwrap_err().category(),
        Category::NotFound
    );
}
