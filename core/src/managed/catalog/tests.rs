use super::*;
use crate::error::{Category, Evidence};

const SHA: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

fn floor() -> Floor {
    Floor {
        storage_gb: 1,
        overlay_gb: 1,
        host_overhead_mb: 128,
    }
}

fn catalog() -> Catalog {
    Catalog::new(Platform::Linux, Architecture::X86_64, floor())
        .with_image("alpine", SHA, "/images/alpine.smolmachine")
        .with_profile(ProfileRevision::new("small"))
}

fn artifact() -> ArtifactRef {
    ArtifactRef {
        kind: ArtifactKind::Image,
        id: "alpine".to_owned(),
        sha256: SHA.to_owned(),
        architecture: "x86_64".to_owned(),
    }
}

fn reason(r: Result<(), Error>) -> Reason {
    let e = r.expect_err("refused");
    e.reason()
}

#[test]
fn a_minimal_catalog_is_valid_and_supports_its_artifact_and_profile() {
    let c = catalog();
    c.validate(Some("1.22.0")).unwrap();
    c.supports(&artifact(), &ProfileRevision::new("small").reference())
        .unwrap();
}

#[test]
fn profile_ranges_accept_each_bound_and_refuse_one_beyond() {
    type Set = fn(&mut ProfileRevision, u64);
    #[allow(clippy::cast_possible_truncation)]
    let fields: [(&str, Set, u64, u64); 12] = [
        ("cpus", |p, v| p.cpus = v as u32, 1, 64),
        ("memory", |p, v| p.memory_mb = v as u32, 128, 16_384),
        ("storage", |p, v| p.storage_gb = v as u32, 1, 64),
        ("overlay", |p, v| p.overlay_gb = v as u32, 1, 64),
        (
            "overhead",
            |p, v| p.host_overhead_mb = v as u32,
            128,
            16_384,
        ),
        ("output", |p, v| p.output_allowance = v, 1, 8_388_608),
        (
            "per_file",
            |p, v| {
                p.per_file_max = v;
                p.per_direction_max = p.per_direction_max.max(v);
            },
            1,
            16_777_216,
        ),
        (
            "aggregate",
            |p, v| {
                p.per_direction_max = v;
                p.per_file_max = p.per_file_max.min(v.max(1));
            },
            1,
            67_108_864,
        ),
        ("prep", |p, v| p.budgets.preparation_ms = v, 1_000, 300_000),
        ("exec", |p, v| p.budgets.execution_ms = v, 1_000, 86_460_000),
        (
            "collect",
            |p, v| p.budgets.collection_ms = v,
            1_000,
            300_000,
        ),
        ("cleanup", |p, v| p.budgets.cleanup_ms = v, 1_000, 300_000),
    ];
    for (name, set, min, max) in fields {
        for (v, ok) in [(min - 1, false), (min, true), (max, true), (max + 1, false)] {
            let mut p = ProfileRevision::new("p");
            set(&mut p, v);
            let r = p.validate();
            assert_eq!(r.is_ok(), ok, "{name} = {v}: {r:?}");
            if let Err(e) = r {
                assert_eq!(e.category(), Category::Validation, "{name}");
                assert_eq!(e.reason(), Reason::ProfileRange, "{name}");
            }
        }
    }
}

#[test]
fn the_aggregate_must_be_at_least_the_per_file_size() {
    let mut p = ProfileRevision::new("p");
    p.per_file_max = 2_000;
    p.per_direction_max = 2_000;
    p.validate().unwrap();
    p.per_direction_max = 1_999;
    assert_eq!(reason(p.validate()), Reason::ProfileRange);
    p.id = String::new();
    assert_eq!(reason(p.validate()), Reason::ProfileId);
}

#[test]
fn floor_ranges_accept_each_bound_and_refuse_one_beyond() {
    type Set = fn(&mut Floor, u32);
    let fields: [(Set, u32, u32); 3] = [
        (|f, v| f.storage_gb = v, 1, 64),
        (|f, v| f.overlay_gb = v, 1, 64),
        (|f, v| f.host_overhead_mb = v, 128, 16_384),
    ];
    for (set, min, max) in fields {
        for (v, ok) in [(min - 1, false), (min, true), (max, true), (max + 1, false)] {
            let mut c = catalog();
            set(&mut c.floor, v);
            let r = c.validate(None);
            assert_eq!(r.is_ok(), ok, "{v}: {r:?}");
            if !ok {
                assert_eq!(reason(r), Reason::CatalogFloor);
            }
        }
    }
}

#[test]
fn counts_of_images_checkpoints_and_profiles() {
    let images = |n: usize| {
        let mut c = Catalog::new(Platform::Linux, Architecture::X86_64, floor())
            .with_profile(ProfileRevision::new("small"));
        for i in 0..n {
            c = c.with_image(&format!("i{i}"), SHA, &format!("/i/{i}.smolmachine"));
        }
        c
    };
    images(MAX_IMAGES).validate(None).unwrap();
    assert_eq!(
        reason(images(MAX_IMAGES + 1).validate(None)),
        Reason::CatalogImages
    );
    // Zero images is fine with a checkpoint; neither is refused.
    assert_eq!(reason(images(0).validate(None)), Reason::CatalogNoArtifact);
    images(0)
        .with_checkpoint("cp", SHA, "/c/cp.smolcheckpoint")
        .validate(None)
        .unwrap();

    let checkpoints = |n: usize| {
        let mut c = catalog();
        for i in 0..n {
            c = c.with_checkpoint(&format!("c{i}"), SHA, "/c/x.checkpoint");
        }
        c
    };
    checkpoints(MAX_CHECKPOINTS).validate(None).unwrap();
    assert_eq!(
        reason(checkpoints(MAX_CHECKPOINTS + 1).validate(None)),
        Reason::CatalogCheckpoints
    );

    let profiles = |n: usize| {
        let mut c = Catalog::new(Platform::Linux, Architecture::X86_64, floor()).with_image(
            "alpine",
            SHA,
            "/a.smolmachine",
        );
        for i in 0..n {
            c = c.with_profile(ProfileRevision::new(&format!("p{i}")));
        }
        c
    };
    assert_eq!(reason(profiles(0).validate(None)), Reason::CatalogProfiles);
    profiles(1).validate(None).unwrap();
    profiles(MAX_PROFILES).validate(None).unwrap();
    assert_eq!(
        reason(profiles(MAX_PROFILES + 1).validate(None)),
        Reason::CatalogProfiles
    );
}

#[test]
fn duplicate_ids_are_refused() {
    let dup_image = catalog().with_image("alpine", SHA, "/b.smolmachine");
    assert_eq!(reason(dup_image.validate(None)), Reason::CatalogDuplicate);
    let dup_cp = catalog()
        .with_checkpoint("cp", SHA, "/c/cp.smolcheckpoint")
        .with_checkpoint("cp", SHA, "/c/cp.smolcheckpoint");
    assert_eq!(reason(dup_cp.validate(None)), Reason::CatalogDuplicate);
    let dup_profile = catalog().with_profile(ProfileRevision::new("small"));
    assert_eq!(reason(dup_profile.validate(None)), Reason::CatalogDuplicate);
}

#[test]
fn image_paths_must_be_absolute_smolmachine_files() {
    for bad in [
        "images/alpine.smolmachine",
        "/images/alpine.tar",
        "/.smolmachine",
        "/a/../b.smolmachine",
        "/a\n.smolmachine",
    ] {
        let mut c = catalog();
        c.images[0].path = bad.to_owned();
        assert_eq!(reason(c.validate(None)), Reason::CatalogImagePath, "{bad}");
    }
    let mut c = catalog();
    c.images[0].sha256 = "A".repeat(64);
    assert_eq!(reason(c.validate(None)), Reason::CatalogImage);
}

#[test]
fn checkpoint_paths_must_be_absolute_checkpoint_files() {
    for good in ["/c/a.smolcheckpoint", "/c/a.checkpoint", "/a.checkpoint"] {
        catalog()
            .with_checkpoint("cp", SHA, good)
            .validate(None)
            .unwrap();
    }
    for bad in [
        "c/a.smolcheckpoint",
        "/c/a.smolmachine",
        "/.checkpoint",
        "/.smolcheckpoint",
        "/a/../b.checkpoint",
        "/a\n.checkpoint",
        "",
    ] {
        let c = catalog().with_checkpoint("cp", SHA, bad);
        assert_eq!(
            reason(c.validate(None)),
            Reason::CatalogCheckpointPath,
            "{bad}"
        );
    }
}

#[test]
fn image_architecture_must_be_the_workers() {
    let mut c = catalog();
    c.images[0].architecture = Architecture::Aarch64;
    assert_eq!(reason(c.validate(None)), Reason::CatalogImageArchitecture);
}

#[test]
fn platform_rules() {
    let with = |p, a| {
        let mut c = catalog();
        c.platform = p;
        c.architecture = a;
        c.images[0].architecture = a;
        c
    };
    // macOS is aarch64 only, whatever the version.
    assert_eq!(
        reason(with(Platform::Macos, Architecture::X86_64).validate(None)),
        Reason::CatalogPlatform
    );
    with(Platform::Macos, Architecture::Aarch64)
        .validate(Some("1.22.0"))
        .unwrap();
    with(Platform::Linux, Architecture::X86_64)
        .validate(Some("1.22.0"))
        .unwrap();
    // Linux aarch64: 1.14.1 only.
    let arm = with(Platform::Linux, Architecture::Aarch64);
    arm.validate(Some(ANY_PLATFORM_VERSION)).unwrap();
    assert_eq!(
        reason(arm.validate(Some("1.22.0"))),
        Reason::CatalogPlatform
    );
}

#[test]
fn supports_needs_the_exact_artifact_and_revision() {
    let c = catalog();
    let small = ProfileRevision::new("small").reference();
    let unsupported = |r: Result<(), Error>| {
        let e = r.expect_err("refused");
        assert_eq!(e.category(), Category::UnsupportedCapability);
        assert_eq!(e.evidence(), Evidence::NotDispatched);
        e.reason()
    };
    let mut a = artifact();
    a.sha256 = "b".repeat(64);
    assert_eq!(
        unsupported(c.supports(&a, &small)),
        Reason::ArtifactNotInCatalog
    );
    let mut a = artifact();
    a.architecture = "aarch64".to_owned();
    assert_eq!(
        unsupported(c.supports(&a, &small)),
        Reason::ArtifactNotInCatalog
    );
    let mut a = artifact();
    a.kind = ArtifactKind::Checkpoint;
    assert_eq!(
        unsupported(c.supports(&a, &small)),
        Reason::ArtifactNotInCatalog
    );
    c.clone()
        .with_checkpoint("alpine", SHA, "/c/alpine.smolcheckpoint")
        .supports(&a, &small)
        .unwrap();
    // Same id, another revision's budgets: not the exact revision.
    let mut other = small.clone();
    other.budgets.execution_ms += 1;
    assert_eq!(
        unsupported(c.supports(&artifact(), &other)),
        Reason::ProfileNotInCatalog
    );
    let mut other = small.clone();
    other.id = "large".to_owned();
    assert_eq!(
        unsupported(c.supports(&artifact(), &other)),
        Reason::ProfileNotInCatalog
    );
    assert_eq!(
        unsupported(c.clone().draining(true).supports(&artifact(), &small)),
        Reason::WorkerDraining
    );
}

#[test]
fn a_profile_below_the_floor_is_unsupported_and_at_it_is_not() {
    let mut c = catalog();
    c.floor.storage_gb = 2;
    let small = ProfileRevision::new("small").reference();
    assert_eq!(
        reason(c.supports(&artifact(), &small)),
        Reason::ProfileBelowFloor
    );
    c.profiles[0].storage_gb = 2;
    c.supports(&artifact(), &small).unwrap();
    c.floor.host_overhead_mb = 257;
    assert_eq!(
        reason(c.supports(&artifact(), &small)),
        Reason::ProfileBelowFloor
    );
    c.floor.host_overhead_mb = 256;
    c.supports(&artifact(), &small).unwrap();
    c.floor.overlay_gb = 2;
    assert_eq!(
        reason(c.supports(&artifact(), &small)),
        Reason::ProfileBelowFloor
    );
}

#[test]
fn holding_builds_a_valid_catalog_of_exactly_one_target() {
    let mut profile = ProfileRevision::new("fitted").reference();
    profile.budgets.execution_ms = 125_000;
    profile.per_file_max = 8_000_000;
    let c = Catalog::holding(Platform::Linux, &artifact(), &profile, "/a.smolmachine");
    c.validate(Some("1.22.0")).unwrap();
    c.supports(&artifact(), &profile).unwrap();
    let mut other = artifact();
    other.id = "other".to_owned();
    assert_eq!(
        reason(c.supports(&other, &profile)),
        Reason::ArtifactNotInCatalog
    );
    let mut cp = artifact();
    cp.kind = ArtifactKind::Checkpoint;
    let c = Catalog::holding(Platform::Linux, &cp, &profile, "/cp.smolcheckpoint");
    assert_eq!(c.checkpoint(&cp).unwrap().path, "/cp.smolcheckpoint");
    c.validate(None).unwrap();
    c.supports(&cp, &profile).unwrap();
    assert_eq!(
        reason(c.supports(&artifact(), &profile)),
        Reason::ArtifactNotInCatalog
    );
}

#[test]
fn the_reservation_counts_memory_plus_overhead_and_storage_plus_overlay() {
    let mut p = ProfileRevision::new("sized");
    p.cpus = 3;
    p.memory_mb = 1_000;
    p.host_overhead_mb = 200;
    p.storage_gb = 4;
    p.overlay_gb = 2;
    let r = floor().reservation(&p);
    assert_eq!(
        r,
        Resources {
            slots: 1,
            cpus: 3,
            memory_mb: 1_200,
            disk_gb: 6,
        }
    );
    // The defaults of C12.3: 1 CPU, 256 + 256 MiB, 1 + 1 GiB.
    let d = floor().reservation(&ProfileRevision::new("d"));
    assert_eq!(
        d,
        Resources {
            slots: 1,
            cpus: 1,
            memory_mb: 512,
            disk_gb: 2,
        }
    );
}

#[test]
fn the_reservation_is_never_below_the_floor() {
    // A revision below the floor is refused at acceptance; the reservation
    // still applies the floor in each of its three dimensions.
    let f = Floor {
        storage_gb: 5,
        overlay_gb: 3,
        host_overhead_mb: 1_024,
    };
    let p = ProfileRevision::new("small");
    assert!(!f.fits(&p));
    let r = f.reservation(&p);
    assert_eq!(r.memory_mb, 256 + 1_024);
    assert_eq!(r.disk_gb, 5 + 3);
    assert_eq!(f.disks(&p), (5, 3));
    // At the floor exactly, the revision's own values.
    let mut at = p.clone();
    at.storage_gb = 5;
    at.overlay_gb = 3;
    at.host_overhead_mb = 1_024;
    assert!(f.fits(&at));
    assert_eq!(f.reservation(&at), r);
}

#[test]
fn n_reservations_fit_a_capacity_of_n_and_n_plus_1_do_not() {
    let mut p = ProfileRevision::new("sized");
    p.memory_mb = 1_000;
    p.host_overhead_mb = 200;
    let r = floor().reservation(&p);
    let n = 3;
    let exact = Resources {
        slots: n,
        cpus: n * r.cpus,
        memory_mb: n * r.memory_mb,
        disk_gb: n * r.disk_gb,
    };
    let used = |k: u64| (0..k).fold(Resources::default(), |u, _| u.plus(r));
    assert!(used(n).fits(exact));
    assert!(!used(n + 1).fits(exact));
    // One short in any dimension: the N-th does not fit. Memory counts the
    // host overhead (N × guest memory alone is not enough).
    for short in [
        Resources {
            slots: n - 1,
            ..exact
        },
        Resources {
            cpus: exact.cpus - 1,
            ..exact
        },
        Resources {
            memory_mb: exact.memory_mb - 1,
            ..exact
        },
        Resources {
            memory_mb: n * u64::from(p.memory_mb),
            ..exact
        },
        Resources {
            disk_gb: exact.disk_gb - 1,
            ..exact
        },
    ] {
        assert!(used(n - 1).fits(short), "{short:?}");
        assert!(!used(n).fits(short), "{short:?}");
    }
}

#[test]
fn the_image_of_an_artifact_is_found_by_kind_id_digest_and_architecture() {
    let c = catalog();
    assert_eq!(
        c.image(&artifact()).map(|i| i.path.as_str()),
        Some("/images/alpine.smolmachine")
    );
    let mut a = artifact();
    a.architecture = "aarch64".to_owned();
    assert!(c.image(&a).is_none());
    let mut a = artifact();
    a.kind = ArtifactKind::Checkpoint;
    assert!(c.image(&a).is_none());
    let mut a = artifact();
    a.sha256 = "b".repeat(64);
    assert!(c.image(&a).is_none());
}
