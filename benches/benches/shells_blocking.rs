//! The blocking shell beside the tokio shell, in one run, against one local
//! devworker on loopback TCP (issue 8 item 6). The devworker runs in a child
//! process (this binary re-executed), so this process holds only the two
//! clients and the heap figures are the clients' alone:
//!
//! * `exec_round_trip`: one buffered exec of `true` per iteration;
//! * `terminal_output`: a terminal streams 1 MiB from the PTY, pulled with
//!   `Terminal::next` until the session closes (throughput in bytes).
//!
//! divan reports wall time (dominated by the devworker: it spawns a host
//! process per exec and per terminal). Before divan runs, `main` prints what
//! the goals are about, measured on the client's own thread: CPU time per
//! operation (`/proc/thread-self/schedstat`, nanoseconds; the tokio shell
//! runs on a current-thread runtime so all its work is on that thread too)
//! and live heap bytes per open, idle terminal (a counting global
//! allocator, `stats_alloc`; 32 terminals open at once, after a warm-up
//! batch per shell, each shell measured twice alternately, smaller figure
//! kept).
//!
//! Run: `cargo bench -p smolbox-benches --bench shells_blocking`

#![allow(clippy::unwrap_used)] // a bench that cannot set up cannot measure
#![allow(clippy::print_stdout)] // the CPU and memory table is the output

use std::alloc::System;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command as Process, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use smolbox_core::exec::Command;
use smolbox_core::terminal::TerminalSpec;
use smolbox_core::worker::{Budgets, Endpoint, EndpointConfig, MachineName, MachineSpec};
use smolbox_devworker::DevWorker;
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

/// Counts live heap bytes, so memory per terminal is measured in bytes the
/// allocator handed out, not in pages the process happens to keep.
#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

const MACHINE: &str = "bench";
const TERMINAL_BYTES: usize = 1 << 20;
const TERMINALS_OPEN: usize = 32;

/// The environment variable that makes this binary the devworker child.
const CHILD: &str = "SMOLBOX_SHELLS_BLOCKING_WORKER";

/// The devworker child: prints its base URL, serves until stdin closes.
fn worker_child() {
    let worker = DevWorker::start_blocking(
        DevWorker::builder()
            .version("1.22.0")
            .token(None)
            .quiet(true),
    )
    .unwrap();
    println!("{}", worker.base_url());
    std::io::stdout().flush().unwrap();
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
    drop(worker);
}

struct Fx {
    _worker: Child,
    blocking: smolbox_blocking::Client,
    tokio: smolbox_tokio::Client,
    rt: tokio::runtime::Runtime,
}

fn fx() -> &'static Fx {
    static FX: OnceLock<Fx> = OnceLock::new();
    FX.get_or_init(|| {
        let mut worker = Process::new(std::env::current_exe().unwrap())
            .env(CHILD, "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(worker.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let endpoint = Endpoint::new(EndpointConfig {
            id: "bench".into(),
            base_url: line.trim().to_owned(),
            allow_insecure_loopback: true,
            budgets: Budgets {
                operation: Duration::from_secs(60),
                receive_idle: Duration::from_secs(30),
                ..Budgets::default()
            },
            ..EndpointConfig::default()
        })
        .unwrap();
        let blocking = smolbox_blocking::Client::new(endpoint.clone()).unwrap();
        let profile = blocking.admit(&[]).unwrap();
        blocking
            .create(
                &profile,
                MachineName::new(MACHINE).unwrap(),
                &MachineSpec::default(),
            )
            .unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let tokio = smolbox_tokio::Client::new(endpoint).unwrap();
        Fx {
            _worker: worker,
            blocking,
            tokio,
            rt,
        }
    })
}

fn truth() -> Command {
    Command::new(["true"])
}

fn flood_spec() -> TerminalSpec {
    TerminalSpec::new("/bin/sh")
}

fn flood_input() -> String {
    format!("exec head -c {TERMINAL_BYTES} /dev/zero\n")
}

fn idle_spec() -> TerminalSpec {
    TerminalSpec::new("/bin/cat")
}

/// CPU time this thread has run, in nanoseconds.
fn thread_cpu_ns() -> u64 {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap();
    s.split_whitespace().next().unwrap().parse().unwrap()
}

/// Live heap bytes of this process (the clients; the devworker is a child).
fn heap_bytes(region: &Region<'_, System>) -> i64 {
    let c = region.change();
    c.bytes_allocated as i64 - c.bytes_deallocated as i64 + c.bytes_reallocated as i64
}

fn blocking_exec() {
    fx().blocking.exec(MACHINE, &truth()).unwrap();
}

fn tokio_exec() {
    let f = fx();
    f.rt.block_on(f.tokio.exec(MACHINE, &truth())).unwrap();
}

fn blocking_terminal() -> usize {
    let mut t = fx().blocking.terminal(MACHINE, &flood_spec()).unwrap();
    t.input(flood_input().as_bytes()).unwrap();
    let mut n = 0;
    loop {
        match t.next(Duration::from_secs(30)).unwrap() {
            smolbox_blocking::TerminalEvent::Output(b) => n += b.len(),
            smolbox_blocking::TerminalEvent::Closed(_) => return n,
            _ => {}
        }
    }
}

fn tokio_terminal() -> usize {
    let f = fx();
    f.rt.block_on(async {
        let mut t = f.tokio.terminal(MACHINE, &flood_spec()).await.unwrap();
        t.input(flood_input().as_bytes()).await.unwrap();
        let mut n = 0;
        loop {
            match t.next(Duration::from_secs(30)).await.unwrap() {
                smolbox_tokio::TerminalEvent::Output(b) => n += b.len(),
                smolbox_tokio::TerminalEvent::Closed(_) => return n,
                _ => {}
            }
        }
    })
}

/// Client-thread CPU per call of `f`, in microseconds (after a warm-up).
fn cpu_per_op(iterations: u32, mut f: impl FnMut()) -> f64 {
    for _ in 0..5 {
        f();
    }
    let start = thread_cpu_ns();
    for _ in 0..iterations {
        f();
    }
    (thread_cpu_ns() - start) as f64 / f64::from(iterations) / 1_000.0
}

/// Resident bytes per open idle terminal (opened at once, then closed).
fn memory_per_terminal_blocking() -> u64 {
    let f = fx();
    let region = Region::new(GLOBAL);
    let open: Vec<_> = (0..TERMINALS_OPEN)
        .map(|_| f.blocking.terminal(MACHINE, &idle_spec()).unwrap())
        .collect();
    let grown = heap_bytes(&region);
    drop(open);
    grown.max(0) as u64 / TERMINALS_OPEN as u64
}

fn memory_per_terminal_tokio() -> u64 {
    let f = fx();
    f.rt.block_on(async {
        let region = Region::new(GLOBAL);
        let mut open = Vec::new();
        for _ in 0..TERMINALS_OPEN {
            open.push(f.tokio.terminal(MACHINE, &idle_spec()).await.unwrap());
        }
        let grown = heap_bytes(&region);
        for t in open {
            let _ = t.close().await;
        }
        grown.max(0) as u64 / TERMINALS_OPEN as u64
    })
}

fn report() {
    let started = Instant::now();
    // The first batch of terminals also grows the devworker (its PTY
    // reader threads, buffers) and the allocator's arenas; that growth is
    // reused by later batches. So one warm-up batch per shell first, then
    // each shell twice, alternating, keeping each shell's smaller figure.
    memory_per_terminal_blocking();
    memory_per_terminal_tokio();
    let mut mem_blocking = u64::MAX;
    let mut mem_tokio = u64::MAX;
    for _ in 0..2 {
        mem_blocking = mem_blocking.min(memory_per_terminal_blocking());
        mem_tokio = mem_tokio.min(memory_per_terminal_tokio());
    }
    let exec_blocking = cpu_per_op(200, blocking_exec);
    let exec_tokio = cpu_per_op(200, tokio_exec);
    let term_blocking = cpu_per_op(5, || {
        blocking_terminal();
    });
    let term_tokio = cpu_per_op(5, || {
        tokio_terminal();
    });
    println!("shells_blocking: client-thread CPU and memory (measured in this run)");
    println!("| measure | blocking | tokio | blocking / tokio |");
    println!("| --- | ---: | ---: | ---: |");
    println!(
        "| exec round trip, CPU per call (µs) | {exec_blocking:.1} | {exec_tokio:.1} | {:.2} |",
        exec_blocking / exec_tokio
    );
    println!(
        "| terminal, 1 MiB of output, CPU per session (µs) | {term_blocking:.1} | {term_tokio:.1} | {:.2} |",
        term_blocking / term_tokio
    );
    println!(
        "| live heap per open idle terminal, client only (KiB) | {:.1} | {:.1} | {:.2} |",
        mem_blocking as f64 / 1024.0,
        mem_tokio as f64 / 1024.0,
        mem_blocking as f64 / mem_tokio.max(1) as f64
    );
    println!("(measured in {:.1} s)", started.elapsed().as_secs_f64());
}

fn main() {
    if std::env::var_os(CHILD).is_some() {
        worker_child();
        return;
    }
    report();
    divan::main();
}

#[divan::bench_group(sample_count = 50)]
mod exec_round_trip {
    #[divan::bench]
    fn blocking() {
        super::blocking_exec();
    }

    #[divan::bench]
    fn tokio() {
        super::tokio_exec();
    }
}

#[divan::bench_group(sample_count = 10)]
mod terminal_output {
    use divan::Bencher;
    use divan::counter::BytesCount;

    #[divan::bench]
    fn blocking(b: Bencher<'_, '_>) {
        b.counter(BytesCount::new(super::TERMINAL_BYTES))
            .bench(super::blocking_terminal);
    }

    #[divan::bench]
    fn tokio(b: Bencher<'_, '_>) {
        b.counter(BytesCount::new(super::TERMINAL_BYTES))
            .bench(super::tokio_terminal);
    }
}
