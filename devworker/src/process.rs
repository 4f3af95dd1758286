//! Guest commands as host processes: argv, env, stdin and working directory
//! mapped into the machine's host directory; timeout kills the process group
//! (exit 124); output arrives as chunks on a channel.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, watch};

use crate::util::{guest_to_host, lock};

/// Guest path prefixes rewritten into the machine's directory when they
/// appear in argv (as a whole word or a path prefix).
const APPROVED_ROOTS: [&str; 1] = ["/workspace"];

/// What to run.
#[derive(Debug, Default)]
pub(crate) struct CommandSpec {
    pub(crate) argv: Vec<String>,
    pub(crate) env: Vec<(String, String)>,
    pub(crate) workdir: Option<String>,
    pub(crate) stdin: Option<Vec<u8>>,
    pub(crate) timeout: Option<Duration>,
}

/// One piece of a command's life.
#[derive(Debug)]
pub(crate) enum Out {
    Stdout(Bytes),
    Stderr(Bytes),
    Exit(i32),
}

/// A started command.
#[derive(Debug)]
pub(crate) struct Running {
    pub(crate) pgid: i32,
    pub(crate) rx: mpsc::Receiver<Out>,
}

/// Every live command's process group, so shutdown can kill them
/// synchronously even when the runtime is going away.
#[derive(Clone, Debug, Default)]
pub(crate) struct Registry(std::sync::Arc<std::sync::Mutex<std::collections::BTreeSet<i32>>>);

impl Registry {
    pub(crate) fn add(&self, pgid: i32) {
        lock(&self.0).insert(pgid);
    }
    pub(crate) fn remove(&self, pgid: i32) {
        lock(&self.0).remove(&pgid);
    }
    /// Kills every registered process group.
    pub(crate) fn kill_all(&self) {
        let all: Vec<i32> = std::mem::take(&mut *lock(&self.0)).into_iter().collect();
        for pgid in all {
            kill_group(pgid);
        }
    }
}

/// Hangs up a terminal's whole process group: SIGHUP now, SIGKILL after
/// `grace` (from a thread of its own, so the caller does not wait and a
/// runtime shutdown does not cancel it) for whatever ignored the hangup.
pub(crate) fn hangup_group(pgid: i32, grace: Duration) {
    if pgid <= 0 {
        return;
    }
    let group = nix::unistd::Pid::from_raw(pgid);
    if nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGHUP).is_err() {
        return; // the group is gone already
    }
    let _ = std::thread::Builder::new()
        .name("smolbox-devworker-hangup".into())
        .spawn(move || {
            std::thread::sleep(grace);
            let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
        });
}

/// Kills a command's whole process group.
pub(crate) fn kill_group(pgid: i32) {
    if pgid > 0 {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(pgid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

fn is_boundary(c: Option<char>) -> bool {
    c.is_none_or(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-' | '/')))
}

/// Rewrites approved guest roots inside one argv element.
pub(crate) fn map_arg(root: &Path, arg: &str) -> String {
    let root_s = root.to_string_lossy();
    let mut out = String::with_capacity(arg.len());
    let mut rest = arg;
    'outer: while !rest.is_empty() {
        for prefix in APPROVED_ROOTS {
            if let Some(after) = rest.strip_prefix(prefix) {
                let before = out.chars().last();
                let next = after.chars().next();
                if is_boundary(before) && (next.is_none() || next == Some('/') || is_boundary(next))
                {
                    out.push_str(&root_s);
                    out.push_str(prefix);
                    rest = after;
                    continue 'outer;
                }
            }
        }
        let mut chars = rest.chars();
        if let Some(c) = chars.next() {
            out.push(c);
        }
        rest = chars.as_str();
    }
    out
}

/// The host directory a guest working directory maps to.
pub(crate) fn host_workdir(root: &Path, workdir: Option<&str>) -> PathBuf {
    match workdir {
        Some(w) => guest_to_host(root, w),
        None => root.to_path_buf(),
    }
}

pub(crate) fn base_command(
    root: &Path,
    argv: &[String],
    env: &[(String, String)],
) -> tokio::process::Command {
    let program = map_arg(root, &argv[0]);
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(argv[1..].iter().map(|a| map_arg(root, a)));
    cmd.env_clear();
    cmd.env(
        "PATH",
        std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into()),
    );
    cmd.env("HOME", guest_to_host(root, "/root"));
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.process_group(0);
    cmd.kill_on_drop(false);
    cmd
}

fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

/// Starts `spec` inside `root`. `kills` are watches whose change kills the
/// command (machine stop/delete, worker restart). `Err` is the agent's
/// message.
pub(crate) fn spawn(
    root: &Path,
    spec: CommandSpec,
    kills: Vec<watch::Receiver<u64>>,
    registry: &Registry,
) -> Result<Running, String> {
    let cwd = host_workdir(root, spec.workdir.as_deref());
    if !cwd.is_dir() {
        return Err(format!(
            "failed to spawn command: working directory '{}' does not exist",
            spec.workdir.as_deref().unwrap_or("/")
        ));
    }
    let mut cmd = base_command(root, &spec.argv, &spec.env);
    cmd.current_dir(&cwd)
        .stdin(if spec.stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("failed to spawn command: {e}"))?;
    let pgid = child.id().and_then(|p| i32::try_from(p).ok()).unwrap_or(0);
    registry.add(pgid);
    let registry = registry.clone();
    if let (Some(data), Some(mut sin)) = (spec.stdin, child.stdin.take()) {
        tokio::spawn(async move {
            let _ = sin.write_all(&data).await;
            let _ = sin.shutdown().await;
        });
    }
    let (tx, rx) = mpsc::channel(16);
    let mut stdout = child.stdout.take();
    let mut stderr = child.stderr.take();
    let timeout = spec.timeout;
    tokio::spawn(async move {
        let deadline = timeout.map(|d| tokio::time::Instant::now() + d);
        let mut timed_out = false;
        let mut status = None;
        let mut kills = kills;
        let mut obuf = vec![0u8; 32 * 1024];
        let mut ebuf = vec![0u8; 32 * 1024];
        let mut drain_deadline: Option<tokio::time::Instant> = None;
        let mut receiver_gone = false;
        loop {
            if stdout.is_none() && stderr.is_none() && status.is_some() {
                break;
            }
            let killed = async {
                if kills.is_empty() {
                    std::future::pending::<()>().await;
                }
                let futs = kills.iter_mut().map(|k| Box::pin(k.changed()));
                let _ = futures_util::future::select_all(futs).await;
            };
            let until = match (deadline, drain_deadline) {
                (_, Some(d)) => Some(d),
                (Some(d), None) if !timed_out => Some(d),
                _ => None,
            };
            let sleeper = async {
                match until {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                n = read_opt(&mut stdout, &mut obuf) => match n {
                    Some(n) => {
                        let chunk = Bytes::copy_from_slice(&obuf[..n]);
                        if !receiver_gone && tx.send(Out::Stdout(chunk)).await.is_err() {
                            receiver_gone = true;
                        }
                    }
                    None => stdout = None,
                },
                n = read_opt(&mut stderr, &mut ebuf) => match n {
                    Some(n) => {
                        let chunk = Bytes::copy_from_slice(&ebuf[..n]);
                        if !receiver_gone && tx.send(Out::Stderr(chunk)).await.is_err() {
                            receiver_gone = true;
                        }
                    }
                    None => stderr = None,
                },
                s = child.wait(), if status.is_none() => {
                    status = Some(s.map(exit_code).unwrap_or(-1));
                    drain_deadline = Some(tokio::time::Instant::now() + Duration::from_millis(200));
                }
                () = sleeper => {
                    if drain_deadline.is_some() {
                        break;
                    }
                    timed_out = true;
                    kill_group(pgid);
                }
                () = killed => {
                    kill_group(pgid);
                    kills.clear();
                }
            }
        }
        registry.remove(pgid);
        let code = if timed_out { 124 } else { status.unwrap_or(-1) };
        if !receiver_gone {
            let _ = tx.send(Out::Exit(code)).await;
        }
    });
    Ok(Running { pgid, rx })
}

async fn read_opt<R: tokio::io::AsyncRead + Unpin>(
    r: &mut Option<R>,
    buf: &mut [u8],
) -> Option<usize> {
    match r {
        Some(r) => match r.read(buf).await {
            Ok(0) | Err(_) => None,
            Ok(n) => Some(n),
        },
        None => std::future::pending().await,
    }
}

/// Starts a background command (no stdin, output discarded); returns its
/// host PID. It is reaped, and killed with its machine.
pub(crate) fn spawn_background(
    root: &Path,
    spec: CommandSpec,
    mut kills: Vec<watch::Receiver<u64>>,
    registry: &Registry,
) -> Result<u32, String> {
    let cwd = host_workdir(root, spec.workdir.as_deref());
    if !cwd.is_dir() {
        return Err(format!(
            "failed to spawn command: working directory '{}' does not exist",
            spec.workdir.as_deref().unwrap_or("/")
        ));
    }
    let mut cmd = base_command(root, &spec.argv, &spec.env);
    cmd.current_dir(&cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("failed to spawn command: {e}"))?;
    let pid = child.id().unwrap_or(0);
    let pgid = i32::try_from(pid).unwrap_or(0);
    registry.add(pgid);
    let registry = registry.clone();
    tokio::spawn(async move {
        let killed = async {
            if kills.is_empty() {
                std::future::pending::<()>().await;
            }
            let futs = kills.iter_mut().map(|k| Box::pin(k.changed()));
            let _ = futures_util::future::select_all(futs).await;
        };
        tokio::select! {
            _ = child.wait() => {}
            () = killed => {
                kill_group(pgid);
                let _ = child.wait().await;
            }
        }
        registry.remove(pgid);
    });
    Ok(pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argv_roots_are_mapped_at_word_boundaries() {
        let r = Path::new("/st/m/rootfs");
        assert_eq!(
            map_arg(r, "/workspace/a.txt"),
            "/st/m/rootfs/workspace/a.txt"
        );
        assert_eq!(map_arg(r, "/workspace"), "/st/m/rootfs/workspace");
        assert_eq!(
            map_arg(r, "cat /workspace/x > /workspace/y"),
            "cat /st/m/rootfs/workspace/x > /st/m/rootfs/workspace/y"
        );
        assert_eq!(map_arg(r, "/workspaces"), "/workspaces");
        assert_eq!(map_arg(r, "/x/workspace"), "/x/workspace");
        assert_eq!(map_arg(r, "café"), "café");
    }
}
