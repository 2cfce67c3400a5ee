//! The node plugin's own state: one file per staged volume (`<state_dir>/staged/<volume>.json`:
//! where it is staged, how it is used, its device, where it is published), written before a
//! NodeStage answers and removed when a NodeUnstage has finished. A plugin that restarts
//! reads them back, so it answers the kubelet's repeated calls for the volumes it staged
//! before (the daemon, for its part, re-opened the volumes themselves from its `state.json`).
//!
//! Contract: a file is replaced atomically (written beside it, synced, renamed), so a crash
//! leaves the old record or the new one.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::mounter::MountError;

/// One staged volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Staged {
    pub volume: String,
    pub staging_path: PathBuf,
    /// `block`, or the filesystem (`ext4`, `xfs`).
    pub access: String,
    pub device: String,
    /// The attachment state (`seq`) it was staged for (`controller::ATTACHMENT`).
    #[serde(default)]
    pub attachment: Option<u64>,
    /// Target paths it is published at.
    pub published: BTreeSet<PathBuf>,
}

impl Staged {
    pub fn is_block(&self) -> bool {
        self.access == "block"
    }
}

/// The records, in a directory of their own.
#[derive(Debug, Clone)]
pub struct StagedDir {
    dir: PathBuf,
}

fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> MountError + 'a {
    move |source| MountError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

impl StagedDir {
    /// The records under `state_dir/staged` (created).
    pub fn open(state_dir: &Path) -> Result<Self, MountError> {
        let dir = state_dir.join("staged");
        std::fs::create_dir_all(&dir).map_err(io("create", &dir))?;
        Ok(Self { dir })
    }

    fn path(&self, volume: &str) -> PathBuf {
        self.dir.join(format!("{volume}.json"))
    }

    pub fn get(&self, volume: &str) -> Result<Option<Staged>, MountError> {
        let path = self.path(volume);
        match std::fs::read(&path) {
            Ok(b) => serde_json::from_slice(&b)
                .map(Some)
                .map_err(|e| MountError::Io {
                    op: "parse",
                    path,
                    source: e.into(),
                }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io("read", &path)(e)),
        }
    }

    pub fn put(&self, rec: &Staged) -> Result<(), MountError> {
        let path = self.path(&rec.volume);
        let tmp = self.dir.join(format!(".{}.tmp", rec.volume));
        let body = serde_json::to_vec_pretty(rec).map_err(|e| MountError::Io {
            op: "encode",
            path: path.clone(),
            source: e.into(),
        })?;
        let mut f = std::fs::File::create(&tmp).map_err(io("create", &tmp))?;
        f.write_all(&body).map_err(io("write", &tmp))?;
        f.sync_all().map_err(io("sync", &tmp))?;
        std::fs::rename(&tmp, &path).map_err(io("rename", &path))?;
        std::fs::File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(io("sync", &self.dir))
    }

    pub fn remove(&self, volume: &str) -> Result<(), MountError> {
        let path = self.path(volume);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io("remove", &path)(e)),
        }
    }

    /// Every record (a plugin's restart reports them).
    pub fn all(&self) -> Result<Vec<Staged>, MountError> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&self.dir).map_err(io("list", &self.dir))? {
            let entry = entry.map_err(io("list", &self.dir))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(volume) = name.strip_suffix(".json") {
                if let Some(rec) = self.get(volume)? {
                    out.push(rec);
                }
            }
        }
        out.sort_by(|a, b| a.volume.cmp(&b.volume));
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_survive_a_reopen_and_go_when_removed() {
        let dir = tempfile::tempdir().unwrap();
        let s = StagedDir::open(dir.path()).unwrap();
        let rec = Staged {
            volume: "pvc-1".into(),
            staging_path: "/stage/pvc-1".into(),
            access: "ext4".into(),
            device: "/dev/ublkb3".into(),
            attachment: Some(4),
            published: BTreeSet::from(["/pods/a".into()]),
        };
        s.put(&rec).unwrap();
        let again = StagedDir::open(dir.path()).unwrap();
        assert_eq!(again.get("pvc-1").unwrap(), Some(rec.clone()));
        assert_eq!(again.all().unwrap(), vec![rec]);
        again.remove("pvc-1").unwrap();
        again.remove("pvc-1").unwrap();
        assert_eq!(s.get("pvc-1").unwrap(), None);
        assert!(s.all().unwrap().is_empty());
    }
}
