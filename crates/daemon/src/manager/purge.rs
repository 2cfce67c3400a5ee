//! Deleting a volume's objects from the store: a remove with `purge`, the undo of a failed
//! create (only what this daemon wrote), and a purge a crash interrupted ([`super::pending`]).

use glidefs_objstore::VolumeStore;

use super::error::Detail;
use super::spec::{self, VolumeSpec};
use super::{snapshots, ManagerError, VolumeManager};

impl VolumeManager {
    /// Undoes a failed create of a new volume: opening it may have published this daemon's
    /// ownership claim (generation 1), which would make a retry `volume_exists_in_store`.
    ///
    /// Only what this daemon wrote is undone. The create found no manifest, but another daemon
    /// creating the same name at the same time may have claimed it first (then this open
    /// failed with `owned_elsewhere` or `fenced` and wrote nothing), or published since. So
    /// the volume's objects are deleted only when its generation 1 is this daemon's claim
    /// (owner = ours, claimed at 1) and its latest generation is still ours; otherwise (or
    /// when that cannot be read) the store is left alone.
    pub(super) async fn undo_claim(&self, spec: &VolumeSpec) -> Result<u64, ManagerError> {
        if self.only_ours(spec).await? {
            return self.purge(spec).await;
        }
        tracing::info!(volume = %spec.name, "undone create: the volume in the store is not (only) this daemon's; left alone");
        Ok(0)
    }

    /// Whether every generation of `spec`'s volume in the store was published by this daemon:
    /// generation 1 is its claim and the latest is still its own (see [`Self::undo_claim`]).
    async fn only_ours(&self, spec: &VolumeSpec) -> Result<bool, ManagerError> {
        let Some(me) = self.opts.owner.as_deref() else {
            // Without an owner id nothing was claimed, and nothing tells whose objects are.
            return Ok(false);
        };
        let store = self.store_for(spec.prefix.as_deref());
        let fail = |e: glidefs_objstore::ObjStoreError| ManagerError::StoreUnavailable {
            name: spec.name.clone(),
            detail: Detail::caused("check the claim of a failed create", e),
        };
        // Without its key an encrypted volume's manifest does not load: nothing is undone.
        let key = spec::load_key_async(
            &spec.name,
            spec.encryption_key.as_ref(),
            &self.opts.encryption_keys,
        )
        .await
        .unwrap_or(None);
        let vstore = VolumeStore::new(store, &spec.name, self.opts.store.clone())
            .map_err(fail)?
            .with_key(key);
        let claimed_by_me_at = |m: &glidefs_objstore::Manifest| {
            m.owner
                .as_ref()
                .filter(|o| o.id == me && !o.released)
                .map(|o| o.claimed_at)
        };
        let Some(latest) = vstore.load_manifest().await.map_err(fail)? else {
            return Ok(false);
        };
        if claimed_by_me_at(&latest).is_none() {
            return Ok(false);
        }
        let first = if latest.generation == 1 {
            latest
        } else {
            match vstore.fetch_manifest(1).await {
                Ok(m) => m,
                Err(e) if e.kind() == glidefs_objstore::ErrorKind::NotFound => return Ok(false),
                Err(e) => return Err(fail(e)),
            }
        };
        Ok(claimed_by_me_at(&first) == Some(1))
    }

    /// The id of another daemon whose unreleased claim the latest manifest of `spec`'s
    /// volume carries (read from the manifest's root: no key needed). A purge of such a volume
    /// would delete what that daemon serves: a name this daemon purged half way and another
    /// host created again, or a volume taken over since.
    async fn held_elsewhere(&self, spec: &VolumeSpec) -> Result<Option<String>, ManagerError> {
        let latest =
            self.volume_store(spec)?
                .current_owner()
                .await
                .map_err(snapshots::store_err(
                    &spec.name,
                    "read the owner before a purge",
                ))?;
        let me = self.opts.owner.as_deref();
        Ok(latest
            .and_then(|(_, owner)| owner)
            .filter(|o| !o.released && Some(o.id.as_str()) != me)
            .map(|o| o.id))
    }

    /// Deletes every object under `[prefix/]volumes/<name>/` (`VolumeStore::purge`: its
    /// snapshots go first through the delete protocol, a clone's registration last). Refused
    /// while a clone of one of its snapshots exists (checked by `remove` before anything is
    /// torn down too: [`Self::check_purge`]).
    pub(super) async fn purge(&self, spec: &VolumeSpec) -> Result<u64, ManagerError> {
        self.check_purge(spec).await?;
        if let Some(holder) = self.held_elsewhere(spec).await? {
            return Err(ManagerError::OwnedElsewhere {
                name: spec.name.clone(),
                detail: Detail::new(format!(
                    "the store's latest manifest is claimed by `{holder}`; a purge deletes only a volume this daemon holds, or one no one holds (remove it without purge)"
                )),
            });
        }
        self.volume_store(spec)?
            .purge()
            .await
            .map_err(snapshots::store_err(&spec.name, "purge"))
    }
}
