//! `run --input LOCAL:GUEST_PATH` and `--output GUEST_PATH[:LOCAL]`, driven
//! as a user would, on both shells against a devworker: the input is read
//! by the command, the output written back with the right bytes, the
//! limits at N and N + 1, refusals before any worker request, the
//! disposable machine deleted afterwards.

// Tests may unwrap: a failure is a test failure.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;

use common::{SHELLS, code, devworker, json, machine_names, run, stderr, stdout};
use sha2::{Digest, Sha256};
use smolbox_devworker::{BlockingDevWorker, Route};

fn hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Every request that could change the worker, counted.
fn mutations(w: &BlockingDevWorker) -> u64 {
    [
        Route::MachinesCreate,
        Route::MachineStart,
        Route::MachineStop,
        Route::MachineDelete,
        Route::Exec,
        Route::ExecStream,
        Route::FilesPut,
        Route::FilesGet,
    ]
    .into_iter()
    .map(|r| w.request_count(r))
    .sum()
}

fn all_requests(w: &BlockingDevWorker) -> u64 {
    mutations(w) + w.request_count(Route::Health) + w.request_count(Route::MachinesList)
}

/// `smolbox run --store db ARGS…` through `shell`.
fn run_in(w: &BlockingDevWorker, shell: &str, db: &str, args: &[&str]) -> std::process::Output {
    let mut all = vec!["run", "--store", db];
    all.extend_from_slice(args);
    run(w, shell, &all)
}

/// `o` exited with `exit` and its stderr names `reason`.
fn refused(o: &std::process::Output, exit: i32, reason: &str) {
    assert_eq!(code(o), exit, "{}", stderr(o));
    assert!(stderr(o).contains(reason), "{}", stderr(o));
}

#[test]
fn the_command_reads_its_input_and_its_output_is_written_back() {
    let w = devworker(None);
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("x.db");
    let db = db.to_str().unwrap();
    let input = dir.path().join("in.txt");
    std::fs::write(&input, b"hello from the host\n").unwrap();
    for shell in SHELLS {
        let out = dir.path().join(format!("out-{shell}.txt"));
        // An older file under the output's name is replaced.
        std::fs::write(&out, b"old").unwrap();
        let script =
            "cat in.txt; printf 'OUTPUT-%s' \"$(wc -c < in.txt | tr -d ' ')\" > result.bin";
        let o = run(
            &w,
            shell,
            &[
                "--json",
                "run",
                "--store",
                db,
                "--input",
                &format!("{}:/workspace/in.txt", input.display()),
                "--output",
                &format!("/workspace/result.bin:{}", out.display()),
                "--",
                "sh",
                "-c",
                script,
            ],
        );
        assert_eq!(code(&o), 0, "{shell}: {}", stderr(&o));
        let v = json(&o);
        assert_eq!(v["stdout"], "hello from the host\n", "{v}");
        assert_eq!(v["state"], "completed", "{v}");
        let expected = b"OUTPUT-20";
        assert_eq!(std::fs::read(&out).unwrap(), expected);
        // Paths, sizes and digests; never the output's bytes.
        assert_eq!(v["outputs"][0]["path"], "/workspace/result.bin", "{v}");
        assert_eq!(v["outputs"][0]["size"], expected.len(), "{v}");
        assert_eq!(v["outputs"][0]["sha256"], hex(expected), "{v}");
        assert_eq!(v["delivered"][0]["local"], out.display().to_string(), "{v}");
        assert_eq!(v["inputs"][0]["path"], "/workspace/in.txt", "{v}");
        assert_eq!(
            v["inputs"][0]["sha256"],
            hex(b"hello from the host\n"),
            "{v}"
        );
        assert!(!v.to_string().contains("OUTPUT-"), "{v}");
        // No temporary file is left beside the output.
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(".smolbox"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
        // The disposable machine is gone from the worker.
        assert!(machine_names(&w, shell).is_empty(), "{shell}");
        // `records show` lists the files (path, size, digest).
        let id = v["id"].as_str().unwrap();
        let shown = run(&w, shell, &["records", "show", id, "--store", db]);
        let text = stdout(&shown);
        assert!(
            text.contains(&format!(
                "outputs: /workspace/result.bin 9 bytes sha256 {}",
                hex(expected)
            )),
            "{text}"
        );
        assert!(
            text.contains("inputs: /workspace/in.txt 20 bytes"),
            "{text}"
        );
        assert!(!text.contains("OUTPUT-"), "{text}");
    }
    // `records ls` counts them.
    let ls = run(&w, "tokio", &["records", "ls", "--store", db]);
    assert!(stdout(&ls).contains("1/1"), "{}", stdout(&ls));
}

#[test]
fn a_missing_input_is_refused_before_any_worker_request() {
    let w = devworker(None);
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("x.db");
    let db = db.to_str().unwrap();
    let missing = dir.path().join("nope.txt");
    for shell in SHELLS {
        let o = run_in(
            &w,
            shell,
            db,
            &[
                "--input",
                &format!("{}:/workspace/x", missing.display()),
                "--",
                "true",
            ],
        );
        assert_eq!(code(&o), 1, "{}", stderr(&o));
        let err = stderr(&o);
        assert!(err.contains("nope.txt"), "{err}");
        assert!(err.contains("nothing was sent"), "{err}");
        // A bad flag shape, a relative guest path: refused too (exit 2).
        for bad in ["no-colon", "in.txt:relative/path", ":/workspace/x"] {
            let o = run_in(&w, shell, db, &["--input", bad, "--", "true"]);
            assert_eq!(code(&o), 2, "{bad}: {}", stderr(&o));
            assert!(stderr(&o).contains("nothing was sent"), "{}", stderr(&o));
        }
    }
    assert_eq!(all_requests(&w), 0, "the worker was asked something");
    // A guest path outside the transfer root: refused by the runtime at
    // submit, before any mutation (only the health read of admission).
    let present = dir.path().join("present.txt");
    std::fs::write(&present, b"x").unwrap();
    for shell in SHELLS {
        let o = run_in(
            &w,
            shell,
            db,
            &[
                "--input",
                &format!("{}:/etc/x", present.display()),
                "--",
                "true",
            ],
        );
        refused(&o, 2, "path_outside_upload_roots");
    }
    assert_eq!(mutations(&w), 0, "a mutation reached the worker");
    // Nothing was recorded either.
    let ls = run(&w, "tokio", &["--json", "records", "ls", "--store", db]);
    assert_eq!(json(&ls).as_array().unwrap().len(), 0);
}

/// `count` inputs of `size` bytes each in `dir`, as `--input` arguments.
fn inputs(dir: &Path, count: usize, size: usize) -> Vec<String> {
    (0..count)
        .flat_map(|i| {
            let p = dir.join(format!("f{i}"));
            std::fs::write(&p, vec![b'a' + (i % 26) as u8; size]).unwrap();
            [
                "--input".to_owned(),
                format!("{}:/workspace/f{i}", p.display()),
            ]
        })
        .collect()
}

fn run_with(
    w: &BlockingDevWorker,
    db: &str,
    files: &[String],
    script: &str,
) -> std::process::Output {
    let mut args: Vec<&str> = vec!["--json", "run", "--store", db];
    args.extend(files.iter().map(String::as_str));
    args.extend(["--", "sh", "-c", script]);
    run(w, "tokio", &args)
}

#[test]
fn thirty_two_inputs_are_staged_and_thirty_three_refused_before_anything() {
    let w = devworker(None);
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("x.db");
    let db = db.to_str().unwrap();
    let n = inputs(dir.path(), 32, 3);
    let o = run_with(&w, db, &n, "cat f0 f31 | wc -c; ls | wc -l");
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let v = json(&o);
    assert_eq!(v["stdout"], "6\n32\n", "{v}");
    assert_eq!(v["inputs"].as_array().unwrap().len(), 32);
    let before = all_requests(&w);
    let n1 = inputs(dir.path(), 33, 3);
    let o = run_with(&w, db, &n1, "true");
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("too_many_files"), "{err}");
    assert!(err.contains("nothing was sent"), "{err}");
    assert_eq!(all_requests(&w), before);
}

#[test]
fn one_mib_per_file_and_four_mib_in_all_hold_at_n_and_refuse_n_plus_one() {
    let w = devworker(None);
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("x.db");
    let db = db.to_str().unwrap();
    const MIB: usize = 1_048_576;
    // N: four files of exactly 1 MiB (4 MiB in all).
    let n = inputs(dir.path(), 4, MIB);
    let o = run_with(&w, db, &n, "cat f0 f1 f2 f3 | wc -c");
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(json(&o)["stdout"], format!("{}\n", 4 * MIB));
    let before = all_requests(&w);
    // N + 1 in all: one more byte in a fifth file.
    let mut n1 = n.clone();
    let extra = dir.path().join("extra");
    std::fs::write(&extra, b"x").unwrap();
    n1.extend([
        "--input".to_owned(),
        format!("{}:/workspace/extra", extra.display()),
    ]);
    let o = run_with(&w, db, &n1, "true");
    refused(&o, 2, "manifest_over_aggregate");
    // N + 1 for one file: 1 MiB + 1 byte.
    let big = dir.path().join("big");
    std::fs::write(&big, vec![0u8; MIB + 1]).unwrap();
    let o = run_with(
        &w,
        db,
        &[
            "--input".to_owned(),
            format!("{}:/workspace/big", big.display()),
        ],
        "true",
    );
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("input_over_per_file"), "{err}");
    assert!(err.contains("nothing was sent"), "{err}");
    assert_eq!(all_requests(&w), before);
}

#[test]
fn an_output_at_its_maximum_is_written_and_one_byte_more_is_not() {
    let w = devworker(None);
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("x.db");
    let db = db.to_str().unwrap();
    for (size, ok) in [(100, true), (101, false)] {
        let out = dir.path().join(format!("out-{size}"));
        let o = run(
            &w,
            "blocking",
            &[
                "--json",
                "run",
                "--store",
                db,
                "--output",
                &format!("/workspace/o:{}", out.display()),
                "--output-max",
                "100",
                "--",
                "sh",
                "-c",
                &format!("head -c {size} /dev/zero > o"),
            ],
        );
        if ok {
            assert_eq!(code(&o), 0, "{}", stderr(&o));
            assert_eq!(std::fs::read(&out).unwrap().len(), 100);
            assert_eq!(json(&o)["outputs"][0]["size"], 100);
        } else {
            // The exit (0) is kept; the collection failed and says so.
            assert_ne!(code(&o), 0, "{}", stderr(&o));
            assert!(stderr(&o).contains("not all collected"), "{}", stderr(&o));
            assert!(!out.exists());
        }
        assert!(machine_names(&w, "tokio").is_empty());
    }
    // The maxima's own bounds: 1 MiB each, 4 MiB in all; refused before
    // anything.
    let before = all_requests(&w);
    let five: Vec<String> = (0..5)
        .flat_map(|i| {
            [
                "--output".to_owned(),
                format!(
                    "/workspace/o{i}:{}",
                    dir.path().join(format!("l{i}")).display()
                ),
            ]
        })
        .collect();
    let mut args: Vec<&str> = vec!["run", "--store", db, "--output-max", "1048576"];
    args.extend(five.iter().map(String::as_str));
    args.extend(["--", "true"]);
    let o = run(&w, "tokio", &args);
    refused(&o, 2, "manifest_over_aggregate");
    let o = run_in(
        &w,
        "tokio",
        db,
        &[
            "--output",
            "/workspace/o",
            "--output-max",
            "1048577",
            "--",
            "true",
        ],
    );
    refused(&o, 2, "output_max_range");
    // Two outputs to one local file.
    let same = dir.path().join("same").display().to_string();
    let o = run_in(
        &w,
        "tokio",
        db,
        &[
            "--output",
            &format!("/workspace/a:{same}"),
            "--output",
            &format!("/workspace/b:{same}"),
            "--",
            "true",
        ],
    );
    refused(&o, 2, "output_local_duplicate");
    assert_eq!(all_requests(&w), before);
}

#[test]
fn a_detached_run_with_files_runs_at_wait_and_keeps_its_outputs_in_the_artifact_directory() {
    let w = devworker(None);
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("x.db");
    let db = db.to_str().unwrap();
    let input = dir.path().join("in.txt");
    std::fs::write(&input, b"detached input\n").unwrap();
    let input_arg = format!("{}:/workspace/in.txt", input.display());
    for shell in SHELLS {
        // A local file for an output of a detached run: refused, nothing sent.
        let before = all_requests(&w);
        let o = run(
            &w,
            shell,
            &[
                "run",
                "--detach",
                "--store",
                db,
                "--output",
                "/workspace/o:./o",
                "--",
                "true",
            ],
        );
        refused(&o, 2, "detach_output_local");
        assert_eq!(all_requests(&w), before);

        let id = format!("det-{shell}");
        let d = run(
            &w,
            shell,
            &[
                "run",
                "--detach",
                "--store",
                db,
                "--id",
                &id,
                "--input",
                &input_arg,
                "--output",
                "/workspace/copy.txt",
                "--",
                "sh",
                "-c",
                "cat in.txt; cp in.txt copy.txt",
            ],
        );
        assert_eq!(code(&d), 0, "{}", stderr(&d));
        assert_eq!(stdout(&d).trim(), id);
        // The input is already in the artifact directory: changing the
        // local file now changes nothing.
        std::fs::write(&input, b"changed\n").unwrap();
        let wt = run(&w, shell, &["--json", "wait", &id, "--store", db]);
        assert_eq!(code(&wt), 0, "{}", stderr(&wt));
        let v = json(&wt);
        assert_eq!(v["stdout"], "detached input\n", "{v}");
        assert_eq!(v["outputs"][0]["path"], "/workspace/copy.txt", "{v}");
        assert_eq!(v["outputs"][0]["sha256"], hex(b"detached input\n"), "{v}");
        assert_eq!(v["cleanup"], "complete", "{v}");
        let kept = dir
            .path()
            .join("x.artifacts/outputs/cli")
            .join(&id)
            .join("out00");
        assert_eq!(std::fs::read(&kept).unwrap(), b"detached input\n");
        assert!(
            machine_names(&w, shell).is_empty(),
            "{shell}: a machine was left"
        );
        std::fs::write(&input, b"detached input\n").unwrap();
    }
}

#[test]
fn the_same_run_with_files_under_one_id_runs_once_and_delivers_again() {
    let w = devworker(None);
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("x.db");
    let db = db.to_str().unwrap();
    let input = dir.path().join("in.txt");
    std::fs::write(&input, b"once\n").unwrap();
    let counter = dir.path().join("count");
    let out = dir.path().join("out.txt");
    let script = format!(
        "echo ran >> {}; cp in.txt out.txt; exit 4",
        counter.display()
    );
    let input_arg = format!("{}:/workspace/in.txt", input.display());
    let output_arg = format!("/workspace/out.txt:{}", out.display());
    let args = [
        "run",
        "--store",
        db,
        "--id",
        "same-1",
        "--input",
        &input_arg,
        "--output",
        &output_arg,
        "--",
        "sh",
        "-c",
        &script,
    ];
    let first = run(&w, "tokio", &args);
    assert_eq!(code(&first), 4, "{}", stderr(&first));
    assert_eq!(std::fs::read(&out).unwrap(), b"once\n");
    std::fs::remove_file(&out).unwrap();
    let again = run(&w, "blocking", &args);
    refused(&again, 4, "not run again");
    assert_eq!(common::lines(&counter), 1, "the command ran twice");
    // Delivered again from the artifact directory, checked.
    assert_eq!(std::fs::read(&out).unwrap(), b"once\n");
    // Another input under the same id: another spec.
    std::fs::write(&input, b"other\n").unwrap();
    let changed = run(&w, "tokio", &args);
    refused(&changed, 8, "identity_conflict");
    assert_eq!(common::lines(&counter), 1);
}

#[test]
fn a_streamed_run_reads_its_input() {
    let w = devworker(None);
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("x.db");
    let db = db.to_str().unwrap();
    let input = dir.path().join("in.txt");
    std::fs::write(&input, b"streamed input\n").unwrap();
    for shell in SHELLS {
        let o = run(
            &w,
            shell,
            &[
                "run",
                "--stream",
                "--store",
                db,
                "--input",
                &format!("{}:/workspace/in.txt", input.display()),
                "--",
                "cat",
                "in.txt",
            ],
        );
        assert_eq!(code(&o), 0, "{shell}: {}", stderr(&o));
        assert_eq!(stdout(&o), "streamed input\n");
    }
}

/// Issue 12: `exec MACHINE --input/--output` into a managed machine's
/// slot, as a user would: the input arrives with its digest (the command
/// hashes it), the outputs come back with the right bytes, the guest's
/// exit code is the CLI's; an output one byte over `--output-max` fails
/// the collection with the exit kept and the slot kept (the next `exec`
/// is refused as busy); `--stream` streams the output and moves the files
/// the same way. Files into a machine that is not a managed one are
/// refused before any worker request.
#[test]
fn exec_into_a_managed_slot_stages_inputs_and_collects_outputs() {
    let w = devworker(None);
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("slot.db");
    let db = db.to_str().unwrap();
    let local = dir.path().join("in.txt");
    std::fs::write(&local, b"slot bytes\n").unwrap();
    let input = format!("{}:/workspace/in.txt", local.display());
    for shell in SHELLS {
        let sb = |args: &[&str]| {
            let mut all = vec!["--store", db];
            all.extend_from_slice(args);
            let mut c = common::smolbox();
            c.env("SMOLBOX_LEASE_TTL_MS", "1000")
                .args(["--worker", &w.base_url(), "--shell", shell])
                .args(&all);
            c.output().unwrap()
        };
        let id = format!("fbox-{shell}");
        let c = sb(&["machine", "create", &id]);
        assert_eq!(code(&c), 0, "{shell}: {}", stderr(&c));
        let copy = dir.path().join(format!("copy-{shell}"));
        let sum = dir.path().join(format!("sum-{shell}"));
        let o = sb(&[
            "--json",
            "exec",
            &id,
            "--input",
            &input,
            "--output",
            &format!("/workspace/copy.txt:{}", copy.display()),
            "--output",
            &format!("/workspace/sum.txt:{}", sum.display()),
            "--",
            "sh",
            "-c",
            "cp in.txt copy.txt; sha256sum in.txt | cut -d' ' -f1 > sum.txt; echo ran; exit 4",
        ]);
        assert_eq!(code(&o), 4, "{shell}: {}", stderr(&o));
        let v = json(&o);
        assert_eq!(v["state"], "completed", "{v}");
        assert_eq!(v["stdout"], "ran\n", "{v}");
        assert_eq!(std::fs::read(&copy).unwrap(), b"slot bytes\n");
        assert_eq!(
            std::fs::read_to_string(&sum).unwrap().trim(),
            hex(b"slot bytes\n"),
            "the input arrived with its digest"
        );
        // Streamed: the output as it comes, the files as buffered.
        let back = dir.path().join(format!("back-{shell}"));
        let o = sb(&[
            "exec",
            &id,
            "--stream",
            "--input",
            &format!("{}:/workspace/in2.txt", local.display()),
            "--output",
            &format!("/workspace/in2.txt:{}", back.display()),
            "--",
            "sh",
            "-c",
            "cat in2.txt; exit 5",
        ]);
        assert_eq!(code(&o), 5, "{shell}: {}", stderr(&o));
        assert_eq!(stdout(&o), "slot bytes\n");
        assert!(stderr(&o).contains("(streamed)"), "{}", stderr(&o));
        assert_eq!(std::fs::read(&back).unwrap(), b"slot bytes\n");
        // An output one byte over its maximum: the exit (0) is kept, the
        // collection failed, the slot stays held.
        let big = dir.path().join(format!("big-{shell}"));
        let o = sb(&[
            "exec",
            &id,
            "--output",
            &format!("/workspace/big:{}", big.display()),
            "--output-max",
            "4",
            "--",
            "sh",
            "-c",
            "printf 12345 > big",
        ]);
        assert_ne!(code(&o), 0, "{}", stderr(&o));
        assert!(stderr(&o).contains("not all collected"), "{}", stderr(&o));
        assert!(!big.exists());
        let next = sb(&["exec", &id, "--", "true"]);
        assert_eq!(code(&next), 8, "busy: {}", stderr(&next));
        assert!(
            stderr(&next).contains("admission_exhausted"),
            "{}",
            stderr(&next)
        );
        let m = sb(&["--json", "machine", "get", &id]);
        assert_eq!(json(&m)["state"], "unknown", "{}", stdout(&m));
    }
    // Refusals before any worker request.
    let before = mutations(&w);
    let o = run(
        &w,
        "tokio",
        &[
            "--store", db, "exec", "nosuch", "--input", &input, "--", "true",
        ],
    );
    refused(&o, 2, "exec_files_need_managed_machine");
    assert_eq!(mutations(&w), before, "nothing sent");
}

/// A plain `run` (no files) carries the worker's profile since session 11,
/// so its controller's due scan may drive disposable records of the store
/// — but never one with declared files: it has no artifact directory to
/// stage them from. A detached run with an input stays `accepted` through
/// a plain `run` on the same store and worker (no create or upload for
/// it), and `wait` then runs it.
#[test]
fn a_plain_run_leaves_a_detached_run_with_files_to_wait() {
    let w = devworker(None);
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("p.db");
    let db = db.to_str().unwrap();
    let input = dir.path().join("in.txt");
    std::fs::write(&input, b"left for wait\n").unwrap();
    let input_arg = format!("{}:/workspace/in.txt", input.display());
    for shell in SHELLS {
        let id = format!("left-{shell}");
        let d = run_in(
            &w,
            shell,
            db,
            &[
                "--detach", "--id", &id, "--input", &input_arg, "--", "cat", "in.txt",
            ],
        );
        assert_eq!(code(&d), 0, "{shell}: {}", stderr(&d));
        let (creates, puts) = (
            w.request_count(Route::MachinesCreate),
            w.request_count(Route::FilesPut),
        );
        let p = run_in(&w, shell, db, &["--", "echo", "plain"]);
        assert_eq!(code(&p), 0, "{shell}: {}", stderr(&p));
        assert_eq!(stdout(&p), "plain\n", "{shell}");
        assert_eq!(
            w.request_count(Route::MachinesCreate),
            creates + 1,
            "{shell}: only the plain run's own machine"
        );
        assert_eq!(w.request_count(Route::FilesPut), puts, "{shell}");
        let shown = run(
            &w,
            shell,
            &["--json", "--store", db, "records", "show", &id],
        );
        assert_eq!(json(&shown)["state"], "accepted", "{shell}");
        let wt = run(&w, shell, &["--json", "wait", &id, "--store", db]);
        assert_eq!(code(&wt), 0, "{shell}: {}", stderr(&wt));
        assert_eq!(json(&wt)["stdout"], "left for wait\n", "{shell}");
    }
}
