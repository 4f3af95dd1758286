//! Deterministic sample specs and records for tests of stores, runtimes and
//! this module: every record it returns is built through the real patch
//! functions, so it is valid by construction.

use std::collections::BTreeMap;

use super::RecordKey;
use super::fingerprint::{FingerprintKey, exec_fingerprint, machine_fingerprint};
use super::patch::{ExecPatch, MachinePatch, apply_exec, apply_machine};
use super::record::{CreationEvidence, ExecResult, ExecutionRecord, MachineRecord};
use super::spec::{
    Action, ArtifactKind, ArtifactRef, CommandSpec, ExecutionSpec, OutputFile, ProfileBudgets,
    ProfileRef, RetainedMachineSpec,
};
use super::state::{Collection, ExecState, MachineOperation, MachinePhase, MachineRecordState};
use crate::Error;

/// The fingerprint key used by samples (32 bytes of `0x42`).
pub fn fingerprint_key() -> FingerprintKey {
    FingerprintKey::new(&[0x42; 32]).unwrap_or_else(|_| unreachable!("32 bytes is a valid key"))
}

/// A record key; panics on a non-identifier (test input).
pub fn key(scope: &str, id: &str) -> RecordKey {
    RecordKey {
        scope: scope.to_owned(),
        id: id.to_owned(),
    }
}

/// A disposable command spec whose argv, env, stdin and workdir all carry
/// `sentinel`.
pub fn exec_spec(sentinel: &str) -> ExecutionSpec {
    let mut env = BTreeMap::new();
    env.insert("SECRET".to_owned(), format!("env-{sentinel}"));
    ExecutionSpec {
        artifact: ArtifactRef {
            kind: ArtifactKind::Image,
            id: "alpine".to_owned(),
            sha256: "a".repeat(64),
            architecture: "x86_64".to_owned(),
        },
        profile: ProfileRef {
            id: "small".to_owned(),
            budgets: ProfileBudgets::DEFAULT,
            per_file_max: 1_048_576,
        },
        action: Action::Command(CommandSpec {
            argv: vec!["echo".to_owned(), format!("argv-{sentinel}")],
            env,
            workdir: Some(format!("/workspace/{sentinel}")),
            stdin_b64: Some(format!("stdin-{sentinel}")),
            timeout_s: Some(10),
            background: false,
            user: None,
        }),
        machine: None,
        worker_machine: None,
        inputs: Vec::new(),
        outputs: vec![OutputFile {
            path: format!("/workspace/out-{sentinel}"),
            destination: "dest-1".to_owned(),
            max_size: 1_024,
        }],
        queue_budget_ms: 60_000,
        retention_ms: 86_400_000,
        metadata: BTreeMap::new(),
        network: None,
        guest_paths: None,
    }
}

/// A command spec on the retained machine `machine` (same artifact and
/// profile as [`machine_spec`]).
pub fn managed_exec_spec(sentinel: &str, machine: &RecordKey) -> ExecutionSpec {
    let mut s = exec_spec(sentinel);
    s.machine = Some(machine.clone());
    s
}

/// A retained machine spec.
pub fn machine_spec() -> RetainedMachineSpec {
    let e = exec_spec("m");
    RetainedMachineSpec {
        artifact: e.artifact,
        profile: e.profile,
        ports: Vec::new(),
        workload: None,
        checkpointable: false,
        network: None,
        guest_paths: None,
    }
}

/// A fresh accepted execution record.
pub fn accepted(key: RecordKey, spec: ExecutionSpec, now_ms: u64) -> ExecutionRecord {
    let fp = exec_fingerprint(&fingerprint_key(), &spec);
    ExecutionRecord::accepted(key, fp, spec, now_ms)
        .unwrap_or_else(|e| panic!("sample record is valid: {e}"))
}

/// A fresh accepted machine record.
pub fn accepted_machine(key: RecordKey, spec: RetainedMachineSpec, now_ms: u64) -> MachineRecord {
    let fp = machine_fingerprint(&fingerprint_key(), &spec);
    MachineRecord::accepted(key, fp, spec, now_ms)
        .unwrap_or_else(|e| panic!("sample machine is valid: {e}"))
}

/// The sample exit result.
pub const EXIT: ExecResult = ExecResult::Exited {
    exit_code: 0,
    output_bytes: 12,
    truncated: false,
};

/// The patch that enters `to` from `rec` with the evidence, result and
/// collection `to` requires (C13.2), keeping what is already allowed.
pub fn entry_patch(rec: &ExecutionRecord, to: ExecState) -> ExecPatch {
    let evidence = if to.allowed_evidence().contains(&rec.evidence) {
        None
    } else {
        Some(to.allowed_evidence()[0])
    };
    let result = match to {
        ExecState::Collecting | ExecState::Completed | ExecState::CollectionFailed => Some(EXIT),
        ExecState::Launched => Some(ExecResult::Launched {
            launched_at_ms: rec.updated_at_ms,
        }),
        _ => None,
    };
    let collection = match to {
        ExecState::Completed | ExecState::Launched => Some(Collection::Complete),
        ExecState::CollectionFailed => Some(Collection::Failed),
        _ => None,
    };
    ExecPatch {
        state: Some(to),
        evidence,
        result,
        collection,
        ..ExecPatch::default()
    }
}

/// The states passed through on the way from `accepted` to `state`.
pub fn path_to(state: ExecState) -> &'static [ExecState] {
    use ExecState::*;
    match state {
        Accepted => &[],
        Preparing => &[Preparing],
        Ready => &[Preparing, Ready],
        Dispatching => &[Preparing, Ready, Dispatching],
        Running => &[Preparing, Ready, Dispatching, Running],
        Collecting => &[Preparing, Ready, Dispatching, Running, Collecting],
        Completed => &[
            Preparing,
            Ready,
            Dispatching,
            Running,
            Collecting,
            Completed,
        ],
        CollectionFailed => &[Preparing, Ready, Dispatching, Collecting, CollectionFailed],
        Launched => &[Preparing, Ready, Dispatching, Launched],
        Failed => &[Preparing, Failed],
        Cancelled => &[Cancelled],
        Expired => &[Expired],
        Unknown => &[Preparing, Ready, Dispatching, Unknown],
        Cancelling => &[Preparing, Ready, Dispatching, Running, Cancelling],
    }
}

/// A managed-command record moved to `state` through legal patches, one
/// millisecond apart starting at `now_ms`.
///
/// # Errors
/// Never for the sample; a failure means a transition rule broke.
pub fn exec_in(state: ExecState, key: RecordKey, now_ms: u64) -> Result<ExecutionRecord, Error> {
    let machine = self::key(&key.scope, "machine-1");
    let mut rec = accepted(key, managed_exec_spec("s", &machine), now_ms);
    for (i, s) in path_to(state).iter().enumerate() {
        rec = apply_exec(&rec, &entry_patch(&rec, *s), now_ms + 1 + i as u64)?;
    }
    Ok(rec)
}

/// A machine record moved to `state` through legal patches.
///
/// # Errors
/// Never for the sample.
pub fn machine_in(
    state: MachineRecordState,
    key: RecordKey,
    now_ms: u64,
) -> Result<MachineRecord, Error> {
    use MachineRecordState::*;
    let mut rec = accepted_machine(key, machine_spec(), now_ms);
    let path: &[MachineRecordState] = match state {
        Accepted => &[],
        Creating => &[Creating],
        Created => &[Creating, Created],
        Running => &[Creating, Running],
        Stopped => &[Creating, Running, Stopped],
        Starting => &[Creating, Created, Starting],
        Stopping => &[Creating, Running, Stopping],
        Deleting => &[Creating, Running, Deleting],
        Unknown => &[Creating, Unknown],
        Missing => &[Creating, Missing],
        Conflict => &[Conflict],
        Deleted => &[Deleted],
    };
    for (i, s) in path.iter().enumerate() {
        let creation = s.needs_creation_evidence().then(|| CreationEvidence {
            created_at_ms: now_ms,
            incarnation: "inc-1".to_owned(),
        });
        let operation = match s {
            Creating => Some((MachineOperation::Create, MachinePhase::Dispatching)),
            Starting => Some((MachineOperation::Start, MachinePhase::Dispatching)),
            Stopping => Some((MachineOperation::Stop, MachinePhase::Dispatching)),
            Deleting => Some((MachineOperation::Delete, MachinePhase::Dispatching)),
            _ => Some((MachineOperation::None, MachinePhase::None)),
        };
        let patch = MachinePatch {
            state: Some(*s),
            operation,
            creation,
            ..MachinePatch::default()
        };
        rec = apply_machine(&rec, &patch, now_ms + 1 + i as u64)?;
    }
    Ok(rec)
}
