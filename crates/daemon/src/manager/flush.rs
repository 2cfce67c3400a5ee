//! Flush and compaction on demand (`POST /v1/volumes/{name}/flush`, `.../compact`).

use glidefs_model::api::{CompactResult, FlushReport};

use super::{flusher, ManagerError, VolumeManager};

impl VolumeManager {
    /// Runs `sync_to_store` now and waits for it.
    pub async fn flush(&self, name: &str) -> Result<FlushReport, ManagerError> {
        let entry = self.entry(name)?;
        let open = entry.open()?;
        let (r, took) = flusher::flush_now(&open.volume, &entry.flush)
            .await
            .map_err(|e| open.error(name, "flush", e))?;
        Ok(FlushReport {
            name: name.to_string(),
            generation: r.generation,
            blocks: r.blocks,
            packs: r.packs,
            bytes: r.bytes,
            evicted: r.evicted,
            duration_ms: u64::try_from(took.as_millis()).unwrap_or(u64::MAX),
        })
    }

    /// One compaction pass of `name` now, then (with `gc`) one GC pass, with the daemon's
    /// `[space]` and `[gc]` options.
    pub async fn compact(&self, name: &str, gc: bool) -> Result<CompactResult, ManagerError> {
        let started = std::time::Instant::now();
        let entry = self.entry(name)?;
        let open = entry.open()?;
        let v = &open.volume;
        let fail = |what, e| open.error(name, what, e);
        let c = v
            .compact(self.opts.space.compact)
            .await
            .map_err(|e| fail("compact", e))?;
        let mut out = CompactResult {
            name: name.to_string(),
            packs_below_threshold: c.packs_below_threshold,
            packs_rewritten: c.packs_rewritten,
            bytes_copied: c.bytes_written,
            blocks_moved: c.blocks_moved,
            publishes: c.publishes,
            generation: c.generation,
            ..Default::default()
        };
        if gc {
            let r = v
                .collect_garbage(self.opts.space.gc.clone())
                .await
                .map_err(|e| fail("gc", e))?;
            out.gc_packs_deleted = r.packs_deleted.len() as u64;
            out.gc_bytes_deleted = r.bytes_deleted;
        }
        let s = v.stats().await;
        out.stored_bytes = s.stored_bytes;
        out.live_bytes = s.live_bytes;
        out.duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        Ok(out)
    }
}
