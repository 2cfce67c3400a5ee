//! A pending flush ([`Rotation`]): the generation of the flushing file and the blocks it
//! holds, as `Cache::rotate` made it or recovery found it (`flush.rs` runs it).

use std::collections::HashSet;
use std::sync::Arc;

use crate::crcs::PageCrcs;

/// A pending flush: the flushing file generation and its blocks.
#[derive(Debug)]
pub struct Rotation {
    pub(crate) gen: u64,
    pub(crate) blocks: Vec<u64>,
    /// The active file's known page CRCs at rotation time (none for a recovered rotation).
    pub(crate) crcs: Option<Arc<PageCrcs>>,
    /// Blocks `read_for_flush` could not stage into the clean file (full disk): they become
    /// NotPresent + REMOTE, not Clean, when the flush completes.
    pub(crate) unstaged: parking_lot::Mutex<Vec<u64>>,
    /// Blocks `read_for_flush` found all zeros: published unmapped, NotPresent afterwards.
    pub(crate) unmapped: parking_lot::Mutex<HashSet<u64>>,
    /// The Rotate record's sequence number (0 for a recovered rotation, whose records
    /// recovery made durable): staging waits until the WAL is on disk up to it.
    pub(crate) rotate_seq: u64,
}

impl Rotation {
    pub(crate) fn recovered(gen: u64, blocks: Vec<u64>) -> Self {
        Self {
            gen,
            blocks,
            crcs: None,
            unstaged: Default::default(),
            unmapped: Default::default(),
            rotate_seq: 0,
        }
    }

    /// Generation of the flushing file.
    pub fn gen(&self) -> u64 {
        self.gen
    }

    /// Blocks to upload, ascending.
    pub fn blocks(&self) -> &[u64] {
        &self.blocks
    }
}
