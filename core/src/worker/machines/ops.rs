//! Machine lifecycle operations (features C3.4, C4, C2.4).

use crate::Reason;
use serde::Deserialize;

use super::matching::{match_create, match_name};
use super::name::MachineName;
use super::observation::{MachineWire, Observation, decode_observation, validate};
use super::spec::MachineSpec;
use super::wire::create_body;
use crate::error::{Error, Operation};
use crate::http1::{Method, Request, ResponseHead};
use crate::worker::json::decode_json;
use crate::worker::node::Measurements;
use crate::worker::profile::{Feature, Profile};
use crate::worker::status::{check_media_type, check_status};
use crate::worker::{APPLICATION_JSON, MACHINES_PATH, WorkerCall, machine_target};

/// Most entries a list reply may hold.
pub const MAX_LIST_ENTRIES: usize = 1_024;

fn machine_reply(
    profile: &Profile,
    op: Operation,
    head: &ResponseHead,
    body: &[u8],
) -> Result<Observation, Error> {
    check_status(op, head, body, 200)?;
    check_media_type(op, head, APPLICATION_JSON)?;
    decode_observation(profile, op, body)
}

/// `POST /api/v1/machines` (C3.2, C3.4). The reply must match the request.
#[derive(Clone, Debug)]
pub struct Create {
    profile: Profile,
    name: MachineName,
    spec: MachineSpec,
}

impl Create {
    /// Validates the spec and its features against the profile.
    ///
    /// # Errors
    /// `validation` / `unsupported_capability`, evidence `not_dispatched`.
    pub fn new(profile: &Profile, name: MachineName, spec: &MachineSpec) -> Result<Self, Error> {
        let spec = spec.check(profile)?;
        Ok(Self {
            profile: profile.clone(),
            name,
            spec,
        })
    }

    /// The canonical spec that will be sent.
    pub const fn spec(&self) -> &MachineSpec {
        &self.spec
    }

    /// Whether `e`, the error of a create, is the worker's create handler
    /// refusing the request: status 400 with the JSON error envelope
    /// `{"error", "code": "BAD_REQUEST"}` (worker-api.md §2.1, §5.1, TV8:
    /// names, sizes, ports, CIDRs, a missing `.smolmachine` sidecar, …).
    /// The handler validates before it makes anything, so that request
    /// created no machine. The error itself keeps `protocol` /
    /// `dispatch_uncertain` (C1.2: the request reached the worker); what
    /// the refusal proves about the machine is the caller's to decide (the
    /// managed controller sends each create once; docs/decisions/runtime.md,
    /// "A create the worker refuses (session 9, issue 12)").
    ///
    /// Not a refusal: any other status (a 409 says the name is taken, a
    /// 5xx or 408 may have acted), a framework rejection (`text/plain`), an
    /// empty or malformed body, another envelope code, or a reply that
    /// does not match the request.
    pub fn refused(e: &Error) -> bool {
        e.operation() == Operation::Create
            && e.category() == crate::Category::Protocol
            && e.status() == Some(400)
            && e.reason() == Reason::WorkerBadRequest
    }
}

impl WorkerCall for Create {
    type Output = Observation;

    fn operation(&self) -> Operation {
        Operation::Create
    }

    fn request(&self) -> Result<Request, Error> {
        Ok(
            Request::new(Operation::Create, Method::Post, MACHINES_PATH.into())
                .accept(APPLICATION_JSON)
                .body(
                    APPLICATION_JSON,
                    create_body(self.name.as_str(), &self.spec),
                ),
        )
    }

    fn decode(&self, head: &ResponseHead, body: &[u8]) -> Result<Observation, Error> {
        let obs = machine_reply(&self.profile, Operation::Create, head, body)?;
        match_create(self.name.as_str(), &self.spec, &obs)?;
        Ok(obs)
    }
}

/// `GET /api/v1/machines` (C3.3): ≤1,024 entries, one invalid entry fails all.
#[derive(Clone, Debug)]
pub struct List {
    profile: Profile,
}

impl List {
    /// The list read.
    pub fn new(profile: &Profile) -> Self {
        Self {
            profile: profile.clone(),
        }
    }
}

#[derive(Deserialize)]
struct ListWire {
    machines: Vec<serde_json::Value>,
}

impl WorkerCall for List {
    type Output = Vec<Observation>;

    fn operation(&self) -> Operation {
        Operation::List
    }

    fn request(&self) -> Result<Request, Error> {
        Ok(
            Request::new(Operation::List, Method::Get, MACHINES_PATH.into())
                .accept(APPLICATION_JSON),
        )
    }

    fn decode(&self, head: &ResponseHead, body: &[u8]) -> Result<Vec<Observation>, Error> {
        let op = Operation::List;
        let wire: ListWire = decode_json(op, head, body)?;
        if wire.machines.len() > MAX_LIST_ENTRIES {
            return Err(Error::output_limit(
                op,
                crate::error::Evidence::DispatchUncertain,
                Reason::ListTooLong,
            )
            .with_limit(wire.machines.len() as u64, MAX_LIST_ENTRIES as u64));
        }
        wire.machines
            .into_iter()
            .map(|v| {
                let m: MachineWire = serde_json::from_value(v)
                    .map_err(|_| Error::protocol(op, Reason::InvalidMachineJson))?;
                validate(&self.profile, op, m)
            })
            .collect()
    }
}

/// `GET /api/v1/machines/{name}` (C4): never starts the machine; 404 → `not_found`.
#[derive(Clone, Debug)]
pub struct Get {
    profile: Profile,
    name: MachineName,
}

impl Get {
    /// Inspects one machine.
    pub fn new(profile: &Profile, name: MachineName) -> Self {
        Self {
            profile: profile.clone(),
            name,
        }
    }
}

impl WorkerCall for Get {
    type Output = Observation;

    fn operation(&self) -> Operation {
        Operation::Get
    }

    fn request(&self) -> Result<Request, Error> {
        Ok(Request::new(
            Operation::Get,
            Method::Get,
            machine_target(self.name.as_str(), ""),
        )
        .accept(APPLICATION_JSON))
    }

    fn decode(&self, head: &ResponseHead, body: &[u8]) -> Result<Observation, Error> {
        let obs = machine_reply(&self.profile, Operation::Get, head, body)?;
        match_name(Operation::Get, self.name.as_str(), &obs)?;
        Ok(obs)
    }
}

/// Machine measurements from a single machine GET (C2.4): takes no slot,
/// never starts the machine. Optionally checks a recorded incarnation.
#[derive(Clone, Debug)]
pub struct Measure {
    get: Get,
    expected: Option<Observation>,
}

impl Measure {
    /// Reads the measurements of `name`.
    pub fn new(profile: &Profile, name: MachineName) -> Self {
        Self {
            get: Get::new(profile, name),
            expected: None,
        }
    }

    /// Also requires the reply to be the same incarnation as `recorded`
    /// (else `identity_conflict`).
    #[must_use]
    pub fn expecting(mut self, recorded: Observation) -> Self {
        self.expected = Some(recorded);
        self
    }
}

impl WorkerCall for Measure {
    type Output = Measurements;

    fn operation(&self) -> Operation {
        Operation::Measurements
    }

    fn request(&self) -> Result<Request, Error> {
        let mut r = self.get.request()?;
        r.operation = Operation::Measurements;
        Ok(r)
    }

    fn decode(&self, head: &ResponseHead, body: &[u8]) -> Result<Measurements, Error> {
        let op = Operation::Measurements;
        let obs = machine_reply(&self.get.profile, op, head, body)?;
        match_name(op, self.get.name.as_str(), &obs)?;
        if let Some(rec) = &self.expected
            && !super::same_incarnation(rec, &obs)
        {
            return Err(Error::identity_conflict(
                op,
                crate::error::Evidence::DispatchUncertain,
                Reason::IncarnationChanged,
            ));
        }
        Ok(obs.measurements)
    }
}

/// `POST /api/v1/machines/{name}/start` with body `{}` (C4); optionally
/// `?branchable=true` (`?forkable=true` on 1.9.2) for capture sources.
/// A 409 `PORT_IN_USE` is `port_conflict` (uncertain; reservations stay).
#[derive(Clone, Debug)]
pub struct Start {
    profile: Profile,
    name: MachineName,
    branchable: bool,
}

impl Start {
    /// Starts a machine.
    pub fn new(profile: &Profile, name: MachineName) -> Self {
        Self {
            profile: profile.clone(),
            name,
            branchable: false,
        }
    }

    /// Starts it as a branchable capture source (feature `branches`).
    ///
    /// # Errors
    /// `unsupported_capability`, `not_dispatched`, when the version lacks it.
    pub fn branchable(mut self) -> Result<Self, Error> {
        self.profile.require(Feature::Branches, Operation::Start)?;
        self.branchable = true;
        Ok(self)
    }
}

impl WorkerCall for Start {
    type Output = Observation;

    fn operation(&self) -> Operation {
        Operation::Start
    }

    fn request(&self) -> Result<Request, Error> {
        let mut target = machine_target(self.name.as_str(), "/start");
        if self.branchable {
            target.push('?');
            target.push_str(self.profile.branchable_key());
            target.push_str("=true");
        }
        Ok(Request::new(Operation::Start, Method::Post, target)
            .accept(APPLICATION_JSON)
            .body(APPLICATION_JSON, &b"{}"[..]))
    }

    fn decode(&self, head: &ResponseHead, body: &[u8]) -> Result<Observation, Error> {
        let obs = machine_reply(&self.profile, Operation::Start, head, body)?;
        match_name(Operation::Start, self.name.as_str(), &obs)?;
        Ok(obs)
    }
}

/// `POST /api/v1/machines/{name}/stop` with body `{}` (C4). A failed stop
/// authorizes nothing.
#[derive(Clone, Debug)]
pub struct Stop {
    profile: Profile,
    name: MachineName,
}

impl Stop {
    /// Stops a machine.
    pub fn new(profile: &Profile, name: MachineName) -> Self {
        Self {
            profile: profile.clone(),
            name,
        }
    }
}

impl WorkerCall for Stop {
    type Output = Observation;

    fn operation(&self) -> Operation {
        Operation::Stop
    }

    fn request(&self) -> Result<Request, Error> {
        Ok(Request::new(
            Operation::Stop,
            Method::Post,
            machine_target(self.name.as_str(), "/stop"),
        )
        .accept(APPLICATION_JSON)
        .body(APPLICATION_JSON, &b"{}"[..]))
    }

    fn decode(&self, head: &ResponseHead, body: &[u8]) -> Result<Observation, Error> {
        let obs = machine_reply(&self.profile, Operation::Stop, head, body)?;
        match_name(Operation::Stop, self.name.as_str(), &obs)?;
        Ok(obs)
    }
}

/// `DELETE /api/v1/machines/{name}` (C4): succeeds only on exactly
/// `{"deleted": "<name>"}`; the caller must then observe 404.
#[derive(Clone, Debug)]
pub struct Delete {
    name: MachineName,
}

impl Delete {
    /// Deletes a machine.
    pub const fn new(name: MachineName) -> Self {
        Self { name }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DeletedWire {
    deleted: String,
}

impl WorkerCall for Delete {
    type Output = ();

    fn operation(&self) -> Operation {
        Operation::Delete
    }

    fn request(&self) -> Result<Request, Error> {
        Ok(Request::new(
            Operation::Delete,
            Method::Delete,
            machine_target(self.name.as_str(), ""),
        )
        .accept(APPLICATION_JSON))
    }

    fn decode(&self, head: &ResponseHead, body: &[u8]) -> Result<(), Error> {
        let op = Operation::Delete;
        let w: DeletedWire = decode_json(op, head, body)?;
        if w.deleted == self.name.as_str() {
            Ok(())
        } else {
            Err(Error::protocol(op, Reason::DeletedNameMismatch))
        }
    }
}
