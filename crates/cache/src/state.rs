//! The block state map: compact, sparse, lock-free to read (page checksums live in `crcs`).
//!
//! One byte per block: bits 0-1 the [`BlockState`], bit 2 `REMOTE` (a durable copy exists in
//! the object store), bit 3 `REFERENCED` (CLOCK bit for eviction), bit 4 `NO_FILL` (an
//! eviction is punching this block's hole: cold fills must not store it), bit 5 `CRCS` (the
//! live CRC store may hold page CRCs of this block, see `crcs`), bit 6 `ROTATED` (the block
//! belongs to the pending rotation, see below). Bits 3-5 live in memory only.
//!
//! `ROTATED`: set by the rotation on every block it moves to Syncing, cleared by the flush's
//! completion. A write to a Syncing block promotes it to Dirty, but the block still belongs
//! to the rotation: its bytes as of the rotation stay in the flushing file, and the flush
//! publishes them (the store must get the image of one moment: the rotation's; publishing
//! the rotation without its promoted blocks would pair their old store versions with the
//! newer blocks around them, an image the volume never had). The bit is persisted (the
//! checkpoint and the replay of Rotate / FlushDone), so the rotation recovered after a crash
//! names the same blocks as the one that was lost.
//!
//! Sparse: the bytes sit in leaves of [`LEAF_BLOCKS`] blocks (4 KiB), reached through a
//! two-level table (a dense top of `ceil(blocks / 2 Mi)` slots, then mids of 512 leaf slots,
//! 8 KiB each). The map can grow (online resize, [`StateMap::grow`]): the top's slots never
//! move, growth adds segments of slots after them (see `Top`), so readers still take no lock. A leaf and its mid are allocated the first time a block in them gets a
//! non-zero byte, and never freed; a block in a missing leaf reads as 0 (NotPresent, not
//! remote). Reads are two `OnceLock::get`s (an Acquire load each) and an atomic load: no lock.
//! A volume that was never written costs a few bytes per 256 GiB (at 128 KiB blocks); each
//! touched 512 MiB region costs one 4 KiB leaf (+ an 8 KiB mid per touched 256 GiB).
//!
//! Who changes a state: writes (under the gate and the block's stripe lock, after the WAL
//! record was appended: Release store, Acquire load — a reader that sees `Dirty` also sees the
//! record in the WAL buffer); rotation, flush completion and eviction under the write gate;
//! fills under the stripe lock (no gate: see `evict`). Readers only load.
//!
//! Counts: the map also keeps the number of blocks per state and with `REMOTE`, so
//! `Cache::stats` is O(1) instead of a scan of every block. Every change of a state byte goes
//! through `set_state` / `set_bits` / `clear_bits`, whose atomic read-modify-write returns the
//! byte it replaced; the counters are adjusted by exactly that old → new difference, so they
//! equal a scan whenever no change is in flight (a concurrent reader may see one transition
//! half counted; counts never read below zero).
//!
//! Dirty set: every transition into `Dirty` (found the same way, from the old byte) appends
//! the block to a list; [`StateMap::take_dirty`] hands the list over. Only rotation takes it
//! (under the write gate) and only rotation moves a block out of `Dirty`, so between two
//! rotations the list holds exactly the Dirty blocks, each once: rotation is O(dirty blocks),
//! never a scan of the map.
//!
//! Beside the map: the stripe locks ([`Stripes`]) and the fill epoch ([`FillEpoch`]), and the
//! protocol's transitions of a block that more than the write path takes part in (rotation,
//! flush completion, eviction, the fill check), so the model check (`tests/gate_model.rs`,
//! `--cfg loom`) runs this code. Atomics and locks come from `crate::sync`.

use std::sync::{Arc, OnceLock};

use crate::sync::{AtomicI64, AtomicU64, AtomicU8, Mutex, Ordering, UnitMutex};

/// Where a block's current bytes live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum BlockState {
    /// No local bytes: zeros, or the object store when `remote` is set.
    NotPresent = 0,
    /// In the clean file, equal to the object store's copy.
    Clean = 1,
    /// In the active file, newer than the object store.
    Dirty = 2,
    /// In the flushing file, being uploaded.
    Syncing = 3,
}

pub(crate) const STATE_MASK: u8 = 0b11;
pub(crate) const REMOTE: u8 = 0b100;
pub(crate) const REFERENCED: u8 = 0b1000;
pub(crate) const NO_FILL: u8 = 0b1_0000;
/// The live CRC store may hold CRCs of this block (see `crcs`).
pub(crate) const CRCS: u8 = 0b10_0000;
/// The block belongs to the pending rotation (Syncing, or promoted to Dirty since): see the
/// module docs.
pub(crate) const ROTATED: u8 = 0b100_0000;
/// Bits that survive in a checkpoint.
pub(crate) const PERSISTED: u8 = STATE_MASK | REMOTE | ROTATED;

/// Blocks per leaf (one 4 KiB page of state bytes).
#[cfg(not(loom))]
pub(crate) const LEAF_BLOCKS: u64 = 4096;
/// The model check's maps are a few blocks: a leaf of loom atomics that fits them.
#[cfg(loom)]
pub(crate) const LEAF_BLOCKS: u64 = 4;
/// Leaves per mid.
const MID_LEAVES: u64 = 512;
const MID_BLOCKS: u64 = LEAF_BLOCKS * MID_LEAVES;

type Leaf = [AtomicU8; LEAF_BLOCKS as usize];
type Mid = [OnceLock<Box<Leaf>>; MID_LEAVES as usize];
type Slots = Box<[OnceLock<Box<Mid>>]>;

/// Growth segments of the top table: with `b` slots at creation, segment `k` holds `b * 2^k`
/// slots (top indices `b * 2^k .. b * 2^(k+1)`); 44 cover every block index a u64 can name.
const GROWTH_SEGMENTS: usize = 44;

/// The top table: slot `t` points at the mid of blocks `t * MID_BLOCKS ..`. The slots of the
/// map's size at creation are allocated with it (as before resizes existed); growth past them
/// adds whole segments, each as large as all slots before it, so no slot ever moves and a
/// reader needs no lock: a slot is two `OnceLock::get`s further away than the first ones.
#[derive(Debug)]
struct Top {
    first: Slots,
    growth: OnceLock<Box<[OnceLock<Slots>; GROWTH_SEGMENTS]>>,
}

impl Top {
    fn new(slots: u64) -> Self {
        Self {
            first: (0..slots).map(|_| OnceLock::new()).collect(),
            growth: OnceLock::new(),
        }
    }

    /// Slots allocated at creation (at least 1 for the segment arithmetic).
    fn base(&self) -> u64 {
        (self.first.len() as u64).max(1)
    }

    /// (growth segment, index in it) of top slot `t` (`t` past the first slots).
    fn locate(&self, t: u64) -> (usize, usize) {
        let base = self.base();
        let q = t / base; // >= 1
        let k = 63 - q.leading_zeros() as u64;
        let start = base << k;
        (k as usize, (t - start) as usize)
    }

    /// Slot `t`, if it was allocated.
    fn get(&self, t: u64) -> Option<&OnceLock<Box<Mid>>> {
        if let Some(s) = self.first.get(t as usize) {
            return Some(s);
        }
        let (k, i) = self.locate(t);
        self.growth.get()?.get(k)?.get()?.get(i)
    }

    /// Slot `t`, allocating its growth segment when needed.
    fn get_or_alloc(&self, t: u64) -> &OnceLock<Box<Mid>> {
        if let Some(s) = self.first.get(t as usize) {
            return s;
        }
        let (k, i) = self.locate(t);
        let base = self.base();
        let seg = self
            .growth
            .get_or_init(|| Box::new([const { OnceLock::new() }; GROWTH_SEGMENTS]))[k]
            .get_or_init(|| (0..base << k).map(|_| OnceLock::new()).collect());
        &seg[i]
    }

    /// Slots allocated (first slots plus growth segments).
    fn slots(&self) -> u64 {
        let grown: u64 = self.growth.get().map_or(0, |g| {
            g.iter()
                .filter_map(|s| s.get().map(|s| s.len() as u64))
                .sum()
        });
        self.first.len() as u64 + grown
    }

    /// Every allocated slot with its index, ascending.
    fn iter(&self) -> impl Iterator<Item = (u64, &OnceLock<Box<Mid>>)> {
        let base = self.base();
        let first = self.first.iter().enumerate().map(|(t, s)| (t as u64, s));
        let grown = self.growth.get().into_iter().flat_map(move |g| {
            g.iter().enumerate().flat_map(move |(k, seg)| {
                seg.get().into_iter().flat_map(move |seg| {
                    seg.iter()
                        .enumerate()
                        .map(move |(i, s)| ((base << k) + i as u64, s))
                })
            })
        });
        first.chain(grown)
    }
}

/// A decoded state byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockInfo {
    pub state: BlockState,
    pub remote: bool,
}

impl BlockInfo {
    pub(crate) fn from_bits(b: u8) -> Self {
        let state = match b & STATE_MASK {
            0 => BlockState::NotPresent,
            1 => BlockState::Clean,
            2 => BlockState::Dirty,
            _ => BlockState::Syncing,
        };
        Self {
            state,
            remote: b & REMOTE != 0,
        }
    }
}

/// Blocks per [`BlockState`] (indexed by its value) and blocks with a remote copy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Counts {
    pub per_state: [u64; 4],
    pub remote: u64,
}

/// `count` consecutive blocks from `first` whose persisted bits are `bits` (never 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Run {
    pub first: u64,
    pub count: u64,
    pub bits: u8,
}

/// One atomic byte per block in lazily allocated leaves, plus counts maintained on every
/// change and the list of blocks that became Dirty (see module docs).
#[derive(Debug)]
pub(crate) struct StateMap {
    /// Blocks in the map; only grows (`grow`).
    len: AtomicU64,
    top: Top,
    /// Signed: a transition's decrement may land before the increment of the one before it.
    per_state: [AtomicI64; 4],
    remote: AtomicI64,
    leaves: AtomicU64,
    mids: AtomicU64,
    dirty: Mutex<Vec<u64>>,
    /// The model check's broken variants (see `loom_api`).
    #[cfg(loom)]
    pub(crate) faults: crate::loom_faults::Faults,
}

impl StateMap {
    /// An all-NotPresent map of `num_blocks` blocks (allocates only the top table).
    pub(crate) fn new(num_blocks: u64) -> Self {
        Self {
            len: AtomicU64::new(num_blocks),
            top: Top::new(num_blocks.div_ceil(MID_BLOCKS)),
            per_state: [
                AtomicI64::new(num_blocks as i64),
                AtomicI64::new(0),
                AtomicI64::new(0),
                AtomicI64::new(0),
            ],
            remote: AtomicI64::new(0),
            leaves: AtomicU64::new(0),
            mids: AtomicU64::new(0),
            dirty: Mutex::new(Vec::new()),
            #[cfg(loom)]
            faults: crate::loom_faults::Faults::default(),
        }
    }

    /// A map holding `runs` (persisted bits only; runs beyond the map are ignored).
    pub(crate) fn from_runs(num_blocks: u64, runs: &[Run]) -> Self {
        let map = Self::new(num_blocks);
        for r in runs {
            let end = r.first.saturating_add(r.count).min(num_blocks);
            for b in r.first..end {
                map.set_bits(b, r.bits & PERSISTED);
            }
        }
        map
    }

    /// The counts, O(1).
    pub(crate) fn counts(&self) -> Counts {
        let get = |a: &AtomicI64| a.load(Ordering::Relaxed).max(0) as u64;
        Counts {
            per_state: [0, 1, 2, 3].map(|i| get(&self.per_state[i])),
            remote: get(&self.remote),
        }
    }

    /// The counts by looking at every allocated leaf (tests).
    #[cfg(test)]
    pub(crate) fn scan(&self) -> Counts {
        let mut c = Counts::default();
        let mut seen = 0;
        self.for_each_leaf(|first, leaf| {
            let n = leaf_len(first, self.len());
            seen += n;
            for b in &leaf[..n as usize] {
                let raw = b.load(Ordering::Acquire);
                c.per_state[usize::from(raw & STATE_MASK)] += 1;
                c.remote += u64::from(raw & REMOTE != 0);
            }
        });
        c.per_state[0] += self.len() - seen;
        c
    }

    /// Accounts one change of `block`'s byte from `old` to `new`.
    fn moved(&self, block: u64, old: u8, new: u8) {
        let (from, to) = (old & STATE_MASK, new & STATE_MASK);
        if from != to {
            self.per_state[usize::from(from)].fetch_sub(1, Ordering::Relaxed);
            self.per_state[usize::from(to)].fetch_add(1, Ordering::Relaxed);
            if to == BlockState::Dirty as u8 {
                self.dirty.lock().push(block);
            }
        }
        match (old & REMOTE != 0, new & REMOTE != 0) {
            (false, true) => self.remote.fetch_add(1, Ordering::Relaxed),
            (true, false) => self.remote.fetch_sub(1, Ordering::Relaxed),
            _ => 0,
        };
    }

    pub(crate) fn len(&self) -> u64 {
        self.len.load(Ordering::Acquire)
    }

    /// Grows the map to `num_blocks` blocks (a smaller number changes nothing): the new blocks
    /// are NotPresent and not remote. Lock-free for readers; call it from one thread at a
    /// time (the cache: under its admin lock), before anything may address the new blocks.
    pub(crate) fn grow(&self, num_blocks: u64) {
        let old = self.len();
        if num_blocks <= old {
            return;
        }
        self.per_state[BlockState::NotPresent as usize]
            .fetch_add((num_blocks - old) as i64, Ordering::Relaxed);
        self.len.store(num_blocks, Ordering::Release);
    }

    /// Leaves allocated so far (each [`LEAF_BLOCKS`] bytes).
    pub(crate) fn leaves(&self) -> u64 {
        self.leaves.load(Ordering::Relaxed)
    }

    /// Heap bytes held: the top table, mids, leaves and the dirty list.
    pub(crate) fn heap_bytes(&self) -> u64 {
        let slot = std::mem::size_of::<OnceLock<Box<Mid>>>() as u64;
        self.top.slots() * slot
            + self.mids.load(Ordering::Relaxed) * std::mem::size_of::<Mid>() as u64
            + self.leaves() * LEAF_BLOCKS
            + self.dirty.lock().capacity() as u64 * 8
    }

    fn index(block: u64) -> (usize, usize, usize) {
        (
            (block / MID_BLOCKS) as usize,
            ((block / LEAF_BLOCKS) % MID_LEAVES) as usize,
            (block % LEAF_BLOCKS) as usize,
        )
    }

    /// The block's byte, if its leaf exists.
    fn slot(&self, block: u64) -> Option<&AtomicU8> {
        let (t, m, l) = Self::index(block);
        Some(&self.top.get(t as u64)?.get()?[m].get()?[l])
    }

    /// The block's byte, allocating its leaf (and mid) on first touch. Panics beyond the map
    /// (as the dense map's indexing did): callers check ranges first.
    fn slot_alloc(&self, block: u64) -> &AtomicU8 {
        let (t, m, l) = Self::index(block);
        let len = self.len();
        assert!(block < len, "block {block} beyond {len} blocks");
        let mid = self.top.get_or_alloc(t as u64).get_or_init(|| {
            self.mids.fetch_add(1, Ordering::Relaxed);
            Box::new([const { OnceLock::new() }; MID_LEAVES as usize])
        });
        let leaf = mid[m].get_or_init(|| {
            self.leaves.fetch_add(1, Ordering::Relaxed);
            new_leaf()
        });
        &leaf[l]
    }

    pub(crate) fn raw(&self, block: u64) -> u8 {
        self.slot(block).map_or(0, |s| s.load(Ordering::Acquire))
    }

    pub(crate) fn get(&self, block: u64) -> BlockInfo {
        BlockInfo::from_bits(self.raw(block))
    }

    /// Sets the state, keeping the other bits.
    pub(crate) fn set_state(&self, block: u64, state: BlockState) {
        self.set_state_clearing(block, state, 0);
    }

    /// Sets the state and clears `clear` (other bits kept), in one atomic step.
    pub(crate) fn set_state_clearing(&self, block: u64, state: BlockState, clear: u8) {
        self.change(block, state, 0, clear);
    }

    /// Sets the state, sets `set` and clears `clear` (other bits kept), in one atomic step.
    pub(crate) fn change(&self, block: u64, state: BlockState, set: u8, clear: u8) {
        if state == BlockState::NotPresent && set == 0 && self.slot(block).is_none() {
            return; // already 0
        }
        let slot = self.slot_alloc(block);
        let mut cur = slot.load(Ordering::Relaxed);
        loop {
            let next = (cur & !STATE_MASK & !clear) | set | state as u8;
            match slot.compare_exchange_weak(cur, next, Ordering::Release, Ordering::Relaxed) {
                Ok(_) => return self.moved(block, cur, next),
                Err(now) => cur = now,
            }
        }
    }

    pub(crate) fn set_bits(&self, block: u64, bits: u8) {
        if bits == 0 {
            return;
        }
        let old = self.slot_alloc(block).fetch_or(bits, Ordering::AcqRel);
        self.moved(block, old, old | bits);
    }

    pub(crate) fn clear_bits(&self, block: u64, bits: u8) {
        let Some(slot) = self.slot(block) else {
            return; // already 0
        };
        let old = slot.fetch_and(!bits, Ordering::AcqRel);
        self.moved(block, old, old & !bits);
    }

    /// Marks a block recently used (CLOCK); a plain load when already marked. (Changes only
    /// `REFERENCED`, which no count covers.)
    pub(crate) fn touch(&self, block: u64) {
        let Some(slot) = self.slot(block) else {
            return; // NotPresent: nothing to mark
        };
        if slot.load(Ordering::Relaxed) & REFERENCED == 0 {
            slot.fetch_or(REFERENCED, Ordering::Relaxed);
        }
    }

    /// Sets `CRCS` (SeqCst: the CRC protocol in `crcs` orders it against epoch bumps).
    pub(crate) fn mark_crcs(&self, block: u64) {
        self.slot_alloc(block).fetch_or(CRCS, Ordering::SeqCst);
    }

    /// Whether `CRCS` is set (SeqCst load, see `mark_crcs`).
    pub(crate) fn has_crcs(&self, block: u64) -> bool {
        self.slot(block)
            .is_some_and(|s| s.load(Ordering::SeqCst) & CRCS != 0)
    }

    /// Hands over the blocks that became Dirty since the last call (unordered, each once).
    pub(crate) fn take_dirty(&self) -> Vec<u64> {
        std::mem::take(&mut *self.dirty.lock())
    }

    /// Whether no block became Dirty since the last `take_dirty`.
    pub(crate) fn dirty_is_empty(&self) -> bool {
        self.dirty.lock().is_empty()
    }

    /// A copy of the list `take_dirty` would return, ascending.
    pub(crate) fn dirty_blocks(&self) -> Vec<u64> {
        let mut v = self.dirty.lock().clone();
        v.sort_unstable();
        v
    }

    /// Calls `f(first block, leaf)` for every allocated leaf, ascending.
    fn for_each_leaf(&self, mut f: impl FnMut(u64, &Leaf)) {
        for (t, mid) in self.top.iter() {
            let Some(mid) = mid.get() else { continue };
            for (m, leaf) in mid.iter().enumerate() {
                if let Some(leaf) = leaf.get() {
                    f(t * MID_BLOCKS + m as u64 * LEAF_BLOCKS, leaf);
                }
            }
        }
    }

    /// The persisted bits of every block, as maximal runs of equal non-zero values, ascending.
    /// O(allocated leaves); takes no lock (concurrent changes may or may not be seen).
    pub(crate) fn runs(&self) -> Vec<Run> {
        let mut out: Vec<Run> = Vec::new();
        let len = self.len();
        self.for_each_leaf(|first, leaf| {
            for (i, b) in leaf[..leaf_len(first, len) as usize].iter().enumerate() {
                let bits = b.load(Ordering::Acquire) & PERSISTED;
                if bits == 0 {
                    continue;
                }
                let block = first + i as u64;
                match out.last_mut() {
                    Some(r) if r.bits == bits && r.first + r.count == block => r.count += 1,
                    _ => out.push(Run {
                        first: block,
                        count: 1,
                        bits,
                    }),
                }
            }
        });
        out
    }

    /// The first block at or after `block` whose leaf is allocated, if any.
    pub(crate) fn allocated_from(&self, mut block: u64) -> Option<u64> {
        while block < self.len() {
            let (t, m, _) = Self::index(block);
            match self.top.get(t as u64).and_then(OnceLock::get) {
                None => block = (t as u64 + 1) * MID_BLOCKS,
                Some(mid) if mid[m].get().is_none() => {
                    block = (block / LEAF_BLOCKS + 1) * LEAF_BLOCKS;
                }
                Some(_) => return Some(block),
            }
        }
        None
    }
}

/// Blocks of the leaf starting at `first` that lie inside a map of `len` blocks.
fn leaf_len(first: u64, len: u64) -> u64 {
    LEAF_BLOCKS.min(len - first)
}

#[cfg(not(loom))]
fn new_leaf() -> Box<Leaf> {
    Box::new([const { AtomicU8::new(0) }; LEAF_BLOCKS as usize])
}

#[cfg(loom)]
fn new_leaf() -> Box<Leaf> {
    Box::new(std::array::from_fn(|_| AtomicU8::new(0)))
}

/// How a rotated block left its flush (`flush::Cache::complete_flush`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flushed {
    /// Published and staged in the clean file.
    Staged,
    /// Published, but its staging failed: no clean copy.
    Unstaged,
    /// Published unmapped (all zeros): no pack holds it.
    Unmapped,
}

impl StateMap {
    /// Rotation's transition, under the write gate: every block that became Dirty since the
    /// last rotation (each once) turns Syncing and `ROTATED`; their `CRCS` bit goes (their
    /// CRCs move with the store, see `crcs`). Returns those blocks, unordered.
    pub(crate) fn rotate(&self) -> Vec<u64> {
        let blocks = self.take_dirty();
        for &b in &blocks {
            self.change(b, BlockState::Syncing, ROTATED, CRCS);
        }
        blocks
    }

    /// Flush completion's transition of rotated block `b`, under the write gate: a block
    /// still Syncing becomes Clean + REMOTE (`Staged`), NotPresent + REMOTE (`Unstaged`) or
    /// NotPresent without REMOTE (`Unmapped`); a block promoted since stays Dirty with the
    /// rotation's version in the store (REMOTE, unless unmapped). `ROTATED` goes either way.
    pub(crate) fn complete_rotated(&self, b: u64, how: Flushed) {
        let syncing = self.get(b).state == BlockState::Syncing;
        #[cfg(loom)]
        let syncing = syncing || self.faults.complete_unchecked;
        match how {
            Flushed::Unmapped if syncing => {
                self.change(b, BlockState::NotPresent, 0, REMOTE | ROTATED);
            }
            Flushed::Unmapped => self.clear_bits(b, REMOTE | ROTATED),
            _ if !syncing => {
                self.set_bits(b, REMOTE);
                self.clear_bits(b, ROTATED);
            }
            Flushed::Unstaged => self.change(b, BlockState::NotPresent, REMOTE, ROTATED),
            Flushed::Staged => self.change(b, BlockState::Clean, REMOTE, ROTATED),
        }
    }

    /// Eviction's transition, under the write gate: keeps the victims that are still Clean
    /// and turns each NotPresent with `NO_FILL` set (fills refused until its hole is
    /// punched: [`StateMap::end_eviction`]).
    pub(crate) fn evict_clean(&self, victims: &mut Vec<u64>) {
        victims.retain(|&b| self.get(b).state == BlockState::Clean);
        for &b in victims.iter() {
            self.set_bits(b, NO_FILL);
            self.set_state(b, BlockState::NotPresent);
        }
    }

    /// A fill stored `b` (its bytes are in the clean file): Clean, REMOTE, REFERENCED.
    pub(crate) fn filled(&self, b: u64) {
        self.set_bits(b, REMOTE | REFERENCED);
        self.set_state(b, BlockState::Clean);
    }

    /// The eviction of `b` punched its hole: fills may store it again.
    pub(crate) fn end_eviction(&self, b: u64) {
        self.clear_bits(b, NO_FILL);
    }

    /// Whether a fill of `b` fetched under `token` may store it (call it holding the
    /// block's stripe lock): no eviction or flush completion since the token, the block is
    /// NotPresent, and no eviction is punching its hole (`NO_FILL`). See `evict`.
    pub(crate) fn fillable(&self, b: u64, epoch: &FillEpoch, token: u64) -> bool {
        let raw = self.raw(b);
        let epoch_ok = epoch.get() == token;
        let not_present = raw & STATE_MASK == BlockState::NotPresent as u8;
        let no_fill = raw & NO_FILL != 0;
        #[cfg(loom)]
        let (epoch_ok, not_present, no_fill) = self.faults.fill(epoch_ok, not_present, no_fill);
        epoch_ok && not_present && !no_fill
    }
}

/// Stripe locks: [`STRIPES`] locks, block `b` under lock `b % STRIPES` ([`stripe_of`]). A
/// block's state changes out of Dirty's fast path only under its stripe lock (writes, fills).
#[derive(Debug)]
pub(crate) struct Stripes(Box<[Arc<UnitMutex>]>);

/// Number of stripe locks.
pub(crate) const STRIPES: usize = 1024;

/// The stripe of `block`.
pub(crate) fn stripe_of(block: u64) -> usize {
    (block % STRIPES as u64) as usize
}

impl Stripes {
    pub(crate) fn new() -> Self {
        Self((0..STRIPES).map(|_| Arc::new(UnitMutex::new(()))).collect())
    }

    /// Every stripe lock, in ascending order (the lock order).
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Arc<UnitMutex>> {
        self.0.iter()
    }
}

impl std::ops::Index<usize> for Stripes {
    type Output = Arc<UnitMutex>;
    fn index(&self, i: usize) -> &Arc<UnitMutex> {
        &self.0[i]
    }
}

/// The fill epoch: bumped by eviction, flush completion and `drop_clean`; a fill whose token
/// (the epoch taken before its fetch) is older is refused (see `evict`).
#[derive(Debug)]
pub(crate) struct FillEpoch(AtomicU64);

impl FillEpoch {
    pub(crate) fn new() -> Self {
        Self(AtomicU64::new(0))
    }

    /// The epoch now (Acquire: pairs with [`FillEpoch::bump`]).
    pub(crate) fn get(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }

    /// Refuses every fill of a token taken before this.
    pub(crate) fn bump(&self) {
        self.0.fetch_add(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_bits_round_trip() {
        let m = StateMap::new(4);
        m.set_bits(1, REMOTE);
        m.set_state(1, BlockState::Syncing);
        m.touch(1);
        assert_eq!(
            m.get(1),
            BlockInfo {
                state: BlockState::Syncing,
                remote: true
            }
        );
        m.set_state(1, BlockState::Clean);
        assert_eq!(m.get(1).state, BlockState::Clean);
        assert_eq!(
            m.runs(),
            vec![Run {
                first: 1,
                count: 1,
                bits: 1 | REMOTE
            }]
        );
        let r = StateMap::from_runs(
            1,
            &[Run {
                first: 0,
                count: 1,
                bits: 0xff,
            }],
        );
        assert_eq!(r.raw(0), PERSISTED);
        assert_eq!(m.counts(), m.scan());
    }

    #[test]
    fn counts_start_from_the_runs() {
        let bytes = [0, 1, 2 | REMOTE, 3 | REMOTE, 1 | REMOTE | NO_FILL];
        let runs: Vec<Run> = bytes
            .iter()
            .enumerate()
            .filter(|(_, &b)| b != 0)
            .map(|(i, &b)| Run {
                first: i as u64,
                count: 1,
                bits: b,
            })
            .collect();
        let m = StateMap::from_runs(5, &runs);
        let c = m.counts();
        assert_eq!(c.per_state, [1, 2, 1, 1]);
        assert_eq!(c.remote, 3);
        assert_eq!(c, m.scan());
        assert_eq!(
            m.dirty_blocks(),
            vec![2],
            "loaded Dirty blocks are in the dirty set"
        );
    }

    /// Only touched leaves are allocated; untouched blocks read as 0 and cost nothing.
    #[test]
    fn leaves_are_allocated_on_first_touch() {
        let n = 3 * MID_BLOCKS + 5; // 16 TiB of 4 KiB blocks would be 2048 mids; this is 4
        let m = StateMap::new(n);
        assert_eq!(m.leaves(), 0);
        assert_eq!(m.get(n - 1).state, BlockState::NotPresent);
        m.clear_bits(7, REMOTE);
        m.set_state(9, BlockState::NotPresent);
        assert_eq!(m.leaves(), 0, "reads and no-op changes allocate nothing");
        m.set_bits(n - 1, REMOTE);
        m.set_state(MID_BLOCKS + 3, BlockState::Dirty);
        assert_eq!(m.leaves(), 2);
        assert_eq!(m.counts(), m.scan());
        assert_eq!(m.counts().per_state, [n - 1, 0, 1, 0]);
        assert_eq!(
            m.runs(),
            vec![
                Run {
                    first: MID_BLOCKS + 3,
                    count: 1,
                    bits: 2
                },
                Run {
                    first: n - 1,
                    count: 1,
                    bits: REMOTE
                }
            ]
        );
        assert_eq!(m.allocated_from(0), Some(MID_BLOCKS));
        assert_eq!(m.allocated_from(MID_BLOCKS + 7), Some(MID_BLOCKS + 7));
        assert_eq!(
            m.allocated_from(MID_BLOCKS + LEAF_BLOCKS),
            Some(3 * MID_BLOCKS)
        );
        assert_eq!(m.allocated_from(n), None);
    }

    /// Growing keeps every state, counts the new blocks NotPresent, and blocks far past the
    /// first top slots (in growth segments of several sizes) work like the first ones.
    #[test]
    fn grows_without_moving_existing_blocks() {
        let n = MID_BLOCKS + 5; // 2 first top slots
        let m = StateMap::new(n);
        m.set_state(3, BlockState::Dirty);
        m.set_bits(n - 1, REMOTE);
        m.grow(n - 1);
        assert_eq!(m.len(), n, "a smaller size changes nothing");
        let big = 11 * MID_BLOCKS + 1; // slots 2..3 (segment 0), 4..7 (1), 8..11 (2)
        m.grow(big);
        assert_eq!(m.len(), big);
        assert_eq!(m.get(3).state, BlockState::Dirty);
        assert!(m.get(n - 1).remote);
        assert_eq!(m.get(big - 1).state, BlockState::NotPresent);
        assert_eq!(
            m.allocated_from(n),
            Some(n),
            "the first slots' leaf of n - 1"
        );
        assert_eq!(m.allocated_from(2 * MID_BLOCKS), None);
        for b in [2 * MID_BLOCKS, 5 * MID_BLOCKS + 7, big - 1] {
            m.set_state(b, BlockState::Clean);
            m.set_bits(b, REMOTE);
        }
        assert_eq!(m.get(5 * MID_BLOCKS + 7).state, BlockState::Clean);
        assert_eq!(m.counts(), m.scan());
        assert_eq!(m.counts().per_state, [big - 4, 3, 1, 0]);
        let firsts: Vec<u64> = m.runs().iter().map(|r| r.first).collect();
        assert_eq!(
            firsts,
            vec![3, n - 1, 2 * MID_BLOCKS, 5 * MID_BLOCKS + 7, big - 1]
        );
        assert_eq!(m.allocated_from(6 * MID_BLOCKS), Some(11 * MID_BLOCKS));
        assert_eq!(m.top.slots(), 2 + 2 + 4 + 8);
    }

    #[test]
    fn dirty_set_holds_each_new_dirty_block_once() {
        let m = StateMap::new(10_000);
        for b in [5, 9000, 5, 7] {
            m.set_state(b, BlockState::Dirty);
        }
        assert_eq!(m.dirty_blocks(), vec![5, 7, 9000]);
        let mut taken = m.take_dirty();
        taken.sort_unstable();
        assert_eq!(taken, vec![5, 7, 9000]);
        assert!(m.take_dirty().is_empty());
        m.set_state(5, BlockState::Syncing);
        m.set_state(5, BlockState::Dirty);
        assert_eq!(m.take_dirty(), vec![5]);
    }

    /// Racing transitions of the same blocks (as fills, writes, rotation and eviction do
    /// under different locks) leave counts equal to a scan.
    #[test]
    fn counts_follow_racing_transitions() {
        const BLOCKS: u64 = 64;
        let m = StateMap::new(BLOCKS);
        let states = [
            BlockState::NotPresent,
            BlockState::Clean,
            BlockState::Dirty,
            BlockState::Syncing,
        ];
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let m = &m;
                s.spawn(move || {
                    let mut x = t.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
                    for _ in 0..20_000 {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let b = x % BLOCKS;
                        match (x >> 8) % 6 {
                            0 => m.set_bits(b, REMOTE),
                            1 => m.clear_bits(b, REMOTE | NO_FILL),
                            2 => m.set_bits(b, REMOTE | REFERENCED | NO_FILL),
                            3 => m.touch(b),
                            _ => m.set_state(b, states[((x >> 16) % 4) as usize]),
                        }
                    }
                });
            }
        });
        assert_eq!(m.counts(), m.scan());
        assert_eq!(m.counts().per_state.iter().sum::<u64>(), BLOCKS);
    }
}
