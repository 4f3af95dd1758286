//! `smolbox shell` through a real terminal: tmux runs the command in a
//! pane; keys are typed with `send-keys` and the screen is read with
//! `capture-pane`, polled against a deadline (no sleeps on observable
//! things). When the command ends the wrapper records the exit code and
//! the terminal settings, which must be back out of raw mode. Managed
//! machines (the default) get a managed terminal in their slot, whose
//! record is then read with `records show`; `machine --raw` ones the
//! worker's terminal directly. `Ctrl-]` then `.` is the local close.

// Tests may unwrap: a failure is a test failure.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{SHELLS, code, devworker, run, stderr, stdout};
use smolbox_devworker::{BlockingDevWorker, Fault, Route};

const DEADLINE: Duration = Duration::from_secs(15);

fn tmux(socket: &Path, args: &[&str]) -> std::process::Output {
    Command::new("tmux")
        .arg("-S")
        .arg(socket)
        .args(args)
        .output()
        .expect("tmux runs (scripts/test.sh installs it)")
}

fn capture(socket: &Path, target: &str) -> String {
    String::from_utf8_lossy(&tmux(socket, &["capture-pane", "-p", "-t", target]).stdout)
        .into_owned()
}

/// Polls `check` until it holds or the deadline passes (then fails,
/// showing the pane).
fn wait_for(
    what: &str,
    socket: &Path,
    target: &str,
    mut check: impl FnMut() -> Option<String>,
) -> String {
    let until = Instant::now() + DEADLINE;
    loop {
        if let Some(v) = check() {
            return v;
        }
        if Instant::now() >= until {
            panic!(
                "timed out waiting for {what}; the pane shows:\n{}",
                capture(socket, target)
            );
        }
        std::thread::sleep(Duration::from_millis(20)); // polling interval, not a wait on an event
    }
}

/// A screen line showing `output` (perhaps after a prompt printed late),
/// not the typed command line.
fn is_output(line: &str, output: &str, command: &str) -> bool {
    line.trim_end().ends_with(output) && !line.contains(command)
}

/// Kills the tmux server of this test when dropped.
struct Server<'a>(&'a Path);

impl Drop for Server<'_> {
    fn drop(&mut self) {
        let _ = tmux(self.0, &["kill-server"]);
    }
}

/// A `smolbox shell` running in a tmux pane; when it ends, the wrapper
/// script writes its exit code to `result` and `stty -a` to `result.stty`.
struct Pane {
    target: String,
    result: PathBuf,
}

/// The store every command of a test uses.
fn store(dir: &Path) -> String {
    dir.join("store.db").to_str().unwrap().to_owned()
}

/// `smolbox --store DB ARGS…` against `w` on `shell`.
fn sb(w: &BlockingDevWorker, shell: &str, dir: &Path, args: &[&str]) -> std::process::Output {
    run(w, shell, &[&["--store", &store(dir)], args].concat())
}

/// A managed machine `m`, created and started; its worker machine's name.
fn managed_machine(w: &BlockingDevWorker, shell: &str, dir: &Path, m: &str) -> String {
    let o = sb(w, shell, dir, &["--json", "machine", "create", m]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["state"], "running", "{v}");
    v["worker_machine"].as_str().unwrap().to_owned()
}

/// The execution id the pane's `smolbox shell` printed (`execution t-…:`).
fn execution_id(screen: &str) -> Option<String> {
    let at = screen.find("execution t-")? + "execution ".len();
    let id: String = screen[at..]
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
        .collect();
    (id.len() > 2).then_some(id)
}

/// `records show ID --json`.
fn record(w: &BlockingDevWorker, shell: &str, dir: &Path, id: &str) -> serde_json::Value {
    let o = sb(w, shell, dir, &["--json", "records", "show", id]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", stdout(&o)))
}

impl Pane {
    fn start(socket: &Path, dir: &Path, w: &BlockingDevWorker, shell: &str, m: &str) -> Self {
        Self::start_named(socket, dir, w, shell, m, m)
    }

    /// As [`Pane::start`], the pane (and its files) named `tag`.
    fn start_named(
        socket: &Path,
        dir: &Path,
        w: &BlockingDevWorker,
        shell: &str,
        m: &str,
        tag: &str,
    ) -> Self {
        let result = dir.join(format!("result-{shell}-{tag}"));
        let script = dir.join(format!("run-{shell}-{tag}.sh"));
        std::fs::write(
            &script,
            format!(
                "{bin} --worker {url} --shell {shell} --store {db} shell {m}\n\
                 code=$?\n\
                 stty -a > {result}.stty\n\
                 echo \"$code\" > {result}.tmp && mv {result}.tmp {result}\n\
                 exec cat\n",
                bin = env!("CARGO_BIN_EXE_smolbox"),
                url = w.base_url(),
                db = store(dir),
                result = result.display(),
            ),
        )
        .unwrap();
        let session = format!("t-{shell}-{tag}");
        let o = tmux(
            socket,
            &[
                "new-session",
                "-d",
                "-s",
                &session,
                "-x",
                "200",
                "-y",
                "30",
                "sh",
                script.to_str().unwrap(),
            ],
        );
        assert!(o.status.success(), "tmux new-session failed");
        Self {
            target: format!("{session}:0.0"),
            result,
        }
    }

    fn keys(&self, socket: &Path, keys: &str) {
        tmux(socket, &["send-keys", "-t", &self.target, keys, "Enter"]);
    }

    /// Waits for the wrapper's record: the exit code, and checks that the
    /// tty is out of raw mode again.
    fn finish(&self, socket: &Path, shell: &str) -> i32 {
        let exit = wait_for("the exit code file", socket, &self.target, || {
            std::fs::read_to_string(&self.result).ok()
        });
        let stty = std::fs::read_to_string(format!("{}.stty", self.result.display())).unwrap();
        let words: Vec<&str> = stty.split_whitespace().collect();
        for flag in ["icanon", "echo", "isig"] {
            assert!(
                words.contains(&flag),
                "{shell}: tty not restored ({flag}): {stty}"
            );
        }
        exit.trim().parse().unwrap()
    }
}

#[test]
fn shell_echoes_exits_with_the_guest_code_and_restores_the_tty() {
    let w = devworker(None);
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("tmux.sock");
    let _server = Server(&socket);
    for shell in SHELLS {
        let m = format!("sh-{shell}");
        managed_machine(&w, shell, dir.path(), &m);
        let pane = Pane::start(&socket, dir.path(), &w, shell, &m);
        let target = pane.target.clone();
        let on_screen = |what: &str, check: &dyn Fn(&str) -> bool| {
            wait_for(what, &socket, &target, || {
                let screen = capture(&socket, &target);
                screen.lines().any(check).then_some(screen)
            })
        };
        // The managed terminal's execution id, on stderr before any key.
        let screen = on_screen("the execution id", &|l| l.contains("execution t-"));
        let id = execution_id(&screen).unwrap();
        assert!(
            screen.contains("in the slot of managed machine"),
            "{screen}"
        );

        // Type a command and see its output on its own line.
        pane.keys(&socket, "echo hi-from-$((40+2))");
        on_screen("the echoed output", &|l| is_output(l, "hi-from-42", "echo"));

        // Ctrl-C goes to the guest as a byte: it interrupts the guest's
        // `sleep`, and smolbox keeps running (the next command answers).
        // (Each step waits for the previous one on screen: the PTY
        // discards unread input when it sees the interrupt.)
        pane.keys(&socket, "sleep 30");
        on_screen("the sleep to be typed", &|l| l.contains("sleep 30"));
        tmux(&socket, &["send-keys", "-t", &target, "C-c", ""]);
        on_screen("the interrupt echoed", &|l| l.contains("^C"));
        pane.keys(&socket, "echo after-$((1+1))");
        on_screen("output after Ctrl-C", &|l| is_output(l, "after-2", "echo"));

        // A window resize reaches the guest's PTY.
        tmux(
            &socket,
            &["resize-window", "-t", &target, "-x", "91", "-y", "27"],
        );
        wait_for("the new size in the guest", &socket, &target, || {
            pane.keys(&socket, "stty size");
            let screen = capture(&socket, &target);
            screen
                .lines()
                .any(|l| is_output(l, "27 91", "stty"))
                .then_some(screen)
        });

        // A Ctrl-] followed by another key is sent as both (the guest's
        // shell sees the pair and keeps running).
        pane.keys(&socket, "echo esc-$((2+3))");
        on_screen("output before the exit", &|l| is_output(l, "esc-5", "echo"));

        pane.keys(&socket, "exit 5");
        assert_eq!(
            pane.finish(&socket, shell),
            5,
            "{shell}: the guest's exit code"
        );
        // The record: completed with the confirmed exit, slot released.
        let r = record(&w, shell, dir.path(), &id);
        assert_eq!(r["state"], "completed", "{r}");
        assert_eq!(r["exit_code"], 5, "{r}");
        assert_eq!(r["managed_machine"], m.as_str(), "{r}");
        let ls = sb(
            &w,
            shell,
            dir.path(),
            &["--json", "records", "ls", "--machine", &m],
        );
        let ls: serde_json::Value = serde_json::from_slice(&ls.stdout).unwrap();
        assert_eq!(ls.as_array().unwrap().len(), 1, "{ls}");
        let g = sb(&w, shell, dir.path(), &["--json", "machine", "get", &m]);
        let g: serde_json::Value = serde_json::from_slice(&g.stdout).unwrap();
        assert!(g["active_execution"].is_null(), "{g}");
        // The terminal released its claims as it ended (the CLI's TTL is
        // 30 s): the machine's claim is over, and the next command runs.
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        assert!(
            g["claim_until_ms"].as_u64().is_none_or(|u| u <= now),
            "released: {g} at {now}"
        );
        let e = sb(
            &w,
            shell,
            dir.path(),
            &["exec", &m, "--", "echo", "after-shell"],
        );
        assert_eq!(code(&e), 0, "{shell}: {}", stderr(&e));
        assert_eq!(stdout(&e), "after-shell\n");
    }
}

#[test]
fn the_escape_closes_the_session_from_here() {
    let w = devworker(None);
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("tmux.sock");
    let _server = Server(&socket);
    for shell in SHELLS {
        // On a worker's machine used directly, and on a managed one.
        let raw = format!("raw-{shell}");
        assert_eq!(
            code(&sb(
                &w,
                shell,
                dir.path(),
                &["machine", "--raw", "create", &raw]
            )),
            0
        );
        let managed = format!("esc-{shell}");
        managed_machine(&w, shell, dir.path(), &managed);
        for m in [&raw, &managed] {
            let pane = Pane::start(&socket, dir.path(), &w, shell, m);
            let target = pane.target.clone();
            let on_screen = |what: &str, check: &dyn Fn(&str) -> bool| {
                wait_for(what, &socket, &target, || {
                    let screen = capture(&socket, &target);
                    screen.lines().any(check).then_some(screen)
                })
            };
            pane.keys(&socket, "echo up-$((3+4))");
            on_screen("the shell answering", &|l| is_output(l, "up-7", "echo"));
            // `Ctrl-] ?` shows the escapes (nothing is sent).
            tmux(&socket, &["send-keys", "-t", &target, "C-]", "?"]);
            on_screen("the escape help", &|l| l.contains("Local escapes"));
            // `Ctrl-] .` closes the session from here: the guest never
            // exited by itself, so its end is not confirmed (exit 3).
            tmux(&socket, &["send-keys", "-t", &target, "C-]", "."]);
            let exit = pane.finish(&socket, shell);
            let screen = capture(&socket, &target);
            assert!(screen.contains("closing the session"), "{screen}");
            assert_eq!(exit, 3, "{shell} {m}: {screen}");
            if m == &managed {
                // The record id is on stderr, and the record says unknown.
                let id = execution_id(&screen).unwrap();
                assert!(screen.contains(&format!("records show {id}")), "{screen}");
                assert_eq!(record(&w, shell, dir.path(), &id)["state"], "unknown");
            }
        }
    }
}

#[test]
fn shell_reports_an_unconfirmed_exit_as_uncertain_and_restores_the_tty() {
    let w = devworker(None);
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("tmux.sock");
    let _server = Server(&socket);
    for shell in SHELLS {
        let m = format!("cb-{shell}");
        let placed = managed_machine(&w, shell, dir.path(), &m);
        // The worker closes without the exit frame: the end is not confirmed.
        w.faults()
            .on_machine(Route::Terminal, &placed, Fault::CloseBeforeExit);
        let pane = Pane::start(&socket, dir.path(), &w, shell, &m);
        pane.keys(&socket, "exit 0");
        assert_eq!(
            pane.finish(&socket, shell),
            3,
            "{shell}: uncertain is exit code 3"
        );
        let screen = capture(&socket, &pane.target);
        assert!(screen.contains("evidence="), "{shell}: {screen}");
        let id = execution_id(&screen).unwrap();
        assert!(screen.contains(&format!("records show {id}")), "{screen}");
        let r = record(&w, shell, dir.path(), &id);
        assert_eq!(r["state"], "unknown", "{r}");
        assert!(r["exit_code"].is_null(), "{r}");
    }
}
