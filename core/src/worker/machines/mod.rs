//! Machines: names (C3.1), specification (C3.2), observation (C3.3),
//! creation reply matching (C3.4), incarnation (C3.5) and the lifecycle
//! operations (C4).

mod incarnation;
mod matching;
mod name;
mod observation;
mod ops;
mod preflight;
mod spec;
mod wire;

pub use incarnation::{Incarnation, NetworkBackend};
pub use matching::same_incarnation;
pub use name::{
    MAX_NAME_LEN, MAX_NAMESPACE_LEN, MachineName, NAME_RANDOM_BYTES, Namespace, SUFFIX_LEN,
};
pub use observation::{MAX_CREATED_AT, MachineState, Observation, decode_observation};
pub use ops::{Create, Delete, Get, List, MAX_LIST_ENTRIES, Measure, Start, Stop};
pub use preflight::ImageCheck;
pub use spec::{CPUS, DISK_GB, MAX_SOURCE_LEN, MEMORY_MB, MachineSpec, Source};
