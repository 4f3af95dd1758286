//! [`DirArtifacts`]: the bundled directory artifact store (C6.5).
//!
//! Layout under the root (an existing absolute directory of mode 0700):
//!
//! ```text
//! <root>/inputs/<scope>/<reference>              an input's bytes
//! <root>/outputs/<scope>/<id>/<destination>      a collected output of record (scope, id)
//! ```
//!
//! Every name below the root is a C0.1 identifier (`[A-Za-z0-9]` first,
//! then `[A-Za-z0-9._:-]`, ≤ 128 bytes), checked before any file is
//! touched: no `/`, no `..`, no absolute path, no NUL can name a file
//! outside the root (`artifact_reference`). Directories are created with
//! mode 0700 and files with 0600; a symbolic link or a file of another
//! type anywhere below the root is refused (`artifact_not_regular`), and a
//! file is read only when the open file is the one the path's `lstat`
//! names (same device and inode).
//!
//! A file under a key appears whole or not at all: the bytes go to an
//! exclusive temporary file in the key's own directory (`.tmp-<random>`,
//! which no identifier can name), are fsynced, then installed by a hard
//! link under the key; the temporary name is removed and the directory
//! fsynced. The link fails when the key already exists, so the contract's
//! immutability needs no check-then-write race: the same digest again is
//! `Ok`, another is `identity_conflict` (`artifact_digest_conflict`) and
//! the original stays. A crash leaves at most a stale `.tmp-*` file, never
//! a partial file under a key.
//!
//! Sizes: every put and every read is bounded by the per-file limit (1 MiB
//! by default, 1 B–16 MiB, C6.3's "bundled directory artifact store per
//! file"), and a read also by the caller's `max`. A put's bytes must have
//! the digest given with them (`artifact_digest_mismatch`).

use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use bytes::Bytes;
use smolbox_core::managed::{RecordKey, check_identifier};
use smolbox_core::{Error, Evidence, Operation, Reason};

use super::{Artifacts, sha256_hex};

/// The default per-file limit (C6.3): 1 MiB.
pub const DEFAULT_PER_FILE: u64 = 1 << 20;
/// The largest per-file limit (C6.3): 16 MiB.
pub const MAX_PER_FILE: u64 = 16 << 20;

const INPUTS: &str = "inputs";
const OUTPUTS: &str = "outputs";

/// A directory-backed artifact store (see the module docs). `Debug` prints
/// the root and the limit, never bytes.
#[derive(Debug, Clone)]
pub struct DirArtifacts {
    root: PathBuf,
    per_file: u64,
}

fn io_error(op: Operation, _e: &std::io::Error) -> Error {
    // The OS error text may name paths; the reason code is enough.
    Error::store(op, Evidence::NotDispatched, Reason::ArtifactIo)
}

fn not_regular(op: Operation) -> Error {
    Error::validation(op, Reason::ArtifactNotRegular)
}

fn reference(op: Operation, name: &str) -> Result<(), Error> {
    check_identifier(name).map_err(|_| Error::validation(op, Reason::ArtifactReference))
}

fn over_per_file(op: Operation, actual: u64, max: u64) -> Error {
    Error::output_limit(op, Evidence::NotDispatched, Reason::ArtifactOverPerFile)
        .with_limit(actual, max)
}

/// Fsyncs directory `dir` (so a new entry in it survives a crash).
fn sync_dir(dir: &Path, op: Operation) -> Result<(), Error> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_error(op, &e))
}

impl DirArtifacts {
    /// The store at `root`: an existing absolute directory (not a symbolic
    /// link) of mode 0700 (no group or other bits); per-file limit 1 MiB.
    ///
    /// # Errors
    /// `validation` (`artifact_root`) otherwise; `store` (`artifact_io`)
    /// when it cannot be inspected.
    pub fn open(root: impl AsRef<Path>) -> Result<Self, Error> {
        let op = Operation::Config;
        let root = root.as_ref();
        let bad = || Error::validation(op, Reason::ArtifactRoot);
        if !root.is_absolute() {
            return Err(bad());
        }
        let meta = match fs::symlink_metadata(root) {
            Ok(m) => m,
            Err(e) if e.kind() == ErrorKind::NotFound => return Err(bad()),
            Err(e) => return Err(io_error(op, &e)),
        };
        if !meta.is_dir() || meta.mode() & 0o077 != 0 {
            return Err(bad());
        }
        Ok(Self {
            root: root.to_path_buf(),
            per_file: DEFAULT_PER_FILE,
        })
    }

    /// Creates `root` (and missing parents) with mode 0700 when absent,
    /// then [`DirArtifacts::open`]s it; an existing root keeps its mode
    /// (so a wider one is refused).
    ///
    /// # Errors
    /// As [`DirArtifacts::open`]; `store` (`artifact_io`) when it cannot
    /// be created.
    pub fn create(root: impl AsRef<Path>) -> Result<Self, Error> {
        let root = root.as_ref();
        if !root.is_absolute() {
            return Err(Error::validation(Operation::Config, Reason::ArtifactRoot));
        }
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(root)
            .map_err(|e| io_error(Operation::Config, &e))?;
        Self::open(root)
    }

    /// The same store with per-file limit `bytes` (1 B–16 MiB).
    ///
    /// # Errors
    /// `validation` (`artifact_per_file_out_of_range`, with the limit).
    pub fn per_file_max(mut self, bytes: u64) -> Result<Self, Error> {
        if !(1..=MAX_PER_FILE).contains(&bytes) {
            return Err(
                Error::validation(Operation::Config, Reason::ArtifactPerFileOutOfRange)
                    .with_limit(bytes, MAX_PER_FILE),
            );
        }
        self.per_file = bytes;
        Ok(self)
    }

    /// Removes the temporary files (`.tmp-*`) a crashed put left behind
    /// that are older than `max_age` by their modification time; the
    /// number removed. A put's own temporary file lives for the time of
    /// one write and fsync, so an age of minutes never touches one in use.
    /// Only the directories a put writes into are visited (`inputs/<scope>`
    /// and `outputs/<scope>/<id>`); symbolic links and other file types
    /// are left alone, and nothing but a `.tmp-*` regular file is removed.
    ///
    /// # Errors
    /// `store` (`artifact_io`) when a directory cannot be read or a stale
    /// file cannot be removed.
    pub fn sweep_stale(&self, max_age: std::time::Duration) -> Result<u64, Error> {
        let op = Operation::Config;
        let now = std::time::SystemTime::now();
        let mut removed = 0;
        // (directory, levels of subdirectories still to descend)
        let mut stack = vec![(self.root.join(INPUTS), 1u8), (self.root.join(OUTPUTS), 2)];
        while let Some((dir, depth)) = stack.pop() {
            let entries = match fs::read_dir(&dir) {
                Ok(e) => e,
                Err(e) if e.kind() == ErrorKind::NotFound => continue,
                Err(e) => return Err(io_error(op, &e)),
            };
            for entry in entries {
                let entry = entry.map_err(|e| io_error(op, &e))?;
                let meta = fs::symlink_metadata(entry.path()).map_err(|e| io_error(op, &e))?;
                let stale_temp = entry.file_name().to_string_lossy().starts_with(".tmp-")
                    && meta.file_type().is_file()
                    && meta
                        .modified()
                        .ok()
                        .and_then(|m| now.duration_since(m).ok())
                        .is_some_and(|age| age > max_age);
                if meta.is_dir() && depth > 0 {
                    stack.push((entry.path(), depth - 1));
                } else if stale_temp {
                    match fs::remove_file(entry.path()) {
                        Ok(()) => removed += 1,
                        Err(e) if e.kind() == ErrorKind::NotFound => {}
                        Err(e) => return Err(io_error(op, &e)),
                    }
                }
            }
        }
        Ok(removed)
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The per-file limit.
    pub const fn per_file(&self) -> u64 {
        self.per_file
    }

    /// The directory `root/parts…`, each part checked; created (mode 0700)
    /// when `create`, else `None` when a part is absent. A part that is a
    /// symbolic link or not a directory is refused.
    fn dir(&self, parts: &[&str], create: bool, op: Operation) -> Result<Option<PathBuf>, Error> {
        for p in parts {
            if *p != INPUTS && *p != OUTPUTS {
                reference(op, p)?;
            }
        }
        let mut dir = self.root.clone();
        for p in parts {
            let parent = dir.clone();
            dir.push(p);
            match fs::symlink_metadata(&dir) {
                Ok(m) if m.is_dir() => {}
                Ok(_) => return Err(not_regular(op)),
                Err(e) if e.kind() == ErrorKind::NotFound => {
                    if !create {
                        return Ok(None);
                    }
                    match fs::DirBuilder::new().mode(0o700).create(&dir) {
                        Ok(()) => sync_dir(&parent, op)?,
                        // Made meanwhile by another put: checked again.
                        Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                            let m = fs::symlink_metadata(&dir).map_err(|e| io_error(op, &e))?;
                            if !m.is_dir() {
                                return Err(not_regular(op));
                            }
                        }
                        Err(e) => return Err(io_error(op, &e)),
                    }
                }
                Err(e) => return Err(io_error(op, &e)),
            }
        }
        Ok(Some(dir))
    }

    /// The bytes of regular file `path` (at most `cap`; `Err` with the
    /// size seen past it), `None` when absent.
    fn read_file(
        path: &Path,
        cap: u64,
        op: Operation,
    ) -> Result<Option<Result<Bytes, u64>>, Error> {
        let link = match fs::symlink_metadata(path) {
            Ok(m) => m,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_error(op, &e)),
        };
        if !link.file_type().is_file() {
            return Err(not_regular(op));
        }
        if link.len() > cap {
            return Ok(Some(Err(link.len())));
        }
        let f = match File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_error(op, &e)),
        };
        let meta = f.metadata().map_err(|e| io_error(op, &e))?;
        // Swapped for a link (or another file) between the lstat and the
        // open: not the file the path names.
        if meta.dev() != link.dev() || meta.ino() != link.ino() || !meta.is_file() {
            return Err(not_regular(op));
        }
        let mut buf = Vec::with_capacity(usize::try_from(meta.len().min(cap)).unwrap_or(0));
        f.take(cap + 1)
            .read_to_end(&mut buf)
            .map_err(|e| io_error(op, &e))?;
        if buf.len() as u64 > cap {
            return Ok(Some(Err(buf.len() as u64)));
        }
        Ok(Some(Ok(Bytes::from(buf))))
    }

    /// Writes `bytes` to a fresh exclusive temporary file in `dir`,
    /// fsynced; its path.
    fn write_temp(dir: &Path, bytes: &[u8], op: Operation) -> Result<PathBuf, Error> {
        for _ in 0..8 {
            let mut random = [0u8; 12];
            getrandom::fill(&mut random)
                .map_err(|_| Error::store(op, Evidence::NotDispatched, Reason::NoRandomness))?;
            let tmp = dir.join(format!(
                ".tmp-{}",
                sha256_hex(&random).get(..24).unwrap_or("")
            ));
            let mut f = match OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&tmp)
            {
                Ok(f) => f,
                Err(e) if e.kind() == ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(io_error(op, &e)),
            };
            let written = f.write_all(bytes).and_then(|()| f.sync_all());
            if let Err(e) = written {
                let _ = fs::remove_file(&tmp);
                return Err(io_error(op, &e));
            }
            return Ok(tmp);
        }
        Err(Error::store(
            op,
            Evidence::NotDispatched,
            Reason::ArtifactIo,
        ))
    }

    /// Installs `bytes` (digest `sha256`, already checked) under `dir/name`
    /// once: an existing file with the same digest is `Ok`, another is
    /// `identity_conflict`.
    fn install(
        &self,
        dir: &Path,
        name: &str,
        bytes: &[u8],
        sha256: &str,
        op: Operation,
    ) -> Result<(), Error> {
        let path = dir.join(name);
        if let Some(r) = self.existing(&path, sha256, op)? {
            return r;
        }
        let tmp = Self::write_temp(dir, bytes, op)?;
        let linked = fs::hard_link(&tmp, &path);
        // The temporary name goes either way (a leftover is harmless).
        let _ = fs::remove_file(&tmp);
        match linked {
            Ok(()) => sync_dir(dir, op),
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                match self.existing(&path, sha256, op)? {
                    Some(r) => r,
                    None => Err(io_error(op, &e)),
                }
            }
            Err(e) => Err(io_error(op, &e)),
        }
    }

    /// What a put of `sha256` under the existing `path` means: `None` when
    /// nothing is there.
    fn existing(
        &self,
        path: &Path,
        sha256: &str,
        op: Operation,
    ) -> Result<Option<Result<(), Error>>, Error> {
        let conflict = || {
            Err(Error::identity_conflict(
                op,
                Evidence::NotDispatched,
                Reason::ArtifactDigestConflict,
            ))
        };
        Ok(match Self::read_file(path, self.per_file, op)? {
            None => None,
            Some(Ok(b)) if sha256_hex(&b) == sha256 => Some(Ok(())),
            Some(_) => Some(conflict()),
        })
    }

    /// Checks `bytes` against the limit and `sha256`.
    fn check_put(&self, bytes: &[u8], sha256: &str, op: Operation) -> Result<(), Error> {
        if bytes.len() as u64 > self.per_file {
            return Err(over_per_file(op, bytes.len() as u64, self.per_file));
        }
        if sha256_hex(bytes) != sha256 {
            return Err(Error::validation(op, Reason::ArtifactDigestMismatch));
        }
        Ok(())
    }

    /// Stores an input under `(scope, reference)` once (immutable, as a
    /// put: the same bytes again are `Ok`, other bytes `identity_conflict`)
    /// and returns its SHA-256 for the manifest.
    ///
    /// # Errors
    /// `validation` (`artifact_reference`, `artifact_not_regular`);
    /// `output_limit` (`artifact_over_per_file`) past the per-file limit;
    /// `identity_conflict` (`artifact_digest_conflict`); `store`
    /// (`artifact_io`).
    pub fn insert(&self, scope: &str, reference: &str, bytes: &[u8]) -> Result<String, Error> {
        let op = Operation::Upload;
        self::reference(op, reference)?;
        let sha256 = sha256_hex(bytes);
        self.check_put(bytes, &sha256, op)?;
        let dir = self
            .dir(&[INPUTS, scope], true, op)?
            .ok_or_else(|| Error::store(op, Evidence::NotDispatched, Reason::ArtifactIo))?;
        self.install(&dir, reference, bytes, &sha256, op)?;
        Ok(sha256)
    }

    /// Where a collected output of `key` under `destination` is (or would
    /// be) stored.
    ///
    /// # Errors
    /// `validation` (`artifact_reference`) for a name that is not an
    /// identifier.
    pub fn output_path(&self, key: &RecordKey, destination: &str) -> Result<PathBuf, Error> {
        let op = Operation::Download;
        for p in [key.scope.as_str(), key.id.as_str(), destination] {
            reference(op, p)?;
        }
        Ok(self
            .root
            .join(OUTPUTS)
            .join(&key.scope)
            .join(&key.id)
            .join(destination))
    }

    /// A collected output of `key` under `destination` with its digest
    /// (at most the per-file limit), `None` when none is stored.
    ///
    /// # Errors
    /// As [`Artifacts::read`].
    pub fn output(
        &self,
        key: &RecordKey,
        destination: &str,
    ) -> Result<Option<(String, Bytes)>, Error> {
        let op = Operation::Download;
        reference(op, destination)?;
        let Some(dir) = self.dir(&[OUTPUTS, &key.scope, &key.id], false, op)? else {
            return Ok(None);
        };
        match Self::read_file(&dir.join(destination), self.per_file, op)? {
            None => Ok(None),
            Some(Ok(b)) => Ok(Some((sha256_hex(&b), b))),
            Some(Err(n)) => Err(over_per_file(op, n, self.per_file)),
        }
    }
}

impl Artifacts for DirArtifacts {
    fn read(&self, scope: &str, reference: &str, max: u64) -> Result<Bytes, Error> {
        let op = Operation::Upload;
        self::reference(op, reference)?;
        let missing = || Error::not_found(op, Evidence::NotDispatched, Reason::ArtifactMissing);
        let Some(dir) = self.dir(&[INPUTS, scope], false, op)? else {
            return Err(missing());
        };
        let cap = max.min(self.per_file);
        match Self::read_file(&dir.join(reference), cap, op)? {
            None => Err(missing()),
            Some(Ok(b)) => Ok(b),
            Some(Err(n)) if n > max => {
                Err(
                    Error::output_limit(op, Evidence::NotDispatched, Reason::ArtifactReadSize)
                        .with_limit(n, max),
                )
            }
            Some(Err(n)) => Err(over_per_file(op, n, self.per_file)),
        }
    }

    fn put(
        &self,
        key: &RecordKey,
        destination: &str,
        bytes: Bytes,
        sha256: &str,
    ) -> Result<(), Error> {
        let op = Operation::Download;
        reference(op, destination)?;
        self.check_put(&bytes, sha256, op)?;
        let dir = self
            .dir(&[OUTPUTS, &key.scope, &key.id], true, op)?
            .ok_or_else(|| Error::store(op, Evidence::NotDispatched, Reason::ArtifactIo))?;
        self.install(&dir, destination, &bytes, sha256, op)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn store() -> (tempfile::TempDir, DirArtifacts) {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("art");
        (t, DirArtifacts::create(&root).unwrap())
    }

    fn key() -> RecordKey {
        RecordKey::new("cli", "run-1").unwrap()
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    /// A crash after the temporary file is written and before the link:
    /// nothing is visible under the key, a later put installs the bytes,
    /// and the stale temporary name is never read as a key.
    #[test]
    fn a_crash_before_the_link_leaves_nothing_under_the_key() {
        let (_t, a) = store();
        let dir = a
            .dir(&[OUTPUTS, "cli", "run-1"], true, Operation::Download)
            .unwrap()
            .unwrap();
        // The crashed put: its temporary file, half the bytes written.
        let tmp = DirArtifacts::write_temp(&dir, b"hal", Operation::Download).unwrap();
        assert!(
            tmp.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(".tmp-")
        );
        assert_eq!(a.output(&key(), "out").unwrap(), None);
        // The temporary name is not a key anyone can ask for.
        let name = tmp.file_name().unwrap().to_string_lossy().into_owned();
        assert_eq!(
            a.output(&key(), &name).unwrap_err().reason(),
            Reason::ArtifactReference
        );
        // The repeated put (recovery collects again) installs the whole file.
        let sha = sha256_hex(b"half-written");
        a.put(&key(), "out", Bytes::from_static(b"half-written"), &sha)
            .unwrap();
        let (d, b) = a.output(&key(), "out").unwrap().unwrap();
        assert_eq!((d.as_str(), &b[..]), (sha.as_str(), &b"half-written"[..]));
        // Only the stale temporary file and the key remain.
        assert_eq!(entries(&dir), vec![name, "out".to_owned()]);
    }

    /// The sweep removes a crashed put's temporary files older than the
    /// age given (in an input directory and an output directory), keeps a
    /// fresh one (a put in progress), the installed files, a `.tmp-` name
    /// that is a directory, and anything outside the put directories.
    #[test]
    fn the_sweep_removes_only_stale_temporary_files() {
        let (_t, a) = store();
        let hour = std::time::Duration::from_secs(3600);
        let old = std::time::SystemTime::now() - 2 * hour;
        let inputs = a
            .dir(&[INPUTS, "cli"], true, Operation::Upload)
            .unwrap()
            .unwrap();
        let outputs = a
            .dir(&[OUTPUTS, "cli", "run-1"], true, Operation::Download)
            .unwrap()
            .unwrap();
        let stale_in = DirArtifacts::write_temp(&inputs, b"x", Operation::Upload).unwrap();
        let stale_out = DirArtifacts::write_temp(&outputs, b"y", Operation::Download).unwrap();
        for p in [&stale_in, &stale_out] {
            File::options()
                .write(true)
                .open(p)
                .unwrap()
                .set_modified(old)
                .unwrap();
        }
        let fresh = DirArtifacts::write_temp(&outputs, b"z", Operation::Download).unwrap();
        a.insert("cli", "in0", b"kept").unwrap();
        fs::create_dir(outputs.join(".tmp-dir")).unwrap();
        // A stale temporary name at the root is no put's: left alone.
        let outside = a.root().join(".tmp-outside");
        fs::write(&outside, b"o").unwrap();
        File::options()
            .write(true)
            .open(&outside)
            .unwrap()
            .set_modified(old)
            .unwrap();
        assert_eq!(a.sweep_stale(hour).unwrap(), 2);
        assert!(!stale_in.exists() && !stale_out.exists());
        assert!(fresh.exists() && outside.exists() && outputs.join(".tmp-dir").is_dir());
        assert_eq!(&a.read("cli", "in0", 4).unwrap()[..], b"kept");
        // Nothing left to remove; an age past the fresh file's removes it.
        assert_eq!(a.sweep_stale(hour).unwrap(), 0);
        assert_eq!(a.sweep_stale(std::time::Duration::ZERO).unwrap(), 1);
        assert!(!fresh.exists());
    }

    /// A crash after the link and before the temporary name is removed:
    /// the key holds the whole file; the same put again is `Ok`.
    #[test]
    fn a_crash_after_the_link_leaves_the_whole_file() {
        let (_t, a) = store();
        let dir = a
            .dir(&[INPUTS, "cli"], true, Operation::Upload)
            .unwrap()
            .unwrap();
        let tmp = DirArtifacts::write_temp(&dir, b"whole", Operation::Upload).unwrap();
        fs::hard_link(&tmp, dir.join("in0")).unwrap();
        assert_eq!(&a.read("cli", "in0", 5).unwrap()[..], b"whole");
        assert_eq!(
            a.insert("cli", "in0", b"whole").unwrap(),
            sha256_hex(b"whole")
        );
        assert_eq!(
            a.insert("cli", "in0", b"other").unwrap_err().reason(),
            Reason::ArtifactDigestConflict
        );
    }

    /// A put never writes through the key's name: the installed file is a
    /// fresh inode, so a reader holding the old (absent) name sees nothing
    /// partial, and the temporary name is gone after a put.
    #[test]
    fn a_put_leaves_only_the_key() {
        let (_t, a) = store();
        let sha = sha256_hex(b"x");
        a.put(&key(), "out", Bytes::from_static(b"x"), &sha)
            .unwrap();
        let dir = a.root().join("outputs/cli/run-1");
        assert_eq!(entries(&dir), vec!["out".to_owned()]);
        let mode = fs::metadata(dir.join("out")).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let mode = fs::metadata(&dir).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o700);
    }
}
