//! Secrets on disk (`api.token_file`, `api.tls_key`): read only when neither group nor others
//! have any permission on the file (mode 0600 or stricter), checked on the opened file.

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// A secret file that could not be read or is open to others; names the key, file and mode.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("cannot read {key} `{path}`: {source}")]
    Read {
        key: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{key} `{path}` has mode {mode:04o}: a secret must not be open to group or others (chmod 600 it)")]
    OpenToOthers {
        key: &'static str,
        path: String,
        mode: u32,
    },
}

/// The content of the secret file `path` (the value of config key `key`).
pub(crate) fn read_secret(key: &'static str, path: &Path) -> Result<Vec<u8>, SecretError> {
    let read_err = |source| SecretError::Read {
        key,
        path: path.display().to_string(),
        source,
    };
    let mut file = std::fs::File::open(path).map_err(read_err)?;
    let mode = file.metadata().map_err(read_err)?.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(SecretError::OpenToOthers {
            key,
            path: path.display().to_string(),
            mode,
        });
    }
    let mut out = Vec::new();
    file.read_to_end(&mut out).map_err(read_err)?;
    Ok(out)
}
