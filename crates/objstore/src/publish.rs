//! Loading the latest manifest and publishing the next one, fenced.
//!
//! Manifests are immutable objects, one per generation (`manifest/<generation:020>`), written
//! with `PutMode::Create`, which every supported store implements atomically (S3 `If-None-Match`,
//! a hard link on `LocalFileSystem`, a map check in `InMemory`). The latest manifest is the one
//! with the highest generation. In format 2 (FORMAT.md) the object of generation `g` holds the
//! frames of the segments that changed in `g` and a root pointing at every segment's frame,
//! in this object or an older one; loading reads the root and then the older frames with
//! ranged GETs. Older objects are never rewritten, so a frame a root points at stays valid.
//!
//! Publishing generation `g`, in order:
//! 1. Check the manifest's own invariants (`Manifest::validate`, volume name) and encode it
//!    (frames of the segments not stored in an older object, then the root).
//! 2. List manifests after the newest one this writer knows (`list_with_offset`, or a full
//!    listing when it knows none). Any newer manifest means another writer got there first:
//!    `Fenced`. `g` must be exactly latest + 1 (`invariants::follows`; lower: `Fenced`;
//!    higher: `InvalidInput`, gaps are never created), and its owner record must continue the
//!    latest manifest's unreleased claim or be a new claim (`invariants::continues_owner`;
//!    otherwise `Fenced`: a handle without the claim, such as a read-only export on another
//!    host, never fences the owner).
//! 3. Every pack referenced by a segment written now must exist: packs referenced by the
//!    manifest this store last loaded/published, and packs it uploaded less than
//!    `StoreConfig::pack_recheck_after` ago, are trusted; every other one is HEADed
//!    (`MissingPack` naming it if absent: the caller uploads it again and re-sends the same
//!    manifest). An older upload is checked because a long upload-to-publish time (a catch-up
//!    flush, retries through an outage) can outlast a GC grace period. (Segments stored in
//!    older objects were checked when those were published.)
//! 4. `PutMode::Create` of `manifest/<g>`. Transient errors are retried. If the object already
//!    exists, the stored bytes are compared with ours (encoding is deterministic): equal means an
//!    earlier attempt of ours landed and only its reply was lost (this can also happen inside the
//!    HTTP client's own retries, so it is checked on every attempt); different means another
//!    writer won the race: `Fenced`.
//! 5. Remember `g` and its packs as this writer's view; mark the segments written in step 1 as
//!    stored in `g`'s object (only now: a frame reference never names an object that did not
//!    land), so the successor points at them.
//!
//! Publishing is idempotent: when a call fails with a transient error after its manifest may
//! have landed, calling again with the identical manifest returns `Ok` if it did land (step 2
//! finds generation `g` already holding exactly our bytes). A retry must therefore re-send the
//! same manifest, not a rebuilt one, until it gets `Ok` or a non-transient error.
//!
//! Two writers can therefore never both publish different manifests for the same generation,
//! and a writer whose view is stale cannot publish at all: the second of two racing publishes
//! fails with `Fenced`. The comparison is by content, so two writers publishing byte-identical
//! manifests for one generation both get `Ok`; that is harmless (they agree on the volume's
//! state, and the next differing publish fences one of them). Every flush that writes data has a
//! fresh random pack id, so real flushes never collide this way.
//!
//! One `VolumeStore` expects its own publishes to be serialised by the caller (one flusher per
//! volume); two concurrent publishes through the same store fence each other like two writers.

use std::collections::BTreeSet;

use bytes::Bytes;
use futures::stream::{self, StreamExt, TryStreamExt};
use object_store::{ObjectMeta, ObjectStoreExt, PutMode, PutOptions, PutPayload};

use crate::error::{ErrorKind, ObjStoreError};
use crate::format::manifest::{assemble, decode_object, frame_in, frame_packs, Decoded, Root};
use crate::invariants::{self, Violation};
use crate::manifest::{FrameRef, Manifest, ManifestOwner};
use crate::retry::with_retry;
use crate::store::{VolumeStore, WriterView};

/// How a publish's manifest came to be in the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Landed {
    /// This call's PUT created it.
    Created,
    /// The identical bytes were already there: an earlier attempt of this writer whose reply
    /// was lost, or another writer publishing byte-identical bytes (two owner-less
    /// creations of one clone).
    Found,
    /// The deadline passed before the PUT: nothing was sent.
    TooLate,
}

impl VolumeStore {
    /// Generations of the manifests in the store (listed after `after`, if given), ascending,
    /// with their object metadata.
    pub(crate) async fn list_manifests(
        &self,
        after: Option<u64>,
    ) -> Result<Vec<(u64, ObjectMeta)>, ObjStoreError> {
        let dir = self.layout.manifest_dir();
        let offset = after.map(|g| self.layout.manifest(g));
        let listed: Vec<ObjectMeta> = with_retry(&self.cfg, "list manifests", dir.as_ref(), |_| {
            let listing = match &offset {
                Some(o) => self.store.list_with_offset(Some(dir), o),
                None => self.store.list(Some(dir)),
            };
            listing.try_collect::<Vec<_>>()
        })
        .await?;
        let mut out: Vec<(u64, ObjectMeta)> = listed
            .into_iter()
            .filter_map(|meta| Some((self.layout.parse_manifest(&meta.location)?, meta)))
            .filter(|(g, _)| after.is_none_or(|a| *g > a))
            .collect();
        out.sort_by_key(|(g, _)| *g);
        Ok(out)
    }

    /// Fetches and verifies the manifest of `generation`: format 1, or a format 2 root whose
    /// segments stored in older generations' objects are read with ranged GETs (adjacent
    /// frames of one object in one request).
    pub async fn fetch_manifest(&self, generation: u64) -> Result<Manifest, ObjStoreError> {
        let path = self.layout.manifest(generation);
        let bytes = with_retry(&self.cfg, "get manifest", path.as_ref(), |_| async {
            self.store.get(&path).await?.bytes().await
        })
        .await?;
        let corrupt = |e| ObjStoreError::corrupt(path.as_ref(), e);
        let key = self.key.as_deref();
        let m = match decode_object(&bytes).map_err(corrupt)? {
            Decoded::Full(m) => {
                if let Some(key) = key {
                    return Err(corrupt(crate::format::FormatError::KeyMismatch {
                        what: "manifest",
                        stored: None,
                        given: Some(key.id()),
                    }));
                }
                m
            }
            Decoded::Root(root) => {
                if root.generation != generation {
                    return Err(self.misplaced(generation, &root.volume, root.generation));
                }
                root.check_key(key).map_err(corrupt)?;
                let frames = self.fetch_frames(&bytes, &root).await?;
                assemble(root, frames.iter().map(|f| &f[..]).collect(), key).map_err(corrupt)?
            }
        };
        if m.volume != self.volume || m.generation != generation {
            return Err(self.misplaced(generation, &m.volume, m.generation));
        }
        Ok(m)
    }

    fn misplaced(&self, generation: u64, volume: &str, found: u64) -> ObjStoreError {
        let path = self.layout.manifest(generation);
        ObjStoreError::corrupt(
            path.as_ref(),
            crate::format::FormatError::Invalid {
                what: "manifest",
                detail: format!(
                    "holds volume `{volume}` generation {found}, expected volume `{}` generation {generation}",
                    self.volume
                ),
            },
        )
    }

    /// What the manifest of `generation` references: its packs and the older generations
    /// whose objects hold its segments (for GC). Reads encrypted manifests without the key:
    /// their roots and pack tables are readable (a store with the key decodes them whole).
    pub(crate) async fn fetch_references(
        &self,
        generation: u64,
    ) -> Result<(Vec<crate::location::PackId>, Vec<u64>), ObjStoreError> {
        let path = self.layout.manifest(generation);
        let bytes = with_retry(&self.cfg, "get manifest", path.as_ref(), |_| async {
            self.store.get(&path).await?.bytes().await
        })
        .await?;
        let corrupt = |e| ObjStoreError::corrupt(path.as_ref(), e);
        let root = match decode_object(&bytes).map_err(corrupt)? {
            Decoded::Root(root) if root.key_id().is_some() && self.key.is_none() => root,
            _ => {
                let m = self.fetch_manifest(generation).await?;
                let packs = m.referenced_packs().into_iter().cloned().collect();
                return Ok((packs, m.stored_generations().into_iter().collect()));
            }
        };
        if root.generation != generation || root.volume != self.volume {
            return Err(self.misplaced(generation, &root.volume, root.generation));
        }
        let frames = self.fetch_frames(&bytes, &root).await?;
        let mut packs = std::collections::BTreeSet::new();
        for (e, frame) in root.entries.iter().zip(&frames) {
            let holder = self.layout.manifest(e.frame.generation);
            packs.extend(frame_packs(frame, e).map_err(corrupt_at(&holder))?);
        }
        let holders = root
            .entries
            .iter()
            .map(|e| e.frame.generation)
            .filter(|&g| g != generation)
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        Ok((packs.into_iter().collect(), holders))
    }

    /// The frame bytes of every entry of `root` (in entry order): from `own` (the root's
    /// object) or from the older object that holds it, adjacent ranges merged into one GET.
    async fn fetch_frames(&self, own: &Bytes, root: &Root) -> Result<Vec<Bytes>, ObjStoreError> {
        /// Frames closer than this in one object are read in one request.
        const MERGE_GAP: u64 = 64 << 10;
        /// Largest merged request.
        const MERGE_MAX: u64 = 16 << 20;
        let mut wanted: Vec<(u64, std::ops::Range<u64>)> = root
            .entries
            .iter()
            .filter(|e| e.frame.generation != root.generation)
            .map(|e| {
                let start = e.frame.offset;
                (e.frame.generation, start..start + u64::from(e.frame.len))
            })
            .collect();
        wanted.sort_by_key(|(g, r)| (*g, r.start));
        let mut requests: Vec<(u64, std::ops::Range<u64>)> = Vec::new();
        for (g, r) in wanted {
            match requests.last_mut() {
                Some((lg, lr))
                    if *lg == g
                        && r.start <= lr.end + MERGE_GAP
                        && r.end - lr.start <= MERGE_MAX =>
                {
                    lr.end = lr.end.max(r.end);
                }
                _ => requests.push((g, r)),
            }
        }
        let gets: Vec<_> = requests
            .into_iter()
            .map(|(g, r)| async move {
                let path = self.layout.manifest(g);
                let range = r.start..r.end;
                let data = with_retry(&self.cfg, "get manifest segments", path.as_ref(), |_| {
                    self.store.get_range(&path, range.clone())
                })
                .await?;
                Ok::<_, ObjStoreError>((g, r, data))
            })
            .collect();
        let fetched: Vec<(u64, std::ops::Range<u64>, Bytes)> = stream::iter(gets)
            .buffer_unordered(self.cfg.upload_concurrency)
            .try_collect()
            .await?;
        let mut frames = Vec::with_capacity(root.entries.len());
        for e in &root.entries {
            let f = &e.frame;
            if f.generation == root.generation {
                let slice = frame_in(own, e).map_err(|err| {
                    ObjStoreError::corrupt(self.layout.manifest(root.generation).as_ref(), err)
                })?;
                frames.push(own.slice_ref(slice));
                continue;
            }
            let end = f.offset + u64::from(f.len);
            let (_, r, data) = fetched
                .iter()
                .find(|(g, r, _)| *g == f.generation && r.start <= f.offset && end <= r.end)
                .ok_or_else(|| ObjStoreError::InvalidInput("frame not fetched".into()))?;
            let (from, to) = ((f.offset - r.start) as usize, (end - r.start) as usize);
            let frame = data
                .get(from..to)
                .map(|_| data.slice(from..to))
                .ok_or_else(|| {
                    ObjStoreError::corrupt(
                        self.layout.manifest(f.generation).as_ref(),
                        crate::format::FormatError::Truncated {
                            what: "manifest segment",
                            need: u64::from(f.len),
                            have: data.len().saturating_sub(from) as u64,
                        },
                    )
                })?;
            frames.push(frame);
        }
        Ok(frames)
    }

    /// Generation of the newest manifest in the store (0 when none), without fetching it.
    pub async fn latest_generation(&self) -> Result<u64, ObjStoreError> {
        Ok(self
            .list_manifests(None)
            .await?
            .last()
            .map_or(0, |(g, _)| *g))
    }

    /// The latest manifest's generation and owner record (`None`: the volume has no
    /// manifest), read from its root alone (see `owner_of`); this store's writer view is left
    /// as it was.
    pub async fn current_owner(
        &self,
    ) -> Result<Option<(u64, Option<ManifestOwner>)>, ObjStoreError> {
        let Some(&(generation, _)) = self.list_manifests(None).await?.last() else {
            return Ok(None);
        };
        Ok(Some((generation, self.owner_of(generation).await?)))
    }

    /// The owner record of the manifest of `generation`, from its root alone: no key needed
    /// (an encrypted root's owner section is plain), no segment fetched.
    async fn owner_of(&self, generation: u64) -> Result<Option<ManifestOwner>, ObjStoreError> {
        let path = self.layout.manifest(generation);
        let bytes = with_retry(&self.cfg, "get manifest", path.as_ref(), |_| async {
            self.store.get(&path).await?.bytes().await
        })
        .await?;
        let decoded =
            decode_object(&bytes).map_err(|e| ObjStoreError::corrupt(path.as_ref(), e))?;
        let (volume, found, owner) = match decoded {
            Decoded::Full(m) => (m.volume, m.generation, m.owner),
            Decoded::Root(root) => (root.volume, root.generation, root.owner),
        };
        if volume != self.volume || found != generation {
            return Err(self.misplaced(generation, &volume, found));
        }
        Ok(owner)
    }

    /// The latest manifest, or `None` for a volume that has none. Makes it this writer's view:
    /// the next publish must be its generation + 1. A damaged latest manifest is an error
    /// (`Corrupt`), never silently replaced by an older one.
    pub async fn load_manifest(&self) -> Result<Option<Manifest>, ObjStoreError> {
        let Some(&(generation, _)) = self.list_manifests(None).await?.last() else {
            let mut view = self.view.lock();
            view.generation = Some(0);
            view.referenced.clear();
            view.owner = None;
            return Ok(None);
        };
        let m = self.fetch_manifest(generation).await?;
        let mut view = self.view.lock();
        view.generation = Some(generation);
        view.referenced = m.referenced_packs().into_iter().cloned().collect();
        view.owner = m.owner.clone();
        Ok(Some(m))
    }

    /// Publishes `m` as the volume's next generation, fenced against other writers (see the
    /// module docs for the steps). Errors: `Fenced` (a newer manifest exists or won the race),
    /// `InvalidInput` (invariant violated, missing pack, generation gap), store errors.
    ///
    /// On success the segments this publish wrote are recorded in `m` as stored in this
    /// generation's object, so its successor points at them instead of writing them again.
    pub async fn publish_manifest(&self, m: &mut Manifest) -> Result<(), ObjStoreError> {
        match self.publish_before(m, None).await? {
            Landed::Created | Landed::Found => Ok(()),
            Landed::TooLate => Err(ObjStoreError::InvalidInput(
                "manifest publish: a publish without a deadline passed its deadline".into(),
            )),
        }
    }

    /// [`Self::publish_manifest`], telling how the manifest came to be in the store, and,
    /// with a `deadline`, giving up (`TooLate`, nothing sent) when it has passed right before
    /// the PUT: after the listing, the owner check and the pack checks, which can take long
    /// through an outage. The PUT's own retries are bounded by the store configuration.
    pub(crate) async fn publish_before(
        &self,
        m: &mut Manifest,
        deadline: Option<std::time::Instant>,
    ) -> Result<Landed, ObjStoreError> {
        if m.volume != self.volume {
            return Err(ObjStoreError::InvalidInput(format!(
                "manifest for volume `{}` handed to the store of volume `{}`",
                m.volume, self.volume
            )));
        }
        let (bytes, frames) = m.encode_with_frames(self.key.as_deref())?;
        let known = self.view.lock().generation;
        let newer = self.list_manifests(known).await?;
        let latest = newer.last().map(|(g, _)| *g).or(known).unwrap_or(0);
        let fenced = |latest: u64, reason: &'static str| ObjStoreError::Fenced {
            volume: self.volume.clone(),
            generation: m.generation,
            latest,
            reason,
        };
        // Idempotence: if exactly our manifest is already there (an earlier call whose reply was
        // lost, or that ran out of retries after landing), this publish has already happened.
        if latest == m.generation
            && newer.len() <= 1
            && self.stored_manifest_is(m.generation, &bytes).await?
        {
            self.adopt(m, frames);
            return Ok(Landed::Found);
        }
        if known.is_some() && !newer.is_empty() {
            return Err(fenced(
                latest,
                "another writer published after this writer's view",
            ));
        }
        match invariants::follows(latest, m.generation) {
            Ok(()) => {}
            Err(v @ Violation::Gap { .. }) => {
                return Err(ObjStoreError::InvalidInput(format!(
                    "manifest publish: volume=`{}`: {v}",
                    self.volume
                )))
            }
            Err(v) => return Err(fenced(latest, v.reason())),
        }
        let holder = self.latest_owner(known, latest).await?;
        if let Err(v) = invariants::continues_owner(holder.as_ref(), m.owner.as_ref(), m.generation)
        {
            tracing::warn!(volume = %self.volume, generation = m.generation, violation = %v, "manifest publish refused");
            return Err(fenced(latest, v.reason()));
        }

        self.check_packs_exist(m).await?;
        if deadline.is_some_and(|d| std::time::Instant::now() >= d) {
            return Ok(Landed::TooLate);
        }

        let path = self.layout.manifest(m.generation);
        let result = with_retry(&self.cfg, "put manifest", path.as_ref(), |_| {
            let (bytes, path) = (&bytes, &path);
            async move {
                let opts = PutOptions::from(PutMode::Create);
                match self
                    .store
                    .put_opts(path, PutPayload::from(bytes.clone()), opts)
                    .await
                {
                    Ok(_) => Ok(Landed::Created),
                    Err(e) if is_conflict(&e) => {
                        // An earlier attempt may have landed: is the stored manifest ours?
                        let stored = self.store.get(path).await?.bytes().await?;
                        if stored == *bytes {
                            Ok(Landed::Found)
                        } else {
                            Err(e)
                        }
                    }
                    Err(e) => Err(e),
                }
            }
        })
        .await;
        let landed = match result {
            Ok(landed) => landed,
            Err(ObjStoreError::Store { source, .. }) if is_conflict(&source) => {
                return Err(fenced(
                    m.generation,
                    "another writer published this generation first",
                ));
            }
            Err(e) => return Err(e),
        };

        let written = frames.len();
        self.adopt(m, frames);
        tracing::info!(volume = %self.volume, generation = m.generation, blocks = m.len(), segments_written = written, bytes = bytes.len(), "manifest published");
        Ok(landed)
    }

    /// Makes `m` (just published by this writer) the writer's view, and records the segments
    /// this publish wrote as stored in its object.
    fn adopt(&self, m: &mut Manifest, frames: Vec<(u64, FrameRef)>) {
        for (index, frame) in frames {
            m.mark_stored(index, frame);
        }
        let mut view = self.view.lock();
        view.generation = Some(m.generation);
        view.referenced = m.referenced_packs().into_iter().cloned().collect();
        view.owner = m.owner.clone();
        let WriterView {
            uploaded,
            referenced,
            ..
        } = &mut *view;
        uploaded.retain(|p, _| !referenced.contains(p));
    }

    /// The owner record of the latest manifest (`latest`): this writer's view when it knows
    /// that generation, else read from the store (a publish by a store that never loaded the
    /// volume, such as a clone's first; 0 has none).
    async fn latest_owner(
        &self,
        known: Option<u64>,
        latest: u64,
    ) -> Result<Option<crate::manifest::ManifestOwner>, ObjStoreError> {
        if latest == 0 {
            return Ok(None);
        }
        if known == Some(latest) {
            return Ok(self.view.lock().owner.clone());
        }
        self.owner_of(latest).await
    }

    /// True when the manifest object of `generation` holds exactly `bytes`.
    async fn stored_manifest_is(
        &self,
        generation: u64,
        bytes: &[u8],
    ) -> Result<bool, ObjStoreError> {
        let path = self.layout.manifest(generation);
        let stored = with_retry(&self.cfg, "get manifest", path.as_ref(), |_| async {
            self.store.get(&path).await?.bytes().await
        })
        .await;
        match stored {
            Ok(stored) => Ok(stored == bytes),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Step 3: every pack the segments written by this publish reference exists (HEAD those
    /// this writer cannot vouch for). Segments stored in older objects were checked when
    /// those were published.
    async fn check_packs_exist(&self, m: &Manifest) -> Result<(), ObjStoreError> {
        let recheck = self.cfg.pack_recheck_after;
        let unknown: BTreeSet<_> = {
            let view = self.view.lock();
            m.unstored_packs()
                .into_iter()
                .filter(|p| {
                    let fresh = view
                        .uploaded
                        .get(*p)
                        .is_some_and(|at| at.elapsed() < recheck);
                    !view.referenced.contains(*p) && !fresh
                })
                .cloned()
                .collect()
        };
        let absent: BTreeSet<_> = stream::iter(unknown.iter().cloned())
            .map(|id| async move { self.pack_exists(&id).await.map(|exists| (id, exists)) })
            .buffer_unordered(self.cfg.upload_concurrency)
            .try_filter_map(|(id, exists)| async move { Ok((!exists).then_some(id)) })
            .try_collect()
            .await?;
        invariants::packs_present(&unknown, |p| !absent.contains(p)).map_err(|v| match v {
            Violation::MissingPack { pack } => ObjStoreError::MissingPack {
                volume: self.volume.clone(),
                generation: m.generation,
                pack: pack.0.to_string(),
            },
            other => ObjStoreError::InvalidInput(other.to_string()),
        })
    }
}

/// Turns a format error into the error of the object at `path`.
fn corrupt_at(
    path: &object_store::path::Path,
) -> impl Fn(crate::format::FormatError) -> ObjStoreError + '_ {
    move |e| ObjStoreError::corrupt(path.as_ref(), e)
}

fn is_conflict(e: &object_store::Error) -> bool {
    crate::error::classify(e) == ErrorKind::Fenced
}
