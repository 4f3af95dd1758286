//! Property tests of creation reply matching (C3.4): the reply a worker
//! echoes for any valid spec matches, and changing any one echoed field
//! makes it fail with the right category.
#![allow(clippy::unwrap_used)] // tests unwrap known-good values

mod worker_support;

use proptest::prelude::*;
use serde_json::{Value, json};
use smolbox_core::worker::{
    Cidr, Create, Hostname, MachineName, MachineSpec, NetworkPolicy, PortMapping, Source,
    WorkerCall,
};
use smolbox_core::{Category, Evidence};
use worker_support::*;

const HOSTS: [&str; 4] = ["a.example.com", "api.example.org", "b.test.net", "x.y.z"];
const CIDRS: [&str; 4] = [
    "10.0.0.0/8",
    "192.168.1.0/24",
    "2001:db8::/32",
    "203.0.113.7/32",
];

fn spec_strategy() -> impl Strategy<Value = MachineSpec> {
    (
        1u8..=64,
        128u32..=16_384,
        1u32..=64,
        1u32..=64,
        proptest::collection::btree_set(0usize..4, 0..=4),
        proptest::collection::btree_set(0usize..4, 0..=4),
        proptest::collection::btree_map(1u16..=65_535, 1u16..=65_535, 0..=4),
    )
        .prop_map(
            |(cpus, memory_mb, storage_gb, overlay_gb, hosts, cidrs, ports)| {
                let network = if hosts.is_empty() && cidrs.is_empty() {
                    NetworkPolicy::Offline
                } else {
                    NetworkPolicy::allowlist(
                        hosts
                            .iter()
                            .map(|&i| Hostname::new(HOSTS[i]).unwrap())
                            .collect(),
                        cidrs
                            .iter()
                            .map(|&i| Cidr::new(CIDRS[i]).unwrap())
                            .collect(),
                    )
                    .unwrap()
                };
                MachineSpec {
                    cpus,
                    memory_mb,
                    storage_gb,
                    overlay_gb,
                    network,
                    ports: ports
                        .into_iter()
                        .map(|(h, g)| PortMapping::new(h, g).unwrap())
                        .collect(),
                    source: Source::Image {
                        path: "/i/a.smolmachine".into(),
                    },
                    ..MachineSpec::default()
                }
            },
        )
}

/// The reply a faithful worker gives: the request's fields echoed (lists
/// in request order) plus the fields a create reply always carries.
fn echo(name: &str, body: &[u8]) -> Value {
    let req: Value = serde_json::from_slice(body).unwrap();
    let mut reply = json!({
        "name": name,
        "state": "created",
        "cpus": req["cpus"],
        "memoryMb": req["memoryMb"],
        "mounts": [],
        "ports": req["ports"],
        "network": req["network"],
        "gpu": false,
        "cuda": false,
        "storageGb": req["storageGb"],
        "overlayGb": req["overlayGb"],
        "forkable": false,
        "forkpointHeld": false,
        "createdAt": 1_795_935_394u64,
    });
    for key in ["networkBackend", "allowedHosts", "allowedCidrs"] {
        if let Some(v) = req.get(key) {
            reply[key] = v.clone();
        }
    }
    reply
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn echoed_reply_matches(spec in spec_strategy()) {
        let c = Create::new(&v122(), MachineName::new("m1").unwrap(), &spec).unwrap();
        let body = c.request().unwrap().body;
        let reply = serde_json::to_vec(&echo("m1", &body)).unwrap();
        let obs = c.decode(&json(200, &reply), &reply).unwrap();
        prop_assert_eq!(&obs.incarnation.network, &c.spec().network);
        prop_assert_eq!(&obs.incarnation.ports, &c.spec().ports);
    }

    #[test]
    fn one_changed_field_fails(spec in spec_strategy(), which in 0usize..6) {
        let c = Create::new(&v122(), MachineName::new("m1").unwrap(), &spec).unwrap();
        let body = c.request().unwrap().body;
        let mut reply = echo("m1", &body);
        let bump = |v: &Value, lo: u64, hi: u64| {
            let n = v.as_u64().unwrap();
            json!(if n < hi { n + 1 } else { lo })
        };
        let expected = match which {
            0 => { reply["name"] = json!("m2"); Category::IdentityConflict }
            1 => { reply["cpus"] = bump(&reply["cpus"], 1, 64); Category::Protocol }
            2 => { reply["memoryMb"] = bump(&reply["memoryMb"], 128, 16_384); Category::Protocol }
            3 => { reply["storageGb"] = bump(&reply["storageGb"], 1, 64); Category::Protocol }
            4 => { reply["overlayGb"] = bump(&reply["overlayGb"], 1, 64); Category::Protocol }
            _ => {
                // Ports: drop one, or add one when there are none.
                let ports = reply["ports"].as_array_mut().unwrap();
                if ports.pop().is_none() {
                    reply["ports"] = json!([{"host": 1, "guest": 1}]);
                    reply["networkBackend"] = json!("virtio-net");
                }
                Category::Protocol
            }
        };
        let bytes = serde_json::to_vec(&reply).unwrap();
        let e = c.decode(&json(200, &bytes), &bytes).unwrap_err();
        prop_assert_eq!(e.category(), expected);
        prop_assert_eq!(e.evidence(), Evidence::DispatchUncertain);
    }
}
