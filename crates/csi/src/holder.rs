//! Which daemon acts on a volume for the controller: snapshots, resizes and purges are the
//! volume owner's to make (the store's publisher rule), so the controller asks the daemon
//! that holds the volume.
//!
//! 1. The volume is published to a node and that node's daemon serves it: that daemon,
//!    reached at the address the node registered (`csi/nodes/<node>.json`).
//! 2. Otherwise the controller's own daemon opens it (`attach_existing`, never a takeover: a
//!    volume some other daemon still owns is `FAILED_PRECONDITION`), acts, and closes it
//!    again (a close flushes and releases it, so the next node opens it without a fence).
//!
//! The controller never fences a node. A node that stages the volume while the controller's
//! daemon holds it for a moment takes it over (its publish granted a takeover): the
//! controller's operation then fails (`fenced`) and is retried by the CO, and the fenced
//! handle is dropped (it holds nothing the store lacks: the controller's daemon only writes
//! through its operations, which flush before they answer).

use std::future::Future;
use std::sync::Arc;

use tonic::Status;

use crate::daemon::{Close, Connector, Daemon, DaemonError, VolumeRequest};
use crate::records::Records;

/// The daemons the controller can ask.
#[derive(Debug, Clone)]
pub struct Holders {
    pub own: Arc<dyn Daemon>,
    pub connector: Arc<dyn Connector>,
    pub records: Records,
}

/// Whether the volume is there at all.
#[derive(Debug, PartialEq, Eq)]
pub enum Found<T> {
    Done(T),
    /// The store has no such volume.
    Missing,
}

impl Holders {
    /// The daemon of the node `volume` is published to, when that daemon serves it now.
    pub(crate) async fn node_daemon(
        &self,
        volume: &str,
    ) -> Result<Option<Arc<dyn Daemon>>, Status> {
        let records = &self.records;
        let Some(node) = records.attachment(volume).await?.and_then(|a| a.node) else {
            return Ok(None);
        };
        let Some(node) = records.node(&node).await? else {
            return Ok(None);
        };
        let daemon = self
            .connector
            .connect(&node.api)
            .map_err(|e| e.status(&format!("reaching the daemon of node {}", node.node)))?;
        match daemon.show(volume).await {
            Ok(Some(_)) => Ok(Some(daemon)),
            Ok(None) => Ok(None),
            Err(e) => Err(e.status(&format!(
                "volume {volume} is published to node {}, whose daemon",
                node.node
            ))),
        }
    }

    /// Runs `op` on the daemon that holds `volume` (see the module docs).
    pub async fn with_volume<T, F, Fut>(
        &self,
        volume: &str,
        what: &str,
        op: F,
    ) -> Result<Found<T>, Status>
    where
        F: FnOnce(Arc<dyn Daemon>) -> Fut,
        Fut: Future<Output = Result<T, DaemonError>>,
    {
        if let Some(d) = self.node_daemon(volume).await? {
            return op(d).await.map(Found::Done).map_err(|e| e.status(what));
        }
        let own = self.own.clone();
        let mut served = own.show(volume).await.map_err(|e| e.status(what))?;
        if served.as_ref().is_some_and(|f| f.state == "fenced") {
            // Left by an operation a node's takeover overtook.
            own.close(volume, Close::Drop)
                .await
                .map_err(|e| e.status(&format!("{what}: dropping a fenced handle")))?;
            served = None;
        }
        if served.is_none() {
            let req = VolumeRequest {
                name: volume.to_string(),
                attach_existing: true,
                ..VolumeRequest::default()
            };
            match own.open(&req).await {
                Ok(_) => {}
                Err(e) if e.is("volume_not_in_store") || e.is("not_found") => {
                    return Ok(Found::Missing)
                }
                Err(e) if e.is("owned_elsewhere") => {
                    return Err(Status::failed_precondition(format!(
                        "{what}: volume {volume} is held by a daemon that has not released it (a node that failed without being detached?): {}",
                        e.message
                    )))
                }
                Err(e) => return Err(e.status(what)),
            }
        }
        let result = op(own.clone()).await;
        // Closed whatever `op` did: a close flushes what `op` changed and releases the volume;
        // a handle a node took the volume from is dropped.
        let closed = match own.close(volume, Close::Flush).await {
            Err(e) if e.is("fenced") => own.close(volume, Close::Drop).await.and(Err(e)),
            r => r,
        };
        let value = result.map_err(|e| e.status(what))?;
        closed.map_err(|e| e.status(&format!("{what}: closing volume {volume} afterwards")))?;
        Ok(Found::Done(value))
    }
}
