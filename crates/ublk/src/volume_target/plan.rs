//! Pure translation of a cache [`ReadPlan`]'s segments into the queue's data-plane chunks.
//!
//! Contract (the queue's coverage rule): the chunks of a READ cover `[0, len)` of the
//! request's buffer exactly once. [`read_chunks`] checks that the segments do (contiguous
//! from 0, ending at `len`) and fails instead of producing anything else, so a request is
//! never acknowledged with stale buffer contents. Holes become [`Chunk::Zeros`]; local
//! sources read from the file the gate handed out (each chunk holds a clone of its
//! `Arc<File>`); remote pieces read from the request's
//! scratch slot (see `scratch`), or fail with [`PlanError::Remote`] when no scratch was given
//! (the caller then defers the request and fetches first).

use std::fs::File;
use std::sync::Arc;

use glidefs_volume::cache::{Files, Segment, Source};
use ublk_core::Chunk;

/// The files a plan's sources name (a chunk takes a clone of the one it reads).
#[derive(Debug, Clone, Copy)]
pub(crate) struct PlanFiles<'a> {
    pub(crate) active: &'a Arc<File>,
    pub(crate) flushing: Option<&'a Arc<File>>,
    pub(crate) clean: &'a Arc<File>,
    /// The scratch memfd and the file offset of this request's slot (cold reads only).
    pub(crate) scratch: Option<(&'a Arc<File>, u64)>,
}

impl<'a> PlanFiles<'a> {
    /// The files of the gate `files` (the plan's), and the scratch slot if any.
    pub(crate) fn of(files: &'a Files, scratch: Option<(&'a Arc<File>, u64)>) -> PlanFiles<'a> {
        PlanFiles {
            active: files.active_arc(),
            flushing: files.flushing_arc(),
            clean: files.clean_arc(),
            scratch,
        }
    }
}

/// Why a plan cannot be served as chunks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PlanError {
    #[error("segment at buffer offset {buf_offset} needs block {block} from the object store")]
    Remote { buf_offset: u64, block: u64 },
    #[error(
        "segment at buffer offset {buf_offset} reads the flushing file, but the gate has none"
    )]
    NoFlushingFile { buf_offset: u64 },
    #[error("segments do not cover the request: expected offset {expected}, found a segment at {found} (request length {len})")]
    Coverage { expected: u64, found: u64, len: u32 },
    #[error("segments end at {end}, request length is {len}")]
    Length { end: u64, len: u32 },
    #[error("segment of {len} bytes at buffer offset {buf_offset} does not fit a chunk")]
    TooLarge { buf_offset: u64, len: u64 },
}

/// Appends to `out` the chunks that serve a READ of `len` bytes planned as `segments`.
/// On error `out` may hold a partial list; do not submit it.
pub(crate) fn read_chunks(
    segments: &[Segment],
    len: u32,
    files: &PlanFiles<'_>,
    out: &mut Vec<Chunk>,
) -> Result<(), PlanError> {
    let mut expected = 0u64;
    for seg in segments {
        if seg.buf_offset != expected {
            return Err(PlanError::Coverage {
                expected,
                found: seg.buf_offset,
                len,
            });
        }
        let too_large = PlanError::TooLarge {
            buf_offset: seg.buf_offset,
            len: seg.len,
        };
        let (Ok(n), Ok(at)) = (u32::try_from(seg.len), u32::try_from(seg.buf_offset)) else {
            return Err(too_large);
        };
        let chunk = match seg.source {
            Source::Active { file_offset } => Chunk::read_into(files.active, file_offset, n, at),
            Source::Flushing { file_offset } => {
                let file = files.flushing.ok_or(PlanError::NoFlushingFile {
                    buf_offset: seg.buf_offset,
                })?;
                Chunk::read_into(file, file_offset, n, at)
            }
            Source::Clean { file_offset } => Chunk::read_into(files.clean, file_offset, n, at),
            Source::Zeros => Chunk::zeros(n, at),
            Source::Remote { block, .. } => match files.scratch {
                Some((file, slot)) => Chunk::read_into(file, slot + seg.buf_offset, n, at),
                None => {
                    return Err(PlanError::Remote {
                        buf_offset: seg.buf_offset,
                        block,
                    })
                }
            },
        };
        if n > 0 {
            out.push(chunk);
        }
        expected += seg.len;
    }
    if expected != u64::from(len) {
        return Err(PlanError::Length { end: expected, len });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Stand-ins for the gate's files and the scratch memfd (only their identity matters).
    struct TestFiles([Arc<File>; 4]);

    impl TestFiles {
        fn new() -> TestFiles {
            TestFiles(std::array::from_fn(|_| {
                Arc::new(tempfile::tempfile().unwrap())
            }))
        }

        /// Active, flushing and clean; no scratch.
        fn plan(&self) -> PlanFiles<'_> {
            PlanFiles {
                active: &self.0[0],
                flushing: Some(&self.0[1]),
                clean: &self.0[2],
                scratch: None,
            }
        }

        fn scratch(&self) -> &Arc<File> {
            &self.0[3]
        }
    }

    fn seg(buf_offset: u64, len: u64, source: Source) -> Segment {
        Segment {
            buf_offset,
            len,
            source,
        }
    }

    /// Every byte of [0, len) covered exactly once, in order.
    fn assert_covers(chunks: &[Chunk], len: u32) {
        let mut at = 0;
        for c in chunks {
            assert_eq!(c.buf_offset(), at, "chunks {chunks:?}");
            at += c.len();
        }
        assert_eq!(at, len);
    }

    #[test]
    fn local_sources_and_holes_cover_the_request() {
        let segs = [
            seg(0, 4096, Source::Active { file_offset: 65536 }),
            seg(4096, 8192, Source::Zeros),
            seg(
                12288,
                512,
                Source::Flushing {
                    file_offset: 1 << 20,
                },
            ),
            seg(12800, 3584, Source::Clean { file_offset: 7 }),
        ];
        let t = TestFiles::new();
        let files = t.plan();
        let mut out = Vec::new();
        read_chunks(&segs, 16384, &files, &mut out).unwrap();
        assert_covers(&out, 16384);
        assert_eq!(out[0], Chunk::read_into(files.active, 65536, 4096, 0));
        assert_eq!(out[1], Chunk::zeros(8192, 4096));
        assert!(out[1].file().is_none(), "a hole reads no file");
        let flushing = files.flushing.unwrap();
        assert_eq!(out[2], Chunk::read_into(flushing, 1 << 20, 512, 12288));
        assert_eq!(out[3], Chunk::read_into(files.clean, 7, 3584, 12800));
    }

    #[test]
    fn remote_pieces_read_from_the_scratch_slot() {
        let segs = [
            seg(0, 4096, Source::Clean { file_offset: 0 }),
            seg(
                4096,
                65536,
                Source::Remote {
                    block: 1,
                    within: 0,
                },
            ),
            seg(
                69632,
                4096,
                Source::Remote {
                    block: 2,
                    within: 0,
                },
            ),
        ];
        let t = TestFiles::new();
        let mut out = Vec::new();
        assert_eq!(
            read_chunks(&segs, 73728, &t.plan(), &mut out),
            Err(PlanError::Remote {
                buf_offset: 4096,
                block: 1
            })
        );
        let files = PlanFiles {
            scratch: Some((t.scratch(), 5 << 20)),
            ..t.plan()
        };
        out.clear();
        read_chunks(&segs, 73728, &files, &mut out).unwrap();
        assert_covers(&out, 73728);
        let scratch = t.scratch();
        assert_eq!(
            out[1],
            Chunk::read_into(scratch, (5 << 20) + 4096, 65536, 4096)
        );
        assert_eq!(
            out[2],
            Chunk::read_into(scratch, (5 << 20) + 69632, 4096, 69632)
        );
    }

    #[test]
    fn gaps_overlaps_and_short_plans_are_refused() {
        let t = TestFiles::new();
        let files = t.plan();
        let mut out = Vec::new();
        let gap = [seg(0, 512, Source::Zeros), seg(1024, 512, Source::Zeros)];
        assert!(matches!(
            read_chunks(&gap, 1536, &files, &mut out),
            Err(PlanError::Coverage {
                expected: 512,
                found: 1024,
                ..
            })
        ));
        let overlap = [seg(0, 1024, Source::Zeros), seg(512, 512, Source::Zeros)];
        assert!(read_chunks(&overlap, 1024, &files, &mut out).is_err());
        let short = [seg(0, 512, Source::Zeros)];
        assert_eq!(
            read_chunks(&short, 1024, &files, &mut out),
            Err(PlanError::Length {
                end: 512,
                len: 1024
            })
        );
        assert_eq!(
            read_chunks(&[], 1024, &files, &mut out),
            Err(PlanError::Length { end: 0, len: 1024 })
        );
        let no_flushing = PlanFiles {
            flushing: None,
            ..files
        };
        assert_eq!(
            read_chunks(
                &[seg(0, 512, Source::Flushing { file_offset: 0 })],
                512,
                &no_flushing,
                &mut out
            ),
            Err(PlanError::NoFlushingFile { buf_offset: 0 })
        );
    }

    #[test]
    fn a_plan_from_the_cache_translates_exactly() {
        // A real plan over a fresh cache: everything is a hole.
        let dir = tempfile::tempdir().unwrap();
        let geo = glidefs_volume::cache::Geometry::new(1 << 20, 65536).unwrap();
        let cache = glidefs_volume::cache::Cache::open(
            dir.path(),
            geo,
            glidefs_volume::cache::CacheOptions::default(),
        )
        .unwrap();
        cache.write(70000, &[7u8; 1000]).unwrap();
        let gate = cache.try_enter().unwrap();
        let mut plan = glidefs_volume::cache::ReadPlan::default();
        glidefs_volume::cache::read::plan_read(&cache, &gate, 4096, 131072, &mut plan).unwrap();
        let mut out = Vec::new();
        read_chunks(
            plan.segments(),
            131072,
            &PlanFiles::of(&gate, None),
            &mut out,
        )
        .unwrap();
        assert_covers(&out, 131072);
        assert!(out.iter().any(|c| matches!(c, Chunk::Zeros { .. })));
        assert!(out.iter().any(|c| matches!(
            c,
            Chunk::ReadInto { file, .. } if Arc::ptr_eq(file, gate.active_arc())
        )));
    }
}
