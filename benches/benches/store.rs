//! Store throughput: accept + 5 guarded transitions per record (the full
//! lifecycle accepted -> preparing -> ready -> dispatching -> collecting ->
//! completed) on SQLite and PostgreSQL, PostgreSQL with 8 concurrent
//! controllers, and the first `due` page at 1,000,000 records; and the
//! 3 commits a buffered command on a caller's machine now takes
//! (`accept_dispatching`, `collecting`, `completed`) on SQLite beside a raw
//! peer doing the same 3 transactions.
//!
//! Peers in the same run: the same six SQLite transactions as bare
//! `rusqlite` statements on an unsealed row (the physical limit of SQLite
//! here), and `memcpy` of one sealed record.
//!
//! PostgreSQL benches read `SMOLBOX_PG_URL` and are skipped without it.
//!   cargo bench -p smolbox-benches --bench store
#![allow(clippy::unwrap_used)] // benches: a panic is the failure report

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};

use divan::Bencher;
use divan::counter::ItemsCount;
use smolbox_core::managed::record::Claim;
use smolbox_core::managed::state::ExecState;
use smolbox_core::managed::testkit::{accepted, entry_patch, exec_spec, fingerprint_key, key};
use smolbox_core::managed::{ExecutionRecord, Guard};
use smolbox_store::{EncryptionKey, PostgresStore, Sealer, SqliteOptions, SqliteStore, Store};

fn main() {
    divan::main();
}

const T0: u64 = 1_700_000_000_000;
const CONTROLLERS: usize = 8;
const PER_CONTROLLER: usize = 25;
const DUE_RECORDS: u64 = 1_000_000;

static NEXT: AtomicU64 = AtomicU64::new(0);

fn sealer(partition: &str) -> Sealer {
    let k = EncryptionKey::new([5; 32], &fingerprint_key()).unwrap();
    Sealer::new(&k, partition).unwrap()
}

/// A fresh record already claimed by `owner` (generation 1).
fn claimed_record(id: u64, owner: &str) -> ExecutionRecord {
    let mut rec = accepted(key("bench", &format!("r{id}")), exec_spec("bench"), T0);
    rec.claim = Some(Claim {
        owner: owner.to_owned(),
        until_ms: T0 + 3_600_000,
    });
    rec.generation = 1;
    rec
}

/// accept + 5 guarded transitions.
fn lifecycle(s: &dyn Store, owner: &str) {
    let mut rec = claimed_record(NEXT.fetch_add(1, Ordering::Relaxed), owner);
    s.accept(&rec, 10_000).unwrap();
    for st in [
        ExecState::Preparing,
        ExecState::Ready,
        ExecState::Dispatching,
        ExecState::Collecting,
        ExecState::Completed,
    ] {
        let g = Guard::for_exec(&rec, owner);
        rec = s
            .write(&rec.key, &g, &entry_patch(&rec, st), T0 + 1)
            .unwrap();
    }
}

fn sqlite(dir: &tempfile::TempDir, normal: bool) -> SqliteStore {
    let options = SqliteOptions {
        synchronous_normal: normal,
        ..SqliteOptions::default()
    };
    SqliteStore::open_with(&dir.path().join("bench.db"), sealer("bench"), options).unwrap()
}

#[divan::bench(sample_count = 20, sample_size = 50)]
fn sqlite_lifecycle_sync_normal(b: Bencher<'_, '_>) {
    let dir = tempfile::tempdir().unwrap();
    let s = sqlite(&dir, true);
    b.counter(ItemsCount::new(1usize))
        .bench_local(|| lifecycle(&s, "ctl"));
}

#[divan::bench(sample_count = 10, sample_size = 10)]
fn sqlite_lifecycle_sync_full(b: Bencher<'_, '_>) {
    let dir = tempfile::tempdir().unwrap();
    let s = sqlite(&dir, false);
    b.counter(ItemsCount::new(1usize))
        .bench_local(|| lifecycle(&s, "ctl"));
}

/// A buffered command's record as the controller now commits it on a
/// caller's machine (issue 16): the acceptance with the claim and the
/// dispatch intent, the result (`collecting`), `completed` — 3 commits.
fn command(s: &dyn Store, owner: &str) {
    let rec = claimed_record(NEXT.fetch_add(1, Ordering::Relaxed), owner);
    let mut rec = s.accept_dispatching(&rec, 10_000).unwrap().into_record();
    for st in [ExecState::Collecting, ExecState::Completed] {
        let g = Guard::for_exec(&rec, owner);
        rec = s
            .write(&rec.key, &g, &entry_patch(&rec, st), T0 + 1)
            .unwrap();
    }
}

#[divan::bench(sample_count = 20, sample_size = 50)]
fn sqlite_command_3_commits_sync_normal(b: Bencher<'_, '_>) {
    let dir = tempfile::tempdir().unwrap();
    let s = sqlite(&dir, true);
    b.counter(ItemsCount::new(1usize))
        .bench_local(|| command(&s, "ctl"));
}

#[divan::bench(sample_count = 10, sample_size = 10)]
fn sqlite_command_3_commits_sync_full(b: Bencher<'_, '_>) {
    let dir = tempfile::tempdir().unwrap();
    let s = sqlite(&dir, false);
    b.counter(ItemsCount::new(1usize))
        .bench_local(|| command(&s, "ctl"));
}

/// Peer of [`sqlite_command_3_commits_sync_normal`]: the same three
/// transactions (an insert, then read + update twice) as bare statements.
#[divan::bench(sample_count = 20, sample_size = 50)]
fn peer_raw_rusqlite_command(b: Bencher<'_, '_>) {
    raw_peer(b, 2);
}

/// Peer: the same six transactions as bare statements on an unsealed row
/// (WAL, synchronous = NORMAL): no envelope, no AEAD, no rule checks.
#[divan::bench(sample_count = 20, sample_size = 50)]
fn peer_raw_rusqlite_lifecycle(b: Bencher<'_, '_>) {
    raw_peer(b, 5);
}

/// An insert, then `updates` read + update transactions, on one row.
fn raw_peer(b: Bencher<'_, '_>, updates: i64) {
    let dir = tempfile::tempdir().unwrap();
    let c = rusqlite::Connection::open(dir.path().join("raw.db")).unwrap();
    c.execute_batch(
        "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;
         CREATE TABLE t (id TEXT PRIMARY KEY, payload BLOB NOT NULL, state TEXT NOT NULL,
                         version INTEGER NOT NULL) WITHOUT ROWID;",
    )
    .unwrap();
    let payload = vec![0x5au8; record_len()];
    let mut c = c;
    b.counter(ItemsCount::new(1usize)).bench_local(|| {
        let id = format!("r{}", NEXT.fetch_add(1, Ordering::Relaxed));
        let tx = c
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .unwrap();
        tx.prepare_cached("INSERT INTO t VALUES (?1, ?2, 'accepted', 1)")
            .unwrap()
            .execute(rusqlite::params![id, payload])
            .unwrap();
        tx.commit().unwrap();
        for v in 1..=updates {
            let tx = c
                .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                .unwrap();
            let (p, s): (Vec<u8>, String) = tx
                .prepare_cached("SELECT payload, state FROM t WHERE id = ?1")
                .unwrap()
                .query_row([&id], |r| Ok((r.get(0)?, r.get(1)?)))
                .unwrap();
            divan::black_box((p, s));
            tx.prepare_cached(
                "UPDATE t SET payload = ?2, state = 'next', version = ?3 WHERE id = ?1",
            )
            .unwrap()
            .execute(rusqlite::params![id, payload, v + 1])
            .unwrap();
            tx.commit().unwrap();
        }
    });
}

fn record_len() -> usize {
    sealer("bench")
        .seal_exec(&claimed_record(0, "ctl"))
        .unwrap()
        .len()
}

/// Peer: memcpy of one sealed record (the physical limit per copy).
#[divan::bench]
fn peer_memcpy_one_sealed_record(b: Bencher<'_, '_>) {
    let src = vec![0x5au8; record_len()];
    let mut dst = vec![0u8; src.len()];
    b.counter(divan::counter::BytesCount::new(src.len()))
        .bench_local(|| {
            dst.copy_from_slice(divan::black_box(&src));
            divan::black_box(&dst);
        });
}

fn pg_url() -> Option<String> {
    let url = std::env::var("SMOLBOX_PG_URL")
        .ok()
        .filter(|u| !u.is_empty());
    if url.is_none() {
        eprintln!("PostgreSQL benches skipped: SMOLBOX_PG_URL is not set");
    }
    url
}

fn pg_partition(tag: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros();
    format!("{tag}{:07}", nanos % 10_000_000)
}

#[divan::bench(sample_count = 10, sample_size = 20)]
fn postgres_lifecycle_one_controller(b: Bencher<'_, '_>) {
    let Some(url) = pg_url() else { return };
    let s = PostgresStore::connect(&url, sealer(&pg_partition("b"))).unwrap();
    b.counter(ItemsCount::new(1usize))
        .bench_local(|| lifecycle(&s, "ctl"));
}

#[divan::bench(sample_count = 10, sample_size = 1)]
fn postgres_lifecycle_8_controllers(b: Bencher<'_, '_>) {
    let Some(url) = pg_url() else { return };
    let partition = pg_partition("c");
    let stores: Vec<Arc<PostgresStore>> = (0..CONTROLLERS)
        .map(|_| Arc::new(PostgresStore::connect(&url, sealer(&partition)).unwrap()))
        .collect();
    b.counter(ItemsCount::new(CONTROLLERS * PER_CONTROLLER))
        .bench_local(|| {
            std::thread::scope(|sc| {
                for (i, s) in stores.iter().enumerate() {
                    sc.spawn(move || {
                        let owner = format!("ctl-{i}");
                        for _ in 0..PER_CONTROLLER {
                            lifecycle(&**s, &owner);
                        }
                    });
                }
            });
        });
}

/// Fills a store with 1,000,000 accepted records due one millisecond apart,
/// in import batches of 10,000.
fn fill(import: &dyn Fn(&[ExecutionRecord])) {
    let spec = exec_spec("due");
    let base = accepted(key("due", "r0"), spec, T0);
    let mut batch = Vec::with_capacity(10_000);
    for i in 0..DUE_RECORDS {
        let mut r = base.clone();
        r.key.id = format!("r{i:07}");
        r.next_due_at_ms = Some(T0 + i);
        batch.push(r);
        if batch.len() == 10_000 {
            import(&batch);
            batch.clear();
        }
    }
}

static SQLITE_1M: LazyLock<(tempfile::TempDir, SqliteStore)> = LazyLock::new(|| {
    let dir = tempfile::tempdir().unwrap();
    let s = sqlite(&dir, true);
    let started = std::time::Instant::now();
    fill(&|batch| s.import(batch).unwrap());
    eprintln!(
        "sqlite: 1,000,000 records imported in {:?}",
        started.elapsed()
    );
    (dir, s)
});

#[divan::bench(sample_count = 50, sample_size = 5)]
fn sqlite_due_first_page_at_1m(b: Bencher<'_, '_>) {
    let s = &SQLITE_1M.1;
    b.bench_local(|| {
        let page = s.due(T0 + 2 * DUE_RECORDS, None, 100).unwrap();
        assert_eq!(page.records.len(), 100);
        page
    });
}

#[divan::bench(sample_count = 50, sample_size = 5)]
fn postgres_due_first_page_at_1m(b: Bencher<'_, '_>) {
    let Some(url) = pg_url() else { return };
    let s = PostgresStore::connect(&url, sealer(&pg_partition("d"))).unwrap();
    let started = std::time::Instant::now();
    fill(&|batch| s.import(batch).unwrap());
    eprintln!(
        "postgres: 1,000,000 records imported in {:?}",
        started.elapsed()
    );
    b.bench_local(|| {
        let page = s.due(T0 + 2 * DUE_RECORDS, None, 100).unwrap();
        assert_eq!(page.records.len(), 100);
        page
    });
}
