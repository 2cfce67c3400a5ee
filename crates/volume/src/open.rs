//! The steps of `Volume::open`, each a function of what it needs:
//! 1. [`view_of`]: a snapshot view or a read-only export owns nothing (no claim, no
//!    publisher) and registers under its snapshot as a holder;
//! 2. [`load_manifest`]: the latest manifest (or the snapshot's), checked against the
//!    config's geometry and owner; a larger size than the store's grows the volume;
//! 3. [`recover_cache`]: the cache directory recovered and judged against that manifest
//!    (`base`), on the blocking pool;
//! 4. [`holds_claim`] and [`claim`]: whether this owner's claim still stands (a clean close on
//!    the latest generation), else the claim published.
//!
//! Then `Volume::open` builds the handle from what they returned.

use std::sync::Arc;

use glidefs_cache::{Cache, CacheOptions, Geometry};
use glidefs_objstore::{Manifest, ManifestOwner, VolumeStore};

use crate::base::{self, record_base, Verdict};
use crate::blocking::blocking;
use crate::config::VolumeConfig;
use crate::error::{Result, VolumeError};
use crate::pins::{load_view, ANONYMOUS_HOLDER};
use crate::publisher::{publish_owner_change, Publisher};

/// What a handle is, from its config (step 1).
pub(crate) struct View {
    /// A snapshot view or a read-only export: no claim, no release, no publisher.
    pub(crate) read_only: bool,
    /// A snapshot view's holder id (the owner id, or [`ANONYMOUS_HOLDER`]).
    pub(crate) holder: Option<String>,
}

/// Step 1: reads what kind of handle `cfg` asks for; a view's owner id becomes its holder id
/// and is dropped from `cfg` (a view claims nothing).
pub(crate) fn view_of(cfg: &mut VolumeConfig) -> View {
    let holder = cfg
        .snapshot
        .as_ref()
        .map(|_| cfg.owner.clone().unwrap_or_else(|| ANONYMOUS_HOLDER.into()));
    let read_only = cfg.snapshot.is_some() || cfg.read_only;
    if read_only {
        cfg.owner = None;
    }
    View { read_only, holder }
}

/// Step 2: the manifest the volume opens on: the latest (an empty one for a new volume) or
/// the snapshot's, refused when its block size differs or its size is larger than `cfg`'s
/// (`GeometryMismatch`), or when another owner holds it and `cfg.takeover` is not set
/// (`OwnedElsewhere`, before the cache directory is touched). A larger `cfg.size` is a
/// resize the store has not published yet: the manifest grows to it.
pub(crate) async fn load_manifest(cfg: &VolumeConfig, store: &VolumeStore) -> Result<Manifest> {
    let mut manifest = match &cfg.snapshot {
        Some(name) => load_view(cfg, store, name).await?,
        None => store
            .load_manifest()
            .await
            .map_err(|e| VolumeError::store("load manifest", &cfg.name, e))?
            .unwrap_or_else(|| Manifest::new(&cfg.name, cfg.block_size, cfg.size)),
    };
    if manifest.block_size != cfg.block_size || manifest.volume_size > cfg.size {
        return Err(VolumeError::GeometryMismatch {
            volume: cfg.name.clone(),
            stored: format!(
                "size={} block_size={}",
                manifest.volume_size, manifest.block_size
            ),
            requested: format!("size={} block_size={}", cfg.size, cfg.block_size),
        });
    }
    if let (Some(me), Some(holder)) = (&cfg.owner, &manifest.owner) {
        if holder.id != *me && !holder.released {
            if !cfg.takeover {
                return Err(VolumeError::OwnedElsewhere {
                    volume: cfg.name.clone(),
                    owner: holder.id.clone(),
                    generation: manifest.generation,
                });
            }
            tracing::warn!(volume = %cfg.name, owner = %me, previous = %holder.id, generation = manifest.generation, "taking the volume over from its owner: its unpublished writes are lost");
        }
    }
    if manifest.volume_size < cfg.size {
        tracing::info!(volume = %cfg.name, stored = manifest.volume_size, size = cfg.size, "opening at a larger size than the store's manifest: the volume grows");
        manifest.volume_size = cfg.size;
    }
    Ok(manifest)
}

/// What step 3 found in the cache directory.
pub(crate) struct Recovered {
    pub(crate) cache: Arc<Cache>,
    pub(crate) manifest: Manifest,
    /// The base file as it was before this open (see `base`).
    pub(crate) recorded: Option<base::Base>,
    pub(crate) verdict: Verdict,
    /// The generation of a clean close recorded by the last owner (see `base`).
    pub(crate) closed: Option<u64>,
}

/// Step 3: recovers the cache directory and judges it against `manifest` (see `base`): a
/// stale cache drops its clean copies, a view's cache is kept only on the generation it
/// serves (and refused if it holds a writer's unpublished blocks), and the blocks the store
/// holds are marked remote. Everything that touches the directory or scans the state map or
/// the manifest runs here, in one closure on the blocking pool.
pub(crate) async fn recover_cache(
    cfg: &VolumeConfig,
    geo: Geometry,
    manifest: Manifest,
    view: bool,
) -> Result<Recovered> {
    let (dir, hook, name) = (cfg.dir.clone(), cfg.crash_hook.clone(), cfg.name.clone());
    let owner = cfg.owner.clone();
    let key = cfg.encryption_key.clone();
    blocking(move || {
        let closed = base::take_closed(&dir)?;
        let cache = Cache::open(&dir, geo, CacheOptions { crash_hook: hook })?;
        // Before anything of this cache can reach the store under this key.
        crate::key_id::check_or_record(&dir, &name, key.as_deref())?;
        let recorded = base::load(&dir)?;
        let counts = cache.stats();
        let unpublished = counts.dirty + counts.syncing;
        let mut verdict = base::judge(recorded.as_ref(), &manifest, unpublished, owner.as_deref());
        if view {
            // A view's local state is keyed to the generation it serves: a cache built on
            // any other one (a newer snapshot, the live volume) holds Clean copies of other
            // bytes, so they go whatever `judge` says. Unpublished blocks are a writer's
            // acknowledged writes: never served by a view, never dropped by one.
            if unpublished > 0 {
                return Err(VolumeError::InvalidConfig {
                    volume: name.clone(),
                    detail: format!(
                        "the cache directory holds {unpublished} unpublished blocks of a writer: a read-only view cannot use it"
                    ),
                });
            }
            if verdict != Verdict::Current {
                verdict = Verdict::Stale;
            }
        }
        if verdict == Verdict::Stale {
            // Nothing unpublished, but the Clean copies may predate the newer generation.
            let dropped = cache.evict_to(0)?;
            // Blocks it unmapped are in the store no more: their remote bits go, durably
            // (a checkpoint) before the newer generation is adopted below, so a crash
            // in between finds the cache stale again and clears them again.
            let unmapped = cache.clear_remote_except(manifest.blocks());
            if unmapped > 0 {
                cache.checkpoint()?;
            }
            tracing::warn!(volume = %name, generation = manifest.generation, dropped, unmapped, "another writer published since this cache was used: local clean copies dropped");
        }
        let adopted = base::Base {
            generation: manifest.generation,
            publishing: None,
        };
        if !matches!(verdict, Verdict::Diverged(_)) && recorded.as_ref() != Some(&adopted) {
            base::store(&dir, &adopted)?;
        }
        if view && verdict == Verdict::Current {
            // A view serves what the store maps and nothing else: a remote bit of a block
            // its map names nowhere (an export's adoption that failed before its
            // checkpoint, whose cleared bits the WAL's replay set again) would fail every
            // read of that block. O(allocated leaves + mapped blocks).
            let stale = cache.clear_remote_except(manifest.blocks());
            if stale > 0 {
                cache.checkpoint()?;
                tracing::info!(volume = %name, generation = manifest.generation, stale, "cleared remote bits of blocks the store maps nowhere");
            }
        }
        cache.set_remote(manifest.blocks());
        Ok(Recovered {
            cache: Arc::new(cache),
            manifest,
            recorded,
            verdict,
            closed,
        })
    })
    .await
}

/// Step 4a: whether this owner's claim still stands, so the open publishes none: a clean
/// close by this owner on the latest generation, after which nothing of the predecessor can
/// still land (see `base`, clean close).
pub(crate) fn holds_claim(cfg: &VolumeConfig, r: &Recovered) -> bool {
    let m = &r.manifest;
    r.verdict == Verdict::Current
        && !cfg.takeover
        && r.closed == Some(m.generation)
        && r.recorded
            .as_ref()
            .is_some_and(|b| b.generation == m.generation && b.publishing.is_none())
        && m.owner
            .as_ref()
            .is_some_and(|o| Some(&o.id) == cfg.owner.as_ref() && !o.released)
}

/// Step 4b: claims the volume for `owner`: publishes `current`'s successor (same block map)
/// with this owner's record, bracketed by the cache's base file (`publishing G =owner`, then
/// `base G`) so a crash between the publish and the record is recognised as our own claim.
pub(crate) async fn claim(
    cfg: &VolumeConfig,
    publisher: &Publisher,
    current: Manifest,
    owner: &str,
) -> Result<Manifest> {
    let mut next = blocking(move || Ok(current.successor())).await?;
    next.owner = Some(ManifestOwner {
        id: owner.to_string(),
        claimed_at: next.generation,
        released: false,
    });
    publish_owner_change(cfg, publisher, &mut next).await?;
    record_base(cfg, next.generation, None).await?;
    tracing::info!(volume = %cfg.name, owner, generation = next.generation, "volume claimed");
    Ok(next)
}
