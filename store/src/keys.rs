//! Key files for a local store: the fingerprint key and the encryption key
//! of a database, each 32 random bytes in a mode-0600 file next to it.
//!
//! A key is created only for a database that does not exist yet: when the
//! database file is there and a key file is not, the key is refused
//! (`key_missing`) instead of silently starting over with a new key (whose
//! records would all be unreadable, and whose fingerprints would no longer
//! match). A replaced key file is caught by the database's key-check value
//! when the store opens (`key_mismatch`).

use smolbox_core::Reason;
use std::fs::{self, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use smolbox_core::managed::FingerprintKey;
use smolbox_core::{Error, Evidence, Operation};

use crate::EncryptionKey;

/// The fingerprint key and the store encryption key of the database at
/// `db_path`, loaded from (or created as) two 32-byte files with mode 0600
/// next to it: `<db>.fingerprint-key` and `<db>.seal-key`.
///
/// # Errors
/// `store` when a key file cannot be read or created, or is missing beside
/// an existing database (`key_missing`); `validation` when it has the wrong
/// length or is readable by group or others.
pub fn load_or_create_keys(db_path: &Path) -> Result<(FingerprintKey, EncryptionKey), Error> {
    let fp_path = sibling(db_path, "fingerprint-key");
    let seal_path = sibling(db_path, "seal-key");
    let db_exists = fs::metadata(db_path).is_ok_and(|m| m.len() > 0);
    if db_exists && !(fp_path.exists() && seal_path.exists()) {
        return Err(key_error(Reason::KeyMissing));
    }
    let fp = key_file(&fp_path)?;
    let seal = key_file(&seal_path)?;
    let fingerprint_key = FingerprintKey::new(&fp)?;
    let encryption_key = EncryptionKey::new(seal, &fingerprint_key)?;
    Ok((fingerprint_key, encryption_key))
}

/// Loads a 32-byte key file, or creates it with mode 0600.
///
/// Creation is atomic: the key is written and synced to a private
/// temporary file that is then hard-linked into place, so a concurrent
/// process either links its own key first or reads the complete file that
/// won (never a half-written one).
///
/// # Errors
/// `store` on I/O failure; `validation` for a wrong length or loose
/// permissions.
pub fn key_file(path: &Path) -> Result<[u8; 32], Error> {
    if !path.exists() {
        let mut key = [0u8; 32];
        getrandom::fill(&mut key).map_err(|_| key_error(Reason::KeyRandom))?;
        let mut nonce = [0u8; 8];
        getrandom::fill(&mut nonce).map_err(|_| key_error(Reason::KeyRandom))?;
        let tmp = sibling(path, &format!("tmp-{:016x}", u64::from_le_bytes(nonce)));
        let written = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .and_then(|mut f| f.write_all(&key).and_then(|()| f.sync_all()));
        if written.is_err() {
            let _ = fs::remove_file(&tmp);
            return Err(key_error(Reason::KeyWrite));
        }
        let linked = fs::hard_link(&tmp, path);
        let _ = fs::remove_file(&tmp);
        match linked {
            // The new directory entry must survive a crash too.
            Ok(()) => {
                sync_parent(path)?;
                return Ok(key);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {} // lost the race
            Err(_) => return Err(key_error(Reason::KeyCreate)),
        }
    }
    let meta = fs::metadata(path).map_err(|_| key_error(Reason::KeyRead))?;
    if meta.permissions().mode() & 0o077 != 0 {
        return Err(key_error(Reason::KeyPermissions));
    }
    let mut bytes = Vec::with_capacity(33);
    fs::File::open(path)
        .and_then(|f| f.take(33).read_to_end(&mut bytes))
        .map_err(|_| key_error(Reason::KeyRead))?;
    if bytes.len() != 32 {
        return Err(key_error(Reason::KeyLength).with_limit(bytes.len() as u64, 32));
    }
    let mut key = [0u8; 32];
    key.copy_from_slice(&bytes);
    Ok(key)
}

/// Fsyncs the directory holding `path` (its new entry is durable after).
fn sync_parent(path: &Path) -> Result<(), Error> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|_| key_error(Reason::KeySync))
}

fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".");
    name.push(suffix);
    path.with_file_name(name)
}

fn key_error(reason: Reason) -> Error {
    match reason {
        Reason::KeyPermissions | Reason::KeyLength => {
            Error::validation(Operation::Encryption, reason)
        }
        _ => Error::store(Operation::Encryption, Evidence::NotDispatched, reason),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use smolbox_core::Category;

    #[test]
    fn concurrent_creators_agree_on_one_complete_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k");
        let keys: Vec<[u8; 32]> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8).map(|_| s.spawn(|| key_file(&path))).collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap().unwrap())
                .collect()
        });
        assert!(keys.iter().all(|k| *k == keys[0]));
        assert_eq!(fs::read(&path).unwrap(), keys[0]);
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        // No temporary file is left behind.
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_missing_key_beside_an_existing_database_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("s.db");
        // A fresh database gets new keys.
        load_or_create_keys(&db).unwrap();
        let seal = fs::read(dir.path().join("s.db.seal-key")).unwrap();
        fs::write(&db, b"records").unwrap();
        // The same keys come back.
        load_or_create_keys(&db).unwrap();
        assert_eq!(fs::read(dir.path().join("s.db.seal-key")).unwrap(), seal);
        for lost in ["s.db.seal-key", "s.db.fingerprint-key"] {
            let p = dir.path().join(lost);
            let saved = fs::read(&p).unwrap();
            fs::remove_file(&p).unwrap();
            let e = load_or_create_keys(&db).unwrap_err();
            assert_eq!(
                (e.category(), e.reason()),
                (Category::Store, Reason::KeyMissing)
            );
            assert!(!p.exists(), "no new key was created");
            let mut f = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&p)
                .unwrap();
            f.write_all(&saved).unwrap();
        }
        assert!(load_or_create_keys(&db).is_ok());
    }
}
