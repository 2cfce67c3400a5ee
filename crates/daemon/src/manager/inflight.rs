//! Creates that run beside each other.
//!
//! A plain create (no snapshot: not a clone, not a snapshot attachment) spends most of its
//! time on the store (manifest, ownership claim) and on its device's control commands, none of
//! which touch another volume. So it holds the manager's `admin` lock only to check and
//! reserve its name, and again to register the volume and rewrite `state.json`; in between it
//! holds an [`InFlight`] (its name reserved, and a read share of the manager's gate).
//!
//! Invariants:
//! - A name is in the registry or reserved by at most one create: a second create of it is
//!   `duplicate` (checked under `admin` against both).
//! - Shutdown and hand-off set the `admin` flag, release `admin`, then take the gate for
//!   writing: every create in flight has finished by then, registered (a create that got as
//!   far as registering does so whatever the flag says, and is closed or handed over with the
//!   rest) or failed and undone. A create runs as a task of its own (`detached`), so a caller
//!   that stops waiting cannot cut it short between its attach and its registration. No
//!   device or open volume outlives the daemon's close unknown to it.
//! - The descriptors a create in flight will open count as taken in the fd headroom check
//!   ([`Creates::pending_fds`]): creates side by side cannot all pass it and then eat the
//!   reserve together.
//! - Creates from a snapshot (clones, attachments) keep `admin` from start to end, as every
//!   other registry change does: snapshot deletes and purges decide from the registry and
//!   the store together.

use std::collections::BTreeMap;

use parking_lot::Mutex;

/// The names reserved by creates in flight with the descriptors each may still open, and the
/// gate shutdown closes.
#[derive(Debug, Default)]
pub(crate) struct Creates {
    names: Mutex<BTreeMap<String, u64>>,
    gate: tokio::sync::RwLock<()>,
}

/// One create in flight: its name stays reserved and the gate shared until dropped.
#[derive(Debug)]
pub(crate) struct InFlight<'a> {
    creates: &'a Creates,
    name: String,
    _gate: tokio::sync::RwLockReadGuard<'a, ()>,
}

impl Creates {
    /// Whether a create of `name` is in flight.
    pub(crate) fn reserved(&self, name: &str) -> bool {
        self.names.lock().contains_key(name)
    }

    /// The descriptors creates in flight may still open (what each reserved).
    pub(crate) fn pending_fds(&self) -> u64 {
        self.names.lock().values().sum()
    }

    /// Reserves `name`, and `fds` descriptors, for a create. Call under `admin` with the flag
    /// clear: the gate is then never held for writing (shutdown takes it only after setting
    /// the flag), so this does not wait.
    pub(crate) async fn reserve(&self, name: &str, fds: u64) -> InFlight<'_> {
        let gate = self.gate.read().await;
        self.names.lock().insert(name.to_string(), fds);
        InFlight {
            creates: self,
            name: name.to_string(),
            _gate: gate,
        }
    }

    /// Waits until no create is in flight; later ones must find the shutdown flag set.
    pub(crate) async fn drain(&self) {
        drop(self.gate.write().await);
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.creates.names.lock().remove(&self.name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_reservation_holds_the_name_and_drain_waits_for_it() {
        let creates = std::sync::Arc::new(Creates::default());
        let held = creates.reserve("v1", 6).await;
        assert!(creates.reserved("v1") && !creates.reserved("v2"));
        assert_eq!(creates.pending_fds(), 6);
        let c = creates.clone();
        let drained = tokio::spawn(async move { c.drain().await });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(
            !drained.is_finished(),
            "drain returned with a create in flight"
        );
        drop(held);
        drained.await.unwrap();
        assert!(!creates.reserved("v1"));
        assert_eq!(creates.pending_fds(), 0);
    }
}
