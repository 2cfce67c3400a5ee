//! Where a volume's objects live in the bucket.
//!
//! ```text
//! volumes/<volume>/manifest/<generation, 20 decimal digits>   immutable, one per generation
//! volumes/<volume>/packs/<pack id>.pack                        immutable packs
//! volumes/<volume>/snapshots/<name>/record                     a snapshot (see snapshot.rs)
//! volumes/<volume>/snapshots/<name>/deleting                   a delete in progress
//! volumes/<volume>/snapshots/<name>/clones/<clone>             a clone made from it
//! volumes/<volume>/origin                                      a clone's origin snapshot
//! volumes/<volume>/warmset                                     the blocks it reads first
//! ```
//! Generations are zero-padded so lexical order is numeric order, which lets a writer ask the
//! store for "manifests after mine" with one offset listing.

use object_store::path::Path;

use crate::location::PackId;

/// Suffix of pack objects.
pub const PACK_SUFFIX: &str = ".pack";

/// Object paths of one volume.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    root: Path,
    manifest_dir: Path,
    pack_dir: Path,
}

impl Layout {
    /// Paths for `volume`, which must already be validated.
    pub(crate) fn new(volume: &str) -> Self {
        let root = Path::from_iter(["volumes", volume]);
        Self {
            manifest_dir: root.clone().join("manifest"),
            pack_dir: root.clone().join("packs"),
            root,
        }
    }

    pub(crate) fn manifest_dir(&self) -> &Path {
        &self.manifest_dir
    }

    pub(crate) fn pack_dir(&self) -> &Path {
        &self.pack_dir
    }

    pub(crate) fn manifest(&self, generation: u64) -> Path {
        self.manifest_dir.clone().join(format!("{generation:020}"))
    }

    /// The pack's path; `id` must be validated. A foreign id (`<volume>/<id>`) resolves into
    /// that volume's pack directory.
    pub(crate) fn pack(&self, id: &PackId) -> Path {
        let file = format!("{}{PACK_SUFFIX}", id.local_id());
        match id.foreign_volume() {
            Some(volume) => Layout::new(volume).pack_dir.join(file),
            None => self.pack_dir.clone().join(file),
        }
    }

    /// Where the volume's snapshots live: `snapshots/<name>/{record,deleting,clones/<clone>}`.
    pub(crate) fn snapshot_dir(&self) -> Path {
        self.root.clone().join("snapshots")
    }

    /// The origin record of a clone.
    pub(crate) fn origin(&self) -> Path {
        self.root.clone().join("origin")
    }

    /// The volume's warm set (see `warmset.rs`).
    pub(crate) fn warm_set(&self) -> Path {
        self.root.clone().join("warmset")
    }

    /// The generation named by a manifest path, if it is one.
    pub(crate) fn parse_manifest(&self, path: &Path) -> Option<u64> {
        let name = path.prefix_match(&self.manifest_dir)?.next()?;
        let name = name.as_ref();
        if name.len() != 20 || !name.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        name.parse().ok()
    }

    /// The pack id named by a pack path, if it is one.
    pub(crate) fn parse_pack(&self, path: &Path) -> Option<PackId> {
        let name = path.prefix_match(&self.pack_dir)?.next()?;
        let id = PackId(name.as_ref().strip_suffix(PACK_SUFFIX)?.into());
        id.validate().ok()?;
        Some(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_round_trip() {
        let l = Layout::new("vol");
        let m = l.manifest(42);
        assert_eq!(m.as_ref(), "volumes/vol/manifest/00000000000000000042");
        assert_eq!(l.parse_manifest(&m), Some(42));
        assert_eq!(
            l.parse_manifest(&Path::from("volumes/vol/manifest/42")),
            None
        );
        assert_eq!(
            l.parse_manifest(&Path::from("volumes/other/manifest/00000000000000000042")),
            None
        );
        let id = PackId::new("abc-1").unwrap();
        let p = l.pack(&id);
        assert_eq!(p.as_ref(), "volumes/vol/packs/abc-1.pack");
        assert_eq!(l.parse_pack(&p), Some(id));
        let foreign = PackId::new("parent/abc-1").unwrap();
        assert_eq!(l.pack(&foreign).as_ref(), "volumes/parent/packs/abc-1.pack");
        assert_eq!(l.snapshot_dir().as_ref(), "volumes/vol/snapshots");
        assert_eq!(l.origin().as_ref(), "volumes/vol/origin");
        assert_eq!(
            l.parse_pack(&Path::from("volumes/vol/packs/abc-1.tmp")),
            None
        );
    }
}
