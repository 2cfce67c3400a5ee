//! Garbage collection: prune old manifests, delete packs nothing references.
//!
//! Decision rules (one pass, `gc` below):
//! 1. List manifests. The newest `keep_manifests` (at least 1) are retained; so is every
//!    manifest younger than `grace`, and every manifest a snapshot names (listed after the
//!    manifests; see snapshot.rs). A snapshot whose manifest is missing stops GC. A clone
//!    (a volume with an origin record) keeps its generation 1 for good: it is the key a
//!    snapshot delete reads to learn that the clone published (snapshot.rs `has_published`),
//!    which a listing cannot be trusted for.
//! 2. Fetch and decode every retained manifest; their packs form the referenced set. A
//!    format-2 manifest points at segment frames inside older manifests' objects: those
//!    objects are retained too (pointers are never chained, so one level is enough). The rest
//!    are pruned. If any retained manifest cannot be read, GC stops before deleting anything.
//!    GC needs no key: an encrypted manifest's root and its segments' pack tables are
//!    readable (only the block records are sealed), so a store without the key reads just
//!    those (checked by their crcs); a store with the key decodes the manifest whole.
//! 3. List packs. A pack is deleted only if no retained manifest references it AND it was
//!    stored before the newest manifest (both last-modified times come from the store's own
//!    clock) AND it is older than `grace` (the store's last-modified time against `now`).
//!    A writer uploads its packs, then publishes the manifest naming them, and re-sends that
//!    same manifest until it lands (or it is fenced); so a pack uploaded after the newest
//!    manifest may still be published and is never deleted, however long the upload-to-publish
//!    time, whatever the grace, and whatever the GC host's clock says. With no manifest at all,
//!    no pack is deleted. A pack stored before the newest manifest and not named by it can
//!    only belong to a flush that is dead (its writer was fenced, crashed, or gave the packs
//!    up) or to a writer that re-uploads it before publishing (`pack_recheck_after`). The
//!    grace period is a second margin on top (against a writer whose clock-free reasoning
//!    above fails, e.g. a store whose timestamps are not monotonic); the daemon refuses a
//!    grace below [`MIN_GC_GRACE`](crate::MIN_GC_GRACE).
//! 4. The plan is checked against `invariants::keeps_pinned` (no pinned generation pruned,
//!    no referenced pack deleted); a violation refuses the pass before anything is deleted.
//! 5. Unless `dry_run`, delete pruned manifests first (oldest first), then packs: a crash in
//!    between leaves unreferenced packs (collected next time), never a manifest pointing at a
//!    deleted pack.
//!
//! Objects under the volume prefix that are neither manifests nor packs are never touched.
//! Packs of other volumes that a clone's manifest maps (foreign ids) are never listed here, so
//! never deleted: their own volume's GC keeps them while the snapshot they come from exists.

use std::collections::{BTreeSet, HashSet};
use std::time::{Duration, SystemTime};

use futures::stream::{self, StreamExt, TryStreamExt};
use object_store::{ObjectMeta, ObjectStoreExt};

use crate::error::{ErrorKind, ObjStoreError};
use crate::invariants;
use crate::location::PackId;
use crate::retry::with_retry;
use crate::store::VolumeStore;

/// What a GC pass may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GcOptions {
    /// Unreferenced packs (and surplus manifests) younger than this survive.
    pub grace: Duration,
    /// Report what would be deleted, delete nothing.
    pub dry_run: bool,
    /// How many of the newest manifests to keep (values below 1 count as 1).
    pub keep_manifests: usize,
    /// The current time for age decisions; `None` means the system clock.
    pub now: Option<SystemTime>,
}

impl Default for GcOptions {
    fn default() -> Self {
        Self {
            grace: Duration::from_secs(3600),
            dry_run: false,
            keep_manifests: 2,
            now: None,
        }
    }
}

/// What a GC pass found and did (or, for a dry run, would do).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcReport {
    /// True when nothing was deleted on purpose.
    pub dry_run: bool,
    /// Generations kept.
    pub manifests_retained: Vec<u64>,
    /// Generations deleted (or that would be).
    pub manifests_deleted: Vec<u64>,
    /// Packs kept because a retained manifest references them.
    pub packs_referenced: usize,
    /// Unreferenced packs kept because they are younger than the grace period, or were stored
    /// after the newest manifest (a flush may still publish them).
    pub packs_in_grace: usize,
    /// Packs deleted (or that would be).
    pub packs_deleted: Vec<PackId>,
    /// Bytes of the deleted packs and manifests.
    pub bytes_deleted: u64,
    /// Every object path deleted (or that would be), manifests first.
    pub deleted_keys: Vec<String>,
}

fn age(now: SystemTime, meta: &ObjectMeta) -> Duration {
    let modified = SystemTime::from(meta.last_modified);
    now.duration_since(modified).unwrap_or(Duration::ZERO)
}

impl VolumeStore {
    /// One garbage collection pass; see the module docs for what is kept.
    pub async fn gc(&self, opts: GcOptions) -> Result<GcReport, ObjStoreError> {
        let now = opts.now.unwrap_or_else(SystemTime::now);
        let keep = opts.keep_manifests.max(1);
        let mut report = GcReport {
            dry_run: opts.dry_run,
            ..GcReport::default()
        };

        // 1. Which manifests stay by age and rank, and every snapshot's. Snapshots are listed
        // after the manifests (see snapshot.rs for why that order keeps a new snapshot).
        let manifests = self.list_manifests(None).await?;
        let pinned = self.pinned_generations().await?;
        // (Not among `pinned`: a generation 1 an older GC pruned must not stop GC.)
        let clone = self.origin().await?.is_some();
        // A pinned generation newer than the listing was published (and snapshotted) since:
        // every pack it maps is the newest listed manifest's or stored after it (rule 3).
        let newest = manifests.last().map_or(0, |(g, _)| *g);
        if let Some(missing) = pinned
            .iter()
            .find(|g| **g <= newest && !manifests.iter().any(|(m, _)| m == *g))
        {
            return Err(ObjStoreError::InvalidInput(format!(
                "gc refused: volume `{}` has a snapshot of generation {missing}, whose manifest is not in the store",
                self.volume
            )));
        }
        let newest_kept = manifests.len().saturating_sub(keep);
        let retained: Vec<u64> = manifests
            .iter()
            .enumerate()
            .filter(|(i, (g, meta))| {
                *i >= newest_kept
                    || age(now, meta) < opts.grace
                    || pinned.contains(g)
                    || (clone && *g == 1)
            })
            .map(|(_, (g, _))| *g)
            .collect();

        // 2. What they reference: packs, and older objects holding their segments.
        let (referenced, holders) = stream::iter(retained.clone())
            .map(|g| self.fetch_references(g))
            .buffer_unordered(self.cfg.upload_concurrency)
            .try_fold(
                (HashSet::new(), BTreeSet::new()),
                |(mut acc, mut gens), (packs, g)| async move {
                    acc.extend(packs);
                    gens.extend(g);
                    Ok((acc, gens))
                },
            )
            .await?;
        let mut pruned = Vec::new();
        for (generation, meta) in &manifests {
            if retained.contains(generation) || holders.contains(generation) {
                report.manifests_retained.push(*generation);
            } else {
                pruned.push(meta.clone());
                report.manifests_deleted.push(*generation);
            }
        }

        // 3. Which packs go.
        let dir = self.layout.pack_dir();
        let packs: Vec<ObjectMeta> = with_retry(&self.cfg, "list packs", dir.as_ref(), |_| {
            self.store.list(Some(dir)).try_collect::<Vec<_>>()
        })
        .await?;
        // Store time of the newest manifest: packs stored at or after it may be published yet.
        let newest_publish = manifests.last().map(|(_, meta)| meta.last_modified);
        let mut doomed = Vec::new();
        for meta in packs {
            let Some(id) = self.layout.parse_pack(&meta.location) else {
                continue;
            };
            let unpublished = newest_publish.is_none_or(|t| meta.last_modified >= t);
            if referenced.contains(&id) {
                report.packs_referenced += 1;
            } else if unpublished || age(now, &meta) < opts.grace {
                report.packs_in_grace += 1;
            } else {
                report.packs_deleted.push(id);
                doomed.push(meta);
            }
        }
        doomed.sort_by(|a, b| a.location.cmp(&b.location));
        report.packs_deleted.sort();
        // The plan, checked against its invariant before anything goes (see invariants.rs).
        let mut must_keep = pinned.clone();
        if clone {
            must_keep.push(1);
        }
        invariants::keeps_pinned(
            &must_keep,
            &report.manifests_deleted,
            |p| referenced.contains(p),
            &report.packs_deleted,
        )
        .map_err(|v| {
            ObjStoreError::InvalidInput(format!(
                "gc refused: volume `{}`: {v}; nothing deleted",
                self.volume
            ))
        })?;

        let victims: Vec<ObjectMeta> = pruned.into_iter().chain(doomed).collect();
        report.bytes_deleted = victims.iter().map(|m| m.size).sum();
        report.deleted_keys = victims.iter().map(|m| m.location.to_string()).collect();

        // 5. Delete: manifests first (they come first in `victims`), then packs.
        if !opts.dry_run {
            let manifest_count = report.manifests_deleted.len();
            let (manifest_victims, pack_victims) = victims.split_at(manifest_count);
            for meta in manifest_victims {
                self.delete_object(meta).await?;
            }
            // Lazy futures collected first, so the returned future stays `Send`.
            let deletes: Vec<_> = pack_victims
                .iter()
                .map(|meta| self.delete_object(meta))
                .collect();
            stream::iter(deletes)
                .buffer_unordered(self.cfg.upload_concurrency)
                .try_collect::<()>()
                .await?;
        }
        tracing::info!(
            volume = %self.volume,
            dry_run = opts.dry_run,
            manifests_deleted = report.manifests_deleted.len(),
            packs_deleted = report.packs_deleted.len(),
            bytes = report.bytes_deleted,
            "gc pass finished"
        );
        Ok(report)
    }

    /// Deletes one object; one already gone counts as deleted.
    async fn delete_object(&self, meta: &ObjectMeta) -> Result<(), ObjStoreError> {
        let path = &meta.location;
        match with_retry(&self.cfg, "delete", path.as_ref(), |_| {
            self.store.delete(path)
        })
        .await
        {
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
            other => other,
        }
    }
}
