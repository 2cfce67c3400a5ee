//! glidefs' Kubernetes CSI driver: the Identity, Controller and Node services of the CSI
//! spec (v1), served with gRPC on a unix socket (`glidefs csi --mode controller|node|all`).
//!
//! How the pieces fit (deployment and operations: `docs/kubernetes.md`):
//! - Every volume operation is a call on a glidefs daemon's API ([`daemon::Daemon`]): the
//!   controller's own daemon (no devices) for volumes no node holds, the node's daemon for
//!   staging, and the holding node's daemon for a snapshot or an expansion of a volume in
//!   use ([`holder`]).
//! - What the driver must remember between calls and across hosts lives in the object
//!   store beside the volumes, as create-only records ([`records`]): a volume's parameters,
//!   a snapshot name's volume, the one node a volume is published to, each node's daemon
//!   address. The node plugin keeps its staged volumes on local disk ([`staged`]).
//! - A volume moves from a failed node to a healthy one by a force detach (the record is
//!   deleted) and a publish that grants a takeover: the healthy node's daemon claims the
//!   volume in the store, which fences the failed node's daemon ([`controller`]).
//!
//! Contract: every RPC is idempotent; a call on a volume that has one in progress is
//! `ABORTED` ([`inflight`]); bad input is `INVALID_ARGUMENT` naming the value; nothing
//! panics on a request.

pub mod caps;
pub mod controller;
pub mod daemon;
pub mod holder;
pub mod identity;
pub mod inflight;
pub mod modify;
pub mod mounter;
pub mod node;
pub mod params;
pub mod pb;
pub mod qos;
pub mod records;
pub mod snapshots;
pub mod staged;

use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use controller::Controller;
pub use identity::{Identity, DRIVER_NAME};
pub use node::Node;

/// The services one process serves.
#[derive(Debug, Clone)]
pub struct Services {
    pub identity: Identity,
    pub controller: Option<Arc<Controller>>,
    pub node: Option<Arc<Node>>,
}

impl Services {
    /// `controller` and/or `node`, with the identity service answering for `daemon`.
    pub fn new(
        daemon: Arc<dyn daemon::Daemon>,
        controller: Option<Controller>,
        node: Option<Node>,
    ) -> Self {
        Self {
            identity: Identity {
                daemon,
                controller: controller.is_some(),
            },
            controller: controller.map(Arc::new),
            node: node.map(Arc::new),
        }
    }
}

/// Serving failed to start or stopped with an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    #[error("cannot listen on {path}: {source}")]
    Listen {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("gRPC server: {0}")]
    Server(#[from] tonic::transport::Error),
}

/// Serves `services` on the unix socket `path` (a stale socket file there is replaced)
/// until `stop` completes; the socket file is removed then.
pub async fn serve(
    path: &Path,
    services: Services,
    stop: impl std::future::Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    let listen_err = |source| ServeError::Listen {
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(listen_err)?;
    }
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(listen_err(e)),
    }
    let listener = tokio::net::UnixListener::bind(path).map_err(listen_err)?;
    let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
    let router = tonic::transport::Server::builder()
        .add_service(pb::identity_server::IdentityServer::new(services.identity));
    let router = router
        .add_optional_service(
            services
                .controller
                .map(pb::controller_server::ControllerServer::new),
        )
        .add_optional_service(services.node.map(pb::node_server::NodeServer::new));
    tracing::info!(socket = %path.display(), "CSI driver serving");
    let served = router.serve_with_incoming_shutdown(incoming, stop).await;
    // Gone with the server: a stale socket would take a client's connection attempts.
    let _ = std::fs::remove_file(path);
    served?;
    Ok(())
}

/// A gRPC channel to the driver on the unix socket `path` (for tests and tools).
pub async fn connect(path: &Path) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    let path = path.to_path_buf();
    tonic::transport::Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(path).await?,
                ))
            }
        }))
        .await
}
