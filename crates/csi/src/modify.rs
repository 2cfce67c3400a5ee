//! ControllerModifyVolume, and the QoS records of CreateVolume and ControllerPublish: the
//! controller's side of [`crate::qos`] (its module docs give the order of the steps and why).

use glidefs_model::api::QosLimits;
use tonic::Status;

use crate::controller::Controller;
use crate::pb;
use crate::qos::{apply_mutable, QOS_CONTEXT};
use crate::records::{now_unix, Created, QosRecord};

impl Controller {
    /// Records `limits` as the first QoS version of a new volume (nothing when empty; a
    /// retried CreateVolume finds its version there).
    pub(crate) async fn record_initial_qos(
        &self,
        volume: &str,
        limits: QosLimits,
    ) -> Result<(), Status> {
        if limits.is_empty() {
            return Ok(());
        }
        let rec = QosRecord {
            volume: volume.to_string(),
            seq: 1,
            limits,
            since_unix: now_unix(),
        };
        self.holders.records.next_qos(&rec).await?;
        Ok(())
    }

    /// The publish-context entry of `volume`'s limits in force, when it has any.
    pub(crate) async fn qos_context(
        &self,
        volume: &str,
    ) -> Result<Option<(String, String)>, Status> {
        let Some(rec) = self.holders.records.qos(volume).await? else {
            return Ok(None);
        };
        if rec.limits.is_empty() {
            return Ok(None);
        }
        let json = serde_json::to_string(&rec.limits)
            .map_err(|e| Status::internal(format!("encoding the QoS limits: {e}")))?;
        Ok(Some((QOS_CONTEXT.to_string(), json)))
    }

    /// ControllerModifyVolume (see the module docs).
    pub(crate) async fn modify(
        &self,
        req: pb::ControllerModifyVolumeRequest,
    ) -> Result<(), Status> {
        let id = &req.volume_id;
        if id.is_empty() {
            return Err(Status::invalid_argument("volume_id is empty"));
        }
        let _busy = self.busy.start(id)?;
        let records = &self.holders.records;
        if records.volume(id).await?.is_none() {
            return Err(Status::not_found(format!("no volume {id:?}")));
        }
        // 1.
        let newest = records.qos(id).await?;
        let base = newest.as_ref().map(|r| r.limits).unwrap_or_default();
        let limits = apply_mutable(&req.mutable_parameters, base)?;
        // 2.
        if newest.is_none() || limits != base {
            let rec = QosRecord {
                volume: id.clone(),
                seq: newest.as_ref().map_or(1, |r| r.seq + 1),
                limits,
                since_unix: now_unix(),
            };
            if let Created::Exists(other) = records.next_qos(&rec).await? {
                if other.limits != limits {
                    return Err(Status::aborted(format!(
                        "the QoS limits of volume {id} changed meanwhile (version {}): retry",
                        other.seq
                    )));
                }
            }
        }
        // 3.
        let Some(node) = records.attachment(id).await?.and_then(|a| a.node) else {
            return Ok(());
        };
        let Some(daemon) = self.holders.node_daemon(id).await? else {
            return Err(Status::unavailable(format!(
                "volume {id} is published to node {node}, whose daemon does not serve it yet: the limits are recorded, and a retry hands them to that daemon"
            )));
        };
        daemon.set_qos(id, &limits).await.map_err(|e| {
            e.status(&format!(
                "setting the QoS limits of volume {id} on node {node}"
            ))
        })
    }
}
