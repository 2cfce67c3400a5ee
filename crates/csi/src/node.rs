//! The CSI Node service: a volume is staged once per node (opened on the node's daemon, and
//! for a filesystem made on first use and mounted at the staging path), then published
//! into each pod (a bind of the device file for a raw block volume, a bind mount of the
//! staging mount for a filesystem).
//!
//! - NodeStage opens the volume on this node's daemon with the takeover the controller
//!   granted in the publish context (`controller::TAKEOVER`): after a force detach of a
//!   failed node this fences that node's daemon in the store.
//! - NodeUnstage unmounts, then closes the volume on the daemon, which flushes everything
//!   written to the store and releases it: an acknowledged write is in the store before
//!   the call answers, and a failed flush fails the call (the kubelet retries it). A device
//!   still open somewhere is `FAILED_PRECONDITION` (the daemon's `device_busy`). A handle
//!   another node took the volume from (fenced) is dropped: nothing of it can reach the
//!   store, and the unstage must not fail forever.
//! - The publish context names the attachment (`controller::ATTACHMENT`); the staged record
//!   keeps it. A NodeStage for another attachment than the one the node staged (the node
//!   was force-detached, the volume lived elsewhere, now it is back) retires the daemon's
//!   old handle (flush and release, or drop when fenced) and opens the volume afresh:
//!   serving the old handle would show the pod stale data (found by review).
//! - Every call is idempotent; the staged-volume records ([`crate::staged`]) let a
//!   restarted plugin answer for volumes it staged before.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tonic::{Request, Response, Status};

use crate::caps::{self, Access};
use crate::controller::{ATTACHMENT, TAKEOVER};
use crate::daemon::{Close, Daemon, VolumeRequest};
use crate::inflight::Inflight;
use crate::mounter::{MountError, Mounter};
use crate::pb;
use crate::qos;
use crate::staged::{Staged, StagedDir};

/// The topology key NodeGetInfo reports the node's name under.
pub const TOPOLOGY_NODE: &str = "topology.glidefs.io/node";

/// The node service.
#[derive(Debug, Clone)]
pub struct Node {
    pub(crate) node_id: String,
    pub(crate) daemon: Arc<dyn Daemon>,
    pub(crate) mounter: Arc<dyn Mounter>,
    pub(crate) staged: StagedDir,
    pub(crate) busy: Inflight,
}

fn need(value: &str, what: &str) -> Result<(), Status> {
    if value.is_empty() {
        return Err(Status::invalid_argument(format!("{what} is empty")));
    }
    Ok(())
}

impl Node {
    pub fn new(
        node_id: String,
        daemon: Arc<dyn Daemon>,
        mounter: Arc<dyn Mounter>,
        staged: StagedDir,
    ) -> Self {
        Self {
            node_id,
            daemon,
            mounter,
            staged,
            busy: Inflight::default(),
        }
    }

    /// Runs mounter (and staged-record) work on the blocking pool.
    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&dyn Mounter, &StagedDir) -> Result<T, MountError> + Send + 'static,
    ) -> Result<T, Status> {
        let (m, s) = (self.mounter.clone(), self.staged.clone());
        tokio::task::spawn_blocking(move || f(m.as_ref(), &s))
            .await
            .map_err(|e| Status::internal(format!("node task failed: {e}")))?
            .map_err(|e| e.status())
    }

    /// The daemon's device of `volume`, opening the volume when the daemon does not serve it.
    /// Lets the daemon's handle of `volume` go: flushed and released, or, when another daemon
    /// has taken the volume over (the handle is fenced, or learns it is when it flushes),
    /// dropped: none of its writes can reach the store any more.
    async fn retire(&self, volume: &str) -> Result<(), Status> {
        match self.daemon.close(volume, Close::Flush).await {
            Ok(()) => Ok(()),
            Err(e) if e.is("fenced") || e.is("volume_failed") => {
                tracing::warn!(volume, error = %e, "the volume was taken over: dropping this node's handle");
                self.daemon
                    .close(volume, Close::Drop)
                    .await
                    .map_err(|e| e.status(&format!("dropping volume {volume}")))
            }
            Err(e) if e.is("not_found") => Ok(()),
            Err(e) => Err(e.status(&format!("flushing and closing volume {volume}"))),
        }
    }

    /// The daemon's device of `volume`, opening the volume unless the daemon holds it for
    /// this very attachment (`current`).
    async fn open(
        &self,
        req: &pb::NodeStageVolumeRequest,
        current: bool,
    ) -> Result<String, Status> {
        let id = &req.volume_id;
        let served = self.daemon.show(id).await.map_err(|e| e.status("node"))?;
        let served = match served {
            Some(f) if current && f.state != "fenced" => Some(f),
            Some(_) => {
                // A handle from another attachment of this volume to this node: the node was
                // force-detached, and the volume may have been written elsewhere since.
                self.retire(id).await?;
                None
            }
            None => None,
        };
        let facts = match served {
            Some(f) => f,
            None => {
                let ctx = &req.volume_context;
                let open = VolumeRequest {
                    name: id.clone(),
                    attach_existing: true,
                    takeover: req
                        .publish_context
                        .get(TAKEOVER)
                        .is_some_and(|v| v == "true"),
                    encryption_key_file: ctx.get("encryptionKeyFile").cloned(),
                    durability: ctx.get("durability").cloned(),
                    qos: qos::from_context(&req.publish_context)?,
                    ..VolumeRequest::default()
                };
                match self.daemon.open(&open).await {
                    Ok(f) => f,
                    Err(e) if e.is("volume_not_in_store") => {
                        return Err(Status::not_found(format!("no volume {id} in the store")))
                    }
                    Err(e) => return Err(e.status(&format!("opening volume {id}"))),
                }
            }
        };
        facts.device.ok_or_else(|| {
            Status::failed_precondition(format!(
                "the daemon serves volume {id} without a block device (is it running with --no-devices?)"
            ))
        })
    }

    async fn stage(&self, req: pb::NodeStageVolumeRequest) -> Result<(), Status> {
        need(&req.volume_id, "volume_id")?;
        need(&req.staging_target_path, "staging_target_path")?;
        let access = caps::access(req.volume_capability.as_ref())?;
        let _busy = self.busy.start(&req.volume_id)?;
        let staging = PathBuf::from(&req.staging_target_path);
        let kind = match &access {
            Access::Block => "block".to_string(),
            Access::Mount { fs_type, .. } => fs_type.clone(),
        };
        let attachment = req
            .publish_context
            .get(ATTACHMENT)
            .and_then(|s| s.parse::<u64>().ok());
        let id = req.volume_id.clone();
        let mut current = false;
        if let Some(old) = self.blocking(move |_, s| s.get(&id)).await? {
            if old.attachment == attachment {
                if old.staging_path != staging || old.access != kind {
                    return Err(Status::already_exists(format!(
                        "volume {} is staged at {} as {} already",
                        old.volume,
                        old.staging_path.display(),
                        old.access
                    )));
                }
                current = true;
            } else {
                // Staged for an earlier attachment the node never unstaged (a force detach):
                // its staging mount goes with its handle.
                let path = old.staging_path.clone();
                self.blocking(move |m, _| m.unmount(&path)).await?;
            }
        }
        let device = self.open(&req, current).await?;
        let rec = Staged {
            volume: req.volume_id.clone(),
            staging_path: staging.clone(),
            access: kind,
            device: device.clone(),
            attachment,
            published: Default::default(),
        };
        self.blocking(move |m, s| {
            let mut rec = rec;
            if let Some(old) = s.get(&rec.volume)?.filter(|o| o.attachment == rec.attachment) {
                rec.published = old.published;
            }
            if let Access::Mount {
                fs_type,
                mount_flags,
            } = &access
            {
                std::fs::create_dir_all(&staging).map_err(|source| MountError::Io {
                    op: "create",
                    path: staging.clone(),
                    source,
                })?;
                if !m.is_mounted(&staging)? {
                    if m.format_if_blank(&device, fs_type)? {
                        tracing::info!(volume = %rec.volume, device, fs = %fs_type, "made a filesystem");
                    }
                    m.mount(&device, &staging, fs_type, mount_flags)?;
                }
            }
            s.put(&rec)
        })
        .await
    }

    async fn unstage(&self, volume: &str, staging: &str) -> Result<(), Status> {
        need(volume, "volume_id")?;
        need(staging, "staging_target_path")?;
        let _busy = self.busy.start(volume)?;
        let staging = PathBuf::from(staging);
        self.blocking(move |m, _| m.unmount(&staging)).await?;
        if self
            .daemon
            .show(volume)
            .await
            .map_err(|e| e.status("node"))?
            .is_some()
        {
            self.retire(volume).await?;
        }
        let v = volume.to_string();
        self.blocking(move |_, s| s.remove(&v)).await
    }

    async fn publish(&self, req: pb::NodePublishVolumeRequest) -> Result<(), Status> {
        need(&req.volume_id, "volume_id")?;
        need(&req.target_path, "target_path")?;
        let access = caps::access(req.volume_capability.as_ref())?;
        need(&req.staging_target_path, "staging_target_path")?;
        let _busy = self.busy.start(&req.volume_id)?;
        let id = req.volume_id.clone();
        let Some(rec) = self.blocking(move |_, s| s.get(&id)).await? else {
            return Err(Status::failed_precondition(format!(
                "volume {} is not staged on this node",
                req.volume_id
            )));
        };
        if rec.staging_path != Path::new(&req.staging_target_path) {
            return Err(Status::failed_precondition(format!(
                "volume {} is staged at {}, not {}",
                rec.volume,
                rec.staging_path.display(),
                req.staging_target_path
            )));
        }
        if (access == Access::Block) != rec.is_block() {
            return Err(Status::already_exists(format!(
                "volume {} is staged as {}",
                rec.volume, rec.access
            )));
        }
        let target = PathBuf::from(&req.target_path);
        if caps::single_writer(req.volume_capability.as_ref())
            && rec.published.iter().any(|p| *p != target)
        {
            return Err(Status::failed_precondition(format!(
                "volume {} is SINGLE_NODE_SINGLE_WRITER and published at {} already",
                rec.volume,
                rec.published
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        let readonly = req.readonly || caps::reader_only(req.volume_capability.as_ref());
        self.blocking(move |m, s| {
            let mut rec = rec;
            let source = if rec.is_block() {
                if let Some(dir) = target.parent() {
                    std::fs::create_dir_all(dir).map_err(|source| MountError::Io {
                        op: "create",
                        path: dir.to_path_buf(),
                        source,
                    })?;
                }
                if !target.exists() {
                    std::fs::File::create(&target).map_err(|source| MountError::Io {
                        op: "create",
                        path: target.clone(),
                        source,
                    })?;
                }
                PathBuf::from(&rec.device)
            } else {
                std::fs::create_dir_all(&target).map_err(|source| MountError::Io {
                    op: "create",
                    path: target.clone(),
                    source,
                })?;
                rec.staging_path.clone()
            };
            m.bind(&source, &target, readonly)?;
            rec.published.insert(target);
            s.put(&rec)
        })
        .await
    }

    async fn unpublish(&self, volume: &str, target: &str) -> Result<(), Status> {
        need(volume, "volume_id")?;
        need(target, "target_path")?;
        let _busy = self.busy.start(volume)?;
        let (v, target) = (volume.to_string(), PathBuf::from(target));
        self.blocking(move |m, s| {
            m.unmount(&target)?;
            let gone = match std::fs::symlink_metadata(&target) {
                Ok(md) if md.is_dir() => std::fs::remove_dir(&target),
                Ok(_) => std::fs::remove_file(&target),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(e),
            };
            gone.map_err(|source| MountError::Io {
                op: "remove",
                path: target.clone(),
                source,
            })?;
            if let Some(mut rec) = s.get(&v)? {
                if rec.published.remove(&target) {
                    s.put(&rec)?;
                }
            }
            Ok(())
        })
        .await
    }

    async fn stats(
        &self,
        req: pb::NodeGetVolumeStatsRequest,
    ) -> Result<pb::NodeGetVolumeStatsResponse, Status> {
        need(&req.volume_id, "volume_id")?;
        need(&req.volume_path, "volume_path")?;
        let id = req.volume_id.clone();
        let Some(rec) = self.blocking(move |_, s| s.get(&id)).await? else {
            return Err(Status::not_found(format!(
                "volume {} is not staged on this node",
                req.volume_id
            )));
        };
        let path = PathBuf::from(&req.volume_path);
        if !path.exists() {
            return Err(Status::not_found(format!("no path {}", path.display())));
        }
        let facts = self
            .daemon
            .show(&rec.volume)
            .await
            .map_err(|e| e.status("node"))?;
        let condition = Some(match &facts {
            Some(f) if f.state == "running" => pb::VolumeCondition {
                abnormal: false,
                message: "serving".into(),
            },
            Some(f) => pb::VolumeCondition {
                abnormal: true,
                message: format!("the daemon reports the volume {}", f.state),
            },
            None => pb::VolumeCondition {
                abnormal: true,
                message: "the daemon does not serve the volume".into(),
            },
        });
        let bytes = pb::volume_usage::Unit::Bytes as i32;
        let usage = if rec.is_block() {
            let total = facts.map_or(0, |f| f.size);
            vec![pb::VolumeUsage {
                total: i64::try_from(total).unwrap_or(i64::MAX),
                unit: bytes,
                ..Default::default()
            }]
        } else {
            let u = self.blocking(move |m, _| m.usage(&path)).await?;
            let i = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
            vec![
                pb::VolumeUsage {
                    available: i(u.available_bytes),
                    total: i(u.total_bytes),
                    used: i(u.used_bytes),
                    unit: bytes,
                },
                pb::VolumeUsage {
                    available: i(u.free_inodes),
                    total: i(u.total_inodes),
                    used: i(u.total_inodes.saturating_sub(u.free_inodes)),
                    unit: pb::volume_usage::Unit::Inodes as i32,
                },
            ]
        };
        Ok(pb::NodeGetVolumeStatsResponse {
            usage,
            volume_condition: condition,
        })
    }

    async fn expand(
        &self,
        req: pb::NodeExpandVolumeRequest,
    ) -> Result<pb::NodeExpandVolumeResponse, Status> {
        need(&req.volume_id, "volume_id")?;
        need(&req.volume_path, "volume_path")?;
        let _busy = self.busy.start(&req.volume_id)?;
        let id = req.volume_id.clone();
        let Some(rec) = self.blocking(move |_, s| s.get(&id)).await? else {
            return Err(Status::not_found(format!(
                "volume {} is not staged on this node",
                req.volume_id
            )));
        };
        let size = self
            .daemon
            .show(&rec.volume)
            .await
            .map_err(|e| e.status("node"))?
            .map_or(0, |f| f.size);
        let required = req
            .capacity_range
            .as_ref()
            .map_or(0, |r| u64::try_from(r.required_bytes).unwrap_or(0));
        if size < required {
            return Err(Status::failed_precondition(format!(
                "volume {} is {size} bytes on this node, less than the {required} asked: expand it through the controller first",
                rec.volume
            )));
        }
        if !rec.is_block() {
            self.blocking(move |m, _| m.grow(&rec.device, &rec.staging_path, &rec.access))
                .await?;
        }
        Ok(pb::NodeExpandVolumeResponse {
            capacity_bytes: i64::try_from(size).unwrap_or(i64::MAX),
        })
    }
}

type Answer<T> = Result<Response<T>, Status>;

#[tonic::async_trait]
impl pb::node_server::Node for Arc<Node> {
    async fn node_stage_volume(
        &self,
        request: Request<pb::NodeStageVolumeRequest>,
    ) -> Answer<pb::NodeStageVolumeResponse> {
        self.stage(request.into_inner()).await?;
        Ok(Response::new(pb::NodeStageVolumeResponse {}))
    }

    async fn node_unstage_volume(
        &self,
        request: Request<pb::NodeUnstageVolumeRequest>,
    ) -> Answer<pb::NodeUnstageVolumeResponse> {
        let r = request.into_inner();
        self.unstage(&r.volume_id, &r.staging_target_path).await?;
        Ok(Response::new(pb::NodeUnstageVolumeResponse {}))
    }

    async fn node_publish_volume(
        &self,
        request: Request<pb::NodePublishVolumeRequest>,
    ) -> Answer<pb::NodePublishVolumeResponse> {
        self.publish(request.into_inner()).await?;
        Ok(Response::new(pb::NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<pb::NodeUnpublishVolumeRequest>,
    ) -> Answer<pb::NodeUnpublishVolumeResponse> {
        let r = request.into_inner();
        self.unpublish(&r.volume_id, &r.target_path).await?;
        Ok(Response::new(pb::NodeUnpublishVolumeResponse {}))
    }

    async fn node_get_volume_stats(
        &self,
        request: Request<pb::NodeGetVolumeStatsRequest>,
    ) -> Answer<pb::NodeGetVolumeStatsResponse> {
        Ok(Response::new(self.stats(request.into_inner()).await?))
    }

    async fn node_expand_volume(
        &self,
        request: Request<pb::NodeExpandVolumeRequest>,
    ) -> Answer<pb::NodeExpandVolumeResponse> {
        Ok(Response::new(self.expand(request.into_inner()).await?))
    }

    async fn node_get_capabilities(
        &self,
        _request: Request<pb::NodeGetCapabilitiesRequest>,
    ) -> Answer<pb::NodeGetCapabilitiesResponse> {
        Ok(Response::new(pb::NodeGetCapabilitiesResponse {
            capabilities: caps::node(),
        }))
    }

    async fn node_get_info(
        &self,
        _request: Request<pb::NodeGetInfoRequest>,
    ) -> Answer<pb::NodeGetInfoResponse> {
        Ok(Response::new(pb::NodeGetInfoResponse {
            node_id: self.node_id.clone(),
            max_volumes_per_node: 0,
            accessible_topology: Some(pb::Topology {
                segments: [(TOPOLOGY_NODE.to_string(), self.node_id.clone())].into(),
            }),
        }))
    }
}
