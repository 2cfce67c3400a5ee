//! Create (numbered steps; a failure undoes the earlier ones):
//! 1. validate ([`spec::ValidCreate`]); a name already registered is `duplicate`; a volume
//!    that would leave the daemon short of file descriptors is `too_many_open_files`
//!    ([`crate::limits::check_headroom`]);
//! 2. load the manifest under `[prefix/]volumes/<name>/`: present without `attach_existing` is
//!    `volume_exists_in_store`; with it, omitted size / block size come from the manifest
//!    (held to a request's limits: at most 256T, a valid block size);
//!    absent: a `read_only` export (not of a snapshot) is `volume_not_in_store`; a leftover
//!    local cache directory of a fresh (not attach) create is deleted, its
//!    data belonged to no volume this daemon knows;
//! 3. a new volume or a clone is recorded as pending in `state.json` ([`pending`]); open the
//!    volume (its claim, or the clone's registration and generation 1), attach its device on
//!    the blocking pool, start its flusher;
//! 4. register it and rewrite `state.json` (the same write drops the pending record).
//!
//! Undo of a new volume's create deletes its objects in the store only when every generation
//! there is this daemon's (generation 1 its claim, the latest still its own): another daemon
//! creating the same name at the same time may have won the claim (see `undo_claim`).
//!

use std::path::Path;
use std::sync::Arc;

use glidefs_model::api::{CreateVolume, VolumeInfo};
use glidefs_objstore::{Manifest, SnapshotRecord, VolumeStore};
use tokio::sync::MutexGuard;

use super::error::Detail;
use super::flusher::FlushStats;
use super::inflight::InFlight;
use super::spec::{self, SnapshotRef, ValidCreate, VolumeSpec};
use super::{remove_dir, state, Entry, EntryState, ManagerError, Open, VolumeManager};

/// What the store holds for a create (step 2), read by [`VolumeManager::look_up`].
struct Found {
    /// `from`: the snapshot's record, whose geometry a clone or an attachment takes.
    source: Option<SnapshotRecord>,
    /// The volume's latest manifest: `None` for a new volume, and for a read-only attachment
    /// of a snapshot (it has no objects of its own).
    manifest: Option<Manifest>,
}

/// The `admin` lock while a create holds it.
type Admin<'a> = MutexGuard<'a, bool>;

impl VolumeManager {
    /// Creates (or attaches) a volume; see the module docs for the steps. Runs to its end
    /// even when the caller stops waiting.
    pub async fn create(self: &Arc<Self>, req: &CreateVolume) -> Result<VolumeInfo, ManagerError> {
        let req = req.clone();
        self.detached("create", move |m| async move { m.create_now(&req).await })
            .await
    }

    /// The steps of the module docs, in order; each undoes what the earlier ones did when it
    /// fails.
    async fn create_now(&self, req: &CreateVolume) -> Result<VolumeInfo, ManagerError> {
        // 1.
        let valid = ValidCreate::from_request(req, &self.opts.defaults)?;
        let (admin, _in_flight) = self.admit(&valid).await?;
        // 2.
        let found = self.look_up(&valid).await?;
        let (size, block_size) = self.geometry(&valid, &found)?;
        let name = valid.name.clone();
        let dir = self.opts.volumes_dir.join(&name);
        let existed = tokio::fs::try_exists(&dir).await.unwrap_or(false);
        if existed && found.manifest.is_none() && !valid.attach_existing {
            tracing::warn!(volume = %name, dir = %dir.display(), "deleting a leftover cache directory of an unknown volume");
            remove_dir(&dir).await?;
        }
        // 3.
        let attachment = valid.from.as_ref().filter(|_| valid.read_only);
        let mut spec = VolumeSpec {
            name: name.clone(),
            size,
            block_size,
            queues: valid.queues,
            queue_depth: valid.queue_depth,
            prefix: valid.prefix.clone(),
            read_only: valid.read_only,
            device_id: None,
            snapshot: attachment.cloned(),
            encryption_key: valid.encryption_key.clone(),
            durability: valid.durability,
            qos: valid.qos,
        };
        let flush = Arc::new(FlushStats::default());
        let clone_from = valid.from.as_ref().filter(|_| attachment.is_none());
        // A new volume or a clone: recorded before its first store write (the claim, the
        // clone's registration), so a crash from here on is undone at the next start.
        let new_in_store = found.manifest.is_none() && attachment.is_none();
        if new_in_store {
            let fresh_dir = !existed || !valid.attach_existing;
            self.record_pending(&spec, clone_from, admin.is_some(), &dir, fresh_dir)
                .await?;
        }
        let opened = self
            .open_volume(&spec, &dir, &flush, valid.takeover, clone_from)
            .await;
        let open = match opened {
            Ok(o) => {
                spec.device_id = o.device_id();
                Arc::new(o)
            }
            Err(e) => {
                if !existed || (found.manifest.is_none() && !valid.attach_existing) {
                    let _ = remove_dir(&dir).await;
                }
                if new_in_store {
                    drop(admin);
                    self.undo_failed_create(&name).await;
                }
                return Err(e);
            }
        };
        // 4.
        let entry = Arc::new(Entry::new(spec, dir, flush, EntryState::Open(open.clone())));
        self.register(admin, &entry, &open, new_in_store).await?;
        tracing::info!(volume = %name, size, block_size, attached = found.manifest.is_some(), "volume created");
        Ok(self.info(&entry).await)
    }

    /// Step 1: refuses a create during a shutdown, of a name registered or in flight, or one
    /// that would leave the daemon short of file descriptors. A plain create then runs beside
    /// others until it registers ([`super::inflight`]): it gives `admin` back and holds its
    /// reservation; one from a snapshot keeps `admin` throughout.
    async fn admit(
        &self,
        valid: &ValidCreate,
    ) -> Result<(Option<Admin<'_>>, Option<InFlight<'_>>), ManagerError> {
        let admin = self.admin.lock().await;
        if *admin {
            return Err(ManagerError::ShuttingDown);
        }
        let name = valid.name.clone();
        // A live pending record: a create, clone or purge of the name still runs (or undoes
        // itself after failing), with no registration and maybe no reservation.
        if self.volumes.read().contains_key(&name)
            || self.creates.reserved(&name)
            || self.pending_live(&name)
        {
            return Err(ManagerError::Duplicate { name });
        }
        // Creates in flight have not opened all their descriptors yet: count them as taken.
        let need = crate::limits::volume_need(valid.queues);
        crate::limits::check_headroom(valid.queues, self.creates.pending_fds()).map_err(|e| {
            ManagerError::TooManyOpenFiles {
                name: name.clone(),
                detail: Detail::new(e.to_string()),
            }
        })?;
        Ok(if valid.from.is_none() {
            let in_flight = self.creates.reserve(&name, need).await;
            drop(admin);
            (None, Some(in_flight))
        } else {
            (Some(admin), None)
        })
    }

    /// Step 2, the store: the snapshot a create `from` names, and the volume's manifest.
    async fn look_up(&self, valid: &ValidCreate) -> Result<Found, ManagerError> {
        let name = &valid.name;
        let key = spec::load_key_async(
            name,
            valid.encryption_key.as_ref(),
            &self.opts.encryption_keys,
        )
        .await?;
        let store = self.store_for(valid.prefix.as_deref());
        let vstore = VolumeStore::new(store, name, self.opts.store.clone())
            .map_err(|_| ManagerError::InvalidName { name: name.clone() })?
            .with_key(key);
        // `from`: the snapshot's geometry; a read-only attachment has no objects of its own.
        let source = match &valid.from {
            Some(f) => Some(self.snapshot_record(&vstore, f).await?),
            None => None,
        };
        let manifest = if valid.from.is_some() && valid.read_only {
            Ok(None)
        } else {
            vstore.load_manifest().await
        };
        let manifest = manifest.map_err(|e| match e.kind() {
            _ if e.key_mismatch().is_some() => ManagerError::KeyMismatch {
                name: name.clone(),
                detail: Detail::caused("load manifest", e),
            },
            glidefs_objstore::ErrorKind::Transient => ManagerError::StoreUnavailable {
                name: name.clone(),
                detail: Detail::caused("load manifest", e),
            },
            _ => ManagerError::internal(format!("volume `{name}`: load manifest"), e),
        })?;
        Ok(Found { source, manifest })
    }

    /// Step 2, the geometry: size and block size from the request, the snapshot or the
    /// manifest, refused where they disagree or where nothing gives a size.
    fn geometry(&self, valid: &ValidCreate, found: &Found) -> Result<(u64, u32), ManagerError> {
        let name = valid.name.clone();
        let (size, block_size) = match (&found.manifest, valid.attach_existing) {
            (None, _) if found.source.is_some() => {
                let r = found
                    .source
                    .as_ref()
                    .map_or((0, 0), |r| (r.volume_size, r.block_size));
                let asked = (valid.size.unwrap_or(r.0), valid.block_size.unwrap_or(r.1));
                if asked != r {
                    return Err(ManagerError::GeometryMismatch {
                        name,
                        detail: Detail::new(format!(
                            "snapshot {} has size {} with block size {}; the request asks for size {} with block size {} (resize the clone after creating it)",
                            valid.from.as_ref().map(ToString::to_string).unwrap_or_default(),
                            r.0, r.1, asked.0, asked.1
                        )),
                    });
                }
                r
            }
            (Some(m), false) => {
                return Err(ManagerError::ExistsInStore {
                    name,
                    generation: m.generation,
                })
            }
            (Some(m), true) => {
                spec::check_stored_geometry(&name, m.volume_size, m.block_size)?;
                // What the request names must be what the store holds (checked here, before
                // the size arithmetic below, so a mismatch is reported as one).
                let size = valid.size.unwrap_or(m.volume_size);
                let bs = valid.block_size.unwrap_or(m.block_size);
                if (size, bs) != (m.volume_size, m.block_size) {
                    return Err(ManagerError::GeometryMismatch {
                        name,
                        detail: Detail::new(format!(
                            "the store holds size {} with block size {}; the request asks for size {size} with block size {bs}",
                            m.volume_size, m.block_size
                        )),
                    });
                }
                (size, bs)
            }
            // Nothing to attach, and no size to create it with: say so (a caller that
            // attaches what it believes exists, e.g. the CSI node plugin, learns it is gone).
            (None, _) if valid.read_only || (valid.attach_existing && valid.size.is_none()) => {
                return Err(ManagerError::NotInStore {
                    name,
                    prefix: valid
                        .prefix
                        .as_deref()
                        .map(|p| format!(" under prefix `{p}`"))
                        .unwrap_or_default(),
                })
            }
            (None, _) => {
                let size = valid.size.ok_or_else(|| ManagerError::InvalidSize {
                    value: "(missing)".to_string(),
                    reason: format!(
                        "volume `{name}` has no manifest in the store, so size is required"
                    ),
                })?;
                let bs = valid
                    .block_size
                    .unwrap_or(u32::try_from(self.opts.defaults.block_size.0).unwrap_or(128 << 10));
                (size, bs)
            }
        };
        if !size.is_multiple_of(u64::from(block_size)) {
            return Err(ManagerError::InvalidSize {
                value: size.to_string(),
                reason: format!("must be a multiple of the block size {block_size}"),
            });
        }
        Ok((size, block_size))
    }

    /// Step 3, before the store is written: records a new volume or a clone as pending in
    /// `state.json` ([`super::pending`]), under `admin` (taken for it unless `holding`). When
    /// that fails the record is dropped and a `fresh_dir` is deleted.
    async fn record_pending(
        &self,
        spec: &VolumeSpec,
        clone_from: Option<&SnapshotRef>,
        holding: bool,
        dir: &Path,
        fresh_dir: bool,
    ) -> Result<(), ManagerError> {
        let name = &spec.name;
        let op = match clone_from {
            Some(from) => state::Pending::Clone {
                spec: spec.clone(),
                from: from.clone(),
            },
            None => state::Pending::Create { spec: spec.clone() },
        };
        let held = match holding {
            true => None,
            false => Some(self.admin.lock().await),
        };
        self.pending
            .lock()
            .insert(name.clone(), state::Record::live(op));
        if let Err(e) = self.persist().await {
            self.pending.lock().remove(name);
            drop(held);
            if fresh_dir {
                let _ = remove_dir(dir).await;
            }
            return Err(e);
        }
        drop(held);
        Ok(())
    }

    /// Step 4: registers the open volume and rewrites `state.json`, whose same write drops
    /// its pending record. When the write fails the volume is torn down again (and a new
    /// one's claim undone).
    async fn register(
        &self,
        admin: Option<Admin<'_>>,
        entry: &Arc<Entry>,
        open: &Arc<Open>,
        new_in_store: bool,
    ) -> Result<(), ManagerError> {
        let name = &entry.spec.name;
        // A shutdown or hand-off that began while this create ran waits for it (it holds
        // its [`InFlight`] until it returns) and lists the registry afterwards: the volume
        // is registered and persisted like any other, and closed (or handed over) with the
        // rest.
        let admin = match admin {
            Some(held) => held,
            None => self.admin.lock().await,
        };
        self.volumes.write().insert(name.clone(), entry.clone());
        let record = self.pending.lock().remove(name);
        if let Err(e) = self.persist().await {
            self.volumes.write().remove(name);
            if let Some(r) = record {
                self.pending.lock().insert(name.clone(), r);
            }
            let _ = self.teardown(entry, open, true).await;
            drop(admin);
            if new_in_store {
                self.undo_failed_create(name).await;
            }
            return Err(e);
        }
        drop(admin);
        Ok(())
    }
}
