//! What the flusher keeps between flushes: the publish whose outcome is not known yet
//! (`PublishAttempt`, see "Lost replies" in `sync.rs`) and the pack sequence, held under the
//! volume's sync lock (`SyncState`). Plain data: the flush (`sync.rs`) and compaction
//! (`compact.rs`) fill it, the next flush or remap finishes it.

use std::sync::Arc;

use glidefs_cache::Rotation;
use glidefs_objstore::{Manifest, PackId};

/// Held across one `sync_to_store` (one flusher per volume).
#[derive(Debug, Default)]
pub(crate) struct SyncState {
    pub pack_seq: u64,
    /// A publish sent and not confirmed: the next flush re-sends it (`sync.rs`).
    pub attempt: Option<PublishAttempt>,
}

/// One pack of a flush: blocks `start..end` of the rotation, stored as `id`.
#[derive(Debug, Clone)]
pub(crate) struct PlannedPack {
    pub(crate) start: usize,
    pub(crate) end: usize,
    pub(crate) id: PackId,
}

/// A publish handed to the store whose outcome is not known yet (see "Lost replies").
#[derive(Debug)]
pub(crate) struct PublishAttempt {
    /// The rotation it publishes; `None` for a compaction's remap (see `compact`).
    pub(crate) rotation: Option<Arc<Rotation>>,
    /// Exactly the manifest sent: re-sent unchanged until the store confirms it.
    pub(crate) manifest: Manifest,
    /// The packs it names, to rebuild one the store lost (none for a compaction).
    pub(crate) packs: Vec<PlannedPack>,
    /// Blocks it publishes.
    pub(crate) blocks: u64,
}
