//! Machine records on disk (only with a caller-given state directory), so a
//! devworker restarted on the same directory behaves like a restarted
//! `smolvm serve` (worker-api.md §5.8): machines whose stand-in VMM still
//! lives are reconnected, records with a PID whose process died are deleted
//! with their directories, records without a PID are kept.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::state::{Machine, MountInfo, PortSpec, Stored, Vmm};

const RECORD: &str = "record.json";

#[derive(Serialize, Deserialize)]
struct MountRecord {
    tag: String,
    source: String,
    target: String,
    readonly: bool,
}

#[derive(Serialize, Deserialize)]
struct Record {
    order: u64,
    name: String,
    cpus: u8,
    memory_mb: u32,
    storage_gb: u64,
    overlay_gb: u64,
    network: bool,
    gpu: bool,
    cuda: bool,
    network_backend: Option<String>,
    allowed_cidrs: Option<Vec<String>>,
    allowed_hosts: Option<Vec<String>>,
    ports: Vec<PortSpec>,
    mounts: Vec<MountRecord>,
    image: Option<String>,
    forkable: bool,
    created_at: u64,
    state: String,
    pid: Option<u32>,
    start_time_us: Option<u64>,
    #[serde(default)]
    images: Vec<String>,
}

/// Writes `m`'s record if the machine is persistent (best effort).
pub(crate) fn save(m: &Machine) {
    if !m.persist {
        return;
    }
    let rec = Record {
        order: m.order,
        name: m.name.clone(),
        cpus: m.cpus,
        memory_mb: m.memory_mb,
        storage_gb: m.storage_gb,
        overlay_gb: m.overlay_gb,
        network: m.network,
        gpu: m.gpu,
        cuda: m.cuda,
        network_backend: m.network_backend.clone(),
        allowed_cidrs: m.allowed_cidrs.clone(),
        allowed_hosts: m.allowed_hosts.clone(),
        ports: m.ports.clone(),
        mounts: m
            .mounts
            .iter()
            .map(|x| MountRecord {
                tag: x.tag.clone(),
                source: x.source.clone(),
                target: x.target.clone(),
                readonly: x.readonly,
            })
            .collect(),
        image: m.image.clone(),
        forkable: m.forkable,
        created_at: m.created_at,
        state: match m.stored {
            Stored::Created => "created",
            Stored::Running => "running",
            Stored::Stopped => "stopped",
        }
        .to_owned(),
        pid: m.vmm.as_ref().map(|v| v.pid),
        start_time_us: m.vmm.as_ref().map(|v| v.start_time_us),
        images: m.images.clone(),
    };
    if let Ok(bytes) = serde_json::to_vec(&rec) {
        let tmp = m.dir.join("record.json.tmp");
        if std::fs::write(&tmp, bytes).is_ok() {
            let _ = std::fs::rename(&tmp, m.dir.join(RECORD));
        }
    }
}

/// True if `pid` is a live (non-zombie) stand-in VMM process.
pub(crate) fn vmm_alive(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let running = !stat.is_empty()
        && !stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z');
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    running && cmdline == crate::state::VMM_CMDLINE
}

/// Watches a VMM process that is not our child (reconnected after a
/// restart) and clears `alive` when it dies.
fn watch_foreign(pid: u32, alive: &Arc<AtomicBool>) {
    let weak: Weak<AtomicBool> = Arc::downgrade(alive);
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let Some(flag) = weak.upgrade() else { return };
            if !vmm_alive(pid) {
                flag.store(false, Ordering::SeqCst);
                return;
            }
        }
    });
}

/// Loads the records under `machines_dir`, applying the restart rules.
pub(crate) fn load(machines_dir: &Path) -> Vec<Machine> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(machines_dir) else {
        return out;
    };
    for entry in rd.flatten() {
        let dir = entry.path();
        let Ok(bytes) = std::fs::read(dir.join(RECORD)) else {
            continue;
        };
        let Ok(rec) = serde_json::from_slice::<Record>(&bytes) else {
            continue;
        };
        let vmm = match rec.pid {
            Some(pid) if vmm_alive(pid) => {
                let alive = Arc::new(AtomicBool::new(true));
                watch_foreign(pid, &alive);
                Some(Vmm {
                    pid,
                    alive,
                    start_time_us: rec.start_time_us.unwrap_or(0),
                })
            }
            Some(_) => {
                // Had a process, and it died: deleted with its disks.
                let _ = std::fs::remove_dir_all(&dir);
                continue;
            }
            None => None,
        };
        let stored = match (rec.state.as_str(), &vmm) {
            (_, Some(_)) => Stored::Running,
            ("created", None) => Stored::Created,
            _ => Stored::Stopped,
        };
        let (kill, _) = watch::channel(0);
        out.push(Machine {
            name: rec.name,
            cpus: rec.cpus,
            memory_mb: rec.memory_mb,
            storage_gb: rec.storage_gb,
            overlay_gb: rec.overlay_gb,
            network: rec.network,
            gpu: rec.gpu,
            cuda: rec.cuda,
            network_backend: rec.network_backend,
            allowed_cidrs: rec.allowed_cidrs,
            allowed_hosts: rec.allowed_hosts,
            ports: rec.ports,
            mounts: rec
                .mounts
                .into_iter()
                .map(|x| MountInfo {
                    tag: x.tag,
                    source: x.source,
                    target: x.target,
                    readonly: x.readonly,
                })
                .collect(),
            image: rec.image,
            forkable: rec.forkable,
            created_at: rec.created_at,
            stored,
            vmm,
            dir,
            kill,
            persist: true,
            order: rec.order,
            images: rec.images,
        });
    }
    out.sort_by_key(|m| m.order);
    out
}
