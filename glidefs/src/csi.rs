//! `glidefs csi`: the CSI driver (`crates/csi`) on this crate's API client. The driver asks a
//! daemon through [`ApiDaemon`] (the daemon's HTTP API, `glidefs/API.md`) and reaches the
//! daemon of another node through [`ApiConnector`] (`unix:PATH`, or `https://HOST:PORT` with
//! the token and CA given to `glidefs csi`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use glidefs_csi::daemon::{
    Close, Connector, Daemon, DaemonError, SnapshotFacts, VolumeFacts, VolumeRequest,
};
use glidefs_csi::holder::Holders;
use glidefs_csi::mounter::SystemMounter;
use glidefs_csi::records::{NodeRecord, Records};
use glidefs_csi::staged::StagedDir;
use glidefs_csi::{Controller, Node, Services};
use hyper::Method;
use serde_json::Value;

use crate::cli::args::{CsiArgs, CsiMode};
use glidefs_client::{Client, ClientError, Endpoint};
use glidefs_daemon::config::Config;
use glidefs_model::api::{CreateVolume, QosLimits, SnapshotDoc, VolumeInfo, VolumeState};

/// A daemon reached through its API.
#[derive(Debug, Clone)]
pub struct ApiDaemon {
    client: Client,
}

impl ApiDaemon {
    pub fn new(endpoint: Endpoint) -> Self {
        Self {
            client: Client::new(endpoint),
        }
    }
}

fn daemon_error(e: ClientError) -> DaemonError {
    match e {
        ClientError::Api { code, message, .. } => DaemonError { code, message },
        other => DaemonError::unavailable(other.to_string()),
    }
}

fn facts(v: VolumeInfo) -> VolumeFacts {
    let state = match v.state {
        VolumeState::Running => "running",
        VolumeState::Fenced => "fenced",
        VolumeState::Failed => "failed",
        VolumeState::Recovering => "recovering",
    };
    VolumeFacts {
        name: v.name,
        size: v.size,
        block_size: v.block_size,
        device: v.device.path,
        state: state.to_string(),
        read_only: v.read_only,
    }
}

fn snapshot_facts(s: SnapshotDoc) -> SnapshotFacts {
    SnapshotFacts {
        volume: s.volume,
        name: s.name,
        size: s.size,
        created_unix: s.created_unix,
    }
}

/// `Ok(None)` for a `not_found`-like answer.
fn absent<T>(r: Result<T, ClientError>, codes: &[&str]) -> Result<Option<T>, DaemonError> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(ClientError::Api { code, .. }) if codes.contains(&code.as_str()) => Ok(None),
        Err(e) => Err(daemon_error(e)),
    }
}

#[async_trait]
impl Daemon for ApiDaemon {
    async fn ready(&self) -> Result<bool, DaemonError> {
        let r = self
            .client
            .raw(Method::GET, "/readyz", &[], None)
            .await
            .map_err(daemon_error)?;
        Ok(r.status == 200)
    }

    async fn open(&self, req: &VolumeRequest) -> Result<VolumeFacts, DaemonError> {
        let body = CreateVolume {
            name: req.name.clone(),
            size: req.size.map(Value::from),
            block_size: req.block_size.map(Value::from),
            read_only: req.read_only,
            attach_existing: req.attach_existing,
            takeover: req.takeover,
            from: req.from.clone(),
            encryption_key_file: req.encryption_key_file.clone(),
            durability: req.durability.clone(),
            qos: (!req.qos.is_empty()).then_some(req.qos),
            ..CreateVolume::default()
        };
        self.client
            .create(&body)
            .await
            .map(facts)
            .map_err(daemon_error)
    }

    async fn show(&self, name: &str) -> Result<Option<VolumeFacts>, DaemonError> {
        Ok(absent(self.client.show(name).await, &["not_found"])?.map(facts))
    }

    async fn close(&self, name: &str, how: Close) -> Result<(), DaemonError> {
        let (purge, force) = match how {
            Close::Flush => (false, false),
            Close::Purge => (true, false),
            Close::Drop => (false, true),
        };
        self.client
            .remove(name, purge, force)
            .await
            .map(|_| ())
            .map_err(daemon_error)
    }

    async fn set_qos(&self, name: &str, limits: &QosLimits) -> Result<(), DaemonError> {
        self.client
            .set_qos(name, limits)
            .await
            .map(|_| ())
            .map_err(daemon_error)
    }

    async fn resize(&self, name: &str, size: u64) -> Result<VolumeFacts, DaemonError> {
        self.client.resize(name, size).await.map_err(daemon_error)?;
        self.client
            .show(name)
            .await
            .map(facts)
            .map_err(daemon_error)
    }

    async fn snapshot(&self, volume: &str, name: &str) -> Result<SnapshotFacts, DaemonError> {
        self.client
            .snapshot_create(volume, name)
            .await
            .map(snapshot_facts)
            .map_err(daemon_error)
    }

    async fn snapshot_info(
        &self,
        volume: &str,
        name: &str,
    ) -> Result<Option<SnapshotFacts>, DaemonError> {
        let r = self.client.snapshot_one(Method::GET, volume, name).await;
        Ok(absent(r, &["snapshot_not_found"])?.map(snapshot_facts))
    }

    async fn snapshots(&self, volume: &str) -> Result<Vec<SnapshotFacts>, DaemonError> {
        self.client
            .snapshot_list(volume)
            .await
            .map(|l| l.snapshots.into_iter().map(snapshot_facts).collect())
            .map_err(daemon_error)
    }

    async fn delete_snapshot(&self, volume: &str, name: &str) -> Result<(), DaemonError> {
        self.client
            .snapshot_one(Method::DELETE, volume, name)
            .await
            .map(|_| ())
            .map_err(daemon_error)
    }
}

/// Reaches node daemons at the addresses their plugins registered.
#[derive(Debug, Clone, Default)]
pub struct ApiConnector {
    /// Bearer token for `https://` addresses.
    pub token: Option<String>,
    /// CA to verify `https://` addresses with (else the system's).
    pub ca: Option<PathBuf>,
}

impl Connector for ApiConnector {
    fn connect(&self, address: &str) -> Result<Arc<dyn Daemon>, DaemonError> {
        let endpoint = match address.strip_prefix("unix:") {
            Some(path) => Endpoint::Unix(PathBuf::from(path)),
            None => glidefs_client::endpoint::endpoint_from_url(
                address,
                self.token.clone(),
                self.ca.as_deref(),
            )
            .map_err(|e| {
                DaemonError::unavailable(format!("node daemon address {address:?}: {e}"))
            })?,
        };
        Ok(Arc::new(ApiDaemon::new(endpoint)))
    }
}

/// The path of a CSI endpoint (`unix:///csi/csi.sock`, `unix:/csi/csi.sock` or a path).
pub fn socket_path(endpoint: &str) -> &Path {
    Path::new(
        endpoint
            .strip_prefix("unix://")
            .or_else(|| endpoint.strip_prefix("unix:"))
            .unwrap_or(endpoint),
    )
}

/// `glidefs csi` could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CsiError {
    #[error("cannot open the object store {url} (the driver's records live there): {source}")]
    Store {
        url: String,
        #[source]
        source: glidefs_objstore::ObjStoreError,
    },
    #[error("cannot read the node token file {path}: {source}")]
    Token {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("node state directory: {0}")]
    State(#[from] glidefs_csi::mounter::MountError),
    #[error("registering node {node} in the object store: {source}")]
    Register {
        node: String,
        #[source]
        source: glidefs_csi::records::RecordError,
    },
    #[error("{0}")]
    Serve(#[from] glidefs_csi::ServeError),
}

/// Serves the driver as `args` asks, on the store and daemon socket of `cfg`, until `stop`.
pub async fn run(
    args: &CsiArgs,
    cfg: &Config,
    stop: impl std::future::Future<Output = ()> + Send,
) -> Result<(), CsiError> {
    let url = cfg.store_url();
    let store = glidefs_objstore::open_store(&url, &cfg.s3_options())
        .map_err(|source| CsiError::Store { url, source })?;
    let records = Records::new(store);
    let socket = args
        .socket
        .clone()
        .unwrap_or_else(|| cfg.api.socket.clone());
    let daemon: Arc<dyn Daemon> = Arc::new(ApiDaemon::new(Endpoint::Unix(socket.clone())));
    let controller = match args.mode {
        CsiMode::Node => None,
        CsiMode::Controller | CsiMode::All => {
            let token = match &args.node_token_file {
                Some(path) => Some(
                    std::fs::read_to_string(path)
                        .map_err(|source| CsiError::Token {
                            path: path.clone(),
                            source,
                        })?
                        .trim()
                        .to_string(),
                ),
                None => None,
            };
            let connector = Arc::new(ApiConnector {
                token,
                ca: args.node_ca.clone(),
            });
            Some(Controller::new(Holders {
                own: daemon.clone(),
                connector,
                records: records.clone(),
            }))
        }
    };
    let node = match (args.mode, &args.node_id) {
        (CsiMode::Node | CsiMode::All, Some(id)) => {
            let staged = StagedDir::open(&args.state_dir)?;
            for s in staged.all()? {
                tracing::info!(volume = %s.volume, staging = %s.staging_path.display(), published = s.published.len(), "staged before the restart");
            }
            let api = args
                .advertise_api
                .clone()
                .unwrap_or_else(|| format!("unix:{}", socket.display()));
            let rec = NodeRecord {
                node: id.clone(),
                api,
                updated_unix: glidefs_csi::records::now_unix(),
            };
            records
                .register_node(&rec)
                .await
                .map_err(|source| CsiError::Register {
                    node: id.clone(),
                    source,
                })?;
            Some(Node::new(
                id.clone(),
                daemon.clone(),
                Arc::new(SystemMounter),
                staged,
            ))
        }
        _ => None,
    };
    let services = Services::new(daemon, controller, node);
    glidefs_csi::serve(socket_path(&args.endpoint), services, stop).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_name_a_socket_path() {
        assert_eq!(
            socket_path("unix:///csi/csi.sock"),
            Path::new("/csi/csi.sock")
        );
        assert_eq!(
            socket_path("unix:/csi/csi.sock"),
            Path::new("/csi/csi.sock")
        );
        assert_eq!(socket_path("/csi/csi.sock"), Path::new("/csi/csi.sock"));
    }
}
