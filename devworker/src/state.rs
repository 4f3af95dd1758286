//! Shared server state: machines (in memory, plus one host directory each),
//! request ids, metrics, boot identity.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::watch;

use crate::config::Config;
use crate::faults::Faults;

/// A published port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct PortSpec {
    pub(crate) host: u16,
    pub(crate) guest: u16,
}

/// A mount as the reply shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct MountInfo {
    pub(crate) tag: String,
    pub(crate) source: String,
    pub(crate) target: String,
    pub(crate) readonly: bool,
}

/// The stored lifecycle state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stored {
    Created,
    Running,
    Stopped,
}

/// The stand-in VMM: a host process whose life is the machine's.
#[derive(Clone, Debug)]
pub(crate) struct Vmm {
    pub(crate) pid: u32,
    pub(crate) alive: Arc<AtomicBool>,
    pub(crate) start_time_us: u64,
}

impl Vmm {
    pub(crate) fn is_alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }
}

/// One machine record.
#[derive(Debug)]
pub(crate) struct Machine {
    pub(crate) name: String,
    pub(crate) cpus: u8,
    pub(crate) memory_mb: u32,
    pub(crate) storage_gb: u64,
    pub(crate) overlay_gb: u64,
    pub(crate) network: bool,
    pub(crate) gpu: bool,
    pub(crate) cuda: bool,
    pub(crate) network_backend: Option<String>,
    pub(crate) allowed_cidrs: Option<Vec<String>>,
    pub(crate) allowed_hosts: Option<Vec<String>>,
    pub(crate) ports: Vec<PortSpec>,
    pub(crate) mounts: Vec<MountInfo>,
    pub(crate) image: Option<String>,
    pub(crate) forkable: bool,
    pub(crate) created_at: u64,
    pub(crate) stored: Stored,
    pub(crate) vmm: Option<Vmm>,
    /// `<state>/machines/<name>`: holds `rootfs/` and `agent-console.log`.
    pub(crate) dir: PathBuf,
    /// Bumped to kill every command of this machine.
    pub(crate) kill: watch::Sender<u64>,
    /// Whether the record is written to `dir/record.json`.
    pub(crate) persist: bool,
    /// Creation order (list order survives restarts).
    pub(crate) order: u64,
    /// Image references pulled into this machine.
    pub(crate) images: Vec<String>,
}

/// The state a reply shows, resolved like the real worker does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Resolved {
    Created,
    Running,
    Stopped,
}

impl Resolved {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Created => "created",
            Self::Running => "running",
            Self::Stopped => "stopped",
        }
    }
}

impl Machine {
    pub(crate) fn resolved(&self) -> Resolved {
        match self.stored {
            Stored::Created => Resolved::Created,
            Stored::Stopped => Resolved::Stopped,
            Stored::Running => match &self.vmm {
                Some(v) if v.is_alive() => Resolved::Running,
                _ => Resolved::Stopped,
            },
        }
    }

    pub(crate) fn rootfs(&self) -> PathBuf {
        self.dir.join("rootfs")
    }

    pub(crate) fn console_log(&self) -> PathBuf {
        self.dir.join("agent-console.log")
    }

    pub(crate) fn kill_commands(&self) {
        self.kill.send_modify(|n| *n += 1);
    }
}

/// Metric series key: method, status, path.
type SeriesKey = (String, u16, String);

/// Everything handlers share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) config: Config,
    pub(crate) faults: Faults,
    pub(crate) machines: Mutex<Vec<Machine>>,
    pub(crate) seq: AtomicU32,
    pub(crate) started: Mutex<Instant>,
    pub(crate) boot_id: Mutex<String>,
    pub(crate) metrics: Mutex<Vec<(SeriesKey, u64)>>,
    /// Bumped on "worker restart" and shutdown: connections, streams,
    /// terminals and commands of the old incarnation end.
    pub(crate) generation: watch::Sender<u64>,
    pub(crate) log_followers: AtomicU32,
    /// `smolvm_exec_seconds`: bucket counts, sum, count.
    pub(crate) exec_hist: Mutex<ExecHistogram>,
    /// Live command process groups.
    pub(crate) commands: crate::process::Registry,
}

/// Upper bounds of the exec duration histogram, in seconds.
pub(crate) const EXEC_BUCKETS: [f64; 8] = [0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0, 300.0];

/// Buffered exec durations.
#[derive(Debug, Default)]
pub(crate) struct ExecHistogram {
    pub(crate) buckets: [u64; 8],
    pub(crate) sum: f64,
    pub(crate) count: u64,
}

pub(crate) type AppState = Arc<Shared>;

pub(crate) use crate::util::lock;

pub(crate) fn unix_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

pub(crate) fn unix_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

pub(crate) fn new_boot_id() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{}-{}", std::process::id(), nanos)
}

impl Shared {
    pub(crate) fn new(config: Config, faults: Faults) -> Self {
        let (generation, _) = watch::channel(0);
        Self {
            config,
            faults,
            machines: Mutex::new(Vec::new()),
            seq: AtomicU32::new(0),
            started: Mutex::new(Instant::now()),
            boot_id: Mutex::new(new_boot_id()),
            metrics: Mutex::new(Vec::new()),
            generation,
            log_followers: AtomicU32::new(0),
            exec_hist: Mutex::new(ExecHistogram::default()),
            commands: crate::process::Registry::default(),
        }
    }

    /// `x-trace-id`: 8 hex digits of request sequence, 8 of the server PID.
    pub(crate) fn next_trace_id(&self) -> String {
        let n = self.seq.fetch_add(1, Ordering::SeqCst);
        format!("{:08x}{:08x}", n, std::process::id())
    }

    pub(crate) fn record_metric(&self, method: &str, status: u16, path: &str) {
        let mut m = lock(&self.metrics);
        if let Some((_, n)) = m
            .iter_mut()
            .find(|((me, st, p), _)| me == method && *st == status && p == path)
        {
            *n += 1;
        } else {
            m.push(((method.to_owned(), status, path.to_owned()), 1));
        }
    }

    pub(crate) fn record_exec(&self, d: std::time::Duration) {
        let secs = d.as_secs_f64();
        let mut h = lock(&self.exec_hist);
        for (i, le) in EXEC_BUCKETS.iter().enumerate() {
            if secs <= *le {
                h.buckets[i] += 1;
            }
        }
        h.sum += secs;
        h.count += 1;
    }

    pub(crate) fn machines_dir(&self) -> PathBuf {
        self.config.state_dir.join("machines")
    }

    pub(crate) fn volumes_dir(&self) -> PathBuf {
        self.config.state_dir.join("volumes")
    }

    pub(crate) fn machine_dir(&self, name: &str) -> PathBuf {
        self.machines_dir().join(name)
    }

    pub(crate) fn with_machine<R>(
        &self,
        name: &str,
        f: impl FnOnce(&mut Machine) -> R,
    ) -> Option<R> {
        let mut ms = lock(&self.machines);
        ms.iter_mut().find(|m| m.name == name).map(f)
    }
}

/// Forgets live commands and connections; deletes machines whose process died.
pub(crate) fn restart_state(st: &Shared) {
    st.generation.send_modify(|g| *g += 1);
    st.commands.kill_all();
    let dead: Vec<_> = {
        let mut ms = lock(&st.machines);
        let mut dead = Vec::new();
        let mut i = 0;
        while i < ms.len() {
            let died = ms[i].vmm.as_ref().is_some_and(|v| !v.is_alive());
            if died {
                dead.push(ms.remove(i));
            } else {
                i += 1;
            }
        }
        dead
    };
    for m in dead {
        let _ = std::fs::remove_dir_all(&m.dir);
    }
    *lock(&st.boot_id) = new_boot_id();
    *lock(&st.started) = Instant::now();
    st.seq.store(0, Ordering::SeqCst);
    lock(&st.metrics).clear();
    *lock(&st.exec_hist) = ExecHistogram::default();
}

/// `/proc/<pid>/cmdline` of a stand-in VMM process.
pub(crate) const VMM_CMDLINE: &[u8] = b"sleep\x002147483647\x00";
