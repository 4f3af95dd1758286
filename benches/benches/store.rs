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
use smolbox_store::{
    EncryptionKey, MemoryConfig, MemoryStore, PostgresStore, Sealer, SqliteOptions, SqliteStore,
    Store,
};

fn main() {
    if let Ok(which) = std::env::var("SMOLBOX_STORE_PROFILE") {
        profile(&which);
        return;
    }
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
    let mut peer = RawPeer::open(&dir);
    b.counter(ItemsCount::new(1usize))
        .bench_local(|| peer.run(updates));
}

/// The raw rusqlite peer's connection and payload.
struct RawPeer {
    c: rusqlite::Connection,
    payload: Vec<u8>,
}

impl RawPeer {
    fn open(dir: &tempfile::TempDir) -> Self {
        let c = rusqlite::Connection::open(dir.path().join("raw.db")).unwrap();
        c.execute_batch(
            "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;
             CREATE TABLE t (id TEXT PRIMARY KEY, payload BLOB NOT NULL, state TEXT NOT NULL,
                             version INTEGER NOT NULL) WITHOUT ROWID;",
        )
        .unwrap();
        Self {
            c,
            payload: vec![0x5au8; record_len()],
        }
    }

    /// An insert, then `updates` read + update transactions, on one row.
    fn run(&mut self, updates: i64) {
        let (c, payload) = (&mut self.c, &self.payload);
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
    }
}

// ---- the in-memory store (the ephemeral default) ---------------------------

fn memory() -> MemoryStore {
    MemoryStore::new(MemoryConfig {
        max_records: 10_000,
        ..MemoryConfig::default()
    })
    .unwrap()
}

/// [`command`] (3 commits) on the in-memory store.
#[divan::bench(sample_count = 20, sample_size = 100)]
fn memory_command_3_commits(b: Bencher<'_, '_>) {
    let s = memory();
    b.counter(ItemsCount::new(1usize))
        .bench_local(|| command(&s, "ctl"));
}

/// [`lifecycle`] (accept + 5 transitions) on the in-memory store.
#[divan::bench(sample_count = 20, sample_size = 100)]
fn memory_lifecycle(b: Bencher<'_, '_>) {
    let s = memory();
    b.counter(ItemsCount::new(1usize))
        .bench_local(|| lifecycle(&s, "ctl"));
}

/// For an instruction counter (callgrind; the load does not move it):
/// `SMOLBOX_STORE_PROFILE=<store>-<ops>` runs `SMOLBOX_STORE_PROFILE_OPS`
/// (default 2,000) commands (`-command`, 3 commits) or lifecycles
/// (`-lifecycle`, 6 commits) on `sqlite` (`synchronous = NORMAL`),
/// `sqlite_full`, `memory` or `raw` (the rusqlite peer), then exits.
/// Instructions per op = difference of two runs / difference of counts.
#[allow(clippy::print_stdout)] // the profile's one line
fn profile(which: &str) {
    let n: u64 = std::env::var("SMOLBOX_STORE_PROFILE_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000);
    let (store, ops) = which.rsplit_once('-').unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut run: Box<dyn FnMut()> = match (store, ops) {
        ("raw", "command") => {
            let mut p = RawPeer::open(&dir);
            Box::new(move || p.run(2))
        }
        ("raw", "lifecycle") => {
            let mut p = RawPeer::open(&dir);
            Box::new(move || p.run(5))
        }
        (s, o) => {
            let store: Box<dyn Store> = match s {
                "sqlite" => Box::new(sqlite(&dir, true)),
                "sqlite_full" => Box::new(sqlite(&dir, false)),
                "memory" => Box::new(memory()),
                other => panic!("unknown store {other}"),
            };
            match o {
                "command" => Box::new(move || command(store.as_ref(), "ctl")),
                "lifecycle" => Box::new(move || lifecycle(store.as_ref(), "ctl")),
                other => panic!("unknown ops {other}"),
            }
        }
    };
    for _ in 0..n {
        run();
    }
    println!("{which}: {n} ops");
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

// ---- concurrency: 1, 8, 64 executions on one store (issue 16 item 2) ----

const CONCURRENCY: [usize; 3] = [1, 8, 64];
/// Lifecycles per iteration, split over the threads.
const CONCURRENT_LIFECYCLES: usize = 64;

/// `threads` threads sharing one store, `CONCURRENT_LIFECYCLES` lifecycles
/// in all per iteration (each thread its own records and owner).
fn concurrent(b: Bencher<'_, '_>, s: &(dyn Store + Sync), threads: usize) {
    b.counter(ItemsCount::new(CONCURRENT_LIFECYCLES))
        .bench_local(|| {
            std::thread::scope(|sc| {
                for i in 0..threads {
                    sc.spawn(move || {
                        let owner = format!("ctl-{i}");
                        for _ in 0..CONCURRENT_LIFECYCLES / threads {
                            lifecycle(s, &owner);
                        }
                    });
                }
            });
        });
}

#[divan::bench(args = CONCURRENCY, sample_count = 10, sample_size = 1)]
fn sqlite_lifecycle_concurrent_sync_normal(b: Bencher<'_, '_>, threads: usize) {
    let dir = tempfile::tempdir().unwrap();
    let s = sqlite(&dir, true);
    concurrent(b, &s, threads);
}

#[divan::bench(args = CONCURRENCY, sample_count = 5, sample_size = 1)]
fn sqlite_lifecycle_concurrent_sync_full(b: Bencher<'_, '_>, threads: usize) {
    let dir = tempfile::tempdir().unwrap();
    let s = sqlite(&dir, false);
    concurrent(b, &s, threads);
}

/// One `PostgresStore` (one connection) shared by `threads` threads.
#[divan::bench(args = CONCURRENCY, sample_count = 5, sample_size = 1)]
fn postgres_lifecycle_concurrent_one_store(b: Bencher<'_, '_>, threads: usize) {
    let Some(url) = pg_url() else { return };
    let s = PostgresStore::connect(&url, sealer(&pg_partition("e"))).unwrap();
    concurrent(b, &s, threads);
}

// ---- the partition-row lock (C18.3), as bare SQL on PostgreSQL --------------

/// The two ways a guarded single-record write can be made safe against a
/// concurrent writer, as bare statements on one partition (no sealing, no
/// rules), `conns` connections, 25 lifecycles (insert + 5 read-modify-
/// writes) per connection per iteration:
///
/// * `cas` (what the store does): autocommit `SELECT`, then `UPDATE …
///   WHERE version = $old` — two round trips per write;
/// * `partition_lock` (the literal C18.3): `BEGIN`, `SELECT … FROM
///   partitions … FOR UPDATE`, `SELECT … FOR UPDATE`, `UPDATE`, `COMMIT` —
///   five round trips, and every writer of the partition queues on one row.
fn pg_raw_lock_peer(b: Bencher<'_, '_>, conns: usize, partition_lock: bool) {
    let Some(url) = pg_url() else { return };
    let table = format!("lockpeer_{}", pg_partition("t"));
    let mut setup = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    setup
        .batch_execute(&format!(
            "CREATE TABLE {table}_p (name TEXT PRIMARY KEY);
             INSERT INTO {table}_p VALUES ('p');
             CREATE TABLE {table} (partition TEXT NOT NULL, id TEXT NOT NULL, payload BYTEA NOT NULL,
                                   state TEXT NOT NULL, version BIGINT NOT NULL,
                                   PRIMARY KEY (partition, id));"
        ))
        .unwrap();
    let payload = vec![0x5au8; record_len()];
    let mut clients: Vec<postgres::Client> = (0..conns)
        .map(|_| postgres::Client::connect(&url, postgres::NoTls).unwrap())
        .collect();
    b.counter(ItemsCount::new(conns * PER_CONTROLLER))
        .bench_local(|| {
            std::thread::scope(|sc| {
                for c in &mut clients {
                    let (table, payload) = (&table, &payload);
                    sc.spawn(move || {
                        for _ in 0..PER_CONTROLLER {
                            raw_pg_lifecycle(c, table, payload, partition_lock);
                        }
                    });
                }
            });
        });
    setup
        .batch_execute(&format!("DROP TABLE {table}; DROP TABLE {table}_p;"))
        .unwrap();
}

fn raw_pg_lifecycle(c: &mut postgres::Client, table: &str, payload: &[u8], partition_lock: bool) {
    let id = format!("r{}", NEXT.fetch_add(1, Ordering::Relaxed));
    let insert = format!("INSERT INTO {table} VALUES ('p', $1, $2, 'accepted', 1)");
    let select =
        format!("SELECT payload, state, version FROM {table} WHERE partition = 'p' AND id = $1");
    if partition_lock {
        let lock = format!("SELECT name FROM {table}_p WHERE name = 'p' FOR UPDATE");
        let select = format!("{select} FOR UPDATE");
        let update = format!(
            "UPDATE {table} SET payload = $2, state = 'next', version = $3 WHERE partition = 'p' AND id = $1"
        );
        let mut tx = c.transaction().unwrap();
        tx.query_one(lock.as_str(), &[]).unwrap();
        tx.execute(insert.as_str(), &[&id, &payload]).unwrap();
        tx.commit().unwrap();
        for _ in 0..5 {
            let mut tx = c.transaction().unwrap();
            tx.query_one(lock.as_str(), &[]).unwrap();
            let row = tx.query_one(select.as_str(), &[&id]).unwrap();
            let v: i64 = row.get(2);
            tx.execute(update.as_str(), &[&id, &payload, &(v + 1)])
                .unwrap();
            tx.commit().unwrap();
        }
    } else {
        let update = format!(
            "UPDATE {table} SET payload = $2, state = 'next', version = $3 WHERE partition = 'p' AND id = $1 AND version = $4"
        );
        c.execute(insert.as_str(), &[&id, &payload]).unwrap();
        for _ in 0..5 {
            let row = c.query_one(select.as_str(), &[&id]).unwrap();
            let v: i64 = row.get(2);
            assert_eq!(
                c.execute(update.as_str(), &[&id, &payload, &(v + 1), &v])
                    .unwrap(),
                1
            );
        }
    }
}

#[divan::bench(args = [1, 8], sample_count = 5, sample_size = 1)]
fn peer_pg_raw_cas(b: Bencher<'_, '_>, conns: usize) {
    pg_raw_lock_peer(b, conns, false);
}

#[divan::bench(args = [1, 8], sample_count = 5, sample_size = 1)]
fn peer_pg_raw_partition_lock(b: Bencher<'_, '_>, conns: usize) {
    pg_raw_lock_peer(b, conns, true);
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
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros();
    format!("{tag}{:07}{seq}", nanos % 10_000_000)
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
