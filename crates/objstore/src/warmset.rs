//! Warm sets: the blocks a volume read first after an attach, in the order it first read
//! them, kept beside its manifests so that a later attach (of the volume, or of a clone of
//! it) can fetch them ahead of the guest.
//!
//! ```text
//! volumes/<v>/warmset     {format: 1, block_size, recorded_unix, window_secs, blocks: [..]}
//! ```
//!
//! Contracts:
//! - **A hint, never data.** A warm set names block numbers only; whoever uses it fetches
//!   those blocks where the manifest names them *now*, through the same fetch and fill as a
//!   cold read (so a block written locally, or written and flushed since the set was
//!   recorded, is never overwritten by what the set's fetch brings back). A stale, foreign or
//!   missing warm set costs at most a wasted fetch; it cannot change what a read returns.
//! - **One object, replaced whole.** Recording PUTs it (overwrite); dropping deletes it. Two
//!   writers (a stale owner, say) race harmlessly: the last PUT wins, and either set is a
//!   valid hint.
//! - **Copied to clones.** A clone made from a snapshot gets a copy of its origin's warm set
//!   when it is created ([`VolumeStore::copy_warm_set_from`]): block numbers are the same in
//!   a clone as in its origin. Later changes of either set do not reach the other.
//! - **Bounded.** At most [`MAX_WARM_BLOCKS`] blocks; a larger or malformed object is
//!   refused as corrupt when read (a hint that cannot be read is no hint).
//! - GC never touches it (GC lists manifests and packs only); purging the volume deletes it.
//!   It is not encrypted: it holds block numbers, which the manifest reveals too.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::error::ObjStoreError;
use crate::format::FormatError;
use crate::store::VolumeStore;

/// Most blocks one warm set names (2 GiB of 4 KiB blocks, 32 GiB of 128 KiB ones).
pub const MAX_WARM_BLOCKS: usize = 1 << 19;

/// The only format written and read.
const FORMAT: u32 = 1;

/// A volume's warm set (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WarmSet {
    pub format: u32,
    /// The block size of the volume that recorded it: the set names blocks of this size.
    pub block_size: u32,
    /// When the recording ended (seconds since the Unix epoch).
    pub recorded_unix: u64,
    /// How long the recording ran, in seconds (it ends earlier once it holds its most
    /// blocks).
    pub window_secs: u64,
    /// Block numbers, each once, in the order they were first read.
    pub blocks: Vec<u64>,
}

impl WarmSet {
    /// A set of `blocks` (each once, in first-read order) of `block_size`-byte blocks.
    pub fn new(block_size: u32, recorded_unix: u64, window_secs: u64, blocks: Vec<u64>) -> Self {
        Self {
            format: FORMAT,
            block_size,
            recorded_unix,
            window_secs,
            blocks,
        }
    }

    fn check(&self) -> Result<(), String> {
        if self.format != FORMAT {
            return Err(format!(
                "format {} (this build reads {FORMAT})",
                self.format
            ));
        }
        if self.blocks.len() > MAX_WARM_BLOCKS {
            return Err(format!(
                "{} blocks (at most {MAX_WARM_BLOCKS})",
                self.blocks.len()
            ));
        }
        if self.block_size == 0 {
            return Err("block size 0".into());
        }
        Ok(())
    }
}

impl VolumeStore {
    /// This volume's warm set, if it has one.
    pub async fn warm_set(&self) -> Result<Option<WarmSet>, ObjStoreError> {
        let path = self.layout.warm_set();
        let Some(bytes) = self.get_opt(&path, "get warm set").await? else {
            return Ok(None);
        };
        let invalid = |detail: String| {
            ObjStoreError::corrupt(
                path.as_ref(),
                FormatError::Invalid {
                    what: "warm set",
                    detail,
                },
            )
        };
        let set: WarmSet = serde_json::from_slice(&bytes).map_err(|e| invalid(e.to_string()))?;
        set.check().map_err(invalid)?;
        Ok(Some(set))
    }

    /// Stores `set` as this volume's warm set, replacing any.
    pub async fn put_warm_set(&self, set: &WarmSet) -> Result<(), ObjStoreError> {
        set.check().map_err(|detail| {
            ObjStoreError::InvalidInput(format!("warm set of volume {}: {detail}", self.volume))
        })?;
        let bytes = serde_json::to_vec(set)
            .map_err(|e| ObjStoreError::InvalidInput(format!("warm set: {e}")))?;
        self.put(&self.layout.warm_set(), Bytes::from(bytes), "put warm set")
            .await
    }

    /// Deletes this volume's warm set; `Ok` when there was none.
    pub async fn delete_warm_set(&self) -> Result<(), ObjStoreError> {
        self.delete_path(&self.layout.warm_set(), "delete warm set")
            .await
    }

    /// Copies `origin`'s warm set to this volume (a clone of it); the set copied, `None` when
    /// `origin` has none (this volume's own is then left as it is).
    pub async fn copy_warm_set_from(
        &self,
        origin: &VolumeStore,
    ) -> Result<Option<WarmSet>, ObjStoreError> {
        let Some(set) = origin.warm_set().await? else {
            return Ok(None);
        };
        self.put_warm_set(&set).await?;
        Ok(Some(set))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use object_store::memory::InMemory;
    use object_store::ObjectStoreExt;

    use super::*;
    use crate::config::StoreConfig;

    fn store(mem: &Arc<InMemory>, volume: &str) -> VolumeStore {
        VolumeStore::new(mem.clone(), volume, StoreConfig::default()).unwrap()
    }

    #[tokio::test]
    async fn a_warm_set_is_stored_replaced_copied_and_dropped() {
        let mem = Arc::new(InMemory::new());
        let (a, b) = (store(&mem, "a"), store(&mem, "b"));
        assert_eq!(a.warm_set().await.unwrap(), None);
        assert_eq!(b.copy_warm_set_from(&a).await.unwrap(), None);
        let first = WarmSet::new(65536, 1_700_000_000, 30, vec![7, 3, 9]);
        a.put_warm_set(&first).await.unwrap();
        assert_eq!(a.warm_set().await.unwrap(), Some(first.clone()));
        assert_eq!(b.copy_warm_set_from(&a).await.unwrap(), Some(first.clone()));
        let second = WarmSet::new(65536, 1_700_000_100, 10, vec![1]);
        a.put_warm_set(&second).await.unwrap();
        assert_eq!(a.warm_set().await.unwrap(), Some(second));
        assert_eq!(
            b.warm_set().await.unwrap(),
            Some(first),
            "the copy does not follow its origin"
        );
        a.delete_warm_set().await.unwrap();
        a.delete_warm_set().await.unwrap();
        assert_eq!(a.warm_set().await.unwrap(), None);
    }

    #[tokio::test]
    async fn a_malformed_or_oversized_warm_set_is_refused() {
        let mem = Arc::new(InMemory::new());
        let a = store(&mem, "a");
        let huge = WarmSet::new(4096, 0, 0, vec![0; MAX_WARM_BLOCKS + 1]);
        let e = a.put_warm_set(&huge).await.unwrap_err();
        assert!(e.to_string().contains("at most"), "{e}");
        let path = object_store::path::Path::from("volumes/a/warmset");
        for (bytes, says) in [
            (&b"{not json"[..], "warm set"),
            (
                &br#"{"format":2,"block_size":4096,"recorded_unix":0,"window_secs":0,"blocks":[]}"#
                    [..],
                "format 2",
            ),
        ] {
            mem.put(&path, bytes.to_vec().into()).await.unwrap();
            let e = a.warm_set().await.unwrap_err();
            assert!(e.to_string().contains(says), "{e}");
        }
    }
}
