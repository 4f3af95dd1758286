//! The artifact-store contract (C6.5), written once and run over both
//! stores (`MemoryArtifacts`, `DirArtifacts`), then the directory store's
//! own rules: the per-file limit at N and N + 1, names that would leave
//! the root, symbolic links, the root's mode.

#![allow(clippy::unwrap_used)]

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use bytes::Bytes;
use smolbox_core::managed::RecordKey;
use smolbox_core::{Category, Reason};
use smolbox_store::artifacts::dir::{DEFAULT_PER_FILE, MAX_PER_FILE};
use smolbox_store::artifacts::{Artifacts, DirArtifacts, MemoryArtifacts, sha256_hex};

/// What the contract tests need beyond the trait: putting an input and
/// reading an output back.
trait Fixture: Artifacts {
    fn put_input(&self, scope: &str, reference: &str, bytes: &[u8]) -> String;
    fn get_output(&self, key: &RecordKey, destination: &str) -> Option<(String, Bytes)>;
}

impl Fixture for MemoryArtifacts {
    fn put_input(&self, scope: &str, reference: &str, bytes: &[u8]) -> String {
        self.insert(scope, reference, bytes.to_vec())
    }
    fn get_output(&self, key: &RecordKey, destination: &str) -> Option<(String, Bytes)> {
        self.output(key, destination)
    }
}

impl Fixture for DirArtifacts {
    fn put_input(&self, scope: &str, reference: &str, bytes: &[u8]) -> String {
        self.insert(scope, reference, bytes).unwrap()
    }
    fn get_output(&self, key: &RecordKey, destination: &str) -> Option<(String, Bytes)> {
        self.output(key, destination).unwrap()
    }
}

fn key() -> RecordKey {
    RecordKey::new("cli", "run-1").unwrap()
}

fn contract(a: &dyn Fixture) {
    // An input is read back exactly; `max` is enforced at N and N - 1.
    let sha = a.put_input("cli", "in0", b"hello");
    assert_eq!(sha, sha256_hex(b"hello"));
    assert_eq!(&a.read("cli", "in0", 5).unwrap()[..], b"hello");
    assert_eq!(&a.read("cli", "in0", 6).unwrap()[..], b"hello");
    let e = a.read("cli", "in0", 4).unwrap_err();
    assert_eq!(
        (e.category(), e.reason()),
        (Category::OutputLimit, Reason::ArtifactReadSize)
    );
    // Nothing under a reference (or a scope) is `not_found`.
    for (scope, r) in [("cli", "nope"), ("other", "in0")] {
        let e = a.read(scope, r, 10).unwrap_err();
        assert_eq!(
            (e.category(), e.reason()),
            (Category::NotFound, Reason::ArtifactMissing)
        );
    }
    // A put is immutable per (key, destination).
    let one = sha256_hex(b"one");
    a.put(&key(), "out", Bytes::from_static(b"one"), &one)
        .unwrap();
    a.put(&key(), "out", Bytes::from_static(b"one"), &one)
        .unwrap();
    let two = sha256_hex(b"two");
    let e = a
        .put(&key(), "out", Bytes::from_static(b"two"), &two)
        .unwrap_err();
    assert_eq!(
        (e.category(), e.reason()),
        (Category::IdentityConflict, Reason::ArtifactDigestConflict)
    );
    assert_eq!(
        a.get_output(&key(), "out"),
        Some((one.clone(), Bytes::from_static(b"one")))
    );
    // Another destination, another record: separate.
    let other = RecordKey::new("cli", "run-2").unwrap();
    a.put(&other, "out", Bytes::from_static(b"two"), &two)
        .unwrap();
    assert_eq!(a.get_output(&other, "out").unwrap().0, two);
    assert_eq!(a.get_output(&key(), "out").unwrap().0, one);
    assert_eq!(a.get_output(&key(), "absent"), None);
    // An empty file is a file.
    let empty = sha256_hex(b"");
    a.put(&key(), "empty", Bytes::new(), &empty).unwrap();
    assert_eq!(a.get_output(&key(), "empty").unwrap().1.len(), 0);
}

#[test]
fn memory_artifacts_keep_the_contract() {
    contract(&MemoryArtifacts::new());
}

fn dir() -> (tempfile::TempDir, DirArtifacts) {
    let t = tempfile::tempdir().unwrap();
    let a = DirArtifacts::create(t.path().join("artifacts")).unwrap();
    (t, a)
}

#[test]
fn dir_artifacts_keep_the_contract() {
    let (_t, a) = dir();
    contract(&a);
    // …and across a reopen (the bytes are files).
    let again = DirArtifacts::open(a.root()).unwrap();
    assert_eq!(&again.read("cli", "in0", 5).unwrap()[..], b"hello");
    assert_eq!(&again.output(&key(), "out").unwrap().unwrap().1[..], b"one");
}

#[test]
fn the_per_file_limit_holds_at_n_and_refuses_n_plus_one() {
    let (_t, a) = dir();
    assert_eq!(a.per_file(), DEFAULT_PER_FILE);
    let a = a.per_file_max(8).unwrap();
    let n = [7u8; 8];
    let n1 = [7u8; 9];
    // Inputs.
    a.insert("cli", "n", &n).unwrap();
    let e = a.insert("cli", "n1", &n1).unwrap_err();
    assert_eq!(
        (e.category(), e.reason()),
        (Category::OutputLimit, Reason::ArtifactOverPerFile)
    );
    assert_eq!(e.limit().map(|l| (l.actual, l.max)), Some((9, 8)));
    // Outputs.
    a.put(&key(), "n", Bytes::copy_from_slice(&n), &sha256_hex(&n))
        .unwrap();
    let e = a
        .put(&key(), "n1", Bytes::copy_from_slice(&n1), &sha256_hex(&n1))
        .unwrap_err();
    assert_eq!(e.reason(), Reason::ArtifactOverPerFile);
    assert_eq!(a.output(&key(), "n1").unwrap(), None);
    // A read of a file grown past the limit (written by someone else) is
    // refused even under a larger `max`.
    std::fs::write(a.root().join("inputs/cli/grown"), n1).unwrap();
    let e = a.read("cli", "grown", 100).unwrap_err();
    assert_eq!(e.reason(), Reason::ArtifactOverPerFile);
    assert_eq!(&a.read("cli", "n", 100).unwrap()[..], &n);
    // The limit's own range: 1 B–16 MiB.
    let (_t2, b) = dir();
    let b = b.per_file_max(MAX_PER_FILE).unwrap();
    assert_eq!(b.per_file(), MAX_PER_FILE);
    for bad in [0, MAX_PER_FILE + 1] {
        let (_t3, c) = dir();
        let e = c.per_file_max(bad).unwrap_err();
        assert_eq!(e.reason(), Reason::ArtifactPerFileOutOfRange);
    }
    let (_t4, c) = dir();
    assert_eq!(c.per_file_max(1).unwrap().per_file(), 1);
}

#[test]
fn a_put_must_bring_its_own_digest() {
    let (_t, a) = dir();
    let e = a
        .put(
            &key(),
            "out",
            Bytes::from_static(b"one"),
            &sha256_hex(b"two"),
        )
        .unwrap_err();
    assert_eq!(
        (e.category(), e.reason()),
        (Category::Validation, Reason::ArtifactDigestMismatch)
    );
    assert_eq!(a.output(&key(), "out").unwrap(), None);
}

/// No name reaches a file outside the root: each is refused before any
/// file is touched, and nothing appears outside the root.
#[test]
fn names_that_would_leave_the_root_are_refused() {
    let (t, a) = dir();
    let bad = [
        "..",
        ".",
        "../x",
        "/etc/passwd",
        "a/b",
        "a\0b",
        "",
        ".tmp-0",
        &"x".repeat(129),
    ];
    for name in bad {
        let e = a.read(name, "in0", 10).unwrap_err();
        assert_eq!(e.reason(), Reason::ArtifactReference, "scope {name:?}");
        let e = a.read("cli", name, 10).unwrap_err();
        assert_eq!(e.reason(), Reason::ArtifactReference, "reference {name:?}");
        let e = a.insert(name, "in0", b"x").unwrap_err();
        assert_eq!(
            e.reason(),
            Reason::ArtifactReference,
            "insert scope {name:?}"
        );
        let e = a.insert("cli", name, b"x").unwrap_err();
        assert_eq!(e.reason(), Reason::ArtifactReference, "insert {name:?}");
        let e = a
            .put(&key(), name, Bytes::from_static(b"x"), &sha256_hex(b"x"))
            .unwrap_err();
        assert_eq!(
            e.reason(),
            Reason::ArtifactReference,
            "destination {name:?}"
        );
        let k = RecordKey {
            scope: name.to_owned(),
            id: "run-1".to_owned(),
        };
        let e = a
            .put(&k, "out", Bytes::from_static(b"x"), &sha256_hex(b"x"))
            .unwrap_err();
        assert_eq!(e.reason(), Reason::ArtifactReference, "key scope {name:?}");
        let k = RecordKey {
            scope: "cli".to_owned(),
            id: name.to_owned(),
        };
        let e = a
            .put(&k, "out", Bytes::from_static(b"x"), &sha256_hex(b"x"))
            .unwrap_err();
        assert_eq!(e.reason(), Reason::ArtifactReference, "key id {name:?}");
        assert!(a.output_path(&k, "out").is_err());
    }
    // Only the root was ever written to.
    let mut top: Vec<_> = std::fs::read_dir(t.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    top.sort();
    assert_eq!(top, vec![std::ffi::OsString::from("artifacts")]);
}

/// A symbolic link anywhere below the root (a file, a scope or record
/// directory, the top-level directories) is refused, never followed.
#[test]
fn symbolic_links_below_the_root_are_refused() {
    use std::os::unix::fs::symlink;
    let (t, a) = dir();
    let outside = t.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("secret"), b"secret").unwrap();
    a.insert("cli", "in0", b"x").unwrap();
    // A file that is a link to a file outside.
    symlink(outside.join("secret"), a.root().join("inputs/cli/link")).unwrap();
    let e = a.read("cli", "link", 100).unwrap_err();
    assert_eq!(
        (e.category(), e.reason()),
        (Category::Validation, Reason::ArtifactNotRegular)
    );
    // A scope directory that is a link to a directory outside.
    symlink(&outside, a.root().join("inputs/evil")).unwrap();
    let e = a.read("evil", "secret", 100).unwrap_err();
    assert_eq!(e.reason(), Reason::ArtifactNotRegular);
    let e = a.insert("evil", "planted", b"x").unwrap_err();
    assert_eq!(e.reason(), Reason::ArtifactNotRegular);
    // The outputs directory itself a link.
    symlink(&outside, a.root().join("outputs")).unwrap();
    let e = a
        .put(&key(), "out", Bytes::from_static(b"x"), &sha256_hex(b"x"))
        .unwrap_err();
    assert_eq!(e.reason(), Reason::ArtifactNotRegular);
    assert_eq!(
        a.output(&key(), "out").unwrap_err().reason(),
        Reason::ArtifactNotRegular
    );
    // Nothing was written outside.
    let mut names: Vec<_> = std::fs::read_dir(&outside)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    assert_eq!(names, vec![std::ffi::OsString::from("secret")]);
    // A directory where a file is expected.
    std::fs::create_dir(a.root().join("inputs/cli/adir")).unwrap();
    assert_eq!(
        a.read("cli", "adir", 100).unwrap_err().reason(),
        Reason::ArtifactNotRegular
    );
}

#[test]
fn the_root_must_be_an_absolute_private_directory() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("r");
    // Absent, relative.
    assert_eq!(
        DirArtifacts::open(&root).unwrap_err().reason(),
        Reason::ArtifactRoot
    );
    for rel in [Path::new("relative/dir"), Path::new("")] {
        assert_eq!(
            DirArtifacts::open(rel).unwrap_err().reason(),
            Reason::ArtifactRoot
        );
        assert_eq!(
            DirArtifacts::create(rel).unwrap_err().reason(),
            Reason::ArtifactRoot
        );
    }
    // Created 0700; widened to 0750: refused (create keeps the mode).
    DirArtifacts::create(&root).unwrap();
    let mode = std::fs::metadata(&root).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700);
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o750)).unwrap();
    assert_eq!(
        DirArtifacts::open(&root).unwrap_err().reason(),
        Reason::ArtifactRoot
    );
    assert_eq!(
        DirArtifacts::create(&root).unwrap_err().reason(),
        Reason::ArtifactRoot
    );
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o700)).unwrap();
    DirArtifacts::open(&root).unwrap();
    // A link to a private directory, or a file: refused.
    let link = t.path().join("link");
    std::os::unix::fs::symlink(&root, &link).unwrap();
    assert_eq!(
        DirArtifacts::open(&link).unwrap_err().reason(),
        Reason::ArtifactRoot
    );
    let file = t.path().join("file");
    std::fs::write(&file, b"").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(
        DirArtifacts::open(&file).unwrap_err().reason(),
        Reason::ArtifactRoot
    );
}

/// `Debug` shows the root and the limit, never bytes.
#[test]
fn debug_shows_no_bytes() {
    let (_t, a) = dir();
    a.insert("cli", "in0", b"SENTINEL-bytes").unwrap();
    let text = format!("{a:?}");
    assert!(!text.contains("SENTINEL"), "{text}");
    assert!(text.contains("per_file"), "{text}");
}
