//! What a runtime's configuration cannot run, through both shells'
//! `Runtime`, against the devworker on SQLite and PostgreSQL (issue 12,
//! session 10): a command on a caller-named machine that needs a plain
//! image machine is refused before acceptance; a runtime whose worker
//! cannot create machines still answers stored duplicates (AC-12.5.2);
//! a retained machine no catalog holds waits with its reason and its
//! owner's delete needs no worker call. Registered by
//! [`managed_config_suite!`](crate::managed_config_suite).
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::path::Path;

use smolbox_core::exec::Command;
use smolbox_core::managed::controller::{RunTarget, Submit, spec_for};
use smolbox_core::managed::state::{MachineOperation as Op, MachineRecordState as MS};
use smolbox_core::managed::{ExecState, MachineRecord, RetainedMachineSpec};
use smolbox_core::worker::MachineName;
use smolbox_core::{Category, Error, Evidence, Operation, Reason};
use smolbox_devworker::Route;

use crate::fixture::Fixture;
use crate::managed::{ManagedShell, Options, WORKER};
use crate::managed_cases::{StoreKind, now_ms, setup};
use crate::managed_machine_cases::{key, running, slot_empty, spec};

/// Outside `/workspace`: an extended command (C5.4).
fn extended() -> Command {
    Command::new(["sh", "-c", "echo ext"]).workdir("/")
}

fn on(machine: &str, id: &str, command: &Command) -> Submit {
    Submit {
        key: key(id),
        spec: spec_for(
            command,
            &RunTarget::unverified().fitting(command),
            WORKER,
            machine,
        )
        .unwrap(),
    }
}

fn with_profile() -> Options {
    Options {
        disposable: true,
        lease_ttl_ms: 2_000,
        ..Options::default()
    }
}

fn refused(e: &Error, reason: Reason) {
    assert_eq!(
        (e.category(), e.reason(), e.evidence()),
        (
            Category::UnsupportedCapability,
            reason,
            Evidence::NotDispatched
        ),
        "{e:?}"
    );
}

/// An extended command on the caller's imageless machine `m1` is refused
/// before anything is stored (one inspect, no exec); on an image machine
/// it is inspected, accepted and run.
pub fn a_named_machine_refuses_an_extended_command_before_acceptance<M: ManagedShell>(
    kind: StoreKind,
) {
    let Some(s) = setup(kind) else { return };
    let rt: M = s.runtime(&with_profile());
    let gets = s.fixture.worker.request_count(Route::MachineGet);
    let e = rt.submit(on("m1", "x-named", &extended())).unwrap_err();
    refused(&e, Reason::NeedsPlainImageMachine);
    assert_eq!(e.operation(), Operation::Exec, "{e:?}");
    assert!(s.fixture.worker.request_count(Route::MachineGet) > gets);
    assert_eq!(
        rt.fetch(&key("x-named")).unwrap_err().category(),
        Category::NotFound,
        "nothing stored"
    );
    assert_eq!(s.execs(), 0, "nothing sent");
    // An image machine of the caller's runs it.
    let client = smolbox_blocking::Client::new(s.fixture.endpoint(Fixture::budgets())).unwrap();
    let profile = client.admit(&[]).unwrap();
    client
        .create(
            &profile,
            MachineName::new("m2").unwrap(),
            &crate::cases::image_spec(),
        )
        .unwrap();
    client
        .start(&profile, MachineName::new("m2").unwrap())
        .unwrap();
    let k = rt.submit(on("m2", "x-image", &extended())).unwrap().key;
    let out = rt.wait(&k, 30_000).unwrap();
    assert_eq!(out.record.state, ExecState::Completed, "{:?}", out.error);
    assert_eq!(out.output.unwrap().stdout, b"ext\n");
    assert_eq!(s.execs(), 1);
    rt.shutdown();
}

/// A runtime whose worker has no admitted profile creates no machines,
/// but answers a create or a slot command stored by an earlier runtime:
/// the stored record (`existing`); a new key is `retained_machines` with
/// nothing stored.
pub fn a_runtime_without_machines_resolves_stored_duplicates<M: ManagedShell>(kind: StoreKind) {
    let Some(s) = setup(kind) else { return };
    let a: M = s.runtime(&with_profile());
    let m = running(&a, "dup");
    let c1 = Command::new(["echo", "one"]);
    a.m_submit(&key("dup"), &key("c1"), &c1).unwrap();
    let out = a.wait(&key("c1"), 30_000).unwrap();
    assert_eq!(out.record.state, ExecState::Completed, "{:?}", out.error);
    slot_empty(&a, "dup");
    a.shutdown();
    let (creates, execs) = (
        s.fixture.worker.request_count(Route::MachinesCreate),
        s.execs(),
    );
    let b: M = s.runtime(&Options::default());
    let (got, existing) = b.m_create(&key("dup"), &spec()).unwrap();
    assert!(existing);
    assert_eq!(
        (got.key.clone(), got.fingerprint.clone()),
        (m.key, m.fingerprint)
    );
    let e = b.m_create(&key("new"), &spec()).unwrap_err();
    refused(&e, Reason::RetainedMachines);
    assert!(
        s.store.fetch_machine(&key("new")).is_err(),
        "nothing stored"
    );
    let (rec, _, existing) = b.m_submit(&key("dup"), &key("c1"), &c1).unwrap();
    assert!(existing);
    assert_eq!(rec.state, ExecState::Completed);
    let e = b
        .m_submit(&key("dup"), &key("c2"), &Command::new(["echo", "two"]))
        .unwrap_err();
    refused(&e, Reason::RetainedMachines);
    assert!(s.store.fetch(&key("c2")).is_err(), "nothing stored");
    assert_eq!(
        s.fixture.worker.request_count(Route::MachinesCreate),
        creates
    );
    assert_eq!(s.execs(), execs, "nothing sent");
    b.shutdown();
}

/// A catalog holding `spec`'s profile revision and an image other than
/// its artifact.
fn catalog_without(
    spec: &RetainedMachineSpec,
    image: &Path,
) -> smolbox_core::managed::catalog::Catalog {
    use smolbox_core::managed::catalog::{Architecture, Catalog, Floor, Platform, ProfileRevision};
    let floor = Floor {
        storage_gb: 1,
        overlay_gb: 1,
        host_overhead_mb: 128,
    };
    let mut revision = ProfileRevision::new(&spec.profile.id);
    revision.budgets = spec.profile.budgets;
    revision.per_file_max = spec.profile.per_file_max;
    let platform = if cfg!(target_arch = "aarch64") {
        Platform::Macos
    } else {
        Platform::Linux
    };
    Catalog::new(platform, Architecture::host(), floor)
        .with_image("other", &"1".repeat(64), image.to_str().unwrap())
        .with_profile(revision)
}

/// A retained machine accepted under an earlier configuration whose
/// catalog no longer holds its artifact: the runtime records why it waits
/// (`artifact_not_in_catalog`), reserves and creates nothing, and the
/// owner's delete ends it `deleted` with no worker call.
pub fn a_machine_no_catalog_holds_waits_with_its_reason_and_is_deleted_unsent<M: ManagedShell>(
    kind: StoreKind,
) {
    let Some(s) = setup(kind) else { return };
    let k = key("elsewhere");
    let fp = smolbox_core::managed::fingerprint::machine_fingerprint(&s.key, &spec());
    let rec = MachineRecord::accepted(k.clone(), fp, spec(), now_ms()).unwrap();
    s.store.accept_machine(&rec, 128).unwrap();
    let image = s.dir.path().join("other.smolmachine");
    std::fs::write(&image, b"").unwrap();
    let w = &s.fixture.worker;
    let creates = w.request_count(Route::MachinesCreate);
    let rt: M = s.runtime(&Options {
        catalog: Some(catalog_without(&spec(), &image)),
        ..with_profile()
    });
    let mut last = None;
    for _ in 0..3_000 {
        let m = rt.m_inspect(&k).unwrap();
        if m.last_error.is_some() {
            last = Some(m);
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let m = last.expect("the reason was recorded");
    let e = m.last_error.clone().unwrap();
    assert_eq!(
        (e.category.as_str(), e.reason.as_str()),
        ("unsupported_capability", "artifact_not_in_catalog"),
        "{e:?}"
    );
    assert_eq!(m.state, MS::Accepted);
    assert!(m.assignment.is_none() && m.reservation.is_none());
    rt.m_lifecycle(&k, Op::Delete, m.version).unwrap();
    let m = rt.m_wait(&k, 30_000).unwrap();
    assert_eq!((m.state, m.operation), (MS::Deleted, Op::None), "{m:?}");
    assert_eq!(m.next_due_at_ms, None);
    assert_eq!(w.request_count(Route::MachinesCreate), creates);
    assert_eq!(w.request_count(Route::MachineDelete), 0, "no worker call");
    rt.shutdown();
}

/// Instantiates the configuration cases for `$shell`, one `#[test]` per
/// case and store (`mod config_sqlite`, `mod config_postgres`).
#[macro_export]
macro_rules! managed_config_suite {
    ($shell:ty) => {
        mod config_sqlite {
            $crate::managed_config_suite!(@store $shell, $crate::managed_cases::StoreKind::Sqlite);
        }
        mod config_postgres {
            $crate::managed_config_suite!(@store $shell, $crate::managed_cases::StoreKind::Postgres);
        }
    };
    (@store $shell:ty, $kind:expr) => {
        $crate::managed_config_suite!(@cases $shell, $kind,
            a_named_machine_refuses_an_extended_command_before_acceptance,
            a_runtime_without_machines_resolves_stored_duplicates,
            a_machine_no_catalog_holds_waits_with_its_reason_and_is_deleted_unsent,
        );
    };
    (@cases $shell:ty, $kind:expr, $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                $crate::managed_config_cases::$case::<$shell>($kind);
            }
        )*
    };
}
