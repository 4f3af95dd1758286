//! The conformance suite on `PostgresStore` (several connections play
//! several controllers), plus encryption at rest, tamper and migration
//! tests on real rows. Reads `SMOLBOX_PG_URL` (set by `scripts/test.sh`);
//! in CI a missing URL fails the run instead of skipping.
#![allow(clippy::unwrap_used)] // tests: a panic is the failure report

use smolbox_core::Reason;
mod conformance;
mod pg_common;

use pg_common::fresh_partition;

use std::sync::Arc;

use smolbox_core::Category;
use smolbox_core::managed::Guard;
use smolbox_core::managed::state::ExecState;
use smolbox_core::managed::testkit::{
    accepted, accepted_machine, entry_patch, exec_spec, fingerprint_key, key, machine_spec,
};
use smolbox_store::{EncryptionKey, PostgresStore, Sealer, Store};

fn url() -> Option<String> {
    match std::env::var("SMOLBOX_PG_URL") {
        Ok(u) if !u.is_empty() => Some(u),
        _ if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!(
                "SMOLBOX_PG_URL is not set in CI: the PostgreSQL suite must run (scripts/test.sh starts a server)"
            )
        }
        _ => {
            eprintln!("PostgreSQL suite SKIPPED: SMOLBOX_PG_URL is not set (run scripts/test.sh)");
            None
        }
    }
}

fn sealer(partition: &str) -> Sealer {
    let k = EncryptionKey::new([9; 32], &fingerprint_key()).unwrap();
    Sealer::new(&k, partition).unwrap()
}

struct Pg {
    url: String,
    partition: String,
    first: Arc<PostgresStore>,
}

impl conformance::Harness for Pg {
    fn store(&self) -> Arc<dyn Store> {
        self.first.clone()
    }
    fn another(&self) -> Arc<dyn Store> {
        Arc::new(PostgresStore::connect(&self.url, sealer(&self.partition)).unwrap())
    }
}

fn make() -> Option<Pg> {
    let url = url()?;
    let partition = fresh_partition('p');
    let first = Arc::new(PostgresStore::connect(&url, sealer(&partition)).unwrap());
    Some(Pg {
        url,
        partition,
        first,
    })
}

conformance_tests!(make);

/// A whole-row copy in a table of its own, put back with `INSERT … SELECT`.
struct PgRow {
    url: String,
    partition: String,
    table: &'static str,
    snap: String,
    key: smolbox_core::managed::RecordKey,
}

impl conformance::Rollback for Pg {
    fn snapshot(
        &self,
        kind: smolbox_core::managed::RecordKind,
        key: &smolbox_core::managed::RecordKey,
    ) -> Box<dyn conformance::Restore + '_> {
        use smolbox_core::managed::RecordKind;
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let table = match kind {
            RecordKind::Execution => "executions",
            RecordKind::Machine => "machines",
        };
        let snap = format!(
            "snap_{}_{}",
            self.partition,
            N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        raw(&self.url)
            .execute(
                &format!(
                    "CREATE TABLE {snap} AS SELECT * FROM {table} \
                     WHERE partition = $1 AND scope = $2 AND id = $3"
                ),
                &[&self.partition, &key.scope, &key.id],
            )
            .unwrap();
        Box::new(PgRow {
            url: self.url.clone(),
            partition: self.partition.clone(),
            table,
            snap,
            key: key.clone(),
        })
    }
}

impl conformance::Restore for PgRow {
    fn restore(&self) {
        let mut c = raw(&self.url);
        c.execute(
            &format!(
                "DELETE FROM {} WHERE partition = $1 AND scope = $2 AND id = $3",
                self.table
            ),
            &[&self.partition, &self.key.scope, &self.key.id],
        )
        .unwrap();
        c.execute(
            &format!("INSERT INTO {} SELECT * FROM {}", self.table, self.snap),
            &[],
        )
        .unwrap();
    }
}

impl Drop for PgRow {
    fn drop(&mut self) {
        // The copy table is the test's own; leave the database as found.
        let _ = raw(&self.url).execute(&format!("DROP TABLE IF EXISTS {}", self.snap), &[]);
    }
}

rollback_conformance_tests!(make);

fn raw(url: &str) -> postgres::Client {
    postgres::Client::connect(url, postgres::NoTls).unwrap()
}

const SENTINEL: &str = "SNTNL-5ec7e7-c0ffee";

#[test]
fn sentinel_never_reaches_the_rows() {
    let Some(h) = make() else { return };
    let s = &h.first;
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
    }
    let mut c = raw(&h.url);
    let hex: String = SENTINEL.bytes().map(|b| format!("{b:02x}")).collect();
    let mut rows = 0;
    for table in [
        "executions",
        "machines",
        "worker_leases",
        "machine_identities",
        "port_owners",
    ] {
        for r in c
            .query(
                &format!("SELECT t::text FROM {table} t WHERE partition = $1"),
                &[&h.partition],
            )
            .unwrap()
        {
            let text: String = r.get(0);
            assert!(
                !text.contains(SENTINEL) && !text.to_lowercase().contains(&hex),
                "clear text in {table}"
            );
            rows += 1;
        }
    }
    assert!(rows >= 5);
}

#[test]
fn ac_18_4_1_moved_ciphertext_is_a_store_error() {
    let Some(h) = make() else { return };
    let s = &h.first;
    s.accept(&accepted(key("s", "a"), exec_spec("x"), 1), 100)
        .unwrap();
    s.accept(&accepted(key("s", "b"), exec_spec("x"), 1), 100)
        .unwrap();
    let mut c = raw(&h.url);
    c.execute(
        "UPDATE executions SET payload = (SELECT payload FROM executions WHERE partition = $1 AND id = 'a') \
         WHERE partition = $1 AND id = 'b'",
        &[&h.partition],
    )
    .unwrap();
    let e = s.fetch(&key("s", "b")).unwrap_err();
    assert_eq!(
        (e.category(), e.reason()),
        (Category::Store, Reason::AuthenticationFailed)
    );
    // Another partition: the same row copied under a different partition.
    let other = fresh_partition('p');
    let o = PostgresStore::connect(&h.url, sealer(&other)).unwrap();
    c.execute(
        "INSERT INTO executions SELECT $2, scope, id, payload, fingerprint, state, version, next_due_ms, \
         pending, worker_id, machine_name, slots, cpus, memory_mb, disk_gb, managed_machine \
         FROM executions WHERE partition = $1 AND id = 'a'",
        &[&h.partition, &other],
    )
    .unwrap();
    assert_eq!(
        o.fetch(&key("s", "a")).unwrap_err().category(),
        Category::Store
    );
}

#[test]
fn projected_columns_are_checked_against_the_payload() {
    let Some(h) = make() else { return };
    h.first
        .accept(&accepted(key("s", "a"), exec_spec("x"), 1), 100)
        .unwrap();
    raw(&h.url)
        .execute(
            "UPDATE executions SET next_due_ms = 5 WHERE partition = $1",
            &[&h.partition],
        )
        .unwrap();
    let e = h.first.fetch(&key("s", "a")).unwrap_err();
    assert_eq!(
        (e.category(), e.reason()),
        (Category::Store, Reason::ProjectionMismatch)
    );
}

#[test]
fn down_migration_refuses_non_empty_history() {
    let Some(h) = make() else { return };
    h.first
        .accept(&accepted(key("s", "a"), exec_spec("x"), 1), 100)
        .unwrap();
    let e = h.first.drop_schema().unwrap_err();
    assert_eq!(
        (e.category(), e.reason()),
        (Category::Store, Reason::HistoryNotEmpty)
    );
    assert!(h.first.fetch(&key("s", "a")).is_ok());
}

#[test]
fn import_is_one_transaction() {
    let Some(h) = make() else { return };
    let recs: Vec<_> = (0..3)
        .map(|i| accepted(key("s", &format!("i{i}")), exec_spec("x"), 10 + i))
        .collect();
    h.first.import(&recs).unwrap();
    assert_eq!(h.first.fetch(&recs[1].key).unwrap(), recs[1]);
    assert_eq!(
        h.first.due(11, None, 10).unwrap().records,
        recs[..2].to_vec()
    );
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

fn other_sealer(partition: &str) -> Sealer {
    let k = EncryptionKey::new([8; 32], &fingerprint_key()).unwrap();
    Sealer::new(&k, partition).unwrap()
}

#[test]
fn a_replaced_key_is_refused_at_connect() {
    let Some(h) = make() else { return };
    h.first
        .accept(&accepted(key("s", "a"), exec_spec("x"), 1), 100)
        .unwrap();
    let e = PostgresStore::connect(&h.url, other_sealer(&h.partition)).unwrap_err();
    assert_eq!(
        (e.category(), e.reason()),
        (Category::Store, Reason::KeyMismatch)
    );
    assert!(h.first.fetch(&key("s", "a")).is_ok());
}

#[test]
fn a_replaced_fingerprint_key_is_refused_at_connect() {
    let Some(h) = make() else { return };
    h.first
        .accept(&accepted(key("s", "a"), exec_spec("x"), 1), 100)
        .unwrap();
    let other_fp = smolbox_core::managed::FingerprintKey::new(&[0x55; 32]).unwrap();
    let k = EncryptionKey::new([9; 32], &other_fp).unwrap();
    let e = PostgresStore::connect(&h.url, Sealer::new(&k, &h.partition).unwrap()).unwrap_err();
    assert_eq!(
        (e.category(), e.reason()),
        (Category::Store, Reason::FingerprintKeyMismatch)
    );
}

#[test]
fn a_rolled_back_sealed_payload_is_a_store_error() {
    let Some(h) = make() else { return };
    let k = key("s", "a");
    h.first
        .accept(&accepted(k.clone(), exec_spec("x"), 1), 100)
        .unwrap();
    let mut c = raw(&h.url);
    let old: Vec<u8> = c
        .query_one(
            "SELECT payload FROM executions WHERE partition = $1 AND id = 'a'",
            &[&h.partition],
        )
        .unwrap()
        .get(0);
    h.first.claim(&k, "ctl", 2, 1_000).unwrap();
    c.execute(
        "UPDATE executions SET payload = $2 WHERE partition = $1 AND id = 'a'",
        &[&h.partition, &old],
    )
    .unwrap();
    let e = h.first.fetch(&k).unwrap_err();
    assert_eq!(
        (e.category(), e.reason()),
        (Category::Store, Reason::AuthenticationFailed)
    );
}

/// As on SQLite: a machine claim renewal moves the row's revision (the
/// version column), not the record's version; the payload from before the
/// renewal swapped back is refused.
#[test]
fn a_machine_payload_from_before_a_claim_renewal_is_a_store_error() {
    let Some(h) = make() else { return };
    let k = key("s", "m");
    h.first
        .accept_machine(&accepted_machine(k.clone(), machine_spec(), 1), 100)
        .unwrap();
    h.first.claim_machine(&k, "ctl", 2, 1_000).unwrap();
    let mut c = raw(&h.url);
    let old: Vec<u8> = c
        .query_one(
            "SELECT payload FROM machines WHERE partition = $1 AND id = 'm'",
            &[&h.partition],
        )
        .unwrap()
        .get(0);
    let renewed = h.first.claim_machine(&k, "ctl", 3, 1_000).unwrap();
    assert_eq!((renewed.version, renewed.revision()), (1, 3));
    let column: i64 = c
        .query_one(
            "SELECT version FROM machines WHERE partition = $1 AND id = 'm'",
            &[&h.partition],
        )
        .unwrap()
        .get(0);
    assert_eq!(column, 3, "the row's version column is the revision");
    c.execute(
        "UPDATE machines SET payload = $2 WHERE partition = $1 AND id = 'm'",
        &[&h.partition, &old],
    )
    .unwrap();
    let e = h.first.fetch_machine(&k).unwrap_err();
    assert_eq!(
        (e.category(), e.reason()),
        (Category::Store, Reason::AuthenticationFailed)
    );
}

#[test]
fn first_format_rows_migrate_and_keep_decoding() {
    use smolbox_core::managed::RecordKind;
    use smolbox_core::managed::envelope::encode_exec;
    let Some(h) = make() else { return };
    let recs: Vec<_> = (0..3)
        .map(|i| accepted(key("s", &format!("o{i}")), exec_spec("x"), 10 + i))
        .collect();
    h.first.import(&recs).unwrap();
    // As the first layout left this partition: no key check, first-format payloads.
    let mut c = raw(&h.url);
    c.execute(
        "DELETE FROM partition_keys WHERE partition = $1",
        &[&h.partition],
    )
    .unwrap();
    for r in &recs {
        let old = conformance::legacy_seal(
            [9; 32],
            &h.partition,
            RecordKind::Execution,
            &r.key,
            &encode_exec(r).unwrap(),
        );
        c.execute(
            "UPDATE executions SET payload = $3 WHERE partition = $1 AND id = $2",
            &[&h.partition, &r.key.id, &old],
        )
        .unwrap();
    }
    let first_byte = |c: &mut postgres::Client, id: &str| -> i32 {
        c.query_one(
            "SELECT get_byte(payload, 0) FROM executions WHERE partition = $1 AND id = $2",
            &[&h.partition, &id],
        )
        .unwrap()
        .get(0)
    };
    assert_eq!(first_byte(&mut c, "o1"), 1);
    let e = PostgresStore::connect(&h.url, other_sealer(&h.partition)).unwrap_err();
    assert_eq!(e.reason(), Reason::KeyMismatch);
    assert_eq!(
        first_byte(&mut c, "o1"),
        1,
        "a refused migration changes nothing"
    );
    let s = PostgresStore::connect(&h.url, sealer(&h.partition)).unwrap();
    for r in &recs {
        assert_eq!(&s.fetch(&r.key).unwrap(), r);
        assert_eq!(first_byte(&mut c, &r.key.id), 2);
    }
    // Once migrated, a first-format payload is refused.
    let old = conformance::legacy_seal(
        [9; 32],
        &h.partition,
        RecordKind::Execution,
        &recs[0].key,
        &encode_exec(&recs[0]).unwrap(),
    );
    c.execute(
        "UPDATE executions SET payload = $2 WHERE partition = $1 AND id = 'o0'",
        &[&h.partition, &old],
    )
    .unwrap();
    assert_eq!(
        s.fetch(&recs[0].key).unwrap_err().reason(),
        Reason::LegacySealedVersion
    );
}

/// Opening a store whose schema is current runs no DDL, so a controller
/// connecting while another transaction writes (holds row-exclusive
/// table locks, as every operation does) neither waits
/// nor deadlocks with it (CI once failed `make()` with a deadlock between
/// `CREATE INDEX IF NOT EXISTS` and a running operation). The lock
/// timeout turns a regression into an error instead of a hang.
#[test]
fn connect_with_a_current_schema_takes_no_table_lock() {
    let Some(url) = url() else { return };
    let p = fresh_partition('p');
    drop(PostgresStore::connect(&url, sealer(&p)).unwrap());
    let mut holder = raw(&url);
    let mut tx = holder.transaction().unwrap();
    tx.batch_execute("LOCK TABLE executions, machines IN ROW EXCLUSIVE MODE")
        .unwrap();
    let sep = if url.contains('?') { '&' } else { '?' };
    let timed = if url.contains("://") {
        format!("{url}{sep}options=-c%20lock_timeout%3D3000")
    } else {
        format!("{url} options='-c lock_timeout=3000'")
    };
    let second = PostgresStore::connect(&timed, sealer(&fresh_partition('p')));
    tx.rollback().unwrap();
    let second = second.unwrap();
    let rec = accepted(key("s", "after-lock"), exec_spec("x"), 1);
    second.accept(&rec, 100).unwrap();
    assert_eq!(second.fetch(&rec.key).unwrap(), rec);
}
