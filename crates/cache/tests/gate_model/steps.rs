//! The steps of glidefs-cache, each a restatement of the real function it names (file::function,
//! paths relative to crates/cache/src unless stated). Where the model leaves something out,
//! the comment says what.

use loom::sync::atomic::Ordering::{AcqRel, Acquire, SeqCst};

use super::cache::{
    pack, unpack, Block, Cache, FillToken, From, LockMode, Prep, Rotation, Source, Span, St,
    Ticket, BLOCKS, GENS, NO_FILL, PAGES, REMOTE,
};
use super::gate::Gate;
use super::{FillChecks, Promote};

impl Cache {
    // ---- write.rs ----

    /// `write.rs::Cache::prepare` (`prepare_write`): a Dirty block needs nothing; otherwise
    /// the stripe lock, `NeedsFetch` for a partial write of a remote-only block, and for a
    /// partial write promote-before-write of a Clean / Syncing block into the active file.
    pub(crate) fn prepare_write<'a>(
        &'a self,
        gate: &Gate<'_>,
        b: usize,
        span: Span,
        mode: LockMode,
    ) -> Prep<'a> {
        if self.state(b) == St::Dirty {
            return Prep::Ready(Ticket {
                block: b,
                transition: false,
                late_promote: None,
                _stripe: None,
            });
        }
        // The stripes of the blocks that are (still) not Dirty; a block that turned Dirty
        // meanwhile stays Dirty under the gate and needs no lock.
        let stripe = if self.state(b) == St::Dirty {
            None
        } else {
            Some(match mode {
                LockMode::Wait => self.stripes[b].lock().unwrap(),
                LockMode::Try => match self.stripes[b].try_lock() {
                    Ok(g) => g,
                    Err(_) => return Prep::WouldBlock,
                },
            })
        };
        // Under the stripe lock (or Dirty) the block's state is stable.
        let raw = self.raw(b);
        let partial = span != Span::Full;
        if partial && St::of(raw) == St::NotPresent && raw & REMOTE != 0 {
            return Prep::NeedsFetch;
        }
        let mut late_promote = None;
        let src = match St::of(raw) {
            _ if !partial => None, // a full-block write needs no old bytes
            St::Syncing => Some(From::Flushing),
            St::Clean => Some(From::Clean),
            // `cover`: the active file is extended to the block's end; the model's files
            // already read as zeros there.
            St::NotPresent | St::Dirty => None,
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
    fn promote(&self, gate: &Gate<'_>, src: From, b: usize) {
        let data = match src {
            From::Flushing => self.flushing(gate, b).pread(b),
            From::Clean => self.clean.pread(b),
        };
        self.active(gate).pwrite(b, Span::Full, data);
    }

    /// The data lands in the active file at the ticket's offset: `Cache::write_with`'s
    /// pwrite, or the kernel's WRITE_FIXED chunk of `target/write.rs::write_action`.
    pub(crate) fn land(&self, gate: &Gate<'_>, b: usize, span: Span, v: u8) {
        self.active(gate).pwrite(b, span, [v; PAGES]);
    }

    /// `write.rs::Cache::commit_write`: (the Dirty WAL record, not modelled, then) the Dirty
    /// state, Release; dropping the ticket releases the stripe lock.
    pub(crate) fn commit_write(&self, gate: &Gate<'_>, ticket: Ticket<'_>) {
        if let Some(src) = ticket.late_promote {
            self.promote(gate, src, ticket.block); // broken variant: after the data landed
        }
        if ticket.transition {
            self.change(ticket.block, St::Dirty, 0, 0);
        }
        drop(ticket);
    }

    // ---- flush.rs ----

    /// `flush.rs::Cache::rotate`: under the write gate every Dirty block becomes Syncing and
    /// the active file becomes the flushing file (a fresh, empty one is active). The real
    /// code takes the blocks from the state map's dirty list (`take_dirty`); the model scans
    /// its blocks under the write gate, which finds the same ones (only commits, under a
    /// read gate, add to that list). The admin lock and `FlushPending` are not modelled: one
    /// actor flushes. The new generation is read under a brief read gate first, as the real
    /// code does (`self.gate.read().active_gen + 1`).
    pub(crate) fn rotate(&self) -> Option<Rotation> {
        let new_gen = self.enter().files.active + 1;
        assert!(new_gen < GENS, "model: more rotations than data files");
        let mut w = self.gate.write();
        let blocks: Vec<usize> = (0..BLOCKS)
            .filter(|&b| self.state(b) == St::Dirty)
            .collect();
        if blocks.is_empty() {
            return None;
        }
        for &b in &blocks {
            self.change(b, St::Syncing, 0, 0);
        }
        let old = w.files.active;
        assert_eq!(
            old + 1,
            new_gen,
            "model: rotations are serialised (admin lock)"
        );
        w.files.flushing = Some(old);
        w.files.active = new_gen;
        drop(w);
        Some(Rotation { gen: old, blocks })
    }

    /// `flush.rs::Cache::read_for_flush`: under a read gate, the block from the flushing
    /// file; staged into the clean file if it is still Syncing. (This is where the block
    /// reaches the clean file; `complete_flush` only changes states.)
    pub(crate) fn read_for_flush(&self, b: usize) -> Block {
        let gate = self.enter();
        let data = self.flushing(&gate, b).pread(b);
        if self.state(b) == St::Syncing {
            self.clean.pwrite(b, Span::Full, data);
        }
        data
    }

    /// `volume/src/sync.rs::flush_rotation`: packs uploaded, manifest published (no gate).
    pub(crate) fn publish(&self, b: usize, data: Block) {
        self.remote[b].store(pack(data), SeqCst);
    }

    /// `flush.rs::Cache::complete_flush`: under the write gate, blocks still Syncing become
    /// Clean + REMOTE (blocks written meanwhile stay Dirty and only get REMOTE), the epoch is
    /// bumped and the flushing file is dropped. First, as in the real code, a brief read
    /// gate to get the clean file for its fdatasync (the sync is not modelled).
    pub(crate) fn complete_flush(&self, rot: &Rotation) {
        drop(self.enter());
        let mut w = self.gate.write();
        assert_eq!(
            w.files.flushing,
            Some(rot.gen),
            "complete_flush: wrong generation"
        );
        for &b in &rot.blocks {
            if self.v.complete_unchecked || self.state(b) == St::Syncing {
                self.change(b, St::Clean, REMOTE, 0);
            } else {
                self.set_bits(b, REMOTE);
            }
        }
        self.epoch.fetch_add(1, AcqRel);
        w.files.flushing = None;
    }

    // ---- evict.rs ----

    /// `evict.rs::Cache::evict_to` with a budget of 0: victims are the Clean blocks without
    /// NO_FILL (picked with no gate; CLOCK's second chance is not modelled); under the write
    /// gate the ones still Clean become NotPresent + NO_FILL and the epoch is bumped; after
    /// the gate, `sync_log` (its `current_files` takes a brief read gate; the syncs are not
    /// modelled), then the holes are punched and NO_FILL cleared. The real early return
    /// when the resident bytes fit the budget is left out (budget 0: the model always
    /// evicts).
    pub(crate) fn evict(&self) -> usize {
        let mut victims: Vec<usize> = (0..BLOCKS)
            .filter(|&b| {
                let raw = self.raw(b);
                St::of(raw) == St::Clean && raw & NO_FILL == 0
            })
            .collect();
        {
            let _w = self.gate.write();
            victims.retain(|&b| self.state(b) == St::Clean);
            for &b in &victims {
                self.set_bits(b, NO_FILL);
                self.change(b, St::NotPresent, 0, 0);
            }
            self.epoch.fetch_add(1, AcqRel);
        }
        if victims.is_empty() {
            return 0;
        }
        drop(self.enter()); // sync_log → current_files
        for &b in &victims {
            self.clean.pwrite(b, Span::Full, [0; PAGES]); // punch_hole
            self.clear_bits(b, NO_FILL);
        }
        victims.len()
    }

    /// `evict.rs::Cache::fill_token`.
    pub(crate) fn fill_token(&self) -> FillToken {
        FillToken(self.epoch.load(Acquire))
    }

    /// The object store read of `volume/src/fetch.rs::Fetcher::fetch_once` (manifest lookup
    /// + pack range GET): the block as currently published.
    pub(crate) fn fetch(&self, b: usize) -> Block {
        unpack(self.remote[b].load(SeqCst))
    }

    /// `evict.rs::Cache::fill_clean`: under the block's stripe lock (no gate), stores the
    /// fetched bytes in the clean file and marks the block Clean, only if the epoch is the
    /// token's, the block is NotPresent and NO_FILL is clear.
    pub(crate) fn fill_clean(&self, token: FillToken, b: usize, data: Block) -> bool {
        let _stripe = self.stripes[b].lock().unwrap();
        let raw = self.raw(b);
        let epoch_ok = self.epoch.load(Acquire) == token.0;
        let not_present = St::of(raw) == St::NotPresent;
        let no_fill = raw & NO_FILL != 0;
        let ok = match self.v.fill {
            FillChecks::All => epoch_ok && not_present && !no_fill,
            FillChecks::EpochOnly => epoch_ok,
            FillChecks::EpochAndNotPresent => epoch_ok && not_present,
            FillChecks::StateOnly => not_present && !no_fill,
        };
        if !ok {
            return false;
        }
        self.clean.pwrite(b, Span::Full, data);
        // (the Fill WAL record, not modelled)
        self.set_bits(b, REMOTE);
        self.change(b, St::Clean, 0, 0);
        true
    }

    // ---- read.rs ----

    /// `read.rs::Cache::plan_read`: where the block's bytes are, valid under `gate` only.
    pub(crate) fn plan_read(&self, gate: &Gate<'_>, b: usize) -> Source {
        let raw = self.raw(b);
        match St::of(raw) {
            St::Dirty => Source::Active,
            St::Syncing => {
                let _ = self.flushing(gate, b); // `missing_flushing` check
                Source::Flushing
            }
            St::Clean => Source::Clean,
            St::NotPresent if raw & REMOTE != 0 => Source::Remote,
            St::NotPresent => Source::Zeros,
        }
    }

    /// The READ_FIXED chunks of `target/plan.rs::read_chunks` (file descriptors taken from
    /// the gate passed here) for a local source.
    pub(crate) fn read_local(&self, gate: &Gate<'_>, b: usize, src: Source) -> Block {
        match src {
            Source::Active => self.active(gate).pread(b),
            Source::Flushing => self.flushing(gate, b).pread(b),
            Source::Clean => self.clean.pread(b),
            Source::Zeros => [0; PAGES],
            Source::Remote => unreachable!("remote pieces are served from scratch"),
        }
    }
}
