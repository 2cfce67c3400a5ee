//! [`blocking`]: cache and file work run on tokio's blocking pool, off the async workers.

use crate::error::{Result, VolumeError};

/// Runs blocking cache work off the async workers.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| VolumeError::Task(e.to_string()))?
}
