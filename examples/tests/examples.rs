//! Runs every example (built by `cargo test`, which compiles a package's
//! examples before its tests) and checks what it printed: each one talks
//! to an in-process devworker and must show the behaviour its text claims.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::path::PathBuf;
use std::process::Command;

/// `target/<profile>/examples/NAME`, beside this test's `deps/` directory.
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().and_then(|d| d.parent()).unwrap();
    let path = profile_dir.join("examples").join(name);
    assert!(
        path.exists(),
        "{} is not built: run `cargo test -p smolbox-examples` (which builds the examples) \
         or `cargo build -p smolbox-examples --examples`",
        path.display()
    );
    path
}

/// Runs the example; returns its stdout, failing on a non-zero exit.
fn run(name: &str) -> String {
    let out = Command::new(example(name)).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{name} failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn assert_lines(name: &str, expected: &[&str]) {
    let out = run(name);
    for line in expected {
        assert!(out.contains(line), "{name}: {line:?} missing from:\n{out}");
    }
}

#[test]
fn exec_examples_show_buffered_and_streamed_output() {
    for name in ["exec_blocking", "exec_tokio"] {
        assert_lines(
            name,
            &[
                r#"buffered: exit 3 stdout "hello" stderr "oops""#,
                r#"streamed: exit 0"#,
                r#""line-1\nline-2\nline-3""#,
                "machine demo deleted",
            ],
        );
    }
}

#[test]
fn terminal_examples_confirm_the_guest_exit() {
    for name in ["terminal_blocking", "terminal_tokio"] {
        assert_lines(
            name,
            &[
                "the guest answered hi-42",
                "the guest sees 30 rows x 100 columns",
                "terminal: confirmed exit 7",
            ],
        );
    }
}

#[test]
fn managed_examples_run_once_and_answer_the_resubmission_from_the_record() {
    for name in ["managed_blocking", "managed_tokio"] {
        assert_lines(
            name,
            &[
                "managed: accepted build-42 (existing: false)",
                r#"managed: state Completed, exit Some(3), stdout Some("built")"#,
                "managed: again: existing true, state Completed, exit Some(3); the worker ran it 1 time(s)",
            ],
        );
    }
}

#[test]
fn recovery_examples_record_unknown_and_never_resend() {
    for name in ["recovery_blocking", "recovery_tokio"] {
        assert_lines(
            name,
            &[
                "the first controller was killed with the record Dispatching",
                "the second controller recorded Unknown (evidence DispatchUncertain); the worker received 1 exec(s)",
            ],
        );
    }
}
