//! Machines created from an approved checkpoint through a catalog (C11.1,
//! C12.2): the approval's worker path is the create's source; what a
//! checkpoint source cannot carry (a network allowlist, ports) is refused
//! at acceptance, before anything is stored.

use super::machines::{mkey, mspec};
use super::*;
use crate::managed::catalog::{Architecture, Catalog, Floor, Platform, ProfileRevision};
use crate::managed::spec::{ArtifactKind, ProfileNetwork, ReservedPort};
use crate::worker::Source;

const ZERO: &str = "0000000000000000000000000000000000000000000000000000000000000000";
const PATH: &str = "/checkpoints/unverified.smolcheckpoint";

/// A catalogued worker approving checkpoint `unverified` at [`PATH`].
fn approving() -> ControllerConfig {
    let floor = Floor {
        storage_gb: 1,
        overlay_gb: 1,
        host_overhead_mb: 128,
    };
    let cat = Catalog::new(Platform::Linux, Architecture::host(), floor)
        .with_checkpoint("unverified", ZERO, PATH)
        .with_profile(ProfileRevision::new("default"));
    let mut c = disposable_config();
    let w = c.workers.remove(0).with_machine_source(Source::Oci {
        reference: "alpine:3.19".to_owned(),
    });
    c.workers.push(w.with_catalog(cat));
    c
}

fn checkpoint_spec() -> ExecutionSpec {
    let mut spec = spec_for(&cmd(), &RunTarget::unverified(), WORKER, "x").unwrap();
    spec.worker_machine = None;
    spec.artifact.kind = ArtifactKind::Checkpoint;
    spec
}

fn created_from(s: &Sim) -> Source {
    let Some((_, WorkerOp::Create { spec, .. })) =
        s.worker.iter().find(|(_, op)| op.name() == "create")
    else {
        panic!("{:?}", s.worker)
    };
    spec.source.clone()
}

#[test]
fn a_disposable_machine_is_created_from_the_approvals_path() {
    let mut s = Sim::new(approving());
    let key = RecordKey::new("s", "cp").unwrap();
    s.submit_keyed(&key, checkpoint_spec());
    s.settle();
    assert_eq!(
        created_from(&s),
        Source::Checkpoint {
            path: PATH.to_owned()
        },
        "not the entry's development source"
    );
}

#[test]
fn a_retained_machine_is_created_from_the_approvals_path() {
    let mut s = Sim::new(approving());
    s.settle();
    let mut spec = mspec();
    spec.artifact.kind = ArtifactKind::Checkpoint;
    s.request(MachineRequest::Create { key: mkey(), spec })
        .unwrap();
    s.settle();
    assert_eq!(
        created_from(&s),
        Source::Checkpoint {
            path: PATH.to_owned()
        }
    );
}

#[test]
fn what_a_checkpoint_source_cannot_carry_is_refused_before_anything_is_stored() {
    let mut s = Sim::new(approving());
    s.settle();
    let mut spec = checkpoint_spec();
    spec.network = Some(ProfileNetwork {
        allow: vec!["example.com".to_owned()],
    });
    let key = RecordKey::new("s", "net").unwrap();
    let e = s
        .ctl
        .submit(
            s.now,
            s.now_ms,
            Submit {
                key: key.clone(),
                spec,
            },
        )
        .unwrap_err();
    assert_eq!(
        (e.category(), e.reason(), e.evidence()),
        (
            Category::Validation,
            Reason::CheckpointSourceRestrictions,
            Evidence::NotDispatched
        ),
        "{e:?}"
    );
    let mut m = mspec();
    m.artifact.kind = ArtifactKind::Checkpoint;
    m.ports = vec![ReservedPort {
        host: 8080,
        guest: 80,
    }];
    let e = s
        .request(MachineRequest::Create {
            key: mkey(),
            spec: m,
        })
        .unwrap_err();
    assert_eq!(
        (e.category(), e.reason()),
        (Category::Validation, Reason::CheckpointSourceRestrictions),
        "{e:?}"
    );
    s.settle();
    assert!(s.store.records.is_empty() && s.store.machines.is_empty());
    assert!(s.worker.is_empty(), "{:?}", s.worker);
}
