//! Node-local volumes (features C10.2; Linux 1.20.2/1.22.0).

use crate::Reason;
use serde::{Deserialize, Serialize};

use super::profile::{Feature, Profile};
use super::status::status_error;
use super::{APPLICATION_JSON, WorkerCall};
use crate::error::{Error, Operation};
use crate::http1::encode::push_path_segment;
use crate::http1::{Method, Request, ResponseHead};
use crate::worker::json::decode_json;

/// Longest volume id.
pub const MAX_VOLUME_ID_LEN: usize = 128;
/// Smallest and largest advisory size, GiB.
pub const VOLUME_SIZE_GB: (u32, u32) = (1, 1_024);
/// Longest `node_path` accepted in a reply.
pub const MAX_NODE_PATH_LEN: usize = 4_096;

/// A volume id: `^[A-Za-z0-9_-]{1,128}$`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct VolumeId(Box<str>);

impl VolumeId {
    /// Validates an id.
    ///
    /// # Errors
    /// `validation`, operation `volume_create`, reason `invalid_volume_id`.
    pub fn new(id: &str) -> Result<Self, Error> {
        let ok = !id.is_empty()
            && id.len() <= MAX_VOLUME_ID_LEN
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if ok {
            Ok(Self(id.into()))
        } else {
            Err(Error::validation(
                Operation::VolumeCreate,
                Reason::InvalidVolumeId,
            ))
        }
    }

    /// The id text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

fn volume_target(id: &VolumeId) -> String {
    let mut t = String::from("/api/v1/volumes/");
    push_path_segment(&mut t, id.as_str());
    t
}

/// `POST /api/v1/volumes {id, size_gb, backend:"local"}` → `{node_path}`.
#[derive(Clone, Debug)]
pub struct VolumeCreate {
    id: VolumeId,
    size_gb: u32,
}

#[derive(Serialize)]
struct CreateBody<'a> {
    id: &'a str,
    size_gb: u32,
    backend: &'static str,
}

#[derive(Deserialize)]
struct CreatedWire {
    node_path: String,
}

impl VolumeCreate {
    /// Validates size and version.
    ///
    /// # Errors
    /// `validation` or `unsupported_capability`, `not_dispatched`.
    pub fn new(profile: &Profile, id: VolumeId, size_gb: u32) -> Result<Self, Error> {
        if !(VOLUME_SIZE_GB.0..=VOLUME_SIZE_GB.1).contains(&size_gb) {
            return Err(
                Error::validation(Operation::VolumeCreate, Reason::VolumeSizeOutOfRange)
                    .with_limit(size_gb.into(), VOLUME_SIZE_GB.1.into()),
            );
        }
        profile.require(Feature::Volumes, Operation::VolumeCreate)?;
        Ok(Self { id, size_gb })
    }
}

impl WorkerCall for VolumeCreate {
    /// The normalized absolute host path of the volume (`node_path`).
    type Output = String;

    fn operation(&self) -> Operation {
        Operation::VolumeCreate
    }

    fn request(&self) -> Result<Request, Error> {
        let body = serde_json::to_vec(&CreateBody {
            id: self.id.as_str(),
            size_gb: self.size_gb,
            backend: "local",
        })
        .map_err(|_| Error::validation(Operation::VolumeCreate, Reason::UnserializableBody))?;
        Ok(Request::new(
            Operation::VolumeCreate,
            Method::Post,
            "/api/v1/volumes".into(),
        )
        .accept(APPLICATION_JSON)
        .body(APPLICATION_JSON, body))
    }

    fn decode(&self, head: &ResponseHead, body: &[u8]) -> Result<String, Error> {
        let op = Operation::VolumeCreate;
        let w: CreatedWire = decode_json(op, head, body)?;
        let p = &w.node_path;
        let normalized = p.len() <= MAX_NODE_PATH_LEN
            && p.starts_with('/')
            && !p.contains(['\0', '\\'])
            && p[1..]
                .split('/')
                .all(|s| !s.is_empty() && s != "." && s != "..");
        if !normalized {
            return Err(Error::protocol(op, Reason::NodePathNotNormalized));
        }
        Ok(w.node_path)
    }
}

/// `DELETE /api/v1/volumes/{id}`: succeeds only on 204 with an empty body;
/// a 404 is not absence (`protocol`).
#[derive(Clone, Debug)]
pub struct VolumeDelete {
    id: VolumeId,
}

impl VolumeDelete {
    /// Validates the version.
    ///
    /// # Errors
    /// `unsupported_capability`, `not_dispatched`.
    pub fn new(profile: &Profile, id: VolumeId) -> Result<Self, Error> {
        profile.require(Feature::Volumes, Operation::VolumeDelete)?;
        Ok(Self { id })
    }
}

impl WorkerCall for VolumeDelete {
    type Output = ();

    fn operation(&self) -> Operation {
        Operation::VolumeDelete
    }

    fn request(&self) -> Result<Request, Error> {
        Ok(Request::new(
            Operation::VolumeDelete,
            Method::Delete,
            volume_target(&self.id),
        ))
    }

    fn decode(&self, head: &ResponseHead, body: &[u8]) -> Result<(), Error> {
        let op = Operation::VolumeDelete;
        match head.status {
            204 if body.is_empty() => Ok(()),
            204 => Err(Error::protocol(op, Reason::VolumeDeleteBodyNotEmpty).with_status(204)),
            404 | 200 => {
                Err(Error::protocol(op, Reason::VolumeDeleteNotConfirmed).with_status(head.status))
            }
            _ => Err(status_error(op, head, body)),
        }
    }

    fn max_response_bytes(&self) -> Option<u64> {
        Some(65_536)
    }
}
