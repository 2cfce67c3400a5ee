//! Shutdown: end the re-open tasks, stop every flusher and device, `close()` every volume
//! (local durability); the state file is kept, so the next start re-attaches them all.
//!
//!
//! Hand-off: the same, but every device is detached instead of deleted (it stays, QUIESCED,
//! holding I/O) for the next daemon on this data directory.

use std::sync::atomic::Ordering;

use glidefs_model::log::chain;

use super::{device_step, VolumeManager};

impl VolumeManager {
    /// Stops every device and flusher and closes every volume (local durability). Later
    /// create/remove calls fail with `shutting_down`. Idempotent.
    pub async fn shutdown(&self) {
        self.close_all(false).await;
    }

    /// Hand-off: like [`VolumeManager::shutdown`], but every device is detached instead of
    /// deleted (it stays, QUIESCED, holding I/O) and `state.json` keeps its id, so the next
    /// daemon on this data directory takes it over at its start. Returns how many devices
    /// were kept. Idempotent (a second call keeps nothing).
    pub async fn handoff(&self) -> usize {
        self.close_all(true).await
    }

    async fn close_all(&self, keep_devices: bool) -> usize {
        {
            let mut admin = self.admin.lock().await;
            if *admin {
                return 0;
            }
            *admin = true;
            self.stop.send_replace(true);
        }
        // Creates in flight register or fail first ([`inflight`]).
        self.creates.drain().await;
        let _admin = self.admin.lock().await;
        let entries: Vec<_> = self.volumes.read().values().cloned().collect();
        // Re-open attempts end first (they hold no admin lock): a volume one opened is closed
        // below like the others.
        for e in &entries {
            e.reopen.stop().await;
        }
        let entries: Vec<_> = self.volumes.read().values().cloned().collect();
        let mut kept = 0;
        for e in entries {
            let Some(open) = e.open_or_stopped() else {
                continue;
            };
            let name = &e.spec.name;
            if keep_devices {
                open.closing.store(true, Ordering::Release);
                let start = std::time::Instant::now();
                open.flusher.stop().await;
                tracing::info!(volume = %name, waited_ms = start.elapsed().as_millis() as u64, "flusher stopped (a flush in progress completes first)");
                let device = open.device.lock().take();
                if let Some(dev) = device {
                    match device_step(name, "detach", move || Ok(dev.detach()?)).await {
                        Ok(Some(id)) => {
                            kept += 1;
                            tracing::info!(volume = %name, device = id, "device detached for the next daemon");
                        }
                        Ok(None) => {}
                        Err(err) => {
                            tracing::error!(volume = %name, error = %chain(&err), "detaching the device failed")
                        }
                    }
                }
                if let Err(err) = open.volume.close().await {
                    tracing::error!(volume = %name, error = %chain(&err), "close during hand-off failed");
                } else {
                    tracing::info!(volume = %name, "volume closed");
                }
            } else if let Err(err) = self.teardown(&e, &open, true).await {
                tracing::error!(volume = %name, error = %chain(&err), "shutdown of volume failed");
            } else {
                tracing::info!(volume = %name, "volume closed");
            }
        }
        kept
    }
}
