//! Streamed runs driven as a user would (issue 15 item 2): `run --stream`
//! prints the output as it comes and records the run (`records show` has
//! its state and exit), `run --stream --id X` twice runs once, and `exec
//! --stream` into a managed machine's slot works.

// Tests may unwrap: a failure is a test failure.
#![allow(clippy::unwrap_used)]

mod common;

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::Stdio;

use common::{SHELLS, assert_not_run_again, code, devworker, json, run, smolbox, stderr, stdout};

/// Prints `first`, waits (at most its 20 s timeout) for `gate`, prints
/// `second`, exits 3: it can only exit 3 if `first` reached the reader
/// before the command ended (the reader opens the gate when it sees it).
fn gated_script(gate: &Path) -> String {
    format!(
        "echo first; while [ ! -e '{}' ]; do sleep 0.02; done; echo second; exit 3",
        gate.display()
    )
}

/// Spawns `args`, reads stdout's first line, opens the gate, then waits.
fn run_gated(mut cmd: std::process::Command, gate: &Path) -> (String, String, i32) {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    out.read_line(&mut first).unwrap();
    std::fs::write(gate, b"").unwrap();
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let status = child.wait().unwrap();
    (first + &rest, err, status.code().unwrap())
}

#[test]
fn run_stream_prints_as_it_comes_and_records_state_and_exit() {
    let w = devworker(None);
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("s.db");
    let db = db.to_str().unwrap();
    for shell in SHELLS {
        let gate = dir.path().join(format!("gate-{shell}"));
        let id = format!("st-{shell}");
        let mut c = smolbox();
        c.args(["--worker", &w.base_url(), "--shell", shell, "--store", db])
            .args(["run", "--stream", "--id", &id, "--timeout", "20", "--"])
            .args(["sh", "-c", &gated_script(&gate)]);
        let (out, err, code) = run_gated(c, &gate);
        assert_eq!(code, 3, "{shell}: {err}");
        assert_eq!(out, "first\nsecond\n", "{shell}");
        assert!(err.contains("recording this execution"), "{err}");
        let show = run(
            &w,
            shell,
            &["--store", db, "--json", "records", "show", &id],
        );
        assert_eq!(self::code(&show), 0, "{}", stderr(&show));
        let v = json(&show);
        assert_eq!(v["state"], "completed", "{v}");
        assert_eq!(v["evidence"], "exited", "{v}");
        assert_eq!(v["exit_code"], 3, "{v}");
        assert_eq!(v["output_bytes"], 13, "{v}");
        // The output itself is not stored.
        assert!(!v.to_string().contains("second"), "{v}");
    }
}

#[test]
fn run_stream_with_an_id_twice_runs_once() {
    let w = devworker(None);
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("s.db");
    let db = db.to_str().unwrap();
    for shell in SHELLS {
        let counter = dir.path().join(format!("count-{shell}"));
        let script = format!("echo ran >> {}; echo out; exit 6", counter.display());
        let id = format!("once-{shell}");
        let args = [
            "--store", db, "run", "--stream", "--id", &id, "--", "sh", "-c", &script,
        ];
        let first = run(&w, shell, &args);
        assert_eq!(code(&first), 6, "{shell}: {}", stderr(&first));
        assert_eq!(stdout(&first), "out\n");
        assert_not_run_again(&w, shell, &args, 6, &counter);
        // --json: one object per piece, then the exit line.
        let id2 = format!("json-{shell}");
        let j = run(
            &w,
            shell,
            &[
                "--store",
                db,
                "--json",
                "run",
                "--stream",
                "--id",
                &id2,
                "--",
                "sh",
                "-c",
                "echo a; exit 2",
            ],
        );
        assert_eq!(code(&j), 2, "{}", stderr(&j));
        let lines: Vec<serde_json::Value> = stdout(&j)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines[0]["stdout"], "a\n");
        assert_eq!(lines.last().unwrap()["exit_code"], 2);
        assert_eq!(lines.last().unwrap()["state"], "completed");
    }
}

#[test]
fn exec_stream_runs_in_a_managed_machines_slot() {
    let w = devworker(None);
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("m.db");
    let db = db.to_str().unwrap();
    for shell in SHELLS {
        let id = format!("sbox-{shell}");
        let sb = || {
            let mut c = smolbox();
            c.env("SMOLBOX_LEASE_TTL_MS", "1000").args([
                "--worker",
                &w.base_url(),
                "--shell",
                shell,
                "--store",
                db,
            ]);
            c
        };
        let c = sb().args(["machine", "create", &id]).output().unwrap();
        assert_eq!(code(&c), 0, "{shell}: {}", stderr(&c));
        let gate = dir.path().join(format!("mgate-{shell}"));
        let mut e = sb();
        e.args(["exec", &id, "--stream", "--timeout", "20", "--"])
            .args(["sh", "-c", &gated_script(&gate)]);
        let (out, err, code) = run_gated(e, &gate);
        assert_eq!(code, 3, "{shell}: {err}");
        assert_eq!(out, "first\nsecond\n");
        assert!(err.contains("slot of managed machine"), "{err}");
        // records ls / show name the machine's worker for a slot record.
        let xid = err
            .split_whitespace()
            .skip_while(|w| *w != "execution")
            .nth(1)
            .unwrap()
            .to_owned();
        let ls = sb()
            .args(["records", "ls", "--machine", &id])
            .output()
            .unwrap();
        assert_eq!(self::code(&ls), 0, "{}", stderr(&ls));
        let row = stdout(&ls)
            .lines()
            .find(|l| l.starts_with(&xid))
            .unwrap_or_else(|| panic!("{xid} listed: {}", stdout(&ls)))
            .to_owned();
        let cols: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cols[1], "completed", "{row}");
        assert_ne!(cols[4], "-", "the worker is shown: {row}");
        assert_eq!(cols[5], id, "{row}");
        let show = sb().args(["records", "show", &xid]).output().unwrap();
        let text = stdout(&show);
        assert!(!text.contains("\nworker: -"), "{text}");
        assert!(text.contains(&format!("managed_machine: {id}")), "{text}");
        // The slot is free again: a buffered command runs.
        let mut next = None;
        for _ in 0..500 {
            let o = sb()
                .args(["exec", &id, "--", "echo", "next"])
                .output()
                .unwrap();
            if self::code(&o) == 0 {
                next = Some(o);
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert_eq!(stdout(&next.expect("the slot was freed")), "next\n");
        let rm = sb().args(["machine", "rm", &id]).output().unwrap();
        assert_eq!(self::code(&rm), 0, "{}", stderr(&rm));
    }
}
