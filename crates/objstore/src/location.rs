//! Names of things in the store: blocks, packs, and where a block's bytes live.

use std::fmt;
use std::sync::Arc;

use crate::error::ObjStoreError;

/// Index of a block within a volume (byte offset / block size).
pub type BlockIndex = u64;

/// Largest block size any format accepts (bounds allocations while decoding).
pub const MAX_BLOCK_SIZE: u32 = 64 * 1024 * 1024;

/// Bytes of an entry frame's header: a block's location covers them and its frame
/// (FORMAT.md, pack entries).
pub const ENTRY_HEADER_LEN: usize = 20;

/// Longest pack id accepted.
pub const MAX_PACK_ID_LEN: usize = 128;

/// The name of one immutable pack object (`volumes/<volume>/packs/<id>.pack`).
///
/// Ids consist of ASCII letters, digits, `-` and `_` (1..=128 of them) so they are safe as one
/// object path segment on every store. A *foreign* id `<volume>/<id>` names a pack of another
/// volume of the same store: a clone's manifest maps the blocks it has not rewritten to its
/// origin's packs this way (see `snapshot.rs`). Only the volume that stored a pack ever
/// deletes or rewrites it: GC lists its own pack directory, compaction skips foreign ids. [`PackId::generate`] makes unique ones; the contract is
/// that an id is never reused for different bytes, which is what makes re-uploading a pack after
/// a lost acknowledgement safe. The string is shared (`Arc<str>`): every block location of a
/// manifest that names the pack holds a pointer, not a copy.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PackId(pub Arc<str>);

impl PackId {
    /// A fresh id `<writer_generation:016x>-<seq:08x>-<random:016x>`; sorts by generation then
    /// sequence, and the random part keeps two writers (or restarts) from colliding.
    pub fn generate(writer_generation: u64, seq: u64) -> Self {
        let random: u64 = rand::random();
        PackId(format!("{writer_generation:016x}-{seq:08x}-{random:016x}").into())
    }

    /// Wraps `id` after checking the allowed characters and length.
    pub fn new(id: impl Into<String>) -> Result<Self, ObjStoreError> {
        let id = PackId(id.into().into());
        id.validate()?;
        Ok(id)
    }

    /// The id as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// This pack as seen from another volume: `<volume>/<id>` (a foreign id stays as it is,
    /// so a clone of a clone still names the volume that stored the pack).
    pub fn in_volume(&self, volume: &str) -> Self {
        if self.foreign_volume().is_some() {
            self.clone()
        } else {
            PackId(format!("{volume}/{}", self.0).into())
        }
    }

    /// The volume that stored this pack when it is not the manifest's own (`<volume>/<id>`).
    pub fn foreign_volume(&self) -> Option<&str> {
        self.0.split_once('/').map(|(volume, _)| volume)
    }

    /// The pack's own id, without a foreign volume.
    pub fn local_id(&self) -> &str {
        self.0.split_once('/').map_or(&self.0, |(_, id)| id)
    }

    /// Checks the allowed characters and length (of both parts of a foreign id).
    pub fn validate(&self) -> Result<(), ObjStoreError> {
        let id = self.local_id();
        let ok = !id.is_empty()
            && id.len() <= MAX_PACK_ID_LEN
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            && self
                .foreign_volume()
                .is_none_or(|v| validate_volume_name(v).is_ok());
        if ok {
            Ok(())
        } else {
            Err(ObjStoreError::InvalidInput(format!(
                "pack id `{}` must be 1..={MAX_PACK_ID_LEN} characters of [A-Za-z0-9_-], optionally after `<volume>/`",
                self.0.escape_debug()
            )))
        }
    }
}

impl fmt::Display for PackId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Where one block's bytes live: a byte range of one pack that holds a self-checking entry
/// frame (see FORMAT.md), plus the crc32c of the block's raw (uncompressed) bytes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BlockLocation {
    /// The pack holding the block.
    pub pack: PackId,
    /// Position of the entry in the pack's index.
    pub entry: u32,
    /// Byte offset of the entry frame within the pack object.
    pub offset: u64,
    /// Length of the entry frame (header + stored bytes).
    pub len: u32,
    /// crc32c of the block's raw bytes.
    pub raw_crc: u32,
}

/// Longest volume name accepted.
pub const MAX_VOLUME_NAME_LEN: usize = 128;

/// Checks a volume name: 1..=128 characters of `[A-Za-z0-9._-]`, not `.` or `..`.
pub fn validate_volume_name(name: &str) -> Result<(), ObjStoreError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_VOLUME_NAME_LEN
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(ObjStoreError::InvalidInput(format!(
            "volume name `{}` must be 1..={MAX_VOLUME_NAME_LEN} characters of [A-Za-z0-9._-] and not `.`/`..`",
            name.escape_debug()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_ids_are_valid_unique_and_sorted_by_generation() {
        let a = PackId::generate(1, 7);
        let b = PackId::generate(1, 7);
        assert_ne!(a, b);
        a.validate().unwrap();
        assert!(PackId::generate(2, 0) > PackId::generate(1, 99));
    }

    #[test]
    fn bad_ids_and_names_are_rejected() {
        assert!(PackId::new("").is_err());
        assert!(PackId::new("a/b/c").is_err());
        assert!(PackId::new("/b").is_err());
        assert!(PackId::new("a/").is_err());
        assert!(PackId::new("../b").is_err());
        let foreign = PackId::new("vol.1/abc-1").unwrap();
        assert_eq!(foreign.foreign_volume(), Some("vol.1"));
        assert_eq!(foreign.local_id(), "abc-1");
        let own = PackId::new("abc-1").unwrap();
        assert_eq!(own.foreign_volume(), None);
        assert_eq!(own.in_volume("vol.1"), foreign);
        assert_eq!(foreign.in_volume("other"), foreign);
        assert!(PackId::new("x".repeat(129)).is_err());
        assert!(PackId::new("ok-id_1").is_ok());
        for bad in ["", ".", "..", "a/b", "a b", "ü"] {
            assert!(validate_volume_name(bad).is_err(), "{bad:?}");
        }
        validate_volume_name("vol-1.data_x").unwrap();
    }
}
