//! Declared files and background launches through both shells' `Runtime`
//! (issue 12 item 2, C5.4, C6.4): inputs staged from the runtime's
//! artifact store before dispatch, outputs collected into it after the
//! exit, a background command on a retained machine ending `launched`;
//! against the devworker on SQLite and PostgreSQL, with the managed
//! suite's fixture (`managed_cases::setup`). Registered by
//! [`managed_file_suite!`](crate::managed_file_suite). Devworker request
//! counters prove what reached the worker.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::sync::Arc;

use smolbox_core::exec::Command;
use smolbox_core::managed::controller::{RunTarget, Submit, spec_for};
use smolbox_core::managed::record::ExecResult;
use smolbox_core::managed::spec::{ExecutionSpec, InputFile, OutputFile};
use smolbox_core::managed::state::{Cleanup, Collection, MachineRecordState as MS};
use smolbox_core::managed::{ExecState, RecordEvidence, RecordKey};
use smolbox_core::{Category, Evidence, Reason};
use smolbox_devworker::Route;
use smolbox_store::artifacts::{MemoryArtifacts, sha256_hex};

use crate::managed::{ManagedShell, Options, WORKER};
use crate::managed_cases::{StoreKind, eventually, setup};
use crate::managed_machine_cases::{key as box_key, running, slot_empty};

const SENTINEL: &str = "SENTINEL-FILES-93c1e7";

fn key(id: &str) -> RecordKey {
    RecordKey::new("files", id).unwrap()
}

fn options(artifacts: &Arc<MemoryArtifacts>) -> Options {
    Options {
        disposable: true,
        lease_ttl_ms: 2_000,
        artifacts: Some(Arc::clone(artifacts)),
        ..Options::default()
    }
}

/// A disposable spec running `script` with `inputs` and `outputs`.
fn spec(script: &str, inputs: Vec<InputFile>, outputs: Vec<OutputFile>) -> ExecutionSpec {
    let cmd = Command::new(["sh", "-c", script]);
    let mut spec = spec_for(&cmd, &RunTarget::unverified().fitting(&cmd), WORKER, "x").unwrap();
    spec.worker_machine = None;
    spec.inputs = inputs;
    spec.outputs = outputs;
    spec
}

fn input(a: &MemoryArtifacts, path: &str, source: &str, bytes: &[u8]) -> InputFile {
    let sha256 = a.insert("files", source, bytes.to_vec());
    InputFile {
        path: path.into(),
        source: source.into(),
        sha256,
        size: bytes.len() as u64,
    }
}

fn output(path: &str, destination: &str, max: u64) -> OutputFile {
    OutputFile {
        path: path.into(),
        destination: destination.into(),
        max_size: max,
    }
}

/// Two inputs staged (uploaded, read back) before the one exec; two
/// outputs collected into the artifact store, their sizes and digests (not
/// their bytes) recorded; the machine deleted and released after.
pub fn inputs_are_staged_and_outputs_collected_on_a_disposable_machine<M: ManagedShell>(
    kind: StoreKind,
) {
    let capturing = crate::trace_capture::install();
    let Some(s) = setup(kind) else { return };
    let a = Arc::new(MemoryArtifacts::new());
    let rt: M = s.runtime(&options(&a));
    let alpha = format!("alpha {SENTINEL}\n");
    let inputs = vec![
        input(&a, "/workspace/a.txt", "in-a", alpha.as_bytes()),
        input(&a, "/workspace/b.txt", "in-b", b"bravo\n"),
    ];
    let outputs = vec![
        output("/workspace/cat.txt", "cat", 1_024),
        output("/workspace/n.txt", "n", 64),
    ];
    let script = "cat /workspace/a.txt /workspace/b.txt > /workspace/cat.txt; \
                  wc -l < /workspace/cat.txt | tr -d ' ' > /workspace/n.txt; exit 3";
    let k = key("f1");
    rt.submit(Submit {
        key: k.clone(),
        spec: spec(script, inputs, outputs),
    })
    .unwrap();
    let out = rt.wait(&k, 30_000).unwrap();
    let rec = &out.record;
    assert_eq!(rec.state, ExecState::Completed, "{:?}", out.error);
    assert_eq!(out.exit_code(), Some(3));
    assert_eq!(rec.collection, Collection::Complete);
    let cat = a.output(&k, "cat").unwrap();
    let n = a.output(&k, "n").unwrap();
    assert_eq!(&cat.1[..], format!("{alpha}bravo\n").as_bytes());
    assert_eq!(&n.1[..], b"2\n");
    assert_eq!(rec.artifacts.len(), 2);
    assert_eq!(rec.artifacts[0].destination, "cat");
    assert_eq!(rec.artifacts[0].sha256, sha256_hex(&cat.1));
    assert_eq!(rec.artifacts[0].sha256, cat.0);
    assert_eq!(rec.artifacts[0].size, cat.1.len() as u64);
    assert_eq!(rec.artifacts[1].sha256, sha256_hex(b"2\n"));
    let w = &s.fixture.worker;
    assert_eq!(w.request_count(Route::FilesPut), 2, "each input once");
    assert_eq!(
        w.request_count(Route::FilesGet),
        4,
        "two read-backs, two outputs"
    );
    assert_eq!(s.execs(), 1);
    let rec = eventually(&rt, &k, |r| r.reservation.is_none());
    assert_eq!(rec.cleanup, Cleanup::Complete);
    assert_eq!(w.request_count(Route::MachineDelete), 1);
    rt.shutdown();
    // File bytes (the input, and the output that copies it) never reach
    // a record's `Debug`, the tracing output or the store's files.
    assert!(!format!("{rec:?}").contains(SENTINEL));
    assert!(
        capturing,
        "the capturing subscriber is this binary's default"
    );
    let traced = crate::trace_capture::text();
    assert!(traced.contains("id=f1"), "the run was traced: {traced}");
    assert!(!traced.contains(SENTINEL), "file bytes reached tracing");
    let all = s.all_bytes();
    assert!(
        !all.windows(SENTINEL.len())
            .any(|w| w == SENTINEL.as_bytes()),
        "an input's bytes reached the store"
    );
}

/// An output the command never wrote: `collection_failed`, the exit kept,
/// the machine still cleaned up; an input missing from the artifact store:
/// `failed` before dispatch, nothing executed.
pub fn a_failed_transfer_keeps_the_exit_or_fails_before_dispatch<M: ManagedShell>(kind: StoreKind) {
    let Some(s) = setup(kind) else { return };
    let a = Arc::new(MemoryArtifacts::new());
    let rt: M = s.runtime(&options(&a));
    let k = key("f2");
    let outputs = vec![
        output("/workspace/made.txt", "made", 64),
        output("/workspace/never.txt", "never", 64),
    ];
    rt.submit(Submit {
        key: k.clone(),
        spec: spec("echo hi > /workspace/made.txt; exit 4", vec![], outputs),
    })
    .unwrap();
    let out = rt.wait(&k, 30_000).unwrap();
    assert_eq!(out.record.state, ExecState::CollectionFailed);
    assert_eq!(out.record.collection, Collection::Partial);
    assert_eq!(out.record.evidence, RecordEvidence::Exited);
    assert!(matches!(
        out.record.result,
        Some(ExecResult::Exited { exit_code: 4, .. })
    ));
    assert_eq!(out.record.artifacts.len(), 1);
    assert_eq!(&a.output(&k, "made").unwrap().1[..], b"hi\n");
    // The worker answers a missing file with its internal error (as
    // smolvm does): the download's error is the outcome's.
    assert_eq!(
        out.error.as_ref().map(smolbox_core::Error::operation),
        Some(smolbox_core::Operation::Download),
        "{:?}",
        out.error
    );
    let rec = eventually(&rt, &k, |r| r.reservation.is_none());
    assert_eq!(rec.cleanup, Cleanup::Complete);
    assert_eq!(s.execs(), 1);
    // The input's bytes are not in the artifact store.
    let k2 = key("f3");
    let ghost = InputFile {
        path: "/workspace/ghost".into(),
        source: "ghost".into(),
        sha256: sha256_hex(b"boo"),
        size: 3,
    };
    rt.submit(Submit {
        key: k2.clone(),
        spec: spec("cat /workspace/ghost", vec![ghost], vec![]),
    })
    .unwrap();
    let out = rt.wait(&k2, 30_000).unwrap();
    assert_eq!(out.record.state, ExecState::Failed);
    assert_eq!(out.record.evidence, RecordEvidence::NotDispatched);
    assert_eq!(
        out.record.last_error.as_ref().unwrap().reason,
        Reason::ArtifactMissing.as_str()
    );
    assert_eq!(s.execs(), 1, "nothing more executed");
    assert_eq!(s.fixture.worker.request_count(Route::FilesPut), 0);
    eventually(&rt, &k2, |r| r.reservation.is_none());
    rt.shutdown();
}

/// Specs with files on a runtime without an artifact store, and a
/// background command off a retained machine, are refused at submit
/// (`unsupported_capability`, nothing stored).
pub fn files_without_an_artifact_store_and_disposable_background_are_refused<M: ManagedShell>(
    kind: StoreKind,
) {
    let Some(s) = setup(kind) else { return };
    let rt: M = s.runtime(&Options {
        disposable: true,
        ..Options::default()
    });
    let k = key("r1");
    let e = rt
        .submit(Submit {
            key: k.clone(),
            spec: spec("true", vec![], vec![output("/workspace/o", "o", 1)]),
        })
        .unwrap_err();
    assert_eq!(e.category(), Category::UnsupportedCapability);
    assert_eq!(e.reason(), Reason::FileTransfer);
    assert_eq!(e.evidence(), Evidence::NotDispatched);
    assert_eq!(rt.fetch(&k).unwrap_err().category(), Category::NotFound);
    let bg = Command::new(["sleep", "1"]).background(true);
    let mut sp = spec_for(&bg, &RunTarget::unverified(), WORKER, "x").unwrap();
    sp.worker_machine = None;
    let e = rt.submit(Submit { key: k, spec: sp }).unwrap_err();
    assert_eq!(e.reason(), Reason::Background);
    assert_eq!(s.fixture.worker.request_count(Route::MachinesCreate), 1);
    rt.shutdown();
}

/// A background command in a retained machine's slot: launched (not
/// completed) with launched evidence and no exit; the slot is released and
/// the machine keeps running; `wait` returns the launched record.
pub fn a_background_command_on_a_retained_machine_is_launched<M: ManagedShell>(kind: StoreKind) {
    let Some(s) = setup(kind) else { return };
    let a = Arc::new(MemoryArtifacts::new());
    let rt: M = s.runtime(&options(&a));
    running(&rt, "bgbox");
    let c = RecordKey::new("boxes", "bg1").unwrap();
    let bg =
        Command::new(["sh", "-c", "sleep 0.2; echo late > /workspace/late.txt"]).background(true);
    let (rec, _, _) = rt.m_submit(&box_key("bgbox"), &c, &bg).unwrap();
    assert_eq!(rec.state, ExecState::Dispatching);
    let out = rt.wait(&c, 30_000).unwrap();
    assert_eq!(out.record.state, ExecState::Launched, "{:?}", out.error);
    assert_eq!(out.record.evidence, RecordEvidence::Launched);
    assert!(matches!(
        out.record.result,
        Some(ExecResult::Launched { .. })
    ));
    assert_eq!(out.exit_code(), None, "a launch has no exit");
    assert_eq!(out.record.collection, Collection::Complete);
    let m = slot_empty(&rt, "bgbox");
    assert_eq!(m.state, MS::Running, "the machine keeps running the launch");
    let rec = rt.fetch(&c).unwrap();
    assert_eq!(rec.cleanup, Cleanup::Complete);
    assert_eq!(s.execs(), 1);
    // The slot takes the next command at once.
    let c2 = RecordKey::new("boxes", "bg2").unwrap();
    rt.m_submit(&box_key("bgbox"), &c2, &Command::new(["echo", "next"]))
        .unwrap();
    let out = rt.wait(&c2, 30_000).unwrap();
    assert_eq!(out.record.state, ExecState::Completed);
    assert_eq!(s.fixture.worker.request_count(Route::MachineStop), 0);
    rt.shutdown();
}

/// The machine record once `check` holds (polled: a slot finish follows
/// the command's terminal write, AC-14.3.2).
fn machine_when<M: ManagedShell>(
    rt: &M,
    id: &str,
    check: impl Fn(&smolbox_core::managed::MachineRecord) -> bool,
) -> smolbox_core::managed::MachineRecord {
    let mut m = rt.m_inspect(&box_key(id)).unwrap();
    for _ in 0..3_000 {
        if check(&m) {
            return m;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
        m = rt.m_inspect(&box_key(id)).unwrap();
    }
    panic!("the machine never got there: {m:?}");
}

/// Issue 12: a command in a retained machine's slot with declared files.
/// The input is staged inside the slot (uploaded, read back) before the
/// one exec and arrives with its declared digest (the command hashes it);
/// the outputs are collected after the exit into the artifact store, their
/// sizes and digests recorded and equal to the bytes stored; the slot is
/// released after the collection. The machine keeps the files: the next
/// command (without files) reads the output back.
pub fn slot_files_are_staged_and_collected_on_a_retained_machine<M: ManagedShell>(kind: StoreKind) {
    let Some(s) = setup(kind) else { return };
    let a = Arc::new(MemoryArtifacts::new());
    let rt: M = s.runtime(&options(&a));
    running(&rt, "fbox");
    let bytes = format!("slot input {SENTINEL}\n");
    // Inputs are read under the command's scope (`boxes`).
    let sha = a.insert("boxes", "in", bytes.as_bytes().to_vec());
    let inp = InputFile {
        path: "/workspace/in.txt".into(),
        source: "in".into(),
        sha256: sha.clone(),
        size: bytes.len() as u64,
    };
    let files = smolbox_core::managed::CommandFiles {
        inputs: vec![inp],
        outputs: vec![
            output("/workspace/copy.txt", "copy", 1_024),
            output("/workspace/sum.txt", "sum", 128),
        ],
    };
    let script = "cp /workspace/in.txt /workspace/copy.txt; \
                  sha256sum /workspace/in.txt | cut -d' ' -f1 > /workspace/sum.txt; exit 6";
    let c = RecordKey::new("boxes", "sf1").unwrap();
    let (rec, _, existing) = rt
        .m_submit_files(
            &box_key("fbox"),
            &c,
            &Command::new(["sh", "-c", script]),
            &files,
        )
        .unwrap();
    assert!(!existing);
    assert_eq!(rec.spec.inputs.len(), 1);
    let out = rt.wait(&c, 30_000).unwrap();
    let rec = &out.record;
    assert_eq!(rec.state, ExecState::Completed, "{:?}", out.error);
    assert_eq!(out.exit_code(), Some(6));
    assert_eq!(rec.collection, Collection::Complete);
    let sum = a.output(&c, "sum").unwrap();
    assert_eq!(
        String::from_utf8_lossy(&sum.1).trim(),
        sha,
        "the input arrived with its declared digest"
    );
    let copy = a.output(&c, "copy").unwrap();
    assert_eq!(&copy.1[..], bytes.as_bytes());
    assert_eq!(rec.artifacts.len(), 2);
    assert_eq!(rec.artifacts[0].destination, "copy");
    assert_eq!(rec.artifacts[0].sha256, sha256_hex(&copy.1));
    assert_eq!(rec.artifacts[0].size, copy.1.len() as u64);
    assert_eq!(rec.artifacts[1].sha256, sha256_hex(&sum.1));
    let w = &s.fixture.worker;
    assert_eq!(w.request_count(Route::FilesPut), 1, "the input once");
    assert_eq!(
        w.request_count(Route::FilesGet),
        3,
        "a read-back, two outputs"
    );
    assert_eq!(s.execs(), 1);
    let m = slot_empty(&rt, "fbox");
    assert_eq!(m.state, MS::Running);
    let rec = rt.fetch(&c).unwrap();
    assert_eq!(rec.cleanup, Cleanup::Complete);
    assert!(!format!("{rec:?}").contains(SENTINEL));
    // The next command, without files, finds the files on the machine.
    let c2 = RecordKey::new("boxes", "sf2").unwrap();
    rt.m_submit(
        &box_key("fbox"),
        &c2,
        &Command::new(["cat", "/workspace/copy.txt"]),
    )
    .unwrap();
    let out = rt.wait(&c2, 30_000).unwrap();
    assert_eq!(out.record.state, ExecState::Completed);
    assert_eq!(
        out.output.as_ref().map(|o| o.stdout.as_slice()),
        Some(bytes.as_bytes())
    );
    // Streamed with files: the input staged before the stream, the
    // output as it comes, the collected file after the exit.
    let c3 = RecordKey::new("boxes", "sf3").unwrap();
    let files = smolbox_core::managed::CommandFiles {
        inputs: files.inputs,
        outputs: vec![output("/workspace/again.txt", "again", 1_024)],
    };
    let mut seen = Vec::new();
    let script = "cat /workspace/in.txt | tee /workspace/again.txt; exit 1";
    let out = rt
        .m_run_streamed_files(
            &box_key("fbox"),
            &c3,
            &Command::new(["sh", "-c", script]),
            &files,
            &mut |e: &smolbox_core::exec::ExecEvent| {
                if let smolbox_core::exec::ExecEvent::Stdout(b) = e {
                    seen.extend_from_slice(b.as_bytes());
                }
            },
        )
        .unwrap();
    assert_eq!(out.record.state, ExecState::Completed, "{:?}", out.error);
    assert_eq!(out.exit_code(), Some(1));
    assert_eq!(seen, bytes.as_bytes());
    assert_eq!(&a.output(&c3, "again").unwrap().1[..], bytes.as_bytes());
    assert_eq!(s.fixture.worker.request_count(Route::ExecStream), 1);
    rt.shutdown();
}

/// Issue 12, C14.3: an output over its declared maximum fails the
/// collection: `collection_failed` with the exit kept and the output not
/// stored; failed collection keeps the slot (the machine `unknown`, the
/// command's cleanup `failed`), so the next command is refused. The output
/// at its maximum (N) is collected; one byte more (N + 1) is not.
pub fn an_oversized_slot_output_is_collection_failed_and_keeps_the_slot<M: ManagedShell>(
    kind: StoreKind,
) {
    let Some(s) = setup(kind) else { return };
    let a = Arc::new(MemoryArtifacts::new());
    let rt: M = s.runtime(&options(&a));
    running(&rt, "obox");
    let files = smolbox_core::managed::CommandFiles {
        inputs: Vec::new(),
        outputs: vec![
            output("/workspace/n.txt", "n", 8),
            output("/workspace/n1.txt", "n1", 8),
        ],
    };
    let script = "printf 12345678 > /workspace/n.txt; printf 123456789 > /workspace/n1.txt; exit 2";
    let c = RecordKey::new("boxes", "so1").unwrap();
    rt.m_submit_files(
        &box_key("obox"),
        &c,
        &Command::new(["sh", "-c", script]),
        &files,
    )
    .unwrap();
    let out = rt.wait(&c, 30_000).unwrap();
    let rec = &out.record;
    assert_eq!(rec.state, ExecState::CollectionFailed, "{:?}", out.error);
    assert_eq!(rec.collection, Collection::Partial);
    assert_eq!(rec.evidence, RecordEvidence::Exited);
    assert_eq!(out.exit_code(), Some(2));
    assert_eq!(
        out.error.as_ref().map(smolbox_core::Error::category),
        Some(Category::OutputLimit)
    );
    assert_eq!(rec.artifacts.len(), 1, "N collected");
    assert_eq!(&a.output(&c, "n").unwrap().1[..], b"12345678");
    assert!(a.output(&c, "n1").is_none(), "N + 1 not stored");
    let m = machine_when(&rt, "obox", |m| m.state == MS::Unknown);
    assert_eq!(m.active_execution.as_ref(), Some(&c), "the slot is kept");
    assert_eq!(rt.fetch(&c).unwrap().cleanup, Cleanup::Failed);
    let e = rt
        .m_submit(
            &box_key("obox"),
            &RecordKey::new("boxes", "so2").unwrap(),
            &Command::new(["true"]),
        )
        .unwrap_err();
    assert_eq!(e.category(), Category::AdmissionExhausted);
    assert_eq!(s.execs(), 1);
    rt.shutdown();
}

/// Files into a slot without an artifact store are refused before
/// anything is stored (`unsupported_capability`), and the slot stays free.
pub fn slot_files_without_an_artifact_store_are_refused<M: ManagedShell>(kind: StoreKind) {
    let Some(s) = setup(kind) else { return };
    let rt: M = s.runtime(&Options {
        disposable: true,
        ..Options::default()
    });
    running(&rt, "nbox");
    let files = smolbox_core::managed::CommandFiles {
        inputs: Vec::new(),
        outputs: vec![output("/workspace/o", "o", 1)],
    };
    let c = RecordKey::new("boxes", "sn1").unwrap();
    let e = rt
        .m_submit_files(&box_key("nbox"), &c, &Command::new(["true"]), &files)
        .unwrap_err();
    assert_eq!(e.category(), Category::UnsupportedCapability);
    assert_eq!(e.reason(), Reason::FileTransfer);
    assert_eq!(rt.fetch(&c).unwrap_err().category(), Category::NotFound);
    assert!(
        rt.m_inspect(&box_key("nbox"))
            .unwrap()
            .active_execution
            .is_none()
    );
    assert_eq!(s.execs(), 0);
    rt.shutdown();
}

/// Instantiates every file case for `$shell` (a [`ManagedShell`]), one
/// `#[test]` per case and store, against the devworker.
///
/// [`ManagedShell`]: crate::managed::ManagedShell
#[macro_export]
macro_rules! managed_file_suite {
    ($shell:ty) => {
        $crate::store_suite!(
            $shell,
            managed_file_cases,
            files_sqlite,
            files_postgres,
            [
                inputs_are_staged_and_outputs_collected_on_a_disposable_machine,
                a_failed_transfer_keeps_the_exit_or_fails_before_dispatch,
                files_without_an_artifact_store_and_disposable_background_are_refused,
                a_background_command_on_a_retained_machine_is_launched,
                slot_files_are_staged_and_collected_on_a_retained_machine,
                an_oversized_slot_output_is_collection_failed_and_keeps_the_slot,
                slot_files_without_an_artifact_store_are_refused,
            ]
        );
    };
}
