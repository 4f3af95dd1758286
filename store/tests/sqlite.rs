//! The conformance suite on `SqliteStore` (two connections on one file play
//! two controllers, as two processes would), plus encryption at rest,
//! tamper and outage tests on the real file.
#![allow(clippy::unwrap_used)] // tests: a panic is the failure report

use smolbox_core::Reason;
mod conformance;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use smolbox_core::Category;
use smolbox_core::managed::envelope::encode_exec;
use smolbox_core::managed::state::ExecState;
use smolbox_core::managed::testkit::{
    accepted, accepted_machine, entry_patch, exec_spec, fingerprint_key, key, machine_spec,
};
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

/// A whole-row copy in a table of its own, put back with `INSERT … SELECT`.
struct SqRow {
    path: PathBuf,
    table: &'static str,
    snap: String,
    key: smolbox_core::managed::RecordKey,
}

impl conformance::Rollback for Sq {
    fn snapshot(
        &self,
        kind: RecordKind,
        key: &smolbox_core::managed::RecordKey,
    ) -> Box<dyn conformance::Restore + '_> {
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let table = match kind {
            RecordKind::Execution => "executions",
            RecordKind::Machine => "machines",
        };
        let snap = format!(
            "snap_{}",
            N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        raw(&self.path)
            .execute(
                &format!(
                    "CREATE TABLE {snap} AS SELECT * FROM {table} WHERE scope = ?1 AND id = ?2"
                ),
                [&key.scope, &key.id],
            )
            .unwrap();
        Box::new(SqRow {
            path: self.path.clone(),
            table,
            snap,
            key: key.clone(),
        })
    }
}

impl conformance::Restore for SqRow {
    fn restore(&self) {
        let c = raw(&self.path);
        c.execute(
            &format!("DELETE FROM {} WHERE scope = ?1 AND id = ?2", self.table),
            [&self.key.scope, &self.key.id],
        )
        .unwrap();
        c.execute(
            &format!("INSERT INTO {} SELECT * FROM {}", self.table, self.snap),
            [],
        )
        .unwrap();
    }
}

rollback_conformance_tests!(make);

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
        (Category::Store, Reason::AuthenticationFailed)
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
        (Category::Store, Reason::ProjectionMismatch)
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
        .seal_bytes(RecordKind::Execution, &rec.key, rec.version, &env)
        .unwrap();
    raw(&h.path)
        .execute("UPDATE executions SET payload = ?1", [sealed])
        .unwrap();
    let e = h.first.fetch(&rec.key).unwrap_err();
    assert_eq!(
        (e.category(), e.reason()),
        (Category::Store, Reason::UnknownEnvelopeVersion)
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
            (Category::Store, Reason::SqliteReadOnly)
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
    let path = dir.path().join("d.db");
    // FULL (the default) is durable.
    let full = SqliteStore::open(&path, sealer("test")).unwrap();
    assert!(full.info().durable);
    drop(full);
    // NORMAL may lose the last commits to an OS crash: not durable (issue 12).
    let normal = open(&path);
    let info = normal.info();
    assert!(!info.durable && info.atomic && info.schema == 1);
    // The mode belongs to the handle, not to the file.
    assert!(
        SqliteStore::open(&path, sealer("test"))
            .unwrap()
            .info()
            .durable
    );
}

fn mode(p: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

#[test]
fn file_wal_and_shm_are_created_private() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.db");
    let s = SqliteStore::open(&path, sealer("test")).unwrap();
    s.accept(&accepted(key("s", "a"), exec_spec("x"), 1), 100)
        .unwrap();
    for suffix in ["", "-wal", "-shm"] {
        let f = PathBuf::from(format!("{}{suffix}", path.display()));
        assert_eq!(mode(&f), 0o600, "{}", f.display());
    }
    drop(s);
    // A looser file left by an older version is tightened on open.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    SqliteStore::open(&path, sealer("test")).unwrap();
    assert_eq!(mode(&path), 0o600);
}

#[test]
fn a_rolled_back_sealed_payload_is_a_store_error() {
    let h = make().unwrap();
    let k = key("s", "a");
    h.first
        .accept(&accepted(k.clone(), exec_spec("x"), 1), 100)
        .unwrap();
    let c = raw(&h.path);
    let old: Vec<u8> = c
        .query_row("SELECT payload FROM executions WHERE id = 'a'", [], |r| {
            r.get(0)
        })
        .unwrap();
    let claimed = h.first.claim(&k, "ctl", 2, 1_000).unwrap();
    assert_eq!(claimed.version, 2);
    // The version-1 payload swapped back under the version-2 row.
    c.execute("UPDATE executions SET payload = ?1 WHERE id = 'a'", [&old])
        .unwrap();
    let e = h.first.fetch(&k).unwrap_err();
    assert_eq!(
        (e.category(), e.reason()),
        (Category::Store, Reason::AuthenticationFailed)
    );
    assert_eq!(cat_of(h.first.claim(&k, "ctl", 3, 1_000)), Category::Store);
}

/// A machine claim renewal does not move the version but does move the
/// row's revision, which the payload is bound to: the payload from before
/// the renewal swapped back is refused.
#[test]
fn a_machine_payload_from_before_a_claim_renewal_is_a_store_error() {
    let h = make().unwrap();
    let k = key("s", "m");
    h.first
        .accept_machine(&accepted_machine(k.clone(), machine_spec(), 1), 100)
        .unwrap();
    let first = h.first.claim_machine(&k, "ctl", 2, 1_000).unwrap();
    let c = raw(&h.path);
    let old: Vec<u8> = c
        .query_row("SELECT payload FROM machines WHERE id = 'm'", [], |r| {
            r.get(0)
        })
        .unwrap();
    let renewed = h.first.claim_machine(&k, "ctl", 3, 1_000).unwrap();
    assert_eq!((renewed.version, first.version), (1, 1));
    assert_eq!((renewed.revision(), first.revision()), (3, 2));
    let column: i64 = c
        .query_row("SELECT version FROM machines WHERE id = 'm'", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(column, 3, "the row's version column is the revision");
    c.execute("UPDATE machines SET payload = ?1 WHERE id = 'm'", [&old])
        .unwrap();
    let e = h.first.fetch_machine(&k).unwrap_err();
    assert_eq!(
        (e.category(), e.reason()),
        (Category::Store, Reason::AuthenticationFailed)
    );
}

fn cat_of<T: std::fmt::Debug>(r: Result<T, smolbox_core::Error>) -> Category {
    r.unwrap_err().category()
}

fn other_sealer(partition: &str) -> Sealer {
    let k = EncryptionKey::new([8; 32], &fingerprint_key()).unwrap();
    Sealer::new(&k, partition).unwrap()
}

#[test]
fn a_replaced_fingerprint_key_is_refused_at_open() {
    let h = make().unwrap();
    h.first
        .accept(&accepted(key("s", "a"), exec_spec("x"), 1), 100)
        .unwrap();
    let other_fp = smolbox_core::managed::FingerprintKey::new(&[0x55; 32]).unwrap();
    let k = EncryptionKey::new([7; 32], &other_fp).unwrap();
    let e = SqliteStore::open(&h.path, Sealer::new(&k, "test").unwrap()).unwrap_err();
    assert_eq!(
        (e.category(), e.reason()),
        (Category::Store, Reason::FingerprintKeyMismatch)
    );
}

#[test]
fn a_replaced_key_is_refused_at_open() {
    let h = make().unwrap();
    h.first
        .accept(&accepted(key("s", "a"), exec_spec("x"), 1), 100)
        .unwrap();
    let e = SqliteStore::open(&h.path, other_sealer("test")).unwrap_err();
    assert_eq!(
        (e.category(), e.reason()),
        (Category::Store, Reason::KeyMismatch)
    );
    // Read-only opens check it too.
    let ro = SqliteOptions {
        mode: SqliteMode::ReadOnly,
        ..SqliteOptions::default()
    };
    let e = SqliteStore::open_with(&h.path, other_sealer("test"), ro).unwrap_err();
    assert_eq!(e.reason(), Reason::KeyMismatch);
    // Even a partition without records is bound to the key that opened it first.
    let e = SqliteStore::open(&h.path, {
        SqliteStore::open(&h.path, sealer("empty")).unwrap();
        other_sealer("empty")
    })
    .unwrap_err();
    assert_eq!(e.reason(), Reason::KeyMismatch);
    // Another partition is another key's.
    SqliteStore::open(&h.path, other_sealer("fresh")).unwrap();
    assert!(h.first.fetch(&key("s", "a")).is_ok());
}

/// Rewrites a current store as the first layout wrote it: layout 1, no key
/// checks, first-format payloads.
fn make_legacy(path: &Path, recs: &[smolbox_core::managed::ExecutionRecord]) {
    let c = raw(path);
    c.execute_batch(
        "DROP TABLE partition_keys; UPDATE smolbox_meta SET value = 1 WHERE key = 'layout';",
    )
    .unwrap();
    for rec in recs {
        let old = conformance::legacy_seal(
            [7; 32],
            "test",
            RecordKind::Execution,
            &rec.key,
            &encode_exec(rec).unwrap(),
        );
        c.execute(
            "UPDATE executions SET payload = ?1 WHERE id = ?2",
            rusqlite::params![old, rec.key.id],
        )
        .unwrap();
    }
}

fn layout(path: &Path) -> i64 {
    raw(path)
        .query_row(
            "SELECT value FROM smolbox_meta WHERE key = 'layout'",
            [],
            |r| r.get(0),
        )
        .unwrap()
}

fn first_byte(path: &Path, id: &str) -> u8 {
    let p: Vec<u8> = raw(path)
        .query_row("SELECT payload FROM executions WHERE id = ?1", [id], |r| {
            r.get(0)
        })
        .unwrap();
    p[0]
}

#[test]
fn first_format_rows_migrate_and_keep_decoding() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.db");
    let recs: Vec<_> = (0..3)
        .map(|i| accepted(key("s", &format!("o{i}")), exec_spec("x"), 10 + i))
        .collect();
    {
        let s = open(&path);
        s.import(&recs).unwrap();
    }
    make_legacy(&path, &recs);
    assert_eq!((layout(&path), first_byte(&path, "o1")), (1, 0x01));
    // The wrong key is refused and migrates nothing.
    let e = SqliteStore::open(&path, other_sealer("test")).unwrap_err();
    assert_eq!(
        (e.category(), e.reason()),
        (Category::Store, Reason::KeyMismatch)
    );
    assert_eq!((layout(&path), first_byte(&path, "o1")), (1, 0x01));
    // A read-only open cannot migrate: it says so.
    let ro = SqliteOptions {
        mode: SqliteMode::ReadOnly,
        ..SqliteOptions::default()
    };
    assert_eq!(
        SqliteStore::open_with(&path, sealer("test"), ro)
            .unwrap_err()
            .reason(),
        Reason::LayoutNeedsMigration
    );
    // The right key migrates: every record reads back as it was, re-sealed.
    let s = open(&path);
    for r in &recs {
        assert_eq!(&s.fetch(&r.key).unwrap(), r);
        assert_eq!(first_byte(&path, &r.key.id), 0x02);
    }
    assert_eq!(layout(&path), 2);
    assert_eq!(s.due(100, None, 10).unwrap().records, recs);
    // Once migrated, a first-format payload is refused like any tampering.
    let old = conformance::legacy_seal(
        [7; 32],
        "test",
        RecordKind::Execution,
        &recs[0].key,
        &encode_exec(&recs[0]).unwrap(),
    );
    raw(&path)
        .execute("UPDATE executions SET payload = ?1 WHERE id = 'o0'", [old])
        .unwrap();
    let e = s.fetch(&recs[0].key).unwrap_err();
    assert_eq!(
        (e.category(), e.reason()),
        (Category::Store, Reason::LegacySealedVersion)
    );
}

/// Whether `table` of the file at `path` is a `WITHOUT ROWID` table.
fn without_rowid(path: &Path, table: &str) -> bool {
    let sql: String = raw(path)
        .query_row(
            "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?1",
            [table],
            |r| r.get(0),
        )
        .unwrap();
    sql.to_ascii_uppercase().contains("WITHOUT ROWID")
}

/// Remakes the record tables of `path` as a file made before session 11
/// had them: `WITHOUT ROWID`, same columns, indexes and rows.
fn make_without_rowid(path: &Path) {
    let mut c = raw(path);
    let tx = c.transaction().unwrap();
    for table in ["executions", "machines"] {
        let ddl: Vec<String> = {
            let mut stmt = tx
                .prepare(
                    "SELECT sql FROM sqlite_master WHERE tbl_name = ?1 AND sql IS NOT NULL \
                     ORDER BY type = 'index'",
                )
                .unwrap();
            stmt.query_map([table], |r| r.get(0))
                .unwrap()
                .map(Result::unwrap)
                .collect()
        };
        tx.execute_batch(&format!("ALTER TABLE {table} RENAME TO moved;"))
            .unwrap();
        let indexes: Vec<String> = tx
            .prepare("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'moved' AND sql IS NOT NULL")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        for index in indexes {
            tx.execute_batch(&format!("DROP INDEX {index};")).unwrap();
        }
        let (create, index_ddl) = ddl.split_first().unwrap();
        tx.execute_batch(&format!("{create} WITHOUT ROWID;"))
            .unwrap();
        tx.execute_batch(&format!(
            "INSERT INTO {table} SELECT * FROM moved; DROP TABLE moved;"
        ))
        .unwrap();
        for index in index_ddl {
            tx.execute_batch(&format!("{index};")).unwrap();
        }
    }
    tx.commit().unwrap();
}

/// Session 11: the record tables are rowid tables (a sealed command record
/// overflows a `WITHOUT ROWID` cell on a 4 KiB page); a file made with
/// them `WITHOUT ROWID` is read as it is by a read-only open and rebuilt at
/// a read-write open, every record unchanged.
#[test]
fn record_tables_are_rowid_tables_and_older_files_are_rebuilt_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.db");
    let (exec, machine) = {
        let s = open(&path);
        let rec = accepted(key("s", "e"), exec_spec("x"), 1);
        s.accept(&rec, 10).unwrap();
        let rec = s.claim(&rec.key, "ctl", 2, 1_000).unwrap();
        let m = accepted_machine(key("s", "m"), machine_spec(), 1);
        s.accept_machine(&m, 10).unwrap();
        let m = s.claim_machine(&m.key, "ctl", 2, 1_000).unwrap();
        (rec, m)
    };
    assert!(!without_rowid(&path, "executions") && !without_rowid(&path, "machines"));
    make_without_rowid(&path);
    assert!(without_rowid(&path, "executions") && without_rowid(&path, "machines"));
    let ro = SqliteOptions {
        mode: SqliteMode::ReadOnly,
        ..SqliteOptions::default()
    };
    {
        let s = SqliteStore::open_with(&path, sealer("test"), ro).unwrap();
        assert_eq!(s.fetch(&exec.key).unwrap(), exec);
        assert!(without_rowid(&path, "executions"));
    }
    let s = open(&path);
    assert!(!without_rowid(&path, "executions") && !without_rowid(&path, "machines"));
    assert_eq!(s.fetch(&exec.key).unwrap(), exec);
    assert_eq!(s.fetch_machine(&machine.key).unwrap(), machine);
    let next = s.cancel(&exec.key, 3).unwrap();
    assert_eq!(next.version, exec.version + 1);
    assert_eq!(s.fetch(&exec.key).unwrap(), next);
    let leftovers: i64 = raw(&path)
        .query_row(
            "SELECT COUNT(*) FROM sqlite_master WHERE name LIKE '%_old' OR name = 'moved'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(leftovers, 0);
}
