//! Restart after a crash: `state.json` records each volume's device id. [`VolumeManager::restore`]
//! reopens the volumes, `RESTORE_PARALLEL` at a time (each its own cache and device, so
//! their order does not matter), each one's cache replaying its WAL, and asks the exporter to
//! [`reattach`](Exporter::reattach) that device: a device the dead daemon left QUIESCED is
//! taken over with I/O held meanwhile (the filesystem above stays mounted); a missing one is
//! created again, with the same id when it is free. A volume whose open fails because the
//! object store does not answer is `recovering` and re-opened in the background with backoff
//! until the store answers (see [`reopen`]); its QUIESCED device keeps holding I/O meanwhile.

use std::sync::Arc;

use futures::StreamExt;
use glidefs_model::log::chain;

use super::flusher::FlushStats;
use super::{blocking, recovering, state, Entry, EntryState, ManagerError, VolumeManager};

/// How many volumes [`VolumeManager::restore`] opens at a time. Each open waits mostly on the
/// store (manifest, claim) and on its device's control commands (user recovery of a QUIESCED
/// device, or a new device), so a restart after a crash with many volumes takes about
/// 1/RESTORE_PARALLEL of the serial time; the in-flight opens cost a few threads of the
/// blocking pool.
const RESTORE_PARALLEL: usize = 16;

impl VolumeManager {
    /// Re-opens every volume listed in `state.json` (as `attach_existing`). A volume whose
    /// open fails because the object store does not answer is `recovering`: a background task
    /// opens it once the store answers ([`reopen`]). A volume that fails to open for another
    /// reason stays listed as `failed` with the reason. Returns how many opened now.
    pub async fn restore(self: &Arc<Self>) -> Result<usize, ManagerError> {
        let _admin = self.admin.lock().await;
        let path = self.opts.state_path.clone();
        let (specs, pending) = blocking(move || Ok(state::load_all(&path)?)).await?;
        let started = std::time::Instant::now();
        // What a crash interrupted: creates and clones undone, purges finished; a volume
        // whose purge could not finish is `failed` (not opened: it is half deleted).
        let (specs, mut changed) = self.resume_pending(specs, pending).await;
        let count = specs.len();
        // Volumes open side by side (each waits mostly on the store and on its device's
        // control commands), RESTORE_PARALLEL at a time, in state.json's order.
        let results: Vec<_> = futures::stream::iter(specs.into_iter().map(|spec| async move {
            let dir = self.opts.volumes_dir.join(&spec.name);
            let flush = Arc::new(FlushStats::default());
            let opened = self.open_volume(&spec, &dir, &flush, false, None).await;
            (spec, dir, flush, opened)
        }))
        .buffered(RESTORE_PARALLEL)
        .collect()
        .await;
        let mut opened = 0;
        let mut recovering = Vec::new();
        for (mut spec, dir, flush, result) in results {
            let state = match result {
                Ok(open) => {
                    opened += 1;
                    let id = open.device_id();
                    tracing::info!(volume = %spec.name, device = ?id, "volume re-attached");
                    if id.is_some() && id != spec.device_id {
                        spec.device_id = id;
                        changed = true;
                    }
                    EntryState::Open(Arc::new(open))
                }
                Err(e) if recovering::worth_retrying(&e) => {
                    tracing::warn!(volume = %spec.name, error = %chain(&e), "volume recovering: the object store does not answer; retrying in the background");
                    EntryState::Recovering {
                        attempts: 1,
                        error: e.to_string(),
                    }
                }
                Err(e) => {
                    tracing::error!(volume = %spec.name, error = %chain(&e), "volume could not be re-attached");
                    EntryState::Failed(format!("re-attach at start failed: {e}"))
                }
            };
            let is_recovering = matches!(state, EntryState::Recovering { .. });
            let entry = Arc::new(Entry::new(spec.clone(), dir, flush, state));
            if is_recovering {
                recovering.push(entry.clone());
            }
            self.volumes.write().insert(spec.name, entry);
        }
        if changed {
            self.persist().await?;
        }
        tracing::info!(
            volumes = count,
            opened,
            recovering = recovering.len(),
            parallel = RESTORE_PARALLEL,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "state.json restored"
        );
        for entry in recovering {
            self.spawn_reopen(entry);
        }
        Ok(opened)
    }
}
