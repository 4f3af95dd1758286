//! Machines: §14 TV5–TV7, TV11, TV13, TV14, TV29, TV30 and the C3/C4
//! acceptance criteria.
#![allow(clippy::unwrap_used)] // tests unwrap known-good values

use smolbox_core::Reason;
mod worker_support;

use smolbox_core::worker::{
    Cidr, Create, Delete, Get, Hostname, List, MachineName, MachineSpec, MachineState, Measure,
    Mount, Namespace, NetworkPolicy, PortMapping, Profile, Source, Start, Stop, Version,
    WorkerCall, Workload, same_incarnation,
};
use smolbox_core::{Category, Evidence, Operation};
use worker_support::*;

fn name(n: &str) -> MachineName {
    MachineName::new(n).unwrap()
}

const TV5: &[u8] = br#"{"name":"wire-test","state":"created","cpus":1,"memoryMb":256,"mounts":[],"ports":[],"network":false,"gpu":false,"cuda":false,"storageGb":1,"overlayGb":1,"forkable":false,"forkpointHeld":false,"diskUsedMb":0,"createdAt":1795935394}"#;
const TV6: &[u8] = br#"{"name":"vm-62f93317","state":"created","cpus":4,"memoryMb":8192,"mounts":[],"ports":[],"network":false,"gpu":false,"cuda":false,"storageGb":20,"overlayGb":10,"forkable":false,"forkpointHeld":false,"diskUsedMb":0,"createdAt":1795935441}"#;
const TV7: &[u8] = br#"{"name":"net-test","state":"created","cpus":2,"memoryMb":512,"mounts":[],"ports":[{"host":18090,"guest":80}],"network":true,"gpu":false,"cuda":false,"networkBackend":"virtio-net","allowedCidrs":["203.0.113.7/32","198.51.100.0/24"],"allowedHosts":["api.example.com"],"storageGb":20,"overlayGb":10,"forkable":false,"forkpointHeld":false,"diskUsedMb":0,"createdAt":1795935441}"#;
const TV14_STOP: &[u8] = br#"{"name":"wire-test","state":"stopped","cpus":1,"memoryMb":256,"mounts":[],"ports":[],"network":false,"gpu":false,"cuda":false,"storageGb":1,"overlayGb":1,"forkable":false,"forkpointHeld":false,"diskUsedMb":0,"createdAt":1795935394}"#;
const TV13_RUNNING: &[u8] = br#"{"runtime":{"pid":49667,"startTime":1790817039436239},"name":"wire-a36ea992d1a0","image":"python:3.12-alpine","state":"running","cpus":1,"memoryMb":256,"pid":49667,"mounts":[],"ports":[],"network":false,"gpu":false,"cuda":false,"storageGb":1,"overlayGb":1,"blockIo":"sync","branchable":false,"forkable":false,"branchpointHeld":false,"forkpointHeld":false,"cpuSeconds":0,"cpuMillis":4,"rssMb":100,"createdAt":1790817032}"#;
const TV5_122: &[u8] = br#"{"name":"wire-a36ea992d1a0","image":"python:3.12-alpine","state":"created","cpus":1,"memoryMb":256,"mounts":[],"ports":[],"network":false,"gpu":false,"cuda":false,"storageGb":1,"overlayGb":1,"blockIo":"sync","branchable":false,"forkable":false,"branchpointHeld":false,"forkpointHeld":false,"createdAt":1790817032}"#;

fn net_spec() -> MachineSpec {
    MachineSpec {
        cpus: 2,
        memory_mb: 512,
        storage_gb: 20,
        overlay_gb: 10,
        network: NetworkPolicy::allowlist(
            vec![Hostname::new("api.example.com").unwrap()],
            vec![
                Cidr::new("203.0.113.7/32").unwrap(),
                Cidr::new("198.51.100.0/24").unwrap(),
            ],
        )
        .unwrap(),
        ports: vec![PortMapping::new(18090, 80).unwrap()],
        ..MachineSpec::default()
    }
}

#[test]
fn tv5_create_request_and_reply() {
    let c = Create::new(&v192(), name("wire-test"), &MachineSpec::default()).unwrap();
    let req = c.request().unwrap();
    assert_eq!(
        (req.method.as_str(), req.target.as_str()),
        ("POST", "/api/v1/machines")
    );
    assert_eq!(req.content_type, Some("application/json"));
    assert_eq!(
        std::str::from_utf8(&req.body).unwrap(),
        r#"{"name":"wire-test","cpus":1,"memoryMb":256,"storageGb":1,"overlayGb":1,"network":false,"gpu":false,"cuda":false,"dockerSocket":false,"mounts":[],"ports":[],"restart":{"policy":"never"}}"#
    );
    assert_eq!(TV5.len(), 231); // content-length in the vector
    let obs = c.decode(&json(200, TV5), TV5).unwrap();
    assert_eq!(obs.state, MachineState::Created);
    assert_eq!(obs.incarnation.created_at, 1_795_935_394);
    assert_eq!((obs.incarnation.cpus, obs.incarnation.memory_mb), (1, 256));
    assert_eq!(obs.measurements.disk_used_mb, Some(0));
    assert_eq!(obs.measurements.rss_mb, None);
    assert_eq!(obs.branchable, Some(false));
    assert_eq!(obs.pid, None);
}

#[test]
fn image_source_body_follows_c3_2() {
    let spec = MachineSpec {
        source: Source::Image {
            path: "/srv/images/py.smolmachine".into(),
        },
        ..MachineSpec::default()
    };
    let c = Create::new(&v122(), name("m1"), &spec).unwrap();
    assert_eq!(
        std::str::from_utf8(&c.request().unwrap().body).unwrap(),
        r#"{"name":"m1","from":"/srv/images/py.smolmachine","cpus":1,"memoryMb":256,"storageGb":1,"overlayGb":1,"network":false,"gpu":false,"cuda":false,"dockerSocket":false,"mounts":[],"ports":[],"entrypoint":["/bin/true"],"cmd":[],"restart":{"policy":"never"}}"#
    );
    // Checkpoint sources omit storageGb, overlayGb, entrypoint and cmd.
    let spec = MachineSpec {
        source: Source::Checkpoint {
            path: "/srv/cp/a.smolcheckpoint".into(),
        },
        ..MachineSpec::default()
    };
    let c = Create::new(&v122(), name("m1"), &spec).unwrap();
    assert_eq!(
        std::str::from_utf8(&c.request().unwrap().body).unwrap(),
        r#"{"name":"m1","from":"/srv/cp/a.smolcheckpoint","cpus":1,"memoryMb":256,"network":false,"gpu":false,"cuda":false,"dockerSocket":false,"mounts":[],"ports":[],"restart":{"policy":"never"}}"#
    );
    // Registry and OCI sources.
    let spec = MachineSpec {
        source: Source::Oci {
            reference: "python:3.12-alpine".into(),
        },
        ..MachineSpec::default()
    };
    let body = Create::new(&v122(), name("m1"), &spec)
        .unwrap()
        .request()
        .unwrap()
        .body;
    assert!(
        std::str::from_utf8(&body)
            .unwrap()
            .starts_with(r#"{"name":"m1","image":"python:3.12-alpine","cpus""#)
    );
    assert!(Create::new(&Profile::known(Version::V1_17_0), name("m1"), &spec).is_err());
}

#[test]
fn workload_and_mounts_on_the_wire() {
    let spec = MachineSpec {
        source: Source::Image {
            path: "/i/a.smolmachine".into(),
        },
        workload: Some(
            Workload::new(
                vec!["python3".into()],
                vec!["-m".into(), "http.server".into()],
                vec![("B".into(), "2".into()), ("A".into(), "1".into())],
                Some("/workspace".into()),
                Default::default(),
            )
            .unwrap(),
        ),
        mounts: vec![Mount::new("/srv/vol/a", "/mnt/volumes/a", true).unwrap()],
        ..MachineSpec::default()
    };
    let body = Create::new(&v122(), name("m1"), &spec)
        .unwrap()
        .request()
        .unwrap()
        .body;
    let s = std::str::from_utf8(&body).unwrap();
    assert!(s.contains(r#""mounts":[{"source":"/srv/vol/a","target":"/mnt/volumes/a","readonly":true,"staged":false}]"#), "{s}");
    assert!(s.contains(r#""entrypoint":["python3"],"cmd":["-m","http.server"],"env":[{"name":"A","value":"1"},{"name":"B","value":"2"}],"workdir":"/workspace","restart":{"policy":"never"}"#), "{s}");
    // Mounts need 1.20.2; a workload needs an image source.
    assert!(Create::new(&Profile::known(Version::V1_19_0), name("m1"), &spec).is_err());
    let bare = MachineSpec {
        source: Source::Bare,
        mounts: vec![],
        ..spec
    };
    let e = Create::new(&v122(), name("m1"), &bare).unwrap_err();
    assert_eq!(e.reason(), Reason::WorkloadRequiresImageSource);
}

#[test]
fn tv6_defaults_reply_decodes() {
    let spec = MachineSpec {
        cpus: 4,
        memory_mb: 8192,
        storage_gb: 20,
        overlay_gb: 10,
        ..MachineSpec::default()
    };
    let c = Create::new(&v192(), name("vm-62f93317"), &spec).unwrap();
    let obs = c.decode(&json(200, TV6), TV6).unwrap();
    assert_eq!(
        (obs.incarnation.storage_gb, obs.incarnation.overlay_gb),
        (20, 10)
    );
}

#[test]
fn tv7_network_policy_and_port() {
    let c = Create::new(&v192(), name("net-test"), &net_spec()).unwrap();
    let body = c.request().unwrap().body;
    assert_eq!(
        std::str::from_utf8(&body).unwrap(),
        r#"{"name":"net-test","cpus":2,"memoryMb":512,"storageGb":20,"overlayGb":10,"network":true,"networkBackend":"virtio-net","allowedHosts":["api.example.com"],"allowedCidrs":["198.51.100.0/24","203.0.113.7/32"],"gpu":false,"cuda":false,"dockerSocket":false,"mounts":[],"ports":[{"host":18090,"guest":80}],"restart":{"policy":"never"}}"#
    );
    let obs = c.decode(&json(200, TV7), TV7).unwrap();
    assert_eq!(obs.incarnation.network, net_spec().network);
    assert_eq!(
        obs.incarnation.ports,
        vec![PortMapping::new(18090, 80).unwrap()]
    );
    // Network policy needs 1.16.0 on the later line.
    assert!(
        Create::new(
            &Profile::known(Version::V1_14_6),
            name("net-test"),
            &net_spec()
        )
        .is_err()
    );
}

#[test]
fn offline_ports_send_virtio_net_and_empty_lists() {
    let spec = MachineSpec {
        source: Source::Image {
            path: "/i/a.smolmachine".into(),
        },
        ports: vec![PortMapping::new(8080, 80).unwrap()],
        ..MachineSpec::default()
    };
    let c = Create::new(&v122(), name("p1"), &spec).unwrap();
    let s = String::from_utf8(c.request().unwrap().body.to_vec()).unwrap();
    assert!(
        s.contains(
            r#""network":false,"networkBackend":"virtio-net","allowedHosts":[],"allowedCidrs":[]"#
        ),
        "{s}"
    );
    let reply = br#"{"name":"p1","state":"created","cpus":1,"memoryMb":256,"mounts":[],"ports":[{"host":8080,"guest":80}],"network":false,"gpu":false,"cuda":false,"networkBackend":"virtio-net","allowedCidrs":[],"allowedHosts":[],"storageGb":1,"overlayGb":1,"createdAt":1}"#;
    assert!(c.decode(&json(200, reply), reply).is_ok());
    // The observation must confirm the fields.
    let unconfirmed = br#"{"name":"p1","state":"created","cpus":1,"memoryMb":256,"mounts":[],"ports":[{"host":8080,"guest":80}],"network":false,"gpu":false,"cuda":false,"networkBackend":"virtio-net","storageGb":1,"overlayGb":1,"createdAt":1}"#;
    let e = c.decode(&json(200, unconfirmed), unconfirmed).unwrap_err();
    assert_err(
        &e,
        Category::Protocol,
        Operation::Create,
        Evidence::DispatchUncertain,
    );
}

#[test]
fn ac_3_4_1_name_mismatch_is_identity_conflict() {
    let c = Create::new(&v192(), name("other"), &MachineSpec::default()).unwrap();
    let e = c.decode(&json(200, TV5), TV5).unwrap_err();
    assert_err(
        &e,
        Category::IdentityConflict,
        Operation::Create,
        Evidence::DispatchUncertain,
    );
}

#[test]
fn ac_3_4_2_any_other_difference_is_protocol() {
    let variants = [
        MachineSpec {
            cpus: 2,
            ..MachineSpec::default()
        },
        MachineSpec {
            memory_mb: 512,
            ..MachineSpec::default()
        },
        MachineSpec {
            storage_gb: 2,
            ..MachineSpec::default()
        },
        MachineSpec {
            overlay_gb: 2,
            ..MachineSpec::default()
        },
    ];
    for spec in variants {
        let c = Create::new(&v192(), name("wire-test"), &spec).unwrap();
        let e = c.decode(&json(200, TV5), TV5).unwrap_err();
        assert_err(
            &e,
            Category::Protocol,
            Operation::Create,
            Evidence::DispatchUncertain,
        );
    }
    // Network and ports.
    let mut spec = net_spec();
    spec.ports = vec![PortMapping::new(18091, 80).unwrap()];
    let c = Create::new(&v192(), name("net-test"), &spec).unwrap();
    assert_eq!(
        c.decode(&json(200, TV7), TV7).unwrap_err().reason(),
        Reason::ReplyPortsMismatch
    );
    let mut spec = net_spec();
    spec.network =
        NetworkPolicy::allowlist(vec![Hostname::new("api.example.com").unwrap()], vec![]).unwrap();
    let c = Create::new(&v192(), name("net-test"), &spec).unwrap();
    assert_eq!(
        c.decode(&json(200, TV7), TV7).unwrap_err().reason(),
        Reason::ReplyNetworkMismatch
    );
    // Mounts.
    let spec = MachineSpec {
        mounts: vec![Mount::new("/srv/v", "/mnt/volumes/v", false).unwrap()],
        ..MachineSpec::default()
    };
    let c = Create::new(&v122(), name("wire-test"), &spec).unwrap();
    let with_mount = br#"{"name":"wire-test","state":"created","cpus":1,"memoryMb":256,"mounts":[{"tag":"smolvm0","source":"/srv/v","target":"/mnt/volumes/v","readonly":true,"staged":false}],"ports":[],"network":false,"gpu":false,"cuda":false,"storageGb":1,"overlayGb":1,"createdAt":1}"#;
    assert_eq!(
        c.decode(&json(200, with_mount), with_mount)
            .unwrap_err()
            .reason(),
        Reason::ReplyMountsMismatch
    );
    let good = br#"{"name":"wire-test","state":"created","cpus":1,"memoryMb":256,"mounts":[{"tag":"smolvm0","source":"/srv/v","target":"/mnt/volumes/v","readonly":false,"staged":false}],"ports":[],"network":false,"gpu":false,"cuda":false,"storageGb":1,"overlayGb":1,"createdAt":1}"#;
    assert!(c.decode(&json(200, good), good).is_ok());
    // 1.20.2+ replies must carry staged:false.
    let unstaged = br#"{"name":"wire-test","state":"created","cpus":1,"memoryMb":256,"mounts":[{"tag":"smolvm0","source":"/srv/v","target":"/mnt/volumes/v","readonly":false}],"ports":[],"network":false,"gpu":false,"cuda":false,"storageGb":1,"overlayGb":1,"createdAt":1}"#;
    assert!(c.decode(&json(200, unstaged), unstaged).is_err());
}

#[test]
fn ac_3_4_3_checkpoint_creates_need_created_and_branchable() {
    let spec = MachineSpec {
        source: Source::Checkpoint {
            path: "/cp/a.checkpoint".into(),
        },
        ..MachineSpec::default()
    };
    let c = Create::new(&v122(), name("wire-a36ea992d1a0"), &spec).unwrap();
    // TV5 (1.22.0) says branchable:false.
    let e = c.decode(&json(200, TV5_122), TV5_122).unwrap_err();
    assert_eq!(e.reason(), Reason::ReplyCheckpointNotBranchable);
    let ok = String::from_utf8(TV5_122.to_vec())
        .unwrap()
        .replace(r#""branchable":false"#, r#""branchable":true"#);
    assert!(c.decode(&json(200, ok.as_bytes()), ok.as_bytes()).is_ok());
    let running = ok.replace(r#""state":"created""#, r#""state":"running""#);
    assert!(
        c.decode(&json(200, running.as_bytes()), running.as_bytes())
            .is_err()
    );
    // Checkpoint sources: offline, no ports, mounts or workload; 1.16.1+.
    assert!(Create::new(&Profile::known(Version::V1_16_0), name("a"), &spec).is_err());
    assert!(Create::new(&v192(), name("a"), &spec).is_err());
    let bad = MachineSpec {
        ports: vec![PortMapping::new(1, 1).unwrap()],
        ..spec.clone()
    };
    assert_eq!(
        Create::new(&v122(), name("a"), &bad).unwrap_err().reason(),
        Reason::CheckpointSourceRestrictions
    );
}

#[test]
fn observation_rules_c3_3() {
    let g = Get::new(&v192(), name("wire-test"));
    let ok = String::from_utf8(TV5.to_vec()).unwrap();
    let bad = |from: &str, to: &str| ok.replace(from, to);
    for (variant, why) in [
        (bad(r#""state":"created""#, r#""state":"frozen""#), "state"),
        (bad(r#""state":"created""#, r#""state":"failed""#), "state"),
        (bad(r#""cpus":1"#, r#""cpus":65"#), "cpus"),
        (bad(r#""memoryMb":256"#, r#""memoryMb":127"#), "memory"),
        (bad(r#""storageGb":1"#, r#""storageGb":0"#), "storage"),
        (bad(r#""overlayGb":1"#, r#""overlayGb":65"#), "overlay"),
        (bad(r#""gpu":false"#, r#""gpu":true"#), "gpu"),
        (bad(r#""cuda":false"#, r#""cuda":true"#), "cuda"),
        (
            bad(r#""createdAt":1795935394"#, r#""createdAt":253402300800"#),
            "createdAt",
        ),
        (
            bad(r#""createdAt":1795935394"#, r#""createdAt":-1"#),
            "createdAt sign",
        ),
        (bad(r#","createdAt":1795935394"#, ""), "missing createdAt"),
        (
            bad(r#""ports":[]"#, r#""ports":[{"host":0,"guest":80}]"#),
            "port 0",
        ),
        (
            bad(r#""ports":[]"#, r#""ports":[{"host":80,"guest":80}]"#),
            "ports without virtio-net",
        ),
        (
            bad(
                r#""network":false"#,
                r#""network":false,"allowedHosts":["a.b"]"#,
            ),
            "offline with hosts",
        ),
    ] {
        let e = g
            .decode(&json(200, variant.as_bytes()), variant.as_bytes())
            .unwrap_err();
        assert_err(
            &e,
            Category::Protocol,
            Operation::Get,
            Evidence::DispatchUncertain,
        );
        let _ = why;
    }
    let edge = bad(r#""createdAt":1795935394"#, r#""createdAt":253402300799"#);
    assert!(
        g.decode(&json(200, edge.as_bytes()), edge.as_bytes())
            .is_ok()
    );
    // Network enabled without allowlists.
    let open = bad(r#""network":false"#, r#""network":true"#);
    let e = g
        .decode(&json(200, open.as_bytes()), open.as_bytes())
        .unwrap_err();
    assert_err(
        &e,
        Category::UnsupportedNetworkPolicy,
        Operation::Get,
        Evidence::DispatchUncertain,
    );
    // Extra fields are ignored; 1.22.0 running reply decodes with measurements.
    let r = Get::new(&v122(), name("wire-a36ea992d1a0"))
        .decode(&json(200, TV13_RUNNING), TV13_RUNNING)
        .unwrap();
    assert_eq!(r.state, MachineState::Running);
    assert_eq!(r.pid, Some(49667));
    assert_eq!(r.incarnation.image.as_deref(), Some("python:3.12-alpine"));
    assert_eq!(
        (
            r.measurements.cpu_millis,
            r.measurements.rss_mb,
            r.measurements.pss_mb
        ),
        (Some(4), Some(100), None)
    );
}

#[test]
fn tv11_list_and_its_bounds() {
    let l = List::new(&v192());
    let req = l.request().unwrap();
    assert_eq!(
        (req.method.as_str(), req.target.as_str()),
        ("GET", "/api/v1/machines")
    );
    let empty = br#"{"machines":[]}"#;
    assert!(l.decode(&json(200, empty), empty).unwrap().is_empty());
    let entry = std::str::from_utf8(TV5).unwrap();
    let list = |n: usize| format!(r#"{{"machines":[{}]}}"#, vec![entry; n].join(","));
    let b = list(1_024);
    assert_eq!(
        l.decode(&json(200, b.as_bytes()), b.as_bytes())
            .unwrap()
            .len(),
        1_024
    );
    let b = list(1_025);
    let e = l
        .decode(&json(200, b.as_bytes()), b.as_bytes())
        .unwrap_err();
    assert_err(
        &e,
        Category::OutputLimit,
        Operation::List,
        Evidence::DispatchUncertain,
    );
    assert_eq!(e.limit().unwrap().max, 1_024);
    // One invalid entry fails the whole list.
    let b = format!(r#"{{"machines":[{entry},{{"name":"x"}}]}}"#);
    let e = l
        .decode(&json(200, b.as_bytes()), b.as_bytes())
        .unwrap_err();
    assert_err(
        &e,
        Category::Protocol,
        Operation::List,
        Evidence::DispatchUncertain,
    );
    // A network-enabled entry without allowlists.
    let open = entry.replace(r#""network":false"#, r#""network":true"#);
    let b = format!(r#"{{"machines":[{entry},{open}]}}"#);
    let e = l
        .decode(&json(200, b.as_bytes()), b.as_bytes())
        .unwrap_err();
    assert_err(
        &e,
        Category::UnsupportedNetworkPolicy,
        Operation::List,
        Evidence::DispatchUncertain,
    );
}

#[test]
fn get_request_and_not_found() {
    let g = Get::new(&v192(), name("wire-test"));
    let req = g.request().unwrap();
    assert_eq!(
        (req.method.as_str(), req.target.as_str()),
        ("GET", "/api/v1/machines/wire-test")
    );
    assert!(req.body.is_empty());
    // Name check on the reply.
    let e = Get::new(&v192(), name("other"))
        .decode(&json(200, TV5), TV5)
        .unwrap_err();
    assert_eq!(e.category(), Category::IdentityConflict);
}

#[test]
fn tv29_start_sends_json_empty_object_and_variants() {
    let s = Start::new(&v192(), name("s1"));
    let req = s.request().unwrap();
    assert_eq!(
        (req.method.as_str(), req.target.as_str()),
        ("POST", "/api/v1/machines/s1/start")
    );
    assert_eq!(
        (req.content_type, &req.body[..]),
        (Some("application/json"), &b"{}"[..])
    );
    assert_eq!(
        Start::new(&v192(), name("s1"))
            .branchable()
            .unwrap()
            .request()
            .unwrap()
            .target,
        "/api/v1/machines/s1/start?forkable=true"
    );
    assert_eq!(
        Start::new(&v122(), name("s1"))
            .branchable()
            .unwrap()
            .request()
            .unwrap()
            .target,
        "/api/v1/machines/s1/start?branchable=true"
    );
    let e = Start::new(&Profile::known(Version::V1_17_0), name("s1"))
        .branchable()
        .unwrap_err();
    assert_err(
        &e,
        Category::UnsupportedCapability,
        Operation::Start,
        Evidence::NotDispatched,
    );
    let t = b"Expected request with `Content-Type: application/json`";
    assert_eq!(
        s.decode(&text(415, t), t).unwrap_err().reason(),
        Reason::RejectedMediaType
    );
    let obs = Start::new(&v122(), name("wire-a36ea992d1a0"))
        .decode(&json(200, TV13_RUNNING), TV13_RUNNING)
        .unwrap();
    assert_eq!(obs.state, MachineState::Running);
}

#[test]
fn tv14_stop_and_delete() {
    let s = Stop::new(&v192(), name("wire-test"));
    let req = s.request().unwrap();
    assert_eq!(req.target, "/api/v1/machines/wire-test/stop");
    assert_eq!(&req.body[..], b"{}");
    assert_eq!(
        s.decode(&json(200, TV14_STOP), TV14_STOP).unwrap().state,
        MachineState::Stopped
    );
    let d = Delete::new(name("wire-test"));
    let req = d.request().unwrap();
    assert_eq!(
        (req.method.as_str(), req.target.as_str()),
        ("DELETE", "/api/v1/machines/wire-test")
    );
    let ok = br#"{"deleted":"wire-test"}"#;
    assert_eq!(ok.len(), 23);
    d.decode(&json(200, ok), ok).unwrap();
    let nf = br#"{"error":"machine 'wire-test' not found","code":"NOT_FOUND"}"#;
    assert_eq!(
        d.decode(&json(404, nf), nf).unwrap_err().category(),
        Category::NotFound
    );
}

#[test]
fn ac_4_1_delete_needs_exactly_the_name() {
    let d = Delete::new(name("wire-test"));
    for bad in [
        &br#"{"deleted":"other"}"#[..],
        br#"{"deleted":"wire-test","extra":1}"#,
        br#"{}"#,
        br#"{"deleted":null}"#,
        br#"[]"#,
    ] {
        let e = d.decode(&json(200, bad), bad).unwrap_err();
        assert_err(
            &e,
            Category::Protocol,
            Operation::Delete,
            Evidence::DispatchUncertain,
        );
    }
}

#[test]
fn tv30_created_then_stopped_is_the_same_incarnation() {
    let g = Get::new(&v192(), name("wire-test"));
    let created = g.decode(&json(200, TV5), TV5).unwrap();
    let stopped = g.decode(&json(200, TV14_STOP), TV14_STOP).unwrap();
    assert_ne!(created.state, stopped.state);
    assert!(same_incarnation(&created, &stopped));
    let later = String::from_utf8(TV14_STOP.to_vec())
        .unwrap()
        .replace("1795935394", "1795935395");
    let other = g
        .decode(&json(200, later.as_bytes()), later.as_bytes())
        .unwrap();
    assert!(!same_incarnation(&created, &other));
    // Measurements refuse a changed incarnation.
    let m = Measure::new(&v192(), name("wire-test")).expecting(created.clone());
    assert_eq!(m.request().unwrap().operation, Operation::Measurements);
    assert_eq!(
        m.decode(&json(200, TV14_STOP), TV14_STOP)
            .unwrap()
            .disk_used_mb,
        Some(0)
    );
    let e = m
        .decode(&json(200, later.as_bytes()), later.as_bytes())
        .unwrap_err();
    assert_err(
        &e,
        Category::IdentityConflict,
        Operation::Measurements,
        Evidence::DispatchUncertain,
    );
}

#[test]
fn c3_1_generated_names() {
    let ns = Namespace::new("sb").unwrap();
    let n = ns.generate([0u8; 13]);
    assert_eq!(n.as_str(), "sb-aaaaaaaaaaaaaaaaaaaa");
    let n = ns.generate([0xff; 13]);
    assert_eq!(n.as_str(), "sb-77777777777777777777");
    // RFC 4648 vector: "foobar" base32 = MZXW6YTBOI.
    let mut r = [0u8; 13];
    r[..6].copy_from_slice(b"foobar");
    assert!(ns.generate(r).as_str().starts_with("sb-mzxw6ytboi"));
    assert!(ns.is_candidate(n.as_str()));
    assert!(!ns.is_candidate("sb-7777777777777777777"));
    assert!(!ns.is_candidate("sb-77777777777777777771"));
    assert!(!ns.is_candidate("sc-77777777777777777777"));
    assert!(MachineName::new(ns.generate([7; 13]).as_str()).is_ok());
    let longest = Namespace::new("abcdefghij").unwrap();
    assert_eq!(longest.generate([1; 13]).as_str().len(), 31);
    assert!(Namespace::new("abcdefghijk").is_err());
    for bad in ["", "1a", "A", "a-b"] {
        assert!(Namespace::new(bad).is_err(), "{bad}");
    }
}

#[test]
fn machine_name_grammar() {
    assert!(MachineName::new(&"a".repeat(31)).is_ok());
    assert!(MachineName::new(&"a".repeat(32)).is_err());
    for ok in ["0", "a_b-c", "wire-test", "a--b"] {
        assert!(MachineName::new(ok).is_ok(), "{ok}");
    }
    for bad in ["", "-a", "_a", "A", "a/b", "a.b", "a b"] {
        assert!(MachineName::new(bad).is_err(), "{bad}");
    }
}

#[test]
fn ac_4_2_inspection_never_uses_booting_endpoints() {
    let targets = [
        Get::new(&v122(), name("m1")).request().unwrap().target,
        Measure::new(&v122(), name("m1")).request().unwrap().target,
        List::new(&v122()).request().unwrap().target,
    ];
    for t in targets {
        assert!(
            !t.contains("/exec") && !t.contains("/files") && !t.contains("/start"),
            "{t}"
        );
    }
    for r in [
        Get::new(&v122(), name("m1")).request().unwrap(),
        Measure::new(&v122(), name("m1")).request().unwrap(),
    ] {
        assert_eq!(
            (r.method.as_str(), r.target.as_str()),
            ("GET", "/api/v1/machines/m1")
        );
    }
}

#[test]
fn plain_image_machine_preflight() {
    let g = Get::new(&v122(), name("wire-a36ea992d1a0"));
    let running = g.decode(&json(200, TV13_RUNNING), TV13_RUNNING).unwrap();
    assert!(running.is_plain_image_machine());
    running
        .require_plain_image_machine(Operation::Exec)
        .unwrap();
    // 1.9.2 replies carry neither image nor branchable.
    let old = Get::new(&v192(), name("wire-test"))
        .decode(&json(200, TV5), TV5)
        .unwrap();
    let e = old
        .require_plain_image_machine(Operation::Upload)
        .unwrap_err();
    assert_err(
        &e,
        Category::UnsupportedCapability,
        Operation::Upload,
        Evidence::NotDispatched,
    );
    let branchable = String::from_utf8(TV13_RUNNING.to_vec())
        .unwrap()
        .replace(r#""branchable":false"#, r#""branchable":true"#);
    let b = g
        .decode(&json(200, branchable.as_bytes()), branchable.as_bytes())
        .unwrap();
    assert!(!b.is_plain_image_machine());
}
