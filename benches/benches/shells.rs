//! The shells against the devworker on loopback, each beside a named peer:
//!
//! * terminal output throughput through `Terminal::next` vs a
//!   `tokio-tungstenite` client reading the same devworker stream;
//! * buffered exec round trip vs a `reqwest` client of the same endpoint
//!   (wall time here; client CPU per call is printed before the run,
//!   measured from the calling thread's own CPU time);
//! * peak memory of a flooding terminal with a stalled consumer (printed
//!   before the run, measured in a child process that holds only the client).
//!
//! `cargo bench -p smolbox-benches --bench shells`. The blocking shell adds
//! its own functions to each group (same names, `blocking`).

#![allow(clippy::unwrap_used)] // benchmark set-up: a failure aborts the run

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use base64::Engine;
use divan::Bencher;
use divan::counter::BytesCount;
use futures_util::{SinkExt, StreamExt};
use smolbox_core::Secret;
use smolbox_core::exec::{Command, ExecCall, OutputAllowance};
use smolbox_core::terminal::TerminalSpec;
use smolbox_core::worker::{Budgets, Endpoint, EndpointConfig, MachineName, MachineSpec};
use smolbox_devworker::{BlockingDevWorker, DevWorker};
use smolbox_tokio::{Client, TerminalEvent};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

/// Terminal output bytes per iteration.
const FLOOD: usize = 4 << 20;
/// Exec calls for the CPU figure.
const CPU_CALLS: u32 = 300;

fn main() {
    if std::env::var_os("SMOLBOX_SHELLS_MEMORY_CHILD").is_some() {
        memory_child();
        return;
    }
    if let Ok(which) = std::env::var("SMOLBOX_SHELLS_PROFILE") {
        profile_exec(&which);
        return;
    }
    report_cpu();
    report_memory();
    divan::main();
}

struct World {
    worker: BlockingDevWorker,
}

fn world() -> &'static World {
    static W: OnceLock<World> = OnceLock::new();
    W.get_or_init(|| {
        let worker =
            DevWorker::start_blocking(DevWorker::builder().version("1.22.0").quiet(true)).unwrap();
        let rt = runtime();
        let client = Client::new(endpoint(&worker.base_url())).unwrap();
        rt.block_on(async {
            let profile = client.admit(&[]).await.unwrap();
            client
                .create(
                    &profile,
                    MachineName::new("m1").unwrap(),
                    &MachineSpec::default(),
                )
                .await
                .unwrap();
        });
        World { worker }
    })
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn endpoint(base_url: &str) -> Endpoint {
    Endpoint::new(EndpointConfig {
        id: "bench".into(),
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

fn flood_spec(buffer: usize) -> TerminalSpec {
    let mut spec = TerminalSpec::new("/bin/sh");
    spec.session_budget = Duration::from_secs(60);
    spec.idle_budget = Duration::from_secs(30);
    spec.max_buffer_bytes = buffer;
    spec
}

fn flood_input() -> String {
    format!("head -c {FLOOD} /dev/zero; exit 0\n")
}

// ---- terminal output throughput -------------------------------------------

#[divan::bench_group(name = "terminal_throughput", sample_count = 10, sample_size = 1)]
mod terminal_throughput {
    use super::*;

    /// `Terminal::next` until the exit.
    #[divan::bench]
    fn tokio(b: Bencher<'_, '_>) {
        let w = world();
        let rt = runtime();
        let client = Client::new(endpoint(&w.worker.base_url())).unwrap();
        b.counter(BytesCount::new(FLOOD)).bench_local(|| {
            rt.block_on(async {
                let mut t = client.terminal("m1", &flood_spec(1 << 20)).await.unwrap();
                t.input(flood_input().as_bytes()).await.unwrap();
                let mut n = 0usize;
                while let TerminalEvent::Output(b) = t.next(Duration::from_secs(30)).await.unwrap()
                {
                    n += b.len();
                }
                assert!(n >= FLOOD);
            });
        });
    }

    /// `tokio-tungstenite` reading the same stream.
    #[divan::bench]
    fn tungstenite(b: Bencher<'_, '_>) {
        let w = world();
        let rt = runtime();
        let url = format!(
            "ws://{}/api/v1/machines/m1/exec/interactive?cmd=%2Fbin%2Fsh&cols=80&rows=24",
            w.worker.addr()
        );
        b.counter(BytesCount::new(FLOOD)).bench_local(|| {
            rt.block_on(async {
                let mut req = url.as_str().into_client_request().unwrap();
                req.headers_mut()
                    .insert("authorization", "Bearer bench-token".parse().unwrap());
                let tcp = tokio::net::TcpStream::connect(w.worker.addr())
                    .await
                    .unwrap();
                tcp.set_nodelay(true).unwrap();
                let (mut ws, _) = tokio_tungstenite::client_async(req, tcp).await.unwrap();
                ws.send(Message::Binary(flood_input().into_bytes().into()))
                    .await
                    .unwrap();
                let mut n = 0usize;
                while let Some(m) = ws.next().await {
                    match m.unwrap() {
                        Message::Binary(b) => n += b.len(),
                        Message::Text(_) | Message::Close(_) => break,
                        _ => {}
                    }
                }
                assert!(n >= FLOOD);
            });
        });
    }

    /// The physical limit: copying the same number of bytes.
    #[divan::bench]
    fn memcpy(b: Bencher<'_, '_>) {
        let src = vec![0u8; FLOOD];
        let mut dst = vec![1u8; FLOOD];
        b.counter(BytesCount::new(FLOOD)).bench_local(|| {
            dst.copy_from_slice(divan::black_box(&src));
            divan::black_box(&dst);
        });
    }
}

// ---- buffered exec round trip ---------------------------------------------

fn exec_command() -> Command {
    Command::new(["/bin/true"])
}

/// The reqwest peer: the same request body, the reply decoded to the same
/// values (JSON, base64 fields).
async fn reqwest_exec(client: &reqwest::Client, url: &str, body: &[u8]) -> i32 {
    let reply = client
        .post(url)
        .header("content-type", "application/json")
        .header("authorization", "Bearer bench-token")
        .body(body.to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status().as_u16(), 200);
    let bytes = reply.bytes().await.unwrap();
    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    let b64 = base64::engine::general_purpose::STANDARD;
    let _ = b64.decode(v["stdoutB64"].as_str().unwrap()).unwrap();
    let _ = b64.decode(v["stderrB64"].as_str().unwrap()).unwrap();
    i32::try_from(v["exitCode"].as_i64().unwrap()).unwrap()
}

#[divan::bench_group(name = "exec_round_trip", sample_count = 30, sample_size = 4)]
mod exec_round_trip {
    use super::*;

    #[divan::bench]
    fn tokio(b: Bencher<'_, '_>) {
        let w = world();
        let rt = runtime();
        let client = Client::new(endpoint(&w.worker.base_url())).unwrap();
        let cmd = exec_command();
        b.bench_local(|| {
            rt.block_on(client.exec_with_allowance("m1", &cmd, OutputAllowance::DEFAULT))
                .unwrap()
        });
    }

    #[divan::bench]
    fn blocking(b: Bencher<'_, '_>) {
        let w = world();
        let client = smolbox_blocking::Client::new(endpoint(&w.worker.base_url())).unwrap();
        let cmd = exec_command();
        b.bench_local(|| client.exec("m1", &cmd).unwrap());
    }

    #[divan::bench]
    fn reqwest(b: Bencher<'_, '_>) {
        let w = world();
        let rt = runtime();
        let client = reqwest::Client::new();
        let url = format!("{}/api/v1/machines/m1/exec", w.worker.base_url());
        let body = exec_command().wire_body().unwrap();
        b.bench_local(|| rt.block_on(reqwest_exec(&client, &url, &body)));
    }
}

// ---- client CPU per call ---------------------------------------------------

/// CPU time this thread has used (Linux `schedstat`, nanoseconds).
fn thread_cpu() -> Duration {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap();
    Duration::from_nanos(s.split_whitespace().next().unwrap().parse().unwrap())
}

/// The reqwest peer doing what the shells do per buffered exec: the
/// `GET /health` version preflight, then the exec.
async fn reqwest_exec_with_preflight(
    client: &reqwest::Client,
    health: &str,
    url: &str,
    body: &[u8],
) -> i32 {
    let reply = client
        .get(health)
        .header("authorization", "Bearer bench-token")
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status().as_u16(), 200);
    let bytes = reply.bytes().await.unwrap();
    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(v["version"].as_str(), Some("1.22.0"));
    reqwest_exec(client, url, body).await
}

fn report_cpu() {
    let w = world();
    let rt = runtime();
    let client = Client::new(endpoint(&w.worker.base_url())).unwrap();
    let blocking = smolbox_blocking::Client::new(endpoint(&w.worker.base_url())).unwrap();
    let cmd = exec_command();
    let peer = reqwest::Client::new();
    let url = format!("{}/api/v1/machines/m1/exec", w.worker.base_url());
    let health = format!("{}/health", w.worker.base_url());
    let body = cmd.wire_body().unwrap();
    // The one-request path: a call built with a profile admitted once.
    let profile = rt.block_on(client.admit(&[])).unwrap();
    let call = ExecCall::new(&profile, "m1", cmd.clone(), OutputAllowance::DEFAULT).unwrap();
    // Warm all (connections, allocations).
    for _ in 0..20 {
        rt.block_on(client.call(&call)).unwrap();
        blocking.call(&call).unwrap();
        rt.block_on(client.exec_with_allowance("m1", &cmd, OutputAllowance::DEFAULT))
            .unwrap();
        blocking.exec("m1", &cmd).unwrap();
        rt.block_on(reqwest_exec(&peer, &url, &body));
        rt.block_on(reqwest_exec_with_preflight(&peer, &health, &url, &body));
    }
    let mut ours = Duration::ZERO;
    let mut ours_blocking = Duration::ZERO;
    let mut theirs = Duration::ZERO;
    let mut theirs_preflight = Duration::ZERO;
    let mut ours_call = Duration::ZERO;
    let mut ours_blocking_call = Duration::ZERO;
    // Interleave so all see the same machine state.
    for _ in 0..CPU_CALLS {
        let t = thread_cpu();
        rt.block_on(client.call(&call)).unwrap();
        ours_call += thread_cpu() - t;
        let t = thread_cpu();
        blocking.call(&call).unwrap();
        ours_blocking_call += thread_cpu() - t;
        let t = thread_cpu();
        rt.block_on(client.exec_with_allowance("m1", &cmd, OutputAllowance::DEFAULT))
            .unwrap();
        ours += thread_cpu() - t;
        let t = thread_cpu();
        blocking.exec("m1", &cmd).unwrap();
        ours_blocking += thread_cpu() - t;
        let t = thread_cpu();
        rt.block_on(reqwest_exec(&peer, &url, &body));
        theirs += thread_cpu() - t;
        let t = thread_cpu();
        rt.block_on(reqwest_exec_with_preflight(&peer, &health, &url, &body));
        theirs_preflight += thread_cpu() - t;
    }
    let us = |d: Duration| (d / CPU_CALLS).as_secs_f64() * 1e6;
    let (ours, ours_blocking, theirs, theirs_preflight) = (
        us(ours),
        us(ours_blocking),
        us(theirs),
        us(theirs_preflight),
    );
    let (ours_call, ours_blocking_call) = (us(ours_call), us(ours_blocking_call));
    eprintln!(
        "exec client CPU per call (µs): Client::exec (health preflight + exec): smolbox-tokio {ours:.1}, \
         smolbox-blocking {ours_blocking:.1}; reqwest health + exec {theirs_preflight:.1}"
    );
    eprintln!(
        "  exec only (Client::call of an ExecCall, profile admitted once): smolbox-tokio {ours_call:.1}, \
         smolbox-blocking {ours_blocking_call:.1}; reqwest exec only {theirs:.1}"
    );
    eprintln!(
        "  exec only vs reqwest exec only: tokio {:.2}, blocking {:.2}",
        ours_call / theirs,
        ours_blocking_call / theirs
    );
    eprintln!(
        "  Client::exec vs reqwest exec only: tokio {:.2}, blocking {:.2}; vs reqwest health + exec: tokio {:.2}, blocking {:.2}",
        ours / theirs,
        ours_blocking / theirs,
        ours / theirs_preflight,
        ours_blocking / theirs_preflight
    );
}

/// For `perf record` or callgrind: 3,000 buffered execs on one client
/// (`tokio`, `blocking` or `reqwest`, the last with the health preflight;
/// `tokio-call`, `blocking-call`, `reqwest-exec`: one request each, the
/// profile admitted once), nothing else. `SMOLBOX_SHELLS_PROFILE=tokio perf record -g target/release/deps/shells-…`
fn profile_exec(which: &str) {
    let w = world();
    let rt = runtime();
    let cmd = exec_command();
    // `SMOLBOX_SHELLS_PROFILE_CALLS` (default 3,000): two runs with
    // different counts under callgrind (`--separate-threads=yes`, the
    // calling thread's file) give instructions per call by difference.
    let calls: u32 = std::env::var("SMOLBOX_SHELLS_PROFILE_CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3_000);
    let started = Instant::now();
    match which {
        "tokio-call" => {
            let client = Client::new(endpoint(&w.worker.base_url())).unwrap();
            let profile = rt.block_on(client.admit(&[])).unwrap();
            let call =
                ExecCall::new(&profile, "m1", cmd.clone(), OutputAllowance::DEFAULT).unwrap();
            for _ in 0..calls {
                rt.block_on(client.call(&call)).unwrap();
            }
        }
        "blocking-call" => {
            let client = smolbox_blocking::Client::new(endpoint(&w.worker.base_url())).unwrap();
            let profile = client.admit(&[]).unwrap();
            let call =
                ExecCall::new(&profile, "m1", cmd.clone(), OutputAllowance::DEFAULT).unwrap();
            for _ in 0..calls {
                client.call(&call).unwrap();
            }
        }
        "reqwest-exec" => {
            let peer = reqwest::Client::new();
            let url = format!("{}/api/v1/machines/m1/exec", w.worker.base_url());
            let body = cmd.wire_body().unwrap();
            for _ in 0..calls {
                rt.block_on(reqwest_exec(&peer, &url, &body));
            }
        }
        "tokio" => {
            let client = Client::new(endpoint(&w.worker.base_url())).unwrap();
            for _ in 0..calls {
                rt.block_on(client.exec_with_allowance("m1", &cmd, OutputAllowance::DEFAULT))
                    .unwrap();
            }
        }
        "blocking" => {
            let client = smolbox_blocking::Client::new(endpoint(&w.worker.base_url())).unwrap();
            for _ in 0..calls {
                client.exec("m1", &cmd).unwrap();
            }
        }
        _ => {
            let peer = reqwest::Client::new();
            let url = format!("{}/api/v1/machines/m1/exec", w.worker.base_url());
            let health = format!("{}/health", w.worker.base_url());
            let body = cmd.wire_body().unwrap();
            for _ in 0..calls {
                rt.block_on(reqwest_exec_with_preflight(&peer, &health, &url, &body));
            }
        }
    }
    eprintln!("{which}: {calls} execs in {:?}", started.elapsed());
}

// ---- peak memory of a stalled consumer ------------------------------------

/// Peak resident memory of this process (`VmHWM`), bytes.
fn vm_hwm() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap()
        * 1024
}

fn report_memory() {
    let w = world();
    for buffer in [64 << 10, 256 << 10, 1 << 20] {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .env("SMOLBOX_SHELLS_MEMORY_CHILD", "1")
            .env("SMOLBOX_SHELLS_URL", w.worker.base_url())
            .env("SMOLBOX_SHELLS_BUFFER", buffer.to_string())
            .output()
            .unwrap();
        eprint!("{}", String::from_utf8_lossy(&out.stderr));
    }
}

/// Child: open a flooding terminal, never read until the session ended on
/// its buffer limit, and report the growth of peak memory.
fn memory_child() {
    let url = std::env::var("SMOLBOX_SHELLS_URL").unwrap();
    let buffer: usize = std::env::var("SMOLBOX_SHELLS_BUFFER")
        .unwrap()
        .parse()
        .unwrap();
    let rt = runtime();
    let client = Client::new(endpoint(&url)).unwrap();
    // Warm up the runtime, TLS-free connection path and allocator.
    rt.block_on(client.health()).unwrap();
    let before = vm_hwm();
    let outcome = rt.block_on(async {
        let mut t = client.terminal("m1", &flood_spec(buffer)).await.unwrap();
        t.input(format!("head -c {} /dev/zero; sleep 5\n", 64 << 20).as_bytes())
            .await
            .unwrap();
        // Stalled consumer: let the driver read while nobody pulls.
        let start = Instant::now();
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let peak = vm_hwm();
        let mut last = None;
        while start.elapsed() < Duration::from_secs(30) {
            match t.next(Duration::from_secs(5)).await {
                Ok(TerminalEvent::Closed(o)) => {
                    last = Some(o);
                    break;
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
        (peak, last)
    });
    let (peak, last) = outcome;
    let category = last
        .and_then(|o| o.err())
        .map_or("none", |e| e.category().as_str());
    eprintln!(
        "stalled terminal: buffer {} KiB, peak RSS growth {} KiB (outcome {category})",
        buffer / 1024,
        peak.saturating_sub(before) / 1024
    );
}
