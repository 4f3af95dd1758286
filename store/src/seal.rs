//! Encryption at rest (C18.4): AES-256-GCM over the record envelope.
//!
//! ```text
//! sealed = 0x01 nonce(12) tag(16) ciphertext      (plaintext <= 16 MiB + header)
//! ad     = "smolbox.record.v1" 0x00 kind str(partition) str(scope) str(id)
//! str    = len(u32 BE) bytes
//! ```
//!
//! The associated data binds the record kind (execution vs machine), the
//! partition, the scope and the id, so a ciphertext moved to another row
//! fails authentication, which is a `store` error and never `not_found`
//! (AC-18.4.1). After decryption the decoded record's own identity is
//! checked too. Nonces are 96 random bits from the operating system.

use core::fmt;

use aes_gcm::aead::{AeadInPlace, KeyInit};
use aes_gcm::{Aes256Gcm, Nonce, Tag};
use smolbox_core::managed::envelope::{self, HEADER_LEN, MAX_PAYLOAD_LEN};
use smolbox_core::managed::{
    ExecutionRecord, FingerprintKey, MachineRecord, RecordKey, RecordKind,
};
use smolbox_core::{Error, Operation};

use crate::store_error;

const SEALED_VERSION: u8 = 0x01;
const NONCE_LEN: usize = 12;
const TAG_LEN: usize = 16;
const AD_DOMAIN: &[u8] = b"smolbox.record.v1\0";

/// A 32-byte AES-256-GCM key, distinct from the fingerprint key. `Debug`
/// never prints it.
#[derive(Clone)]
pub struct EncryptionKey([u8; 32]);

impl EncryptionKey {
    /// Wraps key bytes, refusing a key equal to the fingerprint key (C12.1).
    ///
    /// # Errors
    /// `validation` when the key equals the fingerprint key's bytes.
    pub fn new(bytes: [u8; 32], fingerprint_key: &FingerprintKey) -> Result<Self, Error> {
        if fingerprint_key.same_bytes(&bytes) {
            return Err(Error::validation(
                Operation::Encryption,
                "key_equals_fingerprint_key",
            ));
        }
        Ok(Self(bytes))
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
        })
    }

    /// The partition this sealer binds.
    pub fn partition(&self) -> &str {
        &self.partition
    }

    /// Encodes and seals an execution record.
    ///
    /// # Errors
    /// `validation` for an invalid record; `store` when no nonce is available.
    pub fn seal_exec(&self, rec: &ExecutionRecord) -> Result<Vec<u8>, Error> {
        let plain = envelope::encode_exec(rec)?;
        self.seal(RecordKind::Execution, &rec.key, plain)
    }

    /// Encodes and seals a machine record.
    ///
    /// # Errors
    /// As [`Sealer::seal_exec`].
    pub fn seal_machine(&self, rec: &MachineRecord) -> Result<Vec<u8>, Error> {
        let plain = envelope::encode_machine(rec)?;
        self.seal(RecordKind::Machine, &rec.key, plain)
    }

    /// Opens, decodes and identity-checks an execution record stored at `key`.
    ///
    /// # Errors
    /// `store` for any authentication, decoding or identity failure.
    pub fn open_exec(&self, key: &RecordKey, sealed: &[u8]) -> Result<ExecutionRecord, Error> {
        let plain = self.open(RecordKind::Execution, key, sealed)?;
        let rec = envelope::decode_exec(&plain)?;
        if rec.key != *key {
            return Err(store_error(Operation::Encryption, "identity_mismatch"));
        }
        Ok(rec)
    }

    /// Opens, decodes and identity-checks a machine record stored at `key`.
    ///
    /// # Errors
    /// As [`Sealer::open_exec`].
    pub fn open_machine(&self, key: &RecordKey, sealed: &[u8]) -> Result<MachineRecord, Error> {
        let plain = self.open(RecordKind::Machine, key, sealed)?;
        let rec = envelope::decode_machine(&plain)?;
        if rec.key != *key {
            return Err(store_error(Operation::Encryption, "identity_mismatch"));
        }
        Ok(rec)
    }

    /// Seals arbitrary envelope bytes for `kind` at `key` (imports, tools
    /// and tests that need a sealed row whose payload is not a valid record).
    ///
    /// # Errors
    /// `store` when no nonce is available.
    pub fn seal_bytes(
        &self,
        kind: RecordKind,
        key: &RecordKey,
        plain: &[u8],
    ) -> Result<Vec<u8>, Error> {
        self.seal(kind, key, plain.to_vec())
    }

    fn seal(
        &self,
        kind: RecordKind,
        key: &RecordKey,
        mut plain: Vec<u8>,
    ) -> Result<Vec<u8>, Error> {
        let mut nonce = [0u8; NONCE_LEN];
        getrandom::fill(&mut nonce)
            .map_err(|_| store_error(Operation::Encryption, "no_randomness"))?;
        let ad = self.associated_data(kind, key);
        let tag = self
            .cipher
            .encrypt_in_place_detached(Nonce::from_slice(&nonce), &ad, &mut plain)
            .map_err(|_| store_error(Operation::Encryption, "seal"))?;
        let mut out = Vec::with_capacity(1 + NONCE_LEN + TAG_LEN + plain.len());
        out.push(SEALED_VERSION);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&tag);
        out.extend_from_slice(&plain);
        Ok(out)
    }

    fn open(&self, kind: RecordKind, key: &RecordKey, sealed: &[u8]) -> Result<Vec<u8>, Error> {
        let head = 1 + NONCE_LEN + TAG_LEN;
        if sealed.len() < head || sealed.len() > head + HEADER_LEN + MAX_PAYLOAD_LEN {
            return Err(store_error(Operation::Encryption, "sealed_length"));
        }
        if sealed[0] != SEALED_VERSION {
            return Err(store_error(Operation::Encryption, "unknown_sealed_version"));
        }
        let nonce = Nonce::from_slice(&sealed[1..1 + NONCE_LEN]);
        let tag = Tag::from_slice(&sealed[1 + NONCE_LEN..head]);
        let mut plain = sealed[head..].to_vec();
        let ad = self.associated_data(kind, key);
        self.cipher
            .decrypt_in_place_detached(nonce, &ad, &mut plain, tag)
            .map_err(|_| store_error(Operation::Encryption, "authentication_failed"))?;
        Ok(plain)
    }

    fn associated_data(&self, kind: RecordKind, key: &RecordKey) -> Vec<u8> {
        let mut ad = Vec::with_capacity(64);
        ad.extend_from_slice(AD_DOMAIN);
        ad.push(kind.tag());
        for part in [self.partition.as_str(), &key.scope, &key.id] {
            // Parts are identifiers of at most 128 bytes.
            ad.extend_from_slice(&u32::try_from(part.len()).unwrap_or(u32::MAX).to_be_bytes());
            ad.extend_from_slice(part.as_bytes());
        }
        ad
    }
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
        Err(Error::validation(Operation::Config, "partition"))
    }
}
