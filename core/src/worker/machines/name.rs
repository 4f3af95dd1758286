//! Machine names and generated names (features §0.1, C3.1).

use crate::Reason;
use crate::error::{Error, Operation};

/// Longest machine name in bytes.
pub const MAX_NAME_LEN: usize = 31;
/// Longest namespace in bytes.
pub const MAX_NAMESPACE_LEN: usize = 10;
/// Random bytes a generated name consumes (100 bits used).
pub const NAME_RANDOM_BYTES: usize = 13;
/// Length of the base32 suffix of a generated name.
pub const SUFFIX_LEN: usize = 20;

/// A machine name: ≤31 bytes of `^[a-z0-9][a-z0-9_-]*$`, used verbatim as
/// one URL path segment.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MachineName(Box<str>);

impl MachineName {
    /// Validates a machine name.
    ///
    /// # Errors
    /// `validation`, operation `machine_spec`, reason `invalid_machine_name`.
    pub fn new(name: &str) -> Result<Self, Error> {
        let b = name.as_bytes();
        let ok = !b.is_empty()
            && b.len() <= MAX_NAME_LEN
            && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
            && b.iter()
                .all(|&c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'_' || c == b'-');
        if ok {
            Ok(Self(name.into()))
        } else {
            Err(Error::validation(
                Operation::MachineSpec,
                Reason::InvalidMachineName,
            ))
        }
    }

    /// The name text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A name namespace: 1–10 bytes of `^[a-z][a-z0-9]*$`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Namespace(Box<str>);

impl Namespace {
    /// Validates a namespace.
    ///
    /// # Errors
    /// `validation`, operation `machine_spec`, reason `invalid_namespace`.
    pub fn new(ns: &str) -> Result<Self, Error> {
        let b = ns.as_bytes();
        let ok = !b.is_empty()
            && b.len() <= MAX_NAMESPACE_LEN
            && b[0].is_ascii_lowercase()
            && b.iter()
                .all(|&c| c.is_ascii_lowercase() || c.is_ascii_digit());
        if ok {
            Ok(Self(ns.into()))
        } else {
            Err(Error::validation(
                Operation::MachineSpec,
                Reason::InvalidNamespace,
            ))
        }
    }

    /// The namespace text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// `namespace-` + 20 lowercase base32 characters (RFC 4648, no padding)
    /// of the caller's 13 random bytes (the first 100 bits). Persist the name
    /// before any create request.
    pub fn generate(&self, random: [u8; NAME_RANDOM_BYTES]) -> MachineName {
        const ALPHABET: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";
        let mut name = String::with_capacity(self.0.len() + 1 + SUFFIX_LEN);
        name.push_str(&self.0);
        name.push('-');
        let mut acc: u32 = 0;
        let mut bits = 0;
        for &byte in &random {
            acc = (acc << 8) | u32::from(byte);
            bits += 8;
            while bits >= 5 && name.len() < self.0.len() + 1 + SUFFIX_LEN {
                bits -= 5;
                name.push(char::from(ALPHABET[((acc >> bits) & 31) as usize]));
            }
            acc &= (1 << bits) - 1;
        }
        MachineName(name.into())
    }

    /// True when `name` has this namespace's generated shape: prefix
    /// `namespace-`, then exactly 20 of `[a-z2-7]`.
    pub fn is_candidate(&self, name: &str) -> bool {
        name.len() == self.0.len() + 1 + SUFFIX_LEN
            && name.starts_with(&*self.0)
            && name.as_bytes()[self.0.len()] == b'-'
            && name.as_bytes()[self.0.len() + 1..]
                .iter()
                .all(|c| c.is_ascii_lowercase() || (b'2'..=b'7').contains(c))
    }
}

/// True for an upstream (1.9.2) machine name: 1–128 bytes of ASCII
/// letters, digits, `-`, `_`, starting with a letter or digit.
pub(crate) fn is_upstream_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 128
        && b[0].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || *c == b'-' || *c == b'_')
}
