//! `smolbox dev up | status | down`: the devworker in the background for
//! this user, and how later commands find it.
//!
//! Everything lives in one directory, `$XDG_DATA_HOME/smolbox/dev` (else
//! `~/.local/share/smolbox/dev`), kept at mode 0700:
//!
//! * `worker.sock` — the Unix socket the devworker listens on (its TCP
//!   listener stays on loopback behind the same token);
//! * `token` — the random bearer token (0600), new at each `dev up`;
//! * `pid` — the background process's pid (0600), written once it serves;
//! * `devworker.log` — its stderr;
//! * `lock` — held while `dev up` or `dev down` runs;
//! * `state/` — its machines, which persist across `dev down` / `dev up`
//!   (the devworker stops them at shutdown, like a drained worker).
//!
//! `dev up` starts `smolbox dev serve --dir DIR` (hidden) in a process group
//! of its own, waits (bounded) for its "ready" line, then records its pid.
//! `dev down` signals that pid (SIGTERM, then SIGKILL after a bounded wait),
//! waits until it is gone and removes the socket, token and pid files.

use smolbox_core::Reason;
use std::fs::{self, OpenOptions};
use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::json;
use smolbox_core::{Error, Evidence, Operation};

use crate::report::{self, Failure};

/// The version the background devworker impersonates (as the in-process one).
const DEV_VERSION: &str = "1.22.0";
/// How long `dev up` waits for the background devworker to serve.
const READY_WAIT: Duration = Duration::from_secs(30);
/// How long `dev down` waits after SIGTERM before SIGKILL, and after SIGKILL.
const TERM_WAIT: Duration = Duration::from_secs(10);
const KILL_WAIT: Duration = Duration::from_secs(5);
/// The line `dev serve` prints on stdout once it listens.
const READY: &str = "ready";

/// The files of the background devworker.
#[derive(Debug, Clone)]
pub(crate) struct DevPaths {
    /// The 0700 directory holding everything below.
    pub(crate) dir: PathBuf,
    /// The Unix socket.
    pub(crate) sock: PathBuf,
    /// The token file (0600).
    pub(crate) token: PathBuf,
    /// The pid file.
    pub(crate) pid: PathBuf,
    /// The devworker's stderr.
    pub(crate) log: PathBuf,
    /// The devworker's state directory.
    pub(crate) state: PathBuf,
}

impl DevPaths {
    /// The paths under `dir`.
    pub(crate) fn under(dir: PathBuf) -> Self {
        Self {
            sock: dir.join("worker.sock"),
            token: dir.join("token"),
            pid: dir.join("pid"),
            log: dir.join("devworker.log"),
            state: dir.join("state"),
            dir,
        }
    }

    /// The paths under this user's data directory.
    pub(crate) fn for_user() -> Result<Self, Failure> {
        // A relative XDG_DATA_HOME is ignored, as the XDG spec says (the
        // pid check compares the directory in the process's command line).
        let base = std::env::var_os("XDG_DATA_HOME")
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
            .or_else(|| {
                std::env::var_os("HOME")
                    .filter(|v| !v.is_empty())
                    .map(|h| PathBuf::from(h).join(".local/share"))
            })
            .ok_or_else(|| {
                Failure::local(
                    "find a data directory (set HOME or XDG_DATA_HOME)",
                    &io::Error::from(io::ErrorKind::NotFound),
                )
            })?;
        Ok(Self::under(base.join("smolbox").join("dev")))
    }
}

/// What the pid file says.
#[derive(Debug)]
pub(crate) enum DevState {
    /// No pid file.
    Absent,
    /// A pid file whose process is gone (or is no longer ours).
    Stale(i32),
    /// The devworker runs.
    Running(Running),
}

/// A running background devworker.
#[derive(Debug)]
pub(crate) struct Running {
    /// Its pid.
    pub(crate) pid: i32,
    /// Its files.
    pub(crate) paths: DevPaths,
}

impl Running {
    /// The token (read from its 0600 file; never printed).
    pub(crate) fn token(&self) -> Result<String, Failure> {
        let t = fs::read_to_string(&self.paths.token)
            .map_err(|e| Failure::local(format!("read {}", self.paths.token.display()), &e))?;
        Ok(t.trim().to_owned())
    }
}

/// Reads the pid file and checks the process.
pub(crate) fn state(paths: &DevPaths) -> Result<DevState, Failure> {
    let text = match fs::read_to_string(&paths.pid) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(DevState::Absent),
        Err(e) => return Err(Failure::local(format!("read {}", paths.pid.display()), &e)),
    };
    let Ok(pid) = text.trim().parse::<i32>() else {
        return Ok(DevState::Stale(0));
    };
    if pid > 0 && alive(pid) && is_ours(pid, paths) {
        Ok(DevState::Running(Running {
            pid,
            paths: paths.clone(),
        }))
    } else {
        Ok(DevState::Stale(pid))
    }
}

/// True while `pid` exists and is not a zombie (a dead process waiting
/// for its reaper counts as gone).
pub(crate) fn alive(pid: i32) -> bool {
    let exists = match nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None) {
        Ok(()) => true,
        Err(e) => e == nix::errno::Errno::EPERM,
    };
    if !exists {
        return false;
    }
    // `/proc/PID/stat`: "pid (comm) S …"; the state follows the last ')'.
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_none_or(|s| s != "Z" && s != "X"),
        Err(_) => true,
    }
}

/// Where `/proc` tells, the process must be our `dev serve --dir DIR`
/// (guards against a reused pid); elsewhere the pid is trusted.
fn is_ours(pid: i32, paths: &DevPaths) -> bool {
    let Ok(cmdline) = fs::read(format!("/proc/{pid}/cmdline")) else {
        return true;
    };
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    let dir = paths.dir.as_os_str().as_encoded_bytes();
    args.windows(2).any(|w| w[0] == b"serve") && args.contains(&dir)
}

/// Creates the directory (and parents) and makes it 0700.
fn private_dir(dir: &Path) -> io::Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
}

/// Writes `bytes` to `path` as a fresh 0600 file (via a temporary file
/// renamed over it, so a reader never sees half of it).
fn write_private(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let tmp = path.with_extension("tmp");
    let _ = fs::remove_file(&tmp);
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    drop(f);
    fs::rename(&tmp, path)
}

fn remove_if_present(path: &Path) -> Result<(), Failure> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Failure::local(format!("remove {}", path.display()), &e)),
    }
}

/// Removes what a stopped devworker leaves (socket, token, pid file).
fn clean(paths: &DevPaths) -> Result<(), Failure> {
    remove_if_present(&paths.sock)?;
    remove_if_present(&paths.token)?;
    remove_if_present(&paths.pid)
}

/// A random token: 32 bytes as hex.
pub(crate) fn random_token() -> Result<String, Failure> {
    let mut bytes = [0u8; 32];
    getrandom::getrandom(&mut bytes).map_err(|_| {
        Failure::Core(Error::unknown(
            Operation::Config,
            Evidence::NotDispatched,
            Reason::NoRandomness,
        ))
    })?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

const WARNING: &str = "commands run on this host as host processes, WITHOUT isolation";

/// Holds `DIR/lock` exclusively while `dev up` or `dev down` runs, so two
/// of them at once cannot start two devworkers (or stop one being started).
fn exclusive(paths: &DevPaths) -> Result<nix::fcntl::Flock<fs::File>, Failure> {
    let file = paths.dir.join("lock");
    let doing = || format!("lock {}", file.display());
    let f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(&file)
        .map_err(|e| Failure::local(doing(), &e))?;
    nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, errno)| Failure::local(doing(), &io::Error::from(errno)))
}

/// `dev up`.
pub(crate) fn up(json: bool) -> Result<i32, Failure> {
    let paths = DevPaths::for_user()?;
    private_dir(&paths.dir)
        .map_err(|e| Failure::local(format!("create {}", paths.dir.display()), &e))?;
    let _lock = exclusive(&paths)?;
    match state(&paths)? {
        DevState::Running(r) => {
            print_running(&r, json, "already running")?;
            return Ok(0);
        }
        DevState::Stale(pid) => {
            report::note(&format!(
                "removing the stale pid file of the local devworker (pid {pid} is gone)"
            ));
            clean(&paths)?;
        }
        DevState::Absent => clean(&paths)?,
    }
    let token = random_token()?;
    write_private(&paths.token, token.as_bytes())
        .map_err(|e| Failure::local(format!("write {}", paths.token.display()), &e))?;
    let log = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(&paths.log)
        .map_err(|e| Failure::local(format!("open {}", paths.log.display()), &e))?;
    let exe =
        std::env::current_exe().map_err(|e| Failure::local("find the smolbox executable", &e))?;
    let mut child = std::process::Command::new(exe)
        .arg("dev")
        .arg("serve")
        .arg("--dir")
        .arg(&paths.dir)
        .env_remove("SMOLBOX_WORKER")
        .env_remove("SMOLBOX_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log))
        // Its own process group: the terminal's Ctrl-C does not reach it.
        .process_group(0)
        .spawn()
        .map_err(|e| Failure::local("start the background devworker", &e))?;
    let pid = i32::try_from(child.id()).unwrap_or(0);
    let ready = child.stdout.take().map(|out| {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(out).read_line(&mut line);
            let _ = tx.send(line);
        });
        rx
    });
    let line = ready
        .and_then(|rx| rx.recv_timeout(READY_WAIT).ok())
        .unwrap_or_default();
    if line.trim() != READY {
        let _ = child.kill();
        let _ = child.wait();
        let _ = clean(&paths);
        report::note(&format!(
            "the background devworker did not start; see {}",
            paths.log.display()
        ));
        return Err(Failure::local(
            "start the background devworker",
            &io::Error::from(io::ErrorKind::Other),
        ));
    }
    write_private(&paths.pid, format!("{pid}\n").as_bytes())
        .map_err(|e| Failure::local(format!("write {}", paths.pid.display()), &e))?;
    // The child is not waited for: it outlives this command.
    drop(child);
    let r = Running { pid, paths };
    print_running(&r, json, "started")?;
    report::note(&format!("the local devworker: {WARNING}"));
    Ok(0)
}

fn print_running(r: &Running, json: bool, what: &str) -> Result<(), Failure> {
    if json {
        return report::line(
            &json!({
                "running": true,
                "pid": r.pid,
                "socket": r.paths.sock,
                "token_file": r.paths.token,
                "state_dir": r.paths.state,
                "log": r.paths.log,
            })
            .to_string(),
        );
    }
    report::line(&format!(
        "local devworker {what}: pid {}, unix:{} (token in {}, state in {}, log {})",
        r.pid,
        r.paths.sock.display(),
        r.paths.token.display(),
        r.paths.state.display(),
        r.paths.log.display()
    ))
}

/// `dev status`.
pub(crate) fn status(json: bool) -> Result<i32, Failure> {
    let paths = DevPaths::for_user()?;
    match state(&paths)? {
        DevState::Running(r) => print_running(&r, json, "running")?,
        DevState::Absent => {
            if json {
                report::line(&json!({ "running": false }).to_string())?;
            } else {
                report::line("local devworker not running")?;
            }
        }
        DevState::Stale(pid) => {
            if json {
                report::line(&json!({ "running": false, "stale_pid": pid }).to_string())?;
            } else {
                report::line(&format!(
                    "local devworker not running (stale pid file: pid {pid} is gone)"
                ))?;
            }
        }
    }
    Ok(0)
}

/// `dev down`.
pub(crate) fn down(json: bool) -> Result<i32, Failure> {
    let paths = DevPaths::for_user()?;
    if !paths.dir.exists() {
        return print_not_running_down(json);
    }
    let _lock = exclusive(&paths)?;
    let r = match state(&paths)? {
        DevState::Running(r) => r,
        DevState::Absent | DevState::Stale(_) => {
            clean(&paths)?;
            return print_not_running_down(json);
        }
    };
    let pid = nix::unistd::Pid::from_raw(r.pid);
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    let mut killed = false;
    if !wait_gone(r.pid, TERM_WAIT) {
        killed = true;
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
        if !wait_gone(r.pid, KILL_WAIT) {
            return Err(Failure::local(
                format!("stop the local devworker (pid {})", r.pid),
                &io::Error::from(io::ErrorKind::TimedOut),
            ));
        }
    }
    clean(&paths)?;
    if json {
        report::line(&json!({ "stopped": true, "pid": r.pid, "killed": killed }).to_string())?;
    } else {
        let how = if killed {
            " (it ignored SIGTERM: killed)"
        } else {
            ""
        };
        report::line(&format!("local devworker stopped: pid {}{how}", r.pid))?;
    }
    Ok(0)
}

fn print_not_running_down(json: bool) -> Result<i32, Failure> {
    if json {
        report::line(&json!({ "stopped": false, "running": false }).to_string())?;
    } else {
        report::line("local devworker not running")?;
    }
    Ok(0)
}

/// Waits (polling, bounded) until `pid` is gone.
fn wait_gone(pid: i32, bound: Duration) -> bool {
    let until = Instant::now() + bound;
    loop {
        if !alive(pid) {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `dev serve --dir DIR` (hidden): the background devworker itself. Serves
/// until SIGTERM or SIGINT; SIGHUP is ignored (the terminal it was started
/// from may close).
pub(crate) fn serve(dir: &Path) -> Result<i32, Failure> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let paths = DevPaths::under(dir.to_path_buf());
    let token = fs::read_to_string(&paths.token)
        .map_err(|e| Failure::local(format!("read {}", paths.token.display()), &e))?;
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGHUP])
        .map_err(|e| Failure::local("install signal handlers", &e))?;
    let w = smolbox_devworker::DevWorker::start_blocking(
        smolbox_devworker::DevWorker::builder()
            .version(DEV_VERSION)
            .token(Some(token.trim()))
            .unix_socket(Some(paths.sock.clone()))
            .state_dir(Some(paths.state.clone()))
            .quiet(false),
    )
    .map_err(|e| Failure::local("start the devworker", &e))?;
    report::line(READY)?;
    for sig in signals.forever() {
        if sig != SIGHUP {
            break;
        }
    }
    w.shutdown();
    Ok(0)
}
