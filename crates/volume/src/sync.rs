//! Flush to the object store (`Volume::sync_to_store`).
//!
//! Steps, each of which can fail (or crash) without losing data:
//! 1. finish a pending rotation first (an earlier attempt failed, or the process restarted
//!    mid-flush): its blocks are still Syncing in the flushing file;
//! 2. rotate (Dirty → Syncing, a fresh active file takes new writes);
//! 3. build packs from the flushing file (blocking pool) and upload them, at most
//!    `upload_concurrency` at a time; transient store errors are retried by the store, a
//!    permanent one ends the flush with no manifest published. A block that reads as all
//!    zeros (DISCARD, WRITE_ZEROES, zeros written) goes into no pack: the manifest unmaps it
//!    (it reads as zeros and takes no space), except the rotation's first block, which is
//!    always stored, so every publish names a pack of its own (the base file's intent, see
//!    `base`);
//! 4. publish the next manifest generation (conditional: a second writer is fenced); only
//!    packs uploaded in step 3 or referenced before are named, so no manifest can point at a
//!    missing pack. The manifest object holds only the segments of the block map this flush
//!    changed, plus a root pointing at the older objects for the rest (format 2), so its size
//!    follows the flush, not the volume. A fenced publish latches the volume (`Shared::fence`): every later write,
//!    flush and sync fails with that error; the rotation stays pending and is never published;
//! 5. complete the rotation in the cache (Syncing → Clean, flushing file dropped);
//! 6. evict Clean blocks under the disk budget, then checkpoint the cache.
//!
//! The manifest of step 4 carries this writer's owner record (its claim at open) when it has
//! an owner id, and none otherwise. `Volume::release` runs the same flush, then publishes the
//! unchanged map once more with the record marked released.
//!
//! A crash before step 5 leaves the rotation pending; step 1 of the next flush uploads it
//! again (new packs, next generation): at worst some bytes are uploaded twice.
//!
//! Lost replies. A publish whose outcome is unknown (the PUT of generation G may have landed
//! with its reply lost, and the retries failed) is kept, with its packs' plan, in the
//! flusher's state (`PublishAttempt`). The next flush re-sends exactly that manifest for G
//! before anything else: the store answers `Ok` when G already holds our bytes
//! (`publish_manifest`'s idempotence) or creates G now. It never rebuilds the rotation with
//! new pack ids at G, which would find G holding "other" bytes (our own first attempt) and
//! fence the volume. The base file keeps `publishing G <first pack>` from before the first
//! PUT until G is confirmed, so the contract across a restart is:
//! - crash (or close) with the attempt unconfirmed: at open, if G landed, its manifest names
//!   the recorded pack and `base::judge` recognises it as ours (`Current`, the cache adopts
//!   G); if it did not land, the latest is still G - 1 = base (`Current`). Either way the
//!   rotation is still pending in the cache (step 5 never ran) and the next flush publishes it
//!   again at the next generation with new packs. Nothing a FLUSH acknowledged is lost, and
//!   the volume does not fence itself;
//! - only a manifest that differs from ours at G (another writer's) fences.
//!
//! A pack that the store reports missing at publish time (GC deleted it, see
//! `StoreConfig::pack_recheck_after`) is rebuilt from the flushing file under the same id and
//! uploaded again (`reupload`): encoding is deterministic, and the rebuilt block locations are
//! checked against the manifest's before the upload.
//!
//! Threads: every step that does file I/O (rotate, pack building, `store.base`, complete,
//! evict, checkpoint) or copies manifest segments runs on the blocking pool. On the async
//! worker remain: the encoding of the next manifest inside `publish_manifest` (O(changed
//! segments + segment count)), `pending_flush` (a mutex held only to clone or set an `Arc`), crash points
//! (a no-op without a test hook; a triggered one latches the cache dead, which takes the WAL
//! buffer's mutex, held at most for one buffered write of ~64 KiB), and the swap of the
//! manifest under its write lock.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use glidefs_cache::{CrashPoint, Rotation};
use glidefs_objstore::{
    BlockLocation, EncodedPack, ManifestOwner, ObjStoreError, PackBuilder, PackId,
};

use crate::attempt::{PlannedPack, PublishAttempt, SyncState};
use crate::base::record_base;
use crate::blocking::blocking;
use crate::error::{Fence, Result, VolumeError};
use crate::publisher::publish_owner_change;
use crate::publisher::Publisher;
use crate::shared::Shared;

/// Packs built ahead of the uploads.
const BUILD_AHEAD: usize = 2;

/// Flushes `release` runs before giving up on writes that keep arriving.
const RELEASE_SYNCS: u32 = 4;

/// An uploaded pack of a flush: its block locations, its size, and the blocks of its range
/// left out because they are all zeros (to unmap).
type UploadedPack = (Vec<(u64, BlockLocation)>, u64, Vec<u64>);

/// What one `sync_to_store` did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SyncReport {
    /// Blocks uploaded.
    pub blocks: u64,
    /// Packs uploaded.
    pub packs: u64,
    /// Bytes uploaded (encoded pack sizes).
    pub bytes: u64,
    /// Manifest generation after the flush.
    pub generation: u64,
    /// Blocks evicted afterwards.
    pub evicted: u64,
}

/// The flush to the store, and the publishes under the sync lock, over a volume's shared state.
pub(crate) struct Flusher<'a> {
    pub(crate) v: &'a Shared,
}

impl Flusher<'_> {
    /// [`Volume::sync_to_store`](crate::Volume::sync_to_store): see there.
    pub(crate) async fn sync_to_store(&self) -> Result<SyncReport> {
        if self.v.cfg.snapshot.is_some() || self.v.cfg.read_only {
            // A snapshot view or a read-only export holds nothing to upload.
            return Ok(SyncReport {
                generation: self.v.manifest_generation(),
                ..SyncReport::default()
            });
        }
        let mut st = self.v.sync.lock().await;
        self.v.check_open()?;
        self.v.check_writable()?;
        self.sync_locked(&mut st).await
    }

    /// [`Volume::release`](crate::Volume::release): see there.
    pub(crate) async fn release(&self) -> Result<u64> {
        let publisher = self.v.publisher("release")?;
        let mut st = self.v.sync.lock().await;
        self.v.check_fence()?;
        self.v.check_open()?;
        let Some(owner) = self.v.cfg.owner.clone() else {
            return Err(VolumeError::InvalidConfig {
                volume: self.v.cfg.name.clone(),
                detail: "opened without an owner id: there is no ownership to release".into(),
            });
        };
        if self.v.is_released() {
            return Ok(self.v.manifest_generation());
        }
        self.v.releasing.store(true, Ordering::Release);
        let mut sent = false;
        let result = self
            .release_locked(&mut st, publisher, &owner, &mut sent)
            .await;
        if result.is_err() && !sent && !self.v.is_released() {
            self.v.releasing.store(false, Ordering::Release);
        }
        result
    }

    /// Sets `*sent` just before the release record's PUT: from then on the record may be in
    /// the store whatever this call returns.
    async fn release_locked(
        &self,
        st: &mut SyncState,
        publisher: &Publisher,
        owner: &str,
        sent: &mut bool,
    ) -> Result<u64> {
        // Nothing may stay only in this cache once another owner can attach.
        let mut settled = false;
        for _ in 0..RELEASE_SYNCS {
            self.sync_locked(st).await?;
            let c = self.v.cache.stats();
            if c.dirty + c.syncing == 0 {
                settled = true;
                break;
            }
        }
        if !settled {
            return Err(VolumeError::Unsettled {
                what: "release (writes kept arriving)",
                offset: 0,
                attempts: RELEASE_SYNCS,
            });
        }
        let current = self.v.manifest.clone();
        let mut next = blocking(move || Ok(current.read().successor())).await?;
        self.v.carry_size(&mut next);
        let claimed_at = next
            .owner
            .as_ref()
            .filter(|o| o.id == owner)
            .map_or(next.generation, |o| o.claimed_at);
        next.owner = Some(ManifestOwner {
            id: owner.to_string(),
            claimed_at,
            released: true,
        });
        *sent = true;
        if let Err(e) = publish_owner_change(&self.v.cfg, publisher, &mut next).await {
            return Err(match e {
                VolumeError::Fenced(f) => self.v.fence(f),
                e => e,
            });
        }
        let generation = next.generation;
        let old = std::mem::replace(&mut *self.v.manifest.write(), next);
        drop(tokio::task::spawn_blocking(move || drop(old)));
        self.v.cache.fence(format!(
            "volume `{}` released by owner `{owner}` at generation {generation}",
            self.v.cfg.name
        ));
        record_base(&self.v.cfg, generation, None).await?;
        tracing::info!(volume = %self.v.cfg.name, owner, generation, "volume released");
        Ok(generation)
    }

    /// `sync_to_store` under the flusher's lock.
    pub(crate) async fn sync_locked(&self, st: &mut SyncState) -> Result<SyncReport> {
        let mut report = SyncReport::default();
        // A compaction's publish whose outcome is unknown goes first (see `compact`).
        self.finish_remap(st).await?;
        if let Some(rot) = self.v.cache.pending_flush() {
            self.flush_rotation(&rot, st, &mut report).await?;
        }
        let cache = self.v.cache.clone();
        if let Some(rot) = blocking(move || Ok(cache.rotate()?)).await? {
            self.flush_rotation(&rot, st, &mut report).await?;
        }
        report.generation = self.v.manifest_generation();
        let (cache, budget) = (self.v.cache.clone(), self.v.cfg.disk_budget);
        report.evicted = blocking(move || {
            let n = cache.evict_to(budget)?;
            cache.checkpoint()?;
            Ok(n)
        })
        .await?;
        Ok(report)
    }

    async fn flush_rotation(
        &self,
        rot: &Arc<Rotation>,
        st: &mut SyncState,
        report: &mut SyncReport,
    ) -> Result<()> {
        if !rot.blocks().is_empty() {
            let attempt = match st.attempt.take() {
                // A publish of this rotation was handed to the store and its outcome is
                // unknown: send exactly that manifest again (see "Lost replies").
                Some(a) if a.rotation.as_ref().is_some_and(|r| Arc::ptr_eq(r, rot)) => {
                    tracing::info!(volume = %self.v.cfg.name, generation = a.manifest.generation,
                        "re-sending the manifest of an unfinished publish");
                    a
                }
                stale => {
                    if let Some(a) = stale {
                        // Cannot happen: a rotation completes only after its publish.
                        tracing::warn!(volume = %self.v.cfg.name, generation = a.manifest.generation,
                            "dropping the unfinished publish of another rotation");
                    }
                    self.upload_rotation(rot, st, report).await?
                }
            };
            report.blocks += attempt.blocks;
            // Kept in `st` until the store confirms it: a failed (or cancelled) publish is
            // re-sent unchanged by the next flush.
            let attempt = st.attempt.insert(attempt);
            self.publish_attempt(attempt).await?;
            let next = attempt.manifest.clone();
            st.attempt = None;
            let generation = next.generation;
            // The write lock is held for the swap only (fetches read the manifest on async
            // workers); the old block map is freed on the blocking pool.
            let old = std::mem::replace(&mut *self.v.manifest.write(), next);
            drop(tokio::task::spawn_blocking(move || drop(old)));
            self.v.cache.crash_point(CrashPoint::AfterManifestPublish)?;
            record_base(&self.v.cfg, generation, None).await?;
        }
        let (cache, rot) = (self.v.cache.clone(), rot.clone());
        blocking(move || Ok(cache.complete_flush(&rot)?)).await
    }

    /// Steps 3 and 4 up to the publish: uploads the rotation's blocks as new packs, builds
    /// the next manifest and records the publish intent in the base file.
    async fn upload_rotation(
        &self,
        rot: &Arc<Rotation>,
        st: &mut SyncState,
        report: &mut SyncReport,
    ) -> Result<PublishAttempt> {
        let mut locations: Vec<(u64, BlockLocation)> = Vec::with_capacity(rot.blocks().len());
        self.v.cache.crash_point(CrashPoint::BeforePackUpload)?;
        let generation = self.v.manifest_generation() + 1;
        let per_pack = (self.v.cfg.pack_bytes / u64::from(self.v.cfg.block_size)).max(1) as usize;
        let n = rot.blocks().len();
        let chunks: Vec<PlannedPack> = (0..n)
            .step_by(per_pack)
            .map(|s| {
                st.pack_seq += 1;
                PlannedPack {
                    start: s,
                    end: (s + per_pack).min(n),
                    id: PackId::generate(generation, st.pack_seq),
                }
            })
            .collect();
        // Packs are built (blocking pool) up to BUILD_AHEAD ahead of the uploads, which
        // run `upload_concurrency` at a time: compression overlaps the network, and memory
        // stays bounded by (BUILD_AHEAD + upload_concurrency) packs.
        let concurrency = self.v.store.config().upload_concurrency.max(1);
        let uploaded: Vec<UploadedPack> = futures::stream::iter(chunks.clone())
            .map(|p| self.build_pack(rot.clone(), p.start, p.end, p.id))
            .buffered(BUILD_AHEAD)
            .map_ok(|(pack, zeros)| async move {
                let (locs, bytes) = if pack.locations.is_empty() {
                    (Vec::new(), 0)
                } else {
                    self.upload(pack).await?
                };
                Ok((locs, bytes, zeros))
            })
            .try_buffer_unordered(concurrency)
            .try_collect()
            .await?;
        let mut unmapped = Vec::new();
        for (locs, bytes, zeros) in uploaded {
            unmapped.extend(zeros);
            if bytes == 0 {
                continue;
            }
            self.v.uploads.packs.fetch_add(1, Ordering::Relaxed);
            self.v.uploads.bytes.fetch_add(bytes, Ordering::Relaxed);
            report.packs += 1;
            report.bytes += bytes;
            locations.extend(locs);
        }
        self.v.cache.crash_point(CrashPoint::AfterPackUpload)?;
        let blocks = (locations.len() + unmapped.len()) as u64;
        let intent = locations
            .first()
            .map(|(_, loc)| loc.pack.as_str().to_string());
        // The next manifest shares the unchanged segments (copy on write); the changed
        // ones are copied on the blocking pool.
        let (current, owned) = (self.v.manifest.clone(), self.v.cfg.owner.is_some());
        let size = self.v.size();
        let next = blocking(move || {
            let mut next = current.read().successor();
            next.volume_size = next.volume_size.max(size);
            next.extend(locations);
            for block in unmapped {
                next.remove(block);
            }
            // An owner's flush carries its claim; a writer without an owner id records
            // no owner (see FORMAT.md, "Ownership").
            if !owned {
                next.owner = None;
            }
            Ok(next)
        })
        .await?;
        // Record the publish before it happens, so a reopen after a crash can tell our
        // generation from a foreign one (see `base`).
        record_base(
            &self.v.cfg,
            next.generation - 1,
            intent.map(|p| (next.generation, p)),
        )
        .await?;
        Ok(PublishAttempt {
            rotation: Some(rot.clone()),
            manifest: next,
            packs: chunks,
            blocks,
        })
    }

    /// Publishes the attempt's manifest. A pack the store reports missing (deleted since its
    /// upload, see `StoreConfig::pack_recheck_after`) is rebuilt from the flushing file
    /// under its own id and uploaded again, then the same manifest is sent again.
    async fn publish_attempt(&self, attempt: &mut PublishAttempt) -> Result<()> {
        let publisher = self.v.publisher("flush")?;
        let mut reuploads = 0;
        loop {
            let e = match publisher.publish(&mut attempt.manifest).await {
                Ok(()) => return Ok(()),
                Err(ObjStoreError::Fenced { latest, reason, .. }) => {
                    return Err(self.v.fence(Fence {
                        volume: self.v.cfg.name.clone(),
                        generation: attempt.manifest.generation - 1,
                        newer: (latest >= attempt.manifest.generation).then_some(latest),
                        reason: reason.to_string(),
                    }))
                }
                Err(e) => e,
            };
            // One of our packs is gone (at most one re-upload per pack of the flush).
            let lost = match &e {
                ObjStoreError::MissingPack { pack, .. } if reuploads < attempt.packs.len() => {
                    attempt
                        .packs
                        .iter()
                        .find(|p| p.id.as_str() == pack)
                        .cloned()
                }
                _ => None,
            };
            let Some(planned) = lost else {
                return Err(VolumeError::store("publish manifest", &self.v.cfg.name, e));
            };
            tracing::warn!(volume = %self.v.cfg.name, pack = %planned.id, generation = attempt.manifest.generation,
                "a pack of this flush is gone from the store: uploading it again");
            self.reupload(attempt, planned).await?;
            reuploads += 1;
        }
    }

    /// Rebuilds `planned` from the rotation (same blocks, same id: the same bytes, since
    /// encoding is deterministic; for an encrypted volume the same frame lengths, with fresh
    /// nonces), checks that its block locations are those the manifest
    /// names, and uploads it.
    async fn reupload(&self, attempt: &PublishAttempt, planned: PlannedPack) -> Result<()> {
        let Some(rotation) = attempt.rotation.clone() else {
            return Err(VolumeError::store(
                "re-upload pack",
                &self.v.cfg.name,
                ObjStoreError::InvalidInput(format!(
                    "pack {} of a compaction cannot be rebuilt",
                    planned.id
                )),
            ));
        };
        let (pack, _) = self
            .build_pack(rotation, planned.start, planned.end, planned.id.clone())
            .await?;
        if let Some((block, _)) = pack
            .locations
            .iter()
            .find(|(b, loc)| attempt.manifest.get(*b) != Some(loc))
        {
            return Err(VolumeError::store(
                "re-upload pack",
                &self.v.cfg.name,
                ObjStoreError::InvalidInput(format!(
                    "pack {} rebuilt from the flushing file differs from its first upload \
                     at block {block}",
                    planned.id
                )),
            ));
        }
        self.upload(pack).await.map(drop)
    }

    /// Builds one pack from blocks `start..end` of the rotation (on the blocking pool); also
    /// returns the blocks left out because they are all zeros (to unmap). Deterministic: the
    /// same rotation and range give the same block locations (`reupload` relies on it).
    async fn build_pack(
        &self,
        rot: Arc<Rotation>,
        start: usize,
        end: usize,
        id: PackId,
    ) -> Result<(EncodedPack, Vec<u64>)> {
        let (cache, name) = (self.v.cache.clone(), self.v.cfg.name.clone());
        let (bs, key) = (self.v.cfg.block_size, self.v.store.key().cloned());
        blocking(move || {
            let mut builder = PackBuilder::new(bs)
                .map_err(|e| VolumeError::store("build pack", &name, e))?
                .with_key(key);
            let mut buf = vec![0u8; bs as usize];
            let mut zeros = Vec::new();
            for i in start..end {
                let zero = cache.read_for_flush(&rot, i, &mut buf)?;
                // The rotation's first block is stored even when zero (see step 3).
                if zero && i > 0 {
                    zeros.push(rot.blocks()[i]);
                    continue;
                }
                builder
                    .add(rot.blocks()[i], &buf)
                    .map_err(|e| VolumeError::store("build pack", &name, e))?;
            }
            cache.start_writeback(&rot, start..end)?;
            Ok((builder.finish(id), zeros))
        })
        .await
    }

    /// Uploads one pack; returns its block locations and encoded size.
    async fn upload(&self, pack: EncodedPack) -> Result<(Vec<(u64, BlockLocation)>, u64)> {
        self.v
            .store
            .upload_pack(&pack)
            .await
            .map_err(|e| VolumeError::store("upload pack", &self.v.cfg.name, e))?;
        self.v.stored.uploaded(pack.bytes.len() as u64);
        Ok((pack.locations, pack.bytes.len() as u64))
    }

    /// Publishes a compaction's remap whose earlier publish ended with an unknown outcome
    /// (kept in `st.attempt`), exactly as sent. Call it under the sync lock before any other
    /// publish. A missing pack means it never landed: dropped.
    pub(crate) async fn finish_remap(&self, st: &mut SyncState) -> Result<()> {
        let Some(attempt) = st.attempt.as_mut().filter(|a| a.rotation.is_none()) else {
            return Ok(());
        };
        let publisher = self.v.publisher("compaction")?;
        let generation = attempt.manifest.generation;
        match publisher.publish(&mut attempt.manifest).await {
            Ok(()) => {}
            Err(ObjStoreError::Fenced { latest, reason, .. }) => {
                return Err(self.v.fence(Fence {
                    volume: self.v.cfg.name.clone(),
                    generation: generation - 1,
                    newer: (latest >= generation).then_some(latest),
                    reason: format!(
                        "publishing the compaction of generation {generation}: {reason}"
                    ),
                }))
            }
            Err(ObjStoreError::MissingPack { pack, .. }) => {
                tracing::warn!(volume = %self.v.cfg.name, generation, pack,
                    "a pack of an unpublished compaction is gone: the compaction is dropped");
                st.attempt = None;
                return Ok(());
            }
            Err(e) => {
                return Err(VolumeError::store(
                    "publish compaction",
                    &self.v.cfg.name,
                    e,
                ))
            }
        }
        let Some(done) = st.attempt.take() else {
            return Ok(());
        };
        let old = std::mem::replace(&mut *self.v.manifest.write(), done.manifest);
        drop(tokio::task::spawn_blocking(move || drop(old)));
        self.v.cache.crash_point(CrashPoint::AfterManifestPublish)?;
        record_base(&self.v.cfg, generation, None).await?;
        tracing::info!(volume = %self.v.cfg.name, generation, blocks = done.blocks, "compaction published");
        Ok(())
    }
}
