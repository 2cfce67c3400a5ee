//! `data_dir/state.json`: the volumes this daemon serves, so a restart re-attaches them.
//!
//! Contract: [`save`] is atomic (`write_atomic`: write `state.json.tmp`, fsync it, rename over
//! `state.json`, fsync the directory): a crash leaves either the old or the new list, never a
//! torn one.
//! [`load`] of a missing file is the empty list; a damaged file is an error (the daemon refuses
//! to start rather than forget volumes).
//!
//! Besides the volumes it serves, the file lists the store operations in flight that a crash
//! must not leave half done ([`Pending`]): a create or clone of a new volume is recorded
//! before its first store write (the claim, or the clone's registration), a purge before it
//! deletes anything; the same write that registers the volume (or drops it) drops the record.
//! A restart finds what a crash interrupted there: a create or clone is undone, a purge
//! finished (see `VolumeManager::restore`).

use std::path::Path;

use glidefs_volume::durable::write_atomic;
use serde::{Deserialize, Serialize};

pub use crate::manager::error::StateError;
use crate::manager::spec::{SnapshotRef, VolumeSpec};

/// Current format version.
const VERSION: u32 = 1;

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct StateFile {
    version: u32,
    volumes: Vec<VolumeSpec>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pending: Vec<Pending>,
}

/// A store operation that a crash must not leave half done (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub(crate) enum Pending {
    /// A create of a new volume: its claim (generation 1) may be in the store.
    Create { spec: VolumeSpec },
    /// A clone of `from`: its registration under the snapshot, origin record and
    /// generation 1 may be in the store.
    Clone { spec: VolumeSpec, from: SnapshotRef },
    /// A remove with purge: its cache directory and objects are being deleted.
    Purge { spec: VolumeSpec },
}

impl Pending {
    pub(crate) fn spec(&self) -> &VolumeSpec {
        match self {
            Pending::Create { spec } | Pending::Clone { spec, .. } | Pending::Purge { spec } => {
                spec
            }
        }
    }
}

/// The persisted volume list (empty when the file does not exist).
pub(crate) fn load(path: &Path) -> Result<Vec<VolumeSpec>, StateError> {
    Ok(load_all(path)?.0)
}

/// The persisted volume list and the operations a crash may have interrupted.
pub(crate) fn load_all(path: &Path) -> Result<(Vec<VolumeSpec>, Vec<Pending>), StateError> {
    let io = |op, source| StateError::Io {
        path: path.to_path_buf(),
        op,
        source,
    };
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((Vec::new(), Vec::new())),
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
            supported: VERSION,
        });
    }
    Ok((state.volumes, state.pending))
}

/// Atomically replaces the persisted list (blocking file I/O).
pub(crate) fn save(
    path: &Path,
    volumes: &[VolumeSpec],
    pending: &[Pending],
) -> Result<(), StateError> {
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
        pending: pending.to_vec(),
    };
    let json = serde_json::to_vec_pretty(&doc).map_err(|source| StateError::Json {
        path: path.to_path_buf(),
        source,
    })?;
    write_atomic(path, &json).map_err(|e| io(e.step.as_str(), e.source))
}

/// One pending operation; `live` while the call that recorded it still runs.
#[derive(Debug, Clone)]
pub(crate) struct Record {
    pub op: Pending,
    pub live: bool,
}

impl Record {
    pub(crate) fn live(op: Pending) -> Self {
        Self { op, live: true }
    }
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
            snapshot: (name == "snap").then(|| crate::manager::spec::SnapshotRef {
                volume: "vol".into(),
                snapshot: "s1".into(),
            }),
            encryption_key: None,
            durability: Default::default(),
            qos: Default::default(),
        }
    }

    #[test]
    fn save_then_load_round_trips_and_missing_is_empty() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/state.json");
        assert!(load(&path).unwrap().is_empty());
        save(&path, &[spec("a"), spec("b"), spec("snap")], &[]).unwrap();
        assert_eq!(
            load(&path).unwrap(),
            vec![spec("a"), spec("b"), spec("snap")]
        );
        save(&path, &[spec("b")], &[]).unwrap();
        assert_eq!(load(&path).unwrap(), vec![spec("b")]);
        let pending = vec![
            Pending::Create { spec: spec("c") },
            Pending::Clone {
                spec: spec("d"),
                from: SnapshotRef {
                    volume: "b".into(),
                    snapshot: "s1".into(),
                },
            },
            Pending::Purge { spec: spec("b") },
        ];
        save(&path, &[spec("b")], &pending).unwrap();
        assert_eq!(load_all(&path).unwrap(), (vec![spec("b")], pending));
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
