//! `smolbox dev up | status | down` driven as a new user would, in a fresh
//! HOME: the background devworker, its files and modes, later commands
//! finding it, and nothing left behind.

// Tests may unwrap: a failure is a test failure.
#![allow(clippy::unwrap_used)]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::{SHELLS, code, smolbox, stderr, stdout};

/// A fresh HOME (and XDG directories) for one user.
struct Home {
    dir: tempfile::TempDir,
}

impl Home {
    fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn dev_dir(&self) -> PathBuf {
        self.data().join("smolbox").join("dev")
    }

    fn cmd(&self) -> Command {
        let mut c = smolbox();
        c.env("HOME", self.dir.path())
            .env("XDG_DATA_HOME", self.data())
            .env("XDG_RUNTIME_DIR", self.dir.path().join("run"))
            .env("XDG_CONFIG_HOME", self.dir.path().join("config"));
        c
    }

    fn run(&self, args: &[&str]) -> Output {
        self.cmd().args(args).output().unwrap()
    }
}

impl Drop for Home {
    fn drop(&mut self) {
        // A failed test must not leave the background devworker running.
        let _ = self.run(&["dev", "down"]);
    }
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

/// True while the process exists and is not a zombie.
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next().map(str::to_owned));
            state.is_some_and(|s| s != "Z" && s != "X")
        }
        Err(_) => false,
    }
}

/// Waits (bounded by 20 s) until `pid` is gone.
fn gone_within(pid: i32) -> bool {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while alive(pid) {
        if std::time::Instant::now() > until {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    true
}

fn json(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", stdout(o)))
}

#[test]
fn dev_up_machine_create_exec_dev_down_leaves_nothing() {
    let home = Home::new();
    let o = home.run(&["dev", "status"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(stdout(&o).contains("not running"), "{}", stdout(&o));

    let o = home.run(&["--json", "dev", "up"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(stderr(&o).contains("WITHOUT isolation"), "{}", stderr(&o));
    let up = json(&o);
    let pid = i32::try_from(up["pid"].as_i64().unwrap()).unwrap();
    assert!(alive(pid), "pid {pid} runs");

    // The files: a 0700 directory, a 0600 token, the socket inside.
    let dir = home.dev_dir();
    assert_eq!(mode(&dir), 0o700);
    let token = dir.join("token");
    assert_eq!(mode(&token), 0o600);
    assert_eq!(std::fs::read_to_string(&token).unwrap().trim().len(), 64);
    assert_eq!(
        Path::new(up["socket"].as_str().unwrap()),
        dir.join("worker.sock")
    );
    assert!(dir.join("worker.sock").exists());

    // A second `dev up` finds it running and starts nothing.
    let o = home.run(&["--json", "dev", "up"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(json(&o)["pid"], up["pid"]);

    // Later commands use it (and say so once per command).
    // A managed machine: a record in the store, created and started on the
    // worker under the controller's name.
    let o = home.run(&["--json", "machine", "create", "dev"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(json(&o)["state"], "running", "{}", stdout(&o));
    let placed = json(&o)["worker_machine"].as_str().unwrap().to_owned();
    assert_eq!(
        stderr(&o).matches("using the local devworker").count(),
        1,
        "{}",
        stderr(&o)
    );
    let mut vmm = None;
    for shell in SHELLS {
        let o = home.run(&["--shell", shell, "exec", "dev", "--", "echo", "hi"]);
        assert_eq!(code(&o), 0, "{shell}: {}", stderr(&o));
        assert_eq!(stdout(&o), "hi\n", "{shell}");
        assert!(stderr(&o).contains("in the slot of managed machine dev"));
        assert_eq!(
            stderr(&o).matches("using the local devworker").count(),
            1,
            "{shell}: {}",
            stderr(&o)
        );
        let o = home.run(&[
            "--shell", shell, "--json", "machine", "--raw", "get", &placed,
        ]);
        assert_eq!(code(&o), 0, "{shell}: {}", stderr(&o));
        vmm = json(&o)["pid"].as_i64();
    }
    let vmm = i32::try_from(vmm.expect("the running machine has a pid")).unwrap();
    assert!(alive(vmm));

    let o = home.run(&["--json", "dev", "status"]);
    assert_eq!(code(&o), 0);
    assert_eq!(json(&o)["running"], true);

    let o = home.run(&["dev", "down"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(stdout(&o).contains("stopped"), "{}", stdout(&o));
    assert!(!alive(pid), "the devworker process {pid} is gone");
    // The machine's process was sent SIGKILL at shutdown; its end is
    // observed (bounded), not assumed.
    assert!(gone_within(vmm), "the machine's process {vmm} is gone");
    for f in ["worker.sock", "token", "pid"] {
        assert!(!dir.join(f).exists(), "{f} removed");
    }
    let o = home.run(&["--json", "dev", "status"]);
    assert_eq!(code(&o), 0);
    assert_eq!(json(&o)["running"], false);

    // With nothing running, a command starts its own in-process devworker.
    let o = home.run(&["run", "--", "echo", "in-process"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(stdout(&o), "in-process\n");
    assert!(stderr(&o).contains("in-process"), "{}", stderr(&o));
    assert!(!stderr(&o).contains("using the local devworker"));
}

#[test]
fn a_stale_pid_file_is_reported_and_replaced() {
    let home = Home::new();
    // A pid that surely is gone: a child that exited and was reaped.
    let mut child = Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let dir = home.dev_dir();
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("pid"), format!("{dead}\n")).unwrap();

    let o = home.run(&["--json", "dev", "status"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let v = json(&o);
    assert_eq!(v["running"], false);
    assert_eq!(v["stale_pid"], dead);

    // A command without --worker says so and runs in-process.
    let o = home.run(&["run", "--", "echo", "ok"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(stderr(&o).contains("stale pid file"), "{}", stderr(&o));

    // `dev up` replaces it; `dev down` stops the new one.
    let o = home.run(&["--json", "dev", "up"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(stderr(&o).contains("stale"), "{}", stderr(&o));
    let pid = i32::try_from(json(&o)["pid"].as_i64().unwrap()).unwrap();
    assert_ne!(u32::try_from(pid).unwrap(), dead);
    let o = home.run(&["dev", "down"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(!alive(pid));
}

#[test]
fn dev_down_with_nothing_running_is_not_an_error() {
    let home = Home::new();
    let o = home.run(&["--json", "dev", "down"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(json(&o)["stopped"], false);
}

#[test]
fn the_in_process_devworker_refuses_a_tokenless_neighbour() {
    use std::io::{BufRead, Read, Write};
    let home = Home::new();
    let mut child = home
        .cmd()
        .args(["run", "--timeout", "60", "--", "sleep", "60"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    err.read_line(&mut line).unwrap();
    let url = line
        .split("in-process at ")
        .nth(1)
        .and_then(|r| r.split(';').next())
        .unwrap_or_else(|| panic!("no URL in {line:?}"));
    let addr = url.trim().strip_prefix("http://").unwrap();
    // Another local process, without the token the CLI holds in memory.
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.write_all(b"GET /api/v1/machines HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n")
        .unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    assert!(reply.starts_with("HTTP/1.1 401"), "{reply}");
    let _ = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status();
    let status = child.wait().unwrap();
    assert!(!status.success());
}

/// The live processes whose command line names `dir` (our `dev serve`).
fn serving(dir: &Path) -> Vec<i32> {
    let want = dir.as_os_str().as_encoded_bytes();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.split(|b| *b == 0).any(|a| a == want))
        })
        .filter(|pid| alive(*pid))
        .collect()
}

#[test]
fn concurrent_dev_ups_start_one_devworker() {
    let home = Home::new();
    let children: Vec<_> = (0..4)
        .map(|_| {
            home.cmd()
                .args(["--json", "dev", "up"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let pids: Vec<i64> = children
        .into_iter()
        .map(|c| {
            let o = c.wait_with_output().unwrap();
            assert_eq!(code(&o), 0, "{}", stderr(&o));
            json(&o)["pid"].as_i64().unwrap()
        })
        .collect();
    assert!(pids.iter().all(|p| *p == pids[0]), "{pids:?}");
    let dir = home.dev_dir();
    assert_eq!(serving(&dir), vec![i32::try_from(pids[0]).unwrap()]);
    let o = home.run(&["dev", "down"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(serving(&dir).is_empty(), "a devworker was left behind");
}
