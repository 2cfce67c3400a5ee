//! `data_dir/state.json`: the volumes this daemon serves, so a restart re-attaches them.
//!
//! Contract: [`save`] is atomic (`write_atomic`: write `state.json.tmp`, fsync it, rename over
//! `state.json`, fsync the directory): a crash leaves either the old or the new list, never a
//! torn one.
//! [`load`] of a missing file is the empty list; a damaged file is an error (the daemon refuses
//! to start rather than forget volumes).

use std::path::{Path, PathBuf};

use glidefs_volume::durable::write_atomic;
use serde::{Deserialize, Serialize};

use crate::daemon::manager::spec::VolumeSpec;

/// Current format version.
const VERSION: u32 = 1;

/// State file errors, naming the path.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("state file `{path}`: {op} failed: {source}")]
    Io {
        path: PathBuf,
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("state file `{path}` is damaged or of an unknown version: {source}")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error(
        "state file `{path}` is of an unknown version {version} (this glidefs reads {VERSION})"
    )]
    Version { path: PathBuf, version: u32 },
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct StateFile {
    version: u32,
    volumes: Vec<VolumeSpec>,
}

/// The persisted volume list (empty when the file does not exist).
pub(crate) fn load(path: &Path) -> Result<Vec<VolumeSpec>, StateError> {
    let io = |op, source| StateError::Io {
        path: path.to_path_buf(),
        op,
        source,
    };
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io("read", e)),
    };
    let json = |source| StateError::Json {
        path: path.to_path_buf(),
        source,
    };
    let state: StateFile = serde_json::from_str(&text).map_err(json)?;
    if state.version != VERSION {
        return Err(StateError::Version {
            path: path.to_path_buf(),
            version: state.version,
        });
    }
    Ok(state.volumes)
}

/// Atomically replaces the persisted list (blocking file I/O).
pub(crate) fn save(path: &Path, volumes: &[VolumeSpec]) -> Result<(), StateError> {
    let io = |op, source| StateError::Io {
        path: path.to_path_buf(),
        op,
        source,
    };
    let dir = path.parent().unwrap_or(Path::new("/"));
    std::fs::create_dir_all(dir).map_err(|e| io("create directory", e))?;
    let doc = StateFile {
        version: VERSION,
        volumes: volumes.to_vec(),
    };
    let json = serde_json::to_vec_pretty(&doc).map_err(|source| StateError::Json {
        path: path.to_path_buf(),
        source,
    })?;
    write_atomic(path, &json).map_err(|e| io(e.step.as_str(), e.source))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str) -> VolumeSpec {
        VolumeSpec {
            name: name.to_string(),
            size: 1 << 30,
            block_size: 128 << 10,
            queues: 2,
            queue_depth: 64,
            prefix: Some("t".into()),
            read_only: false,
            device_id: Some(3),
            snapshot: (name == "snap").then(|| crate::daemon::manager::spec::SnapshotRef {
                volume: "vol".into(),
                snapshot: "s1".into(),
            }),
            encryption_key: None,
        }
    }

    #[test]
    fn save_then_load_round_trips_and_missing_is_empty() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/state.json");
        assert!(load(&path).unwrap().is_empty());
        save(&path, &[spec("a"), spec("b"), spec("snap")]).unwrap();
        assert_eq!(
            load(&path).unwrap(),
            vec![spec("a"), spec("b"), spec("snap")]
        );
        save(&path, &[spec("b")]).unwrap();
        assert_eq!(load(&path).unwrap(), vec![spec("b")]);
        assert!(!path.with_extension("json.tmp").exists());
    }

    #[test]
    fn damaged_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        std::fs::write(&path, "{not json").unwrap();
        let err = load(&path).unwrap_err().to_string();
        assert!(err.contains("state.json"), "{err}");
        std::fs::write(&path, r#"{"version": 9, "volumes": []}"#).unwrap();
        assert!(load(&path).unwrap_err().to_string().contains("version 9"));
    }
}
