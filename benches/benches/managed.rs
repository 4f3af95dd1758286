//! The managed runtime's buffered command against the devworker with the
//! embedded SQLite store (durable default, `synchronous = FULL`), beside
//! the low-level `Client::exec` of the same command on the same machine in
//! the same run (issue 12's Benchmark section, issue 16 item 1):
//!
//! * client CPU per command — everything this process spends: the caller,
//!   the runtime's driver, its store and worker-op threads, SQLite and the
//!   sealing — as a ratio to `Client::exec` (goal ≤ 1.5×). The devworker
//!   runs in a child process (this binary re-executed), so none of its CPU
//!   is counted; the figure is `getrusage(RUSAGE_SELF)` over the calls;
//! * store commits per command, from the store's own counter (goal ≤ 3);
//! * memory per queued record: the blocking runtime with `max_active(1)`
//!   busy on one `sleep`, then 1,000 submissions that wait in the store;
//!   live Rust heap growth (a counting allocator, `stats_alloc`) and
//!   resident-set growth (`VmRSS`, which also sees SQLite's page cache) of
//!   this process, per queued record;
//! * wall time per command (divan), for reference: the managed figure is
//!   bounded by the fsyncs of its commits, not by CPU.
//!
//! Both shells' runtimes are measured (`Runtime::run` = submit + wait),
//! on SQLite FULL and again on `synchronous = NORMAL` (an `ephemeral`
//! runtime: the CPU comparison without fsync); the peer is measured first
//! and again last (the load may change). Beside them, the **floor** of
//! each sync mode: `Client::exec` plus the same number of commits as
//! bare rusqlite statements (an insert, then a select + update, of one
//! row with a payload the size of the sealed record, WAL, same sync) —
//! what any durable managed command costs at least with this store, so
//! the runtime's ratio to it is its own overhead. Printed before the
//! divan run:
//!
//! `cargo bench -p smolbox-benches --bench managed`
//!
//! For a profiler, `SMOLBOX_MANAGED_PROFILE=client|blocking|tokio|floor` (or
//! `blocking-normal`, `tokio-normal`, `floor-normal`) runs only that case
//! `SMOLBOX_MANAGED_PROFILE_CALLS` times (default 2,000) and exits.

#![allow(clippy::unwrap_used)] // benchmark set-up: a failure aborts the run
#![allow(clippy::print_stdout)] // the CPU and commit figures are printed

use std::alloc::System;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command as Process, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use divan::Bencher;
use smolbox_core::Secret;
use smolbox_core::exec::Command;
use smolbox_core::managed::controller::{RunTarget, Submit, spec_for};
use smolbox_core::managed::{ExecState, FingerprintKey, RecordKey};
use smolbox_core::worker::{Budgets, Endpoint, EndpointConfig, MachineName, MachineSpec};
use smolbox_devworker::DevWorker;
use smolbox_store::keys::load_or_create_keys;
use smolbox_store::{Sealer, SqliteOptions, SqliteStore, Store};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

/// Counts live heap bytes (for the memory per queued record).
#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Commands per CPU figure.
const CPU_CALLS: u32 = 300;
/// The environment variable that makes this binary the devworker child.
const CHILD: &str = "SMOLBOX_MANAGED_BENCH_WORKER";

fn main() {
    if std::env::var_os(CHILD).is_some() {
        worker_child();
        return;
    }
    if let Ok(which) = std::env::var(PROFILE) {
        profile(&which);
        return;
    }
    report();
    report_queue_memory();
    divan::main();
}

/// Runs only one case in a loop (for `perf record` / `strace -c`), then
/// exits: `client`, `blocking`, `tokio`, `blocking-normal`, `tokio-normal`.
const PROFILE: &str = "SMOLBOX_MANAGED_PROFILE";

fn profile(which: &str) {
    let n: u32 = std::env::var("SMOLBOX_MANAGED_PROFILE_CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000);
    let normal = which.ends_with("-normal");
    let (_dir, store, fingerprint) = sqlite_with(normal);
    let started = std::time::Instant::now();
    let cpu = process_cpu();
    match which.trim_end_matches("-normal") {
        "client" => {
            let client = smolbox_blocking::Client::new(endpoint(&world().base_url)).unwrap();
            let cmd = command();
            for _ in 0..n {
                client.exec("m1", &cmd).unwrap();
            }
        }
        "floor" => {
            let client = smolbox_blocking::Client::new(endpoint(&world().base_url)).unwrap();
            let mut raw = RawCommits::open(normal, sealed_record_len());
            let cmd = command();
            for _ in 0..n {
                client.exec("m1", &cmd).unwrap();
                raw.command(COMMITS_PER_RUN);
            }
        }
        "blocking" => {
            let rt = blocking_runtime(store, fingerprint, normal);
            for _ in 0..n {
                rt.run(submit()).unwrap();
            }
            rt.shutdown();
        }
        "tokio" => {
            let rt = tokio_rt();
            let runtime = tokio_runtime(&rt, store, fingerprint, normal);
            for _ in 0..n {
                rt.block_on(runtime.run(submit())).unwrap();
            }
            rt.block_on(runtime.shutdown());
        }
        other => panic!("unknown {PROFILE} {other}"),
    }
    let cpu = process_cpu() - cpu;
    println!(
        "{which}: {n} calls, {:.1} µs CPU and {:.1} µs wall per call",
        micros(cpu) / f64::from(n),
        micros(started.elapsed()) / f64::from(n)
    );
}

/// The devworker child: prints its base URL, serves until stdin closes.
fn worker_child() {
    let worker =
        DevWorker::start_blocking(DevWorker::builder().version("1.22.0").quiet(true)).unwrap();
    println!("{}", worker.base_url());
    std::io::stdout().flush().unwrap();
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
    drop(worker);
}

struct World {
    _child: Child,
    base_url: String,
}

fn world() -> &'static World {
    static W: OnceLock<World> = OnceLock::new();
    W.get_or_init(|| {
        let mut child = Process::new(std::env::current_exe().unwrap())
            .env(CHILD, "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let base_url = line.trim().to_owned();
        let client = smolbox_blocking::Client::new(endpoint(&base_url)).unwrap();
        let profile = client.admit(&[]).unwrap();
        client
            .create(
                &profile,
                MachineName::new("m1").unwrap(),
                &MachineSpec::default(),
            )
            .unwrap();
        World {
            _child: child,
            base_url,
        }
    })
}

fn endpoint(base_url: &str) -> Endpoint {
    Endpoint::new(EndpointConfig {
        id: "dev".into(),
        base_url: base_url.into(),
        allow_insecure_loopback: true,
        token: Some(Secret::new("bench-token")),
        budgets: Budgets {
            operation: Duration::from_secs(60),
            ..Budgets::default()
        },
        ..EndpointConfig::default()
    })
    .unwrap()
}

fn command() -> Command {
    Command::new(["/bin/true"])
}

/// A fresh durable SQLite store in its own directory (kept alive with it).
fn sqlite() -> (tempfile::TempDir, Arc<SqliteStore>, FingerprintKey) {
    sqlite_with(false)
}

/// A fresh SQLite store, `synchronous = NORMAL` (non-durable) if `normal`.
fn sqlite_with(normal: bool) -> (tempfile::TempDir, Arc<SqliteStore>, FingerprintKey) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("smolbox.db");
    let (fingerprint, seal) = load_or_create_keys(&db).unwrap();
    let options = SqliteOptions {
        synchronous_normal: normal,
        ..SqliteOptions::default()
    };
    let store = Arc::new(
        SqliteStore::open_with(&db, Sealer::new(&seal, "bench").unwrap(), options).unwrap(),
    );
    assert_eq!(store.info().durable, !normal);
    (dir, store, fingerprint)
}

/// A new submission of the command under a key never used before.
fn submit() -> Submit {
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let cmd = command();
    Submit {
        key: RecordKey::new("bench", &format!("c{n}")).unwrap(),
        spec: spec_for(&cmd, &RunTarget::unverified().fitting(&cmd), "dev", "m1").unwrap(),
    }
}

/// CPU time of this whole process so far (user + system).
fn process_cpu() -> Duration {
    use nix::sys::resource::{UsageWho, getrusage};
    let u = getrusage(UsageWho::RUSAGE_SELF).unwrap();
    let us = |t: nix::sys::time::TimeVal| {
        Duration::from_secs(u64::try_from(t.tv_sec()).unwrap())
            + Duration::from_micros(u64::try_from(t.tv_usec()).unwrap())
    };
    us(u.user_time()) + us(u.system_time())
}

/// CPU per call of `f` over [`CPU_CALLS`] calls (after 20 warm-up calls).
fn cpu_per_call(mut f: impl FnMut()) -> Duration {
    for _ in 0..20 {
        f();
    }
    let before = process_cpu();
    for _ in 0..CPU_CALLS {
        f();
    }
    (process_cpu() - before) / CPU_CALLS
}

fn blocking_runtime(
    store: Arc<SqliteStore>,
    fingerprint: FingerprintKey,
    ephemeral: bool,
) -> smolbox_blocking::Runtime {
    let client = smolbox_blocking::Client::new(endpoint(&world().base_url)).unwrap();
    smolbox_blocking::Runtime::builder(store, fingerprint)
        .worker("dev", client)
        .ephemeral(ephemeral)
        .build()
        .unwrap()
}

fn tokio_runtime(
    rt: &tokio::runtime::Runtime,
    store: Arc<SqliteStore>,
    fingerprint: FingerprintKey,
    ephemeral: bool,
) -> smolbox_tokio::Runtime {
    let _enter = rt.enter();
    let client = smolbox_tokio::Client::new(endpoint(&world().base_url)).unwrap();
    smolbox_tokio::Runtime::builder(store, fingerprint)
        .worker("dev", client)
        .ephemeral(ephemeral)
        .build()
        .unwrap()
}

fn tokio_rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Commits of a buffered `Runtime::run` on a caller's machine (asserted
/// below from the store's own counter): the floor peer makes as many.
const COMMITS_PER_RUN: u32 = 2;

/// The floor's store half: the same commits as bare rusqlite statements
/// on one row per command, WAL, the runtime's sync mode. A rowid table,
/// as the store's (a ~1.3 KB payload overflows a `WITHOUT ROWID` cell on
/// a 4 KiB page: an overflow page per row, which made the floor dearer).
struct RawCommits {
    _dir: tempfile::TempDir,
    c: rusqlite::Connection,
    payload: Vec<u8>,
    next: u64,
}

impl RawCommits {
    fn open(normal: bool, payload_len: usize) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let c = rusqlite::Connection::open(dir.path().join("raw.db")).unwrap();
        let sync = if normal { "NORMAL" } else { "FULL" };
        c.execute_batch(&format!(
            "PRAGMA journal_mode = WAL; PRAGMA synchronous = {sync};
             CREATE TABLE t (id TEXT PRIMARY KEY, payload BLOB NOT NULL, state TEXT NOT NULL,
                             version INTEGER NOT NULL);"
        ))
        .unwrap();
        Self {
            _dir: dir,
            c,
            payload: vec![0x5a; payload_len],
            next: 0,
        }
    }

    /// One command's `commits`: an insert, then read + update transactions.
    fn command(&mut self, commits: u32) {
        self.next += 1;
        let id = format!("r{}", self.next);
        let tx = self
            .c
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .unwrap();
        tx.prepare_cached("INSERT INTO t VALUES (?1, ?2, 'accepted', 1)")
            .unwrap()
            .execute(rusqlite::params![id, self.payload])
            .unwrap();
        tx.commit().unwrap();
        for v in 2..=i64::from(commits) {
            let tx = self
                .c
                .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                .unwrap();
            let read: (Vec<u8>, String) = tx
                .prepare_cached("SELECT payload, state FROM t WHERE id = ?1")
                .unwrap()
                .query_row([&id], |r| Ok((r.get(0)?, r.get(1)?)))
                .unwrap();
            divan::black_box(read);
            tx.prepare_cached(
                "UPDATE t SET payload = ?2, state = 'next', version = ?3 WHERE id = ?1",
            )
            .unwrap()
            .execute(rusqlite::params![id, self.payload, v])
            .unwrap();
            tx.commit().unwrap();
        }
    }
}

/// The size of a sealed, completed record of this benchmark's command.
fn sealed_record_len() -> usize {
    let (dir, store, fingerprint) = sqlite_with(true);
    let rt = blocking_runtime(store, fingerprint, true);
    let out = rt.run(submit()).unwrap();
    rt.shutdown();
    let (_, seal) = load_or_create_keys(&dir.path().join("smolbox.db")).unwrap();
    Sealer::new(&seal, "bench")
        .unwrap()
        .seal_exec(&out.record)
        .unwrap()
        .len()
}

/// Client CPU and commits per command of both shells' `Runtime::run` on
/// a fresh SQLite store (`synchronous = NORMAL` if `normal`, then the
/// runtime is `ephemeral`), printed as ratios to `low`, and the floor of
/// that sync mode (`Client::exec` + the same commits as bare statements).
fn report_runtimes(low: Duration, normal: bool) {
    let sync = if normal { "NORMAL" } else { "FULL" };
    // 20 warm-up calls are counted by the store too.
    let calls = u64::from(CPU_CALLS) + 20;
    let ratio = |d: Duration| d.as_secs_f64() / low.as_secs_f64();

    let floor = {
        let client = smolbox_blocking::Client::new(endpoint(&world().base_url)).unwrap();
        let mut raw = RawCommits::open(normal, sealed_record_len());
        let cmd = command();
        cpu_per_call(|| {
            client.exec("m1", &cmd).unwrap();
            raw.command(COMMITS_PER_RUN);
        })
    };

    let (_dir, store, fingerprint) = sqlite_with(normal);
    let blocking = blocking_runtime(Arc::clone(&store), fingerprint, normal);
    let commits_before = store.commits().unwrap();
    let managed_blocking = cpu_per_call(|| {
        let out = blocking.run(submit()).unwrap();
        assert_eq!(out.record.state, ExecState::Completed);
    });
    let blocking_commits = store.commits().unwrap() - commits_before;
    // The driver's own CPU while nothing is submitted: an idle runtime
    // should use none.
    let idle_alive = idle_cpu();
    blocking.shutdown();
    let idle_after_shutdown = idle_cpu();
    drop(blocking);
    let idle_dropped = idle_cpu();

    let rt = tokio_rt();
    let (_dir2, store2, fingerprint2) = sqlite_with(normal);
    let tokio = tokio_runtime(&rt, Arc::clone(&store2), fingerprint2, normal);
    let commits_before = store2.commits().unwrap();
    let managed_tokio = cpu_per_call(|| {
        let out = rt.block_on(tokio.run(submit())).unwrap();
        assert_eq!(out.record.state, ExecState::Completed);
    });
    let tokio_commits = store2.commits().unwrap() - commits_before;
    let tokio_idle_alive = idle_cpu();
    rt.block_on(tokio.shutdown());
    let tokio_idle_after_shutdown = idle_cpu();
    drop(tokio);

    assert_eq!(blocking_commits, calls * u64::from(COMMITS_PER_RUN));
    assert_eq!(tokio_commits, calls * u64::from(COMMITS_PER_RUN));
    let over_floor = |d: Duration| d.as_secs_f64() / floor.as_secs_f64();
    println!(
        "  floor: exec + {COMMITS_PER_RUN} bare commits, {sync:<6} {:>9.1} µs  {:.2}×",
        micros(floor),
        ratio(floor),
    );
    println!(
        "  blocking Runtime::run, {sync:<6}  {:>9.1} µs  {:.2}×  ({:.2}× the floor)  commits/command {:.2}",
        micros(managed_blocking),
        ratio(managed_blocking),
        over_floor(managed_blocking),
        blocking_commits as f64 / calls as f64
    );
    println!(
        "  tokio Runtime::run, {sync:<6}     {:>9.1} µs  {:.2}×  ({:.2}× the floor)  commits/command {:.2}",
        micros(managed_tokio),
        ratio(managed_tokio),
        over_floor(managed_tokio),
        tokio_commits as f64 / calls as f64
    );
    println!(
        "  idle CPU ({sync}; cores busy while nothing is submitted): blocking runtime alive {idle_alive:.2}, \
         after shutdown {idle_after_shutdown:.2}, dropped {idle_dropped:.2}; tokio runtime alive \
         {tokio_idle_alive:.2}, after shutdown {tokio_idle_after_shutdown:.2}"
    );
}

fn report() {
    let w = world();
    let client = smolbox_blocking::Client::new(endpoint(&w.base_url)).unwrap();
    let cmd = command();
    let exec = || {
        let out = client.exec("m1", &cmd).unwrap();
        assert!(matches!(
            out,
            smolbox_core::exec::ExecOutcome::Exited(ref o) if o.exit_code == 0
        ));
    };
    let low = cpu_per_call(exec);
    println!(
        "managed buffered command vs Client::exec, client CPU per command (this process, devworker in a child):"
    );
    println!("  Client::exec (blocking)          {:>9.1} µs", micros(low));
    report_runtimes(low, false);
    report_runtimes(low, true);
    // The peer again, after: the load may have changed meanwhile.
    let low_after = cpu_per_call(exec);
    println!(
        "  Client::exec (blocking), again   {:>9.1} µs",
        micros(low_after)
    );
}

/// Records queued behind a busy `max_active(1)` for the memory figure.
const QUEUED: usize = 1_000;

/// Resident set of this process (`VmRSS`), bytes.
fn vm_rss() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap()
        * 1024
}

fn report_queue_memory() {
    let (_dir, store, fingerprint) = sqlite();
    let client = smolbox_blocking::Client::new(endpoint(&world().base_url)).unwrap();
    let rt = smolbox_blocking::Runtime::builder(store, fingerprint)
        .worker("dev", client)
        .max_active(1)
        .max_pending(10_000)
        .build()
        .unwrap();
    // The one active slot is held by a command that outlasts the queueing.
    let busy = Command::new(["/bin/sleep", "20"]);
    rt.submit(Submit {
        key: RecordKey::new("bench", "busy").unwrap(),
        spec: spec_for(&busy, &RunTarget::unverified().fitting(&busy), "dev", "m1").unwrap(),
    })
    .unwrap();
    // Warm-up: a few queued submissions grow the first buffers.
    for _ in 0..20 {
        rt.submit(submit()).unwrap();
    }
    let started = std::time::Instant::now();
    let rss = vm_rss();
    let region = Region::new(GLOBAL);
    for _ in 0..QUEUED {
        rt.submit(submit()).unwrap();
    }
    let c = region.change();
    let heap = c.bytes_allocated as i64 - c.bytes_deallocated as i64 + c.bytes_reallocated as i64;
    let rss_grown = vm_rss().saturating_sub(rss);
    let took = started.elapsed();
    println!(
        "memory per queued record ({QUEUED} queued behind max_active 1, blocking runtime, SQLite FULL): \
         live heap {:.0} B, resident {:.0} B (submitting took {:.1} s{})",
        heap as f64 / QUEUED as f64,
        rss_grown as f64 / QUEUED as f64,
        took.as_secs_f64(),
        if took > Duration::from_secs(15) {
            "; WARNING: the busy command may have ended, so some were not queued"
        } else {
            ""
        }
    );
    rt.shutdown();
}

/// CPU this process uses in 500 ms of doing nothing (the runtimes' own
/// threads), per millisecond of wall time.
fn idle_cpu() -> f64 {
    let before = process_cpu();
    std::thread::sleep(Duration::from_millis(500));
    (process_cpu() - before).as_secs_f64() / 0.5
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

// ---- wall time per command -------------------------------------------------

#[divan::bench_group(name = "managed_command", sample_count = 20, sample_size = 5)]
mod managed_command {
    use super::*;

    /// The low-level peer: `Client::exec` of the same command.
    #[divan::bench]
    fn client_exec(b: Bencher<'_, '_>) {
        let client = smolbox_blocking::Client::new(endpoint(&world().base_url)).unwrap();
        let cmd = command();
        b.bench_local(|| client.exec("m1", &cmd).unwrap());
    }

    /// `Runtime::run` on the blocking shell, SQLite `synchronous = FULL`.
    #[divan::bench]
    fn blocking_runtime(b: Bencher<'_, '_>) {
        let (_dir, store, fingerprint) = sqlite();
        let rt = super::blocking_runtime(store, fingerprint, false);
        b.bench_local(|| rt.run(submit()).unwrap());
        rt.shutdown();
    }

    /// `Runtime::run` on the tokio shell, SQLite `synchronous = FULL`.
    #[divan::bench]
    fn tokio_runtime(b: Bencher<'_, '_>) {
        let (_dir, store, fingerprint) = sqlite();
        let rt = tokio_rt();
        let runtime = super::tokio_runtime(&rt, store, fingerprint, false);
        b.bench_local(|| rt.block_on(runtime.run(submit())).unwrap());
        rt.block_on(runtime.shutdown());
    }
}
