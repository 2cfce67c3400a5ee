//! The CSI Controller service: volumes, publication to a node, expansion. Snapshots are in
//! [`crate::snapshots`].
//!
//! - A volume's id is its glidefs name (the CO's name: `pvc-<uid>`, valid as is). Its record
//!   (`csi/volumes/<id>.json`, create-only) is written *before* the volume, so a retried
//!   CreateVolume finds it, compares what it asks with what was recorded (`ALREADY_EXISTS` on
//!   a difference) and finishes the job: creating a volume the store already has is
//!   treated as done.
//! - CreateVolume makes the volume on the controller's own daemon and closes it again (the
//!   close flushes and releases it): no node holds it until one stages it.
//! - ControllerPublish records the one node a volume is published to, as the next state of
//!   the volume's attachment log (create-only, never deleted: `records`): a second node is
//!   refused with `FAILED_PRECONDITION` while the first holds it. It grants a takeover in
//!   the publish context, with the state's `seq`: a node stages a volume only after the
//!   previous node unstaged it (released: the takeover claims nothing more than a plain
//!   open) or was force detached (Kubernetes' out-of-service taint: the takeover fences the
//!   failed node's daemon in the store, so nothing it still writes is ever published).
//! - ControllerUnpublish records "detached" as the next state when the newest names that
//!   node (a force detach is the same call for a node that is gone).

use std::collections::HashMap;
use std::sync::Arc;

use tonic::{Request, Response, Status};

use crate::caps;
use crate::daemon::{Close, DaemonError, VolumeRequest};
use crate::holder::{Found, Holders};
use crate::inflight::Inflight;
use crate::params::{self, Params};
use crate::pb;
use crate::qos;
use crate::records::{now_unix, Attachment, Created, VolumeRecord};

/// The publish-context key that grants a takeover to NodeStage.
pub const TAKEOVER: &str = "glidefs.io/takeover";

/// The publish-context key naming the attachment state (`seq`) a NodeStage belongs to: a
/// node that finds its daemon still holding the volume from another attachment (it was
/// force-detached and published to again) retires that handle instead of serving it.
pub const ATTACHMENT: &str = "glidefs.io/attachment";

/// The controller service.
#[derive(Debug, Clone)]
pub struct Controller {
    pub(crate) holders: Holders,
    pub(crate) busy: Inflight,
}

fn not_empty(value: &str, what: &str) -> Result<(), Status> {
    if value.is_empty() {
        return Err(Status::invalid_argument(format!("{what} is empty")));
    }
    Ok(())
}

/// The source a volume is created from, as recorded (`snapshot:VOL@SNAP`, `volume:VOL`).
fn source_of(src: Option<&pb::VolumeContentSource>) -> Result<Option<String>, Status> {
    use pb::volume_content_source::Type;
    match src.and_then(|s| s.r#type.as_ref()) {
        None => Ok(None),
        Some(Type::Snapshot(s)) => {
            not_empty(&s.snapshot_id, "volume_content_source.snapshot.snapshot_id")?;
            Ok(Some(format!("snapshot:{}", s.snapshot_id)))
        }
        Some(Type::Volume(v)) => {
            not_empty(&v.volume_id, "volume_content_source.volume.volume_id")?;
            Ok(Some(format!("volume:{}", v.volume_id)))
        }
    }
}

/// The engine snapshot a clone of a volume is made from (one per clone, named after the
/// clone by a 64-bit FNV-1a hash: a clone's name may already be as long as a snapshot name
/// may be).
fn clone_snapshot_name(clone: &str) -> String {
    let hash = clone.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("csi-clone-{hash:016x}")
}

impl Controller {
    pub fn new(holders: Holders) -> Self {
        Self {
            holders,
            busy: Inflight::default(),
        }
    }

    fn volume_doc(
        rec: &VolumeRecord,
        capacity: u64,
        src: Option<pb::VolumeContentSource>,
    ) -> pb::Volume {
        let mut context: HashMap<String, String> = rec
            .parameters
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        context.insert("blockSize".into(), rec.block_size.to_string());
        pb::Volume {
            capacity_bytes: i64::try_from(capacity).unwrap_or(i64::MAX),
            volume_id: rec.name.clone(),
            volume_context: context,
            content_source: src,
            ..Default::default()
        }
    }

    /// Makes the volume of `rec` in the store (done already counts as done); returns its
    /// size.
    async fn make(&self, rec: &VolumeRecord, params: &Params) -> Result<u64, Status> {
        let own = &self.holders.own;
        let name = &rec.name;
        let from = match rec.source.as_deref() {
            None => None,
            Some(s) => Some(self.clone_source(name, s).await?),
        };
        let req = VolumeRequest {
            name: name.clone(),
            size: from.is_none().then_some(rec.capacity),
            block_size: from.is_none().then_some(rec.block_size),
            from: from.clone(),
            encryption_key_file: params.encryption_key_file.clone(),
            durability: params.durability.clone(),
            ..VolumeRequest::default()
        };
        let want = rec.capacity;
        match own.open(&req).await {
            Ok(f) if f.size >= want => {
                own.close(name, Close::Flush)
                    .await
                    .map_err(|e| e.status(&format!("closing new volume {name}")))?;
                return Ok(f.size);
            }
            Ok(_) => {}
            // An earlier try made it (the store has it, or this daemon still holds it).
            Err(e) if e.is("volume_exists_in_store") || e.is("duplicate") => {}
            Err(e) if from.is_some() && (e.is("snapshot_not_found") || e.is("not_found")) => {
                return Err(Status::not_found(format!(
                    "the source of volume {name}: {}",
                    e.message
                )))
            }
            Err(e) => return Err(e.status(&format!("creating volume {name}"))),
        }
        if own
            .show(name)
            .await
            .map_err(|e| e.status("creating"))?
            .is_some()
        {
            own.close(name, Close::Flush)
                .await
                .map_err(|e| e.status(&format!("closing new volume {name}")))?;
        }
        // A clone has its snapshot's size; a larger request grows it (a retry too: the
        // crash may have come between the clone and its growth).
        let grown = self
            .holders
            .with_volume(name, &format!("sizing volume {name}"), |d| async move {
                let f = d.show(name).await?.ok_or_else(|| {
                    DaemonError::unavailable(format!("volume {name} is not open"))
                })?;
                if f.size >= want {
                    return Ok(f.size);
                }
                let bs = u64::from(f.block_size.max(1));
                d.resize(name, want.div_ceil(bs) * bs).await.map(|f| f.size)
            })
            .await?;
        match grown {
            Found::Done(size) => Ok(size),
            Found::Missing => Err(Status::unavailable(format!(
                "volume {name} was created and is gone again: retry"
            ))),
        }
    }

    /// `VOL@SNAP` to clone `clone` from: the snapshot itself, or for a volume source a
    /// snapshot of it taken now (kept as long as the clone lives).
    async fn clone_source(&self, clone: &str, source: &str) -> Result<String, Status> {
        if let Some(id) = source.strip_prefix("snapshot:") {
            return match id.split_once('@') {
                Some((v, s)) if !v.is_empty() && !s.is_empty() => Ok(id.to_string()),
                _ => Err(Status::not_found(format!("no snapshot {id:?}"))),
            };
        }
        let volume = source.strip_prefix("volume:").unwrap_or(source);
        let snap = clone_snapshot_name(clone);
        let taken = self
            .holders
            .with_volume(volume, "snapshotting the source volume", |d| {
                let snap = snap.clone();
                async move {
                    match d.snapshot(volume, &snap).await {
                        Err(e) if e.is("snapshot_exists") => Ok(()),
                        r => r.map(|_| ()),
                    }
                }
            })
            .await?;
        match taken {
            Found::Done(()) => Ok(format!("{volume}@{snap}")),
            Found::Missing => Err(Status::not_found(format!("no volume {volume:?} to clone"))),
        }
    }

    async fn create_volume(&self, req: pb::CreateVolumeRequest) -> Result<pb::Volume, Status> {
        not_empty(&req.name, "name")?;
        caps::check_all(&req.volume_capabilities)?;
        let params = Params::parse(&req.parameters)?;
        let qos = qos::apply_mutable(&req.mutable_parameters, params.qos)?;
        let capacity = params::capacity(req.capacity_range.as_ref(), params.block_size)?;
        let source = source_of(req.volume_content_source.as_ref())?;
        let _busy = self.busy.start(&req.name)?;
        let records = &self.holders.records;
        let rec = VolumeRecord {
            name: req.name.clone(),
            capacity,
            block_size: params.block_size,
            parameters: params.raw.clone(),
            source: source.clone(),
            clone_snapshot: match &source {
                Some(s) if s.starts_with("volume:") => Some(clone_snapshot_name(&req.name)),
                _ => None,
            },
            created_unix: now_unix(),
        };
        let rec = match records.create_volume(&rec).await? {
            Created::New => rec,
            Created::Exists(old) => {
                let same = old.block_size == rec.block_size
                    && old.parameters == rec.parameters
                    && old.source == rec.source
                    && params::fits(old.capacity, req.capacity_range.as_ref());
                if !same {
                    return Err(Status::already_exists(format!(
                        "volume {} exists with other properties (capacity {}, block size {}, parameters {:?}, source {:?})",
                        old.name, old.capacity, old.block_size, old.parameters, old.source
                    )));
                }
                old
            }
        };
        if records.tombstone(&rec.name).await?.is_some() {
            return Err(Status::already_exists(format!(
                "volume {} was deleted and is kept until its snapshots are deleted",
                rec.name
            )));
        }
        let size = self.make(&rec, &params).await?;
        self.record_initial_qos(&rec.name, qos).await?;
        Ok(Self::volume_doc(&rec, size, req.volume_content_source))
    }

    async fn delete_volume(&self, id: &str) -> Result<(), Status> {
        not_empty(id, "volume_id")?;
        let _busy = self.busy.start(id)?;
        let records = &self.holders.records;
        if let Some(node) = records.attachment(id).await?.and_then(|a| a.node) {
            return Err(Status::failed_precondition(format!(
                "volume {id} is published to node {node}: unpublish it first"
            )));
        }
        if records.volume(id).await?.is_none() {
            return Ok(()); // never created through CSI, or deleted already
        }
        let snaps = self
            .holders
            .with_volume(id, &format!("deleting volume {id}"), |d| async move {
                d.snapshots(id).await
            })
            .await?;
        match snaps {
            Found::Done(s) if !s.is_empty() => {
                // Snapshots outlive their volume: it is purged with the last of them.
                records.bury(id).await?;
                tracing::info!(
                    volume = id,
                    snapshots = s.len(),
                    "volume deleted; kept for its snapshots"
                );
                Ok(())
            }
            _ => self.purge(id).await,
        }
    }

    /// Deletes `volume` and everything of it from the store, then its records; a clone of a
    /// volume then lets go of the snapshot it was made from (it read that snapshot's packs
    /// until now).
    pub(crate) async fn purge(&self, volume: &str) -> Result<(), Status> {
        let own = &self.holders.own;
        let req = VolumeRequest {
            name: volume.to_string(),
            attach_existing: true,
            ..VolumeRequest::default()
        };
        let opened = match own.open(&req).await {
            Ok(_) => true,
            Err(e) if e.is("duplicate") => true,
            Err(e) if e.is("volume_not_in_store") => false,
            Err(e) => return Err(e.status(&format!("opening volume {volume} to delete it"))),
        };
        if opened {
            own.close(volume, Close::Purge)
                .await
                .map_err(|e| e.status(&format!("deleting volume {volume} from the store")))?;
        }
        let records = &self.holders.records;
        if let Some(rec) = records.volume(volume).await? {
            let src = rec
                .source
                .as_deref()
                .and_then(|s| s.strip_prefix("volume:"));
            if let (Some(src), Some(snap)) = (src, &rec.clone_snapshot) {
                Box::pin(self.drop_engine_snapshot(src, snap)).await?;
            }
        }
        records.delete_volume(volume).await?;
        records.unbury(volume).await.map_err(Status::from)
    }

    /// Deletes engine snapshot `snap` of `volume` (gone already counts), then purges
    /// `volume` when it was deleted and that was its last snapshot.
    pub(crate) async fn drop_engine_snapshot(
        &self,
        volume: &str,
        snap: &str,
    ) -> Result<(), Status> {
        let left = self
            .holders
            .with_volume(
                volume,
                &format!("deleting snapshot {volume}@{snap}"),
                |d| async move {
                    match d.delete_snapshot(volume, snap).await {
                        Err(e) if e.is("snapshot_not_found") => {}
                        r => r?,
                    }
                    d.snapshots(volume).await
                },
            )
            .await?;
        let records = &self.holders.records;
        if let Found::Done(left) = left {
            if left.is_empty() && records.tombstone(volume).await?.is_some() {
                self.purge(volume).await?;
            }
        }
        Ok(())
    }

    async fn publish(
        &self,
        req: pb::ControllerPublishVolumeRequest,
    ) -> Result<HashMap<String, String>, Status> {
        not_empty(&req.volume_id, "volume_id")?;
        not_empty(&req.node_id, "node_id")?;
        let cap = req
            .volume_capability
            .as_ref()
            .ok_or_else(|| Status::invalid_argument("volume_capability is missing"))?;
        if let Some(why) = caps::unsupported(cap) {
            return Err(Status::invalid_argument(format!(
                "volume capability: {why}"
            )));
        }
        let _busy = self.busy.start(&req.volume_id)?;
        let records = &self.holders.records;
        if records.volume(&req.volume_id).await?.is_none() {
            return Err(Status::not_found(format!("no volume {:?}", req.volume_id)));
        }
        if records.node(&req.node_id).await?.is_none() {
            return Err(Status::not_found(format!(
                "no node {:?} (its node plugin registers it when it starts)",
                req.node_id
            )));
        }
        if records.tombstone(&req.volume_id).await?.is_some() {
            return Err(Status::not_found(format!(
                "volume {} was deleted (it is kept only for its snapshots)",
                req.volume_id
            )));
        }
        let readonly = req.readonly || caps::reader_only(Some(cap));
        let node = req.node_id.clone();
        // At most two rounds: a state another caller created meanwhile is judged like the
        // newest one read.
        let mut latest = records.attachment(&req.volume_id).await?;
        let seq = loop {
            match &latest {
                Some(held) if held.node.as_deref() == Some(node.as_str()) => {
                    if held.readonly != readonly {
                        return Err(Status::already_exists(format!(
                            "volume {} is published to node {node} with readonly={} already",
                            held.volume, held.readonly
                        )));
                    }
                    break held.seq;
                }
                Some(Attachment {
                    node: Some(other), ..
                }) => {
                    return Err(Status::failed_precondition(format!(
                        "volume {} is published to node {other}: it is attached to one node at a time (unpublish it there, or force-detach a failed node)",
                        req.volume_id
                    )))
                }
                _ => {}
            }
            let att = Attachment {
                volume: req.volume_id.clone(),
                seq: latest.as_ref().map_or(1, |a| a.seq + 1),
                node: Some(node.clone()),
                readonly,
                since_unix: now_unix(),
            };
            match records.next_attachment(&att).await? {
                Created::New => break att.seq,
                Created::Exists(other) => latest = Some(other),
            }
        };
        let mut ctx = HashMap::from([
            (TAKEOVER.to_string(), "true".to_string()),
            (ATTACHMENT.to_string(), seq.to_string()),
        ]);
        if readonly {
            ctx.insert("glidefs.io/readonly".into(), "true".into());
        }
        // Read after the attachment is written: see `qos` (ControllerModifyVolume, step 3).
        ctx.extend(self.qos_context(&req.volume_id).await?);
        Ok(ctx)
    }

    async fn unpublish(&self, volume: &str, node: &str) -> Result<(), Status> {
        not_empty(volume, "volume_id")?;
        let _busy = self.busy.start(volume)?;
        let records = &self.holders.records;
        let mut latest = records.attachment(volume).await?;
        loop {
            let Some(held) = latest.as_ref().filter(|a| {
                a.node.is_some() && (node.is_empty() || a.node.as_deref() == Some(node))
            }) else {
                return Ok(()); // detached, or published to another node
            };
            let detached = Attachment {
                volume: volume.to_string(),
                seq: held.seq + 1,
                node: None,
                readonly: false,
                since_unix: now_unix(),
            };
            match records.next_attachment(&detached).await? {
                Created::New => return Ok(()),
                Created::Exists(other) => latest = Some(other),
            }
        }
    }

    async fn validate(
        &self,
        req: pb::ValidateVolumeCapabilitiesRequest,
    ) -> Result<pb::ValidateVolumeCapabilitiesResponse, Status> {
        not_empty(&req.volume_id, "volume_id")?;
        if req.volume_capabilities.is_empty() {
            return Err(Status::invalid_argument("volume_capabilities is empty"));
        }
        let records = &self.holders.records;
        if records.volume(&req.volume_id).await?.is_none() {
            return Err(Status::not_found(format!("no volume {:?}", req.volume_id)));
        }
        let refused: Vec<String> = req
            .volume_capabilities
            .iter()
            .filter_map(caps::unsupported)
            .collect();
        if !refused.is_empty() {
            return Ok(pb::ValidateVolumeCapabilitiesResponse {
                confirmed: None,
                message: refused.join("; "),
            });
        }
        Ok(pb::ValidateVolumeCapabilitiesResponse {
            confirmed: Some(pb::validate_volume_capabilities_response::Confirmed {
                volume_context: req.volume_context,
                volume_capabilities: req.volume_capabilities,
                parameters: req.parameters,
                ..Default::default()
            }),
            message: String::new(),
        })
    }

    async fn expand(
        &self,
        req: pb::ControllerExpandVolumeRequest,
    ) -> Result<pb::ControllerExpandVolumeResponse, Status> {
        not_empty(&req.volume_id, "volume_id")?;
        let range = req
            .capacity_range
            .ok_or_else(|| Status::invalid_argument("capacity_range is missing"))?;
        let id = &req.volume_id;
        let _busy = self.busy.start(id)?;
        let records = &self.holders.records;
        let Some(rec) = records.volume(id).await? else {
            return Err(Status::not_found(format!("no volume {id:?}")));
        };
        let want = params::capacity(Some(&range), rec.block_size)?;
        let grown = self
            .holders
            .with_volume(id, &format!("expanding volume {id}"), |d| async move {
                let now = d.show(id).await?.map_or(0, |f| f.size);
                if now >= want {
                    return Ok(now);
                }
                d.resize(id, want).await.map(|f| f.size)
            })
            .await?;
        let size = match grown {
            Found::Done(s) => s,
            Found::Missing => {
                return Err(Status::not_found(format!(
                    "volume {id} is not in the store"
                )))
            }
        };
        if !params::fits(size, Some(&range)) && size < want {
            return Err(Status::out_of_range(format!("volume {id} is {size} bytes")));
        }
        let block = matches!(
            req.volume_capability
                .as_ref()
                .and_then(|c| c.access_type.as_ref()),
            Some(pb::volume_capability::AccessType::Block(_))
        );
        Ok(pb::ControllerExpandVolumeResponse {
            capacity_bytes: i64::try_from(size).unwrap_or(i64::MAX),
            node_expansion_required: !block,
        })
    }
}

type Answer<T> = Result<Response<T>, Status>;

/// The RPCs not offered (ListVolumes, GetCapacity: an object store has no capacity to report,
/// ControllerGetVolume, GetSnapshot) keep the generated default:
/// `UNIMPLEMENTED`, and no capability advertises them.
#[tonic::async_trait]
impl pb::controller_server::Controller for Arc<Controller> {
    async fn create_volume(
        &self,
        request: Request<pb::CreateVolumeRequest>,
    ) -> Answer<pb::CreateVolumeResponse> {
        let volume = Controller::create_volume(self, request.into_inner()).await?;
        Ok(Response::new(pb::CreateVolumeResponse {
            volume: Some(volume),
        }))
    }

    async fn delete_volume(
        &self,
        request: Request<pb::DeleteVolumeRequest>,
    ) -> Answer<pb::DeleteVolumeResponse> {
        Controller::delete_volume(self, &request.into_inner().volume_id).await?;
        Ok(Response::new(pb::DeleteVolumeResponse {}))
    }

    async fn controller_publish_volume(
        &self,
        request: Request<pb::ControllerPublishVolumeRequest>,
    ) -> Answer<pb::ControllerPublishVolumeResponse> {
        let publish_context = self.publish(request.into_inner()).await?;
        Ok(Response::new(pb::ControllerPublishVolumeResponse {
            publish_context,
        }))
    }

    async fn controller_unpublish_volume(
        &self,
        request: Request<pb::ControllerUnpublishVolumeRequest>,
    ) -> Answer<pb::ControllerUnpublishVolumeResponse> {
        let r = request.into_inner();
        self.unpublish(&r.volume_id, &r.node_id).await?;
        Ok(Response::new(pb::ControllerUnpublishVolumeResponse {}))
    }

    async fn validate_volume_capabilities(
        &self,
        request: Request<pb::ValidateVolumeCapabilitiesRequest>,
    ) -> Answer<pb::ValidateVolumeCapabilitiesResponse> {
        Ok(Response::new(self.validate(request.into_inner()).await?))
    }

    async fn controller_get_capabilities(
        &self,
        _request: Request<pb::ControllerGetCapabilitiesRequest>,
    ) -> Answer<pb::ControllerGetCapabilitiesResponse> {
        Ok(Response::new(pb::ControllerGetCapabilitiesResponse {
            capabilities: caps::controller(),
        }))
    }

    async fn create_snapshot(
        &self,
        request: Request<pb::CreateSnapshotRequest>,
    ) -> Answer<pb::CreateSnapshotResponse> {
        let snapshot = self.snapshot_create(request.into_inner()).await?;
        Ok(Response::new(pb::CreateSnapshotResponse {
            snapshot: Some(snapshot),
        }))
    }

    async fn delete_snapshot(
        &self,
        request: Request<pb::DeleteSnapshotRequest>,
    ) -> Answer<pb::DeleteSnapshotResponse> {
        self.snapshot_delete(&request.into_inner().snapshot_id)
            .await?;
        Ok(Response::new(pb::DeleteSnapshotResponse {}))
    }

    async fn list_snapshots(
        &self,
        request: Request<pb::ListSnapshotsRequest>,
    ) -> Answer<pb::ListSnapshotsResponse> {
        Ok(Response::new(
            self.snapshot_list(request.into_inner()).await?,
        ))
    }

    async fn controller_expand_volume(
        &self,
        request: Request<pb::ControllerExpandVolumeRequest>,
    ) -> Answer<pb::ControllerExpandVolumeResponse> {
        Ok(Response::new(self.expand(request.into_inner()).await?))
    }

    async fn controller_modify_volume(
        &self,
        request: Request<pb::ControllerModifyVolumeRequest>,
    ) -> Answer<pb::ControllerModifyVolumeResponse> {
        self.modify(request.into_inner()).await?;
        Ok(Response::new(pb::ControllerModifyVolumeResponse {}))
    }
}
