//! Small leaf helpers shared by every module (no `crate::` imports here,
//! so nothing can form a cycle through them).

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `m`, taking the data of a poisoned lock (a panicked handler must
/// not wedge the worker).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Maps a guest path (`/workspace/a.txt`) into the machine's host root,
/// never escaping it (`..` stops at the root).
pub(crate) fn guest_to_host(root: &Path, guest: &str) -> PathBuf {
    let mut out = root.to_path_buf();
    let mut depth = 0usize;
    for seg in guest.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                if depth > 0 {
                    out.pop();
                    depth -= 1;
                }
            }
            s => {
                out.push(s);
                depth += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guest_paths_stay_inside_the_root() {
        let r = Path::new("/r");
        assert_eq!(
            guest_to_host(r, "/workspace/a.txt"),
            Path::new("/r/workspace/a.txt")
        );
        assert_eq!(
            guest_to_host(r, "//workspace//./a"),
            Path::new("/r/workspace/a")
        );
        assert_eq!(
            guest_to_host(r, "/../../etc/passwd"),
            Path::new("/r/etc/passwd")
        );
        assert_eq!(guest_to_host(r, "/a/../b"), Path::new("/r/b"));
    }
}
