//! Volume geometry: size, block size and the fixed 4 KiB checksum page.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{CacheError, Result};

/// Size of a checksummed page.
pub const PAGE_SIZE: u32 = 4096;
/// Default block size (128 KiB).
pub const DEFAULT_BLOCK_SIZE: u32 = 128 * 1024;

/// Shape of a volume. Invariants (checked by [`Geometry::new`]): `block_size` is a power of
/// two, at least one page and at most 16 MiB; `volume_size` is a non-zero multiple of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    volume_size: u64,
    block_size: u32,
}

impl Geometry {
    /// Validates and builds a geometry.
    pub fn new(volume_size: u64, block_size: u32) -> Result<Self> {
        if !block_size.is_power_of_two() || !(PAGE_SIZE..=16 << 20).contains(&block_size) {
            return Err(CacheError::InvalidGeometry(format!(
                "block_size={block_size} must be a power of two between {PAGE_SIZE} and 16 MiB"
            )));
        }
        if volume_size == 0 || !volume_size.is_multiple_of(u64::from(block_size)) {
            return Err(CacheError::InvalidGeometry(format!(
                "volume_size={volume_size} must be a non-zero multiple of block_size={block_size}"
            )));
        }
        Ok(Self {
            volume_size,
            block_size,
        })
    }

    pub fn volume_size(&self) -> u64 {
        self.volume_size
    }

    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// Block size as u64 (offset arithmetic).
    pub fn bs(&self) -> u64 {
        u64::from(self.block_size)
    }

    pub fn num_blocks(&self) -> u64 {
        self.volume_size / self.bs()
    }

    pub fn pages_per_block(&self) -> u32 {
        self.block_size / PAGE_SIZE
    }

    /// Checks that `offset..offset+len` lies inside the volume.
    pub fn check_range(&self, offset: u64, len: u64) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.volume_size => Ok(()),
            _ => Err(CacheError::OutOfRange {
                offset,
                len,
                size: self.volume_size,
            }),
        }
    }

    /// Splits `offset..offset+len` into per-block pieces: (block, offset within block, length).
    pub fn pieces(&self, offset: u64, len: u64) -> impl Iterator<Item = (u64, u64, u64)> {
        let bs = self.bs();
        let end = offset + len;
        let mut pos = offset;
        std::iter::from_fn(move || {
            if pos >= end {
                return None;
            }
            let block = pos / bs;
            let within = pos % bs;
            let n = (bs - within).min(end - pos);
            pos += n;
            Some((block, within, n))
        })
    }
}

/// The geometry of an open cache: the block size is fixed, the volume size may grow (online
/// resize, `Cache::grow`). A read is one atomic load; the size never shrinks.
#[derive(Debug)]
pub(crate) struct LiveGeometry {
    block_size: u32,
    volume_size: AtomicU64,
}

impl LiveGeometry {
    pub(crate) fn new(geo: Geometry) -> Self {
        Self {
            block_size: geo.block_size,
            volume_size: AtomicU64::new(geo.volume_size),
        }
    }

    /// The current geometry.
    pub(crate) fn get(&self) -> Geometry {
        Geometry {
            volume_size: self.volume_size.load(Ordering::Acquire),
            block_size: self.block_size,
        }
    }

    /// Moves to `geo` (same block size, a size no smaller: the caller checked both).
    pub(crate) fn grow_to(&self, geo: Geometry) {
        debug_assert_eq!(geo.block_size, self.block_size);
        self.volume_size
            .fetch_max(geo.volume_size, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_bad_shapes() {
        assert!(Geometry::new(1 << 20, 3000).is_err());
        assert!(Geometry::new(1 << 20, 2048).is_err());
        assert!(Geometry::new(100_000, 4096).is_err());
        assert!(Geometry::new(0, 4096).is_err());
        assert!(Geometry::new(1 << 20, 64 << 10).is_ok());
    }

    #[test]
    fn pieces_split_at_block_boundaries() {
        let g = Geometry::new(1 << 20, 64 << 10).unwrap();
        let p: Vec<_> = g.pieces(60 << 10, 72 << 10).collect();
        assert_eq!(
            p,
            vec![(0, 60 << 10, 4 << 10), (1, 0, 64 << 10), (2, 0, 4 << 10)]
        );
        assert!(g.check_range((1 << 20) - 1, 2).is_err());
        assert!(g.check_range(u64::MAX, 2).is_err());
    }
}
