//! The `smolbox` binary driven as a user would, against a devworker on
//! loopback, on both client shells.

// Tests may unwrap: a failure is a test failure.
#![allow(clippy::unwrap_used)]

mod common;

use common::{SHELLS, code, devworker, machine_names, run, smolbox, stderr, stdout};
use smolbox_devworker::BlockingDevWorker;

#[test]
fn run_prints_the_output_and_removes_the_machine() {
    let w = devworker(None);
    for shell in SHELLS {
        let o = run(&w, shell, &["run", "--", "echo", "hello from smolbox"]);
        assert_eq!(code(&o), 0, "{shell}: {}", stderr(&o));
        assert_eq!(stdout(&o), "hello from smolbox\n", "{shell}");
        assert!(machine_names(&w, shell).is_empty(), "{shell}: machine left");
    }
}

#[test]
fn run_removes_the_machine_when_the_command_fails() {
    let w = devworker(None);
    for shell in SHELLS {
        let o = run(
            &w,
            shell,
            &["run", "--", "sh", "-c", "echo bad >&2; exit 7"],
        );
        assert_eq!(code(&o), 7, "{shell}: {}", stderr(&o));
        assert!(stderr(&o).contains("bad"), "{shell}");
        assert!(machine_names(&w, shell).is_empty(), "{shell}: machine left");
    }
}

#[test]
fn run_without_a_worker_starts_the_devworker_and_says_so() {
    let o = smolbox()
        .args(["run", "--", "echo", "hello from smolbox"])
        .output()
        .unwrap();
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(stdout(&o), "hello from smolbox\n");
    assert!(stderr(&o).contains("WITHOUT isolation"), "{}", stderr(&o));
}

#[test]
fn exec_propagates_the_exit_code_buffered_and_streamed() {
    let w = devworker(None);
    for shell in SHELLS {
        let m = format!("ex-{shell}");
        assert_eq!(
            code(&run(&w, shell, &["machine", "--raw", "create", &m])),
            0
        );
        let script = "echo out; echo err >&2; exit 5";
        for stream in [false, true] {
            let mut args = vec!["exec", m.as_str()];
            if stream {
                args.push("--stream");
            }
            args.extend(["--", "sh", "-c", script]);
            let o = run(&w, shell, &args);
            assert_eq!(code(&o), 5, "{shell} stream={stream}: {}", stderr(&o));
            assert_eq!(stdout(&o), "out\n", "{shell} stream={stream}");
            assert!(stderr(&o).contains("err\n"), "{shell} stream={stream}");
        }
        let o = run(&w, shell, &["exec", &m, "--", "true"]);
        assert_eq!(code(&o), 0, "{shell}");
    }
}

#[test]
fn exec_passes_env_workdir_and_stdin() {
    let w = devworker(None);
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.txt");
    std::fs::write(&input, "line one\nline two\n").unwrap();
    for shell in SHELLS {
        let m = format!("env-{shell}");
        assert_eq!(
            code(&run(&w, shell, &["machine", "--raw", "create", &m])),
            0
        );
        let o = run(
            &w,
            shell,
            &[
                "exec",
                &m,
                "--env",
                "GREETING=bonjour",
                "--",
                "sh",
                "-c",
                "echo $GREETING",
            ],
        );
        assert_eq!(stdout(&o), "bonjour\n", "{shell}: {}", stderr(&o));
        let o = run(
            &w,
            shell,
            &[
                "exec",
                &m,
                "--stdin",
                input.to_str().unwrap(),
                "--",
                "wc",
                "-l",
            ],
        );
        assert_eq!(stdout(&o).trim(), "2", "{shell}: {}", stderr(&o));
        let o = run(&w, shell, &["exec", &m, "--env", "NOEQUALS", "--", "true"]);
        assert_eq!(
            code(&o),
            2,
            "{shell}: a malformed --env is a validation error"
        );
        assert!(stderr(&o).contains("category=validation"), "{shell}");
    }
}

#[test]
fn machine_lifecycle() {
    let w = devworker(None);
    for shell in SHELLS {
        let m = format!("life-{shell}");
        let o = run(&w, shell, &["machine", "--raw", "create", &m]);
        assert_eq!(code(&o), 0, "{shell}: {}", stderr(&o));
        assert!(stdout(&o).contains(&m), "{shell}");
        assert!(machine_names(&w, shell).contains(&m), "{shell}");

        let o = run(&w, shell, &["--json", "machine", "--raw", "start", &m]);
        assert_eq!(code(&o), 0, "{shell}: {}", stderr(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v["state"], "running", "{shell}");

        let o = run(&w, shell, &["--json", "machine", "--raw", "stop", &m]);
        assert_eq!(code(&o), 0, "{shell}: {}", stderr(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v["state"], "stopped", "{shell}");

        let o = run(&w, shell, &["machine", "--raw", "get", &m]);
        assert_eq!(code(&o), 0, "{shell}");
        assert!(stdout(&o).contains("stopped"), "{shell}: {}", stdout(&o));

        let o = run(&w, shell, &["machine", "--raw", "rm", &m]);
        assert_eq!(code(&o), 0, "{shell}: {}", stderr(&o));
        assert!(!machine_names(&w, shell).contains(&m), "{shell}");

        let o = run(&w, shell, &["machine", "--raw", "get", &m]);
        assert_eq!(code(&o), 5, "{shell}: absent is not_found: {}", stderr(&o));
        assert!(stderr(&o).contains("category=not_found"), "{shell}");
    }
}

#[test]
fn logs_show_the_console() {
    let w = devworker(None);
    for shell in SHELLS {
        let m = format!("logs-{shell}");
        assert_eq!(
            code(&run(&w, shell, &["machine", "--raw", "create", &m])),
            0
        );
        assert_eq!(code(&run(&w, shell, &["machine", "--raw", "start", &m])), 0);
        let o = run(&w, shell, &["logs", &m]);
        assert_eq!(code(&o), 0, "{shell}: {}", stderr(&o));
        assert!(
            stdout(&o).contains(&format!("machine '{m}' started")),
            "{shell}: {}",
            stdout(&o)
        );
    }
}

#[test]
fn cp_round_trip_with_digest() {
    let w = devworker(None);
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src.bin");
    let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(&src, &data).unwrap();
    let digest = {
        use sha2::Digest;
        sha2::Sha256::digest(&data)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    };
    for shell in SHELLS {
        let m = format!("cp-{shell}");
        assert_eq!(
            code(&run(&w, shell, &["machine", "--raw", "create", &m])),
            0
        );
        assert_eq!(code(&run(&w, shell, &["machine", "--raw", "start", &m])), 0);
        let remote = format!("{m}:/workspace/data.bin");
        let o = run(
            &w,
            shell,
            &["cp", src.to_str().unwrap(), &remote, "--sha256", &digest],
        );
        assert_eq!(code(&o), 0, "{shell}: {}", stderr(&o));
        assert!(stdout(&o).contains(&digest), "{shell}: {}", stdout(&o));

        let back = dir.path().join(format!("back-{shell}.bin"));
        let o = run(
            &w,
            shell,
            &[
                "--json",
                "cp",
                &remote,
                back.to_str().unwrap(),
                "--sha256",
                &digest,
            ],
        );
        assert_eq!(code(&o), 0, "{shell}: {}", stderr(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v["sha256"], digest.as_str(), "{shell}");
        assert_eq!(v["bytes"], data.len(), "{shell}");
        assert_eq!(std::fs::read(&back).unwrap(), data, "{shell}");

        // A wrong expected digest fails the download and writes nothing.
        let wrong = "0".repeat(64);
        let none = dir.path().join(format!("none-{shell}.bin"));
        let o = run(
            &w,
            shell,
            &["cp", &remote, none.to_str().unwrap(), "--sha256", &wrong],
        );
        assert_eq!(code(&o), 2, "{shell}: {}", stderr(&o));
        assert!(stderr(&o).contains("reason=sha256_mismatch"), "{shell}");
        assert!(!none.exists(), "{shell}: nothing written on mismatch");
    }
}

#[test]
fn errors_show_category_and_evidence_never_the_token_or_payload() {
    const TOKEN: &str = "sentinel-token-4f1c9a";
    const WRONG: &str = "sentinel-wrong-77d2e0";
    const PAYLOAD: &str = "sentinel-payload-0b3e51";
    let w = devworker(Some(TOKEN));
    for shell in SHELLS {
        // Wrong token: refused, category authentication.
        let o = run(
            &w,
            shell,
            &["--token", WRONG, "exec", "nope", "--", "echo", PAYLOAD],
        );
        let err = stderr(&o);
        assert_eq!(code(&o), 4, "{shell}: {err}");
        assert!(err.contains("category=authentication"), "{shell}: {err}");
        assert!(err.contains("evidence="), "{shell}: {err}");
        for s in [TOKEN, WRONG, PAYLOAD] {
            assert!(
                !err.contains(s) && !stdout(&o).contains(s),
                "{shell}: leaked {s}"
            );
        }
        // Right token, absent machine: not_found; the payload is not echoed.
        let o = smolbox()
            .args(["--worker", &w.base_url(), "--shell", shell])
            .env("SMOLBOX_TOKEN", TOKEN)
            .args(["exec", "nope", "--", "echo", PAYLOAD])
            .output()
            .unwrap();
        let err = stderr(&o);
        assert_eq!(code(&o), 5, "{shell}: {err}");
        assert!(
            err.contains("category=not_found operation=exec"),
            "{shell}: {err}"
        );
        for s in [TOKEN, PAYLOAD] {
            assert!(
                !err.contains(s) && !stdout(&o).contains(s),
                "{shell}: leaked {s}"
            );
        }
    }
}

#[test]
fn an_unreachable_worker_is_a_transport_error_with_nothing_sent() {
    // A port nobody listens on: bind, read the port, close.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    for shell in SHELLS {
        let o = smolbox()
            .args([
                "--worker",
                &format!("http://127.0.0.1:{port}"),
                "--shell",
                shell,
                "health",
            ])
            .output()
            .unwrap();
        let err = stderr(&o);
        assert_eq!(code(&o), 6, "{shell}: {err}");
        assert!(err.contains("category=transport"), "{shell}: {err}");
        assert!(err.contains("evidence=not_dispatched"), "{shell}: {err}");
    }
}

#[test]
fn invalid_input_is_a_validation_error() {
    let o = smolbox()
        .args(["--worker", "http://example.com:1", "health"])
        .output()
        .unwrap();
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("category=validation operation=config"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn help_documents_the_exit_codes() {
    let o = smolbox().arg("--help").output().unwrap();
    assert_eq!(code(&o), 0);
    let text = stdout(&o);
    assert!(text.contains("Exit codes:"), "{text}");
    assert!(text.contains("uncertain"), "{text}");
}

#[test]
fn logs_follow_prints_new_lines() {
    use std::io::{BufRead, BufReader};
    let w = devworker(None);
    for shell in SHELLS {
        let m = format!("follow-{shell}");
        assert_eq!(
            code(&run(&w, shell, &["machine", "--raw", "create", &m])),
            0
        );
        assert_eq!(code(&run(&w, shell, &["machine", "--raw", "start", &m])), 0);
        let mut child = smolbox()
            .args([
                "--worker",
                &w.base_url(),
                "--shell",
                shell,
                "logs",
                "-f",
                &m,
            ])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        // Bounded: a watchdog kills the follower after 15 s, which ends
        // its stdout and fails the reads below instead of hanging.
        let child = std::sync::Arc::new(std::sync::Mutex::new(child));
        let (done, stop) = std::sync::mpsc::channel::<()>();
        let watchdog = {
            let child = std::sync::Arc::clone(&child);
            std::thread::spawn(move || {
                let _ = stop.recv_timeout(std::time::Duration::from_secs(15));
                let mut c = child.lock().unwrap();
                let _ = c.kill();
                let _ = c.wait();
            })
        };
        let mut lines = BufReader::new(out).lines();
        let first = lines.next().expect("a first line").unwrap();
        assert!(first.contains("started"), "{shell}: {first}");
        // A restart appends a second boot line, which the follower prints.
        assert_eq!(code(&run(&w, shell, &["machine", "--raw", "stop", &m])), 0);
        assert_eq!(code(&run(&w, shell, &["machine", "--raw", "start", &m])), 0);
        let second = lines.next().expect("the new line").unwrap();
        assert!(second.contains("started"), "{shell}: {second}");
        done.send(()).unwrap();
        watchdog.join().unwrap();
    }
}

#[test]
fn run_interrupted_removes_the_machine_and_exits_130() {
    let w = devworker(None);
    for shell in SHELLS {
        let child = smolbox()
            .args(["--worker", &w.base_url(), "--shell", shell])
            .args(["run", "--timeout", "60", "--", "sleep", "60"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // Wait (bounded) until the machine runs (the exec started it, so
        // the interrupt handler is in place), then interrupt.
        let until = std::time::Instant::now() + std::time::Duration::from_secs(15);
        loop {
            let o = run(&w, shell, &["--json", "machine", "--raw", "ls"]);
            let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
            if v.as_array()
                .unwrap()
                .iter()
                .any(|m| m["state"] == "running")
            {
                break;
            }
            assert!(
                std::time::Instant::now() < until,
                "{shell}: no running machine"
            );
        }
        let status = std::process::Command::new("kill")
            .args(["-INT", &child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        let o = child.wait_with_output().unwrap();
        assert_eq!(code(&o), 130, "{shell}: {}", stderr(&o));
        assert!(
            stderr(&o).contains("interrupted"),
            "{shell}: {}",
            stderr(&o)
        );
        assert!(machine_names(&w, shell).is_empty(), "{shell}: machine left");
    }
}

#[test]
fn run_records_the_execution_in_the_sqlite_store_sealed() {
    let w = devworker(None);
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("state").join("smolbox.db");
    let sentinel = "SENTINEL-ARGV-7f3a";
    for shell in SHELLS {
        let o = run(
            &w,
            shell,
            &[
                "run",
                "--store",
                db.to_str().unwrap(),
                "--",
                "sh",
                "-c",
                &format!("echo {sentinel} >/dev/null; echo recorded; exit 4"),
            ],
        );
        assert_eq!(code(&o), 4, "{shell}: {}", stderr(&o));
        assert_eq!(stdout(&o), "recorded\n", "{shell}");
        assert!(
            stderr(&o).contains("embedded SQLite store"),
            "{shell}: {}",
            stderr(&o)
        );
    }
    // The records exist (database and key files), and no file holds the
    // command text in clear.
    let files: Vec<_> = std::fs::read_dir(db.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(files.iter().any(|p| p.ends_with("smolbox.db")), "{files:?}");
    assert!(
        files
            .iter()
            .any(|p| p.to_string_lossy().ends_with("seal-key"))
    );
    let recorded: u64 = files
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum();
    assert!(recorded > 0);
    for p in &files {
        let bytes = std::fs::read(p).unwrap();
        assert!(
            !bytes
                .windows(sentinel.len())
                .any(|w| w == sentinel.as_bytes()),
            "{} holds the command in clear",
            p.display()
        );
    }
}

#[test]
fn a_definite_worker_answer_is_reported_as_such_not_as_uncertain() {
    let w = devworker(None);
    for shell in SHELLS {
        // 404: the worker said the machine does not exist.
        let o = run(&w, shell, &["exec", "absent", "--", "true"]);
        let err = stderr(&o);
        assert_eq!(code(&o), 5, "{shell}: {err}");
        assert!(err.contains("the worker answered 404"), "{shell}: {err}");
        assert!(err.contains("not carried out"), "{shell}: {err}");
        assert!(!err.contains("may have reached"), "{shell}: {err}");

        // 409: the name is taken.
        let m = format!("dup-{shell}");
        assert_eq!(
            code(&run(&w, shell, &["machine", "--raw", "create", &m])),
            0
        );
        let o = run(&w, shell, &["machine", "--raw", "create", &m]);
        let err = stderr(&o);
        assert_eq!(code(&o), 8, "{shell}: {err}");
        assert!(err.contains("the worker answered 409"), "{shell}: {err}");
        assert!(!err.contains("may have reached"), "{shell}: {err}");

        // With --json the failure is one JSON object on stderr.
        let o = run(&w, shell, &["--json", "machine", "--raw", "get", "absent"]);
        assert_eq!(code(&o), 5, "{shell}");
        let v: serde_json::Value = serde_json::from_slice(&o.stderr).unwrap();
        assert_eq!(v["error"]["status"], 404, "{shell}");
        assert_eq!(v["error"]["worker_answered"], true, "{shell}");
        assert_eq!(v["error"]["effect_uncertain"], false, "{shell}");
        assert_eq!(v["error"]["exit_code"], 5, "{shell}");
    }
}

#[test]
fn an_uncertain_outcome_keeps_the_may_have_reached_note() {
    use smolbox_devworker::{Fault, Route};
    let w = devworker(None);
    for shell in SHELLS {
        let m = format!("unc-{shell}");
        assert_eq!(
            code(&run(&w, shell, &["machine", "--raw", "create", &m])),
            0
        );
        // The worker takes the exec, then the connection drops mid-reply.
        w.faults().once(Route::Exec, Fault::DropAfter { bytes: 20 });
        let o = run(&w, shell, &["exec", &m, "--", "true"]);
        let err = stderr(&o);
        assert_eq!(code(&o), 3, "{shell}: {err}");
        assert!(
            err.contains("may have reached the worker"),
            "{shell}: {err}"
        );
        assert!(!err.contains("the worker answered"), "{shell}: {err}");

        w.faults().once(Route::Exec, Fault::DropAfter { bytes: 20 });
        let o = run(&w, shell, &["--json", "exec", &m, "--", "true"]);
        assert_eq!(code(&o), 3, "{shell}");
        let v: serde_json::Value = serde_json::from_slice(&o.stderr).unwrap();
        assert_eq!(v["error"]["effect_uncertain"], true, "{shell}");
        assert_eq!(v["error"]["worker_answered"], false, "{shell}");
    }
}

#[test]
fn json_for_streamed_exec_and_logs() {
    let w = devworker(None);
    for shell in SHELLS {
        let m = format!("js-{shell}");
        assert_eq!(
            code(&run(&w, shell, &["machine", "--raw", "create", &m])),
            0
        );
        let o = run(
            &w,
            shell,
            &[
                "--json",
                "exec",
                &m,
                "--stream",
                "--",
                "sh",
                "-c",
                "echo out; exit 6",
            ],
        );
        assert_eq!(code(&o), 6, "{shell}: {}", stderr(&o));
        let objs: Vec<serde_json::Value> = stdout(&o)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let text: String = objs.iter().filter_map(|v| v["stdout"].as_str()).collect();
        assert_eq!(text, "out\n", "{shell}");
        assert_eq!(objs.last().unwrap()["exit_code"], 6, "{shell}");

        let o = run(&w, shell, &["--json", "logs", &m]);
        assert_eq!(code(&o), 0, "{shell}: {}", stderr(&o));
        let lines: Vec<serde_json::Value> = stdout(&o)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert!(
            lines
                .iter()
                .any(|v| v["line"].as_str().unwrap().contains("started")),
            "{shell}: {}",
            stdout(&o)
        );
    }
}

#[test]
fn the_command_timeout_is_bounded_at_one_day() {
    let w = devworker(None);
    let shell = "tokio";
    assert_eq!(
        code(&run(&w, shell, &["machine", "--raw", "create", "tmo"])),
        0
    );
    let o = run(
        &w,
        shell,
        &["exec", "tmo", "--timeout", "86400", "--", "true"],
    );
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = run(
        &w,
        shell,
        &["exec", "tmo", "--timeout", "86401", "--", "true"],
    );
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(stderr(&o).contains("86400"), "{}", stderr(&o));
}

#[test]
fn a_download_is_renamed_into_place_only_when_checked() {
    let w = devworker(None);
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("new.txt");
    std::fs::write(&src, "new content\n").unwrap();
    let digest = {
        use sha2::Digest;
        sha2::Sha256::digest(b"new content\n")
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    };
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    for shell in SHELLS {
        let m = format!("ren-{shell}");
        assert_eq!(
            code(&run(&w, shell, &["machine", "--raw", "create", &m])),
            0
        );
        let remote = format!("{m}:/workspace/f.txt");
        let o = run(&w, shell, &["cp", src.to_str().unwrap(), &remote]);
        assert_eq!(code(&o), 0, "{shell}: {}", stderr(&o));

        // An older file under the target name survives a failed check.
        let target = out.join(format!("f-{shell}.txt"));
        std::fs::write(&target, "old\n").unwrap();
        let wrong = "0".repeat(64);
        let o = run(
            &w,
            shell,
            &["cp", &remote, target.to_str().unwrap(), "--sha256", &wrong],
        );
        assert_eq!(code(&o), 2, "{shell}: {}", stderr(&o));
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "old\n");

        // A checked download replaces it.
        let o = run(
            &w,
            shell,
            &["cp", &remote, target.to_str().unwrap(), "--sha256", &digest],
        );
        assert_eq!(code(&o), 0, "{shell}: {}", stderr(&o));
        assert!(
            stderr(&o).is_empty(),
            "{shell}: no progress drawn when stderr is not a terminal: {:?}",
            stderr(&o)
        );
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "new content\n");

        // Into a directory: the guest file's name.
        let sub = out.join(format!("into-{shell}"));
        std::fs::create_dir(&sub).unwrap();
        let o = run(&w, shell, &["cp", &remote, sub.to_str().unwrap()]);
        assert_eq!(code(&o), 0, "{shell}: {}", stderr(&o));
        assert_eq!(
            std::fs::read_to_string(sub.join("f.txt")).unwrap(),
            "new content\n"
        );
    }
    // No temporary file is left behind anywhere.
    let mut stack = vec![out.clone()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            assert!(
                !p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .contains(".smolbox-cp-"),
                "left {}",
                p.display()
            );
            if p.is_dir() {
                stack.push(p);
            }
        }
    }
}

#[test]
fn logs_follow_past_ten_thousand_lines_loses_and_repeats_nothing() {
    let w = devworker(None);
    for shell in SHELLS {
        follow_long(&w, shell);
    }
    // A definite answer ends the follow with it: no such machine (5).
    let o = run(&w, "tokio", &["logs", "-f", "nosuch"]);
    assert_eq!(code(&o), 5, "{}", stderr(&o));
}

/// Follows one machine's log (SSE reads, one after another) while 12,003
/// lines are appended in three bursts; every line is printed once, in
/// order, with no gap reported.
fn follow_long(w: &BlockingDevWorker, shell: &str) {
    use std::io::{BufRead, BufReader, Read, Write};
    let m = &format!("follow-long-{shell}");
    assert_eq!(code(&run(w, shell, &["machine", "--raw", "create", m])), 0);
    assert_eq!(code(&run(w, shell, &["machine", "--raw", "start", m])), 0);
    let mut child = smolbox()
        .args(["--worker", &w.base_url(), "--shell", shell])
        .args(["logs", "-f", "--tail", "10000", m])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let child = std::sync::Arc::new(std::sync::Mutex::new(child));
    let (done, stop) = std::sync::mpsc::channel::<()>();
    let watchdog = {
        let child = std::sync::Arc::clone(&child);
        std::thread::spawn(move || {
            let _ = stop.recv_timeout(std::time::Duration::from_secs(60));
            let mut c = child.lock().unwrap();
            let _ = c.kill();
            let _ = c.wait();
        })
    };
    let mut lines = BufReader::new(out).lines();
    let mut seen = Vec::new();
    let mut until = |needle: &str, seen: &mut Vec<String>| loop {
        let l = lines.next().expect("the follower ended early").unwrap();
        let hit = l == needle || (!needle.starts_with("L ") && l.contains(needle));
        seen.push(l);
        if hit {
            return;
        }
    };
    until(&format!("machine '{m}' started"), &mut seen);
    let append = |range: std::ops::Range<u32>| {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(w.console_log(m))
            .unwrap();
        let text: String = range.map(|i| format!("L {i:06}\n")).collect();
        f.write_all(text.as_bytes()).unwrap();
    };
    // Batches below one read's 10,000 lines, to a total well past it.
    append(0..6_000);
    until("L 005999", &mut seen);
    append(6_000..12_000);
    until("L 011999", &mut seen);
    append(12_000..12_003);
    until("L 012002", &mut seen);
    done.send(()).unwrap();
    watchdog.join().unwrap();
    let numbered: Vec<&String> = seen.iter().filter(|l| l.starts_with("L ")).collect();
    let expected: Vec<String> = (0..12_003).map(|i| format!("L {i:06}")).collect();
    assert_eq!(numbered.len(), expected.len(), "every line exactly once");
    assert!(
        numbered.iter().zip(&expected).all(|(a, b)| *a == b),
        "in order"
    );
    let mut notes = String::new();
    err.read_to_string(&mut notes).unwrap();
    assert!(!notes.contains("missing"), "{shell}: {notes}");
}

/// Several `smolbox run` processes share one store at once — each with its
/// own in-process devworker, and two with different named workers. Each
/// record names its own worker, so no process takes another's record for
/// its own: every run prints its output and exits 0 (before the worker ids
/// were distinct, one run in about twelve ended `dispatch_uncertain`).
#[test]
fn concurrent_runs_on_one_store_keep_to_their_own_records() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("shared.db");
    let db = db.to_str().unwrap();
    let w1 = devworker(None);
    let w2 = devworker(None);
    for round in 0..2 {
        let mut children = Vec::new();
        for i in 0..6 {
            let text = format!("round {round} run {i}");
            let mut c = smolbox();
            match i % 3 {
                0 => {}
                1 => {
                    c.args(["--worker", &w1.base_url()]);
                }
                _ => {
                    c.args(["--worker", &w2.base_url()]);
                }
            }
            c.args(["run", "--store", db, "--", "echo", &text])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped());
            children.push((text, c.spawn().unwrap()));
        }
        for (text, child) in children {
            let o = child.wait_with_output().unwrap();
            assert_eq!(code(&o), 0, "{text}: {}", stderr(&o));
            assert_eq!(stdout(&o), format!("{text}\n"));
        }
    }
}

/// Without `--image` (or `SMOLBOX_IMAGE`) a named worker gets imageless
/// machines: a command over 300 s on one is refused before it is sent
/// (the worker-side image preflight, C5.4) and says why; with `--image`
/// the same command runs.
#[test]
fn a_named_worker_without_an_image_gets_imageless_machines() {
    let w = devworker(None);
    let bare = |args: &[&str]| {
        smolbox()
            .env_remove("SMOLBOX_IMAGE")
            .args(["--worker", &w.base_url(), "--shell", "blocking"])
            .args(args)
            .output()
            .expect("smolbox runs")
    };
    assert_eq!(code(&bare(&["machine", "--raw", "create", "plain"])), 0);
    let o = bare(&["exec", "plain", "--timeout", "301", "--", "true"]);
    assert_ne!(code(&o), 0);
    assert!(
        stderr(&o).contains("needs_plain_image_machine"),
        "{}",
        stderr(&o)
    );
    assert_eq!(
        w.request_count(smolbox_devworker::Route::Exec),
        0,
        "nothing sent"
    );
    let o = bare(&[
        "--image",
        "alpine:3.19",
        "machine",
        "--raw",
        "create",
        "img",
    ]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = bare(&["exec", "img", "--timeout", "301", "--", "true"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
}

/// A plain `run` on a named worker without `--image` creates an imageless
/// machine. A command that needs a plain image machine there (a timeout
/// over 300 s, C5.4) is refused before its acceptance (session 11: the
/// run's runtime carries the version profile admitted for the create, so
/// the controller inspects the machine first): exit 2,
/// `unsupported_capability` / `needs_plain_image_machine`, nothing sent,
/// no record under its id, and the machine removed. Before, it was stored
/// and failed at dispatch (`failed` / `not_dispatched`).
#[test]
fn a_plain_run_needing_an_image_machine_is_refused_before_anything_is_stored() {
    let w = devworker(None);
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("r.db");
    let db = db.to_str().unwrap();
    for shell in SHELLS {
        let sb = |args: &[&str]| {
            smolbox()
                .env_remove("SMOLBOX_IMAGE")
                .args(["--worker", &w.base_url(), "--shell", shell])
                .args(args)
                .output()
                .expect("smolbox runs")
        };
        let id = format!("ext-{shell}");
        let execs = w.request_count(smolbox_devworker::Route::Exec);
        let o = sb(&[
            "run",
            "--store",
            db,
            "--id",
            &id,
            "--timeout",
            "301",
            "--",
            "true",
        ]);
        assert_eq!(code(&o), 2, "{shell}: {}", stderr(&o));
        let err = stderr(&o);
        assert!(
            err.contains("unsupported_capability") && err.contains("needs_plain_image_machine"),
            "{shell}: {err}"
        );
        assert_eq!(
            w.request_count(smolbox_devworker::Route::Exec),
            execs,
            "{shell}: nothing sent"
        );
        let shown = sb(&["--store", db, "records", "show", &id]);
        assert_eq!(code(&shown), 5, "{shell}: {}", stderr(&shown));
        assert_eq!(machine_names(&w, shell), Vec::<String>::new(), "{shell}");
        // An ordinary command on the same kind of machine still runs.
        let ok = sb(&["run", "--store", db, "--", "sh", "-c", "echo hi; exit 4"]);
        assert_eq!(code(&ok), 4, "{shell}: {}", stderr(&ok));
        assert_eq!(stdout(&ok), "hi\n", "{shell}");
    }
}
