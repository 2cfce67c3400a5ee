//! Building packs: many blocks, each compressed and checksummed, in one immutable object.
//!
//! A [`PackBuilder`] appends entry frames to one growing buffer as blocks are added (compression
//! happens in `add`, so call it off the async executor for large packs), and `finish` appends the
//! index and footer and hands the buffer over as `Bytes` without copying. The resulting
//! [`EncodedPack`] carries the location of every block, ready to go into a manifest once the
//! pack is uploaded.
//!
//! A block a cheap probe of a sample of it predicts will not shrink is stored raw without being
//! compressed whole (`crate::compress`); [`PackBuilder::compression_stats`] counts what
//! happened to the blocks added.
//!
//! A builder given a key ([`PackBuilder::with_key`]) seals every entry frame and writes an
//! encrypted (version 2) pack; see `format::pack` and FORMAT.md, "Encryption".

use std::collections::HashSet;
use std::sync::Arc;

use bytes::Bytes;

use crate::compress::{BlockCompressor, CompressionStats};
use crate::crypto::VolumeKey;
use crate::error::ObjStoreError;
use crate::format::pack::{
    check_frame, encode_entry, encode_index_and_footer, IndexRecord, ENTRY_HEADER_LEN, FOOTER_LEN,
    INDEX_HEADER_LEN, INDEX_HEADER_LEN_ENCRYPTED, INDEX_RECORD_LEN,
};
use crate::format::MAX_BLOCK_SIZE;
use crate::location::{BlockIndex, BlockLocation, PackId};

/// zstd level used by [`PackBuilder::new`]: fast, and most of the gain on block data.
pub const DEFAULT_ZSTD_LEVEL: i32 = 1;

/// Accumulates blocks into one pack.
pub struct PackBuilder {
    block_size: u32,
    /// The compressor (with its level and probe).
    compressor: Option<BlockCompressor>,
    buf: Vec<u8>,
    records: Vec<IndexRecord>,
    blocks: HashSet<BlockIndex>,
    /// Seals every frame with this key (an encrypted pack).
    key: Option<Arc<VolumeKey>>,
}

impl std::fmt::Debug for PackBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PackBuilder")
            .field("block_size", &self.block_size)
            .field("zstd_level", &self.compressor.as_ref().map(|c| c.level()))
            .field("entries", &self.records.len())
            .field("encoded_bytes", &self.buf.len())
            .field("key_id", &self.key.as_ref().map(|k| k.id()))
            .finish()
    }
}

impl PackBuilder {
    /// A builder for blocks of `block_size` bytes, compressing with zstd level 1.
    pub fn new(block_size: u32) -> Result<Self, ObjStoreError> {
        Self::with_level(block_size, Some(DEFAULT_ZSTD_LEVEL))
    }

    /// A builder compressing with zstd at `level`, or storing raw bytes when `level` is `None`.
    /// Blocks that do not shrink are always stored raw; a compressor zstd cannot create is an
    /// error ([`ObjStoreError::Compression`]), never a silent switch to raw storage.
    pub fn with_level(block_size: u32, level: Option<i32>) -> Result<Self, ObjStoreError> {
        let compressor = level
            .map(|l| {
                BlockCompressor::new(l).map_err(|source| ObjStoreError::Compression {
                    op: "create compressor".to_string(),
                    level: l,
                    source,
                })
            })
            .transpose()?;
        Ok(Self {
            block_size,
            compressor,
            buf: Vec::new(),
            records: Vec::new(),
            blocks: HashSet::new(),
            key: None,
        })
    }

    /// Seals every frame with `key` (an encrypted, version 2 pack); `None` keeps the pack
    /// plain (version 1). Set it before adding blocks.
    pub fn with_key(mut self, key: Option<Arc<VolumeKey>>) -> Self {
        self.key = key;
        self
    }

    /// The block size this builder accepts.
    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// Adds one block; `data.len()` must equal the block size and a block may appear only once
    /// per pack.
    pub fn add(&mut self, block: BlockIndex, data: &[u8]) -> Result<(), ObjStoreError> {
        if self.block_size == 0 || self.block_size > MAX_BLOCK_SIZE {
            return Err(ObjStoreError::InvalidInput(format!(
                "pack block size {} must be in 1..={MAX_BLOCK_SIZE}",
                self.block_size
            )));
        }
        if data.len() != self.block_size as usize {
            return Err(ObjStoreError::InvalidInput(format!(
                "pack add: block {block} has {} bytes, block size is {}",
                data.len(),
                self.block_size
            )));
        }
        if self.records.len() >= u32::MAX as usize || !self.blocks.insert(block) {
            return Err(ObjStoreError::InvalidInput(format!(
                "pack add: block {block} is already in this pack (or the pack is full)"
            )));
        }
        let key = self.key.as_deref();
        let level = self.compressor.as_ref().map_or(0, |c| c.level());
        let record = encode_entry(&mut self.buf, self.compressor.as_mut(), block, data, key)
            .map_err(|e| {
                let (op, source) = e.into_parts(block);
                ObjStoreError::Compression { op, level, source }
            })?;
        self.records.push(record);
        Ok(())
    }

    /// Adds one block as an entry frame copied as is from another pack (compaction: no
    /// decompression, no recompression). The frame must be whole and self-consistent: its
    /// stored crc matches, it holds `block`, its raw length is the block size, and it is sealed
    /// exactly when this builder has a key (a sealed frame is bound to its block, not to its
    /// pack or offset, so it stays valid here; its tag is checked when it is read). `raw_crc`
    /// (the block's crc32c, from the old location) is carried into the new location.
    pub fn add_frame(
        &mut self,
        block: BlockIndex,
        frame: &[u8],
        raw_crc: u32,
    ) -> Result<(), ObjStoreError> {
        let header =
            check_frame(frame, block, self.block_size, self.key.is_some()).map_err(|detail| {
                ObjStoreError::InvalidInput(format!("pack add_frame: block {block}: {detail}"))
            })?;
        if self.records.len() >= u32::MAX as usize || !self.blocks.insert(block) {
            return Err(ObjStoreError::InvalidInput(format!(
                "pack add_frame: block {block} is already in this pack (or the pack is full)"
            )));
        }
        let offset = self.buf.len() as u64;
        self.buf.extend_from_slice(frame);
        self.records.push(IndexRecord {
            block,
            offset,
            len: frame.len() as u32,
            raw_crc,
            stored_crc: header.0,
            codec: header.1,
            encrypted: self.key.is_some(),
        });
        Ok(())
    }

    /// What happened to the blocks added with [`add`](Self::add): stored raw on the probe's
    /// word, compressed, or compressed but stored raw (all zero without a compressor).
    pub fn compression_stats(&self) -> CompressionStats {
        self.compressor
            .as_ref()
            .map(BlockCompressor::stats)
            .unwrap_or_default()
    }

    /// Number of blocks added.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// True when no block was added.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Bytes the finished pack will have (entries so far, plus index and footer).
    pub fn encoded_bytes(&self) -> usize {
        let index_header = if self.key.is_some() {
            INDEX_HEADER_LEN_ENCRYPTED
        } else {
            INDEX_HEADER_LEN
        };
        self.buf.len() + index_header + self.records.len() * INDEX_RECORD_LEN + FOOTER_LEN
    }

    /// Appends index and footer; the pack is named `id`.
    pub fn finish(self, id: PackId) -> EncodedPack {
        let PackBuilder {
            block_size,
            mut buf,
            records,
            key,
            ..
        } = self;
        encode_index_and_footer(&mut buf, block_size, &records, key.map(|k| k.id()));
        let locations = records
            .iter()
            .enumerate()
            .map(|(entry, rec)| {
                debug_assert!(rec.len as usize >= ENTRY_HEADER_LEN);
                (
                    rec.block,
                    BlockLocation {
                        pack: id.clone(),
                        entry: entry as u32,
                        offset: rec.offset,
                        len: rec.len,
                        raw_crc: rec.raw_crc,
                    },
                )
            })
            .collect();
        EncodedPack {
            id,
            bytes: Bytes::from(buf),
            locations,
        }
    }
}

/// A finished pack: its id, its bytes, and where each of its blocks lives.
#[derive(Debug, Clone)]
pub struct EncodedPack {
    /// The pack's name.
    pub id: PackId,
    /// The whole object.
    pub bytes: Bytes,
    /// `(block, location)` for every block, in the order they were added.
    pub locations: Vec<(BlockIndex, BlockLocation)>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::SEAL_OVERHEAD;
    use crate::format::pack::{decode_entry, decode_index, Codec};

    fn block(seed: u8, len: usize, compressible: bool) -> Vec<u8> {
        if compressible {
            (0..len)
                .map(|i| seed.wrapping_add((i / 64) as u8))
                .collect()
        } else {
            glidefs_testkit::noise(u64::from(seed), len)
        }
    }

    #[test]
    fn entries_round_trip_through_locations_and_index() {
        let mut b = PackBuilder::new(4096).unwrap();
        let blocks: Vec<(u64, Vec<u8>)> = vec![
            (3, block(1, 4096, true)),
            (10, block(2, 4096, false)),
            (0, vec![0u8; 4096]),
        ];
        for (i, data) in &blocks {
            b.add(*i, data).unwrap();
        }
        assert_eq!(b.len(), 3);
        let predicted = b.encoded_bytes();
        let pack = b.finish(PackId::new("p1").unwrap());
        assert_eq!(pack.bytes.len(), predicted);
        for ((i, data), (loc_block, loc)) in blocks.iter().zip(&pack.locations) {
            assert_eq!(i, loc_block);
            let frame = pack
                .bytes
                .slice(loc.offset as usize..(loc.offset + loc.len as u64) as usize);
            assert_eq!(
                &decode_entry(frame, *i, loc.raw_crc, None).unwrap()[..],
                &data[..]
            );
        }
        let (block_size, index) = decode_index(&pack.bytes).unwrap();
        assert_eq!(block_size, 4096);
        assert_eq!(index.len(), 3);
        assert_eq!(
            index[0].codec,
            Codec::Zstd,
            "compressible block is compressed"
        );
        assert_eq!(index[1].codec, Codec::None, "random block is stored raw");
        assert!(
            index[2].len < 100,
            "zero block compresses to almost nothing"
        );
    }

    #[test]
    fn wrong_size_and_duplicate_blocks_are_refused() {
        let mut b = PackBuilder::new(512).unwrap();
        assert!(b.add(1, &[0u8; 511]).is_err());
        b.add(1, &[0u8; 512]).unwrap();
        assert!(b.add(1, &[1u8; 512]).is_err());
        assert!(PackBuilder::new(0).unwrap().add(0, &[]).is_err());
    }

    #[test]
    fn uncompressed_builder_stores_raw() {
        let mut b = PackBuilder::with_level(1024, None).unwrap();
        b.add(0, &[7u8; 1024]).unwrap();
        let pack = b.finish(PackId::new("raw").unwrap());
        let (_, index) = decode_index(&pack.bytes).unwrap();
        assert_eq!(index[0].codec, Codec::None);
    }

    /// Random, zero, text and mixed 128 KiB blocks, plain and sealed: random ones are stored
    /// raw (the first without a whole-block compression), the others as smaller zstd frames,
    /// and every frame decodes to its block.
    #[test]
    fn probe_stores_random_blocks_raw_and_compresses_the_rest() {
        const BS: usize = 128 * 1024;
        let mut half = glidefs_testkit::noise(9, BS);
        half[BS / 2..].fill(0);
        let blocks: Vec<(Vec<u8>, Codec)> = vec![
            (glidefs_testkit::noise(1, BS), Codec::None),
            (vec![0u8; BS], Codec::Zstd),
            (block(3, BS, true), Codec::Zstd),
            (half, Codec::Zstd),
            (glidefs_testkit::noise(2, BS), Codec::None),
        ];
        let key = Arc::new(VolumeKey::from_bytes([7; 32]));
        for key in [None, Some(key)] {
            let mut b = PackBuilder::new(BS as u32).unwrap().with_key(key.clone());
            for (i, (data, _)) in blocks.iter().enumerate() {
                b.add(i as u64, data).unwrap();
            }
            let stats = b.compression_stats();
            // The second random block follows compressed ones: compressed whole, not shrunk.
            let want = CompressionStats {
                skipped: 1,
                compressed: 3,
                not_shrunk: 1,
            };
            assert_eq!(stats, want, "encrypted: {}", key.is_some());
            let pack = b.finish(PackId::new("probe").unwrap());
            let (_, _, index) = crate::format::pack::decode_index_with_key_id(&pack.bytes).unwrap();
            for (((data, codec), rec), (block, loc)) in
                blocks.iter().zip(&index).zip(&pack.locations)
            {
                assert_eq!(rec.codec, *codec, "block {block}");
                let overhead = ENTRY_HEADER_LEN + key.as_ref().map_or(0, |_| SEAL_OVERHEAD);
                let payload = rec.len as usize - overhead;
                match codec {
                    Codec::None => assert_eq!(payload, BS, "block {block}"),
                    Codec::Zstd => assert!(payload < BS * 3 / 4, "block {block}: {payload}"),
                }
                let frame = pack
                    .bytes
                    .slice(loc.offset as usize..(loc.offset + loc.len as u64) as usize);
                let back = decode_entry(frame, *block, loc.raw_crc, key.as_deref()).unwrap();
                assert_eq!(&back[..], &data[..], "block {block}");
            }
        }
    }
}
