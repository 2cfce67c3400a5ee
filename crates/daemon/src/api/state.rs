//! The state every handler shares: the manager, readiness, the API's counters, the hand-off.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use super::metrics::ApiCounters;
use crate::manager::VolumeManager;

/// Shared state of every handler.
#[derive(Debug, Clone)]
pub struct AppState {
    pub manager: Arc<VolumeManager>,
    /// `/readyz` answers 200 only while this is set (volumes restored, not shutting down).
    pub ready: Arc<AtomicBool>,
    pub counters: Arc<ApiCounters>,
    /// Notified by `POST /v1/handoff`: the daemon detaches its devices for a successor and
    /// exits (see `server::run`).
    pub handoff: Arc<tokio::sync::Notify>,
}
