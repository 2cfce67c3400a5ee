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

use std::sync::atomic::{AtomicU8, Ordering};

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

/// One atomic byte per block.
#[derive(Debug)]
pub(crate) struct StateMap {
    bits: Box<[AtomicU8]>,
}

impl StateMap {
    #[cfg(test)]
    pub(crate) fn new(num_blocks: u64) -> Self {
        Self {
            bits: (0..num_blocks).map(|_| AtomicU8::new(0)).collect(),
        }
    }

    pub(crate) fn from_bytes(bytes: &[u8]) -> Self {
        Self {
            bits: bytes.iter().map(|b| AtomicU8::new(b & PERSISTED)).collect(),
        }
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
                Ok(_) => return,
                Err(now) => cur = now,
            }
        }
    }

    pub(crate) fn set_bits(&self, block: u64, bits: u8) {
        self.slot(block).fetch_or(bits, Ordering::AcqRel);
    }

    pub(crate) fn clear_bits(&self, block: u64, bits: u8) {
        self.slot(block).fetch_and(!bits, Ordering::AcqRel);
    }

    /// Marks a block recently used (CLOCK); a plain load when already marked.
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
    }
}
