//! [`VolumeStore`]: one volume's view of the object store; uploads and block reads.
//!
//! Manifest loading and fenced publishing live in `publish.rs`, garbage collection in `gc.rs`;
//! all three share the writer view kept here.
//!
//! Writer view: the generation this store last loaded or published, the packs that manifest
//! references, and the packs this store uploaded since (with the time of each upload).
//! `publish_manifest` trusts referenced packs and packs uploaded less than
//! `StoreConfig::pack_recheck_after` ago to exist (GC never deletes a pack referenced by the
//! latest manifest, nor one uploaded after it or younger than its grace period) and HEADs
//! every other pack a new manifest references.
//!
//! Encryption ([`VolumeStore::with_key`]): a store with a key reads and writes only sealed
//! frames and encrypted manifests recording that key's id; a store without one only plain
//! ones. Loading a manifest recorded with another key id (or none) fails with
//! `ObjStoreError::KeyMismatch` naming both ids. GC needs no key (see `gc.rs`).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use futures::stream::{self, StreamExt, TryStreamExt};
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use parking_lot::Mutex;

use crate::config::StoreConfig;
use crate::crypto::VolumeKey;
use crate::error::{ErrorKind, ObjStoreError};
use crate::format::pack::decode_entry;
use crate::format::FormatError;
use crate::layout::Layout;
use crate::location::{validate_volume_name, BlockIndex, BlockLocation, PackId};
use crate::pack::EncodedPack;
use crate::retry::with_retry;

/// What this process knows about the volume's latest state.
#[derive(Debug, Default)]
pub(crate) struct WriterView {
    /// Generation last loaded or published by this store.
    pub(crate) generation: Option<u64>,
    /// Packs referenced by that manifest.
    pub(crate) referenced: HashSet<PackId>,
    /// That manifest's owner record (what the next publish must continue, see
    /// `invariants::continues_owner`).
    pub(crate) owner: Option<crate::manifest::ManifestOwner>,
    /// Packs uploaded by this store and not yet referenced by a published manifest, with
    /// when their last upload ended.
    pub(crate) uploaded: HashMap<PackId, Instant>,
}

/// One volume's objects: packs, manifests, and the operations on them.
#[derive(Debug)]
pub struct VolumeStore {
    pub(crate) store: Arc<dyn ObjectStore>,
    pub(crate) volume: String,
    pub(crate) cfg: StoreConfig,
    pub(crate) layout: Layout,
    pub(crate) view: Mutex<WriterView>,
    /// The volume's key, when it is encrypted.
    pub(crate) key: Option<Arc<VolumeKey>>,
}

impl VolumeStore {
    /// A store for `volume` (1..=128 characters of `[A-Za-z0-9._-]`) inside `store`.
    pub fn new(
        store: Arc<dyn ObjectStore>,
        volume: &str,
        cfg: StoreConfig,
    ) -> Result<Self, ObjStoreError> {
        validate_volume_name(volume)?;
        Ok(Self {
            store,
            volume: volume.to_string(),
            cfg: StoreConfig {
                upload_concurrency: cfg.upload_concurrency.max(1),
                ..cfg
            },
            layout: Layout::new(volume),
            view: Mutex::new(WriterView::default()),
            key: None,
        })
    }

    /// This store with the volume's encryption key (`None`: the volume is not encrypted).
    /// Manifests are then loaded only when they record this key's id (or, without a key, none),
    /// published encrypted with it, and blocks are opened with it.
    pub fn with_key(mut self, key: Option<Arc<VolumeKey>>) -> Self {
        self.key = key;
        self
    }

    /// The volume's encryption key, if it has one (for building packs:
    /// `PackBuilder::with_key`).
    pub fn key(&self) -> Option<&Arc<VolumeKey>> {
        self.key.as_ref()
    }

    /// The volume name.
    pub fn volume(&self) -> &str {
        &self.volume
    }

    /// The configuration in use.
    pub fn config(&self) -> &StoreConfig {
        &self.cfg
    }

    /// The underlying object store.
    pub fn object_store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    /// Uploads packs, at most `upload_concurrency` at a time. Transient errors are retried with
    /// backoff; the first error that remains is returned (the other uploads are cancelled), and
    /// the caller must then not publish a manifest referencing these packs.
    ///
    /// Re-uploading a pack (same id, same bytes) is safe: packs are immutable and written with
    /// overwrite semantics, so a retry after a lost acknowledgement just writes the same object.
    pub async fn upload_packs(&self, packs: &[EncodedPack]) -> Result<(), ObjStoreError> {
        // Collect the (lazy) futures first: a stream mapping `&EncodedPack` through a closure
        // makes the returned future fail to be `Send` (higher-ranked lifetime inference).
        let uploads: Vec<_> = packs.iter().map(|pack| self.upload_pack(pack)).collect();
        stream::iter(uploads)
            .buffer_unordered(self.cfg.upload_concurrency)
            .try_collect::<()>()
            .await
    }

    /// Uploads one pack (retrying transient errors).
    pub async fn upload_pack(&self, pack: &EncodedPack) -> Result<(), ObjStoreError> {
        pack.id.validate()?;
        if let Some(other) = pack.id.foreign_volume() {
            return Err(ObjStoreError::InvalidInput(format!(
                "volume `{}` may not upload pack `{}` into volume `{other}`",
                self.volume, pack.id
            )));
        }
        let path = self.layout.pack(&pack.id);
        with_retry(&self.cfg, "put pack", path.as_ref(), |_| {
            // `PutPayload::from(Bytes)` shares the buffer: no copy per attempt.
            let payload = PutPayload::from(pack.bytes.clone());
            let opts = PutOptions::from(PutMode::Overwrite);
            self.store.put_opts(&path, payload, opts)
        })
        .await?;
        self.view
            .lock()
            .uploaded
            .insert(pack.id.clone(), Instant::now());
        Ok(())
    }

    /// Reads block `block` from `loc`: one ranged GET of exactly its entry frame, then checks
    /// the frame crc, that the frame holds `block`, decompresses, and checks the raw crc.
    ///
    /// A transfer that fails verification is fetched once more (a flipped bit on the wire is not
    /// damage in the store); if the second copy fails too the error kind is `Corrupt`.
    pub async fn read_block(
        &self,
        block: BlockIndex,
        loc: &BlockLocation,
    ) -> Result<Bytes, ObjStoreError> {
        loc.pack.validate()?;
        let path = self.layout.pack(&loc.pack);
        let Some(end) = loc.offset.checked_add(loc.len as u64) else {
            return Err(ObjStoreError::InvalidInput(format!(
                "block {block}: location {}+{} overflows",
                loc.offset, loc.len
            )));
        };
        let mut attempt = 0;
        loop {
            attempt += 1;
            let frame = with_retry(&self.cfg, "get_range pack", path.as_ref(), |_| {
                self.store.get_range(&path, loc.offset..end)
            })
            .await?;
            let decoded = if frame.len() == loc.len as usize {
                decode_entry(frame, block, loc.raw_crc, self.key.as_deref())
            } else {
                Err(FormatError::Truncated {
                    what: "pack entry",
                    need: loc.len as u64,
                    have: frame.len() as u64,
                })
            };
            match decoded {
                Ok(data) => return Ok(data),
                Err(e) if attempt < 2 => {
                    tracing::warn!(volume = %self.volume, block, pack = %loc.pack, error = %e,
                        "block failed verification, fetching it again");
                }
                Err(e) => return Err(ObjStoreError::corrupt(path.as_ref(), e)),
            }
        }
    }

    /// Reads a run of blocks whose entry frames lie back to back in one pack (each frame
    /// starts where the previous one ends) with ONE ranged GET, then verifies every frame as
    /// [`VolumeStore::read_block`] does; a frame that fails verification is read again on its
    /// own with `read_block` (which retries once more, then reports `Corrupt`). Used by
    /// readahead: a sequential stream costs one request per run instead of one per block.
    ///
    /// A run that is not back to back in one pack is refused (`InvalidInput`).
    pub async fn read_run(
        &self,
        run: &[(BlockIndex, BlockLocation)],
    ) -> Result<Vec<Bytes>, ObjStoreError> {
        let Some((first_block, first)) = run.first() else {
            return Ok(Vec::new());
        };
        if run.len() == 1 {
            return Ok(vec![self.read_block(*first_block, first).await?]);
        }
        first.pack.validate()?;
        let mut end = first.offset;
        for (block, loc) in run {
            if loc.pack != first.pack || loc.offset != end {
                return Err(ObjStoreError::InvalidInput(format!(
                    "block {block}: its frame ({} at {}) does not follow the run's previous \
                     frame (pack {}, offset {end})",
                    loc.pack, loc.offset, first.pack
                )));
            }
            end = end.checked_add(u64::from(loc.len)).ok_or_else(|| {
                ObjStoreError::InvalidInput(format!(
                    "block {block}: location {}+{} overflows",
                    loc.offset, loc.len
                ))
            })?;
        }
        let path = self.layout.pack(&first.pack);
        let span = with_retry(&self.cfg, "get_range pack", path.as_ref(), |_| {
            self.store.get_range(&path, first.offset..end)
        })
        .await?;
        let mut out = Vec::with_capacity(run.len());
        for (block, loc) in run {
            let at = usize::try_from(loc.offset - first.offset).unwrap_or(usize::MAX);
            let len = loc.len as usize;
            let decoded = match at.checked_add(len) {
                Some(stop) if stop <= span.len() => decode_entry(
                    span.slice(at..stop),
                    *block,
                    loc.raw_crc,
                    self.key.as_deref(),
                ),
                _ => Err(FormatError::Truncated {
                    what: "pack entry",
                    need: u64::from(loc.len),
                    have: span.len().saturating_sub(at) as u64,
                }),
            };
            match decoded {
                Ok(data) => out.push(data),
                Err(e) => {
                    tracing::warn!(volume = %self.volume, block = *block, pack = %loc.pack, error = %e,
                        "block of a run failed verification, fetching it on its own");
                    out.push(self.read_block(*block, loc).await?);
                }
            }
        }
        Ok(out)
    }

    /// True when the pack object exists (HEAD, retrying transient errors).
    pub async fn pack_exists(&self, id: &PackId) -> Result<bool, ObjStoreError> {
        id.validate()?;
        let path = self.layout.pack(id);
        match with_retry(&self.cfg, "head pack", path.as_ref(), |_| {
            self.store.head(&path)
        })
        .await
        {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{GcOptions, Manifest};

    fn assert_send<T: Send>(_: &T) {}

    /// The engine spawns these on a multi-thread runtime: every future must be `Send`.
    #[test]
    fn operation_futures_are_send_and_store_is_sync() {
        fn assert_sync<T: Send + Sync>() {}
        assert_sync::<VolumeStore>();
        let vs = VolumeStore::new(
            Arc::new(object_store::memory::InMemory::new()),
            "v",
            StoreConfig::default(),
        )
        .unwrap();
        let mut m = Manifest::new("v", 4096, 1 << 20);
        let loc = BlockLocation {
            pack: PackId::new("p").unwrap(),
            entry: 0,
            offset: 0,
            len: 32,
            raw_crc: 0,
        };
        assert_send(&vs.upload_packs(&[]));
        assert_send(&vs.load_manifest());
        assert_send(&vs.publish_manifest(&mut m));
        assert_send(&vs.read_block(0, &loc));
        assert_send(&vs.gc(GcOptions::default()));
    }

    #[test]
    fn invalid_volume_names_are_refused() {
        let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let err = VolumeStore::new(store, "../x", StoreConfig::default()).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
    }
}
