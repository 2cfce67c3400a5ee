//! The generated CSI API: a gRPC round trip over a unix socket (as kubelet and the sidecars
//! talk to a driver), a message round trip, and field numbers checked byte by byte against
//! the spec's, so that a wrong number in proto/csi.proto fails here.

use std::collections::HashMap;
use std::path::PathBuf;

use glidefs_csi::pb::controller_service_capability;
use glidefs_csi::pb::identity_client::IdentityClient;
use glidefs_csi::pb::identity_server::{Identity, IdentityServer};
use glidefs_csi::pb::volume_capability::access_mode::Mode;
use glidefs_csi::pb::volume_capability::{AccessMode, AccessType, BlockVolume};
use glidefs_csi::pb::volume_content_source::{SnapshotSource, Type as ContentType};
use glidefs_csi::pb::{
    CapacityRange, ControllerServiceCapability, CreateVolumeRequest, GetPluginCapabilitiesRequest,
    GetPluginInfoRequest, GetPluginInfoResponse, NodePublishVolumeRequest, ProbeRequest,
    ProbeResponse, Snapshot, Topology, TopologyRequirement, VolumeCapability, VolumeContentSource,
};
use hyper_util::rt::TokioIo;
use prost::Message;
use tokio::net::{UnixListener, UnixStream};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::{Channel, Endpoint, Server, Uri};
use tonic::{Code, Request, Response, Status};

const NAME: &str = "glidefs.csi.example.com";
const VERSION: &str = "0.1.0-test";

/// Implements two of the three Identity RPCs: GetPluginCapabilities keeps the generated
/// default, which answers UNIMPLEMENTED.
#[derive(Debug)]
struct TestIdentity;

#[tonic::async_trait]
impl Identity for TestIdentity {
    async fn get_plugin_info(
        &self,
        _request: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        Ok(Response::new(GetPluginInfoResponse {
            name: NAME.to_owned(),
            vendor_version: VERSION.to_owned(),
            manifest: HashMap::new(),
        }))
    }

    async fn probe(
        &self,
        _request: Request<ProbeRequest>,
    ) -> Result<Response<ProbeResponse>, Status> {
        Ok(Response::new(ProbeResponse { ready: Some(true) }))
    }
}

/// A channel to the gRPC server listening on the unix socket at `path`. The URI is required
/// by the endpoint but not used: every connection is the connector's.
async fn connect_unix(path: PathBuf) -> Result<Channel, tonic::transport::Error> {
    Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        }))
        .await
}

#[tokio::test]
async fn identity_over_unix_socket() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("csi.sock");

    let listener = UnixListener::bind(&socket).expect("bind the unix socket");
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(
        Server::builder()
            .add_service(IdentityServer::new(TestIdentity))
            .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
                // A dropped sender stops the server too.
                let _ = stop_rx.await;
            }),
    );

    let mut client = IdentityClient::new(connect_unix(socket).await.expect("connect"));

    let info = client
        .get_plugin_info(GetPluginInfoRequest {})
        .await
        .expect("GetPluginInfo")
        .into_inner();
    assert_eq!(info.name, NAME);
    assert_eq!(info.vendor_version, VERSION);
    assert!(info.manifest.is_empty());

    let probe = client
        .probe(ProbeRequest {})
        .await
        .expect("Probe")
        .into_inner();
    assert_eq!(probe.ready, Some(true));

    let status = client
        .get_plugin_capabilities(GetPluginCapabilitiesRequest {})
        .await
        .expect_err("GetPluginCapabilities is not implemented");
    assert_eq!(status.code(), Code::Unimplemented);

    stop_tx.send(()).expect("server still running");
    server
        .await
        .expect("server task")
        .expect("server stops cleanly");
}

fn block_capability(mode: Mode) -> VolumeCapability {
    VolumeCapability {
        access_type: Some(AccessType::Block(BlockVolume {})),
        access_mode: Some(AccessMode { mode: mode as i32 }),
    }
}

#[test]
fn create_volume_request_round_trips() {
    let request = CreateVolumeRequest {
        name: "pvc-0123".to_owned(),
        capacity_range: Some(CapacityRange {
            required_bytes: 10 << 30,
            limit_bytes: 20 << 30,
        }),
        volume_capabilities: vec![block_capability(Mode::SingleNodeWriter)],
        parameters: HashMap::from([("blockSize".to_owned(), "4096".to_owned())]),
        secrets: HashMap::from([("key".to_owned(), "secret".to_owned())]),
        volume_content_source: Some(VolumeContentSource {
            r#type: Some(ContentType::Snapshot(SnapshotSource {
                snapshot_id: "snap-1".to_owned(),
            })),
        }),
        accessibility_requirements: Some(TopologyRequirement {
            requisite: vec![Topology {
                segments: HashMap::from([("zone".to_owned(), "z1".to_owned())]),
            }],
            preferred: vec![],
        }),
        mutable_parameters: HashMap::new(),
    };

    let bytes = request.encode_to_vec();
    let decoded = CreateVolumeRequest::decode(bytes.as_slice()).expect("decode");
    assert_eq!(decoded, request);

    let capability = &decoded.volume_capabilities[0];
    assert!(matches!(capability.access_type, Some(AccessType::Block(_))));
    assert_eq!(
        capability.access_mode.map(|m| m.mode()),
        Some(Mode::SingleNodeWriter)
    );
}

/// Field numbers and enum values from the CSI spec, checked on the wire.
#[test]
fn wire_format_matches_the_spec() {
    // CreateVolumeRequest: name = 1, capacity_range = 2; CapacityRange: required_bytes = 1.
    let request = CreateVolumeRequest {
        name: "v".to_owned(),
        capacity_range: Some(CapacityRange {
            required_bytes: 4096,
            limit_bytes: 0,
        }),
        ..Default::default()
    };
    let wire = [0x0a, 0x01, b'v', 0x12, 0x03, 0x08, 0x80, 0x20];
    assert_eq!(request.encode_to_vec(), wire);

    // CreateVolumeRequest: volume_capabilities = 3, volume_content_source = 6.
    // VolumeCapability: block = 1, access_mode = 3; AccessMode: mode = 1;
    // SINGLE_NODE_SINGLE_WRITER = 6. VolumeContentSource: snapshot = 1; snapshot_id = 1.
    let wire = [
        0x1a, 0x06, // volume_capabilities: 6 bytes
        0x0a, 0x00, // block: empty
        0x1a, 0x02, 0x08, 0x06, // access_mode { mode: 6 }
        0x32, 0x05, // volume_content_source: 5 bytes
        0x0a, 0x03, 0x0a, 0x01, b's', // snapshot { snapshot_id: "s" }
    ];
    let decoded = CreateVolumeRequest::decode(wire.as_slice()).expect("decode");
    assert_eq!(
        decoded,
        CreateVolumeRequest {
            volume_capabilities: vec![block_capability(Mode::SingleNodeSingleWriter)],
            volume_content_source: Some(VolumeContentSource {
                r#type: Some(ContentType::Snapshot(SnapshotSource {
                    snapshot_id: "s".to_owned(),
                })),
            }),
            ..Default::default()
        }
    );
    // SINGLE_NODE_MULTI_WRITER = 7.
    assert_eq!(Mode::SingleNodeMultiWriter as i32, 7);

    // ProbeResponse: ready = 1, a google.protobuf.BoolValue (value = 1).
    assert_eq!(
        ProbeResponse { ready: Some(true) }.encode_to_vec(),
        [0x0a, 0x02, 0x08, 0x01]
    );

    // ControllerServiceCapability: rpc = 1; RPC: type = 1; EXPAND_VOLUME = 9.
    let capability = ControllerServiceCapability {
        r#type: Some(controller_service_capability::Type::Rpc(
            controller_service_capability::Rpc {
                r#type: controller_service_capability::rpc::Type::ExpandVolume as i32,
            },
        )),
    };
    assert_eq!(capability.encode_to_vec(), [0x0a, 0x02, 0x08, 0x09]);

    // NodePublishVolumeRequest: target_path = 4, readonly = 6.
    let request = NodePublishVolumeRequest {
        target_path: "t".to_owned(),
        readonly: true,
        ..Default::default()
    };
    assert_eq!(request.encode_to_vec(), [0x22, 0x01, b't', 0x30, 0x01]);

    // Snapshot: snapshot_id = 2, creation_time = 4 (google.protobuf.Timestamp, seconds = 1),
    // ready_to_use = 5.
    let snapshot = Snapshot {
        snapshot_id: "s".to_owned(),
        creation_time: Some(prost_types::Timestamp {
            seconds: 1,
            nanos: 0,
        }),
        ready_to_use: true,
        ..Default::default()
    };
    assert_eq!(
        snapshot.encode_to_vec(),
        [0x12, 0x01, b's', 0x22, 0x02, 0x08, 0x01, 0x28, 0x01]
    );
}
