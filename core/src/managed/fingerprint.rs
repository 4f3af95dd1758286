//! Fingerprints: HMAC-SHA256 (lowercase hex) with the host key over a
//! canonical, domain-separated, versioned encoding (C12.5).
//!
//! # Canonical encoding, versions 1 and 2 (frozen by the golden tests)
//!
//! ```text
//! message = "smolbox.fp" 0x00 version(u8) str(domain) field*
//! field   = tag(u8) value            -- tags strictly increasing
//! str     = len(u32 BE) utf8-bytes
//! u64/i64 = 8 bytes BE               bool = 0x00 | 0x01
//! list    = count(u32 BE) item*      map = list of (str key, value), sorted
//! ```
//!
//! Version 2 adds two optional execution-spec fields after tag 22: the
//! guest user (tag 23) and the caller-named worker machine (tags 24 worker
//! id, 25 machine name). A spec that has neither is encoded exactly as in
//! version 1 (version byte 1), so every identity created before version 2
//! stays stable; a spec with either is encoded with version byte 2.
//!
//! A terminal spec (C7.1) encodes its program (tag 7), size (13, 14) and
//! bounds (26–31: session, idle, close, attach, buffer, input); terminal
//! identities did not exist before these tags.
//!
//! Fields equal to their default (no env, background false, offline
//! network, no guest-path policy, no inputs/outputs/metadata) are left out,
//! so identities stay stable when a new optional field is introduced. A
//! managed command's fingerprint is the HMAC over `(command domain, machine
//! handle, spec fingerprint)`; a machine's layers ports, workload and the
//! checkpointable flag onto a base over the machine spec.

use crate::Reason;
use core::fmt;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::RecordKey;
use super::spec::{Action, ExecutionSpec, MetaValue, RetainedMachineSpec};
use crate::{Error, Operation};

/// Version of the canonical encoding of specs without the version-2 fields.
pub const ENCODING_VERSION: u8 = 1;
/// Version of the canonical encoding of execution specs with a guest user
/// or a caller-named worker machine.
pub const ENCODING_VERSION_2: u8 = 2;
/// Shortest fingerprint key in bytes (C12.1).
pub const MIN_KEY_LEN: usize = 32;
/// Longest fingerprint key in bytes (C12.1).
pub const MAX_KEY_LEN: usize = 4_096;

const DOMAIN_EXEC: &str = "execution-spec";
const DOMAIN_COMMAND: &str = "managed-command";
const DOMAIN_MACHINE_BASE: &str = "machine-base";
const DOMAIN_MACHINE: &str = "machine";

/// The host's fingerprint key: 32–4,096 bytes, stable across restarts,
/// distinct from the encryption key. `Debug` never prints it.
///
/// Beside the bytes it keeps the HMAC state already keyed with them (the
/// inner and outer pads hashed once, when the key is built): each MAC
/// clones that state instead of keying again, two SHA-256 compressions
/// fewer per MAC, the same value.
#[derive(Clone)]
pub struct FingerprintKey {
    bytes: Vec<u8>,
    keyed: Hmac<Sha256>,
}

impl FingerprintKey {
    /// Wraps key bytes.
    ///
    /// # Errors
    /// `validation` when the key is shorter than 32 or longer than 4,096 bytes.
    pub fn new(bytes: &[u8]) -> Result<Self, Error> {
        if !(MIN_KEY_LEN..=MAX_KEY_LEN).contains(&bytes.len()) {
            return Err(Error::validation(Operation::Fingerprint, Reason::KeyLength)
                .with_limit(bytes.len() as u64, MAX_KEY_LEN as u64));
        }
        // HMAC accepts keys of any length; new_from_slice cannot fail.
        let keyed = <Hmac<Sha256> as Mac>::new_from_slice(bytes)
            .unwrap_or_else(|_| unreachable!("HMAC takes any key length"));
        Ok(Self {
            bytes: bytes.to_vec(),
            keyed,
        })
    }

    /// True when both keys hold the same bytes (used to refuse an
    /// encryption key equal to the fingerprint key).
    pub fn same_bytes(&self, other: &[u8]) -> bool {
        self.bytes == other
    }

    /// A tag that identifies this key without revealing it (an HMAC of a
    /// fixed label): stores keep it beside their records so a replaced
    /// fingerprint key file is refused at open instead of silently making
    /// every resubmission look new.
    pub fn check_tag(&self) -> String {
        self.mac(b"smolbox.fingerprint-key-check.v1")
    }

    fn mac(&self, message: &[u8]) -> String {
        let mut mac = self.keyed.clone();
        mac.update(message);
        hex(&mac.finalize().into_bytes())
    }
}

impl fmt::Debug for FingerprintKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FingerprintKey(<redacted>)")
    }
}

/// The canonical encoding of an execution spec (without its machine
/// handle). Exposed for golden tests and audits.
pub fn encode_exec_spec(spec: &ExecutionSpec) -> Vec<u8> {
    let user = match &spec.action {
        Action::Command(cmd) => cmd.user.as_deref(),
        Action::Terminal(_) => None,
    };
    let version = if user.is_some() || spec.worker_machine.is_some() {
        ENCODING_VERSION_2
    } else {
        ENCODING_VERSION
    };
    let mut c = Canon::with_version(DOMAIN_EXEC, version);
    c.str(
        1,
        match spec.artifact.kind {
            super::spec::ArtifactKind::Image => "image",
            super::spec::ArtifactKind::Checkpoint => "checkpoint",
        },
    );
    c.str(2, &spec.artifact.id);
    c.str(3, &spec.artifact.sha256);
    c.str(4, &spec.artifact.architecture);
    c.str(5, &spec.profile.id);
    match &spec.action {
        Action::Command(cmd) => {
            c.str(6, "command");
            c.strs(7, &cmd.argv);
            c.env(8, &cmd.env);
            c.opt_str(9, cmd.workdir.as_deref());
            c.opt_str(10, cmd.stdin_b64.as_deref());
            if let Some(t) = cmd.timeout_s {
                c.u64(11, t);
            }
            if cmd.background {
                c.bool(12, true);
            }
        }
        Action::Terminal(t) => {
            c.str(6, "terminal");
            c.str(7, &t.program);
            c.u64(13, u64::from(t.cols));
            c.u64(14, u64::from(t.rows));
        }
    }
    if !spec.inputs.is_empty() {
        let mut inputs: Vec<_> = spec.inputs.iter().collect();
        inputs.sort_by(|a, b| a.path.cmp(&b.path));
        c.tag(15);
        c.count(inputs.len());
        for i in inputs {
            c.raw_str(&i.path);
            c.raw_str(&i.source);
            c.raw_str(&i.sha256);
            c.raw_u64(i.size);
        }
    }
    if !spec.outputs.is_empty() {
        let mut outputs: Vec<_> = spec.outputs.iter().collect();
        outputs.sort_by(|a, b| a.path.cmp(&b.path));
        c.tag(16);
        c.count(outputs.len());
        for o in outputs {
            c.raw_str(&o.path);
            c.raw_str(&o.destination);
            c.raw_u64(o.max_size);
        }
    }
    c.u64(17, spec.queue_budget_ms);
    c.u64(18, spec.retention_ms);
    if !spec.metadata.is_empty() {
        c.tag(19);
        c.count(spec.metadata.len());
        for (k, v) in &spec.metadata {
            c.raw_str(k);
            match v {
                MetaValue::String(s) => {
                    c.buf.push(b's');
                    c.raw_str(s);
                }
                MetaValue::Integer(i) => {
                    c.buf.push(b'i');
                    c.buf.extend_from_slice(&i.to_be_bytes());
                }
                MetaValue::Bool(b) => {
                    c.buf.push(b'b');
                    c.buf.push(u8::from(*b));
                }
                MetaValue::Null => c.buf.push(b'n'),
            }
        }
    }
    if let Some(n) = &spec.network {
        let mut allow = n.allow.clone();
        allow.sort();
        c.strs(20, &allow);
    }
    if let Some(g) = &spec.guest_paths {
        c.strs(21, &g.roots);
        c.strs(22, &g.workdir_roots);
    }
    c.opt_str(23, user);
    if let Some(w) = &spec.worker_machine {
        c.str(24, &w.worker_id);
        c.str(25, &w.name);
    }
    if let Action::Terminal(t) = &spec.action {
        // The terminal's bounds (C7.1), after every shared field. Only the
        // settings: the bytes a session carries are never part of an
        // identity.
        c.u64(26, t.session_ms);
        c.u64(27, t.idle_ms);
        c.u64(28, t.close_ms);
        c.u64(29, t.attach_ms);
        c.u64(30, t.buffer_bytes);
        c.u64(31, t.input_bytes);
    }
    c.buf
}

/// The fingerprint of an execution spec: for a disposable execution the
/// HMAC of its canonical encoding; for a managed command the HMAC over
/// `(command domain, machine handle, spec fingerprint)` (C12.5).
pub fn exec_fingerprint(key: &FingerprintKey, spec: &ExecutionSpec) -> String {
    let spec_fp = key.mac(&encode_exec_spec(spec));
    match &spec.machine {
        None => spec_fp,
        Some(machine) => command_fingerprint(key, machine, &spec_fp),
    }
}

/// The managed command fingerprint over the machine handle and a spec
/// fingerprint.
pub fn command_fingerprint(key: &FingerprintKey, machine: &RecordKey, spec_fp: &str) -> String {
    let mut c = Canon::new(DOMAIN_COMMAND);
    c.str(1, &machine.scope);
    c.str(2, &machine.id);
    c.str(3, spec_fp);
    key.mac(&c.buf)
}

/// The canonical encoding of a machine spec's base (artifact, profile,
/// network, guest paths).
pub fn encode_machine_base(spec: &RetainedMachineSpec) -> Vec<u8> {
    let mut c = Canon::new(DOMAIN_MACHINE_BASE);
    c.str(
        1,
        match spec.artifact.kind {
            super::spec::ArtifactKind::Image => "image",
            super::spec::ArtifactKind::Checkpoint => "checkpoint",
        },
    );
    c.str(2, &spec.artifact.id);
    c.str(3, &spec.artifact.sha256);
    c.str(4, &spec.artifact.architecture);
    c.str(5, &spec.profile.id);
    if let Some(n) = &spec.network {
        let mut allow = n.allow.clone();
        allow.sort();
        c.strs(20, &allow);
    }
    if let Some(g) = &spec.guest_paths {
        c.strs(21, &g.roots);
        c.strs(22, &g.workdir_roots);
    }
    c.buf
}

/// The machine fingerprint: ports, workload and the checkpointable flag
/// layered onto the base fingerprint (C12.5).
pub fn machine_fingerprint(key: &FingerprintKey, spec: &RetainedMachineSpec) -> String {
    let base = key.mac(&encode_machine_base(spec));
    let mut c = Canon::new(DOMAIN_MACHINE);
    c.str(1, &base);
    if !spec.ports.is_empty() {
        let mut ports = spec.ports.clone();
        ports.sort();
        c.tag(2);
        c.count(ports.len());
        for p in ports {
            c.raw_u64(u64::from(p.host));
            c.raw_u64(u64::from(p.guest));
        }
    }
    if let Some(w) = &spec.workload {
        c.strs(3, w);
    }
    if spec.checkpointable {
        c.bool(4, true);
    }
    key.mac(&c.buf)
}

/// Canonical byte writer.
struct Canon {
    buf: Vec<u8>,
    last_tag: u8,
}

impl Canon {
    fn new(domain: &str) -> Self {
        Self::with_version(domain, ENCODING_VERSION)
    }

    fn with_version(domain: &str, version: u8) -> Self {
        let mut c = Self {
            buf: Vec::with_capacity(256),
            last_tag: 0,
        };
        c.buf.extend_from_slice(b"smolbox.fp\0");
        c.buf.push(version);
        c.raw_str(domain);
        c
    }

    fn tag(&mut self, tag: u8) {
        debug_assert!(tag > self.last_tag, "canonical tags must increase");
        self.last_tag = tag;
        self.buf.push(tag);
    }

    fn count(&mut self, n: usize) {
        // Every list is bounded far below u32::MAX by spec validation.
        self.buf
            .extend_from_slice(&u32::try_from(n).unwrap_or(u32::MAX).to_be_bytes());
    }

    fn raw_str(&mut self, s: &str) {
        self.count(s.len());
        self.buf.extend_from_slice(s.as_bytes());
    }

    fn raw_u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_be_bytes());
    }

    fn str(&mut self, tag: u8, s: &str) {
        self.tag(tag);
        self.raw_str(s);
    }

    fn opt_str(&mut self, tag: u8, s: Option<&str>) {
        if let Some(s) = s {
            self.str(tag, s);
        }
    }

    fn u64(&mut self, tag: u8, v: u64) {
        self.tag(tag);
        self.raw_u64(v);
    }

    fn bool(&mut self, tag: u8, v: bool) {
        self.tag(tag);
        self.buf.push(u8::from(v));
    }

    fn strs(&mut self, tag: u8, items: &[String]) {
        self.tag(tag);
        self.count(items.len());
        for s in items {
            self.raw_str(s);
        }
    }

    fn env(&mut self, tag: u8, env: &std::collections::BTreeMap<String, String>) {
        if env.is_empty() {
            return;
        }
        self.tag(tag);
        self.count(env.len());
        for (k, v) in env {
            self.raw_str(k);
            self.raw_str(v);
        }
    }
}

/// Lowercase hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from(HEX[usize::from(b >> 4)]));
        s.push(char::from(HEX[usize::from(b & 15)]));
    }
    s
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code
    use super::*;

    /// The pre-keyed state gives the MAC of a key built for every message,
    /// for keys shorter than, equal to and longer than a SHA-256 block (a
    /// longer key is hashed first) and messages around the block size.
    #[test]
    fn the_pre_keyed_mac_is_the_hmac_of_the_key() {
        for len in [MIN_KEY_LEN, 63, 64, 65, 131, MAX_KEY_LEN] {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
            let key = FingerprintKey::new(&bytes).unwrap();
            for msg_len in [0_usize, 1, 55, 56, 63, 64, 65, 200, 1_000] {
                let msg: Vec<u8> = (0..msg_len).map(|i| (i * 13) as u8).collect();
                let mut fresh = <Hmac<Sha256> as Mac>::new_from_slice(&bytes).unwrap();
                fresh.update(&msg);
                assert_eq!(key.mac(&msg), hex(&fresh.finalize().into_bytes()));
                // The state is cloned, never used up: the same MAC again.
                assert_eq!(key.mac(&msg), key.mac(&msg));
            }
        }
    }

    /// RFC 4231 test cases 6 and 7 (a 131-byte key, hashed first).
    #[test]
    fn rfc_4231_vectors_with_a_key_longer_than_a_block() {
        let key = FingerprintKey::new(&[0xaa; 131]).unwrap();
        assert_eq!(
            key.mac(b"Test Using Larger Than Block-Size Key - Hash Key First"),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
        assert_eq!(
            key.mac(
                b"This is a test using a larger than block-size key and a larger than \
                  block-size data. The key needs to be hashed before being used by the \
                  HMAC algorithm."
            ),
            "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2"
        );
    }
}
