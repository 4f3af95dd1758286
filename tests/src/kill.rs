//! A `Store` that stops its own process at a named durable boundary of the
//! managed runtime (issue 14 item 6): the kill-point hook of the test
//! controller binary (`src/bin/managed-ctl.rs`). Every method forwards to
//! the inner store; the boundary named by [`KILL_VAR`] raises SIGKILL on
//! this process (through `kill -KILL <own pid>`, `unsafe` being forbidden)
//! right where the boundary is, so the test needs no sleep and no timing:
//!
//! | point | where the process dies |
//! |---|---|
//! | `before_intent` | as the `dispatching` intent is about to be written (not committed): on a caller's machine that is the acceptance itself (`accept_dispatching`, issue 16), so nothing is stored |
//! | `after_intent` | right after the intent committed (with the acceptance on a caller's machine), before the exec is sent |
//! | `after_dispatch` | while the exec runs (the command itself kills the controller: `{CTL_PID}` in the script) |
//! | `after_reply` | after the exit came back, before the `collecting` result is written |
//! | `during_finish` | after `collecting` committed, before `completed` is written: only a command with declared outputs (with nothing to collect the result is stored with `completed` in one commit, session 11), so not in [`KillPoint::ALL`] |
//!
//! Three more points of a command with declared files in a retained
//! machine's slot ([`KillPoint::SLOT_FILES`], session 9):
//!
//! | point | where the process dies |
//! |---|---|
//! | `after_preparing` | right after `preparing` committed, before any upload |
//! | `before_ready` | the inputs uploaded and read back, as `ready` is about to be written |
//! | `before_slot_finish` | after `completed` committed, as the slot's finish (`finish_command`) is about to run |

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use smolbox_core::Error;
use smolbox_core::managed::controller::Claimed;
use smolbox_core::managed::record::{ExecutionRecord, MachineRecord, Resources};
use smolbox_core::managed::slot::{Disposition, Finish};
use smolbox_core::managed::state::{ExecState, MachineOperation};
use smolbox_core::managed::{ExecPatch, Guard, Lease, MachinePatch, RecordKey};
use smolbox_store::{
    Accepted, Assigned, DueCursor, DuePage, Page, Released, Reserve, Resolved, Store, StoreInfo,
    Submitted,
};

/// The environment variable naming the kill point.
pub const KILL_VAR: &str = "SMOLBOX_KILL_AT";

/// A durable boundary of the managed runtime.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KillPoint {
    /// Before the `dispatching` intent commits.
    BeforeIntent,
    /// After the intent, before the exec is sent.
    AfterIntent,
    /// After the exec reached the worker, before its reply (the command
    /// kills the controller; nothing in the store wrapper).
    AfterDispatch,
    /// After the reply, before the result commits.
    AfterReply,
    /// After the result (`collecting`), before `completed`.
    DuringFinish,
    /// Right after `preparing` committed (nothing uploaded yet).
    AfterPreparing,
    /// Staging done (inputs uploaded and read back), before `ready`.
    BeforeReady,
    /// After `completed`, before the slot's finish (`finish_command`).
    BeforeSlotFinish,
}

impl KillPoint {
    /// The kill points of a command on a caller's machine with nothing to
    /// collect, in the order the runtime crosses them (its result and
    /// `completed` are one commit: no `during_finish`).
    pub const ALL: [Self; 4] = [
        Self::BeforeIntent,
        Self::AfterIntent,
        Self::AfterDispatch,
        Self::AfterReply,
    ];

    /// Every durable boundary of a command with declared files in a
    /// retained machine's slot, in the order the runtime crosses them:
    /// staging (`preparing`, inputs uploaded), the intent, the exec, the
    /// result, the completion and the slot's finish.
    pub const SLOT_FILES: [Self; 8] = [
        Self::AfterPreparing,
        Self::BeforeReady,
        Self::BeforeIntent,
        Self::AfterIntent,
        Self::AfterDispatch,
        Self::AfterReply,
        Self::DuringFinish,
        Self::BeforeSlotFinish,
    ];

    /// The name used in [`KILL_VAR`].
    pub const fn name(self) -> &'static str {
        match self {
            Self::BeforeIntent => "before_intent",
            Self::AfterIntent => "after_intent",
            Self::AfterDispatch => "after_dispatch",
            Self::AfterReply => "after_reply",
            Self::DuringFinish => "during_finish",
            Self::AfterPreparing => "after_preparing",
            Self::BeforeReady => "before_ready",
            Self::BeforeSlotFinish => "before_slot_finish",
        }
    }

    /// The kill point named `name`.
    pub fn parse(name: &str) -> Option<Self> {
        Self::SLOT_FILES.into_iter().find(|p| p.name() == name)
    }

    /// The kill point named by [`KILL_VAR`], if any.
    pub fn from_env() -> Option<Self> {
        std::env::var(KILL_VAR)
            .ok()
            .and_then(|v| Self::parse(v.trim()))
    }
}

/// SIGKILLs this process and never returns.
pub fn die() -> ! {
    let pid = std::process::id().to_string();
    let _ = std::process::Command::new("kill")
        .args(["-KILL", &pid])
        .status();
    // The signal is delivered before `kill` exits; never go on.
    loop {
        std::thread::park();
    }
}

/// The inner store, and the process dies at `kill`. It also counts the
/// single-record reads (`fetch`) made through it, for the cases that pin
/// how often a waiter reads the store, and can panic in its first due
/// scans (a planted store bug: the runtime must go on).
pub struct KillStore {
    inner: Arc<dyn Store>,
    kill: Option<KillPoint>,
    fetches: AtomicU64,
    /// Due scans still to panic in.
    due_panics: AtomicU64,
    /// Due scans that panicked.
    panicked: AtomicU64,
    /// Due scans asked of this store (panicked or not), and their signal.
    dues: Mutex<u64>,
    due_asked: Condvar,
}

impl KillStore {
    /// Wraps `inner`; `kill` is the boundary to die at (none: a plain store).
    pub fn new(inner: Arc<dyn Store>, kill: Option<KillPoint>) -> Self {
        Self {
            inner,
            kill,
            fetches: AtomicU64::new(0),
            due_panics: AtomicU64::new(0),
            panicked: AtomicU64::new(0),
            dues: Mutex::new(0),
            due_asked: Condvar::new(),
        }
    }

    /// Waits until at least `n` due scans were asked of this store, at
    /// most `timeout`; returns how many were.
    pub fn wait_for_dues(&self, n: u64, timeout: Duration) -> u64 {
        let deadline = Instant::now() + timeout;
        let mut dues = self.dues.lock().unwrap_or_else(PoisonError::into_inner);
        while *dues < n {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            dues = self
                .due_asked
                .wait_timeout(dues, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        *dues
    }

    /// The first `n` due scans through this store panic.
    #[must_use]
    pub fn panicking_in_due(self, n: u64) -> Self {
        self.due_panics.store(n, Ordering::Relaxed);
        self
    }

    /// How many due scans panicked so far.
    pub fn panicked(&self) -> u64 {
        self.panicked.load(Ordering::Relaxed)
    }

    /// How many `fetch` calls went through this store so far.
    pub fn fetches(&self) -> u64 {
        self.fetches.load(Ordering::Relaxed)
    }

    fn before_write(&self, patch: &ExecPatch) {
        let die_here = match self.kill {
            Some(KillPoint::BeforeIntent) => patch.state == Some(ExecState::Dispatching),
            Some(KillPoint::AfterReply) => patch.state == Some(ExecState::Collecting),
            Some(KillPoint::DuringFinish) => patch.state == Some(ExecState::Completed),
            Some(KillPoint::BeforeReady) => patch.state == Some(ExecState::Ready),
            _ => false,
        };
        if die_here {
            die();
        }
    }
}

impl Store for KillStore {
    smolbox_store::forward_store! { to inner;
        fn info(&self) -> StoreInfo;
        fn accept(&self, record: &ExecutionRecord, max_pending: u32)
            -> Result<Accepted<ExecutionRecord>, Error>;
        fn find_machine(&self, worker_id: &str, name: &str) -> Result<Assigned, Error>;
        fn claim_worker(&self, worker_id: &str, owner: &str, now_ms: u64, ttl_ms: u64)
            -> Result<Lease, Error>;
        fn claim(&self, key: &RecordKey, owner: &str, now_ms: u64, ttl_ms: u64)
            -> Result<ExecutionRecord, Error>;
        fn reserve(&self, key: &RecordKey, guard: &Guard, request: &Reserve, now_ms: u64)
            -> Result<ExecutionRecord, Error>;
        fn release(&self, key: &RecordKey, guard: &Guard, now_ms: u64)
            -> Result<ExecutionRecord, Error>;
        fn cancel(&self, key: &RecordKey, now_ms: u64) -> Result<ExecutionRecord, Error>;
        fn usage(&self, worker_id: &str) -> Result<Resources, Error>;
        fn accept_machine(&self, record: &MachineRecord, max_pending: u32)
            -> Result<Accepted<MachineRecord>, Error>;
        fn fetch_machine(&self, key: &RecordKey) -> Result<MachineRecord, Error>;
        fn claim_machine(&self, key: &RecordKey, owner: &str, now_ms: u64, ttl_ms: u64)
            -> Result<MachineRecord, Error>;
        fn write_machine(&self, key: &RecordKey, guard: &Guard, patch: &MachinePatch, now_ms: u64)
            -> Result<MachineRecord, Error>;
        fn reserve_machine(&self, key: &RecordKey, guard: &Guard, request: &Reserve, now_ms: u64)
            -> Result<MachineRecord, Error>;
        fn request_machine(&self, key: &RecordKey, action: MachineOperation, version: u64, now_ms: u64)
            -> Result<MachineRecord, Error>;
        fn acquire_slot(&self, machine: &RecordKey, guard: &Guard, exec: &RecordKey, now_ms: u64)
            -> Result<MachineRecord, Error>;
        fn list(&self, scope: &str, after: Option<&str>, limit: u32)
            -> Result<Page<ExecutionRecord>, Error>;
        fn list_machines(&self, scope: &str, after: Option<&str>, limit: u32)
            -> Result<Page<MachineRecord>, Error>;
        fn due_machines(&self, now_ms: u64, after: Option<&DueCursor>, limit: u32)
            -> Result<DuePage<MachineRecord>, Error>;
        fn claim_version(&self, key: &RecordKey, owner: &str, version: u64, now_ms: u64, ttl_ms: u64)
            -> Result<ExecutionRecord, Error>;
        fn claim_machine_version(&self, key: &RecordKey, owner: &str, version: u64, now_ms: u64, ttl_ms: u64)
            -> Result<MachineRecord, Error>;
        fn submit(&self, record: &ExecutionRecord, max_pending: u32)
            -> Result<Accepted<Submitted>, Error>;
        fn resolve_machine(&self, key: &RecordKey, version: u64, quiesced: bool, disposition: &Disposition, now_ms: u64)
            -> Result<Resolved, Error>;
        fn release_claim(&self, claimed: &Claimed, owner: &str, generation: u64, now_ms: u64)
            -> Result<Released, Error>;
        fn commits(&self) -> Option<u64>;
    }

    fn fetch(&self, key: &RecordKey) -> Result<ExecutionRecord, Error> {
        self.fetches.fetch_add(1, Ordering::Relaxed);
        self.inner.fetch(key)
    }

    fn due(&self, now_ms: u64, after: Option<&DueCursor>, limit: u32) -> Result<DuePage, Error> {
        *self.dues.lock().unwrap_or_else(PoisonError::into_inner) += 1;
        self.due_asked.notify_all();
        let planted = self
            .due_panics
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok();
        if planted {
            self.panicked.fetch_add(1, Ordering::Relaxed);
            panic!("a planted panic in the store's due scan");
        }
        self.inner.due(now_ms, after, limit)
    }

    fn write(
        &self,
        key: &RecordKey,
        guard: &Guard,
        patch: &ExecPatch,
        now_ms: u64,
    ) -> Result<ExecutionRecord, Error> {
        let die_after = match self.kill {
            Some(KillPoint::AfterIntent) => patch.state == Some(ExecState::Dispatching),
            Some(KillPoint::AfterPreparing) => patch.state == Some(ExecState::Preparing),
            _ => false,
        };
        self.before_write(patch);
        let r = self.inner.write(key, guard, patch, now_ms);
        if die_after && r.is_ok() {
            die();
        }
        r
    }

    fn finish_command(
        &self,
        machine: &RecordKey,
        guard: &Guard,
        exec: &RecordKey,
        now_ms: u64,
    ) -> Result<(MachineRecord, ExecutionRecord, Finish), Error> {
        if self.kill == Some(KillPoint::BeforeSlotFinish) {
            die();
        }
        self.inner.finish_command(machine, guard, exec, now_ms)
    }

    fn finish_slot(
        &self,
        machine: &RecordKey,
        guard: &Guard,
        exec: &RecordKey,
        now_ms: u64,
    ) -> Result<(MachineRecord, Finish), Error> {
        if self.kill == Some(KillPoint::BeforeSlotFinish) {
            die();
        }
        self.inner.finish_slot(machine, guard, exec, now_ms)
    }

    fn accept_dispatching(
        &self,
        record: &ExecutionRecord,
        max_pending: u32,
    ) -> Result<Accepted<ExecutionRecord>, Error> {
        // The acceptance carries the intent: the intent boundaries are here.
        if self.kill == Some(KillPoint::BeforeIntent) {
            die();
        }
        let r = self.inner.accept_dispatching(record, max_pending);
        if self.kill == Some(KillPoint::AfterIntent) && r.is_ok() {
            die();
        }
        r
    }

    fn submit_dispatching(
        &self,
        record: &ExecutionRecord,
        max_pending: u32,
    ) -> Result<Accepted<Submitted>, Error> {
        if self.kill == Some(KillPoint::BeforeIntent) {
            die();
        }
        let r = self.inner.submit_dispatching(record, max_pending);
        if self.kill == Some(KillPoint::AfterIntent) && r.is_ok() {
            die();
        }
        r
    }

    fn write_steps(
        &self,
        key: &RecordKey,
        guard: &Guard,
        patches: &[ExecPatch],
        now_ms: u64,
    ) -> Result<ExecutionRecord, Error> {
        for p in patches.iter().take(1) {
            self.before_write(p);
        }
        self.inner.write_steps(key, guard, patches, now_ms)
    }
}
