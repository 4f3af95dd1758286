//! Encryption at rest (C18.4): AES-256-GCM over the record envelope.
//!
//! ```text
//! sealed v2 = 0x02 key_id(u32 BE) nonce(12) tag(16) ciphertext
//! ad v2     = "smolbox.record.v2" 0x00 kind key_id(u32 BE)
//!             str(partition) str(scope) str(id) version(u64 BE)
//! str       = len(u32 BE) bytes
//! ```
//!
//! The associated data binds the record kind (execution vs machine), the
//! key id, the partition, the scope, the id and the record version, so a
//! ciphertext moved to another row, or an older sealed payload of the same
//! row swapped back in, fails authentication, which is a `store` error and
//! never `not_found` (AC-18.4.1). After decryption the decoded record's own
//! identity and version are checked too. Nonces are 96 random bits from the
//! operating system.
//!
//! The key id reserves room for key rotation: this version seals with key
//! id [`KEY_ID`] and refuses any other. The first format (`0x01 nonce tag
//! ciphertext`, associated data without key id and version) is read only by
//! the adapters' one-time migration, which re-seals every row of a
//! partition in the current format (see [`Sealer::key_check`]); afterwards
//! a v1 payload is refused like any other tampering.

use core::fmt;
use smolbox_core::Evidence;
use smolbox_core::Reason;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use aes_gcm::aead::{AeadInPlace, KeyInit};
use aes_gcm::{Aes256Gcm, Nonce, Tag};
use smolbox_core::managed::envelope::{self, HEADER_LEN, MAX_PAYLOAD_LEN};
use smolbox_core::managed::{
    ExecutionRecord, FingerprintKey, MachineRecord, RecordKey, RecordKind,
};
use smolbox_core::{Error, Operation};

const SEALED_V1: u8 = 0x01;
/// First byte of the current sealed format.
pub(crate) const SEALED_V2: u8 = 0x02;
const NONCE_LEN: usize = 12;
const TAG_LEN: usize = 16;
const KEY_ID_LEN: usize = 4;
const AD_DOMAIN_V1: &[u8] = b"smolbox.record.v1\0";
const AD_DOMAIN_V2: &[u8] = b"smolbox.record.v2\0";
const KEY_CHECK_DOMAIN: &[u8] = b"smolbox.keycheck.v1\0";
const KEY_CHECK_PLAIN: &[u8] = b"smolbox key check";

/// The key id this version seals with (C18.4; reserved for rotation).
pub const KEY_ID: u32 = 1;

/// A 32-byte AES-256-GCM key, distinct from the fingerprint key. `Debug`
/// never prints it.
#[derive(Clone)]
pub struct EncryptionKey([u8; 32], String);

impl EncryptionKey {
    /// Wraps key bytes, refusing a key equal to the fingerprint key (C12.1).
    ///
    /// # Errors
    /// `validation` when the key equals the fingerprint key's bytes.
    pub fn new(bytes: [u8; 32], fingerprint_key: &FingerprintKey) -> Result<Self, Error> {
        if fingerprint_key.same_bytes(&bytes) {
            return Err(Error::validation(
                Operation::Encryption,
                Reason::KeyEqualsFingerprintKey,
            ));
        }
        Ok(Self(bytes, fingerprint_key.check_tag()))
    }
}

impl fmt::Debug for EncryptionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("EncryptionKey(<redacted>)")
    }
}

/// Seals and opens records of one partition.
#[derive(Clone)]
pub struct Sealer {
    cipher: Aes256Gcm,
    partition: String,
    /// What this process last sealed or opened, by record: reused when a
    /// row holds exactly those sealed bytes (see [`Decoded`]).
    decoded: Arc<Mutex<Decoded>>,
    /// [`FingerprintKey::check_tag`] of the fingerprint key paired with the
    /// encryption key: part of the key check.
    fingerprint_tag: String,
    /// Opens first-format (v1) payloads: only the migration's copy does.
    legacy: bool,
}

impl fmt::Debug for Sealer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sealer")
            .field("partition", &self.partition)
            .finish_non_exhaustive()
    }
}

impl Sealer {
    /// A sealer for `partition` (a namespace: 1–10 of `[a-z][a-z0-9]*`).
    ///
    /// # Errors
    /// `validation` for a bad partition name.
    pub fn new(key: &EncryptionKey, partition: &str) -> Result<Self, Error> {
        check_partition(partition)?;
        Ok(Self {
            cipher: Aes256Gcm::new(&key.0.into()),
            partition: partition.to_owned(),
            decoded: Arc::default(),
            fingerprint_tag: key.1.clone(),
            legacy: false,
        })
    }

    /// A copy that also opens first-format payloads (the migration's).
    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    pub(crate) fn with_legacy(&self) -> Self {
        // A cache of its own: nothing opened from a first-format payload is
        // ever served to the current-format sealer.
        Self {
            legacy: true,
            decoded: Arc::default(),
            ..self.clone()
        }
    }

    /// A fresh key-check value for this partition: a constant sealed under
    /// the key, stored beside the records so a store opened with a
    /// missing or replaced key file is refused instead of failing record by
    /// record (or silently starting over).
    ///
    /// # Errors
    /// `store` when no nonce is available.
    pub fn key_check(&self) -> Result<Vec<u8>, Error> {
        let ad = self.key_check_ad();
        self.seal_with(&ad, self.key_check_plain())
    }

    /// `KEY_CHECK_PLAIN`, NUL, the fingerprint key's check tag.
    fn key_check_plain(&self) -> Vec<u8> {
        let mut plain = KEY_CHECK_PLAIN.to_vec();
        plain.push(0);
        plain.extend_from_slice(self.fingerprint_tag.as_bytes());
        plain
    }

    /// Verifies a stored key-check value.
    ///
    /// # Errors
    /// `store` with reason `key_mismatch` when it was made with another key
    /// (or for another partition), `fingerprint_key_mismatch` when the
    /// encryption key matches but the fingerprint key paired with it is
    /// another, `unknown_key_id` for a key this version does not know. A
    /// check made before the fingerprint tag was part of it (the bare
    /// label) still passes: it says nothing about the fingerprint key.
    pub fn verify_key_check(&self, check: &[u8]) -> Result<(), Error> {
        let ad = self.key_check_ad();
        match self.open_v2(&ad, check) {
            Ok(plain) if plain == self.key_check_plain() || plain == KEY_CHECK_PLAIN => Ok(()),
            Ok(plain) if plain.starts_with(KEY_CHECK_PLAIN) => Err(Error::store(
                Operation::Encryption,
                Evidence::Unknown,
                Reason::FingerprintKeyMismatch,
            )),
            Err(e) if e.reason() == Reason::UnknownKeyId => Err(e),
            _ => Err(Error::store(
                Operation::Encryption,
                Evidence::Unknown,
                Reason::KeyMismatch,
            )),
        }
    }

    fn key_check_ad(&self) -> Vec<u8> {
        let mut ad = Vec::with_capacity(48);
        ad.extend_from_slice(KEY_CHECK_DOMAIN);
        ad.extend_from_slice(&KEY_ID.to_be_bytes());
        push_str(&mut ad, &self.partition);
        ad
    }

    /// The partition this sealer binds.
    pub fn partition(&self) -> &str {
        &self.partition
    }

    /// Encodes and seals an execution record, binding its version.
    ///
    /// # Errors
    /// `validation` for an invalid record; `store` when no nonce is available.
    pub fn seal_exec(&self, rec: &ExecutionRecord) -> Result<Vec<u8>, Error> {
        let plain = envelope::encode_exec(rec)?;
        self.seal(RecordKind::Execution, &rec.key, rec.version, plain)
    }

    /// As [`Sealer::seal_exec`] for a record the caller has just validated
    /// (a store's own write), remembering it for the next read of these
    /// bytes.
    #[cfg(any(feature = "postgres", test))]
    pub(crate) fn seal_exec_cached(&self, rec: &ExecutionRecord) -> Result<Vec<u8>, Error> {
        self.seal_exec_shared(rec).map(|(sealed, _)| sealed)
    }

    /// As [`Sealer::seal_exec_cached`], also handing out the one copy of
    /// the record the cache keeps (an adapter keeping it too shares it).
    #[cfg(any(feature = "sqlite", feature = "postgres", test))]
    pub(crate) fn seal_exec_shared(
        &self,
        rec: &ExecutionRecord,
    ) -> Result<(Vec<u8>, Arc<ExecutionRecord>), Error> {
        let plain = envelope::encode_exec_validated(rec)?;
        let sealed = self.seal(RecordKind::Execution, &rec.key, rec.version, plain)?;
        let shared = Arc::new(rec.clone());
        self.cache().put_exec(&sealed, Arc::clone(&shared));
        Ok((sealed, shared))
    }

    /// Encodes and seals a machine record, binding its revision (its write
    /// counter, [`MachineRecord::revision`]: a claim moves it, not the
    /// version).
    ///
    /// # Errors
    /// As [`Sealer::seal_exec`].
    pub fn seal_machine(&self, rec: &MachineRecord) -> Result<Vec<u8>, Error> {
        let plain = envelope::encode_machine(rec)?;
        self.seal(RecordKind::Machine, &rec.key, rec.revision(), plain)
    }

    /// As [`Sealer::seal_machine`] for a validated record, remembering it.
    #[cfg(any(feature = "postgres", test))]
    pub(crate) fn seal_machine_cached(&self, rec: &MachineRecord) -> Result<Vec<u8>, Error> {
        self.seal_machine_shared(rec).map(|(sealed, _)| sealed)
    }

    /// As [`Sealer::seal_exec_shared`] for a machine record.
    #[cfg(any(feature = "sqlite", feature = "postgres", test))]
    pub(crate) fn seal_machine_shared(
        &self,
        rec: &MachineRecord,
    ) -> Result<(Vec<u8>, Arc<MachineRecord>), Error> {
        let plain = envelope::encode_machine_validated(rec)?;
        let sealed = self.seal(RecordKind::Machine, &rec.key, rec.revision(), plain)?;
        let shared = Arc::new(rec.clone());
        self.cache().put_machine(&sealed, Arc::clone(&shared));
        Ok((sealed, shared))
    }

    /// Opens, decodes and checks an execution record stored at `key` whose
    /// row says it has `version`.
    ///
    /// # Errors
    /// `store` for any authentication, decoding, identity or version failure.
    pub fn open_exec(
        &self,
        key: &RecordKey,
        version: u64,
        sealed: &[u8],
    ) -> Result<ExecutionRecord, Error> {
        if let Some(rec) = self.cache().exec(key, version, sealed) {
            return Ok(rec);
        }
        let plain = self.open(RecordKind::Execution, key, version, sealed)?;
        let rec = envelope::decode_exec(&plain)?;
        check_identity(&rec.key, rec.version, key, version)?;
        self.cache().put_exec(sealed, Arc::new(rec.clone()));
        Ok(rec)
    }

    /// Opens, decodes and checks a machine record stored at `key` whose
    /// row says it has revision `version` ([`MachineRecord::revision`]).
    ///
    /// # Errors
    /// As [`Sealer::open_exec`].
    pub fn open_machine(
        &self,
        key: &RecordKey,
        version: u64,
        sealed: &[u8],
    ) -> Result<MachineRecord, Error> {
        if let Some(rec) = self.cache().machine(key, version, sealed) {
            return Ok(rec);
        }
        let plain = self.open(RecordKind::Machine, key, version, sealed)?;
        let rec = envelope::decode_machine(&plain)?;
        check_identity(&rec.key, rec.revision(), key, version)?;
        self.cache().put_machine(sealed, Arc::new(rec.clone()));
        Ok(rec)
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, Decoded> {
        // The cache holds only complete entries; a panic elsewhere cannot
        // leave one half-written.
        self.decoded.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Seals arbitrary envelope bytes for `kind` at `key` and `version`
    /// (imports, tools and tests that need a sealed row whose payload is not
    /// a valid record).
    ///
    /// # Errors
    /// `store` when no nonce is available.
    pub fn seal_bytes(
        &self,
        kind: RecordKind,
        key: &RecordKey,
        version: u64,
        plain: &[u8],
    ) -> Result<Vec<u8>, Error> {
        self.seal(kind, key, version, plain.to_vec())
    }

    fn seal(
        &self,
        kind: RecordKind,
        key: &RecordKey,
        version: u64,
        plain: Vec<u8>,
    ) -> Result<Vec<u8>, Error> {
        let ad = self.associated_data(kind, key, version);
        self.seal_with(&ad, plain)
    }

    fn seal_with(&self, ad: &[u8], mut plain: Vec<u8>) -> Result<Vec<u8>, Error> {
        let mut nonce = [0u8; NONCE_LEN];
        getrandom::fill(&mut nonce).map_err(|_| {
            Error::store(
                Operation::Encryption,
                Evidence::Unknown,
                Reason::NoRandomness,
            )
        })?;
        let tag = self
            .cipher
            .encrypt_in_place_detached(Nonce::from_slice(&nonce), ad, &mut plain)
            .map_err(|_| Error::store(Operation::Encryption, Evidence::Unknown, Reason::Seal))?;
        let mut out = Vec::with_capacity(1 + KEY_ID_LEN + NONCE_LEN + TAG_LEN + plain.len());
        out.push(SEALED_V2);
        out.extend_from_slice(&KEY_ID.to_be_bytes());
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&tag);
        out.extend_from_slice(&plain);
        Ok(out)
    }

    fn open(
        &self,
        kind: RecordKind,
        key: &RecordKey,
        version: u64,
        sealed: &[u8],
    ) -> Result<Vec<u8>, Error> {
        match sealed.first() {
            Some(&SEALED_V2) => self.open_v2(&self.associated_data(kind, key, version), sealed),
            Some(&SEALED_V1) if self.legacy => self.open_v1(kind, key, sealed),
            Some(&SEALED_V1) => Err(Error::store(
                Operation::Encryption,
                Evidence::Unknown,
                Reason::LegacySealedVersion,
            )),
            _ => Err(Error::store(
                Operation::Encryption,
                Evidence::Unknown,
                Reason::UnknownSealedVersion,
            )),
        }
    }

    fn open_v2(&self, ad: &[u8], sealed: &[u8]) -> Result<Vec<u8>, Error> {
        let head = 1 + KEY_ID_LEN + NONCE_LEN + TAG_LEN;
        if sealed.len() < head || sealed.len() > head + HEADER_LEN + MAX_PAYLOAD_LEN {
            return Err(Error::store(
                Operation::Encryption,
                Evidence::Unknown,
                Reason::SealedLength,
            ));
        }
        if sealed[0] != SEALED_V2 {
            return Err(Error::store(
                Operation::Encryption,
                Evidence::Unknown,
                Reason::UnknownSealedVersion,
            ));
        }
        let key_id = u32::from_be_bytes([sealed[1], sealed[2], sealed[3], sealed[4]]);
        if key_id != KEY_ID {
            return Err(Error::store(
                Operation::Encryption,
                Evidence::Unknown,
                Reason::UnknownKeyId,
            ));
        }
        let n = 1 + KEY_ID_LEN;
        let nonce = Nonce::from_slice(&sealed[n..n + NONCE_LEN]);
        let tag = Tag::from_slice(&sealed[n + NONCE_LEN..head]);
        let mut plain = sealed[head..].to_vec();
        self.cipher
            .decrypt_in_place_detached(nonce, ad, &mut plain, tag)
            .map_err(|_| {
                Error::store(
                    Operation::Encryption,
                    Evidence::Unknown,
                    Reason::AuthenticationFailed,
                )
            })?;
        Ok(plain)
    }

    /// The first format, read only while migrating.
    fn open_v1(&self, kind: RecordKind, key: &RecordKey, sealed: &[u8]) -> Result<Vec<u8>, Error> {
        let head = 1 + NONCE_LEN + TAG_LEN;
        if sealed.len() < head || sealed.len() > head + HEADER_LEN + MAX_PAYLOAD_LEN {
            return Err(Error::store(
                Operation::Encryption,
                Evidence::Unknown,
                Reason::SealedLength,
            ));
        }
        let nonce = Nonce::from_slice(&sealed[1..1 + NONCE_LEN]);
        let tag = Tag::from_slice(&sealed[1 + NONCE_LEN..head]);
        let mut plain = sealed[head..].to_vec();
        let mut ad = Vec::with_capacity(64);
        ad.extend_from_slice(AD_DOMAIN_V1);
        ad.push(kind.tag());
        for part in [self.partition.as_str(), &key.scope, &key.id] {
            push_str(&mut ad, part);
        }
        self.cipher
            .decrypt_in_place_detached(nonce, &ad, &mut plain, tag)
            .map_err(|_| {
                Error::store(
                    Operation::Encryption,
                    Evidence::Unknown,
                    Reason::AuthenticationFailed,
                )
            })?;
        Ok(plain)
    }

    fn associated_data(&self, kind: RecordKind, key: &RecordKey, version: u64) -> Vec<u8> {
        let mut ad = Vec::with_capacity(80);
        ad.extend_from_slice(AD_DOMAIN_V2);
        ad.push(kind.tag());
        ad.extend_from_slice(&KEY_ID.to_be_bytes());
        for part in [self.partition.as_str(), &key.scope, &key.id] {
            push_str(&mut ad, part);
        }
        ad.extend_from_slice(&version.to_be_bytes());
        ad
    }
}

/// Most records the decoded cache of one sealer holds (per kind).
const CACHE_ENTRIES: usize = 256;

/// The records this process last sealed or opened, each with the exact
/// sealed bytes it was sealed to or opened from. A row holding exactly those
/// bytes (at the same version) decrypts, by construction, to exactly that
/// record, already authenticated and validated, so reading it back needs no
/// decryption, decoding or validation (issue 16: a write validates once).
/// Any other bytes (another process's write, a rolled-back transaction, a
/// tampered row) miss and take the full path. Bounded: when full it is
/// emptied.
#[derive(Default)]
struct Decoded {
    execs: HashMap<RecordKey, (Vec<u8>, Arc<ExecutionRecord>)>,
    machines: HashMap<RecordKey, (Vec<u8>, Arc<MachineRecord>)>,
}

impl Decoded {
    fn exec(&self, key: &RecordKey, version: u64, sealed: &[u8]) -> Option<ExecutionRecord> {
        match self.execs.get(key) {
            Some((bytes, rec)) if rec.version == version && bytes == sealed => {
                Some(ExecutionRecord::clone(rec))
            }
            _ => None,
        }
    }

    fn machine(&self, key: &RecordKey, version: u64, sealed: &[u8]) -> Option<MachineRecord> {
        match self.machines.get(key) {
            Some((bytes, rec)) if rec.revision() == version && bytes == sealed => {
                Some(MachineRecord::clone(rec))
            }
            _ => None,
        }
    }

    fn put_exec(&mut self, sealed: &[u8], rec: Arc<ExecutionRecord>) {
        if self.execs.len() >= CACHE_ENTRIES && !self.execs.contains_key(&rec.key) {
            self.execs.clear();
        }
        self.execs.insert(rec.key.clone(), (sealed.to_vec(), rec));
    }

    fn put_machine(&mut self, sealed: &[u8], rec: Arc<MachineRecord>) {
        if self.machines.len() >= CACHE_ENTRIES && !self.machines.contains_key(&rec.key) {
            self.machines.clear();
        }
        self.machines
            .insert(rec.key.clone(), (sealed.to_vec(), rec));
    }
}

/// Appends `len(u32 BE) bytes` (parts are identifiers of at most 128 bytes).
fn push_str(ad: &mut Vec<u8>, part: &str) {
    ad.extend_from_slice(&u32::try_from(part.len()).unwrap_or(u32::MAX).to_be_bytes());
    ad.extend_from_slice(part.as_bytes());
}

/// The decoded record must be the one its row names. A first-format row
/// (migration only) has no bound version; its decoded version must still
/// match the row's.
fn check_identity(
    got: &RecordKey,
    got_version: u64,
    key: &RecordKey,
    version: u64,
) -> Result<(), Error> {
    if got != key {
        return Err(Error::store(
            Operation::Encryption,
            Evidence::Unknown,
            Reason::IdentityMismatch,
        ));
    }
    if got_version != version {
        return Err(Error::store(
            Operation::Encryption,
            Evidence::Unknown,
            Reason::VersionMismatch,
        ));
    }
    Ok(())
}

/// Checks a partition (namespace) name: 1–10 of `^[a-z][a-z0-9]*$` (C12.1).
///
/// # Errors
/// `validation` with reason `partition`.
pub(crate) fn check_partition(p: &str) -> Result<(), Error> {
    let b = p.as_bytes();
    let ok = (1..=10).contains(&b.len())
        && b[0].is_ascii_lowercase()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    if ok {
        Ok(())
    } else {
        Err(Error::validation(Operation::Config, Reason::Partition))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use smolbox_core::Category;
    use smolbox_core::managed::testkit::{accepted, exec_spec, fingerprint_key, key};

    fn sealer() -> Sealer {
        let k = EncryptionKey::new([3; 32], &fingerprint_key()).unwrap();
        Sealer::new(&k, "test").unwrap()
    }

    #[test]
    fn the_key_check_binds_the_fingerprint_key_and_accepts_the_bare_label() {
        let s = sealer();
        let check = s.key_check().unwrap();
        s.verify_key_check(&check).unwrap();
        // The same encryption key paired with another fingerprint key.
        let other_fp = FingerprintKey::new(&[0x55; 32]).unwrap();
        let k = EncryptionKey::new([3; 32], &other_fp).unwrap();
        let t = Sealer::new(&k, "test").unwrap();
        let e = t.verify_key_check(&check).unwrap_err();
        assert_eq!(
            (e.category(), e.reason()),
            (Category::Store, Reason::FingerprintKeyMismatch)
        );
        // Another encryption key.
        let k = EncryptionKey::new([4; 32], &fingerprint_key()).unwrap();
        let e = Sealer::new(&k, "test")
            .unwrap()
            .verify_key_check(&check)
            .unwrap_err();
        assert_eq!(e.reason(), Reason::KeyMismatch);
        // A check of the first layout-2 form (the bare label) still opens.
        let bare = s
            .seal_with(&s.key_check_ad(), KEY_CHECK_PLAIN.to_vec())
            .unwrap();
        s.verify_key_check(&bare).unwrap();
        t.verify_key_check(&bare).unwrap();
        // The tag never reveals the key bytes.
        assert!(!format!("{:?}", s).contains(&fingerprint_key().check_tag()));
    }

    #[test]
    fn the_decoded_cache_serves_only_the_exact_bytes_at_the_bound_version() {
        let s = sealer();
        let rec = accepted(key("s", "a"), exec_spec("x"), 1);
        let sealed = s.seal_exec_cached(&rec).unwrap();
        assert_eq!(s.open_exec(&rec.key, 1, &sealed).unwrap(), rec);
        // The same bytes under another version: refused as the cipher would.
        let e = s.open_exec(&rec.key, 2, &sealed).unwrap_err();
        assert_eq!(
            (e.category(), e.reason()),
            (Category::Store, Reason::AuthenticationFailed)
        );
        // Other bytes for the cached key take the full path.
        let mut tampered = sealed.clone();
        let last = tampered.len() - 1;
        tampered[last] ^= 1;
        assert_eq!(
            s.open_exec(&rec.key, 1, &tampered).unwrap_err().reason(),
            Reason::AuthenticationFailed
        );
        // A sealer without the cache entry reads the same bytes the same way.
        let fresh = sealer();
        assert_eq!(fresh.open_exec(&rec.key, 1, &sealed).unwrap(), rec);
        // Another key's bytes never answer for this key.
        let other = accepted(key("s", "b"), exec_spec("x"), 1);
        let other_sealed = s.seal_exec_cached(&other).unwrap();
        assert_eq!(
            s.open_exec(&rec.key, 1, &other_sealed)
                .unwrap_err()
                .reason(),
            Reason::AuthenticationFailed
        );
    }

    #[test]
    fn the_decoded_cache_is_bounded() {
        let s = sealer();
        for i in 0..(CACHE_ENTRIES + 10) {
            let rec = accepted(key("s", &format!("r{i}")), exec_spec("x"), 1);
            s.seal_exec_cached(&rec).unwrap();
        }
        assert!(s.cache().execs.len() <= CACHE_ENTRIES);
    }
}
