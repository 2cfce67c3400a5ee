//! Group commit to the object store ([`StoreGroup`]): what [`Volume::flush_to_store`] runs, the
//! FLUSH of a volume whose durability is `store` (a FLUSH completes only once what it covers
//! is in a published manifest, so a lost node loses no acknowledged write). The group knows
//! nothing of the volume: it is given the sync to run (`Volume::sync_to_store`) as a value.
//!
//! [`Volume::flush_to_store`]: crate::Volume::flush_to_store
//!
//! Syncs are numbered (epochs) in the order they start. A caller needs the first sync that
//! starts after it arrived: a sync running when it arrives rotated before the caller's
//! writes may have completed, so it cannot count. One leader task runs the syncs back to
//! back, each serving every caller that arrived before it started, while any caller still
//! needs one; then it ends, and the next caller starts a new leader. So with FLUSHes arriving
//! all the time there is one upload and one publish in flight, and the FLUSHes that arrive
//! during it share the next one, however many they are.
//!
//! A caller is answered by the first outcome that covers it: a sync of its epoch or a later
//! one that succeeded (Ok), or, when none did, the failure of its own epoch (its FLUSH fails;
//! the next FLUSH starts over). The leader is a task of its own, so a caller that stops
//! waiting (a cancelled request) never leaves the others without one. A leader that ends
//! without returning (a sync that panics, a task dropped before its first poll, a runtime
//! shutting down) fails every epoch a caller waits for, its own and those of callers that
//! arrived during it, and the next caller gets a fresh epoch past them: no FLUSH waits for a
//! leader that is gone, and none is answered Ok by a sync that did not cover it.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::error::{Result, VolumeError};

/// The group commit state of a volume.
#[derive(Debug)]
pub(crate) struct StoreGroup {
    /// The volume's name, for messages.
    volume: String,
    state: parking_lot::Mutex<GroupState>,
    done: tokio::sync::watch::Sender<Outcome>,
    /// Calls of [`StoreGroup::flush`].
    flushes: AtomicU64,
}

#[derive(Debug, Default)]
struct GroupState {
    /// The epoch of the next sync to start (the first is 1).
    next: u64,
    /// The highest epoch a caller waits for.
    wanted: u64,
    /// A leader task runs.
    leading: bool,
}

/// What the syncs so far came to.
#[derive(Debug, Clone, Default)]
struct Outcome {
    /// The latest epoch that succeeded, and the generation it published.
    ok: u64,
    generation: u64,
    /// The latest epoch that failed, and why.
    failed: u64,
    error: Option<Arc<VolumeError>>,
    /// Syncs run (for the figures: how many FLUSHes shared one).
    syncs: u64,
}

/// Ends a leader that did not return: its epoch fails, and the next caller leads.
struct LeaderGuard {
    group: Arc<StoreGroup>,
    /// The epoch whose sync runs.
    epoch: Option<u64>,
    /// The leader returned (and handed leadership back under the lock itself).
    ended: bool,
}

impl Drop for LeaderGuard {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        let group = &self.group;
        // No leader runs the epochs callers wait for now (its own, and those of callers that
        // arrived during it): fail them all, and number the next caller's epoch past them.
        let upto = {
            let mut s = group.state.lock();
            s.leading = false;
            let upto = s.wanted.max(self.epoch.unwrap_or(0));
            if s.next <= upto {
                s.next = upto + 1;
            }
            upto
        };
        let name = group.volume.clone();
        tracing::error!(volume = %name, epoch = ?self.epoch, upto, "group flush leader ended before serving its callers");
        group.done.send_modify(|o| {
            if upto > o.failed {
                o.failed = upto;
                o.error = Some(Arc::new(VolumeError::Task(format!(
                    "volume `{name}`: the flush to the store of groups up to {upto} did not finish (its task ended)"
                ))));
            }
        });
    }
}

/// Figures of a volume's group commits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GroupFigures {
    /// Syncs the group commits ran.
    pub syncs: u64,
    /// Calls of `flush_to_store`.
    pub flushes: u64,
}

impl StoreGroup {
    pub(crate) fn new(volume: &str) -> Self {
        Self {
            volume: volume.to_string(),
            state: Default::default(),
            done: tokio::sync::watch::Sender::new(Outcome::default()),
            flushes: AtomicU64::new(0),
        }
    }

    /// Waits until a sync that started after this call succeeded (or its own failed), sharing
    /// it with every other caller that arrived while the previous sync ran (see the module
    /// docs). `sync` makes every write completed before it starts durable in the store and
    /// returns the generation published; it runs on a leader task of its own, started here
    /// when no leader runs. Returns a generation that holds this caller's writes.
    pub(crate) async fn flush<S, F>(self: &Arc<Self>, sync: S) -> Result<u64>
    where
        S: Fn() -> F + Send + Sync + 'static,
        F: Future<Output = Result<u64>> + Send + 'static,
    {
        let (need, lead) = {
            let mut s = self.state.lock();
            if s.next == 0 {
                s.next = 1;
            }
            let need = s.next;
            s.wanted = s.wanted.max(need);
            let lead = !s.leading;
            s.leading = true;
            (need, lead)
        };
        self.flushes.fetch_add(1, Ordering::Relaxed);
        let mut rx = self.done.subscribe();
        if lead {
            // Built here, not in the task: a task dropped before its first poll (or a spawn
            // that panics) still ends the leadership and answers the waiters.
            let guard = LeaderGuard {
                group: self.clone(),
                epoch: None,
                ended: false,
            };
            tokio::spawn(async move { Self::lead(guard, sync).await });
        }
        let outcome = rx
            .wait_for(|o| o.ok >= need || o.failed >= need)
            .await
            .map_err(|_| VolumeError::Task("the group flush leader ended".into()))?
            .clone();
        if outcome.ok >= need {
            return Ok(outcome.generation);
        }
        let source = outcome
            .error
            .unwrap_or_else(|| Arc::new(VolumeError::Task("group flush failed".into())));
        Err(VolumeError::GroupSync {
            volume: self.volume.clone(),
            epoch: need,
            source,
        })
    }

    /// Runs syncs while a caller needs one that has not started.
    async fn lead<S, F>(mut guard: LeaderGuard, sync: S)
    where
        S: Fn() -> F,
        F: Future<Output = Result<u64>>,
    {
        // Whatever ends this task (a panic in a sync, the runtime shutting down), the epoch
        // it runs fails and another caller may lead: no FLUSH waits for a leader that is gone.
        let this = guard.group.clone();
        loop {
            let epoch = {
                let mut s = this.state.lock();
                if s.wanted < s.next {
                    s.leading = false;
                    guard.ended = true;
                    return;
                }
                let e = s.next;
                s.next += 1;
                e
            };
            guard.epoch = Some(epoch);
            let r = sync().await;
            guard.epoch = None;
            this.done.send_modify(|o| {
                o.syncs += 1;
                match r {
                    Ok(generation) => {
                        o.ok = epoch;
                        o.generation = generation;
                    }
                    Err(e) => {
                        tracing::warn!(volume = %this.volume, epoch, error = %e, "group flush to the store failed");
                        o.failed = epoch;
                        o.error = Some(Arc::new(e));
                    }
                }
            });
        }
    }

    /// How many syncs ran for how many `flush` calls.
    pub(crate) fn figures(&self) -> GroupFigures {
        GroupFigures {
            syncs: self.done.borrow().syncs,
            flushes: self.flushes.load(Ordering::Relaxed),
        }
    }
}
