//! Version profiles: AC-0.3.1, AC-0.3.2 and exact-equality admission.
#![allow(clippy::unwrap_used)] // tests unwrap known-good values

mod worker_support;

use smolbox_core::worker::{
    Create, Feature, Health, MachineName, MachineSpec, NetworkPolicy, PortMapping, Profile,
    Version, WorkerCall,
};
use smolbox_core::{Category, Evidence, Operation};
use worker_support::*;

#[test]
fn ac_0_3_1_unknown_version_is_refused_for_every_feature() {
    let b = br#"{"status":"ok","version":"1.21.1"}"#;
    let h = Health::new().decode(&json(200, b), b).unwrap();
    let e = Profile::admit(&h.version, &[]).unwrap_err();
    assert_err(
        &e,
        Category::UnsupportedCapability,
        Operation::Health,
        Evidence::NotDispatched,
    );
    // Ranges and neighbours are never admitted.
    for v in [
        "1.21.1", "1.22.1", "1.9.3", "1.22", "v1.22.0", "1.22.0 ", "",
    ] {
        assert!(Profile::admit(v, &[]).is_err(), "{v}");
    }
}

#[test]
fn every_known_version_is_admitted_exactly() {
    for v in Version::ALL {
        let p = Profile::admit(v.as_str(), &[]).unwrap();
        assert_eq!(p.base(), v);
        assert_eq!(p.version_text(), v.as_str());
    }
}

#[test]
fn caller_may_supply_a_profile() {
    let custom = Profile::custom("1.21.1", Version::V1_20_2).unwrap();
    let p = Profile::admit("1.21.1", std::slice::from_ref(&custom)).unwrap();
    assert_eq!(p.base(), Version::V1_20_2);
    assert!(p.allows(Feature::Volumes));
    assert!(Profile::custom("not a version", Version::V1_20_2).is_err());
}

#[test]
fn ac_0_3_2_gated_operation_sends_nothing() {
    let old = Profile::known(Version::V1_14_6);
    let spec = MachineSpec {
        network: NetworkPolicy::allowlist(
            vec![smolbox_core::worker::Hostname::new("api.example.com").unwrap()],
            vec![],
        )
        .unwrap(),
        ..MachineSpec::default()
    };
    let e = Create::new(&old, MachineName::new("m1").unwrap(), &spec).unwrap_err();
    assert_err(
        &e,
        Category::UnsupportedCapability,
        Operation::Create,
        Evidence::NotDispatched,
    );
    assert!(!e.may_have_reached_worker());
    // Ports need 1.17.0: 1.16.1 refuses, 1.17.0 accepts.
    let spec = MachineSpec {
        ports: vec![PortMapping::new(18090, 80).unwrap()],
        source: smolbox_core::worker::Source::Image {
            path: "/images/a.smolmachine".into(),
        },
        ..MachineSpec::default()
    };
    assert!(
        Create::new(
            &Profile::known(Version::V1_16_1),
            MachineName::new("m1").unwrap(),
            &spec
        )
        .is_err()
    );
    let c = Create::new(
        &Profile::known(Version::V1_17_0),
        MachineName::new("m1").unwrap(),
        &spec,
    )
    .unwrap();
    assert!(c.request().is_ok());
}

#[test]
fn require_follows_the_feature_table() {
    let table = [
        (Feature::NetworkPolicy, Version::V1_16_0),
        (Feature::CheckpointCreate, Version::V1_16_1),
        (Feature::PortMappings, Version::V1_17_0),
        (Feature::StartupWorkload, Version::V1_17_0),
        (Feature::ExtendedExec, Version::V1_17_0),
        (Feature::LargeFiles, Version::V1_17_0),
        (Feature::ConsoleLogs, Version::V1_17_0),
        (Feature::Terminals, Version::V1_17_0),
        (Feature::RegistrySources, Version::V1_19_0),
        (Feature::Branches, Version::V1_19_0),
        (Feature::CheckpointCapture, Version::V1_19_0),
        (Feature::DiskGrowth, Version::V1_20_2),
        (Feature::HostMounts, Version::V1_20_2),
        (Feature::Volumes, Version::V1_20_2),
    ];
    for (feature, min) in table {
        for v in Version::ALL.into_iter().filter(|v| *v != Version::V1_9_2) {
            let r = Profile::known(v).require(feature, Operation::Exec);
            assert_eq!(r.is_ok(), v >= min, "{feature:?} on {v:?}");
            if let Err(e) = r {
                assert_err(
                    &e,
                    Category::UnsupportedCapability,
                    Operation::Exec,
                    Evidence::NotDispatched,
                );
            }
        }
    }
}

#[test]
fn one_nine_two_spellings() {
    let p = v192();
    assert!(p.uses_fork_spelling());
    assert!(!p.checks_bearer());
    assert_eq!(p.branchable_key(), "forkable");
    assert_eq!(v122().branchable_key(), "branchable");
    assert!(v122().checks_bearer());
    assert!(
        p.require(Feature::CheckpointCreate, Operation::Create)
            .is_err()
    );
    assert!(p.require(Feature::NetworkPolicy, Operation::Create).is_ok());
    // A caller may narrow, never widen.
    let narrow = v122().restricted_to(&[Feature::Volumes]);
    assert!(narrow.allows(Feature::Volumes) && !narrow.allows(Feature::Terminals));
}
