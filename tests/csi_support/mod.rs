//! The harness of the CSI tests without a kernel: one object store (a local directory), a
//! controller daemon (no devices) and two node daemons ("node-a", "node-b": fake devices that
//! can be resized, each with its own data directory), the driver's controller on a unix socket of its own and
//! one node plugin per node on another, each node plugin with a [`FakeMounter`] that records
//! what a kubelet's node would have mounted. Clients are the generated gRPC clients, over
//! the sockets, as the sidecars and the kubelet talk to the driver.

#![allow(dead_code)] // each test target uses a different part

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use glidefs::client::Endpoint;
use glidefs::csi::{ApiConnector, ApiDaemon};
use glidefs_csi::daemon::Daemon;
use glidefs_csi::holder::Holders;
use glidefs_csi::mounter::{MountError, Mounter, Usage};
use glidefs_csi::pb;
use glidefs_csi::pb::controller_client::ControllerClient;
use glidefs_csi::pb::identity_client::IdentityClient;
use glidefs_csi::pb::node_client::NodeClient;
use glidefs_csi::records::{NodeRecord, Records};
use glidefs_csi::staged::StagedDir;
use glidefs_csi::{Controller, Node, Services};
use parking_lot::Mutex;
use tonic::transport::Channel;

#[path = "../api_support/mod.rs"]
pub mod api_support;

use api_support::daemon::{config, file_store, start_with, Daemon as TestDaemon};
use api_support::exporters::Resizing;

/// A mount the fake mounter made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mounted {
    pub source: String,
    pub readonly: bool,
    /// `Some(fs)` for a filesystem mount, `None` for a bind.
    pub fs: Option<String>,
}

/// Records mounts instead of making them; devices "have" a filesystem once formatted.
#[derive(Debug, Default)]
pub struct FakeMounter {
    pub mounts: Mutex<BTreeMap<PathBuf, Mounted>>,
    pub formatted: Mutex<BTreeMap<String, String>>,
    pub grown: Mutex<Vec<String>>,
}

impl Mounter for FakeMounter {
    fn is_mounted(&self, path: &Path) -> Result<bool, MountError> {
        Ok(self.mounts.lock().contains_key(path))
    }
    fn format_if_blank(&self, device: &str, fs: &str) -> Result<bool, MountError> {
        let mut f = self.formatted.lock();
        if f.contains_key(device) {
            return Ok(false);
        }
        f.insert(device.to_string(), fs.to_string());
        Ok(true)
    }
    fn mount(&self, device: &str, target: &Path, fs: &str, _: &[String]) -> Result<(), MountError> {
        self.mounts
            .lock()
            .entry(target.to_path_buf())
            .or_insert(Mounted {
                source: device.to_string(),
                readonly: false,
                fs: Some(fs.to_string()),
            });
        Ok(())
    }
    fn bind(&self, source: &Path, target: &Path, readonly: bool) -> Result<(), MountError> {
        self.mounts
            .lock()
            .entry(target.to_path_buf())
            .or_insert(Mounted {
                source: source.display().to_string(),
                readonly,
                fs: None,
            });
        Ok(())
    }
    fn unmount(&self, target: &Path) -> Result<(), MountError> {
        self.mounts.lock().remove(target);
        Ok(())
    }
    fn grow(&self, device: &str, _: &Path, _: &str) -> Result<(), MountError> {
        self.grown.lock().push(device.to_string());
        Ok(())
    }
    fn usage(&self, _: &Path) -> Result<Usage, MountError> {
        Ok(Usage {
            total_bytes: 1 << 30,
            available_bytes: 1 << 29,
            used_bytes: 1 << 29,
            total_inodes: 1000,
            free_inodes: 900,
        })
    }
}

/// One node: its daemon, its plugin's socket and mounter.
pub struct NodeHost {
    pub name: String,
    pub daemon: TestDaemon,
    pub mounter: Arc<FakeMounter>,
    pub socket: PathBuf,
    pub state_dir: PathBuf,
    pub stop: Option<tokio::sync::oneshot::Sender<()>>,
    pub served: Option<tokio::task::JoinHandle<()>>,
}

/// The cluster of a test.
pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub controller_daemon: TestDaemon,
    pub controller_socket: PathBuf,
    pub nodes: Vec<NodeHost>,
    pub records: Records,
    stops: Vec<tokio::sync::oneshot::Sender<()>>,
}

async fn serve_on(
    socket: &Path,
    services: Services,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let path = socket.to_path_buf();
    let task = tokio::spawn(async move {
        glidefs_csi::serve(&path, services, async {
            let _ = rx.await;
        })
        .await
        .expect("the driver serves");
    });
    for _ in 0..200 {
        if socket.exists() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    (tx, task)
}

fn daemon_of(d: &TestDaemon) -> Arc<dyn Daemon> {
    Arc::new(ApiDaemon::new(Endpoint::Unix(d.cfg.api.socket.clone())))
}

impl Cluster {
    pub async fn start() -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = config(dir.path(), false);
        cfg.data_dir = dir.path().join("data-controller");
        cfg.api.socket = dir.path().join("run/controller.sock");
        let controller_daemon = start_with(cfg, Arc::new(glidefs::ublk::export::NoDevices)).await;
        let records = Records::new(file_store(dir.path()));
        let controller = Controller::new(Holders {
            own: daemon_of(&controller_daemon),
            connector: Arc::new(ApiConnector::default()),
            records: records.clone(),
        });
        let controller_socket = dir.path().join("csi/controller.sock");
        let services = Services::new(daemon_of(&controller_daemon), Some(controller), None);
        let (stop, _) = serve_on(&controller_socket, services).await;
        let mut cluster = Cluster {
            dir,
            controller_daemon,
            controller_socket,
            nodes: Vec::new(),
            records,
            stops: vec![stop],
        };
        for name in ["node-a", "node-b"] {
            let host = cluster.start_node(name).await;
            cluster.nodes.push(host);
        }
        cluster
    }

    /// Starts node `name`'s daemon and plugin (registering it as its plugin does).
    async fn start_node(&self, name: &str) -> NodeHost {
        let dir = self.dir.path();
        let mut cfg = config(dir, false);
        cfg.data_dir = dir.join(format!("data-{name}"));
        cfg.api.socket = dir.join(format!("run/{name}.sock"));
        let daemon = start_with(cfg, Arc::new(Resizing::default())).await;
        let mounter = Arc::new(FakeMounter::default());
        let state_dir = dir.join(format!("csi-state-{name}"));
        let mut host = NodeHost {
            name: name.to_string(),
            daemon,
            mounter,
            socket: dir.join(format!("csi/{name}.sock")),
            state_dir,
            stop: None,
            served: None,
        };
        self.start_plugin(&mut host).await;
        host
    }

    /// Starts (or restarts) a node's plugin on its socket.
    pub async fn start_plugin(&self, host: &mut NodeHost) {
        let daemon = daemon_of(&host.daemon);
        self.records
            .register_node(&NodeRecord {
                node: host.name.clone(),
                api: format!("unix:{}", host.daemon.cfg.api.socket.display()),
                updated_unix: 0,
            })
            .await
            .unwrap();
        let node = Node::new(
            host.name.clone(),
            daemon.clone(),
            host.mounter.clone(),
            StagedDir::open(&host.state_dir).unwrap(),
        );
        let (stop, served) = serve_on(&host.socket, Services::new(daemon, None, Some(node))).await;
        host.stop = Some(stop);
        host.served = Some(served);
    }

    /// Stops a node's plugin (its daemon goes on), as a plugin container restart does.
    pub async fn stop_plugin(&self, host: &mut NodeHost) {
        if let Some(s) = host.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = host.served.take() {
            let _ = t.await;
        }
    }

    pub async fn controller(&self) -> ControllerClient<Channel> {
        ControllerClient::new(glidefs_csi::connect(&self.controller_socket).await.unwrap())
    }

    pub async fn identity(&self, socket: &Path) -> IdentityClient<Channel> {
        IdentityClient::new(glidefs_csi::connect(socket).await.unwrap())
    }

    pub async fn node(&self, i: usize) -> NodeClient<Channel> {
        NodeClient::new(glidefs_csi::connect(&self.nodes[i].socket).await.unwrap())
    }

    pub fn path(&self, rel: &str) -> String {
        self.dir.path().join(rel).display().to_string()
    }
}

/// A capability: `fs` `None` for raw block, `Some("")` for the default filesystem.
pub fn capability(
    fs: Option<&str>,
    mode: pb::volume_capability::access_mode::Mode,
) -> pb::VolumeCapability {
    use pb::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};
    pb::VolumeCapability {
        access_mode: Some(AccessMode { mode: mode as i32 }),
        access_type: Some(match fs {
            None => AccessType::Block(BlockVolume {}),
            Some(f) => AccessType::Mount(MountVolume {
                fs_type: f.to_string(),
                ..Default::default()
            }),
        }),
    }
}

/// A single-node-writer capability.
pub fn writer(fs: Option<&str>) -> pb::VolumeCapability {
    capability(
        fs,
        pb::volume_capability::access_mode::Mode::SingleNodeWriter,
    )
}

pub const MIB: i64 = 1 << 20;

/// A CreateVolume request for `name` of `bytes`, 64K blocks.
pub fn create_req(name: &str, bytes: i64, fs: Option<&str>) -> pb::CreateVolumeRequest {
    pb::CreateVolumeRequest {
        name: name.to_string(),
        capacity_range: Some(pb::CapacityRange {
            required_bytes: bytes,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![writer(fs)],
        parameters: [("blockSize".to_string(), "64K".to_string())].into(),
        ..Default::default()
    }
}

/// Whether the store still holds `volume` (an attach of it on the controller's daemon, then
/// a plain close).
pub async fn in_store(c: &Cluster, volume: &str) -> bool {
    let d = &c.controller_daemon;
    let r = d
        .req(
            hyper::Method::POST,
            "/v1/volumes",
            Some(serde_json::json!({"name": volume, "attach_existing": true})),
        )
        .await;
    match r.status {
        201 => {
            d.client.remove(volume, false, false).await.unwrap();
            true
        }
        404 => false,
        s => panic!(
            "attach of {volume}: HTTP {s}: {}",
            String::from_utf8_lossy(&r.body)
        ),
    }
}
