//! `smolbox shell` through a real terminal: tmux runs the command in a
//! pane; keys are typed with `send-keys` and the screen is read with
//! `capture-pane`, polled against a deadline (no sleeps on observable
//! things). After `exit 3` the wrapper records the exit code and the
//! terminal settings, which must be back out of raw mode.

// Tests may unwrap: a failure is a test failure.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{SHELLS, code, devworker, run};

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

#[test]
fn shell_echoes_exits_with_the_guest_code_and_restores_the_tty() {
    let w = devworker(None);
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("tmux.sock");
    let _server = Server(&socket);
    for shell in SHELLS {
        let m = format!("sh-{shell}");
        assert_eq!(code(&run(&w, shell, &["machine", "create", &m])), 0);
        let result = dir.path().join(format!("result-{shell}"));
        let script = dir.path().join(format!("run-{shell}.sh"));
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
        let session = format!("t-{shell}");
        let o = tmux(
            &socket,
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
        let target = format!("{session}:0.0");

        // The guest shell's prompt or any output shows the session is up;
        // then type a command and see its output on its own line.
        tmux(
            &socket,
            &[
                "send-keys",
                "-t",
                &target,
                "echo hi-from-$((40+2))",
                "Enter",
            ],
        );
        wait_for("the echoed output", &socket, &target, || {
            let screen = capture(&socket, &target);
            screen
                .lines()
                .any(|l| is_output(l, "hi-from-42", "echo"))
                .then_some(screen)
        });

        // Ctrl-C goes to the guest as a byte: it interrupts the guest's
        // `sleep`, and smolbox keeps running (the next command answers).
        // (Each step waits for the previous one on screen: the PTY
        // discards unread input when it sees the interrupt.)
        tmux(&socket, &["send-keys", "-t", &target, "sleep 30", "Enter"]);
        wait_for("the sleep to be typed", &socket, &target, || {
            let screen = capture(&socket, &target);
            screen.contains("sleep 30").then_some(screen)
        });
        tmux(&socket, &["send-keys", "-t", &target, "C-c", ""]);
        wait_for("the interrupt echoed", &socket, &target, || {
            let screen = capture(&socket, &target);
            screen.contains("^C").then_some(screen)
        });
        tmux(
            &socket,
            &["send-keys", "-t", &target, "echo after-$((1+1))", "Enter"],
        );
        wait_for("output after Ctrl-C", &socket, &target, || {
            let screen = capture(&socket, &target);
            screen
                .lines()
                .any(|l| is_output(l, "after-2", "echo"))
                .then_some(screen)
        });

        // A window resize reaches the guest's PTY.
        tmux(
            &socket,
            &["resize-window", "-t", &target, "-x", "91", "-y", "27"],
        );
        wait_for("the new size in the guest", &socket, &target, || {
            tmux(&socket, &["send-keys", "-t", &target, "stty size", "Enter"]);
            let screen = capture(&socket, &target);
            screen
                .lines()
                .any(|l| is_output(l, "27 91", "stty"))
                .then_some(screen)
        });

        tmux(&socket, &["send-keys", "-t", &target, "exit 3", "Enter"]);
        let exit = wait_for("the exit code file", &socket, &target, || {
            std::fs::read_to_string(&result).ok()
        });
        assert_eq!(exit.trim(), "3", "{shell}: the guest's exit code");
        let stty = std::fs::read_to_string(format!("{}.stty", result.display())).unwrap();
        let words: Vec<&str> = stty.split_whitespace().collect();
        for flag in ["icanon", "echo", "isig"] {
            assert!(
                words.contains(&flag),
                "{shell}: tty not restored ({flag}): {stty}"
            );
        }
        tmux(&socket, &["kill-session", "-t", &session]);
    }
}
