//! Work off the async workers: blocking calls on the blocking pool, and device steps (kernel
//! control commands), each bounded by [`DEVICE_STEP_TIMEOUT`].

use std::time::Duration;

use glidefs_ublk::export::ExportError;

use super::error::ManagerError;

/// Runs blocking work on the blocking pool; a panic there becomes `internal`.
pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ManagerError> + Send + 'static,
) -> Result<T, ManagerError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ManagerError::internal("blocking task failed", e))?
}

/// Longest a device step (attach, reattach, stop, detach: kernel control commands) may take
/// before the manager gives up on it: a wedged device must not hang a create, a restore or the
/// daemon's exit. The step's thread is left to finish (or to die with the process).
pub(super) const DEVICE_STEP_TIMEOUT: Duration = Duration::from_secs(120);

/// [`blocking`] for a device step, bounded by [`DEVICE_STEP_TIMEOUT`].
pub(super) async fn device_step<T: Send + 'static>(
    volume: &str,
    step: &str,
    f: impl FnOnce() -> Result<T, ManagerError> + Send + 'static,
) -> Result<T, ManagerError> {
    match tokio::time::timeout(DEVICE_STEP_TIMEOUT, blocking(f)).await {
        Ok(r) => r,
        Err(_) => {
            tracing::error!(volume, step, timeout = ?DEVICE_STEP_TIMEOUT, "device step timed out; giving up on it");
            Err(ManagerError::Device(ExportError::Failed {
                volume: volume.to_string(),
                source: format!("{step} did not finish within {DEVICE_STEP_TIMEOUT:?}").into(),
            }))
        }
    }
}
