//! The steps of glidefs-cache, each a restatement of the real function it names (file::function,
//! paths relative to crates/cache/src unless stated), over the real gate, state map, stripe
//! locks and fill epoch (`Core`): every state transition, lock and epoch access here is the
//! real code's; what is restated is the order of the steps and the file I/O. Where the model
//! leaves something out, the comment says what.

use glidefs_cache::loom_api::{BlockState, Gate, Writer, NO_FILL, STATE_MASK};
use loom::sync::atomic::Ordering::SeqCst;

use super::cache::{
    pack, unpack, Block, Cache, FillToken, From, LockMode, Prep, Rotation, Source, Span, Ticket,
    BLOCKS, GENS, PAGES,
};
use super::Promote;

impl Cache {
    // ---- write.rs ----

    /// `write.rs::Cache::prepare` (`prepare_write`): a Dirty block needs nothing; otherwise
    /// the stripe lock, `NeedsFetch` for a partial write of a remote-only block, and for a
    /// partial write promote-before-write of a Clean / Syncing block into the active file.
    pub(crate) fn prepare_write(&self, gate: &Gate, b: usize, span: Span, mode: LockMode) -> Prep {
        if self.state(b) == BlockState::Dirty {
            return Prep::Ready(Ticket {
                block: b,
                transition: false,
                late_promote: None,
                _stripe: None,
            });
        }
        // The stripes of the blocks that are (still) not Dirty; a block that turned Dirty
        // meanwhile stays Dirty under the gate and needs no lock.
        let stripe = if self.state(b) == BlockState::Dirty {
            None
        } else {
            Some(match mode {
                LockMode::Wait => self.core.lock_stripe_arc(b as u64),
                LockMode::Try => match self.core.try_lock_stripe_arc(b as u64) {
                    Some(g) => g,
                    None => return Prep::WouldBlock,
                },
            })
        };
        // Under the stripe lock (or Dirty) the block's state is stable.
        let info = self.core.info(b as u64);
        let partial = span != Span::Full;
        if partial && info.state == BlockState::NotPresent && info.remote {
            return Prep::NeedsFetch;
        }
        let mut late_promote = None;
        let src = match info.state {
            _ if !partial => None, // a full-block write needs no old bytes
            BlockState::Syncing => Some(From::Flushing),
            BlockState::Clean => Some(From::Clean),
            // `cover`: the active file is extended to the block's end; the model's files
            // already read as zeros there.
            BlockState::NotPresent | BlockState::Dirty => None,
        };
        if let Some(src) = src {
            match self.v.promote {
                Promote::BeforeData => self.promote(gate, src, b),
                Promote::AfterData => late_promote = Some(src),
                Promote::Skip => {}
            }
        }
        Prep::Ready(Ticket {
            block: b,
            transition: true,
            late_promote,
            _stripe: stripe,
        })
    }

    /// `write.rs::Cache::promote`: the block's current bytes into the active file.
    fn promote(&self, gate: &Gate, src: From, b: usize) {
        let data = match src {
            From::Flushing => self.flushing(gate, b).pread(b),
            From::Clean => self.clean.pread(b),
        };
        self.active(gate).pwrite(b, Span::Full, data);
    }

    /// The data lands in the active file at the ticket's offset: `Cache::write_with`'s
    /// pwrite, or the kernel's WRITE_FIXED chunk of `target/write.rs::write_action`.
    pub(crate) fn land(&self, gate: &Gate, b: usize, span: Span, v: u8) {
        self.active(gate).pwrite(b, span, [v; PAGES]);
    }

    /// `write.rs::Cache::commit_write`: (the Dirty WAL record, not modelled, then) the Dirty
    /// state (`turn_dirty`); dropping the ticket releases the stripe lock.
    pub(crate) fn commit_write(&self, gate: &Gate, ticket: Ticket) {
        if let Some(src) = ticket.late_promote {
            self.promote(gate, src, ticket.block); // broken variant: after the data landed
        }
        if ticket.transition {
            self.core.set_dirty(ticket.block as u64);
        }
        drop(ticket);
    }

    // ---- flush.rs ----

    /// `flush.rs::Cache::rotate`: the new generation from a brief read of the gate, then under
    /// the write gate the state map's rotation (`StateMap::rotate`: the dirty list's blocks
    /// turn Syncing) and the active file becomes the flushing file (a fresh, empty one is
    /// active). The admin lock and `FlushPending` are not modelled: one actor flushes.
    pub(crate) fn rotate(&self) -> Option<Rotation> {
        let new_gen = self.core.current_gens().0 + 1;
        assert!(
            new_gen < GENS as u64,
            "model: more rotations than data files"
        );
        let mut w = self.core.write_gate(Writer::Rotate);
        let mut blocks: Vec<usize> = self.core.rotate().into_iter().map(|b| b as usize).collect();
        if blocks.is_empty() {
            return None;
        }
        blocks.sort_unstable();
        let old = w.active_gen();
        assert_eq!(
            old + 1,
            new_gen,
            "model: rotations are serialised (admin lock)"
        );
        w.rotate_to(new_gen);
        drop(w);
        Some(Rotation { gen: old, blocks })
    }

    /// `flush.rs::Cache::read_for_flush`: under a read gate, the block from the flushing
    /// file; staged into the clean file if it is still Syncing. (This is where the block
    /// reaches the clean file; `complete_flush` only changes states.)
    pub(crate) fn read_for_flush(&self, b: usize) -> Block {
        let gate = self.core.enter();
        let data = self.flushing(&gate, b).pread(b);
        if self.state(b) == BlockState::Syncing {
            self.clean.pwrite(b, Span::Full, data);
        }
        data
    }

    /// `volume/src/sync.rs::flush_rotation`: packs uploaded, manifest published (no gate).
    pub(crate) fn publish(&self, b: usize, data: Block) {
        self.remote[b].store(pack(data), SeqCst);
    }

    /// `flush.rs::Cache::complete_flush`: a brief read of the gate for the clean file's
    /// fdatasync (not modelled), then under the write gate the epoch bump and each rotated
    /// block's transition (`StateMap::complete_rotated`: still Syncing → Clean + REMOTE,
    /// written meanwhile → stays Dirty, gets REMOTE), and the flushing file is dropped.
    pub(crate) fn complete_flush(&self, rot: &Rotation) {
        self.core.current_gens();
        let mut w = self.core.write_gate(Writer::CompleteFlush);
        assert_eq!(
            w.flushing_gen(),
            Some(rot.gen),
            "complete_flush: wrong generation"
        );
        self.core.bump_epoch();
        for &b in &rot.blocks {
            self.core.complete_rotated(b as u64);
        }
        w.end_flush();
    }

    // ---- evict.rs ----

    /// `evict.rs::Cache::evict_to` with a budget of 0: victims are the Clean blocks without
    /// NO_FILL (picked with no gate; CLOCK's second chance is not modelled); under the write
    /// gate `StateMap::evict_clean` (the ones still Clean become NotPresent + NO_FILL) and the
    /// epoch bump; after the gate, `sync_log` (its `current_files` takes a brief read gate;
    /// the syncs are not modelled), then the holes are punched and NO_FILL cleared. The real
    /// early return when the resident bytes fit the budget is left out (budget 0: the model
    /// always evicts).
    pub(crate) fn evict(&self) -> usize {
        let mut victims: Vec<u64> = (0..BLOCKS as u64)
            .filter(|&b| {
                let raw = self.core.raw(b);
                raw & STATE_MASK == BlockState::Clean as u8 && raw & NO_FILL == 0
            })
            .collect();
        {
            let _w = self.core.write_gate(Writer::Evict);
            self.core.evict_clean(&mut victims);
            self.core.bump_epoch();
        }
        if victims.is_empty() {
            return 0;
        }
        self.core.current_gens(); // sync_log → current_files
        for &b in &victims {
            self.clean.pwrite(b as usize, Span::Full, [0; PAGES]); // punch_hole
            self.core.end_eviction(b);
        }
        victims.len()
    }

    /// `evict.rs::Cache::fill_token`.
    pub(crate) fn fill_token(&self) -> FillToken {
        FillToken(self.core.fill_token())
    }

    /// The object store read of `volume/src/fetch.rs::Fetcher::fetch_once` (manifest lookup
    /// + pack range GET): the block as currently published.
    pub(crate) fn fetch(&self, b: usize) -> Block {
        unpack(self.remote[b].load(SeqCst))
    }

    /// `evict.rs::Cache::fill_clean`: under the block's stripe lock (no gate), the real check
    /// (`StateMap::fillable`: the epoch is the token's, the block is NotPresent, NO_FILL is
    /// clear), then the fetched bytes into the clean file and the block Clean
    /// (`StateMap::filled`).
    pub(crate) fn fill_clean(&self, token: FillToken, b: usize, data: Block) -> bool {
        let _stripe = self.core.lock_stripe(b as u64);
        if !self.core.fillable(b as u64, token.0) {
            return false;
        }
        self.clean.pwrite(b, Span::Full, data);
        // (the Fill WAL record, not modelled)
        self.core.filled(b as u64);
        true
    }

    // ---- read.rs ----

    /// `read.rs::plan_read`: where the block's bytes are, valid under `gate` only (the
    /// CLOCK bit a Clean block gets is not modelled).
    pub(crate) fn plan_read(&self, gate: &Gate, b: usize) -> Source {
        let info = self.core.info(b as u64);
        match info.state {
            BlockState::Dirty => Source::Active,
            BlockState::Syncing => {
                let _ = self.flushing(gate, b); // `missing_flushing` check
                Source::Flushing
            }
            BlockState::Clean => Source::Clean,
            BlockState::NotPresent if info.remote => Source::Remote,
            BlockState::NotPresent => Source::Zeros,
        }
    }

    /// The READ_FIXED chunks of `target/plan.rs::read_chunks` (file descriptors taken from
    /// the gate passed here) for a local source.
    pub(crate) fn read_local(&self, gate: &Gate, b: usize, src: Source) -> Block {
        match src {
            Source::Active => self.active(gate).pread(b),
            Source::Flushing => self.flushing(gate, b).pread(b),
            Source::Clean => self.clean.pread(b),
            Source::Zeros => [0; PAGES],
            Source::Remote => unreachable!("remote pieces are served from scratch"),
        }
    }
}
