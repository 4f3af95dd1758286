//! Machine spec bounds (C3.2, C8.1, C9, C10.1): every bound at N
//! (accepted) and N+1 (refused), plus proptests over the numeric ranges.
#![allow(clippy::unwrap_used)] // tests unwrap known-good values

use proptest::prelude::*;
use smolbox_core::Reason;
use smolbox_core::worker::workload::RestartPolicy;
use smolbox_core::worker::{
    Cidr, Hostname, MachineSpec, Mount, NetworkPolicy, PortMapping, Source, Workload,
};
use smolbox_core::{Category, Operation};

fn image() -> Source {
    Source::Image {
        path: "/i/a.smolmachine".into(),
    }
}

proptest! {
    #[test]
    fn cpus_range(cpus in any::<u8>()) {
        let s = MachineSpec { cpus, ..MachineSpec::default() };
        prop_assert_eq!(s.validate().is_ok(), (1..=64).contains(&cpus));
    }

    #[test]
    fn memory_range(memory_mb in 0u32..20_000) {
        let s = MachineSpec { memory_mb, ..MachineSpec::default() };
        prop_assert_eq!(s.validate().is_ok(), (128..=16_384).contains(&memory_mb));
    }

    #[test]
    fn disk_ranges(storage_gb in 0u32..100, overlay_gb in 0u32..100) {
        let s = MachineSpec { storage_gb, overlay_gb, ..MachineSpec::default() };
        let ok = (1..=64).contains(&storage_gb) && (1..=64).contains(&overlay_gb);
        prop_assert_eq!(s.validate().is_ok(), ok);
        if let Err(e) = s.validate() {
            prop_assert_eq!((e.category(), e.operation()), (Category::Validation, Operation::MachineSpec));
        }
    }

    #[test]
    fn port_count(n in 0usize..40) {
        let ports = (0..n).map(|i| PortMapping::new(1_000 + i as u16, 80).unwrap()).collect();
        let s = MachineSpec { ports, source: image(), ..MachineSpec::default() };
        prop_assert_eq!(s.validate().is_ok(), n <= 32);
    }

    #[test]
    fn mount_count(n in 0usize..12) {
        let mounts = (0..n).map(|i| Mount::new("/srv/v", &format!("/mnt/volumes/m{i}"), false).unwrap()).collect();
        let s = MachineSpec { mounts, ..MachineSpec::default() };
        prop_assert_eq!(s.validate().is_ok(), n <= 8);
    }

    #[test]
    fn cidr_v4_alignment(a in any::<u32>(), prefix in 0u32..34) {
        let ip = std::net::Ipv4Addr::from(a);
        let text = format!("{ip}/{prefix}");
        let aligned = prefix >= 32 || a & (u32::MAX >> prefix) == 0;
        prop_assert_eq!(Cidr::new(&text).is_ok(), (1..=32).contains(&prefix) && aligned);
    }
}

#[test]
fn numeric_bounds_at_edges() {
    let d = MachineSpec::default;
    assert_eq!(
        (d().cpus, d().memory_mb, d().storage_gb, d().overlay_gb),
        (1, 256, 1, 1)
    );
    for (spec, ok) in [
        (MachineSpec { cpus: 64, ..d() }, true),
        (MachineSpec { cpus: 65, ..d() }, false),
        (MachineSpec { cpus: 0, ..d() }, false),
        (
            MachineSpec {
                memory_mb: 128,
                ..d()
            },
            true,
        ),
        (
            MachineSpec {
                memory_mb: 127,
                ..d()
            },
            false,
        ),
        (
            MachineSpec {
                memory_mb: 16_384,
                ..d()
            },
            true,
        ),
        (
            MachineSpec {
                memory_mb: 16_385,
                ..d()
            },
            false,
        ),
        (
            MachineSpec {
                storage_gb: 64,
                ..d()
            },
            true,
        ),
        (
            MachineSpec {
                storage_gb: 65,
                ..d()
            },
            false,
        ),
        (
            MachineSpec {
                overlay_gb: 64,
                ..d()
            },
            true,
        ),
        (
            MachineSpec {
                overlay_gb: 65,
                ..d()
            },
            false,
        ),
    ] {
        assert_eq!(spec.validate().is_ok(), ok, "{spec:?}");
    }
}

#[test]
fn ports_rules_c9_2() {
    assert!(PortMapping::new(0, 1).is_err());
    assert!(PortMapping::new(1, 0).is_err());
    assert!(PortMapping::new(65_535, 65_535).is_ok());
    let p = |h, g| PortMapping::new(h, g).unwrap();
    // Unique host ports; several host ports may share a guest port; sorted.
    let s = MachineSpec {
        ports: vec![p(9, 80), p(8, 80)],
        source: image(),
        ..MachineSpec::default()
    };
    let c = s.validate().unwrap();
    assert_eq!(c.ports, vec![p(8, 80), p(9, 80)]);
    let s = MachineSpec {
        ports: vec![p(8, 80), p(8, 81)],
        source: image(),
        ..MachineSpec::default()
    };
    assert_eq!(
        s.validate().unwrap_err().reason(),
        Reason::DuplicateHostPort
    );
}

#[test]
fn network_policy_c9_1() {
    let h = |s: &str| Hostname::new(s);
    assert!(h("api.example.com").is_ok());
    for bad in [
        "example",
        "API.example.com",
        "*.example.com",
        "example.com.",
        "http://a.b",
        "1.2.3.4",
        "a_b.com",
        "-a.com",
        "a-.com",
        "a..b",
        "a.123",
    ] {
        assert!(h(bad).is_err(), "{bad}");
    }
    let label63 = "a".repeat(63);
    assert!(h(&format!("{label63}.com")).is_ok());
    assert!(h(&format!("a{label63}.com")).is_err());
    // 253 bytes accepted, 254 refused.
    let name = |len: usize| {
        let mut s = String::new();
        while s.len() + 64 < len {
            s.push_str(&"a".repeat(63));
            s.push('.');
        }
        let rest = len - s.len();
        s.push_str(&"b".repeat(rest));
        s
    };
    assert_eq!(name(253).len(), 253);
    assert!(h(&name(253)).is_ok());
    assert!(h(&name(254)).is_err());
    // CIDRs: canonical, prefix ≥ 1, no host bits, ≤49 bytes.
    for ok in [
        "10.0.0.0/8",
        "203.0.113.7/32",
        "2001:db8::/32",
        "::1/128",
        "128.0.0.0/1",
    ] {
        assert!(Cidr::new(ok).is_ok(), "{ok}");
    }
    for bad in [
        "10.0.0.1/8",
        "10.0.0.0/0",
        "10.0.0.0",
        "10.0.0.0/33",
        "10.0.0.0/08",
        "2001:DB8::/32",
        "2001:0db8::/32",
        "::/0",
        "nope",
        "010.0.0.0/8",
    ] {
        assert!(Cidr::new(bad).is_err(), "{bad}");
    }
    let long = "1111:2222:3333:4444:5555:6666:7777:8888/128";
    assert!(long.len() <= 49 && Cidr::new(long).is_ok());
    // Lists: non-empty, ≤32 each, sorted, duplicates rejected.
    assert!(NetworkPolicy::allowlist(vec![], vec![]).is_err());
    let hosts = |n: usize| {
        (0..n)
            .map(|i| h(&format!("h{i}.example.com")).unwrap())
            .collect::<Vec<_>>()
    };
    let cidrs = |n: usize| {
        (0..n)
            .map(|i| Cidr::new(&format!("10.0.{i}.0/24")).unwrap())
            .collect::<Vec<_>>()
    };
    assert!(NetworkPolicy::allowlist(hosts(32), cidrs(32)).is_ok());
    assert!(NetworkPolicy::allowlist(hosts(33), vec![]).is_err());
    assert!(NetworkPolicy::allowlist(vec![], cidrs(33)).is_err());
    let dup = vec![h("a.example.com").unwrap(), h("a.example.com").unwrap()];
    assert_eq!(
        NetworkPolicy::allowlist(dup, vec![]).unwrap_err().reason(),
        Reason::DuplicateNetworkEntry
    );
    let NetworkPolicy::Allowlist { hosts: sorted, .. } = NetworkPolicy::allowlist(
        vec![h("b.example.com").unwrap(), h("a.example.com").unwrap()],
        vec![],
    )
    .unwrap() else {
        panic!("allowlist expected");
    };
    assert_eq!(sorted[0].as_str(), "a.example.com");
}

#[test]
fn mounts_c10_1() {
    assert!(Mount::new("/a", "/mnt/volumes/a", false).is_ok());
    assert!(Mount::new("/", "/mnt/volumes/a", false).is_err()); // < 2 bytes
    for bad in [
        "/mnt/other/a",
        "/mnt/volumes/",
        "/mnt/volumes/a/",
        "/mnt/volumes//a",
        "/mnt/volumes/./a",
        "/mnt/volumes/../a",
        "/mnt/volumes/a\\b",
    ] {
        assert!(Mount::new("/srv/a", bad, false).is_err(), "{bad}");
    }
    let long = format!("/mnt/volumes/{}", "a".repeat(4_096 - 13));
    assert_eq!(long.len(), 4_096);
    assert!(Mount::new("/srv/a", &long, false).is_ok());
    assert!(Mount::new("/srv/a", &format!("{long}a"), false).is_err());
    let m = |t: &str| Mount::new("/srv/a", t, false).unwrap();
    let s = MachineSpec {
        mounts: vec![m("/mnt/volumes/a"), m("/mnt/volumes/a/b")],
        ..MachineSpec::default()
    };
    assert_eq!(
        s.validate().unwrap_err().reason(),
        Reason::OverlappingMountTargets
    );
    let s = MachineSpec {
        mounts: vec![m("/mnt/volumes/b"), m("/mnt/volumes/ab")],
        ..MachineSpec::default()
    };
    let c = s.validate().unwrap();
    assert_eq!(c.mounts[0].target(), "/mnt/volumes/ab");
}

#[test]
fn workload_c8_1() {
    let w = |e: Vec<String>, c: Vec<String>, env: Vec<(String, String)>, wd: Option<String>| {
        Workload::new(e, c, env, wd, RestartPolicy::Never)
    };
    let args = |n: usize| vec!["a".to_string(); n];
    assert!(w(args(200), args(55), vec![], None).is_ok());
    assert!(w(args(200), args(56), vec![], None).is_err());
    assert!(w(vec!["x".repeat(16_384)], vec![], vec![], None).is_ok());
    assert!(w(vec!["x".repeat(16_385)], vec![], vec![], None).is_err());
    assert!(w(vec!["x".repeat(16_384); 4], vec![], vec![], None).is_ok());
    assert!(w(vec!["x".repeat(16_384); 4], vec!["y".into()], vec![], None).is_err()); // total > 64 KiB
    assert!(w(vec!["a\0".into()], vec![], vec![], None).is_err());
    let env = |n: usize| {
        (0..n)
            .map(|i| (format!("V{i}"), String::new()))
            .collect::<Vec<_>>()
    };
    assert!(w(vec![], vec![], env(64), None).is_ok());
    assert!(w(vec![], vec![], env(65), None).is_err());
    assert!(w(vec![], vec![], vec![("N".repeat(128), String::new())], None).is_ok());
    assert!(w(vec![], vec![], vec![("N".repeat(129), String::new())], None).is_err());
    assert!(w(vec![], vec![], vec![("N".into(), "v".repeat(8_192))], None).is_ok());
    assert!(w(vec![], vec![], vec![("N".into(), "v".repeat(8_193))], None).is_err());
    assert!(w(vec![], vec![], vec![("1N".into(), String::new())], None).is_err());
    let dup = vec![
        ("A".to_string(), "1".to_string()),
        ("A".to_string(), "2".to_string()),
    ];
    assert_eq!(
        w(vec![], vec![], dup, None).unwrap_err().reason(),
        Reason::DuplicateEnvName
    );
    assert!(
        w(
            vec![],
            vec![],
            vec![],
            Some(format!("/{}", "d".repeat(4_095)))
        )
        .is_ok()
    );
    assert!(
        w(
            vec![],
            vec![],
            vec![],
            Some(format!("/{}", "d".repeat(4_096)))
        )
        .is_err()
    );
    assert!(w(vec![], vec![], vec![], Some("rel".into())).is_err());
    let e = Workload::new(vec![], vec![], vec![], None, RestartPolicy::Always).unwrap_err();
    assert_eq!(e.category(), Category::UnsupportedCapability);
}

#[test]
fn source_rules() {
    let s = |source| MachineSpec {
        source,
        ..MachineSpec::default()
    };
    assert!(
        s(Source::Image {
            path: "/i/a.smolmachine".into()
        })
        .validate()
        .is_ok()
    );
    assert!(
        s(Source::Image {
            path: "i/a.smolmachine".into()
        })
        .validate()
        .is_err()
    );
    assert!(
        s(Source::Image {
            path: "/i/a.tar".into()
        })
        .validate()
        .is_err()
    );
    assert!(
        s(Source::Checkpoint {
            path: "/c/a.smolcheckpoint".into()
        })
        .validate()
        .is_ok()
    );
    assert!(
        s(Source::Checkpoint {
            path: "/c/a.smolmachine".into()
        })
        .validate()
        .is_err()
    );
    assert!(
        s(Source::Oci {
            reference: "".into()
        })
        .validate()
        .is_err()
    );
    assert!(
        s(Source::Oci {
            reference: "a b".into()
        })
        .validate()
        .is_err()
    );
    let token = Some(smolbox_core::Secret::new("SENTINEL-REGISTRY"));
    let reg = s(Source::Registry {
        reference: "r.example.com/a:1".into(),
        identity_token: token,
    });
    assert!(reg.validate().is_ok());
    assert!(!format!("{reg:?}").contains("SENTINEL"));
    // Ports are refused on checkpoint sources; a workload needs an image source.
    let p = MachineSpec {
        ports: vec![PortMapping::new(1, 1).unwrap()],
        source: Source::Checkpoint {
            path: "/c/a.checkpoint".into(),
        },
        ..MachineSpec::default()
    };
    assert!(p.validate().is_err());
}
