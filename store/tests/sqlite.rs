//! The conformance suite on `SqliteStore` (two connections on one file play
//! two controllers, as two processes would), plus encryption at rest,
//! tamper and outage tests on the real file.
#![allow(clippy::unwrap_used)] // tests: a panic is the failure report

mod conformance;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use smolbox_core::Category;
use smolbox_core::managed::envelope::encode_exec;
use smolbox_core::managed::state::ExecState;
use smolbox_core::managed::testkit::{accepted, entry_patch, exec_spec, fingerprint_key, key};
use smolbox_core::managed::{Guard, RecordKind};
use smolbox_store::{EncryptionKey, Sealer, SqliteMode, SqliteOptions, SqliteStore, Store};

fn sealer(partition: &str) -> Sealer {
    let k = EncryptionKey::new([7; 32], &fingerprint_key()).unwrap();
    Sealer::new(&k, partition).unwrap()
}

fn open(path: &Path) -> SqliteStore {
    let options = SqliteOptions {
        synchronous_normal: true,
        ..SqliteOptions::default()
    };
    SqliteStore::open_with(path, sealer("test"), options).unwrap()
}

struct Sq {
    _dir: tempfile::TempDir,
    path: PathBuf,
    first: Arc<SqliteStore>,
}

impl conformance::Harness for Sq {
    fn store(&self) -> Arc<dyn Store> {
        self.first.clone()
    }
    fn another(&self) -> Arc<dyn Store> {
        Arc::new(open(&self.path))
    }
}

fn make() -> Option<Sq> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db");
    let first = Arc::new(open(&path));
    Some(Sq {
        _dir: dir,
        path,
        first,
    })
}

conformance_tests!(make);

const SENTINEL: &str = "SNTNL-5ec7e7-c0ffee";

#[test]
fn sentinel_never_reaches_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    // Default options: synchronous = FULL.
    let s = SqliteStore::open(&path, sealer("test")).unwrap();
    for i in 0..5 {
        let k = key("s", &format!("r{i}"));
        s.accept(&accepted(k.clone(), exec_spec(SENTINEL), 1_000), 100)
            .unwrap();
        let mut rec = s.claim(&k, "ctl", 1_000, 60_000).unwrap();
        for st in [
            ExecState::Preparing,
            ExecState::Ready,
            ExecState::Dispatching,
        ] {
            rec = s
                .write(
                    &k,
                    &Guard::for_exec(&rec, "ctl"),
                    &entry_patch(&rec, st),
                    1_001,
                )
                .unwrap();
        }
        assert!(
            format!("{rec:?}").contains(SENTINEL),
            "the sentinel is in the record"
        );
    }
    drop(s);
    let mut scanned = 0;
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let bytes = std::fs::read(entry.unwrap().path()).unwrap();
        scanned += bytes.len();
        assert!(
            !bytes
                .windows(SENTINEL.len())
                .any(|w| w == SENTINEL.as_bytes()),
            "clear text on disk"
        );
    }
    assert!(scanned > 0);
}

fn raw(path: &Path) -> rusqlite::Connection {
    rusqlite::Connection::open(path).unwrap()
}

#[test]
fn ac_18_4_1_moved_ciphertext_is_a_store_error() {
    let h = make().unwrap();
    let s = h.first.clone();
    s.accept(&accepted(key("s", "a"), exec_spec("x"), 1), 100)
        .unwrap();
    s.accept(&accepted(key("s", "b"), exec_spec("x"), 1), 100)
        .unwrap();
    let c = raw(&h.path);
    c.execute(
        "UPDATE executions SET payload = (SELECT payload FROM executions WHERE id = 'a') WHERE id = 'b'",
        [],
    )
    .unwrap();
    let e = s.fetch(&key("s", "b")).unwrap_err();
    assert_eq!(
        (e.category(), e.reason()),
        (Category::Store, "authentication_failed")
    );
    assert_eq!(s.fetch(&key("s", "a")).unwrap().key, key("s", "a"));
    // Moved to another partition: same scope and id, other partition.
    let other = SqliteStore::open(&h.path, sealer("other")).unwrap();
    c.execute(
        "INSERT INTO executions SELECT 'other', scope, id, payload, fingerprint, state, version, next_due_ms, \
         pending, worker_id, machine_name, slots, cpus, memory_mb, disk_gb, managed_machine \
         FROM executions WHERE partition = 'test' AND id = 'a'",
        [],
    )
    .unwrap();
    assert_eq!(
        other.fetch(&key("s", "a")).unwrap_err().category(),
        Category::Store
    );
    assert_eq!(
        other.due(u64::MAX >> 12, None, 10).unwrap_err().category(),
        Category::Store
    );
}

#[test]
fn projected_columns_are_checked_against_the_payload() {
    let h = make().unwrap();
    h.first
        .accept(&accepted(key("s", "a"), exec_spec("x"), 1), 100)
        .unwrap();
    raw(&h.path)
        .execute("UPDATE executions SET state = 'completed', pending = 0", [])
        .unwrap();
    let e = h.first.fetch(&key("s", "a")).unwrap_err();
    assert_eq!(
        (e.category(), e.reason()),
        (Category::Store, "projection_mismatch")
    );
}

#[test]
fn unknown_envelope_version_is_a_store_error_not_absence() {
    let h = make().unwrap();
    let rec = accepted(key("s", "a"), exec_spec("x"), 1);
    h.first.accept(&rec, 100).unwrap();
    let mut env = encode_exec(&rec).unwrap();
    env[..2].copy_from_slice(&99u16.to_be_bytes());
    let sealed = sealer("test")
        .seal_bytes(RecordKind::Execution, &rec.key, &env)
        .unwrap();
    raw(&h.path)
        .execute("UPDATE executions SET payload = ?1", [sealed])
        .unwrap();
    let e = h.first.fetch(&rec.key).unwrap_err();
    assert_eq!(
        (e.category(), e.reason()),
        (Category::Store, "unknown_envelope_version")
    );
    assert_eq!(
        h.first.due(10, None, 10).unwrap_err().category(),
        Category::Store
    );
}

#[test]
fn read_only_store_is_an_error_never_absence() {
    let h = make().unwrap();
    let rec = accepted(key("s", "a"), exec_spec("x"), 1);
    h.first.accept(&rec, 100).unwrap();
    let ro = SqliteStore::open_with(
        &h.path,
        sealer("test"),
        SqliteOptions {
            mode: SqliteMode::ReadOnly,
            ..SqliteOptions::default()
        },
    )
    .unwrap();
    assert_eq!(ro.fetch(&rec.key).unwrap(), rec);
    for r in [
        ro.accept(&accepted(key("s", "b"), exec_spec("x"), 1), 100)
            .map(|_| ()),
        ro.claim(&rec.key, "ctl", 2, 1_000).map(|_| ()),
        ro.cancel(&rec.key, 2).map(|_| ()),
        ro.claim_worker("w", "ctl", 2, 1_000).map(|_| ()),
    ] {
        let e = r.unwrap_err();
        assert_eq!(
            (e.category(), e.reason()),
            (Category::Store, "sqlite_read_only")
        );
    }
    assert_eq!(h.first.fetch(&rec.key).unwrap(), rec, "nothing changed");
}

#[test]
fn missing_or_garbage_file_is_a_store_error() {
    let dir = tempfile::tempdir().unwrap();
    let garbage = dir.path().join("garbage.db");
    std::fs::write(&garbage, vec![0x5a; 8192]).unwrap();
    assert_eq!(
        SqliteStore::open(&garbage, sealer("test"))
            .unwrap_err()
            .category(),
        Category::Store
    );
    let missing = dir.path().join("missing.db");
    let ro = SqliteOptions {
        mode: SqliteMode::ReadOnly,
        ..SqliteOptions::default()
    };
    assert_eq!(
        SqliteStore::open_with(&missing, sealer("test"), ro)
            .unwrap_err()
            .category(),
        Category::Store
    );
}

#[test]
fn import_is_one_transaction() {
    let h = make().unwrap();
    let recs: Vec<_> = (0..3)
        .map(|i| accepted(key("s", &format!("i{i}")), exec_spec("x"), 10 + i))
        .collect();
    h.first.import(&recs).unwrap();
    assert_eq!(h.first.fetch(&recs[1].key).unwrap(), recs[1]);
    assert_eq!(
        h.first.due(11, None, 10).unwrap().records,
        recs[..2].to_vec()
    );
    // An existing identity fails the whole import.
    let more = vec![
        accepted(key("s", "i9"), exec_spec("x"), 10),
        recs[0].clone(),
    ];
    assert_eq!(
        h.first.import(&more).unwrap_err().category(),
        Category::Store
    );
    assert_eq!(
        h.first.fetch(&key("s", "i9")).unwrap_err().category(),
        Category::NotFound
    );
}

#[test]
fn synchronous_normal_reports_itself_non_durable() {
    let dir = tempfile::tempdir().unwrap();
    let normal = open(&dir.path().join("a.db"));
    assert!(!normal.info().durable, "NORMAL may lose the last commits");
    let full = SqliteStore::open(&dir.path().join("b.db"), sealer("test")).unwrap();
    assert!(full.info().durable);
}
