//! The block state map: compact, lock-free to read (page checksums live in `crcs`).
//!
//! One byte per block: bits 0-1 the [`BlockState`], bit 2 `REMOTE` (a durable copy exists in
//! the object store), bit 3 `REFERENCED` (CLOCK bit for eviction), bit 4 `NO_FILL` (an
//! eviction is punching this block's hole: cold fills must not store it).
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

use std::sync::atomic::{AtomicI64, AtomicU8, Ordering};

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
/// Bits that survive in a checkpoint.
pub(crate) const PERSISTED: u8 = STATE_MASK | REMOTE;

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

/// One atomic byte per block, plus counts maintained on every change (see module docs).
#[derive(Debug)]
pub(crate) struct StateMap {
    bits: Box<[AtomicU8]>,
    /// Signed: a transition's decrement may land before the increment of the one before it.
    per_state: [AtomicI64; 4],
    remote: AtomicI64,
}

impl StateMap {
    #[cfg(test)]
    pub(crate) fn new(num_blocks: u64) -> Self {
        Self::from_bytes(&vec![
            0;
            usize::try_from(num_blocks).expect("blocks fit usize")
        ])
    }

    pub(crate) fn from_bytes(bytes: &[u8]) -> Self {
        let map = Self {
            bits: bytes.iter().map(|b| AtomicU8::new(b & PERSISTED)).collect(),
            per_state: Default::default(),
            remote: AtomicI64::new(0),
        };
        let c = map.scan();
        for (slot, n) in map.per_state.iter().zip(c.per_state) {
            slot.store(n as i64, Ordering::Relaxed);
        }
        map.remote.store(c.remote as i64, Ordering::Relaxed);
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

    /// The counts by looking at every block, O(blocks) (initialisation and tests).
    pub(crate) fn scan(&self) -> Counts {
        let mut c = Counts::default();
        for b in self.bits.iter() {
            let raw = b.load(Ordering::Acquire);
            c.per_state[usize::from(raw & STATE_MASK)] += 1;
            c.remote += u64::from(raw & REMOTE != 0);
        }
        c
    }

    /// Accounts one change of a state byte from `old` to `new`.
    fn moved(&self, old: u8, new: u8) {
        let (from, to) = (old & STATE_MASK, new & STATE_MASK);
        if from != to {
            self.per_state[usize::from(from)].fetch_sub(1, Ordering::Relaxed);
            self.per_state[usize::from(to)].fetch_add(1, Ordering::Relaxed);
        }
        match (old & REMOTE != 0, new & REMOTE != 0) {
            (false, true) => self.remote.fetch_add(1, Ordering::Relaxed),
            (true, false) => self.remote.fetch_sub(1, Ordering::Relaxed),
            _ => 0,
        };
    }

    pub(crate) fn len(&self) -> u64 {
        self.bits.len() as u64
    }

    fn slot(&self, block: u64) -> &AtomicU8 {
        &self.bits[usize::try_from(block).unwrap_or(usize::MAX)]
    }

    pub(crate) fn raw(&self, block: u64) -> u8 {
        self.slot(block).load(Ordering::Acquire)
    }

    pub(crate) fn get(&self, block: u64) -> BlockInfo {
        BlockInfo::from_bits(self.raw(block))
    }

    /// Sets the state, keeping the other bits.
    pub(crate) fn set_state(&self, block: u64, state: BlockState) {
        let slot = self.slot(block);
        let mut cur = slot.load(Ordering::Relaxed);
        loop {
            let next = (cur & !STATE_MASK) | state as u8;
            match slot.compare_exchange_weak(cur, next, Ordering::Release, Ordering::Relaxed) {
                Ok(_) => return self.moved(cur, next),
                Err(now) => cur = now,
            }
        }
    }

    pub(crate) fn set_bits(&self, block: u64, bits: u8) {
        let old = self.slot(block).fetch_or(bits, Ordering::AcqRel);
        self.moved(old, old | bits);
    }

    pub(crate) fn clear_bits(&self, block: u64, bits: u8) {
        let old = self.slot(block).fetch_and(!bits, Ordering::AcqRel);
        self.moved(old, old & !bits);
    }

    /// Marks a block recently used (CLOCK); a plain load when already marked. (Changes only
    /// `REFERENCED`, which no count covers.)
    pub(crate) fn touch(&self, block: u64) {
        let slot = self.slot(block);
        if slot.load(Ordering::Relaxed) & REFERENCED == 0 {
            slot.fetch_or(REFERENCED, Ordering::Relaxed);
        }
    }

    /// The persisted bits of every block.
    pub(crate) fn snapshot(&self) -> Vec<u8> {
        self.bits
            .iter()
            .map(|b| b.load(Ordering::Acquire) & PERSISTED)
            .collect()
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
        assert_eq!(m.snapshot(), vec![0, 1 | REMOTE, 0, 0]);
        assert_eq!(StateMap::from_bytes(&[0xff]).raw(0), PERSISTED);
        assert_eq!(m.counts(), m.scan());
    }

    #[test]
    fn counts_start_from_the_bytes() {
        let m = StateMap::from_bytes(&[0, 1, 2 | REMOTE, 3 | REMOTE, 1 | REMOTE | NO_FILL]);
        let c = m.counts();
        assert_eq!(c.per_state, [1, 2, 1, 1]);
        assert_eq!(c.remote, 3);
        assert_eq!(c, m.scan());
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
