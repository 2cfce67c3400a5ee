//! The store side of space accounting and compaction: what packs take, and copying frames.
//!
//! A pack's *stored* size is its object size (entry frames, index, footer); its *live* bytes
//! are the frame lengths a manifest still points at ([`Manifest::pack_use`]). Compaction
//! (the engine's `Volume::compact`) reads the live frames of packs whose live share fell
//! under a threshold with [`VolumeStore::read_frames`] (one ranged GET per run of adjacent
//! frames) and writes them, as they are, into new packs ([`PackBuilder::add_frame`]).
//!
//! [`Manifest::pack_use`]: crate::Manifest::pack_use
//! [`PackBuilder::add_frame`]: crate::PackBuilder::add_frame

use std::ops::Range;

use bytes::Bytes;
use futures::TryStreamExt;

use crate::error::ObjStoreError;
use crate::location::{BlockLocation, PackId};
use crate::retry::with_retry;
use crate::store::VolumeStore;

/// One pack object as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredPack {
    /// The pack's id.
    pub id: PackId,
    /// Object size in bytes.
    pub size: u64,
}

impl VolumeStore {
    /// Every pack object of the volume with its size (one LIST, retried when transient).
    pub async fn list_packs(&self) -> Result<Vec<StoredPack>, ObjStoreError> {
        let dir = self.layout.pack_dir();
        let metas: Vec<object_store::ObjectMeta> =
            with_retry(&self.cfg, "list packs", dir.as_ref(), |_| {
                self.store.list(Some(dir)).try_collect::<Vec<_>>()
            })
            .await?;
        Ok(metas
            .into_iter()
            .filter_map(|m| {
                Some(StoredPack {
                    id: self.layout.parse_pack(&m.location)?,
                    size: m.size,
                })
            })
            .collect())
    }

    /// The raw entry frames at `locs` (all in `pack`, ascending and not overlapping), in
    /// order: one ranged GET per run of back-to-back frames. The frames are not verified here (the caller's
    /// `PackBuilder::add_frame` checks each one); a short answer is an error.
    pub async fn read_frames(
        &self,
        pack: &PackId,
        locs: &[BlockLocation],
    ) -> Result<Vec<Bytes>, ObjStoreError> {
        pack.validate()?;
        let mut runs: Vec<Range<u64>> = Vec::new();
        for loc in locs {
            if &loc.pack != pack {
                return Err(ObjStoreError::InvalidInput(format!(
                    "read_frames of pack {pack}: a location names pack {}",
                    loc.pack
                )));
            }
            let end = loc.offset.checked_add(u64::from(loc.len)).ok_or_else(|| {
                ObjStoreError::InvalidInput(format!(
                    "location {}+{} overflows",
                    loc.offset, loc.len
                ))
            })?;
            match runs.last_mut() {
                Some(r) if r.end > loc.offset => {
                    return Err(ObjStoreError::InvalidInput(format!(
                        "read_frames of pack {pack}: frame at {} overlaps or precedes the one \
                         ending at {}",
                        loc.offset, r.end
                    )))
                }
                Some(r) if r.end == loc.offset => r.end = end,
                _ => runs.push(loc.offset..end),
            }
        }
        let path = self.layout.pack(pack);
        let spans = with_retry(&self.cfg, "get_ranges pack", path.as_ref(), |_| {
            self.store.get_ranges(&path, &runs)
        })
        .await?;
        let mut out = Vec::with_capacity(locs.len());
        let mut run = 0;
        for loc in locs {
            while runs[run].end <= loc.offset {
                run += 1;
            }
            let span = spans.get(run).cloned().unwrap_or_default();
            let at = (loc.offset - runs[run].start) as usize;
            let stop = at + loc.len as usize;
            if stop > span.len() {
                return Err(ObjStoreError::InvalidInput(format!(
                    "pack {pack}: frame {}+{} is past the {} bytes read",
                    loc.offset,
                    loc.len,
                    span.len()
                )));
            }
            out.push(span.slice(at..stop));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::format::pack::decode_entry;
    use crate::{Manifest, PackBuilder, StoreConfig};

    fn store() -> VolumeStore {
        let mem = Arc::new(object_store::memory::InMemory::new());
        VolumeStore::new(mem, "v", StoreConfig::default()).unwrap()
    }

    fn data(seed: u64, compressible: bool) -> Vec<u8> {
        if compressible {
            vec![seed as u8; 4096]
        } else {
            glidefs_testkit::noise(seed, 4096)
        }
    }

    /// Frames copied out of one pack (some adjacent, some not) into another decode to the
    /// same blocks, with the same raw crcs; the old pack's live bytes move to the new one.
    #[tokio::test]
    async fn live_frames_copy_as_is_into_a_new_pack() {
        let vs = store();
        let mut b = PackBuilder::new(4096).unwrap();
        for i in 0..8u64 {
            b.add(i, &data(i, i % 2 == 0)).unwrap();
        }
        let old = b.finish(PackId::new("old").unwrap());
        vs.upload_pack(&old).await.unwrap();
        let mut m = Manifest::new("v", 4096, 1 << 20);
        m.extend(old.locations.clone());
        // Blocks 1, 2, 3 and 6 stay live (1-3 adjacent: one GET for them).
        for i in [0u64, 4, 5, 7] {
            m.remove(i);
        }
        let live: Vec<(u64, BlockLocation)> = m.iter().map(|(b, l)| (b, l.clone())).collect();
        let locs: Vec<BlockLocation> = live.iter().map(|(_, l)| l.clone()).collect();
        let frames = vs.read_frames(&old.id, &locs).await.unwrap();
        let mut nb = PackBuilder::new(4096).unwrap();
        for ((block, loc), frame) in live.iter().zip(&frames) {
            nb.add_frame(*block, frame, loc.raw_crc).unwrap();
        }
        let new = nb.finish(PackId::new("new").unwrap());
        vs.upload_pack(&new).await.unwrap();
        let before = m.pack_use()[&old.id];
        m.extend(new.locations.clone());
        assert!(!m.references_pack("old"));
        assert_eq!(
            m.pack_use()[&new.id],
            before,
            "the same frames, the same live bytes"
        );
        assert_eq!(m.live_bytes(), before.bytes);
        for (block, loc) in m.iter() {
            let got = vs.read_block(block, loc).await.unwrap();
            assert_eq!(&got[..], &data(block, block % 2 == 0)[..], "block {block}");
            let frame = new
                .bytes
                .slice(loc.offset as usize..(loc.offset + u64::from(loc.len)) as usize);
            decode_entry(frame, block, loc.raw_crc, None).unwrap();
        }
    }

    /// A frame of another block, a damaged frame and a frame of another block size are
    /// refused; frames out of order are refused before any GET.
    #[tokio::test]
    async fn bad_frames_and_bad_runs_are_refused() {
        let vs = store();
        let mut b = PackBuilder::new(4096).unwrap();
        b.add(3, &data(3, true)).unwrap();
        b.add(4, &data(4, false)).unwrap();
        let pack = b.finish(PackId::new("p").unwrap());
        vs.upload_pack(&pack).await.unwrap();
        let locs: Vec<BlockLocation> = pack.locations.iter().map(|(_, l)| l.clone()).collect();
        let frames = vs.read_frames(&pack.id, &locs).await.unwrap();
        let mut nb = PackBuilder::new(4096).unwrap();
        assert!(
            nb.add_frame(4, &frames[0], locs[0].raw_crc).is_err(),
            "wrong block"
        );
        let mut bent = frames[1].to_vec();
        bent[30] ^= 1;
        assert!(nb.add_frame(4, &bent, locs[1].raw_crc).is_err(), "damaged");
        let mut other = PackBuilder::new(8192).unwrap();
        assert!(
            other.add_frame(3, &frames[0], locs[0].raw_crc).is_err(),
            "block size"
        );
        nb.add_frame(3, &frames[0], locs[0].raw_crc).unwrap();
        assert!(
            nb.add_frame(3, &frames[0], locs[0].raw_crc).is_err(),
            "twice"
        );
        let reversed = [locs[1].clone(), locs[0].clone()];
        assert!(vs.read_frames(&pack.id, &reversed).await.is_err());
        let listed = vs.list_packs().await.unwrap();
        assert_eq!(
            listed,
            vec![StoredPack {
                id: pack.id.clone(),
                size: pack.bytes.len() as u64
            }]
        );
    }
}
