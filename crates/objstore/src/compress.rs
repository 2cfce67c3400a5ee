//! Block compression for pack frames, with a cheap probe that skips blocks that will not shrink.
//!
//! Compressing an incompressible block is wasted work: the frame does not shrink and is dropped
//! (the block is stored raw). So before compressing a block whole, [`BlockCompressor`]
//! compresses a *sample* of it (measured in `crates/volume/benches/flush_cpu.rs`):
//!
//! - The sample is two [`WINDOW`]-byte windows of every [`STRIDE`]-byte stretch of the block
//!   (1/16 of it: 8 KiB of a 128 KiB block), concatenated and compressed as one input with the
//!   same zstd level. The first window starts the stretch (a 4 KiB boundary, where a
//!   filesystem's pages start, so a page repeated within the block shows up as a repeated
//!   window); the second one's offset in the stretch rotates through the 31 other window slots
//!   from stretch to stretch, so data laid out the same way in every page (a noisy header and
//!   a compressible rest, say) is sampled everywhere in the page, not only at its start.
//! - The block is compressed whole only when the sample's zstd frame is shorter than the
//!   sample; otherwise it is stored raw without compressing it. zstd itself stores a block raw
//!   unless compressing saves at least 1/64 of it (plus 2 bytes; `ZSTD_minGain` at the fast
//!   levels), so the probe asks of the sample the question zstd asks of the whole block: does
//!   it save 1/64? Random data never passes; data that compresses throughout, or in a part
//!   the windows sample in proportion (a zeroed half, a text tail, the same layout in every
//!   page), passes and is compressed exactly as before.
//! - The probe runs only while the compressor's last block was stored raw: after a block that
//!   compressed, the next one is compressed whole at once (as before the probe), and the probe
//!   starts again after the first block that does not shrink. A stream of compressible blocks
//!   thus pays nothing for the probe, a stream of random ones pays only the probe, and the
//!   worst case (alternating) pays the probe plus what compressing everything costs.
//! - Blocks shorter than [`MIN_PROBED_BLOCK`] are always compressed whole (few windows, and
//!   the probe would cost a large part of the compression it saves).
//!
//! Contract: the probe only ever *skips* compression, never forces it, and a block it lets
//! through is handled exactly as before (compressed; the frame kept only when shorter than the
//! block). So a frame is never longer than the raw block, no format changes, and compressible
//! blocks are still compressed. What the probe can miss (stored raw where compressing the whole
//! block would have saved bytes): blocks whose compressible part the sample under-represents,
//! so that the sample saves under 1/64 while the block saves more: a compressible stretch
//! that falls between windows, or one random page repeated (one repeated window of 64). Such a
//! block loses what compressing it would have saved; its frame is the raw block, as for any
//! block zstd cannot shrink. A zstd error, in the probe or the block, is returned, never
//! taken as "store raw".

use std::cell::RefCell;
use std::io;

/// Bytes of one sample window (two per stretch).
pub const WINDOW: usize = 128;
/// Bytes of one stretch; each gives two windows to the sample.
pub const STRIDE: usize = 4096;
/// Blocks shorter than this are compressed without a probe.
pub const MIN_PROBED_BLOCK: usize = 32 * 1024;

/// A zstd failure while encoding a block.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CompressError {
    /// Compressing the sample failed.
    #[error("zstd probe of a {sample}-byte sample of a {block_len}-byte block failed: {source}")]
    Probe {
        /// Bytes of the sample.
        sample: usize,
        /// Bytes of the block.
        block_len: usize,
        /// zstd's error.
        #[source]
        source: io::Error,
    },
    /// Compressing the whole block failed.
    #[error("zstd compression of a {block_len}-byte block failed: {source}")]
    Block {
        /// Bytes of the block.
        block_len: usize,
        /// zstd's error.
        #[source]
        source: io::Error,
    },
}

impl CompressError {
    /// What was being done, for `ObjStoreError::Compression`, and zstd's error.
    pub(crate) fn into_parts(self, block: u64) -> (String, io::Error) {
        match self {
            CompressError::Probe { sample, source, .. } => (
                format!("probe block {block} (a sample of {sample} bytes)"),
                source,
            ),
            CompressError::Block { source, .. } => (format!("compress block {block}"), source),
        }
    }
}

/// How the blocks given to a [`BlockCompressor`] were stored.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CompressionStats {
    /// Stored raw because the probe said the block would not shrink (not compressed whole).
    pub skipped: u64,
    /// Stored as a zstd frame.
    pub compressed: u64,
    /// Compressed whole but stored raw: the frame was not shorter than the block.
    pub not_shrunk: u64,
}

/// A zstd compressor, its level, the probe's buffers and counts.
pub struct BlockCompressor {
    zstd: zstd::bulk::Compressor<'static>,
    level: i32,
    sample: Vec<u8>,
    scratch: Vec<u8>,
    stats: CompressionStats,
    /// The last block was stored compressed: compress the next one whole, without a probe.
    last_compressed: bool,
}

impl std::fmt::Debug for BlockCompressor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockCompressor")
            .field("level", &self.level)
            .field("stats", &self.stats)
            .finish()
    }
}

impl BlockCompressor {
    /// A compressor at zstd `level`; zstd's error when it cannot create one.
    pub fn new(level: i32) -> io::Result<Self> {
        Ok(Self {
            zstd: zstd::bulk::Compressor::new(level)?,
            level,
            sample: Vec::new(),
            scratch: Vec::new(),
            stats: CompressionStats::default(),
            last_compressed: false,
        })
    }

    /// The zstd level.
    pub fn level(&self) -> i32 {
        self.level
    }

    /// Counts of the blocks handled so far.
    pub fn stats(&self) -> CompressionStats {
        self.stats
    }

    /// Whether the probe lets `raw` be compressed whole (module docs).
    pub fn worth_compressing(&mut self, raw: &[u8]) -> Result<bool, CompressError> {
        if raw.len() < MIN_PROBED_BLOCK {
            return Ok(true);
        }
        self.sample.clear();
        let slots = STRIDE / WINDOW;
        for (i, stretch) in raw.chunks(STRIDE).enumerate() {
            let second = (1 + i % (slots - 1)) * WINDOW;
            for at in [0, second] {
                let window = stretch.get(at..(at + WINDOW).min(stretch.len()));
                self.sample.extend_from_slice(window.unwrap_or_default());
            }
        }
        self.scratch.clear();
        self.scratch
            .reserve(zstd::zstd_safe::compress_bound(self.sample.len()));
        let n = self
            .zstd
            .compress_to_buffer(&self.sample[..], &mut self.scratch)
            .map_err(|source| CompressError::Probe {
                sample: self.sample.len(),
                block_len: raw.len(),
                source,
            })?;
        Ok(n < self.sample.len())
    }

    /// Compresses `raw` into `out` after its first `at` bytes when the last block compressed
    /// or the probe lets it, and keeps the frame when it is shorter than `raw`:
    /// `Some(frame length)`, with `out` truncated to the frame's end. `None`: store `raw` as
    /// is (`out` is then left at `at` bytes).
    pub fn compress_into(
        &mut self,
        raw: &[u8],
        out: &mut Vec<u8>,
        at: usize,
    ) -> Result<Option<usize>, CompressError> {
        out.truncate(at);
        if !self.last_compressed && !self.worth_compressing(raw)? {
            self.stats.skipped += 1;
            return Ok(None);
        }
        // A destination of zstd's worst-case size, so any error is a real one.
        let room = zstd::zstd_safe::compress_bound(raw.len()).max(raw.len());
        out.resize(at + room, 0);
        let n = self
            .zstd
            .compress_to_buffer(raw, &mut out[at..])
            .map_err(|source| CompressError::Block {
                block_len: raw.len(),
                source,
            })?;
        if n < raw.len() {
            out.truncate(at + n);
            self.stats.compressed += 1;
            self.last_compressed = true;
            Ok(Some(n))
        } else {
            out.truncate(at);
            self.stats.not_shrunk += 1;
            self.last_compressed = false;
            Ok(None)
        }
    }
}

thread_local! {
    /// This thread's zstd decompression context, made on first use and kept: making one per
    /// frame (what `zstd::bulk::decompress_to_buffer` does) allocated and set up a context
    /// for every cold block read.
    static DECOMPRESSOR: RefCell<Option<zstd::bulk::Decompressor<'static>>> =
        const { RefCell::new(None) };
}

/// Decompresses one zstd frame of at most `max_len` bytes (the frame header's raw length);
/// a frame that decompresses to more is an error. The output is not zeroed first.
pub(crate) fn decompress(frame: &[u8], max_len: usize) -> io::Result<Vec<u8>> {
    DECOMPRESSOR.with(|cell| {
        let mut slot = cell.borrow_mut();
        let d = match &mut *slot {
            Some(d) => d,
            None => slot.insert(zstd::bulk::Decompressor::new()?),
        };
        let mut out = Vec::with_capacity(max_len);
        d.decompress_to_buffer(frame, &mut out)?;
        Ok(out)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const BLOCK: usize = 128 * 1024;

    /// The reused context decompresses frame after frame, refuses a frame longer than the
    /// length it is given (and goes on working after that), and returns a shorter one as is
    /// (the caller checks the length).
    #[test]
    fn decompress_reuses_its_context_and_refuses_a_frame_longer_than_asked() {
        let a = glidefs_testkit::noise(1, 4096).repeat(8);
        let b = vec![7u8; 50_000];
        let (za, zb) = (
            zstd::bulk::compress(&a, 1).unwrap(),
            zstd::bulk::compress(&b, 1).unwrap(),
        );
        assert_eq!(decompress(&za, a.len()).unwrap(), a);
        assert_eq!(decompress(&zb, b.len()).unwrap(), b);
        assert!(decompress(&za, a.len() - 1).is_err());
        assert_eq!(decompress(&zb, b.len() + 10).unwrap(), b);
        assert_eq!(decompress(&za, a.len()).unwrap(), a);
        assert!(decompress(&za[..za.len() / 2], a.len()).is_err());
        assert_eq!(decompress(&zb, b.len()).unwrap(), b);
    }

    fn noise(seed: u64) -> Vec<u8> {
        glidefs_testkit::noise(seed, BLOCK)
    }

    fn text(len: usize) -> Vec<u8> {
        let words = b"block frames of a glidefs pack, compressed when they shrink; ";
        words.iter().copied().cycle().take(len).collect()
    }

    /// Runs `raw` through a fresh level 1 compressor: the stored payload (zstd frame or raw
    /// block), whether it is a zstd frame, and the counts.
    fn store(raw: &[u8]) -> (Vec<u8>, bool, CompressionStats) {
        let mut c = BlockCompressor::new(1).unwrap();
        let mut out = vec![0xEE; 20];
        match c.compress_into(raw, &mut out, 20).unwrap() {
            Some(n) => {
                assert_eq!(out.len(), 20 + n, "out ends at the frame's end");
                assert!(n < raw.len(), "a zstd frame is shorter than the block");
                let back = zstd::bulk::decompress(&out[20..], raw.len()).unwrap();
                assert_eq!(back, raw, "the frame decodes to the block");
                (out.split_off(20), true, c.stats())
            }
            None => {
                assert_eq!(out, vec![0xEE; 20], "out is left at `at` bytes");
                (raw.to_vec(), false, c.stats())
            }
        }
    }

    #[test]
    fn random_block_is_stored_raw_without_compressing_it() {
        let raw = noise(7);
        let (payload, zstd, stats) = store(&raw);
        assert!(!zstd);
        assert_eq!(payload, raw);
        let want = CompressionStats {
            skipped: 1,
            ..Default::default()
        };
        assert_eq!(
            stats, want,
            "the probe skipped it: no whole-block compression"
        );
    }

    #[test]
    fn zero_and_text_blocks_are_compressed_exactly_as_without_the_probe() {
        for raw in [vec![0u8; BLOCK], text(BLOCK)] {
            let (payload, zstd, stats) = store(&raw);
            assert!(zstd);
            assert_eq!(stats.compressed, 1);
            assert!(payload.len() < BLOCK / 8, "{} bytes", payload.len());
            // The probe only decides; the frame is the one compressing the block gives.
            assert_eq!(payload, zstd::bulk::compress(&raw, 1).unwrap());
        }
    }

    #[test]
    fn mixed_blocks_with_a_compressible_stretch_are_compressed() {
        let half = {
            let mut b = noise(1);
            b[BLOCK / 2..].fill(0);
            b
        };
        let pages_half_zero: Vec<u8> = noise(2)
            .chunks(4096)
            .flat_map(|p| p[..2048].iter().copied().chain([0u8; 2048]))
            .collect();
        // Every page a noisy 3 KiB header then text: windows at page starts see only noise.
        let pages_noisy_header: Vec<u8> = noise(10)
            .chunks(4096)
            .flat_map(|p| p[..3072].iter().copied().chain(text(1024)))
            .collect();
        // The shortest stretch the probe is sure to see, at an offset off every boundary.
        let stretch = {
            let mut b = noise(3);
            b[40_000..40_000 + STRIDE + WINDOW].fill(0);
            b
        };
        let texty = {
            let mut b = noise(4);
            b[BLOCK - 3 * STRIDE..].copy_from_slice(&text(3 * STRIDE));
            b
        };
        // Two random pages each repeated at another page boundary: their first windows repeat.
        let repeated_pages = {
            let mut b = noise(5);
            let (first, rest) = b.split_at_mut(2 * 4096);
            rest[5 * 4096..7 * 4096].copy_from_slice(first);
            b
        };
        for (name, raw) in [
            ("half zero", half),
            ("pages half zero", pages_half_zero),
            ("pages with noisy headers", pages_noisy_header),
            ("one zero stretch", stretch),
            ("text tail", texty),
            ("repeated pages", repeated_pages),
        ] {
            let (payload, zstd, stats) = store(&raw);
            assert!(zstd, "{name}: {stats:?}");
            assert!(payload.len() < BLOCK, "{name}: {} bytes", payload.len());
            assert_eq!(payload, zstd::bulk::compress(&raw, 1).unwrap(), "{name}");
        }
    }

    #[test]
    fn what_the_sample_under_represents_is_the_documented_miss() {
        // 1 KiB of zeros between the two windows of stretch 8 (at 0 and 9 * WINDOW): the probe
        // does not see them, and the block is stored raw (never longer than the block).
        let mut raw = noise(6);
        raw[8 * STRIDE + 2048..8 * STRIDE + 3072].fill(0);
        let (payload, zstd, stats) = store(&raw);
        assert!(!zstd);
        assert_eq!(payload, raw);
        assert_eq!(stats.skipped, 1);
        // One random page repeated: one window of 64 repeats, under zstd's 1/64 bar.
        let mut raw = noise(11);
        let (first, rest) = raw.split_at_mut(4096);
        rest[9 * 4096..10 * 4096].copy_from_slice(first);
        let (payload, zstd, _) = store(&raw);
        assert!(!zstd);
        assert_eq!(payload, raw);
    }

    #[test]
    fn small_blocks_are_compressed_whole_without_a_probe() {
        let raw = glidefs_testkit::noise(8, MIN_PROBED_BLOCK - 4096);
        let (payload, zstd, stats) = store(&raw);
        assert!(!zstd);
        assert_eq!(payload, raw);
        let want = CompressionStats {
            not_shrunk: 1,
            ..Default::default()
        };
        assert_eq!(stats, want, "compressed whole, did not shrink, stored raw");
        let small_zeros = vec![0u8; 4096];
        let (payload, zstd, _) = store(&small_zeros);
        assert!(zstd && payload.len() < 100);
    }

    #[test]
    fn the_probe_runs_only_after_a_block_stored_raw() {
        let mut c = BlockCompressor::new(1).unwrap();
        let mut out = Vec::new();
        // (block, counts after it): a random block is probed and skipped; text is probed and
        // compressed; random after a compressed block is compressed whole and does not
        // shrink; random after a raw block is probed again.
        let steps = [
            (noise(1), false, (1, 0, 0)),
            (text(BLOCK), true, (1, 1, 0)),
            (text(BLOCK), true, (1, 2, 0)),
            (noise(2), false, (1, 2, 1)),
            (noise(3), false, (2, 2, 1)),
            (noise(4), false, (3, 2, 1)),
            (vec![0u8; BLOCK], true, (3, 3, 1)),
        ];
        for (i, (raw, zstd, (skipped, compressed, not_shrunk))) in steps.iter().enumerate() {
            let stored = c.compress_into(raw, &mut out, 0).unwrap();
            assert_eq!(stored.is_some(), *zstd, "step {i}");
            let want = CompressionStats {
                skipped: *skipped,
                compressed: *compressed,
                not_shrunk: *not_shrunk,
            };
            assert_eq!(c.stats(), want, "step {i}");
        }
        assert_eq!(c.level(), 1);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]

        /// Blocks made of random, zero and text runs: the payload is never longer than the
        /// block, decodes to it, and a compressed one is the frame zstd gives the whole block.
        #[test]
        fn any_mix_round_trips_and_never_grows(
            runs in proptest::collection::vec((0u8..3, 1usize..40_000), 1..12),
            seed in 0u64..1000,
        ) {
            let mut raw = Vec::with_capacity(BLOCK);
            for (i, (kind, len)) in runs.iter().enumerate() {
                let len = (*len).min(BLOCK - raw.len());
                match kind {
                    0 => raw.extend(glidefs_testkit::noise(seed + i as u64, len)),
                    1 => raw.resize(raw.len() + len, 0),
                    _ => raw.extend(text(len)),
                }
            }
            raw.extend(glidefs_testkit::noise(seed, BLOCK - raw.len()));
            let (payload, zstd, _) = store(&raw);
            proptest::prop_assert!(payload.len() <= raw.len());
            if zstd {
                proptest::prop_assert_eq!(payload, zstd::bulk::compress(&raw, 1).unwrap());
            } else {
                proptest::prop_assert_eq!(payload, raw);
            }
        }
    }
}
