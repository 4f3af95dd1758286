//! The record-shape rules (`ExecutionSpec::validate`,
//! `ExecutionRecord::validate`), each at its bound N (accepted) and one
//! past it, N + 1 (refused: `validation`, operation `store_write`, its own
//! reason, with the limit where the rule carries one).
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use smolbox_core::managed::ExecutionRecord;
use smolbox_core::managed::ExecutionSpec;
use smolbox_core::managed::record::{
    CollectedArtifact, ErrorEntry, MAX_ARTIFACTS, MAX_ERROR_HISTORY,
};
use smolbox_core::managed::spec::{
    InputFile, MAX_FILES, MAX_METADATA, MAX_METADATA_STRING, MetaValue, OutputFile,
};
use smolbox_core::managed::testkit::{accepted, exec_spec, key};
use smolbox_core::{Category, Error, Evidence, Operation, Reason};

fn spec_with(edit: impl FnOnce(&mut ExecutionSpec)) -> ExecutionSpec {
    let mut spec = exec_spec("shape");
    edit(&mut spec);
    spec
}

fn check_spec(spec: &ExecutionSpec) -> Result<(), Error> {
    spec.validate()
}

fn assert_refused(r: Result<(), Error>, reason: Reason, limit: Option<(u64, u64)>) {
    let e = r.unwrap_err();
    assert_eq!(
        (e.category(), e.operation(), e.evidence(), e.reason()),
        (
            Category::Validation,
            Operation::StoreWrite,
            Evidence::NotDispatched,
            reason
        )
    );
    if limit.is_some() {
        assert_eq!(e.limit().map(|l| (l.actual, l.max)), limit);
    }
}

fn inputs(n: usize) -> Vec<InputFile> {
    (0..n)
        .map(|i| InputFile {
            path: format!("/workspace/in-{i:03}"),
            source: format!("src-{i}"),
            sha256: "b".repeat(64),
            size: 1,
        })
        .collect()
}

fn outputs(n: usize) -> Vec<OutputFile> {
    (0..n)
        .map(|i| OutputFile {
            path: format!("/workspace/out-{i:03}"),
            destination: format!("dest-{i}"),
            max_size: 1_024,
        })
        .collect()
}

#[test]
fn input_and_output_files_are_at_most_32_each() {
    let n = MAX_FILES;
    assert_eq!(n, 32);
    check_spec(&spec_with(|s| s.inputs = inputs(n))).unwrap();
    check_spec(&spec_with(|s| s.outputs = outputs(n))).unwrap();
    let limit = Some(((n + 1) as u64, n as u64));
    assert_refused(
        check_spec(&spec_with(|s| s.inputs = inputs(n + 1))),
        Reason::TooManyFiles,
        limit,
    );
    assert_refused(
        check_spec(&spec_with(|s| s.outputs = outputs(n + 1))),
        Reason::TooManyFiles,
        limit,
    );
}

#[test]
fn metadata_is_at_most_16_entries_of_at_most_256_bytes() {
    let entries = |n: usize| {
        (0..n)
            .map(|i| (format!("k{i:02}"), MetaValue::String("v".into())))
            .collect()
    };
    assert_eq!((MAX_METADATA, MAX_METADATA_STRING), (16, 256));
    check_spec(&spec_with(|s| s.metadata = entries(MAX_METADATA))).unwrap();
    assert_refused(
        check_spec(&spec_with(|s| s.metadata = entries(MAX_METADATA + 1))),
        Reason::TooManyMetadata,
        Some((17, 16)),
    );
    let string = |len: usize| {
        spec_with(|s| {
            s.metadata
                .insert("note".into(), MetaValue::String("x".repeat(len)));
        })
    };
    check_spec(&string(MAX_METADATA_STRING)).unwrap();
    assert_refused(
        check_spec(&string(MAX_METADATA_STRING + 1)),
        Reason::MetadataString,
        Some((257, 256)),
    );
}

#[test]
fn queue_budget_is_1_to_86_400_000_ms() {
    for ok in [1, 86_400_000] {
        check_spec(&spec_with(|s| s.queue_budget_ms = ok)).unwrap();
    }
    for bad in [0, 86_400_001] {
        assert_refused(
            check_spec(&spec_with(|s| s.queue_budget_ms = bad)),
            Reason::QueueBudget,
            None,
        );
    }
}

#[test]
fn retention_is_60_000_to_2_592_000_000_ms() {
    for ok in [60_000, 2_592_000_000] {
        check_spec(&spec_with(|s| s.retention_ms = ok)).unwrap();
    }
    for bad in [59_999, 2_592_000_001] {
        assert_refused(
            check_spec(&spec_with(|s| s.retention_ms = bad)),
            Reason::Retention,
            None,
        );
    }
}

fn record() -> ExecutionRecord {
    let spec = spec_with(|s| s.outputs = outputs(MAX_FILES));
    accepted(key("shape", "r"), spec, 1_700_000_000_000)
}

#[test]
fn a_record_holds_at_most_32_artifacts() {
    assert_eq!(MAX_ARTIFACTS, 32);
    let artifact = |i: usize| CollectedArtifact {
        path: format!("/workspace/out-{i:03}"),
        destination: format!("dest-{i}"),
        size: 1,
        sha256: "c".repeat(64),
    };
    let mut rec = record();
    rec.validate().unwrap();
    rec.artifacts = (0..MAX_ARTIFACTS).map(artifact).collect();
    rec.validate().unwrap();
    // One more than the bound (its path sorts last; it is not declared,
    // but the count is judged first).
    rec.artifacts.push(artifact(MAX_ARTIFACTS));
    assert_refused(rec.validate(), Reason::TooManyArtifacts, Some((33, 32)));
}

#[test]
fn a_record_keeps_at_most_8_errors() {
    assert_eq!(MAX_ERROR_HISTORY, 8);
    let e = Error::transport(
        Operation::Exec,
        Evidence::NotDispatched,
        Reason::ConnectFailed,
    );
    let mut rec = record();
    rec.errors = (0..MAX_ERROR_HISTORY as u64)
        .map(|i| ErrorEntry::from_error(&e, 1_700_000_000_000 + i))
        .collect();
    rec.validate().unwrap();
    rec.errors
        .push(ErrorEntry::from_error(&e, 1_700_000_000_100));
    assert_refused(rec.validate(), Reason::ErrorHistory, None);
}
