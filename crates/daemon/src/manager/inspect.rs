//! What the manager shows of its volumes: inspect, list, the volumes still recovering
//! (`/readyz`) and the figures of `/metrics`.

use std::time::Duration;

use glidefs_model::api::{DeviceInfo, SpaceInfo, ThrottleInfo, VolumeInfo, VolumeState};
use glidefs_ublk::export::IoStats;

use super::{Entry, EntryState, ManagerError, VolumeManager, VolumeMetrics};

impl VolumeManager {
    /// One volume's description.
    pub async fn inspect(&self, name: &str) -> Result<VolumeInfo, ManagerError> {
        let entry = self.entry(name)?;
        Ok(self.info(&entry).await)
    }

    /// Every volume, by name.
    pub async fn list(&self) -> Vec<VolumeInfo> {
        let entries: Vec<_> = self.volumes.read().values().cloned().collect();
        let mut out = Vec::with_capacity(entries.len());
        for e in entries {
            out.push(self.info(&e).await);
        }
        out
    }

    pub(super) async fn info(&self, entry: &Entry) -> VolumeInfo {
        let spec = &entry.spec;
        let bs = u64::from(spec.block_size);
        let mut info = VolumeInfo {
            name: spec.name.clone(),
            state: VolumeState::Failed,
            error: None,
            size: spec.size,
            block_size: spec.block_size,
            queues: spec.queues,
            queue_depth: spec.queue_depth,
            read_only: spec.read_only,
            prefix: spec.prefix.clone(),
            cache_dir: entry.dir.display().to_string(),
            device: DeviceInfo::default(),
            dirty_bytes: 0,
            syncing_bytes: 0,
            cache_bytes: 0,
            remote_blocks: 0,
            manifest_generation: 0,
            fenced: false,
            cold_reads: 0,
            store_gets: 0,
            fetched_bytes: 0,
            flush: entry.flush.info(),
            space: Default::default(),
            snapshot: spec.snapshot.as_ref().map(ToString::to_string),
            encryption_key_id: None,
            durability: spec.durability,
            qos: (!spec.qos.is_empty()).then_some(spec.qos),
            throttled: None,
        };
        let open = match entry.open() {
            Ok(o) => o,
            Err(e) => {
                if matches!(*entry.state.lock(), EntryState::Recovering { .. }) {
                    info.state = VolumeState::Recovering;
                }
                info.error = Some(e.to_string());
                return info;
            }
        };
        let mut written = 0;
        if let Some(dev) = open.device.lock().as_ref() {
            let stats = dev.io_stats();
            written = stats.op(ublk_core::IoOp::Write).bytes;
            info.throttled = dev.id().map(|_| ThrottleInfo {
                requests: stats.throttled,
                seconds: Duration::from_nanos(stats.throttled_ns).as_secs_f64(),
            });
            info.device = DeviceInfo {
                id: dev.id(),
                path: dev.path(),
                transport: dev.transport(),
            };
        }
        info.encryption_key_id = open
            .volume
            .config()
            .encryption_key
            .as_ref()
            .map(|k| k.id().to_string());
        let group = open.volume.group_figures();
        info.flush.store_flushes = group.flushes;
        info.flush.store_syncs = group.syncs;
        let s = open.volume.stats().await;
        info.dirty_bytes = s.cache.dirty * bs;
        info.syncing_bytes = s.cache.syncing * bs;
        info.cache_bytes = (s.cache.clean + s.cache.dirty + s.cache.syncing) * bs;
        info.remote_blocks = s.cache.remote;
        info.manifest_generation = s.manifest_generation;
        info.cold_reads = s.blocks_fetched;
        info.store_gets = s.store_gets;
        info.fetched_bytes = s.bytes_fetched;
        info.space = SpaceInfo {
            stored_bytes: s.stored_bytes,
            live_bytes: s.live_bytes,
            mapped_blocks: s.mapped_blocks,
            uploaded_bytes: s.bytes_uploaded,
            guest_written_bytes: written,
            write_amplification: (written > 0).then(|| s.bytes_uploaded as f64 / written as f64),
            compactions: s.compactions,
            compacted_bytes: s.bytes_compacted,
        };
        match open.volume.fenced() {
            Some(f) => {
                info.state = VolumeState::Fenced;
                info.fenced = true;
                info.error = Some(f.to_string());
            }
            None => info.state = VolumeState::Running,
        }
        info
    }

    /// Names of the volumes still `recovering` (restored, not open yet: `/readyz` waits for
    /// them).
    pub fn recovering(&self) -> Vec<String> {
        self.volumes
            .read()
            .values()
            .filter(|e| matches!(*e.state.lock(), EntryState::Recovering { .. }))
            .map(|e| e.spec.name.clone())
            .collect()
    }

    /// Figures of every volume for `/metrics`.
    pub async fn metrics(&self) -> Vec<VolumeMetrics> {
        let entries: Vec<_> = self.volumes.read().values().cloned().collect();
        let mut out = Vec::with_capacity(entries.len());
        for e in entries {
            let open = e.open().ok();
            let recovering = matches!(*e.state.lock(), EntryState::Recovering { .. });
            let (io, stats, fenced) = match &open {
                Some(o) => {
                    let io = o.device.lock().as_ref().map(|d| d.io_stats());
                    let stats = o.volume.stats().await;
                    (
                        io.unwrap_or_default(),
                        Some(stats),
                        o.volume.fenced().is_some(),
                    )
                }
                None => (IoStats::default(), None, false),
            };
            out.push(VolumeMetrics {
                name: e.spec.name.clone(),
                io,
                stats,
                recovering,
                block_size: u64::from(e.spec.block_size),
                fenced,
                flush: e.flush.clone(),
            });
        }
        out
    }
}
