//! Compaction (`Volume::compact`): packs mostly dead are rewritten with their live frames only.
//!
//! Under random overwrites nearly every pack keeps a few live blocks, so GC (which deletes
//! only packs no manifest references) frees little. A compaction pass:
//! 1. takes the live bytes per pack from the manifest (`Manifest::pack_use`, kept on every
//!    change) and the object sizes from one LIST; packs a snapshot maps are skipped (see
//!    snapshot.rs; a clone's foreign packs are never listed); packs whose live share (live
//!    frame bytes / object size) is under `threshold` are candidates, emptiest first, up to `max_bytes` of
//!    live frames per pass (the rate limit: the daemon runs passes on a timer);
//! 2. reads the candidates' live frames (one ranged GET per run of adjacent frames; the
//!    store coalesces nearby ranges) and copies them as they are (no decompression, no
//!    recompression) into a new pack (`PackBuilder::add_frame` checks each frame's crc and
//!    block first). This holds no lock: flushes and guest I/O go on;
//! 3. each time the new pack is full (`pack_bytes`, or `max_bytes` if smaller: a pass's
//!    output packs are no bigger than a pass, so later passes rewrite them in steps as
//!    small), and once at the end: under the flusher's lock, uploads it and publishes the
//!    next generation, in which every block that still points at the location it was copied
//!    from points at its copy; a block written (and flushed) since keeps its newer location,
//!    and its copy is simply dead (a pack with no copy left is not uploaded). The publish is
//!    fenced like a flush's and bracketed by the base file the same way (`publishing G <the
//!    new pack>`, then `base G`), so a crash in between is recognised as ours.
//!
//! Why the upload is under the lock: a pack stored before the newest manifest and named by
//! none is what GC deletes (objstore gc.rs, rule 3), possibly from a listing taken earlier.
//! Uploaded and published with no other publish in between, the copies are always stored
//! after the newest manifest until the publish naming them lands, exactly as a flush's packs
//! are. (Uploading without the lock meant uploading again, under fresh ids, whenever a flush
//! published meanwhile: under a busy flusher, nearly every pass.) The price is that a flush
//! waits for at most one pack upload and one publish; the memory held is one new pack and
//! one source pack's live frames.
//!
//! The cache is not touched: a block's bytes are the same in the old and the new pack.
//!
//! Crash safety: a crash (or error) before a publish leaves at most one new pack that no
//! manifest names: GC collects it (it is younger than the next manifest and so kept while a
//! publish may still come). A pass that stops half way has published whole packs only. A
//! publish whose outcome is unknown (lost reply) is kept as the flusher's pending attempt and
//! re-sent, unchanged, before the next flush or pass publishes anything (`finish_remap`); if
//! the store then says one of its packs is missing, it never landed (a landed manifest's
//! packs are kept by GC) and it is dropped. Old packs stay until GC finds no retained
//! manifest naming them.
//!
//! Cost: each pass copies the live frames of the packs it rewrites, so the bytes uploaded per
//! byte freed are `share / (1 - share)` for a pack at live share `share` (1 at the default
//! threshold of 0.5); see docs/engine/space.md, "Cost per guest byte".

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;

use glidefs_cache::CrashPoint;
use glidefs_objstore::{BlockLocation, EncodedPack, PackBuilder, PackId};

use crate::attempt::PublishAttempt;
use crate::base::record_base;
use crate::blocking::blocking;
use crate::error::{Result, VolumeError};
use crate::shared::Shared;
use crate::snapshot::Snapshots;
use crate::sync::Flusher;

/// Sequence numbers of compaction packs start here (flush packs count from 1), so the two
/// never share an id prefix.
const SEQ_BASE: u64 = 0x8000_0000;

/// What one compaction pass may do.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CompactOptions {
    /// Packs whose live share is below this (0.0..=1.0) are rewritten.
    pub threshold: f64,
    /// Most live bytes copied per pass (at least one pack is always taken).
    pub max_bytes: u64,
}

impl Default for CompactOptions {
    fn default() -> Self {
        Self {
            threshold: 0.5,
            max_bytes: 256 << 20,
        }
    }
}

/// What a compaction pass found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CompactReport {
    /// Pack objects listed and their total size (referenced or not).
    pub packs_stored: u64,
    pub stored_bytes: u64,
    /// Live frame bytes of the manifest the pass started from.
    pub live_bytes: u64,
    /// Packs under the threshold; of those, chosen for this pass (all rewritten unless the
    /// pass stopped early: an error, or a flush's publish pending).
    pub packs_below_threshold: u64,
    pub packs_rewritten: u64,
    /// Packs left alone because a snapshot maps them (rewriting one frees nothing).
    pub packs_pinned: u64,
    /// New packs uploaded and their bytes.
    pub packs_written: u64,
    pub bytes_written: u64,
    /// Blocks now pointing at a copy; blocks written meanwhile (their copy is dead).
    pub blocks_moved: u64,
    pub blocks_skipped: u64,
    /// Generations published (one per new pack), and the last one, if any.
    pub publishes: u64,
    pub generation: Option<u64>,
}

/// Compaction passes over a volume's shared state.
pub(crate) struct Compactor<'a> {
    pub(crate) v: &'a Shared,
}

impl Compactor<'_> {
    /// [`Volume::compact`](crate::Volume::compact): see there.
    pub(crate) async fn compact(&self, opts: CompactOptions) -> Result<CompactReport> {
        self.v.publisher("compaction")?;
        self.v.check_fence()?;
        self.v.check_writable()?;
        if !(0.0..=1.0).contains(&opts.threshold) {
            return Err(VolumeError::InvalidConfig {
                volume: self.v.cfg.name.clone(),
                detail: format!("compaction threshold {} is not in 0..=1", opts.threshold),
            });
        }
        let mut report = CompactReport::default();
        // 1. Live bytes per pack, object sizes, candidates.
        let manifest = self.v.manifest.clone();
        let pack_use = blocking(move || Ok(manifest.read().pack_use())).await?;
        report.live_bytes = pack_use.values().map(|u| u.bytes).sum();
        let listed = self
            .v
            .store
            .list_packs()
            .await
            .map_err(|e| VolumeError::store("list packs", &self.v.cfg.name, e))?;
        self.v.stored.listed(&listed);
        report.packs_stored = listed.len() as u64;
        report.stored_bytes = listed.iter().map(|p| p.size).sum();
        let pinned = Snapshots { v: self.v }.pinned_packs().await?;
        let mut below: Vec<(f64, PackId, u64)> = listed
            .iter()
            .filter(|p| {
                let pin = pinned.contains(&p.id);
                report.packs_pinned += u64::from(pin);
                !pin
            })
            .filter_map(|p| {
                let live = pack_use.get(&p.id)?.bytes;
                let share = live as f64 / p.size.max(1) as f64;
                (share < opts.threshold).then(|| (share, p.id.clone(), live))
            })
            .collect();
        below.sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| a.1.cmp(&b.1)));
        report.packs_below_threshold = below.len() as u64;
        let mut chosen = BTreeSet::new();
        let mut budget = 0u64;
        for (_, id, live) in below {
            if !chosen.is_empty() && budget + live > opts.max_bytes {
                break;
            }
            budget += live;
            chosen.insert(id);
        }
        if chosen.is_empty() {
            return Ok(report);
        }
        report.packs_rewritten = chosen.len() as u64;
        // 2-3. Copy the live frames, one new pack at a time, each then uploaded and
        // published under the flusher's lock.
        let manifest = self.v.manifest.clone();
        let moves = blocking(move || Ok(manifest.read().blocks_in(&chosen))).await?;
        // A pass copies about `max_bytes`: its new packs are no bigger (smaller packs are
        // compacted again in smaller steps).
        let pack_limit = self
            .v
            .cfg
            .pack_bytes
            .min(opts.max_bytes)
            .max(u64::from(self.v.cfg.block_size));
        self.copy_frames(moves, pack_limit, &mut report).await?;
        if report.generation.is_some() {
            self.v.compaction.passes.fetch_add(1, Ordering::Relaxed);
            self.v
                .compaction
                .packs_rewritten
                .fetch_add(report.packs_rewritten, Ordering::Relaxed);
        }
        Ok(report)
    }

    /// Reads the frames of `moves` (every block pointing into the chosen packs, with its
    /// location), pack by pack, and copies them into new packs of about `pack_limit` each;
    /// each one, once full, goes to `publish_copies`. Stops early (`Ok`) when a flush's
    /// publish is pending. Memory: one new pack plus one source pack's live frames.
    async fn copy_frames(
        &self,
        moves: Vec<(u64, BlockLocation)>,
        pack_limit: u64,
        report: &mut CompactReport,
    ) -> Result<()> {
        let mut by_pack: BTreeMap<PackId, Vec<(u64, BlockLocation)>> = BTreeMap::new();
        for (block, loc) in moves {
            by_pack
                .entry(loc.pack.clone())
                .or_default()
                .push((block, loc));
        }
        let (bs, name) = (self.v.cfg.block_size, self.v.cfg.name.clone());
        let store_err = |op: &'static str, e| VolumeError::store(op, &name, e);
        // Copies of sealed frames go into a pack sealed with the same key (the seal binds a
        // frame to its block, not to its pack or offset).
        let key = self.v.store.key().cloned();
        let new_builder = || {
            PackBuilder::new(bs)
                .map(|b| b.with_key(key.clone()))
                .map_err(|e| store_err("build pack", e))
        };
        let mut building = (new_builder()?, Vec::new());
        for (id, mut blocks) in by_pack {
            blocks.sort_by_key(|(_, l)| l.offset);
            let locs: Vec<BlockLocation> = blocks.iter().map(|(_, l)| l.clone()).collect();
            let frames = self
                .v
                .store
                .read_frames(&id, &locs)
                .await
                .map_err(|e| store_err("read frames", e))?;
            for ((block, old), frame) in blocks.into_iter().zip(frames) {
                let (builder, olds) = &mut building;
                builder
                    .add_frame(block, &frame, old.raw_crc)
                    .map_err(|e| store_err("copy frame", e))?;
                olds.push(old);
                if builder.encoded_bytes() as u64 >= pack_limit {
                    let full = std::mem::replace(&mut building, (new_builder()?, Vec::new()));
                    if !self.publish_copies(full, report).await? {
                        return Ok(());
                    }
                }
            }
        }
        if !building.0.is_empty() {
            self.publish_copies(building, report).await?;
        }
        Ok(())
    }

    /// Uploads one pack of copies and publishes the remaps that still apply, all under the
    /// flusher's lock, so no other manifest is published between the upload and the publish
    /// (see the module docs). `olds` holds the old location of each block added to `builder`,
    /// in order. Returns false when a flush's publish is pending (it goes first; the pass
    /// stops).
    async fn publish_copies(
        &self,
        (builder, olds): (PackBuilder, Vec<BlockLocation>),
        report: &mut CompactReport,
    ) -> Result<bool> {
        self.v.cache.crash_point(CrashPoint::BeforePackUpload)?;
        let mut st = self.v.sync.lock().await;
        self.v.check_open()?;
        self.v.check_writable()?;
        Flusher { v: self.v }.finish_remap(&mut st).await?;
        if st.attempt.is_some() {
            return Ok(false);
        }
        let g = self.v.manifest_generation() + 1;
        let pack = builder.finish(self.copy_id(g));
        let total = olds.len() as u64;
        let (current, owned) = (self.v.manifest.clone(), self.v.cfg.owner.is_some());
        let locations = pack.locations.clone();
        let size = self.v.size();
        let (next, moved) = blocking(move || {
            let mut next = current.read().successor();
            next.volume_size = next.volume_size.max(size);
            if !owned {
                next.owner = None;
            }
            let mut moved = 0u64;
            for ((block, new), old) in locations.into_iter().zip(olds) {
                if next.get(block) == Some(&old) {
                    next.insert(block, new);
                    moved += 1;
                }
            }
            Ok((next, moved))
        })
        .await?;
        report.blocks_moved += moved;
        report.blocks_skipped += total - moved;
        if moved == 0 {
            // Every block was written again since it was copied: nothing to publish.
            return Ok(true);
        }
        debug_assert_eq!(next.generation, g);
        self.upload_counted(&pack).await?;
        report.packs_written += 1;
        report.bytes_written += pack.bytes.len() as u64;
        self.v.cache.crash_point(CrashPoint::AfterPackUpload)?;
        record_base(&self.v.cfg, g - 1, Some((g, pack.id.as_str().to_string()))).await?;
        st.attempt = Some(PublishAttempt {
            rotation: None,
            manifest: next,
            packs: Vec::new(),
            blocks: moved,
        });
        Flusher { v: self.v }.finish_remap(&mut st).await?;
        if self.v.manifest_generation() == g {
            report.generation = Some(g);
            report.publishes += 1;
            self.v
                .compaction
                .bytes_copied
                .fetch_add(pack.bytes.len() as u64, Ordering::Relaxed);
        }
        Ok(true)
    }

    /// A fresh id for a pack of copies meant for `generation`.
    fn copy_id(&self, generation: u64) -> PackId {
        let seq = SEQ_BASE + self.v.compaction.seq.fetch_add(1, Ordering::Relaxed);
        PackId::generate(generation, seq)
    }

    /// Uploads one pack of copies and counts it (uploads, stored bytes).
    async fn upload_counted(&self, pack: &EncodedPack) -> Result<()> {
        self.v
            .store
            .upload_pack(pack)
            .await
            .map_err(|e| VolumeError::store("upload pack", &self.v.cfg.name, e))?;
        let bytes = pack.bytes.len() as u64;
        self.v.uploads.packs.fetch_add(1, Ordering::Relaxed);
        self.v.uploads.bytes.fetch_add(bytes, Ordering::Relaxed);
        self.v.stored.uploaded(bytes);
        Ok(())
    }
}
