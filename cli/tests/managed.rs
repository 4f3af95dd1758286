//! The managed commands driven as a user would: `run --id` (idempotent),
//! `records ls|show` (never the command), `run --detach` + `wait`,
//! `cancel`, `recover`.

// Tests may unwrap: a failure is a test failure.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::process::Output;

use common::{
    Home, SHELLS, assert_not_run_again, code, devworker, json, lines, run, smolbox, stderr, stdout,
};

#[test]
fn run_with_an_id_runs_once_and_a_changed_command_is_a_conflict() {
    let w = devworker(None);
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("x.db");
    let db = db.to_str().unwrap();
    for shell in SHELLS {
        let counter = dir.path().join(format!("count-{shell}"));
        let script = format!("echo ran >> {}; echo out; exit 7", counter.display());
        let id = format!("job-{shell}");
        let args = ["run", "--store", db, "--id", &id, "--", "sh", "-c", &script];
        let first = run(&w, shell, &args);
        assert_eq!(code(&first), 7, "{shell}: {}", stderr(&first));
        assert_eq!(stdout(&first), "out\n");
        assert_eq!(lines(&counter), 1);
        // Again: the recorded outcome, not a second run.
        assert_not_run_again(&w, shell, &args, 7, &counter);
        // --json says so too.
        let j = run(&w, shell, &[&["--json"], &args[..]].concat());
        assert_eq!(code(&j), 7);
        let v = json(&j);
        assert_eq!(v["existing"], true);
        assert_eq!(v["exit_code"], 7);
        assert_eq!(v["state"], "completed");
        assert_eq!(lines(&counter), 1);
        // A changed command under the same id is refused; nothing runs.
        let changed = format!("{script}; echo more");
        let c = run(
            &w,
            shell,
            &[
                "run", "--store", db, "--id", &id, "--", "sh", "-c", &changed,
            ],
        );
        assert_eq!(code(&c), 8, "{shell}: {}", stderr(&c));
        assert!(stderr(&c).contains("identity_conflict"), "{}", stderr(&c));
        assert_eq!(lines(&counter), 1);
    }
}

#[test]
fn run_with_an_id_is_idempotent_on_the_in_process_devworker_too() {
    // Each in-process devworker is a worker of its own; the recorded
    // execution is still found under its id.
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("x.db");
    let counter = dir.path().join("count");
    let script = format!("echo ran >> {}", counter.display());
    let args = [
        "run",
        "--store",
        db.to_str().unwrap(),
        "--id",
        "local-job",
        "--",
        "sh",
        "-c",
        &script,
    ];
    for _ in 0..2 {
        let o = smolbox().args(args).output().unwrap();
        assert_eq!(code(&o), 0, "{}", stderr(&o));
    }
    assert_eq!(lines(&counter), 1);
}

#[test]
fn records_show_state_and_exit_never_argv_env_or_stdin() {
    let w = devworker(None);
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("x.db");
    let db = db.to_str().unwrap();
    let stdin = dir.path().join("stdin.txt");
    let argv_s = "SENTINEL-ARGV-91c2";
    let env_s = "SENTINEL-ENV-4d7e";
    let stdin_s = "SENTINEL-STDIN-0b5f";
    std::fs::write(&stdin, stdin_s).unwrap();
    let o = run(
        &w,
        "tokio",
        &[
            "run",
            "--store",
            db,
            "--id",
            "secret-run",
            "--env",
            &format!("SECRET={env_s}"),
            "--stdin",
            stdin.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            &format!("cat >/dev/null; echo {argv_s} >/dev/null; exit 5"),
        ],
    );
    assert_eq!(code(&o), 5, "{}", stderr(&o));
    let other = run(&w, "tokio", &["run", "--store", db, "--", "true"]);
    assert_eq!(code(&other), 0, "{}", stderr(&other));

    let outputs: Vec<Output> = [
        vec!["records", "ls"],
        vec!["--json", "records", "ls"],
        vec!["records", "show", "secret-run"],
        vec!["--json", "records", "show", "secret-run"],
    ]
    .into_iter()
    .map(|a| smolbox().args(["--store", db]).args(a).output().unwrap())
    .collect();
    for o in &outputs {
        assert_eq!(code(o), 0, "{}", stderr(o));
        let all = format!("{}{}", stdout(o), stderr(o));
        for s in [argv_s, env_s, stdin_s] {
            assert!(!all.contains(s), "{s} printed: {all}");
        }
        // No worker is needed to read records: none was started.
        assert!(!stderr(o).contains("devworker"), "{}", stderr(o));
    }
    let list = json(&outputs[1]);
    let list = list.as_array().unwrap();
    assert_eq!(list.len(), 2);
    let shown = json(&outputs[3]);
    assert_eq!(shown["id"], "secret-run");
    assert_eq!(shown["state"], "completed");
    assert_eq!(shown["evidence"], "exited");
    assert_eq!(shown["exit_code"], 5);
    assert!(shown["worker"].as_str().unwrap().starts_with("w-"));
    assert!(shown["machine"].as_str().unwrap().starts_with("sb-"));
    assert!(shown["accepted_at_ms"].as_u64().unwrap() > 0);
    assert!(stdout(&outputs[0]).contains("secret-run"));
    assert!(stdout(&outputs[2]).contains("state: completed"));

    // Filters: by state and by machine.
    let machine = shown["machine"].as_str().unwrap();
    let by_machine = smolbox()
        .args([
            "--store",
            db,
            "--json",
            "records",
            "ls",
            "--machine",
            machine,
        ])
        .output()
        .unwrap();
    let v = json(&by_machine);
    assert_eq!(v.as_array().unwrap().len(), 1);
    assert_eq!(v[0]["id"], "secret-run");
    let by_state = smolbox()
        .args([
            "--store", db, "--json", "records", "ls", "--state", "unknown",
        ])
        .output()
        .unwrap();
    assert_eq!(json(&by_state).as_array().unwrap().len(), 0);
    let bad_state = smolbox()
        .args(["--store", db, "records", "ls", "--state", "bogus"])
        .output()
        .unwrap();
    assert_eq!(code(&bad_state), 2);
    // An absent id is "not found".
    let absent = smolbox()
        .args(["--store", db, "records", "show", "nope"])
        .output()
        .unwrap();
    assert_eq!(code(&absent), 5, "{}", stderr(&absent));
}

#[test]
fn records_ls_follows_the_pages() {
    // More records than one page of the store (20).
    let w = devworker(None);
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("x.db");
    let db = db.to_str().unwrap();
    for i in 0..21 {
        let id = format!("p{i:02}");
        let o = run(
            &w,
            "blocking",
            &["run", "--detach", "--store", db, "--id", &id, "--", "true"],
        );
        assert_eq!(code(&o), 0, "{}", stderr(&o));
    }
    let o = smolbox()
        .args([
            "--store", db, "--json", "records", "ls", "--state", "accepted",
        ])
        .output()
        .unwrap();
    assert_eq!(json(&o).as_array().unwrap().len(), 21);
}

#[test]
fn detach_then_wait_and_cancel_on_the_dev_up_worker() {
    let home = Home::new();
    // Without a persistent worker, --detach is refused before anything.
    let refused = home.run(&["run", "--detach", "--", "true"]);
    assert_eq!(code(&refused), 2, "{}", stderr(&refused));
    assert!(
        stderr(&refused).contains("persistent worker"),
        "{}",
        stderr(&refused)
    );
    assert!(stdout(&refused).is_empty());

    let up = home.run(&["dev", "up"]);
    assert_eq!(code(&up), 0, "{}", stderr(&up));
    let counter = home.dir.path().join("count");
    let script = format!("echo ran >> {}; echo hello; exit 3", counter.display());
    for shell in SHELLS {
        let d = home.run(&[
            "--shell", shell, "run", "--detach", "--", "sh", "-c", &script,
        ]);
        assert_eq!(code(&d), 0, "{shell}: {}", stderr(&d));
        let id = stdout(&d).trim().to_owned();
        assert!(id.starts_with("run-"), "{id}");
        // Durable and not yet run: nobody drives it after `run` returned.
        let shown = home.run(&["--json", "records", "show", &id]);
        assert_eq!(json(&shown)["state"], "accepted");
        assert_eq!(lines(&counter), 0);
        // `wait` sends it (from the stored spec) and returns its code.
        let w = home.run(&["--shell", shell, "wait", &id, "--timeout", "900000"]);
        assert_eq!(code(&w), 3, "{shell}: {}", stderr(&w));
        assert_eq!(stdout(&w), "hello\n");
        assert_eq!(lines(&counter), 1);
        // The disposable machine it ran on is deleted once the record
        // settles (the worker's own view: no machine left).
        let raw = home.run(&["--json", "machine", "--raw", "ls"]);
        assert_eq!(code(&raw), 0, "{}", stderr(&raw));
        assert_eq!(
            json(&raw),
            serde_json::json!([]),
            "{shell}: a machine was left"
        );
        let shown = json(&home.run(&["--json", "records", "show", &id]));
        assert_eq!(shown["state"], "completed", "{shown}");
        assert_eq!(shown["cleanup"], "complete", "{shown}");
        // Where it ran: the disposable machine assigned to it.
        assert!(
            shown["machine"]
                .as_str()
                .is_some_and(|m| m.starts_with("sbx-")),
            "{shown}"
        );
        assert!(shown["worker"].as_str().is_some(), "{shown}");
        // Again: the record's code, the command not run again.
        let again = home.run(&["--shell", shell, "--json", "wait", &id]);
        assert_eq!(code(&again), 3);
        assert_eq!(json(&again)["state"], "completed");
        std::fs::remove_file(&counter).unwrap();

        // A long detached run cancelled before anything dispatched it.
        let long = home.run(&["--shell", shell, "run", "--detach", "--", "sleep", "30"]);
        assert_eq!(code(&long), 0, "{}", stderr(&long));
        let id = stdout(&long).trim().to_owned();
        let c = home.run(&["--shell", shell, "--json", "cancel", &id]);
        assert_eq!(code(&c), 0, "{}", stderr(&c));
        let v = json(&c);
        assert!(v["cancel_requested_at_ms"].as_u64().is_some(), "{v}");
        assert_eq!(v["state"], "cancelled", "{v}");
        assert_eq!(v["evidence"], "not_dispatched", "{v}");
        let w = home.run(&["--shell", shell, "wait", &id]);
        assert_eq!(code(&w), 8, "{}", stderr(&w));
        assert!(stderr(&w).contains("cancelled"), "{}", stderr(&w));
        let raw = home.run(&["--json", "machine", "--raw", "ls"]);
        assert_eq!(
            json(&raw),
            serde_json::json!([]),
            "{shell}: a machine was left"
        );
    }
    // `records ls --json` lists them all, with no devworker note.
    let ls = home.run(&["--json", "records", "ls"]);
    assert_eq!(json(&ls).as_array().unwrap().len(), 4);
    let down = home.run(&["dev", "down"]);
    assert_eq!(code(&down), 0, "{}", stderr(&down));
}

#[test]
fn recover_dispatches_what_was_left_due_and_says_so() {
    let w = devworker(None);
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("x.db");
    let db = db.to_str().unwrap();
    for shell in SHELLS {
        let counter = dir.path().join(format!("count-{shell}"));
        let script = format!("echo ran >> {}", counter.display());
        let id = format!("rec-{shell}");
        let d = run(
            &w,
            shell,
            &[
                "run", "--detach", "--store", db, "--id", &id, "--", "sh", "-c", &script,
            ],
        );
        assert_eq!(code(&d), 0, "{}", stderr(&d));
        assert_eq!(stdout(&d).trim(), id);
        let r = run(&w, shell, &["--json", "recover", "--store", db]);
        assert_eq!(code(&r), 0, "{shell}: {}", stderr(&r));
        let v = json(&r);
        let recs = v["records"].as_array().unwrap();
        assert_eq!(recs.len(), 1, "{v}");
        assert_eq!(recs[0]["id"], id.as_str());
        assert_eq!(recs[0]["from"], "accepted");
        assert_eq!(recs[0]["to"], "completed");
        assert_eq!(recs[0]["moved"], true);
        assert_eq!(lines(&counter), 1);
        // Nothing left: a second scan moves nothing, and says so.
        let r = run(&w, shell, &["recover", "--store", db]);
        assert_eq!(code(&r), 0);
        assert_eq!(stdout(&r), "");
        assert!(stderr(&r).contains("nothing moved"), "{}", stderr(&r));
        assert_eq!(lines(&counter), 1);
    }
}

#[test]
fn recover_after_the_cli_is_killed_mid_run_says_unknown_never_reruns() {
    let w = devworker(None);
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("x.db");
    let db = db.to_str().unwrap();
    let counter = dir.path().join("count");
    let script = format!("echo ran >> {}; sleep 60", counter.display());
    // The killed process's claims last its TTL: 1 s here, not the CLI's 30 s.
    let mut child = smolbox()
        .env("SMOLBOX_LEASE_TTL_MS", "1000")
        .args(["--worker", &w.base_url()])
        .args([
            "run", "--store", db, "--id", "killed", "--keep", "--", "sh", "-c", &script,
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Observed, not timed: the guest has started once its line is there.
    while lines(&counter) == 0 {
        assert!(child.try_wait().unwrap().is_none(), "run ended early");
        std::thread::yield_now();
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let before = json(&run(
        &w,
        "tokio",
        &["--json", "records", "show", "killed", "--store", db],
    ));
    let from = before["state"].as_str().unwrap().to_owned();
    assert!(
        ["dispatching", "running"].contains(&from.as_str()),
        "{before}"
    );
    // The dead controller's claim runs out (1 s), then the scan moves the
    // record: it may have run, its exit was not saved → unknown.
    let r = run(&w, "tokio", &["--json", "recover", "--store", db]);
    assert_eq!(code(&r), 0, "{}", stderr(&r));
    let v = json(&r);
    let recs = v["records"].as_array().unwrap();
    assert_eq!(recs.len(), 1, "{v}");
    assert_eq!(recs[0]["id"], "killed");
    assert_eq!(recs[0]["from"], from.as_str());
    assert_eq!(recs[0]["to"], "unknown", "{v}");
    // Never sent again; `wait` says unknown (3).
    assert_eq!(lines(&counter), 1);
    let wt = run(&w, "tokio", &["wait", "killed", "--store", db]);
    assert_eq!(code(&wt), 3, "{}", stderr(&wt));
    assert_eq!(lines(&counter), 1);
}

/// `postgres://smolbox:PASSWORD@127.0.0.1:PORT/postgres` for the server
/// `scripts/pg.sh` started (trust auth: the password is only a sentinel),
/// or `None` outside the test command (under `CI=true` that fails).
fn pg_url(password: &str) -> Option<String> {
    match std::env::var("SMOLBOX_PG_PORT") {
        Ok(port) if !port.is_empty() => Some(format!(
            "postgres://smolbox:{password}@127.0.0.1:{port}/postgres"
        )),
        _ if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("SMOLBOX_PG_PORT is not set in CI: the PostgreSQL CLI test must run")
        }
        _ => {
            eprintln!(
                "PostgreSQL CLI test SKIPPED: SMOLBOX_PG_PORT is not set (run scripts/test.sh)"
            );
            None
        }
    }
}

#[test]
fn a_postgres_store_is_shared_by_controllers_with_the_same_keys_and_never_shows_its_password() {
    const PASSWORD: &str = "PWSENTINEL7f3a";
    let Some(url) = pg_url(PASSWORD) else { return };
    let w = devworker(None);
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("shared-keys");
    let counter = dir.path().join("count");
    let script = format!("echo ran >> {}; exit 5", counter.display());
    let id = format!(
        "pg-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    );
    // A partition of this run's own: `c` + 9 base-36 digits of the id.
    let mut v = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
        / 1_000;
    let mut partition = String::from("c");
    while partition.len() < 10 {
        partition.push(char::from_digit((v % 36) as u32, 36).unwrap());
        v /= 36;
    }
    let with_keys = |k: &Path, shell: &str, args: &[&str]| {
        smolbox()
            .env("SMOLBOX_STORE_KEYS", k)
            .env("SMOLBOX_STORE_PARTITION", &partition)
            .args(["--worker", &w.base_url(), "--shell", shell, "--store", &url])
            .args(args)
            .output()
            .unwrap()
    };
    let first = with_keys(
        &keys,
        "tokio",
        &["run", "--id", &id, "--", "sh", "-c", &script],
    );
    assert_eq!(code(&first), 5, "{}", stderr(&first));
    assert!(
        stderr(&first).contains("PostgreSQL store"),
        "{}",
        stderr(&first)
    );
    assert_eq!(lines(&counter), 1);
    // Another controller (the other shell) with the same keys sees the
    // record and does not run it again.
    let again = with_keys(
        &keys,
        "blocking",
        &["run", "--id", &id, "--", "sh", "-c", &script],
    );
    assert_eq!(code(&again), 5, "{}", stderr(&again));
    assert_eq!(lines(&counter), 1, "ran twice");
    let show = with_keys(&keys, "blocking", &["--json", "records", "show", &id]);
    assert_eq!(code(&show), 0, "{}", stderr(&show));
    assert_eq!(json(&show)["exit_code"], 5);
    // Other keys for the same partition are refused, never a fresh start.
    let other = dir.path().join("other-keys");
    let refused = with_keys(&other, "tokio", &["records", "show", &id]);
    assert_ne!(code(&refused), 0);
    assert!(
        stderr(&refused).contains("key_mismatch"),
        "{}",
        stderr(&refused)
    );
    for o in [&first, &again, &show, &refused] {
        assert!(!stderr(o).contains(PASSWORD) && !stdout(o).contains(PASSWORD));
    }
}
