//! Managed retained machines driven as a user would: `machine
//! create|start|ls|get|stop|rm` (managed by default), `exec` into the
//! machine's one command slot, `stop-for-drain` and `resolve --quiesced`
//! after a command whose outcome is unknown (the CLI killed mid-run).
//! Every command runs with a 1 s claim/lease TTL (`SMOLBOX_LEASE_TTL_MS`,
//! the smallest C12.1 allows), so a killed CLI's claim ends soon; the test
//! polls for that end (it never sleeps for it).

// Tests may unwrap: a failure is a test failure.
#![allow(clippy::unwrap_used)]

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{SHELLS, code, devworker, json, lines, smolbox, stderr, stdout};
use smolbox_devworker::BlockingDevWorker;

/// The claim/lease TTL of every command of this test, ms.
const TTL_MS: &str = "1000";

/// `smolbox --worker URL --shell SHELL --store DB` with the short TTL.
fn sbx(w: &BlockingDevWorker, shell: &str, db: &str) -> Command {
    let mut c = smolbox();
    c.env("SMOLBOX_LEASE_TTL_MS", TTL_MS).args([
        "--worker",
        &w.base_url(),
        "--shell",
        shell,
        "--store",
        db,
    ]);
    c
}

#[test]
fn a_managed_machine_runs_one_command_at_a_time_and_resolves_after_an_unknown_one() {
    let w = devworker(None);
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("m.db");
    let db = db.to_str().unwrap();
    for shell in SHELLS {
        let id = format!("box-{shell}");
        let id = id.as_str();
        let sb = |args: &[&str]| sbx(&w, shell, db).args(args).output().unwrap();
        // Create (left stopped), then start: each waits until the machine
        // settles.
        let c = sb(&["--json", "machine", "create", id, "--no-start"]);
        assert_eq!(code(&c), 0, "{shell}: {}", stderr(&c));
        let v = json(&c);
        assert_eq!(v["state"], "created", "{v}");
        let worker_name = v["worker_machine"].as_str().unwrap().to_owned();
        assert_ne!(worker_name, id, "the worker's name is the controller's");
        let s = sb(&["--json", "machine", "start", id]);
        assert_eq!(code(&s), 0, "{shell}: {}", stderr(&s));
        assert_eq!(json(&s)["state"], "running");
        // The raw view shows the worker's machine under its own name.
        assert!(common::machine_names(&w, shell).contains(&worker_name));
        // `cp` both ways by the managed id (its placed machine is used).
        let local = dir.path().join(format!("up-{shell}"));
        std::fs::write(&local, b"managed bytes\n").unwrap();
        let remote = format!("{id}:/workspace/f");
        let up = sb(&["cp", local.to_str().unwrap(), &remote]);
        assert_eq!(code(&up), 0, "{}", stderr(&up));
        let back = dir.path().join(format!("back-{shell}"));
        let down = sb(&["cp", &remote, back.to_str().unwrap()]);
        assert_eq!(code(&down), 0, "{}", stderr(&down));
        assert_eq!(std::fs::read(&back).unwrap(), b"managed bytes\n");
        // --cpus/--memory are the profile's: refused, nothing created.
        let sized = sb(&["machine", "create", "other", "--cpus", "2"]);
        assert_eq!(code(&sized), 2, "{}", stderr(&sized));
        // The raw view refuses --no-start (the worker's create is its own).
        let raw = sb(&["machine", "--raw", "create", "other", "--no-start"]);
        assert_eq!(code(&raw), 2, "{}", stderr(&raw));
        let ls = sb(&["--json", "machine", "ls"]);
        assert_eq!(code(&ls), 0, "{}", stderr(&ls));
        let ids: Vec<_> = json(&ls)
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["id"].as_str().unwrap().to_owned())
            .collect();
        assert!(ids.contains(&id.to_owned()) && !ids.contains(&"other".to_owned()));

        // A command in the slot, held until its gate file exists.
        let counter = dir.path().join(format!("count-{shell}"));
        let gate = dir.path().join(format!("gate-{shell}"));
        let script = format!(
            "echo ran >> {}; while [ ! -e {} ]; do sleep 0.05; done; echo done",
            counter.display(),
            gate.display()
        );
        let held = sbx(&w, shell, db)
            .args(["exec", id, "--", "sh", "-c", &script])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        while lines(&counter) == 0 {
            std::thread::yield_now();
        }
        // No queue: a second command is refused; stop too while it runs.
        let second = sb(&["exec", id, "--", "echo", "second"]);
        assert_eq!(code(&second), 8, "{}", stderr(&second));
        assert!(stderr(&second).contains("busy"), "{}", stderr(&second));
        assert!(stderr(&second).contains("admission_exhausted"));
        let g = sb(&["--json", "machine", "get", id]);
        assert!(json(&g)["active_execution"].is_string(), "{}", stdout(&g));
        let stop = sb(&["machine", "stop", id]);
        assert_eq!(code(&stop), 8, "{}", stderr(&stop));
        std::fs::write(&gate, b"").unwrap();
        let held = held.wait_with_output().unwrap();
        assert_eq!(code(&held), 0, "{}", stderr(&held));
        assert_eq!(stdout(&held), "done\n");
        assert!(stderr(&held).contains("in the slot of managed machine"));
        assert_eq!(lines(&counter), 1);
        // The slot is free again: the next command runs, with its code.
        let next = sb(&["exec", id, "--", "sh", "-c", "echo hi; exit 4"]);
        assert_eq!(code(&next), 4, "{}", stderr(&next));
        assert_eq!(stdout(&next), "hi\n");

        // A command whose outcome becomes unknown: the CLI is killed.
        let counter2 = dir.path().join(format!("count2-{shell}"));
        let script = format!("echo ran >> {}; sleep 60", counter2.display());
        let mut child = sbx(&w, shell, db)
            .args(["exec", id, "--", "sh", "-c", &script])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        while lines(&counter2) == 0 {
            assert!(child.try_wait().unwrap().is_none(), "exec ended early");
            std::thread::yield_now();
        }
        child.kill().unwrap();
        child.wait().unwrap();
        let g = json(&sb(&["--json", "machine", "get", id]));
        let blocked = g["active_execution"].as_str().unwrap().to_owned();
        // Without --quiesced: refused (validation), nothing changes.
        let r = sb(&["resolve", id, "--stopped"]);
        assert_eq!(code(&r), 2, "{}", stderr(&r));
        assert!(stderr(&r).contains("not_quiesced"), "{}", stderr(&r));
        // Neither --stopped nor --deleted: refused by the command line.
        let r = sb(&["resolve", id, "--quiesced"]);
        assert_eq!(code(&r), 2, "{}", stderr(&r));
        // Still running on the worker: resolve --stopped is a conflict.
        let r = sb(&["resolve", id, "--quiesced", "--stopped"]);
        assert_eq!(code(&r), 8, "{}", stderr(&r));
        assert!(stderr(&r).contains("identity_conflict"), "{}", stderr(&r));
        // The killed CLI's controller still claims the machine: refused
        // (8, a store refusal: nothing was sent) until its lease ends,
        // which `get` shows; polled until the record is free.
        let until = Instant::now() + Duration::from_secs(60);
        let d = loop {
            let d = sb(&["--json", "stop-for-drain", id]);
            if code(&d) != 8 {
                break d;
            }
            assert!(
                stderr(&d).contains("claimed by another controller"),
                "{}",
                stderr(&d)
            );
            let g = json(&sb(&["--json", "machine", "get", id]));
            // The claim was taken under the 1 s TTL (not the 30 s default).
            let claim = g["claim_until_ms"].as_u64().unwrap();
            assert!(claim <= g["updated_at_ms"].as_u64().unwrap() + 1_000, "{g}");
            assert!(Instant::now() < until, "the killed CLI's claim never ended");
        };
        assert_eq!(code(&d), 0, "{}", stderr(&d));
        let v = json(&d);
        assert_eq!(v["observed"], "stopped", "{v}");
        assert_eq!(v["active_execution"], blocked.as_str(), "the slot is kept");
        let r = sb(&["--json", "resolve", id, "--quiesced", "--stopped"]);
        assert_eq!(code(&r), 0, "{}", stderr(&r));
        let v = json(&r);
        assert_eq!(v["state"], "stopped", "{v}");
        assert!(v["active_execution"].is_null(), "{v}");
        assert_eq!(v["command"]["id"], blocked.as_str());
        assert_eq!(v["command"]["state"], "unknown", "{v}");
        assert_eq!(lines(&counter2), 1, "never sent again");

        // Remove it; unknown ids are not found (5).
        let rm = sb(&["--json", "machine", "rm", id]);
        assert_eq!(code(&rm), 0, "{}", stderr(&rm));
        assert_eq!(json(&rm)["state"], "deleted");
        assert!(!common::machine_names(&w, shell).contains(&worker_name));
        for args in [
            &["machine", "get", "nosuch"][..],
            &["stop-for-drain", "nosuch"][..],
            &["resolve", "nosuch", "--quiesced", "--deleted"][..],
        ] {
            let o = sb(args);
            assert_eq!(code(&o), 5, "{args:?}: {}", stderr(&o));
        }
    }
}

#[test]
fn managed_machines_need_a_persistent_worker() {
    // No --worker and no `dev up`: the in-process devworker would end with
    // the command, so nothing is started and the user is told what to do.
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("m.db");
    let db = db.to_str().unwrap();
    for args in [
        &["machine", "create", "dev"][..],
        &["machine", "start", "dev"][..],
        &["stop-for-drain", "dev"][..],
    ] {
        let o = smolbox().args(["--store", db]).args(args).output().unwrap();
        assert_eq!(code(&o), 2, "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains("smolbox dev up"), "{}", stderr(&o));
        assert!(!stderr(&o).contains("in-process"), "{}", stderr(&o));
        assert!(stderr(&o).contains("nothing was sent"), "{}", stderr(&o));
    }
    // `ls` reads the store alone: no worker at all.
    let o = smolbox()
        .args(["--store", db, "--json", "machine", "ls"])
        .output()
        .unwrap();
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(json(&o), serde_json::json!([]));
    assert!(!stderr(&o).contains("devworker"), "{}", stderr(&o));
}

#[test]
fn the_lease_ttl_is_bounded_by_c12_1() {
    // 1,000 ms is accepted (the smallest), 999 refused (validation, nothing
    // sent); likewise at the top; a non-number is refused too.
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("m.db");
    let db = db.to_str().unwrap();
    for (ttl, want) in [
        ("1000", 0),
        ("999", 2),
        ("900000", 0),
        ("900001", 2),
        ("1s", 2),
    ] {
        let o = smolbox()
            .env("SMOLBOX_LEASE_TTL_MS", ttl)
            .args(["--store", db, "records", "ls"])
            .output()
            .unwrap();
        assert_eq!(code(&o), want, "{ttl}: {}", stderr(&o));
        if want == 2 {
            assert!(
                stderr(&o).contains("lease_ttl_out_of_range"),
                "{}",
                stderr(&o)
            );
        }
    }
}

/// On a named worker without `--image` a managed machine is imageless: an
/// `exec` into its slot that needs a plain image machine (a workdir
/// outside `/workspace`, C5.4) is refused before its acceptance — nothing
/// sent, no record, the slot free and the machine `running` — so the next
/// ordinary command runs at once (no `resolve`).
#[test]
fn an_imageless_managed_machine_refuses_an_extended_exec_before_acceptance() {
    let w = devworker(None);
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("m.db");
    let db = db.to_str().unwrap();
    for shell in SHELLS {
        let id = format!("bare-{shell}");
        let id = id.as_str();
        let sb = |args: &[&str]| {
            sbx(&w, shell, db)
                .env_remove("SMOLBOX_IMAGE")
                .args(args)
                .output()
                .unwrap()
        };
        let c = sb(&["machine", "create", id]);
        assert_eq!(code(&c), 0, "{shell}: {}", stderr(&c));
        let execs = w.request_count(smolbox_devworker::Route::Exec);
        let o = sb(&["exec", id, "--workdir", "/", "--", "true"]);
        assert_ne!(code(&o), 0, "{shell}");
        assert!(
            stderr(&o).contains("needs_plain_image_machine"),
            "{shell}: {}",
            stderr(&o)
        );
        assert_eq!(
            w.request_count(smolbox_devworker::Route::Exec),
            execs,
            "{shell}: nothing sent"
        );
        let g = json(&sb(&["--json", "machine", "get", id]));
        assert!(g["active_execution"].is_null(), "{shell}: {g}");
        assert_eq!(g["state"], "running", "{shell}: {g}");
        let next = sb(&["exec", id, "--", "sh", "-c", "echo hi; exit 4"]);
        assert_eq!(code(&next), 4, "{shell}: {}", stderr(&next));
        assert_eq!(stdout(&next), "hi\n");
    }
}
