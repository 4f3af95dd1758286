//! Several processes (here: threads with their own connections) opening and
//! migrating one fresh SQLite file at the same moment all succeed.

// Tests may unwrap: a failure is a test failure.
#![allow(clippy::unwrap_used)]
#![cfg(feature = "sqlite")]

use smolbox_core::managed::FingerprintKey;
use smolbox_store::{EncryptionKey, Sealer, SqliteStore};

#[test]
fn concurrent_first_opens_of_one_file_all_succeed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shared.db");
    let fp = FingerprintKey::new(&[7u8; 32]).unwrap();
    let key = EncryptionKey::new([9u8; 32], &fp).unwrap();
    let barrier = std::sync::Barrier::new(8);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|_| {
                s.spawn(|| {
                    barrier.wait();
                    SqliteStore::open(&path, Sealer::new(&key, "p").unwrap()).map(|_| ())
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap().unwrap();
        }
    });
}
