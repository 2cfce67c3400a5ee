//! The per-volume manifest: which pack range holds each block, at one generation.
//!
//! Invariants (checked by [`Manifest::validate`] before every encode and publish, and by the
//! decoder on every load):
//! - `volume` is a valid volume name; `1 <= block_size <= MAX_BLOCK_SIZE`;
//! - every block index is `< block_count()` (the volume size rounded up to whole blocks);
//! - every location names a valid pack id and a frame of at least the entry header's length.
//!
//! Generations start at 1 for the first published manifest; `Manifest::new` yields generation 0
//! ("nothing published yet") and [`Manifest::successor`] the next one to publish.

use std::collections::{BTreeMap, BTreeSet};

use crate::error::ObjStoreError;
use crate::format::pack::ENTRY_HEADER_LEN;
use crate::format::MAX_BLOCK_SIZE;
use crate::location::{validate_volume_name, BlockIndex, BlockLocation, PackId};

/// One generation of a volume's block map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    /// The volume this manifest describes.
    pub volume: String,
    /// Generation number; each publish is exactly one more than the previous.
    pub generation: u64,
    /// Bytes per block.
    pub block_size: u32,
    /// Volume size in bytes.
    pub volume_size: u64,
    /// Where each stored block lives; absent blocks read as zeros.
    pub blocks: BTreeMap<BlockIndex, BlockLocation>,
}

impl Manifest {
    /// An empty manifest at generation 0 (never published).
    pub fn new(volume: &str, block_size: u32, volume_size: u64) -> Self {
        Self {
            volume: volume.to_string(),
            generation: 0,
            block_size,
            volume_size,
            blocks: BTreeMap::new(),
        }
    }

    /// A copy at the next generation, to modify and publish.
    pub fn successor(&self) -> Self {
        Self {
            generation: self.generation + 1,
            ..self.clone()
        }
    }

    /// Number of blocks in the volume (size rounded up to whole blocks).
    pub fn block_count(&self) -> u64 {
        if self.block_size == 0 {
            return 0;
        }
        self.volume_size.div_ceil(self.block_size as u64)
    }

    /// The distinct packs this manifest references.
    pub fn referenced_packs(&self) -> BTreeSet<&PackId> {
        self.blocks.values().map(|loc| &loc.pack).collect()
    }

    /// Checks the invariants in the module docs.
    pub fn validate(&self) -> Result<(), ObjStoreError> {
        validate_volume_name(&self.volume)?;
        let ctx = || {
            format!(
                "manifest volume=`{}` generation={}",
                self.volume, self.generation
            )
        };
        if self.block_size == 0 || self.block_size > MAX_BLOCK_SIZE {
            return Err(ObjStoreError::InvalidInput(format!(
                "{}: block size {} must be in 1..={MAX_BLOCK_SIZE}",
                ctx(),
                self.block_size
            )));
        }
        let count = self.block_count();
        if let Some((&last, _)) = self.blocks.last_key_value() {
            if last >= count {
                return Err(ObjStoreError::InvalidInput(format!(
                    "{}: block {last} is beyond the volume's {count} blocks",
                    ctx()
                )));
            }
        }
        for (block, loc) in &self.blocks {
            loc.pack.validate()?;
            if (loc.len as usize) < ENTRY_HEADER_LEN {
                return Err(ObjStoreError::InvalidInput(format!(
                    "{}: block {block} has a {}-byte location in pack `{}`",
                    ctx(),
                    loc.len,
                    loc.pack
                )));
            }
        }
        Ok(())
    }
}
