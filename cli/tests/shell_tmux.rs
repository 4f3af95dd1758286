//! `smolbox shell` through a real terminal: tmux runs the command in a
//! pane; keys are typed with `send-keys` and the screen is read with
//! `capture-pane`, polled against a deadline (no sleeps on observable
//! things). After `exit 3` the wrapper records the exit code and the
//! terminal settings, which must be back out of raw mode.

// Tests may unwrap: a failure is a test failure.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{SHELLS, code, devworker, run};
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

impl Pane {
    fn start(socket: &Path, dir: &Path, w: &BlockingDevWorker, shell: &str, m: &str) -> Self {
        let result = dir.join(format!("result-{shell}-{m}"));
        let script = dir.join(format!("run-{shell}-{m}.sh"));
        std::fs::write(
            &script,
            format!(
                "{bin} --worker {url} --shell {shell} shell {m}\n\
                 code=$?\n\
                 stty -a > {result}.stty\n\
                 echo \"$code\" > {result}.tmp && mv {result}.tmp {result}\n\
                 exec cat\n",
                bin = env!("CARGO_BIN_EXE_smolbox"),
                url = w.base_url(),
                result = result.display(),
            ),
        )
        .unwrap();
        let session = format!("t-{shell}-{m}");
        let o = tmux(
            socket,
            &[
                "new-session",
                "-d",
                "-s",
                &session,
                "-x",
                "100",
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
        assert_eq!(
            code(&run(&w, shell, &["machine", "--raw", "create", &m])),
            0
        );
        let pane = Pane::start(&socket, dir.path(), &w, shell, &m);
        let target = pane.target.clone();
        let on_screen = |what: &str, check: &dyn Fn(&str) -> bool| {
            wait_for(what, &socket, &target, || {
                let screen = capture(&socket, &target);
                screen.lines().any(check).then_some(screen)
            })
        };

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

        pane.keys(&socket, "exit 3");
        assert_eq!(
            pane.finish(&socket, shell),
            3,
            "{shell}: the guest's exit code"
        );
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
        assert_eq!(
            code(&run(&w, shell, &["machine", "--raw", "create", &m])),
            0
        );
        // The worker closes without the exit frame: the end is not confirmed.
        w.faults()
            .on_machine(Route::Terminal, &m, Fault::CloseBeforeExit);
        let pane = Pane::start(&socket, dir.path(), &w, shell, &m);
        pane.keys(&socket, "exit 0");
        assert_eq!(
            pane.finish(&socket, shell),
            3,
            "{shell}: uncertain is exit code 3"
        );
        let screen = capture(&socket, &pane.target);
        assert!(screen.contains("evidence="), "{shell}: {screen}");
    }
}
