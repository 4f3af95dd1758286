//! The simulated worker's definite refusals and imageless machines
//! (session 10, issue 12), drawn from a stream of their own
//! ([`Side`], so the older fault schedules do not move where they do not
//! act):
//!
//! - **A create its create handler refuses** (worker-api.md §2.1, §5.1,
//!   TV8: 400 with the JSON envelope `{"error", "code": "BAD_REQUEST"}`, as
//!   for a catalog's `.smolmachine` sidecar missing on the worker host).
//!   The handler validates before it makes anything: the request made no
//!   machine. The error is the one core's `Create` decodes from those
//!   bytes (`protocol`, `dispatch_uncertain`, `worker_bad_request`, 400),
//!   so the controller sees exactly what a shell would hand it.
//! - **Imageless machines**: a machine created from a `.smolmachine` (no
//!   `image` in its inspect) is not a plain image machine, so a background
//!   launch or a terminal must never be sent to it (C5.4, C7.4: refused at
//!   acceptance, `unsupported_capability` / `needs_plain_image_machine`).
//!
//! The worker reports two rules itself: a create arriving for a name whose
//! create it refused (the one create of a machine is never resent), and a
//! launch or terminal arriving on an imageless machine.

use std::collections::BTreeSet;

use smolbox_core::http1::ResponseHead;
use smolbox_core::worker::{Create, MachineName, MachineSpec, Profile, WorkerCall};
use smolbox_core::{Error, Operation, Reason};

use super::super::rng::Rng;
use super::{Mutation, SimWorker};

/// The body of the create handler's refusal (the real worker's text for a
/// missing sidecar, worker-api.md §5.1).
const REFUSAL: &[u8] =
    br#"{"error":"sidecar file not found: /images/sim.smolmachine","code":"BAD_REQUEST"}"#;

/// The error core's create call decodes from the handler's 400 refusal.
pub fn create_refusal() -> Error {
    let head = ResponseHead {
        status: 400,
        content_type: Some("application/json".to_owned()),
        content_length: Some(REFUSAL.len() as u64),
        chunked: false,
        keep_alive: true,
    };
    let profile = Profile::known(smolbox_core::worker::Version::V1_9_2);
    let decoded = MachineName::new("sim-refused")
        .and_then(|name| Create::new(&profile, name, &MachineSpec::default()))
        .map(|create| create.decode(&head, REFUSAL));
    match decoded {
        Ok(Err(e)) => e,
        // Never: a 400 is an error for every create (the fallback keeps
        // the classification the decoder gives).
        _ => Error::protocol(Operation::Create, Reason::WorkerBadRequest).with_status(400),
    }
}

/// The second random stream of the worker and what it decided.
#[derive(Debug)]
pub(super) struct Side {
    rng: Rng,
    /// Per mille: a machine a create makes is imageless.
    pub(super) imageless: u32,
    /// Names whose create the worker refused.
    pub(super) refused: BTreeSet<String>,
    /// Names of imageless machines (per name: a name is created once).
    pub(super) imageless_names: BTreeSet<String>,
    /// Names some create made a machine for (at any time).
    pub(super) made: BTreeSet<String>,
}

impl Default for Side {
    fn default() -> Self {
        Self {
            rng: Rng::new(0),
            imageless: 0,
            refused: BTreeSet::new(),
            imageless_names: BTreeSet::new(),
            made: BTreeSet::new(),
        }
    }
}

impl SimWorker {
    /// Draws the create handler's refusals
    /// ([`super::WorkerFaults::refuse_create`]) and imageless machines
    /// (`imageless` per mille of the machines creates make) from `rng`, a
    /// stream of their own.
    pub fn set_side(&mut self, rng: Rng, imageless: u32) {
        self.side.rng = rng;
        self.side.imageless = imageless;
    }

    /// A create of `name` arrived: `true` when its handler refuses it
    /// (`may_refuse`: it is handled now, not late; no machine is made). A
    /// create of a name whose create was refused is a violation.
    pub(super) fn create_arrives(&mut self, name: &str, may_refuse: bool) -> bool {
        if self.side.refused.contains(name) {
            self.violations.push(format!(
                "Create of {name} arrived again after the worker refused it (the one create of a machine is never resent)"
            ));
        }
        if may_refuse
            && self.faults.refuse_create > 0
            && self.side.rng.chance(self.faults.refuse_create)
        {
            self.faults_injected += 1;
            self.side.refused.insert(name.to_owned());
            return true;
        }
        false
    }

    /// A create of `name` made its machine: imageless or not (drawn once).
    pub(super) fn machine_made(&mut self, name: &str) {
        self.side.made.insert(name.to_owned());
        if self.side.imageless > 0 && self.side.rng.chance(self.side.imageless) {
            self.side.imageless_names.insert(name.to_owned());
        }
    }

    /// A launch or terminal (`kind`, `identity`) arrived on running machine
    /// `machine`: imageless machines never get one.
    pub(super) fn check_plain_image(&mut self, kind: Mutation, identity: &str, machine: &str) {
        if self.side.imageless_names.contains(machine) && self.is_running(machine) {
            self.violations.push(format!(
                "{kind:?} {identity} reached imageless machine {machine} (a launch or terminal needs a plain image machine, C5.4, C7.4)"
            ));
        }
    }

    /// Whether the worker refused a create of `name` (400 envelope).
    pub fn create_was_refused(&self, name: &str) -> bool {
        self.side.refused.contains(name)
    }

    /// Whether a create ever made machine `name` (it may be gone since).
    pub fn create_made(&self, name: &str) -> bool {
        self.side.made.contains(name)
    }

    /// Whether machine `name` is imageless (created from a `.smolmachine`).
    pub fn is_imageless(&self, name: &str) -> bool {
        self.side.imageless_names.contains(name)
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Request, WorkerFaults};
    use super::*;
    use smolbox_core::{Category, Evidence};

    fn refusing() -> SimWorker {
        let f = WorkerFaults {
            refuse_create: 1000,
            ..WorkerFaults::NONE
        };
        let mut w = SimWorker::new(Rng::new(1), f, "m0");
        w.set_side(Rng::new(2), 0);
        w
    }

    #[test]
    fn the_refusal_is_what_core_calls_a_refused_create() {
        let e = create_refusal();
        assert_eq!(e.category(), Category::Protocol);
        assert_eq!(e.evidence(), Evidence::DispatchUncertain);
        assert_eq!(e.status(), Some(400));
        assert!(Create::refused(&e), "{e:?}");
    }

    #[test]
    fn a_refused_create_makes_nothing_and_a_second_create_is_a_violation() {
        let mut w = refusing();
        w.send(0, 1, Request::Create { name: "a".into() }).unwrap();
        let r = w.take_replies(10_000);
        assert!(Create::refused(r[0].1.as_ref().unwrap_err()), "{r:?}");
        assert!(!w.has_machine("a"));
        assert!(!w.create_may_still_land("a"));
        assert!(w.create_was_refused("a"));
        assert_eq!(w.received(Mutation::Create, "a"), 1);
        assert!(w.take_violations().is_empty());
        w.settle(1);
        w.send(20_000, 2, Request::Create { name: "a".into() })
            .unwrap();
        w.take_replies(30_000);
        let v = w.take_violations();
        assert!(
            v.iter()
                .any(|v| v.contains("arrived again after the worker refused it")),
            "{v:?}"
        );
    }

    #[test]
    fn without_the_fault_the_side_stream_refuses_nothing() {
        let mut w = refusing();
        w.set_faults(WorkerFaults::NONE);
        w.send(0, 1, Request::Create { name: "a".into() }).unwrap();
        let r = w.take_replies(10_000);
        assert!(r[0].1.is_ok(), "{r:?}");
        assert!(w.has_machine("a"));
    }

    #[test]
    fn an_imageless_machine_shows_no_image_and_a_launch_on_it_is_a_violation() {
        let mut w = SimWorker::new(Rng::new(1), WorkerFaults::NONE, "m0");
        w.set_side(Rng::new(2), 1000);
        w.send(0, 1, Request::Create { name: "r".into() }).unwrap();
        w.send(0, 2, Request::Start { name: "r".into() }).unwrap();
        w.take_replies(1_000);
        assert!(w.is_imageless("r"));
        assert!(w.machine_view("r").is_some_and(|v| v.imageless));
        assert!(w.machine_view("m0").is_some_and(|v| !v.imageless));
        w.send(
            1_000,
            3,
            Request::Launch {
                machine: "r".into(),
                argv: super::super::sim_argv("b", 0, 10),
            },
        )
        .unwrap();
        w.take_replies(2_000);
        let v = w.take_violations();
        assert!(
            v.iter().any(|v| v.contains("reached imageless machine r")),
            "{v:?}"
        );
    }
}
