//! Shared helpers: a devworker on loopback and the built `smolbox` binary.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use smolbox_devworker::{BlockingDevWorker, DevWorker};

/// Both client shells: every user-facing case runs on each.
pub(crate) const SHELLS: [&str; 2] = ["tokio", "blocking"];

/// A devworker with the later profile (console logs, large files).
pub(crate) fn devworker(token: Option<&str>) -> BlockingDevWorker {
    DevWorker::start_blocking(
        DevWorker::builder()
            .version("1.22.0")
            .token(token)
            .quiet(true),
    )
    .expect("devworker starts")
}

/// The `smolbox` binary with a clean environment for worker selection and
/// a data directory of this test process (under the target directory), so
/// neither the user's store nor a `smolbox dev up` of theirs is touched or
/// used. The machines it creates on the test's devworker (a named worker,
/// so no default image) are image machines, as a user of a real worker
/// gets with `--image` (terminals, long commands and large files need one).
pub(crate) fn smolbox() -> Command {
    let home =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("cli-home-{}", std::process::id()));
    let mut c = Command::new(env!("CARGO_BIN_EXE_smolbox"));
    c.env_remove("SMOLBOX_WORKER")
        .env_remove("SMOLBOX_TOKEN")
        .env_remove("SMOLBOX_STORE")
        .env("SMOLBOX_IMAGE", "alpine:3.19")
        .env("HOME", &home)
        .env("XDG_DATA_HOME", home.join("data"));
    c
}

/// Runs `smolbox --worker URL --shell SHELL ARGS…`.
pub(crate) fn run(worker: &BlockingDevWorker, shell: &str, args: &[&str]) -> Output {
    smolbox()
        .args(["--worker", &worker.base_url(), "--shell", shell])
        .args(args)
        .output()
        .expect("smolbox runs")
}

/// stdout as text.
pub(crate) fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// stderr as text.
pub(crate) fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The exit code (a signal death fails the test).
pub(crate) fn code(o: &Output) -> i32 {
    o.status.code().expect("exited, not signalled")
}

/// stdout as one JSON value (a failed parse fails the test, showing it).
pub(crate) fn json(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", stdout(o)))
}

/// Lines in the file at `p` (0 when it does not exist): how often a test
/// command that appends to it ran.
pub(crate) fn lines(p: &Path) -> usize {
    std::fs::read_to_string(p).map_or(0, |s| s.lines().count())
}

/// Runs `args` again after a first run with the same id: the recorded
/// exit `code`, a note that the command was not run again, no output,
/// and still one line in the command's `counter` file.
pub(crate) fn assert_not_run_again(
    worker: &BlockingDevWorker,
    shell: &str,
    args: &[&str],
    exit: i32,
    counter: &Path,
) {
    let again = run(worker, shell, args);
    assert_eq!(code(&again), exit, "{shell}: {}", stderr(&again));
    assert!(
        stderr(&again).contains("not run again"),
        "{}",
        stderr(&again)
    );
    assert_eq!(stdout(&again), "");
    assert_eq!(lines(counter), 1, "{shell}: the command ran twice");
}

/// The machine names `machine ls --json` reports.
pub(crate) fn machine_names(worker: &BlockingDevWorker, shell: &str) -> Vec<String> {
    let o = run(worker, shell, &["--json", "machine", "--raw", "ls"]);
    assert_eq!(code(&o), 0, "ls failed: {}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("ls --json is JSON");
    v.as_array()
        .expect("an array")
        .iter()
        .map(|m| m["name"].as_str().expect("a name").to_owned())
        .collect()
}

/// A store partition no other test or earlier run uses: `prefix` (one
/// letter) and 9 base-36 digits of the time.
pub(crate) fn fresh_partition(prefix: char) -> String {
    let mut v = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
        / 1_000;
    let mut partition = String::from(prefix);
    while partition.len() < 10 {
        partition.push(char::from_digit((v % 36) as u32, 36).unwrap());
        v /= 36;
    }
    partition
}

/// A fresh HOME (and XDG directories) for one user.
pub(crate) struct Home {
    pub(crate) dir: tempfile::TempDir,
}

impl Home {
    pub(crate) fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    pub(crate) fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    pub(crate) fn cmd(&self) -> Command {
        let mut c = smolbox();
        c.env("HOME", self.dir.path())
            .env("XDG_DATA_HOME", self.data())
            .env("XDG_RUNTIME_DIR", self.dir.path().join("run"))
            .env("XDG_CONFIG_HOME", self.dir.path().join("config"));
        c
    }

    pub(crate) fn run(&self, args: &[&str]) -> Output {
        self.cmd().args(args).output().unwrap()
    }
}

impl Drop for Home {
    fn drop(&mut self) {
        // A failed test must not leave the background devworker running.
        let _ = self.run(&["dev", "down"]);
    }
}
