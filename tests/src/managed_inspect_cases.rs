//! A slot command's image-machine preflight before its acceptance (C5.4,
//! C14.3; issue 12) through both shells' `Runtime::machines()`, against
//! the devworker on SQLite and PostgreSQL. An extended command (here a
//! workdir outside `/workspace`), a background launch and a streamed
//! extended command, and a declared output outside `/workspace`, on an
//! imageless retained machine are refused
//! `unsupported_capability` / `needs_plain_image_machine` /
//! `not_dispatched` before anything is stored: no record, no exec, the
//! slot free and the machine record unchanged, so the next ordinary
//! command runs at once (no operator `resolve`). On an image machine the
//! same commands run. Registered by
//! [`managed_inspect_suite!`](crate::managed_inspect_suite).
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::sync::Arc;

use smolbox_core::exec::{Command, ExecEvent};
use smolbox_core::managed::spec::{GuestPathPolicy, OutputFile};
use smolbox_core::managed::state::{MachineOperation as Op, MachineRecordState as MS};
use smolbox_core::managed::{CommandFiles, ExecState, RecordKey, RetainedMachineSpec};
use smolbox_core::{Category, Error, Evidence, Operation, Reason};
use smolbox_devworker::Route;
use smolbox_store::artifacts::MemoryArtifacts;

use crate::managed::{ManagedShell, Options};
use crate::managed_cases::{StoreKind, setup};
use crate::managed_machine_cases::{key as box_key, running, slot_empty};

fn key(id: &str) -> RecordKey {
    RecordKey::new("boxes", id).unwrap()
}

fn options(imageless: bool) -> Options {
    Options {
        disposable: true,
        lease_ttl_ms: 2_000,
        imageless,
        artifacts: Some(Arc::new(MemoryArtifacts::new())),
        ..Options::default()
    }
}

/// Outside `/workspace`: an extended command (C5.4).
fn extended() -> Command {
    Command::new(["sh", "-c", "echo ext"]).workdir("/")
}

fn launch() -> Command {
    Command::new(["sh", "-c", "sleep 0.1"]).background(true)
}

fn refused(e: &Error, op: Operation) {
    assert_eq!(
        (e.category(), e.reason(), e.evidence(), e.operation()),
        (
            Category::UnsupportedCapability,
            Reason::NeedsPlainImageMachine,
            Evidence::NotDispatched,
            op
        ),
        "{e:?}"
    );
}

/// An imageless retained machine refuses each gated slot command before
/// its acceptance; the devworker saw only the inspects; then the slot
/// takes an ordinary command. A machine whose path policy takes `/srv`
/// refuses an output declared there (C6.1) the same way.
pub fn an_imageless_machine_refuses_gated_slot_commands_before_acceptance<M: ManagedShell>(
    kind: StoreKind,
) {
    let Some(s) = setup(kind) else { return };
    let rt: M = s.runtime(&options(true));
    let before = running(&rt, "bare");
    let gets = s.fixture.worker.request_count(Route::MachineGet);
    let e = rt
        .m_submit(&box_key("bare"), &key("x-exec"), &extended())
        .unwrap_err();
    refused(&e, Operation::Exec);
    let e = rt
        .m_submit(&box_key("bare"), &key("x-launch"), &launch())
        .unwrap_err();
    refused(&e, Operation::Launch);
    let e = rt
        .m_run_streamed(&box_key("bare"), &key("x-stream"), &extended(), &mut |_| {})
        .unwrap_err();
    refused(&e, Operation::ExecStream);
    assert!(
        s.fixture.worker.request_count(Route::MachineGet) >= gets + 3,
        "one inspect each"
    );
    assert_eq!(s.execs(), 0, "no exec reached the worker");
    assert_eq!(s.fixture.worker.request_count(Route::ExecStream), 0);
    for id in ["x-exec", "x-launch", "x-stream"] {
        assert!(s.store.fetch(&key(id)).is_err(), "{id} was stored");
    }
    let m = rt.m_inspect(&box_key("bare")).unwrap();
    assert_eq!(m.active_execution, None, "no slot taken");
    assert_eq!(
        (m.state, m.version, m.last_error.clone()),
        (MS::Running, before.version, before.last_error.clone()),
        "the machine record unchanged"
    );
    // Usable at once: an ordinary command is not inspected and runs.
    let gets = s.fixture.worker.request_count(Route::MachineGet);
    rt.m_submit(&box_key("bare"), &key("ok"), &Command::new(["echo", "ok"]))
        .unwrap();
    let out = rt.wait(&key("ok"), 30_000).unwrap();
    assert_eq!(out.record.state, ExecState::Completed, "{:?}", out.error);
    assert_eq!(out.output.unwrap().stdout, b"ok\n");
    assert_eq!(s.execs(), 1);
    assert_eq!(s.fixture.worker.request_count(Route::MachineGet), gets);
    slot_empty(&rt, "bare");
    // A declared output outside `/workspace` (download of a large or
    // out-of-root file, C6.1).
    let wide = RetainedMachineSpec {
        guest_paths: Some(GuestPathPolicy {
            roots: vec!["/workspace".into(), "/srv".into()],
            workdir_roots: vec!["/workspace".into()],
        }),
        ..crate::managed_machine_cases::spec()
    };
    rt.m_create(&box_key("bare-files"), &wide).unwrap();
    let m = rt.m_wait(&box_key("bare-files"), 30_000).unwrap();
    rt.m_lifecycle(&box_key("bare-files"), Op::Start, m.version)
        .unwrap();
    let before = rt.m_wait(&box_key("bare-files"), 30_000).unwrap();
    assert_eq!(before.state, MS::Running, "{:?}", before.last_error);
    let files = CommandFiles {
        inputs: Vec::new(),
        outputs: vec![OutputFile {
            path: "/srv/out".into(),
            destination: "out".into(),
            max_size: 64,
        }],
    };
    let e = rt
        .m_submit_files(
            &box_key("bare-files"),
            &key("x-files"),
            &Command::new(["true"]),
            &files,
        )
        .unwrap_err();
    refused(&e, Operation::Download);
    assert!(s.store.fetch(&key("x-files")).is_err());
    let m = rt.m_inspect(&box_key("bare-files")).unwrap();
    assert_eq!(
        (m.active_execution.clone(), m.version),
        (None, before.version)
    );
    assert_eq!(s.execs(), 1);
    rt.shutdown();
}

/// On a plain image machine the same slot commands are inspected, then
/// accepted and run.
pub fn an_image_machine_runs_gated_slot_commands<M: ManagedShell>(kind: StoreKind) {
    let Some(s) = setup(kind) else { return };
    let rt: M = s.runtime(&options(false));
    running(&rt, "img");
    let gets = s.fixture.worker.request_count(Route::MachineGet);
    rt.m_submit(&box_key("img"), &key("i-exec"), &extended())
        .unwrap();
    let out = rt.wait(&key("i-exec"), 30_000).unwrap();
    assert_eq!(out.record.state, ExecState::Completed, "{:?}", out.error);
    assert_eq!(out.output.unwrap().stdout, b"ext\n");
    slot_empty(&rt, "img");
    rt.m_submit(&box_key("img"), &key("i-launch"), &launch())
        .unwrap();
    let out = rt.wait(&key("i-launch"), 30_000).unwrap();
    assert_eq!(out.record.state, ExecState::Launched, "{:?}", out.error);
    slot_empty(&rt, "img");
    let mut seen = String::new();
    let out = rt
        .m_run_streamed(&box_key("img"), &key("i-stream"), &extended(), &mut |e| {
            if let ExecEvent::Stdout(t) = e {
                seen.push_str(t);
            }
        })
        .unwrap();
    assert_eq!(out.record.state, ExecState::Completed, "{:?}", out.error);
    assert_eq!(seen, "ext\n");
    assert_eq!(s.execs(), 2);
    assert_eq!(s.fixture.worker.request_count(Route::ExecStream), 1);
    assert!(s.fixture.worker.request_count(Route::MachineGet) >= gets + 3);
    rt.shutdown();
}

/// Instantiates the slot preflight cases for `$shell`, one `#[test]` per
/// case and store (`mod inspect_sqlite`, `mod inspect_postgres`).
#[macro_export]
macro_rules! managed_inspect_suite {
    ($shell:ty) => {
        $crate::store_suite!(
            $shell,
            managed_inspect_cases,
            inspect_sqlite,
            inspect_postgres,
            [
                an_imageless_machine_refuses_gated_slot_commands_before_acceptance,
                an_image_machine_runs_gated_slot_commands,
            ]
        );
    };
}
