//! The read path: plan per range where the bytes come from, or read them directly.
//!
//! A plan is only valid under the [`Gate`] it was made with: rotation (which moves Dirty
//! blocks to the flushing file) and eviction (which punches clean blocks) take the write side,
//! so file offsets in a plan cannot go stale while the gate is held. State changes that do
//! happen under a read gate keep the planned source valid: a promoted block's old bytes stay in
//! the flushing/clean file, and a fill only turns a Remote answer into a local one.

use std::os::unix::fs::FileExt;

use crate::cache::Cache;
use crate::error::{CacheError, Result};
use crate::gate::Gate;
use crate::state::BlockState;

/// Where one piece of a read comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// `gate.active()` at this offset.
    Active { file_offset: u64 },
    /// `gate.flushing()` at this offset.
    Flushing { file_offset: u64 },
    /// `gate.clean()` at this offset.
    Clean { file_offset: u64 },
    /// Not local: bytes `within..within+len` of `block` in the object store (a cold read;
    /// stage them in scratch memory, never in the active file).
    Remote { block: u64, within: u64 },
    /// Never written: zeros.
    Zeros,
}

/// One piece of a read: `len` bytes for the caller's buffer at `buf_offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub buf_offset: u64,
    pub len: u64,
    pub source: Source,
}

/// A reusable read plan (keep one per queue tag: planning does not allocate once warm).
#[derive(Debug, Default, Clone)]
pub struct ReadPlan {
    segments: Vec<Segment>,
}

impl ReadPlan {
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// Blocks that must be fetched from the object store.
    pub fn remote_blocks(&self) -> impl Iterator<Item = u64> + '_ {
        self.segments.iter().filter_map(|s| match s.source {
            Source::Remote { block, .. } => Some(block),
            _ => None,
        })
    }

    /// Whether every byte can be served from local files or zeros.
    pub fn is_local(&self) -> bool {
        self.remote_blocks().next().is_none()
    }

    fn push(&mut self, seg: Segment) {
        if let Some(last) = self.segments.last_mut() {
            let contiguous = |a: u64, b: u64| a + last.len == b;
            let merge = match (last.source, seg.source) {
                (Source::Active { file_offset: a }, Source::Active { file_offset: b })
                | (Source::Flushing { file_offset: a }, Source::Flushing { file_offset: b })
                | (Source::Clean { file_offset: a }, Source::Clean { file_offset: b }) => {
                    contiguous(a, b)
                }
                (Source::Zeros, Source::Zeros) => true,
                _ => false,
            };
            if merge {
                last.len += seg.len;
                return;
            }
        }
        self.segments.push(seg);
    }
}

/// Answer of the plain `read_into`.
#[derive(Debug, PartialEq, Eq)]
pub enum ReadOutcome {
    Done,
    /// These blocks are only in the object store; fetch them and call again with them.
    NeedsFetch(Vec<u64>),
}

/// A fetched block handed back to `read_into`.
#[derive(Debug, Clone, Copy)]
pub struct Fetched<'a> {
    pub block: u64,
    pub data: &'a [u8],
}

/// Plans a read of `len` bytes at `offset` under `gate` into `plan` (cleared first): where
/// each piece's bytes are now, valid while `gate` is held. Never waits and does no file I/O
/// (the ublk target's inline READ calls it on its loop thread). A function of the cache
/// called by path (`glidefs_cache::read::plan_read`), like the volume's `fast_path`: the
/// calls alone lead from a request to here.
pub fn plan_read(
    cache: &Cache,
    gate: &Gate,
    offset: u64,
    len: u64,
    plan: &mut ReadPlan,
) -> Result<()> {
    cache.check_gate(gate);
    cache.alive()?;
    cache.geo().check_range(offset, len)?;
    plan.segments.clear();
    let bs = cache.geo().bs();
    let mut buf_offset = 0;
    for (block, within, n) in cache.geo().pieces(offset, len) {
        let file_offset = block * bs + within;
        let info = cache.states.get(block);
        let source = match info.state {
            BlockState::Dirty => Source::Active { file_offset },
            BlockState::Syncing => {
                if gate.flushing().is_none() {
                    return Err(cache.missing_flushing(block));
                }
                Source::Flushing { file_offset }
            }
            BlockState::Clean => {
                cache.states.touch(block);
                Source::Clean { file_offset }
            }
            BlockState::NotPresent if info.remote => Source::Remote { block, within },
            BlockState::NotPresent => Source::Zeros,
        };
        plan.push(Segment {
            buf_offset,
            len: n,
            source,
        });
        buf_offset += n;
    }
    Ok(())
}

impl Cache {
    /// Plain read (USER_COPY and tests): takes the gate and reads into `buf`. Remote blocks are
    /// served from `fetched` when present there, otherwise reported as `NeedsFetch` (the
    /// buffer is then incomplete; call again with the fetched blocks).
    pub fn read_into(
        &self,
        offset: u64,
        buf: &mut [u8],
        fetched: &[Fetched<'_>],
    ) -> Result<ReadOutcome> {
        let gate = self.enter();
        self.read_with(&gate, offset, buf, fetched)
    }

    /// Plain read under a gate the caller already holds: [`plan_read`], then
    /// [`Cache::copy_planned`].
    pub fn read_with(
        &self,
        gate: &Gate,
        offset: u64,
        buf: &mut [u8],
        fetched: &[Fetched<'_>],
    ) -> Result<ReadOutcome> {
        let mut plan = ReadPlan::default();
        plan_read(self, gate, offset, buf.len() as u64, &mut plan)?;
        self.copy_planned(gate, &plan, buf, fetched)
    }

    /// Carries out `plan` (made under `gate`, which the caller still holds) by copying: local
    /// pieces are read from the gate's files, holes are zeros, remote pieces come from
    /// `fetched` (whole blocks). Remote blocks missing there are reported as `NeedsFetch`
    /// (the buffer is then incomplete). `buf` is the plan's whole range.
    pub fn copy_planned(
        &self,
        gate: &Gate,
        plan: &ReadPlan,
        buf: &mut [u8],
        fetched: &[Fetched<'_>],
    ) -> Result<ReadOutcome> {
        self.check_gate(gate);
        let bs = self.geo().bs();
        let mut missing = Vec::new();
        for seg in plan.segments() {
            let range = usize::try_from(seg.buf_offset)
                .ok()
                .zip(usize::try_from(seg.buf_offset + seg.len).ok())
                .filter(|&(_, end)| end <= buf.len())
                .ok_or(CacheError::BadLength {
                    expected: (seg.buf_offset + seg.len) as usize,
                    got: buf.len(),
                })?;
            let dst = &mut buf[range.0..range.1];
            let (file, file_offset) = match seg.source {
                Source::Active { file_offset } => (gate.active(), file_offset),
                Source::Flushing { file_offset } => (
                    gate.flushing()
                        .ok_or_else(|| self.missing_flushing(file_offset / bs))?,
                    file_offset,
                ),
                Source::Clean { file_offset } => (gate.clean(), file_offset),
                Source::Zeros => {
                    dst.fill(0);
                    continue;
                }
                Source::Remote { block, within } => {
                    match fetched.iter().find(|f| f.block == block) {
                        Some(f) if f.data.len() as u64 == bs => {
                            let from = within as usize;
                            dst.copy_from_slice(&f.data[from..from + dst.len()]);
                        }
                        Some(f) => {
                            return Err(CacheError::BadLength {
                                expected: bs as usize,
                                got: f.data.len(),
                            })
                        }
                        None => missing.push(block),
                    }
                    continue;
                }
            };
            file.read_exact_at(dst, file_offset)
                .map_err(|e| CacheError::io("pread", &self.dir, e))?;
        }
        missing.dedup();
        Ok(if missing.is_empty() {
            ReadOutcome::Done
        } else {
            ReadOutcome::NeedsFetch(missing)
        })
    }
}
