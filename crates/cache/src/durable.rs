//! Replacing a small state file durably: [`write_atomic`].
//!
//! Steps: write the bytes to `<path>.tmp` (created, or truncated when a crash left one),
//! fsync it, rename it over `<path>`, fsync the directory. Contract:
//! - after a crash or power cut at any point, `<path>` holds its old content (or is missing if
//!   it had none) or the whole new content, never a mix;
//! - once the call returns `Ok`, the new content and the directory entry survive a power cut;
//! - on an error the old `<path>` is untouched until the rename and whole after it; a
//!   `<path>.tmp` may be left behind (the next call overwrites it; readers never open it);
//! - the file is made as `File::create` makes it (mode 0666 less the umask), so the mode of a
//!   replaced file is not kept; the error names the file and the step that failed.
//!
//! Two writers of the same path share the `.tmp` name: callers serialise their writes. The
//! directory must exist (callers that may be first to write there create it).

use std::io::Write;
use std::path::{Path, PathBuf};

/// The step of [`write_atomic`] that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtomicStep {
    CreateTmp,
    WriteTmp,
    SyncTmp,
    Rename,
    SyncDir,
}

impl AtomicStep {
    /// Short name of the step, for errors that carry an operation name.
    pub fn as_str(self) -> &'static str {
        match self {
            AtomicStep::CreateTmp => "create tmp",
            AtomicStep::WriteTmp => "write tmp",
            AtomicStep::SyncTmp => "fsync tmp",
            AtomicStep::Rename => "rename",
            AtomicStep::SyncDir => "fsync directory",
        }
    }
}

impl std::fmt::Display for AtomicStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// [`write_atomic`] failed: which file it was replacing, at which step.
#[derive(Debug, thiserror::Error)]
#[error("writing `{}` failed at {step}: {source}", path.display())]
pub struct AtomicWriteError {
    /// The file being replaced (not the `.tmp` beside it).
    pub path: PathBuf,
    pub step: AtomicStep,
    #[source]
    pub source: std::io::Error,
}

/// Replaces the file at `path` with `bytes` (see the module docs for the contract). Blocking
/// file I/O.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), AtomicWriteError> {
    let fail = |step| {
        move |source| AtomicWriteError {
            path: path.to_path_buf(),
            step,
            source,
        }
    };
    let tmp = tmp_path(path);
    let mut f = std::fs::File::create(&tmp).map_err(fail(AtomicStep::CreateTmp))?;
    f.write_all(bytes).map_err(fail(AtomicStep::WriteTmp))?;
    f.sync_all().map_err(fail(AtomicStep::SyncTmp))?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(fail(AtomicStep::Rename))?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    crate::sys::sync_dir(dir).map_err(fail(AtomicStep::SyncDir))
}

/// `<path>.tmp`: the name [`write_atomic`] writes before the rename.
pub fn tmp_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".tmp");
    PathBuf::from(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_is_replaced_whole_and_no_tmp_remains() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state");
        write_atomic(&path, b"a longer first version\n").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"a longer first version\n");
        write_atomic(&path, b"v2\n").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"v2\n");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["state"], "only the file, no `.tmp`");
    }

    #[test]
    fn a_stale_tmp_from_a_crash_is_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("boot_id");
        std::fs::write(tmp_path(&path), vec![b'x'; 4096]).unwrap();
        write_atomic(&path, b"new\n").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new\n");
        assert!(!tmp_path(&path).exists());
    }

    #[test]
    fn a_missing_directory_fails_at_create_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gone/owner-id");
        let err = write_atomic(&path, b"id\n").unwrap_err();
        assert_eq!(err.step, AtomicStep::CreateTmp);
        assert_eq!(err.source.kind(), std::io::ErrorKind::NotFound);
        let msg = err.to_string();
        assert!(
            msg.contains(&format!("`{}`", path.display())) && msg.contains("create tmp"),
            "{msg}"
        );
    }

    #[test]
    fn a_failed_rename_keeps_the_old_file_and_names_the_step() {
        let dir = tempfile::tempdir().unwrap();
        // The target is a non-empty directory: the rename over it fails.
        let path = dir.path().join("checkpoint");
        std::fs::create_dir(&path).unwrap();
        std::fs::write(path.join("keep"), b"old").unwrap();
        let err = write_atomic(&path, b"new").unwrap_err();
        assert_eq!(err.step, AtomicStep::Rename);
        assert!(err.to_string().contains("failed at rename"), "{err}");
        assert_eq!(std::fs::read(path.join("keep")).unwrap(), b"old");
        // The tmp is left (the next call overwrites it), never read in place of the file.
        assert_eq!(std::fs::read(tmp_path(&path)).unwrap(), b"new");
    }
}
