//! A volume's warm set: recorded, shown and dropped through the API; fetched at every attach
//! (`open::start_volume`, `volume_defaults.warm_budget`).
//!
//! The set itself, its recording and its warm are the engine's (`glidefs_volume`'s `warm.rs`,
//! the store object in `glidefs_objstore`'s `warmset.rs`): a hint of which blocks to fetch
//! first, which can never change what a read returns. The manager checks the request, refuses
//! a second recording while one runs (under the admin lock, so two calls cannot both start
//! one), and maps what the engine reports to the API's [`WarmSetInfo`].
//!
//! The volume must be open here and writable: a read-only export or a snapshot attachment
//! records nothing (`read_only`), as it may store nothing in the volume's objects.

use std::time::Duration;

use glidefs_model::api::{
    RecordWarmSet, StoredWarmSet, WarmRecorded, WarmRecording, WarmReportInfo, WarmSetInfo,
};
use glidefs_volume::{RecordOptions, Volume, WarmStatus, MAX_WARM_BLOCKS, MAX_WARM_WINDOW};

use crate::manager::error::ManagerError;
use crate::manager::VolumeManager;

impl VolumeManager {
    /// Starts recording the warm set of volume `name` (see [`RecordWarmSet`]); answers the
    /// volume's warm-set state with the recording in it.
    pub async fn record_warm_set(
        &self,
        name: &str,
        req: &RecordWarmSet,
    ) -> Result<WarmSetInfo, ManagerError> {
        let opts = check_record(req)?;
        let admin = self.admin.lock().await;
        if *admin {
            return Err(ManagerError::ShuttingDown);
        }
        let open = self.entry(name)?.open()?;
        if let Some(r) = open.volume.warm_status().recording {
            return Err(ManagerError::WarmSetRecording {
                name: name.to_string(),
                detail: format!(
                    "{} blocks so far, {} s left; drop the warm set to end it",
                    r.blocks, r.remaining_secs
                ),
            });
        }
        open.volume
            .record_warm_set(opts)
            .await
            .map_err(|e| open.error(name, "record warm set", e))?;
        drop(admin);
        self.warm_info(name, &open.volume).await
    }

    /// The warm-set state of volume `name`: the stored set (one GET), the recording in
    /// progress, the last recording's and the last warm's outcome.
    pub async fn warm_set(&self, name: &str) -> Result<WarmSetInfo, ManagerError> {
        let open = self.entry(name)?.open()?;
        self.warm_info(name, &open.volume).await
    }

    /// Drops the warm set of volume `name`: a recording in progress ends storing nothing and
    /// the stored set is deleted; later attaches warm nothing (clones made before keep their
    /// copy). Answers the state afterwards.
    pub async fn drop_warm_set(&self, name: &str) -> Result<WarmSetInfo, ManagerError> {
        let open = self.entry(name)?.open()?;
        open.volume
            .drop_warm_set()
            .await
            .map_err(|e| open.error(name, "drop warm set", e))?;
        tracing::info!(volume = %name, "warm set dropped");
        self.warm_info(name, &open.volume).await
    }

    async fn warm_info(&self, name: &str, volume: &Volume) -> Result<WarmSetInfo, ManagerError> {
        let stored = volume
            .warm_set()
            .await
            .map_err(|e| ManagerError::from_volume(name, "get warm set", e))?;
        Ok(info(
            stored.map(|s| StoredWarmSet {
                blocks: s.blocks.len() as u64,
                block_size: s.block_size,
                recorded_unix: s.recorded_unix,
                window_secs: s.window_secs,
            }),
            volume.warm_status(),
        ))
    }
}

/// The engine's options for `req`, or why it is refused.
fn check_record(req: &RecordWarmSet) -> Result<RecordOptions, ManagerError> {
    let invalid = |reason: String| ManagerError::InvalidWarmSet { reason };
    if !(1..=MAX_WARM_WINDOW.as_secs()).contains(&req.seconds) {
        return Err(invalid(format!(
            "seconds {} must be in 1..={}",
            req.seconds,
            MAX_WARM_WINDOW.as_secs()
        )));
    }
    let max_blocks = usize::try_from(req.max_blocks)
        .ok()
        .filter(|n| (1..=MAX_WARM_BLOCKS).contains(n))
        .ok_or_else(|| {
            invalid(format!(
                "max_blocks {} must be in 1..={MAX_WARM_BLOCKS}",
                req.max_blocks
            ))
        })?;
    Ok(RecordOptions {
        window: Duration::from_secs(req.seconds),
        max_blocks,
    })
}

/// The API's view of the engine's warm-set state.
fn info(stored: Option<StoredWarmSet>, s: WarmStatus) -> WarmSetInfo {
    WarmSetInfo {
        stored,
        recording: s.recording.map(|r| WarmRecording {
            blocks: r.blocks,
            max_blocks: r.max_blocks,
            elapsed_secs: r.elapsed_secs,
            remaining_secs: r.remaining_secs,
        }),
        last_recording: s.last_recording.map(|r| WarmRecorded {
            blocks: r.blocks,
            error: r.error,
        }),
        warming: s.warming,
        last_warm: s.last_warm.map(|w| WarmReportInfo {
            set_blocks: w.set_blocks,
            skipped: w.skipped,
            fetched_blocks: w.fetched_blocks,
            fetched_bytes: w.fetched_bytes,
            gets: w.gets,
            over_budget: w.over_budget,
            failed: w.failed,
            took_ms: w.took_ms,
            note: w.note,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recording_request_is_checked() {
        let ok = check_record(&RecordWarmSet::default()).unwrap();
        assert_eq!(ok.window, Duration::from_secs(60));
        assert_eq!(ok.max_blocks, 65_536);
        for (seconds, max_blocks, says) in [
            (0, 10, "seconds 0"),
            (3601, 10, "seconds 3601"),
            (10, 0, "max_blocks 0"),
            (10, MAX_WARM_BLOCKS as u64 + 1, "max_blocks 524289"),
        ] {
            let e = check_record(&RecordWarmSet {
                seconds,
                max_blocks,
            })
            .unwrap_err();
            assert_eq!(e.code(), "invalid_warm_set");
            assert!(e.to_string().contains(says), "{e}");
        }
    }
}
