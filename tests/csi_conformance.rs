//! The CSI driver driven over its unix sockets with gRPC clients, as the sidecars and the
//! kubelet drive it: the checks csi-sanity makes for every capability the driver
//! advertises (the mapping from csi-sanity's test names to these tests is in
//! `docs/kubernetes.md`), plus what glidefs adds: data written on one node is what another
//! node reads after the volume moved, a force detach fences the failed node in the store,
//! snapshots and clones carry the data of their moment, a restarted node plugin answers for
//! the volumes it staged. No kernel: the node daemons have fake devices and the node
//! plugins a mounter that records (`csi_support`); data goes through the daemons' volumes.

mod csi_support;

use csi_support::api_support::daemon::Daemon as TestDaemon;
use csi_support::{capability, create_req, in_store, writer, Cluster, Mounted, MIB};
use glidefs_csi::controller::TAKEOVER;
use glidefs_csi::pb;
use glidefs_csi::pb::volume_capability::access_mode::Mode;
use tonic::Code;

const INVALID: Code = Code::InvalidArgument;

fn code<T: std::fmt::Debug>(r: Result<tonic::Response<T>, tonic::Status>) -> Code {
    match r {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(s) => s.code(),
    }
}

/// Asserts that `call` fails with `want`.
async fn refuses<T: std::fmt::Debug>(
    call: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    want: Code,
) {
    assert_eq!(code(call.await), want);
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed) ^ (i >> 11) as u8)
        .collect()
}

async fn read(d: &TestDaemon, volume: &str, len: usize) -> Vec<u8> {
    let mut buf = vec![0; len];
    d.volume(volume).read(0, &mut buf).await.unwrap();
    buf
}

async fn create(c: &Cluster, name: &str, bytes: i64, fs: Option<&str>) -> pb::Volume {
    c.controller()
        .await
        .create_volume(create_req(name, bytes, fs))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap()
}

async fn publish(
    c: &Cluster,
    volume: &str,
    node: usize,
) -> std::collections::HashMap<String, String> {
    c.controller()
        .await
        .controller_publish_volume(pb::ControllerPublishVolumeRequest {
            volume_id: volume.into(),
            node_id: c.nodes[node].name.clone(),
            volume_capability: Some(writer(None)),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .publish_context
}

async fn unpublish(c: &Cluster, volume: &str, node: usize) {
    c.controller()
        .await
        .controller_unpublish_volume(pb::ControllerUnpublishVolumeRequest {
            volume_id: volume.into(),
            node_id: c.nodes[node].name.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
}

fn stage_req(
    c: &Cluster,
    volume: &str,
    node: usize,
    fs: Option<&str>,
    ctx: &std::collections::HashMap<String, String>,
) -> pb::NodeStageVolumeRequest {
    pb::NodeStageVolumeRequest {
        volume_id: volume.into(),
        publish_context: ctx.clone(),
        staging_target_path: c.path(&format!("kubelet-{node}/staging/{volume}")),
        volume_capability: Some(writer(fs)),
        ..Default::default()
    }
}

fn publish_req(
    c: &Cluster,
    volume: &str,
    node: usize,
    pod: &str,
    fs: Option<&str>,
) -> pb::NodePublishVolumeRequest {
    pb::NodePublishVolumeRequest {
        volume_id: volume.into(),
        staging_target_path: c.path(&format!("kubelet-{node}/staging/{volume}")),
        target_path: c.path(&format!("kubelet-{node}/pods/{pod}/{volume}")),
        volume_capability: Some(writer(fs)),
        ..Default::default()
    }
}

async fn stage_and_publish(c: &Cluster, volume: &str, node: usize, fs: Option<&str>) {
    let ctx = publish(c, volume, node).await;
    let mut n = c.node(node).await;
    n.node_stage_volume(stage_req(c, volume, node, fs, &ctx))
        .await
        .unwrap();
    n.node_publish_volume(publish_req(c, volume, node, "pod1", fs))
        .await
        .unwrap();
}

async fn unpublish_and_unstage(c: &Cluster, volume: &str, node: usize) {
    let mut n = c.node(node).await;
    let p = publish_req(c, volume, node, "pod1", None);
    n.node_unpublish_volume(pb::NodeUnpublishVolumeRequest {
        volume_id: volume.into(),
        target_path: p.target_path,
    })
    .await
    .unwrap();
    n.node_unstage_volume(pb::NodeUnstageVolumeRequest {
        volume_id: volume.into(),
        staging_target_path: p.staging_target_path,
    })
    .await
    .unwrap();
    unpublish(c, volume, node).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identity_answers_its_name_capabilities_and_readiness() {
    let c = Cluster::start().await;
    for (socket, controller) in [(&c.controller_socket, true), (&c.nodes[0].socket, false)] {
        let mut id = c.identity(socket).await;
        let info = id
            .get_plugin_info(pb::GetPluginInfoRequest {})
            .await
            .unwrap()
            .into_inner();
        assert_eq!(info.name, glidefs_csi::DRIVER_NAME);
        assert!(!info.vendor_version.is_empty());
        let caps = id
            .get_plugin_capabilities(pb::GetPluginCapabilitiesRequest {})
            .await
            .unwrap()
            .into_inner()
            .capabilities;
        let has_controller = caps.iter().any(|c| {
            matches!(&c.r#type, Some(pb::plugin_capability::Type::Service(s))
                if s.r#type == pb::plugin_capability::service::Type::ControllerService as i32)
        });
        assert_eq!(has_controller, controller, "{socket:?}");
        let ready = id
            .probe(pb::ProbeRequest {})
            .await
            .unwrap()
            .into_inner()
            .ready;
        assert_eq!(ready, Some(true));
    }
    // Not ready while its daemon does not answer.
    let mut c = c;
    c.nodes[0].daemon.stop().await;
    let mut id = c.identity(&c.nodes[0].socket).await;
    let ready = id
        .probe(pb::ProbeRequest {})
        .await
        .unwrap()
        .into_inner()
        .ready;
    assert_eq!(ready, Some(false));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_and_delete_check_input_and_are_idempotent_by_name() {
    let c = Cluster::start().await;
    let mut ctl = c.controller().await;
    let caps = ctl
        .controller_get_capabilities(pb::ControllerGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner()
        .capabilities;
    assert_eq!(caps.len(), glidefs_csi::caps::controller().len());

    // Bad input.
    refuses(ctl.create_volume(create_req("", MIB, None)), INVALID).await;
    let mut no_caps = create_req("v1", MIB, None);
    no_caps.volume_capabilities.clear();
    refuses(ctl.create_volume(no_caps), INVALID).await;
    let mut multi = create_req("v1", MIB, None);
    multi.volume_capabilities = vec![capability(None, Mode::MultiNodeMultiWriter)];
    refuses(ctl.create_volume(multi), INVALID).await;
    let mut bad_param = create_req("v1", MIB, None);
    bad_param.parameters.insert("blockSize".into(), "3K".into());
    refuses(ctl.create_volume(bad_param), INVALID).await;
    let mut unknown = create_req("v1", MIB, None);
    unknown.parameters.insert("replicas".into(), "3".into());
    refuses(ctl.create_volume(unknown), INVALID).await;
    let mut over = create_req("v1", 100_000, None);
    over.capacity_range.as_mut().unwrap().limit_bytes = 100_000;
    refuses(ctl.create_volume(over), Code::OutOfRange).await;
    assert!(!in_store(&c, "v1").await, "a refused create left nothing");

    // No capacity: 1 GiB. A capacity: rounded up to the block size.
    let mut none = create_req("v-default", 0, None);
    none.capacity_range = None;
    let v = ctl
        .create_volume(none)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(v.capacity_bytes, 1 << 30);
    let v = create(&c, "v1", 3 * MIB + 1, None).await;
    assert_eq!(v.volume_id, "v1");
    assert_eq!(v.capacity_bytes, 3 * MIB + 64 * 1024);
    assert_eq!(
        v.volume_context.get("blockSize").map(String::as_str),
        Some("65536")
    );
    assert!(in_store(&c, "v1").await);

    // The same again: the same volume; another capacity or parameters: ALREADY_EXISTS.
    let again = create(&c, "v1", 3 * MIB + 1, None).await;
    assert_eq!(again, v);
    refuses(
        ctl.create_volume(create_req("v1", 8 * MIB, None)),
        Code::AlreadyExists,
    )
    .await;
    let mut other = create_req("v1", 3 * MIB + 1, None);
    other.parameters.insert("blockSize".into(), "4K".into());
    refuses(ctl.create_volume(other), Code::AlreadyExists).await;

    // The longest name there is.
    let long = "n".repeat(128);
    assert_eq!(create(&c, &long, MIB, None).await.volume_id, long);

    // Delete: bad input, unknown ids, then for real (twice: idempotent).
    let del = |id: &str| pb::DeleteVolumeRequest {
        volume_id: id.into(),
        ..Default::default()
    };
    refuses(ctl.delete_volume(del("")), INVALID).await;
    ctl.delete_volume(del("never-made")).await.unwrap();
    for id in ["v1", "v1", long.as_str(), "v-default"] {
        ctl.delete_volume(del(id)).await.unwrap();
        assert!(!in_store(&c, id).await, "{id} is purged from the store");
    }
    assert!(c.records.volume("v1").await.unwrap().is_none());
    // The name can be used again, with other properties.
    assert_eq!(
        create(&c, "v1", 8 * MIB, None).await.capacity_bytes,
        8 * MIB
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validate_volume_capabilities_confirms_only_what_is_served() {
    let c = Cluster::start().await;
    let mut ctl = c.controller().await;
    create(&c, "v", MIB, None).await;
    let req = |id: &str, caps: Vec<pb::VolumeCapability>| pb::ValidateVolumeCapabilitiesRequest {
        volume_id: id.into(),
        volume_capabilities: caps,
        ..Default::default()
    };
    refuses(
        ctl.validate_volume_capabilities(req("", vec![writer(None)])),
        INVALID,
    )
    .await;
    refuses(ctl.validate_volume_capabilities(req("v", vec![])), INVALID).await;
    refuses(
        ctl.validate_volume_capabilities(req("nope", vec![writer(None)])),
        Code::NotFound,
    )
    .await;
    let ok = ctl
        .validate_volume_capabilities(req(
            "v",
            vec![
                writer(None),
                writer(Some("xfs")),
                capability(Some(""), Mode::SingleNodeReaderOnly),
            ],
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ok.confirmed.unwrap().volume_capabilities.len(), 3);
    let refused = ctl
        .validate_volume_capabilities(req(
            "v",
            vec![writer(None), capability(None, Mode::MultiNodeReaderOnly)],
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(refused.confirmed.is_none());
    assert!(
        refused.message.contains("MULTI_NODE_READER_ONLY"),
        "{}",
        refused.message
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_is_to_one_known_node_at_a_time() {
    let c = Cluster::start().await;
    let mut ctl = c.controller().await;
    create(&c, "v", MIB, None).await;
    let req = |vol: &str, node: &str, cap: Option<pb::VolumeCapability>| {
        pb::ControllerPublishVolumeRequest {
            volume_id: vol.into(),
            node_id: node.into(),
            volume_capability: cap,
            ..Default::default()
        }
    };
    refuses(
        ctl.controller_publish_volume(req("", "node-a", Some(writer(None)))),
        INVALID,
    )
    .await;
    refuses(
        ctl.controller_publish_volume(req("v", "", Some(writer(None)))),
        INVALID,
    )
    .await;
    refuses(
        ctl.controller_publish_volume(req("v", "node-a", None)),
        INVALID,
    )
    .await;
    refuses(
        ctl.controller_publish_volume(req("nope", "node-a", Some(writer(None)))),
        Code::NotFound,
    )
    .await;
    refuses(
        ctl.controller_publish_volume(req("v", "node-z", Some(writer(None)))),
        Code::NotFound,
    )
    .await;

    let ctx = ctl
        .controller_publish_volume(req("v", "node-a", Some(writer(None))))
        .await
        .unwrap()
        .into_inner()
        .publish_context;
    assert_eq!(ctx.get(TAKEOVER).map(String::as_str), Some("true"));
    // Again to the same node: the same answer; to another: refused while the first holds it.
    ctl.controller_publish_volume(req("v", "node-a", Some(writer(None))))
        .await
        .unwrap();
    refuses(
        ctl.controller_publish_volume(req("v", "node-b", Some(writer(None)))),
        Code::FailedPrecondition,
    )
    .await;
    let mut ro = req("v", "node-a", Some(writer(None)));
    ro.readonly = true;
    refuses(ctl.controller_publish_volume(ro), Code::AlreadyExists).await;
    // A volume published somewhere is not deleted.
    refuses(
        ctl.delete_volume(pb::DeleteVolumeRequest {
            volume_id: "v".into(),
            ..Default::default()
        }),
        Code::FailedPrecondition,
    )
    .await;

    let unreq = |vol: &str, node: &str| pb::ControllerUnpublishVolumeRequest {
        volume_id: vol.into(),
        node_id: node.into(),
        ..Default::default()
    };
    refuses(
        ctl.controller_unpublish_volume(unreq("", "node-a")),
        INVALID,
    )
    .await;
    // Unpublish from a node that does not have it: nothing changes.
    ctl.controller_unpublish_volume(unreq("v", "node-b"))
        .await
        .unwrap();
    assert_eq!(
        c.records
            .attachment("v")
            .await
            .unwrap()
            .unwrap()
            .node
            .as_deref(),
        Some("node-a")
    );
    ctl.controller_unpublish_volume(unreq("v", "node-a"))
        .await
        .unwrap();
    ctl.controller_unpublish_volume(unreq("v", "node-a"))
        .await
        .unwrap();
    ctl.controller_unpublish_volume(unreq("gone", "node-a"))
        .await
        .unwrap();
    ctl.controller_publish_volume(req("v", "node-b", Some(writer(None))))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_calls_check_their_input() {
    let c = Cluster::start().await;
    let mut n = c.node(0).await;
    let caps = n
        .node_get_capabilities(pb::NodeGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(caps.capabilities.len(), glidefs_csi::caps::node().len());
    let info = n
        .node_get_info(pb::NodeGetInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.node_id, "node-a");
    let topo = info.accessible_topology.unwrap().segments;
    assert_eq!(
        topo.get(glidefs_csi::node::TOPOLOGY_NODE)
            .map(String::as_str),
        Some("node-a")
    );

    create(&c, "v", MIB, None).await;
    let none = std::collections::HashMap::new();
    let stage = stage_req(&c, "v", 0, None, &none);
    let mut s = stage.clone();
    s.volume_id.clear();
    refuses(n.node_stage_volume(s), INVALID).await;
    let mut s = stage.clone();
    s.staging_target_path.clear();
    refuses(n.node_stage_volume(s), INVALID).await;
    let mut s = stage.clone();
    s.volume_capability = None;
    refuses(n.node_stage_volume(s), INVALID).await;
    let mut s = stage.clone();
    s.volume_id = "nope".into();
    refuses(n.node_stage_volume(s), Code::NotFound).await;

    let unstage = |v: &str, p: &str| pb::NodeUnstageVolumeRequest {
        volume_id: v.into(),
        staging_target_path: p.into(),
    };
    refuses(n.node_unstage_volume(unstage("", "/x")), INVALID).await;
    refuses(n.node_unstage_volume(unstage("v", "")), INVALID).await;

    let publish = publish_req(&c, "v", 0, "pod1", None);
    for strip in 0..3 {
        let mut p = publish.clone();
        match strip {
            0 => p.volume_id.clear(),
            1 => p.target_path.clear(),
            _ => p.volume_capability = None,
        }
        assert_eq!(
            code(n.node_publish_volume(p).await),
            Code::InvalidArgument,
            "case {strip}"
        );
    }
    // Published before it is staged: refused.
    refuses(
        n.node_publish_volume(publish.clone()),
        Code::FailedPrecondition,
    )
    .await;

    let unpub = |v: &str, t: &str| pb::NodeUnpublishVolumeRequest {
        volume_id: v.into(),
        target_path: t.into(),
    };
    refuses(n.node_unpublish_volume(unpub("", "/x")), INVALID).await;
    refuses(n.node_unpublish_volume(unpub("v", "")), INVALID).await;

    let stats = |v: &str, p: &str| pb::NodeGetVolumeStatsRequest {
        volume_id: v.into(),
        volume_path: p.into(),
        ..Default::default()
    };
    refuses(n.node_get_volume_stats(stats("", "/x")), INVALID).await;
    refuses(n.node_get_volume_stats(stats("v", "")), INVALID).await;
    refuses(
        n.node_get_volume_stats(stats("nope", "/tmp")),
        Code::NotFound,
    )
    .await;

    let expand = |v: &str, p: &str| pb::NodeExpandVolumeRequest {
        volume_id: v.into(),
        volume_path: p.into(),
        ..Default::default()
    };
    refuses(n.node_expand_volume(expand("", "/x")), INVALID).await;
    refuses(n.node_expand_volume(expand("v", "")), INVALID).await;
    refuses(n.node_expand_volume(expand("nope", "/tmp")), Code::NotFound).await;

    // Out of order: unpublish and unstage of what was never published or staged succeed.
    n.node_unpublish_volume(unpub("v", &publish.target_path))
        .await
        .unwrap();
    n.node_unstage_volume(unstage("v", &publish.staging_target_path))
        .await
        .unwrap();
    // Staged, a path that does not exist has no stats.
    n.node_stage_volume(stage).await.unwrap();
    refuses(
        n.node_get_volume_stats(stats("v", &c.path("no/such/path"))),
        Code::NotFound,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_volume_moves_between_nodes_with_its_data() {
    let c = Cluster::start().await;
    let v = create(&c, "blk", 4 * MIB, None).await;
    stage_and_publish(&c, "blk", 0, None).await;
    let a = &c.nodes[0];
    // Staging a block volume mounts nothing; publishing binds its device file.
    let target = publish_req(&c, "blk", 0, "pod1", None).target_path;
    let mounts = a.mounter.mounts.lock().clone();
    assert_eq!(mounts.len(), 1, "{mounts:?}");
    let m = mounts.get(std::path::Path::new(&target)).unwrap();
    let device = a
        .daemon
        .client
        .show("blk")
        .await
        .unwrap()
        .device
        .path
        .unwrap();
    assert_eq!(
        m,
        &Mounted {
            source: device,
            readonly: false,
            fs: None
        }
    );
    assert!(
        std::path::Path::new(&target).is_file(),
        "a block target is a file"
    );

    // Repeated calls change nothing.
    let ctx = publish(&c, "blk", 0).await;
    let mut n = c.node(0).await;
    n.node_stage_volume(stage_req(&c, "blk", 0, None, &ctx))
        .await
        .unwrap();
    n.node_publish_volume(publish_req(&c, "blk", 0, "pod1", None))
        .await
        .unwrap();
    assert_eq!(a.mounter.mounts.lock().len(), 1);
    // Staged elsewhere or as something else: refused.
    let mut other = stage_req(&c, "blk", 0, Some("ext4"), &ctx);
    refuses(n.node_stage_volume(other.clone()), Code::AlreadyExists).await;
    other.volume_capability = Some(writer(None));
    other.staging_target_path = c.path("elsewhere");
    refuses(n.node_stage_volume(other), Code::AlreadyExists).await;

    // Stats of a block volume: its size.
    let st = n
        .node_get_volume_stats(pb::NodeGetVolumeStatsRequest {
            volume_id: "blk".into(),
            volume_path: target.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(st.usage[0].total, v.capacity_bytes);
    assert!(!st.volume_condition.unwrap().abnormal);

    // The workload writes; the volume moves to node B the orderly way.
    let data = pattern(7, 2 * MIB as usize);
    a.daemon.volume("blk").write(0, &data).await.unwrap();
    unpublish_and_unstage(&c, "blk", 0).await;
    assert!(a.mounter.mounts.lock().is_empty());
    assert!(
        !std::path::Path::new(&target).exists(),
        "unpublish removes the target"
    );
    assert!(
        a.daemon.client.show("blk").await.is_err(),
        "unstage closed it on A"
    );
    stage_and_publish(&c, "blk", 1, None).await;
    assert_eq!(read(&c.nodes[1].daemon, "blk", data.len()).await, data);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filesystem_volume_is_made_mounted_bound_and_grown() {
    let c = Cluster::start().await;
    // A mount capability that names no filesystem (csi-sanity's default): ext4.
    create(&c, "fs", 4 * MIB, Some("")).await;
    stage_and_publish(&c, "fs", 0, Some("")).await;
    let a = &c.nodes[0];
    let p = publish_req(&c, "fs", 0, "pod1", Some(""));
    let device = a
        .daemon
        .client
        .show("fs")
        .await
        .unwrap()
        .device
        .path
        .unwrap();
    {
        let mounts = a.mounter.mounts.lock();
        let staged = mounts
            .get(std::path::Path::new(&p.staging_target_path))
            .unwrap();
        assert_eq!(
            staged,
            &Mounted {
                source: device.clone(),
                readonly: false,
                fs: Some("ext4".into())
            }
        );
        let bound = mounts.get(std::path::Path::new(&p.target_path)).unwrap();
        assert_eq!(bound.source, p.staging_target_path);
        assert_eq!(
            a.mounter.formatted.lock().get(&device).map(String::as_str),
            Some("ext4")
        );
    }
    // A second pod, read-only; but not for a SINGLE_NODE_SINGLE_WRITER capability, which
    // allows one publication at a time (csi-sanity's "single node multi writer" check).
    let mut n = c.node(0).await;
    let mut single = publish_req(&c, "fs", 0, "pod3", Some("ext4"));
    single.volume_capability = Some(capability(Some("ext4"), Mode::SingleNodeSingleWriter));
    refuses(n.node_publish_volume(single), Code::FailedPrecondition).await;
    let mut ro = publish_req(&c, "fs", 0, "pod2", Some("ext4"));
    ro.readonly = true;
    n.node_publish_volume(ro.clone()).await.unwrap();
    assert!(
        a.mounter
            .mounts
            .lock()
            .get(std::path::Path::new(&ro.target_path))
            .unwrap()
            .readonly
    );
    let st = n
        .node_get_volume_stats(pb::NodeGetVolumeStatsRequest {
            volume_id: "fs".into(),
            volume_path: p.target_path.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(st.usage.len(), 2, "bytes and inodes");

    // Expand while in use: the holding node's daemon grows the volume and its device, the
    // node grows the filesystem.
    let mut ctl = c.controller().await;
    let range = pb::CapacityRange {
        required_bytes: 10 * MIB,
        limit_bytes: 0,
    };
    refuses(
        ctl.controller_expand_volume(pb::ControllerExpandVolumeRequest {
            volume_id: "fs".into(),
            ..Default::default()
        }),
        INVALID,
    )
    .await;
    refuses(
        ctl.controller_expand_volume(pb::ControllerExpandVolumeRequest {
            capacity_range: Some(range),
            ..Default::default()
        }),
        INVALID,
    )
    .await;
    let grown = ctl
        .controller_expand_volume(pb::ControllerExpandVolumeRequest {
            volume_id: "fs".into(),
            capacity_range: Some(range),
            volume_capability: Some(writer(Some("ext4"))),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(grown.capacity_bytes, 10 * MIB);
    assert!(grown.node_expansion_required);
    assert_eq!(
        a.daemon.client.show("fs").await.unwrap().size,
        10 << 20,
        "grown on node A's daemon"
    );
    let done = n
        .node_expand_volume(pb::NodeExpandVolumeRequest {
            volume_id: "fs".into(),
            volume_path: p.target_path.clone(),
            capacity_range: Some(range),
            staging_target_path: p.staging_target_path.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(done.capacity_bytes, 10 * MIB);
    assert_eq!(a.mounter.grown.lock().as_slice(), [device]);
    // A smaller "expand" keeps the size.
    let same = ctl
        .controller_expand_volume(pb::ControllerExpandVolumeRequest {
            volume_id: "fs".into(),
            capacity_range: Some(pb::CapacityRange {
                required_bytes: MIB,
                limit_bytes: 0,
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(same.capacity_bytes, 10 * MIB);

    n.node_unpublish_volume(pb::NodeUnpublishVolumeRequest {
        volume_id: "fs".into(),
        target_path: ro.target_path,
    })
    .await
    .unwrap();
    unpublish_and_unstage(&c, "fs", 0).await;
    assert!(
        !std::path::Path::new(&p.target_path).exists(),
        "unpublish removes a filesystem target (a directory) too"
    );
    // Expanded while no node holds it: the controller's daemon does it.
    let grown = ctl
        .controller_expand_volume(pb::ControllerExpandVolumeRequest {
            volume_id: "fs".into(),
            capacity_range: Some(pb::CapacityRange {
                required_bytes: 16 * MIB,
                limit_bytes: 0,
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(grown.capacity_bytes, 16 * MIB);
    stage_and_publish(&c, "fs", 1, Some("ext4")).await;
    assert_eq!(
        c.nodes[1].daemon.client.show("fs").await.unwrap().size,
        16 << 20
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_force_detach_moves_the_volume_and_fences_the_failed_node() {
    let c = Cluster::start().await;
    create(&c, "db", 4 * MIB, None).await;
    stage_and_publish(&c, "db", 0, None).await;
    let (a, b) = (&c.nodes[0], &c.nodes[1]);
    let flushed = pattern(1, MIB as usize);
    a.daemon.volume("db").write(0, &flushed).await.unwrap();
    a.daemon.client.flush("db").await.unwrap();
    let later = pattern(2, MIB as usize);
    a.daemon
        .volume("db")
        .write(MIB as u64, &later)
        .await
        .unwrap();

    // Node A stops answering; a second node is refused until A is force-detached.
    let mut ctl = c.controller().await;
    let to_b = pb::ControllerPublishVolumeRequest {
        volume_id: "db".into(),
        node_id: "node-b".into(),
        volume_capability: Some(writer(None)),
        ..Default::default()
    };
    refuses(
        ctl.controller_publish_volume(to_b.clone()),
        Code::FailedPrecondition,
    )
    .await;
    unpublish(&c, "db", 0).await; // the attach-detach controller's force detach
    let ctx = ctl
        .controller_publish_volume(to_b)
        .await
        .unwrap()
        .into_inner()
        .publish_context;
    let mut nb = c.node(1).await;
    // Without the takeover the publish context grants, B cannot open what A still owns.
    let mut plain = stage_req(&c, "db", 1, None, &Default::default());
    refuses(
        nb.node_stage_volume(plain.clone()),
        Code::FailedPrecondition,
    )
    .await;
    plain.publish_context = ctx;
    nb.node_stage_volume(plain).await.unwrap();

    // B has what A flushed to the store; what A had only on its disk is lost (durability
    // `local`: the write was never FLUSHed to the store).
    let got = read(&b.daemon, "db", 2 * MIB as usize).await;
    assert_eq!(&got[..MIB as usize], &flushed[..]);
    assert_eq!(&got[MIB as usize..], &vec![0; MIB as usize][..]);
    // A is fenced: its flush fails, and it never publishes again.
    let err = a.daemon.client.flush("db").await.unwrap_err().to_string();
    assert!(err.contains("fenced"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_and_clones_carry_the_data_of_their_moment() {
    let c = Cluster::start().await;
    let mut ctl = c.controller().await;
    create(&c, "src", 4 * MIB, None).await;
    create(&c, "other", 4 * MIB, None).await;
    stage_and_publish(&c, "src", 0, None).await;
    let a = &c.nodes[0];
    let first = pattern(3, 2 * MIB as usize);
    a.daemon.volume("src").write(0, &first).await.unwrap();

    let snap = |name: &str, src: &str| pb::CreateSnapshotRequest {
        source_volume_id: src.into(),
        name: name.into(),
        ..Default::default()
    };
    refuses(ctl.create_snapshot(snap("", "src")), INVALID).await;
    refuses(ctl.create_snapshot(snap("s1", "")), INVALID).await;
    refuses(ctl.create_snapshot(snap("s1", "nope")), Code::NotFound).await;
    // Taken on node A's daemon (it holds the volume), of everything written before the call.
    let s1 = ctl
        .create_snapshot(snap("s1", "src"))
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    assert_eq!(s1.snapshot_id, "src@s1");
    assert!(s1.creation_time.is_some_and(|t| t.seconds > 0), "{s1:?}");
    assert_eq!(s1.source_volume_id, "src");
    assert!(s1.ready_to_use);
    assert_eq!(s1.size_bytes, 4 * MIB);
    let again = ctl
        .create_snapshot(snap("s1", "src"))
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    assert_eq!(again, s1);
    refuses(
        ctl.create_snapshot(snap("s1", "other")),
        Code::AlreadyExists,
    )
    .await;
    let long = "s".repeat(128);
    ctl.create_snapshot(snap(&long, "other")).await.unwrap();
    let second = pattern(4, 2 * MIB as usize);
    a.daemon.volume("src").write(0, &second).await.unwrap();
    ctl.create_snapshot(snap("s2", "src")).await.unwrap();

    // Listing: all, by id, by source, paged, bad tokens.
    let lister = ctl.clone();
    let list = |r: pb::ListSnapshotsRequest| {
        let mut ctl = lister.clone();
        async move { ctl.list_snapshots(r).await }
    };
    let all = list(Default::default()).await.unwrap().into_inner().entries;
    assert_eq!(all.len(), 3);
    let by_id = list(pb::ListSnapshotsRequest {
        snapshot_id: "src@s1".into(),
        ..Default::default()
    })
    .await
    .unwrap()
    .into_inner()
    .entries;
    assert_eq!(by_id.len(), 1);
    assert_eq!(by_id[0].snapshot.as_ref().unwrap(), &s1);
    for id in ["src@nope", "nothing", "other@s1"] {
        let none = list(pb::ListSnapshotsRequest {
            snapshot_id: id.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
        assert!(none.entries.is_empty(), "{id}");
    }
    let of_src = list(pb::ListSnapshotsRequest {
        source_volume_id: "src".into(),
        ..Default::default()
    })
    .await
    .unwrap()
    .into_inner()
    .entries;
    assert_eq!(of_src.len(), 2);
    let none = list(pb::ListSnapshotsRequest {
        source_volume_id: "nope".into(),
        ..Default::default()
    })
    .await
    .unwrap()
    .into_inner();
    assert!(none.entries.is_empty());
    refuses(
        list(pb::ListSnapshotsRequest {
            starting_token: "x".into(),
            ..Default::default()
        }),
        Code::Aborted,
    )
    .await;
    refuses(
        list(pb::ListSnapshotsRequest {
            starting_token: "9".into(),
            ..Default::default()
        }),
        Code::Aborted,
    )
    .await;
    let page1 = list(pb::ListSnapshotsRequest {
        max_entries: 2,
        ..Default::default()
    })
    .await
    .unwrap()
    .into_inner();
    assert_eq!(page1.entries.len(), 2);
    let page2 = list(pb::ListSnapshotsRequest {
        max_entries: 2,
        starting_token: page1.next_token.clone(),
        ..Default::default()
    })
    .await
    .unwrap()
    .into_inner();
    assert_eq!(page2.entries.len(), 1);
    assert!(page2.next_token.is_empty());

    // A volume from a snapshot (larger than it), and from a volume; missing sources.
    let from = |name: &str, t: pb::volume_content_source::Type, bytes: i64| {
        let mut r = create_req(name, bytes, None);
        r.volume_content_source = Some(pb::VolumeContentSource { r#type: Some(t) });
        r
    };
    use pb::volume_content_source::{SnapshotSource, Type, VolumeSource};
    let snap_src = |id: &str| {
        Type::Snapshot(SnapshotSource {
            snapshot_id: id.into(),
        })
    };
    let vol_src = |id: &str| {
        Type::Volume(VolumeSource {
            volume_id: id.into(),
        })
    };
    refuses(
        ctl.create_volume(from("c-missing", snap_src("src@nope"), MIB)),
        Code::NotFound,
    )
    .await;
    refuses(
        ctl.create_volume(from("c-missing2", vol_src("nope"), MIB)),
        Code::NotFound,
    )
    .await;
    let c1 = ctl
        .create_volume(from("c1", snap_src("src@s1"), 8 * MIB))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(c1.capacity_bytes, 8 * MIB);
    assert_eq!(
        c1.content_source,
        Some(pb::VolumeContentSource {
            r#type: Some(snap_src("src@s1"))
        }),
        "the source is echoed"
    );
    let c2 = ctl
        .create_volume(from("c2", vol_src("src"), 4 * MIB))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(c2.capacity_bytes, 4 * MIB);
    let third = pattern(5, MIB as usize);
    a.daemon.volume("src").write(0, &third).await.unwrap();
    stage_and_publish(&c, "c1", 1, None).await;
    stage_and_publish(&c, "c2", 1, None).await;
    let b = &c.nodes[1];
    assert_eq!(read(&b.daemon, "c1", first.len()).await, first, "c1 is s1");
    assert_eq!(
        read(&b.daemon, "c2", second.len()).await,
        second,
        "c2 is src when cloned"
    );

    // Deletes: bad input, ids that are not ours, a snapshot a clone reads from.
    let del = |id: &str| pb::DeleteSnapshotRequest {
        snapshot_id: id.into(),
        ..Default::default()
    };
    refuses(ctl.delete_snapshot(del("")), INVALID).await;
    ctl.delete_snapshot(del("not-an-id")).await.unwrap();
    ctl.delete_snapshot(del("src@never")).await.unwrap();
    refuses(ctl.delete_snapshot(del("src@s1")), Code::FailedPrecondition).await;
    ctl.delete_snapshot(del("src@s2")).await.unwrap();
    ctl.delete_snapshot(del("src@s2")).await.unwrap();
    let left = list(Default::default()).await.unwrap().into_inner().entries;
    assert_eq!(left.len(), 2);

    // The clones go; the source is deleted while s1 is left: kept until s1 goes.
    for clone in ["c1", "c2"] {
        unpublish_and_unstage(&c, clone, 1).await;
        ctl.delete_volume(pb::DeleteVolumeRequest {
            volume_id: clone.into(),
            ..Default::default()
        })
        .await
        .unwrap();
        assert!(!in_store(&c, clone).await);
    }
    unpublish_and_unstage(&c, "src", 0).await;
    ctl.delete_volume(pb::DeleteVolumeRequest {
        volume_id: "src".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    assert!(in_store(&c, "src").await, "kept for its snapshot");
    ctl.delete_snapshot(del("src@s1")).await.unwrap();
    assert!(!in_store(&c, "src").await, "purged with its last snapshot");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_node_plugin_answers_for_what_it_staged() {
    let mut c = Cluster::start().await;
    create(&c, "v", 4 * MIB, Some("xfs")).await;
    stage_and_publish(&c, "v", 0, Some("xfs")).await;
    let mut host = c.nodes.remove(0);
    c.stop_plugin(&mut host).await;
    c.start_plugin(&mut host).await;
    c.nodes.insert(0, host);
    let mut n = c.node(0).await;
    let ctx = publish(&c, "v", 0).await;
    n.node_stage_volume(stage_req(&c, "v", 0, Some("xfs"), &ctx))
        .await
        .unwrap();
    n.node_publish_volume(publish_req(&c, "v", 0, "pod1", Some("xfs")))
        .await
        .unwrap();
    let p = publish_req(&c, "v", 0, "pod1", Some("xfs"));
    n.node_get_volume_stats(pb::NodeGetVolumeStatsRequest {
        volume_id: "v".into(),
        volume_path: p.target_path.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    assert_eq!(
        c.nodes[0].mounter.mounts.lock().len(),
        2,
        "nothing mounted twice"
    );
    unpublish_and_unstage(&c, "v", 0).await;
    assert!(c.nodes[0].mounter.mounts.lock().is_empty());
}

/// ControllerModifyVolume on a volume's `qos.*` mutable parameters.
async fn modify(
    c: &Cluster,
    volume: &str,
    params: &[(&str, &str)],
) -> Result<tonic::Response<pb::ControllerModifyVolumeResponse>, tonic::Status> {
    c.controller()
        .await
        .controller_modify_volume(pb::ControllerModifyVolumeRequest {
            volume_id: volume.into(),
            mutable_parameters: params
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        })
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn qos_limits_follow_the_volume_through_modify_and_a_move() {
    use glidefs::model::{QosLimit, QosLimits};
    let c = Cluster::start().await;
    let limit = |rate, burst| {
        Some(QosLimit {
            rate,
            burst: Some(burst),
        })
    };
    // Created with a StorageClass limit and a VolumeAttributesClass one.
    let mut req = create_req("q1", 8 * MIB, None);
    req.parameters
        .insert("qos.writeBytesPerSec".into(), "10M:20M".into());
    req.mutable_parameters = [("qos.readIops".to_string(), "500".to_string())].into();
    c.controller().await.create_volume(req).await.unwrap();
    let first = QosLimits {
        write_bytes: limit(10 << 20, 20 << 20),
        read_iops: limit(500, 50),
        ..QosLimits::default()
    };
    // Staged on node 0: its daemon opens the volume with the limits.
    stage_and_publish(&c, "q1", 0, None).await;
    let node0 = &c.nodes[0].daemon.client;
    assert_eq!(node0.qos("q1").await.unwrap(), first);

    // Modified while node 0 holds it: recorded and pushed live; keys left out stay.
    modify(
        &c,
        "q1",
        &[("qos.readIops", "none"), ("qos.iops", "200:10")],
    )
    .await
    .unwrap();
    let second = QosLimits {
        write_bytes: first.write_bytes,
        iops: limit(200, 10),
        ..QosLimits::default()
    };
    assert_eq!(node0.qos("q1").await.unwrap(), second);
    assert_eq!(c.records.qos("q1").await.unwrap().unwrap().limits, second);

    // Bad parameters change nothing.
    for bad in [
        &[("blockSize", "4K")][..],
        &[("qos.iops", "0")][..],
        &[("qos.iops", "lots")][..],
    ] {
        let e = modify(&c, "q1", bad).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{bad:?}: {e}");
    }
    assert_eq!(node0.qos("q1").await.unwrap(), second);
    refuses(modify(&c, "nope", &[("qos.iops", "1")]), Code::NotFound).await;
    refuses(modify(&c, "", &[("qos.iops", "1")]), INVALID).await;

    // Moved to node 1: the publish context carries the newest limits, and while the volume is
    // published to node 1 but not staged yet, a modify is recorded and asks for a retry.
    unpublish_and_unstage(&c, "q1", 0).await;
    let ctx = publish(&c, "q1", 1).await;
    let e = modify(&c, "q1", &[("qos.iops", "300:30")])
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e}");
    let third = QosLimits {
        iops: limit(300, 30),
        ..second
    };
    assert_eq!(c.records.qos("q1").await.unwrap().unwrap().limits, third);
    // The stage opens with the context it got before that modify; the CO's retry of the
    // modify then hands the newest limits to node 1's daemon.
    let mut n = c.node(1).await;
    n.node_stage_volume(stage_req(&c, "q1", 1, None, &ctx))
        .await
        .unwrap();
    let node1 = &c.nodes[1].daemon.client;
    assert_eq!(node1.qos("q1").await.unwrap(), second);
    modify(&c, "q1", &[("qos.iops", "300:30")]).await.unwrap();
    assert_eq!(node1.qos("q1").await.unwrap(), third);
    // A fresh publish after that carries the newest version.
    let again = publish(&c, "q1", 1).await;
    let carried: QosLimits = serde_json::from_str(&again[glidefs_csi::qos::QOS_CONTEXT]).unwrap();
    assert_eq!(carried, third);
}
