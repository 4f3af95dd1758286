//! A controller process for the SIGKILL restart tests (`tests/tests/
//! managed_kill.rs`): opens the store `STORE` — a SQLite path (keys next to
//! it) or `postgres:PARTITION:KEYPATH` (the server at `SMOLBOX_PG_URL`,
//! keys next to `KEYPATH`) — builds a blocking `Runtime` with a 1 s claim
//! TTL and the devworker at `URL` (bearer `TOKEN`) as worker `dev`, submits
//! `sh -c SCRIPT` under record `suite/ID` on machine `m1` and waits.
//! `{CTL_PID}` in the script becomes this process's id (so the command can
//! kill its controller while it runs). `SMOLBOX_KILL_AT=<point>` makes the
//! process SIGKILL itself at that durable boundary
//! (`smolbox_tests::kill::KillPoint`).
//!
//! With a sixth argument `retained`, the worker gets its admitted profile,
//! the process creates and starts retained machine `boxes/kill` and submits
//! the command into its slot under `boxes/ID` instead. With `terminal`, it
//! opens a managed terminal `boxes/ID` on that machine instead, attaches,
//! types `SCRIPT` and a newline into the shell, and reads its output until
//! the session ends (exit 1) or the process is killed.
//!
//! With `files` instead, the worker gets its admitted profile and an
//! in-memory artifact store holding input `in` (`in-bytes`), and the
//! command on `m1` declares input `/workspace/in.txt` and output
//! `/workspace/out.txt` (destination `out`, at most 64 bytes).
//!
//! With `retained-files`, the command goes into the retained machine's
//! slot (as `retained`) with that input and output declared (issue 12),
//! and the process stays up after the wait until the slot's finish (freed,
//! or kept with the machine `unknown`).
//!
//! Usage: `managed-ctl STORE URL TOKEN ID SCRIPT
//! [retained|terminal|files|retained-files]`.

use std::sync::Arc;
use std::time::Duration;

use smolbox_core::Secret;
use smolbox_core::exec::Command;
use smolbox_core::managed::controller::{RunTarget, Submit, spec_for};
use smolbox_core::managed::spec::ManagedTerminalSpec;
use smolbox_core::managed::{RecordKey, RetainedMachineSpec};
use smolbox_core::terminal::TerminalEvent;
use smolbox_core::worker::{Budgets, Endpoint, EndpointConfig};
use smolbox_store::keys::load_or_create_keys;
use smolbox_store::{PostgresStore, Sealer, SqliteStore, Store};
use smolbox_tests::kill::{KillPoint, KillStore};

fn main() -> Result<(), smolbox_core::Error> {
    let args: Vec<String> = std::env::args().collect();
    let (db, url, token, id, script, mode) = match args.as_slice() {
        [_, db, url, token, id, script] => (db, url, token, id, script, ""),
        [_, db, url, token, id, script, mode]
            if ["retained", "terminal", "files", "retained-files"].contains(&mode.as_str()) =>
        {
            (db, url, token, id, script, mode.as_str())
        }
        _ => {
            eprintln!(
                "usage: managed-ctl STORE URL TOKEN ID SCRIPT \
                 [retained|terminal|files|retained-files]"
            );
            std::process::exit(2);
        }
    };
    let inner: Arc<dyn Store> = match db.strip_prefix("postgres:") {
        Some(rest) => {
            let Some((partition, keys)) = rest.split_once(':') else {
                eprintln!("usage: STORE is a path or postgres:PARTITION:KEYPATH");
                std::process::exit(2);
            };
            let url = std::env::var("SMOLBOX_PG_URL").unwrap_or_default();
            let (_, seal) = load_or_create_keys(std::path::Path::new(keys))?;
            Arc::new(PostgresStore::connect(
                &url,
                Sealer::new(&seal, partition)?,
            )?)
        }
        None => {
            let db = std::path::Path::new(db);
            let (_, seal) = load_or_create_keys(db)?;
            Arc::new(SqliteStore::open(db, Sealer::new(&seal, "managed")?)?)
        }
    };
    let key_path = db
        .strip_prefix("postgres:")
        .and_then(|r| r.split_once(':'))
        .map_or(db.as_str(), |(_, k)| k);
    let (key, _) = load_or_create_keys(std::path::Path::new(key_path))?;
    let store: Arc<dyn Store> = Arc::new(KillStore::new(inner, KillPoint::from_env()));
    let script = script.replace("{CTL_PID}", &std::process::id().to_string());
    let endpoint = Endpoint::new(EndpointConfig {
        id: "dev".into(),
        base_url: url.clone(),
        token: Some(Secret::new(token.as_str())),
        allow_insecure_loopback: true,
        budgets: Budgets {
            operation: Duration::from_secs(60),
            receive_idle: Duration::from_secs(60),
            ..Budgets::default()
        },
        ..EndpointConfig::default()
    })?;
    let client = smolbox_blocking::Client::new(endpoint)?;
    let command = Command::new(["sh", "-c", script.as_str()]).timeout_secs(60);
    // The declared files of `files` and `retained-files` (input `in` of
    // scope `scope`, in the artifact store).
    let files = |scope: &str| {
        use smolbox_core::managed::spec::{InputFile, OutputFile};
        use smolbox_store::artifacts::MemoryArtifacts;
        let artifacts = Arc::new(MemoryArtifacts::new());
        let sha256 = artifacts.insert(scope, "in", &b"in-bytes"[..]);
        let files = smolbox_core::managed::CommandFiles {
            inputs: vec![InputFile {
                path: "/workspace/in.txt".into(),
                source: "in".into(),
                sha256,
                size: 8,
            }],
            outputs: vec![OutputFile {
                path: "/workspace/out.txt".into(),
                destination: "out".into(),
                max_size: 64,
            }],
        };
        (artifacts, files)
    };
    if mode == "files" {
        use smolbox_store::artifacts::Artifacts;
        let (artifacts, files) = files("suite");
        let profile = client.admit(&[])?;
        let runtime = smolbox_blocking::Runtime::builder(store, key)
            .worker_with_profile("dev", client, profile)
            .machine_source("dev", smolbox_tests::cases::image_spec().source)
            .artifacts(artifacts as Arc<dyn Artifacts>)
            .lease_ttl_ms(1_000)
            .poll_interval_ms(100)
            .build()?;
        let mut spec = spec_for(
            &command,
            &RunTarget::unverified().fitting(&command),
            "dev",
            "m1",
        )?;
        spec.inputs = files.inputs;
        spec.outputs = files.outputs;
        let key = RecordKey::new("suite", id)?;
        runtime.run(Submit { key, spec })?;
        return Ok(());
    }
    if mode == "retained" || mode == "terminal" || mode == "retained-files" {
        let profile = client.admit(&[])?;
        let (artifacts, files) = files("boxes");
        let mut builder = smolbox_blocking::Runtime::builder(store, key)
            .worker_with_profile("dev", client, profile)
            .machine_source("dev", smolbox_tests::cases::image_spec().source)
            .lease_ttl_ms(1_000)
            .poll_interval_ms(100);
        if mode == "retained-files" {
            builder = builder.artifacts(artifacts as Arc<dyn smolbox_store::artifacts::Artifacts>);
        }
        let runtime = builder.build()?;
        let target = RunTarget::unverified().fitting(&command);
        let spec = RetainedMachineSpec {
            artifact: target.artifact,
            profile: target.profile,
            ports: Vec::new(),
            workload: None,
            checkpointable: false,
            network: None,
            guest_paths: None,
        };
        let machine = RecordKey::new("boxes", "kill")?;
        let m = runtime.machines();
        m.create(&machine, &spec)?;
        let rec = m.wait(&machine, 30_000)?;
        m.start(&machine, rec.version)?;
        m.wait(&machine, 30_000)?;
        let key = RecordKey::new("boxes", id)?;
        if mode == "terminal" {
            let t = runtime.terminals();
            t.open(key.clone(), machine, ManagedTerminalSpec::default())?;
            let mut h = t.attach(&key, Duration::from_secs(10))?;
            h.input(format!("{script}\n").as_bytes())?;
            loop {
                if let Ok(TerminalEvent::Closed(_)) = h.next(Duration::from_secs(60)) {
                    // The session was to outlive this process.
                    std::process::exit(1);
                }
            }
        }
        if mode == "retained-files" {
            m.submit_with_files(&machine, &key, &command, &files)?;
        } else {
            m.submit(&machine, &key, &command)?;
        }
        runtime.wait(&key, 60_000)?;
        if mode == "retained-files" {
            // Stay up until the slot's finish (the kill point after
            // `completed`): the slot freed, or kept with the machine
            // `unknown` (bounded, observed).
            for _ in 0..3_000 {
                let r = m.inspect(&machine)?;
                if r.active_execution.as_ref() != Some(&key)
                    || r.state == smolbox_core::managed::state::MachineRecordState::Unknown
                {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        return Ok(());
    }
    let runtime = smolbox_blocking::Runtime::builder(store, key)
        .worker("dev", client)
        .lease_ttl_ms(1_000)
        .poll_interval_ms(100)
        .build()?;
    let spec = spec_for(
        &command,
        &RunTarget::unverified().fitting(&command),
        "dev",
        "m1",
    )?;
    let key = RecordKey::new("suite", id)?;
    runtime.run(Submit { key, spec })?;
    Ok(())
}
