//! Fuzz entry point for every worker reply decoder (`fuzz/fuzz_targets/worker_reply.rs`).
//!
//! The invariant: arbitrary reply bytes under any head never panic and
//! only yield typed results or our [`crate::Error`]s. `cargo test` replays
//! the committed seed corpus (`fuzz/corpus/worker_reply/`).

use bytes::Bytes;

use super::files::{Download, FileBudget, GuestPath, PathPolicy, Upload};
use super::logs::{Logs, LogsParams};
use super::machines::{
    Create, Delete, Get, List, MachineName, MachineSpec, Measure, Start, Stop, decode_observation,
};
use super::node::{Capacity, Health, Metrics, Readyz};
use super::profile::{Profile, Version};
use super::status::classify_error_body;
use super::volumes::{VolumeCreate, VolumeDelete, VolumeId};
use super::{Budgets, WorkerCall};
use crate::error::Operation;
use crate::http1::ResponseHead;

const HEADS: [(u16, Option<&str>); 8] = [
    (200, Some("application/json")),
    (200, Some("text/plain; charset=utf-8")),
    (200, Some("application/octet-stream")),
    (200, None),
    (204, None),
    (404, Some("application/json")),
    (409, Some("application/json")),
    (415, Some("text/plain; charset=utf-8")),
];

/// Feeds `data` as a reply body, under several heads, to every reply
/// decoder of both the 1.9.2 and the 1.22.0 profile.
pub fn fuzz_worker_reply(data: &[u8]) {
    for version in [Version::V1_9_2, Version::V1_22_0] {
        let profile = Profile::known(version);
        for (status, content_type) in HEADS {
            let head = ResponseHead {
                status,
                content_type: content_type.map(str::to_owned),
                content_length: Some(data.len() as u64),
                chunked: false,
                keep_alive: true,
            };
            decode_all(&profile, &head, data);
        }
        let _ = decode_observation(&profile, Operation::Get, data);
    }
}

fn decode_all(profile: &Profile, head: &ResponseHead, data: &[u8]) {
    let _ = classify_error_body(head, data);
    let _ = Health::new().decode(head, data);
    let _ = Readyz.decode(head, data);
    let _ = Capacity.decode(head, data);
    let _ = Metrics.decode(head, data);
    let Ok(name) = MachineName::new("wire-test") else {
        return;
    };
    if let Ok(c) = Create::new(profile, name.clone(), &MachineSpec::default()) {
        let _ = c.decode(head, data);
    }
    let _ = List::new(profile).decode(head, data);
    let _ = Get::new(profile, name.clone()).decode(head, data);
    let _ = Measure::new(profile, name.clone()).decode(head, data);
    let _ = Start::new(profile, name.clone()).decode(head, data);
    let _ = Stop::new(profile, name.clone()).decode(head, data);
    let _ = Delete::new(name.clone()).decode(head, data);
    let budget = FileBudget::new(1_048_576, &Budgets::default());
    let path = GuestPath::new("/workspace/hello.txt");
    if let (Ok(budget), Ok(path)) = (budget, path) {
        let policy = PathPolicy::default();
        let hello = Bytes::from_static(b"hello\n");
        let digest = "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03";
        if let Ok(u) = Upload::new(
            profile,
            &policy,
            &budget,
            name.clone(),
            path.clone(),
            hello,
            digest,
        ) {
            let _ = u.decode(head, data);
        }
        if let Ok(d) = Download::new(profile, &policy, &budget, name.clone(), path, 16) {
            let _ = d.decode(head, data);
        }
    }
    if let Ok(logs) = Logs::new(
        &Profile::known(Version::V1_22_0),
        name,
        LogsParams::default(),
    ) {
        let _ = logs.check_head(head);
        let _ = logs.decode_error(head, data);
        let mut lines = logs.lines();
        for line in data.split(|&b| b == b'\n') {
            if lines.handle_event(None, line).is_err() {
                break;
            }
        }
        let mut stream = logs.stream();
        let fed = data.chunks(4_096).try_for_each(|c| stream.handle_input(c));
        while stream.poll_line().is_some() {}
        if fed.is_ok() {
            let _ = stream.finish();
        }
    }
    if let Ok(id) = VolumeId::new("vol-abc123") {
        if let Ok(v) = VolumeCreate::new(profile, id.clone(), 2) {
            let _ = v.decode(head, data);
        }
        if let Ok(v) = VolumeDelete::new(profile, id) {
            let _ = v.decode(head, data);
        }
    }
}
