//! `cp` and `logs` on a managed machine verify its recorded incarnation
//! on the worker first (issue 15): once another machine holds its worker
//! name, both are refused with `identity_conflict` and nothing of the
//! other machine is read or written.

// Tests may unwrap: a failure is a test failure.
#![allow(clippy::unwrap_used)]

mod common;

use common::{SHELLS, code, devworker, json, smolbox, stderr, stdout};

#[test]
fn cp_and_logs_refuse_a_managed_machine_whose_name_another_incarnation_holds() {
    let w = devworker(None);
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("i.db");
    let db = db.to_str().unwrap();
    for shell in SHELLS {
        let id = format!("inc-{shell}");
        let sb = |args: &[&str]| {
            smolbox()
                .env("SMOLBOX_LEASE_TTL_MS", "1000")
                .args(["--worker", &w.base_url(), "--shell", shell, "--store", db])
                .args(args)
                .output()
                .unwrap()
        };
        let c = sb(&["--json", "machine", "create", &id]);
        assert_eq!(code(&c), 0, "{shell}: {}", stderr(&c));
        let name = json(&c)["worker_machine"].as_str().unwrap().to_owned();
        let local = dir.path().join(format!("f-{shell}"));
        std::fs::write(&local, b"bytes\n").unwrap();
        let remote = format!("{id}:/workspace/f");
        // The recorded incarnation: both work.
        let up = sb(&["cp", local.to_str().unwrap(), &remote]);
        assert_eq!(code(&up), 0, "{shell}: {}", stderr(&up));
        let logs = sb(&["logs", &id]);
        assert_eq!(code(&logs), 0, "{shell}: {}", stderr(&logs));
        // Another machine under the same worker name (made directly; its
        // size differs, so its identity does even within the same second of
        // the worker's creation time).
        let rm = sb(&["machine", "--raw", "rm", &name]);
        assert_eq!(code(&rm), 0, "{}", stderr(&rm));
        let other = sb(&["machine", "--raw", "create", &name, "--cpus", "2"]);
        assert_eq!(code(&other), 0, "{}", stderr(&other));
        let start = sb(&["machine", "--raw", "start", &name]);
        assert_eq!(code(&start), 0, "{}", stderr(&start));
        for args in [
            vec!["cp", local.to_str().unwrap(), &remote],
            vec![
                "cp",
                &remote,
                dir.path().join(format!("back-{shell}")).to_str().unwrap(),
            ],
            vec!["logs", &id],
            vec!["logs", "-f", &id],
        ] {
            let o = sb(&args);
            assert_ne!(code(&o), 0, "{shell} {args:?}: {}", stdout(&o));
            assert!(
                stderr(&o).contains("identity_conflict"),
                "{shell} {args:?}: {}",
                stderr(&o)
            );
        }
        assert!(!dir.path().join(format!("back-{shell}")).exists());
        // The other machine got nothing: its /workspace/f does not exist.
        let probe = sb(&["exec", &name, "--", "sh", "-c", "test ! -e /workspace/f"]);
        assert_eq!(code(&probe), 0, "{shell}: {}", stderr(&probe));
    }
}
