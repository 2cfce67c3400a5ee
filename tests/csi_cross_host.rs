//! The CSI driver's cross-host protocol under the interleavings that attack it; each test
//! names its contract and the interleaving:
//! - a late unpublish (its store call outlives its client's timeout) never clears the next
//!   node's attachment, so no third node is granted a takeover of a live volume (the
//!   attachment is a log of states, never deleted);
//! - a snapshot deleted while its volume is deleted still purges the volume (one operation
//!   per volume covers its snapshots);
//! - a clone create retried after a crash before its resize answers the size asked (the
//!   clone grows on every try);
//! - a node force detached and published again serves the data its successor flushed, not
//!   its stale handle (the attachment `seq` in the publish context).
//!
//! When a contract breaks, the failure message reports what the break leads to.

mod csi_support;

use std::collections::HashMap;
use std::sync::Arc;

use csi_support::api_support::daemon::file_store;
use csi_support::{create_req, in_store, writer, Cluster, MIB};
use glidefs::client::Endpoint;
use glidefs::csi::{ApiConnector, ApiDaemon};
use glidefs_csi::holder::Holders;
use glidefs_csi::pb;
use glidefs_csi::pb::controller_server::Controller as ControllerRpc;
use glidefs_csi::records::Records;
use glidefs_csi::Controller;
use glidefs_testkit::{Fault, FaultRule, FaultyStore, Op};
use tonic::{Code, Request};

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 12) as u8)
        .collect()
}

/// A controller (as a second replica, or the same controller restarted) whose records go
/// through `faulty` (the cluster's own store underneath), on the cluster's controller daemon.
fn controller_over(c: &Cluster, faulty: Arc<FaultyStore>) -> Arc<Controller> {
    let own = Arc::new(ApiDaemon::new(Endpoint::Unix(
        c.controller_daemon.cfg.api.socket.clone(),
    )));
    Arc::new(Controller::new(Holders {
        own,
        connector: Arc::new(ApiConnector::default()),
        records: Records::new(faulty),
    }))
}

fn publish_to(volume: &str, node: &str) -> pb::ControllerPublishVolumeRequest {
    pb::ControllerPublishVolumeRequest {
        volume_id: volume.into(),
        node_id: node.into(),
        volume_capability: Some(writer(None)),
        ..Default::default()
    }
}

fn unpublish_from(volume: &str, node: &str) -> pb::ControllerUnpublishVolumeRequest {
    pb::ControllerUnpublishVolumeRequest {
        volume_id: volume.into(),
        node_id: node.into(),
        ..Default::default()
    }
}

fn stage_req(
    c: &Cluster,
    volume: &str,
    node: usize,
    ctx: &HashMap<String, String>,
) -> pb::NodeStageVolumeRequest {
    pb::NodeStageVolumeRequest {
        volume_id: volume.into(),
        publish_context: ctx.clone(),
        staging_target_path: c.path(&format!("kubelet-{node}/staging/{volume}")),
        volume_capability: Some(writer(None)),
        ..Default::default()
    }
}

/// Contract: "a volume is published to one node at a time (attachment record, create-only)"
/// and "a publish grants a takeover" only to a node whose predecessor unstaged or was force
/// detached.
///
/// Interleaving (one controller, the CO retrying as it does; the store's DELETE outlives its
/// client's timeout, which `FaultyStore`'s `Fault::Late` models):
/// 1. `db` is on node A; A unstages it (orderly move).
/// 2. ControllerUnpublish(db, A): the DELETE of `csi/attachments/db.json` times out on the
///    client (UNAVAILABLE) but is still on its way to the store.
/// 3. The CO retries ControllerUnpublish(db, A): the record (A's) is deleted. OK.
/// 4. ControllerPublish(db, B) creates B's record; B stages `db` (takeover) and its
///    workload writes and FLUSHes (durability `local`: acknowledged).
/// 5. The first call lands late. A store DELETE cannot be made conditional, so were the
///    attachment a record deleted at unpublish, this would delete *B's* record.
/// 6. ControllerPublish(db, A) (a pod of the workload scheduled on A again, a second
///    StatefulSet replica, a stale VolumeAttachment being reconciled...) must be refused
///    with FAILED_PRECONDITION: B holds the volume and was never force detached.
///
/// Were step 6 granted, the test goes on to show the consequence (A stages with the
/// takeover, B's daemon is fenced in the store, B's acknowledged write is gone from what A
/// serves) and fails with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_unpublish_call_never_clears_the_next_nodes_attachment() {
    let c = Cluster::start().await;
    let faulty = Arc::new(FaultyStore::new(file_store(c.dir.path())));
    let ctl = controller_over(&c, faulty.clone());
    ControllerRpc::create_volume(&ctl, Request::new(create_req("db", 4 * MIB, None)))
        .await
        .unwrap();
    let (a, b) = (&c.nodes[0], &c.nodes[1]);

    // 1. On node A, then moved away in order.
    let ctx_a =
        ControllerRpc::controller_publish_volume(&ctl, Request::new(publish_to("db", "node-a")))
            .await
            .unwrap()
            .into_inner()
            .publish_context;
    let mut na = c.node(0).await;
    na.node_stage_volume(stage_req(&c, "db", 0, &ctx_a))
        .await
        .unwrap();
    let first = pattern(1, MIB as usize);
    a.daemon.volume("db").write(0, &first).await.unwrap();
    na.node_unstage_volume(pb::NodeUnstageVolumeRequest {
        volume_id: "db".into(),
        staging_target_path: stage_req(&c, "db", 0, &ctx_a).staging_target_path,
    })
    .await
    .unwrap();

    // 2. The unpublish's store call outlives its client's timeout. An unpublish creates the
    //    next attachment state and deletes nothing but states older than the one before the
    //    newest: both kinds of call (PUT and DELETE) are made late, every one of them.
    faulty.inject(
        FaultRule::new(Fault::Late)
            .ops(&[Op::Delete, Op::Put])
            .path_contains("csi/attachments/db")
            .times(1),
    );
    let err = ControllerRpc::controller_unpublish_volume(
        &ctl,
        Request::new(unpublish_from("db", "node-a")),
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert_eq!(faulty.late_calls(), 1);
    // 3. The CO retries: done.
    ControllerRpc::controller_unpublish_volume(&ctl, Request::new(unpublish_from("db", "node-a")))
        .await
        .unwrap();

    // 4. Published to B, staged there; B's workload writes and FLUSHes.
    let ctx_b =
        ControllerRpc::controller_publish_volume(&ctl, Request::new(publish_to("db", "node-b")))
            .await
            .unwrap()
            .into_inner()
            .publish_context;
    let mut nb = c.node(1).await;
    nb.node_stage_volume(stage_req(&c, "db", 1, &ctx_b))
        .await
        .unwrap();
    let on_b = pattern(2, MIB as usize);
    let vb = b.daemon.volume("db");
    vb.write(0, &on_b).await.unwrap();
    vb.flush().await.unwrap(); // the guest's FLUSH (durability local): acknowledged
    assert_eq!(
        c.records
            .attachment("db")
            .await
            .unwrap()
            .and_then(|a| a.node),
        Some("node-b".to_string())
    );

    // 5. The late call lands.
    assert_eq!(faulty.land_late(false).await, 1);
    let att = c.records.attachment("db").await.unwrap();

    // 6. A second node asks for the volume B holds.
    let to_a =
        ControllerRpc::controller_publish_volume(&ctl, Request::new(publish_to("db", "node-a")))
            .await;
    let granted = match to_a {
        Err(s) => {
            assert_eq!(s.code(), Code::FailedPrecondition, "{s:?}");
            return;
        }
        Ok(r) => r.into_inner().publish_context,
    };
    // 7. What the grant leads to: A stages with the takeover, B is fenced, B's
    // acknowledged write is not what A serves.
    let staged_on_a = na.node_stage_volume(stage_req(&c, "db", 0, &granted)).await;
    let mut got = vec![0; MIB as usize];
    let read_on_a = match &staged_on_a {
        Ok(_) => {
            a.daemon.volume("db").read(0, &mut got).await.unwrap();
            if got == on_b {
                "B's write"
            } else if got == first {
                "A's older write (B's acknowledged write LOST)"
            } else {
                "something else"
            }
        }
        Err(_) => "(not staged)",
    };
    let b_flush = b
        .daemon
        .client
        .flush("db")
        .await
        .map(|_| ())
        .map_err(|e| e.to_string());
    panic!(
        "node B holds `db` (staged, written, FLUSHed), yet after a late DELETE of an earlier \
         unpublish the attachment record is {att:?} and ControllerPublish(db, node-a) was \
         GRANTED with {granted:?}; NodeStage on A with it: {:?}; A reads {read_on_a}; B's \
         next store flush: {b_flush:?}",
        staged_on_a.map(|_| ()).map_err(|s| s.code())
    );
}

fn snapshot_req(volume: &str, name: &str) -> pb::CreateSnapshotRequest {
    pb::CreateSnapshotRequest {
        source_volume_id: volume.into(),
        name: name.into(),
        ..Default::default()
    }
}

/// Contract: "a volume deleted while it has snapshots is purged with its last
/// snapshot". DeleteVolume and DeleteSnapshot take different in-flight keys (`v` and
/// `snapshot s1`), and the Kubernetes provisioner and snapshot controller send them
/// independently (a user deleting a PVC and its VolumeSnapshot together).
///
/// Interleaving (one controller):
/// 1. DeleteVolume(v) lists v's snapshots: [s1]; it will bury v (`csi/deleted/v.json`).
/// 2. Before the tombstone lands (held in the store), DeleteSnapshot(v@s1) is called. It
///    waits for its volume's operation (ABORTED; the CO retries it once DeleteVolume
///    answered): run alongside, it would find no snapshot left and no tombstone yet, and
///    not purge.
/// 3. The tombstone lands; DeleteVolume answers OK; the retried DeleteSnapshot answers OK.
///
/// Expected: v is gone from the store. Otherwise both calls succeeded, neither is retried,
/// and v stays in the store for good: a tombstoned volume with no snapshot left, which
/// nothing will ever purge (a leak of the whole volume's objects and its records).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_deleted_while_its_volume_is_deleted_purges_it() {
    let c = Cluster::start().await;
    let faulty = Arc::new(FaultyStore::new(file_store(c.dir.path())));
    let ctl = controller_over(&c, faulty.clone());
    ControllerRpc::create_volume(&ctl, Request::new(create_req("v", 4 * MIB, None)))
        .await
        .unwrap();
    ControllerRpc::create_snapshot(&ctl, Request::new(snapshot_req("v", "s1")))
        .await
        .unwrap();

    faulty.inject(
        FaultRule::new(Fault::Hold)
            .ops(&[Op::Put])
            .path_contains("csi/deleted/v")
            .times(1),
    );
    let deleting = {
        let ctl = ctl.clone();
        tokio::spawn(async move {
            ControllerRpc::delete_volume(
                &ctl,
                Request::new(pb::DeleteVolumeRequest {
                    volume_id: "v".into(),
                    ..Default::default()
                }),
            )
            .await
        })
    };
    faulty.wait_held(1).await;
    let delete_snapshot = || {
        ControllerRpc::delete_snapshot(
            &ctl,
            Request::new(pb::DeleteSnapshotRequest {
                snapshot_id: "v@s1".into(),
                ..Default::default()
            }),
        )
    };
    // A snapshot operation waits for its volume's: ABORTED, and the CO retries it once
    // the DeleteVolume answered.
    let first = delete_snapshot().await;
    faulty.release_held();
    deleting.await.unwrap().unwrap();
    if let Err(e) = first {
        assert_eq!(e.code(), Code::Aborted, "{e:?}");
        delete_snapshot().await.unwrap();
    }

    let tomb = c.records.tombstone("v").await.unwrap();
    let rec = c.records.volume("v").await.unwrap().is_some();
    let stored = in_store(&c, "v").await;
    assert!(
        !stored,
        "DeleteVolume(v) and DeleteSnapshot(v@s1) both answered OK, yet v is still in the \
         store (tombstone {tomb:?}, volume record present: {rec}) with no snapshot left to \
         purge it: nothing ever will"
    );
}

/// Contract: CreateVolume is idempotent by name and its answer honours the capacity range
/// ("a retry finishes the job"). A clone asked bigger than its snapshot is made in two steps
/// (the daemon's clone at the snapshot's size, then a resize); after a crash of the driver
/// between them, the CO's retry finds the volume there (`duplicate` or
/// `volume_exists_in_store`) and grows it before it answers, never answering OK with a size
/// smaller than `required_bytes`.
///
/// The crash is simulated by doing the first step as the crashed call did it: the record
/// written, the clone created on the controller's daemon (left open: the driver died, not
/// the daemon). Expected: the retry answers capacity >= 8 MiB (or an error).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_clone_create_after_a_crash_before_its_resize_grows_it() {
    let c = Cluster::start().await;
    let mut ctl = c.controller().await;
    ctl.create_volume(create_req("src", 4 * MIB, None))
        .await
        .unwrap();
    ctl.create_snapshot(snapshot_req("src", "s1"))
        .await
        .unwrap();

    let mut req = create_req("big", 8 * MIB, None);
    req.volume_content_source = Some(pb::VolumeContentSource {
        r#type: Some(pb::volume_content_source::Type::Snapshot(
            pb::volume_content_source::SnapshotSource {
                snapshot_id: "src@s1".into(),
            },
        )),
    });
    // What the crashed first call did: its record, then the daemon's clone.
    let rec = glidefs_csi::records::VolumeRecord {
        name: "big".into(),
        capacity: 8 * MIB as u64,
        block_size: 64 << 10,
        parameters: [("blockSize".to_string(), "64K".to_string())].into(),
        source: Some("snapshot:src@s1".into()),
        clone_snapshot: None,
        created_unix: glidefs_csi::records::now_unix(),
    };
    c.records.create_volume(&rec).await.unwrap();
    let r = c
        .controller_daemon
        .req(
            hyper::Method::POST,
            "/v1/volumes",
            Some(serde_json::json!({"name": "big", "from": "src@s1"})),
        )
        .await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));

    // The CO's retry.
    let got = ctl.create_volume(req).await;
    let size = match &got {
        Ok(r) => r.get_ref().volume.as_ref().unwrap().capacity_bytes,
        Err(_) => return, // refusing is acceptable
    };
    assert!(
        size >= 8 * MIB,
        "the retried CreateVolume of a clone asked 8 MiB answered OK with {size} bytes"
    );
}

/// Contracts: "a publish grants a takeover" (the new node sees what the old one flushed) and
/// NodeStage's idempotence (`Node::open` reuses whatever volume the node's daemon serves).
/// After a force detach of node A, A's daemon still serves its handle of `db` (A was
/// unreachable, nothing closed it; it is fenced only at its next publish). When the volume
/// comes back to A later (B unstaged it in order, the CO published it to A again), NodeStage
/// on A finds that stale handle (`show` answers it, state `running`); staging it as it is
/// would have the pod on A read A's old data, not what B wrote and flushed, and its writes
/// acknowledged by a handle whose next publish is fenced.
///
/// Expected: A serves B's data (the stale handle is refused or reopened).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_force_detached_and_published_again_serves_fresh_data() {
    let c = Cluster::start().await;
    let mut ctl = c.controller().await;
    ctl.create_volume(create_req("db", 4 * MIB, None))
        .await
        .unwrap();
    let (a, b) = (&c.nodes[0], &c.nodes[1]);
    let ctx_a = ctl
        .controller_publish_volume(publish_to("db", "node-a"))
        .await
        .unwrap()
        .into_inner()
        .publish_context;
    let mut na = c.node(0).await;
    na.node_stage_volume(stage_req(&c, "db", 0, &ctx_a))
        .await
        .unwrap();
    let old = pattern(1, MIB as usize);
    a.daemon.volume("db").write(0, &old).await.unwrap();
    a.daemon.client.flush("db").await.unwrap();

    // A stops answering: force detach, B takes over, writes, flushes, leaves in order.
    ctl.controller_unpublish_volume(unpublish_from("db", "node-a"))
        .await
        .unwrap();
    let ctx_b = ctl
        .controller_publish_volume(publish_to("db", "node-b"))
        .await
        .unwrap()
        .into_inner()
        .publish_context;
    let mut nb = c.node(1).await;
    nb.node_stage_volume(stage_req(&c, "db", 1, &ctx_b))
        .await
        .unwrap();
    let newer = pattern(2, MIB as usize);
    b.daemon.volume("db").write(0, &newer).await.unwrap();
    b.daemon.client.flush("db").await.unwrap();
    nb.node_unstage_volume(pb::NodeUnstageVolumeRequest {
        volume_id: "db".into(),
        staging_target_path: stage_req(&c, "db", 1, &ctx_b).staging_target_path,
    })
    .await
    .unwrap();
    ctl.controller_unpublish_volume(unpublish_from("db", "node-b"))
        .await
        .unwrap();

    // A is back; the volume is published to A again and staged there.
    let ctx_a2 = ctl
        .controller_publish_volume(publish_to("db", "node-a"))
        .await
        .unwrap()
        .into_inner()
        .publish_context;
    let staged = na.node_stage_volume(stage_req(&c, "db", 0, &ctx_a2)).await;
    if staged.is_err() {
        return; // refusing the stale handle is acceptable
    }
    let mut got = vec![0; MIB as usize];
    a.daemon.volume("db").read(0, &mut got).await.unwrap();
    let state = a
        .daemon
        .client
        .show("db")
        .await
        .map(|v| format!("{:?}", v.state));
    assert!(
        got == newer,
        "NodeStage on A answered OK but A serves {} (A's daemon reports the volume {state:?})",
        if got == old {
            "its OLD data: B's flushed writes are invisible"
        } else {
            "something else"
        }
    );
}
