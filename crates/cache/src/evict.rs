//! Eviction under a disk budget, and cold fills.
//!
//! Eviction (CLOCK order, Clean blocks only — Dirty and Syncing never leave):
//! 1. pick victims (a block touched since the hand last passed gets a second chance);
//! 2. write gate: each victim still Clean becomes NotPresent + NO_FILL, an Evict record is
//!    appended, the fill epoch is bumped;
//! 3. data files, then WAL sync (an evicted block must never come back as Clean over a
//!    punched hole; the sync also covers other buffered records, whose data goes first);
//! 4. punch the holes, clear NO_FILL. If step 3 fails (full disk) the blocks stay NotPresent +
//!    NO_FILL and the next sync that succeeds punches them (see `space`).
//!
//! Fills: the volume takes a [`FillToken`] before it looks up a block's remote location and
//! fetches it; `fill_clean` stores the bytes only if the block is still NotPresent, not being
//! punched, and no eviction or flush completion happened since the token (the fetched bytes
//! could otherwise be an older version). Fills write the clean file only, never the active one.
//!
//! A fill takes no gate, only the block's stripe lock: callers may hold a [`crate::Gate`] (a
//! deferred zero-copy read keeps its request's gate while it fetches), and taking the gate
//! again would deadlock behind a queued rotation. The stripe lock is enough: a NotPresent
//! block leaves that state only through a write (which takes the stripe lock) or a fill, so
//! the state cannot change under the fill; the clean file is never replaced; eviction and
//! flush completion bump the epoch, which the fill checks under the stripe lock. A checkpoint
//! taken between the Fill record and the state change records the block NotPresent: the fill
//! is merely forgotten (fetched again later).

use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;

use crate::cache::Cache;
use crate::crash::{CrashPoint, IoOp};
use crate::error::{CacheError, Result};
use crate::state::{BlockState, NO_FILL, REFERENCED};
use crate::wal::Record;

/// Proof of the cache epoch when a fetch started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FillToken(u64);

impl Cache {
    /// Bytes of local cache in use (Clean + Dirty + Syncing blocks).
    pub fn resident_bytes(&self) -> u64 {
        let s = self.stats();
        (s.clean + s.dirty + s.syncing) * self.geo().bs()
    }

    /// Evicts Clean blocks until resident bytes fit in `budget` (or no Clean block is left).
    /// Returns the number of evicted blocks.
    pub fn evict_to(&self, budget: u64) -> Result<u64> {
        let _admin = self.admin.lock();
        self.alive()?;
        // Holes an earlier eviction could not punch (its sync failed): they come first.
        if !self.deferred.lock().punch.is_empty() {
            self.sync_log()?;
        }
        let resident = self.resident_bytes() / self.geo().bs();
        let keep = budget / self.geo().bs();
        if resident <= keep {
            return Ok(0);
        }
        let want = resident - keep;
        // The hand visits allocated leaves only (a block in a missing leaf is NotPresent):
        // at most two sweeps of them, O(touched blocks), never of the whole volume.
        let n = self.states.len();
        let sweep = 2 * self.states.leaves() * crate::state::LEAF_BLOCKS;
        let mut victims = Vec::new();
        let mut hand = self.clock_hand.load(Ordering::Relaxed) % n;
        for _ in 0..sweep {
            if victims.len() as u64 >= want {
                break;
            }
            hand = match self
                .states
                .allocated_from(hand)
                .or_else(|| self.states.allocated_from(0))
            {
                Some(b) => b,
                None => break,
            };
            let raw = self.states.raw(hand);
            if raw & 0b11 == BlockState::Clean as u8 && raw & NO_FILL == 0 {
                if raw & REFERENCED != 0 {
                    self.states.clear_bits(hand, REFERENCED);
                } else {
                    victims.push(hand);
                }
            }
            hand = (hand + 1) % n;
        }
        self.clock_hand.store(hand, Ordering::Relaxed);
        self.evict_victims(victims)
    }

    /// Drops the Clean copies of `blocks` (any order; blocks in any other state, or past
    /// the end, are left as they are), and refuses every fill whose [`FillToken`] predates
    /// the call: the caller changed what the store holds for these blocks (a read-only
    /// export adopting the writer's newer manifest), so neither a copy it holds nor one a
    /// fetch started before brings back may be served. A fill that already passed its token
    /// check when this starts holds its block's stripe lock until its block is Clean: this
    /// bumps the epoch, then takes and releases every stripe lock, so such a fill has
    /// finished (and its block is dropped here with the others) and every later one sees the
    /// new epoch. Returns the number of blocks dropped; durable like an eviction (the Evict
    /// records are synced before the holes are punched). Even when it fails, the blocks it
    /// reached are NotPresent in memory (never served from the cache again).
    ///
    /// `unmapped` (blocks the caller's new map names nowhere) lose their remote bit before
    /// their copies go. The caller clears it when it swaps its map too, but a fill past its
    /// check sets it again as it stores its copy; only here, once every such fill has
    /// finished and no later one can pass, does the bit stay clear. Left set, the block would
    /// read as remote with no location (every read of it an error). In memory only until
    /// the next [`Cache::checkpoint`], like [`Cache::clear_remote`].
    pub fn drop_clean(&self, blocks: &[u64], unmapped: &[u64]) -> Result<u64> {
        self.epoch.bump();
        for stripe in self.stripes.iter() {
            drop(stripe.lock());
        }
        // Before any copy goes: a reader that finds the block NotPresent finds it not remote.
        self.clear_remote(unmapped.iter().copied());
        let _admin = self.admin.lock();
        self.alive()?;
        // Holes an earlier failed sync deferred. Its failure does not stop the drop: the
        // victims still leave Clean in memory below (the caller's map changed already).
        let holes = !self.deferred.lock().punch.is_empty();
        let deferred = if holes { self.sync_log() } else { Ok(()) };
        let n = self.states.len();
        let victims: Vec<u64> = blocks
            .iter()
            .copied()
            .filter(|&b| b < n && self.states.get(b).state == BlockState::Clean)
            .collect();
        let dropped = self.evict_victims(victims);
        deferred?;
        dropped
    }

    /// Evicts `victims` (steps 2-4 of the module docs); call it holding the admin lock.
    fn evict_victims(&self, mut victims: Vec<u64>) -> Result<u64> {
        victims.sort_unstable();
        victims.dedup();
        let mut seqs = Vec::with_capacity(victims.len());
        let clean = {
            let files = self.write_gate(crate::gate::Holder::Evict);
            // Every victim leaves Clean before anything can fail (`drop_clean` relies on it).
            self.states.evict_clean(&mut victims);
            self.epoch.bump();
            for &b in &victims {
                seqs.push(self.wal.append_buffered(Record::Evict { block: b })?);
            }
            files.clean.clone()
        };
        if victims.is_empty() {
            return Ok(0);
        }
        if let Err(e) = self.sync_log() {
            // The holes wait for a sync that makes the Evict records durable (see `space`).
            let mut d = self.deferred.lock();
            d.punch
                .extend(seqs.into_iter().zip(victims.iter().copied()));
            return Err(e);
        }
        self.crash_point(CrashPoint::BeforeHolePunch)?;
        let bs = self.geo().bs();
        for &b in &victims {
            crate::sys::punch_hole(&clean, b * bs, bs)
                .map_err(|e| CacheError::io("punch hole", &self.dir, e))?;
            self.states.end_eviction(b);
        }
        Ok(victims.len() as u64)
    }

    /// Whether an eviction of `block` is between its write gate and its hole punch (NO_FILL):
    /// until it ends, `fill_clean` refuses the block, so a writer that needs the block's old
    /// bytes should wait for this to clear before fetching again rather than retry at once.
    pub fn eviction_pending(&self, block: u64) -> bool {
        self.states.raw(block) & NO_FILL != 0
    }

    /// Takes a fill token; do this *before* looking up where a block lives remotely.
    pub fn fill_token(&self) -> FillToken {
        FillToken(self.epoch.get())
    }

    /// Stores a fetched block (exactly one block of bytes) as Clean, if still allowed (see the
    /// module docs). Returns whether it was stored (`false`: refused, the bytes may be stale).
    /// A failed write of the clean file (full disk) is an `Io` error: the block stays
    /// NotPresent, the cache carries on `degraded`, and the caller may still serve the bytes.
    pub fn fill_clean(&self, token: FillToken, block: u64, data: &[u8]) -> Result<bool> {
        self.fill(token, block, data, None)
    }

    /// [`Cache::fill_clean`] of bytes whose crc32c the caller already checked equals `crc`
    /// (a fetch verifies each block against its location's raw crc): the fill's WAL record
    /// takes it instead of hashing the block again. A wrong `crc` would make a later check
    /// of the block (scrub, replay) report it corrupt; debug builds assert it.
    pub fn fill_clean_crc(
        &self,
        token: FillToken,
        block: u64,
        data: &[u8],
        crc: u32,
    ) -> Result<bool> {
        debug_assert_eq!(crc32c::crc32c(data), crc, "fill_clean_crc of block {block}");
        self.fill(token, block, data, Some(crc))
    }

    fn fill(&self, token: FillToken, block: u64, data: &[u8], crc: Option<u32>) -> Result<bool> {
        let bs = self.geo().block_size() as usize;
        if data.len() != bs {
            return Err(CacheError::BadLength {
                expected: bs,
                got: data.len(),
            });
        }
        self.geo()
            .check_range(block * self.geo().bs(), self.geo().bs())?;
        let _stripe = self.stripes[self.stripe(block)].lock();
        self.alive()?;
        if !self.states.fillable(block, &self.epoch, token.0) {
            return Ok(false);
        }
        let r = crate::crash::check(&*self.hook, IoOp::Fill)
            .and_then(|()| self.clean.write_all_at(data, block * self.geo().bs()));
        if let Err(e) = r {
            // A fill is only a copy: the caller serves the fetched bytes and the block stays
            // NotPresent (the error says why it was not stored; the cache carries on,
            // degraded). Punch what landed (the block is NotPresent, we hold its stripe).
            self.punch_blocks(&self.clean, std::iter::once(block));
            return self.note(Err(CacheError::io("fill pwrite", &self.dir, e)));
        }
        self.wal.append(Record::Fill {
            block,
            crc: crc.unwrap_or_else(|| crc32c::crc32c(data)),
        })?;
        self.states.filled(block);
        Ok(true)
    }
}
