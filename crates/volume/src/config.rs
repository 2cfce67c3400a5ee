//! Configuration of one volume.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use glidefs_cache::{CrashHook, NoCrash, DEFAULT_BLOCK_SIZE};
use glidefs_objstore::{StoreConfig, VolumeKey};

/// How to open a volume.
#[derive(Debug, Clone)]
pub struct VolumeConfig {
    /// Volume name (the object-store prefix `volumes/<name>/`).
    pub name: String,
    /// Local cache directory of this volume.
    pub dir: PathBuf,
    /// Volume size in bytes (a multiple of `block_size`). Larger than the size the store or
    /// the cache directory holds grows the volume, smaller is refused (see `Volume::resize`).
    pub size: u64,
    /// Block size in bytes (power of two, >= 4 KiB). Default 128 KiB.
    pub block_size: u32,
    /// Local disk budget: after a flush, Clean blocks are evicted until Clean + Dirty +
    /// Syncing blocks fit (Dirty and Syncing blocks are never evicted).
    pub disk_budget: u64,
    /// Raw bytes of blocks per pack (rounded to whole blocks, at least one). Default 16 MiB.
    pub pack_bytes: u64,
    /// Blocks fetched ahead of a sequential read stream (see `Volume::note_read`). Default 16;
    /// 0 disables readahead.
    pub readahead_blocks: u32,
    /// Uploads, retries.
    pub store: StoreConfig,
    /// Crash injection (tests).
    pub crash_hook: Arc<dyn CrashHook>,
    /// This writer's owner id (the daemon: `<hostname>/<uuid of its data dir>`; 1..=255
    /// bytes of printable ASCII without spaces). `Some`: `Volume::open` refuses a volume
    /// another owner holds (`VolumeError::OwnedElsewhere`) unless `takeover` is set, and
    /// claims the volume by publishing the next manifest generation with this owner, which
    /// fences the previous writer. `None` (default): no ownership check, no claim, and the
    /// manifests this writer publishes carry no owner record (the behaviour before owners).
    pub owner: Option<String>,
    /// With `owner`: open even when another owner holds the volume, fencing it (takeover).
    /// The previous owner's unpublished writes are lost. Ignored without `owner`.
    pub takeover: bool,
    /// WAL records after which a local FLUSH also writes a checkpoint (bounds replay time
    /// when nothing is flushed to the store for a long time). Default 65536; volumes under
    /// 256 MiB checkpoint sooner (`Cache::checkpoint_due`: half their WAL segment's reserve).
    pub checkpoint_records: u64,
    /// `Some(name)`: open the volume's snapshot `name` as a read-only view (its generation's
    /// block map; no owner, no claim; writes, flushes to the store, compaction and GC are
    /// refused). `size`/`block_size` must be the snapshot's. Default `None`.
    pub snapshot: Option<String>,
    /// A read-only export of the volume's latest state (the daemon's `read_only` attachment
    /// of a volume another host may own): no owner, no claim, and every publish (flush to the
    /// store, compaction, GC, snapshots, resize, release) and every write refused
    /// ([`crate::VolumeError::ReadOnly`]), so it can never fence the owner. It follows the
    /// writer's newer generations (see `follow_interval`): a block reads as of the
    /// generation served when the read started or a newer one, never a mix within a block,
    /// but a read of many blocks may span two generations (not a point-in-time image: use a
    /// snapshot view for that). Default `false`.
    pub read_only: bool,
    /// A read-only export looks for the writer's newer generation (one LIST of the
    /// manifests; the manifest is fetched only when newer) at most this often: at a cold
    /// read once this long passed since the last look, and on a timer every this long (so a
    /// fully cached export follows too). Independently, a fetch whose pack is gone (the
    /// writer compacted, GC deleted) reloads at once. Adopting a generation drops the
    /// export's cached copies of the blocks it changed. `Duration::ZERO`: a look before every
    /// cold read, no timer. Ignored by every other handle. Default 5 s.
    pub follow_interval: Duration,
    /// Encryption at rest (default `None`: not encrypted). `Some`: every pack frame and
    /// manifest this writer stores is encrypted with this key (glidefs-objstore FORMAT.md,
    /// "Encryption"), and `Volume::open` refuses a volume whose latest manifest records
    /// another key id, or none (`ObjStoreError::KeyMismatch`, naming both ids). `None`
    /// refuses an encrypted volume the same way. The local cache holds plaintext, like the
    /// block device it backs: encryption protects what is in the object store.
    pub encryption_key: Option<Arc<VolumeKey>>,
    /// What a FLUSH ([`crate::Volume::flush_durable`]) waits for. Default `Local`.
    pub durability: Durability,
}

/// Where a FLUSH makes the writes before it durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// On the local disk (the cache's WAL, fsync'd): the object store gets them at the next
    /// flush to the store. A node lost with its disk loses what it wrote since.
    #[default]
    Local,
    /// In the object store as well: a FLUSH completes once a published manifest holds what
    /// it covers (group commit: `group.rs`). A node lost with its disk loses no
    /// acknowledged write.
    Store,
}

impl VolumeConfig {
    /// Defaults for everything but the name, directory and size.
    pub fn new(name: impl Into<String>, dir: impl Into<PathBuf>, size: u64) -> Self {
        Self {
            name: name.into(),
            dir: dir.into(),
            size,
            block_size: DEFAULT_BLOCK_SIZE,
            disk_budget: u64::MAX,
            pack_bytes: 16 << 20,
            readahead_blocks: 16,
            store: StoreConfig::default(),
            crash_hook: Arc::new(NoCrash),
            owner: None,
            takeover: false,
            checkpoint_records: 64 * 1024,
            snapshot: None,
            read_only: false,
            follow_interval: Duration::from_secs(5),
            encryption_key: None,
            durability: Durability::Local,
        }
    }
}
