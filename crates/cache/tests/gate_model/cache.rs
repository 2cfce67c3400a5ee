//! The cache of the model: the real concurrency core (`glidefs_cache::loom_api::Core`: gate,
//! state map, stripe locks, fill epoch), the cache files and the object store's copy as loom
//! atomics, and the invariants (the steps that use them are in `steps.rs`).
//!
//! Sizes: `BLOCKS` blocks of `PAGES` pages; a page holds a version number (0 = never
//! written), so "which write is this?" is a plain comparison.

use glidefs_cache::loom_api::{flushing_gen, BlockState, Core, Gate, OwnedStripeGuard, REMOTE};
use loom::sync::atomic::Ordering::SeqCst;
use loom::sync::atomic::{AtomicU16, AtomicU8};

use super::Variant;

pub(crate) const BLOCKS: usize = 2;
pub(crate) const PAGES: usize = 2;
/// Data files `data.<gen>`: the first active one and one per rotation.
pub(crate) const GENS: usize = 3;

/// A block's bytes: one version per page.
pub(crate) type Block = [u8; PAGES];

/// What a block holds when a model starts.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Init {
    /// Never written.
    Empty,
    /// Dirty in the first active file.
    Dirty(Block),
    /// Clean (clean file = object store), REMOTE.
    Clean(Block),
    /// Only in the object store: NotPresent + REMOTE.
    Remote(Block),
}

/// One sparse cache file: a loom atomic per page. pwrite/pread of the page cache are
/// coherent, so both are SeqCst (loom then returns the newest store ordered before a read).
#[derive(Debug)]
pub(crate) struct File([[AtomicU8; PAGES]; BLOCKS]);

impl File {
    fn new(init: impl Fn(usize) -> Block) -> Self {
        File(std::array::from_fn(|b| {
            let d = init(b);
            std::array::from_fn(|p| AtomicU8::new(d[p]))
        }))
    }

    pub(crate) fn pread(&self, b: usize) -> Block {
        std::array::from_fn(|p| self.0[b][p].load(SeqCst))
    }

    pub(crate) fn pwrite(&self, b: usize, pages: Span, data: Block) {
        for p in pages.pages() {
            self.0[b][p].store(data[p], SeqCst);
        }
    }
}

/// Which pages of a block a write covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Span {
    Full,
    Page(usize),
}

impl Span {
    pub(crate) fn pages(self) -> std::ops::Range<usize> {
        match self {
            Span::Full => 0..PAGES,
            Span::Page(p) => p..p + 1,
        }
    }
}

/// `write.rs::LockMode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LockMode {
    Wait,
    Try,
}

/// `read.rs::Source` (per block: the model reads whole blocks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    Active,
    Flushing,
    Clean,
    Remote,
    Zeros,
}

/// A source file of a promotion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum From {
    Flushing,
    Clean,
}

/// `write.rs::WriteTicket`: holds the block's stripe lock when the block changes state.
#[derive(Debug)]
pub(crate) struct Ticket {
    pub(crate) block: usize,
    pub(crate) transition: bool,
    /// Broken variant `Promote::AfterData`: the promotion that should have run in prepare.
    pub(crate) late_promote: Option<From>,
    pub(crate) _stripe: Option<OwnedStripeGuard>,
}

/// `write.rs::WritePrep`.
#[derive(Debug)]
pub(crate) enum Prep {
    Ready(Ticket),
    NeedsFetch,
    WouldBlock,
}

/// `flush.rs::Rotation`.
#[derive(Debug)]
pub(crate) struct Rotation {
    pub(crate) gen: u64,
    pub(crate) blocks: Vec<usize>,
}

/// `evict.rs::FillToken`: the fill epoch before the fetch.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FillToken(pub(crate) u64);

#[derive(Debug)]
pub(crate) struct Cache {
    pub(crate) v: Variant,
    /// The real rotation gate, state map, stripe locks and fill epoch.
    pub(crate) core: Core,
    data: [File; GENS],
    pub(crate) clean: File,
    /// The object store's copy of each block as the published manifest points at it (pack
    /// and manifest entry as one value: a manifest is published atomically).
    pub(crate) remote: [AtomicU16; BLOCKS],
    /// Test bookkeeping, not part of the protocol: per page the version of the last write
    /// whose request completed (stored after completion, read by requests that start later).
    completed: [[AtomicU8; PAGES]; BLOCKS],
}

pub(crate) fn pack(d: Block) -> u16 {
    u16::from(d[0]) | u16::from(d[1]) << 8
}

pub(crate) fn unpack(v: u16) -> Block {
    [v as u8, (v >> 8) as u8]
}

impl Cache {
    pub(crate) fn new(v: Variant, init: [Init; BLOCKS]) -> Self {
        let state = |i: Init| match i {
            Init::Empty => 0,
            Init::Dirty(_) => BlockState::Dirty as u8,
            Init::Clean(_) => BlockState::Clean as u8 | REMOTE,
            Init::Remote(_) => REMOTE,
        };
        let bytes = |i: Init| match i {
            Init::Empty => [0; PAGES],
            Init::Dirty(d) | Init::Clean(d) | Init::Remote(d) => d,
        };
        Cache {
            v,
            core: Core::new(v.faults, &init.map(state)),
            data: std::array::from_fn(|g| {
                File::new(|b| match init[b] {
                    Init::Dirty(d) if g == 0 => d,
                    _ => [0; PAGES],
                })
            }),
            clean: File::new(|b| match init[b] {
                Init::Clean(d) => d,
                _ => [0; PAGES],
            }),
            remote: std::array::from_fn(|b| match init[b] {
                Init::Clean(d) | Init::Remote(d) => AtomicU16::new(pack(d)),
                _ => AtomicU16::new(0),
            }),
            completed: std::array::from_fn(|b| {
                let d = bytes(init[b]);
                std::array::from_fn(|p| AtomicU8::new(d[p]))
            }),
        }
    }

    /// `StateMap::raw` (Acquire load).
    pub(crate) fn raw(&self, b: usize) -> u8 {
        self.core.raw(b as u64)
    }

    pub(crate) fn state(&self, b: usize) -> BlockState {
        self.core.info(b as u64).state
    }

    pub(crate) fn file(&self, gen: u64) -> &File {
        &self.data[gen as usize]
    }

    /// `gate.rs::Files::active` under a gate.
    pub(crate) fn active(&self, gate: &Gate) -> &File {
        self.file(gate.active_gen())
    }

    pub(crate) fn flushing(&self, gate: &Gate, b: usize) -> &File {
        // `write.rs::Cache::missing_flushing`: a Syncing block with no flushing file.
        let gen = flushing_gen(gate).unwrap_or_else(|| {
            panic!("corrupt: block {b} is Syncing but no flushing file is open")
        });
        self.file(gen)
    }

    /// `cache.rs::Cache::flush` (the guest's FLUSH): `current_files` takes the gate briefly
    /// (`gate.read()`) to find the files to fdatasync; the syncs themselves are not modelled.
    /// Returns the (active, flushing) generations.
    pub(crate) fn flush(&self) -> (u64, Option<u64>) {
        self.core.current_gens()
    }

    // ---- bookkeeping and the invariants ----

    /// Records that a write request completed (after its commit).
    pub(crate) fn completed(&self, b: usize, span: Span, v: u8) {
        for p in span.pages() {
            self.completed[b][p].store(v, SeqCst);
        }
    }

    /// The versions of the writes completed so far: what a request starting now must see.
    pub(crate) fn floor(&self, b: usize) -> Block {
        std::array::from_fn(|p| self.completed[b][p].load(SeqCst))
    }

    /// Invariant 1: a read returns, per page, the last write completed before it began or a
    /// newer one: never an older version, never zeros for a written page.
    pub(crate) fn check_read(&self, b: usize, floor: Block, got: Block) {
        for p in 0..PAGES {
            assert!(
                got[p] >= floor[p],
                "stale read: block {b} page {p} read version {} but version {} completed \
                 before the read began",
                got[p],
                floor[p]
            );
        }
    }

    /// Invariant 2, once every actor finished: the block's state and the file (or object
    /// store copy) it points at give every page its last written version, and a Clean block's
    /// clean copy is the object store's copy.
    pub(crate) fn check_final(&self) {
        let (active, flushing) = self.flush();
        for b in 0..BLOCKS {
            let want = self.floor(b);
            let raw = self.raw(b);
            let st = self.state(b);
            let got = match st {
                BlockState::Dirty => self.file(active).pread(b),
                BlockState::Syncing => self
                    .file(flushing.expect("Syncing without flushing"))
                    .pread(b),
                BlockState::Clean => self.clean.pread(b),
                BlockState::NotPresent if raw & REMOTE != 0 => self.fetch(b),
                BlockState::NotPresent => [0; PAGES],
            };
            for p in 0..PAGES {
                assert!(
                    got[p] == want[p],
                    "lost write: at the end block {b} ({st:?}) page {p} holds version {} but \
                     the last write was version {}",
                    got[p],
                    want[p]
                );
            }
            if st == BlockState::Clean {
                let remote = self.fetch(b);
                assert!(
                    got == remote,
                    "clean copy differs from the object store: block {b} {got:?} vs {remote:?}"
                );
            }
        }
    }
}
