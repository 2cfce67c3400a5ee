//! Tuning knobs of a [`VolumeStore`](crate::VolumeStore).

use std::time::Duration;

/// The smallest grace period the daemon accepts (`gc.grace_secs`). `GcOptions` itself takes
/// any value (tests age objects with `now`); packs a writer may still publish are protected by
/// the store-time rule whatever the grace.
pub const MIN_GC_GRACE: Duration = Duration::from_secs(600);

/// How a volume store talks to the object store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreConfig {
    /// Packs uploaded at the same time (at least 1).
    pub upload_concurrency: usize,
    /// Retries after the first attempt, for transient errors only. The only retry layer: S3
    /// clients from `open_store` send one request per attempt. The default (10, with the
    /// default delays) rides out about 15-30 s of outage or throttling before a call fails: a
    /// cold read then returns EIO to the guest, a flush fails and the flusher tries again.
    pub max_retries: u32,
    /// Delay before the first retry; doubles on each further retry.
    pub retry_base_delay: Duration,
    /// Upper bound of one retry delay.
    pub retry_max_delay: Duration,
    /// A pack this store uploaded longer ago than this is checked (HEAD) again before a
    /// manifest naming it is published, in case GC deleted it meanwhile; younger ones are
    /// trusted. Default: half the smallest GC grace period ([`MIN_GC_GRACE`]).
    pub pack_recheck_after: Duration,
    /// How long a clone creation may take from its registration under the snapshot to the
    /// publish of its generation 1 (see snapshot.rs). A snapshot delete treats a registration
    /// younger than this (by the store's clock) whose clone has not published as a creation
    /// still running and is refused; an older one as a creation that died, and clears it. A
    /// creator that finds half of it spent before its publish gives up. Default 10 minutes.
    pub clone_deadline: Duration,
    /// The lease of a snapshot view's registration under its snapshot (see snapshot.rs,
    /// "views"): a view renews it every third of this while open; a snapshot delete treats a
    /// registration not renewed for this long (by the store's clock) as a holder that died,
    /// and clears it. The lease is written into the registration, so a delete judges it by
    /// the holder's setting, not its own. Default 15 minutes.
    pub view_lease: Duration,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            upload_concurrency: 4,
            max_retries: 10,
            retry_base_delay: Duration::from_millis(50),
            retry_max_delay: Duration::from_secs(8),
            pack_recheck_after: MIN_GC_GRACE / 2,
            clone_deadline: Duration::from_secs(600),
            view_lease: Duration::from_secs(900),
        }
    }
}
