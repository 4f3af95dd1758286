//! A command's output over its allowance, as a user meets it: the
//! confirmed exit is kept and reported with the `output_limit` error
//! (AC-5.2.1), never a silent exit 0 with nothing printed; an outcome the
//! client could not read is `unknown` (exit 3), and `wait` returns at once
//! when the machine of that outcome is kept for its retention.

// Tests may unwrap: a failure is a test failure.
#![allow(clippy::unwrap_used)]

mod common;

use common::{Home, SHELLS, code, devworker, json, run, stderr, stdout};

/// The default output allowance (C5.2, C12.3): 1 MiB.
const ALLOWANCE: usize = 1_048_576;

/// A `sh -c` script printing `n` bytes of `x`, then exiting `exit`.
fn print(n: usize, exit: i32) -> String {
    format!("head -c {n} /dev/zero | tr '\\0' x; exit {exit}")
}

#[test]
fn output_at_the_allowance_is_printed_and_one_byte_over_is_output_limit_with_the_exit() {
    let w = devworker(None);
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("x.db");
    let db = db.to_str().unwrap();
    for shell in SHELLS {
        // `[--json] run --store DB -- sh -c SCRIPT` printing `n` bytes.
        let sh = |json: bool, n: usize, exit: i32| {
            let script = print(n, exit);
            let mut args = vec!["run", "--store", db, "--", "sh", "-c", &script];
            if json {
                args.insert(0, "--json");
            }
            run(&w, shell, &args)
        };
        // N: every byte printed, the guest's code.
        let at = sh(false, ALLOWANCE, 0);
        assert_eq!(code(&at), 0, "{shell}: {}", stderr(&at));
        assert_eq!(stdout(&at).len(), ALLOWANCE);
        assert!(!stderr(&at).contains("output_limit"), "{}", stderr(&at));

        // N + 1 with exit 0: the limit's code (7), nothing printed, and the
        // error says the command exited and with which code.
        let over = sh(false, ALLOWANCE + 1, 0);
        assert_eq!(code(&over), 7, "{shell}: {}", stderr(&over));
        assert!(stdout(&over).is_empty());
        let err = stderr(&over);
        assert!(err.contains("category=output_limit"), "{err}");
        assert!(err.contains("evidence=exited"), "{err}");
        assert!(err.contains("exit_code=0"), "{err}");
        assert!(!err.contains("before this process observed it"), "{err}");

        // N + 1 with exit 5: the guest's own code wins, the error is printed.
        let five = sh(false, ALLOWANCE + 1, 5);
        assert_eq!(code(&five), 5, "{shell}: {}", stderr(&five));
        assert!(stderr(&five).contains("exit_code=5"), "{}", stderr(&five));

        // --json: the error object on stderr carries the guest's code.
        let j = sh(true, ALLOWANCE + 1, 0);
        assert_eq!(code(&j), 7);
        let line = stderr(&j)
            .lines()
            .find(|l| l.starts_with('{'))
            .unwrap()
            .to_owned();
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["error"]["category"], "output_limit", "{v}");
        assert_eq!(v["error"]["guest_exit_code"], 0, "{v}");
        // The exit was observed: the effect is known.
        assert_eq!(v["error"]["effect_uncertain"], false, "{v}");
    }
}

#[test]
fn a_detached_run_whose_outcome_is_unknown_and_one_over_its_allowance_are_reported_by_wait() {
    let home = Home::new();
    let up = home.run(&["dev", "up"]);
    assert_eq!(code(&up), 0, "{}", stderr(&up));
    for shell in SHELLS {
        // Over the allowance with a confirmed exit 6: `wait` says so and
        // returns 6.
        let d = home.run(&[
            "--shell",
            shell,
            "run",
            "--detach",
            "--",
            "sh",
            "-c",
            &print(ALLOWANCE + 1, 6),
        ]);
        assert_eq!(code(&d), 0, "{shell}: {}", stderr(&d));
        let id = stdout(&d).trim().to_owned();
        let w = home.run(&["--shell", shell, "wait", &id]);
        assert_eq!(code(&w), 6, "{shell}: {}", stderr(&w));
        assert!(stdout(&w).is_empty());
        assert!(
            stderr(&w).contains("category=output_limit"),
            "{}",
            stderr(&w)
        );
        let shown = json(&home.run(&["--json", "records", "show", &id]));
        assert_eq!(shown["state"], "completed", "{shown}");
        assert_eq!(shown["exit_code"], 6, "{shown}");

        // A reply too large to read (raw bytes, 8 MiB response cap): no
        // exit was observed, so the outcome is unknown (exit 3). Its
        // machine is kept for the retention and `wait` says so instead of
        // waiting for a cleanup that is not due before then.
        let d = home.run(&[
            "--shell",
            shell,
            "run",
            "--detach",
            "--",
            "sh",
            "-c",
            "head -c 9000000 /dev/zero",
        ]);
        assert_eq!(code(&d), 0, "{shell}: {}", stderr(&d));
        let id = stdout(&d).trim().to_owned();
        let w = home.run(&["--shell", shell, "wait", &id]);
        assert_eq!(code(&w), 3, "{shell}: {}", stderr(&w));
        let err = stderr(&w);
        assert!(err.contains("kept for its retention"), "{err}");
        assert!(!err.contains("not cleaned up yet"), "{err}");
        let shown = json(&home.run(&["--json", "records", "show", &id]));
        assert_eq!(shown["state"], "unknown", "{shown}");
    }
}
