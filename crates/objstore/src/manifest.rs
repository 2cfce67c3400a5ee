//! The per-volume manifest: which pack range holds each block, at one generation.
//!
//! In memory the block map is cut into segments of [`SEGMENT_BLOCKS`] consecutive blocks, each
//! behind an `Arc` (copy on write): [`Manifest::successor`] copies only the segment pointers,
//! and changing a block copies just its segment. A segment also remembers where its exact
//! content is already stored (a frame of some generation's manifest object, see FORMAT.md,
//! manifest version 2); publishing generation `g` writes frames only for the segments changed
//! since they were last stored, plus a root that points at every segment's frame. So a flush
//! costs O(changed segments + segment count) bytes and CPU, not O(mapped blocks).
//!
//! Invariants (checked by [`Manifest::validate`] before every encode and publish, and by the
//! decoder on every load):
//! - `volume` is a valid volume name; `1 <= block_size <= MAX_BLOCK_SIZE`;
//! - every block index is `< block_count()` (the volume size rounded up to whole blocks);
//! - every location names a valid pack id and a frame of at least the entry header's length.
//!
//! - `owner`, when set, holds a valid owner id ([`validate_owner_id`]) and
//!   `1 <= claimed_at <= generation`.
//!
//! Generations start at 1 for the first published manifest; `Manifest::new` yields generation 0
//! ("nothing published yet") and [`Manifest::successor`] the next one to publish. Only the
//! store marks segments stored (after a publish it saw land, or a load), so a frame reference
//! never points at an object that does not hold it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::error::ObjStoreError;
use crate::location::{
    validate_volume_name, BlockIndex, BlockLocation, PackId, ENTRY_HEADER_LEN, MAX_BLOCK_SIZE,
};

/// Blocks per manifest segment (512 MiB of volume at 128 KiB blocks).
pub const SEGMENT_BLOCKS: u64 = 4096;

/// Most distinct older generations whose objects a manifest may point into before
/// [`Manifest::successor`] rewrites the segments stored in the oldest of them (bounds the
/// objects a load reads and the manifests GC must keep).
pub const MAX_REFERENCED_GENERATIONS: usize = 32;

/// Segments [`Manifest::successor`] rewrites at most per generation for that reason.
pub const COMPACT_SEGMENTS: usize = 4;

/// Longest owner id accepted (bytes).
pub const MAX_OWNER_ID_LEN: usize = 255;

/// Who published a generation, as recorded in its manifest (format 2 root, see FORMAT.md).
///
/// Written only by writers that declare an owner id: the volume claims ownership with a publish
/// that keeps the block map and sets `claimed_at` to that generation, later publishes of the
/// same writer carry the record unchanged, and a release publishes it once more with
/// `released = true`. A writer without an owner id publishes no record (`Manifest::owner ==
/// None`), exactly as before owners existed. Format-1 manifests read as `None`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ManifestOwner {
    /// Opaque owner id (the daemon uses `<hostname>/<uuid of its data dir>`):
    /// 1..=[`MAX_OWNER_ID_LEN`] bytes of printable ASCII without spaces (`!`..=`~`).
    pub id: String,
    /// Generation whose publish claimed this ownership (`1..=` the manifest's generation).
    pub claimed_at: u64,
    /// The owner gave the volume up: another owner may claim it without a takeover.
    pub released: bool,
}

/// Checks an owner id: 1..=[`MAX_OWNER_ID_LEN`] bytes of printable ASCII without spaces.
pub fn validate_owner_id(id: &str) -> Result<(), ObjStoreError> {
    let ok =
        !id.is_empty() && id.len() <= MAX_OWNER_ID_LEN && id.bytes().all(|b| b.is_ascii_graphic());
    if ok {
        Ok(())
    } else {
        Err(ObjStoreError::InvalidInput(format!(
            "owner id `{}` must be 1..={MAX_OWNER_ID_LEN} bytes of printable ASCII without spaces",
            id.escape_debug()
        )))
    }
}

/// Where a segment's content is stored: a frame of the manifest object of `generation`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FrameRef {
    pub generation: u64,
    /// Byte offset of the frame in that object.
    pub offset: u64,
    /// Frame length in bytes.
    pub len: u32,
    /// CRC-32C of the frame after its crc field (as stored in the frame).
    pub crc: u32,
}

/// How much of one pack a block map uses: blocks pointing into it and the bytes of their
/// entry frames (the pack's live bytes; the rest of the object is dead or index).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PackUse {
    /// Blocks whose location names the pack.
    pub blocks: u64,
    /// Sum of those locations' frame lengths.
    pub bytes: u64,
}

impl PackUse {
    fn add(&mut self, loc: &BlockLocation) {
        self.blocks += 1;
        self.bytes += u64::from(loc.len);
    }
}

/// One segment of the block map.
#[derive(Debug, Clone, Default)]
pub(crate) struct Segment {
    pub blocks: BTreeMap<BlockIndex, BlockLocation>,
    /// Use per pack, kept on every change, to answer "which packs" and "how live" without a
    /// scan of the blocks.
    pub packs: BTreeMap<PackId, PackUse>,
    /// Where exactly this content is stored, if it is (cleared by every change).
    pub stored: Option<FrameRef>,
}

impl Segment {
    fn insert(&mut self, block: BlockIndex, loc: BlockLocation) -> Option<BlockLocation> {
        self.packs.entry(loc.pack.clone()).or_default().add(&loc);
        let old = self.blocks.insert(block, loc);
        if let Some(old) = &old {
            self.unref(old);
        }
        self.stored = None;
        old
    }

    fn unref(&mut self, loc: &BlockLocation) {
        if let Some(u) = self.packs.get_mut(&loc.pack) {
            u.blocks -= 1;
            u.bytes -= u64::from(loc.len);
            if u.blocks == 0 {
                self.packs.remove(&loc.pack);
            }
        }
    }

    /// A segment holding `blocks`, stored at `stored`.
    pub(crate) fn from_blocks(
        blocks: BTreeMap<BlockIndex, BlockLocation>,
        stored: Option<FrameRef>,
    ) -> Self {
        let mut packs: BTreeMap<PackId, PackUse> = BTreeMap::new();
        for loc in blocks.values() {
            packs.entry(loc.pack.clone()).or_default().add(loc);
        }
        Self {
            blocks,
            packs,
            stored,
        }
    }

    fn live_bytes(&self) -> u64 {
        self.packs.values().map(|u| u.bytes).sum()
    }
}

/// One generation of a volume's block map.
#[derive(Debug, Clone)]
pub struct Manifest {
    /// The volume this manifest describes.
    pub volume: String,
    /// Generation number; each publish is exactly one more than the previous.
    pub generation: u64,
    /// Bytes per block.
    pub block_size: u32,
    /// Volume size in bytes.
    pub volume_size: u64,
    /// Segment index → segment (absent segments hold no block).
    pub(crate) segments: BTreeMap<u64, Arc<Segment>>,
    /// Blocks mapped, over all segments.
    pub(crate) mapped: u64,
    /// Who published this generation, when that writer declared an owner id.
    pub owner: Option<ManifestOwner>,
}

/// Equal block maps and header fields (where segments are stored does not matter).
impl PartialEq for Manifest {
    fn eq(&self, other: &Self) -> bool {
        self.volume == other.volume
            && self.generation == other.generation
            && self.block_size == other.block_size
            && self.volume_size == other.volume_size
            && self.mapped == other.mapped
            && self.owner == other.owner
            && self.iter().eq(other.iter())
    }
}

impl Eq for Manifest {}

impl Manifest {
    /// An empty manifest at generation 0 (never published).
    pub fn new(volume: &str, block_size: u32, volume_size: u64) -> Self {
        Self {
            volume: volume.to_string(),
            generation: 0,
            block_size,
            volume_size,
            segments: BTreeMap::new(),
            mapped: 0,
            owner: None,
        }
    }

    /// A copy at the next generation, to modify and publish: O(segments) (the segments are
    /// shared until changed). The owner record is copied as is: a writer without an owner id
    /// clears it, a claim or release sets it. When the copy would point into more than
    /// [`MAX_REFERENCED_GENERATIONS`] older manifest objects, up to [`COMPACT_SEGMENTS`] of the
    /// segments stored in the oldest ones are marked for rewriting (deterministically, so a
    /// retried publish of the same copy writes the same bytes).
    pub fn successor(&self) -> Self {
        let mut next = Self {
            generation: self.generation + 1,
            ..self.clone()
        };
        let mut by_generation: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
        for (&idx, seg) in &next.segments {
            if let Some(r) = seg.stored {
                by_generation.entry(r.generation).or_default().push(idx);
            }
        }
        if by_generation.len() > MAX_REFERENCED_GENERATIONS {
            let rewrite: Vec<u64> = by_generation
                .into_values()
                .flatten()
                .take(COMPACT_SEGMENTS)
                .collect();
            for idx in rewrite {
                if let Some(seg) = next.segments.get_mut(&idx) {
                    Arc::make_mut(seg).stored = None;
                }
            }
        }
        next
    }

    /// Number of blocks in the volume (size rounded up to whole blocks).
    pub fn block_count(&self) -> u64 {
        if self.block_size == 0 {
            return 0;
        }
        self.volume_size.div_ceil(self.block_size as u64)
    }

    /// Number of blocks mapped (stored somewhere).
    pub fn len(&self) -> u64 {
        self.mapped
    }

    /// Whether no block is mapped.
    pub fn is_empty(&self) -> bool {
        self.mapped == 0
    }

    /// Where `block` is stored, if it is.
    pub fn get(&self, block: BlockIndex) -> Option<&BlockLocation> {
        self.segments
            .get(&(block / SEGMENT_BLOCKS))?
            .blocks
            .get(&block)
    }

    /// Points `block` at `loc`; returns the previous location.
    pub fn insert(&mut self, block: BlockIndex, loc: BlockLocation) -> Option<BlockLocation> {
        let seg = self.segments.entry(block / SEGMENT_BLOCKS).or_default();
        let old = Arc::make_mut(seg).insert(block, loc);
        if old.is_none() {
            self.mapped += 1;
        }
        old
    }

    /// Unmaps `block` (it reads as zeros again); returns its location.
    pub fn remove(&mut self, block: BlockIndex) -> Option<BlockLocation> {
        let idx = block / SEGMENT_BLOCKS;
        let seg = Arc::make_mut(self.segments.get_mut(&idx)?);
        let old = seg.blocks.remove(&block)?;
        seg.unref(&old);
        seg.stored = None;
        if seg.blocks.is_empty() {
            self.segments.remove(&idx);
        }
        self.mapped -= 1;
        Some(old)
    }

    /// Unmaps every block.
    pub fn clear(&mut self) {
        self.segments.clear();
        self.mapped = 0;
    }

    /// Every mapped block and its location, ascending.
    pub fn iter(&self) -> impl Iterator<Item = (BlockIndex, &BlockLocation)> + '_ {
        self.segments
            .values()
            .flat_map(|s| s.blocks.iter().map(|(b, l)| (*b, l)))
    }

    /// Every mapped block, ascending.
    pub fn blocks(&self) -> impl Iterator<Item = BlockIndex> + '_ {
        self.iter().map(|(b, _)| b)
    }

    /// The distinct packs this manifest references: O(segments × packs per segment).
    pub fn referenced_packs(&self) -> BTreeSet<&PackId> {
        self.segments
            .values()
            .flat_map(|s| s.packs.keys())
            .collect()
    }

    /// Use of every referenced pack (blocks and live frame bytes), summed from the per-segment
    /// use kept on every change: O(segments × packs per segment), never a scan of the blocks.
    pub fn pack_use(&self) -> BTreeMap<PackId, PackUse> {
        let mut out: BTreeMap<PackId, PackUse> = BTreeMap::new();
        for seg in self.segments.values() {
            for (pack, u) in &seg.packs {
                let e = out.entry(pack.clone()).or_default();
                e.blocks += u.blocks;
                e.bytes += u.bytes;
            }
        }
        out
    }

    /// Bytes of the entry frames of every mapped block (what a store holding only live data
    /// would need, before pack index overhead): O(segments × packs per segment).
    pub fn live_bytes(&self) -> u64 {
        self.segments.values().map(|s| s.live_bytes()).sum()
    }

    /// Every mapped block whose location names one of `packs`, ascending. Reads only the
    /// segments that reference one of them (their per-pack use says so).
    pub fn blocks_in(&self, packs: &BTreeSet<PackId>) -> Vec<(BlockIndex, BlockLocation)> {
        self.segments
            .values()
            .filter(|s| s.packs.keys().any(|p| packs.contains(p)))
            .flat_map(|s| s.blocks.iter())
            .filter(|(_, l)| packs.contains(&l.pack))
            .map(|(b, l)| (*b, l.clone()))
            .collect()
    }

    /// Whether any block points into `pack`.
    pub fn references_pack(&self, pack: &str) -> bool {
        self.segments
            .values()
            .any(|s| s.packs.keys().any(|p| p.as_str() == pack))
    }

    /// The packs referenced by segments that a publish of this manifest writes (not stored
    /// elsewhere already): O(changed segments).
    pub(crate) fn unstored_packs(&self) -> BTreeSet<&PackId> {
        self.segments
            .values()
            .filter(|s| !self.is_stored_elsewhere(s))
            .flat_map(|s| s.packs.keys())
            .collect()
    }

    /// Whether `seg` is stored in another generation's object (so this one points at it).
    pub(crate) fn is_stored_elsewhere(&self, seg: &Segment) -> bool {
        seg.stored.is_some_and(|r| r.generation != self.generation)
    }

    /// Generations whose objects hold frames of this manifest's stored segments.
    pub(crate) fn stored_generations(&self) -> BTreeSet<u64> {
        self.segments
            .values()
            .filter_map(|s| s.stored.map(|r| r.generation))
            .collect()
    }

    /// Records that segment `index` is stored at `frame` (the store, after a publish landed).
    pub(crate) fn mark_stored(&mut self, index: u64, frame: FrameRef) {
        if let Some(seg) = self.segments.get_mut(&index) {
            Arc::make_mut(seg).stored = Some(frame);
        }
    }

    /// Checks the invariants in the module docs: O(segments) plus O(blocks) of the segments
    /// not stored elsewhere (a stored segment was checked when it was encoded or decoded).
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
        if let Some(o) = &self.owner {
            validate_owner_id(&o.id)?;
            if o.claimed_at == 0 || o.claimed_at > self.generation {
                return Err(ObjStoreError::InvalidInput(format!(
                    "{}: owner `{}` claimed at generation {}, outside 1..={}",
                    ctx(),
                    o.id,
                    o.claimed_at,
                    self.generation
                )));
            }
        }
        let count = self.block_count();
        let last = self
            .segments
            .values()
            .next_back()
            .and_then(|s| s.blocks.keys().next_back().copied());
        if let Some(last) = last {
            if last >= count {
                return Err(ObjStoreError::InvalidInput(format!(
                    "{}: block {last} is beyond the volume's {count} blocks",
                    ctx()
                )));
            }
        }
        for seg in self.segments.values() {
            if self.is_stored_elsewhere(seg) {
                continue;
            }
            for pack in seg.packs.keys() {
                pack.validate()?;
            }
            for (block, loc) in &seg.blocks {
                if (loc.len as usize) < ENTRY_HEADER_LEN {
                    return Err(ObjStoreError::InvalidInput(format!(
                        "{}: block {block} has a {}-byte location in pack `{}`",
                        ctx(),
                        loc.len,
                        loc.pack
                    )));
                }
            }
        }
        Ok(())
    }
}

impl Extend<(BlockIndex, BlockLocation)> for Manifest {
    fn extend<I: IntoIterator<Item = (BlockIndex, BlockLocation)>>(&mut self, iter: I) {
        for (block, loc) in iter {
            self.insert(block, loc);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loc(pack: &str, entry: u32) -> BlockLocation {
        BlockLocation {
            pack: PackId(pack.into()),
            entry,
            offset: 0,
            len: 64,
            raw_crc: 0,
        }
    }

    /// Pack use kept on every insert, overwrite and removal (across segments, through
    /// successors sharing segments) equals a scan of the blocks.
    #[test]
    fn pack_use_follows_every_change_and_equals_a_scan() {
        let mut rng = glidefs_testkit::rng::Rng(7);
        let mut m = Manifest::new("v", 4096, 4096 * SEGMENT_BLOCKS * 3);
        let count = m.block_count();
        for round in 0..20 {
            let mut next = m.successor();
            for _ in 0..300 {
                let block = rng.below(count);
                if rng.below(4) == 0 {
                    next.remove(block);
                } else {
                    let pack = format!("p{}", rng.below(6));
                    let mut l = loc(&pack, 0);
                    l.len = 20 + rng.below(5000) as u32;
                    next.insert(block, l);
                }
            }
            let mut scan: BTreeMap<PackId, PackUse> = BTreeMap::new();
            for (_, l) in next.iter() {
                let u = scan.entry(l.pack.clone()).or_default();
                u.blocks += 1;
                u.bytes += u64::from(l.len);
            }
            assert_eq!(next.pack_use(), scan, "round {round}");
            assert_eq!(
                next.live_bytes(),
                scan.values().map(|u| u.bytes).sum::<u64>()
            );
            m = next;
        }
    }

    #[test]
    fn blocks_and_packs_are_tracked_per_segment() {
        let mut m = Manifest::new("v", 4096, 4096 * SEGMENT_BLOCKS * 4);
        m.insert(1, loc("a", 0));
        m.insert(SEGMENT_BLOCKS + 2, loc("b", 0));
        m.insert(1, loc("c", 1));
        assert_eq!(m.len(), 2);
        assert_eq!(m.get(1).unwrap().pack.as_str(), "c");
        assert_eq!(
            m.referenced_packs()
                .into_iter()
                .map(|p| p.as_str())
                .collect::<Vec<_>>(),
            vec!["b", "c"]
        );
        assert!(m.references_pack("b") && !m.references_pack("a"));
        assert_eq!(m.blocks().collect::<Vec<_>>(), vec![1, SEGMENT_BLOCKS + 2]);
        assert_eq!(m.remove(SEGMENT_BLOCKS + 2).unwrap().pack.as_str(), "b");
        assert_eq!(m.segments.len(), 1, "an empty segment is dropped");
        assert_eq!(m.len(), 1);
    }

    #[test]
    fn successor_shares_segments_until_changed() {
        let mut m = Manifest::new("v", 4096, 4096 * SEGMENT_BLOCKS * 4);
        m.insert(1, loc("a", 0));
        m.insert(SEGMENT_BLOCKS, loc("a", 1));
        let mut n = m.successor();
        assert_eq!(n.generation, 1);
        n.insert(2, loc("b", 0));
        assert!(Arc::ptr_eq(&m.segments[&1], &n.segments[&1]));
        assert!(!Arc::ptr_eq(&m.segments[&0], &n.segments[&0]));
        assert_eq!(m.len(), 2, "the predecessor is unchanged");
        assert_eq!(n.len(), 3);
    }

    /// A manifest pointing into too many older objects rewrites the segments of the oldest.
    #[test]
    fn successor_compacts_references_to_old_generations() {
        let n = MAX_REFERENCED_GENERATIONS as u64 + 3;
        let mut m = Manifest::new("v", 4096, 4096 * SEGMENT_BLOCKS * n);
        for i in 0..n {
            m.insert(i * SEGMENT_BLOCKS, loc("a", 0));
            Arc::make_mut(m.segments.get_mut(&i).unwrap()).stored = Some(FrameRef {
                generation: i + 1,
                offset: 32,
                len: 40,
                crc: 0,
            });
        }
        m.generation = n;
        let next = m.successor();
        let rewritten: Vec<u64> = next
            .segments
            .iter()
            .filter(|(_, s)| s.stored.is_none())
            .map(|(i, _)| *i)
            .collect();
        assert_eq!(rewritten, (0..COMPACT_SEGMENTS as u64).collect::<Vec<_>>());
        assert_eq!(next, {
            let mut same = m.clone();
            same.generation += 1;
            same
        });
    }
}
