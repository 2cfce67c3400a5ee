//! Secrets on disk (`api.token_file`, `api.tls_key`, a volume's `encryption_key_file`): read
//! only from a regular file of at most a given size on which neither group nor others have
//! any permission (mode 0600 or stricter). The file is opened with `O_NONBLOCK` (opening a
//! FIFO then does not wait for a writer) and checked on the opened file (fstat) before a byte
//! is read; the read is bounded by the size limit. So a FIFO, a device (`/dev/zero`) or a
//! directory is refused at once, and a large file is neither read nor described: the errors
//! name the file and what is wrong with it, never its length or content.

use std::fs::OpenOptions;
use std::io::Read;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// What `api.token_file` and `api.tls_key` may be at most (a PEM private key is a few KiB).
pub(crate) const MAX_SECRET_BYTES: u64 = 64 << 10;

/// A secret file that could not be read, is not a small regular file or is open to others;
/// names the key and the file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SecretError {
    #[error("cannot read {key} `{path}`: {source}")]
    Read {
        key: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{key} `{path}` is not a regular file")]
    NotAFile { key: &'static str, path: String },
    #[error("{key} `{path}` is larger than {max} bytes, the limit for it")]
    TooLarge {
        key: &'static str,
        path: String,
        max: u64,
    },
    #[error("{key} `{path}` has mode {mode:04o}: a secret must not be open to group or others (chmod 600 it)")]
    OpenToOthers {
        key: &'static str,
        path: String,
        mode: u32,
    },
}

/// The content of the secret file `path` (the value of config key or request field `key`),
/// at most `max` bytes. Blocks (a file read): call it on a blocking thread in async code.
pub(crate) fn read_secret(
    key: &'static str,
    path: &Path,
    max: u64,
) -> Result<Vec<u8>, SecretError> {
    let shown = || path.display().to_string();
    let read_err = |source| SecretError::Read {
        key,
        path: shown(),
        source,
    };
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(read_err)?;
    let meta = file.metadata().map_err(read_err)?;
    if !meta.file_type().is_file() {
        return Err(SecretError::NotAFile { key, path: shown() });
    }
    let too_large = || SecretError::TooLarge {
        key,
        path: shown(),
        max,
    };
    if meta.len() > max {
        return Err(too_large());
    }
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(SecretError::OpenToOthers {
            key,
            path: shown(),
            mode,
        });
    }
    // Room for all of it up front (no reallocation leaves copies behind); one byte more
    // tells a file that grew since the fstat.
    let mut out = Vec::with_capacity(usize::try_from(max).unwrap_or(usize::MAX).saturating_add(1));
    file.take(max.saturating_add(1))
        .read_to_end(&mut out)
        .map_err(read_err)?;
    if out.len() as u64 > max {
        return Err(too_large());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, bytes: &[u8], mode: u32) -> std::path::PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p
    }

    #[test]
    fn a_small_private_regular_file_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let p = write(dir.path(), "s", b"secret\n", 0o600);
        assert_eq!(read_secret("k", &p, 7).unwrap(), b"secret\n");
        let p = write(dir.path(), "r", b"x", 0o400);
        assert_eq!(read_secret("k", &p, 7).unwrap(), b"x");
    }

    #[test]
    fn devices_directories_large_and_shared_files_are_refused_unread() {
        // A FIFO: tests/api_encryption.rs, through the API.
        let dir = tempfile::tempdir().unwrap();
        for p in [Path::new("/dev/zero"), dir.path()] {
            let err = read_secret("k", p, 4096).unwrap_err();
            assert!(matches!(err, SecretError::NotAFile { .. }), "{p:?}: {err}");
            assert!(err.to_string().ends_with("is not a regular file"), "{err}");
        }
        let big = write(dir.path(), "big", &[b'a'; 4097], 0o600);
        let err = read_secret("k", &big, 4096).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "k `{}` is larger than 4096 bytes, the limit for it",
                big.display()
            )
        );
        let shared = write(dir.path(), "shared", b"secret", 0o644);
        let err = read_secret("k", &shared, 4096).unwrap_err();
        assert!(
            matches!(err, SecretError::OpenToOthers { mode: 0o644, .. }),
            "{err}"
        );
        let missing = read_secret("k", &dir.path().join("none"), 4096).unwrap_err();
        assert!(matches!(missing, SecretError::Read { .. }), "{missing}");
    }
}
